// Keeping freed tensor storage for the next allocation of the same size: for loops whose every
// step allocates the same tensors (training steps), which otherwise pay for fresh pages (page
// faults and zeroing by the kernel) each step.
//
//   {
//     const tessera::TensorReuse reuse;  // large blocks freed from here on are kept
//     for (...) step();                   // the second step's tensors reuse the first's blocks
//   }                                     // the kept blocks go back to the system
//
// While any TensorReuse is alive (on any thread), storage blocks of 64 KiB or more that are freed
// are kept, and an allocation of the same size class takes one of them before asking the system.
// Kept and live blocks together stay within the most the live ones have held since the first
// scope opened: an allocation that finds no block of its class frees kept blocks of other sizes
// first, so that loops whose shapes vary (padded batches) do not pile up blocks. Values are never
// affected: a new tensor is uninitialised either way. Thread-safe.
#pragma once

#include <cstddef>

namespace tessera {

class TensorReuse {
 public:
  TensorReuse();
  ~TensorReuse();  // the last one alive releases the kept blocks
  TensorReuse(const TensorReuse&) = delete;
  TensorReuse& operator=(const TensorReuse&) = delete;

  // Bytes of blocks of 64 KiB or more: kept idle, in use, and the most in use since the first
  // scope opened (for tests and memory reports).
  struct Stats {
    size_t idle = 0, live = 0, peak_live = 0;
  };
  static Stats stats();
};

}  // namespace tessera
