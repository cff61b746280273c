#!/usr/bin/env python3
"""Tessera, PyTorch and ONNX Runtime side by side: the same models, weights, shapes and threads.

Each case is one Hugging Face model folder (random weights saved with save_pretrained, or a real
checkpoint) that all three run:

  Tessera       `tessera bench` on a generated YAML (`model: {from: hf, path: DIR}` + `bench:`),
                its --json times; the machine's peaks (matmul, FMA, bandwidth) from the same runs
  PyTorch       transformers 4.x on torch (OpenBLAS), eval mode under inference_mode
  ONNX Runtime  the same module exported with torch.onnx.export (opset 14), CPUExecutionProvider,
                intra_op_num_threads = --threads, inter_op 1, sequential, graph optimisations ALL

Cases (default: all):
  vit       ViT-B/16 (transformers' default ViTConfig, random init), 224 x 224, batch 8:
            last_hidden_state and pooler; compared: last_hidden_state (8, 197, 768)
  bert      BERT-base (default BertConfig, random init), 8 x 128 tokens: last_hidden_state and
            pooler; compared: last_hidden_state
  minilm    all-MiniLM-L6-v2, real weights (tools/setup_minilm.sh), 32 x 128 tokens, mean pooling
            and L2 normalisation (what sentence-transformers does); compared: the embeddings
  gpt2      GPT-2 small (default GPT2Config, random init), 1 x 128 tokens, logits of EVERY row
            (1, 128, 50257) on all three sides; compared: all logits
  gpt2-last the same prompt as a prefill: logits of the LAST row only (1, 50257). Tessera: the
            prefill of `tessera bench` (last-row head; it also fills its KV cache, which the other
            two do not return); PyTorch and ORT: the transformer, then the tied head on the last
            row. Compared: the last row of the `gpt2` logits (Tessera computes the same numbers)

Timing: for each case, --rounds rounds; in each round every side runs 1 warm-up and --reps timed
runs, one side after another, the order rotating from round to round so that machine noise hits
all three alike. Medians over all timed runs; ratios are other / Tessera (above 1: Tessera is
faster). Tessera's timing inputs are its own random ones of the same shapes (values do not change
the work of these models); the agreement check runs all three on the very same inputs first
(`tessera forward --rows` for ViT's patches, `--ids` item by item for token models) and the script
stops with exit code 1 when a max |diff| is above the case's stated tolerance.

Developer tool: the product, its build and its tests never need Python.

    .venv-ref/bin/python tools/reference/compare_speed.py --tessera build/tessera --threads 2

PyTorch must use an optimised BLAS (libopenblas0-pthread); the script refuses to run when torch's
2048^3 matmul is below 20 GFLOP/s, which would flatter Tessera.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

CASES = ["vit", "bert", "minilm", "gpt2", "gpt2-last"]
# Largest |diff| allowed between any two of the three, f32. Orders of summation differ (oneDNN,
# OpenBLAS, MLAS) through 6-12 layers: measured about 5e-6 on hidden states and logits of magnitude
# up to 5, 3e-7 on the unit-length embeddings; a real mismatch (a wrong layout, mask, GELU, a
# dropout left on) is 1e-2 or more.
TOLERANCE = {"vit": 1e-4, "bert": 1e-4, "minilm": 1e-5, "gpt2": 1e-4, "gpt2-last": 1e-4}


def torch_matmul_gflops():
    a = torch.randn(2048, 2048)
    a @ a
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        a @ a
        ts.append(time.perf_counter() - t)
    return 2 * 2048 ** 3 / statistics.median(ts) / 1e9


# --- the modules each side runs (PyTorch runs them directly, ORT their ONNX export) ----------------


class HiddenAndPooled(torch.nn.Module):  # ViTModel, BertModel
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(x, return_dict=True)
        return out.last_hidden_state, out.pooler_output


class MeanPoolNormalize(torch.nn.Module):  # sentence-transformers' Pooling(mean) + Normalize
    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, ids):
        h = self.bert(input_ids=ids, return_dict=True).last_hidden_state  # no padding: every row counts
        return torch.nn.functional.normalize(h.mean(dim=1), dim=-1)


class AllLogits(torch.nn.Module):  # GPT2LMHeadModel, logits of every row
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, use_cache=False, return_dict=True).logits


class LastLogits(torch.nn.Module):  # the transformer, then the tied head on the last row only
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        h = self.lm.transformer(input_ids=ids, use_cache=False, return_dict=True).last_hidden_state
        return self.lm.lm_head(h[:, -1])


# --- cases ----------------------------------------------------------------------------------------


def vit_patches(px):
    """(B, 3, H, W) -> (B, H/16 · W/16, 768): the image plugin's rows, (channel, row, column) in a patch."""
    B, C, H, W = px.shape
    p = 16
    x = px.reshape(B, C, H // p, p, W // p, p).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(x.reshape(B, (H // p) * (W // p), C * p * p))


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bert_vocab(path, size):
    """A WordPiece vocab.txt of `size` tokens, BERT's special tokens at their usual ids (Tessera's
    importer wants one next to a BERT model; random weights have no tokenizer of their own)."""
    toks = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    toks += [f"tok{i}" for i in range(size - len(toks))]
    with open(path, "w") as f:
        f.write("\n".join(toks) + "\n")


def make_case(name, work, minilm_dir):
    """Builds the case: its HF folder, the module PyTorch runs, the input, and what Tessera gets."""
    import transformers as tf

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    c = {"name": name, "dir": os.path.join(work, name)}
    if name == "vit":
        model = tf.ViTModel(tf.ViTConfig()).eval()
        model.save_pretrained(c["dir"], safe_serialization=True)
        tf.ViTImageProcessor().save_pretrained(c["dir"])  # Tessera reads the image plugin's options from it
        x = rng.standard_normal((8, 3, 224, 224), dtype=np.float32)
        c.update(module=HiddenAndPooled(model), input=x, batch=8, seq=196, tessera_output="hidden",
                 what="last_hidden_state (8, 197, 768)", pick=lambda outs: outs[0])
        c["rows"] = vit_patches(x)
    elif name == "bert":
        model = tf.BertModel(tf.BertConfig()).eval()
        model.save_pretrained(c["dir"], safe_serialization=True)
        bert_vocab(os.path.join(c["dir"], "vocab.txt"), model.config.vocab_size)
        x = rng.integers(1000, 30000, (8, 128)).astype(np.int64)
        c.update(module=HiddenAndPooled(model), input=x, batch=8, seq=128, tessera_output="hidden",
                 what="last_hidden_state (8, 128, 768)", pick=lambda outs: outs[0])
    elif name == "minilm":
        model = tf.BertModel.from_pretrained(minilm_dir, add_pooling_layer=False).eval()
        c["dir"] = minilm_dir
        x = rng.integers(1000, 30000, (32, 128)).astype(np.int64)
        c.update(module=MeanPoolNormalize(model), input=x, batch=32, seq=128, tessera_output="pooled",
                 what="mean-pooled, L2-normalised embeddings (32, 384)", pick=lambda outs: outs[0])
    elif name in ("gpt2", "gpt2-last"):
        model = tf.GPT2LMHeadModel(tf.GPT2Config()).eval()
        c["dir"] = os.path.join(work, "gpt2")
        if not os.path.isdir(c["dir"]):
            model.save_pretrained(c["dir"], safe_serialization=True)
            # GPT-2's real tokenizer files (the text plugin's test data), which the importer wants
            for src, dst in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
                shutil.copyfile(os.path.join(REPO, "tests", "data", "text", src), os.path.join(c["dir"], dst))
        else:  # the folder gpt2 saved: the same weights (same seed), loaded back
            model = tf.GPT2LMHeadModel.from_pretrained(c["dir"]).eval()
        x = rng.integers(0, 50257, (1, 128)).astype(np.int64)
        if name == "gpt2":
            c.update(module=AllLogits(model), input=x, batch=1, seq=128, tessera_output="logits",
                     what="logits of every row (1, 128, 50257)", pick=lambda outs: outs[0])
        else:
            c.update(module=LastLogits(model), input=x, batch=1, seq=128, tessera_output="logits",
                     what="logits of the last row (1, 50257)", pick=lambda outs: outs[0],
                     tessera_pick=lambda t: t[:, -1])
    # Eval mode for the wrapper too: torch.onnx.export restores the wrapper's mode afterwards, and a
    # wrapper left in training mode would switch every dropout of the model back on.
    c["module"].eval()
    c["yaml"] = os.path.join(work, name + ".yaml")
    with open(c["yaml"], "w") as f:
        f.write(f"model: {{from: hf, path: {json.dumps(c['dir'])}}}\n"
                f"bench: {{batch: {c['batch']}, seq_len: {c['seq']}, warmup: 1, reps: 3}}\n")
    return c


def export_onnx(c, work):
    path = os.path.join(work, c["name"] + ".onnx")
    x = torch.from_numpy(c["input"])
    with torch.no_grad():
        torch.onnx.export(c["module"], (x,), path, opset_version=14, input_names=["x"], do_constant_folding=True)
    assert not any(m.training for m in c["module"].modules()), "the exporter left a module in training mode"
    return path


def ort_session(path, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_torch(c):
    with torch.inference_mode():
        outs = c["module"](torch.from_numpy(c["input"]))
    outs = outs if isinstance(outs, tuple) else (outs,)
    return [o.numpy() for o in outs]


def run(args):
    """Runs a tessera command; on failure shows its stderr and stops."""
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args[:3])} ... failed (exit {p.returncode}):\n{p.stderr}")
    return p.stdout


