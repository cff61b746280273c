// The text plugin (plugins/text) through the real plugin ABI: ids identical to Hugging Face's
// GPT-2 and BERT fast tokenizers on a 10,000-line real corpus (tests/data/text, made by
// tools/reference/make_text_fixtures.py), byte spans, roles, special rows, length policy, decoding,
// and one test per bad item and bad option with its message. It also compiles the plugin's Unicode
// files in, to check their view of every code point against the reference's. Never runs Python.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pretokenize.h"
#include "process_util.h"
#include "tessera/plugins.h"
#include "unicode.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

const std::string kData = TESSERA_TEST_DATA "/text/";
const std::string kPluginFile = TESSERA_PLUGIN_BUILD_DIR "/libtessera_text.so";

std::shared_ptr<const Plugin> plugin() {
  static std::shared_ptr<const Plugin> p = [] {
    auto r = Plugin::load(kPluginFile);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : nullptr;
  }();
  return p;
}

using Opts = std::map<std::string, std::string>;

// Every option, as the host passes them: the plugin's defaults, overridden by `given`.
std::vector<std::pair<std::string, std::string>> all_options(const Opts& given) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const PluginOptionSpec& s : plugin()->options()) {
    const auto it = given.find(s.name);
    out.emplace_back(s.name, it != given.end() ? it->second : s.default_value.value_or(""));
  }
  return out;
}

// The vocabulary options of each tokenizer, on the committed files.
Opts files_of(const std::string& tokenizer) {
  if (tokenizer == "bpe")
    return {{"tokenizer", "bpe"}, {"vocab", kData + "encoder.json"}, {"merges", kData + "vocab.bpe"}};
  if (tokenizer == "wordpiece") return {{"tokenizer", "wordpiece"}, {"vocab", kData + "vocab.txt"}};
  if (tokenizer == "chars") return {{"tokenizer", "chars"}, {"vocab", kData + "chars.txt"}};
  return {{"tokenizer", "bytes"}};
}

Result<Encoder> create(const std::string& tokenizer, Opts more = {}) {
  Opts o = files_of(tokenizer);
  for (const auto& [k, v] : more) o[k] = v;
  return Encoder::create(plugin(), all_options(o));
}

Encoder encoder(const std::string& tokenizer, Opts more = {}) {
  auto e = create(tokenizer, std::move(more));
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e).value();
}

// The one message create() fails with, without the "plugin text (<file>): " prefix.
std::string create_error(const std::string& tokenizer, Opts more) {
  auto e = create(tokenizer, std::move(more));
  if (e.ok()) return "(created)";
  const std::string prefix = "plugin text (" + kPluginFile + "): ";
  const std::string& m = e.status().message();
  return m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m;
}

PluginItem item(const std::string& text, const std::string& id = "lines.txt:7",
                const std::string& source = "", uint32_t line = 0) {
  PluginItem it;
  it.id = id;
  it.source = source;
  it.source_line = line;
  it.data = text;
  return it;
}

TokenRows encode_one(const Encoder& e, const std::string& text) {
  auto r = e.encode(item(text));
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return {};
  EXPECT_EQ(r->size(), 1u);
  return std::move((*r)[0]);
}

// decode(), or the message it failed with.
std::string decoded(const Encoder& e, const std::vector<int32_t>& ids) {
  auto r = e.decode(ids);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : "(failed) " + r.status().message();
}

std::string encode_error(const Encoder& e, const PluginItem& it) {
  auto r = e.encode(it);
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "(encoded)";
  EXPECT_EQ(r.status().code(), Code::parse_error);  // TSR_BAD_INPUT
  return r.status().message();
}

std::pair<int64_t, int64_t> span(const TokenRows& r, size_t i) {
  const tsr_provenance& p = r.provenance[i];
  if (p.kind == TSR_PROV_NONE) return {-1, -1};
  EXPECT_EQ(p.kind, TSR_PROV_BYTES);
  return {static_cast<int64_t>(p.x0), static_cast<int64_t>(p.x1)};
}

std::vector<std::pair<int64_t, int64_t>> spans(const TokenRows& r) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t i = 0; i < r.roles.size(); ++i) out.push_back(span(r, i));
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> corpus_lines() {
  const std::string all = read_file(kData + "corpus.txt");
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = all.find('\n', start)) != std::string::npos; start = nl + 1)
    lines.push_back(all.substr(start, nl - start));
  return lines;
}

// A little-endian reader of the fixture's binary files (layout in tests/data/text/README.md).
struct Reader {
  std::string bytes;
  size_t at = 0;
  template <class T>
  T next() {
    T v{};
    if (at + sizeof(T) > bytes.size())
      ADD_FAILURE() << "fixture file too short";
    else
      std::memcpy(&v, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  uint32_t header() {
    EXPECT_EQ(bytes.substr(0, 4), "TTXR");
    at = 4;
    EXPECT_EQ(next<uint32_t>(), 1u);
    return next<uint32_t>();
  }
};

// The reference ids of every corpus line.
std::vector<std::vector<int32_t>> reference_ids(const std::string& file) {
  Reader r{read_file(kData + file)};
  const uint32_t n = r.header();
  std::vector<uint16_t> counts(n);
  for (auto& c : counts) c = r.next<uint16_t>();
  std::vector<std::vector<int32_t>> ids(n);
  for (uint32_t i = 0; i < n; ++i)
    for (uint16_t k = 0; k < counts[i]; ++k) ids[i].push_back(r.next<uint16_t>());
  EXPECT_EQ(r.at, r.bytes.size());
  return ids;
}

uint32_t fnv1a32(const void* data, size_t n, uint32_t h = 0x811c9dc5u) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x01000193u;
  return h;
}

// A file written for one test, removed when it goes out of scope.
struct TempFile {
  std::string path;
  TempFile(const std::string& name, const std::string& content)
      : path(::testing::TempDir() + "tessera_text_" + std::to_string(::getpid()) + "_" + name) {
    std::ofstream(path, std::ios::binary) << content;
  }
  ~TempFile() { fs::remove(path); }
};

}  // namespace

// ---- The plugin describes itself -----------------------------------------------------------------

