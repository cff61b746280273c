// Small helpers shared by the test suites: bytes of a tensor, hex decoding of fixture data,
// random tensors and element-wise comparisons.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

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

// A tensor of this shape, f32 or f64, with values drawn uniformly from [lo, hi).
inline Tensor random_uniform(const Shape& shape, std::mt19937& rng, double lo = -1, double hi = 1,
                             DType dtype = DType::f32) {
  std::uniform_real_distribution<double> u(lo, hi);
  Tensor t = Tensor::empty(shape, DType::f64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return dtype == DType::f64 ? t : t.to(dtype);
}

// The elements of a floating-point tensor, any strides, in row-major order, as double (f32 and
// f64 exactly).
inline std::vector<double> to_doubles(const Tensor& t) {
  const Tensor c = t.dtype() == DType::f64 ? t.contiguous() : t.to(DType::f64);
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}

// max |a - b| over the elements of two tensors of one shape, and max |a|; NaN where any element
// is NaN (or the sizes differ), so that a comparison with a tolerance fails.
inline double max_abs_diff(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size()) return NAN;
  double m = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::fabs(x[i] - y[i]);
    if (std::isnan(d)) return NAN;
    m = std::max(m, d);
  }
  return m;
}
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  return max_abs_diff(to_doubles(a), to_doubles(b));
}
inline double max_abs(const Tensor& a) {
  double m = 0.0;
  for (double x : to_doubles(a)) {
    if (std::isnan(x)) return NAN;
    m = std::max(m, std::fabs(x));
  }
  return m;
}

}  // namespace tessera::testing_util
