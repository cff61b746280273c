// The bf16 weight-streaming GEMV (kernels/gemv_bf16.cpp) that Linear runs for few rows when the
// compute dtype is bf16 and oneDNN has no bf16 kernels: against ref::linear on bf16-rounded
// inputs and weights over random odd shapes, every post-op, residuals separate and aliased, both
// instruction-set paths; Linear's dispatch at the threshold's edges; the same refusals as before;
// and a tiny bf16 causal LM whose KV-cache decode through the GEMV gives the logits of the
// emulated oneDNN path and of the reference loops. No timing.
//
// Tolerance: |fast - ref| <= 1e-5 · S, S = Σ_k |x_mk|·|w_kn| + |b_n| + |r_mn|, element by element.
// Both sides see the same bf16-rounded values and accumulate in f32 (the reference in double),
// so the only difference is the f32 rounding of a K-term sum, far below 1e-5 · S for these K.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dnnl/engine.h"        // core/src: Linear counters and test switches
#include "kernels/gemv_bf16.h"  // core/src: the kernel, its ISA switch
#include "tessera/generate.h"
#include "tessera/model.h"
#include "tessera/ops.h"
#include "test_util.h"

using namespace tessera;

namespace {

constexpr double kRel = 1e-5;
const Activation kActs[] = {Activation::none, Activation::relu, Activation::gelu_erf, Activation::gelu_tanh};

using testing_util::random_tensor;

Tensor bf16_rounded(const Tensor& t) { return t.to(DType::bf16).to(DType::f32); }

// S = Σ_k |x|·|w| + |b| + |r|.
Tensor scale_of(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor* r) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  const Tensor xc = x.to(DType::f32).contiguous(), wc = w.to(DType::f32).contiguous();
  std::vector<float> s(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += std::fabs(xc.data<float>()[m * K + k] * wc.data<float>()[k * N + n]);
      if (b.defined()) acc += std::fabs(b.at({n}));
      if (r) acc += std::fabs(r->at({m, n}));
      s[static_cast<size_t>(m * N + n)] = static_cast<float>(acc);
    }
  return Tensor::from_vector({M, N}, s);
}

::testing::AssertionResult AllClose(const Tensor& got, const Tensor& want, const Tensor& scale, double factor) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shapes " << got.shape().str() << " vs " << want.shape().str();
  const std::vector<float> g = got.to_vector(), w = want.to_vector(), s = scale.to_vector();
  int bad = 0;
  std::string msg;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    if (!(err <= factor * s[i])) {
      if (++bad <= 5)
        msg += "\n  [" + std::to_string(i) + "] got " + std::to_string(g[i]) + " want " + std::to_string(w[i]) +
               " err " + std::to_string(err) + " tol " + std::to_string(factor * s[i]);
    }
  }
  if (bad) return ::testing::AssertionFailure() << bad << " of " << g.size() << " elements differ:" << msg;
  return ::testing::AssertionSuccess();
}

// A bf16 layer that has the GEMV on every machine (on one with native bf16 kernels, only the
// emulation switch gives it one).
Linear bf16_layer(const Tensor& w, const Tensor& b, Activation act) {
  onednn::ScopedBf16Emulation emulate;
  Result<Linear> lin = Linear::create(w, b, act, DType::bf16);
  EXPECT_TRUE(lin.ok()) << lin.status().message();
  return lin.ok() ? std::move(lin).value() : Linear();
}

