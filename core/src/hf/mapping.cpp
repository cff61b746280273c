// The parameter <-> tensor table of the five families (see mapping.h); the importer reads it one
// way, the exporter the other.
#include "mapping.h"

namespace tessera::hf {

namespace {

// The tensors of one block, named as the family names them under `e` ("encoder.layer.3.").
void layer_entries(std::map<std::string, Entry>& map, const std::string& e, int64_t l, const char* q, const char* k,
                   const char* v, const char* o, const char* ln1, const char* ffn1, const char* ffn2, const char* ln2,
                   bool qkv_bias) {
  const std::string b = "blocks." + std::to_string(l) + ".";
  const std::pair<const char*, const char*> qkv[] = {{"q", q}, {"k", k}, {"v", v}};
  for (const auto& [t, h] : qkv) {
    map[b + "attn.w_" + t] = {e + h + ".weight", Op::linear};
    map[b + "attn.b_" + t] =
        qkv_bias ? Entry{e + h + ".bias", Op::same} : Entry{"", Op::zeros, 0, 1, {}, "qkv_bias: false"};
  }
  map[b + "attn.w_o"] = {e + o + ".weight", Op::linear};
  map[b + "attn.b_o"] = {e + o + ".bias"};
  map[b + "ln1.gamma"] = {e + ln1 + ".weight"};
  map[b + "ln1.beta"] = {e + ln1 + ".bias"};
  map[b + "ffn.w1"] = {e + ffn1 + ".weight", Op::linear};
  map[b + "ffn.b1"] = {e + ffn1 + ".bias"};
  map[b + "ffn.w2"] = {e + ffn2 + ".weight", Op::linear};
  map[b + "ffn.b2"] = {e + ffn2 + ".bias"};
  map[b + "ln2.gamma"] = {e + ln2 + ".weight"};
  map[b + "ln2.beta"] = {e + ln2 + ".bias"};
}

// An LM head's projection to the vocabulary: through the token table when tied (transformers then
// ties `decoder` to it), else the checkpoint's own (V, C) `decoder` matrix. `bias`: the head's
// vocabulary bias, "" when the class has none; an untied Tessera head has a bias whenever
// model.bias, which every family here sets: zeros where the class has none (GPT-2's lm_head).
void lm_projection(TensorMap& t, const ModelConfig& m, const std::string& decoder, const std::string& bias,
                   const std::string& no_bias_why) {
  if (m.head.tied) t.tied_decoder = decoder;
  else t.entries["head.lm"] = {decoder, Op::linear};
  if (!bias.empty()) t.entries["head.lm_bias"] = {bias};
  else if (!m.head.tied) t.entries["head.lm_bias"] = {"", Op::zeros, 0, 1, {}, no_bias_why};
}

// BERT's and ESM-2's masked-LM head: dense, activation, layer norm, the vocabulary projection, a bias.
void masked_lm_head(TensorMap& t, const ModelConfig& m, const std::string& dense, const std::string& norm,
                    const std::string& decoder, const std::string& bias) {
  t.entries["head.transform.w"] = {dense + ".weight", Op::linear};
  t.entries["head.transform.b"] = {dense + ".bias"};
  t.entries["head.transform.gamma"] = {norm + ".weight"};
  t.entries["head.transform.beta"] = {norm + ".bias"};
  lm_projection(t, m, decoder, bias, "");
}

}  // namespace

TensorMap tensor_map(const std::string& family, const ModelConfig& m, const Layout& lay) {
  TensorMap t;
  auto& map = t.entries;
  const std::string& p = lay.prefix;
  const int64_t C = m.d_model;
  if (family == "bert") {
    map["stem.embed"] = {p + "embeddings.word_embeddings.weight"};
    map["stem.type_embed"] = {p + "embeddings.token_type_embeddings.weight"};
    map["pos.table"] = {p + "embeddings.position_embeddings.weight"};
    map["stem.norm.gamma"] = {p + "embeddings.LayerNorm.weight"};
    map["stem.norm.beta"] = {p + "embeddings.LayerNorm.bias"};
    for (int64_t l = 0; l < m.n_layers; ++l)
      layer_entries(map, p + "encoder.layer." + std::to_string(l) + ".", l, "attention.self.query",
                    "attention.self.key", "attention.self.value", "attention.output.dense",
                    "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm", true);
    if (m.head.kind == HeadKind::classifier) {
      map["head.w"] = {"classifier.weight", Op::linear};
      map["head.b"] = {"classifier.bias"};
    } else if (m.head.kind == HeadKind::lm) {
      masked_lm_head(t, m, "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                     "cls.predictions.decoder.weight", "cls.predictions.bias");
    }
    map["head.pooler.w"] = {p + "pooler.dense.weight", Op::linear};
    map["head.pooler.b"] = {p + "pooler.dense.bias"};
  } else if (family == "gpt2") {
    map["stem.embed"] = {p + "wte.weight"};
    map["pos.table"] = {p + "wpe.weight"};
    for (int64_t l = 0; l < m.n_layers; ++l) {
      const std::string e = p + "h." + std::to_string(l) + ".";
      const std::string b = "blocks." + std::to_string(l) + ".";
      const char* qkv[] = {"q", "k", "v"};
      for (int i = 0; i < 3; ++i) {
        map[b + "attn.w_" + qkv[i]] = {e + "attn.c_attn.weight", Op::split, i, 3};
        map[b + "attn.b_" + qkv[i]] = {e + "attn.c_attn.bias", Op::split, i, 3};
      }
      map[b + "attn.w_o"] = {e + "attn.c_proj.weight"};
      map[b + "attn.b_o"] = {e + "attn.c_proj.bias"};
      map[b + "ln1.gamma"] = {e + "ln_1.weight"};
      map[b + "ln1.beta"] = {e + "ln_1.bias"};
      map[b + "ffn.w1"] = {e + "mlp.c_fc.weight"};
      map[b + "ffn.b1"] = {e + "mlp.c_fc.bias"};
      map[b + "ffn.w2"] = {e + "mlp.c_proj.weight"};
      map[b + "ffn.b2"] = {e + "mlp.c_proj.bias"};
      map[b + "ln2.gamma"] = {e + "ln_2.weight"};
      map[b + "ln2.beta"] = {e + "ln_2.bias"};
    }
    map["final_norm.gamma"] = {p + "ln_f.weight"};
    map["final_norm.beta"] = {p + "ln_f.bias"};
    lm_projection(t, m, "lm_head.weight", "", "GPT-2's lm_head has no bias");
  } else if (family == "vit") {
    const int64_t ch = lay.channels;
    int64_t patch = 1;
    while (ch * (patch + 1) * (patch + 1) <= m.stem.n_features) ++patch;
    map["stem.proj"] = {p + "embeddings.patch_embeddings.projection.weight", Op::patch, 0, 1, Shape{C, ch, patch, patch}};
    map["stem.proj_bias"] = {p + "embeddings.patch_embeddings.projection.bias"};
    map["stem.cls"] = {p + "embeddings.cls_token", Op::squeeze, 0, 1, Shape{1, 1, C}};
    map["pos.table"] = {p + "embeddings.position_embeddings", Op::pos_grid, 0, 1, Shape{1, 1 + lay.grid * lay.grid, C}};
    for (int64_t l = 0; l < m.n_layers; ++l)
      layer_entries(map, p + "encoder.layer." + std::to_string(l) + ".", l, "attention.attention.query",
                    "attention.attention.key", "attention.attention.value", "attention.output.dense",
                    "layernorm_before", "intermediate.dense", "output.dense", "layernorm_after", lay.qkv_bias);
    map["final_norm.gamma"] = {p + "layernorm.weight"};
    map["final_norm.beta"] = {p + "layernorm.bias"};
    map["head.w"] = {"classifier.weight", Op::linear};
    map["head.b"] = {"classifier.bias"};
    map["head.pooler.w"] = {p + "pooler.dense.weight", Op::linear};
    map["head.pooler.b"] = {p + "pooler.dense.bias"};
  } else if (family == "esm") {
    map["stem.embed"] = {p + "embeddings.word_embeddings.weight"};
    map["stem.norm.gamma"] = {p + "embeddings.layer_norm.weight"};
    map["stem.norm.beta"] = {p + "embeddings.layer_norm.bias"};
    for (int64_t l = 0; l < m.n_layers; ++l)
      layer_entries(map, p + "encoder.layer." + std::to_string(l) + ".", l, "attention.self.query",
                    "attention.self.key", "attention.self.value", "attention.output.dense", "attention.LayerNorm",
                    "intermediate.dense", "output.dense", "LayerNorm", true);
    map["final_norm.gamma"] = {p + "encoder.emb_layer_norm_after.weight"};
    map["final_norm.beta"] = {p + "encoder.emb_layer_norm_after.bias"};
    if (m.head.kind == HeadKind::lm)
      masked_lm_head(t, m, "lm_head.dense", "lm_head.layer_norm", "lm_head.decoder.weight", "lm_head.bias");
  } else if (family == "ast") {
    int64_t patch = 1;
    while ((patch + 1) * (patch + 1) <= m.stem.n_features) ++patch;
    map["stem.proj"] = {p + "embeddings.patch_embeddings.projection.weight", Op::patch, 0, 1, Shape{C, 1, patch, patch}};
    map["stem.proj_bias"] = {p + "embeddings.patch_embeddings.projection.bias"};
    map["stem.cls"] = {p + "embeddings.cls_token", Op::squeeze, 0, 1, Shape{1, 1, C}};
    map["stem.dist"] = {p + "embeddings.distillation_token", Op::squeeze, 0, 1, Shape{1, 1, C}};
    map["pos.table"] = {p + "embeddings.position_embeddings", Op::squeeze, 0, 1, Shape{1, m.positions.max_len, C}};
    for (int64_t l = 0; l < m.n_layers; ++l)
      layer_entries(map, p + "encoder.layer." + std::to_string(l) + ".", l, "attention.attention.query",
                    "attention.attention.key", "attention.attention.value", "attention.output.dense",
                    "layernorm_before", "intermediate.dense", "output.dense", "layernorm_after", lay.qkv_bias);
    map["final_norm.gamma"] = {p + "layernorm.weight"};
    map["final_norm.beta"] = {p + "layernorm.bias"};
    map["head.norm.gamma"] = {"classifier.layernorm.weight"};
    map["head.norm.beta"] = {"classifier.layernorm.bias"};
    map["head.w"] = {"classifier.dense.weight", Op::linear};
    map["head.b"] = {"classifier.dense.bias"};
  }
  return t;
}

Shape expected_hf_shape(const Entry& e, const Shape& s) {
  switch (e.op) {
    case Op::same: return s;
    case Op::linear: return s.rank() == 2 ? Shape{s[1], s[0]} : s;
    case Op::split: return s.rank() == 2 ? Shape{s[0], s[1] * e.parts} : Shape{s[0] * e.parts};
    case Op::patch:
    case Op::squeeze:
    case Op::pos_grid: return e.hf_shape;
    case Op::zeros: return s;
  }
  return s;
}

const std::vector<HfClass>& hf_classes() {
  static const std::vector<HfClass> k = {
      {"bert", "BertModel", "", HeadKind::pool},
      {"bert", "BertForSequenceClassification", "bert.", HeadKind::classifier},
      {"bert", "BertForMaskedLM", "bert.", HeadKind::lm},
      {"gpt2", "GPT2LMHeadModel", "transformer.", HeadKind::lm},
      {"vit", "ViTModel", "", HeadKind::pool},
      {"vit", "ViTForImageClassification", "vit.", HeadKind::classifier},
      {"esm", "EsmModel", "", HeadKind::pool},
      {"esm", "EsmForMaskedLM", "esm.", HeadKind::lm},
      {"ast", "ASTModel", "", HeadKind::pool},
      {"ast", "ASTForAudioClassification", "audio_spectrogram_transformer.", HeadKind::classifier},
  };
  return k;
}

std::string task_prefix(const std::string& family) {
  for (const HfClass& c : hf_classes())
    if (family == c.family && *c.prefix) return c.prefix;
  return "";
}

const std::vector<std::string>& esm2_alphabet() {
  static const std::vector<std::string> k = {
      "<cls>", "<pad>", "<eos>", "<unk>", "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K", "Q",
      "N",     "F",     "Y",     "M",     "H", "W", "C", "X", "B", "U", "Z", "O", ".", "-", "<null_1>", "<mask>"};
  return k;
}

}  // namespace tessera::hf
