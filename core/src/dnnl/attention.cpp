// ops::attention and ops::attention_train: fused scaled dot-product attention. Queries are taken
// a block of rows at a time; keys and values stream past in blocks; an online softmax (Milakov &
// Gimelshein 2018, as in Dao et al.'s FlashAttention) keeps, per query row, the running maximum m,
// the running sum l of exp(s - m) and the unnormalised output O, rescaling both by
// exp(m_old - m_new) whenever a block raises the maximum. So the (T, S) score matrix is never
// stored: beyond its inputs and output the op uses one score tile, one output tile and two vectors
// per thread, whatever T and S are. attention_train is the same kernel writing lse = m + log l too.
//
// ops::attention_backward (FlashAttention-2's backward, Dao 2023): the weights of a tile are
// recomputed from q, k and the kept lse, P = exp(scale · Q Kᵀ - lse), never stored beyond the tile;
// with D = rowsum(dO ⊙ O), each (query block, key block) tile gives dV += Pᵀ dO, dP = dO Vᵀ,
// dS = P ⊙ (dP - D), dK += scale · dSᵀ Q and dQ += scale · dS K. See attention_backward for how the
// work is split between threads without two of them adding into one gradient row.
//
// The products of a tile are oneDNN's sgemm on the caller's strided views (no copy of Q, K, V or
// their gradients), run single-threaded inside our OpenMP loops. The exponentials use glibc's
// vector expf (libmvec) on AVX2 and std::exp elsewhere.
//
// Attention dropout (training): the forward multiplies each tile's weights by the mask after the
// online softmax has summed them (the normalisation is the undropped softmax's), so
// O = (P ⊙ M) V; the backward regenerates M for each recomputed tile from the same counters
// (DropoutMask: a hash of the weight's index ((b·H + h)·T + i)·S + j, no stored mask, memory still
// O(T)): dV += (P ⊙ M)ᵀ dO, dP = (dO Vᵀ) ⊙ M, dS = P ⊙ (dP - D), where D = rowsum(dO ⊙ O) still
// equals rowsum(P ⊙ dP) because O is the dropped output. Not here: the reference loops
// (ref/ops_ref.cpp, ref/attention_ref_backward.cpp), masks made from a batch's layout
// (model/attention.cpp), and attention weights for export (recomputed by the model).
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

// The vector expf's argument floor. libmvec computes lanes below about -87.3 (and -inf) with
// scalar expf, several times slower, so arguments are raised to this first: exp(-87) = 1.6e-38
// where the exact weight is smaller still, next to a row sum of at least 1. Masked scores never
// reach it: their weights are written as exact zeros.
constexpr float kExpFloor = -87.f;

// One score row through the online softmax: of s (n values) the row's keys are columns [a, e);
// those become p = exp(s - m_new) in place and the rest exact zeros; returns the row's sum of p
// and sets *m to m_new and *alpha to exp(m_old - m_new), the factor the row's earlier sum and
// output must be scaled by. A row with no key here (a >= e, or only -inf scores) leaves m as it
// was, gives p = 0, sum 0, alpha 1.
float row_update_scalar(float* s, int64_t n, int64_t a, int64_t e, float* m, float* alpha) {
  float mx = kNegInf;
  for (int64_t j = a; j < e; ++j) mx = std::max(mx, s[j]);
  if (mx == kNegInf) {
    std::fill(s, s + n, 0.f);
    *alpha = 1.f;
    return 0.f;
  }
  const float m_new = std::max(*m, mx);
  *alpha = *m == kNegInf ? 0.f : std::exp(*m - m_new);
  *m = m_new;
  std::fill(s, s + a, 0.f);
  std::fill(s + e, s + n, 0.f);
  float sum = 0.f;
  for (int64_t j = a; j < e; ++j) sum += (s[j] = std::exp(s[j] - m_new));
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

__attribute__((target("avx2,fma"))) float row_update_avx2(float* s, int64_t n, int64_t a, int64_t e, float* m,
                                                         float* alpha) {
  __m256 vmax = _mm256_set1_ps(kNegInf);
  int64_t j = a;
  for (; j + 8 <= e; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
  float mx = hmax(vmax);
  for (; j < e; ++j) mx = std::max(mx, s[j]);
  if (mx == kNegInf) {
    std::fill(s, s + n, 0.f);
    *alpha = 1.f;
    return 0.f;
  }
  const float m_new = std::max(*m, mx);
  *alpha = *m == kNegInf ? 0.f : std::exp(*m - m_new);
  *m = m_new;
  std::fill(s, s + a, 0.f);
  std::fill(s + e, s + n, 0.f);
  const __m256 vm = _mm256_set1_ps(m_new), floor = _mm256_set1_ps(kExpFloor);
  __m256 vsum = _mm256_setzero_ps();
  for (j = a; j + 8 <= e; j += 8) {
    const __m256 p = _ZGVdN8v_expf(_mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm), floor));
    _mm256_storeu_ps(s + j, p);
    vsum = _mm256_add_ps(vsum, p);
  }
  float sum = hsum(vsum);
  for (; j < e; ++j) sum += (s[j] = std::exp(s[j] - m_new));
  return sum;
}

