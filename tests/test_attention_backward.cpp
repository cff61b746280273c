// Training attention: ops::attention_train (the fused forward that also keeps each query row's
// log-sum-exp) and ops::attention_backward (FlashAttention-2: the weights recomputed tile by tile
// from q, k and lse) against their reference twins, the reference against finite differences, and
// the fast backward's memory.
//
// Tolerance, fast against reference. A gradient entry is a sum of up to S (or T) products of f32
// values; the kernel rounds those sums, the recomputed exp (libmvec: < 4 ulp) and the lse it is
// given, each about 1e-7 relative, and the errors grow with the length of the sums. So each
// gradient is compared against the size of that gradient: max |fast - ref| <= 1e-5 · max |ref|
// (measured: at most about 1e-6 over the cases here). A mask off by one key, a dropped tile or a
// missed D moves a gradient by 1e-2 of its size or more (see ToleranceCatchesAnOffByOneMask).
//
// Tolerance, reference against finite differences: in f64 with step h = 1e-6, central
// differences err by about h² · (third derivative) + 1e-16 / h (measured: 1e-9 of the gradient's
// size here); 1e-7 of it leaves a margin while a wrong term (a missing D, a wrong scale) is off by
// 1e-1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tessera/ops.h"
#include "test_util.h"

using namespace tessera;
using testing_util::max_abs;
using testing_util::ThreadCount;
using testing_util::max_abs_diff;
using testing_util::random_uniform;
using testing_util::values_of;

