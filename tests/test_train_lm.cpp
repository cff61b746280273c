// The LM side of `tessera train` beyond the loop itself: the separator that keeps a text file's
// line breaks in the token stream, the baselines (unigram, bigram, proximity) against exact counts
// and finite differences, their config errors, and a quality check that can fail: a tiny
// character model trained on a slice of the King James Bible must beat the bigram baseline of the
// same slice on its held-out part.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/config.h"
#include "tessera/optim.h"
#include "tessera/parameters.h"
#include "tessera/train.h"
#include "test_training.h"

using namespace tessera;
using nlohmann::json;
using namespace tessera::testing_train;
namespace fs = std::filesystem;

namespace {

const std::string kPluginDir = TESSERA_PLUGIN_BUILD_DIR;  // libtessera_text.so
const std::string kSlice = std::string(TESSERA_TEST_DATA) + "/kjv/ruth_jonah.txt";


std::string temp_dir(const std::string& name) { return testing_train::temp_dir("tessera_train_lm", name); }

std::string plugin(const std::string& options = "{tokenizer: bytes}") {
  return "plugins:\n  - name: text\n    path: " + kPluginDir + "\n    options: " + options + "\n";
}

TrainOptions options(const std::string& out) { return train_options(out, false, true); }

// A byte-level decoder; `train` is the inside of the train mapping.
std::string lm_yaml(const std::string& data, const std::string& train, int64_t d_model = 32, int64_t layers = 1,
                    int64_t max_len = 64) {
  return plugin() + "model:\n  arch: decoder\n  d_model: " + std::to_string(d_model) + "\n  n_heads: 2\n  n_layers: " +
         std::to_string(layers) + "\n  norm: pre\n  stem: {kind: tokens, vocab_size: 259}\n  positions: {kind: learned, max_len: " +
         std::to_string(max_len) + "}\n  head: {kind: lm, tied: true}\ndata:\n  path: " + data + "\ntrain: {" + train + "}\n";
}


}  // namespace

// ---------------------------------------------------------------------------------------------
// The n-gram baselines, counted by hand.

TEST(NgramBaseline, CountsATinyStreamExactly) {
  const std::vector<int32_t> s = {0, 1, 0, 1, 2};  // V = 3
  Result<NgramModel> u = NgramModel::count(1, s, 3, 1.0);
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->total, 5);
  EXPECT_EQ(u->unigrams, (std::vector<int64_t>{2, 2, 1}));
  EXPECT_DOUBLE_EQ(u->prob(-1, 0), 3.0 / 8.0);  // (2 + 1) / (5 + 3)
  EXPECT_DOUBLE_EQ(u->prob(-1, 2), 2.0 / 8.0);

  Result<NgramModel> b = NgramModel::count(2, s, 3, 0.5);
  ASSERT_TRUE(b.ok()) << b.status().message();
  // bigrams: 0→1 twice, 1→0 once, 1→2 once; contexts: 0 twice, 1 twice, 2 never.
  EXPECT_EQ(b->bigrams, (std::vector<int64_t>{0, 2, 0, 1, 0, 1, 0, 0, 0}));
  EXPECT_EQ(b->contexts, (std::vector<int64_t>{2, 2, 0}));
  EXPECT_DOUBLE_EQ(b->prob(0, 1), 2.5 / 3.5);  // (2 + 0.5) / (2 + 1.5)
  EXPECT_DOUBLE_EQ(b->prob(2, 2), 0.5 / 1.5);  // an unseen context: uniform
  // Every token after the first, given its predecessor: -ln p(1|0) - ln p(2|1).
  EXPECT_NEAR(b->nats({0, 1, 2}), -std::log(2.5 / 3.5) - std::log(1.5 / 3.5), 1e-12);
  EXPECT_NEAR(u->nats({0, 1, 2}), -std::log(3.0 / 8.0) - std::log(2.0 / 8.0), 1e-12);  // p(1), p(2)
  // Each smoothed distribution sums to one.
  for (int32_t a = 0; a < 3; ++a) {
    double sum = 0;
    for (int32_t c = 0; c < 3; ++c) sum += b->prob(a, c);
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
}

TEST(NgramBaseline, AnIdOutsideTheVocabularyNamesItsPosition) {
  Result<NgramModel> m = NgramModel::count(2, {0, 1, 7}, 3, 1.0);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(has(m.status().message(), "token 2 of the training stream is id 7, outside the vocabulary [0, 3)"))
      << m.status().message();
}

// ---------------------------------------------------------------------------------------------
// The proximity baseline: its value by hand, its gradient against central differences.

TEST(ProximityBaseline, ZeroOutputWeightsGiveLogVPerTarget) {
  Parameters p = proximity_init(5, 3, 1);
  std::fill(p.find("proximity.w")->data<float>(), p.find("proximity.w")->data<float>() + 15, 0.0f);
  EXPECT_NEAR(proximity_nats(p, {0, 1, 2, 3, 4}, {1, 2, 3, 4}, 2), 4 * std::log(5.0), 1e-9);
}

