// Batch runs against hostile run folders and interruptions (issue 14): a second run beside a live
// one, SIGTERM and SIGINT, a manifest.json with wrong-typed fields, shards cut short, temporary
// files left by a kill, a dangling symlink, one item with many windows, non-finite outputs.
// Whatever could abort runs in a child process: the built `tessera` binary, so that this suite
// survives to report it.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <cfloat>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "run/batcher.h"
#include "test_util.h"
#include "tessera/npy.h"
#include "tessera/run.h"

extern char** environ;

using namespace tessera;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kTessera = std::string(TESSERA_BINARY_DIR) + "/tessera";
const std::string kPluginDir = TESSERA_TEST_PLUGIN_DIR;

std::string temp_dir(const std::string& name) { return testing_util::fresh_temp_dir("tessera_faults_" + name); }
void write(const std::string& path, const std::string& text) { testing_util::write_text(path, text); }
using testing_util::slurp;

// An embedding experiment over `lines` lines of text with the probe plugin (bytes as ids), as a
// YAML file in `dir`. Lines containing FAIL are bad items.
std::string experiment_file(const std::string& dir, int lines, const std::string& runtime, int width = 40,
                            const std::string& task = "embed") {
  std::string text;
  for (int i = 0; i < lines; ++i) text += "line " + std::to_string(i) + " " + std::string(static_cast<size_t>(width + i % 11), 'a' + i % 26) + "\n";
  write(dir + "/lines.txt", text);
  const std::string yaml = "plugins:\n  - name: probe\n    path: " + kPluginDir +
                           "\nmodel:\n  d_model: 32\n  n_heads: 2\n  n_layers: 2\n  stem: {kind: tokens, vocab_size: 300}\n"
                           "  positions: {kind: learned, max_len: 512}\n  head: {kind: pool, pool: mean}\n"
                           "data: {path: lines.txt}\nruntime: " + runtime + "\ntask: {kind: " + task + "}\n";
  write(dir + "/exp.yaml", yaml);
  return dir + "/exp.yaml";
}

struct Ran {
  int code = -1;    // exit code, or -signal when killed by one
  std::string out, err;
};

int decode_status(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -1000; }

// `tessera ARGS...` started in the background, its stdout and stderr going to files.
struct Child {
  pid_t pid = -1;
  std::string out_file, err_file;
  Ran wait() {
    int st = 0;
    Ran r;
    if (pid > 0 && waitpid(pid, &st, 0) == pid) r.code = decode_status(st);
    pid = -1;
    r.out = slurp(out_file);
    r.err = slurp(err_file);
    return r;
  }
};

Child start(const std::vector<std::string>& args) {
  static int calls = 0;
  Child c;
  const std::string base = ::testing::TempDir() + "tessera_faults_io." + std::to_string(getpid()) + "." + std::to_string(calls++);
  c.out_file = base + ".out";
  c.err_file = base + ".err";
  std::vector<std::string> argv_s = {kTessera};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, c.out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, c.err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (posix_spawn(&c.pid, kTessera.c_str(), &fa, nullptr, argv.data(), environ) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return c;
}

Ran run_tessera(const std::vector<std::string>& args) { return start(args).wait(); }

// What a child does to itself before it becomes `tessera`.
struct Confinement {
  rlim_t max_file_bytes = RLIM_INFINITY;  // RLIMIT_FSIZE: a write past it fails, as on a full disk
  bool obey_permissions = false;          // root too is refused what a file's mode forbids
};
constexpr int kCannotConfine = 77;  // the child's exit code when it could not confine itself

// `tessera ARGS...` run to its end in a confined child (fork, then only async-signal-safe calls).
// Root normally writes into any folder: with obey_permissions it gives up, for itself and what it
// executes, the capabilities that pass over a file's mode (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH,
// CAP_FOWNER), so that a read-only folder is read-only to it as to anyone.
Ran run_confined(const std::vector<std::string>& args, const Confinement& c) {
  static int calls = 0;
  const std::string base = ::testing::TempDir() + "tessera_faults_cio." + std::to_string(getpid()) + "." + std::to_string(calls++);
  std::vector<std::string> argv_s = {kTessera};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string out = base + ".out", err = base + ".err";
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(kCannotConfine);
    const struct rlimit lim = {c.max_file_bytes, c.max_file_bytes};
    if (c.max_file_bytes != RLIM_INFINITY && setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(kCannotConfine);
    if (c.obey_permissions && geteuid() == 0)
      for (int cap : {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER})
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) _exit(kCannotConfine);
    execve(kTessera.c_str(), argv.data(), environ);
    _exit(kCannotConfine);
  }
  Ran r;
  int st = 0;
  if (pid > 0 && waitpid(pid, &st, 0) == pid) r.code = decode_status(st);
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}

