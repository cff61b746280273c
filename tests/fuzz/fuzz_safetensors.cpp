// Fuzzes the safetensors reader on bytes in memory (File::from_bytes: the same validation as
// File::open on a mapped file): every tensor the header admits is fetched and read whole, so a view
// past the buffer shows up under ASan; a refusal must carry a message.
#include <cstdlib>

#include "fuzz_util.h"
#include "tessera/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tessera::safetensors::File;
  auto f = File::from_bytes("fuzz.safetensors", std::string(reinterpret_cast<const char*>(data), size));
  if (!f.ok()) {
    if (f.status().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  for (const auto& info : f->tensors()) {
    if (f->find(info.name) != &info) std::abort();
    auto t = f->get(info.name);
    if (!t.ok()) continue;  // unsupported dtypes are refused, with a message
    if (t->numel() != info.shape.numel()) std::abort();
    fuzz::touch(t->raw_data(), t->nbytes());
  }
  for (const auto& [k, v] : f->metadata()) fuzz::touch(v.data(), v.size());
  return 0;
}
