// The training ops of ops.h: linear on plain weights and its backward, activation, layer norm,
// softmax and embedding backward, cross-entropy. Two checks hold each op:
//   - the reference loop in f64 against central finite differences of the f64 forward, on the
//     scalar L = Σ dy ⊙ y with a random dy (step 1e-6; tolerance 1e-7 relative to the
//     gradient's largest entry: the differences err by about 1e-10 relative here);
//   - the fast path (oneDNN) against the reference loop in f32, on odd and bigger shapes and
//     strided views, with the accumulation (+=) of parameter gradients, null gradients and in
//     place where the contract allows it (tolerance: max |fast - ref| / max |ref| <= kFastTol).
// Plus the refusals, cross-entropy on hand-computed numbers, and cross-entropy, layer norm and the
// activations against PyTorch autograd (tests/data/reference/backward_ops.safetensors). Not here:
// attention's backward (test_attention) and whole models against autograd (the grad fixtures).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dnnl/engine.h"  // core/src: the primitive cache's counters
#include "tessera/ops.h"
#include "tessera/safetensors.h"
#include "test_util.h"

using namespace tessera;
using testing_util::IsOk;
using testing_util::max_rel_error;
using testing_util::random_tensor;
using testing_util::same_bits;
using testing_util::SameRefusal;
using testing_util::ThreadCount;
using testing_util::values_of;

namespace {

constexpr double kFdTol = 1e-7;    // f64 reference vs finite differences, relative
constexpr double kFastTol = 1e-5;  // f32 fast path vs f32 reference, relative
constexpr float kInf = std::numeric_limits<float>::infinity();
const Activation kActs[] = {Activation::none, Activation::relu, Activation::gelu_erf, Activation::gelu_tanh};

Tensor f64(const Tensor& t) { return t.to(DType::f64); }

// Σ a ⊙ b in double.
double dot(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = values_of(a), y = values_of(b);
  double s = 0.0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

// d loss / d p for every element of p (contiguous f64), by central differences.
Tensor finite_differences(Tensor& p, const std::function<double()>& loss, double h = 1e-6) {
  Tensor g = Tensor::empty(p.shape(), DType::f64);
  double* v = p.data<double>();
  for (int64_t i = 0; i < p.numel(); ++i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double up = loss();
    v[i] = keep - h;
    const double down = loss();
    v[i] = keep;
    g.data<double>()[i] = (up - down) / (2.0 * h);
  }
  return g;
}

std::string shape_of(std::initializer_list<int64_t> d) { return Shape(d).str(); }

// t's values in a fresh tensor of t's shape viewed through a transpose: the same values, with
// strides (1, rows) (the view a tied LM head's weight and gradient are).
Tensor transposed_copy(const Tensor& t) {
  Tensor buf = Tensor::empty({t.dim(1), t.dim(0)}, t.dtype());
  Tensor view = buf.transpose(0, 1);
  view.copy_from(t);
  return view;
}

bool contains(const Status& st, const std::string& part) {
  return st.message().find(part) != std::string::npos;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// linear: y = x · w + b

TEST(BackwardLinear, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(1);
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{7, 13, 5}, {1, 4, 1}, {3, 1, 6}}) {
    Tensor x = f64(random_tensor({M, K}, rng)), w = f64(random_tensor({K, N}, rng)),
           b = f64(random_tensor({N}, rng));
    const Tensor dy = f64(random_tensor({M, N}, rng));
    auto loss = [&] {
      Tensor y = Tensor::empty({M, N}, DType::f64);
      EXPECT_TRUE(IsOk(ref::linear_plain(x, w, b, y)));
      return dot(dy, y);
    };
    Tensor dx = Tensor::empty({M, K}, DType::f64), dw = Tensor::zeros({K, N}, DType::f64),
           db = Tensor::zeros({N}, DType::f64);
    ASSERT_TRUE(IsOk(ref::linear_backward(x, w, dy, &dx, &dw, &db)));
    const std::string at = shape_of({M, K, N});
    EXPECT_LT(max_rel_error(dx, finite_differences(x, loss)), kFdTol) << at;
    EXPECT_LT(max_rel_error(dw, finite_differences(w, loss)), kFdTol) << at;
    EXPECT_LT(max_rel_error(db, finite_differences(b, loss)), kFdTol) << at;
  }
}

// dx, dw and db of the fast path against the reference, dw and db starting from zero; w as given
// or as a transpose view, dw likewise (a tied head's gradient is the (V, C) table's transpose).
TEST(BackwardLinear, FastMatchesReference) {
  std::mt19937 rng(11);
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{7, 13, 5},   {1, 1, 1},     {3, 17, 1},
                                                          {33, 65, 17}, {100, 7, 129}, {64, 256, 384}};
  for (auto [M, K, N] : shapes)
    for (int variant = 0; variant < 4; ++variant) {
      const bool w_t = variant & 1, dw_t = variant & 2;
      const Tensor x = random_tensor({M, K}, rng), b = random_tensor({N}, rng),
                   dy = random_tensor({M, N}, rng);
      const Tensor w = w_t ? transposed_copy(random_tensor({K, N}, rng)) : random_tensor({K, N}, rng);
      Tensor y = Tensor::empty({M, N}), want_y = Tensor::empty({M, N});
      ASSERT_TRUE(IsOk(ops::linear_plain(x, w, b, y)));
      ASSERT_TRUE(IsOk(ref::linear_plain(x, w, b, want_y)));
      Tensor dx = Tensor::empty({M, K}), want_dx = Tensor::empty({M, K});
      Tensor dw = dw_t ? transposed_copy(Tensor::zeros({K, N})) : Tensor::zeros({K, N}),
             want_dw = Tensor::zeros({K, N});
      Tensor db = Tensor::zeros({N}), want_db = Tensor::zeros({N});
      ASSERT_TRUE(IsOk(ops::linear_backward(x, w, dy, &dx, &dw, &db)));
      ASSERT_TRUE(IsOk(ref::linear_backward(x, w, dy, &want_dx, &want_dw, &want_db)));
      const std::string at =
          shape_of({M, K, N}) + (w_t ? " w transposed" : "") + (dw_t ? " dw transposed" : "");
      EXPECT_LT(max_rel_error(y, want_y), kFastTol) << at;
      EXPECT_LT(max_rel_error(dx, want_dx), kFastTol) << at;
      EXPECT_LT(max_rel_error(dw, want_dw), kFastTol) << at;
      EXPECT_LT(max_rel_error(db, want_db), kFastTol) << at;
    }
}

TEST(BackwardLinear, ParameterGradientsAccumulate) {
  std::mt19937 rng(12);
  const int64_t M = 9, K = 13, N = 6;
  const Tensor x = random_tensor({M, K}, rng), w = random_tensor({K, N}, rng),
               dy = random_tensor({M, N}, rng);
  const Tensor dw0 = random_tensor({K, N}, rng), db0 = random_tensor({N}, rng);
  Tensor once_w = Tensor::zeros({K, N}), once_b = Tensor::zeros({N});
  ASSERT_TRUE(IsOk(ops::linear_backward(x, w, dy, nullptr, &once_w, &once_b)));
  // Twice from zero: twice the gradient (a weight used twice, or two micro-batches).
  Tensor twice_w = Tensor::zeros({K, N}), twice_b = Tensor::zeros({N});
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(IsOk(ops::linear_backward(x, w, dy, nullptr, &twice_w, &twice_b)));
  Tensor two_w = Tensor::empty({K, N}), two_b = Tensor::empty({N});
  ASSERT_TRUE(IsOk(ops::add(once_w, once_w, two_w)));
  ASSERT_TRUE(IsOk(ops::add(once_b, once_b, two_b)));
  EXPECT_LT(max_rel_error(twice_w, two_w), 1e-7);
  EXPECT_LT(max_rel_error(twice_b, two_b), 1e-7);
  // Onto what the tensors held, also through a transpose view, on both paths.
  Tensor sum_w = Tensor::empty({K, N}), sum_b = Tensor::empty({N});
  ASSERT_TRUE(IsOk(ops::add(dw0, once_w, sum_w)));
  ASSERT_TRUE(IsOk(ops::add(db0, once_b, sum_b)));
  Tensor fast_w = transposed_copy(dw0), fast_b = db0.clone(), ref_w = dw0.clone(), ref_b = db0.clone();
  ASSERT_TRUE(IsOk(ops::linear_backward(x, w, dy, nullptr, &fast_w, &fast_b)));
  ASSERT_TRUE(IsOk(ref::linear_backward(x, w, dy, nullptr, &ref_w, &ref_b)));
  for (const Tensor* t : {&fast_w, &ref_w}) EXPECT_LT(max_rel_error(*t, sum_w), 1e-6);
  for (const Tensor* t : {&fast_b, &ref_b}) EXPECT_LT(max_rel_error(*t, sum_b), 1e-6);
}

// The bias gradient over many rows (several of the sums' row chunks, the last one short), dense
// and through a transpose view: within f32 rounding of the f64 column sums, added onto what db
// held, and the same bits on 1, 2 and 3 threads, on both precisions.
TEST(BackwardLinear, BiasGradientOverManyRowsIsTheF64SumOnAnyThreadCount) {
  std::mt19937 rng(13);
  const ThreadCount restore;
  const int64_t M = 2000, K = 3, N = 37;  // 74,000 entries: over the threshold where the sums go parallel
  const Tensor x = random_tensor({M, K}, rng), w = random_tensor({K, N}, rng), db0 = random_tensor({N}, rng);
  const Tensor dense = random_tensor({M, N}, rng);
  const Tensor strided = transposed_copy(dense);  // the same values, a column stride of M
  for (const DType compute : {DType::f32, DType::bf16})
    for (const Tensor* dy : {&dense, &strided}) {
      std::vector<double> want(N);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) want[n] += dense.data<float>()[m * N + n];
      Tensor first;
      for (const int threads : {1, 2, 3}) {
        set_num_threads(threads);
        Tensor db = db0.clone();
        ASSERT_TRUE(IsOk(ops::linear_backward(x, w, *dy, nullptr, nullptr, &db, compute)));
        const std::string at = std::string(dy == &dense ? "dense" : "strided") + " dy, " +
                               std::to_string(threads) + " threads, " + dtype_name(compute);
        for (int64_t n = 0; n < N; ++n) {
          const double expect = static_cast<double>(db0.data<float>()[n]) + want[n];
          EXPECT_NEAR(db.data<float>()[n], expect, 1e-6 * (std::abs(expect) + 1)) << at << ", column " << n;
        }
        if (threads == 1)
          first = db;
        else
          EXPECT_TRUE(same_bits(first, db)) << at;
      }
    }
}

