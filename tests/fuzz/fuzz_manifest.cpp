// Fuzzes CSV and JSONL manifests (read_dataset on manifest.csv / manifest.jsonl). The first byte
// picks the format, whether data.allow_missing is set and whether the items pair a text plugin
// with an image plugin or feed one text plugin; the rest is the manifest. Paths in it may name the
// files a.png and b.txt beside it. Every text part the listing accepts is read back.
#include <cstdlib>

#include "fuzz_util.h"
#include "tessera/run.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string dir = fuzz::scratch();
  static const bool made = [&] {
    fuzz::write(dir + "/a.png", "not really a PNG");
    fuzz::write(dir + "/b.txt", "some text\n");
    return true;
  }();
  (void)made;
  const bool jsonl = data[0] & 1;
  tessera::DataConfig dc;
  dc.path = dir + (jsonl ? "/manifest.jsonl" : "/manifest.csv");
  dc.allow_missing = data[0] & 2;
  std::filesystem::remove(dir + (jsonl ? "/manifest.csv" : "/manifest.jsonl"));
  fuzz::write(dc.path, std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  std::vector<tessera::PluginInput> plugins = {{"text", TSR_INPUT_TEXT, {".txt"}}};
  if (data[0] & 4) plugins.push_back({"image", TSR_INPUT_FILE, {".png", ".jpg"}});
  auto items = tessera::read_dataset(dc, plugins);
  if (!items.ok()) {
    if (items.status().message().empty()) std::abort();
    return 0;
  }
  for (const tessera::DataItem& it : *items) {
    if (!it.error.empty()) continue;
    if (it.parts.size() != plugins.size()) std::abort();
    for (const tessera::ItemPart& part : it.parts) {
      if (part.missing || !part.is_text) continue;
      auto bytes = tessera::item_part_bytes(part);
      if (bytes.ok()) fuzz::touch(bytes->data(), bytes->size());
    }
  }
  return 0;
}
