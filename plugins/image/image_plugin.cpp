// The image plugin: an image file in, ViT patch rows out — decode (libjpeg or OpenCV), EXIF
// orientation, resize (PIL-exact or OpenCV), centre crop, normalise, then 3·p·p values per patch
// (p·p with grey) in Conv2d order, with pixel provenance and a picture. No model code here.
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <utility>
#include <vector>

#include "containers.h"
#include "jpeg_decode.h"
#include "resample.h"
#include "tessera/plugin.hpp"

namespace {

using tessera::image::BadImage;
using tessera::plugin::fail;
using tessera::plugin::Sequence;

enum class Resize { pil_bilinear, pil_bicubic, opencv_bilinear, opencv_bicubic, opencv_area };
constexpr const char* kResizeChoices = "pil_bilinear|pil_bicubic|opencv_bilinear|opencv_bicubic|opencv_area";

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// An option's R,G,B values from one value (all channels) or three.
std::array<float, 3> three_floats(const tessera::plugin::Options& o, const std::string& name, bool nonzero) {
  const std::vector<double> v = o.get_floats(name);
  if (v.size() != 1 && v.size() != 3)
    fail(TSR_INVALID_ARGUMENT,
         "\"" + o.text(name) + "\" has " + std::to_string(v.size()) +
             " values; give one value for all channels or three (R,G,B)",
         name);
  std::array<float, 3> out{};
  for (int c = 0; c < 3; ++c) {
    const double x = v[v.size() == 3 ? c : 0];
    if (!std::isfinite(x) || (nonzero && x == 0.0))
      fail(TSR_INVALID_ARGUMENT,
           "\"" + o.text(name) + "\": every value must be a finite number" +
               (nonzero ? " other than 0 (it divides)" : ""),
           name);
    out[c] = static_cast<float>(x);  // Hugging Face normalises in float32
  }
  return out;
}

// A bool option's value; anything but "true" or "false" is an error, not false.
bool flag(const tessera::plugin::Options& o, const std::string& name) {
  const std::string& t = o.text(name);
  if (t != "true" && t != "false") fail(TSR_INVALID_ARGUMENT, "\"" + t + "\" is not true or false", name);
  return t == "true";
}

class ImagePlugin {
 public:
  explicit ImagePlugin(const tessera::plugin::Options& o) {
    patch_ = o.get_int("patch_size");
    if (patch_ < 1 || patch_ > 1024)
      fail(TSR_INVALID_ARGUMENT, std::to_string(patch_) + " is outside 1..1024", "patch_size");
    const std::vector<int64_t> size = o.get_ints("image_size");
    if (size.size() != 1 && size.size() != 2)
      fail(TSR_INVALID_ARGUMENT,
           "\"" + o.text("image_size") + "\": give one size (a square) or two, height,width", "image_size");
    height_ = size[0];
    width_ = size.back();
    for (int64_t s : {height_, width_}) {
      if (s < 1 || s > 16384)
        fail(TSR_INVALID_ARGUMENT, "\"" + join(size) + "\": each side must be in 1..16384", "image_size");
      if (s % patch_ != 0) {
        const int64_t below = s / patch_ * patch_, above = below + patch_;
        fail(TSR_INVALID_ARGUMENT,
             "\"" + join(size) + "\": " + std::to_string(s) + " is not a multiple of patch_size " +
                 std::to_string(patch_) + " (use " + (below ? std::to_string(below) + " or " : "") +
                 std::to_string(above) + ")",
             "image_size");
      }
    }
    const std::string resize = o.get_string("resize");
    const std::string choices = kResizeChoices;
    if (resize == "pil_bilinear")
      resize_ = Resize::pil_bilinear;
    else if (resize == "pil_bicubic")
      resize_ = Resize::pil_bicubic;
    else if (resize == "opencv_bilinear")
      resize_ = Resize::opencv_bilinear;
    else if (resize == "opencv_bicubic")
      resize_ = Resize::opencv_bicubic;
    else if (resize == "opencv_area")
      resize_ = Resize::opencv_area;
    else
      fail(TSR_INVALID_ARGUMENT, "\"" + resize + "\" is not one of " + choices, "resize");
    center_crop_ = flag(o, "center_crop");
    shortest_edge_ = o.get_int("resize_shortest_edge");
    if (shortest_edge_ != 0 && !center_crop_)
      fail(TSR_INVALID_ARGUMENT,
           std::to_string(shortest_edge_) +
               " needs center_crop: true (without a crop the image is resized to image_size)",
           "resize_shortest_edge");
    if (shortest_edge_ != 0 && (shortest_edge_ < std::max(height_, width_) || shortest_edge_ > 65536))
      fail(TSR_INVALID_ARGUMENT,
           std::to_string(shortest_edge_) + " must be 0 or in " + std::to_string(std::max(height_, width_)) +
               "..65536, so the centre crop of image_size fits",
           "resize_shortest_edge");
    rescale_ = o.get_float("rescale_factor");
    if (!std::isfinite(rescale_) || rescale_ <= 0)
      fail(TSR_INVALID_ARGUMENT, "\"" + o.text("rescale_factor") + "\" must be a finite number above 0",
           "rescale_factor");
    const std::array<float, 3> mean = three_floats(o, "mean", false);
    const std::array<float, 3> std = three_floats(o, "std", true);
    grey_ = flag(o, "grey");
    crop_padding_ = o.get_int("augment_crop_padding");
    if (crop_padding_ < 0 || crop_padding_ > std::min(height_, width_))
      fail(TSR_INVALID_ARGUMENT,
           std::to_string(crop_padding_) + " is outside 0.." + std::to_string(std::min(height_, width_)) +
               " (pixels of padding, at most the image's shorter side)",
           "augment_crop_padding");
    flip_ = flag(o, "augment_flip");
    for (const auto& [name, v] : {std::pair{"mean", mean}, std::pair{"std", std}})
      if (grey_ && (v[1] != v[0] || v[2] != v[0]))
        fail(TSR_INVALID_ARGUMENT,
             "\"" + o.text(name) + "\": with grey: true there is one channel; give one value", name);
    picture_size_ = o.get_int("picture_size");
    if (picture_size_ < 0 || picture_size_ > 8192)
      fail(TSR_INVALID_ARGUMENT, std::to_string(picture_size_) + " is outside 0..8192 (0: no picture)",
           "picture_size");
    max_pixels_ = o.get_int("max_pixels");
    if (max_pixels_ < 1)
      fail(TSR_INVALID_ARGUMENT, std::to_string(max_pixels_) + " must be at least 1", "max_pixels");
    cls_ = flag(o, "cls");
    // Every 8-bit value maps to one feature value per channel, computed as Hugging Face does:
    // float32(value · rescale_factor in double), then (x − mean) / std in float32.
    for (int c = 0; c < 3; ++c)
      for (int v = 0; v < 256; ++v) {
        const float x = static_cast<float>(static_cast<double>(v) * rescale_);
        value_[c][v] = (x - mean[c]) / std[c];
        if (!std::isfinite(value_[c][v]))
          fail(TSR_INVALID_ARGUMENT,
               "with mean " + o.text("mean") + " and std " + o.text("std") + ", the value " +
                   std::to_string(v) + " would become " + std::to_string(value_[c][v]) +
                   " (out of float range)",
               "rescale_factor");
      }
  }

