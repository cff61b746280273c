// ops::matmul: batched c (..., M, N) = alpha · a (..., M, K) · b (..., K, N) with one oneDNN matmul
// over the caller's strided views (attention's head views and K transposes need no copy).
// Not here: Linear (linear.cpp), which owns packed weights and fused post-ops.
#include "dnnl/onednn.h"
#include "ops_common.h"

namespace tessera::ops {

using dnnl::memory;

namespace {

// Which operands the cached plan copies into dense scratch because oneDNN only has its
// reference kernel for their strides (e.g. a matrix with no unit stride, interleaved batches).
constexpr uint32_t kDenseA = 1, kDenseB = 2, kDenseC = 4;

bool is_reference_impl(const std::string& impl) { return impl.rfind("ref", 0) == 0; }

dnnl::matmul::primitive_desc matmul_pd(const memory::desc& a, const memory::desc& b, const memory::desc& c,
                                       float alpha) {
  dnnl::primitive_attr attr = onednn::base_attr();
  if (alpha != 1.f) attr.set_output_scales(0, {alpha});  // c = alpha · (a · b)
  // matmul descriptor over the strided views, then the primitive descriptor
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, onednn::engine());
}

memory::dims dims_of(const Tensor& t) { return memory::dims(t.shape().begin(), t.shape().end()); }

}  // namespace

Status matmul(const Tensor& a, const Tensor& b, Tensor& c, float alpha) {
  static constexpr const char* op = "ops::matmul";
  TSR_RETURN_IF_ERROR(detail::check_matmul_shapes(op, a, b, c));
  if (c.numel() == 0) return Status::Ok();
  if (a.dim(-1) == 0) {  // empty sums
    c.copy_from(Tensor::zeros(c.shape()));
    return Status::Ok();
  }
  onednn::apply_threads();
  auto shapes = [&] { return "a " + a.describe() + ", b " + b.describe() + ", c " + c.describe(); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    using onednn::Slot;
    // bf16 kernels only when both operands are bf16 (mixed inputs: the bf16 one is widened,
    // exactly, which is what the reference computes too).
    const DType kernel = a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && onednn::use_native_bf16()
                             ? DType::bf16
                             : DType::f32;
    Tensor A = a, B = b, C = c;
    if (a.dtype() != kernel) {
      A = onednn::scratch_tensor(Slot::a, a.shape(), kernel);
      onednn::convert(a, A);
    }
    if (b.dtype() != kernel) {
      B = onednn::scratch_tensor(Slot::b, b.shape(), kernel);
      onednn::convert(b, B);
    }
    const bool c_direct = !onednn::overlaps(c, a) && !onednn::overlaps(c, b);
    if (!c_direct) C = onednn::scratch_tensor(Slot::out, c.shape(), DType::f32);

    // The entry keeps the descriptors it was made with: mds = {a, b, c}.
    onednn::Key key("matmul");
    key << A << B << C << alpha;
    const auto prim = onednn::cached(key, [&] {
      memory::desc ma = onednn::md_of(A), mb = onednn::md_of(B), mc = onednn::md_of(C);
      dnnl::matmul::primitive_desc pd = matmul_pd(ma, mb, mc, alpha);
      uint32_t flags = 0;
      if (is_reference_impl(pd.impl_info_str())) {
        // Try again with the non-contiguous operands made dense: a copy beats the slow kernel.
        flags = (A.is_contiguous() ? 0 : kDenseA) | (B.is_contiguous() ? 0 : kDenseB) |
                (C.is_contiguous() ? 0 : kDenseC);
        if (flags) {
          auto md = [&](const Tensor& t, uint32_t bit, const memory::desc& strided) {
            return flags & bit ? onednn::dense_md(dims_of(t), onednn::dt_of(t.dtype())) : strided;
          };
          const memory::desc da = md(A, kDenseA, ma), db = md(B, kDenseB, mb), dc = md(C, kDenseC, mc);
          dnnl::matmul::primitive_desc dense = matmul_pd(da, db, dc, alpha);
          if (is_reference_impl(dense.impl_info_str())) {
            flags = 0;
          } else {
            pd = dense;
            ma = da;
            mb = db;
            mc = dc;
          }
        }
      }
      onednn::Prim p = onednn::make_prim<dnnl::matmul::primitive_desc, dnnl::matmul>(pd);
      p.flags = flags;
      p.mds = {ma, mb, mc};
      return p;
    });

    if (prim->flags & kDenseA) {  // A is the caller's view here (a converted A is dense already)
      A = onednn::scratch_tensor(Slot::a, a.shape(), kernel);
      onednn::convert(a, A);
    }
    if (prim->flags & kDenseB) {
      B = onednn::scratch_tensor(Slot::b, b.shape(), kernel);
      onednn::convert(b, B);
    }
    const bool c_staged = !c_direct || (prim->flags & kDenseC);
    if (prim->flags & kDenseC) C = onednn::scratch_tensor(Slot::out, c.shape(), DType::f32);
    onednn::execute(*prim, {{DNNL_ARG_SRC, 0, A.raw_data()},
                            {DNNL_ARG_WEIGHTS, 1, B.raw_data()},
                            {DNNL_ARG_DST, 2, C.raw_data()}});
    if (c_staged) onednn::convert(C, c);
    return Status::Ok();
  });
}

}  // namespace tessera::ops