// One case: Linear (through the GEMV when M <= the threshold) against ref::linear on the rounded
// values. residual_mode: 0 none, 1 a separate r, 2 y is r.
void check_case(std::mt19937& rng, int64_t M, int64_t K, int64_t N, Activation act, bool bias, int residual_mode) {
  SCOPED_TRACE("M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) + " act=" +
               activation_name(act) + " bias=" + std::to_string(bias) + " residual=" + std::to_string(residual_mode) +
               " isa=" + kernels::gemv_isa());
  const Tensor x = random_tensor({M, K}, rng), w = random_tensor({K, N}, rng);
  const Tensor b = bias ? random_tensor({N}, rng) : Tensor();
  const Tensor r = random_tensor({M, N}, rng);
  const Linear lin = bf16_layer(w, b, act);
  ASSERT_TRUE(lin.defined());
  Tensor y = residual_mode == 2 ? r.clone() : Tensor::full({M, N}, 3.f);
  const Tensor* res = residual_mode == 1 ? &r : residual_mode == 2 ? &y : nullptr;
  const onednn::LinearStats s0 = onednn::linear_stats();
  const Status st = lin.forward(x, y, res);
  ASSERT_TRUE(st.ok()) << st.message();
  const bool gemv = M <= Linear::gemv_max_rows();
  EXPECT_EQ(onednn::linear_stats().gemv_calls - s0.gemv_calls, gemv ? 1 : 0);
  EXPECT_EQ(lin.impl_name(M).rfind("gemv_bf16:", 0) == 0, gemv) << lin.impl_name(M);
  const Tensor xr = bf16_rounded(x), wr = bf16_rounded(w);
  const Tensor* rr = residual_mode ? &r : nullptr;
  Tensor want = Tensor::empty({M, N});
  ASSERT_TRUE(ref::linear(xr, wr, b, act, rr, want).ok());
  EXPECT_TRUE(AllClose(y, want, scale_of(xr, wr, b, rr), kRel));
}

// Shapes that are not multiples of the 16-column block, and K past the kernel's 512-row tiles.
const int64_t kKs[] = {1, 3, 17, 33, 100, 129, 515, 1031};
const int64_t kNs[] = {1, 5, 15, 17, 33, 47, 100, 131};

