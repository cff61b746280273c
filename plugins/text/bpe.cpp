// GPT-2's byte-level BPE: encoder.json (token -> id) and vocab.bpe (merges in rank order), the
// byte <-> character map, merges applied lowest rank first (as Hugging Face tokenizers does) with a
// cache of pieces already seen, and exact bytes back on decode. Pre-tokenisation is in
// pretokenize.cpp; options and length policy are the plugin's.
#include <algorithm>
#include <array>
#include <cstdio>
#include <queue>
#include <unordered_map>

#include "pretokenize.h"
#include "tessera/plugin.hpp"
#include "tokenizer.h"

namespace tessera::text {
namespace {

using tessera::plugin::fail;

constexpr const char* kEndOfText = "<|endoftext|>";

// GPT-2's bytes_to_unicode(): printable bytes stand for themselves, the other 68 for U+0100...
std::array<char32_t, 256> byte_chars() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

// A strict reader of one JSON object whose values are integers: {"token": id, ...}.
class JsonVocab {
 public:
  struct Entry {
    std::string key;
    int64_t id;
    size_t offset;  // of the key, for messages
  };
  explicit JsonVocab(const VocabFile& file) : f_(file), s_(file.data) {}

  std::vector<Entry> parse() {
    std::vector<Entry> entries;
    space();
    expect('{', "the file should be one JSON object of token -> id, like GPT-2's encoder.json");
    space();
    if (peek() == '}') {
      ++i_;
    } else {
      for (;;) {
        space();
        const size_t at = i_;
        std::string key = string();
        space();
        expect(':', "expected ':' after a key");
        space();
        const size_t value_at = i_;
        const int64_t id = integer();
        if (id < 0 || id > INT32_MAX)
          f_.fail_at_offset(value_at,
                            "the id of " + quoted(key) + " must be an integer from 0 to 2147483647");
        entries.push_back({std::move(key), id, at});
        space();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}', "expected ',' or '}' after an id");
        break;
      }
    }
    space();
    if (i_ != s_.size()) f_.fail_at_offset(i_, "unexpected text after the JSON object");
    return entries;
  }

 private:
  int peek() const { return i_ < s_.size() ? static_cast<unsigned char>(s_[i_]) : -1; }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c, const char* what) {
    if (peek() != c) f_.fail_at_offset(i_, i_ < s_.size() ? what : "the file ends inside the JSON object");
    ++i_;
  }
  unsigned hex4() {
    if (i_ + 4 > s_.size()) f_.fail_at_offset(i_, "a \\u escape needs four hex digits");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        f_.fail_at_offset(i_ - 1, "a \\u escape needs four hex digits");
    }
    return v;
  }
  std::string string() {
    const size_t start = i_;
    if (peek() != '"') f_.fail_at_offset(i_, "expected a token in double quotes");
    ++i_;
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) f_.fail_at_offset(start, "a string that never ends");
      const char c = s_[i_];
      if (c == '"') {
        ++i_;
        break;
      }
      if (static_cast<unsigned char>(c) < 0x20)
        f_.fail_at_offset(i_, "a control character inside a string (escape it)");
      if (c != '\\') {
        out += c;
        ++i_;
        continue;
      }
      const size_t esc = i_;
      if (++i_ >= s_.size()) f_.fail_at_offset(start, "a string that never ends");
      const char e = s_[i_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          char32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (i_ + 1 < s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
              i_ += 2;
              const unsigned low = hex4();
              if (low < 0xDC00 || low > 0xDFFF)
                f_.fail_at_offset(esc, "a \\u surrogate pair with a bad second half");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              f_.fail_at_offset(esc, "a \\u escape of a lone surrogate");
            }
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            f_.fail_at_offset(esc, "a \\u escape of a lone surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          f_.fail_at_offset(esc, std::string("unknown escape \\") + e);
      }
    }
    std::vector<Char> chars;
    Utf8Problem problem;
    if (!decode_utf8(out, chars, &problem))
      f_.fail_at_offset(start, "the token is not valid UTF-8: " + problem.reason);
    return out;
  }
  int64_t integer() {
    const size_t start = i_;
    if (peek() == '-') ++i_;
    if (peek() < '0' || peek() > '9') f_.fail_at_offset(start, "expected an integer id");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (s_[i_++] - '0');
      if (v > INT64_MAX / 100) f_.fail_at_offset(start, "the id is too large");
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') f_.fail_at_offset(start, "expected an integer id");
    return s_[start] == '-' ? -v : v;
  }

  const VocabFile& f_;
  const std::string& s_;
  size_t i_ = 0;
};

