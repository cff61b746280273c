// Rng against NumPy's default_rng, bit for bit, from tests/data/rng/numpy_default_rng.txt (made
// by tools/reference/make_rng_fixtures.py), plus the fills and init schemes built on it.
// It does not run NumPy; it only reads what NumPy wrote.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "random/ziggurat.h"
#include "tessera/random.h"
#include "tessera/tensor.h"

using namespace tessera;

namespace {

// ---- the fixture --------------------------------------------------------------------------

// "@ kind key=value ... n=N" and its N lines.
struct Block {
  std::string kind;
  std::map<std::string, std::string> params;
  std::vector<std::string> lines;

  const std::string& param(const std::string& key) const {
    auto it = params.find(key);
    if (it == params.end()) {
      ADD_FAILURE() << "fixture block '" << kind << "' has no '" << key << "'";
      static const std::string kEmpty;
      return kEmpty;
    }
    return it->second;
  }
  uint64_t seed() const { return std::strtoull(param("seed").c_str(), nullptr, 10); }
  double param_double(const std::string& key) const {  // written with float.hex()
    return std::strtod(param(key).c_str(), nullptr);
  }
  int64_t param_int(const std::string& key) const {
    return std::strtoll(param(key).c_str(), nullptr, 10);
  }
};

const char* kFixturePath = TESSERA_TEST_DATA "/rng/numpy_default_rng.txt";

std::vector<Block> read_fixture() {
  std::vector<Block> blocks;
  std::ifstream in(kFixturePath);
  if (!in) {
    ADD_FAILURE() << "cannot open " << kFixturePath
                  << "; regenerate it with tools/reference/make_rng_fixtures.py";
    return blocks;
  }
  std::string line;
  size_t expect = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '@') {
      EXPECT_EQ(expect, 0u) << "previous block short of lines before: " << line;
      std::istringstream words(line.substr(1));
      Block b;
      words >> b.kind;
      std::string kv;
      while (words >> kv) {
        const size_t eq = kv.find('=');
        b.params[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      expect = std::strtoull(b.params["n"].c_str(), nullptr, 10);
      blocks.push_back(std::move(b));
      continue;
    }
    EXPECT_FALSE(blocks.empty()) << "line before any block: " << line;
    EXPECT_GT(expect, 0u) << "line beyond its block's n: " << line;
    if (blocks.empty() || expect == 0) continue;
    blocks.back().lines.push_back(line);
    --expect;
  }
  EXPECT_EQ(expect, 0u) << "last block short of lines";
  return blocks;
}

const std::vector<Block>& fixture() {
  static const std::vector<Block> blocks = read_fixture();
  return blocks;
}

std::vector<const Block*> blocks_of(const std::string& kind) {
  std::vector<const Block*> out;
  for (const Block& b : fixture()) {
    if (b.kind == kind) out.push_back(&b);
  }
  return out;
}

uint64_t hex_u64(const std::string& s) { return std::strtoull(s.c_str(), nullptr, 16); }

uint64_t bits_of(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
double double_of(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::string hex(uint64_t u) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(u));
  return buf;
}

// FNV-1a, 64 bit, over each double's bit pattern, little-endian bytes first: as the script.
struct Fnv1a64 {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(double d) {
    uint64_t u = bits_of(d);
    for (int i = 0; i < 8; ++i) {
      h ^= (u >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
};

// Doubles as read back from the fixture's bit patterns.
std::vector<double> doubles_of(const Block& b) {
  std::vector<double> out;
  for (const std::string& l : b.lines) out.push_back(double_of(hex_u64(l)));
  return out;
}

// Doubles drawn by a fresh Rng(seed) against a block of NumPy's, bit for bit.
template <class Draw>
void expect_stream(const Block& b, Draw draw) {
  Rng rng(b.seed());
  const std::vector<double> want = doubles_of(b);
  for (size_t i = 0; i < want.size(); ++i) {
    const double got = draw(rng);
    ASSERT_EQ(hex(bits_of(got)), hex(bits_of(want[i])))
        << b.kind << " seed=" << b.seed() << " draw " << i << ": got " << got << ", NumPy "
        << want[i];
  }
}

TEST(Random, FixtureHasEveryBlock) {
  ASSERT_FALSE(fixture().empty());
  for (const char* kind : {"raw", "u32", "mixed", "random", "standard_normal"}) {
    EXPECT_EQ(blocks_of(kind).size(), kind == std::string("standard_normal") ? 7u : 6u) << kind;
  }
  EXPECT_EQ(blocks_of("uniform").size(), 12u);
  EXPECT_EQ(blocks_of("normal").size(), 6u);
  EXPECT_EQ(blocks_of("table").size(), 3u);
  EXPECT_EQ(blocks_of("crafted_normal").size(), 1u);
  EXPECT_EQ(blocks_of("standard_normal_digest").size(), 1u);
  EXPECT_EQ(blocks_of("standard_normal_slow").size(), 1u);
  EXPECT_EQ(blocks_of("lecture").size(), 7u);
  EXPECT_EQ(blocks_of("init").size(), 5u);
}

// ---- PCG64 and SeedSequence ---------------------------------------------------------------

TEST(Random, RawOutputsMatchNumPy) {
  for (const Block* b : blocks_of("raw")) {
    Rng rng(b->seed());
    for (size_t i = 0; i < b->lines.size(); ++i) {
      ASSERT_EQ(hex(rng.next_u64()), hex(hex_u64(b->lines[i])))
          << "random_raw, seed " << b->seed() << ", draw " << i;
    }
  }
}

TEST(Random, NextU32GivesLowHalfThenHighHalf) {
  for (const Block* b : blocks_of("u32")) {
    Rng rng(b->seed());
    for (size_t i = 0; i < b->lines.size(); ++i) {
      ASSERT_EQ(rng.next_u32(), static_cast<uint32_t>(hex_u64(b->lines[i])))
          << "next_uint32, seed " << b->seed() << ", draw " << i;
    }
  }
  // And in terms of next_u64: low half first.
  Rng a(5), b(5);
  const uint64_t word = b.next_u64();
  EXPECT_EQ(a.next_u32(), static_cast<uint32_t>(word));
  EXPECT_EQ(a.next_u32(), static_cast<uint32_t>(word >> 32));
}

TEST(Random, BufferedHalfSurvivesOtherDraws) {
  for (const Block* b : blocks_of("mixed")) {
    Rng rng(b->seed());
    for (size_t i = 0; i < b->lines.size(); ++i) {
      const std::string& l = b->lines[i];
      const std::string op = l.substr(0, 3);
      const uint64_t want = hex_u64(l.substr(4));
      if (op == "u32") {
        ASSERT_EQ(rng.next_u32(), want) << "seed " << b->seed() << ", step " << i;
      } else if (op == "u64") {
        ASSERT_EQ(hex(rng.next_u64()), hex(want)) << "seed " << b->seed() << ", step " << i;
      } else {
        ASSERT_EQ(op, "f64");
        ASSERT_EQ(hex(bits_of(rng.uniform())), hex(want)) << "seed " << b->seed() << ", step " << i;
      }
    }
  }
}

TEST(Random, CopiesContinueTheSameStream) {
  Rng a(77);
  a.next_u32();  // leaves a buffered half, which the copy must carry too
  Rng b = a;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a.next_u32(), b.next_u32());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(bits_of(a.standard_normal()), bits_of(b.standard_normal()));
}

// ---- Generator methods --------------------------------------------------------------------

TEST(Random, UniformDoublesMatchNumPy) {
  for (const Block* b : blocks_of("random")) expect_stream(*b, [](Rng& r) { return r.uniform(); });
}

TEST(Random, UniformRangeMatchesNumPy) {
  for (const Block* b : blocks_of("uniform")) {
    const double low = b->param_double("low"), high = b->param_double("high");
    expect_stream(*b, [&](Rng& r) { return r.uniform(low, high); });
  }
}

TEST(Random, StandardNormalMatchesNumPy) {
  for (const Block* b : blocks_of("standard_normal")) {
    expect_stream(*b, [](Rng& r) { return r.standard_normal(); });
  }
}

TEST(Random, NormalMatchesNumPy) {
  for (const Block* b : blocks_of("normal")) {
    const double loc = b->param_double("loc"), scale = b->param_double("scale");
    expect_stream(*b, [&](Rng& r) { return r.normal(loc, scale); });
  }
}

// ---- the ziggurat -------------------------------------------------------------------------

TEST(Random, ZigguratTablesEqualNumPys) {
  const detail::ZigguratTables& t = detail::normal_ziggurat();
  int checked = 0;
  for (const Block* b : blocks_of("table")) {
    const std::string& name = b->param("name");
    ASSERT_EQ(b->lines.size(), static_cast<size_t>(detail::kZigguratLayers)) << name;
    for (int i = 0; i < detail::kZigguratLayers; ++i) {
      const uint64_t want = hex_u64(b->lines[i]);
      uint64_t got = 0;
      if (name == "ki") got = t.k[i];
      if (name == "wi") got = bits_of(t.w[i]);
      if (name == "fi") got = bits_of(t.f[i]);
      EXPECT_EQ(hex(got), hex(want)) << name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * detail::kZigguratLayers);
}

// Branch counts summed over a run.
void add_counts(detail::ZigguratCounts& sum, const detail::ZigguratCounts& c) {
  sum.words += c.words;
  for (int i = 0; i < detail::kZigguratLayers; ++i) sum.layer_words[i] += c.layer_words[i];
  sum.fast += c.fast;
  sum.wedge_accept += c.wedge_accept;
  sum.wedge_reject += c.wedge_reject;
  sum.tail_accept += c.tail_accept;
  sum.tail_reject += c.tail_reject;
}

int64_t doubles_used(const detail::ZigguratCounts& c) {
  return c.wedge_accept + c.wedge_reject + 2 * (c.tail_accept + c.tail_reject);
}

// NumPy's standard_normal run on chosen inputs: every layer at m = k[i] - 1 (returns at once)
// and m = k[i] (wedge test), wedge rejections, and the tail with accepted and rejected pairs.
TEST(Random, ZigguratBranchesMatchNumPyOnCraftedInputs) {
  const std::vector<const Block*> blocks = blocks_of("crafted_normal");
  ASSERT_EQ(blocks.size(), 1u);
  detail::ZigguratCounts total;
  for (size_t c = 0; c < blocks[0]->lines.size(); ++c) {
    std::istringstream in(blocks[0]->lines[c]);
    std::string tok;
    size_t n = 0;
    in >> n;
    std::vector<uint64_t> words(n);
    for (uint64_t& w : words) {
      in >> tok;
      w = hex_u64(tok);
    }
    in >> n;
    std::vector<double> doubles(n);
    for (double& d : doubles) {
      in >> tok;
      d = double_of(hex_u64(tok));
    }
    size_t want_words = 0, want_doubles = 0;
    in >> tok >> want_words >> want_doubles;
    const uint64_t want = hex_u64(tok);
    ASSERT_FALSE(in.fail()) << "crafted case " << c << " does not parse";

    detail::ScriptedDraws draws;
    draws.words = words.data();
    draws.n_words = words.size();
    draws.doubles = doubles.data();
    draws.n_doubles = doubles.size();
    detail::ZigguratCounts counts;
    const double got = detail::standard_normal_scripted(draws, &counts);
    EXPECT_FALSE(draws.overrun) << "case " << c;
    EXPECT_EQ(hex(bits_of(got)), hex(want)) << "case " << c << ": " << blocks[0]->lines[c];
    EXPECT_EQ(draws.used_words, want_words) << "case " << c << ": " << blocks[0]->lines[c];
    EXPECT_EQ(draws.used_doubles, want_doubles) << "case " << c << ": " << blocks[0]->lines[c];
    EXPECT_EQ(counts.words, static_cast<int64_t>(draws.used_words));
    EXPECT_EQ(doubles_used(counts), static_cast<int64_t>(draws.used_doubles));
    add_counts(total, counts);
  }
  EXPECT_GT(total.fast, 0);
  EXPECT_GT(total.wedge_accept, 0);
  EXPECT_GT(total.wedge_reject, 0);
  EXPECT_GT(total.tail_accept, 0);
  EXPECT_GT(total.tail_reject, 0);
  for (int i = 0; i < detail::kZigguratLayers; ++i) EXPECT_GT(total.layer_words[i], 0) << i;
}

// 100,000 draws from default_rng(42): all in the digest, the first 1000 one by one, and each
// draw that did not return on its first word checked for what it consumed.
TEST(Random, LongNormalStreamMatchesNumPyAndTakesEveryBranch) {
  const std::vector<const Block*> digest = blocks_of("standard_normal_digest");
  const std::vector<const Block*> slow = blocks_of("standard_normal_slow");
  ASSERT_EQ(digest.size(), 1u);
  ASSERT_EQ(slow.size(), 1u);
  const uint64_t seed = digest[0]->seed();
  const int64_t count = digest[0]->param_int("count");
  ASSERT_GE(count, 20000);

  const Block* head = nullptr;
  for (const Block* b : blocks_of("standard_normal")) {
    if (b->seed() == seed && (!head || b->lines.size() > head->lines.size())) head = b;
  }
  ASSERT_NE(head, nullptr);
  const std::vector<double> want_head = doubles_of(*head);

  struct SlowDraw {
    int64_t index, words, doubles;
    std::string value;  // tail draws only
  };
  std::vector<SlowDraw> want_slow;
  for (const std::string& l : slow[0]->lines) {
    std::istringstream in(l);
    SlowDraw s{};
    in >> s.index >> s.words >> s.doubles >> s.value;
    want_slow.push_back(s);
  }

  Rng counted(seed), plain(seed);
  Fnv1a64 fnv_counted, fnv_plain;
  detail::ZigguratCounts total;
  std::vector<SlowDraw> got_slow;
  int64_t tail_values_checked = 0;
  for (int64_t i = 0; i < count; ++i) {
    detail::ZigguratCounts c;
    const double x = detail::standard_normal_counted(counted, c);
    fnv_counted.add(x);
    fnv_plain.add(plain.standard_normal());
    if (i < static_cast<int64_t>(want_head.size())) {
      ASSERT_EQ(hex(bits_of(x)), hex(bits_of(want_head[i]))) << "draw " << i;
    }
    if (c.words != 1 || doubles_used(c) != 0) {
      got_slow.push_back({i, c.words, doubles_used(c), ""});
      const size_t k = got_slow.size() - 1;
      if (k < want_slow.size() && !want_slow[k].value.empty()) {
        EXPECT_EQ(hex(bits_of(x)), want_slow[k].value) << "tail draw " << i;
        EXPECT_GT(std::fabs(x), 3.6541528853610088) << "tail draw " << i;
        ++tail_values_checked;
      }
    }
    add_counts(total, c);
  }
  EXPECT_EQ(hex(fnv_counted.h), digest[0]->param("fnv1a64")) << "the " << count << " draws differ";
  EXPECT_EQ(fnv_plain.h, fnv_counted.h) << "Rng::standard_normal differs from the counted path";

  ASSERT_EQ(got_slow.size(), want_slow.size());
  for (size_t k = 0; k < want_slow.size(); ++k) {
    EXPECT_EQ(got_slow[k].index, want_slow[k].index) << k;
    EXPECT_EQ(got_slow[k].words, want_slow[k].words) << "draw " << want_slow[k].index;
    EXPECT_EQ(got_slow[k].doubles, want_slow[k].doubles) << "draw " << want_slow[k].index;
  }

  // Every layer was drawn, the wedge test both accepted and rejected, the tail was sampled.
  for (int i = 0; i < detail::kZigguratLayers; ++i) EXPECT_GT(total.layer_words[i], 0) << i;
  EXPECT_GT(total.wedge_accept, 0);
  EXPECT_GT(total.wedge_reject, 0);
  EXPECT_GT(total.tail_accept, 0);
  EXPECT_GT(tail_values_checked, 0);
  EXPECT_EQ(tail_values_checked, total.tail_accept);
  EXPECT_EQ(total.fast + total.wedge_accept + total.tail_accept, count);
}

// ---- fills and initialisation -------------------------------------------------------------

TEST(Random, LectureWeightsAreNumPys) {
  const std::vector<const Block*> blocks = blocks_of("lecture");
  ASSERT_EQ(blocks.size(), 7u);
  Rng rng(9);      // through init_matrix, into f32 tensors
  Rng doubles(9);  // the same draws as doubles
  for (const Block* b : blocks) {
    const int64_t rows = b->param_int("rows"), cols = b->param_int("cols");
    const double sd = std::sqrt(2.0 / static_cast<double>(rows + cols));
    EXPECT_EQ(bits_of(sd), bits_of(b->param_double("sd"))) << b->param("name");
    Tensor w = Tensor::empty({rows, cols});
    init_matrix(w, InitScheme::glorot_normal, 0.0, rng);
    const std::vector<double> want = doubles_of(*b);
    ASSERT_EQ(want.size(), static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const double d = want[i * cols + j];
        EXPECT_EQ(bits_of(doubles.normal(0.0, sd)), bits_of(d)) << b->param("name");
        EXPECT_EQ(bits_of(w.at({i, j})), bits_of(static_cast<float>(d)))
            << b->param("name") << "[" << i << "][" << j << "]";
      }
    }
  }
}

TEST(Random, EverySchemeDrawsWhatItsNumPyLineDraws) {
  for (const Block* b : blocks_of("init")) {
    InitScheme scheme;
    ASSERT_TRUE(parse_init_scheme(b->param("scheme"), &scheme)) << b->param("scheme");
    const int64_t rows = b->param_int("rows"), cols = b->param_int("cols");
    Tensor w = Tensor::empty({rows, cols});
    Rng rng(b->seed());
    init_matrix(w, scheme, b->param_double("std"), rng);
    const std::vector<double> want = doubles_of(*b);
    const std::vector<float> got = w.to_vector();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(bits_of(got[i]), bits_of(static_cast<float>(want[i])))
          << b->param("scheme") << " element " << i;
    }
  }
}

TEST(Random, FillsAreRowMajor) {
  Tensor t = Tensor::empty({3, 5});
  Rng rng(7), ref(7);
  fill_normal(t, rng, 0.5, 2.0);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 5; ++j) {
      EXPECT_EQ(bits_of(t.at({i, j})), bits_of(static_cast<float>(ref.normal(0.5, 2.0))))
          << i << "," << j;
    }
  }
  Tensor u = Tensor::empty({2, 3, 4});
  fill_uniform(u, rng, -1.0, 3.0);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      for (int64_t k = 0; k < 4; ++k) {
        EXPECT_EQ(bits_of(u.at({i, j, k})), bits_of(static_cast<float>(ref.uniform(-1.0, 3.0))));
      }
    }
  }
  EXPECT_EQ(rng.next_u64(), ref.next_u64()) << "a fill drew more or less than numel";
}

