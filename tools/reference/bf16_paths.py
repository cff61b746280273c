#!/usr/bin/env python3
"""How far native and emulated bf16 differ, end to end, on a machine with bf16 kernels.

`model.dtype: bf16` runs each Linear either on oneDNN's bf16 kernels (AVX512_BF16 or AMX: native)
or by rounding inputs and weights to bf16 and multiplying them with the f32 kernels (emulated).
Per layer the two agree to f32 roundoff; this measures what that roundoff becomes at the outputs.
For each model it runs `tessera forward` four times on the same inputs and weights:

    f32 and bf16 with the machine's own kernels (native bf16), and
    f32 and bf16 under ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN's AVX2 kernels: bf16 emulated)

and prints the relative L2 difference ||a - b|| / ||b|| of every block's output and of every
output, for: native vs emulated bf16, each bf16 path vs f32 on the same kernels, and the two f32
runs (AVX-512 vs AVX2 kernels: the size of f32 roundoff alone). Developer tool only.

    .venv-ref/bin/python tools/reference/bf16_paths.py --tessera build/release/tessera [--markdown]

Models: the five Hugging Face fixtures (tests/data/hf/*/model), all-MiniLM-L6-v2's real weights
when tools/setup_minilm.sh has put them in place, and the seeded bench shapes in configs/bench/
(--bench). Inputs are random (seed 0): ids uniform over the vocabulary without special tokens,
feature rows N(0, 1).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def hf_model(name, rng):
    folder = ROOT / "tests/data/hf" / name / "model"
    cfg = json.loads((folder / "config.json").read_text())
    exp = f"model: {{from: hf, path: {folder}}}\n"
    layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    if name == "vit":
        side = cfg["image_size"] // cfg["patch_size"]
        rows = rng.standard_normal((1, side * side, cfg["num_channels"] * cfg["patch_size"] ** 2))
        return exp, layers, ("rows", rows.astype(np.float32))
    if name == "ast":
        f = (cfg["num_mel_bins"] - cfg["patch_size"]) // cfg["frequency_stride"] + 1
        t = (cfg["max_length"] - cfg["patch_size"]) // cfg["time_stride"] + 1
        rows = rng.standard_normal((1, f * t, cfg["patch_size"] ** 2))
        return exp, layers, ("rows", rows.astype(np.float32))
    n = min(128, cfg.get("max_position_embeddings", cfg.get("n_positions", 130)) - 2)
    ids = rng.integers(5, cfg["vocab_size"] - 1, n)
    return exp, layers, ("ids", ids)


def minilm(rng):
    folder = pathlib.Path(os.environ.get("TESSERA_MODELS", pathlib.Path.home() / ".cache/tessera/models")) / "all-MiniLM-L6-v2"
    if not (folder / "model.safetensors").is_file():
        return None
    ids = np.concatenate([[101], rng.integers(1000, 30000, 126), [102]])
    return f"model: {{from: hf, path: {folder}}}\n", 6, ("ids", ids)


def bench(name, rng):
    exp = ROOT / "configs/bench" / f"{name}.yaml"
    layers = {"bert_base": 12, "vit_b16": 12, "gpt2_small": 12}[name]
    if name == "vit_b16":
        return exp, layers, ("rows", rng.standard_normal((1, 196, 768)).astype(np.float32))
    vocab = 50257 if name == "gpt2_small" else 30522
    return exp, layers, ("ids", rng.integers(5, vocab - 1, 128))


def run(tessera, exp, layers, inp, dtype, avx2, out):
    args = [tessera, "forward", exp, "--out", out, "--set", f"model.dtype={dtype}", "--dump"]
    args += [f"blocks.{l}.out" for l in range(layers)]
    kind, value = inp
    if kind == "ids":
        args += ["--ids", ",".join(str(int(i)) for i in value)]
    else:
        np.save(pathlib.Path(out).with_suffix(".rows.npy"), value)
        args += ["--rows", str(pathlib.Path(out).with_suffix(".rows.npy"))]
    env = dict(os.environ)
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if avx2:
        env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    subprocess.run(args, check=True, env=env, stdout=subprocess.DEVNULL)
    return {p.stem: np.load(p).astype(np.float64) for p in pathlib.Path(out).glob("*.npy")}


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def row_share(a, b, tol=1e-5):
    """The share of rows (last dimension) of a and b that differ by more than tol relative."""
    a = a.reshape(-1, a.shape[-1])
    b = b.reshape(-1, b.shape[-1])
    d = np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-30)
    return float((d > tol).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--inputs", type=int, default=8, help="random inputs per model (default 8)")
    ap.add_argument("--bench", action="store_true", help="also the 12-layer bench shapes (slow)")
    ap.add_argument("--only", nargs="+", help="just these models (names as in the table)")
    a = ap.parse_args()
    version = subprocess.run([a.tessera, "version"], capture_output=True, text=True, check=True).stdout
    if "bf16 native" not in version:
        sys.exit("this machine has no bf16 kernels (tessera version says:\n" + version + ")")
    print("#", " / ".join(version.strip().splitlines()))
    print(f"# {a.inputs} random inputs per model (seed 0); relative L2 per input: median and max over the inputs;")
    print("# rows: the share of output rows where native and emulated differ by more than 1e-5 relative")
    rng = np.random.default_rng(0)
    makers = [(n, lambda n=n: hf_model(n, rng)) for n in ("bert", "gpt2", "vit", "esm", "ast")]
    if minilm(rng):
        makers.append(("all-MiniLM-L6-v2", lambda: minilm(rng)))
    else:
        print("# all-MiniLM-L6-v2 not set up (tools/setup_minilm.sh): left out")
    if a.bench:
        makers += [(n, lambda n=n: bench(n, rng)) for n in ("bert_base", "vit_b16", "gpt2_small")]
    if a.only:
        makers = [(n, m) for n, m in makers if n in a.only]
    print("| model | input | output | native vs emulated bf16: median, max | rows | native bf16 vs f32 | emulated bf16 vs f32 | f32, AVX-512 vs AVX2 kernels |")
    print("|---|---|---|---|---|---|---|---|")
    pct = lambda v: f"{v * 100:.2g} %"
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in makers:
            figures = {}
            for k in range(a.inputs):
                exp_text, layers, inp = make()
                exp = exp_text
                if isinstance(exp_text, str):
                    exp = pathlib.Path(tmp) / f"{name}.yaml"
                    exp.write_text(exp_text)
                r = {}
                for dtype in ("f32", "bf16"):
                    for avx2 in (False, True):
                        r[dtype, avx2] = run(a.tessera, str(exp), layers, inp, dtype, avx2, f"{tmp}/{name}.{k}.{dtype}.{int(avx2)}")
                names = [f"blocks.{layers - 1}.out"] + [t for t in ("hidden", "pooled", "logits") if t in r["f32", False]]
                for t in names:
                    nb, eb, nf, ef = r["bf16", False][t], r["bf16", True][t], r["f32", False][t], r["f32", True][t]
                    figures.setdefault(t, []).append((rel(nb, eb), row_share(nb, eb), rel(nb, nf), rel(eb, ef), rel(nf, ef)))
            shape = f"{inp[0]} {tuple(inp[1].shape)}"
            for t, f in figures.items():
                f = np.array(f)
                med = np.median(f, axis=0)
                print(f"| {name} | {shape} | `{t}` | {pct(med[0])}, {pct(f[:, 0].max())} | {pct(f[:, 1].mean())} | "
                      f"{pct(med[2])} | {pct(med[3])} | {pct(med[4])} |", flush=True)


if __name__ == "__main__":
    main()
