// The batch runner behind `tessera run`: items -> plugins -> batches -> model -> outputs, one batch
// at a time, each committed atomically before the manifest records it with a hash of its items'
// bytes, so a killed run resumes where it stopped and a resume redoes the batches whose items
// changed. Plugins decode the next batch on worker threads while the model runs.
// Dataset listing is dataset.cpp's; heatmaps are heatmap.cpp's.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "heatmap.h"
#include "tessera/fileio.h"
#include "tessera/npy.h"
#include "tessera/run.h"

namespace tessera {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// 2: each finished batch with the hash of its items' content, and the files the plugins read.
// (1: batch numbers only.)
constexpr int kManifestFormat = 2;

// One sequence ready for the model: an item's rows (all its plugins' rows, concatenated), or one
// window of an item.
struct Sequence {
  int64_t item = 0;
  std::string id;
  TokenRows rows;
  std::vector<uint8_t> kinds;      // per row: 0 token row, 1 feature row
  std::vector<int32_t> modality;   // per row: the plugin it came from
  int64_t picture_begin = 0, picture_end = -1;  // the rows of the plugin that drew rows.picture; -1: all
};

struct ItemError {
  int64_t item = 0;
  std::string id, file, reason;
};

struct EncodedBatch {
  std::vector<Sequence> seqs;
  std::vector<ItemError> errors;
  uint64_t content = 0;  // the hash of its items' content, as they were read to be encoded (batch_content)
  std::vector<std::pair<int64_t, uint64_t>> item_hashes;  // (item, item_content_hash), while encoding
};


// One JSON line. Text that is not UTF-8 (a token that is a lone byte, a Latin-1 file name) is
// written with U+FFFD in place of the bad bytes rather than refused.
std::string jsonl_line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

std::string batch_name(int64_t k) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "batch-%06lld", static_cast<long long>(k));
  return buf;
}

// A file name for an item id: readable, and unique through a hash of the id.
std::string safe_name(const std::string& id) {
  std::string s;
  for (char c : id) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  if (s.size() > 80) s = s.substr(s.size() - 80);
  return s + "-" + hex64(fnv1a(id.data(), id.size(), kFnvOffset)).substr(0, 8);
}

Result<std::string> item_bytes(const ItemPart& p) {
  if (p.in_memory) return p.bytes;
  if (p.path.empty()) return p.text;
  if (!p.is_text || p.offset == 0) {
    Result<std::string> all = read_file(p.path);
    if (!all.ok() || !p.is_text || all->size() == p.length) return all;
  }
  std::ifstream f(p.path, std::ios::binary);
  std::string buf(p.length, '\0');
  if (!f || !f.seekg(static_cast<std::streamoff>(p.offset)) || !f.read(buf.data(), static_cast<std::streamsize>(p.length)))
    return Status::IoError(p.path + ": cannot read bytes " + std::to_string(p.offset) + ".." +
                           std::to_string(p.offset + p.length));
  return buf;
}

// An item's inputs as its plugins get them: each part's bytes, or why they cannot be read (empty
// for a missing part). Nothing is read for an item that is broken before any plugin sees it.
std::vector<Result<std::string>> read_parts(const DataItem& item) {
  std::vector<Result<std::string>> v;
  if (!item.error.empty()) return v;
  for (const ItemPart& p : item.parts) v.push_back(p.missing ? Result<std::string>(std::string()) : item_bytes(p));
  return v;
}

// FNV-1a of a length and then its bytes, so that ("ab", "c") and ("a", "bc") differ.
uint64_t hash_field(std::string_view s, uint64_t h) {
  const uint64_t n = s.size();
  return fnv1a(s.data(), s.size(), fnv1a(&n, sizeof n, h));
}

// What an item's outputs are computed from, besides the configuration: its id, name and label
// (they are written beside its outputs), the error it was listed with, and per input its file,
// first line (plugins name it in their errors) and bytes, or why they could not be read. Not the
// byte offset in a text file: editing one line leaves the other lines' items as they were.
uint64_t item_content_hash(const DataItem& item, const std::vector<Result<std::string>>& bytes) {
  uint64_t h = hash_field(item.id, kFnvOffset);
  h = hash_field(item.name, h);
  h = hash_field(item.label ? "1" + *item.label : "0", h);
  h = hash_field(item.error, h);
  h = hash_field(item.source, h);
  for (size_t p = 0; p < bytes.size(); ++p) {
    const ItemPart& part = item.parts[p];
    h = hash_field(part.missing     ? "missing"
                   : part.in_memory ? "in memory"
                   : part.is_text   ? "text"
                                    : "file",
                   h);
    h = hash_field(part.path, h);
    h = hash_field(std::to_string(part.line), h);
    h = bytes[p].ok() ? hash_field(bytes[p].value(), hash_field("bytes", h))
                      : hash_field(bytes[p].status().message(), hash_field("unreadable", h));
  }
  return h;
}

// A batch's content: its items' hashes in item order.
uint64_t batch_content(const std::vector<uint64_t>& item_hashes) {
  uint64_t h = kFnvOffset;
  for (uint64_t x : item_hashes) h = fnv1a(&x, sizeof x, h);
  return h;
}

// A file's bytes hashed (a folder: each file below it, by name, in order), or, when it cannot be
// read, a hash of why.
std::string file_hash(const std::string& path) {
  std::error_code ec;
  uint64_t h = kFnvOffset;
  auto add_file = [&h](const fs::path& file) {
    std::ifstream f(file, std::ios::binary);
    if (!f) {
      h = hash_field("unreadable", h);
      return;
    }
    std::vector<char> buf(1 << 16);
    uint64_t n = 0;
    while (f.read(buf.data(), static_cast<std::streamsize>(buf.size())) || f.gcount() > 0) {
      h = fnv1a(buf.data(), static_cast<size_t>(f.gcount()), h);
      n += static_cast<uint64_t>(f.gcount());
    }
    h = fnv1a(&n, sizeof n, h);
  };
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec)) files.push_back(it->path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      h = hash_field(fs::relative(f, path, ec).string(), h);
      add_file(f);
    }
  } else if (fs::exists(path, ec)) {
    add_file(path);
  } else {
    h = hash_field("missing", h);
  }
  return hex64(h);
}

const char* role_name(uint8_t r) {
  static const char* names[] = {"content", "cls", "eos", "pad", "mask", "sep", "bos", "unk"};
  return r < 8 ? names[r] : "?";
}

json provenance_json(const Sequence& s) {
  json rows = json::array();
  for (int64_t i = 0; i < s.rows.size(); ++i) {
    const tsr_provenance& p = s.rows.provenance[static_cast<size_t>(i)];
    json r = {{"role", role_name(s.rows.roles[static_cast<size_t>(i)])},
              {"pos", {s.rows.positions[static_cast<size_t>(i)][0], s.rows.positions[static_cast<size_t>(i)][1]}}};
    const bool token_row = s.kinds.empty() ? s.rows.kind == TSR_ROWS_IDS : s.kinds[static_cast<size_t>(i)] == 0;
    if (token_row && !s.rows.ids.empty()) r["token"] = s.rows.ids[static_cast<size_t>(i)];  // as the model sees it
    switch (p.kind) {
      case TSR_PROV_BYTES: r["bytes"] = {static_cast<int64_t>(p.x0), static_cast<int64_t>(p.x1)}; break;
      case TSR_PROV_PIXELS: r["pixels"] = {p.x0, p.y0, p.x1, p.y1}; break;
      case TSR_PROV_TIME_FREQ: r["seconds"] = {p.x0, p.x1}, r["mel_bands"] = {p.y0, p.y1}; break;
      case TSR_PROV_RESIDUE: r["residues"] = {static_cast<int64_t>(p.x0), static_cast<int64_t>(p.x1)}; break;
      default: break;
    }
    if (!s.modality.empty()) r["plugin"] = s.modality[static_cast<size_t>(i)];
    rows.push_back(std::move(r));
  }
  return rows;
}

