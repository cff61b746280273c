// Batch runs: datasets of every format, outputs that do not depend on batch size or packing, bad
// items recorded while the run goes on, a run killed with SIGKILL and resumed giving byte-identical
// outputs, refusals to resume a changed run, and the heatmap PNGs. Uses the probe test plugin.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "run/heatmap.h"
#include "test_util.h"
#include "tessera/fileio.h"
#include "tessera/npy.h"
#include "tessera/run.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

const std::string kPluginDir = TESSERA_TEST_PLUGIN_DIR;

// A suffix for run folders of tests whose death-test child (a new process: its own pid) must find
// the parent's folder: the same in both, and different for another build tree running its tests
// on the same machine at the same time.
std::string build_tag() {
  std::string tag = "_";  // appended, not "_" + ...: GCC 12 gives a false -Wrestrict for that
  tag += std::to_string(std::hash<std::string>{}(TESSERA_BINARY_DIR));
  return tag;
}

std::string temp_dir(const std::string& name) { return testing_util::fresh_temp_dir("tessera_run_" + name); }
void write(const std::string& path, const std::string& text) { testing_util::write_text(path, text); }
using testing_util::slurp;

// A small embedding experiment over `data` with the probe plugin (bytes as ids).
Experiment experiment(const std::string& dir, const std::string& data, const std::string& extra = "") {
  const std::string yaml = "plugins:\n  - name: probe\n    path: " + kPluginDir +
                           "\nmodel:\n  d_model: 16\n  n_heads: 2\n  n_layers: 2\n  stem: {kind: tokens, vocab_size: 300}\n"
                           "  positions: {kind: learned, max_len: 512}\n  head: {kind: pool, pool: mean}\n"
                           "data:\n  path: " + data + "\n" + extra;
  Diagnostics d;
  std::optional<Experiment> e = load_experiment_from_string(yaml, "exp.yaml", dir, {}, &d);
  EXPECT_TRUE(e) << d.str();
  return *e;
}

