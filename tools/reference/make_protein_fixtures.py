# Writes the protein plugin's reference fixtures into tests/data/protein/: the ESM-2 vocabulary,
# a sample of real UniProt records from Debian's mmseqs2-examples, deliberately messy records made
# from real sequences, and the ids transformers' EsmTokenizer gives for each. Developer-run only
# (see tests/data/protein/README.md); the C++ tests never run Python.
import gzip
import json
import pathlib
import random
import sys

import esm  # fair-esm 2.0.0: the alphabet the ESM-2 checkpoints were trained with
import tokenizers
import transformers
from transformers import EsmTokenizer

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "protein"
DB = pathlib.Path("/usr/share/doc/mmseqs2/example-data/DB.fasta.gz")
SEED = 20240611
N_SAMPLE = 300
N_LONGEST = 24
N_WITH_X = 20
WINDOW = 1022  # residues of ESM-2's 1024-token context, <cls> and <eos> aside

# The ESM-2 alphabet as fair-esm builds it (Alphabet.from_architecture("ESM-1b"), which the esm2_*
# models use): 4 specials, 27 residue letters and gap symbols, one <null_1> to reach 32, <mask>.
ESM2_TOKENS = ["<cls>", "<pad>", "<eos>", "<unk>", "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P",
               "K", "Q", "N", "F", "Y", "M", "H", "W", "C", "X", "B", "U", "Z", "O", ".", "-",
               "<null_1>", "<mask>"]


def read_fasta(path):
    """[(header line without '\\n', sequence)] in file order."""
    records = []
    with gzip.open(path, "rt", encoding="ascii") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith(">"):
                records.append([line, []])
            else:
                records[-1][1].append(line)
    return [(h, "".join(parts)) for h, parts in records]


def sample(records):
    """Indices into records: every one with B/Z/U/O, some with X, the longest, and a random rest."""
    rng = random.Random(SEED)
    rare = [i for i, (_, s) in enumerate(records) if set(s) & set("BZUO")]
    with_x = [i for i, (_, s) in enumerate(records) if "X" in s and i not in rare]
    longest = sorted(range(len(records)), key=lambda i: -len(records[i][1]))[:N_LONGEST]
    chosen = set(rare) | set(rng.sample(with_x, N_WITH_X)) | set(longest)
    rest = [i for i in range(len(records)) if i not in chosen]
    chosen |= set(rng.sample(rest, N_SAMPLE - len(chosen)))
    return sorted(chosen)


def wrap(seq, width):
    return [seq[i:i + width] for i in range(0, len(seq), width)]


def messy_records(real):
    """(name, text exactly as in the file, the clean sequence EsmTokenizer is given)."""
    rng = random.Random(SEED + 1)
    out = []

    def add(name, body_lines, clean, eol="\n", header_rest=" messy record made from a real UniProt sequence"):
        text = ">" + name + header_rest + eol + eol.join(body_lines) + eol
        out.append((name, text, clean))

    s = [seq for _, seq in real]
    add("wrapped60", wrap(s[0], 60), s[0])
    add("lowercase", wrap(s[1].lower(), 70), s[1])
    mixed = "".join(c.lower() if rng.random() < 0.5 else c for c in s[2])
    add("mixed_case_stop", wrap(mixed + "*", 60), s[2])
    add("blank_lines", [l for part in wrap(s[3], 50) for l in (part, "")] + ["", ""], s[3])
    add("crlf", wrap(s[4], 60), s[4], eol="\r\n")
    add("crlf_stop", wrap(s[5] + "*", 80), s[5], eol="\r\n")
    spaced = [" ".join(wrap(line, 10)) for line in wrap(s[6], 60)]
    add("spaces_inside", spaced, s[6])
    tabs = ["\t" + "\t".join(wrap(line, 7)) + " \t" for line in wrap(s[7], 49)]
    add("tabs_and_trailing_blanks", tabs, s[7])
    add("stop_then_blank_lines", wrap(s[8], 60) + ["*", "", "  "], s[8])
    add("one_line_no_description", [s[9]], s[9], header_rest="")
    # Selenocysteine (U) and pyrrolysine (O) do not occur in DB.fasta: put them into a real sequence.
    uo = s[10][:5] + "U" + s[10][6:9] + "O" + s[10][10:]
    add("selenocysteine_pyrrolysine", wrap(uo, 60), uo)
    # J (Leu or Ile) is no ESM-2 token: isolated, EsmTokenizer gives one <unk> per J, as the plugin does.
    js = "".join("J" if i % 97 == 50 else c for i, c in enumerate(s[11]))
    add("isolated_j_unknown", wrap(js, 60), js)
    masked = "".join("<mask>" if i % 41 == 7 else c for i, c in enumerate(s[12]))
    add("inline_mask", [masked], masked)
    gapped = "".join(("-" if i % 13 == 3 else "." if i % 29 == 5 else c) for i, c in enumerate(s[13]))
    add("alignment_gaps", wrap(gapped, 60), gapped)
    # Last, so that the file ends without a newline.
    text = ">no_final_newline" + "\r\n" + "\r\n".join(wrap(s[14].lower(), 60))
    out.append(("no_final_newline", text, s[14]))
    return out


def main():
    if not DB.exists():
        sys.exit(f"{DB} is missing: apt-get install mmseqs2-examples")
    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    if alphabet.all_toks != ESM2_TOKENS:
        sys.exit(f"fair-esm's alphabet differs from ESM2_TOKENS: {alphabet.all_toks}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "vocab.txt").write_text("\n".join(ESM2_TOKENS) + "\n")
    tok = EsmTokenizer(str(OUT / "vocab.txt"))
    versions = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                "fair-esm": esm.__version__, "python": sys.version.split()[0]}

    records = read_fasta(DB)
    chosen = sample(records)
    real = [records[i] for i in chosen]
    with open(OUT / "uniprot_sample.fasta", "w", newline="\n") as f:
        for header, seq in real:
            f.write(header + "\n" + seq + "\n")
    entries = []
    for i, (header, seq) in zip(chosen, real):
        e = {"db_index": i, "name": header[1:].split()[0], "residues": len(seq),
             "ids": tok(seq)["input_ids"]}
        if len(seq) > WINDOW:
            e["ids_truncated_1024"] = tok(seq, truncation=True, max_length=WINDOW + 2)["input_ids"]
        entries.append(e)
    (OUT / "uniprot_sample.json").write_text(json.dumps(
        {"source": str(DB), "tokenizer": "EsmTokenizer(vocab.txt)", "versions": versions, "records": entries},
        separators=(",", ":")) + "\n")

    messy = messy_records(real)
    with open(OUT / "messy.fasta", "w", newline="") as f:
        f.write("".join(text for _, text, _ in messy))
    (OUT / "messy.json").write_text(json.dumps(
        {"tokenizer": "EsmTokenizer(vocab.txt) on the clean sequence", "versions": versions,
         "records": [{"name": n, "clean": c, "ids": tok(c)["input_ids"]} for n, _, c in messy]},
        separators=(",", ":")) + "\n")
    long = sum(len(s) > WINDOW for _, s in real)
    print(f"{len(real)} real records ({sum(len(s) for _, s in real)} residues, {long} longer than {WINDOW}), "
          f"{len(messy)} messy records, written to {OUT}; {versions}")


if __name__ == "__main__":
    main()
