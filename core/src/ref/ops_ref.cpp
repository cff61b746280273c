// Reference loops for every op in ops.h: the definitions the fast path is tested against.
// Written for clarity, not speed: f32 (double where a sum is long) accumulation, any strides,
// element access through Tensor::at-like index arithmetic. Not used on hot paths.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops_common.h"  // core/src: shape checks shared with the fast path
#include "tessera/ops.h"

namespace tessera::ref {

double activate(Activation act, double x) {
  switch (act) {
    case Activation::none: return x;
    case Activation::relu: return x > 0.0 ? x : 0.0;
    case Activation::gelu_erf: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::gelu_tanh: {
      const double k = std::sqrt(2.0 / M_PI);
      return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
    }
  }
  return x;
}

// In double, rounded once.
float activate(Activation act, float x) { return static_cast<float>(activate(act, static_cast<double>(x))); }

Status linear(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
              const Tensor* residual, Tensor& y) {
  TSR_RETURN_IF_ERROR(detail::check_linear_shapes("ref::linear", x, w, b, residual, y));
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  const Tensor xf = x.to(DType::f32), wf = w.to(DType::f32);
  const float* xp = xf.data<float>();
  const float* wp = wf.data<float>();
  const Tensor bf = b.defined() ? b.to(DType::f32) : Tensor();
  const Tensor rf = residual ? residual->to(DType::f32) : Tensor();
  Tensor out = Tensor::empty({M, N});
  float* op = out.data<float>();
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(xp[m * K + k]) * wp[k * N + n];
      if (bf.defined()) acc += bf.data<float>()[n];
      float v = activate(act, static_cast<float>(acc));
      if (rf.defined()) v += rf.data<float>()[m * N + n];
      op[m * N + n] = v;
    }
  }
  y.copy_from(out);
  return Status::Ok();
}

Status matmul(const Tensor& a, const Tensor& b, Tensor& c, float alpha) {
  TSR_RETURN_IF_ERROR(detail::check_matmul_shapes("ref::matmul", a, b, c));
  const int r = a.rank();
  const int64_t M = a.dim(-2), K = a.dim(-1), N = b.dim(-1);
  int64_t batch = 1;
  for (int i = 0; i < r - 2; ++i) batch *= a.dim(i);
  // Flatten leading dims through contiguous copies: clear beats clever here.
  const Tensor af = a.to(DType::f32).reshape({batch, M, K});
  const Tensor bf = b.to(DType::f32).reshape({batch, K, N});
  Tensor out = Tensor::empty({batch, M, N});
  const float* ap = af.data<float>();
  const float* bp = bf.data<float>();
  float* op = out.data<float>();
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0.0;
        for (int64_t k = 0; k < K; ++k)
          acc += static_cast<double>(ap[(s * M + m) * K + k]) * bp[(s * K + k) * N + n];
        op[(s * M + m) * N + n] = static_cast<float>(alpha * acc);
      }
  c.copy_from(out.reshape(c.shape()));
  return Status::Ok();
}

namespace {
// Softmax of R dense rows of C, in double; a row with nothing above -inf gives zeros, not 0/0.
template <class T>
void softmax_rows(const T* x, T* y, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; ++r) {
    const T* row = x + r * C;
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, row[c]);
    if (mx == -std::numeric_limits<T>::infinity()) {
      for (int64_t c = 0; c < C; ++c) y[r * C + c] = 0;
      continue;
    }
    double sum = 0.0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(static_cast<double>(row[c]) - mx);
    for (int64_t c = 0; c < C; ++c)
      y[r * C + c] = static_cast<T>(std::exp(static_cast<double>(row[c]) - mx) / sum);
  }
}
}  // namespace

// f32 and bf16 inputs as f32; f64 (x and y both) for gradient checks in double precision.
Status softmax(const Tensor& x, Tensor& y) {
  const bool f64 = (x.defined() && x.dtype() == DType::f64) || (y.defined() && y.dtype() == DType::f64);
  if (f64) {
    TSR_RETURN_IF_ERROR(detail::check_elementwise_training("ref::softmax", {{"x", &x}, {"y", &y}}, true));
  } else {
    TSR_RETURN_IF_ERROR(detail::check_same_shape("ref::softmax", x, y));
    if (x.rank() < 1) return Status::Invalid("ref::softmax: needs rank >= 1, got a scalar");
  }
  const int64_t C = x.dim(-1), R = x.numel() / std::max<int64_t>(C, 1);
  Tensor out = Tensor::empty(x.shape(), f64 ? DType::f64 : DType::f32);
  if (f64)
    softmax_rows(x.contiguous().data<double>(), out.data<double>(), R, C);
  else
    softmax_rows(x.to(DType::f32).data<float>(), out.data<float>(), R, C);
  y.copy_from(out);
  return Status::Ok();
}

Status layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y) {
  TSR_RETURN_IF_ERROR(detail::check_layer_norm_shapes("ref::layer_norm", x, gamma, beta, eps, y));
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const Tensor xf = x.to(DType::f32), gf = gamma.to(DType::f32), bf = beta.to(DType::f32);
  Tensor out = Tensor::empty(x.shape());
  const float* xp = xf.data<float>();
  float* op = out.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t c = 0; c < C; ++c) mean += xp[r * C + c];
    mean /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double d = xp[r * C + c] - mean;
      var += d * d;
    }
    var /= static_cast<double>(C);  // biased variance, as LayerNorm defines it
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c)
      op[r * C + c] = static_cast<float>((xp[r * C + c] - mean) * inv * gf.data<float>()[c] +
                                         bf.data<float>()[c]);
  }
  y.copy_from(out);
  return Status::Ok();
}

