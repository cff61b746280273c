// Reads one item's text — a FASTA record ('>' header line, then sequence lines) or a bare sequence —
// into ESM-2 ids, one per residue (or one per run of unknown letters), or fails with TSR_BAD_INPUT
// naming the item and FILE:LINE:COL. It does not split files into records (the host does) and
// knows no length policy (protein.cpp). EsmTokenizer's rules for bare text are esm_text.h's.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/plugin.hpp"

namespace tessera_protein {

// The tokens of one sequence, without <cls> and <eos>, and the residues each stands for. Residue
// indices count the sequence's characters, whitespace aside (a written-out token such as <mask>
// counts one). A token stands for one residue, but for the <unk> of a run of unknown characters.
struct Record {
  std::string name;          // the header's first word; "" for a bare sequence
  std::vector<int32_t> ids;  // (T) one id per token
  // The runs, in token order: (the run's token index, its residues beyond the first). Token t
  // starts at residue t + the extra residues of the runs before it. Empty in the common case.
  std::vector<std::pair<size_t, int64_t>> runs;
  // The last token (an <unk>) stands for one more residue.
  void extend_last() {
    if (runs.empty() || runs.back().first + 1 != ids.size()) runs.emplace_back(ids.size() - 1, 0);
    ++runs.back().second;
  }
};

class FastaReader {
 public:
  // uppercase: lower-case letters read as their upper-case residue (else they are unknown letters).
  // unknown_is_error: a letter outside the alphabet fails the item (else it reads as <unk>).
  // merge_unknown_runs: adjacent unknown letters (line breaks and blanks between them aside) are
  // one <unk>, as EsmTokenizer gives for the record's sequence; else each letter is its own <unk>.
  FastaReader(bool uppercase, bool unknown_is_error, bool merge_unknown_runs);
  Record read(const tessera::plugin::Item& item) const;

 private:
  std::array<int16_t, 256> action_{};  // per byte: an id >= 0, or one of the negative actions
  bool uppercase_;
  bool unknown_is_error_;
  bool merge_unknown_runs_;
};

// "FILE:LINE:COL: ITEM (record NAME): what" for byte `offset` of the item's text. FILE is the
// item's source (its id for inline text); LINE counts from the item's source_line; COL counts bytes.
std::string item_message(const tessera::plugin::Item& item, const std::string& name, size_t offset,
                         const std::string& what);

// How a message shows the character at text[i]: 'J', 'é' (U+00E9, not ASCII), byte 0xFF (not
// UTF-8), byte 0x00 (a control character).
std::string describe_char(std::string_view text, size_t i);

// The length of the well-formed UTF-8 character at text[i] (2..4 bytes) and its code point, or 0.
size_t utf8_length(std::string_view text, size_t i, uint32_t* code_point);

}  // namespace tessera_protein
