// `tessera export --hf`: models written back as Hugging Face folders. Every fixture folder of
// tests/data/hf and five YAML-defined models (tests/data/hf_export) are exported and read back by
// Tessera's own importer (the same parameters bit for bit, the same config, the same outputs);
// the YAML models' exports match what transformers computed with them (committed by
// tools/reference/check_hf_export.py, 1e-4 relative to the output's scale); what a family cannot
// represent is refused at its config key, leaving nothing on disk.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "test_util.h"
#include "tessera/config.h"
#include "tessera/fileio.h"
#include "tessera/hf.h"
#include "tessera/model.h"
#include "tessera/safetensors.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing_util::max_abs;
using testing_util::max_abs_diff;
const std::string kData = TESSERA_TEST_DATA;
const std::string kHf = kData + "/hf/";
const std::string kExportData = kData + "/hf_export/";
const std::string kTessera = std::string(TESSERA_BINARY_DIR) + "/tessera";

std::string scratch(const std::string& name) {
  const std::string d = ::testing::TempDir() + "tessera_hf_export_" + name + "_" + std::to_string(getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

Experiment load_yaml(const std::string& yaml, const std::string& base = kData) {
  Diagnostics d;
  std::optional<Experiment> e = load_experiment_from_string(yaml, "t.yaml", base, {}, &d);
  EXPECT_TRUE(e.has_value()) << d.str();
  return e ? *e : Experiment{};
}
Experiment load_file(const std::string& path) {
  Diagnostics d;
  std::optional<Experiment> e = load_experiment(path, {}, &d);
  EXPECT_TRUE(e.has_value()) << d.str();
  return e ? *e : Experiment{};
}
Experiment from_hf(const std::string& dir) { return load_yaml("model:\n  from: hf\n  path: " + dir + "\n", "/"); }

Parameters params_of(const ModelConfig& m) {
  Result<Parameters> p = Parameters::resolve(m);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? p->clone() : Parameters();
}

// A "trained" model: the seeded init moved by seeded noise, uniform in [-0.1, 0.1) from mt19937's
// 32-bit draws (the same numbers on every machine), so that every bias and norm is nonzero and a
// parameter mapped to the wrong tensor shows.
Parameters trained(const ModelConfig& m, uint32_t seed) {
  Parameters p = params_of(m);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < p.size(); ++i) {
    Tensor* t = p.find(p[i].first);
    float* v = t->data<float>();
    for (int64_t j = 0; j < t->numel(); ++j) v[j] += static_cast<float>((rng() / 4294967296.0 - 0.5) * 0.2);
  }
  return p;
}

bool export_ok(const Experiment& e, const Parameters& p, const std::string& dir, hf::ExportReport* rep = nullptr) {
  Diagnostics d;
  hf::ExportReport r;
  const bool ok = hf::export_folder(e, p, dir, &d, &r);
  EXPECT_TRUE(ok) << d.str();
  if (rep) *rep = r;
  return ok;
}

// Conv2d patches of an image (ch, H, W) -> (H/p · W/p, ch·p·p), as the image plugin cuts them.
Tensor image_patches(const Tensor& px, int64_t p) {
  const int64_t ch = px.dim(0), H = px.dim(1), W = px.dim(2), gw = W / p;
  Tensor out = Tensor::empty({H / p * gw, ch * p * p});
  const Tensor x = px.to(DType::f32).contiguous();
  for (int64_t gy = 0; gy < H / p; ++gy)
    for (int64_t gx = 0; gx < gw; ++gx)
      for (int64_t c = 0; c < ch; ++c)
        for (int64_t ky = 0; ky < p; ++ky)
          for (int64_t kx = 0; kx < p; ++kx)
            out.data<float>()[(gy * gw + gx) * ch * p * p + (c * p + ky) * p + kx] =
                x.data<float>()[(c * H + gy * p + ky) * W + gx * p + kx];
  return out;
}

// AST: input_values (frames, mels) -> 16x16 patches with stride 10, frequency-major.
Tensor ast_patches(const Tensor& iv, int64_t p, int64_t s) {
  const int64_t frames = iv.dim(0), mels = iv.dim(1), fp = (mels - p) / s + 1, tp = (frames - p) / s + 1;
  Tensor out = Tensor::empty({fp * tp, p * p});
  const Tensor x = iv.to(DType::f32).contiguous();
  for (int64_t fi = 0; fi < fp; ++fi)
    for (int64_t ti = 0; ti < tp; ++ti)
      for (int64_t kf = 0; kf < p; ++kf)
        for (int64_t kt = 0; kt < p; ++kt)
          out.data<float>()[(fi * tp + ti) * p * p + kf * p + kt] = x.data<float>()[(ti * s + kt) * mels + fi * s + kf];
  return out;
}

// The inputs of tests/data/hf/<family>/reference.safetensors (transformers' own), at their model size.
std::vector<Tensor> reference_inputs(const std::string& family) {
  Result<safetensors::File> f = safetensors::File::open(kHf + family + "/reference.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().message();
  std::ifstream in(kHf + family + "/reference.json");
  const nlohmann::json meta = nlohmann::json::parse(in);
  std::vector<Tensor> v;
  for (size_t i = 0; i < meta["items"].size(); ++i) {
    if (meta["items"][i].value("interpolate_pos_encoding", false)) continue;
    Result<Tensor> t = f->get("inputs." + std::to_string(i));
    EXPECT_TRUE(t.ok());
    if (t.ok()) v.push_back(t->to(DType::f32).contiguous());
  }
  return v;
}

Batch batch_of(const std::string& family, const Tensor& input, const ModelConfig& m) {
  if (family == "vit") return Batch::from_rows(image_patches(input, std::lround(std::sqrt(m.stem.n_features / 3.0))));
  if (family == "ast") return Batch::from_rows(ast_patches(input, 16, 10));
  const Tensor ids = input.to(DType::i32).contiguous();
  return Batch::from_ids(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel()));
}

Outputs forward(const ModelConfig& m, const Parameters& p, const Batch& b) {
  Result<Model> model = Model::build(m, p);
  EXPECT_TRUE(model.ok()) << model.status().message();
  Outputs out;
  if (!model.ok()) return out;
  const Status st = model->forward(b, {}, &out);
  EXPECT_TRUE(st.ok()) << st.message();
  return out;
}

// What the architecture is, field by field, for comparing a config with its round trip.
std::string describe(const ModelConfig& m) {
  std::ostringstream o;
  o << arch_name(m.arch) << " causal " << m.causal << " C " << m.d_model << " L " << m.n_layers << " H " << m.n_heads
    << " dk " << m.d_k << " dv " << m.d_v << " F " << m.d_ff << " act " << static_cast<int>(m.activation) << " "
    << norm_name(m.norm) << " eps " << m.norm_eps << " final " << m.final_norm << " bias " << m.bias << " scale "
    << m.attention.scale << " | pos " << position_kind_name(m.positions.kind) << " " << m.positions.max_len << " "
    << (m.positions.kind == PositionKind::rotary ? m.positions.rotary_dims : 0) << " | stem " << stem_kind_name(m.stem.kind) << " V " << m.stem.vocab_size << " F "
    << m.stem.n_features << " cls " << m.stem.cls << " dist " << m.stem.dist << " types " << m.stem.token_types
    << " norm " << m.stem.norm << " dropout " << m.stem.token_dropout << " mask " << m.stem.mask_id << " | head "
    << head_kind_name(m.head.kind) << " "
    << (m.head.kind == HeadKind::lm || m.head.kind == HeadKind::none ? "-" : pool_kind_name(m.head.pool)) << " normalize " << m.head.normalize
    << " n " << m.head.n_classes << " tied " << m.head.tied << " lm_bias " << m.head.lm_bias << " pooler "
    << m.head.pooler << " norm " << m.head.norm << " transform " << m.head.transform << " labels";
  // Classes without names are written as transformers names them (LABEL_0, ...) and read back so.
  for (int64_t i = 0; i < m.head.n_classes; ++i)
    o << " " << (m.head.labels.empty() ? "LABEL_" + std::to_string(i) : m.head.labels[static_cast<size_t>(i)]);
  return o.str();
}

// Exports (e, p), imports the folder back and expects the same config, the same parameters bit for
// bit and the same outputs on `inputs`.
void expect_round_trip(const std::string& family, const Experiment& e, const Parameters& p,
                       const std::vector<Tensor>& inputs, const std::string& dir) {
  hf::ExportReport rep;
  ASSERT_TRUE(export_ok(e, p, dir, &rep));
  EXPECT_EQ(rep.family, family);
  const Experiment back = from_hf(dir);
  EXPECT_EQ(describe(back.model), describe(e.model));
  EXPECT_EQ(back.model.family, family);
  const Parameters q = params_of(back.model);
  ASSERT_EQ(q.size(), p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(q[i].first, p[i].first);
    const Tensor a = p[i].second.to(DType::f32).contiguous(), b = q[i].second.to(DType::f32).contiguous();
    ASSERT_EQ(a.shape(), b.shape()) << p[i].first;
    EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), static_cast<size_t>(a.numel()) * 4), 0) << p[i].first;
  }
  ASSERT_FALSE(inputs.empty());
  for (const Tensor& in : inputs) {
    const Outputs x = forward(e.model, p, batch_of(family, in, e.model));
    const Outputs y = forward(back.model, q, batch_of(family, in, back.model));
    EXPECT_EQ(max_abs_diff(x.hidden, y.hidden), 0.0);
    if (x.logits.defined()) {
      EXPECT_EQ(max_abs_diff(x.logits, y.logits), 0.0);
    }
    if (x.pooled.defined()) {
      EXPECT_EQ(max_abs_diff(x.pooled, y.pooled), 0.0);
    }
  }
}

