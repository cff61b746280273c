// Model assembly and the forward pass: stem -> positions -> N blocks -> final norm -> head.
// Parameters come from weights.cpp; this file turns them into packed layers once and runs them.
#include <cmath>
#include <limits>

#include "layers.h"
#include "tessera/model.h"
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
  Linear stem_proj;  // (F, C)
  Tensor cls;        // (C)
  Tensor pos;        // (max_len, C): learned or sinusoidal
  std::vector<model::Block> blocks;
  Tensor final_g, final_b;
  Linear head;       // classifier (C, n_classes) or LM (C, V)
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
    out.slice(vec ? 0 : 1, c0, c0 + p.dim(-1)).copy_from(p);
    c0 += p.dim(-1);
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
  auto params_r = model::resolve_parameters(cfg);
  if (!params_r.ok()) return params_r.status();
  Model m;
  m.cfg_ = std::make_shared<const ModelConfig>(cfg);
  auto params = std::make_shared<std::vector<std::pair<std::string, Tensor>>>(std::move(params_r).value());
  m.params_ = params;
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

  if (cfg.stem.kind == StemKind::tokens) layers->embed = F("stem.embed");
  if (cfg.stem.kind == StemKind::features) {
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
  if (cfg.head.kind == HeadKind::classifier || cfg.head.kind == HeadKind::lm) {
    Tensor w, bias;
    if (cfg.head.kind == HeadKind::classifier) {
      w = P("head.w");
      bias = F("head.b");
    } else if (cfg.head.tied) {
      w = P("stem.embed").transpose(0, 1);  // (C, V) view of the (V, C) table
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

const Tensor* Model::parameter(const std::string& name) const {
  for (const auto& [n, t] : *params_)
    if (n == name) return &t;
  return nullptr;
}

int64_t Model::rows_for(int64_t input_rows) const {
  return input_rows + (cfg_->stem.kind == StemKind::features && cfg_->stem.cls ? 1 : 0);
}

Status Model::save(const std::string& path) const { return safetensors::write(path, *params_); }

// ---------------------------------------------------------------------------------------------
// Forward

namespace {

Status check_batch(const ModelConfig& c, const Batch& batch) {
  const bool want_ids = c.stem.kind == StemKind::tokens;
  if (want_ids && (!batch.ids.defined() || batch.ids.rank() != 2 || batch.ids.dtype() != DType::i32))
    return Status::Invalid("forward: stem.kind tokens needs token ids (B, T) i32" +
                           std::string(batch.rows.defined() ? ", got feature rows" : ""));
  if (!want_ids) {
    const int64_t F = c.stem.kind == StemKind::features ? c.stem.n_features : c.d_model;
    if (!batch.rows.defined() || batch.rows.rank() != 3)
      return Status::Invalid(std::string("forward: stem.kind ") + stem_kind_name(c.stem.kind) +
                             " needs rows (B, T, " + std::to_string(F) + ")" +
                             (batch.ids.defined() ? ", got token ids" : ""));
    if (batch.rows.dim(2) != F)
      return Status::Invalid("forward: rows are " + std::to_string(batch.rows.dim(2)) +
                             " wide but the model reads " + std::to_string(F) + " (" +
                             (c.stem.kind == StemKind::features ? "stem.n_features" : "d_model") + ")");
  }
  const int64_t B = batch.batch_size(), T = batch.seq_len();
  if (B == 0 || T == 0) return Status::Invalid("forward: empty batch (B = " + std::to_string(B) +
                                               ", T = " + std::to_string(T) + ")");
  if (!batch.lengths.empty()) {
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

}  // namespace

Status Model::forward(const Batch& batch, const ForwardOptions& opt, Outputs* out) const {
  const ModelConfig& c = *cfg_;
  const Layers& L = *layers_;
  TSR_RETURN_IF_ERROR(check_batch(c, batch));
  const model::Exec ex{opt.reference};
  const model::Capture cap(opt.capture, &out->captured);
  out->captured.clear();

  const int64_t B = batch.batch_size(), T_in = batch.seq_len(), T = rows_for(T_in), C = c.d_model;
  const int64_t extra = T - T_in;  // 1 with a CLS row
  std::vector<int64_t> lengths;
  if (!batch.lengths.empty())
    for (int64_t len : batch.lengths) lengths.push_back(len + extra);
  if ((c.positions.kind == PositionKind::learned || c.positions.kind == PositionKind::sinusoidal) &&
      T > c.positions.max_len)
    return Status::OutOfRange("forward: " + std::to_string(T) + " rows exceed positions.max_len = " +
                              std::to_string(c.positions.max_len) + " (shorten the input or raise max_len)");

  // Stem: token ids or feature rows -> (B, T, C).
  Tensor x = Tensor::empty({B, T, C});
  switch (c.stem.kind) {
    case StemKind::tokens: {
      TSR_RETURN_IF_ERROR(ex.embedding(L.embed, batch.ids, x));
      if (c.stem.scale == EmbedScale::sqrt_d_model) {
        const float s = std::sqrt(static_cast<float>(C));
        float* p = x.data<float>();
        for (int64_t i = 0; i < x.numel(); ++i) p[i] *= s;
      }
      break;
    }
    case StemKind::features: {
      Tensor proj = Tensor::empty({B * T_in, C});
      TSR_RETURN_IF_ERROR(ex.linear(L.stem_proj, batch.rows.reshape({B * T_in, c.stem.n_features}), proj));
      x.slice(1, extra, T).copy_from(proj.reshape({B, T_in, C}));
      for (int64_t b = 0; b < B && extra; ++b) x.select(0, b).select(0, 0).copy_from(L.cls);
      break;
    }
    case StemKind::identity: x.copy_from(batch.rows); break;
  }
  if (L.pos.defined()) TSR_RETURN_IF_ERROR(ex.add(x, L.pos.slice(0, 0, T), x));
  cap.put("stem.out", x);

  Tensor h = Tensor::empty({B, T, C});  // normed rows / scratch
  for (size_t l = 0; l < L.blocks.size(); ++l) {
    const model::Block& blk = L.blocks[l];
    const std::string p = "blocks." + std::to_string(l);
    cap.put(p + ".in", x);
    const float eps = static_cast<float>(c.norm_eps);
    const int64_t F = c.d_ff;
    auto ffn = [&](const Tensor& in, Tensor& y, const Tensor* residual) -> Status {
      Tensor hidden = Tensor::empty({B * T, F});
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
      TSR_RETURN_IF_ERROR(model::attention_forward(blk.attn, ex, h, lengths, &x, x, cap, p + ".attn"));
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
      Tensor u = width == C ? h : Tensor::empty({B, T, width});
      TSR_RETURN_IF_ERROR(model::attention_forward(blk.attn, ex, x, lengths, c.residual ? &x : nullptr,
                                                   u, cap, p + ".attn"));
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

  auto len_of = [&](int64_t b) { return lengths.empty() ? T : lengths[b]; };
  if (c.head.kind == HeadKind::pool || c.head.kind == HeadKind::classifier) {
    Tensor pooled = Tensor::zeros({B, C});
    for (int64_t b = 0; b < B; ++b) {
      Tensor dst = pooled.select(0, b);
      const int64_t n = len_of(b);
      switch (c.head.pool) {
        case PoolKind::cls: dst.copy_from(x.select(0, b).select(0, 0)); break;
        case PoolKind::last:
          if (n > 0) dst.copy_from(x.select(0, b).select(0, n - 1));
          break;
        case PoolKind::mean: {
          float* d = dst.data<float>();
          for (int64_t t = 0; t < n; ++t) {
            const float* row = x.data<float>() + (b * T + t) * C;
            for (int64_t i = 0; i < C; ++i) d[i] += row[i];
          }
          for (int64_t i = 0; i < C && n > 0; ++i) d[i] /= static_cast<float>(n);
          break;
        }
      }
      if (c.head.normalize) {
        float* d = dst.data<float>();
        double ss = 0;
        for (int64_t i = 0; i < C; ++i) ss += static_cast<double>(d[i]) * d[i];
        const float inv = ss > 0 ? static_cast<float>(1.0 / std::sqrt(ss)) : 0.f;
        for (int64_t i = 0; i < C; ++i) d[i] *= inv;
      }
    }
    cap.put("head.pooled", pooled);
    out->pooled = pooled;
    if (c.head.kind == HeadKind::classifier) {
      Tensor logits = Tensor::empty({B, c.head.n_classes});
      TSR_RETURN_IF_ERROR(ex.linear(L.head, pooled, logits));
      Tensor probs = Tensor::empty({B, c.head.n_classes});
      TSR_RETURN_IF_ERROR(ex.softmax(logits, probs));
      out->logits = logits;
      out->probs = probs;
    }
  } else if (c.head.kind == HeadKind::lm) {
    const int64_t V = c.stem.vocab_size;
    Tensor logits = Tensor::empty({B, T, V});
    Tensor l2 = logits.reshape({B * T, V});
    TSR_RETURN_IF_ERROR(ex.linear(L.head, x.reshape({B * T, C}), l2));
    // Next-token distribution after each item's last valid row.
    Tensor last = Tensor::empty({B, V});
    for (int64_t b = 0; b < B; ++b) last.select(0, b).copy_from(logits.select(0, b).select(0, std::max<int64_t>(len_of(b) - 1, 0)));
    Tensor probs = Tensor::empty({B, V});
    TSR_RETURN_IF_ERROR(ex.softmax(last, probs));
    out->logits = logits;
    out->probs = probs;
  }
  if (out->logits.defined()) cap.put("head.logits", out->logits);
  if (out->probs.defined()) cap.put("head.probs", out->probs);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Plan

Plan make_plan(const ModelConfig& c, int64_t seq_len) {
  Plan p;
  const double T = static_cast<double>(seq_len + (c.stem.kind == StemKind::features && c.stem.cls ? 1 : 0));
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
