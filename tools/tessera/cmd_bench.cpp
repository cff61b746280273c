// `tessera bench`: time a model's forward pass on random inputs of a chosen shape — warm-up, then
// the median of N runs — and relate it to this machine's f32 matmul peak, measured in the same
// run. A benchmark, not a test: figures go to stdout (and --json), nothing is asserted.
// `tessera bench --plugins` times the modality plugins' front ends instead (cmd_bench_plugins.cpp).
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench_plugins.h"
#include "commands.h"
#include "common.h"
#include "tessera/fileio.h"
#include "tessera/random.h"

namespace tessera::cli {

namespace {

struct BenchArgs {
  std::string file, json;
  std::vector<std::string> overrides;
  int64_t batch = 0, seq_len = 0;
  int reps = 0, warmup = -1, threads = -1;
  bool no_peak = false;
  uint64_t seed = 0;
  bool plugins = false;
  PluginBenchArgs plugin_args;  // --input, --only, --data
};

// This machine's f32 matmul rate now: a 2048³ oneDNN matmul, median of 5 after one warm-up.
double measure_matmul_peak() {
  const int64_t n = 2048;
  Tensor a = Tensor::empty({n, n}), b = Tensor::empty({n, n}), c = Tensor::empty({n, n});
  Rng rng(1);
  fill_uniform(a, rng, -1, 1);
  fill_uniform(b, rng, -1, 1);
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!ops::matmul(a, b, c).ok()) return 0;
    if (i > 0) t.push_back(seconds_since(t0));
  }
  return 2.0 * n * n * n / median(t) / 1e9;
}

