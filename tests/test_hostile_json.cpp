// Hostile JSON in Hugging Face folders and safetensors headers (issue 14): wrong-typed values in
// every settings file the importer reads, nesting a million deep, sizes far out of range, a 3 GiB
// config.json, non-finite or zero epsilons, and headers whose parsed tree would take gigabytes.
// Each import runs in a child process under an address-space limit (its current size + 1 GiB), so
// that what used to abort, overflow the stack or allocate gigabytes shows up here as a failed
// expectation ("child died of signal 6") rather than taking the suite down.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "io/json_file.h"
#include "tessera/config.h"
#include "tessera/hf.h"
#include "tessera/safetensors.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kHf = std::string(TESSERA_TEST_DATA) + "/hf/";

// What a child process reported: whether it ended normally, and its text.
struct Child {
  bool exited = false;  // exit(), not a signal
  int code = -1;        // its exit status, or the signal
  std::string out;
  std::string why() const {
    return exited ? "exit " + std::to_string(code)
                  : "child died of signal " + std::to_string(code) + " (" + strsignal(code) + ")";
  }
};

// Runs fn in a child limited to its current address space + 1 GiB; fn's string comes back.
Child in_child(const std::function<std::string()>& fn) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const rlim_t limit =
        static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (1ull << 30);
    rlimit rl{limit, limit};
    setrlimit(RLIMIT_AS, &rl);
    alarm(60);  // a quadratic parse ends as SIGALRM (14) instead of hanging the suite
    // An exception must not unwind into the forked copy of gtest (it would go on running tests):
    // it ends the child as an uncaught one would, 134, with its text.
    std::string s;
    int code = 0;
    try {
      s = fn();
    } catch (const std::exception& e) {
      s = std::string("uncaught exception: ") + e.what();
      code = 134;
    } catch (...) {
      s = "uncaught exception";
      code = 134;
    }
    for (size_t done = 0; done < s.size();) {
      const ssize_t n = write(fds[1], s.data() + done, s.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    _exit(code);
  }
  close(fds[1]);
  Child c;
  char buf[65536];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) c.out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  c.exited = WIFEXITED(status);
  c.code = c.exited ? WEXITSTATUS(status) : WTERMSIG(status);
  return c;
}

// A copy of a fixture folder to break one file of.
struct Folder {
  fs::path dir;
  Folder(const std::string& family, const std::string& name) {
    dir = fs::temp_directory_path() / ("tessera_hostile_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::copy(kHf + family + "/model", dir, fs::copy_options::recursive);
  }
  ~Folder() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }
  json read(const std::string& name) const {
    std::ifstream in(path(name));
    return json::parse(in);
  }
  // Sets key (or removes it, for a null `v`) in the file's top object.
  void set(const std::string& file, const std::string& key, const json& v) const {
    json j = read(file);
    j[key] = v;
    write(file, j.dump(2));
  }
};

// The import in a child: its diagnostics, one a line, then "diagnostics: N", or "IMPORTED".
struct Import {
  Child child;
  size_t count = 0;  // diagnostics
  bool imported = false;
  const std::string& text() const { return child.out; }
};

Import import(const Folder& f, hf::ImportOptions opt = {}) {
  Import r;
  r.child = in_child([&] {
    Diagnostics d;
    std::optional<hf::Folder> got = hf::import_folder(f.dir.string(), opt, Location{"t.yaml", 2, 3}, &d);
    std::string s = d.str();
    if (s.size() > (256u << 10)) s.resize(256u << 10);  // the head of a flood is enough to see it
    return s + "\ndiagnostics: " + std::to_string(d.size()) + (got ? "\nIMPORTED" : "");
  });
  const size_t p = r.child.out.rfind("diagnostics: ");
  if (p != std::string::npos) r.count = std::stoul(r.child.out.substr(p + 13));
  r.imported = r.child.out.find("\nIMPORTED") != std::string::npos;
  return r;
}

// The import ended normally, failed, and said `what` (once, when `once`).
void expect_refused(const Import& r, const std::string& what, bool once = true) {
  EXPECT_TRUE(r.child.exited && r.child.code == 0) << r.child.why() << "\n" << r.text().substr(0, 2000);
  EXPECT_FALSE(r.imported) << r.text().substr(0, 2000);
  EXPECT_NE(r.text().find(what), std::string::npos) << "wanted: " << what << "\n" << r.text().substr(0, 2000);
  if (once) {
    EXPECT_EQ(r.count, 1u) << r.text().substr(0, 4000);
  }
}

// ---------------------------------------------------------------------------------------------
// Wrong types in each of the five files.

