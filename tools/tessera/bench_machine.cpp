// The machine's FMA peak and memory bandwidth, a decode step's weight bytes, and the spread of
// repeated runs; see bench_machine.h.
#include "bench_machine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TSR_BENCH_X86 1
#endif

namespace tessera::cli {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Each kernel runs `n` iterations of `A` independent FMA chains, acc = acc · m + c, on registers,
// and returns a value computed from every accumulator so that none can be optimised away. m is
// just below 1, c tiny: the values stay normal floats (no denormal slow paths) for any n. m and c
// come from volatile variables: with constants the compiler could fold the whole loop away.
// AVX2 + FMA: 16 ymm registers, 12 accumulators (Zen: 2 FMA pipes × latency 5 needs 10 in flight;
// Intel: 2 × 4 needs 8), plus m and c.
constexpr int kAccAvx2 = 12;
constexpr int kAccAvx512 = 24;  // 32 zmm registers; 2 pipes × latency 4 needs 8, Zen 4 more
constexpr int kAccSse = 8;

#ifdef TSR_BENCH_X86
#define TSR_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define TSR_REP24(X) TSR_REP12(X) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
#define TSR_REP8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

__attribute__((target("avx2,fma"), noinline)) float fma_loop_avx2(int64_t n, float mv, float cv) {
  const __m256 m = _mm256_set1_ps(mv), c = _mm256_set1_ps(cv);
#define DECL(i) __m256 a##i = _mm256_set1_ps(1.0f + (i) * 1e-3f);
  TSR_REP12(DECL)
#undef DECL
  for (int64_t k = 0; k < n; ++k) {
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, m, c);
    TSR_REP12(STEP)
#undef STEP
  }
  __m256 s = _mm256_setzero_ps();
#define SUM(i) s = _mm256_add_ps(s, a##i);
  TSR_REP12(SUM)
#undef SUM
  float v[8];
  _mm256_storeu_ps(v, s);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

__attribute__((target("avx512f"), noinline)) float fma_loop_avx512(int64_t n, float mv, float cv) {
  const __m512 m = _mm512_set1_ps(mv), c = _mm512_set1_ps(cv);
#define DECL(i) __m512 a##i = _mm512_set1_ps(1.0f + (i) * 1e-3f);
  TSR_REP24(DECL)
#undef DECL
  for (int64_t k = 0; k < n; ++k) {
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, m, c);
    TSR_REP24(STEP)
#undef STEP
  }
  __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, a##i);
  TSR_REP24(SUM)
#undef SUM
  float v[16];
  _mm512_storeu_ps(v, s);
  float r = 0;
  for (float x : v) r += x;
  return r;
}

// Without FMA: a multiply and an add per lane, 2 FLOP, on SSE2 (baseline x86-64).
__attribute__((noinline)) float fma_loop_sse(int64_t n, float mv, float cv) {
  const __m128 m = _mm_set1_ps(mv), c = _mm_set1_ps(cv);
#define DECL(i) __m128 a##i = _mm_set1_ps(1.0f + (i) * 1e-3f);
  TSR_REP8(DECL)
#undef DECL
  for (int64_t k = 0; k < n; ++k) {
#define STEP(i) a##i = _mm_add_ps(_mm_mul_ps(a##i, m), c);
    TSR_REP8(STEP)
#undef STEP
  }
  __m128 s = _mm_setzero_ps();
#define SUM(i) s = _mm_add_ps(s, a##i);
  TSR_REP8(SUM)
#undef SUM
  float v[4];
  _mm_storeu_ps(v, s);
  return v[0] + v[1] + v[2] + v[3];
}
#endif

struct Kernel {
  float (*loop)(int64_t, float, float) = nullptr;
  int lanes = 0, accumulators = 0;
  std::string isa;
};

