// What the parts of a batch run share (internal to core/src/run): a bad item, a batch as the
// batcher hands it over, and the names of shard and attention files (a sequence ready for the
// model is in sequences.h, which training shares). The parts: batcher (items -> encoded
// batches), writers (per-task outputs, shards, the merge), run_folder (lock, manifest, resume,
// temporary files), runner.cpp (the loop).
#pragma once

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sequences.h"
#include "tessera/fileio.h"
#include "tessera/plugins.h"

namespace tessera::run {

using json = nlohmann::json;

// A bad item: recorded in errors.jsonl, and the run goes on.
struct ItemError {
  int64_t item = 0;
  std::string id, file, reason;
};

// One batch of items (the unit the manifest records as done), encoded.
struct EncodedBatch {
  std::vector<Sequence> seqs;
  std::vector<ItemError> errors;
  uint64_t content = 0;  // the hash of its items' content, as they were read to be encoded (batch_content)
  std::vector<std::pair<int64_t, uint64_t>> item_hashes;  // (item, item_content_hash), while encoding
};

// FNV-1a of a length and then its bytes, so that ("ab", "c") and ("a", "bc") differ.
inline uint64_t hash_field(std::string_view s, uint64_t h) {
  const uint64_t n = s.size();
  return fnv1a(s.data(), s.size(), fnv1a(&n, sizeof n, h));
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One JSON line. Text that is not UTF-8 (a token that is a lone byte, a Latin-1 file name) is
// written with U+FFFD in place of the bad bytes rather than refused.
inline std::string jsonl_line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

inline std::string batch_name(int64_t k) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "batch-%06lld", static_cast<long long>(k));
  return buf;
}

// A file name for an item id: readable, and unique through a hash of the id.
inline std::string safe_name(const std::string& id) {
  std::string s;
  for (char c : id) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  if (s.size() > 80) s = s.substr(s.size() - 80);
  return s + "-" + hex64(fnv1a(id.data(), id.size(), kFnvOffset)).substr(0, 8);
}

}  // namespace tessera::run
