// Model assembly and the forward pass: stem -> N blocks -> final norm -> head, each part in its
// own file (stem.cpp, block.cpp, head.cpp; layout.cpp resolves the batch's rows). Parameters come
// from weights.cpp; this file turns them into packed layers once and runs the parts in order.
#include <algorithm>
#include <cstring>

#include "arena.h"
#include "assembly.h"
#include "kv_cache.h"
#include "tessera/model.h"

namespace tessera {

// ---------------------------------------------------------------------------------------------
// Batch

Batch Batch::from_ids(const std::vector<int32_t>& ids) {
  Batch b;
  b.ids = Tensor::from_ids({1, static_cast<int64_t>(ids.size())}, ids);
  return b;
}

Batch Batch::from_rows(const Tensor& rows) {
  Batch b;
  b.rows = rows.to(DType::f32).reshape({1, rows.dim(0), rows.dim(1)});
  return b;
}

int64_t Batch::batch_size() const { return ids.defined() ? ids.dim(0) : rows.defined() ? rows.dim(0) : 0; }
int64_t Batch::seq_len() const { return ids.defined() ? ids.dim(1) : rows.defined() ? rows.dim(1) : 0; }

namespace model {

Tensor concat_last(const std::vector<Tensor>& parts) {
  int64_t n = 0;
  for (const auto& p : parts) n += p.dim(-1);
  const bool vec = parts[0].rank() == 1;
  // bf16 parts (mixed-precision training's weight copies) stay bf16; anything else becomes f32.
  const DType dt = parts[0].dtype() == DType::bf16 ? DType::bf16 : DType::f32;
  // Parts that are transpose views of row-major copies (lowp_weights) give one too: their rows
  // stacked, (n, K) row-major, seen as (K, n).
  const bool transposed = !vec && std::all_of(parts.begin(), parts.end(), [&](const Tensor& p) {
    return p.dtype() == dt && p.dim(0) > 1 && p.stride(0) == 1 && p.transpose(0, 1).is_contiguous();
  });
  if (transposed) {
    const int64_t K = parts[0].dim(0);
    Tensor rows = Tensor::empty({n, K}, dt);
    char* dst = static_cast<char*>(rows.raw_data());
    for (const auto& p : parts) {
      const size_t bytes = static_cast<size_t>(p.numel()) * dtype_size(dt);
      std::memcpy(dst, p.raw_data(), bytes);
      dst += bytes;
    }
    return rows.transpose(0, 1);
  }
  Tensor out = vec ? Tensor::empty({n}, dt) : Tensor::empty({parts[0].dim(0), n}, dt);
  const size_t es = dtype_size(dt);
  int64_t c0 = 0;
  for (const auto& p : parts) {
    const int64_t w = p.dim(-1);
    if (!vec && p.dtype() == dt && p.is_contiguous()) {
      // Row by row (the fused Q/K/V weights at load: Tensor::copy_from goes element by element).
      const int64_t R = p.dim(0);
      const char* src = static_cast<const char*>(p.raw_data());
      char* dst = static_cast<char*>(out.raw_data()) + static_cast<size_t>(c0) * es;
      for (int64_t r = 0; r < R; ++r)
        std::memcpy(dst + static_cast<size_t>(r * n) * es, src + static_cast<size_t>(r * w) * es,
                    static_cast<size_t>(w) * es);
    } else {
      out.slice(vec ? 0 : 1, c0, c0 + w).copy_from(p);
    }
    c0 += w;
  }
  return out;
}

}  // namespace model

namespace {

Status check_model_config(const ModelConfig& c) {
  auto bad = [](const std::string& m) { return Status::Invalid("model config: " + m); };
  if (c.d_model <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.d_k <= 0 || c.d_v <= 0 || c.d_ff < 0)
    return bad("d_model, n_layers, n_heads, d_k and d_v must be positive and d_ff >= 0 "
               "(load the config through load_experiment to resolve defaults)");
  if (!c.attention.output_projection && c.n_heads * c.d_v != c.d_model &&
      (c.n_layers != 1 || c.residual || c.norm != NormPlacement::none || c.d_ff != 0 ||
       c.head.kind != HeadKind::none || c.final_norm))
    return bad("without attention.output_projection the heads' concatenation (n_heads * d_v = " +
               std::to_string(c.n_heads * c.d_v) + ") must equal d_model (" + std::to_string(c.d_model) +
               "), unless the model is one bare attention layer (n_layers 1, residual false, norm none, "
               "d_ff 0, no head)");
  if (c.positions.kind == PositionKind::rotary &&
      (c.positions.rotary_dims <= 0 || c.positions.rotary_dims % 2 || c.positions.rotary_dims > c.d_k))
    return bad("positions.rotary_dims must be even and within (0, d_k]");
  if (c.head.kind == HeadKind::lm && c.stem.kind != StemKind::tokens)
    return bad("head.kind lm needs stem.kind tokens (its vocabulary)");
  return Status::Ok();
}

}  // namespace

Result<Model> Model::build(const ModelConfig& cfg) {
  TSR_RETURN_IF_ERROR(check_model_config(cfg));
  auto params = Parameters::resolve(cfg);
  if (!params.ok()) return params.status();
  return build(cfg, *params);
}

Result<Model> Model::build(const ModelConfig& cfg, const Parameters& params) {
  TSR_RETURN_IF_ERROR(check_model_config(cfg));
  TSR_RETURN_IF_ERROR(params.check(cfg));
  Model m;
  m.cfg_ = std::make_shared<const ModelConfig>(cfg);
  m.params_ = std::make_shared<const Parameters>(params);
  auto P = [&](const std::string& name) -> Tensor {
    const Tensor* t = m.parameter(name);
    return t ? *t : Tensor();
  };
  // f32 copies of small parameters (norms, biases, tables); matrices go to Linear, which packs.
  auto F = [&](const std::string& name) -> Tensor {
    Tensor t = P(name);
    return t.defined() ? t.to(DType::f32) : t;
  };
  auto layers = std::make_shared<Layers>();
  const DType dt = cfg.dtype;

  if (cfg.stem.kind == StemKind::tokens || cfg.stem.kind == StemKind::mixed) layers->embed = F("stem.embed");
  layers->type_embed = F("stem.type_embed");
  layers->stem_g = F("stem.norm.gamma");
  layers->stem_b = F("stem.norm.beta");
  layers->dist = F("stem.dist");
  if (cfg.stem.modalities > 0) layers->modality = F("stem.modality");
  if (cfg.stem.kind == StemKind::features || cfg.stem.kind == StemKind::mixed) {
    auto lin = Linear::create(P("stem.proj"), F("stem.proj_bias"), Activation::none, dt);
    if (!lin.ok()) return lin.status().with_prefix("stem.proj");
    layers->stem_proj = std::move(lin).value();
    layers->cls = F("stem.cls");
  }
  if (cfg.positions.kind == PositionKind::learned) layers->pos = F("pos.table");
  if (cfg.positions.kind == PositionKind::sinusoidal)
    layers->pos = model::sinusoidal_table(cfg.positions.max_len, cfg.d_model, cfg.positions.base);

  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    model::Block blk;
    auto& a = blk.attn;
    a.n_heads = cfg.n_heads;
    a.d_k = cfg.d_k;
    a.d_v = cfg.d_v;
    a.scale = static_cast<float>(cfg.attention.scale);
    a.causal = cfg.causal;
    a.positions = cfg.positions;
    const Tensor wqkv = model::concat_last({P(b + "attn.w_q"), P(b + "attn.w_k"), P(b + "attn.w_v")});
    const Tensor bqkv = cfg.bias ? model::concat_last({F(b + "attn.b_q"), F(b + "attn.b_k"), F(b + "attn.b_v")}) : Tensor();
    auto qkv = Linear::create(wqkv, bqkv, Activation::none, dt);
    if (!qkv.ok()) return qkv.status().with_prefix(b + "attn.qkv");
    a.qkv = std::move(qkv).value();
    if (cfg.attention.output_projection) {
      auto o = Linear::create(P(b + "attn.w_o"), F(b + "attn.b_o"), Activation::none, dt);
      if (!o.ok()) return o.status().with_prefix(b + "attn.w_o");
      a.out = std::move(o).value();
    }
    a.rel_k = F(b + "attn.rel_k");
    a.rel_v = F(b + "attn.rel_v");
    blk.ln1_g = F(b + "ln1.gamma");
    blk.ln1_b = F(b + "ln1.beta");
    blk.ln2_g = F(b + "ln2.gamma");
    blk.ln2_b = F(b + "ln2.beta");
    if (cfg.d_ff > 0) {
      auto f1 = Linear::create(P(b + "ffn.w1"), F(b + "ffn.b1"), cfg.activation, dt);
      if (!f1.ok()) return f1.status().with_prefix(b + "ffn.w1");
      auto f2 = Linear::create(P(b + "ffn.w2"), F(b + "ffn.b2"), Activation::none, dt);
      if (!f2.ok()) return f2.status().with_prefix(b + "ffn.w2");
      blk.ffn1 = std::move(f1).value();
      blk.ffn2 = std::move(f2).value();
    }
    layers->blocks.push_back(std::move(blk));
  }
  layers->final_g = F("final_norm.gamma");
  layers->final_b = F("final_norm.beta");
  if (P("head.pooler.w").defined()) {
    auto pl = Linear::create(P("head.pooler.w"), F("head.pooler.b"), Activation::none, dt);
    if (!pl.ok()) return pl.status().with_prefix("head.pooler");
    layers->pooler = std::move(pl).value();
  }
  layers->head_g = F("head.norm.gamma");
  layers->head_b = F("head.norm.beta");
  if (P("head.transform.w").defined()) {
    auto tr = Linear::create(P("head.transform.w"), F("head.transform.b"), cfg.activation, dt);
    if (!tr.ok()) return tr.status().with_prefix("head.transform");
    layers->transform = std::move(tr).value();
    layers->transform_g = F("head.transform.gamma");
    layers->transform_b = F("head.transform.beta");
  }
  if (cfg.head.kind == HeadKind::classifier || cfg.head.kind == HeadKind::lm) {
    Tensor w, bias;
    if (cfg.head.kind == HeadKind::classifier) {
      w = P("head.w");
      bias = F("head.b");
    } else if (cfg.head.tied) {
      w = P("stem.embed").transpose(0, 1);  // (C, V) view of the (V, C) table
      bias = F("head.lm_bias");             // undefined unless head.lm_bias
    } else {
      w = P("head.lm");
      bias = F("head.lm_bias");
    }
    auto h = Linear::create(w, bias, Activation::none, dt);
    if (!h.ok()) return h.status().with_prefix("head");
    layers->head = std::move(h).value();
  }
  m.layers_ = layers;
  return m;
}

