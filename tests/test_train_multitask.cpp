// Multi-task training (issue 15): one shared encoder with a head per task (model.head.tasks). The
// blocked loss against a plain reference loop and its gradients against finite differences; a
// task's rows give no gradient to another task's classifier rows; the config errors (unknown
// plugin, a label in two tasks, labels given twice, n_classes that disagrees) and the item errors
// (an item whose plugin has no task, a label outside its task); each task's figures in the
// evaluation, metrics.jsonl, summary.json, report.md, the plots and a batch run's predictions; and
// configs/train/multitask.yaml on a committed slice (tests/data/multitask), where each task must
// learn its own training items far above chance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

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
const std::string kSlice = std::string(TESSERA_TEST_DATA) + "/multitask/";
const std::string kRecipe = std::string(TESSERA_SOURCE_DIR) + "/configs/train/multitask.yaml";

std::string temp_dir(const std::string& name) { return testing_train::temp_dir("tessera_multitask", name); }

// ---------------------------------------------------------------------------------------------
// The blocked loss and its gradients

// A small feature model whose classifier has 7 classes in two tasks: a (0..2) and b (3..6).
const std::string kTwoTasks =
    "plugins:\n"
    "  - {name: image, path: " + kPluginDir + "}\n"
    "  - {name: audio, path: " + kPluginDir + "}\n"
    "model:\n  d_model: 8\n  n_heads: 2\n  n_layers: 1\n  d_ff: 16\n  norm: pre\n  activation: gelu\n"
    "  stem: {kind: features, n_features: 5, cls: true, modalities: 2}\n"
    "  positions: {kind: learned, max_len: 8}\n"
    "  head:\n    kind: classifier\n    pool: mean\n    tasks:\n"
    "      - {name: a, plugin: image, labels: [a0, a1, a2]}\n"
    "      - {name: b, plugin: audio, labels: [b0, b1, b2, b3]}\n"
    "  init: {seed: 7}\n";

ModelConfig two_tasks_model() {
  Diagnostics diags;
  std::optional<Experiment> e = load_experiment_from_string(kTwoTasks, "grad.yaml", ".", {}, &diags);
  EXPECT_TRUE(e) << diags.str();
  return e ? e->model : ModelConfig{};
}

// Four items of random feature rows, one of them padded.
Batch four_items() {
  const int64_t B = 4, T = 5, F = 5;
  Batch b;
  b.rows = Tensor::zeros({B, T, F});
  b.roles = Tensor::full({B, T}, TSR_ROLE_CONTENT).to(DType::u8);
  b.modality = Tensor::zeros({B, T}, DType::i32);
  b.lengths = {5, 5, 4, 5};
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < T; ++t) {
      b.modality.data<int32_t>()[i * T + t] = static_cast<int32_t>(i % 2);
      for (int64_t f = 0; f < F; ++f)
        b.rows.data<float>()[(i * T + t) * F + f] = std::sin(static_cast<float>(1 + i * 31 + t * 7 + f * 3));
    }
  b.roles.data<uint8_t>()[2 * T + 4] = TSR_ROLE_PAD;
  return b;
}

// Labels 1 (task a), 5 (b), 2 (a), 3 (b); blocks [0, 3) and [3, 7).
Targets four_targets(float smoothing) {
  Targets tg;
  tg.label_smoothing = smoothing;
  tg.labels = Tensor::empty({4}, DType::i32);
  tg.label_blocks = Tensor::empty({4, 2}, DType::i32);
  const int32_t labels[4] = {1, 5, 2, 3};
  for (int i = 0; i < 4; ++i) {
    tg.labels.data<int32_t>()[i] = labels[i];
    tg.label_blocks.data<int32_t>()[2 * i] = i % 2 ? 3 : 0;
    tg.label_blocks.data<int32_t>()[2 * i + 1] = i % 2 ? 7 : 3;
  }
  return tg;
}