// Every file and folder below and at `dir` made read-only (true), or writable again by its owner.
void set_read_only(const std::string& dir, bool on) {
  std::vector<fs::path> paths = {dir};
  for (const auto& f : fs::recursive_directory_iterator(dir)) paths.push_back(f.path());
  for (const fs::path& p : paths)
    fs::permissions(p, on ? fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write
                          : fs::perms::owner_write,
                    on ? fs::perm_options::remove : fs::perm_options::add);
}

// The run folder's manifest, or null while there is none.
json manifest(const std::string& dir) {
  json m = json::parse(slurp(dir + "/manifest.json"), nullptr, false);
  return m.is_discarded() ? json() : m;
}

size_t batches_done(const std::string& dir) {
  const json m = manifest(dir);
  return m.is_object() && m.contains("done") && m["done"].is_array() ? m["done"].size() : 0;
}

// Waits until the run in `dir` has committed `n` batches (false after 60 s, or when it ended).
bool wait_for_batches(const std::string& dir, size_t n, pid_t pid) {
  for (int i = 0; i < 6000; ++i) {
    if (batches_done(dir) >= n) return true;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Every file below `a` and `b` (but manifest.json, which names its folder's run) byte-identical.
void expect_same_outputs(const std::string& a, const std::string& b) {
  std::vector<std::string> names;
  for (const auto& f : fs::recursive_directory_iterator(b))
    if (f.is_regular_file()) names.push_back(fs::relative(f.path(), b).string());
  std::sort(names.begin(), names.end());
  EXPECT_GE(names.size(), 3u);
  for (const std::string& n : names) {
    ASSERT_TRUE(fs::exists(a + "/" + n)) << a << "/" << n;
    if (n == "manifest.json") continue;
    EXPECT_EQ(slurp(a + "/" + n), slurp(b + "/" + n)) << n;
  }
  for (const auto& f : fs::recursive_directory_iterator(a)) {
    if (f.is_regular_file()) {
      EXPECT_TRUE(fs::exists(b + "/" + fs::relative(f.path(), a).string())) << f.path();
    }
  }
}

// The temporary files of atomic writes (".NAME.tmp.PID.N") anywhere below dir.
std::vector<std::string> temporaries(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& f : fs::recursive_directory_iterator(dir))
    if (f.path().filename().string().find(".tmp.") != std::string::npos) v.push_back(f.path().string());
  return v;
}

// A run of `exp` into `out` killed with SIGKILL (no chance to clean up) once `n` batches are done.
Ran killed_run(const std::string& exp, const std::string& out, size_t n) {
  Child c = start({"run", exp, "--out", out, "--quiet"});
  EXPECT_TRUE(wait_for_batches(out, n, c.pid)) << slurp(c.err_file);
  kill(c.pid, SIGKILL);
  Ran r = c.wait();
  EXPECT_NE(manifest(out).value("state", ""), "complete") << "the run ended before it was killed";
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The lock and the signals

// A second `tessera run` (plain, --resume or --force) on a folder a live run holds is refused,
// naming the holder; the live run is not disturbed. SIGTERM then stops it after the batch being
// written, with exit 143, a manifest that names the batches kept, and a resume that ends with
// the outputs of a run that was never stopped.
TEST(RunFolder, SecondRunIsRefusedAndSigtermKeepsTheFinishedBatches) {
  const std::string d = temp_dir("lock");
  const std::string exp = experiment_file(d, 40, "{batch_size: 1}");
  const std::string out = d + "/run";
  Child a = start({"run", exp, "--out", out, "--quiet"});
  ASSERT_TRUE(wait_for_batches(out, 2, a.pid)) << slurp(a.err_file);
  // Frozen (holding its lock) while the others try, so that it cannot finish meanwhile.
  ASSERT_EQ(kill(a.pid, SIGSTOP), 0);
  for (const char* mode : {"", "--resume", "--force"}) {
    std::vector<std::string> args = {"run", exp, "--out", out, "--quiet"};
    if (*mode) args.push_back(mode);
    const Ran b = run_tessera(args);
    EXPECT_EQ(b.code, 2) << mode << ": " << b.err;
    EXPECT_NE(b.err.find("is in use by another tessera run (pid " + std::to_string(a.pid) + ","), std::string::npos)
        << mode << ": " << b.err;
  }
  EXPECT_TRUE(fs::exists(out + "/shards/batch-000000.jsonl"));  // --force removed nothing
  // SIGTERM, handled as soon as the run goes on: it stops after the batch it was writing.
  ASSERT_EQ(kill(a.pid, SIGTERM), 0);
  ASSERT_EQ(kill(a.pid, SIGCONT), 0);
  const Ran stopped = a.wait();
  EXPECT_EQ(stopped.code, 143) << stopped.err;
  const json m = manifest(out);
  ASSERT_TRUE(m.is_object());
  EXPECT_EQ(m["state"], "stopped");
  const size_t kept = m["done"].size();
  EXPECT_GE(kept, 2u);
  EXPECT_LT(kept, 40u);
  EXPECT_NE(stopped.err.find("stopped by SIGTERM: " + std::to_string(kept) + " of 40 batches kept in " + out +
                             "; continue with --resume"),
            std::string::npos)
      << stopped.err;
  for (const auto& done : m["done"]) {
    char name[64];
    std::snprintf(name, sizeof name, "/shards/batch-%06d.jsonl", done[0].get<int>());
    EXPECT_TRUE(fs::exists(out + name)) << name;
  }
  EXPECT_TRUE(temporaries(out).empty());
  EXPECT_FALSE(fs::exists(out + "/run.lock"));  // the lock goes with the run that held it

  const Ran resumed = run_tessera({"run", exp, "--out", out, "--resume", "--quiet"});
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("(" + std::to_string(kept) + " resumed)"), std::string::npos) << resumed.out;
  const Ran straight = run_tessera({"run", exp, "--out", d + "/straight", "--quiet"});
  EXPECT_EQ(straight.code, 0) << straight.err;
  expect_same_outputs(out, d + "/straight");
  EXPECT_EQ(manifest(out), manifest(d + "/straight"));
  fs::remove_all(d);
}

TEST(RunFolder, SigintStopsWithExit130AndTheRunResumes) {
  const std::string d = temp_dir("sigint");
  const std::string exp = experiment_file(d, 30, "{batch_size: 1}");
  const std::string out = d + "/run";
  Child a = start({"run", exp, "--out", out, "--quiet"});
  ASSERT_TRUE(wait_for_batches(out, 3, a.pid)) << slurp(a.err_file);
  ASSERT_EQ(kill(a.pid, SIGSTOP), 0);  // so that it cannot finish before the signal
  ASSERT_EQ(kill(a.pid, SIGINT), 0);
  ASSERT_EQ(kill(a.pid, SIGCONT), 0);
  const Ran stopped = a.wait();
  EXPECT_EQ(stopped.code, 130) << stopped.err;
  EXPECT_NE(stopped.err.find("stopped by SIGINT: "), std::string::npos) << stopped.err;
  EXPECT_EQ(manifest(out)["state"], "stopped");
  EXPECT_LT(manifest(out)["done"].size(), 30u);
  const Ran resumed = run_tessera({"run", exp, "--out", out, "--resume", "--quiet"});
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(manifest(out)["state"], "complete");
  fs::remove_all(d);
}

// A lock left by a run that is gone (killed with SIGKILL: its lock file names a dead pid) is taken
// over; and a run in this very process holds its lock against a second one here.
TEST(RunFolder, AStaleLockIsTakenOverAndTheLockHoldsWithinAProcess) {
  const std::string d = temp_dir("stale");
  const std::string exp = experiment_file(d, 60, "{batch_size: 2}");
  const Ran killed = killed_run(exp, d + "/run", 2);
  EXPECT_EQ(killed.code, -SIGKILL);
  EXPECT_TRUE(fs::exists(d + "/run/run.lock"));
  const Ran resumed = run_tessera({"run", exp, "--out", d + "/run", "--resume", "--quiet"});
  EXPECT_EQ(resumed.code, 0) << resumed.err;

  Diagnostics diags;
  std::optional<Experiment> e = load_experiment(exp, {}, &diags);
  ASSERT_TRUE(e) << diags.str();
  RunOptions o;
  o.out_dir = d + "/inner";
  o.progress = false;
  std::string second;
  o.on_batch = [&](int64_t done, int64_t) {
    if (done != 1) return;
    RunOptions again = o;
    again.on_batch = nullptr;
    again.force = true;
    Result<RunSummary> r = run_experiment(*e, again);
    second = r.ok() ? "ran" : r.status().message();
  };
  Result<RunSummary> first = run_experiment(*e, o);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(first->sequences, 60);
  EXPECT_NE(second.find(d + "/inner is in use by another tessera run (pid " + std::to_string(getpid()) + ","),
            std::string::npos)
      << second;
  fs::remove_all(d);
}

// ---------------------------------------------------------------------------------------------
// What resume reads

// Every field of manifest.json given each wrong type: --resume refuses with an error naming
// manifest.json and the key, or (a field resume does not read) goes on; never an abort.
TEST(RunFolder, ResumeRefusesWrongTypedManifestFieldsByName) {
  const std::string d = temp_dir("manifest");
  const std::string exp = experiment_file(d, 60, "{batch_size: 3}");
  killed_run(exp, d + "/killed", 2);
  const std::string text = slurp(d + "/killed/manifest.json");
  const json m = json::parse(text);
  const std::vector<json> wrong = {json("x"), json(7), json(2.5), json::array(), json::object(), json(nullptr), json(true)};
  // What a resume reads, and one field it does not.
  const std::set<std::string> read = {"format", "config_hash", "model_hash", "items", "plugins", "files", "done", "state"};
  int refused = 0;
  for (const auto& [key, value] : m.items()) {
    if (!read.count(key) && key != "experiment") continue;
    for (const json& w : wrong) {
      const bool same_type = w.type() == value.type() || (w.is_number_integer() && value.is_number_integer());
      if (same_type) continue;  // a wrong value of the right type: the tests of resume's refusals
      fs::remove_all(d + "/try");
      fs::copy(d + "/killed", d + "/try", fs::copy_options::recursive);
      json bad = m;
      bad[key] = w;
      write(d + "/try/manifest.json", bad.dump(2));
      const Ran r = run_tessera({"run", exp, "--out", d + "/try", "--resume", "--quiet"});
      ASSERT_GE(r.code, 0) << key << " = " << w.dump() << ": killed by signal " << -r.code << "\n" << r.err;
      if (r.code == 0) {
        EXPECT_FALSE(read.count(key)) << key << " = " << w.dump() << " was accepted";
        continue;
      }
      ++refused;
      EXPECT_EQ(r.code, 2) << key << " = " << w.dump() << ": " << r.err;
      EXPECT_NE(r.err.find("manifest.json"), std::string::npos) << key << " = " << w.dump() << ": " << r.err;
      EXPECT_NE(r.err.find("\"" + key + "\""), std::string::npos) << key << " = " << w.dump() << ": " << r.err;
      EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
    }
  }
  EXPECT_GE(refused, 40);
  // Entries of the lists, wrong inside.
  const std::vector<std::pair<std::string, json>> inner = {
      {"done", json::array({json::array({0})})},
      {"done", json::array({json::array({"0", "abc"})})},
      {"done", json::array({json::array({99999, "abc"})})},
      {"done", json::array({7})},
      {"plugins", json::array({7})},
      {"plugins", json::array({json{{"name", 3}, {"version", "1"}}})},
      {"files", json::array({"x"})},
      {"files", json::array({json{{"path", 3}, {"hash", "x"}}})},
      {"state", json("finished, probably")},
  };
  for (const auto& [key, w] : inner) {
    fs::remove_all(d + "/try");
    fs::copy(d + "/killed", d + "/try", fs::copy_options::recursive);
    json bad = m;
    bad[key] = w;
    write(d + "/try/manifest.json", bad.dump(2));
    const Ran r = run_tessera({"run", exp, "--out", d + "/try", "--resume", "--quiet"});
    EXPECT_EQ(r.code, 2) << key << " = " << w.dump() << ": " << r.err;
    EXPECT_NE(r.err.find("manifest.json"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("\"" + key + "\""), std::string::npos) << r.err;
  }
  fs::remove_all(d);
}

// Shards of finished batches that are cut short, hold garbage, or are gone: the resume redoes
// those batches (and says so) and ends with the outputs of a run that was never killed.
TEST(RunFolder, DamagedShardsAreRedoneOnResume) {
  const std::string d = temp_dir("shards");
  const std::string exp = experiment_file(d, 60, "{batch_size: 3}");
  killed_run(exp, d + "/killed", 6);
  const std::string shards = d + "/killed/shards/";
  const std::string s1 = slurp(shards + "batch-000001.jsonl");
  write(shards + "batch-000001.jsonl", s1.substr(0, s1.size() / 2));  // cut mid-line
  const std::string s2 = slurp(shards + "batch-000002.jsonl");
  write(shards + "batch-000002.jsonl", s2.substr(0, s2.size() - 1));  // its last newline gone
  write(shards + "batch-000003.jsonl", "not json\n");
  const std::string n4 = slurp(shards + "batch-000004.npy");
  write(shards + "batch-000004.npy", n4.substr(0, n4.size() - 7));  // the vectors cut short
  fs::remove(shards + "batch-000005.jsonl");
  write(shards + "batch-000000.jsonl", "{\"t\":\"seq\",\"id\":\"lines.txt:1\",\"item\":\"zero\",\"rows\":3}\n");
  const Ran r = run_tessera({"run", exp, "--out", d + "/killed", "--resume"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("shards/batch-000001.jsonl"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("redoing"), std::string::npos) << r.err;
  const Ran straight = run_tessera({"run", exp, "--out", d + "/straight", "--quiet"});
  EXPECT_EQ(straight.code, 0) << straight.err;
  expect_same_outputs(d + "/killed", d + "/straight");
  fs::remove_all(d);
}

// A complete run whose items changed is cut back into shards from its merged outputs: outputs
// that are not what the run wrote are a refusal naming the file, never an abort.
TEST(RunFolder, DamagedOutputsOfACompleteRunAreRefusedByName) {
  const std::string d = temp_dir("outputs");
  const std::string exp = experiment_file(d, 12, "{batch_size: 3}");
  ASSERT_EQ(run_tessera({"run", exp, "--out", d + "/run", "--quiet"}).code, 0);
  std::string lines = slurp(d + "/lines.txt");
  lines[0] = 'L';  // item 0 changed: its batch is redone, the others cut back into shards
  write(d + "/lines.txt", lines);
  fs::copy(d + "/run", d + "/clean", fs::copy_options::recursive);
  struct Damage {
    std::string file, bytes, named;
  };
  const std::vector<Damage> damages = {
      {"embeddings.npy", slurp(d + "/run/embeddings.npy").substr(0, 60), "embeddings.npy"},
      {"index.jsonl", "{\"id\":\"lines.txt:1\",\"item\":\"zero\",\"rows\":4}\n", "index.jsonl:1"},
      {"index.jsonl", slurp(d + "/run/index.jsonl").substr(0, 50), "index.jsonl:"},
      {"errors.jsonl", "[1, 2]\n", "errors.jsonl:1"},
  };
  for (const Damage& dm : damages) {
    fs::remove_all(d + "/run");
    fs::copy(d + "/clean", d + "/run", fs::copy_options::recursive);
    write(d + "/run/" + dm.file, dm.bytes);
    const Ran r = run_tessera({"run", exp, "--out", d + "/run", "--resume", "--quiet"});
    EXPECT_EQ(r.code, 2) << dm.file << ": " << r.err;
    EXPECT_NE(r.err.find(dm.named), std::string::npos) << dm.file << ": " << r.err;
  }
  // A 1-D array where the vectors were.
  fs::remove_all(d + "/run");
  fs::copy(d + "/clean", d + "/run", fs::copy_options::recursive);
  ASSERT_TRUE(npy::save(d + "/run/embeddings.npy", Tensor::zeros({12})).ok());
  const Ran flat = run_tessera({"run", exp, "--out", d + "/run", "--resume", "--quiet"});
  EXPECT_EQ(flat.code, 2) << flat.err;
  EXPECT_NE(flat.err.find("embeddings.npy is not a (rows, width) array"), std::string::npos) << flat.err;
  fs::remove_all(d);
}

// Temporary files of atomic writes that a kill left behind (".NAME.tmp.PID.N") are removed when
// the folder is opened again, wherever the run writes them.
TEST(RunFolder, TemporaryFilesLeftByAKillAreRemoved) {
  const std::string d = temp_dir("temps");
  const std::string exp = experiment_file(d, 30, "{batch_size: 3}");
  killed_run(exp, d + "/killed", 3);
  fs::create_directories(d + "/killed/attention");
  const std::vector<std::string> left = {d + "/killed/.manifest.json.tmp.999999999.4",
                                         d + "/killed/shards/.batch-000003.jsonl.tmp.999999999.7",
                                         d + "/killed/shards/.batch-000003.npy.tmp.12.0",
                                         d + "/killed/attention/.x.layer0.npy.tmp.999999999.1"};
  for (const std::string& f : left) write(f, "half");
  write(d + "/killed/notes.tmp.txt", "mine");  // not one of ours: stays
  const Ran r = run_tessera({"run", exp, "--out", d + "/killed", "--resume", "--quiet"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(temporaries(d + "/killed") == std::vector<std::string>{d + "/killed/notes.tmp.txt"});
  EXPECT_EQ(slurp(d + "/killed/notes.tmp.txt"), "mine");
  fs::remove_all(d);
}

// A dangling symbolic link (and a link loop) in the run folder: the run and the listing of its
// files go on.
TEST(RunFolder, DanglingSymlinksInTheRunFolderDoNotAbort) {
  const std::string d = temp_dir("symlink");
  const std::string exp = experiment_file(d, 5, "{batch_size: 2}");
  fs::create_directories(d + "/run");
  fs::create_symlink(d + "/nowhere", d + "/run/dangling");
  fs::create_symlink(d + "/run/loop", d + "/run/loop");
  const Ran r = run_tessera({"run", exp, "--out", d + "/run", "--quiet"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(d + "/run/dangling"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(d + "/run/embeddings.npy"), std::string::npos) << r.out;
  const Ran again = run_tessera({"run", exp, "--out", d + "/run", "--resume", "--quiet"});
  EXPECT_EQ(again.code, 0) << again.err;
  fs::remove_all(d);
}

// ---------------------------------------------------------------------------------------------
// Windows and numbers

TEST(Batching, ForwardChunksHoldAtMostTheBatchSize) {
  using run::forward_chunks;
  EXPECT_TRUE(forward_chunks(0, 4).empty());
  EXPECT_EQ(forward_chunks(3, 4), (std::vector<std::pair<size_t, size_t>>{{0, 3}}));
  EXPECT_EQ(forward_chunks(4, 4), (std::vector<std::pair<size_t, size_t>>{{0, 4}}));
  EXPECT_EQ(forward_chunks(9, 4), (std::vector<std::pair<size_t, size_t>>{{0, 4}, {4, 8}, {8, 9}}));
  EXPECT_EQ(forward_chunks(2, 0), (std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 2}}));
}

// One protein that becomes many windows goes to the model at most runtime.batch_size windows at a
// time, and gives the same outputs (rows, starts, vectors within float rounding) as one forward.
TEST(Batching, TheWindowsOfOneItemAreSplitAcrossForwardPasses) {
  const std::string d = temp_dir("windows");
  std::string residues;
  for (int i = 0; i < 700; ++i) residues += "ACDEFGHIKLMNPQRSTVWY"[(i * 7 + i / 3) % 20];
  write(d + "/p.fasta", ">long\n" + residues + "\n>short\nMKV\n");
  auto experiment_with = [&](int batch_size, const std::string& task) {
    const std::string yaml =
        "plugins:\n  - name: protein\n    options: {max_length: 34, length_policy: windows, stride: 16}\n"
        "model:\n  d_model: 16\n  n_heads: 2\n  n_layers: 2\n  stem: {kind: tokens, vocab_size: 33}\n"
        "  positions: {kind: learned, max_len: 64}\n  head: {kind: pool, pool: mean}\n"
        "data: {path: p.fasta}\nruntime: {batch_size: " + std::to_string(batch_size) + "}\ntask: {kind: " + task + "}\n";
    Diagnostics diags;
    std::optional<Experiment> e = load_experiment_from_string(yaml, "w.yaml", d, {}, &diags);
    EXPECT_TRUE(e) << diags.str();
    return *e;
  };
  for (const char* task : {"embed", "hidden"}) {
    RunOptions o;
    o.progress = false;
    o.out_dir = d + "/small_" + task;
    Result<RunSummary> small = run_experiment(experiment_with(2, task), o);
    ASSERT_TRUE(small.ok()) << small.status().message();
    EXPECT_EQ(small->sequences, 44);  // 43 windows of the long one, and the short one
    EXPECT_EQ(small->largest_forward, 2);
    o.out_dir = d + std::string("/big_") + task;
    Result<RunSummary> big = run_experiment(experiment_with(64, task), o);
    ASSERT_TRUE(big.ok()) << big.status().message();
    EXPECT_EQ(big->largest_forward, 44);
    const std::string leaf = std::string(task) == "embed" ? "/embeddings.npy" : "/hidden.npy";
    const Tensor a = npy::load(d + "/small_" + task + leaf).value(), b = npy::load(d + "/big_" + task + leaf).value();
    ASSERT_EQ(a.shape(), b.shape());
    const auto va = a.to_vector(), vb = b.to_vector();
    for (size_t i = 0; i < va.size(); ++i) ASSERT_NEAR(va[i], vb[i], 1e-5) << task << " value " << i;
    EXPECT_EQ(slurp(d + "/small_" + task + "/index.jsonl"), slurp(d + "/big_" + task + "/index.jsonl"));
    EXPECT_EQ(slurp(d + "/small_" + task + "/rows.jsonl"), slurp(d + "/big_" + task + "/rows.jsonl"));
  }
  fs::remove_all(d);
}

// An item whose outputs are not finite (here: a byte whose embedding row is huge, so its sequence
// overflows) is a bad item, named with the output, and the rest of its batch is written.
TEST(Numerics, NonFiniteOutputsMakeTheItemBad) {
  const std::string d = temp_dir("nonfinite");
  write(d + "/t.txt", "fine one\nhas an N in it\nfine two\nand fine three\n");
  for (const char* task : {"embed", "hidden"}) {
    const std::string yaml = "plugins:\n  - name: probe\n    path: " + kPluginDir +
                             "\nmodel:\n  d_model: 16\n  n_heads: 2\n  n_layers: 2\n  stem: {kind: tokens, vocab_size: 300}\n"
                             "  positions: {kind: learned, max_len: 512}\n  head: {kind: pool, pool: mean}\n"
                             "data: {path: t.txt}\nruntime: {batch_size: 4}\ntask: {kind: " + std::string(task) + "}\n";
    Diagnostics diags;
    std::optional<Experiment> e = load_experiment_from_string(yaml, "n.yaml", d, {}, &diags);
    ASSERT_TRUE(e) << diags.str();
    // The embedding table with the row of 'N' (the probe's id: byte + 1) at FLT_MAX.
    Result<Model> m = Model::build(e->model);
    ASSERT_TRUE(m.ok()) << m.status().message();
    std::string table;
    for (const auto& [name, t] : m->parameters())
      if (t.shape().rank() == 2 && t.dim(0) == 300) table = name;
    ASSERT_FALSE(table.empty());
    Tensor w = m->parameters().get(table).contiguous().clone();
    for (int64_t c = 0; c < 16; ++c) w.data<float>()[('N' + 1) * 16 + c] = FLT_MAX;
    e->model.weights.imported[table] = {w, "the test"};
    RunOptions o;
    o.progress = false;
    o.out_dir = d + "/" + task;
    Result<RunSummary> r = run_experiment(*e, o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->failed, 1) << task;
    EXPECT_EQ(r->sequences, 3) << task;
    const std::string errors = slurp(o.out_dir + "/errors.jsonl");
    EXPECT_NE(errors.find("\"id\":\"t.txt:2\""), std::string::npos) << errors;
    EXPECT_NE(errors.find("non-finite output in " + std::string(task == std::string("embed") ? "embeddings" : "hidden")),
              std::string::npos)
        << errors;
    // ... and where the values went wrong: the model's first layer that made them.
    EXPECT_NE(errors.find("first appears in"), std::string::npos) << errors;
    const Tensor v = npy::load(o.out_dir + (task == std::string("embed") ? "/embeddings.npy" : "/hidden.npy")).value();
    for (float x : v.to_vector()) ASSERT_TRUE(std::isfinite(x)) << task;
    EXPECT_EQ(slurp(o.out_dir + "/index.jsonl").find("t.txt:2"), std::string::npos);
  }
  fs::remove_all(d);
}

// ---------------------------------------------------------------------------------------------
// A full disk and a read-only folder

// Items whose rows grow with their number, so that a shard grows with its batch number: a limit
// on a file's size is then reached part-way through the run, after some batches are done.
std::string growing_experiment(const std::string& dir) {
  std::string text;
  for (int i = 0; i < 48; ++i) text += "item " + std::to_string(i) + " " + std::string(static_cast<size_t>(8 + 8 * i), 'a' + i % 26) + "\n";
  const std::string exp = experiment_file(dir, 1, "{batch_size: 4}");
  write(dir + "/lines.txt", text);
  return exp;
}

// A write that fails for want of room (a file past RLIMIT_FSIZE fails with EFBIG, as one on a full
// disk fails with ENOSPC: the same failing write) ends the run with exit 1 and the file named. The
// batches done before it stay done, no temporary file is left, and a resume with room finishes the
// run with the bytes of a run that never failed. The first limit is reached by a shard part-way
// through the run, the second by a merged output after every batch is done.
TEST(RunFolder, AFullDiskEndsTheRunWithExit1AndTheRunResumes) {
  const std::string d = temp_dir("full");
  const std::string exp = growing_experiment(d);
  ASSERT_EQ(run_tessera({"run", exp, "--out", d + "/ref", "--quiet"}).code, 0);
  const rlim_t merged_rows = fs::file_size(d + "/ref/rows.jsonl");
  struct Case {
    std::string name;
    rlim_t limit;
    size_t min_done, max_done;  // batches kept when the write failed
  };
  for (const Case& c : {Case{"shard", 16384, 1, 11}, Case{"merge", merged_rows / 2, 12, 12}}) {
    SCOPED_TRACE(c.name);
    const std::string out = d + "/" + c.name;
    Confinement lim;
    lim.max_file_bytes = c.limit;
    const Ran r = run_confined({"run", exp, "--out", out, "--quiet"}, lim);
    ASSERT_NE(r.code, kCannotConfine) << r.err;
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(out + "/"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("cannot write"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("continue with --resume"), std::string::npos) << r.err;
    EXPECT_NE(manifest(out).value("state", ""), "complete");
    EXPECT_GE(batches_done(out), c.min_done);
    EXPECT_LE(batches_done(out), c.max_done);
    EXPECT_TRUE(temporaries(out).empty()) << temporaries(out)[0];
    const Ran resumed = run_tessera({"run", exp, "--out", out, "--quiet", "--resume"});
    EXPECT_EQ(resumed.code, 0) << resumed.err;
    expect_same_outputs(d + "/ref", out);
  }
  fs::remove_all(d);
}

// A run folder that cannot be written is refused with exit 1, naming the folder and the reason,
// and nothing in it changes: a new run under a read-only folder, the resume of a stopped run in a
// read-only folder. Once the folder is writable again, the resume finishes the run.
TEST(RunFolder, AReadOnlyFolderIsRefusedAndLeftAsItWas) {
  const std::string d = temp_dir("readonly");
  const std::string exp = experiment_file(d, 24, "{batch_size: 2}");
  ASSERT_EQ(run_tessera({"run", exp, "--out", d + "/ref", "--quiet"}).code, 0);
  Confinement obey;
  obey.obey_permissions = true;

  // A new run in a folder below a read-only one.
  fs::create_directories(d + "/locked");
  set_read_only(d + "/locked", true);
  const Ran fresh = run_confined({"run", exp, "--out", d + "/locked/run", "--quiet"}, obey);
  set_read_only(d + "/locked", false);
  if (fresh.code == kCannotConfine) GTEST_SKIP() << "cannot give up root's permission overrides here";
  EXPECT_EQ(fresh.code, 1) << fresh.err;
  EXPECT_NE(fresh.err.find(d + "/locked/run"), std::string::npos) << fresh.err;
  EXPECT_NE(fresh.err.find("Permission denied"), std::string::npos) << fresh.err;
  EXPECT_FALSE(fs::exists(d + "/locked/run"));

  // A stopped run, its folder then made read-only.
  const std::string out = d + "/stopped";
  killed_run(exp, out, 3);
  std::map<std::string, std::string> before;
  for (const auto& f : fs::recursive_directory_iterator(out))
    if (f.is_regular_file()) before[f.path().string()] = slurp(f.path().string());
  set_read_only(out, true);
  const Ran resumed = run_confined({"run", exp, "--out", out, "--quiet", "--resume"}, obey);
  set_read_only(out, false);
  EXPECT_EQ(resumed.code, 1) << resumed.err;
  EXPECT_NE(resumed.err.find(out), std::string::npos) << resumed.err;
  EXPECT_NE(resumed.err.find("Permission denied"), std::string::npos) << resumed.err;
  EXPECT_NE(resumed.err.find("continue with --resume"), std::string::npos) << resumed.err;
  std::map<std::string, std::string> after;
  for (const auto& f : fs::recursive_directory_iterator(out))
    if (f.is_regular_file()) after[f.path().string()] = slurp(f.path().string());
  EXPECT_EQ(before, after);
  const Ran again = run_tessera({"run", exp, "--out", out, "--quiet", "--resume"});
  EXPECT_EQ(again.code, 0) << again.err;
  expect_same_outputs(d + "/ref", out);
  fs::remove_all(d);
}

