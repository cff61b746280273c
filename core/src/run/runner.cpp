// The batch runner behind `tessera run`: a short loop over the parts of a run.
//   batcher      items -> encoded batches (plugins decode batch k + 1, in worker processes, while
//                the model runs batch k);
//   batch_model  the model: an encoded batch -> its shard's records and values;
//   writers      each batch's shard written, and at the end the shards merged into the outputs;
//   run_folder   the lock and the manifest: batch k recorded as done (with a hash of its items'
//                bytes), so that a killed run resumes where it stopped and a resume redoes the
//                batches whose items changed.
// Datasets are dataset.cpp's; plugin checks and previews preview.cpp's.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <optional>

#include "batch_model.h"
#include "batcher.h"
#include "run_common.h"
#include "run_folder.h"
#include "tessera/run.h"
#include "writers.h"

namespace tessera {

namespace fs = std::filesystem;
using run::EncodedBatch;

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
  Status run_batch(int64_t k, const EncodedBatch& eb);
  int stop_signal() const { return opt_.stop ? opt_.stop->load() : 0; }
  Result<RunSummary> stopped(int signal, std::chrono::steady_clock::time_point t0);

  const Experiment& exp_;
  const RunOptions& opt_;
  std::vector<std::shared_ptr<const Plugin>> plugins_;
  std::vector<std::vector<Encoder>> encoders_;  // [worker][plugin]
  std::vector<DataItem> items_;
  std::optional<run::BatchModel> model_;
  std::optional<run::Batcher> batcher_;
  std::optional<run::Writers> writers_;
  std::optional<run::RunFolder> folder_;
  RunSummary summary_;
};

// The parts, in an order that matters: the plugins' worker processes are forked before the model
// starts its threads, and the model is built (once the memory plan allows it) before anything is
// read.
Status Runner::setup() {
  TSR_RETURN_IF_ERROR(run::open_encoders(exp_, &plugins_, &encoders_));
  set_num_threads(exp_.runtime.threads);
  model_.emplace(exp_);
  TSR_RETURN_IF_ERROR(model_->build());
  std::vector<PluginInput> inputs;
  for (const auto& p : plugins_) inputs.push_back({p->name(), p->input_kind(), p->extensions()});
  Result<std::vector<DataItem>> items = read_dataset(exp_.data, inputs);
  if (!items.ok()) return items.status().with_prefix("data.path");
  items_ = std::move(items).value();
  Result<std::vector<std::string>> classes = run::class_names(exp_);
  if (!classes.ok()) return classes.status();

  std::vector<tsr_encoder_info> infos;
  for (const Encoder& e : encoders_[0]) infos.push_back(e.info());
  const int64_t batch_size = exp_.runtime.batch_size;
  batcher_.emplace(exp_, items_, plugins_, &encoders_, stem_layout(infos), batch_size);
  std::string d = opt_.out_dir.empty() ? exp_.outputs.dir : opt_.out_dir;
  if (d.empty()) d = "runs/" + fs::path(exp_.file).stem().string();
  summary_.dir = d;
  writers_.emplace(exp_, fs::path(d), items_, std::move(classes).value(), batch_size,
                   exp_.task.kind == TaskKind::score ? &encoders_[0][0] : nullptr);
  folder_.emplace(fs::path(d), run::run_identity(exp_, model_->model(), plugins_, static_cast<int64_t>(items_.size()),
                                                 batcher_->batches()));
  run::ResumeHooks hooks;
  hooks.content_now = [this](int64_t k) { return batcher_->content_now(k); };
  hooks.check_shard = [this](int64_t k) { return writers_->check_shard(k); };
  hooks.unmerge = [this](const std::set<int64_t>& keep) { return writers_->unmerge(keep); };
  return folder_->open(opt_, hooks, !exp_.task.attention.layers.empty());
}

// Batch k through the model, its shard written, and the manifest told.
Status Runner::run_batch(int64_t k, const EncodedBatch& eb) {
  run::ShardContent shard;
  TSR_RETURN_IF_ERROR(model_->compute(k, eb, items_, *writers_, &shard));
  summary_.largest_forward = model_->largest_forward();
  TSR_RETURN_IF_ERROR(writers_->write_shard(k, std::move(shard.records), shard.values));
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
  summary_.model_seconds = model_->model_seconds();
  return summary_;
}

// A signal asked the run to stop: the batches done stay, and the manifest says so.
Result<RunSummary> Runner::stopped(int signal, std::chrono::steady_clock::time_point t0) {
  TSR_RETURN_IF_ERROR(folder_->stop());
  summary_.stopped_by = signal;
  summary_.batches_kept = static_cast<int64_t>(folder_->done().size());
  summary_.seconds = run::seconds_since(t0);
  summary_.model_seconds = model_->model_seconds();
  return summary_;
}

}  // namespace

Result<RunSummary> run_experiment(const Experiment& exp, const RunOptions& options) {
  Runner r(exp, options);
  return r.run();
}

}  // namespace tessera