const Tensor* Model::parameter(const std::string& name) const { return params_->find(name); }

int64_t Model::rows_for(int64_t input_rows) const {
  const StemKind k = cfg_->stem.kind;
  if ((k != StemKind::features && k != StemKind::mixed) || !cfg_->stem.cls) return input_rows;
  return input_rows + (cfg_->stem.dist ? 2 : 1);
}

Status Model::save(const std::string& path) const { return params_->save(path); }

// ---------------------------------------------------------------------------------------------
// Forward

Status Model::forward(const Batch& batch, const ForwardOptions& opt, Outputs* out) const {
  const ModelConfig& c = *cfg_;
  const Layers& L = *layers_;
  TSR_RETURN_IF_ERROR(model::check_batch(c, batch));
  const model::Exec ex{opt.reference};
  out->captured.clear();
  out->nonfinite.assign(opt.find_nonfinite ? static_cast<size_t>(batch.batch_size()) : 0, NonFinite{});
  model::FiniteWatch watch(&out->nonfinite);
  const model::Capture cap(opt.capture, &out->captured, &opt.capture_heads, opt.find_nonfinite ? &watch : nullptr);

  // Rows: with a CLS stem and no roles, one CLS row is prepended to every batch row.
  const int64_t extra = model::prepended_rows(c, batch);
  if (extra && (batch.segments.defined() || batch.positions.defined() || batch.kinds.defined()))
    return Status::Invalid("forward: packed or explicitly positioned rows must say where the CLS row is (give roles)");
  const int64_t B = batch.batch_size(), T = batch.seq_len() + extra, C = c.d_model;
  std::vector<int64_t> past;  // with a KV cache: rows each batch row's sequence had cached before
  std::vector<model::CacheView> kv;
  if (opt.cache) TSR_RETURN_IF_ERROR(model::CacheAccess::bind(*opt.cache, c, batch, extra, &past, &kv));
  model::RowLayout lay;
  TSR_RETURN_IF_ERROR(model::row_layout(c, batch, extra, past, &lay));

  // The pass's stream and scratch rows come from this thread's arena (arena.h); the last pass's
  // hidden rows are let go first so that their buffer can be reused, unless the caller holds them.
  using model::Arena;
  using model::ArenaSlot;
  out->hidden = Tensor();
  Tensor x = Arena::get(ArenaSlot::stream, {B, T, C});
  Tensor h = Arena::get(ArenaSlot::normed, {B, T, C});
  model::StemWeights sw{L.embed, L.type_embed, L.cls, L.dist, L.modality, L.pos, L.stem_g, L.stem_b, {}, {}, {}};
  sw.project = [&](const Tensor& in, Tensor& y) { return ex.linear(L.stem_proj, in, y); };
  TSR_RETURN_IF_ERROR(model::stem_forward(c, sw, ex, batch, lay, extra, x, h));
  cap.put("stem.out", x);
  for (size_t l = 0; l < L.blocks.size(); ++l)
    TSR_RETURN_IF_ERROR(model::block_forward(c, L.blocks[l], ex, lay, x, h, cap, "blocks." + std::to_string(l),
                                             kv.empty() ? nullptr : &kv[l]));
  if (c.final_norm) {
    TSR_RETURN_IF_ERROR(ex.layer_norm(x, L.final_g, L.final_b, static_cast<float>(c.norm_eps), h));
    std::swap(x, h);
    cap.put("final_norm.out", x);
  }
  out->hidden = x;
  out->pooled = out->logits = out->probs = Tensor();
  TSR_RETURN_IF_ERROR(model::head_forward(*this, L, ex, batch, lay, extra, x, opt, cap, out));
  if (opt.cache) model::CacheAccess::advance(*opt.cache, batch);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Plan

Plan make_plan(const ModelConfig& c, int64_t seq_len) {
  Plan p;
  const double T = static_cast<double>(seq_len + (c.stem.kind == StemKind::features && c.stem.cls ? (c.stem.dist ? 2 : 1) : 0));
  p.rows = static_cast<int64_t>(T);
  for (const auto& s : parameter_specs(c)) p.parameters += s.shape.numel();
  p.parameter_bytes = p.parameters * static_cast<int64_t>(dtype_size(c.dtype == DType::bf16 ? DType::bf16 : DType::f32));
  const double C = static_cast<double>(c.d_model), H = static_cast<double>(c.n_heads);
  const double dk = static_cast<double>(c.d_k), dv = static_cast<double>(c.d_v), Ff = static_cast<double>(c.d_ff);
  const double N = static_cast<double>(c.n_layers);
  auto part = [&](const char* name, double flops) {
    if (flops > 0) p.flops_by_part.emplace_back(name, flops);
    p.flops_per_item += flops;
  };
  if (c.stem.kind == StemKind::features) part("stem projection", 2 * (T - (p.rows - seq_len)) * c.stem.n_features * C);
  part("Q, K, V projections", N * 2 * T * C * H * (2 * dk + dv));
  part("attention scores (Q·Kᵀ)", N * 2 * H * T * T * dk);
  part("weighted values (A·V)", N * 2 * H * T * T * dv);
  if (c.positions.kind == PositionKind::relative) {
    const double R = 2.0 * static_cast<double>(c.positions.max_distance) + 1;
    part("relative positions", N * 2 * H * T * R * (dk + dv));
  }
  if (c.attention.output_projection) part("output projection (W_O)", N * 2 * T * H * dv * C);
  part("feed-forward", N * 2 * T * C * Ff * 2);
  if (c.head.kind == HeadKind::classifier) part("classifier", 2 * C * static_cast<double>(c.head.n_classes));
  if (c.head.kind == HeadKind::lm) part("LM head", 2 * T * C * static_cast<double>(c.stem.vocab_size));
  p.score_entries_per_head = p.rows * p.rows;
  // Live at once in one block (f32): x, h, qkv, scores, concat, and the FFN hidden rows.
  const double live = T * C * 2 + T * H * (2 * dk + dv) + H * T * T + T * H * dv + T * Ff;
  p.activation_bytes_per_item = static_cast<int64_t>(4 * live);
  return p;
}

}  // namespace tessera
