// The protein plugin through the real plugin ABI: ids identical to transformers' EsmTokenizer on real
// UniProt records, on messy records made from them, and (tokenizer: esm, the default) on every
// string of tests/data/protein/esm_tokenizer.json; one row per residue under tokenizer: residues;
// roles, positions and provenance, the length policies (error, truncate, windows), decode, every
// bad input and bad option as its exact message.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "process_util.h"
#include "tessera/plugins.h"

using namespace tessera;
using json = nlohmann::json;

namespace {

const std::string kPluginFile = std::string(TESSERA_PLUGIN_BUILD_DIR) + "/libtessera_protein.so";
const std::string kData = std::string(TESSERA_TEST_DATA) + "/protein/";

using OptionMap = std::map<std::string, std::string>;

std::shared_ptr<const Plugin> plugin() {
  static std::shared_ptr<const Plugin> p = [] {
    auto r = Plugin::load(kPluginFile);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : nullptr;
  }();
  return p;
}

// Every option, as the config loader passes them: the defaults with `changes` applied.
std::vector<std::pair<std::string, std::string>> options(const OptionMap& changes) {
  OptionMap all = {{"tokenizer", "esm"},    {"max_length", "1024"}, {"length_policy", "error"},
                   {"stride", "0"},         {"uppercase", "false"}, {"unknown", "unk"},
                   {"max_windows", "2048"}};
  for (const auto& [k, v] : changes) all[k] = v;
  return {all.begin(), all.end()};
}

// The plugin's behaviour before tokenizer: esm became the default: one row per residue letter,
// lower case read as upper case.
const OptionMap kResidues = {{"tokenizer", "residues"}, {"uppercase", "true"}};
// EsmTokenizer's rules on upper-cased text: what the messy records' clean sequences need.
const OptionMap kEsmUpper = {{"uppercase", "true"}};

OptionMap with(OptionMap base, const OptionMap& more) {
  for (const auto& [k, v] : more) base[k] = v;
  return base;
}

// Both tokenizers, for the tests whose inputs they read alike.
const std::pair<const char*, OptionMap> kBoth[] = {{"esm", {}}, {"residues", kResidues}};

Encoder encoder(const OptionMap& changes = {}) {
  auto e = Encoder::create(plugin(), options(changes));
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e).value();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// One FASTA record as the host hands it over: from its '>' line to just before the next '>' line.
struct FastaItem {
  std::string id, text;
  uint32_t line = 0;
  uint64_t offset = 0;
};

std::vector<FastaItem> split_fasta(const std::string& file_name, const std::string& text) {
  std::vector<FastaItem> items;
  uint32_t line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '>' && (i == 0 || text[i - 1] == '\n')) {
      if (!items.empty()) items.back().text = text.substr(items.back().offset, i - items.back().offset);
      items.push_back({file_name + "#" + std::to_string(items.size() + 1), "", line, i});
    }
    if (text[i] == '\n') ++line;
  }
  if (!items.empty()) items.back().text = text.substr(items.back().offset);
  return items;
}

PluginItem item_of(const FastaItem& f, const std::string& source) {
  PluginItem it;
  it.id = f.id;
  it.source = source;
  it.data = f.text;
  it.source_line = f.line;
  it.source_offset = f.offset;
  return it;
}

PluginItem text_item(const std::string& id, const std::string& source, const std::string& text,
                     uint32_t line) {
  PluginItem it;
  it.id = id;
  it.source = source;
  it.data = text;
  it.source_line = line;
  return it;
}

// The one sequence an item encodes to, or a failed test.
TokenRows encode_one(const Encoder& e, const PluginItem& it) {
  auto rows = e.encode(it);
  EXPECT_TRUE(rows.ok()) << rows.status().message();
  if (!rows.ok()) return {};
  EXPECT_EQ(rows->size(), 1u);
  return rows->empty() ? TokenRows{} : (*rows)[0];
}

// The status a bad item gives.
Status encode_error(const Encoder& e, const PluginItem& it) {
  auto rows = e.encode(it);
  EXPECT_FALSE(rows.ok()) << "encoded without error: " << it.id;
  return rows.ok() ? Status() : rows.status();
}

std::string first_word_of_header(const std::string& record) {
  const size_t end = record.find_first_of(" \t\r\n", 1);
  return record.substr(1, end - 1);
}

const char* const kHint =
    "a sequence holds the letters A-Z, the gaps '.' and '-', <mask>, <unk>, and one '*' at its end";

}  // namespace

TEST(ProteinPlugin, DescribesItselfAndItsOptions) {
  auto p = plugin();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->name(), "protein");
  EXPECT_EQ(p->modality(), "protein");
  EXPECT_EQ(p->input_kind(), TSR_INPUT_TEXT);
  EXPECT_EQ(p->extensions(), (std::vector<std::string>{".fasta", ".fa", ".faa"}));
  std::vector<std::string> names, defaults;
  for (const auto& o : p->options())
    names.push_back(o.name), defaults.push_back(o.default_value.value_or("?"));
  EXPECT_EQ(names, (std::vector<std::string>{"tokenizer", "max_length", "length_policy", "stride", "max_windows",
                                             "uppercase", "unknown"}));
  EXPECT_EQ(defaults, (std::vector<std::string>{"esm", "1024", "error", "0", "2048", "false", "unk"}));
  EXPECT_EQ(p->options()[0].choices, (std::vector<std::string>{"esm", "residues"}));
  EXPECT_EQ(p->options()[1].type, TSR_OPT_INT);
  EXPECT_EQ(p->options()[2].choices, (std::vector<std::string>{"error", "truncate", "windows"}));
  EXPECT_EQ(p->options()[4].type, TSR_OPT_INT);
  EXPECT_EQ(p->options()[5].type, TSR_OPT_BOOL);
  EXPECT_EQ(p->options()[6].choices, (std::vector<std::string>{"unk", "error"}));
  const Encoder e = encoder({{"max_length", "300"}});
  EXPECT_EQ(e.info().rows_kind, TSR_ROWS_IDS);
  EXPECT_EQ(e.info().vocab_size, 33);
  EXPECT_EQ(e.info().causal, 0);
  EXPECT_EQ(e.info().pad_id, 1);
  EXPECT_EQ(e.info().max_rows, 300);
}