TEST(Random, Bf16FillsRoundTheF32DrawToNearestEven) {
  Tensor f = Tensor::empty({64, 64});
  Tensor h = Tensor::empty({64, 64}, DType::bf16);
  Rng a(11), b(11);
  fill_normal(f, a, 0.0, 1.0);
  fill_normal(h, b, 0.0, 1.0);
  const float* fp = f.data<float>();
  const bf16* hp = h.data<bf16>();
  int rounded_up = 0;
  for (int64_t i = 0; i < f.numel(); ++i) {
    const uint32_t u = bits_of(fp[i]);
    // round to nearest, ties to even, on the f32 bits
    const uint32_t lower = u >> 16, rest = u & 0xffffu;
    const uint32_t want = (rest > 0x8000u || (rest == 0x8000u && (lower & 1u))) ? lower + 1 : lower;
    ASSERT_EQ(hp[i].bits, want) << "element " << i << " from " << fp[i];
    rounded_up += want != lower;
  }
  EXPECT_GT(rounded_up, 100) << "expected many draws where rounding and truncation differ";
  EXPECT_EQ(h.to_vector(), f.to(DType::bf16).to_vector());

  Tensor hu = Tensor::empty({16, 16}, DType::bf16), fu = Tensor::empty({16, 16});
  Rng c(12), d(12);
  fill_uniform(hu, c, -0.25, 0.25);
  fill_uniform(fu, d, -0.25, 0.25);
  EXPECT_EQ(hu.to_vector(), fu.to(DType::bf16).to_vector());
}