template <class T, size_t n>
T pick(const T (&a)[n], std::mt19937& rng) {
  return a[rng() % n];
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The GEMV against the reference

TEST(GemvBf16, RandomShapesEveryPostOpBothPaths) {
  std::mt19937 rng(101);
  const bool avx2 = std::string(kernels::gemv_isa()) == "avx2";
  for (int generic = 0; generic < 2; ++generic) {
    if (!generic && !avx2) continue;  // this CPU has only the portable path
    std::unique_ptr<kernels::ScopedGemvGeneric> force;
    if (generic) force = std::make_unique<kernels::ScopedGemvGeneric>();
    EXPECT_EQ(std::string(kernels::gemv_isa()), generic ? "generic" : "avx2");
    for (int64_t M = 1; M <= 9; ++M)
      for (Activation act : kActs)
        for (int residual = 0; residual < 3; ++residual)
          check_case(rng, M, pick(kKs, rng), pick(kNs, rng), act, (M + residual) % 2 == 0, residual);
  }
}

TEST(GemvBf16, ThresholdEdgesAndManyRowTiles) {
  std::mt19937 rng(102);
  const int64_t T = Linear::gemv_max_rows();
  ASSERT_GE(T, 1);
  for (int64_t M : {T - 1, T, T + 1})
    if (M >= 1) check_case(rng, M, 1031, 47, Activation::gelu_tanh, true, 2);
  // The kernel itself takes up to kGemvMaxRows rows: several row tiles sharing each block.
  for (int generic = 0; generic < 2; ++generic) {
    std::unique_ptr<kernels::ScopedGemvGeneric> force;
    if (generic) force = std::make_unique<kernels::ScopedGemvGeneric>();
    for (int64_t M : {int64_t{7}, int64_t{13}, kernels::kGemvMaxRows}) {
      SCOPED_TRACE("kernel M=" + std::to_string(M) + " isa=" + kernels::gemv_isa());
      const int64_t K = 1031, N = 33;
      const Tensor x = bf16_rounded(random_tensor({M, K}, rng)), w = random_tensor({K, N}, rng);
      const Tensor b = random_tensor({N}, rng), r = random_tensor({M, N}, rng);
      const kernels::GemvWeights g = kernels::gemv_pack_bf16(w.data<float>(), K, N);
      EXPECT_EQ(g.bytes(), 3 * K * 16 * 2);  // 3 blocks of 16 columns, bf16
      Tensor y = Tensor::empty({M, N});
      kernels::GemvArgs a;
      a.M = M;
      a.x = x.data<float>();
      a.ldx = K;
      a.bias = b.data<float>();
      a.act = Activation::gelu_erf;
      a.res = r.data<float>();
      a.ldr = N;
      a.y = y.data<float>();
      a.ldy = N;
      kernels::gemv_bf16(g, a);
      Tensor want = Tensor::empty({M, N});
      const Tensor wr = bf16_rounded(w);
      ASSERT_TRUE(ref::linear(x, wr, b, Activation::gelu_erf, &r, want).ok());
      EXPECT_TRUE(AllClose(y, want, scale_of(x, wr, b, &r), kRel));
    }
  }
}

// The AVX2 and the portable path give the same numbers up to f32 summation order.
TEST(GemvBf16, AvxAndPortablePathsAgree) {
  if (std::string(kernels::gemv_isa()) != "avx2") GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  std::mt19937 rng(103);
  const int64_t K = 770, N = 2053;  // wide enough to run on several threads
  const Tensor w = random_tensor({K, N}, rng), b = random_tensor({N}, rng);
  const Linear lin = bf16_layer(w, b, Activation::gelu_tanh);
  for (int64_t M : {1, 2, 5, 8}) {
    const Tensor x = random_tensor({M, K}, rng);
    Tensor fast = Tensor::empty({M, N}), portable = Tensor::empty({M, N});
    EXPECT_EQ(lin.impl_name(M), "gemv_bf16:avx2");
    ASSERT_TRUE(lin.forward(x, fast).ok());
    {
      kernels::ScopedGemvGeneric force;
      EXPECT_EQ(lin.impl_name(M), "gemv_bf16:generic");
      ASSERT_TRUE(lin.forward(x, portable).ok());
    }
    const Tensor xr = bf16_rounded(x), wr = bf16_rounded(w);
    EXPECT_TRUE(AllClose(fast, portable, scale_of(xr, wr, b, nullptr), kRel)) << "M=" << M;
    Tensor want = Tensor::empty({M, N});
    ASSERT_TRUE(ref::linear(xr, wr, b, Activation::gelu_tanh, nullptr, want).ok());
    EXPECT_TRUE(AllClose(fast, want, scale_of(xr, wr, b, nullptr), kRel)) << "M=" << M;
  }
}

// Strided views on every side: a transposed (PyTorch-style) weight, x with a row stride, y a
// column block of a wider buffer, a transposed residual, bf16 x, and r overlapping y unaligned.
TEST(GemvBf16, StridedViewsAndBf16Inputs) {
  std::mt19937 rng(104);
  const int64_t M = 3, K = 33, N = 47;
  const Tensor w_pt = random_tensor({N, K}, rng), b = random_tensor({N}, rng);
  const Linear lin = bf16_layer(w_pt.transpose(0, 1), b, Activation::relu);
  ASSERT_EQ(lin.impl_name(M).rfind("gemv_bf16:", 0), 0u);
  const Tensor wr = bf16_rounded(w_pt.transpose(0, 1).contiguous());
  const Tensor x = random_tensor({M, K + 4}, rng).slice(1, 1, K + 1);
  const Tensor r = random_tensor({N, M}, rng).transpose(0, 1);
  Tensor y_buf = Tensor::zeros({M, N + 3});
  Tensor y = y_buf.slice(1, 0, N);
  ASSERT_TRUE(lin.forward(x, y, &r).ok());
  Tensor want = Tensor::empty({M, N});
  ASSERT_TRUE(ref::linear(bf16_rounded(x.contiguous()), wr, b, Activation::relu, &r, want).ok());
  EXPECT_TRUE(AllClose(y.contiguous(), want, scale_of(bf16_rounded(x.contiguous()), wr, b, &r), kRel));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = N; n < N + 3; ++n) EXPECT_EQ(y_buf.at({m, n}), 0.f);
  // x already bf16: the same numbers as its f32 copy.
  const Tensor xb = random_tensor({M, K}, rng).to(DType::bf16);
  Tensor y1 = Tensor::empty({M, N}), y2 = Tensor::empty({M, N});
  ASSERT_TRUE(lin.forward(xb, y1).ok());
  ASSERT_TRUE(lin.forward(xb.to(DType::f32), y2).ok());
  EXPECT_TRUE(AllClose(y1, y2, Tensor::zeros({M, N}), 0.0));
  // r a shifted view of y's own buffer (overlapping, not the same view): r is read before y is written.
  Tensor buf = random_tensor({1, N + 1}, rng);
  const Tensor r_shift = buf.slice(1, 1, N + 1).clone();
  Tensor y_view = buf.slice(1, 0, N);
  const Tensor r_view = buf.slice(1, 1, N + 1);
  const Tensor x1 = random_tensor({1, K}, rng);
  ASSERT_TRUE(lin.forward(x1, y_view, &r_view).ok());
  Tensor want1 = Tensor::empty({1, N});
  ASSERT_TRUE(ref::linear(bf16_rounded(x1), wr, b, Activation::relu, &r_shift, want1).ok());
  EXPECT_TRUE(AllClose(y_view.contiguous(), want1, scale_of(bf16_rounded(x1), wr, b, &r_shift), kRel));
}

