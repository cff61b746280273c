// Linear: y (M, N) = act(x (M, K) · W (K, N) + b) [+ r], one oneDNN matmul with fused post-ops.
// Weights are converted (bf16-rounded if asked) and reordered into the layout the matmul wants
// once, in create(); forward() only builds memory handles around the caller's buffers.
// Not here: the reference loop (ref/ops_ref.cpp) and any model logic.
//
// Why matmul and not inner_product: on this AVX2 machine both run the same jit sgemm (measured
// equal within noise for transformer shapes), but matmul takes the weights as (K, N) like our
// convention, keeps them plain there, and its `any` layout does not change with M, whereas the
// inner product asked for (N, K) at one M and (K, N) at another.
//
// Few rows with bf16 compute and no native bf16 kernels (decoding on AVX2): a hand-written GEMV
// that streams a bf16 copy of the weights (kernels/gemv_bf16.cpp), since oneDNN 2.6 would stream
// the f32 copy there. Such a layer holds both copies: the f32 one for many rows (prefill,
// encoders), where oneDNN's f32 matmul is compute-bound and faster than the GEMV, and the bf16 one
// for few rows, where the step is bound by the bytes read (docs/PERFORMANCE.md).
#include <mutex>

#include "dnnl/onednn.h"
#include "kernels/gemv_bf16.h"
#include "ops_common.h"

namespace tessera {

using dnnl::memory;

namespace {

// Rows up to which a bf16 layer without native bf16 kernels runs the streaming GEMV instead of
// oneDNN's f32 matmul: measured on the 2-core AVX2 machine (docs/PERFORMANCE.md, "bf16 weights
// for decoding"), the GEMV is faster up to here for GPT-2-small's shapes.
constexpr int64_t kGemvRows = 16;
static_assert(kGemvRows <= kernels::kGemvMaxRows);

// Rows the weights are packed for. The blocked layouts oneDNN picks depend on K, N and the ISA;
// any M of a transformer batch will do.
constexpr int64_t kPackRows = 256;
// Extra elements per row of plain weights whose rows would be a multiple of 2 KiB apart.
constexpr int64_t kRowPad = 16;
constexpr int64_t kPadBelowRows = 512;

// How the residual enters the matmul.
enum class Residual : int64_t {
  none = 0,
  binary = 1,  // post-op binary add with src1 = r
  sum = 2,     // post-op sum: r already sits in dst (y aliases r), dst = result + dst
};


bool valid_activation(Activation a) {
  return a == Activation::none || a == Activation::relu || a == Activation::gelu_erf ||
         a == Activation::gelu_tanh;
}

// The descriptors of one forward call.
struct Shapes {
  memory::desc src, dst, bias, res;  // res: only with Residual::binary
  Activation act = Activation::none;
  Residual residual = Residual::none;
};

// Post-ops in the order of the contract: activation, then the residual.
dnnl::primitive_attr linear_attr(const Shapes& s) {
  dnnl::primitive_attr attr = onednn::base_attr();
  dnnl::post_ops po;
  if (s.act != Activation::none) po.append_eltwise(1.f, onednn::eltwise_alg(s.act), 0.f, 0.f);
  if (s.residual == Residual::binary) po.append_binary(dnnl::algorithm::binary_add, s.res);
  if (s.residual == Residual::sum) po.append_sum(1.f);
  attr.set_post_ops(po);
  return attr;
}

dnnl::matmul::primitive_desc linear_pd(const Shapes& s, const memory::desc& weights) {
  // matmul descriptor: src (M, K) · weights (K, N) + bias (1, N) -> dst (M, N)
  const dnnl::matmul::desc d =
      s.bias ? dnnl::matmul::desc(s.src, weights, s.bias, s.dst) : dnnl::matmul::desc(s.src, weights, s.dst);
  // primitive descriptor: oneDNN picks the implementation (and, for `any`, the weights layout)
  return dnnl::matmul::primitive_desc(d, linear_attr(s), onednn::engine());
}

// Runs a one-off reorder (weights at load time; never on a per-call path).
void reorder_once(const memory& from, const memory& to) {
  dnnl::stream& s = onednn::stream();
  dnnl::reorder(from, to).execute(s, const_cast<memory&>(from), const_cast<memory&>(to));
  s.wait();
}

}  // namespace

struct Linear::Impl {
  Tensor weight, bias;  // as given to create()
  int64_t K = 0, N = 0;
  Activation act = Activation::none;
  DType compute = DType::f32;
  bool native_bf16 = false;   // kernels take bf16 src and weights (else f32, bf16 emulated)
  DType kernel = DType::f32;  // the dtype src and weights have inside the matmul
  Tensor bias_row;            // (1, N) f32 contiguous, or undefined
  memory::desc packed_md;     // the layout the representative primitive asked for
  std::string packed_key;     // packed_md as cache-key bytes
  memory packed;              // the weights in packed_md, owned
  // Plain weights whose rows are a multiple of 2 KiB apart: for fewer than kPadBelowRows rows
  // the layer reads a copy with rows N + kRowPad apart, made on first need (see create()).
  bool pad_rows = false;
  memory::desc padded_md;
  mutable std::once_flag padded_once;
  mutable memory padded;

