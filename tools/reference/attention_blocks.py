#!/usr/bin/env python3
"""Attention between the plugins' blocks of rows, averaged over a batch run's items.

A developer script (Python's standard library only; Tessera does not need it): it reads a run
folder that `tessera run` wrote with `task.attention` (rows.jsonl and attention/<name>.layer<L>.npy,
docs/RUNS.md) and prints, for every exported layer and head, how much each block of rows attends to
each block: the weight a query row gives the block's keys, averaged over the block's query rows and
then over the items. The blocks: [CLS] (rows whose role is cls) and one per plugin (its other rows).
`tessera explain --item N` prints the same table for one item.

    python3 tools/reference/attention_blocks.py RUN_DIR [--names image,audio] [--by-label]

--by-label averages the items of each label (predictions.jsonl's "label", a manifest's label
column) apart.
"""
import argparse
import array
import ast
import glob
import json
import os
import re
import sys


def load_npy_f32(path):
    """A little-endian float32 C-order .npy file: (shape, flat values)."""
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            sys.exit(f"{path}: not a .npy file")
        major = f.read(2)[0]
        n = int.from_bytes(f.read(2 if major == 1 else 4), "little")
        header = ast.literal_eval(f.read(n).decode("latin1"))
        if header["descr"] != "<f4" or header["fortran_order"]:
            sys.exit(f"{path}: expected little-endian float32 in C order, found {header}")
        values = array.array("f")
        values.frombytes(f.read())
    return header["shape"], values


def safe_prefix(item_id):
    """The run's file name for an id, without its 8 hex digits of hash (run_common.h, safe_name)."""
    s = re.sub(r"[^A-Za-z0-9._-]", "_", item_id)
    return s[-80:] if len(s) > 80 else s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--names", default="", help="the plugins' names, in plugin order (default plugin0, plugin1, ...)")
    ap.add_argument("--by-label", action="store_true", help="average each label's items apart")
    a = ap.parse_args()
    labels = {}
    if a.by_label:
        with open(os.path.join(a.run_dir, "predictions.jsonl")) as f:
            for line in f:
                p = json.loads(line)
                labels[p["id"]] = p.get("label", "")
    groups = sorted(set(labels.values())) if a.by_label else [None]
    for group in groups:
        if group is not None:
            print(f"label {group}:")
        report(a.run_dir, names_of(a.names), lambda i: group is None or labels.get(i) == group)


def names_of(text):
    return [n for n in text.split(",") if n]


def report(run_dir, names, wanted):
    share = {}  # block -> summed share of the item's rows (what attention spread evenly gives it)
    sums = {}  # (layer, head, from, to) -> summed mass
    counts = {}  # (layer, head, from) -> items
    items = 0
    with open(os.path.join(run_dir, "rows.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if not wanted(rec["id"]):
                continue
            blocks = []
            for r in rec["rows"]:
                p = r["plugin"]
                blocks.append("[CLS]" if r["role"] == "cls" else (names[p] if p < len(names) else f"plugin{p}"))
            files = glob.glob(os.path.join(run_dir, "attention", glob.escape(safe_prefix(rec["id"])) + "-????????.layer*.npy"))
            if not files:
                continue
            items += 1
            for b in set(blocks):
                share[b] = share.get(b, 0.0) + blocks.count(b) / len(blocks)
            for path in files:
                layer = int(re.search(r"\.layer(\d+)\.npy$", path).group(1))
                shape, w = load_npy_f32(path)
                H, n, _ = shape
                if n != len(blocks):
                    sys.exit(f"{path}: {n} rows, but rows.jsonl lists {len(blocks)} for {rec['id']}")
                kinds = sorted(set(blocks), key=blocks.index)
                for h in range(H):
                    for b_from in kinds:
                        q = [i for i in range(n) if blocks[i] == b_from]
                        for b_to in kinds:
                            k = [j for j in range(n) if blocks[j] == b_to]
                            mass = sum(w[(h * n + i) * n + j] for i in q for j in k) / len(q)
                            sums[(layer, h, b_from, b_to)] = sums.get((layer, h, b_from, b_to), 0.0) + mass
                        counts[(layer, h, b_from)] = counts.get((layer, h, b_from), 0) + 1
    if not items:
        sys.exit(f"{run_dir}: no attention maps (run with task.attention.layers)")
    print(f"{items} items; the weight each block's query rows give each block's keys, averaged")
    print("evenly spread attention would give: " + ", ".join(f"{b} {v / items:.3f}" for b, v in sorted(share.items())))
    layers = sorted({k[0] for k in sums})
    for layer in layers:
        heads = sorted({k[1] for k in sums if k[0] == layer})
        for h in heads:
            froms = sorted({k[2] for k in sums if k[:2] == (layer, h)})
            tos = sorted({k[3] for k in sums if k[:2] == (layer, h)})
            print(f"layer {layer} head {h}: " + "; ".join(
                f"{fr} -> " + ", ".join(f"{to} {sums[(layer, h, fr, to)] / counts[(layer, h, fr)]:.3f}" for to in tos)
                for fr in froms))


if __name__ == "__main__":
    main()
