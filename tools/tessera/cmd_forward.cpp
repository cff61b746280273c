// `tessera forward`: run a model once on given token ids or feature rows and write its outputs
// (hidden states, pooled vector, logits, probabilities, any named intermediate) as .npy files.
// Datasets and batching belong to `tessera run`; this runs one input.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "common.h"
#include "tessera/npy.h"

namespace tessera::cli {

namespace {

struct ForwardArgs {
  std::string file, ids, rows, out_dir = "tessera-out";
  std::vector<std::string> overrides, dump;
  bool reference = false;
  int digits = 4;
};

// Feature rows must be finite: a NaN or inf in an input row reaches every output that attends to it.
// Plugins' rows are checked at the plugin boundary; these come from a .npy file or the YAML.
bool rows_finite(const Batch& batch, const std::string& source) {
  if (!batch.rows.defined()) return true;
  const NonFiniteScan s = find_nonfinite(batch.rows);
  if (!s.found()) return true;
  const int64_t T = batch.rows.dim(1), F = batch.rows.dim(2);
  const int64_t b = s.index / (T * F), t = s.index / F % T, f = s.index % F;
  const std::string item = batch.rows.dim(0) > 1 ? "item " + std::to_string(b) + ", " : "";
  std::fprintf(stderr,
               "tessera forward: %s: %s at %srow %lld, column %lld (%lld non-finite value(s) in all); feature rows "
               "must be finite numbers: fix or drop that row\n",
               source.c_str(), nonfinite_name(s.value).c_str(), item.c_str(), static_cast<long long>(t),
               static_cast<long long>(f), static_cast<long long>(s.count));
  return false;
}

int run_forward(const ForwardArgs& a) {
  std::optional<Loaded> L = load_and_build(a.file, a.overrides);
  if (!L) return load_failure_exit_code();
  std::optional<Batch> batch = input_batch(L->exp, a.ids, a.rows);
  if (!batch) return kExitBadInput;
  if (!rows_finite(*batch, a.rows.empty() ? L->exp.file + ": input.rows" : "--rows " + a.rows)) return kExitBadInput;
  ForwardOptions opt;
  opt.reference = a.reference || L->exp.runtime.reference;
  opt.capture.insert(a.dump.begin(), a.dump.end());
  opt.find_nonfinite = true;  // never write NaN or inf outputs as if they were results
  Outputs out;
  if (Status st = L->model.forward(*batch, opt, &out); !st.ok()) {
    std::fprintf(stderr, "tessera forward: %s\n", st.message().c_str());
    return kExitFailure;
  }
  if (Status st = nonfinite_status(out.nonfinite, "item"); !st.ok()) {
    std::fprintf(stderr, "tessera forward: nothing written: %s\n", st.message().c_str());
    return kExitFailure;
  }
  for (const auto& name : a.dump)
    if (name != "*" && !out.captured.count(name)) {
      std::fprintf(stderr, "tessera forward: --dump %s: no intermediate of that name in this model "
                           "(names are listed in core/include/tessera/model.h; --dump '*' writes all)\n",
                   name.c_str());
      return kExitBadInput;
    }
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec) {
    std::fprintf(stderr, "tessera forward: cannot create %s: %s\n", a.out_dir.c_str(), ec.message().c_str());
    return kExitFailure;
  }
  std::vector<std::pair<std::string, Tensor>> files = {
      {"hidden", out.hidden}, {"pooled", out.pooled}, {"logits", out.logits}, {"probs", out.probs}};
  for (const auto& [name, t] : out.captured) files.emplace_back(name, t);
  std::vector<std::vector<std::string>> rows{{"output", "shape", "file"}};
  for (const auto& [name, t] : files) {
    if (!t.defined()) continue;
    const std::string path = (std::filesystem::path(a.out_dir) / (name + ".npy")).string();
    if (Status st = npy::save(path, t); !st.ok()) {
      std::fprintf(stderr, "tessera forward: %s\n", st.message().c_str());
      return kExitFailure;
    }
    rows.push_back({name, t.shape().str(), path});
  }
  std::printf("%s", table(rows, 0).c_str());
  // Small results are printed too: the teaching examples fit on a screen.
  if (out.hidden.numel() <= 64) {
    const Tensor h = out.hidden.select(0, 0);
    std::printf("\nhidden (item 0):\n");
    for (int64_t t = 0; t < h.dim(0); ++t) {
      std::string line = "  ";
      for (int64_t c = 0; c < h.dim(1); ++c) line += (c ? "  " : "") + fmt(h.at({t, c}), a.digits, false);
      std::printf("%s\n", line.c_str());
    }
  }
  return kExitOk;
}

}  // namespace

void add_forward_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<ForwardArgs>();
  CLI::App* cmd = app.add_subcommand("forward", "Run a model on token ids or feature rows; write outputs as .npy");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  cmd->add_option("--ids", args->ids, "token ids, comma-separated (default: the experiment's input)");
  cmd->add_option("--rows", args->rows, "feature rows, .npy of (T, F) or (B, T, F)");
  cmd->add_option("--out", args->out_dir, "output folder")->capture_default_str();
  cmd->add_option("--dump", args->dump, "also write this intermediate, e.g. blocks.0.attn.weights ('*': all)");
  cmd->add_flag("--reference", args->reference, "run the plain reference loops instead of oneDNN");
  cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  cmd->callback([args, run] { *run = [args] { return run_forward(*args); }; });
}

}  // namespace tessera::cli
