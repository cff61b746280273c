// The image plugin through the real ABI: rows equal to Hugging Face processors' pixel_values on
// real photos, in Conv2d order; decoding as PIL; EXIF; provenance; pictures; every bad file and
// option refused with its message. Rows only: no model runs here.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "tessera/npy.h"
#include "tessera/plugins.h"

using namespace tessera;
using json = nlohmann::json;

namespace {

const std::string kData = std::string(TESSERA_TEST_DATA) + "/image/";

std::shared_ptr<const Plugin> image_plugin() {
  static const std::shared_ptr<const Plugin> plugin = [] {
    auto p = Plugin::load(std::string(TESSERA_PLUGIN_BUILD_DIR) + "/libtessera_image.so");
    EXPECT_TRUE(p.ok()) << p.status().message();
    return p.ok() ? *p : nullptr;
  }();
  return plugin;
}

// Every option, as the config loader would pass them: defaults, then the overrides.
std::vector<std::pair<std::string, std::string>> all_options(
    const std::map<std::string, std::string>& overrides) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const PluginOptionSpec& spec : image_plugin()->options()) {
    auto it = overrides.find(spec.name);
    out.emplace_back(spec.name, it != overrides.end() ? it->second : spec.default_value.value_or(""));
  }
  return out;
}

Encoder make_encoder(const std::map<std::string, std::string>& overrides = {}) {
  auto e = Encoder::create(image_plugin(), all_options(overrides));
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e).value();
}

std::string create_error(const std::map<std::string, std::string>& overrides) {
  auto e = Encoder::create(image_plugin(), all_options(overrides));
  EXPECT_FALSE(e.ok());
  if (e.ok()) return "";
  EXPECT_EQ(e.status().code(), Code::invalid_argument);
  return e.status().message();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

Result<std::vector<TokenRows>> encode_bytes(const Encoder& e, const std::string& id,
                                            const std::string& bytes) {
  PluginItem item;
  item.id = id;
  item.source = id;
  item.data = bytes;
  return e.encode(item);
}

TokenRows encode_ok(const Encoder& e, const std::string& id, const std::string& bytes) {
  auto r = encode_bytes(e, id, bytes);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok() || r->size() != 1) return {};
  return std::move((*r)[0]);
}

TokenRows encode_file(const Encoder& e, const std::string& file) {
  return encode_ok(e, file, read_file(kData + file));
}

// The message of a bad item, checked to be TSR_BAD_INPUT (Code::parse_error on the host side).
std::string bad_input(const Encoder& e, const std::string& id, const std::string& bytes) {
  auto r = encode_bytes(e, id, bytes);
  EXPECT_FALSE(r.ok()) << id << " was accepted";
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), Code::parse_error) << r.status().message();
  return r.status().message();
}

const json& manifest() {
  static const json m = json::parse(read_file(kData + "fixtures.json"));
  return m;
}

Tensor load_npy(const std::string& file) {
  auto t = npy::load(kData + file);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : Tensor();
}

// pixel_values (1, 3, H, W) cut the way a Conv2d with kernel = stride = p reads them:
// (T, 3·p·p) with T in row-major grid order and each row [c][dy][dx].
std::vector<float> unfold(const Tensor& pixel_values, int64_t p) {
  const int64_t H = pixel_values.dim(2), W = pixel_values.dim(3);
  const float* v = static_cast<const float*>(pixel_values.raw_data());
  std::vector<float> rows;
  for (int64_t r = 0; r < H / p; ++r)
    for (int64_t c = 0; c < W / p; ++c)
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t dy = 0; dy < p; ++dy)
          for (int64_t dx = 0; dx < p; ++dx) rows.push_back(v[(ch * H + r * p + dy) * W + c * p + dx]);
  return rows;
}

// The patch rows (without CLS) as one flat vector.
std::vector<float> patch_values(const TokenRows& t) {
  const float* f = t.features.data<float>();
  const int64_t width = t.features.dim(1), first = t.roles.at(0) == TSR_ROLE_CLS ? 1 : 0;
  return {f + first * width, f + t.features.numel()};
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// A binary PPM (P6) whose pixel (x, y) is (x, y, 128): resizing keeps linear ramps, so a patch's
// mean red and green tell where in the input it came from.
std::string ramp_ppm(int width, int height) {
  std::string s = "P6\n" + std::to_string(width) + " " + std::to_string(height) + "\n255\n";
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) s += {static_cast<char>(x), static_cast<char>(y), static_cast<char>(128)};
  return s;
}

uint32_t crc32(const std::string& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

// Rewrites the CRC of the PNG chunk whose type starts at `type_at`, after the test edited it.
void fix_png_crc(std::string& png, size_t type_at) {
  const uint32_t length = (uint8_t(png[type_at - 4]) << 24) | (uint8_t(png[type_at - 3]) << 16) |
                          (uint8_t(png[type_at - 2]) << 8) | uint8_t(png[type_at - 1]);
  const uint32_t crc = crc32(png.substr(type_at, length + 4));
  for (int i = 0; i < 4; ++i) png[type_at + 4 + length + i] = static_cast<char>(crc >> (24 - 8 * i));
}

}  // namespace

