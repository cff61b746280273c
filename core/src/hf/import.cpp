// Hugging Face model folders -> ModelConfig + imported weights. The architecture comes from
// config.json, the tensors from the safetensors files (mapped, never copied when F32), and the
// plugin options from the tokenizer or preprocessor files. Every tensor the model needs is named
// by one mapping entry per parameter; shapes Hugging Face should have are derived from the
// parameter's own shape, so the check of every tensor comes with the mapping for free.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tessera/hf.h"
#include "tessera/model.h"
#include "tessera/safetensors.h"
#include "mapping.h"

namespace tessera::hf {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// As config.json names them (ast is "audio-spectrogram-transformer" there).
const std::vector<std::string> kFamilies = {"bert", "gpt2", "vit", "esm", "audio-spectrogram-transformer"};

std::string join_list(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string fmt(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

struct Ctx {
  std::string dir;
  Location where;
  Diagnostics* d = nullptr;
  size_t errors = 0;
  void err(const std::string& problem, const std::string& hint = "") {
    d->add(where, "model.path", problem, hint);
    ++errors;
  }
  std::string at(const std::string& name) const { return (fs::path(dir) / name).string(); }
  bool has(const std::string& name) const { return fs::is_regular_file(at(name)); }
};

// Reads a JSON object; a parse error names the file with line and column.
bool read_json(Ctx& c, const std::string& name, json* out) {
  const std::string path = c.at(name);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    c.err(path + ": cannot be read");
    return false;
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > (64u << 20)) {
    c.err(path + ": " + std::to_string(text.size()) + " bytes is too large for a JSON settings file");
    return false;
  }
  try {
    *out = json::parse(text);
  } catch (const json::parse_error& e) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    std::string what = e.what();
    const auto p = what.find("parse error");
    if (p != std::string::npos) what = what.substr(p);
    c.err(path + ":" + std::to_string(line) + ":" + std::to_string(col) + ": not valid JSON (" + what + ")");
    return false;
  }
  if (!out->is_object()) {
    c.err(path + ": expected a JSON object at the top");
    return false;
  }
  return true;
}

// Typed reads of config.json keys; a wrong type or a missing required key names the file and key.
struct Json {
  Ctx* c;
  const json* j;
  std::string file;
  const json* find(const char* key) const {
    auto it = j->find(key);
    return it == j->end() || it->is_null() ? nullptr : &*it;
  }
  int64_t i(const char* key, std::optional<int64_t> def = std::nullopt) const {
    const json* v = find(key);
    if (!v) {
      if (!def) c->err(file + ": missing key \"" + std::string(key) + "\" (an integer)");
      return def.value_or(0);
    }
    if (!v->is_number_integer()) {
      c->err(file + ": \"" + key + "\" should be an integer, found " + v->dump());
      return def.value_or(0);
    }
    return v->get<int64_t>();
  }
  double f(const char* key, double def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_number()) {
      c->err(file + ": \"" + key + "\" should be a number, found " + v->dump());
      return def;
    }
    return v->get<double>();
  }
  std::string s(const char* key, const std::string& def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_string()) {
      c->err(file + ": \"" + key + "\" should be a string, found " + v->dump());
      return def;
    }
    return v->get<std::string>();
  }
  bool b(const char* key, bool def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) {
      c->err(file + ": \"" + key + "\" should be true or false, found " + v->dump());
      return def;
    }
    return v->get<bool>();
  }
};

// ---------------------------------------------------------------------------------------------
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

bool open_weights(Ctx& c, Store* s) {
  auto add_file = [&](const std::string& name) -> bool {
    Result<safetensors::File> f = safetensors::File::open(c.at(name));
    if (!f.ok()) {
      c.err(f.status().message());
      return false;
    }
    s->files.push_back(std::make_shared<safetensors::File>(std::move(f).value()));
    for (const auto& t : s->files.back()->tensors()) s->file_of.emplace(t.name, s->files.size() - 1);
    return true;
  };
  if (c.has("model.safetensors")) return add_file("model.safetensors");
  if (c.has("model.safetensors.index.json")) {
    json idx;
    if (!read_json(c, "model.safetensors.index.json", &idx)) return false;
    const std::string ipath = c.at("model.safetensors.index.json");
    auto wm = idx.find("weight_map");
    if (wm == idx.end() || !wm->is_object()) {
      c.err(ipath + ": no \"weight_map\" object (tensor name -> shard file)");
      return false;
    }
    std::vector<std::string> shards;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) {
        c.err(ipath + ": weight_map[\"" + it.key() + "\"] should be a file name, found " + it->dump());
        return false;
      }
      const std::string shard = it->get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos) {
        c.err(ipath + ": weight_map[\"" + it.key() + "\"] = \"" + shard + "\" is not a file name in the folder");
        return false;
      }
      if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
    }
    bool ok = true;
    for (const auto& sh : shards) {
      if (!c.has(sh)) {
        c.err(ipath + " names shard " + sh + ", which is not in the folder");
        ok = false;
        continue;
      }
      ok = add_file(sh) && ok;
    }
    if (!ok) return false;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      auto f = s->file_of.find(it.key());
      const std::string shard = it->get<std::string>();
      if (f == s->file_of.end() || fs::path(s->files[f->second]->path()).filename() != shard) {
        c.err(ipath + ": tensor \"" + it.key() + "\" should be in " + shard + " but is not there");
        ok = false;
      }
    }
    return ok;
  }
  for (const char* other : {"pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack"})
    if (c.has(other)) {
      c.err(c.dir + ": the weights are in " + other + "; Tessera reads safetensors only (it never unpickles)",
            "convert once with transformers: AutoModel.from_pretrained(DIR).save_pretrained(DIR, "
            "safe_serialization=True)");
      return false;
    }
  c.err(c.dir + ": no weights: expected model.safetensors, or model.safetensors.index.json and its shards");
  return false;
}

