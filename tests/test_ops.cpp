// The fast path (oneDNN: tessera::ops, tessera::Linear) against the reference loops (tessera::ref),
// op by op, over random and odd shapes, strided views, f32 and bf16; plus the promises the fast
// path makes on its own: fully masked softmax rows, packed weights reused, primitives cached,
// the same refusals as the reference. Not here: attention and model assembly (their own suites).
//
// Tolerances. A sum of K products computed in floating point with precision eps errs by at most
// about K·eps·Σ|terms| in the worst case and, for the blocked sums of oneDNN's kernels with
// random rounding, like log K or sqrt K times eps·Σ|terms| in practice. So every matmul-like check
// here is, element by element,
//     |fast - ref| <= 4 · eps · log2(2K) · S,   S = Σ_k |a_ik|·|b_kj| (+ |bias_j| + |r_ij|)
// with eps = 2^-23 when both sides see the same (f32 or bf16-rounded) inputs, and
//     |fast_bf16 - ref_f32| <= 2^-8 · S + (the f32 term)
// for a bf16 result against the unrounded f32 reference (each product of two bf16-rounded
// factors is within 2·2^-9 = 2^-8 of the exact one: a bound, not an estimate). For inputs in
// [-1, 1] and K = 129, the f32 tolerance is about 1e-4 while a wrong bias, a dropped residual or
// an off-by-one row moves elements by about 0.5: ToleranceCatchesBugs checks exactly that.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dnnl/engine.h"  // core/src: the primitive cache and Linear counters
#include "dnnl/onednn.h"  // core/src: convert
#include "tessera/ops.h"
#include "test_util.h"

using namespace tessera;

namespace {

constexpr double kEpsF32 = 1.0 / (1 << 23);
constexpr double kEpsBf16 = 1.0 / (1 << 8);
constexpr float kInf = std::numeric_limits<float>::infinity();
const int64_t kOdd[] = {1, 3, 7, 17, 33, 65, 100, 129};

int64_t odd(std::mt19937& rng) { return kOdd[rng() % (sizeof(kOdd) / sizeof(kOdd[0]))]; }

using testing_util::random_tensor;
using testing_util::SameRefusal;

// The same values rounded to bf16, held as f32 (what the fast path computes with in bf16 mode).
Tensor bf16_rounded(const Tensor& t) { return t.to(DType::bf16).to(DType::f32); }

Tensor abs_of(const Tensor& t) {
  std::vector<float> v = t.to_vector();
  for (float& f : v) f = std::fabs(f);
  return Tensor::from_vector(t.shape(), v);
}

// S = Σ_k |a|·|b| (+ |bias| broadcast over rows + |r|): the magnitude a linear's error scales with.
Tensor linear_scale(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor* r) {
  Tensor s = Tensor::empty({x.dim(0), w.dim(1)});
  EXPECT_TRUE(ref::matmul(abs_of(x), abs_of(w), s).ok());
  float* p = s.data<float>();
  const int64_t M = s.dim(0), N = s.dim(1);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      if (b.defined()) p[m * N + n] += std::fabs(b.at({n}));
      if (r) p[m * N + n] += std::fabs(r->at({m, n}));
    }
  return s;
}

double matmul_factor(int64_t K, double eps = kEpsF32) {
  return 4.0 * eps * std::log2(2.0 * static_cast<double>(std::max<int64_t>(K, 1)));
}

// Every element: |got - want| <= factor · scale + floor. Names the first mismatches.
::testing::AssertionResult AllClose(const Tensor& got, const Tensor& want, const Tensor& scale, double factor,
                                    double floor = 0.0) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shapes " << got.shape().str() << " vs " << want.shape().str();
  const std::vector<float> g = got.to_vector(), w = want.to_vector(), s = scale.to_vector();
  int bad = 0;
  std::string msg;
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = factor * s[i] + floor;
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    if (!(err <= tol) || std::isnan(g[i]) != std::isnan(w[i])) {
      if (++bad <= 5)
        msg += "\n  [" + std::to_string(i) + "] got " + std::to_string(g[i]) + " want " +
               std::to_string(w[i]) + " err " + std::to_string(err) + " tol " + std::to_string(tol);
    }
  }
  if (bad) return ::testing::AssertionFailure() << bad << " of " << g.size() << " elements differ:" << msg;
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult AllEqual(const Tensor& got, const Tensor& want) {
  return AllClose(got, want, Tensor::zeros(want.shape()), 0.0);
}

const Activation kActs[] = {Activation::none, Activation::relu, Activation::gelu_erf, Activation::gelu_tanh};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Runtime

TEST(OpsRuntime, InfoNamesVersionIsaAndThreads) {
  const RuntimeInfo info = runtime_info();
  EXPECT_EQ(std::count(info.onednn_version.begin(), info.onednn_version.end(), '.'), 2)
      << info.onednn_version;
  EXPECT_FALSE(info.isa.empty());
  EXPECT_NE(info.isa, "unknown");
  EXPECT_GE(info.threads, 1);

  const int before = num_threads();
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  EXPECT_EQ(runtime_info().threads, 1);
  std::mt19937 rng(1);
  const Tensor a = random_tensor({33, 17}, rng), b = random_tensor({17, 65}, rng);
  Tensor c = Tensor::empty({33, 65}), want = Tensor::empty({33, 65});
  ASSERT_TRUE(ops::matmul(a, b, c).ok());
  ASSERT_TRUE(ref::matmul(a, b, want).ok());
  EXPECT_TRUE(AllClose(c, want, Tensor::full({33, 65}, 17.f), matmul_factor(17)));
  set_num_threads(0);
  EXPECT_GE(num_threads(), 1);
  set_num_threads(before);
  EXPECT_EQ(num_threads(), before);
}

TEST(OpsRuntime, ActivationNames) {
  EXPECT_STREQ(activation_name(Activation::none), "none");
  EXPECT_STREQ(activation_name(Activation::relu), "relu");
  EXPECT_STREQ(activation_name(Activation::gelu_erf), "gelu_erf");
  EXPECT_STREQ(activation_name(Activation::gelu_tanh), "gelu_tanh");
}

// ---------------------------------------------------------------------------------------------
// matmul

// onednn::convert, which rounds every operand of a bf16 product, against the scalar
// f32_to_bf16 (nearest, ties to even; a NaN stays a quiet NaN) bit for bit, in each direction, on
// rows long and short enough for the vector loops (AVX-512 and AVX2, 16 and 8 lanes) and their
// tails, dense and through a strided view: random bit patterns (NaNs, infinities and subnormals
// among them) and the edge cases by name.
TEST(Convert, EveryDirectionIsTheScalarRoundingBitForBit) {
  std::mt19937 rng(7);
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  std::vector<float> special = {0.f, -0.f, 1.f, -1.f, from_bits(0x3f808000u), from_bits(0x3f818000u),
                                from_bits(0x3f808001u), from_bits(0x7f7fffffu), from_bits(0x7f7f8000u),
                                std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                from_bits(0x7fc00000u), from_bits(0xff800001u), from_bits(0x7f800001u),
                                from_bits(0x00000001u), from_bits(0x00008000u), from_bits(0x80018000u)};
  for (const int64_t C : {1, 7, 8, 15, 16, 17, 31, 33, 64, 70, 1000}) {
    const int64_t R = 3;
    std::vector<float> v(static_cast<size_t>(R * C));
    for (size_t i = 0; i < v.size(); ++i) v[i] = i < special.size() ? special[i] : from_bits(static_cast<uint32_t>(rng()));
    const Tensor src = Tensor::from_vector({R, C}, v);
    Tensor to16 = Tensor::empty({R, C}, DType::bf16), rounded = Tensor::empty({R, C}), back = Tensor::empty({R, C});
    onednn::convert(src, to16);
    onednn::convert(src, rounded, /*round_bf16=*/true);
    onednn::convert(to16, back);
    // A strided destination: a transpose view, its rows' elements R apart.
    Tensor buf = Tensor::zeros({C, R}, DType::bf16);
    Tensor strided = buf.transpose(0, 1);
    onednn::convert(src, strided);
    for (int64_t i = 0; i < R * C; ++i) {
      const uint16_t want = f32_to_bf16(v[i]).bits;
      const std::string at = "C " + std::to_string(C) + ", element " + std::to_string(i) + " (bits " +
                             std::to_string(bits(v[i])) + ")";
      ASSERT_EQ(to16.data<bf16>()[i].bits, want) << at;
      ASSERT_EQ(bits(rounded.data<float>()[i]), static_cast<uint32_t>(want) << 16) << at;
      ASSERT_EQ(bits(back.data<float>()[i]), static_cast<uint32_t>(want) << 16) << at;
      ASSERT_EQ(buf.data<bf16>()[(i % C) * R + i / C].bits, want) << at;
    }
  }
}