double numeric_grad(const ModelConfig& c, Parameters& p, const std::string& name, int64_t k, const Batch& b,
                    const Targets& tg, double h) {
  float* v = p.find(name)->data<float>() + k;
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

TEST(MultitaskLoss, IsEachRowsCrossEntropyOverItsOwnTasksClassesAsAPlainLoopComputesIt) {
  const ModelConfig c = two_tasks_model();
  ASSERT_EQ(c.head.n_classes, 7);
  ASSERT_EQ(c.head.labels, (std::vector<std::string>{"a0", "a1", "a2", "b0", "b1", "b2", "b3"}));
  ASSERT_EQ(c.head.tasks[1].first, 3);
  Result<Parameters> resolved = Parameters::resolve(c);
  ASSERT_TRUE(resolved.ok());
  const Parameters p = resolved->clone();
  const Batch b = four_items();
  Result<Model> m = Model::build(c, p);
  ASSERT_TRUE(m.ok());
  ForwardOptions fo;
  fo.reference = true;
  Outputs out;
  ASSERT_TRUE(m->forward(b, fo, &out).ok());
  for (const float smoothing : {0.f, 0.1f}) {
    const Targets tg = four_targets(smoothing);
    // The reference: a loop over each row's block only, label smoothing spread over that block.
    double want = 0;
    for (int64_t i = 0; i < 4; ++i) {
      const int32_t first = tg.label_blocks.data<int32_t>()[2 * i], end = tg.label_blocks.data<int32_t>()[2 * i + 1];
      const float* z = out.logits.data<float>() + i * 7;
      double mx = -1e300, s = 0;
      for (int32_t k = first; k < end; ++k) mx = std::max(mx, static_cast<double>(z[k]));
      for (int32_t k = first; k < end; ++k) s += std::exp(z[k] - mx);
      const double lse = mx + std::log(s);
      const int32_t y = tg.labels.data<int32_t>()[i];
      for (int32_t k = first; k < end; ++k) {
        const double q = smoothing / (end - first) + (k == y ? 1.0 - smoothing : 0.0);
        want += q * (lse - z[k]);
      }
    }
    want /= 4;
    Parameters grads = p.zeros_like();
    GradOptions go;
    go.reference = true;
    Result<LossValue> l = compute_gradients(c, p, b, tg, &grads, go);
    ASSERT_TRUE(l.ok()) << l.status().message();
    EXPECT_NEAR(l->loss, want, 1e-5 * std::abs(want)) << "smoothing " << smoothing;
    // Over all 7 classes the loss would differ: the blocks are what is computed.
    Targets all = tg;
    all.label_blocks = Tensor();
    Parameters g2 = p.zeros_like();
    EXPECT_GT(std::abs(compute_gradients(c, p, b, all, &g2, go)->loss - want), 1e-3);
  }
}

TEST(MultitaskLoss, GradientsMatchFiniteDifferences) {
  const ModelConfig c = two_tasks_model();
  Parameters p = Parameters::resolve(c)->clone();
  const Batch b = four_items();
  const Targets tg = four_targets(0.1f);
  Parameters grads = p.zeros_like();
  GradOptions go;
  go.reference = true;
  ASSERT_TRUE(compute_gradients(c, p, b, tg, &grads, go).ok());
  for (const std::string name : {"head.w", "head.b", "stem.proj", "stem.modality", "blocks.0.attn.w_q"}) {
    SCOPED_TRACE(name);
    const Tensor* g = grads.find(name);
    ASSERT_NE(g, nullptr);
    double scale = 0, worst = 0;
    for (int64_t k = 0; k < g->numel(); ++k) scale = std::max(scale, std::abs(static_cast<double>(g->data<float>()[k])));
    ASSERT_GT(scale, 1e-4) << "a gradient this small checks nothing";
    for (int64_t k = 0; k < g->numel(); ++k)
      worst = std::max(worst, std::abs(numeric_grad(c, p, name, k, b, tg, 1e-2) - g->data<float>()[k]));
    std::printf("[ grad ] %-18s |grad| max %.3e, worst difference %.2e\n", name.c_str(), scale, worst);
    EXPECT_LT(worst, 2e-3 * scale + 2e-6);
  }
}

TEST(MultitaskLoss, ATasksRowsTrainOnlyItsOwnClassifierRows) {
  const ModelConfig c = two_tasks_model();
  const Parameters p = Parameters::resolve(c)->clone();
  Targets tg = four_targets(0.1f);
  for (int i = 0; i < 4; ++i) {  // every row task b's
    tg.label_blocks.data<int32_t>()[2 * i] = 3;
    tg.label_blocks.data<int32_t>()[2 * i + 1] = 7;
    tg.labels.data<int32_t>()[i] = 3 + i;
  }
  Parameters grads = p.zeros_like();
  GradOptions go;
  ASSERT_TRUE(compute_gradients(c, p, four_items(), tg, &grads, go).ok());
  const Tensor& w = *grads.find("head.w");  // (C, K): column k is class k's
  const Tensor& bias = *grads.find("head.b");
  const int64_t C = c.d_model, K = 7;
  ASSERT_EQ(w.numel(), C * K);
  double other = 0, own = 0;
  for (int64_t r = 0; r < C; ++r)
    for (int64_t k = 0; k < K; ++k) (k < 3 ? other : own) += std::abs(w.data<float>()[r * K + k]);
  for (int64_t k = 0; k < K; ++k) (k < 3 ? other : own) += std::abs(bias.data<float>()[k]);
  EXPECT_EQ(other, 0.0) << "task a's classifier rows got a gradient from task b's items";
  EXPECT_GT(own, 1e-3);
}

TEST(MultitaskLoss, ALabelOutsideItsBlockIsAnError) {
  const ModelConfig c = two_tasks_model();
  const Parameters p = Parameters::resolve(c)->clone();
  Targets tg = four_targets(0.f);
  tg.labels.data<int32_t>()[1] = 0;  // a task-a label on a task-b row
  Parameters grads = p.zeros_like();
  Result<LossValue> l = compute_gradients(c, p, four_items(), tg, &grads, GradOptions{});
  ASSERT_FALSE(l.ok());
  EXPECT_TRUE(has(l.status().message(), "row 1's label 0 is outside its task's classes [3, 7)")) << l.status().message();
}

// ---------------------------------------------------------------------------------------------
// Config errors

std::string config_error(const std::string& tasks, const std::string& extra_head = "") {
  const std::string yaml =
      "model:\n  d_model: 8\n  n_heads: 2\n  n_layers: 1\n  d_ff: 16\n"
      "  stem: {kind: features, n_features: 5}\n"
      "  head:\n    kind: classifier\n" + extra_head + "    tasks:\n" + tasks;
  Diagnostics d;
  std::optional<Experiment> e = try_load(yaml, ".", &d);
  EXPECT_FALSE(e) << "loaded: " << yaml;
  return d.str();
}

TEST(MultitaskConfig, ALabelInTwoTasksIsAnErrorNamingBoth) {
  const std::string msg = config_error("      - {name: shirts, plugin: image, labels: [small, large]}\n"
                                       "      - {name: words, plugin: text, labels: [noun, large]}\n");
  EXPECT_TRUE(has(msg, "exp.yaml:11:9: model.head.tasks[1].labels: label \"large\" is in two tasks (shirts and words)"))
      << msg;
}

TEST(MultitaskConfig, LabelsAndTasksTogetherAndAWrongNClassesAreErrors) {
  const std::string tasks = "      - {name: a, plugin: image, labels: [x, y]}\n";
  std::string msg = config_error(tasks, "    labels: [y, x]\n");
  EXPECT_TRUE(has(msg, "model.head.labels: labels and tasks both name the classes, and differ")) << msg;
  msg = config_error(tasks, "    n_classes: 3\n");
  EXPECT_TRUE(has(msg, "model.head.n_classes: n_classes 3, but the tasks have 2 labels in all")) << msg;
  msg = config_error("      - {name: a, plugin: image, labels: [x], head: 2}\n");
  EXPECT_TRUE(has(msg, "model.head.tasks[0].head: unknown key")) << msg;
  msg = config_error("      - {name: a, labels: [x]}\n");
  EXPECT_TRUE(has(msg, "model.head.tasks[0]: missing key `plugin`")) << msg;
  msg = config_error("      - {name: a b, plugin: image, labels: [x]}\n");
  EXPECT_TRUE(has(msg, "task name \"a b\" is not a plain name")) << msg;
  msg = config_error("      - {name: a, plugin: image, labels: [x]}\n      - {name: a, plugin: text, labels: [y]}\n");
  EXPECT_TRUE(has(msg, "model.head.tasks[1].name: a second task named \"a\"")) << msg;
}

// The slice's items through the recipe, small and fast (a model of 64 wide, 2 layers).
LoadOptions slice_options(const std::vector<std::string>& more = {}) {
  LoadOptions lo;
  lo.overrides = {"plugins.0.path=" + kPluginDir, "plugins.1.path=" + kPluginDir, "plugins.2.path=" + kPluginDir,
                  "data.path=" + kSlice + "train.csv", "train.validation_data=" + kSlice + "train.csv",
                  "train.test_data=" + kSlice + "train.csv", "model.d_model=64", "model.d_ff=256",
                  "model.n_layers=2", "train.precision=f32"};
  lo.overrides.insert(lo.overrides.end(), more.begin(), more.end());
  return lo;
}

Experiment recipe(const std::vector<std::string>& more = {}) {
  Diagnostics diags;
  std::optional<Experiment> e = load_experiment(kRecipe, slice_options(more), &diags);
  EXPECT_TRUE(e) << diags.str();
  return e ? *e : Experiment{};
}

// A resolved config prints the head's labels and n_classes beside its tasks: the head, so
// written, loads again to the same classes.
TEST(MultitaskConfig, TheHeadAsAResolvedConfigPrintsItLoadsAgain) {
  const std::string yaml =
      "model:\n  d_model: 8\n  n_heads: 2\n  n_layers: 1\n  d_ff: 16\n"
      "  stem: {kind: features, n_features: 5}\n"
      "  head:\n    kind: classifier\n    n_classes: 3\n    labels: [x, y, z]\n    tasks:\n"
      "      - {name: a, plugin: image, labels: [x, y]}\n      - {name: b, plugin: text, labels: [z]}\n";
  const Experiment e = load(yaml, ".");
  EXPECT_EQ(e.model.head.labels, (std::vector<std::string>{"x", "y", "z"}));
  ASSERT_EQ(e.model.head.tasks.size(), 2u);
  EXPECT_EQ(e.model.head.tasks[1].first, 2);
  const std::string printed = to_yaml(e);
  EXPECT_TRUE(has(printed, "labels: [\"x\", \"y\", \"z\"]")) << printed;
  EXPECT_TRUE(has(printed, "tasks: [{name: \"a\", plugin: \"image\", labels: [\"x\", \"y\"]}, "
                           "{name: \"b\", plugin: \"text\", labels: [\"z\"]}]")) << printed;
}

TEST(MultitaskConfig, ATaskOfAPluginTheExperimentDoesNotHaveIsAnErrorAtItsPlace) {
  const std::string d = temp_dir("unknown_plugin");
  Experiment e = recipe({"train.max_steps=1"});
  e.model.head.tasks[2].plugin = "protein";
  Result<TrainSummary> r = train_experiment(e, train_options(d + "/run"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.status().message(), "model.head.tasks[2].plugin: task wordnet labels the items of plugin \"protein\", "
                                        "which is not one of the experiment's plugins (image, audio, text)"))
      << r.status().message();
}

// ---------------------------------------------------------------------------------------------
// Items

TEST(MultitaskItems, AnItemOfNoTasksPluginOrTwoTasksOrAnotherTasksLabelIsABadItem) {
  const std::string d = temp_dir("bad_items");
  // The slice's items, and four bad ones: a clip labelled with a garment, an image with a text
  // (two tasks), and, with the wordnet task's plugin renamed away, every text item.
  std::string csv = slurp(kSlice + "train.csv");
  std::string fixed;
  for (size_t at = 0; at < csv.size();) {  // paths from the slice folder, absolute
    const size_t end = csv.find('\n', at);
    std::string line = csv.substr(at, end - at);
    for (const std::string rel : {",fashion/", ",../spoken_digits/"}) {
      const size_t p = line.find(rel);
      if (p != std::string::npos) line.insert(p + 1, kSlice);
    }
    fixed += line + "\n";
    at = end + 1;
  }
  const std::string img = kSlice + "fashion/19432.pgm";
  const std::string wav = std::string(TESSERA_TEST_DATA) + "/spoken_digits/flac/espeak-en-us+m1/0-1.flac";
  fixed += "bad/clip-as-garment,," + wav + ",,Sandal\n";
  fixed += "bad/two-tasks," + img + ",,a caption,Sandal\n";
  write(d + "/items.csv", fixed);
  Experiment e = recipe({"data.path=" + d + "/items.csv", "train.validation_data=" + d + "/items.csv",
                         "train.max_steps=1", "train.batch_size=4"});
  e.train.test_data.clear();
  const TrainSummary s = train_ok(e, train_options(d + "/run"));
  EXPECT_EQ(s.bad_items, 2);
  EXPECT_EQ(s.best.counted, 70);
  // With the wordnet task moved to the audio plugin, a text has no task and a clip two tasks:
  // both are bad items of the evaluation; the 20 images and the image with a caption (image:
  // fashion; text: now no task's) count.
  EvalOptions eo;
  eo.data = d + "/items.csv";
  eo.weights = d + "/run/best.safetensors";
  e.model.head.tasks[2].plugin = "audio";
  Result<EvalReport> r = evaluate_experiment(e, eo);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->failed, 30 + 21);
  EXPECT_EQ(r->result.counted, 21);
  // Only the tasks the set has items of are reported.
  ASSERT_EQ(r->result.tasks.size(), 1u);
  EXPECT_EQ(r->result.tasks[0].name, "fashion");
  EXPECT_EQ(r->result.tasks[0].counted, 21);
}

