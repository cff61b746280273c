// The transformer: parity with PyTorch's own TransformerEncoderLayer (post- and pre-LN, causal,
// padded), fast path vs reference loops over every model variant, padding, causality,
// positions, heads, seeded init, and weights in and out of safetensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "model/arena.h"
#include "model/layers.h"
#include "tessera/model.h"
#include "tessera/plugin.h"
#include "tessera/random.h"
#include "tessera/safetensors.h"
#include "tessera/train.h"

using namespace tessera;

namespace {

const std::string kRef = std::string(TESSERA_TEST_DATA) + "/reference/";

// A small model with every default resolved, as the config loader would leave it.
ModelConfig small(int64_t C = 16, int64_t H = 4) {
  ModelConfig c;
  c.d_model = C;
  c.n_heads = H;
  c.d_k = c.d_v = C / H;
  c.d_ff = 2 * C;
  c.n_layers = 2;
  c.activation = Activation::gelu_erf;
  c.norm = NormPlacement::pre;
  c.final_norm = true;
  c.attention.scale = 1.0 / std::sqrt(static_cast<double>(c.d_k));
  c.stem.kind = StemKind::tokens;
  c.stem.vocab_size = 50;
  c.positions.rotary_dims = c.d_k;
  c.positions.max_len = 64;
  c.positions.max_distance = 3;
  c.init.scheme = InitScheme::glorot_normal;
  c.init.seed = 7;
  c.weights.allow_missing = true;
  return c;
}

Batch random_ids(int64_t B, int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (auto& v : ids) v = static_cast<int32_t>(g() % V);
  Batch b;
  b.ids = Tensor::from_ids({B, T}, ids);
  return b;
}

Batch random_rows(int64_t B, int64_t T, int64_t F, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(B * T * F));
  for (auto& x : v) x = n(g);
  Batch b;
  b.rows = Tensor::from_vector({B, T, F}, v);
  return b;
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  float m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

Model build(const ModelConfig& c) {
  Result<Model> m = Model::build(c);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

Outputs run(const Model& m, const Batch& b, bool reference = false, std::set<std::string> capture = {}) {
  ForwardOptions o;
  o.reference = reference;
  o.capture = std::move(capture);
  Outputs out;
  Status st = m.forward(b, o, &out);
  EXPECT_TRUE(st.ok()) << st.message();
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Parity with PyTorch (fixtures from tools/reference/make_block_fixtures.py).

class TorchBlockParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchBlockParity, OutputsAndAttentionMatch) {
  const std::string name = GetParam();
  auto io = safetensors::File::open(kRef + name + ".io.safetensors");
  ASSERT_TRUE(io.ok()) << io.status().message();
  const auto& meta = io->metadata();
  ModelConfig c = small(16, 4);
  c.n_layers = 1;
  c.d_ff = 32;
  c.stem.kind = StemKind::identity;
  c.final_norm = false;
  c.norm = meta.at("norm") == "pre" ? NormPlacement::pre : NormPlacement::post;
  c.activation = meta.at("activation") == "relu" ? Activation::relu : Activation::gelu_erf;
  c.causal = meta.at("causal") == "true";
  c.norm_eps = 1e-5;
  c.weights.file = kRef + name + ".safetensors";
  c.weights.allow_missing = false;
  const Model m = build(c);

  Batch b;
  b.rows = io->get("input").value();
  const Tensor lengths = io->get("lengths").value();
  for (int64_t i = 0; i < lengths.numel(); ++i) b.lengths.push_back(static_cast<int64_t>(lengths.at({i})));
  for (bool reference : {false, true}) {
    Outputs out = run(m, b, reference, {"blocks.0.attn.weights"});
    EXPECT_LT(max_abs_diff(out.hidden, io->get("output").value()), 2e-5f) << name << " reference=" << reference;
    EXPECT_LT(max_abs_diff(out.captured.at("blocks.0.attn.weights"), io->get("attn").value()), 1e-6f) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Torch, TorchBlockParity,
                         ::testing::Values("block_post_relu", "block_pre_gelu", "block_post_gelu_causal",
                                           "block_pre_relu_causal"));

// ---------------------------------------------------------------------------------------------
// Fast path == reference loops, for every kind of model.

struct Variant {
  const char* name;
  void (*apply)(ModelConfig&);
};

class FastMatchesReference : public ::testing::TestWithParam<Variant> {};

TEST_P(FastMatchesReference, SameOutputs) {
  ModelConfig c = small();
  GetParam().apply(c);
  const Model m = build(c);
  const int64_t B = 3, T = 9;
  Batch b = c.stem.kind == StemKind::tokens
                ? random_ids(B, T, c.stem.vocab_size, 3)
                : random_rows(B, T, c.stem.kind == StemKind::features ? c.stem.n_features : c.d_model, 3);
  b.lengths = {9, 5, 1};
  const Outputs fast = run(m, b, false, {"*"}), ref = run(m, b, true, {"*"});
  const float tol = c.dtype == DType::bf16 ? 2e-2f : 2e-5f;
  EXPECT_LT(max_abs_diff(fast.hidden, ref.hidden), tol);
  for (const auto& [a, r] : {std::pair{fast.logits, ref.logits}, {fast.probs, ref.probs}, {fast.pooled, ref.pooled}}) {
    EXPECT_EQ(a.defined(), r.defined());
    if (a.defined()) {
      EXPECT_LT(max_abs_diff(a, r), tol);
    }
  }
  ASSERT_EQ(fast.captured.size(), ref.captured.size());
  for (const auto& [name, t] : fast.captured) {
    const auto a = t.to_vector(), r = ref.captured.at(name).to_vector();
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isinf(a[i]) || std::isinf(r[i])) {
        EXPECT_EQ(a[i], r[i]) << name;  // masks: -inf in the same places
        continue;
      }
      ASSERT_NEAR(a[i], r[i], tol * std::max(1.f, std::fabs(r[i]))) << name << " at " << i;
    }
  }
  for (float v : fast.hidden.to_vector()) ASSERT_TRUE(std::isfinite(v));
}

const Variant kVariants[] = {
    {"pre_ln_gelu", [](ModelConfig&) {}},
    {"post_ln_relu", [](ModelConfig& c) { c.norm = NormPlacement::post; c.final_norm = false; c.activation = Activation::relu; }},
    {"no_norm", [](ModelConfig& c) { c.norm = NormPlacement::none; c.final_norm = false; }},
    {"causal_gelu_tanh", [](ModelConfig& c) { c.causal = true; c.activation = Activation::gelu_tanh; }},
    {"sinusoidal", [](ModelConfig& c) { c.positions.kind = PositionKind::sinusoidal; }},
    {"learned", [](ModelConfig& c) { c.positions.kind = PositionKind::learned; }},
    {"relative", [](ModelConfig& c) { c.positions.kind = PositionKind::relative; }},
    {"rotary_half", [](ModelConfig& c) { c.positions.kind = PositionKind::rotary; }},
    {"rotary_interleaved_partial", [](ModelConfig& c) {
       c.positions.kind = PositionKind::rotary; c.positions.rotary_style = RotaryStyle::interleaved;
       c.positions.rotary_dims = 2; }},
    {"dk_dv_differ", [](ModelConfig& c) { c.d_k = 3; c.d_v = 5; c.attention.scale = 1 / std::sqrt(3.0); }},
    {"no_bias_no_ffn", [](ModelConfig& c) { c.bias = false; c.d_ff = 0; }},
    {"features_cls_classifier", [](ModelConfig& c) {
       c.stem.kind = StemKind::features; c.stem.n_features = 12; c.stem.cls = true;
       c.positions.kind = PositionKind::learned; c.head.kind = HeadKind::classifier; c.head.n_classes = 5;
       c.head.pool = PoolKind::cls; }},
    {"identity_mean_pool_normalized", [](ModelConfig& c) {
       c.stem.kind = StemKind::identity; c.head.kind = HeadKind::pool; c.head.pool = PoolKind::mean;
       c.head.normalize = true; }},
    {"lm_tied", [](ModelConfig& c) { c.causal = true; c.head.kind = HeadKind::lm; c.head.tied = true; }},
    {"lm_untied_scaled", [](ModelConfig& c) {
       c.causal = true; c.head.kind = HeadKind::lm; c.head.tied = false; c.stem.scale = EmbedScale::sqrt_d_model; }},
    {"bf16", [](ModelConfig& c) { c.dtype = DType::bf16; }},
};

INSTANTIATE_TEST_SUITE_P(Variants, FastMatchesReference, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Padding, causality, permutation.

TEST(Model, PaddedItemsMatchRunningAlone) {
  ModelConfig c = small();
  c.head.kind = HeadKind::pool;
  c.head.pool = PoolKind::mean;
  c.positions.kind = PositionKind::learned;
  const Model m = build(c);
  const int64_t T = 8;
  Batch b = random_ids(3, T, c.stem.vocab_size, 11);
  b.lengths = {8, 3, 5};
  const Outputs all = run(m, b);
  for (int64_t i = 0; i < 3; ++i) {
    const int64_t n = b.lengths[static_cast<size_t>(i)];
    Batch one;
    one.ids = b.ids.select(0, i).slice(0, 0, n).contiguous().unsqueeze(0);
    const Outputs alone = run(m, one);
    EXPECT_LT(max_abs_diff(all.hidden.select(0, i).slice(0, 0, n), alone.hidden.select(0, 0)), 1e-5f) << i;
    EXPECT_LT(max_abs_diff(all.pooled.select(0, i), alone.pooled.select(0, 0)), 1e-5f) << i;
  }
}

TEST(Model, CausalRowsNeverSeeLaterColumns) {
  ModelConfig c = small();
  c.causal = true;
  const Model m = build(c);
  Batch a = random_ids(1, 6, c.stem.vocab_size, 5);
  Batch b;
  b.ids = a.ids.clone();
  b.ids.data<int32_t>()[5] = (a.ids.data<int32_t>()[5] + 1) % 50;  // change only the last token
  const Outputs oa = run(m, a, false, {"blocks.0.attn.weights", "blocks.1.attn.weights"});
  const Outputs ob = run(m, b);
  EXPECT_LT(max_abs_diff(oa.hidden.select(0, 0).slice(0, 0, 5), ob.hidden.select(0, 0).slice(0, 0, 5)), 1e-6f);
  EXPECT_GT(max_abs_diff(oa.hidden.select(0, 0).slice(0, 5, 6), ob.hidden.select(0, 0).slice(0, 5, 6)), 1e-4f);
  for (const char* n : {"blocks.0.attn.weights", "blocks.1.attn.weights"}) {
    const Tensor w = oa.captured.at(n);  // (1, H, T, T)
    for (int64_t h = 0; h < c.n_heads; ++h)
      for (int64_t i = 0; i < 6; ++i)
        for (int64_t j = i + 1; j < 6; ++j) EXPECT_EQ(w.at({0, h, i, j}), 0.f);
  }
}

TEST(Model, FullyMaskedItemGivesFiniteOutput) {
  ModelConfig c = small();
  const Model m = build(c);
  Batch b = random_ids(2, 4, c.stem.vocab_size, 2);
  b.lengths = {4, 0};
  const Outputs o = run(m, b, false, {"blocks.0.attn.weights"});
  for (float v : o.hidden.to_vector()) ASSERT_TRUE(std::isfinite(v));
  for (float v : o.captured.at("blocks.0.attn.weights").select(0, 1).to_vector()) EXPECT_EQ(v, 0.f);
}

class Permutation : public ::testing::TestWithParam<PositionKind> {};

TEST_P(Permutation, EquivariantOnlyWithoutPositions) {
  ModelConfig c = small();
  c.positions.kind = GetParam();
  const Model m = build(c);
  const std::vector<int32_t> ids = {3, 14, 15, 9, 26, 5};
  const std::vector<int> perm = {4, 2, 0, 5, 1, 3};
  std::vector<int32_t> pids;
  for (int p : perm) pids.push_back(ids[static_cast<size_t>(p)]);
  const Outputs a = run(m, Batch::from_ids(ids)), b = run(m, Batch::from_ids(pids));
  float worst = 0;
  for (size_t i = 0; i < perm.size(); ++i)
    worst = std::max(worst, max_abs_diff(b.hidden.select(0, 0).select(0, static_cast<int64_t>(i)),
                                         a.hidden.select(0, 0).select(0, perm[i])));
  if (GetParam() == PositionKind::none) EXPECT_LT(worst, 1e-5f);  // rows permuted, nothing else
  else EXPECT_GT(worst, 1e-3f) << position_kind_name(GetParam());  // order now matters
}

INSTANTIATE_TEST_SUITE_P(Positions, Permutation,
                         ::testing::Values(PositionKind::none, PositionKind::sinusoidal, PositionKind::learned,
                                           PositionKind::relative, PositionKind::rotary),
                         [](const auto& info) { return std::string(position_kind_name(info.param)); });

// ---------------------------------------------------------------------------------------------
// Positions against their definitions.

TEST(Positions, SinusoidalTableFollowsThe2017Formula) {
  const Tensor pe = model::sinusoidal_table(50, 6, 10000.0);
  for (int64_t p : {0, 1, 7, 49})
    for (int64_t i = 0; i < 3; ++i) {
      const double a = p / std::pow(10000.0, 2.0 * i / 6);
      EXPECT_NEAR(pe.at({p, 2 * i}), std::sin(a), 1e-6);
      EXPECT_NEAR(pe.at({p, 2 * i + 1}), std::cos(a), 1e-6);
    }
}

TEST(Positions, RotaryRotatesPairsByPositionAngles) {
  // One row (B = H = 1) of D = 6 at positions 0..4; half style pairs (i, i + 3).
  Tensor x = Tensor::empty({1, 1, 5, 6});
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = u(g);
  for (RotaryStyle style : {RotaryStyle::half, RotaryStyle::interleaved}) {
    Tensor y = x.clone();
    model::apply_rotary(y, 6, 100.0, style, 2);
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t i = 0; i < 3; ++i) {
        const int64_t a = style == RotaryStyle::half ? i : 2 * i, b = style == RotaryStyle::half ? i + 3 : 2 * i + 1;
        const double th = (t + 2) * std::pow(100.0, -2.0 * i / 6);
        const double xr = x.at({0, 0, t, a}), xi = x.at({0, 0, t, b});  // (xr + i·xi) · e^{iθ}
        EXPECT_NEAR(y.at({0, 0, t, a}), xr * std::cos(th) - xi * std::sin(th), 1e-6);
        EXPECT_NEAR(y.at({0, 0, t, b}), xi * std::cos(th) + xr * std::sin(th), 1e-6);
      }
  }
}

TEST(Positions, RotaryScoresDependOnlyOnOffsets) {
  // q·k after rotation at positions (m, n) equals the same at (m + s, n + s).
  Tensor q = Tensor::from_vector({1, 1, 1, 4}, {0.3f, -1.2f, 0.7f, 0.5f});
  Tensor k = Tensor::from_vector({1, 1, 1, 4}, {-0.4f, 0.9f, 1.1f, -0.2f});
  auto score = [&](int64_t m, int64_t n) {
    Tensor a = q.clone(), b = k.clone();
    model::apply_rotary(a, 4, 10000.0, RotaryStyle::half, m);
    model::apply_rotary(b, 4, 10000.0, RotaryStyle::half, n);
    double s = 0;
    for (int64_t d = 0; d < 4; ++d) s += a.at({0, 0, 0, d}) * b.at({0, 0, 0, d});
    return s;
  };
  EXPECT_NEAR(score(3, 1), score(10, 8), 1e-5);
  EXPECT_GT(std::fabs(score(3, 1) - score(1, 3)), 1e-3);
}

TEST(Positions, RelativeMatchesShawDefinition) {
  // One layer, one head: compare with e_ij = q_i·(k_j + a^K_ij)·s, z_i = Σ_j α_ij (v_j + a^V_ij).
  ModelConfig c = small(4, 1);
  c.n_layers = 1;
  c.d_ff = 0;
  c.norm = NormPlacement::none;
  c.final_norm = false;
  c.residual = false;
  c.attention.output_projection = false;
  c.stem.kind = StemKind::identity;
  c.positions.kind = PositionKind::relative;
  c.positions.max_distance = 2;
  c.causal = true;
  const Model m = build(c);
  const int64_t T = 6;
  Batch b = random_rows(1, T, 4, 9);
  const Outputs o = run(m, b, false, {"blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v"});
  const Tensor q = o.captured.at("blocks.0.attn.q").select(0, 0).select(0, 0);
  const Tensor k = o.captured.at("blocks.0.attn.k").select(0, 0).select(0, 0);
  const Tensor v = o.captured.at("blocks.0.attn.v").select(0, 0).select(0, 0);
  const Tensor rk = *m.parameter("blocks.0.attn.rel_k"), rv = *m.parameter("blocks.0.attn.rel_v");
  for (int64_t i = 0; i < T; ++i) {
    std::vector<double> e(static_cast<size_t>(i + 1));
    double mx = -1e30, sum = 0;
    for (int64_t j = 0; j <= i; ++j) {
      const int64_t r = std::clamp<int64_t>(j - i, -2, 2) + 2;
      double s = 0;
      for (int64_t d = 0; d < 4; ++d) s += q.at({i, d}) * (k.at({j, d}) + rk.at({r, d}));
      e[static_cast<size_t>(j)] = s * c.attention.scale;
      mx = std::max(mx, e[static_cast<size_t>(j)]);
    }
    for (auto& x : e) sum += (x = std::exp(x - mx));
    for (int64_t d = 0; d < 4; ++d) {
      double z = 0;
      for (int64_t j = 0; j <= i; ++j) {
        const int64_t r = std::clamp<int64_t>(j - i, -2, 2) + 2;
        z += e[static_cast<size_t>(j)] / sum * (v.at({j, d}) + rv.at({r, d}));
      }
      EXPECT_NEAR(o.hidden.at({0, i, d}), z, 1e-5) << i << "," << d;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Heads.

TEST(Heads, PoolingAndProbabilities) {
  ModelConfig c = small();
  c.stem.kind = StemKind::identity;
  c.head.kind = HeadKind::classifier;
  c.head.n_classes = 3;
  for (PoolKind pool : {PoolKind::mean, PoolKind::last, PoolKind::max}) {
    c.head.pool = pool;
    const Model m = build(c);
    Batch b = random_rows(2, 5, c.d_model, 4);
    b.lengths = {5, 3};
    const Outputs o = run(m, b);
    for (int64_t i = 0; i < 2; ++i) {
      const int64_t n = b.lengths[static_cast<size_t>(i)];
      for (int64_t d = 0; d < c.d_model; ++d) {
        double want = 0;
        if (pool == PoolKind::last) want = o.hidden.at({i, n - 1, d});
        else if (pool == PoolKind::max) {  // the valid rows only: padding never wins
          want = o.hidden.at({i, 0, d});
          for (int64_t t = 1; t < n; ++t) want = std::max(want, static_cast<double>(o.hidden.at({i, t, d})));
        } else {
          for (int64_t t = 0; t < n; ++t) want += o.hidden.at({i, t, d});
          want /= static_cast<double>(n);
        }
        EXPECT_NEAR(o.pooled.at({i, d}), want, 1e-5);
      }
      double s = 0;
      for (int64_t k = 0; k < 3; ++k) s += o.probs.at({i, k});
      EXPECT_NEAR(s, 1.0, 1e-6);
    }
  }
}

TEST(Heads, MaxPoolingsGradientMatchesFiniteDifferencesAndSkipsPadding) {
  // A classifier on max-pooled rows: the backward sends each channel's gradient to the row that
  // held its maximum. Central differences of the loss in the input rows (identity stem) and in the
  // classifier's weights, on the reference loops and on the fast path; padding rows get nothing.
  ModelConfig c = small();
  c.n_layers = 1;
  c.stem.kind = StemKind::identity;
  c.head.kind = HeadKind::classifier;
  c.head.n_classes = 3;
  c.head.pool = PoolKind::max;
  Result<Parameters> P = Parameters::resolve(c);
  ASSERT_TRUE(P.ok()) << P.status().message();
  Parameters params = P->clone();
  const int64_t B = 2, T = 5, C = c.d_model;
  Batch b = random_rows(B, T, C, 11);
  b.lengths = {5, 3};
  Targets t;
  t.labels = Tensor::from_ids({B}, {2, 0});
  for (bool reference : {true, false}) {
    SCOPED_TRACE(reference ? "reference" : "fast");
    GradOptions o;
    o.reference = reference;
    Parameters grads = params.zeros_like();
    Result<LossValue> r = compute_gradients(c, params, b, t, &grads, o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(r->d_rows.numel(), B * T * C);
    auto loss_at = [&](const Batch& bb, const Parameters& pp) {
      Parameters g = pp.zeros_like();
      Result<LossValue> l = compute_gradients(c, pp, bb, t, &g, o);
      EXPECT_TRUE(l.ok());
      return l.ok() ? l->loss : 0.0;
    };
    const float eps = 1e-3f;
    double largest = 0;
    for (float v : r->d_rows.to_vector()) largest = std::max(largest, static_cast<double>(std::fabs(v)));
    ASSERT_GT(largest, 1e-3);
    for (int64_t k = 0; k < B * T * C; k += 3) {
      Batch up = b, down = b;
      up.rows = b.rows.clone();
      down.rows = b.rows.clone();
      up.rows.data<float>()[k] += eps;
      down.rows.data<float>()[k] -= eps;
      const double fd = (loss_at(up, params) - loss_at(down, params)) / (2.0 * eps);
      EXPECT_NEAR(r->d_rows.data<float>()[k], fd, 2e-3 * largest + 2e-2 * std::fabs(fd)) << "row value " << k;
    }
    for (int64_t k = 3 * C; k < T * C; ++k) EXPECT_EQ(r->d_rows.data<float>()[T * C + k], 0.f) << "padding " << k;
    const Tensor& gw = grads.get("head.w");
    for (int64_t k = 0; k < gw.numel(); k += 5) {
      Parameters up = params.clone(), down = params.clone();
      up.find("head.w")->data<float>()[k] += eps;
      down.find("head.w")->data<float>()[k] -= eps;
      const double fd = (loss_at(b, up) - loss_at(b, down)) / (2.0 * eps);
      EXPECT_NEAR(gw.data<float>()[k], fd, 2e-3 * std::max(1.0, std::fabs(fd))) << "head.w " << k;
    }
  }
}

TEST(Heads, LanguageModelGivesNextTokenProbabilitiesAfterTheLastValidRow) {
  ModelConfig c = small();
  c.causal = true;
  c.head.kind = HeadKind::lm;
  const Model m = build(c);
  Batch b = random_ids(2, 6, c.stem.vocab_size, 8);
  b.lengths = {6, 4};
  const Outputs o = run(m, b);
  ASSERT_EQ(o.logits.shape(), Shape({2, 6, 50}));
  ASSERT_EQ(o.probs.shape(), Shape({2, 50}));
  // Tied: logits = hidden · embedᵀ.
  const Tensor E = *m.parameter("stem.embed");
  double logit = 0;
  for (int64_t d = 0; d < c.d_model; ++d) logit += o.hidden.at({1, 3, d}) * E.at({7, d});
  EXPECT_NEAR(o.logits.at({1, 3, 7}), logit, 1e-4);
  double mx = -1e30, sum = 0;
  for (int64_t v = 0; v < 50; ++v) mx = std::max<double>(mx, o.logits.at({1, 3, v}));
  for (int64_t v = 0; v < 50; ++v) sum += std::exp(o.logits.at({1, 3, v}) - mx);
  EXPECT_NEAR(o.probs.at({1, 7}), std::exp(o.logits.at({1, 3, 7}) - mx) / sum, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Seeded init and weights.

TEST(Weights, SameSeedSameWeightsOtherSeedOtherWeights) {
  ModelConfig c = small();
  const Model a = build(c), b = build(c);
  c.init.seed = 8;
  const Model d = build(c);
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    EXPECT_EQ(a.parameters()[i].second.to_vector(), b.parameters()[i].second.to_vector()) << a.parameters()[i].first;
  }
  EXPECT_NE(a.parameter("blocks.0.attn.w_q")->to_vector(), d.parameter("blocks.0.attn.w_q")->to_vector());
  // Norm scales start at 1, biases at 0.
  for (float v : a.parameter("blocks.1.ln2.gamma")->to_vector()) EXPECT_EQ(v, 1.f);
  for (float v : a.parameter("blocks.1.attn.b_o")->to_vector()) EXPECT_EQ(v, 0.f);
}

TEST(Weights, SaveThenLoadGivesTheSameModel) {
  ModelConfig c = small();
  c.positions.kind = PositionKind::relative;
  const Model a = build(c);
  const std::string path = ::testing::TempDir() + "tessera_model_roundtrip.safetensors";
  ASSERT_TRUE(a.save(path).ok());
  ModelConfig c2 = c;
  c2.init.seed = 999;  // must not matter: everything comes from the file
  c2.weights.file = path;
  c2.weights.allow_missing = false;
  const Model b = build(c2);
  const Batch in = random_ids(2, 7, 50, 1);
  EXPECT_EQ(run(a, in).hidden.to_vector(), run(b, in).hidden.to_vector());
  std::remove(path.c_str());
}

TEST(Weights, EveryProblemIsReportedTogether) {
  ModelConfig c = small();
  c.n_layers = 1;
  const Model a = build(c);
  std::vector<std::pair<std::string, Tensor>> params;
  for (const auto& [n, t] : a.parameters()) {
    if (n == "blocks.0.ffn.w2") continue;                                        // missing
    if (n == "blocks.0.attn.w_k") params.emplace_back(n, Tensor::zeros({16, 5}));  // wrong shape
    else params.emplace_back(n, t);
  }
  params.emplace_back("blocks.0.attn.w_z", Tensor::zeros({2}));  // unexpected
  const std::string path = ::testing::TempDir() + "tessera_bad_weights.safetensors";
  ASSERT_TRUE(safetensors::write(path, params).ok());
  c.weights.file = path;
  c.weights.allow_missing = false;
  Result<Model> m = Model::build(c);
  ASSERT_FALSE(m.ok());
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("3 problem(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing tensor \"blocks.0.ffn.w2\" (32, 16)"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path + ": model.weights.file: tensor \"blocks.0.attn.w_k\" in " + path +
                     " has shape (16, 5) but the model expects (16, 16)"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected tensor \"blocks.0.attn.w_z\""), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  std::remove(path.c_str());
}

// A masked-LM checkpoint (an ESM-style tied LM head with its transform and bias) under a new
// classifier head: the file's LM-head tensors are unexpected for the classifier and refused, unless
// model.weights.ignore names them; then the body comes from the file, bit for bit, and the new
// head is initialised as in a model given no file. An entry naming none of the file's tensors
// (a typo, or a prefix that does not end at a dot) is refused.
TEST(Weights, IgnoreLetsAClassifierStartFromAnLmCheckpoint) {
  ModelConfig lm = small();
  lm.head.kind = HeadKind::lm;
  lm.head.tied = true;
  lm.head.transform = true;
  lm.head.lm_bias = true;
  const Model pretrained = build(lm);
  const std::string path = ::testing::TempDir() + "tessera_mlm_checkpoint.safetensors";
  ASSERT_TRUE(pretrained.save(path).ok());

  ModelConfig c = small();
  c.head.kind = HeadKind::classifier;
  c.head.n_classes = 5;
  c.init.seed = 11;
  const Model scratch = build(c);
  c.weights.file = path;
  c.weights.allow_missing = true;  // the new head
  Result<Model> refused = Model::build(c);
  ASSERT_FALSE(refused.ok());
  const std::string& msg = refused.status().message();
  EXPECT_NE(msg.find("5 problem(s)"), std::string::npos) << msg;
  for (const char* t :
       {"head.transform.w", "head.transform.b", "head.transform.gamma", "head.transform.beta", "head.lm_bias"})
    EXPECT_NE(msg.find("unexpected tensor \"" + std::string(t) + "\""), std::string::npos) << msg;

  c.weights.ignore = {"head"};
  const Model tuned = build(c);
  for (const auto& [name, t] : tuned.parameters()) {
    const Tensor want = name.rfind("head.", 0) == 0 ? *scratch.parameter(name) : *pretrained.parameter(name);
    EXPECT_EQ(t.to_vector(), want.to_vector()) << name;
  }
  c.weights.ignore = {"head.transform", "head.lm_bias"};  // by name and by a prefix: the same
  EXPECT_TRUE(Model::build(c).ok());

  c.weights.ignore = {"head", "heads", "head.trans"};
  c.weights.ignore_where = Location{"tune.yaml", 9, 11};
  Result<Model> typo = Model::build(c);
  ASSERT_FALSE(typo.ok());
  const std::string& t = typo.status().message();
  EXPECT_NE(t.find("2 problem(s)"), std::string::npos) << t;
  EXPECT_NE(t.find("tune.yaml:9:11: model.weights.ignore: entry 1: \"heads\" names none of the tensors in " + path),
            std::string::npos) << t;
  EXPECT_NE(t.find("entry 2: \"head.trans\" names none"), std::string::npos) << t;
  std::remove(path.c_str());
}

TEST(Weights, PerHeadTensorsFillTheirColumns) {
  ModelConfig c = small(4, 2);
  c.n_layers = 1;
  c.d_k = 1;
  c.d_v = 2;
  Location here{"inline.yaml", 3, 5};
  c.weights.inline_tensors["blocks.0.attn.head1.w_q"] = {Tensor::from_vector({4, 1}, {1, 2, 3, 4}), here};
  c.weights.inline_tensors["blocks.0.attn.head0.w_v"] = {Tensor::from_vector({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}), here};
  const Model m = build(c);
  const Tensor wq = *m.parameter("blocks.0.attn.w_q"), wv = *m.parameter("blocks.0.attn.w_v");
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(wq.at({r, 1}), static_cast<float>(r + 1));
    EXPECT_EQ(wv.at({r, 0}), static_cast<float>(2 * r + 1));
    EXPECT_EQ(wv.at({r, 1}), static_cast<float>(2 * r + 2));
  }
  // Columns not given keep their seeded values, identical to a model given nothing.
  ModelConfig plain = c;
  plain.weights.inline_tensors.clear();
  const Model p = build(plain);
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(wq.at({r, 0}), p.parameter("blocks.0.attn.w_q")->at({r, 0}));

  c.weights.inline_tensors["blocks.0.attn.head2.w_q"] = {Tensor::from_vector({4, 1}, {1, 2, 3, 4}), here};
  Result<Model> bad = Model::build(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("inline.yaml:3:5: model.weights.inline.blocks.0.attn.head2.w_q: tensor "
                                        "\"blocks.0.attn.head2.w_q\": head 2 does not exist (the model has n_heads = 2)"),
            std::string::npos) << bad.status().message();
}

TEST(Weights, InlineHeadsOverlayTheFile) {
  ModelConfig c = small(4, 2);
  c.n_layers = 1;
  const Model a = build(c);
  const std::string path = ::testing::TempDir() + "tessera_overlay.safetensors";
  ASSERT_TRUE(a.save(path).ok());
  c.weights.file = path;
  c.weights.allow_missing = false;
  c.weights.inline_tensors["blocks.0.attn.head1.w_k"] = {Tensor::from_vector({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}), {}};
  const Model b = build(c);
  const Tensor wa = *a.parameter("blocks.0.attn.w_k"), wb = *b.parameter("blocks.0.attn.w_k");
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(wb.at({r, 0}), wa.at({r, 0}));  // head 0 from the file
    EXPECT_EQ(wb.at({r, 2}), static_cast<float>(2 * r + 1));  // head 1 from the YAML
    EXPECT_EQ(wb.at({r, 3}), static_cast<float>(2 * r + 2));
  }
  // Whole and per head, both inline: refused.
  c.weights.inline_tensors["blocks.0.attn.w_k"] = {Tensor::zeros({4, 4}), {"x.yaml", 2, 3}};
  Result<Model> bad = Model::build(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"blocks.0.attn.w_k\" is given both whole and per head"), std::string::npos)
      << bad.status().message();
  std::remove(path.c_str());
}

TEST(Model, RefusesInputsThatDoNotFit) {
  ModelConfig c = small();
  c.positions.kind = PositionKind::learned;
  c.positions.max_len = 8;
  const Model m = build(c);
  Outputs o;
  Status st = m.forward(random_ids(1, 9, 50, 1), {}, &o);
  EXPECT_EQ(st.message(), "forward: 9 rows exceed positions.max_len = 8 (shorten the input or raise max_len)");
  st = m.forward(random_rows(1, 4, 16, 1), {}, &o);
  EXPECT_EQ(st.message(), "forward: stem.kind tokens needs token ids (B, T) i32, got feature rows");
  Batch b = random_ids(1, 4, 50, 1);
  b.ids.data<int32_t>()[2] = 50;
  st = m.forward(b, {}, &o);
  EXPECT_NE(st.message().find("token id 50 at position 2 is outside the vocabulary [0, 50)"), std::string::npos)
      << st.message();
  b = random_ids(2, 4, 50, 1);
  b.lengths = {4, 5};
  st = m.forward(b, {}, &o);
  EXPECT_EQ(st.message(), "forward: item 1 has length 5 outside [0, 4]");
}

TEST(Plan, ScoreCountsAreNSquared) {
  ModelConfig c = small();
  const std::pair<int64_t, int64_t> table[] = {{4, 16}, {8, 64}, {128, 16384}, {1024, 1048576}};
  for (auto [n, n2] : table) EXPECT_EQ(make_plan(c, n).score_entries_per_head, n2);
  // Doubling the sequence multiplies the score count by four.
  EXPECT_EQ(make_plan(c, 256).score_entries_per_head, 4 * make_plan(c, 128).score_entries_per_head);
}

TEST(Plan, CountsParametersAndFlops) {
  ModelConfig c = small();  // C 16, H 4, d_k 4, d_ff 32, 2 layers, vocab 50, pre-LN + final norm
  const Plan p = make_plan(c, 10);
  const int64_t per_layer = 3 * (16 * 16 + 16) + (16 * 16 + 16) + 2 * 16 + (16 * 32 + 32) + (32 * 16 + 16) + 2 * 16;
  EXPECT_EQ(p.parameters, 50 * 16 + 2 * per_layer + 2 * 16);
  const double T = 10, flops_layer = 2 * T * 16 * 48 + 2 * 4 * T * T * 4 * 2 + 2 * T * 16 * 16 + 2 * T * 16 * 32 * 2;
  EXPECT_DOUBLE_EQ(p.flops_per_item, 2 * flops_layer);
  const Model m = build(c);
  int64_t n = 0;
  for (const auto& [name, t] : m.parameters()) n += t.numel();
  EXPECT_EQ(n, p.parameters);
}

// ---------------------------------------------------------------------------------------------
// Batches as plugins make them: packing, roles, mixed stems, modality embeddings.

TEST(Batches, PackedSequencesMatchRunningEachAlone) {
  for (PositionKind kind : {PositionKind::learned, PositionKind::rotary, PositionKind::relative}) {
    ModelConfig c = small();
    c.positions.kind = kind;
    c.causal = kind == PositionKind::rotary;  // both masks, packed
    const Model m = build(c);
    // Row 0 packs sequences of 3 and 4 rows, then 1 padding row; row 1 holds one sequence of 5.
    Batch packed = random_ids(2, 8, 50, 21);
    packed.segments = Tensor::from_ids({2, 8}, {0, 0, 0, 1, 1, 1, 1, -1, 0, 0, 0, 0, 0, -1, -1, -1});
    const Outputs o = run(m, packed);
    const std::vector<std::tuple<int64_t, int64_t, int64_t>> seqs = {{0, 0, 3}, {0, 3, 4}, {1, 0, 5}};
    for (auto [b, start, n] : seqs) {
      Batch one;
      one.ids = packed.ids.select(0, b).slice(0, start, start + n).contiguous().unsqueeze(0);
      const Outputs alone = run(m, one);
      EXPECT_LT(max_abs_diff(o.hidden.select(0, b).slice(0, start, start + n), alone.hidden.select(0, 0)), 1e-5f)
          << position_kind_name(kind) << " sequence at " << b << ":" << start;
    }
  }
}

TEST(Batches, RolesPlaceTheLearnedClsRow) {
  ModelConfig c = small();
  c.stem.kind = StemKind::features;
  c.stem.n_features = 6;
  c.stem.cls = true;
  c.positions.kind = PositionKind::learned;
  c.head.kind = HeadKind::pool;
  c.head.pool = PoolKind::cls;
  const Model m = build(c);
  // Without roles the model prepends the CLS row; with roles the plugin's CLS row is used instead.
  Batch raw = random_rows(1, 4, 6, 3);
  Batch with_roles;
  with_roles.rows = Tensor::zeros({1, 5, 6});
  with_roles.rows.slice(1, 1, 5).copy_from(raw.rows);
  with_roles.roles = Tensor::zeros({1, 5}, DType::u8);
  with_roles.roles.data<uint8_t>()[0] = TSR_ROLE_CLS;
  const Outputs a = run(m, raw), b = run(m, with_roles);
  EXPECT_EQ(a.hidden.shape(), Shape({1, 5, 16}));
  EXPECT_LT(max_abs_diff(a.hidden, b.hidden), 1e-6f);
  EXPECT_LT(max_abs_diff(a.pooled, b.pooled), 1e-6f);
  // The CLS row's features are ignored: any values there give the same result.
  with_roles.rows.select(0, 0).select(0, 0).copy_from(Tensor::full({6}, 7.f));
  EXPECT_LT(max_abs_diff(run(m, with_roles).hidden, b.hidden), 1e-6f);
}

TEST(Batches, MixedStemWithModalityEmbeddings) {
  ModelConfig c = small();
  c.stem.kind = StemKind::mixed;
  c.stem.n_features = 6;
  c.stem.modalities = 2;
  c.stem.cls = true;
  const Model m = build(c);
  // 3 feature rows (a CLS and two patches) followed by 4 token rows.
  Batch b = random_rows(1, 7, 6, 4);
  b.ids = Tensor::from_ids({1, 7}, {0, 0, 0, 5, 9, 13, 2});
  b.kinds = Tensor::zeros({1, 7}, DType::u8);
  b.roles = Tensor::zeros({1, 7}, DType::u8);
  b.modality = Tensor::from_ids({1, 7}, {0, 0, 0, 1, 1, 1, 1});
  for (int t = 0; t < 3; ++t) b.kinds.data<uint8_t>()[t] = 1;
  b.roles.data<uint8_t>()[0] = TSR_ROLE_CLS;
  const Outputs o = run(m, b, false, {"stem.out"}), r = run(m, b, true);
  EXPECT_LT(max_abs_diff(o.hidden, r.hidden), 2e-5f);
  // stem.out row by row: CLS + modality 0; projected patch + bias + modality 0; token embedding + modality 1.
  const Tensor x = o.captured.at("stem.out").select(0, 0);
  const Tensor cls = *m.parameter("stem.cls"), mod = *m.parameter("stem.modality"), E = *m.parameter("stem.embed");
  const Tensor P = *m.parameter("stem.proj");
  for (int64_t k = 0; k < 16; ++k) {
    EXPECT_NEAR(x.at({0, k}), cls.at({k}) + mod.at({0, k}), 1e-6);
    double proj = 0;
    for (int64_t f = 0; f < 6; ++f) proj += b.rows.at({0, 1, f}) * P.at({f, k});
    EXPECT_NEAR(x.at({1, k}), proj + mod.at({0, k}), 1e-5);
    EXPECT_NEAR(x.at({4, k}), E.at({9, k}) + mod.at({1, k}), 1e-6);
  }
  Batch bad = b;
  bad.modality = Tensor::from_ids({1, 7}, {0, 0, 0, 1, 1, 2, 1});
  Outputs out;
  EXPECT_EQ(m.forward(bad, {}, &out).message(), "forward: row 5 of item 0 has modality 2 outside [0, 2)");
}

// The arena: steady passes take their intermediates from the thread's buffers, so the number of
// allocations a pass makes does not grow with depth, and nothing a caller kept is overwritten.
namespace {

struct PassAllocations {
  int64_t tensors = 0, arena = 0;
};

PassAllocations steady_pass(const ModelConfig& c, const Batch& b) {
  const Model m = build(c);
  ForwardOptions o;
  Outputs out;
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(m.forward(b, o, &out).ok());
  const int64_t t0 = Tensor::allocations(), a0 = model::Arena::allocations();
  EXPECT_TRUE(m.forward(b, o, &out).ok());
  return {Tensor::allocations() - t0, model::Arena::allocations() - a0};
}

}  // namespace

TEST(Arena, SteadyPassesAllocateNothingPerLayer) {
  for (NormPlacement norm : {NormPlacement::pre, NormPlacement::post}) {
    for (bool causal : {false, true}) {
      ModelConfig c = small();
      c.norm = norm;
      c.causal = causal;
      c.positions.kind = PositionKind::learned;
      c.head.kind = causal ? HeadKind::lm : HeadKind::pool;
      Batch b = random_ids(3, 8, c.stem.vocab_size, 5);
      b.lengths = {8, 3, 6};
      c.n_layers = 1;
      const PassAllocations one = steady_pass(c, b);
      c.n_layers = 6;
      const PassAllocations six = steady_pass(c, b);
      const std::string what = std::string(norm == NormPlacement::pre ? "pre" : "post") + (causal ? " causal" : "");
      EXPECT_EQ(one.arena, 0) << what;
      EXPECT_EQ(six.arena, 0) << what;
      // What is left is per pass (the outputs, the heads), never per layer.
      EXPECT_EQ(six.tensors, one.tensors) << what;
      EXPECT_LE(six.tensors, 4) << what;
    }
  }
}

TEST(Arena, ResultsTheCallerKeepsAreNeverOverwritten) {
  ModelConfig c = small();
  c.positions.kind = PositionKind::learned;
  const Model m = build(c);
  const Batch b1 = random_ids(2, 8, c.stem.vocab_size, 1), b2 = random_ids(2, 8, c.stem.vocab_size, 2);
  ForwardOptions o;
  Outputs out;
  ASSERT_TRUE(m.forward(b1, o, &out).ok());
  const Tensor kept = out.hidden;          // shares the arena's buffer
  const Tensor expected = kept.clone();
  ASSERT_TRUE(m.forward(b2, o, &out).ok());  // same shapes: the slot would be reused if let go
  EXPECT_EQ(max_abs_diff(kept, expected), 0.f);
  EXPECT_GT(max_abs_diff(out.hidden, expected), 1e-3f);  // and the new pass has its own result
  Outputs other;
  ASSERT_TRUE(m.forward(b1, o, &other).ok());
  EXPECT_EQ(max_abs_diff(other.hidden, expected), 0.f);
  EXPECT_GT(max_abs_diff(out.hidden, expected), 1e-3f);  // out's result survived other's pass
}
