// Non-finite numbers (issue 14): weights with NaN or infinities refused at load, naming the file,
// the tensor and the first index; feature rows with NaN or inf refused by `tessera forward`;
// inputs of ±1e19 into a post-LN model give the reference's finite output or a clear error, never
// NaN with exit 0; the forward's watch names the first layer that made a NaN; generation never
// draws a token from non-finite logits.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include "process_util.h"
#include "test_models.h"
#include "test_util.h"
#include "tessera/config.h"
#include "tessera/generate.h"
#include "tessera/model.h"
#include "tessera/npy.h"
#include "tessera/safetensors.h"
#include "tessera/train.h"

using namespace tessera;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "tessera_nonfinite." + std::to_string(getpid()) + "." + name;
}

// The seeded parameters of tiny_decoder (learned positions), resolved once.
ModelConfig decoder() { return testing_util::tiny_decoder(PositionKind::learned, 16); }
Parameters seeded(const ModelConfig& c) {
  Result<Parameters> p = Parameters::resolve(c);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p->clone();  // owned: the tests write into them
}

// Writes every parameter of c to a safetensors file (as `dtype`), with `value` at flat index
// `index` of `bad`, and returns the config that loads them from it.
ModelConfig with_file(const std::string& file, const std::string& bad, int64_t index, float value,
                      DType dtype = DType::f32) {
  ModelConfig c = decoder();
  Parameters p = seeded(c);
  p.find(bad)->data<float>()[index] = value;
  std::vector<std::pair<std::string, Tensor>> entries;
  for (const auto& [name, t] : p) entries.emplace_back(name, t.to(dtype));
  EXPECT_TRUE(testing_util::IsOk(safetensors::write(file, entries)));
  c.weights.file = file;
  c.weights.allow_missing = false;
  return c;
}

using Ran = tessera::testing_util::CliRun;

// The built `tessera` binary, as a user runs it (a crash shows as code -1, not as this test's death).
Ran run_cli(const std::string& args) { return tessera::testing_util::run_tessera_cli(args); }

std::string rows_file(const std::string& name, const std::vector<float>& v, Shape shape = {3, 3}) {
  const std::string path = temp_path(name + ".npy");
  EXPECT_TRUE(testing_util::IsOk(npy::save(path, Tensor::from_vector(shape, v))));
  return path;
}

bool all_finite(const Tensor& t) {
  for (float v : t.to_vector())
    if (!std::isfinite(v)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Weights

TEST(NonFiniteWeights, NaNInAnF32FileIsRefusedNamingTensorAndIndex) {
  const std::string file = temp_path("nan_f32.safetensors");
  // blocks.1.ffn.w1 is (32, 64): flat index 70 is [1, 6].
  Result<Model> m = Model::build(with_file(file, "blocks.1.ffn.w1", 70, kNaN));
  ASSERT_FALSE(m.ok()) << "a NaN weight was loaded";
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("\"blocks.1.ffn.w1\""), std::string::npos) << msg;
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("NaN at flat index 70 = [1, 6]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32 (32, 64)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("download or export it again"), std::string::npos) << msg;
  std::remove(file.c_str());
}

TEST(NonFiniteWeights, InfInAnF32FileIsRefusedAndEveryBadTensorNamed) {
  const std::string file = temp_path("inf_f32.safetensors");
  ModelConfig c = decoder();
  Parameters p = seeded(c);
  p.find("pos.table")->data<float>()[5] = kInf;
  p.find("blocks.0.ln2.gamma")->data<float>()[31] = -kInf;
  p.find("blocks.0.ln2.gamma")->data<float>()[2] = 7.f;
  EXPECT_TRUE(testing_util::IsOk(p.save(file)));
  c.weights.file = file;
  Result<Model> m = Model::build(c);
  ASSERT_FALSE(m.ok()) << "infinite weights were loaded";
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("2 tensor(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"pos.table\" in " + file + " (f32 (16, 32)) holds inf at flat index 5 = [0, 5]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("\"blocks.0.ln2.gamma\" in " + file + " (f32 (32)) holds -inf at flat index 31 = [31]"),
            std::string::npos)
      << msg;
  std::remove(file.c_str());
}

TEST(NonFiniteWeights, NaNInABf16FileIsRefused) {
  const std::string file = temp_path("nan_bf16.safetensors");
  // stem.embed is (61, 32): flat index 100 is [3, 4].
  Result<Model> m = Model::build(with_file(file, "stem.embed", 100, kNaN, DType::bf16));
  ASSERT_FALSE(m.ok()) << "a NaN bf16 weight was loaded";
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("\"stem.embed\" in " + file + " (bf16 (61, 32)) holds NaN at flat index 100 = [3, 4]"),
            std::string::npos)
      << msg;
  std::remove(file.c_str());
}

