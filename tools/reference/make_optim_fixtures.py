#!/usr/bin/env python3
"""Optimizer fixtures: torch.optim.AdamW and SGD trajectories, clip_grad_norm_ and transformers'
learning-rate schedules, for tessera/optim.h (tests/data/optim).

Four parameters with Tessera's names (a matrix, a bias, a layer-norm scale, an embedding table)
start from seeded values; 20 steps of seeded random gradients (the same for every run, not a
function of the parameters) go through torch.nn.utils.clip_grad_norm_ and then the optimizer,
with the learning rate from a transformers schedule through torch's LambdaLR. Written:
  grads.safetensors       the initial parameters, the gradients of every step before and after
                          clipping, and torch's norms;
  RUN.safetensors         per optimizer run: the parameters after every step, the final state
                          under Tessera's state names, and the options and learning rates;
  schedules.safetensors   transformers' schedules at every step, for several settings (in the
                          metadata: JSON keeps the double rates exactly).
tests/data/optim/README.md describes the format. Developer tool only: the product, its build and
its tests never run Python.

    .venv-ref/bin/python tools/reference/make_optim_fixtures.py [OUT_DIR]

OUT_DIR defaults to tests/data/optim. Seeded, on one thread: a rerun writes the same bytes. Before
writing, it checks that the schedule formula documented in tessera/optim.h gives transformers'
numbers exactly.
"""
import json
import math
import pathlib
import sys

import torch
import transformers
from transformers.optimization import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                                       get_cosine_with_min_lr_schedule_with_warmup,
                                       get_linear_schedule_with_warmup)
from safetensors.torch import save_file

STEPS = 20
MAX_NORM = 1.0
SEED = 2024

# Tessera's names, in parameter order, and how each starts.
PARAMS = [
    ("stem.embed", (10, 8), "normal", 0.25),
    ("blocks.0.ffn.w1", (8, 12), "normal", 8 ** -0.5),
    ("blocks.0.ffn.b1", (12,), "uniform", 0.3),
    ("blocks.0.ln1.gamma", (8,), "scale", 0.5),
]
UNUSED_ROW = 3  # an embedding row no batch looks up: its gradient is always 0

# The optimizer runs: options as Tessera's OptimizerOptions fields, schedule as its ScheduleOptions
# fields plus total_steps. no_decay lists Tessera's groups; here only the matrix is a "weight".
RUNS = [
    dict(name="adamw_cosine",
         what="AdamW, weight decay 0.1 on the matrix only (norms, biases, embeddings excluded), "
              "warmup 5 then cosine to 0 at step 20",
         options=dict(kind="adamw", lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1,
                      no_decay=["norms", "biases", "embeddings"]),
         schedule=dict(kind="cosine", warmup_steps=5, min_lr_ratio=0.0, total_steps=STEPS)),
    dict(name="adamw_nodecay",
         what="AdamW without weight decay, betas (0.8, 0.99), eps 1e-6, constant rate",
         options=dict(kind="adamw", lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.0,
                      no_decay=["norms", "biases", "embeddings"]),
         schedule=dict(kind="constant", warmup_steps=0, min_lr_ratio=0.0, total_steps=STEPS)),
    dict(name="adamw_decay_all",
         what="AdamW, weight decay 0.05 on every parameter (no_decay empty), warmup 4 then cosine "
              "to 0.1 of the rate (transformers' cosine_with_min_lr)",
         options=dict(kind="adamw", lr=3e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05,
                      no_decay=[]),
         schedule=dict(kind="cosine", warmup_steps=4, min_lr_ratio=0.1, total_steps=STEPS)),
    dict(name="sgd_momentum",
         what="SGD, momentum 0.9, weight decay (L2) 0.01 on the matrix only, warmup 3 then linear to 0",
         options=dict(kind="sgd", lr=0.05, momentum=0.9, nesterov=False, weight_decay=0.01,
                      no_decay=["norms", "biases", "embeddings"]),
         schedule=dict(kind="linear", warmup_steps=3, min_lr_ratio=0.0, total_steps=STEPS)),
    dict(name="sgd_nesterov",
         what="SGD, Nesterov momentum 0.9, no weight decay, warmup 2 then constant",
         options=dict(kind="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.0,
                      no_decay=["norms", "biases", "embeddings"]),
         schedule=dict(kind="constant", warmup_steps=2, min_lr_ratio=0.0, total_steps=STEPS)),
    dict(name="sgd_plain",
         what="SGD without momentum, weight decay (L2) 0.02 on every parameter, constant rate",
         options=dict(kind="sgd", lr=0.1, momentum=0.0, nesterov=False, weight_decay=0.02, no_decay=[]),
         schedule=dict(kind="constant", warmup_steps=0, min_lr_ratio=0.0, total_steps=STEPS)),
]