// A tied LM head: logits = h · Eᵀ reads the (V, C) embedding table through a transpose view, and
// its dw is the same view of the table's gradient, which the lookup's backward also adds into.
TEST(BackwardLinear, TiedHeadAddsIntoTheTableGradient) {
  std::mt19937 rng(13);
  const int64_t T = 11, C = 16, V = 37;
  const Tensor table = random_tensor({V, C}, rng), h = random_tensor({T, C}, rng),
               dlogits = random_tensor({T, V}, rng);
  const Tensor ids = Tensor::from_ids({T}, {0, 5, 5, 36, 2, 0, 9, 9, 9, 1, 30});
  const Tensor dy_embed = random_tensor({T, C}, rng);
  auto run = [&](bool fast) {
    Tensor dtable = Tensor::zeros({V, C}), dw = dtable.transpose(0, 1), dh = Tensor::empty({T, C});
    const Tensor w = table.transpose(0, 1);  // (C, V)
    EXPECT_TRUE(IsOk(fast ? ops::embedding_backward(ids, dy_embed, dtable)
                          : ref::embedding_backward(ids, dy_embed, dtable)));
    EXPECT_TRUE(IsOk(fast ? ops::linear_backward(h, w, dlogits, &dh, &dw, nullptr)
                          : ref::linear_backward(h, w, dlogits, &dh, &dw, nullptr)));
    return std::pair{dtable, dh};
  };
  const auto [fast_table, fast_h] = run(true);
  const auto [ref_table, ref_h] = run(false);
  EXPECT_LT(max_rel_error(fast_table, ref_table), kFastTol);
  EXPECT_LT(max_rel_error(fast_h, ref_h), kFastTol);
  // The table gradient holds both uses: row 9 has three lookups and its head column.
  Tensor head_only = Tensor::zeros({V, C}), dw = head_only.transpose(0, 1);
  ASSERT_TRUE(IsOk(ref::linear_backward(h, table.transpose(0, 1), dlogits, nullptr, &dw, nullptr)));
  const float want = head_only.at({9, 3}) + dy_embed.at({6, 3}) + dy_embed.at({7, 3}) + dy_embed.at({8, 3});
  EXPECT_NEAR(fast_table.at({9, 3}), want, 1e-5);
}

TEST(BackwardLinear, NullGradientsAreSkipped) {
  std::mt19937 rng(14);
  const int64_t M = 7, K = 13, N = 5;
  const Tensor x = random_tensor({M, K}, rng), w = random_tensor({K, N}, rng),
               dy = random_tensor({M, N}, rng);
  Tensor all_dx = Tensor::empty({M, K}), all_dw = Tensor::zeros({K, N}), all_db = Tensor::zeros({N});
  ASSERT_TRUE(IsOk(ops::linear_backward(x, w, dy, &all_dx, &all_dw, &all_db)));
  for (int mask = 0; mask < 8; ++mask) {
    Tensor dx = Tensor::full({M, K}, 7.f), dw = Tensor::zeros({K, N}), db = Tensor::zeros({N});
    const onednn::CacheStats before = onednn::cache_stats();
    ASSERT_TRUE(IsOk(ops::linear_backward(x, w, dy, mask & 1 ? &dx : nullptr, mask & 2 ? &dw : nullptr,
                                          mask & 4 ? &db : nullptr)));
    const onednn::CacheStats after = onednn::cache_stats();
    // One product per gradient asked for (dx, dw: f32 matrices, so sgemm); db is a loop.
    EXPECT_EQ(after.sgemm_calls - before.sgemm_calls, !!(mask & 1) + !!(mask & 2)) << mask;
    EXPECT_EQ(after.hits + after.created, before.hits + before.created) << mask;
    EXPECT_EQ(max_rel_error(dx, mask & 1 ? all_dx : Tensor::full({M, K}, 7.f)), 0.0) << mask;
    EXPECT_EQ(max_rel_error(dw, mask & 2 ? all_dw : Tensor::zeros({K, N})), 0.0) << mask;
    EXPECT_EQ(max_rel_error(db, mask & 4 ? all_db : Tensor::zeros({N})), 0.0) << mask;
  }
}

TEST(BackwardLinear, EmptyShapes) {
  const Tensor b = Tensor::from_vector({2}, {1.f, -2.f});
  Tensor y = Tensor::full({3, 2}, 9.f);
  ASSERT_TRUE(IsOk(ops::linear_plain(Tensor::zeros({3, 0}), Tensor::zeros({0, 2}), b, y)));  // K = 0: y = b
  EXPECT_EQ(y.to_vector(), (std::vector<float>{1, -2, 1, -2, 1, -2}));
  Tensor dw = Tensor::full({4, 2}, 3.f), db = Tensor::full({2}, 3.f), dx = Tensor::empty({0, 4});
  ASSERT_TRUE(IsOk(ops::linear_backward(Tensor::zeros({0, 4}), Tensor::zeros({4, 2}), Tensor::zeros({0, 2}),
                                        &dx, &dw, &db)));
  EXPECT_EQ(dw.to_vector(), std::vector<float>(8, 3.f));  // M = 0 adds nothing
  EXPECT_EQ(db.to_vector(), std::vector<float>(2, 3.f));
}

TEST(BackwardLinear, Refusals) {
  std::mt19937 rng(15);
  const Tensor x = random_tensor({7, 13}, rng), w = random_tensor({13, 5}, rng),
               dy = random_tensor({7, 5}, rng);
  Tensor dx = Tensor::empty({7, 13}), dw = Tensor::zeros({13, 5}), db = Tensor::zeros({5});
  Tensor short_dy = Tensor::zeros({7, 4}), wrong_db = Tensor::zeros({4}), y = Tensor::empty({7, 5});
  EXPECT_TRUE(SameRefusal(ops::linear_backward(x, w, short_dy, &dx, &dw, &db),
                          ref::linear_backward(x, w, short_dy, &dx, &dw, &db)));
  EXPECT_TRUE(contains(ops::linear_backward(x, w, short_dy, &dx, &dw, &db),
                       "ops::linear_backward: dy f32 (7, 4) should be (7, 5)"));
  EXPECT_TRUE(contains(ops::linear_backward(x, w, dy, &dx, &dw, &wrong_db), "db f32 (4) should be (5)"));
  EXPECT_TRUE(SameRefusal(ops::linear_plain(x, dy, Tensor(), y), ref::linear_plain(x, dy, Tensor(), y)));
  EXPECT_TRUE(
      contains(ops::linear_plain(x, dy, Tensor(), y), "x f32 (7, 13) has K = 13 but w f32 (7, 5) has K = 7"));
  // dtypes: bf16 nowhere; f64 only in the reference loops, and there for every tensor of a call
  const Tensor xb = x.to(DType::bf16), x64 = f64(x);
  EXPECT_TRUE(contains(ops::linear_backward(xb, w, dy, &dx, &dw, &db), "x must be f32, got bf16 (7, 13)"));
  EXPECT_TRUE(
      contains(ref::linear_backward(xb, w, dy, &dx, &dw, &db), "x must be f32 or f64, got bf16 (7, 13)"));
  EXPECT_TRUE(contains(ops::linear_backward(x64, w, dy, &dx, &dw, &db), "f64 is for the reference loops"));
  const Status mixed = ref::linear_backward(x64, w, dy, &dx, &dw, &db);
  EXPECT_TRUE(contains(mixed, "ref::linear_backward: w is f32 (13, 5) but x is f64 (7, 13)"))
      << mixed.message();
  EXPECT_TRUE(contains(mixed, "every tensor of one call must be f32, or every one f64"));
  EXPECT_EQ(mixed.code(), Code::invalid_argument);
  EXPECT_TRUE(contains(ops::linear_backward(x, Tensor(), dy, &dx, &dw, &db), "w is undefined"));
}

// ---------------------------------------------------------------------------------------------
// linear in bf16 (train.precision: bf16): the products' inputs rounded to bf16, f32 sums

namespace {

// The most rounding to bf16 moves a value, relative to it: half a step of 2^-7 at 1, 2^-8
// (bf16 keeps 8 significant bits).
constexpr double kBf16Eps = 1.0 / 256;

// ‖a - b‖ / ‖b‖ in double.
double rel_l2(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = values_of(a), y = values_of(b);
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// max over (i, j) of |got - want|_ij / (|a| · |b|)_ij for a product a (M, K) · b (K, N): the error
// of each value against the sum of its products' magnitudes, which bounds rounding both operands
// of every product: |Δ| <= (2ε + ε²) Σ_k |a_ik| |b_kj| (ε = 2^-8), plus the f32 sums' own roundoff.
double worst_over_bound(const Tensor& got, const Tensor& want, const Tensor& a, const Tensor& b) {
  const int64_t M = a.dim(0), K = a.dim(1), N = b.dim(1);
  const std::vector<double> A = values_of(a.contiguous()), B = values_of(b.contiguous());
  const std::vector<double> g = values_of(got), w = values_of(want);
  double worst = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double bound = 0;
      for (int64_t k = 0; k < K; ++k) bound += std::fabs(A[i * K + k]) * std::fabs(B[k * N + j]);
      const double d = std::fabs(g[i * N + j] - w[i * N + j]);
      if (d > 0) worst = std::max(worst, bound > 0 ? d / bound : std::numeric_limits<double>::infinity());
    }
  return worst;
}

// The bf16 paths this CPU has: native bf16 kernels where oneDNN has them, and the emulation
// (rounded inputs, f32 kernels) everywhere.
std::vector<bool> bf16_emulation_modes() {
  if (runtime_info().native_bf16) return {false, true};
  return {true};
}

}  // namespace