TEST(NonFiniteWeights, InfInAnF16FileIsRefusedAndFiniteExtremesLoad) {
  const std::string file = temp_path("inf_f16.safetensors");
  Result<Model> m = Model::build(with_file(file, "blocks.0.attn.w_o", 33, kInf, DType::f16));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("\"blocks.0.attn.w_o\" in " + file + " (f16 (32, 32)) holds inf at flat "
                                      "index 33 = [1, 1]"),
            std::string::npos)
      << m.status().message();
  // The largest finite values are not mistaken for infinities.
  const std::string ok_file = temp_path("max_f32.safetensors");
  EXPECT_TRUE(Model::build(with_file(ok_file, "blocks.0.attn.w_o", 33, std::numeric_limits<float>::max())).ok());
  std::remove(file.c_str());
  std::remove(ok_file.c_str());
}

// A Hugging Face folder's tensors are mapped to the model's names (and transposed where torch
// keeps (out, in)): the error names both, and the file.
TEST(NonFiniteWeights, NaNInAHuggingFaceFolderIsRefused) {
  const std::string dir = temp_path("hf_bert");
  std::filesystem::remove_all(dir);
  std::filesystem::copy(std::string(TESSERA_TEST_DATA) + "/hf/bert/model", dir, std::filesystem::copy_options::recursive);
  const std::string file = dir + "/model.safetensors";
  std::vector<std::pair<std::string, Tensor>> entries;
  std::map<std::string, std::string> metadata;
  {
    Result<safetensors::File> f = safetensors::File::open(file);
    ASSERT_TRUE(f.ok()) << f.status().message();
    metadata = f->metadata();
    for (const auto& info : f->tensors()) entries.emplace_back(info.name, f->get(info.name)->clone());
  }
  for (auto& [name, t] : entries)
    if (name == "encoder.layer.1.intermediate.dense.weight") t.data<float>()[3] = kNaN;  // torch (out, in): [0, 3]
  ASSERT_TRUE(testing_util::IsOk(safetensors::write(file, entries, metadata)));
  Diagnostics d;
  std::optional<Experiment> e = load_experiment_from_string("model: {from: hf, path: " + dir + "}\n", "t.yaml",
                                                            ::testing::TempDir(), LoadOptions{}, &d);
  ASSERT_TRUE(e.has_value()) << d.str();
  Result<Model> m = Model::build(e->model);
  ASSERT_FALSE(m.ok()) << "a NaN in a Hugging Face folder was loaded";
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("\"blocks.1.ffn.w1\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("encoder.layer.1.intermediate.dense.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("holds NaN at flat index"), std::string::npos) << msg;
  EXPECT_NE(msg.find("= [3, 0]"), std::string::npos) << msg;  // (in, out) in the model's layout
  std::filesystem::remove_all(dir);
}

// `tessera eval --weights` and `tessera export --weights` read a weights file themselves
// (load_weights): a NaN there gave NaN metrics; now it is refused like a model's own file.
TEST(NonFiniteWeights, LoadWeightsRefusesNaN) {
  const std::string file = temp_path("eval_weights.safetensors");
  const ModelConfig c = with_file(file, "blocks.0.attn.w_q", 9, kNaN);
  Result<Parameters> p = load_weights(file, decoder());
  ASSERT_FALSE(p.ok()) << "load_weights accepted a NaN weight";
  EXPECT_NE(p.status().message().find("\"blocks.0.attn.w_q\" in " + file + " (f32 (32, 32)) holds NaN at flat index 9 = [0, 9]"),
            std::string::npos)
      << p.status().message();
  std::remove(c.weights.file.c_str());
}

TEST(NonFiniteWeights, ScanFindsTheFirstAndCountsAll) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    std::vector<float> v(1000, 1.f);
    EXPECT_FALSE(find_nonfinite(Tensor::from_vector({10, 100}, v).to(dt)).found()) << dtype_name(dt);
    v[517] = -kInf;
    v[900] = kNaN;
    const NonFiniteScan s = find_nonfinite(Tensor::from_vector({10, 100}, v).to(dt));
    EXPECT_EQ(s.index, 517) << dtype_name(dt);
    EXPECT_EQ(s.count, 2) << dtype_name(dt);
    EXPECT_EQ(nonfinite_name(s.value), "-inf") << dtype_name(dt);
  }
  EXPECT_EQ(index_str({10, 100}, 517), "[5, 17]");
  // A non-contiguous view is scanned in its own order.
  std::vector<float> v(6, 0.f);
  v[1] = kNaN;  // (2, 3) [0, 1]; in the transpose (3, 2) it is [1, 0], flat 2
  EXPECT_EQ(find_nonfinite(Tensor::from_vector({2, 3}, v).transpose(0, 1)).index, 2);
}

