// Reference loops for the training ops of ops.h: the forward ops that keep what their backward
// needs, the backward ops and cross-entropy. Plain loops over contiguous copies, written once as
// templates on the scalar (float or double, sums in double): the f32 instance is what the fast
// path is tested against, the f64 one what finite differences check. Not here: attention's
// backward (attention_ref_backward.cpp).
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops_common.h"  // core/src: argument checks shared with the fast path
#include "tessera/ops.h"

namespace tessera::ref {

double activate_derivative(Activation act, double x) {
  switch (act) {
    case Activation::none:
      return 1.0;
    case Activation::relu:  // 0 at the kink, as oneDNN
      return x > 0.0 ? 1.0 : 0.0;
    case Activation::gelu_erf:  // Φ(x) + x·φ(x)
      return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    case Activation::gelu_tanh: {  // u = k(x + a x³): ½(1 + tanh u) + ½x(1 - tanh² u)·k(1 + 3a x²)
      const double k = std::sqrt(2.0 / M_PI), a = 0.044715;
      const double t = std::tanh(k * (x + a * x * x * x));
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * a * x * x);
    }
  }
  return 1.0;
}

namespace {

template <class T>
constexpr DType dtype_of() {
  return std::is_same_v<T, double> ? DType::f64 : DType::f32;
}

// dst = v (row-major values of dst's shape), through a contiguous tensor of dst's dtype.
template <class T>
void write(Tensor& dst, const std::vector<double>& v) {
  Tensor out = Tensor::empty(dst.shape(), dtype_of<T>());
  T* p = out.data<T>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<T>(v[i]);
  dst.copy_from(out);
}

// dst += v: the parameter gradients accumulate.
template <class T>
void accumulate(Tensor& dst, const std::vector<double>& v) {
  Tensor sum = dst.clone();
  T* p = sum.data<T>();
  for (size_t i = 0; i < v.size(); ++i) p[i] += static_cast<T>(v[i]);
  dst.copy_from(sum);
}

// y (M, N) = x (M, K) · w (K, N) [+ b (N)].
template <class T>
Status linear_plain_t(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  const Tensor xc = x.contiguous(), wc = w.contiguous(), bc = b.defined() ? b.contiguous() : Tensor();
  const T* xp = xc.data<T>();
  const T* wp = wc.data<T>();
  std::vector<double> out(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = bc.defined() ? static_cast<double>(bc.data<T>()[n]) : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(xp[m * K + k]) * wp[k * N + n];
      out[m * N + n] = acc;
    }
  write<T>(y, out);
  return Status::Ok();
}

// A dense f32 copy of t (f32 or bf16) with every value rounded to the nearest bf16 (ties to even).
Tensor rounded_to_bf16(const Tensor& t) {
  const Tensor c = t.contiguous();
  Tensor out = Tensor::empty(t.shape());
  float* o = out.data<float>();
  for (int64_t i = 0; i < c.numel(); ++i)
    o[i] = c.dtype() == DType::bf16 ? bf16_to_f32(c.data<bf16>()[i]) : round_to_bf16(c.data<float>()[i]);
  return out;
}

// db (N) += Σ_m dy (M, N), summed in double.
template <class T>
void add_column_sums_t(const Tensor& dy, Tensor& db) {
  const int64_t M = dy.dim(0), N = dy.dim(1);
  const Tensor gc = dy.contiguous();
  std::vector<double> gb(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) gb[n] += gc.data<T>()[m * N + n];
  accumulate<T>(db, gb);
}

// dx = dy · wᵀ, dw += xᵀ · dy, db += Σ_m dy: all computed before any is written, so a gradient
// may share storage with an input.
template <class T>
Status linear_backward_t(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                         Tensor* db) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  const Tensor xc = x.contiguous(), wc = w.contiguous(), gc = dy.contiguous();
  const T* xp = xc.data<T>();
  const T* wp = wc.data<T>();
  const T* g = gc.data<T>();
  std::vector<double> gx(static_cast<size_t>(M * K)), gw(static_cast<size_t>(K * N)),
      gb(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) {
        gx[m * K + k] += static_cast<double>(g[m * N + n]) * wp[k * N + n];
        gw[k * N + n] += static_cast<double>(xp[m * K + k]) * g[m * N + n];
      }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) gb[n] += g[m * N + n];
  if (dw) accumulate<T>(*dw, gw);
  if (db) accumulate<T>(*db, gb);
  if (dx) write<T>(*dx, gx);
  return Status::Ok();
}

template <class T>
Status activation_backward_t(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const Tensor xc = x.contiguous(), gc = dy.contiguous();
  std::vector<double> out(static_cast<size_t>(x.numel()));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<double>(gc.data<T>()[i]) * activate_derivative(act, xc.data<T>()[i]);
  write<T>(dx, out);
  return Status::Ok();
}

