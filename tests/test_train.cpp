// `tessera train`: a tiny byte-level LM and a tiny classifier that must actually learn, runs killed
// with SIGKILL and resumed to bit-identical weights, the refusals, the NaN stop and the CLI. Models
// are tiny (d_model 32, one layer) and runs short so that the suite stays well under a minute.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "tessera/checkpoint.h"
#include "tessera/config.h"
#include "tessera/model.h"
#include "tessera/parameters.h"
#include "tessera/safetensors.h"
#include "tessera/train.h"
#include "test_training.h"

using namespace tessera;
using nlohmann::json;
using namespace tessera::testing_train;
namespace fs = std::filesystem;

namespace {

const std::string kPluginDir = TESSERA_PLUGIN_BUILD_DIR;  // libtessera_text.so
const std::string kTessera = std::string(TESSERA_BINARY_DIR) + "/tessera";

std::string temp_dir(const std::string& name) { return testing_train::temp_dir("tessera_train", name); }

// Run folders of death tests: the re-executed child must compute the same name (no pid), and
// another build tree testing on the same machine must not share it.
std::string fixed_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "tessera_train_" + name + "_" +
                        std::to_string(std::hash<std::string>{}(TESSERA_BINARY_DIR));
  fs::create_directories(d);
  return d;
}


// The first `bytes` of the test corpus (whole lines), as a text file in `dir`: one item per line.
std::string corpus_file(const std::string& dir, size_t bytes) {
  std::ifstream f(std::string(TESSERA_TEST_DATA) + "/text/corpus.txt");
  std::string text, line;
  while (text.size() < bytes && std::getline(f, line)) text += line + "\n";
  write(dir + "/corpus.txt", text);
  return dir + "/corpus.txt";
}

// Texts whose class shows in their characters: alpha of a/b, beta of x/y, gamma of 0/1, written
// in an order that is not sorted by label. `extra` lines are appended as they are.
std::string classify_file(const std::string& dir, int per_class, const std::string& extra = "") {
  const std::vector<std::pair<std::string, std::string>> classes = {{"gamma", "01"}, {"alpha", "ab"}, {"beta", "xy"}};
  std::mt19937 rng(7);
  std::string text;
  for (int i = 0; i < per_class; ++i)
    for (const auto& [label, chars] : classes) {
      std::string t(static_cast<size_t>(6 + rng() % 14), ' ');
      for (char& ch : t) ch = chars[rng() % 2];
      text += json{{"text", t}, {"label", label}}.dump() + "\n";
    }
  write(dir + "/items.jsonl", text + extra);
  return dir + "/items.jsonl";
}

const std::string kPlugin = "plugins:\n  - name: text\n    path: " + kPluginDir + "\n    options: {tokenizer: bytes}\n";

std::string lm_yaml(const std::string& data, const std::string& train) {
  return kPlugin +
         "model:\n  arch: decoder\n  d_model: 32\n  n_heads: 2\n  n_layers: 1\n"
         "  stem: {kind: tokens, vocab_size: 259}\n  positions: {kind: learned, max_len: 64}\n"
         "  head: {kind: lm, tied: true}\n"
         "data:\n  path: " + data + "\ntrain: {" + train + "}\n";
}

std::string classify_yaml(const std::string& data, const std::string& train, const std::string& head = "") {
  return kPlugin +
         "model:\n  d_model: 32\n  n_heads: 2\n  n_layers: 1\n"
         "  stem: {kind: tokens, vocab_size: 259}\n  positions: {kind: learned, max_len: 64}\n"
         "  head: {kind: classifier, n_classes: 3, pool: mean" + head + "}\n"
         "data:\n  path: " + data + "\ntrain: {" + train + "}\n";
}


TrainOptions options(const std::string& out, bool resume = false) { return train_options(out, resume); }

// Every tensor of a safetensors file, name and bytes, in file order: what two weights files share
// when their metadata differ.
std::string tensor_data(const std::string& path) {
  Result<safetensors::File> f = safetensors::File::open(path);
  if (!f.ok()) return "";
  std::string out;
  for (const safetensors::TensorInfo& t : f->tensors()) {
    const Tensor v = f->get(t.name)->contiguous();
    out += t.name + ":" + std::string(static_cast<const char*>(v.raw_data()), v.nbytes());
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Learning

TEST(TrainLm, ByteLevelModelLearnsAndItsBestWeightsRun) {
  const std::string d = temp_dir("lm");
  const std::string data = corpus_file(d, 20000);
  const Experiment e = load(lm_yaml(data, "max_steps: 100, batch_size: 16, seq_len: 32, lr: 0.01, warmup_steps: 5, "
                                          "eval_every: 5, log_every: 10, validation: 0.1"),
                            d);
  const TrainSummary s = train_ok(e, options(d + "/run"));
  ASSERT_EQ(s.steps, 100);

  const std::vector<json> m = metrics(d + "/run");
  ASSERT_FALSE(m.empty());
  EXPECT_EQ(m[0].value("event", ""), "start");
  EXPECT_EQ(m[0].value("steps", 0), 100);
  std::vector<double> evals;
  int step_lines = 0;
  for (const json& j : m) {
    if (j.contains("loss")) {
      ++step_lines;
      EXPECT_TRUE(j.contains("lr") && j.contains("grad_norm")) << j.dump();
      EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
    }
    if (j.contains("eval")) evals.push_back(j["eval"]["bits_per_token"].get<double>());
  }
  EXPECT_EQ(step_lines, 10);
  ASSERT_EQ(evals.size(), 20u);
  // Uniform over 259 ids is 8.02 bits; English bytes are ~4.5 bits under a unigram model.
  EXPECT_LT(s.best.bits_per_token, 8.0);
  EXPECT_LT(s.best.bits_per_token, evals[0] - 1.0) << "first evaluation " << evals[0];
  EXPECT_LT(evals.back(), 5.0);
  EXPECT_GT(s.best.counted, 1000);  // ~2 KB held out
  std::printf("[ lm ] bits/token: first eval (step 5) %.3f, best (step %lld) %.3f, last %.3f; %.1f s\n", evals[0],
              static_cast<long long>(s.best_step), s.best.bits_per_token, evals.back(), s.seconds);

  // best.safetensors as model.weights.file: it builds, and predicts the text better than chance.
  const std::string yaml = lm_yaml(data, "") + "";
  Diagnostics diags;
  LoadOptions lo;
  lo.overrides = {"model.weights.file=" + d + "/run/best.safetensors"};
  std::optional<Experiment> b = load_experiment_from_string(yaml, "best.yaml", d, lo, &diags);
  ASSERT_TRUE(b) << diags.str();
  Result<Parameters> p = Parameters::resolve(b->model);
  ASSERT_TRUE(p.ok()) << p.status().message();
  Result<Model> model = Model::build(b->model, *p);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const std::string text = "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt";
  std::vector<int32_t> ids(text.begin(), text.end());
  Outputs out;
  ASSERT_TRUE(model->forward(Batch::from_ids(ids), {}, &out).ok());
  ASSERT_EQ(out.logits.shape(), Shape({1, static_cast<int64_t>(ids.size()), 259}));
  double nats = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* z = out.logits.data<float>() + t * 259;
    double mx = z[0], sum = 0;
    for (int v = 1; v < 259; ++v) mx = std::max(mx, static_cast<double>(z[v]));
    for (int v = 0; v < 259; ++v) sum += std::exp(z[v] - mx);
    nats += std::log(sum) + mx - z[ids[t + 1]];
  }
  const double bits = nats / static_cast<double>(ids.size() - 1) / std::log(2.0);
  EXPECT_LT(bits, 6.0);
  std::printf("[ lm ] best.safetensors on an unseen sentence: %.3f bits/token\n", bits);

  // tessera eval on the same held-out text with the best weights gives the best evaluation; on
  // ASCII bytes a character is a token.
  EvalOptions eo;
  eo.weights = d + "/run/best.safetensors";
  Result<EvalReport> rep = evaluate_experiment(e, eo);
  ASSERT_TRUE(rep.ok()) << rep.status().message();
  EXPECT_EQ(rep->result.counted, s.best.counted);
  EXPECT_EQ(rep->result.bits_per_token, s.best.bits_per_token);
  EXPECT_EQ(rep->result.characters, rep->result.counted);
  EXPECT_DOUBLE_EQ(rep->result.bits_per_character, rep->result.bits_per_token);
  EXPECT_TRUE(has(rep->set, "the last 10 % of the text of")) << rep->set;
  EXPECT_TRUE(fs::exists(d + "/run/loss.png") && fs::exists(d + "/run/metric.png"));
  EXPECT_FALSE(fs::exists(d + "/run/confusion.png"));
  EXPECT_TRUE(has(slurp(d + "/run/report.md"), " bits per token (")) << slurp(d + "/run/report.md");
}

TEST(TrainClassify, EasyClassesReachHighAccuracyWithSortedClassNames) {
  const std::string d = temp_dir("classify");
  const std::string data = classify_file(d, 60);
  const Experiment e =
      load(classify_yaml(data, "epochs: 4, batch_size: 16, lr: 0.01, validation: 0.2, log_every: 5"), d);
  const TrainSummary s = train_ok(e, options(d + "/run"));
  EXPECT_EQ(s.classes, (std::vector<std::string>{"alpha", "beta", "gamma"}));
  EXPECT_EQ(s.examples, 144);  // 180 items, 36 held out
  EXPECT_EQ(s.steps, 4 * 9);
  EXPECT_EQ(s.best.counted, 36);
  EXPECT_GE(s.best.accuracy, 0.9);
  EXPECT_GE(s.best.macro_f1, 0.85);
  std::printf("[ classify ] accuracy %.3f, macro-F1 %.3f at step %lld; %.1f s\n", s.best.accuracy, s.best.macro_f1,
              static_cast<long long>(s.best_step), s.seconds);
  const json summary = json::parse(slurp(d + "/run/summary.json"));
  EXPECT_EQ(summary["classes"], json({"alpha", "beta", "gamma"}));
  EXPECT_EQ(summary["best"]["accuracy"].get<double>(), s.best.accuracy);

  // The run folder's pictures and report: PNG files of plausible size, the per-class table.
  for (const char* png : {"loss.png", "metric.png", "confusion.png"}) {
    const std::string bytes = slurp(d + "/run/" + png);
    ASSERT_GT(bytes.size(), 1000u) << png;
    EXPECT_EQ(bytes.substr(1, 3), "PNG") << png;
  }
  const std::string report = slurp(d + "/run/report.md");
  EXPECT_TRUE(has(report, "- best validation (step ")) << report;
  EXPECT_TRUE(has(report, "| class | precision | recall | F1 | support |\n|---|---|---|---|---|\n| alpha | ")) << report;
  EXPECT_TRUE(has(report, "![confusion matrix](confusion.png)")) << report;

  // tessera eval with the best weights holds out the same items and scores them the same.
  EvalOptions eo;
  eo.weights = d + "/run/best.safetensors";
  Result<EvalReport> rep = evaluate_experiment(e, eo);
  ASSERT_TRUE(rep.ok()) << rep.status().message();
  EXPECT_EQ(rep->classes, s.classes);
  EXPECT_EQ(rep->result.counted, 36);
  EXPECT_EQ(rep->result.accuracy, s.best.accuracy);
  EXPECT_EQ(rep->result.macro_f1, s.best.macro_f1);
  EXPECT_EQ(rep->result.loss, s.best.loss);
  EXPECT_EQ(rep->result.bits_per_character, -1);
  // The whole file as --data: every item counted.
  eo.data = data;
  rep = evaluate_experiment(e, eo);
  ASSERT_TRUE(rep.ok()) << rep.status().message();
  EXPECT_EQ(rep->result.counted, 180);
  eo.data.clear();
  eo.test = true;
  rep = evaluate_experiment(e, eo);
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().message(), "eval: --test, but the experiment has no train.test_data");
  eo.test = false;
  eo.weights = d + "/run/missing.safetensors";
  rep = evaluate_experiment(e, eo);
  ASSERT_FALSE(rep.ok());
  EXPECT_TRUE(has(rep.status().message(), "eval: --weights " + d + "/run/missing.safetensors: ")) << rep.status().message();
}