TEST(ProteinPlugin, AlphabetIsTheEsm2Vocabulary) {
  std::istringstream vocab(read_file(kData + "vocab.txt"));
  std::vector<std::string> tokens;
  for (std::string line; std::getline(vocab, line);) tokens.push_back(line);
  ASSERT_EQ(tokens.size(), 33u);
  const Encoder esm = encoder(), residues = encoder(kResidues);
  for (int32_t id = 0; id < 33; ++id) {
    const std::string& tok = tokens[static_cast<size_t>(id)];
    const bool dropped = tok == "<cls>" || tok == "<eos>" || tok == "<pad>" || tok == "<null_1>";
    auto text = esm.decode({id});
    ASSERT_TRUE(text.ok()) << text.status().message();
    EXPECT_EQ(*text, dropped ? "" : tok) << "id " << id;
    // Every token written out encodes to its own id, as in EsmTokenizer; one row per residue reads
    // only the tokens a sequence may hold.
    EXPECT_EQ(encode_one(esm, text_item("t", "", tok, 1)).ids, (std::vector<int32_t>{0, id, 2})) << tok;
    if (!dropped) {
      EXPECT_EQ(encode_one(residues, text_item("t", "", tok, 1)).ids, (std::vector<int32_t>{0, id, 2})) << tok;
    }
  }
}

TEST(ProteinParity, RealUniProtRecordsGiveEsmTokenizerIds) {
  const std::string fasta = read_file(kData + "uniprot_sample.fasta");
  const json ref = json::parse(read_file(kData + "uniprot_sample.json"));
  const std::vector<FastaItem> items = split_fasta("uniprot_sample.fasta", fasta);
  ASSERT_EQ(items.size(), ref["records"].size());
  for (const auto& [name, opts] : kBoth) {
    SCOPED_TRACE(std::string("tokenizer ") + name);
    const Encoder e = encoder(with(opts, {{"max_length", "9000"}}));  // the longest record has 8081 residues
    size_t residues = 0, mismatches = 0;
    std::set<char> letters;
    for (size_t k = 0; k < items.size(); ++k) {
      const json& want = ref["records"][k];
      EXPECT_EQ(first_word_of_header(items[k].text), want["name"].get<std::string>());
      const TokenRows r = encode_one(e, item_of(items[k], kData + "uniprot_sample.fasta"));
      const auto ids = want["ids"].get<std::vector<int32_t>>();
      if (r.ids != ids) ++mismatches, ADD_FAILURE() << "ids differ for " << want["name"];
      residues += ids.size() - 2;
      for (size_t i = items[k].text.find('\n'); i < items[k].text.size(); ++i) letters.insert(items[k].text[i]);
    }
    EXPECT_EQ(items.size(), 300u);
    EXPECT_EQ(residues, 280952u);
    EXPECT_EQ(mismatches, 0u);
    for (char c : {'X', 'B', 'Z'}) EXPECT_TRUE(letters.count(c)) << "the sample lacks " << c;
    ::testing::Test::RecordProperty("sequences", static_cast<int>(items.size()));
    ::testing::Test::RecordProperty("residues", static_cast<int>(residues));
  }
}

TEST(ProteinParity, TruncateGivesEsmTokenizerTruncation) {
  const std::vector<FastaItem> items = split_fasta("s", read_file(kData + "uniprot_sample.fasta"));
  const json ref = json::parse(read_file(kData + "uniprot_sample.json"));
  for (const auto& [name, opts] : kBoth) {
    SCOPED_TRACE(std::string("tokenizer ") + name);
    const Encoder e = encoder(with(opts, {{"length_policy", "truncate"}}));
    int truncated = 0;
    for (size_t k = 0; k < items.size(); ++k) {
      const json& want = ref["records"][k];
      const bool long_one = want.contains("ids_truncated_1024");
      truncated += long_one;
      const TokenRows r = encode_one(e, item_of(items[k], "s"));
      EXPECT_EQ(r.ids, want[long_one ? "ids_truncated_1024" : "ids"].get<std::vector<int32_t>>())
          << want["name"];
      EXPECT_LE(r.size(), 1024);
      EXPECT_EQ(r.provenance[r.size() - 2].x0, static_cast<double>(r.size() - 3));  // the first residues kept
    }
    EXPECT_EQ(truncated, 47);
  }
}

TEST(ProteinParity, MessyRecordsGiveEsmTokenizerIdsOfTheCleanSequence) {
  const std::string fasta = read_file(kData + "messy.fasta");
  ASSERT_NE(fasta.find("\r\n"), std::string::npos);  // the CRLF records survived checkout
  const json ref = json::parse(read_file(kData + "messy.json"));
  const std::vector<FastaItem> items = split_fasta("messy.fasta", fasta);
  ASSERT_EQ(items.size(), ref["records"].size());
  ASSERT_EQ(items.size(), 15u);
  // The clean sequence is upper case: both tokenizers with uppercase: true give its ids.
  for (const OptionMap& opts : {kResidues, kEsmUpper}) {
    SCOPED_TRACE(opts.count("tokenizer") ? "tokenizer residues" : "tokenizer esm, uppercase");
    const Encoder e = encoder(with(opts, {{"max_length", "9000"}}));
    for (size_t k = 0; k < items.size(); ++k) {
      const json& want = ref["records"][k];
      EXPECT_EQ(first_word_of_header(items[k].text), want["name"].get<std::string>());
      const TokenRows r = encode_one(e, item_of(items[k], "messy.fasta"));
      EXPECT_EQ(r.ids, want["ids"].get<std::vector<int32_t>>()) << want["name"];
      // decode() gives the clean sequence back, J (no ESM-2 token) as <unk>.
      std::string clean;
      for (char c : want["clean"].get<std::string>())
        clean += c == 'J' ? std::string("<unk>") : std::string(1, c);
      auto text = e.decode(r.ids);
      ASSERT_TRUE(text.ok());
      EXPECT_EQ(*text, clean);
    }
  }
}

