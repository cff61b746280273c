// The batch against the config, and the batch's rows resolved into sequences and positions: what
// every later part of the forward pass (stem positions, attention masks, heads) reads.
#include <algorithm>

#include "assembly.h"

namespace tessera::model {

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

std::vector<int64_t> rows_of(const RowLayout& lay, int64_t b, int32_t s) {
  std::vector<int64_t> r;
  for (int64_t t = 0; t < lay.T; ++t)
    if (lay.seg[static_cast<size_t>(b * lay.T + t)] == s) r.push_back(t);
  return r;
}

int64_t prepended_rows(const ModelConfig& c, const Batch& batch) {
  const bool has_cls_stem = c.stem.cls && (c.stem.kind == StemKind::features || c.stem.kind == StemKind::mixed);
  return has_cls_stem && !batch.roles.defined() ? (c.stem.dist ? 2 : 1) : 0;
}

Status row_layout(const ModelConfig& c, const Batch& batch, int64_t extra, const std::vector<int64_t>& past,
                  RowLayout* out) {
  RowLayout& lay = *out;
  const int64_t B = batch.batch_size(), T = batch.seq_len() + extra;
  lay = RowLayout();
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
  return Status::Ok();
}

}  // namespace tessera::model
