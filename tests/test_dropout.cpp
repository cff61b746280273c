// Training dropout (train.dropout): the counter-based masks (tessera/random.h), ops::dropout and
// attention dropout in the fused kernels against their reference loops, the references against
// finite differences in f64, and dropout inside compute_gradients: p = 0 changes no bit, the masks
// follow their counters and not the thread count, the fast path agrees with the reference loops.
// The PyTorch parity of the whole model with dropout is in test_grad_fixtures.cpp
// (GradDropoutFixtures); resume and evaluation in test_train.cpp (TrainDropout, TrainResume).
//
// Tolerances as test_attention_backward.cpp states them: fast against reference 1e-5 of each
// gradient's size; f64 reference against central differences (h = 1e-6) 1e-7 of it. A mask
// regenerated with one wrong counter changes about p of the weights of a row: far outside both.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessera/ops.h"
#include "tessera/parameters.h"
#include "tessera/random.h"
#include "tessera/train.h"
#include "test_models.h"
#include "test_util.h"

using namespace tessera;
using testing_util::max_abs;
using testing_util::same_bits;
using testing_util::ThreadCount;
using testing_util::max_abs_diff;
using testing_util::random_uniform;
using testing_util::values_of;

namespace {

double rel_err(const Tensor& a, const Tensor& b) {
  const double e = max_abs_diff(a, b), s = max_abs(b);
  return e == 0.0 ? 0.0 : e / s;
}

// How many of n elements a mask drops.
int64_t dropped(const DropoutMask& m, int64_t n) {
  int64_t d = 0;
  for (int64_t e = 0; e < n; ++e) d += !m.keep(static_cast<uint64_t>(e));
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The masks

TEST(DropoutMask, DropRateIsWithinABinomialBound) {
  // n = 10^6 draws: the count of dropped elements is Binomial(n, p); 5 standard deviations
  // (a false alarm about once in 3.5 million) around n p.
  const int64_t n = 1000000;
  for (float p : {0.01f, 0.1f, 0.3f, 0.5f, 0.9f}) {
    const DropoutMask m{dropout_key(3, 17, 0, 2, 1), p};
    const double mean = n * static_cast<double>(p), sd = std::sqrt(mean * (1.0 - p));
    EXPECT_NEAR(static_cast<double>(dropped(m, n)), mean, 5 * sd) << "p " << p;
  }
  // p = 0 keeps everything: the threshold is 0.
  EXPECT_EQ(dropped(DropoutMask{dropout_key(3, 17, 0, 2, 1), 0.f}, 100000), 0);
  // Kept values are scaled by 1 / (1 - p) (inverted dropout), dropped ones are 0.
  const DropoutMask m{dropout_key(1, 2, 3, 4, 5), 0.25f};
  std::set<float> factors;
  for (uint64_t e = 0; e < 1000; ++e) factors.insert(m.factor(e));
  EXPECT_EQ(factors, (std::set<float>{0.f, 1.f / 0.75f}));
}

TEST(DropoutMask, FollowsItsCountersAndNothingElse) {
  const int64_t n = 4096;
  auto pattern = [n](uint64_t seed, uint64_t step, uint64_t micro, uint64_t layer, uint64_t site) {
    const DropoutMask m{dropout_key(seed, step, micro, layer, site), 0.5f};
    std::vector<bool> keep(static_cast<size_t>(n));
    for (int64_t e = 0; e < n; ++e) keep[static_cast<size_t>(e)] = m.keep(static_cast<uint64_t>(e));
    return keep;
  };
  const std::vector<bool> base = pattern(7, 3, 0, 1, 2);
  EXPECT_EQ(base, pattern(7, 3, 0, 1, 2));  // the same counters: the same mask, every time
  // Each counter changes it; two independent masks at p = 0.5 agree on about half the elements.
  const std::vector<std::vector<bool>> others = {pattern(8, 3, 0, 1, 2), pattern(7, 4, 0, 1, 2),
                                                 pattern(7, 3, 1, 1, 2), pattern(7, 3, 0, 0, 2),
                                                 pattern(7, 3, 0, 1, 3)};
  for (size_t i = 0; i < others.size(); ++i) {
    int64_t same = 0;
    for (int64_t e = 0; e < n; ++e) same += base[static_cast<size_t>(e)] == others[i][static_cast<size_t>(e)];
    EXPECT_NEAR(static_cast<double>(same), n / 2.0, 5 * std::sqrt(n / 4.0)) << "counter " << i;
  }
  // Neighbouring elements are not correlated: runs of equal bits are as a fair coin's.
  int64_t changes = 0;
  for (int64_t e = 1; e < n; ++e) changes += base[static_cast<size_t>(e)] != base[static_cast<size_t>(e - 1)];
  EXPECT_NEAR(static_cast<double>(changes), (n - 1) / 2.0, 5 * std::sqrt(n / 4.0));
}

// ---------------------------------------------------------------------------------------------
// ops::dropout

TEST(DropoutOp, FastMatchesReferenceAndAPlainLoop) {
  std::mt19937 rng(1);
  const ThreadCount restore;
  for (const Shape& s : {Shape{3, 5, 7}, Shape{64, 1031}, Shape{0, 4}}) {
    const Tensor x = random_uniform(s, rng);
    const DropoutMask m{dropout_key(9, 1, 0, 0, 0), 0.3f};
    Tensor fast = Tensor::empty(s), ref = Tensor::empty(s), plain = Tensor::empty(s);
    ASSERT_TRUE(ops::dropout(x, m, fast).ok());
    ASSERT_TRUE(ref::dropout(x, m, ref).ok());
    for (int64_t e = 0; e < x.numel(); ++e)
      plain.data<float>()[e] = m.keep(static_cast<uint64_t>(e)) ? x.data<float>()[e] * (1.f / 0.7f) : 0.f;
    EXPECT_TRUE(same_bits(fast, ref)) << s.str();
    EXPECT_TRUE(same_bits(fast, plain)) << s.str();
    // In place, on one and on two threads: the same bits.
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor y = x.clone();
      ASSERT_TRUE(ops::dropout(y, m, y).ok());
      EXPECT_TRUE(same_bits(y, fast)) << s.str() << ", " << threads << " threads";
    }
  }
  // A strided input gives what its contiguous copy gives; p = 0 copies.
  const Tensor wide = random_uniform({6, 10}, rng), view = wide.slice(1, 2, 7);
  const DropoutMask m{dropout_key(9, 1, 0, 0, 0), 0.5f};
  Tensor a = Tensor::empty({6, 5}), b = Tensor::empty({6, 5});
  ASSERT_TRUE(ops::dropout(view, m, a).ok());
  ASSERT_TRUE(ops::dropout(view.contiguous(), m, b).ok());
  EXPECT_TRUE(same_bits(a, b));
  ASSERT_TRUE(ops::dropout(view, DropoutMask{}, a).ok());
  EXPECT_TRUE(same_bits(a, view.contiguous()));
}

TEST(DropoutOp, ReferenceMatchesFiniteDifferencesAndIsItsOwnBackward) {
  // L = Σ G ⊙ dropout(x) in f64: dL/dx = dropout(G), the same mask.
  std::mt19937 rng(2);
  Tensor x = random_uniform({4, 9}, rng, -1, 1, DType::f64);
  const Tensor G = random_uniform({4, 9}, rng, -1, 1, DType::f64);
  const DropoutMask m{dropout_key(4, 0, 0, 0, 3), 0.4f};
  Tensor y = Tensor::empty(x.shape(), DType::f64), dx = Tensor::empty(x.shape(), DType::f64);
  ASSERT_TRUE(ref::dropout(G, m, dx).ok());
  auto loss = [&] {
    EXPECT_TRUE(ref::dropout(x, m, y).ok());
    double L = 0;
    for (int64_t i = 0; i < y.numel(); ++i) L += G.data<double>()[i] * y.data<double>()[i];
    return L;
  };
  const double h = 1e-6;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double x0 = x.data<double>()[i];
    x.data<double>()[i] = x0 + h;
    const double up = loss();
    x.data<double>()[i] = x0 - h;
    const double down = loss();
    x.data<double>()[i] = x0;
    EXPECT_NEAR((up - down) / (2 * h), dx.data<double>()[i], 1e-7 * std::max(1e-3, max_abs(dx))) << i;
  }
}

