// `tessera drift`: how far bf16 compute moves a model's numbers. The model is built twice from one
// experiment: the baseline with model.dtype f32 and the candidate with model.dtype bf16 (everything
// else identical, the same weights). The same inputs go through both: random ones of a chosen shape
// by default (as `tessera bench` makes them), or --ids / --rows (as `tessera forward` takes them).
// For every block's output and for the outputs the model has (final hidden rows, pooled vector,
// logits) it prints the largest absolute difference, the relative L2 error ‖bf16 − f32‖ / ‖f32‖,
// the smallest cosine of a row, and for logits the share of rows whose argmax agrees; the outputs
// are checked against the tolerances below (docs/PRECISION.md explains them).
// Exit codes: 0 every output within tolerance, 3 some output beyond it (kExitDriftTooLarge), and as
// every command 1 a failure while running, 2 bad input.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "tessera/fileio.h"
#include "tessera/machine.h"

namespace tessera::cli {

namespace {

// ---------------------------------------------------------------------------------------------
// The tolerances: the one place they are written down (docs/PRECISION.md gives them with the
// measurements behind them). bf16 keeps 8 significant bits, so rounding a value to bf16 moves it by
// at most the unit roundoff u = 2^-9 ≈ 0.2 % of itself (u/√3 rms). A bf16 Linear rounds its input
// rows and its weights and accumulates in f32, so each of its outputs moves by about u·√(2/3)
// relative, rms; a block chains several such layers through norms and residual sums, and the
// drift grows slowly with depth. Measured: 0.3–1.3 % relative L2 at the final outputs of MiniLM
// (real weights), the five HF fixture families and the ViT-B/16-, BERT-base- and GPT-2-small-shaped
// bench models, every row's cosine ≥ 0.9997. The limits leave at least 4× that as margin; another
// model (other weights), or every weight 5 % off, fails.

constexpr int kExitDriftTooLarge = 3;  // some output beyond its tolerance

constexpr double kUnitRoundoff = 1.0 / 512;  // 2^-9: bf16's 8-bit significand, round to nearest

struct Tolerance {
  double rel_l2;      // ‖candidate − baseline‖ / ‖baseline‖ over the whole tensor, at most
  double min_cosine;  // cos(candidate row, baseline row) of every row (last dimension), at least
  double top1;        // logits: share of rows whose argmax agrees, at least; a row whose argmax differs
                      // still counts when its two picks are a near tie in f32: within rel_l2 × the
                      // row's f32 rms of each other, so that a drift within tolerance may swap them
};

// Final hidden rows, pooled vectors and logits: 25 u ≈ 4.9 % relative L2, cosine 0.99, 90 % top-1.
constexpr Tolerance kOutputTolerance = {25 * kUnitRoundoff, 0.99, 0.90};

// ---------------------------------------------------------------------------------------------

struct DriftArgs {
  std::string file, ids, rows, json, candidate = "bf16";
  std::vector<std::string> overrides, candidate_overrides;
  int64_t batch = 0, seq_len = 0;
  uint64_t seed = 0;
  bool reference = false;
};

// How far one tensor moved.
struct Drift {
  std::string name;
  bool output = false;  // an output (checked), else a layer (reported)
  bool logits = false;
  Shape shape;
  int64_t rows = 0;  // vectors along the last dimension
  double max_abs = 0, rel_l2 = 0, min_cos = 1, mean_cos = 1, base_rms = 0;
  int64_t worst_row = 0;             // the row of min_cos
  double top1 = -1;                  // logits: share of rows whose argmax agrees
  int64_t top1_rows = 0;             // ... how many
  int64_t near_ties = 0;             // rows whose argmax differs, but between a near tie in f32
  std::vector<std::string> failures;  // "rel L2 12.3 % > 4.88 %", empty when within tolerance
};

std::string sig(double v, int digits = 3) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}
std::string pct(double v, int digits = 3) { return sig(100.0 * v, digits) + " %"; }
// Cosines near 1 read best as 1 − ε: "0.999987"; exactly 1 as "1".
std::string cosine(double c) { return c == 1.0 ? "1" : std::isnan(c) ? "nan" : fmt(c, 6, false); }

// NaN anywhere makes every figure NaN (so it fails every tolerance) rather than being skipped.
// tie: the near-tie gap, relative to a row's f32 rms (see Tolerance::top1).
Drift compare(const std::string& name, const Tensor& base_t, const Tensor& cand_t, double tie) {
  Drift d;
  d.name = name;
  d.shape = base_t.shape();
  const Tensor a = base_t.to(DType::f32), b = cand_t.to(DType::f32);
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  const int64_t n = a.numel(), width = a.rank() > 0 ? a.dim(-1) : 1;
  d.rows = width > 0 ? n / width : 0;
  double diff2 = 0, base2 = 0, sum_cos = 0;
  int64_t agree = 0, near_ties = 0;
  for (int64_t r = 0; r < d.rows; ++r) {
    const float* xr = x + r * width;
    const float* yr = y + r * width;
    double xx = 0, yy = 0, xy = 0, dd = 0;
    int64_t ax = 0, ay = 0;
    for (int64_t c = 0; c < width; ++c) {
      const double u = xr[c], v = yr[c], e = v - u;
      xx += u * u;
      yy += v * v;
      xy += u * v;
      dd += e * e;
      if (!(std::fabs(e) <= d.max_abs)) d.max_abs = std::fabs(e);  // NaN sticks
      if (xr[c] > xr[ax]) ax = c;
      if (yr[c] > yr[ay]) ay = c;
    }
    diff2 += dd;
    base2 += xx;
    // Two zero rows agree; a zero row and a non-zero one point nowhere alike.
    const double cs = xx == 0 && yy == 0 ? 1.0 : xx == 0 || yy == 0 ? 0.0 : xy / std::sqrt(xx * yy);
    sum_cos += cs;
    if (!(cs >= d.min_cos)) {
      d.min_cos = cs;
      d.worst_row = r;
    }
    agree += ax == ay;
    near_ties += ax != ay && xr[ax] - xr[ay] <= tie * std::sqrt(xx / static_cast<double>(width));
  }
  d.rel_l2 = base2 > 0 ? std::sqrt(diff2 / base2) : diff2 > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  if (std::isnan(diff2)) d.rel_l2 = std::numeric_limits<double>::quiet_NaN();
  d.base_rms = n > 0 ? std::sqrt(base2 / static_cast<double>(n)) : 0.0;
  d.mean_cos = d.rows > 0 ? sum_cos / static_cast<double>(d.rows) : 1.0;
  d.top1_rows = agree;
  d.near_ties = near_ties;
  d.top1 = d.rows > 0 ? static_cast<double>(agree) / static_cast<double>(d.rows) : 1.0;
  return d;
}

double top1_with_ties(const Drift& d) {
  return d.rows > 0 ? static_cast<double>(d.top1_rows + d.near_ties) / static_cast<double>(d.rows) : 1.0;
}

void check(Drift& d, const Tolerance& t) {
  if (!(d.rel_l2 <= t.rel_l2)) d.failures.push_back("rel L2 " + pct(d.rel_l2) + " > " + pct(t.rel_l2));
  if (!(d.min_cos >= t.min_cosine))
    d.failures.push_back("min cos " + cosine(d.min_cos) + " < " + cosine(t.min_cosine) + " (row " +
                         std::to_string(d.worst_row) + ")");
  if (d.logits && !(top1_with_ties(d) >= t.top1))
    d.failures.push_back("top-1 " + pct(top1_with_ties(d), 4) + (d.near_ties ? " with near ties" : "") + " < " +
                         pct(t.top1, 2));
}

std::string tolerance_text(const Drift& d, const Tolerance& t) {
  return "rel L2 <= " + pct(t.rel_l2) + ", cos >= " + cosine(t.min_cosine) +
         (d.logits ? ", top-1 >= " + pct(t.top1, 2) : "");
}

int run_drift(const DriftArgs& a) {
  const Tolerance& tol = kOutputTolerance;
  // Both sides from the same file and overrides, with model.dtype set on each side after loading
  // (so a model.dtype in the file or in --set does not matter). Without --candidate-set the
  // candidate is the baseline's very config with another dtype; --candidate-set (testing the check,
  // e.g. another init seed) loads it again with those overrides after --set's.
  std::optional<Experiment> base_e = load(a.file, a.overrides);
  if (!base_e) return kExitBadInput;
  std::optional<Experiment> cand_e = base_e;
  if (!a.candidate_overrides.empty()) {
    std::vector<std::string> ov = a.overrides;
    ov.insert(ov.end(), a.candidate_overrides.begin(), a.candidate_overrides.end());
    cand_e = load(a.file, ov);
    if (!cand_e) {
      std::fprintf(stderr,
                   "tessera drift: above, \"--set KEY=VALUE\" stands for a --set and a --candidate-set "
                   "alike: of the %zu, the last %zu are the --candidate-set values\n",
                   ov.size(), a.candidate_overrides.size());
      return kExitBadInput;
    }
  }
  base_e->model.dtype = DType::f32;
  cand_e->model.dtype = a.candidate == "bf16" ? DType::bf16 : DType::f32;
  // Two models side by side: each must fit, and both at once.
  MemoryPlan plan = memory_plan(base_e->model, a.seq_len > 0 ? a.seq_len : plan_rows(*base_e),
                                a.batch > 0 ? a.batch : base_e->bench.batch);
  plan.weights = plan.weights > INT64_MAX / 2 ? INT64_MAX : 2 * plan.weights;
  plan.total = plan.weights > INT64_MAX - plan.activations ? INT64_MAX : plan.weights + plan.activations;
  if (Status st = check_memory(plan, machine_memory()); !st.ok()) {
    std::fprintf(stderr, "tessera drift: %s: two copies of the model: %s\n", a.file.c_str(),
                 st.message().c_str());
    return kExitFailure;
  }
  set_num_threads(base_e->runtime.threads);
  Result<Model> base = Model::build(base_e->model);
  if (!base.ok()) {
    std::fprintf(stderr, "%s: %s\n", a.file.c_str(), base.status().message().c_str());
    return kExitBadInput;
  }
  Result<Model> cand = Model::build(cand_e->model);
  if (!cand.ok()) {
    std::fprintf(stderr, "%s: %s\n", a.file.c_str(), cand.status().message().c_str());
    return kExitBadInput;
  }
  const ModelConfig& mc = base_e->model;

  // The inputs: given, or random of the bench shape.
  Batch batch;
  std::string input_text;
  if (!a.ids.empty() || !a.rows.empty()) {
    std::optional<Batch> b = input_batch(*base_e, a.ids, a.rows);
    if (!b) return kExitBadInput;
    batch = std::move(*b);
    input_text = "batch " + std::to_string(batch.batch_size()) + " x " + std::to_string(batch.seq_len()) +
                 " rows (" + (a.ids.empty() ? a.rows : std::string("--ids")) + ")";
  } else {
    const int64_t B = a.batch > 0 ? a.batch : base_e->bench.batch;
    int64_t T = a.seq_len > 0 ? a.seq_len : base_e->bench.seq_len;
    // bench.seq_len defaults to the position table's length; a stem's CLS (and distillation) rows
    // come on top, so by default leave room for them.
    const bool limited = mc.positions.kind == PositionKind::learned || mc.positions.kind == PositionKind::sinusoidal;
    if (a.seq_len <= 0 && limited && base->rows_for(T) > mc.positions.max_len)
      T = std::max<int64_t>(1, T - (base->rows_for(T) - mc.positions.max_len));
    batch = random_batch(mc, B, T, a.seed);
    input_text = "batch " + std::to_string(B) + " x " + std::to_string(T) + " rows (random, seed " +
                 std::to_string(a.seed) + ")";
  }

  ForwardOptions opt;
  opt.reference = a.reference || base_e->runtime.reference;
  std::vector<std::string> layer_names = {"stem.out"};
  for (int64_t l = 0; l < mc.n_layers; ++l) layer_names.push_back("blocks." + std::to_string(l) + ".out");
  opt.capture.insert(layer_names.begin(), layer_names.end());
  Outputs base_out, cand_out;
  for (auto [m, out, side] : {std::tuple{&*base, &base_out, "f32"}, std::tuple{&*cand, &cand_out, "candidate"}})
    if (Status st = m->forward(batch, opt, out); !st.ok()) {
      std::fprintf(stderr, "tessera drift: %s (%s model): %s\n", a.file.c_str(), side, st.message().c_str());
      // Inputs that do not fit the model (ids outside the vocabulary, rows of the wrong width) are
      // bad input; anything else a failure.
      return st.code() == Code::invalid_argument || st.code() == Code::out_of_range ? kExitBadInput : kExitFailure;
    }

  // Compare: the layers, then the outputs.
  std::vector<Drift> drifts;
  auto add = [&](const std::string& name, const Tensor& x, const Tensor& y, bool output, bool logits) -> bool {
    if (!x.defined() && !y.defined()) return true;
    if (!x.defined() || !y.defined() || x.shape() != y.shape()) {
      std::fprintf(stderr, "tessera drift: %s: %s is %s on the f32 side but %s on the candidate's: the two "
                           "models do not compute the same thing (check --candidate-set)\n",
                   a.file.c_str(), name.c_str(), x.defined() ? x.describe().c_str() : "missing",
                   y.defined() ? y.describe().c_str() : "missing");
      return false;
    }
    Drift d = compare(name, x, y, tol.rel_l2);
    d.output = output;
    d.logits = logits;
    if (output) check(d, tol);
    drifts.push_back(std::move(d));
    return true;
  };
  for (const std::string& name : layer_names) {
    auto x = base_out.captured.find(name), y = cand_out.captured.find(name);
    if (!add(name, x == base_out.captured.end() ? Tensor() : x->second,
             y == cand_out.captured.end() ? Tensor() : y->second, false, false))
      return kExitFailure;
  }
  if (!add("hidden", base_out.hidden, cand_out.hidden, true, false) ||
      !add("pooled", base_out.pooled, cand_out.pooled, true, false) ||
      !add("logits", base_out.logits, cand_out.logits, true, true))
    return kExitFailure;

  // The table.
  const RuntimeInfo ri = runtime_info();
  const std::string name = mc.name.empty() ? a.file : mc.name;
  const bool bf16 = a.candidate == "bf16";
  std::string cand_text = a.candidate + (bf16 ? (ri.native_bf16 && !opt.reference ? " (native oneDNN kernels)"
                                                                                   : " (emulated: rounded, then f32 kernels)")
                                              : "");
  for (const std::string& s : a.candidate_overrides) cand_text += ", --candidate-set " + s;
  std::printf("model      %s: %lld layers, d_model %lld%s\n", name.c_str(), static_cast<long long>(mc.n_layers),
              static_cast<long long>(mc.d_model), opt.reference ? ", REFERENCE loops" : "");
  std::printf("compare    f32 (baseline) with %s\n", cand_text.c_str());
  std::printf("input      %s\n\n", input_text.c_str());
  std::vector<std::vector<std::string>> rows = {
      {"tensor", "shape", "max |diff|", "rel L2", "min cos", "top-1", "tolerance", "verdict"}};
  bool pass = true;
  for (const Drift& d : drifts) {
    if (d.output && &d == &*std::find_if(drifts.begin(), drifts.end(), [](const Drift& e) { return e.output; }))
      rows.push_back({});
    rows.push_back({d.name, d.shape.str(), sig(d.max_abs), pct(d.rel_l2), cosine(d.min_cos),
                    d.logits ? pct(d.top1, 4) + (d.near_ties ? " (" + std::to_string(d.near_ties) + " near tie" +
                                                           (d.near_ties > 1 ? "s)" : ")") : "")
                             : "", d.output ? tolerance_text(d, tol) : "",
                    d.output ? (d.failures.empty() ? "PASS" : "FAIL") : ""});
    pass = pass && d.failures.empty();
  }
  std::printf("%s", table(rows, 2).c_str());
  std::printf("\n");
  if (pass) {
    std::printf("PASS: every output within tolerance (docs/PRECISION.md)\n");
  } else {
    for (const Drift& d : drifts)
      for (const std::string& f : d.failures) std::printf("FAIL: %s: %s\n", d.name.c_str(), f.c_str());
  }

  if (!a.json.empty()) {
    nlohmann::json t = nlohmann::json::array();
    for (const Drift& d : drifts) {
      nlohmann::json j = {{"name", d.name},
                          {"kind", d.output ? "output" : "layer"},
                          {"shape", d.shape.vec()},
                          {"rows", d.rows},
                          {"max_abs_diff", d.max_abs},
                          {"rel_l2", d.rel_l2},
                          {"min_cosine", d.min_cos},
                          {"worst_row", d.worst_row},
                          {"mean_cosine", d.mean_cos},
                          {"baseline_rms", d.base_rms}};
      if (d.logits) {
        j["top1_agreement"] = d.top1;
        j["top1_rows"] = d.top1_rows;
        j["top1_near_ties"] = d.near_ties;
        j["top1_with_near_ties"] = top1_with_ties(d);
      }
      if (d.output) {
        j["pass"] = d.failures.empty();
        j["failures"] = d.failures;
      }
      t.push_back(std::move(j));
    }
    // NaN is not JSON: nlohmann writes it as null, which readers take as "no figure".
    nlohmann::json j = {{"model", name},
                        {"file", a.file},
                        {"baseline", "f32"},
                        {"candidate", a.candidate},
                        {"candidate_overrides", a.candidate_overrides},
                        {"bf16", bf16 ? (ri.native_bf16 && !opt.reference ? "native" : "emulated") : "none"},
                        {"reference", opt.reference},
                        {"isa", ri.isa},
                        {"input", input_text},
                        {"batch", batch.batch_size()},
                        {"seq_len", batch.seq_len()},
                        {"seed", a.seed},
                        {"unit_roundoff", kUnitRoundoff},
                        {"tolerances", {{"rel_l2", tol.rel_l2}, {"min_cosine", tol.min_cosine}, {"top1", tol.top1}}},
                        {"tensors", t},
                        {"pass", pass}};
    if (Status st = write_file_atomic(a.json, j.dump(2) + "\n"); !st.ok()) {
      std::fprintf(stderr, "tessera drift: %s\n", st.message().c_str());
      return kExitFailure;
    }
  }
  return pass ? kExitOk : kExitDriftTooLarge;
}

}  // namespace

