// Counters and test switches of the oneDNN fast path, for tests and diagnostics.
// Names no oneDNN type, so a test can include it without oneDNN's headers; not a public header.
// Everything here is process-wide and thread-safe.
#pragma once

#include <cstdint>

namespace tessera::onednn {

// The primitive cache: one entry per (op, shapes, strides, dtypes, attributes, threads).
struct CacheStats {
  int64_t created = 0;  // primitives created since the process started
  int64_t hits = 0;     // lookups that found an existing primitive
  int64_t entries = 0;  // primitives held now
  int64_t sgemm_calls = 0;  // f32 matrix products run by dnnl_sgemm, which needs no primitive (matmul.cpp)
};
CacheStats cache_stats();

// How Linear::forward found its weights.
struct LinearStats {
  int64_t packed_calls = 0;  // forwards that used the weights packed at create()
  int64_t plain_calls = 0;   // forwards whose primitive wanted another layout: plain (K, N) copy
  int64_t plain_copies = 0;  // plain copies made (at most one per Linear)
  int64_t gemv_calls = 0;    // forwards that ran the bf16 weight-streaming GEMV (not oneDNN)
};
LinearStats linear_stats();

// Test switches. Each holds while the object lives and applies to the calling thread only.
// Compute bf16 by rounding + f32 kernels even where oneDNN has bf16 kernels, so that both
// paths can be tested on one machine.
class ScopedBf16Emulation {
 public:
  ScopedBf16Emulation();
  ~ScopedBf16Emulation();
  ScopedBf16Emulation(const ScopedBf16Emulation&) = delete;
  ScopedBf16Emulation& operator=(const ScopedBf16Emulation&) = delete;

 private:
  bool saved_;
};

// Linear::create packs its weights column-major (K, N) instead of in the layout the primitive
// asks for, so that forward() must take the plain-copy fallback: the path that machines whose
// kernels want a different blocked layout for another M take.
class ScopedMismatchedPacking {
 public:
  ScopedMismatchedPacking();
  ~ScopedMismatchedPacking();
  ScopedMismatchedPacking(const ScopedMismatchedPacking&) = delete;
  ScopedMismatchedPacking& operator=(const ScopedMismatchedPacking&) = delete;

 private:
  bool saved_;
};

// Linear::create makes no bf16 streaming copy, so that its forwards take oneDNN's (emulated)
// bf16 matmul for every M: the path the GEMV replaced, for tests that compare the two.
class ScopedNoBf16Gemv {
 public:
  ScopedNoBf16Gemv();
  ~ScopedNoBf16Gemv();
  ScopedNoBf16Gemv(const ScopedNoBf16Gemv&) = delete;
  ScopedNoBf16Gemv& operator=(const ScopedNoBf16Gemv&) = delete;

 private:
  bool saved_;
};

}  // namespace tessera::onednn