namespace {

constexpr double kTol = 1e-5;    // fast against reference, relative to the gradient's size
constexpr double kFdTol = 1e-7;  // f64 reference against central differences, likewise
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// (B, H, rows, d) view of the columns [col0, col0 + H·d) of a (B·rows, N) buffer, as
// model/attention.cpp's head_view makes them.
Tensor head_view(const Tensor& buf, int64_t B, int64_t rows, int64_t col0, int64_t H, int64_t d) {
  return buf.reshape({B, rows, buf.dim(1)}).slice(2, col0, col0 + H * d).unflatten(2, H, d).transpose(1, 2);
}

// One attention problem: shapes, mask, and the key ranges (empty: none).
struct Problem {
  int64_t B, H, T, S, dk, dv;
  bool causal = false;
  std::vector<int32_t> lo, hi;
  const int32_t* key_lo() const { return lo.empty() ? nullptr : lo.data(); }
  const int32_t* key_hi() const { return hi.empty() ? nullptr : hi.data(); }
  float scale() const { return 1.f / std::sqrt(static_cast<float>(dk)); }
  std::string name() const {
    return "B " + std::to_string(B) + " H " + std::to_string(H) + " T " + std::to_string(T) + " S " +
           std::to_string(S) + " dk " + std::to_string(dk) + " dv " + std::to_string(dv) +
           (causal ? " causal" : "") + (lo.empty() ? "" : " ranges");
  }
};

// q, k, v (or their gradients) as head views of fused buffers, with kPad spare columns each:
// for T == S one (B·T, H·(2dk + dv) + kPad) buffer, as the model's QKV projection writes it;
// else q in a (B·T, H·dk + kPad) buffer and k, v in one (B·S, H·(dk + dv) + kPad) buffer.
constexpr int64_t kPad = 3;
struct Heads {
  std::vector<Tensor> bufs;
  Tensor q, k, v;
};
Heads fused_heads(const Problem& p, std::mt19937* rng) {  // rng null: NaN everywhere
  const int64_t B = p.B, H = p.H;
  auto buffer = [&](int64_t rows, int64_t cols) {
    return rng ? random_uniform({rows, cols}, *rng) : Tensor::full({rows, cols}, kNaN);
  };
  Heads r;
  if (p.T == p.S) {
    r.bufs = {buffer(B * p.T, H * (2 * p.dk + p.dv) + kPad)};
    r.q = head_view(r.bufs[0], B, p.T, 0, H, p.dk);
    r.k = head_view(r.bufs[0], B, p.T, H * p.dk, H, p.dk);
    r.v = head_view(r.bufs[0], B, p.T, 2 * H * p.dk, H, p.dv);
  } else {
    r.bufs = {buffer(B * p.T, H * p.dk + kPad), buffer(B * p.S, H * (p.dk + p.dv) + kPad)};
    r.q = head_view(r.bufs[0], B, p.T, 0, H, p.dk);
    r.k = head_view(r.bufs[1], B, p.S, 0, H, p.dk);
    r.v = head_view(r.bufs[1], B, p.S, H * p.dk, H, p.dv);
  }
  return r;
}

// The spare columns of gradient buffers still NaN: nothing was written beside the views.
bool pads_untouched(const Heads& g) {
  for (const Tensor& buf : g.bufs) {
    const Tensor pad = buf.slice(1, buf.dim(1) - kPad, buf.dim(1));
    for (double x : values_of(pad))
      if (!std::isnan(x)) return false;
  }
  return true;
}

// max |a - b| against max |b|: the error relative to the gradient's size (0 when b is all 0 and a
// equals it).
double rel_err(const Tensor& a, const Tensor& b) {
  const double e = max_abs_diff(a, b), s = max_abs(b);
  return e == 0.0 ? 0.0 : e / s;
}

struct Grads {
  Tensor dq, dk, dv;
};

// The reference backward's gradients (contiguous) of the problem's loss with upstream dout.
Grads reference_grads(const Problem& p, const Heads& x, const Tensor& out, const Tensor& lse,
                      const Tensor& dout) {
  Grads r{Tensor::empty(x.q.shape()), Tensor::empty(x.k.shape()), Tensor::empty(x.v.shape())};
  const Status st = ref::attention_backward(x.q, x.k, x.v, out, lse, dout, r.dq, r.dk, r.dv, p.scale(),
                                            p.causal, p.key_lo(), p.key_hi());
  EXPECT_TRUE(st.ok()) << st.message();
  return r;
}

// Fast forward and backward of one problem against the reference backward, every gradient
// within kTol of its size, written in full into strided views and nowhere else (lse a strided
// view too). Returns the largest relative error.
double expect_backward_matches(const Problem& p, std::mt19937& rng) {
  const Heads x = fused_heads(p, &rng);
  Heads g = fused_heads(p, nullptr);
  const Tensor dout = random_uniform({p.B, p.H, p.T, p.dv}, rng);
  Tensor out = Tensor::empty({p.B, p.H, p.T, p.dv});
  Tensor lse = Tensor::full({p.B, p.H, p.T, 2}, kNaN).select(3, 1);  // a strided view: every other float
  Status st = ops::attention_train(x.q, x.k, x.v, out, lse, p.scale(), p.causal, p.key_lo(), p.key_hi());
  EXPECT_TRUE(st.ok()) << st.message();
  st = ops::attention_backward(x.q, x.k, x.v, out, lse, dout, g.q, g.k, g.v, p.scale(), p.causal, p.key_lo(),
                               p.key_hi());
  EXPECT_TRUE(st.ok()) << st.message();
  const Grads want = reference_grads(p, x, out, lse, dout);
  const double eq = rel_err(g.q, want.dq), ek = rel_err(g.k, want.dk), ev = rel_err(g.v, want.dv);
  EXPECT_LE(eq, kTol) << "dq, " << p.name();
  EXPECT_LE(ek, kTol) << "dk, " << p.name();
  EXPECT_LE(ev, kTol) << "dv, " << p.name();
  EXPECT_TRUE(pads_untouched(g)) << p.name();
  return std::max({eq, ek, ev});
}

// Each query row of batch row 0 reads its own sequence [0, 100) or [100, T - 10), the last 10
// rows are padding reading every real row; batch row 1 holds one sequence [0, 40) and padding, and
// its last row has an empty range. Keys [T - 10, T) of batch row 0 and [40, T) of batch row 1 are
// read by nobody.
void packed_ranges(Problem* p) {
  const int64_t T = p->T;
  p->lo.assign(static_cast<size_t>(p->B * T), 0);
  p->hi.assign(static_cast<size_t>(p->B * T), 0);
  for (int64_t t = 0; t < T; ++t) {
    const bool first = t < 100, padding = t >= T - 10;
    p->lo[t] = first || padding ? 0 : 100;
    p->hi[t] = static_cast<int32_t>(first ? 100 : T - 10);
    for (int64_t b = 1; b < p->B; ++b) {
      p->lo[b * T + t] = 0;
      p->hi[b * T + t] = 40;
    }
  }
  p->lo[p->B * T - 1] = p->hi[p->B * T - 1] = 17;
}

}  // namespace

