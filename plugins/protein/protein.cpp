// The protein plugin: one FASTA record or bare sequence -> ESM-2 ids <cls> tokens <eos>, as
// transformers' EsmTokenizer gives them (tokenizer: esm) or one row per residue (tokenizer:
// residues), each row with the residues it stands for as provenance, under a length policy (error,
// truncate, or overlapping windows). Reading a record is fasta_record.cpp's, EsmTokenizer's rules
// for bare text esm_text.cpp's; splitting files is the host's.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "esm_alphabet.h"
#include "esm_text.h"
#include "fasta_record.h"
#include "tessera/plugin.hpp"

namespace tessera_protein {
namespace {

using tessera::plugin::fail;
using tessera::plugin::Item;
using tessera::plugin::Options;
using tessera::plugin::Sequence;

enum class LengthPolicy { error, truncate, windows };

LengthPolicy policy_of(const std::string& s) {
  if (s == "error") return LengthPolicy::error;
  if (s == "truncate") return LengthPolicy::truncate;
  if (s == "windows") return LengthPolicy::windows;
  fail(TSR_INVALID_ARGUMENT, "\"" + s + "\" is no length policy: use error, truncate or windows",
       "length_policy");
}

bool bool_of(const Options& o, const std::string& name) {
  const std::string& s = o.text(name);
  if (s != "true" && s != "false") fail(TSR_INVALID_ARGUMENT, "\"" + s + "\" is not true or false", name);
  return s == "true";
}

// tokenizer: esm (EsmTokenizer's rules) or residues (one row per residue letter).
bool esm_of(const Options& o) {
  const std::string& s = o.text("tokenizer");
  if (s != "esm" && s != "residues")
    fail(TSR_INVALID_ARGUMENT, "\"" + s + "\" is no tokenizer: use esm or residues", "tokenizer");
  return s == "esm";
}

bool unknown_is_error(const Options& o) {
  const std::string& s = o.text("unknown");
  if (s != "unk" && s != "error")
    fail(TSR_INVALID_ARGUMENT, "\"" + s + "\" is no choice for unknown letters: use unk or error", "unknown");
  return s == "error";
}

// max_windows: the most windows one item may become under length_policy: windows (0: no limit).
// An option added after 1.1.0: a host that does not pass it gets the default.
constexpr int64_t kDefaultMaxWindows = 2048;
int64_t checked_max_windows(const Options& o) {
  if (!o.has("max_windows")) return kDefaultMaxWindows;
  const int64_t n = o.get_int("max_windows");
  if (n < 0)
    fail(TSR_INVALID_ARGUMENT, "max_windows " + std::to_string(n) + " is negative: use 0 for no limit, or a count",
         "max_windows");
  return n;
}

int64_t checked_max_length(const Options& o) {
  const int64_t n = o.get_int("max_length");
  if (n < 3 || n > std::numeric_limits<int32_t>::max())
    fail(TSR_INVALID_ARGUMENT,
         "max_length " + std::to_string(n) +
             " is out of range: rows per sequence, <cls> and <eos> included, from 3 "
             "to 2147483647 (ESM-2 was trained with 1024)",
         "max_length");
  return n;
}

tsr_role role_of(int32_t id) {
  switch (id) {
    case kUnk:
      return TSR_ROLE_UNK;
    case kMask:
      return TSR_ROLE_MASK;
    default:
      return TSR_ROLE_CONTENT;
  }
}

class Protein {
 public:
  explicit Protein(const Options& o)
      : esm_(esm_of(o)),
        max_length_(checked_max_length(o)),
        policy_(policy_of(o.text("length_policy"))),
        stride_(o.get_int("stride")),
        max_windows_(checked_max_windows(o)),
        reader_(bool_of(o, "uppercase"), unknown_is_error(o), esm_),
        splitter_(bool_of(o, "uppercase"), unknown_is_error(o)) {
    const int64_t window = max_length_ - 2;
    if (stride_ < 0 || stride_ > window)
      fail(TSR_INVALID_ARGUMENT,
           "stride " + std::to_string(stride_) + " is out of range: " + unit() +
               " from one window's start to the next, from 1 to max_length - 2 = " +
               std::to_string(window) +
               " (a larger stride would skip " + unit() + "), or 0 for half a window",
           "stride");
    if (stride_ == 0) stride_ = window / 2 > 0 ? window / 2 : 1;
  }

