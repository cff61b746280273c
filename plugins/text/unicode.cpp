// Unicode for the text plugin: UTF-8 decoding and lookups in the generated tables. The tables
// themselves are unicode_tables.inc; nothing here knows about tokens or vocabularies.
#include "unicode.h"

#include <algorithm>
#include <array>
#include <cstdio>

namespace tessera::text {
namespace {

#include "unicode_tables.inc"

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", b);
  return buf;
}

// The properties of the Basic Multilingual Plane, expanded once from the runs (64 KiB).
const std::array<uint8_t, 0x10000>& bmp_properties() {
  static const std::array<uint8_t, 0x10000> table = [] {
    std::array<uint8_t, 0x10000> t{};
    const size_t n = std::size(kPropStart);
    for (size_t i = 0; i < n && kPropStart[i] < 0x10000; ++i) {
      const uint32_t end = i + 1 < n ? std::min<uint32_t>(kPropStart[i + 1], 0x10000) : 0x10000;
      std::fill(t.begin() + kPropStart[i], t.begin() + end, kPropBits[i]);
    }
    return t;
  }();
  return table;
}

}  // namespace

bool decode_utf8(std::string_view text, std::vector<Char>& out, Utf8Problem* problem) {
  out.clear();
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  auto fail = [&](std::string reason) {
    if (problem) {
      problem->offset = i;
      problem->reason = std::move(reason);
    }
    return false;
  };
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      out.push_back({b, static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1)});
      ++i;
      continue;
    }
    size_t len;
    char32_t cp;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2, cp = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3, cp = b & 0x0F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4, cp = b & 0x07;
    } else if (b >= 0x80 && b <= 0xBF) {
      return fail("byte " + hex_byte(b) + " is a continuation byte where a character should start");
    } else {
      return fail("byte " + hex_byte(b) + " cannot start a character in UTF-8");
    }
    for (size_t k = 1; k < len; ++k) {
      if (i + k >= n)
        return fail("the " + std::to_string(len) + "-byte character starting with " + hex_byte(b) +
                    " is cut short by the end of the text");
      if ((s[i + k] & 0xC0) != 0x80)
        return fail("the " + std::to_string(len) + "-byte character starting with " + hex_byte(b) +
                    " is cut short: byte " + hex_byte(s[i + k]) + " is not a continuation byte");
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000))
      return fail("bytes starting with " + hex_byte(b) + " " + hex_byte(s[i + 1]) +
                  " are an overlong encoding");
    if (cp >= 0xD800 && cp <= 0xDFFF)
      return fail("bytes " + hex_byte(b) + " " + hex_byte(s[i + 1]) + " " + hex_byte(s[i + 2]) +
                  " encode a UTF-16 surrogate, which UTF-8 must not contain");
    if (cp > 0x10FFFF)
      return fail("bytes starting with " + hex_byte(b) + " " + hex_byte(s[i + 1]) +
                  " encode a value above U+10FFFF");
    out.push_back({cp, static_cast<uint32_t>(i), static_cast<uint32_t>(i + len)});
    i += len;
  }
  return true;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint8_t properties(char32_t cp) {
  if (cp < 0x10000) return bmp_properties()[cp];
  if (cp > 0x10FFFF) return 0;
  const auto* end = std::end(kPropStart);
  const auto* it = std::upper_bound(std::begin(kPropStart), end, static_cast<uint32_t>(cp));
  return kPropBits[(it - std::begin(kPropStart)) - 1];
}

bool is_cjk_ideograph(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  // Hangul syllables: L V (T), by the rule of Unicode's chapter 3.12.
  if (cp >= 0xAC00 && cp <= 0xD7A3) {
    const char32_t s = cp - 0xAC00;
    out.push_back(0x1100 + s / 588);
    out.push_back(0x1161 + (s % 588) / 28);
    if (s % 28) out.push_back(0x11A7 + s % 28);
    return;
  }
  if (cp >= 0xC0) {
    const auto* it = std::lower_bound(std::begin(kDecompCp), std::end(kDecompCp), static_cast<uint32_t>(cp));
    if (it != std::end(kDecompCp) && *it == cp) {
      const size_t i = it - std::begin(kDecompCp);
      out.insert(out.end(), kDecompPool + kDecompOffset[i], kDecompPool + kDecompOffset[i + 1]);
      return;
    }
  }
  out.push_back(cp);
}

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* it = std::lower_bound(std::begin(kCccCp), std::end(kCccCp), static_cast<uint32_t>(cp));
  return it != std::end(kCccCp) && *it == cp ? kCccValue[it - std::begin(kCccCp)] : 0;
}

void lower(char32_t cp, std::vector<char32_t>& out) {
  if (cp < 0x80) {
    out.push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  if (cp == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE: i + COMBINING DOT ABOVE (SpecialCasing.txt)
    out.push_back(0x69);
    out.push_back(0x307);
    return;
  }
  const auto* it = std::lower_bound(std::begin(kLowerCp), std::end(kLowerCp), static_cast<uint32_t>(cp));
  out.push_back(it != std::end(kLowerCp) && *it == cp ? kLowerTo[it - std::begin(kLowerCp)] : cp);
}

}  // namespace tessera::text