// Round to nearest, ties to even, on every path: x (M, 1) · w (1, 1) with w = 1 gives x rounded.
// 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (bf16's neighbours there) and goes to 1 (even);
// 1 + 3·2^-8 halfway between 1 + 2^-7 and 1 + 2^-6, and goes to 1 + 2^-6; just above a half goes up.
TEST(BackwardLinearBf16, RoundsTheInputsToNearestEven) {
  const float h = std::ldexp(1.f, -8);
  const Tensor x = Tensor::from_vector({4, 1}, {1 + h, 1 + 3 * h, 1 + h + std::ldexp(1.f, -20), -(1 + h)});
  const std::vector<float> want = {1.f, 1 + 4 * h, 1 + 2 * h, -1.f};
  const Tensor one = Tensor::from_vector({1, 1}, {1.f});
  for (bool emulate : bf16_emulation_modes()) {
    std::unique_ptr<onednn::ScopedBf16Emulation> scope;
    if (emulate) scope = std::make_unique<onednn::ScopedBf16Emulation>();
    SCOPED_TRACE(emulate ? "emulated" : "native");
    Tensor y = Tensor::empty({4, 1}), yr = Tensor::empty({4, 1});
    ASSERT_TRUE(IsOk(ops::linear_plain(x, one, Tensor(), y, DType::bf16)));
    ASSERT_TRUE(IsOk(ref::linear_plain(x, one, Tensor(), yr, DType::bf16)));
    EXPECT_EQ(y.to_vector(), want);
    EXPECT_EQ(yr.to_vector(), want);
    // dy rounded: dw = xᵀ · dy with x = 1 gives dy rounded, and dx = dy · wᵀ with w = 1 their sum.
    Tensor dw = Tensor::zeros({1, 4}), dx = Tensor::empty({1, 1});
    ASSERT_TRUE(IsOk(ops::linear_backward(Tensor::full({1, 1}, 1.f), Tensor::full({1, 4}, 1.f), x.reshape({1, 4}),
                                          &dx, &dw, nullptr, DType::bf16)));
    EXPECT_EQ(dw.to_vector(), want);
    EXPECT_EQ(dx.to_vector(), std::vector<float>{want[0] + want[1] + want[2] + want[3]});
    // w rounded in dx: dx = dy · wᵀ with dy = 1 gives w's column rounded.
    Tensor dx2 = Tensor::empty({1, 4});
    ASSERT_TRUE(IsOk(ops::linear_backward(Tensor::full({1, 4}, 1.f), x, Tensor::full({1, 1}, 1.f), &dx2, nullptr,
                                          nullptr, DType::bf16)));
    EXPECT_EQ(dx2.to_vector(), want);
  }
}

// The fast path in bf16 against the reference loop on the same rounded inputs (the same exact
// products, summed in f32 against double: held at 1e-5 of the result's scale), and against f32
// (the bf16 tolerance: every value within 2.05ε of the sum of its products' magnitudes, the bound
// of rounding both operands of each product, ε = 2^-8; and, where there are enough values, an rms
// difference of at least ε/16 of f32's, so that a path which does not round fails). w as f32
// (rounded in the op) and as its bf16 copy (what a training step passes), plain or a transpose
// view; dw plain or transposed.
TEST(BackwardLinearBf16, FastMatchesTheRoundedReferenceAndStaysWithinTheBf16ToleranceOfF32) {
  std::mt19937 rng(21);
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{7, 13, 5},   {1, 1, 1},     {3, 17, 1},
                                                          {33, 65, 17}, {100, 7, 129}, {64, 256, 384}};
  double worst_ref = 0, worst_bound = 0, worst_l2 = 0;
  for (bool emulate : bf16_emulation_modes()) {
    std::unique_ptr<onednn::ScopedBf16Emulation> scope;
    if (emulate) scope = std::make_unique<onednn::ScopedBf16Emulation>();
    for (auto [M, K, N] : shapes)
      for (int variant = 0; variant < 8; ++variant) {
        const bool w_t = variant & 1, dw_t = variant & 2, w_bf16 = variant & 4;
        const Tensor x = random_tensor({M, K}, rng), dy = random_tensor({M, N}, rng);
        const Tensor w32 = w_t ? transposed_copy(random_tensor({K, N}, rng)) : random_tensor({K, N}, rng);
        const Tensor w = w_bf16 ? (w_t ? transposed_copy(w32.to(DType::bf16)) : w32.to(DType::bf16)) : w32;
        const std::string at = shape_of({M, K, N}) + (emulate ? " emulated" : " native") +
                               (w_t ? " w transposed" : "") + (dw_t ? " dw transposed" : "") +
                               (w_bf16 ? " w bf16" : "");
        // No bias in y, so that the bound is the products' alone (the bias is added in f32).
        Tensor y = Tensor::empty({M, N}), y_ref = Tensor::empty({M, N}), y32 = Tensor::empty({M, N});
        ASSERT_TRUE(IsOk(ops::linear_plain(x, w, Tensor(), y, DType::bf16))) << at;
        ASSERT_TRUE(IsOk(ref::linear_plain(x, w, Tensor(), y_ref, DType::bf16))) << at;
        ASSERT_TRUE(IsOk(ref::linear_plain(x, w32, Tensor(), y32)));
        auto grads = [&](auto&& backward, Tensor* out) {
          out[0] = Tensor::empty({M, K});
          out[1] = dw_t ? transposed_copy(Tensor::zeros({K, N})) : Tensor::zeros({K, N});
          out[2] = Tensor::zeros({N});
          return backward(&out[0], &out[1], &out[2]);
        };
        Tensor fast[3], want[3], f32[3];
        ASSERT_TRUE(IsOk(grads([&](Tensor* dx, Tensor* dw, Tensor* db) {
          return ops::linear_backward(x, w, dy, dx, dw, db, DType::bf16);
        }, fast))) << at;
        ASSERT_TRUE(IsOk(grads([&](Tensor* dx, Tensor* dw, Tensor* db) {
          return ref::linear_backward(x, w, dy, dx, dw, db, DType::bf16);
        }, want))) << at;
        ASSERT_TRUE(IsOk(grads([&](Tensor* dx, Tensor* dw, Tensor* db) {
          return ref::linear_backward(x, w32, dy, dx, dw, db);
        }, f32)));
        // Each product, its operands, and whether it has enough values for the lower bound.
        const Tensor wt = w32.transpose(0, 1), xt = x.transpose(0, 1);
        const struct {
          const char* name;
          const Tensor &got, &ref, &f32, &a, &b;
          bool many;
        } products[] = {{"y", y, y_ref, y32, x, w32, M * N >= 64 && K >= 7},
                        {"dx", fast[0], want[0], f32[0], dy, wt, M * K >= 64 && N >= 7},
                        {"dw", fast[1], want[1], f32[1], xt, dy, K * N >= 64 && M >= 7}};
        for (const auto& p : products) {
          EXPECT_LT(max_rel_error(p.got, p.ref), kFastTol) << p.name << " " << at;
          worst_ref = std::max(worst_ref, max_rel_error(p.got, p.ref));
          const double bound = worst_over_bound(p.got, p.f32, p.a, p.b);
          EXPECT_LE(bound, 2.05 * kBf16Eps) << p.name << " " << at;
          worst_bound = std::max(worst_bound, bound);
          if (p.many) {
            EXPECT_GE(rel_l2(p.got, p.f32), kBf16Eps / 16) << p.name << " " << at << ": not rounded?";
            worst_l2 = std::max(worst_l2, rel_l2(p.got, p.f32));
          }
        }
        // db sums dy as it is: f32's own sums.
        EXPECT_LT(max_rel_error(fast[2], f32[2]), 1e-6) << "db " << at;
        EXPECT_LT(max_rel_error(want[2], f32[2]), 1e-6) << "db " << at;
      }
  }
  std::printf("[ bf16 linear ] fast vs rounded reference: max %.2e of scale; vs f32: up to %.3f eps of the bound, "
              "rel L2 up to %.3f %%\n",
              worst_ref, worst_bound / kBf16Eps, 100 * worst_l2);
}

// Native and emulated bf16 compute the same products (exact in f32) and differ only in the order
// of the f32 sums; a micro-batch's dw adds onto what the gradient holds in bf16 as in f32.
TEST(BackwardLinearBf16, NativeAndEmulatedAgreeAndGradientsAccumulate) {
  std::mt19937 rng(22);
  const int64_t M = 50, K = 64, N = 48;
  const Tensor x = random_tensor({M, K}, rng), w = random_tensor({K, N}, rng).to(DType::bf16),
               dy = random_tensor({M, N}, rng), dw0 = random_tensor({K, N}, rng), db0 = random_tensor({N}, rng);
  auto run = [&](bool emulate, Tensor* y, Tensor* dx, Tensor* dw, Tensor* db) {
    std::unique_ptr<onednn::ScopedBf16Emulation> scope;
    if (emulate) scope = std::make_unique<onednn::ScopedBf16Emulation>();
    *y = Tensor::empty({M, N});
    *dx = Tensor::empty({M, K});
    *dw = dw0.clone();
    *db = db0.clone();
    EXPECT_TRUE(IsOk(ops::linear_plain(x, w, Tensor(), *y, DType::bf16)));
    EXPECT_TRUE(IsOk(ops::linear_backward(x, w, dy, dx, dw, db, DType::bf16)));
  };
  Tensor e[4];
  run(true, &e[0], &e[1], &e[2], &e[3]);
  Tensor want_dw = dw0.clone(), want_db = db0.clone(), want_dx = Tensor::empty({M, K});
  ASSERT_TRUE(IsOk(ref::linear_backward(x, w, dy, &want_dx, &want_dw, &want_db, DType::bf16)));
  EXPECT_LT(max_rel_error(e[2], want_dw), kFastTol);
  EXPECT_LT(max_rel_error(e[3], want_db), 1e-6);
  if (!runtime_info().native_bf16) {
    std::printf("[ bf16 linear ] no native bf16 kernels on this CPU: the emulated path only\n");
    return;
  }
  Tensor n[4];
  run(false, &n[0], &n[1], &n[2], &n[3]);
  for (int i = 0; i < 4; ++i) EXPECT_LT(max_rel_error(n[i], e[i]), kFastTol) << i;
}

