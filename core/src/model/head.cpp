// The heads on the final rows: pooling (cls, mean, last, cls_dist) with the optional pooler and
// L2 normalisation, the classifier, and the LM head (tied or untied, with BERT/ESM's transform).
#include <cmath>

#include "arena.h"
#include "assembly.h"
#include "tessera/plugin.h"

namespace tessera {

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

namespace model {

Status head_forward(const Model& m, const Model::Layers& L, const Exec& ex, const Batch& batch,
                    const RowLayout& lay, int64_t extra, const Tensor& x, const ForwardOptions& opt,
                    const Capture& cap, Outputs* out) {
  const ModelConfig& c = m.config();
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2), T_in = batch.seq_len();
  const Tensor roles = batch.roles.defined() ? batch.roles.contiguous() : Tensor();
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
    TSR_RETURN_IF_ERROR(m.pool_head(pooled, opt));
    cap.put("head.pooled", pooled);
    out->pooled = pooled;
    if (c.head.kind == HeadKind::classifier) TSR_RETURN_IF_ERROR(m.classify(pooled, &out->logits, &out->probs, opt));
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
  return Status::Ok();
}

}  // namespace model

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

}  // namespace tessera
