// IDX files as a dataset (data.format idx): the committed Fashion-MNIST sample listed as 64 items
// with ids and labels, the image plugin's rows for an item equal to patches cut by hand from the
// IDX bytes, the example experiment run over the sample (64 embeddings) and checked with
// `tessera check`, and every mismatch between the files refused naming them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "process_util.h"
#include "tessera/config.h"
#include "tessera/idx.h"
#include "tessera/npy.h"
#include "tessera/plugins.h"
#include "tessera/run.h"

using namespace tessera;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kSample = std::string(TESSERA_TEST_DATA) + "/image/fashion-mnist/";
const std::string kImages = kSample + "t10k-images-idx3-ubyte.gz";
const std::string kLabels = kSample + "t10k-labels-idx1-ubyte.gz";
const std::vector<std::string> kNames = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                         "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
const std::vector<PluginInput> kImagePlugin = {{"image", TSR_INPUT_FILE, {".png", ".pgm"}}};

std::string temp_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "tessera_idx_dataset_" + name + "_" + std::to_string(getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// A plain idx1 labels file.
std::string labels_file(const std::vector<uint8_t>& values) {
  return std::string("\0\0\x08\x01", 4) + be32(static_cast<uint32_t>(values.size())) +
         std::string(values.begin(), values.end());
}

DataConfig idx_data(const std::string& path, const std::string& labels = "",
                    const std::vector<std::string>& names = {}) {
  DataConfig d;
  d.path = path;
  d.labels = labels;
  d.label_names = names;
  return d;
}

std::string refusal(const DataConfig& d, const std::vector<PluginInput>& plugins = kImagePlugin) {
  Result<std::vector<DataItem>> r = read_dataset(d, plugins);
  EXPECT_FALSE(r.ok()) << d.path << " was listed";
  return r.ok() ? "" : r.status().message();
}

// The image plugin with every option at its default but `overrides`.
Encoder image_encoder(const std::map<std::string, std::string>& overrides) {
  Result<std::shared_ptr<const Plugin>> p =
      Plugin::load(std::string(TESSERA_PLUGIN_BUILD_DIR) + "/libtessera_image.so");
  EXPECT_TRUE(p.ok()) << p.status().message();
  std::vector<std::pair<std::string, std::string>> options;
  for (const PluginOptionSpec& spec : (*p)->options()) {
    auto it = overrides.find(spec.name);
    options.emplace_back(spec.name, it != overrides.end() ? it->second : spec.default_value.value_or(""));
  }
  Result<Encoder> e = Encoder::create(*p, options);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e).value();
}

// Image 0 of the sample as the image plugin normalises it: float32(v · 1/255), minus the mean,
// over the std, in float32 (docs/plugins/image.md).
std::vector<float> normalised_image0(double mean, double std) {
  Result<Tensor> images = idx::load(kImages);
  EXPECT_TRUE(images.ok()) << images.status().message();
  std::vector<float> out(28 * 28);
  for (int i = 0; i < 28 * 28; ++i) {
    const float x = static_cast<float>(images->data<uint8_t>()[i] * (1.0 / 255.0));
    out[static_cast<size_t>(i)] = (x - static_cast<float>(mean)) / static_cast<float>(std);
  }
  return out;
}

using Ran = tessera::testing_util::CliRun;

// The built `tessera` in the source folder, as a user runs it.
Ran run_cli(const std::string& args) { return tessera::testing_util::run_tessera_cli(args); }

}  // namespace