// Which path runs: the GEMV only for bf16 layers without native kernels and few rows; f32
// layers and layers made with the switch off keep oneDNN.
TEST(GemvBf16, DispatchOnlyWhereItShould) {
  std::mt19937 rng(105);
  const Tensor w = random_tensor({65, 33}, rng), b = random_tensor({33}, rng);
  Result<Linear> f32 = Linear::create(w, b, Activation::none, DType::f32);
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ(f32->impl_name(1), f32->impl_name());
  EXPECT_EQ(f32->impl_name(1).rfind("gemv", 0), std::string::npos);
  const Linear bf = bf16_layer(w, b, Activation::none);
  const int64_t T = Linear::gemv_max_rows();
  EXPECT_EQ(bf.impl_name(1), std::string("gemv_bf16:") + kernels::gemv_isa());
  EXPECT_EQ(bf.impl_name(T), bf.impl_name(1));
  EXPECT_EQ(bf.impl_name(T + 1), bf.impl_name());
  EXPECT_EQ(bf.impl_name(0), bf.impl_name());
  {
    onednn::ScopedBf16Emulation emulate;
    onednn::ScopedNoBf16Gemv off;
    Result<Linear> plain = Linear::create(w, b, Activation::none, DType::bf16);
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(plain->impl_name(1), plain->impl_name());
    const onednn::LinearStats s0 = onednn::linear_stats();
    Tensor y = Tensor::empty({1, 33});
    ASSERT_TRUE(plain->forward(random_tensor({1, 65}, rng), y).ok());
    EXPECT_EQ(onednn::linear_stats().gemv_calls, s0.gemv_calls);
  }
  if (runtime_info().native_bf16) {  // oneDNN's own bf16 kernels stay in charge
    Result<Linear> native = Linear::create(w, b, Activation::none, DType::bf16);
    ASSERT_TRUE(native.ok());
    EXPECT_EQ(native->impl_name(1), native->impl_name());
  }
}

// Bad inputs at decode sizes: the same refusals as the reference, naming the shapes.
TEST(GemvBf16, BadShapesNameTheShapes) {
  std::mt19937 rng(106);
  const Tensor w = random_tensor({8, 4}, rng), b = random_tensor({4}, rng);
  const Linear lin = bf16_layer(w, b, Activation::gelu_erf);
  struct Case {
    Tensor x, y, r;
    const char* names;  // text the message must contain
  };
  const Case cases[] = {
      {Tensor::empty({1, 7}), Tensor::empty({1, 4}), Tensor(), "(1, 7)"},                  // K
      {Tensor::empty({8}), Tensor::empty({1, 4}), Tensor(), "(8)"},                       // x rank
      {Tensor::empty({2, 8}), Tensor::empty({2, 5}), Tensor(), "(2, 5)"},                 // y
      {Tensor::empty({2, 8}), Tensor::empty({1, 4}), Tensor(), "(1, 4)"},                 // y rows
      {Tensor::empty({1, 8}), Tensor::empty({1, 4}), Tensor::empty({4, 1}), "(4, 1)"},    // residual
      {Tensor::empty({1, 8}, DType::i32), Tensor::empty({1, 4}), Tensor(), "i32"},        // x dtype
  };
  for (const Case& c : cases) {
    Tensor y1 = c.y, y2 = c.y;
    const Tensor* r = c.r.defined() ? &c.r : nullptr;
    const Status fast = lin.forward(c.x, y1, r);
    const Status want = ref::linear(c.x, w, b, Activation::gelu_erf, r, y2);
    ASSERT_FALSE(fast.ok()) << c.names;
    EXPECT_EQ(fast.code(), want.code());
    EXPECT_NE(fast.message().find(c.names), std::string::npos) << fast.message();
    EXPECT_EQ(fast.message().substr(fast.message().find(": ")), want.message().substr(want.message().find(": ")));
  }
}

