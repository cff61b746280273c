// Model assembly and the forward pass: stem -> positions -> N blocks -> final norm -> head.
// Parameters come from weights.cpp; this file turns them into packed layers once and runs them.
#include <cmath>
#include <cstring>
#include <limits>

#include "arena.h"
#include "kv_cache.h"
#include "layers.h"
#include "tessera/model.h"
#include "tessera/plugin.h"
#include "tessera/safetensors.h"
#include "weights.h"

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

// ---------------------------------------------------------------------------------------------
// Layers: what forward() runs, built once from the parameters.

namespace model {
struct Block {
  AttentionLayer attn;
  Tensor ln1_g, ln1_b, ln2_g, ln2_b;
  Linear ffn1, ffn2;  // ffn1 has the activation fused
};
}  // namespace model

struct Model::Layers {
  Tensor embed;      // (V, C)
  Tensor type_embed; // (token_types, C)
  Tensor stem_g, stem_b;  // stem.norm
  Tensor dist;       // (C)
  Linear stem_proj;  // (F, C)
  Tensor cls;        // (C)
  Tensor modality;   // (modalities, C)
  Tensor pos;        // (max_len, C): learned or sinusoidal
  std::vector<model::Block> blocks;
  Tensor final_g, final_b;
  Linear head;       // classifier (C, n_classes) or LM (C, V)
  Linear pooler;     // (C, C), tanh applied after
  Tensor head_g, head_b;  // head.norm
  Linear transform;  // (C, C) with the model's activation fused
  Tensor transform_g, transform_b;
};