TEST(TextPlugin, DescribesItselfAndItsOptions) {
  ASSERT_TRUE(plugin());
  EXPECT_EQ(plugin()->name(), "text");
  EXPECT_EQ(plugin()->modality(), "text");
  EXPECT_EQ(plugin()->input_kind(), TSR_INPUT_TEXT);
  EXPECT_EQ(plugin()->extensions(), std::vector<std::string>{".txt"});
  std::vector<std::string> names;
  for (const auto& o : plugin()->options())
    names.push_back(o.name + "=" + o.default_value.value_or("(required)"));
  EXPECT_EQ(names, (std::vector<std::string>{"tokenizer=bytes", "vocab=", "merges=", "lowercase=auto",
                                             "strip_accents=auto", "add_special=auto", "max_length=0",
                                             "length_policy=error", "skip_special_tokens=false",
                                             "max_bytes=4194304"}));
  EXPECT_EQ(plugin()->options()[0].choices, (std::vector<std::string>{"bytes", "chars", "bpe", "wordpiece"}));
  EXPECT_EQ(plugin()->options()[1].type, TSR_OPT_PATH);
  EXPECT_EQ(plugin()->options()[6].type, TSR_OPT_INT);
}

TEST(TextPlugin, EncoderInfoPerTokenizer) {
  const struct {
    const char* tokenizer;
    int64_t vocab;
    int32_t pad;
  } expected[] = {
      {"bytes", 259, 258}, {"chars", 74 + 4, 74 + 3}, {"bpe", 50257, -1}, {"wordpiece", 30522, 0}};
  for (const auto& x : expected) {
    const Encoder e = encoder(x.tokenizer, {{"max_length", "64"}, {"length_policy", "truncate"}});
    EXPECT_EQ(e.info().rows_kind, TSR_ROWS_IDS) << x.tokenizer;
    EXPECT_EQ(e.info().vocab_size, x.vocab) << x.tokenizer;
    EXPECT_EQ(e.info().pad_id, x.pad) << x.tokenizer;
    EXPECT_EQ(e.info().causal, std::string(x.tokenizer) == "wordpiece" ? 0 : 1) << x.tokenizer;
    EXPECT_EQ(e.info().max_rows, 64) << x.tokenizer;
  }
}

// ---- Parity with Hugging Face on the corpus -------------------------------------------------------

TEST(TextParity, CorpusIsRealAndLarge) {
  const std::vector<std::string> lines = corpus_lines();
  EXPECT_GE(lines.size(), 10000u);
  size_t non_ascii = 0, tabs = 0, runs = 0, digits = 0, emoji = 0;
  for (const std::string& l : lines) {
    non_ascii +=
        std::any_of(l.begin(), l.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
    tabs += l.find('\t') != std::string::npos;
    runs += l.find("  ") != std::string::npos;
    digits += std::any_of(l.begin(), l.end(), [](char c) { return c >= '0' && c <= '9'; });
    emoji += l.find("\xF0\x9F") != std::string::npos;  // U+1Fxxx
  }
  EXPECT_GT(non_ascii, 1900u);
  EXPECT_GT(tabs, 3500u);
  EXPECT_GT(runs, 5500u);
  EXPECT_GT(digits, 6000u);
  EXPECT_GT(emoji, 1800u);
}

// GPT-2 BPE: ids identical on every line; the byte spans tile the line and each row's bytes are
// its token's; decode gives every line back exactly.
TEST(TextParity, BpeIdsEqualHuggingFaceOnTheCorpus) {
  const Encoder e = encoder("bpe");
  const std::vector<std::string> lines = corpus_lines();
  const auto expected = reference_ids("corpus.bpe.bin");
  ASSERT_EQ(expected.size(), lines.size());
  size_t lines_equal = 0, tokens = 0, tokens_equal = 0, spans_ok = 0, round_trips = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const TokenRows r = encode_one(e, lines[i]);
    tokens += expected[i].size();
    for (size_t k = 0; k < std::min(r.ids.size(), expected[i].size()); ++k)
      tokens_equal += r.ids[k] == expected[i][k];
    if (r.ids == expected[i])
      ++lines_equal;
    else
      ADD_FAILURE() << "corpus line " << i + 1 << " differs (see make_text_fixtures.py --show-line " << i + 1
                    << ")";
    bool tiled = !r.ids.empty() && span(r, 0).first == 0 &&
                 span(r, r.ids.size() - 1).second == int64_t(lines[i].size());
    for (size_t k = 0; tiled && k < r.ids.size(); ++k) {
      const auto [b0, b1] = span(r, k);
      tiled =
          (k == 0 || b0 == span(r, k - 1).second) && decoded(e, {r.ids[k]}) == lines[i].substr(b0, b1 - b0);
    }
    spans_ok += tiled;
    round_trips += decoded(e, r.ids) == lines[i];
  }
  EXPECT_EQ(lines_equal, lines.size());
  EXPECT_EQ(tokens_equal, tokens);
  EXPECT_EQ(spans_ok, lines.size());
  EXPECT_EQ(round_trips, lines.size());
  std::printf(
      "[ bpe       ] %zu/%zu lines, %zu/%zu tokens identical; spans and round trips exact on %zu lines\n",
      lines_equal, lines.size(), tokens_equal, tokens, round_trips);
}

