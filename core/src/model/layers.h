// The layers a model is assembled from: position encodings and multi-head attention.
// Each forward is a function of (weights, inputs) that writes its outputs and, through Capture,
// whatever a caller (explain, parity tests, a future backward) wants to keep. Private to core/src.
#pragma once

#include <string>
#include <vector>

#include "exec.h"
#include "tessera/config.h"
#include "tessera/parameters.h"

namespace tessera::model {

// (T, C) table of the 2017 paper: PE(p, 2i) = sin(p / base^(2i/C)), PE(p, 2i+1) = cos(...).
Tensor sinusoidal_table(int64_t T, int64_t C, double base);

// Which rows attend to which, and each row's position: a batch's lengths, segments and positions
// resolved into one array each (B·T, row-major).
struct RowLayout {
  int64_t B = 0, T = 0;
  std::vector<int32_t> seg;  // the sequence a row belongs to; -1 for padding
  std::vector<int32_t> pos;  // the row's position id
  bool plain = true;         // one sequence per batch row, no padding, positions 0..T-1
  // May query row i of batch row b use key row j? Keys must be real rows of the query's own
  // sequence (a padding row's query may read any real row: its output is never used), and a
  // causal model never reads a later row.
  bool allowed(int64_t b, int64_t i, int64_t j, bool causal) const {
    const int32_t si = seg[static_cast<size_t>(b * T + i)], sj = seg[static_cast<size_t>(b * T + j)];
    return sj >= 0 && (si < 0 || si == sj) && !(causal && j > i);
  }
  int32_t position(int64_t b, int64_t t) const { return pos[static_cast<size_t>(b * T + t)]; }
};

// Rotates the first `dims` entries of every row of x (B, H, T, D) (any strides, f32) in place by
// the angle p · base^(-2i/dims) of its position p (Su et al. 2021): p = positions[b·T + t] when
// given, else pos0 + t. `half` pairs entry i with i + dims/2 (GPT-NeoX, ESM-2, LLaMA);
// `interleaved` pairs 2i with 2i + 1 (GPT-J). `inverse` rotates by the opposite angle: a rotation's
// inverse is its transpose, so that is also its backward (the gradient at the unrotated rows).
void apply_rotary(Tensor& x, int64_t dims, double base, RotaryStyle style, int64_t pos0 = 0,
                  const int32_t* positions = nullptr, bool inverse = false);

// Shaw et al. 2018: the embedding index of the offset j - i (positions), clipped to [-k, k],
// shifted to [0, 2k].
inline int64_t relative_index(int64_t i, int64_t j, int64_t k) {
  int64_t d = j - i;
  d = d < -k ? -k : (d > k ? k : d);
  return d + k;
}

// The weights of one multi-head attention, immutable after build.
struct AttentionLayer {
  int64_t n_heads = 1, d_k = 0, d_v = 0;
  float scale = 1.f;
  bool causal = false;
  PositionConfig positions;
  Linear qkv;    // (C, H·(2dk + dv)): [W_Q heads | W_K heads | W_V heads], one matmul for all three
  Linear out;    // (H·dv, C) W_O; undefined without an output projection
  Tensor rel_k;  // (2k+1, dk) relative key embeddings, or undefined
  Tensor rel_v;  // (2k+1, dv) relative value embeddings, or undefined
};

// One layer's part of a KV cache (tessera/generate.h), as Model::forward hands it to the attention:
// batch row b is sequence b, whose first past[b] rows are cached.
struct CacheView {
  float* k = nullptr;  // (B, H, capacity, dk): row t of head h of sequence b at ((b·H + h)·capacity + t)·dk
  float* v = nullptr;  // (B, H, capacity, dv)
  int64_t capacity = 0;
  const std::vector<int64_t>* past = nullptr;
  bool any_past() const {
    for (int64_t n : *past)
      if (n > 0) return true;
    return false;
  }
};

// y (B, T, C_out) = [residual +] W_O · concat_h softmax(mask(scale · Q_h K_hᵀ)) V_h for x (B, T, C).
// rows: who attends to whom and the positions. y may be *residual (in-place residual).
// Without an output projection, y is the concatenation (B, T, H·dv) and residual must be null.
// With a cache (causal layers, one sequence per batch row), the new rows' keys and values are
// appended to it, and when any sequence has cached rows the new rows attend to those as well.
Status attention_forward(const AttentionLayer& layer, const Exec& ex, const Tensor& x, const RowLayout& rows,
                         const Tensor* residual, Tensor& y, const Capture& cap, const std::string& prefix,
                         const CacheView* cache = nullptr);

// ---- Training: the same layer with what its backward needs kept, and the backward beside it ----

// The attention's weights as plain f32 tensors (training updates them every step, so nothing is
// packed): [W_Q | W_K | W_V] side by side (C, H·(2dk + dv)) and their biases, W_O and b_O.
struct AttentionParams {
  Tensor w_qkv, b_qkv, w_o, b_o;
  Tensor rel_k, rel_v;  // (2k+1, dk), (2k+1, dv): relative positions
};

// What attention_backward needs from attention_forward_train.
struct AttentionSaved {
  Tensor x;       // (B·T, C) the rows the attention read (bf16 compute: rounded, in bf16)
  Tensor qkv;     // (B·T, H·(2dk + dv)) Q and K (rotated) and V
  Tensor concat;  // (B, T, H·dv) the heads' outputs side by side
  Tensor lse;     // (B, H, T) each query row's log-sum-exp of its scores (fused kernel)
  Tensor weights; // (B, H, T, T) the attention weights (relative positions: the materialised path)
  std::vector<int32_t> lo, hi;  // each row's run of usable keys (empty: all of them)
  DropoutMask dropout;          // attention dropout on the weights (p 0: none); the backward regenerates it
};

// y (B, T, C_out) = concat_h softmax(mask(scale · Q_h K_hᵀ)) V_h · W_O + b_O (no residual: the block
// adds it), keeping what the backward needs in *saved. `dropout`: attention dropout on the weights
// (softmax(...) ⊙ M, M's element ((b·H + h)·T + i)·T + j), none when its p is 0.
Status attention_forward_train(const AttentionLayer& L, const AttentionParams& w, const Exec& ex, const Tensor& x,
                               const RowLayout& rows, Tensor& y, AttentionSaved* saved,
                               const DropoutMask& dropout = {});
// dy (B, T, C_out) -> dx (B, T, C), written; the weights' gradients are added to grads under
// p + ".w_q", ".b_q", ... (p: "blocks.3.attn").
Status attention_backward(const AttentionLayer& L, const AttentionParams& w, const Exec& ex,
                          const AttentionSaved& saved, const RowLayout& rows, const Tensor& dy, Tensor& dx,
                          Parameters& grads, const std::string& p);

}  // namespace tessera::model