  const memory& padded_weights() const {
    std::call_once(padded_once, [this] {
      memory m(padded_md, onednn::engine());
      reorder_once(packed, m);
      padded = m;
    });
    return padded;
  }
  std::string impl_name;
  kernels::GemvWeights gemv;  // bf16 streaming copy for M <= kGemvRows; only when bf16 is emulated

  bool uses_gemv(int64_t M) const { return gemv.defined() && M >= 1 && M <= kGemvRows; }

  // (K, N) row-major weights for primitives that refuse packed_md; made on first need.
  mutable std::once_flag plain_once;
  mutable memory plain;

  const memory& plain_weights() const {
    std::call_once(plain_once, [this] {
      const memory::desc pmd = onednn::dense_md({K, N}, onednn::dt_of(kernel));
      if (pmd == packed_md) {
        plain = packed;
        return;
      }
      memory m(pmd, onednn::engine());
      reorder_once(packed, m);
      plain = m;
      onednn::count_plain_copy();
    });
    return plain;
  }
};

Result<Linear> Linear::create(const Tensor& weight, const Tensor& bias, Activation act, DType compute) {
  static constexpr const char* op = "Linear::create";
  auto is_float = [](const Tensor& t) { return t.dtype() == DType::f32 || t.dtype() == DType::bf16; };
  if (!weight.defined() || !is_float(weight) || weight.rank() != 2)
    return Status::Invalid(std::string(op) + ": weight must be (K, N) f32 or bf16, got " +
                           onednn::describe({&weight}));
  const int64_t K = weight.dim(0), N = weight.dim(1);
  if (bias.defined() && (!is_float(bias) || bias.rank() != 1 || bias.dim(0) != N))
    return Status::Invalid(std::string(op) + ": bias " + bias.describe() + " should be f32 or bf16 (" +
                           std::to_string(N) + ") for weight " + weight.describe());
  if (!valid_activation(act))
    return Status::Invalid(std::string(op) + ": unknown activation " + std::to_string(static_cast<int>(act)));
  if (compute != DType::f32 && compute != DType::bf16)
    return Status::Unsupported(std::string(op) + ": compute dtype must be f32 or bf16, got " +
                               dtype_name(compute));
  onednn::apply_threads();

  auto impl = std::make_shared<Impl>();
  impl->weight = weight;
  impl->bias = bias;
  impl->K = K;
  impl->N = N;
  impl->act = act;
  impl->compute = compute;
  impl->native_bf16 = compute == DType::bf16 && onednn::use_native_bf16();
  impl->kernel = impl->native_bf16 ? DType::bf16 : DType::f32;
  if (bias.defined()) {
    impl->bias_row = Tensor::empty({1, N});  // f32 also for bf16 compute, as oneDNN takes it
    Tensor row = impl->bias_row.reshape({N});
    onednn::convert(bias, row);
  }
  if (K == 0 || N == 0) {
    impl->impl_name = "none (empty weight)";
    Linear lin;
    lin.impl_ = std::move(impl);
    return lin;
  }

  auto shapes = [&] { return onednn::describe({&weight, &bias}); };
  Status st = onednn::guarded(op, shapes, [&]() -> Status {
    const memory::data_type kdt = onednn::dt_of(impl->kernel);
    // Descriptors for a representative M, weights left to oneDNN (format_tag::any).
    Shapes s;
    s.src = onednn::dense_md({kPackRows, K}, kdt);
    s.dst = onednn::dense_md({kPackRows, N}, memory::data_type::f32);
    if (bias.defined()) s.bias = onednn::dense_md({1, N}, memory::data_type::f32);
    s.act = act;
    const dnnl::matmul::primitive_desc pd = linear_pd(s, memory::desc({K, N}, kdt, memory::format_tag::any));
    impl->impl_name = pd.impl_info_str();
    impl->packed_md = pd.weights_desc();
    if (onednn::mismatched_packing_for_testing())
      impl->packed_md = memory::desc({K, N}, kdt, memory::dims{1, K});  // column-major
    // Plain rows a multiple of 2 KiB apart (N = 512, 1024, 1536, 3072 f32): the gemm kernel that
    // reads the weights unpacked, which oneDNN uses below a few hundred rows, walks down columns
    // whose elements all map to the same few L1 sets. Measured on AVX2, 2 threads: 128 x 768 x
    // 3072 took 10.5 ms with rows 3072 apart and 5.4 ms with rows 3088 apart, 197 rows 14.6 vs
    // 7.3 ms, 512 rows the same either way (oneDNN packs the weights itself there). Hit: the FFN's
    // first layer of GPT-2, BERT and ViT (3072), MiniLM's (1536). Few rows read a padded copy,
    // made on first need, so that loading stays zero-copy and many rows need no second copy.
    const memory::desc dense = onednn::dense_md({K, N}, kdt);
    if (impl->packed_md == dense && (N * static_cast<int64_t>(dtype_size(impl->kernel))) % 2048 == 0) {
      impl->pad_rows = true;
      impl->padded_md = memory::desc({K, N}, kdt, memory::dims{N + kRowPad, 1});
    }
    impl->packed_key = (onednn::Key("packed") << impl->packed_md).str();
    // That layout is plain (K, N) row-major (gemm:jit's on AVX2) and the weights are dense in the
    // kernel's dtype, unrounded: the layer reads them where they are (a safetensors file's mmap'd
    // pages), nothing copied at load. They must not be written while the layer lives.
    const bool rounds = compute == DType::bf16 && !impl->native_bf16;
    if (!rounds && weight.dtype() == impl->kernel && weight.is_contiguous() && impl->packed_md == dense) {
      impl->packed = onednn::mem(impl->packed_md, weight.raw_data());
      return Status::Ok();
    }
    // Otherwise: weights in the kernel's dtype, (K, N) row-major (bf16 compute rounds them here,
    // once), reordered into that layout, once.
    Tensor wk = weight;
    if (rounds || weight.dtype() != impl->kernel || !weight.is_contiguous()) {
      wk = Tensor::empty({K, N}, impl->kernel);
      onednn::convert(weight, wk, rounds);
    }
    // Emulated bf16: also the bf16 streaming copy for few rows (wk holds bf16 values already).
    if (rounds && !onednn::no_bf16_gemv_for_testing())
      impl->gemv = kernels::gemv_pack_bf16(static_cast<const float*>(wk.raw_data()), K, N);
    impl->packed = memory(impl->packed_md, onednn::engine());
    reorder_once(onednn::mem_of(wk), impl->packed);
    return Status::Ok();
  });
  if (!st.ok()) return st;
  Linear lin;
  lin.impl_ = std::move(impl);
  return lin;
}

namespace {

// The streaming GEMV (bf16 weights, few rows): x rounded to bf16 into scratch as f32; y and r
// used in place when f32 with unit stride along N, else through scratch (r also when it overlaps
// y without being y).
Status gemv_forward(const Linear::Impl& L, const Tensor& x, Tensor& y, const Tensor* residual) {
  using onednn::Slot;
  const int64_t M = x.dim(0), K = L.K, N = L.N;
  Tensor xs = onednn::scratch_tensor(Slot::a, {M, K}, DType::f32);
  onednn::convert(x, xs, /*round_bf16=*/true);
  const bool y_direct = y.dtype() == DType::f32 && (N == 1 || y.stride(1) == 1);
  Tensor dst = y_direct ? y : onednn::scratch_tensor(Slot::out, {M, N}, DType::f32);
  kernels::GemvArgs a;
  a.M = M;
  a.x = static_cast<const float*>(xs.raw_data());
  a.ldx = K;
  a.bias = L.bias_row.defined() ? static_cast<const float*>(L.bias_row.raw_data()) : nullptr;
  a.act = L.act;
  a.y = static_cast<float*>(dst.raw_data());
  a.ldy = dst.stride(0);
  if (residual) {
    Tensor r = *residual;
    const bool r_direct = r.dtype() == DType::f32 && (N == 1 || r.stride(1) == 1) &&
                          (onednn::same_view(r, dst) || !onednn::overlaps(r, dst));
    if (!r_direct) {
      r = onednn::scratch_tensor(Slot::b, {M, N}, DType::f32);
      onednn::convert(*residual, r);
    }
    a.res = static_cast<const float*>(r.raw_data());
    a.ldr = r.stride(0);
  }
  onednn::count_gemv_call();
  kernels::gemv_bf16(L.gemv, a);
  if (!y_direct) onednn::convert(dst, y);
  return Status::Ok();
}

}  // namespace

Status Linear::forward(const Tensor& x, Tensor& y, const Tensor* residual) const {
  static constexpr const char* op = "Linear::forward";
  if (!impl_)
    return Status::Invalid(std::string(op) + ": the layer is undefined (make it with Linear::create)");
  const Impl& L = *impl_;
  TSR_RETURN_IF_ERROR(detail::check_linear_shapes(op, x, L.weight, L.bias, residual, y));
  const int64_t M = x.dim(0), K = L.K, N = L.N;
  if (M == 0 || N == 0) return Status::Ok();
  if (K == 0) return ref::linear(x, L.weight, L.bias, L.act, residual, y);  // y = act(b) + r
  onednn::apply_threads();

  auto shapes = [&] {
    return "x " + x.describe() + ", weight " + L.weight.describe() + ", y " + y.describe() +
           (residual ? ", residual " + residual->describe() : std::string());
  };
  if (L.uses_gemv(M)) return onednn::guarded(op, shapes, [&] { return gemv_forward(L, x, y, residual); });
  return onednn::guarded(op, shapes, [&]() -> Status {
    using onednn::Slot;
    const bool emulate = L.compute == DType::bf16 && !L.native_bf16;
    // dst: y itself when it is f32 with unit stride along N; otherwise scratch copied back.
    const bool y_direct = y.dtype() == DType::f32 && (N == 1 || y.stride(1) == 1);
    Tensor dst = y_direct ? y : onednn::scratch_tensor(Slot::out, {M, N}, DType::f32);
    // src: x itself when the kernel can read it as it is; otherwise converted (and, for bf16,
    // rounded) into scratch. A src overlapping dst is copied too, so nothing reads what it wrote.
    const bool x_direct =
        x.dtype() == L.kernel && !emulate && (K == 1 || x.stride(1) == 1) && !onednn::overlaps(x, dst);
    Tensor src = x;
    if (!x_direct) {
      src = onednn::scratch_tensor(Slot::a, {M, K}, L.kernel);
      onednn::convert(x, src, emulate);
    }
    // residual: already in dst (y aliases it, no activation): a sum post-op; otherwise a binary
    // add reading r, or a copy of r when r is not f32 with unit stride or overlaps dst.
    Residual mode = Residual::none;
    Tensor res;
    if (residual) {
      if (onednn::same_view(*residual, dst) && L.act == Activation::none) {
        mode = Residual::sum;
      } else {
        mode = Residual::binary;
        const bool r_direct = residual->dtype() == DType::f32 && (N == 1 || residual->stride(1) == 1) &&
                              !onednn::overlaps(*residual, dst);
        res = *residual;
        if (!r_direct) {
          res = onednn::scratch_tensor(Slot::b, {M, N}, DType::f32);
          onednn::convert(*residual, res);
        }
      }
    }

    // The primitive for these views, decided once per key (the packed layout is in the key):
    //  - where oneDNN offers only its reference kernel for these strides (gemm's binary post-op
    //    wants dense dst and r), the operands that are not dense are copied dense instead;
    //  - weights `any` if the primitive then wants the packed layout, else plain (K, N).
    // The entry keeps the descriptors it was made with: mds = {src, dst, bias, residual}.
    static constexpr uint32_t kPlain = 1, kDenseSrc = 2, kDenseDst = 4, kDenseRes = 8, kPadded = 16;
    onednn::Key key("linear");
    key << src << dst << static_cast<int64_t>(L.bias_row.defined()) << static_cast<int64_t>(L.act)
        << static_cast<int64_t>(mode) << L.packed_key;
    if (mode == Residual::binary) key << res;
    const auto prim = onednn::cached(key, [&] {
      const memory::data_type kdt = onednn::dt_of(L.kernel);
      // The descriptors, with the operands named in `dense` taken as dense copies.
      auto descs = [&](uint32_t dense) {
        Shapes d;
        d.src = dense & kDenseSrc ? onednn::dense_md({M, K}, kdt) : onednn::md_of(src);
        d.dst = dense & kDenseDst ? onednn::dense_md({M, N}, memory::data_type::f32) : onednn::md_of(dst);
        if (L.bias_row.defined()) d.bias = onednn::md_of(L.bias_row);
        if (mode == Residual::binary)
          d.res = dense & kDenseRes ? onednn::dense_md({M, N}, memory::data_type::f32) : onednn::md_of(res);
        d.act = L.act;
        d.residual = mode;
        return d;
      };
      // Few rows of weights with rows 2 KiB-multiples apart: the padded copy, asked for as it is.
      const bool pad = L.pad_rows && M < kPadBelowRows;
      const memory::desc any = pad ? L.padded_md : memory::desc({K, N}, kdt, memory::format_tag::any);
      Shapes chosen = descs(0);
      dnnl::matmul::primitive_desc pd = linear_pd(chosen, any);
      uint32_t flags = 0;
      if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) {
        const uint32_t dense = (src.is_contiguous() ? 0 : kDenseSrc) | (dst.is_contiguous() ? 0 : kDenseDst) |
                               (res.defined() && !res.is_contiguous() ? kDenseRes : 0);
        if (dense) {
          const Shapes d = descs(dense);
          dnnl::matmul::primitive_desc pd_dense = linear_pd(d, any);
          if (std::string(pd_dense.impl_info_str()).rfind("ref", 0) != 0) {
            chosen = d;
            pd = pd_dense;
            flags = dense;
          }
        }
      }
      if (pad) {
        flags |= kPadded;
      } else if (pd.weights_desc() != L.packed_md) {
        pd = linear_pd(chosen, onednn::dense_md({K, N}, kdt));
        flags |= kPlain;
      }
      onednn::Prim p = onednn::make_prim<dnnl::matmul::primitive_desc, dnnl::matmul>(pd);
      p.flags = flags;
      p.mds = {chosen.src, chosen.dst, chosen.bias, chosen.res};
      return p;
    });
    const uint32_t flags = prim->flags;
    const bool plain = flags & kPlain;
    onednn::count_linear_call(!plain);
    if (flags & kDenseSrc) {  // src is x here (a converted src is dense already): same for dst, r
      src = onednn::scratch_tensor(Slot::a, {M, K}, L.kernel);
      onednn::convert(x, src);
    }
    bool copy_back = !y_direct;
    if (flags & kDenseDst) {
      dst = onednn::scratch_tensor(Slot::out, {M, N}, DType::f32);
      if (mode == Residual::sum) onednn::convert(y, dst);  // the sum post-op reads r there
      copy_back = true;
    }
    if (flags & kDenseRes) {
      const Tensor r = res;
      res = onednn::scratch_tensor(Slot::b, {M, N}, DType::f32);
      onednn::convert(r, res);
    }

    // mds = {src, dst, bias, residual}; the residual is the binary post-op's src1, and the
    // binary comes after the activation when there is one.
    onednn::Arg args[4] = {{DNNL_ARG_SRC, 0, src.raw_data()}, {DNNL_ARG_DST, 1, dst.raw_data()}};
    size_t n_args = 2;
    if (L.bias_row.defined()) args[n_args++] = {DNNL_ARG_BIAS, 2, L.bias_row.raw_data()};
    if (mode == Residual::binary)
      args[n_args++] = {DNNL_ARG_ATTR_MULTIPLE_POST_OP(L.act == Activation::none ? 0 : 1) | DNNL_ARG_SRC_1, 3,
                        res.raw_data()};
    const std::pair<int, memory> weights[] = {
        {DNNL_ARG_WEIGHTS, flags & kPadded ? L.padded_weights() : plain ? L.plain_weights() : L.packed}};
    onednn::execute(*prim, std::span<const onednn::Arg>(args, n_args), weights);
    if (copy_back) onednn::convert(dst, y);
    return Status::Ok();
  });
}

