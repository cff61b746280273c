// `tessera export`: write a model's parameters — loaded, inline or freshly initialised — to one
// safetensors file under Tessera's parameter names, for `model.weights.file` to read back.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "common.h"

namespace tessera::cli {

namespace {

struct ExportArgs {
  std::string file, out;
  std::vector<std::string> overrides;
};

int run_export(const ExportArgs& a) {
  std::optional<Loaded> L = load_and_build(a.file, a.overrides);
  if (!L) return kExitBadInput;
  if (Status st = L->model.save(a.out); !st.ok()) {
    std::fprintf(stderr, "tessera export: %s\n", st.message().c_str());
    return kExitFailure;
  }
  int64_t n = 0;
  for (const auto& [name, t] : L->model.parameters()) n += t.numel();
  std::printf("%s: %zu tensors, %s values\n", a.out.c_str(), L->model.parameters().size(),
              fmt_count(static_cast<double>(n)).c_str());
  return kExitOk;
}

}  // namespace

void add_export_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand("export", "Write a model's parameters to a safetensors file");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  cmd->add_option("out", args->out, "safetensors file to write")->required();
  cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  cmd->callback([args, run] { *run = [args] { return run_export(*args); }; });
}

}  // namespace tessera::cli
