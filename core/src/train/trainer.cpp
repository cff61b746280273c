// `tessera train`: data in (the experiment's dataset through its plugins, encoded once, each item
// as a batch run encodes it: run/sequences.h), the model trained step by step (compute_gradients,
// clipping, the optimizer at the scheduled rate), evaluated on the held-out part, checkpointed,
// and resumable to bit-identical weights.
//
// Everything random is a function of (train.seed, step): the data order of an epoch is a seeded
// permutation, an LM window's offset a draw seeded by (seed, step, example). So a checkpoint needs
// no generator state beyond its step, and a resumed run does exactly what the uninterrupted one did.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <unistd.h>

#include "tessera/checkpoint.h"
#include "tessera/comm.h"
#include "tessera/fileio.h"
#include "tessera/machine.h"
#include "tessera/optim.h"
#include "tessera/plugin.h"
#include "tessera/plugins.h"
#include "tessera/random.h"
#include "tessera/run.h"
#include "tessera/safetensors.h"
#include "tessera/tensor_reuse.h"
#include "tessera/train.h"
#include "run/sequences.h"
#include "train/examples.h"
#include "train/report.h"

namespace tessera {

namespace fs = std::filesystem;

double metric_value(TrainMetric m, const EvalResult& e) {
  switch (m) {
    case TrainMetric::accuracy: return e.accuracy;
    case TrainMetric::macro_f1: return e.macro_f1;
    case TrainMetric::task_mean: {
      double sum = 0;
      int64_t n = 0;
      for (const TaskEval& t : e.tasks)
        if (t.counted > 0) {  // a task the set has no items of has no accuracy to count
          sum += t.accuracy;
          ++n;
        }
      return n ? sum / static_cast<double>(n) : -1;
    }
    default: return e.loss;
  }
}

// Higher is better for accuracy, macro-F1 and the task mean, lower for loss; a tie is not better.
bool better_eval(TrainMetric m, const EvalResult& a, const EvalResult& b) {
  if (m == TrainMetric::loss || m == TrainMetric::auto_detect) return a.loss < b.loss;
  return metric_value(m, a) > metric_value(m, b);
}
using nlohmann::json;

namespace {

using train::Augment;
using train::Example;
using train::make_batch;
using train::make_example;
using train::RowFormat;

// ---------------------------------------------------------------------------------------------
// Data: every item encoded once, kept in memory.

struct Encoded {
  RowFormat format;
  std::vector<Example> items;  // classify
  std::vector<int32_t> stream; // lm: every item's ids, one after another
  int64_t failed = 0;
  std::vector<std::string> errors;
};

// The experiment's plugins, one encoder each, and the stem layout their rows are joined in.
struct Sources {
  std::vector<std::shared_ptr<const Plugin>> plugins;
  std::vector<Encoder> encoders;  // per plugin
  StemLayout layout;
  const Plugin& plugin() const { return *plugins[0]; }    // the one plugin of lm and mlm training
  const Encoder& encoder() const { return encoders[0]; }
  std::vector<PluginInput> inputs() const {
    std::vector<PluginInput> v;
    for (const auto& p : plugins) v.push_back({p->name(), p->input_kind(), p->extensions()});
    return v;
  }
};

Result<Sources> open_plugins(const Experiment& exp) {
  if (exp.plugins.empty()) return Status::Invalid(exp.file + ": no plugins: list the modality plugins under plugins:");
  // Several plugins make one multimodal sequence per item: a classifier's example. A language
  // model's stream and a masked LM's masks are one tokenizer's ids.
  if (exp.plugins.size() > 1 && exp.train.objective != Objective::classify)
    return Status::Invalid(Diagnostic{exp.plugins[1].where, "plugins[1]",
                                      std::to_string(exp.plugins.size()) +
                                          " plugins make one multimodal sequence per item, which training reads only "
                                          "with a classifier head (train.objective classify); a language model's stream "
                                          "and a masked LM's masks are one tokenizer's ids",
                                      "keep one plugin to train a language model"}
                               .str());
  Diagnostics diags;
  check_plugins_fit(exp, &diags);
  if (!diags.empty()) return Status::Invalid(diags.str());
  Sources src;
  std::vector<tsr_encoder_info> infos;
  for (const PluginConfig& pc : exp.plugins) {
    Result<std::shared_ptr<const Plugin>> p = Plugin::load(pc.file);
    if (!p.ok()) return p.status();
    Result<Encoder> e = Encoder::create(*p, pc.options);
    if (!e.ok()) return e.status();
    src.plugins.push_back(*p);
    src.encoders.push_back(std::move(e).value());
    infos.push_back(src.encoders.back().info());
  }
  // As in a batch run: each plugin encodes in a worker process under the item limits, so that an
  // item that crashes, hangs or floods it is one bad item, not the end of training (and of every
  // --resume after it). Called before the model starts its threads.
  for (Encoder& e : src.encoders) TSR_RETURN_IF_ERROR(run::confine_encoder(e, exp.runtime));
  src.layout = stem_layout(infos);
  return src;
}

bool any_augments(const Sources& src) {
  return std::any_of(src.encoders.begin(), src.encoders.end(), [](const Encoder& e) { return e.augments(); });
}

// The class of an item: its label (a manifest column, an IDX labels file) or, for a directory
// dataset, the name of its parent folder; a class name, or a class number.
std::string label_text(const DataItem& item) {
  if (item.label) return *item.label;
  const fs::path id(item.id);
  return id.has_parent_path() ? id.parent_path().filename().string() : std::string();
}

// Class names in index order: model.head.labels when given, else the labels found, sorted (numbers
// numerically when every label is a number).
std::vector<std::string> class_names(const ModelConfig& m, const std::vector<DataItem>& items) {
  if (!m.head.labels.empty()) return m.head.labels;
  std::vector<std::string> names;
  for (const DataItem& it : items) {
    const std::string l = label_text(it);
    if (!l.empty() && std::find(names.begin(), names.end(), l) == names.end()) names.push_back(l);
  }
  const bool numbers = std::all_of(names.begin(), names.end(), [](const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  });
  if (numbers)
    std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
  else
    std::sort(names.begin(), names.end());
  return names;
}

int32_t class_index(const std::vector<std::string>& classes, const std::string& label) {
  auto it = std::find(classes.begin(), classes.end(), label);
  if (it != classes.end()) return static_cast<int32_t>(it - classes.begin());
  if (!label.empty() && std::all_of(label.begin(), label.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
      label.size() < 9) {
    const int64_t v = std::stoll(label);
    if (v < static_cast<int64_t>(classes.size())) return static_cast<int32_t>(v);
  }
  return -1;
}

// train.separator's ids: its encoding by the plugin, content rows only (no BOS/EOS the tokenizer
// may add to every item). Empty for an empty separator; a separator that gives no content rows
// (whitespace under WordPiece, say) is an error naming the key's place.
Result<std::vector<int32_t>> separator_ids(const Experiment& exp, const Sources& src) {
  const std::string& sep = exp.train.separator;
  if (sep.empty()) return std::vector<int32_t>{};
  auto problem = [&](const std::string& what, const std::string& hint) {
    Diagnostic d{exp.where("train.separator"), "train.separator", what, hint};
    return Status::Invalid(d.str());
  };
  if (src.encoder().info().rows_kind != TSR_ROWS_IDS)
    return problem("the " + src.plugin().name() + " plugin gives feature rows, not token ids, so there is no stream to "
                   "separate items in", "set train.separator: \"\"");
  PluginItem pi;
  pi.id = "train.separator";
  pi.data = sep;
  Result<std::vector<TokenRows>> rows = src.encoder().encode(pi);
  if (!rows.ok()) return problem("the plugin cannot encode it: " + rows.status().message(), "choose another separator, or \"\" for none");
  std::vector<int32_t> ids;
  for (const TokenRows& r : *rows)
    for (size_t i = 0; i < r.ids.size(); ++i)
      if (r.roles[i] == TSR_ROLE_CONTENT) ids.push_back(r.ids[i]);
  if (ids.empty())
    return problem("the tokenizer gives no tokens for " + std::string(sep == "\n" ? "\"\\n\" (the default)" : "it"),
                   "choose a separator the tokenizer keeps (tokenizer bytes keeps \"\\n\"), or \"\" for none");
  // An unknown-character id would stand for it silently: the ids must decode to the separator.
  Result<std::string> back = src.encoder().decode(ids);
  if (back.ok() && *back != sep)
    return problem("the tokenizer cannot represent it (its ids decode to " + json(*back).dump() + ")",
                   "a chars vocabulary holds no \"\\n\" (a character a line): use tokenizer bytes, or set "
                   "train.separator: \"\"");
  return ids;
}

// Each example's block of classes, its task's [first, end), as Targets::label_blocks (B, 2) i32;
// undefined without tasks.
Tensor label_blocks(const ModelConfig& c, const std::vector<const Example*>& ex) {
  if (c.head.tasks.empty()) return Tensor();
  Tensor b = Tensor::empty({static_cast<int64_t>(ex.size()), 2}, DType::i32);
  for (size_t i = 0; i < ex.size(); ++i) {
    const HeadTask& t = c.head.tasks[static_cast<size_t>(ex[i]->task)];
    b.data<int32_t>()[2 * i] = static_cast<int32_t>(t.first);
    b.data<int32_t>()[2 * i + 1] = static_cast<int32_t>(t.first + static_cast<int64_t>(t.labels.size()));
  }
  return b;
}

// Encodes a dataset, each item as a batch run encodes it (run::encode_item). Bad items are counted
// and their reasons kept; they do not stop training. lm: the items' ids one after another, `sep`
// between two items.
Result<Encoded> encode(const Experiment& exp, const DataConfig& data, const Sources& src,
                       const std::vector<std::string>& classes, bool lm, const std::vector<int32_t>& sep = {}) {
  Result<std::vector<DataItem>> items = read_dataset(data, src.inputs());
  if (!items.ok()) return items.status();
  Encoded e;
  e.format = train::row_format(exp.model, src.encoders, src.layout);
  const bool keep_positions = any_augments(src);
  run::AssembleOptions assemble;
  assemble.check_max_len = !lm;  // an LM's items are cut into windows of seq_len
  for (size_t index = 0; index < items->size(); ++index) {
    const DataItem& item = (*items)[index];
    auto fail = [&](const std::string& why) {
      ++e.failed;
      if (e.errors.size() < 20) e.errors.push_back(item.id + ": " + why);
    };
    if (!item.error.empty()) {
      fail(item.error);
      continue;
    }
    int32_t label = -1;
    const bool tasks = !exp.model.head.tasks.empty();
    if (!lm && exp.train.objective == Objective::classify && !tasks) {
      label = class_index(classes, label_text(item));
      if (label < 0) {
        fail("label \"" + label_text(item) + "\" is not one of the " + std::to_string(classes.size()) + " classes");
        continue;
      }
    }
    const run::ItemSequences made =
        run::encode_item(exp, src.layout, src.encoders, item, static_cast<int64_t>(index),
                         run::read_parts(item, exp.runtime.max_item_bytes), assemble);
    if (!made.ok()) {
      fail(made.reason);
      continue;
    }
    int32_t task = -1;
    if (!lm && exp.train.objective == Objective::classify && tasks) {
      // A multi-task item: its task from the plugin its rows came from, its label one of that task's.
      std::string why;
      task = run::sequence_task(exp, made.seqs, &why);
      if (task < 0) {
        fail(why);
        continue;
      }
      const HeadTask& t = exp.model.head.tasks[static_cast<size_t>(task)];
      const auto at = std::find(t.labels.begin(), t.labels.end(), label_text(item));
      if (at == t.labels.end()) {
        fail("label \"" + label_text(item) + "\" is not one of the " + std::to_string(t.labels.size()) + " classes of task " +
             t.name + " (model.head.tasks)");
        continue;
      }
      label = static_cast<int32_t>(t.first + (at - t.labels.begin()));
    }
    for (const run::Sequence& s : made.seqs) {
      if (lm) {
        if (!e.stream.empty()) e.stream.insert(e.stream.end(), sep.begin(), sep.end());
        e.stream.insert(e.stream.end(), s.rows.ids.begin(), s.rows.ids.end());
        continue;
      }
      if (exp.train.objective == Objective::mlm &&
          std::none_of(s.rows.roles.begin(), s.rows.roles.end(), [](uint8_t role) { return role == TSR_ROLE_CONTENT; })) {
        fail("no content rows to mask (only special rows)");
        continue;
      }
      e.items.push_back(make_example(e.format, s, label, keep_positions));
      e.items.back().task = task;
    }
  }
  return e;
}

// ---------------------------------------------------------------------------------------------
// Masked LM (train.objective: mlm)

// The mask token (train.mask_id, else the plugin's) and the ordinary tokens a random replacement
// draws from: the distinct ids of the training set's content rows, in id order, the mask token
// not among them. No mask token is an error at train.mask_id's (or train.objective's) place.
Result<MaskSpec> mask_spec(const Experiment& exp, const Sources& src, const Encoded& train) {
  const TrainConfig& tc = exp.train;
  MaskSpec spec;
  spec.prob = tc.mask_prob;
  spec.replace = tc.mask_replace;
  spec.random = tc.mask_random;
  if (!train.format.ids)
    return Status::Invalid(Diagnostic{exp.where("train.objective"), "train.objective",
                                      "mlm masks token ids, but the " + src.plugin().name() + " plugin gives feature rows",
                                      "use a plugin that gives ids (text, protein)"}.str());
  spec.mask_id = tc.mask_id >= 0 ? static_cast<int32_t>(tc.mask_id) : src.encoder().mask_id();
  if (spec.mask_id < 0) {
    const bool given = exp.locations.count("train.mask_id") > 0;
    return Status::Invalid(Diagnostic{exp.where(given ? "train.mask_id" : "train.objective"),
                                      given ? "train.mask_id" : "train.objective",
                                      "mlm needs a mask token, and the " + src.plugin().name() +
                                          " plugin's vocabulary under these options has none",
                                      "set train.mask_id to an id the model's vocabulary holds that the data never "
                                      "uses (a WordPiece vocabulary's [MASK] and ESM's <mask> are found by themselves)"}
                               .str());
  }
  if (spec.mask_id >= exp.model.stem.vocab_size)
    return Status::Invalid(Diagnostic{exp.where("train.objective"), "train.objective",
                                      "the plugin's mask token is id " + std::to_string(spec.mask_id) +
                                          ", outside model.stem.vocab_size " + std::to_string(exp.model.stem.vocab_size),
                                      "raise model.stem.vocab_size to the plugin's vocabulary"}
                               .str());
  std::vector<char> seen(static_cast<size_t>(exp.model.stem.vocab_size), 0);
  for (const Example& e : train.items)
    for (size_t t = 0; t < e.ids.size(); ++t)
      if (e.roles[t] == TSR_ROLE_CONTENT && e.ids[t] >= 0 && e.ids[t] < exp.model.stem.vocab_size)
        seen[static_cast<size_t>(e.ids[t])] = 1;
  for (size_t v = 0; v < seen.size(); ++v)
    if (seen[v] && static_cast<int32_t>(v) != spec.mask_id) spec.random_ids.push_back(static_cast<int32_t>(v));
  if (spec.random_ids.empty())
    return Status::Invalid("train: mlm: the training set has no content tokens to mask");
  return spec;
}


// ---------------------------------------------------------------------------------------------
// Batches

using train::mix;

// mlm: the examples as one padded batch, each masked under its key; targets (B, T) hold the
// original id at the chosen rows and -1 elsewhere (padding included).
Result<Batch> make_mlm_batch(const Encoded& data, const std::vector<const Example*>& ex, const std::vector<uint64_t>& keys,
                             const MaskSpec& spec, Tensor* targets) {
  Tensor labels;
  TSR_ASSIGN_OR_RETURN(Batch b, make_batch(data.format, ex, &labels));
  const int64_t B = b.ids.shape()[0], T = b.ids.shape()[1];
  *targets = Tensor::empty({B, T}, DType::i32);
  std::fill(targets->data<int32_t>(), targets->data<int32_t>() + B * T, -1);
  for (int64_t i = 0; i < B; ++i) {
    const Example& e = *ex[static_cast<size_t>(i)];
    mask_sequence(spec, keys[static_cast<size_t>(i)], e.ids.data(), e.roles.data(), e.n(), b.ids.data<int32_t>() + i * T,
                  targets->data<int32_t>() + i * T);
  }
  return b;
}

// LM windows: seq_len + 1 ids from `offsets`, the first seq_len as input, the last seq_len as targets.
Batch make_windows(const std::vector<int32_t>& stream, const std::vector<int64_t>& offsets, int64_t T,
                   Tensor* targets) {
  const int64_t B = static_cast<int64_t>(offsets.size());
  Batch b;
  b.ids = Tensor::empty({B, T}, DType::i32);
  *targets = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < B; ++i) {
    const int32_t* s = stream.data() + offsets[static_cast<size_t>(i)];
    std::copy(s, s + T, b.ids.data<int32_t>() + i * T);
    std::copy(s + 1, s + T + 1, targets->data<int32_t>() + i * T);
  }
  return b;
}

// A seeded permutation of [0, n): Fisher–Yates with the draws of Rng(seed).
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[static_cast<size_t>(i)], p[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
  return p;
}


// ---------------------------------------------------------------------------------------------
// Evaluation: the inference path on the current weights.

double cross_entropy_row(const float* z, int64_t V, int32_t y) {
  double mx = z[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
  double s = 0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(z[v]) - mx);
  return std::log(s) + mx - z[y];
}

// One task's figures from the whole confusion matrix (its block: a multi-task item is predicted
// within its task's classes) and its items' summed loss.
TaskEval task_eval(const HeadTask& t, const std::vector<std::vector<int64_t>>& confusion, double loss_sum) {
  TaskEval e;
  e.name = t.name;
  e.classes = t.labels;
  const size_t k = t.labels.size(), f = static_cast<size_t>(t.first);
  e.confusion.assign(k, std::vector<int64_t>(k, 0));
  int64_t right = 0;
  for (size_t a = 0; a < k; ++a)
    for (size_t b = 0; b < k; ++b) {
      e.confusion[a][b] = confusion[f + a][f + b];
      e.counted += e.confusion[a][b];
      if (a == b) right += e.confusion[a][b];
    }
  double f1 = 0;
  for (size_t a = 0; a < k; ++a) {
    int64_t fp = 0, fn = 0;
    for (size_t b = 0; b < k; ++b)
      if (b != a) fp += e.confusion[b][a], fn += e.confusion[a][b];
    const int64_t tp = e.confusion[a][a];
    f1 += tp ? 2.0 * static_cast<double>(tp) / static_cast<double>(2 * tp + fp + fn) : 0.0;
  }
  e.macro_f1 = f1 / static_cast<double>(k);
  e.accuracy = e.counted ? static_cast<double>(right) / static_cast<double>(e.counted) : 0;
  e.loss = e.counted ? loss_sum / static_cast<double>(e.counted) : 0;
  return e;
}

Result<EvalResult> evaluate(const Experiment& exp, const Parameters& params, const Encoded& data, int64_t batch,
                            const MaskSpec* spec = nullptr) {
  const ModelConfig& c = exp.model;
  Result<Model> m = Model::build(c, params);
  if (!m.ok()) return m.status();
  EvalResult r;
  ForwardOptions fo;
  fo.reference = exp.runtime.reference;
  double total = 0;
  if (exp.train.objective == Objective::classify) {
    const int64_t K = c.head.n_classes;
    r.confusion.assign(static_cast<size_t>(K), std::vector<int64_t>(static_cast<size_t>(K), 0));
    int64_t right = 0;
    std::vector<double> task_loss(c.head.tasks.size(), 0.0);
    for (size_t i0 = 0; i0 < data.items.size(); i0 += static_cast<size_t>(batch)) {
      std::vector<const Example*> ex;
      for (size_t i = i0; i < std::min(data.items.size(), i0 + static_cast<size_t>(batch)); ++i) ex.push_back(&data.items[i]);
      Tensor labels;
      TSR_ASSIGN_OR_RETURN(const Batch b, make_batch(data.format, ex, &labels));
      Outputs out;
      TSR_RETURN_IF_ERROR(m->forward(b, fo, &out));
      for (size_t i = 0; i < ex.size(); ++i) {
        const float* z = out.logits.data<float>() + static_cast<int64_t>(i) * K;
        const int32_t y = ex[i]->label;
        // A multi-task item is scored over its task's classes only: its loss and its prediction.
        int64_t first = 0, k = K;
        if (ex[i]->task >= 0) {
          const HeadTask& t = c.head.tasks[static_cast<size_t>(ex[i]->task)];
          first = t.first;
          k = static_cast<int64_t>(t.labels.size());
        }
        const double l = cross_entropy_row(z + first, k, y - static_cast<int32_t>(first));
        total += l;
        if (ex[i]->task >= 0) task_loss[static_cast<size_t>(ex[i]->task)] += l;
        const int64_t pred = first + (std::max_element(z + first, z + first + k) - (z + first));
        right += pred == y;
        ++r.confusion[static_cast<size_t>(y)][static_cast<size_t>(pred)];
      }
    }
    r.counted = static_cast<int64_t>(data.items.size());
    r.accuracy = r.counted ? static_cast<double>(right) / static_cast<double>(r.counted) : 0;
    double f1 = 0;
    for (int64_t k = 0; k < K; ++k) {
      int64_t tp = r.confusion[static_cast<size_t>(k)][static_cast<size_t>(k)], fp = 0, fn = 0;
      for (int64_t j = 0; j < K; ++j)
        if (j != k) {
          fp += r.confusion[static_cast<size_t>(j)][static_cast<size_t>(k)];
          fn += r.confusion[static_cast<size_t>(k)][static_cast<size_t>(j)];
        }
      f1 += tp ? 2.0 * static_cast<double>(tp) / static_cast<double>(2 * tp + fp + fn) : 0.0;
    }
    r.macro_f1 = f1 / static_cast<double>(K);
    for (size_t ti = 0; ti < c.head.tasks.size(); ++ti) {  // the tasks the set has items of
      TaskEval t = task_eval(c.head.tasks[ti], r.confusion, task_loss[ti]);
      if (t.counted > 0) r.tasks.push_back(std::move(t));
    }
  } else if (exp.train.objective == Objective::mlm) {
    // Every example under its fixed mask (keyed by its index in the set): the masked rows' loss
    // and how many of them the arg-max gets right.
    const int64_t V = c.stem.vocab_size;
    int64_t right = 0;
    for (size_t i0 = 0; i0 < data.items.size(); i0 += static_cast<size_t>(batch)) {
      std::vector<const Example*> ex;
      std::vector<uint64_t> keys;
      for (size_t i = i0; i < std::min(data.items.size(), i0 + static_cast<size_t>(batch)); ++i) {
        ex.push_back(&data.items[i]);
        keys.push_back(mlm_eval_key(exp.train.seed, static_cast<int64_t>(i)));
      }
      Tensor targets;
      TSR_ASSIGN_OR_RETURN(const Batch b, make_mlm_batch(data, ex, keys, *spec, &targets));
      Outputs out;
      TSR_RETURN_IF_ERROR(m->forward(b, fo, &out));
      for (int64_t i = 0; i < targets.numel(); ++i) {
        const int32_t y = targets.data<int32_t>()[i];
        if (y < 0) continue;
        const float* z = out.logits.data<float>() + i * V;
        total += cross_entropy_row(z, V, y);
        right += std::max_element(z, z + V) - z == y;
        ++r.counted;
      }
    }
    r.accuracy = r.counted ? static_cast<double>(right) / static_cast<double>(r.counted) : 0;
    r.bits_per_token = r.counted ? total / static_cast<double>(r.counted) / std::log(2.0) : 0;
  } else {
    // Non-overlapping windows over the whole held-out stream; each predicts seq_len tokens.
    const int64_t T = exp.train.seq_len, V = c.stem.vocab_size;
    const int64_t n = (static_cast<int64_t>(data.stream.size()) - 1) / T;
    for (int64_t w0 = 0; w0 < n; w0 += batch) {
      std::vector<int64_t> offsets;
      for (int64_t w = w0; w < std::min(n, w0 + batch); ++w) offsets.push_back(w * T);
      Tensor targets;
      const Batch b = make_windows(data.stream, offsets, T, &targets);
      Outputs out;
      TSR_RETURN_IF_ERROR(m->forward(b, fo, &out));
      for (int64_t i = 0; i < targets.numel(); ++i)
        total += cross_entropy_row(out.logits.data<float>() + i * V, V, targets.data<int32_t>()[i]);
      r.counted += targets.numel();
    }
    r.bits_per_token = r.counted ? total / static_cast<double>(r.counted) / std::log(2.0) : 0;
  }
  r.loss = r.counted ? total / static_cast<double>(r.counted) : 0;
  return r;
}

// " (fashion 0.810000, digits 0.640000; mean 0.725000)" for a multi-task evaluation's progress line.
std::string task_figures(const EvalResult& e) {
  std::string s;
  for (const TaskEval& t : e.tasks) s += (s.empty() ? " (" : ", ") + t.name + " " + std::to_string(t.accuracy);
  return s.empty() ? s : s + "; mean " + std::to_string(metric_value(TrainMetric::task_mean, e)) + ")";
}

// The best evaluation a checkpoint's trainer state holds (eval_json's figures, no confusion),
// its tasks in the head's order.
EvalResult best_from_json(const json& b, const ModelConfig& c) {
  EvalResult best;
  best.loss = b.value("loss", 0.0);
  best.accuracy = b.value("accuracy", -1.0);
  best.macro_f1 = b.value("macro_f1", -1.0);
  best.bits_per_token = b.value("bits_per_token", -1.0);
  best.counted = b.value("counted", int64_t{0});
  if (b.contains("tasks") && b["tasks"].is_object())
    for (const HeadTask& h : c.head.tasks) {
      if (!b["tasks"].contains(h.name) || !b["tasks"][h.name].is_object()) continue;
      const json& k = b["tasks"][h.name];
      TaskEval t;
      t.name = h.name;
      t.loss = k.value("loss", 0.0);
      t.accuracy = k.value("accuracy", 0.0);
      t.macro_f1 = k.value("macro_f1", 0.0);
      t.counted = k.value("counted", int64_t{0});
      t.classes = h.labels;
      best.tasks.push_back(std::move(t));
    }
  return best;
}

json eval_json(const EvalResult& e) {
  json j = {{"loss", e.loss}, {"counted", e.counted}};
  if (e.accuracy >= 0) j["accuracy"] = e.accuracy;
  if (e.macro_f1 >= 0) j["macro_f1"] = e.macro_f1;
  if (e.bits_per_token >= 0) j["bits_per_token"] = e.bits_per_token;
  if (e.bits_per_token >= 0 && e.accuracy >= 0) j["perplexity"] = std::exp(e.loss);  // mlm
  for (const TaskEval& t : e.tasks)
    j["tasks"][t.name] = {{"loss", t.loss}, {"accuracy", t.accuracy}, {"macro_f1", t.macro_f1}, {"counted", t.counted}};
  if (!e.tasks.empty()) j["task_mean"] = metric_value(TrainMetric::task_mean, e);
  return j;
}

bool better(TrainMetric m, const EvalResult& a, const EvalResult& b) { return better_eval(m, a, b); }

// What a changed config would change in the arithmetic: everything but where the run is written,
// how often it logs, and how far it goes (epochs and max_steps may grow on a resume; a budget's
// settled step count is kept in the checkpoints).
std::string config_hash(const Experiment& exp) {
  Experiment e = exp;
  e.outputs.dir.clear();
  e.train.log_every = 0;
  e.train.epochs = 0;
  e.train.max_steps = 0;
  e.train.max_minutes = 0;
  e.train.patience = 0;
  const std::string y = to_yaml(e);
  return hex64(fnv1a(y.data(), y.size()));
}

OptimizerOptions optimizer_options(const TrainConfig& t) {
  OptimizerOptions o;
  o.kind = t.optimizer == OptimizerKind::adamw ? OptimizerOptions::Kind::adamw : OptimizerOptions::Kind::sgd;
  o.lr = t.lr;
  o.beta1 = t.beta1;
  o.beta2 = t.beta2;
  o.eps = t.eps;
  o.weight_decay = t.weight_decay;
  o.momentum = t.momentum;
  o.nesterov = t.nesterov;
  o.no_decay = t.no_decay;
  return o;
}

ScheduleOptions schedule_options(const TrainConfig& t) {
  ScheduleOptions s;
  s.kind = t.schedule == ScheduleKind::cosine   ? ScheduleOptions::Kind::cosine
           : t.schedule == ScheduleKind::linear ? ScheduleOptions::Kind::linear
                                                : ScheduleOptions::Kind::constant;
  s.warmup_steps = t.warmup_steps;
  s.min_lr_ratio = t.min_lr_ratio;
  return s;
}

// metrics.jsonl: kept up to the checkpoint a resumed run starts from, then appended to.
Status trim_metrics(const std::string& path, int64_t last_step) {
  std::ifstream f(path);
  std::string kept, line;
  while (std::getline(f, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("step", int64_t{0}) <= last_step) kept += line + "\n";
  }
  return write_file_atomic(path, kept);
}

// The training and held-out sets: validation_data when given, else the last share of an LM's
// stream (as corpora are split) or a seeded share of the items.
Status split_data(const Experiment& exp, const Sources& src, const std::vector<std::string>& classes, bool lm,
                  const std::vector<int32_t>& sep, Encoded&& all, Encoded* train_out, Encoded* val_out) {
  const TrainConfig& tc = exp.train;
  Encoded& train = *train_out;
  Encoded& val = *val_out;
  val = Encoded{};
  val.format = all.format;
  if (!tc.validation_data.empty()) {
    DataConfig vd = exp.data;
    vd.path = tc.validation_data;
    vd.labels = tc.validation_labels;
    vd.limit = 0;
    TSR_ASSIGN_OR_RETURN(val, encode(exp, vd, src, classes, lm, sep));
    train = std::move(all);
  } else if (lm) {
    const size_t cut = static_cast<size_t>(static_cast<double>(all.stream.size()) * (1.0 - tc.validation));
    val.stream.assign(all.stream.begin() + static_cast<std::ptrdiff_t>(cut), all.stream.end());
    train = std::move(all);
    train.stream.resize(cut);
  } else {
    const std::vector<int64_t> p = permutation(static_cast<int64_t>(all.items.size()), mix(tc.seed, 0x5ab1e));
    const size_t n_val = static_cast<size_t>(static_cast<double>(p.size()) * tc.validation);
    std::vector<char> is_val(p.size(), 0);
    for (size_t i = 0; i < n_val; ++i) is_val[static_cast<size_t>(p[i])] = 1;
    std::vector<Example> items = std::move(all.items);
    train = std::move(all);
    train.items.clear();
    for (size_t i = 0; i < items.size(); ++i) (is_val[i] ? val.items : train.items).push_back(std::move(items[i]));
  }
  return Status::Ok();
}

// 0.1 -> "10 %"
std::string fmt_share(double share) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g %%", 100 * share);
  return buf;
}

// The parameters train.freeze leaves to train: handles on the same storage, in parameter order.
Parameters trained_part(const TrainConfig& t, const Parameters& all) {
  std::vector<Parameters::Entry> kept;
  for (const auto& [name, tensor] : all)
    if (!t.frozen(name)) kept.emplace_back(name, tensor);
  return Parameters(std::move(kept));
}

// Where the backward pass may stop: above the lowest block with a trained parameter, and before
// the stem unless the stem (or anything outside blocks, final norm and head) is trained.
void backward_extent(const ModelConfig& c, const Parameters& trained, GradOptions* go) {
  int64_t lowest = c.n_layers;
  bool stem = false;
  for (const auto& [name, tensor] : trained) {
    if (name.rfind("blocks.", 0) == 0) lowest = std::min<int64_t>(lowest, std::stoll(name.substr(7)));
    else if (name.rfind("head.", 0) != 0 && name.rfind("final_norm.", 0) != 0) stem = true;
  }
  go->backward_stem = stem;
  go->backward_first_block = stem ? 0 : lowest;
}

class Progress {
 public:
  explicit Progress(bool on) : on_(on), tty_(on && isatty(2)) {}
  void step(int64_t epoch, int64_t step, int64_t total, double loss, double lr, double per_s, double eta) {
    if (!on_) return;
    std::fprintf(stderr, "%sepoch %lld  step %lld/%lld  loss %.4f  lr %.3g  %.0f ex/s  ETA %s%s", tty_ ? "\r" : "",
                 static_cast<long long>(epoch + 1), static_cast<long long>(step), static_cast<long long>(total), loss,
                 lr, per_s, clock(eta).c_str(), tty_ ? "   " : "\n");
    std::fflush(stderr);
  }
  void line(const std::string& s) {
    if (!on_) return;
    std::fprintf(stderr, "%s%s\n", tty_ ? "\r" : "", s.c_str());
  }

