// `tessera bench --train`: the training loop's speed and peak memory. See cmd_bench_train.cpp.
#pragma once

#include <string>
#include <vector>

namespace tessera::cli {

struct TrainBenchArgs {
  std::string file, json;
  std::vector<std::string> overrides;
  int reps = 20, warmup = 3, threads = -1;
};

// Prints the table to stdout; errors to stderr. Returns a kExit* code.
int run_train_bench(const TrainBenchArgs& args);

}  // namespace tessera::cli