TEST(HostileHf, ModulesJsonOfTheWrongShape) {
  Folder f("bert", "modules");
  f.write("modules.json", "[1,2,3]");  // used to end in nlohmann's type_error 306 (abort)
  expect_refused(import(f), f.path("modules.json") +
                                ": expected each module to be an object with \"type\" and "
                                "\"path\", found 1");
  f.write("modules.json", "{\"a\": 1}");  // used to be ignored: no pooling, silently the CLS pooler
  expect_refused(import(f), f.path("modules.json") + ": expected a JSON array of modules");
  f.write("modules.json", R"([{"type": 5, "path": "1_Pooling"}])");  // type_error 302 (abort)
  expect_refused(import(f), f.path("modules.json") + ": key \"type\": expected a string, found 5");
  f.write("modules.json", R"([{"type": "sentence_transformers.models.Pooling", "path": {"a": [1]}}])");
  expect_refused(import(f),
                 f.path("modules.json") + ": key \"path\": expected a string, found an object with 1 key",
                 false);
}

TEST(HostileHf, PoolingConfigOfTheWrongShape) {
  Folder f("bert", "pooling");
  f.set("1_Pooling/config.json", "pooling_mode_mean_tokens", "yes");  // type_error 302 (abort)
  expect_refused(import(f),
                 f.path("1_Pooling/config.json") +
                     ": key \"pooling_mode_mean_tokens\": expected true or "
                     "false, found \"yes\"",
                 false);
  f.write("1_Pooling/config.json", "[1,2,3]");
  expect_refused(import(f), f.path("1_Pooling/config.json") +
                                ": expected a JSON object at the top, found an array "
                                "of 3 values");
}

TEST(HostileHf, SentenceBertConfigOfTheWrongShape) {
  Folder f("bert", "sbert");
  f.set("sentence_bert_config.json", "do_lower_case", "no");  // type_error 302 (abort)
  expect_refused(import(f),
                 "sentence_bert_config.json: key \"do_lower_case\": expected true or false, found \"no\"");
  f.set("sentence_bert_config.json", "do_lower_case", false);
  f.set("sentence_bert_config.json", "max_seq_length", json{{"a", 64}});  // used to be ignored
  expect_refused(import(f),
                 "sentence_bert_config.json: key \"max_seq_length\": expected an integer in [1, 1048576], "
                 "found an object with 1 key");
  f.write("sentence_bert_config.json", "[1,2,3]");
  expect_refused(import(f), "sentence_bert_config.json: expected a JSON object at the top");
}

TEST(HostileHf, PreprocessorConfigOfTheWrongShape) {
  Folder f("vit", "pre");
  f.set("preprocessor_config.json", "size", json{{"height", "32"}, {"width", 32}});  // type_error 302 (abort)
  expect_refused(import(f), ": size: key \"height\": expected an integer in [1, 16384], found \"32\"");
  f.set("preprocessor_config.json", "size", json{{"height", 32}, {"width", 32}});
  f.set("preprocessor_config.json", "image_mean", json{"a", 0.5, 0.5});  // type_error 302 (abort)
  expect_refused(import(f),
                 "preprocessor_config.json: key \"image_mean\": expected one or three finite numbers, "
                 "found \"a\"");
  f.set("preprocessor_config.json", "image_mean", json{0.5, 0.5, 0.5});
  f.set("preprocessor_config.json", "image_std", json{0.5, 0, 0.5});  // a zero std divides by zero
  expect_refused(import(f), "key \"image_std\": expected one or three finite numbers above 0, found 0");
  f.write("preprocessor_config.json", "[1,2,3]");
  expect_refused(import(f), "preprocessor_config.json: expected a JSON object at the top");
  Folder a("ast", "pre_ast");
  a.set("preprocessor_config.json", "max_length", json::array({json::array({1})}));
  expect_refused(import(a),
                 "preprocessor_config.json: key \"max_length\": expected an integer in [1, 1048576], "
                 "found an array of 1 value");
}

TEST(HostileHf, ConfigJsonOfTheWrongShape) {
  Folder f("bert", "config");
  f.write("config.json", "[1,2,3]");
  expect_refused(import(f), "config.json: expected a JSON object at the top, found an array of 3 values");
  Folder g("bert", "config2");
  g.set("config.json", "hidden_size", json{{"a", json{{"b", 1}}}});
  expect_refused(import(g),
                 "config.json: key \"hidden_size\": expected an integer in [1, 65536], found an object "
                 "with 1 key");
  Folder t("gpt2", "type");
  t.set("config.json", "model_type", json::array({"gpt2"}));
  expect_refused(import(t), "config.json: key \"model_type\": expected a string, found an array of 1 value");
  // Found by the hf_folder fuzzer: an empty model_type was refused with no message at all.
  Folder u("gpt2", "empty_type");
  u.set("config.json", "model_type", "");
  expect_refused(import(u), "config.json: \"model_type\" is empty; Tessera knows ");
  Folder h("esm", "config3");
  h.set("config.json", "intermediate_size", "64");  // used to go on with 0 and list every tensor
  expect_refused(import(h),
                 "config.json: key \"intermediate_size\": expected an integer in [1, 1048576], found "
                 "\"64\"");
}

