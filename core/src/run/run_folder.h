// The run folder of a batch run: where it is, what manifest.json records (what the run is computed
// from, the batches done with their content hashes, its state), the checks a resume makes before
// it trusts what is there, and the end of a run (manifest "complete", shards removed). The
// outputs' formats are the writers'; this part only knows the folder's layout.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "run_common.h"
#include "tessera/model.h"
#include "tessera/plugins.h"
#include "tessera/run.h"

namespace tessera::run {

// What a run is computed from, as the manifest records it and a resume compares it.
struct RunIdentity {
  struct PluginId {
    std::string name, version, modality;
  };
  struct DataFile {
    std::string what, path, hash;  // "plugin text's option vocab", its absolute path, file_hash()
  };
  std::string experiment, task;
  std::string config_hash, model_hash;
  std::vector<PluginId> plugins;
  std::vector<DataFile> files;  // what the plugins read besides the items: their libraries, the files their options name
  int64_t items = 0, batch_size = 1, batches = 0;
};

// A file's bytes hashed (a folder: each file below it, by name, in order), or, when it cannot be
// read, a hash of why.
std::string file_hash(const std::string& path);

// A run's identity: the configuration, the model's weights, the plugins and the files they read.
RunIdentity run_identity(const Experiment& exp, const Model& model,
                         const std::vector<std::shared_ptr<const Plugin>>& plugins, int64_t items, int64_t batches);

// What a resume asks of the other parts of the run.
struct ResumeHooks {
  std::function<uint64_t(int64_t)> content_now;                 // batch k's content as its items are now
  std::function<Status(int64_t)> check_shard;                   // why batch k's shard cannot be merged, if it cannot
  std::function<Status(const std::set<int64_t>&)> unmerge;      // a finished run's outputs back into these shards
};

class RunFolder {
 public:
  RunFolder(std::filesystem::path dir, RunIdentity id) : dir_(std::move(dir)), id_(std::move(id)) {}
  ~RunFolder();  // releases the lock (run.lock goes)
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;

  const std::filesystem::path& dir() const { return dir_; }

  // Opens the folder for this run. First it takes the folder's lock (run.lock, flock()ed, holding
  // the pid): a second run on a folder a live run holds is refused, naming that run's pid; a lock
  // left by a run that is gone is taken over. Then it removes the temporary files of atomic
  // writes that a killed run left (".NAME.tmp.PID.N"). Then: a new run; --force: the earlier run's files removed; --resume:
  // every field of manifest.json checked for its type (a wrong one is a refusal naming it), the
  // earlier run checked against this one (refused when what it is computed from changed), its
  // finished batches kept unless their items changed (content_now(k) differs from the recorded
  // hash) or their shards are damaged (check_shard(k): cut short, garbage, missing; said on
  // stderr), and a finished run whose items changed cut back into shards (unmerge(kept batches)).
  // Leaves the manifest saying "running", unless the resume found the run complete.
  Status open(const RunOptions& opt, const ResumeHooks& hooks, bool with_attention);

  bool complete() const { return complete_; }           // --resume found the run finished: nothing to do
  const std::set<int64_t>& done() const { return done_; }
  int64_t resumed() const { return resumed_; }
  int64_t redone() const { return redone_; }
  int64_t recorded_sequences() const { return recorded_sequences_; }  // of a complete run, from its manifest
  int64_t recorded_failed() const { return recorded_failed_; }

  // Batch k's outputs are in its shard: the manifest records it as done, with its content hash.
  Status mark_done(int64_t k, uint64_t content);
  // The run stops before its end (a signal): the manifest says "stopped", with the batches done.
  Status stop() const { return write_manifest("stopped"); }
  // The outputs are merged: the manifest says "complete", and the shards go.
  Status finish(int64_t sequences, int64_t failed);

 private:
  Status check_resume(const json& m, const RunOptions& opt, const ResumeHooks& hooks);
  Status write_manifest(const std::string& state, int64_t sequences = 0, int64_t failed = 0) const;
  Status lock();
  void remove_temporaries(bool progress) const;

  std::filesystem::path dir_;
  RunIdentity id_;
  std::set<int64_t> done_;
  std::map<int64_t, std::string> content_;  // per batch done: the hash of its items' content
  bool complete_ = false;
  int64_t resumed_ = 0, redone_ = 0, recorded_sequences_ = 0, recorded_failed_ = 0;
  int lock_fd_ = -1;  // run.lock, flock()ed while this run holds the folder
};

}  // namespace tessera::run
