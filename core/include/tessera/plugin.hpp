// tessera/plugin.hpp — a header-only C++ helper that makes a plugin short to write.
// You write one class; the helper builds the C table of plugin.h around it, turns exceptions into
// tsr_error at the boundary, owns the rows until the host releases them, and parses options.
// It uses only the C++ standard library and plugin.h — never libtessera — so a plugin built with it
// stays loadable by any host that speaks the same ABI version.
//
//   class Kmers {
//    public:
//     explicit Kmers(const tessera::plugin::Options& o) : k_(o.get_int("k")) {}
//     tsr_encoder_info describe() const;                          // ids, vocabulary 4^k, causal 0
//     std::vector<tessera::plugin::Sequence> encode(const tessera::plugin::Item& item);
//     std::string decode(const std::vector<int32_t>& ids) const;  // optional
//     void augment(const tsr_rows& rows, uint64_t seed, float* out) const;  // optional, training
//    private:
//     int64_t k_;
//   };
//   static const tsr_option_spec kOptions[] = {
//       {sizeof(tsr_option_spec), "k", TSR_OPT_INT, "3", "letters per token", nullptr}};
//   static const tsr_plugin_info kInfo = {sizeof(tsr_plugin_info), "kmers", "dna", "1.0.0",
//       "DNA as overlapping k-mers", kOptions, 1, TSR_INPUT_TEXT, ".fa|.fasta"};
//   TESSERA_DEFINE_PLUGIN(Kmers, kInfo)
//
// Inside the class, report a problem with tessera::plugin::fail(TSR_BAD_INPUT, "message"): the
// host gets the code and message, names the item, and carries on with the next one.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/plugin.h"

namespace tessera::plugin {

// An error thrown inside the plugin; it crosses the boundary as a tsr_code and a message.
class Error : public std::exception {
 public:
  Error(tsr_code code, std::string message, std::string option = "")
      : code_(code), message_(std::move(message)), option_(std::move(option)) {}
  tsr_code code() const { return code_; }
  const std::string& option() const { return option_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  tsr_code code_;
  std::string message_;
  std::string option_;
};

[[noreturn]] inline void fail(tsr_code code, std::string message, std::string option = "") {
  throw Error(code, std::move(message), std::move(option));
}

// The validated options create() received, by name.
class Options {
 public:
  Options(const tsr_option_value* values, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i)
      if (values[i].name && values[i].value) values_[values[i].name] = values[i].value;
  }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  const std::string& text(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) fail(TSR_INVALID_ARGUMENT, "option \"" + name + "\" was not passed", name);
    return it->second;
  }
  bool get_bool(const std::string& name) const { return text(name) == "true"; }
  int64_t get_int(const std::string& name) const { return parse_int(text(name), name); }
  double get_float(const std::string& name) const { return parse_float(text(name), name); }
  const std::string& get_string(const std::string& name) const { return text(name); }
  std::vector<int64_t> get_ints(const std::string& name) const {
    std::vector<int64_t> out;
    for (const std::string& p : split(text(name))) out.push_back(parse_int(p, name));
    return out;
  }
  std::vector<double> get_floats(const std::string& name) const {
    std::vector<double> out;
    for (const std::string& p : split(text(name))) out.push_back(parse_float(p, name));
    return out;
  }

 private:
  static std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (!s.empty() && start <= s.size()) {
      const size_t comma = s.find(',', start);
      parts.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return parts;
  }
  static int64_t parse_int(const std::string& s, const std::string& name) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno) fail(TSR_INVALID_ARGUMENT, "option \"" + name + "\": \"" + s + "\" is not an integer", name);
    return v;
  }
  static double parse_float(const std::string& s, const std::string& name) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0') fail(TSR_INVALID_ARGUMENT, "option \"" + name + "\": \"" + s + "\" is not a number", name);
    return v;
  }
  std::map<std::string, std::string> values_;
};

// One input item, as the host passed it.
struct Item {
  std::string_view id;
  std::string_view source;  // empty for inline text
  const uint8_t* data = nullptr;
  size_t size = 0;
  uint64_t source_offset = 0;
  uint32_t source_line = 0;
  std::string_view text() const { return {reinterpret_cast<const char*>(data), size}; }
};

// Seeded draws for augment(): splitmix64, the same numbers on every machine.
class Draws {
 public:
  explicit Draws(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // An integer in [lo, hi], each equally likely (hi - lo well below 2^32).
  int64_t between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>((next() >> 32) * static_cast<uint64_t>(hi - lo + 1) >> 32);
  }
  bool coin() { return (next() >> 63) != 0; }

 private:
  uint64_t state_;
};

