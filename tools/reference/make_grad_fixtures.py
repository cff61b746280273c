#!/usr/bin/env python3
"""Gradient fixtures: small Tessera models, a batch and a loss each, with PyTorch autograd's
gradient of that loss for every parameter (tests/data/grad).

For each case this builds the model with tools/reference/tessera_torch.py (Tessera's forward
pass re-implemented in PyTorch) from seeded random weights (norm scales and biases far from 1
and 0, so that a mix-up shows), runs a small batch, takes the loss (token cross-entropy, class
cross-entropy, or a fixed linear probe of the hidden rows) and its gradients in float64, and
writes, next to each other:
  NAME.yaml                  a Tessera experiment whose model.weights.file is the next file;
  NAME.weights.safetensors   every parameter (f32, Tessera's names, exactly parameter_specs);
  NAME.io.safetensors        the batch, the loss's target, hidden / logits / loss, grad.<name>.
tests/data/grad/README.md describes the format and the cases. The C++ suite
tests/test_grad_fixtures.cpp checks that Tessera's forward gives the same hidden rows and logits;
gradient checks come with Tessera's backward. Developer tool only: the product, its build and its
tests never run Python.

    .venv-ref/bin/python tools/reference/make_grad_fixtures.py [OUT_DIR] [--tessera build/dev/tessera]

OUT_DIR defaults to tests/data/grad. --tessera also runs `tessera check` on every experiment file
written and compares the model section it resolves with tessera_torch.resolve_model's. After
writing, every case is read back from its three files alone and recomputed (the files must say
everything). Deterministic: seeded, computed in float64, so a rerun writes the same bytes.
"""
import argparse
import math
import pathlib
import subprocess
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tessera_torch as tt  # noqa: E402

C, FF, LAYERS = 16, 32, 2


# ---------------------------------------------------------------------------------------------
# The cases. Each: the model section (before defaults), the batch, the loss.

def model(**keys):
    base = {"d_model": C, "n_layers": LAYERS, "d_ff": FF}
    base.update(keys)
    return base


