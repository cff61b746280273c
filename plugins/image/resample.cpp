// PIL-compatible resampling (Pillow 9.4's Resample.c, 8 bits per channel), operation by operation:
// double coefficients rounded to 22-bit fixed point, a horizontal pass into 8-bit rows, then a
// vertical pass. Any reordering moves some pixels by a level; build with -ffp-contract=off.
#include "resample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tessera::image {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // 22: room for 8-bit values, negative lobes, overflow

double bilinear(double x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return 1.0 - x;
  return 0.0;
}

// Keys' cubic convolution with a = -0.5, written as PIL writes it.
double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// For each output pixel in [begin, end): the first input pixel it reads, how many, and their
// fixed-point weights (ksize slots per output pixel).
struct Taps {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weight;
};

Taps make_taps(int in_size, int out_size, PilFilter filter, int begin, int end) {
  const double support0 = filter == PilFilter::bilinear ? 1.0 : 2.0;
  // PIL computes (in1 - in0) in float for its box; whole-image boxes are exact integers.
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = support0 * filterscale;  // wider when downscaling: the antialiasing
  Taps t;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  const int n = end - begin;
  t.first.resize(n);
  t.count.resize(n);
  t.weight.assign(static_cast<size_t>(n) * t.ksize, 0);
  std::vector<double> k(t.ksize);
  for (int i = 0; i < n; ++i) {
    const int xx = begin + i;
    const double center = 0.0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);  // truncation, as C's (int) cast
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double arg = (static_cast<double>(x + xmin) - center + 0.5) * ss;
      const double w = filter == PilFilter::bilinear ? bilinear(arg) : bicubic(arg);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x)
      if (ww != 0.0) k[x] /= ww;
    int32_t* out = &t.weight[static_cast<size_t>(i) * t.ksize];
    for (int x = 0; x < xmax; ++x)
      out[x] = k[x] < 0 ? static_cast<int32_t>(-0.5 + k[x] * (1 << kPrecisionBits))
                        : static_cast<int32_t>(0.5 + k[x] * (1 << kPrecisionBits));
    t.first[i] = xmin;
    t.count[i] = xmax;
  }
  return t;
}

// Rounds a fixed-point sum (which started at one half) down to 8 bits, clamped.
uint8_t clip8(int32_t sum) {
  const int32_t v = sum >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// One row of the horizontal pass, N interleaved channels at once (N known when compiling, so the
// sums stay in registers).
template <int N>
void horizontal_row(const uint8_t* in, const Taps& tx, int width, uint8_t* out) {
  for (int x = 0; x < width; ++x) {
    const int32_t* k = &tx.weight[static_cast<size_t>(x) * tx.ksize];
    const uint8_t* p = in + static_cast<size_t>(tx.first[x]) * N;
    int32_t sum[N];
    for (int c = 0; c < N; ++c) sum[c] = 1 << (kPrecisionBits - 1);
    for (int i = 0; i < tx.count[x]; ++i)
      for (int c = 0; c < N; ++c) sum[c] += p[i * N + c] * k[i];
    for (int c = 0; c < N; ++c) out[x * N + c] = clip8(sum[c]);
  }
}

}  // namespace

void pil_resize(const uint8_t* src, int width, int height, size_t src_stride, int out_width, int out_height,
                PilFilter filter, Window window, uint8_t* dst) {
  constexpr int C = 3;  // RGB
  // Pillow skips a pass whose size does not change (the pass would be the identity anyway).
  const bool horizontal = out_width != width;
  const bool vertical = out_height != height;
  const Taps ty = make_taps(height, out_height, filter, window.y0, window.y0 + window.height);
  // The input rows the window's output rows read.
  int row_first = height, row_end = 0;
  for (int i = 0; i < window.height; ++i) {
    row_first = std::min(row_first, vertical ? ty.first[i] : window.y0 + i);
    row_end = std::max(row_end, vertical ? ty.first[i] + ty.count[i] : window.y0 + i + 1);
  }
  // Pass 1, horizontal: those rows at the window's width, rounded to 8 bits as PIL stores them.
  // Without it, pass 2 reads the window's columns of `src` directly.
  const int rows = row_end - row_first;
  const size_t mid_stride = horizontal ? static_cast<size_t>(window.width) * C : src_stride;
  std::vector<uint8_t> mid;
  const uint8_t* mid_rows =
      src + static_cast<size_t>(row_first) * src_stride + static_cast<size_t>(window.x0) * C;
  if (horizontal) {
    mid.resize(static_cast<size_t>(rows) * mid_stride);
    const Taps tx = make_taps(width, out_width, filter, window.x0, window.x0 + window.width);
    for (int y = 0; y < rows; ++y)
      horizontal_row<C>(src + static_cast<size_t>(row_first + y) * src_stride, tx, window.width,
                        &mid[static_cast<size_t>(y) * mid_stride]);
    mid_rows = mid.data();
  }
  // Pass 2, vertical: each output row from its input rows of the intermediate image, summed a
  // whole row at a time (integer sums, so the order does not change the result).
  const size_t out_stride = static_cast<size_t>(window.width) * C;
  std::vector<int32_t> sum(vertical ? out_stride : 0);
  for (int y = 0; y < window.height; ++y) {
    uint8_t* out = dst + static_cast<size_t>(y) * out_stride;
    if (!vertical) {
      std::copy_n(mid_rows + static_cast<size_t>(window.y0 + y - row_first) * mid_stride, out_stride, out);
      continue;
    }
    const int32_t* k = &ty.weight[static_cast<size_t>(y) * ty.ksize];
    const uint8_t* base = mid_rows + static_cast<size_t>(ty.first[y] - row_first) * mid_stride;
    std::fill(sum.begin(), sum.end(), 1 << (kPrecisionBits - 1));
    for (int i = 0; i < ty.count[y]; ++i) {
      const uint8_t* in = base + static_cast<size_t>(i) * mid_stride;
      const int32_t w = k[i];
      for (size_t x = 0; x < out_stride; ++x) sum[x] += in[x] * w;
    }
    for (size_t x = 0; x < out_stride; ++x) out[x] = clip8(sum[x]);
  }
}

}  // namespace tessera::image
