// The `tessera` command as a user runs it: the seeds' numbers in `explain`, the plan in `check`,
// .npy outputs of `forward`, error messages and exit codes. Runs the built binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tessera/config.h"
#include "process_util.h"
#include "tessera/npy.h"
#include "tessera/safetensors.h"
#include "tessera/train.h"

namespace {

const std::string kSrc = std::string(TESSERA_SOURCE_DIR) + "/";

using Ran = tessera::testing_util::CliRun;

// `before` is shell text run first in the same shell (`ulimit -v 300000 && `).
Ran run_cli(const std::string& args, const std::string& before = "") {
  return tessera::testing_util::run_tessera_cli(args, before);
}

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

}  // namespace

TEST(Cli, ExplainRedBallRollsShowsTheLectureTables) {
  const Ran r = run_cli("explain configs/examples/red_ball_rolls.yaml --fractions");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "layer 0, head 0 of 1  (n = 3, d_model = 3, d_k = 1, d_v = 2; causal; scale = 1)")) << r.out;
  // Q, K, V of rolls; weights rows; the output; the step-by-step row.
  EXPECT_TRUE(has(r.out, "rolls  1        0        (1, 1)")) << r.out;
  EXPECT_TRUE(has(r.out, "ball   1/2      1/2      0")) << r.out;
  EXPECT_TRUE(has(r.out, "rolls  1/4      1/2      1/4")) << r.out;
  EXPECT_TRUE(has(r.out, "rolls  allowed  allowed  allowed")) << r.out;
  EXPECT_TRUE(has(r.out, "red    allowed  future   future")) << r.out;
  EXPECT_TRUE(has(r.out, "permitted exp(scores): (1, 2, 1); total 4")) << r.out;
  EXPECT_TRUE(has(r.out, "output for rolls: (1/2, 5/4)")) << r.out;
  EXPECT_TRUE(has(r.out, "argmax alternative: keep only the highest-scoring value (ball): (0, 2)")) << r.out;
  const Ran d = run_cli("explain configs/examples/red_ball_rolls.yaml");
  EXPECT_TRUE(has(d.out, "output for rolls: (0.5, 1.25)")) << d.out;
  EXPECT_TRUE(has(d.out, "0.693")) << d.out;  // ln 2 in K
}

TEST(Cli, ExplainScalingTwoHeadsAndCraneLake) {
  Ran r = run_cli("explain configs/examples/scaling.yaml --row 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "key1   0.731  0.269")) << r.out;
  r = run_cli("explain configs/examples/scaling.yaml --row 0 --set model.attention.scale=1");
  EXPECT_TRUE(has(r.out, "key1   0.881  0.119")) << r.out;
  r = run_cli("explain configs/examples/two_heads.yaml --head 1 --fractions");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "rolls  1/2      1/4      1/4")) << r.out;
  EXPECT_TRUE(has(r.out, "concat: (1/2, 5/4, 3/4, 3/4)")) << r.out;
  EXPECT_TRUE(has(r.out, "x + concat W_O + b_O (residual): (1/2, 5/4, 5/2)")) << r.out;
  r = run_cli("explain configs/examples/crane_lake.yaml --row 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "crane  0.298  0.203  0.206  0.293")) << r.out;
  EXPECT_TRUE(has(r.out, "output for crane: (0.464, 0.476, 0.286)")) << r.out;
}

TEST(Cli, CheckPrintsResolvedConfigAndPlan) {
  // One layer of the twelve: what is checked here (resolved defaults, rows, scores per head) does
  // not depend on the depth, and building 86 M random weights cost most of the test (under ASan).
  const Ran r = run_cli("check configs/bench/vit_b16.yaml --set model.n_layers=1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "d_k: 64")) << r.out;  // a default resolved from d_model / n_heads
  EXPECT_TRUE(has(r.out, "rows per item")) << r.out;
  EXPECT_TRUE(has(r.out, "197  (196 input rows + CLS)")) << r.out;
  EXPECT_TRUE(has(r.out, "parameters")) << r.out;
  EXPECT_TRUE(has(r.out, "attention scores per head    38,809  (n^2, n = 197)")) << r.out;
  EXPECT_TRUE(has(r.err, "is valid")) << r.err;
  const Ran n = run_cli("check configs/examples/exercise_n5.yaml");
  EXPECT_TRUE(has(n.out, "attention scores per head    25  (n^2, n = 5)")) << n.out;
}

TEST(Cli, CheckEncodesAPluginExperimentsFirstItems) {
  const Ran r = run_cli("check configs/experiments/quickstart.yaml");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "features, 768 wide columns 0..767, modality 0")) << r.out;
  EXPECT_TRUE(has(r.out, "features, 256 wide columns 768..1023, modality 1")) << r.out;
  EXPECT_TRUE(has(r.out, "ids, vocabulary 30522 ids 0..30521, modality 2")) << r.out;
  EXPECT_TRUE(has(r.out, "ids, vocabulary 33 ids 30522..30554, modality 3")) << r.out;
  EXPECT_TRUE(has(r.out, "quickstart/items.csv: 10 items; the first 10 encoded")) << r.out;
  // photo/cat 197 rows; captioned/cat 197 + 11; Genesis 1:17 in word pieces 21.
  EXPECT_TRUE(has(r.out, "rows per sequence min 21, median 120, max 208")) << r.out;
  EXPECT_TRUE(has(r.out, "bad items 0")) << r.out;
  EXPECT_FALSE(has(r.out, "note:")) << r.out;  // all four plugins read both ways, as the encoder does
  const Ran causal = run_cli("check configs/experiments/quickstart.yaml --set model.causal=true");
  EXPECT_TRUE(has(causal.out, "note: plugin image's rows are meant to be read both ways, but the model attends left to "
                              "right (model.causal true)")) << causal.out;
  EXPECT_TRUE(has(r.out, "# plan for 208 input rows per item (the longest of the first items), batch 4")) << r.out;
  const Ran few = run_cli("check configs/experiments/quickstart.yaml --sample 3");
  EXPECT_TRUE(has(few.out, "10 items; the first 3 encoded")) << few.out;
  EXPECT_TRUE(has(few.out, "min 120, median 197, max 197")) << few.out;  // two photos, one clip

  // Too short for the longest item: refused before anything runs, with what to change.
  const Ran len = run_cli("check configs/experiments/quickstart.yaml --set model.positions.max_len=200");
  EXPECT_EQ(len.code, 2);
  EXPECT_TRUE(has(len.err, "a sequence of the first items has 208 rows, more than model.positions.max_len (200): its "
                           "batch would fail. Raise max_len, or give the plugin a maximum length")) << len.err;
  // Plugins that do not fit the model: the layout in the message, exit code 2.
  const Ran fit = run_cli("check configs/experiments/quickstart.yaml --set model.stem.vocab_size=30522");
  EXPECT_EQ(fit.code, 2);
  EXPECT_TRUE(has(fit.err,
                  "--set model.stem.vocab_size=30522, column 12: model.stem.vocab_size: the token plugins' "
                  "ids take 30555 embedding rows (text 0..30521, protein 30522..30554), more than vocab_size "
                  "30522"))
      << fit.err;
  EXPECT_TRUE(has(fit.err, "1 problem(s) between the plugins and the model")) << fit.err;
}

TEST(Cli, CheckPrintsTheNSquaredTable) {
  // The deck's table: n tokens, n^2 scores per head; doubling n multiplies the count by four.
  const std::pair<const char*, const char*> table[] = {
      {"4", "16"}, {"8", "64"}, {"128", "16,384"}, {"1024", "1,048,576"}};
  for (const auto& [n, n2] : table) {
    const Ran r = run_cli(std::string("check configs/examples/exercise_n5.yaml --seq-len ") + n);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.out, std::string("attention scores per head ") + n2 + " (n^2, n = " + n + ")")) << r.out;
  }
}

TEST(Cli, ForwardWritesNpy) {
  const std::string out = ::testing::TempDir() + "tessera_cli_forward";
  std::filesystem::remove_all(out);
  const Ran r = run_cli("forward configs/examples/red_ball_rolls.yaml --out " + out + " --dump blocks.0.attn.weights");
  ASSERT_EQ(r.code, 0) << r.err;
  auto h = tessera::npy::load(out + "/hidden.npy");
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->shape(), tessera::Shape({1, 3, 2}));
  EXPECT_FLOAT_EQ(h->at({0, 2, 1}), 1.25f);
  auto w = tessera::npy::load(out + "/blocks.0.attn.weights.npy");
  ASSERT_TRUE(w.ok());
  EXPECT_FLOAT_EQ(w->at({0, 0, 2, 1}), 0.5f);
  const Ran bad = run_cli("forward configs/examples/red_ball_rolls.yaml --out " + out + " --dump blocks.9.nothing");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(has(bad.err, "--dump blocks.9.nothing: no intermediate of that name")) << bad.err;
}

