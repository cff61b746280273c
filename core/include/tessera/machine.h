// Whether a model fits the machine: the memory its plan needs (weights plus one batch's
// activations, as `tessera check` plans them) against the memory the process can still get. A
// model too large for the machine is refused with both numbers before anything is allocated,
// instead of ending in the kernel's OOM killer, an abort or a half-written run.
//
//   tessera::MemoryPlan plan = tessera::memory_plan(exp.model, /*rows=*/128, /*batch=*/8);
//   if (tessera::Status st = tessera::check_memory(plan, tessera::machine_memory()); !st.ok()) ...
//
// Not a guarantee in the other direction: the plan counts the largest parts (parameters, the
// live activations of one block), not every buffer, and other processes may take memory later.
// Thread-safety: every function reads /proc afresh and keeps no state.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/config.h"
#include "tessera/status.h"

namespace tessera {

// The memory a new allocation can count on now: the least of MemAvailable (/proc/meminfo), what
// an address-space limit (`ulimit -v`, RLIMIT_AS) leaves above the process's current size, and
// what a cgroup's memory limit leaves above its usage.
struct MachineMemory {
  int64_t available = -1;  // bytes; -1 when nothing could be read (then nothing is refused)
  std::string source;      // which of them it is: "MemAvailable in /proc/meminfo", ...
};
MachineMemory machine_memory();

// What a model needs, in bytes, for batches of `batch` items of `rows` input rows. Sums saturate
// at INT64_MAX instead of wrapping.
struct MemoryPlan {
  int64_t rows = 0, batch = 0;
  int64_t weights = 0;      // the parameters as stored (make_plan's parameter_bytes)
  int64_t activations = 0;  // make_plan's activation_bytes_per_item x batch (training: x n_layers)
  int64_t training = 0;     // training only: gradients, the weights' working copy, optimizer state
  int64_t total = 0;        // weights + training + activations
};
MemoryPlan memory_plan(const ModelConfig& model, int64_t rows, int64_t batch);

// What training the model needs, for micro-batches of `batch` items of `rows` rows: f32 master
// weights, their gradients and the forward pass's working copy of them, `optimizer_states` f32
// values per parameter (AdamW 2, SGD 1), and
// every block's activations kept for the backward pass, plus the LM head's logits and their
// gradient.
MemoryPlan training_memory_plan(const ModelConfig& model, int64_t rows, int64_t batch, int optimizer_states);

// Ok when the plan fits (or the available memory is unknown); else out_of_range with both numbers,
// what makes up the plan, and what to do.
Status check_memory(const MemoryPlan& plan, const MachineMemory& memory);

// "12.0 GiB (12884901888 bytes)".
std::string bytes_text(int64_t bytes);

}  // namespace tessera
