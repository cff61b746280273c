// `tessera check`: validate an experiment (config, then weights against the model), print the
// resolved config with every default filled in, and the plan: rows, parameters, FLOPs and
// activation memory per item and per batch. It runs no forward pass.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "common.h"

namespace tessera::cli {

namespace {

struct CheckArgs {
  std::string file;
  std::vector<std::string> overrides;
  int64_t seq_len = 0, batch = 0;
  bool params = false;
};

int run_check(const CheckArgs& a) {
  std::optional<Loaded> L = load_and_build(a.file, a.overrides);
  if (!L) return kExitBadInput;
  const Experiment& e = L->exp;
  const int64_t T = a.seq_len > 0 ? a.seq_len
                  : !e.input.ids.empty() ? static_cast<int64_t>(e.input.ids.size())
                  : e.input.rows.defined() ? e.input.rows.dim(0)
                  : e.bench.seq_len;
  const int64_t B = a.batch > 0 ? a.batch : e.bench.batch;
  const Plan p = make_plan(e.model, T);

  std::printf("%s\n", to_yaml(e).c_str());
  std::printf("# plan for %lld input rows per item, batch %lld (f32 activations)\n",
              static_cast<long long>(T), static_cast<long long>(B));
  std::vector<std::vector<std::string>> rows = {
      {"rows per item", fmt_count(static_cast<double>(p.rows)) +
                            (p.rows != T ? "  (" + std::to_string(T) + " input rows + CLS)" : "")},
      {"parameters", fmt_count(static_cast<double>(p.parameters)) + "  (" +
                         fmt_bytes(static_cast<double>(p.parameter_bytes)) + " as " + dtype_name(e.model.dtype) + ")"},
      {"FLOPs per item", fmt_flops(p.flops_per_item)},
      {"FLOPs per batch", fmt_flops(p.flops_per_item * static_cast<double>(B))},
      {"activation memory per item", fmt_bytes(static_cast<double>(p.activation_bytes_per_item))},
      {"activation memory per batch", fmt_bytes(static_cast<double>(p.activation_bytes_per_item * B))},
      {"attention scores per head", fmt_count(static_cast<double>(p.score_entries_per_head)) + "  (n^2, n = " +
                                        std::to_string(p.rows) + ")"},
      {"attention scores per item", fmt_count(static_cast<double>(p.score_entries_per_head * e.model.n_heads *
                                                                  e.model.n_layers)) +
                                        "  (n^2 x " + std::to_string(e.model.n_heads) + " heads x " +
                                        std::to_string(e.model.n_layers) + " layers)"}};
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
  cmd->add_option("--seq-len", args->seq_len, "input rows per item for the plan (default: the input's, else bench.seq_len)");
  cmd->add_option("--batch", args->batch, "items per batch for the plan (default: bench.batch)");
  cmd->add_flag("--params", args->params, "also list every parameter's name and shape");
  cmd->callback([args, run] { *run = [args] { return run_check(*args); }; });
}

}  // namespace tessera::cli