// One row of a backward tile: the weights p = exp(s - lse) over the row's keys [a, e), 0 elsewhere
// (lse = -inf: the row has no key, all 0).
void probs_row_scalar(float* s, int64_t n, int64_t a, int64_t e, float lse) {
  if (lse == kNegInf) a = e = n;
  std::fill(s, s + a, 0.f);
  for (int64_t j = a; j < e; ++j) s[j] = std::exp(s[j] - lse);
  std::fill(s + e, s + n, 0.f);
}

__attribute__((target("avx2,fma"))) void probs_row_avx2(float* s, int64_t n, int64_t a, int64_t e,
                                                        float lse) {
  if (lse == kNegInf) a = e = n;
  std::fill(s, s + a, 0.f);
  const __m256 vl = _mm256_set1_ps(lse), floor = _mm256_set1_ps(kExpFloor);
  int64_t j = a;
  for (; j + 8 <= e; j += 8)
    _mm256_storeu_ps(s + j, _ZGVdN8v_expf(_mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vl), floor)));
  for (; j < e; ++j) s[j] = std::exp(s[j] - lse);
  std::fill(s + e, s + n, 0.f);
}

// The softmax backward on one tile row: dp becomes dS = p ⊙ (dp - D).
void dscores_row_scalar(const float* p, float* dp, int64_t n, float D) {
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - D);
}

__attribute__((target("avx2,fma"))) void dscores_row_avx2(const float* p, float* dp, int64_t n, float D) {
  const __m256 vd = _mm256_set1_ps(D);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(dp + j,
                     _mm256_mul_ps(_mm256_loadu_ps(p + j), _mm256_sub_ps(_mm256_loadu_ps(dp + j), vd)));
  for (; j < n; ++j) dp[j] = p[j] * (dp[j] - D);
}

