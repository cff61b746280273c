// Training checkpoints: bit-identical round trips, keep-N rotation, writes that fail part-way
// (file size limit, read-only folder), kill -9 at random moments, corrupted and truncated files,
// the fallback past a broken `latest`, and the config-hash refusal.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "tessera/fileio.h"
#include "tessera/checkpoint.h"
#include "tessera/config.h"
#include "tessera/fileio.h"
#include "tessera/safetensors.h"
#include "test_util.h"

using namespace tessera;
using tessera::testing_util::bytes_of;
namespace fs = std::filesystem;

namespace {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// A folder for one test, unique to this process (suites run side by side), removed afterwards.
struct TempFolder {
  std::string path;
  explicit TempFolder(const std::string& tag)
      : path(::testing::TempDir() + "tessera_ckpt_" + std::to_string(::getpid()) + "_" + tag) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempFolder() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Every byte from the seed: any bit pattern, NaN payloads and denormals included. Cheap, so a
// child that writes checkpoints in a loop spends its time writing.
Tensor filled(const Shape& s, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(s, dtype);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); i += 8) {
    const uint64_t v = splitmix64(seed * 0x100000001b3ull + i);
    std::memcpy(p + i, &v, std::min<size_t>(8, t.nbytes() - i));
  }
  return t;
}

// A checkpoint whose every byte follows from its step; `rows` sets its size (about 200 bytes
// per row across the three files), `metrics` pads the trainer's JSON.
Checkpoint sample(int64_t step, int64_t rows = 8, int metrics = 0) {
  const uint64_t seed = static_cast<uint64_t>(step) * 1000;
  Checkpoint c;
  c.step = step;
  c.weights = Parameters({{"stem.embed", filled({rows, 16}, DType::f32, seed + 1)},
                          {"blocks.0.attn.w_q", filled({16, 16}, DType::f32, seed + 2)},
                          {"blocks.0.ln1.gamma", filled({16}, DType::f32, seed + 3)}});
  uint64_t k = seed + 10;
  for (const auto& [name, t] : c.weights) {
    c.optimizer.emplace_back("adam.m." + name, filled(t.shape(), DType::f32, ++k));
    c.optimizer.emplace_back("adam.v." + name, filled(t.shape(), DType::f32, ++k));
  }
  Tensor count = Tensor::empty({}, DType::i64);
  count.data<int64_t>()[0] = step;
  c.optimizer.emplace_back("adam.step", count);
  c.config_hash = "a1b2c3d4e5f6";
  c.state_json = "{\"step\": " + std::to_string(step) + ", \"rng\": [" + std::to_string(splitmix64(seed)) +
                 "], \"data\": {\"epoch\": 1, \"offset\": " + std::to_string(7 * step) + "}, \"loss\": [";
  for (int i = 0; i < metrics; ++i)
    c.state_json += (i ? ", " : "") + std::to_string(splitmix64(seed + i) % 100000);
  c.state_json += "]}";
  return c;
}

// "" when the tensors agree in order, names, dtypes, shapes and bytes; else the first difference.
std::string tensor_differences(const NamedTensors& got, const NamedTensors& want, const std::string& what) {
  if (got.size() != want.size())
    return what + ": " + std::to_string(got.size()) + " tensors, want " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& [gn, g] = got[i];
    const auto& [wn, w] = want[i];
    if (gn != wn) return what + "[" + std::to_string(i) + "]: named " + gn + ", want " + wn;
    if (g.dtype() != w.dtype() || g.shape() != w.shape())
      return what + " " + gn + ": " + g.describe() + ", want " + w.describe();
    if (bytes_of(g.contiguous()) != bytes_of(w.contiguous())) return what + " " + gn + ": the bytes differ";
  }
  return "";
}