// A layer's kept bf16 copy of x (to_bf16) in place of x: the same products bit for bit, forward
// and backward, native and emulated, on both paths; and to_bf16 is f32_to_bf16 on every element.
TEST(BackwardLinearBf16, ABf16CopyOfXGivesTheSameBitsAsX) {
  std::mt19937 rng(29);
  const int64_t M = 37, K = 19, N = 23;
  const Tensor x = random_tensor({M, K}, rng), w = random_tensor({K, N}, rng), b = random_tensor({N}, rng),
               dy = random_tensor({M, N}, rng);
  Tensor xb = Tensor::empty({M, K}, DType::bf16), xr = Tensor::empty({M, K}, DType::bf16);
  ASSERT_TRUE(IsOk(ops::to_bf16(x, xb)));
  ASSERT_TRUE(IsOk(ref::to_bf16(x, xr)));
  for (int64_t i = 0; i < M * K; ++i) {
    ASSERT_EQ(xb.data<bf16>()[i].bits, f32_to_bf16(x.data<float>()[i]).bits) << i;
    ASSERT_EQ(xr.data<bf16>()[i].bits, xb.data<bf16>()[i].bits) << i;
  }
  for (bool emulate : bf16_emulation_modes())
    for (bool reference : {false, true}) {
      std::unique_ptr<onednn::ScopedBf16Emulation> scope;
      if (emulate) scope = std::make_unique<onednn::ScopedBf16Emulation>();
      const std::string at = std::string(emulate ? "emulated" : "native") + (reference ? ", reference" : ", fast");
      Tensor y[2], dx[2], dw[2], db[2];
      for (int i = 0; i < 2; ++i) {
        const Tensor& in = i ? xb : x;
        y[i] = Tensor::empty({M, N});
        dx[i] = Tensor::empty({M, K});
        dw[i] = Tensor::zeros({K, N});
        db[i] = Tensor::zeros({N});
        if (reference) {
          ASSERT_TRUE(IsOk(ref::linear_plain(in, w, b, y[i], DType::bf16))) << at;
          ASSERT_TRUE(IsOk(ref::linear_backward(in, w, dy, &dx[i], &dw[i], &db[i], DType::bf16))) << at;
        } else {
          ASSERT_TRUE(IsOk(ops::linear_plain(in, w, b, y[i], DType::bf16))) << at;
          ASSERT_TRUE(IsOk(ops::linear_backward(in, w, dy, &dx[i], &dw[i], &db[i], DType::bf16))) << at;
        }
      }
      EXPECT_TRUE(same_bits(y[0], y[1])) << at;
      EXPECT_TRUE(same_bits(dx[0], dx[1])) << at;
      EXPECT_TRUE(same_bits(dw[0], dw[1])) << at;
      EXPECT_TRUE(same_bits(db[0], db[1])) << at;
    }
}

TEST(BackwardLinearBf16, Refusals) {
  std::mt19937 rng(23);
  const Tensor x = random_tensor({7, 13}, rng), w = random_tensor({13, 5}, rng), dy = random_tensor({7, 5}, rng);
  Tensor dx = Tensor::empty({7, 13}), dw = Tensor::zeros({13, 5}), db = Tensor::zeros({5}), y = Tensor::empty({7, 5});
  // bf16 weights only with bf16 compute; bf16 compute only on f32 tensors (not the f64 checks)
  const Tensor wb = w.to(DType::bf16);
  EXPECT_TRUE(contains(ops::linear_plain(x, wb, Tensor(), y), "w must be f32, got bf16 (13, 5)"));
  EXPECT_TRUE(SameRefusal(ops::linear_backward(f64(x), w, dy, &dx, &dw, &db, DType::bf16),
                          ref::linear_backward(f64(x), w, dy, &dx, &dw, &db, DType::bf16)));
  EXPECT_TRUE(contains(ref::linear_backward(f64(x), w, dy, &dx, &dw, &db, DType::bf16),
                       "x must be f32 or bf16 for bf16 compute, got f64"));
  EXPECT_TRUE(contains(ops::linear_plain(x, w.to(DType::f64), Tensor(), y, DType::bf16),
                       "w must be f32 or bf16 for bf16 compute, got f64 (13, 5)"));
  EXPECT_TRUE(contains(ops::linear_plain(x.to(DType::bf16), w, Tensor(), y), "x must be f32, got bf16 (7, 13)"));
  Tensor yb = Tensor::empty({7, 5}, DType::bf16);
  EXPECT_TRUE(contains(ops::linear_plain(x, w, Tensor(), yb, DType::bf16), "y must be f32"));
  // to_bf16: f32 in, bf16 of its shape out
  Tensor xb = Tensor::empty({7, 13}, DType::bf16);
  EXPECT_TRUE(contains(ops::to_bf16(xb, xb), "ops::to_bf16: x must be f32 and y bf16, got x bf16 (7, 13)"));
  EXPECT_TRUE(contains(ref::to_bf16(x, dx), "ref::to_bf16: x must be f32 and y bf16"));
  Tensor short_b = Tensor::empty({7, 12}, DType::bf16);
  EXPECT_TRUE(contains(ops::to_bf16(x, short_b), "y bf16 (7, 12) does not match x"));
  const Status f16 = ops::linear_backward(x, w, dy, &dx, &dw, &db, DType::f16);
  EXPECT_TRUE(contains(f16, "ops::linear_backward: compute must be f32 or bf16, got f16")) << f16.message();
  EXPECT_TRUE(SameRefusal(f16, ref::linear_backward(x, w, dy, &dx, &dw, &db, DType::f16)));
}

// ---------------------------------------------------------------------------------------------
// activation: dx = dy ⊙ act'(x)

TEST(BackwardActivation, DerivativeMatchesFiniteDifferences) {
  const double h = 1e-6;
  for (Activation act : kActs)
    for (double x = -6.0; x <= 6.0; x += 0.0625) {
      const double at = x + 0.01;  // off the grid's 0: ReLU's kink
      const double fd = (ref::activate(act, at + h) - ref::activate(act, at - h)) / (2.0 * h);
      EXPECT_NEAR(ref::activate_derivative(act, at), fd, kFdTol) << activation_name(act) << " at " << at;
    }
  EXPECT_EQ(ref::activate_derivative(Activation::relu, 0.0), 0.0);
  EXPECT_EQ(ref::activate_derivative(Activation::relu, 1e-300), 1.0);
  EXPECT_EQ(ref::activate_derivative(Activation::none, -3.0), 1.0);
  // Known values: GELU'(0) = 1/2 for both forms; erf-GELU'(1) = Φ(1) + φ(1).
  EXPECT_DOUBLE_EQ(ref::activate_derivative(Activation::gelu_erf, 0.0), 0.5);
  EXPECT_DOUBLE_EQ(ref::activate_derivative(Activation::gelu_tanh, 0.0), 0.5);
  EXPECT_NEAR(ref::activate_derivative(Activation::gelu_erf, 1.0), 0.8413447460685429 + 0.24197072451914337,
              1e-15);
  // The float activate is the double one, rounded once.
  for (Activation act : kActs)
    EXPECT_EQ(ref::activate(act, 0.7f), static_cast<float>(ref::activate(act, static_cast<double>(0.7f))));
}

TEST(BackwardActivation, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  for (Activation act : kActs) {
    Tensor x = f64(random_tensor({3, 17}, rng, -4.f, 4.f));
    for (int64_t i = 0; i < x.numel(); ++i)  // away from ReLU's kink by more than the step
      if (std::fabs(x.data<double>()[i]) < 1e-3) x.data<double>()[i] = 0.5;
    const Tensor dy = f64(random_tensor({3, 17}, rng));
    auto loss = [&] {
      double s = 0.0;
      for (int64_t i = 0; i < x.numel(); ++i)
        s += dy.data<double>()[i] * ref::activate(act, x.data<double>()[i]);
      return s;
    };
    Tensor dx = Tensor::empty({3, 17}, DType::f64);
    ASSERT_TRUE(IsOk(ref::activation_backward(act, x, dy, dx)));
    EXPECT_LT(max_rel_error(dx, finite_differences(x, loss)), kFdTol) << activation_name(act);
  }
}

// Over each activation: odd and big sizes, x as a strided view, dx in place of dy.
TEST(BackwardActivation, FastMatchesReference) {
  std::mt19937 rng(21);
  for (Activation act : kActs)
    for (const Shape& shape : {Shape{5}, Shape{7, 13}, Shape{3, 1, 17}, Shape{64, 3072}}) {
      const Tensor x = random_tensor(shape, rng, -5.f, 5.f), dy = random_tensor(shape, rng);
      Tensor dx = Tensor::empty(shape), want = Tensor::empty(shape);
      ASSERT_TRUE(IsOk(ops::activation_backward(act, x, dy, dx)));
      ASSERT_TRUE(IsOk(ref::activation_backward(act, x, dy, want)));
      const std::string at = std::string(activation_name(act)) + " " + shape.str();
      EXPECT_LT(max_rel_error(dx, want), kFastTol) << at;
      Tensor in_place = dy.clone();
      ASSERT_TRUE(IsOk(ops::activation_backward(act, x, in_place, in_place)));
      EXPECT_LT(max_rel_error(in_place, want), kFastTol) << at << " in place";
    }
  const Tensor x = transposed_copy(random_tensor({9, 4}, rng, -3.f, 3.f)), dy = random_tensor({9, 4}, rng);
  Tensor dx = transposed_copy(Tensor::zeros({9, 4})), want = Tensor::empty({9, 4});
  ASSERT_TRUE(IsOk(ops::activation_backward(Activation::gelu_tanh, x, dy, dx)));
  ASSERT_TRUE(IsOk(ref::activation_backward(Activation::gelu_tanh, x, dy, want)));
  EXPECT_LT(max_rel_error(dx, want), kFastTol) << "strided";
  // ReLU's derivative at 0 is 0 on both paths.
  Tensor at0 = Tensor::empty({2});
  ASSERT_TRUE(
      IsOk(ops::activation_backward(Activation::relu, Tensor::zeros({2}), Tensor::full({2}, 1.f), at0)));
  EXPECT_EQ(at0.to_vector(), (std::vector<float>{0.f, 0.f}));
}

