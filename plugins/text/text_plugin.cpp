// The text modality plugin: one line of text in, id rows out, through one of four tokenizers
// (bytes, chars, GPT-2 byte-level BPE, BERT WordPiece). This file holds the options, the length
// policy, the special rows and the messages for bad items; the tokenizers live in their own files.
#include <algorithm>

#include "pretokenize.h"
#include "tessera/plugin.hpp"
#include "tokenizer.h"

namespace tessera::text {
namespace {

using tessera::plugin::fail;
using tessera::plugin::Item;
using tessera::plugin::Options;
using tessera::plugin::Sequence;

// An option of the form auto|true|false: auto means the tokenizer's own default.
bool tri_state(const Options& o, const std::string& name, bool auto_value) {
  const std::string& v = o.get_string(name);
  if (v == "auto") return auto_value;
  if (v == "true" || v == "false") return v == "true";
  fail(TSR_INVALID_ARGUMENT, "\"" + v + "\" is not one of auto, true, false", name);
}

class TextPlugin {
 public:
  explicit TextPlugin(const Options& o) : kind_(o.get_string("tokenizer")) {
    const std::string vocab = o.get_string("vocab"), merges = o.get_string("merges");
    const bool wordpiece = kind_ == "wordpiece";
    if (kind_ != "bytes" && kind_ != "chars" && kind_ != "bpe" && !wordpiece)
      fail(TSR_INVALID_ARGUMENT, "\"" + kind_ + "\" is not one of bytes, chars, bpe, wordpiece", "tokenizer");
    if (kind_ == "bytes" && !vocab.empty())
      fail(TSR_INVALID_ARGUMENT,
           "tokenizer bytes reads no vocabulary; remove vocab or choose chars, bpe or wordpiece", "vocab");
    if (kind_ != "bytes" && vocab.empty())
      fail(TSR_INVALID_ARGUMENT, "tokenizer " + kind_ + " needs vocab: " + vocab_meaning(), "vocab");
    if (kind_ == "bpe" && merges.empty())
      fail(TSR_INVALID_ARGUMENT, "tokenizer bpe needs merges: the path of GPT-2's vocab.bpe", "merges");
    if (kind_ != "bpe" && !merges.empty())
      fail(TSR_INVALID_ARGUMENT, "only tokenizer bpe reads merges; remove it for tokenizer " + kind_,
           "merges");

    BertOptions bert;
    bert.lowercase = tri_state(o, "lowercase", wordpiece);
    bert.strip_accents = tri_state(o, "strip_accents", bert.lowercase);
    if (!wordpiece && o.get_string("lowercase") == "true")
      fail(TSR_INVALID_ARGUMENT,
           "only tokenizer wordpiece lower-cases; " + kind_ + " keeps the text as it is (use auto or false)",
           "lowercase");
    if (!wordpiece && o.get_string("strip_accents") == "true")
      fail(TSR_INVALID_ARGUMENT,
           "only tokenizer wordpiece strips accents (use auto or false for " + kind_ + ")", "strip_accents");
    add_special_ = tri_state(o, "add_special", wordpiece);
    skip_special_ = o.get_bool("skip_special_tokens");
    max_length_ = o.get_int("max_length");
    if (max_length_ < 0 || max_length_ > INT32_MAX)
      fail(TSR_INVALID_ARGUMENT,
           std::to_string(max_length_) + " is not a length: use 0 for no limit, or up to 2147483647",
           "max_length");
    const std::string& policy = o.get_string("length_policy");
    if (policy != "error" && policy != "truncate")
      fail(TSR_INVALID_ARGUMENT, "\"" + policy + "\" is not one of error, truncate", "length_policy");
    truncate_ = policy == "truncate";
    // An option added after 1.0.0: a host that does not pass it gets the default.
    max_bytes_ = o.has("max_bytes") ? o.get_int("max_bytes") : kDefaultMaxBytes;
    if (max_bytes_ < 0)
      fail(TSR_INVALID_ARGUMENT, std::to_string(max_bytes_) + " is not a size: use 0 for no limit, or bytes",
           "max_bytes");

    if (kind_ == "bytes")
      tokenizer_ = make_bytes_tokenizer();
    else if (kind_ == "chars")
      tokenizer_ = make_chars_tokenizer(vocab);
    else if (kind_ == "bpe")
      tokenizer_ = make_bpe_tokenizer(vocab, merges);
    else
      tokenizer_ = make_wordpiece_tokenizer(vocab, bert);

    if (add_special_) {
      prefix_ = tokenizer_->prefix();
      suffix_ = tokenizer_->suffix();
      for (const Token& t : prefix_)
        if (t.id < 0)
          fail(TSR_INVALID_ARGUMENT, vocab + " has no " + tokenizer_->special_names() + " for add_special",
               "add_special");
      for (const Token& t : suffix_)
        if (t.id < 0)
          fail(TSR_INVALID_ARGUMENT, vocab + " has no " + tokenizer_->special_names() + " for add_special",
               "add_special");
    }
    const int64_t n_special = static_cast<int64_t>(prefix_.size() + suffix_.size());
    if (max_length_ > 0 && max_length_ < std::max<int64_t>(n_special, 1))
      fail(TSR_INVALID_ARGUMENT,
           "max_length " + std::to_string(max_length_) + " leaves no room for " +
               tokenizer_->special_names() + "; use at least " + std::to_string(n_special) +
               ", or 0 for no limit",
           "max_length");
  }

