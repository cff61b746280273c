// The per-task outputs of a batch run: each batch's records (one JSON line per sequence and per
// bad item) and values (embeddings or hidden rows) written as its shard, attention maps, and at
// the end the shards merged into the run's outputs (embeddings.npy / hidden.npy, index.jsonl /
// predictions.jsonl / completions.jsonl, rows.jsonl, errors.jsonl). Also the reverse: a finished
// run's outputs cut back into shards, for a resume that redoes some batches. No model calls here.
#pragma once

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "batcher.h"
#include "run_common.h"
#include "tessera/model.h"

namespace tessera::run {

class Writers {
 public:
  // score_decoder: the text of a predicted token (task score); may be null otherwise.
  Writers(const Experiment& exp, std::filesystem::path dir, const std::vector<DataItem>& items,
          std::vector<std::string> class_names, int64_t batch_size, const Encoder* score_decoder);

  // The file of the run's outputs that holds one line per sequence.
  std::string sequences_leaf() const;

  // One record per sequence of a forward chunk (seqs[0..n), placed as `placed` says), with what
  // the task adds (classify: top classes from probs (n, K); score: from out.logits), and their
  // attention maps written; records[i] stays null for a sequence whose skip[i] is set (its outputs
  // are not finite). task hidden: the caller sets "start", which counts the batch's rows.
  Status sequence_records(const Sequence* seqs, size_t n, const Placed& placed, const Outputs& out, const Tensor& probs,
                          const std::vector<bool>& skip, std::vector<json>* records) const;
  json sequence_record(const Sequence& s) const;  // id, item, rows, name, label (the common part)
  static json error_record(const ItemError& e);

  // Batch k's shard: shards/batch-k.jsonl (records sorted by item) and .npy (values, if any).
  Status write_shard(int64_t k, std::vector<json> records, const Tensor& values) const;

  // Why batch k's shard cannot be merged (cut short, garbage, records of other items, vectors
  // that do not match its records, missing), naming the file and line; ok when it can.
  Status check_shard(int64_t k) const;

  // The shards of batches [0, batches) merged into the outputs; counts sequences and failures.
  Status merge(int64_t batches, int64_t* sequences, int64_t* failed) const;
  // A finished run's merged outputs cut back into shards, one per batch in `keep`, as
  // write_shard() wrote them. The merged files stay until merge() replaces them.
  Status unmerge(const std::set<int64_t>& keep) const;

 private:
  // Batch k's shard: its records, each checked as merge() reads it, and its values (undefined
  // when the task has none or the batch no sequence).
  struct Shard {
    std::vector<json> records;
    Tensor values;
  };
  Result<Shard> read_shard(int64_t k) const;
  bool has_values() const;
  Status write_attention(const Sequence& s, int64_t b, int64_t start, const Outputs& out) const;
  Status prune_attention(const std::vector<std::string>& ids) const;
  std::vector<int64_t> attention_heads() const;
  std::string class_name(int64_t k) const;

  const Experiment& exp_;
  std::filesystem::path dir_;
  const std::vector<DataItem>& items_;
  std::vector<std::string> class_names_;
  int64_t batch_size_;
  const Encoder* score_decoder_;
};

// The class names a classify task writes: task.labels (a file, one name per line) or
// model.head.labels; empty for other tasks.
Result<std::vector<std::string>> class_names(const Experiment& exp);

// The rows of a sequence as rows.jsonl records them: role, position, token, provenance, plugin.
json provenance_json(const Sequence& s);

}  // namespace tessera::run
