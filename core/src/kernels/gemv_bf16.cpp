// A hand-written bf16 GEMV for decoding, and only that. oneDNN 2.6 has no bf16 matmul kernels
// without AVX512_BF16 (this project's AVX2 machines): there `dtype: bf16` rounds weights and
// inputs to bf16 and runs f32 kernels, which stream 4 bytes per weight. A decode step (a few rows
// against every weight of the model) runs at the memory's pace, so streaming the weights as bf16
// halves its bytes. Where oneDNN reports native bf16 kernels, Linear keeps oneDNN and this file is
// not used; for many rows (prefill, encoders) Linear keeps oneDNN's f32 matmul, which is
// compute-bound there and faster (see linear.cpp for the threshold, docs/PERFORMANCE.md for the
// figures).
//
// Layout (gemv_bf16.h): blocks of 16 output columns, K contiguous inside a block, each row of a
// block 16 bf16 = 32 bytes with columns c and c + 8 paired in one 32-bit lane. One thread takes a
// contiguous range of blocks, so each thread reads one sequential stream.
// Kernel: per block, rows in register tiles of up to 6 (4 portable; 2 × 8 floats per row), f32
// FMA, bias + activation + residual applied to the block's outputs after its K loop.
// Dispatch: AVX2 + FMA through GCC target attributes, chosen at run time; our code is otherwise
// built for generic x86-64, so a portable C++ loop over the same layout serves other CPUs.
#include "kernels/gemv_bf16.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TESSERA_GEMV_X86 1
#else
#define TESSERA_GEMV_X86 0
#endif

namespace tessera::kernels {

namespace {

constexpr int kMaxTileRows = 6;  // AVX2 rows per register tile: 12 accumulators + 2 weights + 1 broadcast
constexpr int kMaxGenericRows = 4;  // portable rows per tile (5 and 6 measured 10x slower: spills)
constexpr int64_t kTileK = 512;  // K rows per pass when several row tiles share a block (16 KiB)
constexpr int64_t kParallelMin = 32768;  // weights below which one thread does it all

thread_local bool t_force_generic = false;

bool cpu_has_avx2() {
#if TESSERA_GEMV_X86
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

// acc (MR, 16) += x (MR, kn) · block rows (kn, 16); w and x start at the tile's first k.
// Plain C++ written so that the compiler vectorises it for the baseline ISA (SSE2 on x86-64):
// the same shift-and-mask widening as the AVX2 path, accumulators in a local array.
template <int MR>
void tile_generic(const uint16_t* w, const float* x, int64_t ldx, int64_t kn, float* acc_io) {
  float acc[MR][kGemvBlock];
  std::memcpy(acc, acc_io, sizeof acc);
  for (int64_t k = 0; k < kn; ++k) {
    uint32_t lanes[8], lo[8], hi[8];
    std::memcpy(lanes, w + k * kGemvBlock, sizeof lanes);
    for (int i = 0; i < 8; ++i) {
      lo[i] = lanes[i] << 16;           // columns 0..7
      hi[i] = lanes[i] & 0xffff0000u;  // columns 8..15
    }
    float wl[8], wh[8];
    std::memcpy(wl, lo, sizeof wl);
    std::memcpy(wh, hi, sizeof wh);
    for (int r = 0; r < MR; ++r) {
      const float xv = x[r * ldx + k];
      for (int i = 0; i < 8; ++i) {
        acc[r][i] += xv * wl[i];
        acc[r][8 + i] += xv * wh[i];
      }
    }
  }
  std::memcpy(acc_io, acc, sizeof acc);
}

void tile_generic_rows(const uint16_t* w, const float* x, int64_t ldx, int64_t kn, int mr, float* acc) {
  switch (mr) {
    case 1: return tile_generic<1>(w, x, ldx, kn, acc);
    case 2: return tile_generic<2>(w, x, ldx, kn, acc);
    case 3: return tile_generic<3>(w, x, ldx, kn, acc);
    default: return tile_generic<4>(w, x, ldx, kn, acc);
  }
}

#if TESSERA_GEMV_X86
#define TESSERA_AVX2 __attribute__((target("avx2,fma")))

// The accumulators are named variables, not an array: GCC keeps an array of vectors in registers
// but also stores it back on every iteration (measured 4x slower at 4 rows).
#define TESSERA_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

template <int MR>
TESSERA_AVX2 void tile_avx2(const uint16_t* w, const float* x, int64_t ldx, int64_t kn, float* acc) {
  static_assert(MR >= 1 && MR <= kMaxTileRows);
#define TESSERA_DECL(r) __m256 lo##r = _mm256_setzero_ps(), hi##r = _mm256_setzero_ps();
  TESSERA_ROWS(TESSERA_DECL)
#undef TESSERA_DECL
#define TESSERA_LOAD(r)                                    \
  if constexpr (r < MR) {                                  \
    lo##r = _mm256_loadu_ps(acc + r * kGemvBlock);         \
    hi##r = _mm256_loadu_ps(acc + r * kGemvBlock + 8);     \
  }
  TESSERA_ROWS(TESSERA_LOAD)
#undef TESSERA_LOAD
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  int64_t k = 0;
  if constexpr (MR <= 2) {
    // Few rows: a second set of accumulators over odd k, so that the FMA chains do not wait on
    // each other's latency.
    __m256 lo0b = _mm256_setzero_ps(), hi0b = _mm256_setzero_ps();
    __m256 lo1b = _mm256_setzero_ps(), hi1b = _mm256_setzero_ps();
    for (; k + 2 <= kn; k += 2) {
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k * kGemvBlock));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (k + 1) * kGemvBlock));
      const __m256 w0l = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
      const __m256 w0h = _mm256_castsi256_ps(_mm256_and_si256(v0, high));
      const __m256 w1l = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
      const __m256 w1h = _mm256_castsi256_ps(_mm256_and_si256(v1, high));
      const __m256 x00 = _mm256_broadcast_ss(x + k), x01 = _mm256_broadcast_ss(x + k + 1);
      lo0 = _mm256_fmadd_ps(x00, w0l, lo0);
      hi0 = _mm256_fmadd_ps(x00, w0h, hi0);
      lo0b = _mm256_fmadd_ps(x01, w1l, lo0b);
      hi0b = _mm256_fmadd_ps(x01, w1h, hi0b);
      if constexpr (MR == 2) {
        const __m256 x10 = _mm256_broadcast_ss(x + ldx + k), x11 = _mm256_broadcast_ss(x + ldx + k + 1);
        lo1 = _mm256_fmadd_ps(x10, w0l, lo1);
        hi1 = _mm256_fmadd_ps(x10, w0h, hi1);
        lo1b = _mm256_fmadd_ps(x11, w1l, lo1b);
        hi1b = _mm256_fmadd_ps(x11, w1h, hi1b);
      }
    }
    lo0 = _mm256_add_ps(lo0, lo0b);
    hi0 = _mm256_add_ps(hi0, hi0b);
    lo1 = _mm256_add_ps(lo1, lo1b);
    hi1 = _mm256_add_ps(hi1, hi1b);
  }
  for (; k < kn; ++k) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k * kGemvBlock));
    const __m256 wl = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    const __m256 wh = _mm256_castsi256_ps(_mm256_and_si256(v, high));
