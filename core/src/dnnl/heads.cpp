// ops::split_heads (B, T, H·D) -> (B, H, T, D) and ops::merge_heads back: one oneDNN reorder
// between two strided views of the same 4-D index space (b, h, t, d), any strides either side.
// Not here: attention itself, which can often use head views of (B, T, H·D) without a copy.
#include <functional>

#include "dnnl/onednn.h"
#include "ops_common.h"

namespace tessera::ops {

using dnnl::memory;

namespace {

// y (viewed through `to`) = x (viewed through `from`), both (B, H, T, D) index spaces.
// `view` gives the same copy as Tensor views, for what the reorder does not cover: integer
// outputs (which round differently) and overlapping buffers.
Status permute(const char* op, const Tensor& x, Tensor& y, const std::function<memory::desc()>& from,
               const std::function<memory::desc()>& to, const std::function<Tensor()>& view) {
  if ((y.dtype() != DType::f32 && y.dtype() != DType::bf16) || onednn::overlaps(x, y)) {
    y.copy_from(view());
    return Status::Ok();
  }
  onednn::apply_threads();
  auto shapes = [&] { return onednn::describe({&x, &y}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    const memory::desc src = from(), dst = to();
    const auto prim = onednn::cached(onednn::Key("reorder") << src << dst, [&] {
      // reorder primitive descriptor: strided source view -> strided destination view
      onednn::Prim p = onednn::make_prim<dnnl::reorder::primitive_desc, dnnl::reorder>(
          dnnl::reorder::primitive_desc(onednn::engine(), src, onednn::engine(), dst, onednn::base_attr()));
      p.mds = {src, dst};
      return p;
    });
    onednn::execute(*prim, {{DNNL_ARG_FROM, 0, x.raw_data()}, {DNNL_ARG_TO, 1, y.raw_data()}});
    return Status::Ok();
  });
}

}  // namespace

Status split_heads(const Tensor& x, int64_t n_heads, Tensor& y) {
  static constexpr const char* op = "ops::split_heads";
  TSR_RETURN_IF_ERROR(detail::check_split_heads(op, x, n_heads, y));
  if (x.numel() == 0) return Status::Ok();
  const int64_t B = x.dim(0), T = x.dim(1), H = n_heads, D = x.dim(2) / n_heads;
  return permute(
      op, x, y,
      // x read as (B, H, T, D): head h starts h·D elements into each row
      [&] {
        return onednn::md_of(x, {B, H, T, D}, {x.stride(0), D * x.stride(2), x.stride(1), x.stride(2)});
      },
      [&] { return onednn::md_of(y); },
      [&] {
        return x.clone().reshape({B, T, H, D}).transpose(1, 2);
      });
}

Status merge_heads(const Tensor& x, Tensor& y) {
  static constexpr const char* op = "ops::merge_heads";
  TSR_RETURN_IF_ERROR(detail::check_merge_heads(op, x, y));
  if (x.numel() == 0) return Status::Ok();
  const int64_t B = x.dim(0), H = x.dim(1), T = x.dim(2), D = x.dim(3);
  return permute(
      op, x, y, [&] { return onednn::md_of(x); },
      // y written as (B, H, T, D)
      [&] {
        return onednn::md_of(y, {B, H, T, D}, {y.stride(0), D * y.stride(2), y.stride(1), y.stride(2)});
      },
      [&] {
        return x.transpose(1, 2).clone().reshape({B, T, H * D});
      });
}

}  // namespace tessera::ops
