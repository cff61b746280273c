// The stem: a batch's token ids and/or feature rows become the first rows x (B, T, C) of the
// residual stream — token embeddings (scaled, plus token types), projected feature rows, the learned
// CLS and distillation rows, modality embeddings, absolute positions, and stem.norm.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "arena.h"
#include "assembly.h"
#include "tessera/plugin.h"

namespace tessera::model {

StemPlan plan_stem(const ModelConfig& c, const Batch& batch, const RowLayout& lay, int64_t extra) {
  StemPlan p;
  const int64_t B = batch.batch_size(), T_in = batch.seq_len(), T = T_in + extra, C = c.d_model;
  const size_t n = static_cast<size_t>(B * T);
  p.token_id.assign(n, -1);
  p.token_scale.assign(n, 1.f);
  p.type_id.assign(n, -1);
  p.special.assign(n, 0);
  p.modality.assign(n, -1);
  const bool tokens = c.stem.kind == StemKind::tokens || c.stem.kind == StemKind::mixed;
  const bool features = c.stem.kind == StemKind::features || c.stem.kind == StemKind::mixed;
  const Tensor kinds = batch.kinds.defined() ? batch.kinds.contiguous() : Tensor();
  const Tensor roles = batch.roles.defined() ? batch.roles.contiguous() : Tensor();
  const Tensor ids = batch.ids.defined() ? batch.ids.contiguous() : Tensor();
  const Tensor types = batch.types.defined() ? batch.types.contiguous() : Tensor();
  const Tensor mod = batch.modality.defined() ? batch.modality.contiguous() : Tensor();
  const uint8_t* rl = roles.defined() ? roles.data<uint8_t>() : nullptr;
  const bool has_cls_stem = c.stem.cls && features;
  const float scale = c.stem.scale == EmbedScale::sqrt_d_model ? std::sqrt(static_cast<float>(C)) : 1.f;
  for (int64_t i = 0; i < B * T_in; ++i) {  // input row i is x row r
    const int64_t r = (i / T_in) * T + i % T_in + extra;
    const size_t ru = static_cast<size_t>(r);
    const bool feature = c.stem.kind == StemKind::mixed ? kinds.data<uint8_t>()[i] != 0 : features;
    if (mod.defined()) p.modality[ru] = mod.data<int32_t>()[i];
    if (!feature && tokens) {
      const int32_t id = ids.data<int32_t>()[i];
      if ((id < 0 || id >= c.stem.vocab_size) && p.bad_id_at < 0) {
        p.bad_id_at = i;
        p.bad_id = id;
      }
      p.token_id[ru] = id < 0 ? 0 : id;
      p.token_scale[ru] = scale;
      if (c.stem.token_types > 0) p.type_id[ru] = types.defined() ? types.data<int32_t>()[i] : 0;
      continue;
    }
    if (!feature) continue;
    const bool cls_row = has_cls_stem && rl && rl[i] == TSR_ROLE_CLS;
    // With a distillation row, a CLS-role row right after another one is the distillation row.
    const bool dist_row = cls_row && c.stem.dist && i % T_in > 0 && rl[i - 1] == TSR_ROLE_CLS;
    if (cls_row) {
      p.special[ru] = dist_row ? 2 : 1;
    } else {
      p.feature_row.push_back(r);
      p.feature_src.push_back(i);
    }
  }
  for (int64_t b = 0; b < B && extra; ++b) {
    p.special[static_cast<size_t>(b * T)] = 1;
    if (extra == 2) p.special[static_cast<size_t>(b * T + 1)] = 2;
  }
  if (c.stem.token_dropout && tokens) {
    // ESM-2 was trained with 15 % of tokens selected and 80 % of those masked; at inference the
    // mask rows are zeroed and each sequence's rows rescaled by the share it actually masks.
    for (int64_t b = 0; b < B; ++b) {
      std::map<int32_t, std::pair<int64_t, int64_t>> counts;  // sequence -> (masked, rows)
      for (int64_t t = extra; t < T; ++t) {
        const size_t r = static_cast<size_t>(b * T + t);
        if (lay.seg[r] < 0 || (c.stem.kind == StemKind::mixed && kinds.data<uint8_t>()[b * T_in + t - extra] != 0))
          continue;
        auto& k = counts[lay.seg[r]];
        k.first += p.token_id[r] == c.stem.mask_id;
        ++k.second;
      }
      for (int64_t t = extra; t < T; ++t) {
        const size_t r = static_cast<size_t>(b * T + t);
        if (lay.seg[r] < 0 || (c.stem.kind == StemKind::mixed && kinds.data<uint8_t>()[b * T_in + t - extra] != 0))
          continue;
        const auto& k = counts[lay.seg[r]];
        const bool masked = p.token_id[r] == c.stem.mask_id;
        p.row_factor.resize(n, 1.f);
        p.row_factor[r] = masked ? 0.f
                                 : static_cast<float>((1.0 - 0.15 * 0.8) /
                                                      (1.0 - static_cast<double>(k.first) / static_cast<double>(k.second)));
      }
    }
  }
  return p;
}

namespace {

// y[r] += s · table[index[r]] for every row r with index[r] >= 0 (x rows of width C).
void add_rows(float* x, const Tensor& table, const std::vector<int32_t>& index, const float* s, int64_t C) {
  const float* tab = table.data<float>();
  const int64_t n = static_cast<int64_t>(index.size());
#pragma omp parallel for schedule(static) if (n * C > 65536)
  for (int64_t r = 0; r < n; ++r) {
    const int32_t id = index[static_cast<size_t>(r)];
    if (id < 0) continue;
    const float f = s ? s[r] : 1.f;
    const float* e = tab + static_cast<int64_t>(id) * C;
    float* d = x + r * C;
    for (int64_t k = 0; k < C; ++k) d[k] += f * e[k];
  }
}

// The backward of add_rows: dtable[index[r]] += s · dx[r]. Rows share table rows, so the threads
// split the columns: each entry still sums its rows in row order, on any number of threads.
void add_rows_backward(const float* dx, const std::vector<int32_t>& index, const float* s, int64_t C, Tensor& dtable) {
  float* g = dtable.data<float>();
  const int64_t n = static_cast<int64_t>(index.size());
  constexpr int64_t kBlock = 16;
#pragma omp parallel for schedule(static) if (n * C > 65536)
  for (int64_t k0 = 0; k0 < C; k0 += kBlock) {
    const int64_t k1 = std::min(C, k0 + kBlock);
    for (int64_t r = 0; r < n; ++r) {
      const int32_t id = index[static_cast<size_t>(r)];
      if (id < 0) continue;
      const float f = s ? s[r] : 1.f;
      const float* d = dx + r * C;
      float* e = g + static_cast<int64_t>(id) * C;
      for (int64_t k = k0; k < k1; ++k) e[k] += f * d[k];
    }
  }
}

}  // namespace

Status stem_forward(const ModelConfig& c, const StemWeights& w, const Exec& ex, const Batch& batch,
                    const RowLayout& lay, int64_t extra, Tensor& x, Tensor& h, StemSaved* saved) {
  const int64_t B = batch.batch_size(), T = batch.seq_len() + extra, C = c.d_model;
  StemSaved local;
  StemSaved& sv = saved ? *saved : local;
  sv.plan = plan_stem(c, batch, lay, extra);
  const StemPlan& p = sv.plan;
  float* xp = x.data<float>();
  if (c.stem.kind == StemKind::identity) {
    x.copy_from(batch.rows);
  } else {
    std::memset(x.raw_data(), 0, x.nbytes());
  }
  if (p.bad_id_at >= 0)
    return Status::OutOfRange("forward: token id " + std::to_string(p.bad_id) + " at position " +
                              std::to_string(p.bad_id_at) + " is outside the vocabulary [0, " +
                              std::to_string(c.stem.vocab_size) + ")");
  if (w.embed.defined()) add_rows(xp, w.embed, p.token_id, p.token_scale.data(), C);
  if (w.type_embed.defined()) add_rows(xp, w.type_embed, p.type_id, nullptr, C);
  if (!p.row_factor.empty())
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t k = 0; k < C; ++k) xp[r * C + k] *= p.row_factor[static_cast<size_t>(r)];
  if (!p.feature_row.empty()) {
    const int64_t F = c.stem.n_features, N = static_cast<int64_t>(p.feature_row.size());
    const Tensor rows = batch.rows.contiguous();
    Tensor in = Tensor::empty({N, F});
    for (int64_t k = 0; k < N; ++k) {
      const float* src = rows.data<float>() + p.feature_src[static_cast<size_t>(k)] * F;
      std::copy(src, src + F, in.data<float>() + k * F);
    }
    Tensor proj = Tensor::empty({N, C});
    TSR_RETURN_IF_ERROR(w.project(in, proj));
    for (int64_t k = 0; k < N; ++k)
      std::copy(proj.data<float>() + k * C, proj.data<float>() + (k + 1) * C,
                xp + p.feature_row[static_cast<size_t>(k)] * C);
    if (saved) sv.proj_in = in;
  }
  for (int64_t r = 0; r < B * T; ++r) {
    const int8_t sp = p.special[static_cast<size_t>(r)];
    if (sp == 0) continue;
    const float* src = (sp == 2 ? w.dist : w.cls).data<float>();
    std::copy(src, src + C, xp + r * C);
  }
  if (w.modality.defined()) add_rows(xp, w.modality, p.modality, nullptr, C);
  if (w.pos.defined()) add_rows(xp, w.pos, lay.pos, nullptr, C);  // learned or sinusoidal table
  if (c.stem.norm) {
    if (saved) {
      sv.pre_norm = x.clone();
      sv.mean = Tensor::empty({B * T});
      sv.rstd = Tensor::empty({B * T});
      TSR_RETURN_IF_ERROR(ex.layer_norm_train(x, w.norm_g, w.norm_b, static_cast<float>(c.norm_eps), h, sv.mean, sv.rstd));
    } else {
      TSR_RETURN_IF_ERROR(ex.layer_norm(x, w.norm_g, w.norm_b, static_cast<float>(c.norm_eps), h));
    }
    std::swap(x, h);
  }
  return Status::Ok();
}