TEST(TrainClassify, ALabelOutsideTheNamedClassesIsABadItem) {
  const std::string d = temp_dir("badlabel");
  const std::string data = classify_file(d, 20, "{\"text\": \"abab\", \"label\": \"delta\"}\n");
  // Named classes: the unknown label is a bad item, and training goes on.
  const Experiment e = load(classify_yaml(data, "max_steps: 3, batch_size: 8, validation: 0.1",
                                          ", labels: [gamma, alpha, beta]"),
                            d);
  TrainOptions o = options(d + "/run");
  o.progress = true;  // the bad item is reported on stderr
  ::testing::internal::CaptureStderr();
  Result<TrainSummary> r = train_experiment(e, o);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->classes, (std::vector<std::string>{"gamma", "alpha", "beta"}));  // as named, not sorted
  EXPECT_EQ(r->examples, 54);  // the 60 good items, 6 held out
  EXPECT_TRUE(has(err, "1 item(s) could not be read: items.jsonl:61: label \"delta\" is not one of the 3 classes"))
      << err;
  // Unnamed classes: the fourth label makes the data disagree with n_classes.
  const Experiment unnamed = load(classify_yaml(data, "max_steps: 3, batch_size: 8"), d);
  Result<TrainSummary> refused = train_experiment(unnamed, options(d + "/unnamed"));
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(has(refused.status().message(), "the data has 4 classes but model.head.n_classes is 3"))
      << refused.status().message();
}

// ---------------------------------------------------------------------------------------------
// Resume