// tests/data/protein/esm_tokenizer.json: EsmTokenizer's ids on strings chosen where a residue
// reader and EsmTokenizer part ways (tools/reference/make_esm_tokenizer_fixtures.py).
const json& esm_cases() {
  static const json j = json::parse(read_file(kData + "esm_tokenizer.json"));
  return j;
}

TEST(ProteinEsmTokenizer, BareStringsGiveEsmTokenizerIds) {
  const json& ref = esm_cases();
  ASSERT_GE(ref["cases"].size(), 400u);
  const Encoder plain = encoder({{"max_length", "100000"}});
  const Encoder upper = encoder({{"max_length", "100000"}, {"uppercase", "true"}});
  size_t n = 0, truncations = 0, mismatches = 0, refused = 0;
  for (const json& c : ref["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::string why = c["note"].get<std::string>() + ": \"" + text + "\"";
    const PluginItem it = text_item(std::string("case ").append(std::to_string(n++)), "", text, 1);
    if (c.contains("refused")) {  // a character no protein sequence holds: an error, never other ids
      const Status s = encode_error(plain, it);
      EXPECT_EQ(s.code(), Code::parse_error) << why;
      EXPECT_NE(s.message().find(c["refused"].get<std::string>()), std::string::npos) << s.message() << "; " << why;
      ++refused;
      continue;
    }
    const TokenRows r = encode_one(plain, it);
    if (r.ids != c["ids"].get<std::vector<int32_t>>()) ++mismatches;
    EXPECT_EQ(r.ids, c["ids"].get<std::vector<int32_t>>()) << why;
    EXPECT_EQ(encode_one(upper, it).ids, c["ids_uppercase"].get<std::vector<int32_t>>()) << "uppercase: " << why;
    const json truncated = c.value("truncated", json::object());
    for (const auto& [max_length, ids] : truncated.items()) {
      const Encoder t = encoder({{"max_length", max_length}, {"length_policy", "truncate"}});
      EXPECT_EQ(encode_one(t, it).ids, ids.get<std::vector<int32_t>>()) << "truncated to " << max_length << ": " << why;
      ++truncations;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GE(n - refused, 350u);
  EXPECT_GE(refused, 30u);
  EXPECT_GE(truncations, 100u);
}

TEST(ProteinEsmTokenizer, FastaRecordsGiveEsmTokenizerIdsOfTheirSequence) {
  // The record's sequence is its lines joined, layout and a final '*' aside, letters as written:
  // what a FASTA reader hands EsmTokenizer.
  const json& ref = esm_cases();
  ASSERT_GE(ref["fasta_records"].size(), 20u);
  const Encoder plain = encoder({{"max_length", "9000"}});
  const Encoder upper = encoder({{"max_length", "9000"}, {"uppercase", "true"}});
  for (const json& c : ref["fasta_records"]) {
    const std::string record = c["record"].get<std::string>();
    const PluginItem it = text_item("f.fasta#1", "f.fasta", record, 1);
    EXPECT_EQ(encode_one(plain, it).ids, c["ids"].get<std::vector<int32_t>>()) << c["name"] << ": " << c["note"];
    EXPECT_EQ(encode_one(upper, it).ids, c["ids_uppercase"].get<std::vector<int32_t>>()) << c["name"];
  }
}

TEST(ProteinEsmTokenizer, UnknownRunsAreOneRowSpanningTheirResidues) {
  // The issue's example: EsmTokenizer gives one <unk> for JJ and one for mkt.
  const std::string text = "MKJJTmkt";  // (a PluginItem views its text)
  const PluginItem it = text_item("x", "", text, 1);
  const TokenRows r = encode_one(encoder(), it);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{0, 20, 15, 3, 11, 3, 2}));
  EXPECT_EQ(r.roles, (std::vector<uint8_t>{TSR_ROLE_CLS, TSR_ROLE_CONTENT, TSR_ROLE_CONTENT, TSR_ROLE_UNK,
                                           TSR_ROLE_CONTENT, TSR_ROLE_UNK, TSR_ROLE_EOS}));
  const std::vector<std::pair<double, double>> spans = {{0, 1}, {1, 2}, {2, 4}, {4, 5}, {5, 8}};
  for (size_t i = 0; i < spans.size(); ++i) {
    const tsr_provenance& p = r.provenance[i + 1];
    EXPECT_EQ(p.kind, TSR_PROV_RESIDUE);
    EXPECT_EQ(std::make_pair(p.x0, p.x1), spans[i]) << "row " << i + 1;
    EXPECT_EQ(r.positions[i + 1][0], static_cast<int32_t>(i + 1));
  }
  // Whitespace counts no residue; a written-out token counts one.
  const TokenRows w = encode_one(encoder(), text_item("x", "", " M  JJ\n<mask>K ", 1));
  ASSERT_EQ(w.ids, (std::vector<int32_t>{0, 20, 3, 32, 15, 2}));
  EXPECT_EQ(w.provenance[2].x0, 1);
  EXPECT_EQ(w.provenance[2].x1, 3);
  EXPECT_EQ(w.provenance[4].x0, 4);
  // In a FASTA record a run goes on across line breaks and blanks, as in the joined sequence.
  const TokenRows f = encode_one(encoder(), text_item("f#1", "f.fa", ">P1\nMKJ\nJ J\nT\n", 1));
  ASSERT_EQ(f.ids, (std::vector<int32_t>{0, 20, 15, 3, 11, 2}));
  EXPECT_EQ(f.provenance[3].x0, 2);
  EXPECT_EQ(f.provenance[3].x1, 5);
  // One row per residue: the previous behaviour, as an option.
  EXPECT_EQ(encode_one(encoder(kResidues), it).ids, (std::vector<int32_t>{0, 20, 15, 3, 3, 11, 20, 15, 11, 2}));
}

TEST(ProteinEsmTokenizer, BareTextGivesEsmTokenizerIdsOrNamesTheCharacterNoSequenceHolds) {
  const Encoder e = encoder();
  // EsmTokenizer's readings that one row per residue refuses: blanks, a final stop, <eos> text, nothing.
  EXPECT_EQ(encode_one(e, text_item("m#1", "", "MK J J*", 0)).ids, (std::vector<int32_t>{0, 20, 15, 3, 3, 2}));
  EXPECT_EQ(encode_one(e, text_item("m#2", "", "<cls>MK<eos>\u00a0T", 0)).ids,
            (std::vector<int32_t>{0, 0, 20, 15, 2, 11, 2}));
  EXPECT_EQ(encode_one(e, text_item("m#3", "", "", 0)).ids, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(encode_one(e, text_item("m#4", "", " \r\n\t", 0)).ids, (std::vector<int32_t>{0, 2}));
  // What EsmTokenizer would silently read as <unk> but no protein sequence holds fails, named.
  const std::string hint =
      "a sequence holds letters, the gaps '.' and '-', whitespace, the tokens <cls> <pad> <eos> <unk> <null_1> "
      "<mask>, and one '*' at its end";
  struct Case {
    std::string text, message;
  };
  const Case cases[] = {
      {"MKT1", "seqs.txt:4:4: seqs.txt:4: '1' is not a residue; " + hint},
      {"MK*T", "seqs.txt:4:3: seqs.txt:4: '*' (a stop) before the end of the sequence; a '*' may only end it: "
               "remove it or split the record"},
      {"MK<MASK>", "seqs.txt:4:3: seqs.txt:4: '<' starts no token: a sequence may hold <cls> <pad> <eos> <unk> "
                   "<null_1> <mask>, each on one line"},
      {"MKT\n>P2\nAY",
       "seqs.txt:5:1: seqs.txt:4: a '>' header line inside the sequence: each FASTA record must be its own item"},
      {"MK\xc3\xa9", "seqs.txt:4:3: seqs.txt:4: '\xc3\xa9' (U+00E9, not ASCII) is not a residue; " + hint},
      {"MK\xff", "seqs.txt:4:3: seqs.txt:4: byte 0xFF (not UTF-8) is not a residue; " + hint},
  };
  for (const Case& c : cases) {
    const Status s = encode_error(e, text_item("seqs.txt:4", "seqs.txt", c.text, 4));
    EXPECT_EQ(s.code(), Code::parse_error) << c.text;
    EXPECT_EQ(s.message(), c.message);
  }
  // unknown: error fails at the first character that would be <unk>; a written-out <unk> is fine.
  const Encoder strict = encoder({{"unknown", "error"}});
  EXPECT_EQ(encode_one(strict, text_item("m#5", "", "MK<unk>T", 0)).ids, (std::vector<int32_t>{0, 20, 15, 3, 11, 2}));
  EXPECT_EQ(encode_error(strict, text_item("m#6", "", "MK J", 0)).message(),
            "m#6:1:4: 'J' is not in the ESM-2 alphabet (set unknown: unk to read it as <unk>)");
  EXPECT_EQ(encode_error(strict, text_item("m#7", "", "MKt", 0)).message(),
            "m#7:1:3: 't' is not in the ESM-2 alphabet (its letters are upper case: set uppercase: true)");
  EXPECT_EQ(encode_error(strict, text_item("m#8", "", "MK*", 0)).message(),
            "m#8:1:3: '*' is not in the ESM-2 alphabet (set unknown: unk to read it as <unk>)");
}

TEST(ProteinRows, RolesPositionsAndProvenance) {
  for (const auto& [name, opts] : kBoth) {
    SCOPED_TRACE(std::string("tokenizer ") + name);
    const Encoder e = encoder(opts);
    const TokenRows r = encode_one(e, text_item("x.fasta#1", "x.fasta", ">P1 a test\nMK<mask>\nJ<unk>*\n", 1));
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 20, 15, 32, 3, 3, 2}));
    EXPECT_EQ(r.roles, (std::vector<uint8_t>{TSR_ROLE_CLS, TSR_ROLE_CONTENT, TSR_ROLE_CONTENT, TSR_ROLE_MASK,
                                             TSR_ROLE_UNK, TSR_ROLE_UNK, TSR_ROLE_EOS}));
    EXPECT_EQ(r.label, "");
    for (int64_t i = 0; i < r.size(); ++i) {
      EXPECT_EQ(r.positions[i], (std::array<int32_t, 2>{static_cast<int32_t>(i), -1}));
      const tsr_provenance& p = r.provenance[i];
      if (i == 0 || i == r.size() - 1) {
        EXPECT_EQ(p.kind, TSR_PROV_NONE);
      } else {
        EXPECT_EQ(p.kind, TSR_PROV_RESIDUE);
        EXPECT_EQ(p.x0, static_cast<double>(i - 1));
        EXPECT_EQ(p.x1, static_cast<double>(i));
      }
    }
    // A bare sequence (a line of a text file, a manifest's inline text) reads the same way.
    EXPECT_EQ(encode_one(e, text_item("lines.txt:4", "lines.txt", "MK<mask>J<unk>", 4)).ids, r.ids);
  }
}

