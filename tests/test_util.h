// Small helpers shared by the test suites: bytes of a tensor, hex decoding of fixture data.
#pragma once

#include <string>

#include "tessera/tensor.h"

namespace tessera::testing_util {

// "0a1b" -> "\x0a\x1b"
inline std::string hex_decode(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// The raw bytes of a contiguous tensor.
inline std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

}  // namespace tessera::testing_util
