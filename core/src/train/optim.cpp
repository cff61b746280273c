// AdamW and SGD steps, learning-rate schedules and gradient helpers (tessera/optim.h).
//
// The work is elementwise, so plain loops. Every tensor is cut into fixed chunks of kChunk
// elements, and OpenMP shares out the chunks of all tensors together: an element's result never
// depends on the thread count, and the one reduction (the gradient norm) sums per-chunk partials
// in chunk order. The update loops are compiled twice, for AVX2 + FMA and for generic x86-64; they
// fuse only where they call std::fma (this file is built with -ffp-contract=off), and fma is
// exactly rounded on both, so both give the same bits.
#include "tessera/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <set>
#include <unordered_map>

#include "train/optim_isa.h"

namespace tessera {

namespace {

constexpr int64_t kChunk = 16384;        // elements per task
constexpr int64_t kParallelMin = 65536;  // elements in all below which one thread does everything

thread_local bool t_force_generic = false;

bool cpu_has_fma() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

bool use_fma() { return cpu_has_fma() && !t_force_generic; }

#if defined(__x86_64__) || defined(__i386__)
#define TESSERA_FMA __attribute__((target("avx2,fma")))
#else
#define TESSERA_FMA
#endif

// One chunk of a tensor: elements [begin, end) of tensor `index`.
struct Span {
  size_t index;
  int64_t begin, end;
};

std::vector<Span> spans_of(const std::vector<int64_t>& sizes) {
  std::vector<Span> out;
  for (size_t i = 0; i < sizes.size(); ++i)
    for (int64_t b = 0; b < sizes[i]; b += kChunk) out.push_back({i, b, std::min(sizes[i], b + kChunk)});
  return out;
}

// body(k, spans[k]) for every span, shared out among threads when there is enough work.
template <class F>
void for_spans(const std::vector<Span>& spans, int64_t total, F&& body) {
  const int64_t n = static_cast<int64_t>(spans.size());
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t k = 0; k < n; ++k) body(static_cast<size_t>(k), spans[static_cast<size_t>(k)]);
}

// ---- Update loops. Each is written once and instantiated for each instruction set below.

struct AdamWCoef {
  float decay;  // 1 - lr·wd, or 1 for parameters that do not decay (an exact no-op, as torch's)
  float b1, one_minus_b1, b2, one_minus_b2;
  float bc2_sqrt;  // √(1 - β2^t)
  float eps;
  float neg_step;  // -lr / (1 - β1^t)
};

// torch: p.mul_(decay); m.mul_(β1).add_(g, alpha=1-β1); v.mul_(β2).addcmul_(g, g, value=1-β2);
// p.addcdiv_(m, √v / bc2_sqrt + ε, value=-step). Its vectorised add and addcmul fuse the last
// multiply-add; addcdiv computes (value·m) / denom, then adds.
[[gnu::always_inline]] inline void adamw_loop(float* p, const float* g, float* m, float* v, int64_t n,
                                              const AdamWCoef& c) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = std::fma(gi, c.one_minus_b1, m[i] * c.b1);
    const float vi = std::fma(c.one_minus_b2 * gi, gi, v[i] * c.b2);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * c.decay + c.neg_step * mi / (std::sqrt(vi) / c.bc2_sqrt + c.eps);
  }
}

struct SgdCoef {
  bool decay;  // add wd·p to the gradient
  float wd;
  bool momentum;  // keep a momentum buffer
  bool first;     // the buffer starts as the first step's gradient (torch: clone)
  bool nesterov;
  float mu;
  float neg_lr;
};

// torch: d = g.add(p, alpha=wd); buf.mul_(μ).add_(d); d = d.add(buf, alpha=μ) (nesterov);
// p.add_(d, alpha=-lr). Each add with alpha is one fused multiply-add in torch's vectorised add;
// the buffer's add has alpha 1 (no product to fuse), so it rounds μ·buf first. Both sides of each
// choice are computed and one kept, so that the loop vectorises.
template <bool kMomentum>
[[gnu::always_inline]] inline void sgd_loop(float* p, const float* g, float* buf, int64_t n,
                                            const SgdCoef& c) {
  for (int64_t i = 0; i < n; ++i) {
    const float decayed = std::fma(p[i], c.wd, g[i]);
    float d = c.decay ? decayed : g[i];
    if constexpr (kMomentum) {
      const float carried = buf[i] * c.mu + d;
      const float b = c.first ? d : carried;
      buf[i] = b;
      const float ahead = std::fma(b, c.mu, d);
      d = c.nesterov ? ahead : b;
    }
    p[i] = std::fma(d, c.neg_lr, p[i]);
  }
}

