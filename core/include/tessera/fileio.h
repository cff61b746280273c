// Files: read whole, write atomically, map read-only. Every failure names the path and the
// operating system's reason. Writes never leave a half-written file under the final name:
// they go to a temporary file beside it, are fsync'ed, then renamed over the target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <span>
#include <string_view>

#include "tessera/status.h"

namespace tessera {

Result<std::string> read_file(const std::string& path);

// FNV-1a, 64 bits: the content hash of run manifests and training configs (a fingerprint that
// notices any change, not a defence against someone forging one). Chain calls through `h`.
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
std::string hex64(uint64_t h);  // 16 lowercase hex digits

// Temp file in the same directory, write, fsync, rename, fsync the directory.
Status write_file_atomic(const std::string& path, std::string_view bytes);
// The same for a file given as pieces written one after another (a large file without a copy of
// it in memory: safetensors::Pieces).
Status write_file_atomic(const std::string& path, std::span<const std::string_view> pieces);

// A read-only memory map of a whole file. Move-only; unmaps on destruction. An empty file maps
// to size() == 0 and data() == nullptr.
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace tessera
