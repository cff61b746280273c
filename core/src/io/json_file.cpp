// Bounded JSON reading: stat before read, depth and tree-size pre-scan before parse, no exception
// out. See json_file.h for the limits and the cost estimate.
#include "io/json_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tessera::jsonfile {

namespace {

std::string mib(uint64_t bytes) {
  std::ostringstream o;
  o.precision(3);
  o << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return o.str();
}

// Line and column (1-based) of 0-based byte `at` in text.
std::pair<size_t, size_t> line_col(std::string_view text, size_t at) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < at && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

}  // namespace

std::string prescan(std::string_view text, const Limits& lim, uint64_t base, Scan* scan) {
  Scan s;
  int depth = 0;
  uint64_t cost = 16;  // the top value
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char ch = text[i];
    switch (ch) {
      case '"': {  // skip the string, escapes included; long strings cost their length
        const size_t start = i++;
        while (i < n && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
        const size_t len = i - start - 1;
        if (len > 15) cost += len + 1;
        break;
      }
      case '[':
      case '{':
        if (++depth > lim.max_depth)
          return "nesting deeper than " + std::to_string(lim.max_depth) + " levels at byte " +
                 std::to_string(base + i) +
                 " (arrays and objects inside one another; the limit keeps a hostile file "
                 "from exhausting the stack or memory)";
        if (depth > s.depth) s.depth = depth;
        cost += 64;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;  // unbalanced text is the parser's to report, with line and column
        break;
      case ',':
        cost += 16;
        break;
      case ':':
        cost += 80;
        break;
      default:
        break;
    }
    if (cost > lim.max_tree_bytes)
      return "parsing it would take more than " + mib(lim.max_tree_bytes) + " of memory (estimated at byte " +
             std::to_string(base + i) +
             ": 16 bytes a value, 64 more an array or object, 80 more an object member)";
  }
  s.tree_bytes = cost;
  if (scan) *scan = s;
  return "";
}

Result<nlohmann::json> parse(std::string_view text, const std::string& label, const Limits& lim) {
  if (text.size() > lim.max_bytes)
    return Status::OutOfRange(label + ": " + std::to_string(text.size()) + " bytes is more than the " +
                              std::to_string(lim.max_bytes) + "-byte limit for this JSON file");
  if (std::string why = prescan(text, lim); !why.empty()) return Status::ParseError(label + ": " + why);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    const auto [line, col] = line_col(text, e.byte > 0 ? e.byte - 1 : 0);
    std::string what = e.what();
    const auto p = what.find("parse error");
    if (p != std::string::npos) what = what.substr(p);
    return Status::ParseError(label + ":" + std::to_string(line) + ":" + std::to_string(col) +
                              ": not valid JSON (" + what + ")");
  } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range 406: a number beyond a double (1e400)
    std::string what = e.what();
    const auto p = what.find("] ");
    if (p != std::string::npos) what = what.substr(p + 2);
    return Status::ParseError(label + ": not valid JSON for Tessera (" + what + ")");
  } catch (const std::exception& e) {
    return Status::Internal(label + ": the JSON parser failed: " + e.what());
  }
}

Result<nlohmann::json> read(const std::string& path, const Limits& lim) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    std::string m = path + ": cannot be read: " + std::strerror(err);
    return err == ENOENT ? Status::NotFound(m) : Status::IoError(m);
  }
  if (!S_ISREG(st.st_mode)) return Status::IoError(path + ": not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > lim.max_bytes)
    return Status::OutOfRange(path + ": " + std::to_string(size) +
                              " bytes is too large for a JSON settings file (the "
                              "limit is " +
                              std::to_string(lim.max_bytes) + " bytes; such files are kilobytes)");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(path + ": cannot be read: " + std::strerror(errno));
  std::string text;
  text.resize(static_cast<size_t>(size));
  in.read(text.data(), static_cast<std::streamsize>(size));
  text.resize(static_cast<size_t>(in.gcount()));  // a file that shrank meanwhile
  if (in.bad()) return Status::IoError(path + ": read failed");
  return parse(text, path, lim);
}

std::string brief(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return v.get<bool>() ? "true" : "false";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return v.dump();
    case nlohmann::json::value_t::number_float: {
      const double d = v.get<double>();
      if (!std::isfinite(d)) return "a number that is not finite";
      std::ostringstream o;
      o.precision(17);
      o << d;
      return o.str();
    }
    case nlohmann::json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      std::string q = nlohmann::json(s.size() > 60 ? s.substr(0, 60) : s)
                          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      if (s.size() > 60) q.insert(q.size() - 1, "...");
      return q;
    }
    case nlohmann::json::value_t::array:
      return "an array of " + std::to_string(v.size()) + (v.size() == 1 ? " value" : " values");
    case nlohmann::json::value_t::object:
      return "an object with " + std::to_string(v.size()) + (v.size() == 1 ? " key" : " keys");
    default:
      return std::string("a JSON ") + v.type_name();
  }
}

}  // namespace tessera::jsonfile
