// Fuzzes the .npy reader (npy::parse: the bytes load() reads). An array it accepts must be whole
// (every byte readable), and writing it back and reading that again must give the same array.
#include <cstdlib>
#include <cstring>

#include "fuzz_util.h"
#include "tessera/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto t = tessera::npy::parse("fuzz.npy", std::string(reinterpret_cast<const char*>(data), size));
  if (!t.ok()) {
    if (t.status().message().empty()) std::abort();
    return 0;
  }
  fuzz::touch(t->raw_data(), t->nbytes());
  // Round trip: what we read, we can write, and read back unchanged.
  auto bytes = tessera::npy::serialize(*t);
  if (!bytes.ok()) return 0;  // a dtype the writer does not take is a refusal, not a crash
  auto back = tessera::npy::parse("roundtrip.npy", *bytes);
  if (!back.ok() || back->dtype() != t->dtype() || back->shape() != t->shape() ||
      std::memcmp(back->raw_data(), t->raw_data(), t->nbytes()) != 0) {
    fprintf(stderr, "round trip changed the array: %s -> %s\n", t->describe().c_str(),
            back.ok() ? back->describe().c_str() : back.status().message().c_str());
    std::abort();
  }
  return 0;
}
