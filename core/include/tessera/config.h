// Experiment and model configuration: typed structs, filled from YAML by one loader.
// The YAML library stays inside core/src/config/; nothing here names it.
//
//   tessera::Diagnostics diags;
//   tessera::LoadOptions opts;
//   opts.overrides = {"model.n_layers=2"};                     // --set on the command line
//   std::optional<tessera::Experiment> exp = tessera::load_experiment("exp.yaml", opts, &diags);
//   if (!exp) { fputs(diags.str().c_str(), stderr); return 2; }  // every problem, all at once
//
// Every problem is reported as `file:line:col: key.path: problem (hint)`, and all of them are
// collected before anything runs: unknown keys (with a "did you mean"), wrong types, values out of
// range, inconsistent values (n_heads not dividing d_model, ...), a missing include or weights
// file. Each key, its type, default and meaning is listed by config_schema(); docs/CONFIG.md is
// generated from it and a test keeps the two equal.
//
// Keys whose default depends on other keys (d_k = d_model / n_heads, causal = arch is decoder,
// ...) are resolved by the loader, so the structs below always hold final values and
// `tessera check` can print them.
//
// Thread-safety: the loader keeps no state between calls; several threads may load at once.
// The structs are plain values (an InlineTensor's Tensor shares its storage when copied).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/ops.h"
#include "tessera/random.h"
#include "tessera/tensor.h"