TEST(AttentionBackward, TrainForwardIsAttentionWithItsLogSumExp) {
  std::mt19937 rng(1);
  Problem ranged{2, 2, 300, 300, 16, 24};
  packed_ranges(&ranged);
  const Problem cases[] = {{1, 1, 1, 1, 4, 4},           {2, 3, 7, 7, 5, 9},
                           {1, 2, 65, 65, 64, 64, true}, {1, 2, 65, 300, 32, 16, true},
                           {1, 1, 300, 300, 80, 40},     ranged};
  for (const Problem& p : cases) {
    const Heads x = fused_heads(p, &rng);
    Tensor out = Tensor::empty({p.B, p.H, p.T, p.dv}), lse = Tensor::empty({p.B, p.H, p.T});
    Tensor plain = Tensor::empty({p.B, p.H, p.T, p.dv});
    ASSERT_TRUE(
        ops::attention_train(x.q, x.k, x.v, out, lse, p.scale(), p.causal, p.key_lo(), p.key_hi()).ok());
    ASSERT_TRUE(ops::attention(x.q, x.k, x.v, plain, p.scale(), p.causal, p.key_lo(), p.key_hi()).ok());
    EXPECT_EQ(max_abs_diff(out, plain), 0.0) << p.name();  // the same kernel: the same bits
    // lse against a plain log-sum-exp over each row's usable keys, in double.
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t i = 0; i < p.T; ++i) {
          std::vector<double> s;
          for (int64_t j = 0; j < p.S; ++j) {
            if (!p.lo.empty() && (j < p.lo[b * p.T + i] || j >= p.hi[b * p.T + i])) continue;
            if (p.causal && j > i + (p.S - p.T)) continue;
            double dot = 0.0;
            for (int64_t d = 0; d < p.dk; ++d) dot += double{x.q.at({b, h, i, d})} * x.k.at({b, h, j, d});
            s.push_back(p.scale() * dot);
          }
          const float got = lse.at({b, h, i});
          if (s.empty()) {
            EXPECT_EQ(got, -std::numeric_limits<float>::infinity()) << p.name() << " row " << i;
            continue;
          }
          const double mx = *std::max_element(s.begin(), s.end());
          double sum = 0.0;
          for (double v : s) sum += std::exp(v - mx);
          const double want = mx + std::log(sum);
          EXPECT_NEAR(got, want, 2e-6 * std::max(1.0, std::fabs(want))) << p.name() << " row " << i;
        }
  }
}

TEST(AttentionBackward, ReferenceTrainForwardMatchesTheReferenceAttention) {
  std::mt19937 rng(2);
  const Problem p{2, 2, 33, 40, 8, 6, true};
  const Heads x = fused_heads(p, &rng);
  Tensor out = Tensor::empty({2, 2, 33, 6}), lse = Tensor::empty({2, 2, 33}),
         want = Tensor::empty({2, 2, 33, 6});
  ASSERT_TRUE(ref::attention_train(x.q, x.k, x.v, out, lse, p.scale(), true).ok());
  ASSERT_TRUE(ref::attention(x.q, x.k, x.v, want, p.scale(), true).ok());
  EXPECT_LE(max_abs_diff(out, want), 1e-6);
  Tensor fast_out = Tensor::empty({2, 2, 33, 6}), fast_lse = Tensor::empty({2, 2, 33});
  ASSERT_TRUE(ops::attention_train(x.q, x.k, x.v, fast_out, fast_lse, p.scale(), true).ok());
  EXPECT_LE(max_abs_diff(fast_lse, lse), 1e-5);
}

