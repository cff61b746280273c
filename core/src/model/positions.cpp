// Position encodings computed rather than learned: the sinusoidal table and rotary rotation.
// Learned tables are parameters (pos.table, rel_k, rel_v) and need no code beyond a lookup.
#include <algorithm>
#include <cmath>

#include "layers.h"

namespace tessera::model {

Tensor sinusoidal_table(int64_t T, int64_t C, double base) {
  Tensor pe = Tensor::empty({T, C});
  float* p = pe.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i2 = c - (c % 2);  // 2i
      const double angle = static_cast<double>(t) / std::pow(base, static_cast<double>(i2) / C);
      p[t * C + c] = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  return pe;
}

void apply_rotary(Tensor& x, int64_t dims, double base, RotaryStyle style, int64_t pos0, const int32_t* positions,
                  bool inverse) {
  const int64_t B = x.dim(0), H = x.dim(1), T = x.dim(2);
  const int64_t half = dims / 2;
  // Angles depend on (position, pair) only: compute them once for every position in use.
  int64_t max_pos = pos0 + T - 1;
  if (positions)
    for (int64_t i = 0; i < B * T; ++i) max_pos = std::max<int64_t>(max_pos, positions[i]);
  const int64_t P = max_pos + 1;
  std::vector<float> cos_t(static_cast<size_t>(P * half)), sin_t(static_cast<size_t>(P * half));
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dims));
    for (int64_t p = 0; p < P; ++p) {
      const double a = static_cast<double>(p) * inv_freq;
      cos_t[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(a));
      sin_t[static_cast<size_t>(p * half + i)] = static_cast<float>(inverse ? -std::sin(a) : std::sin(a));
    }
  }
  float* base_ptr = x.data<float>();
  const int64_t sb = x.stride(0), sh = x.stride(1), st = x.stride(2), sd = x.stride(3);
#pragma omp parallel for collapse(2) schedule(static) if (B * H * T * dims > 32768)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        float* row = base_ptr + b * sb + h * sh + t * st;
        const int64_t p = positions ? positions[b * T + t] : pos0 + t;
        const float* c = &cos_t[static_cast<size_t>(p * half)];
        const float* s = &sin_t[static_cast<size_t>(p * half)];
        for (int64_t i = 0; i < half; ++i) {
          const int64_t i1 = style == RotaryStyle::half ? i : 2 * i;
          const int64_t i2 = style == RotaryStyle::half ? i + half : 2 * i + 1;
          const float a = row[i1 * sd], bb = row[i2 * sd];
          row[i1 * sd] = a * c[i] - bb * s[i];
          row[i2 * sd] = bb * c[i] + a * s[i];
        }
      }
}

}  // namespace tessera::model
