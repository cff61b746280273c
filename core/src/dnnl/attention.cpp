// ops::attention: fused scaled dot-product attention. Queries are taken a block of rows at a time;
// keys and values stream past in blocks; an online softmax (Milakov & Gimelshein 2018, as in
// Dao et al.'s FlashAttention) keeps, per query row, the running maximum m, the running sum l of
// exp(s - m) and the unnormalised output O, rescaling both by exp(m_old - m_new) whenever a block
// raises the maximum. So the (T, S) score matrix is never stored: beyond its inputs and output the
// op uses one score tile, one output tile and two vectors per thread, whatever T and S are.
//
// The two products of a tile, S = scale · Q Kᵀ and O += P V, are oneDNN's sgemm on the caller's
// strided views (no copy of Q, K or V), run single-threaded inside our OpenMP loop over
// (batch, head, query block). The exponentials use glibc's vector expf (libmvec) on AVX2 and
// std::exp elsewhere. Not here: the reference loop (ref/ops_ref.cpp), masks made from a batch's
// layout (model/attention.cpp), and attention weights for export (recomputed by the model).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dnnl/onednn.h"
#include "ops_common.h"

// glibc's libmvec: eight expf at once, under 4 ulp, the vector variant GCC itself would call.
extern "C" __attribute__((target("avx2"))) __m256 _ZGVdN8v_expf(__m256 x);

namespace tessera::ops {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tile sizes: a (kRows × kCols) score tile, kRows × dv outputs and a kCols-row block of K and V
// stay in L2 (512 KiB a core here) for d up to 128.
constexpr int64_t kRows = 64;
constexpr int64_t kCols = 256;

bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

// One score row through the online softmax: s (n values, -inf where masked) becomes
// p = exp(s - m_new) in place; returns the row's sum of p and sets *m to m_new and *alpha to
// exp(m_old - m_new), the factor the row's earlier sum and output must be scaled by. A row with
// nothing but -inf leaves m as it was, gives p = 0, sum 0, alpha 1.
float row_update_scalar(float* s, int64_t n, float* m, float* alpha) {
  float mx = kNegInf;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
  if (mx == kNegInf) {
    std::fill(s, s + n, 0.f);
    *alpha = 1.f;
    return 0.f;
  }
  const float m_new = std::max(*m, mx);
  *alpha = *m == kNegInf ? 0.f : std::exp(*m - m_new);
  *m = m_new;
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m_new));
  return sum;
}

__attribute__((target("avx2,fma"))) float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

__attribute__((target("avx2,fma"))) float hmax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