def run_tessera_forward(binary, c, work):
    """Tessera's outputs on the very inputs the other two get: patches via --rows, ids item by item."""
    out_dir = os.path.join(work, c["name"] + "-forward")
    if "rows" in c:
        rows = os.path.join(work, c["name"] + "-rows.npy")
        np.save(rows, c["rows"])
        run([binary, "forward", c["yaml"], "--rows", rows, "--out", out_dir])
        return np.load(os.path.join(out_dir, c["tessera_output"] + ".npy"))
    items = []
    for b in range(c["input"].shape[0]):
        ids = ",".join(str(int(v)) for v in c["input"][b])
        run([binary, "forward", c["yaml"], "--ids", ids, "--out", out_dir])
        items.append(np.load(os.path.join(out_dir, c["tessera_output"] + ".npy")))
    return np.concatenate(items, axis=0)


def agreement(binary, c, sess, work):
    t = run_tessera_forward(binary, c, work)
    if "tessera_pick" in c:
        t = c["tessera_pick"](t)
    p = c["pick"](run_torch(c))
    o = c["pick"](sess.run(None, {"x": c["input"]}))
    if not (t.shape == p.shape == o.shape):
        sys.exit(f"{c['name']}: shapes differ: tessera {t.shape}, torch {p.shape}, ort {o.shape}")
    d = {"tessera_torch": float(np.abs(t - p).max()), "ort_torch": float(np.abs(o - p).max()),
         "tessera_ort": float(np.abs(t - o).max()), "max_abs_value": float(np.abs(p).max())}
    return d


