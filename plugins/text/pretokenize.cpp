// GPT-2's pre-tokenisation regex, written out as a scanner, and BERT's basic tokenizer, over
// decoded characters with byte spans. The Unicode classes come from unicode.h.
#include "pretokenize.h"

#include <algorithm>

namespace tessera::text {
namespace {

enum class Gpt2Class { letter, number, space, other };

Gpt2Class gpt2_class(char32_t cp) {
  const uint8_t p = properties(cp);
  if (p & kGpt2Letter) return Gpt2Class::letter;
  if (p & kGpt2Number) return Gpt2Class::number;
  if (p & kWhiteSpace) return Gpt2Class::space;
  return Gpt2Class::other;
}

// The length of GPT-2's contraction at chars[i] ('s 't 're 've 'm 'll 'd, lower case only), or 0.
size_t contraction(const Char* c, size_t i, size_t n) {
  if (c[i].cp != '\'' || i + 1 >= n) return 0;
  const char32_t a = c[i + 1].cp;
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= n) return 0;
  const char32_t b = c[i + 2].cp;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

void gpt2_split(const Char* c, size_t n, std::vector<Piece>& pieces) {
  size_t i = 0;
  while (i < n) {
    if (const size_t len = contraction(c, i, n)) {
      pieces.push_back({i, i + len});
      i += len;
      continue;
    }
    // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional space, then a run of one class.
    const size_t start = c[i].cp == ' ' ? i + 1 : i;
    if (start < n) {
      const Gpt2Class k = gpt2_class(c[start].cp);
      if (k != Gpt2Class::space) {
        size_t j = start + 1;
        while (j < n && gpt2_class(c[j].cp) == k) ++j;
        pieces.push_back({i, j});
        i = j;
        continue;
      }
    }
    // "\s+(?!\S)|\s+": a whitespace run; when text follows, its last space goes with that text.
    size_t j = i + 1;
    while (j < n && gpt2_class(c[j].cp) == Gpt2Class::space) ++j;
    if (j < n && j - i >= 2) --j;
    pieces.push_back({i, j});
    i = j;
  }
}

void bert_normalize(const Char* c, size_t n, const BertOptions& o, std::vector<Char>& out) {
  // Clean-up and CJK spacing.
  std::vector<Char> stage;
  stage.reserve(n + 8);
  for (size_t i = 0; i < n; ++i) {
    const char32_t cp = c[i].cp;
    const uint8_t p = properties(cp);
    if (cp == '\t' || cp == '\n' || cp == '\r') {
      stage.push_back({' ', c[i].begin, c[i].end});
    } else if (cp == 0 || cp == 0xFFFD || (p & kBertControl)) {
      continue;
    } else if (p & kWhiteSpace) {
      stage.push_back({' ', c[i].begin, c[i].end});
    } else if (o.cjk_spacing && is_cjk_ideograph(cp)) {
      stage.push_back({' ', c[i].begin, c[i].end});
      stage.push_back(c[i]);
      stage.push_back({' ', c[i].begin, c[i].end});
    } else {
      stage.push_back(c[i]);
    }
  }
  // Accent stripping: NFD (full decomposition, then stable sort of each run of combining marks by
  // combining class), then drop non-spacing marks.
  if (o.strip_accents) {
    std::vector<Char> nfd;
    nfd.reserve(stage.size() + 8);
    std::vector<char32_t> parts;
    for (const Char& ch : stage) {
      parts.clear();
      decompose(ch.cp, parts);
      for (char32_t p : parts) nfd.push_back({p, ch.begin, ch.end});
    }
    for (size_t i = 0; i < nfd.size();) {
      if (combining_class(nfd[i].cp) == 0) {
        ++i;
        continue;
      }
      size_t j = i + 1;
      while (j < nfd.size() && combining_class(nfd[j].cp) != 0) ++j;
      std::stable_sort(
          nfd.begin() + static_cast<std::ptrdiff_t>(i), nfd.begin() + static_cast<std::ptrdiff_t>(j),
          [](const Char& a, const Char& b) { return combining_class(a.cp) < combining_class(b.cp); });
      i = j;
    }
    stage.clear();
    for (const Char& ch : nfd)
      if (!(properties(ch.cp) & kBertMn)) stage.push_back(ch);
  }
  if (!o.lowercase) {
    out.insert(out.end(), stage.begin(), stage.end());
    return;
  }
  std::vector<char32_t> lowered;
  for (const Char& ch : stage) {
    lowered.clear();
    lower(ch.cp, lowered);
    for (char32_t l : lowered) out.push_back({l, ch.begin, ch.end});
  }
}

void bert_split(const std::vector<Char>& c, std::vector<Piece>& words) {
  const size_t n = c.size();
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t p = properties(c[i].cp);
    const bool space = p & kWhiteSpace;  // White_Space includes \t \n \r, as Rust's char::is_whitespace
    if (space || (p & kBertPunct)) {
      if (start < i) words.push_back({start, i});
      if (!space) words.push_back({i, i + 1});
      start = i + 1;
    }
  }
  if (start < n) words.push_back({start, n});
}

std::vector<Segment> split_specials(std::string_view text, const std::vector<std::string>& specials) {
  std::vector<Segment> out;
  bool first_byte[256] = {};
  for (const std::string& s : specials)
    if (!s.empty()) first_byte[static_cast<uint8_t>(s[0])] = true;
  size_t plain = 0;  // where the current stretch of plain text began
  for (size_t i = 0; i < text.size();) {
    if (!first_byte[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    int found = -1;
    size_t found_len = 0;
    for (size_t k = 0; k < specials.size(); ++k) {
      const std::string& s = specials[k];
      if (!s.empty() && s.size() > found_len && text.compare(i, s.size(), s) == 0) {
        found = static_cast<int>(k);
        found_len = s.size();
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    if (plain < i) out.push_back({plain, i, -1});
    out.push_back({i, i + found_len, found});
    i += found_len;
    plain = i;
  }
  if (plain < text.size()) out.push_back({plain, text.size(), -1});
  return out;
}

}  // namespace tessera::text
