// A bare sequence (no '>' header) cut as transformers' EsmTokenizer (4.40) cuts text: at the
// vocabulary's tokens, then the rest at whitespace, each remaining piece one <unk>. Characters that
// no protein sequence holds (digits, punctuation, control characters, a '*' before the end, a '<'
// that starts no token, a header line) fail the item with their place instead of becoming a silent
// <unk>; on every other string the ids are EsmTokenizer's. FASTA records are fasta_record.h's.
#pragma once

#include <array>
#include <cstdint>

#include "fasta_record.h"
#include "tessera/plugin.hpp"

namespace tessera_protein {

class EsmTextSplitter {
 public:
  // uppercase: lower-case letters outside the <...> tokens read as upper case (EsmTokenizer on
  // the upper-cased text). unknown_is_error: a piece that would be <unk> fails the item.
  EsmTextSplitter(bool uppercase, bool unknown_is_error);
  Record split(const tessera::plugin::Item& item) const;

 private:
  std::array<int16_t, 128> action_{};  // per ASCII byte: an id >= 0, or one of the negative actions
  bool uppercase_;
  bool unknown_is_error_;
};

// Whether Python's str.isspace() holds for the code point, the whitespace str.split() cuts at:
// U+0009-U+000D, U+001C-U+001F, U+0020, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029,
// U+202F, U+205F, U+3000 (Python 3.11, Unicode 14).
bool python_space(uint32_t code_point);

}  // namespace tessera_protein