# Schedule settings for schedules.safetensors: every step from 0 to total_steps.
SCHEDULES = [
    dict(kind="cosine", warmup_steps=5, total_steps=20, min_lr_ratio=0.0),
    dict(kind="cosine", warmup_steps=0, total_steps=13, min_lr_ratio=0.0),
    dict(kind="cosine", warmup_steps=6, total_steps=6, min_lr_ratio=0.0),
    dict(kind="cosine", warmup_steps=4, total_steps=20, min_lr_ratio=0.1),
    dict(kind="cosine", warmup_steps=0, total_steps=15, min_lr_ratio=0.5),
    dict(kind="linear", warmup_steps=3, total_steps=20, min_lr_ratio=0.0),
    dict(kind="linear", warmup_steps=0, total_steps=7, min_lr_ratio=0.0),
    dict(kind="constant", warmup_steps=4, total_steps=12, min_lr_ratio=0.0),
    dict(kind="constant", warmup_steps=0, total_steps=5, min_lr_ratio=0.0),
]
SCHEDULE_BASE_LR = 3e-4


def group(name, shape):
    """Tessera's parameter_group for the names used here."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("gamma", "beta"):
        return "norms"
    if len(shape) == 1 and (leaf == "b" or leaf.startswith("b_") or leaf.endswith("bias") or
                            (leaf[0] == "b" and leaf[1:].isdigit())):
        return "biases"
    if name in ("stem.embed", "pos.table") or leaf in ("rel_k", "rel_v"):
        return "embeddings"
    return "weights"


def make_schedule(opt, s):
    """transformers' schedule for Tessera's ScheduleOptions s."""
    w, t = s["warmup_steps"], s["total_steps"]
    if s["kind"] == "constant":
        return get_constant_schedule_with_warmup(opt, w), "get_constant_schedule_with_warmup"
    if s["kind"] == "linear":
        assert s["min_lr_ratio"] == 0
        return get_linear_schedule_with_warmup(opt, w, t), "get_linear_schedule_with_warmup"
    if s["min_lr_ratio"] == 0:
        return get_cosine_schedule_with_warmup(opt, w, t), "get_cosine_schedule_with_warmup"
    return (get_cosine_with_min_lr_schedule_with_warmup(opt, w, t, min_lr_rate=s["min_lr_ratio"]),
            "get_cosine_with_min_lr_schedule_with_warmup")


def formula(s, base, step):
    """The formula tessera/optim.h documents (scheduled_lr), in the same operation order."""
    w, t, r = max(0, s["warmup_steps"]), s["total_steps"], s["min_lr_ratio"]
    step = max(0, step)
    if step < w:
        return base * (float(step) / float(max(1, w)))
    span = float(max(1, t - w))
    if s["kind"] == "constant":
        return base
    if s["kind"] == "cosine":
        f = 0.5 * (1.0 + math.cos(math.pi * min(1.0, float(step - w) / span)))
    else:
        f = max(0.0, float(t - step) / span)
    return base * (f * (1.0 - r) + r)


def scheduled_lrs(s, base, steps):
    """The rate LambdaLR gives for updates 1..steps, and the transformers function used."""
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base)
    sched, fn = make_schedule(opt, s)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs, fn


def initial_params(gen):
    out = {}
    for name, shape, how, x in PARAMS:
        if how == "normal":
            t = torch.randn(shape, generator=gen) * x
        elif how == "uniform":
            t = (torch.rand(shape, generator=gen) * 2 - 1) * x
        else:  # a layer-norm scale around 1
            t = 1 + (torch.rand(shape, generator=gen) * 2 - 1) * x
        out[name] = t.float()
    return out


def gradients(gen):
    """STEPS steps of gradients: per step one overall size, log-uniform in [0.01, 0.3], so that
    with max_norm 1 some steps are clipped and some are not."""
    steps = []
    for _ in range(STEPS):
        u = torch.rand(1, generator=gen).item()
        size = math.exp(math.log(0.01) + (math.log(0.3) - math.log(0.01)) * u)
        g = {name: (torch.randn(shape, generator=gen) * size).float() for name, shape, _, _ in PARAMS}
        g["stem.embed"][UNUSED_ROW] = 0
        steps.append(g)
    return steps


def run(spec, init, grads):
    """One optimizer run: the parameters after every step, the final state, the rates."""
    o, s = spec["options"], spec["schedule"]
    params = {name: init[name].clone().requires_grad_(True) for name, *_ in PARAMS}
    order = [params[name] for name, *_ in PARAMS]
    wd = o["weight_decay"]
    decay = [params[n] for n, shape, *_ in PARAMS if group(n, shape) not in o["no_decay"]]
    rest = [params[n] for n, shape, *_ in PARAMS if group(n, shape) in o["no_decay"]]
    groups = [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if o["kind"] == "adamw":
        opt = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    else:
        opt = torch.optim.SGD(groups, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"])
    sched, fn = make_schedule(opt, s)
    traj = {name: [] for name, *_ in PARAMS}
    lrs = []
    for g in grads:
        for name, *_ in PARAMS:
            params[name].grad = g[name].clone()
        torch.nn.utils.clip_grad_norm_(order, MAX_NORM)
        lrs.append(opt.param_groups[0]["lr"])
        assert all(pg["lr"] == lrs[-1] for pg in opt.param_groups)
        opt.step()
        sched.step()
        for name, *_ in PARAMS:
            traj[name].append(params[name].detach().clone())
    out = {"step": torch.tensor([STEPS], dtype=torch.int64)}
    for name, *_ in PARAMS:
        out[f"param.{name}"] = torch.stack(traj[name])
        st = opt.state[params[name]]
        if o["kind"] == "adamw":
            assert st["step"].item() == STEPS
            out[f"adamw.m.{name}"] = st["exp_avg"]
            out[f"adamw.v.{name}"] = st["exp_avg_sq"]
        elif o["momentum"] > 0:
            out[f"sgd.momentum.{name}"] = st["momentum_buffer"]
    return out, lrs, fn


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def save(path, tensors, meta):
    # One metadata entry: safetensors writes several in no fixed order, and reruns must give the same bytes.
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path),
              metadata={"fixture": json.dumps(meta, sort_keys=True)})


def main():
    out_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/optim")
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)
    init = initial_params(gen)
    grads = gradients(gen)

    # The gradients before and after torch's clipping, and its norms (the same in every run:
    # the gradients do not depend on the parameters).
    tensors, norms = {}, []
    clipped = []
    for g in grads:
        ps = [torch.zeros(shape, requires_grad=True) for _, shape, *_ in PARAMS]
        for p, (name, *_) in zip(ps, PARAMS):
            p.grad = g[name].clone()
        norms.append(torch.nn.utils.clip_grad_norm_(ps, MAX_NORM))
        clipped.append({name: p.grad for p, (name, *_) in zip(ps, PARAMS)})
    for name, *_ in PARAMS:
        tensors[f"init.{name}"] = init[name]
        tensors[f"grad.{name}"] = torch.stack([g[name] for g in grads])
        tensors[f"clipped.{name}"] = torch.stack([c[name] for c in clipped])
    tensors["norm"] = torch.stack(norms).float()
    n_clipped = sum(1 for n in norms if MAX_NORM / (n.item() + 1e-6) < 1)
    save(out_dir / "grads.safetensors", tensors,
         {"steps": STEPS, "max_norm": MAX_NORM, "seed": SEED, "parameters": [n for n, *_ in PARAMS],
          "clipped_steps": n_clipped, **versions()})

    for spec in RUNS:
        tensors, lrs, fn = run(spec, init, grads)
        for k, lr in enumerate(lrs):
            assert lr == formula(spec["schedule"], spec["options"]["lr"], k), (spec["name"], k)
        save(out_dir / f"{spec['name']}.safetensors", tensors,
             {"what": spec["what"], "options": spec["options"], "schedule": spec["schedule"],
              "schedule_function": fn, "lr": lrs, **versions()})

    cases = []
    for s in SCHEDULES:
        lrs, fn = scheduled_lrs(s, SCHEDULE_BASE_LR, s["total_steps"] + 1)
        for k, lr in enumerate(lrs):
            assert lr == formula(s, SCHEDULE_BASE_LR, k), (s, k, lr, formula(s, SCHEDULE_BASE_LR, k))
        cases.append({**s, "function": fn, "lr": lrs})
    # The rates are doubles, kept exactly in the JSON; the one tensor is the steps they are for
    # (safetensors 0.4.3 writes a header that is not JSON for a file without tensors).
    steps = torch.arange(max(s["total_steps"] for s in SCHEDULES) + 1, dtype=torch.int64)
    save(out_dir / "schedules.safetensors", {"step": steps},
         {"base_lr": SCHEDULE_BASE_LR, "cases": cases, **versions()})
    print(f"wrote {len(RUNS) + 2} files to {out_dir}; {n_clipped} of {STEPS} steps clipped")


if __name__ == "__main__":
    main()
