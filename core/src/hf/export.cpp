// ModelConfig + parameters -> a Hugging Face model folder: the inverse of import.cpp. The family
// is the one the model came from or the one its architecture matches; every setting the family
// cannot represent is refused (all of them, each at its config key) before anything is written.
// The tensors go through the same table as the import (mapping.h), the other way. The folder is
// assembled in a temporary sibling and renamed into place, so a failed export leaves nothing.
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <system_error>

#include "io/json_file.h"
#include "mapping.h"
#include "tessera/fileio.h"
#include "tessera/hf.h"
#include "tessera/model.h"
#include "tessera/safetensors.h"

namespace tessera::hf {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A settings file of the folder the model came from, read within jsonfile's limits (size, depth,
// memory; import_folder has read it the same way); null when it is not there or not readable.
json source_json(const ModelConfig& m, const char* name) {
  Result<json> r = jsonfile::read((fs::path(m.path) / name).string(), jsonfile::kSettings);
  return r.ok() ? std::move(r).value() : json();
}

// What the refusals say about why a YAML model was taken for a family.
const char* why_family(const std::string& f) {
  if (f == "gpt2") return "a decoder";
  if (f == "ast") return "an encoder with a features stem and a distillation row";
  if (f == "vit") return "an encoder with a features stem";
  if (f == "esm") return "an encoder with a tokens stem and rotary positions";
  return "an encoder with a tokens stem";
}

std::string family_of(const ModelConfig& m) {
  if (m.source == ModelSource::hf) return m.family;
  if (m.arch == Arch::decoder) return "gpt2";
  if (m.stem.kind == StemKind::features || m.stem.kind == StemKind::identity || m.stem.kind == StemKind::mixed)
    return m.stem.dist ? "ast" : "vit";
  return m.positions.kind == PositionKind::rotary ? "esm" : "bert";
}

// An option of the experiment's plugin `name`, as canonical text; "" when absent.
std::string plugin_option(const Experiment& exp, const std::string& name, const std::string& key) {
  for (const PluginConfig& p : exp.plugins)
    if (p.name == name)
      for (const auto& [k, v] : p.options)
        if (k == key) return v;
  return "";
}
bool has_plugin(const Experiment& exp, const std::string& name) {
  for (const PluginConfig& p : exp.plugins)
    if (p.name == name) return true;
  return false;
}

std::vector<double> numbers(const std::string& text) {
  std::vector<double> v;
  std::stringstream ss(text);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::strtod(x.c_str(), nullptr));
  return v;
}

int64_t isqrt_exact(int64_t n) {  // the side of a square n, or 0
  if (n <= 0) return 0;
  int64_t r = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  return r * r == n ? r : 0;
}

const char* activation_hf(Activation a) {
  switch (a) {
    case Activation::gelu_erf: return "gelu";
    case Activation::gelu_tanh: return "gelu_new";
    case Activation::relu: return "relu";
    default: return nullptr;
  }
}

// The settings of one export, gathered while checking: what config.json and the side files say.
struct Plan {
  std::string family, hf_class;
  Layout layout;
  int64_t patch = 0, grid = 0;          // vit, ast
  int64_t mels = 0, frames = 0, stride = 0;  // ast
  bool sentence_transformers = false;   // bert: modules.json + pooling (+ Normalize)
};

struct Checker {
  const Experiment& exp;
  Diagnostics* d;
  std::string family;
  size_t errors = 0;
  void no(const std::string& key, const std::string& problem, const std::string& hint = "") {
    d->add(exp.where(key), key,
           "tessera export --hf: " + problem + " (exported as " + family + ": " + why_family(family) + ")", hint);
    ++errors;
  }
};

