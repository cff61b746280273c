// One training step's arithmetic: the forward pass on plain f32 parameters keeping what each
// layer's backward needs, the loss, and the backward pass through the same parts in reverse order
// (head, final norm, blocks from last to first, stem). The layers' own forwards and backwards sit
// side by side in stem.cpp, block.cpp, attention.cpp and head.cpp. Dropout (GradOptions::dropout)
// acts here only: on the stem's output, and inside each block (block.cpp, attention.cpp).
#include <algorithm>
#include <cstring>
#include <utility>

#include "assembly.h"
#include "tessera/train.h"

namespace tessera {

Tensor next_token_targets(const Batch& batch) {
  const int64_t B = batch.ids.dim(0), T = batch.ids.dim(1);
  const Tensor ids = batch.ids.contiguous();
  const Tensor seg = batch.segments.defined() ? batch.segments.contiguous() : Tensor();
  auto sequence = [&](int64_t b, int64_t t) -> int32_t {
    if (seg.defined()) return seg.data<int32_t>()[b * T + t];
    return !batch.lengths.empty() && t >= batch.lengths[static_cast<size_t>(b)] ? -1 : 0;
  };
  Tensor out = Tensor::empty({B, T}, DType::i32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t s = sequence(b, t);
      const bool next = s >= 0 && t + 1 < T && sequence(b, t + 1) == s;
      out.data<int32_t>()[b * T + t] = next ? ids.data<int32_t>()[b * T + t + 1] : -1;
    }
  return out;
}

DropoutMask DropoutOptions::mask(DropoutSite site, int64_t layer) const {
  float p = 0.f;
  switch (site) {
    case DropoutSite::embedding: p = embedding; break;
    case DropoutSite::attention: p = attention; break;
    case DropoutSite::attention_out:
    case DropoutSite::ffn_out: p = residual; break;
  }
  if (!(p > 0.f)) return DropoutMask{};
  return DropoutMask{dropout_key(seed, step, micro_batch, static_cast<uint64_t>(layer), static_cast<uint64_t>(site)), p};
}

namespace {

Status check_f32(const Parameters& ps, const char* what) {
  for (const auto& [name, t] : ps)
    if (t.dtype() != DType::f32 || !t.is_contiguous())
      return Status::Invalid(std::string("training: ") + what + " \"" + name + "\" is " + t.describe() +
                             "; training needs contiguous f32 tensors (Parameters::clone makes them)");
  return Status::Ok();
}

// Whether `name` is the weight matrix of a matmul (the tied LM head reads stem.embed as one).
bool is_matmul_weight(const ModelConfig& c, const std::string& name) {
  static const char* const kSuffixes[] = {".attn.w_q", ".attn.w_k", ".attn.w_v", ".attn.w_o", ".ffn.w1", ".ffn.w2"};
  if (name.rfind("blocks.", 0) == 0) {
    for (const char* s : kSuffixes) {
      const size_t n = std::strlen(s);
      if (name.size() > n && name.compare(name.size() - n, n, s) == 0) return true;
    }
    return false;
  }
  if (name == "stem.embed") return c.head.kind == HeadKind::lm && c.head.tied;
  return name == "stem.proj" || name == "head.w" || name == "head.lm" || name == "head.pooler.w" ||
         name == "head.transform.w";
}

// A block's (K, N) weight with N >= K (W_Q, W_K, W_V, W_O, W_1) as bf16 stored (N, K), i.e. the
// transpose view of a row-major (N, K) copy. oneDNN's bf16 matmul (brgemm, AMX) reads a plain
// (K, N) weight at half speed when N is large (BERT-base's W_1, 768 x 3072: 9.4 ms against 4.1 for
// the same product reading it transposed); so stored, the forward reads it transposed and the
// backward's dx = dy · Wᵀ reads it plain with N = K, where plain is fast. W_2 (N < K) stays (K, N).
bool store_transposed(const std::string& name, const Tensor& t) {
  return name.rfind("blocks.", 0) == 0 && t.rank() == 2 && t.dim(1) >= t.dim(0) && t.dim(0) > 1;
}

// t (f32 or bf16, any strides) as a bf16 copy: (K, N) row-major, or with `transposed` the
// transpose view of an (N, K) row-major copy. Rounded to nearest even; parallel over rows.
Tensor bf16_copy(const Tensor& t, bool transposed) {
  const int64_t K = t.dim(0), N = t.dim(1);
  Tensor out = transposed ? Tensor::empty({N, K}, DType::bf16) : Tensor::empty({K, N}, DType::bf16);
  const Tensor src = t.dtype() == DType::f32 ? t : t.to(DType::f32);
  const float* s = src.data<float>();
  const int64_t s0 = src.stride(0), s1 = src.stride(1);
  bf16* d = out.data<bf16>();
  const int64_t rows = transposed ? N : K, cols = transposed ? K : N;
  const int64_t rs = transposed ? s1 : s0, cs = transposed ? s0 : s1;  // source steps along out's rows, columns
#pragma omp parallel for schedule(static) if (K * N >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) d[r * cols + c] = f32_to_bf16(s[r * rs + c * cs]);
  return transposed ? out.transpose(0, 1) : out;
}

}  // namespace

Parameters lowp_weights(const ModelConfig& cfg, const Parameters& P) {
  std::vector<Parameters::Entry> out;
  out.reserve(P.size());
  for (const auto& [name, t] : P) {
    if (!is_matmul_weight(cfg, name) || t.dtype() == DType::bf16)
      out.emplace_back(name, t);
    else
      out.emplace_back(name, t.rank() == 2 ? bf16_copy(t, store_transposed(name, t)) : t.to(DType::bf16));
  }
  return Parameters(std::move(out));
}

Result<LossValue> compute_gradients(const ModelConfig& c, const Parameters& P, const Batch& batch,
                                    const Targets& targets, Parameters* grads, const GradOptions& opt) {
  TSR_RETURN_IF_ERROR(P.check(c));
  TSR_RETURN_IF_ERROR(check_f32(P, "parameter"));
  if (!grads) return Status::Invalid("training: no gradients to add to");
  Parameters& G = *grads;
  for (const auto& [name, t] : P) {
    const Tensor* g = G.find(name);
    if (!g || g->shape() != t.shape())
      return Status::Invalid("training: the gradients lack \"" + name + "\" " + t.shape().str() +
                             " (make them with Parameters::zeros_like)");
  }
  TSR_RETURN_IF_ERROR(check_f32(G, "gradient"));
  for (const auto& [what, pd] : {std::pair<const char*, float>{"embedding", opt.dropout.embedding},
                                 {"attention", opt.dropout.attention}, {"residual", opt.dropout.residual}})
    if (!(pd >= 0.f && pd < 1.f))
      return Status::Invalid(std::string("training: ") + what + " dropout must be in [0, 1), got " + std::to_string(pd));
  TSR_RETURN_IF_ERROR(model::check_batch(c, batch));
  const int64_t extra = model::prepended_rows(c, batch);
  if (extra && (batch.segments.defined() || batch.positions.defined() || batch.kinds.defined()))
    return Status::Invalid("forward: packed or explicitly positioned rows must say where the CLS row is (give roles)");
  model::RowLayout lay;
  TSR_RETURN_IF_ERROR(model::row_layout(c, batch, extra, {}, &lay));
  if (opt.precision != DType::f32 && opt.precision != DType::bf16)
    return Status::Invalid(std::string("training: precision must be f32 or bf16, got ") + dtype_name(opt.precision));
  const bool bf16 = opt.precision == DType::bf16;
  const model::Exec ex{opt.reference, opt.precision};
  const int64_t B = batch.batch_size(), T = batch.seq_len() + extra, C = c.d_model;
  // The matmuls' weights: P's own in f32; in bf16 the step's rounded copies (made here if the
  // caller has none). Everything else (tables, norms, biases) is read from P.
  Parameters made;
  if (bf16 && !opt.lowp) made = lowp_weights(c, P);
  const Parameters& W = !bf16 ? P : opt.lowp ? *opt.lowp : made;
  if (bf16 && opt.lowp)
    for (const auto& [name, t] : P) {
      const Tensor* l = opt.lowp->find(name);
      if (!l || l->shape() != t.shape())
        return Status::Invalid("training: the bf16 weights lack \"" + name + "\" " + t.shape().str() +
                               " (make them with lowp_weights)");
    }

  // Forward, keeping what each part's backward needs.
  model::StemWeights sw{P.get("stem.embed"), P.get("stem.type_embed"), P.get("stem.cls"), P.get("stem.dist"),
                        P.get("stem.modality"), P.get("pos.table"), P.get("stem.norm.gamma"), P.get("stem.norm.beta"),
                        W.get("stem.proj"), P.get("stem.proj_bias"), {}};
  if (c.positions.kind == PositionKind::sinusoidal)
    sw.pos = model::sinusoidal_table(c.positions.max_len, C, c.positions.base);
  sw.project = [&](const Tensor& in, Tensor& y) { return ex.linear_plain(in, sw.proj_w, sw.proj_b, y); };
  Tensor x = Tensor::empty({B, T, C}), h = Tensor::empty({B, T, C});
  model::StemSaved stem;
  TSR_RETURN_IF_ERROR(model::stem_forward(c, sw, ex, batch, lay, extra, x, h, &stem));
  const DropoutMask embed_drop = opt.dropout.mask(DropoutSite::embedding, 0);
  if (embed_drop.active()) TSR_RETURN_IF_ERROR(ex.dropout(x, embed_drop, x));

  model::AttentionLayer meta;
  meta.n_heads = c.n_heads;
  meta.d_k = c.d_k;
  meta.d_v = c.d_v;
  meta.scale = static_cast<float>(c.attention.scale);
  meta.causal = c.causal;
  meta.positions = c.positions;
  std::vector<model::BlockParams> bp(static_cast<size_t>(c.n_layers));
  std::vector<model::BlockSaved> saved(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    model::BlockParams& w = bp[static_cast<size_t>(l)];
    w.attn.w_qkv = model::concat_last({W.get(p + "attn.w_q"), W.get(p + "attn.w_k"), W.get(p + "attn.w_v")});
    if (c.bias) w.attn.b_qkv = model::concat_last({P.get(p + "attn.b_q"), P.get(p + "attn.b_k"), P.get(p + "attn.b_v")});
    w.attn.w_o = W.get(p + "attn.w_o");
    w.attn.b_o = P.get(p + "attn.b_o");
    w.attn.rel_k = P.get(p + "attn.rel_k");
    w.attn.rel_v = P.get(p + "attn.rel_v");
    w.ln1_g = P.get(p + "ln1.gamma");
    w.ln1_b = P.get(p + "ln1.beta");
    w.ln2_g = P.get(p + "ln2.gamma");
    w.ln2_b = P.get(p + "ln2.beta");
    w.w1 = W.get(p + "ffn.w1");
    w.b1 = P.get(p + "ffn.b1");
    w.w2 = W.get(p + "ffn.w2");
    w.b2 = P.get(p + "ffn.b2");
    Tensor y;
    const model::BlockDropout bd{opt.dropout.mask(DropoutSite::attention, l),
                                 opt.dropout.mask(DropoutSite::attention_out, l),
                                 opt.dropout.mask(DropoutSite::ffn_out, l)};
    TSR_RETURN_IF_ERROR(model::block_forward_train(c, meta, w, ex, lay, x, y, &saved[static_cast<size_t>(l)], bd));
    x = y;
  }
  Tensor final_in, final_mean, final_rstd;
  if (c.final_norm) {
    final_in = x;
    final_mean = Tensor::empty({B * T});
    final_rstd = Tensor::empty({B * T});
    Tensor y = Tensor::empty(x.shape());
    TSR_RETURN_IF_ERROR(ex.layer_norm_train(x, P.get("final_norm.gamma"), P.get("final_norm.beta"),
                                            static_cast<float>(c.norm_eps), y, final_mean, final_rstd));
    x = y;
  }

  // The loss, and backward in reverse.
  LossValue result;
  result.outputs.hidden = x;
  model::HeadLoss hl;
  Tensor dx = Tensor::empty(x.shape());
  TSR_RETURN_IF_ERROR(model::head_train(c, W, ex, batch, lay, extra, x, targets, dx, G, &hl, &result.outputs));
  result.loss = hl.loss;
  result.counted = hl.counted;
  if (c.final_norm) {
    Tensor d = Tensor::empty(dx.shape());
    TSR_RETURN_IF_ERROR(ex.layer_norm_backward(final_in, P.get("final_norm.gamma"), final_mean, final_rstd, dx, &d,
                                               G.find("final_norm.gamma"), G.find("final_norm.beta")));
    dx = d;
  }
  if (opt.on_part_done) TSR_RETURN_IF_ERROR(opt.on_part_done(c.n_layers));
  const int64_t first_block = opt.backward_stem ? 0 : std::clamp<int64_t>(opt.backward_first_block, 0, c.n_layers);
  for (int64_t l = c.n_layers - 1; l >= first_block; --l) {
    Tensor d;
    TSR_RETURN_IF_ERROR(model::block_backward(c, meta, bp[static_cast<size_t>(l)], ex, saved[static_cast<size_t>(l)],
                                              lay, dx, d, G, "blocks." + std::to_string(l)));
    dx = d;
    saved[static_cast<size_t>(l)] = model::BlockSaved();  // its activations are no longer needed
    if (opt.on_part_done) TSR_RETURN_IF_ERROR(opt.on_part_done(l));
  }
  Tensor d_rows;
  if (!opt.backward_stem) return result;  // nothing below is trained
  if (embed_drop.active()) TSR_RETURN_IF_ERROR(ex.dropout(dx, embed_drop, dx));
  const bool want_rows = c.stem.kind != StemKind::tokens;
  TSR_RETURN_IF_ERROR(model::stem_backward(c, sw, ex, stem, lay, dx, G, want_rows ? &d_rows : nullptr,
                                           B * batch.seq_len()));
  if (want_rows && d_rows.defined()) {
    const int64_t F = d_rows.dim(1);
    result.d_rows = d_rows.reshape({B, batch.seq_len(), F});
  }
  if (opt.on_part_done) TSR_RETURN_IF_ERROR(opt.on_part_done(-1));
  return result;
}

}  // namespace tessera
