// `tessera export`: write a model's parameters — loaded, inline, freshly initialised, or a
// training run's weights (--weights) — to one safetensors file under Tessera's parameter names (for
// `model.weights.file` to read back), or with --hf as a Hugging Face folder that transformers loads.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "tessera/hf.h"
#include "tessera/train.h"

namespace tessera::cli {

namespace {

struct ExportArgs {
  std::string file, out, hf_dir, weights;
  std::vector<std::string> overrides;
};

int run_export(const ExportArgs& a) {
  if (a.out.empty() == a.hf_dir.empty()) {
    std::fprintf(stderr, "tessera export: give either OUT.safetensors or --hf DIR (not %s)\n",
                 a.out.empty() ? "neither" : "both");
    return kExitBadInput;
  }
  std::optional<Experiment> exp = load(a.file, a.overrides);
  if (!exp) return kExitBadInput;
  Result<Parameters> params = a.weights.empty() ? Parameters::resolve(exp->model) : load_weights(a.weights, exp->model);
  if (!params.ok()) {
    std::fprintf(stderr, "tessera export: %s%s\n", a.weights.empty() ? "" : ("--weights " + a.weights + ": ").c_str(),
                 params.status().message().c_str());
    return kExitBadInput;
  }
  if (!a.hf_dir.empty()) {
    Diagnostics diags;
    hf::ExportReport rep;
    if (!hf::export_folder(*exp, *params, a.hf_dir, &diags, &rep)) {
      std::fputs(diags.str().c_str(), stderr);
      return kExitBadInput;
    }
    for (const std::string& n : rep.notes) std::fprintf(stderr, "tessera export: note: %s\n", n.c_str());
    std::string files;
    for (const std::string& f : rep.files) files += (files.empty() ? "" : ", ") + f;
    std::printf("%s: Hugging Face %s (%s), %zu tensors: %s\n", a.hf_dir.c_str(), rep.hf_class.c_str(),
                rep.family.c_str(), rep.tensors, files.c_str());
    return kExitOk;
  }
  if (Status st = params->save(a.out); !st.ok()) {
    std::fprintf(stderr, "tessera export: %s\n", st.message().c_str());
    return kExitFailure;
  }
  std::printf("%s: %zu tensors, %s values\n", a.out.c_str(), params->size(),
              fmt_count(static_cast<double>(params->numel())).c_str());
  return kExitOk;
}

}  // namespace

void add_export_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand("export", "Write a model's parameters to a safetensors file or a Hugging Face folder");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  cmd->add_option("out", args->out, "safetensors file to write (Tessera's parameter names)");
  cmd->add_option("--hf", args->hf_dir, "write a Hugging Face folder instead (config.json, model.safetensors, tokenizer)");
  cmd->add_option("--weights", args->weights, "weights file to export (runs/NAME/best.safetensors); default: model.weights");
  cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  cmd->callback([args, run] { *run = [args] { return run_export(*args); }; });
}

}  // namespace tessera::cli