// Every setting the family cannot represent, each at its key; the class and layout that fit.
bool plan_export(const Experiment& exp, Diagnostics* d, Plan* plan) {
  const ModelConfig& m = exp.model;
  const std::string f = family_of(m);
  Checker k{exp, d, f};
  plan->family = f;
  const bool pre = f != "bert";
  const double scale = 1.0 / std::sqrt(static_cast<double>(m.d_model / std::max<int64_t>(1, m.n_heads)));
  // What every family's blocks share.
  if (m.norm != (pre ? NormPlacement::pre : NormPlacement::post))
    k.no("model.norm", std::string("is ") + norm_name(m.norm) + "; " + f + "'s blocks are " + (pre ? "pre" : "post") +
                           "-LN");
  if (!m.bias) k.no("model.bias", "is false; every linear layer of " + f + " has a bias");
  if (!m.residual) k.no("model.residual", "is false; " + f + "'s blocks add their residuals");
  if (!m.attention.output_projection) k.no("model.attention.output_projection", "is false; " + f + " has one");
  if (m.d_k * m.n_heads != m.d_model || m.d_v != m.d_k)
    k.no("model.d_k", "d_k " + std::to_string(m.d_k) + " and d_v " + std::to_string(m.d_v) +
                          " must both be d_model / n_heads in " + f);
  if (std::fabs(m.attention.scale - scale) > 1e-9 * scale)
    k.no("model.attention.scale", "is " + std::to_string(m.attention.scale) + "; " + f + " scales by 1/sqrt(d_k)");
  if (m.d_ff <= 0) k.no("model.d_ff", "is 0 (no feed-forward sublayer); " + f + "'s blocks have one");
  if (!activation_hf(m.activation) || (f == "esm" && m.activation != Activation::gelu_erf))
    k.no("model.activation", "has no " + f + " equivalent" +
                                 (f == "esm" ? std::string(" (ESM-2 uses erf GELU)") : " (gelu, gelu_tanh or relu)"));
  if (m.stem.modalities > 0) k.no("model.stem.modalities", "modality embeddings have no " + f + " equivalent");
  if (m.stem.scale != EmbedScale::none) k.no("model.stem.scale", "sqrt(d_model) scaling has no " + f + " equivalent");
  if (m.causal != (f == "gpt2")) k.no("model.causal", std::string("is ") + (m.causal ? "true" : "false") +
                                                          "; " + f + (f == "gpt2" ? " is causal" : " is not causal"));
  if (f != "gpt2" && m.arch != Arch::encoder) k.no("model.arch", "is decoder; " + f + " is an encoder");
  if (m.head.normalize && !(f == "bert" && m.head.kind == HeadKind::pool))
    k.no("model.head.normalize", "is true; only a pooling BERT can L2-normalise (sentence-transformers' Normalize), " +
                                     std::string(m.head.kind == HeadKind::classifier ? "not a classifier"
                                                                                     : "not " + f));
  if (m.head.norm && !(f == "ast" && m.head.kind == HeadKind::classifier))
    k.no("model.head.norm", "a pooled layer norm exists only in AST's classifier");
  if (m.head.kind == HeadKind::lm && m.head.transform != (f == "bert" || f == "esm"))
    k.no("model.head.transform", m.head.transform ? f + "'s LM head has no dense + norm transform"
                                                  : f + "'s masked-LM head has a dense + norm transform");
  if (m.head.kind == HeadKind::lm && m.head.tied && m.head.lm_bias != (f != "gpt2"))
    k.no("model.head.lm_bias", m.head.lm_bias ? "GPT-2's LM head has no bias" : f + "'s LM head has a bias");
  auto tokens_stem = [&] {
    if (m.stem.kind != StemKind::tokens)
      k.no("model.stem.kind", std::string("is ") + stem_kind_name(m.stem.kind) + "; " + f + " reads token ids");
    if (m.stem.token_dropout && f != "esm") k.no("model.stem.token_dropout", "only ESM-2 has token dropout");
  };
  auto features_stem = [&](bool dist) {
    if (m.stem.kind != StemKind::features)
      k.no("model.stem.kind", std::string("is ") + stem_kind_name(m.stem.kind) + "; " + f + " projects patch rows");
    if (!m.stem.cls) k.no("model.stem.cls", "is false; " + f + " prepends a CLS row");
    if (m.stem.dist != dist) k.no("model.stem.dist", dist ? "is false; AST has a distillation row" : "ViT has no distillation row");
    if (m.stem.norm) k.no("model.stem.norm", f + " has no layer norm over its embeddings");
    if (m.stem.token_types > 0) k.no("model.stem.token_types", f + " has no token types");
  };
  auto learned = [&] {
    if (m.positions.kind != PositionKind::learned)
      k.no("model.positions.kind", std::string("is ") + position_kind_name(m.positions.kind) + "; " + f +
                                       "'s positions are learned (a table)");
  };
  auto head_is = [&](std::initializer_list<HeadKind> ok, const std::string& what) {
    for (HeadKind h : ok)
      if (m.head.kind == h) return true;
    k.no("model.head.kind", std::string("is ") + head_kind_name(m.head.kind) + "; " + f + " has " + what);
    return false;
  };
  auto pool_is = [&](PoolKind p, const std::string& why) {
    if ((m.head.kind == HeadKind::pool || m.head.kind == HeadKind::classifier) && m.head.pool != p)
      k.no("model.head.pool", std::string("is ") + pool_kind_name(m.head.pool) + "; " + why);
  };
  auto set_class = [&](HeadKind h) {
    for (const HfClass& c : hf_classes())
      if (f == c.family && (c.head == h || (h == HeadKind::none && c.head == HeadKind::pool))) {
        plan->hf_class = c.name;
        plan->layout.prefix = c.prefix;
      }
  };

  if (f == "bert") {
    tokens_stem();
    learned();
    if (m.final_norm) k.no("model.final_norm", "is true; BERT (post-LN) has no final layer norm");
    if (m.stem.token_types <= 0)
      k.no("model.stem.token_types", "is 0; BERT adds a token-type embedding (set it to 2, or 1 for one segment)");
    if (!m.stem.norm) k.no("model.stem.norm", "is false; BERT normalises its embeddings (LayerNorm)");
    if (head_is({HeadKind::none, HeadKind::pool, HeadKind::classifier, HeadKind::lm},
                "a pooler, a classifier or a masked-LM head")) {
      if (m.head.kind == HeadKind::classifier) {
        pool_is(PoolKind::cls, "BertForSequenceClassification classifies the pooled CLS row");
        if (!m.head.pooler) k.no("model.head.pooler", "is false; BertForSequenceClassification classifies through its pooler");
      }
      if (m.head.kind == HeadKind::pool) {
        if (m.head.pooler) pool_is(PoolKind::cls, "BERT's pooler reads the CLS row");
        if (m.head.pool == PoolKind::cls_dist) pool_is(PoolKind::cls, "BERT has no distillation row");
        if (m.head.pool == PoolKind::max) pool_is(PoolKind::mean, "Tessera writes sentence-transformers' cls, mean or last pooling");
        plan->sentence_transformers = !m.head.pooler && (m.head.pool != PoolKind::cls || m.head.normalize);
      }
    }
    set_class(m.head.kind);
  } else if (f == "gpt2") {
    tokens_stem();
    learned();
    if (m.stem.token_types > 0) k.no("model.stem.token_types", "GPT-2 has no token types");
    if (m.stem.norm) k.no("model.stem.norm", "GPT-2 has no layer norm over its embeddings");
    if (!m.final_norm) k.no("model.final_norm", "is false; GPT-2 ends with ln_f");
    head_is({HeadKind::lm}, "an LM head (GPT2LMHeadModel)");
    set_class(HeadKind::lm);
  } else if (f == "vit") {
    features_stem(false);
    learned();
    if (!m.final_norm) k.no("model.final_norm", "is false; ViT ends with a layer norm");
    plan->patch = isqrt_exact(m.stem.n_features / 3);
    if (m.stem.n_features % 3 != 0 || plan->patch == 0)
      k.no("model.stem.n_features", std::to_string(m.stem.n_features) +
                                        " is not 3·p·p: ViT's patches are p × p pixels of three channels");
    plan->grid = isqrt_exact(m.positions.max_len - 1);
    if (plan->grid == 0)
      k.no("model.positions.max_len", std::to_string(m.positions.max_len) +
                                          " is not 1 + g·g: ViT's positions are the CLS row and a square grid of patches");
    if (head_is({HeadKind::none, HeadKind::pool, HeadKind::classifier}, "a pooler or a classifier")) {
      pool_is(PoolKind::cls, "Hugging Face's ViT pools the CLS row");
      if (m.head.kind == HeadKind::classifier && m.head.pooler)
        k.no("model.head.pooler", "ViTForImageClassification classifies the CLS row itself, without the pooler");
    }
    plan->layout.grid = plan->grid;
    set_class(m.head.kind);
  } else if (f == "esm") {
    tokens_stem();
    if (m.stem.token_types > 0) k.no("model.stem.token_types", "ESM-2 has no token types");
    if (m.positions.kind != PositionKind::rotary || m.positions.rotary_style != RotaryStyle::half ||
        m.positions.rotary_dims != m.d_k || m.positions.base != 10000.0)
      k.no("model.positions", "ESM-2's positions are rotary over whole heads (rotary_dims = d_k), half style, base 10000");
    if (!m.final_norm) k.no("model.final_norm", "is false; ESM-2 always applies emb_layer_norm_after");
    if (m.stem.vocab_size != static_cast<int64_t>(esm2_alphabet().size()))
      k.no("model.stem.vocab_size", std::to_string(m.stem.vocab_size) + " tokens; ESM-2's alphabet has 33");
    if (m.stem.token_dropout && m.stem.mask_id < 0) k.no("model.stem.mask_id", "token dropout needs the mask token's id");
    if (head_is({HeadKind::none, HeadKind::pool, HeadKind::lm}, "a masked-LM head (EsmForMaskedLM) or none (EsmModel)")) {
      if (m.head.kind == HeadKind::pool) {
        pool_is(PoolKind::mean, "an EsmModel folder is read back with mean pooling");
        if (m.head.pooler) k.no("model.head.pooler", "EsmModel's pooler is not one Tessera reads");
      }
    }
    set_class(m.head.kind);
  } else if (f == "ast") {
    features_stem(true);
    learned();
    if (!m.final_norm) k.no("model.final_norm", "is false; AST ends with a layer norm");
    plan->patch = isqrt_exact(m.stem.n_features);
    if (plan->patch == 0)
      k.no("model.stem.n_features", std::to_string(m.stem.n_features) + " is not p·p: AST's patches are p × p spectrogram cells");
    // The grid of patches: frequency × time, from the audio plugin (or the folder it came from).
    json src;
    if (m.source == ModelSource::hf) src = source_json(m, "config.json");
    // The plugin's value, or its ast recipe's default (n_mels 0: 128; target_frames -1: 1024).
    const bool ast_recipe = plugin_option(exp, "audio", "recipe") == "ast";
    auto from = [&](const char* plugin_key, const char* hf_key, int64_t recipe_default) -> int64_t {
      const std::string v = plugin_option(exp, "audio", plugin_key);
      if (!v.empty() && std::strtoll(v.c_str(), nullptr, 10) > 0) return std::strtoll(v.c_str(), nullptr, 10);
      if (!v.empty() && ast_recipe) return recipe_default;
      if (src.is_object() && src.contains(hf_key) && src[hf_key].is_number_integer()) return src[hf_key].get<int64_t>();
      return 0;
    };
    plan->mels = from("n_mels", "num_mel_bins", 128);
    plan->frames = from("target_frames", "max_length", 1024);
    plan->stride = from("patch_stride", "frequency_stride", 10);
    if (plan->mels <= 0 || plan->frames <= 0 || plan->stride <= 0) {
      k.no("plugins", "an AST's positions are a frequency × time grid of patches, which the audio plugin's n_mels, "
                      "target_frames and patch_stride decide; the experiment has no audio plugin that sets them",
           "add the audio plugin with recipe: ast (or n_mels, target_frames and patch_stride)");
    } else if (plan->patch > 0) {
      const int64_t fp = (plan->mels - plan->patch) / plan->stride + 1, tp = (plan->frames - plan->patch) / plan->stride + 1;
      if (plan->mels < plan->patch || plan->frames < plan->patch || fp * tp + 2 != m.positions.max_len)
        k.no("model.positions.max_len",
             std::to_string(m.positions.max_len) + " rows, but " + std::to_string(plan->mels) + " mel bins × " +
                 std::to_string(plan->frames) + " frames in " + std::to_string(plan->patch) + "-patches with stride " +
                 std::to_string(plan->stride) + " make " + std::to_string(fp) + " × " + std::to_string(tp) + " + 2");
    }
    if (head_is({HeadKind::none, HeadKind::pool, HeadKind::classifier}, "a pooler or a classifier")) {
      pool_is(PoolKind::cls_dist, "AST pools the mean of its CLS and distillation rows");
      if (m.head.pooler) k.no("model.head.pooler", "AST has no dense pooler");
      if (m.head.kind == HeadKind::classifier && !m.head.norm)
        k.no("model.head.norm", "is false; ASTForAudioClassification normalises the pooled row first");
    }
    set_class(m.head.kind);
  }
  return k.errors == 0;
}

