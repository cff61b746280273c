// The model side of a batch run: the model built once the memory plan allows it, the task's needs
// checked against the model, and each encoded batch run through the model in forward chunks of at
// most runtime.batch_size sequences, into its shard's records and values. An item whose outputs
// are not finite becomes a bad item naming the first layer that made them. Nothing here reads an
// item or writes a file: the batcher encodes, the writers make the records and write.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "batcher.h"
#include "run_common.h"
#include "tessera/config.h"
#include "tessera/generate.h"
#include "tessera/model.h"
#include "writers.h"

namespace tessera::run {

// One batch's shard as the writers write it: a JSON record per sequence and per bad item, and the
// values (embed: the vectors (N, C); hidden: the rows (sum of rows, C); otherwise undefined).
struct ShardContent {
  std::vector<json> records;
  Tensor values;
};

class BatchModel {
 public:
  explicit BatchModel(const Experiment& exp) : exp_(exp) {}

  // The memory plan checked (rows per item are not known before encoding: the plan takes
  // bench.seq_len, as `tessera check` does), the model built, and the task checked against it
  // (generate: its settings and the decoder that gives the new tokens their text).
  Status build();
  const Model& model() const { return *model_; }

  // Batch k through the model; `items` names the bad items' files.
  Status compute(int64_t k, const EncodedBatch& eb, const std::vector<DataItem>& items, const Writers& writers,
                 ShardContent* shard);

  double model_seconds() const { return model_seconds_; }   // forward passes and heads (generate: all of it)
  int64_t largest_forward() const { return largest_forward_; }  // sequences in the largest forward pass

 private:
  Status check_task();
  // One sequence's outputs while its batch runs: its record and values, or why it is not finite.
  struct SeqOutput {
    int64_t item = 0;
    json record;
    Tensor values;          // embed: (1, C); hidden: (rows, C); else undefined
    std::string nonfinite;  // non-empty: the item is bad, for this reason
  };
  Status forward_chunk(const Sequence* seqs, size_t n, int64_t k, const Writers& writers, std::vector<SeqOutput>* outs);
  Status generate_records(const Sequence* seqs, size_t n, const Writers& writers, std::vector<json>* records);

  const Experiment& exp_;
  std::optional<Model> model_;
  std::optional<Encoder> decoder_;  // generate: the new tokens' text, apart from the plugin workers
  GenerateOptions generate_;        // generate: task.generate
  double model_seconds_ = 0;
  int64_t largest_forward_ = 0;
};

}  // namespace tessera::run
