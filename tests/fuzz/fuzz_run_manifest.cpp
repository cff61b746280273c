// Fuzzes what `tessera run --resume` reads back from a run folder, through the smallest public
// path (run_experiment with resume) on a tiny model over three lines (two batches). Two reference
// folders are made once: a finished run, and a run killed (SIGKILL, in a child process) right
// after its first batch was committed. The first input byte picks one (even: finished, odd:
// killed); the rest is up to three parts joined by NUL bytes that replace, in a fresh copy of it,
// the finished run's manifest.json, index.jsonl and rows.jsonl, or the killed run's manifest.json,
// shards/batch-000000.jsonl and shards/batch-000000.npy (a missing part keeps the reference file);
// then the run is resumed there. A resume either finishes or refuses with a message.
// With TESSERA_FUZZ_SEED_DIR set, both references are also written there as seeds.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include "fuzz_util.h"
#include "tessera/run.h"

namespace fs = std::filesystem;

namespace {
const char* const kFinished[] = {"manifest.json", "index.jsonl", "rows.jsonl"};
const char* const kKilled[] = {"manifest.json", "shards/batch-000000.jsonl", "shards/batch-000000.npy"};
constexpr size_t kParts = 3;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

tessera::Experiment& experiment() {
  static tessera::Experiment exp = [] {
    const std::string dir = fuzz::scratch();
    fuzz::write(dir + "/lines.txt", "one\ntwo two\nthree three three\n");
    const std::string yaml = std::string("plugins:\n  - name: text\n    path: ") + TESSERA_FUZZ_PLUGIN_DIR +
                             "\nmodel:\n  d_model: 8\n  n_heads: 1\n  n_layers: 1\n  stem: {kind: tokens, vocab_size: 300}\n"
                             "  positions: {kind: learned, max_len: 64}\n  head: {kind: pool, pool: mean}\n"
                             "runtime: {threads: 1, batch_size: 2, workers: 0}\n"
                             "data:\n  path: lines.txt\n";
    tessera::Diagnostics d;
    auto e = tessera::load_experiment_from_string(yaml, "exp.yaml", dir, {}, &d);
    if (!e) {
      fprintf(stderr, "%s\n", d.str().c_str());
      std::abort();
    }
    return *e;
  }();
  return exp;
}

// The reference folders: [0] finished, [1] killed after its first batch.
const std::vector<fs::path>& references() {
  static const std::vector<fs::path> refs = [] {
    const fs::path finished = fs::path(fuzz::scratch()) / "finished", killed = fs::path(fuzz::scratch()) / "killed";
    tessera::RunOptions o;
    o.out_dir = finished.string();
    o.progress = false;
    auto s = tessera::run_experiment(experiment(), o);
    if (!s.ok()) {
      fprintf(stderr, "reference run: %s\n", s.status().message().c_str());
      std::abort();
    }
    const pid_t child = fork();
    if (child == 0) {
      tessera::RunOptions k;
      k.out_dir = killed.string();
      k.progress = false;
      k.on_batch = [](int64_t done, int64_t) {
        if (done == 1) raise(SIGKILL);
      };
      (void)tessera::run_experiment(experiment(), k);
      std::_Exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFSIGNALED(status) || !fs::exists(killed / kKilled[1])) {
      fprintf(stderr, "the killed reference run did not stop after its first batch\n");
      std::abort();
    }
    if (const char* seed = std::getenv("TESSERA_FUZZ_SEED_DIR")) {
      for (int r = 0; r < 2; ++r) {
        std::string joined(1, static_cast<char>(r));
        for (size_t i = 0; i < kParts; ++i)
          joined += (i ? std::string(1, '\0') : "") + slurp((r ? killed : finished) / (r ? kKilled : kFinished)[i]);
        fuzz::write(std::string(seed) + (r ? "/killed" : "/finished"), joined);
      }
    }
    return std::vector<fs::path>{finished, killed};
  }();
  return refs;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  references();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool killed = data[0] & 1;
  const fs::path run = fs::path(fuzz::scratch()) / "run";
  std::error_code ec;
  fs::remove_all(run, ec);
  fs::copy(references()[killed], run, fs::copy_options::recursive, ec);
  const auto parts = fuzz::split(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), kParts);
  for (size_t i = 0; i < parts.size(); ++i) fuzz::write((run / (killed ? kKilled : kFinished)[i]).string(), parts[i]);
  tessera::RunOptions o;
  o.out_dir = run.string();
  o.resume = true;
  o.progress = false;
  auto s = tessera::run_experiment(experiment(), o);
  if (!s.ok() && s.status().message().empty()) std::abort();
  return 0;
}
