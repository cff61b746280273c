// `tessera bench`: time a model's forward pass on random inputs of a chosen shape — warm-up, then
// the median of N runs — and relate it to this machine's f32 matmul peak, measured in the same
// run, and with its FMA peak (a register-only loop) and memory bandwidth (bench_machine.h); for
// causal language models also generation with the KV cache: the input as a prompt (prefill), then
// tokens one at a time (decode), and the decode's bound from the memory bandwidth (every weight
// byte a step reads / bytes per second). Each figure comes with the spread of its runs (slowest /
// fastest), and a warning line when that passes kSpreadLimit: on a busy machine the runs of one
// figure can spread 2-5x, and a median or a % of peak taken from them means little. A benchmark,
// not a test: figures go to stdout (and --json), nothing is asserted.
// `tessera bench --plugins` times the modality plugins' front ends instead (cmd_bench_plugins.cpp).
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench_attention.h"
#include "bench_machine.h"
#include "bench_plugins.h"
#include "bench_train.h"
#include "commands.h"
#include "common.h"
#include "tessera/fileio.h"
#include "tessera/generate.h"
#include "tessera/random.h"

namespace tessera::cli {

namespace {

struct BenchArgs {
  std::string file, json;
  std::vector<std::string> overrides;
  int64_t batch = 0, seq_len = 0, decode = 128;
  int reps = 0, warmup = -1, threads = -1;
  bool no_peak = false;
  uint64_t seed = 0;
  bool plugins = false;
  bool train = false;  // --train: the training loop (cmd_bench_train.cpp)
  PluginBenchArgs plugin_args;  // --input, --only, --data
  AttentionBenchArgs attention;  // --attention N and its options
};

struct MatmulPeak {
  double gflops = 0;  // from the median run
  Spread seconds;     // of the 5 runs
};

// This machine's f32 matmul rate now: a 2048³ oneDNN matmul, median of 5 after one warm-up.
MatmulPeak measure_matmul_peak() {
  const int64_t n = 2048;
  Tensor a = Tensor::empty({n, n}), b = Tensor::empty({n, n}), c = Tensor::empty({n, n});
  Rng rng(1);
  fill_uniform(a, rng, -1, 1);
  fill_uniform(b, rng, -1, 1);
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!ops::matmul(a, b, c).ok()) return {};
    if (i > 0) t.push_back(seconds_since(t0));
  }
  MatmulPeak p;
  p.seconds = spread_of(t);
  p.gflops = 2.0 * n * n * n / p.seconds.median / 1e9;
  return p;
}

// "min 1.2 ms, max 1.5 ms, spread 1.25x (slowest / fastest)" of runs in seconds.
std::string min_max_text(const Spread& s, double scale, const char* unit) {
  return "min " + fmt(s.min * scale, 2, false) + " " + unit + ", max " + fmt(s.max * scale, 2, false) + " " +
         unit + ", " + spread_text(s) + " (slowest / fastest)";
}

// Generation's two phases with the KV cache, each rep on a fresh cache: the batch's rows as prompts
// in one forward (prefill), then `n` steps of one new row per sequence, each the greedy pick of the
// step before (decode). Seconds per rep of each phase in *prefill and *decode.
Status time_generation(const Model& m, const Batch& batch, int64_t n, int warmup, int reps, bool reference,
                       std::vector<double>* prefill, std::vector<double>* decode) {
  const int64_t B = batch.batch_size(), T = batch.seq_len(), V = m.config().stem.vocab_size;
  Result<KVCache> cache = KVCache::create(m, B, T + n);
  if (!cache.ok()) return cache.status();
  ForwardOptions o;
  o.reference = reference;
  o.cache = &*cache;
  o.last_logits = true;
  Outputs out;
  Batch step;
  step.ids = Tensor::empty({B, 1}, DType::i32);
  for (int i = 0; i < warmup + reps; ++i) {
    cache->clear();
    auto t0 = std::chrono::steady_clock::now();
    TSR_RETURN_IF_ERROR(m.forward(batch, o, &out));
    const double p = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t b = 0; b < B; ++b) {
        const float* l = out.logits.data<float>() + b * V;
        step.ids.data<int32_t>()[b] = static_cast<int32_t>(std::max_element(l, l + V) - l);
      }
      TSR_RETURN_IF_ERROR(m.forward(step, o, &out));
    }
    if (i >= warmup) {
      prefill->push_back(p);
      decode->push_back(seconds_since(t0));
    }
  }
  return Status::Ok();
}