// ---------------------------------------------------------------------------------------------
// The files.

std::string fmt_value(double v) {
  std::ostringstream o;
  o.precision(9);
  o << v;
  return o.str();
}

json labels_json(const ModelConfig& m, json* label2id) {
  json id2label = json::object();
  *label2id = json::object();
  for (int64_t i = 0; i < m.head.n_classes; ++i) {
    const std::string name = static_cast<size_t>(i) < m.head.labels.size() ? m.head.labels[static_cast<size_t>(i)]
                                                                           : "LABEL_" + std::to_string(i);
    id2label[std::to_string(i)] = name;
    (*label2id)[name] = i;
  }
  return id2label;
}

json config_json(const ModelConfig& m, const Plan& p) {
  json c = json::object();
  if (m.source == ModelSource::hf) {  // keep what Tessera does not model (token ids, dropout, ...)
    json src = source_json(m, "config.json");
    if (src.is_object()) c = std::move(src);
  }
  for (const char* stale : {"_name_or_path", "transformers_version", "id2label", "label2id", "num_labels"}) c.erase(stale);
  c["architectures"] = json::array({p.hf_class});
  c["model_type"] = p.family == "ast" ? "audio-spectrogram-transformer" : p.family;
  c["torch_dtype"] = "float32";
  const char* act = activation_hf(m.activation);
  if (p.family == "gpt2") {
    c["n_embd"] = m.d_model;
    c["n_layer"] = m.n_layers;
    c["n_head"] = m.n_heads;
    c["n_inner"] = m.d_ff;
    c["n_positions"] = m.positions.max_len;
    c["n_ctx"] = m.positions.max_len;
    c["vocab_size"] = m.stem.vocab_size;
    c["activation_function"] = act;
    c["layer_norm_epsilon"] = m.norm_eps;
    c["scale_attn_weights"] = true;
    c["scale_attn_by_inverse_layer_idx"] = false;
  } else {
    c["hidden_size"] = m.d_model;
    c["num_hidden_layers"] = m.n_layers;
    c["num_attention_heads"] = m.n_heads;
    c["intermediate_size"] = m.d_ff;
    c["hidden_act"] = act;
    c["layer_norm_eps"] = m.norm_eps;
  }
  if (m.head.kind == HeadKind::lm) c["tie_word_embeddings"] = m.head.tied;
  if (m.head.kind == HeadKind::classifier) {
    json l2i;
    c["id2label"] = labels_json(m, &l2i);
    c["label2id"] = l2i;
  }
  if (p.family == "bert") {
    c["vocab_size"] = m.stem.vocab_size;
    c["type_vocab_size"] = m.stem.token_types;
    c["max_position_embeddings"] = m.positions.max_len;
    c["position_embedding_type"] = "absolute";
  } else if (p.family == "vit") {
    c["image_size"] = p.grid * p.patch;
    c["patch_size"] = p.patch;
    c["num_channels"] = 3;
    c["qkv_bias"] = true;
  } else if (p.family == "esm") {
    c["vocab_size"] = m.stem.vocab_size;
    c["position_embedding_type"] = "rotary";
    c["max_position_embeddings"] = m.positions.max_len;
    c["token_dropout"] = m.stem.token_dropout;
    c["mask_token_id"] = m.stem.mask_id >= 0 ? m.stem.mask_id : 32;
    if (!c.contains("pad_token_id")) c["pad_token_id"] = 1;
    c["emb_layer_norm_before"] = m.stem.norm;
    c["is_folding_model"] = false;
  } else if (p.family == "ast") {
    c["patch_size"] = p.patch;
    c["frequency_stride"] = p.stride;
    c["time_stride"] = p.stride;
    c["num_mel_bins"] = p.mels;
    c["max_length"] = p.frames;
    c["qkv_bias"] = true;
  }
  return c;
}