  tsr_encoder_info describe() const {
    tsr_encoder_info i{};
    i.rows_kind = TSR_ROWS_FEATURES;
    i.width = static_cast<uint32_t>(channels() * patch_ * patch_);
    i.causal = 0;
    i.pad_id = -1;
    i.max_rows = (height_ / patch_) * (width_ / patch_) + (cls_ ? 1 : 0);
    i.augments = (crop_padding_ > 0 || flip_) ? 1 : 0;
    return i;
  }

  // Training augmentation on a sequence encode() made: the image shifted by (dy, dx), each drawn
  // from [-pad, pad], with black (pixel value 0, normalised) filling what comes in from outside,
  // which is torchvision's RandomCrop(size, padding=pad); then, with augment_flip, mirrored left to
  // right on a fair coin (RandomHorizontalFlip). Draws in that order: dy, dx, the coin. Rows that
  // are not patches (CLS) are copied unchanged.
  void augment(const tsr_rows& in, uint64_t seed, float* out) const {
    const int64_t p = patch_, C = channels(), n = in.n_rows, width = in.width;
    const int64_t gr = in.grid_rows, gc = in.grid_cols, H = gr * p, W = gc * p;
    if (width != C * p * p || gr <= 0 || gc <= 0)
      fail(TSR_INVALID_ARGUMENT, "augment: the rows are not this encoder's patches (width " + std::to_string(width) +
                                     ", grid " + std::to_string(gr) + " x " + std::to_string(gc) + ")");
    tessera::plugin::Draws draws(seed);
    const int64_t dy = draws.between(-crop_padding_, crop_padding_);
    const int64_t dx = draws.between(-crop_padding_, crop_padding_);
    const bool flip = flip_ && draws.coin();
    // The image as C planes of H x W, gathered from the patch rows ((C, p, p) each).
    std::vector<float> plane(static_cast<size_t>(C * H * W), 0.0f);
    auto cell = [&](int64_t row, int64_t* r, int64_t* c) {
      *r = in.positions[2 * row];
      *c = in.positions[2 * row + 1];
      return in.roles[row] == TSR_ROLE_CONTENT && *r >= 0 && *r < gr && *c >= 0 && *c < gc;
    };
    for (int64_t row = 0; row < n; ++row) {
      int64_t r, c;
      const float* f = in.features + row * width;
      if (!cell(row, &r, &c)) {
        std::copy(f, f + width, out + row * width);
        continue;
      }
      for (int64_t ch = 0; ch < C; ++ch)
        for (int64_t y = 0; y < p; ++y)
          std::copy(f + (ch * p + y) * p, f + (ch * p + y + 1) * p, &plane[static_cast<size_t>((ch * H + r * p + y) * W + c * p)]);
    }
    for (int64_t row = 0; row < n; ++row) {
      int64_t r, c;
      if (!cell(row, &r, &c)) continue;
      float* o = out + row * width;
      for (int64_t ch = 0; ch < C; ++ch)
        for (int64_t y = 0; y < p; ++y)
          for (int64_t x = 0; x < p; ++x) {
            const int64_t oy = r * p + y, ox = c * p + x;
            const int64_t sy = oy + dy, sx = (flip ? W - 1 - ox : ox) + dx;
            o[(ch * p + y) * p + x] = (sy >= 0 && sy < H && sx >= 0 && sx < W)
                                          ? plane[static_cast<size_t>((ch * H + sy) * W + sx)]
                                          : value_[ch][0];
          }
    }
  }