// Per-thread tiles, grown once and kept: no allocation per call once warm. s holds scores (the
// weights P once exponentiated); o the forward's output rows; dp the backward's dP, then dS.
struct Tiles {
  std::vector<float> s, o, dp, m, l, alpha;
  void reserve(int64_t rows, int64_t cols, int64_t dv, bool backward) {
    auto grow = [](std::vector<float>& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    };
    grow(s, rows * cols);
    if (backward) {
      grow(dp, rows * cols);
      return;
    }
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

// The key ranges of query rows [i0, i0 + R) of batch row b, and the span [*span_lo, *span_hi)
// of keys any of them uses (empty, span_lo >= span_hi, when none uses any).
void block_ranges(const KeyRange& kr, int64_t b, int64_t i0, int64_t R, int64_t* lo, int64_t* hi,
                  int64_t* span_lo, int64_t* span_hi) {
  *span_lo = kr.S;
  *span_hi = 0;
  for (int64_t r = 0; r < R; ++r) {
    kr.of(b, i0 + r, &lo[r], &hi[r]);
    if (lo[r] < hi[r]) {
      *span_lo = std::min(*span_lo, lo[r]);
      *span_hi = std::max(*span_hi, hi[r]);
    }
  }
}

// A row's range [lo, hi) as columns [a, e) of a tile whose first column is key j0 and that has C.
void tile_cols(int64_t lo, int64_t hi, int64_t j0, int64_t C, int64_t* a, int64_t* e) {
  *a = std::clamp(lo - j0, int64_t{0}, C);
  *e = std::clamp(hi - j0, int64_t{0}, C);
}

// Attention dropout of one (batch, head): the mask and the index of its weight (0, 0).
struct HeadDropout {
  const DropoutMask* mask = nullptr;  // null: none
  uint64_t base = 0;                  // ((b·H + h)·T)·S
  int64_t S = 0;
  // Rows [i0, i0 + R) × keys [j0, j0 + C) of a tile (ld C) multiplied by their mask factors.
  void apply(float* p, int64_t i0, int64_t R, int64_t j0, int64_t C) const {
    const uint32_t threshold = mask->threshold();
    const float scale = mask->scale();
    for (int64_t r = 0; r < R; ++r) {
      const uint64_t row = base + static_cast<uint64_t>((i0 + r) * S + j0);
      float* pr = p + r * C;
      for (int64_t j = 0; j < C; ++j) pr[j] = mask->keep(row + static_cast<uint64_t>(j), threshold) ? pr[j] * scale : 0.f;
    }
  }
};

// One (batch, head, query block): rows [i0, i1) of q against every usable key block. With lse,
// also the log-sum-exp of each row's scores (lse_stride apart); with drop.mask, attention dropout.
void attend_block(const float* Q, int64_t ldq, const float* K, int64_t ldk, const float* V, int64_t ldv,
                  float* out, int64_t ldo, float* lse, int64_t lse_stride, int64_t dk, int64_t dv,
                  float scale, const KeyRange& kr, int64_t b, int64_t i0, int64_t i1, bool avx2,
                  const HeadDropout& drop) {
  const int64_t R = i1 - i0;
  Tiles& t = tls_tiles;
  t.reserve(kRows, kCols, dv, false);
  float* s = t.s.data();
  float* o = t.o.data();
  std::fill(o, o + R * dv, 0.f);
  std::fill(t.m.begin(), t.m.begin() + R, kNegInf);
  std::fill(t.l.begin(), t.l.begin() + R, 0.f);

  int64_t lo[kRows], hi[kRows], span_lo, span_hi;
  block_ranges(kr, b, i0, R, lo, hi, &span_lo, &span_hi);
  for (int64_t j0 = span_lo; j0 < span_hi; j0 += kCols) {
    const int64_t j1 = std::min(span_hi, j0 + kCols), C = j1 - j0;
    // S = scale · Q Kᵀ for this tile (row-major sgemm; K's rows are the columns of Kᵀ).
    dnnl_sgemm('N', 'T', R, C, dk, scale, Q + i0 * ldq, ldq, K + j0 * ldk, ldk, 0.f, s, C);
    for (int64_t r = 0; r < R; ++r) {
      float* sr = s + r * C;
      // The row's keys in this tile: the rest of the row gets exact zero weights.
      int64_t a, e;
      tile_cols(lo[r], hi[r], j0, C, &a, &e);
      float alpha = 1.f;
      const float sum = avx2 ? row_update_avx2(sr, C, a, e, &t.m[r], &alpha)
                             : row_update_scalar(sr, C, a, e, &t.m[r], &alpha);
      t.l[r] = t.l[r] * alpha + sum;
      if (alpha != 1.f) {
        float* orow = o + r * dv;
        for (int64_t d = 0; d < dv; ++d) orow[d] *= alpha;
      }
    }
    if (drop.mask) drop.apply(s, i0, R, j0, C);  // P ⊙ M; l above summed the undropped P
    // O += P V for this tile.
    dnnl_sgemm('N', 'N', R, dv, C, 1.f, s, C, V + j0 * ldv, ldv, 1.f, o, dv);
  }
  for (int64_t r = 0; r < R; ++r) {
    float* dst = out + (i0 + r) * ldo;
    const float l = t.l[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;  // no usable key: zeros
    const float* orow = o + r * dv;
    for (int64_t d = 0; d < dv; ++d) dst[d] = orow[d] * inv;
    if (lse) lse[(i0 + r) * lse_stride] = l > 0.f ? t.m[r] + std::log(l) : kNegInf;
  }
}

// Rows of one (batch, head) slice of an operand, ld apart.
template <class F>
struct Rows {
  F* p;
  int64_t ld;
  F* row(int64_t i) const { return p + i * ld; }
};

// One (batch, head) of the backward: its slices of every operand, and lse and D of its query rows.
// dq, dk, dv are where the tiles add their products (beta = 1); p null: not accumulated here.
struct BackwardHead {
  Rows<const float> q, k, v, dout;
  Rows<float> dq, dk, dv;
  const float* lse;
  int64_t lse_stride;
  const float* delta;
  int64_t Dk, Dv;
  HeadDropout drop;
};

// One tile of the backward: query rows [i0, i0 + R) (their key ranges lo, hi) against keys
// [j0, j0 + C): recomputes P, then adds this tile's share to dV, dK and dQ (those not null).
void backward_tile(const BackwardHead& g, float scale, int64_t i0, int64_t R, const int64_t* lo,
                   const int64_t* hi, int64_t j0, int64_t C, bool avx2) {
  Tiles& t = tls_tiles;
  t.reserve(kRows, kCols, 0, true);
  float* p = t.s.data();
  float* ds = t.dp.data();
  const float* q = g.q.row(i0);
  const float* k = g.k.row(j0);
  const float* dO = g.dout.row(i0);
  // P = exp(scale · Q Kᵀ - lse), 0 where masked.
  dnnl_sgemm('N', 'T', R, C, g.Dk, scale, q, g.q.ld, k, g.k.ld, 0.f, p, C);
  for (int64_t r = 0; r < R; ++r) {
    int64_t a, e;
    tile_cols(lo[r], hi[r], j0, C, &a, &e);
    const float l = g.lse[(i0 + r) * g.lse_stride];
    (avx2 ? probs_row_avx2 : probs_row_scalar)(p + r * C, C, a, e, l);
  }
  if (g.drop.mask) {
    // dP = (dO Vᵀ) ⊙ M, dS = P ⊙ (dP - D); then P ⊙ M for dV += (P ⊙ M)ᵀ dO.
    dnnl_sgemm('N', 'T', R, C, g.Dv, 1.f, dO, g.dout.ld, g.v.row(j0), g.v.ld, 0.f, ds, C);
    g.drop.apply(ds, i0, R, j0, C);
    for (int64_t r = 0; r < R; ++r)
      (avx2 ? dscores_row_avx2 : dscores_row_scalar)(p + r * C, ds + r * C, C, g.delta[i0 + r]);
    g.drop.apply(p, i0, R, j0, C);
    if (g.dv.p) dnnl_sgemm('T', 'N', C, g.Dv, R, 1.f, p, C, dO, g.dout.ld, 1.f, g.dv.row(j0), g.dv.ld);
  } else {
    // dV += Pᵀ dO.
    if (g.dv.p) dnnl_sgemm('T', 'N', C, g.Dv, R, 1.f, p, C, dO, g.dout.ld, 1.f, g.dv.row(j0), g.dv.ld);
    // dP = dO Vᵀ, then dS = P ⊙ (dP - D).
    dnnl_sgemm('N', 'T', R, C, g.Dv, 1.f, dO, g.dout.ld, g.v.row(j0), g.v.ld, 0.f, ds, C);
    for (int64_t r = 0; r < R; ++r)
      (avx2 ? dscores_row_avx2 : dscores_row_scalar)(p + r * C, ds + r * C, C, g.delta[i0 + r]);
  }
  // dK += scale · dSᵀ Q; dQ += scale · dS K.
  if (g.dk.p) dnnl_sgemm('T', 'N', C, g.Dk, R, scale, ds, C, q, g.q.ld, 1.f, g.dk.row(j0), g.dk.ld);
  if (g.dq.p) dnnl_sgemm('N', 'N', R, g.Dk, C, scale, ds, C, k, g.k.ld, 1.f, g.dq.row(i0), g.dq.ld);
}

// Rows [r0, r1) of a gradient (n values each) set to 0 before tiles add into them.
void zero_rows(const Rows<float>& x, int64_t r0, int64_t r1, int64_t n) {
  for (int64_t r = r0; r < r1; ++r) std::fill(x.row(r), x.row(r) + n, 0.f);
}

// Keys [j0, j1) of one head: dK and dV of those rows (written), from every query block that uses
// any of them, and, where g.dq is set, those tiles' shares of dQ as well.
void backward_key_block(const BackwardHead& g, float scale, const KeyRange& kr, int64_t b, int64_t j0,
                        int64_t j1, bool avx2) {
  zero_rows(g.dk, j0, j1, g.Dk);
  zero_rows(g.dv, j0, j1, g.Dv);
  int64_t lo[kRows], hi[kRows], span_lo, span_hi;
  for (int64_t i0 = 0; i0 < kr.T; i0 += kRows) {
    const int64_t R = std::min(kRows, kr.T - i0);
    block_ranges(kr, b, i0, R, lo, hi, &span_lo, &span_hi);
    const int64_t c0 = std::max(j0, span_lo), c1 = std::min(j1, span_hi);  // keys of this tile
    if (c0 < c1) backward_tile(g, scale, i0, R, lo, hi, c0, c1 - c0, avx2);
  }
}

// Query rows [i0, i1) of one head: their dQ (written), from every key block they use.
void backward_query_block(const BackwardHead& g, float scale, const KeyRange& kr, int64_t b, int64_t i0,
                          int64_t i1, bool avx2) {
  zero_rows(g.dq, i0, i1, g.Dk);
  int64_t lo[kRows], hi[kRows], span_lo, span_hi;
  block_ranges(kr, b, i0, i1 - i0, lo, hi, &span_lo, &span_hi);
  // Key tiles on backward_key_block's grid of kCols, so that both schedules of attention_backward
  // add the same tiles in the same order.
  for (int64_t j0 = span_lo / kCols * kCols; j0 < span_hi; j0 += kCols) {
    const int64_t c0 = std::max(j0, span_lo), c1 = std::min(j0 + kCols, span_hi);
    backward_tile(g, scale, i0, i1 - i0, lo, hi, c0, c1 - c0, avx2);
  }
}

Status check_attention_dropout(const char* op, const DropoutMask* drop) {
  if (drop && !(drop->p >= 0.f && drop->p < 1.f))
    return Status::Invalid(std::string(op) + ": the attention dropout probability must be in [0, 1), got " +
                           std::to_string(drop->p));
  return Status::Ok();
}

// Row stride for sgemm; a single row's stride is arbitrary, so any value ≥ its length will do.
int64_t ld(const Tensor& t) { return t.dim(2) > 1 ? t.stride(2) : std::max<int64_t>(t.dim(3), 1); }

// Enough multiply-adds to be worth a thread team.
bool worth_threads(int threads, int64_t work, int64_t madds) {
  return threads > 1 && work > 1 && madds > (int64_t{1} << 18);
}

// attention and attention_train: lse null for the former.
Status attention_impl(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                      Tensor* lse, float scale, bool causal, const int32_t* key_lo, const int32_t* key_hi,
                      const DropoutMask* drop) {
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), dk = q.dim(3), S = k.dim(2), dv = v.dim(3);
  if (B * H * T == 0) return Status::Ok();
  // No keys, scores of empty dot products, or no output columns: see the reference.
  if (S == 0 || dk == 0 || dv == 0) {
    if (!lse)
      return out.numel() == 0 ? Status::Ok() : ref::attention(q, k, v, out, scale, causal, key_lo, key_hi);
    return ref::attention_train(q, k, v, out, *lse, scale, causal, key_lo, key_hi, drop);
  }
  if (drop && !drop->active()) drop = nullptr;
  const int threads = onednn::apply_threads();
  const bool avx2 = cpu_has_avx2();
  const KeyRange kr{key_lo, key_hi, causal, T, S};
  const int64_t ldq = ld(q), ldk = ld(k), ldv = ld(v), ldo = ld(out);
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  float* op_ = out.data<float>();
  float* lp = lse ? lse->data<float>() : nullptr;
  const int64_t blocks = (T + kRows - 1) / kRows;
  const int64_t work = B * H * blocks;
  const bool parallel = worth_threads(threads, work, B * H * T * S * (dk + dv));
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
        const HeadDropout hd{drop, static_cast<uint64_t>((b * H + h) * T * S), S};
        attend_block(qp + b * q.stride(0) + h * q.stride(1), ldq, kp + b * k.stride(0) + h * k.stride(1), ldk,
                     vp + b * v.stride(0) + h * v.stride(1), ldv, op_ + b * out.stride(0) + h * out.stride(1),
                     ldo, lp ? lp + b * lse->stride(0) + h * lse->stride(1) : nullptr,
                     lse ? lse->stride(2) : 0, dk, dv, scale, kr, b, i0, i1, avx2, hd);
      }
    }
    return Status::Ok();
  });
}

}  // namespace

