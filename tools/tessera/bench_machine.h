// The machine's own limits, measured by `tessera bench` in the same run as the model, so that a
// model's rate can be read as a fraction of what the cores and the memory can do at that moment:
//   - the FMA peak: a loop of fused multiply-adds on registers only, no memory traffic, with
//     enough independent accumulators to hide the FMA latency on both FMA pipes; the widest
//     vectors the CPU has (AVX-512 when present, else AVX2 + FMA; our code is compiled for generic
//     x86-64, so those kernels are compiled for their ISA alone and chosen at run time);
//   - the memory bandwidth: a read-only sum and a STREAM triad over arrays far larger than the
//     last-level cache;
//   - what a decode step must stream: the bytes of weights one step of a causal LM reads;
//   - how far the runs of one figure spread, and the warning when they spread so far that its
//     median (and a % of peak taken from it) means little: a busy machine, a clock that changed.
// A benchmark's tools, not the runtime's: nothing here is timed in tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/model.h"

namespace tessera::cli {

// The vector ISA the FMA loop runs on here: "avx512f", "avx2+fma", or "sse2 (no FMA: mul + add)".
std::string fma_isa();

// ---- The spread of repeated runs ------------------------------------------------------------

// Runs of one figure (seconds, or a rate): the fastest, the median and the slowest.
struct Spread {
  double min = 0, median = 0, max = 0;
  int runs = 0;
  // max / min: 1 when every run gave the same; infinite when the smallest is 0. 1 for no runs.
  double ratio() const;
};
Spread spread_of(std::vector<double> runs);

// Runs that spread more than this (max / min) make a figure unreliable: bench warns.
constexpr double kSpreadLimit = 1.25;

// "1.07x": max / min with two decimals; spread_text: "spread 1.07x".
std::string spread_ratio(const Spread& s);
std::string spread_text(const Spread& s);

// The warning line for `figure` ("the forward pass") when its runs spread more than `limit`; ""
// when they do not, or when there are fewer than two runs.
std::string spread_warning(const std::string& figure, const Spread& s, double limit = kSpreadLimit);

// ---- The machine's peaks -----------------------------------------------------------------------

struct FmaPeak {
  double gflops = 0;   // best of the trials; an FMA counts 2 FLOP per lane
  std::vector<double> trials;  // every trial's GFLOP/s, in order
  std::string isa;     // fma_isa()
  int threads = 0;
  int accumulators = 0;  // independent vector accumulators per thread
};
// `threads` OpenMP threads each run the loop for about `seconds` per trial; best of `trials`.
FmaPeak measure_fma_peak(int threads, double seconds = 0.1, int trials = 5);

struct Bandwidth {
  double read_gbs = 0;   // read-only sum over the whole buffer, 1e9 bytes/s, best of the trials
  std::vector<double> read_trials;  // every read trial's GB/s, in order
  double triad_gbs = 0;  // a[i] = b[i] + s·c[i] over its thirds, 3 × 4 bytes per element counted
                         // (STREAM's convention: the write-allocate read is not counted)
  int64_t bytes = 0;     // the buffer: the read reads all of it; the triad's three arrays make it up
  int threads = 0;
};
// Default 512 MiB: 16 times the 32 MiB L3 of the machines this was written on.
Bandwidth measure_bandwidth(int threads, int64_t bytes = int64_t{512} << 20, int trials = 5);

// The bytes of weights one decode step of `batch` sequences reads: every parameter in full, once,
// except the lookup tables (token, token-type and modality embeddings, the learned position
// table), of which a step reads only its tokens' rows; a table the LM head reuses (tied) counts
// once, in full. Matrices that feed a matmul count in the dtype the step reads them in: bf16
// when `bf16_weights` (model.dtype bf16, on a CPU with bf16 kernels or through the bf16 GEMV),
// else f32; all other
// tensors as they are held. KV-cache reads are not weights and are not counted.
int64_t decode_weight_bytes_per_step(const Model& m, int64_t batch, bool bf16_weights);

}  // namespace tessera::cli
