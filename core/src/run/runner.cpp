// The batch runner behind `tessera run`: a short loop over the parts of a run. The batcher turns
// items into encoded batches (plugins decode the next batch on worker threads while the model runs
// this one); the model runs them here; the writers put each batch's outputs in its shard; the run
// folder records the batch as done (manifest.json, with a hash of its items' bytes), so a killed
// run resumes where it stopped and a resume redoes the batches whose items changed.
// Datasets are dataset.cpp's; plugin checks and previews preview.cpp's.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <optional>

#include "batcher.h"
#include "run_common.h"
#include "run_folder.h"
#include "tessera/machine.h"
#include "tessera/run.h"
#include "writers.h"

namespace tessera {

namespace fs = std::filesystem;
using run::EncodedBatch;
using run::json;
using run::Sequence;

namespace {

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

class Runner {
 public:
  Runner(const Experiment& exp, const RunOptions& opt) : exp_(exp), opt_(opt) {}
  Result<RunSummary> run();

 private:
  Status setup();
  Status setup_task();
  run::RunIdentity identity() const;
  Status run_batch(int64_t k, const EncodedBatch& eb);
  // One sequence's outputs while its batch runs: its record and values, or why it is not finite.
  struct SeqOutput {
    int64_t item = 0, rows = 0;
    json record;
    Tensor values;          // embed: (1, C); hidden: (rows, C); else undefined
    std::string nonfinite;  // non-empty: the item is bad, for this reason
  };
  Status forward_chunk(const Sequence* seqs, size_t n, int64_t k, std::vector<SeqOutput>* outs);
  Status generate_records(const Sequence* seqs, size_t n, std::vector<json>* records);
  int stop_signal() const { return opt_.stop ? opt_.stop->load() : 0; }
  Result<RunSummary> stopped(int signal, std::chrono::steady_clock::time_point t0);

  const Experiment& exp_;
  const RunOptions& opt_;
  std::optional<Model> model_;
  std::vector<std::shared_ptr<const Plugin>> plugins_;
  std::vector<std::vector<Encoder>> encoders_;  // [worker][plugin]
  std::optional<Encoder> decoder_;               // generate: the new tokens' text, apart from the workers'
  GenerateOptions generate_;                     // generate: task.generate
  std::vector<DataItem> items_;
  std::vector<std::string> class_names_;
  std::optional<run::Batcher> batcher_;
  std::optional<run::Writers> writers_;
  std::optional<run::RunFolder> folder_;
  RunSummary summary_;
  double model_seconds_ = 0;  // in the model: forward passes and heads (generate: the whole generation)
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
  const RuntimeConfig& rt = exp_.runtime;
  const ItemLimits limits{rt.max_item_bytes, rt.max_item_rows, rt.item_timeout_s, rt.worker_memory_mb};
  for (std::vector<Encoder>& per_worker : encoders_)
    for (Encoder& e : per_worker) {
      if (rt.isolate) TSR_RETURN_IF_ERROR(e.isolate(limits));
      else e.limit(limits);
    }
  std::vector<tsr_encoder_info> infos;
  for (const Encoder& e : encoders_[0]) infos.push_back(e.info());
  set_num_threads(exp_.runtime.threads);
  // A model the machine cannot hold is refused before anything is allocated (rows per item are
  // not known before encoding: the plan takes bench.seq_len, as `tessera check` does).
  const MemoryPlan plan = memory_plan(exp_.model, exp_.bench.seq_len, exp_.runtime.batch_size);
  if (Status st = check_memory(plan, machine_memory()); !st.ok()) return st.with_prefix(exp_.file);
  Result<Model> m = Model::build(exp_.model);
  if (!m.ok()) return m.status().with_prefix(exp_.file);
  model_.emplace(std::move(m).value());

  std::vector<PluginInput> inputs;
  for (const auto& p : plugins_) inputs.push_back({p->name(), p->input_kind(), p->extensions()});
  Result<std::vector<DataItem>> items = read_dataset(exp_.data, inputs);
  if (!items.ok()) return items.status().with_prefix("data.path");
  items_ = std::move(items).value();
  TSR_RETURN_IF_ERROR(setup_task());

