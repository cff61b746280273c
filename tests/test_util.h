// Small helpers shared by the test suites: bytes of a tensor, hex decoding of fixture data,
// random tensors, relative errors and the comparison of two ops' refusals.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tessera/ops.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::testing_util {

// "0a1b" -> "\x0a\x1b"
inline std::string hex_decode(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// The raw bytes of a contiguous tensor.
inline std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

// f32 (s), uniform in [lo, hi), drawn from rng.
inline Tensor random_tensor(const Shape& s, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (float& f : v) f = u(rng);
  return Tensor::from_vector(s, v);
}

// A float tensor's values in row-major order, in double (exact for f64, unlike Tensor::at).
inline std::vector<double> values_of(const Tensor& t) {
  if (t.dtype() == DType::f64) {
    const Tensor c = t.contiguous();
    return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
  }
  const std::vector<float> f = t.to_vector();
  return std::vector<double>(f.begin(), f.end());
}

// max |got - want| / max |want|: an error relative to the result's scale, the measure for a
// gradient whose entries range over magnitudes. The scale is over want's finite entries, and the
// error absolute where they are all zeros; +inf when the shapes differ or exactly one side has a
// NaN at some element.
inline double max_rel_error(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape()) return std::numeric_limits<double>::infinity();
  const std::vector<double> g = values_of(got), w = values_of(want);
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) != std::isnan(w[i])) return std::numeric_limits<double>::infinity();
    if (std::isnan(g[i])) continue;
    diff = std::max(diff, g[i] == w[i] ? 0.0 : std::fabs(g[i] - w[i]));  // equal infinities: 0
    if (std::isfinite(w[i])) scale = std::max(scale, std::fabs(w[i]));
  }
  return scale > 0.0 ? diff / scale : diff;
}

// st.ok(), or a failure that shows st's message.
inline ::testing::AssertionResult IsOk(const Status& st) {
  if (st.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << code_name(st.code()) << ": " << st.message();
}

// Both refuse, with the same code and the same message once the op's own name is cut off
// ("ops::softmax: x is undefined" vs "ref::softmax: x is undefined").
inline ::testing::AssertionResult SameRefusal(const Status& fast, const Status& ref) {
  if (fast.ok() || ref.ok())
    return ::testing::AssertionFailure()
           << "expected both to fail; fast: '" << fast.message() << "', ref: '" << ref.message() << "'";
  auto tail = [](const std::string& m) { return m.substr(m.find(": ") + 2); };
  if (fast.code() != ref.code() || tail(fast.message()) != tail(ref.message()))
    return ::testing::AssertionFailure()
           << "fast: " << code_name(fast.code()) << " '" << fast.message()
           << "'\n ref: " << code_name(ref.code()) << " '" << ref.message() << "'";
  return ::testing::AssertionSuccess();
}

// A tensor of this shape, f32 or f64, with values drawn uniformly from [lo, hi) in double (so an
// f64 tensor's values are not f32 values widened).
inline Tensor random_uniform(const Shape& shape, std::mt19937& rng, double lo = -1, double hi = 1,
                             DType dtype = DType::f32) {
  std::uniform_real_distribution<double> u(lo, hi);
  Tensor t = Tensor::empty(shape, DType::f64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return dtype == DType::f64 ? t : t.to(dtype);
}

// max |a - b| over the elements of two tensors of one shape; NaN where any element is NaN (or the
// sizes differ), so that a comparison with a tolerance fails.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = values_of(a), y = values_of(b);
  if (x.size() != y.size()) return NAN;
  double m = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::fabs(x[i] - y[i]);
    if (std::isnan(d)) return NAN;
    m = std::max(m, d);
  }
  return m;
}

// max |a| over a tensor's elements; NaN where any is NaN.
inline double max_abs(const Tensor& a) {
  double m = 0.0;
  for (double x : values_of(a)) {
    if (std::isnan(x)) return NAN;
    m = std::max(m, std::fabs(x));
  }
  return m;
}

// The same shape, dtype and bytes (in row-major order, whatever the strides).
inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// Restores the op thread count when a test changes it.
struct ThreadCount {
  int saved = num_threads();
  ~ThreadCount() { set_num_threads(saved); }
};

// An empty folder of this process's own: TempDir()/<name>_<pid>, emptied if it was there.
inline std::string fresh_temp_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A file's bytes ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace tessera::testing_util
