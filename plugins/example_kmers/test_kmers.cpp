// The k-mer plugin through the real plugin ABI, as `tessera run` loads it: rows of a known record,
// decode, and bad inputs and options as exact error messages. Usage: test_kmers libtessera_kmers.so
#include <array>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tessera/plugins.h"

#define CHECK(c)                                                  \
  do {                                                            \
    if (!(c)) {                                                   \
      std::fprintf(stderr, "FAILED line %d: %s\n", __LINE__, #c); \
      return 1;                                                   \
    }                                                             \
  } while (0)

using Options = std::vector<std::pair<std::string, std::string>>;

int main(int argc, char** argv) {
  using namespace tessera;
  CHECK(argc == 2);
  auto plugin = Plugin::load(argv[1]);
  CHECK(plugin.ok());
  // Every option, as the config loader passes them (defaults filled in).
  auto enc = Encoder::create(*plugin, Options{{"k", "2"}, {"stride", "1"}, {"max_length", "6"}});
  CHECK(enc.ok());
  CHECK(enc->info().vocab_size == 4 + 16 && enc->info().max_rows == 6);

  // Rows: CLS, AC, CG, GT, EOS; a k-mer's id is 4 + 4 · first base + second (A0 C1 G2 T3).
  const std::string record = ">r1\nACGT\n";
  auto rows = enc->encode({"t.fa#1", "t.fa", record, 0, 1});
  CHECK(rows.ok() && rows->size() == 1);
  const TokenRows& r = (*rows)[0];
  CHECK((r.ids == std::vector<int32_t>{1, 4 + 1, 4 + 6, 4 + 11, 2}));
  CHECK(r.roles[0] == TSR_ROLE_CLS && r.roles[1] == TSR_ROLE_CONTENT && r.roles[4] == TSR_ROLE_EOS);
  CHECK(r.provenance[3].kind == TSR_PROV_RESIDUE && r.provenance[3].x0 == 2 && r.provenance[3].x1 == 4);
  CHECK((r.positions[3] == std::array<int32_t, 2>{3, -1}));
  auto text = enc->decode(r.ids);
  CHECK(text.ok() && *text == "AC CG GT");

  // Bad inputs: the exact message, pointing at file:line:col in the user's file.
  const std::string bad = ">r2\nAC\nG7T\n";  // the record starts on line 5 of t.fa
  auto err = enc->encode({"t.fa#2", "t.fa", bad, 0, 5});
  CHECK(!err.ok() && err.status().code() == Code::parse_error);  // TSR_BAD_INPUT
  CHECK(err.status().message() == "t.fa:7:2: '7' is not a nucleotide letter");
  auto tall = enc->encode({"t.fa#3", "t.fa", ">r3\nACGTACGT\n", 0, 9});
  CHECK(!tall.ok() &&
        tall.status().message() ==
            "t.fa#3: 9 rows with CLS and EOS, more than max_length 6 (raise max_length, or raise stride)");

  // A bad option names the plugin and the option, so `tessera run` can point at its line.
  auto k9 = Encoder::create(*plugin, Options{{"k", "9"}, {"stride", "1"}, {"max_length", "0"}});
  CHECK(!k9.ok() && k9.status().message() == "plugin kmers (" + std::string(argv[1]) +
                                                 "): option k: k must be between 1 and 8, got 9");
  std::puts("test_kmers: ok");
  return 0;
}
