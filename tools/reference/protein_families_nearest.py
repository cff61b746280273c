#!/usr/bin/env python3
"""A non-neural reference for the protein-families recipe (docs/TRAINING.md, "Protein families"):
each sequence of a held-out manifest takes the family of its best-scoring hit among the training
manifest's family sequences, "none" without a hit under the E-value threshold. The search is
mmseqs2 easy-search at sensitivity 7.5 (the default), or with --phmmer HMMER's phmmer (each query
as a profile with its BLOSUM62 scores: slower, more sensitive for remote homologues). It says how
far sequence search alone gets across the 30 % identity split; it is not a model and trains
nothing. Needs Debian's mmseqs2 (or hmmer) and the data of tools/data/protein_families.sh.

  tools/reference/protein_families_nearest.py [--phmmer] [DATA_DIR] [validation.csv|test.csv|test_all.csv ...]

Prints accuracy, macro-F1 and per-class F1 at the E-value thresholds 1e-5, 1e-3, 0.1 and 1.
"""
import csv
import os
import subprocess
import sys
import tempfile

CLASSES = ["none", "Pkinase", "SMC_N", "RRM_1", "fn3"]
THRESHOLDS = [1e-5, 1e-3, 0.1, 1.0]


def read(path):
    with open(path, newline="") as f:
        return [(r["id"], r["protein"], r["label"]) for r in csv.DictReader(f)]


def fasta(rows, path):
    with open(path, "w") as f:
        for i, seq, _ in rows:
            f.write(f">{i}\n{seq}\n")


def main():
    args = sys.argv[1:]
    phmmer = "--phmmer" in args
    args = [a for a in args if a != "--phmmer"]
    data = args[0] if args else "data/protein_families"
    splits = args[1:] or ["validation.csv", "test.csv"]
    train = read(os.path.join(data, "train.csv"))
    train_label = {i: lab for i, _, lab in train}
    with tempfile.TemporaryDirectory() as tmp:
        fasta(train, os.path.join(tmp, "train.fa"))
        for split in splits:
            rows = read(os.path.join(data, split))
            fasta(rows, os.path.join(tmp, "query.fa"))
            out = os.path.join(tmp, split + ".m8")
            hits = []  # (query, target, E-value)
            if phmmer:
                subprocess.run(["phmmer", "--tblout", out, "-E", "10", "--cpu", "1", "--noali",
                                os.path.join(tmp, "query.fa"), os.path.join(tmp, "train.fa")],
                               check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    for line in f:
                        if not line.startswith("#"):
                            t, _, q, _, e = line.split()[:5]  # target name, accession, query name, accession, full E-value
                            hits.append((q, t, float(e)))
            else:
                subprocess.run(["mmseqs", "easy-search", os.path.join(tmp, "query.fa"), os.path.join(tmp, "train.fa"),
                                out, os.path.join(tmp, "work"), "-s", "7.5", "-e", "10", "--threads", "1"],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                with open(out) as f:
                    for line in f:
                        q, t, *rest = line.rstrip("\n").split("\t")
                        hits.append((q, t, float(rest[8])))
            best = {}  # query -> (E-value, family) of its best family hit
            for q, t, e in hits:
                if train_label[t] != "none" and (q not in best or e < best[q][0]):
                    best[q] = (e, train_label[t])
            for thr in THRESHOLDS:
                pred = {i: best[i][1] if i in best and best[i][0] < thr else "none" for i, _, _ in rows}
                f1 = []
                for c in CLASSES:
                    tp = sum(1 for i, _, lab in rows if pred[i] == c and lab == c)
                    fp = sum(1 for i, _, lab in rows if pred[i] == c and lab != c)
                    fn = sum(1 for i, _, lab in rows if pred[i] != c and lab == c)
                    f1.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
                acc = sum(pred[i] == lab for i, _, lab in rows) / len(rows)
                print(f"{split} E < {thr:g}: accuracy {acc:.4f}, macro-F1 {sum(f1) / len(f1):.4f} (" +
                      ", ".join(f"{c} {v:.3f}" for c, v in zip(CLASSES, f1)) + ")")


if __name__ == "__main__":
    main()