// The export of `yaml` refused: the messages, and nothing written.
std::string refusal(const std::string& yaml, const std::string& dir) {
  const Experiment e = load_yaml(yaml);
  Diagnostics d;
  hf::ExportReport rep;
  EXPECT_FALSE(hf::export_folder(e, params_of(e.model), dir, &d, &rep));
  EXPECT_FALSE(fs::exists(dir)) << "a refused export wrote " << dir;
  return d.str();
}

// ---------------------------------------------------------------------------------------------
// (1) Tessera's importer reads the export back.

TEST(HfExport, EveryFixtureFolderRoundTripsThroughTheImporter) {
  const std::string root = scratch("fixtures");
  for (const char* folder : {"bert", "gpt2", "vit", "esm", "ast", "gpt2_untied", "bert_cls", "bert_mlm",
                             "bert_mlm_untied", "vit_pooler", "esm_untied"}) {
    SCOPED_TRACE(folder);
    const std::string family = std::string(folder).substr(0, std::string(folder).find('_'));
    const Experiment e = from_hf(kHf + folder + "/model");
    const std::string dir = root + "/" + folder;
    expect_round_trip(family, e, params_of(e.model), reference_inputs(folder), dir);
    // The class is the one the folder had, and the tokenizer or processor files came along.
    std::ifstream a(kHf + folder + "/model/config.json"), b(dir + "/config.json");
    EXPECT_EQ(nlohmann::json::parse(b)["architectures"], nlohmann::json::parse(a)["architectures"]);
    for (const char* f : {"vocab.txt", "vocab.json", "merges.txt", "tokenizer.json", "preprocessor_config.json",
                          "modules.json", "1_Pooling/config.json"})
      EXPECT_EQ(fs::exists(dir + "/" + f), fs::exists(kHf + folder + "/model/" + f)) << f;
  }
  fs::remove_all(root);
}

