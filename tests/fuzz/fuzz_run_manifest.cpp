// Fuzzes what `tessera run --resume` reads back from a run folder, through the smallest public
// path (run_experiment with resume): a finished run of a tiny model over three lines is made once
// (the reference folder); each input is up to three parts joined by NUL bytes that replace its
// manifest.json, index.jsonl and rows.jsonl (a missing part keeps the reference file) in a fresh
// copy of it, and the run is resumed there. A resume either finishes or refuses with a message.
// With TESSERA_FUZZ_SEED_DIR set, the reference folder's files are also written there as a seed.
#include <cstdlib>

#include "fuzz_util.h"
#include "tessera/run.h"

namespace fs = std::filesystem;

namespace {
const char* const kFiles[] = {"manifest.json", "index.jsonl", "rows.jsonl"};

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

const fs::path& reference() {
  static const fs::path ref = [] {
    const fs::path r = fs::path(fuzz::scratch()) / "ref";
    tessera::RunOptions o;
    o.out_dir = r.string();
    o.progress = false;
    auto s = tessera::run_experiment(experiment(), o);
    if (!s.ok()) {
      fprintf(stderr, "reference run: %s\n", s.status().message().c_str());
      std::abort();
    }
    if (const char* seed = std::getenv("TESSERA_FUZZ_SEED_DIR")) {
      std::string joined;
      for (const char* f : kFiles) joined += (joined.empty() ? "" : std::string(1, '\0')) + slurp(r / f);
      fuzz::write(std::string(seed) + "/reference", joined);
    }
    return r;
  }();
  return ref;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  reference();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path run = fs::path(fuzz::scratch()) / "run";
  std::error_code ec;
  fs::remove_all(run, ec);
  fs::copy(reference(), run, fs::copy_options::recursive, ec);
  const auto parts = fuzz::split(std::string_view(reinterpret_cast<const char*>(data), size), std::size(kFiles));
  for (size_t i = 0; i < parts.size(); ++i) fuzz::write((run / kFiles[i]).string(), parts[i]);
  tessera::RunOptions o;
  o.out_dir = run.string();
  o.resume = true;
  o.progress = false;
  auto s = tessera::run_experiment(experiment(), o);
  if (!s.ok() && s.status().message().empty()) std::abort();
  return 0;
}
