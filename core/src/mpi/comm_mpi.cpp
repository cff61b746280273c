// Comm over MPI: the only file of Tessera that calls MPI. Collectives return MPI's errors as a
// Status (MPI_ERRORS_RETURN) instead of MPI's default of ending the job.
// The C API only: without these, Open MPI and MPICH pull their deprecated C++ bindings into C++.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "tessera/comm.h"

namespace tessera {

namespace {

Status mpi_status(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return Status::Internal(std::string(what) + " failed: " + std::string(text, static_cast<size_t>(len)));
}

void finalize_at_exit() {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (up && !down) MPI_Finalize();
}

// The largest count one MPI call takes here (MPI counts are int).
constexpr int64_t kWindow = int64_t{1} << 26;

}  // namespace

Comm& Comm::world() {
  static Comm c = [] {
    Comm w;
    if (!started_by_mpi_launcher()) return w;
    int up = 0;
    MPI_Initialized(&up);
    if (!up) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        std::fprintf(stderr, "tessera: MPI_Init_thread failed under an MPI launcher\n");
        std::exit(1);
      }
      std::atexit(finalize_at_exit);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &w.size_);
    return w;
  }();
  return c;
}

Status Comm::barrier() {
  if (size_ == 1) return Status::Ok();
  return mpi_status(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

// Reduce-scatter then allgather, by hand so that the order of the sum is fixed: rank r owns chunk
// r of each window, receives every rank's copy of it (MPI_Alltoallv), sums them in rank order, and
// the summed chunks go back to every rank (MPI_Allgatherv).
Status Comm::allreduce_sum(float* data, int64_t n) {
  if (size_ == 1 || n == 0) return Status::Ok();
  if (n < 0) return Status::Invalid("allreduce_sum of " + std::to_string(n) + " values");
  const int N = size_;
  std::vector<int> counts(N), displs(N), recv_counts(N), recv_displs(N);
  std::vector<float>& gathered = gathered_;
  std::vector<float>& sum = summed_;
  for (int64_t w0 = 0; w0 < n; w0 += kWindow) {
    const int64_t len = std::min(kWindow, n - w0);
    float* x = data + w0;
    for (int r = 0; r < N; ++r) {
      displs[r] = static_cast<int>(len * r / N);
      counts[r] = static_cast<int>(len * (r + 1) / N) - displs[r];
    }
    const int mine = counts[rank_];
    for (int r = 0; r < N; ++r) {
      recv_counts[r] = mine;
      recv_displs[r] = mine * r;
    }
    if (gathered.size() < static_cast<size_t>(mine) * N) gathered.resize(static_cast<size_t>(mine) * N);
    TSR_RETURN_IF_ERROR(mpi_status(MPI_Alltoallv(x, counts.data(), displs.data(), MPI_FLOAT, gathered.data(),
                                                 recv_counts.data(), recv_displs.data(), MPI_FLOAT, MPI_COMM_WORLD),
                                   "MPI_Alltoallv (allreduce_sum)"));
    if (sum.size() < static_cast<size_t>(mine)) sum.resize(static_cast<size_t>(mine));
    std::copy_n(gathered.begin(), mine, sum.begin());
    for (int r = 1; r < N; ++r) {
      const float* g = gathered.data() + static_cast<size_t>(mine) * r;
      for (int i = 0; i < mine; ++i) sum[static_cast<size_t>(i)] += g[i];
    }
    TSR_RETURN_IF_ERROR(mpi_status(MPI_Allgatherv(sum.data(), mine, MPI_FLOAT, x, counts.data(), displs.data(),
                                                  MPI_FLOAT, MPI_COMM_WORLD),
                                   "MPI_Allgatherv (allreduce_sum)"));
  }
  return Status::Ok();
}

Status Comm::broadcast(void* data, int64_t n, int root) {
  if (root < 0 || root >= size_)
    return Status::Invalid("broadcast from rank " + std::to_string(root) + " of " + std::to_string(size_));
  if (size_ == 1) return Status::Ok();
  auto* p = static_cast<char*>(data);
  for (int64_t w0 = 0; w0 < n; w0 += kWindow)
    TSR_RETURN_IF_ERROR(mpi_status(
        MPI_Bcast(p + w0, static_cast<int>(std::min(kWindow, n - w0)), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast"));
  return Status::Ok();
}

Result<std::vector<std::string>> Comm::allgather(const std::string& mine) {
  if (size_ == 1) return std::vector<std::string>{mine};
  if (mine.size() > static_cast<size_t>(kWindow)) return Status::Invalid("allgather of more than 64 MiB");
  const int len = static_cast<int>(mine.size());
  std::vector<int> lens(size_), displs(size_);
  TSR_RETURN_IF_ERROR(mpi_status(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD),
                                 "MPI_Allgather (lengths)"));
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[r] = static_cast<int>(total);
    total += lens[r];
  }
  if (total > kWindow) return Status::Invalid("allgather of more than 64 MiB in all");
  std::string all(static_cast<size_t>(total), '\0');
  TSR_RETURN_IF_ERROR(mpi_status(MPI_Allgatherv(mine.data(), len, MPI_BYTE, all.data(), lens.data(), displs.data(),
                                                MPI_BYTE, MPI_COMM_WORLD),
                                 "MPI_Allgatherv"));
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(lens[r])));
  return out;
}

void Comm::abort(int code, const std::string& message) {
  std::fprintf(stderr, "tessera: rank %d of %d: %s\n", rank_, size_, message.c_str());
  std::fflush(stderr);
  if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, static_cast<size_t>(len));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace tessera