namespace {

// Every step line of a run's metrics.jsonl (step -> loss), eval lines (steps), and start lines.
struct Lines {
  std::map<int64_t, double> loss;
  std::vector<int64_t> steps, evals;
  int starts = 0;
};
Lines lines_of(const std::string& run) {
  Lines l;
  for (const json& j : metrics(run)) {
    if (j.value("event", "") == "start") ++l.starts;
    if (j.contains("eval")) l.evals.push_back(j["step"].get<int64_t>());
    if (j.contains("loss")) {
      l.steps.push_back(j["step"].get<int64_t>());
      l.loss[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
  }
  return l;
}

// A run of 12 steps (a checkpoint every 3) killed with SIGKILL after step 4 (last checkpoint 3),
// resumed and killed after step 7 (checkpoint 6), resumed and killed right after checkpoint 9,
// then resumed to the end: its final weights, optimizer state and best weights must equal an
// uninterrupted run's byte for byte, and its metrics.jsonl must hold every step once with the
// same losses. Each kill happens in a re-executed child (a "threadsafe" death test); nothing
// before the first EXPECT_EXIT touches the run folder, so each child finds what the last left.
void kill_resume_compare(const std::string& name, const std::function<Experiment(const std::string&)>& make) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string d = fixed_dir(name);
  const std::string run = d + "/killed";
  auto killed_at = [&](int64_t at, bool resume) {
    if (!resume) fs::remove_all(run);
    const Experiment e = make(d);
    TrainOptions o = options(run, resume);
    o.on_step = [at](int64_t step) {
      if (step == at) raise(SIGKILL);
    };
    (void)train_experiment(e, o);
    std::_Exit(0);
  };
  EXPECT_EXIT(killed_at(4, false), ::testing::KilledBySignal(SIGKILL), "");
  EXPECT_EQ(slurp(run + "/checkpoints/latest"), "step-000003\n");
  EXPECT_EXIT(killed_at(7, true), ::testing::KilledBySignal(SIGKILL), "");
  EXPECT_EQ(slurp(run + "/checkpoints/latest"), "step-000006\n");
  EXPECT_EXIT(killed_at(9, true), ::testing::KilledBySignal(SIGKILL), "");
  EXPECT_EQ(slurp(run + "/checkpoints/latest"), "step-000009\n");

  const Experiment e = make(d);
  const TrainSummary resumed = train_ok(e, options(run, true));
  EXPECT_EQ(resumed.steps, 12);
  EXPECT_EQ(resumed.steps_resumed, 9);
  fs::remove_all(d + "/straight");
  const TrainSummary straight = train_ok(e, options(d + "/straight"));
  EXPECT_EQ(straight.steps, 12);
  EXPECT_EQ(resumed.best_step, straight.best_step);
  EXPECT_EQ(resumed.best.loss, straight.best.loss);
  EXPECT_EQ(resumed.last_loss, straight.last_loss);
  for (const std::string f : {"checkpoints/step-000012/weights.safetensors",
                              "checkpoints/step-000012/optimizer.safetensors", "best.safetensors"}) {
    const std::string a = slurp(run + "/" + f), b = slurp(d + "/straight/" + f);
    EXPECT_FALSE(a.empty()) << f;
    EXPECT_TRUE(a == b) << f << " differs";
  }
  const Lines k = lines_of(run), s = lines_of(d + "/straight");
  EXPECT_EQ(k.starts, 1);
  EXPECT_EQ(k.steps, s.steps);  // each logged step once, in order
  EXPECT_EQ(k.evals, (std::vector<int64_t>{3, 6, 9, 12}));
  EXPECT_EQ(k.loss, s.loss);  // the same training losses, step for step
}

}  // namespace

TEST(TrainResume, LmKilledThreeTimesIsBitIdentical) {
  kill_resume_compare("resume_lm", [](const std::string& d) {
    const std::string data = corpus_file(d, 6000);
    return load(lm_yaml(data, "max_steps: 12, batch_size: 8, accumulate: 2, seq_len: 32, lr: 0.01, eval_every: 3, "
                              "log_every: 1"),
                d);
  });
}

TEST(TrainResume, MaskedLmKilledThreeTimesIsBitIdentical) {
  // Each step's masks are drawn from (seed, step, example): a resumed run masks what the
  // uninterrupted one masked, and its held-out masks are the same at every evaluation.
  kill_resume_compare("resume_mlm", [](const std::string& d) {
    const std::string yaml =
        "plugins:\n  - name: text\n    path: " + kPluginDir +
        "\n    options: {tokenizer: bytes, max_length: 32, length_policy: truncate}\n"
        "model:\n  d_model: 16\n  n_heads: 2\n  n_layers: 1\n  d_ff: 32\n"
        "  stem: {kind: tokens, vocab_size: 260}\n  positions: {kind: learned, max_len: 32}\n"
        "  head: {kind: lm, tied: true}\n"
        "data:\n  path: " + std::string(TESSERA_TEST_DATA) + "/kjv/ruth_jonah.txt\n  limit: 120\n"
        "train: {objective: mlm, mask_id: 259, max_steps: 12, batch_size: 8, accumulate: 2, lr: 0.01, eval_every: 3, "
        "log_every: 1, validation: 0.2}\n";
    return load(yaml, d);
  });
}

TEST(TrainResume, ClassifyWithAccumulationKilledThreeTimesIsBitIdentical) {
  // log_every 2 does not divide the checkpoint interval: the averaged loss lines must still agree.
  kill_resume_compare("resume_classify", [](const std::string& d) {
    const std::string data = classify_file(d, 10);
    return load(classify_yaml(data, "max_steps: 12, batch_size: 8, accumulate: 2, lr: 0.01, eval_every: 3, "
                                    "log_every: 2, validation: 0.2"),
                d);
  });
}

// Dropout at every site (train.dropout): the masks are keyed by (seed, step, micro-batch, layer,
// site), so a killed run draws on resuming what the uninterrupted run drew.
TEST(TrainResume, DropoutKilledThreeTimesIsBitIdentical) {
  kill_resume_compare("resume_dropout", [](const std::string& d) {
    const std::string data = corpus_file(d, 6000);
    return load(lm_yaml(data, "max_steps: 12, batch_size: 8, accumulate: 2, seq_len: 32, lr: 0.01, eval_every: 3, "
                              "log_every: 1, dropout: {embedding: 0.1, attention: 0.2, residual: 0.3}"),
                d);
  });
}

// Mixed precision (train.precision: bf16): the rounding is a function of the weights and the
// batch alone, and the bf16 copies of the weights are made from the f32 master weights after each
// update, so a killed bf16 run resumes to the same bits as well.
TEST(TrainResume, Bf16LmKilledThreeTimesIsBitIdentical) {
  kill_resume_compare("resume_lm_bf16", [](const std::string& d) {
    const std::string data = corpus_file(d, 6000);
    return load(lm_yaml(data, "max_steps: 12, batch_size: 8, accumulate: 2, seq_len: 32, lr: 0.01, eval_every: 3, "
                              "log_every: 1, precision: bf16"),
                d);
  });
}

// Dropout acts in training's forward and backward only: the trainer's evaluations and
// `tessera eval` score the same weights to the same figures with and without train.dropout.
TEST(TrainDropout, ChangesTheTrainingLossButNeverAnEvaluation) {
  const std::string d = temp_dir("dropout_eval");
  const std::string data = classify_file(d, 10);
  // lr 1e-30: every update moves a weight by about 1e-30 (AdamW's steps are about lr), far below
  // an ulp of any activation it is added to, so both runs' evaluations compute the same figures
  // from (nearly) the initial weights, while their training losses show the dropout.
  auto exp = [&](bool dropout) {
    return load(classify_yaml(data, std::string("max_steps: 6, batch_size: 8, lr: 1e-30, eval_every: 3, log_every: 1, "
                                                "validation: 0.2") +
                                        (dropout ? ", dropout: {embedding: 0.2, attention: 0.2, residual: 0.2}" : "")),
                d);
  };
  const TrainSummary plain = train_ok(exp(false), options(d + "/plain"));
  const TrainSummary dropped = train_ok(exp(true), options(d + "/dropout"));
  const Lines p = lines_of(d + "/plain"), q = lines_of(d + "/dropout");
  ASSERT_EQ(p.steps, q.steps);
  for (int64_t step : p.steps) EXPECT_NE(p.loss.at(step), q.loss.at(step)) << "step " << step;
  // The evaluations (metrics.jsonl's eval lines and the summary's best) are the same figures.
  std::vector<json> pe, qe;
  for (const json& j : metrics(d + "/plain"))
    if (j.contains("eval")) pe.push_back(j["eval"]);
  for (const json& j : metrics(d + "/dropout"))
    if (j.contains("eval")) qe.push_back(j["eval"]);
  ASSERT_EQ(pe.size(), 2u);
  EXPECT_EQ(pe, qe);
  EXPECT_EQ(plain.best.loss, dropped.best.loss);
  EXPECT_EQ(plain.best.accuracy, dropped.best.accuracy);
  // tessera eval on one weights file, with and without train.dropout.
  EvalOptions eo;
  eo.weights = d + "/dropout/checkpoints/step-000006/weights.safetensors";
  Result<EvalReport> with = evaluate_experiment(exp(true), eo), without = evaluate_experiment(exp(false), eo);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(with->result.loss, without->result.loss);
  EXPECT_EQ(with->result.accuracy, without->result.accuracy);
  EXPECT_EQ(with->result.confusion, without->result.confusion);
}

TEST(TrainResume, Bf16ClassifyWithAccumulationKilledThreeTimesIsBitIdentical) {
  kill_resume_compare("resume_classify_bf16", [](const std::string& d) {
    const std::string data = classify_file(d, 10);
    return load(classify_yaml(data, "max_steps: 12, batch_size: 8, accumulate: 2, lr: 0.01, eval_every: 3, "
                                    "log_every: 2, validation: 0.2, precision: bf16"),
                d);
  });
}

// The slice's test accuracy that the recipe must reach (TrainRecipes below): measured 0.666
// (macro-F1 0.674) with the committed settings (7 x 7 patches since 2026-12-05; 0.580 with 4 x 4),
// on AMX and under ONEDNN_MAX_CPU_ISA=AVX2 alike; held at 0.40, well above chance (0.10) and the
// largest class's share.
constexpr double kFashionSliceAccuracy = 0.40;

// Fashion-MNIST images through the image plugin with its augmentation (shifted crops, mirrors):
// the draws are a function of (seed, step, example), so a killed run resumes to the same bits.
Experiment augmented_images(const std::string& d, bool augment) {
  const std::string fm = std::string(TESSERA_TEST_DATA) + "/image/fashion-mnist/";
  const std::string yaml =
      "plugins:\n  - name: image\n    path: " + kPluginDir +
      "\n    options: {image_size: 28, patch_size: 7, grey: true, mean: 0.286, std: 0.353, picture_size: 0" +
      (augment ? ", augment_crop_padding: 3, augment_flip: true" : "") +
      "}\n"
      "model:\n  d_model: 16\n  n_heads: 2\n  n_layers: 1\n  d_ff: 32\n"
      "  stem: {kind: features, n_features: 49, cls: true}\n  positions: {kind: learned, max_len: 17}\n"
      "  head: {kind: classifier, n_classes: 10, pool: cls}\n"
      "data:\n  path: " + fm + "t10k-images-idx3-ubyte.gz\n  labels: " + fm + "t10k-labels-idx1-ubyte.gz\n"
      "train: {max_steps: 12, batch_size: 8, lr: 0.003, eval_every: 3, log_every: 1, validation: 0.25}\n";
  return load(yaml, d);
}

TEST(TrainResume, AugmentedImagesKilledThreeTimesAreBitIdentical) {
  kill_resume_compare("resume_augment", [](const std::string& d) { return augmented_images(d, true); });
}

TEST(TrainAugment, ChangesTheTrainingButNotTheHeldOutSet) {
  const std::string d = temp_dir("augment");
  const TrainSummary plain = train_ok(augmented_images(d, false), options(d + "/plain"));
  const TrainSummary aug = train_ok(augmented_images(d, true), options(d + "/aug"));
  EXPECT_EQ(plain.best.counted, 16);
  EXPECT_EQ(aug.best.counted, 16);
  EXPECT_NE(plain.last_loss, aug.last_loss);
  EXPECT_NE(tensor_data(d + "/plain/checkpoints/step-000012/weights.safetensors"),
            tensor_data(d + "/aug/checkpoints/step-000012/weights.safetensors"));
  // The held-out images are not augmented: the augmented run's weights score them as a model
  // without augmentation options does.
  EvalOptions eo;
  eo.weights = d + "/aug/checkpoints/step-000012/weights.safetensors";
  Result<EvalReport> with = evaluate_experiment(augmented_images(d, true), eo);
  Result<EvalReport> without = evaluate_experiment(augmented_images(d, false), eo);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(with->result.loss, without->result.loss);
}

// The Fashion-MNIST recipe (configs/train/fashion_mnist_vit.yaml, as it is, augmentation
// included) on a committed slice: 1,000 training images, 500 test images, a narrower and
// shallower model and 120 steps. The test images' accuracy must be far above chance (10 %); the
// margin was measured (docs/TRAINING.md) and holds under ONEDNN_MAX_CPU_ISA=AVX2 too.
TEST(TrainRecipes, FashionMnistVitOnASliceIsFarAboveChance) {
  const std::string d = temp_dir("fm_slice");
  const std::string slice = std::string(TESSERA_TEST_DATA) + "/image/fashion-mnist-slice/";
  LoadOptions lo;
  lo.overrides = {"plugins.0.path=" + kPluginDir,
                  "data.path=" + slice + "train-images-idx3-ubyte.gz",
                  "data.labels=" + slice + "train-labels-idx1-ubyte.gz",
                  "train.test_data=" + slice + "t10k-images-idx3-ubyte.gz",
                  "train.test_labels=" + slice + "t10k-labels-idx1-ubyte.gz",
                  "model.d_model=64", "model.d_ff=128", "model.n_layers=2",
                  "train.max_steps=120", "train.batch_size=50", "train.warmup_steps=10",
                  "train.eval_every=40", "train.validation=0.1", "train.log_every=20"};
  Diagnostics diags;
  std::optional<Experiment> e =
      load_experiment(std::string(TESSERA_SOURCE_DIR) + "/configs/train/fashion_mnist_vit.yaml", lo, &diags);
  ASSERT_TRUE(e) << diags.str();
  const TrainSummary s = train_ok(*e, options(d + "/run"));
  EXPECT_EQ(s.examples, 900);
  EXPECT_EQ(s.test.counted, 500);
  std::printf("[ fashion-mnist slice ] validation %.3f (step %lld), test %.3f, macro-F1 %.3f; %.1f s\n",
              s.best.accuracy, static_cast<long long>(s.best_step), s.test.accuracy, s.test.macro_f1, s.seconds);
  EXPECT_GE(s.test.accuracy, kFashionSliceAccuracy);
  EXPECT_GE(s.test.macro_f1, kFashionSliceAccuracy - 0.05);
}

// The same slice recipe with bf16 matmuls (train.precision: bf16): it must learn as the f32 run
// does, its test accuracy within kBf16SliceMargin of f32's on the same data, steps and seed (and
// above the f32 bar). Measured: docs/TRAINING.md ("Mixed precision").
constexpr double kBf16SliceMargin = 0.05;

TEST(TrainRecipes, FashionMnistVitOnASliceLearnsInBf16AsInF32) {
  const std::string d = temp_dir("fm_slice_bf16");
  const std::string slice = std::string(TESSERA_TEST_DATA) + "/image/fashion-mnist-slice/";
  auto run = [&](const std::string& precision) {
    LoadOptions lo;
    lo.overrides = {"plugins.0.path=" + kPluginDir,
                    "data.path=" + slice + "train-images-idx3-ubyte.gz",
                    "data.labels=" + slice + "train-labels-idx1-ubyte.gz",
                    "train.test_data=" + slice + "t10k-images-idx3-ubyte.gz",
                    "train.test_labels=" + slice + "t10k-labels-idx1-ubyte.gz",
                    "model.d_model=64", "model.d_ff=128", "model.n_layers=2",
                    "train.max_steps=120", "train.batch_size=50", "train.warmup_steps=10",
                    "train.eval_every=40", "train.validation=0.1", "train.log_every=20",
                    "train.precision=" + precision};
    Diagnostics diags;
    std::optional<Experiment> e =
        load_experiment(std::string(TESSERA_SOURCE_DIR) + "/configs/train/fashion_mnist_vit.yaml", lo, &diags);
    EXPECT_TRUE(e) << diags.str();
    return e ? train_ok(*e, options(d + "/" + precision)) : TrainSummary{};
  };
  const TrainSummary f32 = run("f32"), bf16 = run("bf16");
  std::printf("[ fashion-mnist slice ] test accuracy f32 %.3f (%.1f s), bf16 %.3f (%.1f s); training loss at the "
              "end f32 %.4f, bf16 %.4f\n",
              f32.test.accuracy, f32.seconds, bf16.test.accuracy, bf16.seconds, f32.last_loss, bf16.last_loss);
  EXPECT_EQ(bf16.test.counted, 500);
  EXPECT_GE(bf16.test.accuracy, kFashionSliceAccuracy);
  EXPECT_GE(bf16.test.accuracy, f32.test.accuracy - kBf16SliceMargin);
  // The loss falls: the first logged step's against the last's.
  const Lines l = lines_of(d + "/bf16");
  ASSERT_GE(l.loss.size(), 2u);
  EXPECT_LT(l.loss.rbegin()->second, 0.8 * l.loss.begin()->second);
  // Not f32 under another name: the weights differ.
  EXPECT_NE(tensor_data(d + "/f32/best.safetensors"), tensor_data(d + "/bf16/best.safetensors"));
}

// ---------------------------------------------------------------------------------------------
// Refusals

TEST(TrainRefuses, ResumeUnderAnotherPrecisionNamesBothHashes) {
  const std::string d = temp_dir("precision");
  const std::string data = classify_file(d, 10);
  const Experiment a = load(classify_yaml(data, "batch_size: 8, eval_every: 2, max_steps: 2"), d),
                   b = load(classify_yaml(data, "batch_size: 8, eval_every: 2, max_steps: 2, precision: bf16"), d);
  train_ok(a, options(d + "/a"));
  train_ok(b, options(d + "/b"));
  const std::string hash_a = metrics(d + "/a")[0]["config_hash"], hash_b = metrics(d + "/b")[0]["config_hash"];
  ASSERT_NE(hash_a, hash_b);
  Result<TrainSummary> r = train_experiment(b, options(d + "/a", true));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.status().message(), "the run was started with config " + hash_a + ", this config is " + hash_b))
      << r.status().message();
  // The checkpoint holds the f32 master weights.
  Result<safetensors::File> w = safetensors::File::open(d + "/b/checkpoints/step-000002/weights.safetensors");
  ASSERT_TRUE(w.ok()) << w.status().message();
  for (const safetensors::TensorInfo& t : w->tensors()) EXPECT_EQ(w->get(t.name)->dtype(), DType::f32) << t.name;
}

