// Fuzzes the image plugin's encode on raw file bytes (PNG, JPEG, BMP, PNM, TIFF, WebP, ...: the
// plugin sniffs the container), through the plugin ABI as `tessera run` calls it. Every input
// ends in rows the host accepts or in a refusal with a message. A small image_size keeps each
// execution short; max_pixels is lowered from its default (178956970) to 16777216 so that a
// header claiming a huge picture is refused quickly instead of decoded for seconds.
#include <cstdlib>

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tessera::Encoder enc = fuzz::encoder(
      "image", {{"image_size", "32,32"}, {"patch_size", "16"}, {"picture_size", "64"}, {"max_pixels", "16777216"}});
  fuzz::encode_file_bytes(enc, "fuzz.img", data, size);
  return 0;
}