TEST(AttentionBackward, MatchesTheReferenceOverShapes) {
  // T and S across the 64-row query tile and the 256-key tile (1, 7, 65, 300), dk != dv, d up
  // to 80, causal with S == T; several heads and batch rows.
  std::mt19937 rng(3);
  const Problem cases[] = {{1, 1, 1, 1, 1, 1},          {1, 1, 1, 7, 4, 3},
                           {2, 3, 7, 7, 5, 9},          {1, 2, 7, 65, 16, 8},
                           {1, 2, 65, 65, 64, 64},      {2, 2, 65, 65, 16, 24, true},
                           {1, 1, 300, 300, 32, 32},    {1, 2, 300, 300, 64, 64, true},
                           {1, 1, 300, 7, 8, 8},        {1, 1, 65, 300, 80, 40},
                           {3, 1, 130, 130, 5, 9, true}};
  double worst = 0.0;
  for (const Problem& p : cases) worst = std::max(worst, expect_backward_matches(p, rng));
  std::printf("largest error relative to the gradient's size: %.2g\n", worst);
}

TEST(AttentionBackward, CausalWithACachedPrefix) {
  // Queries continue a sequence: row i is position S - T + i and sees keys [0, S - T + i].
  std::mt19937 rng(4);
  const Problem cases[] = {{1, 2, 1, 7, 8, 8, true},
                           {1, 2, 7, 300, 16, 16, true},
                           {2, 2, 65, 300, 32, 24, true},
                           {1, 1, 64, 320, 64, 64, true}};
  for (const Problem& p : cases) expect_backward_matches(p, rng);
}

TEST(AttentionBackward, KeyRangesOfPackedSequencesAndPadding) {
  std::mt19937 rng(5);
  for (bool causal : {false, true}) {
    Problem p{2, 3, 300, 300, 16, 24, causal};
    packed_ranges(&p);
    expect_backward_matches(p, rng);
  }
}

TEST(AttentionBackward, RowsWithoutKeysGiveZeroGradients) {
  // Every third query row has no key; keys [60, 70) are read by nobody. Those dq rows and those
  // dk, dv rows are exact zeros on both paths, and nothing is NaN.
  std::mt19937 rng(6);
  Problem p{1, 2, 70, 70, 8, 8};
  p.lo.assign(70, 0);
  p.hi.assign(70, 60);
  for (int32_t t = 0; t < 70; t += 3) p.lo[t] = p.hi[t] = t;
  expect_backward_matches(p, rng);
  const Heads x = fused_heads(p, &rng);
  Heads g = fused_heads(p, nullptr);
  const Tensor dout = random_uniform({1, 2, 70, 8}, rng);
  Tensor out = Tensor::empty({1, 2, 70, 8}), lse = Tensor::empty({1, 2, 70});
  ASSERT_TRUE(ops::attention_train(x.q, x.k, x.v, out, lse, 0.5f, false, p.key_lo(), p.key_hi()).ok());
  ASSERT_TRUE(ops::attention_backward(x.q, x.k, x.v, out, lse, dout, g.q, g.k, g.v, 0.5f, false, p.key_lo(),
                                      p.key_hi())
                  .ok());
  Grads r{Tensor::empty({1, 2, 70, 8}), Tensor::empty({1, 2, 70, 8}), Tensor::empty({1, 2, 70, 8})};
  ASSERT_TRUE(ref::attention_backward(x.q, x.k, x.v, out, lse, dout, r.dq, r.dk, r.dv, 0.5f, false,
                                      p.key_lo(), p.key_hi())
                  .ok());
  for (const Tensor* t : {&g.q, &g.k, &g.v, &r.dq, &r.dk, &r.dv})
    for (double f : values_of(*t)) ASSERT_TRUE(std::isfinite(f));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 70; ++t)
      for (int64_t d = 0; d < 8; ++d) {
        if (t % 3 == 0) {
          EXPECT_EQ(g.q.at({0, h, t, d}), 0.f) << t;
          EXPECT_EQ(r.dq.at({0, h, t, d}), 0.f) << t;
        }
        if (t >= 60) {
          EXPECT_EQ(g.k.at({0, h, t, d}), 0.f) << t;
          EXPECT_EQ(g.v.at({0, h, t, d}), 0.f) << t;
          EXPECT_EQ(r.dk.at({0, h, t, d}), 0.f) << t;
        }
      }
  // No key anywhere: every gradient 0 (lse all -inf).
  Problem none{1, 1, 5, 5, 4, 4};
  none.lo.assign(5, 2);
  none.hi.assign(5, 2);
  expect_backward_matches(none, rng);
}

