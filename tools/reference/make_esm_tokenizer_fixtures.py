#!/usr/bin/env python3
"""EsmTokenizer's ids on the strings where a simple residue reader and EsmTokenizer part ways.

Writes tests/data/protein/esm_tokenizer.json: for many bare strings (lower and mixed case, runs of
unknown letters, whitespace of every kind inside and around, special-token text such as <mask>,
<unk>, <eos> embedded or broken, the rare letters X B U Z O, the gaps . and -, the empty string,
long sequences, and seeded random mixtures of all of these) the ids transformers' EsmTokenizer
gives; and for FASTA records (tests/data/protein/messy.fasta and a few made here) the ids it gives
on the record's sequence. The protein plugin's default (tokenizer: esm) must reproduce every one,
except where it refuses the text because it holds a character no protein sequence holds (a digit,
punctuation, a '*' before the end, a '<' that starts no token): `refused` names those cases, by the
plugin's documented rule written out here apart from its C++.
Developer tool only: the product, its build and its tests never run Python.

    .venv-ref/bin/python tools/reference/make_esm_tokenizer_fixtures.py

Needs transformers 4.40.2 only (no fair-esm, no download): EsmTokenizer is built from
tests/data/hf/esm/model (its vocab.txt and tokenizer_config.json) and, as a cross-check, from
tests/data/protein/vocab.txt alone; both must give the same ids on every case. Deterministic:
rerunning rewrites the same bytes.
"""
import json
import os
import pathlib
import platform
import random
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import tokenizers
import transformers
from transformers import EsmTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "protein"
HF_ESM = ROOT / "tests" / "data" / "hf" / "esm" / "model"
OUT = DATA / "esm_tokenizer.json"
SEED = 20241201
N_RANDOM = 400
TRUNCATE_AT = (8, 64, 1024)  # max_length values of the truncation cases

ANGLE = ["<cls>", "<pad>", "<eos>", "<unk>", "<null_1>", "<mask>"]

