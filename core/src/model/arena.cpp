#include "arena.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>

namespace tessera::model {

namespace {

std::atomic<int64_t> g_allocations{0};

struct Buffer {
  std::shared_ptr<void> p;
  size_t size = 0;
};

Buffer* buffers() {
  thread_local Buffer bufs[static_cast<int>(ArenaSlot::count)];
  return bufs;
}

}  // namespace

Tensor Arena::get(ArenaSlot slot, const Shape& shape, DType dtype) {
  Buffer& b = buffers()[static_cast<int>(slot)];
  const size_t need = std::max<size_t>(1, static_cast<size_t>(shape.numel()) * dtype_size(dtype));
  // use_count 1: only the arena holds it, every tensor handed out before is gone.
  if (!b.p || b.size < need || b.p.use_count() > 1) {
    const size_t n = (need + Tensor::kAlignment - 1) / Tensor::kAlignment * Tensor::kAlignment;
    void* p = std::aligned_alloc(Tensor::kAlignment, n);
    if (!p) throw std::bad_alloc();
    b.p = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    b.size = n;
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  return Tensor::wrap(b.p.get(), shape, dtype, b.p);
}

int64_t Arena::allocations() { return g_allocations.load(std::memory_order_relaxed); }

}  // namespace tessera::model