TEST(Cli, ConfigErrorsAreReportedWithLocationAndExitCode2) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "tessera_cli_bad.yaml";
  std::ofstream(path) << "model:\n  d_model: 10\n  n_heads: 3\n  d_modle: 4\n  stem:\n    vocab_size: 100\n";
  const Ran r = run_cli("check " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, path + ":4:3: model.d_modle: unknown key")) << r.err;
  EXPECT_TRUE(has(r.err, path + ":3:3: model.n_heads: n_heads (3) does not divide d_model (10)")) << r.err;
  EXPECT_TRUE(has(r.err, "nothing was run")) << r.err;
  const Ran missing = run_cli("check " + dir + "no_such_file.yaml");
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(has(missing.err, "no_such_file.yaml")) << missing.err;
}

TEST(Cli, WeightsThatDoNotFitAreRefusedBeforeRunning) {
  const Ran r = run_cli("check configs/examples/red_ball_rolls.yaml --set 'model.weights.inline.blocks.0.attn.w_v=[[1, 0], [0, 2]]'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "tensor \"blocks.0.attn.w_v\" has shape (2, 2) but the model expects (3, 2)")) << r.err;
}

// --set reaches list entries by index, and its errors name the argument and the column in it.
TEST(Cli, SetReachesListEntriesAndNamesItsArgumentInErrors) {
  const std::string q =
      "tokenize configs/experiments/quickstart.yaml --plugin 3 --text MKTAYIAKQRQISFVKSHFSRQ";
  const Ran full = run_cli(q);
  ASSERT_EQ(full.code, 0) << full.err;
  EXPECT_TRUE(has(full.out, "# <text>: 24 rows of token ids")) << full.out;  // <cls>, 22 residues, <eos>
  for (const char* set : {"plugins.3.options.max_length=8", "plugins[3].options.max_length=8",
                          "'plugins.3.options={max_length: 8}'"}) {
    const Ran cut = run_cli(q + " --set " + set);
    ASSERT_EQ(cut.code, 0) << set << "\n" << cut.err;
    EXPECT_TRUE(has(cut.out, "# <text>: 8 rows of token ids")) << set << "\n" << cut.out;
  }
  const Ran range = run_cli(q + " --set plugins.7.options.max_length=64");
  EXPECT_EQ(range.code, 2);
  EXPECT_TRUE(has(range.err,
                  "--set plugins.7.options.max_length=64, column 9: index 7 is out of range (plugins has 4 "
                  "entries)"))
      << range.err;
  const Ran value = run_cli(q + " --set plugins.3.options.max_length=lots");
  EXPECT_EQ(value.code, 2);
  EXPECT_TRUE(
      has(value.err, "--set plugins.3.options.max_length=lots, column 30: plugins[3].options.max_length: "))
      << value.err;
  const Ran key = run_cli(q + " --set plugins.3.options.max_lenght=8");
  EXPECT_EQ(key.code, 2);
  EXPECT_TRUE(has(key.err,
                  "--set plugins.3.options.max_lenght=8, column 19: plugins[3].options.max_lenght: unknown "
                  "option of plugin protein (did you mean `max_length`?)"))
      << key.err;
  for (const Ran* r : {&range, &value, &key}) EXPECT_FALSE(has(r->err, "<--set>")) << r->err;
}

TEST(Cli, WeightsFileProblemsPointAtTheYamlKey) {
  // A checkpoint exported from one model (d_ff 8), loaded by a config with d_ff 4.
  const std::string dir = ::testing::TempDir();
  const std::string weights = dir + "tessera_cli_layer.safetensors";
  const Ran saved = run_cli("export configs/examples/transformer_layer.yaml " + weights);
  ASSERT_EQ(saved.code, 0) << saved.err;
  EXPECT_TRUE(has(saved.out, "tensors")) << saved.out;
  const Ran params = run_cli("check configs/examples/transformer_layer.yaml --params");
  EXPECT_TRUE(has(params.out, "blocks.0.ffn.w1  (3, 8)  24")) << params.out;
  const std::string yaml = dir + "tessera_cli_weights.yaml";
  std::ofstream(yaml) << "model:\n  include: " << kSrc << "configs/examples/transformer_layer.yaml\n"
                      << "  d_ff: 4\n  weights:\n    file: " << weights << "\n";
  const Ran r = run_cli("check " + yaml);
  EXPECT_EQ(r.code, 2);
  const std::string at = yaml + ":5:5: model.weights.file: tensor ";
  EXPECT_TRUE(has(r.err, at + "\"blocks.0.ffn.w1\" in " + weights + " has shape (3, 8) but the model expects (3, 4)"))
      << r.err;
  EXPECT_TRUE(has(r.err, at + "\"blocks.0.ffn.w2\" in " + weights + " has shape (8, 3) but the model expects (4, 3)"))
      << r.err;
  EXPECT_TRUE(has(r.err, "2 problem(s)")) << r.err;
  // The same file with the matching config loads and runs.
  EXPECT_EQ(run_cli("forward configs/examples/transformer_layer.yaml --out " + dir + "tl --set model.weights.file=" +
                    weights).code, 0);
}

// The table's lines: "case  input  per pass  items/s  rows/s  rate", between the header and the
// first blank line. Checks the figures are there and positive, never how fast they are.
TEST(Cli, BenchPluginsGivesEachFrontEndAPositiveRate) {
  const std::string json = ::testing::TempDir() + "tessera_cli_bench_plugins.json";
  std::filesystem::remove(json);
  const Ran r = run_cli("bench --plugins --reps 1 --warmup 1 --json " + json);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "1 thread")) << r.out;
  std::istringstream lines(r.out);
  std::string line;
  while (std::getline(lines, line) && line.rfind("case ", 0) != 0) {
  }
  const std::regex row(
      R"(^(\S+) +(.+?) +([0-9.]+) ms +([0-9.,]+) +([0-9,]+) +([0-9.,]+) (images/s|s of audio/s|MB/s) +([0-9.]+)x$)");
  std::map<std::string, std::string> units;  // case -> rate unit
  while (std::getline(lines, line) && !line.empty()) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, row)) << line;
    auto number = [](std::string s) {
      s.erase(std::remove(s.begin(), s.end(), ','), s.end());
      return std::stod(s);
    };
    EXPECT_GT(number(m[3]), 0) << line;  // ms per pass
    EXPECT_GT(number(m[4]), 0) << line;  // items/s
    EXPECT_GT(number(m[5]), 0) << line;  // rows/s
    EXPECT_GT(number(m[6]), 0) << line;  // the modality's rate
    EXPECT_EQ(number(m[8]), 1.0) << line;  // one pass: no spread
    EXPECT_TRUE(units.emplace(m[1], m[7]).second) << "twice: " << line;
  }
  const std::map<std::string, std::string> expected = {
      {"image/vit224", "images/s"},  {"audio/whisper", "s of audio/s"},
      {"audio/ast", "s of audio/s"}, {"protein/esm2", "MB/s"},
      {"text/bpe", "MB/s"},          {"text/wordpiece", "MB/s"},
      {"text/bytes", "MB/s"}};
  EXPECT_EQ(units, expected) << r.out;
  EXPECT_TRUE(has(r.out, "chelsea.jpg: 1 JPEG, 451x300")) << r.out;
  EXPECT_TRUE(has(r.out, "librivox_0880.wav: 1 file, 2.99 s")) << r.out;
  EXPECT_TRUE(has(r.out, "corpus.txt: 10,194 lines")) << r.out;

  std::ifstream f(json);
  ASSERT_TRUE(f.good()) << json;
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["warnings"].size(), 0u);
  ASSERT_EQ(j["cases"].size(), expected.size());
  for (const auto& c : j["cases"]) {
    EXPECT_GT(c["rate"].get<double>(), 0) << c.dump();
    EXPECT_GT(c["items_per_s"].get<double>(), 0) << c.dump();
    EXPECT_EQ(c["times_s"].size(), 1u) << c.dump();
    EXPECT_EQ(c["spread"], 1.0) << c.dump();
    // Sizes, not speeds: one image, the clip's 2.99 s (47,840 samples at 16 kHz), the corpus's lines.
    if (c["case"] == "image/vit224") {
      EXPECT_EQ(c["items_per_pass"], 1);
      EXPECT_EQ(c["rows_per_pass"], 197);
    }
    if (c["plugin"] == "audio") {
      EXPECT_NEAR(c["units_per_pass"].get<double>(), 2.99, 1e-9) << c.dump();
    }
    if (c["plugin"] == "text") {
      EXPECT_EQ(c["items_per_pass"], 10194);
    }
  }
}

