// Reading the text plugin's vocabulary files: whole-file reads, line iteration, and errors that
// name the option, the file and line:col. Each tokenizer parses its own format on top.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <sys/stat.h>

#include "tessera/plugin.hpp"
#include "tokenizer.h"

namespace tessera::text {

VocabFile VocabFile::read(const std::string& option, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    tessera::plugin::fail(TSR_INVALID_ARGUMENT,
                          "cannot read " + path + ": it is a folder; name the file in it", option);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    const int err = errno;
    tessera::plugin::fail(err == ENOENT ? TSR_NOT_FOUND : TSR_IO_ERROR,
                          "cannot read " + path + ": " + std::strerror(err) +
                              " (relative paths are taken from the experiment file's "
                              "folder)",
                          option);
  }
  // The size is checked before anything is read: a vocabulary is at most a few MiB (GPT-2's
  // encoder.json is 1 MiB, a 256k-token SentencePiece vocab about 5 MiB), so a larger file is
  // not a vocabulary and reading it whole would only cost memory.
  struct stat st {};
  if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > kMaxBytes) {
    std::fclose(f);
    tessera::plugin::fail(TSR_INVALID_ARGUMENT,
                          "cannot read " + path + ": the file is " + std::to_string(st.st_size) +
                              " bytes, over the " + std::to_string(kMaxBytes >> 20) +
                              " MiB a vocabulary file may have; name the tokenizer's vocabulary file",
                          option);
  }
  VocabFile v{option, path, {}};
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) {
    if (v.data.size() + got > kMaxBytes) {  // not a regular file (a pipe), or one that grew
      std::fclose(f);
      v.fail("more than " + std::to_string(kMaxBytes >> 20) + " MiB; a vocabulary file is smaller");
    }
    v.data.append(buf, got);
  }
  const bool error = std::ferror(f) != 0;
  std::fclose(f);
  if (error) tessera::plugin::fail(TSR_IO_ERROR, "cannot read " + path + ": read error", option);
  if (v.data.empty()) v.fail("the file is empty");
  return v;
}

void VocabFile::for_each_line(const std::function<void(size_t, std::string_view, size_t)>& f) const {
  const std::string_view all(data);
  size_t line = 1;
  for (size_t start = 0; start < all.size(); ++line) {
    size_t nl = all.find('\n', start);
    if (nl == std::string_view::npos) nl = all.size();
    std::string_view text = all.substr(start, nl - start);
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    f(line, text, start);
    start = nl + 1;
  }
}

void VocabFile::fail_at(size_t line, size_t col, const std::string& what) const {
  tessera::plugin::fail(TSR_INVALID_ARGUMENT,
                        path + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + what, option);
}

void VocabFile::fail_at_offset(size_t offset, const std::string& what) const {
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset && i < data.size(); ++i)
    if (data[i] == '\n') ++line, line_start = i + 1;
  fail_at(line, offset - line_start + 1, what);
}

void VocabFile::fail(const std::string& what) const {
  tessera::plugin::fail(TSR_INVALID_ARGUMENT, path + ": " + what, option);
}

std::vector<Char> decode_line(const VocabFile& file, size_t line_no, std::string_view line) {
  std::vector<Char> chars;
  Utf8Problem problem;
  if (!decode_utf8(line, chars, &problem))
    file.fail_at(line_no, problem.offset + 1,
                 "invalid UTF-8: " + problem.reason + " (save the file as UTF-8)");
  return chars;
}

std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (b < 0x20 || b == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace tessera::text