namespace tessera {

// ---------------------------------------------------------------------------------------------
// Where a value came from, and what is wrong with it.

struct Location {
  std::string file;  // the YAML file as named to the loader; for an override, "--set " + the
                     // argument ("--set model.n_layers=2")
  int line = 0;      // 1-based; 0 when unknown, and always 0 for an override
  int col = 0;       // 1-based; for an override, the column in the argument (0: the whole of it)
};

struct Diagnostic {
  Location where;
  std::string key;      // full key path, "model.attention.scale"; "" for file-level problems
  std::string problem;  // what is wrong, with the bad value
  std::string hint;     // what to do; may be empty
  // "file:line:col: key: problem (hint)"; without " (hint)" when there is none, without "key: "
  // for problems of the file itself, as "file: ..." when line and col are both 0, and as
  // "--set key=value, column 7: ..." for a place in an override (line 0).
  std::string str() const;
};

class Diagnostics {
 public:
  void add(Location where, std::string key, std::string problem, std::string hint = "");
  bool empty() const { return items_.empty(); }
  size_t size() const { return items_.size(); }
  const std::vector<Diagnostic>& items() const { return items_; }
  std::string str() const;  // one per line, sorted by file, then line, then col
 private:
  std::vector<Diagnostic> items_;
};

// ---------------------------------------------------------------------------------------------
// Upper bounds of the sizes a config (YAML, --set, a Hugging Face config.json) and the command
// line may ask for. Each is far above any published model, and small enough that every product
// the runtime forms from them (table rows × width, width × hidden width × layers, rows² × heads ×
// batch, ...) stays inside 64 bits, so no size wraps around into a small allocation. A model inside
// them may still not fit the machine: that is the memory plan's check (tessera/machine.h), made
// before anything is allocated. docs/RELIABILITY.md lists them with their reasons.
namespace limits {
// d_model, d_k, d_v, positions.rotary_dims (GPT-3's d_model: 12,288).
inline constexpr int64_t kWidth = int64_t{1} << 16;
// d_ff, stem.n_features, and n_heads * d_k, n_heads * d_v (PaLM's d_ff: 73,728).
inline constexpr int64_t kHidden = int64_t{1} << 20;
// n_layers (published models: at most ~128).
inline constexpr int64_t kLayers = int64_t{1} << 12;
// n_heads.
inline constexpr int64_t kHeads = int64_t{1} << 12;
// vocab_size, n_classes, top_k, token ids in lists (ids are int32; the largest published
// vocabulary has ~256k tokens).
inline constexpr int64_t kVocab = int64_t{1} << 24;
// positions.max_len, seq_len (bench, train), max_new_tokens: 1M rows.
inline constexpr int64_t kSequence = int64_t{1} << 20;
// positions.max_distance.
inline constexpr int64_t kDistance = int64_t{1} << 16;
// stem.token_types, stem.modalities.
inline constexpr int64_t kTable = int64_t{1} << 16;
// runtime.threads, runtime.workers, --threads: libgomp dies (SIGSEGV) when it cannot start them.
inline constexpr int64_t kThreads = 1024;
// runtime.batch_size, bench.batch, train.batch_size, train.accumulate, --batch-size.
inline constexpr int64_t kBatch = int64_t{1} << 16;
// train step counts: max_steps, warmup_steps, eval_every, log_every.
inline constexpr int64_t kSteps = int64_t{1} << 40;
// train.epochs.
inline constexpr int64_t kEpochs = int64_t{1} << 20;
// bench.reps, bench.warmup.
inline constexpr int64_t kRepeats = int64_t{1} << 20;
// train.keep, train.patience.
inline constexpr int64_t kKeep = int64_t{1} << 16;
// A model's parameters in all (4.4 trillion), added up without overflowing.
inline constexpr int64_t kParameters = int64_t{1} << 42;
}  // namespace limits

// ---------------------------------------------------------------------------------------------
// The model.

enum class Arch : int { encoder = 0, decoder = 1 };
enum class NormPlacement : int { post = 0, pre = 1, none = 2 };
enum class PositionKind : int { none = 0, sinusoidal = 1, learned = 2, relative = 3, rotary = 4 };
enum class RotaryStyle : int { half = 0, interleaved = 1 };
enum class StemKind : int { tokens = 0, features = 1, identity = 2, mixed = 3 };
enum class EmbedScale : int { none = 0, sqrt_d_model = 1 };
enum class HeadKind : int { none = 0, pool = 1, classifier = 2, lm = 3 };
enum class PoolKind : int { cls = 0, mean = 1, last = 2, cls_dist = 3, max = 4 };
enum class ModelSource : int { tessera = 0, hf = 1 };

struct PositionConfig {
  PositionKind kind = PositionKind::none;
  int64_t max_len = 512;       // learned: table rows; sinusoidal: longest sequence accepted
  int64_t max_distance = 16;   // relative (Shaw et al. 2018): offsets clipped to [-k, k]
  double base = 10000.0;       // sinusoidal and rotary frequency base
  int64_t rotary_dims = 0;     // rotary: leading dims of each head rotated (resolved: d_k)
  RotaryStyle rotary_style = RotaryStyle::half;  // half: pairs (i, i + d/2); interleaved: (2i, 2i+1)
};

struct StemConfig {
  StemKind kind = StemKind::tokens;
  int64_t vocab_size = 0;   // tokens, mixed: rows of the embedding table
  int64_t n_features = 0;   // features, mixed: width of each input row, projected to d_model
  bool cls = false;         // features, mixed: a learned CLS row (see Batch)
  EmbedScale scale = EmbedScale::none;  // multiply embeddings by sqrt(d_model), as in 2017
  int64_t modalities = 0;   // > 0: a learned embedding per modality, added to each row
  int64_t token_types = 0;  // tokens, mixed: > 0: a learned token-type (segment) embedding table
                            // (BERT); each token row adds row Batch::types (default 0)
  bool norm = false;        // a layer norm over the stem's rows after positions (BERT's embedding LN)
  bool dist = false;        // features, mixed, with cls: a learned distillation row after CLS (DeiT, AST)
  bool token_dropout = false;  // ESM-2: zero the rows of mask_id and rescale the others by
                               // (1 - 0.15·0.8) / (1 - masked share of the sequence)
  int64_t mask_id = -1;        // token_dropout: the mask token's id
};

struct AttentionConfig {
  double scale = 0.0;            // resolved: 1 / sqrt(d_k) unless given
  bool output_projection = true; // W_O; without it the block outputs the concatenated heads
};

// One task of a multi-task classifier (model.head.tasks): its own block of the classifier's
// classes, [first, first + labels.size()), for the items whose rows come from plugin `plugin`. An
// item's softmax, loss and prediction run over its task's block only.
struct HeadTask {
  std::string name;
  std::string plugin;               // the name of the plugin whose items it labels
  std::vector<std::string> labels;  // its classes, in order
  int64_t first = 0;                // its first class in the classifier (resolved)
  Location where;
};

struct HeadConfig {
  HeadKind kind = HeadKind::none;
  PoolKind pool = PoolKind::cls;  // resolved: cls when the stem adds a CLS row, else mean
  bool normalize = false;         // pool: L2-normalise the pooled vector
  int64_t n_classes = 0;          // classifier
  std::vector<std::string> labels;  // classifier: optional class names, n_classes of them
  std::vector<HeadTask> tasks;    // classifier: its classes grouped into tasks (empty: one task)
  bool tied = true;               // lm: logits through the token embedding table
  bool lm_bias = false;           // lm, tied: a vocabulary bias (BERT MLM, ESM-2); untied heads have one
                                  // when model.bias
  bool pooler = false;            // pool, classifier: a dense layer with tanh on the pooled vector (BERT, ViT)
  bool norm = false;              // pool, classifier: a layer norm on the pooled vector (AST's MLP head)
  bool transform = false;         // lm: dense + activation + layer norm before the vocabulary
                                  // projection (BERT MLM, ESM-2)
};

struct InitConfig {
  InitScheme scheme = InitScheme::glorot_normal;
  double std = 0.02;  // for scheme normal
  uint64_t seed = 0;
};

// A tensor written in the YAML itself (tiny teaching models), with where it was written.
struct InlineTensor {
  Tensor value;  // f32, (rows, cols) for a matrix, (n) for a vector
  Location where;
};

// A tensor an importer (model.from: hf) took from a checkpoint, renamed and laid out as Tessera's
// parameter; `source` says where it came from ("model-00001-of-00002.safetensors: h.0.attn.c_attn.weight
// columns 0:768"), for messages.
struct ImportedTensor {
  Tensor value;
  std::string source;
};

struct WeightsConfig {
  std::map<std::string, ImportedTensor> imported;  // model.from: hf: every parameter, from the folder
  std::string file;                               // safetensors, resolved to an absolute path
  Location file_where;
  std::map<std::string, InlineTensor> inline_tensors;  // name -> tensor, see docs/CONFIG.md
  bool allow_missing = true;  // resolved: false when `file` is given; missing tensors are initialised
  // Tensors of `file` not read, by name or by a prefix ending at a dot ("head": a pretrained LM
  // head's tensors under a new classifier head); every entry must name one of the file's tensors.
  std::vector<std::string> ignore;
  Location ignore_where;
  bool ignored(const std::string& name) const;
};

struct ModelConfig {
  std::string name;
  ModelSource source = ModelSource::tessera;  // hf: architecture and weights from a Hugging Face folder
  std::string path;                           // hf: the folder, absolute
  std::string family;                         // hf: bert, gpt2, vit, esm or ast (resolved)
  std::vector<std::string> notes;             // hf: what the import read and what it left out
  Arch arch = Arch::encoder;
  bool causal = false;  // resolved: true for decoders
  int64_t d_model = 0;
  int64_t n_layers = 1;
  int64_t n_heads = 1;
  int64_t d_k = 0;   // resolved: d_model / n_heads
  int64_t d_v = 0;   // resolved: d_model / n_heads
  int64_t d_ff = 0;  // resolved: 4 * d_model; 0 after resolution means no FFN sublayer
  Activation activation = Activation::relu;
  NormPlacement norm = NormPlacement::post;
  double norm_eps = 1e-5;
  bool final_norm = false;  // resolved: true for pre-LN
  bool bias = true;         // biases in every linear layer
  bool residual = true;
  DType dtype = DType::f32;  // compute precision of the matmuls: f32 or bf16
  AttentionConfig attention;
  PositionConfig positions;
  StemConfig stem;
  HeadConfig head;
  InitConfig init;
  WeightsConfig weights;
};

// ---------------------------------------------------------------------------------------------
// The experiment around it (this part; datasets, plugins and tasks join later).

struct InputConfig {
  std::vector<std::string> tokens;  // labels of the rows, for display ("red", "ball", "rolls")
  Tensor rows;                      // (T, F) f32 feature or hidden rows; undefined if none
  std::vector<int32_t> ids;         // token ids; empty if none
  Location where;
};

struct RuntimeConfig {
  int threads = 0;         // intra-op threads; 0 = all cores
  bool reference = false;  // run the reference loops instead of oneDNN (slow; for checking)
  int64_t batch_size = 8;  // tessera run: items per forward pass
  bool packing = false;    // tessera run: several sequences per batch row instead of padding
  int workers = 1;         // tessera run: threads decoding items with the plugins while the model runs
  // tessera run: what one item may cost (tessera/plugins.h, ItemLimits, has the same defaults).
  bool isolate = true;                          // plugins encode in worker processes
  double item_timeout_s = 120;                  // seconds an item may take in a worker; 0 = no limit
  int64_t worker_memory_mb = 8192;              // address space a worker may add; 0 = no limit
  int64_t max_item_bytes = int64_t{1} << 30;    // bytes of input of one item; 0 = no limit
  int64_t max_item_rows = int64_t{1} << 23;     // rows of all of one item's sequences; 0 = no limit
};

// ---------------------------------------------------------------------------------------------
// Batch runs (`tessera run`): plugins turn items into rows, the model runs, outputs are written.

// A modality plugin as the experiment configures it: its file, and every option as canonical text
// (defaults filled in, types checked against the plugin's own option list, paths made absolute).
struct PluginConfig {
  std::string name;
  std::string file;  // the plugin library, resolved through the search path
  std::vector<std::pair<std::string, std::string>> options;  // in the plugin's declared order
  std::vector<int> option_types;  // tsr_option_type of each option, for printing
  Location where;
  std::map<std::string, Location> option_where;  // options written in the YAML
};

// Both enums only grow: the numbers are never reused.
enum class DataFormat : int { auto_detect = 0, dir = 1, glob = 2, manifest = 3, fasta = 4, lines = 5, idx = 6 };
enum class TaskKind : int { embed = 0, hidden = 1, classify = 2, score = 3, generate = 4 };

struct DataConfig {
  std::string path;   // a file, directory or glob; relative to the YAML file; "" = none
  Location where;
  DataFormat format = DataFormat::auto_detect;  // resolved by the runner from the path
  int64_t limit = 0;  // at most this many items; 0 = all
  bool allow_missing = false;  // manifests: an item may lack some plugins' inputs (at least one given)
  std::string labels;          // idx: the idx1 labels file of data.path's images, absolute; "" = none
  std::vector<std::string> label_names;  // idx: label value v is named label_names[v]; empty: "v"
};

struct AttentionExportConfig {
  std::vector<int64_t> layers;  // export these layers' attention weights; empty = none
  std::vector<int64_t> heads;   // these heads; empty = all
  bool png = true;              // also draw PNG heatmaps
};

// Generation's options (task.kind generate, and the defaults of `tessera generate`); their
// meaning is GenerateOptions' (tessera/generate.h).
struct GenerateConfig {
  int64_t max_new_tokens = 32;
  double temperature = 0.0;         // 0: greedy
  int64_t top_k = 0;                // 0: every token
  double top_p = 1.0;               // 1: every token
  double repetition_penalty = 1.0;  // 1: none
  int64_t seed = 0;
  std::vector<std::string> stop;    // stop strings
  std::vector<int64_t> stop_ids;    // stop tokens
};

struct TaskConfig {
  TaskKind kind = TaskKind::embed;
  int64_t top_k = 5;      // classify, score: how many classes / next tokens to report
  std::string labels;     // classify: class names, one per line (else model.head.labels, else indices)
  AttentionExportConfig attention;
  GenerateConfig generate;
};

struct OutputsConfig {
  std::string dir;         // the run folder; resolved: runs/<experiment file's stem>, relative to the cwd
  bool provenance = true;  // write per-row provenance (rows.jsonl)
};

struct BenchConfig {
  int64_t batch = 1;
  int64_t seq_len = 0;  // resolved: positions.max_len capped at 128 when 0
  int warmup = 2;
  int reps = 10;
};

// ---------------------------------------------------------------------------------------------
// Training (`tessera train`): the experiment's dataset, encoded by its plugin, trains the model.

// mlm: masked-LM (BERT/ESM style) for a non-causal model with an LM head (docs/TRAINING.md).
enum class Objective : int { auto_detect = 0, classify = 1, lm = 2, mlm = 3 };
enum class OptimizerKind : int { adamw = 0, sgd = 1 };
enum class ScheduleKind : int { cosine = 0, linear = 1, constant = 2 };
// macro_f1: the classifier's macro-F1; task_mean: the unweighted mean of the tasks' accuracies
// (model.head.tasks; a task the validation set has no items of does not count).
enum class TrainMetric : int { auto_detect = 0, loss = 1, accuracy = 2, macro_f1 = 3, task_mean = 4 };
// lm: what is trained instead of the model (docs/TRAINING.md, "Baselines"): counted n-gram models
// of the training stream, or the proximity model (the mean of the last `window` embeddings).
enum class Baseline : int { none = 0, unigram = 1, bigram = 2, proximity = 3 };

// train.max_minutes: the fewest warmup steps a budget needs (the steps it times to settle its
// step count have learning rates that do not depend on it), unless the schedule is constant.
inline constexpr int64_t kBudgetProbeMin = 5;

struct TrainConfig {
  Objective objective = Objective::auto_detect;  // resolved: classify for a classifier head, lm for an LM head
  int64_t epochs = 1;
  int64_t max_steps = 0;   // optimizer steps; 0: epochs decide
  // A wall-clock budget for the whole command, in minutes (0: none). The first steps are timed
  // (inside the warmup, where the learning rate does not depend on the step count) and so is one
  // evaluation; then the step count is settled to fit, at most the one max_steps or epochs give,
  // and recorded in the checkpoints, so that --resume finishes the same schedule.
  double max_minutes = 0;
  int64_t batch_size = 32; // examples per optimizer step (split into `accumulate` micro-batches)
  int64_t accumulate = 1;
  int64_t seq_len = 0;     // lm: rows per training window; resolved: min(positions.max_len, 128)
  int64_t seed = 0;        // data order, validation split, windows
  OptimizerKind optimizer = OptimizerKind::adamw;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;
  double momentum = 0.9;
  bool nesterov = false;
  std::vector<std::string> no_decay = {"norms", "biases", "embeddings"};
  // Parameters that are not trained (a linear probe: [stem, pos, blocks]): name prefixes, each
  // ending at a dot of the name. Frozen parameters keep their values bit for bit, have no optimizer
  // state, and the backward pass stops below the lowest trained part.
  std::vector<std::string> freeze;
  // Whether `name` is frozen: an entry equals it or a prefix of it ending at a dot ("blocks" and
  // "blocks.0" hold "blocks.0.attn.w_q"; "block" holds nothing).
  bool frozen(const std::string& name) const;
  ScheduleKind schedule = ScheduleKind::cosine;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;
  double clip_norm = 1.0;  // 0: no clipping
  double label_smoothing = 0.0;
  // Dropout while training (inverted: kept values scaled by 1 / (1 - p)), each in [0, 1); the
  // masks are keyed by (seed, step, micro-batch, layer, site). Evaluation never drops.
  struct Dropout {
    double embedding = 0.0, attention = 0.0, residual = 0.0;
  } dropout;
  // Mixed precision: bf16 rounds the inputs of every training matmul to bf16 (f32 sums and
  // outputs; the master weights, norms, softmax, loss and optimizer stay f32). docs/PRECISION.md.
  DType precision = DType::f32;
  double validation = 0.1;       // share of the data held out (seeded), unless validation_data is given
  std::string validation_data;   // a dataset of its own for validation (same format rules as data.path)
  std::string test_data;         // evaluated once at the end, with the best checkpoint
  std::string validation_labels; // IDX datasets: the labels files of validation_data and test_data
  std::string test_labels;
  int64_t eval_every = 0;        // steps between evaluations; 0: at the end of each epoch
  TrainMetric metric = TrainMetric::auto_detect;  // resolved: accuracy (classify) or loss (lm); or macro_f1, task_mean
  int64_t patience = 0;          // stop after this many evaluations without a better metric; 0: never
  int64_t keep = 2;              // checkpoints kept
  int64_t log_every = 10;        // steps between metrics.jsonl lines
  // lm: written between consecutive items in the token stream (encoded by the plugin, its content
  // rows only), so that a text file's line breaks are in the stream; "": items run together.
  std::string separator = "\n";
  Baseline baseline = Baseline::none;  // lm: train a baseline instead of the model
  double add_k = 1.0;                  // unigram, bigram: add-k smoothing of the counts
  int64_t window = 8;                  // proximity: how many preceding tokens are averaged
  // mlm: the share of each example's content rows chosen for the loss; of the chosen, the share
  // replaced by the mask token and the share replaced by a random ordinary token (the rest are left
  // as they are: BERT's and ESM's 80/10/10 by default); and the mask token's id (-1: the plugin's
  // own, [MASK] or <mask>).
  double mask_prob = 0.15;
  double mask_replace = 0.8;
  double mask_random = 0.1;
  int64_t mask_id = -1;
};

struct Experiment {
  std::string file;  // absolute path of the experiment file
  ModelConfig model;
  InputConfig input;
  RuntimeConfig runtime;
  BenchConfig bench;
  std::vector<PluginConfig> plugins;
  DataConfig data;
  TaskConfig task;
  OutputsConfig outputs;
  TrainConfig train;
  // Where every key that was written came from (key path -> location), for later diagnostics
  // (weights that do not fit name the key that chose them).
  std::map<std::string, Location> locations;
  Location where(const std::string& key) const;  // nearest written ancestor's location
};

struct LoadOptions {
  // "key.path=value", value parsed as YAML, applied in order over the file before model.include
  // is resolved (so they override included keys too); relative paths in them are relative to the
  // current directory. A number in the path indexes a list written in the file
  // ("plugins.0.options.max_length=64", or "plugins[0]...."); the entry must exist.
  std::vector<std::string> overrides;
  size_t max_file_bytes = 16u << 20;    // larger files are refused
  int max_depth = 64;                   // nesting deeper than this is refused
  size_t max_nodes = 1'000'000;         // nodes visited, aliases counted each time they are used
};

// Loads and validates; on any problem returns nullopt with every problem in diags.
std::optional<Experiment> load_experiment(const std::string& path, const LoadOptions& options,
                                          Diagnostics* diags);
// The same from a string (tests); `label` stands for the file name in messages and `base_dir`
// resolves relative paths.
std::optional<Experiment> load_experiment_from_string(const std::string& yaml,
                                                      const std::string& label,
                                                      const std::string& base_dir,
                                                      const LoadOptions& options,
                                                      Diagnostics* diags);

// The resolved experiment as YAML, every default filled in (what `tessera check` prints).
std::string to_yaml(const Experiment& exp);

// ---------------------------------------------------------------------------------------------
// The schema: one entry per key; docs/CONFIG.md is generated from it.

struct KeySpec {
  std::string path;           // "model.positions.max_len"
  std::string type;           // "int", "float", "bool", "string", "path", "enum: a | b", ...
  std::string default_value;  // as written in the docs: "512", "d_model / n_heads", "required"
  std::string meaning;
};
const std::vector<KeySpec>& config_schema();
std::string schema_markdown();  // the generated table in docs/CONFIG.md

// The candidate nearest to `word` by edit distance (a swap of two neighbours is one edit), or ""
// when none is near enough to suggest: the "did you mean" of config errors, which `tessera` also
// gives for a mistyped subcommand or option.
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);

// Names for the enums, as written in YAML.
const char* arch_name(Arch a);
const char* norm_name(NormPlacement n);
const char* position_kind_name(PositionKind p);
const char* rotary_style_name(RotaryStyle s);
const char* stem_kind_name(StemKind s);
const char* embed_scale_name(EmbedScale s);
const char* head_kind_name(HeadKind h);
const char* pool_kind_name(PoolKind p);
const char* model_source_name(ModelSource s);
const char* data_format_name(DataFormat f);
const char* task_kind_name(TaskKind t);
const char* objective_name(Objective o);
const char* optimizer_kind_name(OptimizerKind k);
const char* schedule_kind_name(ScheduleKind k);
const char* train_metric_name(TrainMetric m);
const char* baseline_name(Baseline b);

}  // namespace tessera
