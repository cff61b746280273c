// `tessera bench --train`: the training loop's speed and memory on the experiment's own data. It
// runs `tessera train` itself (the same data order, augmentation, micro-batches, clipping and
// optimizer) in a throw-away run folder for warm-up + reps + 1 optimizer steps and times each
// step from the loop's own step callback, so what is timed is exactly what a user's training run
// does per step: batching, forward, backward, clipping, the optimizer update and the metrics line.
// Not timed: the start-up encoding of the data set, the evaluation after the last step (its step
// is dropped) and the test set (skipped). Figures: median examples/s (and tokens/s for language
// models) with the spread of the steps, GFLOP/s from the plan, and the process's peak resident
// memory (the encoded data set included).
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "bench_machine.h"
#include "bench_train.h"
#include "common.h"
#include "tessera/fileio.h"
#include "tessera/model.h"
#include "tessera/ops.h"
#include "tessera/train.h"

namespace tessera::cli {

namespace fs = std::filesystem;

namespace {

// A run folder of our own under the system's temporary folder, removed when done.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    std::random_device rd;
    const fs::path base = fs::temp_directory_path();
    for (int i = 0; i < 100 && path.empty(); ++i) {
      const fs::path p = base / ("tessera-bench-train-" + std::to_string(rd()));
      std::error_code ec;
      if (fs::create_directory(p, ec)) path = p.string();
    }
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

}  // namespace

int run_train_bench(const TrainBenchArgs& a) {
  std::vector<std::string> overrides = a.overrides;
  if (a.threads >= 0) overrides.push_back("runtime.threads=" + std::to_string(a.threads));
  std::optional<Experiment> exp = load(a.file, overrides);
  if (!exp) return kExitBadInput;
  if (exp->train.baseline != Baseline::none) {
    std::fprintf(stderr, "tessera bench --train: %s: train.baseline is set; a baseline has no training loop to time\n",
                 a.file.c_str());
    return kExitBadInput;
  }
  if (a.reps < 2 || a.warmup < 0) {
    std::fprintf(stderr, "tessera bench --train: --reps must be at least 2 and --warmup at least 0\n");
    return kExitBadInput;
  }
  if (exp->runtime.threads > 0) set_num_threads(exp->runtime.threads);
  TrainConfig& tc = exp->train;
  // The first step is never timed (its interval has no start; it creates the primitives), so at
  // least one warm-up step. Then reps timed steps and 1 more, whose interval holds the final
  // evaluation; no evaluation before, no test set, no early stop.
  const int warmup = std::max(a.warmup, 1);
  tc.max_steps = warmup + a.reps + 1;
  tc.max_minutes = 0;
  tc.epochs = 1;
  tc.eval_every = tc.max_steps;
  tc.patience = 0;
  tc.test_data.clear();
  tc.test_labels.clear();
  tc.log_every = std::max<int64_t>(tc.log_every, 1);
  ScratchDir scratch;
  if (scratch.path.empty()) {
    std::fprintf(stderr, "tessera bench --train: cannot make a run folder under %s\n",
                 fs::temp_directory_path().string().c_str());
    return kExitFailure;
  }
  std::vector<std::chrono::steady_clock::time_point> at;  // at[i]: step i done (at[0]: the loop's first callback)
  at.reserve(static_cast<size_t>(tc.max_steps) + 1);
  TrainOptions opt;
  opt.out_dir = scratch.path;
  opt.progress = false;
  opt.on_step = [&at](int64_t) { at.push_back(std::chrono::steady_clock::now()); };
  const auto t0 = std::chrono::steady_clock::now();
  Result<TrainSummary> r = train_experiment(*exp, opt);
  if (!r.ok()) {
    std::fprintf(stderr, "tessera bench --train: %s\n", r.status().message().c_str());
    return r.status().code() == Code::invalid_argument ? kExitBadInput : kExitFailure;
  }
  const double wall = seconds_since(t0);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  // at[i] is step i + 1's end, so step i + 1 took at[i] - at[i-1]: steps warmup + 1 .. warmup +
  // reps are i = warmup .. warmup + reps - 1, and the last step (the evaluation's) is left out.
  std::vector<double> times;
  for (size_t i = static_cast<size_t>(warmup); i + 1 < at.size() && times.size() < static_cast<size_t>(a.reps); ++i)
    times.push_back(std::chrono::duration<double>(at[i] - at[i - 1]).count());
  if (times.size() < 2) {
    std::fprintf(stderr, "tessera bench --train: the run stopped after %zu steps; nothing to time\n", at.size());
    return kExitFailure;
  }
  const Spread s = spread_of(times);
  const bool lm = exp->model.head.kind == HeadKind::lm;
  const int64_t B = tc.batch_size;
  // The rows a training example gives the model; the plan counts a CLS stem's rows on top of the
  // input's, but training's examples carry their CLS rows already (the stem fills them in).
  const int64_t rows = lm ? tc.seq_len : std::llround(r->input_rows);
  const int64_t stem_rows = make_plan(exp->model, 1).rows - 1;
  // A training step costs about 3 forwards (the backward forms two products per forward one).
  const Plan plan = make_plan(exp->model, lm ? rows : std::max<int64_t>(1, rows - stem_rows));
  const double gflop = 3.0 * plan.flops_per_item * static_cast<double>(B) * 1e-9;
  const RuntimeInfo ri = runtime_info();
  const std::string name = exp->model.name.empty() ? a.file : exp->model.name;
  const double ex_s = static_cast<double>(B) / s.median;
  std::vector<std::vector<std::string>> table_rows = {
      {"model", name + ": " + std::to_string(exp->model.n_layers) + " layers, d_model " +
                    std::to_string(exp->model.d_model) + ", " + std::to_string(exp->model.n_heads) + " heads, d_ff " +
                    std::to_string(exp->model.d_ff) + ", " + fmt_count(static_cast<double>(plan.parameters)) +
                    " parameters"},
      {"training", std::string(lm ? "next-token LM, " : "classifier, ") + "batch " + std::to_string(B) +
                       (tc.accumulate > 1 ? " (" + std::to_string(tc.accumulate) + " micro-batches)" : "") + " x " +
                       std::to_string(plan.rows) + " rows, " +
                       (tc.optimizer == OptimizerKind::sgd ? "SGD" : "AdamW")},
      {"runtime", std::to_string(ri.threads) + " threads, oneDNN " + ri.onednn_version + ", " + ri.isa},
      {"step", "median " + fmt(s.median * 1e3, 1, false) + " ms, min " + fmt(s.min * 1e3, 1, false) + " ms, max " +
                   fmt(s.max * 1e3, 1, false) + " ms, " + spread_text(s) + " (" + std::to_string(times.size()) +
                   " steps after " + std::to_string(warmup) + " warm-up)"},
      {"throughput", fmt(ex_s, 1, false) + " examples/s" +
                         (lm ? ", " + fmt(ex_s * static_cast<double>(tc.seq_len), 0, false) + " tokens/s" : "")},
      {"compute", fmt(gflop, 2, false) + " GFLOP per step (3 x the forward's), " + fmt(gflop / s.median, 1, false) +
                      " GFLOP/s"},
      {"peak memory", fmt_bytes(static_cast<double>(ru.ru_maxrss) * 1024) +
                          " resident (whole process, the encoded data set included)"},
      {"wall", fmt(wall, 1, false) + " s in all (data encoding and the last evaluation included)"}};
  std::printf("%s", table(table_rows, 0).c_str());
  if (std::string w = spread_warning("the training steps", s); !w.empty()) std::printf("%s\n", w.c_str());
  if (!a.json.empty()) {
    nlohmann::json j = {{"model", name},
                        {"file", a.file},
                        {"mode", "train"},
                        {"batch", B},
                        {"rows", plan.rows},
                        {"parameters", plan.parameters},
                        {"threads", ri.threads},
                        {"isa", ri.isa},
                        {"warmup", warmup},
                        {"times_s", times},
                        {"median_s", s.median},
                        {"min_s", s.min},
                        {"max_s", s.max},
                        {"spread", s.ratio()},
                        {"examples_per_s", ex_s},
                        {"gflop_per_step", gflop},
                        {"gflops", gflop / s.median},
                        {"max_rss_bytes", static_cast<int64_t>(ru.ru_maxrss) * 1024},
                        {"wall_s", wall}};
    if (lm) j["tokens_per_s"] = ex_s * static_cast<double>(tc.seq_len);
    if (Status st = write_file_atomic(a.json, j.dump(2) + "\n"); !st.ok()) {
      std::fprintf(stderr, "tessera bench --train: %s\n", st.message().c_str());
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace tessera::cli