TEST(BackwardActivation, Refusals) {
  const Tensor x = Tensor::zeros({3, 4}), dy = Tensor::zeros({3, 4}), wide = Tensor::zeros({3, 5});
  Tensor dx = Tensor::empty({3, 4}), dx5 = Tensor::empty({3, 5});
  EXPECT_TRUE(SameRefusal(ops::activation_backward(Activation::relu, x, wide, dx5),
                          ref::activation_backward(Activation::relu, x, wide, dx5)));
  EXPECT_TRUE(contains(ops::activation_backward(Activation::relu, x, wide, dx5),
                       "dy f32 (3, 5) does not match x f32 (3, 4)"));
  const Status unknown = ops::activation_backward(static_cast<Activation>(9), x, dy, dx);
  EXPECT_TRUE(SameRefusal(unknown, ref::activation_backward(static_cast<Activation>(9), x, dy, dx)));
  EXPECT_TRUE(contains(unknown, "unknown activation 9"));
  EXPECT_TRUE(contains(ref::activation_backward(Activation::relu, f64(x), dy, dx),
                       "dy is f32 (3, 4) but x is f64 (3, 4)"));
}

// ---------------------------------------------------------------------------------------------
// layer norm

TEST(BackwardLayerNorm, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  for (auto [R, C] : {std::pair<int64_t, int64_t>{5, 13}, {2, 1}, {1, 64}}) {
    Tensor x = f64(random_tensor({R, C}, rng, -2.f, 3.f)), gamma = f64(random_tensor({C}, rng, 0.5f, 1.5f)),
           beta = f64(random_tensor({C}, rng));
    const Tensor dy = f64(random_tensor({R, C}, rng));
    const float eps = 1e-5f;
    Tensor mean = Tensor::empty({R}, DType::f64), rstd = Tensor::empty({R}, DType::f64);
    auto loss = [&] {
      Tensor y = Tensor::empty({R, C}, DType::f64);
      EXPECT_TRUE(IsOk(ref::layer_norm_train(x, gamma, beta, eps, y, mean, rstd)));
      return dot(dy, y);
    };
    loss();  // mean and rstd at x
    Tensor dx = Tensor::empty({R, C}, DType::f64), dgamma = Tensor::zeros({C}, DType::f64),
           dbeta = Tensor::zeros({C}, DType::f64);
    ASSERT_TRUE(IsOk(ref::layer_norm_backward(x, gamma, mean, rstd, dy, &dx, &dgamma, &dbeta)));
    const std::string at = shape_of({R, C});
    EXPECT_LT(max_rel_error(dx, finite_differences(x, loss)), kFdTol) << at;
    EXPECT_LT(max_rel_error(dgamma, finite_differences(gamma, loss)), kFdTol) << at;
    EXPECT_LT(max_rel_error(dbeta, finite_differences(beta, loss)), kFdTol) << at;
  }
}

// layer_norm_train: y as layer_norm gives it, mean and rstd as the reference computes them; a
// constant row normalises to beta exactly, with its value as mean and var 0.
TEST(BackwardLayerNorm, TrainForwardMatchesReference) {
  std::mt19937 rng(31);
  for (const Shape& shape : {Shape{7, 13}, Shape{3, 5, 64}, Shape{64, 768}, Shape{4, 1}}) {
    const int64_t C = shape[shape.rank() - 1], R = shape.numel() / C;
    Tensor x = random_tensor(shape, rng, -2.f, 3.f);
    const Tensor gamma = random_tensor({C}, rng, 0.5f, 1.5f), beta = random_tensor({C}, rng);
    float* row = x.data<float>() + (R / 2) * C;  // one constant row
    for (int64_t c = 0; c < C; ++c) row[c] = 0.375f;
    const float eps = 1e-5f;
    Tensor y = Tensor::empty(shape), mean = Tensor::empty({R}), rstd = Tensor::empty({R});
    Tensor want_y = Tensor::empty(shape), want_mean = Tensor::empty({R}), want_rstd = Tensor::empty({R});
    Tensor plain_y = Tensor::empty(shape);
    ASSERT_TRUE(IsOk(ops::layer_norm_train(x, gamma, beta, eps, y, mean, rstd)));
    ASSERT_TRUE(IsOk(ref::layer_norm_train(x, gamma, beta, eps, want_y, want_mean, want_rstd)));
    ASSERT_TRUE(IsOk(ops::layer_norm(x, gamma, beta, eps, plain_y)));
    EXPECT_LT(max_rel_error(y, want_y), kFastTol) << shape.str();
    EXPECT_LT(max_rel_error(mean, want_mean), kFastTol) << shape.str();
    EXPECT_LT(max_rel_error(rstd, want_rstd), kFastTol) << shape.str();
    EXPECT_LT(max_rel_error(y, plain_y), kFastTol) << shape.str();
    EXPECT_EQ(mean.at({R / 2}), 0.375f);
    EXPECT_EQ(rstd.at({R / 2}), static_cast<float>(1.0 / std::sqrt(static_cast<double>(eps))));
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(y.data<float>()[(R / 2) * C + c], beta.at({c}));
  }
  // The statistics may also have x's leading shape, and x may be overwritten (in place).
  const Tensor x = random_tensor({2, 3, 8}, rng), gamma = Tensor::full({8}, 1.f), beta = Tensor::zeros({8});
  Tensor want_y = Tensor::empty({2, 3, 8}), want_mean = Tensor::empty({6}), want_rstd = Tensor::empty({6});
  ASSERT_TRUE(IsOk(ref::layer_norm_train(x, gamma, beta, 1e-5f, want_y, want_mean, want_rstd)));
  Tensor y = x.clone(), mean = Tensor::empty({2, 3}), rstd = Tensor::empty({2, 3});
  ASSERT_TRUE(IsOk(ops::layer_norm_train(y, gamma, beta, 1e-5f, y, mean, rstd)));
  EXPECT_LT(max_rel_error(y, want_y), kFastTol);
  EXPECT_LT(max_rel_error(mean.reshape({6}), want_mean), kFastTol);
  EXPECT_LT(max_rel_error(rstd.reshape({6}), want_rstd), kFastTol);
}

// dx, dgamma and dbeta from the kept statistics, x and the parameter gradients also as strided
// views, dgamma and dbeta added to what they held, any of them null.
TEST(BackwardLayerNorm, FastMatchesReference) {
  std::mt19937 rng(32);
  for (const Shape& shape : {Shape{7, 13}, Shape{3, 5, 64}, Shape{64, 768}, Shape{5, 1}, Shape{1, 384}}) {
    const int64_t C = shape[shape.rank() - 1], R = shape.numel() / C;
    const Tensor x = random_tensor(shape, rng, -2.f, 3.f), dy = random_tensor(shape, rng);
    const Tensor gamma = random_tensor({C}, rng, 0.5f, 1.5f), beta = random_tensor({C}, rng);
    const float eps = 1e-5f;
    Tensor y = Tensor::empty(shape), mean = Tensor::empty({R}), rstd = Tensor::empty({R});
    ASSERT_TRUE(IsOk(ref::layer_norm_train(x, gamma, beta, eps, y, mean, rstd)));
    const Tensor dgamma0 = random_tensor({C}, rng), dbeta0 = random_tensor({C}, rng);
    Tensor want_dx = Tensor::empty(shape), want_dgamma = Tensor::zeros({C}), want_dbeta = Tensor::zeros({C});
    ASSERT_TRUE(
        IsOk(ref::layer_norm_backward(x, gamma, mean, rstd, dy, &want_dx, &want_dgamma, &want_dbeta)));
    for (int mask = 1; mask < 8; ++mask) {
      Tensor dx = Tensor::full(shape, 7.f);
      Tensor dgamma = Tensor::zeros({C, 2}).select(1, 1), dbeta = Tensor::zeros({C});  // dgamma: stride 2
      ASSERT_TRUE(IsOk(ops::layer_norm_backward(x, gamma, mean, rstd, dy, mask & 1 ? &dx : nullptr,
                                                mask & 2 ? &dgamma : nullptr, mask & 4 ? &dbeta : nullptr)));
      const std::string at = shape.str() + " mask " + std::to_string(mask);
      EXPECT_LT(max_rel_error(dx, mask & 1 ? want_dx : Tensor::full(shape, 7.f)), kFastTol) << at;
      EXPECT_LT(max_rel_error(dgamma, mask & 2 ? want_dgamma : Tensor::zeros({C})), kFastTol) << at;
      EXPECT_LT(max_rel_error(dbeta, mask & 4 ? want_dbeta : Tensor::zeros({C})), kFastTol) << at;
    }
    // Accumulation onto what the parameter gradients held; dx through a strided x.
    Tensor dgamma = dgamma0.clone(), dbeta = dbeta0.clone(), sum_gamma = Tensor::empty({C}),
           sum_beta = Tensor::empty({C});
    ASSERT_TRUE(IsOk(ops::layer_norm_backward(x, gamma, mean, rstd, dy, nullptr, &dgamma, &dbeta)));
    ASSERT_TRUE(IsOk(ops::add(dgamma0, want_dgamma, sum_gamma)));
    ASSERT_TRUE(IsOk(ops::add(dbeta0, want_dbeta, sum_beta)));
    EXPECT_LT(max_rel_error(dgamma, sum_gamma), kFastTol) << shape.str();
    EXPECT_LT(max_rel_error(dbeta, sum_beta), kFastTol) << shape.str();
    if (shape.rank() == 2) {
      Tensor dx = transposed_copy(Tensor::zeros(shape));
      ASSERT_TRUE(IsOk(ops::layer_norm_backward(transposed_copy(x), gamma, mean, rstd, transposed_copy(dy),
                                                &dx, nullptr, nullptr)));
      EXPECT_LT(max_rel_error(dx, want_dx), kFastTol) << shape.str() << " strided";
    }
    Tensor in_place = dy.clone();  // dx = dy works too, though ops.h does not promise it
    ASSERT_TRUE(IsOk(ops::layer_norm_backward(x, gamma, mean, rstd, in_place, &in_place, nullptr, nullptr)));
    EXPECT_LT(max_rel_error(in_place, want_dx), kFastTol) << shape.str() << " in place";
  }
}