TEST(IdxDataset, ListsTheSampleWithIdsAndLabels) {
  Result<std::vector<DataItem>> items = read_dataset(idx_data(kImages, kLabels, kNames), kImagePlugin);
  ASSERT_TRUE(items.ok()) << items.status().message();
  ASSERT_EQ(items->size(), 64u);
  const DataItem& first = (*items)[0];
  EXPECT_EQ(first.id, "t10k-images-idx3-ubyte.gz#0");
  EXPECT_EQ(first.label, std::optional<std::string>("Ankle boot"));      // label 9
  EXPECT_EQ((*items)[1].label, std::optional<std::string>("Pullover"));  // label 2
  EXPECT_EQ((*items)[63].id, "t10k-images-idx3-ubyte.gz#63");
  EXPECT_EQ((*items)[63].label, std::optional<std::string>("Sandal"));  // label 5
  EXPECT_TRUE(first.error.empty());
  // Each image is a binary PGM file in memory, named by the IDX file it came from.
  ASSERT_EQ(first.parts.size(), 1u);
  const ItemPart& part = first.parts[0];
  EXPECT_TRUE(part.in_memory);
  EXPECT_EQ(part.path, kImages);
  const std::string pgm_header = "P5\n28 28\n255\n";
  ASSERT_EQ(part.bytes.size(), pgm_header.size() + 784);
  EXPECT_EQ(part.bytes.substr(0, pgm_header.size()), pgm_header);
  Result<Tensor> images = idx::load(kImages);
  ASSERT_TRUE(images.ok());
  EXPECT_EQ(part.bytes.substr(pgm_header.size()),
            std::string(reinterpret_cast<const char*>(images->data<uint8_t>()), 784));

  // Without names the label is the class number; without a labels file there is none.
  Result<std::vector<DataItem>> numbers = read_dataset(idx_data(kImages, kLabels), kImagePlugin);
  ASSERT_TRUE(numbers.ok()) << numbers.status().message();
  EXPECT_EQ((*numbers)[0].label, std::optional<std::string>("9"));
  EXPECT_EQ((*numbers)[1].label, std::optional<std::string>("2"));
  Result<std::vector<DataItem>> bare = read_dataset(idx_data(kImages), kImagePlugin);
  ASSERT_TRUE(bare.ok());
  EXPECT_FALSE((*bare)[0].label.has_value());

  DataConfig limited = idx_data(kImages, kLabels, kNames);
  limited.limit = 10;
  Result<std::vector<DataItem>> ten = read_dataset(limited, kImagePlugin);
  ASSERT_TRUE(ten.ok());
  EXPECT_EQ(ten->size(), 10u);
}

TEST(IdxDataset, FormatFromTheFileName) {
  const std::string d = temp_dir("names");
  const std::string images = slurp(kImages);
  for (const std::string name :
       {"train-images-idx3-ubyte", "train-images.idx3-ubyte", "TRAIN-IMAGES-IDX3-UBYTE.GZ", "digits.idx"}) {
    write(d + "/" + name, images);
    Result<std::vector<DataItem>> items = read_dataset(idx_data(d + "/" + name), kImagePlugin);
    ASSERT_TRUE(items.ok()) << name << ": " << items.status().message();
    EXPECT_EQ((*items)[5].id, name + "#5");
  }
  // Any other name is read as IDX when data.format says so.
  write(d + "/images.bin", images);
  DataConfig explicit_idx = idx_data(d + "/images.bin");
  explicit_idx.format = DataFormat::idx;
  Result<std::vector<DataItem>> items = read_dataset(explicit_idx, kImagePlugin);
  ASSERT_TRUE(items.ok()) << items.status().message();
  EXPECT_EQ(items->size(), 64u);
}