TEST(ImagePlugin, DescribesItself) {
  auto p = image_plugin();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->name(), "image");
  EXPECT_EQ(p->modality(), "image");
  EXPECT_EQ(p->input_kind(), TSR_INPUT_FILE);
  EXPECT_EQ(p->extensions(), (std::vector<std::string>{".png", ".jpg", ".jpeg", ".bmp", ".pnm", ".ppm",
                                                       ".pgm", ".tif", ".tiff", ".webp"}));
  std::map<std::string, std::string> defaults;
  for (const auto& o : p->options()) defaults[o.name] = o.default_value.value_or("(required)");
  EXPECT_EQ(defaults, (std::map<std::string, std::string>{{"image_size", "224,224"},
                                                          {"patch_size", "16"},
                                                          {"resize", "pil_bilinear"},
                                                          {"center_crop", "false"},
                                                          {"resize_shortest_edge", "0"},
                                                          {"rescale_factor", "0.00392156862745098"},
                                                          {"mean", "0.5,0.5,0.5"},
                                                          {"std", "0.5,0.5,0.5"},
                                                          {"grey", "false"},
                                                          {"cls", "true"},
                                                          {"picture_size", "512"},
                                                          {"max_pixels", "178956970"},
                                                          {"augment_crop_padding", "0"},
                                                          {"augment_flip", "false"}}));
  const Encoder e = make_encoder();
  EXPECT_EQ(e.info().rows_kind, TSR_ROWS_FEATURES);
  EXPECT_EQ(e.info().width, 3u * 16 * 16);
  EXPECT_EQ(e.info().causal, 0);
  EXPECT_EQ(e.info().max_rows, 14 * 14 + 1);
  EXPECT_EQ(make_encoder({{"image_size", "48,80"}, {"patch_size", "8"}, {"cls", "false"}}).info().max_rows,
            6 * 10);
}

// The parity claim: for every committed case, the patch rows are Hugging Face's pixel_values
// (ViTImageProcessor, CLIPImageProcessor) unfolded, bit for bit.
TEST(ImagePlugin, MatchesHuggingFaceProcessorsExactly) {
  const json& cases = manifest()["cases"];
  ASSERT_GE(cases.size(), 24u);
  for (const json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>() + ": " + c["what"].get<std::string>());
    std::map<std::string, std::string> options;
    for (const auto& [k, v] : c["options"].items()) options[k] = v.get<std::string>();
    const TokenRows t = encode_file(make_encoder(options), c["file"].get<std::string>());
    const Tensor expected = load_npy(c["pixel_values"].get<std::string>());
    ASSERT_EQ(expected.rank(), 4);
    const int64_t H = expected.dim(2), W = expected.dim(3),
                  p = std::stoi(options.count("patch_size") ? options["patch_size"] : "16");
    ASSERT_EQ(t.size(), (H / p) * (W / p) + 1);
    EXPECT_EQ(t.grid_rows, H / p);
    EXPECT_EQ(t.grid_cols, W / p);
    EXPECT_EQ(max_abs_diff(patch_values(t), unfold(expected, p)), 0.0);
  }
}

TEST(ImagePlugin, RowsAreWhatAConv2dPatchEmbeddingSees) {
  const json& conv = manifest()["conv"];
  const TokenRows t = encode_file(make_encoder(), "astronaut.png");
  const Tensor weight = load_npy(conv["weight"].get<std::string>());  // (4, 3, 16, 16)
  const Tensor output = load_npy(conv["output"].get<std::string>());  // (1, 4, 14, 14), torch conv2d
  const float* w = static_cast<const float*>(weight.raw_data());
  const float* out = static_cast<const float*>(output.raw_data());
  ASSERT_EQ(t.size(), 197);
  double worst = 0;
  for (int64_t row = 1; row < t.size(); ++row) {
    EXPECT_EQ(t.positions[row], (std::array<int32_t, 2>{int32_t((row - 1) / 14), int32_t((row - 1) % 14)}));
    const float* f = t.features.data<float>() + row * 768;
    for (int o = 0; o < 4; ++o) {
      double dot = 0;
      for (int k = 0; k < 768; ++k) dot += double(f[k]) * w[o * 768 + k];
      worst = std::max(worst, std::fabs(dot - out[o * 196 + (row - 1)]));
    }
  }
  EXPECT_LT(worst, 1e-4);  // torch sums 768 float products in another order
}

TEST(ImagePlugin, ClsRowAndRowLayout) {
  const TokenRows t = encode_file(make_encoder(), "chelsea.jpg");
  ASSERT_EQ(t.size(), 197);
  EXPECT_EQ(t.roles[0], TSR_ROLE_CLS);
  EXPECT_EQ(t.positions[0], (std::array<int32_t, 2>{-1, -1}));
  EXPECT_EQ(t.provenance[0].kind, TSR_PROV_NONE);
  for (int k = 0; k < 768; ++k) ASSERT_EQ(t.features.data<float>()[k], 0.0f);
  for (int64_t i = 1; i < t.size(); ++i) {
    EXPECT_EQ(t.roles[i], TSR_ROLE_CONTENT);
    EXPECT_EQ(t.provenance[i].kind, TSR_PROV_PIXELS);
  }
  EXPECT_EQ(t.positions[196], (std::array<int32_t, 2>{13, 13}));
  const TokenRows no_cls = encode_file(make_encoder({{"cls", "false"}}), "chelsea.jpg");
  ASSERT_EQ(no_cls.size(), 196);
  EXPECT_EQ(no_cls.roles[0], TSR_ROLE_CONTENT);
  EXPECT_EQ(no_cls.positions[0], (std::array<int32_t, 2>{0, 0}));
  EXPECT_EQ(patch_values(no_cls), patch_values(t));
}