namespace {

// Concatenates (rows, n_i) matrices (or (n_i) vectors) along their last axis.
Tensor concat_last(const std::vector<Tensor>& parts) {
  int64_t n = 0;
  for (const auto& p : parts) n += p.dim(-1);
  const bool vec = parts[0].rank() == 1;
  Tensor out = vec ? Tensor::empty({n}) : Tensor::empty({parts[0].dim(0), n});
  int64_t c0 = 0;
  for (const auto& p : parts) {
    const int64_t w = p.dim(-1);
    if (!vec && p.dtype() == DType::f32 && p.is_contiguous()) {
      // Row by row (the fused Q/K/V weights at load: Tensor::copy_from goes element by element).
      const int64_t R = p.dim(0);
      const float* src = p.data<float>();
      float* dst = out.data<float>() + c0;
      for (int64_t r = 0; r < R; ++r) std::memcpy(dst + r * n, src + r * w, static_cast<size_t>(w) * sizeof(float));
    } else {
      out.slice(vec ? 0 : 1, c0, c0 + w).copy_from(p);
    }
    c0 += w;
  }
  return out;
}

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
    const Tensor wqkv = concat_last({P(b + "attn.w_q"), P(b + "attn.w_k"), P(b + "attn.w_v")});
    const Tensor bqkv = cfg.bias ? concat_last({F(b + "attn.b_q"), F(b + "attn.b_k"), F(b + "attn.b_v")}) : Tensor();
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

namespace {

Status check_batch(const ModelConfig& c, const Batch& batch) {
  const StemKind k = c.stem.kind;
  const bool want_ids = k == StemKind::tokens || k == StemKind::mixed;
  const bool want_rows = k != StemKind::tokens;
  if (want_ids && (!batch.ids.defined() || batch.ids.rank() != 2 || batch.ids.dtype() != DType::i32))
    return Status::Invalid(std::string("forward: stem.kind ") + stem_kind_name(k) + " needs token ids (B, T) i32" +
                           (batch.rows.defined() && k == StemKind::tokens ? ", got feature rows" : ""));
  if (want_rows) {
    const int64_t F = k == StemKind::identity ? c.d_model : c.stem.n_features;
    if (!batch.rows.defined() || batch.rows.rank() != 3)
      return Status::Invalid(std::string("forward: stem.kind ") + stem_kind_name(k) + " needs rows (B, T, " +
                             std::to_string(F) + ")" + (batch.ids.defined() && k != StemKind::mixed ? ", got token ids" : ""));
    if (batch.rows.dim(2) != F)
      return Status::Invalid("forward: rows are " + std::to_string(batch.rows.dim(2)) + " wide but the model reads " +
                             std::to_string(F) + " (" + (k == StemKind::identity ? "d_model" : "stem.n_features") + ")");
  }
  const int64_t B = batch.batch_size(), T = batch.seq_len();
  if (B == 0 || T == 0)
    return Status::Invalid("forward: empty batch (B = " + std::to_string(B) + ", T = " + std::to_string(T) + ")");
  if (k == StemKind::mixed && ((batch.ids.dim(0) != B || batch.ids.dim(1) != T) ||
                               (batch.rows.dim(0) != B || batch.rows.dim(1) != T)))
    return Status::Invalid("forward: a mixed stem needs ids (B, T) and rows (B, T, F) of the same B and T");
  auto check_bt = [&](const Tensor& t, const char* name, DType dt) -> Status {
    if (!t.defined()) return Status::Ok();
    if (t.rank() != 2 || t.dim(0) != B || t.dim(1) != T || t.dtype() != dt)
      return Status::Invalid(std::string("forward: ") + name + " must be (" + std::to_string(B) + ", " +
                             std::to_string(T) + ") " + dtype_name(dt) + ", got " + t.describe());
    return Status::Ok();
  };
  TSR_RETURN_IF_ERROR(check_bt(batch.segments, "segments", DType::i32));
  TSR_RETURN_IF_ERROR(check_bt(batch.positions, "positions", DType::i32));
  TSR_RETURN_IF_ERROR(check_bt(batch.roles, "roles", DType::u8));
  TSR_RETURN_IF_ERROR(check_bt(batch.kinds, "kinds", DType::u8));
  TSR_RETURN_IF_ERROR(check_bt(batch.modality, "modality", DType::i32));
  TSR_RETURN_IF_ERROR(check_bt(batch.types, "types", DType::i32));
  if (batch.types.defined()) {
    if (c.stem.token_types <= 0) return Status::Invalid("forward: rows carry token types but the model has none");
    const Tensor ty = batch.types.contiguous();
    for (int64_t i = 0; i < B * T; ++i) {
      const int32_t v = ty.data<int32_t>()[i];
      if (v < 0 || v >= c.stem.token_types)
        return Status::OutOfRange("forward: row " + std::to_string(i % T) + " of item " + std::to_string(i / T) +
                                  " has token type " + std::to_string(v) + " outside [0, " +
                                  std::to_string(c.stem.token_types) + ")");
    }
  }
  if (k == StemKind::mixed && !batch.kinds.defined())
    return Status::Invalid("forward: a mixed stem needs kinds (B, T): 0 for a token row, 1 for a feature row");
  if (batch.modality.defined() != (c.stem.modalities > 0))
    return Status::Invalid(c.stem.modalities > 0
                               ? "forward: stem.modalities > 0 needs each row's modality (Batch::modality)"
                               : "forward: rows carry a modality but the model has no modality embedding "
                                 "(set stem.modalities)");
  if (batch.modality.defined())
    for (int64_t i = 0; i < B * T; ++i) {
      const int32_t m = batch.modality.contiguous().data<int32_t>()[i];
      if (m < 0 || m >= c.stem.modalities)
        return Status::OutOfRange("forward: row " + std::to_string(i % T) + " of item " + std::to_string(i / T) +
                                  " has modality " + std::to_string(m) + " outside [0, " +
                                  std::to_string(c.stem.modalities) + ")");
    }
  if (!batch.lengths.empty()) {
    if (batch.segments.defined()) return Status::Invalid("forward: give lengths or segments, not both");
    if (static_cast<int64_t>(batch.lengths.size()) != B)
      return Status::Invalid("forward: " + std::to_string(batch.lengths.size()) + " lengths for " +
                             std::to_string(B) + " items");
    for (int64_t b = 0; b < B; ++b)
      if (batch.lengths[b] < 0 || batch.lengths[b] > T)
        return Status::OutOfRange("forward: item " + std::to_string(b) + " has length " +
                                  std::to_string(batch.lengths[b]) + " outside [0, " + std::to_string(T) + "]");
  }
  return Status::Ok();
}

// Rows of one batch row that belong to sequence `s`, in order.
std::vector<int64_t> rows_of(const model::RowLayout& lay, int64_t b, int32_t s) {
  std::vector<int64_t> r;
  for (int64_t t = 0; t < lay.T; ++t)
    if (lay.seg[static_cast<size_t>(b * lay.T + t)] == s) r.push_back(t);
  return r;
}

}  // namespace

void pool_rows(const ModelConfig& c, const Tensor& h, const uint8_t* roles, float* d) {
  const int64_t n = h.dim(0), C = h.dim(1);
  const Tensor hc = h.contiguous();
  const float* x = hc.data<float>();
  std::fill(d, d + C, 0.f);
  if (n > 0) {
    switch (c.head.pool) {
      case PoolKind::cls: {
        int64_t row = 0;
        for (int64_t t = 0; roles && t < n; ++t)
          if (roles[t] == TSR_ROLE_CLS) {
            row = t;
            break;
          }
        std::copy(x + row * C, x + (row + 1) * C, d);
        break;
      }
      case PoolKind::last: std::copy(x + (n - 1) * C, x + n * C, d); break;
      case PoolKind::cls_dist: {  // the mean of the CLS and distillation rows (AST)
        int64_t first = 0;
        for (int64_t t = 0; roles && t < n; ++t)
          if (roles[t] == TSR_ROLE_CLS) {
            first = t;
            break;
          }
        const int64_t second = std::min(first + 1, n - 1);
        for (int64_t i = 0; i < C; ++i) d[i] = 0.5f * (x[first * C + i] + x[second * C + i]);
        break;
      }
      case PoolKind::mean:
        for (int64_t t = 0; t < n; ++t)
          for (int64_t i = 0; i < C; ++i) d[i] += x[t * C + i];
        for (int64_t i = 0; i < C; ++i) d[i] /= static_cast<float>(n);
        break;
    }
  }
}

Status Model::pool_head(Tensor& pooled, const ForwardOptions& opt) const {
  const ModelConfig& c = *cfg_;
  const int64_t N = pooled.dim(0), C = pooled.dim(1);
  if (layers_->pooler.defined()) {
    const model::Exec ex{opt.reference};
    Tensor y = Tensor::empty({N, C});
    TSR_RETURN_IF_ERROR(ex.linear(layers_->pooler, pooled, y));
    float* p = y.data<float>();
    for (int64_t i = 0; i < N * C; ++i) p[i] = std::tanh(p[i]);
    pooled.copy_from(y);
  }
  if (c.head.normalize) {
    for (int64_t r = 0; r < N; ++r) {
      float* d = pooled.data<float>() + r * C;
      double ss = 0;
      for (int64_t i = 0; i < C; ++i) ss += static_cast<double>(d[i]) * d[i];
      const float inv = ss > 0 ? static_cast<float>(1.0 / std::sqrt(ss)) : 0.f;
      for (int64_t i = 0; i < C; ++i) d[i] *= inv;
    }
  }
  return Status::Ok();
}

Status Model::forward(const Batch& batch, const ForwardOptions& opt, Outputs* out) const {
  const ModelConfig& c = *cfg_;
  const Layers& L = *layers_;
  TSR_RETURN_IF_ERROR(check_batch(c, batch));
  const model::Exec ex{opt.reference};
  const model::Capture cap(opt.capture, &out->captured, &opt.capture_heads);
  out->captured.clear();

  // Rows: with a CLS stem and no roles, one CLS row is prepended to every batch row.
  const bool has_cls_stem = c.stem.cls && (c.stem.kind == StemKind::features || c.stem.kind == StemKind::mixed);
  const int64_t extra = has_cls_stem && !batch.roles.defined() ? (c.stem.dist ? 2 : 1) : 0;
  if (extra && (batch.segments.defined() || batch.positions.defined() || batch.kinds.defined()))
    return Status::Invalid("forward: packed or explicitly positioned rows must say where the CLS row is (give roles)");
  const int64_t B = batch.batch_size(), T_in = batch.seq_len(), T = T_in + extra, C = c.d_model;
  std::vector<int64_t> past;  // with a KV cache: rows each batch row's sequence had cached before
  std::vector<model::CacheView> kv;
  if (opt.cache) TSR_RETURN_IF_ERROR(model::CacheAccess::bind(*opt.cache, c, batch, extra, &past, &kv));

  // Who attends to whom, and each row's position.
  model::RowLayout lay;
  lay.B = B;
  lay.T = T;
  lay.seg.assign(static_cast<size_t>(B * T), 0);
  lay.pos.assign(static_cast<size_t>(B * T), 0);
  const Tensor seg_in = batch.segments.defined() ? batch.segments.contiguous() : Tensor();
  const Tensor pos_in = batch.positions.defined() ? batch.positions.contiguous() : Tensor();
  for (int64_t b = 0; b < B; ++b) {
    int32_t prev = -2, run = 0;
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b * T + t);
      int32_t s = 0;
      if (seg_in.defined()) s = seg_in.data<int32_t>()[i];
      else if (!batch.lengths.empty() && t >= batch.lengths[static_cast<size_t>(b)] + extra) s = -1;
      lay.seg[i] = s < 0 ? -1 : s;
      run = s == prev ? run + 1 : 0;
      prev = s;
      lay.pos[i] = pos_in.defined() ? pos_in.data<int32_t>()[i] : (s < 0 ? static_cast<int32_t>(t) : run);
      if (!past.empty() && s >= 0) lay.pos[i] += static_cast<int32_t>(past[static_cast<size_t>(b)]);
      if (lay.seg[i] != 0 || lay.pos[i] != t) lay.plain = false;
    }
  }
  if (c.positions.kind == PositionKind::learned || c.positions.kind == PositionKind::sinusoidal) {
    int32_t max_pos = 0;
    for (int32_t p : lay.pos) max_pos = std::max(max_pos, p);
    if (max_pos >= c.positions.max_len)
      return Status::OutOfRange("forward: " + std::to_string(max_pos + 1) + " rows exceed positions.max_len = " +
                                std::to_string(c.positions.max_len) + " (shorten the input or raise max_len)");
  }
  for (int32_t p : lay.pos)
    if (p < 0) return Status::OutOfRange("forward: a negative position id (" + std::to_string(p) + ")");

  // Stem: token ids and/or feature rows -> (B, T, C). The pass's intermediates come from this
  // thread's arena (arena.h); the last pass's hidden rows are let go first so that their buffer
  // can be reused, unless the caller still holds them.
  using model::Arena;
  using model::ArenaSlot;
  out->hidden = Tensor();
  Tensor x = Arena::get(ArenaSlot::stream, {B, T, C});
  std::memset(x.raw_data(), 0, x.nbytes());
  const Tensor kinds = batch.kinds.defined() ? batch.kinds.contiguous() : Tensor();
  const Tensor roles = batch.roles.defined() ? batch.roles.contiguous() : Tensor();
  auto is_feature_row = [&](int64_t i) {  // i = b·T_in + t over the input rows
    return c.stem.kind == StemKind::mixed ? kinds.data<uint8_t>()[i] != 0 : c.stem.kind != StemKind::tokens;
  };
  // Input row i goes to x row b·T + t + extra.
  auto out_row = [&](int64_t i) { return (i / T_in) * T + i % T_in + extra; };
  float* xp = x.data<float>();
  if (c.stem.kind == StemKind::tokens || c.stem.kind == StemKind::mixed) {
    Tensor ids = batch.ids.contiguous();
    if (c.stem.kind == StemKind::mixed) {  // feature rows carry any id: look up id 0 there
      ids = ids.clone();
      for (int64_t i = 0; i < B * T_in; ++i)
        if (is_feature_row(i)) ids.data<int32_t>()[i] = 0;
    }
    Tensor emb = Arena::get(ArenaSlot::embed, {B * T_in, C});
    TSR_RETURN_IF_ERROR(ex.embedding(L.embed, ids.reshape({B * T_in}), emb));
    const float scale = c.stem.scale == EmbedScale::sqrt_d_model ? std::sqrt(static_cast<float>(C)) : 1.f;
    const Tensor types = batch.types.defined() ? batch.types.contiguous() : Tensor();
    for (int64_t i = 0; i < B * T_in; ++i) {
      if (is_feature_row(i)) continue;
      const float* e = emb.data<float>() + i * C;
      float* dst = xp + out_row(i) * C;
      for (int64_t k = 0; k < C; ++k) dst[k] = e[k] * scale;
      if (L.type_embed.defined()) {
        const float* te = L.type_embed.data<float>() + (types.defined() ? types.data<int32_t>()[i] : 0) * C;
        for (int64_t k = 0; k < C; ++k) dst[k] += te[k];
      }
    }
    if (c.stem.token_dropout) {
      // ESM-2 was trained with 15 % of tokens selected and 80 % of those masked; at inference the
      // mask rows are zeroed and each sequence's rows rescaled by the share it actually masks.
      const Tensor idc = batch.ids.contiguous();
      for (int64_t b = 0; b < B; ++b) {
        std::map<int32_t, std::pair<int64_t, int64_t>> counts;  // sequence -> (masked, rows)
        for (int64_t t = 0; t < T_in; ++t) {
          const int32_t sq = lay.seg[static_cast<size_t>(b * T + t + extra)];
          if (sq < 0 || is_feature_row(b * T_in + t)) continue;
          auto& n = counts[sq];
          n.first += idc.data<int32_t>()[b * T_in + t] == c.stem.mask_id;
          ++n.second;
        }
        for (int64_t t = 0; t < T_in; ++t) {
          const int32_t sq = lay.seg[static_cast<size_t>(b * T + t + extra)];
          if (sq < 0 || is_feature_row(b * T_in + t)) continue;
          const auto& n = counts[sq];
          const bool masked = idc.data<int32_t>()[b * T_in + t] == c.stem.mask_id;
          const float f = masked ? 0.f
                                 : static_cast<float>((1.0 - 0.15 * 0.8) /
                                                      (1.0 - static_cast<double>(n.first) / static_cast<double>(n.second)));
          float* dst = xp + out_row(b * T_in + t) * C;
          for (int64_t k = 0; k < C; ++k) dst[k] *= f;
        }
      }
    }
  }
  if (c.stem.kind == StemKind::features || c.stem.kind == StemKind::mixed) {
    const int64_t F = c.stem.n_features;
    std::vector<int64_t> which;  // input rows that are feature rows
    for (int64_t i = 0; i < B * T_in; ++i)
      if (is_feature_row(i)) which.push_back(i);
    if (!which.empty()) {
      const Tensor rows = batch.rows.contiguous();
      Tensor in = Tensor::empty({static_cast<int64_t>(which.size()), F});
      for (size_t r = 0; r < which.size(); ++r)
        std::copy(rows.data<float>() + which[r] * F, rows.data<float>() + (which[r] + 1) * F, in.data<float>() + r * F);
      Tensor proj = Tensor::empty({static_cast<int64_t>(which.size()), C});
      TSR_RETURN_IF_ERROR(ex.linear(L.stem_proj, in, proj));
      for (size_t r = 0; r < which.size(); ++r) {
        float* dst = xp + out_row(which[r]) * C;
        const int64_t i = which[r];
        const uint8_t* rl = roles.defined() ? roles.data<uint8_t>() : nullptr;
        const bool cls_row = has_cls_stem && rl && rl[i] == TSR_ROLE_CLS;
        // With a distillation row, a CLS-role row right after another one is the distillation row.
        const bool dist_row = cls_row && c.stem.dist && i % T_in > 0 && rl[i - 1] == TSR_ROLE_CLS;
        const float* src = dist_row  ? L.dist.data<float>()
                           : cls_row ? L.cls.data<float>()
                                     : proj.data<float>() + static_cast<int64_t>(r) * C;
        std::copy(src, src + C, dst);
      }
    }
    for (int64_t b = 0; b < B && extra; ++b) {
      std::copy(L.cls.data<float>(), L.cls.data<float>() + C, xp + b * T * C);
      if (extra == 2) std::copy(L.dist.data<float>(), L.dist.data<float>() + C, xp + (b * T + 1) * C);
    }
  }
  if (c.stem.kind == StemKind::identity) x.copy_from(batch.rows);
  if (c.stem.modalities > 0) {
    const Tensor mod = batch.modality.contiguous();
    for (int64_t i = 0; i < B * T_in; ++i) {
      const float* e = L.modality.data<float>() + static_cast<int64_t>(mod.data<int32_t>()[i]) * C;
      float* dst = xp + out_row(i) * C;
      for (int64_t k = 0; k < C; ++k) dst[k] += e[k];
    }
  }
  if (L.pos.defined()) {  // learned or sinusoidal: x[b, t] += table[position of (b, t)]
    const float* tab = L.pos.data<float>();
    for (int64_t i = 0; i < B * T; ++i) {
      const float* e = tab + static_cast<int64_t>(lay.pos[static_cast<size_t>(i)]) * C;
      for (int64_t k = 0; k < C; ++k) xp[i * C + k] += e[k];
    }
  }
  Tensor h = Arena::get(ArenaSlot::normed, {B, T, C});  // normed rows / scratch
  if (c.stem.norm) {
    TSR_RETURN_IF_ERROR(ex.layer_norm(x, L.stem_g, L.stem_b, static_cast<float>(c.norm_eps), h));
    std::swap(x, h);
  }
  cap.put("stem.out", x);

  for (size_t l = 0; l < L.blocks.size(); ++l) {
    const model::Block& blk = L.blocks[l];
    const std::string p = "blocks." + std::to_string(l);
    const model::CacheView* cv = kv.empty() ? nullptr : &kv[l];
    cap.put(p + ".in", x);
    const float eps = static_cast<float>(c.norm_eps);
    const int64_t F = c.d_ff;
    auto ffn = [&](const Tensor& in, Tensor& y, const Tensor* residual) -> Status {
      Tensor hidden = Arena::get(ArenaSlot::hidden, {B * T, F});
      TSR_RETURN_IF_ERROR(ex.linear(blk.ffn1, in.reshape({B * T, C}), hidden));
      cap.put(p + ".ffn.hidden", hidden.reshape({B, T, F}));
      Tensor y2 = y.reshape({B * T, C});
      if (residual) {
        const Tensor r2 = residual->reshape({B * T, C});
        TSR_RETURN_IF_ERROR(ex.linear(blk.ffn2, hidden, y2, &r2));
      } else {
        TSR_RETURN_IF_ERROR(ex.linear(blk.ffn2, hidden, y2));
      }
      cap.put(p + ".ffn.out", y);
      return Status::Ok();
    };

    if (c.norm == NormPlacement::pre) {
      // R = X + MultiHead(LN1(X));  Y = R + FFN(LN2(R))
      TSR_RETURN_IF_ERROR(ex.layer_norm(x, blk.ln1_g, blk.ln1_b, eps, h));
      cap.put(p + ".ln1", h);
      cap.put(p + ".attn.in", h);
      TSR_RETURN_IF_ERROR(model::attention_forward(blk.attn, ex, h, lay, &x, x, cap, p + ".attn", cv));
      cap.put(p + ".attn.residual", x);
      if (F > 0) {
        TSR_RETURN_IF_ERROR(ex.layer_norm(x, blk.ln2_g, blk.ln2_b, eps, h));
        cap.put(p + ".ln2", h);
        TSR_RETURN_IF_ERROR(ffn(h, x, &x));
      }
    } else {
      // post-LN: R = LN1(X + MultiHead(X));  Y = LN2(R + FFN(R))   (norm none: no LN)
      cap.put(p + ".attn.in", x);
      const int64_t width = blk.attn.out.defined() ? C : c.n_heads * c.d_v;
      Tensor u = width == C ? h : Arena::get(ArenaSlot::wide, {B, T, width});
      TSR_RETURN_IF_ERROR(
          model::attention_forward(blk.attn, ex, x, lay, c.residual ? &x : nullptr, u, cap, p + ".attn", cv));
      cap.put(p + ".attn.residual", u);
      if (c.norm == NormPlacement::post) {
        TSR_RETURN_IF_ERROR(ex.layer_norm(u, blk.ln1_g, blk.ln1_b, eps, x));
        cap.put(p + ".ln1", x);
      } else if (width == C) {
        x.copy_from(u);
      } else {
        x = u;  // a bare attention layer whose output is the concatenated heads
      }
      if (F > 0) {
        TSR_RETURN_IF_ERROR(ffn(x, h, c.residual ? &x : nullptr));
        if (c.norm == NormPlacement::post) {
          TSR_RETURN_IF_ERROR(ex.layer_norm(h, blk.ln2_g, blk.ln2_b, eps, x));
          cap.put(p + ".ln2", x);
        } else {
          x.copy_from(h);
        }
      }
    }
    cap.put(p + ".out", x);
  }
  if (c.final_norm) {
    TSR_RETURN_IF_ERROR(ex.layer_norm(x, L.final_g, L.final_b, static_cast<float>(c.norm_eps), h));
    std::swap(x, h);
    cap.put("final_norm.out", x);
  }
  out->hidden = x;
  out->pooled = out->logits = out->probs = Tensor();

  // Heads work per batch row on its sequence 0; packed batches pool per sequence in the caller.
  const bool packed = batch.segments.defined();
  if ((c.head.kind == HeadKind::pool || c.head.kind == HeadKind::classifier) && !packed) {
    Tensor pooled = Tensor::zeros({B, x.dim(2)});
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int64_t> r = rows_of(lay, b, 0);
      const int64_t first = r.empty() ? 0 : r.front();
      const Tensor hb = x.select(0, b).slice(0, first, first + static_cast<int64_t>(r.size()));
      const uint8_t* rl = roles.defined() ? roles.data<uint8_t>() + b * T_in + first - extra : nullptr;
      pool_rows(c, hb, extra ? nullptr : rl, pooled.data<float>() + b * x.dim(2));
    }
    TSR_RETURN_IF_ERROR(pool_head(pooled, opt));
    cap.put("head.pooled", pooled);
    out->pooled = pooled;
    if (c.head.kind == HeadKind::classifier) TSR_RETURN_IF_ERROR(classify(pooled, &out->logits, &out->probs, opt));
  }
  // The LM head on rows (N, C): dense + activation + layer norm first where the model has that
  // transform (BERT MLM, ESM-2), then the vocabulary projection -> (N, V).
  auto lm_logits = [&](const Tensor& rows, Tensor& logits) -> Status {
    if (!L.transform.defined()) return ex.linear(L.head, rows, logits);
    const int64_t N = rows.dim(0);
    Tensor t1 = Arena::get(ArenaSlot::head_a, {1, N, C}), t2 = Arena::get(ArenaSlot::head_b, {1, N, C});
    Tensor t1v = t1.reshape({N, C});
    TSR_RETURN_IF_ERROR(ex.linear(L.transform, rows, t1v));
    TSR_RETURN_IF_ERROR(ex.layer_norm(t1, L.transform_g, L.transform_b, static_cast<float>(c.norm_eps), t2));
    return ex.linear(L.head, t2.reshape({N, C}), logits);
  };
  if (c.head.kind == HeadKind::lm && opt.last_logits) {
    // Generation: only each item's last valid row goes through the head, (B, C) -> (B, V).
    if (packed) return Status::Invalid("forward: last_logits needs one sequence per batch row (no segments)");
    const int64_t V = c.stem.vocab_size;
    Tensor last = Tensor::empty({B, C});
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int64_t> r = rows_of(lay, b, 0);
      last.select(0, b).copy_from(x.select(0, b).select(0, r.empty() ? 0 : r.back()));
    }
    out->logits = Tensor::empty({B, V});
    TSR_RETURN_IF_ERROR(lm_logits(last, out->logits));
    out->probs = Tensor::empty({B, V});
    TSR_RETURN_IF_ERROR(ex.softmax(out->logits, out->probs));
  } else if (c.head.kind == HeadKind::lm) {
    const int64_t V = c.stem.vocab_size;
    Tensor logits = Tensor::empty({B, T, V});
    Tensor l2 = logits.reshape({B * T, V});
    TSR_RETURN_IF_ERROR(lm_logits(x.reshape({B * T, C}), l2));
    out->logits = logits;
    if (!packed) {  // next-token distribution after each item's last valid row
      Tensor last = Tensor::empty({B, V});
      for (int64_t b = 0; b < B; ++b) {
        const std::vector<int64_t> r = rows_of(lay, b, 0);
        last.select(0, b).copy_from(logits.select(0, b).select(0, r.empty() ? 0 : r.back()));
      }
      Tensor probs = Tensor::empty({B, V});
      TSR_RETURN_IF_ERROR(ex.softmax(last, probs));
      out->probs = probs;
    }
  }
  if (out->logits.defined()) cap.put("head.logits", out->logits);
  if (out->probs.defined()) cap.put("head.probs", out->probs);
  if (opt.cache) model::CacheAccess::advance(*opt.cache, batch);
  return Status::Ok();
}

Status Model::classify(const Tensor& pooled, Tensor* logits, Tensor* probs, const ForwardOptions& opt) const {
  const ModelConfig& c = *cfg_;
  if (c.head.kind != HeadKind::classifier) return Status::Invalid("classify: the model has no classifier head");
  const model::Exec ex{opt.reference};
  const int64_t N = pooled.dim(0);
  *logits = Tensor::empty({N, c.head.n_classes});
  if (layers_->head_g.defined()) {  // AST's MLP head: layer norm, then the classifier
    Tensor normed = Tensor::empty({N, pooled.dim(1)});
    TSR_RETURN_IF_ERROR(ex.layer_norm(pooled, layers_->head_g, layers_->head_b, static_cast<float>(c.norm_eps), normed));
    TSR_RETURN_IF_ERROR(ex.linear(layers_->head, normed, *logits));
  } else {
    TSR_RETURN_IF_ERROR(ex.linear(layers_->head, pooled, *logits));
  }
  *probs = Tensor::empty({N, c.head.n_classes});
  return ex.softmax(*logits, *probs);
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
