// Training: the loss of one batch and the gradient of every parameter.
//
//   Result<Parameters> p = Parameters::resolve(exp->model);
//   Parameters master = p->clone(), grads = master.zeros_like();
//   Targets t;
//   t.tokens = next_token_targets(batch);             // (B, T) i32, -1: no loss on that row
//   Result<LossValue> l = compute_gradients(exp->model, master, batch, t, &grads);
//   // grads now holds d loss / d parameter, under the parameters' own names
//
// The loss is one of three, chosen by which target is given:
//   - tokens (B, T') i32: cross-entropy of the LM head's logits at every row whose target is not
//     -1, averaged over those rows (next-token LM: the ids shifted left, -1 at padding and at each
//     item's last row; masked LM: the original id at the masked rows only);
//   - labels (B) i32: cross-entropy of the classifier's logits, averaged over the items;
//   - probe (B, T', C) f32: Σ probe ⊙ hidden (the final rows, after the final norm): a loss for
//     models without a head, and for checking any layer's gradient against a reference.
// Label smoothing ε spreads ε of each target's mass evenly over the classes (or vocabulary).
//
// Gradients are added to *grads (+=), so micro-batches accumulate; zero them between steps.
// Parameters must be f32 (Parameters::clone makes them so). Thread-safety: one call at a time per
// grads object; the parameters are only read.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/config.h"
#include "tessera/model.h"
#include "tessera/parameters.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

struct Targets {
  Tensor tokens;  // (B, T') i32
  Tensor labels;  // (B) i32
  Tensor probe;   // (B, T', C) f32
  float label_smoothing = 0.f;
};

struct GradOptions {
  bool reference = false;  // plain loops instead of oneDNN (forward and backward)
  // Where the backward pass may stop when the parts below are not trained (train.freeze): it runs
  // through the head and the final norm, blocks n_layers-1 down to backward_first_block, and the
  // stem only when backward_stem. What it skips keeps its gradients in *grads as they were, and
  // has no input-rows gradient (d_rows). The defaults run the whole backward.
  int64_t backward_first_block = 0;
  bool backward_stem = true;
  // Mixed precision (train.precision, docs/PRECISION.md): bf16 rounds the inputs of every matmul
  // of the forward and backward pass to bf16 (f32 sums, f32 outputs); everything else is f32.
  DType precision = DType::f32;
  // With bf16: the matmul weights' bf16 copies (lowp_weights of the same parameters), made once
  // per optimizer step; null: compute_gradients makes them itself for this call.
  const Parameters* lowp = nullptr;
};

struct LossValue {
  double loss = 0;      // the batch's loss (a mean over `counted`, or the probe's sum)
  int64_t counted = 0;  // rows (tokens) or items (labels) the loss averages over
  Tensor d_rows;        // (B, T, F) the gradient of the input feature rows (features stems)
  Outputs outputs;      // hidden rows (and logits) of the forward pass
};

// The parameters as a bf16 training step reads them: the weights of every matmul (attention's
// W_Q, W_K, W_V and W_O, the FFN's, the feature projection, the classifier, pooler, transform and
// LM head, and the token table when an LM head is tied to it) as bf16 copies rounded to nearest
// even, every other parameter P's own f32 tensor (shared, not copied).
Parameters lowp_weights(const ModelConfig& cfg, const Parameters& P);

// Next-token targets for a batch of token ids: ids shifted left by one within each sequence, -1
// at padding rows and at each sequence's last row.
Tensor next_token_targets(const Batch& batch);

// The forward pass on `params`, the loss against `targets`, and the backward pass adding
// d loss / d parameter to *grads (which must hold a tensor of each parameter's shape).
Result<LossValue> compute_gradients(const ModelConfig& cfg, const Parameters& params, const Batch& batch,
                                    const Targets& targets, Parameters* grads, const GradOptions& options = {});

// ---------------------------------------------------------------------------------------------
// `tessera train`: the experiment's dataset through its plugin, the model trained on it (train.*),
// evaluated on the held-out part, checkpointed, and resumable to bit-identical weights.
//
// The run folder (outputs.dir) holds: metrics.jsonl (a line per log step and per evaluation),
// checkpoints/ (step-N folders with weights.safetensors, optimizer state and the trainer's state;
// `latest` names the newest), best.safetensors (the weights of the best evaluation, runnable as
// model.weights.file), and summary.json. See docs/TRAINING.md.

struct TrainOptions {
  std::string out_dir;   // overrides outputs.dir when non-empty
  bool resume = false;   // continue from the run folder's latest checkpoint
  bool force = false;    // start over in a run folder that already has a training run
  bool progress = true;  // a progress line on stderr
  // Called after each optimizer step is done and logged (tests stop a run midway with it).
  std::function<void(int64_t step)> on_step;
};