// Every format and pixel layout decodes to the RGB that PIL gives (exif_transpose, then
// convert("RGB")): the picture is the decoded image itself when it is at most picture_size.
TEST(ImagePlugin, DecodesEveryFormatAsPil) {
  const json& decoded = manifest()["decoded"];
  ASSERT_GE(decoded.size(), 20u);
  const Encoder e = make_encoder({{"image_size", "48,80"}});
  std::vector<std::string> extensions;
  for (const json& d : decoded) {
    const std::string file = d["file"].get<std::string>();
    SCOPED_TRACE(file + ": " + d["made"].get<std::string>());
    extensions.push_back(file.substr(file.rfind('.')));
    const TokenRows t = encode_file(e, file);
    const Tensor rgb = load_npy(d["rgb"].get<std::string>());  // (H, W, 3) uint8
    ASSERT_EQ(t.picture.height, rgb.dim(0));
    ASSERT_EQ(t.picture.width, rgb.dim(1));
    ASSERT_EQ(t.picture.channels, 3);
    EXPECT_EQ(std::memcmp(t.picture.pixels.data(), rgb.raw_data(), rgb.nbytes()), 0);
    EXPECT_EQ(t.picture.x0, 0.0);
    EXPECT_EQ(t.picture.x1, double(rgb.dim(1)));
    EXPECT_EQ(t.picture.y0, 0.0);
    EXPECT_EQ(t.picture.y1, double(rgb.dim(0)));
  }
  for (const char* ext : {".png", ".jpg", ".bmp", ".ppm", ".pgm", ".tif", ".webp"})
    EXPECT_NE(std::find(extensions.begin(), extensions.end(), ext), extensions.end()) << ext;
}

TEST(ImagePlugin, DecodesAsciiPnm) {
  const Encoder e = make_encoder({{"image_size", "16"}, {"picture_size", "8"}});
  const TokenRows p3 = encode_ok(e, "a.ppm", "P3\n# two pixels\n2 1\n255\n255 0 0\n0 7 255\n");
  EXPECT_EQ(p3.picture.pixels, (std::vector<uint8_t>{255, 0, 0, 0, 7, 255}));
  const TokenRows p2 = encode_ok(e, "a.pgm", "P2 2 1 15 15 0");  // maxval 15 scales to 255
  EXPECT_EQ(p2.picture.pixels, (std::vector<uint8_t>{255, 255, 255, 0, 0, 0}));
  const TokenRows p1 = encode_ok(e, "a.pbm", "P1\n3 1\n010");  // 1 is black
  EXPECT_EQ(p1.picture.pixels, (std::vector<uint8_t>{255, 255, 255, 0, 0, 0, 255, 255, 255}));
}

// EXIF orientation 6 ("rotate 90° clockwise to display"): the decoded image is the stored one
// turned clockwise, so its width is the stored height.
TEST(ImagePlugin, ExifOrientationGivesTheRotatedImage) {
  const Encoder e = make_encoder();
  const TokenRows upright = encode_file(e, "orientation_1.jpg");  // stored 24×16, same JPEG stream
  const TokenRows turned = encode_file(e, "orientation_6.jpg");
  ASSERT_EQ(upright.picture.width, 24);
  ASSERT_EQ(upright.picture.height, 16);
  ASSERT_EQ(turned.picture.width, 16);
  ASSERT_EQ(turned.picture.height, 24);
  for (int y = 0; y < 24; ++y)
    for (int x = 0; x < 16; ++x)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(turned.picture.pixels[(y * 16 + x) * 3 + c],
                  upright.picture.pixels[((15 - x) * 24 + y) * 3 + c])
            << "at (" << x << ", " << y << ")";
  // The provenance of a rotated photo is in its displayed (rotated) pixels: 100 wide, 150 high.
  const TokenRows coffee = encode_file(make_encoder({{"image_size", "48,80"}}), "coffee_exif6.jpg");
  EXPECT_EQ(coffee.picture.width, 100);
  EXPECT_EQ(coffee.provenance.back().x1, 100.0);
  EXPECT_EQ(coffee.provenance.back().y1, 150.0);
}

// Stretching (ViT): patch (r, c) of a 48×80 input made from a 30×20 image covers
// [c·16·30/80, (c+1)·16·30/80) × [r·16·20/48, (r+1)·16·20/48); the boxes tile the whole image.
TEST(ImagePlugin, ProvenanceBoxesWhenStretching) {
  const TokenRows t = encode_file(make_encoder({{"image_size", "48,80"}}), "chelsea_tiny.png");
  ASSERT_EQ(t.size(), 16);
  double area = 0;
  for (int64_t i = 1; i < t.size(); ++i) {
    const tsr_provenance& b = t.provenance[i];
    const int r = t.positions[i][0], c = t.positions[i][1];
    EXPECT_DOUBLE_EQ(b.x0, c * 16 * 30.0 / 80);
    EXPECT_DOUBLE_EQ(b.x1, (c + 1) * 16 * 30.0 / 80);
    EXPECT_DOUBLE_EQ(b.y0, r * 16 * 20.0 / 48);
    EXPECT_DOUBLE_EQ(b.y1, (r + 1) * 16 * 20.0 / 48);
    area += (b.x1 - b.x0) * (b.y1 - b.y0);
  }
  EXPECT_DOUBLE_EQ(area, 30.0 * 20.0);
}

// Centre crop: chelsea.jpg (451×300) with shortest edge 72 becomes 108×72 (int(72·451/300)), and
// the 64×64 crop starts at (22, 4) of it; boxes are that crop mapped back by 451/108 and 300/72.
TEST(ImagePlugin, ProvenanceBoxesWhenCropping) {
  const TokenRows t = encode_file(
      make_encoder({{"center_crop", "true"}, {"resize_shortest_edge", "72"}, {"image_size", "64"}}),
      "chelsea.jpg");
  ASSERT_EQ(t.size(), 17);
  const tsr_provenance& first = t.provenance[1];
  EXPECT_DOUBLE_EQ(first.x0, 22 * 451.0 / 108);
  EXPECT_DOUBLE_EQ(first.x1, 38 * 451.0 / 108);
  EXPECT_DOUBLE_EQ(first.y0, 4 * 300.0 / 72);
  EXPECT_DOUBLE_EQ(first.y1, 20 * 300.0 / 72);
  const tsr_provenance& last = t.provenance[16];
  EXPECT_DOUBLE_EQ(last.x1, 86 * 451.0 / 108);
  EXPECT_DOUBLE_EQ(last.y1, 68 * 300.0 / 72);
  // Portrait after EXIF rotation (100×150): shortest edge 64 gives 64×96, cropped from row 16.
  const TokenRows p =
      encode_file(make_encoder({{"center_crop", "true"}, {"image_size", "64"}}), "coffee_exif6.jpg");
  EXPECT_DOUBLE_EQ(p.provenance[1].x0, 0.0);
  EXPECT_DOUBLE_EQ(p.provenance[1].y0, 16 * 150.0 / 96);
  EXPECT_DOUBLE_EQ(p.provenance[16].x1, 100.0);
  EXPECT_DOUBLE_EQ(p.provenance[16].y1, 80 * 150.0 / 96);
}

