// The training ops' fast path: linear on plain weights and its backward (oneDNN matmul; dw
// accumulates through a sum post-op), the backward of activation, layer norm and softmax (their
// oneDNN backward primitives), and embedding_backward and cross_entropy as OpenMP loops, oneDNN
// having no primitive for them. Not here: layer_norm_train (softmax_norm.cpp, beside the
// layer_norm it extends), attention's training ops (attention.cpp), the reference loops
// (ref/ops_ref_backward.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dnnl/onednn.h"
#include "ops_common.h"

namespace tessera::ops {

using dnnl::memory;

namespace {

// db (N) += Σ_m dy (M, N), in double. The rows are cut into chunks of kRows, the same cut on any
// number of threads; the threads share the chunks, each summing its rows as they lie in memory
// (one pass of unit stride, the chunk's N sums in L1), and the chunks' sums are then added in
// chunk order: the same bits on any number of threads. (Cutting the columns among the threads
// instead made each read one cache line of every row, latency-bound: 7.6 % of the Fashion-MNIST
// ViT's bf16 step.) With `rounded`, each chunk of dy is first rounded into it (bf16 compute's copy
// of dy for the products), so that the sums read the rows while they are in cache.
void add_column_sums(const Tensor& dy, Tensor& db, Tensor* rounded = nullptr) {
  const int64_t M = dy.dim(0), N = dy.dim(1), rs = dy.stride(0), cs = dy.stride(1), ds = db.stride(0);
  const float* g = dy.data<float>();
  float* out = db.data<float>();
  constexpr int64_t kRows = 128;
  const int64_t chunks = (M + kRows - 1) / kRows;
  std::vector<double> part(static_cast<size_t>(chunks * N));
#pragma omp parallel for schedule(static) if (M * N >= (1 << 16))
  for (int64_t k = 0; k < chunks; ++k) {
    double* acc = part.data() + k * N;
    const int64_t m1 = std::min(M, (k + 1) * kRows);
    if (rounded) onednn::convert_rows(dy, *rounded, /*round_bf16=*/true, k * kRows, m1);
    for (int64_t m = k * kRows; m < m1; ++m) {
      const float* row = g + m * rs;
      if (cs == 1) {
#pragma omp simd
        for (int64_t n = 0; n < N; ++n) acc[n] += row[n];
      } else {
        for (int64_t n = 0; n < N; ++n) acc[n] += row[n * cs];
      }
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += part[static_cast<size_t>(k * N + n)];
    out[n * ds] += static_cast<float>(s);
  }
}

// dst (n) += src (n), dst any stride.
void add_into(Tensor& dst, const float* src) {
  float* d = dst.data<float>();
  const int64_t n = dst.numel(), s = dst.stride(0);
  for (int64_t i = 0; i < n; ++i) d[i * s] += src[i];
}

// The backward ops write their input gradient `dx` where oneDNN can (dense f32, apart from the
// input `x` the primitive also reads), else into scratch that is copied back.
Tensor gradient_out(const Tensor* dx, const Tensor& x) {
  if (dx && onednn::is_dense_f32(*dx) && !onednn::overlaps(*dx, x)) return *dx;
  return onednn::scratch_tensor(onednn::Slot::out, x.shape(), DType::f32);
}

memory::dims rows_dims(const Tensor& x) { return {x.numel() / x.dim(-1), x.dim(-1)}; }

// dx = y ⊙ (dy - Σ_row dy ⊙ y) over dense (R, C) rows (dx may be dy): softmax_backward where
// oneDNN 2.6 has only its reference kernel, i.e. without AVX-512. 1024 x 1024 on 2 threads,
// ONEDNN_MAX_CPU_ISA=AVX2 (AMD EPYC): 4.6 ms in oneDNN's reference kernel, 0.3 ms here.
void softmax_backward_rows(const float* y, const float* dy, float* dx, int64_t R, int64_t C) {
#pragma omp parallel for schedule(static) if (R * C >= (1 << 16))
  for (int64_t r = 0; r < R; ++r) {
    const float* yr = y + r * C;
    const float* gr = dy + r * C;
    float* out = dx + r * C;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < C; ++c) dot += gr[c] * yr[c];
    for (int64_t c = 0; c < C; ++c) out[c] = yr[c] * (gr[c] - dot);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// linear

Status linear_plain(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, DType compute) {
  static constexpr const char* op = "ops::linear_plain";
  TSR_RETURN_IF_ERROR(detail::check_linear_plain(op, x, w, b, y, false, compute));
  if (x.dim(1) == 0) return ref::linear_plain(x, w, b, y, compute);  // no product: y = b
  return onednn::matmul(op, x, w, b.defined() ? &b : nullptr, y, 1.f, /*accumulate=*/false, compute);
}

Status linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                       Tensor* db, DType compute) {
  static constexpr const char* op = "ops::linear_backward";
  TSR_RETURN_IF_ERROR(detail::check_linear_backward(op, x, w, dy, dx, dw, db, false, compute));
  // bf16 compute: dy is an input of both products and x of dw's, so each is rounded once here,
  // dense, into the kernels' dtype (bf16, or f32 holding bf16 values where the kernels are f32);
  // the products then read them as they are (f32 compute on operands already rounded).
  Tensor X = x, DY = dy;
  bool db_done = false;
  DType rest = compute;  // what the products still have to round: only an f32 w
  if (compute == DType::bf16 && x.numel() > 0 && dy.numel() > 0) {
    onednn::apply_threads();
    const DType k = onednn::lowp_kernel_dtype();
    DY = onednn::scratch_tensor(onednn::Slot::lowp_b, dy.shape(), k);
    if (db) {
      add_column_sums(dy, *db, &DY);  // db (f32, from dy as it is) in the same pass
      db_done = true;
    } else {
      onednn::convert(dy, DY, /*round_bf16=*/true);
    }
    if (dw && !(x.dtype() == DType::bf16 && k == DType::bf16)) {  // a bf16 x (to_bf16) feeds bf16 kernels as it is
      X = onednn::scratch_tensor(onednn::Slot::lowp_a, x.shape(), k);
      onednn::convert(x, X, /*round_bf16=*/true);
    }
    rest = w.dtype() == DType::bf16 ? DType::f32 : DType::bf16;
  }
  // dw and db first: they read x, which dx may then overwrite.
  if (dw) {
    // dw (K, N) += xᵀ · dy. A dw whose columns are rows in memory (the transpose view of a tied
    // (V, C) table's gradient) takes the transposed product, dwᵀ += dyᵀ · x, so that the matmul
    // writes rows, as its fast kernels want.
    if (dw->dim(0) > 1 && dw->dim(1) > 1 && dw->stride(0) == 1) {
      Tensor dwt = dw->transpose(0, 1);
      TSR_RETURN_IF_ERROR(onednn::matmul(op, DY.transpose(0, 1), X, nullptr, dwt, 1.f, /*accumulate=*/true));
    } else {
      TSR_RETURN_IF_ERROR(onednn::matmul(op, X.transpose(0, 1), DY, nullptr, *dw, 1.f, /*accumulate=*/true));
    }
  }
  if (db && dy.numel() > 0 && !db_done) {
    onednn::apply_threads();
    add_column_sums(dy, *db);  // f32, from dy as it is
  }
  // dx (M, K) = dy · wᵀ
  if (dx)
    TSR_RETURN_IF_ERROR(
        onednn::matmul(op, DY, w.transpose(0, 1), nullptr, *dx, 1.f, /*accumulate=*/false, rest));
  return Status::Ok();
}

Status to_bf16(const Tensor& x, Tensor& y) {
  TSR_RETURN_IF_ERROR(detail::check_to_bf16("ops::to_bf16", x, y));
  onednn::apply_threads();
  onednn::convert(x, y, /*round_bf16=*/true);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// activation

Status activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  static constexpr const char* op = "ops::activation_backward";
  TSR_RETURN_IF_ERROR(detail::check_activation_backward(op, act, x, dy, dx, false));
  if (x.numel() == 0 || (act == Activation::none && onednn::same_view(dy, dx))) return Status::Ok();
  onednn::apply_threads();
  if (act == Activation::none) {  // dx = dy
    const Tensor in = onednn::overlaps(dy, dx) ? dy.clone() : dy;
    onednn::convert(in, dx);
    return Status::Ok();
  }
  auto shapes = [&] { return onednn::describe({&x, &dy, &dx}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    const Tensor X = onednn::dense_f32(x, onednn::Slot::a);
    Tensor out = gradient_out(&dx, X);
    const Tensor DY = onednn::dense_input(dy, out, onednn::Slot::b);  // in place when dx is dy
    const int64_t n = x.numel();
    const auto prim = onednn::cached(onednn::Key("eltwise_backward") << static_cast<int64_t>(act) << n, [&] {
      // memory descriptor: the elements as one dense run
      const memory::desc md = onednn::dense_md({n}, memory::data_type::f32);
      // the forward's descriptor (a hint the backward needs), then the backward from the source x
      const dnnl::eltwise_forward::primitive_desc fwd(
          dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, onednn::eltwise_alg(act), md, 0.f,
                                      0.f),
          onednn::engine());
      const dnnl::eltwise_backward::desc d(onednn::eltwise_alg(act), md, md, 0.f, 0.f);
      onednn::Prim p = onednn::make_prim<dnnl::eltwise_backward::primitive_desc, dnnl::eltwise_backward>(
          dnnl::eltwise_backward::primitive_desc(d, onednn::base_attr(), onednn::engine(), fwd));
      p.mds = {md};
      return p;
    });
    onednn::execute(*prim, {{DNNL_ARG_SRC, 0, X.raw_data()},
                            {DNNL_ARG_DIFF_DST, 0, DY.raw_data()},
                            {DNNL_ARG_DIFF_SRC, 0, out.raw_data()}});
    if (!onednn::same_view(out, dx)) onednn::convert(out, dx);
    return Status::Ok();
  });
}

// ---------------------------------------------------------------------------------------------
// layer norm

Status layer_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dy, Tensor* dx, Tensor* dgamma, Tensor* dbeta) {
  static constexpr const char* op = "ops::layer_norm_backward";
  TSR_RETURN_IF_ERROR(
      detail::check_layer_norm_backward(op, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, false));
  if (x.numel() == 0 || (!dx && !dgamma && !dbeta)) return Status::Ok();
  onednn::apply_threads();
  auto shapes = [&] { return onednn::describe({&x, &gamma, &mean, &rstd, &dy}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    using onednn::Slot;
    const memory::dims dims = rows_dims(x);
    const int64_t R = dims[0], C = dims[1];
    const Tensor X = onednn::dense_f32(x, Slot::a);
    Tensor out = gradient_out(dx, X);  // oneDNN always writes dx: scratch when it is not wanted
    const Tensor DY = onednn::dense_input(dy, out, Slot::b);
    const Tensor G = onednn::dense_f32(gamma, Slot::c);
    // The primitive takes the variance where we keep rstd: var = 1/rstd², with the primitive's
    // eps 0, gives back rstd to rounding (the eps of the forward is inside rstd already).
    auto pad16 = [](int64_t n) { return (n + 15) / 16 * 16; };
    auto* var = static_cast<float*>(
        onednn::scratch(Slot::aux, static_cast<size_t>(pad16(R) + 2 * pad16(C)) * sizeof(float)));
    float* dscale = var + pad16(R);
    float* dshift = dscale + pad16(C);
    const float* rs = rstd.data<float>();
    for (int64_t r = 0; r < R; ++r) var[r] = static_cast<float>(1.0 / (static_cast<double>(rs[r]) * rs[r]));

    const auto prim = onednn::cached(onednn::Key("layer_norm_backward") << R << C, [&] {
      // memory descriptors: dense (R, C) rows, (R) mean and variance
      const memory::desc md = onednn::dense_md(dims, memory::data_type::f32);
      const memory::desc smd = onednn::dense_md({R}, memory::data_type::f32);
      const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
      // the forward's descriptor (a hint the backward needs), then the backward: dx and the
      // gradients of scale and shift (oneDNN 2.6 has no backward_data with a scale)
      const dnnl::layer_normalization_forward::primitive_desc fwd(
          dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_training, md, smd, 0.f, flags),
          onednn::engine());
      const dnnl::layer_normalization_backward::desc d(dnnl::prop_kind::backward, md, md, smd, 0.f, flags);
      onednn::Prim p = onednn::make_prim<dnnl::layer_normalization_backward::primitive_desc,
                                         dnnl::layer_normalization_backward>(
          dnnl::layer_normalization_backward::primitive_desc(d, onednn::base_attr(), onednn::engine(), fwd));
      p.mds = {md, smd, onednn::dense_md({C}, memory::data_type::f32)};
      return p;
    });
    // oneDNN 2.6 refuses to run without a shift, which this backward never reads: gamma's
    // buffer stands in for it.
    onednn::Arg args[9] = {{DNNL_ARG_SRC, 0, X.raw_data()},
                           {DNNL_ARG_DIFF_DST, 0, DY.raw_data()},
                           {DNNL_ARG_DIFF_SRC, 0, out.raw_data()},
                           {DNNL_ARG_MEAN, 1, mean.raw_data()},
                           {DNNL_ARG_VARIANCE, 1, var},
                           {DNNL_ARG_SCALE, 2, G.raw_data()},
                           {DNNL_ARG_SHIFT, 2, G.raw_data()},
                           {DNNL_ARG_DIFF_SCALE, 2, dscale},
                           {DNNL_ARG_DIFF_SHIFT, 2, dshift}};
    onednn::execute(*prim, std::span<const onednn::Arg>(args));
    // Parameter gradients accumulate; the primitive wrote this call's into scratch.
    if (dgamma) add_into(*dgamma, dscale);
    if (dbeta) add_into(*dbeta, dshift);
    if (dx && !onednn::same_view(out, *dx)) onednn::convert(out, *dx);
    return Status::Ok();
  });
}