std::string differences(const Checkpoint& got, const Checkpoint& want) {
  if (got.step != want.step)
    return "step " + std::to_string(got.step) + ", want " + std::to_string(want.step);
  if (got.config_hash != want.config_hash)
    return "config_hash " + got.config_hash + ", want " + want.config_hash;
  if (got.state_json != want.state_json)
    return "state_json\n" + got.state_json + "\nwant\n" + want.state_json;
  const std::string w = tensor_differences(NamedTensors(got.weights.begin(), got.weights.end()),
                                           NamedTensors(want.weights.begin(), want.weights.end()), "weights");
  return w.empty() ? tensor_differences(got.optimizer, want.optimizer, "optimizer") : w;
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::string contents(const std::string& path) {
  Result<std::string> r = read_file(path);
  return r.ok() ? r.value() : "(unreadable: " + r.status().message() + ")";
}

void overwrite(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

void flip_byte(const std::string& path, size_t at) {
  std::string b = contents(path);
  ASSERT_LT(at, b.size()) << path;
  b[at] = static_cast<char>(b[at] ^ 0x20);
  overwrite(path, b);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Runs fn in a forked child and returns what it returned, or "(died: ...)" if it did not exit.
std::string in_child(const std::function<std::string()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return "(pipe failed)";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string m = fn();
    for (size_t done = 0; done < m.size();) {
      const ssize_t n = ::write(fds[1], m.data() + done, m.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) return "(died: status " + std::to_string(status) + ")";
  return out;
}

std::string message_of(const Status& s) { return s.ok() ? "ok" : s.message(); }

// The config of a small model with every default resolved, as the config loader would leave it.
ModelConfig small_model() {
  ModelConfig c;
  c.d_model = 16;
  c.n_heads = 4;
  c.d_k = c.d_v = 4;
  c.d_ff = 32;
  c.n_layers = 2;
  c.activation = Activation::gelu_erf;
  c.norm = NormPlacement::pre;
  c.final_norm = true;
  c.attention.scale = 0.5;
  c.stem.kind = StemKind::tokens;
  c.stem.vocab_size = 50;
  c.positions.rotary_dims = c.d_k;
  c.positions.max_len = 64;
  c.positions.max_distance = 3;
  c.init.scheme = InitScheme::glorot_normal;
  c.init.seed = 7;
  c.weights.allow_missing = true;
  return c;
}

}  // namespace

TEST(Checkpoint, RoundTripIsBitIdentical) {
  TempFolder dir("roundtrip");
  Checkpoint c = sample(7);
  // Special floats, a strided view (written contiguous), every dtype the reader loads back.
  Tensor special = Tensor::from_vector({5}, {-0.f, std::numeric_limits<float>::infinity(),
                                             std::numeric_limits<float>::denorm_min(), 1e-40f, 3.f});
  uint32_t payload_nan = 0x7fc01234u;
  std::memcpy(special.data<float>() + 4, &payload_nan, 4);
  Tensor strided = filled({4, 6}, DType::f32, 99).transpose(0, 1);
  NamedTensors weights(c.weights.begin(), c.weights.end());
  weights.emplace_back("special", special);
  weights.emplace_back("strided", strided);
  c.weights = Parameters(weights);
  for (DType d : {DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
    c.optimizer.emplace_back(std::string("extra.") + dtype_name(d),
                             filled({3, 5}, d, 5 + static_cast<int>(d)));
  c.optimizer.emplace_back("empty", Tensor::empty({0, 4}));
  // The trainer's JSON byte for byte: odd spacing, escapes, UTF-8, and text that looks like the
  // frame of state.json itself.
  c.state_json =
      "  {\"rng\": \"\\u00e9\\n\", \"name\": \"caf\xc3\xa9\",\n  \"state_fnv1a\": \"00\",\n"
      "\"big\": 123456789012345678901234567890, \"nested\": {\"x\": 1.50\n}\n}\n";
  c.config_hash = "sha256:c0ffee \xe2\x9c\x93";
  ASSERT_TRUE(write_checkpoint(dir.path, c, 3).ok());

  EXPECT_EQ(contents(dir / "latest"), "step-000007\n");
  EXPECT_EQ(entries(dir / "step-000007"),
            (std::set<std::string>{"weights.safetensors", "optimizer.safetensors", "state.json"}));
  Result<Checkpoint> r = read_checkpoint(dir.path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(differences(*r, c), "");
  EXPECT_EQ(r->warning, "");
  EXPECT_EQ(r->path, dir / "step-000007");
  EXPECT_EQ(r->weights.find("strided")->shape(), Shape({6, 4}));
  // Owned and writable, unlike the read-only mapping of the file.
  r->weights.find("stem.embed")->data<float>()[0] = 1.f;
  r->optimizer[0].second.data<float>()[0] = 1.f;

  // state.json is plain JSON that records each file's size and FNV-1a-64 checksum.
  const nlohmann::json state = nlohmann::json::parse(contents(dir / "step-000007/state.json"));
  EXPECT_EQ(state["step"], 7);
  EXPECT_EQ(state["config_hash"], c.config_hash);
  EXPECT_EQ(state["trainer"], nlohmann::json::parse(c.state_json));
  for (const char* f : {"weights.safetensors", "optimizer.safetensors"}) {
    const std::string bytes = contents(dir / ("step-000007/" + std::string(f)));
    EXPECT_EQ(state["files"][f]["fnv1a"], tessera::hex64(tessera::fnv1a(bytes.data(), bytes.size()))) << f;
    EXPECT_EQ(state["files"][f]["bytes"], bytes.size()) << f;
  }
  Result<safetensors::File> w = safetensors::File::open(dir / "step-000007/weights.safetensors");
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->metadata().at("step"), "7");
  EXPECT_EQ(w->metadata().at("config_hash"), c.config_hash);

  // No trainer state at all reads back as none.
  c.state_json.clear();
  c.step = 8;
  ASSERT_TRUE(write_checkpoint(dir.path, c, 3).ok());
  Result<Checkpoint> none = read_checkpoint(dir.path);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(differences(*none, c), "");
}

TEST(Checkpoint, TheWeightsFileServesAsModelWeights) {
  TempFolder dir("model_weights");
  ModelConfig cfg = small_model();
  Result<Parameters> p = Parameters::resolve(cfg);
  ASSERT_TRUE(p.ok()) << p.status().message();
  Checkpoint c;
  c.step = 3;
  c.weights = p->clone();
  ASSERT_TRUE(write_checkpoint(dir.path, c, 1).ok());

  ModelConfig from_file = cfg;
  from_file.init.seed = 999;  // must not matter: everything comes from the file
  from_file.weights.file = dir / "step-000003/weights.safetensors";
  from_file.weights.allow_missing = false;
  Result<Parameters> q = Parameters::resolve(from_file);
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(tensor_differences(NamedTensors(q->begin(), q->end()),
                               NamedTensors(c.weights.begin(), c.weights.end()), "weights"),
            "");
}

TEST(Checkpoint, KeepsTheNewestN) {
  TempFolder dir("rotation");
  for (int64_t s = 1; s <= 6; ++s) ASSERT_TRUE(write_checkpoint(dir.path, sample(s), 3).ok()) << s;
  EXPECT_EQ(entries(dir.path),
            (std::set<std::string>{"latest", "step-000004", "step-000005", "step-000006"}));
  ASSERT_TRUE(write_checkpoint(dir.path, sample(10), 1).ok());
  EXPECT_EQ(entries(dir.path), (std::set<std::string>{"latest", "step-000010"}));
  // Resumed from an earlier step: later folders (another timeline) are left alone.
  ASSERT_TRUE(write_checkpoint(dir.path, sample(4), 2).ok());
  EXPECT_EQ(entries(dir.path), (std::set<std::string>{"latest", "step-000004", "step-000010"}));
  Result<Checkpoint> r = read_checkpoint(dir.path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(differences(*r, sample(4)), "");
  // Steps past six digits sort by number.
  ASSERT_TRUE(write_checkpoint(dir.path, sample(1234567), 2).ok());
  ASSERT_TRUE(write_checkpoint(dir.path, sample(12345678), 2).ok());
  EXPECT_EQ(entries(dir.path), (std::set<std::string>{"latest", "step-1234567", "step-12345678"}));
}

TEST(Checkpoint, RewritingAStepReplacesItWhole) {
  TempFolder dir("rewrite");
  ASSERT_TRUE(write_checkpoint(dir.path, sample(1), 3).ok());
  ASSERT_TRUE(write_checkpoint(dir.path, sample(2), 3).ok());
  // As if killed after step-000002 went into place but before `latest` named it.
  overwrite(dir / "latest", "step-000001\n");
  Result<Checkpoint> r = read_checkpoint(dir.path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->step, 1);
  // The resumed run writes step 2 again, over the folder that is there; and once more while
  // `latest` names it.
  for (int round = 0; round < 2; ++round) {
    Checkpoint again = sample(2);
    again.state_json = "{\"round\": " + std::to_string(round) + "}";
    ASSERT_TRUE(write_checkpoint(dir.path, again, 3).ok());
    Result<Checkpoint> a = read_checkpoint(dir.path);
    ASSERT_TRUE(a.ok()) << a.status().message();
    EXPECT_EQ(differences(*a, again), "");
    EXPECT_EQ(entries(dir.path), (std::set<std::string>{"latest", "step-000001", "step-000002"}));
  }
}

TEST(Checkpoint, LeftoversOfKilledWritersAreRemoved) {
  TempFolder dir("leftovers");
  ASSERT_TRUE(write_checkpoint(dir.path, sample(1), 3).ok());
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string d = std::to_string(dead), me = std::to_string(::getpid());
  fs::create_directories(dir / (".step-000002.tmp." + d + ".0/sub"));
  overwrite(dir / (".latest.tmp." + d + ".3"), "step-000002\n");
  fs::create_directories(dir / (".step-000003.tmp." + me + ".9"));  // this process's: not stale
  fs::create_directories(dir / ".other");                           // not ours at all
  ASSERT_TRUE(write_checkpoint(dir.path, sample(2), 3).ok());
  EXPECT_EQ(entries(dir.path), (std::set<std::string>{"latest", "step-000001", "step-000002",
                                                      ".step-000003.tmp." + me + ".9", ".other"}));
}

TEST(Checkpoint, BadInputIsAStatus) {
  TempFolder dir("bad_input");
  Checkpoint c = sample(1);
  EXPECT_TRUE(contains(message_of(write_checkpoint(dir.path, c, 0)), "keep is 0"));
  c.step = -1;
  EXPECT_TRUE(contains(message_of(write_checkpoint(dir.path, c, 1)), "step -1 is negative"));
  c.step = 1;
  c.state_json = "{\"a\": 1} {\"b\": 2}";
  EXPECT_TRUE(
      contains(message_of(write_checkpoint(dir.path, c, 1)), "state_json is not one valid JSON value"));
  // A number beyond a double: a message, never nlohmann's out_of_range escaping as std::terminate.
  c.state_json = "{\"x\": 1e400}";
  EXPECT_FALSE(write_checkpoint(dir.path, c, 1).ok());
  c.state_json = "{}";
  c.config_hash = "\xff";
  EXPECT_TRUE(contains(message_of(write_checkpoint(dir.path, c, 1)), "config_hash is not valid UTF-8"));
  c.config_hash = "h";
  c.optimizer.emplace_back("adam.m.stem.embed", Tensor::zeros({1}));
  EXPECT_TRUE(contains(message_of(write_checkpoint(dir.path, c, 1)), "appears twice"));
  c.optimizer.back() = {"double", Tensor::zeros({1}, DType::f64)};
  EXPECT_TRUE(contains(message_of(write_checkpoint(dir.path, c, 1)), "tensor \"double\" is f64"));
  // Nothing was left behind by any of them.
  EXPECT_EQ(entries(dir.path), std::set<std::string>{});
  Result<Checkpoint> r = read_checkpoint(dir / "absent");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::not_found) << r.status().message();
  EXPECT_FALSE(read_checkpoint_at(dir / "absent").ok());
}

TEST(Checkpoint, ConfigHashRefusalNamesBothHashes) {
  Checkpoint c = sample(1);
  c.config_hash = "a1b2";
  EXPECT_TRUE(check_config_hash(c, "a1b2").ok());
  c.path = "run/checkpoints/step-000001";
  const Status s = check_config_hash(c, "c3d4");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(),
                       "run/checkpoints/step-000001: the run was started with config a1b2, this "
                       "config is c3d4: "))
      << s.message();
}

// A file that may grow only to `limit` bytes (write() then fails with EFBIG, SIGXFSZ ignored):
// whichever file of the checkpoint crosses it, the previous checkpoint stays as it was.
TEST(CheckpointFailure, AFileSizeLimitPartWayKeepsThePreviousCheckpoint) {
  TempFolder scratch("fsize_sizes");
  const Checkpoint next = sample(2, 64, 3000);
  ASSERT_TRUE(write_checkpoint(scratch.path, next, 1).ok());
  const auto size = [&](const char* f) { return fs::file_size(scratch / ("step-000002/" + std::string(f))); };
  const uintmax_t w = size("weights.safetensors"), o = size("optimizer.safetensors"), s = size("state.json");
  ASSERT_LT(w, o);
  ASSERT_LT(o, s);

  struct Case {
    uintmax_t limit;
    const char* fails;  // the file that crosses the limit; null: the write succeeds
  };
  const Case cases[] = {{0, "weights.safetensors"},
                        {1, "weights.safetensors"},
                        {8, "weights.safetensors"},
                        {100, "weights.safetensors"},
                        {w - 1, "weights.safetensors"},
                        {w, "optimizer.safetensors"},
                        {o - 1, "optimizer.safetensors"},
                        {o, "state.json"},
                        {s - 1, "state.json"},
                        {s, nullptr}};
  for (const Case& k : cases) {
    SCOPED_TRACE("limit " + std::to_string(k.limit));
    TempFolder dir("fsize_" + std::to_string(k.limit));
    ASSERT_TRUE(write_checkpoint(dir.path, sample(1), 3).ok());
    const std::string m = in_child([&] {
      ::signal(SIGXFSZ, SIG_IGN);
      const rlimit lim{static_cast<rlim_t>(k.limit), static_cast<rlim_t>(k.limit)};
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return std::string("(setrlimit failed)");
      return message_of(write_checkpoint(dir.path, next, 3));
    });
    Result<Checkpoint> r = read_checkpoint(dir.path);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->warning, "");
    if (k.fails == nullptr) {
      EXPECT_EQ(m, "ok");
      EXPECT_EQ(differences(*r, next), "");
      continue;
    }
    EXPECT_TRUE(contains(m, std::string(k.fails) + ": cannot write")) << m;
    EXPECT_TRUE(contains(m, std::strerror(EFBIG))) << m;
    EXPECT_TRUE(contains(m, "the file needs ")) << m;
    EXPECT_TRUE(contains(m, "`latest` still names step-000001")) << m;
    EXPECT_EQ(differences(*r, sample(1)), "");
    EXPECT_EQ(entries(dir.path), (std::set<std::string>{"latest", "step-000001"}));  // no temporary left
  }
}

TEST(CheckpointFailure, AReadOnlyFolderKeepsThePreviousCheckpoint) {
  TempFolder dir("read_only");
  ASSERT_TRUE(write_checkpoint(dir.path, sample(1), 3).ok());
  fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  const std::string m = in_child([&] {
    // Permissions do not bind root, so root writes as nobody.
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0))
      return std::string("(cannot drop root)");
    return message_of(write_checkpoint(dir.path, sample(2), 3));
  });
  fs::permissions(dir.path, fs::perms::owner_all, fs::perm_options::add);
  if (m == "(cannot drop root)") GTEST_SKIP() << "running as root, and cannot switch to nobody";
  EXPECT_TRUE(
      contains(m, "cannot create the temporary checkpoint folder: " + std::string(std::strerror(EACCES))))
      << m;
  EXPECT_TRUE(contains(m, "`latest` still names step-000001")) << m;
  Result<Checkpoint> r = read_checkpoint(dir.path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(differences(*r, sample(1)), "");
  EXPECT_EQ(entries(dir.path), (std::set<std::string>{"latest", "step-000001"}));
}

// A writer killed with SIGKILL at random moments, again and again, each time resuming from what
// it finds: `latest` always names a complete checkpoint, byte for byte one the writer made, even
// keeping only one.
// Write times vary a lot with the disk and the load, so the kills are placed after the writer's
// own progress: at a random moment of its start-up or first write in even rounds, and of the
// write (or clean-up) after a completed checkpoint in odd ones.
TEST(CheckpointCrash, KillNineAtRandomMomentsLeavesAFullyWrittenCheckpoint) {
  TempFolder dir("kill9");
  constexpr int64_t kRows = 8192;  // about 1.6 MB per checkpoint
  ASSERT_TRUE(write_checkpoint(dir.path, sample(0, kRows), 1).ok());
  std::chrono::microseconds one_write{0};
  {
    TempFolder timing("kill9_timing");
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t s = 1; s <= 3; ++s) ASSERT_TRUE(write_checkpoint(timing.path, sample(s, kRows), 1).ok());
    one_write =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0) / 3;
  }

  std::mt19937 rng(static_cast<uint32_t>(::getpid()));
  int64_t last = 0;
  for (int round = 0; round < 16; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::string before = contents(dir / "latest");
    const pid_t pid = ::fork();
    if (pid == 0) {
      Result<Checkpoint> resumed = read_checkpoint(dir.path);
      if (!resumed.ok()) ::_exit(2);
      for (int64_t s = resumed->step + 1;; ++s)
        if (!write_checkpoint(dir.path, sample(s, kRows), 1).ok()) ::_exit(3);
    }
    if (round % 2 == 1) {  // wait for one more checkpoint, at most a minute
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
      while (contents(dir / "latest") == before && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::uniform_int_distribution<int64_t> delay(0, 2 * one_write.count());
    std::this_thread::sleep_for(std::chrono::microseconds(delay(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited with status " << WEXITSTATUS(status);

    Result<Checkpoint> r = read_checkpoint(dir.path);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->warning, "");
    EXPECT_EQ(differences(*r, sample(r->step, kRows)), "");
    EXPECT_GE(r->step, last);
    if (round % 2 == 1) {
      EXPECT_GT(r->step, last) << "the writer completed no checkpoint in a minute";
    }
    last = r->step;
  }
  // The next write clears what the killed writers left.
  ASSERT_TRUE(write_checkpoint(dir.path, sample(last + 1, kRows), 1).ok());
  for (const std::string& e : entries(dir.path)) EXPECT_NE(e[0], '.') << e;
}

TEST(CheckpointCorruption, AFlippedByteInATensorFileIsCaughtAndNamed) {
  TempFolder dir("flipped");
  ASSERT_TRUE(write_checkpoint(dir.path, sample(1), 3).ok());
  ASSERT_TRUE(write_checkpoint(dir.path, sample(2), 3).ok());
  const std::string weights = dir / "step-000002/weights.safetensors";
  flip_byte(weights, fs::file_size(weights) - 10);
  Result<Checkpoint> at = read_checkpoint_at(dir / "step-000002");
  ASSERT_FALSE(at.ok());
  EXPECT_TRUE(contains(at.status().message(), weights + ": checksum mismatch")) << at.status().message();

  // Reading the folder falls back to step 1 and says why.
  Result<Checkpoint> r = read_checkpoint(dir.path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(differences(*r, sample(1)), "");
  EXPECT_TRUE(contains(r->warning, weights + ": checksum mismatch")) << r->warning;
  EXPECT_TRUE(contains(r->warning, "using step-000001 instead")) << r->warning;
}

TEST(CheckpointCorruption, TruncatedOrAppendedFilesAreCaughtAndNamed) {
  TempFolder dir("truncated");
  ASSERT_TRUE(write_checkpoint(dir.path, sample(1), 3).ok());
  const std::string step = dir / "step-000001";
  const std::string optimizer = step + "/optimizer.safetensors", state = step + "/state.json";
  const std::string original = contents(optimizer);

  fs::resize_file(optimizer, original.size() / 2);
  Result<Checkpoint> r = read_checkpoint_at(step);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(
      contains(r.status().message(), optimizer + ": truncated: " + std::to_string(original.size() / 2) +
                                         " bytes, state.json records " + std::to_string(original.size())))
      << r.status().message();

  overwrite(optimizer, original + "x");
  r = read_checkpoint_at(step);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), optimizer + ": ")) << r.status().message();
  EXPECT_TRUE(contains(r.status().message(), "appended")) << r.status().message();

  overwrite(optimizer, original);
  ASSERT_TRUE(read_checkpoint_at(step).ok());
  fs::remove(step + "/weights.safetensors");
  r = read_checkpoint_at(step);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), step + "/weights.safetensors: cannot open"))
      << r.status().message();

  // state.json torn, or edited: its own checksum catches both.
  fs::resize_file(state, fs::file_size(state) - 5);
  r = read_checkpoint(dir.path);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), state + ": checksum mismatch")) << r.status().message();
  ASSERT_TRUE(write_checkpoint(dir.path, sample(1), 3).ok());
  std::string text = contents(state);
  text.replace(text.find("\"step\": 1"), 9, "\"step\": 3");
  overwrite(state, text);
  r = read_checkpoint_at(step);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), state + ": checksum mismatch")) << r.status().message();

  // Edited and resealed (its checksum made to match): what passes the checksum is still checked as
  // JSON and by field. A number beyond a double would be nlohmann's out_of_range escaping as
  // std::terminate; a wrong-typed step, a value taken as a step.
  auto resealed = [&](std::string t) {
    const std::string key = "\n  \"state_fnv1a\": \"";
    const size_t at = t.find(key) + key.size();
    t.replace(at, 16, 16, '0');
    t.replace(at, 16, tessera::hex64(tessera::fnv1a(t.data(), t.size())));
    return t;
  };
  ASSERT_TRUE(write_checkpoint(dir.path, sample(1), 3).ok());
  const std::string good = contents(state);
  overwrite(state, resealed(good));
  ASSERT_TRUE(read_checkpoint_at(step).ok()) << "the reseal itself must keep a good file good";
  std::string huge = good;
  huge.replace(huge.find("\"step\": 1"), 9, "\"step\": 1e400");
  overwrite(state, resealed(huge));
  r = read_checkpoint_at(step);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), state + ": not valid JSON: ")) << r.status().message();
  EXPECT_TRUE(contains(r.status().message(), "number overflow")) << r.status().message();
  std::string typed = good;
  typed.replace(typed.find("\"step\": 1"), 9, "\"step\": \"1\"");
  overwrite(state, resealed(typed));
  r = read_checkpoint_at(step);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), state + ": step (an integer >= 0) or config_hash (a string) is missing"))
      << r.status().message();
}