Kernel pick_kernel() {
#ifdef TSR_BENCH_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {fma_loop_avx512, 16, kAccAvx512, "avx512f"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return {fma_loop_avx2, 8, kAccAvx2, "avx2+fma"};
  return {fma_loop_sse, 4, kAccSse, "sse2 (no FMA: mul + add)"};
#else
  return {};
#endif
}

// Every thread runs the loop for n iterations; seconds of the whole parallel region.
volatile float g_fma_m = 0.99999994f, g_fma_c = 1e-7f;

double run_fma(const Kernel& k, int threads, int64_t n, volatile float* sink) {
  std::vector<float> out(static_cast<size_t>(threads), 0.0f);
  const float m = g_fma_m, c = g_fma_c;
  const double t0 = now_s();
#pragma omp parallel num_threads(threads)
  out[static_cast<size_t>(omp_get_thread_num())] = k.loop(n, m, c);
  const double t = now_s() - t0;
  float s = 0;
  for (float v : out) s += v;
  *sink = s;
  return t;
}

// Sum of x[0, n) with 8 independent SSE accumulators (32 floats in flight per iteration): far
// more than the memory can feed, so the loop waits on memory alone.
float sum_block(const float* x, int64_t n) {
#ifdef TSR_BENCH_X86
  __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm_add_ps(a0, _mm_loadu_ps(x + i));
    a1 = _mm_add_ps(a1, _mm_loadu_ps(x + i + 4));
    a2 = _mm_add_ps(a2, _mm_loadu_ps(x + i + 8));
    a3 = _mm_add_ps(a3, _mm_loadu_ps(x + i + 12));
    a4 = _mm_add_ps(a4, _mm_loadu_ps(x + i + 16));
    a5 = _mm_add_ps(a5, _mm_loadu_ps(x + i + 20));
    a6 = _mm_add_ps(a6, _mm_loadu_ps(x + i + 24));
    a7 = _mm_add_ps(a7, _mm_loadu_ps(x + i + 28));
  }
  const __m128 s = _mm_add_ps(_mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)),
                              _mm_add_ps(_mm_add_ps(a4, a5), _mm_add_ps(a6, a7)));
  float v[4];
  _mm_storeu_ps(v, s);
  float r = v[0] + v[1] + v[2] + v[3];
#else
  float r = 0;
  int64_t i = 0;
#endif
  for (; i < n; ++i) r += x[i];
  return r;
}

}  // namespace

double Spread::ratio() const {
  if (runs == 0) return 1.0;
  return min > 0 ? max / min : std::numeric_limits<double>::infinity();
}

Spread spread_of(std::vector<double> runs) {
  Spread s;
  s.runs = static_cast<int>(runs.size());
  if (runs.empty()) return s;
  std::sort(runs.begin(), runs.end());
  const size_t n = runs.size();
  s.min = runs.front();
  s.max = runs.back();
  s.median = n % 2 ? runs[n / 2] : 0.5 * (runs[n / 2 - 1] + runs[n / 2]);
  return s;
}

std::string spread_ratio(const Spread& s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2fx", s.ratio());
  return buf;
}

std::string spread_text(const Spread& s) { return "spread " + spread_ratio(s); }

std::string spread_warning(const std::string& figure, const Spread& s, double limit) {
  if (s.runs < 2 || !(s.ratio() > limit)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2fx", limit);
  return "warning: " + figure + ": its " + std::to_string(s.runs) + " runs " + spread_text(s) +
         " (slowest / fastest), more than " + buf +
         ": the machine was busy or changed its clock speed while measuring, so this figure and any % of "
         "peak or "
         "bound taken from it are unreliable; measure again on an idle machine";
}

std::string fma_isa() { return pick_kernel().isa; }

FmaPeak measure_fma_peak(int threads, double seconds, int trials) {
  const Kernel k = pick_kernel();
  FmaPeak p;
  p.isa = k.isa;
  p.threads = std::max(1, threads);
  p.accumulators = k.accumulators;
  if (!k.loop) return p;
  volatile float sink = 0;
  // Calibrate on one thread: grow n until a run takes at least 10 ms, then scale to `seconds`.
  int64_t n = 1 << 14;
  double t = 0;
  for (;;) {
    t = run_fma(k, 1, n, &sink);
    if (t >= 0.01 || n > (int64_t{1} << 40)) break;
    n *= 4;
  }
  n = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * seconds / std::max(t, 1e-9)));
  const double flop = 2.0 * static_cast<double>(n) * k.accumulators * k.lanes * p.threads;
  run_fma(k, p.threads, std::max<int64_t>(1, n / 10), &sink);  // wake the threads, ramp the clocks
  for (int i = 0; i < std::max(1, trials); ++i) {
    p.trials.push_back(flop / run_fma(k, p.threads, n, &sink) / 1e9);
    p.gflops = std::max(p.gflops, p.trials.back());
  }
  return p;
}

