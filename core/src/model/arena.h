// The forward pass's workspace: the intermediates of one pass (normed rows, Q|K|V, the heads'
// concatenation, the FFN's hidden rows, the residual stream) live in buffers that each thread
// keeps from one forward to the next, so that a steady stream of same-sized batches allocates
// nothing per layer and nothing per pass.
//
// A slot hands out one tensor at a time. Its buffer grows to the largest request seen and is never
// shrunk. A tensor handed out shares ownership of the buffer: if it is still held elsewhere when
// the slot is asked again (a result kept by the caller), the slot takes a fresh buffer and leaves
// the old one to its holder, so nothing that escaped a pass is ever overwritten.
#pragma once

#include <cstdint>

#include "tessera/tensor.h"

namespace tessera::model {

enum class ArenaSlot : int {
  stream,   // the residual stream x (B, T, C): becomes Outputs::hidden
  normed,   // layer-norm output / block scratch h (B, T, C)
  embed,    // token embeddings (B·T, C)
  qkv,      // [Q | K | V] (B·T, H·(2dk + dv))
  concat,   // the heads' outputs side by side (B, T, H·dv)
  hidden,   // the FFN's hidden rows (B·T, F)
  wide,     // a post-LN bare attention layer's output (B, T, H·dv)
  head_a,   // the LM head's transform and its norm (1, N, C)
  head_b,
  count
};

class Arena {
 public:
  // A dense tensor of `shape` over this thread's buffer for `slot`; uninitialised.
  static Tensor get(ArenaSlot slot, const Shape& shape, DType dtype = DType::f32);
  // Buffers this process's arenas have allocated (tests: steady passes allocate none).
  static int64_t allocations();
};

}  // namespace tessera::model