class Progress {
 public:
  Progress(bool on, int64_t total) : on_(on), total_(total), tty_(isatty(2)), start_(now()), last_(start_) {}
  void update(int64_t done, int64_t failed, bool final = false) {
    if (!on_) return;
    const double t = now();
    const double every = tty_ ? 0.5 : 10.0;
    if (!final && t - last_ < every) return;
    last_ = t;
    const double rate = (done - first_done_) / std::max(t - start_, 1e-9);
    const double eta = rate > 0 ? (total_ - done) / rate : 0;
    std::fprintf(stderr, "%srun: %lld/%lld items (%.0f %%), %.1f items/s, ETA %.0f s, %lld failed%s",
                 tty_ ? "\r" : "", static_cast<long long>(done), static_cast<long long>(total_),
                 total_ ? 100.0 * done / total_ : 100.0, rate, eta, static_cast<long long>(failed),
                 tty_ && !final ? "   " : "\n");
    std::fflush(stderr);
  }
  void resumed_at(int64_t done) { first_done_ = done; }

 private:
  static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
  bool on_;
  int64_t total_;
  bool tty_;
  double start_, last_;
  int64_t first_done_ = 0;
};

}  // namespace

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
  if (kinds.size() > 1 && s.kind != StemKind::mixed)
    diags->add(exp.where("model.stem.kind"), "model.stem.kind",
               "the plugins give both token ids and feature rows, which needs stem.kind mixed");
  if (s.modalities > 0 && s.modalities < static_cast<int64_t>(exp.plugins.size()))
    diags->add(exp.where("model.stem.modalities"), "model.stem.modalities",
               std::to_string(s.modalities) + " modality embeddings for " + std::to_string(exp.plugins.size()) + " plugins",
               "give at least one per plugin");
}

Result<std::string> item_part_bytes(const ItemPart& part) { return item_bytes(part); }