class Bpe final : public Tokenizer {
 public:
  Bpe(const std::string& encoder_path, const std::string& merges_path) {
    load_vocab(VocabFile::read("vocab", encoder_path));
    load_merges(VocabFile::read("merges", merges_path));
  }

  bool reads_unicode() const override { return true; }

  void encode(std::string_view text, const std::vector<Char>& chars, std::vector<Token>& out) override {
    size_t k = 0;  // the first character of the current segment
    for (const Segment& seg : split_specials(text, specials_)) {
      while (k < chars.size() && chars[k].begin < seg.begin) ++k;
      if (seg.special >= 0) {
        out.push_back({eot_, TSR_ROLE_EOS, static_cast<int64_t>(seg.begin), static_cast<int64_t>(seg.end)});
        continue;
      }
      size_t k_end = k;
      while (k_end < chars.size() && chars[k_end].begin < seg.end) ++k_end;
      pieces_.clear();
      gpt2_split(chars.data() + k, k_end - k, pieces_);
      for (const Piece& p : pieces_) {
        const size_t b0 = chars[k + p.begin].begin, b1 = chars[k + p.end - 1].end;
        const std::vector<Part>& parts = piece(text.substr(b0, b1 - b0));
        int64_t at = static_cast<int64_t>(b0);
        for (const Part& part : parts) {
          out.push_back({part.id, TSR_ROLE_CONTENT, at, at + part.bytes});
          at += part.bytes;
        }
      }
      k = k_end;
    }
  }