  tsr_encoder_info describe() const {
    tsr_encoder_info info{};
    info.rows_kind = TSR_ROWS_IDS;
    info.vocab_size = kVocabSize;
    info.causal = 0;
    info.pad_id = kPad;
    info.max_rows = max_length_;
    info.has_mask = 1;
    info.mask_id = kMask;
    return info;
  }

  std::vector<Sequence> encode(const Item& item) const {
    // A FASTA record is read as FASTA (its sequence lines, layout aside); under tokenizer: esm a
    // bare sequence is EsmTokenizer's input string as it is (what no protein holds refused).
    const std::string_view text = item.text();
    const Record r = esm_ && (text.empty() || text[0] != '>') ? splitter_.split(item) : reader_.read(item);
    const size_t n = r.ids.size();
    const size_t window = static_cast<size_t>(max_length_ - 2);
    if (n <= window && policy_ != LengthPolicy::windows) return {rows(r, 0, n, "")};
    switch (policy_) {
      case LengthPolicy::error:
        fail(TSR_OUT_OF_RANGE, item_message(item, r.name, 0,
                                            std::to_string(n) + " " + unit() + " do not fit max_length " +
                                                std::to_string(max_length_) + " (" + std::to_string(window) +
                                                " " + unit() + " + <cls> + <eos>): set length_policy to "
                                                "truncate or windows, or raise max_length"));
      case LengthPolicy::truncate:
        return {rows(r, 0, window, "")};
      case LengthPolicy::windows:
        break;
    }
    // Windows start every stride_ residues; the last one ends at the sequence's end (and may be
    // shorter), so consecutive windows overlap by exactly window - stride_ residues.
    // Counted before any is made: a 6 M-residue protein would be ~11,700 windows, 0.6 GB of rows.
    const uint64_t stride = static_cast<uint64_t>(stride_);
    const uint64_t n_windows = n <= window ? 1 : (n - window + stride - 1) / stride + 1;
    if (max_windows_ > 0 && n_windows > static_cast<uint64_t>(max_windows_))
      fail(TSR_OUT_OF_RANGE,
           item_message(item, r.name, 0,
                        std::to_string(n) + " " + unit() + " make " + std::to_string(n_windows) + " windows of " +
                            std::to_string(window) + " every " + std::to_string(stride_) + ", more than max_windows " +
                            std::to_string(max_windows_) +
                            " (the limit on windows per item): raise max_windows (0: no limit), a longer stride, "
                            "or length_policy: truncate"));
    std::vector<Sequence> out;
    out.reserve(static_cast<size_t>(n_windows));
    for (size_t begin = 0;; begin += static_cast<size_t>(stride_)) {
      const size_t end = begin + window < n ? begin + window : n;
      out.push_back(rows(r, begin, end, std::string("w").append(std::to_string(out.size()))));
      if (end == n) break;
    }
    return out;
  }

  // Residues as their letters; <unk> and <mask> as their tokens, so that every residue keeps its
  // place and the text encodes back to the same ids; <cls>, <eos>, <pad> and <null_1> are dropped.
  std::string decode(const std::vector<int32_t>& ids) const {
    std::string text;
    text.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      if (id < 0 || id >= kVocabSize)
        fail(TSR_OUT_OF_RANGE, "decode: id " + std::to_string(id) + " at position " + std::to_string(i) +
                                   " is outside the ESM-2 vocabulary [0, " + std::to_string(kVocabSize) +
                                   ")");
      if (id == kCls || id == kEos || id == kPad || id == kNull1) continue;
      text += kTokens[static_cast<size_t>(id)];
    }
    return text;
  }

 private:
  // What one row of sequence is, in messages.
  const char* unit() const { return esm_ ? "tokens" : "residues"; }