TEST(CheckpointFallback, LatestNamingAMissingFolderFallsBackWithAWarning) {
  TempFolder dir("missing_folder");
  ASSERT_TRUE(write_checkpoint(dir.path, sample(1), 3).ok());
  ASSERT_TRUE(write_checkpoint(dir.path, sample(2), 3).ok());
  fs::remove_all(dir / "step-000002");
  Result<Checkpoint> r = read_checkpoint(dir.path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(differences(*r, sample(1)), "");
  EXPECT_TRUE(contains(r->warning, dir / "latest" + " names step-000002, which is unusable")) << r->warning;
  EXPECT_TRUE(contains(r->warning, "using step-000001 instead")) << r->warning;

  // `latest` naming something that is not a step folder at all.
  overwrite(dir / "latest", "../elsewhere\n");
  r = read_checkpoint(dir.path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->step, 1);
  EXPECT_TRUE(contains(r->warning, "names \"../elsewhere\", which is not a step folder name")) << r->warning;
}

TEST(CheckpointFallback, AMissingLatestFallsBackToTheNewestValidFolder) {
  TempFolder dir("no_latest");
  for (int64_t s = 1; s <= 3; ++s) ASSERT_TRUE(write_checkpoint(dir.path, sample(s), 3).ok());
  fs::remove(dir / "latest");
  fs::remove(dir / "step-000003/state.json");
  fs::create_directories(dir / "step-9");                // not a name the writer makes: ignored
  fs::create_directories(dir / ".step-000009.tmp.1.0");  // a temporary: ignored
  Result<Checkpoint> r = read_checkpoint(dir.path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(differences(*r, sample(2)), "");
  EXPECT_TRUE(contains(r->warning, dir / "latest" + ": cannot open for reading")) << r->warning;
  EXPECT_TRUE(contains(r->warning, "using step-000002 instead")) << r->warning;
  EXPECT_TRUE(contains(r->warning, "also unusable: " + dir / "step-000003/state.json")) << r->warning;
}

TEST(CheckpointFallback, NoValidCheckpointIsAnErrorNamingEachProblem) {
  TempFolder dir("none_valid");
  ASSERT_TRUE(write_checkpoint(dir.path, sample(1), 3).ok());
  ASSERT_TRUE(write_checkpoint(dir.path, sample(2), 3).ok());
  flip_byte(dir / "step-000001/optimizer.safetensors", 100);
  fs::resize_file(dir / "step-000002/weights.safetensors", 10);
  Result<Checkpoint> r = read_checkpoint(dir.path);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_TRUE(contains(m, dir.path + ": no valid checkpoint")) << m;
  EXPECT_TRUE(contains(m, dir / "step-000002/weights.safetensors: truncated")) << m;
  EXPECT_TRUE(contains(m, dir / "step-000001/optimizer.safetensors: checksum mismatch")) << m;

  TempFolder empty("empty");
  r = read_checkpoint(empty.path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::not_found);
  EXPECT_TRUE(contains(r.status().message(), "no checkpoint here")) << r.status().message();
}
