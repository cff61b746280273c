// libjpeg decoding for the image plugin; see jpeg_decode.h. libjpeg reports errors by calling
// error_exit, which must not return: it longjmps back into the phase that called libjpeg. Those
// phases hold only plain C locals, so the jump skips no C++ destructor.
#include "jpeg_decode.h"

#include <jerror.h>
#include <jpeglib.h>

#include <csetjmp>
#include <cstdio>
#include <string>

#include "containers.h"

namespace tessera::image {

namespace {

struct ErrorManager {
  jpeg_error_mgr pub;  // first, so a j_common_ptr's err can be cast back
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool corrupt;
};

extern "C" void on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Level −1 is a warning. Those that mean damaged data make the file bad (the first one is kept);
// the three that only concern metadata are ignored. Trace messages (level ≥ 1) are ignored too.
extern "C" void on_message(j_common_ptr cinfo, int level) {
  auto* e = reinterpret_cast<ErrorManager*>(cinfo->err);
  const int code = cinfo->err->msg_code;
  if (level >= 0 || code == JWRN_JFIF_MAJOR || code == JWRN_ADOBE_XFORM || code == JWRN_BOGUS_ICC) return;
  if (!e->corrupt) (*cinfo->err->format_message)(cinfo, e->message);
  e->corrupt = true;
}

extern "C" void silent(j_common_ptr) {}

// Owns a decompressor; the phases below run under its setjmp.
struct Decoder {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  Decoder(const uint8_t* data, size_t size) {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.pub.output_message = silent;
    err.message[0] = '\0';
    err.corrupt = false;
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  }
  ~Decoder() { jpeg_destroy_decompress(&cinfo); }
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
};

// Phase 1: the header. Returns false when libjpeg failed (its message is in d->err).
bool read_header(Decoder* d) {
  if (setjmp(d->err.jump)) return false;
  jpeg_read_header(&d->cinfo, TRUE);
  return true;
}

// Phase 2: the pixels, as rows `stride` bytes apart: RGB, or CMYK for CMYK and YCCK files.
bool read_pixels(Decoder* d, uint8_t* pixels, size_t stride) {
  if (setjmp(d->err.jump)) return false;
  // libjpeg's defaults otherwise, as PIL: islow IDCT, fancy upsampling.
  const J_COLOR_SPACE cs = d->cinfo.jpeg_color_space;
  d->cinfo.out_color_space = (cs == JCS_CMYK || cs == JCS_YCCK) ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&d->cinfo);
  while (d->cinfo.output_scanline < d->cinfo.output_height) {
    JSAMPROW row = pixels + d->cinfo.output_scanline * stride;
    jpeg_read_scanlines(&d->cinfo, &row, 1);
  }
  jpeg_finish_decompress(&d->cinfo);
  return true;
}

// CMYK to RGB as PIL's convert("RGB") does it (Pillow's cmyk2rgb): each colour is
// (255 − k) − c·(255 − k)/255 in rounded integer arithmetic. PIL reads every 4-channel JPEG as
// Adobe's inverted CMYK ("CMYK;I"), marker or not; so do we.
void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, size_t n) {
  auto muldiv255 = [](int a, int b) {
    const int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
  };
  for (size_t i = 0; i < n; ++i, cmyk += 4, rgb += 3) {
    const int k = 255 - cmyk[3];
    const int nk = 255 - k;
    for (int c = 0; c < 3; ++c) {
      const int v = nk - muldiv255(255 - cmyk[c], nk);
      rgb[c] = static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
    }
  }
}

// A warning about damaged data, or an error: libjpeg's message either way.
[[noreturn]] void refuse(const Decoder& d) {
  if (d.err.corrupt)
    throw BadImage(std::string("corrupt JPEG: libjpeg says \"") + d.err.message + "\" (the file is damaged)");
  throw BadImage(std::string("libjpeg cannot decode this JPEG: \"") + d.err.message + "\"");
}

}  // namespace

void decode_jpeg(const uint8_t* data, size_t size, cv::Mat& rgb) {
  Decoder d(data, size);
  if (!read_header(&d) || d.err.corrupt) refuse(d);
  const J_COLOR_SPACE cs = d.cinfo.jpeg_color_space;
  const bool cmyk = cs == JCS_CMYK || cs == JCS_YCCK;
  if (!cmyk && cs != JCS_GRAYSCALE && cs != JCS_YCbCr && cs != JCS_RGB)
    throw BadImage("JPEG in colour space " + std::to_string(static_cast<int>(cs)) +
                   " that libjpeg cannot turn into RGB");
  const int height = static_cast<int>(d.cinfo.image_height), width = static_cast<int>(d.cinfo.image_width);
  cv::Mat cmyk_pixels;
  cv::Mat& pixels = cmyk ? cmyk_pixels : rgb;
  pixels.create(height, width, cmyk ? CV_8UC4 : CV_8UC3);
  if (!read_pixels(&d, pixels.data, pixels.step[0]) || d.err.corrupt) refuse(d);
  if (pixels.rows != static_cast<int>(d.cinfo.output_height) ||
      pixels.cols != static_cast<int>(d.cinfo.output_width))
    throw BadImage("corrupt JPEG: libjpeg decoded another size than its header says");
  if (!cmyk) return;
  rgb.create(height, width, CV_8UC3);
  for (int y = 0; y < height; ++y)
    cmyk_to_rgb(pixels.ptr<uint8_t>(y), rgb.ptr<uint8_t>(y), static_cast<size_t>(width));
}

}  // namespace tessera::image