# (text, what it shows). None of them starts with '>': the plugin reads such text as a FASTA record.
CASES = [
    ("MKJJTmkt", "the issue's example: JJ is one <unk>, so is the lower-case run mkt"),
    ("MKT", "upper case: one token per letter"),
    ("mkt", "lower case: a run of letters outside the vocabulary is one <unk>"),
    ("mktj", "lower case run"),
    ("MkT", "mixed case: the lower-case letter alone"),
    ("mKt", "mixed case: two runs of one letter"),
    ("MKTAYIAKQRQISFVKSHFSRQ", "a plain sequence"),
    ("MKTAyiakQRQisfvKSH", "mixed case runs"),
    ("MJK", "an isolated unknown letter"),
    ("MJJK", "a run of two unknown letters is one <unk>"),
    ("JJJJ", "only unknown letters"),
    ("J J", "whitespace cuts a run"),
    ("MK JJ JJ T", "runs cut by spaces"),
    ("JJ\nJJ", "a line break cuts a run"),
    ("  MKT  ", "spaces around"),
    ("\tM K\tT\n", "tabs, spaces and a line break around and inside"),
    ("M\r\nK\r\n", "CRLF"),
    ("M K T", "spaces between letters are dropped"),
    ("J\u00a0J", "NO-BREAK SPACE is whitespace to str.split()"),
    ("M\u00a0JJ\u00a0JJ", "NO-BREAK SPACE cuts runs"),
    ("J\u2003J", "EM SPACE"),
    ("J\u3000J", "IDEOGRAPHIC SPACE"),
    ("J\u2028J\u2029J", "LINE and PARAGRAPH SEPARATOR"),
    ("J\u0085J", "NEXT LINE (U+0085)"),
    ("\x1cJ\x1dJ\x1eJ\x1fJ", "the information separators U+001C-U+001F are whitespace to str.split()"),
    ("J\x0bJ\x0cJ", "vertical tab and form feed"),
    ("J\u200bJ", "ZERO WIDTH SPACE is not whitespace: J, U+200B and J are one run"),
    ("J\u180eJ", "MONGOLIAN VOWEL SEPARATOR is not whitespace (Unicode 6.3 on)"),
    ("J\ufeffJ", "BYTE ORDER MARK is not whitespace"),
    ("<mask>", "the mask token"),
    ("MK<mask>T", "an embedded mask"),
    ("mk<mask>t", "a mask between lower-case runs"),
    ("JJ<mask>JJ", "a mask cuts an unknown run"),
    ("<mask><mask>", "two masks"),
    ("<unk>", "the unknown token written out"),
    ("J<unk>J", "a written-out <unk> is its own token between two runs"),
    ("<cls>MKT<eos>", "<cls> and <eos> written out are tokens too"),
    ("M<eos>K", "an embedded <eos>"),
    ("<pad><null_1>", "<pad> and <null_1> written out"),
    ("a<null_1>b", "<null_1> between lower-case runs"),
    ("<MASK>", "upper case is no token: < and > are unknown, M A S K are residues"),
    ("<Mask>", "mixed case is no token"),
    ("<mask", "a token cut short is an unknown run"),
    ("mask>", "no '<': an unknown run"),
    ("<<mask>>", "'<' before a token, '>' after it"),
    ("<ma sk>", "a space inside a token"),
    ("< mask>", "a space after '<'"),
    ("<ma\nsk>", "a line break inside a token"),
    ("<cls><cls>", "two <cls>"),
    ("<>", "angle brackets alone"),
    ("<", "a lone '<'"),
    ("XBUZO", "the rare letters: all in the vocabulary"),
    ("xbuzo", "the rare letters in lower case: one run"),
    ("MXBUZOK", "rare letters inside a sequence"),
    (".", "a gap"),
    ("-", "a gap"),
    ("MK.-T", "gaps inside a sequence"),
    ("M..K--", "runs of gaps: one token each"),
    ("m.k-t", "gaps cut lower-case runs"),
    ("*", "a stop: an unknown character"),
    ("MKT*", "a trailing stop is <unk>"),
    ("MKT**", "two stops are one run"),
    ("MK1T", "a digit"),
    ("MK 12 T", "a number between spaces"),
    ("MK_T", "an underscore"),
    ("\u00e9", "a non-ASCII letter"),
    ("MK\u00e9T", "a non-ASCII letter inside"),
    ("MK\u00e9\u00e9T", "two non-ASCII letters: one run"),
    ("M\U0001f600K", "an emoji (4 UTF-8 bytes)"),
    ("M\u2014K", "an em dash"),
    ("\x00", "a NUL character"),
    ("M\x00K", "a NUL inside"),
    ("#M", "a '#'"),
    ("M>K", "'>' inside (not at the start)"),
    ("MK\n>x\nLL", "a header-like line inside bare text is just text"),
    ("", "the empty string: <cls> <eos>"),
    ("   ", "only spaces"),
    ("\n\t\r\n", "only whitespace"),
]


def read_fasta(path):
    """[(header line, body text)] of a FASTA file, the body as written (line ends included)."""
    text = path.read_bytes().decode("ascii")
    starts = [m.start() for m in re.finditer(r"(?m)^>", text)]
    out = []
    for k, s in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(text)
        record = text[s:end]
        nl = re.search(r"[\r\n]", record)
        header = record[:nl.start()] if nl else record
        out.append((header, record))
    return out


def fasta_sequence(record):
    """A FASTA record's sequence as the plugin reads it: the lines after the header joined, every
    space, tab, CR, VT, FF and line break dropped, and one final '*' (a stop) dropped; the letters
    as written."""
    nl = re.search(r"[\r\n]", record)
    body = record[nl.start():] if nl else ""
    seq = re.sub(r"[ \t\r\v\f\n]", "", body)
    return seq[:-1] if seq.endswith("*") else seq


