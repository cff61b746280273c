// Attention heatmaps drawn where a person looks: over the picture a plugin gave (an image, a
// spectrogram), cell by cell through each row's provenance box; or as a row × row matrix for text
// and proteins. PNG encoding is libpng's; nothing here knows about models or runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/plugins.h"
#include "tessera/status.h"

namespace tessera::run {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // height × width × 3
};

// A colour for t in [0, 1] from a perceptually even map (viridis-like), as 8-bit RGB.
void colormap(double t, uint8_t rgb[3]);

// weight[i] for each row i of `rows` (e.g. the CLS row's attention to every row), blended over
// rows.picture through each row's provenance box. Rows without a box (special rows) are skipped.
// Needs a picture; returns an empty image otherwise.
RgbImage heatmap_over_picture(const TokenRows& rows, const std::vector<float>& weight);

// A (n, n) attention matrix, row-major, as an image with square cells (queries down, keys across).
RgbImage heatmap_matrix(const float* a, int n);

// PNG bytes of an 8-bit RGB image.
Result<std::string> encode_png(const RgbImage& image);

}  // namespace tessera::run
