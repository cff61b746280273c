// The batch runner behind `tessera run`: a short loop over the parts of a run.
//   batcher      items -> encoded batches (plugins decode batch k + 1, in worker processes, while
//                the model runs batch k);
//   batch_model  the model: an encoded batch -> its shard's records and values;
//   writers      each batch's shard written, and at the end the shards merged into the outputs;
//   run_folder   the lock and the manifest: batch k recorded as done (with a hash of its items'
//                bytes), so that a killed run resumes where it stopped and a resume redoes the
//                batches whose items changed.
// Datasets are dataset.cpp's; plugin checks and previews preview.cpp's.
//
// Under MPI (more than one rank, tessera/comm.h) every rank opens the plugins, the model and the
// dataset; rank 0 alone holds the folder (lock, resume checks, manifest, merge). The batches still
// to do are dealt out in rounds: in round i rank r runs the (i N + r)-th of them and writes its
// shard; then every rank hears every rank's outcome (allgather) and rank 0 records the round's
// batches in the manifest, in rank order. The shards are per batch and merged in batch order, so
// the outputs are the same bytes whatever N; a resume with another N redoes what no manifest
// recorded.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <optional>

#include "batch_model.h"
#include "tessera/comm.h"
#include "batcher.h"
#include "run_common.h"
#include "run_folder.h"
#include "tessera/run.h"
#include "writers.h"

namespace tessera {

namespace fs = std::filesystem;
using run::EncodedBatch;
using run::json;

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
  Status open_folder();
  Result<RunSummary> run_sharded(std::chrono::steady_clock::time_point t0);
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
  Comm* comm_ = nullptr;  // the job's ranks; set after the plugins' workers are forked
  // Rank 0's folder as the other ranks learn it: the batches done and whether the run is complete.
  std::set<int64_t> done_;
  bool complete_ = false;
};

// The parts, in an order that matters: the plugins' worker processes are forked before the model
// starts its threads, and the model is built (once the memory plan allows it) before anything is
// read.
Status Runner::setup() {
  TSR_RETURN_IF_ERROR(run::open_encoders(exp_, &plugins_, &encoders_));
  comm_ = &Comm::world();  // MPI starts after the plugins' worker processes are forked
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
  return open_folder();
}

