// Optimizers, schedules and gradient helpers (tessera/optim.h) against PyTorch and transformers
// (fixtures in tests/data/optim, made by tools/reference/make_optim_fixtures.py), and the
// properties a trainer relies on: decay exclusions by name, checkpoints that continue bit for bit,
// the same bits on one thread or two and with or without FMA instructions, and clear refusals.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tessera/optim.h"
#include "tessera/safetensors.h"
#include "test_util.h"
#include "train/optim_isa.h"

using namespace tessera;
using tessera::testing_util::IsOk;
using tessera::testing_util::max_abs;
using tessera::testing_util::max_rel_error;
using tessera::testing_util::random_tensor;

namespace {

const std::string kDir = std::string(TESSERA_TEST_DATA) + "/optim/";
constexpr const char* kRuns[] = {"adamw_cosine", "adamw_nodecay", "adamw_decay_all",
                                 "sgd_momentum", "sgd_nesterov",  "sgd_plain"};

// ---------------------------------------------------------------------------------------------
// Fixtures (format in tests/data/optim/README.md).

nlohmann::json fixture_json(const safetensors::File& f) {
  return nlohmann::json::parse(f.metadata().at("fixture"));
}

// Tensor `name` of f, or an undefined tensor (the test then fails on it).
Tensor get(const safetensors::File& f, const std::string& name) {
  auto t = f.get(name);
  EXPECT_TRUE(t.ok()) << f.path() << ": " << t.status().message();
  return t.ok() ? t.value() : Tensor();
}

struct Grads {
  std::vector<std::string> names;  // parameter order
  int64_t steps = 0;
  double max_norm = 0;
  Parameters init;
  // Step k's gradients before and after torch's clip_grad_norm_, as owned f32 copies.
  std::vector<Parameters> raw, clipped;
  std::vector<float> norm;  // torch's total norm at each step
};

Grads load_grads() {
  Grads g;
  auto f = safetensors::File::open(kDir + "grads.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return g;
  const nlohmann::json meta = fixture_json(*f);
  g.names = meta.at("parameters").get<std::vector<std::string>>();
  g.steps = meta.at("steps").get<int64_t>();
  g.max_norm = meta.at("max_norm").get<double>();
  std::vector<Parameters::Entry> init;
  for (const auto& n : g.names) init.emplace_back(n, get(*f, "init." + n));
  g.init = Parameters(std::move(init));
  for (int64_t k = 0; k < g.steps; ++k) {
    std::vector<Parameters::Entry> raw, clipped;
    for (const auto& n : g.names) {
      raw.emplace_back(n, get(*f, "grad." + n).select(0, k).clone());
      clipped.emplace_back(n, get(*f, "clipped." + n).select(0, k).clone());
    }
    g.raw.emplace_back(std::move(raw));
    g.clipped.emplace_back(std::move(clipped));
  }
  g.norm = get(*f, "norm").to_vector();
  return g;
}

struct RunFixture {
  std::string name;
  OptimizerOptions options;
  ScheduleOptions schedule;
  int64_t total_steps = 0;
  std::vector<double> lr;                             // the rate torch used at each step
  std::map<std::string, Tensor> after;                // parameter -> (steps, shape...) after each step
  std::vector<std::pair<std::string, Tensor>> state;  // torch's final state under Tessera's names
};

RunFixture load_run(const std::string& name, const std::vector<std::string>& params) {
  RunFixture r;
  r.name = name;
  auto f = safetensors::File::open(kDir + name + ".safetensors");
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return r;
  const nlohmann::json meta = fixture_json(*f);
  const nlohmann::json& o = meta.at("options");
  r.options.kind = o.at("kind") == "adamw" ? OptimizerOptions::Kind::adamw : OptimizerOptions::Kind::sgd;
  r.options.lr = o.at("lr").get<double>();
  r.options.weight_decay = o.at("weight_decay").get<double>();
  r.options.no_decay = o.at("no_decay").get<std::vector<std::string>>();
  if (r.options.kind == OptimizerOptions::Kind::adamw) {
    r.options.beta1 = o.at("beta1").get<double>();
    r.options.beta2 = o.at("beta2").get<double>();
    r.options.eps = o.at("eps").get<double>();
  } else {
    r.options.momentum = o.at("momentum").get<double>();
    r.options.nesterov = o.at("nesterov").get<bool>();
  }
  const nlohmann::json& s = meta.at("schedule");
  const std::string kind = s.at("kind");
  r.schedule.kind = kind == "cosine"   ? ScheduleOptions::Kind::cosine
                    : kind == "linear" ? ScheduleOptions::Kind::linear
                                       : ScheduleOptions::Kind::constant;
  r.schedule.warmup_steps = s.at("warmup_steps").get<int64_t>();
  r.schedule.min_lr_ratio = s.at("min_lr_ratio").get<double>();
  r.total_steps = s.at("total_steps").get<int64_t>();
  r.lr = meta.at("lr").get<std::vector<double>>();
  for (const auto& p : params) r.after[p] = get(*f, "param." + p);
  for (const auto& t : f->tensors())
    if (t.name.rfind("param.", 0) != 0) r.state.emplace_back(t.name, get(*f, t.name));
  return r;
}

// The largest distance in units in the last place between two f32 tensors of one shape.
int64_t max_ulps(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return INT64_MAX;
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : static_cast<int64_t>(i);
  };
  int64_t m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max<int64_t>(m, std::llabs(ordered(x[i]) - ordered(y[i])));
  return m;
}

using testing_util::same_bits;  // and the overloads below for whole parameter sets

bool same_bits(const Parameters& a, const Parameters& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !same_bits(a[i].second, b[i].second)) return false;
  return true;
}