inline tsr_provenance no_provenance() { return {TSR_PROV_NONE, 0, 0, 0, 0, 0}; }
inline tsr_provenance byte_span(double b0, double b1) { return {TSR_PROV_BYTES, 0, b0, b1, 0, 0}; }
inline tsr_provenance pixel_box(double x0, double y0, double x1, double y1) {
  return {TSR_PROV_PIXELS, 0, x0, x1, y0, y1};
}
inline tsr_provenance time_freq_box(double t0, double t1, double band0, double band1) {
  return {TSR_PROV_TIME_FREQ, 0, t0, t1, band0, band1};
}
inline tsr_provenance residues(double r0, double r1) { return {TSR_PROV_RESIDUE, 0, r0, r1, 0, 0}; }

// One sequence of rows, built row by row; the helper turns it into a tsr_rows.
struct Sequence {
  tsr_rows_kind kind = TSR_ROWS_IDS;
  uint32_t width = 0;  // feature rows: values per row
  std::vector<int32_t> ids;
  std::vector<float> features;
  std::vector<int32_t> positions;  // 2 per row
  std::vector<uint8_t> roles;
  std::vector<tsr_provenance> provenance;
  uint32_t grid_rows = 0, grid_cols = 0;
  std::vector<uint8_t> picture;  // picture_height × picture_width × picture_channels
  uint32_t picture_width = 0, picture_height = 0, picture_channels = 0;
  double picture_x0 = 0, picture_x1 = 0, picture_y0 = 0, picture_y1 = 0;
  std::string label;

  size_t rows() const { return roles.size(); }
  // An id row at 1-D position `pos` (default: its index).
  void add_id(int32_t id, tsr_role role, tsr_provenance prov, int32_t pos = -1) {
    ids.push_back(id);
    push(role, prov, pos < 0 ? static_cast<int32_t>(rows()) : pos, -1);
  }
  // A feature row of `width` values at grid cell (row, col), or 1-D position row when col < 0.
  void add_features(const float* values, tsr_role role, tsr_provenance prov, int32_t row, int32_t col = -1) {
    features.insert(features.end(), values, values + width);
    push(role, prov, row, col);
  }

 private:
  void push(tsr_role role, tsr_provenance prov, int32_t a, int32_t b) {
    positions.push_back(a);
    positions.push_back(b);
    roles.push_back(static_cast<uint8_t>(role));
    provenance.push_back(prov);
  }
};

