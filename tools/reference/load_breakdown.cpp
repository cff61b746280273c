// Where a model's load goes, phase by phase, to the end of the first forward (developer-only; the
// build never compiles it). `tessera bench` prints the total as its "load" line; this splits it:
//   config     load_experiment + validate_weights (YAML, includes, the weights file's header)
//   weights    model::resolve_parameters alone (mmap, header checks, zero-copy views)
//   build      Model::build (it resolves again, then Linear::create packs every matrix)
//   first      the first forward (primitives created, mmap'd pages touched)
//   steady     the median of 3 more forwards
// Each phase in wall seconds and in CPU seconds of the whole process (OpenMP threads included; run
// with OMP_WAIT_POLICY=passive so that waiting threads do not count).
//
//   g++ -O2 -std=c++20 -I core/include -I core/src tools/reference/load_breakdown.cpp -o /tmp/load_breakdown
//       -Lbuild/core -ltessera -Wl,-rpath,$PWD/build/core          (one line)
//   build/tessera export configs/bench/vit_b16.yaml /tmp/vit_b16.safetensors
//   OMP_WAIT_POLICY=passive /tmp/load_breakdown EXPERIMENT.yaml [batch=1] [threads=2]
// where EXPERIMENT.yaml is  model: {include: .../configs/bench/vit_b16.yaml,
//                                   weights: {file: /tmp/vit_b16.safetensors}}
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "model/weights.h"
#include "tessera/config.h"
#include "tessera/model.h"
#include "tessera/ops.h"
#include "tessera/random.h"

using namespace tessera;

namespace {
struct Clock {
  double wall, cpu;
};
Clock now() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  const double cpu = static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
                     static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
  return {std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(), cpu};
}
void row(const char* name, Clock a, Clock b) { std::printf("%-8s %8.4f s wall %8.4f s CPU\n", name, b.wall - a.wall, b.cpu - a.cpu); }
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: load_breakdown EXPERIMENT.yaml [batch] [threads]\n");
    return 2;
  }
  const int64_t B = argc > 2 ? std::atoi(argv[2]) : 1;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  const Clock t0 = now();
  Diagnostics diags;
  std::optional<Experiment> exp = load_experiment(argv[1], LoadOptions{}, &diags);
  if (exp) validate_weights(exp->model, &diags);
  if (!exp || !diags.empty()) {
    std::fprintf(stderr, "%s\n", diags.str().c_str());
    return 2;
  }
  set_num_threads(threads);
  const Clock t1 = now();
  if (Result<std::vector<std::pair<std::string, Tensor>>> p = model::resolve_parameters(exp->model); !p.ok()) {
    std::fprintf(stderr, "%s\n", p.status().message().c_str());
    return 1;
  }
  const Clock t2 = now();
  Result<Model> m = Model::build(exp->model);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().message().c_str());
    return 1;
  }
  const Clock t3 = now();
  const ModelConfig& c = exp->model;
  Batch batch;
  Tensor rows = Tensor::empty({B, exp->bench.seq_len, c.stem.n_features});
  Rng rng(1);
  fill_uniform(rows, rng, -1, 1);
  batch.rows = rows;
  Outputs out;
  const Clock t4 = now();
  if (!m->forward(batch, ForwardOptions{}, &out).ok()) return 1;
  const Clock t5 = now();
  std::vector<Clock> f;
  for (int i = 0; i < 3; ++i) {
    const Clock a = now();
    if (!m->forward(batch, ForwardOptions{}, &out).ok()) return 1;
    const Clock b = now();
    f.push_back({b.wall - a.wall, b.cpu - a.cpu});
  }
  std::sort(f.begin(), f.end(), [](const Clock& a, const Clock& b) { return a.wall < b.wall; });
  row("config", t0, t1);
  row("weights", t1, t2);
  row("build", t2, t3);
  row("first", t4, t5);
  std::printf("%-8s %8.4f s wall %8.4f s CPU\n", "steady", f[1].wall, f[1].cpu);
  std::printf("load (config + build + first forward): %.4f s wall, %.4f s CPU; without the forward %.4f s wall\n",
              (t1.wall - t0.wall) + (t3.wall - t2.wall) + (t5.wall - t4.wall),
              (t1.cpu - t0.cpu) + (t3.cpu - t2.cpu) + (t5.cpu - t4.cpu), (t1.wall - t0.wall) + (t3.wall - t2.wall));
  return 0;
}
