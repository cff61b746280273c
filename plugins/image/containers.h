// Checks an image file before any decoder sees it: the format from its magic bytes, truncation and
// corruption a decoder would only warn about, zero and oversized dimensions, the EXIF orientation.
// It decodes no pixels (libjpeg and OpenCV do, on data vetted here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera::image {

// A broken or unsupported input; what() says what is wrong and where, without the item's name.
class BadImage : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Format { png, jpeg, bmp, pnm, tiff, webp };
const char* format_name(Format f);  // "PNG", "JPEG", ...

struct Container {
  Format format = Format::png;
  int64_t width = 0, height = 0;  // as stored, before orientation
  // EXIF orientation (1..8) still to be applied after decoding; 1 when there is none, or when the
  // decoder applies it itself (OpenCV's TIFF reader always does).
  int orientation = 1;
  // The bytes to hand to OpenCV when they differ from the input, else empty. PNG: the file rebuilt
  // from its critical chunks only, so that libpng never warns on stderr about ancillary ones (iCCP
  // profiles, text). ASCII PNM ending in a digit: a newline added, which OpenCV's reader needs.
  std::vector<uint8_t> cleaned;
};

// Identifies and checks one whole file. Throws BadImage for an empty file, an unknown format,
// truncation, corruption, zero dimensions, or more than max_pixels pixels.
Container inspect(const uint8_t* data, size_t size, int64_t max_pixels);

// The orientation tag (0x0112) of an EXIF block that starts with its TIFF header ("II*\0" or
// "MM\0*"); 1 when absent, out of range or unreadable (a broken EXIF block is not a broken image).
int exif_orientation(const uint8_t* tiff, size_t size);

}  // namespace tessera::image