  tsr_encoder_info describe() const {
    tsr_encoder_info i{};
    i.rows_kind = TSR_ROWS_IDS;
    i.vocab_size = tokenizer_->vocab_size();
    i.causal = kind_ == "wordpiece" ? 0 : 1;  // BERT reads both ways; GPT-2 and byte/char models left to right
    i.pad_id = tokenizer_->pad_id();
    i.max_rows = max_length_;
    i.mask_id = tokenizer_->mask_id();
    i.has_mask = i.mask_id >= 0 ? 1 : 0;
    return i;
  }

  std::vector<Sequence> encode(const Item& item) {
    const std::string_view text = item.text();
    // Before anything is allocated: tokenizing takes about 90 bytes per byte of text (the
    // characters, the tokens, then the rows), so a 64 MiB line would need ~6 GB.
    if (max_bytes_ > 0 && text.size() > static_cast<uint64_t>(max_bytes_))
      fail(TSR_BAD_INPUT, std::string(item.id) + ": " + std::to_string(text.size()) +
                                 " bytes of text, more than max_bytes " + std::to_string(max_bytes_) +
                                 " (the text plugin's limit on one item): split the text into smaller items "
                                 "(lines), or raise max_bytes (0: no limit)");
    chars_.clear();
    if (tokenizer_->reads_unicode()) {
      Utf8Problem problem;
      if (!decode_utf8(text, chars_, &problem))
        fail(TSR_BAD_INPUT, std::string(item.id) + ": invalid UTF-8 at " + place(item, problem.offset) +
                                ": " + problem.reason + "; tokenizer " + kind_ +
                                " reads UTF-8 text: convert the input (e.g. iconv -f latin1 -t utf-8) or use "
                                "tokenizer: bytes");
    }
    content_.clear();
    tokenizer_->encode(text, chars_, content_);
    const size_t n_special = prefix_.size() + suffix_.size();
    if (max_length_ > 0 && content_.size() + n_special > static_cast<size_t>(max_length_)) {
      const size_t keep = static_cast<size_t>(max_length_) - n_special;
      if (!truncate_) {
        const std::string with = n_special ? " with " + tokenizer_->special_names() : "";
        fail(TSR_BAD_INPUT,
             std::string(item.id) + ": " + std::to_string(content_.size() + n_special) + " tokens" + with +
                 " are more than max_length " + std::to_string(max_length_) + "; the text from " +
                 place(item, static_cast<size_t>(content_[keep].begin)) +
                 " on does not fit (set length_policy: truncate to cut it, or raise max_length)");
      }
      content_.resize(keep);
    }
    if (content_.empty() && n_special == 0)
      fail(TSR_BAD_INPUT,
           std::string(item.id) + ": the text gives no tokens (" +
               (text.empty() ? "it is empty" : "it holds only whitespace and characters BERT drops") +
               "); remove such items, or set add_special: true to get " + tokenizer_->special_names() +
               " rows");
    Sequence s;
    s.kind = TSR_ROWS_IDS;
    for (const auto* part : {&prefix_, &content_, &suffix_})
      for (const Token& t : *part)
        s.add_id(t.id, t.role,
                 t.begin < 0
                     ? tessera::plugin::no_provenance()
                     : tessera::plugin::byte_span(static_cast<double>(t.begin), static_cast<double>(t.end)));
    return {s};
  }