  const int64_t batch_size = exp_.runtime.batch_size;
  batcher_.emplace(exp_, items_, plugins_, &encoders_, stem_layout(infos), batch_size);
  std::string d = opt_.out_dir.empty() ? exp_.outputs.dir : opt_.out_dir;
  if (d.empty()) d = "runs/" + fs::path(exp_.file).stem().string();
  summary_.dir = d;
  writers_.emplace(exp_, fs::path(d), items_, class_names_, batch_size,
                   exp_.task.kind == TaskKind::score ? &encoders_[0][0] : nullptr);
  folder_.emplace(fs::path(d), identity());
  run::ResumeHooks hooks;
  hooks.content_now = [this](int64_t k) { return batcher_->content_now(k); };
  hooks.check_shard = [this](int64_t k) { return writers_->check_shard(k); };
  hooks.unmerge = [this](const std::set<int64_t>& keep) { return writers_->unmerge(keep); };
  return folder_->open(opt_, hooks, !exp_.task.attention.layers.empty());
}

// What the task needs besides the model: the generation settings, the attention layers and heads
// it exports, the class names.
Status Runner::setup_task() {
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
  if (task != TaskKind::classify) return Status::Ok();
  if (exp_.task.labels.empty()) {
    class_names_ = exp_.model.head.labels;
    return Status::Ok();
  }
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
  return Status::Ok();
}

// What decides the outputs, hashed: the resolved experiment without where the outputs go and how
// many threads decode; every parameter's bytes; the files behind the configuration's names (each
// plugin's library and the files its options name, the class names).
run::RunIdentity Runner::identity() const {
  run::RunIdentity id;
  Experiment canon = exp_;
  canon.outputs.dir.clear();
  canon.runtime.workers = 0;
  // Where and under which limits items are encoded does not change a finished item's outputs: a
  // resume may raise a limit that refused an item.
  canon.runtime.isolate = true;
  canon.runtime.item_timeout_s = 0;
  canon.runtime.worker_memory_mb = canon.runtime.max_item_bytes = canon.runtime.max_item_rows = 0;
  const std::string yaml = to_yaml(canon);
  id.config_hash = hex64(fnv1a(yaml.data(), yaml.size(), kFnvOffset));
  uint64_t h = kFnvOffset;
  for (const auto& [name, t] : model_->parameters()) {
    const Tensor c = t.contiguous();
    h = fnv1a(c.raw_data(), c.nbytes(), fnv1a(name.data(), name.size(), h));
  }
  id.model_hash = hex64(h);
  for (const PluginConfig& pc : exp_.plugins) {
    id.files.push_back({"plugin " + pc.name + "'s library", pc.file, run::file_hash(pc.file)});
    for (size_t i = 0; i < pc.options.size() && i < pc.option_types.size(); ++i)
      if (pc.option_types[i] == TSR_OPT_PATH && !pc.options[i].second.empty())
        id.files.push_back({"plugin " + pc.name + "'s option " + pc.options[i].first, pc.options[i].second,
                            run::file_hash(pc.options[i].second)});
  }
  if (!exp_.task.labels.empty()) id.files.push_back({"task.labels", exp_.task.labels, run::file_hash(exp_.task.labels)});
  for (const auto& p : plugins_) id.plugins.push_back({p->name(), p->version(), p->modality()});
  id.experiment = exp_.file;
  id.task = task_kind_name(exp_.task.kind);
  id.items = static_cast<int64_t>(items_.size());
  id.batch_size = exp_.runtime.batch_size;
  id.batches = batcher_ ? batcher_->batches() : (id.items + id.batch_size - 1) / id.batch_size;
  return id;
}

// Why a sequence's output cannot be written: "non-finite output in <output>", and where the values
// first went wrong (`where`: the model's first layer that made them, when the forward made them).
std::string nonfinite_reason(const std::string& output, const std::string& where) {
  return "non-finite output in " + output + " (NaN or infinity)" + (where.empty() ? "" : ": " + where) +
         ": the item's outputs are not written";
}

bool all_finite(const Tensor& t) {
  Tensor c = t.contiguous();
  if (c.dtype() != DType::f32) c = c.to(DType::f32);
  const float* p = c.data<float>();
  for (int64_t i = 0, n = c.numel(); i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

// The model over one forward chunk of a batch: per sequence, its record and its values (embed:
// its vector (1, C); hidden: its rows (n, C)), or the output that is not finite.
Status Runner::forward_chunk(const Sequence* seqs, size_t n_seqs, int64_t k, std::vector<SeqOutput>* outs) {
  const ModelConfig& m = exp_.model;
  const TaskKind task = exp_.task.kind;
  const run::Placed placed = run::place_sequences(m, seqs, n_seqs, exp_.runtime.packing);
  summary_.largest_forward = std::max<int64_t>(summary_.largest_forward, static_cast<int64_t>(n_seqs));
  ForwardOptions fo;
  fo.reference = exp_.runtime.reference;
  for (int64_t l : exp_.task.attention.layers) fo.capture.insert("blocks." + std::to_string(l) + ".attn.weights");
  fo.capture_heads = exp_.task.attention.heads;  // empty: every head
  Outputs out;
  const auto t_model = std::chrono::steady_clock::now();
  TSR_RETURN_IF_ERROR(model_->forward(placed.batch, fo, &out).with_prefix("batch " + std::to_string(k)));
  const int64_t C = out.hidden.dim(2);
  Tensor pooled = Tensor::empty({static_cast<int64_t>(n_seqs), C});
  int64_t total_rows = 0;
  for (size_t i = 0; i < n_seqs; ++i) total_rows += seqs[i].rows.size();
  Tensor hidden;  // (rows of the chunk's sequences, C)
  if (task == TaskKind::hidden) hidden = Tensor::empty({total_rows, C});
  std::vector<int64_t> first_row;  // per sequence: its first row in `hidden`
  int64_t row_at = 0;
  for (size_t i = 0; i < n_seqs; ++i) {
    const auto [b, start] = placed.at[i];
    const int64_t n = seqs[i].rows.size();
    const Tensor h = out.hidden.select(0, b).slice(0, start, start + n);
    pool_rows(m, h, seqs[i].rows.roles.data(), pooled.data<float>() + static_cast<int64_t>(i) * C);
    if (task == TaskKind::hidden) hidden.slice(0, row_at, row_at + n).copy_from(h);
    first_row.push_back(row_at);
    row_at += n;
  }
  TSR_RETURN_IF_ERROR(model_->pool_head(pooled, fo));
  Tensor probs;
  if (task == TaskKind::classify) {
    Tensor logits;
    TSR_RETURN_IF_ERROR(model_->classify(pooled, &logits, &probs, fo));
  }
  model_seconds_ += run::seconds_since(t_model);

  // Nothing non-finite is written: each sequence's outputs checked before its record is made.
  std::vector<SeqOutput> chunk(n_seqs);
  std::vector<bool> skip(n_seqs, false);
  for (size_t i = 0; i < n_seqs; ++i) {
    const auto [b, start] = placed.at[i];
    const int64_t n = seqs[i].rows.size(), row = static_cast<int64_t>(i);
    SeqOutput& o = chunk[i];
    o.item = seqs[i].item;
    o.rows = n;
    if (task == TaskKind::embed) o.values = pooled.slice(0, row, row + 1);
    if (task == TaskKind::hidden) o.values = hidden.slice(0, first_row[i], first_row[i] + n);
    std::string bad;
    if (o.values.defined() && !all_finite(o.values)) bad = task == TaskKind::hidden ? "hidden" : "embeddings";
    else if (task == TaskKind::classify && !all_finite(probs.slice(0, row, row + 1))) bad = "predictions";
    else if (task == TaskKind::score && !all_finite(out.logits.select(0, b).slice(0, start, start + n))) bad = "predictions";
    for (int64_t l : exp_.task.attention.layers) {
      const Tensor& w = out.captured.at("blocks." + std::to_string(l) + ".attn.weights");
      if (bad.empty() && !all_finite(w.select(0, b).slice(1, start, start + n).slice(2, start, start + n)))
        bad = "attention maps (layer " + std::to_string(l) + ")";
    }
    if (!bad.empty()) o.nonfinite = bad;
    skip[i] = !bad.empty();
  }
  // Only a chunk with a bad sequence pays for naming the layer: the same pass again, watched.
  if (std::find(skip.begin(), skip.end(), true) != skip.end()) {
    std::vector<NonFinite> layers;
    if (Result<std::vector<NonFinite>> f = first_nonfinite_layers(*model_, placed.batch, fo); f.ok())
      layers = std::move(f).value();
    for (size_t i = 0; i < n_seqs; ++i) {
      if (!skip[i]) continue;
      const size_t b = static_cast<size_t>(placed.at[i].first);
      const std::string where = b < layers.size() && layers[b].found() ? layers[b].describe()
                                                                       : std::string("made after the model's layers (pooler or classifier)");
      chunk[i].nonfinite = nonfinite_reason(chunk[i].nonfinite, where);
    }
  }
  std::vector<json> records;
  TSR_RETURN_IF_ERROR(writers_->sequence_records(seqs, n_seqs, placed, out, probs, skip, &records));
  for (size_t i = 0; i < n_seqs; ++i) {
    chunk[i].record = std::move(records[i]);
    outs->push_back(std::move(chunk[i]));
  }
  return Status::Ok();
}

// The batch's prompts continued together (generate): one record per sequence with its completion,
// or a bad item when nothing is left of the prompt once its closing EOS row is removed.
Status Runner::generate_records(const Sequence* seqs, size_t n_seqs, std::vector<json>* records) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<size_t> which;  // prompts[i] is seqs[which[i]]
  GenerateOptions o = generate_;
  summary_.largest_forward = std::max<int64_t>(summary_.largest_forward, static_cast<int64_t>(n_seqs));
  for (size_t i = 0; i < n_seqs; ++i) {
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
    const Generation& gen = (*gens)[g];
    json r = writers_->sequence_record(s);
    r["completion"] = gen.text;
    r["ids"] = gen.ids;
    r["finish_reason"] = gen.finish_reason;
    if (!gen.note.empty()) r["note"] = gen.note;
    if (exp_.outputs.provenance) r["prov"] = run::provenance_json(s);
    records->push_back(std::move(r));
  }
  return Status::Ok();
}

// Batch k through the model in forward chunks of at most runtime.batch_size sequences (an item's
// windows may fill several), its shard written, and the manifest told. An item with an output
// that is not finite is a bad item: none of its sequences is written.
Status Runner::run_batch(int64_t k, const EncodedBatch& eb) {
  const std::vector<Sequence>& seqs = eb.seqs;
  const std::vector<std::pair<size_t, size_t>> chunks = run::forward_chunks(seqs.size(), exp_.runtime.batch_size);
  std::vector<json> records;  // the batch's shard: one JSON line per sequence and per error
  Tensor values;              // the batch's embeddings (N, C) or hidden rows (sum of rows, C)
  if (exp_.task.kind == TaskKind::generate) {
    const auto t_model = std::chrono::steady_clock::now();
    for (const auto& [begin, end] : chunks)
      TSR_RETURN_IF_ERROR(generate_records(seqs.data() + begin, end - begin, &records).with_prefix("batch " + std::to_string(k)));
    model_seconds_ += run::seconds_since(t_model);
  } else {
    std::vector<SeqOutput> outs;
    for (const auto& [begin, end] : chunks) TSR_RETURN_IF_ERROR(forward_chunk(seqs.data() + begin, end - begin, k, &outs));
    std::map<int64_t, std::string> bad;  // item -> why its outputs are not written
    for (const SeqOutput& o : outs)
      if (!o.nonfinite.empty() && !bad.count(o.item)) bad[o.item] = o.nonfinite;
    std::vector<Tensor> parts;
    int64_t rows = 0;
    for (SeqOutput& o : outs) {
      if (bad.count(o.item)) continue;
      if (exp_.task.kind == TaskKind::hidden) o.record["start"] = rows;
      if (o.values.defined()) {
        rows += o.values.dim(0);
        parts.push_back(o.values);
      }
      records.push_back(std::move(o.record));
    }
    if (!parts.empty()) {
      values = Tensor::empty({rows, parts[0].dim(1)});
      int64_t at = 0;
      for (const Tensor& p : parts) {
        values.slice(0, at, at + p.dim(0)).copy_from(p);
        at += p.dim(0);
      }
    }
    for (const auto& [item, reason] : bad) {
      const DataItem& it = items_[static_cast<size_t>(item)];
      std::string file;
      for (const ItemPart& p : it.parts)
        if (!p.missing && file.empty()) file = p.path;
      records.push_back(run::Writers::error_record({item, it.id, file, reason}));
    }
  }
  for (const run::ItemError& e : eb.errors) records.push_back(run::Writers::error_record(e));
  TSR_RETURN_IF_ERROR(writers_->write_shard(k, std::move(records), values));
  return folder_->mark_done(k, eb.content);
}

Result<RunSummary> Runner::run() {
  const auto t0 = std::chrono::steady_clock::now();
  TSR_RETURN_IF_ERROR(setup());
  summary_.setup_seconds = run::seconds_since(t0);
  summary_.items = static_cast<int64_t>(items_.size());
  summary_.batches = batcher_->batches();
  summary_.batches_resumed = folder_->resumed();
  summary_.batches_redone = folder_->redone();
  const int64_t batches = summary_.batches, batch_size = exp_.runtime.batch_size;
  if (folder_->complete()) {
    summary_.sequences = folder_->recorded_sequences();
    summary_.failed = folder_->recorded_failed();
    if (opt_.progress) std::fprintf(stderr, "run: %s is already complete; nothing to do\n", summary_.dir.c_str());
    return summary_;
  }
  std::vector<int64_t> todo;
  for (int64_t k = 0; k < batches; ++k)
    if (!folder_->done().count(k)) todo.push_back(k);
  Progress progress(opt_.progress, summary_.items);
  int64_t items_done = std::min<int64_t>(summary_.items, static_cast<int64_t>(folder_->done().size()) * batch_size);
  progress.resumed_at(items_done);
  if (!folder_->done().empty() && opt_.progress)
    std::fprintf(stderr, "run: resuming %s: %zu of %lld batches already done\n", summary_.dir.c_str(),
                 folder_->done().size(), static_cast<long long>(batches));
  // Plugins decode batch k + 1 on worker threads while the model runs batch k.
  const bool prefetch = exp_.runtime.workers > 0;
  auto encode = [this](int64_t k) { return batcher_->encode_batch(k); };
  std::future<EncodedBatch> next;
  if (!todo.empty() && prefetch) next = std::async(std::launch::async, encode, todo[0]);
  int64_t failed = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    if (const int signal = stop_signal()) {
      if (next.valid()) next.wait();  // its batch is dropped: encoded, not written
      progress.update(items_done, failed, true);
      return stopped(signal, t0);
    }
    const auto t_wait = std::chrono::steady_clock::now();
    EncodedBatch eb = prefetch ? next.get() : encode(todo[i]);
    summary_.wait_seconds += run::seconds_since(t_wait);
    if (prefetch && i + 1 < todo.size()) next = std::async(std::launch::async, encode, todo[i + 1]);
    failed += static_cast<int64_t>(eb.errors.size());
    Status st = run_batch(todo[i], eb);
    if (!st.ok()) {
      if (next.valid()) next.wait();
      return st;
    }
    items_done = std::min<int64_t>(summary_.items, items_done + batch_size);
    progress.update(items_done, failed);
    if (opt_.on_batch) opt_.on_batch(static_cast<int64_t>(folder_->done().size()), batches);
  }
  TSR_RETURN_IF_ERROR(writers_->merge(batches, &summary_.sequences, &summary_.failed));
  TSR_RETURN_IF_ERROR(folder_->finish(summary_.sequences, summary_.failed));
  progress.update(summary_.items, summary_.failed, true);
  summary_.seconds = run::seconds_since(t0);
  summary_.model_seconds = model_seconds_;
  return summary_;
}

// A signal asked the run to stop: the batches done stay, and the manifest says so.
Result<RunSummary> Runner::stopped(int signal, std::chrono::steady_clock::time_point t0) {
  TSR_RETURN_IF_ERROR(folder_->stop());
  summary_.stopped_by = signal;
  summary_.batches_kept = static_cast<int64_t>(folder_->done().size());
  summary_.seconds = run::seconds_since(t0);
  summary_.model_seconds = model_seconds_;
  return summary_;
}

}  // namespace

Result<RunSummary> run_experiment(const Experiment& exp, const RunOptions& options) {
  Runner r(exp, options);
  return r.run();
}

}  // namespace tessera