TEST(Cli, BenchPluginsNamesTheMissingInput) {
  const Ran given = run_cli("bench --plugins --only image --input image=/no/such/cat.jpg");
  EXPECT_EQ(given.code, 2);
  EXPECT_TRUE(has(given.err, "image/vit224: --input image=/no/such/cat.jpg: no such file or directory"))
      << given.err;
  const Ran installed = run_cli("bench --plugins --only text/bpe --data /no/such/data");
  EXPECT_EQ(installed.code, 2);
  EXPECT_TRUE(has(installed.err,
                  "text/bpe: its default input /no/such/data/text/corpus.txt (a text file, one item "
                  "per line) is missing; pass --input text=PATH"))
      << installed.err;
  EXPECT_TRUE(has(installed.err, "pass --input gpt2-vocab=PATH")) << installed.err;
  EXPECT_TRUE(has(installed.err, "pass --input gpt2-merges=PATH")) << installed.err;
  const Ran role = run_cli("bench --plugins --input picture=cat.jpg");
  EXPECT_EQ(role.code, 2);
  EXPECT_TRUE(has(role.err, "--input picture=cat.jpg: expected ROLE=PATH with ROLE one of image, audio"))
      << role.err;
  const Ran only = run_cli("bench --plugins --only video");
  EXPECT_EQ(only.code, 2);
  EXPECT_TRUE(has(only.err, "--only video: no such case or plugin")) << only.err;
  const Ran neither = run_cli("bench");
  EXPECT_EQ(neither.code, 2);
  EXPECT_TRUE(has(neither.err, "give an experiment YAML to time its model, or --plugins")) << neither.err;
  EXPECT_EQ(run_cli("bench configs/bench/vit_b16.yaml --plugins").code, 2);
}

// A Hugging Face folder (the tiny random BERT of tests/data/hf) with no plugins written: the
// loader adds the text plugin with the folder's vocabulary; `search` finds each line by itself.
TEST(Cli, RunAndSearchAHuggingFaceFolder) {
  const std::string dir = ::testing::TempDir() + "tessera_cli_search." + std::to_string(getpid()) + "/";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir + "lines.txt") << "Thou shalt not kill.\nAnd the servant told Isaac all things that he had done.\n"
                                        "In the beginning God created the heaven and the earth.\n";
    std::ofstream(dir + "s.yaml") << "model: {from: hf, path: " << kSrc << "tests/data/hf/bert/model}\n"
                                  << "data: {path: lines.txt}\noutputs: {dir: " << dir << "run}\n";
  }
  const Ran none = run_cli("search " + dir + "s.yaml \"servant\"");
  EXPECT_EQ(none.code, 2);
  EXPECT_TRUE(has(none.err, "holds no complete embed run; run `tessera run " + dir + "s.yaml` first")) << none.err;
  const Ran run = run_cli("run " + dir + "s.yaml");
  ASSERT_EQ(run.code, 0) << run.err;
  const Ran r = run_cli("search " + dir + "s.yaml -k 2 --json \"And the servant told Isaac all things that he had done.\"");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["neighbours"].size(), 2u);
  EXPECT_EQ(j["neighbours"][0]["id"], "lines.txt:2");
  EXPECT_EQ(j["neighbours"][0]["text"], "And the servant told Isaac all things that he had done.");
  EXPECT_NEAR(j["neighbours"][0]["cosine"].get<double>(), 1.0, 1e-5);
  EXPECT_LT(j["neighbours"][1]["cosine"].get<double>(), 0.9999);
  std::filesystem::remove_all(dir);
}

// The AST folder through a batch run: the audio plugin gets its options from the folder (fbank,
// 64 frames, 2 special rows), the two special rows become the CLS and distillation rows, and the
// embeddings are transformers' pooled outputs.
TEST(Cli, RunAnAstFolderGivesTheReferencePooledVectors) {
  const std::string dir = ::testing::TempDir() + "tessera_cli_ast." + std::to_string(getpid()) + "/";
  std::filesystem::create_directories(dir + "clips");
  for (const char* f : {"cards_001.wav", "espeak_seven.wav"})
    std::filesystem::copy_file(kSrc + "tests/data/audio/" + f, dir + "clips/" + f);
  std::ofstream(dir + "a.yaml") << "model: {from: hf, path: " << kSrc << "tests/data/hf/ast/model, head: {kind: pool}}\n"
                                << "data: {path: clips}\noutputs: {dir: " << dir << "run}\n";
  const Ran run = run_cli("run " + dir + "a.yaml");
  ASSERT_EQ(run.code, 0) << run.err;
  tessera::Result<tessera::Tensor> got = tessera::npy::load(dir + "run/embeddings.npy");
  ASSERT_TRUE(got.ok()) << got.status().message();
  tessera::Result<tessera::safetensors::File> ref = tessera::safetensors::File::open(kSrc + "tests/data/hf/ast/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  for (int64_t i = 0; i < 2; ++i) {
    const tessera::Tensor want = ref->get("pooled." + std::to_string(i)).value();
    for (int64_t k = 0; k < want.numel(); ++k) EXPECT_NEAR(got->at({i, k}), want.data<float>()[k], 1e-4) << i << "," << k;
  }
  std::filesystem::remove_all(dir);
}

// A FASTA file through the protein plugin: each record is its own input, as `tessera run` reads
// it, shown under its id and name; a file of one bare sequence is one input.
TEST(Cli, TokenizeShowsEachRecordOfAFastaFile) {
  const std::string dir = ::testing::TempDir() + "tessera_cli_fasta." + std::to_string(getpid()) + "/";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "two.fasta") << ">first the first record\nMKT\nAY\n>second\nLV\n";
  std::ofstream(dir + "bare.txt") << "MKTAY\n";
  const std::string q = "tokenize configs/experiments/quickstart.yaml --plugin 3 --input ";
  const Ran r = run_cli(q + dir + "two.fasta");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "# two.fasta#1 (first): 7 rows of token ids")) << r.out;  // <cls> M K T A Y <eos>
  EXPECT_TRUE(has(r.out, "# two.fasta#2 (second): 4 rows of token ids")) << r.out;
  EXPECT_TRUE(has(r.out, "decoded: MKTAY\n")) << r.out;
  EXPECT_TRUE(has(r.out, "decoded: LV\n")) << r.out;
  EXPECT_LT(r.out.find("two.fasta#1"), r.out.find("two.fasta#2"));
  // The real sample: 300 records, each shown.
  const Ran sample = run_cli(q + "tests/data/protein/uniprot_sample.fasta");
  ASSERT_EQ(sample.code, 0) << sample.err;
  EXPECT_TRUE(has(sample.out, "# uniprot_sample.fasta#300 (")) << sample.out.substr(0, 2000);
  const Ran bare = run_cli(q + dir + "bare.txt");
  ASSERT_EQ(bare.code, 0) << bare.err;
  EXPECT_TRUE(has(bare.out, "# " + dir + "bare.txt: 7 rows of token ids")) << bare.out;
  // A broken record names itself, and the others are still shown.
  std::ofstream(dir + "broken.fasta") << ">good\nMKT\n>bad\nMK7T\n";
  const Ran broken = run_cli(q + dir + "broken.fasta");
  EXPECT_EQ(broken.code, 2);
  EXPECT_TRUE(has(broken.out, "# broken.fasta#1 (good): 5 rows of token ids")) << broken.out;
  EXPECT_TRUE(has(broken.err, "tessera tokenize: broken.fasta#2 (bad): ")) << broken.err;
  // A header after blanks is a record the reader refuses: reported, never a crash.
  std::ofstream(dir + "indented.fasta") << "  >a\nMK\n>b\nLV\n";
  const Ran indented = run_cli(q + dir + "indented.fasta");
  EXPECT_EQ(indented.code, 2) << indented.err;
  EXPECT_TRUE(has(indented.err, "tessera tokenize: indented.fasta:1: ")) << indented.err;
  EXPECT_TRUE(has(indented.err, "sequence data before the first '>' header line")) << indented.err;
  EXPECT_TRUE(has(indented.out, "decoded: LV\n")) << indented.out;
  std::filesystem::remove_all(dir);
}