// ---------------------------------------------------------------------------------------------
// softmax

Status softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  static constexpr const char* op = "ops::softmax_backward";
  TSR_RETURN_IF_ERROR(detail::check_elementwise_training(op, {{"y", &y}, {"dy", &dy}, {"dx", &dx}}, false));
  if (y.numel() == 0) return Status::Ok();
  onednn::apply_threads();
  auto shapes = [&] { return onednn::describe({&y, &dy, &dx}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    const memory::dims dims = rows_dims(y);
    const Tensor Y = onednn::dense_f32(y, onednn::Slot::a);
    Tensor out = gradient_out(&dx, Y);
    const Tensor DY = onednn::dense_input(dy, out, onednn::Slot::b);  // in place when dx is dy
    static constexpr uint32_t kLoop = 1;  // oneDNN offers only its reference kernel: our loop instead
    const auto prim = onednn::cached(onednn::Key("softmax_backward") << dims[0] << dims[1], [&] {
      // memory descriptor: dense (R, C) rows; softmax over axis 1
      const memory::desc md = onednn::dense_md(dims, memory::data_type::f32);
      const dnnl::softmax_forward::primitive_desc fwd(
          dnnl::softmax_forward::desc(dnnl::prop_kind::forward_training, md, 1), onednn::engine());
      const dnnl::softmax_backward::desc d(md, md, 1);
      onednn::Prim p = onednn::make_prim<dnnl::softmax_backward::primitive_desc, dnnl::softmax_backward>(
          dnnl::softmax_backward::primitive_desc(d, onednn::base_attr(), onednn::engine(), fwd));
      p.flags = p.impl.rfind("ref", 0) == 0 ? kLoop : 0;
      p.mds = {md};
      return p;
    });
    if (prim->flags & kLoop)
      softmax_backward_rows(Y.data<float>(), DY.data<float>(), out.data<float>(), dims[0], dims[1]);
    else
      onednn::execute(*prim, {{DNNL_ARG_DST, 0, Y.raw_data()},
                              {DNNL_ARG_DIFF_DST, 0, DY.raw_data()},
                              {DNNL_ARG_DIFF_SRC, 0, out.raw_data()}});
    if (!onednn::same_view(out, dx)) onednn::convert(out, dx);
    return Status::Ok();
  });
}