// ---------------------------------------------------------------------------------------------
// A tiny bf16 causal LM: KV-cache decoding through the GEMV against the emulated oneDNN path
// (the same model made with the GEMV switched off) and against the reference loops.
//
// Why not simply "within 1e-4 at every step": a bf16 layer rounds its input to bf16, and rounding
// is discontinuous. Two paths that sum in different orders differ by an f32 ulp now and then; when
// such a value sits at a bf16 rounding boundary, the next layer sees inputs one bf16 ulp apart
// (2^-8 relative), which moves the logits by ~1e-3 from then on (the KV cache keeps it). So each
// step's layer inputs (captured: what each bf16 linear rounds) are compared after rounding to
// bf16: while they are equal, the logits must agree within 1e-4; from the first step where they
// are not (a "flip"), within 2e-2, test_model's bound for bf16 against the reference (a bug such
// as a dropped residual, a wrong row or bias moves logits by far more).

namespace {

ModelConfig tiny_lm() {
  ModelConfig c;
  c.arch = Arch::decoder;
  c.causal = true;
  c.d_model = 48;
  c.n_heads = 4;
  c.d_k = c.d_v = 12;
  c.d_ff = 100;  // not a multiple of the block
  c.n_layers = 2;
  c.activation = Activation::gelu_tanh;
  c.norm = NormPlacement::pre;
  c.final_norm = true;
  c.attention.scale = 1.0 / std::sqrt(12.0);
  c.stem.kind = StemKind::tokens;
  c.stem.vocab_size = 67;
  c.positions.kind = PositionKind::learned;
  c.positions.max_len = 64;
  c.head.kind = HeadKind::lm;
  c.head.tied = true;
  c.init.scheme = InitScheme::glorot_normal;
  c.init.seed = 9;
  c.weights.allow_missing = true;
  c.dtype = DType::bf16;
  return c;
}

struct Step {
  Tensor logits;                           // (S, V)
  std::map<std::string, Tensor> captured;  // the inputs of the bf16 linears
};

// The prompt step and `steps` decode steps through the KV cache, one row per sequence each, fed
// fixed tokens (so that runs whose greedy picks could differ see the same rows).
std::vector<Step> decode(const Model& m, const std::vector<std::vector<int32_t>>& prompts, int steps, bool reference) {
  const int64_t S = static_cast<int64_t>(prompts.size()), T = static_cast<int64_t>(prompts[0].size());
  const int64_t V = m.config().stem.vocab_size;
  Result<KVCache> cache = KVCache::create(m, S, T + steps + 1);
  EXPECT_TRUE(cache.ok());
  ForwardOptions o;
  o.reference = reference;
  o.cache = &*cache;
  o.last_logits = true;
  // The inputs of the bf16 linears: qkv, W_O, FFN 1 and 2 of each block, the head.
  for (int64_t l = 0; l < m.config().n_layers; ++l)
    for (const char* part : {".attn.in", ".attn.concat", ".ln2", ".ffn.hidden"})
      o.capture.insert("blocks." + std::to_string(l) + part);
  o.capture.insert("final_norm.out");
  Batch b;
  b.ids = Tensor::zeros({S, T}, DType::i32);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0; t < T; ++t)
      b.ids.data<int32_t>()[s * T + t] = prompts[static_cast<size_t>(s)][static_cast<size_t>(t)];
  std::vector<Step> out;
  for (int step = 0; step <= steps; ++step) {
    if (step > 0) {
      b.ids = Tensor::zeros({S, 1}, DType::i32);
      for (int64_t s = 0; s < S; ++s) b.ids.data<int32_t>()[s] = static_cast<int32_t>((7 * step + 13 * s + 1) % V);
    }
    Outputs o1;
    const Status st = m.forward(b, o, &o1);
    EXPECT_TRUE(st.ok()) << st.message();
    for (const std::string& name : o.capture) EXPECT_TRUE(o1.captured.count(name)) << name << " not captured";
    out.push_back({o1.logits.clone(), std::move(o1.captured)});
  }
  return out;
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  float m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// Some layer input of the two steps rounds to different bf16 values.
bool flipped(const Step& a, const Step& b) {
  for (const auto& [name, t] : a.captured) {
    const auto it = b.captured.find(name);
    if (it == b.captured.end() || it->second.shape() != t.shape()) return true;
    const std::vector<float> x = t.to_vector(), y = it->second.to_vector();
    for (size_t i = 0; i < x.size(); ++i)
      if (f32_to_bf16(x[i]).bits != f32_to_bf16(y[i]).bits) return true;
  }
  return false;
}

// Compares two decodes step by step; returns the number of steps compared at 1e-4.
int compare(const std::vector<Step>& a, const std::vector<Step>& b, const char* what) {
  int strict = 0;
  bool diverged = false;
  float worst_strict = 0, worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = max_abs_diff(a[i].logits, b[i].logits);
    worst = std::max(worst, d);
    diverged = diverged || flipped(a[i], b[i]);
    if (!diverged) {
      ++strict;
      worst_strict = std::max(worst_strict, d);
      EXPECT_LE(d, 1e-4f) << what << " step " << i << " (no bf16 rounding flip so far)";
    } else {
      EXPECT_LE(d, 2e-2f) << what << " step " << i << " (after a bf16 rounding flip)";
    }
  }
  std::printf("[ %s ] %d of %zu steps before any bf16 rounding flip: max |diff| %.3g there, %.3g overall\n", what,
              strict, a.size(), static_cast<double>(worst_strict), static_cast<double>(worst));
  return strict;
}

}  // namespace

