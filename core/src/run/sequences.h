// One dataset item through the experiment's plugins into the sequences the model reads: each
// input's bytes encoded by its plugin, and the plugins' rows joined in the stem's layout (token
// ids shifted into the plugin's block, feature rows written into its columns, a kind and a
// modality per row). The batch run (batcher.cpp) and training (core/src/train/trainer.cpp) both
// call encode_item, so a training example is exactly the batch run's sequence for the same item.
// It reads no file itself (the caller hands it each input's bytes) and writes nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/config.h"
#include "tessera/plugins.h"
#include "tessera/run.h"

namespace tessera::run {

// One plugin's block of rows in a sequence: rows [begin, end) came from plugin `plugin` (its index
// in the experiment's plugins), with that plugin's patch grid (0 × 0 for rows without one).
struct SequencePart {
  int32_t plugin = 0;
  int64_t begin = 0, end = 0;
  int grid_rows = 0, grid_cols = 0;
};

// One sequence ready for the model: an item's rows (all its plugins' rows, concatenated), or one
// window of an item.
struct Sequence {
  int64_t item = 0;
  std::string id;
  TokenRows rows;                  // with several plugins: ids shifted, features in the plugin's columns
  std::vector<uint8_t> kinds;      // per row: 0 token row, 1 feature row (kept only for stem.kind mixed)
  std::vector<int32_t> modality;   // per row: the plugin it came from (kept only with stem.modalities)
  std::vector<SequencePart> parts; // the plugins' blocks, in row order
  int64_t picture_begin = 0, picture_end = -1;  // the rows of the plugin that drew rows.picture; -1: all
};

// runtime.max_item_bytes, max_item_rows, item_timeout_s and worker_memory_mb as ItemLimits.
ItemLimits item_limits(const RuntimeConfig& rt);

// An encoder put under the run's item limits: in a worker process of its own (runtime.isolate;
// forks, so call it before the process starts threads), or in-process under the same size limits.
// An item that crashes, hangs or floods a plugin is then one bad item (docs/PLUGINS.md).
Status confine_encoder(Encoder& encoder, const RuntimeConfig& rt);

// An item's inputs as its plugins get them: each part's bytes, or why they cannot be read (empty
// for a missing part). Nothing is read for an item that is broken before any plugin sees it.
std::vector<Result<std::string>> read_parts(const DataItem& item, int64_t max_bytes);

// The one place where an item's input meets a plugin.
Result<std::vector<TokenRows>> encode_part(const Encoder& enc, const PluginItem& pi);

// What encode_item makes of one item: its sequences, or why it is a bad item (the file at fault,
// else the manifest that listed it, and the reason).
struct ItemSequences {
  std::vector<Sequence> seqs;
  std::string file, reason;
  bool ok() const { return reason.empty(); }
};

struct AssembleOptions {
  // A sequence longer than learned or sinusoidal positions reach is a bad item. Off for a language
  // model's stream, whose items are cut into windows of train.seq_len afterwards.
  bool check_max_len = true;
};

// Item `index` (`bytes` from read_parts) through `encoders` (one per plugin, in plugin order), its
// rows placed in `layout` (stem_layout of the encoders' infos). One input gives that plugin's
// sequences (windows included); several give one sequence, their rows one block after the other in
// plugin order, and each plugin must give exactly one sequence. kinds and modality are kept only
// where the model reads them (stem.kind mixed, stem.modalities > 0).
ItemSequences encode_item(const Experiment& exp, const StemLayout& layout, const std::vector<Encoder>& encoders,
                          const DataItem& item, int64_t index, const std::vector<Result<std::string>>& bytes,
                          const AssembleOptions& options = {});

// model.head.tasks: the task of a sequence, the one task whose plugin gave rows of it (its index
// into model.head.tasks). -1 when none or two tasks' plugins did, with *why saying which.
// The sequences are seqs[0 .. n): one item's.
int32_t sequence_task(const Experiment& exp, const Sequence* seqs, size_t n, std::string* why);
inline int32_t sequence_task(const Experiment& exp, const std::vector<Sequence>& seqs, std::string* why) {
  return sequence_task(exp, seqs.data(), seqs.size(), why);
}

}  // namespace tessera::run
