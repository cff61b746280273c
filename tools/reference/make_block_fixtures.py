#!/usr/bin/env python3
"""Reference fixtures for Tessera's transformer block, made with PyTorch's own layers.

Builds torch.nn.TransformerEncoderLayer (post-LN as in 2017, and pre-LN with norm_first=True;
ReLU and exact GELU) with seeded random weights, runs a padded batch through it (with and
without a causal mask), and writes, per case, two safetensors files:
  - NAME.safetensors: the layer's weights under Tessera's parameter names (weights as (in, out));
  - NAME.io.safetensors: the input rows `input` (B, T, C), the valid lengths `lengths` (B,) i64,
    the reference output `output` (B, T, C) and per-head attention weights `attn` (B, H, T, T).
Developer tool only: the product, its build and its tests never run Python.

    python3 tools/reference/make_block_fixtures.py tests/data/reference
"""
import json
import pathlib
import sys

import torch
from safetensors.torch import save_file

C, H, FF, B, T = 16, 4, 32, 3, 7
LENGTHS = [7, 4, 1]
EPS = 1e-5


def tessera_names(layer: torch.nn.TransformerEncoderLayer) -> dict:
    w = layer.self_attn.in_proj_weight.detach()  # (3C, C), rows = outputs
    b = layer.self_attn.in_proj_bias.detach()
    return {
        "blocks.0.attn.w_q": w[:C].T.contiguous(), "blocks.0.attn.b_q": b[:C].clone(),
        "blocks.0.attn.w_k": w[C:2 * C].T.contiguous(), "blocks.0.attn.b_k": b[C:2 * C].clone(),
        "blocks.0.attn.w_v": w[2 * C:].T.contiguous(), "blocks.0.attn.b_v": b[2 * C:].clone(),
        "blocks.0.attn.w_o": layer.self_attn.out_proj.weight.detach().T.contiguous(),
        "blocks.0.attn.b_o": layer.self_attn.out_proj.bias.detach().clone(),
        "blocks.0.ln1.gamma": layer.norm1.weight.detach().clone(),
        "blocks.0.ln1.beta": layer.norm1.bias.detach().clone(),
        "blocks.0.ffn.w1": layer.linear1.weight.detach().T.contiguous(),
        "blocks.0.ffn.b1": layer.linear1.bias.detach().clone(),
        "blocks.0.ffn.w2": layer.linear2.weight.detach().T.contiguous(),
        "blocks.0.ffn.b2": layer.linear2.bias.detach().clone(),
        "blocks.0.ln2.gamma": layer.norm2.weight.detach().clone(),
        "blocks.0.ln2.beta": layer.norm2.bias.detach().clone(),
    }


def make_case(out_dir: pathlib.Path, name: str, norm_first: bool, activation: str, causal: bool, seed: int):
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(C, H, dim_feedforward=FF, dropout=0.0, activation=activation,
                                             layer_norm_eps=EPS, batch_first=True, norm_first=norm_first)
    with torch.no_grad():  # non-trivial norms and biases, so that mapping mistakes show
        for ln in (layer.norm1, layer.norm2):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
        layer.self_attn.in_proj_bias.uniform_(-0.5, 0.5)
        layer.self_attn.out_proj.bias.uniform_(-0.5, 0.5)
    layer.eval()
    x = torch.randn(B, T, C)
    pad = torch.arange(T)[None, :] >= torch.tensor(LENGTHS)[:, None]  # True = padding
    mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1) if causal else None
    with torch.no_grad():
        # the fast path of TransformerEncoderLayer drops padded rows; run the plain path instead
        y = layer._sa_block(layer.norm1(x) if norm_first else x, mask, pad)
        if norm_first:
            h = x + y
            out = h + layer._ff_block(layer.norm2(h))
        else:
            h = layer.norm1(x + y)
            out = layer.norm2(h + layer._ff_block(h))
        src = layer.norm1(x) if norm_first else x
        _, attn = layer.self_attn(src, src, src, attn_mask=mask, key_padding_mask=pad,
                                  need_weights=True, average_attn_weights=False)
    save_file(tessera_names(layer), str(out_dir / f"{name}.safetensors"))
    io = {"input": x.contiguous(), "lengths": torch.tensor(LENGTHS, dtype=torch.int64),
          "output": out.contiguous(), "attn": attn.contiguous()}
    save_file(io, str(out_dir / f"{name}.io.safetensors"),
              metadata={"norm": "pre" if norm_first else "post", "activation": activation,
                        "causal": str(causal).lower(), "d_model": str(C), "n_heads": str(H),
                        "d_ff": str(FF), "norm_eps": str(EPS)})
    return {"file": f"{name}.safetensors", "norm": "pre" if norm_first else "post",
            "activation": activation, "causal": causal}


def main():
    out_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/reference")
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = [make_case(out_dir, "block_post_relu", False, "relu", False, 1),
             make_case(out_dir, "block_pre_gelu", True, "gelu", False, 2),
             make_case(out_dir, "block_post_gelu_causal", False, "gelu", True, 3),
             make_case(out_dir, "block_pre_relu_causal", True, "relu", True, 4)]
    (out_dir / "blocks.json").write_text(json.dumps(
        {"torch": torch.__version__, "d_model": C, "n_heads": H, "d_ff": FF, "batch": B, "seq_len": T,
         "lengths": LENGTHS, "norm_eps": EPS, "cases": cases}, indent=2) + "\n")


if __name__ == "__main__":
    main()
