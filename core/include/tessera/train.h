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
#include "tessera/random.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

struct Targets {
  Tensor tokens;  // (B, T') i32
  Tensor labels;  // (B) i32
  // (B, 2) i32, with labels and a multi-task head (model.head.tasks): each row's block of classes
  // [first, end), its task's. The row's softmax and loss run over that block only; the other
  // classes' logits get no gradient from it. Undefined: every row over all n_classes.
  Tensor label_blocks;
  Tensor probe;   // (B, T', C) f32
  float label_smoothing = 0.f;
};

// Dropout in the training forward and backward (train.dropout), and the counters its masks are
// keyed by: each site's mask is DropoutMask{dropout_key(seed, step, micro_batch, layer, site), p}
// (tessera/random.h), its elements indexed in row-major order of the tensor it multiplies. Inverted
// dropout: kept values are scaled by 1 / (1 - p). Only compute_gradients drops; inference and
// evaluation never do.
enum class DropoutSite : uint64_t {
  embedding = 0,      // the stem's output (B, T, C), after its sum of embeddings and positions (and stem.norm); layer 0
  attention = 1,      // the attention weights (B, H, T, T) of block `layer`
  attention_out = 2,  // the attention sub-layer's output (after W_O) before the residual add
  ffn_out = 3,        // the FFN's output (after its second linear) before the residual add
};
struct DropoutOptions {
  float embedding = 0.f, attention = 0.f, residual = 0.f;  // each in [0, 1); 0: off
  uint64_t seed = 0;         // train.seed
  uint64_t step = 0;         // the optimizer step (0-based)
  uint64_t micro_batch = 0;  // the micro-batch within the step
  DropoutMask mask(DropoutSite site, int64_t layer) const;  // p 0 where that site is off
};

