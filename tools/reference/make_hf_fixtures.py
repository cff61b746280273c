#!/usr/bin/env python3
"""Hugging Face parity fixtures: tiny models with random weights, and what HF computes with them.

For each family (bert, gpt2, vit, esm, ast), and for the other classes and settings the C++ import
maps (gpt2_untied, bert_cls, bert_mlm, bert_mlm_untied, vit_pooler, esm_untied), this builds a small transformers model from a config
(no download), randomises every weight, bias and LayerNorm with a fixed seed, saves it as a
Hugging Face model folder (config, weights, tokenizer or preprocessor files, as HF writes them),
reloads that folder in float32 and records, per real input item, the model input, the
embeddings, every block's output, the final hidden state, pooled outputs and logits. Writes
tests/data/hf/<family>/{model/, reference.safetensors, reference.json, README.md}.
Developer tool only: the product, its build and its tests never run Python.

    .venv-ref/bin/python tools/reference/make_hf_fixtures.py [family ...]

Needs transformers 4.40.2, torch 1.13, tokenizers 0.19.1, safetensors, numpy, Pillow (no
torchaudio: ASTFeatureExtractor then uses its NumPy path). Deterministic: rerunning rewrites the
same bytes on one machine (another CPU's torch kernels may move reference tensors by ~1e-5, so
regenerate only the folders you change).
"""
import hashlib
import json
import math
import os
import pathlib
import platform
import re
import shutil
import sys
import tempfile
import wave

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import PIL
import safetensors
import tokenizers
import torch
import transformers
from PIL import Image, ImageOps
from safetensors.torch import save_file
from torch import nn
from transformers.pytorch_utils import Conv1D

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "hf"
TEXT = ROOT / "tests" / "data" / "text"
CORPUS = TEXT / "corpus.txt"
COMMAND = ".venv-ref/bin/python tools/reference/make_hf_fixtures.py"

SEEDS = {"bert": 20240701, "gpt2": 20240702, "vit": 20240703, "esm": 20240704, "ast": 20240705}

# Random weights, scaled so that every part of the network matters at a 1e-4 tolerance while
# values stay near 1: matrices N(0, 1/fan_in), embedding tables and learned tokens N(0, 0.5^2),
# every bias N(0, 0.02^2), every LayerNorm weight 1 + N(0, 0.1^2) and bias N(0, 0.02^2).
EMBED_STD = 0.5
BIAS_STD = 0.02
LN_WEIGHT_STD = 0.1
LN_BIAS_STD = 0.02
INIT_NOTE = ("after HF's own init, every parameter is redrawn from torch.Generator(seed): Linear/Conv1D/"
             "Conv2d weights N(0, 1/fan_in), embedding tables and learned tokens/position tables "
             "N(0, 0.5^2) (padding_idx rows kept 0), every bias N(0, 0.02^2), LayerNorm weight "
             "1+N(0, 0.1^2) and bias N(0, 0.02^2)")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def versions():
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
    }


# ---------------------------------------------------------------------------------------------
# weights


def randomise(model: nn.Module, seed: int) -> None:
    """Redraws every parameter (see INIT_NOTE); tied parameters are drawn once."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=g) * std

    seen = set()
    with torch.no_grad():
        for _, module in model.named_modules():
            for pname, p in module.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                if isinstance(module, nn.LayerNorm):
                    v = 1 + normal(p.shape, LN_WEIGHT_STD) if pname == "weight" else normal(p.shape, LN_BIAS_STD)
                elif pname.endswith("bias"):
                    v = normal(p.shape, BIAS_STD)
                elif isinstance(module, nn.Linear):
                    v = normal(p.shape, p.shape[1] ** -0.5)
                elif isinstance(module, Conv1D):  # GPT-2's (in, out) linear
                    v = normal(p.shape, p.shape[0] ** -0.5)
                elif isinstance(module, nn.Conv2d):
                    v = normal(p.shape, p[0].numel() ** -0.5)
                elif isinstance(module, nn.Embedding):
                    v = normal(p.shape, EMBED_STD)
                    if module.padding_idx is not None:
                        v[module.padding_idx] = 0
                else:  # CLS / distillation tokens, learned position tables
                    v = normal(p.shape, EMBED_STD)
                p.copy_(v)


def round_params(model: nn.Module, dtype: torch.dtype) -> None:
    """Rounds every floating parameter to dtype and back, so the f32 model equals the saved one."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))


def safetensors_header(path: pathlib.Path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def weight_files(model_dir: pathlib.Path) -> dict:
    """{file: {"dtypes": {dtype: count}, "tensors": n}} for the weight files of a model folder."""
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        h = safetensors_header(f)
        dtypes = {}
        for k, v in h.items():
            if k != "__metadata__":
                dtypes[v["dtype"]] = dtypes.get(v["dtype"], 0) + 1
        out[f.name] = {"bytes": f.stat().st_size, "tensors": sum(dtypes.values()), "dtypes": dtypes}
    return out


# ---------------------------------------------------------------------------------------------
# capture


def capture(embeddings_module: nn.Module, blocks, call):
    """Runs call() with forward hooks on the embeddings module and on each block.

    Returns (call's result, embeddings output (1, T', C), [block l output (1, T', C)]).
    """
    caught = {}
    hooks = [embeddings_module.register_forward_hook(lambda m, i, o: caught.__setitem__("emb", o))]
    for l, block in enumerate(blocks):
        hooks.append(block.register_forward_hook(
            lambda m, i, o, l=l: caught.__setitem__(l, o[0] if isinstance(o, tuple) else o)))
    try:
        result = call()
    finally:
        for h in hooks:
            h.remove()
    return result, caught["emb"], [caught[l] for l in range(len(blocks))]


def f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32).contiguous().clone()


def i32(t) -> torch.Tensor:
    return torch.as_tensor(t).to(torch.int32).contiguous().clone()


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.to(torch.float64) - b.to(torch.float64)).abs().max())


def check_hidden_states(hidden_states, emb, layers, last_is_final_norm):
    """HF's output_hidden_states must agree with the hooks (a cross-check of the capture)."""
    assert max_abs(hidden_states[0], emb) == 0
    n = len(layers) - 1 if last_is_final_norm else len(layers)
    for l in range(n):
        assert max_abs(hidden_states[l + 1], layers[l]) == 0, l


# ---------------------------------------------------------------------------------------------
# output


