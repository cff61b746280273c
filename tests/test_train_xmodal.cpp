// Training on several plugins in one sequence (issue 15, cross-modal): a training example's batch is
// the batch run's batch for the same item (run/sequences.h is the one assembly both call), bad
// multimodal items are counted and skipped, each plugin augments its own rows, the stem's
// gradients with modality embeddings against finite differences, and the cross-modal recipe
// (configs/train/digit_pairs.yaml) on a committed slice, where only both modalities together can
// bring the training loss below ln 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "run/batcher.h"     // core/src: the batch run's assembly and place_sequences
#include "train/examples.h"  // core/src: training examples and their batches
#include "tessera/config.h"
#include "tessera/model.h"
#include "tessera/parameters.h"
#include "tessera/plugin.h"
#include "tessera/run.h"
#include "tessera/train.h"
#include "test_training.h"

using namespace tessera;
using namespace tessera::testing_train;

namespace {

const std::string kPluginDir = TESSERA_PLUGIN_BUILD_DIR;
const std::string kQuickstart = std::string(TESSERA_SOURCE_DIR) + "/configs/experiments/quickstart/";
const std::string kSlice = std::string(TESSERA_TEST_DATA) + "/digit_pairs/";

std::string temp_dir(const std::string& name) { return testing_train::temp_dir("tessera_xmodal", name); }

// Two tensors hold the same values, shapes and types (both undefined also counts as equal).
void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const Tensor x = a.contiguous(), y = b.contiguous();
  EXPECT_EQ(0, std::memcmp(x.raw_data(), y.raw_data(), x.nbytes())) << what;
}

// The quickstart's four plugins (image, audio, text, protein) in one mixed stem with a modality
// embedding each, as a classifier over a manifest whose items pair two or three of them.
Experiment four_plugins(const std::string& d) {
  write(d + "/items.csv",
        "id,image,audio,text,protein,label\n"
        "cat+seven," + kQuickstart + "cat.jpg," + kQuickstart + "seven.wav,,,a\n"
        "cat+caption," + kQuickstart + "cat.jpg,,a tabby cat looks up at the camera,,b\n"
        "words+protein,,,a short line of text,MPRKRLTGIVVSDKMDKTVVVAVE,a\n"
        "seven+words+protein,," + kQuickstart + "seven.wav,seven,MKTAYIAKQR,b\n"
        "seven alone,," + kQuickstart + "seven.wav,,,a\n");
  const std::string yaml =
      "plugins:\n"
      "  - {name: image, path: " + kPluginDir + ", options: {image_size: 64, patch_size: 16, picture_size: 0}}\n"
      "  - {name: audio, path: " + kPluginDir + ", options: {recipe: ast, rows: patches, target_frames: 0}}\n"
      "  - {name: text, path: " + kPluginDir + ", options: {tokenizer: wordpiece, vocab: " + kQuickstart + "vocab.txt}}\n"
      "  - {name: protein, path: " + kPluginDir + ", options: {max_length: 64, length_policy: truncate}}\n"
      "model:\n  d_model: 8\n  n_heads: 2\n  n_layers: 1\n  d_ff: 16\n"
      "  stem: {kind: mixed, vocab_size: 30555, n_features: 1024, modalities: 4}\n"
      "  positions: {kind: learned, max_len: 128}\n"
      "  head: {kind: classifier, n_classes: 2, pool: mean, labels: [a, b]}\n"
      "data: {path: items.csv, allow_missing: true}\n"
      "train: {max_steps: 2, batch_size: 2, validation: 0}\n";
  return load(yaml, d);
}