 private:
  static std::string clock(double s) {
    const int64_t t = static_cast<int64_t>(s + 0.5);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
    return buf;
  }
  bool on_, tty_;
};

// ---------------------------------------------------------------------------------------------
// Baselines (train.baseline): fitted on the training stream, evaluated on every held-out token
// after the first; the run folder gets the same metrics.jsonl lines and summary.json as a model's.

struct BaselineRun {
  const Experiment& exp;
  const std::vector<int32_t>& train;  // the training stream
  const std::vector<int32_t>& val;    // the held-out stream
  int64_t total_steps;                // proximity: optimizer steps
  int64_t steps_per_epoch;
  int64_t n_windows;                  // proximity: window offsets to draw from
};

EvalResult nats_result(double nats, int64_t counted) {
  EvalResult r;
  r.counted = counted;
  r.loss = counted ? nats / static_cast<double>(counted) : 0;
  r.bits_per_token = r.loss / std::log(2.0);
  return r;
}

Result<TrainSummary> train_baseline(const BaselineRun& run, TrainSummary sum, const std::string& hash, Progress& progress,
                                    std::chrono::steady_clock::time_point t0) {
  const Experiment& exp = run.exp;
  const TrainConfig& tc = exp.train;
  const int64_t V = exp.model.stem.vocab_size;
  const std::string name = baseline_name(tc.baseline);
  if (run.val.size() < 2) return Status::Invalid("train: the held-out stream has fewer than 2 tokens: nothing to evaluate");
  const int64_t counted = static_cast<int64_t>(run.val.size()) - 1;
  for (size_t t = 0; t < run.val.size(); ++t)
    if (run.val[t] < 0 || run.val[t] >= V)
      return Status::Invalid("train: token " + std::to_string(t) + " of the held-out stream is id " + std::to_string(run.val[t]) +
                             ", outside model.stem.vocab_size " + std::to_string(V));
  std::ofstream metrics((fs::path(sum.dir) / "metrics.jsonl").string(), std::ios::app);
  auto log = [&](const json& j) {
    metrics << j.dump() << "\n";
    metrics.flush();
  };
  EvalResult best;
  int64_t best_step = 0;
  if (tc.baseline == Baseline::unigram || tc.baseline == Baseline::bigram) {
    TSR_ASSIGN_OR_RETURN(NgramModel m, NgramModel::count(tc.baseline == Baseline::unigram ? 1 : 2, run.train, V, tc.add_k));
    log({{"step", 0}, {"event", "start"}, {"config_hash", hash}, {"baseline", name}, {"add_k", tc.add_k},
         {"tokens", m.total}, {"steps", 0}, {"parameters", 0}});
    best = nats_result(m.nats(run.val), counted);
    log({{"step", 0}, {"epoch", 1}, {"eval", eval_json(best)}, {"best", true}});
    progress.line(name + " baseline (add-" + std::to_string(tc.add_k) + ", counted on " + std::to_string(m.total) +
                  " tokens): loss " + std::to_string(best.loss) + ", bits/token " + std::to_string(best.bits_per_token));
  } else {
    const int64_t T = tc.seq_len;
    Parameters params = proximity_init(V, exp.model.d_model, mix(tc.seed, 0x9e0));
    TSR_ASSIGN_OR_RETURN(Optimizer optim, Optimizer::create(optimizer_options(tc), params));
    Parameters grads = params.zeros_like();
    log({{"step", 0}, {"event", "start"}, {"config_hash", hash}, {"baseline", name}, {"window", tc.window},
         {"examples", run.n_windows}, {"steps", run.total_steps}, {"parameters", params.numel()}});
    std::vector<int64_t> val_targets(static_cast<size_t>(counted));
    std::iota(val_targets.begin(), val_targets.end(), int64_t{1});
    bool have_best = false;
    double loss_sum = 0;
    int64_t loss_n = 0;
    const auto loop_start = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < run.total_steps;) {
      // The model's windows (the same draws): each window's seq_len next tokens are targets.
      Rng rng(mix(tc.seed, static_cast<uint64_t>(step) + 1));
      std::vector<int64_t> targets;
      for (int64_t i = 0; i < tc.batch_size; ++i) {
        const int64_t o = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(run.n_windows));
        for (int64_t t = 1; t <= T; ++t) targets.push_back(o + t);
      }
      const double nats = proximity_nats(params, run.train, targets, tc.window, &grads);
      scale(grads, 1.0 / static_cast<double>(targets.size()));
      const double loss = nats / static_cast<double>(targets.size());
      std::string bad;
      if (!std::isfinite(loss) || !all_finite(grads, &bad))
        return Status::Invalid("train: step " + std::to_string(step + 1) + ": the proximity baseline's loss or gradient is "
                               "not finite: lower train.lr");
      const double norm = clip_grad_norm(grads, tc.clip_norm);
      const double lr = scheduled_lr(schedule_options(tc), tc.lr, step, run.total_steps);
      TSR_RETURN_IF_ERROR(optim.step(params, grads, lr));
      grads.zero();
      ++step;
      loss_sum += loss;
      ++loss_n;
      const int64_t epoch = (step - 1) / run.steps_per_epoch;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
      const double per_s = static_cast<double>(step * tc.batch_size) / std::max(secs, 1e-9);
      if (step % tc.log_every == 0 || step == run.total_steps) {
        log({{"step", step}, {"epoch", epoch + 1}, {"loss", loss_sum / static_cast<double>(loss_n)}, {"lr", lr},
             {"grad_norm", norm}, {"examples_per_s", per_s}});
        progress.step(epoch, step, run.total_steps, loss_sum / static_cast<double>(loss_n), lr, per_s,
                      secs / static_cast<double>(step) * static_cast<double>(run.total_steps - step));
        loss_sum = 0;
        loss_n = 0;
      }
      const bool eval_now = tc.eval_every > 0 ? step % tc.eval_every == 0 || step == run.total_steps
                                              : step % run.steps_per_epoch == 0 || step == run.total_steps;
      if (!eval_now) continue;
      const EvalResult e = nats_result(proximity_nats(params, run.val, val_targets, tc.window), counted);
      const bool improved = !have_best || e.loss < best.loss;
      if (improved) {
        best = e;
        best_step = step;
        have_best = true;
        TSR_RETURN_IF_ERROR(params.save((fs::path(sum.dir) / "best.safetensors").string()));
      }
      log({{"step", step}, {"epoch", epoch + 1}, {"eval", eval_json(e)}, {"best", improved}});
      progress.line("eval at step " + std::to_string(step) + ": loss " + std::to_string(e.loss) + ", bits/token " +
                    std::to_string(e.bits_per_token) + (improved ? " (best)" : ""));
    }
    sum.steps = run.total_steps;
  }
  sum.best = best;
  sum.best_step = best_step;
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json s = {{"baseline", name}, {"steps", sum.steps}, {"best_step", best_step}, {"best", eval_json(best)},
            {"seconds", sum.seconds}, {"stopped_early", false}, {"classes", json::array()}};
  TSR_RETURN_IF_ERROR(write_file_atomic((fs::path(sum.dir) / "summary.json").string(), s.dump(2) + "\n"));
  return sum;
}

