// Reads one item's text — a FASTA record ('>' header line, then sequence lines) or a bare sequence —
// into ESM-2 ids, one per residue, or fails with TSR_BAD_INPUT naming the item and FILE:LINE:COL.
// It does not split files into records (the host does) and knows no length policy (protein.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/plugin.hpp"

namespace tessera_protein {

struct Record {
  std::string name;          // the header's first word; "" for a bare sequence
  std::vector<int32_t> ids;  // (T) one id per residue, without <cls> and <eos>
};

class FastaReader {
 public:
  // uppercase: lower-case letters read as their upper-case residue (else they are unknown letters).
  // unknown_is_error: a letter outside the alphabet fails the item (else it reads as <unk>).
  FastaReader(bool uppercase, bool unknown_is_error);
  Record read(const tessera::plugin::Item& item) const;

 private:
  std::array<int16_t, 256> action_{};  // per byte: an id >= 0, or one of the negative actions
  bool uppercase_;
  bool unknown_is_error_;
};

// "FILE:LINE:COL: ITEM (record NAME): what" for byte `offset` of the item's text. FILE is the
// item's source (its id for inline text); LINE counts from the item's source_line.
std::string item_message(const tessera::plugin::Item& item, const std::string& name, size_t offset,
                         const std::string& what);

}  // namespace tessera_protein