TEST(TrainRefuses, APrecisionOtherThanF32OrBf16IsAConfigErrorWithItsPlace) {
  const std::string d = temp_dir("precision_value");
  const std::string data = classify_file(d, 2);
  for (const auto& [value, found] : std::vector<std::pair<std::string, std::string>>{
           {"f16", "found f16"}, {"fp32", "found fp32"}, {"[bf16]", "expected"}, {"16", "found 16"}}) {
    Diagnostics diags;
    EXPECT_FALSE(try_load(classify_yaml(data, "precision: " + value), d, &diags)) << value;
    const std::string err = diags.str();
    // classify_yaml puts train on line 14: "train: {precision: ..." with the value at column 20.
    EXPECT_TRUE(has(err, "exp.yaml:14:20: train.precision: ")) << err;
    EXPECT_TRUE(has(err, found)) << err;
    if (value != "[bf16]") {
      EXPECT_TRUE(has(err, "expected one of f32, bf16")) << err;
    }
  }
  Diagnostics diags;
  const std::optional<Experiment> ok = try_load(classify_yaml(data, "precision: bf16"), d, &diags);
  ASSERT_TRUE(ok) << diags.str();
  EXPECT_EQ(ok->train.precision, DType::bf16);
  EXPECT_EQ(load(classify_yaml(data, "max_steps: 2"), d).train.precision, DType::f32);  // the default
}

