// `tessera drift` as a user runs it (the built binary): f32 against bf16 on the same inputs, per
// layer and at the outputs, checked against the tolerances of docs/PRECISION.md. No timing.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "process_util.h"
#include "tessera/npy.h"
#include "tessera/random.h"

namespace {

const std::string kSrc = std::string(TESSERA_SOURCE_DIR) + "/";
constexpr int kExitDriftTooLarge = 3;

using Ran = tessera::testing_util::CliRun;

Ran run_cli(const std::string& args) { return tessera::testing_util::run_tessera_cli(args); }

// Runs of spaces count as one, so that table column widths do not matter.
std::string squash(const std::string& s) {
  std::string out;
  for (char c : s)
    if (!(c == ' ' && !out.empty() && out.back() == ' ')) out += c;
  return out;
}
bool has(const std::string& text, const std::string& what) {
  return squash(text).find(squash(what)) != std::string::npos;
}

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "tessera_drift_" + std::to_string(getpid()) + "_" + name;
}

// An experiment that is only a Hugging Face fixture folder (tests/data/hf/FAMILY/model).
std::string hf_yaml(const std::string& family) {
  const std::string path = temp(family + ".yaml");
  std::ofstream(path) << "model:\n  from: hf\n  path: " << kSrc << "tests/data/hf/" << family << "/model\n";
  return path;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  nlohmann::json j;
  if (!f) {
    ADD_FAILURE() << "no JSON written at " << path;
    return j;
  }
  f >> j;
  return j;
}

const nlohmann::json* tensor(const nlohmann::json& j, const std::string& name) {
  for (const auto& t : j["tensors"])
    if (t["name"] == name) return &t;
  return nullptr;
}

}  // namespace

// The model against itself, f32 on both sides: every figure is exactly zero drift.
TEST(Drift, F32AgainstItselfIsExactlyZero) {
  for (const std::string& file : {hf_yaml("bert"), kSrc + "configs/examples/generate_tiny.yaml"}) {
    const std::string json = temp("self.json");
    const Ran r = run_cli("drift " + file + " --candidate f32 --batch 2 --seq-len 12 --json " + json);
    ASSERT_EQ(r.code, 0) << file << "\n" << r.out << r.err;
    EXPECT_TRUE(has(r.out, "compare f32 (baseline) with f32")) << r.out;
    EXPECT_TRUE(has(r.out, "PASS: every output within tolerance")) << r.out;
    const nlohmann::json j = read_json(json);
    EXPECT_EQ(j["candidate"], "f32");
    EXPECT_TRUE(j["pass"].get<bool>());
    ASSERT_GE(j["tensors"].size(), 4u);  // stem.out, the blocks, the outputs
    for (const auto& t : j["tensors"]) {
      EXPECT_EQ(t["max_abs_diff"].get<double>(), 0.0) << file << " " << t["name"];
      EXPECT_EQ(t["rel_l2"].get<double>(), 0.0) << file << " " << t["name"];
      EXPECT_EQ(t["min_cosine"].get<double>(), 1.0) << file << " " << t["name"];
      if (t.contains("top1_agreement")) {
        EXPECT_EQ(t["top1_agreement"].get<double>(), 1.0) << file;
      }
    }
  }
}