TESSERA_FMA void adamw_fma(float* p, const float* g, float* m, float* v, int64_t n, const AdamWCoef& c) {
  adamw_loop(p, g, m, v, n, c);
}
void adamw_generic(float* p, const float* g, float* m, float* v, int64_t n, const AdamWCoef& c) {
  adamw_loop(p, g, m, v, n, c);
}
TESSERA_FMA void sgd_fma(float* p, const float* g, float* buf, int64_t n, const SgdCoef& c) {
  c.momentum ? sgd_loop<true>(p, g, buf, n, c) : sgd_loop<false>(p, g, buf, n, c);
}
void sgd_generic(float* p, const float* g, float* buf, int64_t n, const SgdCoef& c) {
  c.momentum ? sgd_loop<true>(p, g, buf, n, c) : sgd_loop<false>(p, g, buf, n, c);
}

// ---- Names, options and checks.

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

const std::vector<std::string>& known_groups() {
  static const std::vector<std::string> g = {"norms", "biases", "embeddings"};
  return g;
}

bool is_bias_leaf(const std::string& leaf) {
  if (leaf == "b" || leaf == "bias" || leaf.starts_with("b_") || leaf.ends_with("_bias")) return true;
  return leaf.size() > 1 && leaf[0] == 'b' &&
         std::all_of(leaf.begin() + 1, leaf.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

// Problems gathered one per line, reported together.
struct Problems {
  std::vector<std::string> lines;
  void add(std::string m) { lines.push_back(std::move(m)); }
  Status status(const std::string& what) const {
    if (lines.empty()) return Status::Ok();
    std::string m = what + ": ";
    if (lines.size() == 1) return Status::Invalid(m + lines[0]);
    m += std::to_string(lines.size()) + " problems:";
    for (const auto& l : lines) m += "\n  " + l;
    return Status::Invalid(m);
  }
};

void check_options(const OptimizerOptions& o, Problems* pr) {
  auto nonneg = [&](const char* key, double x) {
    if (!(x >= 0) || !std::isfinite(x))
      pr->add(std::string(key) + " must be a finite number >= 0, got " + fmt(x));
  };
  auto beta = [&](const char* key, double x) {
    if (!(x >= 0 && x < 1)) pr->add(std::string(key) + " must be in [0, 1), got " + fmt(x));
  };
  nonneg("lr", o.lr);
  nonneg("weight_decay", o.weight_decay);
  if (o.kind == OptimizerOptions::Kind::adamw) {
    beta("beta1", o.beta1);
    beta("beta2", o.beta2);
    nonneg("eps", o.eps);
  } else {
    nonneg("momentum", o.momentum);
    if (o.nesterov && !(o.momentum > 0))
      pr->add("nesterov needs momentum > 0, got momentum " + fmt(o.momentum));
  }
  const auto& known = known_groups();
  for (const auto& g : o.no_decay)
    if (std::find(known.begin(), known.end(), g) == known.end())
      pr->add("no_decay: unknown group " + quoted(g) + "; the groups are norms, biases, embeddings" +
              (g == "weights" ? " (for no decay at all, set weight_decay to 0)" : ""));
}

// "f32 (2, 3)", and " strided" when not contiguous.
std::string form(const Tensor& t) { return t.describe() + (t.is_contiguous() ? "" : " strided"); }

bool usable(const Tensor& t) { return t.defined() && t.dtype() == DType::f32 && t.is_contiguous(); }

// The f32 data of a gradient for the helpers that take no Status: anything else is a caller's bug.
const Tensor& checked_grad(const std::string& name, const Tensor& t, const char* fn) {
  if (!usable(t)) {
    std::fprintf(
        stderr,
        "tessera: %s: gradient \"%s\" is %s; gradients are f32 and contiguous (Parameters::zeros_like)\n", fn,
        name.c_str(), t.defined() ? form(t).c_str() : "undefined");
    std::abort();
  }
  return t;
}

std::vector<int64_t> sizes_of(const Parameters& ps, const char* fn) {
  std::vector<int64_t> n;
  for (const auto& [name, t] : ps) n.push_back(checked_grad(name, t, fn).numel());
  return n;
}

// Σ x² in double over n values: eight running sums (lane j takes the values at i ≡ j mod 8),
// added in a fixed order at the end; no dependence on threads, and eight add chains, not one.
double sum_of_squares(const float* x, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]) * x[i + j];
  for (; i < n; ++i) acc[i % 8] += static_cast<double>(x[i]) * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

std::vector<const float*> data_of(const Parameters& ps) {
  std::vector<const float*> d;
  for (const auto& [name, t] : ps) d.push_back(t.data<float>());
  return d;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

}  // namespace

const char* train::optim_isa() { return use_fma() ? "fma" : "generic"; }
train::ScopedOptimGeneric::ScopedOptimGeneric() : saved_(t_force_generic) { t_force_generic = true; }
train::ScopedOptimGeneric::~ScopedOptimGeneric() { t_force_generic = saved_; }

std::string parameter_group(const std::string& name, const Shape& shape) {
  const size_t dot = name.rfind('.');
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  if (leaf == "gamma" || leaf == "beta") return "norms";
  if (shape.rank() == 1 && is_bias_leaf(leaf)) return "biases";
  static const std::set<std::string> kTables = {"stem.embed", "stem.type_embed", "stem.modality",
                                                "stem.cls",   "stem.dist",       "pos.table"};
  if (kTables.count(name) || leaf == "rel_k" || leaf == "rel_v") return "embeddings";
  return "weights";
}

bool decays(const OptimizerOptions& options, const std::string& name, const Shape& shape) {
  if (!(options.weight_decay > 0)) return false;
  const std::string g = parameter_group(name, shape);
  return std::find(options.no_decay.begin(), options.no_decay.end(), g) == options.no_decay.end();
}

DecayGroups decay_groups(const OptimizerOptions& options, const Parameters& params) {
  DecayGroups out;
  for (const auto& [name, t] : params)
    (decays(options, name, t.shape()) ? out.decay : out.no_decay).push_back(name);
  return out;
}

// ---- Optimizer

Result<Optimizer> Optimizer::create(const OptimizerOptions& options, const Parameters& params) {
  Problems pr;
  check_options(options, &pr);
  std::set<std::string> seen;
  for (const auto& [name, t] : params) {
    if (!seen.insert(name).second)
      pr.add("parameter " + quoted(name) + " appears twice");
    else if (!usable(t))
      pr.add("parameter " + quoted(name) + " is " + (t.defined() ? form(t) : "undefined") +
             "; the optimizer updates f32 contiguous tensors (Parameters::clone)");
  }
  TSR_RETURN_IF_ERROR(pr.status("optimizer"));

  Optimizer o;
  o.options_ = options;
  const bool adamw = options.kind == OptimizerOptions::Kind::adamw;
  for (const auto& [name, t] : params) {
    Slot s;
    s.name = name;
    s.shape = t.shape();
    s.decay = decays(options, name, t.shape());
    if (adamw || options.momentum > 0) s.m = Tensor::zeros(t.shape());
    if (adamw) s.v = Tensor::zeros(t.shape());
    o.slots_.push_back(std::move(s));
  }
  return o;
}

Status Optimizer::step(Parameters& params, const Parameters& grads, double lr) {
  if (!(lr >= 0) || !std::isfinite(lr))
    return Status::Invalid("optimizer step: the learning rate must be a finite number >= 0, got " + fmt(lr));
  Problems pr;
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < slots_.size(); ++i) index.emplace(slots_[i].name, i);
  std::vector<float*> p(slots_.size());
  std::vector<const float*> g(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    Tensor* pt = params.find(s.name);
    const Tensor* gt = grads.find(s.name);
    if (!pt)
      pr.add("parameter " + quoted(s.name) + " is missing");
    else if (pt->shape() != s.shape)
      pr.add("parameter " + quoted(s.name) + " has shape " + pt->shape().str() +
             "; the optimizer was created with " + s.shape.str());
    else if (!usable(*pt))
      pr.add("parameter " + quoted(s.name) + " is " + form(*pt) +
             "; the optimizer updates f32 contiguous tensors");
    else
      p[i] = pt->data<float>();
    if (!gt)
      pr.add("gradient " + quoted(s.name) + " is missing");
    else if (gt->shape() != s.shape)
      pr.add("gradient " + quoted(s.name) + " has shape " + gt->shape().str() + " but the parameter has " +
             s.shape.str());
    else if (!usable(*gt))
      pr.add("gradient " + quoted(s.name) + " is " + form(*gt) + "; gradients are f32 and contiguous");
    else
      g[i] = gt->data<float>();
  }
  for (const auto& [name, t] : params)
    if (!index.count(name))
      pr.add("unexpected parameter " + quoted(name) + " (the optimizer was not created with it)");
  for (const auto& [name, t] : grads)
    if (!index.count(name)) pr.add("unexpected gradient " + quoted(name) + " (no such parameter)");
  TSR_RETURN_IF_ERROR(pr.status("optimizer step"));

  std::vector<int64_t> sizes;
  for (const Slot& s : slots_) sizes.push_back(s.shape.numel());
  const std::vector<Span> spans = spans_of(sizes);
  const OptimizerOptions& o = options_;
  if (o.kind == OptimizerOptions::Kind::adamw) {
    // Scalars in double, as torch's Python computes them, rounded to f32 where they meet the tensors.
    const double t = static_cast<double>(steps_ + 1);
    const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
    AdamWCoef c{};
    c.b1 = static_cast<float>(o.beta1);
    c.one_minus_b1 = static_cast<float>(1.0 - o.beta1);
    c.b2 = static_cast<float>(o.beta2);
    c.one_minus_b2 = static_cast<float>(1.0 - o.beta2);
    c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    c.eps = static_cast<float>(o.eps);
    c.neg_step = static_cast<float>(-(lr / bc1));
    const float decay = static_cast<float>(1.0 - lr * o.weight_decay);
    const auto loop = use_fma() ? adamw_fma : adamw_generic;
    for_spans(spans, sum(sizes), [&](size_t, const Span& sp) {
      Slot& s = slots_[sp.index];
      AdamWCoef cs = c;
      cs.decay = s.decay ? decay : 1.0f;
      const int64_t b = sp.begin;
      loop(p[sp.index] + b, g[sp.index] + b, s.m.data<float>() + b, s.v.data<float>() + b, sp.end - b, cs);
    });
  } else {
    SgdCoef c{};
    c.wd = static_cast<float>(o.weight_decay);
    c.momentum = o.momentum > 0;
    c.first = steps_ == 0;
    c.nesterov = o.nesterov;
    c.mu = static_cast<float>(o.momentum);
    c.neg_lr = static_cast<float>(-lr);
    const auto loop = use_fma() ? sgd_fma : sgd_generic;
    for_spans(spans, sum(sizes), [&](size_t, const Span& sp) {
      Slot& s = slots_[sp.index];
      SgdCoef cs = c;
      cs.decay = s.decay;
      const int64_t b = sp.begin;
      loop(p[sp.index] + b, g[sp.index] + b, c.momentum ? s.m.data<float>() + b : nullptr, sp.end - b, cs);
    });
  }
  ++steps_;
  return Status::Ok();
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_view() const {
  std::vector<std::pair<std::string, Tensor>> out;
  Tensor step = Tensor::zeros({1}, DType::i64);
  step.data<int64_t>()[0] = steps_;
  out.emplace_back("step", step);
  const bool adamw = options_.kind == OptimizerOptions::Kind::adamw;
  for (const Slot& s : slots_) {
    if (adamw) {
      out.emplace_back("adamw.m." + s.name, s.m);
      out.emplace_back("adamw.v." + s.name, s.v);
    } else if (s.m.defined()) {
      out.emplace_back("sgd.momentum." + s.name, s.m);
    }
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out = state_view();
  for (size_t i = 1; i < out.size(); ++i) out[i].second = out[i].second.clone();
  return out;
}

Status Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state) {
  // What state() would give: each entry's shape and the tensor it is copied into.
  struct Want {
    Shape shape;
    Tensor* dst;
    bool found = false;
  };
  std::unordered_map<std::string, Want> want;
  std::vector<std::string> order;
  const bool adamw = options_.kind == OptimizerOptions::Kind::adamw;
  for (Slot& s : slots_) {
    if (adamw) {
      want["adamw.m." + s.name] = {s.shape, &s.m};
      want["adamw.v." + s.name] = {s.shape, &s.v};
      order.push_back("adamw.m." + s.name);
      order.push_back("adamw.v." + s.name);
    } else if (s.m.defined()) {
      want["sgd.momentum." + s.name] = {s.shape, &s.m};
      order.push_back("sgd.momentum." + s.name);
    }
  }
  Problems pr;
  bool have_step = false;
  int64_t step = 0;
  for (const auto& [name, t] : state) {
    if (name == "step") {
      if (have_step)
        pr.add("entry \"step\" appears twice");
      else if (!t.defined() || t.dtype() != DType::i64 || t.shape() != Shape{1})
        pr.add("entry \"step\" is " + (t.defined() ? t.describe() : std::string("undefined")) +
               "; expected i64 (1)");
      else if ((step = t.data<int64_t>()[0]) < 0)
        pr.add("entry \"step\" is " + std::to_string(step) + "; it counts the updates done, so it is >= 0");
      have_step = true;
      continue;
    }
    auto it = want.find(name);
    if (it == want.end()) {
      pr.add("unexpected entry " + quoted(name) + " (not part of this optimizer's state)");
    } else if (it->second.found) {
      pr.add("entry " + quoted(name) + " appears twice");
    } else {
      it->second.found = true;
      if (!t.defined() || t.dtype() != DType::f32 || t.shape() != it->second.shape)
        pr.add("entry " + quoted(name) + " is " + (t.defined() ? t.describe() : std::string("undefined")) +
               "; expected f32 " + it->second.shape.str());
    }
  }
  if (!have_step) pr.add("entry \"step\" is missing");
  for (const auto& name : order)
    if (!want[name].found) pr.add("entry " + quoted(name) + " is missing");
  TSR_RETURN_IF_ERROR(pr.status("optimizer load_state"));

  for (const auto& [name, t] : state)
    if (name != "step") want[name].dst->copy_from(t);
  steps_ = step;
  return Status::Ok();
}

// ---- Schedules

double scheduled_lr(const ScheduleOptions& o, double base_lr, int64_t step, int64_t total_steps) {
  const int64_t w = std::max<int64_t>(0, o.warmup_steps), s = std::max<int64_t>(0, step);
  if (s < w) return base_lr * (static_cast<double>(s) / static_cast<double>(std::max<int64_t>(1, w)));
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - w));
  double f = 1.0;
  switch (o.kind) {
    case ScheduleOptions::Kind::constant:
      return base_lr;
    case ScheduleOptions::Kind::cosine:
      f = 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(1.0, static_cast<double>(s - w) / span)));
      break;
    case ScheduleOptions::Kind::linear:
      f = std::max(0.0, static_cast<double>(total_steps - s) / span);
      break;
  }
  return base_lr * (f * (1.0 - o.min_lr_ratio) + o.min_lr_ratio);
}

