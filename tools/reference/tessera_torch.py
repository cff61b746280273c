"""Tessera's transformer, written again in plain PyTorch (1.13 API), for reference values and
autograd gradients.

The model is built from a Tessera model config (the YAML `model:` section, as a dict; defaults
are filled in by resolve_model, or the section comes already resolved from `tessera check`) and
takes Tessera's parameters by their Tessera names. Weights are (in, out): a layer computes x · W.
The semantics are those of core/src/model/ (model.cpp, attention.cpp, positions.cpp, weights.cpp)
and core/include/tessera/model.h; each step below names the part of Tessera it mirrors.

    import tessera_torch as tt
    cfg = tt.resolve_model(yaml.safe_load(open("NAME.yaml"))["model"])
    model = tt.TesseraModel(cfg, tensors)                 # tensors: {name: tensor}, as parameter_specs
    out = model.forward({"ids": ids, "lengths": [7, 4]})  # out["hidden"], out["logits"], out["valid"]

Covered: stems tokens / features / identity / mixed (sqrt(d_model) scale, token types, CLS and
distillation rows, prepended or by role, modality embedding, stem.norm); positions none /
learned / sinusoidal / relative (Shaw) / rotary (half, interleaved, partial); post-LN, pre-LN and
no norm; the FFN with relu / gelu / gelu_tanh; padding, causal and packing masks; the final norm;
heads pool / classifier (pool cls / mean / last / cls_dist, pooler, normalize, head.norm) and lm
(tied or not, transform, lm_bias). The fixtures of tests/data/grad exercise all of this except
the identity stem, norm none, residual false, explicit Batch::positions, head.kind pool and
head.normalize (written, but not yet held against Tessera). Refused: bf16 compute, ESM-2's
token_dropout, attention without an output projection, Hugging Face folders, residual false with
pre-LN. Dropout does not exist in Tessera's forward, so there is none here.

Developer tool only: the product, its build and its tests never run Python.
"""
import math

import torch
import torch.nn.functional as F

ROLE_CLS = 1  # TSR_ROLE_CLS in core/include/tessera/plugin.h
ROLE_PAD = 3  # TSR_ROLE_PAD


# ---------------------------------------------------------------------------------------------
# Config: Tessera's defaults (core/src/config/schema.cpp, `tessera schema`), for the keys read here.

