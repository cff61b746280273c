// JSON files from outside (Hugging Face settings files, safetensors headers), read so that no
// input can crash or exhaust the process: the size is checked with stat() before a byte is read,
// the text is pre-scanned for nesting depth and for the memory its parsed tree would take before
// nlohmann builds it, the parse never throws out, and values are described for messages without
// recursion (a value a million levels deep is "an array", not a million brackets). Private to
// libtessera (core/src/io, core/src/hf).
//
//   Result<nlohmann::json> j = jsonfile::read(dir + "/config.json", jsonfile::kSettings);
//   if (!j.ok()) return j.status();   // "…/config.json: nesting deeper than 64 levels at byte 17 …"
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tessera/status.h"

namespace tessera::jsonfile {

struct Limits {
  uint64_t max_bytes;       // the file (or header) size; larger is refused without reading it
  int max_depth;            // arrays and objects nested inside one another, the outermost counting 1
  uint64_t max_tree_bytes;  // the estimate of the parsed tree's memory (see Scan)
};

// Hugging Face settings files (config.json, preprocessor_config.json, tokenizer_config.json,
// modules.json, ...): real ones are kilobytes deep in a handful of levels.
inline constexpr Limits kSettings{64ull << 20, 64, 512ull << 20};

// The estimate of what nlohmann's tree of `text` takes, in bytes, from one pass over the text
// outside strings: 16 per value (every ',' separates one more), 64 more per '[' or '{' (the
// vector or map and the allocator's share), 80 more per ':' (an object member's map node and
// key), and each string longer than 15 bytes its length (no small-string buffer). Measured with
// nlohmann 3.11 on glibc it is at or above what the tree takes, give or take a few percent: empty
// arrays cost 49 bytes each (estimate 80), members 96 (96), zeros 17 (16), a million-deep nesting
// 64 a level (80), ordinary safetensors headers 6-11 bytes a byte of text (estimate 6-11).
struct Scan {
  int depth = 0;            // the deepest nesting seen
  uint64_t tree_bytes = 0;  // the estimate
};

// Scans `text` and returns "" when it is within `lim`, else the problem, naming the byte offset
// (`base` + offset in text, 0-based): "nesting deeper than 64 levels at byte 123 (...)".
std::string prescan(std::string_view text, const Limits& lim, uint64_t base = 0, Scan* scan = nullptr);

// prescan, then nlohmann's parse. `label` opens every message (the path). A syntax error names
// line and column: "<label>:3:21: not valid JSON (parse error ...)".
Result<nlohmann::json> parse(std::string_view text, const std::string& label, const Limits& lim = kSettings);

// stat(): not there, not a regular file or larger than lim.max_bytes is refused before reading;
// then the whole file is read and parsed.
Result<nlohmann::json> read(const std::string& path, const Limits& lim = kSettings);

// A short description of a value for messages, never longer than about 80 characters and never
// recursive: 32, true, "gelu", 1.5e-12, "an array of 3 values", "an object with 2 keys", null.
std::string brief(const nlohmann::json& v);

}  // namespace tessera::jsonfile
