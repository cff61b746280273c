"""Training throughput and peak memory of PyTorch on the models `tessera bench --train` times, for
the side-by-side table of docs/PERFORMANCE.md ("Training: side by side with PyTorch"). The same
shapes and arithmetic as the Tessera configs named below, the same batch, AdamW with clipping at
1.0, on the same number of threads; f32, or bf16 autocast (`--bf16`: PyTorch's CPU mixed
precision, bf16 matmuls with f32 master weights, as `train.precision: bf16`).

    vit   configs/train/fashion_mnist_vit.yaml as it was before 2026-12-05 (bench_train_side_by_side.sh
          sets Tessera's side to this shape; the recipe now has 7x7 patches and d_ff 512): 28x28
          grey images as 49 patches of 4x4 and a CLS row, d_model 128, 4 pre-LN blocks of 4 heads,
          FFN 256 with exact GELU, final norm, mean pool, 10 classes, cross-entropy with label
          smoothing 0.1, batch 128 (real images: --images)
    gpt   configs/train/kjv_char_gpt.yaml: byte-level decoder, pre-LN, tanh GELU, learned
          positions, tied LM head over 259 ids (sizes: --d-model, --layers, --heads, --d-ff, --seq)
    bert  configs/bench/bert_base_train.yaml: BERT-base's body (12 post-LN layers of 768, 12 heads,
          d_ff 3072, exact GELU) at seq 128, trained as a causal byte-level LM, batch 8

Prints one JSON line: examples/s (median of the timed steps, with min and max), the step times,
and the process's peak resident memory (ru_maxrss). Data preparation is not timed. Not a
reproduction of Tessera's numbers (initialisation and data order differ); only the cost of a step.
Developer tool only; run it with OMP_WAIT_POLICY=PASSIVE (Debian's torch 1.13 is 1.9-4x faster
with it on 2 cores) and compare runs taken back to back with `tessera bench --train`:

    OMP_WAIT_POLICY=PASSIVE python3 tools/reference/bench_train_torch.py vit \\
        --images DIR/train-images-idx3-ubyte.gz --labels DIR/train-labels-idx1-ubyte.gz
    OMP_WAIT_POLICY=PASSIVE python3 tools/reference/bench_train_torch.py gpt --text data/kjv/kjv.txt
"""
import argparse
import gzip
import json
import math
import resource
import statistics
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


def attend(q, k, v, causal: bool):
    """(B, H, T, d) each -> (B, H, T, d): the fused kernel where this torch has one (2.0+)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[-2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


class Block(nn.Module):
    def __init__(self, C: int, H: int, F_: int, pre: bool, gelu: str, causal: bool):
        super().__init__()
        self.H, self.pre, self.gelu, self.causal = H, pre, gelu, causal
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.out = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.ffn1, self.ffn2 = nn.Linear(C, F_), nn.Linear(F_, C)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4)
        return self.out(attend(q, k, v, self.causal).transpose(1, 2).reshape(B, T, C))

    def ffn(self, x):
        return self.ffn2(F.gelu(self.ffn1(x), approximate=self.gelu))

    def forward(self, x):
        if self.pre:
            x = x + self.attn(self.ln1(x))
            return x + self.ffn(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ffn(x))


class ViT(nn.Module):
    def __init__(self, n_features=16, T=50, C=128, H=4, layers=4, F_=256, classes=10):
        super().__init__()
        self.proj = nn.Linear(n_features, C)
        self.cls = nn.Parameter(torch.zeros(C))
        self.pos = nn.Parameter(torch.randn(T, C) * 0.02)
        self.blocks = nn.ModuleList(Block(C, H, F_, True, "none", False) for _ in range(layers))
        self.norm = nn.LayerNorm(C)
        self.head = nn.Linear(C, classes)

    def forward(self, rows):  # rows (B, T - 1, n_features)
        B = rows.shape[0]
        x = torch.cat([self.cls.expand(B, 1, -1), self.proj(rows)], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x).mean(dim=1))


class ByteLM(nn.Module):
    def __init__(self, V, T, C, H, layers, F_, pre: bool, gelu: str):
        super().__init__()
        self.embed = nn.Embedding(V, C)
        self.pos = nn.Parameter(torch.randn(T, C) * 0.02)
        self.blocks = nn.ModuleList(Block(C, H, F_, pre, gelu, True) for _ in range(layers))
        self.norm = nn.LayerNorm(C) if pre else nn.Identity()

    def forward(self, ids):  # (B, T) -> logits (B, T, V), the head tied to the embedding
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x) @ self.embed.weight.t()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=["vit", "gpt", "bert"])
    ap.add_argument("--images", help="vit: Fashion-MNIST's train-images-idx3-ubyte.gz")
    ap.add_argument("--labels", help="vit: train-labels-idx1-ubyte.gz")
    ap.add_argument("--text", help="gpt, bert: the byte stream (data/kjv/kjv.txt)")
    ap.add_argument("--batch", type=int, help="default: 128 (vit), 32 (gpt), 8 (bert)")
    ap.add_argument("--d-model", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--d-ff", type=int, default=768)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="torch.autocast(cpu, bfloat16)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.model == "vit":
        B = a.batch or 128
        x = patches(read_idx(a.images), 4, 0.2860, 0.3530)
        y = torch.from_numpy(read_idx(a.labels).astype(np.int64))
        model = ViT()

        def batch(step):
            idx = torch.randint(0, x.shape[0], (B,), generator=torch.Generator().manual_seed(step))
            return x[idx], y[idx]

        def loss_of(inp, tgt):
            return F.cross_entropy(model(inp), tgt, label_smoothing=0.1)
    else:
        B = a.batch or (32 if a.model == "gpt" else 8)
        stream = torch.from_numpy(np.frombuffer(open(a.text, "rb").read(), dtype=np.uint8).astype(np.int64))
        if a.model == "gpt":
            model = ByteLM(259, a.seq, a.d_model, a.heads, a.layers, a.d_ff, True, "tanh")
            T = a.seq
        else:
            T = 128
            model = ByteLM(259, T, 768, 12, 12, 3072, False, "none")

        def batch(step):
            off = torch.randint(0, stream.numel() - T - 1, (B,), generator=torch.Generator().manual_seed(step))
            w = torch.stack([stream[o:o + T + 1] for o in off.tolist()])
            return w[:, :-1], w[:, 1:]

        def loss_of(inp, tgt):
            z = model(inp)
            return F.cross_entropy(z.reshape(-1, z.shape[-1]).float(), tgt.reshape(-1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    times = []
    for step in range(a.warmup + a.steps):
        inp, tgt = batch(step)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = loss_of(inp, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(json.dumps({
        "torch": torch.__version__, "model": a.model, "dtype": "bf16" if a.bf16 else "f32", "threads": a.threads,
        "batch": B, "parameters": sum(p.numel() for p in model.parameters()),
        "examples_per_s": B / med, "median_s": med, "min_s": min(times), "max_s": max(times),
        "spread": max(times) / min(times), "times_s": times, "last_loss": loss.item(),
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


if __name__ == "__main__":
    main()
