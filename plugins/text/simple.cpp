// The two tokenizers without merges: bytes (one id per byte) and chars (one id per character of a
// vocabulary file). Id layout: content ids first, then the specials:
//   bytes: 0..255 the byte value, 256 BOS, 257 EOS, 258 PAD                (vocabulary 259)
//   chars: 0..N-1 the file's N characters in line order, N UNK, N+1 BOS, N+2 EOS, N+3 PAD
#include <unordered_map>

#include "tessera/plugin.hpp"
#include "tokenizer.h"

namespace tessera::text {
namespace {

using tessera::plugin::fail;

[[noreturn]] void bad_id(int32_t id, size_t position, int64_t vocab_size) {
  fail(TSR_OUT_OF_RANGE, "decode: id " + std::to_string(id) + " at position " + std::to_string(position) +
                             " is outside this vocabulary [0, " + std::to_string(vocab_size) + ")");
}

class Bytes final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256, kEos = 257, kPad = 258;
  bool reads_unicode() const override { return false; }
  void encode(std::string_view text, const std::vector<Char>&, std::vector<Token>& out) override {
    for (size_t i = 0; i < text.size(); ++i)
      out.push_back({static_cast<uint8_t>(text[i]), TSR_ROLE_CONTENT, static_cast<int64_t>(i),
                     static_cast<int64_t>(i + 1)});
  }
  std::vector<Token> prefix() const override { return {{kBos, TSR_ROLE_BOS}}; }
  std::vector<Token> suffix() const override { return {{kEos, TSR_ROLE_EOS}}; }
  std::string special_names() const override { return "BOS and EOS"; }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] > kPad) bad_id(ids[i], i, vocab_size());
      if (ids[i] < 256) out += static_cast<char>(ids[i]);
    }
    return out;
  }
  int64_t vocab_size() const override { return 259; }
  int32_t pad_id() const override { return kPad; }
};

class Chars final : public Tokenizer {
 public:
  explicit Chars(const std::string& path) {
    const VocabFile file = VocabFile::read("vocab", path);
    std::unordered_map<char32_t, size_t> first_line;
    file.for_each_line([&](size_t line_no, std::string_view line, size_t) {
      const std::vector<Char> chars = decode_line(file, line_no, line);
      if (chars.size() != 1)
        file.fail_at(line_no, 1,
                     chars.empty() ? std::string("an empty line; each line holds exactly one character")
                                   : "the line " + quoted(line) + " holds " + std::to_string(chars.size()) +
                                         " characters; each line holds exactly one");
      const auto [it, fresh] = first_line.emplace(chars[0].cp, line_no);
      if (!fresh)
        file.fail_at(line_no, 1,
                     "the character " + quoted(line) + " is already on line " + std::to_string(it->second));
      ids_.emplace(chars[0].cp, static_cast<int32_t>(chars_.size()));
      chars_.push_back(chars[0].cp);
    });
    unk_ = static_cast<int32_t>(chars_.size());
  }
  bool reads_unicode() const override { return true; }
  void encode(std::string_view, const std::vector<Char>& chars, std::vector<Token>& out) override {
    for (const Char& c : chars) {
      const auto it = ids_.find(c.cp);
      if (it != ids_.end())
        out.push_back({it->second, TSR_ROLE_CONTENT, c.begin, c.end});
      else
        out.push_back({unk_, TSR_ROLE_UNK, c.begin, c.end});
    }
  }
  std::vector<Token> prefix() const override { return {{unk_ + 1, TSR_ROLE_BOS}}; }
  std::vector<Token> suffix() const override { return {{unk_ + 2, TSR_ROLE_EOS}}; }
  std::string special_names() const override { return "BOS and EOS"; }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size()) bad_id(ids[i], i, vocab_size());
      if (ids[i] < unk_)
        append_utf8(out, chars_[ids[i]]);
      else if (ids[i] == unk_)
        append_utf8(out, 0xFFFD);  // the character is gone: REPLACEMENT CHARACTER
    }
    return out;
  }
  int64_t vocab_size() const override { return unk_ + 4; }
  int32_t pad_id() const override { return unk_ + 3; }

 private:
  std::vector<char32_t> chars_;
  std::unordered_map<char32_t, int32_t> ids_;
  int32_t unk_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bytes_tokenizer() { return std::make_unique<Bytes>(); }
std::unique_ptr<Tokenizer> make_chars_tokenizer(const std::string& vocab_path) {
  return std::make_unique<Chars>(vocab_path);
}

}  // namespace tessera::text
