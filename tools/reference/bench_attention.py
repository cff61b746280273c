#!/usr/bin/env python3
"""One attention head against sequence length: Tessera's fused kernel, Tessera materialised, and
PyTorch, each N in its own process (peak resident memory only grows), alternating rounds.

Developer-only (the build and the tests never need it). PyTorch 1.13 has no fused attention
(torch.nn.functional.scaled_dot_product_attention came in 2.0), so its attention is what
transformers' eager code does: softmax(q @ k.T * scale) @ v, the (N, N) matrix stored.

  .venv-ref/bin/python tools/reference/bench_attention.py --tessera build/tessera \
      --sizes 1024,2048,4096,8192,16384,32768 --plot docs/attention_scaling.png

Prints a table (median ms, GFLOP/s, extra MiB) and writes the plot: latency and extra memory
against N, log-log.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

TORCH_CHILD = r"""
import json, sys, time
import torch
n, d, reps, warmup, threads, causal = (int(a) for a in sys.argv[1:7])
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(1)
q, k, v = (torch.rand(1, 1, n, d, generator=g) * 2 - 1 for _ in range(3))
scale = d ** -0.5
mask = torch.full((n, n), float("-inf")).triu(1) if causal else None
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))
with open("/proc/self/clear_refs", "w") as f:  # peak RSS := current RSS (Linux >= 4.0)
    f.write("5")
before = status("VmRSS:")
times = []
with torch.inference_mode():
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        if mask is not None:
            s = s + mask
        out = torch.matmul(torch.softmax(s, dim=-1), v)
        del s
        if i >= warmup:
            times.append(time.perf_counter() - t0)
after = status("VmHWM:")
print(json.dumps({"times_s": times, "extra_bytes": max(0, after - before), "mask_bytes": 0 if mask is None else n * n * 4}))
"""


def run_tessera(tessera, n, d, reps, warmup, threads, causal, materialised):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "a.json")
        cmd = [tessera, "bench", "--attention", str(n), "--head-dim", str(d), "--reps", str(reps),
               "--warmup", str(warmup), "--threads", str(threads), "--json", out]
        if causal:
            cmd.append("--causal")
        if materialised:
            cmd.append("--materialised")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
        with open(out) as f:
            j = json.load(f)
    return j["times_s"], j["extra_bytes"]


def run_torch(n, d, reps, warmup, threads, causal):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    p = subprocess.run([sys.executable, "-c", TORCH_CHILD, str(n), str(d), str(reps), str(warmup), str(threads),
                        str(int(causal))], check=True, capture_output=True, text=True, env=env)
    j = json.loads(p.stdout)
    # The causal mask is an input the comparison would not need in a fused kernel: not counted.
    return j["times_s"], max(0, j["extra_bytes"] - j["mask_bytes"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default="build/tessera")
    ap.add_argument("--sizes", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--torch-max", type=int, default=32768, help="largest N for the stored-matrix runs")
    ap.add_argument("--plot", help="write a PNG of latency and memory against N")
    ap.add_argument("--json", help="write all figures here")
    a = ap.parse_args()
    import torch
    sizes = [int(s) for s in a.sizes.split(",")]
    kinds = ["tessera fused", "tessera materialised", "pytorch"]
    res = {k: {n: {"t": [], "mem": []} for n in sizes} for k in kinds}
    for r in range(a.rounds):
        for n in sizes:
            for kind in kinds:
                if kind != "tessera fused" and n > a.torch_max:
                    continue
                if kind == "pytorch":
                    t, m = run_torch(n, a.head_dim, a.reps, a.warmup, a.threads, a.causal)
                else:
                    t, m = run_tessera(a.tessera, n, a.head_dim, a.reps, a.warmup, a.threads, a.causal,
                                       kind == "tessera materialised")
                res[kind][n]["t"].append(statistics.median(t))
                res[kind][n]["mem"].append(m)
                print(f"round {r + 1} {kind:22s} N {n:6d}: {statistics.median(t) * 1e3:9.1f} ms, "
                      f"{m / 2**20:8.1f} MiB extra", file=sys.stderr, flush=True)
    print(f"# one head, d {a.head_dim}, {a.threads} thread(s){', causal' if a.causal else ''}; torch {torch.__version__}; "
          f"{a.rounds} rounds x {a.reps} reps, medians")
    print(f"{'N':>6}  {'fused ms':>9} {'MiB':>7}  {'materialised ms':>15} {'MiB':>7}  {'torch ms':>9} {'MiB':>7}  {'torch/fused':>11}")
    summary = []
    for n in sizes:
        row = {"n": n}
        for kind in kinds:
            if res[kind][n]["t"]:
                row[kind] = {"ms": statistics.median(res[kind][n]["t"]) * 1e3,
                             "extra_mib": max(res[kind][n]["mem"]) / 2**20}
        summary.append(row)
        f = row["tessera fused"]
        m = row.get("tessera materialised")
        t = row.get("pytorch")
        fmt = lambda x, k: f"{x[k]:>{9 if k == 'ms' else 7}.1f}" if x else f"{'-':>{9 if k == 'ms' else 7}}"
        ratio = f"{t['ms'] / f['ms']:11.2f}" if t else f"{'-':>11}"
        print(f"{n:>6}  {fmt(f, 'ms')} {fmt(f, 'extra_mib')}  {fmt(m, 'ms'):>15} {fmt(m, 'extra_mib')}  "
              f"{fmt(t, 'ms')} {fmt(t, 'extra_mib')}  {ratio}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"head_dim": a.head_dim, "threads": a.threads, "causal": a.causal, "rows": summary}, fh, indent=2)
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for kind, style in zip(kinds, ["o-", "s--", "^:"]):
            ns = [r["n"] for r in summary if kind in r]
            ax1.plot(ns, [r[kind]["ms"] for r in summary if kind in r], style, label=kind)
            ax2.plot(ns, [max(r[kind]["extra_mib"], 0.01) for r in summary if kind in r], style, label=kind)
        for ax, title, unit in ((ax1, "latency", "ms"), (ax2, "extra memory (peak RSS growth)", "MiB")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(unit)
            ax.set_title(f"one head, d {a.head_dim}, {a.threads} thread: {title}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
        print(f"plot: {a.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
