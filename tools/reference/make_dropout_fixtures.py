#!/usr/bin/env python3
"""Dropout gradient fixtures (tests/data/grad_dropout): cases of make_grad_fixtures.py trained with
train.dropout on, and PyTorch autograd's loss and gradients with Tessera's own dropout masks.

The masks are regenerated here from the counter formula of core/include/tessera/random.h
(DropoutMask, dropout_key), so nothing is exported from Tessera: site s of layer l in micro-batch m
of step t under train.seed S has the key
    fmix(fmix(fmix(fmix(fmix(S) ^ t) ^ m) ^ l) ^ s),  fmix(z) = mix(z + 0x9e3779b97f4a7c15)
(mix: SplitMix64's finaliser), element e of the tensor it multiplies (row-major) is kept when
mix(key + (e + 1) * 0x9e3779b97f4a7c15) >> 32 >= floor(p * 2^32), and kept values are scaled by
the f32 value 1 / (1 - p). Sites: 0 the stem's output (layer 0), 1 the attention weights (B, H, T, T),
2 the attention sub-layer's output after W_O, 3 the FFN's output, each before its residual add.

Per case NAME (format as tests/data/grad/README.md): NAME.yaml (the model and train.seed and
train.dropout), NAME.weights.safetensors, NAME.io.safetensors (the batch, the target, hidden,
logits, loss, grad.<name>, and dropout.step / dropout.micro_batch (1) i32: the counters used).
Checked by tests/test_grad_fixtures.cpp (GradDropoutFixtures). Developer tool only.

    .venv-ref/bin/python tools/reference/make_dropout_fixtures.py [OUT_DIR]
"""
import argparse
import pathlib
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import make_grad_fixtures as mg  # noqa: E402
import tessera_torch as tt  # noqa: E402

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix(z):
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def fmix(z):
    with np.errstate(over="ignore"):
        return mix(np.uint64(z) + GOLDEN)


def dropout_key(seed, step, micro, layer, site):
    k = fmix(np.uint64(seed))
    for c in (step, micro, layer, site):
        k = fmix(k ^ np.uint64(c))
    return k


def mask(shape, p, key):
    """The factors (0 or f32 1/(1-p)) of a tensor of `shape`, float64."""
    p32 = np.float32(p)
    threshold = int(float(p32) * 4294967296.0)
    n = int(np.prod(shape))
    with np.errstate(over="ignore"):
        e = np.arange(1, n + 1, dtype=np.uint64)
        u = mix(np.uint64(key) + e * GOLDEN) >> np.uint64(32)
    scale = float(np.float32(1) / (np.float32(1) - p32))
    return torch.from_numpy(np.where(u >= np.uint64(threshold), scale, 0.0).reshape(shape))


class DropoutModel(tt.TesseraModel):
    """tessera_torch's model with Tessera's training dropout at its four sites."""

    def __init__(self, cfg, tensors, drop):
        super().__init__(cfg, tensors)
        self.drop = drop  # p: {embedding, attention, residual}, seed, step, micro_batch

    def factors(self, shape, site, layer):
        p = self.drop["p"][("embedding", "attention", "residual", "residual")[site]]
        if p == 0:
            return None
        d = self.drop
        return mask(tuple(shape), p, dropout_key(d["seed"], d["step"], d["micro_batch"], layer, site))

    def apply(self, x, site, layer):
        m = self.factors(x.shape, site, layer)
        return x if m is None else x * m

    def stem(self, batch, extra, T, pos):
        return self.apply(super().stem(batch, extra, T, pos), 0, 0)

    def attention(self, l, x, seg, pos):  # tessera_torch's, with the weights dropped
        c, p = self.c, f"blocks.{l}.attn."
        B, T, _ = x.shape
        H, dk, dv = c["n_heads"], c["d_k"], c["d_v"]

        def heads(w, b, d):
            return self.linear(x, p + w, p + b).view(B, T, H, d).transpose(1, 2)

        q, k, v = heads("w_q", "b_q", dk), heads("w_k", "b_k", dk), heads("w_v", "b_v", dv)
        P = c["positions"]
        if P["kind"] == "rotary":
            q = tt.apply_rotary(q, pos, P["rotary_dims"], P["base"], P["rotary_style"])
            k = tt.apply_rotary(k, pos, P["rotary_dims"], P["base"], P["rotary_style"])
        scale = c["attention"]["scale"]
        s = scale * (q @ k.transpose(2, 3))
        if P["kind"] == "relative":
            kmax = P["max_distance"]
            rel = (pos[:, None, :] - pos[:, :, None]).clamp(-kmax, kmax) + kmax
            s = s + scale * torch.einsum("bhid,bijd->bhij", q, self.params[p + "rel_k"][rel])
        si, sj = seg[:, :, None], seg[:, None, :]
        allowed = (sj >= 0) & ((si < 0) | (si == sj))
        if c["causal"]:
            allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
        any_key = allowed.any(-1, keepdim=True)
        allowed = allowed | ~any_key
        s = s.masked_fill(~allowed[:, None], float("-inf"))
        a = torch.softmax(s, dim=-1) * any_key[:, None].to(s.dtype)
        a = self.apply(a, 1, l)
        o = a @ v
        if P["kind"] == "relative":
            o = o + torch.einsum("bhij,bijd->bhid", a, self.params[p + "rel_v"][rel])
        concat = o.transpose(1, 2).reshape(B, T, H * dv)
        return self.apply(self.linear(concat, p + "w_o", p + "b_o"), 2, l)

    def ffn(self, l, x):
        return self.apply(super().ffn(l, x), 3, l)