  // Not const: the encoder keeps its scratch images between calls (one thread at a time uses it).
  std::vector<Sequence> encode(const tessera::plugin::Item& item) {
    const std::string id(item.id);
    try {
      const cv::Mat rgb = decode(item.data, item.size);
      return {rows(rgb)};
    } catch (const BadImage& e) {
      fail(TSR_BAD_INPUT, id + ": " + e.what());
    } catch (const cv::Exception& e) {
      fail(TSR_BAD_INPUT, id + ": OpenCV failed on this image: " + e.err);
    }
  }

 private:
  // The file's pixels as 8-bit RGB, EXIF orientation applied. JPEG through libjpeg (corrupt data
  // refused), everything else through OpenCV.
  cv::Mat decode(const uint8_t* data, size_t size) {
    const tessera::image::Container ct = tessera::image::inspect(data, size, max_pixels_);
    const uint8_t* bytes = ct.cleaned.empty() ? data : ct.cleaned.data();
    const size_t n = ct.cleaned.empty() ? size : ct.cleaned.size();
    if (n > static_cast<size_t>(INT_MAX))
      throw BadImage("file of " + std::to_string(n) + " bytes is over OpenCV's 2 GiB limit");
    cv::Mat m;
    if (ct.format == tessera::image::Format::jpeg) {
      tessera::image::decode_jpeg(bytes, n, decoded_);
      m = decoded_;
    } else {
      m = opencv_decode(bytes, n, ct);
    }
    cv::Mat turned;
    switch (ct.orientation) {  // EXIF orientation → the transposition PIL's exif_transpose applies
      case 2:
        cv::flip(m, turned, 1);
        break;
      case 3:
        cv::rotate(m, turned, cv::ROTATE_180);
        break;
      case 4:
        cv::flip(m, turned, 0);
        break;
      case 5:
        cv::transpose(m, turned);
        break;
      case 6:
        cv::rotate(m, turned, cv::ROTATE_90_CLOCKWISE);
        break;
      case 7: {
        cv::Mat transposed;
        cv::transpose(m, transposed);
        cv::rotate(transposed, turned, cv::ROTATE_180);
        break;
      }
      case 8:
        cv::rotate(m, turned, cv::ROTATE_90_COUNTERCLOCKWISE);
        break;
      default:
        turned = m;
        break;
    }
    return turned.isContinuous() ? turned : turned.clone();
  }