CASES = [
    dict(name="gpt2", seed=101, loss="next_token",
         what="GPT-2-like decoder: tokens, learned positions, pre-LN, gelu_tanh, final norm, causal, "
              "tied LM head; next-token loss on a padded batch",
         model=model(arch="decoder", n_heads=4, activation="gelu_tanh", norm="pre",
                     positions={"kind": "learned", "max_len": 12},
                     stem={"kind": "tokens", "vocab_size": 23},
                     head={"kind": "lm", "tied": True}),
         B=3, T=8, lengths=[8, 5, 3]),
    dict(name="encoder2017", seed=102, loss="labels",
         what="2017-style encoder: tokens ×sqrt(d_model), sinusoidal positions, post-LN, ReLU, "
              "mean-pool classifier; padding",
         model=model(n_heads=2, activation="relu", norm="post",
                     positions={"kind": "sinusoidal", "max_len": 64},
                     stem={"kind": "tokens", "vocab_size": 19, "scale": "sqrt_d_model"},
                     head={"kind": "classifier", "n_classes": 3, "pool": "mean"}),
         B=3, T=7, lengths=[7, 4, 2]),
    dict(name="bert", seed=103, loss="labels",
         what="BERT-like encoder: tokens + token types, learned positions, stem.norm, post-LN, exact "
              "GELU, pooler (tanh) and classifier. Pool last, not cls: Tessera's config refuses "
              "pool cls without stem.cls, which a token stem cannot have",
         model=model(n_heads=4, activation="gelu", norm="post",
                     positions={"kind": "learned", "max_len": 12},
                     stem={"kind": "tokens", "vocab_size": 21, "token_types": 2, "norm": True},
                     head={"kind": "classifier", "n_classes": 4, "pool": "last", "pooler": True}),
         B=3, T=9, lengths=[9, 7, 4], types=True),
    dict(name="bert_mlm", seed=104, loss="masked_lm",
         what="BERT-MLM-like: as bert, with an untied LM head (transform: dense + GELU + layer norm, "
              "then the vocabulary projection and its bias); masked-LM loss",
         model=model(n_heads=4, activation="gelu", norm="post",
                     positions={"kind": "learned", "max_len": 12},
                     stem={"kind": "tokens", "vocab_size": 21, "token_types": 2, "norm": True},
                     head={"kind": "lm", "tied": False, "transform": True}),
         B=3, T=9, lengths=[9, 7, 4], types=True),
    dict(name="vit", seed=105, loss="labels",
         what="ViT-like: feature rows projected, a learned CLS row prepended (no roles), learned "
              "positions, pre-LN, final norm, cls-pool classifier; one item padded",
         model=model(n_heads=2, activation="gelu", norm="pre",
                     positions={"kind": "learned", "max_len": 8},
                     stem={"kind": "features", "n_features": 12, "cls": True},
                     head={"kind": "classifier", "n_classes": 3}),
         B=2, T=6, lengths=[6, 4]),
    dict(name="rotary_half", seed=106, loss="next_token",
         what="decoder with rotary positions (half style, every dim of each head), pre-LN, final norm, "
              "untied LM head; model.bias false (Tessera's untied head has a bias exactly when every "
              "linear layer has one); causal, padding",
         model=model(arch="decoder", n_heads=2, activation="gelu", norm="pre", bias=False,
                     positions={"kind": "rotary"},
                     stem={"kind": "tokens", "vocab_size": 17},
                     head={"kind": "lm", "tied": False}),
         B=3, T=7, lengths=[7, 6, 3]),
    dict(name="rotary_interleaved", seed=107, loss="next_token",
         what="decoder with rotary positions, interleaved pairs on the first 4 of 8 dims of each head, "
              "pre-LN, final norm, tied LM head with lm_bias; causal, padding",
         model=model(arch="decoder", n_heads=2, activation="gelu_tanh", norm="pre",
                     positions={"kind": "rotary", "rotary_style": "interleaved", "rotary_dims": 4,
                                "base": 100.0},
                     stem={"kind": "tokens", "vocab_size": 17},
                     head={"kind": "lm", "tied": True, "lm_bias": True}),
         B=3, T=7, lengths=[7, 5, 2]),
    dict(name="relative", seed=108, loss="probe",
         what="encoder with relative positions (Shaw et al. 2018, on keys and values, offsets clipped "
              "to ±3), post-LN, no head; probe loss; padding",
         model=model(n_heads=2, activation="gelu", norm="post",
                     positions={"kind": "relative", "max_distance": 3},
                     stem={"kind": "tokens", "vocab_size": 13}),
         B=2, T=9, lengths=[9, 6]),
    dict(name="packed", seed=109, loss="next_token",
         what="packing: a causal tokens model, three and two sequences per batch row (segments), "
              "learned positions restarting with each sequence, pre-LN, tied LM head; next-token loss "
              "within each sequence",
         model=model(arch="decoder", n_heads=2, activation="gelu_tanh", norm="pre",
                     positions={"kind": "learned", "max_len": 10},
                     stem={"kind": "tokens", "vocab_size": 23},
                     head={"kind": "lm", "tied": True}),
         B=2, T=9, segments=[[0, 0, 0, 0, 1, 1, 1, 2, 2], [0, 0, 0, 0, 0, 1, 1, -1, -1]]),
    dict(name="mixed", seed=110, loss="probe",
         what="mixed stem: feature rows (projected) and token rows in one sequence, a learned modality "
              "embedding on each, learned positions, pre-LN, final norm, no head; probe loss",
         model=model(n_heads=4, activation="gelu", norm="pre", stem={"kind": "mixed", "vocab_size": 11,
                     "n_features": 10, "modalities": 2},
                     positions={"kind": "learned", "max_len": 8}),
         B=2, T=8, lengths=[8, 6], kinds=[[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]]),
    dict(name="deit", seed=111, loss="labels",
         what="DeiT/AST-like: feature rows, learned CLS and distillation rows prepended (no roles), "
              "learned positions, pre-LN, final norm, head.norm, classifier on the mean of the two "
              "(pool cls_dist); one item padded",
         model=model(n_heads=2, activation="gelu", norm="pre",
                     positions={"kind": "learned", "max_len": 8},
                     stem={"kind": "features", "n_features": 12, "cls": True, "dist": True},
                     head={"kind": "classifier", "n_classes": 3, "pool": "cls_dist", "norm": True}),
         B=2, T=5, lengths=[5, 3]),
    dict(name="deit_roles", seed=112, loss="labels",
         what="as deit, with roles: the rows whose role is CLS (the first two) take the learned CLS and "
              "distillation vectors in place, nothing is prepended; padding rows have role PAD",
         model=model(n_heads=2, activation="gelu", norm="pre",
                     positions={"kind": "learned", "max_len": 8},
                     stem={"kind": "features", "n_features": 12, "cls": True, "dist": True},
                     head={"kind": "classifier", "n_classes": 3, "pool": "cls_dist", "norm": True}),
         B=2, T=7, lengths=[7, 5], roles=True),
]