TEST(ProximityBaseline, GradientMatchesCentralDifferences) {
  const std::vector<int32_t> s = {0, 1, 2, 1, 3, 4, 0, 2};
  const std::vector<int64_t> targets = {1, 2, 3, 5, 7};  // windows of 1, 2, 3 and 3 tokens
  Parameters p = proximity_init(5, 3, 7);
  Parameters g = p.zeros_like();
  proximity_nats(p, s, targets, 3, &g);
  double worst = 0, scale = 0;
  for (const auto& [name, t] : g) {
    float* x = p.find(name)->data<float>();
    const float* gx = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float keep = x[i];
      const double h = 1e-2;
      x[i] = static_cast<float>(keep + h);
      const double up = proximity_nats(p, s, targets, 3);
      x[i] = static_cast<float>(keep - h);
      const double down = proximity_nats(p, s, targets, 3);
      x[i] = keep;
      worst = std::max(worst, std::abs((up - down) / (2 * h) - gx[i]));
      scale = std::max(scale, std::abs(static_cast<double>(gx[i])));
    }
  }
  EXPECT_GT(scale, 0.1);
  EXPECT_LT(worst, 2e-3 * scale) << "worst " << worst << " of scale " << scale;
}

// ---------------------------------------------------------------------------------------------
// The separator: a text file's line breaks are in the stream, or another string, or nothing.

TEST(TrainSeparator, JoinsTheItemsOfTheStream) {
  const std::string d = temp_dir("separator");
  write(d + "/three.txt", "ab\ncd\n\nef\n");  // three items: the empty line is none
  // The unigram baseline counts the whole training stream (validation_data: every token trains).
  auto tokens = [&](const std::string& extra) {
    const Experiment e = load(lm_yaml(d + "/three.txt", "baseline: unigram, seq_len: 2, validation_data: three.txt" + extra), d);
    train_ok(e, options(d + "/run"));
    const std::vector<json> m = metrics(d + "/run");
    return m.empty() ? int64_t{-1} : m[0].value("tokens", int64_t{-1});
  };
  EXPECT_EQ(tokens(""), 8);                     // a b \n c d \n e f: the default is "\n"
  EXPECT_EQ(tokens(", separator: \"\""), 6);   // the items run together
  EXPECT_EQ(tokens(", separator: \"||\""), 10);
  // And the newline is what the stream holds: the unigram model gives "\n" its count (2 of 8).
  const Experiment e = load(lm_yaml(d + "/three.txt", "baseline: unigram, seq_len: 2, add_k: 0.5, validation_data: three.txt"), d);
  const TrainSummary s = train_ok(e, options(d + "/run"));
  // Held-out = the same 8 tokens; the 7 after the first: b \n c d \n e f.
  const double V = 259, k = 0.5, N = 8;
  const double nats = -5 * std::log((1 + k) / (N + k * V)) - 2 * std::log((2 + k) / (N + k * V));
  EXPECT_NEAR(s.best.loss, nats / 7, 1e-9);
}

TEST(TrainSeparator, AClassifierWithASeparatorIsAConfigErrorWithItsPlace) {
  const std::string d = temp_dir("separator_classify");
  Diagnostics diags;
  const std::string yaml = plugin() +
                           "model:\n  d_model: 32\n  n_heads: 2\n  n_layers: 1\n"
                           "  stem: {kind: tokens, vocab_size: 259}\n  positions: {kind: learned, max_len: 64}\n"
                           "  head: {kind: classifier, n_classes: 3}\n"
                           "data:\n  path: none.jsonl\n"
                           "train:\n  separator: \"\\n\"\n  baseline: bigram\n";
  EXPECT_FALSE(try_load(yaml, d, &diags));
  EXPECT_TRUE(has(diags.str(), "exp.yaml:15:3: train.separator: only an lm objective joins items into a stream"))
      << diags.str();
  EXPECT_TRUE(has(diags.str(), "exp.yaml:16:3: train.baseline: bigram is a language-model baseline")) << diags.str();
}

TEST(TrainSeparator, WrongTypesAndValuesAreConfigErrors) {
  const std::string d = temp_dir("separator_types");
  Diagnostics diags;
  EXPECT_FALSE(try_load(lm_yaml("x.txt", "separator: [a], baseline: trigram, add_k: 0, window: 0"), d, &diags));
  const std::string s = diags.str();
  EXPECT_TRUE(has(s, "train.separator: expected string")) << s;
  EXPECT_TRUE(has(s, "train.baseline:")) << s;
  EXPECT_TRUE(has(s, "trigram")) << s;
  EXPECT_TRUE(has(s, "train.add_k: must be > 0")) << s;
  EXPECT_TRUE(has(s, "train.window:")) << s;
  EXPECT_TRUE(has(s, "exp.yaml:")) << s;
}