TEST(BackwardLayerNorm, Refusals) {
  const Tensor x = Tensor::zeros({4, 6}), gamma = Tensor::full({6}, 1.f), beta = Tensor::zeros({6});
  Tensor y = Tensor::empty({4, 6}), mean = Tensor::empty({4}), rstd = Tensor::empty({4}),
         short_stat = Tensor::empty({3});
  EXPECT_TRUE(SameRefusal(ops::layer_norm_train(x, gamma, beta, 1e-5f, y, short_stat, rstd),
                          ref::layer_norm_train(x, gamma, beta, 1e-5f, y, short_stat, rstd)));
  EXPECT_TRUE(contains(ops::layer_norm_train(x, gamma, beta, 1e-5f, y, short_stat, rstd),
                       "mean f32 (3) should be contiguous (4), one value per row of x f32 (4, 6)"));
  EXPECT_TRUE(contains(ops::layer_norm_train(x, gamma, beta, 0.f, y, mean, rstd), "eps must be > 0"));
  Tensor dx = Tensor::empty({4, 6}), dgamma = Tensor::zeros({5});
  const Status st = ops::layer_norm_backward(x, gamma, mean, rstd, x, &dx, &dgamma, nullptr);
  EXPECT_TRUE(SameRefusal(st, ref::layer_norm_backward(x, gamma, mean, rstd, x, &dx, &dgamma, nullptr)));
  EXPECT_TRUE(contains(st, "ops::layer_norm_backward: dgamma f32 (5) should be (6)"));
  EXPECT_TRUE(contains(ref::layer_norm_backward(x, gamma, f64(mean), rstd, x, &dx, nullptr, nullptr),
                       "mean is f64 (4) but x is f32 (4, 6)"));
}

// ---------------------------------------------------------------------------------------------
// softmax

TEST(BackwardSoftmax, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(4);
  Tensor x = f64(random_tensor({2, 3, 11}, rng, -3.f, 3.f));
  const Tensor dy = f64(random_tensor({2, 3, 11}, rng));
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  auto loss = [&] {
    EXPECT_TRUE(IsOk(ref::softmax(x, y)));
    return dot(dy, y);
  };
  loss();
  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  ASSERT_TRUE(IsOk(ref::softmax_backward(y, dy, dx)));
  EXPECT_LT(max_rel_error(dx, finite_differences(x, loss)), kFdTol);
}

// Random rows, fully masked rows (y = 0: dx = 0), dx in place of dy, y as a strided view.
TEST(BackwardSoftmax, FastMatchesReference) {
  std::mt19937 rng(41);
  for (const Shape& shape : {Shape{1}, Shape{7, 13}, Shape{2, 3, 11}, Shape{64, 1000}}) {
    Tensor x = random_tensor(shape, rng, -4.f, 4.f);
    const int64_t C = shape[shape.rank() - 1];
    if (shape.numel() > C)
      for (int64_t c = 0; c < C; ++c) x.data<float>()[C + c] = -kInf;  // row 1 fully masked
    Tensor y = Tensor::empty(shape);
    ASSERT_TRUE(IsOk(ops::softmax(x, y)));
    const Tensor dy = random_tensor(shape, rng);
    Tensor dx = Tensor::empty(shape), want = Tensor::empty(shape);
    ASSERT_TRUE(IsOk(ops::softmax_backward(y, dy, dx)));
    ASSERT_TRUE(IsOk(ref::softmax_backward(y, dy, want)));
    EXPECT_LT(max_rel_error(dx, want), kFastTol) << shape.str();
    for (int64_t c = 0; shape.numel() > C && c < C; ++c) EXPECT_EQ(dx.data<float>()[C + c], 0.f);
    Tensor in_place = dy.clone();
    ASSERT_TRUE(IsOk(ops::softmax_backward(y, in_place, in_place)));
    EXPECT_LT(max_rel_error(in_place, want), kFastTol) << shape.str() << " in place";
    if (shape.rank() == 2) {
      Tensor strided = transposed_copy(Tensor::zeros(shape));
      ASSERT_TRUE(IsOk(ops::softmax_backward(transposed_copy(y), dy, strided)));
      EXPECT_LT(max_rel_error(strided, want), kFastTol) << shape.str() << " strided";
    }
  }
}

TEST(BackwardSoftmax, Refusals) {
  const Tensor y = Tensor::zeros({3, 4}), dy = Tensor::zeros({4, 3});
  Tensor dx = Tensor::empty({3, 4});
  EXPECT_TRUE(SameRefusal(ops::softmax_backward(y, dy, dx), ref::softmax_backward(y, dy, dx)));
  EXPECT_TRUE(contains(ops::softmax_backward(y, dy, dx),
                       "ops::softmax_backward: dy f32 (4, 3) does not match y f32 (3, 4)"));
  Tensor scalar = Tensor::zeros({});
  EXPECT_TRUE(contains(ops::softmax_backward(scalar, scalar, scalar), "y needs rank >= 1"));
  Tensor dx64 = Tensor::empty({3, 4}, DType::f64);
  EXPECT_TRUE(contains(ref::softmax_backward(y, y, dx64), "dx is f64 (3, 4) but y is f32 (3, 4)"));
  EXPECT_TRUE(contains(ref::softmax(y, dx64), "y is f64 (3, 4) but x is f32 (3, 4)"));
}

// ---------------------------------------------------------------------------------------------
// embedding: dtable[v] += Σ_{i: ids[i] = v} dy[i]

