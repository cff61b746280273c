"""Training throughput of PyTorch on the Fashion-MNIST ViT that `tessera train` trains, for the
"Training throughput" table of docs/PERFORMANCE.md: the same shapes and arithmetic (f32, 28x28
grey images cut into 49 patches of 4x4 pixels plus a CLS row, d_model 96, 4 pre-LN blocks of 4
heads, FFN 192 with exact GELU, final norm, classifier on the CLS row, cross-entropy, AdamW), the
same batch size, on the same number of threads. Prints examples/s over the timed steps, as
`tessera train` prints it (data preparation not counted).

Not a reproduction of Tessera's numbers (its initialisation and data order differ); only the
cost of a step. Developer tool only.

    OMP_WAIT_POLICY=PASSIVE python3 tools/reference/bench_train_torch.py \\
        --images DIR/train-images-idx3-ubyte.gz --labels DIR/train-labels-idx1-ubyte.gz
"""
import argparse
import gzip
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def patches(images: np.ndarray, patch: int, mean: float, std: float) -> torch.Tensor:
    """(N, 28, 28) bytes -> (N, 49, 16) normalised rows, row-major patches, pixels row-major."""
    n, h, w = images.shape
    x = (images.astype(np.float32) / 255.0 - mean) / std
    x = x.reshape(n, h // patch, patch, w // patch, patch).transpose(0, 1, 3, 2, 4)
    return torch.from_numpy(np.ascontiguousarray(x.reshape(n, (h // patch) * (w // patch), patch * patch)))


class Block(nn.Module):
    def __init__(self, C: int, H: int, F_: int):
        super().__init__()
        self.H = H
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.out = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.ffn1, self.ffn2 = nn.Linear(C, F_), nn.Linear(F_, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4)
        w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(C // self.H), dim=-1)
        x = x + self.out((w @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.ffn2(F.gelu(self.ffn1(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, n_features=16, T=50, C=96, H=4, layers=4, F_=192, classes=10):
        super().__init__()
        self.proj = nn.Linear(n_features, C)
        self.cls = nn.Parameter(torch.zeros(C))
        self.pos = nn.Parameter(torch.randn(T, C) * 0.02)
        self.blocks = nn.ModuleList(Block(C, H, F_) for _ in range(layers))
        self.norm = nn.LayerNorm(C)
        self.head = nn.Linear(C, classes)

    def forward(self, rows):  # rows (B, T - 1, n_features)
        B = rows.shape[0]
        x = torch.cat([self.cls.expand(B, 1, -1), self.proj(rows)], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", required=True)
    ap.add_argument("--labels", required=True)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x = patches(read_idx(a.images), 4, 0.2860, 0.3530)
    y = torch.from_numpy(read_idx(a.labels).astype(np.int64))
    model = ViT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    order = torch.randperm(x.shape[0])
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        idx = order[(step * a.batch) % (x.shape[0] - a.batch):][:a.batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    secs = time.perf_counter() - t0
    print(f"torch {torch.__version__}, {a.threads} threads: {a.steps * a.batch / secs:.1f} examples/s "
          f"({a.steps} steps of {a.batch}, last loss {loss.item():.4f})")


if __name__ == "__main__":
    main()