// BERT WordPiece: ids identical on every line; byte spans and decoded text equal the reference's
// (compared through 32-bit FNV-1a hashes, to keep the fixture small).
TEST(TextParity, WordPieceIdsEqualHuggingFaceOnTheCorpus) {
  const Encoder e = encoder("wordpiece");
  const std::vector<std::string> lines = corpus_lines();
  const auto expected = reference_ids("corpus.wordpiece.bin");
  Reader hashes{read_file(kData + "corpus.wordpiece.hashes")};
  ASSERT_EQ(hashes.header(), lines.size());
  ASSERT_EQ(expected.size(), lines.size());
  size_t lines_equal = 0, tokens = 0, tokens_equal = 0, spans_equal = 0, decodes_equal = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const TokenRows r = encode_one(e, lines[i]);
    tokens += expected[i].size();
    for (size_t k = 0; k < std::min(r.ids.size(), expected[i].size()); ++k)
      tokens_equal += r.ids[k] == expected[i][k];
    const std::string where = "corpus line " + std::to_string(i + 1) +
                              " (see make_text_fixtures.py --show-line " + std::to_string(i + 1) + ")";
    if (r.ids == expected[i])
      ++lines_equal;
    else
      ADD_FAILURE() << where << ": ids differ";
    uint32_t h = 0x811c9dc5u;
    for (const auto& [b0, b1] : spans(r)) {
      const int32_t pair[2] = {static_cast<int32_t>(b0), static_cast<int32_t>(b1)};
      h = fnv1a32(pair, sizeof pair, h);
    }
    const uint32_t spans_hash = hashes.next<uint32_t>(), decode_hash = hashes.next<uint32_t>();
    if (h == spans_hash)
      ++spans_equal;
    else
      ADD_FAILURE() << where << ": byte spans differ";
    const std::string text = decoded(e, r.ids);
    if (fnv1a32(text.data(), text.size()) == decode_hash)
      ++decodes_equal;
    else
      ADD_FAILURE() << where << ": decode gives \"" << text << "\"";
  }
  EXPECT_EQ(lines_equal, lines.size());
  EXPECT_EQ(tokens_equal, tokens);
  EXPECT_EQ(spans_equal, lines.size());
  EXPECT_EQ(decodes_equal, lines.size());
  std::printf(
      "[ wordpiece ] %zu/%zu lines, %zu/%zu tokens identical; spans equal on %zu, decode equal on %zu "
      "lines\n",
      lines_equal, lines.size(), tokens_equal, tokens, spans_equal, decodes_equal);
}

// Option variants (cased, accent stripping on and off, truncation, no specials, decode without
// specials) on a few texts, with the reference's ids, spans and decoded text.
TEST(TextParity, OptionVariantsEqualHuggingFace) {
  const nlohmann::json cases = nlohmann::json::parse(read_file(kData + "cases.json"));
  ASSERT_GE(cases.size(), 40u);
  std::map<std::string, Encoder> made;  // one encoder per set of options
  for (const auto& c : cases) {
    Opts o;
    for (const auto& [k, v] : c["options"].items()) o[k] = v.get<std::string>();
    const std::string text = c["text"].get<std::string>();
    const std::string label =
        c["tokenizer"].get<std::string>() + " " + c["options"].dump() + " on \"" + text + "\"";
    const std::string key = c["tokenizer"].get<std::string>() + c["options"].dump();
    if (!made.count(key)) made.emplace(key, encoder(c["tokenizer"].get<std::string>(), o));
    const Encoder& e = made.at(key);
    const TokenRows r = encode_one(e, text);
    EXPECT_EQ(r.ids, c["ids"].get<std::vector<int32_t>>()) << label;
    if (c.contains("spans")) {
      std::vector<std::pair<int64_t, int64_t>> want;
      for (const auto& s : c["spans"]) want.emplace_back(s[0].get<int64_t>(), s[1].get<int64_t>());
      std::vector<std::pair<int64_t, int64_t>> got = spans(r);
      for (auto& s : got)
        if (s.first < 0) s = {0, 0};  // the reference gives special rows (0, 0)
      EXPECT_EQ(got, want) << label;
    }
    // Hugging Face decodes GPT-2's bytes lossily (U+FFFD for a character cut by truncation); this
    // plugin gives the exact bytes back.
    const std::string want = c["decoded"].get<std::string>();
    if (c["tokenizer"] == "bpe" && want.find("\xEF\xBF\xBD") != std::string::npos)
      EXPECT_EQ(decoded(e, r.ids), text.substr(0, span(r, r.ids.size() - 1).second)) << label;
    else
      EXPECT_EQ(decoded(e, r.ids), want) << label;
  }
}

// Every code point, as GPT-2's pre-tokeniser and BERT's normaliser and pre-tokeniser see it,
// against what the reference did with it (unicode_reference.txt, see README.md).
TEST(TextUnicode, EveryCodePointAsTheReferenceSeesIt) {
  std::istringstream in(read_file(kData + "unicode_reference.txt"));
  std::vector<std::pair<char32_t, std::string>> runs;
  std::map<char32_t, std::u32string> normalized;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    std::string kind, cp;
    f >> kind >> cp;
    const auto code = static_cast<char32_t>(std::stoul(cp, nullptr, 16));
    if (kind == "R") {
      std::string classes;
      f >> classes;
      runs.emplace_back(code, classes);
    } else {
      std::u32string s;
      for (std::string x; f >> x;)
        if (x != "-") s += static_cast<char32_t>(std::stoul(x, nullptr, 16));
      normalized[code] = s;
    }
  }
  ASSERT_GT(runs.size(), 1000u);
  using namespace tessera::text;
  size_t checked = 0, wrong = 0, run = 0;
  // Buffers reused across the 1.1 M code points: the loop allocates nothing of its own (under
  // ASan allocations cost most of its time). raw is always 3 long, so its buffer stays exactly
  // 3 long: bert_split reading past it still lands in ASan's redzone.
  std::vector<Char> chars, out, raw;
  std::vector<Piece> pieces;
  std::u32string cleaned, full;
  auto make = [&](std::initializer_list<char32_t> s) {
    chars.clear();
    for (char32_t c : s)
      chars.push_back({c, static_cast<uint32_t>(chars.size()), static_cast<uint32_t>(chars.size() + 1)});
  };
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    while (run + 1 < runs.size() && runs[run + 1].first <= cp) ++run;
    const std::string& want = runs[run].second;  // GPT-2 class, BERT split class, clean-up kind
    // GPT-2: the pieces of "!" c c "a".
    make({U'!', cp, cp, U'a'});
    pieces.clear();
    gpt2_split(chars.data(), chars.size(), pieces);
    int lengths = 0;  // the pieces' lengths as decimal digits (4 characters: each length < 10)
    for (const Piece& p : pieces) lengths = lengths * 10 + static_cast<int>(p.end - p.begin);
    const char g = lengths == 13                                        ? 'L'
                   : lengths == 121                                     ? 'N'
                   : lengths == 31                                      ? 'O'
                   : (lengths == 1111 || (cp == ' ' && lengths == 112)) ? 'S'
                                                                        : '?';
    // BERT's pre-tokeniser on "a" c "b": 3 words (punctuation), 2 (whitespace) or 1.
    make({U'a', cp, U'b'});
    pieces.clear();
    raw.assign(chars.begin(), chars.end());
    bert_split(raw, pieces);
    const char b = pieces.size() == 3 ? 'P' : pieces.size() == 2 ? 'W' : '-';
    // BERT's clean-up alone, then the whole normaliser (lower-casing, accent stripping).
    make({cp});
    out.clear();
    bert_normalize(chars.data(), chars.size(), {false, false, true}, out);
    cleaned.clear();
    for (const Char& c : out) cleaned += c.cp;
    const char k = cleaned.empty()                             ? 'R'
                   : cleaned == U" "                           ? 'S'
                   : cleaned == std::u32string{cp}             ? 'K'
                   : cleaned == std::u32string{U' ', cp, U' '} ? 'C'
                                                               : '?';
    out.clear();
    bert_normalize(chars.data(), chars.size(), {true, true, true}, out);
    full.clear();
    for (const Char& c : out) full += c.cp;
    const auto n = normalized.find(cp);
    const bool full_ok = n != normalized.end() ? full == n->second
                         : want[2] == 'R'      ? full.empty()
                         : want[2] == 'S'      ? full == U" "
                         : want[2] == 'C'      ? full.size() == 3 && full[0] == U' ' && full[1] == cp && full[2] == U' '
                                               : full.size() == 1 && full[0] == cp;
    ++checked;
    if (want.size() != 3 || want[0] != g || want[1] != b || want[2] != k || !full_ok) {
      if (++wrong <= 20)
        ADD_FAILURE() << "U+" << std::hex << uint32_t(cp) << ": " << g << b << k << " want " << want;
    }
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(checked, 0x110000u - 0x800u);
}