void add_drift_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<DriftArgs>();
  CLI::App* cmd = app.add_subcommand(
      "drift",
      "Run the same inputs through a model at f32 and at bf16; print the drift per layer and at the outputs, "
      "checked against documented tolerances (exit 3 when an output is beyond them)");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  cmd->add_option("--set", args->overrides, "override a config key on both sides: key.path=value (repeatable)");
  auto* batch = cmd->add_option("--batch", args->batch, "random input: items (default: bench.batch)")
                    ->check(CLI::Range(int64_t{1}, limits::kBatch));
  auto* seq_len =
      cmd->add_option("--seq-len", args->seq_len, "random input: rows per item (default: bench.seq_len)")
          ->check(CLI::Range(int64_t{1}, limits::kSequence));
  auto* seed = cmd->add_option("--seed", args->seed, "random input: seed")->capture_default_str();
  auto* ids = cmd->add_option("--ids", args->ids, "token ids, comma-separated, instead of random input");
  auto* rows = cmd->add_option("--rows", args->rows, "feature rows, .npy of (T, F) or (B, T, F), instead of random input");
  ids->excludes(rows, batch, seq_len, seed);
  rows->excludes(batch, seq_len, seed);
  cmd->add_option("--json", args->json, "also write every figure to this file as one JSON object");
  cmd->add_option("--candidate", args->candidate,
                  "the dtype compared with f32 (f32: the model against itself, which must give zero drift)")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--candidate-set", args->candidate_overrides,
                  "override a config key on the candidate side only, to test the check (e.g. model.init.seed=1 "
                  "must fail; repeatable)");
  cmd->add_flag("--reference", args->reference, "run the plain reference loops instead of oneDNN (both sides)");
  cmd->callback([args, run] { *run = [args] { return run_drift(*args); }; });
}

}  // namespace tessera::cli
