// Batch runs: an experiment over a whole dataset — the main job of `tessera run`.
//
//   dataset (dir / glob / manifest / FASTA / lines / IDX) -> items -> plugins -> token rows
//     -> batches (padding or packing) -> model -> outputs in the run folder
//
//   RunOptions opt;  opt.resume = true;
//   Result<RunSummary> r = run_experiment(exp, opt);   // exp from load_experiment()
//
// The run folder holds: manifest.json (what ran: config and model hashes, plugin versions, batches
// done), errors.jsonl (one line per bad item: id, file, reason), and by task: embeddings.npy +
// index.jsonl (embed), hidden.npy + index.jsonl with row offsets (hidden), predictions.jsonl
// (classify, score), completions.jsonl (generate), rows.jsonl (provenance of every row), attention/ (.npy per item and layer,
// PNG heatmaps). See docs/RUNS.md.
//
// Nothing is lost: each batch's outputs are written atomically (temp file, fsync, rename) before the
// manifest records the batch as done, with a hash of its items' content; a killed run continues
// with `resume` from the batches not done and ends with byte-identical outputs; a resume redoes
// the finished batches whose items changed since, and refuses when the config (incl. batch size
// and threads, which decide the arithmetic), the model or a file the plugins read changed. A bad
// item is recorded and skipped;
// the summary counts it. Progress goes to stderr.
//
// One run at a time per folder: a run locks it (run.lock, flock(), holding the pid) and a second
// one is refused naming that pid; a resume checks every manifest field and finished shard it
// reads (a damaged shard is redone); RunOptions::stop ends a run cleanly between batches.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config.h"
#include "tessera/generate.h"
#include "tessera/model.h"
#include "tessera/plugins.h"
#include "tessera/status.h"