bool same_bits(const std::vector<std::pair<std::string, Tensor>>& a,
               const std::vector<std::pair<std::string, Tensor>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !same_bits(a[i].second, b[i].second)) return false;
  return true;
}

Tensor find_entry(const std::vector<std::pair<std::string, Tensor>>& state, const std::string& name) {
  for (const auto& [n, t] : state)
    if (n == name) return t;
  return Tensor();
}

// ---------------------------------------------------------------------------------------------
// Against torch.

// From torch's own clipped gradients at torch's rates, every parameter after every step and the
// final state are torch's, bit for bit: the same operations in the same order and rounding.
TEST(OptimFixtures, TrajectoriesEqualTorchsBitForBit) {
  const Grads g = load_grads();
  ASSERT_EQ(g.steps, 20);
  for (const char* name : kRuns) {
    SCOPED_TRACE(name);
    const RunFixture r = load_run(name, g.names);
    ASSERT_EQ(static_cast<int64_t>(r.lr.size()), g.steps);
    Parameters p = g.init.clone();
    auto o = Optimizer::create(r.options, p);
    ASSERT_TRUE(o.ok()) << o.status().message();
    int64_t worst = 0;
    for (int64_t k = 0; k < g.steps; ++k) {
      ASSERT_TRUE(IsOk(o->step(p, g.clipped[static_cast<size_t>(k)], r.lr[static_cast<size_t>(k)])));
      for (const auto& n : g.names) worst = std::max(worst, max_ulps(*p.find(n), r.after.at(n).select(0, k)));
    }
    EXPECT_EQ(worst, 0) << "largest difference from torch in any step, in ulps";
    const auto state = o->state();
    EXPECT_EQ(state.size(), r.state.size());
    for (const auto& [n, t] : r.state) EXPECT_TRUE(same_bits(find_entry(state, n), t)) << n;
  }
}