// ---- Rows: roles, positions, provenance -----------------------------------------------------------

TEST(TextRows, BytesAreIdsWithByteSpans) {
  const Encoder e = encoder("bytes");
  const std::string text = "h\xC3\xA9\xFF";  // é, then a byte that is not UTF-8: bytes takes any
  const TokenRows r = encode_one(e, text);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{'h', 0xC3, 0xA9, 0xFF}));
  EXPECT_EQ(spans(r), (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
  EXPECT_EQ(r.positions[3], (std::array<int32_t, 2>{3, -1}));
  EXPECT_EQ(r.roles, std::vector<uint8_t>(4, TSR_ROLE_CONTENT));
  EXPECT_EQ(decoded(e, r.ids), text);
  const Encoder special = encoder("bytes", {{"add_special", "true"}});
  const TokenRows s = encode_one(special, "ab");
  EXPECT_EQ(s.ids, (std::vector<int32_t>{256, 'a', 'b', 257}));
  EXPECT_EQ(s.roles, (std::vector<uint8_t>{TSR_ROLE_BOS, TSR_ROLE_CONTENT, TSR_ROLE_CONTENT, TSR_ROLE_EOS}));
  EXPECT_EQ(s.provenance[0].kind, TSR_PROV_NONE);
  EXPECT_EQ(span(s, 1), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(s.positions[3], (std::array<int32_t, 2>{3, -1}));
  EXPECT_EQ(decoded(special, {256, 'o', 'k', 257, 258}), "ok");  // specials have no text
}

TEST(TextRows, CharsHaveMultiByteSpansAndUnknowns) {
  const Encoder e = encoder("chars", {{"add_special", "true"}});
  // chars.txt holds the characters of the corpus's Bible lines, in order of first appearance.
  const std::string text = "God \xC3\xA9 \xF0\x9F\x91\x8D!";  // "God é 👍!"
  const TokenRows r = encode_one(e, text);
  ASSERT_EQ(r.ids.size(), 10u);  // BOS G o d ' ' é ' ' 👍 ! EOS
  EXPECT_EQ(r.roles[0], TSR_ROLE_BOS);
  EXPECT_EQ(r.roles[1], TSR_ROLE_CONTENT);
  EXPECT_EQ(r.ids[1], 0);               // 'G', the first line of chars.txt
  EXPECT_EQ(r.roles[5], TSR_ROLE_UNK);  // é is not in chars.txt
  EXPECT_EQ(r.ids[5], 74);
  EXPECT_EQ(span(r, 5), (std::pair<int64_t, int64_t>{4, 6}));
  EXPECT_EQ(r.roles[7], TSR_ROLE_UNK);  // 👍: four bytes
  EXPECT_EQ(span(r, 7), (std::pair<int64_t, int64_t>{7, 11}));
  EXPECT_EQ(span(r, 8), (std::pair<int64_t, int64_t>{11, 12}));
  EXPECT_EQ(r.roles[9], TSR_ROLE_EOS);
  EXPECT_EQ(span(r, 9).first, -1);
  EXPECT_EQ(decoded(e, r.ids), "God \xEF\xBF\xBD \xEF\xBF\xBD!");  // unknowns come back as U+FFFD
}

TEST(TextRows, BpeSpansPointAtTheBytesOfMultiByteCharactersAndEmoji) {
  const Encoder e = encoder("bpe");
  const std::string text = "caf\xC3\xA9 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD ok";  // "café 👍🏽 ok"
  const TokenRows r = encode_one(e, text);
  std::string joined;
  for (size_t i = 0; i < r.ids.size(); ++i) {
    const auto [b0, b1] = span(r, i);
    EXPECT_EQ(decoded(e, {r.ids[i]}), text.substr(b0, b1 - b0)) << "row " << i;
    EXPECT_EQ(r.roles[i], TSR_ROLE_CONTENT);
    joined += text.substr(b0, b1 - b0);
  }
  EXPECT_EQ(joined, text);
  // The emoji pair is split across byte-level tokens that can end inside a character.
  bool inside = false;
  for (size_t i = 0; i < r.ids.size(); ++i)
    inside = inside || (span(r, i).second > 6 && span(r, i).second < 14);
  EXPECT_TRUE(inside);
}

TEST(TextRows, BpeSpecialTokenInTheTextAndAddSpecial) {
  const Encoder e = encoder("bpe");
  const TokenRows r = encode_one(e, "before<|endoftext|>after");
  EXPECT_EQ(r.ids, (std::vector<int32_t>{19052, 50256, 8499}));
  EXPECT_EQ(r.roles[1], TSR_ROLE_EOS);
  EXPECT_EQ(span(r, 1), (std::pair<int64_t, int64_t>{6, 19}));
  const Encoder add = encoder("bpe", {{"add_special", "true"}, {"skip_special_tokens", "true"}});
  const TokenRows a = encode_one(add, "Hello");
  EXPECT_EQ(a.ids, (std::vector<int32_t>{15496, 50256}));
  EXPECT_EQ(a.roles[1], TSR_ROLE_EOS);
  EXPECT_EQ(a.provenance[1].kind, TSR_PROV_NONE);
  EXPECT_EQ(decoded(add, a.ids), "Hello");
  EXPECT_EQ(decoded(e, a.ids), "Hello<|endoftext|>");
}

TEST(TextRows, WordPieceRolesAndSpans) {
  const Encoder e = encoder("wordpiece");
  // "Héllo, 世界 [SEP] 👍": accent stripped, CJK split per character (界 is not in the vocabulary),
  // [SEP] written in the text, the emoji unknown.
  const std::string text = "H\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C [SEP] \xF0\x9F\x91\x8D";
  const TokenRows r = encode_one(e, text);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{101, 7592, 1010, 1745, 100, 102, 100, 102}));
  EXPECT_EQ(r.roles, (std::vector<uint8_t>{TSR_ROLE_CLS, TSR_ROLE_CONTENT, TSR_ROLE_CONTENT, TSR_ROLE_CONTENT,
                                           TSR_ROLE_UNK, TSR_ROLE_SEP, TSR_ROLE_UNK, TSR_ROLE_SEP}));
  EXPECT_EQ(spans(r), (std::vector<std::pair<int64_t, int64_t>>{
                          {-1, -1}, {0, 6}, {6, 7}, {8, 11}, {11, 14}, {15, 20}, {21, 25}, {-1, -1}}));
  for (size_t i = 0; i < r.ids.size(); ++i)
    EXPECT_EQ(r.positions[i], (std::array<int32_t, 2>{int32_t(i), -1}));
}