def fold_upper(text):
    """ASCII a-z made upper case outside the <...> tokens: what uppercase: true reads."""
    pattern = "|".join(re.escape(t) for t in ANGLE)
    out, at = [], 0
    for m in re.finditer(pattern, text):
        out.append(re.sub("[a-z]+", lambda w: w.group(0).upper(), text[at:m.start()]))
        out.append(m.group(0))
        at = m.end()
    out.append(re.sub("[a-z]+", lambda w: w.group(0).upper(), text[at:]))
    return "".join(out)


def refused(text):
    """Why the protein plugin (tokenizer: esm) refuses `text` as a bare sequence, as a fragment of its
    message, or None. EsmTokenizer reads every character outside its vocabulary as part of an <unk>;
    the plugin does so for letters, whitespace and a final '*', and refuses what no protein sequence
    holds: digits, punctuation, control and non-ASCII characters other than whitespace, a '<' that
    starts none of the six <...> tokens, a '*' with more than whitespace after it, a '>'."""
    pattern = "|".join(re.escape(t) for t in ANGLE)
    pieces, at = [], 0
    for m in re.finditer(pattern, text):
        pieces.append((at, text[at:m.start()]))
        at = m.end()
    pieces.append((at, text[at:]))
    for offset, piece in pieces:
        for k, ch in enumerate(piece):
            pos = offset + k
            if ch.isspace() or (ch.isascii() and (ch.isalpha() or ch in ".-")):
                continue
            if ch == "*":
                if text[pos + 1:].strip() == "":
                    continue
                return "'*' (a stop) before the end of the sequence"
            if ch == "<":
                return "'<' starts no token"
            if ch == ">" and pos > 0 and text[pos - 1] == "\n":
                return "a '>' header line inside the sequence"
            return "is not a residue"
    return None


def random_cases(rng, real, seen):
    pieces = (list("LAGVSERTIDPKQNFYMHWCXBUZO.-") * 3 + list("lagvsmkxbuzoj") * 2 + list("JJJ") +
              [" ", "  ", "\n", "\t", "\r\n", "\u00a0", "\u2003", "\x1c"] + ANGLE)
    rare = ["<", ">", "<MASK>", "<mas", "sk>", "*", "1", "\u00e9", "\U0001f600", "#", "_", "\u200b"]
    cases = []
    while len(cases) < N_RANDOM:
        length = rng.randrange(1, 60)
        text = "".join(rng.choice(rare) if rng.random() < 0.004 else rng.choice(pieces) for _ in range(length))
        if rng.random() < 0.1:
            text += "*"  # a final stop
        if text.startswith(">"):
            text = "M" + text
        if text not in seen:
            seen.add(text)
            cases.append((text, f"random mixture {len(cases)}"))
    # Long ones: real sequences, as they are, in lower case, and with noise every so often.
    for k, seq in enumerate(real):
        cases.append((seq, f"long: real UniProt sequence {k} ({len(seq)} residues)"))
        cases.append((seq.lower(), f"long: real UniProt sequence {k} in lower case"))
        noisy = "".join(c if i % 37 else rng.choice(["J", "jj", " ", "\n", "<mask>", "x", "  J J "]) + c
                        for i, c in enumerate(seq))
        cases.append((noisy, f"long: real UniProt sequence {k} with unknown letters, whitespace and masks mixed in"))
    return cases


