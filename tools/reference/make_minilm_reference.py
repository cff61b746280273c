#!/usr/bin/env python3
"""Reference sentence embeddings of the real all-MiniLM-L6-v2, for the C++ parity test on real weights.

Takes 120 real English sentences (60 WordNet noun glosses, 60 King James verses from the text
corpus), and writes into tests/data/hf/minilm/: the sentences, their token ids, and the embeddings
transformers computes with the model folder that tools/setup_minilm.sh makes (BertModel +
BertTokenizerFast, mean pooling over the attention mask, L2 normalisation: what the folder's
modules.json, 1_Pooling/config.json and Normalize module say). It does not download anything and
does not ship the weights. Developer tool only: the product, its build and its tests never run Python.

    tools/setup_minilm.sh
    .venv-ref/bin/python tools/reference/make_minilm_reference.py [MODEL_DIR]

With sentence-transformers importable (see tests/data/hf/minilm/README.md) it also encodes the
sentences with SentenceTransformer(MODEL_DIR) and records the largest difference.
"""
import hashlib
import json
import os
import pathlib
import platform
import re
import shutil
import struct
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import safetensors
import tokenizers
import torch
import transformers
from safetensors.torch import save_file
from transformers import BertModel, BertTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "hf" / "minilm"
CORPUS = ROOT / "tests" / "data" / "text" / "corpus.txt"
WORDNET = pathlib.Path("/usr/share/wordnet/data.noun")
WORDNET_COPYRIGHT = pathlib.Path("/usr/share/doc/wordnet-base/copyright")
MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"  # as in tools/setup_minilm.sh
N_GLOSSES = 60
N_VERSES = 60
KJV_LINES = 1800  # the corpus's first 1,800 lines are the King James Bible sample
MAX_TOKENS = 128  # every sentence stays below this, [CLS] and [SEP] included