TEST(IdxDataset, RefusalsNameBothFiles) {
  const std::string d = temp_dir("refusals");
  write(d + "/ten-labels-idx1-ubyte", labels_file(std::vector<uint8_t>(10, 1)));
  EXPECT_EQ(refusal(idx_data(kImages, d + "/ten-labels-idx1-ubyte")),
            d + "/ten-labels-idx1-ubyte holds 10 labels, but " + kImages +
                " holds 64 images (give the labels file of the same split)");
  std::vector<uint8_t> values(64, 3);
  values[12] = 10;
  write(d + "/bad-labels-idx1-ubyte", labels_file(values));
  EXPECT_EQ(refusal(idx_data(kImages, d + "/bad-labels-idx1-ubyte", kNames)),
            d + "/bad-labels-idx1-ubyte: byte 20 of the IDX data: image 12's label 10 has no name "
                "(data.label_names names 10, for labels 0..9)");
  // The files swapped.
  EXPECT_EQ(
      refusal(idx_data(kImages, kImages)),
      kImages +
          ": holds u8 (64, 28, 28), but an IDX labels file holds one u8 per image (idx1: magic 00 00 08 01)");
  DataConfig labels_as_images = idx_data(kLabels);
  labels_as_images.format = DataFormat::idx;
  EXPECT_EQ(refusal(labels_as_images), kLabels +
                                           ": holds u8 (64), but an IDX image file holds u8 images (count, "
                                           "rows, cols; idx3: magic 00 00 08 03)");
  // A broken file's own message comes through.
  write(d + "/cut-images-idx3-ubyte", slurp(kImages).substr(0, 1000));
  const std::string cut = refusal(idx_data(d + "/cut-images-idx3-ubyte"));
  EXPECT_EQ(
      cut.rfind(d + "/cut-images-idx3-ubyte: truncated: the header says 64 × 28 × 28 u8 = 50176 bytes", 0),
      0u)
      << cut;
  // A labels file for another kind of dataset, and plugins that cannot take images.
  write(d + "/lines.txt", "a\n");
  EXPECT_EQ(refusal(idx_data(d + "/lines.txt", kLabels)),
            d + "/lines.txt is read as lines, but data.labels (" + kLabels +
                ") belongs to IDX images (name them *-idx3-ubyte(.gz) or *.idx, or set data.format: idx)");
  EXPECT_EQ(refusal(idx_data(kImages), {{"text", TSR_INPUT_TEXT, {}}}),
            kImages +
                " holds IDX images, but plugin text reads text (use a plugin that reads image files, such as "
                "image)");
  EXPECT_EQ(refusal(idx_data(kImages), {kImagePlugin[0], {"text", TSR_INPUT_TEXT, {}}}),
            "an IDX dataset feeds exactly one plugin, but the experiment has 2 (pair inputs of several "
            "plugins in a "
            "manifest)");
}

TEST(IdxDataset, ConfigKeys) {
  const std::string model = "model: {d_model: 16, stem: {kind: features, n_features: 16}}\n";
  Diagnostics d;
  std::optional<Experiment> e = load_experiment_from_string(
      model +
          "data:\n  path: t10k-images-idx3-ubyte.gz\n  labels: t10k-labels-idx1-ubyte.gz\n"
          "  label_names: [a, b]\n",
      "exp.yaml", kSample, {}, &d);
  ASSERT_TRUE(e) << d.str();
  EXPECT_EQ(e->data.labels, kLabels);  // relative to the YAML, like data.path
  EXPECT_EQ(e->data.label_names, (std::vector<std::string>{"a", "b"}));
  EXPECT_NE(to_yaml(*e).find("  labels: \"" + kLabels + "\"\n  label_names: [\"a\", \"b\"]\n"),
            std::string::npos)
      << to_yaml(*e);

  Diagnostics names_alone;
  EXPECT_FALSE(
      load_experiment_from_string(model + "data:\n  path: t10k-images-idx3-ubyte.gz\n  label_names: [a]\n",
                                  "exp.yaml", kSample, {}, &names_alone));
  EXPECT_EQ(
      names_alone.str(),
      "exp.yaml:4:3: data.label_names: names for the labels, but no data.labels file (give data.labels, the "
      "idx1 file of the images' labels)");
  Diagnostics wrong_format;
  EXPECT_FALSE(load_experiment_from_string(
      model +
          "data:\n  path: t10k-images-idx3-ubyte.gz\n  format: lines\n  labels: t10k-labels-idx1-ubyte.gz\n",
      "exp.yaml", kSample, {}, &wrong_format));
  EXPECT_EQ(wrong_format.str(),
            "exp.yaml:5:3: data.labels: a labels file belongs to an IDX dataset, but data.format is lines "
            "(manifests "
            "give each item's label in a label column)");

  // The validation and test sets of an IDX dataset come with their own labels files.
  const std::string data = "data:\n  path: t10k-images-idx3-ubyte.gz\n  labels: t10k-labels-idx1-ubyte.gz\n";
  Diagnostics both;
  e = load_experiment_from_string(model + data +
                                      "train:\n  test_data: t10k-images-idx3-ubyte.gz\n"
                                      "  test_labels: t10k-labels-idx1-ubyte.gz\n",
                                  "exp.yaml", kSample, {}, &both);
  ASSERT_TRUE(e) << both.str();
  EXPECT_EQ(e->train.test_labels, kLabels);
  Diagnostics no_labels;
  EXPECT_FALSE(load_experiment_from_string(model + data + "train:\n  validation_data: t10k-images-idx3-ubyte.gz\n",
                                           "exp.yaml", kSample, {}, &no_labels));
  EXPECT_EQ(no_labels.str(),
            "exp.yaml:6:3: train.validation_data: an IDX set without its labels (give train.validation_labels, the "
            "idx1 file of its images' labels)");
  Diagnostics no_set;
  EXPECT_FALSE(load_experiment_from_string(model + data + "train:\n  test_labels: t10k-labels-idx1-ubyte.gz\n",
                                           "exp.yaml", kSample, {}, &no_set));
  EXPECT_EQ(no_set.str(),
            "exp.yaml:6:3: train.test_labels: a labels file, but no train.test_data (give train.test_data, the idx3 "
            "file of the images these label)");
}

