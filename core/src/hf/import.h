// The importer's shared pieces (private to core/src/hf): the folder context that collects
// diagnostics, typed and ranged reads of settings files, the bounds of config.json's sizes, and
// Build, what a family's reader (family_<name>.cpp) fills from config.json and the files beside it.
// import.cpp reads the folder, picks the reader from its table by model_type, then maps and
// checks every tensor the same way for all families.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "io/json_file.h"
#include "mapping.h"
#include "tessera/hf.h"
#include "tessera/safetensors.h"

namespace tessera::hf::imp {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string join_list(const std::vector<std::string>& v, const char* sep = ", ");
std::string fmt(double v);  // 17 significant digits
bool ends_with(const std::string& s, const std::string& suffix);
bool starts_with(const std::string& s, const std::string& prefix);

struct Ctx {
  std::string dir;
  Location where;
  Diagnostics* d = nullptr;
  size_t errors = 0;
  size_t bad_values = 0;  // settings of a wrong type or out of their range (Json)
  void err(const std::string& problem, const std::string& hint = "") {
    d->add(where, "model.path", problem, hint);
    ++errors;
  }
  std::string at(const std::string& name) const { return (fs::path(dir) / name).string(); }
  bool has(const std::string& name) const { return fs::is_regular_file(at(name)); }
};

// Reads a JSON object through jsonfile (size checked before reading, depth and memory before
// parsing, no exception out); a parse error names the file with line and column.
bool read_json(Ctx& c, const std::string& name, json* out, bool object = true);

// The ranges config.json's sizes must lie in (docs/RELIABILITY.md lists them). Generous for
// every checkpoint Tessera's families have (BERT-large 1024 wide, 24 layers; ESM-2 15B 5120 wide,
// 48 layers), and small enough that no product of them overflows before the model's own checks.
namespace bound {
constexpr int64_t kWidth = 1 << 16;      // hidden_size, n_embd
constexpr int64_t kLayers = 1024;        // num_hidden_layers, n_layer
constexpr int64_t kHeads = 1024;         // num_attention_heads, n_head
constexpr int64_t kFf = 1 << 20;         // intermediate_size, n_inner
constexpr int64_t kPositions = 1 << 20;  // max_position_embeddings, n_positions, AST max_length
constexpr int64_t kVocab = 1 << 24;      // vocab_size, token ids
constexpr int64_t kTypes = 1024;         // type_vocab_size
constexpr int64_t kImage = 16384;        // image_size, the processor's height and width
constexpr int64_t kGridCells = 1 << 16;  // ViT patches of an image_size other than config.json's
constexpr int64_t kPatch = 1024;         // patch_size, strides
constexpr int64_t kChannels = 64;        // num_channels
constexpr int64_t kMels = 4096;          // num_mel_bins
constexpr int64_t kLabels = 1 << 20;     // num_labels, id2label
constexpr int64_t kRate = 1 << 24;       // sampling_rate
}  // namespace bound

// Typed reads of a settings file's keys; a wrong type, a value out of its range or a missing
// required key names the file, the key, what was expected and what was found, once. Such a value
// sets Ctx::bad_values, which stops the import before the tensors are checked (a wrong size would
// only repeat itself as one message per tensor).
struct Json {
  Ctx* c;
  const json* j;
  std::string file;
  const json* find(const char* key) const {
    auto it = j->find(key);
    return it == j->end() || it->is_null() ? nullptr : &*it;
  }
  void bad(const char* key, const std::string& expected, const json* found) const {
    c->err(file + ": key \"" + key + "\": expected " + expected +
           (found ? ", found " + jsonfile::brief(*found) : ", but it is missing"));
    ++c->bad_values;
  }
  // An integer in [lo, hi]; `def` when the key is absent (required when there is none).
  int64_t i(const char* key, std::optional<int64_t> def, int64_t lo, int64_t hi) const {
    const json* v = find(key);
    const int64_t fallback = std::clamp(def.value_or(lo), lo, hi);
    const std::string want = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (!v) {
      if (!def) bad(key, want, nullptr);
      return def ? *def : fallback;
    }
    const bool fits = v->is_number_unsigned() ? v->get<uint64_t>() <= static_cast<uint64_t>(hi)
                                              : v->is_number_integer() && v->get<int64_t>() <= hi;
    if (!fits || v->get<int64_t>() < lo) {
      bad(key, want, v);
      return fallback;
    }
    return v->get<int64_t>();
  }
  // A finite number in [lo, hi], or (lo, hi] when lo_open.
  double f(const char* key, double def, double lo, double hi, bool lo_open = false) const {
    const json* v = find(key);
    if (!v) return def;
    const double x = v->is_number() ? v->get<double>() : NAN;
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
      bad(key, std::string("a finite number in ") + (lo_open ? "(" : "[") + fmt(lo) + ", " + fmt(hi) + "]",
          v);
      return def;
    }
    return x;
  }
  std::string s(const char* key, const std::string& def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_string()) {
      c->err(file + ": key \"" + key + "\": expected a string, found " + jsonfile::brief(*v));
      return def;
    }
    return v->get<std::string>();
  }
  bool b(const char* key, bool def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) {
      c->err(file + ": key \"" + key + "\": expected true or false, found " + jsonfile::brief(*v));
      return def;
    }
    return v->get<bool>();
  }
};