TEST(HfExport, YamlModelsExportAsTheFamilyTheirArchitectureMatches) {
  const std::string root = scratch("yaml");
  const std::pair<const char*, const char*> cases[] = {{"bert", "BertForMaskedLM"},
                                                       {"gpt2", "GPT2LMHeadModel"},
                                                       {"vit", "ViTForImageClassification"},
                                                       {"esm", "EsmForMaskedLM"},
                                                       {"ast", "ASTForAudioClassification"}};
  uint32_t seed = 100;
  for (const auto& [family, cls] : cases) {
    SCOPED_TRACE(family);
    const Experiment e = load_file(kExportData + family + ".yaml");
    EXPECT_EQ(hf::export_family(e.model), family);
    const std::string dir = root + "/" + family;
    expect_round_trip(family, e, trained(e.model, ++seed), reference_inputs(family), dir);
    std::ifstream in(dir + "/config.json");
    EXPECT_EQ(nlohmann::json::parse(in)["architectures"][0], cls);
  }
  // The tokenizer files the plugins map to.
  EXPECT_TRUE(fs::exists(root + "/bert/vocab.txt"));
  EXPECT_TRUE(fs::exists(root + "/gpt2/vocab.json") && fs::exists(root + "/gpt2/merges.txt"));
  EXPECT_TRUE(fs::exists(root + "/esm/vocab.txt"));
  std::ifstream pp(root + "/vit/preprocessor_config.json");
  const nlohmann::json vit_pp = nlohmann::json::parse(pp);
  EXPECT_EQ(vit_pp["size"]["height"], 32);
  EXPECT_EQ(vit_pp["image_mean"][0], 0.5);
  fs::remove_all(root);
}