TEST(TextRows, WordPieceLongWordsAreUnknownAndPiecesCarryHashes) {
  const Encoder e = encoder("wordpiece", {{"add_special", "false"}});
  const TokenRows pieces = encode_one(e, "unaffable");
  EXPECT_EQ(pieces.ids, (std::vector<int32_t>{14477, 20961, 3468}));  // una ##ffa ##ble
  EXPECT_EQ(spans(pieces), (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 6}, {6, 9}}));
  EXPECT_EQ(decoded(e, pieces.ids), "unaffable");
  const TokenRows hundred =
      encode_one(e, std::string(100, 'a'));  // aaa ##aa ... ##a: 100 characters still spell
  EXPECT_EQ(hundred.ids.size(), 50u);
  EXPECT_EQ(hundred.ids[0], 13360);
  const TokenRows long_word = encode_one(e, std::string(101, 'a') + " b");
  EXPECT_EQ(long_word.ids, (std::vector<int32_t>{100, 1038}));
  EXPECT_EQ(span(long_word, 0), (std::pair<int64_t, int64_t>{0, 101}));
}

// ---- Length policy --------------------------------------------------------------------------------

TEST(TextLength, TruncateKeepsTheFirstRowsAndTheSpecials) {
  const Encoder e = encoder("wordpiece", {{"max_length", "4"}, {"length_policy", "truncate"}});
  const TokenRows r = encode_one(e, "one two three four");
  EXPECT_EQ(r.ids, (std::vector<int32_t>{101, 2028, 2048, 102}));
  const Encoder b =
      encoder("bytes", {{"max_length", "3"}, {"length_policy", "truncate"}, {"add_special", "true"}});
  EXPECT_EQ(encode_one(b, "abc").ids, (std::vector<int32_t>{256, 'a', 257}));
  EXPECT_EQ(encode_one(b, "a").ids, (std::vector<int32_t>{256, 'a', 257}));
  const Encoder only = encoder("wordpiece", {{"max_length", "2"}, {"length_policy", "truncate"}});
  EXPECT_EQ(encode_one(only, "anything").ids, (std::vector<int32_t>{101, 102}));
}

TEST(TextLength, ErrorPolicyNamesTheItemTheCountAndWhereTheTextStopsFitting) {
  const Encoder e = encoder("wordpiece", {{"max_length", "4"}});
  EXPECT_EQ(encode_one(e, "one two").ids.size(), 4u);  // exactly max_length fits
  EXPECT_EQ(
      encode_error(e, item("one two three four", "lines.txt:7", "data/lines.txt", 7)),
      "lines.txt:7: 6 tokens with [CLS] and [SEP] are more than max_length 4; the text from byte 8 "
      "(data/lines.txt:7:9) on does not fit (set length_policy: truncate to cut it, or raise max_length)");
  const Encoder b = encoder("bpe", {{"max_length", "2"}});
  EXPECT_EQ(encode_error(b, item("Hello world again", "m.jsonl#3")),
            "m.jsonl#3: 3 tokens are more than max_length 2; the text from byte 11 on does not fit (set "
            "length_policy: truncate to cut it, or raise max_length)");
}

// ---- Decoding -------------------------------------------------------------------------------------

TEST(TextDecode, WordPieceCleansUpLikeHuggingFace) {
  const Encoder e = encoder("wordpiece");
  EXPECT_EQ(decoded(e, encode_one(e, "Don't stop, it's fine! Really? Yes.").ids),
            "[CLS] don't stop, it's fine! really? yes. [SEP]");
  const Encoder skip = encoder("wordpiece", {{"skip_special_tokens", "true"}});
  EXPECT_EQ(decoded(skip, encode_one(skip, "[MASK] is [UNK]").ids), "is");
  EXPECT_EQ(decoded(e, {}), "");
}

TEST(TextDecode, IdsOutsideTheVocabularyAreErrors) {
  const struct {
    const char* tokenizer;
    int32_t bad;
    const char* range;
  } cases[] = {{"bytes", 259, "[0, 259)"},
               {"chars", -1, "[0, 78)"},
               {"bpe", 50257, "[0, 50257)"},
               {"wordpiece", 30522, "[0, 30522)"}};
  for (const auto& c : cases) {
    const Encoder e = encoder(c.tokenizer);
    auto r = e.decode({1, 2, c.bad});
    ASSERT_FALSE(r.ok()) << c.tokenizer;
    EXPECT_EQ(r.status().code(), Code::out_of_range);
    EXPECT_EQ(r.status().message(), "plugin text (" + kPluginFile + "): decode: id " + std::to_string(c.bad) +
                                        " at position 2 is outside this vocabulary " + c.range);
  }
}

