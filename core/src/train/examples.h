// Training examples and their batches (private to the trainer): an encoded sequence kept as a
// training example (each feature row only its own plugin's columns), and examples back into a
// padded Batch exactly as run::place_sequences lays out the same sequences, each plugin's rows
// augmented by that plugin where it augments. Reads and encodes nothing itself.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "run/sequences.h"
#include "tessera/config.h"
#include "tessera/fileio.h"
#include "tessera/model.h"
#include "tessera/plugins.h"
#include "tessera/run.h"

namespace tessera::train {

// Two seeds into one: what the trainer keys its draws with.
inline uint64_t mix(uint64_t a, uint64_t b) { return fnv1a(&b, sizeof b, fnv1a(&a, sizeof a)); }

// How examples become a Batch: what the stem reads, and where each plugin's rows go in it. With
// several plugins an item is one sequence built as a batch run builds it (run::encode_item: ids
// shifted into each token plugin's block, feature rows in each feature plugin's columns), so
// make_batch gives the batch run's batch for the same items.
struct RowFormat {
  bool ids = true;        // the stem reads token ids (stem.kind tokens, mixed)
  bool rows = false;      // the stem reads feature rows (features, mixed, identity)
  bool kinds = false;     // stem.kind mixed: Batch::kinds, a kind per row
  bool modality = false;  // stem.modalities > 0: Batch::modality, the plugin per row
  int64_t width = 0;      // F, the stem's input columns
  struct Plugin {
    bool features = false;  // gives feature rows (else token ids)
    int64_t column = 0;     // its first column of F
    int64_t width = 0;      // its rows' width
  };
  std::vector<Plugin> plugins;
};

struct Example {
  std::vector<int32_t> ids;    // per row, where the stem reads ids (shifted into the plugin's block)
  // Feature rows, each row only its own plugin's columns: the rows of each feature part in turn,
  // (end - begin) × that plugin's width values (one plugin: the rows as the plugin gave them).
  std::vector<float> rows;
  std::vector<uint8_t> roles;  // per row
  std::vector<run::SequencePart> parts;  // the plugins' blocks of rows, in order
  // Kept only where a plugin augments: what its augment() reads besides rows.
  std::vector<std::array<int32_t, 2>> positions;
  int32_t label = -1;
  int32_t task = -1;  // model.head.tasks: the index of its task (-1: no tasks)
  int64_t n() const { return static_cast<int64_t>(roles.size()); }
};

// The row format of `m` over these encoders (one per plugin), laid out as `layout` says.
RowFormat row_format(const ModelConfig& m, const std::vector<Encoder>& encoders, const StemLayout& layout);

// A sequence as a training example: its ids where the stem reads them, and each feature row's own
// plugin's columns only (a row of one plugin is zero in every other plugin's columns). Positions
// are kept for augmentation when `keep_positions`.
Example make_example(const RowFormat& f, const run::Sequence& s, int32_t label, bool keep_positions);

// Training augmentation: each plugin's seeded transform of its own feature rows in each example,
// drawn from (train.seed, step, the example's index) and, with several plugins, the plugin's index,
// so a resumed run draws what the uninterrupted one drew.
struct Augment {
  std::vector<const Encoder*> encoders;  // per plugin; null: it does not augment (empty: none does)
  bool several = false;                  // the experiment has several plugins
  uint64_t seed = 0;                     // (train.seed, step)
  std::vector<int64_t> index;            // each example's index in the training set
};

// The examples as one padded batch (classify), augmented when `aug` says so: what
// run::place_sequences makes of the same items' sequences without packing (ids, feature rows in
// each plugin's columns, roles, lengths, and kinds and modality where the stem reads them).
// `labels` gets each example's label.
Result<Batch> make_batch(const RowFormat& f, const std::vector<const Example*>& ex, Tensor* labels,
                         const Augment* aug = nullptr);

}  // namespace tessera::train