TEST(Cli, HelpForEverySubcommand) {
  for (const char* sub : {"check", "explain", "forward", "bench", "export", "schema", "version", "search",
                          "generate", "grad"}) {
    const Ran r = run_cli(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_TRUE(has(r.out, "Usage")) << sub << ": " << r.out;
  }
}

// Bare `tessera`: the help, with example command lines, on stdout and exit code 0.
TEST(Cli, BareTesseraPrintsHelpWithExamples) {
  const Ran none = run_cli("");
  EXPECT_EQ(none.code, 0) << none.err;
  EXPECT_TRUE(has(none.out, "Usage")) << none.out;
  EXPECT_TRUE(has(none.out, "Examples:")) << none.out;
  EXPECT_TRUE(has(none.out, "tessera run configs/experiments/quickstart.yaml")) << none.out;
  EXPECT_TRUE(has(none.out, "tessera check ")) << none.out;
  EXPECT_TRUE(none.err.empty()) << none.err;
  const Ran help = run_cli("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_EQ(help.out, none.out);
}

TEST(Cli, VersionFlagAndSubcommandAgree) {
  const Ran flag = run_cli("--version");
  EXPECT_EQ(flag.code, 0) << flag.err;
  EXPECT_EQ(flag.out.rfind("tessera ", 0), 0u) << flag.out;
  EXPECT_TRUE(has(flag.out, "oneDNN ")) << flag.out;
  EXPECT_TRUE(has(flag.out, "\nMPI: ")) << flag.out;  // built in (and the rank), or not
  const Ran sub = run_cli("version");
  EXPECT_EQ(sub.code, 0) << sub.err;
  EXPECT_EQ(sub.out, flag.out);
}

// A mistyped subcommand or option: the nearest one by edit distance, exit code 2, nothing run.
TEST(Cli, UsageErrorsSuggestTheNearestSubcommandOrOption) {
  const std::pair<std::string, std::string> cases[] = {
      {"runn configs/examples/red_ball_rolls.yaml",
       "tessera: unknown subcommand 'runn'. Did you mean 'run'?"},
      {"chekc configs/examples/red_ball_rolls.yaml",
       "tessera: unknown subcommand 'chekc'. Did you mean 'check'?"},
      {"--verison", "tessera: unknown option '--verison'. Did you mean '--version'?"},
      {"run configs/examples/red_ball_rolls.yaml --batchsize 4",
       "tessera run: unknown option '--batchsize'. Did you mean '--batch-size'?"},
      {"run --batch-sise=4 configs/examples/red_ball_rolls.yaml",
       "tessera run: unknown option '--batch-sise'. Did you mean '--batch-size'?"},
      {"generate configs/examples/generate_tiny.yaml --promt hello",
       "tessera generate: unknown option '--promt'. Did you mean '--prompt'?"},
      {"bench --plugin", "tessera bench: unknown option '--plugin'. Did you mean '--plugins'?"},
      {"check configs/examples/red_ball_rolls.yaml -set model.n_layers=2",
       "tessera check: unknown option '-set'. Did you mean '--set'?"},
      {"check configs/examples/red_ball_rolls.yaml configs/examples/scaling.yaml",
       "tessera check: unexpected argument 'configs/examples/scaling.yaml'"},
      // Dashes and no name: nothing to suggest, and no crash.
      {"---", "tessera: unknown option '---'; see `tessera --help`"},
      {"check configs/examples/red_ball_rolls.yaml -=1", "tessera check: unknown option '-'; see"},
      {"check configs/examples/red_ball_rolls.yaml --=x", "tessera check: unknown option '--'; see"},
  };
  for (const auto& [args, msg] : cases) {
    const Ran r = run_cli(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_TRUE(has(r.err, msg)) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
  }
  // Nothing near: the list to choose from.
  const Ran far = run_cli("frobnicate");
  EXPECT_EQ(far.code, 2);
  EXPECT_TRUE(
      has(far.err, "tessera: unknown subcommand 'frobnicate'; the subcommands are: run, generate, check"))
      << far.err;
  EXPECT_TRUE(has(far.err, "Run `tessera --help`")) << far.err;
  const Ran opt = run_cli("check configs/examples/red_ball_rolls.yaml --zzzzzz");
  EXPECT_EQ(opt.code, 2);
  EXPECT_TRUE(
      has(opt.err, "tessera check: unknown option '--zzzzzz'; see `tessera check --help` for its options"))
      << opt.err;
}

TEST(Cli, SchemaMarkdownIsTheDocumentedTable) {
  const Ran r = run_cli("schema --markdown");
  ASSERT_EQ(r.code, 0);
  std::ifstream f(kSrc + "docs/CONFIG.md");
  const std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(has(doc, r.out)) << "docs/CONFIG.md is out of date: regenerate its table with `tessera schema --markdown`";
}

// The quickstart's experiment over one bad input of each modality and one good one: each bad item
// is recorded with its file and reason, the good one is written, and the exit code is 3.
TEST(Cli, RunRecordsEveryKindOfBadItemAndExitsWith3) {
  namespace fs = std::filesystem;
  const std::string d = ::testing::TempDir() + "tessera_cli_bad_items_" + std::to_string(getpid());
  fs::remove_all(d);
  fs::create_directories(d + "/quickstart");
  const std::string q = kSrc + "configs/experiments/quickstart/";
  fs::copy_file(q + "vocab.txt", d + "/quickstart/vocab.txt");
  auto cut = [&](const std::string& from, const std::string& to, double keep) {
    std::ifstream in(q + from, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(d + "/quickstart/" + to, std::ios::binary) << bytes.substr(0, static_cast<size_t>(bytes.size() * keep));
  };
  cut("cat.jpg", "cut.jpg", 0.5);      // a truncated JPEG
  cut("cards.wav", "cut.wav", 0.3);    // a WAV cut inside its data chunk, and one inside its header
  cut("cards.wav", "header.wav", 0.0005);
  std::ofstream(d + "/quickstart/items.csv", std::ios::binary)
      << "id,image,audio,text,protein\n"
         "jpeg,cut.jpg,,,\n"
         "wav,,header.wav,,\n"
         "wav_data,,cut.wav,,\n"
         "fasta,,,,MKT*LV\n"
         "latin1,,,caf\xE9 au lait,\n"
         "good,,,a good line,\n";
  fs::copy_file(kSrc + "configs/experiments/quickstart.yaml", d + "/q.yaml");
  const Ran r = run_cli("run " + d + "/q.yaml --out " + d + "/run --set task.attention.layers=[]");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(has(r.out, "6 items, 1 sequences written, 5 failed")) << r.out;
  EXPECT_TRUE(has(r.out, "  time: setup ")) << r.out;
  EXPECT_TRUE(has(r.out, " items/s\n")) << r.out;
  std::ifstream f(d + "/run/errors.jsonl");
  std::map<std::string, nlohmann::json> errors;
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    errors[j["id"]] = j;
  }
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_EQ(errors["jpeg"]["file"], d + "/quickstart/cut.jpg");
  EXPECT_EQ(errors["wav"]["file"], d + "/quickstart/header.wav");
  for (const auto& [id, e] : errors) {
    const std::string reason = e["reason"];
    EXPECT_FALSE(reason.empty()) << id;
    if (id == "jpeg") { EXPECT_NE(reason.find("truncated JPEG: the file ends at byte"), std::string::npos) << reason; }
    if (id == "wav") { EXPECT_NE(reason.find("not a sound file libsndfile can read"), std::string::npos) << reason; }
    if (id == "wav_data") { EXPECT_NE(reason.find("truncated WAV: its data chunk promises"), std::string::npos) << reason; }
    if (id == "fasta") { EXPECT_NE(reason.find("'*' (a stop) before the end of the sequence"), std::string::npos) << reason; }
    if (id == "latin1") { EXPECT_NE(reason.find("UTF-8"), std::string::npos) << reason; }
  }
  std::ifstream index(d + "/run/index.jsonl");
  std::string first;
  std::getline(index, first);
  EXPECT_EQ(first, "{\"id\":\"good\",\"item\":5,\"rows\":5}");
  fs::remove_all(d);
}

// ---------------------------------------------------------------------------------------------
// Generation: `tessera generate` and the run task `generate`, on the seeded byte-level decoder of
// configs/examples/generate_tiny.yaml. Its tokenizer is `bytes`, so a token's text is its byte
// (the specials 256..258 have none) and the expected output can be spelt out from the ids.

namespace {

const std::string kTiny = "configs/examples/generate_tiny.yaml";

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A completion's text from its ids and finish reason, as generate() makes it for the bytes tokenizer:
// a final stop token left out, the text cut before the example's stop string "\n".
std::string completion_of(const nlohmann::json& j) {
  std::vector<int> ids = j["ids"].get<std::vector<int>>();
  if (j["finish_reason"] == "eos") ids.pop_back();
  std::string text;
  for (int id : ids)
    if (id < 256) text += static_cast<char>(id);
  return text.substr(0, text.find('\n'));
}

}  // namespace

TEST(Cli, GeneratePrintsPromptsAndTheirCompletions) {
  const std::string prompts = "--prompt 'Once upon a time' --prompt 'Hi'";
  const Ran j = run_cli("generate " + kTiny + " " + prompts + " --json");
  ASSERT_EQ(j.code, 0) << j.err;
  const std::vector<nlohmann::json> lines = json_lines(j.out);
  ASSERT_EQ(lines.size(), 2u) << j.out;
  std::string expected;
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& g = lines[i];
    EXPECT_EQ(g["prompt"], i == 0 ? "Once upon a time" : "Hi");
    EXPECT_EQ(g["prompt_tokens"], i == 0 ? 16 : 2);
    const size_t n = g["ids"].size();
    EXPECT_EQ(g["new_tokens"], n);
    EXPECT_GE(n, 1u);
    EXPECT_LE(n, 24u);  // task.generate.max_new_tokens
    const std::string reason = g["finish_reason"];
    EXPECT_TRUE(reason == "stop" || reason == "eos" || (reason == "length" && n == 24)) << g.dump();
    EXPECT_GT(g["tokens_per_s"].get<double>(), 0) << g.dump();
    EXPECT_TRUE(has(j.err, "generate: --prompt " + std::to_string(i + 1) + ": " + std::to_string(n) + " new tokens (" +
                               reason + ")")) << j.err;
    expected += g["prompt"].get<std::string>() + completion_of(g) + "\n";
  }
  // Without --json: each prompt and its completion, byte for byte; streamed, the same bytes.
  const Ran plain = run_cli("generate " + kTiny + " " + prompts);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out, expected);
  const Ran streamed = run_cli("generate " + kTiny + " " + prompts + " --stream");
  ASSERT_EQ(streamed.code, 0) << streamed.err;
  EXPECT_EQ(streamed.out, expected);
  // One prompt per line of a file gives the same completions (here decoded two at a time).
  const std::string file = ::testing::TempDir() + "tessera_cli_prompts_" + std::to_string(getpid()) + ".txt";
  std::ofstream(file) << "Once upon a time\r\n\nHi\n";
  const Ran listed = run_cli("generate " + kTiny + " --prompts " + file);
  EXPECT_EQ(listed.out, expected);
  EXPECT_TRUE(has(listed.err, "tessera_cli_prompts_" + std::to_string(getpid()) + ".txt:3:")) << listed.err;
  std::remove(file.c_str());
}

TEST(Cli, GenerateSamplesReproduciblyFromASeed) {
  auto ids = [](const std::string& options) {
    const Ran r = run_cli("generate " + kTiny + " --prompt 'Once upon a time' --max-new-tokens 16 --set "
                          "'task.generate.stop=[]' --set 'task.generate.stop_ids=[]' --json " + options);
    EXPECT_EQ(r.code, 0) << r.err;
    const std::vector<nlohmann::json> lines = json_lines(r.out);
    return lines.empty() ? std::vector<int>() : lines[0]["ids"].get<std::vector<int>>();
  };
  const std::vector<int> greedy = ids(""), a = ids("--temperature 0.9 --top-k 40 --top-p 0.95 --seed 3");
  ASSERT_EQ(greedy.size(), 16u);
  EXPECT_EQ(ids("--temperature 0.9 --top-k 40 --top-p 0.95 --seed 3"), a);
  EXPECT_NE(ids("--temperature 0.9 --top-k 40 --top-p 0.95 --seed 4"), a);
  EXPECT_NE(a, greedy);
  EXPECT_EQ(ids("--temperature 0.9 --top-k 1 --seed 3"), greedy);  // one token left to draw: greedy
  EXPECT_NE(ids("--repetition-penalty 1.5"), greedy);               // the prompt's bytes lose ground
}

// A stop the user asks for (--stop-id, task.generate.stop_ids) finishes with "stop", as a stop
// string does; "eos" is kept for the model's own end of sequence (the tokenizer's EOS).
TEST(Cli, GenerateStopIdFinishesWithStop) {
  const std::string base = "generate " + kTiny +
                           " --prompt 'Once upon a time' --max-new-tokens 12 --json --set "
                           "'task.generate.stop=[]'";
  const Ran free = run_cli(base + " --set 'task.generate.stop_ids=[]'");
  ASSERT_EQ(free.code, 0) << free.err;
  const std::vector<nlohmann::json> all = json_lines(free.out);
  ASSERT_EQ(all.size(), 1u);
  const std::vector<int> ids = all[0]["ids"].get<std::vector<int>>();
  ASSERT_EQ(ids.size(), 12u);
  const int stop = ids[5];
  const std::vector<int> upto(ids.begin(), std::find(ids.begin(), ids.end(), stop) + 1);
  for (const std::string& how : {" --stop-id " + std::to_string(stop),
                                 " --set 'task.generate.stop_ids=[" + std::to_string(stop) + "]'"}) {
    const Ran r = run_cli(base + how);
    ASSERT_EQ(r.code, 0) << how << "\n" << r.err;
    const std::vector<nlohmann::json> got = json_lines(r.out);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0]["finish_reason"], "stop") << how;
    EXPECT_EQ(got[0]["ids"].get<std::vector<int>>(), upto) << how;
    EXPECT_TRUE(has(r.err, "generate: --prompt 1: " + std::to_string(upto.size()) + " new tokens (stop)"))
        << r.err;
  }
}