// mlm: the unigram baseline. Each token's count over the training items' content rows, add-k
// smoothed over the V ids, scored on the held-out items' masked rows (the model's own fixed
// masks): loss, bits per token, and accuracy (the most frequent token, wherever a row is masked).
Result<TrainSummary> train_mlm_baseline(const Experiment& exp, const Encoded& train, const Encoded& val, const MaskSpec& spec,
                                        TrainSummary sum, const std::string& hash, Progress& progress,
                                        std::chrono::steady_clock::time_point t0) {
  const TrainConfig& tc = exp.train;
  const int64_t V = exp.model.stem.vocab_size;
  std::vector<int32_t> content;
  for (const Example& e : train.items)
    for (size_t t = 0; t < e.ids.size(); ++t)
      if (e.roles[t] == TSR_ROLE_CONTENT) content.push_back(e.ids[t]);
  TSR_ASSIGN_OR_RETURN(NgramModel m, NgramModel::count(1, content, V, tc.add_k));
  const int32_t top = static_cast<int32_t>(std::max_element(m.unigrams.begin(), m.unigrams.end()) - m.unigrams.begin());
  double nats = 0;
  int64_t counted = 0, right = 0;
  for (size_t i = 0; i < val.items.size(); ++i) {
    const Example& e = val.items[i];
    std::vector<int32_t> ids(e.ids.size()), targets(e.ids.size());
    mask_sequence(spec, mlm_eval_key(tc.seed, static_cast<int64_t>(i)), e.ids.data(), e.roles.data(), e.n(), ids.data(),
                  targets.data());
    for (int32_t y : targets) {
      if (y < 0) continue;
      if (y >= V)
        return Status::Invalid("train: a held-out token is id " + std::to_string(y) + ", outside model.stem.vocab_size " +
                               std::to_string(V));
      nats -= std::log(m.prob(-1, y));
      right += y == top;
      ++counted;
    }
  }
  EvalResult best = nats_result(nats, counted);
  best.accuracy = counted ? static_cast<double>(right) / static_cast<double>(counted) : 0;
  std::ofstream metrics((fs::path(sum.dir) / "metrics.jsonl").string(), std::ios::app);
  metrics << json({{"step", 0}, {"event", "start"}, {"config_hash", hash}, {"baseline", "unigram"}, {"objective", "mlm"},
                   {"add_k", tc.add_k}, {"tokens", m.total}, {"steps", 0}, {"parameters", 0}})
                 .dump()
          << "\n"
          << json({{"step", 0}, {"epoch", 1}, {"eval", eval_json(best)}, {"best", true}}).dump() << "\n";
  progress.line("unigram baseline (add-" + std::to_string(tc.add_k) + ", counted on " + std::to_string(m.total) +
                " content tokens), on " + std::to_string(counted) + " masked held-out rows: loss " +
                std::to_string(best.loss) + ", accuracy " + std::to_string(best.accuracy));
  sum.best = best;
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json s = {{"baseline", "unigram"}, {"steps", 0}, {"best_step", 0}, {"best", eval_json(best)},
            {"seconds", sum.seconds}, {"stopped_early", false}, {"classes", json::array()}};
  TSR_RETURN_IF_ERROR(write_file_atomic((fs::path(sum.dir) / "summary.json").string(), s.dump(2) + "\n"));
  return sum;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

namespace {

// dst += src, tensor by tensor (the same names and shapes).
void add_gradients(Parameters& dst, const Parameters& src) {
  for (size_t i = 0; i < dst.size(); ++i) {
    float* d = dst.find(dst[i].first)->data<float>();
    const float* x = src[i].second.data<float>();
    const int64_t n = src[i].second.numel();
    for (int64_t k = 0; k < n; ++k) d[k] += x[k];
  }
}

// Data-parallel training's gradient buckets, one per part of the model in the order the backward
// pass finishes them (GradOptions::on_part_done): the head with the final norm, blocks n_layers-1
// to 0, the stem with the positions. In a step's last micro-batch on this rank, each part's
// allreduce starts as soon as its gradients are done, and runs while the backward goes on below
// it (as PyTorch's DDP does); parts the backward did not reach start after it, in the same order
// on every rank. The sums are allreduce_sum's, so the bits do not depend on the buckets.
class GradBuckets {
 public:
  GradBuckets(Parameters* grads, int64_t n_layers) : grads_(grads) {
    std::vector<int64_t> order{n_layers};
    for (int64_t l = n_layers - 1; l >= 0; --l) order.push_back(l);
    order.push_back(-1);
    for (int64_t part : order) {
      Bucket b;
      b.part = part;
      for (size_t i = 0; i < grads->size(); ++i)
        if (part_of((*grads)[i].first, n_layers) == part) b.entries.push_back(i);
      if (b.entries.empty()) continue;
      int64_t n = 0;
      for (size_t i : b.entries) n += (*grads)[i].second.numel();
      b.buf.resize(static_cast<size_t>(n));
      buckets_.push_back(std::move(b));
    }
  }
  // A step's last micro-batch on this rank begins: its gradients go to *grads directly (add_from
  // null), or are computed apart into add_from and added part by part.
  void begin(Comm* comm, const Parameters* add_from) {
    comm_ = comm;
    add_from_ = add_from;
    for (Bucket& b : buckets_) b.started = false;
  }
  Status part_done(int64_t part) {
    for (Bucket& b : buckets_)
      if (b.part == part && !b.started) TSR_RETURN_IF_ERROR(start(b));
    return comm_->allreduce_progress();
  }
  // The parts not started yet (a rank without a micro-batch this step: all of them), then every
  // sum waited for and copied back into *grads.
  Status finish() {
    for (Bucket& b : buckets_)
      if (!b.started) TSR_RETURN_IF_ERROR(start(b));
    TSR_RETURN_IF_ERROR(comm_->allreduce_finish());
    for (Bucket& b : buckets_) {
      size_t at = 0;
      for (size_t i : b.entries) {
        Tensor* g = grads_->find((*grads_)[i].first);
        std::copy_n(b.buf.data() + at, g->numel(), g->data<float>());
        at += static_cast<size_t>(g->numel());
      }
    }
    return Status::Ok();
  }

 private:
  struct Bucket {
    int64_t part = 0;
    std::vector<size_t> entries;  // indices into *grads
    std::vector<float> buf;
    bool started = false;
  };
  static int64_t part_of(const std::string& name, int64_t n_layers) {
    if (name.rfind("head.", 0) == 0 || name.rfind("final_norm.", 0) == 0) return n_layers;
    if (name.rfind("blocks.", 0) == 0) return std::stoll(name.substr(7));
    return -1;
  }
  Status start(Bucket& b) {
    size_t at = 0;
    for (size_t i : b.entries) {
      Tensor* g = grads_->find((*grads_)[i].first);
      float* d = g->data<float>();
      const int64_t n = g->numel();
      if (add_from_) {
        const float* x = (*add_from_)[i].second.data<float>();
        for (int64_t k = 0; k < n; ++k) d[k] += x[k];
      }
      std::copy_n(d, n, b.buf.data() + at);
      at += static_cast<size_t>(n);
    }
    b.started = true;
    return comm_->allreduce_start(b.buf.data(), static_cast<int64_t>(b.buf.size()));
  }

  Parameters* grads_;
  Comm* comm_ = nullptr;
  const Parameters* add_from_ = nullptr;
  std::vector<Bucket> buckets_;
};

// The ranks' micro-batch losses, in micro-batch order (rank 0's first), on every rank.
Result<std::vector<double>> gather_losses(Comm& comm, const std::vector<double>& mine) {
  TSR_ASSIGN_OR_RETURN(std::vector<std::string> all, comm.allgather(json(mine).dump()));
  std::vector<double> out;
  for (const std::string& a : all)
    for (double l : json::parse(a)) out.push_back(l);
  return out;
}

}  // namespace

Result<TrainSummary> train_experiment(const Experiment& exp, const TrainOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = exp.model;
  const TrainConfig& tc = exp.train;
  if (tc.objective == Objective::auto_detect)
    return Status::Invalid("train: the model has neither a classifier nor an LM head (model.head.kind is " +
                           std::string(head_kind_name(c.head.kind)) + "): nothing to train it for");
  if (exp.data.path.empty()) return Status::Invalid("train: the experiment has no data.path");
  // A model the machine cannot train is refused before anything is read or allocated. Items'
  // rows are not known before encoding: the plan takes train.seq_len (else bench.seq_len).
  {
    const int64_t micro = std::max<int64_t>(1, tc.batch_size / std::max<int64_t>(1, tc.accumulate));
    const MemoryPlan plan = training_memory_plan(c, tc.seq_len > 0 ? tc.seq_len : exp.bench.seq_len, micro,
                                                 tc.optimizer == OptimizerKind::adamw ? 2 : 1);
    if (Status st = check_memory(plan, machine_memory()); !st.ok()) return st.with_prefix("train: " + exp.file);
  }
  const bool lm = tc.objective == Objective::lm;
  TrainSummary sum;
  sum.dir = opt.out_dir.empty() ? exp.outputs.dir : opt.out_dir;
  if (sum.dir.empty()) sum.dir = "runs/" + fs::path(exp.file).stem().string();  // as tessera run names it
  const std::string ckpt_dir = (fs::path(sum.dir) / "checkpoints").string();
  const std::string metrics_path = (fs::path(sum.dir) / "metrics.jsonl").string();
  std::error_code ec;
  if (fs::exists(ckpt_dir, ec) && !opt.resume && !opt.force)
    return Status::Invalid("train: " + sum.dir + " already holds a training run: pass --resume to continue it, "
                                 "or --force to start over");
  // Under MPI every rank trains the same weights and rank 0 alone writes the run folder.
  const bool root = launcher_rank() == 0;
  if (opt.force && !opt.resume && root) {
    fs::remove_all(ckpt_dir, ec);
    for (const char* leaf : {"metrics.jsonl", "best.safetensors", "summary.json"})
      fs::remove(fs::path(sum.dir) / leaf, ec);  // nothing of the old run is left to be taken for the new
  }
  fs::create_directories(sum.dir, ec);
  if (ec) return Status::IoError("train: cannot create " + sum.dir + ": " + ec.message());
  Progress progress(opt.progress && root);

  // Data.
  TSR_ASSIGN_OR_RETURN(Sources src, open_plugins(exp));
  // MPI starts after the plugins' worker processes are forked.
  Comm& comm = Comm::world();
  const int n_ranks = comm.size(), my_rank = comm.rank();
  if (my_rank != launcher_rank())
    return Status::Internal("train: MPI says rank " + std::to_string(my_rank) + ", the launcher's environment " +
                            std::to_string(launcher_rank()));
  std::vector<std::string> classes;
  if (tc.objective == Objective::classify) {
    Result<std::vector<DataItem>> listed =
        read_dataset(exp.data, src.inputs());
    if (!listed.ok()) return listed.status().with_prefix("data.path");
    classes = class_names(c, *listed);
    if (static_cast<int64_t>(classes.size()) != c.head.n_classes)
      return Status::Invalid("train: the data has " + std::to_string(classes.size()) + " classes but model.head.n_classes is " +
                             std::to_string(c.head.n_classes) + " (give model.head.labels to name them in order)");
  }
  sum.classes = classes;
  std::vector<int32_t> sep;
  if (lm) {
    TSR_ASSIGN_OR_RETURN(sep, separator_ids(exp, src));
  }
  TSR_ASSIGN_OR_RETURN(Encoded all, encode(exp, exp.data, src, classes, lm, sep));
  if (all.failed) progress.line("train: " + std::to_string(all.failed) + " item(s) could not be read: " + all.errors[0]);
  sum.bad_items = all.failed;
  Encoded train, val;
  TSR_RETURN_IF_ERROR(split_data(exp, src, classes, lm, sep, std::move(all), &train, &val));
  const bool mlm = tc.objective == Objective::mlm;
  MaskSpec spec;
  if (mlm) {
    TSR_ASSIGN_OR_RETURN(spec, mask_spec(exp, src, train));
  }
  const int64_t T = tc.seq_len;
  const int64_t n_train = lm ? (static_cast<int64_t>(train.stream.size()) - T - 1) : static_cast<int64_t>(train.items.size());
  if (n_train <= 0)
    return Status::Invalid(lm ? "train: the training text has " + std::to_string(train.stream.size()) +
                                    " tokens, fewer than one window of train.seq_len + 1 = " + std::to_string(T + 1)
                              : std::string("train: no training items"));
  // An epoch: every item once (classify), or as many windows as the stream holds tokens (lm).
  const int64_t per_epoch = lm ? std::max<int64_t>(1, n_train / T) : n_train;
  const int64_t steps_per_epoch = (per_epoch + tc.batch_size - 1) / tc.batch_size;
  int64_t total = tc.max_steps > 0 ? tc.max_steps : tc.epochs * steps_per_epoch;
  bool settled = false;  // train.max_minutes: whether total is the budget's settled count yet
  sum.examples = per_epoch;
  if (lm) {
    sum.input_rows = static_cast<double>(T);
  } else {
    double n_rows = 0;
    for (const Example& e : train.items) n_rows += static_cast<double>(e.n());
    sum.input_rows = n_rows / static_cast<double>(n_train);
  }
  TSR_RETURN_IF_ERROR(check_schedule(schedule_options(tc), total));
  if (tc.baseline != Baseline::none) {
    if (n_ranks > 1)
      return Status::Invalid("train: a baseline (train.baseline: " + std::string(baseline_name(tc.baseline)) +
                             ") runs as one process: start it without mpirun or srun");
    if (mlm && val.items.empty()) return Status::Invalid("train: no held-out items to evaluate the baseline on");
    if (opt.resume)
      return Status::Invalid("train --resume: a baseline (train.baseline: " + std::string(baseline_name(tc.baseline)) +
                             ") keeps no checkpoints; run it again with --force");
    if (fs::exists(metrics_path, ec) && !opt.force)
      return Status::Invalid("train: " + sum.dir + " already holds a run (metrics.jsonl): pass --force to start over");
    if (mlm) return train_mlm_baseline(exp, train, val, spec, sum, config_hash(exp), progress, t0);
    return train_baseline({exp, train.stream, val.stream, total, steps_per_epoch, n_train}, sum, config_hash(exp),
                          progress, t0);
  }

  // Model and optimizer, fresh or from the latest checkpoint.
  Parameters params;
  {  // owned, mutable copies of the resolved (initialised or mapped) tensors, which then go
    TSR_ASSIGN_OR_RETURN(Parameters resolved, Parameters::resolve(c));
    params = resolved.clone();
  }
  // The optimizer sees only what is trained (train.freeze): frozen parameters get no update and no state.
  TSR_ASSIGN_OR_RETURN(Optimizer optim, Optimizer::create(optimizer_options(tc), trained_part(tc, params)));
  const std::string hash = config_hash(exp);
  int64_t step = 0, best_step = 0, since_best = 0;
  // The training loss summed since the last metrics line: checkpointed, so that a resumed run's
  // first line averages over the same steps as the uninterrupted run's.
  double loss_sum = 0;
  int64_t loss_n = 0;
  EvalResult best;
  bool have_best = false;
  if (opt.resume) {
    Result<Checkpoint> ck = read_checkpoint(ckpt_dir);
    if (!ck.ok()) return ck.status().with_prefix("train --resume");
    TSR_RETURN_IF_ERROR(check_config_hash(*ck, hash));
    if (!ck->warning.empty()) progress.line("train --resume: " + ck->warning);
    TSR_RETURN_IF_ERROR(ck->weights.check(c));
    params = ck->weights.clone();
    TSR_RETURN_IF_ERROR(optim.load_state(ck->optimizer));
    step = ck->step;
    const json st = json::parse(ck->state_json, nullptr, false);
    if (st.is_object() && st.contains("best")) {
      have_best = true;
      best = best_from_json(st["best"], c);  // with its tasks: task_mean compares against them
      best_step = st.value("best_step", int64_t{0});
      since_best = st.value("since_best", int64_t{0});
    }
    if (st.is_object()) {
      loss_sum = st.value("loss_sum", 0.0);
      loss_n = st.value("loss_n", int64_t{0});
      if (st.contains("settled_steps")) {  // a budget's step count, settled before the checkpoint
        total = st.value("settled_steps", total);
        settled = true;
        sum.budget_minutes = st.value("budget_minutes", 0.0);
      }
    }
    if (root) TSR_RETURN_IF_ERROR(trim_metrics(metrics_path, step));
    sum.steps_resumed = step;
  }
  std::ofstream metrics;
  if (root) metrics.open(metrics_path, std::ios::app);
  auto log = [&](const json& j) {
    if (!root) return;
    metrics << j.dump() << "\n";
    metrics.flush();
  };
  auto save = [&](int64_t at) -> Status {
    if (!root) return Status::Ok();
    Checkpoint ck;
    ck.step = at;
    ck.weights = params;
    ck.optimizer = optim.state_view();  // written before the next step
    ck.config_hash = hash;
    json st = {{"step", at}, {"best_step", best_step}, {"since_best", since_best},
               {"loss_sum", loss_sum}, {"loss_n", loss_n}};
    if (settled) {  // kept by every resume, whatever max_minutes says then
      st["settled_steps"] = total;
      st["budget_minutes"] = sum.budget_minutes;
    }
    if (have_best) st["best"] = eval_json(best);
    ck.state_json = st.dump();
    return write_checkpoint(ckpt_dir, ck, static_cast<int>(tc.keep));
  };
  Parameters trained = trained_part(tc, params);  // after a resume: the checkpoint's tensors
  if (!opt.resume) log({{"step", 0}, {"event", "start"}, {"config_hash", hash}, {"examples", per_epoch},
                        {"steps", total}, {"parameters", params.numel()}, {"trained", trained.numel()}});
  if (!tc.freeze.empty())
    progress.line("train: " + std::to_string(trained.numel()) + " of " + std::to_string(params.numel()) +
                  " parameters trained (train.freeze holds the rest)");

  // A diverged run stops, naming the newest checkpoint (written only after a finite evaluation).
  auto diverged = [&](int64_t at, const std::string& what) {
    Result<Checkpoint> last = read_checkpoint(ckpt_dir);
    return Status::Invalid("train: step " + std::to_string(at) + ": the " + what + ". The last good checkpoint is " +
                           (last.ok() ? last->path : std::string("none (no checkpoint yet)")) +
                           ": lower train.lr, raise train.warmup_steps or set train.clip_norm and start again with --force "
                           "(--resume continues only under the config the run was started with)");
  };

  // The pictures of the run so far (loss.png, metric.png, confusion.png): a failure to draw them
  // is reported and training goes on.
  auto plots = [&](const std::vector<std::vector<int64_t>>& confusion) {
    if (!root) return;
    const Status st = report::write_plots(sum.dir, classes, confusion, c.head.tasks);
    if (!st.ok()) progress.line("train: no plots: " + st.message());
  };

  // The loop. Its steps allocate the same activations and gradients each time: keep their blocks.
  const TensorReuse reuse;
  Parameters grads = params.zeros_like();
  Parameters trained_grads = trained_part(tc, grads);  // the same storage
  // A step's micro-batches after its first (on this rank) are computed into `scratch` and added to
  // grads, so that their gradients are summed in micro-batch order whatever the number of ranks
  // that computes them (the allreduce below adds the ranks' sums in rank order).
  Parameters scratch, trained_scratch;  // made when a rank first has a second micro-batch
  std::optional<GradBuckets> buckets;  // under MPI: the allreduce, part by part
  if (n_ranks > 1) buckets.emplace(&trained_grads, c.n_layers);
  GradOptions go;
  go.reference = exp.runtime.reference;
  go.dropout = {static_cast<float>(tc.dropout.embedding), static_cast<float>(tc.dropout.attention),
                static_cast<float>(tc.dropout.residual), static_cast<uint64_t>(tc.seed), 0, 0};
  go.precision = tc.precision;
  backward_extent(c, trained, &go);
  // bf16: the matmul weights' bf16 copies, made from the f32 master weights once per step (here,
  // and after each update), not per micro-batch; a function of the weights alone, so a resumed
  // run makes the same ones.
  Parameters lowp;
  if (tc.precision == DType::bf16) {
    lowp = lowp_weights(c, params);
    go.lowp = &lowp;
  }
  // Under N ranks the step's batch is cut into at least N micro-batches, so that each rank has a
  // part of it: one process with train.accumulate N (and the same threads) gives the same bits.
  const int64_t micro = std::max<int64_t>(1, tc.batch_size / std::max<int64_t>(tc.accumulate, n_ranks));
  // The test set, scored once at the end with the best weights. Under a budget it is encoded now,
  // so that what scoring it costs is known when the step count is settled.
  Encoded test;
  bool test_encoded = false;
  auto encode_test = [&]() -> Status {
    DataConfig td = exp.data;
    td.path = tc.test_data;
    td.labels = tc.test_labels;
    td.limit = 0;
    TSR_ASSIGN_OR_RETURN(test, encode(exp, td, src, classes, lm, sep));
    test_encoded = true;
    return Status::Ok();
  };
  const bool budget = tc.max_minutes > 0 && !settled;
  if (budget && !tc.test_data.empty()) TSR_RETURN_IF_ERROR(encode_test());
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  const auto loop_start = std::chrono::steady_clock::now();
  const int64_t first = step;
  // train.max_minutes: steps first + 2 .. settle_at are timed (the first one makes oneDNN's
  // primitives), then one evaluation; what is left of the budget then settles total. The timed
  // steps are warmup steps (or the first after them), whose learning rates do not depend on total.
  constexpr int64_t kProbeSteps = 50;
  const int64_t settle_at =
      tc.schedule == ScheduleKind::constant
          ? first + 1 + kProbeSteps
          : std::max(first + 2, std::min(first + 1 + kProbeSteps, tc.warmup_steps + 1));
  auto probe_start = loop_start;
  auto seconds_since = [](std::chrono::steady_clock::time_point a) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  };
  auto held = [lm](const Encoded& e) { return static_cast<double>(lm ? e.stream.size() : e.items.size()); };
  while (step < total) {
    const int64_t epoch = step / steps_per_epoch, in_epoch = step % steps_per_epoch;
    if (!lm && epoch != order_epoch) {
      order = permutation(n_train, mix(tc.seed, static_cast<uint64_t>(epoch)));
      order_epoch = epoch;
    }
    // This step's examples: positions [in_epoch·batch, ...) of the epoch's order (the last step of
    // an epoch may be short), or batch_size windows at offsets drawn from (seed, step).
    std::vector<int64_t> picks;
    if (lm) {
      Rng rng(mix(tc.seed, static_cast<uint64_t>(step) + 1));
      for (int64_t i = 0; i < tc.batch_size; ++i)
        picks.push_back(static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(n_train)));
    } else {
      for (int64_t i = in_epoch * tc.batch_size; i < std::min(n_train, (in_epoch + 1) * tc.batch_size); ++i)
        picks.push_back(order[static_cast<size_t>(i)]);
    }
    double step_loss = 0;
    // The step's micro-batches j = 0 .. M-1 (micro examples each); rank r of N computes those in
    // [M r / N, M (r + 1) / N). Their losses, in order, are summed after the step.
    const int64_t n_micro = (static_cast<int64_t>(picks.size()) + micro - 1) / micro;
    const int64_t j_begin = n_micro * my_rank / n_ranks, j_end = n_micro * (my_rank + 1) / n_ranks;
    std::vector<double> micro_losses;
    for (int64_t j = j_begin; j < j_end; ++j) {
      const size_t m0 = static_cast<size_t>(j * micro);
      const std::vector<int64_t> mb(picks.begin() + static_cast<std::ptrdiff_t>(m0),
                                    picks.begin() + static_cast<std::ptrdiff_t>(std::min(picks.size(), m0 + static_cast<size_t>(micro))));
      Batch b;
      Targets tg;
      tg.label_smoothing = static_cast<float>(tc.label_smoothing);
      if (lm) {
        b = make_windows(train.stream, mb, T, &tg.tokens);
      } else if (mlm) {
        // Each example masked afresh at every step, keyed by (seed, step, its training index).
        std::vector<const Example*> ex;
        std::vector<uint64_t> keys;
        for (int64_t i : mb) {
          ex.push_back(&train.items[static_cast<size_t>(i)]);
          keys.push_back(mlm_train_key(tc.seed, step, i));
        }
        Result<Batch> made = make_mlm_batch(train, ex, keys, spec, &tg.tokens);
        if (!made.ok()) return made.status().with_prefix("train: step " + std::to_string(step + 1));
        b = std::move(made).value();
      } else {
        std::vector<const Example*> ex;
        Augment aug;
        if (any_augments(src)) {
          for (const Encoder& enc : src.encoders) aug.encoders.push_back(enc.augments() ? &enc : nullptr);
          aug.several = src.encoders.size() > 1;
          aug.seed = mix(mix(tc.seed, 0xa06e47), static_cast<uint64_t>(step));
          aug.index = mb;
        }
        for (int64_t i : mb) ex.push_back(&train.items[static_cast<size_t>(i)]);
        Result<Batch> made = make_batch(train.format, ex, &tg.labels, &aug);
        if (!made.ok()) return made.status().with_prefix("train: step " + std::to_string(step + 1));
        b = std::move(made).value();
        tg.label_blocks = label_blocks(c, ex);
      }
      go.dropout.step = static_cast<uint64_t>(step);
      go.dropout.micro_batch = static_cast<uint64_t>(j);
      const bool first_here = j == j_begin;
      if (!first_here && scratch.size() == 0) {
        scratch = params.zeros_like();
        trained_scratch = trained_part(tc, scratch);
      }
      if (!first_here) scratch.zero();
      const bool last_here = j == j_end - 1;
      GradOptions gj = go;
      if (buckets && last_here) {  // its parts' allreduces start during its backward
        buckets->begin(&comm, first_here ? nullptr : &trained_scratch);
        gj.on_part_done = [&](int64_t part) { return buckets->part_done(part); };
      }
      Result<LossValue> r = compute_gradients(c, params, b, tg, first_here ? &grads : &scratch, gj);
      if (!r.ok()) return r.status().with_prefix("train: step " + std::to_string(step + 1));
      if (!first_here && !(buckets && last_here)) add_gradients(trained_grads, trained_scratch);
      micro_losses.push_back(r->loss);
    }
    if (buckets) {
      if (j_begin == j_end) buckets->begin(&comm, nullptr);  // no micro-batch here this step: zeros
      TSR_RETURN_IF_ERROR(buckets->finish().with_prefix("train: step " + std::to_string(step + 1)));
      TSR_ASSIGN_OR_RETURN(micro_losses, gather_losses(comm, micro_losses));
    }
    const int64_t parts = n_micro;
    for (double l : micro_losses) step_loss += l;
    if (parts > 1) scale(trained_grads, 1.0 / static_cast<double>(parts));
    step_loss /= static_cast<double>(parts);
    std::string bad;
    if (!std::isfinite(step_loss) || !all_finite(trained_grads, &bad))
      return diverged(step + 1, (std::isfinite(step_loss) ? "gradient of " + bad : std::string("loss")) +
                                    " is not finite (NaN or Inf)" + (bad.empty() ? "" : "; it first appears in " + bad));
    const double norm = clip_grad_norm(trained_grads, tc.clip_norm);
    const double lr = scheduled_lr(schedule_options(tc), tc.lr, step, total);
    TSR_RETURN_IF_ERROR(optim.step(trained, trained_grads, lr));
    if (go.lowp) {  // the old copies go first, so that the new ones reuse their blocks
      lowp = Parameters();
      lowp = lowp_weights(c, params);
    }
    grads.zero();
    ++step;
    loss_sum += step_loss;
    ++loss_n;
    sum.last_loss = step_loss;
    if (budget && !settled && step == first + 1) probe_start = std::chrono::steady_clock::now();
    if (budget && !settled && step == settle_at) {
      const double step_s = seconds_since(probe_start) / static_cast<double>(step - first - 1);
      double eval_s = 0, test_s = 0;
      if (held(val) > 0) {
        const auto e0 = std::chrono::steady_clock::now();
        TSR_ASSIGN_OR_RETURN(EvalResult timed, evaluate(exp, params, val, micro, &spec));
        (void)timed;  // only its time counts
        eval_s = seconds_since(e0);
        if (test_encoded) test_s = eval_s * held(test) / held(val);
      }
      // Evaluations come every eval_every steps (or epoch) and once at the end. 10 % is kept for
      // the machine's speed drifting from what the timed steps showed (the Fashion-MNIST recipe's
      // step, timed at 35 ms, ran at 34 to 42 ms over 20 minutes of an idle machine: 38.3 ms on
      // average, evaluations included) and for checkpoints, plots and the report.
      const int64_t every = tc.eval_every > 0 ? tc.eval_every : steps_per_epoch;
      const double left = 0.90 * tc.max_minutes * 60.0 - seconds_since(t0) - eval_s - test_s;
      const double fit = std::floor(std::max(0.0, left) / (step_s + eval_s / static_cast<double>(every)));
      int64_t budgeted = step + std::max<int64_t>(1, static_cast<int64_t>(std::min(fit, 1e15)));
      // Every rank takes rank 0's count: the ranks' clocks differ, their step counts must not.
      TSR_RETURN_IF_ERROR(comm.broadcast(&budgeted, sizeof budgeted, 0));
      total = std::min(total, budgeted);
      settled = true;
      sum.budget_minutes = tc.max_minutes;
      log({{"step", step}, {"event", "budget"}, {"minutes", tc.max_minutes}, {"steps", total},
           {"step_seconds", step_s}, {"eval_seconds", eval_s}, {"test_seconds", test_s}});
      progress.line("train: " + std::to_string(total) + " steps fit train.max_minutes " + report::shortest(tc.max_minutes) +
                    " (" + std::to_string(static_cast<int64_t>(std::llround(step_s * 1000))) + " ms a step, an evaluation " +
                    std::to_string(static_cast<int64_t>(std::llround(eval_s * 1000))) + " ms)" +
                    (total < budgeted ? "; max_steps or epochs stop it first" : ""));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
    const double per_s = static_cast<double>((step - first) * tc.batch_size) / std::max(secs, 1e-9);
    if (step % tc.log_every == 0 || step == total) {
      log({{"step", step}, {"epoch", epoch + 1}, {"loss", loss_sum / static_cast<double>(loss_n)}, {"lr", lr},
           {"grad_norm", norm}, {"examples_per_s", per_s}});
      progress.step(epoch, step, total, loss_sum / static_cast<double>(loss_n), lr, per_s,
                    secs / static_cast<double>(step - first) * static_cast<double>(total - step));
      loss_sum = 0;
      loss_n = 0;
    }
    const bool epoch_end = step % steps_per_epoch == 0;
    const bool eval_now = tc.eval_every > 0 ? step % tc.eval_every == 0 || step == total : epoch_end || step == total;
    if (eval_now) {
      TSR_ASSIGN_OR_RETURN(EvalResult e, evaluate(exp, params, val, micro, &spec));
      // Finite gradients can still step to weights whose outputs overflow: such weights are
      // neither the best nor a checkpoint to resume from.
      if (!std::isfinite(e.loss)) return diverged(step, "validation loss is not finite (NaN or Inf)");
      json j = {{"step", step}, {"epoch", epoch + 1}, {"eval", eval_json(e)}};
      const bool improved = !have_best || better(tc.metric, e, best);
      if (improved) {
        best = e;
        best_step = step;
        have_best = true;
        since_best = 0;
        if (root) TSR_RETURN_IF_ERROR(params.save((fs::path(sum.dir) / "best.safetensors").string()));
      } else {
        ++since_best;
      }
      j["best"] = improved;
      log(j);
      plots(e.confusion);
      progress.line("eval at step " + std::to_string(step) + ": loss " + std::to_string(e.loss) +
                    (e.accuracy >= 0 ? ", accuracy " + std::to_string(e.accuracy) : "") +
                    (tc.metric == TrainMetric::macro_f1 ? ", macro-F1 " + std::to_string(e.macro_f1) : "") +
                    (e.bits_per_token >= 0 ? ", bits/token " + std::to_string(e.bits_per_token) : "") +
                    task_figures(e) +
                    (improved ? " (best)" : ""));
      TSR_RETURN_IF_ERROR(save(step));
      if (tc.patience > 0 && since_best >= tc.patience) {
        sum.stopped_early = true;
        log({{"step", step}, {"event", "early_stop"}, {"best_step", best_step}});
        if (opt.on_step) opt.on_step(step);
        break;
      }
    }
    if (opt.on_step) opt.on_step(step);
  }
  sum.steps = step;
  sum.best = best;
  sum.best_step = best_step;
  sum.metric = tc.metric;
  if (!tc.test_data.empty()) {
    if (!test_encoded) TSR_RETURN_IF_ERROR(encode_test());
    TSR_RETURN_IF_ERROR(comm.barrier());  // rank 0 has written best.safetensors
    TSR_ASSIGN_OR_RETURN(Parameters best_params, load_weights((fs::path(sum.dir) / "best.safetensors").string(), c));
    TSR_ASSIGN_OR_RETURN(sum.test, evaluate(exp, best_params, test, micro, &spec));
    log({{"step", step}, {"test", eval_json(sum.test)}, {"weights", "best.safetensors"}});
  }
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json s = {{"steps", sum.steps}, {"best_step", best_step}, {"best", eval_json(best)}, {"seconds", sum.seconds},
            {"stopped_early", sum.stopped_early}, {"classes", classes}, {"metric", train_metric_name(tc.metric)}};
  if (sum.test.counted) s["test"] = eval_json(sum.test);
  if (sum.budget_minutes > 0) s["budget_minutes"] = sum.budget_minutes;
  if (sum.bad_items > 0) s["bad_items"] = sum.bad_items;
  if (!root) return sum;
  TSR_RETURN_IF_ERROR(write_file_atomic((fs::path(sum.dir) / "summary.json").string(), s.dump(2) + "\n"));
  plots(sum.test.counted ? sum.test.confusion : best.confusion);
  const std::string model_line = "d_model " + std::to_string(c.d_model) + ", " + std::to_string(c.n_layers) +
                                 " layers, " + std::to_string(c.n_heads) + " heads, d_ff " + std::to_string(c.d_ff);
  const Status rs = report::write_report(sum.dir, exp.file, model_line, sum, params.numel());
  if (!rs.ok()) progress.line("train: no report.md: " + rs.message());
  return sum;
}

}  // namespace tessera

