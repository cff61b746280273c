// Hugging Face model folders -> ModelConfig + imported weights. The architecture comes from
// config.json, the tensors from the safetensors files (mapped, never copied when F32), and the
// plugin options from the tokenizer or preprocessor files. Every tensor the model needs is named
// by one mapping entry per parameter; shapes Hugging Face should have are derived from the
// parameter's own shape, so the check of every tensor comes with the mapping for free.
#include "import.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "tessera/model.h"
#include "tessera/safetensors.h"

namespace tessera::hf {

namespace imp {

std::string join_list(const std::vector<std::string>& v, const char* sep) {
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

// Reads a JSON object through jsonfile (size checked before reading, depth and memory before
// parsing, no exception out); a parse error names the file with line and column.
bool read_json(Ctx& c, const std::string& name, json* out, bool object) {
  const std::string path = c.at(name);
  Result<json> r = jsonfile::read(path, jsonfile::kSettings);
  if (!r.ok()) {
    c.err(r.status().message());
    return false;
  }
  *out = std::move(r).value();
  if (object && !out->is_object()) {
    c.err(path + ": expected a JSON object at the top, found " + jsonfile::brief(*out));
    return false;
  }
  return true;
}

// Activation names of config.json.
bool activation_of(Ctx& c, const std::string& file, const std::string& key, const std::string& v,
                   Activation* out) {
  if (v == "gelu")
    *out = Activation::gelu_erf;
  else if (v == "gelu_new" || v == "gelu_pytorch_tanh")
    *out = Activation::gelu_tanh;
  else if (v == "relu")
    *out = Activation::relu;
  else {
    c.err(file + ": " + key + " \"" + v +
          "\" is not implemented (Tessera has gelu, gelu_new, gelu_pytorch_tanh, relu)");
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
  if (it != cfg.end() && it->is_object() && !it->empty()) {
    if (static_cast<int64_t>(it->size()) <= bound::kLabels) return static_cast<int64_t>(it->size());
    J.c->err(J.file + ": key \"id2label\": expected at most " + std::to_string(bound::kLabels) +
             " labels, found " + jsonfile::brief(*it));
    ++J.c->bad_values;
    return 2;
  }
  return J.i("num_labels", 2, 1, bound::kLabels);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// ---------------------------------------------------------------------------------------------
// Build: what every family's reader shares.

bool Build::has_tensor(const std::string& name) const { return st.file_of.count(name) > 0; }

bool Build::has_prefix(const std::string& prefix) const {
  auto it = st.file_of.lower_bound(prefix);
  return it != st.file_of.end() && starts_with(it->first, prefix);
}

std::string Build::tok_file(const std::string& name, const std::string& why) {
  if (!c.has(name)) {
    c.err(c.dir + ": missing " + name + " (" + why + ")",
          "copy the tokenizer and preprocessor files of the model's repository into the folder");
    return "";
  }
  return c.at(name);
}

std::string Build::base_prefix(const std::string& probe) {
  const std::string prefix = task_prefix(type);
  layout.prefix = has_tensor(probe) ? std::string() : has_tensor(prefix + probe) ? prefix : std::string();
  return layout.prefix;
}

void Build::lm_head(bool bias) {
  m.head.kind = HeadKind::lm;
  m.head.tied = J.b("tie_word_embeddings", true);
  if (m.head.tied) m.head.lm_bias = bias;
}

bool Build::common(NormPlacement norm, const char* eps_key, double eps_default) {
  const bool gpt2 = type == "gpt2";  // n_layer and n_head, unless the newer names are there
  m.d_model = C;
  m.n_layers = J.i("num_hidden_layers",
                   gpt2 && !J.find("num_hidden_layers")
                       ? std::optional<int64_t>(J.i("n_layer", std::nullopt, 1, bound::kLayers))
                       : std::nullopt,
                   1, bound::kLayers);
  m.n_heads = J.i("num_attention_heads",
                  gpt2 && !J.find("num_attention_heads")
                      ? std::optional<int64_t>(J.i("n_head", std::nullopt, 1, bound::kHeads))
                      : std::nullopt,
                  1, bound::kHeads);
  m.norm = norm;
  m.norm_eps = J.f(eps_key, eps_default, 0.0, 1.0, true);  // a zero epsilon divides by zero on a constant row
  if (c.bad_values > 0) return false;  // named once already; no "do not make a transformer" on top
  m.bias = true;
  if (m.n_heads <= 0 || m.d_model <= 0 || m.n_layers <= 0 || m.d_model % m.n_heads != 0) {
    c.err(cfg_path + ": hidden size " + std::to_string(m.d_model) + ", " + std::to_string(m.n_layers) +
          " layers and " + std::to_string(m.n_heads) +
          " heads do not make a transformer (all positive, the heads dividing the hidden size)");
    return false;
  }
  m.d_k = m.d_v = m.d_model / m.n_heads;
  m.attention.scale = 1.0 / std::sqrt(static_cast<double>(m.d_k));
  return true;
}

}  // namespace imp

namespace {

using namespace imp;  // NOLINT: the importer's own private namespace

// The families, by config.json's model_type (ast is "audio-spectrogram-transformer" there).
struct FamilyReader {
  const char* model_type;
  const char* family;
  bool (*read)(Build&);
};
constexpr FamilyReader kReaders[] = {
    {"bert", "bert", read_bert},
    {"gpt2", "gpt2", read_gpt2},
    {"vit", "vit", read_vit},
    {"esm", "esm", read_esm},
    {"audio-spectrogram-transformer", "ast", read_ast},
};

const FamilyReader* find_reader(const std::string& model_type) {
  for (const FamilyReader& r : kReaders)
    if (model_type == r.model_type) return &r;
  return nullptr;
}

// At most this many messages of one kind about the checkpoint's tensors; then "... and N more".
constexpr size_t kMaxListed = 24;

struct Capped {
  Ctx* c;
  const char* what;  // "missing tensors"
  size_t n = 0;
  void err(const std::string& problem, const std::string& hint = "") {
    if (n++ < kMaxListed) c->err(problem, hint);
  }
  ~Capped() {
    if (n > kMaxListed)
      c->err("... and " + std::to_string(n - kMaxListed) + " more " + what + " (" + std::to_string(n) +
             " in all; the first " + std::to_string(kMaxListed) + " are listed)");
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
        c.err(ipath + ": weight_map[\"" + it.key() + "\"] should be a file name, found " +
              jsonfile::brief(*it));
        return false;
      }
      const std::string shard = it->get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos) {
        c.err(ipath + ": weight_map[\"" + it.key() + "\"] = \"" + shard +
              "\" is not a file name in the folder");
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
  for (const char* other :
       {"pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack"})
    if (c.has(other)) {
      c.err(c.dir + ": the weights are in " + other + "; Tessera reads safetensors only (it never unpickles)",
            "convert once with transformers: AutoModel.from_pretrained(DIR).save_pretrained(DIR, "
            "safe_serialization=True)");
      return false;
    }
  c.err(c.dir + ": no weights: expected model.safetensors, or model.safetensors.index.json and its shards");
  return false;
}

// Reads a tensor under `name` or, for old BERT checkpoints, LayerNorm.gamma/beta.
std::string resolve_name(const Store& st, const std::string& name) {
  if (st.file_of.count(name)) return name;
  if (name.find("LayerNorm.") != std::string::npos) {
    std::string alt = name;
    if (alt.size() > 7 && alt.compare(alt.size() - 7, 7, ".weight") == 0)
      alt = alt.substr(0, alt.size() - 7) + ".gamma";
    else if (alt.size() > 5 && alt.compare(alt.size() - 5, 5, ".bias") == 0)
      alt = alt.substr(0, alt.size() - 5) + ".beta";
    if (st.file_of.count(alt)) return alt;
  }
  return name;
}

Tensor apply(const Entry& e, const Tensor& t32, const Shape& want, const Grid& grid) {
  switch (e.op) {
    case Op::same:
      return t32;
    case Op::linear:
      return t32.rank() == 2 ? t32.transpose(0, 1) : t32;
    case Op::split: {
      const int64_t n = want[want.rank() - 1];
      return t32.slice(t32.rank() - 1, e.part * n, (e.part + 1) * n);
    }
    case Op::patch:
      return t32.contiguous().reshape({want[1], want[0]}).transpose(0, 1);
    case Op::squeeze:
      return t32.contiguous().reshape(want);
    case Op::pos_grid: {
      const int64_t C = want[1];
      Tensor table = t32.contiguous().reshape({t32.dim(1), C});
      if (grid.gh == grid.g0 && grid.gw == grid.g0) return table;
      Tensor out = Tensor::empty(want);
      out.slice(0, 0, 1).copy_from(table.slice(0, 0, 1));
      out.slice(0, 1, want[0])
          .copy_from(resize_position_grid(table.slice(0, 1, table.dim(0)), grid.g0, grid.g0, grid.scale_h,
                                          grid.scale_w));
      return out;
    }
    case Op::zeros:
      return Tensor::zeros(want);
  }
  return t32;
}

}  // namespace

const std::vector<std::string>& known_families() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const FamilyReader& r : kReaders) v.push_back(r.model_type);
    return v;
  }();
  return names;
}

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

std::optional<Folder> import_folder(const std::string& dir_in, const ImportOptions& opt,
                                    const Location& where, Diagnostics* diags) {
  Ctx c;
  c.dir = fs::path(dir_in).lexically_normal().string();
  c.where = where;
  c.d = diags;
  if (!fs::is_directory(c.dir)) {
    c.err(c.dir + ": not a directory",
          "model.path names a Hugging Face model folder (config.json, *.safetensors, ...)");
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
  if (raw_type.empty()) {
    const json* given = J.find("model_type");
    if (!given) c.err(cfg_path + ": no \"model_type\"; Tessera knows " + join_list(known_families()));
    else if (given->is_string())  // else J.s has named its type
      c.err(cfg_path + ": \"model_type\" is empty; Tessera knows " + join_list(known_families()));
    return std::nullopt;
  }
  const FamilyReader* reader = find_reader(raw_type);
  if (!reader) {
    c.err(cfg_path + ": model_type \"" + raw_type + "\" is not a family Tessera knows (" +
              join_list(known_families()) + ")",
          "run it with Hugging Face, or describe the architecture in YAML with model.weights.file");
    return std::nullopt;
  }
  const std::string type = reader->family;
  Folder out;
  out.family = type;
  if (auto a = cfg.find("architectures");
      a != cfg.end() && a->is_array() && !a->empty() && (*a)[0].is_string())
    out.hf_class = (*a)[0].get<std::string>();
  Store st;
  const bool weights_ok = open_weights(c, &st);

  ModelConfig& m = out.model;
  m.source = ModelSource::hf;
  m.path = c.dir;
  m.family = type;
  m.name = fs::path(c.dir).filename().string();
  m.weights.allow_missing = false;
  Build b{c, cfg, J, cfg_path, opt, st, out, m, type};
  b.C = J.i("hidden_size",
            type == "gpt2" && !J.find("hidden_size")
                ? std::optional<int64_t>(J.i("n_embd", std::nullopt, 1, bound::kWidth))
                : std::nullopt,
            1, bound::kWidth);
  const bool ok = reader->read(b);
  const int64_t C = b.C;
  std::set<std::string>& ignorable = b.ignorable;
  const std::vector<std::string>& ignorable_prefixes = b.ignorable_prefixes;
  const Grid& grid = b.grid;
  const Layout& layout = b.layout;

  // A size of a wrong type or out of range has been named once; the tensors would only repeat it.
  if (!ok || C <= 0 || c.bad_values > 0) return std::nullopt;
  const TensorMap tmap = tensor_map(type, m, layout);
  const std::map<std::string, Entry>& map = tmap.entries;
  if (m.head.kind == HeadKind::lm && m.head.tied) ignorable.insert(tmap.tied_decoder);

  // Every parameter from its entry, each shape checked; then whatever the checkpoint has left over.
  const std::string shape_hint =
      "the weights do not fit config.json (hidden size, heads, layers, intermediate size, vocabulary, image "
      "or "
      "patch size): use the config.json that was saved with them";
  if (weights_ok) {
    Capped missing{&c, "missing tensors"}, misshaped{&c, "tensors of the wrong shape"},
        unexpected{&c, "unexpected tensors"};
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
        missing.err("missing tensor \"" + en.hf + "\" " + want_hf.str() + " (for " + s.name + ")",
                    "is the checkpoint complete, and of the class config.json names?");
        continue;
      }
      st.used.insert(hf);
      const std::string file = st.file_name(hf);
      if (info->shape != want_hf) {
        misshaped.err(file + ": tensor \"" + hf + "\" has shape " + info->shape.str() +
                          " but config.json implies " + want_hf.str(),
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
    for (const auto& [name, f] : st.file_of) {
      if (st.used.count(name) || ignorable.count(name)) continue;
      if (std::any_of(ignorable_prefixes.begin(), ignorable_prefixes.end(),
                      [&n = name](const std::string& pre) { return starts_with(n, pre); }))
        continue;
      const safetensors::TensorInfo* info = st.info(name);
      unexpected.err(st.file_name(name) + ": unexpected tensor \"" + name + "\" " + info->shape.str() +
                         ": a " + type + " model of this config.json has no such parameter",
                     "is config.json the one saved with these weights (num_hidden_layers, architectures)?");
    }
  }
  if (c.errors > 0) return std::nullopt;
  m.weights.file_where = where;
  out.notes.insert(out.notes.begin(), "Hugging Face " + (out.hf_class.empty() ? type : out.hf_class) +
                                          " from " + c.dir + " (" + std::to_string(st.files.size()) +
                                          " safetensors file" + (st.files.size() == 1 ? "" : "s") + ")");
  return out;
}

}  // namespace tessera::hf