TEST(Cli, GenerateStopsWhereThePositionsEndAndSaysSo) {
  const Ran r = run_cli("generate " + kTiny + " --prompt 'Once upon a time' --max-new-tokens 10 --json --set "
                        "model.positions.max_len=20 --set 'task.generate.stop=[]' --set 'task.generate.stop_ids=[]'");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<nlohmann::json> lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  const std::string note = "stopped at model.positions.max_len (20): the prompt's 16 tokens left room for 5 new "
                           "tokens, not max_new_tokens 10";
  EXPECT_EQ(lines[0]["finish_reason"], "length");
  EXPECT_EQ(lines[0]["new_tokens"], 5);
  EXPECT_EQ(lines[0]["note"], note);
  EXPECT_TRUE(has(r.err, "generate: --prompt 1: " + note)) << r.err;
}

TEST(Cli, GenerateRefusesBadOptionsPromptsAndModels) {
  const std::pair<std::string, std::string> cases[] = {
      {"--prompt x --temperature -1", "tessera generate: temperature must be >= 0 (0 is greedy), found -1"},
      {"--prompt x --top-p 1.5",
       "tessera generate: top_p must be in (0, 1] (1 keeps every token), found 1.5"},
      {"--prompt x --top-p 0", "tessera generate: top_p must be in (0, 1] (1 keeps every token), found 0"},
      {"--prompt x --top-k -2", "tessera generate: --top-k: Value -2 not in range 0 to 16777216"},
      {"--prompt x --repetition-penalty 0",
       "tessera generate: repetition_penalty must be > 0 (1 is none), found 0"},
      {"--prompt x --max-new-tokens 0",
       "tessera generate: --max-new-tokens: Value 0 not in range 1 to 1048576"},
      {"", "tessera generate: no prompt: give --prompt TEXT (repeatable) or --prompts FILE (one per line)"},
      {"--prompt x --stream --json",
       "tessera generate: --stream prints the text as it comes, --json one line per "
       "prompt once it is done: choose one"},
      {"--prompts /no/such/prompts.txt", "tessera generate: --prompts: "},
      {"--prompt x --prompt 'Once upon a time' --set model.positions.max_len=8",
       "tessera generate: --prompt 2: 16 tokens, more than model.positions.max_len (8): shorten it, or raise "
       "max_len"},
      {"--prompt x --set model.stem.vocab_size=300",
       "tessera generate: plugin text's vocabulary has 259 ids but model.stem.vocab_size is 300"},
      {"--prompt x --set model.head.kind=pool",
       "tessera generate: the model has no language-model head (model.head.kind is pool); generation needs "
       "head.kind lm"},
      {"--prompt x --set model.causal=false",
       "tessera generate: the model is not causal (model.causal false); generation needs a model that reads "
       "left to "
       "right (arch: decoder)"},
      // task.generate in the experiment is checked by the config loader, at the key.
      {"--prompt x --set task.generate.temperature=-1", "task.generate.temperature: must be >= 0, found -1"},
      {"--prompt x --set task.generate.top_p=0", "task.generate.top_p: must be in (0, 1], found 0"},
      {"--prompt x --set task.generate.repetition_penalty=0",
       "task.generate.repetition_penalty: must be > 0, found 0"},
  };
  for (const auto& [args, msg] : cases) {
    const Ran r = run_cli("generate " + kTiny + " " + args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_TRUE(has(r.err, msg)) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
  const Ran four = run_cli("generate configs/experiments/quickstart.yaml --prompt x");
  EXPECT_EQ(four.code, 2);
  EXPECT_TRUE(has(four.err, "quickstart.yaml: generation needs exactly one plugin, the tokenizer of the model's text"))
      << four.err;
}

// The run task over a text file of prompts: each line continued as `tessera generate` continues it
// alone (the run decodes them as one batch), a line too long for the positions a bad item.
TEST(Cli, RunGenerateWritesCompletionsAndRecordsBadItems) {
  namespace fs = std::filesystem;
  const std::string d = ::testing::TempDir() + "tessera_cli_generate_" + std::to_string(getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d + "/prompts.txt") << "Once upon a time\n" << std::string(130, 'x') << "\nHi\n";
  const Ran r = run_cli("run " + kTiny + " --out " + d + "/run --set data.path=" + d + "/prompts.txt");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(has(r.out, "3 items, 2 sequences written, 1 failed")) << r.out;
  std::ifstream f(d + "/run/completions.jsonl");
  const std::vector<nlohmann::json> got = json_lines(std::string(std::istreambuf_iterator<char>(f), {}));
  ASSERT_EQ(got.size(), 2u);
  const std::pair<int, std::string> items[] = {{0, "Once upon a time"}, {2, "Hi"}};
  for (size_t i = 0; i < 2; ++i) {
    const auto& [item, prompt] = items[i];
    EXPECT_EQ(got[i]["item"], item);
    EXPECT_EQ(got[i]["id"], "prompts.txt:" + std::to_string(item + 1));
    EXPECT_EQ(got[i]["rows"], prompt.size());
    const Ran alone = run_cli("generate " + kTiny + " --json --prompt '" + prompt + "'");
    const std::vector<nlohmann::json> one = json_lines(alone.out);
    ASSERT_EQ(one.size(), 1u) << alone.err;
    EXPECT_EQ(got[i]["ids"], one[0]["ids"]) << prompt;
    EXPECT_EQ(got[i]["finish_reason"], one[0]["finish_reason"]);
    EXPECT_EQ(got[i]["completion"], one[0]["completion"]);
  }
  std::ifstream e(d + "/run/errors.jsonl");
  const std::vector<nlohmann::json> errors = json_lines(std::string(std::istreambuf_iterator<char>(e), {}));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["item"], 1);
  EXPECT_TRUE(has(errors[0]["reason"].get<std::string>(), "130 rows, more than model.positions.max_len (128)")) << errors[0].dump();
  EXPECT_FALSE(fs::exists(d + "/run/index.jsonl"));
  fs::remove_all(d);
}

TEST(Cli, BenchTimesPrefillAndDecodeForLanguageModels) {
  const std::string json = ::testing::TempDir() + "tessera_cli_bench_generate_" + std::to_string(getpid()) + ".json";
  const Ran r = run_cli("bench " + kTiny + " --reps 2 --warmup 0 --no-peak --seq-len 16 --decode 8 --json " + json);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "prefill 16 tokens x batch 1 into a KV cache: median")) << r.out;
  EXPECT_TRUE(has(r.out, "decode 8 tokens one at a time after them (greedy): median")) << r.out;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["prefill_tokens"], 16);
  EXPECT_EQ(j["decode_tokens"], 8);
  EXPECT_EQ(j["decode_times_s"].size(), 2u);
  EXPECT_GT(j["prefill_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0);
  // The load: from the start of loading to the end of the first forward.
  EXPECT_TRUE(has(r.out, "s to the end of the first forward: ")) << r.out;
  EXPECT_GT(j["first_forward_s"].get<double>(), 0);
  EXPECT_NEAR(j["load_s"].get<double>(), j["load_ready_s"].get<double>() + j["first_forward_s"].get<double>(), 1e-9);
  // Each figure with the spread of its runs (slowest / fastest), and a warning for each wide one.
  EXPECT_TRUE(has(r.out, "latency median ")) << r.out;
  EXPECT_EQ(j["spread_limit"], 1.25);
  const std::vector<double> times = j["times_s"].get<std::vector<double>>();
  EXPECT_EQ(j["min_s"], *std::min_element(times.begin(), times.end()));
  EXPECT_EQ(j["max_s"], *std::max_element(times.begin(), times.end()));
  EXPECT_NEAR(j["spread"].get<double>(), j["max_s"].get<double>() / j["min_s"].get<double>(), 1e-12);
  size_t wide = 0;
  for (const char* key : {"spread", "prefill_spread", "decode_spread"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_GE(j[key].get<double>(), 1.0) << key;
    wide += j[key].get<double>() > 1.25;
  }
  ASSERT_TRUE(j["warnings"].is_array());
  EXPECT_EQ(j["warnings"].size(), wide) << j.dump(2);
  for (const auto& w : j["warnings"]) EXPECT_TRUE(has(r.out, w.get<std::string>())) << r.out;
  for (const char* row : {"latency", "prefill", "decode"}) {
    std::istringstream lines(r.out);
    bool seen = false;
    for (std::string line; std::getline(lines, line);)
      if (line.rfind(row, 0) == 0) seen = seen || line.find("x (slowest / fastest)") != std::string::npos;
    EXPECT_TRUE(seen) << row << "\n" << r.out;
  }
  std::remove(json.c_str());
  // Only as many tokens as the positions hold after the prompt; none for a model that is no
  // language model.
  const Ran full = run_cli("bench " + kTiny + " --reps 1 --warmup 0 --no-peak --seq-len 120 --decode 64");
  EXPECT_TRUE(has(full.out, "decode 8 tokens one at a time")) << full.out;
  const Ran encoder = run_cli("bench configs/examples/exercise_n5.yaml --reps 1 --warmup 0 --no-peak");
  ASSERT_EQ(encoder.code, 0) << encoder.err;
  EXPECT_FALSE(has(encoder.out, "prefill")) << encoder.out;
}

// One attention op: its latency with the spread of its runs, and a warning for each wide one.
TEST(Cli, BenchAttentionGivesTheSpreadOfItsRuns) {
  const std::string json =
      ::testing::TempDir() + "tessera_cli_bench_attention_" + std::to_string(getpid()) + ".json";
  const Ran r = run_cli("bench --attention 64 --reps 3 --warmup 1 --json " + json);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, " (slowest / fastest)  (3 runs after 1 warm-up)")) << r.out;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  const std::vector<double> t = j["times_s"].get<std::vector<double>>();
  ASSERT_EQ(t.size(), 3u);
  const double spread = *std::max_element(t.begin(), t.end()) / *std::min_element(t.begin(), t.end());
  EXPECT_NEAR(j["spread"].get<double>(), spread, 1e-12);
  EXPECT_EQ(j["warnings"].size(), spread > 1.25 ? 1u : 0u);
  std::remove(json.c_str());
}