TEST(BackwardEmbedding, ReferenceMatchesFiniteDifferencesAndAHandExample) {
  const Tensor ids = Tensor::from_ids({2, 2}, {1, 0, 1, 3});
  const Tensor dy = Tensor::from_vector({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor dtable = Tensor::full({4, 2}, 0.5f);
  ASSERT_TRUE(IsOk(ref::embedding_backward(ids, dy, dtable)));
  EXPECT_EQ(dtable.to_vector(), (std::vector<float>{3.5f, 4.5f, 6.5f, 8.5f, 0.5f, 0.5f, 7.5f, 8.5f}));

  std::mt19937 rng(5);
  Tensor table = f64(random_tensor({4, 3}, rng));
  const Tensor dy3 = f64(random_tensor({2, 2, 3}, rng));
  auto loss = [&] {  // the lookup y[i] = table[ids[i]], written out
    double s = 0.0;
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t c = 0; c < 3; ++c)
        s += dy3.data<double>()[i * 3 + c] * table.data<double>()[ids.data<int32_t>()[i] * 3 + c];
    return s;
  };
  Tensor g = Tensor::zeros({4, 3}, DType::f64);
  ASSERT_TRUE(IsOk(ref::embedding_backward(ids, dy3, g)));
  EXPECT_LT(max_rel_error(g, finite_differences(table, loss)), kFdTol);
}

// Many repeated ids (rows that add into the same table row), ids of rank 2, a strided table
// gradient, accumulation onto what it held; the same bits on every run.
TEST(BackwardEmbedding, FastMatchesReference) {
  std::mt19937 rng(51);
  for (auto [n, V, C] :
       {std::tuple<int64_t, int64_t, int64_t>{5, 3, 1}, {7, 11, 13}, {1000, 50, 768}, {64, 5, 3000}}) {
    std::vector<int32_t> idv(static_cast<size_t>(n));
    for (int32_t& id : idv) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
    const Tensor ids = n % 2 ? Tensor::from_ids({n}, idv) : Tensor::from_ids({2, n / 2}, idv);
    const Shape dy_shape = ids.rank() == 1 ? Shape{n, C} : Shape{2, n / 2, C};
    const Tensor dy = random_tensor(dy_shape, rng), dtable0 = random_tensor({V, C}, rng);
    Tensor fast = dtable0.clone(), want = dtable0.clone();
    ASSERT_TRUE(IsOk(ops::embedding_backward(ids, dy, fast)));
    ASSERT_TRUE(IsOk(ref::embedding_backward(ids, dy, want)));
    const std::string at = shape_of({n, V, C});
    EXPECT_LT(max_rel_error(fast, want), kFastTol) << at;
    Tensor view = transposed_copy(dtable0);  // (V, C), strides (1, V)
    ASSERT_TRUE(IsOk(ops::embedding_backward(ids, dy, view)));
    EXPECT_LT(max_rel_error(view, want), kFastTol) << at << " strided";
    Tensor again = dtable0.clone();
    ASSERT_TRUE(IsOk(ops::embedding_backward(ids, dy, again)));
    EXPECT_EQ(testing_util::bytes_of(again), testing_util::bytes_of(fast)) << at;
  }
}

TEST(BackwardEmbedding, Refusals) {
  const Tensor ids = Tensor::from_ids({4}, {0, 2, 5, 1}), dy = Tensor::zeros({4, 3});
  Tensor dtable = Tensor::zeros({5, 3});
  const Status bad = ops::embedding_backward(ids, dy, dtable);
  EXPECT_TRUE(SameRefusal(bad, ref::embedding_backward(ids, dy, dtable)));
  EXPECT_TRUE(contains(bad, "token id 5 at position 2 is outside the vocabulary [0, 5)")) << bad.message();
  EXPECT_EQ(dtable.to_vector(), std::vector<float>(15, 0.f));  // nothing added before the refusal
  const Tensor ok_ids = Tensor::from_ids({4}, {0, 2, 4, 1}), dy4 = Tensor::zeros({4, 4});
  EXPECT_TRUE(SameRefusal(ops::embedding_backward(ok_ids, dy4, dtable),
                          ref::embedding_backward(ok_ids, dy4, dtable)));
  EXPECT_TRUE(contains(ops::embedding_backward(ok_ids, dy4, dtable), "dy f32 (4, 4) should be ids (4) x 3"));
  EXPECT_TRUE(contains(ops::embedding_backward(dy, dy, dtable), "ids must be i32, got f32 (4, 3)"));
}

// ---------------------------------------------------------------------------------------------
// cross-entropy

TEST(BackwardCrossEntropy, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(6);
  const float scale = 0.25f;
  for (float smoothing : {0.f, 0.1f}) {
    Tensor logits = f64(random_tensor({6, 9}, rng, -4.f, 4.f));
    const Tensor targets = Tensor::from_ids({6}, {3, -1, 0, 8, -1, 3});
    auto loss = [&] {
      double sum = 0.0;
      int64_t counted = 0;
      EXPECT_TRUE(IsOk(ref::cross_entropy(logits, targets, smoothing, &sum, &counted)));
      return scale * sum;
    };
    Tensor dlogits = Tensor::empty({6, 9}, DType::f64);
    double sum = 0.0;
    int64_t counted = 0;
    ASSERT_TRUE(IsOk(ref::cross_entropy(logits, targets, smoothing, &sum, &counted, &dlogits, scale)));
    EXPECT_EQ(counted, 4);
    EXPECT_LT(max_rel_error(dlogits, finite_differences(logits, loss)), kFdTol) << "smoothing " << smoothing;
  }
}

// Both paths on one call: the loss sum, the count and (when asked) dlogits.
struct CrossEntropy {
  double loss = 0.0;
  int64_t counted = -1;
  Tensor dlogits;
};
CrossEntropy cross_entropy_of(bool fast, const Tensor& logits, const Tensor& targets, float smoothing = 0.f,
                              float scale = 1.f) {
  CrossEntropy r;
  r.dlogits = Tensor::full(logits.shape(), 7.f);
  const Status st =
      fast ? ops::cross_entropy(logits, targets, smoothing, &r.loss, &r.counted, &r.dlogits, scale)
           : ref::cross_entropy(logits, targets, smoothing, &r.loss, &r.counted, &r.dlogits, scale);
  EXPECT_TRUE(IsOk(st));
  return r;
}

TEST(BackwardCrossEntropy, HandComputedExamples) {
  const Tensor logits = Tensor::from_vector({1, 3}, {1.f, 2.f, 3.f});
  const double s = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  for (bool fast : {true, false}) {
    const char* path = fast ? "fast" : "ref";
    // target 2: -log softmax_2 = log(1 + e^-1 + e^-2); dlogits = softmax - one_hot(2)
    CrossEntropy r = cross_entropy_of(fast, logits, Tensor::from_ids({1}, {2}));
    EXPECT_NEAR(r.loss, std::log(1.0 + std::exp(-1.0) + std::exp(-2.0)), 1e-6) << path;
    EXPECT_EQ(r.counted, 1) << path;
    const std::vector<double> want = {std::exp(1.0) / s, std::exp(2.0) / s, std::exp(3.0) / s - 1.0};
    for (int v = 0; v < 3; ++v) EXPECT_NEAR(r.dlogits.at({0, v}), want[v], 1e-6) << path << " v=" << v;
    // Label smoothing 0.3: q = 0.7 one_hot(0) + 0.1; loss = -Σ q log p; scale 0.5 on the gradient.
    r = cross_entropy_of(fast, logits, Tensor::from_ids({1}, {0}), 0.3f, 0.5f);
    const double logp[] = {1.0 - std::log(s), 2.0 - std::log(s), 3.0 - std::log(s)};
    const double q[] = {0.8, 0.1, 0.1};
    EXPECT_NEAR(r.loss, -(q[0] * logp[0] + q[1] * logp[1] + q[2] * logp[2]), 1e-6) << path;
    for (int v = 0; v < 3; ++v)
      EXPECT_NEAR(r.dlogits.at({0, v}), 0.5 * (std::exp(logp[v]) - q[v]), 1e-6) << path << " v=" << v;
  }
}

// Rows with target -1 add no loss, are not counted and get zero gradient rows.
TEST(BackwardCrossEntropy, IgnoredRowsAndTheCount) {
  std::mt19937 rng(61);
  const Tensor logits = random_tensor({4, 6}, rng, -3.f, 3.f);
  const Tensor targets = Tensor::from_ids({4}, {-1, 2, -1, 5});
  for (bool fast : {true, false}) {
    const CrossEntropy all = cross_entropy_of(fast, logits, targets, 0.1f, 2.f);
    EXPECT_EQ(all.counted, 2);
    double sum = 0.0;
    for (int64_t i : {1, 3}) {
      const CrossEntropy one =
          cross_entropy_of(fast, logits.slice(0, i, i + 1), targets.slice(0, i, i + 1), 0.1f, 2.f);
      sum += one.loss;
      for (int64_t v = 0; v < 6; ++v) EXPECT_EQ(all.dlogits.at({i, v}), one.dlogits.at({0, v}));
    }
    EXPECT_NEAR(all.loss, sum, 1e-12);
    for (int64_t i : {0, 2})
      for (int64_t v = 0; v < 6; ++v) EXPECT_EQ(all.dlogits.at({i, v}), 0.f);
    const CrossEntropy none = cross_entropy_of(fast, logits, Tensor::from_ids({4}, {-1, -1, -1, -1}));
    EXPECT_EQ(none.counted, 0);
    EXPECT_EQ(none.loss, 0.0);
  }
}

// Odd and LM-sized vocabularies (50257: several blocks of rows), smoothing, scale, dlogits null
// (the loss alone) and in place of the logits. The loss sum holds to 1e-6 relative: the fast
// path's log-sum-exp comes from f32 softmax sums (measured 1.8e-7 at V = 50257).
TEST(BackwardCrossEntropy, FastMatchesReference) {
  std::mt19937 rng(62);
  for (auto [N, V] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {33, 1000}, {64, 50257}}) {
    const Tensor logits = random_tensor({N, V}, rng, -8.f, 8.f);
    std::vector<int32_t> t(static_cast<size_t>(N));
    for (int32_t& id : t) id = rng() % 5 == 0 ? -1 : static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
    const Tensor targets = Tensor::from_ids({N}, t);
    for (float smoothing : {0.f, 0.1f}) {
      const CrossEntropy fast = cross_entropy_of(true, logits, targets, smoothing, 1.f / N);
      const CrossEntropy want = cross_entropy_of(false, logits, targets, smoothing, 1.f / N);
      const std::string at = shape_of({N, V}) + " smoothing " + std::to_string(smoothing);
      EXPECT_EQ(fast.counted, want.counted) << at;
      EXPECT_LE(std::fabs(fast.loss - want.loss), 1e-6 * std::max(1.0, std::fabs(want.loss))) << at;
      EXPECT_LT(max_rel_error(fast.dlogits, want.dlogits), kFastTol) << at;
      double loss_only = 0.0;
      int64_t counted = 0;
      ASSERT_TRUE(IsOk(ops::cross_entropy(logits, targets, smoothing, &loss_only, &counted)));
      EXPECT_EQ(loss_only, fast.loss) << at;
      Tensor in_place = logits.clone();
      ASSERT_TRUE(
          IsOk(ops::cross_entropy(in_place, targets, smoothing, &loss_only, &counted, &in_place, 1.f / N)));
      EXPECT_EQ(loss_only, fast.loss) << at;
      EXPECT_EQ(max_rel_error(in_place, fast.dlogits), 0.0) << at;
    }
  }
}

// -inf logits (a masked vocabulary), a row of nothing but -inf, huge logits: the gradient stays
// finite; the loss is finite where the target's probability is not 0, else +inf, never NaN.
TEST(BackwardCrossEntropy, InfiniteAndHugeLogitsStayFinite) {
  const float big = 3e38f;
  const Tensor logits = Tensor::from_vector({4, 3}, {-kInf, 0.f, 1.f,      // masked entry, finite loss
                                                     -kInf, -kInf, -kInf,  // nothing left: +inf
                                                     big, -big, 0.f,       // huge: loss 2·big
                                                     -kInf, 2.f, 0.f});    // target masked: +inf
  const Tensor targets = Tensor::from_ids({4}, {1, 0, 1, 0});
  const double inf = std::numeric_limits<double>::infinity();
  const double want_loss[] = {std::log(1.0 + std::exp(1.0)), inf, 2.0 * big, inf};
  for (bool fast : {true, false}) {
    const char* path = fast ? "fast" : "ref";
    for (int64_t i = 0; i < 4; ++i) {
      const CrossEntropy r = cross_entropy_of(fast, logits.slice(0, i, i + 1), targets.slice(0, i, i + 1));
      for (int64_t v = 0; v < 3; ++v)
        EXPECT_TRUE(std::isfinite(r.dlogits.at({0, v}))) << path << " row " << i;
      const double want = want_loss[i];
      EXPECT_TRUE(want == inf ? r.loss == inf : std::fabs(r.loss - want) <= 1e-6 * std::max(1.0, want))
          << path << " row " << i << ": loss " << r.loss << ", want " << want;
    }
    // Under smoothing a masked entry has q = ε/V > 0: the loss is +inf, the gradient still finite.
    const CrossEntropy smoothed = cross_entropy_of(fast, logits.slice(0, 0, 1), targets.slice(0, 0, 1), 0.1f);
    EXPECT_EQ(smoothed.loss, std::numeric_limits<double>::infinity()) << path;
    EXPECT_NEAR(smoothed.dlogits.at({0, 0}), -0.1 / 3, 1e-7) << path;
  }
}

