// Golden tests: every number in the seed lectures' worked examples, computed by Tessera from the
// example configs in configs/examples/ (the same files the CLI runs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "tessera/config.h"
#include "tessera/model.h"

using namespace tessera;

namespace {

const std::string kExamples = std::string(TESSERA_SOURCE_DIR) + "/configs/examples/";

struct ExampleRun {
  Experiment exp;
  Outputs out;
};

ExampleRun run_example(const std::string& name, std::vector<std::string> overrides = {}) {
  Diagnostics d;
  LoadOptions opt;
  opt.overrides = std::move(overrides);
  std::optional<Experiment> e = load_experiment(kExamples + name, opt, &d);
  EXPECT_TRUE(e.has_value()) << d.str();
  if (!e) return {};
  Result<Model> m = Model::build(e->model);
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return {};
  ForwardOptions fo;
  fo.capture = {"*"};
  ExampleRun r{*e, {}};
  const Batch b = e->input.ids.empty() ? Batch::from_rows(e->input.rows) : Batch::from_ids(e->input.ids);
  Status st = m->forward(b, fo, &r.out);
  EXPECT_TRUE(st.ok()) << st.message();
  return r;
}

// The value rounded to `digits` decimals, as the lectures print them.
double rounded(double v, int digits) {
  const double s = std::pow(10.0, digits);
  return std::round(v * s) / s;
}

// Row `row` of head `h` of a captured (1, H, T, D) tensor, item 0.
std::vector<float> head_row(const ExampleRun& r, const std::string& name, int64_t h, int64_t row) {
  return r.out.captured.at(name).select(0, 0).select(0, h).select(0, row).to_vector();
}

void expect_row(const std::vector<float>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << what << " [" << i << "]";
}

constexpr double kExact = 1e-6;  // f32 arithmetic on exact inputs: agreement to the last digits
const double kLn2 = std::log(2.0);

}  // namespace

TEST(Seeds, RedBallRollsProjections) {
  const ExampleRun r = run_example("red_ball_rolls.yaml");
  // q, k, v of red, ball, rolls.
  const double q[3] = {0, 0, 1}, k[3] = {0, kLn2, 0};
  const double v[3][2] = {{1, 0}, {0, 2}, {1, 1}};
  for (int64_t t = 0; t < 3; ++t) {
    expect_row(head_row(r, "blocks.0.attn.q", 0, t), {q[t]}, kExact, "q");
    expect_row(head_row(r, "blocks.0.attn.k", 0, t), {k[t]}, kExact, "k");
    expect_row(head_row(r, "blocks.0.attn.v", 0, t), {v[t][0], v[t][1]}, kExact, "v");
  }
}

TEST(Seeds, RedBallRollsScoresMaskAndWeights) {
  const ExampleRun r = run_example("red_ball_rolls.yaml");
  // Scores s_ij = q_i k_j (d_k = 1, so the scale is 1): only the rolls query is non-zero.
  expect_row(head_row(r, "blocks.0.attn.scores", 0, 0), {0, 0, 0}, kExact, "scores red");
  expect_row(head_row(r, "blocks.0.attn.scores", 0, 1), {0, 0, 0}, kExact, "scores ball");
  expect_row(head_row(r, "blocks.0.attn.scores", 0, 2), {0, kLn2, 0}, kExact, "scores rolls");
  // Row 3, column 2: the rolls query against the ball key.
  EXPECT_NEAR(r.out.captured.at("blocks.0.attn.scores").at({0, 0, 2, 1}), kLn2, kExact);
  // The causal mask: -inf on every future column.
  const Tensor m = r.out.captured.at("blocks.0.attn.mask").select(0, 0);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(m.at({i, j}), j > i ? -INFINITY : 0.f) << i << "," << j;
  // Weight rows (1), (1/2, 1/2), (1/4, 1/2, 1/4).
  expect_row(head_row(r, "blocks.0.attn.weights", 0, 0), {1, 0, 0}, kExact, "weights red");
  expect_row(head_row(r, "blocks.0.attn.weights", 0, 1), {0.5, 0.5, 0}, kExact, "weights ball");
  expect_row(head_row(r, "blocks.0.attn.weights", 0, 2), {0.25, 0.5, 0.25}, kExact, "weights rolls");
}

TEST(Seeds, RedBallRollsOutputAndArgmaxAlternative) {
  const ExampleRun r = run_example("red_ball_rolls.yaml");
  expect_row(r.out.hidden.select(0, 0).select(0, 2).to_vector(), {0.5, 1.25}, kExact, "output rolls");
  expect_row(head_row(r, "blocks.0.attn.heads", 0, 2), {0.5, 1.25}, kExact, "head output rolls");
  // Keeping only the value with the largest score (ball) would give (0, 2).
  const std::vector<float> s = head_row(r, "blocks.0.attn.scores", 0, 2);
  const int64_t best = std::max_element(s.begin(), s.end()) - s.begin();
  EXPECT_EQ(best, 1);
  expect_row(head_row(r, "blocks.0.attn.v", 0, best), {0, 2}, kExact, "argmax value");
}