__attribute__((target("avx2,fma"))) float row_update_avx2(float* s, int64_t n, float* m, float* alpha) {
  const int64_t n8 = n & ~int64_t{7};
  __m256 vmax = _mm256_set1_ps(kNegInf);
  for (int64_t j = 0; j < n8; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
  float mx = hmax(vmax);
  for (int64_t j = n8; j < n; ++j) mx = std::max(mx, s[j]);
  if (mx == kNegInf) {
    std::fill(s, s + n, 0.f);
    *alpha = 1.f;
    return 0.f;
  }
  const float m_new = std::max(*m, mx);
  *alpha = *m == kNegInf ? 0.f : std::exp(*m - m_new);
  *m = m_new;
  const __m256 vm = _mm256_set1_ps(m_new);
  __m256 vsum = _mm256_setzero_ps();
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256 p = _ZGVdN8v_expf(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(s + j, p);
    vsum = _mm256_add_ps(vsum, p);
  }
  float sum = hsum(vsum);
  for (int64_t j = n8; j < n; ++j) sum += (s[j] = std::exp(s[j] - m_new));
  return sum;
}

// Per-thread tiles, grown once and kept: no allocation per call once warm.
struct Tiles {
  std::vector<float> s, o, m, l, alpha;
  void reserve(int64_t rows, int64_t cols, int64_t dv) {
    auto grow = [](std::vector<float>& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    };
    grow(s, rows * cols);
    grow(o, rows * dv);
    grow(m, rows);
    grow(l, rows);
    grow(alpha, rows);
  }
};
thread_local Tiles tls_tiles;

// Which keys each query row may use, [lo, hi), after the causal limit.
struct KeyRange {
  const int32_t* lo;
  const int32_t* hi;
  bool causal;
  int64_t T, S;
  void of(int64_t b, int64_t i, int64_t* a, int64_t* e) const {
    int64_t x = 0, y = S;
    if (lo) {
      x = std::max<int64_t>(0, lo[b * T + i]);
      y = std::min<int64_t>(S, hi[b * T + i]);
    }
    if (causal) y = std::min(y, i + (S - T) + 1);
    *a = x;
    *e = std::max(x, y);
  }
};

// One (batch, head, query block): rows [i0, i1) of q against every usable key block.
void attend_block(const float* Q, int64_t ldq, const float* K, int64_t ldk, const float* V, int64_t ldv,
                  float* out, int64_t ldo, int64_t dk, int64_t dv, int64_t S, float scale, const KeyRange& kr,
                  int64_t b, int64_t i0, int64_t i1, bool avx2) {
  const int64_t R = i1 - i0;
  Tiles& t = tls_tiles;
  t.reserve(kRows, kCols, dv);
  float* s = t.s.data();
  float* o = t.o.data();
  std::fill(o, o + R * dv, 0.f);
  std::fill(t.m.begin(), t.m.begin() + R, kNegInf);
  std::fill(t.l.begin(), t.l.begin() + R, 0.f);

  // The block's rows' key ranges, and the span of keys any of them uses.
  int64_t lo[kRows], hi[kRows];
  int64_t span_lo = S, span_hi = 0;
  for (int64_t r = 0; r < R; ++r) {
    kr.of(b, i0 + r, &lo[r], &hi[r]);
    if (lo[r] < hi[r]) {
      span_lo = std::min(span_lo, lo[r]);
      span_hi = std::max(span_hi, hi[r]);
    }
  }
  for (int64_t j0 = span_lo; j0 < span_hi; j0 += kCols) {
    const int64_t j1 = std::min(span_hi, j0 + kCols), C = j1 - j0;
    // S = scale · Q Kᵀ for this tile (row-major sgemm; K's rows are the columns of Kᵀ).
    dnnl_sgemm('N', 'T', R, C, dk, scale, Q + i0 * ldq, ldq, K + j0 * ldk, ldk, 0.f, s, C);
    for (int64_t r = 0; r < R; ++r) {
      float* sr = s + r * C;
      // Mask what lies outside the row's range (-inf: exp gives an exact 0).
      const int64_t a = std::clamp(lo[r] - j0, int64_t{0}, C), e = std::clamp(hi[r] - j0, int64_t{0}, C);
      if (a >= e) {
        std::fill(sr, sr + C, kNegInf);
      } else {
        std::fill(sr, sr + a, kNegInf);
        std::fill(sr + e, sr + C, kNegInf);
      }
      float alpha = 1.f;
      const float sum = avx2 ? row_update_avx2(sr, C, &t.m[r], &alpha) : row_update_scalar(sr, C, &t.m[r], &alpha);
      t.l[r] = t.l[r] * alpha + sum;
      if (alpha != 1.f) {
        float* orow = o + r * dv;
        for (int64_t d = 0; d < dv; ++d) orow[d] *= alpha;
      }
    }
    // O += P V for this tile.
    dnnl_sgemm('N', 'N', R, dv, C, 1.f, s, C, V + j0 * ldv, ldv, 1.f, o, dv);
  }
  for (int64_t r = 0; r < R; ++r) {
    float* dst = out + (i0 + r) * ldo;
    const float l = t.l[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;  // no usable key: zeros
    const float* orow = o + r * dv;
    for (int64_t d = 0; d < dv; ++d) dst[d] = orow[d] * inv;
  }
}

}  // namespace

Status attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, float scale, bool causal,
                 const int32_t* key_lo, const int32_t* key_hi) {
  static constexpr const char* op = "ops::attention";
  TSR_RETURN_IF_ERROR(detail::check_attention(op, q, k, v, out, causal, key_lo, key_hi));
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), dk = q.dim(3), S = k.dim(2), dv = v.dim(3);
  if (out.numel() == 0) return Status::Ok();
  if (S == 0 || dk == 0) {  // no keys, or scores of empty dot products: see the reference
    return ref::attention(q, k, v, out, scale, causal, key_lo, key_hi);
  }
  const int threads = onednn::apply_threads();
  const bool avx2 = cpu_has_avx2();
  const KeyRange kr{key_lo, key_hi, causal, T, S};
  // Row strides for sgemm; a single row's stride is arbitrary, so any value ≥ its length will do.
  auto ld = [](const Tensor& t) { return t.dim(2) > 1 ? t.stride(2) : t.dim(3); };
  const int64_t ldq = ld(q), ldk = ld(k), ldv = ld(v), ldo = ld(out);
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  float* op_ = out.data<float>();
  const int64_t blocks = (T + kRows - 1) / kRows;
  const int64_t work = B * H * blocks;
  // Enough multiply-adds to be worth a thread team.
  const bool parallel = threads > 1 && work > 1 && B * H * T * S * (dk + dv) > (int64_t{1} << 18);
  auto shapes = [&] { return onednn::describe({&q, &k, &v, &out}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
#pragma omp parallel if (parallel)
    {
      // Each tile's sgemm runs on the thread that owns the tile: oneDNN asks OpenMP how many
      // threads it may use, and inside our team it must hear 1.
      omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t blk = w % blocks, h = (w / blocks) % H, b = w / (blocks * H);
      const int64_t i0 = blk * kRows, i1 = std::min(T, i0 + kRows);
      attend_block(qp + b * q.stride(0) + h * q.stride(1), ldq, kp + b * k.stride(0) + h * k.stride(1), ldk,
                   vp + b * v.stride(0) + h * v.stride(1), ldv, op_ + b * out.stride(0) + h * out.stride(1), ldo,
                   dk, dv, S, scale, kr, b, i0, i1, avx2);
    }
    }
    return Status::Ok();
  });
}

}  // namespace tessera::ops
