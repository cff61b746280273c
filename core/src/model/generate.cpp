// Generation: the KV cache's storage, the token picker (repetition penalty, temperature, top-k,
// top-p) and the decode loop over a batch of prompts. The cached attention itself is
// attention.cpp's; Model::forward binds the cache through kv_cache.h.
#include "tessera/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>

#include "kv_cache.h"
#include "tessera/plugin.h"

namespace tessera {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int64_t kFirstStretch = 256;  // new tokens the KV cache has room for before it first grows

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The longest prefix of s that does not end inside a UTF-8 character: a streamed piece never cuts
// a character between two tokens (GPT-2's byte-level tokens do cut them).
size_t complete_utf8(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

// How many bytes at the end of `text` could be the start of a stop string: they are not streamed
// until the next tokens show whether the stop string follows.
size_t stop_prefix_at_end(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops)
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  return hold;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The cache

Result<KVCache> KVCache::create(const Model& model, int64_t sequences, int64_t capacity) {
  const ModelConfig& c = model.config();
  if (!c.causal)
    return Status::Invalid("KV cache: the model is not causal (model.causal false): in a model that reads both ways "
                           "every new row changes the earlier rows, so their keys and values cannot be kept");
  if (sequences < 1 || capacity < 1)
    return Status::Invalid("KV cache: needs at least one sequence and one row (got " + std::to_string(sequences) +
                           " sequences of " + std::to_string(capacity) + " rows)");
  KVCache kv;
  kv.layers_ = c.n_layers;
  kv.heads_ = c.n_heads;
  kv.d_k_ = c.d_k;
  kv.d_v_ = c.d_v;
  kv.capacity_ = capacity;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    // Zeros rather than garbage: a row past a sequence's length is never read, but NaN bit
    // patterns there would make a mistake invisible in one place and loud in another.
    kv.k_.push_back(Tensor::zeros({sequences, c.n_heads, capacity, c.d_k}));
    kv.v_.push_back(Tensor::zeros({sequences, c.n_heads, capacity, c.d_v}));
  }
  kv.lengths_.assign(static_cast<size_t>(sequences), 0);
  return kv;
}

Status KVCache::keep(const std::vector<int64_t>& which) {
  for (size_t i = 0; i < which.size(); ++i)
    if (which[i] < 0 || which[i] >= sequences() || (i > 0 && which[i] <= which[i - 1]))
      return Status::Invalid("KV cache: keep() takes strictly increasing sequence indices in [0, " +
                             std::to_string(sequences()) + "); entry " + std::to_string(i) + " is " +
                             std::to_string(which[i]));
  const int64_t n = static_cast<int64_t>(which.size());
  // Sequence which[i] moves down to i (which[i] >= i, so nothing is read after it was written).
  for (size_t l = 0; l < k_.size(); ++l)
    for (auto [t, d] : {std::pair<Tensor*, int64_t>{&k_[l], d_k_}, {&v_[l], d_v_}}) {
      float* p = t->data<float>();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t from = which[static_cast<size_t>(i)];
        if (from == i) continue;
        const int64_t rows = lengths_[static_cast<size_t>(from)];
        for (int64_t h = 0; h < heads_; ++h)
          std::memmove(p + ((i * heads_ + h) * capacity_) * d, p + ((from * heads_ + h) * capacity_) * d,
                       static_cast<size_t>(rows * d) * sizeof(float));
      }
      *t = t->slice(0, 0, n);
    }
  std::vector<int64_t> kept;
  for (int64_t s : which) kept.push_back(lengths_[static_cast<size_t>(s)]);
  lengths_ = std::move(kept);
  return Status::Ok();
}

void KVCache::reserve(int64_t capacity) {
  if (capacity <= capacity_) return;
  const int64_t S = sequences();
  for (size_t l = 0; l < k_.size(); ++l)
    for (auto [t, d] : {std::pair<Tensor*, int64_t>{&k_[l], d_k_}, {&v_[l], d_v_}}) {
      Tensor bigger = Tensor::zeros({S, heads_, capacity, d});
      for (int64_t s = 0; s < S; ++s) {
        const int64_t rows = lengths_[static_cast<size_t>(s)];
        for (int64_t h = 0; h < heads_; ++h)
          std::memcpy(bigger.data<float>() + ((s * heads_ + h) * capacity) * d,
                      t->data<float>() + ((s * heads_ + h) * capacity_) * d, static_cast<size_t>(rows * d) * sizeof(float));
      }
      *t = bigger;
    }
  capacity_ = capacity;
}