TEST(ProteinRows, LowerCaseIsUnknownOrUpperCasedAsConfigured) {
  const std::string text = "mktj";  // (a PluginItem views its text)
  const PluginItem it = text_item("lower", "", text, 1);
  // EsmTokenizer has no lower-case tokens: the run is one <unk> (the default) ...
  EXPECT_EQ(encode_one(encoder(), it).ids, (std::vector<int32_t>{0, 3, 2}));
  // ... unless the letters are read as upper case, under either tokenizer.
  EXPECT_EQ(encode_one(encoder({{"uppercase", "true"}}), it).ids, (std::vector<int32_t>{0, 20, 15, 11, 3, 2}));
  EXPECT_EQ(encode_one(encoder(kResidues), it).ids, (std::vector<int32_t>{0, 20, 15, 11, 3, 2}));
  // One row per residue without upper-casing: every lower-case letter is its own <unk>, so residue
  // indices stay true.
  const TokenRows r = encode_one(encoder({{"tokenizer", "residues"}}), it);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 3, 3, 3, 3, 2}));
  EXPECT_EQ(r.roles, (std::vector<uint8_t>{TSR_ROLE_CLS, TSR_ROLE_UNK, TSR_ROLE_UNK, TSR_ROLE_UNK,
                                           TSR_ROLE_UNK, TSR_ROLE_EOS}));
  // Upper-casing leaves the <...> tokens alone.
  EXPECT_EQ(encode_one(encoder({{"uppercase", "true"}}), text_item("m", "", "mk<mask>t", 1)).ids,
            (std::vector<int32_t>{0, 20, 15, 32, 11, 2}));
  for (const char* tokenizer : {"esm", "residues"}) {
    const Status s = encode_error(encoder({{"tokenizer", tokenizer}, {"unknown", "error"}}), it);
    EXPECT_EQ(s.code(), Code::parse_error);
    EXPECT_EQ(s.message(),
              "lower:1:1: 'm' is not in the ESM-2 alphabet (its letters are upper case: set uppercase: true)");
  }
}