// A patch's box is the region its pixels came from: on a ramp image (red = x, green = y) a
// patch's mean red and green are its box's centre, for every resize mode, stretched or cropped.
TEST(ImagePlugin, ProvenanceBoxesMapToTheRegionThePatchCameFrom) {
  const std::string ramp = ramp_ppm(240, 160);
  for (const char* resize :
       {"pil_bilinear", "pil_bicubic", "opencv_bilinear", "opencv_bicubic", "opencv_area"})
    for (const bool crop : {false, true}) {
      SCOPED_TRACE(std::string(resize) + (crop ? ", centre crop" : ", stretched"));
      std::map<std::string, std::string> options{{"resize", resize}, {"rescale_factor", "1"},
                                                 {"mean", "0"},      {"std", "1"},
                                                 {"cls", "false"},   {"patch_size", "8"}};
      if (crop)
        options.insert({{"center_crop", "true"}, {"image_size", "64"}, {"resize_shortest_edge", "96"}});
      else
        options.insert({{"image_size", "48,96"}});
      const TokenRows t = encode_ok(make_encoder(options), "ramp.ppm", ramp);
      ASSERT_GT(t.size(), 0);
      for (int64_t i = 0; i < t.size(); ++i) {
        const float* f = t.features.data<float>() + i * 192;
        double red = 0, green = 0;
        for (int k = 0; k < 64; ++k) red += f[k] / 64, green += f[64 + k] / 64;
        const tsr_provenance& b = t.provenance[i];
        // Pixel x holds value x at its centre x + 0.5, so a box's mean is its centre − 0.5. Edge
        // patches lean inwards by under a pixel where the filter meets the border.
        const bool edge = b.x0 == 0 || b.y0 == 0 || b.x1 == 240 || b.y1 == 160;
        EXPECT_NEAR(red, (b.x0 + b.x1) / 2 - 0.5, edge ? 1.0 : 0.51) << "patch " << i;
        EXPECT_NEAR(green, (b.y0 + b.y1) / 2 - 0.5, edge ? 1.0 : 0.51) << "patch " << i;
      }
    }
}

// grey: true gives one value per pixel. A grey image keeps its values: its rows are the first
// channel of its RGB rows. A colour image becomes its luma, (299 R + 587 G + 114 B + 500) / 1000;
// at its own size (no resize) the model input is the decoded image, which the picture holds.
TEST(ImagePlugin, GreyGivesOneChannelPerPatch) {
  const std::map<std::string, std::string> size = {{"image_size", "32,48"}, {"patch_size", "8"}};
  std::map<std::string, std::string> grey = size;
  grey["grey"] = "true";
  const Encoder g = make_encoder(grey);
  EXPECT_EQ(g.info().width, 8u * 8);
  EXPECT_EQ(g.info().max_rows, 4 * 6 + 1);
  const TokenRows rgb = encode_file(make_encoder(size), "coins.pgm");
  const TokenRows one = encode_file(g, "coins.pgm");
  ASSERT_EQ(one.features.dim(1), 64);
  ASSERT_EQ(one.size(), rgb.size());
  for (int64_t r = 0; r < one.size(); ++r)
    for (int k = 0; k < 64; ++k)
      ASSERT_EQ(one.features.data<float>()[r * 64 + k], rgb.features.data<float>()[r * 192 + k])
          << "row " << r;

  const TokenRows colour = encode_file(
      make_encoder({{"image_size", "20,30"}, {"patch_size", "10"}, {"grey", "true"}}), "chelsea_tiny.png");
  ASSERT_EQ(colour.picture.width, 30);
  ASSERT_EQ(colour.size(), 1 + 2 * 3);
  const uint8_t* pic = colour.picture.pixels.data();
  for (int64_t r = 1; r < colour.size(); ++r)
    for (int dy = 0; dy < 10; ++dy)
      for (int dx = 0; dx < 10; ++dx) {
        const int y = (r - 1) / 3 * 10 + dy, x = (r - 1) % 3 * 10 + dx;
        const uint8_t* px = pic + (y * 30 + x) * 3;
        const int luma = (299 * px[0] + 587 * px[1] + 114 * px[2] + 500) / 1000;
        const float want = (static_cast<float>(luma * (1.0 / 255.0)) - 0.5f) / 0.5f;
        ASSERT_EQ(colour.features.data<float>()[r * 100 + dy * 10 + dx], want) << "pixel " << x << "," << y;
      }

  const std::string p = "plugin image (" + image_plugin()->file() + "): option ";
  EXPECT_EQ(create_error({{"grey", "true"}, {"mean", "0.5,0.4,0.5"}}),
            p + "mean: \"0.5,0.4,0.5\": with grey: true there is one channel; give one value");
  EXPECT_EQ(create_error({{"grey", "true"}, {"std", "0.2,0.3,0.3"}}),
            p + "std: \"0.2,0.3,0.3\": with grey: true there is one channel; give one value");
  EXPECT_EQ(create_error({{"grey", "no"}}), p + "grey: \"no\" is not true or false");
}

