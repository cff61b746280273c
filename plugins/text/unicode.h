// Unicode for the text plugin: strict UTF-8 decoding with the reason a byte is wrong, and the
// character properties, canonical decomposition and lower-casing its tokenizers need, read from
// tables generated out of Debian's unicode-data (gen_unicode_tables.py). No normalisation forms
// beyond NFD, no locale rules, no grapheme clusters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::text {

// One character of a text and the bytes it came from in the item: [begin, end).
struct Char {
  char32_t cp;
  uint32_t begin, end;
};

// Where and why a text is not valid UTF-8.
struct Utf8Problem {
  size_t offset = 0;   // the first byte of the bad sequence
  std::string reason;  // "byte 0xFF cannot start a character", ...
};

// Decodes UTF-8 strictly (no overlong forms, surrogates or code points above U+10FFFF). On success
// fills `out` and returns true; else fills `problem` and returns false.
bool decode_utf8(std::string_view text, std::vector<Char>& out, Utf8Problem* problem);
void append_utf8(std::string& out, char32_t cp);

// Property bits, as gen_unicode_tables.py writes them.
enum : uint8_t {
  kGpt2Letter = 1,   // \p{L} to GPT-2's regex (Oniguruma, Unicode 14.0)
  kGpt2Number = 2,   // \p{N} to GPT-2's regex
  kWhiteSpace = 4,   // White_Space: \s, Rust's char::is_whitespace
  kBertControl = 8,  // Cc, Cf, Co to BERT (Unicode 8.0)
  kBertPunct = 16,   // P* or ASCII punctuation to BERT (Unicode 8.0)
  kBertMn = 32,      // non-spacing mark to BERT (Unicode 8.0)
};
uint8_t properties(char32_t cp);

// BERT's "Chinese character": the CJK Unified Ideographs blocks and their extensions A-E and
// compatibility blocks, as BERT's tokenizer lists them.
bool is_cjk_ideograph(char32_t cp);

// Appends the full canonical decomposition of cp (itself when it has none; Hangul by rule).
void decompose(char32_t cp, std::vector<char32_t>& out);
// Canonical combining class (0 for starters).
uint8_t combining_class(char32_t cp);
// Appends the full lower-case mapping of cp, as Rust's char::to_lowercase (no context rules).
void lower(char32_t cp, std::vector<char32_t>& out);

}  // namespace tessera::text