TEST(TrainRefuses, ResumeWithAChangedConfigNamesBothHashes) {
  const std::string d = temp_dir("changed");
  const std::string data = classify_file(d, 10);
  const std::string train = "batch_size: 8, eval_every: 2, lr: ";
  const Experiment a = load(classify_yaml(data, train + "0.01, max_steps: 2"), d),
                   b = load(classify_yaml(data, train + "0.02, max_steps: 2"), d);
  train_ok(a, options(d + "/a"));
  train_ok(b, options(d + "/b"));  // only for the hash its config has
  const std::string hash_a = metrics(d + "/a")[0]["config_hash"], hash_b = metrics(d + "/b")[0]["config_hash"];
  ASSERT_NE(hash_a, hash_b);
  Result<TrainSummary> r = train_experiment(b, options(d + "/a", true));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.status().message(), "the run was started with config " + hash_a + ", this config is " + hash_b))
      << r.status().message();
  // More steps and another log interval are no change: the run continues.
  const Experiment longer = load(classify_yaml(data, train + "0.01, max_steps: 4, log_every: 1"), d);
  const TrainSummary s = train_ok(longer, options(d + "/a", true));
  EXPECT_EQ(s.steps, 4);
  EXPECT_EQ(s.steps_resumed, 2);
}

TEST(TrainRefuses, AFolderHoldingARunWithoutResumeOrForce) {
  const std::string d = temp_dir("again");
  const Experiment e = load(classify_yaml(classify_file(d, 10), "max_steps: 2, batch_size: 8"), d);
  train_ok(e, options(d + "/run"));
  Result<TrainSummary> r = train_experiment(e, options(d + "/run"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.status().message(), "already holds a training run: pass --resume to continue it, or --force"))
      << r.status().message();
  TrainOptions force = options(d + "/run");
  force.force = true;
  const TrainSummary s = train_ok(e, force);
  EXPECT_EQ(s.steps_resumed, 0);
  const Lines l = lines_of(d + "/run");
  EXPECT_EQ(l.starts, 1);  // the old run's metrics are gone
  EXPECT_EQ(l.steps, (std::vector<int64_t>{2}));
}

TEST(TrainRefuses, AModelWithoutAClassifierOrLmHead) {
  const std::string d = temp_dir("nohead");
  std::string yaml = classify_yaml(classify_file(d, 5), "max_steps: 2");
  yaml.replace(yaml.find("kind: classifier, n_classes: 3, "), std::string("kind: classifier, n_classes: 3, ").size(),
               "kind: pool, ");
  const Experiment e = load(yaml, d);
  Result<TrainSummary> r = train_experiment(e, options(d + "/run"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.status().message(), "the model has neither a classifier nor an LM head (model.head.kind is pool)"))
      << r.status().message();
  EXPECT_FALSE(fs::exists(d + "/run/checkpoints"));
}

TEST(TrainRefuses, AccumulateNotDividingTheBatchIsAConfigError) {
  const std::string d = temp_dir("accumulate");
  Diagnostics diags;
  EXPECT_FALSE(try_load(classify_yaml(d + "/none.jsonl", "batch_size: 10, accumulate: 4"), d, &diags));
  EXPECT_TRUE(has(diags.str(), "train.accumulate: batch_size 10 does not divide into 4 micro-batches")) << diags.str();
}

// ---------------------------------------------------------------------------------------------
// train.max_minutes: a wall-clock budget settles the step count after timing the first steps.

namespace {

// The budget's line in metrics.jsonl (event "budget"), or null.
json budget_line(const std::string& run) {
  for (const json& j : metrics(run))
    if (j.value("event", "") == "budget") return j;
  return nullptr;
}

// Every tensor of the run's final checkpoint (weights and AdamW's state) and its best weights.
std::string final_state(const std::string& run, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(step));
  const std::string ck = run + "/checkpoints/" + name;
  return tensor_data(ck + "/weights.safetensors") + tensor_data(ck + "/optimizer.safetensors") +
         tensor_data(run + "/best.safetensors");
}

// The budget runs below, and their twins: the same run given the settled count as max_steps.
const std::string kBudgetRun = "batch_size: 8, seq_len: 32, lr: 0.01, warmup_steps: 10, eval_every: 12, log_every: 1";
const std::string kBudgetTrain = "max_steps: 1000000, max_minutes: 0.04, " + kBudgetRun;
std::string fixed_twin(int64_t n) { return "max_steps: " + std::to_string(n) + ", " + kBudgetRun; }

}  // namespace