  std::string decode(const std::vector<int32_t>& ids) const { return tokenizer_->decode(ids, skip_special_); }

 private:
  std::string vocab_meaning() const {
    if (kind_ == "chars") return "a UTF-8 file with one character per line";
    if (kind_ == "bpe") return "the path of GPT-2's encoder.json";
    return "the path of a BERT vocab.txt (one token per line)";
  }

  // "byte 14 (data/lines.txt:17:15)": a byte of the item, and its line:col in the source file.
  static std::string place(const Item& item, size_t byte) {
    std::string out = "byte " + std::to_string(byte);
    if (item.source.empty() || item.source_line == 0) return out;
    const std::string_view before = item.text().substr(0, byte);
    const size_t newlines = static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
    const size_t line_start = newlines ? before.rfind('\n') + 1 : 0;
    return out + " (" + std::string(item.source) + ":" + std::to_string(item.source_line + newlines) + ":" +
           std::to_string(byte - line_start + 1) + ")";
  }

  std::string kind_;
  std::unique_ptr<Tokenizer> tokenizer_;
  bool add_special_ = false, skip_special_ = false, truncate_ = false;
  static constexpr int64_t kDefaultMaxBytes = int64_t{4} << 20;
  int64_t max_length_ = 0;
  int64_t max_bytes_ = kDefaultMaxBytes;
  std::vector<Token> prefix_, suffix_;
  std::vector<Char> chars_;
  std::vector<Token> content_;
};

const tsr_option_spec kOptions[] = {
    {sizeof(tsr_option_spec), "tokenizer", TSR_OPT_ENUM, "bytes",
     "bytes (an id per byte), chars (an id per character of vocab), bpe (GPT-2 byte-level BPE), wordpiece "
     "(BERT)",
     "bytes|chars|bpe|wordpiece"},
    {sizeof(tsr_option_spec), "vocab", TSR_OPT_PATH, "",
     "chars: one character per line; bpe: GPT-2's encoder.json; wordpiece: BERT's vocab.txt", nullptr},
    {sizeof(tsr_option_spec), "merges", TSR_OPT_PATH, "", "bpe: GPT-2's vocab.bpe (merges in rank order)",
     nullptr},
    {sizeof(tsr_option_spec), "lowercase", TSR_OPT_ENUM, "auto", "wordpiece: lower-case first (auto: true)",
     "auto|true|false"},
    {sizeof(tsr_option_spec), "strip_accents", TSR_OPT_ENUM, "auto",
     "wordpiece: drop accents (NFD, then non-spacing marks) (auto: as lowercase)", "auto|true|false"},
    {sizeof(tsr_option_spec), "add_special", TSR_OPT_ENUM, "auto",
     "add the tokenizer's special rows: [CLS] .. [SEP], BOS .. EOS, .. <|endoftext|> (auto: wordpiece only)",
     "auto|true|false"},
    {sizeof(tsr_option_spec), "max_length", TSR_OPT_INT, "0",
     "most rows per item, specials included (0: no limit)", nullptr},
    {sizeof(tsr_option_spec), "length_policy", TSR_OPT_ENUM, "error",
     "an item longer than max_length: error (a bad item) or truncate (keep the first rows)",
     "error|truncate"},
    {sizeof(tsr_option_spec), "skip_special_tokens", TSR_OPT_BOOL, "false",
     "decode: leave special tokens out of the text", nullptr},
    {sizeof(tsr_option_spec), "max_bytes", TSR_OPT_INT, "4194304",
     "the most bytes of text one item may have (0: no limit); a longer one fails before it is tokenized "
     "(tokenizing takes about 90 bytes of memory per byte)",
     nullptr},
};
const tsr_plugin_info kInfo = {sizeof(tsr_plugin_info),
                               "text",
                               "text",
                               "1.1.0",
                               "text lines as token ids: bytes, characters, GPT-2 BPE or BERT WordPiece",
                               kOptions,
                               static_cast<uint32_t>(std::size(kOptions)),
                               TSR_INPUT_TEXT,
                               ".txt"};

}  // namespace
}  // namespace tessera::text

TESSERA_DEFINE_PLUGIN(tessera::text::TextPlugin, tessera::text::kInfo)
