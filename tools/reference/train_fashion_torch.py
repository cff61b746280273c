"""PyTorch training the Fashion-MNIST ViT of configs/train/fashion_mnist_vit.yaml as it was before
2026-12-05 (4x4 patches, d_ff 256; the recipe now has 7x7 patches and d_ff 512) with the same
hyperparameters, to hold `tessera train`'s learning curve against it (docs/TRAINING.md): the same
model (bench_train_torch.ViT: 49 patches of 4x4 and a CLS row, d_model 128, 4 pre-LN blocks of 4
heads, FFN 256 with exact GELU, final norm, mean pool), Glorot-normal weights, AdamW (lr 2e-3,
betas 0.9/0.999, weight decay 0.05 on the matrices only: norms, biases, CLS and positions
excluded, as train.no_decay's default), 200 warm-up steps then cosine to 0, label smoothing 0.1,
clipping at 1.0, batch 128, RandomCrop(28, padding=2) + RandomHorizontalFlip, 5 % of the training
images held out (seeded) and evaluated every --eval-every steps, the test set once at the end with
the best weights. Initialisation, split and data order are drawn by torch, not Tessera: the curves
are comparable, not identical.

Prints one JSON line per evaluation ({"step", "seconds", "val_accuracy", ...}) and one for the
test. --max-seconds stops at a wall-clock budget (the schedule still spans --steps). Developer tool:

    OMP_WAIT_POLICY=PASSIVE python3 tools/reference/train_fashion_torch.py --data DIR
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
from bench_train_torch import ViT, patches, read_idx  # noqa: E402

MEAN, STD = 0.2860, 0.3530


def augment(img: torch.Tensor, g: torch.Generator, pad: int) -> torch.Tensor:
    """(B, 28, 28) uint8: a 28x28 crop of the image padded with `pad` black pixels, then a mirror on
    a fair coin (torchvision's RandomCrop(28, padding=pad) and RandomHorizontalFlip)."""
    B, H, W = img.shape
    p = F.pad(img, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (B,), generator=g)
    dx = torch.randint(0, 2 * pad + 1, (B,), generator=g)
    flip = torch.rand(B, generator=g) < 0.5
    out = torch.empty_like(img)
    for i in range(B):
        c = p[i, dy[i]:dy[i] + H, dx[i]:dx[i] + W]
        out[i] = c.flip(-1) if flip[i] else c
    return out


def evaluate(model, x, y, batch=500):
    model.eval()
    right, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            z = model(x[i:i + batch])
            loss += F.cross_entropy(z, y[i:i + batch], reduction="sum").item()
            right += (z.argmax(-1) == y[i:i + batch]).sum().item()
    model.train()
    return right / x.shape[0], loss / x.shape[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="folder of Fashion-MNIST's four .gz IDX files")
    ap.add_argument("--steps", type=int, default=12000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=1500)
    ap.add_argument("--crop-padding", type=int, default=2)
    ap.add_argument("--no-augment", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)
    imgs = torch.from_numpy(read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz")).copy())
    labels = torch.from_numpy(read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz")).astype(np.int64))
    perm = torch.randperm(imgs.shape[0], generator=g)
    n_val = imgs.shape[0] // 20
    val_idx, tr_idx = perm[:n_val], perm[n_val:]
    x_val, y_val = patches(imgs[val_idx].numpy(), 4, MEAN, STD), labels[val_idx]
    tr_imgs, tr_y = imgs[tr_idx], labels[tr_idx]
    x_test = patches(read_idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz")), 4, MEAN, STD)
    y_test = torch.from_numpy(read_idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz")).astype(np.int64))

    model = ViT()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.dim() == 2 and name != "pos":
            nn.init.xavier_normal_(p)
            decay.append(p)
        else:
            no_decay.append(p)
    nn.init.xavier_normal_(model.pos)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    warm = 200

    def lr_at(step):  # step 0-based, the rate of the update after it
        if step < warm:
            return a.lr * (step + 1) / warm
        return a.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, a.steps - warm)))

    n = tr_imgs.shape[0]
    order = torch.randperm(n, generator=g)
    pos = 0
    best, best_state = -1.0, None
    t0 = time.perf_counter()
    step = 0
    for step in range(a.steps):
        if pos + a.batch > n:
            order, pos = torch.randperm(n, generator=g), 0
        idx = order[pos:pos + a.batch]
        pos += a.batch
        img = tr_imgs[idx] if a.no_augment else augment(tr_imgs[idx], g, a.crop_padding)
        x = patches(img.numpy(), 4, MEAN, STD)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = F.cross_entropy(model(x), tr_y[idx], label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        out_of_time = a.max_seconds > 0 and time.perf_counter() - t0 >= a.max_seconds
        if done % a.eval_every == 0 or done == a.steps or out_of_time:
            acc, vloss = evaluate(model, x_val, y_val)
            print(json.dumps({"step": done, "seconds": round(time.perf_counter() - t0, 1), "val_accuracy": acc,
                              "val_loss": vloss, "train_loss": loss.item()}), flush=True)
            if acc > best:
                best, best_state = acc, {k: v.clone() for k, v in model.state_dict().items()}
        if out_of_time:
            break
    model.load_state_dict(best_state)
    acc, tloss = evaluate(model, x_test, y_test)
    print(json.dumps({"torch": torch.__version__, "steps": step + 1, "seconds": round(time.perf_counter() - t0, 1),
                      "best_val_accuracy": best, "test_accuracy": acc, "test_loss": tloss}), flush=True)


if __name__ == "__main__":
    main()