// Windows of (max_length - 2) residues every `stride` residues over the record's residues.
void check_windows(const std::vector<TokenRows>& windows, const std::vector<int32_t>& ref_ids,
                   int64_t max_length, int64_t stride) {
  const int64_t n = static_cast<int64_t>(ref_ids.size()) - 2, w = max_length - 2;
  ASSERT_FALSE(windows.empty());
  std::vector<int> covered(static_cast<size_t>(n), 0);
  for (size_t k = 0; k < windows.size(); ++k) {
    const TokenRows& r = windows[k];
    SCOPED_TRACE("window " + std::to_string(k));
    EXPECT_EQ(r.label, std::string("w").append(std::to_string(k)));
    ASSERT_GE(r.size(), 3);
    EXPECT_LE(r.size(), max_length);
    EXPECT_EQ(r.ids.front(), 0);
    EXPECT_EQ(r.ids.back(), 2);
    EXPECT_EQ(r.roles.front(), TSR_ROLE_CLS);
    EXPECT_EQ(r.roles.back(), TSR_ROLE_EOS);
    const int64_t begin = static_cast<int64_t>(k) * stride;
    EXPECT_EQ(r.provenance[1].x0, static_cast<double>(begin));
    if (k + 1 < windows.size()) {
      EXPECT_EQ(r.size(), max_length);  // only the last may be shorter
    }
    for (int64_t i = 1; i + 1 < r.size(); ++i) {
      const int64_t residue = begin + i - 1;  // absolute
      ASSERT_LT(residue, n);
      const tsr_provenance& p = r.provenance[i];
      // One check per row, stopping at the first wrong one (positions restart in each window).
      ASSERT_TRUE(p.kind == TSR_PROV_RESIDUE && p.x0 == static_cast<double>(residue) &&
                  p.x1 == static_cast<double>(residue + 1) && r.positions[i][0] == i &&
                  r.ids[i] == ref_ids[static_cast<size_t>(residue + 1)])
          << "row " << i << ": id " << r.ids[i] << ", position " << r.positions[i][0] << ", provenance ["
          << p.x0 << ", " << p.x1 << "); want residue " << residue << " (id "
          << ref_ids[static_cast<size_t>(residue + 1)] << ")";
      ++covered[static_cast<size_t>(residue)];
    }
    if (k > 0) {  // the configured overlap with the previous window
      const double prev_end = windows[k - 1].provenance[windows[k - 1].size() - 2].x1;
      EXPECT_EQ(prev_end - r.provenance[1].x0, static_cast<double>(w - stride));
    }
  }
  EXPECT_EQ(windows.back().provenance[windows.back().size() - 2].x1, static_cast<double>(n));
  for (int64_t i = 0; i < n; ++i)
    ASSERT_GE(covered[static_cast<size_t>(i)], 1) << "residue " << i << " is in no window";
}

TEST(ProteinWindows, CoverEveryResidueWithAbsoluteIndicesAndTheConfiguredOverlap) {
  const std::vector<FastaItem> items = split_fasta("s", read_file(kData + "uniprot_sample.fasta"));
  const json ref = json::parse(read_file(kData + "uniprot_sample.json"));
  struct Case {
    int64_t max_length, stride, effective_stride;
  };
  const Case cases[] = {{1024, 0, 511}, {1024, 1022, 1022}, {1024, 1000, 1000}, {130, 100, 100},
                        {130, 1, 1},    {3, 1, 1},          {4, 0, 1}};
  int long_records = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const auto ids = ref["records"][k]["ids"].get<std::vector<int32_t>>();
    if (ids.size() < 1024 + 1) continue;
    ++long_records;
    for (const Case& c : cases) {
      if (c.effective_stride < 100 && long_records > 3) continue;  // small strides on three records: fast
      SCOPED_TRACE(ref["records"][k]["name"].get<std::string>() + " max_length " +
                   std::to_string(c.max_length) + " stride " + std::to_string(c.stride));
      const Encoder e = encoder({{"tokenizer", long_records % 2 ? "esm" : "residues"},
                                 {"length_policy", "windows"},
                                 {"max_length", std::to_string(c.max_length)},
                                 {"stride", std::to_string(c.stride)},
                                 {"max_windows", "0"}});  // stride 1 makes thousands
      auto windows = e.encode(item_of(items[k], "s"));
      ASSERT_TRUE(windows.ok()) << windows.status().message();
      check_windows(*windows, ids, c.max_length, c.effective_stride);
      const int64_t n = static_cast<int64_t>(ids.size()) - 2, w = c.max_length - 2;
      const int64_t expected = n <= w ? 1 : (n - w + c.effective_stride - 1) / c.effective_stride + 1;
      EXPECT_EQ(static_cast<int64_t>(windows->size()), expected);
    }
  }
  EXPECT_EQ(long_records, 47);
}

