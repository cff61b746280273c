// The stem: a batch's token ids and/or feature rows become the first rows x (B, T, C) of the
// residual stream — token embeddings (scaled, plus token types), projected feature rows, the learned
// CLS and distillation rows, modality embeddings, absolute positions, and stem.norm.
#include <cmath>
#include <cstring>
#include <map>

#include "arena.h"
#include "assembly.h"
#include "tessera/plugin.h"

namespace tessera::model {

Status stem_forward(const ModelConfig& c, const Model::Layers& L, const Exec& ex, const Batch& batch,
                    const RowLayout& lay, int64_t extra, Tensor& x, Tensor& h) {
  const int64_t B = batch.batch_size(), T_in = batch.seq_len(), T = T_in + extra, C = c.d_model;
  const bool has_cls_stem = c.stem.cls && (c.stem.kind == StemKind::features || c.stem.kind == StemKind::mixed);
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
  if (c.stem.norm) {
    TSR_RETURN_IF_ERROR(ex.layer_norm(x, L.stem_g, L.stem_b, static_cast<float>(c.norm_eps), h));
    std::swap(x, h);
  }
  return Status::Ok();
}

}  // namespace tessera::model
