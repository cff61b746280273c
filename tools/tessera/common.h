// Shared pieces of the `tessera` subcommands: loading an experiment with --set overrides,
// building its model, turning inputs into a batch, and printing numbers and tables.
// Results go to stdout; logs and errors to stderr.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config.h"
#include "tessera/model.h"

namespace tessera::cli {

// Exit codes: 0 ok, 1 runtime failure, 2 bad input (config, arguments, files).
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

struct Loaded {
  Experiment exp;
  Model model;
};

// Prints every diagnostic to stderr and returns nullopt on failure.
std::optional<Experiment> load(const std::string& file, const std::vector<std::string>& overrides);
// load(), then the model built, unless its memory plan (weights plus activations for batches of
// `batch` items of `rows` rows; 0: plan_rows and plan_batch) exceeds the memory available: then
// both numbers are printed and nothing is allocated.
std::optional<Loaded> load_and_build(const std::string& file, const std::vector<std::string>& overrides,
                                     int64_t rows = 0, int64_t batch = 0);
// The exit code for the last failed load_and_build on this thread: kExitBadInput for the config or
// its weights, kExitFailure for a model that does not fit the machine's memory (the same config may
// run elsewhere; an allocation that fails later ends in kExitFailure too).
int load_failure_exit_code();

// The rows per item and the batch `tessera check` plans with when given none: the inline input's
// rows, else bench.seq_len; runtime.batch_size for a plugin experiment, else bench.batch.
int64_t plan_rows(const Experiment& exp);
int64_t plan_batch(const Experiment& exp);

// The batch to run: --ids "1,2,3" or --rows FILE.npy when given, else the experiment's input.
// Prints a message to stderr and returns nullopt when there is none or it does not fit.
std::optional<Batch> input_batch(const Experiment& exp, const std::string& ids_arg,
                                 const std::string& rows_npy);

// A random batch of the model's input kind (bench): ids uniform in the vocabulary, rows N(0, 1).
Batch random_batch(const ModelConfig& cfg, int64_t batch, int64_t seq_len, uint64_t seed);

// Number formatting for the lecture's tables: at most `digits` decimals, trailing zeros trimmed;
// with `fractions`, values within 1e-6 of p/q (q <= 64) print as "p/q".
std::string fmt(double v, int digits, bool fractions);
std::string fmt_count(double v);  // 86,389,248
std::string fmt_bytes(double v);  // 12.3 MiB
std::string fmt_flops(double v);  // 280 FLOP, 3.5 MFLOP, 281 GFLOP

// Timing (bench): seconds since t0 on the steady clock (the median of runs: spread_of, bench_machine.h).
double seconds_since(std::chrono::steady_clock::time_point t0);

// Left-aligned columns, two spaces apart.
std::string table(const std::vector<std::vector<std::string>>& rows, int indent = 2);

}  // namespace tessera::cli