RunSummary run_ok(const Experiment& e, const std::string& out, bool resume = false) {
  RunOptions o;
  o.out_dir = out;
  o.resume = resume;
  o.progress = false;
  Result<RunSummary> r = run_experiment(e, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : RunSummary{};
}

std::string lines_file(const std::string& dir, int n) {
  std::string text;
  for (int i = 0; i < n; ++i) text += "line " + std::to_string(i) + (i % 7 == 3 ? " FAIL" : "") + std::string(static_cast<size_t>(i % 13), 'x') + "\n";
  write(dir + "/lines.txt", text);
  return dir + "/lines.txt";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Datasets

TEST(Datasets, EveryFormatListsItemsWithStableIds) {
  const std::string d = temp_dir("formats");
  const std::vector<PluginInput> text{{"probe", TSR_INPUT_TEXT, {".txt"}}};
  write(d + "/a.txt", "first\n\nthird\r\n");
  auto lines = read_dataset({d + "/a.txt", {}, DataFormat::auto_detect, 0}, text);
  ASSERT_TRUE(lines.ok()) << lines.status().message();
  ASSERT_EQ(lines->size(), 2u);  // the empty line is no item
  EXPECT_EQ((*lines)[1].id, "a.txt:3");
  EXPECT_EQ((*lines)[1].parts[0].length, 5u);  // "third" without \r\n
  EXPECT_EQ((*lines)[1].parts[0].line, 3u);

  write(d + "/p.fasta", ">sp|P1 first\nMKV\nLLA\n\n>P2\nMA*\n");
  auto fasta = read_dataset({d + "/p.fasta", {}, DataFormat::auto_detect, 0}, text);
  ASSERT_TRUE(fasta.ok()) << fasta.status().message();
  ASSERT_EQ(fasta->size(), 2u);
  EXPECT_EQ((*fasta)[0].id, "p.fasta#1");
  EXPECT_EQ((*fasta)[0].name, "sp|P1");
  EXPECT_EQ((*fasta)[1].parts[0].line, 5u);
  EXPECT_EQ((*fasta)[0].parts[0].length, std::string(">sp|P1 first\nMKV\nLLA\n\n").size());
  write(d + "/junk.fa", "MKV\n>P1\nMA\n");
  write(d + "/genes.fna", ">g1\nACGT\n>g2\nTTGA\n");
  auto fna = read_dataset({d + "/genes.fna", {}, DataFormat::auto_detect, 0}, text);
  ASSERT_TRUE(fna.ok()) << fna.status().message();
  EXPECT_EQ(fna->size(), 2u);  // .fna is FASTA too
  EXPECT_EQ((*fna)[1].id, "genes.fna#2");
  auto junk = read_dataset({d + "/junk.fa", {}, DataFormat::auto_detect, 0}, text);
  ASSERT_TRUE(junk.ok());
  EXPECT_EQ((*junk)[0].error, d + "/junk.fa:1:1: sequence data before the first '>' header line (every FASTA record starts with '>name')");
  EXPECT_EQ((*junk)[1].id, "junk.fa#1");

  fs::create_directories(d + "/docs/sub");
  write(d + "/docs/b.txt", "b");
  write(d + "/docs/sub/a.txt", "a");
  write(d + "/docs/skip.bin", "?");
  auto dir = read_dataset({d + "/docs", {}, DataFormat::auto_detect, 0}, text);
  ASSERT_TRUE(dir.ok());
  ASSERT_EQ(dir->size(), 2u);
  EXPECT_EQ((*dir)[0].id, "b.txt");
  EXPECT_EQ((*dir)[1].id, "sub/a.txt");
  auto glob = read_dataset({d + "/docs/*.txt", {}, DataFormat::auto_detect, 0}, text);
  ASSERT_TRUE(glob.ok());
  ASSERT_EQ(glob->size(), 1u);
  EXPECT_EQ((*glob)[0].id, "b.txt");

  write(d + "/m.csv", "id,text,label\nx1,\"a, quoted\"\"text\",pos\nx2,plain,neg\nx3,too,many,fields\n");
  auto csv = read_dataset({d + "/m.csv", {}, DataFormat::auto_detect, 0}, text);
  ASSERT_TRUE(csv.ok()) << csv.status().message();
  ASSERT_EQ(csv->size(), 3u);
  EXPECT_EQ((*csv)[0].parts[0].text, "a, quoted\"text");
  EXPECT_EQ((*csv)[0].label, std::optional<std::string>("pos"));
  EXPECT_EQ((*csv)[2].error, d + "/m.csv:4: 4 fields, but the header names 3 columns");
  write(d + "/m.jsonl", "{\"text\": \"hello\", \"label\": 1}\nnot json\n{\"path\": \"docs/b.txt\"}\n{\"path\": \"nope.txt\"}\n");
  auto jsonl = read_dataset({d + "/m.jsonl", {}, DataFormat::auto_detect, 0}, text);
  ASSERT_TRUE(jsonl.ok()) << jsonl.status().message();
  ASSERT_EQ(jsonl->size(), 4u);
  EXPECT_EQ((*jsonl)[0].label, std::optional<std::string>("1"));
  EXPECT_EQ((*jsonl)[1].error, d + "/m.jsonl:2: not a JSON object (each line of a .jsonl manifest is one)");
  EXPECT_EQ((*jsonl)[2].parts[0].path, d + "/docs/b.txt");
  EXPECT_EQ((*jsonl)[3].error, "m.jsonl:4: " + d + "/nope.txt: no such file");

  auto limited = read_dataset({d + "/p.fasta", {}, DataFormat::auto_detect, 1}, text);
  EXPECT_EQ(limited->size(), 1u);
}

TEST(Datasets, RefusalsNameTheProblem) {
  const std::string d = temp_dir("refusals");
  const std::vector<PluginInput> text{{"probe", TSR_INPUT_TEXT, {".txt"}}};
  const std::vector<PluginInput> image{{"image", TSR_INPUT_FILE, {".png"}}};
  EXPECT_EQ(read_dataset({"", {}, DataFormat::auto_detect, 0}, text).status().message(),
            "no dataset: set data.path (a directory, glob, manifest, FASTA or text file)");
  EXPECT_EQ(read_dataset({d + "/none.txt", {}, DataFormat::auto_detect, 0}, text).status().message(),
            d + "/none.txt: no such file or directory");
  EXPECT_EQ(read_dataset({d + "/*.png", {}, DataFormat::auto_detect, 0}, image).status().message(),
            d + "/*.png: the glob matches no file");
  write(d + "/x.txt", "a\n");
  EXPECT_EQ(read_dataset({d + "/x.txt", {}, DataFormat::auto_detect, 0}, image).status().message(),
            d + "/x.txt is read as lines of text, but plugin image reads files (point data.path at a directory or a "
                "manifest instead)");
  write(d + "/q.csv", "text\n\"open quote\n");
  EXPECT_EQ(read_dataset({d + "/q.csv", {}, DataFormat::auto_detect, 0}, text).status().message(),
            d + "/q.csv: line 2: a quoted field is not closed before the end of the file");
  write(d + "/dup.csv", "id,text\na,x\na,y\n");
  EXPECT_EQ(read_dataset({d + "/dup.csv", {}, DataFormat::auto_detect, 0}, text).status().message(),
            d + "/dup.csv: item id \"a\" appears twice (ids must be unique)");
}

// ---------------------------------------------------------------------------------------------
// Runs

TEST(Runs, OutputsDoNotDependOnBatchSizeOrPacking) {
  const std::string d = temp_dir("batching");
  const std::string data = lines_file(d, 23);
  std::vector<Tensor> embeddings;
  std::vector<std::string> indexes;
  for (const char* extra : {"runtime: {batch_size: 1}\n", "runtime: {batch_size: 5}\n",
                                   "runtime: {batch_size: 8, packing: true}\n", "runtime: {batch_size: 6, workers: 3}\n"}) {
    const Experiment e = experiment(d, data, extra);
    const std::string out = d + "/run" + std::to_string(embeddings.size());
    const RunSummary s = run_ok(e, out);
    EXPECT_EQ(s.items, 23);
    EXPECT_EQ(s.failed, 3);  // lines 3, 10 and 17 say FAIL
    EXPECT_EQ(s.sequences, 20);
    // Where the time went: parts of the whole, each measured.
    EXPECT_GT(s.setup_seconds, 0);
    EXPECT_GT(s.model_seconds, 0);
    EXPECT_GE(s.wait_seconds, 0);
    EXPECT_LE(s.setup_seconds + s.model_seconds + s.wait_seconds, s.seconds);
    embeddings.push_back(npy::load(out + "/embeddings.npy").value());
    indexes.push_back(slurp(out + "/index.jsonl"));
    EXPECT_NE(slurp(out + "/errors.jsonl").find("{\"file\":\"" + data + "\",\"id\":\"lines.txt:4\",\"item\":3,"),
              std::string::npos);
  }
  for (size_t i = 1; i < embeddings.size(); ++i) {
    ASSERT_EQ(embeddings[i].shape(), Shape({20, 16}));
    const auto a = embeddings[0].to_vector(), b = embeddings[i].to_vector();
    for (size_t j = 0; j < a.size(); ++j) ASSERT_NEAR(a[j], b[j], 1e-5) << "run " << i << " value " << j;
    EXPECT_EQ(indexes[i], indexes[0]);
  }
}

TEST(Runs, BadItemsAreRecordedAndTheRunGoesOn) {
  const std::string d = temp_dir("bad");
  write(d + "/m.jsonl", "{\"id\": \"ok\", \"text\": \"fine\"}\n{\"id\": \"boom\", \"text\": \"THROW\"}\n"
                        "{\"id\": \"bad\", \"text\": \"FAIL\"}\nnot json\n{\"id\": \"ok2\", \"text\": \"also fine\"}\n");
  const RunSummary s = run_ok(experiment(d, d + "/m.jsonl"), d + "/run");
  EXPECT_EQ(s.failed, 3);
  EXPECT_EQ(s.sequences, 2);
  const std::string errors = slurp(d + "/run/errors.jsonl");
  EXPECT_NE(errors.find("{\"id\":\"boom\",\"item\":1,\"reason\":\"internal error: thrown from inside the plugin\"}"),
            std::string::npos) << errors;
  EXPECT_NE(errors.find("\"reason\":\"bad: the text says FAIL at byte 0\""), std::string::npos) << errors;
  EXPECT_NE(errors.find("not a JSON object"), std::string::npos) << errors;
  const std::string index = slurp(d + "/run/index.jsonl");
  EXPECT_EQ(index, "{\"id\":\"ok\",\"item\":0,\"rows\":4}\n{\"id\":\"ok2\",\"item\":4,\"rows\":9}\n");
}

TEST(Runs, ProvenanceAndAttentionExport) {
  const std::string d = temp_dir("export");
  write(d + "/t.txt", "héllo\n");
  const RunSummary s = run_ok(experiment(d, d + "/t.txt", "task: {kind: hidden, attention: {layers: [1], heads: [0]}}\n"),
                              d + "/run");
  EXPECT_EQ(s.sequences, 1);
  const Tensor hidden = npy::load(d + "/run/hidden.npy").value();
  EXPECT_EQ(hidden.shape(), Shape({6, 16}));  // é is two bytes: 6 byte rows
  const std::string rows = slurp(d + "/run/rows.jsonl");
  EXPECT_NE(rows.find("{\"bytes\":[1,2],\"pos\":[1,-1],\"role\":\"content\",\"token\":"), std::string::npos) << rows;
  std::vector<std::string> files;
  for (const auto& f : fs::directory_iterator(d + "/run/attention")) files.push_back(f.path().filename().string());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_NE(files[0].find("t.txt_1-"), std::string::npos);
  EXPECT_NE(files[0].find(".layer1.head0.png"), std::string::npos);
  const Tensor maps = npy::load(d + "/run/attention/" + files[1]).value();
  EXPECT_EQ(maps.shape(), Shape({1, 6, 6}));
  for (int64_t i = 0; i < 6; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < 6; ++j) sum += maps.at({0, i, j});
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  const std::string png = slurp(d + "/run/attention/" + files[0]);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(Runs, KilledAndResumedGivesByteIdenticalOutputs) {
  // The run to kill happens in a fresh process: a "threadsafe" death test re-executes this binary
  // and runs this test up to EXPECT_EXIT there (a plain fork() could inherit a lock held by a
  // thread of an earlier test). That process must find the same folder, so it has no pid in it.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string d = ::testing::TempDir() + "tessera_run_resume" + build_tag();
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string data = lines_file(d, 40);
  const std::string extra = "runtime: {batch_size: 3}\ntask: {kind: embed, attention: {layers: [0]}}\n";
  // Killed with SIGKILL right after its fourth batch is committed.
  EXPECT_EXIT(
      {
        const Experiment e = experiment(d, data, extra);
        RunOptions o;
        o.out_dir = d + "/killed";
        o.progress = false;
        o.on_batch = [](int64_t done, int64_t) {
          if (done == 4) raise(SIGKILL);
        };
        (void)run_experiment(e, o);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "");
  EXPECT_TRUE(fs::exists(d + "/killed/shards"));
  EXPECT_FALSE(fs::exists(d + "/killed/embeddings.npy"));

  const Experiment e = experiment(d, data, extra);
  // Not without --resume, and not with a changed configuration.
  RunOptions plain;
  plain.out_dir = d + "/killed";
  plain.progress = false;
  Result<RunSummary> refused = run_experiment(e, plain);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("already holds a run (manifest.json): continue it with --resume"),
            std::string::npos) << refused.status().message();
  RunOptions resume = plain;
  resume.resume = true;
  Result<RunSummary> changed = run_experiment(experiment(d, data, "runtime: {batch_size: 4}\n"), resume);
  ASSERT_FALSE(changed.ok());
  EXPECT_NE(changed.status().message().find("cannot resume " + d + "/killed: the experiment's configuration changed"),
            std::string::npos) << changed.status().message();

  const RunSummary resumed = run_ok(e, d + "/killed", true);
  EXPECT_EQ(resumed.batches_resumed, 4);
  run_ok(e, d + "/straight");
  // Every output file, byte for byte.
  std::vector<std::string> names;
  for (const auto& f : fs::recursive_directory_iterator(d + "/straight"))
    if (f.is_regular_file()) names.push_back(fs::relative(f.path(), d + "/straight").string());
  std::sort(names.begin(), names.end());
  EXPECT_GT(names.size(), 40u);
  for (const std::string& n : names) {
    ASSERT_TRUE(fs::exists(d + "/killed/" + n)) << n;
    if (n == "manifest.json") continue;  // names its own folder's experiment; compared below
    EXPECT_EQ(slurp(d + "/killed/" + n), slurp(d + "/straight/" + n)) << n;
  }
  EXPECT_EQ(slurp(d + "/killed/manifest.json"), slurp(d + "/straight/manifest.json"));
  EXPECT_FALSE(fs::exists(d + "/killed/shards"));

  // Resuming a finished run does nothing and leaves it as it is.
  const std::string manifest = slurp(d + "/straight/manifest.json");
  const RunSummary again = run_ok(e, d + "/straight", true);
  EXPECT_EQ(again.sequences, resumed.sequences);
  EXPECT_EQ(again.failed, resumed.failed);
  EXPECT_EQ(slurp(d + "/straight/manifest.json"), manifest);
  // ... and refuses when a plugin's version is not the one that ran.
  nlohmann::json m = nlohmann::json::parse(manifest);
  const std::string version = m["plugins"][0]["version"];
  m["plugins"][0]["version"] = "0.0.1";
  write(d + "/straight/manifest.json", m.dump(2));
  RunOptions again_opt;
  again_opt.out_dir = d + "/straight";
  again_opt.resume = true;
  again_opt.progress = false;
  Result<RunSummary> other = run_experiment(e, again_opt);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("the plugins changed since the run started (probe 0.0.1 then, probe " + version +
                                          " now)"),
            std::string::npos)
      << other.status().message();
}

// Generation over a dataset: each item's completion does not depend on the batch it is decoded in
// (every item samples from its own seeded generator), and a run killed midway and resumed ends
// byte-identical to one that was not.
TEST(Runs, GenerateIsTheSameInAnyBatchAndResumesByteIdentical) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // as in KilledAndResumedGivesByteIdenticalOutputs
  const std::string d = ::testing::TempDir() + "tessera_run_generate" + build_tag();
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string data = lines_file(d, 12);  // lines 3 and 10 say FAIL
  auto experiment_with = [&](int batch_size) {
    const std::string yaml =
        "plugins:\n  - name: probe\n    path: " + kPluginDir +
        "\nmodel:\n  arch: decoder\n  d_model: 16\n  n_heads: 2\n  n_layers: 2\n  stem: {kind: tokens, vocab_size: 257}\n"
        "  positions: {kind: rotary}\n  head: {kind: lm}\ndata:\n  path: " + data +
        "\nruntime: {batch_size: " + std::to_string(batch_size) + "}\n"
        "task:\n  kind: generate\n  generate: {max_new_tokens: 6, temperature: 0.9, top_k: 20, seed: 5}\n";
    Diagnostics diags;
    std::optional<Experiment> e = load_experiment_from_string(yaml, "gen.yaml", d, {}, &diags);
    EXPECT_TRUE(e) << diags.str();
    return *e;
  };
  EXPECT_EXIT(
      {
        RunOptions o;
        o.out_dir = d + "/killed";
        o.progress = false;
        o.on_batch = [](int64_t done, int64_t) {
          if (done == 2) raise(SIGKILL);
        };
        (void)run_experiment(experiment_with(3), o);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "");
  const RunSummary resumed = run_ok(experiment_with(3), d + "/killed", true);
  EXPECT_EQ(resumed.batches_resumed, 2);
  EXPECT_EQ(resumed.sequences, 10);
  EXPECT_EQ(resumed.failed, 2);
  run_ok(experiment_with(3), d + "/straight");
  for (const char* f : {"completions.jsonl", "errors.jsonl", "rows.jsonl", "manifest.json"})
    EXPECT_EQ(slurp(d + "/killed/" + f), slurp(d + "/straight/" + f)) << f;
  // One item per batch: the same completions.
  run_ok(experiment_with(1), d + "/one");
  const std::string completions = slurp(d + "/straight/completions.jsonl");
  EXPECT_EQ(slurp(d + "/one/completions.jsonl"), completions);
  std::istringstream lines(completions);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["finish_reason"], "length");  // no stop token or string here: 6 new tokens each
    EXPECT_EQ(j["ids"].size(), 6u);
  }
  EXPECT_EQ(n, 10);
  fs::remove_all(d);
}