TEST(AttentionBackward, SameBitsWhateverTheThreadCount) {
  // One thread takes the one-pass schedule (a thread per head); four threads with one or two heads
  // take the two passes (key blocks, then query blocks). Both add every tile in the same order.
  const ThreadCount restore;
  std::mt19937 rng(7);
  Problem ranged{1, 2, 300, 300, 16, 24, true};
  packed_ranges(&ranged);
  Problem late{1, 1, 600, 600, 16, 16};  // rows from 100 read keys [100, 600): spans off the key-tile grid
  for (int32_t t = 0; t < 600; ++t) {
    late.lo.push_back(t < 100 ? 0 : 100);
    late.hi.push_back(t < 100 ? 100 : 600);
  }
  const Problem cases[] = {{1, 1, 300, 300, 64, 64}, {1, 2, 130, 600, 32, 16, true}, ranged, late};
  for (const Problem& p : cases) {
    const Heads x = fused_heads(p, &rng);
    const Tensor dout = random_uniform({p.B, p.H, p.T, p.dv}, rng);
    Tensor out = Tensor::empty({p.B, p.H, p.T, p.dv}), lse = Tensor::empty({p.B, p.H, p.T});
    ASSERT_TRUE(
        ops::attention_train(x.q, x.k, x.v, out, lse, p.scale(), p.causal, p.key_lo(), p.key_hi()).ok());
    Heads by[2] = {fused_heads(p, nullptr), fused_heads(p, nullptr)};
    const int threads[2] = {1, 4};
    for (int i = 0; i < 2; ++i) {
      set_num_threads(threads[i]);
      ASSERT_TRUE(ops::attention_backward(x.q, x.k, x.v, out, lse, dout, by[i].q, by[i].k, by[i].v, p.scale(),
                                          p.causal, p.key_lo(), p.key_hi())
                      .ok());
    }
    EXPECT_EQ(max_abs_diff(by[0].q, by[1].q), 0.0) << p.name();
    EXPECT_EQ(max_abs_diff(by[0].k, by[1].k), 0.0) << p.name();
    EXPECT_EQ(max_abs_diff(by[0].v, by[1].v), 0.0) << p.name();
    const Grads want = reference_grads(p, x, out, lse, dout);
    EXPECT_LE(rel_err(by[1].q, want.dq), kTol) << p.name();
  }
}

TEST(AttentionBackward, ReferenceMatchesFiniteDifferences) {
  // In f64: L = Σ G ⊙ out, so dout = G; each input element nudged by ±h.
  std::mt19937 rng(8);
  Problem ranged{2, 1, 6, 6, 3, 2};
  ranged.lo = {0, 0, 0, 3, 3, 3, /**/ 0, 0, 0, 0, 4, 4};
  ranged.hi = {3, 3, 3, 6, 6, 6, /**/ 4, 4, 4, 4, 4, 4};  // batch row 1's last two rows: no key
  const Problem cases[] = {{1, 2, 5, 5, 3, 4}, {1, 2, 4, 7, 3, 2, true}, ranged};
  const double h = 1e-6;
  double worst = 0.0;
  for (const Problem& p : cases) {
    Tensor q = random_uniform({p.B, p.H, p.T, p.dk}, rng, -1, 1, DType::f64);
    Tensor k = random_uniform({p.B, p.H, p.S, p.dk}, rng, -1, 1, DType::f64);
    Tensor v = random_uniform({p.B, p.H, p.S, p.dv}, rng, -1, 1, DType::f64);
    const Tensor G = random_uniform({p.B, p.H, p.T, p.dv}, rng, -1, 1, DType::f64);
    Tensor out = Tensor::empty(G.shape(), DType::f64), lse = Tensor::empty({p.B, p.H, p.T}, DType::f64);
    auto loss = [&]() {
      EXPECT_TRUE(ref::attention_train(q, k, v, out, lse, p.scale(), p.causal, p.key_lo(), p.key_hi()).ok());
      double L = 0.0;
      const std::vector<double> o = values_of(out), g = values_of(G);
      for (size_t i = 0; i < o.size(); ++i) L += g[i] * o[i];
      return L;
    };
    loss();
    Tensor dq = Tensor::empty(q.shape(), DType::f64), dk = Tensor::empty(k.shape(), DType::f64),
           dv = Tensor::empty(v.shape(), DType::f64);
    ASSERT_TRUE(
        ref::attention_backward(q, k, v, out, lse, G, dq, dk, dv, p.scale(), p.causal, p.key_lo(), p.key_hi())
            .ok());
    const std::pair<Tensor*, const Tensor*> pairs[] = {{&q, &dq}, {&k, &dk}, {&v, &dv}};
    for (const auto& [x, dx] : pairs) {
      double* xp = x->data<double>();  // contiguous: nudged in place
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
      EXPECT_LE(max_abs_diff(*dx, fd), kFdTol * std::max(1e-3, max_abs(fd))) << p.name();
      worst = std::max(worst, max_abs_diff(*dx, fd) / std::max(1e-3, max_abs(fd)));
    }
  }
  std::printf("largest error relative to the gradient's size: %.2g\n", worst);
}

