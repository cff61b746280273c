// `tessera bench --attention N`: times one attention op over N rows, as the fused kernel
// (ops::attention: tiles and an online softmax) or materialised (ops::matmul for the scores, the
// softmax primitive, ops::matmul for the weighted sum: the (N, N) matrix stored, as eager
// frameworks do), and measures the extra memory it needs: the process's peak resident size after
// the runs minus the resident size before the first run, with the inputs and output already
// allocated and touched (Linux: the peak is reset through /proc/self/clear_refs first, so what
// the process needed while starting does not hide a smaller op's growth).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "bench_attention.h"
#include "bench_machine.h"
#include "common.h"
#include "tessera/fileio.h"
#include "tessera/ops.h"
#include "tessera/random.h"

namespace tessera::cli {

namespace {

// A "VmRSS:" or "VmHWM:" line of /proc/self/status, in bytes; -1 where there is none.
int64_t proc_status_bytes(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t kb = -1;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0) kb = std::strtoll(line + n, nullptr, 10);
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

// Resets the peak resident size to the current one (Linux >= 4.0); false where it cannot.
bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int run_attention_bench(const AttentionBenchArgs& a) {
  if (a.n < 1 || a.head_dim < 1 || a.heads < 1) {
    std::fprintf(stderr, "tessera bench --attention: rows, --head-dim and --heads must be at least 1\n");
    return kExitBadInput;
  }
  set_num_threads(a.threads);
  const int64_t n = a.n, d = a.head_dim, H = a.heads;
  Tensor q = Tensor::empty({1, H, n, d}), k = Tensor::empty({1, H, n, d}), v = Tensor::empty({1, H, n, d});
  Tensor out = Tensor::zeros({1, H, n, d});
  Rng rng(1);
  for (Tensor* t : {&q, &k, &v}) fill_uniform(*t, rng, -1, 1);
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  if (!reset_peak_rss()) std::fprintf(stderr, "tessera bench --attention: cannot reset the peak RSS; extra memory is an upper bound\n");
  const int64_t before = proc_status_bytes("VmRSS:");

  auto once = [&]() -> Status {
    if (!a.materialised) return ops::attention(q, k, v, out, scale, a.causal);
    Tensor s = Tensor::empty({1, H, n, n});
    TSR_RETURN_IF_ERROR(ops::matmul(q, k.transpose(2, 3), s, scale));
    if (a.causal)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < n; ++i) {
          float* row = s.data<float>() + (h * n + i) * n;
          for (int64_t j = i + 1; j < n; ++j) row[j] = -std::numeric_limits<float>::infinity();
        }
    TSR_RETURN_IF_ERROR(ops::softmax(s, s));
    return ops::matmul(s, v, out);
  };
  std::vector<double> times;
  for (int i = 0; i < a.warmup + a.reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (Status st = once(); !st.ok()) {
      std::fprintf(stderr, "tessera bench --attention: %s\n", st.message().c_str());
      return kExitFailure;
    }
    if (i >= a.warmup) times.push_back(seconds_since(t0));
  }
  const int64_t extra = std::max<int64_t>(0, proc_status_bytes("VmHWM:") - before);
  const Spread spread = spread_of(times);
  const double med = spread.median;
  const std::string warning = spread_warning("the attention op", spread);
  // Multiply-adds of Q Kᵀ and of A V, counted as 2 each; a causal kernel skips about half.
  const double flops = 4.0 * static_cast<double>(H) * static_cast<double>(n) * static_cast<double>(n) *
                       static_cast<double>(d) * (a.causal ? 0.5 : 1.0);
  const std::string kind = a.materialised ? "materialised (scores stored)" : "fused (tiles, online softmax)";
  std::vector<std::vector<std::string>> rows = {
      {"attention", kind + ", " + std::to_string(H) + " head(s), " + std::to_string(n) + " rows, d " +
                        std::to_string(d) + (a.causal ? ", causal" : "")},
      {"threads", std::to_string(num_threads())},
      {"latency", "median " + fmt(med * 1e3, 2, false) + " ms, min " + fmt(spread.min * 1e3, 2, false) +
                      " ms, max " + fmt(spread.max * 1e3, 2, false) + " ms, " + spread_text(spread) +
                      " (slowest / fastest)  (" + std::to_string(a.reps) + " runs after " +
                      std::to_string(a.warmup) + " warm-up)"},
      {"compute", fmt(flops / med * 1e-9, 1, false) + " GFLOP/s"},
      {"extra memory", fmt_bytes(static_cast<double>(extra)) + " (peak resident growth over the inputs)"}};
  std::printf("%s", table(rows, 0).c_str());
  if (!warning.empty()) std::printf("%s\n", warning.c_str());
  if (!a.json.empty()) {
    const nlohmann::json j = {
        {"kind", a.materialised ? "materialised" : "fused"},
        {"rows", n},
        {"head_dim", d},
        {"heads", H},
        {"causal", a.causal},
        {"threads", num_threads()},
        {"median_s", med},
        {"spread", spread.ratio()},
        {"spread_limit", kSpreadLimit},
        {"warnings", warning.empty() ? std::vector<std::string>{} : std::vector{warning}},
        {"times_s", times},
        {"gflops", flops / med * 1e-9},
        {"extra_bytes", extra},
        {"rss_before_bytes", before}};
    if (Status st = write_file_atomic(a.json, j.dump(2) + "\n"); !st.ok()) {
      std::fprintf(stderr, "tessera bench: %s\n", st.message().c_str());
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace tessera::cli