TEST(Matmul, RandomShapesWithTransposedViewsAndAlpha) {
  std::mt19937 rng(11);
  const float alphas[] = {1.f, 0.125f, -2.f};
  for (int it = 0; it < 24; ++it) {
    const int64_t M = odd(rng), K = odd(rng), N = odd(rng);
    const float alpha = alphas[it % 3];
    // a as given or as the transpose view of a (K, M) tensor; b likewise of an (N, K) one.
    const Tensor a = it % 2 ? random_tensor({K, M}, rng).transpose(0, 1) : random_tensor({M, K}, rng);
    const Tensor b = it % 4 < 2 ? random_tensor({N, K}, rng).transpose(0, 1) : random_tensor({K, N}, rng);
    Tensor c = Tensor::empty({M, N}), want = Tensor::empty({M, N});
    ASSERT_TRUE(ops::matmul(a, b, c, alpha).ok()) << M << "x" << K << "x" << N;
    ASSERT_TRUE(ref::matmul(a, b, want, alpha).ok());
    Tensor scale = Tensor::empty({M, N});
    ASSERT_TRUE(ref::matmul(abs_of(a), abs_of(b), scale, std::fabs(alpha)).ok());
    EXPECT_TRUE(AllClose(c, want, scale, matmul_factor(K))) << "M=" << M << " K=" << K << " N=" << N;
  }
}

// Attention's views, exactly: q, k, v of shape (B, H, T, D) with strides (T·H·D, D, H·D, 1) over
// (B, T, H·D) buffers, kᵀ as a transpose view, and the output written through a head view.
TEST(Matmul, AttentionHeadViewsWithoutCopies) {
  std::mt19937 rng(12);
  const int64_t B = 2, H = 3, D = 8;
  for (int64_t T : {1, 7, 17}) {
    const Tensor qb = random_tensor({B, T, H * D}, rng), kb = random_tensor({B, T, H * D}, rng),
                 vb = random_tensor({B, T, H * D}, rng);
    auto heads = [&](const Tensor& buf) { return buf.reshape({B, T, H, D}).transpose(1, 2); };
    const Tensor q = heads(qb), k = heads(kb), v = heads(vb);
    ASSERT_EQ(q.stride(0), T * H * D);
    ASSERT_EQ(q.stride(1), D);
    ASSERT_EQ(q.stride(2), H * D);
    ASSERT_EQ(q.stride(3), 1);
    const Tensor kt = k.transpose(2, 3);  // (B, H, D, T)
    const float alpha = 1.f / std::sqrt(static_cast<float>(D));

    Tensor scores = Tensor::empty({B, H, T, T}), want_scores = Tensor::empty({B, H, T, T});
    ASSERT_TRUE(ops::matmul(q, kt, scores, alpha).ok());
    ASSERT_TRUE(ref::matmul(q, kt, want_scores, alpha).ok());
    EXPECT_TRUE(AllClose(scores, want_scores, Tensor::full({B, H, T, T}, D * alpha), matmul_factor(D)));

    Tensor p = Tensor::empty({B, H, T, T});
    ASSERT_TRUE(ops::softmax(scores, p).ok());
    Tensor out_buf = Tensor::full({B, T, H * D}, 7.f), want_buf = Tensor::full({B, T, H * D}, 7.f);
    Tensor out = heads(out_buf), want_out = heads(want_buf);  // c is a strided view
    ASSERT_TRUE(ops::matmul(p, v, out).ok());
    ASSERT_TRUE(ref::matmul(p, v, want_out).ok());
    EXPECT_TRUE(AllClose(out_buf, want_buf, Tensor::full({B, T, H * D}, 1.f), matmul_factor(T)));
  }
  // The same views over bf16 buffers (the reference widens bf16 exactly).
  {
    const int64_t T = 7;
    const Tensor qb = random_tensor({B, T, H * D}, rng).to(DType::bf16);
    const Tensor kb = random_tensor({B, T, H * D}, rng).to(DType::bf16);
    const Tensor q = qb.reshape({B, T, H, D}).transpose(1, 2);
    const Tensor kt = kb.reshape({B, T, H, D}).transpose(1, 2).transpose(2, 3);
    Tensor s = Tensor::empty({B, H, T, T}), want = Tensor::empty({B, H, T, T});
    ASSERT_TRUE(ops::matmul(q, kt, s, 0.125f).ok());
    ASSERT_TRUE(ref::matmul(q, kt, want, 0.125f).ok());
    EXPECT_TRUE(AllClose(s, want, Tensor::full({B, H, T, T}, 0.125f * D), matmul_factor(D)));
  }
  // A fused qkv buffer (B, T, 3, H, D): q = qkv[:, :, 0] as (B, H, T, D), row stride 3·H·D.
  const int64_t T = 17;
  const Tensor qkv = random_tensor({B, T, 3 * H * D}, rng);
  const Tensor q = qkv.reshape({B, T, 3, H, D}).select(2, 0).transpose(1, 2);
  const Tensor kt = qkv.reshape({B, T, 3, H, D}).select(2, 1).transpose(1, 2).transpose(2, 3);
  Tensor s = Tensor::empty({B, H, T, T}), want = Tensor::empty({B, H, T, T});
  ASSERT_TRUE(ops::matmul(q, kt, s, 0.5f).ok());
  ASSERT_TRUE(ref::matmul(q, kt, want, 0.5f).ok());
  EXPECT_TRUE(AllClose(s, want, Tensor::full({B, H, T, T}, 0.5f * D), matmul_factor(D)));
}

// Strides oneDNN has only a reference kernel for (no unit stride; interleaved batches): the
// fast path copies those operands dense and must still be right.
TEST(Matmul, OddStridesRank3And4) {
  std::mt19937 rng(13);
  const int64_t B = 3, M = 7, K = 17, N = 5;
  // a (M, K) with column stride 2: every other element of an (M, K, 2) tensor.
  const Tensor a2 = random_tensor({M, K, 2}, rng).select(2, 0);
  const Tensor b2 = random_tensor({K, N}, rng);
  Tensor c2 = Tensor::empty({M, N}), w2 = Tensor::empty({M, N});
  ASSERT_TRUE(ops::matmul(a2, b2, c2).ok());
  ASSERT_TRUE(ref::matmul(a2, b2, w2).ok());
  EXPECT_TRUE(AllClose(c2, w2, Tensor::full({M, N}, K), matmul_factor(K)));
  // rank 3 with the batch interleaved in the rows: a = (M, B, K) storage viewed as (B, M, K).
  const Tensor a3 = random_tensor({M, B, K}, rng).transpose(0, 1);
  const Tensor b3 = random_tensor({B, N, K}, rng).transpose(1, 2);
  Tensor c3_buf = Tensor::empty({M, B, N});
  Tensor c3 = c3_buf.transpose(0, 1), w3 = Tensor::empty({B, M, N});
  ASSERT_TRUE(ops::matmul(a3, b3, c3).ok());
  ASSERT_TRUE(ref::matmul(a3, b3, w3).ok());
  EXPECT_TRUE(AllClose(c3.contiguous(), w3, Tensor::full({B, M, N}, K), matmul_factor(K)));
  // rank 4, batch dims permuted.
  const Tensor a4 = random_tensor({3, 2, M, K}, rng).transpose(0, 1);
  const Tensor b4 = random_tensor({2, 3, K, N}, rng);
  Tensor c4 = Tensor::empty({2, 3, M, N}), w4 = Tensor::empty({2, 3, M, N});
  ASSERT_TRUE(ops::matmul(a4, b4, c4, 0.25f).ok());
  ASSERT_TRUE(ref::matmul(a4, b4, w4, 0.25f).ok());
  EXPECT_TRUE(AllClose(c4, w4, Tensor::full({2, 3, M, N}, 0.25f * K), matmul_factor(K)));
}