// Without --no-peak the bench also measures the machine (matmul, FMA, memory bandwidth: a few
// seconds, 512 MiB) and relates the model to it; only that the figures are there is checked.
TEST(Cli, BenchMeasuresTheMachinesPeaksAndTheDecodeBound) {
  const std::string json = ::testing::TempDir() + "tessera_cli_bench_peaks_" + std::to_string(getpid()) + ".json";
  const Ran r = run_cli("bench " + kTiny + " --reps 1 --warmup 0 --seq-len 16 --decode 4 --threads 2 --json " + json);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* row : {"matmul peak", "FMA peak", "memory bandwidth", "decode bound"})
    EXPECT_TRUE(has(r.out, row)) << row << "\n" << r.out;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  for (const char* key : {"matmul_peak_gflops", "fma_peak_gflops", "fma_peak_gflops_1thread", "fraction_of_fma_peak",
                          "bandwidth_read_gbs", "bandwidth_triad_gbs", "decode_bound_tokens_per_s",
                          "decode_fraction_of_bound"})
    EXPECT_GT(j.at(key).get<double>(), 0) << key;
  // The peaks' own runs have their spread too (5 each).
  for (const char* key : {"matmul_peak_spread", "fma_peak_spread", "bandwidth_spread"})
    EXPECT_GE(j.at(key).get<double>(), 1.0) << key;
  for (const char* row : {"matmul peak", "FMA peak", "memory bandwidth"}) EXPECT_TRUE(has(r.out, row)) << row;
  EXPECT_TRUE(has(r.out, "median of 5, spread ")) << r.out;
  EXPECT_GE(j["bandwidth_bytes"].get<int64_t>(), int64_t{500} << 20);
  EXPECT_FALSE(j["fma_isa"].get<std::string>().empty());
  // The tiny decoder (tied head, learned positions): every parameter once, but one row of the
  // position table.
  EXPECT_GT(j["decode_weight_bytes_per_step"].get<int64_t>(), 0);
  std::remove(json.c_str());
}

