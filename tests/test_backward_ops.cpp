// The training ops of ops.h: linear on plain weights and its backward, activation, layer norm,
// softmax and embedding backward, cross-entropy. Two checks hold each op:
//   - the reference loop in f64 against central finite differences of the f64 forward, on the
//     scalar L = Σ dy ⊙ y with a random dy (step 1e-6; tolerance 1e-7 relative to the
//     gradient's largest entry: the differences err by about 1e-10 relative here);
//   - the fast path (oneDNN) against the reference loop in f32, on odd and bigger shapes and
//     strided views, with the accumulation (+=) of parameter gradients, null gradients and in
//     place where the contract allows it (tolerance: max |fast - ref| / max |ref| <= kFastTol).
// Plus the refusals, and cross-entropy on hand-computed numbers. Not here: attention's backward
// (test_attention) and whole layers against PyTorch autograd (the parity fixtures).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tessera/ops.h"
#include "test_util.h"

using namespace tessera;
using testing_util::max_rel_error;
using testing_util::random_tensor;
using testing_util::SameRefusal;
using testing_util::values_of;

namespace {

constexpr double kFdTol = 1e-7;  // f64 reference vs finite differences, relative
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// linear: y = x · w + b

TEST(BackwardLinear, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(1);
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{7, 13, 5}, {1, 4, 1}, {3, 1, 6}}) {
    Tensor x = f64(random_tensor({M, K}, rng)), w = f64(random_tensor({K, N}, rng)), b = f64(random_tensor({N}, rng));
    const Tensor dy = f64(random_tensor({M, N}, rng));
    auto loss = [&] {
      Tensor y = Tensor::empty({M, N}, DType::f64);
      EXPECT_TRUE(ref::linear_plain(x, w, b, y).ok());
      return dot(dy, y);
    };
    Tensor dx = Tensor::empty({M, K}, DType::f64), dw = Tensor::zeros({K, N}, DType::f64),
           db = Tensor::zeros({N}, DType::f64);
    ASSERT_TRUE(ref::linear_backward(x, w, dy, &dx, &dw, &db).ok());
    const std::string at = shape_of({M, K, N});
    EXPECT_LT(max_rel_error(dx, finite_differences(x, loss)), kFdTol) << at;
    EXPECT_LT(max_rel_error(dw, finite_differences(w, loss)), kFdTol) << at;
    EXPECT_LT(max_rel_error(db, finite_differences(b, loss)), kFdTol) << at;
  }
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
  EXPECT_NEAR(ref::activate_derivative(Activation::gelu_erf, 1.0), 0.8413447460685429 + 0.24197072451914337, 1e-15);
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
      for (int64_t i = 0; i < x.numel(); ++i) s += dy.data<double>()[i] * ref::activate(act, x.data<double>()[i]);
      return s;
    };
    Tensor dx = Tensor::empty({3, 17}, DType::f64);
    ASSERT_TRUE(ref::activation_backward(act, x, dy, dx).ok());
    EXPECT_LT(max_rel_error(dx, finite_differences(x, loss)), kFdTol) << activation_name(act);
  }
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
      EXPECT_TRUE(ref::layer_norm_train(x, gamma, beta, eps, y, mean, rstd).ok());
      return dot(dy, y);
    };
    loss();  // mean and rstd at x
    Tensor dx = Tensor::empty({R, C}, DType::f64), dgamma = Tensor::zeros({C}, DType::f64),
           dbeta = Tensor::zeros({C}, DType::f64);
    ASSERT_TRUE(ref::layer_norm_backward(x, gamma, mean, rstd, dy, &dx, &dgamma, &dbeta).ok());
    const std::string at = shape_of({R, C});
    EXPECT_LT(max_rel_error(dx, finite_differences(x, loss)), kFdTol) << at;
    EXPECT_LT(max_rel_error(dgamma, finite_differences(gamma, loss)), kFdTol) << at;
    EXPECT_LT(max_rel_error(dbeta, finite_differences(beta, loss)), kFdTol) << at;
  }
}

// ---------------------------------------------------------------------------------------------
// softmax

TEST(BackwardSoftmax, ReferenceMatchesFiniteDifferences) {
  std::mt19937 rng(4);
  Tensor x = f64(random_tensor({2, 3, 11}, rng, -3.f, 3.f));
  const Tensor dy = f64(random_tensor({2, 3, 11}, rng));
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  auto loss = [&] {
    EXPECT_TRUE(ref::softmax(x, y).ok());
    return dot(dy, y);
  };
  loss();
  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  ASSERT_TRUE(ref::softmax_backward(y, dy, dx).ok());
  EXPECT_LT(max_rel_error(dx, finite_differences(x, loss)), kFdTol);
}

// ---------------------------------------------------------------------------------------------
// embedding: dtable[v] += Σ_{i: ids[i] = v} dy[i]

TEST(BackwardEmbedding, ReferenceMatchesFiniteDifferencesAndAHandExample) {
  const Tensor ids = Tensor::from_ids({2, 2}, {1, 0, 1, 3});
  const Tensor dy = Tensor::from_vector({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor dtable = Tensor::full({4, 2}, 0.5f);
  ASSERT_TRUE(ref::embedding_backward(ids, dy, dtable).ok());
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
  ASSERT_TRUE(ref::embedding_backward(ids, dy3, g).ok());
  EXPECT_LT(max_rel_error(g, finite_differences(table, loss)), kFdTol);
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
      EXPECT_TRUE(ref::cross_entropy(logits, targets, smoothing, &sum, &counted).ok());
      return scale * sum;
    };
    Tensor dlogits = Tensor::empty({6, 9}, DType::f64);
    double sum = 0.0;
    int64_t counted = 0;
    ASSERT_TRUE(ref::cross_entropy(logits, targets, smoothing, &sum, &counted, &dlogits, scale).ok());
    EXPECT_EQ(counted, 4);
    EXPECT_LT(max_rel_error(dlogits, finite_differences(logits, loss)), kFdTol) << "smoothing " << smoothing;
  }
}