// A 2.4 s budget on a model whose step takes milliseconds: the step count is settled once, after
// the warmup's timed steps (step 11 with 10 warmup steps), to what fits; the run stops there, and
// its weights and optimizer state are bit for bit those of a run told that many steps outright
// (the timed steps' learning rates do not depend on the count, and the timing evaluation changes
// nothing).
TEST(TrainBudget, SettlesAStepCountAndEqualsTheRunGivenThatCount) {
  const std::string d = temp_dir("budget");
  const std::string data = corpus_file(d, 6000);
  const Experiment e = load(lm_yaml(data, kBudgetTrain), d);
  const TrainSummary s = train_ok(e, options(d + "/budget"));
  const json b = budget_line(d + "/budget");
  ASSERT_TRUE(b.is_object()) << "no budget line in metrics.jsonl";
  EXPECT_EQ(b["step"].get<int64_t>(), 11);
  const int64_t n = b["steps"].get<int64_t>();
  EXPECT_EQ(s.steps, n);
  EXPECT_GT(n, 11);
  EXPECT_LT(n, 1000000);  // the budget, not max_steps, ended it
  EXPECT_GT(b["step_seconds"].get<double>(), 0);
  EXPECT_GT(b["eval_seconds"].get<double>(), 0);
  EXPECT_EQ(s.budget_minutes, 0.04);
  EXPECT_TRUE(has(slurp(d + "/budget/report.md"),
                  "- " + std::to_string(n) + " steps (what a budget of 0.04 minutes held, train.max_minutes)"));
  // What it settled fits the budget at the speed it measured. (Whether the run then keeps to it
  // depends on the machine staying as idle as it was while timing: no test of that here, where
  // other suites share the cores.)
  const double step_s = b["step_seconds"].get<double>(), eval_s = b["eval_seconds"].get<double>();
  EXPECT_LE(static_cast<double>(n - 11) * step_s + static_cast<double>(n / 12) * eval_s, 0.04 * 60) << n << " steps";
  EXPECT_GT(static_cast<double>(n - 11 + 2) * step_s + static_cast<double>(n / 12 + 2) * eval_s, 0.5 * 0.04 * 60)
      << n << " steps: less than half the budget used";

  const Experiment fixed = load(lm_yaml(data, fixed_twin(n)), d);
  const TrainSummary f = train_ok(fixed, options(d + "/fixed"));
  EXPECT_EQ(f.steps, n);
  EXPECT_FALSE(budget_line(d + "/fixed").is_object());
  EXPECT_EQ(f.last_loss, s.last_loss);
  EXPECT_TRUE(final_state(d + "/budget", n) == final_state(d + "/fixed", n)) << "the weights differ";
}

// Killed after its first checkpoint past the settling, the run resumes to the step count it
// settled (kept in the checkpoint, not timed again) and ends bit for bit where a run given that
// count outright ends.
TEST(TrainBudget, AKilledRunResumesToItsSettledCount) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string d = fixed_dir("budget_resume");
  const std::string run = d + "/killed";
  auto killed_at = [&](int64_t at) {
    fs::remove_all(run);
    const Experiment e = load(lm_yaml(corpus_file(d, 6000), kBudgetTrain), d);
    TrainOptions o = options(run);
    o.on_step = [at](int64_t step) {
      if (step == at) raise(SIGKILL);
    };
    (void)train_experiment(e, o);
    std::_Exit(0);
  };
  EXPECT_EXIT(killed_at(13), ::testing::KilledBySignal(SIGKILL), "");
  EXPECT_EQ(slurp(run + "/checkpoints/latest"), "step-000012\n");
  const json b = budget_line(run);
  ASSERT_TRUE(b.is_object());
  const int64_t n = b["steps"].get<int64_t>();
  ASSERT_GT(n, 13);

  const std::string data = corpus_file(d, 6000);
  const Experiment e = load(lm_yaml(data, kBudgetTrain), d);
  const TrainSummary resumed = train_ok(e, options(run, true));
  EXPECT_EQ(resumed.steps_resumed, 12);
  EXPECT_EQ(resumed.steps, n);
  EXPECT_EQ(resumed.budget_minutes, 0.04);  // from the checkpoint
  int budget_lines = 0;
  for (const json& j : metrics(run)) budget_lines += j.value("event", "") == "budget";
  EXPECT_EQ(budget_lines, 1);  // settled once

  fs::remove_all(d + "/fixed");
  const Experiment fixed = load(lm_yaml(data, fixed_twin(n)), d);
  train_ok(fixed, options(d + "/fixed"));
  EXPECT_TRUE(final_state(run, n) == final_state(d + "/fixed", n)) << "the weights differ";
}

// max_steps still caps a budget that would allow more; the test set, encoded before training under
// a budget, is scored at the end as without one.
TEST(TrainBudget, MaxStepsStillCapsIt) {
  const std::string d = temp_dir("budget_cap");
  const std::string data = classify_file(d, 10);
  const std::string train = "max_steps: 30, batch_size: 8, lr: 0.01, warmup_steps: 5, eval_every: 10, "
                            "validation: 0.2, test_data: " + data;
  const Experiment e = load(classify_yaml(data, train + ", max_minutes: 10"), d);
  const TrainSummary s = train_ok(e, options(d + "/run"));
  EXPECT_EQ(s.steps, 30);
  EXPECT_EQ(s.test.counted, 30);
  const TrainSummary plain = train_ok(load(classify_yaml(data, train), d), options(d + "/plain"));
  EXPECT_EQ(s.test.loss, plain.test.loss);
  EXPECT_EQ(s.test.accuracy, plain.test.accuracy);
  const json b = budget_line(d + "/run");
  ASSERT_TRUE(b.is_object());
  EXPECT_EQ(b["step"].get<int64_t>(), 6);
  EXPECT_EQ(b["steps"].get<int64_t>(), 30);
}

// The timed steps must not depend on the count they settle: a schedule that decays needs a warmup
// of at least kBudgetProbeMin steps; a constant one needs none.
TEST(TrainBudget, AShortWarmupIsAConfigErrorAtTheKey) {
  const std::string d = temp_dir("budget_warmup");
  const std::string data = classify_file(d, 5);
  Diagnostics diags;
  EXPECT_FALSE(try_load(classify_yaml(data, "max_minutes: 5, warmup_steps: 2"), d, &diags));
  // classify_yaml puts train on line 14, its keys from column 9: the error is at the key.
  EXPECT_TRUE(has(diags.str(), "exp.yaml:14:9: train.max_minutes: a budget times the first steps")) << diags.str();
  EXPECT_TRUE(has(diags.str(), "set train.warmup_steps to at least 5, or train.schedule: constant")) << diags.str();
  Diagnostics ok;
  EXPECT_TRUE(try_load(classify_yaml(data, "max_minutes: 5, warmup_steps: 2, schedule: constant"), d, &ok)) << ok.str();
  EXPECT_TRUE(try_load(classify_yaml(data, "max_minutes: 5, warmup_steps: 5"), d, &ok)) << ok.str();
  EXPECT_FALSE(try_load(classify_yaml(data, "max_minutes: -1, warmup_steps: 5"), d, &diags));
}

// ---------------------------------------------------------------------------------------------
// A diverging run stops at the first non-finite loss or gradient.

TEST(TrainStopsOnNan, AHugeLearningRateStopsNamingTheStepAndTheLastGoodCheckpoint) {
  const std::string d = temp_dir("nan");
  const std::string data = corpus_file(d, 4000);
  const Experiment e = load(lm_yaml(data, "max_steps: 20, batch_size: 4, seq_len: 32, lr: 1e30, clip_norm: 0, "
                                          "schedule: constant, eval_every: 1, log_every: 1"),
                            d);
  Result<TrainSummary> r = train_experiment(e, options(d + "/run"));
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  std::printf("[ nan ] %s\n", msg.c_str());
  EXPECT_TRUE(has(msg, "train: step ")) << msg;
  EXPECT_TRUE(has(msg, "is not finite (NaN or Inf)")) << msg;
  // Step 1 already gives weights whose outputs overflow: nothing is kept.
  EXPECT_TRUE(has(msg, "train: step 1: the validation loss is not finite (NaN or Inf). "
                       "The last good checkpoint is none (no checkpoint yet)")) << msg;
  EXPECT_FALSE(fs::exists(d + "/run/best.safetensors"));
  // Whatever was written holds finite weights only: best.safetensors and every checkpoint.
  auto finite = [](const std::string& path) {
    Result<safetensors::File> f = safetensors::File::open(path);
    EXPECT_TRUE(f.ok()) << path;
    if (!f.ok()) return false;
    for (const safetensors::TensorInfo& t : f->tensors()) {
      const std::vector<float> v = f->get(t.name)->to_vector();
      for (float x : v)
        if (!std::isfinite(x)) return false;
    }
    return true;
  };
  if (fs::exists(d + "/run/best.safetensors")) {
    EXPECT_TRUE(finite(d + "/run/best.safetensors"));
  }
  for (const auto& f : fs::recursive_directory_iterator(d + "/run"))
    if (f.path().filename() == "weights.safetensors") {
      EXPECT_TRUE(finite(f.path().string())) << f.path();
    }
  // No evaluation with a non-finite loss is taken for the best.
  for (const json& j : metrics(d + "/run"))
    if (j.contains("eval") && j.value("best", false)) {
      EXPECT_TRUE(j["eval"]["loss"].is_number()) << j.dump();
    }
}

