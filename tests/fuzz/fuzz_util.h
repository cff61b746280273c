// Shared pieces of the libFuzzer harnesses (tests/fuzz/fuzz_*.cpp): a scratch folder per process,
// file writing, splitting one input into several files, and plugins loaded through the real ABI.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/plugins.h"

namespace fuzz {

// A folder of this process's own under /tmp (several fuzzers may run at once), made once.
inline const std::string& scratch() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/tessera-fuzz-XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) {
      perror("mkdtemp");
      std::abort();  // the harness itself cannot run: not a finding
    }
    return std::string(d);
  }();
  return dir;
}

inline void write(const std::string& path, std::string_view bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The input split at NUL bytes into at most `n` parts (the last one keeps any further NULs), so
// that one fuzz input can stand for several files; seeds are the files joined with "\0".
inline std::vector<std::string_view> split(std::string_view in, size_t n) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < n) {
    const size_t z = in.find('\0');
    if (z == std::string_view::npos) break;
    parts.push_back(in.substr(0, z));
    in.remove_prefix(z + 1);
  }
  parts.push_back(in);
  return parts;
}

// A plugin of the fuzz build (instrumented like the harness), loaded once.
inline std::shared_ptr<const tessera::Plugin> plugin(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const tessera::Plugin>> loaded;
  auto& p = loaded[name];
  if (!p) {
    auto r = tessera::Plugin::load(std::string(TESSERA_FUZZ_PLUGIN_DIR) + "/libtessera_" + name + ".so");
    if (!r.ok()) {
      fprintf(stderr, "cannot load plugin %s: %s\n", name.c_str(), r.status().message().c_str());
      std::abort();  // a broken harness setup, not a finding
    }
    p = *r;
  }
  return p;
}

// Every option of the plugin, as the config loader passes them: its defaults, overridden by `given`.
inline std::vector<std::pair<std::string, std::string>> options(const tessera::Plugin& p,
                                                                const std::map<std::string, std::string>& given) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const tessera::PluginOptionSpec& s : p.options()) {
    const auto it = given.find(s.name);
    out.emplace_back(s.name, it != given.end() ? it->second : s.default_value.value_or(""));
  }
  return out;
}

// An encoder of a plugin with these options set (the others at their defaults); a harness whose
// own options are refused is broken, not a finding.
inline tessera::Encoder encoder(const std::string& plugin_name, const std::map<std::string, std::string>& given) {
  auto p = plugin(plugin_name);
  auto e = tessera::Encoder::create(p, options(*p, given));
  if (!e.ok()) {
    fprintf(stderr, "%s\n", e.status().message().c_str());
    std::abort();
  }
  return std::move(e).value();
}

// Reads every byte of a buffer, so that a view past its end shows up under ASan.
inline uint64_t touch(const void* data, size_t n) {
  const auto* b = static_cast<const volatile uint8_t*>(data);
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += b[i];
  return s;
}

// The input's bytes as one item for a plugin that reads whole files: rows the host accepts (each
// read to its last byte), or a refusal that says why.
inline void encode_file_bytes(const tessera::Encoder& enc, const std::string& file, const uint8_t* data, size_t size) {
  tessera::PluginItem item{"fuzz", file, std::string_view(reinterpret_cast<const char*>(data), size)};
  auto rows = enc.encode(item);
  if (!rows.ok()) {
    if (rows.status().message().empty()) std::abort();
    return;
  }
  for (const auto& r : *rows) touch(r.features.raw_data(), r.features.nbytes());
}

}  // namespace fuzz