TEST(BackwardCrossEntropy, Refusals) {
  const Tensor logits = Tensor::zeros({4, 5});
  double loss = 0.0;
  int64_t counted = 0;
  const Tensor bad = Tensor::from_ids({4}, {0, -1, 4, 5});
  const Status st = ops::cross_entropy(logits, bad, 0.f, &loss, &counted);
  EXPECT_TRUE(SameRefusal(st, ref::cross_entropy(logits, bad, 0.f, &loss, &counted)));
  EXPECT_EQ(st.code(), Code::out_of_range);
  EXPECT_TRUE(contains(st, "ops::cross_entropy: target 5 at row 3 is outside [-1, 5)")) << st.message();
  EXPECT_TRUE(contains(ops::cross_entropy(logits, Tensor::from_ids({4}, {0, -2, 0, 0}), 0.f, &loss, &counted),
                       "target -2 at row 1"));
  const Tensor targets = Tensor::from_ids({4}, {0, 1, 2, 3});
  EXPECT_TRUE(contains(ops::cross_entropy(logits, targets, 1.f, &loss, &counted),
                       "label_smoothing must be in [0, 1), got 1"));
  EXPECT_TRUE(contains(ops::cross_entropy(logits, Tensor::from_ids({3}, {0, 1, 2}), 0.f, &loss, &counted),
                       "targets should be i32 (4) for logits f32 (4, 5), got i32 (3)"));
  Tensor wide = Tensor::empty({4, 6}), overlapping = Tensor::zeros({5, 5});
  EXPECT_TRUE(SameRefusal(ops::cross_entropy(logits, targets, 0.f, &loss, &counted, &wide),
                          ref::cross_entropy(logits, targets, 0.f, &loss, &counted, &wide)));
  Tensor lower = overlapping.slice(0, 1, 5);
  EXPECT_TRUE(contains(ops::cross_entropy(overlapping.slice(0, 0, 4), targets, 0.f, &loss, &counted, &lower),
                       "overlaps logits without being them"));
  Tensor d64 = Tensor::empty({4, 5}, DType::f64);
  EXPECT_TRUE(contains(ref::cross_entropy(logits, targets, 0.f, &loss, &counted, &d64),
                       "dlogits is f64 (4, 5) but logits is f32 (4, 5)"));
}

// ---------------------------------------------------------------------------------------------
// PyTorch autograd (made by tools/reference/make_backward_op_fixtures.py; results in float64,
// stored rounded to f32, the losses as decimal float64 in the metadata)

TEST(BackwardTorch, CrossEntropyLayerNormAndActivationsMatchAutograd) {
  Result<safetensors::File> file =
      safetensors::File::open(std::string(TESSERA_TEST_DATA) + "/reference/backward_ops.safetensors");
  ASSERT_TRUE(IsOk(file.status()));
  auto get = [&](const std::string& name) {
    Result<Tensor> t = file->get(name);
    EXPECT_TRUE(IsOk(t.status())) << name;
    return t.ok() ? t.value().clone() : Tensor::zeros({1});
  };
  // Against PyTorch's f32-rounded results: the reference in f64 to that rounding, both paths in
  // f32 to their own tolerance.
  const double kRounded = 1e-7;
  const Tensor logits = get("ce.logits"), targets = get("ce.targets");
  for (const char* eps_name : {"eps0", "eps01"}) {
    const float eps = std::string(eps_name) == "eps0" ? 0.f : 0.1f;
    const double want_loss = std::stod(file->metadata().at(std::string("ce.loss_") + eps_name));
    const Tensor want = get(std::string("ce.dlogits_") + eps_name);
    for (int path = 0; path < 3; ++path) {  // fast, reference f32, reference f64
      const Tensor in = path == 2 ? f64(logits) : logits;
      Tensor dlogits = Tensor::empty(in.shape(), in.dtype());
      double loss = 0.0;
      int64_t counted = 0;
      ASSERT_TRUE(IsOk(path == 0 ? ops::cross_entropy(in, targets, eps, &loss, &counted, &dlogits)
                                 : ref::cross_entropy(in, targets, eps, &loss, &counted, &dlogits)));
      EXPECT_EQ(counted, 4);
      EXPECT_NEAR(loss, want_loss, (path == 2 ? 1e-12 : 1e-6) * want_loss) << eps_name << " path " << path;
      EXPECT_LT(max_rel_error(dlogits, want), path == 2 ? kRounded : kFastTol)
          << eps_name << " path " << path;
    }
  }

  const Tensor x = get("ln.x"), dy = get("ln.dy"), gamma = get("ln.gamma"), beta = get("ln.beta");
  for (int path = 0; path < 3; ++path) {
    auto in = [&](const Tensor& t) { return path == 2 ? f64(t) : t; };
    const DType dt = path == 2 ? DType::f64 : DType::f32;
    Tensor y = Tensor::empty({5, 24}, dt), mean = Tensor::empty({5}, dt), rstd = Tensor::empty({5}, dt);
    Tensor dx = Tensor::empty({5, 24}, dt), dgamma = Tensor::zeros({24}, dt), dbeta = Tensor::zeros({24}, dt);
    if (path == 0) {
      ASSERT_TRUE(IsOk(ops::layer_norm_train(x, gamma, beta, 1e-5f, y, mean, rstd)));
      ASSERT_TRUE(IsOk(ops::layer_norm_backward(x, gamma, mean, rstd, dy, &dx, &dgamma, &dbeta)));
    } else {
      ASSERT_TRUE(IsOk(ref::layer_norm_train(in(x), in(gamma), in(beta), 1e-5f, y, mean, rstd)));
      ASSERT_TRUE(IsOk(ref::layer_norm_backward(in(x), in(gamma), mean, rstd, in(dy), &dx, &dgamma, &dbeta)));
    }
    const double tol = path == 2 ? kRounded : kFastTol;
    EXPECT_LT(max_rel_error(y, get("ln.y")), tol) << "path " << path;
    EXPECT_LT(max_rel_error(dx, get("ln.dx")), tol) << "path " << path;
    EXPECT_LT(max_rel_error(dgamma, get("ln.dgamma")), tol) << "path " << path;
    EXPECT_LT(max_rel_error(dbeta, get("ln.dbeta")), tol) << "path " << path;
  }

  const Tensor ax = get("act.x"), ady = get("act.dy");
  for (auto [act, name] : {std::pair{Activation::relu, "relu"}, std::pair{Activation::gelu_erf, "gelu_erf"},
                           std::pair{Activation::gelu_tanh, "gelu_tanh"}}) {
    const Tensor want = get(std::string("act.dx_") + name);
    Tensor fast = Tensor::empty({64}), ref64 = Tensor::empty({64}, DType::f64);
    ASSERT_TRUE(IsOk(ops::activation_backward(act, ax, ady, fast)));
    ASSERT_TRUE(IsOk(ref::activation_backward(act, f64(ax), f64(ady), ref64)));
    EXPECT_LT(max_rel_error(fast, want), kFastTol) << name;
    EXPECT_LT(max_rel_error(ref64, want), kRounded) << name;
  }
}

// ---------------------------------------------------------------------------------------------
// threads

// Every training op from four threads at once (cached primitives, per-thread scratch), each
// thread on its own shapes and on shapes another thread uses too: the results of one thread alone.
TEST(BackwardThreads, OpsRunFromSeveralThreadsAtOnce) {
  struct Case {
    Tensor x, w, dy, gamma, ids, targets;
    Tensor dx, dw, ln_dx, dgamma, sm_dx, dtable, dlogits;
    double loss = 0.0;
  };
  // One case through every op; the gradients land in c.
  auto run = [](Case& c) {
    const int64_t M = c.x.dim(0), K = c.x.dim(1), N = c.w.dim(1);
    c.dx = Tensor::empty({M, K});
    c.dw = Tensor::zeros({K, N});
    Tensor y = Tensor::empty({M, N}), act_dy = Tensor::empty({M, N});
    bool ok = ops::linear_plain(c.x, c.w, Tensor(), y).ok() &&
              ops::activation_backward(Activation::gelu_erf, y, c.dy, act_dy).ok() &&
              ops::linear_backward(c.x, c.w, act_dy, &c.dx, &c.dw, nullptr).ok();
    Tensor ln_y = Tensor::empty({M, K}), mean = Tensor::empty({M}), rstd = Tensor::empty({M});
    c.ln_dx = Tensor::empty({M, K});
    c.dgamma = Tensor::zeros({K});
    ok = ok && ops::layer_norm_train(c.x, c.gamma, c.gamma, 1e-5f, ln_y, mean, rstd).ok() &&
         ops::layer_norm_backward(c.x, c.gamma, mean, rstd, c.dx, &c.ln_dx, &c.dgamma, nullptr).ok();
    Tensor p = Tensor::empty({M, N});
    c.sm_dx = Tensor::empty({M, N});
    ok = ok && ops::softmax(y, p).ok() && ops::softmax_backward(p, c.dy, c.sm_dx).ok();
    c.dtable = Tensor::zeros({N, K});
    c.dlogits = Tensor::empty({M, N});
    int64_t counted = 0;
    ok = ok && ops::embedding_backward(c.ids, c.x, c.dtable).ok() &&
         ops::cross_entropy(y, c.targets, 0.1f, &c.loss, &counted, &c.dlogits, 0.5f).ok();
    return ok;
  };
  std::mt19937 rng(71);
  std::vector<Case> cases;
  for (auto [M, K, N] :
       {std::tuple<int64_t, int64_t, int64_t>{7, 13, 5}, {33, 64, 100}, {7, 13, 5}, {64, 96, 257}}) {
    Case c;
    c.x = random_tensor({M, K}, rng);
    c.w = random_tensor({K, N}, rng);
    c.dy = random_tensor({M, N}, rng);
    c.gamma = random_tensor({K}, rng, 0.5f, 1.5f);
    std::vector<int32_t> ids(static_cast<size_t>(M)), targets(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) {
      ids[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(N));
      targets[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(N)) - (i % 4 == 0);
    }
    c.ids = Tensor::from_ids({M}, ids);
    c.targets = Tensor::from_ids({M}, targets);
    cases.push_back(c);
  }
  std::vector<Case> alone = cases;
  for (Case& c : alone) ASSERT_TRUE(run(c));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        Case c = cases[static_cast<size_t>(t)];
        const Case& want = alone[static_cast<size_t>(t)];
        const bool same = run(c) && std::fabs(c.loss - want.loss) <= 1e-9 * std::fabs(want.loss);
        const double err = std::max({max_rel_error(c.dx, want.dx), max_rel_error(c.dw, want.dw),
                                     max_rel_error(c.ln_dx, want.ln_dx), max_rel_error(c.dgamma, want.dgamma),
                                     max_rel_error(c.sm_dx, want.sm_dx), max_rel_error(c.dtable, want.dtable),
                                     max_rel_error(c.dlogits, want.dlogits)});
        if (!same || err > 1e-6) ++failures;  // rounding at most: a race would be far off
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}