# ---------------------------------------------------------------------------------------------
# Weights and batches, drawn from one generator per case.

BIASES = ("b_q", "b_k", "b_v", "b_o", "b1", "b2", "proj_bias", "head.b", "lm_bias", "pooler.b", "transform.b")
TABLES = ("stem.embed", "stem.type_embed", "stem.modality", "pos.table", "stem.cls", "stem.dist", "rel_k", "rel_v")


def random_weights(cfg: dict, g: torch.Generator) -> dict:
    """Every parameter in parameter_specs order: norm scales in [0.5, 1.5], shifts and biases in
    [-0.5, 0.5] and [-0.3, 0.3], tables N(0, 0.5²), matrices N(0, 1/in)."""
    out = {}
    for name, shape in tt.parameter_specs(cfg):
        if name.endswith(".gamma"):
            t = 0.5 + torch.rand(shape, generator=g)
        elif name.endswith(".beta"):
            t = torch.rand(shape, generator=g) - 0.5
        elif name.endswith(BIASES):
            t = 0.6 * torch.rand(shape, generator=g) - 0.3
        elif name.endswith(TABLES):
            t = 0.5 * torch.randn(shape, generator=g)
        else:  # a (in, out) matrix
            t = torch.randn(shape, generator=g) / math.sqrt(shape[0])
        out[name] = t.to(torch.float32).contiguous()
    return out


