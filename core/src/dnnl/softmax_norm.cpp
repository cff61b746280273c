// ops::softmax and ops::layer_norm (and layer_norm_train, which keeps the statistics) over the
// last axis, as oneDNN primitives on (R, C) rows.
// Each adds what oneDNN lacks: a softmax row with no value above -inf (fully masked) comes out
// as zeros, where oneDNN would give -inf - -inf = NaN; a constant layer_norm row comes out as
// exactly beta; a row too large for f32 statistics (|x| ~ 1e19) is normalised in double, as the
// reference does. Not here: masking itself (attention's job).
#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "dnnl/onednn.h"
#include "ops_common.h"

namespace tessera::ops {

using dnnl::memory;

namespace {

// Rows are processed dense: `in` is x itself when it is dense f32 and does not partly overlap y,
// else a converted copy; `out` is y itself when dense f32, else scratch copied back afterwards.
struct Rows {
  Tensor in, out;
  bool copy_back = false;
};
Rows dense_rows(const Tensor& x, Tensor& y) {
  Rows r;
  r.in = onednn::dense_input(x, y, onednn::Slot::a);
  r.out = y;
  if (!onednn::is_dense_f32(y)) {
    r.out = onednn::scratch_tensor(onednn::Slot::out, y.shape(), DType::f32);
    r.copy_back = true;
  }
  return r;
}

// (R, C) with C the last axis.
memory::dims rows_dims(const Tensor& x) {
  const int64_t C = x.dim(-1);
  return {x.numel() / C, C};
}

}  // namespace

Status softmax(const Tensor& x, Tensor& y) {
  static constexpr const char* op = "ops::softmax";
  TSR_RETURN_IF_ERROR(detail::check_same_shape(op, x, y));
  if (x.rank() < 1) return Status::Invalid(std::string(op) + ": needs rank >= 1, got a scalar");
  if (x.numel() == 0) return Status::Ok();
  onednn::apply_threads();
  auto shapes = [&] { return onednn::describe({&x, &y}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    Rows rows = dense_rows(x, y);
    const memory::dims dims = rows_dims(x);
    const int64_t R = dims[0], C = dims[1];

    // Fully masked rows, found before the softmax may overwrite its input (in place). A row's
    // first or last entry is unmasked under causal, left- and right-padding masks alike, so most
    // rows cost one or two reads; the others are read whole and flagged if nothing in them is
    // above -inf (NaN counts as masked, as in the reference). Rows of big inputs come from
    // memory, not cache: prefetch ahead and split the rows over the threads.
    const float* in = rows.in.data<float>();
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    auto* masked = static_cast<unsigned char*>(onednn::scratch(onednn::Slot::aux, static_cast<size_t>(R)));
    int any_masked = 0;
#pragma omp parallel for schedule(static) reduction(| : any_masked) if (R * C >= (1 << 16))
    for (int64_t r = 0; r < R; ++r) {
      const float* row = in + r * C;
      if (r + 16 < R) __builtin_prefetch(row + 16 * C);
      bool all_masked = false;
      if (!(row[0] > kNegInf) && !(row[C - 1] > kNegInf)) {
        int unmasked = 0;  // no early exit: a branch-free OR over the row vectorises
        for (int64_t c = 1; c < C - 1; ++c) unmasked |= row[c] > kNegInf;
        all_masked = !unmasked;
      }
      masked[r] = all_masked;
      any_masked |= all_masked;
    }

    const auto prim = onednn::cached(onednn::Key("softmax") << R << C, [&] {
      // memory descriptor: dense (R, C) f32 rows; softmax over axis 1
      const memory::desc md = onednn::dense_md({R, C}, memory::data_type::f32);
      const dnnl::softmax_forward::desc d(dnnl::prop_kind::forward_inference, md, 1);
      onednn::Prim p = onednn::make_prim<dnnl::softmax_forward::primitive_desc, dnnl::softmax_forward>(
          dnnl::softmax_forward::primitive_desc(d, onednn::base_attr(), onednn::engine()));
      p.mds = {md};
      return p;
    });
    onednn::execute(*prim, {{DNNL_ARG_SRC, 0, rows.in.raw_data()}, {DNNL_ARG_DST, 0, rows.out.raw_data()}});

    if (any_masked) {
      float* out = rows.out.data<float>();
#pragma omp parallel for schedule(static) if (R * C >= (1 << 16))
      for (int64_t r = 0; r < R; ++r)
        if (masked[r]) std::memset(out + r * C, 0, static_cast<size_t>(C) * sizeof(float));
    }
    if (rows.copy_back) onednn::convert(rows.out, y);
    return Status::Ok();
  });
}

namespace {

// layer_norm over (R, C) rows; with mean and rstd (contiguous f32 (R), checked) also each row's
// statistics, for training: oneDNN keeps the variance, written into rstd and turned into
// 1/sqrt(var + eps) there afterwards.
// Whether some |x| of the row is above the float whose bits are limit_bits (NaN and ±inf are: the
// double path gives them NaN as oneDNN does). For non-negative floats the bits order as the values,
// and adding (0x7fffffff - limit_bits) to |bits| carries into the sign bit exactly when |bits| >
// limit_bits: an OR of the sums, which vectorises on plain SSE2 (a float max reduction did not).
using aliased_u32 = uint32_t __attribute__((may_alias));
bool any_above(const float* row, int64_t C, uint32_t limit_bits) {
  const auto* u = reinterpret_cast<const aliased_u32*>(row);
  const uint32_t carry = 0x7fffffffu - limit_bits;
  uint32_t acc = 0;
#pragma omp simd reduction(| : acc)
  for (int64_t k = 0; k < C; ++k) acc |= (u[k] & 0x7fffffffu) + carry;
  return (acc & 0x80000000u) != 0;
}

Status layer_norm_rows(const char* op, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                       Tensor& y, Tensor* mean, Tensor* rstd) {
  if (x.numel() == 0) return Status::Ok();
  onednn::apply_threads();
  auto shapes = [&] { return onednn::describe({&x, &gamma, &beta, &y}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    Rows rows = dense_rows(x, y);
    const memory::dims dims = rows_dims(x);
    const int64_t C = dims[1];
    const bool train = mean != nullptr;
    // scale and shift: (C) f32, converted when bf16 or strided (C values, cheap)
    const Tensor g = onednn::dense_f32(gamma, onednn::Slot::b), b = onednn::dense_f32(beta, onednn::Slot::c);

    // Constant rows (every entry the same finite value: padding, blank patches) normalise to
    // exactly beta. oneDNN's f32 statistics may leave a rounding error in x - mean there, which
    // 1/sqrt(eps) magnifies (eps = 1e-12 in BERT); so they are found first (before an in-place
    // call overwrites x; a row usually differs at its second entry) and set to beta after. In
    // training their statistics are set too, exactly: mean = the value (kept here), var = 0.
    //
    // Large rows: oneDNN sums (x - mean)² in f32, which overflows once C·(2·max|x|)² passes
    // FLT_MAX (|x| ~ 1e19 at C = 3, ~1e17 at C = 4096); the variance becomes inf and the row
    // comes out as beta, finite and wrong. Such rows (rare: only hostile or overflowing inputs) are
    // normalised again in double afterwards, as the reference loop does. They are known by their
    // variance, which the primitive always reports (forward_training: the same arithmetic, plus R
    // statistics), so finding them costs nothing; only an in-place call, which loses its input,
    // looks for them first (max |x| against the bound) and copies them.
    const int64_t R = dims[0];
    const float* in = rows.in.data<float>();
    const bool in_place = rows.in.raw_data() == rows.out.raw_data();
    const size_t flag_bytes = static_cast<size_t>((R + 63) / 64 * 64);
    const size_t row_floats = static_cast<size_t>(R) * sizeof(float);
    auto* constant = static_cast<unsigned char*>(
        onednn::scratch(onednn::Slot::aux, 2 * flag_bytes + (train ? row_floats : 2 * row_floats)));
    unsigned char* large = constant + flag_bytes;
    float* value = reinterpret_cast<float*>(constant + 2 * flag_bytes);  // train: each row's first value
    // (R) mean and variance: the caller's in training (rstd holds the variance until the end)
    float* stat_mean = train ? mean->data<float>() : value;
    float* stat_var = train ? rstd->data<float>() : value + R;
    const float limit = static_cast<float>(std::sqrt(std::numeric_limits<float>::max() / (8.0 * static_cast<double>(C))));
    uint32_t limit_bits;
    std::memcpy(&limit_bits, &limit, 4);
    int any_constant = 0, any_large = 0;
#pragma omp parallel for schedule(static) reduction(| : any_constant, any_large) if (R * C >= (1 << 16))
    for (int64_t r = 0; r < R; ++r) {
      const float* row = in + r * C;
      int64_t c = 1;
      while (c < C && row[c] == row[0]) ++c;
      constant[r] = c == C && std::isfinite(row[0]);
      if (train) value[r] = row[0];
      any_constant |= constant[r];
      large[r] = in_place && !constant[r] && any_above(row, C, limit_bits);  // in place: may be
      any_large |= large[r];
    }
    // In place: the input of every row that may overflow, kept; (row, its values), by row.
    std::vector<std::pair<int64_t, std::vector<float>>> kept;
    if (any_large)
      for (int64_t r = 0; r < R; ++r)
        if (large[r]) kept.emplace_back(r, std::vector<float>(in + r * C, in + (r + 1) * C));

    onednn::Key key("layer_norm");
    key << dims[0] << C << eps;
    const auto prim = onednn::cached(key, [&] {
      // memory descriptors: dense (R, C) rows, (C) scale and shift, (R) mean and variance
      const memory::desc md = onednn::dense_md(dims, memory::data_type::f32);
      const memory::desc cmd = onednn::dense_md({C}, memory::data_type::f32);
      const memory::desc smd = onednn::dense_md({R}, memory::data_type::f32);
      // normalise over the last axis with this eps, then scale (gamma) and shift (beta)
      const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
      const auto d = dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_training, md, smd, eps, flags);
      onednn::Prim p = onednn::make_prim<dnnl::layer_normalization_forward::primitive_desc,
                                         dnnl::layer_normalization_forward>(
          dnnl::layer_normalization_forward::primitive_desc(d, onednn::base_attr(), onednn::engine()));
      p.mds = {md, cmd, smd};
      return p;
    });
    const onednn::Arg args[6] = {{DNNL_ARG_SRC, 0, rows.in.raw_data()},  {DNNL_ARG_DST, 0, rows.out.raw_data()},
                                 {DNNL_ARG_SCALE, 1, g.raw_data()},      {DNNL_ARG_SHIFT, 1, b.raw_data()},
                                 {DNNL_ARG_MEAN, 2, stat_mean},          {DNNL_ARG_VARIANCE, 2, stat_var}};
    onednn::execute(*prim, std::span<const onednn::Arg>(args, 6));
    // The rows whose f32 variance overflowed, with their input: from x itself, or kept (in place;
    // every such row was kept: its max |x| is above the bound). Both ways, the same rows.
    std::vector<std::pair<int64_t, const float*>> large_rows;
    size_t next_kept = 0;
    for (int64_t r = 0; r < R; ++r) {
      while (next_kept < kept.size() && kept[next_kept].first < r) ++next_kept;
      const bool overflowed = !constant[r] && !std::isfinite(stat_var[r]);
      large[r] = overflowed;
      if (!overflowed) continue;
      if (!in_place) large_rows.emplace_back(r, in + r * C);
      else if (next_kept < kept.size() && kept[next_kept].first == r) large_rows.emplace_back(r, kept[next_kept].second.data());
      else large[r] = 0;  // cannot happen (see the bound); oneDNN's row stays
    }
    if (any_constant) {
      float* out = rows.out.data<float>();
      const float* shift = b.data<float>();
#pragma omp parallel for schedule(static) if (R * C >= (1 << 16))
      for (int64_t r = 0; r < R; ++r)
        if (constant[r]) std::memcpy(out + r * C, shift, static_cast<size_t>(C) * sizeof(float));
    }
    for (const auto& [r, row] : large_rows) {
      // The reference loop's arithmetic (ref::layer_norm): double statistics, biased variance.
      double m = 0.0, var = 0.0;
      for (int64_t k = 0; k < C; ++k) m += row[k];
      m /= static_cast<double>(C);
      for (int64_t k = 0; k < C; ++k) var += (row[k] - m) * (row[k] - m);
      var /= static_cast<double>(C);
      const double inv = 1.0 / std::sqrt(var + eps);
      float* out = rows.out.data<float>() + r * C;
      const float* scale = g.data<float>();
      const float* shift = b.data<float>();
      for (int64_t k = 0; k < C; ++k) out[k] = static_cast<float>((row[k] - m) * inv * scale[k] + shift[k]);
      if (train) {
        mean->data<float>()[r] = static_cast<float>(m);
        rstd->data<float>()[r] = static_cast<float>(inv);  // final: the loop below skips large rows
      }
    }
    if (train) {
      float* mu = mean->data<float>();
      float* rs = rstd->data<float>();  // the variance, until here
      for (int64_t r = 0; r < R; ++r) {
        if (large[r]) continue;
        if (constant[r]) {
          mu[r] = value[r];
          rs[r] = 0.f;
        }
        rs[r] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(rs[r]) + eps));
      }
    }
    if (rows.copy_back) onednn::convert(rows.out, y);
    return Status::Ok();
  });
}

}  // namespace

Status layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y) {
  static constexpr const char* op = "ops::layer_norm";
  TSR_RETURN_IF_ERROR(detail::check_layer_norm_shapes(op, x, gamma, beta, eps, y));
  return layer_norm_rows(op, x, gamma, beta, eps, y, nullptr, nullptr);
}

Status layer_norm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  static constexpr const char* op = "ops::layer_norm_train";
  TSR_RETURN_IF_ERROR(detail::check_layer_norm_train(op, x, gamma, beta, eps, y, mean, rstd, false));
  return layer_norm_rows(op, x, gamma, beta, eps, y, &mean, &rstd);
}

}  // namespace tessera::ops