TEST(ImagePlugin, PictureIsShrunkToPictureSize) {
  const TokenRows big = encode_file(make_encoder({{"picture_size", "100"}}), "chelsea.jpg");  // 451×300
  EXPECT_EQ(big.picture.width, 100);
  EXPECT_EQ(big.picture.height, 67);
  EXPECT_EQ(big.picture.x1, 451.0);  // still covering the whole decoded image
  EXPECT_EQ(big.picture.y1, 300.0);
  const TokenRows none = encode_file(make_encoder({{"picture_size", "0"}}), "chelsea.jpg");
  EXPECT_EQ(none.picture.width, 0);
  EXPECT_TRUE(none.picture.pixels.empty());
}

// OpenCV's resizers are faster but are not PIL: measured against the PIL modes on real photos at
// ViT's 224 × 224, in 8-bit levels (docs/plugins/image.md quotes these numbers).
TEST(ImagePlugin, OpencvModesDifferFromPilByMeasuredAmounts) {
  struct Expectation {
    const char* file;
    const char* pil;
    const char* opencv;
    double max_levels, mean_levels;
  };
  const Expectation cases[] = {
      {"astronaut.png", "pil_bilinear", "opencv_bilinear", 40, 2.0},  // 256 → 224: mild downscale
      {"astronaut.png", "pil_bilinear", "opencv_area", 40, 2.0},
      {"astronaut.png", "pil_bicubic", "opencv_bicubic", 40, 2.0},
      {"chelsea.jpg", "pil_bilinear", "opencv_bilinear", 60, 3.0},  // 451 → 224: 2× downscale
      {"chelsea.jpg", "pil_bilinear", "opencv_area", 40, 2.0},
      {"chelsea_tiny.png", "pil_bilinear", "opencv_bilinear", 20, 1.0},  // 30×20 → 224: upscale
      {"chelsea_tiny.png", "pil_bicubic", "opencv_bicubic", 20, 1.0},
  };
  for (const Expectation& x : cases) {
    const std::map<std::string, std::string> raw{{"rescale_factor", "1"}, {"mean", "0"}, {"std", "1"}};
    auto with = [&](const char* resize) {
      auto o = raw;
      o["resize"] = resize;
      return patch_values(encode_file(make_encoder(o), x.file));
    };
    const std::vector<float> pil = with(x.pil), cv = with(x.opencv);
    double sum = 0;
    for (size_t i = 0; i < pil.size(); ++i) sum += std::fabs(pil[i] - cv[i]);
    const double max = max_abs_diff(pil, cv), mean = sum / pil.size();
    std::printf("  %-17s %-13s vs %-16s max %3.0f levels, mean %.3f\n", x.file, x.pil, x.opencv, max, mean);
    EXPECT_LE(max, x.max_levels) << x.file << " " << x.opencv;
    EXPECT_LE(mean, x.mean_levels) << x.file << " " << x.opencv;
    EXPECT_GT(max, 0.0) << "OpenCV and PIL agreeing exactly would make this comparison pointless";
  }
}

TEST(ImagePlugin, EncodersInSeveralThreadsAgree) {
  const std::string bytes = read_file(kData + "chelsea.jpg");
  const std::vector<float> expected = patch_values(encode_ok(make_encoder(), "chelsea.jpg", bytes));
  std::vector<std::thread> threads;
  std::vector<int> same(4, 0);
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      const Encoder e = make_encoder();  // one encoder per thread, as the host does
      for (int k = 0; k < 5; ++k) same[i] += patch_values(encode_ok(e, "chelsea.jpg", bytes)) == expected;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(same, (std::vector<int>{5, 5, 5, 5}));
}

// ---- Bad inputs: each refused as TSR_BAD_INPUT with the item's id and what is wrong ------------

TEST(ImagePluginBadInput, EmptyFile) {
  EXPECT_EQ(bad_input(make_encoder(), "photos/empty.jpg", ""),
            "photos/empty.jpg: empty file (0 bytes): not an image");
}

TEST(ImagePluginBadInput, NotAnImage) {
  const Encoder e = make_encoder();
  EXPECT_EQ(bad_input(e, "notes.txt", "hello, world\n"),
            "notes.txt: not an image in a format this plugin reads (PNG, JPEG, BMP, PNM, TIFF, WebP): it "
            "starts with "
            "bytes 68 65 6c 6c 6f 2c 20 77 (\"hello, w\")");
  EXPECT_EQ(bad_input(e, "anim.gif", std::string("GIF89a\x01\x00\x01\x00", 10)),
            "anim.gif: not an image in a format this plugin reads (PNG, JPEG, BMP, PNM, TIFF, WebP): it "
            "starts with "
            "bytes 47 49 46 38 39 61 01 00 (\"GIF89a..\"); GIF is not supported (OpenCV has no GIF reader): "
            "convert "
            "it to PNG");
}

TEST(ImagePluginBadInput, TruncatedJpeg) {
  const Encoder e = make_encoder();
  const std::string jpeg = read_file(kData + "chelsea.jpg");
  const std::string cut = " (the file was cut short; re-download or re-export it)";
  EXPECT_EQ(bad_input(e, "cat.jpg", jpeg.substr(0, 20000)),
            "cat.jpg: truncated JPEG: the file ends at byte 20000 inside the scan data that starts at byte "
            "623, before "
            "the end-of-image marker" +
                cut);
  EXPECT_EQ(bad_input(e, "cat.jpg", jpeg.substr(0, jpeg.size() - 2)),  // only the end marker missing
            "cat.jpg: truncated JPEG: the file ends at byte " + std::to_string(jpeg.size() - 2) +
                " inside the scan data that starts at byte 623, before the end-of-image marker" + cut);
  EXPECT_EQ(
      bad_input(e, "cat.jpg", jpeg.substr(0, 100)),
      "cat.jpg: truncated JPEG: the marker segment at byte 89 needs 67 bytes but the file ends at byte 100" +
          cut);
}