// ---------------------------------------------------------------------------------------------
// `tessera eval`

namespace tessera {

// A weights file written by Parameters::save, as owned f32 parameters of the model.
Result<Parameters> load_weights(const std::string& path, const ModelConfig& c) {
  TSR_ASSIGN_OR_RETURN(safetensors::File f, safetensors::File::open(path));
  std::vector<Parameters::Entry> entries;
  for (const ParamSpec& s : parameter_specs(c)) {
    TSR_ASSIGN_OR_RETURN(Tensor t, f.get(s.name));
    entries.emplace_back(s.name, t);
  }
  Parameters p(std::move(entries));
  TSR_RETURN_IF_ERROR(p.check(c));
  TSR_RETURN_IF_ERROR(p.check_finite(path));  // a NaN weight would only show as NaN metrics
  return p.clone();
}


Result<EvalReport> evaluate_experiment(const Experiment& exp, const EvalOptions& o) {
  const ModelConfig& c = exp.model;
  const TrainConfig& tc = exp.train;
  if (tc.objective == Objective::auto_detect)
    return Status::Invalid("eval: the model has neither a classifier nor an LM head (model.head.kind is " +
                           std::string(head_kind_name(c.head.kind)) + "): there is nothing to score");
  const bool lm = tc.objective == Objective::lm;
  if (tc.baseline != Baseline::none)
    return Status::Invalid(std::string("eval: train.baseline is ") + baseline_name(tc.baseline) +
                           ": a baseline is scored by tessera train itself (its summary.json); eval scores a model's weights");
  if (!o.labels.empty() && o.data.empty()) return Status::Invalid("eval: --labels names the labels of --data; give --data too");
  Parameters params;
  if (o.weights.empty()) {
    TSR_ASSIGN_OR_RETURN(params, Parameters::resolve(c));
  } else {
    Result<Parameters> p = load_weights(o.weights, c);
    if (!p.ok()) return p.status().with_prefix("eval: --weights " + o.weights);
    params = std::move(p).value();
  }
  TSR_ASSIGN_OR_RETURN(Sources src, open_plugins(exp));
  EvalReport rep;
  const bool mlm = tc.objective == Objective::mlm;
  if (tc.objective == Objective::classify) {
    if (exp.data.path.empty() && c.head.labels.empty())
      return Status::Invalid("eval: the classes come from model.head.labels or the training data (data.path); give one");
    if (c.head.labels.empty()) {
      Result<std::vector<DataItem>> listed =
          read_dataset(exp.data, src.inputs());
      if (!listed.ok()) return listed.status().with_prefix("data.path");
      rep.classes = class_names(c, *listed);
    } else {
      rep.classes = c.head.labels;
    }
  }
  std::vector<int32_t> sep;
  if (lm) {
    TSR_ASSIGN_OR_RETURN(sep, separator_ids(exp, src));
  }
  Encoded set;
  // mlm: the masks' random replacements draw from the training set's tokens, as in training.
  MaskSpec spec;
  if (mlm) {
    if (exp.data.path.empty()) return Status::Invalid("eval: a masked LM's masks need the training data (data.path)");
    TSR_ASSIGN_OR_RETURN(Encoded all, encode(exp, exp.data, src, rep.classes, lm, sep));
    Encoded train, held;
    TSR_RETURN_IF_ERROR(split_data(exp, src, rep.classes, lm, sep, std::move(all), &train, &held));
    TSR_ASSIGN_OR_RETURN(spec, mask_spec(exp, src, train));
  }
  if (!o.data.empty() || o.test) {
    DataConfig d = exp.data;
    d.path = o.data.empty() ? tc.test_data : o.data;
    d.labels = o.data.empty() ? tc.test_labels : o.labels;
    d.limit = 0;
    if (d.path.empty()) return Status::Invalid("eval: --test, but the experiment has no train.test_data");
    TSR_ASSIGN_OR_RETURN(set, encode(exp, d, src, rep.classes, lm, sep));
    rep.set = (o.data.empty() ? "the test set " : "") + d.path;
  } else {
    if (exp.data.path.empty()) return Status::Invalid("eval: the experiment has no data.path to hold out from; give --data");
    TSR_ASSIGN_OR_RETURN(Encoded all, encode(exp, exp.data, src, rep.classes, lm, sep));
    Encoded train;
    TSR_RETURN_IF_ERROR(split_data(exp, src, rep.classes, lm, sep, std::move(all), &train, &set));
    rep.set = !tc.validation_data.empty() ? "the validation set " + tc.validation_data
              : lm ? "the last " + fmt_share(tc.validation) + " of the text of " + exp.data.path + " (held out as training held it out)"
                   : "the seeded " + fmt_share(tc.validation) + " of the items of " + exp.data.path +
                         " (held out as training held it out)";
  }
  rep.failed = set.failed;
  if (lm ? set.stream.size() < static_cast<size_t>(tc.seq_len) + 1 : set.items.empty())
    return Status::Invalid("eval: " + rep.set + " has nothing to score" +
                           (lm ? " (fewer than train.seq_len + 1 tokens)" : std::string(" (no items)")));
  // In the batches training evaluates in, so that the figures agree to the bit.
  TSR_ASSIGN_OR_RETURN(rep.result, evaluate(exp, params, set, tc.batch_size / tc.accumulate, &spec));
  if (lm) {
    // The scored tokens are the targets of whole windows: stream[1 .. n·T].
    const int64_t T = tc.seq_len, n = (static_cast<int64_t>(set.stream.size()) - 1) / T;
    const std::vector<int32_t> scored(set.stream.begin() + 1, set.stream.begin() + 1 + n * T);
    Result<std::string> text = src.encoder().decode(scored);
    if (text.ok()) {
      for (unsigned char ch : *text) rep.result.characters += (ch & 0xC0) != 0x80;
      if (rep.result.characters > 0)
        rep.result.bits_per_character = rep.result.bits_per_token * static_cast<double>(rep.result.counted) /
                                        static_cast<double>(rep.result.characters);
    }
  }
  return rep;
}

}  // namespace tessera