// The whole step as a trainer runs it: Tessera's clip_grad_norm on the raw gradients, Tessera's
// schedule, then the update. The clipping factor is computed in double (torch: f32), so the
// clipped gradients differ from torch's in the last bit or two and the parameters follow.
TEST(OptimFixtures, FullStepsMatchTorch) {
  const Grads g = load_grads();
  for (const char* name : kRuns) {
    SCOPED_TRACE(name);
    const RunFixture r = load_run(name, g.names);
    Parameters p = g.init.clone();
    auto o = Optimizer::create(r.options, p);
    ASSERT_TRUE(o.ok()) << o.status().message();
    double worst = 0;
    int64_t worst_ulps = 0;
    for (int64_t k = 0; k < g.steps; ++k) {
      Parameters grads = g.raw[static_cast<size_t>(k)].clone();
      clip_grad_norm(grads, g.max_norm);
      const double lr = scheduled_lr(r.schedule, r.options.lr, k, r.total_steps);
      EXPECT_EQ(lr, r.lr[static_cast<size_t>(k)]) << "step " << k;
      ASSERT_TRUE(IsOk(o->step(p, grads, lr)));
      for (const auto& n : g.names) {
        const Tensor want = r.after.at(n).select(0, k);
        worst = std::max(worst, max_rel_error(*p.find(n), want));
        worst_ulps = std::max(worst_ulps, max_ulps(*p.find(n), want));
      }
    }
    std::printf("[ optim fixture ] %-16s parameters within %.1e of their scale, %lld ulps\n", name, worst,
                static_cast<long long>(worst_ulps));
    EXPECT_LT(worst, 1e-6);
  }
}