// ---- Bad items ------------------------------------------------------------------------------------

TEST(TextBadInput, InvalidUtf8NamesTheItemTheByteAndWhatToDo) {
  const std::string hint =
      "; tokenizer wordpiece reads UTF-8 text: convert the input (e.g. iconv -f latin1 -t "
      "utf-8) or use tokenizer: bytes";
  const Encoder e = encoder("wordpiece");
  const struct {
    std::string text, reason;
  } cases[] = {
      {"ab\xFF", "byte 2: byte 0xFF cannot start a character in UTF-8"},
      {"\x80", "byte 0: byte 0x80 is a continuation byte where a character should start"},
      {"caf\xE9 au lait",
       "byte 3: the 3-byte character starting with 0xE9 is cut short: byte 0x20 is not a "
       "continuation byte"},
      {"x\xE2\x82", "byte 1: the 3-byte character starting with 0xE2 is cut short by the end of the text"},
      {"\xC0\xAF", "byte 0: byte 0xC0 cannot start a character in UTF-8"},
      {"\xE0\x80\xAF", "byte 0: bytes starting with 0xE0 0x80 are an overlong encoding"},
      {"\xF0\x80\x80\xAF", "byte 0: bytes starting with 0xF0 0x80 are an overlong encoding"},
      {"\xED\xA0\x80",
       "byte 0: bytes 0xED 0xA0 0x80 encode a UTF-16 surrogate, which UTF-8 must not contain"},
      {"\xF4\x90\x80\x80", "byte 0: bytes starting with 0xF4 0x90 encode a value above U+10FFFF"},
  };
  for (const auto& c : cases)
    EXPECT_EQ(encode_error(e, item(c.text, "lines.txt:7")),
              "lines.txt:7: invalid UTF-8 at " + c.reason + hint);
  // With its source, the message gives line:col; in a multi-line item, the line within it.
  EXPECT_EQ(
      encode_error(e, item("first\nse\xFF", "notes.jsonl#2", "data/notes.jsonl", 40)),
      "notes.jsonl#2: invalid UTF-8 at byte 8 (data/notes.jsonl:41:3): byte 0xFF cannot start a character in "
      "UTF-8" +
          hint);
  // Every tokenizer that reads Unicode refuses it; bytes takes it.
  for (const char* t : {"chars", "bpe"})
    EXPECT_NE(encode_error(encoder(t), item("\xFF")).find("tokenizer " + std::string(t) + " reads UTF-8"),
              std::string::npos);
  EXPECT_EQ(encode_one(encoder("bytes"), "\xFF").ids, std::vector<int32_t>{255});
  EXPECT_TRUE(e.encode(item("fine")).ok());  // the encoder goes on after a bad item
}

TEST(TextBadInput, TextWithoutTokens) {
  EXPECT_EQ(
      encode_error(encoder("bpe"), item("", "lines.txt:3")),
      "lines.txt:3: the text gives no tokens (it is empty); remove such items, or set add_special: true to "
      "get <|endoftext|> rows");
  EXPECT_EQ(
      encode_error(encoder("wordpiece", {{"add_special", "false"}}), item(" \t\x01\xE2\x80\x8B", "l:4")),
      "l:4: the text gives no tokens (it holds only whitespace and characters BERT drops); remove such "
      "items, "
      "or set add_special: true to get [CLS] and [SEP] rows");
  EXPECT_EQ(encode_one(encoder("wordpiece"), "").ids, (std::vector<int32_t>{101, 102}));
  EXPECT_EQ(encode_one(encoder("bytes", {{"add_special", "true"}}), "").ids,
            (std::vector<int32_t>{256, 257}));
}

// ---- Bad options ----------------------------------------------------------------------------------