#define TESSERA_FMA(r)                                              \
  if constexpr (r < MR) {                                           \
    const __m256 xb = _mm256_broadcast_ss(x + r * ldx + k);         \
    lo##r = _mm256_fmadd_ps(xb, wl, lo##r);                         \
    hi##r = _mm256_fmadd_ps(xb, wh, hi##r);                         \
  }
    TESSERA_ROWS(TESSERA_FMA)
#undef TESSERA_FMA
  }
#define TESSERA_STORE(r)                                   \
  if constexpr (r < MR) {                                  \
    _mm256_storeu_ps(acc + r * kGemvBlock, lo##r);         \
    _mm256_storeu_ps(acc + r * kGemvBlock + 8, hi##r);     \
  }
  TESSERA_ROWS(TESSERA_STORE)
#undef TESSERA_STORE
}
#undef TESSERA_ROWS

void tile_avx2_rows(const uint16_t* w, const float* x, int64_t ldx, int64_t kn, int mr, float* acc) {
  switch (mr) {
    case 1: return tile_avx2<1>(w, x, ldx, kn, acc);
    case 2: return tile_avx2<2>(w, x, ldx, kn, acc);
    case 3: return tile_avx2<3>(w, x, ldx, kn, acc);
    case 4: return tile_avx2<4>(w, x, ldx, kn, acc);
    case 5: return tile_avx2<5>(w, x, ldx, kn, acc);
    default: return tile_avx2<6>(w, x, ldx, kn, acc);
  }
}
#endif

using TileFn = void (*)(const uint16_t*, const float*, int64_t, int64_t, int, float*);

// y[:, n0 : n0 + nn] = act(acc + b) [+ r] for the block's valid columns.
void epilogue(const GemvArgs& a, int64_t n0, int64_t nn, const float* acc) {
  for (int64_t r = 0; r < a.M; ++r) {
    const float* in = acc + r * kGemvBlock;
    float v[kGemvBlock];
    for (int64_t c = 0; c < nn; ++c) v[c] = in[c] + (a.bias ? a.bias[n0 + c] : 0.f);
    switch (a.act) {
      case Activation::none:
        break;
      case Activation::relu:
        for (int64_t c = 0; c < nn; ++c) v[c] = v[c] > 0.f ? v[c] : 0.f;
        break;
      default:  // GELU: the reference definition (erf or tanh in double), not an approximation
        for (int64_t c = 0; c < nn; ++c) v[c] = ref::activate(a.act, v[c]);
        break;
    }
    float* y = a.y + r * a.ldy + n0;
    if (a.res) {
      const float* rr = a.res + r * a.ldr + n0;  // read before the write: y may be r
      for (int64_t c = 0; c < nn; ++c) y[c] = v[c] + rr[c];
    } else {
      for (int64_t c = 0; c < nn; ++c) y[c] = v[c];
    }
  }
}

}  // namespace

