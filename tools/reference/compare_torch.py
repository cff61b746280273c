#!/usr/bin/env python3
"""Side-by-side forward-pass timing: Tessera vs PyTorch on the same model shapes, in one run.

For each bench config (configs/bench/*.yaml) this builds the equivalent PyTorch model with random
weights (torch.nn.TransformerEncoderLayer stacks, as PyTorch users run them), times it with the
same batch, sequence length and thread count, runs `tessera bench --json` on the config, and
prints medians and the ratio. Rounds alternate between the two so that machine noise hits both.
Developer tool: the product, its build and its tests never need Python.

    python3 tools/reference/compare_torch.py --tessera build/release/tessera --threads 2

PyTorch must use an optimised BLAS: Debian's reference BLAS makes it ~60x slower, which would
flatter Tessera. The script refuses to run when torch's 2048^3 matmul is below 20 GFLOP/s
(install libopenblas0-pthread, which Debian then selects as libblas.so.3).
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def encoder_stack(d, heads, ff, layers, activation, norm_first):
    layer = torch.nn.TransformerEncoderLayer(d, heads, dim_feedforward=ff, dropout=0.0, activation=activation,
                                             batch_first=True, norm_first=norm_first, layer_norm_eps=1e-12)
    return torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class ViT(torch.nn.Module):  # configs/bench/vit_b16.yaml
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(768, 768)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 768) * 0.02)
        self.pos = torch.nn.Parameter(torch.randn(1, 197, 768) * 0.02)
        self.blocks = encoder_stack(768, 12, 3072, 12, "gelu", True)
        self.norm = torch.nn.LayerNorm(768, eps=1e-12)

    def forward(self, patches):
        x = self.proj(patches)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.norm(self.blocks(x))[:, 0]


class Bert(torch.nn.Module):  # configs/bench/bert_base.yaml
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(30522, 768)
        self.pos = torch.nn.Parameter(torch.randn(1, 512, 768) * 0.02)
        self.blocks = encoder_stack(768, 12, 3072, 12, "gelu", False)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[:, : ids.shape[1]]
        return self.blocks(x).mean(dim=1)


class GPT2(torch.nn.Module):  # configs/bench/gpt2_small.yaml
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50257, 768)
        self.pos = torch.nn.Parameter(torch.randn(1, 1024, 768) * 0.02)
        self.blocks = encoder_stack(768, 12, 3072, 12, gelu_tanh, True)
        self.norm = torch.nn.LayerNorm(768, eps=1e-12)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.embed(ids) + self.pos[:, :T]
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        h = self.norm(self.blocks(x, mask=mask))
        return h @ self.embed.weight.T  # tied LM head, logits for every row


CASES = {  # config -> (model class, input maker)
    "configs/bench/vit_b16.yaml": (ViT, lambda b, t: torch.randn(b, t, 768)),
    "configs/bench/bert_base.yaml": (Bert, lambda b, t: torch.randint(0, 30522, (b, t))),
    "configs/bench/gpt2_small.yaml": (GPT2, lambda b, t: torch.randint(0, 50257, (b, t))),
}
SHAPES = {"configs/bench/vit_b16.yaml": (8, 196), "configs/bench/bert_base.yaml": (8, 128),
          "configs/bench/gpt2_small.yaml": (1, 128)}


def time_torch(model, x, warmup, reps):
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return times


def time_tessera(binary, config, batch, seq, threads, warmup, reps):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([binary, "bench", config, "--batch", str(batch), "--seq-len", str(seq), "--threads",
                        str(threads), "--warmup", str(warmup), "--reps", str(reps), "--no-peak", "--json", f.name],
                       check=True, stdout=subprocess.DEVNULL)
        return json.load(open(f.name))["times_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default="build/release/tessera")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--configs", nargs="*", default=list(CASES))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    t0 = time.perf_counter()
    a @ b
    torch_gemm = 2 * 2048 ** 3 / (time.perf_counter() - t0) / 1e9
    if torch_gemm < 20:
        sys.exit(f"torch's matmul runs at {torch_gemm:.1f} GFLOP/s: a reference BLAS is selected; "
                 "install libopenblas0-pthread first")
    print(f"# torch {torch.__version__}, {args.threads} threads, torch 2048^3 matmul {torch_gemm:.0f} GFLOP/s, "
          f"{args.rounds} rounds x {args.reps} reps, medians", flush=True)
    print(f"{'config':34} {'batch x seq':>11} {'tessera ms':>11} {'torch ms':>9} {'torch/tessera':>14}")
    for config in args.configs:
        cls, make_input = CASES[config]
        batch, seq = SHAPES[config]
        model = cls().eval()
        x = make_input(batch, seq)
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours += time_tessera(args.tessera, config, batch, seq, args.threads, 1, args.reps)
            theirs += time_torch(model, x, 1, args.reps)
        mo, mt = statistics.median(ours), statistics.median(theirs)
        print(f"{config:34} {f'{batch} x {seq}':>11} {mo * 1e3:11.1f} {mt * 1e3:9.1f} {mt / mo:14.2f}", flush=True)


if __name__ == "__main__":
    main()
