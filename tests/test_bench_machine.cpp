// `tessera bench`'s machine measurements (tools/tessera/bench_machine.h): the FMA peak and the
// memory bandwidth come back positive and finite (tiny sizes; nothing about speed is asserted),
// and a decode step's weight bytes follow the rule the header states, on small decoders; the
// spread of a figure's runs and the warning when it is wide.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "bench_machine.h"
#include "tessera/model.h"
#include "test_models.h"

using namespace tessera;
using namespace tessera::cli;

namespace {

// A small GPT-2-shaped decoder (pre-LN, final norm, tied LM head), seeded init.
using testing_util::tiny_decoder;
Model build(const ModelConfig& c) { return testing_util::build_model(c); }

int64_t parameter_bytes(const Model& m) {
  int64_t n = 0;
  for (const auto& [name, t] : m.parameters()) n += static_cast<int64_t>(t.nbytes());
  return n;
}

int64_t bytes_of(const Model& m, const std::string& name) {
  const Tensor* t = m.parameter(name);
  EXPECT_NE(t, nullptr) << name;
  return t ? static_cast<int64_t>(t->nbytes()) : 0;
}

}  // namespace

TEST(BenchMachine, FmaPeakIsPositiveAndFinite) {
  for (int threads : {1, 2}) {
    const FmaPeak p = measure_fma_peak(threads, 0.002, 1);
    EXPECT_GT(p.gflops, 0) << threads;
    EXPECT_TRUE(std::isfinite(p.gflops)) << threads;
    EXPECT_EQ(p.threads, threads);
    EXPECT_GT(p.accumulators, 0);
    EXPECT_EQ(p.isa, fma_isa());
    EXPECT_FALSE(p.isa.empty());
  }
}

TEST(BenchMachine, FmaPeakKeepsEveryTrial) {
  const FmaPeak p = measure_fma_peak(1, 0.002, 3);
  ASSERT_EQ(p.trials.size(), 3u);
  EXPECT_EQ(*std::max_element(p.trials.begin(), p.trials.end()), p.gflops);
}

TEST(BenchMachine, BandwidthIsPositiveAndFinite) {
  const Bandwidth b = measure_bandwidth(2, int64_t{6} << 20, 1);
  ASSERT_EQ(b.read_trials.size(), 1u);
  EXPECT_EQ(b.read_trials[0], b.read_gbs);
  EXPECT_GT(b.read_gbs, 0);
  EXPECT_TRUE(std::isfinite(b.read_gbs));
  EXPECT_GT(b.triad_gbs, 0);
  EXPECT_TRUE(std::isfinite(b.triad_gbs));
  EXPECT_EQ(b.threads, 2);
  // Three equal arrays make up the buffer, each a whole number of 64-float blocks.
  EXPECT_LE(b.bytes, int64_t{6} << 20);
  EXPECT_GT(b.bytes, (int64_t{6} << 20) - 3 * 64 * 4);
  EXPECT_EQ(b.bytes % (3 * 64 * 4), 0);
}

TEST(BenchMachine, DecodeReadsEveryParameterOfATiedRotaryDecoder) {
  // Rotary positions have no table, and the tied head reads the whole embedding: every parameter
  // byte, once per step, whatever the batch.
  const Model m = build(tiny_decoder(PositionKind::rotary));
  EXPECT_EQ(decode_weight_bytes_per_step(m, 1, false), parameter_bytes(m));
  EXPECT_EQ(decode_weight_bytes_per_step(m, 4, false), parameter_bytes(m));
}

