// JPEG decoding with libjpeg directly, because through OpenCV libjpeg's "Corrupt JPEG data"
// warnings go to stderr and the damaged image comes back as a success. Here every such warning
// refuses the file. Same library and settings as PIL (islow IDCT, fancy upsampling), so the pixels
// are PIL's, CMYK files included (converted with PIL's formula).
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