// ---------------------------------------------------------------------------------------------
// Depth, size and counts.

TEST(HostileHf, AMillionDeepValueIsRefusedByTheDepthLimit) {
  Folder f("bert", "deep");
  std::string text = R"({"model_type": "bert", "hidden_size": )";
  const size_t at = text.size();
  text += std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
  f.write("config.json", text);  // the message used to dump() it recursively: a stack overflow
  expect_refused(import(f), f.path("config.json") + ": nesting deeper than 64 levels at byte " +
                                std::to_string(at + 63));
}

TEST(HostileHf, LayersFarOutOfRangeFailOnceWithoutAllocating) {
  Folder f("bert", "layers40");
  f.set("config.json", "num_hidden_layers", 1ll << 40);  // used to allocate 7.8 GB (here: bad_alloc, abort)
  expect_refused(import(f),
                 "config.json: key \"num_hidden_layers\": expected an integer in [1, 1024], found "
                 "1099511627776");
  Folder g("gpt2", "layers1e5");
  g.set("config.json", "n_layer", 100000);  // used to print 1.6 million messages
  expect_refused(import(g), "config.json: key \"n_layer\": expected an integer in [1, 1024], found 100000");
  Folder h("esm", "vocab40");
  h.set("config.json", "vocab_size", 1ll << 40);
  expect_refused(import(h),
                 "config.json: key \"vocab_size\": expected an integer in [1, 16777216], found "
                 "1099511627776");
  Folder v("vit", "image");
  v.set("config.json", "image_size", 1ll << 32);
  expect_refused(import(v),
                 "config.json: key \"image_size\": expected an integer in [1, 16384], found 4294967296");
  Folder a("ast", "heads");
  a.set("config.json", "num_attention_heads", -4);
  expect_refused(import(a),
                 "config.json: key \"num_attention_heads\": expected an integer in [1, 1024], found -4");
}

TEST(HostileHf, AnImageSizeOptionFarOutOfRangeFailsOnceWithoutAllocating) {
  // The plugin's image_size resizes the position grid during the import: 2^40 rows used to be
  // allocated (here: bad_alloc, abort).
  Folder f("vit", "optsize");
  hf::ImportOptions opt;
  opt.image_size = {1ll << 40, 32};
  expect_refused(import(f, opt), "the image plugin's image_size 1099511627776x32: expected each side in [");
  opt.image_size = {-64, 32};
  expect_refused(import(f, opt), "the image plugin's image_size -64x32: expected each side in [");
}

TEST(HostileHf, ManyMissingTensorsAreListedOnceEachUpToACap) {
  Folder f("bert", "layers1000");
  f.set("config.json", "num_hidden_layers", 1000);  // in range: 997 layers of 16 tensors are missing
  const Import r = import(f);
  EXPECT_TRUE(r.child.exited && r.child.code == 0) << r.child.why();
  EXPECT_FALSE(r.imported);
  EXPECT_LE(r.count, 30u) << r.text().substr(0, 4000);
  EXPECT_NE(r.text().find("... and " + std::to_string(997 * 16 - 24) + " more missing tensors (" +
                          std::to_string(997 * 16) + " in all; the first 24 are listed)"),
            std::string::npos)
      << r.text().substr(0, 4000);
}

TEST(HostileHf, AConfigJsonOfThreeGibibytesIsRefusedWithoutReadingIt) {
  Folder f("bert", "huge");
  {
    const int fd = open(f.path("config.json").c_str(), O_WRONLY | O_TRUNC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 3ll << 30), 0);  // sparse: no disk, but 3 GiB to read
    close(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  expect_refused(import(f),
                 f.path("config.json") + ": 3221225472 bytes is too large for a JSON settings file");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 1.0) << "a refusal by size must not read the file";
}

TEST(HostileHf, AnEsmVocabularyOfThreeGibibytesIsRefusedWithoutReadingIt) {
  Folder f("esm", "hugevocab");
  {
    const int fd = open(f.path("vocab.txt").c_str(), O_WRONLY | O_TRUNC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 3ll << 30), 0);  // one 3 GiB line of zero bytes, read whole (bad_alloc) before
    close(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  expect_refused(import(f), f.path("vocab.txt") + ": 3221225472 bytes is more than the 1048576-byte limit");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
}

TEST(HostileHf, LayerNormEpsMustBeFiniteAndPositive) {
  for (const char* v : {"0", "-1e-12", "\"NaN\"", "2"}) {
    Folder f("bert", "eps");
    json j = f.read("config.json");
    j["layer_norm_eps"] = json::parse(v);
    f.write("config.json", j.dump());
    expect_refused(import(f),
                   "config.json: key \"layer_norm_eps\": expected a finite number in (0, 1], found " +
                       jsonfile::brief(j["layer_norm_eps"]));
  }
  Folder f("gpt2", "eps_big");
  json j = f.read("config.json");
  j.erase("layer_norm_epsilon");
  std::string text = j.dump();
  text.insert(1, "\"layer_norm_epsilon\": 1e400, ");  // out_of_range 406 from the parser (it used to abort)
  f.write("config.json", text);
  expect_refused(import(f), "config.json: not valid JSON for Tessera (number overflow parsing '1e400')");
}

// ---------------------------------------------------------------------------------------------
// Safetensors headers.

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return s;
}

