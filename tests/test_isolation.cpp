// Plugins in worker processes (Encoder::isolate): an item on which the plugin segfaults, aborts,
// spins forever, throws across the C ABI or allocates without bound is one bad item with the signal
// or the limit as its reason; the worker is replaced, and every other item encodes exactly as it
// does in-process. Also the per-item size limits (bytes, rows), the wire format, and the "before":
// the same hostile items kill a process that encodes them itself.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "plugins/workers.h"
#include "process_util.h"
#include "tessera/config.h"
#include "tessera/plugins.h"
#include "tessera/run.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

const std::string kTestPlugins = TESSERA_TEST_PLUGIN_DIR;  // hostile, probe
const std::string kPlugins = TESSERA_PLUGIN_BUILD_DIR;     // the real plugins

std::shared_ptr<const Plugin> load(const std::string& file) {
  auto p = Plugin::load(file);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : nullptr;
}

std::shared_ptr<const Plugin> hostile() {
  static std::shared_ptr<const Plugin> p = load(kTestPlugins + "/libtessera_hostile.so");
  return p;
}

// Every option of plugin p, its defaults overridden by `given`, as the config loader passes them.
std::vector<std::pair<std::string, std::string>> all_options(const Plugin& p, const std::map<std::string, std::string>& given) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const PluginOptionSpec& s : p.options()) {
    const auto it = given.find(s.name);
    out.emplace_back(s.name, it != given.end() ? it->second : s.default_value.value_or(""));
  }
  return out;
}

Encoder make(std::shared_ptr<const Plugin> p, const std::map<std::string, std::string>& given = {}) {
  auto e = Encoder::create(p, all_options(*p, given));
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e).value();
}

ItemLimits test_limits(double timeout_s = 20, int64_t memory_mb = 1024) {
  ItemLimits l;
  l.item_timeout_s = timeout_s;
  l.worker_memory_mb = memory_mb;
  return l;
}

Encoder isolated(std::shared_ptr<const Plugin> p, const ItemLimits& l, const std::map<std::string, std::string>& given = {}) {
  Encoder e = make(std::move(p), given);
  const Status st = e.isolate(l);
  EXPECT_TRUE(st.ok()) << st.message();
  return e;
}

PluginItem item(const std::string& id, const std::string& text) {
  PluginItem it;
  it.id = id;
  it.source = "items.txt";
  it.data = text;
  return it;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every field of two encodings, bit for bit (features and provenance as bytes).
void expect_same(const std::vector<TokenRows>& a, const std::vector<TokenRows>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    const TokenRows &x = a[s], &y = b[s];
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.ids, y.ids);
    ASSERT_EQ(x.features.defined(), y.features.defined());
    if (x.features.defined()) {
      ASSERT_EQ(x.features.shape(), y.features.shape());
      EXPECT_EQ(std::memcmp(x.features.raw_data(), y.features.raw_data(), x.features.nbytes()), 0);
    }
    EXPECT_EQ(x.positions, y.positions);
    EXPECT_EQ(x.roles, y.roles);
    ASSERT_EQ(x.provenance.size(), y.provenance.size());
    EXPECT_EQ(std::memcmp(x.provenance.data(), y.provenance.data(), x.provenance.size() * sizeof(tsr_provenance)), 0);
    EXPECT_EQ(x.grid_rows, y.grid_rows);
    EXPECT_EQ(x.grid_cols, y.grid_cols);
    EXPECT_EQ(x.picture.width, y.picture.width);
    EXPECT_EQ(x.picture.height, y.picture.height);
    EXPECT_EQ(x.picture.channels, y.picture.channels);
    EXPECT_EQ(x.picture.pixels, y.picture.pixels);
    EXPECT_EQ(x.picture.x0, y.picture.x0);
    EXPECT_EQ(x.picture.x1, y.picture.x1);
    EXPECT_EQ(x.picture.y0, y.picture.y0);
    EXPECT_EQ(x.picture.y1, y.picture.y1);
    EXPECT_EQ(x.label, y.label);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// How the SEGV item's worker ends. Under AddressSanitizer and UBSan (the sanitizer build), the
// sanitizers catch the plugin's null store themselves and end the process with status 1 before
// the kernel's SIGSEGV can.
#if defined(__SANITIZE_ADDRESS__)
constexpr const char* kSegvEnd = "'s worker process exited with status 1 while encoding it; a new worker takes the next item";
#else
constexpr const char* kSegvEnd =
    "'s worker process was killed by SIGSEGV (segmentation fault) while encoding it; a new worker takes the next item";
#endif

// A process that did not end normally: killed by a signal, or (sanitizers) exited with a failure.
bool died(int status) { return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0); }

}  // namespace

