// The one interface the text plugin's four tokenizers (bytes, chars, bpe, wordpiece) share, and
// the reading of their vocabulary files with errors that name file:line:col. Options, length
// policy and the plugin ABI live in text_plugin.cpp, not here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/plugin.h"
#include "unicode.h"

namespace tessera::text {

// One row: an id, its role, and the bytes [begin, end) of the item it stands for (begin < 0: none).
struct Token {
  int32_t id;
  tsr_role role;
  int64_t begin = -1, end = -1;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Whether encode() needs the text decoded (all but bytes).
  virtual bool reads_unicode() const = 0;
  // The rows of the text itself: content, and special tokens written in it. `chars` is the decoded
  // text when reads_unicode(), else empty.
  virtual void encode(std::string_view text, const std::vector<Char>& chars, std::vector<Token>& out) = 0;
  // The rows add_special puts before and after the text; their names for messages ("[CLS] and [SEP]").
  virtual std::vector<Token> prefix() const = 0;
  virtual std::vector<Token> suffix() const = 0;
  virtual std::string special_names() const = 0;
  // Ids back to text. Fails (TSR_OUT_OF_RANGE) on an id outside the vocabulary.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t pad_id() const = 0;  // -1: none
  virtual int32_t mask_id() const { return -1; }  // the mask token (WordPiece's [MASK]); -1: none
};

// The tokenizers, each checking its files (errors carry the option that named the file).
std::unique_ptr<Tokenizer> make_bytes_tokenizer();
std::unique_ptr<Tokenizer> make_chars_tokenizer(const std::string& vocab_path);
std::unique_ptr<Tokenizer> make_bpe_tokenizer(const std::string& encoder_json, const std::string& merges);
struct BertOptions;
std::unique_ptr<Tokenizer> make_wordpiece_tokenizer(const std::string& vocab_txt, const BertOptions& options);

// A vocabulary file, read whole; its failures name the option and the path.
struct VocabFile {
  std::string option;  // "vocab", "merges"
  std::string path;
  std::string data;
  static constexpr uint64_t kMaxBytes = uint64_t{64} << 20;  // 64 MiB, checked before reading
  static VocabFile read(const std::string& option, const std::string& path);
  // Calls f(line number from 1, the line without "\n" or "\r\n", its byte offset) for each line.
  void for_each_line(const std::function<void(size_t, std::string_view, size_t)>& f) const;
  // Fails with "path:line:col: what" (col from 1, in bytes) and the option set.
  [[noreturn]] void fail_at(size_t line, size_t col, const std::string& what) const;
  [[noreturn]] void fail_at_offset(size_t offset,
                                   const std::string& what) const;  // line:col from a byte offset
  [[noreturn]] void fail(const std::string& what) const;            // "path: what"
};

// Decodes one line of a vocabulary file, failing at its line:col when it is not UTF-8.
std::vector<Char> decode_line(const VocabFile& file, size_t line_no, std::string_view line);
// "\"text\"" with control characters and quotes escaped, for messages.
std::string quoted(std::string_view text);

}  // namespace tessera::text