GemvWeights gemv_pack_bf16(const float* w, int64_t K, int64_t N) {
  GemvWeights g;
  g.K = K;
  g.N = N;
  const int64_t nb = (N + kGemvBlock - 1) / kGemvBlock;
  g.packed = Tensor::empty({std::max<int64_t>(1, nb * K * kGemvBlock)}, DType::bf16);
  uint16_t* p = reinterpret_cast<uint16_t*>(g.packed.raw_data());
#pragma omp parallel for schedule(static) if (K * N >= kParallelMin)
  for (int64_t j = 0; j < nb; ++j) {
    for (int64_t k = 0; k < K; ++k) {
      uint16_t* row = p + (j * K + k) * kGemvBlock;
      const float* src = w + k * N + j * kGemvBlock;
      for (int64_t c = 0; c < kGemvBlock; ++c) {
        const int64_t slot = c < 8 ? 2 * c : 2 * (c - 8) + 1;  // c and c + 8 share lane c % 8
        row[slot] = j * kGemvBlock + c < N ? f32_to_bf16(src[c]).bits : uint16_t{0};
      }
    }
  }
  return g;
}

void gemv_bf16(const GemvWeights& w, const GemvArgs& a) {
  TSR_CHECK(w.defined() && a.M >= 1 && a.M <= kGemvMaxRows, "gemv_bf16: bad call");
  const int64_t K = w.K, N = w.N, M = a.M;
  const int64_t nb = (N + kGemvBlock - 1) / kGemvBlock;
  const uint16_t* packed = reinterpret_cast<const uint16_t*>(w.packed.raw_data());
  TileFn tile = tile_generic_rows;
  int64_t tile_rows = kMaxGenericRows;
#if TESSERA_GEMV_X86
  if (cpu_has_avx2() && !t_force_generic) {
    tile = tile_avx2_rows;
    tile_rows = kMaxTileRows;
  }
#endif
  // Row tiles of at most tile_rows rows, as even as possible (AVX2: 8 -> 4 + 4).
  const int64_t n_tiles = (M + tile_rows - 1) / tile_rows;
  const int64_t k_step = n_tiles == 1 ? std::max<int64_t>(K, 1) : kTileK;
#pragma omp parallel for schedule(static) if (nb > 1 && K * N >= kParallelMin)
  for (int64_t j = 0; j < nb; ++j) {
    alignas(64) float acc[kGemvMaxRows * kGemvBlock];
    std::fill(acc, acc + M * kGemvBlock, 0.f);
    const uint16_t* wb = packed + j * K * kGemvBlock;
    for (int64_t k0 = 0; k0 < K; k0 += k_step) {
      const int64_t kn = std::min(k_step, K - k0);
      int64_t r0 = 0;
      for (int64_t t = 0; t < n_tiles; ++t) {
        const int64_t mr = (M - r0) / (n_tiles - t) + ((M - r0) % (n_tiles - t) ? 1 : 0);
        tile(wb + k0 * kGemvBlock, a.x + r0 * a.ldx + k0, a.ldx, kn, static_cast<int>(mr),
             acc + r0 * kGemvBlock);
        r0 += mr;
      }
    }
    epilogue(a, j * kGemvBlock, std::min(kGemvBlock, N - j * kGemvBlock), acc);
  }
}

const char* gemv_isa() { return cpu_has_avx2() && !t_force_generic ? "avx2" : "generic"; }

ScopedGemvGeneric::ScopedGemvGeneric() : saved_(t_force_generic) { t_force_generic = true; }
ScopedGemvGeneric::~ScopedGemvGeneric() { t_force_generic = saved_; }

}  // namespace tessera::kernels