struct Moments {
  double mean = 0, sd = 0, min = 0, max = 0;
};
Moments moments(const Tensor& t) {
  const std::vector<float> v = t.to_vector();
  Moments m;
  m.min = m.max = v[0];
  double sum = 0, sum2 = 0;
  for (float x : v) {
    sum += x;
    m.min = std::min(m.min, static_cast<double>(x));
    m.max = std::max(m.max, static_cast<double>(x));
  }
  m.mean = sum / v.size();
  for (float x : v) sum2 += (x - m.mean) * (x - m.mean);
  m.sd = std::sqrt(sum2 / (v.size() - 1));
  return m;
}

// 512 x 256 = 131,072 draws: a sample sd is within 0.2% (one standard error) of the true one,
// so 1% bounds hold with a wide margin while any other fan formula is 15% or more away.
TEST(Random, SchemesHaveTheirStatedSpread) {
  const int64_t rows = 512, cols = 256;
  const double n = static_cast<double>(rows * cols);
  struct Case {
    InitScheme scheme;
    double std_arg, want_sd;
  };
  const double glorot_sd = std::sqrt(2.0 / (rows + cols));
  const Case cases[] = {
      {InitScheme::glorot_normal, 0.0, glorot_sd},
      {InitScheme::glorot_uniform, 0.0, std::sqrt(6.0 / (rows + cols)) / std::sqrt(3.0)},
      {InitScheme::he_normal, 0.0, std::sqrt(2.0 / rows)},
      {InitScheme::normal, 0.02, 0.02},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    Tensor w = Tensor::empty({rows, cols});
    Rng rng(seed++);
    init_matrix(w, c.scheme, c.std_arg, rng);
    const Moments m = moments(w);
    const char* name = init_scheme_name(c.scheme);
    EXPECT_NEAR(m.sd / c.want_sd, 1.0, 0.01) << name;
    EXPECT_LT(std::fabs(m.mean), 6.0 * c.want_sd / std::sqrt(n)) << name;
  }
  // Glorot-uniform: inside (-a, a) and reaching both ends; a normal's tails would not stay inside.
  const double a = std::sqrt(6.0 / (rows + cols));
  Tensor w = Tensor::empty({rows, cols});
  Rng rng(200);
  init_matrix(w, InitScheme::glorot_uniform, 0.0, rng);
  const Moments m = moments(w);
  EXPECT_GE(m.min, -a);
  EXPECT_LE(m.max, a);
  EXPECT_LT(m.min, -0.999 * a);
  EXPECT_GT(m.max, 0.999 * a);
  // A normal scheme does reach past 3.5 sd (about 60 of 131,072 draws); a uniform never does.
  Tensor g = Tensor::empty({rows, cols});
  Rng rng2(201);
  init_matrix(g, InitScheme::glorot_normal, 0.0, rng2);
  const Moments mg = moments(g);
  EXPECT_GT(std::max(-mg.min, mg.max), 3.5 * glorot_sd);
}