TEST(Runs, SequencesLongerThanThePositionsAreBadItems) {
  const std::string d = temp_dir("long");
  write(d + "/t.txt", "short\nthis line is far too long\nok\n");
  Experiment e = experiment(d, d + "/t.txt", "runtime: {batch_size: 3}\n");
  e.model.positions.max_len = 10;
  const RunSummary s = run_ok(e, d + "/run");
  EXPECT_EQ(s.sequences, 2);
  EXPECT_EQ(s.failed, 1);
  const std::vector<std::string> lines = {slurp(d + "/run/errors.jsonl")};
  EXPECT_NE(lines[0].find("\"id\":\"t.txt:2\",\"item\":1,\"reason\":\"25 rows, more than model.positions.max_len (10): "
                          "give the plugin a maximum length and a length policy (truncate, windows), or raise max_len\""),
            std::string::npos) << lines[0];
}

TEST(Datasets, ManifestsMayStartWithAByteOrderMark) {
  const std::string d = temp_dir("bom");
  const std::vector<PluginInput> text{{"probe", TSR_INPUT_TEXT, {".txt"}}};
  write(d + "/m.csv", "\xEF\xBB\xBFid,text\nfirst,hello\n");
  write(d + "/m.jsonl", "\xEF\xBB\xBF{\"id\": \"first\", \"text\": \"hello\"}\n");
  for (const char* leaf : {"/m.csv", "/m.jsonl"}) {
    auto items = read_dataset({d + leaf, {}, DataFormat::auto_detect, 0}, text);
    ASSERT_TRUE(items.ok()) << items.status().message();
    ASSERT_EQ(items->size(), 1u);
    EXPECT_EQ((*items)[0].id, "first") << leaf;
    EXPECT_EQ((*items)[0].error, "") << leaf;
  }
}