// `tessera grad` writes the loss and every parameter's gradient under the parameter's own name,
// the same numbers compute_gradients gives in-process; a classifier needs its item's --label.
TEST(Cli, GradWritesEveryParametersGradientByName) {
  const std::string out = ::testing::TempDir() + "tessera_cli_grad." + std::to_string(getpid());
  const Ran r = run_cli("grad tests/data/grad/gpt2.yaml --ids 3,1,4,1,5,9 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "(next-token cross-entropy, over 5 rows)")) << r.out;
  EXPECT_TRUE(has(r.out, "blocks.1.ffn.w1 (16, 32)")) << r.out;
  auto file = tessera::safetensors::File::open(out + "/grad.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().message();

  tessera::Diagnostics diags;
  auto exp = tessera::load_experiment(kSrc + "tests/data/grad/gpt2.yaml", {}, &diags);
  ASSERT_TRUE(exp) << diags.str();
  auto params = tessera::Parameters::resolve(exp->model);
  ASSERT_TRUE(params.ok());
  const tessera::Parameters p = params->clone();
  tessera::Parameters grads = p.zeros_like();
  const tessera::Batch batch = tessera::Batch::from_ids({3, 1, 4, 1, 5, 9});
  tessera::Targets targets;
  targets.tokens = tessera::next_token_targets(batch);
  auto loss = tessera::compute_gradients(exp->model, p, batch, targets, &grads);
  ASSERT_TRUE(loss.ok()) << loss.status().message();
  EXPECT_EQ(file->tensors().size(), grads.size() + 1);
  for (const auto& [name, g] : grads) {
    auto t = file->get(name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ(t->to_vector(), g.to_vector()) << name;
  }
  EXPECT_FLOAT_EQ(file->get("loss")->to_vector()[0], static_cast<float>(loss->loss));
  std::filesystem::remove_all(out);

  const Ran c = run_cli("grad tests/data/grad/vit.yaml --out " + out);
  EXPECT_EQ(c.code, 2);
  EXPECT_TRUE(has(c.err, "give the item's class with --label N (0 <= N < 3)")) << c.err;
}

// `tessera grad --item N`: the dataset's N-th item with the targets training gives it (here a
// masked LM's masks, the chosen rows listed); past the end, an error naming N and the size.
TEST(Cli, GradItemTakesTheDatasetsItemWithItsMasks) {
  const std::string out = ::testing::TempDir() + "tessera_cli_grad_item." + std::to_string(getpid());
  const Ran r = run_cli("grad configs/train/protein_mlm.yaml --item 2 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "item 2: ")) << r.out;
  EXPECT_TRUE(has(r.out, "chosen rows: ")) << r.out;
  EXPECT_TRUE(has(r.out, "(masked)")) << r.out;
  EXPECT_TRUE(has(r.out, "masked-LM cross-entropy at the ")) << r.out;
  auto file = tessera::safetensors::File::open(out + "/grad.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_TRUE(file->get("stem.embed").ok());
  std::filesystem::remove_all(out);

  const Ran past = run_cli("grad configs/train/protein_mlm.yaml --item 300 --out " + out);
  EXPECT_EQ(past.code, 2);
  EXPECT_TRUE(has(past.err, "--item 300 is out of range: the dataset ")) << past.err;
  EXPECT_TRUE(has(past.err, "uniprot_sample.fasta has 300 items (0 to 299)")) << past.err;
  const Ran both = run_cli("grad configs/train/protein_mlm.yaml --item 1 --ids 4,5,6 --out " + out);
  EXPECT_EQ(both.code, 2);
  EXPECT_TRUE(has(both.err, "give it without --ids, --rows and --label")) << both.err;
  // A masked LM's loss needs an item's masks: --ids (next-token targets until 2026-12-03) is refused.
  const Ran ids = run_cli("grad configs/train/protein_mlm.yaml --ids 4,5,6 --out " + out);
  EXPECT_EQ(ids.code, 2);
  EXPECT_TRUE(has(ids.err, "configs/train/protein_mlm.yaml: train.objective is mlm, whose targets are an item's "
                           "masks: give --item N"))
      << ids.err;
  EXPECT_FALSE(std::filesystem::exists(out + "/grad.safetensors"));
}

// ---------------------------------------------------------------------------------------------
// Issue 14, hostile sizes and memory: every size has a limit, a model that does not fit the
// machine is refused before anything is allocated, and running out of memory anyway ends in
// exit 1 with a message, never an abort or a signal.

namespace {

// A file of this process's own (the suite's tests run in parallel), removed by the caller.
std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + std::to_string(getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// A tiny LM over 16 tokens with its input inline: `forward` runs it in milliseconds.
const char* kTinyLm =
    "model:\n  d_model: 4\n  n_heads: 2\n  stem: {kind: tokens, vocab_size: 16}\n"
    "  positions: {kind: learned, max_len: 8}\n  head: {kind: lm, tied: true}\ninput:\n  ids: [1, 2, 3]\n";

// `ulimit -v KIB` (RLIMIT_AS) in the shell that runs `tessera ARGS`, as a user's would.
Ran run_cli_limited(int64_t kib, const std::string& args) {
  return run_cli(args, "ulimit -v " + std::to_string(kib) + " && ");
}

}  // namespace

// Before the limits: vocab_size 2^62 made a table of a few bytes and oneDNN failed on it (the
// issue saw NaN and exit 0), positions.max_len 2^62 ran with exit 0 reading outside the learned
// table, d_ff 2^62 was a SIGFPE inside oneDNN, runtime.threads 100000 a SIGSEGV in libgomp, d_model
// 2^31 an abort. Now each is refused with exit 2 naming the key, the value and the limit, before
// anything runs or is written.
TEST(Cli, HostileSizesAreRefusedWithTheirLimit) {
  const std::string cfg = temp_file("tiny_lm.yaml", kTinyLm);
  const std::string out = ::testing::TempDir() + "tessera_cli_sizes." + std::to_string(getpid());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.stem.vocab_size=4611686018427387904",
       "model.stem.vocab_size: 4611686018427387904 is more than the limit 16777216 (token ids are 32-bit"},
      {"model.positions.max_len=4611686018427387904",
       "model.positions.max_len: 4611686018427387904 is more than the limit 1048576"},
      {"model.d_ff=4611686018427387904", "model.d_ff: 4611686018427387904 is more than the limit 1048576"},
      {"runtime.threads=100000",
       "runtime.threads: 100000 is more than the limit 1024 (more threads than any"},
      {"model.d_model=2147483648", "model.d_model: 2147483648 is more than the limit 65536"},
  };
  for (const auto& [set, message] : cases) {
    const Ran r = run_cli("forward " + cfg + " --out " + out + " --set " + set);
    EXPECT_EQ(r.code, 2) << set << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "--set " + set + ", column ")) << r.err;
    EXPECT_TRUE(has(r.err, message)) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  // Within the limits the same model runs (the limit itself is Config.SizeLimits' to check: 1024
  // threads would be a burden on a small test machine).
  const Ran ok = run_cli("forward " + cfg + " --out " + out + " --set runtime.threads=2");
  EXPECT_EQ(ok.code, 0) << ok.err;
  std::filesystem::remove_all(out);
  std::remove(cfg.c_str());
}

// Batch sizes from the command line: `tessera run --batch-size 2^63-1` wrapped its batch count
// around and said "0 sequences written" with exit 0; `tessera generate --batch-size` and
// `--threads` took any number. Now: exit 2 and the limit.
TEST(Cli, CommandLineSizesHaveLimits) {
  const std::string out = ::testing::TempDir() + "tessera_cli_batch." + std::to_string(getpid());
  const Ran run = run_cli("run configs/examples/generate_tiny.yaml --quiet --out " + out +
                          " --batch-size 9223372036854775807");
  EXPECT_EQ(run.code, 2) << run.err;
  EXPECT_TRUE(has(run.err, "--batch-size: Value 9223372036854775807 not in range 1 to 65536")) << run.err;
  // Through --set the schema's limit speaks, naming the key.
  const Ran set = run_cli("run configs/examples/generate_tiny.yaml --quiet --out " + out +
                          " --set runtime.batch_size=9223372036854775807");
  EXPECT_EQ(set.code, 2) << set.err;
  EXPECT_TRUE(has(set.err, "runtime.batch_size: 9223372036854775807 is more than the limit 65536")) << set.err;
  EXPECT_FALSE(has(run.out, "0 sequences written")) << run.out;
  EXPECT_FALSE(std::filesystem::exists(out + "/manifest.json"));
  const Ran gen =
      run_cli("generate configs/examples/generate_tiny.yaml --prompt hi --batch-size 9223372036854775807");
  EXPECT_EQ(gen.code, 2) << gen.err;
  EXPECT_TRUE(has(gen.err, "--batch-size")) << gen.err;
  EXPECT_TRUE(has(gen.err, "65536")) << gen.err;
  EXPECT_TRUE(gen.out.empty()) << gen.out;
  const Ran threads = run_cli("generate configs/examples/generate_tiny.yaml --prompt hi --threads 100000");
  EXPECT_EQ(threads.code, 2) << threads.err;
  EXPECT_TRUE(has(threads.err, "--threads")) << threads.err;
  const Ran tokens = run_cli(
      "generate configs/examples/generate_tiny.yaml --prompt hi --max-new-tokens 4611686018427387904");
  EXPECT_EQ(tokens.code, 2) << tokens.err;
  EXPECT_TRUE(has(tokens.err, "--max-new-tokens")) << tokens.err;
  const Ran plan = run_cli("check configs/examples/generate_tiny.yaml --batch 9223372036854775807");
  EXPECT_EQ(plan.code, 2) << plan.err;
  EXPECT_TRUE(has(plan.err, "--batch")) << plan.err;
  std::filesystem::remove_all(out);
}

// A model whose memory plan (weights plus activations, as `tessera check` plans them) is more than
// the machine has is refused with both numbers before anything is allocated: d_model 65536 x 64
// layers needs 12 TiB. Before, its first tensor's allocation failed and the process aborted.
TEST(Cli, AModelLargerThanTheMachineIsRefusedWithBothNumbers) {
  const std::string cfg = temp_file(
      "too_big.yaml",
      "model:\n  d_model: 65536\n  n_layers: 64\n  n_heads: 64\n  stem: {kind: tokens, vocab_size: 16}\n"
      "input:\n  ids: [1, 2, 3]\n");
  const auto t0 = std::chrono::steady_clock::now();
  const Ran r = run_cli("check " + cfg);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(
      std::regex_search(r.err, std::regex("the model needs 12\\.0 TiB \\(13[0-9]{12} bytes\\) of memory "
                                          "\\(weights 12\\.0 TiB \\+ activations [0-9.]+ [KM]iB for a batch "
                                          "of 1 x 3 rows, as `tessera check` plans it\\), but only [0-9.]+ "
                                          "[KMGT]iB \\([0-9]+ bytes\\) is available \\(")))
      << r.err;
  EXPECT_TRUE(has(r.err, "nothing was allocated")) << r.err;
  EXPECT_LT(seconds, 20.0) << "the refusal must come before the model is built";
  EXPECT_TRUE(r.out.empty()) << r.out;
  std::remove(cfg.c_str());
}

// Under `ulimit -v` (300 MB) a model larger than that is refused by its plan, naming the limit;
// before, the first large allocation failed and the process aborted (exit 134).
TEST(Cli, AnAddressSpaceLimitIsPartOfTheMemoryPlan) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer cannot start under an address-space limit (its shadow memory needs it)";
#endif
  const Ran r = run_cli_limited(300000, "check configs/bench/bert_base.yaml");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "the model needs ")) << r.err;
  EXPECT_TRUE(
      has(r.err, "is available (the address-space limit (ulimit -v, RLIMIT_AS) of 293.0 MiB less the "))
      << r.err;
}

