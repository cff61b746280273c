// What every file of the oneDNN fast path shares: the engine, this thread's stream, the primitive
// cache, per-thread scratch buffers, Tensor -> memory descriptor, dtype conversion and the
// translation of dnnl::error into Status. The only header of Tessera that includes oneDNN; it
// stays inside core/src/dnnl/ (a move to oneDNN v3 should touch only this folder).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <oneapi/dnnl/dnnl.hpp>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "dnnl/engine.h"
#include "tessera/ops.h"

namespace tessera::onednn {

// ---------------------------------------------------------------------------------------------
// Engine, stream, threads

dnnl::engine& engine();  // process-wide CPU engine, created on first use
dnnl::stream& stream();  // the calling thread's stream on engine()

// Makes the calling thread's OpenMP team size what set_num_threads() asked for (the OpenMP
// setting is per thread; ours is process-wide) and returns it. Every op calls it first.
int apply_threads();

// oneDNN has bf16 matmul kernels on this CPU (tried once).
bool has_native_bf16();
// has_native_bf16() and no ScopedBf16Emulation on this thread.
bool use_native_bf16();
bool mismatched_packing_for_testing();  // ScopedMismatchedPacking on this thread
bool no_bf16_gemv_for_testing();        // ScopedNoBf16Gemv on this thread

// ---------------------------------------------------------------------------------------------
// Primitive cache

// A created primitive with what executing it needs.
struct Prim {
  dnnl::primitive prim;
  dnnl::primitive_desc_base pd;
  dnnl::memory::desc scratch_md;  // user scratchpad (size 0: none)
  size_t scratch_bytes = 0;
  std::string impl;                     // oneDNN's implementation name, "gemm:jit"
  uint32_t flags = 0;                   // op-specific facts decided at creation (which operands to stage)
  std::vector<dnnl::memory::desc> mds;  // its arguments' descriptors, in an order each op fixes
  uint64_t id = 0;                      // unique per created primitive (set by cached())
};

// Builds cache keys from the op's name, numbers, words and memory descriptors.
class Key {
 public:
  explicit Key(const char* op) { *this << op; }
  Key& operator<<(int64_t v);
  Key& operator<<(const char* w);
  Key& operator<<(float v);                       // by its bits: 0.1f and 0.1000001f differ
  Key& operator<<(const std::string& bytes);      // another key's bytes
  Key& operator<<(const Tensor& t);               // dtype, dims and strides of a view, as md_of sees it
  Key& operator<<(const dnnl::memory::desc& md);  // everything that tells two layouts apart
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};

// The primitive under `key`, created by `make` on the first request (make may throw
// dnnl::error, which propagates). The number of threads is part of every key.
std::shared_ptr<const Prim> cached(Key key, const std::function<Prim()>& make);

// Wraps a primitive descriptor into a Prim (creates the primitive).
template <class PD, class P>
Prim make_prim(const PD& pd) {
  Prim p;
  p.prim = P(pd);
  p.pd = pd;
  p.scratch_md = pd.scratchpad_desc();
  p.scratch_bytes = p.scratch_md.get_size();
  p.impl = pd.impl_info_str();
  return p;
}

// Attributes every primitive gets: user-managed scratchpad (ours is per thread, so a cached
// primitive can run on several threads at once).
dnnl::primitive_attr base_attr();

// One argument of a cached primitive: oneDNN's id for it, the index of its descriptor in
// Prim::mds, and the caller's buffer.
struct Arg {
  int id;
  int md;
  const void* data;
};
// Runs `p` on this thread's stream with these buffers (and `ready` memories, such as packed
// weights) and this thread's scratchpad, then waits. The memory objects around the buffers are
// made once per thread and primitive and only re-pointed afterwards (creating one costs more
// than a small matmul's bookkeeping).
void execute(const Prim& p, std::span<const Arg> args,
             std::span<const std::pair<int, dnnl::memory>> ready = {});
inline void execute(const Prim& p, std::initializer_list<Arg> args) {
  execute(p, std::span<const Arg>(args.begin(), args.size()));
}

// ---------------------------------------------------------------------------------------------
// Scratch: per-thread, 64-byte aligned, grow-only buffers. Each op uses each slot at most once
// at a time; a pointer stays valid until the same slot is asked for again on this thread.
// lowp_a, lowp_b: the bf16-rounded operands a training linear's backward makes once for its two
// products (linear_backward), which the matmul then reads as they are.
enum class Slot : int { a = 0, b, c, out, aux, pad, lowp_a, lowp_b, count };
void* scratch(Slot s, size_t bytes);
// A dense Tensor over scratch memory (valid as long as the slot is not reused).
Tensor scratch_tensor(Slot s, const Shape& shape, DType dtype);

// ---------------------------------------------------------------------------------------------
// Tensors as oneDNN memory

dnnl::memory::data_type dt_of(DType t);  // undef for types oneDNN lacks (i64)
// The descriptor of a view with its own strides (size-1 dims get harmless canonical strides).
dnnl::memory::desc md_of(const Tensor& t);
dnnl::memory::desc md_of(const Tensor& t, const dnnl::memory::dims& dims,
                         const dnnl::memory::dims& strides);  // a reinterpretation of t
dnnl::memory::desc dense_md(const dnnl::memory::dims& dims, dnnl::memory::data_type dt);
dnnl::memory mem(const dnnl::memory::desc& md, const void* data);
dnnl::memory mem_of(const Tensor& t);

// Stride rules the direct (no-copy) paths need.
bool is_dense_f32(const Tensor& t);                // f32 and contiguous
bool same_view(const Tensor& a, const Tensor& b);  // same bytes, dtype, shape and strides
bool overlaps(const Tensor& a, const Tensor& b);   // their byte ranges intersect

// dst = src (same shape, any strides, f32/bf16 either side: other dtypes go through
// Tensor::copy_from). With round_bf16, values are rounded to bf16 on the way (round to nearest
// even), also into an f32 destination. Parallel over rows.
void convert(const Tensor& src, Tensor& dst, bool round_bf16 = false);
// convert's rows r0 … r1 - 1 (rows: the last dimension; src and dst f32 or bf16), on the calling
// thread: for a caller that does more with each row range while it is in cache.
void convert_rows(const Tensor& src, Tensor& dst, bool round_bf16, int64_t r0, int64_t r1);

// `t` itself when it is dense f32, else a dense f32 copy in `slot`.
Tensor dense_f32(const Tensor& t, Slot slot);
// `t` itself when it is dense f32 and either the same view as `out` (an op in place) or apart
// from it; else a dense f32 copy in `slot`. For an op's input that it reads while writing out.
Tensor dense_input(const Tensor& t, const Tensor& out, Slot slot);

// The eltwise algorithm of an activation; undef for Activation::none.
dnnl::algorithm eltwise_alg(Activation a);

// ---------------------------------------------------------------------------------------------
// Shared op bodies

// c = alpha · a · b [+ bias] [+ c]: ops::matmul's product (the caller checked the shapes), with a
// bias (N) added to every row (needs K > 0) and, with `accumulate`, added to what c holds (a sum
// post-op). The products of the training ops: linear_plain, and linear_backward's dw +=.
// compute = bf16: a and b are rounded to bf16 first (an operand that is bf16 already is read as
// it is), into bf16 for the native kernels (use_native_bf16()) or into f32 for the f32 kernels;
// c is f32 either way. compute = f32: the kernels are bf16 only when both operands are bf16.
Status matmul(const char* op, const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& c, float alpha,
              bool accumulate, DType compute = DType::f32);

// The dtype a bf16-compute product's operands have inside the matmul: bf16 where oneDNN has bf16
// kernels on this thread (use_native_bf16()), else f32 holding bf16-rounded values.
DType lowp_kernel_dtype();

// ---------------------------------------------------------------------------------------------
// Errors

// "f32 (2, 3), bf16 (3, 4)": the shapes an error message names.
std::string describe(std::initializer_list<const Tensor*> ts);

// Runs body (returning Status); an exception thrown inside (dnnl::error, bad_alloc) becomes a
// Status naming the op and the shapes: oneDNN's "unimplemented" -> unsupported, the rest ->
// internal. No exception leaves an op.
Status from_dnnl_error(const char* op, const std::string& shapes, const dnnl::error& e);
template <class Body>
Status guarded(const char* op, const std::function<std::string()>& shapes, Body&& body) {
  try {
    return body();
  } catch (const dnnl::error& e) {
    return from_dnnl_error(op, shapes(), e);
  } catch (const std::bad_alloc&) {
    return Status::Internal(std::string(op) + ": out of memory for " + shapes());
  } catch (const std::exception& e) {
    return Status::Internal(std::string(op) + ": " + e.what() + " for " + shapes());
  }
}

// Counters behind LinearStats.
void count_linear_call(bool packed);
void count_plain_copy();
void count_gemv_call();
void count_sgemm_call();

}  // namespace tessera::onednn
