// The machine's memory and a model's memory plan (tessera/machine.h). Reads /proc and the cgroup
// files; allocates nothing for the model.
#include "tessera/machine.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "tessera/model.h"

namespace tessera {

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// The value of `key` ("MemAvailable:") in a /proc file of "key: value kB" lines, in bytes; -1 if absent.
int64_t proc_kib(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    long long kib = -1;
    if (std::sscanf(line.c_str() + key.size(), "%lld", &kib) != 1 || kib < 0 || kib > kMax / 1024) return -1;
    return static_cast<int64_t>(kib) * 1024;
  }
  return -1;
}

// A file holding one number of bytes ("max" and absurd values: none); -1 if none.
int64_t file_bytes(const char* file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  long long v = -1;
  if (std::sscanf(text.c_str(), "%lld", &v) != 1 || v < 0 || v >= (int64_t{1} << 60)) return -1;
  return v;
}

void take_least(MachineMemory* m, int64_t bytes, const std::string& source) {
  if (bytes < 0) return;
  if (m->available < 0 || bytes < m->available) {
    m->available = bytes;
    m->source = source;
  }
}

int64_t saturating_add(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? kMax : r;
}

int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? kMax : r;
}

std::string human(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace

std::string bytes_text(int64_t bytes) { return human(bytes) + " (" + std::to_string(bytes) + " bytes)"; }

MachineMemory machine_memory() {
  MachineMemory m;
  take_least(&m, proc_kib("/proc/meminfo", "MemAvailable:"), "MemAvailable in /proc/meminfo");
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const int64_t limit = as.rlim_cur > static_cast<rlim_t>(kMax) ? kMax : static_cast<int64_t>(as.rlim_cur);
    const int64_t used = std::max<int64_t>(0, proc_kib("/proc/self/status", "VmSize:"));
    take_least(&m, std::max<int64_t>(0, limit - used),
               "the address-space limit (ulimit -v, RLIMIT_AS) of " + human(limit) + " less the " +
                   human(used) + " the process already maps");
  }
  // cgroup v2, then v1: a container's limit, which MemAvailable (the host's) does not show.
  for (const auto& [limit_file, usage_file] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const int64_t limit = file_bytes(limit_file);
    if (limit < 0) continue;
    const int64_t used = std::max<int64_t>(0, file_bytes(usage_file));
    take_least(&m, std::max<int64_t>(0, limit - used),
               "the cgroup memory limit of " + human(limit) + " less the " + human(used) + " in use (" +
                   limit_file + ")");
    break;
  }
  return m;
}

MemoryPlan memory_plan(const ModelConfig& model, int64_t rows, int64_t batch) {
  const Plan p = make_plan(model, rows);
  MemoryPlan m;
  m.rows = p.rows;
  m.batch = batch;
  m.weights = p.parameter_bytes;
  m.activations = saturating_mul(p.activation_bytes_per_item, batch);
  m.total = saturating_add(m.weights, m.activations);
  return m;
}

MemoryPlan training_memory_plan(const ModelConfig& model, int64_t rows, int64_t batch, int optimizer_states) {
  const Plan p = make_plan(model, rows);
  MemoryPlan m;
  m.rows = p.rows;
  m.batch = batch;
  m.weights = saturating_mul(p.parameters, 4);  // the f32 master weights, whatever the model's dtype
  // The gradients, the optimizer's state, and the forward pass's working copy of the weights (the
  // layers' packed form, rebuilt after each step). A BERT-base body over bytes (86 M parameters),
  // AdamW, 8 x 128 rows: planned 2.0 GiB; measured peak RSS 2.3 GiB, the process's own ~80 MB and
  // oneDNN's scratch included.
  m.training = saturating_mul(m.weights, 2 + optimizer_states);
  int64_t per_item = saturating_mul(p.activation_bytes_per_item, std::max<int64_t>(1, model.n_layers));
  if (model.head.kind == HeadKind::lm)  // the logits and their gradient, f32
    per_item = saturating_add(per_item, saturating_mul(saturating_mul(p.rows, model.stem.vocab_size), 8));
  m.activations = saturating_mul(per_item, batch);
  m.total = saturating_add(saturating_add(m.weights, m.training), m.activations);
  return m;
}

Status check_memory(const MemoryPlan& plan, const MachineMemory& memory) {
  if (memory.available < 0 || plan.total <= memory.available) return Status::Ok();
  const std::string training =
      plan.training > 0 ? " + gradients, working copy and optimizer state " + human(plan.training) : std::string();
  return Status::OutOfRange(
      std::string(plan.training > 0 ? "training the model needs " : "the model needs ") + bytes_text(plan.total) +
      " of memory (weights " + human(plan.weights) + training +
      " + activations " + human(plan.activations) + " for a batch of " + std::to_string(plan.batch) + " x " +
      std::to_string(plan.rows) + " rows, " +
      (plan.training > 0 ? "every layer's kept for the backward pass" : "as `tessera check` plans it") +
      "), but only " + bytes_text(memory.available) + " is available (" + memory.source +
      "); nothing was allocated. Make the model smaller (d_model, d_ff, n_layers, the vocabulary) or the " +
      (plan.training > 0 ? "micro-batch (train.batch_size / train.accumulate)" : "batch") +
      ", or run it on a machine with more memory");
}

}  // namespace tessera