// Training is planned too: gradients, the optimizer's state and every layer's activations. Under a
// 1.5 GB address-space limit a BERT-base body (86 M parameters, whose inference plan of 0.4 GiB
// fits) is refused by `tessera train` before any data is read, with both numbers; `tessera check`
// shows the same plan.
TEST(Cli, TrainingIsCheckedAgainstTheMachinesMemory) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer cannot start under an address-space limit (its shadow memory needs it)";
#endif
  const std::string out = ::testing::TempDir() + "tessera_cli_train_oom." + std::to_string(getpid());
  const std::string args = "configs/bench/bert_base_train.yaml --set data.path=" + kSrc +
                           "tests/data/kjv/ruth_jonah.txt --set model.positions.max_len=512";
  const auto t0 = std::chrono::steady_clock::now();
  const Ran r = run_cli_limited(1500000, "train " + args + " --out " + out);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "training the model needs 2.0 GiB")) << r.err;
  EXPECT_TRUE(has(r.err, "(weights 326.7 MiB + gradients, working copy and optimizer state 1.3 GiB + activations "))
      << r.err;
  EXPECT_TRUE(has(r.err, "micro-batch (train.batch_size / train.accumulate)")) << r.err;
  EXPECT_LT(seconds, 20.0) << "the refusal must come before the data is read";
  const Ran check = run_cli("check " + args);
  EXPECT_EQ(check.code, 0) << check.err;
  EXPECT_TRUE(has(check.out, "memory to train              2.0 GiB  (AdamW, micro-batch 8 x 128 rows)")) << check.out;
  std::filesystem::remove_all(out);
}

// Memory that runs out where the plan did not foresee it (here the logits of a long --ids input
// over a large vocabulary: 100 rows x 10^6 tokens x 4 bytes, under a 300 MB address-space limit)
// ends in exit 1 and one line saying so, never an abort or a signal. Before: abort (exit 134).
TEST(Cli, OutOfMemoryEndsInExitOneWithAMessage) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer cannot start under an address-space limit (its shadow memory needs it)";
#endif
  const std::string cfg =
      temp_file("wide_vocab.yaml",
                "model:\n  d_model: 4\n  n_heads: 2\n  stem: {kind: tokens, vocab_size: 1000000}\n"
                "  head: {kind: lm, tied: true}\ninput:\n  ids: [1, 2, 3]\n");
  std::string ids = "1";
  for (int i = 1; i < 100; ++i) {
    ids += ',';  // two appends: GCC 12 warns (-Wrestrict, a false positive) on "," + to_string
    ids += std::to_string(i);
  }
  const std::string out = ::testing::TempDir() + "tessera_cli_oom." + std::to_string(getpid());
  const Ran r = run_cli_limited(300000, "forward " + cfg + " --out " + out + " --ids " + ids);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "out of memory")) << r.err;
  EXPECT_FALSE(has(r.err, "internal check failed")) << r.err;
  std::filesystem::remove_all(out);
  std::remove(cfg.c_str());
}

// A YAML file that is not UTF-8 is refused naming the file, line:col and byte offset (it was
// accepted, its Latin-1 name passed on as it was).
TEST(Cli, ANonUtf8ConfigIsRefused) {
  const std::string cfg = temp_file("latin1.yaml", std::string(kTinyLm) + "  tokens: [caf\xE9]\n");
  const Ran r = run_cli("check " + cfg);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(
      has(r.err, cfg + ":9:15: not UTF-8: the byte 0xE9 at byte offset 182 is not part of a valid UTF-8 "
                       "character"))
      << r.err;
  std::remove(cfg.c_str());
}

// An experiment whose file name is not UTF-8 runs like any other (its name is only bytes to the
// file system); the run folder and the manifest take it.
TEST(Cli, ANonUtf8ExperimentFileNameRuns) {
  const std::string dir = ::testing::TempDir() + "tessera_cli_latin1." + std::to_string(getpid());
  std::filesystem::create_directories(dir + "/generate_tiny");
  std::filesystem::copy_file(kSrc + "configs/examples/generate_tiny/prompts.txt",
                             dir + "/generate_tiny/prompts.txt");
  const std::string cfg = dir + "/tiny_caf\xE9.yaml";
  std::filesystem::copy_file(kSrc + "configs/examples/generate_tiny.yaml", cfg);
  const Ran check = run_cli("check '" + cfg + "'");
  EXPECT_EQ(check.code, 0) << check.err;
  const Ran r = run_cli("run --quiet '" + cfg + "' --out " + dir + "/run");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "3 sequences written")) << r.out;
  std::ifstream manifest(dir + "/run/manifest.json");
  EXPECT_TRUE(manifest.good());
  std::filesystem::remove_all(dir);
}

// A run in a folder whose path is not UTF-8 can be resumed. The manifest records such a path with
// U+FFFD in place of the bad bytes (JSON holds only UTF-8), and resume refused the finished run
// because the prompts file's recorded path no longer matched its path.
TEST(Cli, ARunInANonUtf8FolderResumes) {
  const std::string dir = ::testing::TempDir() + "tessera_cli_caf\xE9." + std::to_string(getpid());
  std::filesystem::create_directories(dir + "/generate_tiny");
  std::filesystem::copy_file(kSrc + "configs/examples/generate_tiny/prompts.txt",
                             dir + "/generate_tiny/prompts.txt");
  // The vocabulary beside it is one of the files the manifest records by path and hash.
  std::filesystem::copy_file(kSrc + "tests/data/text/chars.txt", dir + "/chars.txt");
  std::ifstream in(kSrc + "configs/examples/generate_tiny.yaml");
  std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"{tokenizer: bytes}", "{tokenizer: chars, vocab: chars.txt}"},
           {"vocab_size: 259", "vocab_size: 78"},
           {"stop_ids: [257]", "stop_ids: [2]"}}) {
    ASSERT_NE(yaml.find(from), std::string::npos) << from;
    yaml.replace(yaml.find(from), from.size(), to);
  }
  const std::string cfg = dir + "/tiny.yaml";
  std::ofstream(cfg) << yaml;
  const Ran r = run_cli("run --quiet '" + cfg + "' --out '" + dir + "/run'");
  ASSERT_EQ(r.code, 0) << r.err;
  const Ran again = run_cli("run --quiet '" + cfg + "' --out '" + dir + "/run' --resume");
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_FALSE(has(again.err, "changed since the run started")) << again.err;
  std::filesystem::remove_all(dir);
}