TEST(TrainSeparator, OneTheTokenizerDropsIsAnErrorNamingTheKeysPlace) {
  const std::string d = temp_dir("separator_dropped");
  write(d + "/lines.txt", "in the beginning\nwas the word\n");
  // WordPiece keeps no whitespace: " " gives no tokens (only the [CLS] and [SEP] it adds to every item).
  std::string yaml = lm_yaml(d + "/lines.txt", "seq_len: 2, separator: \" \"");
  yaml.replace(yaml.find("{tokenizer: bytes}"), std::string("{tokenizer: bytes}").size(),
               "{tokenizer: wordpiece, vocab: " + std::string(TESSERA_TEST_DATA) + "/text/vocab.txt}");
  yaml.replace(yaml.find("vocab_size: 259"), std::string("vocab_size: 259").size(), "vocab_size: 30522");
  const Experiment e = load(yaml, d);
  Result<TrainSummary> r = train_experiment(e, options(d + "/run"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.status().message(), "exp.yaml:16:")) << r.status().message();
  EXPECT_TRUE(has(r.status().message(), "train.separator: the tokenizer gives no tokens")) << r.status().message();
  // A chars vocabulary has no "\n" (a character a line): the default separator would be UNK.
  std::string chars = lm_yaml(d + "/lines.txt", "seq_len: 2");
  chars.replace(chars.find("{tokenizer: bytes}"), std::string("{tokenizer: bytes}").size(),
                "{tokenizer: chars, vocab: " + std::string(TESSERA_TEST_DATA) + "/text/chars.txt}");
  Result<TrainSummary> c = train_experiment(load(chars, d), options(d + "/run"));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(has(c.status().message(), "train.separator: the tokenizer gives no tokens for \"\\n\" (the default)"))
      << c.status().message();
}

// ---------------------------------------------------------------------------------------------
// Baselines through `tessera train`: the run folder a model's run has.

TEST(TrainBaseline, BigramBeatsUnigramAndProximityLearnsOnTheSlice) {
  const std::string d = temp_dir("baselines");
  auto run = [&](const std::string& train) {
    return train_ok(load(lm_yaml(kSlice, "seq_len: 32, " + train), d), options(d + "/run"));
  };
  const TrainSummary uni = run("baseline: unigram"), bi = run("baseline: bigram");
  EXPECT_GT(uni.best.counted, 1900);  // the last 10 % of 19,693 bytes, less the first
  EXPECT_EQ(uni.best.counted, bi.best.counted);
  EXPECT_LT(bi.best.bits_per_token, uni.best.bits_per_token - 0.5);
  const json summary = json::parse(std::ifstream(d + "/run/summary.json"));
  EXPECT_EQ(summary["baseline"], "bigram");
  EXPECT_NEAR(summary["best"]["bits_per_token"].get<double>(), bi.best.bits_per_token, 1e-12);
  const TrainSummary prox = run("baseline: proximity, window: 4, max_steps: 60, batch_size: 8, lr: 0.03, eval_every: 30");
  EXPECT_EQ(prox.steps, 60);
  EXPECT_LT(prox.best.bits_per_token, uni.best.bits_per_token);
  EXPECT_TRUE(fs::exists(d + "/run/best.safetensors"));
  std::printf("[ baselines ] slice: unigram %.3f, bigram %.3f, proximity(4) %.3f bits/char\n", uni.best.bits_per_token,
              bi.best.bits_per_token, prox.best.bits_per_token);
}

// ---------------------------------------------------------------------------------------------
// Quality: a tiny character GPT (d_model 32, one layer, 200 steps of 16 windows of 32 bytes) on
// Ruth and Jonah beats the slice's bigram model on the held-out end of Jonah. Measured on the
// development machine (AMD EPYC, 2 cores): bigram 3.722, the GPT 3.619 bits per character; the
// margin held is half the 0.10 measured, so a change that costs the model half its edge fails.

TEST(TrainQuality, TinyCharGptBeatsTheBigramBaselineOnAKjvSlice) {
  const std::string d = temp_dir("quality");
  const std::string train = "seq_len: 32, batch_size: 16, max_steps: 200, lr: 0.03, warmup_steps: 10, min_lr_ratio: 0.1, "
                            "eval_every: 100, log_every: 50";
  const TrainSummary bi = train_ok(load(lm_yaml(kSlice, train + ", baseline: bigram"), d), options(d + "/bigram"));
  const TrainSummary gpt = train_ok(load(lm_yaml(kSlice, train), d), options(d + "/gpt"));
  std::printf("[ quality ] held-out bits/char: bigram %.3f, tiny GPT %.3f (step %lld); %.1f s\n", bi.best.bits_per_token,
              gpt.best.bits_per_token, static_cast<long long>(gpt.best_step), gpt.seconds);
  EXPECT_LE(bi.best.counted - gpt.best.counted, 32);  // the same held-out text (the model's in whole windows)
  const double kMargin = 0.05;
  EXPECT_LT(gpt.best.bits_per_token, bi.best.bits_per_token - kMargin);
}
