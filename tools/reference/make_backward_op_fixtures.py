#!/usr/bin/env python3
"""PyTorch autograd references for single training ops: cross-entropy, layer norm, activations.

Seeded f32 inputs; PyTorch computes in float64 from them (F.cross_entropy with ignore_index=-1,
reduction="sum" and label smoothing; F.layer_norm; F.relu and F.gelu, exact and tanh) and
backpropagates (for y: the scalar sum(dy * y) with a given dy). Writes backward_ops.safetensors:
  - ce.logits (6, 11) F32, ce.targets (6,) I32 (-1: no loss), ce.dlogits_eps0 and
    ce.dlogits_eps01 (6, 11) (label smoothing 0 and 0.1 as f32); metadata ce.loss_eps0 and
    ce.loss_eps01 hold the loss sums as decimal float64;
  - ln.x, ln.dy, ln.y, ln.dx (5, 24), ln.gamma, ln.beta, ln.dgamma, ln.dbeta (24,), eps 1e-5;
  - act.x, act.dy (64,) and act.dx_relu, act.dx_gelu_erf, act.dx_gelu_tanh (64,).
Results are stored rounded to F32 (Tessera reads no F64). Developer tool only: the product, its
build and its tests never run Python.

    .venv-ref/bin/python3 tools/reference/make_backward_op_fixtures.py tests/data/reference
"""
import pathlib
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file


def uniform(gen: torch.Generator, shape, lo: float, hi: float) -> torch.Tensor:
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo).contiguous()


def grad_of(fn, *inputs: torch.Tensor):
    """fn's value and the gradients of its scalar output with respect to inputs (f32 -> float64)."""
    leaves = [t.double().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward()
    return out.detach(), [leaf.grad.float() for leaf in leaves]


def main(out_dir: pathlib.Path) -> None:
    gen = torch.Generator().manual_seed(2027)
    tensors, meta = {}, {"torch": torch.__version__}

    logits = uniform(gen, (6, 11), -5.0, 5.0)
    targets = torch.tensor([3, -1, 0, 10, 7, -1], dtype=torch.int32)
    tensors["ce.logits"], tensors["ce.targets"] = logits, targets
    eps01 = torch.tensor(0.1, dtype=torch.float32).item()  # the float Tessera's label_smoothing holds
    for name, eps in (("eps0", 0.0), ("eps01", eps01)):
        loss, (dlogits,) = grad_of(
            lambda l: F.cross_entropy(l, targets.long(), ignore_index=-1, reduction="sum", label_smoothing=eps),
            logits)
        tensors[f"ce.dlogits_{name}"] = dlogits
        meta[f"ce.loss_{name}"] = repr(loss.item())

    x, dy = uniform(gen, (5, 24), -2.0, 3.0), uniform(gen, (5, 24), -1.0, 1.0)
    gamma, beta = uniform(gen, (24,), 0.5, 1.5), uniform(gen, (24,), -0.5, 0.5)
    with torch.no_grad():
        y = F.layer_norm(x.double(), (24,), gamma.double(), beta.double(), eps=1e-5)
    _, (dx, dgamma, dbeta) = grad_of(
        lambda a, g, b: (F.layer_norm(a, (24,), g, b, eps=1e-5) * dy.double()).sum(), x, gamma, beta)
    tensors.update({"ln.x": x, "ln.dy": dy, "ln.gamma": gamma, "ln.beta": beta, "ln.y": y.float(),
                    "ln.dx": dx, "ln.dgamma": dgamma, "ln.dbeta": dbeta})

    ax, ady = uniform(gen, (64,), -5.0, 5.0), uniform(gen, (64,), -1.0, 1.0)
    tensors["act.x"], tensors["act.dy"] = ax, ady
    for name, act in (("relu", F.relu), ("gelu_erf", lambda t: F.gelu(t)),
                      ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))):
        _, (dx,) = grad_of(lambda t: (act(t) * ady.double()).sum(), ax)
        tensors[f"act.dx_{name}"] = dx

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "backward_ops.safetensors"), metadata=meta)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/reference"))
