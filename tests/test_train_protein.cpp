// The protein-families recipes (configs/train/protein_families_mlm.yaml, then
// configs/train/protein_families.yaml) on a committed slice, as small-slice checks that can fail:
// a narrow ESM-style encoder is pretrained by masked LM on the slice's training sequences and must
// beat their unigram baseline; its weights, LM head left out (model.weights.ignore: [head]), then
// start the family classifier, whose macro-F1 on sequences of held-out clusters must be clearly
// above the majority class's. The slice: tests/data/protein_families/ (README.md there).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config.h"
#include "tessera/train.h"
#include "test_training.h"

using namespace tessera;
using namespace tessera::testing_train;

namespace {

const std::string kPluginDir = TESSERA_PLUGIN_BUILD_DIR;
const std::string kSlice = std::string(TESSERA_TEST_DATA) + "/protein_families/";
const std::string kRecipes = std::string(TESSERA_SOURCE_DIR) + "/configs/train/";

// The recipes' own files, with the slice and a narrow model: sequences cut to 126 residues, d_model
// 32, two layers of two heads.
std::vector<std::string> slice_overrides() {
  return {"plugins.0.path=" + kPluginDir,
          "plugins.0.options.max_length=128",
          "data.path=" + kSlice + "train.csv",
          "model.d_model=32",
          "model.d_ff=64",
          "model.n_heads=2",
          "model.n_layers=2",
          "train.max_minutes=0",
          "train.batch_size=16",
          "train.warmup_steps=10",
          "train.log_every=20"};
}

std::optional<Experiment> recipe(const std::string& name, std::vector<std::string> more) {
  LoadOptions lo;
  lo.overrides = slice_overrides();
  lo.overrides.insert(lo.overrides.end(), more.begin(), more.end());
  Diagnostics diags;
  std::optional<Experiment> e = load_experiment(kRecipes + name, lo, &diags);
  EXPECT_TRUE(e) << diags.str();
  return e;
}

// Macro-F1 of always answering the most frequent class of a confusion matrix's true counts.
double majority_macro_f1(const std::vector<std::vector<int64_t>>& confusion) {
  int64_t n = 0, top = 0;
  for (const auto& row : confusion) {
    int64_t r = 0;
    for (int64_t v : row) r += v;
    n += r;
    top = std::max(top, r);
  }
  if (n == 0 || confusion.empty()) return 0;
  const double precision = static_cast<double>(top) / static_cast<double>(n);
  return 2 * precision / (precision + 1) / static_cast<double>(confusion.size());
}

}  // namespace

// Measured (docs/TRAINING.md, "Protein families"): masked LM 2.70 to 2.82 nats against the
// unigram's 2.92; fine-tuned test macro-F1 0.39 to 0.46 over four seeds (0.40 with the recipes'
// seeds), where answering "none" everywhere scores 0.23. Sequences of held-out clusters are hard
// for a model this small (as in the full recipe): the bar says it learnt the families at all.
constexpr double kSliceMlmMargin = 0.05;  // nats per masked residue under the unigram
constexpr double kSliceMacroF1 = 0.33;    // the majority class (none) scores 0.23

TEST(TrainRecipes, ProteinFamiliesOnASlicePretrainThenFineTune) {
  const std::string d = temp_dir("tessera_train_protein", "slice");
  // Pretraining: the slice's 200 training sequences (labels unused), 10 % held out.
  const std::vector<std::string> mlm = {"train.validation_data=null", "train.validation=0.1",
                                        "train.max_steps=300", "train.eval_every=300", "train.lr=0.005"};
  std::vector<std::string> counted = mlm;
  counted.push_back("train.baseline=unigram");
  std::optional<Experiment> unigram = recipe("protein_families_mlm.yaml", counted);
  ASSERT_TRUE(unigram);
  const TrainSummary u = train_ok(*unigram, train_options(d + "/unigram"));
  std::optional<Experiment> pre = recipe("protein_families_mlm.yaml", mlm);
  ASSERT_TRUE(pre);
  const TrainSummary p = train_ok(*pre, train_options(d + "/mlm"));
  std::printf("[ protein families slice ] masked LM: %.4f nats per masked residue (accuracy %.3f) against the "
              "unigram's %.4f (%.3f), %lld masked rows; %.1f s\n",
              p.best.loss, p.best.accuracy, u.best.loss, u.best.accuracy, static_cast<long long>(p.best.counted),
              p.seconds);
  EXPECT_EQ(p.best.counted, u.best.counted);
  EXPECT_LT(p.best.loss, u.best.loss - kSliceMlmMargin);

  // Fine-tuning from its best weights: three classes, 100 sequences of held-out clusters as the
  // test set.
  std::optional<Experiment> tune =
      recipe("protein_families.yaml",
             {"model.weights.file=" + d + "/mlm/best.safetensors", "model.head.n_classes=3",
              "model.head.labels=[none, Pkinase, RRM_1]", "train.validation_data=null", "train.validation=0.1",
              "train.test_data=" + kSlice + "test.csv", "train.max_steps=300", "train.eval_every=50",
              "train.lr=0.003"});
  ASSERT_TRUE(tune);
  const TrainSummary t = train_ok(*tune, train_options(d + "/tune"));
  ASSERT_EQ(t.test.counted, 100);
  const double majority = majority_macro_f1(t.test.confusion);
  std::printf("[ protein families slice ] fine-tuned: test accuracy %.3f, macro-F1 %.3f (the majority class: "
              "%.3f); %.1f s\n",
              t.test.accuracy, t.test.macro_f1, majority, t.seconds);
  EXPECT_GE(t.test.macro_f1, kSliceMacroF1);
  EXPECT_GE(t.test.macro_f1, majority + 0.1);
}