TEST(Matmul, Bf16AndMixedInputs) {
  std::mt19937 rng(14);
  for (int emulate = 0; emulate < 2; ++emulate) {
    std::unique_ptr<onednn::ScopedBf16Emulation> scope;
    if (emulate) scope = std::make_unique<onednn::ScopedBf16Emulation>();
    for (int it = 0; it < 6; ++it) {
      const int64_t M = odd(rng), K = odd(rng), N = odd(rng);
      const Tensor af = random_tensor({2, M, K}, rng), bf = random_tensor({2, K, N}, rng);
      const Tensor a = af.to(DType::bf16), b = it % 2 ? bf.to(DType::bf16) : bf;  // both or mixed
      Tensor c = Tensor::empty({2, M, N}), want = Tensor::empty({2, M, N});
      ASSERT_TRUE(ops::matmul(a, b, c).ok());
      ASSERT_TRUE(ref::matmul(a, b, want).ok());  // the reference widens bf16 exactly
      Tensor scale = Tensor::empty({2, M, N});
      ASSERT_TRUE(ref::matmul(abs_of(a.to(DType::f32)), abs_of(b.to(DType::f32)), scale).ok());
      EXPECT_TRUE(AllClose(c, want, scale, matmul_factor(K)));
      // Against the unrounded f32 product: the bf16 bound.
      Tensor exact = Tensor::empty({2, M, N});
      ASSERT_TRUE(ref::matmul(af, bf, exact).ok());
      ASSERT_TRUE(ref::matmul(abs_of(af), abs_of(bf), scale).ok());
      EXPECT_TRUE(AllClose(c, exact, scale, kEpsBf16 + matmul_factor(K)));
    }
  }
}

TEST(Matmul, DegenerateSizesAndAliasedOutput) {
  std::mt19937 rng(15);
  for (auto [M, K, N] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {1, 129, 1}, {129, 1, 3}, {1, 7, 100}, {100, 7, 1}}) {
    const Tensor a = random_tensor({M, K}, rng), b = random_tensor({K, N}, rng);
    Tensor c = Tensor::empty({M, N}), want = Tensor::empty({M, N});
    ASSERT_TRUE(ops::matmul(a, b, c).ok());
    ASSERT_TRUE(ref::matmul(a, b, want).ok());
    EXPECT_TRUE(AllClose(c, want, Tensor::full({M, N}, K), matmul_factor(K)));
  }
  // K = 0: empty sums are 0. A zero-sized batch: nothing to do.
  Tensor c = Tensor::full({3, 4}, 5.f);
  ASSERT_TRUE(ops::matmul(Tensor::empty({3, 0}), Tensor::empty({0, 4}), c).ok());
  EXPECT_TRUE(AllEqual(c, Tensor::zeros({3, 4})));
  Tensor e = Tensor::empty({0, 3, 4});
  EXPECT_TRUE(ops::matmul(Tensor::empty({0, 3, 2}), Tensor::empty({0, 2, 4}), e).ok());
  // c is a: the fast path must not read what it already wrote.
  Tensor a = random_tensor({17, 17}, rng);
  const Tensor b = random_tensor({17, 17}, rng);
  Tensor want = Tensor::empty({17, 17});
  ASSERT_TRUE(ref::matmul(a, b, want).ok());
  ASSERT_TRUE(ops::matmul(a, b, a).ok());
  EXPECT_TRUE(AllClose(a, want, Tensor::full({17, 17}, 17.f), matmul_factor(17)));
}

// ---------------------------------------------------------------------------------------------
// Linear

namespace {

// Runs fast and reference linear on (x, w, b, act, residual mode) and compares.
// residual_mode: 0 none, 1 a separate r, 2 y aliases r (y starts as r's values).
void check_linear(std::mt19937& rng, int64_t M, int64_t K, int64_t N, Activation act, bool bias,
                  int residual_mode, DType compute = DType::f32) {
  SCOPED_TRACE("M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
               " act=" + activation_name(act) + " bias=" + std::to_string(bias) +
               " residual=" + std::to_string(residual_mode) + " compute=" + dtype_name(compute));
  const Tensor x = random_tensor({M, K}, rng), w = random_tensor({K, N}, rng);
  const Tensor b = bias ? random_tensor({N}, rng) : Tensor();
  const Tensor r = random_tensor({M, N}, rng);
  Result<Linear> lin = Linear::create(w, b, act, compute);
  ASSERT_TRUE(lin.ok()) << lin.status().message();
  Tensor y = residual_mode == 2 ? r.clone() : Tensor::full({M, N}, 3.f);
  const Tensor* res = residual_mode == 1 ? &r : residual_mode == 2 ? &y : nullptr;
  const Status st = lin->forward(x, y, res);
  ASSERT_TRUE(st.ok()) << st.message();

  // Reference on the inputs the fast path computes with (bf16-rounded in bf16 mode).
  const bool bf = compute == DType::bf16;
  const Tensor xr = bf ? bf16_rounded(x) : x, wr = bf ? bf16_rounded(w) : w;
  Tensor want = Tensor::empty({M, N});
  ASSERT_TRUE(ref::linear(xr, wr, b, act, residual_mode ? &r : nullptr, want).ok());
  const Tensor scale = linear_scale(x, w, b, residual_mode ? &r : nullptr);
  EXPECT_TRUE(AllClose(y, want, scale, matmul_factor(K)));
  if (bf) {  // and against the unrounded f32 layer: the bf16 bound (activations are 1.13-Lipschitz)
    Tensor exact = Tensor::empty({M, N});
    ASSERT_TRUE(ref::linear(x, w, b, act, residual_mode ? &r : nullptr, exact).ok());
    EXPECT_TRUE(AllClose(y, exact, scale, 1.13 * kEpsBf16 + matmul_factor(K)));
  }
}

}  // namespace

TEST(Linear, EveryActivationWithAndWithoutBiasAndResidual) {
  std::mt19937 rng(21);
  for (Activation act : kActs)
    for (bool bias : {false, true})
      for (int residual : {0, 1, 2}) check_linear(rng, odd(rng), odd(rng), odd(rng), act, bias, residual);
}

TEST(Linear, OddSizesAndSingleRows) {
  std::mt19937 rng(22);
  for (int64_t M : {1, 3, 100})
    for (int64_t K : {1, 17, 129})
      check_linear(rng, M, K, M == 3 ? 1 : 65, Activation::gelu_erf, true, M == 100 ? 2 : 1);
}

TEST(Linear, RowsA2KiBMultipleApartArePaddedAndStillExact) {
  // N = 512 and 1536 f32: rows 2 KiB and 6 KiB apart, which the plain gemm kernel reads slowly;
  // Linear keeps them N + 16 apart. Every M (unpacked and packed gemm paths), post-ops, residual.
  std::mt19937 rng(29);
  for (int64_t N : {512, 1536}) {
    for (int64_t M : {1, 5, 128, 300, 600}) check_linear(rng, M, 40, N, Activation::gelu_erf, true, M % 2 ? 2 : 1);
    const Tensor w = random_tensor({24, N}, rng);
    Result<Linear> lin = Linear::create(w, Tensor(), Activation::none);
    ASSERT_TRUE(lin.ok());
    if (lin->impl_name().rfind("gemm", 0) == 0) {
      EXPECT_EQ(lin->weight_row_stride(128), N + 16) << N;
      EXPECT_EQ(lin->weight_row_stride(512), N) << N;
    }
  }
  Result<Linear> odd_n = Linear::create(random_tensor({24, 520}, rng), Tensor(), Activation::none);
  ASSERT_TRUE(odd_n.ok());
  if (odd_n->impl_name().rfind("gemm", 0) == 0) {
    EXPECT_EQ(odd_n->weight_row_stride(128), 520);
  }
}