TEST(TextBadOption, MissingOrMisplacedFiles) {
  EXPECT_EQ(
      create_error("bytes", {{"vocab", kData + "vocab.txt"}}),
      "option vocab: tokenizer bytes reads no vocabulary; remove vocab or choose chars, bpe or wordpiece");
  EXPECT_EQ(
      create_error("wordpiece", {{"vocab", ""}}),
      "option vocab: tokenizer wordpiece needs vocab: the path of a BERT vocab.txt (one token per line)");
  EXPECT_EQ(create_error("chars", {{"vocab", ""}}),
            "option vocab: tokenizer chars needs vocab: a UTF-8 file with one character per line");
  EXPECT_EQ(create_error("bpe", {{"vocab", ""}}),
            "option vocab: tokenizer bpe needs vocab: the path of GPT-2's encoder.json");
  EXPECT_EQ(create_error("bpe", {{"merges", ""}}),
            "option merges: tokenizer bpe needs merges: the path of GPT-2's vocab.bpe");
  EXPECT_EQ(create_error("wordpiece", {{"merges", kData + "vocab.bpe"}}),
            "option merges: only tokenizer bpe reads merges; remove it for tokenizer wordpiece");
  auto missing = create("wordpiece", {{"vocab", "/nonexistent/vocab.txt"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::not_found);
  EXPECT_EQ(
      create_error("wordpiece", {{"vocab", "/nonexistent/vocab.txt"}}),
      "option vocab: cannot read /nonexistent/vocab.txt: No such file or directory (relative paths are taken "
      "from the experiment file's folder)");
  EXPECT_EQ(create_error("wordpiece", {{"vocab", kData}}),
            "option vocab: cannot read " + kData + ": it is a folder; name the file in it");
  const TempFile empty("empty.txt", "");
  EXPECT_EQ(create_error("chars", {{"vocab", empty.path}}),
            "option vocab: " + empty.path + ": the file is empty");
  // A file over 64 MiB is refused by its size, before a byte of it is read (the file is sparse).
  const TempFile huge("huge.json", "{");
  fs::resize_file(huge.path, (uint64_t{64} << 20) + 1);
  EXPECT_EQ(create_error("bpe", {{"vocab", huge.path}, {"merges", kData + "vocab.bpe"}}),
            "option vocab: cannot read " + huge.path +
                ": the file is 67108865 bytes, over the 64 MiB a vocabulary file may have; name the "
                "tokenizer's vocabulary file");
}

TEST(TextBadOption, OptionValues) {
  EXPECT_EQ(create_error("bpe", {{"lowercase", "true"}}),
            "option lowercase: only tokenizer wordpiece lower-cases; bpe keeps the text as it is (use auto "
            "or false)");
  EXPECT_EQ(create_error("bytes", {{"strip_accents", "true"}}),
            "option strip_accents: only tokenizer wordpiece strips accents (use auto or false for bytes)");
  EXPECT_EQ(create_error("bytes", {{"max_length", "-1"}}),
            "option max_length: -1 is not a length: use 0 for no limit, or up to 2147483647");
  EXPECT_EQ(create_error("wordpiece", {{"max_length", "1"}}),
            "option max_length: max_length 1 leaves no room for [CLS] and [SEP]; use at least 2, or 0 for no "
            "limit");
  EXPECT_EQ(create_error("bytes", {{"tokenizer", "sentencepiece"}}),
            "option tokenizer: \"sentencepiece\" is not one of bytes, chars, bpe, wordpiece");
  EXPECT_EQ(create_error("bytes", {{"length_policy", "wrap"}}),
            "option length_policy: \"wrap\" is not one of error, truncate");
  EXPECT_EQ(create_error("bytes", {{"add_special", "yes"}}),
            "option add_special: \"yes\" is not one of auto, true, false");
  const TempFile no_cls("no_cls.txt", "[PAD]\n[UNK]\nhello\n");
  EXPECT_EQ(create_error("wordpiece", {{"vocab", no_cls.path}}),
            "option add_special: " + no_cls.path + " has no [CLS] and [SEP] for add_special");
  EXPECT_EQ(create_error("wordpiece", {{"vocab", no_cls.path}, {"add_special", "false"}}), "(created)");
}

TEST(TextBadOption, WordPieceVocabularyFiles) {
  const TempFile blank("blank.txt", "[UNK]\nhello\n\nworld\n");
  EXPECT_EQ(create_error("wordpiece", {{"vocab", blank.path}, {"add_special", "false"}}),
            "option vocab: " + blank.path + ":3:1: an empty token; each line of vocab.txt holds one token");
  const TempFile twice("twice.txt", "[UNK]\nhello\nworld\nhello\n");
  EXPECT_EQ(create_error("wordpiece", {{"vocab", twice.path}, {"add_special", "false"}}),
            "option vocab: " + twice.path + ":4:1: the token \"hello\" is already on line 2");
  const TempFile no_unk("no_unk.txt", "hello\nworld\n");
  EXPECT_EQ(
      create_error("wordpiece", {{"vocab", no_unk.path}, {"add_special", "false"}}),
      "option vocab: " + no_unk.path + ": no [UNK] token; WordPiece needs one for words it cannot spell");
  const TempFile latin1("latin1.txt", "[UNK]\ncaf\xE9\n");
  EXPECT_EQ(create_error("wordpiece", {{"vocab", latin1.path}, {"add_special", "false"}}),
            "option vocab: " + latin1.path +
                ":2:4: invalid UTF-8: the 3-byte character starting with 0xE9 is cut "
                "short by the end of the text (save the file as UTF-8)");
}

TEST(TextBadOption, CharsVocabularyFiles) {
  const TempFile two("two.txt", "a\nbc\n");
  EXPECT_EQ(
      create_error("chars", {{"vocab", two.path}}),
      "option vocab: " + two.path + ":2:1: the line \"bc\" holds 2 characters; each line holds exactly one");
  const TempFile blank("blank.txt", "a\n\nb\n");
  EXPECT_EQ(create_error("chars", {{"vocab", blank.path}}),
            "option vocab: " + blank.path + ":2:1: an empty line; each line holds exactly one character");
  const TempFile twice("twice.txt", "a\n\xC3\xA9\nb\n\xC3\xA9\n");
  EXPECT_EQ(create_error("chars", {{"vocab", twice.path}}),
            "option vocab: " + twice.path + ":4:1: the character \"\xC3\xA9\" is already on line 2");
  const TempFile bad("bad.txt", "a\n\xFF\n");
  EXPECT_EQ(create_error("chars", {{"vocab", bad.path}}),
            "option vocab: " + bad.path +
                ":2:1: invalid UTF-8: byte 0xFF cannot start a character in UTF-8 (save "
                "the file as UTF-8)");
}

// A small byte-level vocabulary: the 256 byte characters (ids 0..255), then "ab", "abc".
std::string byte_vocab(const std::string& extra = ", \"ab\": 256, \"abc\": 257") {
  std::string json = "{";
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    std::string key;
    tessera::text::append_utf8(key, printable ? static_cast<char32_t>(b) : next++);
    if (key == "\"" || key == "\\") key = "\\" + key;
    json += (b ? ", \"" : "\"") + key + "\": " + std::to_string(b);
  }
  return json + extra + "}";
}

TEST(TextBadOption, BpeVocabularyAndMergesFiles) {
  const TempFile merges("merges.bpe", "#version: 0.2\na b\nab c\n");
  const TempFile good("good.json", byte_vocab());
  const Encoder small = encoder("bpe", {{"vocab", good.path}, {"merges", merges.path}});
  EXPECT_EQ(encode_one(small, "abcab").ids, (std::vector<int32_t>{257, 256}));
  EXPECT_EQ(small.info().vocab_size, 258);

  auto vocab_error = [&](const std::string& name, const std::string& json) {
    const TempFile f(name, json);
    const std::string m = create_error("bpe", {{"vocab", f.path}, {"merges", merges.path}});
    const std::string prefix = "option vocab: " + f.path + ":";
    EXPECT_EQ(m.rfind(prefix, 0), 0u) << m;
    return m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m;
  };
  EXPECT_EQ(vocab_error("array.json", "[1, 2]"),
            "1:1: the file should be one JSON object of token -> id, like GPT-2's encoder.json");
  EXPECT_EQ(vocab_error("colon.json", "{\n  \"a\" 1}"), "2:7: expected ':' after a key");
  EXPECT_EQ(vocab_error("comma.json", "{\"a\": 0\n\"b\": 1}"), "2:1: expected ',' or '}' after an id");
  EXPECT_EQ(vocab_error("float.json", "{\"a\": 0.5}"), "1:7: expected an integer id");
  EXPECT_EQ(vocab_error("negative.json", "{\"a\": -3}"),
            "1:7: the id of \"a\" must be an integer from 0 to 2147483647");
  EXPECT_EQ(vocab_error("open.json", "{\"a\": 0,"), "1:9: expected a token in double quotes");
  EXPECT_EQ(vocab_error("string.json", "{\"a"), "1:2: a string that never ends");
  EXPECT_EQ(vocab_error("escape.json", "{\"a\\q\": 0}"), "1:4: unknown escape \\q");
  EXPECT_EQ(vocab_error("surrogate.json", "{\"\\ud800\": 0}"), "1:3: a \\u escape of a lone surrogate");
  EXPECT_EQ(vocab_error("trailing.json", "{\"a\": 0} x"), "1:10: unexpected text after the JSON object");
  EXPECT_EQ(vocab_error("gap.json", "{\"a\": 0, \"b\": 2}"),
            "1:10: the id 2 of \"b\" is not below the number of tokens (2); ids must be 0..1, each once");
  EXPECT_EQ(vocab_error("shared.json", "{\"a\": 0, \"b\": 0}"),
            "1:10: the id 0 of \"b\" is also the id of \"a\"");
  EXPECT_EQ(vocab_error("hex.json", "{\"a\\u12\": 0}"), "1:8: a \\u escape needs four hex digits");
  EXPECT_EQ(vocab_error("pair.json", "{\"\\ud800\\u0041\": 0}"),
            "1:3: a \\u surrogate pair with a bad second half");
  EXPECT_EQ(vocab_error("control.json", "{\"a\tb\": 0}"),
            "1:4: a control character inside a string (escape it)");
  EXPECT_EQ(vocab_error("cut.json", "{\"a\": 0"), "1:8: the file ends inside the JSON object");
  EXPECT_EQ(vocab_error("huge.json", "{\"a\": 99999999999999999999}"), "1:7: the id is too large");
  EXPECT_EQ(vocab_error("latin1.json", "{\"\xFF\": 0}"),
            "1:2: the token is not valid UTF-8: byte 0xFF cannot start a character in UTF-8");
  EXPECT_EQ(vocab_error("none.json", "{}"), " the JSON object has no tokens");
  EXPECT_EQ(vocab_error("dup.json", "{\"a\": 0, \"a\": 1}"), "1:10: the token \"a\" appears twice");
  const TempFile no_bytes("no_bytes.json", "{\"a\": 0}");
  EXPECT_EQ(create_error("bpe", {{"vocab", no_bytes.path}, {"merges", merges.path}}),
            "option vocab: " + no_bytes.path +
                ": no token for byte 0x00 (written \"\xC4\x80\"); a byte-level BPE "
                "vocabulary has one for each of the 256 bytes");

  auto merges_error = [&](const std::string& name, const std::string& text) {
    const TempFile f(name, text);
    const std::string m = create_error("bpe", {{"vocab", good.path}, {"merges", f.path}});
    const std::string prefix = "option merges: " + f.path;
    EXPECT_EQ(m.rfind(prefix, 0), 0u) << m;
    return m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m;
  };
  EXPECT_EQ(merges_error("three.bpe", "#version: 0.2\na b\na b c\n"),
            ":3:1: a merge is two tokens separated by one space, not \"a b c\"");
  EXPECT_EQ(merges_error("one.bpe", "ab\n"),
            ":1:1: a merge is two tokens separated by one space, not \"ab\"");
  EXPECT_EQ(merges_error("unknown.bpe", "a b\nab zz\n"),
            ":2:4: \"zz\" is not a token of the vocabulary (vocab)");
  EXPECT_EQ(merges_error("unknown_left.bpe", "zz b\n"),
            ":1:1: \"zz\" is not a token of the vocabulary (vocab)");
  EXPECT_EQ(merges_error("result.bpe", "a b\nb c\n"),
            ":2:1: merging \"b\" and \"c\" gives \"bc\", which is not a token of the vocabulary (vocab)");
  EXPECT_EQ(merges_error("latin1.bpe", "a b\n\xE9 b\n"),
            ":2:1: invalid UTF-8: the 3-byte character starting with 0xE9 is cut short: byte 0x20 is not a "
            "continuation byte (save the file as UTF-8)");
  EXPECT_EQ(merges_error("none.bpe", "#version: 0.2\n"), ": no merges in the file");
}

// ---- Item size limit --------------------------------------------------------------------------------

TEST(TextLimits, MaxBytesRefusesALongerItemNamingItAndTheLimit) {
  const Encoder e = encoder("bytes", {{"max_bytes", "1000"}});
  EXPECT_EQ(encode_one(e, std::string(1000, 'a')).size(), 1000);
  EXPECT_EQ(encode_error(e, item(std::string(1001, 'a'), "lines.txt:12")),
            "lines.txt:12: 1001 bytes of text, more than max_bytes 1000 (the text plugin's limit on one item): split "
            "the text into smaller items (lines), or raise max_bytes (0: no limit)");
  EXPECT_EQ(encode_one(encoder("bytes", {{"max_bytes", "0"}}), std::string(5000, 'a')).size(), 5000);
  auto bad = create("bytes", {{"max_bytes", "-1"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().message().find("option max_bytes: -1 is not a size") != std::string::npos)
      << bad.status().message();
}

TEST(TextLimits, A64MiBLineIsRefusedQuicklyWithoutAllocatingGigabytes) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory and an address-space limit do not mix";
#endif
  // Before the limit, tokenizing a 64 MiB line took 5.9 GB and ended as "out of memory". In a child
  // whose address space may grow by 512 MiB only, the default limit refuses it before allocating.
  const Encoder e = encoder("bpe");
  const testing_util::ChildRun child = testing_util::run_in_child(
      [&] {
        std::string line(size_t{64} << 20, 'a');
        auto out = e.encode(item(line, "big.txt:1"));
        return out.ok() ? std::string("ok") : out.status().message();
      },
      512ull << 20);
  ASSERT_TRUE(child.exited()) << "the child died: status " << child.status;
  const std::string& got = child.text;
  EXPECT_EQ(got,
            "big.txt:1: 67108864 bytes of text, more than max_bytes 4194304 (the text plugin's limit on one item): "
            "split the text into smaller items (lines), or raise max_bytes (0: no limit)");
}