TEST(TrainMultimodal, AnItemsTrainingBatchIsTheBatchRunsBatch) {
  const std::string d = temp_dir("same_batch");
  const Experiment exp = four_plugins(d);
  // The batch run's side: its encoders, its batcher and its padding.
  std::vector<std::shared_ptr<const Plugin>> plugins;
  std::vector<std::vector<Encoder>> encoders;
  ASSERT_TRUE(run::open_encoders(exp, &plugins, &encoders).ok());
  std::vector<PluginInput> inputs;
  for (const auto& p : plugins) inputs.push_back({p->name(), p->input_kind(), p->extensions()});
  Result<std::vector<DataItem>> items = read_dataset(exp.data, inputs);
  ASSERT_TRUE(items.ok()) << items.status().message();
  ASSERT_EQ(items->size(), 5u);
  std::vector<tsr_encoder_info> infos;
  for (const Encoder& e : encoders[0]) infos.push_back(e.info());
  run::Batcher batcher(exp, *items, plugins, &encoders, stem_layout(infos), 1);
  for (int64_t i = 0; i < 5; ++i) {
    SCOPED_TRACE("item " + std::to_string(i));
    const run::EncodedBatch eb = batcher.encode_batch(i);
    ASSERT_TRUE(eb.errors.empty()) << eb.errors[0].reason;
    ASSERT_EQ(eb.seqs.size(), 1u);
    const Batch run_batch = run::place_sequences(exp.model, eb.seqs.data(), 1, false).batch;
    // The training side (tessera grad --item, and the trainer's own batches).
    Result<ExperimentItem> it = experiment_item(exp, i);
    ASSERT_TRUE(it.ok()) << it.status().message();
    const Batch& train_batch = it->batch;
    expect_same(train_batch.ids, run_batch.ids, "ids");
    expect_same(train_batch.rows, run_batch.rows, "rows");
    expect_same(train_batch.roles, run_batch.roles, "roles");
    expect_same(train_batch.kinds, run_batch.kinds, "kinds");
    expect_same(train_batch.modality, run_batch.modality, "modality");
    EXPECT_EQ(train_batch.lengths, run_batch.lengths);
    // Every plugin of the item is in it, in its own place of the stem.
    ASSERT_TRUE(train_batch.kinds.defined() && train_batch.modality.defined());
    const int64_t T = train_batch.seq_len();
    std::vector<int> seen(4, 0);
    for (int64_t t = 0; t < T; ++t) {
      const int32_t m = train_batch.modality.data<int32_t>()[t];
      ASSERT_TRUE(m >= 0 && m < 4);
      ++seen[static_cast<size_t>(m)];
      EXPECT_EQ(train_batch.kinds.data<uint8_t>()[t], m < 2 ? 1 : 0) << "row " << t;  // image, audio: features
      if (m == 2) {
        EXPECT_LT(train_batch.ids.data<int32_t>()[t], 30522) << "text ids in 0..30521";
      }
      if (m == 3) {
        EXPECT_GE(train_batch.ids.data<int32_t>()[t], 30522) << "protein ids after the text's block";
      }
    }
    const std::vector<std::vector<int>> given = {{0, 1}, {0, 2}, {2, 3}, {1, 2, 3}, {1}};
    for (int m = 0; m < 4; ++m) {
      const bool in = std::find(given[i].begin(), given[i].end(), m) != given[i].end();
      EXPECT_EQ(seen[static_cast<size_t>(m)] > 0, in) << "plugin " << m;
    }
  }
  // And the model trains on them: two steps of the trainer's own batches.
  const TrainSummary s = train_ok(exp, train_options(d + "/run"));
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.bad_items, 0);
}

// The digit-pair slice (tests/data/digit_pairs) as the recipe reads it, small and fast.
LoadOptions slice_options(const std::string& manifest, const std::vector<std::string>& more = {}) {
  LoadOptions lo;
  lo.overrides = {"plugins.0.path=" + kPluginDir, "plugins.1.path=" + kPluginDir, "data.path=" + manifest,
                  "train.test_data=" + manifest, "train.max_minutes=0"};
  lo.overrides.insert(lo.overrides.end(), more.begin(), more.end());
  return lo;
}

Experiment recipe(const std::string& manifest, const std::vector<std::string>& more = {}) {
  Diagnostics diags;
  std::optional<Experiment> e = load_experiment(std::string(TESSERA_SOURCE_DIR) + "/configs/train/digit_pairs.yaml",
                                                slice_options(manifest, more), &diags);
  EXPECT_TRUE(e) << diags.str();
  return e ? *e : Experiment{};
}