// ---------------------------------------------------------------------------------------------
// embedding

Status embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dtable) {
  static constexpr const char* op = "ops::embedding_backward";
  TSR_RETURN_IF_ERROR(detail::check_embedding_backward(op, ids, dy, dtable, false));
  const int64_t V = dtable.dim(0), C = dtable.dim(1), n = ids.numel();
  const Tensor idc = ids.contiguous();
  const int32_t* id = idc.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)  // the first bad id is the one reported, as in the reference
    if (id[i] < 0 || id[i] >= V) return detail::bad_id(op, i, id[i], V);
  if (n == 0 || C == 0) return Status::Ok();
  onednn::apply_threads();
  auto shapes = [&] { return onednn::describe({&ids, &dy, &dtable}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    const Tensor G = onednn::dense_f32(dy, onednn::Slot::a);
    const float* g = G.data<float>();
    float* t = dtable.data<float>();
    const int64_t rs = dtable.stride(0), cs = C == 1 ? 1 : dtable.stride(1);
    // Rows with the same id add into the same table row, so the threads split the columns, not
    // the ids: no two write the same place, and each row's sum runs in id order on any count.
    constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static) if (n * C >= 32768)
    for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
      const int64_t c1 = std::min(C, c0 + kBlock);
      for (int64_t i = 0; i < n; ++i) {
        float* row = t + id[i] * rs;
        const float* src = g + i * C;
        if (cs == 1)
          for (int64_t c = c0; c < c1; ++c) row[c] += src[c];
        else
          for (int64_t c = c0; c < c1; ++c) row[c * cs] += src[c];
      }
    }
    return Status::Ok();
  });
}