void KVCache::clear() { std::fill(lengths_.begin(), lengths_.end(), 0); }

namespace model {

Status CacheAccess::bind(KVCache& kv, const ModelConfig& c, const Batch& batch, int64_t extra,
                         std::vector<int64_t>* past, std::vector<CacheView>* views) {
  if (!c.causal)
    return Status::Invalid("forward: a KV cache needs a causal model (model.causal true): in a model that reads "
                           "both ways every new row changes the earlier rows, so cached keys and values go stale");
  if (kv.layers_ != c.n_layers || kv.heads_ != c.n_heads || kv.d_k_ != c.d_k || kv.d_v_ != c.d_v)
    return Status::Invalid("forward: the KV cache was made for another model (" + std::to_string(kv.layers_) +
                           " layers of " + std::to_string(kv.heads_) + " heads, d_k " + std::to_string(kv.d_k_) +
                           ", d_v " + std::to_string(kv.d_v_) + ")");
  if (batch.segments.defined())
    return Status::Invalid("forward: a KV cache takes one sequence per batch row, not packed segments");
  if (batch.positions.defined())
    return Status::Invalid("forward: with a KV cache, positions continue from the cached rows; give no positions");
  if (extra)
    return Status::Invalid("forward: a KV cache cannot continue sequences whose stem prepends a CLS row (give roles)");
  const int64_t B = batch.batch_size(), T = batch.seq_len();
  if (B != kv.sequences())
    return Status::Invalid("forward: the batch has " + std::to_string(B) + " rows but the KV cache holds " +
                           std::to_string(kv.sequences()) + " sequences (batch row b continues sequence b)");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = batch.lengths.empty() ? T : batch.lengths[static_cast<size_t>(b)];
    if (kv.length(b) + n > kv.capacity())
      return Status::OutOfRange("forward: sequence " + std::to_string(b) + " of the KV cache holds " +
                                std::to_string(kv.length(b)) + " rows; " + std::to_string(n) +
                                " more do not fit its capacity of " + std::to_string(kv.capacity()));
  }
  *past = kv.lengths_;
  views->clear();
  for (size_t l = 0; l < kv.k_.size(); ++l)
    views->push_back({kv.k_[l].data<float>(), kv.v_[l].data<float>(), kv.capacity_, past});
  return Status::Ok();
}

void CacheAccess::advance(KVCache& kv, const Batch& batch) {
  for (int64_t b = 0; b < kv.sequences(); ++b)
    kv.lengths_[static_cast<size_t>(b)] += batch.lengths.empty() ? batch.seq_len() : batch.lengths[static_cast<size_t>(b)];
}

}  // namespace model

// ---------------------------------------------------------------------------------------------
// Picking a token

Status check_generate_options(const GenerateOptions& o) {
  std::vector<std::string> bad;
  if (o.max_new_tokens < 1) bad.push_back("max_new_tokens must be >= 1, found " + std::to_string(o.max_new_tokens));
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    bad.push_back("temperature must be >= 0 (0 is greedy), found " + num(o.temperature));
  if (o.top_k < 0) bad.push_back("top_k must be >= 0 (0 keeps every token), found " + std::to_string(o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1))
    bad.push_back("top_p must be in (0, 1] (1 keeps every token), found " + num(o.top_p));
  if (!(o.repetition_penalty > 0) || !std::isfinite(o.repetition_penalty))
    bad.push_back("repetition_penalty must be > 0 (1 is none), found " + num(o.repetition_penalty));
  for (size_t i = 0; i < o.stop_strings.size(); ++i)
    if (o.stop_strings[i].empty()) bad.push_back("stop string " + std::to_string(i) + " is empty");
  if (!o.stop_strings.empty() && !o.decode)
    bad.push_back("stop strings need a decode function (token ids -> text) to find them in the completion");
  if (bad.empty()) return Status::Ok();
  std::string msg = "generate: ";
  for (size_t i = 0; i < bad.size(); ++i) msg += (i ? "; " : "") + bad[i];
  return Status::Invalid(msg);
}