TEST(DropoutOp, RefusesABadProbabilityAndShapes) {
  const Tensor x = Tensor::zeros({2, 3});
  Tensor y = Tensor::empty({2, 3}), z = Tensor::empty({3, 2});
  for (float p : {1.f, -0.1f, 1.5f}) {
    const Status st = ops::dropout(x, DropoutMask{1, p}, y);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("[0, 1)"), std::string::npos) << st.message();
    EXPECT_FALSE(ref::dropout(x, DropoutMask{1, p}, y).ok());
  }
  EXPECT_FALSE(ops::dropout(x, DropoutMask{1, 0.5f}, z).ok());
  const Tensor f64 = Tensor::zeros({2, 3}, DType::f64);
  EXPECT_FALSE(ops::dropout(f64, DropoutMask{1, 0.5f}, y).ok());
}

// ---------------------------------------------------------------------------------------------
// Attention dropout: the fused forward and backward against the reference loops

namespace {

struct Attn {
  int64_t B, H, T, S, dk, dv;
  bool causal = false;
  float scale() const { return 1.f / std::sqrt(static_cast<float>(dk)); }
  std::string name() const {
    return "B " + std::to_string(B) + " H " + std::to_string(H) + " T " + std::to_string(T) + " S " +
           std::to_string(S) + (causal ? " causal" : "");
  }
};

struct AttnRun {
  Tensor out, lse, dq, dk, dv;
};

AttnRun run_attention(bool reference, const Attn& p, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& dout, const DropoutMask* m) {
  AttnRun r{Tensor::empty({p.B, p.H, p.T, p.dv}), Tensor::empty({p.B, p.H, p.T}), Tensor::empty(q.shape()),
            Tensor::empty(k.shape()), Tensor::empty(v.shape())};
  const Status a = reference ? ref::attention_train(q, k, v, r.out, r.lse, p.scale(), p.causal, nullptr, nullptr, m)
                             : ops::attention_train(q, k, v, r.out, r.lse, p.scale(), p.causal, nullptr, nullptr, m);
  EXPECT_TRUE(a.ok()) << a.message();
  const Status b = reference ? ref::attention_backward(q, k, v, r.out, r.lse, dout, r.dq, r.dk, r.dv, p.scale(),
                                                       p.causal, nullptr, nullptr, m)
                             : ops::attention_backward(q, k, v, r.out, r.lse, dout, r.dq, r.dk, r.dv, p.scale(),
                                                       p.causal, nullptr, nullptr, m);
  EXPECT_TRUE(b.ok()) << b.message();
  return r;
}

}  // namespace