TEST(AttentionBackward, MemoryStaysLinearInT) {
  // T = S = 4096: the (T, S) weights would take 64 MiB in f32. The training forward and the
  // backward make no Tensor and grow the process's peak resident size by far less (16 MiB allows
  // for oneDNN's and OpenMP's own buffers).
  const int64_t T = 4096, d = 32;
  std::mt19937 rng(9);
  const Tensor q = random_uniform({1, 1, T, d}, rng), k = random_uniform({1, 1, T, d}, rng),
               v = random_uniform({1, 1, T, d}, rng), dout = random_uniform({1, 1, T, d}, rng);
  Tensor out = Tensor::empty({1, 1, T, d}), lse = Tensor::empty({1, 1, T});
  Tensor dq = Tensor::zeros({1, 1, T, d}), dk = Tensor::zeros({1, 1, T, d}), dv = Tensor::zeros({1, 1, T, d});
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  {  // warm up threads and oneDNN on a small problem
    Tensor o = Tensor::empty({1, 1, 300, d}), l = Tensor::empty({1, 1, 300}),
           g = Tensor::empty({1, 1, 300, d});
    const Tensor s = q.slice(2, 0, 300);
    Tensor g2 = g.clone(), g3 = g.clone();
    ASSERT_TRUE(ops::attention_train(s, s, s, o, l, scale, true).ok());
    ASSERT_TRUE(ops::attention_backward(s, s, s, o, l, o, g, g2, g3, scale, true).ok());
  }
  auto status_bytes = [](const char* key) -> int64_t {  // a "VmRSS:" or "VmHWM:" line, in bytes
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int64_t kb = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, key, std::strlen(key)) == 0)
        kb = std::strtoll(line + std::strlen(key), nullptr, 10);
    std::fclose(f);
    return kb < 0 ? -1 : kb * 1024;
  };
  auto reset_peak = [] {  // the peak resident size set to the current one (Linux >= 4.0)
    std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    const bool ok = std::fputs("5", f) >= 0;
    return std::fclose(f) == 0 && ok;
  };
  bool peak_reset = reset_peak();
  const int64_t rss = status_bytes("VmRSS:"), tensors = Tensor::allocations();
  ASSERT_TRUE(ops::attention_train(q, k, v, out, lse, scale, true).ok());
  ASSERT_TRUE(ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv, scale, true).ok());
  EXPECT_EQ(Tensor::allocations(), tensors);
  const int64_t growth = status_bytes("VmHWM:") - rss;
  std::printf("peak resident growth over the inputs: %.1f MiB\n", static_cast<double>(growth) / (1 << 20));
  for (const Tensor* t : {&out, &dq, &dk, &dv})
    for (double x : values_of(*t)) ASSERT_TRUE(std::isfinite(x));
  // The last query row sees every key: its dq against a reference on that row alone.
  const Tensor q1 = q.slice(2, T - 1, T), dout1 = dout.slice(2, T - 1, T);
  Tensor out1 = Tensor::empty({1, 1, 1, d}), lse1 = Tensor::empty({1, 1, 1});
  Tensor dq1 = Tensor::empty({1, 1, 1, d}), dk1 = Tensor::empty({1, 1, T, d}),
         dv1 = Tensor::empty({1, 1, T, d});
  ASSERT_TRUE(ref::attention_train(q1, k, v, out1, lse1, scale, true).ok());
  ASSERT_TRUE(ref::attention_backward(q1, k, v, out1, lse1, dout1, dq1, dk1, dv1, scale, true).ok());
  EXPECT_LE(rel_err(dq.slice(2, T - 1, T), dq1), kTol);
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer keeps freed blocks resident (its quarantine) and adds redzones and shadow
  // bytes, so the resident size says nothing about the kernel's own memory; the allocation count
  // above still holds.
  GTEST_SKIP() << "the resident size is AddressSanitizer's under ASan (growth " << growth << " bytes)";