Result<DatasetPreview> preview_dataset(const Experiment& exp, int64_t max_items) {
  std::vector<std::shared_ptr<const Plugin>> plugins;
  std::vector<Encoder> encs;
  std::vector<PluginInput> inputs;
  for (const PluginConfig& pc : exp.plugins) {
    Result<std::shared_ptr<const Plugin>> p = Plugin::load(pc.file);
    if (!p.ok()) return p.status();
    Result<Encoder> e = Encoder::create(*p, pc.options);
    if (!e.ok()) return e.status();
    inputs.push_back({(*p)->name(), (*p)->input_kind(), (*p)->extensions()});
    plugins.push_back(*p);
    encs.push_back(std::move(e).value());
  }
  Result<std::vector<DataItem>> items = read_dataset(exp.data, inputs);
  if (!items.ok()) return items.status().with_prefix("data.path");
  DatasetPreview v;
  v.items = static_cast<int64_t>(items->size());
  for (const DataItem& item : *items) {
    if (v.sampled == max_items) break;
    ++v.sampled;
    if (!item.error.empty()) {
      v.errors.push_back(item.id + ": " + item.error);
      continue;
    }
    std::vector<std::vector<TokenRows>> got;
    std::string error;
    for (size_t p = 0; p < encs.size() && error.empty(); ++p) {
      const ItemPart& part = item.parts[p];
      if (part.missing) continue;
      Result<std::string> bytes = item_bytes(part);
      PluginItem pi;
      pi.id = item.id;
      pi.source = part.path;
      if (bytes.ok()) pi.data = *bytes;
      pi.source_offset = part.offset;
      pi.source_line = part.line;
      Result<std::vector<TokenRows>> rows = bytes.ok() ? encs[p].encode(pi) : Result<std::vector<TokenRows>>(bytes.status());
      if (!rows.ok()) error = (part.path.empty() ? "" : part.path + ": ") + rows.status().message();
      else got.push_back(std::move(rows).value());
    }
    if (error.empty() && got.size() > 1)
      for (const auto& g : got)
        if (g.size() != 1) error = "a plugin gave " + std::to_string(g.size()) + " sequences; in a multimodal sequence each plugin gives one";
    if (!error.empty()) {
      v.errors.push_back(item.id + ": " + error);
      continue;
    }
    if (got.size() == 1) {
      for (const TokenRows& r : got[0]) v.rows.push_back(r.size());
    } else {
      int64_t n = 0;
      for (const auto& g : got) n += g[0].size();
      v.rows.push_back(n);
    }
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// The run

namespace {

class Runner {
 public:
  Runner(const Experiment& exp, const RunOptions& opt) : exp_(exp), opt_(opt) {}
  Result<RunSummary> run();

 private:
  Status setup();
  Status open_folder();
  EncodedBatch encode_batch(int64_t k);
  void encode_item(int64_t index, std::vector<Encoder>& encs, EncodedBatch* out) const;
  Status run_batch(int64_t k, const EncodedBatch& eb);
  Status generate_records(const std::vector<Sequence>& seqs, std::vector<json>* records) const;
  Status write_attention(const Sequence& s, int64_t b, int64_t start, const Outputs& out) const;
  Status write_manifest(const std::string& state) const;
  Status check_resume(const json& m);
  uint64_t content_now(int64_t k) const;
  Status unmerge(const std::set<int64_t>& keep);
  Status finalize();
  Status prune_attention(const std::vector<std::string>& ids) const;
  std::string class_name(int64_t k) const;

  const Experiment& exp_;
  const RunOptions& opt_;
  std::optional<Model> model_;
  std::vector<std::shared_ptr<const Plugin>> plugins_;
  std::vector<std::vector<Encoder>> encoders_;  // [worker][plugin]
  std::optional<Encoder> decoder_;               // generate: the new tokens' text, apart from the workers'
  GenerateOptions generate_;                     // generate: task.generate
  StemLayout layout_;                            // where each plugin's ids and columns go
  std::vector<DataItem> items_;
  std::vector<std::string> class_names_;
  fs::path dir_;
  std::string config_hash_, model_hash_;
  int64_t batch_size_ = 1, batches_ = 0;
  std::set<int64_t> done_;
  std::map<int64_t, std::string> content_;  // per batch done: the hash of its items' content
  struct DataFile {
    std::string what, path, hash;  // "plugin text's option vocab", its absolute path, file_hash()
  };
  std::vector<DataFile> files_;  // what the plugins read besides the items: their libraries, the files their options name
  RunSummary summary_;
  int64_t items_done_ = 0;
  double model_seconds_ = 0;  // in the model: forward passes and heads (generate: the whole generation)
  bool complete_ = false;  // --resume found the run finished
};

Status Runner::setup() {
  if (exp_.plugins.empty()) return Status::Invalid(exp_.file + ": no plugins: list the modality plugins under plugins:");
  Diagnostics diags;
  check_plugins_fit(exp_, &diags);
  if (!diags.empty()) return Status::Invalid(diags.str());
  const int workers = std::max(1, exp_.runtime.workers);
  for (const PluginConfig& pc : exp_.plugins) {
    Result<std::shared_ptr<const Plugin>> p = Plugin::load(pc.file);
    if (!p.ok()) return p.status();
    plugins_.push_back(*p);
  }
  encoders_.resize(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w)
    for (size_t i = 0; i < plugins_.size(); ++i) {
      Result<Encoder> e = Encoder::create(plugins_[i], exp_.plugins[i].options);
      if (!e.ok()) return e.status();
      encoders_[static_cast<size_t>(w)].push_back(std::move(e).value());
    }
  // Plugins encode in worker processes, forked now, before the model's threads start: an item
  // that crashes, hangs or floods a plugin becomes one bad item (docs/PLUGINS.md, hostile items).
  const ItemLimits limits;  // runtime.item_timeout_s, worker_memory_mb, max_item_bytes, max_item_rows
  for (std::vector<Encoder>& per_worker : encoders_)
    for (Encoder& e : per_worker) TSR_RETURN_IF_ERROR(e.isolate(limits));
  std::vector<tsr_encoder_info> infos;
  for (const Encoder& e : encoders_[0]) infos.push_back(e.info());
  layout_ = stem_layout(infos);
  set_num_threads(exp_.runtime.threads);
  Result<Model> m = Model::build(exp_.model);
  if (!m.ok()) return m.status().with_prefix(exp_.file);
  model_.emplace(std::move(m).value());

  std::vector<PluginInput> inputs;
  for (const auto& p : plugins_) inputs.push_back({p->name(), p->input_kind(), p->extensions()});
  Result<std::vector<DataItem>> items = read_dataset(exp_.data, inputs);
  if (!items.ok()) return items.status().with_prefix("data.path");
  items_ = std::move(items).value();

  const TaskKind task = exp_.task.kind;
  if (task == TaskKind::classify && exp_.model.head.kind != HeadKind::classifier)
    return Status::Invalid("task.kind classify needs a model with head.kind classifier");
  if (task == TaskKind::score && exp_.model.head.kind != HeadKind::lm)
    return Status::Invalid("task.kind score needs a language model (head.kind lm)");
  if (task == TaskKind::score && !exp_.model.causal)
    return Status::Invalid("task.kind score needs a causal model: next-token probabilities from a model that sees the "
                           "next token mean nothing (set model.arch: decoder, or model.causal: true)");
  if (task == TaskKind::generate) {
    if (exp_.model.head.kind != HeadKind::lm || !exp_.model.causal)
      return Status::Invalid("task.kind generate needs a causal language model (model.arch: decoder, head.kind lm)");
    if (exp_.runtime.packing)
      return Status::Invalid("task.kind generate decodes each batch's prompts side by side, one per batch row: set "
                             "runtime.packing: false");
    if (!exp_.task.attention.layers.empty())
      return Status::Invalid("task.kind generate exports no attention maps: remove task.attention.layers");
    Result<Encoder> dec = generation_encoder(exp_);
    if (!dec.ok()) return dec.status();
    decoder_.emplace(std::move(dec).value());
    generate_ = generate_options(exp_.task.generate);
    generate_.reference = exp_.runtime.reference;
    generate_.decode = [this](const std::vector<int32_t>& ids) { return decoder_->decode(ids); };
    TSR_RETURN_IF_ERROR(check_generate_options(generate_));
  }
  for (int64_t l : exp_.task.attention.layers)
    if (l >= exp_.model.n_layers)
      return Status::OutOfRange("task.attention.layers: layer " + std::to_string(l) + " does not exist (the model has " +
                                std::to_string(exp_.model.n_layers) + ")");
  for (int64_t h : exp_.task.attention.heads)
    if (h >= exp_.model.n_heads)
      return Status::OutOfRange("task.attention.heads: head " + std::to_string(h) + " does not exist (the model has " +
                                std::to_string(exp_.model.n_heads) + ")");
  if (task == TaskKind::classify) {
    if (!exp_.task.labels.empty()) {
      Result<std::string> text = read_file(exp_.task.labels);
      if (!text.ok()) return text.status();
      std::string line;
      for (char c : *text + "\n") {
        if (c == '\n') {
          if (!line.empty() && line.back() == '\r') line.pop_back();
          if (!line.empty()) class_names_.push_back(line);
          line.clear();
        } else {
          line += c;
        }
      }
      if (static_cast<int64_t>(class_names_.size()) != exp_.model.head.n_classes)
        return Status::Invalid(exp_.task.labels + ": " + std::to_string(class_names_.size()) + " labels for " +
                               std::to_string(exp_.model.head.n_classes) + " classes (model.head.n_classes)");
    } else {
      class_names_ = exp_.model.head.labels;
    }
  }

  // What decides the outputs, hashed: the resolved experiment without where the outputs go and
  // how many threads decode; and every parameter's bytes.
  Experiment canon = exp_;
  canon.outputs.dir.clear();
  canon.runtime.workers = 0;
  const std::string yaml = to_yaml(canon);
  config_hash_ = hex64(fnv1a(yaml.data(), yaml.size(), kFnvOffset));
  uint64_t h = kFnvOffset;
  for (const auto& [name, t] : model_->parameters()) {
    const Tensor c = t.contiguous();
    h = fnv1a(c.raw_data(), c.nbytes(), fnv1a(name.data(), name.size(), h));
  }
  model_hash_ = hex64(h);
  // The files behind the configuration's names, by their bytes: each plugin's library and the
  // files its options name (vocabularies, merges), and the class names.
  for (const PluginConfig& pc : exp_.plugins) {
    files_.push_back({"plugin " + pc.name + "'s library", pc.file, file_hash(pc.file)});
    for (size_t i = 0; i < pc.options.size() && i < pc.option_types.size(); ++i)
      if (pc.option_types[i] == TSR_OPT_PATH && !pc.options[i].second.empty())
        files_.push_back({"plugin " + pc.name + "'s option " + pc.options[i].first, pc.options[i].second,
                          file_hash(pc.options[i].second)});
  }
  if (!exp_.task.labels.empty()) files_.push_back({"task.labels", exp_.task.labels, file_hash(exp_.task.labels)});
  batch_size_ = exp_.runtime.batch_size;
  batches_ = (static_cast<int64_t>(items_.size()) + batch_size_ - 1) / batch_size_;
  return open_folder();
}

Status Runner::open_folder() {
  std::string d = opt_.out_dir.empty() ? exp_.outputs.dir : opt_.out_dir;
  if (d.empty()) d = "runs/" + fs::path(exp_.file).stem().string();
  dir_ = fs::path(d);
  summary_.dir = dir_.string();
  std::error_code ec;
  const fs::path manifest = dir_ / "manifest.json";
  if (fs::exists(manifest, ec)) {
    if (opt_.force) {
      for (const char* leaf : {"shards", "attention"}) fs::remove_all(dir_ / leaf, ec);
      for (const char* leaf : {"manifest.json", "errors.jsonl", "index.jsonl", "predictions.jsonl", "completions.jsonl",
                               "rows.jsonl", "embeddings.npy", "hidden.npy"})
        fs::remove(dir_ / leaf, ec);
    } else if (!opt_.resume) {
      return Status::Invalid(dir_.string() + " already holds a run (manifest.json): continue it with --resume, or start "
                             "over with --force, or choose another folder with --out");
    } else {
      Result<std::string> text = read_file(manifest.string());
      if (!text.ok()) return text.status();
      json m = json::parse(*text, nullptr, false);
      if (m.is_discarded() || !m.is_object())
        return Status::ParseError(manifest.string() + ": not a valid manifest (start over with --force)");
      // A value of the wrong type in a run's files (edited by hand, say) is a refusal, not an abort.
      Status resumed = Status::Ok();
      try {
        resumed = check_resume(m);
      } catch (const json::exception& e) {
        resumed = Status::ParseError(manifest.string() + " (or an output beside it): a value of the wrong type: " +
                                     e.what() + " (start over with --force)");
      }
      TSR_RETURN_IF_ERROR(resumed);
      if (complete_) return Status::Ok();
    }
  }
  fs::create_directories(dir_ / "shards", ec);
  if (ec) return Status::IoError(dir_.string() + ": cannot create the run folder: " + ec.message());
  if (!exp_.task.attention.layers.empty()) fs::create_directories(dir_ / "attention", ec);
  return write_manifest("running");
}

// --resume: refuses when what the outputs are computed from changed (the configuration, the
// weights, the plugins and the files they read, the number of items), and otherwise keeps the
// finished batches whose items are as they were and redoes the others. A finished run whose
// items changed is cut back into shards first (unmerge), so that it is merged again at the end.
Status Runner::check_resume(const json& m) {
  const std::string cannot = "cannot resume " + dir_.string() + ": ";
  const std::string fresh = "start over with --force, or run into another folder with --out";
  const int64_t format = m.value("format", int64_t{0});
  if (format < kManifestFormat)
    return Status::Invalid(cannot + "its manifest.json (format " + std::to_string(format) +
                           ") does not record what each finished batch was computed from, so a resume cannot tell "
                           "which of them are stale (it was written by an earlier tessera); " + fresh);
  if (format > kManifestFormat)
    return Status::Invalid(cannot + "its manifest.json has format " + std::to_string(format) + ", newer than this "
                           "tessera's (" + std::to_string(kManifestFormat) + "); resume it with the tessera that started "
                           "it, or " + fresh);
  auto refuse = [&](const std::string& what, const std::string& then, const std::string& now) {
    return Status::Invalid(cannot + what + " changed since the run started (" + then + " then, " + now + " now); " + fresh);
  };
  if (m.value("config_hash", "") != config_hash_)
    return refuse("the experiment's configuration", m.value("config_hash", "?"), config_hash_);
  if (m.value("model_hash", "") != model_hash_) return refuse("the model's weights", m.value("model_hash", "?"), model_hash_);
  if (m.value("items", int64_t{-1}) != static_cast<int64_t>(items_.size()))
    return refuse("the dataset", std::to_string(m.value("items", int64_t{-1})) + " items",
                  std::to_string(items_.size()) + " items");
  std::string then_plugins, now_plugins;
  for (const auto& pl : m.value("plugins", json::array()))
    then_plugins += (then_plugins.empty() ? "" : ", ") + pl.value("name", "?") + " " + pl.value("version", "?");
  for (const auto& pl : plugins_) now_plugins += (now_plugins.empty() ? "" : ", ") + pl->name() + " " + pl->version();
  if (then_plugins != now_plugins) return refuse("the plugins", then_plugins, now_plugins);
  std::map<std::string, std::string> then_files;  // path -> hash
  for (const auto& f : m.value("files", json::array()))
    if (f.is_object()) then_files[f.value("path", "")] = f.value("hash", "");
  for (const DataFile& f : files_) {
    auto it = then_files.find(f.path);
    if (it == then_files.end() || it->second != f.hash)
      return refuse("the file " + f.path + " (" + f.what + ")", it == then_files.end() ? "not recorded" : it->second, f.hash);
  }

  // The finished batches, each with what it was computed from.
  std::map<int64_t, std::string> then_content;
  for (const auto& d : m.value("done", json::array())) {
    const bool ok = d.is_array() && d.size() == 2 && d[0].is_number_integer() && d[1].is_string() &&
                    d[0].get<int64_t>() >= 0 && d[0].get<int64_t>() < batches_;
    if (!ok)
      return Status::Invalid(cannot + "its manifest.json lists a finished batch as " + d.dump() +
                             ", not [batch, content hash], so a resume cannot tell whether it is stale; " + fresh);
    then_content[d[0].get<int64_t>()] = d[1].get<std::string>();
  }
  std::set<int64_t> changed;
  for (const auto& [k, c] : then_content) {
    if (hex64(content_now(k)) != c) {
      changed.insert(k);
      continue;
    }
    done_.insert(k);
    content_[k] = c;
  }
  const bool complete = m.value("state", "") == "complete";
  summary_.batches_resumed = static_cast<int64_t>(done_.size());
  summary_.batches_redone = static_cast<int64_t>(changed.size());
  std::error_code ec;
  if (complete && changed.empty()) {  // nothing left to do: leave the run as it is
    complete_ = true;
    summary_.sequences = m.value("sequences", int64_t{0});
    summary_.failed = m.value("failed", int64_t{0});
    fs::remove_all(dir_ / "shards", ec);  // left by a resume that was killed while it cut the outputs (unmerge)
    return Status::Ok();
  }
  if (!changed.empty() && opt_.progress)
    std::fprintf(stderr, "run: resume: %zu of %zu finished batches changed since they were written; redoing them\n",
                 changed.size(), then_content.size());
  if (complete) {
    fs::create_directories(dir_ / "shards", ec);
    if (ec) return Status::IoError(dir_.string() + ": cannot create " + (dir_ / "shards").string() + ": " + ec.message());
    TSR_RETURN_IF_ERROR(unmerge(done_).with_prefix(cannot.substr(0, cannot.size() - 2)));
  }
  return Status::Ok();
}

// Batch k's content as its items are now (the hash encode_batch() would give).
uint64_t Runner::content_now(int64_t k) const {
  const int64_t begin = k * batch_size_, end = std::min<int64_t>(begin + batch_size_, static_cast<int64_t>(items_.size()));
  std::vector<uint64_t> hashes;
  for (int64_t i = begin; i < end; ++i) {
    const DataItem& item = items_[static_cast<size_t>(i)];
    hashes.push_back(item_content_hash(item, read_parts(item)));
  }
  return batch_content(hashes);
}

Status Runner::write_manifest(const std::string& state) const {
  json plugins = json::array();
  for (size_t i = 0; i < plugins_.size(); ++i)
    plugins.push_back({{"name", plugins_[i]->name()}, {"version", plugins_[i]->version()}, {"modality", plugins_[i]->modality()}});
  json files = json::array();
  for (const DataFile& f : files_) files.push_back({{"what", f.what}, {"path", f.path}, {"hash", f.hash}});
  json done = json::array();
  for (int64_t k : done_) done.push_back(json::array({k, content_.at(k)}));
  json m = {{"format", kManifestFormat},
            {"experiment", exp_.file},
            {"config_hash", config_hash_},
            {"model_hash", model_hash_},
            {"plugins", plugins},
            {"task", task_kind_name(exp_.task.kind)},
            {"items", items_.size()},
            {"batch_size", batch_size_},
            {"batches", batches_},
            {"files", files},
            {"done", done},
            {"state", state}};
  if (state == "complete") {
    m["sequences"] = summary_.sequences;
    m["failed"] = summary_.failed;
  }
  // One key per line, each value on its line: rewritten after every batch, it grows by one short
  // pair per batch.
  std::string text = "{\n";
  for (auto it = m.begin(); it != m.end(); ++it)
    text += "  " + json(it.key()).dump() + ": " + it.value().dump(-1, ' ', false, json::error_handler_t::replace) +
            (std::next(it) == m.end() ? "\n" : ",\n");
  return write_file_atomic((dir_ / "manifest.json").string(), text + "}\n");
}

void Runner::encode_item(int64_t index, std::vector<Encoder>& encs, EncodedBatch* out) const {
  const DataItem& item = items_[static_cast<size_t>(index)];
  auto fail = [&](const std::string& file, const std::string& reason) {
    out->errors.push_back({index, item.id, file, reason});
  };
  // Read once: what the plugins encode is what the manifest records as the item's content.
  const std::vector<Result<std::string>> bytes = read_parts(item);
  out->item_hashes.emplace_back(index, item_content_hash(item, bytes));
  if (!item.error.empty())
    return fail(!item.source.empty() ? item.source : item.parts.empty() ? std::string() : item.parts[0].path, item.error);
  std::vector<std::vector<TokenRows>> per_plugin(encs.size());
  std::vector<size_t> given;  // the plugins with an input for this item
  for (size_t p = 0; p < encs.size(); ++p) {
    const ItemPart& part = item.parts[p];
    if (part.missing) continue;
    if (!bytes[p].ok()) return fail(part.path, bytes[p].status().message());
    PluginItem pi;
    pi.id = item.id;
    pi.source = part.path;
    pi.data = bytes[p].value();
    pi.source_offset = part.offset;
    pi.source_line = part.line;
    Result<std::vector<TokenRows>> rows = encs[p].encode(pi);
    if (!rows.ok()) return fail(part.path, rows.status().message());
    per_plugin[p] = std::move(rows).value();
    given.push_back(p);
  }
  const bool mixed = exp_.model.stem.kind == StemKind::mixed;
  const bool modal = exp_.model.stem.modalities > 0;
  const bool several = encs.size() > 1;
  const int64_t F = exp_.model.stem.kind == StemKind::identity ? exp_.model.d_model : exp_.model.stem.n_features;
  // Appends plugin p's rows to c in the stem's layout: ids shifted into its block, features into
  // its columns.
  auto append = [&](Sequence& s, size_t p, const TokenRows& r) {
    TokenRows& c = s.rows;
    const int64_t at = c.size(), n = r.size();
    if (r.kind == TSR_ROWS_FEATURES && !c.features.defined() && at == 0 && !several) {
      c = r;  // one plugin: the rows as they are
    } else {
      if (r.kind == TSR_ROWS_FEATURES || c.features.defined()) {
        Tensor f = Tensor::zeros({at + n, F});
        if (c.features.defined() && at > 0) f.slice(0, 0, at).copy_from(c.features);
        if (r.kind == TSR_ROWS_FEATURES) {
          const int64_t col = layout_.column[p];
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
          c.ids[static_cast<size_t>(at + i)] = r.ids[static_cast<size_t>(i)] + static_cast<int32_t>(layout_.id_offset[p]);
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
  };
  if (given.empty()) return fail(item.source, "no input for any plugin");
  std::vector<Sequence> made;
  if (given.size() == 1) {  // one input: each of its sequences (windows) is a sequence
    const size_t p = given[0];
    for (TokenRows& r : per_plugin[p]) {
      made.emplace_back();
      made.back().item = index;
      made.back().id = r.label.empty() ? item.id : item.id + "/" + r.label;
      append(made.back(), p, r);
    }
  } else {  // several inputs: one sequence, their rows one after another
    for (size_t p : given)
      if (per_plugin[p].size() != 1)
        return fail(item.parts[p].path, "plugin " + plugins_[p]->name() + " gave " + std::to_string(per_plugin[p].size()) +
                                            " sequences; in a multimodal sequence each plugin gives one");
    made.emplace_back();
    made.back().item = index;
    made.back().id = item.id;
    for (size_t p : given) append(made.back(), p, per_plugin[p][0]);
  }
  // A sequence longer than the positions reach is a bad item (its batch would fail otherwise).
  const PositionConfig& pos = exp_.model.positions;
  for (const Sequence& s : made)
    if ((pos.kind == PositionKind::learned || pos.kind == PositionKind::sinusoidal) && s.rows.size() > pos.max_len)
      return fail(item.parts[given[0]].path,
                  std::to_string(s.rows.size()) + " rows, more than model.positions.max_len (" + std::to_string(pos.max_len) +
                      "): give the plugin a maximum length and a length policy (truncate, windows), or raise max_len");
  for (Sequence& s : made) {
    if (!modal) s.modality.clear();
    if (!mixed) s.kinds.clear();
    out->seqs.push_back(std::move(s));
  }
}

EncodedBatch Runner::encode_batch(int64_t k) {
  const int64_t begin = k * batch_size_, end = std::min<int64_t>(begin + batch_size_, static_cast<int64_t>(items_.size()));
  const int64_t W = static_cast<int64_t>(encoders_.size());
  std::vector<EncodedBatch> parts(static_cast<size_t>(W));
  auto work = [&](int64_t w) {
    for (int64_t i = begin + w; i < end; i += W) encode_item(i, encoders_[static_cast<size_t>(w)], &parts[static_cast<size_t>(w)]);
  };
  if (W == 1) {
    work(0);
  } else {
    std::vector<std::thread> threads;
    for (int64_t w = 0; w < W; ++w) threads.emplace_back(work, w);
    for (auto& t : threads) t.join();
  }
  // Back into item order, so that outputs never depend on how many workers decoded.
  EncodedBatch out;
  for (auto& p : parts) {
    for (auto& s : p.seqs) out.seqs.push_back(std::move(s));
    for (auto& e : p.errors) out.errors.push_back(std::move(e));
    out.item_hashes.insert(out.item_hashes.end(), p.item_hashes.begin(), p.item_hashes.end());
  }
  std::sort(out.item_hashes.begin(), out.item_hashes.end());
  std::vector<uint64_t> hashes;
  for (const auto& ih : out.item_hashes) hashes.push_back(ih.second);
  out.content = batch_content(hashes);
  std::stable_sort(out.seqs.begin(), out.seqs.end(), [](const Sequence& a, const Sequence& b) { return a.item < b.item; });
  std::sort(out.errors.begin(), out.errors.end(), [](const ItemError& a, const ItemError& b) { return a.item < b.item; });
  return out;
}

std::string Runner::class_name(int64_t k) const {
  return k < static_cast<int64_t>(class_names_.size()) ? class_names_[static_cast<size_t>(k)] : std::to_string(k);
}

Status Runner::write_attention(const Sequence& s, int64_t b, int64_t start, const Outputs& out) const {
  const int64_t n = s.rows.size();
  std::vector<int64_t> heads = exp_.task.attention.heads;
  if (heads.empty())
    for (int64_t h = 0; h < exp_.model.n_heads; ++h) heads.push_back(h);
  const std::string base = (dir_ / "attention" / safe_name(s.id)).string();
  for (int64_t layer : exp_.task.attention.layers) {
    // (B, heads, T, T): the forward kept the chosen heads only, in this order (capture_heads).
    const Tensor w = out.captured.at("blocks." + std::to_string(layer) + ".attn.weights");
    Tensor maps = Tensor::empty({static_cast<int64_t>(heads.size()), n, n});
    for (size_t i = 0; i < heads.size(); ++i)
      maps.select(0, static_cast<int64_t>(i))
          .copy_from(w.select(0, b).select(0, static_cast<int64_t>(i)).slice(0, start, start + n).slice(1, start, start + n));
    const std::string stem = base + ".layer" + std::to_string(layer);
    TSR_RETURN_IF_ERROR(npy::save(stem + ".npy", maps));
    if (!exp_.task.attention.png) continue;
    for (size_t i = 0; i < heads.size(); ++i) {
      const float* a = maps.data<float>() + static_cast<int64_t>(i) * n * n;
      run::RgbImage img;
      if (s.rows.picture.width > 0) {
        // What the summary row looks at (the CLS row, else the average query), over the picture.
        int64_t q = -1;
        for (int64_t r = 0; r < n && q < 0; ++r)
          if (s.rows.roles[static_cast<size_t>(r)] == TSR_ROLE_CLS) q = r;
        std::vector<float> wrow(static_cast<size_t>(n), 0.f);
        for (int64_t r = 0; r < n; ++r)
          if (q < 0 || r == q)
            for (int64_t j = 0; j < n; ++j) wrow[static_cast<size_t>(j)] += a[r * n + j];
        if (s.picture_end < 0) {
          img = run::heatmap_over_picture(s.rows, wrow);
        } else {  // a multimodal sequence: only the rows of the plugin that drew the picture
          TokenRows on = s.rows;
          for (int64_t r = 0; r < n; ++r)
            if (r < s.picture_begin || r >= s.picture_end) on.provenance[static_cast<size_t>(r)].kind = TSR_PROV_NONE;
          img = run::heatmap_over_picture(on, wrow);
        }
      } else {
        img = run::heatmap_matrix(a, static_cast<int>(n));
      }
      Result<std::string> png = run::encode_png(img);
      if (!png.ok()) return png.status();
      TSR_RETURN_IF_ERROR(write_file_atomic(stem + ".head" + std::to_string(heads[i]) + ".png", *png));
    }
  }
  return Status::Ok();
}

Status Runner::run_batch(int64_t k, const EncodedBatch& eb) {
  const ModelConfig& m = exp_.model;
  const TaskKind task = exp_.task.kind;
  const bool packing = exp_.runtime.packing;
  const std::vector<Sequence>& seqs = eb.seqs;
  std::vector<json> records;  // the batch's shard: one JSON line per sequence and per error
  Tensor values;              // the batch's embeddings (N, C) or hidden rows (sum of rows, C)

  if (!seqs.empty() && task == TaskKind::generate) {
    const auto t_model = std::chrono::steady_clock::now();
    TSR_RETURN_IF_ERROR(generate_records(seqs, &records).with_prefix("batch " + std::to_string(k)));
    model_seconds_ += seconds_since(t_model);
  } else if (!seqs.empty()) {
    // Place sequences: one per batch row, or packed first-fit into rows as long as the longest.
    int64_t T = 0;
    for (const Sequence& s : seqs) T = std::max(T, s.rows.size());
    std::vector<std::pair<int64_t, int64_t>> at;  // (batch row, start row)
    std::vector<int64_t> fill;
    for (const Sequence& s : seqs) {
      int64_t row = -1;
      if (packing)
        for (size_t r = 0; r < fill.size() && row < 0; ++r)
          if (fill[r] + s.rows.size() <= T) row = static_cast<int64_t>(r);
      if (row < 0) {
        row = static_cast<int64_t>(fill.size());
        fill.push_back(0);
      }
      at.emplace_back(row, fill[static_cast<size_t>(row)]);
      fill[static_cast<size_t>(row)] += s.rows.size();
    }
    const int64_t B = static_cast<int64_t>(fill.size());
    const bool ids = m.stem.kind == StemKind::tokens || m.stem.kind == StemKind::mixed;
    const bool feats = m.stem.kind != StemKind::tokens;
    const int64_t F = m.stem.kind == StemKind::identity ? m.d_model : m.stem.n_features;
    Batch batch;
    if (ids) batch.ids = Tensor::zeros({B, T}, DType::i32);
    if (feats) batch.rows = Tensor::zeros({B, T, F});
    batch.roles = Tensor::full({B, T}, TSR_ROLE_PAD).to(DType::u8);
    if (m.stem.kind == StemKind::mixed) batch.kinds = Tensor::zeros({B, T}, DType::u8);
    if (m.stem.modalities > 0) batch.modality = Tensor::zeros({B, T}, DType::i32);
    if (packing) batch.segments = Tensor::full({B, T}, -1).to(DType::i32);
    else batch.lengths.assign(static_cast<size_t>(B), 0);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const Sequence& s = seqs[i];
      const auto [b, start] = at[i];
      const int64_t n = s.rows.size();
      for (int64_t t = 0; t < n; ++t) {
        const int64_t o = b * T + start + t;
        const size_t u = static_cast<size_t>(t);
        if (ids && (s.rows.kind == TSR_ROWS_IDS || !s.kinds.empty())) batch.ids.data<int32_t>()[o] = s.rows.ids.empty() ? 0 : s.rows.ids[u];
        if (feats && s.rows.features.defined()) batch.rows.select(0, b).select(0, start + t).copy_from(s.rows.features.select(0, t));
        batch.roles.data<uint8_t>()[o] = s.rows.roles[u];
        if (batch.kinds.defined()) batch.kinds.data<uint8_t>()[o] = s.kinds.empty() ? (s.rows.kind == TSR_ROWS_FEATURES) : s.kinds[u];
        if (batch.modality.defined()) batch.modality.data<int32_t>()[o] = s.modality.empty() ? 0 : s.modality[u];
        if (packing) batch.segments.data<int32_t>()[o] = static_cast<int32_t>(i);
      }
      if (!packing) batch.lengths[static_cast<size_t>(b)] = n;
    }
    ForwardOptions fo;
    fo.reference = exp_.runtime.reference;
    for (int64_t l : exp_.task.attention.layers) fo.capture.insert("blocks." + std::to_string(l) + ".attn.weights");
    fo.capture_heads = exp_.task.attention.heads;  // empty: every head
    Outputs out;
    const auto t_model = std::chrono::steady_clock::now();
    TSR_RETURN_IF_ERROR(model_->forward(batch, fo, &out).with_prefix("batch " + std::to_string(k)));
    const int64_t C = out.hidden.dim(2);

    // Per sequence: pooled vectors (embed, classify), hidden rows, or scores.
    Tensor pooled = Tensor::empty({static_cast<int64_t>(seqs.size()), C});
    int64_t total_rows = 0;
    for (const Sequence& s : seqs) total_rows += s.rows.size();
    if (task == TaskKind::hidden) values = Tensor::empty({total_rows, C});
    int64_t row_at = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto [b, start] = at[i];
      const int64_t n = seqs[i].rows.size();
      const Tensor h = out.hidden.select(0, b).slice(0, start, start + n);
      pool_rows(m, h, seqs[i].rows.roles.data(), pooled.data<float>() + static_cast<int64_t>(i) * C);
      if (task == TaskKind::hidden) values.slice(0, row_at, row_at + n).copy_from(h);
      row_at += n;
    }
    TSR_RETURN_IF_ERROR(model_->pool_head(pooled, fo));
    if (task == TaskKind::embed) values = pooled;
    Tensor probs;
    if (task == TaskKind::classify) {
      Tensor logits;
      TSR_RETURN_IF_ERROR(model_->classify(pooled, &logits, &probs, fo));
    }
    model_seconds_ += seconds_since(t_model);
    row_at = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const Sequence& s = seqs[i];
      const DataItem& item = items_[static_cast<size_t>(s.item)];
      const auto [b, start] = at[i];
      const int64_t n = s.rows.size();
      json r = {{"t", "seq"}, {"id", s.id}, {"item", s.item}, {"rows", n}};
      if (!item.name.empty()) r["name"] = item.name;
      if (item.label) r["label"] = *item.label;
      if (task == TaskKind::hidden) r["start"] = row_at;
      row_at += n;
      if (task == TaskKind::classify) {
        const int64_t K = m.head.n_classes;
        std::vector<int64_t> order(static_cast<size_t>(K));
        for (int64_t c = 0; c < K; ++c) order[static_cast<size_t>(c)] = c;
        const float* p = probs.data<float>() + static_cast<int64_t>(i) * K;
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b2) { return p[a] > p[b2]; });
        json top = json::array();
        for (int64_t j = 0; j < std::min<int64_t>(exp_.task.top_k, K); ++j)
          top.push_back({{"class", class_name(order[static_cast<size_t>(j)])},
                         {"index", order[static_cast<size_t>(j)]},
                         {"prob", p[order[static_cast<size_t>(j)]]}});
        r["top"] = top;
      }
      if (task == TaskKind::score) {
        // log p(x_1..x_{n-1} | x_0) from the logits of each row for the next row's id.
        const int64_t V = m.stem.vocab_size;
        double ll = 0;
        std::vector<double> lp(static_cast<size_t>(V));
        auto log_softmax = [&](int64_t t) {
          const float* z = out.logits.data<float>() + ((b * out.logits.dim(1)) + start + t) * V;
          double mx = -INFINITY, sum = 0;
          for (int64_t v = 0; v < V; ++v) mx = std::max<double>(mx, z[v]);
          for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
          for (int64_t v = 0; v < V; ++v) lp[static_cast<size_t>(v)] = z[v] - mx - std::log(sum);
        };
        for (int64_t t = 0; t + 1 < n; ++t) {
          log_softmax(t);
          ll += lp[static_cast<size_t>(s.rows.ids[static_cast<size_t>(t + 1)])];
        }
        log_softmax(n - 1);
        std::vector<int64_t> order(static_cast<size_t>(V));
        for (int64_t v = 0; v < V; ++v) order[static_cast<size_t>(v)] = v;
        const int64_t K = std::min<int64_t>(exp_.task.top_k, V);
        std::partial_sort(order.begin(), order.begin() + K, order.end(),
                          [&](int64_t a, int64_t b2) { return lp[static_cast<size_t>(a)] > lp[static_cast<size_t>(b2)] || (lp[static_cast<size_t>(a)] == lp[static_cast<size_t>(b2)] && a < b2); });
        json next = json::array();
        for (int64_t j = 0; j < K; ++j) {
          const int32_t id = static_cast<int32_t>(order[static_cast<size_t>(j)]);
          json e = {{"id", id}, {"prob", std::exp(lp[static_cast<size_t>(id)])}};
          Result<std::string> text = encoders_[0][0].decode({id});
          if (text.ok()) e["text"] = *text;
          next.push_back(e);
        }
        r["log_likelihood"] = ll;
        r["perplexity"] = n > 1 ? std::exp(-ll / static_cast<double>(n - 1)) : 1.0;
        r["next"] = next;
      }
      if (exp_.outputs.provenance) r["prov"] = provenance_json(s);
      records.push_back(std::move(r));
      if (!exp_.task.attention.layers.empty()) TSR_RETURN_IF_ERROR(write_attention(s, b, start, out));
    }
  }
  for (const ItemError& e : eb.errors) {
    json r = {{"t", "error"}, {"item", e.item}, {"id", e.id}, {"reason", e.reason}};
    if (!e.file.empty()) r["file"] = e.file;
    records.push_back(std::move(r));
  }
  std::stable_sort(records.begin(), records.end(), [](const json& a, const json& b) { return a["item"].get<int64_t>() < b["item"].get<int64_t>(); });
  std::string lines;
  for (const json& r : records) lines += jsonl_line(r);
  const fs::path shard = dir_ / "shards" / batch_name(k);
  std::error_code ec;
  if (values.defined()) TSR_RETURN_IF_ERROR(npy::save(shard.string() + ".npy", values));
  else fs::remove(shard.string() + ".npy", ec);  // a batch redone with no sequence left: not its earlier rows
  TSR_RETURN_IF_ERROR(write_file_atomic(shard.string() + ".jsonl", lines));
  done_.insert(k);
  content_[k] = hex64(eb.content);
  return write_manifest("running");
}

// The batch's prompts continued together (generate): one record per sequence with its completion,
// or a bad item when nothing is left of the prompt once its closing EOS row is removed.
Status Runner::generate_records(const std::vector<Sequence>& seqs, std::vector<json>* records) const {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<size_t> which;  // prompts[i] is seqs[which[i]]
  GenerateOptions o = generate_;
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<int32_t> eos;
    std::vector<int32_t> p = prompt_ids(seqs[i].rows, &eos);
    for (int32_t id : eos)  // the tokenizer's own end of text: the model's EOS
      if (std::find(o.eos_ids.begin(), o.eos_ids.end(), id) == o.eos_ids.end()) o.eos_ids.push_back(id);
    if (p.empty()) {
      records->push_back(json{{"t", "error"}, {"item", seqs[i].item}, {"id", seqs[i].id},
                          {"reason", seqs[i].id + ": the prompt has no token left once its closing special rows are "
                                                  "removed (a completion continues the text before them)"}});
      continue;
    }
    prompts.push_back(std::move(p));
    which.push_back(i);
  }
  Result<std::vector<Generation>> gens = generate(*model_, prompts, o);
  if (!gens.ok()) return gens.status();
  for (size_t g = 0; g < prompts.size(); ++g) {
    const Sequence& s = seqs[which[g]];
    const DataItem& item = items_[static_cast<size_t>(s.item)];
    const Generation& gen = (*gens)[g];
    json r = {{"t", "seq"}, {"id", s.id}, {"item", s.item}, {"rows", s.rows.size()}};
    if (!item.name.empty()) r["name"] = item.name;
    if (item.label) r["label"] = *item.label;
    r["completion"] = gen.text;
    r["ids"] = gen.ids;
    r["finish_reason"] = gen.finish_reason;
    if (!gen.note.empty()) r["note"] = gen.note;
    if (exp_.outputs.provenance) r["prov"] = provenance_json(s);
    records->push_back(std::move(r));
  }
  return Status::Ok();
}

