// Fuzzes the text plugin's tokenizer files through the plugin ABI (Encoder::create, as a run
// creates its encoders): the first byte picks the tokenizer (wordpiece: vocab.txt; bpe: GPT-2's
// encoder.json and vocab.bpe/merges.txt; chars: one character per line), the rest is up to three
// parts joined by NUL bytes: the vocabulary file, the merges file and a text to encode. A
// vocabulary that loads must encode the text (or refuse it) and decode what it encoded.
#include <cstdlib>

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* const kTokenizers[] = {"wordpiece", "bpe", "chars"};
  const std::string tokenizer = kTokenizers[data[0] % 3];
  const auto parts = fuzz::split(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), 3);
  const std::string dir = fuzz::scratch();
  fuzz::write(dir + "/vocab", parts[0]);
  fuzz::write(dir + "/merges", parts.size() > 1 ? parts[1] : std::string_view());
  const std::string_view text = parts.size() > 2 ? parts[2] : std::string_view("Hello, world! Héllo wörld 123 [CLS]");
  auto p = fuzz::plugin("text");
  std::map<std::string, std::string> o = {{"tokenizer", tokenizer}, {"vocab", dir + "/vocab"}};
  if (tokenizer == "bpe") o["merges"] = dir + "/merges";
  if (data[0] & 4) o["add_special"] = "true";
  auto enc = tessera::Encoder::create(p, fuzz::options(*p, o));
  if (!enc.ok()) {
    if (enc.status().message().empty()) std::abort();
    return 0;
  }
  auto rows = enc->encode(tessera::PluginItem{"fuzz", "", text});
  if (!rows.ok()) {
    if (rows.status().message().empty()) std::abort();
    return 0;
  }
  for (const auto& r : *rows) {
    auto back = enc->decode(r.ids);
    if (!back.ok() && back.status().message().empty()) std::abort();
  }
  return 0;
}