def make_batch(case: dict, cfg: dict, g: torch.Generator) -> dict:
    """The batch as tessera::Batch has it (ids, rows, lengths, segments, types, kinds, modality,
    roles), in the dtypes of the io file."""
    B, T, st = case["B"], case["T"], cfg["stem"]
    batch = {}
    if st["kind"] in ("tokens", "mixed"):
        hi = st["vocab_size"] - 1 if case["loss"] == "masked_lm" else st["vocab_size"]  # V-1: the mask id
        batch["ids"] = torch.randint(0, hi, (B, T), generator=g, dtype=torch.int32)
    if st["kind"] in ("features", "mixed"):
        batch["rows"] = torch.randn(B, T, st["n_features"], generator=g)
    if "segments" in case:
        batch["segments"] = torch.tensor(case["segments"], dtype=torch.int32)
    else:
        batch["lengths"] = torch.tensor(case["lengths"], dtype=torch.int32)
    real = (torch.arange(T)[None, :] < batch["lengths"][:, None].long() if "lengths" in batch
            else batch["segments"] >= 0)  # input rows that belong to a sequence
    if case.get("types"):  # sentence A then sentence B, 0 on padding
        types = torch.zeros(B, T, dtype=torch.int32)
        for b in range(B):
            n = int(real[b].sum())
            types[b, (n + 1) // 2:n] = 1
        batch["types"] = types
    if "kinds" in case:  # mixed: 1 = feature row, 0 = token row; modality 1 = features, 0 = tokens
        kinds = torch.tensor(case["kinds"], dtype=torch.uint8)
        batch["kinds"] = kinds
        batch["modality"] = kinds.to(torch.int32)
        batch["ids"] = torch.where(kinds != 0, torch.zeros_like(batch["ids"]), batch["ids"])  # unread
        batch["rows"] = batch["rows"] * (kinds != 0)[..., None]  # token rows' features are unread
    if case.get("roles"):
        roles = torch.where(real, torch.zeros(B, T, dtype=torch.uint8), torch.full((B, T), tt.ROLE_PAD, dtype=torch.uint8))
        roles[:, :2] = tt.ROLE_CLS  # CLS, then the distillation row
        batch["roles"] = roles
        batch["rows"][:, :2] = 0.0  # replaced by the learned vectors: unread
    return batch


def make_target(case: dict, cfg: dict, batch: dict, g: torch.Generator) -> dict:
    """The loss's target: targets (next-token or masked-LM, which also gives the masked ids),
    labels, or probe."""
    kind = case["loss"]
    _, _, seg, _ = tt.row_layout(cfg, batch)  # (B, T'): the sequence of each row, -1 = padding
    minus1 = lambda like: torch.full(like.shape, -1, dtype=torch.int32)
    if kind == "next_token":  # the next row's id within the same sequence, else -1
        ids, T = batch["ids"], batch["ids"].shape[1]
        same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] >= 0)
        targets = minus1(ids)
        targets[:, :T - 1] = torch.where(same, ids[:, 1:], minus1(ids[:, 1:]))
        return {"targets": targets}
    if kind == "masked_lm":  # a third of each item's rows masked (at least one): the original id there
        ids = batch["ids"].clone()
        mask_id = cfg["stem"]["vocab_size"] - 1
        targets = minus1(ids)
        for b in range(ids.shape[0]):
            n = int((seg[b] >= 0).sum())
            rows = torch.randperm(n, generator=g)[:max(1, n // 3)]
            targets[b, rows] = ids[b, rows]
            ids[b, rows] = mask_id
        return {"targets": targets, "ids": ids}
    if kind == "labels":
        return {"labels": torch.randint(0, cfg["head"]["n_classes"], (seg.shape[0],), generator=g, dtype=torch.int32)}
    if kind == "probe":  # loss = Σ probe ⊙ hidden, zero on padding rows
        probe = torch.randn(seg.shape[0], seg.shape[1], cfg["d_model"], generator=g) * (seg >= 0)[..., None]
        return {"probe": probe}
    raise ValueError(kind)


# ---------------------------------------------------------------------------------------------
# Forward, loss and gradients.

def forward_loss(model: tt.TesseraModel, io: dict, rows=None):
    """The model's outputs on the io file's batch, and the loss its target defines."""
    batch = {k: io[k] for k in ("ids", "lengths", "segments", "types", "kinds", "modality", "roles") if k in io}
    if rows is not None:
        batch["rows"] = rows
    out = model.forward(batch)
    if "targets" in io:  # mean over the rows whose target is not -1
        logits = out["logits"]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), io["targets"].reshape(-1).long(), ignore_index=-1)
    elif "labels" in io:  # mean over items
        loss = F.cross_entropy(out["logits"], io["labels"].long())
    else:
        loss = (io["probe"].to(torch.float64) * out["hidden"]).sum()
    return out, loss