// ---------------------------------------------------------------------------------------------
// tessera forward

TEST(NonFiniteForward, RowsWithNaNOrInfAreRefusedNamingRowAndColumn) {
  const std::string nan_rows = rows_file("nan_rows", {1, 0, 0, 0, kNaN, 0, 0, 0, 1});
  Ran r = run_cli("forward configs/examples/transformer_layer.yaml --out " + temp_path("out_nan") + " --rows " +
                  nan_rows);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--rows " + nan_rows + ": NaN at row 1, column 1"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(temp_path("out_nan")));

  const std::string inf_rows = rows_file("inf_rows", {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, -kInf},
                                         {2, 3, 3});
  r = run_cli("forward configs/examples/transformer_layer.yaml --out " + temp_path("out_inf") + " --rows " +
              inf_rows);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("-inf at item 1, row 2, column 2"), std::string::npos) << r.err;
  std::remove(nan_rows.c_str());
  std::remove(inf_rows.c_str());
}

// transformer_layer.yaml is post-LN (the 2017 layer). Rows of ±1e19 overflow oneDNN's f32
// variance (Σ(x - mean)² > FLT_MAX): the fast path gave beta (zeros), finite and wrong, with exit 0.
// Now it matches the reference loops (double statistics) and is finite.
TEST(NonFiniteForward, HugeInputsIntoPostLNMatchTheReference) {
  const std::string big = rows_file("big", {1e19f, -1e19f, 0, 0, 1e19f, 0, 1e19f, 0, -1e19f});
  const std::string fast_dir = temp_path("out_fast"), ref_dir = temp_path("out_ref");
  Ran fast = run_cli("forward configs/examples/transformer_layer.yaml --rows " + big + " --out " + fast_dir);
  Ran ref = run_cli("forward configs/examples/transformer_layer.yaml --reference --rows " + big + " --out " + ref_dir);
  ASSERT_EQ(fast.code, 0) << fast.err;
  ASSERT_EQ(ref.code, 0) << ref.err;
  Result<Tensor> f = npy::load(fast_dir + "/hidden.npy"), w = npy::load(ref_dir + "/hidden.npy");
  ASSERT_TRUE(f.ok() && w.ok());
  EXPECT_TRUE(all_finite(*f));
  EXPECT_LT(testing_util::max_rel_error(*f, *w), 1e-5) << "fast path differs from the reference on ±1e19 rows";
  // A normalised row has mean 0 and variance 1 (gamma 1, beta 0 here): not the zeros of an
  // overflowed variance.
  for (int64_t t = 0; t < 3; ++t) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < 3; ++c) m += f->at({0, t, c}) / 3.0;
    for (int64_t c = 0; c < 3; ++c) v += (f->at({0, t, c}) - m) * (f->at({0, t, c}) - m) / 3.0;
    EXPECT_NEAR(v, 1.0, 1e-3) << "row " << t;
  }
  std::filesystem::remove_all(fast_dir);
  std::filesystem::remove_all(ref_dir);
  std::remove(big.c_str());
}

// Larger still, the attention scores overflow (q·k > FLT_MAX): the result is NaN on both paths,
// and `tessera forward` says which layer made it and writes nothing, exit 1 (it printed NaN, exit 0).
TEST(NonFiniteForward, OverflowingInputsFailNamingTheFirstLayer) {
  const std::string big = rows_file("big30", {1e30f, -1e30f, 0, 0, 1e30f, 0, 1e30f, 0, -1e30f});
  for (const char* path : {"", " --reference"}) {
    const std::string dir = temp_path("out_30");
    Ran r = run_cli("forward configs/examples/transformer_layer.yaml" + std::string(path) + " --rows " + big +
                    " --out " + dir);
    EXPECT_EQ(r.code, 1) << path << r.out << r.err;
    EXPECT_NE(r.err.find("item 0: NaN first appears in blocks.0.attn."), std::string::npos) << path << r.err;
    EXPECT_EQ(r.out.find("nan"), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(dir + "/hidden.npy")) << path;
    std::filesystem::remove_all(dir);
  }
  std::remove(big.c_str());
}

// ---------------------------------------------------------------------------------------------
// The first layer that made a NaN