void apply_repetition_penalty(std::vector<double>& logits, const std::vector<int32_t>& context, double penalty) {
  std::vector<char> seen(logits.size(), 0);
  for (int32_t id : context) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size() || seen[static_cast<size_t>(id)]) continue;
    seen[static_cast<size_t>(id)] = 1;
    double& l = logits[static_cast<size_t>(id)];
    l = l < 0 ? l * penalty : l / penalty;
  }
}

void filter_top_k(std::vector<double>& scores, int64_t k) {
  if (k <= 0 || k >= static_cast<int64_t>(scores.size())) return;
  std::vector<double> sorted = scores;
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<double>());
  const double kth = sorted[static_cast<size_t>(k - 1)];
  for (double& s : scores)
    if (s < kth) s = kNegInf;
}

void filter_top_p(std::vector<double>& scores, double p) {
  if (p >= 1.0 || scores.empty()) return;
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Most likely first; among equal scores the lower id ranks first (and so is kept first).
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  const double mx = scores[order[0]];
  if (mx == kNegInf) return;
  double sum = 0;
  for (double s : scores) sum += std::exp(s - mx);
  double before = 0;
  for (size_t r = 0; r < order.size(); ++r) {
    double& s = scores[order[r]];
    const double prob = std::exp(s - mx) / sum;
    if (r > 0 && before >= p) s = kNegInf;
    before += prob;
  }
}

int32_t pick_token(const float* logits, int64_t V, const std::vector<int32_t>& context, const GenerateOptions& o,
                   Rng& rng) {
  std::vector<double> s(logits, logits + V);
  if (o.repetition_penalty != 1.0) apply_repetition_penalty(s, context, o.repetition_penalty);
  const auto best = static_cast<int32_t>(std::max_element(s.begin(), s.end()) - s.begin());  // first of equals
  if (o.temperature == 0.0) return best;
  // Temperature on the scores less their maximum: every score stays finite or -inf however small
  // the temperature (s / T alone overflows as T -> 0, and inf - inf is NaN).
  const double mx = s[static_cast<size_t>(best)];
  for (double& x : s) x = (x - mx) / o.temperature;
  if (o.top_k > 0) filter_top_k(s, o.top_k);
  if (o.top_p < 1.0) filter_top_p(s, o.top_p);
  double sum = 0;
  for (double x : s) sum += std::exp(x);  // the maximum is 0: sum >= 1
  const double r = rng.uniform() * sum;
  double acc = 0;
  int32_t last = best;
  for (int64_t v = 0; v < V; ++v) {
    if (s[static_cast<size_t>(v)] == kNegInf) continue;
    acc += std::exp(s[static_cast<size_t>(v)]);
    last = static_cast<int32_t>(v);
    if (acc > r) return last;
  }
  return last;  // rounding left r at the very top: the last token kept
}

std::vector<int32_t> prompt_ids(const TokenRows& rows, std::vector<int32_t>* eos) {
  std::vector<int32_t> ids = rows.ids;
  size_t n = std::min(ids.size(), rows.roles.size());
  ids.resize(n);
  while (n > 0 && (rows.roles[n - 1] == TSR_ROLE_EOS || rows.roles[n - 1] == TSR_ROLE_SEP)) {
    if (eos && rows.roles[n - 1] == TSR_ROLE_EOS) eos->push_back(ids[n - 1]);
    ids.pop_back();
    --n;
  }
  return ids;
}

// ---------------------------------------------------------------------------------------------
// The decode loop