// ---- The "before": what a hostile item does to a process that encodes it itself ----------------

TEST(IsolationBefore, InProcessASegfaultOrAbortKillsTheWholeProcess) {
  const Encoder here = make(hostile());
  EXPECT_EXIT((void)here.encode(item("items.txt:2", "SEGV")), died, "");
  EXPECT_EXIT((void)here.encode(item("items.txt:4", "ABORT")), testing::KilledBySignal(SIGABRT), "");
}

TEST(IsolationBefore, AnExceptionAcrossTheCAbiOnARunnerThreadEndsInTerminate) {
  // The runner encodes on std::threads. Before Encoder::encode caught it, an exception a plugin let
  // out of its C entry point reached the thread's end: std::terminate, SIGABRT, the run lost.
  const tsr_plugin* t = hostile()->table();
  EXPECT_EXIT(
      {
        std::thread th([t] {
          void* enc = nullptr;
          tsr_error err{};
          err.size = sizeof err;
          (void)t->create(nullptr, 0, &enc, &err);
          const tsr_item in{sizeof(tsr_item), "x", nullptr, reinterpret_cast<const uint8_t*>("THROW"), 5, 0, 0};
          tsr_encoding* out = nullptr;
          (void)t->encode(enc, &in, &out, &err);  // the plugin's own call, as the host made it before
        });
        th.join();
        std::exit(0);
      },
      testing::KilledBySignal(SIGABRT), "");
}

TEST(IsolationBefore, InProcessEncodeNowTurnsAnEscapingExceptionIntoABadItem) {
  // The same item through Encoder::encode on a thread: a bad item, and the process lives.
  const Encoder here = make(hostile());
  EXPECT_EXIT(
      {
        std::string message;
        std::thread th([&] {
          auto r = here.encode(item("items.txt:6", "THROW"));
          message = r.ok() ? "ok" : r.status().message();
        });
        th.join();
        std::exit(contains(message, "items.txt:6: plugin hostile") &&
                          contains(message, "threw a C++ exception out of encode(): hostile: thrown across the C ABI")
                      ? 0
                      : 1);
      },
      testing::ExitedWithCode(0), "");
}

// ---- Workers ------------------------------------------------------------------------------------

TEST(Isolation, EachHostileItemIsOneBadItemAndTheGoodOnesEncodeAsInProcess) {
  const Encoder here = make(hostile());
  Encoder pool = isolated(hostile(), test_limits());
  ASSERT_TRUE(pool.isolated());
  const pid_t first = static_cast<pid_t>(pool.worker_pid());
  ASSERT_GT(first, 0);
  const std::vector<std::pair<std::string, std::string>> items = {
      {"hello, world", ""},
      {"SEGV", kSegvEnd},
      {"good two", ""},
      {"ABORT", "'s worker process was killed by SIGABRT (aborted) while encoding it"},
      {"third one", ""},
      {"THROW", "threw a C++ exception out of encode(): hostile: thrown across the C ABI (a bug in the plugin)"},
      {"fourth", ""},
      {"", "hostile: an empty item"},
      {"the fifth and last", ""}};
  int line = 0;
  for (const auto& [text, reason] : items) {
    const std::string id = "items.txt:" + std::to_string(++line);
    SCOPED_TRACE(id + " \"" + text + "\"");
    auto r = pool.encode(item(id, text));
    if (reason.empty()) {
      ASSERT_TRUE(r.ok()) << r.status().message();
      auto ref = here.encode(item(id, text));
      ASSERT_TRUE(ref.ok()) << ref.status().message();
      expect_same(*r, *ref);
    } else {
      ASSERT_FALSE(r.ok());
      EXPECT_TRUE(contains(r.status().message(), reason)) << r.status().message();
      if (!text.empty()) {
        EXPECT_TRUE(contains(r.status().message(), id + ": plugin hostile (")) << r.status().message();
      } else {
        EXPECT_EQ(r.status().code(), Code::parse_error);  // the plugin's TSR_BAD_INPUT (4), as it said
      }
    }
  }
  EXPECT_EQ(pool.workers_started(), 3);  // the first, and one for each worker that died
  EXPECT_NE(pool.worker_pid(), first);
  EXPECT_EQ(::kill(first, 0), -1);  // the dead one was reaped: no zombie left behind
}

