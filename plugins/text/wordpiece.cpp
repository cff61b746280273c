// BERT's WordPiece from vocab.txt: the basic tokenizer (pretokenize.cpp), then greedy
// longest-match-first pieces (a byte-trie walk) with "##" continuations, [UNK] for words it cannot
// spell or longer than 100 characters, and decoding with Hugging Face's clean-up rules. Options
// and length policy are the plugin's.
#include <algorithm>
#include <memory>
#include <unordered_map>

#include "pretokenize.h"
#include "tessera/plugin.hpp"
#include "tokenizer.h"

namespace tessera::text {
namespace {

using tessera::plugin::fail;

constexpr size_t kMaxCharsPerWord = 100;  // BERT's max_input_chars_per_word

// Python's str.replace: every non-overlapping occurrence, left to right.
void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  size_t start = 0;
  for (size_t at; (at = s.find(from, start)) != std::string::npos; start = at + from.size()) {
    out.append(s, start, at - start);
    out.append(to);
  }
  if (start == 0) return;
  out.append(s, start, std::string::npos);
  s = std::move(out);
}

// The tokens as a byte trie, for longest-prefix matches in one walk (the same answer as trying
// every shorter prefix in a hash map, longest first, as Hugging Face does: a token is valid UTF-8,
// so a token that is a prefix of a word ends at a character boundary).
class Trie {
 public:
  // Builds the trie breadth first from the sorted keys, so that each node's edges are contiguous
  // and sorted by byte.
  explicit Trie(std::vector<std::pair<std::string_view, int32_t>> keys) {
    std::sort(keys.begin(), keys.end());
    struct Pending {
      size_t lo, hi, depth;  // the keys [lo, hi) share their first `depth` bytes
    };
    std::vector<Pending> queue{{0, keys.size(), 0}};
    for (size_t n = 0; n < queue.size(); ++n) {
      auto [lo, hi, depth] = queue[n];
      int32_t id = -1;
      if (lo < hi && keys[lo].first.size() == depth) id = keys[lo++].second;
      ids_.push_back(id);
      first_.push_back(static_cast<int32_t>(edges_.size()));
      while (lo < hi) {
        const auto b = static_cast<uint8_t>(keys[lo].first[depth]);
        size_t j = lo;
        while (j < hi && static_cast<uint8_t>(keys[j].first[depth]) == b) ++j;
        edges_.push_back({b, static_cast<int32_t>(queue.size())});
        queue.push_back({lo, j, depth + 1});
        lo = j;
      }
    }
    first_.push_back(static_cast<int32_t>(edges_.size()));
  }
  // The longest token that starts text: its id and length in bytes, or {-1, 0}.
  std::pair<int32_t, size_t> longest_prefix(std::string_view text) const {
    std::pair<int32_t, size_t> best{-1, 0};
    int32_t node = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto b = static_cast<uint8_t>(text[i]);
      const Edge* lo = edges_.data() + first_[node];
      const Edge* hi = edges_.data() + first_[node + 1];
      const Edge* e = std::lower_bound(lo, hi, b, [](const Edge& x, uint8_t v) { return x.byte < v; });
      if (e == hi || e->byte != b) break;
      node = e->child;
      if (ids_[node] >= 0) best = {ids_[node], i + 1};
    }
    return best;
  }

 private:
  struct Edge {
    uint8_t byte;
    int32_t child;
  };
  std::vector<int32_t> ids_;    // node -> token id, or -1
  std::vector<int32_t> first_;  // node -> its first edge; one more entry ends the last node's
  std::vector<Edge> edges_;
};

class WordPiece final : public Tokenizer {
 public:
  WordPiece(const std::string& path, const BertOptions& options) : options_(options) {
    const VocabFile file = VocabFile::read("vocab", path);
    file.for_each_line([&](size_t line_no, std::string_view line, size_t) {
      decode_line(file, line_no, line);
      if (line.empty()) file.fail_at(line_no, 1, "an empty token; each line of vocab.txt holds one token");
      const auto [it, fresh] = ids_.emplace(std::string(line), static_cast<int32_t>(tokens_.size()));
      if (!fresh)
        file.fail_at(line_no, 1,
                     "the token " + quoted(line) + " is already on line " + std::to_string(it->second + 1));
      tokens_.emplace_back(line);
    });
    std::vector<std::pair<std::string_view, int32_t>> words, pieces;
    for (size_t id = 0; id < tokens_.size(); ++id) {
      const std::string_view t = tokens_[id];
      words.emplace_back(t, static_cast<int32_t>(id));
      if (t.size() > 2 && t.substr(0, 2) == "##") pieces.emplace_back(t.substr(2), static_cast<int32_t>(id));
    }
    words_trie_ = std::make_unique<Trie>(std::move(words));
    pieces_trie_ = std::make_unique<Trie>(std::move(pieces));
    const std::pair<const char*, tsr_role> specials[] = {{"[PAD]", TSR_ROLE_PAD},
                                                         {"[UNK]", TSR_ROLE_UNK},
                                                         {"[CLS]", TSR_ROLE_CLS},
                                                         {"[SEP]", TSR_ROLE_SEP},
                                                         {"[MASK]", TSR_ROLE_MASK}};
    for (const auto& [name, role] : specials) {
      const auto it = ids_.find(name);
      if (it == ids_.end()) continue;
      special_names_.push_back(name);
      special_ids_.push_back(it->second);
      special_roles_.push_back(role);
    }
    unk_ = id_of("[UNK]");
    if (unk_ < 0) file.fail("no [UNK] token; WordPiece needs one for words it cannot spell");
    cls_ = id_of("[CLS]");
    sep_ = id_of("[SEP]");
    pad_ = id_of("[PAD]");
    mask_ = id_of("[MASK]");
  }

