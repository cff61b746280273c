// JPEG decoding with libjpeg directly, so that its "Corrupt JPEG data" warnings refuse the file
// (through OpenCV they go to stderr and the damaged image comes back as a success). PIL's library
// and settings (islow IDCT, fancy upsampling, its CMYK formula), so the pixels are PIL's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <opencv2/core.hpp>

namespace tessera::image {

// The image as 8-bit RGB (grey replicated), as stored: no EXIF orientation, into `rgb` (whose
// memory is reused when it is large enough). Throws BadImage with libjpeg's own words for an
// error or a corrupt-data warning.
void decode_jpeg(const uint8_t* data, size_t size, cv::Mat& rgb);

}  // namespace tessera::image