Result<std::vector<Generation>> generate(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerateOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  TSR_RETURN_IF_ERROR(check_generate_options(o));
  const ModelConfig& c = model.config();
  if (c.head.kind != HeadKind::lm)
    return Status::Invalid(std::string("generate: the model has no language-model head (model.head.kind is ") +
                           head_kind_name(c.head.kind) + "); generation needs head.kind lm");
  if (!c.causal)
    return Status::Invalid("generate: the model is not causal (model.causal false); generation needs a model that "
                           "reads left to right (arch: decoder)");
  const int64_t V = c.stem.vocab_size;
  const bool limited = c.positions.kind == PositionKind::learned || c.positions.kind == PositionKind::sinusoidal;
  const int64_t limit = limited ? c.positions.max_len : std::numeric_limits<int64_t>::max();
  const int64_t N = static_cast<int64_t>(prompts.size());
  std::vector<Generation> gens(static_cast<size_t>(N));
  if (N == 0) return gens;

  // Room for every row ever fed back: the prompt, then each new token but the last. The cache
  // starts with room for a first stretch of tokens and doubles as the sequences grow, so a large
  // max_new_tokens costs memory only for the tokens actually made.
  int64_t need = 0, longest = 0;
  for (int64_t i = 0; i < N; ++i) {
    const std::vector<int32_t>& p = prompts[static_cast<size_t>(i)];
    const int64_t n = static_cast<int64_t>(p.size());
    if (n == 0)
      return Status::Invalid("generate: prompt " + std::to_string(i) +
                             " is empty: generation continues a prompt of at least one token");
    for (int64_t t = 0; t < n; ++t)
      if (p[static_cast<size_t>(t)] < 0 || p[static_cast<size_t>(t)] >= V)
        return Status::OutOfRange("generate: prompt " + std::to_string(i) + ": token id " +
                                  std::to_string(p[static_cast<size_t>(t)]) + " at position " + std::to_string(t) +
                                  " is outside the vocabulary [0, " + std::to_string(V) + ")");
    if (n > limit)
      return Status::OutOfRange("generate: prompt " + std::to_string(i) + " has " + std::to_string(n) +
                                " tokens, more than model.positions.max_len (" + std::to_string(limit) +
                                "): shorten it, or raise max_len");
    gens[static_cast<size_t>(i)].prompt_tokens = n;
    // min(n + max_new_tokens - 1, limit), without overflowing for a huge max_new_tokens.
    need = std::max(need, o.max_new_tokens - 1 > limit - n ? limit : n + o.max_new_tokens - 1);
    longest = std::max(longest, n);
  }
  Result<KVCache> made = KVCache::create(model, N, std::min(need, longest + kFirstStretch));
  if (!made.ok()) return made.status().with_prefix("generate");
  KVCache cache = std::move(made).value();

  struct Seq {
    std::vector<int32_t> context;  // prompt and new tokens: what the repetition penalty looks at
    Rng rng;
    size_t streamed = 0;           // bytes of text already handed to on_token
  };
  std::vector<Seq> seqs;
  for (int64_t i = 0; i < N; ++i) seqs.push_back({prompts[static_cast<size_t>(i)], Rng(o.seed), 0});

  // The prompts, as one padded batch.
  Batch batch;
  batch.ids = Tensor::zeros({N, longest}, DType::i32);
  for (int64_t i = 0; i < N; ++i) {
    const std::vector<int32_t>& p = prompts[static_cast<size_t>(i)];
    std::copy(p.begin(), p.end(), batch.ids.data<int32_t>() + i * longest);
    batch.lengths.push_back(static_cast<int64_t>(p.size()));
  }
  ForwardOptions fo;
  fo.reference = o.reference;
  fo.cache = &cache;
  fo.last_logits = true;
  // No token is ever drawn from NaN or infinite logits (max_element and the sampler would pick an
  // arbitrary one): each step watches its layers, and a non-finite value ends generation with the
  // step, the prompt and the first layer that made it. A repeated step is impossible (the cache
  // has moved on), so the watch runs on every step; at one row per sequence it costs next to nothing.
  fo.find_nonfinite = true;
  Outputs out;
  TSR_RETURN_IF_ERROR(model.forward(batch, fo, &out).with_prefix("generate"));
  std::vector<int64_t> active(static_cast<size_t>(N));  // batch row r is prompt active[r]
  std::iota(active.begin(), active.end(), int64_t{0});
  auto finite_step = [&](int64_t step) -> Status {
    for (size_t r = 0; r < out.nonfinite.size(); ++r)
      if (out.nonfinite[r].found())
        return Status::OutOfRange(
            "generate: prompt " + std::to_string(active[r]) + ", step " + std::to_string(step) + " (" +
            (step == 0 ? std::string("the prompt itself") : "after " + std::to_string(step) + " new token(s)") +
            "): the logits are not finite, so no token can be drawn: " + out.nonfinite[r].describe() +
            "; the weights were finite at load, so a layer overflowed f32: dump it with tessera forward --dump");
    return Status::Ok();
  };
  TSR_RETURN_IF_ERROR(finite_step(0));
  int64_t step = 0;

  const bool want_text = o.decode && (!o.stop_strings.empty() || o.on_token);
  while (true) {
    std::vector<int64_t> keep;
    for (size_t r = 0; r < active.size(); ++r) {
      const int64_t i = active[r];
      Generation& g = gens[static_cast<size_t>(i)];
      Seq& s = seqs[static_cast<size_t>(i)];
      const int32_t id =
          pick_token(out.logits.data<float>() + static_cast<int64_t>(r) * V, V, s.context, o, s.rng);
      g.ids.push_back(id);
      s.context.push_back(id);
      const int64_t made_n = static_cast<int64_t>(g.ids.size());
      if (std::find(o.eos_ids.begin(), o.eos_ids.end(), id) != o.eos_ids.end()) {
        g.finish_reason = "eos";
      } else if (std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end()) {
        g.finish_reason = "stop";
      }
      const bool stop_token = !g.finish_reason.empty();  // kept in ids, left out of the text
      std::string text;
      if (want_text) {
        std::vector<int32_t> body = g.ids;
        if (stop_token) body.pop_back();
        Result<std::string> t = o.decode(body);
        if (!t.ok()) return t.status().with_prefix("generate: decoding the completion of prompt " + std::to_string(i));
        text = std::move(t).value();
        size_t cut = std::string::npos;
        for (const std::string& stop : o.stop_strings) cut = std::min(cut, text.find(stop));
        if (cut != std::string::npos) {
          text.resize(cut);
          g.finish_reason = "stop";
        }
      }
      if (g.finish_reason.empty() && made_n == o.max_new_tokens) g.finish_reason = "length";
      // The token just made would sit at position prompt + made_n - 1: past the positions, it
      // cannot be fed back.
      if (g.finish_reason.empty() && g.prompt_tokens + made_n - 1 >= limit) {
        g.finish_reason = "length";
        g.note = "stopped at model.positions.max_len (" + std::to_string(limit) + "): the prompt's " +
                 std::to_string(g.prompt_tokens) + " tokens left room for " + std::to_string(made_n) +
                 " new tokens, not max_new_tokens " + std::to_string(o.max_new_tokens);
      }
      if (!g.finish_reason.empty()) {
        g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (o.decode && !want_text) {  // the text once, at the end
          std::vector<int32_t> body = g.ids;
          if (stop_token) body.pop_back();
          Result<std::string> t = o.decode(body);
          if (!t.ok()) return t.status().with_prefix("generate: decoding the completion of prompt " + std::to_string(i));
          text = std::move(t).value();
        }
        g.text = text;
      } else {
        keep.push_back(static_cast<int64_t>(r));
      }
      if (o.on_token) {
        TokenEvent e;
        e.sequence = i;
        e.id = id;
        e.finish_reason = g.finish_reason;
        // Final text only: not a character's first bytes, nor what may begin a stop string.
        const size_t upto =
            g.finish_reason.empty()
                ? std::min(complete_utf8(text), text.size() - stop_prefix_at_end(text, o.stop_strings))
                : text.size();
        if (upto > s.streamed) {
          e.text = text.substr(s.streamed, upto - s.streamed);
          s.streamed = upto;
        }
        o.on_token(e);
      }
    }
    if (keep.empty()) break;
    if (keep.size() < active.size()) {  // finished sequences drop out of the batch
      TSR_RETURN_IF_ERROR(cache.keep(keep));
      std::vector<int64_t> still;
      for (int64_t r : keep) still.push_back(active[static_cast<size_t>(r)]);
      active = std::move(still);
    }
    const int64_t A = static_cast<int64_t>(active.size());
    for (int64_t r = 0; r < A; ++r)
      if (cache.length(r) == cache.capacity()) {
        cache.reserve(std::min(need, 2 * cache.capacity()));
        break;
      }
    Batch step_batch;
    step_batch.ids = Tensor::empty({A, 1}, DType::i32);
    for (int64_t r = 0; r < A; ++r) step_batch.ids.data<int32_t>()[r] = gens[static_cast<size_t>(active[static_cast<size_t>(r)])].ids.back();
    TSR_RETURN_IF_ERROR(model.forward(step_batch, fo, &out).with_prefix("generate"));
    TSR_RETURN_IF_ERROR(finite_step(++step));
  }
  return gens;
}

}  // namespace tessera
