// Model: a transformer assembled from a ModelConfig — stem, N blocks, optional final norm, head —
// and run on a batch of token ids or feature rows.
//
//   Diagnostics diags;
//   std::optional<Experiment> exp = load_experiment("configs/examples/red_ball_rolls.yaml", {}, &diags);
//   Result<Model> model = Model::build(exp->model);          // weights: inline, file, or seeded init
//   Batch batch = Batch::from_rows(exp->input.rows);          // (1, T, F)
//   ForwardOptions opt;
//   opt.capture = {"blocks.0.attn.weights"};                  // keep an intermediate by name
//   Outputs out;
//   Status st = model->forward(batch, opt, &out);             // out.hidden: (B, T, C)
//
// The model reads like the diagram. For each block (post-LN, the 2017 paper and the seeds):
//   U = MultiHead(X);  R = LayerNorm(X + U);  F = FFN(R);  Y = LayerNorm(R + F)
// and pre-LN (GPT-2, ViT): R = X + MultiHead(LN(X));  Y = R + FFN(LN(R)).
// Attention is the only layer that mixes rows; everything else acts on each row alone.
//
// Parameter names (stable: weight files, `explain`, parity tests and exports all use them;
// weights are (in, out), so a layer computes x · W):
//   stem.embed (V, C)            token embedding table          stem.kind tokens
//   stem.proj (F, C), stem.proj_bias (C), stem.cls (C)          stem.kind features (mixed: both)
//   stem.modality (M, C)                                        stem.modalities = M > 0
//   pos.table (max_len, C)                                      positions.kind learned
//   blocks.L.attn.w_q (C, H·dk)  b_q (H·dk)   — head h owns columns [h·dk, (h+1)·dk);
//   blocks.L.attn.w_k (C, H·dk)  b_k (H·dk)     files and inline weights may instead give each
//   blocks.L.attn.w_v (C, H·dv)  b_v (H·dv)     head alone as blocks.L.attn.head{h}.w_q (C, dk) …
//   blocks.L.attn.w_o (H·dv, C)  b_o (C)        (output_projection)
//   blocks.L.attn.rel_k (2k+1, dk), rel_v (2k+1, dv)            positions.kind relative
//   blocks.L.ln1.gamma/beta (C)  around attention; blocks.L.ln2.gamma/beta (C) around the FFN
//   blocks.L.ffn.w1 (C, F) b1 (F), blocks.L.ffn.w2 (F, C) b2 (C)  with F = d_ff
//   final_norm.gamma/beta (C)
//   head.w (C, n_classes), head.b (n_classes)                   classifier
//   head.lm (C, V), head.lm_bias (V)                            lm, untied
// Intermediates (ForwardOptions::capture): stem.out (B,T,C) after positions; blocks.L.in;
// blocks.L.attn.in (the rows the attention reads: LN(X) in pre-LN); blocks.L.attn.q/k (B,H,T,dk)
// (after rotary), v (B,H,T,dv); scores (B,H,T,T) scaled, before the mask (H: the capture_heads
// when given); mask (B,T,T) 0 or -inf;
// weights (B,H,T,T); heads (B,H,T,dv); concat (B,T,H·dv); out (B,T,C) after W_O; residual
// (X + U); blocks.L.ln1, blocks.L.ffn.hidden (B,T,F), blocks.L.ffn.out, blocks.L.out;
// final_norm.out; head.pooled, head.logits, head.probs.
//
// Ownership and threads: a built Model is immutable; forward() may run on several threads at
// once, each with its own Outputs. Weights (including memory-mapped files) live as long as the
// Model.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessera/config.h"
#include "tessera/ops.h"
#include "tessera/parameters.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

// A batch: B rows of T token rows each. Rows are token ids (a tokens stem), feature rows (a
// features or identity stem), or either, row by row (a mixed stem). Everything but the inputs is
// optional and has a default that makes a plain padded batch:
//   - lengths: the first lengths[b] rows of row b are one sequence, the rest padding;
//   - segments (packing): the sequence each row belongs to, -1 for padding; rows attend only within
//     their sequence, and positions restart at 0 for each one;
//   - positions: explicit position ids (otherwise 0, 1, ... within each sequence);
//   - roles (tsr_role per row, as plugins give them): with roles, a features stem's learned CLS
//     vector replaces the rows whose role is CLS; without roles, a stem with cls prepends one CLS
//     row to every batch row (as for raw feature rows);
//   - kinds (mixed stems): 0 for a token row, 1 for a feature row;
//   - modality (mixed stems with stem.modalities > 0): the index of each row's learned modality
//     embedding, added after the stem.
// Padding rows still produce (meaningless) hidden states; they never influence other rows.
struct Batch {
  Tensor ids;        // (B, T) i32
  Tensor rows;       // (B, T, F) f32
  std::vector<int64_t> lengths;
  Tensor segments;   // (B, T) i32
  Tensor positions;  // (B, T) i32
  Tensor roles;      // (B, T) u8
  Tensor kinds;      // (B, T) u8
  Tensor modality;   // (B, T) i32
  Tensor types;      // (B, T) i32 token types (stem.token_types > 0); default 0 for every row

