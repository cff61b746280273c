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

// Started reductions post their two phases on communicators of their own, each in the order the
// reductions were started on every rank, as MPI asks of collectives.
MPI_Comm g_exchange = MPI_COMM_NULL, g_return = MPI_COMM_NULL;

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
    MPI_Comm_dup(MPI_COMM_WORLD, &g_exchange);
    MPI_Comm_dup(MPI_COMM_WORLD, &g_return);
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

// A started reduction of one window: its exchange (MPI_Ialltoallv), then, once that is done, the
// rank-order sum of this rank's chunk and its return to every rank (MPI_Iallgatherv).
struct Comm::Pending {
  float* data = nullptr;
  int mine = 0, phase = 0;  // 0: exchanging, 1: returning the sums, 2: done
  std::vector<int> counts, displs, recv_counts, recv_displs;
  std::vector<float> gathered, sum;
  MPI_Request request = MPI_REQUEST_NULL;
};

Status Comm::allreduce_start(float* data, int64_t n) {
  if (size_ == 1 || n == 0) return Status::Ok();
  if (n < 0) return Status::Invalid("allreduce_start of " + std::to_string(n) + " values");
  const int N = size_;
  for (int64_t w0 = 0; w0 < n; w0 += kWindow) {
    const int64_t len = std::min(kWindow, n - w0);
    auto* p = new Pending;
    pending_.push_back(p);
    p->data = data + w0;
    p->counts.resize(N);
    p->displs.resize(N);
    p->recv_counts.resize(N);
    p->recv_displs.resize(N);
    for (int r = 0; r < N; ++r) {
      p->displs[r] = static_cast<int>(len * r / N);
      p->counts[r] = static_cast<int>(len * (r + 1) / N) - p->displs[r];
    }
    p->mine = p->counts[rank_];
    for (int r = 0; r < N; ++r) {
      p->recv_counts[r] = p->mine;
      p->recv_displs[r] = p->mine * r;
    }
    p->gathered.resize(static_cast<size_t>(p->mine) * N);
    TSR_RETURN_IF_ERROR(mpi_status(MPI_Ialltoallv(p->data, p->counts.data(), p->displs.data(), MPI_FLOAT,
                                                  p->gathered.data(), p->recv_counts.data(), p->recv_displs.data(),
                                                  MPI_FLOAT, g_exchange, &p->request),
                                   "MPI_Ialltoallv (allreduce_start)"));
  }
  return allreduce_progress();
}

// A reduction returns its sums only after every one started before it has (so that the returns
// are posted in the same order on every rank).
Status Comm::allreduce_progress() {
  bool earlier_exchanging = false;
  for (Pending* p : pending_) {
    if (p->phase == 2) continue;
    if (p->phase == 0 && earlier_exchanging) break;
    int done = 0;
    TSR_RETURN_IF_ERROR(mpi_status(MPI_Test(&p->request, &done, MPI_STATUS_IGNORE), "MPI_Test (allreduce)"));
    if (!done) {
      earlier_exchanging |= p->phase == 0;
      continue;
    }
    if (p->phase == 0) {
      p->sum.assign(p->gathered.begin(), p->gathered.begin() + p->mine);
      for (int r = 1; r < size_; ++r) {
        const float* g = p->gathered.data() + static_cast<size_t>(p->mine) * r;
        for (int i = 0; i < p->mine; ++i) p->sum[static_cast<size_t>(i)] += g[i];
      }
      p->phase = 1;
      TSR_RETURN_IF_ERROR(mpi_status(MPI_Iallgatherv(p->sum.data(), p->mine, MPI_FLOAT, p->data, p->counts.data(),
                                                     p->displs.data(), MPI_FLOAT, g_return, &p->request),
                                     "MPI_Iallgatherv (allreduce)"));
    } else {
      p->phase = 2;
    }
  }
  return Status::Ok();
}

Status Comm::allreduce_finish() {
  Status st = Status::Ok();
  for (Pending* p : pending_) {
    while (st.ok() && p->phase != 2) {
      if (p->phase == 0) {
        st = mpi_status(MPI_Wait(&p->request, MPI_STATUS_IGNORE), "MPI_Wait (allreduce)");
        if (st.ok()) {
          p->request = MPI_REQUEST_NULL;
          // Mark it done for allreduce_progress's next step: a null request tests as complete.
          st = allreduce_progress();
        }
      } else {
        st = mpi_status(MPI_Wait(&p->request, MPI_STATUS_IGNORE), "MPI_Wait (allreduce)");
        if (st.ok()) p->phase = 2;
      }
    }
  }
  for (Pending* p : pending_) delete p;
  pending_.clear();
  return st;
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
