// `tessera check`: validate an experiment (config, then weights against the model, then its plugins
// against the model and on the dataset's first items), print the resolved config with every default
// filled in, and the plan: rows, parameters, FLOPs and activation memory per item and per batch. It
// runs no forward pass and writes nothing.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "tessera/machine.h"
#include "tessera/run.h"

#include "commands.h"
#include "common.h"

namespace tessera::cli {

namespace {

struct CheckArgs {
  std::string file;
  std::vector<std::string> overrides;
  int64_t seq_len = 0, batch = 0, sample = 16;
  bool params = false;
};

// A plugin experiment: the plugins against the model, then the first items of the dataset encoded.
// Prints what it found; returns false (after printing why) when the run would fail.
bool check_plugins(const Experiment& e, const CheckArgs& a, std::string* report, int64_t* longest) {
  Diagnostics diags;
  check_plugins_fit(e, &diags);
  if (!diags.empty()) {
    std::fprintf(stderr, "%s\n", diags.str().c_str());
    std::fprintf(stderr, "tessera: %zu problem(s) between the plugins and the model in %s; nothing was run\n",
                 diags.size(), a.file.c_str());
    return false;
  }
  std::vector<tsr_encoder_info> infos;
  std::vector<std::vector<std::string>> rows;
  for (const PluginConfig& pc : e.plugins) {
    Result<std::shared_ptr<const Plugin>> p = Plugin::load(pc.file);
    Result<Encoder> enc = p.ok() ? Encoder::create(*p, pc.options) : Result<Encoder>(p.status());
    if (!enc.ok()) {  // check_plugins_fit has loaded them already; this would be a race with the disk
      std::fprintf(stderr, "tessera: %s\n", enc.status().message().c_str());
      return false;
    }
    infos.push_back(enc->info());
    rows.push_back({(*p)->name(), (*p)->version(), (*p)->modality(), (*p)->file()});
  }
  const StemLayout L = stem_layout(infos);
  *report += "# plugins (name, version, modality, file, rows, their place in the stem)\n";
  for (size_t i = 0; i < infos.size(); ++i) {
    const tsr_encoder_info& f = infos[i];
    const bool ids = f.rows_kind == TSR_ROWS_IDS;
    const int64_t at = ids ? L.id_offset[i] : L.column[i], n = ids ? f.vocab_size : f.width;
    rows[i].push_back(ids ? "ids, vocabulary " + std::to_string(n) : "features, " + std::to_string(n) + " wide");
    rows[i].push_back((ids ? "ids " : "columns ") + std::to_string(at) + ".." + std::to_string(at + n - 1) +
                      (e.model.stem.modalities > 0 ? ", modality " + std::to_string(i) : ""));
  }
  *report += table(rows, 2);
  for (size_t i = 0; i < infos.size(); ++i)
    if ((infos[i].causal != 0) != e.model.causal)
      *report += "  note: plugin " + e.plugins[i].name + "'s rows are meant to be read " +
                 (infos[i].causal ? "left to right (causal)" : "both ways") + ", but the model attends " +
                 (e.model.causal ? "left to right (model.causal true)" : "both ways (model.causal false)") + "\n";
  if (e.data.path.empty()) return true;
  Result<DatasetPreview> v = preview_dataset(e, a.sample);
  if (!v.ok()) {
    std::fprintf(stderr, "tessera: %s\n", v.status().message().c_str());
    return false;
  }
  *report += "# dataset " + e.data.path + ": " + std::to_string(v->items) + " items; the first " +
             std::to_string(v->sampled) + " encoded\n";
  rows.clear();
  std::vector<int64_t> n = v->rows;
  std::sort(n.begin(), n.end());
  if (!n.empty()) {
    rows.push_back({"sequences", std::to_string(n.size())});
    rows.push_back({"rows per sequence", "min " + std::to_string(n.front()) + ", median " +
                                             std::to_string(n[n.size() / 2]) + ", max " + std::to_string(n.back())});
    *longest = n.back();
  }
  rows.push_back({"bad items", std::to_string(v->errors.size()) + (v->errors.empty() ? "" : " (a run records them in errors.jsonl)")});
  *report += table(rows, 2);
  for (size_t i = 0; i < std::min<size_t>(v->errors.size(), 5); ++i) *report += "  bad: " + v->errors[i] + "\n";
  const PositionConfig& pos = e.model.positions;
  if ((pos.kind == PositionKind::learned || pos.kind == PositionKind::sinusoidal) && !n.empty() &&
      n.back() > pos.max_len) {
    std::fprintf(stderr, "%s", report->c_str());
    std::fprintf(stderr,
                 "tessera: %s: a sequence of the first items has %lld rows, more than model.positions.max_len (%lld): "
                 "its batch would fail. Raise max_len, or give the plugin a maximum length (and a length policy)\n",
                 a.file.c_str(), static_cast<long long>(n.back()), static_cast<long long>(pos.max_len));
    return false;
  }
  return true;
}

int run_check(const CheckArgs& a) {
  std::optional<Loaded> L = load_and_build(a.file, a.overrides, a.seq_len, a.batch);
  if (!L) return load_failure_exit_code();
  const Experiment& e = L->exp;
  std::string plugin_report;
  int64_t longest = 0;
  if (!e.plugins.empty() && !check_plugins(e, a, &plugin_report, &longest)) return kExitBadInput;
  const int64_t T = a.seq_len > 0 ? a.seq_len
                  : longest > 0 ? longest
                  : !e.input.ids.empty() ? static_cast<int64_t>(e.input.ids.size())
                  : e.input.rows.defined() ? e.input.rows.dim(0)
                  : e.bench.seq_len;
  const int64_t B = a.batch > 0 ? a.batch : !e.plugins.empty() ? e.runtime.batch_size : e.bench.batch;
  const Plan p = make_plan(e.model, T);

  std::printf("%s\n", to_yaml(e).c_str());
  for (const std::string& note : e.model.notes) std::printf("# model: %s\n", note.c_str());
  std::printf("%s", plugin_report.c_str());
  std::printf("# plan for %lld input rows per item%s, batch %lld (f32 activations)\n", static_cast<long long>(T),
              a.seq_len <= 0 && longest > 0 ? " (the longest of the first items)" : "", static_cast<long long>(B));
  std::vector<std::vector<std::string>> rows = {
      {"rows per item", fmt_count(static_cast<double>(p.rows)) +
                            (p.rows != T ? "  (" + std::to_string(T) + " input rows + CLS)" : "")},
      {"parameters", fmt_count(static_cast<double>(p.parameters)) + "  (" +
                         fmt_bytes(static_cast<double>(p.parameter_bytes)) + " as " +
                         dtype_name(e.model.dtype) + ")"},
      {"FLOPs per item", fmt_flops(p.flops_per_item)},
      {"FLOPs per batch", fmt_flops(p.flops_per_item * static_cast<double>(B))},
      {"activation memory per item", fmt_bytes(static_cast<double>(p.activation_bytes_per_item))},
      {"activation memory per batch",
       fmt_bytes(static_cast<double>(p.activation_bytes_per_item) * static_cast<double>(B))},
      {"attention scores per head", fmt_count(static_cast<double>(p.score_entries_per_head)) +
                                        "  (n^2, n = " + std::to_string(p.rows) + ")"},
      {"attention scores per item", fmt_count(static_cast<double>(p.score_entries_per_head) *
                                              static_cast<double>(e.model.n_heads * e.model.n_layers)) +
                                        "  (n^2 x " + std::to_string(e.model.n_heads) + " heads x " +
                                        std::to_string(e.model.n_layers) + " layers)"}};
  if (e.train.objective != Objective::auto_detect) {  // what `tessera train` will check against the machine
    const TrainConfig& tc = e.train;
    const int64_t micro = std::max<int64_t>(1, tc.batch_size / std::max<int64_t>(1, tc.accumulate));
    const bool adamw = tc.optimizer == OptimizerKind::adamw;
    const MemoryPlan tp = training_memory_plan(e.model, tc.seq_len > 0 ? tc.seq_len : T, micro, adamw ? 2 : 1);
    rows.push_back({"memory to train", fmt_bytes(static_cast<double>(tp.total)) + "  (" +
                                           std::string(adamw ? "AdamW" : "SGD") + ", micro-batch " +
                                           std::to_string(micro) + " x " + std::to_string(tp.rows) + " rows)"});
  }
  std::printf("%s", table(rows, 0).c_str());
  std::printf("# FLOPs per item by part\n");
  rows.clear();
  for (const auto& [name, f] : p.flops_by_part)
    rows.push_back({name, fmt_flops(f), fmt(100.0 * f / p.flops_per_item, 1, false) + " %"});
  std::printf("%s", table(rows, 2).c_str());
  if (a.params) {
    std::printf("# parameters (name, shape, values), in file and initialisation order\n");
    rows.clear();
    for (const auto& [name, t] : L->model.parameters())
      rows.push_back({name, t.shape().str(), fmt_count(static_cast<double>(t.numel()))});
    std::printf("%s", table(rows, 2).c_str());
  }
  std::fprintf(stderr, "tessera check: %s is valid\n", a.file.c_str());
  return kExitOk;
}

}  // namespace

void add_check_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<CheckArgs>();
  CLI::App* cmd = app.add_subcommand("check", "Validate an experiment; print the resolved config and the plan");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  cmd->add_option("--seq-len", args->seq_len,
                  "input rows per item for the plan (default: the input's, else bench.seq_len)")
      ->check(CLI::Range(int64_t{1}, limits::kSequence));
  cmd->add_option("--batch", args->batch, "items per batch for the plan (default: bench.batch)")
      ->check(CLI::Range(int64_t{1}, limits::kBatch));
  cmd->add_flag("--params", args->params, "also list every parameter's name and shape");
  cmd->add_option("--sample", args->sample,
                  "plugin experiments: encode this many items of the dataset (default 16)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->callback([args, run] { *run = [args] { return run_check(*args); }; });
}

}  // namespace tessera::cli
