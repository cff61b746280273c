// The numeric ops of the transformer, in two implementations with the same meaning:
//   - the fast path (namespace tessera::ops, class tessera::Linear): oneDNN primitives, created
//     once per shape and cached, weights reordered to the primitive's layout once;
//   - the reference path (namespace tessera::ref): plain loops, obviously correct, slow.
// Tests hold the two together over random shapes; models can run either (ForwardOptions).
// This header names no oneDNN type: everything oneDNN lives in core/src/dnnl/.
//
//   Tensor x = Tensor::zeros({4, 8});                          // (T, C)
//   Result<Linear> lin = Linear::create(w /*(8, 16)*/, b /*(16)*/, Activation::gelu_erf);
//   Tensor y = Tensor::empty({4, 16});
//   Status st = lin->forward(x, y);                            // y = gelu(x·w + b)
//
// Conventions. Weights of a linear layer are (K, N) = (in, out): y = x·W, as in the seeds and in
// the 2017 paper; a PyTorch (out, in) weight is passed as its transpose view, no copy. All ops
// accept f32 and bf16 inputs; outputs are f32 unless stated. With bf16, inputs are rounded to bf16
// and products accumulate in f32 (oneDNN's bf16 semantics); on CPUs where oneDNN has no bf16
// kernels the same numbers are produced by rounding and computing in f32 (see runtime_info()).
// Softmax subtracts the row maximum; a row whose every entry is -inf gives zeros, never NaN.
// Thread-safety: ops may be called from several threads at once; a Linear is immutable after
// create() and may be shared by threads.
#pragma once

#include <memory>
#include <string>

#include "tessera/random.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

// Only grows.
enum class Activation : int {
  none = 0,
  relu = 1,
  gelu_erf = 2,   // x/2 · (1 + erf(x/√2)): BERT, ViT, the exact GELU
  gelu_tanh = 3,  // x/2 · (1 + tanh(√(2/π)(x + 0.044715x³))): GPT-2's gelu_new
};
const char* activation_name(Activation a);

// Threads used inside one op (intra-op). 0 = all cores. Applies process-wide.
void set_num_threads(int n);
int num_threads();

struct RuntimeInfo {
  std::string onednn_version;  // "2.6.3"
  std::string isa;             // what oneDNN dispatches to, e.g. "avx2", "avx512_core_bf16"
  bool native_bf16 = false;    // oneDNN has bf16 matmul kernels on this CPU
  int threads = 0;
};
RuntimeInfo runtime_info();

// A linear layer with its weights packed once: y (M, N) = act(x (M, K) · W (K, N) + b (N)) [+ r (M, N)].
// The residual r, when given, is added after the activation (a fused post-op).
class Linear {
 public:
  Linear() = default;
  // weight: (K, N), f32 or bf16, any strides (a transpose view is fine); bias: (N) or undefined.
  // compute: f32, or bf16 (weights rounded to bf16 once here, activations at each call).
  static Result<Linear> create(const Tensor& weight, const Tensor& bias, Activation act,
                               DType compute = DType::f32);

  // x: (M, K) f32 or bf16 with unit stride in K; y: (M, N) f32, contiguous, preallocated;
  // residual: (M, N) f32 or nullptr. y may not alias x; it may alias *residual.
  Status forward(const Tensor& x, Tensor& y, const Tensor* residual = nullptr) const;