// A finished run's merged outputs cut back into shards, one per batch in `keep`, as run_batch()
// wrote them, so that the other batches can be redone and all of them merged again. The merged
// files stay until finalize() replaces them; a resume killed meanwhile still finds them.
Status Runner::unmerge(const std::set<int64_t>& keep) {
  const TaskKind task = exp_.task.kind;
  const std::string leaf = task == TaskKind::classify || task == TaskKind::score ? "predictions.jsonl"
                           : task == TaskKind::generate                         ? "completions.jsonl"
                                                                                : "index.jsonl";
  auto lines_of = [&](const std::string& name, bool with_item, std::vector<json>* out) -> Status {
    const std::string path = (dir_ / name).string();
    Result<std::string> text = read_file(path);
    if (!text.ok()) return text.status();
    for (size_t pos = 0, line = 1; pos < text->size(); ++line) {
      size_t eol = text->find('\n', pos);
      if (eol == std::string::npos) eol = text->size();
      json r = json::parse(text->substr(pos, eol - pos), nullptr, false);
      if (r.is_discarded() || !r.is_object() || !r.contains("id") ||
          (with_item && !(r.contains("item") && r["item"].is_number_integer())))
        return Status::ParseError(path + ":" + std::to_string(line) + ": not a line this run wrote; start over with --force");
      out->push_back(std::move(r));
      pos = eol + 1;
    }
    return Status::Ok();
  };
  std::vector<json> seqs, errors, prov;
  TSR_RETURN_IF_ERROR(lines_of(leaf, true, &seqs));
  TSR_RETURN_IF_ERROR(lines_of("errors.jsonl", true, &errors));
  if (exp_.outputs.provenance) {
    TSR_RETURN_IF_ERROR(lines_of("rows.jsonl", false, &prov));
    if (prov.size() != seqs.size())
      return Status::Invalid((dir_ / "rows.jsonl").string() + " has " + std::to_string(prov.size()) + " lines for " +
                             std::to_string(seqs.size()) + " sequences in " + leaf + "; start over with --force");
  }
  Tensor values;  // embeddings (one row per sequence) or hidden rows
  const bool has_values = task == TaskKind::embed || task == TaskKind::hidden;
  if (has_values) {
    const std::string path = (dir_ / (task == TaskKind::hidden ? "hidden.npy" : "embeddings.npy")).string();
    Result<Tensor> v = npy::load(path);
    if (!v.ok()) return v.status();
    values = std::move(v).value();
  }
  std::map<int64_t, std::vector<json>> records;                           // per batch, as its shard
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> row_spans;  // per batch: its rows of values
  std::map<int64_t, int64_t> rows_in;                                     // per batch: hidden rows so far
  int64_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    json r = std::move(seqs[i]);
    const int64_t k = r["item"].get<int64_t>() / batch_size_;
    const int64_t n = task == TaskKind::hidden ? r.value("rows", int64_t{0}) : task == TaskKind::embed ? 1 : 0;
    if (n < 0 || (has_values && row + n > values.dim(0)))
      return Status::Invalid((dir_ / leaf).string() + ":" + std::to_string(i + 1) + ": " + std::to_string(n) +
                             " rows from row " + std::to_string(row) + ", beyond the outputs' " +
                             std::to_string(has_values ? values.dim(0) : 0) + "; start over with --force");
    if (task == TaskKind::hidden) {
      if (r.value("start", int64_t{-1}) != row)
        return Status::Invalid((dir_ / leaf).string() + ":" + std::to_string(i + 1) + ": start " +
                               std::to_string(r.value("start", int64_t{-1})) + ", but the rows before it end at " +
                               std::to_string(row) + "; start over with --force");
      r["start"] = rows_in[k];
      rows_in[k] += n;
    }
    if (exp_.outputs.provenance) {
      if (prov[i]["id"] != r["id"])
        return Status::Invalid((dir_ / "rows.jsonl").string() + ":" + std::to_string(i + 1) + " is not the rows of " +
                               r["id"].dump() + "; start over with --force");
      r["prov"] = prov[i].value("rows", json::array());
    }
    r["t"] = "seq";
    records[k].push_back(std::move(r));
    if (n > 0) row_spans[k].emplace_back(row, n);
    row += n;
  }
  if (has_values && row != values.dim(0))
    return Status::Invalid((dir_ / leaf).string() + " names " + std::to_string(row) + " rows, but the outputs hold " +
                           std::to_string(values.dim(0)) + "; start over with --force");
  for (json& r : errors) {
    r["t"] = "error";
    records[r["item"].get<int64_t>() / batch_size_].push_back(std::move(r));
  }
  for (int64_t k : keep) {
    std::vector<json>& recs = records[k];
    std::stable_sort(recs.begin(), recs.end(), [](const json& a, const json& b) { return a["item"].get<int64_t>() < b["item"].get<int64_t>(); });
    std::string lines;
    for (const json& r : recs) lines += jsonl_line(r);
    const fs::path shard = dir_ / "shards" / batch_name(k);
    std::error_code ec;
    if (has_values && !row_spans[k].empty()) {
      int64_t n = 0;
      for (const auto& [at, len] : row_spans[k]) n += len;
      Tensor v = Tensor::empty({n, values.dim(1)});
      int64_t to = 0;
      for (const auto& [at, len] : row_spans[k]) {
        v.slice(0, to, to + len).copy_from(values.slice(0, at, at + len));
        to += len;
      }
      TSR_RETURN_IF_ERROR(npy::save(shard.string() + ".npy", v));
    } else {
      fs::remove(shard.string() + ".npy", ec);
    }
    TSR_RETURN_IF_ERROR(write_file_atomic(shard.string() + ".jsonl", lines));
  }
  return Status::Ok();
}