TEST(TrainMultimodal, AnItemWithoutOnePluginsInputIsABadItemNotAnError) {
  const std::string d = temp_dir("bad_items");
  // The slice's pairs, one without its clip (no data.allow_missing), one whose clip is no sound
  // file and one whose image does not exist.
  std::string csv = slurp(kSlice + "pairs.csv");
  for (const std::string& rel : {std::string("img/"), std::string("wav/")}) {
    for (size_t at = csv.find("," + rel); at != std::string::npos; at = csv.find("," + rel, at + 1))
      csv.insert(at + 1, kSlice);
  }
  csv += "no-clip," + kSlice + "img/3-a.pgm,,same\n";
  write(d + "/not_a_wav.wav", "RIFF....WAVE but not really");
  csv += "bad-clip," + kSlice + "img/3-a.pgm," + d + "/not_a_wav.wav,same\n";
  csv += "no-image," + d + "/missing.pgm," + kSlice + "wav/3-flite.wav,same\n";
  write(d + "/pairs.csv", csv);
  const TrainSummary s = train_ok(
      recipe(d + "/pairs.csv", {"train.max_steps=2", "train.batch_size=8", "train.validation=0.1", "train.eval_every=2",
                                "model.n_layers=1"}),
      train_options(d + "/run"));
  EXPECT_EQ(s.bad_items, 3);
  EXPECT_EQ(s.examples, 36);  // 40 good pairs, 4 of them held out
  EXPECT_EQ(s.steps, 2);
  EXPECT_TRUE(has(slurp(d + "/run/summary.json"), "\"bad_items\": 3"));
}

TEST(TrainMultimodal, SeveralPluginsTrainOnlyAClassifier) {
  const std::string d = temp_dir("objective");
  write(d + "/items.csv", "id,text,protein\nx,hello,MKTAYIAKQR\n");
  const Experiment e = load(
      "plugins:\n"
      "  - {name: text, path: " + kPluginDir + ", options: {tokenizer: bytes}}\n"
      "  - {name: protein, path: " + kPluginDir + "}\n"
      "model:\n  d_model: 8\n  n_heads: 2\n  n_layers: 1\n  d_ff: 16\n  causal: true\n"
      "  stem: {kind: tokens, vocab_size: 512}\n  positions: {kind: learned, max_len: 64}\n  head: {kind: lm}\n"
      "data: {path: items.csv}\ntrain: {max_steps: 1, batch_size: 1, seq_len: 4}\n",
      d);
  Result<TrainSummary> r = train_experiment(e, train_options(d + "/run"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.status().message(), "plugins[1]")) << r.status().message();
  EXPECT_TRUE(has(r.status().message(), "only with a classifier head")) << r.status().message();
}

