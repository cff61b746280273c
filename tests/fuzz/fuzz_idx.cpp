// Fuzzes the IDX (MNIST-style) reader, idx::parse, on raw bytes (gzip'd or not). An accepted
// tensor must be readable whole.
#include <cstdlib>

#include "fuzz_util.h"
#include "tessera/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto t = tessera::idx::parse("fuzz-idx3-ubyte", std::string_view(reinterpret_cast<const char*>(data), size));
  if (!t.ok()) {
    if (t.status().message().empty()) std::abort();
    return 0;
  }
  fuzz::touch(t->raw_data(), t->nbytes());
  return 0;
}
