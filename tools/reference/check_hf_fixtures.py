#!/usr/bin/env python3
"""Recomputes tests/data/hf/* from the saved model files alone, in NumPy (float64), without transformers.

An independent second implementation of the five fixture models (and of all-MiniLM-L6-v2 when its
folder exists): it reads only `model/` (safetensors, config.json) and each reference's inputs, and
checks every reference tensor at 1e-4, as the C++ tests do. It documents, in a few lines per
family, what a reimplementation has to do; it is not used by the product or its tests.

    .venv-ref/bin/python tools/reference/check_hf_fixtures.py [MINILM_DIR]

Needs NumPy, SciPy (erf) and torch (only to read bfloat16 safetensors).
"""
import json
import math
import os
import pathlib
import struct
import sys

import numpy as np
from safetensors.torch import load_file as load_torch
from scipy.special import erf

ROOT = pathlib.Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "data" / "hf"
TOL = 1e-4


def load_weights(model_dir: pathlib.Path) -> dict:
    """Every tensor of the folder's safetensors (single file or shards) as float64 / int arrays."""
    index = model_dir / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    out = {}
    for f in files:
        for k, v in load_torch(str(model_dir / f)).items():
            out[k] = v.double().numpy() if v.is_floating_point() else v.numpy()
    return out


def load_reference(family: str) -> dict:
    return {k: v.double().numpy() if v.is_floating_point() else v.numpy()
            for k, v in load_torch(str(HF / family / "reference.safetensors")).items()}


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def linear(x, W, prefix):
    """x (T, in) times torch Linear `prefix` (weight (out, in), bias (out,))."""
    return x @ W[prefix + ".weight"].T + W[prefix + ".bias"]


def softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def attention(q, k, v, n_heads, causal=False, rotary=None):
    """q, k, v (T, C) -> (context (T, C), probabilities (H, T, T)); rotary(q, k) per head if given."""
    T, C = q.shape
    D = C // n_heads
    q, k, v = (x.reshape(T, n_heads, D).transpose(1, 0, 2) for x in (q, k, v))  # (H, T, D)
    if rotary is not None:
        q, k = rotary(q * D ** -0.5, k)  # ESM scales q before rotating
        s = q @ k.transpose(0, 2, 1)
    else:
        s = q @ k.transpose(0, 2, 1) / math.sqrt(D)
    if causal:
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = softmax(s)
    return (p @ v).transpose(1, 0, 2).reshape(T, C), p


class Checker:
    def __init__(self, family):
        self.family, self.worst, self.n = family, 0.0, 0

    def __call__(self, name, got, want, tol=TOL):
        want = np.asarray(want, dtype=np.float64)
        assert got.shape == want.shape, (self.family, name, got.shape, want.shape)
        d = float(np.abs(got - want).max()) if got.size else 0.0
        self.worst, self.n = max(self.worst, d), self.n + 1
        if d > tol:
            raise AssertionError(f"{self.family} {name}: max |diff| {d:.3g} > {tol}")

    def report(self):
        print(f"{self.family}: {self.n} tensors match, max |diff| {self.worst:.2e}")


def items(ref):
    return sorted({int(k.split(".")[1]) for k in ref if k.startswith("inputs.")})


# ---------------------------------------------------------------------------------------------