TEST(OptimFixtures, ClipMatchesTorch) {
  const Grads g = load_grads();
  int clipped = 0;
  double worst_norm = 0, worst_grad = 0;
  for (int64_t k = 0; k < g.steps; ++k) {
    const size_t i = static_cast<size_t>(k);
    Parameters grads = g.raw[i].clone();
    const double norm = clip_grad_norm(grads, g.max_norm);
    worst_norm = std::max(worst_norm, std::fabs(norm - g.norm[i]) / g.norm[i]);
    const bool torch_clipped = g.max_norm / (g.norm[i] + 1e-6) < 1;
    EXPECT_EQ(g.max_norm / (norm + 1e-6) < 1, torch_clipped) << "step " << k;
    clipped += torch_clipped;
    for (const auto& n : g.names) {
      if (torch_clipped)
        worst_grad = std::max(worst_grad, max_rel_error(*grads.find(n), *g.clipped[i].find(n)));
      else
        EXPECT_TRUE(same_bits(*grads.find(n), *g.raw[i].find(n))) << "step " << k << " " << n << " unclipped";
    }
  }
  std::printf(
      "[ optim fixture ] clip: norms within %.1e, clipped gradients within %.1e (%d of %lld steps clipped)\n",
      worst_norm, worst_grad, clipped, static_cast<long long>(g.steps));
  EXPECT_GT(clipped, 0);
  EXPECT_LT(clipped, g.steps);
  EXPECT_LT(worst_norm, 1e-6);
  EXPECT_LT(worst_grad, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Schedules.

TEST(OptimSchedule, MatchesTransformers) {
  auto f = safetensors::File::open(kDir + "schedules.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  const nlohmann::json meta = fixture_json(*f);
  const double base = meta.at("base_lr").get<double>();
  int checked = 0;
  for (const auto& c : meta.at("cases")) {
    SCOPED_TRACE(c.at("function").get<std::string>() + " warmup " +
                 std::to_string(c.at("warmup_steps").get<int>()));
    ScheduleOptions s;
    const std::string kind = c.at("kind");
    s.kind = kind == "cosine"   ? ScheduleOptions::Kind::cosine
             : kind == "linear" ? ScheduleOptions::Kind::linear
                                : ScheduleOptions::Kind::constant;
    s.warmup_steps = c.at("warmup_steps").get<int64_t>();
    s.min_lr_ratio = c.at("min_lr_ratio").get<double>();
    const int64_t total = c.at("total_steps").get<int64_t>();
    const std::vector<double> lr = c.at("lr").get<std::vector<double>>();
    ASSERT_EQ(static_cast<int64_t>(lr.size()), total + 1);
    for (int64_t k = 0; k <= total; ++k, ++checked)
      EXPECT_EQ(scheduled_lr(s, base, k, total), lr[static_cast<size_t>(k)]) << "step " << k;
  }
  EXPECT_GT(checked, 100);
}

TEST(OptimSchedule, Formulas) {
  ScheduleOptions s;
  s.warmup_steps = 4;
  // Warmup from 0: the first update has rate 0, as transformers'.
  for (int64_t k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, k, 10), 2.0 * k / 4);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 4, 10), 2.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 7, 10), 1.0);  // halfway down the cosine
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 10, 10), 0.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 13, 10), 0.0);  // stays at the end (transformers': back up)
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, -3, 10), 0.0);  // a negative step counts as 0
  s.min_lr_ratio = 0.25;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 7, 10), 2.0 * (0.5 * 0.75 + 0.25));
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 10, 10), 0.5);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 50, 10), 0.5);
  s.kind = ScheduleOptions::Kind::linear;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 7, 10), 2.0 * (0.5 * 0.75 + 0.25));
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 10, 10), 0.5);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 50, 10), 0.5);
  s.kind = ScheduleOptions::Kind::constant;  // the ratio does not apply
  EXPECT_EQ(scheduled_lr(s, 2.0, 50, 10), 2.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 1, 10), 0.5);
  s.warmup_steps = -2;  // no warmup
  EXPECT_EQ(scheduled_lr(s, 2.0, 0, 10), 2.0);

  EXPECT_TRUE(IsOk(check_schedule(ScheduleOptions{}, 10)));
  ScheduleOptions bad;
  bad.warmup_steps = -1;
  bad.min_lr_ratio = 1.5;
  const Status st = check_schedule(bad, 0);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("warmup_steps"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("min_lr_ratio"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("total_steps"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------------------------------------
// Decay groups.

TEST(OptimGroups, DecayExclusionsByName) {
  const Shape v{8}, m{8, 8};
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"blocks.0.ln1.gamma", "norms"},
      {"blocks.3.ln2.beta", "norms"},
      {"final_norm.gamma", "norms"},
      {"stem.norm.beta", "norms"},
      {"head.norm.gamma", "norms"},
      {"head.transform.beta", "norms"},
      {"blocks.0.attn.b_q", "biases"},
      {"blocks.0.attn.b_o", "biases"},
      {"blocks.1.ffn.b1", "biases"},
      {"blocks.1.ffn.b2", "biases"},
      {"stem.proj_bias", "biases"},
      {"head.lm_bias", "biases"},
      {"head.b", "biases"},
      {"head.pooler.b", "biases"},
      {"head.transform.b", "biases"},
      {"stem.cls", "embeddings"},
      {"stem.dist", "embeddings"},
  };
  for (const auto& [name, group] : cases) EXPECT_EQ(parameter_group(name, v), group) << name;
  for (const char* name : {"stem.embed", "stem.type_embed", "stem.modality", "pos.table",
                           "blocks.2.attn.rel_k", "blocks.2.attn.rel_v"})
    EXPECT_EQ(parameter_group(name, m), "embeddings") << name;
  for (const char* name : {"blocks.0.attn.w_q", "blocks.0.attn.w_o", "blocks.0.ffn.w1", "stem.proj", "head.w",
                           "head.lm", "head.pooler.w", "head.transform.w"})
    EXPECT_EQ(parameter_group(name, m), "weights") << name;
  EXPECT_EQ(parameter_group("blocks.0.attn.b_q", m), "weights");  // a bias is rank 1

  OptimizerOptions o;
  EXPECT_TRUE(decays(o, "blocks.0.attn.w_q", m));
  for (const char* name : {"blocks.0.ln1.gamma", "blocks.0.attn.b_q", "stem.embed"})
    EXPECT_FALSE(decays(o, name, v));
  o.no_decay = {"biases"};
  EXPECT_TRUE(decays(o, "blocks.0.ln1.gamma", v));
  EXPECT_TRUE(decays(o, "stem.embed", m));
  EXPECT_FALSE(decays(o, "blocks.0.attn.b_q", v));
  o.weight_decay = 0;
  EXPECT_FALSE(decays(o, "blocks.0.attn.w_q", m));

  const Parameters p({{"stem.embed", Tensor::zeros({5, 8})},
                      {"blocks.0.attn.w_q", Tensor::zeros(m)},
                      {"blocks.0.attn.b_q", Tensor::zeros(v)},
                      {"blocks.0.ln1.gamma", Tensor::zeros(v)},
                      {"head.w", Tensor::zeros({8, 3})}});
  const DecayGroups g = decay_groups(OptimizerOptions{}, p);
  EXPECT_EQ(g.decay, (std::vector<std::string>{"blocks.0.attn.w_q", "head.w"}));
  EXPECT_EQ(g.no_decay, (std::vector<std::string>{"stem.embed", "blocks.0.attn.b_q", "blocks.0.ln1.gamma"}));
}

// ---------------------------------------------------------------------------------------------
// Checkpoints, threads, instruction sets.

Parameters random_params(std::mt19937& rng, const std::vector<std::pair<std::string, Shape>>& specs) {
  std::vector<Parameters::Entry> e;
  for (const auto& [n, s] : specs) e.emplace_back(n, random_tensor(s, rng));
  return Parameters(std::move(e));
}

// Sizes that make several chunks and cross the one-thread threshold, plus small tensors.
const std::vector<std::pair<std::string, Shape>> kBig = {{"stem.embed", {300, 256}},
                                                         {"blocks.0.attn.w_q", {256, 300}},
                                                         {"blocks.0.attn.b_q", {300}},
                                                         {"blocks.0.ln1.gamma", {256}}};

std::vector<OptimizerOptions> option_sets() {
  OptimizerOptions adamw, sgd, nesterov;
  adamw.lr = 1e-2;
  sgd.kind = nesterov.kind = OptimizerOptions::Kind::sgd;
  sgd.lr = nesterov.lr = 0.05;
  nesterov.nesterov = true;
  nesterov.no_decay = {};
  return {adamw, sgd, nesterov};
}

// `steps` seeded steps (clipped gradients, a cosine schedule) on params; returns the norms.
std::vector<double> train(Optimizer& o, Parameters& params, int64_t first, int64_t steps, uint32_t seed) {
  std::vector<double> norms;
  ScheduleOptions s;
  s.warmup_steps = 2;
  for (int64_t k = first; k < first + steps; ++k) {
    std::mt19937 rng(seed + static_cast<uint32_t>(k));
    Parameters g = params.zeros_like();
    for (size_t i = 0; i < g.size(); ++i)
      g.find(g[i].first)->copy_from(random_tensor(g[i].second.shape(), rng));
    norms.push_back(clip_grad_norm(g, 50.0));
    EXPECT_TRUE(IsOk(o.step(params, g, scheduled_lr(s, o.options().lr, k, 12))));
  }
  return norms;
}

TEST(OptimState, SaveAndLoadContinueBitIdentically) {
  for (const OptimizerOptions& opt : option_sets()) {
    std::mt19937 rng(7);
    const Parameters init = random_params(rng, kBig);
    Parameters a = init.clone();
    auto full = Optimizer::create(opt, a);
    ASSERT_TRUE(full.ok());
    train(*full, a, 0, 12, 100);

    Parameters b = init.clone();
    auto first = Optimizer::create(opt, b);
    ASSERT_TRUE(first.ok());
    train(*first, b, 0, 5, 100);
    // Through a checkpoint file, read back as read-only mapped views.
    const std::string path =
        ::testing::TempDir() + "tessera_optim_state." + std::to_string(getpid()) + ".safetensors";
    ASSERT_TRUE(IsOk(safetensors::write(path, first->state())));
    auto file = safetensors::File::open(path);
    ASSERT_TRUE(file.ok()) << file.status().message();
    std::vector<std::pair<std::string, Tensor>> saved;
    for (const auto& t : file->tensors()) saved.emplace_back(t.name, file->get(t.name).value());
    Parameters resumed = b.clone();
    auto second = Optimizer::create(opt, resumed);
    ASSERT_TRUE(second.ok());
    ASSERT_TRUE(IsOk(second->load_state(saved)));
    EXPECT_EQ(second->steps(), 5);
    EXPECT_TRUE(same_bits(second->state(), first->state()));
    train(*second, resumed, 5, 7, 100);
    EXPECT_EQ(second->steps(), 12);
    EXPECT_TRUE(same_bits(resumed, a));
    EXPECT_TRUE(same_bits(second->state(), full->state()));
    std::remove(path.c_str());
  }
}

TEST(OptimState, StateIsACopy) {
  std::mt19937 rng(3);
  Parameters p = random_params(rng, {{"head.w", {4, 3}}});
  auto o = Optimizer::create(OptimizerOptions{}, p);
  ASSERT_TRUE(o.ok());
  const auto before = o->state();
  ASSERT_EQ(before.size(), 3u);
  EXPECT_EQ(before[0].first, "step");
  EXPECT_EQ(before[0].second.describe(), "i64 (1)");
  EXPECT_EQ(before[1].first, "adamw.m.head.w");
  EXPECT_EQ(before[2].first, "adamw.v.head.w");
  train(*o, p, 0, 1, 1);
  EXPECT_EQ(before[0].second.data<int64_t>()[0], 0);
  EXPECT_EQ(max_abs(before[1].second), 0.0);
}

TEST(OptimThreads, OneAndTwoThreadsGiveTheSameBits) {
  const int saved = omp_get_max_threads();
  for (const OptimizerOptions& opt : option_sets()) {
    Parameters result[2];
    std::vector<std::pair<std::string, Tensor>> state[2];
    std::vector<double> norms[2];
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::mt19937 rng(11);
      Parameters p = random_params(rng, kBig);
      auto o = Optimizer::create(opt, p);
      ASSERT_TRUE(o.ok());
      norms[threads - 1] = train(*o, p, 0, 4, 200);
      result[threads - 1] = p;
      state[threads - 1] = o->state();
    }
    EXPECT_TRUE(same_bits(result[0], result[1]));
    EXPECT_TRUE(same_bits(state[0], state[1]));
    EXPECT_EQ(norms[0], norms[1]);  // bit-equal doubles
  }
  omp_set_num_threads(saved);
}