namespace tessera {

// ---------------------------------------------------------------------------------------------
// Datasets

// One input of one item for one plugin: a file (read when the item is encoded), a span of text,
// or bytes made while the dataset was listed.
struct ItemPart {
  std::string path;           // a file to read whole (TSR_INPUT_FILE plugins), or the text's file;
                              // with `in_memory`, the file the bytes came from (for messages)
  bool is_text = false;       // text: the bytes [offset, offset + length) of `path`, or `text`
  std::string text;           // inline text (manifests)
  uint64_t offset = 0, length = 0;
  uint32_t line = 0;          // the text's first line in `path` (1-based), 0 when not from a file
  bool missing = false;       // no input for this plugin (a manifest with data.allow_missing)
  bool in_memory = false;     // the input is `bytes`, not read from `path`
  std::string bytes;          // in_memory: a whole file's bytes (an IDX image as a binary PGM file)
};

struct DataItem {
  std::string id;                 // stable and unique: "cats/tabby.jpg", "uniprot.fasta#12", "kjv.txt:17",
                                  // "t10k-images-idx3-ubyte.gz#0" (an IDX image's index, from 0)
  std::string name;               // a human name when the format has one (FASTA record name), else ""
  std::vector<ItemPart> parts;    // one per plugin, in plugin order (some `missing` if allowed)
  std::optional<std::string> label;  // from a manifest's label column, or an IDX labels file
  std::string error;                 // non-empty: the item is broken before any plugin sees it
  std::string source;                // the manifest that listed the item (for errors), else ""

};

// Lists a dataset's items (format auto-detected unless given). `plugins` say which inputs each item
// needs: text or files, and which file extensions a directory scan picks. Problems with the
// dataset itself (a missing file, a malformed manifest line) are errors naming the file and line.
struct PluginInput {
  std::string name;
  tsr_input_kind kind = TSR_INPUT_FILE;
  std::vector<std::string> extensions;
};
Result<std::vector<DataItem>> read_dataset(const DataConfig& data, const std::vector<PluginInput>& plugins);

// The bytes one part of an item hands its plugin: the whole file, or the text span. `max_bytes`
// > 0: a part larger than that is refused, naming runtime.max_item_bytes, before it is read.
Result<std::string> item_part_bytes(const ItemPart& part, int64_t max_bytes = 0);

// ---------------------------------------------------------------------------------------------
// Runs

struct RunOptions {
  std::string out_dir;   // overrides outputs.dir when non-empty
  bool resume = false;   // continue the run in out_dir
  bool force = false;    // start over in a run folder that already has a run
  bool progress = true;  // items/s and ETA on stderr
  // Called after each batch is committed (tests use it to stop a run midway).
  std::function<void(int64_t batches_done, int64_t batches_total)> on_batch;
  // Read before each batch: once it holds a signal number (`tessera run` sets it from its SIGTERM
  // and SIGINT handler), the run stops after the batch being written. Every batch it finished is
  // kept, manifest.json says "stopped" and lists them, and the summary says stopped_by; a resume
  // continues from there. Null: the run goes to its end.
  const std::atomic<int>* stop = nullptr;
};

struct RunSummary {
  std::string dir;          // the run folder
  int64_t items = 0;        // items in the dataset (after data.limit)
  int64_t sequences = 0;    // sequences written (an item can give several: windows)
  int64_t failed = 0;       // items recorded in errors.jsonl
  int64_t batches = 0;
  int64_t batches_resumed = 0;  // batches found done and skipped
  int64_t batches_redone = 0;   // batches found done whose items changed since: computed again
  int stopped_by = 0;            // the signal that stopped the run (RunOptions::stop), 0 if it ran to its end
  int64_t batches_kept = 0;      // stopped: the batches done in the run folder (resumed ones included)
  int64_t largest_forward = 0;  // the most sequences in one forward pass (at most runtime.batch_size)
  double seconds = 0;
  // Where the seconds went: setting up (plugins, the model, listing the dataset), the model
  // (forward passes and heads), and the model's thread waiting for the plugins' rows (decoding
  // not hidden behind the model: all of it with runtime.workers 0). The rest is writing outputs.
  double setup_seconds = 0, model_seconds = 0, wait_seconds = 0;
};

// Runs the experiment over its dataset. Failures that stop the run (no dataset, plugins that do
// not fit the model, a run folder in the way, a resume that does not match) come back as a status;
// bad items do not: they are counted in the summary.
Result<RunSummary> run_experiment(const Experiment& exp, const RunOptions& options);

// How several plugins share one model stem (a multimodal sequence): each token plugin's ids get
// their own block of embedding rows, after the earlier token plugins' vocabularies; each feature
// plugin's rows their own columns of the stem's input, after the earlier feature plugins' widths,
// zero elsewhere. One shared projection over disjoint columns is exactly one projection per
// modality, and so is one table over disjoint id blocks. With a single plugin every offset is 0.
struct StemLayout {
  std::vector<int64_t> id_offset;  // per plugin: added to its ids (token plugins)
  std::vector<int64_t> column;     // per plugin: its first column (feature plugins)
  int64_t vocab = 0;               // embedding rows the token plugins need in all
  int64_t width = 0;               // columns the feature plugins fill in all
};
StemLayout stem_layout(const std::vector<tsr_encoder_info>& plugins);

// A look at a dataset before a run (`tessera check`): its items listed, the first `max_items`
// encoded by the plugins, and the rows each sequence would have. Nothing is written.
struct DatasetPreview {
  int64_t items = 0;                 // in the dataset (after data.limit)
  int64_t sampled = 0;               // items encoded
  std::vector<int64_t> rows;         // per sequence of the sampled items
  std::vector<std::string> errors;   // per sampled item that failed: "ID: FILE: reason"
};
Result<DatasetPreview> preview_dataset(const Experiment& exp, int64_t max_items);

// Problems between the experiment's plugins and its model (row kinds, vocabulary, feature width,
// modalities), as diagnostics at the plugin's place in the YAML. Creates one encoder per plugin.
void check_plugins_fit(const Experiment& exp, Diagnostics* diags);

// ---------------------------------------------------------------------------------------------
// Generation (task.kind generate, `tessera generate`)

// The experiment's plugin as generation uses it, to encode prompts and decode the new tokens:
// exactly one plugin, reading text and giving token ids, with the model's vocabulary (so every id
// the model can generate has a text). Refusals say what to change.
Result<Encoder> generation_encoder(const Experiment& exp);

// task.generate as GenerateOptions (without decode and callbacks).
GenerateOptions generate_options(const GenerateConfig& c);

}  // namespace tessera
