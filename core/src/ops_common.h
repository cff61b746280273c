// Argument checks shared by the fast path (dnnl/) and the reference path (ref/), so that both
// refuse the same inputs with the same messages. Private to core/src.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "tessera/ops.h"

namespace tessera::detail {

Status check_same_shape(const char* op, const Tensor& x, const Tensor& y);
Status check_linear_shapes(const char* op, const Tensor& x, const Tensor& w, const Tensor& b,
                           const Tensor* residual, const Tensor& y);
Status check_matmul_shapes(const char* op, const Tensor& a, const Tensor& b, const Tensor& c);
Status check_layer_norm_shapes(const char* op, const Tensor& x, const Tensor& gamma,
                               const Tensor& beta, float eps, const Tensor& y);
Status check_embedding(const char* op, const Tensor& table, const Tensor& ids, const Tensor& y);
Status check_add_shapes(const char* op, const Tensor& a, const Tensor& b, const Tensor& y);
// dropout: x and y of one shape, f32 (or f64 where allowed), p in [0, 1).
Status check_dropout(const char* op, const Tensor& x, const DropoutMask& mask, const Tensor& y, bool allow_f64);
Status check_split_heads(const char* op, const Tensor& x, int64_t n_heads, const Tensor& y);
Status check_merge_heads(const char* op, const Tensor& x, const Tensor& y);
Status check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                       bool causal, const int32_t* key_lo, const int32_t* key_hi);
// check_attention for the training ops, with lse (B, H, T) and, for the backward, dout like out and
// dq, dk, dv like q, k, v (rows sgemm can write). Every tensor f32, or, where allow_f64 (the
// reference loops), every tensor f64.
Status check_attention_train(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, bool causal, const int32_t* key_lo,
                             const int32_t* key_hi, bool allow_f64);
Status check_attention_backward(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                const Tensor& dk, const Tensor& dv, bool causal, const int32_t* key_lo,
                                const int32_t* key_hi, bool allow_f64);
Status bad_id(const char* op, int64_t position, int64_t id, int64_t vocab);

// The training ops (ops.h, "Training"). Their tensors are f32; the reference loops (f64_ok) also
// take f64, every float tensor of one call the same dtype. Gradients passed as null are skipped.
using NamedTensor = std::pair<const char*, const Tensor*>;
Status check_training_dtypes(const char* op, std::initializer_list<NamedTensor> ts, bool f64_ok);
// The dtype rule, and every tensor of the first one's shape, which has at least one axis.
Status check_elementwise_training(const char* op, std::initializer_list<NamedTensor> ts, bool f64_ok);
// compute: f32, or bf16 (mixed precision): then every tensor is f32 but x and w, which may also
// be bf16.
Status check_linear_plain(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                          bool f64_ok, DType compute = DType::f32);
Status check_linear_backward(const char* op, const Tensor& x, const Tensor& w, const Tensor& dy,
                             const Tensor* dx, const Tensor* dw, const Tensor* db, bool f64_ok,
                             DType compute = DType::f32);
// to_bf16: x f32, y bf16 of x's shape.
Status check_to_bf16(const char* op, const Tensor& x, const Tensor& y);
Status check_activation_backward(const char* op, Activation act, const Tensor& x, const Tensor& dy,
                                 const Tensor& dx, bool f64_ok);
Status check_layer_norm_train(const char* op, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              float eps, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                              bool f64_ok);
Status check_layer_norm_backward(const char* op, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& dy, const Tensor* dx, const Tensor* dgamma,
                                 const Tensor* dbeta, bool f64_ok);
Status check_embedding_backward(const char* op, const Tensor& ids, const Tensor& dy, const Tensor& dtable,
                                bool f64_ok);
// Shapes, dtypes, ε, and every target in [-1, V) (the first one outside is named with its row).
Status check_cross_entropy(const char* op, const Tensor& logits, const Tensor& targets, float label_smoothing,
                           const Tensor* dlogits, bool f64_ok);

}  // namespace tessera::detail