TEST(OptimIsa, PortableLoopsGiveTheFmaLoopsBits) {
  if (std::string(train::optim_isa()) != "fma") GTEST_SKIP() << "this CPU has no AVX2 + FMA";
  for (const OptimizerOptions& opt : option_sets()) {
    Parameters result[2];
    for (int generic : {0, 1}) {
      std::mt19937 rng(5);
      Parameters p = random_params(rng, kBig);
      auto o = Optimizer::create(opt, p);
      ASSERT_TRUE(o.ok());
      if (generic) {
        train::ScopedOptimGeneric portable;
        EXPECT_STREQ(train::optim_isa(), "generic");
        train(*o, p, 0, 3, 300);
      } else {
        train(*o, p, 0, 3, 300);
      }
      result[generic] = p;
    }
    EXPECT_TRUE(same_bits(result[0], result[1]));
  }
}

// ---------------------------------------------------------------------------------------------
// Gradient helpers.

TEST(OptimHelpers, ClipNormAndScale) {
  Parameters g({{"a", Tensor::from_vector({2}, {3.f, 0.f})}, {"b", Tensor::from_vector({2, 1}, {0.f, 4.f})}});
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 0.0), 5.0);  // no clipping, still the norm
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 10.0), 5.0);
  EXPECT_EQ(g.find("a")->to_vector(), (std::vector<float>{3.f, 0.f}));
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 1.0), 5.0);
  EXPECT_EQ(g.find("b")->to_vector()[1], static_cast<float>(4.0 * (1.0 / (5.0 + 1e-6))));
  scale(g, 2.0);
  EXPECT_EQ(g.find("b")->to_vector()[1], static_cast<float>(4.0 * (1.0 / (5.0 + 1e-6))) * 2.f);
  // A non-finite norm leaves the gradients alone: the trainer stops on all_finite.
  g.find("a")->data<float>()[1] = INFINITY;
  EXPECT_TRUE(std::isinf(clip_grad_norm(g, 1.0)));
  EXPECT_EQ(g.find("a")->to_vector()[1], INFINITY);
}