// ---------------------------------------------------------------------------------------------
// Mapping: one entry per Tessera parameter (mapping.h), applied to the checkpoint's tensors.

struct Grid {  // pos_grid
  int64_t g0 = 0;         // side of the checkpoint's square grid
  int64_t gh = 0, gw = 0;  // the requested grid
  double scale_h = 1, scale_w = 1;
};

// Reads a tensor under `name` or, for old BERT checkpoints, LayerNorm.gamma/beta.
std::string resolve_name(const Store& st, const std::string& name) {
  if (st.file_of.count(name)) return name;
  if (name.find("LayerNorm.") != std::string::npos) {
    std::string alt = name;
    if (alt.size() > 7 && alt.compare(alt.size() - 7, 7, ".weight") == 0) alt = alt.substr(0, alt.size() - 7) + ".gamma";
    else if (alt.size() > 5 && alt.compare(alt.size() - 5, 5, ".bias") == 0) alt = alt.substr(0, alt.size() - 5) + ".beta";
    if (st.file_of.count(alt)) return alt;
  }
  return name;
}

Tensor apply(const Entry& e, const Tensor& t32, const Shape& want, const Grid& grid) {
  switch (e.op) {
    case Op::same: return t32;
    case Op::linear: return t32.rank() == 2 ? t32.transpose(0, 1) : t32;
    case Op::split: {
      const int64_t n = want[want.rank() - 1];
      return t32.slice(t32.rank() - 1, e.part * n, (e.part + 1) * n);
    }
    case Op::patch: return t32.contiguous().reshape({want[1], want[0]}).transpose(0, 1);
    case Op::squeeze: return t32.contiguous().reshape(want);
    case Op::pos_grid: {
      const int64_t C = want[1];
      Tensor table = t32.contiguous().reshape({t32.dim(1), C});
      if (grid.gh == grid.g0 && grid.gw == grid.g0) return table;
      Tensor out = Tensor::empty(want);
      out.slice(0, 0, 1).copy_from(table.slice(0, 0, 1));
      out.slice(0, 1, want[0]).copy_from(
          resize_position_grid(table.slice(0, 1, table.dim(0)), grid.g0, grid.g0, grid.scale_h, grid.scale_w));
      return out;
    }
    case Op::zeros: return Tensor::zeros(want);
  }
  return t32;
}

// Activation names of config.json.
bool activation_of(Ctx& c, const std::string& file, const std::string& key, const std::string& v, Activation* out) {
  if (v == "gelu") *out = Activation::gelu_erf;
  else if (v == "gelu_new" || v == "gelu_pytorch_tanh") *out = Activation::gelu_tanh;
  else if (v == "relu") *out = Activation::relu;
  else {
    c.err(file + ": " + key + " \"" + v + "\" is not implemented (Tessera has gelu, gelu_new, gelu_pytorch_tanh, relu)");
    return false;
  }
  return true;
}

// Class names from config.json's id2label, in index order.
std::vector<std::string> labels_of(const json& cfg, int64_t n) {
  std::vector<std::string> labels;
  auto it = cfg.find("id2label");
  if (it == cfg.end() || !it->is_object() || static_cast<int64_t>(it->size()) != n) return labels;
  labels.assign(static_cast<size_t>(n), "");
  for (auto l = it->begin(); l != it->end(); ++l) {
    char* end = nullptr;
    const long k = std::strtol(l.key().c_str(), &end, 10);
    if (*end || k < 0 || k >= n || !l->is_string()) return {};
    labels[static_cast<size_t>(k)] = l->get<std::string>();
  }
  return labels;
}

