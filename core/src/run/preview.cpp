// Plugins against the model (stem layout, fit checks) and a look at a dataset before a run
// (`tessera check`): the parts of run.h that write nothing.
#include <algorithm>
#include <set>

#include "batcher.h"
#include "sequences.h"
#include "tessera/run.h"

namespace tessera {

using run::item_bytes;

// ---------------------------------------------------------------------------------------------
// Plugins against the model

StemLayout stem_layout(const std::vector<tsr_encoder_info>& plugins) {
  StemLayout L;
  for (const tsr_encoder_info& p : plugins) {
    L.id_offset.push_back(p.rows_kind == TSR_ROWS_IDS ? L.vocab : 0);
    L.column.push_back(p.rows_kind == TSR_ROWS_FEATURES ? L.width : 0);
    if (p.rows_kind == TSR_ROWS_IDS) L.vocab += p.vocab_size;
    else L.width += p.width;
  }
  return L;
}

void check_plugins_fit(const Experiment& exp, Diagnostics* diags) {
  const ModelConfig& m = exp.model;
  const StemConfig& s = m.stem;
  std::set<uint32_t> kinds;
  const bool several = exp.plugins.size() > 1;
  std::vector<std::pair<std::string, tsr_encoder_info>> infos;  // the plugins that loaded
  for (size_t i = 0; i < exp.plugins.size(); ++i) {
    const PluginConfig& pc = exp.plugins[i];
    const std::string key = "plugins[" + std::to_string(i) + "]";
    Result<std::shared_ptr<const Plugin>> p = Plugin::load(pc.file);
    if (!p.ok()) {
      diags->add(pc.where, key, p.status().message());
      continue;
    }
    Result<Encoder> e = Encoder::create(*p, pc.options);
    if (!e.ok()) {
      const std::string& msg = e.status().message();
      // A plugin that names its option at fault is reported at that option.
      Location at = pc.where;
      std::string k = key;
      for (const auto& [name, where] : pc.option_where)
        if (msg.find("option " + name + ":") != std::string::npos) {
          at = where;
          k = key + ".options." + name;
        }
      diags->add(at, k, msg);
      continue;
    }
    const tsr_encoder_info& info = e->info();
    kinds.insert(info.rows_kind);
    infos.emplace_back(pc.name, info);
    const std::string who = "plugin " + pc.name;
    if (info.rows_kind == TSR_ROWS_IDS) {
      if (s.kind != StemKind::tokens && s.kind != StemKind::mixed)
        diags->add(pc.where, key, who + " gives token ids, but model.stem.kind is " + stem_kind_name(s.kind),
                   "use stem.kind tokens (or mixed with feature plugins)");
      else if (info.vocab_size > s.vocab_size && !several)
        diags->add(pc.where, key,
                   who + "'s vocabulary has " + std::to_string(info.vocab_size) + " ids, more than model.stem.vocab_size (" +
                       std::to_string(s.vocab_size) + ")",
                   "raise stem.vocab_size, or give the plugin the model's vocabulary");
    } else {
      const int64_t F = s.kind == StemKind::identity ? m.d_model : s.n_features;
      if (s.kind == StemKind::tokens)
        diags->add(pc.where, key, who + " gives feature rows, but model.stem.kind is tokens",
                   "use stem.kind features (or mixed with token plugins)");
      else if (static_cast<int64_t>(info.width) != F && !several)
        diags->add(pc.where, key,
                   who + "'s rows are " + std::to_string(info.width) + " wide, but the model reads " + std::to_string(F) +
                       (s.kind == StemKind::identity ? " (d_model)" : " (model.stem.n_features)"),
                   "make them agree (e.g. the plugin's patch size and channels, or stem.n_features)");
    }
    const bool limited = m.positions.kind == PositionKind::learned || m.positions.kind == PositionKind::sinusoidal;
    if (limited && info.max_rows > m.positions.max_len && exp.plugins.size() == 1)
      diags->add(pc.where, key,
                 who + " can give " + std::to_string(info.max_rows) + " rows, more than model.positions.max_len (" +
                     std::to_string(m.positions.max_len) + ")",
                 "lower the plugin's maximum length, or raise positions.max_len");
  }
  // Several plugins share the stem in disjoint parts: ids after the earlier token plugins'
  // vocabularies, features in columns after the earlier feature plugins' widths (see layout).
  if (several && infos.size() == exp.plugins.size()) {
    std::vector<tsr_encoder_info> only;
    for (const auto& [name, info] : infos) only.push_back(info);
    const StemLayout L = stem_layout(only);
    std::string ids, cols;
    for (size_t i = 0; i < infos.size(); ++i) {
      const tsr_encoder_info& info = infos[i].second;
      std::string& to = info.rows_kind == TSR_ROWS_IDS ? ids : cols;
      const int64_t at = info.rows_kind == TSR_ROWS_IDS ? L.id_offset[i] : L.column[i];
      const int64_t n = info.rows_kind == TSR_ROWS_IDS ? info.vocab_size : info.width;
      to += (to.empty() ? "" : ", ") + infos[i].first + " " + std::to_string(at) + ".." + std::to_string(at + n - 1);
    }
    if (L.vocab > 0 && L.vocab > s.vocab_size && (s.kind == StemKind::tokens || s.kind == StemKind::mixed))
      diags->add(exp.where("model.stem.vocab_size"), "model.stem.vocab_size",
                 "the token plugins' ids take " + std::to_string(L.vocab) + " embedding rows (" + ids +
                     "), more than vocab_size " + std::to_string(s.vocab_size),
                 "each token plugin has its own block of ids: raise vocab_size to at least " + std::to_string(L.vocab));
    const int64_t F = s.kind == StemKind::identity ? m.d_model : s.n_features;
    if (L.width > 0 && L.width != F && s.kind != StemKind::tokens)
      diags->add(exp.where(s.kind == StemKind::identity ? "model.d_model" : "model.stem.n_features"),
                 s.kind == StemKind::identity ? "model.d_model" : "model.stem.n_features",
                 "the feature plugins' rows fill " + std::to_string(L.width) + " columns (" + cols + "), but the model reads " +
                     std::to_string(F),
                 "each feature plugin has its own columns: make n_features their sum, " + std::to_string(L.width));
  }
  // model.head.tasks: each task labels the items of one of the experiment's plugins.
  for (size_t i = 0; i < m.head.tasks.size(); ++i) {
    const HeadTask& t = m.head.tasks[i];
    std::vector<std::string> names;
    for (const PluginConfig& pc : exp.plugins) names.push_back(pc.name);
    if (std::find(names.begin(), names.end(), t.plugin) != names.end()) continue;
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    diags->add(t.where, "model.head.tasks[" + std::to_string(i) + "].plugin",
               "task " + t.name + " labels the items of plugin \"" + t.plugin + "\", which is not one of the experiment's "
               "plugins (" + (list.empty() ? std::string("none") : list) + ")",
               "name one of the plugins listed under plugins:");
  }
  if (kinds.size() > 1 && s.kind != StemKind::mixed)
    diags->add(exp.where("model.stem.kind"), "model.stem.kind",
               "the plugins give both token ids and feature rows, which needs stem.kind mixed");
  if (s.modalities > 0 && s.modalities < static_cast<int64_t>(exp.plugins.size()))
    diags->add(exp.where("model.stem.modalities"), "model.stem.modalities",
               std::to_string(s.modalities) + " modality embeddings for " + std::to_string(exp.plugins.size()) + " plugins",
               "give at least one per plugin");
}

Result<std::string> item_part_bytes(const ItemPart& part, int64_t max_bytes) { return item_bytes(part, max_bytes); }

Result<DatasetPreview> preview_dataset(const Experiment& exp, int64_t max_items) {
  std::vector<Encoder> encs;
  std::vector<PluginInput> inputs;
  std::vector<tsr_encoder_info> infos;
  for (const PluginConfig& pc : exp.plugins) {
    Result<std::shared_ptr<const Plugin>> p = Plugin::load(pc.file);
    if (!p.ok()) return p.status();
    Result<Encoder> e = Encoder::create(*p, pc.options);
    if (!e.ok()) return e.status();
    inputs.push_back({(*p)->name(), (*p)->input_kind(), (*p)->extensions()});
    infos.push_back(e->info());
    encs.push_back(std::move(e).value());
  }
  Result<std::vector<DataItem>> items = read_dataset(exp.data, inputs);
  if (!items.ok()) return items.status().with_prefix("data.path");
  const StemLayout layout = stem_layout(infos);
  // The sequences a run would make (run::encode_item, as the batcher and the trainer call it); the
  // caller weighs their lengths against the positions, so none is refused for its length here.
  run::AssembleOptions options;
  options.check_max_len = false;
  DatasetPreview v;
  v.items = static_cast<int64_t>(items->size());
  for (const DataItem& item : *items) {
    if (v.sampled == max_items) break;
    const run::ItemSequences made = run::encode_item(exp, layout, encs, item, v.sampled,
                                                     run::read_parts(item, exp.runtime.max_item_bytes), options);
    ++v.sampled;
    if (!made.ok()) {
      v.errors.push_back(item.id + ": " + (made.file.empty() ? "" : made.file + ": ") + made.reason);
      continue;
    }
    for (const run::Sequence& s : made.seqs) v.rows.push_back(s.rows.size());
  }
  return v;
}

}  // namespace tessera