TEST(OptimHelpers, AllFiniteNamesTheFirstBadGradient) {
  Parameters g({{"stem.embed", Tensor::zeros({70000})},
                {"blocks.0.attn.w_q", Tensor::zeros({3, 3})},
                {"head.w", Tensor::zeros({100000})}});
  std::string bad = "unchanged";
  EXPECT_TRUE(all_finite(g, &bad));
  EXPECT_EQ(bad, "unchanged");
  g.find("head.w")->data<float>()[99999] = NAN;
  EXPECT_FALSE(all_finite(g, &bad));
  EXPECT_EQ(bad, "head.w");
  g.find("blocks.0.attn.w_q")->data<float>()[4] = -INFINITY;
  EXPECT_FALSE(all_finite(g, &bad));
  EXPECT_EQ(bad, "blocks.0.attn.w_q");
  EXPECT_FALSE(all_finite(g));
}

// ---------------------------------------------------------------------------------------------
// Refusals.

void expect_refused(const Status& st, const std::vector<std::string>& words) {
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::invalid_argument);
  for (const auto& w : words)
    EXPECT_NE(st.message().find(w), std::string::npos) << "'" << w << "' in: " << st.message();
}

TEST(OptimErrors, CreateRefusesBadOptionsAndParameters) {
  const Parameters p({{"blocks.0.attn.w_q", Tensor::zeros({4, 4})}});
  OptimizerOptions o;
  o.no_decay = {"norms", "bias"};
  expect_refused(Optimizer::create(o, p).status(), {"no_decay", "\"bias\"", "norms, biases, embeddings"});
  o = {};
  o.lr = -1e-3;
  expect_refused(Optimizer::create(o, p).status(), {"lr", "-0.001"});
  o = {};
  o.beta2 = 1.0;
  o.eps = NAN;
  expect_refused(Optimizer::create(o, p).status(), {"2 problems", "beta2", "eps"});
  o = {};
  o.kind = OptimizerOptions::Kind::sgd;
  o.momentum = 0;
  o.nesterov = true;
  expect_refused(Optimizer::create(o, p).status(), {"nesterov"});
  const Parameters half({{"blocks.0.attn.w_q", Tensor::zeros({4, 4}, DType::bf16)}});
  expect_refused(Optimizer::create(OptimizerOptions{}, half).status(), {"\"blocks.0.attn.w_q\"", "bf16"});
  const Parameters twice({{"head.w", Tensor::zeros({2})}, {"head.w", Tensor::zeros({2})}});
  expect_refused(Optimizer::create(OptimizerOptions{}, twice).status(), {"\"head.w\"", "twice"});
}