def bert_forward(W, cfg, ids, pre=""):
    """BERT (post-LN). Returns embeddings, [layer outputs]."""
    T = len(ids)
    eps = cfg["layer_norm_eps"]
    H = cfg["num_attention_heads"]
    x = W[pre + "embeddings.word_embeddings.weight"][ids] + W[pre + "embeddings.position_embeddings.weight"][:T] \
        + W[pre + "embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, W[pre + "embeddings.LayerNorm.weight"], W[pre + "embeddings.LayerNorm.bias"], eps)
    emb, layers = x, []
    for l in range(cfg["num_hidden_layers"]):
        p = f"{pre}encoder.layer.{l}."
        a, _ = attention(linear(x, W, p + "attention.self.query"), linear(x, W, p + "attention.self.key"),
                         linear(x, W, p + "attention.self.value"), H)
        x = layer_norm(linear(a, W, p + "attention.output.dense") + x, W[p + "attention.output.LayerNorm.weight"],
                       W[p + "attention.output.LayerNorm.bias"], eps)
        f = linear(gelu(linear(x, W, p + "intermediate.dense")), W, p + "output.dense")
        x = layer_norm(f + x, W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"], eps)
        layers.append(x)
    return emb, layers


def mean_normalised(h):
    m = h.mean(0)
    return m / np.linalg.norm(m)


def check_bert():
    d = HF / "bert" / "model"
    cfg = json.loads((d / "config.json").read_text())
    W, ref, ok = load_weights(d), load_reference("bert"), Checker("bert")
    assert json.loads((d / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"]
    for i in items(ref):
        emb, layers = bert_forward(W, cfg, ref[f"inputs.{i}"])
        ok(f"embeddings.{i}", emb, ref[f"embeddings.{i}"])
        for l, h in enumerate(layers):
            ok(f"layer.{l}.{i}", h, ref[f"layer.{l}.{i}"])
        ok(f"final.{i}", layers[-1], ref[f"final.{i}"])
        ok(f"pooled.{i}", np.tanh(linear(layers[-1][0], W, "pooler.dense")), ref[f"pooled.{i}"])
        ok(f"sentence.{i}", mean_normalised(layers[-1]), ref[f"sentence.{i}"])
    ok.report()


def gpt2_forward(W, cfg, ids):
    T = len(ids)
    eps, H = cfg["layer_norm_epsilon"], cfg["n_head"]
    conv = lambda x, p: x @ W[p + ".weight"] + W[p + ".bias"]  # Conv1D: weight (in, out)
    x = W["transformer.wte.weight"][ids] + W["transformer.wpe.weight"][:T]
    emb, layers = x, []
    for l in range(cfg["n_layer"]):
        p = f"transformer.h.{l}."
        qkv = conv(layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps), p + "attn.c_attn")
        a, _ = attention(*np.split(qkv, 3, axis=-1), H, causal=True)
        x = x + conv(a, p + "attn.c_proj")
        m = gelu_tanh(conv(layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps), p + "mlp.c_fc"))
        x = x + conv(m, p + "mlp.c_proj")
        layers.append(x)
    final = layer_norm(x, W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    return emb, layers, final, final @ W["transformer.wte.weight"].T  # tied LM head


def check_gpt2():
    d = HF / "gpt2" / "model"
    cfg = json.loads((d / "config.json").read_text())
    W, ref, ok = load_weights(d), load_reference("gpt2"), Checker("gpt2")
    assert "lm_head.weight" not in W
    for i in items(ref):
        ids = list(ref[f"inputs.{i}"])
        emb, layers, final, logits = gpt2_forward(W, cfg, ids)
        ok(f"embeddings.{i}", emb, ref[f"embeddings.{i}"])
        for l, h in enumerate(layers):
            ok(f"layer.{l}.{i}", h, ref[f"layer.{l}.{i}"])
        ok(f"final.{i}", final, ref[f"final.{i}"])
        ok(f"logits.{i}", logits, ref[f"logits.{i}"])
        steps = []
        for _ in range(12):  # greedy, whole sequence recomputed each step
            row = gpt2_forward(W, cfg, ids)[3][-1]
            steps.append(row)
            ids.append(int(row.argmax()))
        ok(f"generate.{i}", np.array(ids[-12:], dtype=np.float64), ref[f"generate.{i}"], tol=0)
        ok(f"generate_logits.{i}", np.stack(steps), ref[f"generate_logits.{i}"])
    ok.report()


def cubic_weights(t, A=-0.75):
    """PyTorch's bicubic coefficients for offsets -1, 0, 1, 2 at fraction t."""
    def near(x):  # |x| <= 1
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    return np.array([far(t + 1), near(t), near(1 - t), far(2 - t)])


def resize_bicubic(grid, out_h, out_w, scale_h, scale_w):
    """torch.nn.functional.interpolate(bicubic, align_corners=False, scale_factor=(scale_h, scale_w)) of
    grid (h, w, C): source coordinate (dst + 0.5) / scale - 0.5, taps clamped to the edge."""
    h, w, _ = grid.shape

    def taps(n_in, n_out, scale):
        rows = []
        for o in range(n_out):
            src = (o + 0.5) / scale - 0.5
            i0 = math.floor(src)
            wts = cubic_weights(src - i0)
            m = np.zeros(n_in)
            for k, wt in zip(range(i0 - 1, i0 + 3), wts):
                m[min(max(k, 0), n_in - 1)] += wt
            rows.append(m)
        return np.array(rows)
    Rh, Rw = taps(h, out_h, scale_h), taps(w, out_w, scale_w)
    return np.einsum("ah,bw,hwc->abc", Rh, Rw, grid)


def vit_like_layers(W, x, pre, n_layers, H, eps):
    """Pre-LN blocks of ViT / AST: x + attn(LN(x)), then x + mlp(LN(x))."""
    layers = []
    for l in range(n_layers):
        p = f"{pre}encoder.layer.{l}."
        y = layer_norm(x, W[p + "layernorm_before.weight"], W[p + "layernorm_before.bias"], eps)
        a, _ = attention(linear(y, W, p + "attention.attention.query"), linear(y, W, p + "attention.attention.key"),
                         linear(y, W, p + "attention.attention.value"), H)
        x = x + linear(a, W, p + "attention.output.dense")
        y = layer_norm(x, W[p + "layernorm_after.weight"], W[p + "layernorm_after.bias"], eps)
        x = x + linear(gelu(linear(y, W, p + "intermediate.dense")), W, p + "output.dense")
        layers.append(x)
    return layers


def check_vit():
    d = HF / "vit" / "model"
    cfg = json.loads((d / "config.json").read_text())
    W, ref, ok = load_weights(d), load_reference("vit"), Checker("vit")
    P, eps = cfg["patch_size"], cfg["layer_norm_eps"]
    conv_w = W["vit.embeddings.patch_embeddings.projection.weight"]  # (C, 3, P, P)
    conv_b = W["vit.embeddings.patch_embeddings.projection.bias"]
    pos = W["vit.embeddings.position_embeddings"][0]  # (1 + g*g, C)
    g = cfg["image_size"] // P
    for i in items(ref):
        px = ref[f"inputs.{i}"]  # (3, H, W)
        gh, gw = px.shape[1] // P, px.shape[2] // P
        patches = px.reshape(3, gh, P, gw, P).transpose(1, 3, 0, 2, 4).reshape(gh * gw, -1)  # row-major patches
        x = patches @ conv_w.reshape(conv_w.shape[0], -1).T + conv_b
        if (gh, gw) == (g, g):
            table = pos
        else:  # interpolate_pos_encoding (transformers 4.40): scale factor (gh + 0.1) / g
            grid = pos[1:].reshape(g, g, -1)
            table = np.concatenate([pos[:1], resize_bicubic(grid, gh, gw, (gh + 0.1) / g, (gw + 0.1) / g)
                                    .reshape(gh * gw, -1)])
        x = np.concatenate([W["vit.embeddings.cls_token"][0], x]) + table
        ok(f"embeddings.{i}", x, ref[f"embeddings.{i}"])
        layers = vit_like_layers(W, x, "vit.", cfg["num_hidden_layers"], cfg["num_attention_heads"], eps)
        for l, h in enumerate(layers):
            ok(f"layer.{l}.{i}", h, ref[f"layer.{l}.{i}"])
        final = layer_norm(layers[-1], W["vit.layernorm.weight"], W["vit.layernorm.bias"], eps)
        ok(f"final.{i}", final, ref[f"final.{i}"])
        ok(f"logits.{i}", linear(final[0], W, "classifier"), ref[f"logits.{i}"])
    ok.report()


def check_esm():
    d = HF / "esm" / "model"
    cfg = json.loads((d / "config.json").read_text())
    W, ref, ok = load_weights(d), load_reference("esm"), Checker("esm")
    eps, H, mask_id = cfg["layer_norm_eps"], cfg["num_attention_heads"], cfg["mask_token_id"]
    D = cfg["hidden_size"] // H
    inv_freq = 1.0 / 10000 ** (np.arange(0, D, 2) / D)

    def rotary(q, k):  # (H, T, D): "halves" layout
        T = q.shape[1]
        ang = np.arange(T)[:, None] * inv_freq[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
        rot = lambda x: np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
        return q * cos + rot(q) * sin, k * cos + rot(k) * sin

    for i in items(ref):
        ids = ref[f"inputs.{i}"]
        T = len(ids)
        x = W["esm.embeddings.word_embeddings.weight"][ids].copy()
        x[ids == mask_id] = 0  # token dropout, also at inference
        x *= (1 - 0.15 * 0.8) / (1 - (ids == mask_id).sum() / T)
        ok(f"embeddings.{i}", x, ref[f"embeddings.{i}"])
        for l in range(cfg["num_hidden_layers"]):
            p = f"esm.encoder.layer.{l}."
            y = layer_norm(x, W[p + "attention.LayerNorm.weight"], W[p + "attention.LayerNorm.bias"], eps)
            a, probs = attention(linear(y, W, p + "attention.self.query"), linear(y, W, p + "attention.self.key"),
                                 linear(y, W, p + "attention.self.value"), H, rotary=rotary)
            ok(f"attn.{l}.{i}", probs, ref[f"attn.{l}.{i}"])
            x = x + linear(a, W, p + "attention.output.dense")
            y = layer_norm(x, W[p + "LayerNorm.weight"], W[p + "LayerNorm.bias"], eps)
            x = x + linear(gelu(linear(y, W, p + "intermediate.dense")), W, p + "output.dense")
            ok(f"layer.{l}.{i}", x, ref[f"layer.{l}.{i}"])
        final = layer_norm(x, W["esm.encoder.emb_layer_norm_after.weight"], W["esm.encoder.emb_layer_norm_after.bias"], eps)
        ok(f"final.{i}", final, ref[f"final.{i}"])
        h = layer_norm(gelu(linear(final, W, "lm_head.dense")), W["lm_head.layer_norm.weight"],
                       W["lm_head.layer_norm.bias"], eps)
        ok(f"logits.{i}", h @ W["esm.embeddings.word_embeddings.weight"].T + W["lm_head.bias"], ref[f"logits.{i}"])
    ok.report()


def check_ast():
    d = HF / "ast" / "model"
    cfg = json.loads((d / "config.json").read_text())
    W, ref, ok = load_weights(d), load_reference("ast"), Checker("ast")
    P, fs, ts, eps = cfg["patch_size"], cfg["frequency_stride"], cfg["time_stride"], cfg["layer_norm_eps"]
    pre = "audio_spectrogram_transformer."
    conv_w = W[pre + "embeddings.patch_embeddings.projection.weight"]  # (C, 1, P, P) over (mel, frame)
    conv_b = W[pre + "embeddings.patch_embeddings.projection.bias"]
    for i in items(ref):
        spec = ref[f"inputs.{i}"].T  # (mel, frames)
        nf, nt = (spec.shape[0] - P) // fs + 1, (spec.shape[1] - P) // ts + 1
        patches = np.stack([spec[f * fs:f * fs + P, t * ts:t * ts + P].ravel() for f in range(nf) for t in range(nt)])
        x = patches @ conv_w.reshape(conv_w.shape[0], -1).T + conv_b  # frequency-major rows
        x = np.concatenate([W[pre + "embeddings.cls_token"][0], W[pre + "embeddings.distillation_token"][0], x])
        x = x + W[pre + "embeddings.position_embeddings"][0]
        ok(f"embeddings.{i}", x, ref[f"embeddings.{i}"])
        layers = vit_like_layers(W, x, pre, cfg["num_hidden_layers"], cfg["num_attention_heads"], eps)
        for l, h in enumerate(layers):
            ok(f"layer.{l}.{i}", h, ref[f"layer.{l}.{i}"])
        final = layer_norm(layers[-1], W[pre + "layernorm.weight"], W[pre + "layernorm.bias"], eps)
        ok(f"final.{i}", final, ref[f"final.{i}"])
        pooled = (final[0] + final[1]) / 2
        ok(f"pooled.{i}", pooled, ref[f"pooled.{i}"])
        h = layer_norm(pooled, W["classifier.layernorm.weight"], W["classifier.layernorm.bias"], eps)
        ok(f"logits.{i}", linear(h, W, "classifier.dense"), ref[f"logits.{i}"])
    ok.report()


def check_minilm(model_dir: pathlib.Path):
    if not (model_dir / "model.safetensors").is_file():
        print(f"minilm: skipped, no {model_dir} (tools/setup_minilm.sh makes it)")
        return
    cfg = json.loads((model_dir / "config.json").read_text())
    W, ok = load_weights(model_dir), Checker("minilm")
    pre = "bert." if "bert.embeddings.word_embeddings.weight" in W else ""
    data = (HF / "minilm" / "ids.bin").read_bytes()
    assert data[:4] == b"TTXR"
    _, n = struct.unpack("<II", data[4:12])
    counts = struct.unpack(f"<{n}H", data[12:12 + 2 * n])
    flat = np.frombuffer(data[12 + 2 * n:], dtype="<u2").astype(np.int64)
    ids = np.split(flat, np.cumsum(counts)[:-1])
    want = np.load(HF / "minilm" / "embeddings.npy")
    for i in range(n):
        _, layers = bert_forward(W, cfg, ids[i], pre)
        ok(f"embedding {i}", mean_normalised(layers[-1]), want[i])
    layers_ref = {k: v.double().numpy() for k, v in load_torch(str(HF / "minilm" / "layers.safetensors")).items()}
    emb, layers = bert_forward(W, cfg, layers_ref["inputs"].astype(np.int64), pre)
    ok("layers embeddings", emb, layers_ref["embeddings"])
    for l, h in enumerate(layers):
        ok(f"layers layer.{l}", h, layers_ref[f"layer.{l}"])
    ok.report()


def main(argv):
    minilm = pathlib.Path(argv[1]) if len(argv) > 1 else pathlib.Path(
        os.environ.get("TESSERA_MODELS") or os.path.expanduser("~/.cache/tessera/models")) / "all-MiniLM-L6-v2"
    for check in (check_bert, check_gpt2, check_vit, check_esm, check_ast):
        check()
    check_minilm(minilm)


if __name__ == "__main__":
    main(sys.argv)