// Each plugin augments its own rows of a training batch: with the image plugin augmenting, the
// image rows' columns are exactly that plugin's augment() of them (seeded by example and plugin)
// and the audio columns are as encoded; with the audio plugin augmenting, the other way round.
TEST(TrainMultimodal, EachPluginAugmentsOnlyItsOwnColumns) {
  const Experiment exp = recipe(kSlice + "pairs.csv", {"plugins.0.options.augment_crop_padding=2",
                                                       "plugins.0.options.augment_flip=true"});
  std::vector<Encoder> encs;
  std::vector<tsr_encoder_info> infos;
  std::vector<PluginInput> inputs;
  for (const PluginConfig& pc : exp.plugins) {
    Result<std::shared_ptr<const Plugin>> p = Plugin::load(pc.file);
    ASSERT_TRUE(p.ok()) << p.status().message();
    Result<Encoder> e = Encoder::create(*p, pc.options);
    ASSERT_TRUE(e.ok()) << e.status().message();
    encs.push_back(std::move(e).value());
    infos.push_back(encs.back().info());
    inputs.push_back({(*p)->name(), (*p)->input_kind(), (*p)->extensions()});
  }
  ASSERT_TRUE(encs[0].augments() && encs[1].augments());  // the recipe's SpecAugment, and the crop here
  const StemLayout layout = stem_layout(infos);
  const train::RowFormat f = train::row_format(exp.model, encs, layout);
  ASSERT_EQ(f.width, 281);
  Result<std::vector<DataItem>> items = read_dataset(exp.data, inputs);
  ASSERT_TRUE(items.ok());
  std::vector<train::Example> examples;
  for (int64_t i = 0; i < 8; ++i) {
    const DataItem& item = (*items)[static_cast<size_t>(i)];
    run::ItemSequences made = run::encode_item(exp, layout, encs, item, i, run::read_parts(item, 0));
    ASSERT_TRUE(made.ok()) << made.reason;
    examples.push_back(train::make_example(f, made.seqs[0], 0, true));
  }
  std::vector<const train::Example*> ex;
  for (const train::Example& e : examples) ex.push_back(&e);
  Tensor labels;
  Result<Batch> plain = train::make_batch(f, ex, &labels);
  ASSERT_TRUE(plain.ok());
  const int64_t T = plain->seq_len();
  for (int only = 0; only < 2; ++only) {
    SCOPED_TRACE(only == 0 ? "the image plugin augments" : "the audio plugin augments");
    train::Augment aug;
    aug.encoders = {only == 0 ? &encs[0] : nullptr, only == 1 ? &encs[1] : nullptr};
    aug.several = true;
    aug.seed = 12345;
    for (int64_t i = 0; i < 8; ++i) aug.index.push_back(100 + i);
    Result<Batch> b = train::make_batch(f, ex, &labels, &aug);
    ASSERT_TRUE(b.ok()) << b.status().message();
    expect_same(b->roles, plain->roles, "roles");
    expect_same(b->modality, plain->modality, "modality");
    int64_t changed = 0;
    for (int64_t i = 0; i < 8; ++i) {
      const train::Example& e = examples[static_cast<size_t>(i)];
      for (const run::SequencePart& part : e.parts) {
        const int64_t col = layout.column[static_cast<size_t>(part.plugin)], w = infos[static_cast<size_t>(part.plugin)].width;
        const int64_t n = part.end - part.begin;
        // This part's rows, unaugmented and as the batch holds them.
        std::vector<float> before(static_cast<size_t>(n * w)), after(before.size());
        for (int64_t t = 0; t < n; ++t)
          for (int64_t k = 0; k < 281; ++k) {
            const float x = plain->rows.data<float>()[(i * T + part.begin + t) * 281 + k];
            const float y = b->rows.data<float>()[(i * T + part.begin + t) * 281 + k];
            if (k >= col && k < col + w) {
              before[static_cast<size_t>(t * w + k - col)] = x;
              after[static_cast<size_t>(t * w + k - col)] = y;
            } else {
              ASSERT_EQ(x, 0.f);  // another plugin's columns stay zero
              ASSERT_EQ(y, 0.f);
            }
          }
        if (part.plugin != only) {
          EXPECT_EQ(before, after) << "example " << i << ": plugin " << part.plugin << "'s rows must be as encoded";
          continue;
        }
        // Exactly the plugin's own augmentation of its rows, seeded by (seed, example, plugin).
        TokenRows r;
        r.kind = TSR_ROWS_FEATURES;
        r.features = Tensor::wrap(before.data(), {n, w}, DType::f32, nullptr);
        r.positions.assign(e.positions.begin() + part.begin, e.positions.begin() + part.end);
        r.roles.assign(e.roles.begin() + part.begin, e.roles.begin() + part.end);
        r.grid_rows = part.grid_rows;
        r.grid_cols = part.grid_cols;
        std::vector<float> expected(before.size());
        ASSERT_TRUE(encs[static_cast<size_t>(only)]
                        .augment(r, train::mix(train::mix(aug.seed, static_cast<uint64_t>(100 + i)),
                                               static_cast<uint64_t>(only)),
                                 expected.data())
                        .ok());
        EXPECT_EQ(after, expected) << "example " << i;
        changed += after != before;
      }
    }
    EXPECT_GE(changed, 4) << "the augmentation changed too few examples to test anything";
  }
}

// The same in whole training runs: the image plugin's crop and flip change training; the held-out
// pairs are scored unaugmented.
TEST(TrainMultimodal, EachPluginAugmentsItsOwnRowsInTraining) {
  const std::string d = temp_dir("augment");
  const std::vector<std::string> common = {"train.max_steps=6", "train.batch_size=8", "train.validation=0.2",
                                           "train.eval_every=3", "model.n_layers=1", "train.log_every=1",
                                           "plugins.1.options.augment_time_masks=0",
                                           "plugins.1.options.augment_freq_masks=0"};
  std::vector<std::string> aug = common;
  aug.push_back("plugins.0.options.augment_crop_padding=2");
  aug.push_back("plugins.0.options.augment_flip=true");
  const TrainSummary plain = train_ok(recipe(kSlice + "pairs.csv", common), train_options(d + "/plain"));
  const TrainSummary with = train_ok(recipe(kSlice + "pairs.csv", aug), train_options(d + "/aug"));
  EXPECT_NE(plain.last_loss, with.last_loss);
  EvalOptions eo;
  eo.weights = d + "/aug/checkpoints/step-000006/weights.safetensors";
  Result<EvalReport> a = evaluate_experiment(recipe(kSlice + "pairs.csv", aug), eo);
  Result<EvalReport> b = evaluate_experiment(recipe(kSlice + "pairs.csv", common), eo);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->result.loss, b->result.loss);
  // The audio plugin's SpecAugment beside the image's: both augment, each its own rows.
  aug.push_back("plugins.1.options.augment_time_masks=1");
  aug.push_back("plugins.1.options.augment_time_mask_width=5");
  const TrainSummary both = train_ok(recipe(kSlice + "pairs.csv", aug), train_options(d + "/both"));
  EXPECT_NE(both.last_loss, with.last_loss);
}