Status stem_backward(const ModelConfig& c, const StemWeights& w, const Exec& ex, const StemSaved& sv,
                     const RowLayout& lay, Tensor& dx, Parameters& grads, Tensor* d_rows, int64_t input_rows) {
  const StemPlan& p = sv.plan;
  const int64_t C = c.d_model, BT = dx.numel() / C;
  Tensor g = dx;
  if (c.stem.norm) {
    Tensor d_pre = Tensor::empty(dx.shape());
    TSR_RETURN_IF_ERROR(ex.layer_norm_backward(sv.pre_norm, w.norm_g, sv.mean, sv.rstd, dx, &d_pre,
                                               grads.find("stem.norm.gamma"), grads.find("stem.norm.beta")));
    g = d_pre;
  }
  const float* gp = g.data<float>();
  if (Tensor* gpos = grads.find("pos.table")) add_rows_backward(gp, lay.pos, nullptr, C, *gpos);
  if (Tensor* gm = grads.find("stem.modality")) add_rows_backward(gp, p.modality, nullptr, C, *gm);
  for (int64_t r = 0; r < BT; ++r) {
    const int8_t sp = p.special[static_cast<size_t>(r)];
    Tensor* gs = sp == 1 ? grads.find("stem.cls") : sp == 2 ? grads.find("stem.dist") : nullptr;
    if (!gs) continue;
    float* d = gs->data<float>();
    for (int64_t k = 0; k < C; ++k) d[k] += gp[r * C + k];
  }
  if (!p.feature_row.empty()) {
    const int64_t N = static_cast<int64_t>(p.feature_row.size()), F = c.stem.n_features;
    Tensor dproj = Tensor::empty({N, C});
    for (int64_t k = 0; k < N; ++k)
      std::copy(gp + p.feature_row[static_cast<size_t>(k)] * C, gp + (p.feature_row[static_cast<size_t>(k)] + 1) * C,
                dproj.data<float>() + k * C);
    Tensor din = d_rows ? Tensor::empty({N, F}) : Tensor();
    TSR_RETURN_IF_ERROR(ex.linear_backward(sv.proj_in, w.proj_w, dproj, d_rows ? &din : nullptr,
                                           grads.find("stem.proj"), grads.find("stem.proj_bias")));
    if (d_rows) {
      *d_rows = Tensor::zeros({input_rows, F});
      for (int64_t k = 0; k < N; ++k)
        std::copy(din.data<float>() + k * F, din.data<float>() + (k + 1) * F,
                  d_rows->data<float>() + p.feature_src[static_cast<size_t>(k)] * F);
    }
  } else if (d_rows && c.stem.kind == StemKind::identity) {
    *d_rows = g.clone().reshape({input_rows, C});
  }
  std::vector<float> scale(p.token_scale);
  std::vector<float> type_scale(static_cast<size_t>(BT), 1.f);
  if (!p.row_factor.empty())
    for (size_t r = 0; r < scale.size(); ++r) {
      scale[r] *= p.row_factor[r];
      type_scale[r] = p.row_factor[r];
    }
  if (Tensor* ge = grads.find("stem.embed")) add_rows_backward(gp, p.token_id, scale.data(), C, *ge);
  if (Tensor* gt = grads.find("stem.type_embed")) add_rows_backward(gp, p.type_id, type_scale.data(), C, *gt);
  return Status::Ok();
}

}  // namespace tessera::model
