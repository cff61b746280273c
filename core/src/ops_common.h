// Argument checks shared by the fast path (dnnl/) and the reference path (ref/), so that both
// refuse the same inputs with the same messages. Private to core/src.
#pragma once

#include <string>

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

}  // namespace tessera::detail
