// Optimizers for training: AdamW and SGD on f32 master weights, learning-rate schedules, and the
// gradient helpers a training step needs (global-norm clipping, a finiteness check, scaling).
//
//   Parameters master = p->clone(), grads = master.zeros_like();
//   OptimizerOptions opt;                                    // AdamW, lr 1e-3, weight decay 0.01
//   Result<Optimizer> o = Optimizer::create(opt, master);
//   ScheduleOptions sched;
//   sched.warmup_steps = 100;
//   for (int64_t s = 0; s < total; ++s) {
//     grads.zero();
//     ... compute_gradients(cfg, master, batch, targets, &grads) (train.h), once per micro-batch;
//     scale(grads, 1.0 / micro_batches);                     // their mean
//     std::string bad;
//     if (!all_finite(grads, &bad)) { /* stop: bad names the first NaN/Inf gradient */ }
//     double norm = clip_grad_norm(grads, 1.0);
//     Status st = o->step(master, grads, scheduled_lr(sched, opt.lr, s, total));
//   }
//
// Numbers: the same as torch.optim.AdamW / torch.optim.SGD (torch 1.13, single-tensor path) and
// torch.nn.utils.clip_grad_norm_. Scalars (bias corrections, step size, 1 - lr·wd) are computed in
// double and rounded to f32 once, as torch does; elementwise work is f32, with a fused multiply-add
// exactly where torch's vectorised kernels fuse one (so the moments and SGD's sums round as
// torch's do). On tests/data/optim the parameters after each of 20 steps equal torch's bit for bit
// when both start from the same clipped gradients. clip_grad_norm sums in double where torch sums
// in f32, so a clipped gradient may differ from torch's in its last bit (measured: 1.6e-7 of the
// parameters' scale after 20 full steps). Results are bit-identical whatever the thread count and
// on CPUs with or without FMA instructions (fma is exactly rounded either way).
//
// Thread-safety: an Optimizer is used by one thread at a time; it parallelises each step itself
// (OpenMP, over fixed chunks of elements).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/parameters.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

struct OptimizerOptions {
  enum class Kind { adamw, sgd } kind = Kind::adamw;
  double lr = 1e-3;  // the base rate a schedule scales (scheduled_lr); step() takes the rate to use
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  double weight_decay = 0.01;  // AdamW: decoupled (p -= lr·wd·p); SGD: L2, wd·p added to the gradient
  double momentum = 0.9;       // SGD; 0 keeps no momentum state
  bool nesterov = false;       // SGD; needs momentum > 0
  // Groups of parameters that weight decay skips (parameter_group): "norms", "biases", "embeddings".
  std::vector<std::string> no_decay = {"norms", "biases", "embeddings"};
};

// The group a parameter belongs to, by its name (model.h) and shape:
//   "norms"       layer-norm scales and shifts: names ending in .gamma or .beta (ln1, ln2,
//                 final_norm, stem.norm, head.norm, head.transform);
//   "biases"      rank-1 tensors named b, b_*, b<digits> or *bias (attn.b_q … b_o, ffn.b1/b2,
//                 stem.proj_bias, head.lm_bias, head.b, head.pooler.b, head.transform.b);
//   "embeddings"  looked-up rows and learned vectors: stem.embed, stem.type_embed, stem.modality,
//                 stem.cls, stem.dist, pos.table, attn.rel_k, attn.rel_v;
//   "weights"     everything else (the matrices); always decays when weight_decay > 0.
std::string parameter_group(const std::string& name, const Shape& shape);

// Whether weight decay applies to this parameter: weight_decay > 0 and its group is not in no_decay.
bool decays(const OptimizerOptions& options, const std::string& name, const Shape& shape);

// The parameters' names split as the optimizer treats them, each list in parameter order: what a
// trainer prints before it starts.
struct DecayGroups {
  std::vector<std::string> decay, no_decay;
};
DecayGroups decay_groups(const OptimizerOptions& options, const Parameters& params);

class Optimizer {
 public:
  // Checks the options (lr, eps, weight_decay, momentum >= 0; betas in [0, 1); nesterov needs
  // momentum; every no_decay entry a known group) and the parameters (f32, contiguous, unique
  // names), and makes the state: zeros, step 0.
  static Result<Optimizer> create(const OptimizerOptions& options, const Parameters& params);