  std::vector<Token> prefix() const override { return {}; }
  std::vector<Token> suffix() const override { return {{eot_, TSR_ROLE_EOS}}; }
  std::string special_names() const override { return kEndOfText; }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size())
        fail(TSR_OUT_OF_RANGE, "decode: id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                   " is outside this vocabulary [0, " + std::to_string(vocab_size()) + ")");
      if (skip_special && ids[i] == eot_) continue;
      out += bytes_of_[ids[i]];
    }
    return out;
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(bytes_of_.size()); }
  int32_t pad_id() const override { return -1; }
  bool has_end_of_text() const { return eot_ >= 0; }

 private:
  struct Part {
    int32_t id;
    int32_t bytes;
  };
  struct Merge {
    uint32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void load_vocab(const VocabFile& file) {
    std::vector<JsonVocab::Entry> entries = JsonVocab(file).parse();
    if (entries.empty()) file.fail("the JSON object has no tokens");
    const int64_t n = static_cast<int64_t>(entries.size());
    std::vector<int64_t> owner(entries.size(), -1);  // id -> entry
    ids_.reserve(entries.size());
    for (size_t e = 0; e < entries.size(); ++e) {
      const JsonVocab::Entry& en = entries[e];
      if (en.id >= n)
        file.fail_at_offset(en.offset, "the id " + std::to_string(en.id) + " of " + quoted(en.key) +
                                           " is not below the number of tokens (" + std::to_string(n) +
                                           "); ids must be 0.." + std::to_string(n - 1) + ", each once");
      if (owner[en.id] >= 0)
        file.fail_at_offset(en.offset, "the id " + std::to_string(en.id) + " of " + quoted(en.key) +
                                           " is also the id of " + quoted(entries[owner[en.id]].key));
      if (!ids_.emplace(en.key, static_cast<int32_t>(en.id)).second)
        file.fail_at_offset(en.offset, "the token " + quoted(en.key) + " appears twice");
      owner[en.id] = static_cast<int64_t>(e);
    }
    // What each token stands for: its characters mapped back to bytes; a token with a character
    // outside the byte map (<|endoftext|>) stands for its own UTF-8, as Hugging Face decodes it.
    const std::array<char32_t, 256> map = byte_chars();
    std::unordered_map<char32_t, uint8_t> byte_of;
    for (int b = 0; b < 256; ++b) byte_of[map[b]] = static_cast<uint8_t>(b);
    bytes_of_.resize(entries.size());
    std::vector<Char> chars;
    for (const JsonVocab::Entry& en : entries) {
      decode_utf8(en.key, chars, nullptr);
      std::string bytes;
      bool mapped = true;
      for (const Char& c : chars) {
        const auto it = byte_of.find(c.cp);
        if (it == byte_of.end()) {
          mapped = false;
          break;
        }
        bytes += static_cast<char>(it->second);
      }
      bytes_of_[en.id] = mapped ? bytes : en.key;
    }
    for (int b = 0; b < 256; ++b) {
      std::string key;
      append_utf8(key, map[b]);
      const auto it = ids_.find(key);
      if (it == ids_.end()) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        file.fail(std::string("no token for byte ") + hex + " (written " + quoted(key) +
                  "); a byte-level BPE vocabulary has one for each of the 256 bytes");
      }
      byte_id_[b] = it->second;
    }
    const auto eot = ids_.find(kEndOfText);
    if (eot != ids_.end()) {
      eot_ = eot->second;
      specials_ = {kEndOfText};
    }
  }

  void load_merges(const VocabFile& file) {
    uint32_t rank = 0;
    merges_.reserve(static_cast<size_t>(std::count(file.data.begin(), file.data.end(), '\n')) + 1);
    file.for_each_line([&](size_t line_no, std::string_view line, size_t) {
      if (line_no == 1 && line.substr(0, 8) == "#version") return;
      decode_line(file, line_no, line);
      const size_t space = line.find(' ');
      if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string_view::npos)
        file.fail_at(line_no, 1, "a merge is two tokens separated by one space, not " + quoted(line));
      const std::string a(line.substr(0, space)), b(line.substr(space + 1));
      const auto ia = ids_.find(a), ib = ids_.find(b), iab = ids_.find(a + b);
      if (ia == ids_.end()) file.fail_at(line_no, 1, quoted(a) + " is not a token of the vocabulary (vocab)");
      if (ib == ids_.end())
        file.fail_at(line_no, space + 2, quoted(b) + " is not a token of the vocabulary (vocab)");
      if (iab == ids_.end())
        file.fail_at(line_no, 1,
                     "merging " + quoted(a) + " and " + quoted(b) + " gives " + quoted(a + b) +
                         ", which is not a token of the vocabulary (vocab)");
      merges_[pair_key(ia->second, ib->second)] = {rank++,
                                                   iab->second};  // a repeated pair: the last rank counts
    });
    if (rank == 0) file.fail("no merges in the file");
  }

  // The BPE of one pre-token's bytes, from the cache when it was seen before.
  const std::vector<Part>& piece(std::string_view bytes) {
    if (bytes.size() <= kCachedBytes) {
      const auto it = cache_.find(std::string(bytes));
      if (it != cache_.end()) return it->second;
    }
    std::vector<Part>& parts = bytes.size() <= kCachedBytes ? cache_slot(bytes) : scratch_;
    merge(bytes, parts);
    return parts;
  }

  static constexpr size_t kCachedBytes = 64;
  static constexpr size_t kCacheEntries = 1 << 16;
  std::vector<Part>& cache_slot(std::string_view bytes) {
    if (cache_.size() >= kCacheEntries) cache_.clear();
    return cache_[std::string(bytes)];
  }

  // Merges the pair of lowest rank (then leftmost) until none applies, with a heap of candidate
  // pairs; a popped pair whose symbols have changed since it was pushed is skipped.
  void merge(std::string_view bytes, std::vector<Part>& parts) const {
    struct Symbol {
      int32_t id;
      int32_t bytes;
      int32_t prev, next;
    };
    struct Candidate {
      uint32_t rank;
      int32_t pos;
      int32_t id;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    const int32_t n = static_cast<int32_t>(bytes.size());
    std::vector<Symbol> sym(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i)
      sym[i] = {byte_id_[static_cast<uint8_t>(bytes[i])], 1, i - 1, i + 1 < n ? i + 1 : -1};
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto push = [&](int32_t pos) {
      const int32_t next = sym[pos].next;
      if (next < 0) return;
      const auto it = merges_.find(pair_key(sym[pos].id, sym[next].id));
      if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.id});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const Candidate top = heap.top();
      heap.pop();
      Symbol& left = sym[top.pos];
      if (left.bytes == 0 || left.next < 0) continue;
      Symbol& right = sym[left.next];
      const auto it = merges_.find(pair_key(left.id, right.id));
      if (it == merges_.end() || it->second.id != top.id) continue;
      left.id = top.id;
      left.bytes += right.bytes;
      right.bytes = 0;
      left.next = right.next;
      if (left.next >= 0) sym[left.next].prev = top.pos;
      if (left.prev >= 0) push(left.prev);
      push(top.pos);
    }
    parts.clear();
    for (int32_t i = 0; i >= 0 && i < n; i = sym[i].next) parts.push_back({sym[i].id, sym[i].bytes});
  }

  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> bytes_of_;  // id -> the bytes it stands for
  int32_t byte_id_[256] = {};
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t eot_ = -1;
  std::vector<std::string> specials_;
  std::unordered_map<std::string, std::vector<Part>> cache_;
  std::vector<Part> scratch_;
  std::vector<Piece> pieces_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const std::string& encoder_json, const std::string& merges) {
  return std::make_unique<Bpe>(encoder_json, merges);
}

}  // namespace tessera::text