// Damage inside the compressed scan of a complete JPEG: libjpeg only warns ("Corrupt JPEG data")
// and would hand back a damaged image; the plugin refuses the file with libjpeg's words.
TEST(ImagePluginBadInput, CorruptJpegData) {
  std::string jpeg = read_file(kData + "chelsea.jpg");
  jpeg[15000] = static_cast<char>(0xFF);  // a restart marker where the file has none
  jpeg[15001] = static_cast<char>(0xD3);
  EXPECT_EQ(bad_input(make_encoder(), "cat.jpg", jpeg),
            "cat.jpg: corrupt JPEG: libjpeg says \"Corrupt JPEG data: premature end of data segment\" (the "
            "file is damaged)");
}

TEST(ImagePluginBadInput, CorruptAndTruncatedPng) {
  const Encoder e = make_encoder();
  const std::string png = read_file(kData + "chelsea_tiny.png");
  const size_t idat = png.find("IDAT");
  std::string flipped = png;
  flipped[idat + 20] ^= 0x55;
  EXPECT_EQ(bad_input(e, "x.png", flipped), "x.png: corrupt PNG: chunk IDAT at byte " +
                                                std::to_string(idat - 4) +
                                                " fails its CRC check (the file is "
                                                "damaged)");
  EXPECT_EQ(bad_input(e, "x.png", png.substr(0, png.size() - 12)),  // without IEND
            "x.png: truncated PNG: the file ends at byte " + std::to_string(png.size() - 12) +
                " without its IEND chunk "
                "(the file was cut short; re-download or re-export it)");
  EXPECT_EQ(bad_input(e, "x.png", png.substr(0, 2021)),  // inside the 2609-byte iCCP chunk at byte 33
            "x.png: truncated PNG: chunk iCCP at byte 33 needs 2621 bytes but the file ends at byte 2021 "
            "(the file was "
            "cut short; re-download or re-export it)");
  // Valid CRCs around data that is not a zlib stream.
  std::string garbage = png;
  for (size_t i = idat + 4; i < idat + 40; ++i) garbage[i] = 'Z';
  fix_png_crc(garbage, idat);
  EXPECT_EQ(bad_input(e, "x.png", garbage), "x.png: corrupt PNG: the image data (IDAT at byte " +
                                                std::to_string(idat - 4) + ") is not a zlib stream");
}

TEST(ImagePluginBadInput, ZeroSizeImages) {
  const Encoder e = make_encoder();
  std::string png = read_file(kData + "chelsea_tiny.png");
  const size_t ihdr = png.find("IHDR");
  png.replace(ihdr + 4, 4, std::string("\0\0\0\0", 4));  // width 0
  fix_png_crc(png, ihdr);
  EXPECT_EQ(bad_input(e, "zero.png", png), "zero.png: zero-size PNG image: its header says 0×20 pixels");
  EXPECT_EQ(bad_input(e, "zero.ppm", "P6\n7 0\n255\n"),
            "zero.ppm: zero-size PNM image: its header says 7×0 pixels");
  std::string bmp = read_file(kData + "fruits.bmp");
  bmp.replace(22, 4, std::string("\0\0\0\0", 4));  // height 0
  EXPECT_EQ(bad_input(e, "zero.bmp", bmp), "zero.bmp: zero-size BMP image: its header says 96×0 pixels");
}

TEST(ImagePluginBadInput, TruncatedBmpPnmTiffWebp) {
  const Encoder e = make_encoder();
  const std::string cut = " (the file was cut short; re-download or re-export it)";
  const std::string bmp = read_file(kData + "fruits.bmp");
  EXPECT_EQ(
      bad_input(e, "f.bmp", bmp.substr(0, 5000)),
      "f.bmp: truncated BMP: its pixel data needs 25920 bytes from byte 54 but the file ends at byte 5000" +
          cut);
  const std::string ppm = read_file(kData + "fruits.ppm");
  EXPECT_EQ(bad_input(e, "f.ppm", ppm.substr(0, ppm.size() - 1)),
            "f.ppm: truncated PNM: its raster needs 25920 bytes from byte 13 but the file ends at byte " +
                std::to_string(ppm.size() - 1) + cut);
  EXPECT_EQ(bad_input(e, "a.ppm", "P3 2 2 255 1 2 3 4 5 6"),
            "a.ppm: truncated PNM: it holds 6 of its 12 samples" + cut);
  EXPECT_EQ(bad_input(e, "h.ppm", "P6 96"),
            "h.ppm: truncated or corrupt PNM: its header (P6 width height maxval) "
            "ends early at byte 5");
  const std::string tif = read_file(kData + "butterfly.tif");
  const std::string tif_message = bad_input(e, "b.tif", tif.substr(0, tif.size() / 2));
  EXPECT_EQ(tif_message.rfind("b.tif: truncated TIFF: ", 0), 0u) << tif_message;
  const std::string webp = read_file(kData + "home.webp");
  EXPECT_EQ(bad_input(e, "h.webp", webp.substr(0, 1000)), "h.webp: truncated WebP: its RIFF header says " +
                                                              std::to_string(webp.size()) +
                                                              " bytes but the file ends at byte 1000" + cut);
}

TEST(ImagePluginBadInput, UndecodableWebpAndFloatTiff) {
  const Encoder e = make_encoder();
  std::string webp = read_file(kData + "home.webp");
  for (size_t i = 40; i < webp.size(); ++i) webp[i] = static_cast<char>(0xA5);  // the container stays whole
  EXPECT_EQ(bad_input(e, "h.webp", webp),
            "h.webp: OpenCV could not decode this WebP image of 96×72 pixels: its data is corrupt, or uses a "
            "feature "
            "OpenCV's WebP reader lacks");
  EXPECT_EQ(bad_input(e, "float32.tif", read_file(kData + "float32.tif")),
            "float32.tif: TIFF with 32-bit floating-point samples: only 8- and 16-bit integer images are "
            "read (convert "
            "it to an 8- or 16-bit PNG)");
}