struct GradOptions {
  bool reference = false;  // plain loops instead of oneDNN (forward and backward)
  DropoutOptions dropout;  // none by default
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
  // Called as the backward pass finishes the gradients of a part of the model: n_layers when the
  // head's and the final norm's are done, then l as block l's are, then -1 when the stem's (and
  // the positions') are. Data-parallel training starts each part's allreduce there, while the
  // backward goes on below it. A part the backward does not reach (train.freeze) is not called.
  std::function<Status(int64_t part)> on_part_done;
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

// One task's figures in a multi-task evaluation (model.head.tasks): over its items only, its
// predictions the arg-max over its own classes.
struct TaskEval {
  std::string name;
  double loss = 0, accuracy = 0, macro_f1 = 0;
  int64_t counted = 0;
  std::vector<std::string> classes;             // its labels
  std::vector<std::vector<int64_t>> confusion;  // [true][predicted], over its classes
};

struct EvalResult {
  double loss = 0;          // mean cross-entropy (nats)
  double accuracy = -1;     // classify: share of items right; mlm: of masked rows right; -1 for lm
  double macro_f1 = -1;     // classify
  double bits_per_token = -1;  // lm: loss / ln 2
  int64_t counted = 0;      // items (classify), predicted tokens (lm) or masked rows (mlm)
  std::vector<std::vector<int64_t>> confusion;  // classify: [true][predicted]
  std::vector<TaskEval> tasks;  // classify with model.head.tasks: each task's figures, in task order,
                                // for the tasks the set has items of
  // lm, from evaluate_experiment: the predicted tokens' text in UTF-8 characters, and the loss
  // in bits per character (total bits / characters); -1 where not measured.
  int64_t characters = 0;
  double bits_per_character = -1;
};

// What train.metric scores an evaluation by: its loss, accuracy or macro-F1, or the unweighted
// mean of its tasks' accuracies (task_mean; the tasks the set has items of, -1 where it has none).
double metric_value(TrainMetric m, const EvalResult& e);
// Whether `a` is better than `b` by train.metric: a lower loss, a higher accuracy, macro-F1 or
// task mean. A tie is not better: the earlier of two equal evaluations stays the best.
bool better_eval(TrainMetric m, const EvalResult& a, const EvalResult& b);

struct TrainSummary {
  std::string dir;
  TrainMetric metric = TrainMetric::auto_detect;  // what picked `best` (train.metric, resolved)
  int64_t steps = 0;           // optimizer steps done in all
  int64_t steps_resumed = 0;   // of them, done before a resume
  int64_t examples = 0;        // training examples (classify) or windows (lm) per epoch
  double input_rows = 0;       // rows a training example gives the model: their mean (classify), seq_len (lm)
  int64_t bad_items = 0;       // items of data.path that could not be encoded (counted, and training went on)
  double last_loss = 0;        // training loss of the last step
  EvalResult best;             // the best evaluation
  int64_t best_step = 0;
  EvalResult test;             // on train.test_data with the best weights (counted 0: none)
  bool stopped_early = false;
  double budget_minutes = 0;   // train.max_minutes, when it settled the step count (0: it did not)
  double seconds = 0;
  std::vector<std::string> classes;  // classify: the class names in index order
};

Result<TrainSummary> train_experiment(const Experiment& exp, const TrainOptions& options);

// `tessera eval`: a trained model on a held-out set. The set is, in this order of preference,
// `data` (with `labels` for an IDX set: evaluated whole), train.test_data when `test`, or the
// validation set exactly as training held it out (train.validation_data, or the same seeded share
// of the items, or the last share of an LM's stream).
// A weights file (Parameters::save: a training run's best.safetensors, a checkpoint's
// weights.safetensors, `tessera export`) as owned f32 parameters of the model `cfg` describes:
// exactly the tensors it asks for, each shape checked. What `tessera eval --weights` and
// `tessera export --weights` read.
Result<Parameters> load_weights(const std::string& path, const ModelConfig& cfg);

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
// Masked-LM masking (train.objective: mlm), BERT/ESM style. Each of an example's content rows
// (role TSR_ROLE_CONTENT: never CLS, EOS, BOS, SEP, pad, unknown or an existing mask) is chosen
// with probability `prob`; a chosen row is replaced by the mask token with probability `replace`
// (0.8), by a random ordinary token with `random` (0.1), and kept as it is otherwise (train.mask_*);
// the loss is the cross-entropy of the
// original id at the chosen rows only. An example with content rows always has one chosen (the
// row with the smallest draw, when the coin chose none), so no batch has nothing to learn.
//
// Every draw is a counter-based hash of (key, row): nothing depends on hidden generator state or
// on the order rows are visited, so the same key gives the same masks on every thread count and
// after a resume. Training keys on (train.seed, step, the example's index in the training set),
// evaluation on (train.seed, the example's index in its set): every evaluation masks alike.

struct MaskSpec {
  double prob = 0.15;
  double replace = 0.8, random = 0.1;  // of the chosen: the mask token, a random token; the rest kept
  int32_t mask_id = -1;
  std::vector<int32_t> random_ids;  // what a random replacement draws from (uniformly); not empty
};

// What masking did to one row.
enum class MaskChoice : uint8_t { none = 0, masked = 1, random = 2, kept = 3 };

uint64_t mlm_train_key(int64_t seed, int64_t step, int64_t example);
uint64_t mlm_eval_key(int64_t seed, int64_t example);

// One sequence of n rows: `ids` in, `out_ids` (the input with its chosen rows replaced) and
// `targets` (the original id at chosen rows, -1 elsewhere) out; `choices` (n) when given.
void mask_sequence(const MaskSpec& spec, uint64_t key, const int32_t* ids, const uint8_t* roles, int64_t n,
                   int32_t* out_ids, int32_t* targets, MaskChoice* choices = nullptr);

// One item of the experiment's dataset as the trainer lists and encodes it (0-based, in
// read_dataset's order), as a batch of its sequences (usually one) with the targets training
// gives it: its label (classify), next-token targets (lm), or its masks (mlm: the fixed masks of
// mlm_eval_key(seed, index)). Out of range: an error naming the index and the dataset's size.
struct ExperimentItem {
  std::string id;      // the item's id
  Batch batch;
  Targets targets;
  std::string loss;    // the loss in words ("masked-LM cross-entropy over 7 masked rows")
  std::vector<std::vector<MaskChoice>> choices;  // mlm: per sequence, per row
};
Result<ExperimentItem> experiment_item(const Experiment& exp, int64_t index);

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
