// Training examples and their batches. See examples.h.
#include "examples.h"

#include <algorithm>

#include "tessera/plugin.h"

namespace tessera::train {

RowFormat row_format(const ModelConfig& m, const std::vector<Encoder>& encoders, const StemLayout& layout) {
  RowFormat f;
  f.ids = m.stem.kind == StemKind::tokens || m.stem.kind == StemKind::mixed;
  f.rows = m.stem.kind != StemKind::tokens;
  f.kinds = m.stem.kind == StemKind::mixed;
  f.modality = m.stem.modalities > 0;
  f.width = m.stem.kind == StemKind::identity ? m.d_model : m.stem.n_features;
  for (size_t p = 0; p < encoders.size(); ++p) {
    const tsr_encoder_info& info = encoders[p].info();
    const bool features = info.rows_kind == TSR_ROWS_FEATURES;
    f.plugins.push_back({features, layout.column[p], features ? static_cast<int64_t>(info.width) : 0});
  }
  return f;
}

Example make_example(const RowFormat& f, const run::Sequence& s, int32_t label, bool keep_positions) {
  Example ex;
  ex.label = label;
  ex.roles = s.rows.roles;
  ex.parts = s.parts;
  if (f.ids) ex.ids = s.rows.ids;
  if (f.rows && s.rows.features.defined()) {
    const Tensor all = s.rows.features.contiguous();  // (n, F), or (n, width) with one plugin
    const int64_t W = all.dim(1);
    for (const run::SequencePart& part : s.parts) {
      const RowFormat::Plugin& pl = f.plugins[static_cast<size_t>(part.plugin)];
      if (!pl.features) continue;
      const int64_t col = W == pl.width ? 0 : pl.column;
      for (int64_t t = part.begin; t < part.end; ++t) {
        const float* row = all.data<float>() + t * W + col;
        ex.rows.insert(ex.rows.end(), row, row + pl.width);
      }
    }
  }
  if (keep_positions) ex.positions = s.rows.positions;
  return ex;
}

namespace {

// Plugin part.plugin's rows of e, `rows` ((end - begin) × width, as e holds them), augmented into `out`.
Status augment_part(const Augment& aug, const Example& e, const run::SequencePart& part, const float* rows,
                    int64_t width, int64_t index, float* out) {
  const int64_t n = part.end - part.begin;
  TokenRows r;
  r.kind = TSR_ROWS_FEATURES;
  r.features = Tensor::wrap(const_cast<float*>(rows), {n, width}, DType::f32, nullptr);
  r.positions.assign(e.positions.begin() + part.begin, e.positions.begin() + part.end);
  r.roles.assign(e.roles.begin() + part.begin, e.roles.begin() + part.end);
  r.grid_rows = part.grid_rows;
  r.grid_cols = part.grid_cols;
  const uint64_t seed = mix(aug.seed, static_cast<uint64_t>(index));
  return aug.encoders[static_cast<size_t>(part.plugin)]->augment(
      r, aug.several ? mix(seed, static_cast<uint64_t>(part.plugin)) : seed, out);
}

}  // namespace

Result<Batch> make_batch(const RowFormat& f, const std::vector<const Example*>& ex, Tensor* labels,
                         const Augment* aug) {
  const int64_t B = static_cast<int64_t>(ex.size()), F = f.width;
  int64_t T = 1;
  for (const Example* e : ex) T = std::max(T, e->n());
  Batch b;
  b.roles = Tensor::zeros({B, T}, DType::u8);
  if (f.ids) b.ids = Tensor::zeros({B, T}, DType::i32);
  if (f.rows) b.rows = Tensor::zeros({B, T, F});
  if (f.kinds) b.kinds = Tensor::zeros({B, T}, DType::u8);
  if (f.modality) b.modality = Tensor::zeros({B, T}, DType::i32);
  *labels = Tensor::empty({B}, DType::i32);
  std::vector<float> augmented;
  for (int64_t i = 0; i < B; ++i) {
    const Example& e = *ex[static_cast<size_t>(i)];
    b.lengths.push_back(e.n());
    labels->data<int32_t>()[i] = e.label;
    std::copy(e.roles.begin(), e.roles.end(), b.roles.data<uint8_t>() + i * T);
    for (int64_t t = e.n(); t < T; ++t) b.roles.data<uint8_t>()[i * T + t] = TSR_ROLE_PAD;
    if (f.ids) std::copy(e.ids.begin(), e.ids.end(), b.ids.data<int32_t>() + i * T);
    const float* src = e.rows.data();  // the next feature part's rows
    for (const run::SequencePart& part : e.parts) {
      const RowFormat::Plugin& pl = f.plugins[static_cast<size_t>(part.plugin)];
      for (int64_t t = part.begin; t < part.end; ++t) {
        if (f.kinds) b.kinds.data<uint8_t>()[i * T + t] = pl.features ? 1 : 0;
        if (f.modality) b.modality.data<int32_t>()[i * T + t] = part.plugin;
      }
      if (!pl.features || !f.rows) continue;
      const int64_t n = part.end - part.begin, w = pl.width;
      const float* rows = src;
      src += n * w;
      if (aug && !aug->encoders.empty() && aug->encoders[static_cast<size_t>(part.plugin)]) {
        augmented.resize(static_cast<size_t>(n * w));
        TSR_RETURN_IF_ERROR(augment_part(*aug, e, part, rows, w, aug->index[static_cast<size_t>(i)], augmented.data()));
        rows = augmented.data();
      }
      // One plugin fills the whole row (w = F); several write into their own columns.
      float* dst = b.rows.data<float>() + (i * T + part.begin) * F + pl.column;
      if (w == F) std::copy(rows, rows + n * w, dst);
      else
        for (int64_t t = 0; t < n; ++t) std::copy(rows + t * w, rows + (t + 1) * w, dst + t * F);
    }
  }
  return b;
}

}  // namespace tessera::train