TEST(ImagePluginBadInput, MorePixelsThanMaxPixels) {
  EXPECT_EQ(bad_input(make_encoder({{"max_pixels", "10000"}}), "cat.jpg", read_file(kData + "chelsea.jpg")),
            "cat.jpg: JPEG image of 451×300 pixels is larger than max_pixels (10000); raise the option "
            "max_pixels if "
            "the image is genuine");
  // A 64-byte PNG header claiming 100000 × 100000 pixels is refused before anything is allocated.
  std::string png = read_file(kData + "chelsea_tiny.png");
  const size_t ihdr = png.find("IHDR");
  png.replace(ihdr + 4, 8, std::string("\x00\x01\x86\xa0\x00\x01\x86\xa0", 8));
  fix_png_crc(png, ihdr);
  EXPECT_NE(bad_input(make_encoder(), "bomb.png", png).find("100000×100000 pixels is larger than max_pixels"),
            std::string::npos);
}

TEST(ImagePluginBadInput, TooElongatedForACentreCrop) {
  // 2 × 200000 pixels: a shortest edge of 224 would make the long side 22.4 million pixels.
  const std::string pgm = "P5\n2 200000\n255\n" + std::string(400000, '\x80');
  EXPECT_EQ(bad_input(make_encoder({{"center_crop", "true"}}), "strip.pgm", pgm),
            "strip.pgm: a 2×200000 image is too elongated for center_crop: its long side would be resized to "
            "22400000 pixels (crop it first, or resize without center_crop)");
}

// Every strict prefix of a file is refused, never decoded in part (TIFF: every cut inside its
// strips); and no flipped byte crashes the plugin — it either decodes or is refused.
TEST(ImagePluginBadInput, EveryTruncationIsRefusedAndNoCorruptionCrashes) {
  const Encoder e = make_encoder({{"image_size", "32"}});
  for (const auto& [file, how] : manifest()["files"].items()) {
    SCOPED_TRACE(file);
    const std::string bytes = read_file(kData + file);
    const bool tiff = file.find(".tif") != std::string::npos;
    for (size_t n = 0; n < bytes.size(); n += 1 + bytes.size() / 61) {
      auto r = encode_bytes(e, file, bytes.substr(0, n));
      if (tiff && r.ok()) continue;  // a cut after the last strip can leave a readable TIFF
      ASSERT_FALSE(r.ok()) << "a " << n << "-byte prefix was accepted";
      ASSERT_EQ(r.status().code(), Code::parse_error) << r.status().message();
      ASSERT_EQ(r.status().message().rfind(file + ": ", 0), 0u) << r.status().message();
    }
    uint32_t seed = 12345;
    for (int k = 0; k < 40; ++k) {
      std::string flipped = bytes;
      seed = seed * 1664525u + 1013904223u;
      flipped[seed % flipped.size()] ^= static_cast<char>(1 + (seed >> 24) % 255);
      auto r = encode_bytes(e, file, flipped);
      if (!r.ok()) {
        ASSERT_EQ(r.status().code(), Code::parse_error) << r.status().message();
      }
    }
  }
}