DROP = {"embedding": 0.1, "attention": 0.2, "residual": 0.3}
CASES = [
    # (grad case, train.seed, step, micro_batch)
    ("gpt2", 11, 5, 1),         # pre-LN, causal, padded: the fused kernel's path
    ("bert", 12, 0, 0),         # post-LN, token types, stem.norm
    ("relative", 13, 7, 0),     # Shaw positions: the materialised attention
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?", default="tests/data/grad_dropout")
    args = ap.parse_args()
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    by_name = {c["name"]: c for c in mg.CASES}
    for name, seed, step, micro in CASES:
        case = by_name[name]
        cfg = tt.resolve_model(case["model"])
        g = torch.Generator().manual_seed(case["seed"])
        weights = mg.random_weights(cfg, g)
        batch = mg.make_batch(case, cfg, g)
        io = dict(batch)
        io.update(mg.make_target(case, cfg, batch, g))
        drop = {"p": DROP, "seed": seed, "step": step, "micro_batch": micro}
        model = DropoutModel(cfg, weights, drop)
        out, loss = mg.forward_loss(model, io)
        loss.backward()
        # Central differences at a few entries: with the masks fixed the function is smooth.
        worst = 0.0
        gen = torch.Generator().manual_seed(seed)
        check = DropoutModel(cfg, weights, drop)
        names = sorted(check.params)
        for _ in range(8):
            pname = names[int(torch.randint(len(names), (1,), generator=gen))]
            t = check.params[pname]
            i = int(torch.randint(t.numel(), (1,), generator=gen))
            with torch.no_grad():
                flat = t.view(-1)
                x0 = float(flat[i])
                flat[i] = x0 + 1e-6
                up = float(mg.forward_loss(check, io)[1])
                flat[i] = x0 - 1e-6
                down = float(mg.forward_loss(check, io)[1])
                flat[i] = x0
            grad = model.params[pname].grad
            scale = max(float(grad.abs().max()), 1e-3)
            worst = max(worst, abs((up - down) / 2e-6 - float(grad.view(-1)[i])) / scale)
        if worst > 1e-5:
            raise SystemExit(f"{name}: autograd and central differences differ by {worst:.1e}")
        io["hidden"] = out["hidden"].detach().float()
        if out["logits"] is not None:
            io["logits"] = out["logits"].detach().float()
        io["loss"] = loss.detach().float().reshape(1)
        for pname, p in model.params.items():
            io["grad." + pname] = (p.grad if p.grad is not None else torch.zeros_like(p)).float()
        io["dropout.step"] = torch.tensor([step], dtype=torch.int32)
        io["dropout.micro_batch"] = torch.tensor([micro], dtype=torch.int32)
        text = mg.experiment_yaml(case).replace("make_grad_fixtures.py", "make_dropout_fixtures.py")
        text += "train:\n  seed: %d\n  dropout:\n" % seed + "".join(
            f"    {k}: {v}\n" for k, v in DROP.items())
        (out_dir / f"{name}.yaml").write_text(text)
        save_file(weights, str(out_dir / f"{name}.weights.safetensors"))
        meta = {"fixture": f"{name} with dropout {DROP}, seed {seed}, step {step}, micro-batch {micro}: made by "
                           f"tools/reference/make_dropout_fixtures.py with torch {torch.__version__.split('+')[0]}, "
                           "computed in float64"}
        save_file({k: v.contiguous() for k, v in io.items()}, str(out_dir / f"{name}.io.safetensors"), metadata=meta)
        print(f"{name:10s} loss {float(loss):.6f}  central differences {worst:.1e}")


if __name__ == "__main__":
    main()