#endif
  // The same measure around one (T, S) f32 buffer, to show it would have seen one.
  peak_reset = peak_reset && reset_peak();
  const int64_t rss2 = status_bytes("VmRSS:");
  Tensor::full({T, T}, 1.f);
  const int64_t seen = status_bytes("VmHWM:") - rss2;
  if (!peak_reset || rss <= 0 || seen < (int64_t{60} << 20)) {
    GTEST_SKIP() << "cannot measure the peak resident size here (a (T, S) buffer showed as " << seen
                 << " bytes)";
  }
  EXPECT_LT(growth, int64_t{16} << 20);
}

TEST(AttentionBackward, ToleranceCatchesAnOffByOneMask) {
  // The comparisons above would notice a backward that let each row see one key too many.
  std::mt19937 rng(10);
  Problem p{1, 1, 100, 100, 16, 16}, wider = p;
  for (int32_t t = 0; t < 100; ++t) {
    p.lo.push_back(0);
    p.hi.push_back(t + 1);
    wider.lo.push_back(0);
    wider.hi.push_back(std::min(100, t + 2));
  }
  const Heads x = fused_heads(p, &rng);
  const Tensor dout = random_uniform({1, 1, 100, 16}, rng);
  Tensor out = Tensor::empty({1, 1, 100, 16}), lse = Tensor::empty({1, 1, 100});
  ASSERT_TRUE(ops::attention_train(x.q, x.k, x.v, out, lse, p.scale(), false, p.key_lo(), p.key_hi()).ok());
  Heads g = fused_heads(p, nullptr);
  ASSERT_TRUE(ops::attention_backward(x.q, x.k, x.v, out, lse, dout, g.q, g.k, g.v, p.scale(), false,
                                      p.key_lo(), p.key_hi())
                  .ok());
  const Grads off = reference_grads(wider, x, out, lse, dout);
  EXPECT_GT(rel_err(g.q, off.dq), 1e-2);
  EXPECT_GT(rel_err(g.k, off.dk), 1e-2);
  EXPECT_GT(rel_err(g.v, off.dv), 1e-2);
}