# --- timing ---------------------------------------------------------------------------------------


def time_tessera(binary, c, threads, reps, work):
    path = os.path.join(work, c["name"] + "-bench.json")
    args = [binary, "bench", c["yaml"], "--threads", str(threads), "--warmup", "1", "--reps", str(reps),
            "--json", path]
    args += ["--decode", "1"] if c["name"] == "gpt2-last" else ["--decode", "0"]
    run(args)
    with open(path) as f:
        j = json.load(f)
    times = j["prefill_times_s"] if c["name"] == "gpt2-last" else j["times_s"]
    return times, j


def time_torch(c, reps):
    x = torch.from_numpy(c["input"])
    times = []
    with torch.inference_mode():
        for i in range(reps + 1):
            t = time.perf_counter()
            c["module"](x)
            if i >= 1:
                times.append(time.perf_counter() - t)
    return times


def time_ort(sess, c, reps):
    feed = {"x": c["input"]}
    times = []
    for i in range(reps + 1):
        t = time.perf_counter()
        sess.run(None, feed)
        if i >= 1:
            times.append(time.perf_counter() - t)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default="build/tessera", help="the tessera binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="0: only the agreement check")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per side per round, after 1 warm-up")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    ap.add_argument("--minilm", default=os.path.expanduser("~/.cache/tessera/models/all-MiniLM-L6-v2"))
    ap.add_argument("--json", help="also write every time and figure here")
    ap.add_argument("--workdir", help="keep the folders, ONNX files and outputs here (default: a temp dir)")
    a = ap.parse_args()
    cases = [s for s in a.cases.split(",") if s]
    for s in cases:
        if s not in CASES:
            sys.exit(f"unknown case {s!r}; cases: {', '.join(CASES)}")
    binary = os.path.abspath(a.tessera)
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary}: no tessera binary there (build it, or pass --tessera)")

    import onnxruntime as ort
    import transformers

    transformers.logging.set_verbosity_error()  # "weights not used": MiniLM's pooler, as intended
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")  # exporter's shape notes
    torch.set_num_threads(a.threads)
    blas = torch_matmul_gflops()
    if blas < 20:
        sys.exit(f"torch's matmul runs at {blas:.1f} GFLOP/s: a reference BLAS is selected; "
                 "install libopenblas0-pthread")
    tversion = subprocess.run([binary, "version"], capture_output=True, text=True).stdout.split("\n")[0]
    header = {"tessera": tversion, "torch": torch.__version__, "onnxruntime": ort.__version__,
              "transformers": transformers.__version__, "numpy": np.__version__, "threads": a.threads,
              "torch_matmul_gflops": blas, "rounds": a.rounds, "reps": a.reps}
    print(f"# {tversion}; torch {torch.__version__}, onnxruntime {ort.__version__}, transformers "
          f"{transformers.__version__}, numpy {np.__version__}", flush=True)
    print(f"# {a.threads} threads; torch 2048^3 matmul {blas:.0f} GFLOP/s; {a.rounds} rounds x {a.reps} reps "
          f"per side after 1 warm-up, medians; the machine is shared and noisy", flush=True)

    results = {}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        work = a.workdir or tmp
        os.makedirs(work, exist_ok=True)
        for name in cases:
            if name == "minilm" and not os.path.isfile(os.path.join(a.minilm, "config.json")):
                print(f"{name}: skipped: no all-MiniLM-L6-v2 folder at {a.minilm} (tools/setup_minilm.sh)", flush=True)
                continue
            c = make_case(name, work, a.minilm)
            sess = ort_session(export_onnx(c, work), a.threads)
            agree = agreement(binary, c, sess, work)
            tol = TOLERANCE[name]
            ok = max(agree["tessera_torch"], agree["ort_torch"], agree["tessera_ort"]) <= tol
            print(f"{name}: agreement on {c['what']}: max |diff| tessera-torch {agree['tessera_torch']:.2e}, "
                  f"ort-torch {agree['ort_torch']:.2e}, tessera-ort {agree['tessera_ort']:.2e} "
                  f"(largest |value| {agree['max_abs_value']:.3g}; tolerance {tol:g}) "
                  f"{'ok' if ok else 'FAILED'}", flush=True)
            if not ok:
                failed.append(name)
            if a.rounds == 0:  # the agreement check alone
                continue
            sides = {"tessera": [], "torch": [], "ort": []}
            bench = []
            for r in range(a.rounds):
                order = ["tessera", "torch", "ort"]
                order = order[r % 3:] + order[:r % 3]
                for side in order:
                    if side == "tessera":
                        t, j = time_tessera(binary, c, a.threads, a.reps, work)
                        bench.append(j)
                    elif side == "torch":
                        t = time_torch(c, a.reps)
                    else:
                        t = time_ort(sess, c, a.reps)
                    sides[side].extend(t)
                    time.sleep(0.5)  # let the last side's worker threads go to sleep
                print(f"  {name}: round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
            med = {k: statistics.median(v) for k, v in sides.items()}
            peaks = {k: statistics.median([j[k] for j in bench if j.get(k)]) if any(j.get(k) for j in bench) else None
                     for k in ("peak_gflops", "fma_peak_gflops", "bandwidth_read_gbs", "bandwidth_triad_gbs")}
            gflop = bench[0]["gflop_per_batch"]
            rate = gflop / med["tessera"] if name != "gpt2-last" else None
            results[name] = {"what": c["what"], "batch": c["batch"], "seq": c["seq"], "times_s": sides,
                             "median_s": med, "torch_over_tessera": med["torch"] / med["tessera"],
                             "ort_over_tessera": med["ort"] / med["tessera"], "agreement": agree,
                             "tolerance": tol, "agrees": ok, "tessera_gflop_per_batch": gflop,
                             "tessera_gflops": rate, "peaks": peaks,
                             "tessera_bench": [{k: v for k, v in j.items() if not k.endswith("times_s")} for j in bench]}
            line = (f"{name}: tessera {med['tessera'] * 1e3:.1f} ms, torch {med['torch'] * 1e3:.1f} ms, "
                    f"ort {med['ort'] * 1e3:.1f} ms; torch/tessera {med['torch'] / med['tessera']:.2f}, "
                    f"ort/tessera {med['ort'] / med['tessera']:.2f}")
            if rate and peaks["fma_peak_gflops"]:
                line += (f"; tessera {rate:.1f} GFLOP/s = {100 * rate / peaks['fma_peak_gflops']:.1f} % of the FMA "
                         f"peak ({peaks['fma_peak_gflops']:.1f}), {100 * rate / peaks['peak_gflops']:.1f} % of the "
                         f"matmul peak ({peaks['peak_gflops']:.1f})")
            print(line, flush=True)
            del sess, c

    if results:
        print_table(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"setup": header, "cases": results}, f, indent=2)
    if failed:
        print(f"AGREEMENT FAILED for {', '.join(failed)}: a max |diff| is above its tolerance", file=sys.stderr)
        sys.exit(1)


