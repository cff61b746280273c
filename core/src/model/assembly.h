// How a Model is put together: the layers Model::build makes from the parameters, and the
// three parts of the forward pass that read like the diagram — stem, blocks, head — each a function
// of (layers, inputs) in its own file. Private to core/src/model.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "layers.h"
#include "tessera/model.h"
#include "tessera/train.h"

namespace tessera {

namespace model {
struct Block {
  AttentionLayer attn;
  Tensor ln1_g, ln1_b, ln2_g, ln2_b;
  Linear ffn1, ffn2;  // ffn1 has the activation fused
};
}  // namespace model

// What forward() runs, built once from the parameters.
struct Model::Layers {
  Tensor embed;      // (V, C)
  Tensor type_embed; // (token_types, C)
  Tensor stem_g, stem_b;  // stem.norm
  Tensor dist;       // (C)
  Linear stem_proj;  // (F, C)
  Tensor cls;        // (C)
  Tensor modality;   // (modalities, C)
  Tensor pos;        // (max_len, C): learned or sinusoidal
  std::vector<model::Block> blocks;
  Tensor final_g, final_b;
  Linear head;       // classifier (C, n_classes) or LM (C, V)
  Linear pooler;     // (C, C), tanh applied after
  Tensor head_g, head_b;  // head.norm
  Linear transform;  // (C, C) with the model's activation fused
  Tensor transform_g, transform_b;
};

namespace model {

// Concatenates (rows, n_i) matrices (or (n_i) vectors) along their last axis: [W_Q | W_K | W_V].
// The result is bf16 when the parts are (mixed-precision training), else f32.
Tensor concat_last(const std::vector<Tensor>& parts);

// layout.cpp: the batch checked against the config, and resolved into who attends to whom.
Status check_batch(const ModelConfig& c, const Batch& batch);
// CLS (and distillation) rows a features or mixed stem prepends to every batch row: 0 when the
// batch's roles say where they are.
int64_t prepended_rows(const ModelConfig& c, const Batch& batch);
// Each row's sequence and position; with a KV cache, past[b] rows of sequence b come first.
Status row_layout(const ModelConfig& c, const Batch& batch, int64_t extra, const std::vector<int64_t>& past,
                  RowLayout* lay);
// Rows of one batch row that belong to sequence `s`, in order.
std::vector<int64_t> rows_of(const RowLayout& lay, int64_t b, int32_t s);

// stem.cpp: token ids and/or feature rows -> x (B, T, C), positions added, stem.norm applied.
// What each of the B·T rows of x is made of, worked out once from the batch; the forward adds the
// pieces, the backward sends each row's gradient back to the same pieces.
struct StemPlan {
  std::vector<int32_t> token_id;     // per x row: the embedding row it looks up, -1 for none
  std::vector<float> token_scale;    // per x row: the embedding's scale (sqrt(d_model) or 1)
  std::vector<int32_t> type_id;      // per x row: its token type, -1 for none
  std::vector<float> row_factor;     // per x row: token dropout's rescaling (empty: all 1)
  std::vector<int8_t> special;       // per x row: 1 the CLS row, 2 the distillation row, 0 neither
  std::vector<int32_t> modality;     // per x row: its modality embedding, -1 for none
  std::vector<int64_t> feature_row;  // x rows that are projected feature rows, in order
  std::vector<int64_t> feature_src;  // and the input row (b·T_in + t) each one projects
  int64_t bad_id_at = -1;            // the first input row whose token id is outside [0, V)
  int32_t bad_id = 0;
};
StemPlan plan_stem(const ModelConfig& c, const Batch& batch, const RowLayout& lay, int64_t extra);

// The stem's tables (f32, undefined where the model has none) and its feature projection:
// project runs the packed Linear at inference; training passes plain weights (proj_w, proj_b).
struct StemWeights {
  Tensor embed, type_embed, cls, dist, modality, pos, norm_g, norm_b;
  Tensor proj_w, proj_b;
  std::function<Status(const Tensor& in, Tensor& out)> project;
};
// What the stem's backward needs: the plan, the projected input rows, and stem.norm's input and
// statistics.
struct StemSaved {
  StemPlan plan;
  Tensor proj_in;          // (N, F) feature rows as projected
  Tensor pre_norm;         // (B, T, C) before stem.norm
  Tensor mean, rstd;       // (B·T)
};
// x and h are the pass's stream and scratch buffers (B, T, C); the stem may swap them. With
// `saved`, it keeps what stem_backward needs.
Status stem_forward(const ModelConfig& c, const StemWeights& w, const Exec& ex, const Batch& batch,
                    const RowLayout& lay, int64_t extra, Tensor& x, Tensor& h, StemSaved* saved = nullptr);
// dx (B, T, C): the loss's gradient at the stem's output. Adds the stem parameters' gradients to
// grads (by name); with d_rows, writes the gradient of the input feature rows (input_rows, F).
Status stem_backward(const ModelConfig& c, const StemWeights& w, const Exec& ex, const StemSaved& saved,
                     const RowLayout& lay, Tensor& dx, Parameters& grads, Tensor* d_rows, int64_t input_rows);

// block.cpp: one transformer block on the stream x (B, T, C), in place; h is scratch (B, T, C).
// p names the block ("blocks.3") for captures.
Status block_forward(const ModelConfig& c, const Block& blk, const Exec& ex, const RowLayout& lay, Tensor& x,
                     Tensor& h, const Capture& cap, const std::string& p, const CacheView* cache);

// Training: one block on plain weights, keeping what its backward needs; and the backward.
struct BlockParams {
  AttentionParams attn;
  Tensor ln1_g, ln1_b, ln2_g, ln2_b, w1, b1, w2, b2;
};
struct BlockSaved {
  AttentionSaved attn;
  Tensor ln1_in, ln1_mean, ln1_rstd;  // LN1's input: X (pre-LN) or X + U (post-LN)
  Tensor r;                           // the FFN sub-layer's stream: X + U (pre-LN) or LN1(X + U)
  Tensor ln2_in, ln2_mean, ln2_rstd;  // LN2's input: R (pre-LN) or R + F (post-LN)
  Tensor ffn_in;                      // (B·T, C) the FFN's input rows (pre-LN, bf16 compute: rounded, in bf16)
  Tensor a, g;                        // (B·T, F) its hidden rows before and after the activation (g: bf16 at bf16 compute)
  DropoutMask attn_out_drop, ffn_out_drop;  // residual dropout's masks (p 0: none), regenerated backward
};
// The block's dropout: on the attention weights, and on each sub-layer's output before the
// residual add (p 0: none).
struct BlockDropout {
  DropoutMask attention, attn_out, ffn_out;
};
// x (B, T, C) in, the block's output out (a new tensor: x is kept, it is saved).
Status block_forward_train(const ModelConfig& c, const AttentionLayer& L, const BlockParams& w, const Exec& ex,
                           const RowLayout& lay, const Tensor& x, Tensor& y, BlockSaved* saved,
                           const BlockDropout& dropout = {});
// dy: the gradient at the block's output -> dx at its input (written); the block's parameter
// gradients are added to grads under p ("blocks.3").
Status block_backward(const ModelConfig& c, const AttentionLayer& L, const BlockParams& w, const Exec& ex,
                      const BlockSaved& saved, const RowLayout& lay, const Tensor& dy, Tensor& dx, Parameters& grads,
                      const std::string& p);

// head.cpp: the final rows x (B, T, C) -> out's pooled vectors, logits and probabilities.
Status head_forward(const Model& m, const Model::Layers& L, const Exec& ex, const Batch& batch,
                    const RowLayout& lay, int64_t extra, const Tensor& x, const ForwardOptions& opt,
                    const Capture& cap, Outputs* out);

// Training: the head on plain weights, the loss against the targets, and the backward to the final
// rows, in one pass (the loss sits between the head's forward and its backward). x (B, T, C): the
// final rows; dx (B, T, C) is written; the head's gradients are added to grads. Tied LM heads add
// their gradient to stem.embed's.
struct HeadLoss {
  double loss = 0;
  int64_t counted = 0;
};
Status head_train(const ModelConfig& c, const Parameters& params, const Exec& ex, const Batch& batch,
                  const RowLayout& lay, int64_t extra, const Tensor& x, const Targets& targets, Tensor& dx,
                  Parameters& grads, HeadLoss* loss, Outputs* out);

}  // namespace model
}  // namespace tessera