TEST(AttentionDropout, FastMatchesReferenceForwardAndBackward) {
  // T and S past one tile (64 query rows, 256 keys): the mask's index runs across tiles.
  std::mt19937 rng(3);
  const Attn cases[] = {{1, 2, 5, 5, 4, 4}, {2, 3, 70, 70, 8, 8, true}, {1, 2, 130, 300, 16, 8}, {1, 1, 300, 300, 8, 16, true}};
  for (const Attn& p : cases) {
    const Tensor q = random_uniform({p.B, p.H, p.T, p.dk}, rng), k = random_uniform({p.B, p.H, p.S, p.dk}, rng);
    const Tensor v = random_uniform({p.B, p.H, p.S, p.dv}, rng), dout = random_uniform({p.B, p.H, p.T, p.dv}, rng);
    const DropoutMask m{dropout_key(5, 2, 0, 1, 1), 0.2f};
    const AttnRun fast = run_attention(false, p, q, k, v, dout, &m), ref = run_attention(true, p, q, k, v, dout, &m);
    EXPECT_LE(rel_err(fast.out, ref.out), 1e-5) << "out, " << p.name();
    EXPECT_LE(rel_err(fast.lse, ref.lse), 1e-5) << "lse, " << p.name();
    EXPECT_LE(rel_err(fast.dq, ref.dq), 1e-5) << "dq, " << p.name();
    EXPECT_LE(rel_err(fast.dk, ref.dk), 1e-5) << "dk, " << p.name();
    EXPECT_LE(rel_err(fast.dv, ref.dv), 1e-5) << "dv, " << p.name();
    // Dropout changes the output (the comparison above is not of two undropped attentions), and a
    // mask of other counters moves it far outside the tolerance.
    const AttnRun plain = run_attention(false, p, q, k, v, dout, nullptr);
    EXPECT_GT(rel_err(plain.out, ref.out), 1e-2) << p.name();
    const DropoutMask other{dropout_key(5, 3, 0, 1, 1), 0.2f};
    const AttnRun wrong = run_attention(false, p, q, k, v, dout, &other);
    EXPECT_GT(rel_err(wrong.out, ref.out), 1e-2) << p.name();
    EXPECT_GT(rel_err(wrong.dq, ref.dq), 1e-2) << p.name();
    // p = 0 is no dropout, bit for bit; lse is the undropped softmax's.
    const DropoutMask zero{m.key, 0.f};
    const AttnRun none = run_attention(false, p, q, k, v, dout, &zero);
    EXPECT_TRUE(same_bits(none.out, plain.out) && same_bits(none.dq, plain.dq) && same_bits(none.dk, plain.dk) &&
                same_bits(none.dv, plain.dv))
        << p.name();
    EXPECT_TRUE(same_bits(fast.lse, plain.lse)) << p.name();
  }
}