TEST(Linear, Bf16ComputeRoundsWeightsAndInputs) {
  std::mt19937 rng(23);
  for (int emulate = 0; emulate < 2; ++emulate) {
    std::unique_ptr<onednn::ScopedBf16Emulation> scope;
    if (emulate) scope = std::make_unique<onednn::ScopedBf16Emulation>();
    for (Activation act : kActs) check_linear(rng, odd(rng), odd(rng), odd(rng), act, true, 1, DType::bf16);
    check_linear(rng, 33, 129, 17, Activation::none, true, 2, DType::bf16);
  }
  // Inputs already bf16, and bf16 weights and bias: the same numbers as f32 holding them.
  const Tensor x = random_tensor({7, 33}, rng).to(DType::bf16),
               w = random_tensor({33, 17}, rng).to(DType::bf16);
  const Tensor b = random_tensor({17}, rng).to(DType::bf16);
  Result<Linear> lb = Linear::create(w, b, Activation::relu, DType::bf16);
  Result<Linear> lf = Linear::create(w.to(DType::f32), b.to(DType::f32), Activation::relu, DType::f32);
  ASSERT_TRUE(lb.ok() && lf.ok());
  Tensor yb = Tensor::empty({7, 17}), yf = Tensor::empty({7, 17});
  ASSERT_TRUE(lb->forward(x, yb).ok());
  ASSERT_TRUE(lf->forward(x.to(DType::f32), yf).ok());
  EXPECT_TRUE(AllClose(yb, yf, linear_scale(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32), nullptr),
                       matmul_factor(33)));
  EXPECT_EQ(lb->compute_dtype(), DType::bf16);
}

TEST(Linear, StridedAndTransposedInputsAndWeights) {
  std::mt19937 rng(24);
  const int64_t M = 17, K = 33, N = 65;
  const Tensor w_pt = random_tensor({N, K}, rng);  // PyTorch's (out, in)
  const Tensor b = random_tensor({N}, rng);
  Result<Linear> from_view = Linear::create(w_pt.transpose(0, 1), b, Activation::gelu_tanh);
  Result<Linear> from_copy = Linear::create(w_pt.transpose(0, 1).contiguous(), b, Activation::gelu_tanh);
  ASSERT_TRUE(from_view.ok() && from_copy.ok());
  EXPECT_EQ(from_view->in_features(), K);
  EXPECT_EQ(from_view->out_features(), N);
  EXPECT_EQ(from_view->activation(), Activation::gelu_tanh);
  EXPECT_FALSE(from_view->impl_name().empty());

  const Tensor wide = random_tensor({M, K + 5}, rng);
  const Tensor x_rows = wide.slice(1, 2, K + 2);                     // row stride K + 5
  const Tensor x_cols = random_tensor({K, M}, rng).transpose(0, 1);  // no unit stride along K
  for (const Tensor& x : {x_rows, x_cols}) {
    Tensor y1 = Tensor::empty({M, N}), y2 = Tensor::empty({M, N}), want = Tensor::empty({M, N});
    ASSERT_TRUE(from_view->forward(x, y1).ok());
    ASSERT_TRUE(from_copy->forward(x.contiguous(), y2).ok());
    EXPECT_TRUE(AllEqual(y1, y2));  // same packed weights, same kernel: same bits
    ASSERT_TRUE(ref::linear(x, w_pt.transpose(0, 1), b, Activation::gelu_tanh, nullptr, want).ok());
    EXPECT_TRUE(AllClose(y1, want, linear_scale(x, w_pt.transpose(0, 1), b, nullptr), matmul_factor(K)));
  }
  // y as a column block of a wider buffer (row stride N + 3), and a transposed residual.
  Tensor y_buf = Tensor::zeros({M, N + 3});
  Tensor y = y_buf.slice(1, 0, N);
  const Tensor r = random_tensor({N, M}, rng).transpose(0, 1);
  Tensor want = Tensor::empty({M, N});
  ASSERT_TRUE(from_view->forward(x_rows, y, &r).ok());
  ASSERT_TRUE(ref::linear(x_rows, w_pt.transpose(0, 1), b, Activation::gelu_tanh, &r, want).ok());
  EXPECT_TRUE(
      AllClose(y.contiguous(), want, linear_scale(x_rows, w_pt.transpose(0, 1), b, &r), matmul_factor(K)));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = N; n < N + 3; ++n) EXPECT_EQ(y_buf.at({m, n}), 0.f);  // untouched
}

TEST(Linear, ReusesPackedWeightsAndPrimitivesAcrossM) {
  std::mt19937 rng(25);
  const int64_t K = 65, N = 33;
  const Tensor w = random_tensor({K, N}, rng), b = random_tensor({N}, rng);
  Result<Linear> lin = Linear::create(w, b, Activation::relu);
  ASSERT_TRUE(lin.ok());
  const int64_t Ms[] = {1, 3, 64, 100, 256, 129};
  const onednn::LinearStats s0 = onednn::linear_stats();
  onednn::CacheStats c_first{}, c_second{};
  for (int pass = 0; pass < 2; ++pass) {
    const onednn::CacheStats before = onednn::cache_stats();
    for (int64_t M : Ms) {
      const Tensor x = random_tensor({M, K}, rng), r = random_tensor({M, N}, rng);
      Tensor y = Tensor::empty({M, N}), want = Tensor::empty({M, N});
      ASSERT_TRUE(lin->forward(x, y, &r).ok());
      ASSERT_TRUE(ref::linear(x, w, b, Activation::relu, &r, want).ok());
      EXPECT_TRUE(AllClose(y, want, linear_scale(x, w, b, &r), matmul_factor(K))) << "M=" << M;
    }
    (pass ? c_second : c_first) = onednn::cache_stats();
    if (pass) {
      EXPECT_EQ(c_second.created, before.created) << "the second pass found every primitive";
      EXPECT_GE(c_second.hits - before.hits, 6);
    }
  }
  const onednn::LinearStats s1 = onednn::linear_stats();
  EXPECT_EQ((s1.packed_calls - s0.packed_calls) + (s1.plain_calls - s0.plain_calls), 12);
  EXPECT_LE(s1.plain_copies - s0.plain_copies, 1);
  // Plain (gemm) kernels accept the packed layout for every M: no fallback at all.
  if (lin->impl_name().rfind("gemm", 0) == 0) {
    EXPECT_EQ(s1.plain_calls - s0.plain_calls, 0);
    EXPECT_EQ(s1.plain_copies - s0.plain_copies, 0);
  }
}

TEST(Linear, FallsBackToOnePlainCopyWhenThePackedLayoutIsRefused) {
  std::mt19937 rng(26);
  const int64_t K = 33, N = 17;
  const Tensor w = random_tensor({K, N}, rng), b = random_tensor({N}, rng);
  Result<Linear> lin = [&] {
    onednn::ScopedMismatchedPacking mismatch;
    return Linear::create(w, b, Activation::gelu_erf);
  }();
  ASSERT_TRUE(lin.ok());
  const onednn::LinearStats s0 = onednn::linear_stats();
  for (int64_t M : {5, 17, 5, 1}) {
    const Tensor x = random_tensor({M, K}, rng);
    Tensor y = Tensor::empty({M, N}), want = Tensor::empty({M, N});
    ASSERT_TRUE(lin->forward(x, y).ok());
    ASSERT_TRUE(ref::linear(x, w, b, Activation::gelu_erf, nullptr, want).ok());
    EXPECT_TRUE(AllClose(y, want, linear_scale(x, w, b, nullptr), matmul_factor(K)));
  }
  const onednn::LinearStats s1 = onednn::linear_stats();
  EXPECT_EQ(s1.plain_calls - s0.plain_calls, 4);
  EXPECT_EQ(s1.plain_copies - s0.plain_copies, 1);
}