  // <cls> tokens [begin, end) <eos>, each token row with the absolute residue indices it stands for
  // as provenance ([i, i+1) for one residue).
  static Sequence rows(const Record& r, size_t begin, size_t end, std::string label) {
    Sequence s;
    s.kind = TSR_ROWS_IDS;
    const size_t n = end - begin + 2;
    s.ids.reserve(n);
    s.positions.reserve(2 * n);
    s.roles.reserve(n);
    s.provenance.reserve(n);
    s.add_id(kCls, TSR_ROLE_CLS, tessera::plugin::no_provenance());
    int64_t offset = 0;  // extra residues of the runs before token i
    size_t k = 0;        // the next run
    while (k < r.runs.size() && r.runs[k].first < begin) offset += r.runs[k++].second;
    for (size_t i = begin; i < end; ++i) {
      const double first = static_cast<double>(static_cast<int64_t>(i) + offset);
      if (k < r.runs.size() && r.runs[k].first == i) offset += r.runs[k++].second;
      s.add_id(r.ids[i], role_of(r.ids[i]),
               tessera::plugin::residues(first, static_cast<double>(static_cast<int64_t>(i) + 1 + offset)));
    }
    s.add_id(kEos, TSR_ROLE_EOS, tessera::plugin::no_provenance());
    s.label = std::move(label);
    return s;
  }

  bool esm_;
  int64_t max_length_;
  LengthPolicy policy_;
  int64_t stride_;
  int64_t max_windows_;
  FastaReader reader_;
  EsmTextSplitter splitter_;
};

const tsr_option_spec kOptions[] = {
    {sizeof(tsr_option_spec), "tokenizer", TSR_OPT_ENUM, "esm",
     "esm: transformers' EsmTokenizer's ids (a run of unknown letters is one <unk>, whitespace cuts "
     "runs, <cls> etc. written out are tokens; a FASTA record's sequence is its lines joined; a "
     "character no protein sequence holds fails the item); residues: one row per residue letter, one "
     "<unk> per unknown letter",
     "esm|residues"},
    {sizeof(tsr_option_spec), "max_length", TSR_OPT_INT, "1024",
     "rows per sequence, <cls> and <eos> included (ESM-2: 1024 = 1022 residues + 2)", nullptr},
    {sizeof(tsr_option_spec), "length_policy", TSR_OPT_ENUM, "error",
     "a longer sequence fails the item (error), keeps its first max_length - 2 tokens (truncate), or "
     "becomes overlapping windows w0, w1, ... (windows)",
     "error|truncate|windows"},
    {sizeof(tsr_option_spec), "stride", TSR_OPT_INT, "0",
     "windows: tokens (rows) from one window's start to the next, 1 to max_length - 2; 0 = half a window",
     nullptr},
    {sizeof(tsr_option_spec), "max_windows", TSR_OPT_INT, "2048",
     "windows: the most windows one item may become (0: no limit); a longer sequence fails the item "
     "before any window is made (2048 ESM-2 windows cover about 1 M residues)",
     nullptr},
    {sizeof(tsr_option_spec), "uppercase", TSR_OPT_BOOL, "false",
     "read lower-case letters as their upper-case residues; false: they are unknown letters, as in "
     "EsmTokenizer",
     nullptr},
    {sizeof(tsr_option_spec), "unknown", TSR_OPT_ENUM, "unk",
     "what the vocabulary lacks (J, lower case unless uppercase, and under tokenizer: esm a bare "
     "sequence's final '*') reads as <unk>, or fails the item (error)",
     "unk|error"},
};

const tsr_plugin_info kInfo = {sizeof(tsr_plugin_info),
                               "protein",
                               "protein",
                               "1.2.0",
                               "protein sequences (FASTA records or bare sequences) as ESM-2 token ids, "
                               "as EsmTokenizer gives them",
                               kOptions,
                               sizeof(kOptions) / sizeof(kOptions[0]),
                               TSR_INPUT_TEXT,
                               ".fasta|.fa|.faa"};

}  // namespace
}  // namespace tessera_protein

TESSERA_DEFINE_PLUGIN(tessera_protein::Protein, tessera_protein::kInfo)