// Removes the attention files of sequences that are not in the outputs (an item redone since:
// it gives fewer windows, or fails now), so that attention/ holds the maps of the outputs' rows.
Status Runner::prune_attention(const std::vector<std::string>& ids) const {
  if (exp_.task.attention.layers.empty()) return Status::Ok();
  std::vector<int64_t> heads = exp_.task.attention.heads;
  if (heads.empty())
    for (int64_t h = 0; h < exp_.model.n_heads; ++h) heads.push_back(h);
  std::set<std::string> names;  // what write_attention() writes
  for (const std::string& id : ids)
    for (int64_t layer : exp_.task.attention.layers) {
      const std::string stem = safe_name(id) + ".layer" + std::to_string(layer);
      names.insert(stem + ".npy");
      if (exp_.task.attention.png)
        for (int64_t h : heads) names.insert(stem + ".head" + std::to_string(h) + ".png");
    }
  std::error_code ec;
  std::vector<fs::path> stale;
  for (auto it = fs::directory_iterator(dir_ / "attention", ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->is_regular_file() && !names.count(it->path().filename().string())) stale.push_back(it->path());
  for (const fs::path& f : stale)
    if (!fs::remove(f, ec) && ec) return Status::IoError(f.string() + ": cannot remove it: " + ec.message());
  return Status::Ok();
}

Status Runner::finalize() {
  // Merge the shards, in batch order, into the run's outputs.
  std::string index, predictions, completions, rows, errors;
  std::vector<Tensor> parts;
  std::vector<std::string> ids;  // of the sequences written
  int64_t total = 0;             // rows of the shards before this one
  for (int64_t k = 0; k < batches_; ++k) {
    const fs::path shard = dir_ / "shards" / batch_name(k);
    Result<std::string> text = read_file(shard.string() + ".jsonl");
    if (!text.ok()) return text.status().with_prefix("finishing the run");
    const int64_t base = total;  // hidden: a shard's starts count from its first row, the outputs' from the run's
    std::error_code ec;
    if (fs::exists(shard.string() + ".npy", ec)) {
      Result<Tensor> v = npy::load(shard.string() + ".npy");
      if (!v.ok()) return v.status();
      total += v->dim(0);
      parts.push_back(std::move(v).value());
    }
    size_t pos = 0;
    while (pos < text->size()) {
      const size_t eol = text->find('\n', pos);
      json r = json::parse(text->substr(pos, eol - pos));
      pos = eol + 1;
      if (r["t"] == "error") {
        r.erase("t");
        errors += jsonl_line(r);
        ++summary_.failed;
        continue;
      }
      ++summary_.sequences;
      ids.push_back(r["id"].get<std::string>());
      if (r.contains("start")) r["start"] = base + r["start"].get<int64_t>();
      if (r.contains("prov")) {
        rows += jsonl_line(json({{"id", r["id"]}, {"rows", r["prov"]}}));
        r.erase("prov");
      }
      r.erase("t");
      if (exp_.task.kind == TaskKind::classify || exp_.task.kind == TaskKind::score) predictions += jsonl_line(r);
      else if (exp_.task.kind == TaskKind::generate) completions += jsonl_line(r);
      else index += jsonl_line(r);
    }
  }
  if (!parts.empty()) {
    Tensor all = Tensor::empty({total, parts[0].dim(1)});
    int64_t at = 0;
    for (const Tensor& p : parts) {
      all.slice(0, at, at + p.dim(0)).copy_from(p);
      at += p.dim(0);
    }
    TSR_RETURN_IF_ERROR(npy::save((dir_ / (exp_.task.kind == TaskKind::hidden ? "hidden.npy" : "embeddings.npy")).string(), all));
  } else if (exp_.task.kind == TaskKind::embed || exp_.task.kind == TaskKind::hidden) {
    const int64_t C = exp_.model.d_model;
    TSR_RETURN_IF_ERROR(npy::save((dir_ / (exp_.task.kind == TaskKind::hidden ? "hidden.npy" : "embeddings.npy")).string(),
                                  Tensor::zeros({0, C})));
  }
  if (exp_.task.kind == TaskKind::classify || exp_.task.kind == TaskKind::score)
    TSR_RETURN_IF_ERROR(write_file_atomic((dir_ / "predictions.jsonl").string(), predictions));
  else if (exp_.task.kind == TaskKind::generate)
    TSR_RETURN_IF_ERROR(write_file_atomic((dir_ / "completions.jsonl").string(), completions));
  else
    TSR_RETURN_IF_ERROR(write_file_atomic((dir_ / "index.jsonl").string(), index));
  if (exp_.outputs.provenance) TSR_RETURN_IF_ERROR(write_file_atomic((dir_ / "rows.jsonl").string(), rows));
  TSR_RETURN_IF_ERROR(write_file_atomic((dir_ / "errors.jsonl").string(), errors));
  TSR_RETURN_IF_ERROR(prune_attention(ids));
  TSR_RETURN_IF_ERROR(write_manifest("complete"));
  std::error_code ec;
  fs::remove_all(dir_ / "shards", ec);
  return Status::Ok();
}

Result<RunSummary> Runner::run() {
  const auto t0 = std::chrono::steady_clock::now();
  TSR_RETURN_IF_ERROR(setup());
  summary_.setup_seconds = seconds_since(t0);
  summary_.items = static_cast<int64_t>(items_.size());
  summary_.batches = batches_;
  if (complete_) {
    if (opt_.progress) std::fprintf(stderr, "run: %s is already complete; nothing to do\n", dir_.c_str());
    return summary_;
  }
  std::vector<int64_t> todo;
  for (int64_t k = 0; k < batches_; ++k)
    if (!done_.count(k)) todo.push_back(k);
  Progress progress(opt_.progress, summary_.items);
  items_done_ = std::min<int64_t>(summary_.items, static_cast<int64_t>(done_.size()) * batch_size_);
  progress.resumed_at(items_done_);
  if (!done_.empty() && opt_.progress)
    std::fprintf(stderr, "run: resuming %s: %zu of %lld batches already done\n", dir_.c_str(), done_.size(),
                 static_cast<long long>(batches_));
  // Plugins decode batch k + 1 on worker threads while the model runs batch k.
  const bool prefetch = exp_.runtime.workers > 0;
  std::future<EncodedBatch> next;
  if (!todo.empty() && prefetch) next = std::async(std::launch::async, [this, k = todo[0]] { return encode_batch(k); });
  int64_t failed = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    const auto t_wait = std::chrono::steady_clock::now();
    EncodedBatch eb = prefetch ? next.get() : encode_batch(todo[i]);
    summary_.wait_seconds += seconds_since(t_wait);
    if (prefetch && i + 1 < todo.size())
      next = std::async(std::launch::async, [this, k = todo[i + 1]] { return encode_batch(k); });
    failed += static_cast<int64_t>(eb.errors.size());
    Status st = run_batch(todo[i], eb);
    if (!st.ok()) {
      if (next.valid()) next.wait();
      return st;
    }
    items_done_ = std::min<int64_t>(summary_.items, items_done_ + batch_size_);
    progress.update(items_done_, failed);
    if (opt_.on_batch) opt_.on_batch(static_cast<int64_t>(done_.size()), batches_);
  }
  TSR_RETURN_IF_ERROR(finalize());
  progress.update(summary_.items, summary_.failed, true);
  summary_.seconds = seconds_since(t0);
  summary_.model_seconds = model_seconds_;
  return summary_;
}

}  // namespace

Result<RunSummary> run_experiment(const Experiment& exp, const RunOptions& options) {
  Runner r(exp, options);
  return r.run();
}

}  // namespace tessera
