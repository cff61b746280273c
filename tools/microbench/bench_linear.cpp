// bench_linear: Linear at decode shapes (few rows), the bytes of weights each call streams and the
// rate it reads them at, for the f32 oneDNN matmul and the bf16 streaming GEMV (AVX2 and portable).
// A developer's measurement behind docs/PERFORMANCE.md ("bf16 weights for decoding"), not a test
// and not installed. Each shape is held in enough copies (>= 256 MB) that a round over them cannot
// sit in the last-level cache, as a decode step's 12 layers cannot: rates are from memory.
//   build/bench_linear --threads 2                  # GPT-2-small shapes, M = 1
//   build/bench_linear --threads 2 --rows 1,2,4,8,12,16,24,32 --shapes 768x3072,3072x768
//   build/bench_linear --threads 2 --widen          # prefill (M = 128): packed f32 vs widening bf16
//   build/bench_linear --threads 1 --hot            # one copy, cache-resident where it fits: compute rate
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemv_bf16.h"  // core/src: the kernel itself, for M beyond Linear's threshold
#include "tessera/ops.h"
#include "tessera/random.h"

using namespace tessera;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    out.push_back(std::atoll(s.substr(p, q - p).c_str()));
    p = q + 1;
  }
  return out;
}

// Seconds per call: median over `reps` rounds of one call on each copy, divided by the copies.
template <class Call>
double time_per_call(int copies, int reps, Call&& call) {
  for (int c = 0; c < copies; ++c) call(c);  // warm-up round
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    for (int c = 0; c < copies; ++c) call(c);
    t.push_back((now() - t0) / copies);
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 15;
  bool widen = false, hot = false;
  std::vector<int64_t> rows = {1};
  std::vector<std::pair<int64_t, int64_t>> shapes = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 50257}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--reps") reps = std::atoi(next().c_str());
    else if (a == "--rows") rows = parse_list(next());
    else if (a == "--widen") widen = true;
    else if (a == "--hot") hot = true;  // one copy: weights from the cache where they fit
    else if (a == "--shapes") {
      shapes.clear();
      const std::string s = next();
      size_t p = 0;
      while (p < s.size()) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        const std::string one = s.substr(p, q - p);
        const size_t x = one.find('x');
        shapes.push_back({std::atoll(one.substr(0, x).c_str()), std::atoll(one.substr(x + 1).c_str())});
        p = q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: bench_linear [--threads N] [--reps N] [--rows 1,2,..] [--shapes KxN,..] [--widen] [--hot]\n");
      return 2;
    }
  }
  set_num_threads(threads);
  const RuntimeInfo ri = runtime_info();
  std::printf("# oneDNN %s, isa %s, %d threads, native bf16: %s; medians of %d rounds\n", ri.onednn_version.c_str(),
              ri.isa.c_str(), ri.threads, ri.native_bf16 ? "yes" : "no", reps);
  Rng rng(7);

  if (widen) {
    // Prefill-sized M: the f32 packed copy against keeping only bf16 and widening it per call.
    const int64_t M = 128;
    std::printf("%-12s %5s %14s %24s\n", "K x N", "M", "f32 packed ms", "widen bf16 + matmul ms");
    for (auto [K, N] : shapes) {
      Tensor w = Tensor::empty({K, N});
      fill_uniform(w, rng, -0.05f, 0.05f);
      const Tensor wb = w.to(DType::bf16);
      Tensor wide = Tensor::empty({K, N});
      Tensor x = Tensor::empty({M, K}), y = Tensor::empty({M, N});
      fill_uniform(x, rng, -1, 1);
      Result<Linear> lin = Linear::create(w, Tensor(), Activation::none);
      if (!lin.ok()) return 1;
      const double t_packed = time_per_call(1, reps, [&](int) { (void)lin->forward(x, y); });
      const double t_widen = time_per_call(1, reps, [&](int) {
        const uint16_t* s = reinterpret_cast<const uint16_t*>(wb.raw_data());
        float* d = static_cast<float*>(wide.raw_data());
        const int64_t n = K * N;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
          const uint32_t u = static_cast<uint32_t>(s[i]) << 16;
          std::memcpy(d + i, &u, 4);
        }
        (void)ops::matmul(x, wide, y);
      });
      std::printf("%5lldx%-6lld %5lld %14.3f %24.3f\n", static_cast<long long>(K), static_cast<long long>(N),
                  static_cast<long long>(M), t_packed * 1e3, t_widen * 1e3);
    }
    return 0;
  }

  {
    // The roofline: a plain parallel read of 256 MB (an integer sum, which the compiler vectorises).
    const int64_t n = 64 << 20;
    std::vector<uint32_t> big(static_cast<size_t>(n), 1u);
    const uint32_t* p = big.data();
    uint32_t sink = 0;
    const double s = time_per_call(1, reps, [&](int) {
      uint32_t sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
      for (int64_t i = 0; i < n; ++i) sum += p[i];
      sink += sum;
    });
    std::printf("# plain read of %.0f MB: %.2f GB/s (checksum %u)\n", 4.0 * n / 1e6, 4.0 * n / s / 1e9, sink);
  }
  std::printf("%-12s %3s %-22s %10s %10s %8s\n", "K x N", "M", "path", "us/call", "MB/call", "GB/s");
  for (auto [K, N] : shapes) {
    const double f32_bytes = 4.0 * static_cast<double>(K * N), bf16_bytes = f32_bytes / 2;
    const int copies = hot ? 1 : static_cast<int>(std::max(2.0, 256e6 / f32_bytes + 0.999));
    std::vector<Linear> f32s;
    std::vector<kernels::GemvWeights> packs;
    {
      Tensor w = Tensor::empty({K, N});
      for (int c = 0; c < copies; ++c) {
        fill_uniform(w, rng, -0.05f, 0.05f);
        Result<Linear> lin = Linear::create(w, Tensor(), Activation::none);
        if (!lin.ok()) {
          std::fprintf(stderr, "%s\n", lin.status().message().c_str());
          return 1;
        }
        f32s.push_back(std::move(lin).value());
        packs.push_back(kernels::gemv_pack_bf16(static_cast<const float*>(w.raw_data()), K, N));
      }
    }
    for (int64_t M : rows) {
      Tensor x = Tensor::empty({M, K}), y = Tensor::empty({M, N});
      fill_uniform(x, rng, -1, 1);
      Tensor xr = x.to(DType::bf16).to(DType::f32);
      auto report = [&](const char* path, double s, double bytes) {
        std::printf("%5lldx%-6lld %3lld %-22s %10.1f %10.2f %8.2f\n", static_cast<long long>(K),
                    static_cast<long long>(N), static_cast<long long>(M), path, s * 1e6, bytes / 1e6, bytes / s / 1e9);
        std::fflush(stdout);
      };
      report("f32 oneDNN", time_per_call(copies, reps, [&](int c) { (void)f32s[c].forward(x, y); }), f32_bytes);
      if (M > kernels::kGemvMaxRows) continue;
      kernels::GemvArgs a;
      a.M = M;
      a.x = static_cast<const float*>(xr.raw_data());
      a.ldx = K;
      a.y = static_cast<float*>(y.raw_data());
      a.ldy = N;
      omp_set_num_threads(threads);
      report((std::string("bf16 gemv ") + kernels::gemv_isa()).c_str(),
             time_per_call(copies, reps, [&](int c) { kernels::gemv_bf16(packs[c], a); }), bf16_bytes);
      kernels::ScopedGemvGeneric generic;
      report("bf16 gemv generic", time_per_call(copies, reps, [&](int c) { kernels::gemv_bf16(packs[c], a); }),
             bf16_bytes);
    }
  }
  return 0;
}