Status attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, float scale, bool causal,
                 const int32_t* key_lo, const int32_t* key_hi) {
  static constexpr const char* op = "ops::attention";
  TSR_RETURN_IF_ERROR(detail::check_attention(op, q, k, v, out, causal, key_lo, key_hi));
  return attention_impl(op, q, k, v, out, nullptr, scale, causal, key_lo, key_hi, nullptr);
}

Status attention_train(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       float scale, bool causal, const int32_t* key_lo, const int32_t* key_hi,
                       const DropoutMask* drop) {
  static constexpr const char* op = "ops::attention_train";
  TSR_RETURN_IF_ERROR(detail::check_attention_train(op, q, k, v, out, lse, causal, key_lo, key_hi, false));
  TSR_RETURN_IF_ERROR(check_attention_dropout(op, drop));
  return attention_impl(op, q, k, v, out, &lse, scale, causal, key_lo, key_hi, drop);
}

// Who adds into which gradient row. dK and dV of a key block sum over query blocks, dQ of a query
// block over key blocks, so one thread per tile would race. Two schedules avoid it:
//   - one pass, parallel over (batch, head): a thread owns a head's dq, dk and dv, and each tile
//     costs 5 products (S, dP, dV, dK, dQ);
//   - two passes: parallel over (batch, head, key block) for dK and dV, then over (batch, head,
//     query block) for dQ; each tile is visited twice, 7 products (S and dP are recomputed), but
//     the work splits into many more pieces.
// The one pass is taken when the heads spread over the threads evenly enough to beat 7/5 of the
// work: rounds · 5 <= (heads / threads) · 7, rounds = ceil(heads / threads). Both add the same
// tiles into each gradient row in the same order (the second pass's key tiles follow the first's
// grid), so the gradients' bits depend on neither the schedule nor the thread count.
Status attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                          float scale, bool causal, const int32_t* key_lo, const int32_t* key_hi,
                          const DropoutMask* drop) {
  static constexpr const char* op = "ops::attention_backward";
  TSR_RETURN_IF_ERROR(detail::check_attention_backward(op, q, k, v, out, lse, dout, dq, dk, dv, causal,
                                                       key_lo, key_hi, false));
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), Dk = q.dim(3), S = k.dim(2), Dv = v.dim(3);
  if (B * H == 0) return Status::Ok();
  // No queries, no keys, or empty dot products: see the reference.
  if (T == 0 || S == 0 || Dk == 0 || Dv == 0)
    return ref::attention_backward(q, k, v, out, lse, dout, dq, dk, dv, scale, causal, key_lo, key_hi, drop);
  TSR_RETURN_IF_ERROR(check_attention_dropout(op, drop));
  if (drop && !drop->active()) drop = nullptr;
  const int threads = onednn::apply_threads();
  const bool avx2 = cpu_has_avx2();
  const KeyRange kr{key_lo, key_hi, causal, T, S};
  const int64_t q_blocks = (T + kRows - 1) / kRows, k_blocks = (S + kCols - 1) / kCols, heads = B * H;
  const int64_t madds = heads * T * S * (Dk + Dv);
  const bool parallel = worth_threads(threads, heads * std::max(q_blocks, k_blocks), madds);
  const int64_t team = parallel ? threads : 1, rounds = (heads + team - 1) / team;
  const bool one_pass = rounds * 5 * team <= heads * 7;
  auto shapes = [&] { return onednn::describe({&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    // D = rowsum(dO ⊙ O) of every query row (B, H, T): O(T) memory, this thread's scratch.
    float* delta = static_cast<float*>(onednn::scratch(onednn::Slot::aux, sizeof(float) * heads * T));
    auto head = [&](int64_t bh) {
      const int64_t b = bh / H, h = bh % H;
      auto in = [&](const Tensor& t) {
        return Rows<const float>{t.data<float>() + b * t.stride(0) + h * t.stride(1), ld(t)};
      };
      auto grad = [&](Tensor& t) {
        return Rows<float>{t.data<float>() + b * t.stride(0) + h * t.stride(1), ld(t)};
      };
      BackwardHead g{in(q), in(k), in(v), in(dout), grad(dq), grad(dk), grad(dv)};
      g.lse = lse.data<float>() + b * lse.stride(0) + h * lse.stride(1);
      g.lse_stride = lse.stride(2);
      g.delta = delta + bh * T;
      g.Dk = Dk;
      g.Dv = Dv;
      g.drop = HeadDropout{drop, static_cast<uint64_t>(bh * T * S), S};
      return g;
    };
#pragma omp parallel if (parallel)
    {
      omp_set_num_threads(1);  // as in attention: each tile's sgemm on its own thread
#pragma omp for schedule(static)
      for (int64_t bh = 0; bh < heads; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        const float* o = out.data<float>() + b * out.stride(0) + h * out.stride(1);
        const float* g = dout.data<float>() + b * dout.stride(0) + h * dout.stride(1);
        const int64_t ldo = ld(out), ldg = ld(dout);
        for (int64_t i = 0; i < T; ++i) {
          float acc = 0.f;
          for (int64_t d = 0; d < Dv; ++d) acc += g[i * ldg + d] * o[i * ldo + d];
          delta[bh * T + i] = acc;
        }
      }
      if (one_pass) {
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < heads; ++bh) {
          const BackwardHead g = head(bh);
          zero_rows(g.dq, 0, T, Dk);
          for (int64_t j0 = 0; j0 < S; j0 += kCols)
            backward_key_block(g, scale, kr, bh / H, j0, std::min(S, j0 + kCols), avx2);
        }
      } else {
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < heads * k_blocks; ++w) {
          BackwardHead g = head(w / k_blocks);
          g.dq.p = nullptr;
          const int64_t j0 = (w % k_blocks) * kCols;
          backward_key_block(g, scale, kr, w / k_blocks / H, j0, std::min(S, j0 + kCols), avx2);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < heads * q_blocks; ++w) {
          BackwardHead g = head(w / q_blocks);
          g.dk.p = g.dv.p = nullptr;
          const int64_t i0 = (w % q_blocks) * kRows;
          backward_query_block(g, scale, kr, w / q_blocks / H, i0, std::min(T, i0 + kRows), avx2);
        }
      }
    }
    return Status::Ok();
  });
}

}  // namespace tessera::ops
