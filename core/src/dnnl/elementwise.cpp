// Elementwise ops and the embedding gather: ops::add (oneDNN binary, b broadcast over a's leading
// dims), ops::activation (oneDNN eltwise) and ops::embedding (a row copy per id, OpenMP).
// For add, oneDNN's binary measured as fast as a plain parallel loop or faster (1576 x 768).
// ops::dropout is a parallel loop (oneDNN 2.6 has no dropout): each element's mask bit is a hash
// of its index, so the result does not depend on how the loop is split between threads.
#include <cstring>

#include "dnnl/onednn.h"
#include "ops_common.h"

namespace tessera::ops {

using dnnl::memory;

Status add(const Tensor& a, const Tensor& b, Tensor& y) {
  static constexpr const char* op = "ops::add";
  TSR_RETURN_IF_ERROR(detail::check_add_shapes(op, a, b, y));
  if (a.numel() == 0) return Status::Ok();
  onednn::apply_threads();
  auto shapes = [&] { return onednn::describe({&a, &b, &y}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    const bool y_direct = onednn::is_dense_f32(y);
    Tensor out = y_direct ? y : onednn::scratch_tensor(onednn::Slot::out, y.shape(), DType::f32);
    const Tensor A = onednn::dense_input(a, out, onednn::Slot::a),
                 B = onednn::dense_input(b, out, onednn::Slot::b);
    // b repeats every m elements: a as (n / m, m) rows, b as one row (1, m) broadcast over them.
    const int64_t n = A.numel(), m = B.numel();
    const auto prim = onednn::cached(onednn::Key("add") << n << m, [&] {
      // memory descriptors: src0 and dst (n / m, m), src1 (1, m) or the same as src0
      const memory::desc rows = onednn::dense_md({n / m, m}, memory::data_type::f32);
      const memory::desc row = onednn::dense_md({n == m ? n / m : 1, m}, memory::data_type::f32);
      const dnnl::binary::desc d(dnnl::algorithm::binary_add, rows, row, rows);
      onednn::Prim p = onednn::make_prim<dnnl::binary::primitive_desc, dnnl::binary>(
          dnnl::binary::primitive_desc(d, onednn::base_attr(), onednn::engine()));
      p.mds = {rows, row};
      return p;
    });
    onednn::execute(*prim, {{DNNL_ARG_SRC_0, 0, A.raw_data()},
                            {DNNL_ARG_SRC_1, 1, B.raw_data()},
                            {DNNL_ARG_DST, 0, out.raw_data()}});
    if (!y_direct) onednn::convert(out, y);
    return Status::Ok();
  });
}

Status activation(Activation act, const Tensor& x, Tensor& y) {
  static constexpr const char* op = "ops::activation";
  TSR_RETURN_IF_ERROR(detail::check_same_shape(op, x, y));
  if (act != Activation::none && onednn::eltwise_alg(act) == dnnl::algorithm::undef)
    return Status::Invalid(std::string(op) + ": unknown activation " + std::to_string(static_cast<int>(act)));
  if (x.numel() == 0 || (onednn::same_view(x, y) && act == Activation::none)) return Status::Ok();
  onednn::apply_threads();
  if (act == Activation::none) {
    Tensor in = onednn::overlaps(x, y) ? x.clone() : x;
    onednn::convert(in, y);
    return Status::Ok();
  }
  auto shapes = [&] { return onednn::describe({&x, &y}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    const bool y_direct = onednn::is_dense_f32(y);
    Tensor out = y_direct ? y : onednn::scratch_tensor(onednn::Slot::out, y.shape(), DType::f32);
    const Tensor in = onednn::dense_input(x, out, onednn::Slot::a);
    const int64_t n = x.numel();
    const auto prim = onednn::cached(onednn::Key("eltwise") << static_cast<int64_t>(act) << n, [&] {
      // memory descriptor: the elements as one dense run; eltwise needs no shape
      const memory::desc md = onednn::dense_md({n}, memory::data_type::f32);
      const dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, onednn::eltwise_alg(act), md, 0.f, 0.f);
      onednn::Prim p = onednn::make_prim<dnnl::eltwise_forward::primitive_desc, dnnl::eltwise_forward>(
          dnnl::eltwise_forward::primitive_desc(d, onednn::base_attr(), onednn::engine()));
      p.mds = {md};
      return p;
    });
    onednn::execute(*prim, {{DNNL_ARG_SRC, 0, in.raw_data()}, {DNNL_ARG_DST, 0, out.raw_data()}});
    if (!y_direct) onednn::convert(out, y);
    return Status::Ok();
  });
}

Status dropout(const Tensor& x, const DropoutMask& mask, Tensor& y) {
  static constexpr const char* op = "ops::dropout";
  TSR_RETURN_IF_ERROR(detail::check_dropout(op, x, mask, y, false));
  const int64_t n = x.numel();
  if (n == 0) return Status::Ok();
  if (!mask.active()) {
    if (y.raw_data() != x.raw_data()) y.copy_from(x);
    return Status::Ok();
  }
  const Tensor xc = x.is_contiguous() ? x : x.contiguous();
  const bool direct = y.is_contiguous();
  Tensor out = direct ? y : Tensor::empty(y.shape());
  onednn::apply_threads();
  const float* in = xc.data<float>();
  float* o = out.data<float>();
  const uint32_t threshold = mask.threshold();
  const float scale = mask.scale();
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t e = 0; e < n; ++e) o[e] = mask.keep(static_cast<uint64_t>(e), threshold) ? in[e] * scale : 0.f;
  if (!direct) y.copy_from(out);
  return Status::Ok();
}

Status embedding(const Tensor& table, const Tensor& ids, Tensor& y) {
  static constexpr const char* op = "ops::embedding";
  TSR_RETURN_IF_ERROR(detail::check_embedding(op, table, ids, y));
  const int64_t V = table.dim(0), C = table.dim(1), n = ids.numel();
  const Tensor idc = ids.contiguous();
  const int32_t* id = idc.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)  // the first bad id is the one reported, as in the reference
    if (id[i] < 0 || id[i] >= V) return detail::bad_id(op, i, id[i], V);
  if (n == 0 || C == 0) return Status::Ok();
  onednn::apply_threads();
  float* out = y.data<float>();  // checked: dense f32
  const int64_t rs = table.stride(0), cs = C == 1 ? 1 : table.stride(1);
  if (table.dtype() == DType::f32 && cs == 1) {
    const float* t = table.data<float>();
#pragma omp parallel for schedule(static) if (n * C > 32768)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out + i * C, t + id[i] * rs, static_cast<size_t>(C) * sizeof(float));
  } else {
    const bool is_bf16 = table.dtype() == DType::bf16;
    const char* t = static_cast<const char*>(table.raw_data());
    const int64_t es = static_cast<int64_t>(dtype_size(table.dtype()));
#pragma omp parallel for schedule(static) if (n * C > 32768)
    for (int64_t i = 0; i < n; ++i) {
      const char* row = t + id[i] * rs * es;
      for (int64_t c = 0; c < C; ++c)
        out[i * C + c] = is_bf16 ? bf16_to_f32(reinterpret_cast<const bf16*>(row)[c * cs])
                                 : reinterpret_cast<const float*>(row)[c * cs];
    }
  }
  return Status::Ok();
}

}  // namespace tessera::ops
