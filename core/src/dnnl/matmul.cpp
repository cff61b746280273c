// ops::matmul: batched c (..., M, N) = alpha · a (..., M, K) · b (..., K, N) with one oneDNN matmul
// over the caller's strided views (attention's head views and K transposes need no copy); the
// same with a bias row and accumulation into c for the training ops (onednn::matmul).
// Not here: Linear (linear.cpp), which owns packed weights and fused post-ops.
#include <optional>

#include "dnnl/onednn.h"
#include "ops_common.h"

namespace tessera::onednn {

using dnnl::memory;

namespace {

// Which operands the cached plan copies into dense scratch because oneDNN only has its
// reference kernel for their strides (e.g. a matrix with no unit stride, interleaved batches).
constexpr uint32_t kDenseA = 1, kDenseB = 2, kDenseC = 4;

bool is_reference_impl(const std::string& impl) { return impl.rfind("ref", 0) == 0; }

dnnl::matmul::primitive_desc matmul_pd(const memory::desc& a, const memory::desc& b, const memory::desc& bias,
                                       const memory::desc& c, float alpha, bool accumulate) {
  dnnl::primitive_attr attr = base_attr();
  if (alpha != 1.f) attr.set_output_scales(0, {alpha});  // c = alpha · (a · b)
  if (accumulate) {
    dnnl::post_ops po;  // c = that + c
    po.append_sum(1.f);
    attr.set_post_ops(po);
  }
  // matmul descriptor over the strided views (bias: a dense (1, ..., N) row), then the primitive
  const dnnl::matmul::desc d = bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c);
  return dnnl::matmul::primitive_desc(d, attr, engine());
}

memory::dims dims_of(const Tensor& t) { return memory::dims(t.shape().begin(), t.shape().end()); }

// One f32 matrix as dnnl_sgemm reads it (row-major): 'N' with rows ld apart, or 'T' (the view is
// the transpose of a row-major matrix) with columns ld apart. False when neither stride is 1.
bool gemm_operand(const Tensor& t, char& trans, dnnl_dim_t& ld) {
  const int64_t r = t.dim(0), c = t.dim(1), s0 = t.stride(0), s1 = t.stride(1);
  if ((s1 == 1 || c == 1) && (r == 1 || s0 >= c)) {
    trans = 'N';
    ld = r == 1 ? c : s0;
    return true;
  }
  if ((s0 == 1 || r == 1) && (c == 1 || s1 >= r)) {
    trans = 'T';
    ld = c == 1 ? r : s1;
    return true;
  }
  return false;
}

// How dnnl_sgemm reads c = a · b: each operand's transposition and row stride.
struct GemmLayout {
  char ta = 'N', tb = 'N';
  dnnl_dim_t lda = 0, ldb = 0, ldc = 0;
};

// The layout of an f32 product sgemm can run on its operands as they are (c written row by
// row); none when a stride rules it out.
std::optional<GemmLayout> gemm_layout(const Tensor& a, const Tensor& b, const Tensor& c) {
  if (a.rank() != 2 || a.dtype() != DType::f32 || b.dtype() != DType::f32 || c.dtype() != DType::f32)
    return std::nullopt;
  GemmLayout g;
  char tc = 'N';
  if (!gemm_operand(a, g.ta, g.lda) || !gemm_operand(b, g.tb, g.ldb) || !gemm_operand(c, tc, g.ldc) || tc != 'N')
    return std::nullopt;
  return g;
}

// c = alpha · a · b [+ bias] [+ c] for f32 matrices with oneDNN's BLAS-style sgemm, which packs
// its operands itself; bias (dense, N) needs alpha = 1. The matmul primitive (brgemm) reads a
// plain b of many columns slowly: at K = 768, N = 3072 (BERT-base's FFN) it runs at 40 % of
// sgemm's speed on 2 AVX-512 cores, and of the training products measured it is faster on one
// only, by 8 % (tools/reference/matmul_vs_sgemm.cpp, docs/PERFORMANCE.md).
void sgemm(const GemmLayout& g, const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& c, float alpha,
           bool accumulate) {
  const int64_t M = c.dim(0), N = c.dim(1), K = a.dim(1);
  float* C = c.data<float>();
  float beta = accumulate ? 1.f : 0.f;
  if (bias) {  // the bias row into c first (added to what it holds when accumulating), then c += a · b
    const float* br = bias->data<float>();
#pragma omp parallel for schedule(static) if (M * N >= (1 << 16))
    for (int64_t m = 0; m < M; ++m) {
      float* cr = C + m * g.ldc;
      if (accumulate)
        for (int64_t n = 0; n < N; ++n) cr[n] += br[n];
      else
        for (int64_t n = 0; n < N; ++n) cr[n] = br[n];
    }
    beta = 1.f;
  }
  const dnnl_status_t st =
      dnnl_sgemm(g.ta, g.tb, M, N, K, alpha, a.data<float>(), g.lda, b.data<float>(), g.ldb, beta, C, g.ldc);
  if (st != dnnl_success) throw dnnl::error(st, "dnnl_sgemm");
  count_sgemm_call();
}

}  // namespace

DType lowp_kernel_dtype() { return use_native_bf16() ? DType::bf16 : DType::f32; }