TEST(Linear, SharedByThreads) {
  std::mt19937 rng(27);
  const int64_t K = 65, N = 33;
  const Tensor w = random_tensor({K, N}, rng), b = random_tensor({N}, rng);
  Result<Linear> made = Linear::create(w, b, Activation::gelu_erf);
  ASSERT_TRUE(made.ok());
  const Linear lin = made.value();
  std::vector<Tensor> xs, wants;
  for (int64_t M : {1, 7, 33, 100}) {
    xs.push_back(random_tensor({M, K}, rng));
    wants.push_back(Tensor::empty({M, N}));
    ASSERT_TRUE(ref::linear(xs.back(), w, b, Activation::gelu_erf, nullptr, wants.back()).ok());
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep)
        for (size_t i = 0; i < xs.size(); ++i) {
          const size_t j = (i + static_cast<size_t>(t)) % xs.size();
          Tensor y = Tensor::empty(wants[j].shape());
          Tensor p = Tensor::empty(wants[j].shape());
          if (!lin.forward(xs[j], y).ok() || !ops::softmax(y, p).ok() ||
              !AllClose(y, wants[j], linear_scale(xs[j], w, b, nullptr), matmul_factor(K)))
            ++failures;
        }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// The tolerance is tight enough to see the bugs it is meant to catch.
TEST(Linear, ToleranceCatchesBugs) {
  std::mt19937 rng(28);
  const int64_t M = 17, K = 129, N = 33;
  const Tensor x = random_tensor({M, K}, rng), w = random_tensor({K, N}, rng);
  const Tensor b = random_tensor({N}, rng), r = random_tensor({M, N}, rng);
  Result<Linear> lin = Linear::create(w, b, Activation::gelu_erf);
  ASSERT_TRUE(lin.ok());
  Tensor y = Tensor::empty({M, N});
  ASSERT_TRUE(lin->forward(x, y, &r).ok());
  const Tensor scale = linear_scale(x, w, b, &r);
  Tensor want = Tensor::empty({M, N});
  ASSERT_TRUE(ref::linear(x, w, b, Activation::gelu_erf, &r, want).ok());
  EXPECT_TRUE(AllClose(y, want, scale, matmul_factor(K)));

  Tensor wrong = Tensor::empty({M, N});
  Tensor b2 = b.clone();
  b2.data<float>()[3] += 0.25f;  // one wrong bias entry
  ASSERT_TRUE(ref::linear(x, w, b2, Activation::gelu_erf, &r, wrong).ok());
  EXPECT_FALSE(AllClose(y, wrong, scale, matmul_factor(K)));
  ASSERT_TRUE(ref::linear(x, w, b, Activation::gelu_erf, nullptr, wrong).ok());  // residual dropped
  EXPECT_FALSE(AllClose(y, wrong, scale, matmul_factor(K)));
  Tensor x_shift = x.clone();  // off by one row
  for (int64_t m = 0; m + 1 < M; ++m)
    for (int64_t k = 0; k < K; ++k) x_shift.data<float>()[m * K + k] = x.at({m + 1, k});
  ASSERT_TRUE(ref::linear(x_shift, w, b, Activation::gelu_erf, &r, wrong).ok());
  EXPECT_FALSE(AllClose(y, wrong, scale, matmul_factor(K)));
  ASSERT_TRUE(ref::linear(x, w, b, Activation::gelu_tanh, &r, wrong).ok());  // the other GELU
  EXPECT_FALSE(AllClose(y, wrong, scale, matmul_factor(K)));
}

TEST(Linear, RefusesLikeTheReference) {
  std::mt19937 rng(29);
  const Tensor w = random_tensor({8, 4}, rng), b = random_tensor({4}, rng);
  Result<Linear> lin = Linear::create(w, b, Activation::none);
  ASSERT_TRUE(lin.ok());
  struct Case {
    Tensor x, y, r;
  };
  const Case cases[] = {
      {Tensor::empty({3, 7}), Tensor::empty({3, 4}), Tensor()},               // K mismatch
      {Tensor::empty({24}), Tensor::empty({3, 4}), Tensor()},                 // x rank 1
      {Tensor::empty({3, 8}), Tensor::empty({3, 5}), Tensor()},               // y shape
      {Tensor::empty({3, 8}), Tensor::empty({3, 4}), Tensor::empty({4, 3})},  // residual shape
      {Tensor::empty({3, 8}, DType::i32), Tensor::empty({3, 4}), Tensor()},   // x dtype
      {Tensor(), Tensor::empty({3, 4}), Tensor()},                            // x undefined
  };
  for (const Case& c : cases) {
    Tensor y1 = c.y, y2 = c.y;
    const Tensor* r = c.r.defined() ? &c.r : nullptr;
    EXPECT_TRUE(SameRefusal(lin->forward(c.x, y1, r), ref::linear(c.x, w, b, Activation::none, r, y2)));
  }
  EXPECT_EQ(Linear::create(Tensor::empty({8}), b, Activation::none).status().code(), Code::invalid_argument);
  EXPECT_EQ(Linear::create(w, Tensor::empty({5}), Activation::none).status().code(), Code::invalid_argument);
  EXPECT_EQ(Linear::create(w, b, Activation::none, DType::i32).status().code(), Code::unsupported);
  Tensor y = Tensor::empty({3, 4});
  EXPECT_EQ(Linear().forward(Tensor::empty({3, 8}), y).code(), Code::invalid_argument);
  EXPECT_FALSE(Linear().defined());
}

// ---------------------------------------------------------------------------------------------
// softmax

namespace {
// |fast - ref| <= 16 · eps · log2(2C) · (p + 1/C): relative to each probability, with a floor
// of one share of the row for the ones that round to almost nothing.
void expect_softmax_close(const Tensor& got, const Tensor& want) {
  const int64_t C = want.dim(-1);
  std::vector<float> s = want.to_vector();
  for (float& v : s) v = std::fabs(v) + 1.f / static_cast<float>(C);
  EXPECT_TRUE(AllClose(got, want, Tensor::from_vector(want.shape(), s), 16.0 * kEpsF32 * std::log2(2.0 * C)));
}
}  // namespace

TEST(Softmax, RandomShapesRanks1To4F32AndBf16) {
  std::mt19937 rng(31);
  for (int it = 0; it < 16; ++it) {
    std::vector<int64_t> dims;
    const int rank = 1 + it % 4;
    for (int i = 0; i < rank; ++i) dims.push_back(i + 1 == rank ? odd(rng) : 1 + rng() % 5);
    Tensor x = random_tensor(Shape(dims), rng, -8.f, 8.f);
    if (it % 3 == 2) x = x.to(DType::bf16);
    Tensor y = Tensor::empty(x.shape()), want = Tensor::empty(x.shape());
    ASSERT_TRUE(ops::softmax(x, y).ok());
    ASSERT_TRUE(ref::softmax(x, want).ok());
    expect_softmax_close(y, want);
  }
}

TEST(Softmax, FullyMaskedRowsAreZerosAndPartlyMaskedEntriesZero) {
  std::mt19937 rng(32);
  for (int64_t C : {1, 2, 17}) {
    const int64_t R = 300;
    Tensor x = random_tensor({R, C}, rng, -4.f, 4.f);
    float* p = x.data<float>();
    for (int64_t r = 0; r < R; ++r) {
      if (r % 4 == 0)
        for (int64_t c = 0; c < C; ++c) p[r * C + c] = -kInf;  // fully masked
      if (r % 4 == 1)
        for (int64_t c = 1 + r % C; c < C; ++c) p[r * C + c] = -kInf;  // causal: a prefix stays
      if (r % 4 == 2)
        for (int64_t c = 0; c < C; ++c)
          if (c != C / 2) p[r * C + c] = -kInf;  // both ends masked: only the middle stays
      if (r % 4 == 3 && C > 1)
        for (int64_t c = 0; c < C - 1 - r % C; ++c) p[r * C + c] = -kInf;  // left padding
    }
    Tensor y = Tensor::empty({R, C}), want = Tensor::empty({R, C});
    ASSERT_TRUE(ops::softmax(x, y).ok());
    ASSERT_TRUE(ref::softmax(x, want).ok());
    for (int64_t r = 0; r < R; ++r) {
      double sum = 0;
      for (int64_t c = 0; c < C; ++c) {
        const float v = y.at({r, c});
        ASSERT_FALSE(std::isnan(v)) << "row " << r;
        if (x.at({r, c}) == -kInf) {
          EXPECT_EQ(v, 0.f) << "row " << r << " col " << c;
        }
        sum += v;
      }
      EXPECT_NEAR(sum, r % 4 == 0 ? 0.0 : 1.0, 1e-5) << "row " << r;
    }
    expect_softmax_close(y, want);
    // In place: y is x.
    ASSERT_TRUE(ops::softmax(x, x).ok());
    EXPECT_TRUE(AllEqual(x, y));
  }
}

TEST(Softmax, LargeValuesDoNotOverflow) {
  const Tensor x = Tensor::from_vector({3, 4}, {1e4f, 1e4f - 1.f, -1e4f, 0.f,  //
                                                -1e4f, -1e4f, -1e4f, -1e4f,    //
                                                3e38f, 1e4f, -kInf, -3e38f});
  Tensor y = Tensor::empty({3, 4}), want = Tensor::empty({3, 4});
  ASSERT_TRUE(ops::softmax(x, y).ok());
  ASSERT_TRUE(ref::softmax(x, want).ok());
  for (float v : y.to_vector()) EXPECT_TRUE(std::isfinite(v));
  expect_softmax_close(y, want);
  EXPECT_NEAR(y.at({0, 0}), 1.f / (1.f + std::exp(-1.f)), 1e-6);
  EXPECT_NEAR(y.at({1, 2}), 0.25f, 1e-7);
  EXPECT_EQ(y.at({2, 0}), 1.f);
}

TEST(Softmax, StridedViews) {
  std::mt19937 rng(33);
  // (7, 33) whose entries are 7 apart: the staged path (dense copy in, copy back out).
  const Tensor x = random_tensor({33, 7}, rng).transpose(0, 1);
  Tensor y_buf = Tensor::empty({33, 7});
  Tensor y = y_buf.transpose(0, 1);
  Tensor want = Tensor::empty({7, 33});
  ASSERT_TRUE(ops::softmax(x, y).ok());
  ASSERT_TRUE(ref::softmax(x, want).ok());
  expect_softmax_close(y.contiguous(), want);
}

// ---------------------------------------------------------------------------------------------
// layer_norm

namespace {
// Errors scale with what each output is made of: |gamma|·(|x̂| + max|x|/σ) + |beta|, the second
// term being the cancellation in x - mean; eps · log2(2C) for the two row sums.
void check_layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, bool in_place) {
  SCOPED_TRACE(x.describe() + (in_place ? " in place" : ""));
  const std::vector<float> xs = x.to_vector();  // before an in-place call overwrites x
  Tensor want = Tensor::empty(x.shape());
  ASSERT_TRUE(ref::layer_norm(x, gamma, beta, eps, want).ok());
  Tensor y = in_place ? x : Tensor::empty(x.shape());  // in place only for f32 x
  ASSERT_TRUE(ops::layer_norm(x, gamma, beta, eps, y).ok());
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const std::vector<float> g = gamma.to_vector(), b = beta.to_vector();
  std::vector<float> s(xs.size());
  for (int64_t r = 0; r < R; ++r) {
    double mean = 0, var = 0, mx = 0;
    for (int64_t c = 0; c < C; ++c) mean += xs[r * C + c];
    mean /= C;
    for (int64_t c = 0; c < C; ++c) {
      var += (xs[r * C + c] - mean) * (xs[r * C + c] - mean);
      mx = std::max(mx, std::fabs(static_cast<double>(xs[r * C + c])));
    }
    const double sigma = std::sqrt(var / C + eps);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xs[r * C + c] - mean) / sigma;
      s[r * C + c] = static_cast<float>(std::fabs(g[c]) * (std::fabs(xhat) + mx / sigma) + std::fabs(b[c]));
    }
  }
  EXPECT_TRUE(AllClose(y, want, Tensor::from_vector(x.shape(), s), 16.0 * kEpsF32 * std::log2(2.0 * C)));
}
}  // namespace