// Item 0's rows from the image plugin, given the item's bytes as a run gives them: a CLS row, then
// 7 × 7 patches of 4 × 4 grey values (or 4 × 4 of 7 × 7 in R, G, B), each equal to the patch cut
// from the IDX bytes by hand and normalised.
TEST(IdxDataset, ImagePluginRowsArePatchesOfTheIdxImage) {
  Result<std::vector<DataItem>> items = read_dataset(idx_data(kImages), kImagePlugin);
  ASSERT_TRUE(items.ok()) << items.status().message();
  const ItemPart& part = (*items)[0].parts[0];
  PluginItem item;
  item.id = (*items)[0].id;
  item.source = part.path;
  item.data = part.bytes;

  const std::vector<float> grey = normalised_image0(0.2860, 0.3530);
  const Encoder g = image_encoder(
      {{"image_size", "28"}, {"patch_size", "4"}, {"grey", "true"}, {"mean", "0.2860"}, {"std", "0.3530"}});
  Result<std::vector<TokenRows>> rows = g.encode(item);
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 1u);
  const TokenRows& t = (*rows)[0];
  ASSERT_EQ(t.size(), 50);
  ASSERT_EQ(t.features.dim(1), 16);
  EXPECT_EQ(t.roles[0], TSR_ROLE_CLS);
  EXPECT_EQ(t.grid_rows, 7);
  EXPECT_EQ(t.grid_cols, 7);
  for (int r = 0; r < 7; ++r)
    for (int c = 0; c < 7; ++c) {
      const int64_t row = 1 + r * 7 + c;
      EXPECT_EQ(t.positions[static_cast<size_t>(row)], (std::array<int32_t, 2>{r, c}));
      const tsr_provenance& box = t.provenance[static_cast<size_t>(row)];
      EXPECT_EQ(box.kind, TSR_PROV_PIXELS);
      const std::array<double, 4> got = {box.x0, box.y0, box.x1, box.y1};
      EXPECT_EQ(got, (std::array<double, 4>{4.0 * c, 4.0 * r, 4.0 * c + 4, 4.0 * r + 4}));
      for (int dy = 0; dy < 4; ++dy)
        for (int dx = 0; dx < 4; ++dx)
          ASSERT_EQ(t.features.data<float>()[row * 16 + dy * 4 + dx],
                    grey[static_cast<size_t>((4 * r + dy) * 28 + 4 * c + dx)])
              << "patch " << r << "," << c << " pixel " << dx << "," << dy;
    }

  // Without grey, the defaults' mean and std, 7 × 7 patches: the grey values in each of R, G, B.
  const std::vector<float> rgb_values = normalised_image0(0.5, 0.5);
  Result<std::vector<TokenRows>> rgb =
      image_encoder({{"image_size", "28"}, {"patch_size", "7"}}).encode(item);
  ASSERT_TRUE(rgb.ok()) << rgb.status().message();
  const TokenRows& u = (*rgb)[0];
  ASSERT_EQ(u.size(), 17);
  ASSERT_EQ(u.features.dim(1), 3 * 49);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c)
      for (int ch = 0; ch < 3; ++ch)
        for (int dy = 0; dy < 7; ++dy)
          for (int dx = 0; dx < 7; ++dx)
            ASSERT_EQ(u.features.data<float>()[(1 + r * 4 + c) * 147 + (ch * 7 + dy) * 7 + dx],
                      rgb_values[static_cast<size_t>((7 * r + dy) * 28 + 7 * c + dx)])
                << "patch " << r << "," << c << " channel " << ch;
}