// Truncated files are caught before OpenCV, and ancillary PNG chunks (astronaut.png carries an
// iCCP profile libpng complains about) never reach libpng: nothing is written to stderr.
TEST(ImagePluginBadInput, NothingOnStderr) {
  const Encoder e = make_encoder();
  ::testing::internal::CaptureStderr();
  encode_file(e, "astronaut.png");
  for (const char* file :
       {"chelsea.jpg", "astronaut.png", "fruits.bmp", "fruits.ppm", "butterfly.tif", "home.webp"}) {
    const std::string bytes = read_file(kData + file);
    (void)encode_bytes(e, file, bytes.substr(0, bytes.size() * 2 / 3));
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

// ---- Bad options: refused at create() with the option named -----------------------------------

TEST(ImagePluginOptions, BadValuesNameTheOption) {
  const std::string p = "plugin image (" + image_plugin()->file() + "): option ";
  EXPECT_EQ(create_error({{"image_size", "224,200"}}),
            p + "image_size: \"224,200\": 200 is not a multiple of patch_size 16 (use 192 or 208)");
  EXPECT_EQ(create_error({{"image_size", "8"}}),
            p + "image_size: \"8\": 8 is not a multiple of patch_size 16 (use 16)");
  EXPECT_EQ(create_error({{"image_size", "0"}}), p + "image_size: \"0\": each side must be in 1..16384");
  EXPECT_EQ(create_error({{"image_size", "1,2,3"}}),
            p + "image_size: \"1,2,3\": give one size (a square) or two, height,width");
  EXPECT_EQ(create_error({{"image_size", "a"}}),
            p + "image_size: option \"image_size\": \"a\" is not an integer");
  EXPECT_EQ(create_error({{"patch_size", "0"}}), p + "patch_size: 0 is outside 1..1024");
  EXPECT_EQ(create_error({{"resize", "lanczos"}}),
            p + "resize: \"lanczos\" is not one of "
                "pil_bilinear|pil_bicubic|opencv_bilinear|opencv_bicubic|opencv_area");
  EXPECT_EQ(create_error({{"resize_shortest_edge", "256"}}),
            p + "resize_shortest_edge: 256 needs center_crop: true (without a crop the image is resized to "
                "image_size)");
  EXPECT_EQ(
      create_error({{"center_crop", "true"}, {"resize_shortest_edge", "200"}}),
      p + "resize_shortest_edge: 200 must be 0 or in 224..65536, so the centre crop of image_size fits");
  EXPECT_EQ(create_error({{"rescale_factor", "0"}}),
            p + "rescale_factor: \"0\" must be a finite number above 0");
  EXPECT_EQ(create_error({{"rescale_factor", "nan"}}),
            p + "rescale_factor: \"nan\" must be a finite number above 0");
  EXPECT_EQ(create_error({{"mean", "0.5,0.5"}}),
            p + "mean: \"0.5,0.5\" has 2 values; give one value for all channels or three (R,G,B)");
  EXPECT_EQ(create_error({{"mean", "0.5,x,0.5"}}), p + "mean: option \"mean\": \"x\" is not a number");
  EXPECT_EQ(create_error({{"std", "0.5,0,0.5"}}),
            p + "std: \"0.5,0,0.5\": every value must be a finite number other than 0 (it divides)");
  EXPECT_EQ(create_error({{"std", "inf"}}),
            p + "std: \"inf\": every value must be a finite number other than 0 (it divides)");
  EXPECT_EQ(create_error({{"picture_size", "-1"}}),
            p + "picture_size: -1 is outside 0..8192 (0: no picture)");
  EXPECT_EQ(create_error({{"max_pixels", "0"}}), p + "max_pixels: 0 must be at least 1");
  EXPECT_EQ(create_error({{"cls", "yes"}}), p + "cls: \"yes\" is not true or false");
  EXPECT_EQ(create_error({{"center_crop", "1"}}), p + "center_crop: \"1\" is not true or false");
  EXPECT_EQ(
      create_error({{"rescale_factor", "1e300"}}),
      p + "rescale_factor: with mean 0.5,0.5,0.5 and std 0.5,0.5,0.5, the value 1 would become inf (out of "
          "float range)");
}

TEST(ImagePluginOptions, OneValueMeanAndStdApplyToEveryChannel) {
  const TokenRows one = encode_file(make_encoder({{"mean", "0.25"}, {"std", "2"}}), "chelsea_tiny.png");
  const TokenRows three =
      encode_file(make_encoder({{"mean", "0.25,0.25,0.25"}, {"std", "2,2,2"}}), "chelsea_tiny.png");
  EXPECT_EQ(patch_values(one), patch_values(three));
}

// Training augmentation: a shift by (dy, dx) in [-pad, pad]² with black filling in (torchvision's
// RandomCrop(size, padding=pad)), then a mirror on a fair coin. Every output is one of those
// transforms of the encoded image, held against a plain loop over its pixels; the CLS row is kept;
// the same seed gives the same rows; over many seeds every shift and both coin sides turn up.
TEST(ImagePlugin, AugmentShiftsAndMirrorsThePatches) {
  const std::map<std::string, std::string> size = {{"image_size", "32,48"}, {"patch_size", "8"}, {"grey", "true"},
                                                   {"mean", "0.25"}, {"std", "0.5"}};
  EXPECT_FALSE(make_encoder(size).augments());
  const TokenRows plain = encode_file(make_encoder(size), "coins.pgm");
  std::vector<float> out(static_cast<size_t>(plain.features.numel()));
  EXPECT_EQ(make_encoder(size).augment(plain, 1, out.data()).code(), Code::unsupported);

  std::map<std::string, std::string> opts = size;
  opts["augment_crop_padding"] = "3";
  opts["augment_flip"] = "true";
  const Encoder e = make_encoder(opts);
  ASSERT_TRUE(e.augments());
  const TokenRows t = encode_file(e, "coins.pgm");
  const int64_t p = 8, H = 32, W = 48, F = p * p;
  ASSERT_EQ(t.size(), 1 + (H / p) * (W / p));
  const float* in = t.features.data<float>();
  auto pixel = [&](int64_t y, int64_t x) {  // the encoded image at (y, x); black outside
    if (y < 0 || y >= H || x < 0 || x >= W) return (0.0f - 0.25f) / 0.5f;
    return in[(1 + (y / p) * (W / p) + x / p) * F + (y % p) * p + x % p];
  };
  auto transformed = [&](int64_t dy, int64_t dx, bool flip) {
    std::vector<float> v(static_cast<size_t>(t.features.numel()));
    std::copy(in, in + F, v.begin());  // CLS
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x)
        v[static_cast<size_t>((1 + (y / p) * (W / p) + x / p) * F + (y % p) * p + x % p)] =
            pixel(y + dy, (flip ? W - 1 - x : x) + dx);
    return v;
  };
  std::set<std::tuple<int64_t, int64_t, bool>> seen;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    ASSERT_TRUE(e.augment(t, seed, out.data()).ok());
    std::vector<float> again(out.size());
    ASSERT_TRUE(e.augment(t, seed, again.data()).ok());
    ASSERT_EQ(again, out) << "seed " << seed;
    int matches = 0;
    for (int64_t dy = -3; dy <= 3; ++dy)
      for (int64_t dx = -3; dx <= 3; ++dx)
        for (bool flip : {false, true})
          if (transformed(dy, dx, flip) == out) {
            ++matches;
            seen.insert({dy, dx, flip});
          }
    ASSERT_GE(matches, 1) << "seed " << seed << ": not a shift-and-mirror of the image";
  }
  std::set<int64_t> dys, dxs;
  int flips = 0;
  for (const auto& [dy, dx, flip] : seen) dys.insert(dy), dxs.insert(dx), flips += flip;
  EXPECT_EQ(dys.size(), 7u);
  EXPECT_EQ(dxs.size(), 7u);
  EXPECT_GT(flips, 0);
  EXPECT_LT(flips, static_cast<int>(seen.size()));

  const std::string where = "plugin image (" + image_plugin()->file() + "): option ";
  EXPECT_EQ(create_error({{"image_size", "32,48"}, {"patch_size", "8"}, {"augment_crop_padding", "33"}}),
            where + "augment_crop_padding: 33 is outside 0..32 (pixels of padding, at most the image's shorter side)");
  EXPECT_EQ(create_error({{"augment_crop_padding", "-1"}}),
            where + "augment_crop_padding: -1 is outside 0..224 (pixels of padding, at most the image's shorter side)");
}