TEST(Random, ZerosDrawNothing) {
  Tensor w = Tensor::full({4, 6}, 3.f);
  Rng a(5), b(5);
  init_matrix(w, InitScheme::zeros, 0.0, a);
  for (float v : w.to_vector()) EXPECT_EQ(bits_of(v), 0u);
  EXPECT_EQ(a.next_u64(), b.next_u64());

  Tensor h = Tensor::full({2, 2}, 1.f).to(DType::bf16);
  init_matrix(h, InitScheme::zeros, 0.0, a);
  for (float v : h.to_vector()) EXPECT_EQ(bits_of(v), 0u);

  Tensor empty = Tensor::empty({0, 8});
  init_matrix(empty, InitScheme::glorot_normal, 0.0, a);
  EXPECT_EQ(a.next_u64(), b.next_u64());
}

TEST(Random, SchemeNamesRoundTrip) {
  const InitScheme all[] = {InitScheme::glorot_normal, InitScheme::glorot_uniform,
                            InitScheme::he_normal, InitScheme::normal, InitScheme::zeros};
  const char* names[] = {"glorot_normal", "glorot_uniform", "he_normal", "normal", "zeros"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_STREQ(init_scheme_name(all[i]), names[i]);
    InitScheme parsed = InitScheme::zeros;
    ASSERT_TRUE(parse_init_scheme(names[i], &parsed)) << names[i];
    EXPECT_EQ(parsed, all[i]);
  }
  EXPECT_STREQ(init_scheme_name(static_cast<InitScheme>(99)), "unknown");
  for (const char* bad : {"", "Glorot_Normal", "glorot", "xavier_normal", "glorot_normal ",
                          "kaiming", "unknown", "zero"}) {
    InitScheme out = InitScheme::he_normal;
    EXPECT_FALSE(parse_init_scheme(bad, &out)) << "'" << bad << "'";
    EXPECT_EQ(out, InitScheme::he_normal) << "'" << bad << "' changed *out";
  }
}

TEST(RandomDeathTest, BrokenCallsAbortWithAMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Rng rng(1);
  EXPECT_DEATH(
      {
        Tensor t = Tensor::empty({3, 4}).transpose(0, 1);
        fill_normal(t, rng, 0.0, 1.0);
      },
      "fill_normal");
  EXPECT_DEATH(
      {
        Tensor t = Tensor::from_ids({4}, {1, 2, 3, 4});
        fill_uniform(t, rng, 0.0, 1.0);
      },
      "fill_uniform");
  EXPECT_DEATH(
      {
        Tensor t = Tensor::empty({4});
        fill_normal(t, rng, 0.0, -1.0);
      },
      "sd must be");
  EXPECT_DEATH(
      {
        Tensor t = Tensor::empty({2, 2, 2});
        init_matrix(t, InitScheme::glorot_normal, 0.0, rng);
      },
      "init_matrix");
}

}  // namespace