TEST(Seeds, ScalingBySqrtDk) {
  const ExampleRun raw = run_example("scaling.yaml", {"model.attention.scale=1"});
  expect_row(head_row(raw, "blocks.0.attn.scores", 0, 0), {4, 2}, kExact, "raw scores");
  const std::vector<float> w_raw = head_row(raw, "blocks.0.attn.weights", 0, 0);
  EXPECT_EQ(rounded(w_raw[0], 3), 0.881);
  EXPECT_EQ(rounded(w_raw[1], 3), 0.119);
  const ExampleRun scaled = run_example("scaling.yaml");
  EXPECT_DOUBLE_EQ(scaled.exp.model.attention.scale, 0.5);  // 1 / sqrt(4)
  expect_row(head_row(scaled, "blocks.0.attn.scores", 0, 0), {2, 1}, kExact, "scaled scores");
  const std::vector<float> w = head_row(scaled, "blocks.0.attn.weights", 0, 0);
  EXPECT_EQ(rounded(w[0], 3), 0.731);
  EXPECT_EQ(rounded(w[1], 3), 0.269);
}

TEST(Seeds, TwoHeadsConcatenationOutputProjectionResidual) {
  const ExampleRun r = run_example("two_heads.yaml");
  expect_row(head_row(r, "blocks.0.attn.weights", 0, 2), {0.25, 0.5, 0.25}, kExact, "head 0 weights");
  expect_row(head_row(r, "blocks.0.attn.weights", 1, 2), {0.5, 0.25, 0.25}, kExact, "head 1 weights");
  expect_row(head_row(r, "blocks.0.attn.heads", 0, 2), {0.5, 1.25}, kExact, "head 0 output");
  expect_row(head_row(r, "blocks.0.attn.heads", 1, 2), {0.75, 0.75}, kExact, "head 1 output");
  const auto row = [&](const char* n) { return r.out.captured.at(n).select(0, 0).select(0, 2).to_vector(); };
  expect_row(row("blocks.0.attn.concat"), {0.5, 1.25, 0.75, 0.75}, kExact, "concat");
  expect_row(row("blocks.0.attn.out"), {0.5, 1.25, 1.5}, kExact, "W_O");  // this file's W_O
  expect_row(row("blocks.0.attn.residual"), {0.5, 1.25, 2.5}, kExact, "residual with x_rolls");
  expect_row(row("blocks.0.out"), {0.5, 1.25, 2.5}, kExact, "block output (no FFN, no norm)");
}

TEST(Seeds, CraneLake) {
  const ExampleRun r = run_example("crane_lake.yaml");
  const std::vector<float> w = head_row(r, "blocks.0.attn.weights", 0, 0);
  const double want_w[] = {0.298, 0.203, 0.206, 0.293};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(rounded(w[static_cast<size_t>(i)], 3), want_w[i]) << i;
  const std::vector<float> ctx = r.out.hidden.select(0, 0).select(0, 0).to_vector();
  const double want_c[] = {0.464, 0.476, 0.286};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(rounded(ctx[static_cast<size_t>(i)], 3), want_c[i]) << i;
  // The chapter's point: of crane's weights on the other three tokens, the one on lake is largest.
  EXPECT_GT(w[3], w[1]);
  EXPECT_GT(w[3], w[2]);
}

TEST(Seeds, ExerciseShapes) {
  const ExampleRun r = run_example("exercise_n5.yaml");
  EXPECT_EQ(r.out.captured.at("blocks.0.attn.scores").shape(), Shape({1, 1, 5, 5}));
  EXPECT_EQ(r.out.hidden.shape(), Shape({1, 5, 3}));
  EXPECT_EQ(make_plan(r.exp.model, 5).score_entries_per_head, 25);
  // In the causal window, the query at position 2 uses columns 1 and 2 only.
  const std::vector<float> w = head_row(r, "blocks.0.attn.weights", 0, 1);
  EXPECT_GT(w[0], 0.f);
  EXPECT_GT(w[1], 0.f);
  EXPECT_EQ(w[2], 0.f);
}