// ---------------------------------------------------------------------------------------------
// The command line

namespace {

struct Ran {
  int code = -1;
  std::string out, err;
};

Ran run_cli(const std::string& args, const std::string& dir) {
  const std::string err_file = dir + "/stderr.txt";
  FILE* p = popen((kTessera + " " + args + " 2>" + err_file).c_str(), "r");
  Ran r;
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err_file);
  return r;
}

}  // namespace

TEST(TrainCli, TrainsAndRefusesABadConfigWithExitCode2) {
  const std::string d = temp_dir("cli");
  write(d + "/exp.yaml", classify_yaml(classify_file(d, 10), "max_steps: 3, batch_size: 8"));
  const Ran ok = run_cli("train " + d + "/exp.yaml --out " + d + "/run --quiet", d);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_TRUE(has(ok.out, "trained 3 steps in ")) << ok.out;
  EXPECT_TRUE(has(ok.out, "best weights: " + d + "/run/best.safetensors")) << ok.out;
  EXPECT_EQ(ok.err, "");  // --quiet: no progress
  EXPECT_TRUE(fs::exists(d + "/run/summary.json"));
  // Again without --resume: refused as bad input; with it and more steps, it continues.
  const Ran again = run_cli("train " + d + "/exp.yaml --out " + d + "/run --quiet", d);
  EXPECT_EQ(again.code, 2);
  EXPECT_TRUE(has(again.err, "--resume")) << again.err;
  const Ran resumed = run_cli("train " + d + "/exp.yaml --out " + d + "/run --quiet --resume --set train.max_steps=5", d);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(has(resumed.out, "trained 5 steps (3 before the resume)")) << resumed.out;

  write(d + "/bad.yaml", classify_yaml(d + "/items.jsonl", "batch_size: 8, accumulate: 3"));
  const Ran bad = run_cli("train " + d + "/bad.yaml --out " + d + "/bad --quiet", d);
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(has(bad.err, "train.accumulate")) << bad.err;
  EXPECT_FALSE(fs::exists(d + "/bad"));
}

// `tessera bench --train` times the training loop's own steps: warm-up + reps + 1 of them run
// (the last one's interval holds the evaluation and is not timed), in a scratch folder it removes.
TEST(TrainCli, BenchTrainTimesTheLoopsStepsAndLeavesNothingBehind) {
  const std::string d = temp_dir("cli_bench");
  write(d + "/exp.yaml", classify_yaml(classify_file(d, 10), "max_steps: 500, batch_size: 8, eval_every: 2, "
                                                          "test_data: " + d + "/items.jsonl"));
  const Ran r = run_cli("bench --train " + d + "/exp.yaml --reps 3 --warmup 1 --threads 1 --json " + d + "/b.json", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "classifier, batch 8 x ")) << r.out;
  EXPECT_TRUE(has(r.out, "(3 steps after 1 warm-up)")) << r.out;
  EXPECT_TRUE(has(r.out, "examples/s")) << r.out;
  const json j = json::parse(slurp(d + "/b.json"));
  EXPECT_EQ(j["mode"], "train");
  ASSERT_EQ(j["times_s"].size(), 3u);
  for (const json& t : j["times_s"]) EXPECT_GT(t.get<double>(), 0.0);
  EXPECT_GT(j["examples_per_s"].get<double>(), 0.0);
  EXPECT_NEAR(j["examples_per_s"].get<double>(), 8.0 / j["median_s"].get<double>(), 1e-9);
  EXPECT_GT(j["max_rss_bytes"].get<int64_t>(), 0);
  // No run folder was made beside the config (the outputs.dir default) and none stays in the temp dir.
  for (const auto& e : fs::directory_iterator(d)) EXPECT_FALSE(fs::is_directory(e.path())) << e.path();
  // A language model gives tokens/s too.
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog\n";
  write(d + "/lm.txt", text);
  write(d + "/lm.yaml", lm_yaml(d + "/lm.txt", "seq_len: 16, batch_size: 4"));
  const Ran lm = run_cli("bench --train " + d + "/lm.yaml --reps 2 --warmup 0 --threads 1", d);
  ASSERT_EQ(lm.code, 0) << lm.err;
  EXPECT_TRUE(has(lm.out, "next-token LM, batch 4 x 16 rows")) << lm.out;
  EXPECT_TRUE(has(lm.out, "tokens/s")) << lm.out;
  EXPECT_TRUE(has(lm.out, "(2 steps after 1 warm-up)")) << lm.out;  // the first step is never timed
  // Refusals: a baseline has no loop; fewer than 2 timed steps; no file.
  const Ran base = run_cli("bench --train " + d + "/lm.yaml --set train.baseline=bigram", d);
  EXPECT_EQ(base.code, 2);
  EXPECT_TRUE(has(base.err, "train.baseline is set")) << base.err;
  const Ran few = run_cli("bench --train " + d + "/lm.yaml --reps 1", d);
  EXPECT_EQ(few.code, 2);
  EXPECT_TRUE(has(few.err, "--reps must be at least 2")) << few.err;
  EXPECT_EQ(run_cli("bench --train", d).code, 2);
}

TEST(TrainCli, EvalPrintsThePerClassTableAndTheConfusionMatrix) {
  const std::string d = temp_dir("cli_eval");
  write(d + "/exp.yaml", classify_yaml(classify_file(d, 20), "epochs: 3, batch_size: 8, lr: 0.01, validation: 0.2"));
  ASSERT_EQ(run_cli("train " + d + "/exp.yaml --out " + d + "/run --quiet", d).code, 0);
  const Ran ev = run_cli("eval " + d + "/exp.yaml --weights " + d + "/run/best.safetensors --out " + d + "/ev", d);
  ASSERT_EQ(ev.code, 0) << ev.err;
  EXPECT_TRUE(has(ev.out, "the seeded 20 % of the items of " + d + "/items.jsonl (held out as training held it out): 12 items"))
      << ev.out;
  EXPECT_TRUE(has(ev.out, "class  precision  recall  F1      support\nalpha  ")) << ev.out;
  EXPECT_TRUE(has(ev.out, "confusion matrix (rows: the true class, columns: the predicted one")) << ev.out;
  const json j = json::parse(slurp(d + "/ev/eval.json"));
  EXPECT_EQ(j["counted"], 12);
  ASSERT_EQ(j["classes"].size(), 3u);
  int64_t support = 0;
  for (const json& c : j["classes"]) support += c["support"].get<int64_t>();
  EXPECT_EQ(support, 12);
  EXPECT_EQ(j["confusion"].size(), 3u);
  const Ran missing = run_cli("eval " + d + "/exp.yaml --weights " + d + "/nothing.safetensors", d);
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(has(missing.err, "tessera eval: eval: --weights " + d + "/nothing.safetensors")) << missing.err;
}

TEST(TrainStopsOnNan, AfterAGoodCheckpointItIsNamed) {
  // Warmup makes step 1's rate 0 (a finite checkpoint); step 2 diverges at 1e29.
  const std::string d = temp_dir("nan_later");
  const Experiment e = load(lm_yaml(corpus_file(d, 4000), "max_steps: 20, batch_size: 4, seq_len: 32, lr: 1e30, "
                                                          "clip_norm: 0, warmup_steps: 10, eval_every: 1, log_every: 1"),
                            d);
  Result<TrainSummary> r = train_experiment(e, options(d + "/run"));
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  std::printf("[ nan ] %s\n", msg.c_str());
  EXPECT_TRUE(has(msg, "train: step 2: the ")) << msg;
  EXPECT_TRUE(has(msg, "not finite (NaN or Inf)")) << msg;
  EXPECT_TRUE(has(msg, "The last good checkpoint is " + d + "/run/checkpoints/step-000001:")) << msg;
  // The best weights are step 1's, the checkpoint's (tensor data; the checkpoint's header names its step).
  const std::string best = tensor_data(d + "/run/best.safetensors");
  EXPECT_FALSE(best.empty());
  EXPECT_TRUE(best == tensor_data(d + "/run/checkpoints/step-000001/weights.safetensors"));
  EXPECT_EQ(slurp(d + "/run/checkpoints/latest"), "step-000001\n");
}