int64_t Linear::in_features() const { return impl_ ? impl_->K : 0; }
int64_t Linear::out_features() const { return impl_ ? impl_->N : 0; }
Activation Linear::activation() const { return impl_ ? impl_->act : Activation::none; }
DType Linear::compute_dtype() const { return impl_ ? impl_->compute : DType::f32; }
const Tensor& Linear::weight() const {
  static const Tensor kNone;
  return impl_ ? impl_->weight : kNone;
}
const Tensor& Linear::bias() const {
  static const Tensor kNone;
  return impl_ ? impl_->bias : kNone;
}
int64_t Linear::weight_row_stride(int64_t rows) const {
  if (!impl_ || impl_->K == 0 || impl_->N == 0) return 0;
  if (impl_->pad_rows && rows < kPadBelowRows) return impl_->N + kRowPad;
  return impl_->packed_md == onednn::dense_md({impl_->K, impl_->N}, onednn::dt_of(impl_->kernel)) ? impl_->N : 0;
}

std::string Linear::impl_name() const { return impl_ ? impl_->impl_name : std::string("undefined"); }
std::string Linear::impl_name(int64_t rows) const {
  if (impl_ && impl_->K > 0 && impl_->uses_gemv(rows)) return std::string("gemv_bf16:") + kernels::gemv_isa();
  return impl_name();
}
int64_t Linear::gemv_max_rows() { return kGemvRows; }

}  // namespace tessera