Child open_header(std::string header) {
  return in_child([h = std::move(header)] {
    Result<safetensors::File> f = safetensors::File::from_bytes("bad.safetensors", le64(h.size()) + h);
    return f.ok() ? std::string("OPENED") : f.status().message();
  });
}

TEST(HostileSafetensors, DeepNestingIsRefusedAtItsByte) {
  const std::string header = R"({"w":)" + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
  const Child c = open_header(header);
  EXPECT_TRUE(c.exited && c.code == 0) << c.why();
  EXPECT_EQ(c.out.rfind("bad.safetensors: header refused: nesting deeper than 4 levels at byte 16", 0), 0u)
      << c.out;
}

TEST(HostileSafetensors, AHeaderOfSmallArraysUnderTheLengthLimitIsRefusedByItsMemory) {
  // 94 MB of [] in one entry: nlohmann's tree of it took 3.5 GB. The estimate (json_file.h) is 80
  // bytes an empty array, so it passes 512 MiB at about 6.7 million of them, 20 MB into the header.
  std::string header = R"({"w":[)";
  header.reserve(94'000'010);
  while (header.size() < 94'000'000) header += "[],";
  header += "[]]}";
  const auto t0 = std::chrono::steady_clock::now();
  const Child c = open_header(header);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(c.exited && c.code == 0) << c.why();
  EXPECT_EQ(
      c.out.rfind("bad.safetensors: header refused: parsing it would take more than 512 MiB of memory", 0),
      0u)
      << c.out;
  EXPECT_LT(s, 2.0);
  // The rule is the estimate, not the length: a header a third the size passes the pre-scan.
  jsonfile::Scan scan;
  const std::string small = R"({"w":[)" + std::string(1000, '[') + "]}";
  EXPECT_EQ(jsonfile::prescan(small, jsonfile::Limits{1 << 20, 4, 1 << 20}, 8, &scan)
                .rfind("nesting deeper than 4 "
                       "levels at byte 16",
                       0),
            0u);
  std::string ok_header = R"({"w":[)";
  for (int i = 0; i < 1000; ++i) ok_header += "[],";
  ok_header += "[]]}";
  EXPECT_EQ(jsonfile::prescan(ok_header, jsonfile::Limits{1 << 20, 4, 1 << 20}, 8, &scan), "");
  EXPECT_EQ(scan.depth, 3);
  EXPECT_EQ(scan.tree_bytes, 16u + 64 + 80 + 64 + 1001 * 64 + 1000 * 16);
}

TEST(HostileSafetensors, AHundredThousandTensorsOpenInLinearTime) {
  // nlohmann's parse with a callback (the duplicate-key check) rescanned the header object each
  // time an entry closed: 50 000 tensors took minutes. Now: a SAX pass, then the tree.
  constexpr int kN = 100000;
  std::string header = "{";
  for (int i = 0; i < kN; ++i)
    header += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"U8","shape":[1],"data_offsets":[)" +
              std::to_string(i) + "," + std::to_string(i + 1) + "]}";
  header += "}";
  const auto t0 = std::chrono::steady_clock::now();
  const Child c = in_child([&] {
    Result<safetensors::File> f = safetensors::File::from_bytes(
        "many.safetensors", le64(header.size()) + header + std::string(kN, 'x'));
    return f.ok() ? std::to_string(f->tensors().size()) : f.status().message();
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(c.exited && c.code == 0) << c.why();
  EXPECT_EQ(c.out, std::to_string(kN));
  EXPECT_LT(s, 10.0);
}

TEST(HostileJson, BriefNeverRecursesAndStaysShort) {
  json deep = json::array();
  json* p = &deep;
  for (int i = 0; i < 100000; ++i) p = &(*p = json::array({json::array()}))[0];
  EXPECT_EQ(jsonfile::brief(deep), "an array of 1 value");
  EXPECT_EQ(jsonfile::brief(json(std::string(1000, 'x'))).size(), 2u + 60 + 3);
  EXPECT_EQ(jsonfile::brief(json(1e-12)), "9.9999999999999998e-13");
}

}  // namespace
}  // namespace tessera
