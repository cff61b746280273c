// `tessera bench --plugins`: the modality plugins' front ends timed on real files. See
// cmd_bench_plugins.cpp.
#pragma once

#include <string>
#include <vector>

namespace tessera::cli {

struct PluginBenchArgs {
  std::vector<std::string> inputs;  // ROLE=PATH, replacing the default file of ROLE
  std::vector<std::string> only;    // case names ("audio/whisper") or plugin names ("text"); empty = all
  std::string data_dir;             // the default inputs: a folder laid out like tests/data
  std::string json;                 // also write the figures here
  int reps = 20, warmup = 2;
};

// The default for --data: beside an installed tessera, the inputs installed with it
// (<prefix>/share/tessera/bench-data, laid out like tests/data); in the build tree, the sources'
// tests/data.
std::string default_bench_data_dir();

// Prints the table to stdout; errors to stderr. Returns a kExit* code.
int run_plugin_bench(const PluginBenchArgs& args);

}  // namespace tessera::cli