  int64_t in_features() const;
  int64_t out_features() const;
  Activation activation() const;
  DType compute_dtype() const;
  const Tensor& weight() const;  // (K, N) as given to create(), for the reference path and export
  const Tensor& bias() const;
  std::string impl_name() const;  // the oneDNN implementation chosen, e.g. "gemm:jit"
  // What a forward of `rows` rows runs: "gemv_bf16:avx2" or "gemv_bf16:generic" where it takes
  // the bf16 weight-streaming GEMV (bf16 compute without native bf16 kernels and rows <=
  // gemv_max_rows(); that layer also holds a bf16 copy of its weights), else impl_name().
  std::string impl_name(int64_t rows) const;
  static int64_t gemv_max_rows();
  // Elements between consecutive weight rows that a forward of `rows` rows reads, when the
  // weights are plain (K, N) row-major: N, or N + 16 below 512 rows where N's rows would be a
  // multiple of 2 KiB apart (see Linear::create); 0 when oneDNN chose a blocked layout.
  int64_t weight_row_stride(int64_t rows) const;
  bool defined() const { return impl_ != nullptr; }

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

namespace ops {

// c (..., M, N) = alpha · a (..., M, K) · b (..., K, N). Rank 2 to 4; leading (batch) dims equal.
// a and b may be strided views (b may be a transpose view of a (..., N, K) tensor). c is f32,
// preallocated, and may be a strided view too.
Status matmul(const Tensor& a, const Tensor& b, Tensor& c, float alpha = 1.0f);

// y = softmax(x) along the last axis. In place is allowed (y shares x's storage).
// A row of all -inf gives a row of zeros.
Status softmax(const Tensor& x, Tensor& y);

// y = (x - mean) / sqrt(var + eps) · gamma + beta, over the last axis (C); gamma, beta: (C).
// eps > 0 keeps a constant row finite (it maps to beta).
Status layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y);

// y (..., C) = table (V, C)[ids (...)]; ids are i32; an id outside [0, V) is an error naming it.
Status embedding(const Tensor& table, const Tensor& ids, Tensor& y);

// y = a + b; b has a's shape or is broadcast over a's leading dims (b's shape a suffix of a's).
// In place allowed (y is a).
Status add(const Tensor& a, const Tensor& b, Tensor& y);

// y = act(x), elementwise. In place allowed.
Status activation(Activation act, const Tensor& x, Tensor& y);

// Scaled dot-product attention as one fused op: out = softmax(scale · q kᵀ, masked) · v for every
// (batch row, head), computed in tiles with an online softmax, so the (T, S) scores are never
// stored: extra memory is a few tiles per thread, flat in T and S.
//   q (B, H, T, dk), k (B, H, S, dk), v (B, H, S, dv), out (B, H, T, dv): f32, unit stride along
//   the last axis, any other strides (head views of a fused QKV buffer need no copy).
// Query row i of batch row b uses keys j with key_lo[b·T + i] <= j < key_hi[b·T + i] (both null:
// every key) and, when causal, j <= i + (S - T). A row left with no key gives zeros, never NaN.
Status attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, float scale,
                 bool causal = false, const int32_t* key_lo = nullptr, const int32_t* key_hi = nullptr);

// (B, T, H·D) -> (B, H, T, D) and back.
Status split_heads(const Tensor& x, int64_t n_heads, Tensor& y);
Status merge_heads(const Tensor& x, Tensor& y);

// ---- Training: forward ops that keep what their backward needs, and the backward ops -------
// Conventions (fast path and reference alike):
//   - the gradient of an input (dx) is written: it overwrites its tensor;
//   - the gradient of a parameter (dw, db, dgamma, dbeta, dtable) is added to its tensor (+=), so
//     micro-batches accumulate and a weight used twice (a tied LM head) sums both uses, with no
//     extra buffer; callers zero parameter gradients once per optimizer step;
//   - any gradient pointer may be null: that gradient is not computed;
//   - f32 throughout (x, w and the gradients); the reference loops also take f64 (every tensor
//     of one call f64), for gradient checks against finite differences in double precision.

//   - mixed precision (train.precision: bf16, docs/PRECISION.md): with compute = bf16 the linear
//     ops round the inputs of each product to bf16 (round to nearest even: x and w forward, dy and
//     w for dx, x and dy for dw), sum the products in f32 and write f32, as PyTorch's CPU autocast
//     does; the bias and db stay f32 (db sums dy unrounded). w may then be given as bf16 (the
//     step's rounded copy of the f32 master weights), and x as bf16 (to_bf16 below: a training
//     layer keeps the rounded copy of an input that only products read, in half the memory and
//     without rounding it again in the backward); every other tensor is f32. Native bf16
//     kernels where oneDNN has them (AVX512_BF16, AMX), else the rounded values multiplied by the
//     f32 kernels: the same products, summed in another order.

// y (M, N) = x (M, K) · w (K, N) [+ b (N)] on plain, unpacked weights (they change every step,
// so nothing is reordered ahead). w may be any strided view (a transpose view of (N, K)).
Status linear_plain(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, DType compute = DType::f32);
// Backward of y = x · w + b: dx (M, K) = dy · wᵀ; dw (K, N) += xᵀ · dy; db (N) += Σ_rows dy.
// dw may be a strided view (the (V, C) table's transpose for a tied head).
Status linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db,
                       DType compute = DType::f32);
// y (bf16, x's shape) = x (f32) rounded to nearest even: the x that bf16 compute's products read.
Status to_bf16(const Tensor& x, Tensor& y);

// dx = dy ⊙ act'(x), x the activation's input (the pre-activation rows). dx may be dy.
Status activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx);

// layer_norm that also keeps each row's mean and 1/sqrt(var + eps) (mean, rstd: (rows) f32).
Status layer_norm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd);
// Backward of layer_norm over the last axis from the kept mean and rstd.
Status layer_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dy, Tensor* dx, Tensor* dgamma, Tensor* dbeta);

// Backward of y = softmax(x) along the last axis from y: dx = y ⊙ (dy - Σ_last dy ⊙ y). dx may be dy.
Status softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);

