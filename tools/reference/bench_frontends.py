#!/usr/bin/env python3
"""Side-by-side front-end timing: `tessera bench --plugins` and Hugging Face on the same files.

For each case of `tessera bench --plugins` this times the Hugging Face (or PIL) way of doing the
same work on the same inputs, one thread, warm-up then the median of N passes over the input, and
prints both rates and their ratio. Rounds alternate between the two so machine noise hits both;
the figures are medians over rounds. Developer tool: the product, its build and its tests never
need Python.

    .venv-ref/bin/python tools/reference/bench_frontends.py --tessera build/tessera --rounds 3

Needs transformers (4.40.2 was used), tokenizers, Pillow, NumPy and torch. The references:
  image/vit224    PIL open + exif_transpose + convert("RGB"), ViTImageProcessor(), 16x16 patches (NumPy)
  audio/whisper   16-bit WAV read with `wave` + NumPy, WhisperFeatureExtractor() (pads to 30 s; torch.stft)
  audio/ast       the same read, ASTFeatureExtractor() (NumPy path when torchaudio is absent)
  protein/esm2    FASTA split into records in Python, EsmTokenizer(tests/data/protein/vocab.txt)
  text/bpe        GPT2TokenizerFast(encoder.json, vocab.bpe), one call per line ("batch": one call
                  for all lines, which saves Python's per-call overhead; still one thread)
  text/wordpiece  BertTokenizerFast(vocab.txt, do_lower_case=True), the same two ways
  text/bytes      no Hugging Face counterpart (skipped)
"""
import os

# One thread everywhere, before NumPy, torch or tokenizers start their pools.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ[var] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import wave

import numpy as np
import torch
import transformers
from PIL import Image, ImageOps

torch.set_num_threads(1)
warnings.filterwarnings("ignore", message="At least one mel filter")  # HF's AST filterbank, harmless
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data")


def data(*p):
    return os.path.normpath(os.path.join(DATA, *p))


def read_wav(raw):
    with wave.open(io.BytesIO(raw)) as w:
        assert w.getsampwidth() == 2, "16-bit WAV only"
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
        rate, channels = w.getframerate(), w.getnchannels()
    if channels > 1:
        x = x.reshape(-1, channels).mean(axis=1)
    return x, rate


def image_case():
    raw = open(data("image", "chelsea.jpg"), "rb").read()
    proc = transformers.ViTImageProcessor()

    def run():
        img = ImageOps.exif_transpose(Image.open(io.BytesIO(raw))).convert("RGB")
        pv = proc(img, return_tensors="np")["pixel_values"][0]  # (3, 224, 224)
        pv.reshape(3, 14, 16, 14, 16).transpose(1, 3, 0, 2, 4).reshape(196, 768).copy()
    return run, 1.0


def audio_case(kind):
    raw = open(data("audio", "librivox_0880.wav"), "rb").read()
    x, rate = read_wav(raw)
    assert rate == 16000
    fe = transformers.WhisperFeatureExtractor() if kind == "whisper" else transformers.ASTFeatureExtractor()

    def run():
        y, r = read_wav(raw)
        fe(y, sampling_rate=r, return_tensors="np")
    return run, len(x) / rate


def protein_case():
    path = data("protein", "uniprot_sample.fasta")
    text = open(path, encoding="utf-8").read()
    tok = transformers.EsmTokenizer(data("protein", "vocab.txt"))

    def run():
        for rec in text.split("\n>"):
            lines = rec.split("\n")
            tok("".join(s.strip() for s in lines[1:]))
    return run, os.path.getsize(path) / 1e6


def text_case(kind, batch=False):
    path = data("text", "corpus.txt")
    lines = [l for l in open(path, encoding="utf-8").read().split("\n") if l]
    if kind == "bpe":
        tok = transformers.GPT2TokenizerFast(vocab_file=data("text", "encoder.json"), merges_file=data("text", "vocab.bpe"))
    else:
        tok = transformers.BertTokenizerFast(vocab_file=data("text", "vocab.txt"), do_lower_case=True)

    def run():
        if batch:
            tok(lines)  # one call; sequential, as TOKENIZERS_PARALLELISM=false
        else:
            for line in lines:
                tok(line)
    return run, sum(len(l.encode("utf-8")) for l in lines) / 1e6


# reference name: (tessera case it is compared with, maker, unit)
CASES = {
    "image/vit224": ("image/vit224", image_case, "images/s"),
    "audio/whisper": ("audio/whisper", lambda: audio_case("whisper"), "s of audio/s"),
    "audio/ast": ("audio/ast", lambda: audio_case("ast"), "s of audio/s"),
    "protein/esm2": ("protein/esm2", protein_case, "MB/s"),
    "text/bpe": ("text/bpe", lambda: text_case("bpe"), "MB/s"),
    "text/bpe batch": ("text/bpe", lambda: text_case("bpe", True), "MB/s"),
    "text/wordpiece": ("text/wordpiece", lambda: text_case("wordpiece"), "MB/s"),
    "text/wordpiece batch": ("text/wordpiece", lambda: text_case("wordpiece", True), "MB/s"),
}


def time_passes(run, reps, warmup):
    for _ in range(warmup):
        run()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        t.append(time.perf_counter() - t0)
    return statistics.median(t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", help="the tessera binary; without it only Hugging Face is timed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10, help="timed passes per case and round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", help="write the per-round figures here")
    a = ap.parse_args()

    cases = {name: make() for name, (_, make, _) in CASES.items()}
    hf = {name: [] for name in CASES}
    ts = {}
    for rnd in range(a.rounds):
        if a.tessera:
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "bench.json")
                subprocess.run([a.tessera, "bench", "--plugins", "--reps", str(a.reps), "--warmup", str(a.warmup),
                                "--json", out], check=True, stdout=subprocess.DEVNULL)
                for c in json.load(open(out))["cases"]:
                    ts.setdefault(c["case"], []).append(c["rate"])
        for name, (run, units) in cases.items():
            hf[name].append(units / time_passes(run, a.reps, a.warmup))
        print(f"# round {rnd + 1} of {a.rounds} done", file=sys.stderr)

    print(f"# transformers {transformers.__version__}, Pillow {Image.__version__}, NumPy {np.__version__}, "
          f"torch {torch.__version__}; 1 thread; {a.rounds} rounds x {a.reps} passes after {a.warmup} warm-up, medians")
    print(f"{'case':22}{'tessera':>10}{'reference':>11}  {'unit':14}{'tessera/reference':>18}")
    for name, (tcase, _, unit) in CASES.items():
        t = statistics.median(ts[tcase]) if tcase in ts else None
        h = statistics.median(hf[name])
        ratio = f"{t / h:.2f}" if t else "-"
        print(f"{name:22}{(f'{t:.3g}' if t else '-'):>10}{h:>11.3g}  {unit:14}{ratio:>18}")
    for name in ts:
        if name not in CASES:
            print(f"{name:22}{statistics.median(ts[name]):>10.3g}{'-':>11}  {'':14}{'-':>18}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tessera": ts, "reference": hf}, f, indent=2)


if __name__ == "__main__":
    main()
