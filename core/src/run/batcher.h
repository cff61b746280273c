// The batcher: a run's items -> encoded batches (each item's inputs read once, hashed, and turned
// into token rows by the plugins on worker threads), and encoded sequences -> the model's Batch
// (padded or packed). It writes nothing and knows nothing of the run folder.
//
// Batch k (the unit the manifest records as done) is items [k * batch_size, (k + 1) * batch_size).
// Its sequences go to the model in forward chunks of at most batch_size sequences
// (forward_chunks), so an item that gives thousands of windows never makes one huge forward.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "run_common.h"
#include "tessera/config.h"
#include "tessera/model.h"
#include "tessera/plugins.h"
#include "tessera/run.h"

namespace tessera::run {

// The bytes of one input (a whole file, a span of a text file, inline text, bytes in memory).
// `max_bytes` > 0: a part larger than that is refused before it is read (runtime.max_item_bytes).
Result<std::string> item_bytes(const ItemPart& p, int64_t max_bytes = 0);

// What an item's outputs are computed from, besides the configuration (see batcher.cpp), and a
// batch's content: its items' hashes in item order.
uint64_t item_content_hash(const DataItem& item, const std::vector<Result<std::string>>& bytes);
uint64_t batch_content(const std::vector<uint64_t>& item_hashes);

// The experiment's plugins loaded and, for each of runtime.workers decoding threads, one encoder
// per plugin: each in a worker process of its own (runtime.isolate; forked here, so call this
// before the model starts its threads), or in-process under the same item limits
// (confine_encoder, sequences.h).
// encoders: [worker][plugin].
Status open_encoders(const Experiment& exp, std::vector<std::shared_ptr<const Plugin>>* plugins,
                     std::vector<std::vector<Encoder>>* encoders);

class Batcher {
 public:
  // encoders: [worker][plugin]; workers decode the items of a batch side by side.
  Batcher(const Experiment& exp, const std::vector<DataItem>& items, std::vector<std::shared_ptr<const Plugin>> plugins,
          std::vector<std::vector<Encoder>>* encoders, StemLayout layout, int64_t batch_size);

  int64_t batches() const;
  std::pair<int64_t, int64_t> item_range(int64_t k) const;  // [begin, end)
  // Batch k's items read, hashed and encoded, in item order whatever the number of workers.
  EncodedBatch encode_batch(int64_t k);
  // Batch k's content as its items are now (the hash encode_batch() would give), for a resume.
  uint64_t content_now(int64_t k) const;

 private:
  // Item `index` read, hashed and encoded (sequences.h's encode_item) into `out`.
  void encode_item(int64_t index, std::vector<Encoder>& encs, EncodedBatch* out) const;

  const Experiment& exp_;
  const std::vector<DataItem>& items_;
  std::vector<std::shared_ptr<const Plugin>> plugins_;
  std::vector<std::vector<Encoder>>* encoders_;
  StemLayout layout_;
  int64_t batch_size_;
};

// A batch's sequences in forward chunks of at most `max_sequences` each, in order: [begin, end)
// indices into the sequences.
std::vector<std::pair<size_t, size_t>> forward_chunks(size_t n_sequences, int64_t max_sequences);

// Sequences placed in a model batch: one per batch row (padding) or packed first-fit into rows as
// long as the longest. at[i] = (batch row, first row) of sequence i.
struct Placed {
  Batch batch;
  std::vector<std::pair<int64_t, int64_t>> at;
};
Placed place_sequences(const ModelConfig& m, const Sequence* seqs, size_t n, bool packing);

}  // namespace tessera::run