// Tessera's parameters under the class's tensor names, laid out as Hugging Face stores them.
// A parameter the class has no tensor for (Op::zeros) must be zero, else it is refused.
bool hf_tensors(const Experiment& exp, const Parameters& params, const Plan& p, Diagnostics* d,
                std::vector<std::pair<std::string, Tensor>>* out) {
  const ModelConfig& m = exp.model;
  const TensorMap tm = tensor_map(p.family, m, p.layout);
  std::map<std::string, std::vector<Tensor>> fused;  // split: the parts in order
  std::map<std::string, Tensor> named;
  bool ok = true;
  for (const ParamSpec& s : parameter_specs(m)) {
    const Tensor* t = params.find(s.name);
    auto e = tm.entries.find(s.name);
    if (!t || e == tm.entries.end()) {
      d->add(exp.where("model"), "model",
             "tessera export --hf: internal: no " + std::string(t ? "mapping" : "value") + " for parameter " + s.name);
      ok = false;
      continue;
    }
    const Entry& en = e->second;
    const Tensor v = t->to(DType::f32);
    switch (en.op) {
      case Op::same: named[en.hf] = v; break;
      case Op::linear: named[en.hf] = v.rank() == 2 ? v.transpose(0, 1).contiguous() : v; break;
      case Op::patch: named[en.hf] = v.transpose(0, 1).contiguous().reshape(en.hf_shape); break;
      case Op::squeeze:
      case Op::pos_grid: named[en.hf] = v.reshape(en.hf_shape); break;
      case Op::split: {
        auto& parts = fused[en.hf];
        parts.resize(static_cast<size_t>(en.parts));
        parts[static_cast<size_t>(en.part)] = v;
        break;
      }
      case Op::zeros: {
        float most = 0;
        for (int64_t i = 0; i < v.numel(); ++i) most = std::max(most, std::fabs(v.data<float>()[i]));
        if (most != 0) {
          const std::string key = s.name.rfind("head.", 0) == 0 ? "model.head" : "model.bias";
          d->add(exp.where(key), key,
                 "tessera export --hf: parameter " + s.name + " has values up to " + fmt_value(most) + ", but " +
                     p.hf_class + " has no such tensor (" + en.why + "); it would be lost",
                 "train with that bias frozen at zero (train.freeze), or keep Tessera's own weights file");
          ok = false;
        }
        break;
      }
    }
  }
  for (auto& [name, parts] : fused) {  // (in, n) blocks side by side, or (n) vectors end to end
    const Shape& s = parts[0].shape();
    const int64_t n = s[s.rank() - 1];
    const Shape whole = s.rank() == 2 ? Shape{s[0], n * static_cast<int64_t>(parts.size())} : Shape{n * static_cast<int64_t>(parts.size())};
    Tensor w = Tensor::empty(whole);
    for (size_t i = 0; i < parts.size(); ++i)
      w.slice(whole.rank() - 1, static_cast<int64_t>(i) * n, static_cast<int64_t>(i + 1) * n).copy_from(parts[i]);
    named[name] = w;
  }
  for (auto& [name, t] : named) out->emplace_back(name, t);
  return ok;
}

