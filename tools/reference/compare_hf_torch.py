#!/usr/bin/env python3
"""Real shapes, side by side: Tessera vs Hugging Face transformers on PyTorch, in one run.

Two cases, each timed in alternating rounds so that machine noise hits both sides alike:

  minilm  all-MiniLM-L6-v2 with its real weights (tools/setup_minilm.sh): 32 sequences of 128
          tokens per forward pass, mean pooling and L2 normalisation included (what
          sentence-transformers does). Tessera: `tessera bench configs/bench/minilm.yaml`.
  gpt2    GPT-2 small's shape (random weights: the real ones are not reachable offline): a
          128-token prompt in one forward (prefill), then 128 tokens one at a time with the KV cache
          (decode, greedy; PyTorch's decode also on 1 thread, its faster setting here). Tessera: `tessera bench configs/bench/gpt2_small.yaml --decode 128`;
          PyTorch: GPT2LMHeadModel with use_cache and past_key_values, greedy.

Both sides get the same shapes and thread count; token ids are random on both (values do not
change the work). Prints medians (seconds) and the ratio PyTorch / Tessera (> 1: Tessera is
faster). Developer tool: the product, its build and its tests never need Python.

    .venv-ref/bin/python tools/reference/compare_hf_torch.py --tessera build/release/tessera --threads 2

PyTorch must use an optimised BLAS (libopenblas0-pthread); the script refuses to run when torch's
2048^3 matmul is below 20 GFLOP/s, which would flatter Tessera.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def check_blas():
    a = torch.randn(2048, 2048)
    a @ a
    t = time.perf_counter()
    a @ a
    gf = 2 * 2048 ** 3 / (time.perf_counter() - t) / 1e9
    if gf < 20:
        sys.exit(f"torch's matmul runs at {gf:.1f} GFLOP/s: reference BLAS; install libopenblas0-pthread")
    return gf


def tessera(binary, args):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.json")
        subprocess.run([binary, "bench", *args, "--json", path], check=True, capture_output=True, text=True)
        with open(path) as f:
            return json.load(f)


def minilm_torch(folder, batch, seq, reps):
    from transformers import BertModel

    model = BertModel.from_pretrained(folder, add_pooling_layer=False).eval()
    ids = torch.randint(1000, 30000, (batch, seq), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    times = []
    with torch.no_grad():
        for i in range(reps + 2):
            t = time.perf_counter()
            h = model(input_ids=ids, attention_mask=mask).last_hidden_state
            v = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            torch.nn.functional.normalize(v, dim=-1)
            if i >= 2:
                times.append(time.perf_counter() - t)
    return times


def gpt2_torch(prompt, new, reps):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()
    ids = torch.randint(0, 50257, (1, prompt), generator=torch.Generator().manual_seed(0))
    pre, dec = [], []
    with torch.no_grad():
        for i in range(reps + 1):
            t = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            p = time.perf_counter() - t
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            t = time.perf_counter()
            for _ in range(new):
                out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            d = time.perf_counter() - t
            if i >= 1:
                pre.append(p)
                dec.append(d)
    return pre, dec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default="build/release/tessera")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--minilm", default=os.path.expanduser("~/.cache/tessera/models/all-MiniLM-L6-v2"))
    ap.add_argument("--cases", nargs="*", default=["minilm", "gpt2"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    blas = check_blas()
    print(f"torch {torch.__version__}, {a.threads} threads, torch matmul {blas:.0f} GFLOP/s", flush=True)
    # PyTorch 1.13 with OpenBLAS decodes slower on 2 threads than on 1 (its OpenMP and OpenBLAS's
    # threads contend on one-row matmuls), so its decode is also timed on 1 thread and the faster
    # figure is the one compared.
    res = {"minilm": ([], []), "gpt2_prefill": ([], []), "gpt2_decode": ([], []), "gpt2_decode_torch1": ([], [])}
    for r in range(a.rounds):
        if "minilm" in a.cases:
            j = tessera(a.tessera, ["configs/bench/minilm.yaml", "--threads", str(a.threads), "--reps", str(a.reps),
                                    "--no-peak"])
            res["minilm"][0].extend(j["times_s"])
            res["minilm"][1].extend(minilm_torch(a.minilm, 32, 128, a.reps))
        if "gpt2" in a.cases:
            j = tessera(a.tessera, ["configs/bench/gpt2_small.yaml", "--threads", str(a.threads), "--reps",
                                    str(a.reps), "--decode", "128", "--no-peak"])
            res["gpt2_prefill"][0].extend(j["prefill_times_s"])
            res["gpt2_decode"][0].extend(j["decode_times_s"])
            p, d = gpt2_torch(128, 128, a.reps)
            res["gpt2_prefill"][1].extend(p)
            res["gpt2_decode"][1].extend(d)
            if a.threads > 1:
                torch.set_num_threads(1)
                _, d1 = gpt2_torch(128, 128, a.reps)
                torch.set_num_threads(a.threads)
                res["gpt2_decode_torch1"][0].extend(j["decode_times_s"])
                res["gpt2_decode_torch1"][1].extend(d1)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    units = {"minilm": (32, "sentences/s"), "gpt2_prefill": (128, "tokens/s"), "gpt2_decode": (128, "tokens/s"),
             "gpt2_decode_torch1": (128, "tokens/s")}
    print(f"{'case':18} {'tessera s':>10} {'torch s':>10} {'tessera rate':>16} {'torch rate':>16} {'torch/tessera':>14}")
    for case, (t, p) in res.items():
        if not t:
            continue
        mt, mp = statistics.median(t), statistics.median(p)
        n, unit = units[case]
        print(f"{case:18} {mt:10.4f} {mp:10.4f} {n / mt:11.1f} {unit:>4} {n / mp:11.1f} {unit:>4} {mp / mt:13.2f}x")


if __name__ == "__main__":
    main()