// dtable (V, C) += Σ over rows i with ids[i] = v of dy[i] (the embedding lookup's backward);
// ids (...) i32 as in embedding, dy (..., C).
Status embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dtable);

// Cross-entropy of logits (N, V) against targets (N) i32, a target of -1 meaning "no loss on this
// row": loss_i = -Σ_v q_iv log softmax(logits_i)_v with q = (1 - ε) one_hot + ε / V (label
// smoothing ε in [0, 1)). Writes the sum of the counted rows' losses (double) and how many rows
// counted; when dlogits (N, V) is given, writes scale · d(sum)/d(logits) (ignored rows get zeros):
// scale · (softmax - q). A target outside [-1, V) is an error naming the row.
Status cross_entropy(const Tensor& logits, const Tensor& targets, float label_smoothing, double* loss_sum,
                     int64_t* counted, Tensor* dlogits = nullptr, float scale = 1.f);

// Fused attention (ops::attention) that also keeps, for every query row, the log-sum-exp of its
// masked, scaled scores: lse (B, H, T) f32 (-inf for a row with no key). Same outputs as attention.
// With an active `dropout`, attention dropout: out = (P ⊙ M) · v, M_bhij = drop.factor(((b·H + h)·T
// + i)·S + j) (0 or 1 / (1 - p)); lse stays the undropped softmax's.
Status attention_train(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse, float scale,
                       bool causal = false, const int32_t* key_lo = nullptr, const int32_t* key_hi = nullptr,
                       const DropoutMask* dropout = nullptr);
// Its backward, recomputing the weights tile by tile from q, k and lse (FlashAttention-2), so the
// memory stays O(T) as in the forward: dq (B, H, T, dk), dk (B, H, S, dk), dv (B, H, S, dv) are
// written (they may be strided views, e.g. of one fused dQKV buffer). out and dout (B, H, T, dv).
// `dropout` must be the forward's: its mask is regenerated tile by tile from the same counters.
Status attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv, float scale, bool causal = false,
                          const int32_t* key_lo = nullptr, const int32_t* key_hi = nullptr,
                          const DropoutMask* dropout = nullptr);

// Inverted dropout: y[e] = x[e] · mask.factor(e), e the element's index in x's row-major order (f32).
// It is its own backward: dx = dropout(dy) with the same mask. In place allowed (y is x).
Status dropout(const Tensor& x, const DropoutMask& mask, Tensor& y);

}  // namespace ops


// Reference loops: the same contracts, written for clarity. f32 accumulation; bf16 inputs are
// converted to f32 first (so they give what the fast path gives on bf16-rounded inputs).
namespace ref {
Status linear(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
              const Tensor* residual, Tensor& y);
Status matmul(const Tensor& a, const Tensor& b, Tensor& c, float alpha = 1.0f);
Status softmax(const Tensor& x, Tensor& y);
Status layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y);
Status embedding(const Tensor& table, const Tensor& ids, Tensor& y);
Status add(const Tensor& a, const Tensor& b, Tensor& y);
Status activation(Activation act, const Tensor& x, Tensor& y);
Status split_heads(const Tensor& x, int64_t n_heads, Tensor& y);
Status merge_heads(const Tensor& x, Tensor& y);
Status attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, float scale,
                 bool causal = false, const int32_t* key_lo = nullptr, const int32_t* key_hi = nullptr);
float activate(Activation act, float x);  // one value
double activate(Activation act, double x);
double activate_derivative(Activation act, double x);  // d act / dx at x

// The training ops (see above), as plain loops; f32 or f64. With compute = bf16 (f32 tensors, w
// f32 or bf16) the loops read the products' inputs rounded to bf16 and sum in double.
Status linear_plain(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, DType compute = DType::f32);
Status linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db,
                       DType compute = DType::f32);
Status to_bf16(const Tensor& x, Tensor& y);
Status activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx);
Status layer_norm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd);
Status layer_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dy, Tensor* dx, Tensor* dgamma, Tensor* dbeta);
Status softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
Status embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dtable);
Status cross_entropy(const Tensor& logits, const Tensor& targets, float label_smoothing, double* loss_sum,
                     int64_t* counted, Tensor* dlogits = nullptr, float scale = 1.f);
// Materialised: the (T, S) weights as a tensor, softmax backward on them.
Status attention_train(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse, float scale,
                       bool causal = false, const int32_t* key_lo = nullptr, const int32_t* key_hi = nullptr,
                       const DropoutMask* dropout = nullptr);
Status attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv, float scale, bool causal = false,
                          const int32_t* key_lo = nullptr, const int32_t* key_hi = nullptr,
                          const DropoutMask* dropout = nullptr);
Status dropout(const Tensor& x, const DropoutMask& mask, Tensor& y);  // f32 or f64
}  // namespace ref

}  // namespace tessera
