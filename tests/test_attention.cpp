// The fused attention kernel (ops::attention: tiles, online softmax, no stored score matrix)
// against the reference loop (ref::attention: every score, a softmax per row), and through the
// model: attention weights recomputed for the chosen heads only.
//
// Tolerance. Each output is a convex combination of value rows, so an error in the weights of
// relative size e moves it by at most e·max|v|. The fused kernel's weights differ from the
// reference's by the rounding of f32 dot products of length d (scores up to |scale·q·k|), of
// exp (libmvec: < 4 ulp) and of sums over up to S terms: about 1e-6 relative for the sizes here.
// 2e-5 · max(1, max|v|) leaves a margin, while a dropped tile, a missed rescale or an off-by-one
// mask moves outputs by 1e-2 or more (values are uniform in [-1, 1]).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tessera/model.h"
#include "tessera/ops.h"

using namespace tessera;

namespace {

Tensor random_tensor(const Shape& s, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (float& f : v) f = u(rng);
  return Tensor::from_vector(s, v);
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  float m = 0.f;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// q, k, v as head views of one fused (B·T, H·(2dk + dv)) buffer, the way the model lays them out.
struct Qkv {
  Tensor buf, q, k, v;
};
Qkv fused_qkv(int64_t B, int64_t H, int64_t T, int64_t dk, int64_t dv, std::mt19937& rng, float amp = 1.f) {
  Qkv r;
  r.buf = random_tensor({B * T, H * (2 * dk + dv)}, rng, -amp, amp);
  auto view = [&](int64_t col0, int64_t d) {
    return r.buf.reshape({B, T, H * (2 * dk + dv)}).slice(2, col0, col0 + H * d).unflatten(2, H, d).transpose(1, 2);
  };
  r.q = view(0, dk);
  r.k = view(H * dk, dk);
  r.v = view(2 * H * dk, dv);
  return r;
}

struct Case {
  int64_t B, H, T, dk, dv;
  bool causal;
};

void expect_matches_reference(const Case& c, std::mt19937& rng, const int32_t* lo = nullptr,
                              const int32_t* hi = nullptr, float amp = 1.f) {
  const Qkv x = fused_qkv(c.B, c.H, c.T, c.dk, c.dv, rng, amp);
  const float scale = 1.f / std::sqrt(static_cast<float>(std::max<int64_t>(c.dk, 1)));
  // The output as a head view of a concatenation buffer, as the model writes it.
  Tensor concat = Tensor::full({c.B, c.T, c.H * c.dv}, 7.f);
  Tensor out = concat.unflatten(2, c.H, c.dv).transpose(1, 2);
  Tensor want = Tensor::empty({c.B, c.H, c.T, c.dv});
  ASSERT_TRUE(ops::attention(x.q, x.k, x.v, out, scale, c.causal, lo, hi).ok());
  ASSERT_TRUE(ref::attention(x.q, x.k, x.v, want, scale, c.causal, lo, hi).ok());
  const std::string what = "B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " T " + std::to_string(c.T) +
                           " dk " + std::to_string(c.dk) + " dv " + std::to_string(c.dv) +
                           (c.causal ? " causal" : "") + (lo ? " ranges" : "");
  for (float f : out.to_vector()) ASSERT_TRUE(std::isfinite(f)) << what;
  EXPECT_LT(max_abs_diff(out, want), 2e-5f * std::max(1.f, amp)) << what;
}

}  // namespace

TEST(FusedAttention, MatchesTheReferenceOverShapes) {
  std::mt19937 rng(7);
  // T crosses the 64-row query tile and the 256-key tile, so rows span several key tiles and the
  // online softmax rescales; d from 1 to 80; dk != dv.
  const Case cases[] = {{1, 1, 1, 1, 1, false},   {2, 3, 5, 7, 3, false},  {1, 2, 63, 16, 16, true},
                        {1, 1, 64, 64, 64, false}, {2, 2, 65, 8, 24, true}, {1, 2, 200, 64, 64, false},
                        {1, 1, 257, 32, 16, true}, {1, 1, 300, 64, 64, false}, {1, 2, 600, 80, 40, true},
                        {3, 1, 130, 5, 9, false}};
  for (const Case& c : cases) expect_matches_reference(c, rng);
}

TEST(FusedAttention, LargeScoresStayStable) {
  // Scores up to about ±2000: exp overflows without the running maximum, and a late, larger
  // maximum (keys past the first tile) must rescale what was summed before.
  std::mt19937 rng(11);
  expect_matches_reference({1, 2, 520, 64, 32, false}, rng, nullptr, nullptr, 6.f);
  expect_matches_reference({1, 2, 520, 64, 32, true}, rng, nullptr, nullptr, 6.f);
}

TEST(FusedAttention, KeyRangesMaskPaddingAndPackedSequences) {
  std::mt19937 rng(3);
  const int64_t B = 2, T = 300;
  // Batch row 0: sequences [0, 100), [100, 290), then 10 padding rows that read every real row.
  // Batch row 1: one sequence [0, 40), padding after it; its last row has no key at all.
  std::vector<int32_t> lo(B * T), hi(B * T);
  for (int64_t t = 0; t < T; ++t) {
    lo[t] = t < 100 ? 0 : (t < 290 ? 100 : 0);
    hi[t] = t < 100 ? 100 : 290;
    lo[T + t] = 0;
    hi[T + t] = 40;
  }
  lo[2 * T - 1] = hi[2 * T - 1] = 17;  // an empty range
  for (bool causal : {false, true}) expect_matches_reference({B, 3, T, 16, 16, causal}, rng, lo.data(), hi.data());
}

TEST(FusedAttention, RowsWithoutKeysGiveZeros) {
  std::mt19937 rng(5);
  const Qkv x = fused_qkv(1, 2, 70, 8, 8, rng);
  std::vector<int32_t> lo(70, 0), hi(70, 70);
  for (int64_t t = 0; t < 70; t += 3) lo[t] = hi[t] = static_cast<int32_t>(t);  // every third row: none
  Tensor out = Tensor::full({1, 2, 70, 8}, 9.f);
  ASSERT_TRUE(ops::attention(x.q, x.k, x.v, out, 0.5f, false, lo.data(), hi.data()).ok());
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 70; ++t)
      for (int64_t d = 0; d < 8; ++d) {
        const float f = out.at({0, h, t, d});
        if (t % 3 == 0) {
          EXPECT_EQ(f, 0.f) << t;
        } else {
          EXPECT_TRUE(std::isfinite(f) && f != 9.f) << t;
        }
      }
}