def run(cfg: dict, weights: dict, io: dict) -> dict:
    """Forward, loss and gradients of one case from its weights and io tensors (batch + target)."""
    model = tt.TesseraModel(cfg, weights)
    rows = io["rows"].to(torch.float64).requires_grad_(True) if "rows" in io else None
    out, loss = forward_loss(model, io, rows)
    loss.backward()
    res = {"hidden": out["hidden"].detach().float(), "valid": out["valid"],
           "loss": loss.detach().float().reshape(1)}
    if out["logits"] is not None:
        res["logits"] = out["logits"].detach().float()
    for name, p in model.params.items():
        res["grad." + name] = (p.grad if p.grad is not None else torch.zeros_like(p)).float()
    if rows is not None:
        res["grad.rows"] = rows.grad.float()
    return res


def spot_check(cfg: dict, weights: dict, io: dict, res: dict, seed: int, n: int = 12) -> float:
    """Central differences (float64, step 1e-6) at n random entries of the parameters and rows,
    against autograd's gradients: the largest difference relative to each tensor's scale."""
    g = torch.Generator().manual_seed(seed)
    model = tt.TesseraModel(cfg, weights)
    rows = io["rows"].to(torch.float64) if "rows" in io else None
    names = sorted(model.params) + (["rows"] if rows is not None else [])
    worst, h = 0.0, 1e-6
    for _ in range(n):
        name = names[int(torch.randint(len(names), (1,), generator=g))]
        t = rows if name == "rows" else model.params[name]
        i = int(torch.randint(t.numel(), (1,), generator=g))
        with torch.no_grad():
            flat = t.view(-1)
            keep = float(flat[i])
            flat[i] = keep + h
            up = float(forward_loss(model, io, rows)[1])
            flat[i] = keep - h
            down = float(forward_loss(model, io, rows)[1])
            flat[i] = keep
        grad = res["grad." + name]
        # relative to the tensor's largest gradient, but at least 1e-3: some gradients are zero
        # in exact arithmetic (b_k: softmax ignores a constant added to a query's every score)
        scale = max(float(grad.abs().max()), 1e-3)
        worst = max(worst, abs((up - down) / (2 * h) - float(grad.view(-1)[i])) / scale)
    return worst


# ---------------------------------------------------------------------------------------------
# Files.

def yaml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def yaml_lines(d: dict, indent: int = 0) -> list:
    lines = []
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(" " * indent + f"{k}:")
            lines += yaml_lines(v, indent + 2)
        else:
            lines.append(" " * indent + f"{k}: {yaml_value(v)}")
    return lines


def experiment_yaml(case: dict) -> str:
    name = case["name"]
    section = {"name": f"grad-{name}", **case["model"], "weights": {"file": f"{name}.weights.safetensors"}}
    head = [f"# Gradient fixture {name}: {case['what']}.",
            "# Made by tools/reference/make_grad_fixtures.py (see README.md); the batch, the loss's",
            f"# target, the forward outputs and PyTorch's gradients are in {name}.io.safetensors."]
    # wrap the description at ~100 columns
    words, wrapped, line = head[0].split(" "), [], "#"
    for w in words[1:]:
        if len(line) + 1 + len(w) > 100:
            wrapped.append(line)
            line = "#  "
        line += " " + w
    wrapped.append(line)
    return "\n".join(wrapped + head[1:] + ["model:"] + yaml_lines(section, 2)) + "\n"


def write_case(case: dict, out_dir: pathlib.Path) -> dict:
    name = case["name"]
    cfg = tt.resolve_model(case["model"])
    g = torch.Generator().manual_seed(case["seed"])
    weights = random_weights(cfg, g)
    batch = make_batch(case, cfg, g)
    io = dict(batch)
    io.update(make_target(case, cfg, batch, g))
    res = run(cfg, weights, io)
    fd = spot_check(cfg, weights, io, res, case["seed"])
    if fd > 1e-5:
        raise SystemExit(f"{name}: autograd and central differences differ by {fd:.1e}")
    io.update({k: v for k, v in res.items() if k != "valid"})
    (out_dir / f"{name}.yaml").write_text(experiment_yaml(case))
    save_file(weights, str(out_dir / f"{name}.weights.safetensors"))
    # One metadata entry: safetensors writes several in no fixed order, and reruns must give the same bytes.
    meta = {"fixture": f"{name}: loss {case['loss']}, made by tools/reference/make_grad_fixtures.py with "
                       f"torch {torch.__version__.split('+')[0]}, computed in float64"}
    save_file({k: v.contiguous() for k, v in io.items()}, str(out_dir / f"{name}.io.safetensors"), metadata=meta)
    return {"name": name, "cfg": cfg, "loss": float(res["loss"]), "rows": int(res["valid"].sum()),
            "T_out": res["hidden"].shape[1], "fd": fd}


