// Training: the loss of one batch and the gradient of every parameter.
//
//   Result<Parameters> p = Parameters::resolve(exp->model);
//   Parameters master = p->clone(), grads = master.zeros_like();
//   Targets t;
//   t.tokens = next_token_targets(batch);             // (B, T) i32, -1: no loss on that row
//   Result<LossValue> l = compute_gradients(exp->model, master, batch, t, &grads);
//   // grads now holds d loss / d parameter, under the parameters' own names
//
// The loss is one of three, chosen by which target is given:
//   - tokens (B, T') i32: cross-entropy of the LM head's logits at every row whose target is not
//     -1, averaged over those rows (next-token LM: the ids shifted left, -1 at padding and at each
//     item's last row; masked LM: the original id at the masked rows only);
//   - labels (B) i32: cross-entropy of the classifier's logits, averaged over the items;
//   - probe (B, T', C) f32: Σ probe ⊙ hidden (the final rows, after the final norm): a loss for
//     models without a head, and for checking any layer's gradient against a reference.
// Label smoothing ε spreads ε of each target's mass evenly over the classes (or vocabulary).
//
// Gradients are added to *grads (+=), so micro-batches accumulate; zero them between steps.
// Parameters must be f32 (Parameters::clone makes them so). Thread-safety: one call at a time per
// grads object; the parameters are only read.
#pragma once

#include <cstdint>

#include "tessera/model.h"
#include "tessera/parameters.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

struct Targets {
  Tensor tokens;  // (B, T') i32
  Tensor labels;  // (B) i32
  Tensor probe;   // (B, T', C) f32
  float label_smoothing = 0.f;
};

struct GradOptions {
  bool reference = false;  // plain loops instead of oneDNN (forward and backward)
};

struct LossValue {
  double loss = 0;      // the batch's loss (a mean over `counted`, or the probe's sum)
  int64_t counted = 0;  // rows (tokens) or items (labels) the loss averages over
  Tensor d_rows;        // (B, T, F) the gradient of the input feature rows (features stems)
  Outputs outputs;      // hidden rows (and logits) of the forward pass
};

// Next-token targets for a batch of token ids: ids shifted left by one within each sequence, -1
// at padding rows and at each sequence's last row.
Tensor next_token_targets(const Batch& batch);

// The forward pass on `params`, the loss against `targets`, and the backward pass adding
// d loss / d parameter to *grads (which must hold a tensor of each parameter's shape).
Result<LossValue> compute_gradients(const ModelConfig& cfg, const Parameters& params, const Batch& batch,
                                    const Targets& targets, Parameters* grads, const GradOptions& options = {});

}  // namespace tessera