// Fine-tuning: a folder's encoder with a new head exports as the class that has that head.
TEST(HfExport, AFolderWithANewHeadExportsAsTheClassOfThatHead) {
  const std::string root = scratch("new_head");
  const Experiment e = load_yaml("model:\n  from: hf\n  path: hf/bert/model\n  head: {kind: classifier, n_classes: 3, "
                                 "pool: cls, pooler: true, normalize: false, labels: [low, mid, high]}\n");
  expect_round_trip("bert", e, trained(e.model, 5), reference_inputs("bert"), root + "/cls");
  std::ifstream in(root + "/cls/config.json");
  const nlohmann::json c = nlohmann::json::parse(in);
  EXPECT_EQ(c["architectures"][0], "BertForSequenceClassification");
  EXPECT_EQ(c["id2label"]["2"], "high");
  EXPECT_FALSE(fs::exists(root + "/cls/modules.json"));  // the classifier reads the pooler, not the mean
  // The same head on the mean of the rows, L2-normalised as the folder was, is not BERT's.
  const std::string msg = refusal("model:\n  from: hf\n  path: hf/bert/model\n  head: {kind: classifier, n_classes: 3}\n",
                                  root + "/mean");
  EXPECT_NE(msg.find("model.head.pool: tessera export --hf: is mean; BertForSequenceClassification classifies the "
                     "pooled CLS row"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("model.head.normalize: tessera export --hf: is true; only a pooling BERT can L2-normalise"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("model.head.pooler: tessera export --hf: is false; BertForSequenceClassification classifies "
                     "through its pooler"),
            std::string::npos)
      << msg;
  fs::remove_all(root);
}

// ---------------------------------------------------------------------------------------------
// (2) transformers computes what Tessera computes with the exported folders.

// The five YAML models and the seeds of their noise: what check_hf_export.py loaded in transformers.
const std::pair<const char*, uint32_t> kParityModels[] = {
    {"bert", 2101}, {"gpt2", 2102}, {"vit", 2103}, {"esm", 2104}, {"ast", 2105}};

TEST(HfExport, TransformersGivesTheSameOutputsAsTessera) {
  // TESSERA_HF_EXPORT_DIR: also leave the exported folders there, for check_hf_export.py to load.
  const char* keep = std::getenv("TESSERA_HF_EXPORT_DIR");
  const std::string root = keep ? std::string(keep) : scratch("parity");
  std::ifstream in(kExportData + "reference.json");
  if (!in && keep) {
    for (const auto& [family, seed] : kParityModels) {
      const Experiment e = load_file(kExportData + family + ".yaml");
      fs::remove_all(root + "/" + family);
      ASSERT_TRUE(export_ok(e, trained(e.model, seed), root + "/" + family));
    }
    GTEST_SKIP() << "no reference yet: wrote the exports to " << root;
  }
  ASSERT_TRUE(in) << "tests/data/hf_export/reference.json (tools/reference/check_hf_export.py)";
  const nlohmann::json meta = nlohmann::json::parse(in);
  Result<safetensors::File> ref = safetensors::File::open(kExportData + "reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  for (const auto& [family, seed] : kParityModels) {
    SCOPED_TRACE(family);
    const nlohmann::json& fm = meta["families"][family];
    ASSERT_TRUE(fm.is_object());
    EXPECT_EQ(fm["noise_seed"].get<uint32_t>(), seed);
    const Experiment e = load_file(kExportData + family + ".yaml");
    const Parameters p = trained(e.model, seed);
    const std::string dir = root + "/" + family;
    if (keep) fs::remove_all(dir);
    ASSERT_TRUE(export_ok(e, p, dir));
    // The same bytes that transformers loaded.
    Result<std::string> bytes = read_file(dir + "/model.safetensors");
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(hex64(fnv1a(bytes->data(), bytes->size())), fm["model_safetensors_fnv1a64"].get<std::string>());
    size_t compared = 0;
    for (const char* name : {"hidden", "logits"}) {
      double worst_abs = 0, worst_rel = 0;
      for (size_t i = 0; i < fm["items"].get<size_t>(); ++i) {
        const std::string k = std::to_string(i);
        Result<Tensor> input = ref->get(std::string(family) + ".inputs." + k);
        ASSERT_TRUE(input.ok()) << input.status().message();
        const Outputs out = forward(e.model, p, batch_of(family, input->to(DType::f32), e.model));
        const Tensor& got = std::string(name) == "hidden" ? out.hidden : out.logits;
        Result<Tensor> want = ref->get(std::string(family) + "." + name + "." + k);
        ASSERT_TRUE(want.ok()) << want.status().message();
        ASSERT_EQ(got.numel(), want->numel()) << name;
        const double diff = max_abs_diff(got.reshape(want->shape()), *want), rel = diff / max_abs(*want);
        EXPECT_LE(rel, 1e-4) << name << " item " << i << ": " << diff << " of " << max_abs(*want);
        worst_abs = std::max(worst_abs, diff);
        worst_rel = std::max(worst_rel, rel);
        ++compared;
      }
      std::printf("%s %s: max abs %.3g, max rel %.3g (against transformers)\n", family, name, worst_abs, worst_rel);
    }
    EXPECT_GE(compared, 4u);
  }
  if (!keep) fs::remove_all(root);
}

// ---------------------------------------------------------------------------------------------
// The command, with a training run's weights.

TEST(HfExport, TheCommandExportsTheWeightsFileItIsGiven) {
  const std::string root = scratch("cli");
  const std::string yaml = kExportData + "gpt2.yaml";
  const Experiment e = load_file(yaml);
  const Parameters p = trained(e.model, 7);
  ASSERT_TRUE(p.save(root + "/best.safetensors").ok());
  const std::string cmd = kTessera + " export " + yaml + " --hf " + root + "/out --weights " + root +
                          "/best.safetensors > " + root + "/stdout 2> " + root + "/stderr";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream so(root + "/stdout");
  const std::string printed((std::istreambuf_iterator<char>(so)), std::istreambuf_iterator<char>());
  EXPECT_NE(printed.find("Hugging Face GPT2LMHeadModel (gpt2)"), std::string::npos) << printed;
  const Experiment back = from_hf(root + "/out");
  const Parameters q = params_of(back.model);
  ASSERT_EQ(q.size(), p.size());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(max_abs_diff(q[i].second, p[i].second), 0.0) << p[i].first;
  // Neither or both of OUT and --hf is refused.
  EXPECT_NE(std::system((kTessera + " export " + yaml + " 2> /dev/null").c_str()), 0);
  fs::remove_all(root);
}

// ---------------------------------------------------------------------------------------------
// Refusals: at the key, before anything is written.

void expect_nothing_beside(const std::string& root) {
  for (const auto& f : fs::directory_iterator(root)) ADD_FAILURE() << "left behind: " << f.path();
}

const char* kEncoder = "model:\n  d_model: 32\n  n_heads: 4\n  n_layers: 1\n";

TEST(HfExport, ModelsTheFamilyCannotRepresentAreRefusedAtTheirKeys) {
  const std::string root = scratch("refused");
  // Pre-LN in a BERT (a tokens encoder with token types).
  std::string msg = refusal(std::string(kEncoder) + "  norm: pre\n  stem: {kind: tokens, vocab_size: 50, token_types: 2, "
                                                    "norm: true}\n  positions: {kind: learned, max_len: 16}\n",
                            root + "/bert");
  EXPECT_NE(msg.find("t.yaml:5:3: model.norm: tessera export --hf: is pre; bert's blocks are post-LN (exported as "
                     "bert: an encoder with a tokens stem)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("model.final_norm: tessera export --hf: is true; BERT (post-LN) has no final layer norm"),
            std::string::npos)
      << msg;
  // Max pooling, which sentence-transformers' folders Tessera writes do not describe.
  msg = refusal(std::string(kEncoder) + "  stem: {kind: tokens, vocab_size: 50, token_types: 2, norm: true}\n"
                                        "  positions: {kind: learned, max_len: 16}\n  head: {kind: pool, pool: max}\n",
                root + "/bert_max");
  EXPECT_NE(msg.find("model.head.pool: tessera export --hf: is max; Tessera writes sentence-transformers' cls, mean "
                     "or last pooling"),
            std::string::npos)
      << msg;
  // Mean pooling where Hugging Face's ViT pools the CLS row.
  msg = refusal(std::string(kEncoder) + "  norm: pre\n  stem: {kind: features, n_features: 48, cls: true}\n"
                                        "  positions: {kind: learned, max_len: 5}\n  head: {kind: classifier, "
                                        "n_classes: 2, pool: mean}\n",
                root + "/vit");
  EXPECT_NE(msg.find("t.yaml:8:42: model.head.pool: tessera export --hf: is mean; Hugging Face's ViT pools the CLS row"),
            std::string::npos)
      << msg;
  // A positions kind the family lacks, and a grid that is not square.
  msg = refusal("model:\n  arch: decoder\n  d_model: 32\n  n_heads: 4\n  norm: pre\n  positions: {kind: sinusoidal}\n"
                "  stem: {kind: tokens, vocab_size: 50}\n  head: {kind: lm}\n",
                root + "/gpt2");
  EXPECT_NE(msg.find("t.yaml:6:15: model.positions.kind: tessera export --hf: is sinusoidal; gpt2's positions are "
                     "learned (a table) (exported as gpt2: a decoder)"),
            std::string::npos)
      << msg;
  msg = refusal(std::string(kEncoder) + "  norm: pre\n  stem: {kind: features, n_features: 48, cls: true}\n"
                                        "  positions: {kind: learned, max_len: 7}\n",
                root + "/vit_grid");
  EXPECT_NE(msg.find("model.positions.max_len: tessera export --hf: 7 is not 1 + g·g"), std::string::npos) << msg;
  // An AST without the audio settings that make its grid.
  msg = refusal(std::string(kEncoder) + "  norm: pre\n  stem: {kind: features, n_features: 256, cls: true, dist: true}\n"
                                        "  positions: {kind: learned, max_len: 62}\n",
                root + "/ast");
  EXPECT_NE(msg.find("plugins: tessera export --hf: an AST's positions are a frequency × time grid"), std::string::npos)
      << msg;
  expect_nothing_beside(root);
  fs::remove_all(root);
}

TEST(HfExport, ABiasTheClassLacksMustBeZeroAndAnExistingFolderIsKept) {
  const std::string root = scratch("bias");
  // GPT-2's untied lm_head has no bias: zeros export, anything else would be lost.
  const Experiment e = load_yaml(
      "model:\n  arch: decoder\n  d_model: 32\n  n_heads: 4\n  norm: pre\n  positions: {kind: learned, max_len: 16}\n"
      "  stem: {kind: tokens, vocab_size: 50}\n  head: {kind: lm, tied: false}\n");
  Parameters p = params_of(e.model);
  ASSERT_TRUE(export_ok(e, p, root + "/zeros"));
  p.find("head.lm_bias")->data<float>()[3] = 0.25f;
  Diagnostics d;
  EXPECT_FALSE(hf::export_folder(e, p, root + "/nonzero", &d, nullptr));
  EXPECT_NE(d.str().find("t.yaml:8:3: model.head: tessera export --hf: parameter head.lm_bias has values up to 0.25, "
                         "but GPT2LMHeadModel has no such tensor (GPT-2's lm_head has no bias)"),
            std::string::npos)
      << d.str();
  EXPECT_FALSE(fs::exists(root + "/nonzero"));
  // A folder that exists is not replaced.
  p.find("head.lm_bias")->data<float>()[3] = 0;
  Diagnostics d2;
  EXPECT_FALSE(hf::export_folder(e, p, root + "/zeros", &d2, nullptr));
  EXPECT_NE(d2.str().find("already exists and is not an empty folder"), std::string::npos) << d2.str();
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(root)) left.push_back(f.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"zeros"});
  fs::remove_all(root);
}

TEST(HfExport, AnExportThatFailsHalfWayLeavesNothing) {
  const std::string root = scratch("half");
  // The tokenizer file goes missing between load and export: config.json and model.safetensors
  // are written by then, in the scratch folder, which goes.
  fs::copy_file(kHf + "bert/model/vocab.txt", root + "/vocab.txt");
  const Experiment e = load_yaml(
      "plugins:\n  - name: text\n    options: {tokenizer: wordpiece, vocab: " + root + "/vocab.txt}\n"
      "model:\n  d_model: 32\n  n_heads: 4\n  norm: post\n  positions: {kind: learned, max_len: 16}\n"
      "  stem: {kind: tokens, vocab_size: 2056, token_types: 2, norm: true}\n");
  fs::remove(root + "/vocab.txt");
  Diagnostics d;
  EXPECT_FALSE(hf::export_folder(e, params_of(e.model), root + "/out", &d, nullptr));
  EXPECT_NE(d.str().find("vocab.txt"), std::string::npos) << d.str();
  expect_nothing_beside(root);
  fs::remove_all(root);
}

}  // namespace
}  // namespace tessera