  Optimizer(Optimizer&&) = default;
  Optimizer& operator=(Optimizer&&) = default;
  Optimizer(const Optimizer&) = delete;  // the state is not shared between optimizers
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of params in place with grads at rate lr (finite, >= 0). params must be the
  // tensors create() saw (same names and shapes; f32, contiguous) and grads the same names and
  // shapes; order does not matter. Every mismatch is reported, naming the tensor, and nothing is
  // updated then.
  //   AdamW (step t = steps() + 1):  p *= 1 - lr·wd  (decaying parameters only)
  //     m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;  p -= lr/(1-β1^t) · m / (√v / √(1-β2^t) + ε)
  //   SGD:  d = g + wd·p (decaying only);  buf = d at the first step, else μ·buf + d;
  //     d = nesterov ? d + μ·buf : buf (momentum > 0);  p -= lr·d
  Status step(Parameters& params, const Parameters& grads, double lr);

  int64_t steps() const { return steps_; }  // updates done so far
  const OptimizerOptions& options() const { return options_; }

  // A copy of the state, for checkpoints: "step" (i64, shape (1)), then per parameter in order
  // "adamw.m.NAME", "adamw.v.NAME" (AdamW) or "sgd.momentum.NAME" (SGD with momentum > 0), f32,
  // the parameter's shape. safetensors::write takes it as it is.
  std::vector<std::pair<std::string, Tensor>> state() const;
  // The same tensors as views of the live state, no copy (what a checkpoint writes): they change
  // with the next step() or load_state().
  std::vector<std::pair<std::string, Tensor>> state_view() const;
  // Replaces the state with a copy of `state` (as state() gives it; any strides). Missing,
  // unexpected, mis-shaped and mis-typed entries are all reported, each by name, and nothing is
  // changed then. A loaded optimizer continues bit for bit as the one that saved the state.
  Status load_state(const std::vector<std::pair<std::string, Tensor>>& state);

 private:
  struct Slot {
    std::string name;
    Shape shape;
    bool decay = false;
    Tensor m;  // AdamW's first moment, or SGD's momentum buffer
    Tensor v;  // AdamW's second moment
  };
  Optimizer() = default;

  OptimizerOptions options_;
  std::vector<Slot> slots_;
  int64_t steps_ = 0;
};

// Learning-rate schedules, as transformers' get_{cosine,linear,constant}_schedule_with_warmup
// (through torch's LambdaLR) with min_lr_ratio 0, and as get_cosine_with_min_lr_schedule_with_warmup
// (min_lr_rate) otherwise. With W = warmup_steps, T = total_steps, r = min_lr_ratio and the
// 0-based step s (the rate for update number s + 1):
//   s < W:     lr = base · s / max(1, W)                       (linear warmup from 0)
//   otherwise, with f the decay factor:
//     cosine:    f = ½(1 + cos(π·p)),  p = min(1, (s - W) / max(1, T - W))
//     linear:    f = max(0, (T - s) / max(1, T - W))
//     then lr = base · (f·(1 - r) + r);  constant: lr = base
// p stops at 1, so past T the rate stays at r·base (transformers' cosine would rise again). A
// negative step counts as 0, a negative warmup as none.
struct ScheduleOptions {
  enum class Kind { cosine, linear, constant } kind = Kind::cosine;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;  // in [0, 1]
};
double scheduled_lr(const ScheduleOptions& options, double base_lr, int64_t step, int64_t total_steps);
// The options a trainer should refuse: warmup_steps < 0, min_lr_ratio outside [0, 1],
// total_steps < 1.
Status check_schedule(const ScheduleOptions& options, int64_t total_steps);

// Gradients for the helpers below are f32 and contiguous, as Parameters::zeros_like makes them;
// any other tensor is a caller's bug, and the helper aborts with a message naming it.

// The global L2 norm of all gradients together (squares summed in double, in parameter order and
// in fixed chunks within each tensor: the same number whatever the thread count). When
// max_norm > 0 and c = max_norm / (norm + 1e-6) < 1, every gradient is multiplied by c (rounded
// to f32), as torch.nn.utils.clip_grad_norm_ does; a non-finite norm leaves them as they are.
// Returns the norm before clipping.
double clip_grad_norm(Parameters& grads, double max_norm);

// True when every gradient value is finite; otherwise *first_bad (when given) is the name of the
// first parameter, in order, with a NaN or Inf.
bool all_finite(const Parameters& grads, std::string* first_bad = nullptr);

// grads *= factor (rounded to f32): the mean of accumulated micro-batches, for one.
void scale(Parameters& grads, double factor);

}  // namespace tessera
