// Pillow's Image.resize for 8-bit images (BILINEAR and BICUBIC), reproduced bit for bit, so that
// the plugin matches Hugging Face image processors, which resize through PIL. Not OpenCV's
// cv::resize: PIL widens the filter by the downscale factor (antialiasing) and rounds differently.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::image {

enum class PilFilter { bilinear, bicubic };

// A window [x0, x0 + width) × [y0, y0 + height) of the resized image, in its pixels.
struct Window {
  int x0 = 0, y0 = 0, width = 0, height = 0;
};

// Resizes `src` (height rows of width RGB pixels, 3 interleaved bytes each, rows `src_stride`
// bytes apart) to out_width × out_height as PIL would, and writes only `window` of the result into
// `dst` (window.height rows of window.width RGB pixels, packed). Computing a window gives
// the same bytes as resizing the whole image and cropping it (PIL resize, then a centre crop).
void pil_resize(const uint8_t* src, int width, int height, size_t src_stride, int out_width, int out_height,
                PilFilter filter, Window window, uint8_t* dst);

}  // namespace tessera::image