def print_table(results):
    print()
    print(f"{'case':10} {'batch x seq':>11} {'tessera ms':>11} {'torch ms':>9} {'ort ms':>9} {'torch/tessera':>14} "
          f"{'ort/tessera':>12} {'GFLOP/s':>8} {'% FMA pk':>9} {'max |diff|':>11} {'tolerance':>10}")
    for name, r in results.items():
        m = r["median_s"]
        worst = max(r["agreement"][k] for k in ("tessera_torch", "ort_torch", "tessera_ort"))
        shape = f"{r['batch']} x {r['seq']}"
        rate, fma = r["tessera_gflops"], r["peaks"]["fma_peak_gflops"]
        rate_s = f"{rate:8.1f}" if rate else f"{'-':>8}"
        frac_s = f"{100 * rate / fma:9.1f}" if rate and fma else f"{'-':>9}"
        print(f"{name:10} {shape:>11} {m['tessera'] * 1e3:11.1f} {m['torch'] * 1e3:9.1f} "
              f"{m['ort'] * 1e3:9.1f} {r['torch_over_tessera']:14.2f} {r['ort_over_tessera']:12.2f} {rate_s} {frac_s} "
              f"{worst:11.2e} {r['tolerance']:10g}")
    runs = [j for r in results.values() for j in r["tessera_bench"]]
    keys = ("fma_peak_gflops", "fma_peak_gflops_1thread", "peak_gflops", "bandwidth_read_gbs", "bandwidth_triad_gbs")
    if all(j.get(k) for j in runs for k in keys):
        p = {k: statistics.median(j[k] for j in runs) for k in keys}
        print(f"machine, measured by every tessera bench run above (median of {len(runs)}): FMA peak "
              f"{p['fma_peak_gflops']:.1f} GFLOP/s ({p['fma_peak_gflops_1thread']:.1f} on 1 thread, "
              f"{runs[0]['fma_isa']}), matmul peak {p['peak_gflops']:.1f} GFLOP/s, memory read "
              f"{p['bandwidth_read_gbs']:.1f} GB/s, triad {p['bandwidth_triad_gbs']:.1f} GB/s")


if __name__ == "__main__":
    main()
