// The config loader: resolved defaults, every class of error with its exact message (golden
// strings), include, --set, YAML bombs, inline expressions, the to_yaml round trip, and
// docs/CONFIG.md against schema_markdown(). Test files are in tests/data/config/.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "tessera/config.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string data_dir() { return std::string(TESSERA_TEST_DATA) + "/config"; }
std::string data(const std::string& rel) { return data_dir() + "/" + rel; }

std::optional<Experiment> load_text(const std::string& yaml, Diagnostics* diags,
                                    const std::vector<std::string>& overrides = {},
                                    LoadOptions options = {}) {
  options.overrides = overrides;
  return load_experiment_from_string(yaml, "t.yaml", data_dir(), options, diags);
}

// The diagnostics of a text that must fail to load.
std::string errors(const std::string& yaml, const std::vector<std::string>& overrides = {},
                   LoadOptions options = {}) {
  Diagnostics diags;
  std::optional<Experiment> exp = load_text(yaml, &diags, overrides, options);
  EXPECT_FALSE(exp.has_value()) << "loaded, but should have failed:\n" << yaml;
  EXPECT_FALSE(diags.empty());
  return diags.str();
}

std::string file_errors(const std::string& path, const std::vector<std::string>& overrides = {}) {
  LoadOptions options;
  options.overrides = overrides;
  Diagnostics diags;
  EXPECT_FALSE(load_experiment(path, options, &diags).has_value()) << path;
  return diags.str();
}

Experiment load_ok(const std::string& path, const std::vector<std::string>& overrides = {}) {
  LoadOptions options;
  options.overrides = overrides;
  Diagnostics diags;
  std::optional<Experiment> exp = load_experiment(path, options, &diags);
  EXPECT_TRUE(exp.has_value()) << diags.str();
  return exp ? std::move(*exp) : Experiment{};
}

Experiment load_text_ok(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  Diagnostics diags;
  std::optional<Experiment> exp = load_text(yaml, &diags, overrides);
  EXPECT_TRUE(exp.has_value()) << diags.str();
  return exp ? std::move(*exp) : Experiment{};
}

// A model that loads, to which a test adds the keys it is about.
const std::string kModel = "model:\n  d_model: 8\n  stem: {vocab_size: 10}\n";

void expect_same_tensor(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  EXPECT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(a.to_vector(), b.to_vector()) << what;
}

