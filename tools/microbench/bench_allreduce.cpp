// bench_allreduce: the time of Comm::allreduce_sum (the rank-order sum that data-parallel training
// uses) for buffers from 4 KiB to 256 MiB, run under a launcher. A developer's measurement behind
// docs/DISTRIBUTED.md ("What a step costs at cluster scale"), not a test and not installed.
//   mpirun -np 2 build/bench_allreduce                     # ranks on this machine (shared memory)
//   mpirun -np 2 --mca btl self,tcp build/bench_allreduce  # over TCP (loopback, or a veth pair)
// Prints, per size: the median of --reps timed calls (after 2 untimed), and the bus bandwidth:
// bytes · 2 (N - 1) / N per second, what each rank sends and receives (nccl-tests' "busbw").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/comm.h"

using namespace tessera;

int main(int argc, char** argv) {
  int reps = 11;
  int64_t max_bytes = int64_t{256} << 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--max-mib") && i + 1 < argc) max_bytes = int64_t{std::atoi(argv[++i])} << 20;
    else {
      std::fprintf(stderr, "usage: mpirun -np N bench_allreduce [--reps R] [--max-mib M]\n");
      return 2;
    }
  }
  Comm& c = Comm::world();
  const int N = c.size();
  if (c.rank() == 0)
    std::printf("# %d ranks, %s\n# bytes  median_s  min_s  busbw_GB/s\n", N,
                mpi_library().empty() ? "no MPI" : mpi_library().substr(0, mpi_library().find(',')).c_str());
  for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const int64_t n = bytes / 4;
    std::vector<float> x(static_cast<size_t>(n), 1.0f + static_cast<float>(c.rank()));
    std::vector<double> t;
    for (int r = 0; r < reps + 2; ++r) {
      if (!c.barrier().ok()) return 1;
      const auto t0 = std::chrono::steady_clock::now();
      if (!c.allreduce_sum(x.data(), n).ok()) return 1;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r >= 2) t.push_back(s);
    }
    // The slowest rank's time is the collective's: the median over reps of each rep's maximum.
    Result<std::vector<std::string>> all =
        c.allgather(std::string(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(double)));
    if (!all.ok()) return 1;
    std::vector<double> worst(t.size(), 0);
    for (const std::string& a : *all)
      for (size_t i = 0; i < t.size(); ++i) worst[i] = std::max(worst[i], reinterpret_cast<const double*>(a.data())[i]);
    std::sort(worst.begin(), worst.end());
    const double med = worst[worst.size() / 2];
    if (c.rank() == 0)
      std::printf("%10lld  %.6f  %.6f  %.2f\n", static_cast<long long>(bytes), med, worst.front(),
                  N > 1 ? static_cast<double>(bytes) * 2 * (N - 1) / N / med / 1e9 : 0.0);
  }
  return 0;
}