TEST(LayerNorm, RandomShapesF32Bf16AndInPlace) {
  std::mt19937 rng(41);
  for (int it = 0; it < 12; ++it) {
    const int64_t C = odd(rng);
    std::vector<int64_t> dims = {1 + static_cast<int64_t>(rng() % 4)};
    if (it % 2) dims.insert(dims.begin(), 2);
    dims.push_back(C);
    Tensor x = random_tensor(Shape(dims), rng, -3.f, 5.f);
    Tensor g = random_tensor({C}, rng, 0.5f, 1.5f), b = random_tensor({C}, rng);
    if (it % 4 == 3) {
      x = x.to(DType::bf16);
      g = g.to(DType::bf16);
    }
    check_layer_norm(x, g, b, it % 2 ? 1e-5f : 1e-12f, x.dtype() == DType::f32 && it % 3 == 0);
  }
}

// A constant row has mean = its value and variance 0: it must give exactly beta, also with
// BERT's eps = 1e-12 (where any rounding left in x - mean would be multiplied by 1e6), in place,
// and among ordinary rows.
TEST(LayerNorm, ConstantRowStaysFiniteAndEqualsBeta) {
  const int64_t C = 768, R = 4;
  std::mt19937 rng(42);
  const Tensor g = random_tensor({C}, rng, 0.5f, 2.f), b = random_tensor({C}, rng);
  for (float eps : {1e-5f, 1e-12f})
    for (float v : {0.f, 1.f, -2.5f, 3.14159f, 1000.f, 1e-20f}) {
      Tensor x = random_tensor({R, C}, rng);
      for (int64_t r : {0, 2})
        for (int64_t c = 0; c < C; ++c) x.data<float>()[r * C + c] = v;
      Tensor want = Tensor::empty({R, C});
      ASSERT_TRUE(ref::layer_norm(x, g, b, eps, want).ok());
      Tensor y = Tensor::empty({R, C});
      ASSERT_TRUE(ops::layer_norm(x, g, b, eps, y).ok());
      ASSERT_TRUE(ops::layer_norm(x, g, b, eps, x).ok());  // in place
      for (const Tensor& out : {y, x})
        for (int64_t r : {0, 2})
          for (int64_t c = 0; c < C; ++c) {
            ASSERT_TRUE(std::isfinite(out.at({r, c})));
            ASSERT_EQ(out.at({r, c}), b.at({c})) << "value " << v << " eps " << eps << " col " << c;
            ASSERT_EQ(want.at({r, c}), b.at({c}));
          }
      EXPECT_TRUE(AllEqual(y, x));
    }
  // C = 1: every row is constant.
  const Tensor x1 = random_tensor({5, 1}, rng), g1 = Tensor::full({1}, 2.f), b1 = Tensor::full({1}, 0.25f);
  Tensor y1 = Tensor::empty({5, 1});
  ASSERT_TRUE(ops::layer_norm(x1, g1, b1, 1e-5f, y1).ok());
  EXPECT_TRUE(AllEqual(y1, Tensor::full({5, 1}, 0.25f)));
}