// ---------------------------------------------------------------------------------------------
// Gradients of a stem with modality embeddings against central differences. (Against PyTorch
// autograd, tests/test_grad_fixtures.cpp's "mixed" case holds a mixed stem with modality
// embeddings; this adds the feature stem with a CLS row that the digit-pair recipe uses, and the
// mixed stem again, by finite differences of the loss itself.)

// d loss / d p[k] by central differences (the loss in f64 from f32 forwards, step h).
double numeric_grad(const ModelConfig& c, Parameters& p, const std::string& name, int64_t k, const Batch& b,
                    const Targets& tg, double h) {
  Tensor* t = p.find(name);
  float* v = t->data<float>() + k;
  const float keep = *v;
  Parameters scratch = p.zeros_like();
  GradOptions go;
  go.reference = true;
  *v = static_cast<float>(keep + h);
  const double up = compute_gradients(c, p, b, tg, &scratch, go)->loss;
  *v = static_cast<float>(keep - h);
  const double down = compute_gradients(c, p, b, tg, &scratch, go)->loss;
  *v = keep;
  return (up - down) / (2 * h);
}

void check_against_differences(const std::string& yaml, const Batch& b, const std::vector<std::string>& names) {
  Diagnostics diags;
  std::optional<Experiment> e = load_experiment_from_string(yaml, "grad.yaml", ".", {}, &diags);
  ASSERT_TRUE(e) << diags.str();
  const ModelConfig& c = e->model;
  Result<Parameters> resolved = Parameters::resolve(c);
  ASSERT_TRUE(resolved.ok());
  Parameters p = resolved->clone();
  Targets tg;
  tg.labels = Tensor::empty({b.batch_size()}, DType::i32);
  for (int64_t i = 0; i < b.batch_size(); ++i) tg.labels.data<int32_t>()[i] = static_cast<int32_t>(i % 2);
  Parameters grads = p.zeros_like();
  GradOptions go;
  go.reference = true;
  Result<LossValue> l = compute_gradients(c, p, b, tg, &grads, go);
  ASSERT_TRUE(l.ok()) << l.status().message();
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const Tensor* g = grads.find(name);
    ASSERT_NE(g, nullptr);
    double scale = 0;
    for (int64_t k = 0; k < g->numel(); ++k) scale = std::max(scale, std::abs(static_cast<double>(g->data<float>()[k])));
    ASSERT_GT(scale, 1e-4) << "a gradient this small checks nothing";
    double worst = 0;
    for (int64_t k = 0; k < g->numel(); ++k) {
      const double n = numeric_grad(c, p, name, k, b, tg, 1e-2);
      worst = std::max(worst, std::abs(n - static_cast<double>(g->data<float>()[k])));
    }
    std::printf("[ grad ] %-14s |grad| max %.3e, worst difference %.2e (%.1e of it)\n", name.c_str(), scale, worst,
                worst / scale);
    EXPECT_LT(worst, 2e-3 * scale + 2e-6);
  }
}

// Two items, rows of two plugins in disjoint columns, a CLS row first, one item padded.
Batch two_modality_batch(bool mixed) {
  const int64_t B = 2, T = 6, F = 5;
  Batch b;
  b.rows = Tensor::zeros({B, T, F});
  b.roles = Tensor::full({B, T}, TSR_ROLE_CONTENT).to(DType::u8);
  b.modality = Tensor::zeros({B, T}, DType::i32);
  if (mixed) {
    b.kinds = Tensor::zeros({B, T}, DType::u8);
    b.ids = Tensor::zeros({B, T}, DType::i32);
  }
  b.lengths = {6, 5};
  for (int64_t i = 0; i < B; ++i) {
    b.roles.data<uint8_t>()[i * T] = TSR_ROLE_CLS;  // plugin 0's CLS row
    for (int64_t t = 0; t < T; ++t) {
      const int32_t m = t < 3 ? 0 : 1;  // rows 0-2 plugin 0 (columns 0-1), rows 3-5 plugin 1
      b.modality.data<int32_t>()[i * T + t] = m;
      if (mixed && m == 1) {
        b.ids.data<int32_t>()[i * T + t] = static_cast<int32_t>((i * 3 + t) % 7);
        continue;
      }
      if (mixed) b.kinds.data<uint8_t>()[i * T + t] = 1;
      for (int64_t f = 0; f < F; ++f) {
        const bool own = m == 0 ? f < 2 : f >= 2;
        if (own && t > 0) b.rows.data<float>()[(i * T + t) * F + f] = std::sin(static_cast<float>(1 + i * 31 + t * 7 + f));
      }
    }
    if (i == 1) b.roles.data<uint8_t>()[i * T + 5] = TSR_ROLE_PAD;
  }
  return b;
}