TEST(BenchMachine, DecodeReadsOnlyItsTokensRowsOfLookupTables) {
  const int64_t C = 32, V = 61;
  // Learned positions: one row of the table per sequence in the batch.
  const Model learned = build(tiny_decoder(PositionKind::learned));
  const int64_t table = bytes_of(learned, "pos.table");
  EXPECT_EQ(table, 64 * C * 4);
  EXPECT_EQ(decode_weight_bytes_per_step(learned, 1, false), parameter_bytes(learned) - table + C * 4);
  EXPECT_EQ(decode_weight_bytes_per_step(learned, 3, false), parameter_bytes(learned) - table + 3 * C * 4);
  // An untied head: the embedding is a lookup (its rows), the head matrix is read in full.
  ModelConfig untied_cfg = tiny_decoder(PositionKind::rotary);
  untied_cfg.head.tied = false;
  const Model untied = build(untied_cfg);
  EXPECT_EQ(bytes_of(untied, "head.lm"), C * V * 4);
  EXPECT_EQ(decode_weight_bytes_per_step(untied, 2, false), parameter_bytes(untied) - V * C * 4 + 2 * C * 4);
}

TEST(BenchMachine, DecodeCountsMatmulWeightsInBf16WhenTheKernelsHoldThem) {
  const Model m = build(tiny_decoder(PositionKind::rotary));
  int64_t matrices = 0;
  for (const auto& [name, t] : m.parameters())
    if (t.rank() == 2) matrices += static_cast<int64_t>(t.nbytes());
  EXPECT_GT(matrices, 0);
  EXPECT_EQ(decode_weight_bytes_per_step(m, 1, true), parameter_bytes(m) - matrices / 2);
}

// The spread of a figure's runs and the warning `tessera bench` prints when it is wide: the
// decision and the text, on made-up runs (nothing is timed).
TEST(BenchSpread, MinMedianMaxAndTheirRatio) {
  const Spread s = spread_of({3.0, 1.0, 2.0});
  EXPECT_EQ(s.runs, 3);
  EXPECT_EQ(s.min, 1.0);
  EXPECT_EQ(s.median, 2.0);
  EXPECT_EQ(s.max, 3.0);
  EXPECT_EQ(s.ratio(), 3.0);
  EXPECT_EQ(spread_of({4.0, 1.0, 2.0, 3.0}).median, 2.5);
  const Spread one = spread_of({0.5});
  EXPECT_EQ(one.runs, 1);
  EXPECT_EQ(one.ratio(), 1.0);
  EXPECT_EQ(spread_of({}).runs, 0);
  EXPECT_EQ(spread_of({}).ratio(), 1.0);
  EXPECT_TRUE(std::isinf(spread_of({0.0, 1.0}).ratio()));  // a run too short to time
  EXPECT_EQ(spread_text(spread_of({1.0, 1.3})), "spread 1.30x");
  EXPECT_EQ(spread_ratio(spread_of({2.0, 5.0})), "2.50x");
}

TEST(BenchSpread, WarnsOnlyAboveTheLimit) {
  EXPECT_EQ(kSpreadLimit, 1.25);
  EXPECT_EQ(spread_warning("the forward pass", spread_of({1.0, 1.1, 1.2})), "");
  EXPECT_EQ(spread_warning("the forward pass", spread_of({1.0, 1.25})), "");  // at the limit: fine
  EXPECT_EQ(spread_warning("the forward pass", spread_of({2.0})), "");        // one run: no spread
  EXPECT_EQ(
      spread_warning("the forward pass", spread_of({1.0, 2.0, 5.0})),
      "warning: the forward pass: its 3 runs spread 5.00x (slowest / fastest), more than 1.25x: the machine "
      "was busy or changed its clock speed while measuring, so this figure and any % of peak or bound taken "
      "from it are unreliable; measure again on an idle machine");
  EXPECT_NE(spread_warning("decode", spread_of({1.0, 1.26})), "");
  // Another limit, as given.
  EXPECT_EQ(spread_warning("decode", spread_of({1.0, 1.26}), 1.5), "");
  EXPECT_NE(spread_warning("decode", spread_of({1.0, 1.6}), 1.5).find("more than 1.50x"), std::string::npos);
}