TEST(FusedAttention, CausalWithMoreKeysThanQueries) {
  // Queries continue a sequence: row i is position S - T + i and sees keys up to it.
  std::mt19937 rng(13);
  const int64_t T = 70, S = 330, d = 16;
  const Tensor q = random_tensor({1, 2, T, d}, rng), k = random_tensor({1, 2, S, d}, rng),
               v = random_tensor({1, 2, S, d}, rng);
  Tensor out = Tensor::empty({1, 2, T, d}), want = Tensor::empty({1, 2, T, d});
  ASSERT_TRUE(ops::attention(q, k, v, out, 0.25f, true).ok());
  ASSERT_TRUE(ref::attention(q, k, v, want, 0.25f, true).ok());
  EXPECT_LT(max_abs_diff(out, want), 2e-5f);
  // The last query row sees every key: the same as non-causal for that row.
  Tensor all = Tensor::empty({1, 2, T, d});
  ASSERT_TRUE(ref::attention(q, k, v, all, 0.25f, false).ok());
  EXPECT_LT(max_abs_diff(out.slice(2, T - 1, T), all.slice(2, T - 1, T)), 2e-5f);
  EXPECT_GT(max_abs_diff(out.slice(2, 0, 1), all.slice(2, 0, 1)), 1e-3f);
}

TEST(FusedAttention, ToleranceCatchesAnOffByOneMask) {
  // The check above would notice a kernel that let each row see one key too many.
  std::mt19937 rng(17);
  const Qkv x = fused_qkv(1, 1, 100, 16, 16, rng);
  Tensor a = Tensor::empty({1, 1, 100, 16}), b = Tensor::empty({1, 1, 100, 16});
  std::vector<int32_t> lo(100, 0), hi(100), hi1(100);
  for (int t = 0; t < 100; ++t) {
    hi[t] = t + 1;
    hi1[t] = std::min(100, t + 2);
  }
  ASSERT_TRUE(ops::attention(x.q, x.k, x.v, a, 0.25f, false, lo.data(), hi.data()).ok());
  ASSERT_TRUE(ref::attention(x.q, x.k, x.v, b, 0.25f, false, lo.data(), hi1.data()).ok());
  EXPECT_GT(max_abs_diff(a, b), 1e-2f);
}

TEST(FusedAttention, RefusesBadShapesNamingThem) {
  std::mt19937 rng(1);
  const Tensor q = random_tensor({1, 2, 4, 8}, rng), k = random_tensor({1, 2, 6, 8}, rng),
               v = random_tensor({1, 2, 6, 8}, rng);
  Tensor out = Tensor::empty({1, 2, 4, 8});
  auto msg = [](const Status& st) { return st.message(); };
  Tensor bad_out = Tensor::empty({1, 2, 5, 8});
  EXPECT_NE(msg(ops::attention(q, k, v, bad_out, 1.f)).find("out f32 (1, 2, 5, 8) should be (1, 2, 4, 8)"),
            std::string::npos)
      << msg(ops::attention(q, k, v, bad_out, 1.f));
  const Tensor k7 = random_tensor({1, 2, 6, 7}, rng);
  EXPECT_NE(msg(ops::attention(q, k7, v, out, 1.f)).find("k f32 (1, 2, 6, 7)"), std::string::npos);
  const Tensor short_k = random_tensor({1, 2, 3, 8}, rng), short_v = random_tensor({1, 2, 3, 8}, rng);
  EXPECT_NE(msg(ops::attention(q, short_k, short_v, out, 1.f, true)).find("3 keys for 4 queries"), std::string::npos);
  const Tensor strided = random_tensor({1, 2, 8, 4}, rng).transpose(2, 3);  // d has stride 4
  EXPECT_NE(msg(ops::attention(strided, k, v, out, 1.f)).find("unit stride"), std::string::npos);
  std::vector<int32_t> lo(4, 0);
  EXPECT_NE(msg(ops::attention(q, k, v, out, 1.f, false, lo.data(), nullptr)).find("key_lo and key_hi"),
            std::string::npos);
  const Tensor ids = Tensor::from_ids({1, 2, 4, 8}, std::vector<int32_t>(64, 1));
  EXPECT_NE(msg(ops::attention(ids, k, v, out, 1.f)).find("q must be f32"), std::string::npos);
  for (auto* f : {&ops::attention, &ref::attention})  // both paths refuse alike
    EXPECT_FALSE(f(q, k, v, bad_out, 1.f, false, nullptr, nullptr).ok());
}