  // Formats other than JPEG, through OpenCV, as 8-bit RGB without orientation.
  static cv::Mat opencv_decode(const uint8_t* bytes, size_t n, const tessera::image::Container& ct) {
    using tessera::image::format_name;
    const cv::Mat buffer(1, static_cast<int>(n), CV_8U, const_cast<uint8_t*>(bytes));
    // IMREAD_COLOR: grey becomes three equal channels, alpha is dropped (as PIL's convert("RGB")).
    // IMREAD_ANYDEPTH: 16-bit samples stay 16-bit; we take the high byte below. decode() applies
    // the orientation from the EXIF block containers.cpp found, the same way for every format.
    cv::Mat m = cv::imdecode(buffer, cv::IMREAD_COLOR | cv::IMREAD_ANYDEPTH | cv::IMREAD_IGNORE_ORIENTATION);
    const std::string what = std::string(format_name(ct.format)) + " image of " + std::to_string(ct.width) +
                             "×" + std::to_string(ct.height) + " pixels";
    if (m.empty())
      throw BadImage("OpenCV could not decode this " + what +
                     ": its data is corrupt, or uses a feature OpenCV's " + format_name(ct.format) +
                     " reader lacks");
    if (m.channels() != 3)
      throw BadImage("decoded to " + std::to_string(m.channels()) + " channels, expected 3");
    if (m.depth() == CV_16U) {  // the high byte, as PIL reads 16-bit RGB PNGs
      cv::Mat high(m.size(), CV_8UC3);
      for (int y = 0; y < m.rows; ++y) {
        const uint16_t* in = m.ptr<uint16_t>(y);
        uint8_t* out = high.ptr<uint8_t>(y);
        for (int x = 0; x < m.cols * 3; ++x) out[x] = static_cast<uint8_t>(in[x] >> 8);
      }
      m = high;
    } else if (m.depth() != CV_8U) {
      throw BadImage(what + " has " + (m.depth() == CV_32F ? "32-bit float" : "non-integer or 32-bit") +
                     " samples; only 8- and 16-bit images are read (convert it to 8- or 16-bit PNG)");
    }
    cv::Mat rgb;
    cv::cvtColor(m, rgb, cv::COLOR_BGR2RGB);
    return rgb;
  }