TEST(OptimErrors, StepRefusesMismatchesAndChangesNothing) {
  std::mt19937 rng(9);
  Parameters p = random_params(rng, {{"blocks.0.attn.w_q", {4, 4}}, {"blocks.0.attn.b_q", {4}}});
  const Parameters before = p.clone();
  auto o = Optimizer::create(OptimizerOptions{}, p);
  ASSERT_TRUE(o.ok());
  Parameters g = p.zeros_like();
  expect_refused(o->step(p, g, -0.5), {"learning rate", "-0.5"});
  expect_refused(o->step(p, g, NAN), {"learning rate"});

  const Parameters wrong_shape(
      {{"blocks.0.attn.w_q", Tensor::zeros({4, 5})}, {"blocks.0.attn.b_q", Tensor::zeros({4})}});
  expect_refused(o->step(p, wrong_shape, 1e-3), {"gradient \"blocks.0.attn.w_q\"", "(4, 5)", "(4, 4)"});
  const Parameters missing({{"blocks.0.attn.w_q", Tensor::zeros({4, 4})}});
  expect_refused(o->step(p, missing, 1e-3), {"gradient \"blocks.0.attn.b_q\" is missing"});
  const Parameters extra({{"blocks.0.attn.w_q", Tensor::zeros({4, 4})},
                          {"blocks.0.attn.b_q", Tensor::zeros({4})},
                          {"head.w", Tensor::zeros({4, 2})}});
  expect_refused(o->step(p, extra, 1e-3), {"unexpected gradient \"head.w\""});
  const Parameters strided({{"blocks.0.attn.w_q", Tensor::zeros({4, 4}).transpose(0, 1)},
                            {"blocks.0.attn.b_q", Tensor::zeros({4})}});
  expect_refused(o->step(p, strided, 1e-3), {"gradient \"blocks.0.attn.w_q\"", "strided"});
  Parameters other({{"blocks.0.attn.w_q", Tensor::zeros({2, 2})}, {"blocks.0.attn.b_q", Tensor::zeros({4})}});
  expect_refused(o->step(other, g, 1e-3),
                 {"parameter \"blocks.0.attn.w_q\"", "(2, 2)", "created with (4, 4)"});

  EXPECT_EQ(o->steps(), 0);
  EXPECT_TRUE(same_bits(p, before));
  EXPECT_TRUE(IsOk(o->step(p, g, 1e-3)));
  EXPECT_EQ(o->steps(), 1);
}

