// The spoken-digit recipes' small-slice quality checks (configs/train/spoken_digits_ast.yaml and
// spoken_digits_frames.yaml, as they are, SpecAugment included, with a smaller model and fewer
// steps): trained on 160 clips of 16 voices (tests/data/spoken_digits, cut from
// tools/data/spoken_digits.sh's data set by make_slice.sh there), each must name the digit of
// the 60 clips of 6 other voices far better than chance (10 %). They assert accuracy, never time.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config.h"
#include "tessera/train.h"
#include "test_training.h"

using namespace tessera;
using namespace tessera::testing_train;
namespace fs = std::filesystem;

namespace {

const std::string kPluginDir = TESSERA_PLUGIN_BUILD_DIR;  // libtessera_audio.so
const std::string kSlice = std::string(TESSERA_TEST_DATA) + "/spoken_digits/";

// Measured on the slice (docs/TRAINING.md, "Spoken digits"); the bar leaves a wide margin under it.
constexpr double kSliceAccuracy = 0.6;

TrainSummary train_slice(const std::string& recipe) {
  LoadOptions lo;
  lo.overrides = {"plugins.0.path=" + kPluginDir,
                  "data.path=" + kSlice + "train.csv",
                  "train.test_data=" + kSlice + "test.csv",
                  "train.validation_data=",  // the slice has no third set of voices: a seeded tenth of training
                  "train.validation=0.1",
                  "model.d_model=64", "model.d_ff=128",
                  "train.max_steps=250", "train.batch_size=16", "train.warmup_steps=10", "train.eval_every=50",
                  "train.log_every=50"};
  Diagnostics diags;
  std::optional<Experiment> e =
      load_experiment(std::string(TESSERA_SOURCE_DIR) + "/configs/train/" + recipe + ".yaml", lo, &diags);
  EXPECT_TRUE(e) << diags.str();
  if (!e) return {};
  const std::string out = temp_dir("tessera_spoken_digits", recipe);
  const TrainSummary s = train_ok(*e, train_options(out));
  fs::remove_all(out);
  std::printf("[ %s slice ] validation %.3f (step %lld), test %.3f, macro-F1 %.3f; %.1f s\n", recipe.c_str(),
              s.best.accuracy, static_cast<long long>(s.best_step), s.test.accuracy, s.test.macro_f1, s.seconds);
  return s;
}

}  // namespace

TEST(SpokenDigits, AstPatchesOnASliceNameHeldOutVoicesDigitsFarAboveChance) {
  const TrainSummary s = train_slice("spoken_digits_ast");
  EXPECT_EQ(s.test.counted, 60);
  EXPECT_GE(s.test.accuracy, kSliceAccuracy);
  EXPECT_GE(s.test.macro_f1, kSliceAccuracy - 0.05);
}

TEST(SpokenDigits, LogMelFramesOnASliceNameHeldOutVoicesDigitsFarAboveChance) {
  const TrainSummary s = train_slice("spoken_digits_frames");
  EXPECT_EQ(s.test.counted, 60);
  EXPECT_GE(s.test.accuracy, kSliceAccuracy);
  EXPECT_GE(s.test.macro_f1, kSliceAccuracy - 0.05);
}