// A scratch folder beside the target, removed unless released.
struct TempDir {
  fs::path path;
  ~TempDir() {
    if (path.empty()) return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

Status write_text(const fs::path& p, const std::string& text) { return write_file_atomic(p.string(), text); }
Status write_json(const fs::path& p, const json& j) { return write_text(p, j.dump(2) + "\n"); }

Status copy_file(const std::string& from, const fs::path& to) {
  Result<std::string> bytes = read_file(from);
  if (!bytes.ok()) return bytes.status();
  return write_text(to, *bytes);
}

// The tokenizer, preprocessor and sentence-transformers files of the family, as the experiment's
// plugin (or the folder the model came from) gives them.
Status side_files(const Experiment& exp, const Plan& p, const fs::path& dir, ExportReport* rep) {
  const ModelConfig& m = exp.model;
  std::set<std::string> done;
  auto wrote = [&](const std::string& name) {
    done.insert(name);
    rep->files.push_back(name);
  };
  if (m.source == ModelSource::hf) {  // the source folder's own files, as they are
    for (const char* name : {"vocab.txt", "vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                             "special_tokens_map.json", "added_tokens.json", "generation_config.json",
                             "preprocessor_config.json", "sentence_bert_config.json"}) {
      const fs::path src = fs::path(m.path) / name;
      if (!fs::is_regular_file(src)) continue;
      TSR_RETURN_IF_ERROR(copy_file(src.string(), dir / name));
      wrote(name);
    }
  }
  const std::string tok = plugin_option(exp, "text", "tokenizer");
  if (p.family == "bert" && !done.count("vocab.txt")) {
    const std::string vocab = plugin_option(exp, "text", "vocab");
    if (tok == "wordpiece" && !vocab.empty()) {
      TSR_RETURN_IF_ERROR(copy_file(vocab, dir / "vocab.txt"));
      wrote("vocab.txt");
      json tc = {{"tokenizer_class", "BertTokenizer"},
                 {"do_lower_case", plugin_option(exp, "text", "lowercase") != "false"},
                 {"model_max_length", m.positions.max_len}};
      const std::string sa = plugin_option(exp, "text", "strip_accents");
      if (sa == "true" || sa == "false") tc["strip_accents"] = sa == "true";
      TSR_RETURN_IF_ERROR(write_json(dir / "tokenizer_config.json", tc));
      wrote("tokenizer_config.json");
    } else {
      rep->notes.push_back("no vocab.txt: the experiment's text plugin is not WordPiece with a vocab file, so it has no "
                           "BERT tokenizer to write (tokenize with your own)");
    }
  }
  if (p.family == "gpt2" && !done.count("vocab.json")) {
    const std::string vocab = plugin_option(exp, "text", "vocab"), merges = plugin_option(exp, "text", "merges");
    if (tok == "bpe" && !vocab.empty() && !merges.empty()) {
      TSR_RETURN_IF_ERROR(copy_file(vocab, dir / "vocab.json"));
      TSR_RETURN_IF_ERROR(copy_file(merges, dir / "merges.txt"));
      wrote("vocab.json");
      wrote("merges.txt");
      TSR_RETURN_IF_ERROR(write_json(dir / "tokenizer_config.json",
                                     {{"tokenizer_class", "GPT2Tokenizer"}, {"model_max_length", m.positions.max_len}}));
      wrote("tokenizer_config.json");
    } else {
      rep->notes.push_back("no vocab.json or merges.txt: the experiment's text plugin is not byte-level BPE with vocab "
                           "and merges files, so it has no GPT-2 tokenizer to write (tokenize with your own)");
    }
  }
  if (p.family == "esm" && !done.count("vocab.txt")) {
    std::string v;
    for (const std::string& t : esm2_alphabet()) v += t + "\n";
    TSR_RETURN_IF_ERROR(write_text(dir / "vocab.txt", v));
    TSR_RETURN_IF_ERROR(write_json(dir / "tokenizer_config.json",
                                   {{"tokenizer_class", "EsmTokenizer"}, {"model_max_length", m.positions.max_len}}));
    wrote("vocab.txt");
    wrote("tokenizer_config.json");
  }
  if (p.family == "vit") {
    // Always written: the model's image size is the grid's, whatever the source folder said.
    const std::string resize = plugin_option(exp, "image", "resize");
    auto three = [&](const char* key, double def) {
      std::vector<double> v = numbers(plugin_option(exp, "image", key));
      if (v.size() == 1) v.assign(3, v[0]);
      if (v.size() != 3) v.assign(3, def);
      return json(v);
    };
    const std::string rescale = plugin_option(exp, "image", "rescale_factor");
    if (!resize.empty() && resize != "pil_bilinear" && resize != "pil_bicubic")
      rep->notes.push_back("preprocessor_config.json says bilinear (2): the image plugin's resize " + resize +
                           " has no Hugging Face equivalent");
    json pc = json::object();
    if (m.source == ModelSource::hf) {
      json src = source_json(m, "preprocessor_config.json");
      if (src.is_object()) pc = std::move(src);
    }
    if (!pc.contains("image_processor_type")) pc["image_processor_type"] = "ViTImageProcessor";
    pc["do_resize"] = true;
    pc["size"] = {{"height", p.grid * p.patch}, {"width", p.grid * p.patch}};
    if (has_plugin(exp, "image") || !pc.contains("resample")) pc["resample"] = resize == "pil_bicubic" ? 3 : 2;
    if (has_plugin(exp, "image") || !pc.contains("image_mean")) {
      pc["do_rescale"] = true;
      pc["rescale_factor"] = rescale.empty() ? 1.0 / 255 : std::strtod(rescale.c_str(), nullptr);
      pc["do_normalize"] = true;
      pc["image_mean"] = three("mean", 0.5);
      pc["image_std"] = three("std", 0.5);
    }
    TSR_RETURN_IF_ERROR(write_json(dir / "preprocessor_config.json", pc));
    if (!done.count("preprocessor_config.json")) rep->files.push_back("preprocessor_config.json");
  }
  if (p.family == "ast" && !done.count("preprocessor_config.json")) {
    const std::string mean = plugin_option(exp, "audio", "ast_mean"), sd = plugin_option(exp, "audio", "ast_std");
    json pc = {{"feature_extractor_type", "ASTFeatureExtractor"},
               {"feature_size", 1},
               {"max_length", p.frames},
               {"num_mel_bins", p.mels},
               {"sampling_rate", 16000},
               {"padding_value", 0.0},
               {"do_normalize", true},
               {"mean", mean.empty() ? -4.2677393 : std::strtod(mean.c_str(), nullptr)},
               {"std", sd.empty() ? 4.5689974 : std::strtod(sd.c_str(), nullptr)},
               {"return_attention_mask", false}};
    TSR_RETURN_IF_ERROR(write_json(dir / "preprocessor_config.json", pc));
    wrote("preprocessor_config.json");
  }
  if (p.family == "bert" && p.sentence_transformers) {
    const char* mode = m.head.pool == PoolKind::mean ? "pooling_mode_mean_tokens"
                       : m.head.pool == PoolKind::last ? "pooling_mode_lasttoken"
                                                       : "pooling_mode_cls_token";
    json modules = json::array({{{"idx", 0}, {"name", "0"}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}},
                                {{"idx", 1}, {"name", "1"}, {"path", "1_Pooling"}, {"type", "sentence_transformers.models.Pooling"}}});
    if (m.head.normalize)
      modules.push_back({{"idx", 2}, {"name", "2"}, {"path", "2_Normalize"}, {"type", "sentence_transformers.models.Normalize"}});
    json pooling = {{"word_embedding_dimension", m.d_model},
                    {"pooling_mode_cls_token", false},
                    {"pooling_mode_mean_tokens", false},
                    {"pooling_mode_max_tokens", false},
                    {"pooling_mode_mean_sqrt_len_tokens", false},
                    {"pooling_mode_weightedmean_tokens", false},
                    {"pooling_mode_lasttoken", false}};
    pooling[mode] = true;
    std::error_code ec;
    fs::create_directory(dir / "1_Pooling", ec);
    if (ec) return Status::IoError((dir / "1_Pooling").string() + ": " + ec.message());
    TSR_RETURN_IF_ERROR(write_json(dir / "modules.json", modules));
    TSR_RETURN_IF_ERROR(write_json(dir / "1_Pooling" / "config.json", pooling));
    rep->files.push_back("modules.json");
    rep->files.push_back("1_Pooling/config.json");
    if (m.head.normalize) {
      fs::create_directory(dir / "2_Normalize", ec);
      if (ec) return Status::IoError((dir / "2_Normalize").string() + ": " + ec.message());
    }
    if (!done.count("sentence_bert_config.json")) {
      TSR_RETURN_IF_ERROR(write_json(dir / "sentence_bert_config.json",
                                     {{"max_seq_length", m.positions.max_len}, {"do_lower_case", false}}));
      rep->files.push_back("sentence_bert_config.json");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string export_family(const ModelConfig& m) { return family_of(m); }

bool export_folder(const Experiment& exp, const Parameters& params, const std::string& dir_in, Diagnostics* diags,
                   ExportReport* report) {
  ExportReport rep;
  Plan plan;
  if (!plan_export(exp, diags, &plan)) return false;
  std::vector<std::pair<std::string, Tensor>> tensors;
  if (!hf_tensors(exp, params, plan, diags, &tensors)) return false;
  fs::path dir = fs::path(dir_in).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "out/" names the folder "out"
  const Location here{dir.string(), 0, 0};
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    diags->add(here, "", "already exists and is not an empty folder; tessera export --hf writes a new folder",
               "remove it or choose another name");
    return false;
  }
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  std::string tmpl = (parent / ("." + dir.filename().string() + ".tmp-XXXXXX")).string();
  TempDir tmp;
  if (!mkdtemp(tmpl.data())) {
    diags->add(here, "", std::string("cannot make a scratch folder beside it: ") + std::strerror(errno));
    return false;
  }
  tmp.path = tmpl;
  auto fail = [&](const Status& st) {
    diags->add(here, "", st.message());
    return false;
  };
  rep.family = plan.family;
  rep.hf_class = plan.hf_class;
  if (Status st = write_json(tmp.path / "config.json", config_json(exp.model, plan)); !st.ok()) return fail(st);
  rep.files.push_back("config.json");
  if (Status st = safetensors::write((tmp.path / "model.safetensors").string(), tensors, {{"format", "pt"}}); !st.ok())
    return fail(st);
  rep.files.push_back("model.safetensors");
  rep.tensors = tensors.size();
  if (Status st = side_files(exp, plan, tmp.path, &rep); !st.ok()) return fail(st);
  if (fs::exists(dir, ec)) fs::remove(dir, ec);  // the empty folder checked above
  fs::rename(tmp.path, dir, ec);
  if (ec) return fail(Status::IoError(tmp.path.string() + " -> " + dir.string() + ": " + ec.message()));
  tmp.path.clear();
  if (report) *report = std::move(rep);
  return true;
}

}  // namespace tessera::hf