// Per row of C: mean, rstd = 1/sqrt(var + eps) with the biased variance, y = x̂·γ + β.
template <class T>
Status layer_norm_train_t(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                          Tensor& mean, Tensor& rstd) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const Tensor xc = x.contiguous(), gc = gamma.contiguous(), bc = beta.contiguous();
  const T* xp = xc.data<T>();
  std::vector<double> out(static_cast<size_t>(R * C)), mu(static_cast<size_t>(R)), rs(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    double m = 0.0, var = 0.0;
    for (int64_t c = 0; c < C; ++c) m += xp[r * C + c];
    m /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += (xp[r * C + c] - m) * (xp[r * C + c] - m);
    var /= static_cast<double>(C);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c)
      out[r * C + c] = (xp[r * C + c] - m) * inv * gc.data<T>()[c] + bc.data<T>()[c];
    mu[r] = m;
    rs[r] = inv;
  }
  write<T>(y, out);
  write<T>(mean, mu);
  write<T>(rstd, rs);
  return Status::Ok();
}

// With x̂ = (x - mean)·rstd and g = dy·γ, per row: dx = rstd·(g - mean(g) - x̂·mean(g·x̂));
// dγ += Σ_rows dy·x̂, dβ += Σ_rows dy.
template <class T>
Status layer_norm_backward_t(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                             const Tensor& dy, Tensor* dx, Tensor* dgamma, Tensor* dbeta) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const Tensor xc = x.contiguous(), gc = gamma.contiguous(), mc = mean.contiguous(), rc = rstd.contiguous(),
               dc = dy.contiguous();
  const T* xp = xc.data<T>();
  const T* d = dc.data<T>();
  std::vector<double> gx(static_cast<size_t>(R * C)), gg(static_cast<size_t>(C)), gb(static_cast<size_t>(C));
  std::vector<double> xhat(static_cast<size_t>(C)), g(static_cast<size_t>(C));
  for (int64_t r = 0; r < R; ++r) {
    const double m = mc.data<T>()[r], inv = rc.data<T>()[r];
    double mean_g = 0.0, mean_gx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      xhat[c] = (xp[r * C + c] - m) * inv;
      g[c] = static_cast<double>(d[r * C + c]) * gc.data<T>()[c];
      mean_g += g[c];
      mean_gx += g[c] * xhat[c];
      gg[c] += d[r * C + c] * xhat[c];
      gb[c] += d[r * C + c];
    }
    mean_g /= static_cast<double>(C);
    mean_gx /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) gx[r * C + c] = inv * (g[c] - mean_g - xhat[c] * mean_gx);
  }
  if (dgamma) accumulate<T>(*dgamma, gg);
  if (dbeta) accumulate<T>(*dbeta, gb);
  if (dx) write<T>(*dx, gx);
  return Status::Ok();
}

// dx = y ⊙ (dy - Σ_row dy ⊙ y).
template <class T>
Status softmax_backward_t(const Tensor& y, const Tensor& dy, Tensor& dx) {
  const int64_t C = y.dim(-1), R = C ? y.numel() / C : 0;
  const Tensor yc = y.contiguous(), gc = dy.contiguous();
  const T* p = yc.data<T>();
  const T* g = gc.data<T>();
  std::vector<double> out(static_cast<size_t>(R * C));
  for (int64_t r = 0; r < R; ++r) {
    double dot = 0.0;
    for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(g[r * C + c]) * p[r * C + c];
    for (int64_t c = 0; c < C; ++c) out[r * C + c] = p[r * C + c] * (g[r * C + c] - dot);
  }
  write<T>(dx, out);
  return Status::Ok();
}

template <class T>
Status embedding_backward_t(const Tensor& ids, const Tensor& dy, Tensor& dtable) {
  const int64_t V = dtable.dim(0), C = dtable.dim(1), n = ids.numel();
  const Tensor idc = ids.contiguous(), gc = dy.contiguous();
  std::vector<double> sum(static_cast<size_t>(V * C));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = idc.data<int32_t>()[i];
    if (id < 0 || id >= V) return detail::bad_id("ref::embedding_backward", i, id, V);
    for (int64_t c = 0; c < C; ++c) sum[id * C + c] += gc.data<T>()[i * C + c];
  }
  accumulate<T>(dtable, sum);
  return Status::Ok();
}

// Per counted row, with lse = log Σ_v exp(l_v): loss = lse - (1 - ε)·l_t - (ε/V)·Σ_v l_v and
// d loss / d l_v = softmax_v - q_v. A row with nothing above -inf has softmax 0 (as ops::softmax)
// and loss +inf; so has a row whose target, or under smoothing any entry, is -inf. Never NaN.
template <class T>
Status cross_entropy_t(const Tensor& logits, const Tensor& targets, float label_smoothing, double* loss_sum,
                       int64_t* counted, Tensor* dlogits, float scale) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  const double eps = label_smoothing, inf = std::numeric_limits<double>::infinity();
  const Tensor lc = logits.contiguous(), tc = targets.contiguous();
  std::vector<double> grad(dlogits ? static_cast<size_t>(N * V) : 0);
  double total = 0.0;
  int64_t rows = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = tc.data<int32_t>()[i];
    if (t == -1) continue;  // no loss; its gradient row stays 0
    ++rows;
    const T* l = lc.data<T>() + i * V;
    double mx = -inf, sum_l = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      mx = std::max(mx, static_cast<double>(l[v]));
      sum_l += l[v];
    }
    double lse = -inf;
    if (mx > -inf) {
      double s = 0.0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(l[v] - mx);
      lse = mx + std::log(s);
    }
    double loss = mx > -inf ? lse - (1.0 - eps) * l[t] : inf;
    if (eps > 0.0) loss -= eps / static_cast<double>(V) * sum_l;
    total += loss;
    if (dlogits)
      for (int64_t v = 0; v < V; ++v) {
        const double p = mx > -inf ? std::exp(l[v] - lse) : 0.0;
        const double q = eps / static_cast<double>(V) + (v == t ? 1.0 - eps : 0.0);
        grad[i * V + v] = scale * (p - q);
      }
  }
  if (loss_sum) *loss_sum = total;
  if (counted) *counted = rows;
  if (dlogits) write<T>(*dlogits, grad);
  return Status::Ok();
}