TEST(AttentionDropout, ReferenceIsAPlainLoopOverTheMaskedWeights) {
  // out_i = Σ_j softmax_ij · M_ij · v_j, written out for one small head.
  std::mt19937 rng(4);
  const Attn p{1, 2, 4, 6, 3, 2};
  const Tensor q = random_uniform({1, 2, 4, 3}, rng), k = random_uniform({1, 2, 6, 3}, rng);
  const Tensor v = random_uniform({1, 2, 6, 2}, rng), dout = random_uniform({1, 2, 4, 2}, rng);
  const DropoutMask m{dropout_key(1, 1, 1, 1, 1), 0.5f};
  const AttnRun r = run_attention(true, p, q, k, v, dout, &m);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 4; ++i) {
      double s[6], mx = -1e300, sum = 0;
      for (int64_t j = 0; j < 6; ++j) {
        s[j] = 0;
        for (int64_t d = 0; d < 3; ++d) s[j] += q.data<float>()[(h * 4 + i) * 3 + d] * k.data<float>()[(h * 6 + j) * 3 + d];
        s[j] *= p.scale();
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < 2; ++d) {
        double o = 0;
        for (int64_t j = 0; j < 6; ++j)
          o += s[j] / sum * m.factor(static_cast<uint64_t>(((0 * 2 + h) * 4 + i) * 6 + j)) *
               v.data<float>()[(h * 6 + j) * 2 + d];
        EXPECT_NEAR(r.out.data<float>()[(h * 4 + i) * 2 + d], o, 1e-6);
      }
    }
}

