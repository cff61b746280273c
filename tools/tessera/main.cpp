// `tessera`: the command line. Subcommands live in cmd_*.cpp; this file only dispatches.
// Results go to stdout, logs and errors to stderr; exit codes: 0 ok, 1 failure, 2 bad input.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "tessera/config.h"
#include "tessera/ops.h"

namespace tessera::cli {

namespace {

void add_version(CLI::App& app, std::function<int()>* run) {
  CLI::App* cmd = app.add_subcommand("version", "Print Tessera's version and the runtime it found");
  cmd->callback([run] {
    *run = [] {
      const RuntimeInfo ri = runtime_info();
      std::printf("tessera %s\noneDNN %s, %s, %d threads, bf16 %s\n", TESSERA_VERSION, ri.onednn_version.c_str(),
                  ri.isa.c_str(), ri.threads, ri.native_bf16 ? "native" : "emulated in f32");
      return kExitOk;
    };
  });
}

}  // namespace

void add_schema_command(CLI::App& app, std::function<int()>* run) {
  auto markdown = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("schema", "List every config key with its type, default and meaning");
  cmd->add_flag("--markdown", *markdown, "print the table of docs/CONFIG.md");
  cmd->callback([markdown, run] {
    *run = [markdown] {
      if (*markdown) {
        std::printf("%s", schema_markdown().c_str());
        return kExitOk;
      }
      std::vector<std::vector<std::string>> rows{{"key", "type", "default"}};
      for (const KeySpec& k : config_schema()) rows.push_back({k.path, k.type, k.default_value});
      std::printf("%s", table(rows, 0).c_str());
      return kExitOk;
    };
  });
}

}  // namespace tessera::cli

int main(int argc, char** argv) {
  using namespace tessera::cli;
  CLI::App app{"tessera: transformers over any modality, on oneDNN"};
  app.require_subcommand(1);
  std::function<int()> run;
  add_run_command(app, &run);
  add_generate_command(app, &run);
  add_check_command(app, &run);
  add_explain_command(app, &run);
  add_forward_command(app, &run);
  add_bench_command(app, &run);
  add_drift_command(app, &run);
  add_export_command(app, &run);
  add_plugins_command(app, &run);
  add_tokenize_command(app, &run);
  add_schema_command(app, &run);
  add_search_command(app, &run);
  add_version(app, &run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }
  return run ? run() : kExitBadInput;
}