struct EvalResult {
  double loss = 0;          // mean cross-entropy (nats)
  double accuracy = -1;     // classify: share of items right; -1 for lm
  double macro_f1 = -1;     // classify
  double bits_per_token = -1;  // lm: loss / ln 2
  int64_t counted = 0;      // items (classify) or predicted tokens (lm)
  std::vector<std::vector<int64_t>> confusion;  // classify: [true][predicted]
  // lm, from evaluate_experiment: the predicted tokens' text in UTF-8 characters, and the loss
  // in bits per character (total bits / characters); -1 where not measured.
  int64_t characters = 0;
  double bits_per_character = -1;
};

struct TrainSummary {
  std::string dir;
  int64_t steps = 0;           // optimizer steps done in all
  int64_t steps_resumed = 0;   // of them, done before a resume
  int64_t examples = 0;        // training examples (classify) or windows (lm) per epoch
  double last_loss = 0;        // training loss of the last step
  EvalResult best;             // the best evaluation
  int64_t best_step = 0;
  EvalResult test;             // on train.test_data with the best weights (counted 0: none)
  bool stopped_early = false;
  double seconds = 0;
  std::vector<std::string> classes;  // classify: the class names in index order
};

Result<TrainSummary> train_experiment(const Experiment& exp, const TrainOptions& options);

// `tessera eval`: a trained model on a held-out set. The set is, in this order of preference,
// `data` (with `labels` for an IDX set: evaluated whole), train.test_data when `test`, or the
// validation set exactly as training held it out (train.validation_data, or the same seeded share
// of the items, or the last share of an LM's stream).
struct EvalOptions {
  std::string weights;       // a weights file (best.safetensors, checkpoints/step-N/weights.safetensors)
  std::string data, labels;  // another data set, and its IDX labels file
  bool test = false;         // train.test_data
};

struct EvalReport {
  EvalResult result;
  std::vector<std::string> classes;  // classify: the class names in index order
  std::string set;                   // what was evaluated, in words
  int64_t failed = 0;                // items that could not be read (not counted)
};

Result<EvalReport> evaluate_experiment(const Experiment& exp, const EvalOptions& options);

// ---------------------------------------------------------------------------------------------
// Baselines (train.baseline), the yardsticks an LM's bits per token are read against. The trainer
// fits them on the training stream and evaluates them on every token of the held-out stream
// after its first (docs/TRAINING.md, "Baselines").

// A counted n-gram model: order 1 (unigram) or 2 (bigram), add-k smoothed over the V ids:
//   unigram  p(b)     = (c(b) + k) / (N + k·V)          N: tokens counted
//   bigram   p(b | a) = (c(a b) + k) / (c(a ·) + k·V)   c(a ·): the bigrams that start with a
struct NgramModel {
  int order = 1;
  int64_t vocab = 0;              // V
  double add_k = 1.0;
  int64_t total = 0;              // N
  std::vector<int64_t> unigrams;  // (V): c(b)
  std::vector<int64_t> bigrams;   // (V, V), order 2: c(a b) at a·V + b
  std::vector<int64_t> contexts;  // (V), order 2: c(a ·)

  // Counts `stream`; an id outside [0, vocab) is an error naming its position.
  static Result<NgramModel> count(int order, const std::vector<int32_t>& stream, int64_t vocab, double add_k);
  double prob(int32_t prev, int32_t next) const;  // prev is ignored by a unigram model
  // Sum of -ln p(stream[t] | stream[t-1]) over t = 1 .. size-1 (nats); ids must be in range.
  double nats(const std::vector<int32_t>& stream) const;
};

// The proximity model of the first seed lecture (§3, "contextualizing by proximity"), on its
// causal side: the next token from the mean of the last `window` token embeddings,
//   h_t = (1/w_t) · Σ_{j=t-w_t}^{t-1} E[x_j]   (w_t = min(window, t))      (C)
//   logits_t = h_t · W + b                                                  (V)
// Its parameters: "stem.embed" (V, C), "proximity.w" (C, V), "proximity.b" (V).
Parameters proximity_init(int64_t vocab, int64_t width, uint64_t seed);
// Sum of -ln p(stream[t]) over t in `targets` (each in [1, size)); when grads is given (the
// shapes of p, zeroed by the caller), the gradient of that sum is added to it.
double proximity_nats(const Parameters& p, const std::vector<int32_t>& stream, const std::vector<int64_t>& targets,
                      int64_t window, Parameters* grads = nullptr);

}  // namespace tessera