TEST(Runs, ScoreNeedsACausalModelAndWritesAnyTokenAsUtf8) {
  const std::string d = temp_dir("score");
  write(d + "/t.txt", "h\xC3\xA9llo\n");
  const std::string yaml = "plugins:\n  - name: text\n    options: {tokenizer: bytes}\n"
                           "model:\n  arch: decoder\n  d_model: 16\n  n_heads: 2\n  n_layers: 1\n"
                           "  stem: {kind: tokens, vocab_size: 259}\n  positions: {kind: learned, max_len: 64}\n"
                           "  head: {kind: lm, tied: true}\ndata:\n  path: " + d + "/t.txt\ntask: {kind: score, top_k: 259}\n";
  for (bool causal : {true, false}) {
    Diagnostics diags;
    LoadOptions lo;
    if (!causal) lo.overrides = {"model.causal=false"};
    std::optional<Experiment> e = load_experiment_from_string(yaml, "s.yaml", d, lo, &diags);
    ASSERT_TRUE(e) << diags.str();
    ASSERT_EQ(e->model.causal, causal);
    RunOptions o;
    o.out_dir = d + (causal ? "/run" : "/run_enc");
    o.progress = false;
    Result<RunSummary> r = run_experiment(*e, o);
    if (!causal) {
      ASSERT_FALSE(r.ok());
      EXPECT_NE(r.status().message().find("task.kind score needs a causal model"), std::string::npos) << r.status().message();
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->failed, 0);
    // Every byte is among the top 259 next tokens, lone bytes 0x80..0xFF included: written as U+FFFD.
    const std::string p = slurp(o.out_dir + "/predictions.jsonl");
    const nlohmann::json j = nlohmann::json::parse(p);
    EXPECT_NE(p.find("\xEF\xBF\xBD"), std::string::npos);
    EXPECT_TRUE(j.contains("id")) << p.substr(0, 300);
  }
}

TEST(Runs, RefusesPluginsThatDoNotFitTheModel) {
  const std::string d = temp_dir("fit");
  write(d + "/t.txt", "x\n");
  Experiment e = experiment(d, d + "/t.txt");
  e.model.stem.vocab_size = 100;  // the probe's ids go to 257
  RunOptions o;
  o.out_dir = d + "/run";
  o.progress = false;
  Result<RunSummary> r = run_experiment(e, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("plugins[0]: plugin probe's vocabulary has 257 ids, more than model.stem.vocab_size "
                                      "(100) (raise stem.vocab_size, or give the plugin the model's vocabulary)"),
            std::string::npos) << r.status().message();
}

TEST(Heatmaps, BoxesAreColouredOverThePicture) {
  TokenRows rows;
  rows.picture.width = 4;
  rows.picture.height = 2;
  rows.picture.channels = 1;
  rows.picture.pixels.assign(8, 200);
  rows.picture.x1 = 4;
  rows.picture.y1 = 2;
  rows.roles = {TSR_ROLE_CLS, TSR_ROLE_CONTENT, TSR_ROLE_CONTENT};
  rows.provenance = {{TSR_PROV_NONE, 0, 0, 0, 0, 0}, {TSR_PROV_PIXELS, 0, 0, 2, 0, 2}, {TSR_PROV_PIXELS, 0, 2, 4, 0, 2}};
  const run::RgbImage img = run::heatmap_over_picture(rows, {0.5f, 0.1f, 0.9f});
  ASSERT_EQ(img.width, 4);
  uint8_t low[3], high[3];
  run::colormap(0.0, low);
  run::colormap(1.0, high);
  // Left half shows the lowest weight's colour, right half the highest's, blended over grey 100.
  EXPECT_EQ(img.pixels[0], static_cast<uint8_t>(std::lround(0.35 * 100 + 0.65 * low[0])));
  EXPECT_EQ(img.pixels[3 * 3 + 1], static_cast<uint8_t>(std::lround(0.35 * 100 + 0.65 * high[1])));
  Result<std::string> png = run::encode_png(img);
  ASSERT_TRUE(png.ok());
  EXPECT_EQ(png->substr(12, 4), "IHDR");
  EXPECT_EQ(static_cast<unsigned char>((*png)[19]), 4);  // width, big-endian
  EXPECT_EQ(static_cast<unsigned char>((*png)[23]), 2);  // height
}

// ---------------------------------------------------------------------------------------------
// Several modalities: the quickstart (four real plugins, one multimodal item) and the stem layout.

namespace {

const std::string kQuickstart = std::string(TESSERA_SOURCE_DIR) + "/configs/experiments/quickstart.yaml";

std::vector<nlohmann::json> jsonl(const std::string& path) {
  std::vector<nlohmann::json> v;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) v.push_back(nlohmann::json::parse(line));
  return v;
}

}  // namespace

