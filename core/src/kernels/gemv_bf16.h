// The bf16 weight-streaming GEMV behind Linear::forward for a few rows (decoding) where oneDNN has
// no bf16 kernels: y (M, N) = act(x (M, K) · W (K, N) + b) [+ r], W held as bf16 in a layout made
// once for streaming, f32 accumulation. Private to core/src; names no oneDNN type.
// See gemv_bf16.cpp for why it exists and how it is laid out.
#pragma once

#include <cstdint>

#include "tessera/ops.h"
#include "tessera/tensor.h"

namespace tessera::kernels {

// Output columns per block of the streaming layout.
constexpr int64_t kGemvBlock = 16;
// The most rows one call takes (Linear sends fewer: its threshold is measured, see linear.cpp).
constexpr int64_t kGemvMaxRows = 32;

// W (K, N) as bf16 in blocks of 16 output columns: block j is K rows of 16 bf16 (32 bytes), one
// contiguous run of K·32 bytes, so a pass over the blocks reads every weight byte once, in order.
// Inside a row the 16 columns are interleaved in pairs (column c and c + 8 share a 32-bit lane) so
// that one 32-byte load widens to two 8-float vectors with a shift and a mask. The last block is
// padded with zero columns.
struct GemvWeights {
  int64_t K = 0, N = 0;
  Tensor packed;  // bf16, (ceil(N / 16) · K · 16) elements; undefined when not made
  bool defined() const { return packed.defined(); }
  int64_t bytes() const { return packed.defined() ? static_cast<int64_t>(packed.nbytes()) : 0; }
};

// Packs a dense row-major (K, N) f32 matrix, rounding to bf16 (to nearest, ties to even).
GemvWeights gemv_pack_bf16(const float* w, int64_t K, int64_t N);

// One call: rows of x, y and r have unit column stride; ld* are row strides in elements.
struct GemvArgs {
  int64_t M = 0;
  const float* x = nullptr;  // (M, K) f32, already rounded to bf16 (the layer's compute dtype)
  int64_t ldx = 0;
  const float* bias = nullptr;  // (N) f32 or nullptr
  Activation act = Activation::none;
  const float* res = nullptr;  // (M, N) f32 or nullptr; may be y itself (same rows, same ld)
  int64_t ldr = 0;
  float* y = nullptr;  // (M, N) f32
  int64_t ldy = 0;
};

// y = act(x·W + b) [+ r] for 1 <= M <= kGemvMaxRows, parallel over column blocks (OpenMP, one
// thread for small layers). The activation is ref::activate (exact erf/tanh), applied to each
// block's outputs after its accumulation. Allocates nothing.
void gemv_bf16(const GemvWeights& w, const GemvArgs& a);

// Which instruction set gemv_bf16 runs on the calling thread: "avx2" (AVX2 + FMA, chosen at run
// time by __builtin_cpu_supports) or "generic" (portable C++, any x86-64 or other CPU).
const char* gemv_isa();

// Test hook: gemv_bf16 calls on this thread take the portable path while the object lives.
class ScopedGemvGeneric {
 public:
  ScopedGemvGeneric();
  ~ScopedGemvGeneric();
  ScopedGemvGeneric(const ScopedGemvGeneric&) = delete;
  ScopedGemvGeneric& operator=(const ScopedGemvGeneric&) = delete;

 private:
  bool saved_;
};

}  // namespace tessera::kernels