  static Batch from_ids(const std::vector<int32_t>& ids);  // one item
  static Batch from_rows(const Tensor& rows);              // (T, F) -> one item
  int64_t batch_size() const;
  int64_t seq_len() const;  // input rows, before a CLS row is added
};

class KVCache;  // tessera/generate.h

// Where a batch row's values first stopped being finite in a forward pass (ForwardOptions::
// find_nonfinite): the stable name of the first intermediate, in the order the pass makes them,
// that holds a NaN or an infinity in that batch row ("stem.out", "blocks.1.attn.q", "blocks.1.ln2",
// "blocks.1.ffn.hidden", "final_norm.out", "head.logits", ...; the names --dump takes), the index of
// the first such value within the row's part of it, and the value.
struct NonFinite {
  std::string layer;  // empty: every value of this batch row was finite
  std::string index;  // "[2, 5]": (T, C) position within the batch row (per intermediate's shape)
  double value = 0;   // NaN, +inf or -inf
  bool found() const { return !layer.empty(); }
  // "NaN first appears in blocks.1.ln2 (block 1's second layer norm) at [2, 5]"
  std::string describe() const;
};

struct ForwardOptions {
  bool reference = false;          // plain loops instead of oneDNN
  std::set<std::string> capture;   // intermediate names to keep; "*" keeps all
  // The heads whose attention scores, mask and weights are kept: blocks.L.attn.{scores,weights}
  // are (B, capture_heads.size(), T, T), in this order; empty keeps every head. The fast path
  // never stores a (T, T) matrix for its own use: kept weights are recomputed, these heads only.
  std::vector<int64_t> capture_heads;
  // Causal models: batch row b continues sequence b of the cache (see generate.h). Its rows take
  // the positions after the cached ones and attend to the cached rows too; their keys and values
  // are appended (padding rows' are not). Needs one sequence per batch row (no segments, no
  // explicit positions) and a batch of cache->sequences() rows. On steps where some sequence
  // already has cached rows, the attention scores and weights are not captured.
  KVCache* cache = nullptr;
  // lm head: logits (B, V) of each item's last valid row only, not (B, T', V): what generation
  // needs, at 1/T' of the head's cost.
  bool last_logits = false;
  // Watch every intermediate for NaN and infinities and fill Outputs::nonfinite: one more read of
  // each intermediate (about +3% CPU on a BERT-base-shaped forward), only the batch rows that have
  // any looked at closely. The rows of a batch row
  // include its padding; packed sequences share their row's verdict (a NaN in one sequence's values
  // reaches the others through attention's zero weights: 0 · NaN = NaN).
  bool find_nonfinite = false;
};

struct Outputs {
  Tensor hidden;  // (B, T', C) after the final norm; T' = T (+1 with a CLS row)
  Tensor pooled;  // (B, C)                       head pool / classifier
  Tensor logits;  // (B, n_classes) or (B, T', V) head classifier / lm; (B, V) with last_logits
  Tensor probs;   // softmax of the logits: (B, n_classes), or (B, V) for the next token
                  // after each item's last valid row (lm)
  std::map<std::string, Tensor> captured;  // requested intermediates, by name
  // With ForwardOptions::find_nonfinite: one entry per batch row, where its values first stopped
  // being finite (NonFinite::found() false: they never did). Empty otherwise.
  std::vector<NonFinite> nonfinite;
};



// What one forward pass costs, for `tessera check` and `tessera bench`.
struct Plan {
  int64_t rows = 0;                 // T' rows per item
  int64_t parameters = 0;           // number of parameter scalars
  int64_t parameter_bytes = 0;      // as stored
  double flops_per_item = 0;        // multiply-adds count 2
  int64_t activation_bytes_per_item = 0;  // peak working set of one item's activations
  int64_t score_entries_per_head = 0;     // n², the scores one head forms for one item
  std::vector<std::pair<std::string, double>> flops_by_part;  // "attention scores", ...
};
Plan make_plan(const ModelConfig& cfg, int64_t seq_len);

