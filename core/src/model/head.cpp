// The heads on the final rows: pooling (cls, mean, last, cls_dist, max) with the optional pooler and
// L2 normalisation, the classifier, and the LM head (tied or untied, with BERT/ESM's transform).
#include <cmath>
#include <map>

#include "arena.h"
#include "assembly.h"
#include "tessera/plugin.h"

namespace tessera {

std::vector<std::pair<int64_t, float>> pool_taps(const ModelConfig& c, int64_t n, const uint8_t* roles) {
  std::vector<std::pair<int64_t, float>> taps;
  if (n == 0) return taps;
  int64_t cls = 0;  // the row whose role is CLS, or row 0 without roles
  for (int64_t t = 0; roles && t < n; ++t)
    if (roles[t] == TSR_ROLE_CLS) {
      cls = t;
      break;
    }
  switch (c.head.pool) {
    case PoolKind::cls: taps.emplace_back(cls, 1.f); break;
    case PoolKind::last: taps.emplace_back(n - 1, 1.f); break;
    case PoolKind::cls_dist:  // the mean of the CLS and distillation rows (AST)
      taps.emplace_back(cls, 0.5f);
      taps.emplace_back(std::min(cls + 1, n - 1), 0.5f);
      break;
    case PoolKind::mean:
      for (int64_t t = 0; t < n; ++t) taps.emplace_back(t, 1.f / static_cast<float>(n));
      break;
    case PoolKind::max: break;  // not a weighted sum of rows: pool_max below
  }
  return taps;
}

// Max pooling: each channel's largest value over the n rows of h (n, C) -> d (C), and, where arg
// is given, the row it came from (the first on a tie): its backward sends each channel's gradient
// to that row alone. No rows: zeros, and arg -1.
void pool_max(const Tensor& h, float* d, int64_t* arg) {
  const int64_t n = h.dim(0), C = h.dim(1);
  const Tensor hc = h.contiguous();
  const float* x = hc.data<float>();
  for (int64_t i = 0; i < C; ++i) {
    int64_t best = n > 0 ? 0 : -1;
    for (int64_t t = 1; t < n; ++t)
      if (x[t * C + i] > x[best * C + i]) best = t;
    d[i] = best < 0 ? 0.f : x[best * C + i];
    if (arg) arg[i] = best;
  }
}

void pool_rows(const ModelConfig& c, const Tensor& h, const uint8_t* roles, float* d) {
  const int64_t n = h.dim(0), C = h.dim(1);
  const Tensor hc = h.contiguous();
  const float* x = hc.data<float>();
  if (c.head.pool == PoolKind::max) return pool_max(hc, d, nullptr);
  std::fill(d, d + C, 0.f);
  const auto taps = pool_taps(c, n, roles);
  if (taps.size() == 1) {  // one row: copied exactly
    std::copy(x + taps[0].first * C, x + (taps[0].first + 1) * C, d);
    return;
  }
  if (c.head.pool == PoolKind::mean) {  // summed, then divided: what the mean always computed
    for (const auto& [t, w] : taps)
      for (int64_t i = 0; i < C; ++i) d[i] += x[t * C + i];
    for (int64_t i = 0; i < C; ++i) d[i] /= static_cast<float>(n);
    return;
  }
  for (const auto& [t, w] : taps)
    for (int64_t i = 0; i < C; ++i) d[i] += w * x[t * C + i];
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

// ---------------------------------------------------------------------------------------------
// Training

namespace model {

namespace {

// Cross-entropy of logits (N, K) against targets (N), averaged over the counted rows (target not
// -1); dlogits gets the average's gradient. One pass: the rows counted are known from the targets.
Status mean_cross_entropy(const Exec& ex, const Tensor& logits, const Tensor& targets, float smoothing, Tensor& dlogits,
                          HeadLoss* loss) {
  const Tensor tc = targets.contiguous();
  int64_t expected = 0;
  for (int64_t i = 0; i < tc.numel(); ++i) expected += tc.data<int32_t>()[i] != -1;
  if (expected == 0) {
    std::fill(dlogits.data<float>(), dlogits.data<float>() + dlogits.numel(), 0.f);
    loss->counted = 0;
    loss->loss = 0.0;
    return Status::Ok();
  }
  double sum = 0;
  int64_t counted = 0;
  TSR_RETURN_IF_ERROR(ex.cross_entropy(logits, targets, smoothing, &sum, &counted, &dlogits,
                                       static_cast<float>(1.0 / static_cast<double>(expected))));
  TSR_CHECK(counted == expected, "mean_cross_entropy: counted rows disagree with the targets");
  loss->counted = counted;
  loss->loss = sum / static_cast<double>(counted);
  return Status::Ok();
}

// A multi-task head's loss (model.head.tasks): each row's cross-entropy over its own block of
// classes, blocks (N, 2) i32 = [first, end), averaged over the counted rows (label not -1).
// Rows are grouped by block and each group's columns go through the same cross_entropy op as
// one task's head would; dlogits is 0 outside each row's block (those logits are not its
// prediction), so a task's rows train only its own classifier rows.
Status blocked_cross_entropy(const Exec& ex, const Tensor& logits, const Tensor& labels, const Tensor& blocks,
                             float smoothing, Tensor& dlogits, HeadLoss* loss) {
  const int64_t N = logits.dim(0), K = logits.dim(1);
  if (blocks.dtype() != DType::i32 || blocks.rank() != 2 || blocks.dim(0) != N || blocks.dim(1) != 2)
    return Status::Invalid("training: label blocks must be (" + std::to_string(N) + ", 2) i32, got " + blocks.describe());
  const Tensor bc = blocks.contiguous(), lc = labels.contiguous(), zc = logits.contiguous();
  std::map<std::pair<int32_t, int32_t>, std::vector<int64_t>> groups;  // block -> its counted rows
  for (int64_t i = 0; i < N; ++i) {
    const int32_t first = bc.data<int32_t>()[2 * i], end = bc.data<int32_t>()[2 * i + 1], y = lc.data<int32_t>()[i];
    if (first < 0 || end <= first || end > K)
      return Status::Invalid("training: row " + std::to_string(i) + "'s block of classes [" + std::to_string(first) + ", " +
                             std::to_string(end) + ") is not within the " + std::to_string(K) + " classes");
    if (y == -1) continue;
    if (y < first || y >= end)
      return Status::Invalid("training: row " + std::to_string(i) + "'s label " + std::to_string(y) +
                             " is outside its task's classes [" + std::to_string(first) + ", " + std::to_string(end) + ")");
    groups[{first, end}].push_back(i);
  }
  float* d = dlogits.data<float>();
  std::fill(d, d + dlogits.numel(), 0.f);
  int64_t expected = 0;
  for (const auto& [block, rows] : groups) expected += static_cast<int64_t>(rows.size());
  loss->counted = expected;
  loss->loss = 0.0;
  if (expected == 0) return Status::Ok();
  double total = 0;
  for (const auto& [block, rows] : groups) {
    const int64_t n = static_cast<int64_t>(rows.size()), k = block.second - block.first;
    Tensor gl = Tensor::empty({n, k}), gt = Tensor::empty({n}, DType::i32), gd = Tensor::empty({n, k});
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i = rows[static_cast<size_t>(r)];
      const float* z = zc.data<float>() + i * K + block.first;
      std::copy(z, z + k, gl.data<float>() + r * k);
      gt.data<int32_t>()[r] = lc.data<int32_t>()[i] - block.first;
    }
    double sum = 0;
    int64_t counted = 0;
    TSR_RETURN_IF_ERROR(ex.cross_entropy(gl, gt, smoothing, &sum, &counted, &gd,
                                         static_cast<float>(1.0 / static_cast<double>(expected))));
    total += sum;
    for (int64_t r = 0; r < n; ++r)
      std::copy(gd.data<float>() + r * k, gd.data<float>() + (r + 1) * k,
                d + rows[static_cast<size_t>(r)] * K + block.first);
  }
  loss->loss = total / static_cast<double>(expected);
  return Status::Ok();
}

// rows (N, C) -> logits (N, V) through the LM head (with BERT/ESM's transform: dense, activation,
// layer norm), the loss at `targets` (N), and the gradient at the rows.
Status lm_head_train(const ModelConfig& c, const Parameters& P, const Exec& ex, const Tensor& rows,
                     const Tensor& targets, float smoothing, Tensor& drows, Parameters& G, HeadLoss* loss,
                     Tensor* logits_out) {
  const int64_t N = rows.dim(0), C = rows.dim(1), V = c.stem.vocab_size;
  const bool transform = P.find("head.transform.w") != nullptr;
  Tensor t_pre, t_act, mean, rstd, in = rows;
  if (transform) {
    t_pre = Tensor::empty({N, C});
    t_act = Tensor::empty({N, C});
    in = Tensor::empty({N, C});
    mean = Tensor::empty({N});
    rstd = Tensor::empty({N});
    TSR_RETURN_IF_ERROR(ex.linear_plain(rows, P.get("head.transform.w"), P.get("head.transform.b"), t_pre));
    TSR_RETURN_IF_ERROR(ex.activation(c.activation, t_pre, t_act));
    TSR_RETURN_IF_ERROR(ex.layer_norm_train(t_act, P.get("head.transform.gamma"), P.get("head.transform.beta"),
                                            static_cast<float>(c.norm_eps), in, mean, rstd));
  }
  // Tied: the (C, V) transpose view of the (V, C) token table, and of its gradient.
  const Tensor w = c.head.tied ? P.get("stem.embed").transpose(0, 1) : P.get("head.lm");
  Tensor gw_view;
  Tensor* gw = nullptr;
  if (c.head.tied) {
    if (Tensor* ge = G.find("stem.embed")) {
      gw_view = ge->transpose(0, 1);
      gw = &gw_view;
    }
  } else {
    gw = G.find("head.lm");
  }
  Tensor logits = Tensor::empty({N, V});
  TSR_RETURN_IF_ERROR(ex.linear_plain(in, w, P.get("head.lm_bias"), logits));
  Tensor dlogits = Tensor::empty({N, V});
  TSR_RETURN_IF_ERROR(mean_cross_entropy(ex, logits, targets, smoothing, dlogits, loss));
  if (logits_out) *logits_out = logits;
  Tensor din = transform ? Tensor::empty({N, C}) : drows;
  TSR_RETURN_IF_ERROR(ex.linear_backward(in, w, dlogits, &din, gw, G.find("head.lm_bias")));
  if (!transform) return Status::Ok();
  Tensor dact = Tensor::empty({N, C});
  TSR_RETURN_IF_ERROR(ex.layer_norm_backward(t_act, P.get("head.transform.gamma"), mean, rstd, din, &dact,
                                             G.find("head.transform.gamma"), G.find("head.transform.beta")));
  TSR_RETURN_IF_ERROR(ex.activation_backward(c.activation, t_pre, dact, dact));
  return ex.linear_backward(rows, P.get("head.transform.w"), dact, &drows, G.find("head.transform.w"),
                            G.find("head.transform.b"));
}

// pooled (N, C) -> [pooler, tanh] -> [L2 normalise] -> [layer norm] -> classifier logits, the loss
// at labels (N), and the gradient at the pooled vectors (written into dpooled).
Status classifier_train(const ModelConfig& c, const Parameters& P, const Exec& ex, const Tensor& pooled,
                        const Tensor& labels, const Tensor& blocks, float smoothing, Tensor& dpooled, Parameters& G,
                        HeadLoss* loss, Outputs* out) {
  const int64_t N = pooled.dim(0), C = pooled.dim(1);
  const bool pooler = P.find("head.pooler.w") != nullptr, norm = P.find("head.norm.gamma") != nullptr;
  Tensor p1 = pooled, p2 = pooled;  // after the pooler (p2 = tanh(p1)); p3 after normalisation
  if (pooler) {
    p1 = Tensor::empty({N, C});
    TSR_RETURN_IF_ERROR(ex.linear_plain(pooled, P.get("head.pooler.w"), P.get("head.pooler.b"), p1));
    p2 = Tensor::empty({N, C});
    for (int64_t i = 0; i < N * C; ++i) p2.data<float>()[i] = std::tanh(p1.data<float>()[i]);
  }
  Tensor p3 = p2;
  std::vector<float> inv_norm(static_cast<size_t>(N), 1.f);
  if (c.head.normalize) {
    p3 = Tensor::empty({N, C});
    for (int64_t r = 0; r < N; ++r) {
      const float* a = p2.data<float>() + r * C;
      double ss = 0;
      for (int64_t i = 0; i < C; ++i) ss += static_cast<double>(a[i]) * a[i];
      inv_norm[static_cast<size_t>(r)] = ss > 0 ? static_cast<float>(1.0 / std::sqrt(ss)) : 0.f;
      for (int64_t i = 0; i < C; ++i) p3.data<float>()[r * C + i] = a[i] * inv_norm[static_cast<size_t>(r)];
    }
  }
  if (out) out->pooled = p3;
  if (c.head.kind != HeadKind::classifier) return Status::Invalid("training: labels need a classifier head");
  Tensor in = p3, mean, rstd;
  if (norm) {
    in = Tensor::empty({N, C});
    mean = Tensor::empty({N});
    rstd = Tensor::empty({N});
    TSR_RETURN_IF_ERROR(ex.layer_norm_train(p3, P.get("head.norm.gamma"), P.get("head.norm.beta"),
                                            static_cast<float>(c.norm_eps), in, mean, rstd));
  }
  Tensor logits = Tensor::empty({N, c.head.n_classes}), dlogits = Tensor::empty({N, c.head.n_classes});
  TSR_RETURN_IF_ERROR(ex.linear_plain(in, P.get("head.w"), P.get("head.b"), logits));
  if (blocks.defined())
    TSR_RETURN_IF_ERROR(blocked_cross_entropy(ex, logits, labels, blocks, smoothing, dlogits, loss));
  else
    TSR_RETURN_IF_ERROR(mean_cross_entropy(ex, logits, labels, smoothing, dlogits, loss));
  if (out) out->logits = logits;
  Tensor d = Tensor::empty({N, C});
  TSR_RETURN_IF_ERROR(ex.linear_backward(in, P.get("head.w"), dlogits, &d, G.find("head.w"), G.find("head.b")));
  if (norm) {
    Tensor dn = Tensor::empty({N, C});
    TSR_RETURN_IF_ERROR(ex.layer_norm_backward(p3, P.get("head.norm.gamma"), mean, rstd, d, &dn,
                                               G.find("head.norm.gamma"), G.find("head.norm.beta")));
    d = dn;
  }
  if (c.head.normalize)  // y = a / |a|:  da = (dy - y (y · dy)) / |a|
    for (int64_t r = 0; r < N; ++r) {
      const float* y = p3.data<float>() + r * C;
      float* g = d.data<float>() + r * C;
      double dot = 0;
      for (int64_t i = 0; i < C; ++i) dot += static_cast<double>(y[i]) * g[i];
      for (int64_t i = 0; i < C; ++i)
        g[i] = (g[i] - y[i] * static_cast<float>(dot)) * inv_norm[static_cast<size_t>(r)];
    }
  if (!pooler) {
    dpooled.copy_from(d);
    return Status::Ok();
  }
  for (int64_t i = 0; i < N * C; ++i) {  // tanh' = 1 - tanh²
    const float t = p2.data<float>()[i];
    d.data<float>()[i] *= 1.f - t * t;
  }
  return ex.linear_backward(pooled, P.get("head.pooler.w"), d, &dpooled, G.find("head.pooler.w"),
                            G.find("head.pooler.b"));
}

}  // namespace

Status head_train(const ModelConfig& c, const Parameters& P, const Exec& ex, const Batch& batch, const RowLayout& lay,
                  int64_t extra, const Tensor& x, const Targets& targets, Tensor& dx, Parameters& G, HeadLoss* loss,
                  Outputs* out) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2), T_in = batch.seq_len();
  std::fill(dx.data<float>(), dx.data<float>() + dx.numel(), 0.f);
  if (targets.probe.defined()) {  // loss = Σ probe ⊙ x:  dx = probe
    if (targets.probe.shape() != x.shape())
      return Status::Invalid("training: the probe is " + targets.probe.shape().str() + " but the final rows are " +
                             x.shape().str());
    const Tensor pr = targets.probe.contiguous();
    double sum = 0;
    for (int64_t i = 0; i < x.numel(); ++i) sum += static_cast<double>(pr.data<float>()[i]) * x.data<float>()[i];
    dx.copy_from(pr);
    loss->loss = sum;
    loss->counted = B;
    return Status::Ok();
  }
  if (targets.tokens.defined()) {
    if (c.head.kind != HeadKind::lm) return Status::Invalid("training: token targets need an LM head (head.kind lm)");
    if (targets.tokens.rank() != 2 || targets.tokens.dim(0) != B || targets.tokens.dim(1) != T)
      return Status::Invalid("training: token targets must be (" + std::to_string(B) + ", " + std::to_string(T) +
                             ") i32, got " + targets.tokens.describe());
    Tensor d2 = dx.reshape({B * T, C}), logits;
    TSR_RETURN_IF_ERROR(lm_head_train(c, P, ex, x.reshape({B * T, C}), targets.tokens.contiguous().reshape({B * T}),
                                      targets.label_smoothing, d2, G, loss, out ? &logits : nullptr));
    if (out) out->logits = logits.reshape({B, T, c.stem.vocab_size});
    return Status::Ok();
  }
  if (!targets.labels.defined()) return Status::Invalid("training: no targets (tokens, labels or probe)");
  if (c.head.kind != HeadKind::classifier) return Status::Invalid("training: labels need a classifier head");
  if (batch.segments.defined())
    return Status::Invalid("training: a classifier trains on one sequence per batch row (no packing)");
  if (targets.labels.rank() != 1 || targets.labels.dim(0) != B)
    return Status::Invalid("training: labels must be (" + std::to_string(B) + ") i32, got " + targets.labels.describe());
  // Pool each item's rows: a weighted sum of rows, so its backward sends each row its weight's share;
  // max pooling keeps each channel's row (argmax, (B, C): a row of x (B·T, C)) for its backward.
  const Tensor roles = batch.roles.defined() ? batch.roles.contiguous() : Tensor();
  const bool max_pool = c.head.pool == PoolKind::max;
  std::vector<std::vector<std::pair<int64_t, float>>> taps(static_cast<size_t>(B));
  std::vector<int64_t> argmax(max_pool ? static_cast<size_t>(B * C) : 0);
  Tensor pooled = Tensor::zeros({B, C});
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int64_t> r = rows_of(lay, b, 0);
    const int64_t first = r.empty() ? 0 : r.front();
    const uint8_t* rl = roles.defined() && !extra ? roles.data<uint8_t>() + b * T_in + first : nullptr;
    const Tensor hb = x.select(0, b).slice(0, first, first + static_cast<int64_t>(r.size()));
    if (max_pool) {
      int64_t* a = argmax.data() + b * C;
      pool_max(hb, pooled.data<float>() + b * C, a);
      for (int64_t i = 0; i < C; ++i)
        if (a[i] >= 0) a[i] += b * T + first;
      continue;
    }
    pool_rows(c, hb, rl, pooled.data<float>() + b * C);
    taps[static_cast<size_t>(b)] = pool_taps(c, static_cast<int64_t>(r.size()), rl);
    for (auto& t : taps[static_cast<size_t>(b)]) t.first += b * T + first;
  }
  Tensor dpooled = Tensor::empty({B, C});
  TSR_RETURN_IF_ERROR(classifier_train(c, P, ex, pooled, targets.labels.contiguous(), targets.label_blocks,
                                       targets.label_smoothing, dpooled, G, loss, out));
  float* d = dx.data<float>();
  const float* dp = dpooled.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    if (max_pool) {
      for (int64_t i = 0; i < C; ++i)
        if (const int64_t row = argmax[static_cast<size_t>(b * C + i)]; row >= 0) d[row * C + i] += dp[b * C + i];
      continue;
    }
    for (const auto& [row, wgt] : taps[static_cast<size_t>(b)])
      for (int64_t i = 0; i < C; ++i) d[row * C + i] += wgt * dp[b * C + i];
  }
  return Status::Ok();
}

}  // namespace model

}  // namespace tessera