TEST(GemvBf16, TinyLmDecodeEqualsEmulatedAndReference) {
  const ModelConfig c = tiny_lm();
  auto build = [&](bool gemv, uint64_t seed = 9) {
    onednn::ScopedBf16Emulation emulate;  // the GEMV also on machines with native bf16
    std::unique_ptr<onednn::ScopedNoBf16Gemv> off;
    if (!gemv) off = std::make_unique<onednn::ScopedNoBf16Gemv>();
    ModelConfig cs = c;
    cs.init.seed = seed;
    Result<Model> m = Model::build(cs);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return std::move(m).value();
  };
  const Model with_gemv = build(true), emulated = build(false);
  const std::vector<std::vector<int32_t>> prompts = {{3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3},
                                                     {2, 7, 18, 28, 18, 28, 45, 9, 0, 4, 52, 35},
                                                     {1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 22, 10}};
  const int steps = 12;
  int strict_emulated = 0;  // steps compared at 1e-4 against the emulated path
  for (size_t S : {size_t{1}, size_t{3}}) {
    const std::vector<std::vector<int32_t>> p(prompts.begin(), prompts.begin() + static_cast<int64_t>(S));
    const onednn::LinearStats s0 = onednn::linear_stats();
    const std::vector<Step> a = decode(with_gemv, p, steps, false);
    const onednn::LinearStats s1 = onednn::linear_stats();
    const std::vector<Step> e = decode(emulated, p, steps, false);
    const onednn::LinearStats s2 = onednn::linear_stats();
    const std::vector<Step> r = decode(with_gemv, p, steps, true);
    // Through the GEMV: the prompt step's head (S rows) and its 2 layers × 4 linears where the
    // prompt's 12·S rows are few enough, then 12 steps × (2 × 4 linears + the head); none in the
    // emulated model.
    const int64_t prompt_rows = 12 * static_cast<int64_t>(S);
    EXPECT_EQ(s1.gemv_calls - s0.gemv_calls, 1 + (prompt_rows <= Linear::gemv_max_rows() ? 8 : 0) + steps * 9);
    EXPECT_EQ(s2.gemv_calls - s1.gemv_calls, 0);
    ASSERT_EQ(a.size(), e.size());
    ASSERT_EQ(a.size(), r.size());
    for (const Step& st : a) ASSERT_EQ(st.logits.shape(), Shape({static_cast<int64_t>(S), 67}));
    const std::string n = std::to_string(S) + (S == 1 ? " sequence" : " sequences");
    strict_emulated += compare(a, e, (n + ", gemv vs emulated").c_str());
    compare(a, r, (n + ", gemv vs reference").c_str());
  }
  // The strict comparison is never vacuous: a prompt step of more rows than the GEMV takes runs
  // oneDNN in both models up to the head, so its layer inputs are the same and its logits (GEMV
  // head against oneDNN head) are always compared at 1e-4.
  EXPECT_GE(strict_emulated, 36 > Linear::gemv_max_rows() ? 1 : 0);
  // And the comparison can fail: the same model with other weights is far off.
  const Model other = build(true, 10);
  const std::vector<std::vector<int32_t>> p(prompts.begin(), prompts.begin() + 1);
  EXPECT_GT(max_abs_diff(decode(other, p, 2, false)[2].logits, decode(with_gemv, p, 2, false)[2].logits), 1e-2f);
}
