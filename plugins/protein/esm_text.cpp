// EsmTokenizer's rules on a bare sequence. What transformers 4.40 does with EsmTokenizer(text):
// PreTrainedTokenizer.tokenize() cuts the text with a trie of every vocabulary token (the 27
// one-character tokens, all upper case or '.', '-', and the six <...> tokens), longest match
// first; each piece between matches goes through EsmTokenizer._tokenize, which is str.split():
// cut at runs of whitespace, each word one token, and no word is in the vocabulary, so each is one
// <unk>. No <...> token shares a character with a one-character token, so a left-to-right scan
// gives the same cuts: a <...> token where one starts, a one-character token, whitespace (a cut),
// or a letter outside the vocabulary, which joins the current <unk> run. A final '*' (a stop) is
// such a piece too. Whatever else EsmTokenizer would also read as <unk> is no part of a protein
// sequence, and fails the item as it does in a FASTA record.
#include "esm_text.h"

#include "esm_alphabet.h"

namespace tessera_protein {
namespace {

using tessera::plugin::fail;
using tessera::plugin::Item;

enum : int16_t {
  kSpace = -1,    // whitespace of str.split()
  kAngle = -2,    // '<': one of the <...> tokens, or an error
  kLetter = -3,   // a letter outside the vocabulary: part of an <unk> run
  kStop = -4,     // '*': at the end (then only whitespace) part of an <unk> run, else an error
  kHeader = -5,   // '>'
  kBad = -6,      // digits, punctuation, control characters
};

// Whether only whitespace (str.isspace) follows byte i.
bool only_space_after(std::string_view text, size_t i) {
  for (size_t k = i + 1; k < text.size();) {
    uint32_t cp = static_cast<unsigned char>(text[k]);
    const size_t n = cp < 0x80 ? 1 : utf8_length(text, k, &cp);
    if (n == 0 || !python_space(cp)) return false;
    k += n;
  }
  return true;
}

const char* const kHint =
    "a sequence holds letters, the gaps '.' and '-', whitespace, the tokens <cls> <pad> <eos> <unk> "
    "<null_1> <mask>, and one '*' at its end";

}  // namespace

bool python_space(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

EsmTextSplitter::EsmTextSplitter(bool uppercase, bool unknown_is_error)
    : uppercase_(uppercase), unknown_is_error_(unknown_is_error) {
  for (int c = 0; c < 128; ++c) {
    const bool lower = c >= 'a' && c <= 'z';
    const int32_t id = letter_id(static_cast<char>(uppercase && lower ? c - 'a' + 'A' : c));
    if (id >= 0) action_[c] = static_cast<int16_t>(id);
    else if (lower || (c >= 'A' && c <= 'Z')) action_[c] = kLetter;
    else if (python_space(static_cast<uint32_t>(c))) action_[c] = kSpace;
    else action_[c] = kBad;
  }
  action_['<'] = kAngle;
  action_['*'] = kStop;
  action_['>'] = kHeader;
}

Record EsmTextSplitter::split(const Item& item) const {
  const std::string_view text = item.text();
  Record r;
  r.ids.reserve(text.size());
  auto bad = [&](size_t at, const std::string& what) { fail(TSR_BAD_INPUT, item_message(item, "", at, what)); };
  bool in_run = false;  // inside a piece that is one <unk>
  auto unknown = [&](size_t i) {
    if (unknown_is_error_) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      bad(i, describe_char(text, i) + " is not in the ESM-2 alphabet" +
                 (!uppercase_ && c >= 'a' && c <= 'z' ? " (its letters are upper case: set uppercase: true)"
                                                      : " (set unknown: unk to read it as <unk>)"));
    }
    if (in_run) {
      r.extend_last();  // the run's <unk> stands for one more character
      return;
    }
    r.ids.push_back(kUnk);
    in_run = true;
  };
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      uint32_t cp = 0;
      const size_t n = utf8_length(text, i, &cp);
      if (n == 0 || !python_space(cp)) bad(i, describe_char(text, i) + " is not a residue; " + kHint);
      in_run = false;
      i += n;
      continue;
    }
    const int16_t a = action_[c];
    if (a >= 0) {
      r.ids.push_back(a);
      in_run = false;
    } else if (a == kSpace) {
      in_run = false;
    } else if (a == kLetter) {
      unknown(i);
    } else if (a == kAngle) {
      const int32_t id = angle_token_at(text.substr(i));
      if (id < 0)
        bad(i, "'<' starts no token: a sequence may hold <cls> <pad> <eos> <unk> <null_1> <mask>, each on one line");
      r.ids.push_back(id);
      in_run = false;
      i += kTokens[static_cast<size_t>(id)].size();
      continue;
    } else if (a == kStop) {
      if (!only_space_after(text, i))
        bad(i, "'*' (a stop) before the end of the sequence; a '*' may only end it: remove it or split the record");
      unknown(i);  // EsmTokenizer reads the final stop as <unk>
    } else if (a == kHeader) {
      if (i > 0 && text[i - 1] == '\n')
        bad(i, "a '>' header line inside the sequence: each FASTA record must be its own item");
      bad(i, describe_char(text, i) + " is not a residue; " + kHint);
    } else {
      bad(i, describe_char(text, i) + " is not a residue; " + kHint);
    }
    ++i;
  }
  return r;
}

}  // namespace tessera_protein