// Rows of huge values (hostile inputs, ±1e19 into a post-LN model): oneDNN's f32 Σ(x - mean)²
// overflows to inf and the row came out as beta, finite and wrong. The fast op must match the
// reference (double statistics), in place too, also among ordinary rows and at a wide C, and so
// must layer_norm_train's mean and rstd.
TEST(LayerNorm, HugeRowsMatchTheReference) {
  std::mt19937 rng(43);
  for (const int64_t C : {3, 768}) {
    for (const float scale : {1e19f, 1e30f, 3e37f}) {
      SCOPED_TRACE("C " + std::to_string(C) + " scale " + std::to_string(scale));
      const int64_t R = 5;
      Tensor x = random_tensor({R, C}, rng);
      for (int64_t r : {1, 3})
        for (int64_t c = 0; c < C; ++c) x.data<float>()[r * C + c] *= (r == 1 ? scale : -scale);
      const Tensor g = random_tensor({C}, rng, 0.5f, 1.5f), b = random_tensor({C}, rng);
      Tensor want = Tensor::empty({R, C});
      ASSERT_TRUE(ref::layer_norm(x, g, b, 1e-5f, want).ok());
      Tensor y = Tensor::empty({R, C});
      ASSERT_TRUE(ops::layer_norm(x, g, b, 1e-5f, y).ok());
      EXPECT_LT(testing_util::max_rel_error(y, want), 1e-5);
      for (float v : y.to_vector()) ASSERT_TRUE(std::isfinite(v));
      Tensor in_place = x.clone();
      ASSERT_TRUE(ops::layer_norm(in_place, g, b, 1e-5f, in_place).ok());
      EXPECT_TRUE(AllEqual(in_place, y));

      Tensor ty = Tensor::empty({R, C}), mean = Tensor::empty({R}), rstd = Tensor::empty({R});
      Tensor wy = Tensor::empty({R, C}), wmean = Tensor::empty({R}), wrstd = Tensor::empty({R});
      ASSERT_TRUE(ops::layer_norm_train(x, g, b, 1e-5f, ty, mean, rstd).ok());
      ASSERT_TRUE(ref::layer_norm_train(x, g, b, 1e-5f, wy, wmean, wrstd).ok());
      EXPECT_LT(testing_util::max_rel_error(ty, wy), 1e-5);
      EXPECT_LT(testing_util::max_rel_error(mean, wmean), 1e-5);
      for (int64_t r = 0; r < R; ++r)
        EXPECT_NEAR(rstd.at({r}) / wrstd.at({r}), 1.0, 1e-5) << "row " << r;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// embedding, add, activation, heads

TEST(Embedding, GathersRowsF32Bf16AndStridedTables) {
  std::mt19937 rng(51);
  const int64_t V = 17, C = 33;
  std::vector<int32_t> idv(21);
  for (int32_t& i : idv) i = static_cast<int32_t>(rng() % V);
  const Tensor ids = Tensor::from_ids({3, 7}, idv);
  const Tensor table = random_tensor({V, C}, rng);
  for (const Tensor& t : {table, table.to(DType::bf16), random_tensor({C, V}, rng).transpose(0, 1)}) {
    Tensor y = Tensor::empty({3, 7, C}), want = Tensor::empty({3, 7, C});
    ASSERT_TRUE(ops::embedding(t, ids, y).ok());
    ASSERT_TRUE(ref::embedding(t, ids, want).ok());
    EXPECT_TRUE(AllEqual(y, want));
  }
  // Many rows: the parallel copy.
  std::vector<int32_t> many(2000);
  for (int32_t& i : many) i = static_cast<int32_t>(rng() % V);
  Tensor y = Tensor::empty({2000, C}), want = Tensor::empty({2000, C});
  ASSERT_TRUE(ops::embedding(table, Tensor::from_ids({2000}, many), y).ok());
  ASSERT_TRUE(ref::embedding(table, Tensor::from_ids({2000}, many), want).ok());
  EXPECT_TRUE(AllEqual(y, want));
}

TEST(Embedding, OutOfRangeIdNamesPositionAndId) {
  const Tensor table = Tensor::zeros({17, 4});
  for (int32_t bad : {17, -1, 1000}) {
    const Tensor ids = Tensor::from_ids({4}, {1, 2, bad, 3});
    Tensor y = Tensor::empty({4, 4}), y2 = Tensor::empty({4, 4});
    const Status st = ops::embedding(table, ids, y);
    EXPECT_EQ(st.code(), Code::out_of_range);
    EXPECT_NE(st.message().find("token id " + std::to_string(bad) + " at position 2"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("[0, 17)"), std::string::npos) << st.message();
    EXPECT_TRUE(SameRefusal(st, ref::embedding(table, ids, y2)));
  }
}

TEST(Add, SameShapeSuffixBroadcastInPlaceAndBf16) {
  std::mt19937 rng(52);
  const int64_t B = 3, T = 17, C = 65;
  const Tensor a = random_tensor({B, T, C}, rng);
  for (const Shape& bs : {Shape{B, T, C}, Shape{T, C}, Shape{C}, Shape{}}) {
    const Tensor b = random_tensor(bs, rng);
    Tensor y = Tensor::empty(a.shape()), want = Tensor::empty(a.shape());
    ASSERT_TRUE(ops::add(a, b, y).ok()) << bs.str();
    ASSERT_TRUE(ref::add(a, b, want).ok());
    EXPECT_TRUE(AllEqual(y, want)) << bs.str();
    Tensor in_place = a.clone();
    ASSERT_TRUE(ops::add(in_place, b, in_place).ok());
    EXPECT_TRUE(AllEqual(in_place, want)) << bs.str();
    Tensor yb = Tensor::empty(a.shape());
    ASSERT_TRUE(ops::add(a, b.to(DType::bf16), yb).ok());
    ASSERT_TRUE(ref::add(a, b.to(DType::bf16), want).ok());
    EXPECT_TRUE(AllEqual(yb, want)) << bs.str();
  }
  // Big enough for the parallel loops; a strided a.
  const Tensor big = random_tensor({40, 64, 65}, rng), row = random_tensor({65}, rng);
  Tensor y = Tensor::empty(big.shape()), want = Tensor::empty(big.shape());
  ASSERT_TRUE(ops::add(big, row, y).ok());
  ASSERT_TRUE(ref::add(big, row, want).ok());
  EXPECT_TRUE(AllEqual(y, want));
  const Tensor at = random_tensor({C, T}, rng).transpose(0, 1);
  Tensor y2 = Tensor::empty({T, C}), want2 = Tensor::empty({T, C});
  ASSERT_TRUE(ops::add(at, row, y2).ok());
  ASSERT_TRUE(ref::add(at, row, want2).ok());
  EXPECT_TRUE(AllEqual(y2, want2));
}

TEST(Activation, EveryKindInPlaceAndStrided) {
  std::mt19937 rng(53);
  for (Activation act : kActs) {
    const Tensor x = random_tensor({7, 129}, rng, -6.f, 6.f);
    Tensor y = Tensor::empty(x.shape()), want = Tensor::empty(x.shape());
    ASSERT_TRUE(ops::activation(act, x, y).ok());
    ASSERT_TRUE(ref::activation(act, x, want).ok());
    // A few ulps of |x| (oneDNN's erf/tanh are polynomial approximations).
    EXPECT_TRUE(AllClose(y, want, abs_of(x), 16.0 * kEpsF32, 1e-30)) << activation_name(act);
    Tensor in_place = x.clone();
    ASSERT_TRUE(ops::activation(act, in_place, in_place).ok());
    EXPECT_TRUE(AllEqual(in_place, y)) << activation_name(act);
    const Tensor xt = x.transpose(0, 1);
    Tensor yt = Tensor::empty(xt.shape()), want_t = Tensor::empty(xt.shape());
    ASSERT_TRUE(ops::activation(act, xt.to(DType::bf16), yt).ok());
    ASSERT_TRUE(ref::activation(act, xt.to(DType::bf16), want_t).ok());
    EXPECT_TRUE(AllClose(yt, want_t, abs_of(xt), 16.0 * kEpsF32, 1e-30)) << activation_name(act);
  }
}

TEST(Heads, SplitMergeMatchReferenceAndRoundTrip) {
  std::mt19937 rng(54);
  for (auto [B, T, H, D] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 7, 3, 4},
                            {1, 1, 1, 1},
                            {3, 17, 4, 33},
                            {1, 100, 12, 1}}) {
    const Tensor x = random_tensor({B, T, H * D}, rng);
    Tensor heads = Tensor::empty({B, H, T, D}), want = Tensor::empty({B, H, T, D});
    ASSERT_TRUE(ops::split_heads(x, H, heads).ok());
    ASSERT_TRUE(ref::split_heads(x, H, want).ok());
    EXPECT_TRUE(AllEqual(heads, want));
    Tensor back = Tensor::empty({B, T, H * D}), want_back = Tensor::empty({B, T, H * D});
    ASSERT_TRUE(ops::merge_heads(heads, back).ok());
    ASSERT_TRUE(ref::merge_heads(heads, want_back).ok());
    EXPECT_TRUE(AllEqual(back, want_back));
    EXPECT_TRUE(AllEqual(back, x));
  }
  // Strided input (a column block of a wider buffer), bf16 input, strided output.
  const int64_t B = 2, T = 5, H = 3, D = 4;
  const Tensor wide = random_tensor({B, T, H * D + 6}, rng);
  const Tensor x = wide.slice(2, 3, 3 + H * D);
  Tensor heads = Tensor::empty({B, H, T, D}), want = Tensor::empty({B, H, T, D});
  ASSERT_TRUE(ops::split_heads(x.to(DType::bf16), H, heads).ok());
  ASSERT_TRUE(ref::split_heads(x.to(DType::bf16), H, want).ok());
  EXPECT_TRUE(AllEqual(heads, want));
  Tensor out_buf = Tensor::zeros({T, B, H * D});
  Tensor out = out_buf.transpose(0, 1);  // (B, T, H·D) with strides (H·D, B·H·D, 1)
  ASSERT_TRUE(ops::merge_heads(heads, out).ok());
  EXPECT_TRUE(AllEqual(out.contiguous(), x.to(DType::bf16).to(DType::f32)));
}

// ---------------------------------------------------------------------------------------------
// The primitive cache

TEST(PrimitiveCache, CreatesOncePerShapeAndReusesAfter) {
  std::mt19937 rng(61);
  // Shapes no other test uses, so the first call here is the first anywhere.
  const Tensor x = random_tensor({11, 997}, rng), x2 = random_tensor({13, 997}, rng);
  Tensor y = Tensor::empty(x.shape()), y2 = Tensor::empty(x2.shape());
  const onednn::CacheStats s0 = onednn::cache_stats();
  ASSERT_TRUE(ops::softmax(x, y).ok());
  const onednn::CacheStats s1 = onednn::cache_stats();
  EXPECT_EQ(s1.created - s0.created, 1);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(ops::softmax(x, y).ok());
  const onednn::CacheStats s2 = onednn::cache_stats();
  EXPECT_EQ(s2.created, s1.created);
  EXPECT_EQ(s2.hits - s1.hits, 5);
  ASSERT_TRUE(ops::softmax(x2, y2).ok());  // another shape: another primitive
  EXPECT_EQ(onednn::cache_stats().created - s2.created, 1);

  // Batched products run a matmul primitive (2-D f32 ones run sgemm, below).
  const Tensor a = random_tensor({2, 5, 997}, rng), b = random_tensor({2, 997, 3}, rng);
  Tensor c = Tensor::empty({2, 5, 3});
  const onednn::CacheStats m0 = onednn::cache_stats();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ops::matmul(a, b, c, 0.5f).ok());
  EXPECT_EQ(onednn::cache_stats().created - m0.created, 1);
  ASSERT_TRUE(ops::matmul(a, b, c, 0.25f).ok());  // alpha is part of the key
  EXPECT_EQ(onednn::cache_stats().created - m0.created, 2);
  EXPECT_GE(onednn::cache_stats().entries, 4);

  // A 2-D f32 product, plain or transposed operands: sgemm, no primitive.
  const Tensor a2 = random_tensor({5, 997}, rng), b2t = random_tensor({3, 997}, rng);
  Tensor c2 = Tensor::empty({5, 3}), want = Tensor::empty({5, 3});
  const onednn::CacheStats g0 = onednn::cache_stats();
  ASSERT_TRUE(ops::matmul(a2, b2t.transpose(0, 1), c2, 0.5f).ok());
  const onednn::CacheStats g1 = onednn::cache_stats();
  EXPECT_EQ(g1.created + g1.hits, g0.created + g0.hits);
  EXPECT_EQ(g1.sgemm_calls - g0.sgemm_calls, 1);
  ASSERT_TRUE(ref::matmul(a2, b2t.transpose(0, 1), want, 0.5f).ok());
  Tensor scale = Tensor::empty({5, 3});
  ASSERT_TRUE(ref::matmul(abs_of(a2), abs_of(b2t).transpose(0, 1), scale, 0.5f).ok());
  EXPECT_TRUE(AllClose(c2, want, scale, matmul_factor(997)));
}

// ---------------------------------------------------------------------------------------------
// Refusals

TEST(Ops, RefuseBadShapesWithTheReferenceMessages) {
  const Tensor t23 = Tensor::empty({2, 3}), t33 = Tensor::empty({3, 3}), t34 = Tensor::empty({3, 4});
  const Tensor i23 = Tensor::empty({2, 3}, DType::i32), undefined;
  auto both = [](auto fast, auto ref) { return SameRefusal(fast(), ref()); };
  Tensor o1, o2;
  // matmul
  for (auto [a, b, c] :
       {std::tuple<Tensor, Tensor, Tensor>{t23, t23, t33},
        {t23, t34, t23},
        {Tensor::empty({2}), Tensor::empty({2}), Tensor::empty({1})},
        {Tensor::empty({2, 2, 2, 2, 2}), Tensor::empty({2, 2, 2, 2, 2}), Tensor::empty({2, 2, 2, 2, 2})},
        {t23, t34, Tensor::empty({2, 4}, DType::bf16)},
        {i23, t34, Tensor::empty({2, 4})},
        {Tensor::empty({2, 2, 3}), Tensor::empty({3, 3, 4}), Tensor::empty({2, 2, 4})}}) {
    o1 = c;
    o2 = c;
    EXPECT_TRUE(both([&] { return ops::matmul(a, b, o1); }, [&] { return ref::matmul(a, b, o2); }));
  }
  // softmax
  o1 = t33;
  o2 = t33;
  EXPECT_TRUE(both([&] { return ops::softmax(t23, o1); }, [&] { return ref::softmax(t23, o2); }));
  EXPECT_TRUE(both([&] { return ops::softmax(undefined, o1); }, [&] { return ref::softmax(undefined, o2); }));
  EXPECT_TRUE(both([&] { return ops::softmax(i23, o1); }, [&] { return ref::softmax(i23, o2); }));
  Tensor s1 = Tensor::empty({}), s2 = Tensor::empty({});
  EXPECT_TRUE(both([&] { return ops::softmax(Tensor::empty({}), s1); },
                   [&] { return ref::softmax(Tensor::empty({}), s2); }));
  // layer_norm
  const Tensor g3 = Tensor::full({3}, 1.f), b3 = Tensor::zeros({3}), g4 = Tensor::full({4}, 1.f);
  for (auto [x, g, b, eps, y] :
       {std::tuple<Tensor, Tensor, Tensor, float, Tensor>{t23, g4, b3, 1e-5f, t23},
        {t23, g3, b3, 0.f, t23},
        {t23, g3, b3, 1e-5f, t33},
        {Tensor::empty({2, 0}), Tensor::empty({0}), Tensor::empty({0}), 1e-5f, Tensor::empty({2, 0})},
        {t23, i23.select(0, 0), b3, 1e-5f, t23}}) {
    o1 = y;
    o2 = y;
    EXPECT_TRUE(both([&] { return ops::layer_norm(x, g, b, eps, o1); },
                     [&] { return ref::layer_norm(x, g, b, eps, o2); }));
  }
  // embedding
  const Tensor table = Tensor::zeros({5, 3});
  for (auto [tab, ids, y] :
       {std::tuple<Tensor, Tensor, Tensor>{table, Tensor::from_ids({2}, {0, 1}), t23.transpose(0, 1)},
        {table, Tensor::from_ids({2}, {0, 1}), t34},
        {table, Tensor::empty({2}, DType::i64), t23},
        {table.select(0, 0), Tensor::from_ids({2}, {0, 1}), t23},
        {table, Tensor::from_ids({2}, {0, 1}), Tensor::empty({2, 3}, DType::bf16)}}) {
    o1 = y;
    o2 = y;
    EXPECT_TRUE(
        both([&] { return ops::embedding(tab, ids, o1); }, [&] { return ref::embedding(tab, ids, o2); }));
  }
  // add
  for (auto [a, b, y] : {std::tuple<Tensor, Tensor, Tensor>{t23, t34, t23},
                         {t23, Tensor::empty({2}), t23},
                         {t23, t23, t33},
                         {t23, Tensor::empty({1, 2, 3, 4}), t23},
                         {t23, i23, t23}}) {
    o1 = y;
    o2 = y;
    EXPECT_TRUE(both([&] { return ops::add(a, b, o1); }, [&] { return ref::add(a, b, o2); }));
  }
  // activation
  o1 = t33;
  o2 = t33;
  EXPECT_TRUE(both([&] { return ops::activation(Activation::relu, t23, o1); },
                   [&] { return ref::activation(Activation::relu, t23, o2); }));
  // split_heads, merge_heads
  const Tensor x3 = Tensor::empty({2, 5, 12});
  for (auto [n_heads, y] : {std::pair<int64_t, Tensor>{5, Tensor::empty({2, 5, 5, 2})},
                            {0, Tensor::empty({2, 5, 5, 2})},
                            {3, Tensor::empty({2, 3, 5, 5})},
                            {3, Tensor::empty({2, 5, 3, 4})}}) {
    o1 = y;
    o2 = y;
    EXPECT_TRUE(both([&] { return ops::split_heads(x3, n_heads, o1); },
                     [&] { return ref::split_heads(x3, n_heads, o2); }));
  }
  EXPECT_TRUE(
      both([&] { return ops::split_heads(t23, 1, o1); }, [&] { return ref::split_heads(t23, 1, o2); }));
  for (auto [x, y] : {std::pair<Tensor, Tensor>{Tensor::empty({2, 3, 5, 4}), Tensor::empty({2, 5, 11})},
                      {x3, Tensor::empty({2, 5, 12})},
                      {Tensor::empty({2, 3, 5, 4}), Tensor::empty({2, 3, 20})}}) {
    o1 = y;
    o2 = y;
    EXPECT_TRUE(both([&] { return ops::merge_heads(x, o1); }, [&] { return ref::merge_heads(x, o2); }));
  }
}