// ---------------------------------------------------------------------------------------------
// Through the model: the fused path's weights for export, chosen heads only.

namespace {

ModelConfig tiny_lm(bool causal) {
  ModelConfig c;
  c.d_model = 32;
  c.n_heads = 4;
  c.d_k = c.d_v = 8;
  c.n_layers = 2;
  c.d_ff = 64;
  c.activation = Activation::gelu_erf;
  c.norm = NormPlacement::pre;
  c.attention.scale = 1.0 / std::sqrt(8.0);
  c.causal = causal;
  c.stem.kind = StemKind::tokens;
  c.stem.vocab_size = 50;
  c.positions.kind = PositionKind::learned;
  c.positions.max_len = 400;
  c.init.scheme = InitScheme::glorot_normal;
  c.init.seed = 3;
  c.weights.allow_missing = true;
  return c;
}

Model build(const ModelConfig& c) {
  Result<Model> m = Model::build(c);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(*m);
}

Batch random_batch(int64_t B, int64_t T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (auto& i : ids) i = static_cast<int32_t>(rng() % 50);
  Batch b;
  b.ids = Tensor::from_ids({B, T}, ids);
  return b;
}

}  // namespace

TEST(FusedAttention, ChosenHeadsWeightsEqualTheFullCapture) {
  for (bool causal : {false, true}) {
    const Model m = build(tiny_lm(causal));
    Batch b = random_batch(2, 300, 9);  // several query and key tiles
    b.lengths = {300, 170};
    ForwardOptions all, some, ref;
    all.capture = some.capture = ref.capture = {"blocks.1.attn.weights", "blocks.1.attn.scores"};
    some.capture_heads = {3, 1};
    ref.reference = true;
    Outputs oa, os, orf;
    ASSERT_TRUE(m.forward(b, all, &oa).ok());
    ASSERT_TRUE(m.forward(b, some, &os).ok());
    ASSERT_TRUE(m.forward(b, ref, &orf).ok());
    EXPECT_LT(max_abs_diff(oa.hidden, orf.hidden), 2e-5f);
    EXPECT_EQ(max_abs_diff(oa.hidden, os.hidden), 0.f);  // choosing heads changes no output
    for (const char* name : {"blocks.1.attn.weights", "blocks.1.attn.scores"}) {
      const Tensor w = oa.captured.at(name), s = os.captured.at(name);
      ASSERT_EQ(s.shape(), Shape({2, 2, 300, 300})) << name;
      EXPECT_EQ(max_abs_diff(s.select(1, 0), w.select(1, 3)), 0.f) << name;
      EXPECT_EQ(max_abs_diff(s.select(1, 1), w.select(1, 1)), 0.f) << name;
    }
    EXPECT_LT(max_abs_diff(oa.captured.at("blocks.1.attn.weights"), orf.captured.at("blocks.1.attn.weights")), 1e-6f);
    // Padding columns carry no weight; the padded item's weights match the reference path's.
    const Tensor w = oa.captured.at("blocks.1.attn.weights");
    for (int64_t j = 170; j < 300; j += 13) EXPECT_EQ(w.at({1, 2, 5, j}), 0.f);
  }
}

TEST(FusedAttention, PaddingBetweenSequencesFallsBackAndStillMatches) {
  // Segments the fused kernel cannot express as one run of keys per row (padding between two
  // packed sequences) take the materialised path: same results as the reference.
  const Model m = build(tiny_lm(false));
  Batch b = random_batch(1, 12, 4);
  b.segments = Tensor::from_ids({1, 12}, {0, 0, 0, 0, -1, -1, 1, 1, 1, 1, 1, -1});
  ForwardOptions fast, ref;
  ref.reference = true;
  Outputs of, orf;
  ASSERT_TRUE(m.forward(b, fast, &of).ok());
  ASSERT_TRUE(m.forward(b, ref, &orf).ok());
  EXPECT_LT(max_abs_diff(of.hidden, orf.hidden), 2e-5f);
}