  // Where the model input sits in the resized image: the resized size, and the crop's corner.
  struct Geometry {
    int64_t resized_width, resized_height, left, top;
  };
  Geometry geometry(int64_t w, int64_t h) const {
    if (!center_crop_) return {width_, height_, 0, 0};
    // Hugging Face's shortest-edge resize: the long side is int(short · long / short), truncated.
    const int64_t s = shortest_edge_ ? shortest_edge_ : std::max(height_, width_);
    Geometry g{};
    if (w <= h) {
      g.resized_width = s;
      g.resized_height = static_cast<int64_t>(static_cast<double>(s * h) / static_cast<double>(w));
    } else {
      g.resized_height = s;
      g.resized_width = static_cast<int64_t>(static_cast<double>(s * w) / static_cast<double>(h));
    }
    if (std::max(g.resized_width, g.resized_height) > (int64_t{1} << 24))
      throw BadImage("a " + std::to_string(w) + "×" + std::to_string(h) +
                     " image is too elongated for center_crop: " + "its long side would be resized to " +
                     std::to_string(std::max(g.resized_width, g.resized_height)) +
                     " pixels (crop it first, or resize without center_crop)");
    g.left = (g.resized_width - width_) / 2;  // Hugging Face's center_crop rounds the same way
    g.top = (g.resized_height - height_) / 2;
    return g;
  }

  // The model input: image_size pixels, packed RGB rows, in input_.
  const std::vector<uint8_t>& model_input(const cv::Mat& rgb, const Geometry& g) {
    std::vector<uint8_t>& out = input_;
    out.resize(static_cast<size_t>(height_ * width_ * 3));
    const tessera::image::Window window{static_cast<int>(g.left), static_cast<int>(g.top),
                                        static_cast<int>(width_), static_cast<int>(height_)};
    if (resize_ == Resize::pil_bilinear || resize_ == Resize::pil_bicubic) {
      tessera::image::pil_resize(rgb.data, rgb.cols, rgb.rows, rgb.step[0], static_cast<int>(g.resized_width),
                                 static_cast<int>(g.resized_height),
                                 resize_ == Resize::pil_bilinear ? tessera::image::PilFilter::bilinear
                                                                 : tessera::image::PilFilter::bicubic,
                                 window, out.data());
      return out;
    }
    if (g.resized_width > max_pixels_ / g.resized_height)
      throw BadImage("resizing this " + std::to_string(rgb.cols) + "×" + std::to_string(rgb.rows) +
                     " image for the centre crop would make " + std::to_string(g.resized_width) + "×" +
                     std::to_string(g.resized_height) +
                     " pixels, more than max_pixels (use a pil_* resize, which "
                     "computes only the crop)");
    const int interpolation = resize_ == Resize::opencv_bilinear  ? cv::INTER_LINEAR
                              : resize_ == Resize::opencv_bicubic ? cv::INTER_CUBIC
                                                                  : cv::INTER_AREA;
    cv::Mat resized;
    cv::resize(rgb, resized, cv::Size(static_cast<int>(g.resized_width), static_cast<int>(g.resized_height)),
               0, 0, interpolation);
    cv::Mat packed(static_cast<int>(height_), static_cast<int>(width_), CV_8UC3, out.data());
    resized(cv::Rect(window.x0, window.y0, window.width, window.height)).copyTo(packed);
    return out;
  }

  int channels() const { return grey_ ? 1 : 3; }

  // The model input as one grey plane, in luma_: 0.299 R + 0.587 G + 0.114 B (ITU-R 601-2),
  // rounded to the nearest level, so that a grey image (R = G = B) keeps its values exactly.
  const std::vector<uint8_t>& grey_input(const std::vector<uint8_t>& rgb) {
    luma_.resize(rgb.size() / 3);
    for (size_t i = 0; i < luma_.size(); ++i)
      luma_[i] =
          static_cast<uint8_t>((299 * rgb[3 * i] + 587 * rgb[3 * i + 1] + 114 * rgb[3 * i + 2] + 500) / 1000);
    return luma_;
  }

