// The processes of one job: MPI ranks when Tessera was built with MPI and started by a launcher
// (mpirun, mpiexec, Slurm's srun), one process alone otherwise. Every MPI call of Tessera lives
// behind this header, in core/src/mpi/; nothing else includes mpi.h.
//
//   Comm& c = Comm::world();            // MPI_Init_thread on first use, under a launcher only
//   if (c.rank() == 0) write_manifest();
//   c.allreduce_sum(grads, n);          // the same bits on every rank, whatever the rank count
//
// Reductions are in a fixed order: element i of allreduce_sum is
// ((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{N-1}[i], summed in float by rank order on the rank that
// owns i's chunk, so the result does not depend on the MPI library's algorithm, the network or
// the timing, and every rank gets the same bits. Thread-safety: one thread calls Comm at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/status.h"

namespace tessera {

class Comm {
 public:
  // The job's communicator. Built without MPI, or started without a launcher: one rank. Started by
  // a launcher: MPI is initialised on first use (MPI_THREAD_FUNNELED) and finalised at exit.
  static Comm& world();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool distributed() const { return size_ > 1; }

  Status barrier();
  // data (n floats) becomes the sum over the ranks of each rank's data, in rank order (above).
  Status allreduce_sum(float* data, int64_t n);
  // The same sum, started now and finished later, so that it runs while the caller computes:
  // allreduce_start posts it (data must stay put until it is finished), allreduce_progress lets
  // MPI move the started ones along (call it between pieces of work), allreduce_finish waits for
  // all of them. Every rank starts the same reductions in the same order. The bits are
  // allreduce_sum's.
  Status allreduce_start(float* data, int64_t n);
  Status allreduce_progress();
  Status allreduce_finish();
  // bytes (n) from rank `root` to every rank.
  Status broadcast(void* data, int64_t n, int root);
  // Each rank's `mine` (any length), in rank order, on every rank.
  Result<std::vector<std::string>> allgather(const std::string& mine);
  // Ends the whole job: the message (naming this rank) on stderr, then MPI_Abort (or exit).
  [[noreturn]] void abort(int code, const std::string& message);

 private:
  Comm() = default;
  int rank_ = 0, size_ = 1;
  std::vector<float> gathered_, summed_;  // allreduce_sum's buffers, kept between calls
  struct Pending;                         // a started reduction (comm_mpi.cpp)
  std::vector<Pending*> pending_;
};

// "Open MPI v4.1.4, ..." (MPI_Get_library_version) when built with MPI; "" when not.
std::string mpi_library();
// Whether this process was started by an MPI launcher (its environment says so).
bool started_by_mpi_launcher();
// This process's rank as the launcher's environment gives it (0 when not started by one): known
// before MPI starts, for what must happen before (a run folder cleared by rank 0 alone).
int launcher_rank();

}  // namespace tessera