TEST(Seeds, TransformerLayerIsPostLN) {
  // U = MultiHead(X); R = LayerNorm(X + U); F = FFN(R); Y = LayerNorm(R + F)
  const ExampleRun r = run_example("transformer_layer.yaml");
  const auto& cap = r.out.captured;
  EXPECT_EQ(r.exp.model.norm, NormPlacement::post);
  const std::vector<float> xu = cap.at("blocks.0.attn.residual").select(0, 0).select(0, 2).to_vector();
  expect_row(xu, {0.5, 1.25, 2.5}, kExact, "X + U for rolls, as in two_heads.yaml");
  const std::vector<float> R = cap.at("blocks.0.ln1").select(0, 0).select(0, 2).to_vector();
  const double mean = (0.5 + 1.25 + 2.5) / 3;
  double var = 0;
  for (double v : {0.5, 1.25, 2.5}) var += (v - mean) * (v - mean) / 3;
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(R[static_cast<size_t>(i)], (xu[static_cast<size_t>(i)] - mean) / std::sqrt(var + 1e-5), 1e-5);
}

TEST(Seeds, WordOrderNeedsPositions) {
  // "the owl saw the cat" vs "the cat saw the owl": same rows, swapped, without positions.
  const ExampleRun a = run_example("word_order.yaml");
  const ExampleRun b = run_example("word_order.yaml", {"input.ids=[1, 4, 3, 1, 2]", "input.tokens=[the, cat, saw, the, owl]"});
  const Tensor ha = a.out.hidden.select(0, 0), hb = b.out.hidden.select(0, 0);
  const int perm[5] = {0, 4, 2, 3, 1};
  for (int i = 0; i < 5; ++i) expect_row(hb.select(0, i).to_vector(), [&] {
      std::vector<double> v;
      for (float f : ha.select(0, perm[i]).to_vector()) v.push_back(f);
      return v;
    }(), 1e-5, "permuted row");
  const ExampleRun ap = run_example("word_order.yaml", {"model.positions.kind=sinusoidal"});
  const ExampleRun bp = run_example("word_order.yaml", {"model.positions.kind=sinusoidal", "input.ids=[1, 4, 3, 1, 2]",
                                                 "input.tokens=[the, cat, saw, the, owl]"});
  float diff = 0;
  const auto owl_a = ap.out.hidden.select(0, 0).select(0, 1).to_vector();
  const auto owl_b = bp.out.hidden.select(0, 0).select(0, 4).to_vector();
  for (size_t i = 0; i < owl_a.size(); ++i) diff = std::max(diff, std::fabs(owl_a[i] - owl_b[i]));
  EXPECT_GT(diff, 1e-3f);
}

TEST(Seeds, SeededInitIsTheLecturesNumPyDraws) {
  // The deck: rng = np.random.default_rng(9); W = rng.normal(0, sqrt(2 / (rows + cols)), (rows, cols))
  // for W_Q of each head, W_K of each head, W_V of each head, then W_O. The expected values are
  // NumPy's own (tests/data/rng, made by tools/reference/make_rng_fixtures.py).
  std::ifstream f(std::string(TESSERA_TEST_DATA) + "/rng/numpy_default_rng.txt");
  ASSERT_TRUE(f.good());
  std::map<std::string, std::vector<double>> numpy;
  std::string line, current;
  while (std::getline(f, line)) {
    if (line.rfind("@ ", 0) == 0) {
      current.clear();
      if (line.rfind("@ lecture ", 0) == 0) {
        const size_t at = line.find("name=") + 5;
        current = line.substr(at, line.find(' ', at) - at);
      }
    } else if (!current.empty() && !line.empty() && line[0] != '#') {
      const uint64_t bits = std::stoull(line, nullptr, 16);
      double d;
      std::memcpy(&d, &bits, 8);
      numpy[current].push_back(d);
    }
  }
  ASSERT_EQ(numpy.size(), 7u);
  Diagnostics diags;
  std::optional<Experiment> e = load_experiment(kExamples + "seeded_init.yaml", {}, &diags);
  ASSERT_TRUE(e) << diags.str();
  Result<Model> m = Model::build(e->model);
  ASSERT_TRUE(m.ok()) << m.status().message();
  // Tessera keeps each projection's heads side by side: head h owns columns [h·d, (h+1)·d).
  const std::pair<const char*, const char*> map[] = {{"Wq", "blocks.0.attn.w_q"}, {"Wk", "blocks.0.attn.w_k"},
                                                     {"Wv", "blocks.0.attn.w_v"}};
  for (const auto& [np_name, ours] : map) {
    const Tensor w = *m->parameter(ours);
    const int64_t d = w.dim(1) / 2;
    for (int64_t h = 0; h < 2; ++h) {
      const std::vector<double>& want = numpy.at(std::string(np_name) + "." + std::to_string(h));
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t c = 0; c < d; ++c)
          EXPECT_EQ(w.at({r, h * d + c}), static_cast<float>(want[static_cast<size_t>(r * d + c)]))
              << ours << " head " << h << " (" << r << ", " << c << ")";
    }
  }
  const Tensor wo = *m->parameter("blocks.0.attn.w_o");
  const std::vector<double>& want = numpy.at("Wo");
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(wo.at({r, c}), static_cast<float>(want[static_cast<size_t>(r * 3 + c)]));
}
