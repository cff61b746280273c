// Text generation with a KV cache: a causal language model continues prompts one token at a time.
//
//   GenerateOptions o;
//   o.max_new_tokens = 32;
//   o.temperature = 0.8;  o.top_k = 40;  o.seed = 1;     // temperature 0 (the default): greedy
//   o.eos_ids = {50256};                                 // GPT-2's <|endoftext|>
//   o.decode = [&](const std::vector<int32_t>& ids) { return encoder.decode(ids); };
//   o.stop_strings = {"\n\n"};
//   Result<std::vector<Generation>> r = generate(model, {{464, 2068}, {40}}, o);
//   // (*r)[0].ids: the new tokens; .text: their text; .finish_reason: "eos", "stop" or "length"
//
// The cache. A causal model's rows never change once computed: row t reads rows 0..t only. So each
// layer's keys (after rotary) and values of the rows seen so far are kept (KVCache), and a step
// runs the model on the new rows alone (ForwardOptions::cache): their positions continue from the
// cache's length, their queries read the cached keys and values plus the new rows up to their own,
// and their keys and values are appended. One decode step then costs one row's matmuls instead of
// the whole sequence's; the logits are computed only for each sequence's last row
// (ForwardOptions::last_logits).
//
// Several prompts are decoded together: the first step runs them all as one padded batch, then
// every step feeds each unfinished sequence its last token; a finished sequence drops out of the
// batch (KVCache::keep). Each sequence has its own cache length and its own random generator, so a
// prompt's completion does not depend on the other prompts in the batch (greedy: exactly the tokens
// of running it alone).
//
// Sampling, as Hugging Face's generate() with do_sample: the repetition penalty over every token of
// the sequence (prompt included), then temperature, top-k, top-p, and one draw from the sequence's
// Rng (seeded: the same seed gives the same tokens on every machine). Temperature 0 is greedy (the
// most likely token, the lowest id on ties) and draws nothing.
//
// Thread-safety: generate() may run on several threads at once, each with its own options; a
// KVCache belongs to one forward at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/model.h"
#include "tessera/plugins.h"
#include "tessera/random.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

namespace model {
struct CacheAccess;  // core/src/model/kv_cache.h
}

// The keys and values of the rows a causal model has seen, per sequence and layer. Storage is
// allocated once for `capacity` rows per sequence: layer l's keys are one (S, H, capacity, d_k)
// f32 tensor, sequence s's head h holding its rows t at [s, h, t, :] (so a head's rows are
// contiguous, which is what a decode step reads); values likewise with d_v. Keys are stored after
// the rotary rotation, so a cached row is never rotated again.
class KVCache {
 public:
  KVCache() = default;
  // An empty cache for `sequences` sequences of up to `capacity` rows each, shaped for `model`
  // (layers, heads, d_k, d_v). Refuses a model that is not causal.
  static Result<KVCache> create(const Model& model, int64_t sequences, int64_t capacity);

  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t length(int64_t s) const { return lengths_[static_cast<size_t>(s)]; }  // rows cached
  // Layer l's keys (S, H, capacity, d_k) and values (S, H, capacity, d_v); rows at or past a
  // sequence's length hold nothing meaningful.
  const Tensor& keys(int64_t layer) const { return k_[static_cast<size_t>(layer)]; }
  const Tensor& values(int64_t layer) const { return v_[static_cast<size_t>(layer)]; }

  // Keeps the sequences `which` (strictly increasing indices), which become 0, 1, ...: how a
  // finished sequence drops out of a batch. Moves the kept rows down; frees nothing.
  Status keep(const std::vector<int64_t>& which);
  // Room for `capacity` rows per sequence (no less than now), the cached rows kept: new storage,
  // copied, so a cache can start small and grow with its longest sequence.
  void reserve(int64_t capacity);
  void clear();  // every sequence back to length 0

 private:
  friend struct model::CacheAccess;  // Model::forward appends rows and advances the lengths
  int64_t layers_ = 0, heads_ = 0, d_k_ = 0, d_v_ = 0, capacity_ = 0;
  std::vector<Tensor> k_, v_;     // per layer
  std::vector<int64_t> lengths_;  // per sequence
};

// One event of a sequence during generation (GenerateOptions::on_token).
struct TokenEvent {
  int64_t sequence = 0;       // the prompt's index
  int32_t id = 0;             // the token just generated
  std::string text;           // completion text that became final with this token (may be empty:
                              // a character cut between tokens, or what may begin a stop string,
                              // waits for the next token); empty without a decode function
  std::string finish_reason;  // "" while the sequence goes on; else its last event (see Generation)
};