TEST(OptimErrors, LoadStateNamesEveryBadEntry) {
  std::mt19937 rng(2);
  Parameters p = random_params(rng, {{"blocks.0.attn.w_q", {4, 4}}, {"blocks.0.attn.b_q", {4}}});
  auto o = Optimizer::create(OptimizerOptions{}, p);
  ASSERT_TRUE(o.ok());
  train(*o, p, 0, 2, 1);
  const auto good = o->state();

  auto bad = good;
  bad.erase(bad.begin() + 2);                                              // adamw.v.blocks.0.attn.w_q
  bad[1].second = Tensor::zeros({4, 3});                                   // adamw.m.blocks.0.attn.w_q
  bad.emplace_back("sgd.momentum.blocks.0.attn.b_q", Tensor::zeros({4}));  // another optimizer's
  bad.emplace_back("adamw.m.blocks.0.attn.b_q", Tensor::zeros({4}));       // twice
  bad[3].second = Tensor::zeros({4}, DType::bf16);                         // adamw.v.blocks.0.attn.b_q
  const Status st = o->load_state(bad);
  expect_refused(st,
                 {"\"adamw.v.blocks.0.attn.w_q\" is missing", "\"adamw.m.blocks.0.attn.w_q\" is f32 (4, 3)",
                  "unexpected entry \"sgd.momentum.blocks.0.attn.b_q\"",
                  "\"adamw.m.blocks.0.attn.b_q\" appears twice", "bf16"});

  auto no_step = good;
  no_step.erase(no_step.begin());
  expect_refused(o->load_state(no_step), {"\"step\" is missing"});
  auto negative = good;
  negative[0].second = Tensor::zeros({1}, DType::i64);
  negative[0].second.data<int64_t>()[0] = -1;
  expect_refused(o->load_state(negative), {"\"step\" is -1"});
  auto i32_step = good;
  i32_step[0].second = Tensor::zeros({1}, DType::i32);
  expect_refused(o->load_state(i32_step), {"\"step\" is i32 (1)", "i64 (1)"});

  // Nothing changed by the refusals.
  EXPECT_EQ(o->steps(), 2);
  EXPECT_TRUE(same_bits(o->state(), good));
}

}  // namespace