  bool reads_unicode() const override { return true; }

  void encode(std::string_view text, const std::vector<Char>& chars, std::vector<Token>& out) override {
    size_t k = 0;
    for (const Segment& seg : split_specials(text, special_names_)) {
      while (k < chars.size() && chars[k].begin < seg.begin) ++k;
      if (seg.special >= 0) {
        out.push_back({special_ids_[seg.special], special_roles_[seg.special],
                       static_cast<int64_t>(seg.begin), static_cast<int64_t>(seg.end)});
        continue;
      }
      size_t k_end = k;
      while (k_end < chars.size() && chars[k_end].begin < seg.end) ++k_end;
      normalized_.clear();
      bert_normalize(chars.data() + k, k_end - k, options_, normalized_);
      words_.clear();
      bert_split(normalized_, words_);
      for (const Piece& w : words_) word(w, out);
      k = k_end;
    }
  }

  std::vector<Token> prefix() const override { return {{cls_, TSR_ROLE_CLS}}; }
  std::vector<Token> suffix() const override { return {{sep_, TSR_ROLE_SEP}}; }
  std::string special_names() const override { return "[CLS] and [SEP]"; }

  // As BertTokenizerFast.decode: tokens joined by spaces, "##" pieces glued on, the clean-up of the
  // WordPiece decoder applied to each token, then transformers' clean_up_tokenization to the text.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string out;
    bool first = true;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size())
        fail(TSR_OUT_OF_RANGE, "decode: id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                   " is outside this vocabulary [0, " + std::to_string(vocab_size()) + ")");
      if (skip_special && std::find(special_ids_.begin(), special_ids_.end(), ids[i]) != special_ids_.end())
        continue;
      const std::string& t = tokens_[ids[i]];
      std::string piece;
      if (first)
        piece = t;
      else if (t.rfind("##", 0) == 0)
        piece = t.substr(2);
      else
        piece = " " + t;
      first = false;
      for (const auto& [from, to] : kTokenCleanup) replace_all(piece, from, to);
      out += piece;
    }
    for (const auto& [from, to] : kTextCleanup) replace_all(out, from, to);
    return out;
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  int32_t pad_id() const override { return pad_; }
  int32_t mask_id() const override { return mask_; }

 private:
  static constexpr std::pair<std::string_view, std::string_view> kTokenCleanup[] = {
      {" .", "."},   {" ?", "?"},           {" !", "!"},   {" ,", ","},     {" ' ", "'"},   {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  static constexpr std::pair<std::string_view, std::string_view> kTextCleanup[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};

  int32_t id_of(const std::string& token) const {
    const auto it = ids_.find(token);
    return it == ids_.end() ? -1 : it->second;
  }

  // Greedy longest-match-first pieces of one word of normalised characters.
  void word(const Piece& w, std::vector<Token>& out) {
    const size_t m = w.end - w.begin;
    const Char* c = normalized_.data() + w.begin;
    auto span = [&](size_t a, size_t b) {  // the source bytes of characters [a, b) of the word
      int64_t lo = c[a].begin, hi = c[a].end;
      for (size_t i = a + 1; i < b; ++i)
        lo = std::min<int64_t>(lo, c[i].begin), hi = std::max<int64_t>(hi, c[i].end);
      return std::pair<int64_t, int64_t>(lo, hi);
    };
    const size_t first_out = out.size();
    auto unknown = [&] {
      out.resize(first_out);
      const auto [lo, hi] = span(0, m);
      out.push_back({unk_, TSR_ROLE_UNK, lo, hi});
    };
    if (m > kMaxCharsPerWord) return unknown();
    utf8_.clear();
    offsets_.clear();
    for (size_t i = 0; i < m; ++i) {
      offsets_.push_back(utf8_.size());
      append_utf8(utf8_, c[i].cp);
    }
    offsets_.push_back(utf8_.size());
    for (size_t start = 0; start < m;) {
      const Trie& trie = start > 0 ? *pieces_trie_ : *words_trie_;  // "##" pieces after the first
      const auto [found, bytes] = trie.longest_prefix(std::string_view(utf8_).substr(offsets_[start]));
      if (found < 0) return unknown();
      const size_t end = static_cast<size_t>(
          std::lower_bound(offsets_.begin(), offsets_.end(), offsets_[start] + bytes) - offsets_.begin());
      const auto [lo, hi] = span(start, end);
      out.push_back({found, TSR_ROLE_CONTENT, lo, hi});
      start = end;
    }
  }

  BertOptions options_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> tokens_;
  std::unique_ptr<Trie> words_trie_, pieces_trie_;  // all tokens; "##" tokens without their "##"
  std::vector<std::string> special_names_;
  std::vector<int32_t> special_ids_;
  std::vector<tsr_role> special_roles_;
  int32_t unk_ = -1, cls_ = -1, sep_ = -1, pad_ = -1, mask_ = -1;
  // Scratch space reused across calls (an encoder serves one thread at a time).
  std::vector<Char> normalized_;
  std::vector<Piece> words_;
  std::string utf8_;
  std::vector<size_t> offsets_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_wordpiece_tokenizer(const std::string& vocab_txt,
                                                    const BertOptions& options) {
  return std::make_unique<WordPiece>(vocab_txt, options);
}

}  // namespace tessera::text