struct GenerateOptions {
  int64_t max_new_tokens = 32;      // >= 1
  double temperature = 0.0;         // >= 0; 0: greedy
  int64_t top_k = 0;                // >= 0; sample among the k most likely tokens (ties at the k-th
                                    // kept); 0: all
  double top_p = 1.0;               // (0, 1]: sample among the most likely tokens whose
                                    // probabilities add up to top_p (nucleus); 1: all
  double repetition_penalty = 1.0;  // > 0: every token already in the sequence has its logit divided
                                    // by this when positive, multiplied when negative; 1: none
  uint64_t seed = 0;                // each sequence draws from its own Rng(seed)
  // The model's own end of sequence (the tokenizer's EOS): a generated token among these ends the
  // sequence with "eos".
  std::vector<int32_t> eos_ids;
  std::vector<int32_t> stop_ids;  // the caller's stop tokens: one of these ends it with "stop"
  // A sequence ends ("stop") as soon as its completion's text contains one of these; its text is
  // cut before the earliest occurrence. Needs `decode`.
  std::vector<std::string> stop_strings;
  // Token ids -> text (a plugin's Encoder::decode): fills Generation::text and TokenEvent::text.
  std::function<Result<std::string>(const std::vector<int32_t>&)> decode;
  // Called after every generated token, sequence by sequence within a step (streaming).
  std::function<void(const TokenEvent&)> on_token;
  bool reference = false;           // the model's reference loops instead of oneDNN
};

// Every problem with the option values, as one status naming each ("" when there is none):
// temperature < 0, top_p outside (0, 1], top_k < 0, repetition_penalty <= 0, max_new_tokens < 1,
// non-finite numbers, stop strings without decode, an empty stop string.
Status check_generate_options(const GenerateOptions& options);

struct Generation {
  std::vector<int32_t> ids;  // the new tokens, in order; a final eos or stop token is the last one
  std::string text;          // their text (decode), without a final eos or stop token and cut
                             // before a stop string; "" without decode
  // As transformers-style and OpenAI-style APIs name them: "eos": the model's end of sequence (a
  // token of eos_ids); "stop": the caller's stop (a token of stop_ids, or a stop string);
  // "length": max_new_tokens, or the model's positions (positions.max_len of learned or sinusoidal
  // positions) ran out (then `note` says so). A token in both lists is "eos".
  std::string finish_reason;
  std::string note;
  int64_t prompt_tokens = 0;
  double seconds = 0;         // from the start of generate() to this sequence's last token
};

// Continues each prompt (token ids) with up to max_new_tokens tokens. Refuses, before anything
// runs: a model that is not a causal language model (head.kind lm, causal), bad options, an empty
// prompt, an id outside the vocabulary, a prompt longer than positions.max_len. A prompt that fits
// but leaves less room than max_new_tokens stops at the limit with finish_reason "length" and a
// note. Results are in prompt order.
Result<std::vector<Generation>> generate(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerateOptions& options);

// The token generate() picks from one row of logits (V) for a sequence whose tokens so far
// (prompt included) are `context`: repetition penalty, then greedy (temperature 0), or temperature,
// top-k, top-p and a draw from rng.
int32_t pick_token(const float* logits, int64_t V, const std::vector<int32_t>& context, const GenerateOptions& options,
                   Rng& rng);

// pick_token's steps, for tests and other samplers. Removed entries become -inf.
//   Hugging Face's RepetitionPenaltyLogitsProcessor: each distinct id of `context` once.
void apply_repetition_penalty(std::vector<double>& logits, const std::vector<int32_t>& context, double penalty);
//   TopKLogitsWarper: removes every score below the k-th largest (k >= 1; ties with it stay).
void filter_top_k(std::vector<double>& scores, int64_t k);
//   TopPLogitsWarper: softmax of the scores; going from the most likely down, removes every token
//   once the ones before it already add up to p (p in (0, 1]; at least one token stays).
void filter_top_p(std::vector<double>& scores, double p);

// A prompt from a plugin's rows: the ids without the closing rows that a tokenizer's add_special
// puts after the text (EOS, SEP), since a completion continues the text itself. The ids of the EOS
// rows removed are returned in *eos (the tokenizer's own end of text: a natural stop token).
std::vector<int32_t> prompt_ids(const TokenRows& rows, std::vector<int32_t>* eos);

}  // namespace tessera