// Every field of two experiments, except where they were loaded from.
void expect_same(const Experiment& a, const Experiment& b) {
  const ModelConfig& x = a.model;
  const ModelConfig& y = b.model;
  EXPECT_EQ(x.name, y.name);
  EXPECT_EQ(x.arch, y.arch);
  EXPECT_EQ(x.causal, y.causal);
  EXPECT_EQ(x.d_model, y.d_model);
  EXPECT_EQ(x.n_layers, y.n_layers);
  EXPECT_EQ(x.n_heads, y.n_heads);
  EXPECT_EQ(x.d_k, y.d_k);
  EXPECT_EQ(x.d_v, y.d_v);
  EXPECT_EQ(x.d_ff, y.d_ff);
  EXPECT_EQ(x.activation, y.activation);
  EXPECT_EQ(x.norm, y.norm);
  EXPECT_EQ(x.norm_eps, y.norm_eps);
  EXPECT_EQ(x.final_norm, y.final_norm);
  EXPECT_EQ(x.bias, y.bias);
  EXPECT_EQ(x.residual, y.residual);
  EXPECT_EQ(x.dtype, y.dtype);
  EXPECT_EQ(x.attention.scale, y.attention.scale);
  EXPECT_EQ(x.attention.output_projection, y.attention.output_projection);
  EXPECT_EQ(x.positions.kind, y.positions.kind);
  EXPECT_EQ(x.positions.max_len, y.positions.max_len);
  EXPECT_EQ(x.positions.max_distance, y.positions.max_distance);
  EXPECT_EQ(x.positions.base, y.positions.base);
  EXPECT_EQ(x.positions.rotary_dims, y.positions.rotary_dims);
  EXPECT_EQ(x.positions.rotary_style, y.positions.rotary_style);
  EXPECT_EQ(x.stem.kind, y.stem.kind);
  EXPECT_EQ(x.stem.vocab_size, y.stem.vocab_size);
  EXPECT_EQ(x.stem.n_features, y.stem.n_features);
  EXPECT_EQ(x.stem.cls, y.stem.cls);
  EXPECT_EQ(x.stem.scale, y.stem.scale);
  EXPECT_EQ(x.head.kind, y.head.kind);
  EXPECT_EQ(x.head.pool, y.head.pool);
  EXPECT_EQ(x.head.normalize, y.head.normalize);
  EXPECT_EQ(x.head.n_classes, y.head.n_classes);
  EXPECT_EQ(x.head.labels, y.head.labels);
  EXPECT_EQ(x.head.tied, y.head.tied);
  EXPECT_EQ(x.init.scheme, y.init.scheme);
  EXPECT_EQ(x.init.std, y.init.std);
  EXPECT_EQ(x.init.seed, y.init.seed);
  EXPECT_EQ(x.weights.file, y.weights.file);
  EXPECT_EQ(x.weights.allow_missing, y.weights.allow_missing);
  ASSERT_EQ(x.weights.inline_tensors.size(), y.weights.inline_tensors.size());
  for (const auto& [name, t] : x.weights.inline_tensors) {
    ASSERT_TRUE(y.weights.inline_tensors.count(name)) << name;
    expect_same_tensor(t.value, y.weights.inline_tensors.at(name).value, name);
  }
  EXPECT_EQ(a.input.tokens, b.input.tokens);
  expect_same_tensor(a.input.rows, b.input.rows, "input.rows");
  EXPECT_EQ(a.input.ids, b.input.ids);
  EXPECT_EQ(a.runtime.threads, b.runtime.threads);
  EXPECT_EQ(a.runtime.reference, b.runtime.reference);
  EXPECT_EQ(a.bench.batch, b.bench.batch);
  EXPECT_EQ(a.bench.seq_len, b.bench.seq_len);
  EXPECT_EQ(a.bench.warmup, b.bench.warmup);
  EXPECT_EQ(a.bench.reps, b.bench.reps);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---------------------------------------------------------------------------------------------
// Files that load.

TEST(Config, MinimalFileGetsEveryDefault) {
  const Experiment e = load_ok(data("minimal.yaml"));
  const ModelConfig& m = e.model;
  EXPECT_EQ(e.file, data("minimal.yaml"));
  EXPECT_EQ(m.name, "");
  EXPECT_EQ(m.arch, Arch::encoder);
  EXPECT_FALSE(m.causal);
  EXPECT_EQ(m.d_model, 8);
  EXPECT_EQ(m.n_layers, 1);
  EXPECT_EQ(m.n_heads, 1);
  EXPECT_EQ(m.d_k, 8);
  EXPECT_EQ(m.d_v, 8);
  EXPECT_EQ(m.d_ff, 32);
  EXPECT_EQ(m.activation, Activation::relu);
  EXPECT_EQ(m.norm, NormPlacement::post);
  EXPECT_EQ(m.norm_eps, 1e-5);
  EXPECT_FALSE(m.final_norm);
  EXPECT_TRUE(m.bias);
  EXPECT_TRUE(m.residual);
  EXPECT_EQ(m.dtype, DType::f32);
  EXPECT_EQ(m.attention.scale, 1.0 / std::sqrt(8.0));
  EXPECT_TRUE(m.attention.output_projection);
  EXPECT_EQ(m.positions.kind, PositionKind::none);
  EXPECT_EQ(m.positions.max_len, 512);
  EXPECT_EQ(m.positions.max_distance, 16);
  EXPECT_EQ(m.positions.base, 10000.0);
  EXPECT_EQ(m.positions.rotary_dims, 8);
  EXPECT_EQ(m.positions.rotary_style, RotaryStyle::half);
  EXPECT_EQ(m.stem.kind, StemKind::tokens);
  EXPECT_EQ(m.stem.vocab_size, 10);
  EXPECT_EQ(m.stem.n_features, 0);
  EXPECT_FALSE(m.stem.cls);
  EXPECT_EQ(m.stem.scale, EmbedScale::none);
  EXPECT_EQ(m.head.kind, HeadKind::none);
  EXPECT_EQ(m.head.pool, PoolKind::mean);
  EXPECT_FALSE(m.head.normalize);
  EXPECT_EQ(m.head.n_classes, 0);
  EXPECT_TRUE(m.head.labels.empty());
  EXPECT_TRUE(m.head.tied);
  EXPECT_EQ(m.init.scheme, InitScheme::glorot_normal);
  EXPECT_EQ(m.init.std, 0.02);
  EXPECT_EQ(m.init.seed, 0u);
  EXPECT_EQ(m.weights.file, "");
  EXPECT_TRUE(m.weights.inline_tensors.empty());
  EXPECT_TRUE(m.weights.allow_missing);
  EXPECT_TRUE(e.input.tokens.empty());
  EXPECT_FALSE(e.input.rows.defined());
  EXPECT_TRUE(e.input.ids.empty());
  EXPECT_EQ(e.runtime.threads, 0);
  EXPECT_FALSE(e.runtime.reference);
  EXPECT_EQ(e.bench.batch, 1);
  EXPECT_EQ(e.bench.seq_len, 128);
  EXPECT_EQ(e.bench.warmup, 2);
  EXPECT_EQ(e.bench.reps, 10);
}

TEST(Config, FullFileKeepsWhatIsWrittenAndResolvesTheRest) {
  const Experiment e = load_ok(data("full.yaml"));
  const ModelConfig& m = e.model;
  EXPECT_EQ(m.name, "tiny-gpt");
  EXPECT_EQ(m.arch, Arch::decoder);
  EXPECT_TRUE(m.causal);  // resolved from arch
  EXPECT_EQ(m.d_model, 16);
  EXPECT_EQ(m.n_layers, 2);
  EXPECT_EQ(m.n_heads, 4);
  EXPECT_EQ(m.d_k, 4);
  EXPECT_EQ(m.d_v, 4);
  EXPECT_EQ(m.d_ff, 32);
  EXPECT_EQ(m.activation, Activation::gelu_tanh);
  EXPECT_EQ(m.norm, NormPlacement::pre);
  EXPECT_EQ(m.norm_eps, 1e-6);
  EXPECT_TRUE(m.final_norm);  // resolved from norm: pre
  EXPECT_FALSE(m.bias);
  EXPECT_EQ(m.dtype, DType::bf16);
  EXPECT_EQ(m.attention.scale, 0.5);
  EXPECT_EQ(m.positions.kind, PositionKind::rotary);
  EXPECT_EQ(m.positions.base, 500.0);
  EXPECT_EQ(m.positions.rotary_dims, 2);
  EXPECT_EQ(m.positions.rotary_style, RotaryStyle::interleaved);
  EXPECT_EQ(m.stem.vocab_size, 50);
  EXPECT_EQ(m.stem.scale, EmbedScale::sqrt_d_model);
  EXPECT_EQ(m.head.kind, HeadKind::lm);
  EXPECT_TRUE(m.head.tied);
  EXPECT_EQ(m.init.scheme, InitScheme::normal);
  EXPECT_EQ(m.init.std, 0.01);
  EXPECT_EQ(m.init.seed, 7u);
  EXPECT_EQ(m.weights.file, data("weights/empty.safetensors"));  // absolute
  EXPECT_TRUE(fs::path(m.weights.file).is_absolute());
  EXPECT_FALSE(m.weights.allow_missing);  // resolved: a file is given
  ASSERT_EQ(m.weights.inline_tensors.count("w"), 1u);
  const InlineTensor& w = m.weights.inline_tensors.at("w");
  EXPECT_EQ(w.value.shape(), Shape({2, 2}));
  EXPECT_EQ(w.value.to_vector(), (std::vector<float>{1, 0, 0, 1}));
  EXPECT_EQ(w.where.line, 34);
  EXPECT_EQ(w.where.col, 7);
  EXPECT_EQ(e.input.tokens, (std::vector<std::string>{"the", "cat", "sat"}));
  EXPECT_EQ(e.input.ids, (std::vector<int32_t>{1, 2, 49}));
  EXPECT_EQ(e.runtime.threads, 2);
  EXPECT_TRUE(e.runtime.reference);
  EXPECT_EQ(e.bench.batch, 4);
  EXPECT_EQ(e.bench.seq_len, 128);
  EXPECT_EQ(e.bench.warmup, 1);
  EXPECT_EQ(e.bench.reps, 3);
}

TEST(Config, LocationsOfWrittenKeysAndNearestAncestor) {
  const Experiment e = load_ok(data("full.yaml"));
  const std::string file = data("full.yaml");
  auto at = [&](const std::string& key) {
    const Location l = e.where(key);
    return l.file + ":" + std::to_string(l.line) + ":" + std::to_string(l.col);
  };
  EXPECT_EQ(at("model"), file + ":2:1");
  EXPECT_EQ(at("model.d_model"), file + ":5:3");
  EXPECT_EQ(at("model.positions.rotary_dims"), file + ":19:5");
  EXPECT_EQ(at("model.weights.inline.w"), file + ":34:7");
  EXPECT_EQ(at("model.positions.max_distance"), file + ":16:3");  // not written: `positions:`
  EXPECT_EQ(at("model.d_k"), file + ":2:1");                      // not written: `model:`
  EXPECT_EQ(at("bench.seq_len"), file + ":41:1");
  EXPECT_EQ(e.model.weights.file_where.line, 32);
  EXPECT_EQ(e.input.where.line, 35);
  EXPECT_EQ(e.locations.count("model.d_k"), 0u);
  EXPECT_EQ(e.locations.count("model.head.kind"), 1u);
  const Experiment blank;  // a named object: GCC 12 warns (maybe-uninitialized) about a temporary here
  const Location none = blank.where("model.d_model");
  EXPECT_EQ(none.line, 0);
}

TEST(Config, InlineExpressionsAreExactInF32) {
  const Experiment e = load_ok(data("teaching.yaml"));
  const Tensor& w_q = e.model.weights.inline_tensors.at("w_q").value;
  EXPECT_EQ(w_q.shape(), Shape({3, 1}));
  EXPECT_EQ(w_q.to_vector(), (std::vector<float>{0.0f, static_cast<float>(std::log(2.0)), 0.0f}));
  const Tensor& b = e.model.weights.inline_tensors.at("b").value;
  EXPECT_EQ(b.shape(), Shape({3}));
  EXPECT_EQ(b.to_vector(),
            (std::vector<float>{0.25f, static_cast<float>(-std::sqrt(2.0) / 2), static_cast<float>(std::exp(1.0))}));
  EXPECT_EQ(e.input.rows.shape(), Shape({3, 3}));
  EXPECT_EQ(e.input.rows.to_vector(),
            (std::vector<float>{1, 0, 0, 0, 1, 0, 0.5f, 0.5f, static_cast<float>(3.14159265358979323846)}));
  EXPECT_EQ(e.input.tokens, (std::vector<std::string>{"red", "ball", "rolls"}));
}

TEST(Config, ExpressionGrammar) {
  const Experiment e = load_text_ok(
      "model:\n  d_model: 2\n  stem: {kind: identity}\n  weights:\n    inline:\n"
      "      v: [2 * (1 + 3) / 4, -(-1), +3, 1e-3, .5, 2e1, e, log(e), sqrt(16) - exp(0), \"  1 / 8 \"]\n");
  EXPECT_EQ(e.model.weights.inline_tensors.at("v").value.to_vector(),
            (std::vector<float>{2, 1, 3, 1e-3f, 0.5f, 20, static_cast<float>(std::exp(1.0)), 1, 3, 0.125f}));
}

// ---------------------------------------------------------------------------------------------
// Diagnostics.

std::string one(const std::string& file, int line, int col, const std::string& key, const std::string& problem,
                const std::string& hint) {
  Diagnostic d;
  d.where.file = file;
  d.where.line = line;
  d.where.col = col;
  d.key = key;
  d.problem = problem;
  d.hint = hint;
  return d.str();
}

TEST(Config, DiagnosticFormat) {
  EXPECT_EQ(one("a.yaml", 3, 7, "model.d_k", "must be > 0, found 0", ""), "a.yaml:3:7: model.d_k: must be > 0, found 0");
  EXPECT_EQ(one("a.yaml", 3, 7, "model.d_k", "must be > 0, found 0", "say why"),
            "a.yaml:3:7: model.d_k: must be > 0, found 0 (say why)");
  EXPECT_EQ(one("a.yaml", 1, 2, "", "YAML syntax error: x", ""), "a.yaml:1:2: YAML syntax error: x");
  EXPECT_EQ(one("a.yaml", 0, 0, "", "cannot read file", ""), "a.yaml: cannot read file");
  EXPECT_EQ(one("--set model.x=1", 0, 7, "model.x", "unknown key", ""),
            "--set model.x=1, column 7: model.x: unknown key");
  EXPECT_EQ(one("--set model", 0, 0, "", "expected key.path=value", ""),
            "--set model: expected key.path=value");

  Diagnostics d;
  d.add({"b.yaml", 1, 1}, "k", "four");
  d.add({"a.yaml", 9, 1}, "k", "two");
  d.add({"a.yaml", 2, 5}, "k", "one");
  d.add({"b.yaml", 1, 1}, "k", "five");  // same place: kept in the order added
  d.add({"a.yaml", 9, 3}, "k", "three");
  EXPECT_EQ(d.size(), 5u);
  EXPECT_EQ(d.items()[0].problem, "four");
  EXPECT_EQ(d.str(),
            "a.yaml:2:5: k: one\na.yaml:9:1: k: two\na.yaml:9:3: k: three\nb.yaml:1:1: k: four\nb.yaml:1:1: k: five");
}

TEST(Config, ErrorYamlSyntax) {
  EXPECT_EQ(errors("model:\n  d_model: [8\n  n_heads: 2\n"), "t.yaml:3:10: YAML syntax error: end of sequence flow not found");
  EXPECT_EQ(errors("model: {d_model: 8\n"), "t.yaml:2:1: YAML syntax error: end of map flow not found");
}

TEST(Config, ErrorTopLevel) {
  EXPECT_EQ(errors("- model\n"), "t.yaml:1:1: expected a mapping of keys (model:, input:, ...), found a list");
  EXPECT_EQ(errors(""), "t.yaml:1:1: model: required key is missing (an experiment needs a `model:` mapping)");
  EXPECT_EQ(errors("runtime: {threads: 1}\n"),
            "t.yaml:1:1: model: required key is missing (an experiment needs a `model:` mapping)");
  EXPECT_EQ(errors(kModel + "a: 1\n---\nb: 2\n"),
            "t.yaml:4:1: a: unknown key (valid top-level keys: model, input, runtime, plugins, data, task, outputs, bench, train)\n"
            "t.yaml:6:1: a second YAML document (after ---); a config file holds one "
            "(remove the `---` line and what follows, or split the file)");
}

TEST(Config, ErrorUnknownKeys) {
  EXPECT_EQ(errors(kModel + "  d_modle: 8\n"), "t.yaml:4:3: model.d_modle: unknown key (did you mean `d_model`?)");
  EXPECT_EQ(errors(kModel + "  nheads: 8\n"), "t.yaml:4:3: model.nheads: unknown key (did you mean `n_heads`?)");
  EXPECT_EQ(errors(kModel + "  max_len: 8\n"),
            "t.yaml:4:3: model.max_len: unknown key (did you mean `model.positions.max_len`?)");
  EXPECT_EQ(errors("model:\n  d_model: 8\n  stem: {vocab_size: 10, colour: red}\n"),
            "t.yaml:3:26: model.stem.colour: unknown key "
            "(valid keys in model.stem: kind, vocab_size, n_features, cls, scale, token_types, norm, dist, token_dropout, "
            "mask_id, modalities)");
  EXPECT_EQ(errors(kModel + "runtim: {threads: 1}\n"), "t.yaml:4:1: runtim: unknown key (did you mean `runtime`?)");
  EXPECT_EQ(errors(kModel + "runtime: {include: x.yaml}\n"),
            "t.yaml:4:11: runtime.include: unknown key (valid keys in runtime: threads, reference, batch_size, packing, workers, "
            "isolate, item_timeout_s, worker_memory_mb, max_item_bytes, max_item_rows)");
}

TEST(Config, ErrorWrongTypes) {
  EXPECT_EQ(errors("model:\n  d_model: abc\n  stem: {vocab_size: 10}\n"),
            "t.yaml:2:12: model.d_model: expected int, found abc");
  EXPECT_EQ(errors("model:\n  d_model: \"8\"\n  stem: {vocab_size: 10}\n"),
            "t.yaml:2:12: model.d_model: expected int, found \"8\"");
  EXPECT_EQ(errors("model:\n  d_model: 8.0\n  stem: {vocab_size: 10}\n"),
            "t.yaml:2:12: model.d_model: expected int, found 8.0");
  EXPECT_EQ(errors("model:\n  d_model:\n  stem: {vocab_size: 10}\n"),
            "t.yaml:2:3: model.d_model: expected int, found null");
  EXPECT_EQ(errors(kModel + "  norm_eps: tiny\n"), "t.yaml:4:13: model.norm_eps: expected float, found tiny");
  EXPECT_EQ(errors(kModel + "  bias: yes\n"), "t.yaml:4:9: model.bias: expected bool (true or false), found yes");
  EXPECT_EQ(errors(kModel + "  name: [a, b]\n"), "t.yaml:4:9: model.name: expected string, found a list");
  EXPECT_EQ(errors(kModel + "  positions: rotary\n"), "t.yaml:4:14: model.positions: expected a mapping, found rotary");
  EXPECT_EQ(errors(kModel + "  attention: {scale: fast}\n"),
            "t.yaml:4:22: model.attention.scale: expected a float > 0 or auto, found fast");
  EXPECT_EQ(errors(kModel + "  head: {labels: [a, [b]]}\n"),
            "t.yaml:4:22: model.head.labels: entry 1: expected string, found a list");
  EXPECT_EQ(errors(kModel + "input: {ids: 3}\n"), "t.yaml:4:14: input.ids: expected a list of ints, found 3");
  EXPECT_EQ(errors(kModel + "input: {tokens: red}\n"),
            "t.yaml:4:17: input.tokens: expected a list of strings, found red");
}

TEST(Config, ErrorOutOfRange) {
  EXPECT_EQ(errors("model:\n  d_model: 0\n  stem: {vocab_size: 10}\n"), "t.yaml:2:12: model.d_model: must be > 0, found 0");
  EXPECT_EQ(errors(kModel + "  n_layers: 0\n"), "t.yaml:4:13: model.n_layers: must be >= 1, found 0");
  EXPECT_EQ(errors(kModel + "  d_ff: -1\n"), "t.yaml:4:9: model.d_ff: must be >= 0, found -1");
  EXPECT_EQ(errors(kModel + "  norm_eps: 0\n"), "t.yaml:4:13: model.norm_eps: must be > 0, found 0");
  EXPECT_EQ(errors(kModel + "  norm_eps: .inf\n"), "t.yaml:4:13: model.norm_eps: must be a finite number, found .inf");
  EXPECT_EQ(errors(kModel + "  attention: {scale: -2}\n"), "t.yaml:4:22: model.attention.scale: must be > 0, found -2");
  EXPECT_EQ(errors(kModel + "  init: {seed: -1}\n"), "t.yaml:4:16: model.init.seed: must be >= 0, found -1");
  EXPECT_EQ(
      errors(kModel + "runtime: {threads: 3000000000}\n"),
      "t.yaml:4:20: runtime.threads: 3000000000 is more than the limit 1024 (more threads than any machine "
      "has cores; the OpenMP runtime crashes when it cannot start them)");
  EXPECT_EQ(
      errors(kModel + "  n_layers: 99999999999999999999\n"),
      "t.yaml:4:13: model.n_layers: 99999999999999999999 is more than the limit 4096 (over 30 times the "
      "deepest published transformer)");
  EXPECT_EQ(errors(kModel + "  init: {seed: 99999999999999999999}\n"),
            "t.yaml:4:16: model.init.seed: 99999999999999999999 is more than the limit 9223372036854775807");
  EXPECT_EQ(errors(kModel + "input: {ids: [1, -2]}\n"), "t.yaml:4:18: input.ids: entry 1: must be >= 0, found -2");
}

// Every size has an upper bound (tessera/config.h, limits) that keeps the products formed from it
// inside 64 bits: before the bounds, vocab_size or positions.max_len 2^62 wrapped the table's size
// around to a few bytes and `forward` read out of bounds, d_ff 2^62 raised SIGFPE in oneDNN,
// runtime.threads 100000 crashed libgomp and d_model 2^31 aborted. Each refusal names the file,
// line:col, the key, the value and the limit, and says why.
TEST(Config, SizeLimits) {
  const std::string huge = "4611686018427387904";  // 2^62
  struct Case {
    std::string section, key, yaml_key;  // under model: (section "model"), or a top-level section
    int64_t limit;
  };
  const std::vector<Case> cases = {
      {"model", "model.d_model", "d_model", limits::kWidth},
      {"model", "model.n_layers", "n_layers", limits::kLayers},
      {"model", "model.n_heads", "n_heads", limits::kHeads},
      {"model", "model.d_k", "d_k", limits::kWidth},
      {"model", "model.d_v", "d_v", limits::kWidth},
      {"model", "model.d_ff", "d_ff", limits::kHidden},
      {"model.positions", "model.positions.max_len", "max_len", limits::kSequence},
      {"model.positions", "model.positions.max_distance", "max_distance", limits::kDistance},
      {"model.positions", "model.positions.rotary_dims", "rotary_dims", limits::kWidth},
      {"model.stem", "model.stem.vocab_size", "vocab_size", limits::kVocab},
      {"model.stem", "model.stem.n_features", "n_features", limits::kHidden},
      {"model.stem", "model.stem.token_types", "token_types", limits::kTable},
      {"model.stem", "model.stem.modalities", "modalities", limits::kTable},
      {"model.stem", "model.stem.mask_id", "mask_id", limits::kVocab},
      {"model.head", "model.head.n_classes", "n_classes", limits::kVocab},
      {"runtime", "runtime.threads", "threads", limits::kThreads},
      {"runtime", "runtime.batch_size", "batch_size", limits::kBatch},
      {"runtime", "runtime.workers", "workers", limits::kThreads},
      {"task", "task.top_k", "top_k", limits::kVocab},
      {"task.generate", "task.generate.max_new_tokens", "max_new_tokens", limits::kSequence},
      {"task.generate", "task.generate.top_k", "top_k", limits::kVocab},
      {"bench", "bench.batch", "batch", limits::kBatch},
      {"bench", "bench.seq_len", "seq_len", limits::kSequence},
      {"bench", "bench.warmup", "warmup", limits::kRepeats},
      {"bench", "bench.reps", "reps", limits::kRepeats},
      {"train", "train.epochs", "epochs", limits::kEpochs},
      {"train", "train.max_steps", "max_steps", limits::kSteps},
      {"train", "train.batch_size", "batch_size", limits::kBatch},
      {"train", "train.accumulate", "accumulate", limits::kBatch},
      {"train", "train.seq_len", "seq_len", limits::kSequence},
      {"train", "train.warmup_steps", "warmup_steps", limits::kSteps},
      {"train", "train.eval_every", "eval_every", limits::kSteps},
      {"train", "train.patience", "patience", limits::kKeep},
      {"train", "train.keep", "keep", limits::kKeep},
      {"train", "train.log_every", "log_every", limits::kSteps},
      {"train", "train.window", "window", limits::kSequence},
      {"train", "train.mask_id", "mask_id", limits::kVocab},
  };
  for (const Case& c : cases) {
    // The section written in flow style on line 4 (or the key under model:), the value at a known column.
    std::string line, yaml = kModel;
    if (c.key == "model.d_model") {
      yaml = "model:\n  n_heads: 1\n  stem: {vocab_size: 10}\n";
      line = "  d_model: ";
    } else if (c.section == "model") {
      line = "  " + c.yaml_key + ": ";
    } else if (c.section == "model.stem") {
      yaml = "model:\n  d_model: 8\n  n_heads: 1\n";
      line = std::string("  stem: {") + (c.yaml_key == "vocab_size" ? "" : "vocab_size: 10, ") + c.yaml_key +
             ": ";
    } else if (c.section.rfind("model.", 0) == 0) {
      line = "  " + c.section.substr(6) + ": {" + c.yaml_key + ": ";
    } else if (c.section == "task.generate") {
      line = "task: {generate: {" + c.yaml_key + ": ";
    } else {
      line = c.section + ": {" + c.yaml_key + ": ";
    }
    const int col = static_cast<int>(line.size()) + 1;
    line += huge + (c.section == "task.generate" ? "}}" : c.section == "model" ? "" : "}") + "\n";
    const std::string err = errors(yaml + line);
    const std::string want = "t.yaml:4:" + std::to_string(col) + ": " + c.key + ": " + huge +
                             " is more than the limit " + std::to_string(c.limit) + " (";
    EXPECT_NE(err.find(want), std::string::npos) << c.key << ":\n" << err;
    // The limit is exact: one more is refused too.
    const std::string over_by_one =
        errors(yaml + line.replace(static_cast<size_t>(col - 1), huge.size(), std::to_string(c.limit + 1)));
    EXPECT_NE(over_by_one.find(": " + std::to_string(c.limit + 1) + " is more than the limit " +
                               std::to_string(c.limit)),
              std::string::npos)
        << c.key << ":\n"
        << over_by_one;
  }
  // Lists of sizes: each entry.
  EXPECT_EQ(errors(kModel + "task: {attention: {layers: [0, " + huge + "]}}\n"),
            "t.yaml:4:32: task.attention.layers: entry 1: " + huge +
                " is more than the limit 4096 (over 30 times "
                "the deepest published transformer)");
  EXPECT_EQ(errors(kModel + "task: {generate: {stop_ids: [" + huge + "]}}\n"),
            "t.yaml:4:30: task.generate.stop_ids: entry 0: " + huge +
                " is more than the limit 16777216 (token ids "
                "are 32-bit, and 2^24 is 64 times the largest published vocabulary)");
  // --set and the command line's options that become --set (tessera run --batch-size) alike.
  EXPECT_EQ(
      errors(kModel, {"runtime.batch_size=9223372036854775807"}),
      "--set runtime.batch_size=9223372036854775807, column 20: runtime.batch_size: 9223372036854775807 is "
      "more than the limit 65536 (2^16 sequences per batch)");
  EXPECT_EQ(errors(kModel, {"model.stem.vocab_size=" + huge}),
            "--set model.stem.vocab_size=" + huge + ", column 23: model.stem.vocab_size: " + huge +
                " is more than the limit 16777216 (token ids are 32-bit, and 2^24 is 64 times the largest "
                "published vocabulary)");
  // At the limits, a model loads (its memory is the memory plan's business, not the config's).
  Diagnostics diags;
  EXPECT_TRUE(
      load_text("model:\n  d_model: 65536\n  n_heads: 64\n  d_ff: 1048576\n  stem: {vocab_size: 16777216}\n"
                "  positions: {kind: learned, max_len: 1048576}\nruntime: {threads: 1024}\n",
                &diags)
          .has_value())
      << diags.str();
}

// Products of sizes: the heads side by side, and the parameter count (added up without
// overflowing), each inside its limit.
TEST(Config, SizeProducts) {
  EXPECT_EQ(
      errors("model:\n  d_model: 64\n  n_heads: 4096\n  d_k: 4096\n  d_v: 16\n  stem: {vocab_size: 10}\n"),
      "t.yaml:4:3: model.d_k: n_heads * d_k is 16777216, more than the limit 1048576 for the heads side by "
      "side (fewer heads, or narrower ones)");
  EXPECT_EQ(
      errors("model:\n  d_model: 65536\n  n_heads: 64\n  d_ff: 1048576\n  n_layers: 4096\n"
             "  stem: {vocab_size: 10}\n"),
      "t.yaml:1:1: model: the model has more than 4398046511104 parameters (2^42, the limit; "
      "blocks.28.ffn.w1 "
      "(65536, 1048576) alone has 68719476736) (make it smaller: d_model, d_ff, n_layers or the vocabulary)");
}

// A config is UTF-8: a byte that is not part of a valid UTF-8 character is refused with the file,
// line:col (in characters) and byte offset. Before, `caf\xE9` (Latin-1) was accepted as a name, a
// path or a plugin option and passed on as it was.
TEST(Config, NotUtf8) {
  EXPECT_EQ(
      errors("model:\n  name: \"caf\xE9\"\n  d_model: 8\n  stem: {vocab_size: 10}\n"),
      "t.yaml:2:13: not UTF-8: the byte 0xE9 at byte offset 19 is not part of a valid UTF-8 character (a "
      "config file must be UTF-8; convert it, e.g. with `iconv -f latin1 -t utf-8`)");
  // Columns count characters: the two-byte é before the bad byte is one column.
  EXPECT_EQ(errors("model:\n  name: \"\xC3\xA9\xFF\"\n").substr(0, 66),
            "t.yaml:2:11: not UTF-8: the byte 0xFF at byte offset 18 is not par");
  // Overlong forms, surrogates, code points above U+10FFFF and a sequence cut short at the end.
  for (const std::string bad : {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82"}) {
    const std::string err = errors(kModel + "# " + bad);
    EXPECT_EQ(err.rfind("t.yaml:4:3: not UTF-8: the byte ", 0), 0u) << err;
  }
  // --set values too: the column in the argument.
  EXPECT_EQ(errors(kModel, {"model.name=caf\xE9"})
                .rfind("--set model.name=caf\xE9, column 15: not UTF-8: the byte 0xE9 at byte offset 3 is "
                       "not part of a",
                       0),
            0u);
  // Valid UTF-8 (a byte-order mark, two- to four-byte characters) loads.
  Diagnostics diags;
  const std::optional<Experiment> ok = load_text(
      "\xEF\xBB\xBFmodel:\n  name: \"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"\n  d_model: 8\n"
      "  stem: {vocab_size: 10}\n",
      &diags);
  ASSERT_TRUE(ok.has_value()) << diags.str();
  EXPECT_EQ(ok->model.name, "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  // A file: its name in the message.
  const std::string path = ::testing::TempDir() + "latin1_" + std::to_string(getpid()) + ".yaml";
  std::ofstream(path) << kModel << "  name: caf\xE9\n";
  EXPECT_EQ(file_errors(path),
            path +
                ":4:12: not UTF-8: the byte 0xE9 at byte offset 56 is not part of a valid "
                "UTF-8 character (a config file must be UTF-8; convert it, e.g. with `iconv "
                "-f latin1 -t utf-8`)");
  std::remove(path.c_str());
}

TEST(Config, ErrorEnumValues) {
  EXPECT_EQ(errors(kModel + "  activation: gleu\n"),
            "t.yaml:4:15: model.activation: expected one of relu, gelu, gelu_tanh, found gleu (did you mean `gelu`?)");
  EXPECT_EQ(errors(kModel + "  positions: {kind: alibi}\n"),
            "t.yaml:4:21: model.positions.kind: expected one of none, sinusoidal, learned, relative, rotary, found alibi");
  EXPECT_EQ(errors(kModel + "  init: {scheme: xavier}\n"),
            "t.yaml:4:18: model.init.scheme: expected one of glorot_normal, glorot_uniform, he_normal, normal, zeros, "
            "found xavier");
}

TEST(Config, ErrorMissingRequiredKeys) {
  EXPECT_EQ(errors("model:\n  n_heads: 2\n  stem: {vocab_size: 10}\n"),
            "t.yaml:1:1: model.d_model: required key is missing (add `d_model: <int>` under `model:`)");
  EXPECT_EQ(errors("model:\n  d_model: 8\n"),
            "t.yaml:1:1: model.stem.vocab_size: required key is missing (stem.kind is tokens) "
            "(add `vocab_size: <int>` under `model.stem:`)");
  EXPECT_EQ(errors("model:\n  d_model: 8\n  stem:\n    kind: features\n"),
            "t.yaml:3:3: model.stem.n_features: required key is missing (stem.kind is features) "
            "(add `n_features: <int>` under `model.stem:`)");
  EXPECT_EQ(errors(kModel + "  head:\n    kind: classifier\n"),
            "t.yaml:4:3: model.head.n_classes: required key is missing (head.kind is classifier) "
            "(add `n_classes: <int>` under `model.head:`)");
  // null stands for "not given" in a key whose default is none.
  EXPECT_EQ(errors("model:\n  d_model: 8\n  stem: {vocab_size: null}\n"),
            "t.yaml:3:10: model.stem.vocab_size: required key is missing (stem.kind is tokens) "
            "(add `vocab_size: <int>` under `model.stem:`)");
}

TEST(Config, ErrorInconsistentValues) {
  EXPECT_EQ(errors("model:\n  d_model: 768\n  n_heads: 5\n  stem: {vocab_size: 10}\n"),
            "t.yaml:3:3: model.n_heads: n_heads (5) does not divide d_model (768) "
            "(choose n_heads dividing d_model, or set d_k and d_v explicitly)");
  EXPECT_EQ(errors("model:\n  d_model: 768\n  n_heads: 5\n  d_k: 64\n  stem: {vocab_size: 10}\n"),
            "t.yaml:3:3: model.n_heads: n_heads (5) does not divide d_model (768) "
            "(choose n_heads dividing d_model, or set d_k and d_v explicitly)");
  EXPECT_EQ(errors(kModel + "  norm: none\n  final_norm: true\n"),
            "t.yaml:5:3: model.final_norm: final_norm: true needs a norm, but norm is none "
            "(set norm: pre or post, or final_norm: false)");
  EXPECT_EQ(errors(kModel + "  norm: pre\n  residual: false\n"),
            "t.yaml:5:3: model.residual: residual: false with norm: pre, but a pre-LN block is built around "
            "its residual stream (R = X + MultiHead(LN1(X)), Y = R + FFN(LN2(R))) and always adds it "
            "(keep residual: true with norm: pre, or use norm: post or none for blocks without residuals)");
  EXPECT_EQ(errors(kModel + "  n_heads: 2\n  d_v: 3\n  attention: {output_projection: false}\n"),
            "t.yaml:6:15: model.attention.output_projection: output_projection: false leaves the heads 6 wide "
            "(n_heads * d_v), but d_model is 8 (keep output_projection: true, or make n_heads * d_v = d_model; "
            "only a single layer with residual: false and head.kind: none may end at another width)");
  EXPECT_EQ(errors("model:\n  d_model: 10\n  n_heads: 2\n  stem: {vocab_size: 10}\n  positions: {kind: rotary}\n"),
            "t.yaml:5:15: model.positions.kind: rotary positions need an even d_k, but d_k is 5 "
            "(choose n_heads so that d_model / n_heads is even, or set an even d_k)");
  EXPECT_EQ(errors(kModel + "  n_heads: 2\n  positions: {kind: rotary, rotary_dims: 6}\n"),
            "t.yaml:5:29: model.positions.rotary_dims: rotary_dims (6) must be even and at most d_k (4)");
  EXPECT_EQ(errors(kModel + "  positions: {kind: rotary, rotary_dims: 3}\n"),
            "t.yaml:4:29: model.positions.rotary_dims: rotary_dims (3) must be even and at most d_k (8)");
  EXPECT_EQ(errors("model:\n  d_model: 8\n  stem: {vocab_size: 10, cls: true}\n"),
            "t.yaml:3:26: model.stem.cls: cls: true needs stem.kind features or mixed, but stem.kind is tokens "
            "(set cls: false, or stem.kind: features)");
  EXPECT_EQ(errors(kModel + "  head: {kind: pool, pool: cls}\n"),
            "t.yaml:4:22: model.head.pool: pool: cls needs stem.cls: true (set pool: mean or last, or stem.cls: true)");
  EXPECT_EQ(errors(kModel + "  head: {kind: classifier, n_classes: 3, labels: [cat, dog]}\n"),
            "t.yaml:4:42: model.head.labels: 2 labels for n_classes 3 (give one label per class, or none)");
  EXPECT_EQ(errors(kModel + "  head: {kind: pool, labels: [cat, dog]}\n"),
            "t.yaml:4:22: model.head.labels: labels name the classes of a classifier head, but head.kind is pool "
            "(set head.kind: classifier and n_classes, or remove labels)");
  EXPECT_EQ(errors("model:\n  d_model: 8\n  stem: {kind: features, n_features: 3}\n  head: {kind: lm}\n"),
            "t.yaml:4:3: model.head.tied: tied: true needs stem.kind tokens or mixed (the logits reuse the token "
            "embedding table), but stem.kind is features (set head.tied: false)");
}

TEST(Config, ValidCombinationsThatLookUnusual) {
  // output_projection: false is fine when the heads fill d_model, or for one bare layer.
  load_text_ok(kModel + "  n_heads: 2\n  attention: {output_projection: false}\n");
  load_text_ok(kModel + "  n_heads: 2\n  d_v: 3\n  residual: false\n  attention: {output_projection: false}\n");
  // d_k and d_v given: n_heads need not divide d_model.
  const Experiment e = load_text_ok("model:\n  d_model: 10\n  n_heads: 3\n  d_k: 4\n  d_v: 4\n  stem: {vocab_size: 5}\n");
  EXPECT_EQ(e.model.d_k, 4);
  EXPECT_EQ(e.model.attention.scale, 0.5);
  // A CLS row makes cls the default pool; features with an untied lm head.
  const Experiment f = load_text_ok(
      "model:\n  d_model: 4\n  stem: {kind: features, n_features: 2, cls: true}\n  head: {kind: lm, tied: false}\n"
      "input:\n  rows: [[1, 2], [3, 4]]\n  tokens: [a, b]\n");
  EXPECT_EQ(f.model.head.pool, PoolKind::cls);
  EXPECT_EQ(f.input.rows.shape(), Shape({2, 2}));
  // Empty sections, and an attention scale of auto.
  const Experiment g = load_text_ok(kModel + "  attention: {scale: auto}\nruntime:\nbench:\n");
  EXPECT_EQ(g.model.attention.scale, 1.0 / std::sqrt(8.0));
  EXPECT_EQ(g.bench.seq_len, 128);
  EXPECT_EQ(load_text_ok(kModel + "  positions: {max_len: 20}\n").bench.seq_len, 20);
}

TEST(Config, ErrorWeightsFile) {
  EXPECT_EQ(errors(kModel + "  weights: {file: nope.safetensors}\n"),
            "t.yaml:4:13: model.weights.file: file not found: " + data("nope.safetensors") +
                " (a relative path is resolved against the directory of the YAML file that names it)");
  EXPECT_EQ(errors(kModel + "  weights: {file: weights}\n"),
            "t.yaml:4:13: model.weights.file: not a regular file: " + data("weights"));
  const Experiment e = load_text_ok(kModel + "  weights: {file: weights/empty.safetensors, allow_missing: true}\n");
  EXPECT_EQ(e.model.weights.file, data("weights/empty.safetensors"));
  EXPECT_TRUE(e.model.weights.allow_missing);
  EXPECT_TRUE(e.model.weights.ignore.empty());
  // model.weights.ignore: a list of names or prefixes, kept with its place for the weights' messages.
  const Experiment i = load_text_ok(kModel + "  weights: {file: weights/empty.safetensors, ignore: [head, blocks.1]}\n");
  EXPECT_EQ(i.model.weights.ignore, (std::vector<std::string>{"head", "blocks.1"}));
  EXPECT_EQ(i.model.weights.ignore_where.line, 4);
  EXPECT_TRUE(i.model.weights.ignored("head.transform.w"));
  EXPECT_TRUE(i.model.weights.ignored("blocks.1"));
  EXPECT_FALSE(i.model.weights.ignored("blocks.10.ffn.w1"));
  EXPECT_FALSE(i.model.weights.ignored("heads.w"));
  EXPECT_EQ(errors(kModel + "  weights: {ignore: head}\n"),
            "t.yaml:4:21: model.weights.ignore: expected a list of strings, found head");
}

TEST(Config, ErrorInput) {
  EXPECT_EQ(errors(kModel + "input:\n  rows: [[1]]\n  ids: [1]\n"),
            "t.yaml:5:3: input.rows: stem.kind tokens takes input.ids, not input.rows "
            "(give token ids, or set stem.kind: features or identity)\n"
            "t.yaml:6:3: input.ids: input.rows and input.ids are both given "
            "(give input.ids for stem.kind tokens, input.rows for stem.kind features or identity)");
  EXPECT_EQ(errors(kModel + "input:\n  tokens: [a, b]\n  ids: [1, 2, 3]\n"),
            "t.yaml:5:3: input.tokens: 2 tokens for 3 ids (give one token label per input row)");
  EXPECT_EQ(errors(kModel + "input:\n  ids: [1, 10, 3, 12]\n"),
            "t.yaml:5:12: input.ids: entry 1: id 10 is outside the vocabulary (stem.vocab_size is 10) "
            "(ids must be in [0, vocab_size))\n"
            "t.yaml:5:19: input.ids: entry 3: id 12 is outside the vocabulary (stem.vocab_size is 10) "
            "(ids must be in [0, vocab_size))");
  const std::string features = "model:\n  d_model: 8\n  stem: {kind: features, n_features: 2}\n";
  EXPECT_EQ(errors(features + "input:\n  ids: [1]\n"),
            "t.yaml:5:3: input.ids: stem.kind features takes input.rows, not input.ids "
            "(give feature rows, or set stem.kind: tokens)");
  EXPECT_EQ(errors(features + "input:\n  rows: [[1, 2, 3]]\n"),
            "t.yaml:5:3: input.rows: rows are 3 wide, but stem.n_features is 2");
  EXPECT_EQ(errors("model:\n  d_model: 2\n  stem: {kind: identity}\ninput:\n  tokens: [a, b]\n  rows: [[1, 2, 3]]\n"),
            "t.yaml:5:3: input.tokens: 2 tokens for 1 row (give one token label per input row)\n"
            "t.yaml:6:3: input.rows: rows are 3 wide, but d_model is 2 (stem.kind identity passes rows through unchanged)");
}

TEST(Config, ErrorMatrices) {
  const std::string m = "model:\n  d_model: 3\n  stem: {kind: identity}\n";
  EXPECT_EQ(errors(m + "input:\n  rows:\n    - [1, 2, 3]\n    - [4, 5]\n    - [6, 7, 8, 9]\n"),
            "t.yaml:7:7: input.rows: row 1 has 2 values, but row 0 has 3 (every row of a matrix must have the same length)\n"
            "t.yaml:8:7: input.rows: row 2 has 4 values, but row 0 has 3 (every row of a matrix must have the same length)");
  EXPECT_EQ(errors(m + "input:\n  rows: [1, 2, 3]\n"),
            "t.yaml:5:10: input.rows: row 0: expected a list of numbers, found 1");
  EXPECT_EQ(errors(m + "input:\n  rows: [[1, 2, 3], 4]\n"),
            "t.yaml:5:21: input.rows: row 1: expected a list of numbers, found 4 "
            "(a matrix is a list of rows, every row a list of numbers)");
  EXPECT_EQ(errors(m + "input:\n  rows: [[1, 2, 3], []]\n"), "t.yaml:5:21: input.rows: row 1 is empty");
  EXPECT_EQ(errors(m + "input:\n  rows: []\n"),
            "t.yaml:5:9: input.rows: expected a matrix (a list of rows of numbers), found an empty list");
  EXPECT_EQ(errors(m + "  weights:\n    inline:\n      a: {x: 1}\n      b: [1, [2]]\n"),
            "t.yaml:6:10: model.weights.inline.a: expected a matrix or a vector (a list of rows, or of numbers), "
            "found a mapping\n"
            "t.yaml:7:14: model.weights.inline.b: entry [1]: expected a number, found a list");
  EXPECT_EQ(errors(m + "  weights: {inline: [1, 2]}\n"),
            "t.yaml:4:21: model.weights.inline: expected a mapping of tensor names to matrices or vectors, found a list");
}

TEST(Config, ErrorBadExpressions) {
  const std::string m = "model:\n  d_model: 3\n  stem: {kind: identity}\n  weights:\n    inline:\n";
  EXPECT_EQ(errors(m + "      w_q: [[0], [ln(2], [0]]\n"),
            "t.yaml:6:23: model.weights.inline.w_q: entry [1][0]: bad expression \"ln(2\": expected ')'");
  // Quoted: the column counts the quote.
  EXPECT_EQ(errors(m + "      b: [1, \"2 * foo(1)\"]\n"),
            "t.yaml:6:19: model.weights.inline.b: entry [1]: bad expression \"2 * foo(1)\": "
            "unknown name 'foo' (known: pi, e, ln, log, exp, sqrt)");
  EXPECT_EQ(errors(m + "      b: [1/0]\n"),
            "t.yaml:6:11: model.weights.inline.b: entry [0]: bad expression \"1/0\": the value is not finite");
  EXPECT_EQ(errors(m + "      b: [sqrt(-1)]\n"),
            "t.yaml:6:11: model.weights.inline.b: entry [0]: bad expression \"sqrt(-1)\": the value is not finite");
  EXPECT_EQ(errors(m + "      b: [1e39]\n"),
            "t.yaml:6:11: model.weights.inline.b: entry [0]: bad expression \"1e39\": the value is outside the f32 range");
  EXPECT_EQ(errors(m + "      b: [2 3]\n"),
            "t.yaml:6:13: model.weights.inline.b: entry [0]: bad expression \"2 3\": unexpected '3'");
  EXPECT_EQ(errors(m + "      b: [true]\n"),
            "t.yaml:6:11: model.weights.inline.b: entry [0]: bad expression \"true\": "
            "unknown name 'true' (known: pi, e, ln, log, exp, sqrt)");
  EXPECT_EQ(errors(m + "      b: [sqrt 2]\n"),
            "t.yaml:6:16: model.weights.inline.b: entry [0]: bad expression \"sqrt 2\": expected '(' after sqrt");
  EXPECT_EQ(errors(m + "      b: [\"\"]\n"),
            "t.yaml:6:12: model.weights.inline.b: entry [0]: bad expression \"\": expected a number");
  // Deep parentheses are an error, not a stack overflow.
  const std::string deep = std::string(100000, '(') + "1" + std::string(100000, ')');
  EXPECT_EQ(errors(m + "      b: [\"" + deep + "\"]\n"),
            "t.yaml:6:76: model.weights.inline.b: entry [0]: bad expression \"" + std::string(40, '(') +
                "...\": nested more than 64 deep");
}

TEST(Config, ErrorDuplicateKeys) {
  EXPECT_EQ(errors("model:\n  d_model: 8\n  d_model: 9\n  stem: {vocab_size: 10, vocab_size: 11}\n"),
            "t.yaml:3:3: model.d_model: duplicate key (first written at 2:3) (remove one of them)\n"
            "t.yaml:4:26: model.stem.vocab_size: duplicate key (first written at 4:10) (remove one of them)");
}

TEST(Config, ErrorUnsupportedYaml) {
  EXPECT_EQ(errors(kModel + "  name: !secret x\n"), "t.yaml:4:9: YAML tag !secret is not supported (remove the tag)");
  EXPECT_EQ(errors(kModel + "  [a]: 1\n"), "t.yaml:4:3: model: mapping keys must be scalars (write `name: value`)");
  const Experiment e = load_text_ok(kModel + "  name: !!str 5\n");
  EXPECT_EQ(e.model.name, "5");
}

TEST(Config, SeveralErrorsInOneFileAreReportedTogetherInOrder) {
  const std::string f = data("many_errors.yaml");
  EXPECT_EQ(file_errors(f),
            f + ":4:3: model.n_heads: n_heads (5) does not divide d_model (768) "
                "(choose n_heads dividing d_model, or set d_k and d_v explicitly)\n" +
            f + ":5:3: model.activaton: unknown key (did you mean `activation`?)\n" +
            f + ":6:13: model.norm_eps: must be > 0, found -1\n" +
            f + ":7:10: model.dtype: expected one of f32, bf16, found f16 (did you mean `bf16`?)\n" +
            f + ":10:14: model.positions.max_len: must be > 0, found 0\n" +
            f + ":11:3: model.stem.n_features: required key is missing (stem.kind is features) "
                "(add `n_features: <int>` under `model.stem:`)\n" +
            f + ":14:3: model.head.n_classes: required key is missing (head.kind is classifier) "
                "(add `n_classes: <int>` under `model.head:`)\n" +
            f + ":18:12: runtime.threads: expected int, found many");
}

TEST(Config, ErrorFiles) {
  const std::string missing = data("no_such_file.yaml");
  EXPECT_EQ(file_errors(missing), missing + ": cannot read file: No such file or directory");
  EXPECT_EQ(file_errors(data("include")), data("include") + ": cannot read file: not a regular file");
  LoadOptions small;
  small.max_file_bytes = 10;
  Diagnostics diags;
  EXPECT_FALSE(load_experiment(data("minimal.yaml"), small, &diags).has_value());
  EXPECT_EQ(diags.str(), data("minimal.yaml") + ": cannot read file: the file is " +
                             std::to_string(fs::file_size(data("minimal.yaml"))) +
                             " bytes, more than max_file_bytes (10)");
  EXPECT_EQ(errors(kModel, {}, small), "t.yaml: the file is 45 bytes, more than max_file_bytes (10)");
}

// ---------------------------------------------------------------------------------------------
// model.include

TEST(Config, IncludeMergesAndOverrides) {
  const Experiment e = load_ok(data("include/child.yaml"));
  EXPECT_EQ(e.model.name, "base");               // from base.yaml
  EXPECT_EQ(e.model.d_model, 8);                 // from base.yaml
  EXPECT_EQ(e.model.n_layers, 3);                // from sub/mid.yaml
  EXPECT_EQ(e.model.n_heads, 4);                 // child.yaml overrides base.yaml's 2
  EXPECT_EQ(e.model.d_k, 2);                     // resolved after the merge
  EXPECT_EQ(e.model.positions.kind, PositionKind::learned);  // merged mapping keeps base's kind
  EXPECT_EQ(e.model.positions.max_len, 32);      // and takes child's max_len
  EXPECT_EQ(e.bench.seq_len, 32);
  EXPECT_EQ(e.input.ids, (std::vector<int32_t>{1, 2, 3}));
  // Each key remembers the file it was written in.
  EXPECT_EQ(e.where("model.d_model").file, data("include/base.yaml"));  // as named from sub/mid.yaml
  EXPECT_EQ(e.where("model.d_model").line, 4);
  EXPECT_EQ(e.where("model.n_layers").file, data("include/sub/mid.yaml"));
  EXPECT_EQ(e.where("model.n_heads").file, data("include/child.yaml"));
  EXPECT_EQ(e.where("model.include").file, data("include/child.yaml"));
  EXPECT_EQ(e.where("model.positions.kind").file, data("include/base.yaml"));
}

TEST(Config, IncludeErrors) {
  EXPECT_EQ(file_errors(data("include/uses_bad.yaml")),
            data("include/bad_base.yaml") + ":4:12: model.n_heads: expected int, found two\n" +
                data("include/uses_bad.yaml") + ":3:3: model.n_layerz: unknown key (did you mean `n_layers`?)");
  EXPECT_EQ(file_errors(data("include/missing.yaml")),
            data("include/missing.yaml") + ":2:3: model.include: cannot read included file " +
                data("include/not_there.yaml") +
                ": No such file or directory (a relative path is resolved against the directory of the YAML file "
                "that names it)");
  EXPECT_EQ(file_errors(data("include/cycle_a.yaml")),
            data("include/cycle_b.yaml") + ":2:3: model.include: include cycle: " + data("include/cycle_a.yaml") +
                " -> " + data("include/cycle_b.yaml") + " -> " + data("include/cycle_a.yaml") +
                " (a model file cannot include itself, directly or through others)");
  EXPECT_EQ(file_errors(data("include/uses_no_model.yaml")),
            data("include/no_model.yaml") + ":1:1: model.include: the included file has no top-level `model:` "
                                            "mapping (an included file holds `model:` with the model's keys under it)");
  EXPECT_EQ(errors("model:\n  include: [a.yaml]\n"), "t.yaml:2:12: model.include: expected a path, found a list");
}

TEST(Config, IncludeDepthIsLimited) {
  const fs::path dir = fs::temp_directory_path() / ("tessera_config_depth_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // chain0 includes chain1 ... includes chain9: nine includes, one more than allowed.
  for (int i = 0; i < 10; ++i) {
    std::ofstream out(dir / ("chain" + std::to_string(i) + ".yaml"));
    out << "model:\n";
    if (i < 9) out << "  include: chain" << i + 1 << ".yaml\n";
    else out << "  d_model: 8\n  stem: {vocab_size: 4}\n";
  }
  const std::string d = dir.string() + "/";
  std::string chain = d + "chain0.yaml";
  for (int i = 1; i <= 9; ++i) chain += " -> " + d + "chain" + std::to_string(i) + ".yaml";
  EXPECT_EQ(file_errors(d + "chain0.yaml"),
            d + "chain8.yaml:2:3: model.include: includes nested more than 8 deep: " + chain);
  const Experiment ok = load_ok(d + "chain1.yaml");  // eight includes
  EXPECT_EQ(ok.model.d_model, 8);
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// --set

TEST(Config, OverridesSetKeys) {
  const Experiment e = load_ok(data("minimal.yaml"),
                               {"model.n_layers=2", "model.positions.kind=rotary", "model.weights.inline.x=[[1,2]]",
                                "model.weights.inline.blocks.0.w=[3]", "model.stem={scale: sqrt_d_model}",
                                "input.ids=[1, 2]"});
  EXPECT_EQ(e.model.n_layers, 2);
  EXPECT_EQ(e.model.positions.kind, PositionKind::rotary);
  EXPECT_EQ(e.model.weights.inline_tensors.at("x").value.to_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(e.model.weights.inline_tensors.at("x").value.shape(), Shape({1, 2}));
  EXPECT_EQ(e.model.weights.inline_tensors.at("blocks.0.w").value.to_vector(), (std::vector<float>{3}));
  EXPECT_EQ(e.model.stem.scale, EmbedScale::sqrt_d_model);
  EXPECT_EQ(e.model.stem.vocab_size, 10);  // a mapping merges into the one in the file
  EXPECT_EQ(e.input.ids, (std::vector<int32_t>{1, 2}));
  // An override's place is its argument, and the column of the key (or value) in it.
  const Location at = e.where("model.n_layers");
  EXPECT_EQ(at.file, "--set model.n_layers=2");
  EXPECT_EQ(at.line, 0);
  EXPECT_EQ(at.col, 7);
  EXPECT_EQ(e.where("model.positions.kind").file, "--set model.positions.kind=rotary");
  EXPECT_EQ(e.where("model.positions.kind").col, 17);
  EXPECT_EQ(e.where("model.d_model").file, data("minimal.yaml"));
  // Overrides apply before the include, so they override included keys.
  const Experiment c = load_ok(data("include/child.yaml"), {"model.d_model=16", "model.n_heads=8"});
  EXPECT_EQ(c.model.d_model, 16);
  EXPECT_EQ(c.model.d_k, 2);
  EXPECT_EQ(c.model.name, "base");
}

// Each error names the --set argument it comes from and the column in it: of the key for a key's
// problem, of the value (or of the place inside it) for a value's.
TEST(Config, OverrideErrors) {
  EXPECT_EQ(errors(kModel, {"model.n_layers=2", "model.n_layrs=3"}),
            "--set model.n_layrs=3, column 7: model.n_layrs: unknown key (did you mean `n_layers`?)");
  EXPECT_EQ(errors(kModel, {"model.n_layers"}),
            "--set model.n_layers: expected key.path=value (for example --set model.n_layers=2)");
  EXPECT_EQ(errors(kModel, {"=3", "model..x=1"}),
            "--set =3: expected key.path=value (for example --set model.n_layers=2)\n"
            "--set model..x=1: expected key.path=value (for example --set model.n_layers=2)");
  EXPECT_EQ(errors(kModel, {"model.n_layers=two"}),
            "--set model.n_layers=two, column 16: model.n_layers: expected int, found two");
  EXPECT_EQ(errors(kModel, {"model.n_layers="}),
            "--set model.n_layers=, column 16: model.n_layers: expected int, found null");
  EXPECT_EQ(errors(kModel, {"model.n_layers=[1"}),
            "--set model.n_layers=[1, column 18: YAML syntax error: end of sequence flow not found");
  EXPECT_EQ(errors(kModel, {"input.ids=[1, two]"}),
            "--set input.ids=[1, two], column 15: input.ids: entry 1: expected int, found two");
  EXPECT_EQ(errors(kModel + "  weights:\n    inline: {x: [1]}\n", {"model.weights.inline.x=[1, 2 +* 3]"}),
            "--set model.weights.inline.x=[1, 2 +* 3], column 31: model.weights.inline.x: entry [1]: bad "
            "expression "
            "\"2 +* 3\": unexpected '*'");
  EXPECT_EQ(errors(kModel, {"model.n_heads=3"}),
            "--set model.n_heads=3, column 7: model.n_heads: n_heads (3) does not divide d_model (8) "
            "(choose n_heads dividing d_model, or set d_k and d_v explicitly)");
  // Errors in the file and in the overrides come together.
  EXPECT_EQ(errors(kModel + "  bias: 1\n", {"bench.reps=0"}),
            "--set bench.reps=0, column 12: bench.reps: must be >= 1, found 0\n"
            "t.yaml:4:9: model.bias: expected bool (true or false), found 1");
}

// A number in the path indexes a list (`plugins.0.options.max_length`; `plugins[0]` too): the
// entry is replaced, or merged into when both are mappings; the rest of the list stays.
TEST(Config, OverridesReachListEntries) {
  const std::string yaml = kModel + "input:\n  ids: [1, 2, 3]\ntask:\n  attention: {layers: [0, 1]}\n";
  const Experiment e = load_text_ok(yaml, {"input.ids.1=7", "input.ids[2]=9", "task.attention.layers.0=1"});
  EXPECT_EQ(e.input.ids, (std::vector<int32_t>{1, 7, 9}));
  EXPECT_EQ(e.task.attention.layers, (std::vector<int64_t>{1, 1}));
  // Nested lists, and a mapping in a list merged into.
  const std::string rows =
      "model:\n  d_model: 2\n  stem: {kind: identity}\ninput:\n  rows: [[1, 2], [3, 4]]\n";
  const Experiment r = load_text_ok(rows, {"input.rows.1.0=5"});
  ASSERT_TRUE(r.input.rows.defined());
  EXPECT_EQ(r.input.rows.to_vector(), (std::vector<float>{1, 2, 5, 4}));
  // A bad value in an entry is located in its argument.
  EXPECT_EQ(errors(yaml, {"input.ids.1=x"}),
            "--set input.ids.1=x, column 13: input.ids: entry 1: expected int, found x");
}

TEST(Config, OverrideListIndexErrors) {
  const std::string yaml = kModel + "input:\n  ids: [1, 2, 3]\n";
  EXPECT_EQ(errors(yaml, {"input.ids.7=1"}),
            "--set input.ids.7=1, column 11: index 7 is out of range (input.ids has 3 entries)");
  EXPECT_EQ(errors(yaml, {"input.ids[3]=1"}),
            "--set input.ids[3]=1, column 11: index 3 is out of range (input.ids has 3 entries)");
  EXPECT_EQ(errors(yaml, {"input.ids.first=1"}),
            "--set input.ids.first=1, column 11: input.ids is a list: `first` is not an index (input.ids has "
            "3 entries, 0 to 2)");
  EXPECT_EQ(errors(yaml, {"input.ids.-1=1"}),
            "--set input.ids.-1=1, column 11: input.ids is a list: `-1` is not an index (input.ids has 3 "
            "entries, 0 to 2)");
  EXPECT_EQ(errors(kModel + "input:\n  ids: []\n", {"input.ids.0=1"}),
            "--set input.ids.0=1, column 11: index 0 is out of range (input.ids has no entries)");
  EXPECT_EQ(errors(kModel + "input:\n  ids: [4]\n", {"input.ids.1.x=1"}),
            "--set input.ids.1.x=1, column 11: index 1 is out of range (input.ids has 1 entry)");
  // A number where the file has no list.
  EXPECT_EQ(errors(kModel, {"input.ids.0=1"}),
            "--set input.ids.0=1, column 11: input.ids is not in the file, so it has no entry 0 (set the "
            "whole list: "
            "--set 'input.ids=[...]')");
  EXPECT_EQ(
      errors(kModel, {"model.d_model.0=1"}),
      "--set model.d_model.0=1, column 15: model.d_model is not a list, so it has no entry 0 (set the whole "
      "list: --set 'model.d_model=[...]')");
  // Below an open map a number is a name like any other.
  EXPECT_EQ(load_text_ok(kModel, {"model.weights.inline.7=[5]"}).model.weights.inline_tensors.count("7"), 1u);
  // Brackets around anything but a number are part of the name.
  EXPECT_EQ(
      errors(yaml, {"input.ids[x]=1"}),
      "--set input.ids[x]=1, column 7: input.ids[x]: unknown key (valid keys in input: tokens, rows, ids)");
}

// ---------------------------------------------------------------------------------------------
// Hostile YAML: each refused with its message, fast.

TEST(Config, BombDeepFlowSequence) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(errors(std::string(100000, '[') + std::string(100000, ']')),
            "t.yaml:1:65: nesting deeper than max_depth (64) (LoadOptions::max_depth sets the limit)");
  EXPECT_LT(seconds_since(t0), 10.0);  // a guard against a hang or a blow-up, not a timing
}

TEST(Config, BombDeepFlowMapping) {
  std::string yaml;
  for (int i = 0; i < 100000; ++i) yaml += "{a: ";
  yaml += "1" + std::string(100000, '}');
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(errors(yaml), "t.yaml:1:257: nesting deeper than max_depth (64) (LoadOptions::max_depth sets the limit)");
  EXPECT_EQ(errors("model: " + yaml), "t.yaml:1:264: nesting deeper than max_depth (64) (LoadOptions::max_depth sets the limit)");
  EXPECT_LT(seconds_since(t0), 10.0);  // a guard against a hang or a blow-up, not a timing
}

TEST(Config, BombDeepNestingPastOurLimitsStopsInsideYamlCpp) {
  // With our limits lifted, yaml-cpp 0.7's own depth guard refuses the document (it throws
  // DeepRecursion, whose message says "bad file"); it must come back as a diagnostic, no crash.
  LoadOptions lifted;
  lifted.max_depth = 1'000'000;
  std::string map;
  for (int i = 0; i < 100000; ++i) map += "{a: ";
  map += "1" + std::string(100000, '}');
  const std::string expected =
      "nesting deeper than the YAML parser allows (LoadOptions::max_depth should stay below yaml-cpp's own limit)";
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(errors(std::string(100000, '[') + std::string(100000, ']'), {}, lifted), "t.yaml:1:1: " + expected);
  EXPECT_LT(seconds_since(t0), 10.0);  // a guard against a hang or a blow-up, not a timing
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(errors(map, {}, lifted), "t.yaml:1:1: " + expected);
  EXPECT_LT(seconds_since(t0), 10.0);  // a guard against a hang or a blow-up, not a timing
}

TEST(Config, BombDeepBlockNesting) {
  // Block sequences nest two characters per level; the parse events are refused at max_depth.
  std::string yaml;
  for (int i = 0; i < 100000; ++i) yaml += "- ";
  yaml += "1\n";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(errors(yaml), "t.yaml:1:129: nesting deeper than max_depth (64) (LoadOptions::max_depth sets the limit)");
  EXPECT_LT(seconds_since(t0), 10.0);  // a guard against a hang or a blow-up, not a timing
  LoadOptions shallow;
  shallow.max_depth = 3;
  EXPECT_EQ(errors(kModel + "  weights:\n    inline:\n      x:\n        - [1]\n", {}, shallow),
            "t.yaml:6:7: nesting deeper than max_depth (3) (LoadOptions::max_depth sets the limit)");
  // Flow nesting is counted by a scan of the text before yaml-cpp sees it (only flow levels).
  EXPECT_EQ(errors(kModel + "  weights: {inline: {x: [[1]]}}\n", {}, shallow),
            "t.yaml:4:26: nesting deeper than max_depth (3) (LoadOptions::max_depth sets the limit)");
}

TEST(Config, DepthPrescanIgnoresBracketsThatOpenNothing) {
  // Brackets in quoted, plain and block scalars and in comments do not nest; with max_depth 3 this
  // file (real depth 3) must load.
  LoadOptions options;
  options.max_depth = 3;
  const std::string yaml =
      "model:  # [[[[[[\n"
      "  d_model: 8\n"
      "  name: \"[[[[{{{{\\\"[[\"\n"
      "  stem: {vocab_size: 10}\n"
      "input:\n"
      "  tokens: ['[[[[', \"{{{{\", it's, 'x''[[[[']\n"
      "  ids: [1, 2, 3, 4]\n"
      "runtime: {threads: 1}  # {{{{{\n"
      "bench:\n"
      "  batch: 2 # [[[[\n";
  Diagnostics diags;
  const std::optional<Experiment> e = load_experiment_from_string(yaml, "t.yaml", data_dir(), options, &diags);
  ASSERT_TRUE(e.has_value()) << diags.str();
  EXPECT_EQ(e->model.name, "[[[[{{{{\"[[");
  EXPECT_EQ(e->input.tokens, (std::vector<std::string>{"[[[[", "{{{{", "it's", "x'[[[["}));
  const std::string plain = kModel + "  name: a [[[[ b {{{{\ninput:\n  tokens:\n    - x[[[[y\n    - \"[[[[\"\n";
  Diagnostics plain_diags;
  EXPECT_TRUE(load_experiment_from_string(plain, "t.yaml", data_dir(), options, &plain_diags).has_value())
      << plain_diags.str();
  const std::string block = kModel + "  name: |\n    [[[[[[\n    {{{{{{\nbench: {batch: 2}\n";
  Diagnostics block_diags;
  const std::optional<Experiment> b = load_experiment_from_string(block, "t.yaml", data_dir(), options, &block_diags);
  ASSERT_TRUE(b.has_value()) << block_diags.str();
  EXPECT_EQ(b->model.name, "[[[[[[\n{{{{{{\n");
}

TEST(Config, BombBillionLaughs) {
  std::string yaml = "a: &a [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    const char p = c - 1;
    yaml += std::string(1, c) + ": &" + c + " [";
    for (int k = 0; k < 9; ++k) yaml += std::string(k ? ", *" : "*") + p;
    yaml += "]\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(errors(yaml),
            "t.yaml:7:8: the document expands to more than 1000000 nodes (aliases counted each time they are "
            "used) (is this a YAML bomb? LoadOptions::max_nodes sets the limit)");
  EXPECT_LT(seconds_since(t0), 10.0);  // a guard against a hang or a blow-up, not a timing
}

TEST(Config, BombSelfReferencingAnchors) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string hint = " (an anchor cannot be used inside its own value)";
  EXPECT_EQ(errors("a: &x [*x]\n"), "t.yaml:1:8: alias *x refers to a node that contains it" + hint);
  EXPECT_EQ(errors("a: &x {b: *x}\n"), "t.yaml:1:11: alias *x refers to a node that contains it" + hint);
  EXPECT_EQ(errors("&root\nmodel: *root\n"), "t.yaml:2:8: alias *root refers to a node that contains it" + hint);
  EXPECT_EQ(errors("a: &x [[[*x]]]\n"), "t.yaml:1:10: alias *x refers to a node that contains it" + hint);
  EXPECT_EQ(errors("a: *x\n"), "t.yaml:1:4: YAML syntax error: the referenced anchor is not defined");
  EXPECT_LT(seconds_since(t0), 10.0);  // a guard against a hang or a blow-up, not a timing
  // Aliases that do not refer to themselves are fine, and a scalar alias reports where it is used.
  const Experiment e = load_text_ok("model:\n  d_model: &w 8\n  d_ff: *w\n  stem: {vocab_size: *w}\n");
  EXPECT_EQ(e.model.d_ff, 8);
  EXPECT_EQ(errors("model:\n  name: &n x\n  d_model: *n\n  stem: {vocab_size: 10}\n"),
            "t.yaml:3:12: model.d_model: expected int, found x");
}

TEST(Config, BombLargeFlatDocumentCountsNodes) {
  LoadOptions options;
  options.max_nodes = 1000;
  std::string yaml = "model: [";
  for (int i = 0; i < 2000; ++i) yaml += "1, ";
  yaml += "1]\n";
  EXPECT_EQ(errors(yaml, {}, options),
            "t.yaml:1:3000: the document expands to more than 1000 nodes (aliases counted each time they are used) "
            "(is this a YAML bomb? LoadOptions::max_nodes sets the limit)");
}

// ---------------------------------------------------------------------------------------------
// to_yaml, the schema and its documentation.

TEST(Config, ToYamlRoundTrip) {
  for (const char* name : {"minimal.yaml", "full.yaml", "teaching.yaml", "include/child.yaml"}) {
    SCOPED_TRACE(name);
    const Experiment first = load_ok(data(name));
    const std::string text = to_yaml(first);
    Diagnostics diags;
    std::optional<Experiment> second = load_experiment_from_string(text, "resolved.yaml", "/", {}, &diags);
    ASSERT_TRUE(second.has_value()) << diags.str() << "\n" << text;
    expect_same(first, *second);
    const std::string again = to_yaml(*second);
    EXPECT_EQ(again.substr(again.find('\n')), text.substr(text.find('\n')));  // all but the file name
  }
  // Every key is printed, in schema order.
  const std::string text = to_yaml(load_ok(data("minimal.yaml")));
  size_t from = 0;
  for (const KeySpec& k : config_schema()) {
    if (k.path == "model.include") continue;
    const std::string leaf = k.path.substr(k.path.rfind('.') + 1) + ":";
    const size_t at = text.find(leaf, from);
    ASSERT_NE(at, std::string::npos) << k.path << " missing or out of order in\n" << text;
    from = at + leaf.size();
  }
  EXPECT_EQ(text.find("include"), std::string::npos);
}

TEST(Config, ToYamlExactText) {
  const Experiment e = load_text_ok(
      "model:\n  d_model: 3\n  name: \"a \\\"q\\\"\"\n  stem: {kind: identity}\n  weights:\n    inline:\n"
      "      w: [[1/3, 2], [0.1, -4]]\n      \"null\": [1]\ninput:\n  rows: [[1, 2, 3]]\n  tokens: [\"x: y\"]\n");
  const std::string text = to_yaml(e);
  EXPECT_NE(text.find("  name: \"a \\\"q\\\"\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("    inline:\n      \"null\": [1]\n      w:\n        - [0.33333334, 2]\n        - [0.1, -4]\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  tokens: [\"x: y\"]\n  rows:\n    - [1, 2, 3]\n  ids: []\n"), std::string::npos) << text;
  EXPECT_NE(text.find("    n_features: null\n"), std::string::npos) << text;
  EXPECT_NE(text.find("    file: null\n"), std::string::npos) << text;
}

TEST(Config, SchemaIsWellFormed) {
  const std::vector<KeySpec>& schema = config_schema();
  std::vector<std::string> closed;  // sections already left: to_yaml needs each in one piece
  std::string previous_section;
  std::set<std::string> seen;
  for (const KeySpec& k : schema) {
    EXPECT_TRUE(seen.insert(k.path).second) << "duplicate " << k.path;
    EXPECT_FALSE(k.type.empty()) << k.path;
    EXPECT_FALSE(k.default_value.empty()) << k.path;
    EXPECT_FALSE(k.meaning.empty()) << k.path;
    const std::string section = k.path.substr(0, k.path.rfind('.'));
    if (section != previous_section) {
      EXPECT_EQ(std::count(closed.begin(), closed.end(), section), 0) << k.path << " reopens " << section;
      closed.push_back(previous_section);
      previous_section = section;
    }
  }
  EXPECT_EQ(schema.front().path, "model.include");
  EXPECT_STREQ(arch_name(Arch::decoder), "decoder");
  EXPECT_STREQ(norm_name(NormPlacement::pre), "pre");
  EXPECT_STREQ(position_kind_name(PositionKind::rotary), "rotary");
  EXPECT_STREQ(rotary_style_name(RotaryStyle::interleaved), "interleaved");
  EXPECT_STREQ(stem_kind_name(StemKind::identity), "identity");
  EXPECT_STREQ(embed_scale_name(EmbedScale::sqrt_d_model), "sqrt_d_model");
  EXPECT_STREQ(head_kind_name(HeadKind::classifier), "classifier");
  EXPECT_STREQ(pool_kind_name(PoolKind::last), "last");
}

TEST(Config, DocsMatchSchema) {
  const std::string path = std::string(TESSERA_SOURCE_DIR) + "/docs/CONFIG.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream buf;
  buf << in.rdbuf();
  std::string doc = buf.str();
  const std::string begin = "<!-- BEGIN GENERATED SCHEMA -->\n";
  const std::string end = "<!-- END GENERATED SCHEMA -->";
  const size_t b = doc.find(begin);
  const size_t e = doc.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  ASSERT_LT(b, e);
  const std::string generated = schema_markdown();
  if (std::getenv("TESSERA_UPDATE_DOCS")) {
    doc.replace(b + begin.size(), e - b - begin.size(), generated);
    std::ofstream(path) << doc;
    std::fprintf(stderr, "rewrote the schema table in %s\n", path.c_str());
    return;
  }
  EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), generated)
      << "docs/CONFIG.md is out of date; rerun this test with TESSERA_UPDATE_DOCS=1 to regenerate it";
}

// train.dropout: three probabilities in [0, 1), default 0; anything else names file:line:col and
// the key. The mapping form only (a bare number is a type error naming the mapping it wants).
TEST(Config, TrainDropout) {
  const Experiment none = load_text_ok(kModel);
  EXPECT_EQ(none.train.dropout.embedding, 0.0);
  EXPECT_EQ(none.train.dropout.attention, 0.0);
  EXPECT_EQ(none.train.dropout.residual, 0.0);
  const Experiment e = load_text_ok(kModel + "train:\n  dropout: {embedding: 0.1, attention: 0.25, residual: 0}\n");
  EXPECT_EQ(e.train.dropout.embedding, 0.1);
  EXPECT_EQ(e.train.dropout.attention, 0.25);
  EXPECT_EQ(e.train.dropout.residual, 0.0);
  EXPECT_EQ(errors(kModel + "train:\n  dropout: {attention: 1}\n"),
            "t.yaml:5:24: train.dropout.attention: must be in [0, 1), found 1");
  EXPECT_EQ(errors(kModel + "train:\n  dropout:\n    embedding: -0.1\n    residual: 1.5\n"),
            "t.yaml:6:16: train.dropout.embedding: must be in [0, 1), found -0.1\n"
            "t.yaml:7:15: train.dropout.residual: must be in [0, 1), found 1.5");
  EXPECT_EQ(errors(kModel + "train:\n  dropout: {residual: .nan}\n"),
            "t.yaml:5:23: train.dropout.residual: must be a finite number, found .nan");
  EXPECT_EQ(errors(kModel + "train:\n  dropout: {residual: lots}\n"),
            "t.yaml:5:23: train.dropout.residual: expected float, found lots");
  EXPECT_EQ(errors(kModel + "train:\n  dropout: {atention: 0.1}\n"),
            "t.yaml:5:13: train.dropout.atention: unknown key (did you mean `attention`?)");
  EXPECT_EQ(errors(kModel + "train:\n  dropout: 0.1\n"), "t.yaml:5:12: train.dropout: expected a mapping, found 0.1");
}

}  // namespace
}  // namespace tessera