// One parameter the config asks for.
struct ParamSpec {
  std::string name;
  Shape shape;
  enum class Init { matrix, zeros, ones } init = Init::matrix;
  int64_t head_cols = 0;  // > 0: drawn head by head, each (rows, head_cols) block on its own
};
std::vector<ParamSpec> parameter_specs(const ModelConfig& cfg);

// The pooled vector of one sequence's hidden rows h (T, C) as head.pool says (cls: the row whose
// role is CLS, or row 0 without roles; mean: all rows; last: the last row; cls_dist: the mean of the
// CLS row and the one after it; max: each channel's largest value over all rows). The model's own
// pooling and the batch runner's (packed sequences) share it; Model::pool_head then applies the
// pooler and the normalisation.
void pool_rows(const ModelConfig& cfg, const Tensor& h, const uint8_t* roles, float* out);
// The same pooling as the rows it reads and their weights (pooling is a weighted sum of rows):
// what the pooling's backward sends each row. Empty for max, which is not a weighted sum: pool_max.
std::vector<std::pair<int64_t, float>> pool_taps(const ModelConfig& cfg, int64_t n, const uint8_t* roles);
// Max pooling of h (T, C) into out (C), and with arg (C) each channel's row (the first on a tie,
// -1 when T is 0): where the backward sends that channel's gradient. No rows: zeros.
void pool_max(const Tensor& h, float* out, int64_t* arg);

// Checks the tensors that model.weights supplies (inline and the file's header) against the
// parameters the config asks for: unexpected names, missing tensors (unless allow_missing),
// shapes and dtypes. Every problem is added at the YAML key that chose the tensor, so a config and
// its weights are refused together before anything runs. Model::build applies the same checks.
void validate_weights(const ModelConfig& cfg, Diagnostics* diags);

class Model {
 public:
  // Builds the model. Every parameter comes from, in order: model.weights.inline, then
  // model.weights.file, then seeded init (when allow_missing). Missing, unexpected and mis-shaped
  // tensors are all reported together in one status naming each tensor with expected and found
  // shapes (and the YAML location of the source).
  static Result<Model> build(const ModelConfig& cfg);
  // Builds the model on parameters resolved elsewhere (training: the optimizer's current master
  // weights; they are shared, not copied, except where a layer packs its weights). They must be
  // exactly the ones cfg asks for (Parameters::check).
  static Result<Model> build(const ModelConfig& cfg, const Parameters& params);

  const ModelConfig& config() const { return *cfg_; }
  const Parameters& parameters() const { return *params_; }
  const Tensor* parameter(const std::string& name) const;
  int64_t rows_for(int64_t input_rows) const;  // T' for T input rows

  Status forward(const Batch& batch, const ForwardOptions& options, Outputs* out) const;

  // The classifier head on pooled vectors (N, C): logits and probabilities (N, n_classes).
  Status classify(const Tensor& pooled, Tensor* logits, Tensor* probs, const ForwardOptions& options) const;

  // Finishes pooled vectors (N, C) in place: head.pooler (dense + tanh), then head.normalize (L2).
  Status pool_head(Tensor& pooled, const ForwardOptions& options) const;

  // All parameters, named as above, into one safetensors file.
  Status save(const std::string& path) const;

  struct Layers;  // oneDNN-ready layers (packed weights), private to core/src/model

 private:
  std::shared_ptr<const ModelConfig> cfg_;
  std::shared_ptr<const Parameters> params_;
  std::shared_ptr<const Layers> layers_;
};

// Runs `batch` again with find_nonfinite and returns, for each batch row, the first layer that made
// a NaN or infinity (for a caller that found non-finite outputs after the fact). Not for KV cache
// steps (they cannot be repeated): set find_nonfinite on the step itself.
Result<std::vector<NonFinite>> first_nonfinite_layers(const Model& model, const Batch& batch,
                                                     const ForwardOptions& options);
// Ok when no entry was found; otherwise an out_of_range status naming, for each `what` ("batch
// row", "item") index with non-finite values, the first layer that made them, and what to do.
Status nonfinite_status(const std::vector<NonFinite>& found, const std::string& what = "batch row");

}  // namespace tessera