TEST(Multimodal, QuickstartEncodesFourModalitiesAndACaptionedPhoto) {
  const std::string d = temp_dir("quickstart");
  Diagnostics diags;
  std::optional<Experiment> e = load_experiment(kQuickstart, {}, &diags);
  ASSERT_TRUE(e) << diags.str();
  const RunSummary s = run_ok(*e, d + "/run");
  EXPECT_EQ(s.items, 10);
  EXPECT_EQ(s.sequences, 10);
  EXPECT_EQ(s.failed, 0);
  const Tensor emb = npy::load(d + "/run/embeddings.npy").value();
  ASSERT_EQ(emb.shape(), Shape({10, 64}));
  for (int64_t i = 0; i < emb.numel(); ++i) ASSERT_TRUE(std::isfinite(emb.data<float>()[i]));

  // Each item's rows come from the plugins it has, in plugin order; token ids sit in their
  // plugin's block (WordPiece 0..30521, ESM-2 from 30522); feature rows carry pixels or seconds.
  std::map<std::string, nlohmann::json> rows;
  for (const nlohmann::json& r : jsonl(d + "/run/rows.jsonl")) rows[r["id"]] = r["rows"];
  ASSERT_EQ(rows.size(), 10u);
  auto plugins_of = [&](const std::string& id) {
    std::vector<int> seen;
    for (const auto& r : rows.at(id))
      if (seen.empty() || seen.back() != r["plugin"].get<int>()) seen.push_back(r["plugin"]);
    return seen;
  };
  EXPECT_EQ(plugins_of("photo/cat"), std::vector<int>({0}));
  EXPECT_EQ(plugins_of("speech/cards"), std::vector<int>({1}));
  EXPECT_EQ(plugins_of("text/genesis"), std::vector<int>({2}));
  EXPECT_EQ(plugins_of("protein/P38519"), std::vector<int>({3}));
  EXPECT_EQ(plugins_of("captioned/cat"), std::vector<int>({0, 2}));
  const nlohmann::json& photo = rows.at("photo/cat");
  const nlohmann::json& captioned = rows.at("captioned/cat");
  ASSERT_EQ(photo.size(), 197u);  // CLS + 14 x 14 patches
  for (size_t i = 0; i < photo.size(); ++i) EXPECT_EQ(captioned[i], photo[i]) << i;
  // "a tabby cat looks up at the camera": [CLS] a tab ##by cat looks up at the camera [SEP]
  std::vector<int> caption;
  for (size_t i = photo.size(); i < captioned.size(); ++i) caption.push_back(captioned[i]["token"]);
  EXPECT_EQ(caption, std::vector<int>({101, 1037, 21628, 3762, 4937, 3504, 2039, 2012, 1996, 4950, 102}));
  EXPECT_EQ(captioned[photo.size() + 2]["bytes"], nlohmann::json::array({2, 5}));  // "tab"
  const nlohmann::json& protein = rows.at("protein/P38519");
  ASSERT_EQ(protein.size(), 107u + 2);
  EXPECT_EQ(protein.front()["token"], 30522 + 0);  // <cls>
  EXPECT_EQ(protein[1]["token"], 30522 + 20);      // M
  EXPECT_EQ(protein[1]["residues"], nlohmann::json::array({0, 1}));
  EXPECT_EQ(protein.back()["token"], 30522 + 2);   // <eos>
  for (const auto& r : rows.at("speech/cards")) {
    EXPECT_FALSE(r.contains("token"));
    EXPECT_TRUE(r.contains("seconds") && r.contains("mel_bands")) << r;
  }
  // The caption changes the photo's vector.
  double diff = 0;
  for (int64_t c = 0; c < 64; ++c) diff += std::abs(emb.at({0, c}) - emb.at({9, c}));
  EXPECT_GT(diff, 1e-3);
  // Heatmaps for every item: two heads of layer 1.
  int pngs = 0;
  for (const auto& f : fs::directory_iterator(d + "/run/attention")) pngs += f.path().extension() == ".png";
  EXPECT_EQ(pngs, 20);
}

