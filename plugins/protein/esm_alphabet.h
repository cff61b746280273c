// The ESM-2 alphabet: the 33 tokens of fair-esm's Alphabet.from_architecture("ESM-1b"), which the
// esm2_* checkpoints use, and of transformers' EsmTokenizer built from their vocab.txt, in id order.
// Tokens and ids only: reading FASTA is fasta_record.h's job, the length policy protein.cpp's.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tessera_protein {

// clang-format off
inline constexpr std::array<std::string_view, 33> kTokens = {
    "<cls>", "<pad>", "<eos>", "<unk>",                                    // 0..3
    "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K", "Q", "N",   // 4..17
    "F", "Y", "M", "H", "W", "C", "X", "B", "U", "Z", "O", ".", "-",        // 18..30
    "<null_1>", "<mask>"};                                                 // 31, 32
// clang-format on
inline constexpr int32_t kVocabSize = static_cast<int32_t>(kTokens.size());
inline constexpr int32_t kCls = 0, kPad = 1, kEos = 2, kUnk = 3, kNull1 = 31, kMask = 32;
inline constexpr int32_t kFirstLetter = 4, kLastLetter = 30;  // one-character tokens: residues and gaps

// The id of a one-character token ('L' ... 'O', '.', '-'), or -1: the vocabulary is upper case.
constexpr int32_t letter_id(char c) {
  for (int32_t id = kFirstLetter; id <= kLastLetter; ++id)
    if (kTokens[id][0] == c) return id;
  return -1;
}

// The id of the <...> token that `text` starts with (<cls>, <pad>, <eos>, <unk>, <null_1>, <mask>),
// or -1. No such token is a prefix of another, so at most one matches.
constexpr int32_t angle_token_at(std::string_view text) {
  for (int32_t id = 0; id < static_cast<int32_t>(kTokens.size()); ++id)
    if (kTokens[id][0] == '<' && text.substr(0, kTokens[id].size()) == kTokens[id]) return id;
  return -1;
}

}  // namespace tessera_protein