// `tessera grad --item N`: one item's targets are its task's block, as training's.
TEST(MultitaskItems, OneItemsTargetsHoldItsTasksBlock) {
  const Experiment e = recipe();
  for (const auto& [index, first, end] : {std::tuple{0, 0, 10}, std::tuple{20, 10, 20}, std::tuple{40, 20, 65}}) {
    Result<ExperimentItem> it = experiment_item(e, index);
    ASSERT_TRUE(it.ok()) << it.status().message();
    ASSERT_TRUE(it->targets.label_blocks.defined()) << index;
    EXPECT_EQ(it->targets.label_blocks.data<int32_t>()[0], first) << index;
    EXPECT_EQ(it->targets.label_blocks.data<int32_t>()[1], end) << index;
    const int32_t y = it->targets.labels.data<int32_t>()[0];
    EXPECT_TRUE(y >= first && y < end) << index;
  }
}

// ---------------------------------------------------------------------------------------------
// The recipe on the slice: 20 Fashion-MNIST images (2 a class), 20 spoken digits (2 voices), 30
// WordNet glosses (6 of each of 5 lexicographer files), trained together for 200 steps and scored
// on the same items. Chance is 10 %, 10 % and 20 % (the 5 files present; the head has 45); each
// task must reach 70 %: a test that each task's rows reach the shared model through their own
// plugin and train their own head, not of generalisation (the held-out figures of the full data
// are in docs/TRAINING.md).
TEST(TrainQuality, MultitaskSliceLearnsEachTaskFarAboveChance) {
  const std::string d = temp_dir("quality");
  const Experiment e = recipe({"train.max_steps=200", "train.batch_size=16", "train.warmup_steps=10",
                               "train.lr=2e-3", "train.eval_every=200", "train.weight_decay=0",
                               "train.label_smoothing=0", "train.log_every=50",
                               "plugins.0.options.augment_crop_padding=0", "plugins.0.options.augment_flip=false",
                               "plugins.1.options.augment_time_masks=0", "plugins.1.options.augment_freq_masks=0"});
  const TrainSummary s = train_ok(e, train_options(d + "/run"));
  ASSERT_EQ(s.test.tasks.size(), 3u);
  for (const TaskEval& t : s.test.tasks)
    std::printf("[ multitask slice ] %-8s %lld training items: accuracy %.3f, loss %.3f\n", t.name.c_str(),
                static_cast<long long>(t.counted), t.accuracy, t.loss);
  std::printf("[ multitask slice ] %.1f s\n", s.seconds);
  EXPECT_EQ(s.test.tasks[0].name, "fashion");
  EXPECT_EQ(s.test.tasks[0].counted, 20);
  EXPECT_EQ(s.test.tasks[1].counted, 20);
  EXPECT_EQ(s.test.tasks[2].counted, 30);
  for (const TaskEval& t : s.test.tasks) EXPECT_GE(t.accuracy, 0.7) << t.name;
  // Each task's figures in metrics.jsonl, summary.json, report.md, and its own confusion matrix.
  const nlohmann::json sum = nlohmann::json::parse(slurp(d + "/run/summary.json"));
  for (const char* t : {"fashion", "digits", "wordnet"}) {
    EXPECT_TRUE(sum["test"]["tasks"].contains(t)) << t;
    EXPECT_TRUE(std::filesystem::exists(d + "/run/confusion_" + std::string(t) + ".png")) << t;
    EXPECT_TRUE(has(slurp(d + "/run/report.md"), "  - task " + std::string(t) + ": loss ")) << t;
  }
  bool logged = false;
  for (const nlohmann::json& j : metrics(d + "/run"))
    if (j.contains("eval")) logged = j["eval"]["tasks"]["wordnet"]["counted"] == 30;
  EXPECT_TRUE(logged);
  // A batch run's predictions name each item's task and list only its task's classes.
  Experiment run_exp = e;
  run_exp.task.kind = TaskKind::classify;
  run_exp.task.top_k = 3;
  run_exp.model.weights.file = d + "/run/best.safetensors";
  run_exp.model.weights.allow_missing = false;
  RunOptions ro;
  ro.out_dir = d + "/predict";
  ro.progress = false;
  Result<RunSummary> rs = run_experiment(run_exp, ro);
  ASSERT_TRUE(rs.ok()) << rs.status().message();
  std::ifstream f(d + "/predict/predictions.jsonl");
  std::string line;
  int seen = 0;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("top")) continue;
    const std::string id = j["id"], task = j.value("task", "");
    ASSERT_EQ(id.substr(0, id.find('/')), task) << line;
    double sum_p = 0;
    for (const nlohmann::json& top : j["top"]) {
      const int64_t k = top["index"];
      const int64_t first = task == "fashion" ? 0 : task == "digits" ? 10 : 20;
      EXPECT_TRUE(k >= first && k < first + (task == "wordnet" ? 45 : 10)) << line;
      sum_p += top["prob"].get<double>();
    }
    EXPECT_LE(sum_p, 1.0 + 1e-5);
    ++seen;
  }
  EXPECT_EQ(seen, 70);
}

}  // namespace