Status matmul(const char* op, const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& c, float alpha,
              bool accumulate, DType compute) {
  if (c.numel() == 0) return Status::Ok();
  TSR_CHECK(a.dim(-1) > 0 || !bias, "onednn::matmul: a bias with K = 0");
  if (a.dim(-1) == 0) {  // empty sums
    if (!accumulate) c.copy_from(Tensor::zeros(c.shape()));
    return Status::Ok();
  }
  apply_threads();
  auto shapes = [&] { return "a " + a.describe() + ", b " + b.describe() + ", c " + c.describe(); };
  return guarded(op, shapes, [&]() -> Status {
    // f32 compute: bf16 kernels only when both operands are bf16 (mixed inputs: the bf16 one is
    // widened, exactly, which is what the reference computes too). bf16 compute: every f32
    // operand is rounded, to bf16 for native kernels or in f32 for the f32 ones.
    const bool round = compute == DType::bf16;
    const DType kernel = round ? lowp_kernel_dtype()
                         : a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && use_native_bf16() ? DType::bf16
                                                                                                       : DType::f32;
    auto needs_copy = [&](const Tensor& t) { return t.dtype() != kernel || (round && t.dtype() == DType::f32); };
    Tensor A = a, B = b, C = c, bias_row;
    if (needs_copy(a)) {
      A = scratch_tensor(Slot::a, a.shape(), kernel);
      convert(a, A, round);
    }
    if (needs_copy(b)) {
      B = scratch_tensor(Slot::b, b.shape(), kernel);
      convert(b, B, round);
    }
    if (bias) bias_row = dense_f32(*bias, Slot::c);
    const bool c_direct = !overlaps(c, a) && !overlaps(c, b);
    if (!c_direct) C = scratch_tensor(Slot::out, c.shape(), DType::f32);
    if (kernel == DType::f32 && !(bias && alpha != 1.f))
      if (const std::optional<GemmLayout> g = gemm_layout(A, B, C)) {
        if (!c_direct && accumulate) convert(c, C);  // c's sums go on from what it holds
        sgemm(*g, A, B, bias ? &bias_row : nullptr, C, alpha, accumulate);
        if (!c_direct) convert(C, c);
        return Status::Ok();
      }

    // The entry keeps the descriptors it was made with: mds = {a, b, c, bias}.
    Key key("matmul");
    key << A << B << C << alpha << static_cast<int64_t>(bias != nullptr) << static_cast<int64_t>(accumulate);
    const auto prim = cached(key, [&] {
      memory::dims bias_dims(static_cast<size_t>(c.rank()), 1);
      bias_dims.back() = c.dim(-1);
      const memory::desc mbias = bias ? dense_md(bias_dims, memory::data_type::f32) : memory::desc();
      memory::desc ma = md_of(A), mb = md_of(B), mc = md_of(C);
      dnnl::matmul::primitive_desc pd = matmul_pd(ma, mb, mbias, mc, alpha, accumulate);
      uint32_t flags = 0;
      if (is_reference_impl(pd.impl_info_str())) {
        // Try again with the non-contiguous operands made dense: a copy beats the slow kernel.
        flags = (A.is_contiguous() ? 0 : kDenseA) | (B.is_contiguous() ? 0 : kDenseB) |
                (C.is_contiguous() ? 0 : kDenseC);
        if (flags) {
          auto md = [&](const Tensor& t, uint32_t bit, const memory::desc& strided) {
            return flags & bit ? dense_md(dims_of(t), dt_of(t.dtype())) : strided;
          };
          const memory::desc da = md(A, kDenseA, ma), db = md(B, kDenseB, mb), dc = md(C, kDenseC, mc);
          dnnl::matmul::primitive_desc dense = matmul_pd(da, db, mbias, dc, alpha, accumulate);
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
      Prim p = make_prim<dnnl::matmul::primitive_desc, dnnl::matmul>(pd);
      p.flags = flags;
      p.mds = {ma, mb, mc, mbias};
      return p;
    });

    if (prim->flags & kDenseA) {  // A is the caller's view here (a converted A is dense already)
      A = scratch_tensor(Slot::a, a.shape(), kernel);
      convert(a, A, round);
    }
    if (prim->flags & kDenseB) {
      B = scratch_tensor(Slot::b, b.shape(), kernel);
      convert(b, B, round);
    }
    const bool c_staged = !c_direct || (prim->flags & kDenseC);
    if (prim->flags & kDenseC) C = scratch_tensor(Slot::out, c.shape(), DType::f32);
    if (c_staged && accumulate) convert(c, C);  // the sum post-op reads what c holds
    Arg args[4] = {{DNNL_ARG_SRC, 0, A.raw_data()},
                   {DNNL_ARG_WEIGHTS, 1, B.raw_data()},
                   {DNNL_ARG_DST, 2, C.raw_data()}};
    size_t n_args = 3;
    if (bias) args[n_args++] = {DNNL_ARG_BIAS, 3, bias_row.raw_data()};
    execute(*prim, std::span<const Arg>(args, n_args));
    if (c_staged) convert(C, c);
    return Status::Ok();
  });
}

}  // namespace tessera::onednn

namespace tessera::ops {

Status matmul(const Tensor& a, const Tensor& b, Tensor& c, float alpha) {
  static constexpr const char* op = "ops::matmul";
  TSR_RETURN_IF_ERROR(detail::check_matmul_shapes(op, a, b, c));
  return onednn::matmul(op, a, b, nullptr, c, alpha, /*accumulate=*/false);
}

}  // namespace tessera::ops
