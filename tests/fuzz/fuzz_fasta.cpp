// Fuzzes FASTA datasets end to end: the host's record splitting (read_dataset on a .fasta file)
// and the protein plugin's record parsing and tokenizing (both tokenizers, esm and residues) of
// every record, as `tessera run` hands records to it.
#include <cstdlib>

#include "fuzz_util.h"
#include "tessera/run.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tessera::Encoder esm = fuzz::encoder("protein", {});
  static const tessera::Encoder residues = fuzz::encoder(
      "protein", {{"tokenizer", "residues"}, {"uppercase", "true"}, {"length_policy", "windows"},
                  {"max_length", "64"}, {"stride", "16"}});
  const std::string file = fuzz::scratch() + "/in.fasta";
  fuzz::write(file, std::string_view(reinterpret_cast<const char*>(data), size));
  tessera::DataConfig dc;
  dc.path = file;
  auto items = tessera::read_dataset(dc, {{"protein", TSR_INPUT_TEXT, {}}});
  if (!items.ok()) {
    if (items.status().message().empty()) std::abort();
    return 0;
  }
  for (const tessera::DataItem& it : *items) {
    if (!it.error.empty()) continue;
    if (it.parts.size() != 1) std::abort();
    auto bytes = tessera::item_part_bytes(it.parts[0]);
    if (!bytes.ok()) continue;
    for (const tessera::Encoder* e : {&esm, &residues}) {
      tessera::PluginItem item{it.id, file, *bytes, it.parts[0].offset, it.parts[0].line};
      auto rows = e->encode(item);
      if (!rows.ok() && rows.status().message().empty()) std::abort();
    }
  }
  return 0;
}