TEST(Isolation, AnEndlessLoopIsStoppedAtTheTimeLimitAndTheNextItemEncodes) {
  Encoder pool = isolated(hostile(), test_limits(1));
  const auto t0 = std::chrono::steady_clock::now();
  auto r = pool.encode(item("items.txt:9", "LOOP"));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::out_of_range);
  EXPECT_TRUE(contains(r.status().message(),
                       "items.txt:9: plugin hostile (" + kTestPlugins +
                           "/libtessera_hostile.so) did not finish encoding it in 1 s (limit runtime.item_timeout_s = 1): "
                           "its worker process was stopped; a new worker takes the next item"))
      << r.status().message();
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 5.0);
  auto next = pool.encode(item("items.txt:10", "after the loop"));
  ASSERT_TRUE(next.ok()) << next.status().message();
  EXPECT_EQ((*next)[0].size(), 14);
  EXPECT_EQ(pool.workers_started(), 2);
}

TEST(Isolation, UnboundedAllocationEndsAtTheWorkersMemoryLimit) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory and an address-space limit do not mix";
#endif
  Encoder pool = isolated(hostile(), test_limits(20, 256));
  auto r = pool.encode(item("items.txt:3", "ALLOC"));
  ASSERT_FALSE(r.ok());
  // The hostile plugin writes through the null malloc returns at the limit, as careless code does.
  EXPECT_TRUE(contains(r.status().message(), "items.txt:3: plugin hostile")) << r.status().message();
  EXPECT_TRUE(contains(r.status().message(), "worker process was killed by SIGSEGV")) << r.status().message();
  auto next = pool.encode(item("items.txt:4", "fine"));
  ASSERT_TRUE(next.ok()) << next.status().message();
}

TEST(Isolation, RunningOutOfTheWorkersMemoryIsNamedWithItsLimit) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory and an address-space limit do not mix";
#endif
  Encoder pool = isolated(hostile(), test_limits(20, 256));
  auto r = pool.encode(item("items.txt:5", "OOM"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "items.txt:5: plugin hostile (" + kTestPlugins +
                                      "/libtessera_hostile.so) ran out of memory encoding it (a worker may map "
                                      "runtime.worker_memory_mb = 256 MiB more than it started with: raise it, or make "
                                      "such items smaller)");
  EXPECT_EQ(pool.workers_started(), 1);  // the plugin survived it
  auto next = pool.encode(item("items.txt:6", "fine"));
  ASSERT_TRUE(next.ok()) << next.status().message();
}

