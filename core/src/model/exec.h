// Exec: the one switch between the fast path (oneDNN) and the reference loops, so that model
// code is written once; Capture: keeps the intermediates a caller asked for, by name.
// Private to core/src/model.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "tessera/model.h"
#include "tessera/ops.h"

namespace tessera::model {

struct Exec {
  bool reference = false;
  // The training linears' products (linear_plain, linear_backward): f32, or bf16 (mixed
  // precision: inputs rounded to bf16, f32 sums; train.precision).
  DType compute = DType::f32;

  // y = act(x·W + b) [+ r]. On the reference path a bf16 layer rounds its inputs and weights to
  // bf16 first, which is what the fast path computes.
  Status linear(const Linear& l, const Tensor& x, Tensor& y, const Tensor* residual = nullptr) const {
    if (!reference) return l.forward(x, y, residual);
    if (l.compute_dtype() == DType::bf16)
      return ref::linear(x.to(DType::bf16), l.weight().to(DType::bf16), l.bias(), l.activation(),
                         residual, y);
    return ref::linear(x, l.weight(), l.bias(), l.activation(), residual, y);
  }
  Status matmul(const Tensor& a, const Tensor& b, Tensor& c, float alpha = 1.f) const {
    return reference ? ref::matmul(a, b, c, alpha) : ops::matmul(a, b, c, alpha);
  }
  Status softmax(const Tensor& x, Tensor& y) const {
    return reference ? ref::softmax(x, y) : ops::softmax(x, y);
  }
  Status layer_norm(const Tensor& x, const Tensor& g, const Tensor& b, float eps, Tensor& y) const {
    return reference ? ref::layer_norm(x, g, b, eps, y) : ops::layer_norm(x, g, b, eps, y);
  }
  Status embedding(const Tensor& table, const Tensor& ids, Tensor& y) const {
    return reference ? ref::embedding(table, ids, y) : ops::embedding(table, ids, y);
  }
  Status add(const Tensor& a, const Tensor& b, Tensor& y) const {
    return reference ? ref::add(a, b, y) : ops::add(a, b, y);
  }
  Status activation(Activation act, const Tensor& x, Tensor& y) const {
    return reference ? ref::activation(act, x, y) : ops::activation(act, x, y);
  }

  // Training: the forwards that keep what their backward needs, and the backwards (ops.h).
  Status linear_plain(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) const {
    return reference ? ref::linear_plain(x, w, b, y, compute) : ops::linear_plain(x, w, b, y, compute);
  }
  Status linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                         Tensor* db) const {
    return reference ? ref::linear_backward(x, w, dy, dx, dw, db, compute)
                     : ops::linear_backward(x, w, dy, dx, dw, db, compute);
  }
  // What a training layer keeps of an input x that only the products read: x itself at f32
  // compute; at bf16 its rounded copy (half the memory, and not rounded again in the backward).
  Status product_input(const Tensor& x, Tensor* kept) const {
    if (compute != DType::bf16) {
      *kept = x;
      return Status::Ok();
    }
    *kept = Tensor::empty(x.shape(), DType::bf16);
    return reference ? ref::to_bf16(x, *kept) : ops::to_bf16(x, *kept);
  }
  Status activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) const {
    return reference ? ref::activation_backward(act, x, dy, dx) : ops::activation_backward(act, x, dy, dx);
  }
  Status layer_norm_train(const Tensor& x, const Tensor& g, const Tensor& b, float eps, Tensor& y, Tensor& mean,
                          Tensor& rstd) const {
    return reference ? ref::layer_norm_train(x, g, b, eps, y, mean, rstd)
                     : ops::layer_norm_train(x, g, b, eps, y, mean, rstd);
  }
  Status layer_norm_backward(const Tensor& x, const Tensor& g, const Tensor& mean, const Tensor& rstd,
                             const Tensor& dy, Tensor* dx, Tensor* dg, Tensor* db) const {
    return reference ? ref::layer_norm_backward(x, g, mean, rstd, dy, dx, dg, db)
                     : ops::layer_norm_backward(x, g, mean, rstd, dy, dx, dg, db);
  }
  Status softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) const {
    return reference ? ref::softmax_backward(y, dy, dx) : ops::softmax_backward(y, dy, dx);
  }
  Status cross_entropy(const Tensor& logits, const Tensor& targets, float smoothing, double* loss_sum,
                       int64_t* counted, Tensor* dlogits, float scale) const {
    return reference ? ref::cross_entropy(logits, targets, smoothing, loss_sum, counted, dlogits, scale)
                     : ops::cross_entropy(logits, targets, smoothing, loss_sum, counted, dlogits, scale);
  }
  Status attention_train(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse, float scale,
                         bool causal, const int32_t* lo, const int32_t* hi, const DropoutMask* drop = nullptr) const {
    return reference ? ref::attention_train(q, k, v, out, lse, scale, causal, lo, hi, drop)
                     : ops::attention_train(q, k, v, out, lse, scale, causal, lo, hi, drop);
  }
  Status attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                            const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv, float scale, bool causal,
                            const int32_t* lo, const int32_t* hi, const DropoutMask* drop = nullptr) const {
    return reference ? ref::attention_backward(q, k, v, out, lse, dout, dq, dk, dv, scale, causal, lo, hi, drop)
                     : ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv, scale, causal, lo, hi, drop);
  }
  Status dropout(const Tensor& x, const DropoutMask& mask, Tensor& y) const {
    return reference ? ref::dropout(x, mask, y) : ops::dropout(x, mask, y);
  }
};

// ForwardOptions::find_nonfinite: records, per batch row, the first intermediate that holds a NaN or
// an infinity. Sees what Capture::put is given, whether or not it is kept.
class FiniteWatch {
 public:
  explicit FiniteWatch(std::vector<NonFinite>* found)
      : found_(found), pending_(static_cast<int64_t>(found->size())) {}
  // t: (B, ...) with B the batch rows; other shapes are not per batch row and are skipped.
  void see(const std::string& name, const Tensor& t);

 private:
  std::vector<NonFinite>* found_;
  int64_t pending_;  // batch rows with nothing found yet: none left, nothing more to read
  const void* last_data_ = nullptr;  // the last tensor read, by its first value and size
  int64_t last_numel_ = 0;
};

class Capture {
 public:
  // heads: the heads whose attention scores, mask and weights are kept (null or empty: all).
  Capture(const std::set<std::string>& names, std::map<std::string, Tensor>* out,
          const std::vector<int64_t>* heads = nullptr, FiniteWatch* watch = nullptr)
      : names_(names), out_(out), heads_(heads), watch_(watch) {}
  bool wants(const std::string& name) const {
    return out_ && !names_.empty() && (names_.count("*") || names_.count(name));
  }
  // Keeps a copy: the buffer behind `t` is reused by later layers.
  void put(const std::string& name, const Tensor& t) const {
    if (watch_) watch_->see(name, t);
    if (wants(name)) (*out_)[name] = t.clone();
  }
  const std::vector<int64_t>& heads() const {
    static const std::vector<int64_t> kAll;
    return heads_ ? *heads_ : kAll;
  }

 private:
  const std::set<std::string>& names_;
  std::map<std::string, Tensor>* out_;
  const std::vector<int64_t>* heads_;
  FiniteWatch* watch_;
};

}  // namespace tessera::model