// One weight made infinite after load, at a known layer: the watch names that layer, for the batch
// rows it reaches and no others.
TEST(NonFiniteLayer, NamesTheLayerOfAnInfiniteWeight) {
  const ModelConfig c = decoder();
  const Batch batch = Batch::from_ids({3, 1, 4, 1, 5});
  struct Case {
    const char* param;
    int64_t index;
    const char* layer;
  };
  const Case cases[] = {
      {"blocks.1.ffn.w2", 40, "blocks.1.ffn.out"},
      {"blocks.0.attn.w_v", 3, "blocks.0.attn.v"},
      {"blocks.1.ln2.gamma", 0, "blocks.1.ln2"},
      {"final_norm.beta", 7, "final_norm.out"},
      {"blocks.0.ffn.w1", 65, "blocks.0.ffn.hidden"},
  };
  for (const Case& k : cases) {
    for (bool reference : {false, true}) {
      Parameters p = seeded(c);
      p.find(k.param)->data<float>()[k.index] = kInf;
      Result<Model> m = Model::build(c, p);  // parameters resolved elsewhere: not scanned
      ASSERT_TRUE(m.ok()) << m.status().message();
      ForwardOptions o;
      o.reference = reference;
      Result<std::vector<NonFinite>> found = first_nonfinite_layers(*m, batch, o);
      ASSERT_TRUE(found.ok()) << found.status().message();
      ASSERT_EQ(found->size(), 1u);
      EXPECT_EQ((*found)[0].layer, k.layer) << k.param << (reference ? " (reference)" : "");
      const Status st = nonfinite_status(*found, "item");
      EXPECT_NE(st.message().find("item 0: "), std::string::npos) << st.message();
      EXPECT_NE(st.message().find(k.layer), std::string::npos) << st.message();
    }
  }
}

TEST(NonFiniteLayer, OnlyTheBatchRowsReachedAreFlagged) {
  const ModelConfig c = decoder();
  Parameters p = seeded(c);
  float* embed = p.find("stem.embed")->data<float>();
  embed[9 * 32 + 4] = kNaN;  // token 9 only
  Result<Model> m = Model::build(c, p);
  ASSERT_TRUE(m.ok());
  Batch batch;
  batch.ids = Tensor::from_ids({3, 4}, {1, 2, 3, 4, 5, 6, 9, 8, 2, 2, 2, 2});
  batch.lengths = {4, 4, 2};
  ForwardOptions o;
  o.find_nonfinite = true;
  Outputs out;
  ASSERT_TRUE(testing_util::IsOk(m->forward(batch, o, &out)));
  ASSERT_EQ(out.nonfinite.size(), 3u);
  // Batch row 1 holds token 9: NaN from the stem on. The others' hidden rows stay finite, but the
  // tied LM head reads the whole table (logits = h · embedᵀ): their logit for token 9 is NaN.
  EXPECT_EQ(out.nonfinite[0].layer, "head.logits");
  EXPECT_EQ(out.nonfinite[1].layer, "stem.out");
  EXPECT_EQ(out.nonfinite[1].index, "[2, 4]");  // row 2 (token 9), column 4
  EXPECT_EQ(out.nonfinite[2].layer, "head.logits");
  EXPECT_EQ(out.nonfinite[2].index.substr(out.nonfinite[2].index.size() - 4), ", 9]");
  EXPECT_TRUE(all_finite(out.hidden.select(0, 0)));
  EXPECT_FALSE(all_finite(out.hidden.select(0, 1)));
  // Without the option nothing is watched or reported.
  ForwardOptions plain;
  ASSERT_TRUE(testing_util::IsOk(m->forward(batch, plain, &out)));
  EXPECT_TRUE(out.nonfinite.empty());
}

// ---------------------------------------------------------------------------------------------
// Generation

// pos.table row 3 infinite: the prompt (3 tokens, positions 0-2) is fine, the first token fed back
// (position 3) is not. Generation drew tokens from NaN logits; now it stops at step 1 naming the stem.
TEST(NonFiniteGenerate, NaNLogitsStopGenerationNamingStepAndLayer) {
  const ModelConfig c = decoder();
  for (bool reference : {false, true}) {
    Parameters p = seeded(c);
    p.find("pos.table")->data<float>()[3 * 32 + 1] = kInf;
    Result<Model> m = Model::build(c, p);
    ASSERT_TRUE(m.ok());
    GenerateOptions o;
    o.max_new_tokens = 5;
    o.reference = reference;
    Result<std::vector<Generation>> g = generate(*m, {{1, 2, 3}, {4, 5}}, o);
    ASSERT_FALSE(g.ok()) << "tokens were drawn from non-finite logits";
    const std::string& msg = g.status().message();
    EXPECT_NE(msg.find("prompt 0, step 1 (after 1 new token(s))"), std::string::npos) << msg;
    EXPECT_NE(msg.find("first appears in stem.out"), std::string::npos) << msg;
  }
  // The same model generates when the prompt and its continuation stay below position 3.
  Parameters p = seeded(c);
  p.find("pos.table")->data<float>()[3 * 32 + 1] = kInf;
  Result<Model> m = Model::build(c, p);
  GenerateOptions o;
  o.max_new_tokens = 1;
  Result<std::vector<Generation>> g = generate(*m, {{1, 2, 3}}, o);
  EXPECT_TRUE(g.ok()) << g.status().message();
}

}  // namespace
