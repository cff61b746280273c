// An example third-party plugin: DNA as overlapping k-mers (a modality Tessera does not ship).
// Built outside Tessera's tree against the installed package — see CMakeLists.txt beside it and
// docs/PLUGINS.md, which walks through this file. It reads a FASTA record or a bare sequence.
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/plugin.hpp"

namespace {

using tessera::plugin::fail;
using tessera::plugin::Sequence;

constexpr int32_t kPad = 0, kCls = 1, kEos = 2, kUnk = 3, kFirstKmer = 4;

int base_index(char c) {
  switch (c) {
    case 'A': case 'a': return 0;
    case 'C': case 'c': return 1;
    case 'G': case 'g': return 2;
    case 'T': case 't': return 3;
    default: return -1;  // N and other IUPAC codes: the k-mer is unknown
  }
}

class Kmers {
 public:
  explicit Kmers(const tessera::plugin::Options& o)
      : k_(o.get_int("k")), stride_(o.get_int("stride")), max_length_(o.get_int("max_length")) {
    if (k_ < 1 || k_ > 8) fail(TSR_INVALID_ARGUMENT, "k must be between 1 and 8, got " + std::to_string(k_), "k");
    if (stride_ < 1) fail(TSR_INVALID_ARGUMENT, "stride must be at least 1, got " + std::to_string(stride_), "stride");
    if (max_length_ != 0 && max_length_ < 3)
      fail(TSR_INVALID_ARGUMENT, "max_length must be 0 (no limit) or at least 3, got " + std::to_string(max_length_),
           "max_length");
  }

  tsr_encoder_info describe() const {
    tsr_encoder_info i{};
    i.rows_kind = TSR_ROWS_IDS;
    i.vocab_size = kFirstKmer + (int64_t{1} << (2 * k_));  // 4^k k-mers after four specials
    i.causal = 0;
    i.pad_id = kPad;
    i.max_rows = max_length_;  // lets the host check the model's position table before a run
    return i;
  }

  std::vector<Sequence> encode(const tessera::plugin::Item& item) const {
    // Skip a FASTA header line; keep the letters of the rest, remembering where they were.
    std::string_view text = item.text();
    size_t start = 0;
    uint32_t line = item.source_line ? item.source_line : 1;
    if (!text.empty() && text[0] == '>') {
      start = text.find('\n');
      if (start == std::string_view::npos) fail(TSR_BAD_INPUT, std::string(item.id) + ": a FASTA header with no sequence");
      ++line;
      ++start;
    }
    std::string bases;
    for (size_t i = start, col = 1; i < text.size(); ++i, ++col) {
      const char c = text[i];
      if (c == '\n') {
        ++line;
        col = 0;
      } else if (c == '\r' || c == ' ' || c == '\t') {
      } else if (std::isalpha(static_cast<unsigned char>(c))) {
        bases += c;
      } else {
        fail(TSR_BAD_INPUT, std::string(item.source.empty() ? item.id : item.source) + ":" + std::to_string(line) + ":" +
                                std::to_string(col) + ": '" + std::string(1, c) + "' is not a nucleotide letter");
      }
    }
    if (static_cast<int64_t>(bases.size()) < k_)
      fail(TSR_BAD_INPUT, std::string(item.id) + ": " + std::to_string(bases.size()) + " bases, fewer than k = " + std::to_string(k_));
    Sequence s;
    s.kind = TSR_ROWS_IDS;
    s.add_id(kCls, TSR_ROLE_CLS, tessera::plugin::no_provenance());
    for (int64_t i = 0; i + k_ <= static_cast<int64_t>(bases.size()); i += stride_) {
      int32_t id = 0;
      bool known = true;
      for (int64_t j = 0; j < k_; ++j) {
        const int b = base_index(bases[static_cast<size_t>(i + j)]);
        known = known && b >= 0;
        id = id * 4 + (b < 0 ? 0 : b);
      }
      s.add_id(known ? kFirstKmer + id : kUnk, known ? TSR_ROLE_CONTENT : TSR_ROLE_UNK,
               tessera::plugin::residues(static_cast<double>(i), static_cast<double>(i + k_)));
    }
    s.add_id(kEos, TSR_ROLE_EOS, tessera::plugin::no_provenance());
    if (max_length_ > 0 && static_cast<int64_t>(s.rows()) > max_length_)
      fail(TSR_OUT_OF_RANGE, std::string(item.id) + ": " + std::to_string(s.rows()) + " rows with CLS and EOS, more than " +
                                 "max_length " + std::to_string(max_length_) + " (raise max_length, or raise stride)");
    return {s};
  }

  std::string decode(const std::vector<int32_t>& ids) const {
    std::string out;
    const int64_t vocab = kFirstKmer + (int64_t{1} << (2 * k_));
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab)
        fail(TSR_OUT_OF_RANGE, "decode: id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
      if (id == kUnk) out += out.empty() ? "<unk>" : " <unk>";
      if (id < kFirstKmer) continue;
      std::string kmer(static_cast<size_t>(k_), 'A');
      for (int64_t j = k_ - 1, v = id - kFirstKmer; j >= 0; --j, v /= 4) kmer[static_cast<size_t>(j)] = "ACGT"[v % 4];
      out += (out.empty() ? "" : " ") + kmer;
    }
    return out;
  }

 private:
  int64_t k_, stride_, max_length_;
};

const tsr_option_spec kOptions[] = {
    {sizeof(tsr_option_spec), "k", TSR_OPT_INT, "3", "letters per k-mer (1 to 8)", nullptr},
    {sizeof(tsr_option_spec), "stride", TSR_OPT_INT, "1", "bases from one k-mer to the next (1: overlapping)", nullptr},
    {sizeof(tsr_option_spec), "max_length", TSR_OPT_INT, "512", "most rows per record, CLS and EOS included (0: no limit)",
     nullptr},
};
const tsr_plugin_info kInfo = {sizeof(tsr_plugin_info), "kmers", "dna", "1.0.0", "DNA as overlapping k-mers",
                               kOptions, 3, TSR_INPUT_TEXT, ".fa|.fasta|.fna|.txt"};

}  // namespace

TESSERA_DEFINE_PLUGIN(Kmers, kInfo)
