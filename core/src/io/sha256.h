// SHA-256 (FIPS 180-4), written from the standard: checksums of the files Tessera writes, so a
// torn or corrupted file is caught and `sha256sum` can check them by hand. Not constant-time;
// not for secrets.
#pragma once

#include <string>
#include <string_view>

namespace tessera {

// The digest of `bytes` as 64 lowercase hex digits, as sha256sum prints it.
std::string sha256_hex(std::string_view bytes);

}  // namespace tessera