TEST(AttentionDropout, ReferenceMatchesFiniteDifferences) {
  // f64, L = Σ G ⊙ out with the mask fixed by its counters: a smooth function of q, k, v.
  std::mt19937 rng(5);
  const Attn cases[] = {{1, 2, 5, 5, 3, 4}, {2, 1, 4, 7, 3, 2, true}};
  const double h = 1e-6;
  for (const Attn& p : cases) {
    Tensor q = random_uniform({p.B, p.H, p.T, p.dk}, rng, -1, 1, DType::f64);
    Tensor k = random_uniform({p.B, p.H, p.S, p.dk}, rng, -1, 1, DType::f64);
    Tensor v = random_uniform({p.B, p.H, p.S, p.dv}, rng, -1, 1, DType::f64);
    const Tensor G = random_uniform({p.B, p.H, p.T, p.dv}, rng, -1, 1, DType::f64);
    const DropoutMask m{dropout_key(8, 0, 0, 0, 1), 0.3f};
    Tensor out = Tensor::empty(G.shape(), DType::f64), lse = Tensor::empty({p.B, p.H, p.T}, DType::f64);
    auto loss = [&] {
      EXPECT_TRUE(ref::attention_train(q, k, v, out, lse, p.scale(), p.causal, nullptr, nullptr, &m).ok());
      double L = 0;
      const std::vector<double> o = values_of(out), g = values_of(G);
      for (size_t i = 0; i < o.size(); ++i) L += g[i] * o[i];
      return L;
    };
    loss();
    Tensor dq = Tensor::empty(q.shape(), DType::f64), dk = Tensor::empty(k.shape(), DType::f64),
           dv = Tensor::empty(v.shape(), DType::f64);
    ASSERT_TRUE(
        ref::attention_backward(q, k, v, out, lse, G, dq, dk, dv, p.scale(), p.causal, nullptr, nullptr, &m).ok());
    const std::pair<Tensor*, const Tensor*> pairs[] = {{&q, &dq}, {&k, &dk}, {&v, &dv}};
    for (const auto& [x, dx] : pairs) {
      double* xp = x->data<double>();
      Tensor fd = Tensor::empty(x->shape(), DType::f64);
      for (int64_t i = 0; i < x->numel(); ++i) {
        const double x0 = xp[i];
        xp[i] = x0 + h;
        const double up = loss();
        xp[i] = x0 - h;
        const double down = loss();
        xp[i] = x0;
        fd.data<double>()[i] = (up - down) / (2 * h);
      }
      EXPECT_LE(max_abs_diff(*dx, fd), 1e-7 * std::max(1e-3, max_abs(fd))) << p.name();
    }
  }
}

TEST(AttentionDropout, SameBitsOnOneAndTwoThreads) {
  const ThreadCount restore;
  std::mt19937 rng(6);
  const Attn p{1, 4, 200, 200, 16, 16, true};
  const Tensor q = random_uniform({p.B, p.H, p.T, p.dk}, rng), k = random_uniform({p.B, p.H, p.S, p.dk}, rng);
  const Tensor v = random_uniform({p.B, p.H, p.S, p.dv}, rng), dout = random_uniform({p.B, p.H, p.T, p.dv}, rng);
  const DropoutMask m{dropout_key(2, 9, 1, 0, 1), 0.1f};
  set_num_threads(1);
  const AttnRun one = run_attention(false, p, q, k, v, dout, &m);
  set_num_threads(2);
  const AttnRun two = run_attention(false, p, q, k, v, dout, &m);
  EXPECT_TRUE(same_bits(one.out, two.out));
  EXPECT_TRUE(same_bits(one.dq, two.dq));
  EXPECT_TRUE(same_bits(one.dk, two.dk));
  EXPECT_TRUE(same_bits(one.dv, two.dv));
}

// ---------------------------------------------------------------------------------------------
// Dropout in compute_gradients