// ---------------------------------------------------------------------------------------------
// One item of the dataset with its training targets (`tessera grad --item N`)

namespace tessera {

Result<ExperimentItem> experiment_item(const Experiment& exp, int64_t index) {
  const ModelConfig& c = exp.model;
  const TrainConfig& tc = exp.train;
  if (exp.data.path.empty()) return Status::Invalid("--item: the experiment has no data.path to take item " +
                                                    std::to_string(index) + " from");
  TSR_ASSIGN_OR_RETURN(Sources src, open_plugins(exp));
  Result<std::vector<DataItem>> listed =
      read_dataset(exp.data, src.inputs());
  if (!listed.ok()) return listed.status().with_prefix("data.path");
  const int64_t n = static_cast<int64_t>(listed->size());
  if (index < 0 || index >= n)
    return Status::Invalid("--item " + std::to_string(index) + " is out of range: the dataset " + exp.data.path + " has " +
                           std::to_string(n) + " item" + (n == 1 ? "" : "s") +
                           (n > 0 ? " (0 to " + std::to_string(n - 1) + ")" : std::string()));
  const DataItem& item = (*listed)[static_cast<size_t>(index)];
  ExperimentItem out;
  out.id = item.id;
  if (!item.error.empty()) return Status::Invalid("--item " + std::to_string(index) + " (" + item.id + "): " + item.error);
  int32_t label = -1;
  if (tc.objective == Objective::classify) {
    const std::vector<std::string> classes = class_names(c, *listed);
    label = class_index(classes, label_text(item));
    if (label < 0)
      return Status::Invalid("--item " + std::to_string(index) + " (" + item.id + "): its label \"" + label_text(item) +
                             "\" is not one of the " + std::to_string(classes.size()) + " classes");
  }
  // Encoded as training encodes it: the same sequences, without augmentation.
  const run::ItemSequences made =
      run::encode_item(exp, src.layout, src.encoders, item, index, run::read_parts(item, exp.runtime.max_item_bytes),
                       {tc.objective != Objective::lm});
  if (!made.ok())
    return Status::Invalid("--item " + std::to_string(index) + " (" + item.id + "): " +
                           (made.file.empty() ? "" : made.file + ": ") + made.reason);
  Encoded e;
  e.format = train::row_format(c, src.encoders, src.layout);
  for (const run::Sequence& s : made.seqs) e.items.push_back(make_example(e.format, s, label, false));
  if (tc.objective == Objective::classify && !c.head.tasks.empty()) {  // its task's block, as training's loss
    std::string why;
    const int32_t task = run::sequence_task(exp, made.seqs, &why);
    if (task < 0) return Status::Invalid("--item " + std::to_string(index) + " (" + item.id + "): " + why);
    const HeadTask& t = c.head.tasks[static_cast<size_t>(task)];
    if (label < t.first || label >= t.first + static_cast<int64_t>(t.labels.size()))
      return Status::Invalid("--item " + std::to_string(index) + " (" + item.id + "): its label \"" + label_text(item) +
                             "\" is not one of the classes of task " + t.name);
    for (Example& x : e.items) x.task = task;
  }
  std::vector<const Example*> ex;
  for (const Example& x : e.items) ex.push_back(&x);
  out.targets.label_smoothing = static_cast<float>(tc.label_smoothing);
  const std::string seqs = e.items.size() == 1 ? "" : " of its " + std::to_string(e.items.size()) + " sequences";
  if (tc.objective == Objective::mlm) {
    // The random replacements draw from the training set's tokens, as training's do.
    std::vector<std::string> none;
    TSR_ASSIGN_OR_RETURN(Encoded all, encode(exp, exp.data, src, none, false));
    Encoded train, val;
    TSR_RETURN_IF_ERROR(split_data(exp, src, none, false, {}, std::move(all), &train, &val));
    TSR_ASSIGN_OR_RETURN(MaskSpec spec, mask_spec(exp, src, train));
    const std::vector<uint64_t> keys(ex.size(), mlm_eval_key(tc.seed, index));
    TSR_ASSIGN_OR_RETURN(out.batch, make_mlm_batch(e, ex, keys, spec, &out.targets.tokens));
    int64_t chosen = 0;
    for (const Example* x : ex) {
      std::vector<int32_t> ids(x->ids.size()), targets(x->ids.size());
      std::vector<MaskChoice> choices(x->ids.size());
      mask_sequence(spec, keys[0], x->ids.data(), x->roles.data(), x->n(), ids.data(), targets.data(), choices.data());
      for (MaskChoice m : choices) chosen += m != MaskChoice::none;
      out.choices.push_back(std::move(choices));
    }
    out.loss = "masked-LM cross-entropy at the " + std::to_string(chosen) + " chosen rows" + seqs;
  } else {
    TSR_ASSIGN_OR_RETURN(out.batch, make_batch(e.format, ex, &out.targets.labels));
    if (tc.objective == Objective::lm) {
      out.targets.labels = Tensor();
      out.targets.tokens = next_token_targets(out.batch);
      out.loss = "next-token cross-entropy over the item's rows" + seqs;
    } else if (tc.objective == Objective::classify) {
      out.targets.label_blocks = label_blocks(c, ex);
      out.loss = "cross-entropy against its label " + std::to_string(label) + seqs;
    } else {
      return Status::Invalid("--item: the model has neither a classifier nor an LM head: give --ids or --rows (the loss "
                             "is then the sum of the final rows)");
    }
  }
  return out;
}

}  // namespace tessera