def main():
    tok = EsmTokenizer.from_pretrained(str(HF_ESM))
    plain = EsmTokenizer(str(DATA / "vocab.txt"))
    assert tok.get_vocab() == plain.get_vocab()

    def ids(text, **kw):
        a = tok(text, **kw)["input_ids"]
        b = plain(text, **kw)["input_ids"]
        assert a == b, (text, a, b)
        return a

    fasta = read_fasta(DATA / "uniprot_sample.fasta")
    real = [fasta_sequence(r) for _, r in fasta]
    long_ones = [s for s in real if 1100 <= len(s) <= 2000][:2]
    rng = random.Random(SEED)
    cases = CASES + random_cases(rng, long_ones, {t for t, _ in CASES})
    texts = set()
    bare = []
    for text, note in cases:
        assert not text.startswith(">") and text not in texts, text
        texts.add(text)
        c = {"text": text, "note": note, "ids": ids(text)}
        why = refused(text)
        if why:
            c["refused"] = why
            bare.append(c)
            continue
        c["ids_uppercase"] = ids(fold_upper(text))
        if len(c["ids"]) > TRUNCATE_AT[0]:
            c["truncated"] = {str(n): ids(text, truncation=True, max_length=n) for n in TRUNCATE_AT
                              if len(c["ids"]) > n}
        bare.append(c)

    made = [
        (">run_across_lines\nmkJJ\nJJt\n", "an unknown run continues across a line break"),
        (">spaces_inside\nMK J J T\n", "blanks inside lines are layout: JJ is one run"),
        (">written_unk\nJ<unk>J\n", "a written-out <unk> cuts the run"),
        (">mask_crlf\r\nMK<mask>\r\nJJ\r\nmkt*\r\n", "CRLF, a mask, runs, a stop"),
        (">lower_wrapped some description\nmktayiakqr\nqisfvkshfs\nrq\n", "a lower-case record wrapped"),
        (">rare\nXBUZOxbuzo\n", "rare letters, upper and lower case"),
        (">gaps\nm.k-t\n--..\n", "gaps cut lower-case runs"),
        (">no_newline\nMKJ", "no final newline"),
    ]
    records = [(h[1:].split()[0] if h[1:].split() else "", r, "messy.fasta") for h, r in read_fasta(DATA / "messy.fasta")]
    records += [(r[1:].split()[0], r, note) for r, note in made]
    fasta_cases = []
    for name, record, note in records:
        seq = fasta_sequence(record)
        fasta_cases.append({"name": name, "record": record, "note": note, "sequence": seq, "ids": ids(seq),
                            "ids_uppercase": ids(fold_upper(seq))})

    versions = {"python": platform.python_version(), "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__}
    doc = {
        "made_by": "tools/reference/make_esm_tokenizer_fixtures.py",
        "tokenizer": "EsmTokenizer.from_pretrained(tests/data/hf/esm/model), the same ids as "
                     "EsmTokenizer(tests/data/protein/vocab.txt)",
        "versions": versions, "seed": SEED,
        "bare": "ids = EsmTokenizer(text)['input_ids']; ids_uppercase = the same on the text with ASCII a-z made "
                "upper case outside <cls> <pad> <eos> <unk> <null_1> <mask>; truncated[n] = EsmTokenizer(text, "
                "truncation=True, max_length=n) for each n the ids exceed; refused = a fragment of the message with "
                "which the protein plugin refuses the text (a character no protein sequence holds), where it does",
        "fasta": "ids = EsmTokenizer(sequence) where sequence = the lines after the header joined, spaces, tabs, "
                 "CR, VT, FF and line breaks dropped, one final '*' dropped, letters as written",
        "cases": bare,
        "fasta_records": fasta_cases,
    }
    # One case a line, so that a change shows as the lines of the cases it touches.
    def compact(v):
        return json.dumps(v, ensure_ascii=True, separators=(",", ":"))

    lines = ["{"]
    for k, v in doc.items():
        if isinstance(v, list):
            lines.append(f"{compact(k)}:[")
            lines.append(",\n".join(compact(c) for c in v))
            lines.append("]" + ("," if k != "fasta_records" else ""))
        else:
            lines.append(f"{compact(k)}:{compact(v)},")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == doc
    OUT.write_text(text, encoding="ascii")
    print(f"{len(bare)} bare strings, {len(fasta_cases)} FASTA records, {OUT.stat().st_size} bytes: {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