Status check_schedule(const ScheduleOptions& o, int64_t total_steps) {
  Problems pr;
  if (o.warmup_steps < 0) pr.add("warmup_steps must be >= 0, got " + std::to_string(o.warmup_steps));
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1))
    pr.add("min_lr_ratio must be in [0, 1], got " + fmt(o.min_lr_ratio));
  if (total_steps < 1) pr.add("total_steps must be >= 1, got " + std::to_string(total_steps));
  return pr.status("schedule");
}

// ---- Gradient helpers

double clip_grad_norm(Parameters& grads, double max_norm) {
  const std::vector<int64_t> sizes = sizes_of(grads, "clip_grad_norm");
  const std::vector<Span> spans = spans_of(sizes);
  const std::vector<const float*> data = data_of(grads);
  std::vector<double> partial(spans.size());
  for_spans(spans, sum(sizes), [&](size_t k, const Span& sp) {
    partial[k] = sum_of_squares(data[sp.index] + sp.begin, sp.end - sp.begin);
  });
  double total = 0.0;
  for (double s : partial) total += s;  // in parameter order, then chunk order
  const double norm = std::sqrt(total);
  if (max_norm > 0 && std::isfinite(norm)) {
    const double c = max_norm / (norm + 1e-6);
    if (c < 1.0) scale(grads, c);
  }
  return norm;
}