TEST(Isolation, CtrlCIsTheParentsToHandleNotTheWorkers) {
  Encoder pool = isolated(hostile(), test_limits());
  const pid_t pid = static_cast<pid_t>(pool.worker_pid());
  ASSERT_EQ(::kill(pid, SIGINT), 0);  // what a terminal's Ctrl-C sends the whole process group
  auto r = pool.encode(item("items.txt:1", "still here"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(pool.worker_pid(), pid);
}

TEST(Isolation, AWorkerKilledBetweenItemsIsReplacedWithoutBlamingTheNextItem) {
  Encoder pool = isolated(hostile(), test_limits());
  const pid_t pid = static_cast<pid_t>(pool.worker_pid());
  ASSERT_EQ(::kill(pid, SIGKILL), 0);  // as the kernel's out-of-memory killer would
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT), 0);  // dead, left for the pool to reap
  auto r = pool.encode(item("items.txt:2", "innocent"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(pool.workers_started(), 2);
  EXPECT_NE(pool.worker_pid(), pid);
}

TEST(Isolation, AnOutOfRangeTimeLimitIsNoLimit) {
  for (double t : {1e300, -1.0, std::nan("")}) {
    Encoder pool = isolated(hostile(), test_limits(t));
    auto r = pool.encode(item("items.txt:1", "fine"));
    ASSERT_TRUE(r.ok()) << t << ": " << r.status().message();
  }
}

TEST(Isolation, AWorkerForkedFromAThreadThatRanOpenMPCanRunOpenMP) {
  // The model's thread has an OpenMP pool whose threads a plain fork() of it would not have: a
  // worker forked there hung in the plugin's first parallel region. Workers are forked from a
  // fresh thread.
  int threads = 0;
#pragma omp parallel num_threads(2) reduction(+ : threads)
  threads += 1;
  ASSERT_EQ(threads, 2);
  Encoder pool = isolated(hostile(), test_limits(5));
  auto r = pool.encode(item("items.txt:1", "OMP here"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto crash = pool.encode(item("items.txt:2", "SEGV"));  // the replacement, forked from this thread too
  ASSERT_FALSE(crash.ok());
  auto again = pool.encode(item("items.txt:3", "OMP again"));
  ASSERT_TRUE(again.ok()) << again.status().message();
}

TEST(Isolation, TheWorkerEndsWithItsEncoder) {
  pid_t pid = 0;
  {
    Encoder pool = isolated(hostile(), test_limits());
    pid = static_cast<pid_t>(pool.worker_pid());
    ASSERT_GT(pid, 0);
    EXPECT_EQ(::kill(pid, 0), 0);
  }
  EXPECT_EQ(::kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

TEST(Isolation, RealPluginsRowsCrossTheWorkerBitForBit) {
  // Feature rows with a picture (image) and several labelled windows (protein).
  const std::string image_file = kPlugins + "/libtessera_image.so", protein_file = kPlugins + "/libtessera_protein.so";
  int checked = 0;
  if (fs::exists(image_file)) {
    auto p = load(image_file);
    const std::string jpeg = read_file(std::string(TESSERA_TEST_DATA) + "/image/chelsea.jpg");
    ASSERT_FALSE(jpeg.empty());
    const Encoder here = make(p);
    Encoder pool = isolated(p, test_limits());
    auto a = pool.encode(item("chelsea.jpg", jpeg));
    auto b = here.encode(item("chelsea.jpg", jpeg));
    ASSERT_TRUE(a.ok()) << a.status().message();
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_EQ((*a)[0].kind, TSR_ROWS_FEATURES);
    EXPECT_GT((*a)[0].picture.width, 0);
    expect_same(*a, *b);
    ++checked;
  }
  if (fs::exists(protein_file)) {
    auto p = load(protein_file);
    const std::map<std::string, std::string> o = {{"length_policy", "windows"}, {"max_length", "40"}, {"stride", "13"}};
    const std::string fasta = ">sp|X|Y a protein\nMKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQ\nFEVVHSLAKWKRQTLGQHDFSAGEGLYTHMKALRPDEDRLSPLHSVYVDQWDWERVMGDGERQFSTLKSTVE\n";
    const Encoder here = make(p, o);
    Encoder pool = isolated(p, test_limits(), o);
    auto a = pool.encode(item("s.fasta#1", fasta));
    auto b = here.encode(item("s.fasta#1", fasta));
    ASSERT_TRUE(a.ok()) << a.status().message();
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_GT(a->size(), 3u);
    EXPECT_EQ((*a)[1].label, "w1");
    expect_same(*a, *b);
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "neither the image nor the protein plugin is built";
}

// ---- Size limits: in-process and in workers alike -----------------------------------------------

TEST(ItemLimits, BytesAndRowsAreRefusedNamingTheItemTheSizeAndTheOption) {
  ItemLimits l = test_limits();
  l.max_item_bytes = 16;
  l.max_item_rows = 1000;
  Encoder here = make(hostile());
  here.limit(l);
  Encoder pool = isolated(hostile(), l);
  for (Encoder* e : {&here, &pool}) {
    SCOPED_TRACE(e->isolated() ? "in a worker" : "in-process");
    auto big = e->encode(item("items.txt:7", "seventeen bytes!!"));
    ASSERT_FALSE(big.ok());
    EXPECT_EQ(big.status().code(), Code::out_of_range);
    EXPECT_EQ(big.status().message(),
              "items.txt:7: 17 bytes, more than runtime.max_item_bytes = 16 (split the input, or raise runtime.max_item_bytes)");
    auto fits = e->encode(item("items.txt:8", "sixteen bytes!!!"));
    ASSERT_TRUE(fits.ok()) << fits.status().message();
    auto rows = e->encode(item("items.txt:9", "ROWS"));  // the plugin makes 1,000,000 rows of it
    ASSERT_FALSE(rows.ok());
    EXPECT_EQ(rows.status().code(), Code::out_of_range);
    EXPECT_TRUE(contains(rows.status().message(), "items.txt:9: plugin hostile (")) << rows.status().message();
    EXPECT_TRUE(contains(rows.status().message(),
                         "made 1000000 rows in 1 sequence(s), more than runtime.max_item_rows = 1000 (give the plugin a "
                         "maximum length or fewer windows, or raise runtime.max_item_rows)"))
        << rows.status().message();
  }
  EXPECT_EQ(pool.workers_started(), 1);  // limits are refusals, not deaths
}

// ---- The wire format ------------------------------------------------------------------------------

TEST(IsolationWire, RoundTripsEveryFieldAndRefusesEveryTruncation) {
  TokenRows t;
  t.kind = TSR_ROWS_FEATURES;
  t.features = Tensor::empty({3, 2});
  float* f = t.features.data<float>();
  const float values[6] = {0.5f, -1.25f, 3e-30f, -0.0f, 7.f, 1e30f};
  std::memcpy(f, values, sizeof values);
  t.positions = {{0, -1}, {1, 0}, {1, 1}};
  t.roles = {TSR_ROLE_CLS, TSR_ROLE_CONTENT, TSR_ROLE_CONTENT};
  t.provenance = {{TSR_PROV_NONE, 0, 0, 0, 0, 0}, {TSR_PROV_PIXELS, 0, 0, 16, 0, 16}, {TSR_PROV_PIXELS, 0, 16, 32, 0, 16}};
  t.grid_rows = 1;
  t.grid_cols = 2;
  t.picture.width = 2;
  t.picture.height = 1;
  t.picture.channels = 3;
  t.picture.pixels = {1, 2, 3, 4, 5, 6};
  t.picture.x1 = 32;
  t.picture.y1 = 16;
  t.label = "w7";
  TokenRows ids;
  ids.ids = {5, 6};
  ids.positions = {{0, -1}, {1, -1}};
  ids.roles = {TSR_ROLE_CONTENT, TSR_ROLE_EOS};
  ids.provenance = {{TSR_PROV_BYTES, 0, 0, 1, 0, 0}, {TSR_PROV_NONE, 0, 0, 0, 0, 0}};
  const std::vector<TokenRows> seqs = {t, ids};
  const std::string wire = plugin_workers::pack_result(seqs);
  auto back = plugin_workers::unpack_result(wire);
  ASSERT_TRUE(back.ok()) << back.status().message();
  expect_same(*back, seqs);
  for (size_t n = 0; n < wire.size(); ++n) {
    auto cut = plugin_workers::unpack_result(wire.substr(0, n));
    ASSERT_FALSE(cut.ok()) << "cut at " << n;
    EXPECT_TRUE(contains(cut.status().message(), "garbled"));
  }
  auto err = plugin_workers::unpack_result(plugin_workers::pack_result(Status::OutOfRange("items.txt:3: too long")));
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.status().code(), Code::out_of_range);
  EXPECT_EQ(err.status().message(), "items.txt:3: too long");

  const std::string bytes("bytes\0and more", 14);  // PluginItem::data views it: it must outlive `in`
  PluginItem in = item("a.txt:1", bytes);
  in.source_offset = 99;
  in.source_line = 3;
  PluginItem out;
  const std::string packed = plugin_workers::pack_item(in);
  ASSERT_TRUE(plugin_workers::unpack_item(packed, &out));
  EXPECT_EQ(out.id, in.id);
  EXPECT_EQ(out.source, in.source);
  EXPECT_EQ(out.data, in.data);
  EXPECT_EQ(out.source_offset, 99u);
  EXPECT_EQ(out.source_line, 3u);
}

// ---- A batch run -----------------------------------------------------------------------------------

// Runs `lines` (one item a line) through the hostile plugin with `runtime` (YAML lines under
// runtime:) in a child, so that a run that dies cannot take the test with it. Returns "items N
// failed F sequences S" or "error: ...", and errors.jsonl in *errors; "died: <signal>" when it died.
static std::string run_hostile_lines(const std::string& name, const std::string& lines, const std::string& runtime,
                                     std::string* errors) {
  const std::string dir = ::testing::TempDir() + "tessera_isolation_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "/lines.txt") << lines;
  const std::string yaml = "plugins:\n  - name: hostile\n    path: " + kTestPlugins +
                           "\nmodel:\n  d_model: 16\n  n_heads: 2\n  n_layers: 1\n  stem: {kind: tokens, vocab_size: 300}\n"
                           "  positions: {kind: learned, max_len: 64}\n  head: {kind: pool, pool: mean}\n"
                           "data:\n  path: " + dir + "/lines.txt\nruntime:\n  batch_size: 3\n" + runtime;
  Diagnostics d;
  std::optional<Experiment> e = load_experiment_from_string(yaml, "exp.yaml", dir, {}, &d);
  if (!e) return "config: " + d.str();
  const testing_util::ChildRun child = testing_util::run_in_child([&] {
    RunOptions o;
    o.out_dir = dir + "/run";
    o.progress = false;
    Result<RunSummary> r = run_experiment(*e, o);
    return r.ok() ? "items " + std::to_string(r->items) + " failed " + std::to_string(r->failed) + " sequences " +
                        std::to_string(r->sequences)
                  : "error: " + r.status().message();
  });
  std::string got = child.text;
  if (!child.exited())
    got = std::string("died: ") +
          (WIFSIGNALED(child.status) ? plugin_workers::signal_description(WTERMSIG(child.status)) : "?");
  *errors = fs::exists(dir + "/run/errors.jsonl") ? read_file(dir + "/run/errors.jsonl") : std::string();
  fs::remove_all(dir);
  return got;
}

TEST(IsolationRun, HostileItemsAreRecordedAsBadItemsAndTheRunFinishes) {
  // Before the runner isolated its plugins, the SEGV line killed `tessera run` (and every --resume
  // replayed it).
  std::string errors;
  EXPECT_EQ(run_hostile_lines("run", "one\ntwo\nSEGV here\nfour\nABORT now\nsix\nTHROW it\neight\n", "", &errors),
            "items 8 failed 3 sequences 5");
  EXPECT_TRUE(contains(errors, kSegvEnd)) << errors;
  EXPECT_TRUE(contains(errors, "worker process was killed by SIGABRT")) << errors;
  EXPECT_TRUE(contains(errors, "threw a C++ exception out of encode()")) << errors;
}

// The limits are the experiment's runtime keys: a time limit from the YAML stops an endless item,
// an item over runtime.max_item_bytes is refused unread, and runtime.isolate: false keeps the
// plugin in the run's process (an escaping exception is still one bad item).
TEST(IsolationRun, TheRuntimeKeysSetTheLimits) {
  std::string errors;
  EXPECT_EQ(run_hostile_lines("keys", "one\nLOOP forever\nthree\n" + std::string(100, 'x') + "\nfive\n",
                              "  item_timeout_s: 1\n  max_item_bytes: 64\n", &errors),
            "items 5 failed 2 sequences 3");
  EXPECT_TRUE(contains(errors, "limit runtime.item_timeout_s = 1")) << errors;
  EXPECT_TRUE(contains(errors, "100 bytes, more than runtime.max_item_bytes = 64; not read")) << errors;
  EXPECT_EQ(run_hostile_lines("inproc", "one\nTHROW it\nthree\n", "  isolate: false\n", &errors),
            "items 3 failed 1 sequences 2");
  EXPECT_TRUE(contains(errors, "threw a C++ exception out of encode()")) << errors;
}

// Training encodes its data set through the same worker processes: before, the SEGV line killed
// `tessera train` (and every --resume would have replayed it); now the three hostile lines are bad
// items, reported, and training goes on over the others.
TEST(IsolationTrain, HostileItemsAreBadItemsAndTrainingGoesOn) {
  const std::string dir = ::testing::TempDir() + "tessera_isolation_train_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string lines;
  for (int i = 0; i < 40; ++i) {
    lines += "a line of ordinary text number " + std::to_string(i) + "\n";
    if (i == 5) lines += "SEGV here\n";
    if (i == 15) lines += "ABORT now\n";
    if (i == 25) lines += "THROW it\n";
  }
  std::ofstream(dir + "/lines.txt") << lines;
  std::ofstream(dir + "/exp.yaml") << "plugins:\n  - name: hostile\n    path: " + kTestPlugins +
                                          "\nmodel:\n  arch: decoder\n  d_model: 16\n  n_heads: 2\n  n_layers: 1\n"
                                          "  stem: {kind: tokens, vocab_size: 300}\n"
                                          "  positions: {kind: learned, max_len: 64}\n  head: {kind: lm, tied: true}\n"
                                          "data: {path: lines.txt}\n"
                                          "train: {seq_len: 16, batch_size: 2, max_steps: 2, validation: 0.1}\n";
  const testing_util::CliRun r = testing_util::run_tessera_cli("train " + dir + "/exp.yaml --out " + dir + "/run");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "train: 3 item(s) could not be read: ")) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGSEGV") || contains(r.err, "exited with status")) << r.err;
  EXPECT_TRUE(fs::exists(dir + "/run/best.safetensors")) << r.err;
  fs::remove_all(dir);
}

// With several plugins in one sequence every plugin encodes in its own worker: an item that kills the
// second plugin's worker is one bad item of a multimodal training set, and training goes on.
TEST(IsolationTrain, EveryPluginOfAMultimodalExperimentIsIsolated) {
  const std::string dir = ::testing::TempDir() + "tessera_isolation_xmodal_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string csv = "id,text,hostile,label\n";
  for (int i = 0; i < 20; ++i)
    csv += "item" + std::to_string(i) + ",text " + std::to_string(i) + "," +
           (i == 7 ? "SEGV here" : i == 13 ? "ABORT now" : "bytes " + std::to_string(i)) + "," + (i % 2 ? "odd" : "even") +
           "\n";
  std::ofstream(dir + "/items.csv") << csv;
  std::ofstream(dir + "/exp.yaml") << "plugins:\n  - {name: text, path: " + kPlugins +
                                          ", options: {tokenizer: bytes}}\n  - {name: hostile, path: " + kTestPlugins +
                                          "}\nmodel:\n  d_model: 16\n  n_heads: 2\n  n_layers: 1\n"
                                          "  stem: {kind: tokens, vocab_size: 600, modalities: 2}\n"
                                          "  positions: {kind: learned, max_len: 64}\n"
                                          "  head: {kind: classifier, n_classes: 2, labels: [even, odd]}\n"
                                          "data: {path: items.csv}\n"
                                          "train: {batch_size: 2, max_steps: 2, validation: 0.1}\n";
  const testing_util::CliRun r = testing_util::run_tessera_cli("train " + dir + "/exp.yaml --out " + dir + "/run");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "train: 2 item(s) could not be read: ")) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGSEGV") || contains(r.err, "exited with status")) << r.err;
  EXPECT_TRUE(contains(read_file(dir + "/run/summary.json"), "\"bad_items\": 2")) << r.err;
  fs::remove_all(dir);
}

// ---- A developer measurement (not run by ctest) ---------------------------------------------------
// In-process against worker encoding of a folder of JPEGs (tools/reference/make_jpeg_set.py makes the
// 1,000 of docs/PERFORMANCE.md):
//   TESSERA_JPEG_DIR=/tmp/jpegs build/release/tests/test_isolation --gtest_also_run_disabled_tests
//       --gtest_filter='IsolationThroughput.*'
TEST(IsolationThroughput, DISABLED_JpegsInProcessAgainstAWorker) {
  const char* env = std::getenv("TESSERA_JPEG_DIR");
  const std::string dir = env ? env : "/tmp/jpegs";
  const std::string image_file = kPlugins + "/libtessera_image.so";
  if (!fs::is_directory(dir) || !fs::exists(image_file)) GTEST_SKIP() << dir << " or the image plugin is missing";
  std::vector<std::pair<std::string, std::string>> jpegs;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".jpg" || e.path().extension() == ".jpeg")
      jpegs.emplace_back(e.path().filename().string(), read_file(e.path().string()));
  std::sort(jpegs.begin(), jpegs.end());
  ASSERT_FALSE(jpegs.empty());
  auto p = load(image_file);
  const std::map<std::string, std::string> o = {{"image_size", "224"}, {"patch_size", "16"}};
  const Encoder here = make(p, o);
  Encoder pool = isolated(p, ItemLimits{}, o);
  auto time = [&](const Encoder& e) {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t ok = 0;
    for (const auto& [name, bytes] : jpegs) ok += e.encode(item(name, bytes)).ok();
    EXPECT_EQ(ok, static_cast<int64_t>(jpegs.size()));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  (void)time(here);  // warm the page cache and the plugin
  double in_process = 1e30, worker = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    in_process = std::min(in_process, time(here));
    worker = std::min(worker, time(pool));
  }
  const double n = static_cast<double>(jpegs.size());
  std::printf("%zu JPEGs: in-process %.1f images/s (%.2f ms each), in a worker %.1f images/s (%.2f ms each): "
              "%.2f ms more per image, worker/in-process = %.3f\n",
              jpegs.size(), n / in_process, 1e3 * in_process / n, n / worker, 1e3 * worker / n,
              1e3 * (worker - in_process) / n, in_process / worker);
}