namespace {

struct Case {
  std::string name;
  ModelConfig c;
};

std::vector<Case> model_cases() {
  using testing_util::tiny_decoder;
  std::vector<Case> cs = {{"pre-LN decoder", tiny_decoder(PositionKind::learned)},
                          {"relative positions", tiny_decoder(PositionKind::relative)}};
  ModelConfig post = tiny_decoder(PositionKind::learned);
  post.norm = NormPlacement::post;
  post.final_norm = false;
  post.causal = false;
  post.arch = Arch::encoder;
  cs.push_back({"post-LN encoder", post});
  return cs;
}

Batch token_batch(int64_t B, int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  b.ids = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; ++i) b.ids.data<int32_t>()[i] = static_cast<int32_t>(rng() % V);
  return b;
}

struct Step {
  double loss = 0;
  Parameters grads;
};

Step grads_of(const ModelConfig& c, const Parameters& P, const Batch& b, const GradOptions& opt) {
  Targets t;
  t.tokens = next_token_targets(b);
  Step s;
  s.grads = P.zeros_like();
  Result<LossValue> r = compute_gradients(c, P, b, t, &s.grads, opt);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (r.ok()) s.loss = r->loss;
  return s;
}

bool same_grads(const Step& a, const Step& b) {
  if (a.loss != b.loss) return false;
  for (const auto& [name, g] : a.grads)
    if (!same_bits(g, b.grads.get(name))) return false;
  return true;
}

GradOptions with_dropout(float p, uint64_t step, bool reference = false) {
  GradOptions o;
  o.reference = reference;
  o.dropout.embedding = o.dropout.attention = o.dropout.residual = p;
  o.dropout.seed = 42;
  o.dropout.step = step;
  return o;
}

}  // namespace

TEST(ModelDropout, ZeroProbabilityChangesNoBit) {
  // p = 0 at every site (whatever the counters) is the backward as it was without dropout.
  for (const Case& k : model_cases()) {
    Result<Parameters> P = Parameters::resolve(k.c);
    ASSERT_TRUE(P.ok()) << P.status().message();
    const Parameters params = P->clone();
    const Batch b = token_batch(2, 9, k.c.stem.vocab_size, 1);
    for (bool reference : {false, true}) {
      GradOptions plain;
      plain.reference = reference;
      EXPECT_TRUE(same_grads(grads_of(k.c, params, b, plain), grads_of(k.c, params, b, with_dropout(0.f, 5, reference))))
          << k.name << (reference ? ", reference" : ", fast");
    }
  }
}

TEST(ModelDropout, FastMatchesReferenceAndTheMasksFollowTheirCounters) {
  for (const Case& k : model_cases()) {
    SCOPED_TRACE(k.name);
    Result<Parameters> P = Parameters::resolve(k.c);
    ASSERT_TRUE(P.ok()) << P.status().message();
    const Parameters params = P->clone();
    const Batch b = token_batch(2, 9, k.c.stem.vocab_size, 2);
    const Step fast = grads_of(k.c, params, b, with_dropout(0.2f, 3)), ref = grads_of(k.c, params, b, with_dropout(0.2f, 3, true));
    EXPECT_NEAR(fast.loss, ref.loss, 1e-5 * std::max(1.0, std::fabs(ref.loss)));
    // Each gradient against its own size, but at least 1e-3 of the largest: some are 0 in exact
    // arithmetic (b_k: softmax ignores a constant added to every score of a row, dropped or not).
    double largest = 0;
    for (const auto& [name, g] : ref.grads) largest = std::max(largest, max_abs(g));
    for (const auto& [name, g] : ref.grads)
      EXPECT_LE(max_abs_diff(fast.grads.get(name), g), 1e-4 * std::max(max_abs(g), 1e-3 * largest)) << name;
    // The same (seed, step): the same bits; another step, or no dropout: another loss and gradient.
    EXPECT_TRUE(same_grads(fast, grads_of(k.c, params, b, with_dropout(0.2f, 3))));
    const Step other = grads_of(k.c, params, b, with_dropout(0.2f, 4));
    const Step none = grads_of(k.c, params, b, GradOptions{});
    EXPECT_NE(fast.loss, other.loss);
    EXPECT_NE(fast.loss, none.loss);
    EXPECT_GT(rel_err(other.grads.get("blocks.0.attn.w_q"), fast.grads.get("blocks.0.attn.w_q")), 1e-2);
  }
}