int run_bench(const BenchArgs& a) {
  if (a.plugins) {
    PluginBenchArgs p = a.plugin_args;
    p.json = a.json;
    if (a.reps > 0) p.reps = a.reps;
    if (a.warmup >= 0) p.warmup = a.warmup;
    return run_plugin_bench(p);
  }
  if (a.file.empty()) {
    std::fprintf(stderr,
                 "tessera bench: give an experiment YAML to time its model, or --plugins to time the "
                 "modality plugins' front ends\n");
    return kExitBadInput;
  }
  std::vector<std::string> overrides = a.overrides;
  if (a.threads >= 0) overrides.push_back("runtime.threads=" + std::to_string(a.threads));
  std::optional<Loaded> L = load_and_build(a.file, overrides);
  if (!L) return kExitBadInput;
  const Experiment& e = L->exp;
  const int64_t B = a.batch > 0 ? a.batch : e.bench.batch;
  const int64_t T = a.seq_len > 0 ? a.seq_len : e.bench.seq_len;
  const int reps = a.reps > 0 ? a.reps : e.bench.reps;
  const int warmup = a.warmup >= 0 ? a.warmup : e.bench.warmup;
  const Plan plan = make_plan(e.model, T);
  const Batch batch = random_batch(e.model, B, T, a.seed);
  ForwardOptions opt;
  opt.reference = e.runtime.reference;
  Outputs out;
  std::vector<double> times;
  for (int i = 0; i < warmup + reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (Status st = L->model.forward(batch, opt, &out); !st.ok()) {
      std::fprintf(stderr, "tessera bench: %s\n", st.message().c_str());
      return kExitFailure;
    }
    if (i >= warmup) times.push_back(seconds_since(t0));
  }
  const double med = median(times);
  const double gflop = plan.flops_per_item * static_cast<double>(B) * 1e-9;
  const double rate = gflop / med;
  const double peak = a.no_peak ? 0.0 : measure_matmul_peak();
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const RuntimeInfo ri = runtime_info();

  const std::string name = e.model.name.empty() ? a.file : e.model.name;
  std::vector<std::vector<std::string>> rows = {
      {"model", name + ": " + fmt_count(static_cast<double>(plan.parameters)) + " parameters, " +
                    dtype_name(e.model.dtype) + ", " + std::to_string(e.model.n_layers) + " layers, d_model " +
                    std::to_string(e.model.d_model) + ", " + std::to_string(e.model.n_heads) + " heads"},
      {"input", "batch " + std::to_string(B) + " x " + std::to_string(plan.rows) + " rows (random, seed " +
                    std::to_string(a.seed) + ")"},
      {"runtime", std::to_string(ri.threads) + " threads, oneDNN " + ri.onednn_version + ", " + ri.isa +
                      (e.model.dtype == DType::bf16 ? (ri.native_bf16 ? ", native bf16" : ", bf16 emulated in f32") : "") +
                      (opt.reference ? ", REFERENCE loops" : "")},
      {"latency", "median " + fmt(med * 1e3, 2, false) + " ms, min " +
                      fmt(*std::min_element(times.begin(), times.end()) * 1e3, 2, false) + " ms, max " +
                      fmt(*std::max_element(times.begin(), times.end()) * 1e3, 2, false) + " ms  (" +
                      std::to_string(reps) + " runs after " + std::to_string(warmup) + " warm-up)"},
      {"throughput", fmt(static_cast<double>(B) / med, 2, false) + " items/s, " +
                         fmt(static_cast<double>(B * plan.rows) / med, 0, false) + " rows/s"},
      {"compute", fmt(gflop, 2, false) + " GFLOP per batch, " + fmt(rate, 1, false) + " GFLOP/s"},
      {"peak memory", fmt_bytes(static_cast<double>(ru.ru_maxrss) * 1024) + " resident (whole process)"}};
  if (peak > 0)
    rows.push_back({"matmul peak", fmt(peak, 1, false) + " GFLOP/s (f32 2048^3 oneDNN matmul, measured now) -> " +
                                       fmt(100.0 * rate / peak, 1, false) + " % of peak"});
  std::printf("%s", table(rows, 0).c_str());
  if (!a.json.empty()) {
    const nlohmann::json j = {{"model", name},
                              {"file", a.file},
                              {"dtype", dtype_name(e.model.dtype)},
                              {"batch", B},
                              {"rows", plan.rows},
                              {"threads", ri.threads},
                              {"isa", ri.isa},
                              {"reps", reps},
                              {"median_s", med},
                              {"times_s", times},
                              {"items_per_s", static_cast<double>(B) / med},
                              {"gflop_per_batch", gflop},
                              {"gflops", rate},
                              {"peak_gflops", peak},
                              {"fraction_of_peak", peak > 0 ? rate / peak : 0.0},
                              {"max_rss_bytes", static_cast<int64_t>(ru.ru_maxrss) * 1024}};
    if (Status st = write_file_atomic(a.json, j.dump(2) + "\n"); !st.ok()) {
      std::fprintf(stderr, "tessera bench: %s\n", st.message().c_str());
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace

void add_bench_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time a model's forward pass and compare with the machine's matmul peak; or, with --plugins, time "
      "the modality plugins' front ends on real files");
  CLI::Option* file = cmd->add_option("file", args->file, "experiment YAML (not with --plugins)");
  auto* batch = cmd->add_option("--batch", args->batch, "items per batch (default: bench.batch)");
  auto* seq_len = cmd->add_option("--seq-len", args->seq_len, "input rows per item (default: bench.seq_len)");
  cmd->add_option("--reps", args->reps, "timed runs (default: bench.reps; --plugins: 20 passes)");
  cmd->add_option("--warmup", args->warmup,
                  "untimed runs first (default: bench.warmup; --plugins: 2 passes)");
  auto* threads = cmd->add_option("--threads", args->threads,
                                  "intra-op threads (default: runtime.threads; 0 = all cores)");
  auto* seed = cmd->add_option("--seed", args->seed, "seed of the random input")->capture_default_str();
  auto* no_peak = cmd->add_flag("--no-peak", args->no_peak, "skip measuring the matmul peak");
  cmd->add_option("--json", args->json, "also write the figures to this file as one JSON object");
  auto* set = cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  PluginBenchArgs& p = args->plugin_args;
  p.data_dir = default_bench_data_dir();
  cmd->add_flag("--plugins", args->plugins,
                "time the built-in plugins' front ends (image, audio, protein, text) on one thread instead "
                "of a model")
      ->excludes(file, batch, seq_len, threads, seed, no_peak, set);
  cmd->add_option(
      "--input", p.inputs,
      "--plugins: ROLE=PATH, read PATH instead of the default file of ROLE (repeatable); roles: image, "
      "audio (a file or a folder), protein (FASTA), text (lines), gpt2-vocab, gpt2-merges, bert-vocab");
  cmd->add_option("--only", p.only,
                  "--plugins: run only these cases or plugins (image, audio, audio/whisper, text/bpe, ...; "
                  "repeatable)")
      ->delimiter(',');
  cmd->add_option("--data", p.data_dir,
                  "--plugins: folder of the default inputs, laid out like the sources' tests/data")
      ->capture_default_str();
  cmd->callback([args, run] { *run = [args] { return run_bench(*args); }; });
}

}  // namespace tessera::cli
