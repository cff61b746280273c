// The `tessera` command as a user runs it: the seeds' numbers in `explain`, the plan in `check`,
// .npy outputs of `forward`, error messages and exit codes. Runs the built binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include <regex>
#include <sstream>

#include "tessera/npy.h"
#include "tessera/safetensors.h"

namespace {

const std::string kTessera = std::string(TESSERA_BINARY_DIR) + "/tessera";
const std::string kSrc = std::string(TESSERA_SOURCE_DIR) + "/";

struct Ran {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

Ran run_cli(const std::string& args) {
  // One file per process and call: ctest runs the tests of this suite in parallel.
  static int calls = 0;
  const std::string err_file = ::testing::TempDir() + "tessera_cli_stderr." + std::to_string(getpid()) + "." +
                               std::to_string(calls++) + ".txt";
  const std::string cmd = "cd " + kSrc + " && " + kTessera + " " + args + " 2>" + err_file;
  Ran r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(err_file);
  r.err.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  std::remove(err_file.c_str());
  return r;
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
  const Ran r = run_cli("check configs/bench/vit_b16.yaml");
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
  EXPECT_TRUE(has(fit.err, "model.stem.vocab_size: the token plugins' ids take 30555 embedding rows (text 0..30521, "
                           "protein 30522..30554), more than vocab_size 30522")) << fit.err;
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
      R"(^(\S+) +(.+?) +([0-9.]+) ms +([0-9.,]+) +([0-9,]+) +([0-9.,]+) (images/s|s of audio/s|MB/s)$)");
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
  ASSERT_EQ(j["cases"].size(), expected.size());
  for (const auto& c : j["cases"]) {
    EXPECT_GT(c["rate"].get<double>(), 0) << c.dump();
    EXPECT_GT(c["items_per_s"].get<double>(), 0) << c.dump();
    EXPECT_EQ(c["times_s"].size(), 1u) << c.dump();
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

TEST(Cli, HelpForEverySubcommand) {
  for (const char* sub : {"check", "explain", "forward", "bench", "export", "schema", "version", "search"}) {
    const Ran r = run_cli(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_TRUE(has(r.out, "Usage")) << sub << ": " << r.out;
  }
  const Ran none = run_cli("");
  EXPECT_EQ(none.code, 2);
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
    if (id == "jpeg") EXPECT_NE(reason.find("truncated JPEG: the file ends at byte"), std::string::npos) << reason;
    if (id == "wav") EXPECT_NE(reason.find("not a sound file libsndfile can read"), std::string::npos) << reason;
    if (id == "wav_data") EXPECT_NE(reason.find("truncated WAV: its data chunk promises"), std::string::npos) << reason;
    if (id == "fasta") EXPECT_NE(reason.find("'*' (a stop) before the end of the sequence"), std::string::npos) << reason;
    if (id == "latin1") EXPECT_NE(reason.find("UTF-8"), std::string::npos) << reason;
  }
  std::ifstream index(d + "/run/index.jsonl");
  std::string first;
  std::getline(index, first);
  EXPECT_EQ(first, "{\"id\":\"good\",\"item\":5,\"rows\":5}");
  fs::remove_all(d);
}