Status embedding(const Tensor& table, const Tensor& ids, Tensor& y) {
  TSR_RETURN_IF_ERROR(detail::check_embedding("ref::embedding", table, ids, y));
  const int64_t V = table.dim(0), C = table.dim(1), n = ids.numel();
  const Tensor idc = ids.contiguous();
  const Tensor tf = table.to(DType::f32);
  Tensor out = Tensor::empty({n, C});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = idc.data<int32_t>()[i];
    if (id < 0 || id >= V) return detail::bad_id("ref::embedding", i, id, V);
    for (int64_t c = 0; c < C; ++c) out.data<float>()[i * C + c] = tf.data<float>()[id * C + c];
  }
  y.copy_from(out.reshape(y.shape()));
  return Status::Ok();
}

Status add(const Tensor& a, const Tensor& b, Tensor& y) {
  TSR_RETURN_IF_ERROR(detail::check_add_shapes("ref::add", a, b, y));
  const Tensor af = a.to(DType::f32), bf = b.to(DType::f32);
  const int64_t n = af.numel(), m = bf.numel();
  Tensor out = Tensor::empty(a.shape());
  for (int64_t i = 0; i < n; ++i)
    out.data<float>()[i] = af.data<float>()[i] + bf.data<float>()[i % m];
  y.copy_from(out);
  return Status::Ok();
}

Status dropout(const Tensor& x, const DropoutMask& mask, Tensor& y) {
  TSR_RETURN_IF_ERROR(detail::check_dropout("ref::dropout", x, mask, y, /*allow_f64=*/true));
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  for (int64_t e = 0; e < x.numel(); ++e) {
    const bool keep = !mask.active() || mask.keep(static_cast<uint64_t>(e));
    const float scale = mask.active() ? mask.scale() : 1.f;  // 1 / (1 - p), rounded to f32 as the fast path's
    if (x.dtype() == DType::f64) {
      out.data<double>()[e] = keep ? xc.data<double>()[e] * scale : 0.0;
    } else {
      out.data<float>()[e] = keep ? xc.data<float>()[e] * scale : 0.f;
    }
  }
  y.copy_from(out);
  return Status::Ok();
}

Status activation(Activation act, const Tensor& x, Tensor& y) {
  TSR_RETURN_IF_ERROR(detail::check_same_shape("ref::activation", x, y));
  const Tensor xf = x.to(DType::f32);
  Tensor out = Tensor::empty(x.shape());
  for (int64_t i = 0; i < xf.numel(); ++i) out.data<float>()[i] = activate(act, xf.data<float>()[i]);
  y.copy_from(out);
  return Status::Ok();
}

Status split_heads(const Tensor& x, int64_t n_heads, Tensor& y) {
  TSR_RETURN_IF_ERROR(detail::check_split_heads("ref::split_heads", x, n_heads, y));
  const int64_t B = x.dim(0), T = x.dim(1), D = x.dim(2) / n_heads;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d)
          y.select(0, b).select(0, h).select(0, t).select(0, d).copy_from(
              x.select(0, b).select(0, t).select(0, h * D + d));
  return Status::Ok();
}

Status merge_heads(const Tensor& x, Tensor& y) {
  TSR_RETURN_IF_ERROR(detail::check_merge_heads("ref::merge_heads", x, y));
  const int64_t B = x.dim(0), H = x.dim(1), T = x.dim(2), D = x.dim(3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d)
          y.select(0, b).select(0, t).select(0, h * D + d).copy_from(
              x.select(0, b).select(0, h).select(0, t).select(0, d));
  return Status::Ok();
}

// Row by row: every score, its softmax over the usable keys, the weighted sum of values.
Status attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, float scale, bool causal,
                 const int32_t* key_lo, const int32_t* key_hi) {
  TSR_RETURN_IF_ERROR(detail::check_attention("ref::attention", q, k, v, out, causal, key_lo, key_hi));
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), dk = q.dim(3), S = k.dim(2), dv = v.dim(3);
  std::vector<double> w(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        int64_t lo = 0, hi = S;
        if (key_lo) {
          lo = std::max<int64_t>(0, key_lo[b * T + i]);
          hi = std::min<int64_t>(S, key_hi[b * T + i]);
        }
        if (causal) hi = std::min(hi, i + (S - T) + 1);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = lo; j < hi; ++j) {
          double acc = 0.0;
          for (int64_t d = 0; d < dk; ++d)
            acc += static_cast<double>(q.data<float>()[b * q.stride(0) + h * q.stride(1) + i * q.stride(2) + d * q.stride(3)]) *
                   k.data<float>()[b * k.stride(0) + h * k.stride(1) + j * k.stride(2) + d * k.stride(3)];
          w[static_cast<size_t>(j)] = scale * acc;
          mx = std::max(mx, w[static_cast<size_t>(j)]);
        }
        double sum = 0.0;
        for (int64_t j = lo; j < hi; ++j) sum += (w[static_cast<size_t>(j)] = std::exp(w[static_cast<size_t>(j)] - mx));
        float* o = out.data<float>() + b * out.stride(0) + h * out.stride(1) + i * out.stride(2);
        for (int64_t d = 0; d < dv; ++d) {
          double acc = 0.0;
          for (int64_t j = lo; j < hi; ++j)
            acc += w[static_cast<size_t>(j)] *
                   v.data<float>()[b * v.stride(0) + h * v.stride(1) + j * v.stride(2) + d * v.stride(3)];
          o[d * out.stride(3)] = hi > lo ? static_cast<float>(acc / sum) : 0.f;
        }
      }
  return Status::Ok();
}

}  // namespace tessera::ref