bool is_f64(const Tensor& t) { return t.dtype() == DType::f64; }

}  // namespace

Status linear_plain(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, DType compute) {
  TSR_RETURN_IF_ERROR(detail::check_linear_plain("ref::linear_plain", x, w, b, y, true, compute));
  if (compute == DType::bf16) return linear_plain_t<float>(rounded_to_bf16(x), rounded_to_bf16(w), b, y);
  return is_f64(x) ? linear_plain_t<double>(x, w, b, y) : linear_plain_t<float>(x, w, b, y);
}

Status linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                       Tensor* db, DType compute) {
  TSR_RETURN_IF_ERROR(
      detail::check_linear_backward("ref::linear_backward", x, w, dy, dx, dw, db, true, compute));
  if (compute == DType::bf16) {
    // The products from the rounded inputs; db from dy as it is (a sum, not a product).
    TSR_RETURN_IF_ERROR(
        linear_backward_t<float>(rounded_to_bf16(x), rounded_to_bf16(w), rounded_to_bf16(dy), dx, dw, nullptr));
    if (db) add_column_sums_t<float>(dy, *db);
    return Status::Ok();
  }
  return is_f64(x) ? linear_backward_t<double>(x, w, dy, dx, dw, db)
                   : linear_backward_t<float>(x, w, dy, dx, dw, db);
}

Status to_bf16(const Tensor& x, Tensor& y) {
  TSR_RETURN_IF_ERROR(detail::check_to_bf16("ref::to_bf16", x, y));
  const Tensor c = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), DType::bf16);
  for (int64_t i = 0; i < c.numel(); ++i) out.data<bf16>()[i] = f32_to_bf16(c.data<float>()[i]);
  y.copy_from(out);
  return Status::Ok();
}

Status activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  TSR_RETURN_IF_ERROR(detail::check_activation_backward("ref::activation_backward", act, x, dy, dx, true));
  return is_f64(x) ? activation_backward_t<double>(act, x, dy, dx)
                   : activation_backward_t<float>(act, x, dy, dx);
}

Status layer_norm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  TSR_RETURN_IF_ERROR(
      detail::check_layer_norm_train("ref::layer_norm_train", x, gamma, beta, eps, y, mean, rstd, true));
  return is_f64(x) ? layer_norm_train_t<double>(x, gamma, beta, eps, y, mean, rstd)
                   : layer_norm_train_t<float>(x, gamma, beta, eps, y, mean, rstd);
}

Status layer_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dy, Tensor* dx, Tensor* dgamma, Tensor* dbeta) {
  TSR_RETURN_IF_ERROR(detail::check_layer_norm_backward("ref::layer_norm_backward", x, gamma, mean, rstd, dy,
                                                        dx, dgamma, dbeta, true));
  return is_f64(x) ? layer_norm_backward_t<double>(x, gamma, mean, rstd, dy, dx, dgamma, dbeta)
                   : layer_norm_backward_t<float>(x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
}

Status softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  TSR_RETURN_IF_ERROR(detail::check_elementwise_training("ref::softmax_backward",
                                                         {{"y", &y}, {"dy", &dy}, {"dx", &dx}}, true));
  return is_f64(y) ? softmax_backward_t<double>(y, dy, dx) : softmax_backward_t<float>(y, dy, dx);
}

Status embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dtable) {
  TSR_RETURN_IF_ERROR(detail::check_embedding_backward("ref::embedding_backward", ids, dy, dtable, true));
  return is_f64(dtable) ? embedding_backward_t<double>(ids, dy, dtable)
                        : embedding_backward_t<float>(ids, dy, dtable);
}

Status cross_entropy(const Tensor& logits, const Tensor& targets, float label_smoothing, double* loss_sum,
                     int64_t* counted, Tensor* dlogits, float scale) {
  TSR_RETURN_IF_ERROR(
      detail::check_cross_entropy("ref::cross_entropy", logits, targets, label_smoothing, dlogits, true));
  return is_f64(logits)
             ? cross_entropy_t<double>(logits, targets, label_smoothing, loss_sum, counted, dlogits, scale)
             : cross_entropy_t<float>(logits, targets, label_smoothing, loss_sum, counted, dlogits, scale);
}

}  // namespace tessera::ref