Bandwidth measure_bandwidth(int threads, int64_t bytes, int trials) {
  Bandwidth b;
  b.threads = std::max(1, threads);
  const int64_t third = std::max<int64_t>(1, bytes / 3 / static_cast<int64_t>(sizeof(float)) / 64 * 64);
  const int64_t n = 3 * third;
  b.bytes = n * static_cast<int64_t>(sizeof(float));
  // Uninitialised on purpose: the first touch below places every page with the thread that uses it.
  std::unique_ptr<float[]> buf(new float[static_cast<size_t>(n)]);
  float* x = buf.get();
  const int T = b.threads;
#pragma omp parallel for num_threads(T) schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f + static_cast<float>(i & 7) * 0.125f;
  volatile float sink = 0;
  // Read: each thread sums a contiguous slice, the static schedule of the first touch.
  for (int r = 0; r < std::max(1, trials); ++r) {
    double total = 0;
    const double t0 = now_s();
#pragma omp parallel num_threads(T) reduction(+ : total)
    {
      const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t lo = n * id / nt / 16 * 16, hi = id + 1 == nt ? n : n * (id + 1) / nt / 16 * 16;
      total += sum_block(x + lo, hi - lo);
    }
    const double t = now_s() - t0;
    sink = static_cast<float>(total);
    b.read_trials.push_back(static_cast<double>(b.bytes) / t / 1e9);
    b.read_gbs = std::max(b.read_gbs, b.read_trials.back());
  }
  // Triad over the thirds: a = b + s·c.
  float *A = x, *B = x + third, *C = x + 2 * third;
  const float s = 0.5f;
  for (int r = 0; r < std::max(1, trials); ++r) {
    const double t0 = now_s();
#pragma omp parallel for simd num_threads(T) schedule(static)
    for (int64_t i = 0; i < third; ++i) A[i] = B[i] + s * C[i];
    const double t = now_s() - t0;
    b.triad_gbs = std::max(b.triad_gbs, 3.0 * static_cast<double>(third) * sizeof(float) / t / 1e9);
  }
  sink = A[third / 2];
  (void)sink;
  return b;
}

int64_t decode_weight_bytes_per_step(const Model& m, int64_t batch, bool bf16_weights) {
  const ModelConfig& c = m.config();
  const bool tied_head = c.head.kind == HeadKind::lm && c.head.tied;
  int64_t total = 0;
  for (const auto& [name, t] : m.parameters()) {
    const bool lookup = name == "stem.type_embed" || name == "stem.modality" || name == "pos.table" ||
                        (name == "stem.embed" && !tied_head);
    if (lookup && t.rank() == 2) {
      total += std::min(batch, t.dim(0)) * t.dim(1) * static_cast<int64_t>(dtype_size(t.dtype()));
      continue;
    }
    const bool relative = name.find(".attn.rel_") != std::string::npos;
    if (t.rank() == 2 && !relative) {  // a matmul's weight, held in the kernel's dtype
      total += t.numel() * (bf16_weights ? 2 : 4);
      continue;
    }
    total += static_cast<int64_t>(t.nbytes());
  }
  return total;
}

}  // namespace tessera::cli