namespace detail {

inline void fill_error(tsr_error* e, int32_t code, const std::string& message, const std::string& option) {
  if (!e || e->size < sizeof(uint32_t) + sizeof(int32_t)) return;
  e->code = code;
  if (e->size >= offsetof(tsr_error, message) + TSR_MESSAGE_CAPACITY) {
    std::strncpy(e->message, message.c_str(), TSR_MESSAGE_CAPACITY - 1);
    e->message[TSR_MESSAGE_CAPACITY - 1] = '\0';
  }
  if (e->size >= offsetof(tsr_error, option) + TSR_KEY_CAPACITY) {
    std::strncpy(e->option, option.c_str(), TSR_KEY_CAPACITY - 1);
    e->option[TSR_KEY_CAPACITY - 1] = '\0';
  }
}

// Runs f; any exception becomes a return code and a filled tsr_error. Nothing escapes.
template <class F>
int32_t guarded(tsr_error* error, F&& f) noexcept {
  try {
    f();
    return TSR_OK;
  } catch (const Error& e) {
    fill_error(error, e.code(), e.what(), e.option());
    return e.code();
  } catch (const std::bad_alloc&) {
    fill_error(error, TSR_INTERNAL, "out of memory", "");
    return TSR_INTERNAL;
  } catch (const std::exception& e) {
    fill_error(error, TSR_INTERNAL, std::string("internal error: ") + e.what(), "");
    return TSR_INTERNAL;
  } catch (...) {
    fill_error(error, TSR_INTERNAL, "internal error: unknown exception", "");
    return TSR_INTERNAL;
  }
}

// The vectors behind an encoding, owned by the plugin until release().
struct Payload {
  std::vector<Sequence> sequences;
  std::vector<tsr_rows> rows;
};
// Standard layout with the encoding first, so release() can get back from the pointer it is given.
struct Owned {
  tsr_encoding encoding;
  Payload* payload;
};
static_assert(std::is_standard_layout_v<Owned>, "Owned must start with its tsr_encoding");

template <class Impl>
struct Table {
  static int32_t create(const tsr_option_value* options, uint32_t n, void** encoder, tsr_error* error) noexcept {
    return guarded(error, [&] { *encoder = new Impl(Options(options, n)); });
  }
  // No exception may cross the C ABI, even from a destructor that throws (it is then lost: the
  // call has no error to report it through).
  static void destroy(void* encoder) noexcept {
    try {
      delete static_cast<Impl*>(encoder);
    } catch (...) {
    }
  }
  static int32_t describe(void* encoder, tsr_encoder_info* info, tsr_error* error) noexcept {
    return guarded(error, [&] {
      tsr_encoder_info mine = static_cast<Impl*>(encoder)->describe();
      mine.size = sizeof(tsr_encoder_info);
      // Copy no more than the host's struct holds; keep its size (it says what it understands).
      const uint32_t host_size = info->size;
      std::memcpy(info, &mine, host_size < sizeof mine ? host_size : sizeof mine);
      info->size = host_size;
    });
  }
  static int32_t encode(void* encoder, const tsr_item* item, tsr_encoding** encoding, tsr_error* error) noexcept {
    return guarded(error, [&] {
      Item in;
      in.id = item->id ? item->id : "";
      in.source = item->source ? item->source : "";
      in.data = item->data;
      in.size = item->n_data;
      in.source_offset = item->source_offset;
      in.source_line = item->source_line;
      auto payload = std::make_unique<Payload>();
      payload->sequences = static_cast<Impl*>(encoder)->encode(in);
      for (Sequence& s : payload->sequences) {
        tsr_rows r{};
        r.size = sizeof(tsr_rows);
        r.kind = s.kind;
        r.n_rows = static_cast<uint32_t>(s.rows());
        r.width = s.width;
        r.ids = s.ids.empty() ? nullptr : s.ids.data();
        r.features = s.features.empty() ? nullptr : s.features.data();
        r.positions = s.positions.data();
        r.roles = s.roles.data();
        r.provenance = s.provenance.data();
        r.grid_rows = s.grid_rows;
        r.grid_cols = s.grid_cols;
        r.picture.size = sizeof(tsr_picture);
        r.picture.width = s.picture_width;
        r.picture.height = s.picture_height;
        r.picture.channels = s.picture_channels;
        r.picture.pixels = s.picture.empty() ? nullptr : s.picture.data();
        r.picture.x0 = s.picture_x0;
        r.picture.x1 = s.picture_x1;
        r.picture.y0 = s.picture_y0;
        r.picture.y1 = s.picture_y1;
        r.label = s.label.c_str();
        payload->rows.push_back(r);
      }
      auto owned = new Owned{{sizeof(tsr_encoding), static_cast<uint32_t>(payload->rows.size()), payload->rows.data()},
                             payload.get()};
      payload.release();
      *encoding = &owned->encoding;
    });
  }
  static void release(void*, tsr_encoding* encoding) noexcept {
    if (!encoding) return;
    Owned* owned = reinterpret_cast<Owned*>(encoding);  // the encoding is Owned's first member
    try {
      delete owned->payload;
    } catch (...) {
    }
    delete owned;
  }
  static int32_t decode(void* encoder, const int32_t* ids, size_t n, char* text, size_t capacity, size_t* length,
                        tsr_error* error) noexcept {
    return guarded(error, [&] {
      if constexpr (requires(const Impl& i) { i.decode(std::vector<int32_t>{}); }) {
        const std::string s = static_cast<const Impl*>(encoder)->decode(std::vector<int32_t>(ids, ids + n));
        *length = s.size();
        if (capacity < s.size() + 1) fail(TSR_OUT_OF_RANGE, "decode: the text needs " + std::to_string(s.size() + 1) + " bytes");
        std::memcpy(text, s.c_str(), s.size() + 1);
      } else {
        (void)encoder, (void)ids, (void)n, (void)text, (void)capacity, (void)length;
        fail(TSR_UNSUPPORTED, "this plugin's rows have no text to decode to");
      }
    });
  }
};

// augment() is optional: a plugin without `void augment(const tsr_rows&, uint64_t, float*) const`
// leaves the entry NULL.
template <class Impl>
constexpr bool has_augment = requires(const Impl& i, const tsr_rows& r, float* f) { i.augment(r, uint64_t{}, f); };

template <class Impl>
struct Augment {
  static int32_t call(void* encoder, const tsr_rows* rows, uint64_t seed, float* features, tsr_error* error) noexcept {
    return guarded(error, [&] {
      if constexpr (has_augment<Impl>) static_cast<const Impl*>(encoder)->augment(*rows, seed, features);
    });
  }
};

template <class Impl>
const tsr_plugin* table(const tsr_plugin_info* info) {
  constexpr bool augments = has_augment<Impl>;
  static const tsr_plugin t = {sizeof(tsr_plugin), TSR_PLUGIN_ABI_VERSION, info,
                               &Table<Impl>::create, &Table<Impl>::destroy, &Table<Impl>::describe,
                               &Table<Impl>::encode, &Table<Impl>::release, &Table<Impl>::decode,
                               augments ? &Augment<Impl>::call : nullptr};
  return &t;
}

}  // namespace detail
}  // namespace tessera::plugin

// Defines the plugin's one exported symbol for class Impl and its tsr_plugin_info.
#define TESSERA_DEFINE_PLUGIN(Impl, info)                                                      \
  extern "C" TSR_PLUGIN_EXPORT const tsr_plugin* tessera_plugin_entry(uint32_t host_abi_version) { \
    (void)host_abi_version;                                                                   \
    return ::tessera::plugin::detail::table<Impl>(&(info));                                   \
  }