TEST(ProteinWindows, RowsOfUnknownRunsKeepTheirResidueSpans) {
  // 10 rows (each "jj" one <unk> for two residues) over 14 residues, windows of 4 rows every 3.
  const std::string text = "MjjKjjTjjAjjYI";
  const Encoder e = encoder({{"length_policy", "windows"}, {"max_length", "6"}, {"stride", "3"}});
  auto windows = e.encode(text_item("s", "", text, 1));
  ASSERT_TRUE(windows.ok()) << windows.status().message();
  const TokenRows whole = encode_one(encoder(), text_item("s", "", text, 1));
  ASSERT_EQ(whole.size(), 12);
  ASSERT_EQ(windows->size(), 3u);  // rows [0, 4), [3, 7), [6, 10)
  for (size_t k = 0; k < windows->size(); ++k) {
    const TokenRows& w = (*windows)[k];
    for (int64_t i = 1; i + 1 < w.size(); ++i) {
      const int64_t row = static_cast<int64_t>(k) * 3 + i;  // the row of the whole sequence
      EXPECT_EQ(w.ids[i], whole.ids[row]) << "window " << k << " row " << i;
      EXPECT_EQ(w.provenance[i].x0, whole.provenance[row].x0);
      EXPECT_EQ(w.provenance[i].x1, whole.provenance[row].x1);
    }
  }
  EXPECT_EQ(windows->back().provenance[windows->back().size() - 2].x1, 14);
}

TEST(ProteinWindows, AShortSequenceIsOneWindow) {
  auto windows = encoder({{"length_policy", "windows"}}).encode(text_item("s", "", "MKT", 1));
  ASSERT_TRUE(windows.ok());
  ASSERT_EQ(windows->size(), 1u);
  EXPECT_EQ((*windows)[0].label, "w0");
  EXPECT_EQ((*windows)[0].ids, (std::vector<int32_t>{0, 20, 15, 11, 2}));
}

TEST(ProteinLength, ErrorPolicyNamesTheRecordTheLengthAndTheFix) {
  const Encoder e = encoder(with(kResidues, {{"max_length", "7"}}));
  EXPECT_EQ(encode_one(e, text_item("fit", "", "MKTAY", 1)).size(), 7);  // exactly max_length - 2 residues
  const std::string record = ">sp|P1|X long one\nMKT\nAYI\n";  // (a PluginItem views its text)
  const PluginItem long_one = text_item("u.fasta#2", "data/u.fasta", record, 5);
  const Status s = encode_error(e, long_one);
  EXPECT_EQ(s.code(), Code::out_of_range);
  EXPECT_EQ(
      s.message(),
      "data/u.fasta:5:1: u.fasta#2 (record sp|P1|X): 6 residues do not fit max_length 7 (5 residues + <cls> "
      "+ <eos>): set length_policy to truncate or windows, or raise max_length");
  // EsmTokenizer's rows are tokens: a run of unknown letters is one.
  const Encoder esm = encoder({{"max_length", "7"}});
  EXPECT_EQ(encode_one(esm, text_item("fit", "", "MKTjjjjjA", 1)).size(), 7);
  EXPECT_EQ(encode_error(esm, long_one).message(),
            "data/u.fasta:5:1: u.fasta#2 (record sp|P1|X): 6 tokens do not fit max_length 7 (5 tokens + <cls> "
            "+ <eos>): set length_policy to truncate or windows, or raise max_length");
}

TEST(ProteinBadInput, EachBrokenRecordIsAnErrorWithItsPlace) {
  // FASTA records are read as FASTA under both tokenizers.
  struct Case {
    std::string text;
    uint32_t line;
    std::string message;
  };
  const std::string where = "data/bad.fasta:";
  const std::string who = ": bad.fasta#2 (record P1): ";
  const Case cases[] = {
      // A character that is not a residue, on the third line of a wrapped record.
      {">P1 wrapped\nMKTAYIAK\nQRQ1SFVK\n", 10, where + "12:4" + who + "'1' is not a residue; " + kHint},
      {">P1\r\nMKT\r\nAY;I\r\n", 3, where + "5:3" + who + "';' is not a residue; " + kHint},
      // A header with no sequence: an error, not an empty sequence of <cls> <eos>.
      {">P1 nothing follows\n\n  \n", 20,
       where + "20:1" + who +
           "the record has no residues after its header: add its sequence or "
           "remove the record"},
      {">P1 only a stop\n*\n", 20,
       where + "20:1" + who +
           "the record has no residues after its header: add its sequence or remove "
           "the record"},
      // Empty headers.
      {">\nMKT\n", 7,
       where + "7:2: bad.fasta#2: empty FASTA header: '>' must be followed by the record's name"},
      {">  \t\r\nMKT\r\n", 7,
       where + "7:2: bad.fasta#2: empty FASTA header: '>' must be followed by the record's name"},
      // '*' anywhere but at the end.
      {">P1\nMKT*AYI\n", 1,
       where + "2:4" + who +
           "'*' (a stop) before the end of the sequence; a '*' may only end it: remove it or "
           "split the record"},
      {">P1\nMKT*\nAYI\n", 1,
       where + "2:4" + who +
           "'*' (a stop) before the end of the sequence; a '*' may only end it: remove it or "
           "split the record"},
      {">P1\nMKT**\n", 1,
       where + "2:4" + who +
           "'*' (a stop) before the end of the sequence; a '*' may only end it: remove it or "
           "split the record"},
      // Bytes that are not ASCII, or not text.
      {">P1 caf\xc3\xa9 is fine in a header\nMK\xc3\xa9T\n", 1,
       where + "2:3" + who + "'\xc3\xa9' (U+00E9, not ASCII) is not a residue; " + kHint},
      {">P1\nMKT\xe2\x80\x94\n", 1,
       where + "2:4" + who + "'\xe2\x80\x94' (U+2014, not ASCII) is not a residue; " + kHint},
      {">P1\nMK\xff\n", 1, where + "2:3" + who + "byte 0xFF (not UTF-8) is not a residue; " + kHint},
      {">P1\nMK\xc3\n", 1, where + "2:3" + who + "byte 0xC3 (not UTF-8) is not a residue; " + kHint},
      {std::string(">P1\nMK\0T\n", 9), 1,
       where + "2:3" + who + "byte 0x00 (a control character) is not a residue; " + kHint},
      // Two records in one item: the host's splitter must give each its own.
      {">P1\nMKT\n>P2\nAYI\n", 30,
       where + "32:1" + who + "a '>' header line inside the record: each FASTA record must be its own item"},
      {">P1\nMKT >AYI\n", 1, where + "2:5" + who + "'>' is not a residue; " + kHint},
      // Special tokens other than <mask> and <unk>, or cut by a line break.
      {">P1\nMK<cls>T\n", 1,
       where + "2:3" + who +
           "'<' starts no token a sequence may hold: only <mask> and <unk> may appear inside "
           "one, each on one line"},
      {">P1\nMK<ma\nsk>T\n", 1,
       where + "2:3" + who +
           "'<' starts no token a sequence may hold: only <mask> and <unk> may appear inside "
           "one, each on one line"},
  };
  for (const auto& [name, opts] : kBoth) {
    SCOPED_TRACE(std::string("tokenizer ") + name);
    const Encoder e = encoder(opts);
    for (const Case& c : cases) {
      const Status s = encode_error(e, text_item("bad.fasta#2", "data/bad.fasta", c.text, c.line));
      EXPECT_EQ(s.code(), Code::parse_error) << c.message;
      EXPECT_EQ(s.message(), c.message);
    }
  }
}