int run_bench(const BenchArgs& a) {
  if (a.plugins) {
    PluginBenchArgs p = a.plugin_args;
    p.json = a.json;
    if (a.reps > 0) p.reps = a.reps;
    if (a.warmup >= 0) p.warmup = a.warmup;
    return run_plugin_bench(p);
  }
  if (a.train) {
    if (a.file.empty()) {
      std::fprintf(stderr, "tessera bench --train: give the experiment YAML whose training to time\n");
      return kExitBadInput;
    }
    TrainBenchArgs t;
    t.file = a.file;
    t.json = a.json;
    t.overrides = a.overrides;
    t.threads = a.threads;
    if (a.reps > 0) t.reps = a.reps;
    if (a.warmup >= 0) t.warmup = a.warmup;
    return run_train_bench(t);
  }
  if (a.attention.n > 0) {
    AttentionBenchArgs t = a.attention;
    t.json = a.json;
    if (a.reps > 0) t.reps = a.reps;
    if (a.warmup >= 0) t.warmup = a.warmup;
    if (a.threads >= 0) t.threads = a.threads;
    return run_attention_bench(t);
  }
  if (a.file.empty()) {
    std::fprintf(stderr,
                 "tessera bench: give an experiment YAML to time its model, or --plugins to time the "
                 "modality plugins' front ends\n");
    return kExitBadInput;
  }
  std::vector<std::string> overrides = a.overrides;
  if (a.threads >= 0) overrides.push_back("runtime.threads=" + std::to_string(a.threads));
  const auto t_load = std::chrono::steady_clock::now();  // load: config, weights (mmap), packing
  std::optional<Loaded> L = load_and_build(a.file, overrides, a.seq_len, a.batch);
  if (!L) return load_failure_exit_code();
  const double ready = seconds_since(t_load);
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
  double first = 0;  // the first forward, primitives created on the way
  for (int i = 0; i < warmup + reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (Status st = L->model.forward(batch, opt, &out); !st.ok()) {
      std::fprintf(stderr, "tessera bench: %s\n", st.message().c_str());
      return kExitFailure;
    }
    if (i >= warmup) times.push_back(seconds_since(t0));
    if (i == 0) first = seconds_since(t0);
  }
  const Spread forward = spread_of(times);
  const double med = forward.median;
  const double gflop = plan.flops_per_item * static_cast<double>(B) * 1e-9;
  const double rate = gflop / med;
  // The process's peak memory before the peaks' own buffers (512 MiB for the bandwidth).
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const RuntimeInfo ri = runtime_info();
  const MatmulPeak matmul = a.no_peak ? MatmulPeak{} : measure_matmul_peak();
  const double peak = matmul.gflops;
  FmaPeak fma, fma1;
  Bandwidth bw;
  if (!a.no_peak) {
    fma = measure_fma_peak(ri.threads);
    fma1 = ri.threads == 1 ? fma : measure_fma_peak(1);
    bw = measure_bandwidth(ri.threads);
  }

  const std::string name = e.model.name.empty() ? a.file : e.model.name;
  std::vector<std::vector<std::string>> rows = {
      {"model", name + ": " + fmt_count(static_cast<double>(plan.parameters)) + " parameters, " +
                    dtype_name(e.model.dtype) + ", " + std::to_string(e.model.n_layers) +
                    " layers, d_model " + std::to_string(e.model.d_model) + ", " +
                    std::to_string(e.model.n_heads) + " heads"},
      {"input", "batch " + std::to_string(B) + " x " + std::to_string(plan.rows) + " rows (random, seed " +
                    std::to_string(a.seed) + ")"},
      {"runtime",
       std::to_string(ri.threads) + " threads, oneDNN " + ri.onednn_version + ", " + ri.isa +
           (e.model.dtype == DType::bf16 ? (ri.native_bf16 ? ", native bf16" : ", bf16 emulated in f32")
                                         : "") +
           (opt.reference ? ", REFERENCE loops" : "")},
      {"latency", "median " + fmt(med * 1e3, 2, false) + " ms, " + min_max_text(forward, 1e3, "ms") + "  (" +
                      std::to_string(reps) + " runs after " + std::to_string(warmup) + " warm-up)"},
      {"throughput", fmt(static_cast<double>(B) / med, 2, false) + " items/s, " +
                         fmt(static_cast<double>(B * plan.rows) / med, 0, false) + " rows/s"},
      {"compute", fmt(gflop, 2, false) + " GFLOP per batch, " + fmt(rate, 1, false) + " GFLOP/s"},
      {"load", fmt(ready + first, 3, false) + " s to the end of the first forward: " + fmt(ready, 3, false) +
                   " s config, weights and packing, then " + fmt(first, 3, false) + " s the first forward"},
      {"peak memory", fmt_bytes(static_cast<double>(ru.ru_maxrss) * 1024) + " resident (whole process)"}};
  // Every figure's spread; the warnings go under the table (and into --json).
  std::vector<std::string> warnings;
  auto check = [&warnings](const std::string& figure, const Spread& s) {
    if (std::string w = spread_warning(figure, s); !w.empty()) warnings.push_back(std::move(w));
  };
  check("the forward pass (latency, throughput, compute, % of peak)", forward);
  const Spread fma_spread = spread_of(fma.trials), bw_spread = spread_of(bw.read_trials);
  if (peak > 0) {
    rows.push_back({"matmul peak", fmt(peak, 1, false) + " GFLOP/s (f32 2048^3 oneDNN matmul, median of 5, " +
                                       spread_text(matmul.seconds) + ", measured now) -> " +
                                       fmt(100.0 * rate / peak, 1, false) + " % of peak"});
    check("the matmul peak", matmul.seconds);
  }
  if (fma.gflops > 0) {
    rows.push_back({"FMA peak", fmt(fma.gflops, 1, false) + " GFLOP/s on " + std::to_string(fma.threads) +
                                    " threads, " + fmt(fma1.gflops, 1, false) + " on 1 (f32 " + fma.isa +
                                    ", register-only loop, " + std::to_string(fma.accumulators) +
                                    " accumulators, best of 5, " + spread_text(fma_spread) + ") -> " +
                                    fmt(100.0 * rate / fma.gflops, 1, false) + " % of peak"});
    check("the FMA peak", fma_spread);
  }
  if (bw.read_gbs > 0) {
    rows.push_back({"memory bandwidth", "read " + fmt(bw.read_gbs, 1, false) + " GB/s, triad " +
                                            fmt(bw.triad_gbs, 1, false) + " GB/s (" +
                                            fmt_bytes(static_cast<double>(bw.bytes)) + ", " +
                                            std::to_string(bw.threads) + " threads, best of 5, read " +
                                            spread_text(bw_spread) + ")"});
    check("the memory bandwidth", bw_spread);
  }
  // Generation (causal language models): prefill, then decode with the KV cache.
  std::vector<double> prefill, decode;
  int64_t n = a.decode;
  const bool generative = e.model.head.kind == HeadKind::lm && e.model.causal && n > 0;
  if (generative) {
    const bool limited =
        e.model.positions.kind == PositionKind::learned || e.model.positions.kind == PositionKind::sinusoidal;
    if (limited && T + n > e.model.positions.max_len) n = std::max<int64_t>(0, e.model.positions.max_len - T);
    if (n == 0) {
      std::fprintf(stderr, "tessera bench: no room to decode after %lld rows (positions.max_len %lld)\n",
                   static_cast<long long>(T), static_cast<long long>(e.model.positions.max_len));
    } else if (Status st = time_generation(L->model, batch, n, warmup, reps, opt.reference, &prefill, &decode);
               !st.ok()) {
      std::fprintf(stderr, "tessera bench: generation: %s\n", st.message().c_str());
      return kExitFailure;
    }
  }
  // A decode step reads every weight once for the batch's B new tokens: as bf16 where oneDNN has
  // bf16 kernels or the bf16 GEMV streams them (B <= Linear::gemv_max_rows()), else as f32.
  const bool bf16_weights =
      e.model.dtype == DType::bf16 && (ri.native_bf16 || B <= Linear::gemv_max_rows());
  const int64_t step_bytes = decode_weight_bytes_per_step(L->model, B, bf16_weights);
  const double bound = bw.read_gbs > 0 ? static_cast<double>(B) * bw.read_gbs * 1e9 / static_cast<double>(step_bytes) : 0.0;
  const Spread prefill_spread = spread_of(prefill), decode_spread = spread_of(decode);
  if (!prefill.empty()) {
    const double p = prefill_spread.median, d = decode_spread.median;
    rows.push_back({"prefill", std::to_string(T) + " tokens x batch " + std::to_string(B) +
                                   " into a KV cache: median " + fmt(p * 1e3, 2, false) + " ms, " +
                                   fmt(static_cast<double>(B * T) / p, 0, false) + " tokens/s; " +
                                   min_max_text(prefill_spread, 1e3, "ms")});
    rows.push_back({"decode", std::to_string(n) + " tokens one at a time after them (greedy): median " +
                                  fmt(d * 1e3 / static_cast<double>(n), 2, false) + " ms per step, " +
                                  fmt(static_cast<double>(B * n) / d, 1, false) + " tokens/s; " +
                                  min_max_text(decode_spread, 1e3 / static_cast<double>(n), "ms")});
    check("prefill", prefill_spread);
    check("decode (tokens/s, % of the bound)", decode_spread);
    if (bw.read_gbs > 0)
      rows.push_back({"decode bound", fmt_bytes(static_cast<double>(step_bytes)) +
                                          (bf16_weights ? " of weights (bf16)" : " of weights") + " read per step / " + fmt(bw.read_gbs, 1, false) +
                                          " GB/s read -> at most " + fmt(bound, 1, false) +
                                          " tokens/s; decode at " +
                                          fmt(100.0 * static_cast<double>(B * n) / d / bound, 1, false) +
                                          " % of it (KV-cache reads not counted)"});
  }
  std::printf("%s", table(rows, 0).c_str());
  for (const std::string& w : warnings) std::printf("%s\n", w.c_str());
  if (!a.json.empty()) {
    nlohmann::json j = {{"model", name},
                        {"file", a.file},
                        {"dtype", dtype_name(e.model.dtype)},
                        {"batch", B},
                        {"rows", plan.rows},
                        {"threads", ri.threads},
                        {"isa", ri.isa},
                        {"reps", reps},
                        {"median_s", med},
                        {"min_s", forward.min},
                        {"max_s", forward.max},
                        {"spread", forward.ratio()},
                        {"spread_limit", kSpreadLimit},
                        {"warnings", warnings},
                        {"times_s", times},
                        {"items_per_s", static_cast<double>(B) / med},
                        {"gflop_per_batch", gflop},
                        {"gflops", rate},
                        {"peak_gflops", peak},
                        {"matmul_peak_gflops", peak},
                        {"fraction_of_peak", peak > 0 ? rate / peak : 0.0},
                        {"matmul_peak_spread", matmul.seconds.ratio()},
                        {"load_s", ready + first},
                        {"load_ready_s", ready},
                        {"first_forward_s", first},
                        {"max_rss_bytes", static_cast<int64_t>(ru.ru_maxrss) * 1024}};
    if (fma.gflops > 0) {
      j["fma_isa"] = fma.isa;
      j["fma_peak_gflops"] = fma.gflops;
      j["fma_peak_gflops_1thread"] = fma1.gflops;
      j["fraction_of_fma_peak"] = rate / fma.gflops;
      j["fma_peak_spread"] = fma_spread.ratio();
    }
    if (bw.read_gbs > 0) {
      j["bandwidth_read_gbs"] = bw.read_gbs;
      j["bandwidth_triad_gbs"] = bw.triad_gbs;
      j["bandwidth_bytes"] = bw.bytes;
      j["bandwidth_spread"] = bw_spread.ratio();
    }
    if (!prefill.empty()) {
      j["prefill_tokens"] = T;
      j["prefill_times_s"] = prefill;
      j["prefill_spread"] = prefill_spread.ratio();
      j["prefill_tokens_per_s"] = static_cast<double>(B * T) / prefill_spread.median;
      j["decode_tokens"] = n;
      j["decode_times_s"] = decode;
      j["decode_spread"] = decode_spread.ratio();
      j["decode_tokens_per_s"] = static_cast<double>(B * n) / decode_spread.median;
      j["decode_weight_bytes_per_step"] = step_bytes;
      if (bound > 0) {
        j["decode_bound_tokens_per_s"] = bound;
        j["decode_fraction_of_bound"] = static_cast<double>(B * n) / decode_spread.median / bound;
      }
    }
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
      "Time a model's forward pass and compare with the machine's matmul and FMA peaks and memory bandwidth; or, with --plugins, time "
      "the modality plugins' front ends on real files");
  CLI::Option* file = cmd->add_option("file", args->file, "experiment YAML (not with --plugins)");
  auto* batch = cmd->add_option("--batch", args->batch, "items per batch (default: bench.batch)")
                    ->check(CLI::Range(int64_t{1}, limits::kBatch));
  auto* seq_len = cmd->add_option("--seq-len", args->seq_len, "input rows per item (default: bench.seq_len)")
                      ->check(CLI::Range(int64_t{1}, limits::kSequence));
  cmd->add_option("--reps", args->reps, "timed runs (default: bench.reps; --plugins: 20 passes)")
      ->check(CLI::Range(1, static_cast<int>(limits::kRepeats)));
  cmd->add_option("--warmup", args->warmup, "untimed runs first (default: bench.warmup; --plugins: 2 passes)")
      ->check(CLI::Range(0, static_cast<int>(limits::kRepeats)));
  auto* threads = cmd->add_option("--threads", args->threads,
                                  "intra-op threads (default: runtime.threads; 0 = all cores)")
                      ->check(CLI::Range(0, static_cast<int>(limits::kThreads)));
  auto* seed = cmd->add_option("--seed", args->seed, "seed of the random input")->capture_default_str();
  auto* no_peak = cmd->add_flag("--no-peak", args->no_peak, "skip measuring the machine's peaks (matmul, FMA, memory bandwidth)");
  auto* decode =
      cmd->add_option("--decode", args->decode,
                      "causal language models: also time generation with the KV cache, the input as "
                      "the prompt, then this many tokens one at a time (0: skip)")
          ->check(CLI::Range(int64_t{0}, limits::kSequence))
          ->capture_default_str();
  cmd->add_option("--json", args->json, "also write the figures to this file as one JSON object");
  auto* set = cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  PluginBenchArgs& p = args->plugin_args;
  p.data_dir = default_bench_data_dir();
  cmd->add_flag("--plugins", args->plugins,
                "time the built-in plugins' front ends (image, audio, protein, text) on one thread instead "
                "of a model")
      ->excludes(file, batch, seq_len, threads, seed, no_peak, set, decode);
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
  cmd->add_flag("--train", args->train,
                "time the experiment's training loop instead (tessera train's own steps on its data: "
                "examples/s, GFLOP/s, peak memory; --reps steps after --warmup, default 20 after 3)")
      ->excludes(batch, seq_len, seed, no_peak, decode);
  AttentionBenchArgs& t = args->attention;
  cmd->add_option("--attention", t.n,
                  "time one attention op over this many rows instead of a model (default 1 thread; "
                  "see --head-dim, --heads, --causal, --materialised)")
      ->check(CLI::Range(int64_t{1}, limits::kSequence))
      ->excludes(file, batch, seq_len, set, decode);
  cmd->add_option("--head-dim", t.head_dim, "--attention: d_k = d_v")
      ->check(CLI::Range(int64_t{1}, limits::kWidth))
      ->capture_default_str();
  cmd->add_option("--heads", t.heads, "--attention: heads")
      ->check(CLI::Range(int64_t{1}, limits::kHeads))
      ->capture_default_str();
  cmd->add_flag("--causal", t.causal, "--attention: causal mask");
  cmd->add_flag("--materialised", t.materialised,
                "--attention: store the (N, N) scores (matmul, softmax, matmul) instead of the fused kernel");
  cmd->callback([args, run] { *run = [args] { return run_bench(*args); }; });
}

}  // namespace tessera::cli