TEST(Multimodal, EachPluginHasItsOwnBlockOfTheStem) {
  tsr_encoder_info text{}, image{}, protein{}, audio{};
  text.rows_kind = protein.rows_kind = TSR_ROWS_IDS;
  image.rows_kind = audio.rows_kind = TSR_ROWS_FEATURES;
  text.vocab_size = 30522, protein.vocab_size = 33, image.width = 768, audio.width = 256;
  const StemLayout L = stem_layout({image, audio, text, protein});
  EXPECT_EQ(L.id_offset, std::vector<int64_t>({0, 0, 0, 30522}));
  EXPECT_EQ(L.column, std::vector<int64_t>({0, 768, 0, 0}));
  EXPECT_EQ(L.vocab, 30555);
  EXPECT_EQ(L.width, 1024);

  // A model too small for the blocks is refused at the key that must grow, with the layout.
  const std::string d = temp_dir("layout");
  fs::copy(fs::path(kQuickstart).parent_path() / "quickstart", d + "/quickstart");
  const std::string yaml = slurp(kQuickstart);
  for (const auto& [edit, want] : std::vector<std::pair<std::string, std::string>>{
           {"vocab_size: 30522,",
            "model.stem.vocab_size: the token plugins' ids take 30555 embedding rows (text "
            "0..30521, protein 30522..30554), more than vocab_size 30522 (each token plugin has its own block of ids: "
            "raise vocab_size to at least 30555)"},
           {"n_features: 768,",
            "model.stem.n_features: the feature plugins' rows fill 1024 columns (image 0..767, "
            "audio 768..1023), but the model reads 768 (each feature plugin has its own columns: make n_features "
            "their sum, 1024)"}}) {
    std::string text = yaml;
    const std::string key = edit.substr(0, edit.find(':'));
    const size_t at = text.find(key + ": ");
    text.replace(at, text.find(',', at) + 1 - at, edit);
    const size_t bol = text.rfind('\n', at) + 1;
    const std::string place = "q.yaml:" + std::to_string(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n') + 1) +
                              ":" + std::to_string(at - bol + 1) + ": ";
    write(d + "/q.yaml", text);
    Diagnostics diags;
    std::optional<Experiment> e = load_experiment(d + "/q.yaml", {}, &diags);
    ASSERT_TRUE(e) << diags.str();
    check_plugins_fit(*e, &diags);
    EXPECT_NE(diags.str().find(place + want), std::string::npos) << place << "\n" << diags.str();
  }
}

TEST(Multimodal, ItemsWithoutSomeInputsNeedAllowMissing) {
  const std::string d = temp_dir("missing");
  fs::copy(fs::path(kQuickstart).parent_path() / "quickstart", d + "/quickstart");
  write(d + "/quickstart/items.csv",
        "id,image,audio,text,protein\nboth,cat.jpg,,a cat,\nnone,,,,\ntext,,,a line,\n");
  fs::copy_file(kQuickstart, d + "/q.yaml");
  for (bool allow : {true, false}) {
    LoadOptions o;
    o.overrides = {std::string("data.allow_missing=") + (allow ? "true" : "false"), "task.attention.layers=[]"};
    Diagnostics diags;
    std::optional<Experiment> e = load_experiment(d + "/q.yaml", o, &diags);
    ASSERT_TRUE(e) << diags.str();
    RunOptions ro;
    ro.out_dir = d + "/run" + (allow ? "1" : "0");
    ro.progress = false;
    Result<RunSummary> r = run_experiment(*e, ro);
    ASSERT_TRUE(r.ok()) << r.status().message();
    const std::vector<nlohmann::json> errors = jsonl(ro.out_dir + "/errors.jsonl");
    if (allow) {
      EXPECT_EQ(r->sequences, 2);
      ASSERT_EQ(errors.size(), 1u);
      EXPECT_EQ(errors[0]["id"], "none");
      EXPECT_EQ(errors[0]["file"], d + "/quickstart/items.csv");
      EXPECT_NE(errors[0]["reason"].get<std::string>().find(
                    "no input for any plugin (give at least one of the fields `image`, `audio`, `text`, `protein`)"),
                std::string::npos)
          << errors[0];
    } else {
      EXPECT_EQ(r->sequences, 0);
      ASSERT_EQ(errors.size(), 3u);
      EXPECT_NE(errors[0]["reason"].get<std::string>().find(
                    "items.csv:2: no input for plugin audio (give a `audio` field; or set data.allow_missing: true to "
                    "encode items from the inputs they have)"),
                std::string::npos)
          << errors[0];
      EXPECT_EQ(errors[0]["file"], d + "/quickstart/items.csv");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// hidden: index.jsonl's `start` is each sequence's first row in hidden.npy, counted over the whole
// run (not within its batch), so that any reader of hidden.npy finds every item's own rows.

namespace {

struct HiddenRun {
  std::vector<nlohmann::json> index;
  Tensor hidden;
  std::map<std::string, std::vector<float>> rows;  // per id: its rows of hidden.npy, read back by start
};

// Reads a hidden run back: every `start` is the sum of the rows before it, the rows fill
// hidden.npy exactly, and each id's rows are hidden.npy[start, start + rows).
HiddenRun read_hidden(const std::string& out) {
  HiddenRun h;
  h.index = jsonl(out + "/index.jsonl");
  h.hidden = npy::load(out + "/hidden.npy").value();
  const int64_t C = h.hidden.dim(1);
  int64_t next = 0;
  for (const nlohmann::json& r : h.index) {
    const int64_t start = r["start"], n = r["rows"];
    EXPECT_EQ(start, next) << out << ": " << r;
    next += n;
    if (start < 0 || start + n > h.hidden.dim(0)) {
      ADD_FAILURE() << out << ": " << r << " is outside hidden.npy's " << h.hidden.dim(0) << " rows";
      continue;
    }
    const float* p = h.hidden.data<float>() + start * C;
    h.rows[r["id"]] = std::vector<float>(p, p + n * C);
  }
  EXPECT_EQ(next, h.hidden.dim(0)) << out;
  return h;
}

// How far two runs that differ only in batch size, packing, threads or workers may be apart: per
// output row, relative to its largest magnitude (docs/RUNS.md; BatchInvariance below).
constexpr double kRowBound = 4e-6;

// The largest difference between the rows of one run's items and another's, relative to each
// row's largest magnitude.
double max_relative_row_difference(const HiddenRun& a, const HiddenRun& b, int64_t C) {
  double worst = 0;
  EXPECT_EQ(a.rows.size(), b.rows.size());
  for (const auto& [id, x] : a.rows) {
    auto it = b.rows.find(id);
    if (it == b.rows.end()) {
      ADD_FAILURE() << id << " missing";
      continue;
    }
    const std::vector<float>& y = it->second;
    if (x.size() != y.size()) {
      ADD_FAILURE() << id << ": " << x.size() << " values, then " << y.size();
      continue;
    }
    for (size_t r = 0; r * static_cast<size_t>(C) < x.size(); ++r) {
      double scale = 0, diff = 0;
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = r * static_cast<size_t>(C) + static_cast<size_t>(c);
        scale = std::max(scale, std::abs(static_cast<double>(x[i])));
        diff = std::max(diff, std::abs(static_cast<double>(x[i]) - y[i]));
      }
      worst = std::max(worst, diff / std::max(scale, 1e-30));
    }
  }
  return worst;
}

}  // namespace

TEST(Runs, HiddenStartsCountRowsAcrossBatches) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // as in KilledAndResumedGivesByteIdenticalOutputs
  const std::string d = ::testing::TempDir() + "tessera_run_hidden_starts" + build_tag();
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string data = lines_file(d, 23);  // 3 bad items; lines of 6 to 18 bytes
  auto hidden = [&](const std::string& runtime) { return experiment(d, data, "task: {kind: hidden}\nruntime: " + runtime + "\n"); };
  run_ok(hidden("{batch_size: 1}"), d + "/one");
  const HiddenRun one = read_hidden(d + "/one");
  ASSERT_EQ(one.index.size(), 20u);
  // Killed after two batches of 4 and resumed.
  EXPECT_EXIT(
      {
        RunOptions o;
        o.out_dir = d + "/killed";
        o.progress = false;
        o.on_batch = [](int64_t done, int64_t) {
          if (done == 2) raise(SIGKILL);
        };
        (void)run_experiment(hidden("{batch_size: 4}"), o);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "");
  EXPECT_EQ(run_ok(hidden("{batch_size: 4}"), d + "/killed", true).batches_resumed, 2);
  for (const char* runtime : {"{batch_size: 2}", "{batch_size: 3}", "{batch_size: 7, packing: true}",
                              "{batch_size: 4, packing: true, workers: 2}", "{batch_size: 23}"}) {
    const std::string out = d + "/run" + std::to_string(std::hash<std::string>()(runtime));
    run_ok(hidden(runtime), out);
    const HiddenRun h = read_hidden(out);
    EXPECT_EQ(slurp(out + "/rows.jsonl"), slurp(d + "/one/rows.jsonl")) << runtime;
    EXPECT_LE(max_relative_row_difference(one, h, 16), kRowBound) << runtime;
  }
  const HiddenRun killed = read_hidden(d + "/killed");
  EXPECT_LE(max_relative_row_difference(one, killed, 16), kRowBound);
  run_ok(hidden("{batch_size: 4}"), d + "/straight");
  EXPECT_EQ(slurp(d + "/killed/hidden.npy"), slurp(d + "/straight/hidden.npy"));
  EXPECT_EQ(slurp(d + "/killed/index.jsonl"), slurp(d + "/straight/index.jsonl"));
  fs::remove_all(d);
}

// The issue's case: five lines through the tiny BERT folder with batch size 2.
TEST(Runs, HiddenStartsOfAHuggingFaceFolder) {
  const std::string d = temp_dir("hidden_hf");
  write(d + "/five.txt", "In the beginning God created the heaven and the earth.\nAnd the earth was without form.\n"
                         "Thou shalt not kill.\nAnd God said, Let there be light: and there was light.\nAmen.\n");
  std::vector<HiddenRun> runs;
  for (int batch_size : {1, 2}) {
    const std::string yaml = "model: {from: hf, path: " + std::string(TESSERA_SOURCE_DIR) +
                             "/tests/data/hf/bert/model}\ndata: {path: five.txt}\ntask: {kind: hidden}\n"
                             "runtime: {batch_size: " + std::to_string(batch_size) + "}\n";
    Diagnostics diags;
    std::optional<Experiment> e = load_experiment_from_string(yaml, "hf.yaml", d, {}, &diags);
    ASSERT_TRUE(e) << diags.str();
    run_ok(*e, d + "/run" + std::to_string(batch_size));
    runs.push_back(read_hidden(d + "/run" + std::to_string(batch_size)));
    ASSERT_EQ(runs.back().index.size(), 5u);
  }
  std::vector<int64_t> starts;
  for (const nlohmann::json& r : runs[1].index) starts.push_back(r["start"]);
  EXPECT_EQ(starts[1], runs[1].index[0]["rows"].get<int64_t>());
  EXPECT_GT(starts[2], starts[1]);
  EXPECT_LE(max_relative_row_difference(runs[0], runs[1], 32), kRowBound);
  fs::remove_all(d);
}

// ---------------------------------------------------------------------------------------------
// Resume keyed by content: each finished batch is recorded with a hash of its items' bytes; a
// resume redoes the batches whose items changed, refuses when a file the plugins read changed,
// and refuses a manifest that has no such record.

namespace {

// Every file below `a` and `b`, the same names with the same bytes.
void expect_same_folder(const std::string& a, const std::string& b) {
  auto names = [](const std::string& dir) {
    std::vector<std::string> v;
    for (const auto& f : fs::recursive_directory_iterator(dir))
      if (f.is_regular_file()) v.push_back(fs::relative(f.path(), dir).string());
    std::sort(v.begin(), v.end());
    return v;
  };
  const std::vector<std::string> na = names(a), nb = names(b);
  for (const std::string& n : na)
    EXPECT_TRUE(std::find(nb.begin(), nb.end(), n) != nb.end()) << n << " is in " << a << ", not in " << b;
  for (const std::string& n : nb)
    EXPECT_TRUE(std::find(na.begin(), na.end(), n) != na.end()) << n << " is in " << b << ", not in " << a;
  for (const std::string& n : na) {
    if (std::find(nb.begin(), nb.end(), n) == nb.end()) continue;
    EXPECT_TRUE(slurp(a + "/" + n) == slurp(b + "/" + n)) << n << " differs between " << a << " and " << b;
  }
}

// The lines of lines_file(dir, n) with line `i` (0-based) replaced.
void edit_line(const std::string& path, size_t i, const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(slurp(path));
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_LT(i, lines.size());
  lines[i] = text;
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  write(path, out);
}

RunSummary resume_capturing(const Experiment& e, const std::string& out, std::string* err) {
  RunOptions o;
  o.out_dir = out;
  o.resume = true;
  o.progress = true;
  ::testing::internal::CaptureStderr();
  Result<RunSummary> r = run_experiment(e, o);
  *err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : RunSummary{};
}

}  // namespace

TEST(Runs, ResumeRedoesTheBatchesWhoseItemsChanged) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // as in KilledAndResumedGivesByteIdenticalOutputs
  const std::string d = ::testing::TempDir() + "tessera_run_redo" + build_tag();
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string data = lines_file(d, 40);  // 14 batches of 3
  const std::string extra = "runtime: {batch_size: 3}\ntask: {kind: embed, attention: {layers: [0], png: false}}\n";
  EXPECT_EXIT(
      {
        RunOptions o;
        o.out_dir = d + "/killed";
        o.progress = false;
        o.on_batch = [](int64_t done, int64_t) {
          if (done == 4) raise(SIGKILL);
        };
        (void)run_experiment(experiment(d, data, extra), o);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "");
  const Experiment e = experiment(d, data, extra);

  // A killed run: item 1 (batch 0, finished) now gives two sequences; item 13 (batch 4, not
  // finished) changed too. One finished batch is redone, the outputs are a fresh run's.
  edit_line(data, 1, "line one, edited TWICE");
  edit_line(data, 13, "line thirteen, edited");
  std::string err;
  const RunSummary resumed = resume_capturing(e, d + "/killed", &err);
  EXPECT_NE(err.find("run: resume: 1 of 4 finished batches changed since they were written; redoing them"),
            std::string::npos) << err;
  EXPECT_EQ(resumed.batches_redone, 1);
  EXPECT_EQ(resumed.batches_resumed, 3);
  EXPECT_EQ(resumed.sequences, 40 - 6 + 1);  // 6 lines say FAIL; item 1 gives two
  run_ok(e, d + "/fresh");
  expect_same_folder(d + "/killed", d + "/fresh");

  // A finished run: item 1 back to one sequence, item 20 now fails, item 30's text is longer.
  edit_line(data, 1, "line 1x");
  edit_line(data, 20, "line 20 FAIL");
  edit_line(data, 30, "line thirty, now rather longer than it was");
  const RunSummary redone = resume_capturing(e, d + "/killed", &err);
  EXPECT_NE(err.find("run: resume: 3 of 14 finished batches changed since they were written; redoing them"),
            std::string::npos) << err;
  EXPECT_EQ(redone.batches_redone, 3);
  EXPECT_EQ(redone.batches_resumed, 11);
  EXPECT_EQ(redone.failed, 7);
  fs::remove_all(d + "/fresh");
  run_ok(e, d + "/fresh");
  expect_same_folder(d + "/killed", d + "/fresh");  // no stale row, line or attention file

  // Nothing changed: nothing redone, nothing written.
  const std::string manifest = slurp(d + "/killed/manifest.json");
  const RunSummary same = resume_capturing(e, d + "/killed", &err);
  EXPECT_EQ(same.batches_redone, 0);
  EXPECT_NE(err.find("is already complete; nothing to do"), std::string::npos) << err;
  EXPECT_EQ(slurp(d + "/killed/manifest.json"), manifest);
  fs::remove_all(d);
}

TEST(Runs, ResumeRefusesWhenAFileThePluginsReadChanged) {
  const std::string d = temp_dir("files");
  fs::copy_file(std::string(TESSERA_SOURCE_DIR) + "/tests/data/hf/bert/model/vocab.txt", d + "/vocab.txt");
  write(d + "/t.txt", "the earth was without form\nand void\nand darkness was upon the face of the deep\n");
  const std::string yaml = "plugins:\n  - name: text\n    options: {tokenizer: wordpiece, vocab: vocab.txt}\n"
                           "model:\n  d_model: 16\n  n_heads: 2\n  n_layers: 1\n  stem: {kind: tokens, vocab_size: 2056}\n"
                           "  positions: {kind: learned, max_len: 64}\n  head: {kind: pool, pool: mean}\n"
                           "data: {path: t.txt}\nruntime: {batch_size: 2}\n";
  Diagnostics diags;
  std::optional<Experiment> e = load_experiment_from_string(yaml, "v.yaml", d, {}, &diags);
  ASSERT_TRUE(e) << diags.str();
  run_ok(*e, d + "/run");
  RunOptions o;
  o.out_dir = d + "/run";
  o.resume = true;
  o.progress = false;
  ASSERT_TRUE(run_experiment(*e, o).ok());

  // The vocabulary edited in place (two tokens swapped: as many lines as before).
  const std::string vocab = slurp(d + "/vocab.txt");
  std::vector<std::string> tokens;
  std::istringstream in(vocab);
  for (std::string t; std::getline(in, t);) tokens.push_back(t);
  const auto the = std::find(tokens.begin(), tokens.end(), "the"), earth = std::find(tokens.begin(), tokens.end(), "earth");
  ASSERT_TRUE(the != tokens.end() && earth != tokens.end());
  std::iter_swap(the, earth);
  std::string swapped;
  for (const std::string& t : tokens) swapped += t + "\n";
  ASSERT_EQ(swapped.size(), vocab.size());
  write(d + "/vocab.txt", swapped);
  Result<RunSummary> r = run_experiment(*e, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot resume " + d + "/run: the file " + d +
                                      "/vocab.txt (plugin text's option vocab) changed since the run started"),
            std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("start over with --force"), std::string::npos) << r.status().message();
  write(d + "/vocab.txt", vocab);
  EXPECT_TRUE(run_experiment(*e, o).ok());

  // A manifest written before batches were keyed by content.
  nlohmann::json m = nlohmann::json::parse(slurp(d + "/run/manifest.json"));
  m["format"] = 1;
  m["done"] = {0, 1};
  write(d + "/run/manifest.json", m.dump(2));
  r = run_experiment(*e, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot resume " + d + "/run: its manifest.json (format 1) does not record what "
                                      "each finished batch was computed from"),
            std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("start over with --force"), std::string::npos) << r.status().message();

  // Values of the wrong type, as a hand edit leaves them: refused, naming the manifest, never an abort.
  for (const char* edit : {R"({"format": "2"})", R"({"plugins": [1, 2]})", R"({"done": [["0", 5]]})"}) {
    nlohmann::json bad = nlohmann::json::parse(slurp(d + "/run/manifest.json"));
    bad["format"] = 2;
    bad.merge_patch(nlohmann::json::parse(edit));
    write(d + "/run/manifest.json", bad.dump(2));
    r = run_experiment(*e, o);
    ASSERT_FALSE(r.ok()) << edit;
    EXPECT_NE(r.status().message().find(d + "/run/manifest.json"), std::string::npos) << edit << ": " << r.status().message();
    EXPECT_NE(r.status().message().find("start over with --force"), std::string::npos) << r.status().message();
  }
  fs::remove_all(d);
}

TEST(Runs, ResumeRefusesWhenAPluginLibraryChanged) {
  const std::string d = temp_dir("library");
  std::string lib;
  for (const auto& f : fs::directory_iterator(kPluginDir))
    if (f.path().filename().string().find("probe") != std::string::npos) lib = f.path().string();
  ASSERT_FALSE(lib.empty());
  fs::create_directories(d + "/plugins");
  const std::string copy = d + "/plugins/" + fs::path(lib).filename().string();
  fs::copy_file(lib, copy);
  write(d + "/t.txt", "one\ntwo\n");
  Experiment e = experiment(d, d + "/t.txt");
  e.plugins[0].file = copy;
  run_ok(e, d + "/run");
  std::ofstream(copy, std::ios::binary | std::ios::app) << '\0';  // "rebuilt": other bytes, same name and version
  RunOptions o;
  o.out_dir = d + "/run";
  o.resume = true;
  o.progress = false;
  Result<RunSummary> r = run_experiment(e, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the file " + copy + " (plugin probe's library) changed since the run started"),
            std::string::npos) << r.status().message();
  fs::remove_all(d);
}

// ---------------------------------------------------------------------------------------------
// Batch invariance, to the bound docs/RUNS.md states: between two runs that differ only in the
// batch size, packing, threads or workers, every output row x (a sequence's hidden row, an
// embedding) and its counterpart y satisfy max_c |x_c - y_c| <= kRowBound * max_c |x_c|.
// Measured worst, over models of 2 to 12 layers and d_model 32 to 768 on AVX-512 and with
// ONEDNN_MAX_CPU_ISA=AVX2: 1.6e-6 (docs/RUNS.md). One row of padding leaking into a sequence
// moves its rows by more than a hundred times the bound (checked below).

namespace {

// Lines of 1 to 190 bytes, so that sequences span several of the fused attention's 64-row query
// blocks and sit at every offset in packed rows.
std::string varied_lines(const std::string& dir, int n) {
  const std::string letters = "the quick brown fox jumps over a lazy dog while seven wizards hex jolly boxing frogs ";
  std::string text;
  for (int i = 0; i < n; ++i) {
    const size_t len = static_cast<size_t>((i * 37 + 11) % 190 + 1);
    std::string line;
    for (size_t j = 0; j < len; ++j) line += letters[(static_cast<size_t>(i) * 7 + j * 3) % letters.size()];
    text += line + "\n";
  }
  write(dir + "/varied.txt", text);
  return dir + "/varied.txt";
}

}  // namespace

TEST(BatchInvariance, OutputsStayWithinTheStatedBound) {
  const std::string d = temp_dir("invariance");
  const std::string data = varied_lines(d, 41);
  const std::string model = "model:\n  d_model: 64\n  n_heads: 4\n  n_layers: 2\n  stem: {kind: tokens, vocab_size: 300}\n"
                            "  positions: {kind: learned, max_len: 512}\n  head: {kind: pool, pool: mean}\n";
  auto run = [&](const std::string& task, const std::string& runtime, const std::string& data_path) {
    const std::string yaml = "plugins:\n  - name: probe\n    path: " + kPluginDir + "\n" + model + "data:\n  path: " +
                             data_path + "\ntask: {kind: " + task + "}\nruntime: " + runtime + "\noutputs: {provenance: false}\n";
    Diagnostics diags;
    std::optional<Experiment> e = load_experiment_from_string(yaml, "inv.yaml", d, {}, &diags);
    EXPECT_TRUE(e) << diags.str();
    const std::string out = d + "/" + task + std::to_string(std::hash<std::string>()(runtime + data_path));
    run_ok(*e, out);
    return out;
  };
  std::vector<std::string> runtimes;
  for (int threads : {1, 2})
    for (int batch : {1, 2, 3, 5, 8, 13, 41})
      for (bool packing : {false, true})
        if (batch > 1 || !packing)
          runtimes.push_back("{threads: " + std::to_string(threads) + ", batch_size: " + std::to_string(batch) +
                             ", packing: " + (packing ? "true" : "false") + "}");
  runtimes.push_back("{batch_size: 8, packing: true, workers: 0}");
  runtimes.push_back("{batch_size: 5, workers: 3}");

  // Hidden rows, any two runs.
  std::vector<HiddenRun> hidden;
  for (const std::string& r : runtimes) hidden.push_back(read_hidden(run("hidden", r, data)));
  double worst = 0;
  for (size_t i = 0; i < hidden.size(); ++i)
    for (size_t j = i + 1; j < hidden.size(); ++j) {
      const double w = max_relative_row_difference(hidden[i], hidden[j], 64);
      EXPECT_LE(w, kRowBound) << runtimes[i] << " and " << runtimes[j];
      worst = std::max(worst, w);
    }
  std::printf("hidden rows: worst relative difference between two of %zu runs %.3g (bound %.3g)\n", hidden.size(), worst,
              kRowBound);

  // Embeddings (the pooled rows), any two of a few runs.
  std::vector<Tensor> pooled;
  for (const char* r : {"{threads: 1, batch_size: 1}", "{threads: 2, batch_size: 13, packing: true}", "{batch_size: 41}"}) {
    pooled.push_back(npy::load(run("embed", r, data) + "/embeddings.npy").value());
    ASSERT_EQ(pooled.back().shape(), Shape({41, 64}));
  }
  for (size_t i = 1; i < pooled.size(); ++i)
    for (int64_t s = 0; s < 41; ++s) {
      double diff = 0, scale = 0;
      for (int64_t c = 0; c < 64; ++c) {
        scale = std::max(scale, std::abs(static_cast<double>(pooled[0].at({s, c}))));
        diff = std::max(diff, std::abs(static_cast<double>(pooled[0].at({s, c})) - pooled[i].at({s, c})));
      }
      EXPECT_LE(diff, kRowBound * scale) << "run " << i << ", sequence " << s;
    }

  // The bound notices one row too many: each line with one more byte (a row every other row
  // attends to, as a leaked padding row would be) moves the rows they share far beyond it.
  std::string longer;
  std::istringstream in(slurp(data));
  for (std::string l; std::getline(in, l);) longer += l + " \n";
  write(d + "/longer.txt", longer);
  const HiddenRun one_more = read_hidden(run("hidden", runtimes[0], d + "/longer.txt"));
  double least = INFINITY;
  for (const nlohmann::json& r : hidden[0].index) {
    const std::string id = r["id"], other = "longer.txt" + id.substr(id.find(':'));
    const std::vector<float>& x = hidden[0].rows.at(id);
    const std::vector<float>& y = one_more.rows.at(other);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      scale = std::max(scale, std::abs(static_cast<double>(x[i])));
      diff = std::max(diff, std::abs(static_cast<double>(x[i]) - y[i]));
    }
    least = std::min(least, diff / scale);
  }
  EXPECT_GT(least, 100 * kRowBound);
  std::printf("one row more: the least moved sequence moved by %.3g\n", least);
  fs::remove_all(d);
}
