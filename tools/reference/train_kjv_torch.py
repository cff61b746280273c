"""PyTorch training the KJV character GPT of configs/train/kjv_char_gpt.yaml with the same
hyperparameters, to hold `tessera train`'s held-out bits per character against it for the same
wall-clock time (docs/TRAINING.md, "KJV character GPT"): the same model (bench_train_torch.ByteLM:
byte ids, learned positions, pre-LN blocks with tanh GELU, final norm, LM head tied to the
embedding), normal(0, 0.02) weights and zero biases, AdamW (betas 0.9/0.999, eps 1e-8, weight
decay on the matrices only: norms, biases, the embedding and the positions excluded, as
train.no_decay's default), linear warm-up from 0 then cosine to min_lr_ratio x lr, clipping at
1.0, windows of --seq + 1 bytes at offsets drawn uniformly from the first 90 % of the text, and
the last 10 % held out and scored in non-overlapping windows of --seq, each predicting its --seq
next bytes (as `tessera train` scores it). Initialisation and window draws are torch's, not
Tessera's: the curves are comparable, not identical.

Prints one JSON line per evaluation ({"step", "seconds", "bits_per_char", ...}) and a last one.
--max-seconds stops at a wall-clock budget; set --steps to what fits in it (the schedule spans
--steps), from `bench_train_torch.py gpt`'s step time. Developer tool:

    OMP_WAIT_POLICY=PASSIVE python3 tools/reference/train_kjv_torch.py --text data/kjv/kjv.txt \\
        --steps 3350 --eval-every 1675 --max-seconds 1110     # the recipe's model and settings by default
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_torch import ByteLM  # noqa: E402


def held_out_bits(model, val: torch.Tensor, T: int, batch: int, bf16: bool) -> float:
    n = (val.numel() - 1) // T
    total, counted = 0.0, 0
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for w0 in range(0, n, batch):
            ws = range(w0, min(n, w0 + batch))
            x = torch.stack([val[w * T:w * T + T] for w in ws])
            y = torch.stack([val[w * T + 1:w * T + T + 1] for w in ws])
            z = model(x).float()
            total += F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1), reduction="sum").item()
            counted += y.numel()
    model.train()
    return total / counted / math.log(2.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", required=True, help="data/kjv/kjv.txt (tools/data/kjv.sh)")
    ap.add_argument("--d-model", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--d-ff", type=int, default=768)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5600)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=0, help="default: at the end only")
    ap.add_argument("--max-seconds", type=float, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="torch.autocast(cpu, bfloat16)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)
    data = np.frombuffer(open(a.text, "rb").read(), dtype=np.uint8).astype(np.int64)
    n_val = int(round(0.1 * data.size))
    stream = torch.from_numpy(data[:-n_val].copy())
    val = torch.from_numpy(data[-n_val:].copy())
    T, B = a.seq, a.batch

    model = ByteLM(259, T, a.d_model, a.heads, a.layers, a.d_ff, True, "tanh")
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.dim() == 2 and name not in ("pos", "embed.weight"):
            nn.init.normal_(p, 0.0, 0.02)
            decay.append(p)
        else:
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name in ("pos", "embed.weight"):
                nn.init.normal_(p, 0.0, 0.02)
            no_decay.append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.999), eps=1e-8)

    def lr_at(step):  # the rate of update `step` (0-based), as tessera's scheduled_lr
        if step < a.warmup:
            return a.lr * step / max(1, a.warmup)
        f = 0.5 * (1 + math.cos(math.pi * min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))))
        return a.lr * (f * (1 - a.min_lr_ratio) + a.min_lr_ratio)

    t0 = time.perf_counter()
    step, loss = 0, torch.tensor(0.0)
    for step in range(a.steps):
        off = torch.randint(0, stream.numel() - T - 1, (B,), generator=g)
        w = torch.stack([stream[o:o + T + 1] for o in off.tolist()])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            z = model(w[:, :-1])
        loss = F.cross_entropy(z.reshape(-1, z.shape[-1]).float(), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        out_of_time = a.max_seconds > 0 and time.perf_counter() - t0 >= a.max_seconds
        if (a.eval_every and done % a.eval_every == 0) or done == a.steps or out_of_time:
            train_s = time.perf_counter() - t0
            bits = held_out_bits(model, val, T, 64, a.bf16)
            print(json.dumps({"step": done, "seconds": round(train_s, 1), "bits_per_char": bits,
                              "train_loss_bits": loss.item() / math.log(2.0)}), flush=True)
        if out_of_time:
            break
    print(json.dumps({"torch": torch.__version__, "threads": a.threads, "steps": step + 1,
                      "seconds": round(time.perf_counter() - t0, 1), "bytes_seen": (step + 1) * B * T,
                      "parameters": sum(p.numel() for p in model.parameters())}), flush=True)


if __name__ == "__main__":
    main()