bool all_finite(const Parameters& grads, std::string* first_bad) {
  const std::vector<int64_t> sizes = sizes_of(grads, "all_finite");
  const std::vector<Span> spans = spans_of(sizes);
  const std::vector<const float*> data = data_of(grads);
  std::vector<char> bad(spans.size(), 0);
  for_spans(spans, sum(sizes), [&](size_t k, const Span& sp) {
    const float* x = data[sp.index];
    bool ok = true;
    for (int64_t i = sp.begin; i < sp.end; ++i) ok &= std::isfinite(x[i]);
    bad[k] = !ok;
  });
  for (size_t i = 0; i < spans.size(); ++i)
    if (bad[i]) {
      if (first_bad) *first_bad = grads[spans[i].index].first;
      return false;
    }
  return true;
}

void scale(Parameters& grads, double factor) {
  const std::vector<int64_t> sizes = sizes_of(grads, "scale");
  const float f = static_cast<float>(factor);
  if (f == 1.0f) return;
  const std::vector<Span> spans = spans_of(sizes);
  std::vector<float*> data;
  for (const auto& [name, t] : grads) data.push_back(grads.find(name)->data<float>());
  for_spans(spans, sum(sizes), [&](size_t, const Span& sp) {
    float* x = data[sp.index];
    for (int64_t i = sp.begin; i < sp.end; ++i) x[i] *= f;
  });
}

}  // namespace tessera