def default_model_dir() -> pathlib.Path:
    base = os.environ.get("TESSERA_MODELS") or os.path.join(os.path.expanduser("~"), ".cache", "tessera", "models")
    return pathlib.Path(base) / "all-MiniLM-L6-v2"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def every(items, n):
    """n items spread evenly over items (deterministic)."""
    return [items[(i * len(items)) // n] for i in range(n)]


def wordnet_glosses():
    """[(gloss, source)] for every noun synset of data.noun, in file order."""
    out = []
    with open(WORDNET, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("  "):
                continue  # the licence header
            head, _, gloss = line.rstrip("\n").partition(" | ")
            out.append((gloss.strip(), f"{WORDNET} line {number} (synset {head.split(' ')[0]})"))
    return out


def kjv_verses():
    """[(verse text, source)] for the verse lines of the corpus's King James sample."""
    lines = CORPUS.read_bytes().decode("utf-8").split("\n")[:KJV_LINES]
    out = []
    for number, line in enumerate(lines, 1):
        m = re.match(r"^\s+\d+\s+(.*)$", line)
        if m:
            out.append((m.group(1), f"tests/data/text/corpus.txt line {number} (verse text, verse number removed)"))
    return out


def choose(candidates, n, tok):
    """n candidates spread evenly; one that would reach MAX_TOKENS is replaced by its next fitting neighbour."""
    chosen, used = [], set()
    for start in every(range(len(candidates)), n):
        i = start
        while i in used or len(tok(candidates[i][0])["input_ids"]) >= MAX_TOKENS:
            i += 1
        used.add(i)
        chosen.append(candidates[i])
    return chosen


def write_ids(path: pathlib.Path, ids):
    """The layout of tests/data/text/corpus.wordpiece.bin: "TTXR", uint32 1, uint32 N, N uint16
    counts, then every sentence's ids as uint16, all little-endian."""
    with open(path, "wb") as f:
        f.write(b"TTXR" + struct.pack("<II", 1, len(ids)))
        f.write(struct.pack(f"<{len(ids)}H", *[len(x) for x in ids]))
        for x in ids:
            f.write(struct.pack(f"<{len(x)}H", *x))


def main(argv):
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    model_dir = pathlib.Path(argv[1]) if len(argv) > 1 else default_model_dir()
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        sys.exit(f"make_minilm_reference.py: no {weights}; run tools/setup_minilm.sh first (or pass the model folder)")
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    if sha != MODEL_SHA256:
        sys.exit(f"make_minilm_reference.py: {weights} has sha256 {sha}, expected {MODEL_SHA256}; "
                 "rerun tools/setup_minilm.sh")
    if not WORDNET.is_file():
        sys.exit(f"make_minilm_reference.py: no {WORDNET}; apt-get install wordnet-base")

    pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    modules = json.loads((model_dir / "modules.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not any(
        v for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens")
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    st_config = json.loads((model_dir / "sentence_bert_config.json").read_text())

    tok = BertTokenizerFast.from_pretrained(str(model_dir))
    model = BertModel.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()

    picked = choose(wordnet_glosses(), N_GLOSSES, tok) + choose(kjv_verses(), N_VERSES, tok)
    sentences = [s for s, _ in picked]
    assert all("\n" not in s and "\r" not in s and s == s.strip() for s in sentences)
    assert len(set(sentences)) == len(sentences)

    ids, embeddings, items = [], [], []
    shortest = min(range(len(sentences)), key=lambda i: (len(tok(sentences[i])["input_ids"]), i))
    layers = {}
    with torch.no_grad():
        for i, s in enumerate(sentences):
            enc = tok(s, return_tensors="pt")
            n = int(enc["input_ids"].shape[1])
            assert n < MAX_TOKENS <= st_config["max_seq_length"]
            out = model(**enc, output_hidden_states=True)
            mask = enc["attention_mask"][..., None].to(torch.float32)
            mean = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            emb = torch.nn.functional.normalize(mean, p=2, dim=1)[0]
            ids.append(enc["input_ids"][0].tolist())
            embeddings.append(emb.numpy().astype(np.float32))
            items.append({"source": picked[i][1], "tokens": n})
            if i == shortest:
                layers = {"inputs": enc["input_ids"][0].to(torch.int32)}
                layers["embeddings"] = out.hidden_states[0][0]
                for l, h in enumerate(out.hidden_states[1:]):
                    layers[f"layer.{l}"] = h[0]
                layers["sentence"] = emb
    embeddings = np.stack(embeddings)
    assert embeddings.shape == (len(sentences), 384) and embeddings.dtype == np.float32
    assert np.allclose(np.linalg.norm(embeddings, axis=1), 1, atol=1e-6)

    cross = None
    try:
        import sentence_transformers
    except ImportError:
        log("sentence-transformers not importable: no cross-check (see tests/data/hf/minilm/README.md)")
    else:
        st = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu")
        got = st.encode(sentences, batch_size=32, convert_to_numpy=True)
        alone = np.stack([st.encode([s], convert_to_numpy=True)[0] for s in sentences])
        cross = {"sentence_transformers": sentence_transformers.__version__,
                 "max_abs_batched_32": float(np.abs(got - embeddings).max()),
                 "max_abs_one_by_one": float(np.abs(alone - embeddings).max())}
        log(f"sentence-transformers {sentence_transformers.__version__}: max |diff| batched "
            f"{cross['max_abs_batched_32']:.2e}, one by one {cross['max_abs_one_by_one']:.2e}")

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sentences.txt").write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    np.save(OUT / "embeddings.npy", embeddings)
    write_ids(OUT / "ids.bin", ids)
    save_file({k: v.detach().contiguous() for k, v in layers.items()}, str(OUT / "layers.safetensors"),
              metadata={"made_by": f"tools/reference/make_minilm_reference.py sentence {shortest}"})
    shutil.copy(WORDNET_COPYRIGHT, OUT / "LICENSE.WordNet")
    shutil.copy(ROOT / "tests" / "data" / "text" / "LICENSE.Apache-2.0", OUT / "LICENSE.Apache-2.0")
    info = {
        "model": {"name": "sentence-transformers/all-MiniLM-L6-v2", "folder": "made by tools/setup_minilm.sh",
                  "model.safetensors sha256": sha, "config": json.loads((model_dir / "config.json").read_text()),
                  "modules": [m["type"] for m in modules], "pooling": pooling,
                  "sentence_bert_config": st_config},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "safetensors": safetensors.__version__, "numpy": np.__version__},
        "method": "each sentence alone (batch 1, no padding): BertTokenizerFast.from_pretrained(folder)(s) "
                  "with [CLS]/[SEP]; BertModel.from_pretrained(folder) in float32, eval, no_grad; mean of "
                  "last_hidden_state over the attention mask (all ones); divided by its L2 norm",
        "files": {"sentences.txt": "one sentence a line, UTF-8, in this order",
                  "embeddings.npy": f"float32 ({len(sentences)}, 384), unit rows",
                  "ids.bin": "token ids with [CLS]/[SEP], layout of tests/data/text/corpus.wordpiece.bin",
                  "layers.safetensors": f"sentence {shortest} (the one with fewest tokens): inputs (T,) int32, "
                                        "embeddings (T, 384) = BertEmbeddings output, layer.<l> (T, 384) for l "
                                        "0..5, sentence (384,)"},
        "cross_check": cross or "not run (sentence-transformers not importable)",
        "sentences": [{"index": i, "text": s, **items[i], "ids": ids[i]} for i, s in enumerate(sentences)],
    }
    (OUT / "reference.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    counts = [it["tokens"] for it in items]
    log(f"minilm: {len(sentences)} sentences, {min(counts)}..{max(counts)} tokens, written to {OUT}")


if __name__ == "__main__":
    main(sys.argv)