  Sequence rows(const cv::Mat& rgb) {
    const Geometry g = geometry(rgb.cols, rgb.rows);
    const std::vector<uint8_t>& input = grey_ ? grey_input(model_input(rgb, g)) : model_input(rgb, g);
    const int64_t p = patch_, grid_rows = height_ / p, grid_cols = width_ / p, C = channels();
    Sequence s;
    s.kind = TSR_ROWS_FEATURES;
    s.width = static_cast<uint32_t>(C * p * p);
    s.grid_rows = static_cast<uint32_t>(grid_rows);
    s.grid_cols = static_cast<uint32_t>(grid_cols);
    s.features.reserve(static_cast<size_t>((grid_rows * grid_cols + 1) * s.width));
    std::vector<float> row(s.width, 0.0f);
    // The CLS row: on no grid cell, from no pixels; the model puts its learned vector there.
    if (cls_) s.add_features(row.data(), TSR_ROLE_CLS, tessera::plugin::no_provenance(), -1, -1);
    // A resized pixel edge x maps to x · (input width / resized width) in the decoded image.
    const double sx = static_cast<double>(rgb.cols) / static_cast<double>(g.resized_width);
    const double sy = static_cast<double>(rgb.rows) / static_cast<double>(g.resized_height);
    for (int64_t r = 0; r < grid_rows; ++r)
      for (int64_t c = 0; c < grid_cols; ++c) {
        // (C, p, p): channel-major, as Conv2d(C, d, kernel p, stride p) reads a patch.
        for (int64_t ch = 0; ch < C; ++ch)
          for (int64_t dy = 0; dy < p; ++dy) {
            const uint8_t* px = &input[static_cast<size_t>(((r * p + dy) * width_ + c * p) * C + ch)];
            float* out = &row[static_cast<size_t>((ch * p + dy) * p)];
            for (int64_t dx = 0; dx < p; ++dx) out[dx] = value_[ch][px[dx * C]];
          }
        const double x0 = static_cast<double>(g.left + c * p), y0 = static_cast<double>(g.top + r * p);
        s.add_features(row.data(), TSR_ROLE_CONTENT,
                       tessera::plugin::pixel_box(x0 * sx, y0 * sy, (x0 + p) * sx, (y0 + p) * sy),
                       static_cast<int32_t>(r), static_cast<int32_t>(c));
      }
    add_picture(rgb, s);
    return s;
  }

  // The decoded image for heatmaps, shrunk (area averaging) to picture_size on its long side.
  void add_picture(const cv::Mat& rgb, Sequence& s) const {
    if (picture_size_ == 0) return;
    cv::Mat pic = rgb;
    const int longest = std::max(rgb.cols, rgb.rows);
    if (longest > picture_size_) {
      const double f = static_cast<double>(picture_size_) / longest;
      const int w = std::max(1, static_cast<int>(std::lround(rgb.cols * f)));
      const int h = std::max(1, static_cast<int>(std::lround(rgb.rows * f)));
      cv::resize(rgb, pic, cv::Size(w, h), 0, 0, cv::INTER_AREA);
    }
    s.picture_width = static_cast<uint32_t>(pic.cols);
    s.picture_height = static_cast<uint32_t>(pic.rows);
    s.picture_channels = 3;
    s.picture.resize(static_cast<size_t>(pic.cols) * pic.rows * 3);
    for (int y = 0; y < pic.rows; ++y)
      std::copy_n(pic.ptr<uint8_t>(y), static_cast<size_t>(pic.cols) * 3,
                  &s.picture[static_cast<size_t>(y) * pic.cols * 3]);
    s.picture_x0 = 0;
    s.picture_x1 = rgb.cols;
    s.picture_y0 = 0;
    s.picture_y1 = rgb.rows;
  }

