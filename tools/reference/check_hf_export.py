#!/usr/bin/env python3
"""What transformers computes with the folders `tessera export --hf` writes.

Runs test_hf_export (HfExport.TransformersGivesTheSameOutputsAsTessera) with TESSERA_HF_EXPORT_DIR
set, so that it exports the five YAML models of tests/data/hf_export/ (their seeded init moved by
seeded noise) to a scratch folder; loads each folder with the class its config.json names, on the
inputs of tests/data/hf/<family>/reference.safetensors (transformers' own fixtures), and writes

  tests/data/hf_export/reference.safetensors  <family>.inputs.<i>, <family>.hidden.<i> (the base
                                              model's last_hidden_state), <family>.logits.<i>
  tests/data/hf_export/reference.json         versions, and per family the class, the noise seed,
                                              the FNV-1a 64 hash of the model.safetensors loaded,
                                              the number of items and the files of the folder

which the same test then holds Tessera's outputs against (1e-4 relative to the output's scale).

    .venv-ref/bin/python tools/reference/check_hf_export.py [build/dev/tests/test_hf_export]

Needs torch, transformers and safetensors (tools/reference/requirements.txt). Downloads nothing.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
OUT = DATA / "hf_export"
FAMILIES = ["bert", "gpt2", "vit", "esm", "ast"]
# The noise seeds of test_hf_export.cpp's kParityModels, recorded with the outputs.
SEEDS = {"bert": 2101, "gpt2": 2102, "vit": 2103, "esm": 2104, "ast": 2105}


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def inputs_of(family):
    """transformers' own fixture inputs (tools/reference/make_hf_fixtures.py), in item order."""
    meta = json.loads((DATA / "hf" / family / "reference.json").read_text())
    tensors = load_file(str(DATA / "hf" / family / "reference.safetensors"))
    return [tensors[f"inputs.{i}"] for i, item in enumerate(meta["items"])
            if not item.get("interpolate_pos_encoding", False)]


def run(model, family, x):
    """(last_hidden_state, logits) of one item, batch dimension dropped."""
    base = getattr(model, model.base_model_prefix)
    if family in ("bert", "gpt2", "esm"):
        kw = {"input_ids": x.long()[None]}
    elif family == "vit":
        kw = {"pixel_values": x.float()[None]}
    else:
        kw = {"input_values": x.float()[None]}
    with torch.no_grad():
        hidden = base(**kw).last_hidden_state[0]
        logits = model(**kw).logits[0]
    return hidden.contiguous(), logits.contiguous()


def main():
    test = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "build" / "dev" / "tests" / "test_hf_export")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    out_tensors, meta = {}, {
        "made_by": "tools/reference/check_hf_export.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "families": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        # Without reference.json the test only writes the folders; with it, it also checks them.
        stash = None
        if (OUT / "reference.json").exists():
            stash = (OUT / "reference.json").read_bytes()
            (OUT / "reference.json").unlink()
        try:
            env = dict(os.environ, TESSERA_HF_EXPORT_DIR=tmp)
            subprocess.run([str(test), "--gtest_filter=HfExport.TransformersGivesTheSameOutputsAsTessera"],
                           env=env, check=True, stdout=subprocess.DEVNULL)
        finally:
            if stash is not None and not (OUT / "reference.json").exists():
                (OUT / "reference.json").write_bytes(stash)
        for family in FAMILIES:
            folder = pathlib.Path(tmp) / family
            config = json.loads((folder / "config.json").read_text())
            cls = getattr(transformers, config["architectures"][0])
            model, info = cls.from_pretrained(str(folder), torch_dtype=torch.float32, output_loading_info=True)
            model.eval()
            # Every parameter from the file: none missing, none left over. Aside: buffers transformers
            # makes itself, and what ESM-2 builds but its forward never reads (the contact head, and
            # an absolute position table beside its rotary positions), which Tessera does not have.
            unused = ("position_ids", "inv_freq", "contact_head.regression.weight", "contact_head.regression.bias",
                      "esm.embeddings.position_embeddings.weight")
            missing = [k for k in info["missing_keys"] if not k.endswith(unused)]
            assert not missing and not info["unexpected_keys"] and not info["mismatched_keys"], info
            if family in ("bert", "gpt2", "esm") and config.get("tie_word_embeddings", True):
                emb = model.get_input_embeddings().weight
                assert model.get_output_embeddings().weight.data_ptr() == emb.data_ptr(), "decoder not tied"
            items = inputs_of(family)[:2]  # two items a family keep the fixture small
            for i, x in enumerate(items):
                hidden, logits = run(model, family, x)
                out_tensors[f"{family}.inputs.{i}"] = x.contiguous()
                out_tensors[f"{family}.hidden.{i}"] = hidden
                out_tensors[f"{family}.logits.{i}"] = logits
            # The tokenizer or processor files load as transformers' own classes.
            if family in ("bert", "gpt2", "esm"):
                proc = transformers.AutoTokenizer.from_pretrained(str(folder))
                sample = proc("MKTAYIAKQR" if family == "esm" else "the cat sat on the mat")["input_ids"]
            elif family == "vit":
                proc = transformers.AutoImageProcessor.from_pretrained(str(folder))
                sample = None
            else:
                proc = transformers.AutoFeatureExtractor.from_pretrained(str(folder))
                sample = None
            meta["families"][family] = {
                "processor": type(proc).__name__,
                "sample_ids": sample,
                "hf_class": config["architectures"][0],
                "noise_seed": SEEDS[family],
                "model_safetensors_fnv1a64": fnv1a64((folder / "model.safetensors").read_bytes()),
                "items": len(items),
                "not_in_the_folder": sorted(info["missing_keys"]),
                "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
            }
            print(f"{family}: {config['architectures'][0]}, {len(items)} items")
    save_file(out_tensors, str(OUT / "reference.safetensors"))
    (OUT / "reference.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