TEST(GradMultimodal, FeatureStemWithCLSAndModalitiesMatchesFiniteDifferences) {
  const std::string yaml =
      "model:\n  d_model: 8\n  n_heads: 2\n  n_layers: 1\n  d_ff: 16\n  norm: pre\n  activation: gelu\n"
      "  stem: {kind: features, n_features: 5, cls: true, modalities: 2}\n"
      "  positions: {kind: learned, max_len: 8}\n"
      "  head: {kind: classifier, n_classes: 2, pool: cls}\n  init: {seed: 7}\n";
  check_against_differences(yaml, two_modality_batch(false),
                            {"stem.modality", "stem.cls", "stem.proj", "pos.table", "blocks.0.attn.w_q"});
}

TEST(GradMultimodal, MixedStemWithModalitiesMatchesFiniteDifferences) {
  const std::string yaml =
      "model:\n  d_model: 8\n  n_heads: 2\n  n_layers: 1\n  d_ff: 16\n  norm: pre\n  activation: gelu\n"
      "  stem: {kind: mixed, vocab_size: 7, n_features: 5, cls: true, modalities: 2}\n"
      "  positions: {kind: learned, max_len: 8}\n"
      "  head: {kind: classifier, n_classes: 2, pool: mean}\n  init: {seed: 7}\n";
  check_against_differences(yaml, two_modality_batch(true), {"stem.modality", "stem.cls", "stem.proj", "stem.embed"});
}

// ---------------------------------------------------------------------------------------------
// The cross-modal recipe on the committed slice: 20 digit images (2 of each digit) and 20 spoken
// digits (2 voices), 40 pairs in which every image and every clip is once "same" and once
// "different". So no model of one modality can score the training pairs better than ln 2 a pair
// (each input's label is a coin), and the full model must go far below it: a test of the
// mechanics (both plugins' rows reach the model, in their own columns, with their modality), not of
// learning digits from 40 pairs. The held-out figures of the full data set are in docs/TRAINING.md.
TEST(TrainQuality, DigitPairsSliceNeedsBothModalitiesToBeatChance) {
  const std::string d = temp_dir("quality");
  const std::vector<std::string> common = {"train.max_steps=150", "train.batch_size=8", "train.warmup_steps=10",
                                           "train.lr=3e-3", "train.validation=0", "train.eval_every=150",
                                           "train.weight_decay=0", "train.log_every=50",
                                           // the recipe's SpecAugment off: forty pairs are to be learnt as they are
                                           "plugins.1.options.augment_time_masks=0",
                                           "plugins.1.options.augment_freq_masks=0"};
  auto train_loss = [&](const std::string& manifest, const std::string& name) {
    std::vector<std::string> more = common;
    if (manifest != "pairs.csv") more.push_back("data.allow_missing=true");
    more.push_back("train.validation_data=" + kSlice + manifest);
    const Experiment e = recipe(kSlice + manifest, more);
    const TrainSummary s = train_ok(e, train_options(d + "/" + name));
    std::printf("[ digit pairs slice ] %-10s training pairs: loss %.3f, accuracy %.3f (ln 2 = 0.693); %.1f s\n",
                name.c_str(), s.best.loss, s.best.accuracy, s.seconds);
    return s.best;
  };
  const EvalResult both = train_loss("pairs.csv", "both");
  const EvalResult image = train_loss("pairs.image_only.csv", "image");
  const EvalResult audio = train_loss("pairs.audio_only.csv", "audio");
  EXPECT_EQ(both.counted, 40);
  EXPECT_LT(both.loss, 0.25);
  EXPECT_GE(both.accuracy, 0.95);
  // One modality cannot do better than a coin on these pairs.
  EXPECT_GT(image.loss, 0.65);
  EXPECT_GT(audio.loss, 0.65);
}

}  // namespace