  int64_t height_ = 224, width_ = 224, patch_ = 16;
  Resize resize_ = Resize::pil_bilinear;
  bool center_crop_ = false, cls_ = true, grey_ = false, flip_ = false;
  int64_t crop_padding_ = 0;
  int64_t shortest_edge_ = 0, picture_size_ = 512, max_pixels_ = 0;
  double rescale_ = 1.0 / 255.0;
  float value_[3][256] = {};
  // Scratch kept between calls, so that steady-state encoding allocates only its output.
  cv::Mat decoded_;
  std::vector<uint8_t> input_, luma_;
};

const tsr_option_spec kOptions[] = {
    {sizeof(tsr_option_spec), "image_size", TSR_OPT_INT_LIST, "224,224",
     "height,width of the image the patches are cut from (one value: a square)", nullptr},
    {sizeof(tsr_option_spec), "patch_size", TSR_OPT_INT, "16",
     "side of the square patches, in model-input pixels", nullptr},
    {sizeof(tsr_option_spec), "resize", TSR_OPT_ENUM, "pil_bilinear",
     "resampling: pil_* match PIL and Hugging Face exactly (antialiased); opencv_* are cv::resize",
     kResizeChoices},
    {sizeof(tsr_option_spec), "center_crop", TSR_OPT_BOOL, "false",
     "keep the aspect ratio: resize the shorter side, then crop image_size from the centre", nullptr},
    {sizeof(tsr_option_spec), "resize_shortest_edge", TSR_OPT_INT, "0",
     "with center_crop: the shorter side after resizing (0: the larger of image_size)", nullptr},
    {sizeof(tsr_option_spec), "rescale_factor", TSR_OPT_FLOAT, "0.00392156862745098",
     "multiplies 8-bit pixel values (1/255)", nullptr},
    {sizeof(tsr_option_spec), "mean", TSR_OPT_FLOAT_LIST, "0.5,0.5,0.5",
     "subtracted after rescaling, per channel R,G,B (one value: all three)", nullptr},
    {sizeof(tsr_option_spec), "std", TSR_OPT_FLOAT_LIST, "0.5,0.5,0.5",
     "divides after subtracting the mean, per channel R,G,B (one value: all three)", nullptr},
    {sizeof(tsr_option_spec), "grey", TSR_OPT_BOOL, "false",
     "one channel: p·p values per patch, the luma of R, G, B (grey images keep their values)", nullptr},
    {sizeof(tsr_option_spec), "cls", TSR_OPT_BOOL, "true", "put a CLS row before the patch rows", nullptr},
    {sizeof(tsr_option_spec), "picture_size", TSR_OPT_INT, "512",
     "long side of the picture kept for attention heatmaps (0: no picture)", nullptr},
    {sizeof(tsr_option_spec), "max_pixels", TSR_OPT_INT, "178956970",
     "refuse larger images (decompression bombs); PIL's limit", nullptr},
    {sizeof(tsr_option_spec), "augment_crop_padding", TSR_OPT_INT, "0",
     "training only: a random crop of the image padded by this many black pixels (a shift of up to that many)",
     nullptr},
    {sizeof(tsr_option_spec), "augment_flip", TSR_OPT_BOOL, "false",
     "training only: mirror left to right on a seeded fair coin", nullptr},
};

const tsr_plugin_info kInfo = {
    sizeof(tsr_plugin_info),
    "image",
    "image",
    "1.2.0",
    "ViT patches from PNG, JPEG, BMP, PNM, TIFF and WebP files (PIL-exact resizing)",
    kOptions,
    sizeof(kOptions) / sizeof(kOptions[0]),
    TSR_INPUT_FILE,
    ".png|.jpg|.jpeg|.bmp|.pnm|.ppm|.pgm|.tif|.tiff|.webp"};

}  // namespace

TESSERA_DEFINE_PLUGIN(ImagePlugin, kInfo)