TEST(ModelDropout, EachSiteActsAlone) {
  // Each probability on its own changes the result, and only where its site is.
  const ModelConfig c = testing_util::tiny_decoder(PositionKind::learned);
  Result<Parameters> P = Parameters::resolve(c);
  ASSERT_TRUE(P.ok());
  const Parameters params = P->clone();
  const Batch b = token_batch(2, 9, c.stem.vocab_size, 3);
  const Step none = grads_of(c, params, b, GradOptions{});
  for (int site = 0; site < 3; ++site) {
    GradOptions o;
    o.dropout.seed = 1;
    (site == 0 ? o.dropout.embedding : site == 1 ? o.dropout.attention : o.dropout.residual) = 0.3f;
    const Step s = grads_of(c, params, b, o);
    EXPECT_NE(s.loss, none.loss) << "site " << site;
    // The head's gradient sees every site; stem.embed's too (it is tied).
    EXPECT_GT(rel_err(s.grads.get("pos.table"), none.grads.get("pos.table")), 1e-3) << "site " << site;
  }
}

TEST(ModelDropout, SameMasksOnOneAndTwoThreads) {
  // The reference loops give the same bits on any thread count, so with dropout on they must
  // too: the masks do not depend on how the work is split. (oneDNN's products on the fast path
  // may round differently on another thread count, with or without dropout; the dropout ops and
  // the fused attention give the same bits, DropoutOp and AttentionDropout above.) On the fast
  // path the two runs agree within the fast path's tolerance.
  const ThreadCount restore;
  for (const Case& k : model_cases()) {
    Result<Parameters> P = Parameters::resolve(k.c);
    ASSERT_TRUE(P.ok());
    const Parameters params = P->clone();
    const Batch b = token_batch(3, 11, k.c.stem.vocab_size, 4);
    set_num_threads(1);
    const Step one = grads_of(k.c, params, b, with_dropout(0.25f, 7, true));
    const Step fast1 = grads_of(k.c, params, b, with_dropout(0.25f, 7));
    set_num_threads(2);
    const Step two = grads_of(k.c, params, b, with_dropout(0.25f, 7, true));
    const Step fast2 = grads_of(k.c, params, b, with_dropout(0.25f, 7));
    EXPECT_TRUE(same_grads(one, two)) << k.name;
    EXPECT_NEAR(fast1.loss, fast2.loss, 1e-6 * std::fabs(fast1.loss)) << k.name;
    double largest = 0;  // b_k's gradient is 0 in exact arithmetic: held to 1e-3 of the largest's scale
    for (const auto& [name, g] : fast1.grads) largest = std::max(largest, max_abs(g));
    for (const auto& [name, g] : fast1.grads)
      EXPECT_LE(max_abs_diff(fast2.grads.get(name), g), 1e-4 * std::max(max_abs(g), 1e-3 * largest))
          << k.name << " " << name;
  }
}

TEST(ModelDropout, RefusesAProbabilityOutsideZeroToOne) {
  const ModelConfig c = testing_util::tiny_decoder(PositionKind::learned);
  Result<Parameters> P = Parameters::resolve(c);
  ASSERT_TRUE(P.ok());
  const Parameters params = P->clone();
  Parameters grads = params.zeros_like();
  const Batch b = token_batch(1, 4, c.stem.vocab_size, 5);
  Targets t;
  t.tokens = next_token_targets(b);
  for (float p : {1.f, -0.5f}) {
    GradOptions o;
    o.dropout.attention = p;
    Result<LossValue> r = compute_gradients(c, params, b, t, &grads, o);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("attention dropout must be in [0, 1)"), std::string::npos)
        << r.status().message();
  }
}