TEST(ProteinBadInput, BareSequencesAndInlineTextNameTheirPlaceUnderResidues) {
  // One row per residue reads a bare sequence with the FASTA grammar (under tokenizer: esm it is
  // EsmTokenizer's text: ProteinEsmTokenizer.BareTextGivesEsmTokenizerIdsOrNamesTheCharacterNoSequenceHolds).
  const Encoder e = encoder(kResidues);
  // A line of a text file: FILE:LINE:COL from the item's source and line.
  EXPECT_EQ(encode_error(e, text_item("seqs.txt:4", "seqs.txt", "MKT1", 4)).message(),
            std::string("seqs.txt:4:4: seqs.txt:4: '1' is not a residue; ") + kHint);
  // A manifest's inline text has no source file: the item id stands for it, lines count from 1.
  EXPECT_EQ(encode_error(e, text_item("m.jsonl#3", "", "MKT\nA#", 0)).message(),
            std::string("m.jsonl#3:2:2: '#' is not a residue; ") + kHint);
  EXPECT_EQ(encode_error(e, text_item("m.jsonl#4", "", "", 0)).message(),
            "m.jsonl#4:1:1: an empty sequence: give at least one residue");
  EXPECT_EQ(encode_error(e, text_item("m.jsonl#5", "", " \r\n\t", 0)).message(),
            "m.jsonl#5:1:1: an empty sequence: give at least one residue");
  EXPECT_EQ(encode_error(e, text_item("m.jsonl#6", "", "MKT\n>P2\nAY", 0)).message(),
            "m.jsonl#6:2:1: a '>' header line inside the sequence: each FASTA record must be its own item");
  // A letter outside the alphabet under unknown: error.
  EXPECT_EQ(
      encode_error(encoder(with(kResidues, {{"unknown", "error"}})), text_item("j.fa#1", "j.fa", ">P9\nMKJT\n", 1))
          .message(),
      "j.fa:2:3: j.fa#1 (record P9): 'J' is not in the ESM-2 alphabet (set unknown: unk to read it as "
      "<unk>)");
  // A very long record name is cut in messages.
  const std::string name(300, 'N');
  const std::string m = encode_error(e, text_item("l#1", "l.fa", ">" + name + "\nM1\n", 1)).message();
  EXPECT_EQ(m, "l.fa:2:2: l#1 (record " + name.substr(0, 120) + "...): '1' is not a residue; " + kHint);
}

TEST(ProteinBadInput, RandomBytesNeverCrashAndAlwaysExplain) {
  const std::string pieces[] = {"M",     "k",      "A", "J",        "*",    "<mask>",
                                "<unk>", "<",      ">", "\n",       "\r\n", " ",
                                "\t",    "-",      ".", "\xc3\xa9", "\xff", std::string(1, '\0'),
                                "1",     ">P1 x\n", "<cls>", "\xe2\x80\x83"};
  for (const auto& [name, opts] : kBoth) {
    SCOPED_TRACE(std::string("tokenizer ") + name);
    const bool esm = std::string(name) == "esm";
    const Encoder e = encoder(with(opts, {{"length_policy", "windows"}, {"max_length", "8"}, {"stride", "3"}}));
    std::mt19937 rng(7);
    int ok = 0, bad = 0;
    for (int n = 0; n < 3000; ++n) {
      std::string text;
      const int len = static_cast<int>(rng() % 40);
      for (int i = 0; i < len; ++i) text += pieces[rng() % std::size(pieces)];
      auto rows = e.encode(text_item("r#" + std::to_string(n), "r.fa", text, 1));
      if (rows.ok()) {
        ++ok;
        for (const TokenRows& r : *rows) EXPECT_LE(r.size(), 8);
      } else {
        ++bad;
        const std::string& m = rows.status().message();
        EXPECT_EQ(rows.status().code(), Code::parse_error) << m;
        EXPECT_EQ(m.rfind("r.fa:", 0), 0u) << m;
        // Bare text under EsmTokenizer's rules fails only on a character no sequence holds.
        if (esm && text[0] != '>') {
          const bool named = m.find("is not a residue") != std::string::npos ||
                             m.find("starts no token") != std::string::npos ||
                             m.find("(a stop) before the end") != std::string::npos ||
                             m.find("header line inside") != std::string::npos;
          EXPECT_TRUE(named) << m;
        }
      }
    }
    EXPECT_GT(ok, 50);
    EXPECT_GT(bad, 100);
  }
}