TEST(AttentionBackward, RefusesBadShapesNamingThem) {
  std::mt19937 rng(11);
  const Tensor q = random_uniform({1, 2, 4, 8}, rng), k = random_uniform({1, 2, 6, 8}, rng),
               v = random_uniform({1, 2, 6, 5}, rng), out = random_uniform({1, 2, 4, 5}, rng),
               lse = random_uniform({1, 2, 4}, rng), dout = random_uniform({1, 2, 4, 5}, rng);
  Tensor dq = Tensor::empty({1, 2, 4, 8}), dk = Tensor::empty({1, 2, 6, 8}), dv = Tensor::empty({1, 2, 6, 5});
  auto backward_says = [&](const Tensor& q_, const Tensor& lse_, const Tensor& dout_, Tensor& dq_,
                           Tensor& dk_, bool causal = false, const int32_t* lo = nullptr,
                           const int32_t* hi = nullptr) {
    const Status fast =
        ops::attention_backward(q_, k, v, out, lse_, dout_, dq_, dk_, dv, 1.f, causal, lo, hi);
    const Status slow =
        ref::attention_backward(q_, k, v, out, lse_, dout_, dq_, dk_, dv, 1.f, causal, lo, hi);
    EXPECT_EQ(fast.code(), Code::invalid_argument);
    EXPECT_EQ(slow.code(), Code::invalid_argument);  // both paths refuse alike
    return fast.message();
  };
  auto has = [](const std::string& msg, const char* what) {
    return msg.find(what) != std::string::npos ? ::testing::AssertionSuccess()
                                               : ::testing::AssertionFailure() << msg;
  };
  const Tensor lse_bad = random_uniform({1, 2, 5}, rng);
  EXPECT_TRUE(has(backward_says(q, lse_bad, dout, dq, dk),
                  "ops::attention_backward: lse f32 (1, 2, 5) should be (1, 2, 4) for q f32 (1, 2, 4, 8)"));
  Tensor dq_bad = Tensor::empty({1, 2, 4, 7});
  EXPECT_TRUE(has(backward_says(q, lse, dout, dq_bad, dk), "dq f32 (1, 2, 4, 7) should be (1, 2, 4, 8)"));
  const Tensor dout_bad = random_uniform({1, 2, 4, 8}, rng);
  EXPECT_TRUE(has(backward_says(q, lse, dout_bad, dq, dk), "dout f32 (1, 2, 4, 8) should be (1, 2, 4, 5)"));
  Tensor dk_strided = Tensor::empty({1, 2, 8, 6}).transpose(2, 3);  // d has stride 6
  EXPECT_TRUE(has(backward_says(q, lse, dout, dq, dk_strided), "dk f32 (1, 2, 6, 8) needs unit stride"));
  const Tensor lse_ids = Tensor::from_ids({1, 2, 4}, std::vector<int32_t>(8, 0));
  EXPECT_TRUE(has(backward_says(q, lse_ids, dout, dq, dk), "lse must be f32, got i32 (1, 2, 4)"));
  const Tensor q7 = random_uniform({1, 2, 7, 8}, rng), out7 = random_uniform({1, 2, 7, 5}, rng),
               lse7 = random_uniform({1, 2, 7}, rng);
  Tensor dq7 = Tensor::empty({1, 2, 7, 8});
  EXPECT_TRUE(has(ops::attention_backward(q7, k, v, out7, lse7, out7, dq7, dk, dv, 1.f, true).message(),
                  "causal attention needs at least as many keys as queries, got 6 keys for 7 queries"));
  std::vector<int32_t> lo(4, 0);
  EXPECT_TRUE(has(backward_says(q, lse, dout, dq, dk, false, lo.data(), nullptr), "key_lo and key_hi"));

  // f64: the reference loops only, every tensor of a call alike.
  const Tensor q64 = q.to(DType::f64);
  EXPECT_TRUE(has(ops::attention_backward(q64, k, v, out, lse, dout, dq, dk, dv, 1.f).message(),
                  "q must be f32, got f64"));
  EXPECT_TRUE(has(ref::attention_backward(q64, k, v, out, lse, dout, dq, dk, dv, 1.f).message(),
                  "ref::attention_backward: k must be f64, got f32 (1, 2, 6, 8)"));
  Tensor o = Tensor::empty({1, 2, 4, 5}), l = Tensor::empty({1, 2, 4}, DType::f64);
  EXPECT_TRUE(has(ops::attention_train(q, k, v, o, l, 1.f).message(),
                  "ops::attention_train: lse must be f32, got f64"));
  EXPECT_TRUE(has(ref::attention_train(q, k, v, o, l, 1.f).message(),
                  "ref::attention_train: lse must be f32, got f64"));
  Tensor l_bad = Tensor::empty({1, 2});
  EXPECT_TRUE(
      has(ops::attention_train(q, k, v, o, l_bad, 1.f).message(), "lse f32 (1, 2) should be (1, 2, 4)"));
}

TEST(AttentionBackward, RunsOnTheIsaOneDnnWasGiven) {
  // ctest runs this suite twice: as is, and with ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN's AVX2 sgemm
  // kernels on an AVX-512 machine). Here: the limit took hold, and a backward still matches.
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  const std::string got = runtime_info().isa;
  std::printf("oneDNN dispatches to %s (ONEDNN_MAX_CPU_ISA %s)\n", got.c_str(), isa ? isa : "unset");
  if (isa && std::string(isa) == "AVX2") {
    EXPECT_EQ(got.find("avx512"), std::string::npos) << got;
  }
  std::mt19937 rng(12);
  expect_backward_matches({1, 2, 300, 300, 64, 64, true}, rng);
}