def read_back(name: str, out_dir: pathlib.Path) -> float:
    """Recomputes a case from its three files alone; returns the largest difference from what
    they hold (hidden, logits, loss and every gradient, relative to each tensor's largest value)."""
    import yaml  # Debian's python3-yaml; only here
    section = yaml.safe_load((out_dir / f"{name}.yaml").read_text())["model"]
    weights_file = section.pop("weights")["file"]
    section.pop("name", None)
    cfg = tt.resolve_model(section)
    weights = load_file(str(out_dir / weights_file))
    io = load_file(str(out_dir / f"{name}.io.safetensors"))
    inputs = {k: v for k, v in io.items() if not k.startswith("grad.") and k not in ("hidden", "logits", "loss")}
    res = run(cfg, weights, inputs)
    if sorted(weights) != sorted(n for n, _ in tt.parameter_specs(cfg)):
        raise ValueError(f"{name}: the weights file is not parameter_specs' set")
    worst = 0.0
    for k, v in res.items():
        if k == "valid":
            continue
        scale = max(float(io[k].abs().max()), 1e-30)
        worst = max(worst, float((v - io[k]).abs().max()) / scale)
    missing = sorted(k for k in io if k.startswith("grad.") and k not in res)
    if missing:
        raise ValueError(f"{name}: gradients without a parameter: {missing}")
    return worst


def compare_with_tessera_check(tessera: str, name: str, cfg: dict, out_dir: pathlib.Path):
    """`tessera check NAME.yaml` resolves the model section; every key resolve_model filled must
    agree with it."""
    import yaml
    text = subprocess.run([tessera, "check", str(out_dir / f"{name}.yaml")], check=True,
                          capture_output=True, text=True).stdout
    resolved = yaml.safe_load(text.split("\n# plan")[0])["model"]

    def walk(ours, theirs, path):
        for k, v in ours.items():
            if isinstance(v, dict):
                walk(v, theirs.get(k) or {}, path + k + ".")
                continue
            t = theirs.get(k)
            same = math.isclose(float(v), float(t), rel_tol=1e-12) if isinstance(v, float) else v == t
            if not same:
                raise ValueError(f"{name}: model.{path}{k}: resolve_model says {v!r}, tessera check {t!r}")

    walk({k: v for k, v in cfg.items() if k != "weights"}, resolved, "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?", default="tests/data/grad")
    ap.add_argument("--tessera", help="a built tessera binary: compare `tessera check`'s resolved configs")
    args = ap.parse_args()
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # one thread: the same summation order on every run
    for case in CASES:
        info = write_case(case, out_dir)
        worst = read_back(case["name"], out_dir)
        if worst > 1e-6:
            raise SystemExit(f"{case['name']}: read back differs by {worst:.2e}")
        if args.tessera:
            compare_with_tessera_check(args.tessera, case["name"], info["cfg"], out_dir)
        print(f"{info['name']:20s} loss {info['loss']:.6f}  T' {info['T_out']}  real rows {info['rows']}  "
              f"central differences {info['fd']:.1e}  read back {worst:.1e}")
    total = sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file())
    print(f"{len(CASES)} cases, {total / 1024:.0f} KiB in {out_dir}")


if __name__ == "__main__":
    main()