def resolve_model(model: dict) -> dict:
    """A copy of the `model:` section with every default this module reads filled in, as the
    loader resolves them. An already resolved section (`tessera check`) comes back unchanged."""
    m = {k: (dict(v) if isinstance(v, dict) else v) for k, v in model.items()}

    def put(section, key, value):
        d = m.setdefault(section, {}) if section else m
        if d.get(key) is None:
            d[key] = value

    if m.get("from", "tessera") != "tessera":
        raise NotImplementedError("model.from: hf folders are not re-implemented here")
    if "include" in m:
        raise NotImplementedError("model.include: resolve it first (tessera check prints the result)")
    if m.get("d_model") is None:
        raise ValueError("model.d_model is required")
    put(None, "arch", "encoder")
    put(None, "causal", m["arch"] == "decoder")
    put(None, "n_layers", 1)
    put(None, "n_heads", 1)
    put(None, "d_k", m["d_model"] // m["n_heads"])
    put(None, "d_v", m["d_model"] // m["n_heads"])
    put(None, "d_ff", 4 * m["d_model"])
    put(None, "activation", "relu")
    put(None, "norm", "post")
    put(None, "norm_eps", 1e-5)
    put(None, "final_norm", m["norm"] == "pre")
    put(None, "bias", True)
    put(None, "residual", True)
    put(None, "dtype", "f32")
    a = m.setdefault("attention", {})
    if a.get("scale") in (None, "auto"):
        a["scale"] = 1.0 / math.sqrt(m["d_k"])
    put("attention", "output_projection", True)
    put("positions", "kind", "none")
    put("positions", "max_len", 512)
    put("positions", "max_distance", 16)
    put("positions", "base", 10000.0)
    put("positions", "rotary_dims", m["d_k"])
    put("positions", "rotary_style", "half")
    put("stem", "kind", "tokens")
    for key, value in (("vocab_size", None), ("n_features", None), ("cls", False), ("scale", "none"),
                       ("token_types", 0), ("norm", False), ("dist", False), ("token_dropout", False),
                       ("mask_id", -1), ("modalities", 0)):
        put("stem", key, value)
    put("head", "kind", "none")
    put("head", "pool", "cls" if m["stem"]["cls"] else "mean")
    for key, value in (("normalize", False), ("n_classes", None), ("tied", True), ("lm_bias", False),
                       ("pooler", False), ("norm", False), ("transform", False)):
        put("head", key, value)

    # What this module does not re-implement.
    if m["dtype"] != "f32":
        raise NotImplementedError("model.dtype bf16")
    if m["stem"]["token_dropout"]:
        raise NotImplementedError("model.stem.token_dropout (ESM-2)")
    if not m["attention"]["output_projection"]:
        raise NotImplementedError("model.attention.output_projection false")
    if not m["residual"] and m["norm"] == "pre":
        # Tessera's pre-LN block always adds its residuals, whatever model.residual says.
        raise NotImplementedError("model.residual false with norm pre")
    if m.get("weights", {}).get("inline"):
        raise NotImplementedError("model.weights.inline: give the tensors to TesseraModel instead")
    return m


def parameter_specs(c: dict) -> list:
    """[(name, shape)] in the order of tessera::parameter_specs (core/src/model/weights.cpp)."""
    C, H, dk, dv, ff = c["d_model"], c["n_heads"], c["d_k"], c["d_v"], c["d_ff"]
    s, st, hd, pos = [], c["stem"], c["head"], c["positions"]
    tokens = st["kind"] in ("tokens", "mixed")
    features = st["kind"] in ("features", "mixed")
    bias = c["bias"]
    if tokens:
        s.append(("stem.embed", (st["vocab_size"], C)))
        if st["token_types"] > 0:
            s.append(("stem.type_embed", (st["token_types"], C)))
    if features:
        s.append(("stem.proj", (st["n_features"], C)))
        if bias:
            s.append(("stem.proj_bias", (C,)))
        if st["cls"]:
            s.append(("stem.cls", (C,)))
        if st["cls"] and st["dist"]:
            s.append(("stem.dist", (C,)))
    if st["modalities"] > 0:
        s.append(("stem.modality", (st["modalities"], C)))
    if pos["kind"] == "learned":
        s.append(("pos.table", (pos["max_len"], C)))
    if st["norm"]:
        s += [("stem.norm.gamma", (C,)), ("stem.norm.beta", (C,))]
    for l in range(c["n_layers"]):
        b = f"blocks.{l}."
        for w, n in (("q", dk), ("k", dk), ("v", dv)):
            s.append((b + f"attn.w_{w}", (C, H * n)))
            if bias:
                s.append((b + f"attn.b_{w}", (H * n,)))
        s.append((b + "attn.w_o", (H * dv, C)))
        if bias:
            s.append((b + "attn.b_o", (C,)))
        if pos["kind"] == "relative":
            R = 2 * pos["max_distance"] + 1
            s += [(b + "attn.rel_k", (R, dk)), (b + "attn.rel_v", (R, dv))]
        if c["norm"] != "none":
            s += [(b + "ln1.gamma", (C,)), (b + "ln1.beta", (C,))]
        if ff > 0:
            s.append((b + "ffn.w1", (C, ff)))
            if bias:
                s.append((b + "ffn.b1", (ff,)))
            s.append((b + "ffn.w2", (ff, C)))
            if bias:
                s.append((b + "ffn.b2", (C,)))
            if c["norm"] != "none":
                s += [(b + "ln2.gamma", (C,)), (b + "ln2.beta", (C,))]
    if c["final_norm"]:
        s += [("final_norm.gamma", (C,)), ("final_norm.beta", (C,))]
    pooled = hd["kind"] in ("pool", "classifier")
    if pooled and hd["pooler"]:
        s += [("head.pooler.w", (C, C)), ("head.pooler.b", (C,))]
    if pooled and hd["norm"]:
        s += [("head.norm.gamma", (C,)), ("head.norm.beta", (C,))]
    if hd["kind"] == "lm" and hd["transform"]:
        s += [("head.transform.w", (C, C)), ("head.transform.b", (C,)),
              ("head.transform.gamma", (C,)), ("head.transform.beta", (C,))]
    if hd["kind"] == "lm" and hd["tied"] and hd["lm_bias"]:
        s.append(("head.lm_bias", (st["vocab_size"],)))
    if hd["kind"] == "classifier":
        s.append(("head.w", (C, hd["n_classes"])))
        if bias:
            s.append(("head.b", (hd["n_classes"],)))
    if hd["kind"] == "lm" and not hd["tied"]:
        s.append(("head.lm", (C, st["vocab_size"])))
        if bias:
            s.append(("head.lm_bias", (st["vocab_size"],)))
    return s


# ---------------------------------------------------------------------------------------------
# Pieces computed rather than learned (core/src/model/positions.cpp, layers.h).

def sinusoidal_table(T: int, C: int, base: float, dtype) -> torch.Tensor:
    """PE(p, 2i) = sin(p / base^(2i/C)), PE(p, 2i+1) = cos(p / base^(2i/C))."""
    p = torch.arange(T, dtype=torch.float64)[:, None]
    c = torch.arange(C)
    i2 = (c - c % 2).to(torch.float64)
    angle = p / torch.pow(torch.tensor(base, dtype=torch.float64), i2 / C)
    return torch.where(c % 2 == 0, torch.sin(angle), torch.cos(angle)).to(dtype)


def apply_rotary(x: torch.Tensor, pos: torch.Tensor, dims: int, base: float, style: str) -> torch.Tensor:
    """Rotates the first `dims` entries of every row of x (B, H, T, D) by p · base^(-2i/dims),
    p = pos (B, T). half pairs (i, i + dims/2); interleaved pairs (2i, 2i + 1)."""
    half = dims // 2
    inv_freq = torch.pow(torch.tensor(base, dtype=torch.float64),
                         -2.0 * torch.arange(half, dtype=torch.float64) / dims)
    angle = pos.to(torch.float64)[:, None, :, None] * inv_freq  # (B, 1, T, half)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    if style == "half":
        a, b = x[..., :half], x[..., half:dims]
        rotated = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    elif style == "interleaved":
        a, b = x[..., 0:dims:2], x[..., 1:dims:2]
        rotated = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    else:
        raise ValueError(f"rotary_style {style}")
    return torch.cat([rotated, x[..., dims:]], dim=-1)


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return F.relu(x)
    if name == "gelu":  # x/2 · (1 + erf(x/√2))
        return F.gelu(x)
    if name == "gelu_tanh":  # x/2 · (1 + tanh(√(2/π)(x + 0.044715x³)))
        return F.gelu(x, approximate="tanh")
    raise ValueError(f"activation {name}")


# ---------------------------------------------------------------------------------------------
# Which rows are real, which attend to which, and each row's position (Model::forward).

def row_layout(c: dict, batch: dict):
    """(extra, T', seg, pos): extra CLS/distillation rows prepended to each batch row (a stem with
    cls and no roles), T' = T + extra, and per row (B, T') the sequence it belongs to (-1:
    padding) and its position id (0, 1, ... within its sequence; t for a padding row)."""
    st = c["stem"]
    src = batch["ids"] if batch.get("ids") is not None else batch["rows"]
    B, T_in = src.shape[0], src.shape[1]
    cls_stem = st["cls"] and st["kind"] in ("features", "mixed")
    extra = (2 if st["dist"] else 1) if cls_stem and batch.get("roles") is None else 0
    segments, positions, lengths = batch.get("segments"), batch.get("positions"), batch.get("lengths")
    if extra and (segments is not None or positions is not None or batch.get("kinds") is not None):
        raise ValueError("prepended CLS rows with segments, positions or kinds: Tessera refuses these")
    T = T_in + extra
    seg = torch.zeros(B, T, dtype=torch.long)
    pos = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        prev, run = -2, 0
        for t in range(T):
            if segments is not None:
                s = int(segments[b][t])
            elif lengths is not None and t >= int(lengths[b]) + extra:
                s = -1
            else:
                s = 0
            seg[b, t] = -1 if s < 0 else s
            run = run + 1 if s == prev else 0  # positions restart with each sequence
            prev = s
            pos[b, t] = int(positions[b][t]) if positions is not None else (t if s < 0 else run)
    return extra, T, seg, pos


# ---------------------------------------------------------------------------------------------
# The model.

class TesseraModel:
    """Tessera's forward pass with autograd. `tensors` maps every parameter name of
    parameter_specs(cfg) to a tensor of its shape; they are copied to `dtype` (float64 by default,
    so that the f32 values in a weights file give the exact function they define) as leaves that
    require grad: model.params[name].grad after backward()."""

    def __init__(self, cfg: dict, tensors: dict, dtype=torch.float64):
        self.c = cfg
        self.dtype = dtype
        want = dict(parameter_specs(cfg))
        missing = sorted(set(want) - set(tensors))
        unexpected = sorted(set(tensors) - set(want))
        if missing or unexpected:
            raise ValueError(f"parameters: missing {missing}, unexpected {unexpected}")
        self.params = {}
        for name, shape in want.items():
            t = tensors[name]
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {tuple(shape)}")
            self.params[name] = t.detach().to(dtype).clone().requires_grad_(True)

    def linear(self, x, w, b=None):
        y = x @ self.params[w]
        return y + self.params[b] if b is not None and b in self.params else y

    def layer_norm(self, x, prefix):
        C = x.shape[-1]
        return F.layer_norm(x, (C,), self.params[prefix + ".gamma"], self.params[prefix + ".beta"],
                            eps=self.c["norm_eps"])

    # -- Stem: ids and/or feature rows -> (B, T, C), then positions and stem.norm.
    def stem(self, batch, extra, T, pos):
        c, st = self.c, self.c["stem"]
        C, kind = c["d_model"], st["kind"]
        ids, rows = batch.get("ids"), batch.get("rows")
        kinds, roles, types, modality = (batch.get(k) for k in ("kinds", "roles", "types", "modality"))
        B, T_in = pos.shape[0], T - extra
        scale = math.sqrt(C) if st["scale"] == "sqrt_d_model" else 1.0
        zero = torch.zeros(C, dtype=self.dtype)
        out = [[zero] * T for _ in range(B)]  # rows gathered, then stacked (autograd-friendly)
        for b in range(B):
            for t in range(T_in):
                if kind == "mixed":
                    feature = int(kinds[b][t]) != 0
                else:
                    feature = kind != "tokens"
                if kind == "identity":
                    x = rows[b, t].to(self.dtype)
                elif not feature:
                    x = self.params["stem.embed"][int(ids[b][t])] * scale
                    if "stem.type_embed" in self.params:  # added to token rows only
                        x = x + self.params["stem.type_embed"][int(types[b][t]) if types is not None else 0]
                else:
                    cls_row = st["cls"] and roles is not None and int(roles[b][t]) == ROLE_CLS
                    # a CLS-role row right after another one is the distillation row
                    dist_row = cls_row and st["dist"] and t > 0 and int(roles[b][t - 1]) == ROLE_CLS
                    if dist_row:
                        x = self.params["stem.dist"]
                    elif cls_row:
                        x = self.params["stem.cls"]
                    else:
                        x = self.linear(rows[b, t].to(self.dtype), "stem.proj", "stem.proj_bias")
                if st["modalities"] > 0:  # input rows only, not prepended CLS rows
                    x = x + self.params["stem.modality"][int(modality[b][t])]
                out[b][t + extra] = x
            if extra:
                out[b][0] = self.params["stem.cls"]
                if extra == 2:
                    out[b][1] = self.params["stem.dist"]
        x = torch.stack([torch.stack(r) for r in out])  # (B, T, C)
        pk = c["positions"]["kind"]
        if pk in ("learned", "sinusoidal"):  # every row, padding and CLS rows included
            if int(pos.max()) >= c["positions"]["max_len"]:
                raise ValueError("positions beyond positions.max_len")
            table = (self.params["pos.table"] if pk == "learned"
                     else sinusoidal_table(c["positions"]["max_len"], C, c["positions"]["base"], self.dtype))
            x = x + table[pos]
        if st["norm"]:
            x = self.layer_norm(x, "stem.norm")
        return x

    # -- Multi-head attention (core/src/model/attention.cpp, the materialised path).
    def attention(self, l, x, seg, pos):
        c, p = self.c, f"blocks.{l}.attn."
        B, T, _ = x.shape
        H, dk, dv = c["n_heads"], c["d_k"], c["d_v"]

        def heads(w, b, d):
            return self.linear(x, p + w, p + b).view(B, T, H, d).transpose(1, 2)  # (B, H, T, d)

        q, k, v = heads("w_q", "b_q", dk), heads("w_k", "b_k", dk), heads("w_v", "b_v", dv)
        P = c["positions"]
        if P["kind"] == "rotary":
            q = apply_rotary(q, pos, P["rotary_dims"], P["base"], P["rotary_style"])
            k = apply_rotary(k, pos, P["rotary_dims"], P["base"], P["rotary_style"])
        scale = c["attention"]["scale"]
        s = scale * (q @ k.transpose(2, 3))  # (B, H, T, T)
        if P["kind"] == "relative":  # Shaw et al.: offsets pos_j - pos_i clipped to [-k, k]
            kmax = P["max_distance"]
            rel = (pos[:, None, :] - pos[:, :, None]).clamp(-kmax, kmax) + kmax  # (B, Ti, Tj)
            ak = self.params[p + "rel_k"][rel]  # (B, T, T, dk)
            s = s + scale * torch.einsum("bhid,bijd->bhij", q, ak)
        # Query i may read key j when j is a real row of i's own sequence (a padding row's query
        # reads every real row) and, causal, j <= i.
        si, sj = seg[:, :, None], seg[:, None, :]
        allowed = (sj >= 0) & ((si < 0) | (si == sj))
        if c["causal"]:
            allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
        any_key = allowed.any(-1, keepdim=True)  # a row with no key gives zeros, not NaN
        allowed = allowed | ~any_key
        s = s.masked_fill(~allowed[:, None], float("-inf"))
        a = torch.softmax(s, dim=-1) * any_key[:, None].to(s.dtype)
        o = a @ v  # (B, H, T, dv)
        if P["kind"] == "relative":
            o = o + torch.einsum("bhij,bijd->bhid", a, self.params[p + "rel_v"][rel])
        concat = o.transpose(1, 2).reshape(B, T, H * dv)
        return self.linear(concat, p + "w_o", p + "b_o")

    def ffn(self, l, x):
        p = f"blocks.{l}.ffn."
        return self.linear(activation(self.c["activation"], self.linear(x, p + "w1", p + "b1")), p + "w2", p + "b2")

    # -- The blocks (model.h): post-LN R = LN(X + MHA(X)), Y = LN(R + FFN(R));
    #    pre-LN R = X + MHA(LN(X)), Y = R + FFN(LN(R)); norm none: no LN.
    def block(self, l, x, seg, pos):
        c, b = self.c, f"blocks.{l}."
        if c["norm"] == "pre":
            x = x + self.attention(l, self.layer_norm(x, b + "ln1"), seg, pos)
            if c["d_ff"] > 0:
                x = x + self.ffn(l, self.layer_norm(x, b + "ln2"))
            return x
        u = self.attention(l, x, seg, pos)
        if c["residual"]:
            u = x + u
        x = self.layer_norm(u, b + "ln1") if c["norm"] == "post" else u
        if c["d_ff"] > 0:
            f = self.ffn(l, x)
            if c["residual"]:
                f = x + f
            x = self.layer_norm(f, b + "ln2") if c["norm"] == "post" else f
        return x

    # -- Pooling of one sequence's rows h (n, C) (tessera::pool_rows), then Model::pool_head.
    def pool(self, h, roles):
        n, kind = h.shape[0], self.c["head"]["pool"]
        if n == 0:
            return torch.zeros(h.shape[1], dtype=self.dtype)

        def first_cls():
            if roles is not None:
                for t in range(n):
                    if int(roles[t]) == ROLE_CLS:
                        return t
            return 0

        if kind == "cls":
            return h[first_cls()]
        if kind == "last":
            return h[n - 1]
        if kind == "mean":
            return h.mean(0)
        if kind == "cls_dist":  # the mean of the CLS row and the one after it
            first = first_cls()
            return 0.5 * (h[first] + h[min(first + 1, n - 1)])
        raise ValueError(f"pool {kind}")

    def forward(self, batch: dict) -> dict:
        """batch: ids (B, T) and/or rows (B, T, F) (a tensor; give it requires_grad for its
        gradient), and optionally lengths (B), segments, positions, roles, kinds, modality, types
        (B, T), as tessera::Batch. Returns hidden (B, T', C), logits ((B, n_classes) or
        (B, T', V), or None), pooled (B, C) or None, and valid (B, T') — the rows that belong to a
        sequence (not padding)."""
        c, hd = self.c, self.c["head"]
        extra, T, seg, pos = row_layout(c, batch)
        B = seg.shape[0]
        x = self.stem(batch, extra, T, pos)
        for l in range(c["n_layers"]):
            x = self.block(l, x, seg, pos)
        if c["final_norm"]:
            x = self.layer_norm(x, "final_norm")
        out = {"hidden": x, "logits": None, "pooled": None, "valid": seg >= 0}
        packed = batch.get("segments") is not None
        if hd["kind"] in ("pool", "classifier") and not packed:  # heads read each row's sequence 0
            roles = batch.get("roles")
            pooled = []
            for b in range(B):
                r = [t for t in range(T) if int(seg[b, t]) == 0]
                first = r[0] if r else 0
                rl = roles[b][first:first + len(r)] if roles is not None else None
                pooled.append(self.pool(x[b, first:first + len(r)], rl))
            pooled = torch.stack(pooled)
            if hd["pooler"]:
                pooled = torch.tanh(self.linear(pooled, "head.pooler.w", "head.pooler.b"))
            if hd["normalize"]:
                norm = pooled.norm(dim=-1, keepdim=True)
                pooled = torch.where(norm > 0, pooled / norm.clamp_min(1e-300), torch.zeros_like(pooled))
            out["pooled"] = pooled
            if hd["kind"] == "classifier":
                y = self.layer_norm(pooled, "head.norm") if hd["norm"] else pooled
                out["logits"] = self.linear(y, "head.w", "head.b")
        if hd["kind"] == "lm":
            y = x
            if hd["transform"]:  # BERT MLM / ESM-2: dense + activation + layer norm
                y = activation(c["activation"], self.linear(y, "head.transform.w", "head.transform.b"))
                y = self.layer_norm(y, "head.transform")
            w = self.params["stem.embed"].t() if hd["tied"] else self.params["head.lm"]
            logits = y @ w
            if "head.lm_bias" in self.params:  # tied with lm_bias, or untied with model.bias
                logits = logits + self.params["head.lm_bias"]
            out["logits"] = logits
        return out