int64_t num_labels(const json& cfg, const Json& J) {
  auto it = cfg.find("id2label");
  if (it != cfg.end() && it->is_object() && !it->empty()) return static_cast<int64_t>(it->size());
  return J.i("num_labels", 2);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

const std::vector<std::string>& known_families() { return kFamilies; }

Tensor resize_position_grid(const Tensor& grid, int64_t gh, int64_t gw, double scale_h, double scale_w) {
  const int64_t C = grid.dim(1);
  const int64_t oh = static_cast<int64_t>(std::floor(static_cast<double>(gh) * scale_h));
  const int64_t ow = static_cast<int64_t>(std::floor(static_cast<double>(gw) * scale_w));
  const Tensor in = grid.contiguous();
  const float* src = in.data<float>();
  Tensor out = Tensor::zeros({oh * ow, C});
  float* dst = out.data<float>();
  constexpr double A = -0.75;  // torch's (and Keys') bicubic convolution constant
  auto cc1 = [](double x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };        // |x| <= 1
  auto cc2 = [](double x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };  // 1 < |x| < 2
  auto weights = [&](double t, double w[4]) {
    w[0] = cc2(t + 1);
    w[1] = cc1(t);
    w[2] = cc1(1 - t);
    w[3] = cc2(2 - t);
  };
  for (int64_t y = 0; y < oh; ++y) {
    const double sy = (static_cast<double>(y) + 0.5) / scale_h - 0.5;
    const int64_t y0 = static_cast<int64_t>(std::floor(sy));
    double wy[4];
    weights(sy - static_cast<double>(y0), wy);
    for (int64_t x = 0; x < ow; ++x) {
      const double sx = (static_cast<double>(x) + 0.5) / scale_w - 0.5;
      const int64_t x0 = static_cast<int64_t>(std::floor(sx));
      double wx[4];
      weights(sx - static_cast<double>(x0), wx);
      float* o = dst + (y * ow + x) * C;
      for (int64_t k = 0; k < C; ++k) {
        double acc = 0;
        for (int i = 0; i < 4; ++i) {
          const int64_t yy = std::clamp<int64_t>(y0 - 1 + i, 0, gh - 1);
          double row = 0;
          for (int j = 0; j < 4; ++j) {
            const int64_t xx = std::clamp<int64_t>(x0 - 1 + j, 0, gw - 1);
            row += wx[j] * src[(yy * gw + xx) * C + k];
          }
          acc += wy[i] * row;
        }
        o[k] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

std::optional<Folder> import_folder(const std::string& dir_in, const ImportOptions& opt, const Location& where,
                                    Diagnostics* diags) {
  Ctx c;
  c.dir = fs::path(dir_in).lexically_normal().string();
  c.where = where;
  c.d = diags;
  if (!fs::is_directory(c.dir)) {
    c.err(c.dir + ": not a directory", "model.path names a Hugging Face model folder (config.json, *.safetensors, ...)");
    return std::nullopt;
  }
  if (!c.has("config.json")) {
    c.err(c.dir + ": no config.json, so this is not a Hugging Face model folder");
    return std::nullopt;
  }
  json cfg;
  if (!read_json(c, "config.json", &cfg)) return std::nullopt;
  const std::string cfg_path = c.at("config.json");
  const Json J{&c, &cfg, cfg_path};
  const std::string raw_type = J.s("model_type", "");
  const std::string type = raw_type == "audio-spectrogram-transformer" ? "ast" : raw_type;
  if (type.empty()) {
    c.err(cfg_path + ": no \"model_type\"; Tessera knows " + join_list(kFamilies));
    return std::nullopt;
  }
  if (std::find(kFamilies.begin(), kFamilies.end(), raw_type) == kFamilies.end()) {
    c.err(cfg_path + ": model_type \"" + raw_type + "\" is not a family Tessera knows (" + join_list(kFamilies) + ")",
          "run it with Hugging Face, or describe the architecture in YAML with model.weights.file");
    return std::nullopt;
  }
  Folder out;
  out.family = type;
  if (auto a = cfg.find("architectures"); a != cfg.end() && a->is_array() && !a->empty() && (*a)[0].is_string())
    out.hf_class = (*a)[0].get<std::string>();
  Store st;
  const bool weights_ok = open_weights(c, &st);
  auto has_tensor = [&](const std::string& n) { return st.file_of.count(n) > 0; };
  auto has_prefix = [&](const std::string& p) {
    auto it = st.file_of.lower_bound(p);
    return it != st.file_of.end() && starts_with(it->first, p);
  };

  ModelConfig& m = out.model;
  m.source = ModelSource::hf;
  m.path = c.dir;
  m.family = type;
  m.name = fs::path(c.dir).filename().string();
  m.weights.allow_missing = false;
  std::set<std::string> ignorable;   // tensors Tessera knowingly leaves out
  std::vector<std::string> ignorable_prefixes;
  Grid grid;
  Layout layout;  // how this checkpoint names and lays out the tensors (mapping.h)
  auto& po = out.plugin_options;
  auto tok_file = [&](const std::string& name, const std::string& why) -> std::string {
    if (!c.has(name)) {
      c.err(c.dir + ": missing " + name + " (" + why + ")",
            "copy the tokenizer and preprocessor files of the model's repository into the folder");
      return "";
    }
    return c.at(name);
  };
  // The prefix the checkpoint's class puts before the base model's names.
  auto base_prefix = [&](const std::string& probe) {
    const std::string prefix = task_prefix(type);
    layout.prefix = has_tensor(probe) ? std::string() : has_tensor(prefix + probe) ? prefix : std::string();
    return layout.prefix;
  };

  const int64_t C = J.i("hidden_size", type == "gpt2" ? std::optional<int64_t>(J.i("n_embd")) : std::nullopt);
  // An LM head: tied to the token table when config.json's tie_word_embeddings is true (its
  // default; transformers then ties the decoder, so a copy in the file is not read). `bias`:
  // whether the class has a vocabulary bias.
  auto lm_head = [&](bool bias) {
    m.head.kind = HeadKind::lm;
    m.head.tied = J.b("tie_word_embeddings", true);
    if (m.head.tied) m.head.lm_bias = bias;
  };
  auto common = [&](NormPlacement norm, const char* eps_key, double eps_default) {
    m.d_model = C;
    m.n_layers = J.i("num_hidden_layers", type == "gpt2" ? std::optional<int64_t>(J.i("n_layer")) : std::nullopt);
    m.n_heads = J.i("num_attention_heads", type == "gpt2" ? std::optional<int64_t>(J.i("n_head")) : std::nullopt);
    m.norm = norm;
    m.norm_eps = J.f(eps_key, eps_default);
    m.bias = true;
    if (m.n_heads <= 0 || m.d_model <= 0 || m.n_layers <= 0 || m.d_model % m.n_heads != 0) {
      c.err(cfg_path + ": hidden size " + std::to_string(m.d_model) + ", " + std::to_string(m.n_layers) +
            " layers and " + std::to_string(m.n_heads) + " heads do not make a transformer (all positive, the heads "
            "dividing the hidden size)");
      return false;
    }
    m.d_k = m.d_v = m.d_model / m.n_heads;
    m.attention.scale = 1.0 / std::sqrt(static_cast<double>(m.d_k));
    return true;
  };

  bool ok = true;
  if (type == "bert") {
    ok = common(NormPlacement::post, "layer_norm_eps", 1e-12);
    const std::string p = base_prefix("embeddings.word_embeddings.weight");
    if (J.s("position_embedding_type", "absolute") != "absolute")
      c.err(cfg_path + ": position_embedding_type \"" + J.s("position_embedding_type", "") +
            "\" is not implemented (Tessera's BERT has absolute positions)");
    if (J.b("is_decoder", false) || J.b("add_cross_attention", false))
      c.err(cfg_path + ": a BERT decoder (is_decoder, add_cross_attention) is not implemented");
    ok = activation_of(c, cfg_path, "hidden_act", J.s("hidden_act", "gelu"), &m.activation) && ok;
    m.d_ff = J.i("intermediate_size");
    m.positions.kind = PositionKind::learned;
    m.positions.max_len = J.i("max_position_embeddings", 512);
    m.stem.kind = StemKind::tokens;
    m.stem.vocab_size = J.i("vocab_size");
    m.stem.token_types = J.i("type_vocab_size", 2);
    m.stem.norm = true;
    // decoder.bias is cls.predictions.bias (one shared tensor), saved under either name or both.
    ignorable = {p + "embeddings.position_ids", "cls.predictions.decoder.bias"};
    // The head: a classifier, a masked-LM head, sentence-transformers' pooling, or the CLS pooler.
    const bool pooler = has_tensor(p + "pooler.dense.weight");
    if (has_tensor("classifier.weight")) {
      m.head.kind = HeadKind::classifier;
      m.head.n_classes = num_labels(cfg, J);
      m.head.labels = labels_of(cfg, m.head.n_classes);
      m.head.pool = PoolKind::cls;
      m.head.pooler = true;
    } else if (has_tensor("cls.predictions.bias")) {
      m.head.transform = true;
      lm_head(true);
    } else {
      m.head.kind = HeadKind::pool;
      m.head.pool = PoolKind::cls;
      m.head.pooler = pooler;
      if (c.has("modules.json")) {
        // modules.json is a list of sentence-transformers modules.
        std::ifstream in(c.at("modules.json"));
        json list = json::parse(in, nullptr, false);
        bool pooling = false;
        for (const json& mod : list.is_array() ? list : json::array()) {
          const std::string t = mod.value("type", "");
          const std::string path = mod.value("path", "");
          if (ends_with(t, "models.Normalize")) m.head.normalize = true;
          if (ends_with(t, "models.Pooling")) {
            json pc;
            std::ifstream pin(c.at(path + "/config.json"));
            pc = json::parse(pin, nullptr, false);
            if (!pc.is_object()) {
              c.err(c.at(path + "/config.json") + ": missing or not valid JSON (sentence-transformers' pooling)");
              continue;
            }
            pooling = true;
            m.head.pooler = false;
            if (pc.value("pooling_mode_mean_tokens", false)) m.head.pool = PoolKind::mean;
            else if (pc.value("pooling_mode_cls_token", false)) m.head.pool = PoolKind::cls;
            else if (pc.value("pooling_mode_lasttoken", false)) m.head.pool = PoolKind::last;
            else
              c.err(c.at(path + "/config.json") + ": only mean, cls and lasttoken pooling are implemented");
            if (pc.value("pooling_mode_max_tokens", false) || pc.value("pooling_mode_mean_sqrt_len_tokens", false) ||
                pc.value("pooling_mode_weightedmean_tokens", false))
              c.err(c.at(path + "/config.json") + ": max, sqrt-length and weighted-mean pooling are not implemented");
          }
        }
        if (pooling) out.notes.push_back("pooling from sentence-transformers' modules.json: " +
                                         std::string(pool_kind_name(m.head.pool)) +
                                         (m.head.normalize ? ", L2-normalised" : ""));
      }
      if (!m.head.pooler && pooler) {
        ignorable.insert(p + "pooler.dense.weight");
        ignorable.insert(p + "pooler.dense.bias");
        out.notes.push_back("the checkpoint's CLS pooler (pooler.dense) is not used");
      }
    }
    ignorable_prefixes.push_back("cls.seq_relationship.");
    // The text plugin: WordPiece over vocab.txt, cased or not as the tokenizer says.
    out.plugin = "text";
    const std::string vocab = tok_file("vocab.txt", "the WordPiece vocabulary the text plugin reads");
    json tc;
    const bool have_tc = c.has("tokenizer_config.json") && read_json(c, "tokenizer_config.json", &tc);
    po.emplace_back("tokenizer", "wordpiece");
    if (!vocab.empty()) po.emplace_back("vocab", vocab);
    if (have_tc && tc.contains("do_lower_case") && tc["do_lower_case"].is_boolean())
      po.emplace_back("lowercase", tc["do_lower_case"].get<bool>() ? "true" : "false");
    if (have_tc && tc.contains("strip_accents") && tc["strip_accents"].is_boolean())
      po.emplace_back("strip_accents", tc["strip_accents"].get<bool>() ? "true" : "false");
    int64_t max_len = m.positions.max_len;
    if (have_tc && tc.contains("model_max_length") && tc["model_max_length"].is_number_integer())
      max_len = std::min<int64_t>(max_len, tc["model_max_length"].get<int64_t>());
    json sb;
    if (c.has("sentence_bert_config.json") && read_json(c, "sentence_bert_config.json", &sb)) {
      if (sb.contains("max_seq_length") && sb["max_seq_length"].is_number_integer())
        max_len = std::min<int64_t>(max_len, sb["max_seq_length"].get<int64_t>());
      if (sb.value("do_lower_case", false)) po.emplace_back("lowercase", "true");
      po.emplace_back("length_policy", "truncate");  // sentence-transformers truncates
    }
    po.emplace_back("max_length", std::to_string(max_len));
  } else if (type == "gpt2") {
    ok = common(NormPlacement::pre, "layer_norm_epsilon", 1e-5);
    const std::string p = base_prefix("wte.weight");
    if (J.b("scale_attn_by_inverse_layer_idx", false))
      c.err(cfg_path + ": scale_attn_by_inverse_layer_idx is not implemented");
    if (!J.b("scale_attn_weights", true)) c.err(cfg_path + ": scale_attn_weights false is not implemented");
    if (J.b("add_cross_attention", false)) c.err(cfg_path + ": add_cross_attention is not implemented");
    ok = activation_of(c, cfg_path, "activation_function", J.s("activation_function", "gelu_new"), &m.activation) && ok;
    m.arch = Arch::decoder;
    m.causal = true;
    m.final_norm = true;
    m.d_ff = J.i("n_inner", 4 * C);
    m.positions.kind = PositionKind::learned;
    m.positions.max_len = J.i("n_positions", 1024);
    m.stem.kind = StemKind::tokens;
    m.stem.vocab_size = J.i("vocab_size");
    for (int64_t l = 0; l < m.n_layers && ok; ++l) {
      const std::string e = p + "h." + std::to_string(l) + ".";
      ignorable.insert(e + "attn.bias");  // the causal mask buffer of older checkpoints
      ignorable.insert(e + "attn.masked_bias");
    }
    lm_head(false);
    out.plugin = "text";
    po.emplace_back("tokenizer", "bpe");
    const std::string v = tok_file("vocab.json", "GPT-2's byte-level BPE vocabulary the text plugin reads");
    const std::string mg = tok_file("merges.txt", "GPT-2's BPE merges the text plugin reads");
    if (!v.empty()) po.emplace_back("vocab", v);
    if (!mg.empty()) po.emplace_back("merges", mg);
    po.emplace_back("max_length", std::to_string(m.positions.max_len));
  }

  if (type == "vit") {
    ok = common(NormPlacement::pre, "layer_norm_eps", 1e-12);
    const std::string p = base_prefix("embeddings.patch_embeddings.projection.weight");
    ok = activation_of(c, cfg_path, "hidden_act", J.s("hidden_act", "gelu"), &m.activation) && ok;
    const int64_t img = J.i("image_size", 224), patch = J.i("patch_size", 16), ch = J.i("num_channels", 3);
    if (patch <= 0 || img <= 0 || img % patch != 0) {
      c.err(cfg_path + ": patch_size " + std::to_string(patch) + " does not divide image_size " + std::to_string(img));
      return std::nullopt;
    }
    grid.g0 = img / patch;
    int64_t ih = img, iw = img;
    if (opt.image_size.size() == 2) {
      ih = opt.image_size[0];
      iw = opt.image_size[1];
    }
    grid.gh = ih / patch;
    grid.gw = iw / patch;
    if (grid.gh != grid.g0 || grid.gw != grid.g0) {
      // transformers 4.40: scale factors (side + 0.1) / grid, so that floor() lands on the side.
      grid.scale_h = (static_cast<double>(grid.gh) + 0.1) / static_cast<double>(grid.g0);
      grid.scale_w = (static_cast<double>(grid.gw) + 0.1) / static_cast<double>(grid.g0);
      out.notes.push_back("position grid " + std::to_string(grid.g0) + "x" + std::to_string(grid.g0) +
                          " resized bicubically to " + std::to_string(grid.gh) + "x" + std::to_string(grid.gw) +
                          " for " + std::to_string(ih) + "x" + std::to_string(iw) + " images");
    }
    m.final_norm = true;
    m.d_ff = J.i("intermediate_size");
    m.positions.kind = PositionKind::learned;
    m.positions.max_len = 1 + grid.gh * grid.gw;
    m.stem.kind = StemKind::features;
    m.stem.n_features = ch * patch * patch;
    m.stem.cls = true;
    layout.qkv_bias = J.b("qkv_bias", true);
    layout.channels = ch;
    layout.grid = grid.g0;
    m.head.pool = PoolKind::cls;
    if (has_tensor("classifier.weight")) {
      m.head.kind = HeadKind::classifier;
      m.head.n_classes = num_labels(cfg, J);
      m.head.labels = labels_of(cfg, m.head.n_classes);
    } else {
      m.head.kind = HeadKind::pool;
    }
    if (has_tensor(p + "pooler.dense.weight")) {
      if (m.head.kind == HeadKind::pool) {
        m.head.pooler = true;
      } else {
        ignorable.insert(p + "pooler.dense.weight");
        ignorable.insert(p + "pooler.dense.bias");
      }
    }
    // The image plugin: the processor's size, resampling, rescale, mean and std.
    out.plugin = "image";
    po.emplace_back("patch_size", std::to_string(patch));
    po.emplace_back("cls", "true");
    json pp;
    if (tok_file("preprocessor_config.json", "the image processor's size, mean and std").size() &&
        read_json(c, "preprocessor_config.json", &pp)) {
      const std::string pf = c.at("preprocessor_config.json");
      const Json P{&c, &pp, pf};
      if (opt.image_size.empty()) {
        auto sz = pp.find("size");
        int64_t h = img, w = img;
        if (sz != pp.end() && sz->is_object() && sz->contains("height") && sz->contains("width")) {
          h = (*sz)["height"].get<int64_t>();
          w = (*sz)["width"].get<int64_t>();
        } else if (sz != pp.end() && sz->is_number_integer()) {
          h = w = sz->get<int64_t>();
        } else if (sz != pp.end()) {
          c.err(pf + ": size " + sz->dump() + " is not implemented (Tessera reads {height, width} or one number)");
        }
        if (h != img || w != img)
          c.err(pf + ": the processor resizes to " + std::to_string(h) + "x" + std::to_string(w) +
                    " but config.json's image_size is " + std::to_string(img),
                "set the image plugin's image_size to choose a size; the position grid follows it");
        po.emplace_back("image_size", std::to_string(h) + "," + std::to_string(w));
      }
      const int64_t resample = P.i("resample", 2);
      if (resample == 2) po.emplace_back("resize", "pil_bilinear");
      else if (resample == 3) po.emplace_back("resize", "pil_bicubic");
      else c.err(pf + ": resample " + std::to_string(resample) + " is not implemented (2 bilinear, 3 bicubic)");
      if (!P.b("do_resize", true)) c.err(pf + ": do_resize false is not implemented");
      po.emplace_back("rescale_factor", P.b("do_rescale", true) ? fmt(P.f("rescale_factor", 1.0 / 255)) : "1");
      auto three = [&](const char* key, double def) {
        auto it = pp.find(key);
        if (it == pp.end() || !P.b("do_normalize", true)) return fmt(def) + "," + fmt(def) + "," + fmt(def);
        if (it->is_number()) return fmt(it->get<double>()) + "," + fmt(it->get<double>()) + "," + fmt(it->get<double>());
        if (!it->is_array() || it->size() != 3) {
          c.err(pf + ": \"" + key + "\" should be three numbers, found " + it->dump());
          return fmt(def) + "," + fmt(def) + "," + fmt(def);
        }
        return fmt((*it)[0].get<double>()) + "," + fmt((*it)[1].get<double>()) + "," + fmt((*it)[2].get<double>());
      };
      po.emplace_back("mean", three("image_mean", P.b("do_normalize", true) ? 0.5 : 0.0));
      po.emplace_back("std", three("image_std", 1.0));
      if (P.b("do_center_crop", false)) c.err(pf + ": do_center_crop is not implemented for ViT folders");
    }
    if (ch != 3) c.err(cfg_path + ": num_channels " + std::to_string(ch) + " (the image plugin gives RGB, 3 channels)");
  }

  if (type == "esm") {
    ok = common(NormPlacement::pre, "layer_norm_eps", 1e-12);
    const std::string p = base_prefix("embeddings.word_embeddings.weight");
    m.activation = Activation::gelu_erf;  // ESM's feed-forward and LM head use erf GELU whatever hidden_act says
    if (J.s("position_embedding_type", "absolute") != "rotary")
      c.err(cfg_path + ": position_embedding_type \"" + J.s("position_embedding_type", "absolute") +
            "\" is not implemented (Tessera runs ESM-2, whose positions are rotary)");
    if (J.b("is_folding_model", false)) c.err(cfg_path + ": ESMFold is not implemented");
    m.d_ff = J.i("intermediate_size");
    m.final_norm = J.b("emb_layer_norm_after", true);
    m.positions.kind = PositionKind::rotary;
    m.positions.rotary_dims = m.d_k;
    m.positions.rotary_style = RotaryStyle::half;
    m.positions.base = 10000.0;
    m.positions.max_len = J.i("max_position_embeddings", 1026);
    m.stem.kind = StemKind::tokens;
    m.stem.vocab_size = J.i("vocab_size");
    m.stem.token_dropout = J.b("token_dropout", false);
    m.stem.mask_id = J.i("mask_token_id", 32);
    m.stem.norm = J.b("emb_layer_norm_before", false);
    for (int64_t l = 0; l < m.n_layers && ok; ++l)
      ignorable.insert(p + "encoder.layer." + std::to_string(l) + ".attention.self.rotary_embeddings.inv_freq");
    ignorable.insert(p + "embeddings.position_ids");
    ignorable.insert(p + "embeddings.position_embeddings.weight");  // made even for rotary models, never used
    if (has_prefix(p + "contact_head.")) {
      ignorable_prefixes.push_back(p + "contact_head.");
      out.notes.push_back("contact_head is not used; export attention maps (task.attention) instead");
    }
    if (has_tensor("lm_head.bias")) {
      m.head.transform = true;
      lm_head(true);
    } else {
      m.head.kind = HeadKind::pool;
      m.head.pool = PoolKind::mean;
    }
    // The protein plugin: EsmTokenizer's rules (its default, written out so that the folder alone
    // decides), over ESM-2's alphabet, which vocab.txt must list in the plugin's id order.
    out.plugin = "protein";
    po.emplace_back("tokenizer", "esm");
    po.emplace_back("uppercase", "false");  // EsmTokenizer has no lower-case tokens
    const std::string vocab = tok_file("vocab.txt", "the ESM alphabet");
    if (!vocab.empty()) {
      std::ifstream in(vocab);
      // As EsmTokenizer reads it: one token a line, stripped; trailing blank lines aside.
      std::vector<std::string> tokens;
      const char* const blank = " \t\r\v\f";
      for (std::string line; std::getline(in, line);) {
        const size_t first = line.find_first_not_of(blank);
        tokens.push_back(first == std::string::npos ? ""
                                                    : line.substr(first, line.find_last_not_of(blank) + 1 - first));
      }
      while (!tokens.empty() && tokens.back().empty()) tokens.pop_back();
      if (static_cast<int64_t>(tokens.size()) != m.stem.vocab_size)
        c.err(vocab + ": " + std::to_string(tokens.size()) + " tokens, but config.json's vocab_size is " +
              std::to_string(m.stem.vocab_size) + " (the protein plugin gives ESM-2's 33-token alphabet)");
      for (size_t i = 0; i < tokens.size() && i < esm2_alphabet().size(); ++i)
        if (tokens[i] != esm2_alphabet()[i]) {
          c.err(vocab + ": token " + std::to_string(i) + " is \"" + tokens[i] + "\" where ESM-2's alphabet has \"" +
                    esm2_alphabet()[i] + "\"",
                "the protein plugin gives ESM-2's ids (<cls> <pad> <eos> <unk> L A G V ...); a model with another "
                "vocabulary needs its own tokenizer");
          break;
        }
    }
  }

  if (type == "ast") {
    ok = common(NormPlacement::pre, "layer_norm_eps", 1e-12);
    const std::string p = base_prefix("embeddings.patch_embeddings.projection.weight");
    ok = activation_of(c, cfg_path, "hidden_act", J.s("hidden_act", "gelu"), &m.activation) && ok;
    const int64_t patch = J.i("patch_size", 16), fs_ = J.i("frequency_stride", 10), ts = J.i("time_stride", 10);
    const int64_t mels = J.i("num_mel_bins", 128), frames = J.i("max_length", 1024);
    if (fs_ != ts)
      c.err(cfg_path + ": frequency_stride " + std::to_string(fs_) + " differs from time_stride " + std::to_string(ts) +
            " (the audio plugin cuts patches with one stride)");
    if (patch <= 0 || fs_ <= 0 || ts <= 0 || mels < patch || frames < patch) {
      c.err(cfg_path + ": patch_size, strides, num_mel_bins and max_length do not make any patch");
      return std::nullopt;
    }
    const int64_t fp = (mels - patch) / fs_ + 1, tp = (frames - patch) / ts + 1;
    m.final_norm = true;
    m.d_ff = J.i("intermediate_size");
    m.positions.kind = PositionKind::learned;
    m.positions.max_len = fp * tp + 2;
    m.stem.kind = StemKind::features;
    m.stem.n_features = patch * patch;
    m.stem.cls = true;
    m.stem.dist = true;
    layout.qkv_bias = J.b("qkv_bias", true);
    m.head.pool = PoolKind::cls_dist;
    if (has_tensor("classifier.dense.weight")) {
      m.head.kind = HeadKind::classifier;
      m.head.n_classes = num_labels(cfg, J);
      m.head.labels = labels_of(cfg, m.head.n_classes);
      m.head.norm = true;
    } else {
      m.head.kind = HeadKind::pool;
    }
    out.plugin = "audio";
    po.emplace_back("recipe", "ast");
    po.emplace_back("rows", "patches");
    po.emplace_back("special_rows", "2");
    po.emplace_back("n_mels", std::to_string(mels));
    po.emplace_back("patch_size", std::to_string(patch));
    po.emplace_back("patch_stride", std::to_string(fs_));
    json pp;
    if (tok_file("preprocessor_config.json", "the feature extractor's frames, mean and std").size() &&
        read_json(c, "preprocessor_config.json", &pp)) {
      const std::string pf = c.at("preprocessor_config.json");
      const Json P{&c, &pp, pf};
      const int64_t pf_frames = P.i("max_length", frames);
      if (pf_frames != frames)
        c.err(pf + ": max_length " + std::to_string(pf_frames) + " frames, but config.json's max_length is " +
              std::to_string(frames));
      if (P.i("num_mel_bins", mels) != mels)
        c.err(pf + ": num_mel_bins " + std::to_string(P.i("num_mel_bins", mels)) + " but config.json's is " +
              std::to_string(mels));
      if (P.i("sampling_rate", 16000) != 16000) c.err(pf + ": sampling_rate other than 16000 is not implemented");
      po.emplace_back("target_frames", std::to_string(frames));
      if (P.b("do_normalize", true)) {
        po.emplace_back("ast_mean", fmt(P.f("mean", -4.2677393)));
        po.emplace_back("ast_std", fmt(P.f("std", 4.5689974)));
      } else {  // (x - 0) / (2 · 0.5) leaves the features as they are
        po.emplace_back("ast_mean", "0");
        po.emplace_back("ast_std", "0.5");
      }
    }
  }
  if (!ok || C <= 0) return std::nullopt;
  const TensorMap tmap = tensor_map(type, m, layout);
  const std::map<std::string, Entry>& map = tmap.entries;
  if (m.head.kind == HeadKind::lm && m.head.tied) ignorable.insert(tmap.tied_decoder);

  // Every parameter from its entry, each shape checked; then whatever the checkpoint has left over.
  const std::string shape_hint =
      "the weights do not fit config.json (hidden size, heads, layers, intermediate size, vocabulary, image or "
      "patch size): use the config.json that was saved with them";
  if (weights_ok) {
    for (const ParamSpec& s : parameter_specs(m)) {
      auto e = map.find(s.name);
      if (e == map.end()) {
        c.err("internal: no mapping for parameter \"" + s.name + "\" of a " + type + " model");
        continue;
      }
      Entry en = e->second;
      const Shape want_hf = expected_hf_shape(en, s.shape);
      if (en.op == Op::zeros) {
        m.weights.imported[s.name] = {Tensor::zeros(s.shape), "zeros (" + en.why + ")"};
        continue;
      }
      const std::string hf = resolve_name(st, en.hf);
      const safetensors::TensorInfo* info = st.info(hf);
      if (!info) {
        c.err("missing tensor \"" + en.hf + "\" " + want_hf.str() + " (for " + s.name + ")",
              "is the checkpoint complete, and of the class config.json names?");
        continue;
      }
      st.used.insert(hf);
      const std::string file = st.file_name(hf);
      if (info->shape != want_hf) {
        c.err(file + ": tensor \"" + hf + "\" has shape " + info->shape.str() + " but config.json implies " +
                  want_hf.str(),
              shape_hint);
        continue;
      }
      Result<Tensor> t = st.files[st.file_of.at(hf)]->get(hf);
      if (!t.ok()) {
        c.err(t.status().message());
        continue;
      }
      if (!dtype_is_float(t->dtype())) {
        c.err(file + ": tensor \"" + hf + "\" is " + info->dtype_name + "; weights must be F32, F16 or BF16");
        continue;
      }
      const Tensor t32 = t->dtype() == DType::f32 ? *t : t->to(DType::f32);
      std::string src = file + ": " + hf;
      if (en.op == Op::split) {
        const int64_t n = s.shape[s.shape.rank() - 1];
        src += " columns " + std::to_string(en.part * n) + ":" + std::to_string((en.part + 1) * n);
      }
      m.weights.imported[s.name] = {apply(en, t32, s.shape, grid), src};
    }
    std::vector<std::string> unexpected;
    for (const auto& [name, f] : st.file_of) {
      if (st.used.count(name) || ignorable.count(name)) continue;
      if (std::any_of(ignorable_prefixes.begin(), ignorable_prefixes.end(),
                      [&n = name](const std::string& pre) { return starts_with(n, pre); }))
        continue;
      const safetensors::TensorInfo* info = st.info(name);
      c.err(st.file_name(name) + ": unexpected tensor \"" + name + "\" " + info->shape.str() + ": a " + type +
                " model of this config.json has no such parameter",
            "is config.json the one saved with these weights (num_hidden_layers, architectures)?");
    }
  }
  if (c.errors > 0) return std::nullopt;
  m.weights.file_where = where;
  out.notes.insert(out.notes.begin(), "Hugging Face " + (out.hf_class.empty() ? type : out.hf_class) + " from " + c.dir +
                                          " (" + std::to_string(st.files.size()) + " safetensors file" +
                                          (st.files.size() == 1 ? "" : "s") + ")");
  return out;
}

}  // namespace tessera::hf
