#!/usr/bin/env python3
"""Generates plugins/text/unicode_tables.inc: the Unicode data the text plugin's tokenizers need.

It does not run at build time: its output is committed, so building the plugin needs no Unicode
files. Rerun it (and tools/reference/make_text_fixtures.py, which checks every code point against
Hugging Face tokenizers) only when a reference tokenizer's Unicode version changes.

Input: Debian 12's package unicode-data 15.0.0 (/usr/share/unicode: UnicodeData.txt,
DerivedAge.txt, PropList.txt, SpecialCasing.txt). Unicode License v3.

    python3 plugins/text/gen_unicode_tables.py [--ucd /usr/share/unicode] [--out plugins/text/unicode_tables.inc]

The reference tokenizers (Hugging Face tokenizers 0.19) each see Unicode as of some older version,
so each property below is the Unicode 15.0 property cut at a version, using DerivedAge.txt (a code
point assigned after the cut is unassigned, Cn, to that library):
  - GPT-2's pre-tokenisation regex runs on Oniguruma 6.9.8 (Unicode 14.0): \\p{L}, \\p{N} of code
    points assigned by 14.0; \\s is White_Space.
  - BERT's normaliser and pre-tokeniser use the Rust crate unicode_categories 0.1 (Unicode 8.0) for
    "control" (Cc, Cf, Co), punctuation (P*) and non-spacing marks (Mn); Rust's char::is_whitespace
    (White_Space) for whitespace; unicode-normalization-alignments 0.1 (Unicode 9.0) for canonical
    decomposition (NFD) and combining classes; Rust's char::to_lowercase (Unicode 15) for case.
  - Six code points assigned by Unicode 8.0 changed General_Category since then; their 8.0
    category is listed in CATEGORY_IN_8_0 below (found by comparing every code point with the
    reference tokenizer, which make_text_fixtures.py still does).
"""
import argparse
import os
import sys

# General_Category in Unicode 8.0 of the code points whose category changed between 8.0 and 15.0
# in a way that matters here (punctuation, non-spacing mark).
CATEGORY_IN_8_0 = {
    0x166D: "Po",  # CANADIAN SYLLABICS CHI SIGN: So since Unicode 12.0
    0x1734: "Mn",  # HANUNOO SIGN PAMUDPOD: Mc since Unicode 14.0
    0x1885: "Lo",  # MONGOLIAN LETTER ALI GALI BALUDA: Mn since Unicode 9.0
    0x1886: "Lo",  # MONGOLIAN LETTER ALI GALI THREE BALUDA: Mn since Unicode 9.0
    0xA9BD: "Mc",  # JAVANESE CONSONANT SIGN KERET: Mn since Unicode 12.0
    0x111C9: "Po",  # SHARADA SANDHI MARK: Mn since Unicode 11.0
}

ONIGURUMA_UNICODE = (14, 0)    # GPT-2 regex classes
CATEGORIES_UNICODE = (8, 0)    # BERT control / punctuation / Mn
NORMALIZATION_UNICODE = (9, 0)  # BERT NFD

# Property bits, as the C++ side reads them (unicode.h).
GPT2_LETTER, GPT2_NUMBER, WHITE_SPACE, BERT_CONTROL, BERT_PUNCT, BERT_MN = 1, 2, 4, 8, 16, 32
ASCII_PUNCT = set(range(33, 48)) | set(range(58, 65)) | set(range(91, 97)) | set(range(123, 127))


