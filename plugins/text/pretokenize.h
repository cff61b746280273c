// How the two reference tokenizers cut text before their vocabularies see it: GPT-2's
// pre-tokenisation regex, BERT's basic tokenizer (clean-up, CJK spacing, accent stripping,
// lower-casing, whitespace and punctuation splits), and the split of a text at special tokens
// written in it. Every character keeps the byte span it came from. No vocabulary lookups here.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "unicode.h"

namespace tessera::text {

// A piece of a character sequence: characters [begin, end).
struct Piece {
  size_t begin, end;
};

// GPT-2's pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ with
// Oniguruma's leftmost-first semantics, over chars[0, n). The pieces tile the input.
void gpt2_split(const Char* chars, size_t n, std::vector<Piece>& pieces);

struct BertOptions {
  bool lowercase = true;
  bool strip_accents = true;
  bool cjk_spacing = true;
};

// BERT's normaliser: drops NUL, U+FFFD and control characters, turns whitespace into spaces, puts
// spaces around CJK ideographs, then (strip_accents) decomposes canonically and drops non-spacing
// marks, then (lowercase) lower-cases. Appends to `out`; each character keeps its source's span.
void bert_normalize(const Char* chars, size_t n, const BertOptions& options, std::vector<Char>& out);
// BERT's pre-tokeniser: words split at whitespace (dropped) and at punctuation (kept, one per piece).
void bert_split(const std::vector<Char>& chars, std::vector<Piece>& words);

// A stretch of raw text: plain text, or special token number `special` written in it.
struct Segment {
  size_t begin, end;  // bytes
  int special;        // index into the specials list, or -1
};
// Splits `text` at every occurrence of the special tokens (leftmost first; the longest when
// several start at one place), as Hugging Face's added vocabulary does.
std::vector<Segment> split_specials(std::string_view text, const std::vector<std::string>& specials);

}  // namespace tessera::text