// The committed example, pointed at the sample: 64 images, one 64-d embedding each, labelled.
TEST(IdxDataset, RunOfTheExampleWritesAnEmbeddingPerImage) {
  const std::string out = temp_dir("run");
  LoadOptions lo;
  lo.overrides = {"data.path=" + kImages, "data.labels=" + kLabels};
  Diagnostics d;
  std::optional<Experiment> e = load_experiment(
      std::string(TESSERA_SOURCE_DIR) + "/configs/experiments/fashion_mnist_embed.yaml", lo, &d);
  ASSERT_TRUE(e) << d.str();
  RunOptions o;
  o.out_dir = out;
  o.progress = false;
  Result<RunSummary> s = run_experiment(*e, o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->items, 64);
  EXPECT_EQ(s->sequences, 64);
  EXPECT_EQ(s->failed, 0);

  Result<Tensor> emb = npy::load(out + "/embeddings.npy");
  ASSERT_TRUE(emb.ok()) << emb.status().message();
  EXPECT_EQ(emb->describe(), "f32 (64, 64)");
  const std::vector<float> v = emb->to_vector();
  for (float x : v) ASSERT_TRUE(std::isfinite(x));
  EXPECT_NE(std::vector<float>(v.begin(), v.begin() + 64),
            std::vector<float>(v.begin() + 64, v.begin() + 128));

  std::ifstream index(out + "/index.jsonl");
  std::vector<json> lines;
  for (std::string l; std::getline(index, l);) lines.push_back(json::parse(l));
  ASSERT_EQ(lines.size(), 64u);
  EXPECT_EQ(lines[0]["id"], "t10k-images-idx3-ubyte.gz#0");
  EXPECT_EQ(lines[0]["label"], "Ankle boot");
  EXPECT_EQ(lines[0]["rows"], 50);
  EXPECT_EQ(lines[63]["id"], "t10k-images-idx3-ubyte.gz#63");
  EXPECT_EQ(lines[63]["label"], "Sandal");
  const json manifest = json::parse(slurp(out + "/manifest.json"));
  EXPECT_EQ(manifest["plugins"][0]["version"], "1.2.0");
  EXPECT_EQ(manifest["state"], "complete");
}

// `tessera check` on the example over the sample: the items, and 50 rows for every image.
TEST(IdxDataset, CheckShowsItemsAndRows) {
  const Ran r = run_cli(
      "check configs/experiments/fashion_mnist_embed.yaml --set "
      "data.path=tests/data/image/fashion-mnist/t10k-images-idx3-ubyte.gz --set "
      "data.labels=tests/data/image/fashion-mnist/t10k-labels-idx1-ubyte.gz");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("t10k-images-idx3-ubyte.gz: 64 items; the first 16 encoded"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rows per sequence  min 50, median 50, max 50"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("features, 16 wide"), std::string::npos) << r.out;
}