// Rank 0 opens the folder (lock, resume checks); then every rank learns what it found, or why it
// failed (the other ranks return that failure without saying it again).
Status Runner::open_folder() {
  Status st = Status::Ok();
  if (comm_->rank() == 0) {
    run::ResumeHooks hooks;
    hooks.content_now = [this](int64_t k) { return batcher_->content_now(k); };
    hooks.check_shard = [this](int64_t k) { return writers_->check_shard(k); };
    hooks.unmerge = [this](const std::set<int64_t>& keep) { return writers_->unmerge(keep); };
    st = folder_->open(opt_, hooks, !exp_.task.attention.layers.empty());
    if (st.ok()) {
      done_ = folder_->done();
      complete_ = folder_->complete();
    }
  }
  if (!comm_->distributed()) return st;
  json j;
  if (comm_->rank() == 0)
    j = {{"ok", st.ok()}, {"code", static_cast<int>(st.code())}, {"done", std::vector<int64_t>(done_.begin(), done_.end())},
         {"complete", complete_}, {"resumed", folder_->resumed()}, {"redone", folder_->redone()},
         {"sequences", folder_->recorded_sequences()}, {"failed", folder_->recorded_failed()}};
  std::string text = comm_->rank() == 0 ? j.dump() : std::string();
  Result<std::vector<std::string>> all = comm_->allgather(text);
  if (!all.ok()) return all.status().with_prefix("sharing the run folder's state among the ranks");
  if (comm_->rank() == 0) return st;
  j = json::parse((*all)[0]);
  if (!j["ok"].get<bool>()) return Status(static_cast<Code>(j["code"].get<int>()), "");  // rank 0 says why
  for (int64_t k : j["done"]) done_.insert(k);
  complete_ = j["complete"].get<bool>();
  summary_.batches_resumed = j["resumed"].get<int64_t>();
  summary_.batches_redone = j["redone"].get<int64_t>();
  summary_.sequences = j["sequences"].get<int64_t>();
  summary_.failed = j["failed"].get<int64_t>();
  return Status::Ok();
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
  if (comm_->distributed()) return run_sharded(t0);
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

// The batches dealt out over the ranks in rounds (the comment at the top). A failure on any rank
// ends the round on every rank: the failing rank returns its error, the others one naming it.
Result<RunSummary> Runner::run_sharded(std::chrono::steady_clock::time_point t0) {
  const int rank = comm_->rank(), N = comm_->size();
  const bool root = rank == 0;
  const int64_t batches = summary_.batches, batch_size = exp_.runtime.batch_size;
  const bool progress_on = opt_.progress && root;
  if (complete_) {
    if (root) {
      summary_.sequences = folder_->recorded_sequences();
      summary_.failed = folder_->recorded_failed();
      if (opt_.progress) std::fprintf(stderr, "run: %s is already complete; nothing to do\n", summary_.dir.c_str());
    }
    return summary_;
  }
  std::vector<int64_t> todo;
  for (int64_t k = 0; k < batches; ++k)
    if (!done_.count(k)) todo.push_back(k);
  Progress progress(progress_on, summary_.items);
  int64_t items_done = std::min<int64_t>(summary_.items, static_cast<int64_t>(done_.size()) * batch_size);
  progress.resumed_at(items_done);
  if (!done_.empty() && progress_on)
    std::fprintf(stderr, "run: resuming %s: %zu of %lld batches already done\n", summary_.dir.c_str(), done_.size(),
                 static_cast<long long>(batches));
  if (progress_on)
    std::fprintf(stderr, "run: %zu batches over %d ranks\n", todo.size(), N);
  const size_t rounds = (todo.size() + static_cast<size_t>(N) - 1) / static_cast<size_t>(N);
  auto mine = [&](size_t round) -> int64_t {
    const size_t i = round * static_cast<size_t>(N) + static_cast<size_t>(rank);
    return i < todo.size() ? todo[i] : -1;
  };
  const bool prefetch = exp_.runtime.workers > 0;
  auto encode = [this](int64_t k) { return batcher_->encode_batch(k); };
  std::future<EncodedBatch> next;
  if (rounds > 0 && prefetch && mine(0) >= 0) next = std::async(std::launch::async, encode, mine(0));
  int64_t failed = 0;
  for (size_t round = 0; round < rounds; ++round) {
    const int64_t k = mine(round);
    json out = {{"k", k}};
    const int signal = stop_signal();
    if (signal) out["stop"] = signal;
    if (k >= 0 && !signal) {
      const auto t_wait = std::chrono::steady_clock::now();
      EncodedBatch eb = prefetch ? next.get() : encode(k);
      summary_.wait_seconds += run::seconds_since(t_wait);
      if (prefetch && mine(round + 1) >= 0) next = std::async(std::launch::async, encode, mine(round + 1));
      run::ShardContent shard;
      Status st = model_->compute(k, eb, items_, *writers_, &shard);
      if (st.ok()) st = writers_->write_shard(k, std::move(shard.records), shard.values);
      summary_.largest_forward = std::max(summary_.largest_forward, model_->largest_forward());
      out["content"] = eb.content;
      out["failed"] = static_cast<int64_t>(eb.errors.size());
      if (!st.ok()) out["error"] = {{"code", static_cast<int>(st.code())}, {"message", st.message()}};
    }
    Result<std::vector<std::string>> all = comm_->allgather(out.dump());
    if (!all.ok()) {
      if (next.valid()) next.wait();
      return all.status().with_prefix("rank " + std::to_string(rank) + ": exchanging round " + std::to_string(round));
    }
    std::vector<json> outcomes;
    for (const std::string& t : *all) outcomes.push_back(json::parse(t));
    int stop = 0;
    for (int r = 0; r < N; ++r) {
      const json& o = outcomes[static_cast<size_t>(r)];
      if (o.contains("error")) {
        if (next.valid()) next.wait();
        const Code code = static_cast<Code>(o["error"]["code"].get<int>());
        if (r == rank) return Status(code, "rank " + std::to_string(r) + ": " + o["error"]["message"].get<std::string>());
        return Status(code, root ? "rank " + std::to_string(r) + " failed (its message is above); the batches "
                                   "recorded in the manifest are kept"
                                 : std::string());
      }
      if (o.contains("stop")) stop = o["stop"].get<int>();
    }
    for (int r = 0; r < N; ++r) {  // rank 0 records the round's batches, in rank order
      const json& o = outcomes[static_cast<size_t>(r)];
      const int64_t kr = o["k"].get<int64_t>();
      if (kr < 0 || !o.contains("content")) continue;
      done_.insert(kr);
      if (root) TSR_RETURN_IF_ERROR(folder_->mark_done(kr, o["content"].get<uint64_t>()));
      failed += o["failed"].get<int64_t>();
      items_done = std::min<int64_t>(summary_.items, items_done + batch_size);
    }
    progress.update(items_done, failed);
    if (root && opt_.on_batch) opt_.on_batch(static_cast<int64_t>(done_.size()), batches);
    if (stop) {
      if (next.valid()) next.wait();
      if (root) {
        progress.update(items_done, failed, true);
        return stopped(stop, t0);
      }
      summary_.stopped_by = stop;
      summary_.batches_kept = static_cast<int64_t>(done_.size());
      return summary_;
    }
  }
  // Rank 0 merges the shards; the others wait to hear how it went.
  Status merged = Status::Ok();
  if (root) {
    merged = writers_->merge(batches, &summary_.sequences, &summary_.failed);
    if (merged.ok()) merged = folder_->finish(summary_.sequences, summary_.failed);
  }
  json end = {{"ok", merged.ok()}, {"code", static_cast<int>(merged.code())}, {"sequences", summary_.sequences},
              {"failed", summary_.failed}};
  Result<std::vector<std::string>> all = comm_->allgather(root ? end.dump() : std::string("{}"));
  if (!merged.ok()) return merged;
  if (!all.ok()) return all.status().with_prefix("rank " + std::to_string(rank) + ": hearing the merge");
  if (!root) {
    end = json::parse((*all)[0]);
    if (!end["ok"].get<bool>()) return Status(static_cast<Code>(end["code"].get<int>()), "");
    summary_.sequences = end["sequences"].get<int64_t>();
    summary_.failed = end["failed"].get<int64_t>();
  }
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