// bf16 against f32 on the HF fixtures: non-zero drift in every block, within tolerance at the outputs.
TEST(Drift, HfFixturesDriftButStayWithinTolerance) {
  struct Case {
    std::string family, args;
    std::vector<std::string> outputs;
  };
  const Case cases[] = {{"bert", "--batch 4 --seq-len 16", {"hidden", "pooled"}},
                        {"gpt2", "--batch 2 --seq-len 16", {"hidden", "logits"}},
                        {"vit", "--batch 2 --seq-len 16", {"hidden", "pooled"}}};
  for (const Case& c : cases) {
    const std::string json = temp(c.family + ".json");
    const Ran r = run_cli("drift " + hf_yaml(c.family) + " " + c.args + " --json " + json);
    ASSERT_EQ(r.code, 0) << c.family << "\n" << r.out << r.err;
    EXPECT_TRUE(has(r.out, "compare f32 (baseline) with bf16")) << r.out;
    EXPECT_TRUE(has(r.out, "PASS: every output within tolerance")) << r.out;
    const nlohmann::json j = read_json(json);
    EXPECT_TRUE(j["pass"].get<bool>());
    const double tol = j["tolerances"]["rel_l2"].get<double>();
    EXPECT_GT(tol, 0.0);
    for (const auto& t : j["tensors"]) {
      if (t["name"] == "stem.out") continue;  // a token stem is a table lookup: no matmul, no drift
      EXPECT_GT(t["rel_l2"].get<double>(), 0.0) << c.family << " " << t["name"];
      EXPECT_GT(t["max_abs_diff"].get<double>(), 0.0) << c.family << " " << t["name"];
      EXPECT_LT(t["min_cosine"].get<double>(), 1.0) << c.family << " " << t["name"];
    }
    for (const std::string& name : c.outputs) {
      const nlohmann::json* t = tensor(j, name);
      ASSERT_NE(t, nullptr) << c.family << " " << name;
      EXPECT_EQ((*t)["kind"], "output");
      EXPECT_TRUE((*t)["pass"].get<bool>()) << c.family << " " << name;
      EXPECT_LE((*t)["rel_l2"].get<double>(), tol);
      EXPECT_GE((*t)["min_cosine"].get<double>(), j["tolerances"]["min_cosine"].get<double>());
      EXPECT_TRUE(has(r.out, name + " ")) << r.out;
    }
    EXPECT_NE(tensor(j, "blocks.0.out"), nullptr);
    if (c.family == "gpt2") {
      const nlohmann::json& l = *tensor(j, "logits");
      EXPECT_GE(l["top1_agreement"].get<double>(), j["tolerances"]["top1"].get<double>());
      // Near ties only ever excuse rows: the checked share is at least the plain one.
      EXPECT_GE(l["top1_with_near_ties"].get<double>(), l["top1_agreement"].get<double>());
      EXPECT_GE(l["top1_near_ties"].get<int>(), 0);
      EXPECT_TRUE(has(r.out, "top-1 >=")) << r.out;
    }
  }
  // A features stem (ViT's patch projection) is a matmul: it drifts from the first tensor on.
  const nlohmann::json vit = read_json(temp("vit.json"));
  ASSERT_NE(tensor(vit, "stem.out"), nullptr);
  EXPECT_GT((*tensor(vit, "stem.out"))["rel_l2"].get<double>(), 0.0);
}

// The check can fail: a candidate with other weights (another init seed) is far beyond tolerance,
// with FAIL lines naming what failed and exit code 3, in f32 as in bf16.
TEST(Drift, AnotherModelFailsWithExitCode3) {
  for (const std::string candidate : {"bf16", "f32"}) {
    const std::string json = temp("broken.json");
    const Ran r = run_cli("drift configs/examples/generate_tiny.yaml --batch 2 --seq-len 16 --candidate " + candidate +
                          " --candidate-set model.init.seed=1 --json " + json);
    EXPECT_EQ(r.code, kExitDriftTooLarge) << r.out << r.err;
    EXPECT_TRUE(has(r.out, "--candidate-set model.init.seed=1")) << r.out;
    EXPECT_TRUE(has(r.out, "FAIL: logits: rel L2")) << r.out;
    EXPECT_TRUE(has(r.out, "FAIL: hidden: min cos")) << r.out;
    EXPECT_FALSE(has(r.out, "PASS: every output")) << r.out;
    const nlohmann::json j = read_json(json);
    EXPECT_FALSE(j["pass"].get<bool>());
    EXPECT_FALSE((*tensor(j, "logits"))["pass"].get<bool>());
    EXPECT_GT((*tensor(j, "logits"))["rel_l2"].get<double>(), 0.5);
  }
  // The same seed through --candidate-set is the same model again.
  const Ran same = run_cli("drift configs/examples/generate_tiny.yaml --batch 1 --seq-len 8 --candidate-set "
                           "model.init.seed=2026");
  EXPECT_EQ(same.code, 0) << same.out << same.err;
}