def _fields(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line:
                yield [x.strip() for x in line.split(";")]


def _range(text):
    parts = text.split("..")
    return int(parts[0], 16), int(parts[-1], 16)


class Ucd:
    """The Unicode 15.0 data this generator needs, and the reference tokenizers' view of it."""

    def __init__(self, ucd_dir):
        self.category, self.ccc, self.decomposition, self.lower = {}, {}, {}, {}
        first = None
        with open(os.path.join(ucd_dir, "UnicodeData.txt"), encoding="utf-8") as f:
            for line in f:
                fld = line.rstrip("\n").split(";")
                cp = int(fld[0], 16)
                if fld[1].endswith(", First>"):
                    first = cp
                    continue
                for c in range(first if fld[1].endswith(", Last>") else cp, cp + 1):
                    self.category[c] = fld[2]
                if fld[3] != "0":
                    self.ccc[cp] = int(fld[3])
                if fld[5] and not fld[5].startswith("<"):
                    self.decomposition[cp] = [int(x, 16) for x in fld[5].split()]
                if fld[13]:
                    self.lower[cp] = [int(fld[13], 16)]
        self.age = {}
        for f in _fields(os.path.join(ucd_dir, "DerivedAge.txt")):
            a, b = _range(f[0])
            version = tuple(int(x) for x in f[1].split("."))
            for c in range(a, b + 1):
                self.age[c] = version
        self.white_space = set()
        for f in _fields(os.path.join(ucd_dir, "PropList.txt")):
            if f[1] == "White_Space":
                a, b = _range(f[0])
                self.white_space.update(range(a, b + 1))
        for f in _fields(os.path.join(ucd_dir, "SpecialCasing.txt")):
            if len(f) >= 5 and f[4]:
                continue  # conditional mappings (final sigma, Lithuanian, Turkish): char::to_lowercase has none
            self.lower[int(f[0], 16)] = [int(x, 16) for x in f[1].split()]

    def assigned_by(self, cp, version):
        return self.age.get(cp, (99,)) <= version

    def category_at(self, cp, version):
        """General_Category as a library built on Unicode `version` sees it."""
        if not self.assigned_by(cp, version):
            return "Cn"
        if version <= (8, 0) and cp in CATEGORY_IN_8_0:
            return CATEGORY_IN_8_0[cp]
        return self.category.get(cp, "Cn")

    def props(self, cp):
        p = 0
        oni = self.category_at(cp, ONIGURUMA_UNICODE)
        if oni[0] == "L":
            p |= GPT2_LETTER
        if oni[0] == "N":
            p |= GPT2_NUMBER
        if cp in self.white_space:
            p |= WHITE_SPACE
        old = self.category_at(cp, CATEGORIES_UNICODE)
        if old in ("Cc", "Cf", "Co"):
            p |= BERT_CONTROL
        if old[0] == "P" or cp in ASCII_PUNCT:
            p |= BERT_PUNCT
        if old == "Mn":
            p |= BERT_MN
        return p

    def nfd(self, cp):
        """Full canonical decomposition of one code point (Hangul syllables algorithmically)."""
        if 0xAC00 <= cp <= 0xD7A3:
            s = cp - 0xAC00
            t = 0x11A7 + s % 28
            return [0x1100 + s // 588, 0x1161 + (s % 588) // 28] + ([t] if t != 0x11A7 else [])
        if cp in self.decomposition and self.assigned_by(cp, NORMALIZATION_UNICODE):
            return [x for part in self.decomposition[cp] for x in self.nfd(part)]
        return [cp]

    def combining_class(self, cp):
        return self.ccc.get(cp, 0) if self.assigned_by(cp, NORMALIZATION_UNICODE) else 0


def _hex_list(values, per_line, width=0):
    items = [f"0x{v:0{width}X}" if width else str(v) for v in values]
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return "\n".join("    " + line + "," for line in lines)


def generate(ucd):
    # Property runs: a new range wherever the bits change.
    starts, bits = [], []
    prev = None
    for cp in range(0x110000):
        p = ucd.props(cp)
        if p != prev:
            starts.append(cp)
            bits.append(p)
            prev = p
    decomp_cps, decomp_offsets, decomp_pool = [], [], []
    for cp in sorted(ucd.decomposition):
        if not ucd.assigned_by(cp, NORMALIZATION_UNICODE):
            continue
        seq = ucd.nfd(cp)
        decomp_cps.append(cp)
        decomp_offsets.append(len(decomp_pool))
        decomp_pool.extend(seq)
    decomp_offsets.append(len(decomp_pool))
    ccc = sorted((cp, c) for cp, c in ucd.ccc.items() if ucd.assigned_by(cp, NORMALIZATION_UNICODE))
    simple_lower = sorted((cp, v[0]) for cp, v in ucd.lower.items() if len(v) == 1 and v[0] != cp)
    special_lower = sorted((cp, v) for cp, v in ucd.lower.items() if len(v) > 1)
    assert len(special_lower) == 1 and special_lower[0][0] == 0x130, special_lower
    assert max(decomp_offsets) < 65536

    out = []
    out.append("// unicode_tables.inc — generated by plugins/text/gen_unicode_tables.py from Debian unicode-data\n"
               "// 15.0.0 (Unicode License v3); do not edit. Read only through unicode.h; see the generator for\n"
               "// which Unicode version each property is cut at, to match the reference tokenizers.\n")
    out.append(f"// Property runs: kPropBits[i] holds for code points [kPropStart[i], kPropStart[i + 1]).\n"
               f"inline constexpr uint32_t kPropStart[{len(starts)}] = {{\n{_hex_list(starts, 10, 4)}\n}};\n")
    out.append(f"inline constexpr uint8_t kPropBits[{len(bits)}] = {{\n{_hex_list(bits, 24)}\n}};\n")
    out.append(f"// Canonical full decompositions (Unicode 9.0): code point kDecompCp[i] -> kDecompPool[kDecompOffset[i]\n"
               f"// .. kDecompOffset[i + 1]). Hangul syllables are decomposed by rule, not listed.\n"
               f"inline constexpr uint32_t kDecompCp[{len(decomp_cps)}] = {{\n{_hex_list(decomp_cps, 10, 4)}\n}};\n")
    out.append(f"inline constexpr uint16_t kDecompOffset[{len(decomp_offsets)}] = {{\n{_hex_list(decomp_offsets, 16)}\n}};\n")
    out.append(f"inline constexpr uint32_t kDecompPool[{len(decomp_pool)}] = {{\n{_hex_list(decomp_pool, 10, 4)}\n}};\n")
    out.append(f"// Canonical combining classes other than 0 (Unicode 9.0).\n"
               f"inline constexpr uint32_t kCccCp[{len(ccc)}] = {{\n{_hex_list([c for c, _ in ccc], 10, 4)}\n}};\n")
    out.append(f"inline constexpr uint8_t kCccValue[{len(ccc)}] = {{\n{_hex_list([v for _, v in ccc], 24)}\n}};\n")
    out.append(f"// Simple lower-case mappings (Unicode 15.0); U+0130 lowers to two code points, by rule.\n"
               f"inline constexpr uint32_t kLowerCp[{len(simple_lower)}] = {{\n{_hex_list([c for c, _ in simple_lower], 10, 4)}\n}};\n")
    out.append(f"inline constexpr uint32_t kLowerTo[{len(simple_lower)}] = {{\n{_hex_list([v for _, v in simple_lower], 10, 4)}\n}};\n")
    return "\n".join(out)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ucd", default="/usr/share/unicode")
    ap.add_argument("--out", default=os.path.join(here, "unicode_tables.inc"))
    args = ap.parse_args()
    text = generate(Ucd(args.ucd))
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out} ({len(text)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
