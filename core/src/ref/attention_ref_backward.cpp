// Reference loops for training attention: ref::attention_train and ref::attention_backward.
// Materialised, the way the maths reads: for each (batch row, head) the (T, S) scores, the mask,
// the softmax P, then the softmax backward on P. Everything is computed in double whatever the
// tensors' dtype (f32, or f64 for gradient checks against finite differences); results are
// rounded once, when stored. The backward recomputes P from q and k and uses out and lse only
// through the shape checks: it is the fast path's independent check, which reads them.
// Attention dropout multiplies P by its mask M (0 or 1 / (1 - p)) before P · V; the backward
// regenerates M from the same counters.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops_common.h"  // core/src: shape checks shared with the fast path
#include "tessera/ops.h"

namespace tessera::ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Element (b, h, i, d) of a (B, H, rows, D) view, or (b, h, i) of a (B, H, rows) one, f32 or f64.
int64_t offset(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t d) {
  return b * t.stride(0) + h * t.stride(1) + i * t.stride(2) + (t.rank() == 4 ? d * t.stride(3) : 0);
}
double get(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t d = 0) {
  const int64_t at = offset(t, b, h, i, d);
  return t.dtype() == DType::f64 ? t.data<double>()[at] : t.data<float>()[at];
}
void put(Tensor& t, int64_t b, int64_t h, int64_t i, int64_t d, double x) {
  const int64_t at = offset(t, b, h, i, d);
  if (t.dtype() == DType::f64) {
    t.data<double>()[at] = x;
  } else {
    t.data<float>()[at] = static_cast<float>(x);
  }
}

struct Mask {
  bool causal;
  const int32_t* lo;
  const int32_t* hi;
  int64_t T, S;
  // Query row i of batch row b may use key j.
  bool allows(int64_t b, int64_t i, int64_t j) const {
    if (lo && (j < lo[b * T + i] || j >= hi[b * T + i])) return false;
    return !causal || j <= i + (S - T);
  }
};

// The attention weights of one (batch row, head): P (T, S) f64, a softmax over each row's usable
// keys (0 elsewhere; a row with no key is all 0), and lse (T), the log-sum-exp of each row's
// usable scaled scores (-inf for a row with no key).
void weights(const Tensor& q, const Tensor& k, int64_t b, int64_t h, double scale, const Mask& mask,
             Tensor& P, Tensor& lse) {
  const int64_t T = q.dim(2), S = k.dim(2), D = q.dim(3);
  double* p = P.data<double>();
  double* l = lse.data<double>();
  for (int64_t i = 0; i < T; ++i) {
    double* row = p + i * S;
    double mx = kNegInf;
    for (int64_t j = 0; j < S; ++j) {  // scores, masked with -inf
      double s = kNegInf;
      if (mask.allows(b, i, j)) {
        s = 0.0;
        for (int64_t d = 0; d < D; ++d) s += get(q, b, h, i, d) * get(k, b, h, j, d);
        s *= scale;
      }
      row[j] = s;
      mx = std::max(mx, s);
    }
    if (mx == kNegInf) {  // no usable key
      for (int64_t j = 0; j < S; ++j) row[j] = 0.0;
      l[i] = kNegInf;
      continue;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < S; ++j) sum += (row[j] = std::exp(row[j] - mx));  // exp(-inf) = 0
    for (int64_t j = 0; j < S; ++j) row[j] /= sum;
    l[i] = mx + std::log(sum);
  }
}

}  // namespace

// The dropout factor of weight (b, h, i, j); 1 without dropout.
double drop_factor(const DropoutMask* drop, int64_t b, int64_t h, int64_t i, int64_t j, int64_t H, int64_t T,
                   int64_t S) {
  if (!drop || !drop->active()) return 1.0;
  return drop->factor(static_cast<uint64_t>(((b * H + h) * T + i) * S + j));
}

