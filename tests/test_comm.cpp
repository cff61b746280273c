// Comm (tessera/comm.h): one process alone, and the same suite under `mpirun -np 2` and `-np 3`
// (ctest runs all three when Tessera is built with MPI). Each rank runs every test; the expected
// values are computed on each rank from the rank count alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "tessera/comm.h"

using namespace tessera;

namespace {

// Rank r's value at i: magnitudes far apart, so that float sums in another order differ.
float value(int r, int64_t i) {
  const float big[] = {1e8f, 1.0f, -1e8f, 3.0f, 0.5f};
  return big[(r + i) % 5] + static_cast<float>(i % 7) * 0.125f + static_cast<float>(r) * 1e-3f;
}

}  // namespace

TEST(Comm, RankAndSizeFollowTheLauncher) {
  const Comm& c = Comm::world();
  const char* want = std::getenv("TESSERA_TEST_RANKS");  // set by ctest for its mpirun runs
  const int expected = want ? std::atoi(want) : 1;
  EXPECT_EQ(c.size(), expected);
  EXPECT_GE(c.rank(), 0);
  EXPECT_LT(c.rank(), c.size());
  EXPECT_EQ(c.distributed(), expected > 1);
  EXPECT_EQ(started_by_mpi_launcher(), want != nullptr);
#ifdef TESSERA_TEST_MPI
  EXPECT_EQ(mpi_library().rfind("Open MPI", 0), 0u) << mpi_library();
#else
  EXPECT_EQ(mpi_library(), "");
#endif
}

// Element i is ((x_0 + x_1) + x_2) + ..., in float, on every rank, for lengths that split unevenly
// over the ranks (and are shorter than the rank count).
TEST(Comm, AllreduceSumsInRankOrderOnEveryRank) {
  Comm& c = Comm::world();
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{1000}, int64_t{100003}}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = value(c.rank(), i);
    ASSERT_TRUE(c.allreduce_sum(x.data(), n).ok());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      float want = value(0, i);
      for (int r = 1; r < c.size(); ++r) want += value(r, i);
      wrong += std::memcmp(&want, &x[static_cast<size_t>(i)], sizeof(float)) != 0;
    }
    EXPECT_EQ(wrong, 0) << "n " << n;
  }
  // The order matters for these values: the reverse order gives other bits somewhere.
  if (c.size() > 2) {
    int64_t differ = 0;
    for (int64_t i = 0; i < 100; ++i) {
      float fwd = value(0, i), rev = value(c.size() - 1, i);
      for (int r = 1; r < c.size(); ++r) fwd += value(r, i);
      for (int r = c.size() - 2; r >= 0; --r) rev += value(r, i);
      differ += fwd != rev;
    }
    EXPECT_GT(differ, 0);
  }
}

TEST(Comm, BroadcastAllgatherAndBarrier) {
  Comm& c = Comm::world();
  std::vector<int32_t> v(10);
  for (int root = 0; root < c.size(); ++root) {
    std::iota(v.begin(), v.end(), c.rank() == root ? 100 * root : -1);
    ASSERT_TRUE(c.broadcast(v.data(), static_cast<int64_t>(v.size() * sizeof(int32_t)), root).ok());
    EXPECT_EQ(v[0], 100 * root);
    EXPECT_EQ(v[9], 100 * root + 9);
  }
  EXPECT_FALSE(c.broadcast(v.data(), 4, c.size()).ok());
  auto all = c.allgather(std::string(static_cast<size_t>(c.rank()), 'x') + std::to_string(c.rank()));
  ASSERT_TRUE(all.ok()) << all.status().message();
  ASSERT_EQ(all->size(), static_cast<size_t>(c.size()));
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ((*all)[static_cast<size_t>(r)], std::string(static_cast<size_t>(r), 'x') + std::to_string(r));
  EXPECT_TRUE(c.barrier().ok());
}

// Reductions started one after another (as the backward pass finishes each part of a model),
// moved along between pieces of work and finished together: allreduce_sum's bits, on every rank.
TEST(Comm, StartedReductionsGiveTheSameBitsAsAllreduceSum) {
  Comm& c = Comm::world();
  const std::vector<int64_t> sizes = {3, 1000, 1, 50000, 7};
  std::vector<std::vector<float>> started, blocking;
  for (size_t b = 0; b < sizes.size(); ++b) {
    std::vector<float> x(static_cast<size_t>(sizes[b]));
    for (int64_t i = 0; i < sizes[b]; ++i) x[static_cast<size_t>(i)] = value(c.rank(), i + 11 * static_cast<int64_t>(b));
    started.push_back(x);
    blocking.push_back(x);
  }
  for (size_t b = 0; b < sizes.size(); ++b) {
    ASSERT_TRUE(c.allreduce_start(started[b].data(), sizes[b]).ok());
    volatile double work = 0;  // something to do meanwhile
    for (int i = 0; i < 10000; ++i) work = work + std::sqrt(static_cast<double>(i));
    ASSERT_TRUE(c.allreduce_progress().ok());
  }
  ASSERT_TRUE(c.allreduce_finish().ok());
  for (size_t b = 0; b < sizes.size(); ++b) {
    ASSERT_TRUE(c.allreduce_sum(blocking[b].data(), sizes[b]).ok());
    EXPECT_EQ(std::memcmp(started[b].data(), blocking[b].data(), started[b].size() * sizeof(float)), 0) << "bucket " << b;
    float want = value(0, 11 * static_cast<int64_t>(b));
    for (int r = 1; r < c.size(); ++r) want += value(r, 11 * static_cast<int64_t>(b));
    EXPECT_EQ(std::memcmp(&want, started[b].data(), sizeof(float)), 0) << "bucket " << b;
  }
  EXPECT_TRUE(c.allreduce_finish().ok());  // nothing started: nothing to wait for
}
