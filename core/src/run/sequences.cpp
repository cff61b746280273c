// An item through its plugins into the model's sequences, shared by batch runs and training. See
// sequences.h.
#include "sequences.h"

#include <algorithm>

#include "batcher.h"  // item_bytes

namespace tessera::run {

ItemLimits item_limits(const RuntimeConfig& rt) {
  return ItemLimits{rt.max_item_bytes, rt.max_item_rows, rt.item_timeout_s, rt.worker_memory_mb};
}

Status confine_encoder(Encoder& encoder, const RuntimeConfig& rt) {
  const ItemLimits limits = item_limits(rt);
  if (rt.isolate) return encoder.isolate(limits);
  encoder.limit(limits);
  return Status::Ok();
}

std::vector<Result<std::string>> read_parts(const DataItem& item, int64_t max_bytes) {
  std::vector<Result<std::string>> v;
  if (!item.error.empty()) return v;
  for (const ItemPart& p : item.parts)
    v.push_back(p.missing ? Result<std::string>(std::string()) : item_bytes(p, max_bytes));
  return v;
}

Result<std::vector<TokenRows>> encode_part(const Encoder& enc, const PluginItem& pi) { return enc.encode(pi); }

namespace {

// Appends plugin p's rows to s in the stem's layout: ids shifted into its block, features into
// its columns. `several`: the experiment has more than one plugin (one plugin's rows are kept as
// they are).
void append_rows(const ModelConfig& m, const StemLayout& layout, bool several, Sequence& s, size_t p,
                 const TokenRows& r) {
  const int64_t F = m.stem.kind == StemKind::identity ? m.d_model : m.stem.n_features;
  TokenRows& c = s.rows;
  const int64_t at = c.size(), n = r.size();
  if (r.kind == TSR_ROWS_FEATURES && !c.features.defined() && at == 0 && !several) {
    c = r;  // one plugin: the rows as they are
  } else {
    if (r.kind == TSR_ROWS_FEATURES || c.features.defined()) {
      Tensor f = Tensor::zeros({at + n, F});
      if (c.features.defined() && at > 0) f.slice(0, 0, at).copy_from(c.features);
      if (r.kind == TSR_ROWS_FEATURES) {
        const int64_t col = layout.column[p];
        f.slice(0, at, at + n).slice(1, col, col + r.features.dim(1)).copy_from(r.features);
      }
      c.features = f;
      c.kind = TSR_ROWS_FEATURES;
    } else {
      c.kind = TSR_ROWS_IDS;
    }
    c.ids.resize(static_cast<size_t>(at + n), 0);
    if (r.kind == TSR_ROWS_IDS)
      for (int64_t i = 0; i < n; ++i)
        c.ids[static_cast<size_t>(at + i)] = r.ids[static_cast<size_t>(i)] + static_cast<int32_t>(layout.id_offset[p]);
    c.positions.insert(c.positions.end(), r.positions.begin(), r.positions.end());
    c.roles.insert(c.roles.end(), r.roles.begin(), r.roles.end());
    c.provenance.insert(c.provenance.end(), r.provenance.begin(), r.provenance.end());
    if (c.picture.width == 0 && r.picture.width > 0) {
      c.picture = r.picture;
      c.grid_rows = r.grid_rows;
      c.grid_cols = r.grid_cols;
      s.picture_begin = at;
      s.picture_end = at + n;
    }
  }
  s.kinds.insert(s.kinds.end(), static_cast<size_t>(n), r.kind == TSR_ROWS_FEATURES ? 1 : 0);
  s.modality.insert(s.modality.end(), static_cast<size_t>(n), static_cast<int32_t>(p));
  s.parts.push_back({static_cast<int32_t>(p), at, at + n, r.grid_rows, r.grid_cols});
}

}  // namespace

ItemSequences encode_item(const Experiment& exp, const StemLayout& layout, const std::vector<Encoder>& encoders,
                          const DataItem& item, int64_t index, const std::vector<Result<std::string>>& bytes,
                          const AssembleOptions& options) {
  auto fail = [](const std::string& file, const std::string& reason) {
    ItemSequences bad;
    bad.file = file;
    bad.reason = reason;
    return bad;
  };
  if (!item.error.empty())
    return fail(!item.source.empty() ? item.source : item.parts.empty() ? std::string() : item.parts[0].path, item.error);
  std::vector<std::vector<TokenRows>> per_plugin(encoders.size());
  std::vector<size_t> given;  // the plugins with an input for this item
  for (size_t p = 0; p < encoders.size(); ++p) {
    const ItemPart& part = item.parts[p];
    if (part.missing) continue;
    if (!bytes[p].ok()) return fail(part.path, bytes[p].status().message());
    PluginItem pi;
    pi.id = item.id;
    pi.source = part.path;
    pi.data = bytes[p].value();
    pi.source_offset = part.offset;
    pi.source_line = part.line;
    Result<std::vector<TokenRows>> rows = encode_part(encoders[p], pi);
    if (!rows.ok()) return fail(part.path, rows.status().message());
    per_plugin[p] = std::move(rows).value();
    given.push_back(p);
  }
  if (given.empty()) return fail(item.source, "no input for any plugin");
  const bool several = encoders.size() > 1;
  const ModelConfig& m = exp.model;
  std::vector<Sequence> made;
  if (given.size() == 1) {  // one input: each of its sequences (windows) is a sequence
    const size_t p = given[0];
    for (TokenRows& r : per_plugin[p]) {
      made.emplace_back();
      made.back().item = index;
      made.back().id = r.label.empty() ? item.id : item.id + "/" + r.label;
      append_rows(m, layout, several, made.back(), p, r);
    }
  } else {  // several inputs: one sequence, their rows one after another
    for (size_t p : given)
      if (per_plugin[p].size() != 1)
        return fail(item.parts[p].path, "plugin " + encoders[p].plugin().name() + " gave " +
                                            std::to_string(per_plugin[p].size()) +
                                            " sequences; in a multimodal sequence each plugin gives one");
    made.emplace_back();
    made.back().item = index;
    made.back().id = item.id;
    for (size_t p : given) append_rows(m, layout, several, made.back(), p, per_plugin[p][0]);
  }
  // A sequence longer than the positions reach is a bad item (its batch would fail otherwise).
  const PositionConfig& pos = m.positions;
  if (options.check_max_len)
    for (const Sequence& s : made)
      if ((pos.kind == PositionKind::learned || pos.kind == PositionKind::sinusoidal) && s.rows.size() > pos.max_len)
        return fail(item.parts[given[0]].path,
                    std::to_string(s.rows.size()) + " rows, more than model.positions.max_len (" +
                        std::to_string(pos.max_len) +
                        "): give the plugin a maximum length and a length policy (truncate, windows), or raise max_len");
  for (Sequence& s : made) {
    if (m.stem.modalities <= 0) s.modality.clear();
    if (m.stem.kind != StemKind::mixed) s.kinds.clear();
  }
  ItemSequences out;
  out.seqs = std::move(made);
  return out;
}

int32_t sequence_task(const Experiment& exp, const Sequence* seqs, size_t n, std::string* why) {
  const auto& tasks = exp.model.head.tasks;
  std::vector<int32_t> found;
  std::string plugins;
  for (size_t i = 0; i < n; ++i)
    for (const SequencePart& part : seqs[i].parts) {
      if (part.end <= part.begin) continue;
      const std::string& name = exp.plugins[static_cast<size_t>(part.plugin)].name;
      if (plugins.find(name) == std::string::npos) plugins += (plugins.empty() ? "" : ", ") + name;
      for (size_t t = 0; t < tasks.size(); ++t)
        if (tasks[t].plugin == name && std::find(found.begin(), found.end(), static_cast<int32_t>(t)) == found.end())
          found.push_back(static_cast<int32_t>(t));
    }
  if (found.size() == 1) return found[0];
  if (found.empty())
    *why = "its rows come from plugin " + (plugins.empty() ? std::string("(none)") : plugins) +
           ", which no task of model.head.tasks labels (add a task for it, or leave such items out)";
  else
    *why = "its rows come from plugins of " + std::to_string(found.size()) + " tasks (" + tasks[found[0]].name + ", " +
           tasks[found[1]].name + "): a multi-task item belongs to one task (give it one input, data.allow_missing)";
  return -1;
}

}  // namespace tessera::run