Status attention_train(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       float scale, bool causal, const int32_t* key_lo, const int32_t* key_hi,
                       const DropoutMask* drop) {
  TSR_RETURN_IF_ERROR(detail::check_attention_train("ref::attention_train", q, k, v, out, lse, causal, key_lo,
                                                    key_hi, /*allow_f64=*/true));
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), S = k.dim(2), Dv = v.dim(3);
  const Mask mask{causal, key_lo, key_hi, T, S};
  Tensor P = Tensor::empty({T, S}, DType::f64), l = Tensor::empty({T}, DType::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      weights(q, k, b, h, scale, mask, P, l);
      const double* p = P.data<double>();
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t d = 0; d < Dv; ++d) {  // out = P · V
          double acc = 0.0;
          for (int64_t j = 0; j < S; ++j)
            acc += p[i * S + j] * drop_factor(drop, b, h, i, j, H, T, S) * get(v, b, h, j, d);
          put(out, b, h, i, d, acc);
        }
        put(lse, b, h, i, 0, l.data<double>()[i]);
      }
    }
  return Status::Ok();
}

// With P the weights, M the dropout mask (all 1 without) and dO = dout: dV = (P ⊙ M)ᵀ dO;
// dP = (dO Vᵀ) ⊙ M; the softmax backward dS = P ⊙ (dP - rowsum(P ⊙ dP)); and, from
// S = scale · Q Kᵀ, dQ = scale · dS K, dK = scale · dSᵀ Q.
Status attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                          float scale, bool causal, const int32_t* key_lo, const int32_t* key_hi,
                          const DropoutMask* drop) {
  TSR_RETURN_IF_ERROR(detail::check_attention_backward("ref::attention_backward", q, k, v, out, lse, dout, dq,
                                                       dk, dv, causal, key_lo, key_hi, /*allow_f64=*/true));
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), S = k.dim(2), Dk = q.dim(3), Dv = v.dim(3);
  const Mask mask{causal, key_lo, key_hi, T, S};
  Tensor P = Tensor::empty({T, S}, DType::f64), l = Tensor::empty({T}, DType::f64);
  Tensor dS = Tensor::empty({T, S}, DType::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      weights(q, k, b, h, scale, mask, P, l);
      const double* p = P.data<double>();
      double* ds = dS.data<double>();
      for (int64_t i = 0; i < T; ++i) {
        double rowsum = 0.0;
        for (int64_t j = 0; j < S; ++j) {  // dP, kept in dS until the row's sum is known
          double dp = 0.0;
          if (p[i * S + j] != 0.0)  // where P is 0 (masked), dS is 0 whatever dP is
            for (int64_t d = 0; d < Dv; ++d) dp += get(dout, b, h, i, d) * get(v, b, h, j, d);
          dp *= drop_factor(drop, b, h, i, j, H, T, S);
          ds[i * S + j] = dp;
          rowsum += p[i * S + j] * dp;
        }
        for (int64_t j = 0; j < S; ++j) ds[i * S + j] = p[i * S + j] * (ds[i * S + j] - rowsum);
      }
      for (int64_t j = 0; j < S; ++j) {
        for (int64_t d = 0; d < Dv; ++d) {
          double acc = 0.0;
          for (int64_t i = 0; i < T; ++i)
            acc += p[i * S + j] * drop_factor(drop, b, h, i, j, H, T, S) * get(dout, b, h, i, d);
          put(dv, b, h, j, d, acc);
        }
        for (int64_t d = 0; d < Dk; ++d) {
          double acc = 0.0;
          for (int64_t i = 0; i < T; ++i) acc += ds[i * S + j] * get(q, b, h, i, d);
          put(dk, b, h, j, d, scale * acc);
        }
      }
      for (int64_t i = 0; i < T; ++i)
        for (int64_t d = 0; d < Dk; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < S; ++j) acc += ds[i * S + j] * get(k, b, h, j, d);
          put(dq, b, h, i, d, scale * acc);
        }
    }
  return Status::Ok();
}

}  // namespace tessera::ref