TEST(ProteinOptions, BadOptionsNameTheOption) {
  const std::string who = "plugin protein (" + kPluginFile + "): option ";
  struct Case {
    OptionMap changes;
    std::string message;
  };
  const Case cases[] = {
      {{{"max_length", "2"}},
       "max_length: max_length 2 is out of range: rows per sequence, <cls> and <eos> included, from 3 to "
       "2147483647 "
       "(ESM-2 was trained with 1024)"},
      {{{"max_length", "4294967296"}},
       "max_length: max_length 4294967296 is out of range: rows per sequence, <cls> and <eos> included, from "
       "3 to "
       "2147483647 (ESM-2 was trained with 1024)"},
      {{{"max_length", "long"}}, "max_length: option \"max_length\": \"long\" is not an integer"},
      {{{"length_policy", "sometimes"}},
       "length_policy: \"sometimes\" is no length policy: use error, truncate or windows"},
      {{{"stride", "-1"}},
       "stride: stride -1 is out of range: tokens from one window's start to the next, from 1 to "
       "max_length - 2 = 1022 (a larger stride would skip tokens), or 0 for half a window"},
      {{{"stride", "101"}, {"max_length", "102"}, {"tokenizer", "residues"}},
       "stride: stride 101 is out of range: residues from one window's start to the next, from 1 to "
       "max_length - 2 = "
       "100 (a larger stride would skip residues), or 0 for half a window"},
      {{{"tokenizer", "esm2"}}, "tokenizer: \"esm2\" is no tokenizer: use esm or residues"},
      {{{"uppercase", "yes"}}, "uppercase: \"yes\" is not true or false"},
      {{{"unknown", "skip"}}, "unknown: \"skip\" is no choice for unknown letters: use unk or error"},
  };
  for (const Case& c : cases) {
    auto e = Encoder::create(plugin(), options(c.changes));
    ASSERT_FALSE(e.ok()) << c.message;
    EXPECT_EQ(e.status().code(), Code::invalid_argument);
    EXPECT_EQ(e.status().message(), who + c.message);
  }
  auto missing = Encoder::create(plugin(), {{"tokenizer", "esm"}, {"max_length", "1024"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), who + "length_policy: option \"length_policy\" was not passed");
}

TEST(ProteinDecode, DropsFramingKeepsResiduePlacesAndRefusesForeignIds) {
  const Encoder e = encoder();
  auto text = e.decode({0, 20, 15, 32, 3, 29, 30, 2, 1, 1, 31});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "MK<mask><unk>.-");
  EXPECT_EQ(encode_one(e, text_item("again", "", *text, 1)).ids,
            (std::vector<int32_t>{0, 20, 15, 32, 3, 29, 30, 2}));
  for (int32_t id : {33, -1}) {
    auto bad = e.decode({0, 20, id});
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), Code::out_of_range);
    EXPECT_EQ(bad.status().message(), "plugin protein (" + kPluginFile + "): decode: id " +
                                          std::to_string(id) +
                                          " at position 2 is outside the ESM-2 vocabulary [0, 33)");
  }
}

// ---- Item size limit ----------------------------------------------------------------------------

TEST(ProteinLimits, MaxWindowsRefusesAnItemThatWouldMakeMoreNamingItAndTheLimit) {
  // 10 residues in windows of 4 every 2: 4 windows.
  const std::string text = "ACDEFGHIKL";
  const OptionMap o = {{"length_policy", "windows"}, {"max_length", "6"}, {"stride", "2"}};
  auto four = encoder(with(o, {{"max_windows", "4"}})).encode(text_item("s.txt:3", "s.txt", text, 3));
  ASSERT_TRUE(four.ok()) << four.status().message();
  EXPECT_EQ(four->size(), 4u);
  auto three = encoder(with(o, {{"max_windows", "3"}})).encode(text_item("s.txt:3", "s.txt", text, 3));
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.status().code(), Code::out_of_range);
  EXPECT_EQ(three.status().message(),
            "s.txt:3:1: s.txt:3: 10 tokens make 4 windows of 4 every 2, more than max_windows 3 (the limit on windows "
            "per item): raise max_windows (0: no limit), a longer stride, or length_policy: truncate");
  auto unlimited = encoder(with(o, {{"max_windows", "0"}})).encode(text_item("s.txt:3", "s.txt", text, 3));
  ASSERT_TRUE(unlimited.ok()) << unlimited.status().message();
  auto bad = Encoder::create(plugin(), options({{"max_windows", "-1"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("option max_windows: max_windows -1 is negative"), std::string::npos)
      << bad.status().message();
}

TEST(ProteinLimits, ASixMillionResidueProteinIsRefusedQuicklyWithoutAllocatingGigabytes) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory and an address-space limit do not mix";
#endif
  // Before the limit it became ~11,700 windows: 0.6 GB of rows in the plugin, as much again in the
  // host, 6.7 GB in its batch. In a child whose address space may grow by 512 MiB only, the
  // default max_windows refuses it before any window is made.
  const Encoder e = encoder({{"length_policy", "windows"}});
  std::string fasta = ">big a very long protein\n";
  const std::string letters = "ACDEFGHIKLMNPQRSTVWY";
  for (size_t i = 0; i < 6000000; ++i) {
    fasta += letters[i % letters.size()];
    if (i % 60 == 59) fasta += '\n';
  }
  const auto t0 = std::chrono::steady_clock::now();
  const testing_util::ChildRun child = testing_util::run_in_child(
      [&] {
        auto out = e.encode(text_item("big.fasta#1", "big.fasta", fasta, 1));
        return out.ok() ? "ok: " + std::to_string(out->size()) + " windows" : out.status().message();
      },
      512ull << 20);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(child.exited()) << "the child died: status " << child.status;
  const std::string& got = child.text;
  EXPECT_EQ(got,
            "big.fasta:1:1: big.fasta#1 (record big): 6000000 tokens make 11741 windows of 1022 every 511, more than "
            "max_windows 2048 (the limit on windows per item): raise max_windows (0: no limit), a longer stride, or "
            "length_policy: truncate");
  EXPECT_LT(took, 10.0);
}