// ---------------------------------------------------------------------------------------------
// cross-entropy

namespace {
// What a row's loss needs from its logits, taken before an in-place softmax overwrites them.
struct RowStats {
  double sum = 0.0;   // Σ_v l_v (label smoothing only)
  double loss = 0.0;  // the row's loss, once known
  float max = 0.f;
  float target = 0.f;  // l_t
  int64_t argmax = 0;
};
}  // namespace

// Per counted row, loss = lse - (1 - ε)·l_t - (ε/V)·Σ_v l_v and dlogits = scale·(softmax - q).
// The probabilities come from ops::softmax (oneDNN), and the log-sum-exp from them: the entry
// at the row's maximum m is exp(0)/Σ, so lse = m - log p_max, with no second pass of exponentials.
// Rows go in blocks of about 2^20 logits, probabilities in dlogits or in scratch of that size.
Status cross_entropy(const Tensor& logits, const Tensor& targets, float label_smoothing, double* loss_sum,
                     int64_t* counted, Tensor* dlogits, float scale) {
  static constexpr const char* op = "ops::cross_entropy";
  TSR_RETURN_IF_ERROR(detail::check_cross_entropy(op, logits, targets, label_smoothing, dlogits, false));
  if (dlogits && onednn::overlaps(*dlogits, logits) && !onednn::same_view(*dlogits, logits))
    return Status::Invalid(std::string(op) + ": dlogits " + dlogits->describe() +
                           " overlaps logits without being them (in place is allowed)");
  const int64_t N = logits.dim(0), V = logits.dim(1);
  const Tensor tc = targets.contiguous();
  const int32_t* tg = tc.data<int32_t>();
  onednn::apply_threads();
  auto shapes = [&] { return onednn::describe({&logits, &targets, dlogits}); };
  return onednn::guarded(op, shapes, [&]() -> Status {
    using onednn::Slot;
    const double eps = label_smoothing, smooth = eps / static_cast<double>(V);
    constexpr double kInf = std::numeric_limits<double>::infinity();
    const Tensor L = onednn::dense_f32(logits, Slot::a);
    const bool direct = dlogits && onednn::is_dense_f32(*dlogits);
    const int64_t block = std::max<int64_t>(1, (int64_t{1} << 20) / V);
    auto* st = static_cast<RowStats*>(
        onednn::scratch(Slot::b, static_cast<size_t>(std::min(N, block)) * sizeof(RowStats)));
    double total = 0.0;
    int64_t rows = 0;
    for (int64_t r0 = 0; r0 < N; r0 += block) {
      const int64_t nb = std::min(N - r0, block);
      const float* l = L.data<float>() + r0 * V;
      const int32_t* t = tg + r0;
#pragma omp parallel for schedule(static) if (nb * V >= (1 << 16))
      for (int64_t r = 0; r < nb; ++r) {
        if (t[r] < 0) continue;
        const float* row = l + r * V;
        RowStats s;
        s.max = row[0];
        for (int64_t v = 1; v < V; ++v)
          if (row[v] > s.max) {
            s.max = row[v];
            s.argmax = v;
          }
        if (eps > 0.0)
          for (int64_t v = 0; v < V; ++v) s.sum += row[v];
        s.target = row[t[r]];
        st[r] = s;
      }
      Tensor P =
          direct ? dlogits->slice(0, r0, r0 + nb) : onednn::scratch_tensor(Slot::c, {nb, V}, DType::f32);
      TSR_RETURN_IF_ERROR(softmax(L.slice(0, r0, r0 + nb), P));
      float* p = P.data<float>();
#pragma omp parallel for schedule(static) if (nb * V >= (1 << 16))
      for (int64_t r = 0; r < nb; ++r) {
        float* pr = p + r * V;
        if (t[r] < 0) {
          if (dlogits) std::memset(pr, 0, static_cast<size_t>(V) * sizeof(float));
          continue;
        }
        RowStats& s = st[r];
        // Nothing above -inf: softmax 0, loss +inf, never NaN; likewise a -inf target, or any
        // -inf under smoothing (q puts ε/V there).
        const bool masked = !(s.max > -std::numeric_limits<float>::infinity());
        s.loss = masked ? kInf : s.max - std::log(static_cast<double>(pr[s.argmax])) - (1.0 - eps) * s.target;
        if (eps > 0.0) s.loss -= smooth * s.sum;
        if (!dlogits) continue;
        const float off = static_cast<float>(smooth), on = static_cast<float>(1.0 - eps);
        for (int64_t v = 0; v < V; ++v) pr[v] = scale * (pr[v] - off);
        pr[t[r]] -= scale * on;
      }
      for (int64_t r = 0; r < nb; ++r)  // in row order: the same sum on any number of threads
        if (t[r] >= 0) {
          total += st[r].loss;
          ++rows;
        }
      if (dlogits && !direct) {
        Tensor dst = dlogits->slice(0, r0, r0 + nb);
        onednn::convert(P, dst);
      }
    }
    if (loss_sum) *loss_sum = total;
    if (counted) *counted = rows;
    return Status::Ok();
  });
}

}  // namespace tessera::ops
