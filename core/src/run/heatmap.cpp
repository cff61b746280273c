// Heatmap drawing and PNG encoding (libpng). See heatmap.h.
#include "heatmap.h"

#include <png.h>

#include <algorithm>
#include <cmath>

namespace tessera::run {

void colormap(double t, uint8_t rgb[3]) {
  // Viridis, sampled at 9 points and interpolated linearly: dark blue -> green -> yellow.
  static const double stops[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},  {44, 113, 142}, {33, 144, 141},
                                     {39, 173, 129}, {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0) * 8.0;
  const int i = std::min(static_cast<int>(t), 7);
  const double f = t - i;
  for (int c = 0; c < 3; ++c) rgb[c] = static_cast<uint8_t>(std::lround(stops[i][c] * (1 - f) + stops[i + 1][c] * f));
}

RgbImage heatmap_over_picture(const TokenRows& rows, const std::vector<float>& weight) {
  const Picture& pic = rows.picture;
  RgbImage img;
  if (pic.width <= 0 || pic.height <= 0) return img;
  img.width = pic.width;
  img.height = pic.height;
  img.pixels.resize(static_cast<size_t>(pic.width) * pic.height * 3);
  // The picture, dimmed and grey, so the colours read as the attention.
  for (int y = 0; y < pic.height; ++y)
    for (int x = 0; x < pic.width; ++x) {
      const uint8_t* p = &pic.pixels[(static_cast<size_t>(y) * pic.width + x) * pic.channels];
      const double g = pic.channels == 3 ? 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2] : p[0];
      for (int c = 0; c < 3; ++c) img.pixels[(static_cast<size_t>(y) * pic.width + x) * 3 + c] = static_cast<uint8_t>(g * 0.5);
    }
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = 0; i < rows.size(); ++i)
    if (rows.provenance[static_cast<size_t>(i)].kind != TSR_PROV_NONE) {
      lo = std::min(lo, weight[static_cast<size_t>(i)]);
      hi = std::max(hi, weight[static_cast<size_t>(i)]);
    }
  const double span = hi > lo ? hi - lo : 1.0;
  // Provenance coordinates -> picture pixels. Time × frequency pictures put the lowest band at the
  // bottom, so y grows upwards there.
  const bool flip = !rows.provenance.empty() && std::any_of(rows.provenance.begin(), rows.provenance.end(), [](const tsr_provenance& p) {
    return p.kind == TSR_PROV_TIME_FREQ;
  });
  const double sx = pic.width / (pic.x1 - pic.x0), sy = pic.height / (pic.y1 - pic.y0);
  for (int64_t i = 0; i < rows.size(); ++i) {
    const tsr_provenance& b = rows.provenance[static_cast<size_t>(i)];
    if (b.kind == TSR_PROV_NONE || b.kind == TSR_PROV_BYTES || b.kind == TSR_PROV_RESIDUE) continue;
    uint8_t rgb[3];
    colormap((weight[static_cast<size_t>(i)] - lo) / span, rgb);
    int x0 = static_cast<int>(std::floor((b.x0 - pic.x0) * sx)), x1 = static_cast<int>(std::ceil((b.x1 - pic.x0) * sx));
    int y0 = static_cast<int>(std::floor((b.y0 - pic.y0) * sy)), y1 = static_cast<int>(std::ceil((b.y1 - pic.y0) * sy));
    if (flip) {
      const int t0 = pic.height - y1, t1 = pic.height - y0;
      y0 = t0;
      y1 = t1;
    }
    x0 = std::clamp(x0, 0, pic.width);
    x1 = std::clamp(x1, 0, pic.width);
    y0 = std::clamp(y0, 0, pic.height);
    y1 = std::clamp(y1, 0, pic.height);
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x < x1; ++x) {
        uint8_t* p = &img.pixels[(static_cast<size_t>(y) * img.width + x) * 3];
        for (int c = 0; c < 3; ++c) p[c] = static_cast<uint8_t>(std::lround(0.35 * p[c] + 0.65 * rgb[c]));
      }
  }
  return img;
}

RgbImage heatmap_matrix(const float* a, int n) {
  const int cell = std::max(1, 512 / std::max(n, 1));
  RgbImage img;
  img.width = img.height = n * cell;
  img.pixels.resize(static_cast<size_t>(img.width) * img.height * 3);
  float hi = 0;
  for (int i = 0; i < n * n; ++i) hi = std::max(hi, a[i]);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      uint8_t rgb[3];
      colormap(hi > 0 ? a[i * n + j] / hi : 0.0, rgb);
      for (int y = i * cell; y < (i + 1) * cell; ++y)
        for (int x = j * cell; x < (j + 1) * cell; ++x)
          std::copy(rgb, rgb + 3, &img.pixels[(static_cast<size_t>(y) * img.width + x) * 3]);
    }
  return img;
}

namespace {
void append_bytes(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}
}  // namespace

Result<std::string> encode_png(const RgbImage& image) {
  if (image.width <= 0 || image.height <= 0) return Status::Invalid("encode_png: an empty image");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_write_struct(&png, &info);
    return Status::Internal("libpng: cannot create a writer");
  }
  std::string out;
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (int y = 0; y < image.height; ++y)
    rows[static_cast<size_t>(y)] = const_cast<png_bytep>(&image.pixels[static_cast<size_t>(y) * image.width * 3]);
  if (setjmp(png_jmpbuf(png))) {  // libpng reports errors by longjmp; nothing with a destructor lives past here
    png_destroy_write_struct(&png, &info);
    return Status::Internal("libpng: encoding failed");
  }
  png_set_write_fn(png, &out, append_bytes, nullptr);
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width), static_cast<png_uint_32>(image.height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

}  // namespace tessera::run