// Given inputs instead of random ones: ids as `tessera forward` takes them.
TEST(Drift, TakesGivenIds) {
  const Ran r = run_cli("drift " + hf_yaml("bert") + " --ids 1,5,17,2");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "input batch 1 x 4 rows (--ids)")) << r.out;
  EXPECT_TRUE(has(r.out, "blocks.2.out (1, 4, 32)")) << r.out;
}

// ... and feature rows from a .npy file, (B, T, F).
TEST(Drift, TakesGivenRows) {
  const std::string rows = temp("rows.npy");
  tessera::Tensor t = tessera::Tensor::empty({2, 16, 192});  // the ViT fixture: 8 x 8 patches of 3 channels
  tessera::Rng rng(5);
  tessera::fill_normal(t, rng, 0.0, 1.0);
  ASSERT_TRUE(tessera::npy::save(rows, t).ok());
  const Ran r = run_cli("drift " + hf_yaml("vit") + " --rows " + rows);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "input batch 2 x 16 rows (" + rows + ")")) << r.out;
  EXPECT_TRUE(has(r.out, "stem.out (2, 17, 32)")) << r.out;  // the CLS row on top
  const std::string narrow = temp("narrow.npy");
  ASSERT_TRUE(tessera::npy::save(narrow, tessera::Tensor::zeros({2, 16, 191})).ok());
  const Ran bad = run_cli("drift " + hf_yaml("vit") + " --rows " + narrow);
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(has(bad.err, "rows are 191 wide but the model reads 192")) << bad.err;
}

TEST(Drift, BadInputNamesTheProblem) {
  const Ran missing = run_cli("drift " + temp("no_such_file.yaml"));
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(has(missing.err, "no_such_file.yaml")) << missing.err;

  const Ran key = run_cli("drift configs/examples/generate_tiny.yaml --set model.n_layer=3");
  EXPECT_EQ(key.code, 2);
  EXPECT_TRUE(has(key.err, "model.n_layer: unknown key")) << key.err;
  const Ran cand_key = run_cli("drift configs/examples/generate_tiny.yaml --candidate-set model.init.sede=1");
  EXPECT_EQ(cand_key.code, 2);
  EXPECT_TRUE(has(cand_key.err, "model.init.sede: unknown key")) << cand_key.err;
  EXPECT_TRUE(has(cand_key.err, "are the --candidate-set values")) << cand_key.err;

  // No model in the file: nothing to compare.
  const std::string empty = temp("no_model.yaml");
  std::ofstream(empty) << "bench:\n  batch: 2\n";
  const Ran none = run_cli("drift " + empty);
  EXPECT_EQ(none.code, 2);
  EXPECT_TRUE(has(none.err, empty + ":1:1: model: required key is missing")) << none.err;

  // ids outside the vocabulary (the fixture's is 2056 tokens), and ids for a model that reads
  // feature rows.
  const Ran vocab = run_cli("drift " + hf_yaml("bert") + " --ids 1,5000");
  EXPECT_EQ(vocab.code, 2);
  EXPECT_TRUE(has(vocab.err, "token id 5000 at position 1 is outside the vocabulary [0, 2056)")) << vocab.err;
  const Ran ids = run_cli("drift " + hf_yaml("vit") + " --ids 1,2,3");
  EXPECT_EQ(ids.code, 2);
  EXPECT_FALSE(ids.err.empty());

  const Ran dtype = run_cli("drift configs/examples/generate_tiny.yaml --candidate f16");
  EXPECT_EQ(dtype.code, 2);
  EXPECT_TRUE(has(dtype.err, "--candidate")) << dtype.err;
}