// The checkpoint's tensors, over one file or the shards an index names.
struct Store {
  std::vector<std::shared_ptr<safetensors::File>> files;
  std::map<std::string, size_t> file_of;  // tensor name -> index in files
  std::set<std::string> used;
  std::string file_name(const std::string& tensor) const {
    return fs::path(files[file_of.at(tensor)]->path()).filename().string();
  }
  const safetensors::TensorInfo* info(const std::string& name) const {
    auto it = file_of.find(name);
    return it == file_of.end() ? nullptr : files[it->second]->find(name);
  }
};

struct Grid {              // pos_grid
  int64_t g0 = 0;          // side of the checkpoint's square grid
  int64_t gh = 0, gw = 0;  // the requested grid
  double scale_h = 1, scale_w = 1;
};

// Activation names of config.json.
bool activation_of(Ctx& c, const std::string& file, const std::string& key, const std::string& v,
                   Activation* out);
// Class names from config.json's id2label, in index order.
std::vector<std::string> labels_of(const json& cfg, int64_t n);
// id2label's size, else num_labels.
int64_t num_labels(const json& cfg, const Json& J);

// What a family's reader fills: the ModelConfig (in out.model), the plugin and its options, the
// tensors it knowingly leaves out, and how the checkpoint lays out its tensors.
struct Build {
  Ctx& c;
  const json& cfg;
  const Json& J;  // over cfg
  const std::string& cfg_path;
  const ImportOptions& opt;
  const Store& st;
  Folder& out;
  ModelConfig& m;                   // out.model
  const std::string type;           // bert, gpt2, vit, esm, ast
  int64_t C = 0;                    // config.json's hidden size
  std::set<std::string> ignorable;  // tensors Tessera knowingly leaves out
  std::vector<std::string> ignorable_prefixes;
  Grid grid;
  Layout layout;  // how this checkpoint names and lays out the tensors (mapping.h)

  bool has_tensor(const std::string& name) const;
  bool has_prefix(const std::string& prefix) const;
  // The path of a tokenizer or preprocessor file, or "" after naming it as missing.
  std::string tok_file(const std::string& name, const std::string& why);
  // The prefix the checkpoint's class puts before the base model's names (sets layout.prefix).
  std::string base_prefix(const std::string& probe);
  // An LM head: tied to the token table when config.json's tie_word_embeddings is true (its
  // default; transformers then ties the decoder, so a copy in the file is not read). `bias`:
  // whether the class has a vocabulary bias.
  void lm_head(bool bias);
  // Width, layers, heads and the layer norm's epsilon; false after naming what is wrong.
  bool common(NormPlacement norm, const char* eps_key, double eps_default);
};

// One reader per family (family_<name>.cpp): false stops the import before the tensors.
bool read_bert(Build& b);
bool read_gpt2(Build& b);
bool read_vit(Build& b);
bool read_esm(Build& b);
bool read_ast(Build& b);

}  // namespace tessera::hf::imp