def write_family(family: str, tensors: dict, info: dict, readme_parts: tuple) -> None:
    """Writes reference.safetensors, reference.json and README.md (common_readme(*readme_parts))."""
    d = OUT / family
    names = list(tensors)
    # One metadata key: safetensors writes a metadata map in no fixed order, and the bytes must not vary.
    meta = {"made_by": f"tools/reference/make_hf_fixtures.py {family}"}
    save_file(tensors, str(d / "reference.safetensors"), metadata=meta)
    info["tensors"] = {k: {"dtype": str(tensors[k].dtype).replace("torch.", ""), "shape": list(tensors[k].shape)}
                       for k in names}
    info["tensor_names"] = sorted({re.sub(r"\.\d+", ".<n>", k) for k in names}, key=lambda s: (s.count("."), s))
    info["files"] = {}
    for f in sorted(d.rglob("*")):
        if f.is_file() and f.name not in ("reference.json",):
            info["files"][str(f.relative_to(d))] = {"bytes": f.stat().st_size,
                                                    "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    (d / "reference.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (d / "README.md").write_text(common_readme(family, *readme_parts[:1], info, *readme_parts[1:]), encoding="utf-8")
    log(f"{family}: {len(names)} tensors, {sum(f.stat().st_size for f in d.rglob('*') if f.is_file())} bytes")


def fresh_dir(family: str) -> pathlib.Path:
    d = OUT / family
    if d.exists():
        shutil.rmtree(d)
    (d / "model").mkdir(parents=True)
    return d


def items_table(items, key):
    rows = ["| item | source | T' | note |", "|---|---|---|---|"]
    for i, it in enumerate(items):
        src = it[key].replace("|", "\\|")
        rows.append(f"| {i} | `{src}` | {it['rows']} | {it.get('note', '')} |")
    return "\n".join(rows)


def common_readme(family, hf_class, info, body, items_md, licences):
    names = ", ".join(f"`{n}`" for n in info["tensor_names"])
    return f"""# tests/data/hf/{family} — a tiny {hf_class} with random weights, and what HF computes with it

Made by

    {COMMAND}

(run from the repository root; it rewrites this whole folder, deterministically: seed
{info['seed']}) with Python {info['versions']['python']}, torch {info['versions']['torch']} (Debian), transformers
{info['versions']['transformers']}, tokenizers {info['versions']['tokenizers']}, safetensors {info['versions']['safetensors']}, NumPy {info['versions']['numpy']}; nothing is
downloaded. For the C++ parity tests, which load `model/` and compare layer by layer at 1e-4;
nothing here is read by the product or its build.

## Files

- `model/` — the Hugging Face model folder, written by `save_pretrained` of the model and of its
  {"tokenizer" if family.split("_")[0] in ("bert", "gpt2", "esm") else "preprocessor"} (exactly what HF writes).
- `reference.safetensors` — the reference, computed by HF from `model/` reloaded in float32, each
  item run alone (batch 1, no padding, `eval()`, `no_grad()`). float32; ids int32. Tensors:
  {names} (`<n>` = item, or layer then item: `layer.<l>.<i>`). Shapes are in `reference.json`.
- `reference.json` — versions, seed, HF class, config, items with their sources, every tensor's
  shape, file sizes and sha256.

{body}

## Items

{items_md}

## Weights

{INIT_NOTE}.

## Licences

{licences}

The model files (random weights), the reference tensors and the script are made by the Tessera
project, Apache-2.0.
"""


# ---------------------------------------------------------------------------------------------
# text inputs


def corpus_lines():
    """The corpus's lines, split at "\\n" only (one line holds a bare "\\r", which text mode would split)."""
    return CORPUS.read_bytes().decode("utf-8").split("\n")[:-1]


def kjv_text(lines, number):
    """The verse text of corpus line `number` (1-based), without its indentation and verse number."""
    m = re.match(r"^\s*\d+\s+(.*)$", lines[number - 1])
    assert m, lines[number - 1]
    return m.group(1)


# BERT items: corpus line number (1-based) and how the string is taken from it.
BERT_ITEMS = [(120, "verse"), (39, "verse"), (6, "verse"), (10045, "line"), (84, "verse"), (10, "verse")]
BERT_VOCAB_LINES = 300  # further corpus lines whose tokens the mini vocabulary keeps

# GPT-2 prompts: corpus line number and the number of words of its verse text kept.
GPT2_ITEMS = [(2, 3), (120, 4), (1500, 7), (6, 7)]


# ---------------------------------------------------------------------------------------------
# bert


def bert_mini_tokenizer(model_dir: pathlib.Path, texts):
    """A lower-case WordPiece tokenizer over a subset of BERT uncased, saved into model_dir.

    Mini vocabulary: the specials plus every token the real uncased vocabulary gives on `texts`,
    kept in the real file's order. Greedy longest-match WordPiece then segments those texts exactly
    as with the full vocabulary (checked). Returns (tokenizer reloaded from model_dir, the mini
    vocabulary, the number of texts checked).
    """
    from transformers import BertTokenizerFast

    real = BertTokenizerFast(vocab_file=str(TEXT / "vocab.txt"), do_lower_case=True)
    keep = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    for t in texts:
        keep.update(real.tokenize(t))
    full_vocab = (TEXT / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    mini = [t for t in full_vocab if t in keep]
    assert len(mini) == len(keep)
    with tempfile.TemporaryDirectory() as tmp:
        vfile = pathlib.Path(tmp) / "vocab.txt"
        vfile.write_text("".join(t + "\n" for t in mini), encoding="utf-8")
        tok = BertTokenizerFast(vocab_file=str(vfile), do_lower_case=True, model_max_length=64)
        tok.save_pretrained(str(model_dir))
    tok = BertTokenizerFast.from_pretrained(str(model_dir))
    same = 0
    for t in texts:
        assert tok.tokenize(t) == real.tokenize(t), t
        same += 1
    return tok, mini, same


def make_bert():
    from transformers import BertConfig, BertModel

    family, seed = "bert", SEEDS["bert"]
    d = fresh_dir(family)
    lines = corpus_lines()
    texts = [kjv_text(lines, n) if how == "verse" else lines[n - 1] for n, how in BERT_ITEMS]

    step = len(lines) // BERT_VOCAB_LINES
    vocab_lines = [lines[i] for i in range(0, step * BERT_VOCAB_LINES, step)]
    tok, mini, same = bert_mini_tokenizer(d / "model", texts + vocab_lines)

    config = BertConfig(vocab_size=len(mini), hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=64, hidden_act="gelu", max_position_embeddings=64, type_vocab_size=2,
                        layer_norm_eps=1e-12, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = BertModel(config, add_pooling_layer=True)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(str(d / "model"))
    write_sentence_transformers_files(d / "model", config.hidden_size, config.max_position_embeddings)
    ref = BertModel.from_pretrained(str(d / "model"), torch_dtype=torch.float32).eval()

    tensors, items = {}, []
    with torch.no_grad():
        for i, text in enumerate(texts):
            enc = tok(text, return_tensors="pt")
            ids = enc["input_ids"]
            out, emb, layers = capture(ref.embeddings, ref.encoder.layer, lambda: ref(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True))
            check_hidden_states(out.hidden_states, emb, layers, last_is_final_norm=False)
            assert max_abs(layers[-1], out.last_hidden_state) == 0
            final = out.last_hidden_state[0]
            sentence = final.mean(0)
            sentence = sentence / sentence.norm()
            tensors[f"inputs.{i}"] = i32(ids[0])
            tensors[f"embeddings.{i}"] = f32(emb[0])
            for l, h in enumerate(layers):
                tensors[f"layer.{l}.{i}"] = f32(h[0])
            tensors[f"final.{i}"] = f32(final)
            tensors[f"pooled.{i}"] = f32(out.pooler_output[0])
            tensors[f"sentence.{i}"] = f32(sentence)
            n, how = BERT_ITEMS[i]
            it = {"text": text, "source": f"tests/data/text/corpus.txt line {n}" +
                  (" (verse text: indentation and verse number removed)" if how == "verse" else " (whole line)"),
                  "tokens": tok.convert_ids_to_tokens(ids[0].tolist()), "rows": int(ids.shape[1])}
            if i == 3:
                it["note"] = "accents: uncased BERT strips them (NFD, drops marks): 'Ångström' -> ang ##strom"
            if i == 2:
                it["note"] = "punctuation: , ? split off"
            items.append(it)
        # The in-memory model and the reloaded folder must agree bit for bit.
        ids = tok(texts[-1], return_tensors="pt")["input_ids"]
        assert max_abs(model(ids).last_hidden_state, ref(ids).last_hidden_state) == 0

    info = {
        "family": family, "versions": versions(), "seed": seed, "hf_class": "BertModel (add_pooling_layer=True)",
        "tokenizer_class": "BertTokenizerFast (do_lower_case=True)",
        "config": {"vocab_size": config.vocab_size, "hidden_size": 32, "num_hidden_layers": 3,
                   "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
                   "max_position_embeddings": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
                   "pad_token_id": config.pad_token_id},
        "n_layers": 3, "weights": weight_files(d / "model"), "weights_dtype": "float32",
        "init": INIT_NOTE,
        "mini_vocab": {"size": len(mini), "from": "tests/data/text/vocab.txt (BERT uncased, 30,522 tokens)",
                       "kept": f"[PAD] [UNK] [CLS] [SEP] [MASK] and every token of the items and of corpus "
                               f"lines 1, {1 + step}, ..., {1 + step * (BERT_VOCAB_LINES - 1)} (every {step} lines)",
                       "checked": f"the saved tokenizer tokenizes all {same} of those texts exactly as the "
                                  "full vocabulary does"},
        "inputs": "input_ids of tokenizer(text) with [CLS]/[SEP]; token_type_ids all 0 (HF's default); "
                  "attention_mask all 1",
        "sentence": "sentence.<i> = L2-normalised mean of final.<i> over all rows (what sentence-transformers "
                    "returns with model/modules.json: mean pooling, then Normalize)",
        "pooled": "pooled.<i> = tanh(dense(final.<i>[0])) (BertPooler)",
        "items": items,
    }
    body = f"""## The model

`BertModel` with its pooler: hidden 32, 3 layers, 4 heads, intermediate 64, GELU (erf), 64
positions, 2 token types, LayerNorm eps 1e-12, vocabulary {len(mini)} (a subset of BERT uncased's
vocab.txt, see below), weights float32 in `model/model.safetensors`. `model/` also holds the
tokenizer (`BertTokenizerFast`, lower case) and sentence-transformers files with the same
structure as all-MiniLM-L6-v2's: `modules.json` (Transformer, `1_Pooling`, `2_Normalize`),
`1_Pooling/config.json` (mean pooling), `sentence_bert_config.json`.

The mini vocabulary keeps `[PAD] [UNK] [CLS] [SEP] [MASK]` and every token that the full uncased
vocabulary (`tests/data/text/vocab.txt`) gives on the items and on {BERT_VOCAB_LINES} corpus lines spread
evenly, in the full file's order. Since it is a subset, greedy longest-match WordPiece segments
those texts exactly as the full vocabulary does (the script checks all of them); ids differ.

Tensors: `embeddings` is the output of `BertEmbeddings` (word + position + token type 0, then its
LayerNorm); `layer.<l>` each `BertLayer`'s output (post-LN blocks); `final` = the last layer's
output (BERT has no final norm); `pooled` = tanh(dense(CLS row)); `sentence` = the mean of
`final` over all rows, L2-normalised. No logits."""
    licences = ("- `model/vocab.txt` and `tokenizer.json` list a subset of Google's BERT uncased vocabulary, "
                "Apache-2.0 (`LICENSE.Apache-2.0`, copied from `tests/data/text/`).\n"
                "- Item texts: King James Bible verses (public domain; see `tests/data/text/README.md` for the "
                "Bible Retrieval System legend) and one line written for the Tessera corpus (line 10045).")
    shutil.copy(TEXT / "LICENSE.Apache-2.0", d / "LICENSE.Apache-2.0")
    readme = ("BertModel", body, items_table(items, "text"), licences)
    write_family(family, tensors, info, readme)


def write_sentence_transformers_files(model_dir: pathlib.Path, dim: int, max_seq_length: int) -> None:
    """The sentence-transformers module files, with all-MiniLM-L6-v2's structure and key order."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (model_dir / "modules.json").write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    (model_dir / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": dim, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False}
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n", encoding="utf-8")
    st = {"max_seq_length": max_seq_length, "do_lower_case": False}
    (model_dir / "sentence_bert_config.json").write_text(json.dumps(st, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# gpt2


def gpt2_tokenizer(model_dir: pathlib.Path, lines):
    """A 400-token byte-level BPE trained on the corpus, saved into model_dir as GPT2TokenizerFast.

    Rebuilt from its vocab.json + merges.txt it must tokenize every corpus line as the trained
    tokenizer does. Returns (tokenizer reloaded from model_dir, the number of lines checked).
    """
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train(files=[str(CORPUS)], vocab_size=400, min_frequency=2, special_tokens=["<|endoftext|>"],
              show_progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        bpe.save_model(tmp)
        tok = GPT2TokenizerFast(vocab_file=os.path.join(tmp, "vocab.json"), merges_file=os.path.join(tmp, "merges.txt"),
                                unk_token="<|endoftext|>", bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                model_max_length=64)
        tok.save_pretrained(str(model_dir))
    tok = GPT2TokenizerFast.from_pretrained(str(model_dir))
    n_corpus = 0
    for line in lines:
        assert tok(line)["input_ids"] == bpe.encode(line).ids, line
        n_corpus += 1
    return tok, n_corpus


def make_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    family, seed = "gpt2", SEEDS["gpt2"]
    d = fresh_dir(family)
    lines = corpus_lines()
    texts = [" ".join(kjv_text(lines, n).split(" ")[:words]) for n, words in GPT2_ITEMS]

    tok, n_corpus = gpt2_tokenizer(d / "model", lines)
    eos = tok.eos_token_id

    config = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=3, n_head=4, n_positions=64,
                        activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
                        bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(str(d / "model"), max_shard_size="100KB")
    shards = sorted(p.name for p in (d / "model").glob("model-*.safetensors"))
    assert 2 <= len(shards) <= 3 and (d / "model" / "model.safetensors.index.json").exists(), shards
    ref = GPT2LMHeadModel.from_pretrained(str(d / "model"), torch_dtype=torch.float32).eval()
    assert ref.lm_head.weight.data_ptr() == ref.transformer.wte.weight.data_ptr()

    tensors, items, gen_checks = {}, [], []
    with torch.no_grad():
        for i, text in enumerate(texts):
            ids = tok(text, return_tensors="pt")["input_ids"]
            T = ids.shape[1]
            assert 3 <= T <= 20, (text, T)
            out, emb, layers = capture(ref.transformer.drop, ref.transformer.h, lambda: ref(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True))
            check_hidden_states(out.hidden_states, emb, layers, last_is_final_norm=True)
            final = out.hidden_states[-1]
            assert max_abs(ref.transformer.ln_f(layers[-1]), final) == 0
            pos = torch.arange(T)
            assert max_abs(ref.transformer.wte(ids) + ref.transformer.wpe(pos)[None], emb) == 0
            g = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                             pad_token_id=eos, output_scores=True, return_dict_in_generate=True)
            new = g.sequences[0, T:]
            assert new.shape[0] == 12, f"prompt {i} stopped after {new.shape[0]} tokens (eos)"
            scores = torch.stack(g.scores)[:, 0, :]
            # The scores are the plain logits of each step (greedy, no logits processor active):
            # the full forward of the whole sequence gives the same rows.
            full = ref(g.sequences).logits[0, T - 1:T + 11]
            assert torch.equal(scores.argmax(-1), new)
            gen_checks.append(max_abs(full, scores))
            tensors[f"inputs.{i}"] = i32(ids[0])
            tensors[f"embeddings.{i}"] = f32(emb[0])
            for l, h in enumerate(layers):
                tensors[f"layer.{l}.{i}"] = f32(h[0])
            tensors[f"final.{i}"] = f32(final[0])
            tensors[f"logits.{i}"] = f32(out.logits[0])
            tensors[f"generate.{i}"] = i32(new)
            tensors[f"generate_logits.{i}"] = f32(scores)
            n, words = GPT2_ITEMS[i]
            items.append({"text": text, "source": f"tests/data/text/corpus.txt line {n}: the first {words} words "
                                                  "of its verse text (indentation and verse number removed)",
                          "tokens": tok.convert_ids_to_tokens(ids[0].tolist()), "rows": T,
                          "generated_text": tok.decode(new)})
        ids = tok(texts[-1], return_tensors="pt")["input_ids"]
        assert max_abs(model(ids).logits, ref(ids).logits) == 0

    index = json.loads((d / "model" / "model.safetensors.index.json").read_text())
    info = {
        "family": family, "versions": versions(), "seed": seed, "hf_class": "GPT2LMHeadModel",
        "tokenizer_class": "GPT2TokenizerFast (from the trained vocab.json + merges.txt)",
        "config": {"vocab_size": config.vocab_size, "n_embd": 32, "n_layer": 3, "n_head": 4, "n_inner": None,
                   "mlp_width": 4 * 32, "n_positions": 64, "activation_function": "gelu_new",
                   "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "bos_token_id": eos,
                   "eos_token_id": eos},
        "n_layers": 3, "weights": weight_files(d / "model"), "weights_dtype": "float32",
        "shards": {"files": shards, "max_shard_size": "100KB", "weight_map": index["weight_map"]},
        "init": INIT_NOTE,
        "bpe": {"trained_with": "tokenizers.ByteLevelBPETokenizer().train([tests/data/text/corpus.txt], "
                                "vocab_size=400, min_frequency=2, special_tokens=['<|endoftext|>'])",
                "vocab_size": len(tok),
                "merges": len((d / "model" / "merges.txt").read_text(encoding="utf-8").split("\n")[1:-1]),
                "checked": f"GPT2TokenizerFast from model/ gives the trained tokenizer's ids on all {n_corpus} corpus lines"},
        "inputs": "input_ids of tokenizer(text) (GPT-2 adds no special token); attention_mask all 1",
        "generate": "generate.<i>: model.generate(ids, do_sample=False, max_new_tokens=12, pad_token_id=eos, "
                    "output_scores=True, return_dict_in_generate=True): the 12 new ids (none is eos); "
                    "generate_logits.<i>: its scores, (12, V): with greedy search and no active logits "
                    "processor these are the raw LM logits of each step (KV cache)",
        "generate_vs_full_forward_max_abs": max(gen_checks),
        "items": items,
    }
    body = f"""## The model

`GPT2LMHeadModel`: n_embd 32, 3 layers, 4 heads, MLP 128 (n_inner unset = 4·n_embd), 64
positions, `gelu_new` (tanh approximation), LayerNorm eps 1e-5, LM head tied to `wte`
(`lm_head.weight` is not in the files), vocabulary {len(tok)}. float32, saved **sharded**
(`max_shard_size="100KB"`): `model.safetensors.index.json` plus {', '.join(f'`{s}`' for s in shards)}.

Tokenizer: a byte-level BPE trained on `tests/data/text/corpus.txt` with `tokenizers`
(`ByteLevelBPETokenizer`, vocab_size 400, min_frequency 2, special `<|endoftext|>` = id {eos} = bos =
eos), saved by `GPT2TokenizerFast.save_pretrained` (`vocab.json`, `merges.txt`, `tokenizer.json`,
...). The script checks that it gives the trained tokenizer's ids on every corpus line.

Tensors: `embeddings` = wte[ids] + wpe[0..T-1]; `layer.<l>` each `GPT2Block`'s output (pre-LN
blocks, causal attention); `final` = ln_f of the last block's output; `logits` (T, V) = final ·
wteᵀ; `generate.<i>` the 12 greedy new ids and `generate_logits.<i>` (12, V) the scores of each
step (the raw logits of the last row; they equal a full forward of the whole sequence within
{max(gen_checks):.1e})."""
    licences = ("- The BPE vocabulary and merges are statistics of `tests/data/text/corpus.txt` (King James "
                "Bible, WordNet 3.0 glosses, Unicode data files, iso-codes country names, lines written for "
                "Tessera): see `tests/data/text/README.md` for each source's licence.\n"
                "- Prompts: King James Bible (public domain).")
    readme = ("GPT2LMHeadModel", body, items_table(items, "text"), licences)
    write_family(family, tensors, info, readme)


# ---------------------------------------------------------------------------------------------
# vit

VIT_ITEMS = [("tests/data/image/chelsea.jpg", 32), ("tests/data/image/astronaut.png", 32),
             ("tests/data/image/chelsea.jpg", 48)]
VIT_LABELS = ["cat", "person", "food", "vehicle", "other"]
VIT_PROC_ARGS = dict(do_resize=True, resample=2, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
                     image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def load_rgb(path: pathlib.Path) -> Image.Image:
    return ImageOps.exif_transpose(Image.open(path)).convert("RGB")


def make_vit():
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    family, seed = "vit", SEEDS["vit"]
    d = fresh_dir(family)
    proc_args = VIT_PROC_ARGS
    ViTImageProcessor(size={"height": 32, "width": 32}, **proc_args).save_pretrained(str(d / "model"))

    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=3,
                       num_attention_heads=4, intermediate_size=64, hidden_act="gelu", layer_norm_eps=1e-12,
                       qkv_bias=True, num_labels=5, id2label=dict(enumerate(VIT_LABELS)),
                       label2id={n: i for i, n in enumerate(VIT_LABELS)})
    torch.manual_seed(seed)
    model = ViTForImageClassification(config)
    randomise(model, seed)
    round_params(model, torch.float16)
    model.eval()
    model.half().save_pretrained(str(d / "model"))
    model.float()
    ref = ViTForImageClassification.from_pretrained(str(d / "model"), torch_dtype=torch.float32).eval()
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1

    tensors, items = {}, []
    with torch.no_grad():
        for i, (rel, size) in enumerate(VIT_ITEMS):
            proc = ViTImageProcessor.from_pretrained(str(d / "model"))
            if size != 32:
                proc = ViTImageProcessor.from_pretrained(str(d / "model"), size={"height": size, "width": size})
            pv = proc(load_rgb(ROOT / rel), return_tensors="pt")["pixel_values"]
            interp = size != 32
            out, emb, layers = capture(ref.vit.embeddings, ref.vit.encoder.layer, lambda: ref(
                pixel_values=pv, output_hidden_states=True, interpolate_pos_encoding=interp))
            check_hidden_states(out.hidden_states, emb, layers, last_is_final_norm=False)
            final = ref.vit.layernorm(layers[-1])
            assert max_abs(ref.classifier(final[:, 0]), out.logits) == 0
            tensors[f"inputs.{i}"] = f32(pv[0])
            tensors[f"embeddings.{i}"] = f32(emb[0])
            for l, h in enumerate(layers):
                tensors[f"layer.{l}.{i}"] = f32(h[0])
            tensors[f"final.{i}"] = f32(final[0])
            tensors[f"logits.{i}"] = f32(out.logits[0])
            it = {"path": rel, "rows": int(emb.shape[1]), "pixel_values": list(pv.shape[1:]),
                  "processor": f"ViTImageProcessor from model/" + ("" if size == 32 else
                                                                  f" with size={{'height': {size}, 'width': {size}}}")}
            if interp:
                it["note"] = f"interpolate_pos_encoding at {size}x{size}: ViT(pixel_values, interpolate_pos_encoding=True)"
                it["interpolate_pos_encoding"] = True
            items.append(it)

    info = {
        "family": family, "versions": versions(), "seed": seed, "hf_class": "ViTForImageClassification",
        "processor_class": "ViTImageProcessor",
        "config": {"image_size": 32, "patch_size": 8, "num_channels": 3, "hidden_size": 32,
                   "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
                   "layer_norm_eps": 1e-12, "qkv_bias": True, "num_labels": 5, "id2label": VIT_LABELS},
        "processor": {"size": {"height": 32, "width": 32}, **{k: v for k, v in proc_args.items()}},
        "n_layers": 3, "weights": weight_files(d / "model"),
        "weights_dtype": "float16 (model.half().save_pretrained; config torch_dtype float16)",
        "reference_dtype": "float32, computed from the float16 weights (every parameter rounded to float16 "
                           "before the reference; the folder reloaded with torch_dtype=float32 equals it bit for bit)",
        "init": INIT_NOTE,
        "images": "PIL: ImageOps.exif_transpose(Image.open(path)).convert('RGB'), then the processor "
                  "(bilinear resize with PIL to the size, /255, (x-0.5)/0.5)",
        "interpolate_pos_encoding": "transformers 4.40 ViTEmbeddings.interpolate_pos_encoding: the 4x4 patch "
                                    "position table (CLS row apart) resized with torch bicubic "
                                    "(align_corners=False, A=-0.75) by scale_factor (h0+0.1)/4, (w0+0.1)/4 where "
                                    "h0 = H//patch: output 6x6 but the source coordinate is (dst+0.5)*4/6.1-0.5, "
                                    "not *4/6",
        "items": items,
    }
    body = """## The model

`ViTForImageClassification`: 32×32 images, 8×8 patches (16 + CLS = 17 rows), 3 channels, hidden
32, 3 layers, 4 heads, intermediate 64, GELU (erf), LayerNorm eps 1e-12, qkv bias, 5 labels
(`id2label` in `model/config.json`), no pooler. Saved in **float16** (`model.half()
.save_pretrained`: F16 tensors, `torch_dtype` float16 in config.json). The reference is float32
computed from exactly those weights (every parameter rounded to float16 first; the folder
reloaded with `torch_dtype=float32` equals the reference model bit for bit). Preprocessor:
`ViTImageProcessor` 32×32, bilinear (PIL), rescale 1/255, mean = std = 0.5.

Tensors: `inputs` = pixel_values (3, H, W); `embeddings` = [CLS; patch projections] + position
table (the output of `ViTEmbeddings`); `layer.<l>` each `ViTLayer` (pre-LN); `final` = the final
`layernorm` of the last layer's output; `logits` (5,) = classifier(final[0]). No `pooled`.

Item 2 is `chelsea.jpg` processed at 48×48 (`ViTImageProcessor(size=48×48)`, 36 patches + CLS
= 37 rows) and run with `interpolate_pos_encoding=True`. transformers 4.40 resizes the 4×4
patch position grid with `torch.nn.functional.interpolate(mode="bicubic", align_corners=False,
scale_factor=((h0+0.1)/4, (w0+0.1)/4))`, h0 = w0 = 48 // 8 = 6: the output is 6×6, but since
a scale factor is given, source coordinates are (dst + 0.5) · 4 / 6.1 − 0.5 (not 4/6); cubic
convolution with A = −0.75 and edge indices clamped. The CLS position row is kept as is."""
    licences = ("- Images are not copied: the items name `tests/data/image/chelsea.jpg` (skimage `chelsea`, "
                "Stefan van der Walt, CC0) and `tests/data/image/astronaut.png` (skimage `astronaut`, NASA, "
                "public domain); see `tests/data/image/README.md`. `inputs.<i>` are derived from them.")
    readme = ("ViTForImageClassification", body, items_table(items, "path"), licences)
    write_family(family, tensors, info, readme)


# ---------------------------------------------------------------------------------------------
# esm

# (record index in uniprot_sample.fasta, residues kept)
ESM_ITEMS = [(1, 40), (2, 44), (3, 50)]
ESM_MASKED = (0, [5, 17, 30])  # item 3 = item 0 with these residue positions (0-based) masked


def read_fasta(path):
    records = []
    for line in path.read_text(encoding="ascii").split("\n"):
        if line.startswith(">"):
            records.append([line[1:], ""])
        elif line.strip():
            records[-1][1] += line.strip()
    return records


def make_esm():
    from transformers import EsmConfig, EsmForMaskedLM, EsmTokenizer

    family, seed = "esm", SEEDS["esm"]
    d = fresh_dir(family)
    vocab = ROOT / "tests" / "data" / "protein" / "vocab.txt"
    EsmTokenizer(vocab_file=str(vocab), model_max_length=128).save_pretrained(str(d / "model"))
    tok = EsmTokenizer.from_pretrained(str(d / "model"))
    assert tok.mask_token_id == 32 and tok.pad_token_id == 1 and tok.cls_token_id == 0 and tok.eos_token_id == 2

    fasta = ROOT / "tests" / "data" / "protein" / "uniprot_sample.fasta"
    records = read_fasta(fasta)
    seqs, srcs = [], []
    for rec, n in ESM_ITEMS:
        header, seq = records[rec]
        assert set(seq[:n]) <= set("LAGVSERTIDPKQNFYMHWC"), header
        seqs.append(seq[:n])
        srcs.append({"record": rec, "header": header, "residues": n})
    base, where = ESM_MASKED
    masked = list(seqs[base])
    for p in where:
        masked[p] = "<mask>"
    seqs.append("".join(masked))
    srcs.append({**srcs[base], "masked_residues": where})

    config = EsmConfig(vocab_size=33, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                       intermediate_size=64, hidden_act="gelu", position_embedding_type="rotary", token_dropout=True,
                       emb_layer_norm_before=False, mask_token_id=32, pad_token_id=1, max_position_embeddings=128,
                       layer_norm_eps=1e-5)
    torch.manual_seed(seed)
    model = EsmForMaskedLM(config)
    randomise(model, seed)
    round_params(model, torch.bfloat16)
    model.eval()
    # Saved in bfloat16, except the rotary inv_freq buffers: .to(bfloat16) would round them too
    # (0.1 -> 0.10009765625) and a float32 load would then use the rounded frequencies. They stay
    # float32 in the file (a persistent buffer: from_pretrained loads it from the file), so the
    # file holds the exact frequencies that a reimplementation computes.
    exact = {name: b.clone() for name, b in model.named_buffers() if name.endswith("inv_freq")}
    assert len(exact) == 3 and all(b.dtype == torch.float32 for b in exact.values())
    model.to(torch.bfloat16)
    for layer in model.esm.encoder.layer:
        rot = layer.attention.self.rotary_embeddings
        rot.inv_freq = rot.inv_freq.to(torch.float32)  # a float32 buffer again, set to the exact values below
    for name, b in model.named_buffers():
        if name.endswith("inv_freq"):
            b.copy_(exact[name])
    model.save_pretrained(str(d / "model"))
    model.float()
    ref = EsmForMaskedLM.from_pretrained(str(d / "model"), torch_dtype=torch.float32).eval()
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    head = ref.esm.encoder.layer[0].attention.self.attention_head_size
    exact = 1.0 / (10000 ** (torch.arange(0, head, 2, dtype=torch.int64).float() / head))
    for layer in ref.esm.encoder.layer:
        assert torch.equal(layer.attention.self.rotary_embeddings.inv_freq, exact)

    tensors, items = {}, []
    with torch.no_grad():
        for i, seq in enumerate(seqs):
            ids = tok(seq, return_tensors="pt")["input_ids"]
            out, emb, layers = capture(ref.esm.embeddings, ref.esm.encoder.layer, lambda: ref(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True,
                output_attentions=True))
            check_hidden_states(out.hidden_states, emb, layers, last_is_final_norm=True)
            final = ref.esm.encoder.emb_layer_norm_after(layers[-1])
            assert max_abs(final, out.hidden_states[-1]) == 0
            # token dropout: masked rows zeroed, all rows scaled by (1 - 0.15*0.8) / (1 - masked/T)
            n_mask = int((ids == 32).sum())
            scale = (1 - 0.15 * 0.8) / (1 - n_mask / ids.shape[1])
            expect = ref.esm.embeddings.word_embeddings(ids).masked_fill((ids == 32)[..., None], 0.0) * scale
            assert max_abs(expect, emb) < 1e-6
            tensors[f"inputs.{i}"] = i32(ids[0])
            tensors[f"embeddings.{i}"] = f32(emb[0])
            for l, h in enumerate(layers):
                tensors[f"layer.{l}.{i}"] = f32(h[0])
            tensors[f"final.{i}"] = f32(final[0])
            tensors[f"logits.{i}"] = f32(out.logits[0])
            for l, a in enumerate(out.attentions):
                tensors[f"attn.{l}.{i}"] = f32(a[0])
            it = {"text": seq, "source": f"tests/data/protein/uniprot_sample.fasta record {srcs[i]['record']} (0-based) "
                                         f"({srcs[i]['header'].split()[0]}): its first {srcs[i]['residues']} residues",
                  "rows": int(ids.shape[1]), "masked": n_mask,
                  "embedding_scale": scale}
            if n_mask:
                it["note"] = (f"item {base} with residues {where} (0-based) replaced by <mask>: token dropout "
                              f"zeroes those rows and scales all by 0.88/(1-{n_mask}/{ids.shape[1]})")
            items.append(it)

    info = {
        "family": family, "versions": versions(), "seed": seed, "hf_class": "EsmForMaskedLM",
        "tokenizer_class": "EsmTokenizer (vocab.txt = tests/data/protein/vocab.txt, the 33-token ESM-2 alphabet)",
        "config": {"vocab_size": 33, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
                   "intermediate_size": 64, "hidden_act": "gelu", "position_embedding_type": "rotary",
                   "token_dropout": True, "emb_layer_norm_before": False, "mask_token_id": 32, "pad_token_id": 1,
                   "max_position_embeddings": 128, "layer_norm_eps": 1e-5, "tie_word_embeddings": True},
        "n_layers": 3, "weights": weight_files(d / "model"),
        "weights_dtype": "bfloat16 (config torch_dtype bfloat16); the rotary inv_freq buffers float32",
        "reference_dtype": "float32, computed from the bfloat16 weights (every parameter rounded to bfloat16 "
                           "before the reference; the folder reloaded with torch_dtype=float32 equals it bit for bit)",
        "init": INIT_NOTE,
        "inputs": "input_ids of EsmTokenizer(seq): <cls> residues <eos>; attention_mask all 1",
        "token_dropout": "embeddings = word_embeddings(ids), rows of <mask> (32) set to 0, all rows times "
                         "(1 - 0.15*0.8) / (1 - n_mask/T) (T counts <cls>/<eos>); applied in eval too, so "
                         "even without masks every row is scaled by 0.88",
        "rotary": "q = W_q x + b, scaled by head_size^-0.5 BEFORE the rotation; q and k rotated with "
                  "inv_freq = 1/10000^(2j/head_size), j < head_size/2, angle = position (0 = <cls>) * inv_freq, "
                  "halves layout: x*cos + rotate_half(x)*sin with rotate_half(x) = [-x2, x1] and cos/sin "
                  "repeated over both halves",
        "unused_weights": "esm.embeddings.position_embeddings (rotary model) and esm.contact_head.* are in the "
                          "file but not used by these outputs",
        "items": items,
    }
    body = """## The model

`EsmForMaskedLM` (ESM-2 layout): hidden 32, 3 layers, 4 heads (head size 8), intermediate 64,
GELU (ESM's own erf form; `hidden_act` is not read), rotary positions, token dropout on, no
embedding LayerNorm (`emb_layer_norm_before` false), final `emb_layer_norm_after`, LayerNorm eps
1e-5, vocabulary 33 (`<mask>` 32, `<pad>` 1), LM head tied to the word embeddings (plus its own
dense, LayerNorm and bias). Saved in **bfloat16** (`torch_dtype` bfloat16); the three rotary
`inv_freq` buffers stay float32 in the file (they are persistent buffers, which `from_pretrained`
loads from the file; rounded to bfloat16, 0.1 would become 0.10009765625). The reference is float32 from exactly the saved weights.
Tokenizer: `EsmTokenizer` with `tests/data/protein/vocab.txt`.

Tensors: `inputs` (T,) = `<cls>` residues `<eos>`; `embeddings` = the output of `EsmEmbeddings`
after token dropout (no LayerNorm, no position table): masked rows 0 and every row times
(1 − 0.15·0.8)/(1 − n_mask/T) — in eval too, so 0.88 even with no mask; `layer.<l>` each
`EsmLayer` (pre-LN); `final` = `emb_layer_norm_after` of the last layer; `logits` (T, 33) =
LM head; `attn.<l>.<i>` (4, T, T) softmax probabilities of layer l.

Rotary: the query is scaled by head_size^-0.5 before the rotation; q and k (both with their
bias) are rotated with inv_freq = 1/10000^(2j/8), positions 0.. counted from `<cls>`, in the
"halves" layout (x·cos + rotate_half(x)·sin, rotate_half(x) = [−x₂, x₁])."""
    licences = ("- Sequences: UniProtKB, © the UniProt Consortium, CC BY 4.0 "
                "(https://creativecommons.org/licenses/by/4.0/); cite \"UniProt: the Universal Protein "
                "Knowledgebase\", Nucleic Acids Research. Taken from `tests/data/protein/uniprot_sample.fasta` "
                "(Debian `mmseqs2-examples`), truncated, one with residues masked (our change, same licence).\n"
                "- `model/vocab.txt`: the 33 ESM-2 tokens, as in `tests/data/protein/vocab.txt` (fair-esm, MIT, "
                "© Meta Platforms).")
    readme = ("EsmForMaskedLM", body, items_table(items, "text"), licences)
    write_family(family, tensors, info, readme)


# ---------------------------------------------------------------------------------------------
# ast

AST_ITEMS = [
    ("tests/data/audio/cards_001.wav", None),
    ("tests/data/audio/espeak_seven.wav", "tests/data/audio/espeak_seven.soxr16k.npy"),
]


def read_wav_16k(rel: str, resampled: str):
    """Mono float32 in [-1, 1) at 16 kHz: 16-bit PCM from the wav, or the stored 16 kHz resampling."""
    with wave.open(str(ROOT / rel), "rb") as w:
        rate, channels, width, n = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
        pcm = w.readframes(n)
    if resampled is not None:
        x = np.load(ROOT / resampled).astype(np.float32)
        return x, rate
    assert rate == 16000 and channels == 1 and width == 2, (rel, rate, channels, width)
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0, rate


def make_ast():
    from transformers import ASTConfig, ASTFeatureExtractor, ASTForAudioClassification
    from transformers.utils import is_speech_available

    family, seed = "ast", SEEDS["ast"]
    d = fresh_dir(family)
    ASTFeatureExtractor(num_mel_bins=128, max_length=64, do_normalize=True).save_pretrained(str(d / "model"))
    fe = ASTFeatureExtractor.from_pretrained(str(d / "model"))
    numpy_path = not is_speech_available()

    labels = ["speech", "music", "noise", "silence"]
    config = ASTConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                       patch_size=16, frequency_stride=10, time_stride=10, max_length=64, num_mel_bins=128,
                       num_labels=4, layer_norm_eps=1e-12, id2label=dict(enumerate(labels)),
                       label2id={n: i for i, n in enumerate(labels)})
    torch.manual_seed(seed)
    model = ASTForAudioClassification(config)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(str(d / "model"))
    ref = ASTForAudioClassification.from_pretrained(str(d / "model"), torch_dtype=torch.float32).eval()
    body_model = ref.audio_spectrogram_transformer

    tensors, items = {}, []
    with torch.no_grad():
        for i, (rel, resampled) in enumerate(AST_ITEMS):
            x, rate = read_wav_16k(rel, resampled)
            iv = fe(x, sampling_rate=16000, return_tensors="pt")["input_values"]
            out, emb, layers = capture(body_model.embeddings, body_model.encoder.layer, lambda: ref(
                input_values=iv, output_hidden_states=True))
            check_hidden_states(out.hidden_states, emb, layers, last_is_final_norm=False)
            base = body_model(input_values=iv)
            final = base.last_hidden_state
            assert max_abs(body_model.layernorm(layers[-1]), final) == 0
            assert max_abs((final[:, 0] + final[:, 1]) / 2, base.pooler_output) == 0
            assert max_abs(ref.classifier(base.pooler_output), out.logits) == 0
            tensors[f"inputs.{i}"] = f32(iv[0])
            tensors[f"embeddings.{i}"] = f32(emb[0])
            for l, h in enumerate(layers):
                tensors[f"layer.{l}.{i}"] = f32(h[0])
            tensors[f"final.{i}"] = f32(final[0])
            tensors[f"pooled.{i}"] = f32(base.pooler_output[0])
            tensors[f"logits.{i}"] = f32(out.logits[0])
            it = {"path": rel, "rows": int(emb.shape[1]), "input_values": list(iv.shape[1:]),
                  "samples_16k": int(x.shape[0]), "content_frames": min(64, 1 + (x.shape[0] - 400) // 160)}
            if resampled is not None:
                it["note"] = (f"recorded at {rate} Hz: the 16 kHz samples are {resampled} (libsoxr VHQ, what the "
                              "audio plugin makes; see tests/data/audio/README.md)")
                it["samples_from"] = resampled
            else:
                it["note"] = "16 kHz mono 16-bit, read with Python's wave module, int16/32768"
            items.append(it)

    info = {
        "family": family, "versions": versions(), "seed": seed, "hf_class": "ASTForAudioClassification",
        "feature_extractor_class": "ASTFeatureExtractor",
        "config": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 64,
                   "hidden_act": "gelu", "patch_size": 16, "frequency_stride": 10, "time_stride": 10,
                   "max_length": 64, "num_mel_bins": 128, "num_labels": 4, "id2label": labels,
                   "layer_norm_eps": 1e-12, "qkv_bias": True},
        "feature_extractor": {"num_mel_bins": 128, "max_length": 64, "sampling_rate": 16000, "do_normalize": True,
                              "mean": fe.mean, "std": fe.std,
                              "implementation": ("NumPy fallback (torchaudio not installed: "
                                                 "transformers.audio_utils spectrogram with Kaldi settings)"
                                                 if numpy_path else "torchaudio.compliance.kaldi.fbank")},
        "n_layers": 3, "weights": weight_files(d / "model"), "weights_dtype": "float32",
        "init": INIT_NOTE,
        "patches": "input_values (frames=64, mel=128) -> (1, 128 mel, 64 frames) -> Conv2d 16x16, stride (10, 10): "
                   "12 frequency x 5 time patches, flattened frequency-major (row = f*5 + t), after [CLS] and "
                   "[DIST]: 62 rows",
        "pooled": "pooled.<i> = (final[0] + final[1]) / 2; logits = dense(LayerNorm(pooled))",
        "items": items,
    }
    body = f"""## The model

`ASTForAudioClassification`: input 64 frames × 128 mel bins, 16×16 patches with stride 10 in
both directions (12 frequency × 5 time = 60 patches, plus CLS and distillation tokens = 62
rows), hidden 32, 3 layers, 4 heads, intermediate 64, GELU (erf), LayerNorm eps 1e-12, 4 labels.
float32. Feature extractor: `ASTFeatureExtractor(num_mel_bins=128, max_length=64,
do_normalize=True)` (mean {fe.mean}, std {fe.std}); torchaudio is not installed, so it ran
transformers' NumPy implementation of the Kaldi fbank (within ~3e-5 of the torchaudio path on
speech, see `tests/data/audio/README.md`).

Tensors: `inputs` = input_values (64, 128), (frames, mel bins), padded or cut to 64 frames;
`embeddings` = [CLS; DIST; patch projections] + position table (`ASTEmbeddings`); patches come
from the (mel, frames) transpose of the input, so they are ordered frequency-major: row 2 + f·5
+ t for frequency patch f (bins 10f..10f+15) and time patch t (frames 10t..10t+15);
`layer.<l>` each `ASTLayer` (pre-LN); `final` = the final `layernorm` of the last layer;
`pooled` = (final[0] + final[1]) / 2; `logits` (4,) = dense(LayerNorm(pooled)) (`ASTMLPHead`)."""
    licences = ("- Audio is not copied: `tests/data/audio/cards_001.wav` (Debian `pocketsphinx-testdata`, "
                "BSD-2-Clause, © Carnegie Mellon University) and `tests/data/audio/espeak_seven.wav` with its 16 kHz "
                "resampling `espeak_seven.soxr16k.npy` (synthesised by espeak-ng; its output is not covered by "
                "espeak-ng's GPL-3+); see `tests/data/audio/README.md`. `inputs.<i>` are derived from them.")
    readme = ("ASTForAudioClassification", body, items_table(items, "path"), licences)
    write_family(family, tensors, info, readme)


# ---------------------------------------------------------------------------------------------
# variants: the other classes and config.json settings the C++ import maps (untied LM heads,
# BertForSequenceClassification, BertForMaskedLM, ViTModel with its pooler), each a small
# float32 model of 2 layers with its own seed.

VARIANT_SEEDS = {"gpt2_untied": 20240706, "bert_cls": 20240707, "bert_mlm": 20240708, "bert_mlm_untied": 20240709,
                 "vit_pooler": 20240710, "esm_untied": 20240711}
VARIANT_LAYERS = 2
BERT_CLS_LABELS = ["negative", "neutral", "positive"]
BERT_TEXT_LICENCES = ("- `model/vocab.txt` and `tokenizer.json` list a subset of Google's BERT uncased vocabulary, "
                      "Apache-2.0 (`LICENSE.Apache-2.0`, copied from `tests/data/text/`).\n"
                      "- Item texts: King James Bible verses (public domain; see `tests/data/text/README.md`).")


def variant_info(family, hf_class, config, d, items, **extra):
    return {"family": family, "versions": versions(), "seed": VARIANT_SEEDS[family], "hf_class": hf_class,
            "config": config, "n_layers": VARIANT_LAYERS, "weights": weight_files(d / "model"),
            "weights_dtype": "float32", "init": INIT_NOTE, **extra, "items": items}


def record_layers(tensors, i, inputs, emb, layers, final):
    tensors[f"inputs.{i}"] = inputs
    tensors[f"embeddings.{i}"] = f32(emb[0])
    for l, h in enumerate(layers):
        tensors[f"layer.{l}.{i}"] = f32(h[0])
    tensors[f"final.{i}"] = f32(final[0])


def untied_check(logits, final, table):
    """How far the untied head's logits are from the tied reading (final · tableᵀ): must matter at 1e-4."""
    gap = max_abs(logits, final @ table.T)
    assert gap > 0.1, gap
    return gap


def make_gpt2_untied():
    from transformers import GPT2Config, GPT2LMHeadModel

    family = "gpt2_untied"
    seed = VARIANT_SEEDS[family]
    d = fresh_dir(family)
    lines = corpus_lines()
    texts = [" ".join(kjv_text(lines, n).split(" ")[:words]) for n, words in GPT2_ITEMS[:3]]
    tok, n_corpus = gpt2_tokenizer(d / "model", lines)
    eos = tok.eos_token_id
    config = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=VARIANT_LAYERS, n_head=4, n_positions=64,
                        activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=False,
                        bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(str(d / "model"))
    assert "lm_head.weight" in safetensors_header(d / "model" / "model.safetensors")
    ref = GPT2LMHeadModel.from_pretrained(str(d / "model"), torch_dtype=torch.float32).eval()
    assert ref.lm_head.weight.data_ptr() != ref.transformer.wte.weight.data_ptr() and ref.lm_head.bias is None

    tensors, items, gaps = {}, [], []
    with torch.no_grad():
        for i, text in enumerate(texts):
            ids = tok(text, return_tensors="pt")["input_ids"]
            out, emb, layers = capture(ref.transformer.drop, ref.transformer.h, lambda: ref(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True))
            check_hidden_states(out.hidden_states, emb, layers, last_is_final_norm=True)
            final = out.hidden_states[-1]
            assert max_abs(ref.transformer.ln_f(layers[-1]), final) == 0
            assert max_abs(final @ ref.lm_head.weight.T, out.logits) == 0  # no bias
            gaps.append(untied_check(out.logits[0], final[0], ref.transformer.wte.weight))
            record_layers(tensors, i, i32(ids[0]), emb, layers, final)
            tensors[f"logits.{i}"] = f32(out.logits[0])
            n, words = GPT2_ITEMS[i]
            items.append({"text": text, "source": f"tests/data/text/corpus.txt line {n}: the first {words} words "
                                                  "of its verse text (indentation and verse number removed)",
                          "tokens": tok.convert_ids_to_tokens(ids[0].tolist()), "rows": int(ids.shape[1])})

    cfg = {"vocab_size": config.vocab_size, "n_embd": 32, "n_layer": VARIANT_LAYERS, "n_head": 4, "n_positions": 64,
           "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False}
    info = variant_info(family, "GPT2LMHeadModel", cfg, d, items,
                        tokenizer_class="GPT2TokenizerFast (the byte-level BPE of tests/data/hf/gpt2, trained again)",
                        inputs="input_ids of tokenizer(text) (GPT-2 adds no special token); attention_mask all 1",
                        logits="logits.<i> = final.<i> · lm_head.weightᵀ (its own matrix, no bias)",
                        tied_reading_max_abs_diff=min(gaps))
    body = f"""## The model

`GPT2LMHeadModel` with `tie_word_embeddings: false`: the LM head is its own matrix, saved as
`lm_head.weight` (V, C) = ({len(tok)}, 32), without a bias (GPT-2's `lm_head` has none). n_embd 32,
{VARIANT_LAYERS} layers, 4 heads, MLP 128, 64 positions, `gelu_new`, LayerNorm eps 1e-5. float32,
one `model.safetensors`. Tokenizer: the byte-level BPE of `tests/data/hf/gpt2` (trained again on
the corpus, the same files).

Tensors: `embeddings` = wte[ids] + wpe[0..T-1]; `layer.<l>` each `GPT2Block`; `final` = ln_f;
`logits` (T, V) = final · lm_headᵀ. Reading the head as tied (final · wteᵀ) would be off by at
least {min(gaps):.2f} on every item."""
    licences = ("- The BPE vocabulary and merges are statistics of `tests/data/text/corpus.txt`: see "
                "`tests/data/text/README.md` for each source's licence.\n"
                "- Prompts: King James Bible (public domain).")
    write_family(family, tensors, info, ("GPT2LMHeadModel (untied)", body, items_table(items, "text"), licences))


# (corpus line, how the text is taken) as BERT_ITEMS; the masked-LM items put [MASK] in place of
# words of the verse.
BERT_VARIANT_ITEMS = [(120, "verse"), (39, "verse"), (6, "verse")]
BERT_MLM_MASKED = {1: [2, 5]}  # item -> word indices (0-based, split at spaces) replaced by [MASK]


def bert_variant_texts(masked):
    lines = corpus_lines()
    texts = []
    for i, (n, how) in enumerate(BERT_VARIANT_ITEMS):
        text = kjv_text(lines, n) if how == "verse" else lines[n - 1]
        if masked and i in BERT_MLM_MASKED:
            words = text.split(" ")
            for w in BERT_MLM_MASKED[i]:
                words[w] = "[MASK]"
            text = " ".join(words)
        texts.append(text)
    return texts


def bert_variant_config(vocab_size, pad_id, **kw):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=VARIANT_LAYERS, num_attention_heads=4,
                      intermediate_size=64, hidden_act="gelu", max_position_embeddings=64, type_vocab_size=2,
                      layer_norm_eps=1e-12, pad_token_id=pad_id, **kw)


def bert_variant_cfg(config):
    return {"vocab_size": config.vocab_size, "hidden_size": 32, "num_hidden_layers": VARIANT_LAYERS,
            "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu", "max_position_embeddings": 64,
            "type_vocab_size": 2, "layer_norm_eps": 1e-12, "tie_word_embeddings": config.tie_word_embeddings}


def bert_item(i, text, tok, ids):
    n, how = BERT_VARIANT_ITEMS[i]
    return {"text": text, "source": f"tests/data/text/corpus.txt line {n} (verse text)" +
            (" with words replaced by [MASK]" if "[MASK]" in text else ""),
            "tokens": tok.convert_ids_to_tokens(ids[0].tolist()), "rows": int(ids.shape[1])}


def make_bert_cls():
    from transformers import BertForSequenceClassification

    family = "bert_cls"
    seed = VARIANT_SEEDS[family]
    d = fresh_dir(family)
    texts = bert_variant_texts(masked=False)
    tok, mini, _ = bert_mini_tokenizer(d / "model", texts)
    config = bert_variant_config(len(mini), tok.pad_token_id, num_labels=len(BERT_CLS_LABELS),
                                 id2label=dict(enumerate(BERT_CLS_LABELS)),
                                 label2id={n: i for i, n in enumerate(BERT_CLS_LABELS)})
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(str(d / "model"))
    ref = BertForSequenceClassification.from_pretrained(str(d / "model"), torch_dtype=torch.float32).eval()

    tensors, items = {}, []
    with torch.no_grad():
        for i, text in enumerate(texts):
            ids = tok(text, return_tensors="pt")["input_ids"]
            out, emb, layers = capture(ref.bert.embeddings, ref.bert.encoder.layer, lambda: ref(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True))
            check_hidden_states(out.hidden_states, emb, layers, last_is_final_norm=False)
            pooled = ref.bert.pooler(layers[-1])
            assert max_abs(ref.classifier(pooled), out.logits) == 0
            record_layers(tensors, i, i32(ids[0]), emb, layers, layers[-1])
            tensors[f"pooled.{i}"] = f32(pooled[0])
            tensors[f"logits.{i}"] = f32(out.logits[0])
            items.append(bert_item(i, text, tok, ids))

    info = variant_info(family, "BertForSequenceClassification", {**bert_variant_cfg(config),
                        "num_labels": 3, "id2label": BERT_CLS_LABELS}, d, items,
                        tokenizer_class="BertTokenizerFast (do_lower_case=True), a subset of BERT uncased",
                        inputs="input_ids of tokenizer(text) with [CLS]/[SEP]; token_type_ids 0; attention_mask 1",
                        pooled="pooled.<i> = tanh(dense(final.<i>[0])) (bert.pooler)",
                        logits="logits.<i> = classifier(pooled.<i>) (3 labels)")
    body = f"""## The model

`BertForSequenceClassification`: the `bert.` base model with its pooler, then `classifier`
(Linear 32 → 3, labels {", ".join(BERT_CLS_LABELS)} in `id2label`). Hidden 32, {VARIANT_LAYERS} layers, 4
heads, intermediate 64, GELU (erf), 64 positions, 2 token types, LayerNorm eps 1e-12, vocabulary
{len(mini)} (the tokens of BERT uncased that the items use, in its order). float32.

Tensors: `embeddings` = `BertEmbeddings`; `layer.<l>` each `BertLayer` (post-LN); `final` = the last
layer; `pooled` = tanh(dense(CLS row)); `logits` (3,) = classifier(pooled)."""
    shutil.copy(TEXT / "LICENSE.Apache-2.0", d / "LICENSE.Apache-2.0")
    write_family(family, tensors, info, ("BertForSequenceClassification", body, items_table(items, "text"),
                                         BERT_TEXT_LICENCES))


def make_bert_mlm(tied=True):
    from transformers import BertForMaskedLM

    family = "bert_mlm" if tied else "bert_mlm_untied"
    seed = VARIANT_SEEDS[family]
    d = fresh_dir(family)
    texts = bert_variant_texts(masked=True)
    tok, mini, _ = bert_mini_tokenizer(d / "model", texts)
    config = bert_variant_config(len(mini), tok.pad_token_id, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = BertForMaskedLM(config)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(str(d / "model"))
    saved = safetensors_header(d / "model" / "model.safetensors")
    assert ("cls.predictions.decoder.weight" in saved) == (not tied), sorted(saved)
    ref = BertForMaskedLM.from_pretrained(str(d / "model"), torch_dtype=torch.float32).eval()
    table = ref.bert.embeddings.word_embeddings.weight
    assert (ref.cls.predictions.decoder.weight.data_ptr() == table.data_ptr()) == tied

    tensors, items, gaps = {}, [], []
    with torch.no_grad():
        for i, text in enumerate(texts):
            ids = tok(text, return_tensors="pt")["input_ids"]
            out, emb, layers = capture(ref.bert.embeddings, ref.bert.encoder.layer, lambda: ref(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True))
            check_hidden_states(out.hidden_states, emb, layers, last_is_final_norm=False)
            if not tied:
                h = ref.cls.predictions.transform(layers[-1])
                gaps.append(untied_check(out.logits[0] - ref.cls.predictions.bias, h[0], table))
            record_layers(tensors, i, i32(ids[0]), emb, layers, layers[-1])
            tensors[f"logits.{i}"] = f32(out.logits[0])
            items.append(bert_item(i, text, tok, ids))

    extra = {"logits": "logits.<i> = decoder(LayerNorm(GELU(dense(final.<i>)))) + bias (cls.predictions)"}
    if not tied:
        extra["tied_reading_max_abs_diff"] = min(gaps)
    info = variant_info(family, "BertForMaskedLM", bert_variant_cfg(config), d, items,
                        tokenizer_class="BertTokenizerFast (do_lower_case=True), a subset of BERT uncased",
                        inputs="input_ids of tokenizer(text) with [CLS]/[SEP] ([MASK] in the text is the mask "
                               "token); token_type_ids 0; attention_mask 1", **extra)
    head = ("the decoder is tied to the word embeddings (`cls.predictions.decoder.weight` is not in the file)"
            if tied else
            "`tie_word_embeddings: false`: the decoder is its own matrix, saved as `cls.predictions.decoder.weight` "
            f"(reading it as tied would be off by at least {min(gaps):.2f} on every item)")
    body = f"""## The model

`BertForMaskedLM`: the `bert.` base model (no pooler), then `cls.predictions`: dense 32 → 32,
GELU, LayerNorm, the decoder to the vocabulary and its bias `cls.predictions.bias`; {head}. Hidden
32, {VARIANT_LAYERS} layers, 4 heads, intermediate 64, 64 positions, 2 token types, LayerNorm eps 1e-12,
vocabulary {len(mini)} (the tokens of BERT uncased that the items use, `[MASK]` included). float32.

Tensors: `embeddings` = `BertEmbeddings`; `layer.<l>` each `BertLayer`; `final` = the last layer;
`logits` (T, V) the masked-LM head's output for every row. Item 1 holds two `[MASK]` tokens."""
    shutil.copy(TEXT / "LICENSE.Apache-2.0", d / "LICENSE.Apache-2.0")
    write_family(family, tensors, info, ("BertForMaskedLM" + ("" if tied else " (untied)"), body,
                                         items_table(items, "text"), BERT_TEXT_LICENCES))


def make_bert_mlm_untied():
    make_bert_mlm(tied=False)


def make_vit_pooler():
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    family = "vit_pooler"
    seed = VARIANT_SEEDS[family]
    d = fresh_dir(family)
    ViTImageProcessor(size={"height": 32, "width": 32}, **VIT_PROC_ARGS).save_pretrained(str(d / "model"))
    proc = ViTImageProcessor.from_pretrained(str(d / "model"))
    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=VARIANT_LAYERS,
                       num_attention_heads=4, intermediate_size=64, hidden_act="gelu", layer_norm_eps=1e-12,
                       qkv_bias=True)
    torch.manual_seed(seed)
    model = ViTModel(config, add_pooling_layer=True)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(str(d / "model"))
    ref = ViTModel.from_pretrained(str(d / "model"), torch_dtype=torch.float32).eval()
    assert ref.pooler is not None

    tensors, items = {}, []
    with torch.no_grad():
        for i, (rel, _) in enumerate(VIT_ITEMS[:2]):
            pv = proc(load_rgb(ROOT / rel), return_tensors="pt")["pixel_values"]
            out, emb, layers = capture(ref.embeddings, ref.encoder.layer, lambda: ref(
                pixel_values=pv, output_hidden_states=True))
            check_hidden_states(out.hidden_states, emb, layers, last_is_final_norm=False)
            final = out.last_hidden_state
            assert max_abs(ref.layernorm(layers[-1]), final) == 0
            assert max_abs(torch.tanh(ref.pooler.dense(final[:, 0])), out.pooler_output) == 0
            record_layers(tensors, i, f32(pv[0]), emb, layers, final)
            tensors[f"pooled.{i}"] = f32(out.pooler_output[0])
            items.append({"path": rel, "rows": int(emb.shape[1]), "pixel_values": list(pv.shape[1:]),
                          "processor": "ViTImageProcessor from model/"})

    cfg = {"image_size": 32, "patch_size": 8, "num_channels": 3, "hidden_size": 32,
           "num_hidden_layers": VARIANT_LAYERS, "num_attention_heads": 4, "intermediate_size": 64,
           "hidden_act": "gelu", "layer_norm_eps": 1e-12, "qkv_bias": True}
    info = variant_info(family, "ViTModel (add_pooling_layer=True)", cfg, d, items,
                        processor_class="ViTImageProcessor", processor={"size": {"height": 32, "width": 32},
                                                                        **VIT_PROC_ARGS},
                        pooled="pooled.<i> = tanh(pooler.dense(final.<i>[0])) (ViTPooler)")
    body = f"""## The model

`ViTModel` with its pooler (`add_pooling_layer=True`): no `vit.` prefix, 32×32 images, 8×8
patches (16 + CLS = 17 rows), hidden 32, {VARIANT_LAYERS} layers, 4 heads, intermediate 64, GELU (erf),
LayerNorm eps 1e-12, qkv bias; `pooler.dense` (32 → 32) with tanh on the CLS row of the final
layernorm. float32. Preprocessor: `ViTImageProcessor` 32×32, bilinear, rescale 1/255, mean = std
= 0.5 (as `tests/data/hf/vit`).

Tensors: `inputs` = pixel_values (3, 32, 32); `embeddings` = `ViTEmbeddings`; `layer.<l>` each
`ViTLayer`; `final` = the final layernorm; `pooled` (32,) = the pooler output."""
    licences = ("- Images are not copied: the items name `tests/data/image/chelsea.jpg` (skimage `chelsea`, "
                "Stefan van der Walt, CC0) and `tests/data/image/astronaut.png` (skimage `astronaut`, NASA, "
                "public domain); see `tests/data/image/README.md`. `inputs.<i>` are derived from them.")
    write_family(family, tensors, info, ("ViTModel (with pooler)", body, items_table(items, "path"), licences))


def make_esm_untied():
    from transformers import EsmConfig, EsmForMaskedLM, EsmTokenizer

    family = "esm_untied"
    seed = VARIANT_SEEDS[family]
    d = fresh_dir(family)
    vocab = ROOT / "tests" / "data" / "protein" / "vocab.txt"
    EsmTokenizer(vocab_file=str(vocab), model_max_length=128).save_pretrained(str(d / "model"))
    tok = EsmTokenizer.from_pretrained(str(d / "model"))
    records = read_fasta(ROOT / "tests" / "data" / "protein" / "uniprot_sample.fasta")
    (rec, n) = ESM_ITEMS[0]
    header, seq = records[rec]
    seqs = [seq[:n], seq[:10] + "<mask>" + seq[11:n]]
    config = EsmConfig(vocab_size=33, hidden_size=32, num_hidden_layers=VARIANT_LAYERS, num_attention_heads=4,
                       intermediate_size=64, hidden_act="gelu", position_embedding_type="rotary", token_dropout=True,
                       emb_layer_norm_before=False, mask_token_id=32, pad_token_id=1, max_position_embeddings=128,
                       layer_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = EsmForMaskedLM(config)
    randomise(model, seed)
    model.eval()
    model.save_pretrained(str(d / "model"))
    assert "lm_head.decoder.weight" in safetensors_header(d / "model" / "model.safetensors")
    ref = EsmForMaskedLM.from_pretrained(str(d / "model"), torch_dtype=torch.float32).eval()
    table = ref.esm.embeddings.word_embeddings.weight
    assert ref.lm_head.decoder.weight.data_ptr() != table.data_ptr()

    tensors, items, gaps = {}, [], []
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ids = tok(s, return_tensors="pt")["input_ids"]
            out, emb, layers = capture(ref.esm.embeddings, ref.esm.encoder.layer, lambda: ref(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True))
            check_hidden_states(out.hidden_states, emb, layers, last_is_final_norm=True)
            final = ref.esm.encoder.emb_layer_norm_after(layers[-1])
            h = ref.lm_head.layer_norm(torch.nn.functional.gelu(ref.lm_head.dense(final)))
            gaps.append(untied_check(out.logits[0] - ref.lm_head.bias, h[0], table))
            record_layers(tensors, i, i32(ids[0]), emb, layers, final)
            tensors[f"logits.{i}"] = f32(out.logits[0])
            items.append({"text": s, "source": f"tests/data/protein/uniprot_sample.fasta record {rec} (0-based) "
                                               f"({header.split()[0]}): its first {n} residues" +
                                               (", residue 10 replaced by <mask>" if "<mask>" in s else ""),
                          "rows": int(ids.shape[1])})

    cfg = {"vocab_size": 33, "hidden_size": 32, "num_hidden_layers": VARIANT_LAYERS, "num_attention_heads": 4,
           "intermediate_size": 64, "position_embedding_type": "rotary", "token_dropout": True,
           "emb_layer_norm_before": False, "mask_token_id": 32, "pad_token_id": 1, "max_position_embeddings": 128,
           "layer_norm_eps": 1e-5, "tie_word_embeddings": False}
    info = variant_info(family, "EsmForMaskedLM", cfg, d, items,
                        tokenizer_class="EsmTokenizer (vocab.txt = tests/data/protein/vocab.txt)",
                        inputs="input_ids of EsmTokenizer(seq): <cls> residues <eos>; attention_mask all 1",
                        logits="logits.<i> = lm_head.decoder(LayerNorm(GELU(dense(final.<i>)))) + lm_head.bias",
                        tied_reading_max_abs_diff=min(gaps))
    body = f"""## The model

`EsmForMaskedLM` (ESM-2 layout, as `tests/data/hf/esm`) with `tie_word_embeddings: false`: the LM
head's decoder is its own matrix, saved as `lm_head.decoder.weight` (33, 32), plus `lm_head.bias`
(reading it as tied would be off by at least {min(gaps):.2f} on every item). Hidden 32, {VARIANT_LAYERS}
layers, 4 heads, intermediate 64, rotary positions, token dropout on, LayerNorm eps 1e-5. float32.
Tokenizer: `EsmTokenizer` with `tests/data/protein/vocab.txt`.

Tensors: `embeddings` = `EsmEmbeddings` after token dropout (every row × 0.88, and masked rows 0);
`layer.<l>` each `EsmLayer`; `final` = `emb_layer_norm_after`; `logits` (T, 33) the LM head."""
    licences = ("- Sequence: UniProtKB, © the UniProt Consortium, CC BY 4.0 "
                "(https://creativecommons.org/licenses/by/4.0/), from `tests/data/protein/uniprot_sample.fasta`, "
                "truncated, one residue masked (our change, same licence).\n"
                "- `model/vocab.txt`: the 33 ESM-2 tokens (fair-esm, MIT, © Meta Platforms).")
    write_family(family, tensors, info, ("EsmForMaskedLM (untied)", body, items_table(items, "text"), licences))


FAMILIES = {"bert": make_bert, "gpt2": make_gpt2, "vit": make_vit, "esm": make_esm, "ast": make_ast,
            "gpt2_untied": make_gpt2_untied, "bert_cls": make_bert_cls, "bert_mlm": make_bert_mlm,
            "bert_mlm_untied": make_bert_mlm_untied, "vit_pooler": make_vit_pooler, "esm_untied": make_esm_untied}


def main(argv):
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    chosen = argv[1:] or list(FAMILIES)
    for name in chosen:
        if name not in FAMILIES:
            sys.exit(f"unknown family {name!r}; choose from {', '.join(FAMILIES)}")
    for name in chosen:
        log(f"{name}: building")
        FAMILIES[name]()


if __name__ == "__main__":
    main(sys.argv)
