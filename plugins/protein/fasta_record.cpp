// One FASTA record or bare sequence -> ESM-2 ids, byte by byte through a 256-entry action table.
// Every byte that is not part of the sequence's grammar fails the item with its place; nothing here
// splits records, truncates or windows.
#include "fasta_record.h"

#include <cstdio>
#include <string_view>

#include "esm_alphabet.h"

namespace tessera_protein {
namespace {

using tessera::plugin::fail;
using tessera::plugin::Item;

// Actions for bytes that are not residue ids.
enum : int16_t {
  kSkip = -1,     // whitespace inside or between sequence lines
  kNewline = -2,  // '\n': the next byte starts a line
  kStop = -3,     // '*': a stop codon, allowed once at the very end
  kToken = -4,    // '<': <mask> or <unk>
  kUnknown = -5,  // a letter outside the alphabet
  kHeader = -6,   // '>': a header line where only sequence may be
  kBad = -7       // anything else: digits, punctuation, controls, non-ASCII bytes
};

constexpr size_t kNameLimit = 120;  // bytes of a record name quoted in messages

const char* const kResidueHint =
    "a sequence holds the letters A-Z, the gaps '.' and '-', <mask>, <unk>, and one '*' at its end";

bool header_space(char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }

// The record name cut to kNameLimit bytes, never inside a UTF-8 character.
std::string short_name(std::string_view name) {
  if (name.size() <= kNameLimit) return std::string(name);
  size_t cut = kNameLimit;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  return std::string(name.substr(0, cut)) + "...";
}

std::string hex_byte(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", c);
  return buf;
}

}  // namespace

size_t utf8_length(std::string_view text, size_t i, uint32_t* code_point) {
  const unsigned char c = static_cast<unsigned char>(text[i]);
  size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  uint32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) {
    const unsigned char t = static_cast<unsigned char>(text[i + k]);
    if ((t & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (t & 0x3F);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
      (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0;
  *code_point = cp;
  return n;
}

std::string describe_char(std::string_view text, size_t i) {
  const unsigned char c = static_cast<unsigned char>(text[i]);
  if (c >= 0x20 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
  if (c < 0x80) return "byte " + hex_byte(c) + " (a control character)";
  uint32_t cp = 0;
  if (const size_t n = utf8_length(text, i, &cp)) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(cp));
    return std::string(1, '\'').append(text.substr(i, n)).append("' (").append(buf).append(", not ASCII)");
  }
  return "byte " + hex_byte(c) + " (not UTF-8)";
}

std::string item_message(const Item& item, const std::string& name, size_t offset, const std::string& what) {
  const std::string_view text = item.text();
  size_t line = item.source_line > 0 ? item.source_line : 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset && i < text.size(); ++i)
    if (text[i] == '\n') ++line, line_start = i + 1;
  const size_t column = offset - line_start + 1;  // bytes; all before `offset` on its line are ASCII
  const std::string file(item.source.empty() ? item.id : item.source);
  std::string subject;
  if (!item.source.empty()) subject = std::string(item.id);
  if (!name.empty()) subject += subject.empty() ? "record " + name : " (record " + name + ")";
  return file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " +
         (subject.empty() ? "" : subject + ": ") + what;
}

FastaReader::FastaReader(bool uppercase, bool unknown_is_error, bool merge_unknown_runs)
    : uppercase_(uppercase), unknown_is_error_(unknown_is_error), merge_unknown_runs_(merge_unknown_runs) {
  action_.fill(kBad);
  for (int c = 0; c < 256; ++c) {
    const bool lower = c >= 'a' && c <= 'z';
    if (lower || (c >= 'A' && c <= 'Z')) action_[c] = kUnknown;
    const int32_t id = letter_id(static_cast<char>(uppercase && lower ? c - 'a' + 'A' : c));
    if (id >= 0) action_[c] = static_cast<int16_t>(id);
  }
  for (char c : {' ', '\t', '\r', '\v', '\f'}) action_[static_cast<unsigned char>(c)] = kSkip;
  action_['\n'] = kNewline;
  action_['*'] = kStop;
  action_['<'] = kToken;
  action_['>'] = kHeader;
}

Record FastaReader::read(const Item& item) const {
  const std::string_view text = item.text();
  Record r;
  size_t i = 0;
  const bool has_header = !text.empty() && text[0] == '>';
  if (has_header) {
    i = text.find_first_of("\r\n");
    if (i == std::string_view::npos) i = text.size();
    const std::string_view header = text.substr(1, i - 1);
    size_t b = 0;
    while (b < header.size() && header_space(header[b])) ++b;
    if (b == header.size())
      fail(TSR_BAD_INPUT,
           item_message(item, "", 1, "empty FASTA header: '>' must be followed by the record's name"));
    size_t e = b;
    while (e < header.size() && !header_space(header[e])) ++e;
    r.name = short_name(header.substr(b, e - b));
  }
  auto bad = [&](size_t at, const std::string& what) {
    fail(TSR_BAD_INPUT, item_message(item, r.name, at, what));
  };

  r.ids.reserve(text.size() - i);
  size_t stop_at = std::string_view::npos;  // where a '*' was seen
  bool line_start = !has_header;
  bool in_unknown_run = false;  // the last residue was an unknown letter (blanks between do not count)
  for (; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const int16_t a = action_[c];
    const bool at_line_start = line_start;
    line_start = a == kNewline;
    if (a == kSkip || a == kNewline) continue;
    if (stop_at != std::string_view::npos)
      bad(stop_at,
          "'*' (a stop) before the end of the sequence; a '*' may only end it: remove it or split the "
          "record");
    if (a >= 0) {
      r.ids.push_back(a);
      in_unknown_run = false;
      continue;
    }
    switch (a) {
      case kStop:
        stop_at = i;
        break;
      case kUnknown:
        if (unknown_is_error_)
          bad(i,
              describe_char(text, i) + " is not in the ESM-2 alphabet" +
                  (!uppercase_ && c >= 'a' && c <= 'z' ? " (its letters are upper case: set uppercase: true)"
                                                       : " (set unknown: unk to read it as <unk>)"));
        if (merge_unknown_runs_ && in_unknown_run) {
          r.extend_last();  // the run's <unk> stands for one more residue
        } else {
          r.ids.push_back(kUnk);
        }
        in_unknown_run = true;
        break;
      case kToken: {
        const std::string_view rest = text.substr(i);
        in_unknown_run = false;
        if (rest.substr(0, 6) == "<mask>") {
          r.ids.push_back(kMask);
          i += 5;
        } else if (rest.substr(0, 5) == "<unk>") {
          r.ids.push_back(kUnk);
          i += 4;
        } else {
          bad(i,
              "'<' starts no token a sequence may hold: only <mask> and <unk> may appear inside one, each on "
              "one line");
        }
        break;
      }
      case kHeader:
        if (at_line_start)
          bad(i, "a '>' header line inside the " + std::string(has_header ? "record" : "sequence") +
                     ": each FASTA record must be its own item");
        bad(i, describe_char(text, i) + " is not a residue; " + kResidueHint);
        break;
      default:
        bad(i, describe_char(text, i) + " is not a residue; " + kResidueHint);
    }
  }
  if (r.ids.empty()) {
    if (has_header)
      bad(0, "the record has no residues after its header: add its sequence or remove the record");
    bad(0, "an empty sequence: give at least one residue");
  }
  return r;
}

}  // namespace tessera_protein
