// `tessera bench --attention N`: one attention head over N rows, fused kernel or materialised.
// See cmd_bench_attention.cpp.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::cli {

struct AttentionBenchArgs {
  int64_t n = 0;          // rows (queries = keys)
  int64_t head_dim = 64;  // d_k = d_v
  int64_t heads = 1;
  bool causal = false;
  bool materialised = false;  // scores, softmax and weighted sum as three ops, the (N, N) matrix stored
  int reps = 5, warmup = 1, threads = 1;
  std::string json;
};

// Prints the figures to stdout; errors to stderr. Returns a kExit* code.
int run_attention_bench(const AttentionBenchArgs& args);

}  // namespace tessera::cli