TEST(TrainStopsOnNan, TheAdviceIsAFreshStartSinceResumeKeepsTheConfig) {
  const std::string d = temp_dir("nan_advice");
  const std::string data = corpus_file(d, 4000);
  const std::string train = "max_steps: 6, batch_size: 4, seq_len: 32, clip_norm: 0, warmup_steps: 10, eval_every: 1, lr: ";
  Result<TrainSummary> r = train_experiment(load(lm_yaml(data, train + "1e30"), d), options(d + "/run"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.status().message(), "set train.clip_norm and start again with --force")) << r.status().message();
  // What the advice rules out: a lower rate cannot --resume the diverged run...
  const Experiment lower = load(lm_yaml(data, train + "0.001"), d);
  Result<TrainSummary> resumed = train_experiment(lower, options(d + "/run", true));
  ASSERT_FALSE(resumed.ok());
  EXPECT_TRUE(has(resumed.status().message(), "the run was started with config")) << resumed.status().message();
  // ...and with --force it trains.
  TrainOptions force = options(d + "/run");
  force.force = true;
  EXPECT_EQ(train_ok(lower, force).steps, 6);
}

// ---------------------------------------------------------------------------------------------
// train.freeze: what is frozen keeps its values bit for bit and has no optimizer state; the
// backward pass stops below the lowest trained part, with the same gradients above it.

TEST(TrainFreeze, FrozenParametersAreBitIdenticalAndHaveNoOptimizerState) {
  const std::string d = temp_dir("freeze");
  const std::string data = classify_file(d, 30);
  std::string yaml = classify_yaml(data, "epochs: 2, batch_size: 16, lr: 0.01, validation: 0.2, freeze: [stem, pos, blocks.0.attn]");
  yaml.replace(yaml.find("n_layers: 1"), 11, "n_layers: 2");
  const Experiment e = load(yaml, d);
  Result<Parameters> start = Parameters::resolve(e.model);
  ASSERT_TRUE(start.ok()) << start.status().message();
  const TrainSummary s = train_ok(e, options(d + "/run"));
  ASSERT_GT(s.steps, 0);
  Result<Checkpoint> ck = read_checkpoint(d + "/run/checkpoints");
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  int frozen = 0, trained = 0;
  for (const auto& [name, t] : *start) {
    const Tensor* now = ck->weights.find(name);
    ASSERT_NE(now, nullptr) << name;
    const bool same = now->to_vector() == t.to_vector();  // float ==: bit-identical for finite values
    const bool is_frozen = name.rfind("stem.", 0) == 0 || name.rfind("pos.", 0) == 0 ||
                           name.rfind("blocks.0.attn.", 0) == 0;
    ASSERT_EQ(e.train.frozen(name), is_frozen) << name;
    if (is_frozen) {
      ++frozen;
      EXPECT_TRUE(same) << name << " is frozen but changed";
    } else if (name.find(".b") == std::string::npos && name.find("beta") == std::string::npos) {
      ++trained;  // the matrices move (biases may start at zero and stay near it; still trained)
      EXPECT_FALSE(same) << name << " is trained but did not change";
    }
  }
  EXPECT_GE(frozen, 6);
  EXPECT_GE(trained, 6);
  for (const auto& [name, t] : ck->optimizer) {
    EXPECT_EQ(name.find("stem."), std::string::npos) << name;
    EXPECT_EQ(name.find("pos."), std::string::npos) << name;
    EXPECT_EQ(name.find("blocks.0.attn."), std::string::npos) << name;
  }
  EXPECT_TRUE(std::any_of(ck->optimizer.begin(), ck->optimizer.end(),
                          [](const auto& kv) { return kv.first == "adamw.m.blocks.0.ffn.w1"; }));
  const std::vector<json> m = metrics(d + "/run");
  ASSERT_FALSE(m.empty());
  EXPECT_LT(m[0]["trained"].get<int64_t>(), m[0]["parameters"].get<int64_t>());

  // Resumed from its checkpoint, a frozen run continues (the optimizer state holds the trained part only).
  Experiment more = e;
  more.train.epochs = 3;
  TrainOptions o = options(d + "/run", true);
  const TrainSummary s2 = train_ok(more, o);
  EXPECT_GT(s2.steps, s.steps);
}

TEST(TrainFreeze, TheBackwardStopsBelowTheLowestTrainedBlockWithTheSameGradientsAbove) {
  const std::string d = temp_dir("freeze_grad");
  std::string yaml = classify_yaml(classify_file(d, 2), "");
  yaml.replace(yaml.find("n_layers: 1"), 11, "n_layers: 3");
  const Experiment e = load(yaml, d);
  Result<Parameters> p = Parameters::resolve(e.model);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const Parameters params = p->clone();
  Batch batch = Batch::from_ids({72, 101, 108, 108, 111});
  Targets t;
  t.labels = Tensor::from_ids({1}, {2});
  Parameters full = params.zeros_like(), part = params.zeros_like();
  ASSERT_TRUE(compute_gradients(e.model, params, batch, t, &full).ok());
  GradOptions go;
  go.backward_stem = false;
  go.backward_first_block = 1;
  Result<LossValue> r = compute_gradients(e.model, params, batch, t, &part, go);
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (const auto& [name, g] : part) {
    const bool below = name.rfind("blocks.0.", 0) == 0 || name.rfind("stem.", 0) == 0 || name.rfind("pos.", 0) == 0;
    if (below) {
      for (float v : g.to_vector()) ASSERT_EQ(v, 0.f) << name << " is below the stop but has a gradient";
    } else {
      EXPECT_EQ(g.to_vector(), full.find(name)->to_vector()) << name;
    }
  }
}

TEST(TrainFreeze, EntriesThatNameNoParameterAndFreezingEverythingAreConfigErrors) {
  const std::string d = temp_dir("freeze_config");
  Diagnostics diags;
  const std::string yaml = classify_yaml(d + "/none.jsonl", "freeze: [stem, block, blocks.7]");
  EXPECT_FALSE(try_load(yaml, d, &diags));
  // The place of each bad entry: line and column in exp.yaml.
  auto place = [&](const std::string& entry) {
    const size_t at = yaml.find(entry, yaml.find("freeze:"));
    const size_t line_start = yaml.rfind('\n', at) + 1;
    const int line = 1 + static_cast<int>(std::count(yaml.begin(), yaml.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
    return "exp.yaml:" + std::to_string(line) + ":" + std::to_string(at - line_start + 1) + ": train.freeze: ";
  };
  EXPECT_TRUE(has(diags.str(), place("block,") + "entry 1: \"block\" names none of the model's parameters"))
      << diags.str();
  EXPECT_TRUE(has(diags.str(), place("blocks.7") + "entry 2: \"blocks.7\" names none")) << diags.str();
  EXPECT_TRUE(has(diags.str(), "the model's parts: stem, pos, blocks, head")) << diags.str();
  EXPECT_FALSE(has(diags.str(), "\"stem\" names none")) << diags.str();

  Diagnostics all;
  EXPECT_FALSE(try_load(classify_yaml(d + "/none.jsonl", "freeze: [stem, pos, blocks, head]"), d, &all));
  EXPECT_TRUE(has(all.str(), "train.freeze: every parameter of the model is frozen: nothing is left to train"))
      << all.str();
  Diagnostics type;
  EXPECT_FALSE(try_load(classify_yaml(d + "/none.jsonl", "freeze: head"), d, &type));
  EXPECT_TRUE(has(type.str(), "exp.yaml:14:")) << type.str();
  EXPECT_TRUE(has(type.str(), "train.freeze: expected a list of strings")) << type.str();
}
