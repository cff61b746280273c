// Safetensors: header validation on open (every rule in safetensors.h), zero-copy tensor views,
// and the writer. Does no dtype conversion: tensors come back in the dtype the file stores.
#include "tessera/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "io/json_file.h"

namespace tessera::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; so is this reader");

namespace {

using nlohmann::json;

// A header is an object of entries {dtype, shape: [..], data_offsets: [..]}: three levels deep; four
// lets "shape entry 0 is a JSON array" be said. Its parsed tree may take at most 512 MiB (the
// estimate of json_file.h): an ordinary header costs 6-11 bytes a byte of text, so that is a header
// of 50 MB or more, hundreds of thousands of tensors; a header of small arrays under the 100 MB
// length limit would otherwise take gigabytes.
constexpr jsonfile::Limits kHeaderLimits{kMaxHeaderBytes, kMaxHeaderDepth, kMaxHeaderTreeBytes};

struct DTypeSpec {
  const char* name;
  uint64_t size;
  std::optional<DType> tessera;  // what get() returns, if it supports the dtype
};

// Every dtype the format defines (BOOL is stored one byte per element).
constexpr DTypeSpec kDTypes[] = {
    {"BOOL", 1, DType::u8},   {"U8", 1, DType::u8},         {"I8", 1, std::nullopt},
    {"I16", 2, std::nullopt}, {"U16", 2, std::nullopt},     {"F16", 2, DType::f16},
    {"BF16", 2, DType::bf16}, {"I32", 4, DType::i32},       {"U32", 4, std::nullopt},
    {"F32", 4, DType::f32},   {"F64", 8, std::nullopt},     {"I64", 8, DType::i64},
    {"U64", 8, std::nullopt}, {"F8_E5M2", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt},
};

const DTypeSpec* find_dtype(const std::string& name) {
  for (const DTypeSpec& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

const char* file_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::f64: return "F64";
  }
  return "?";
}

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

std::string offsets_str(uint64_t begin, uint64_t end) {
  std::string s = "[";  // appended piecewise: "[" + to_string(...) trips GCC 12's -Wrestrict (bug 105651)
  s += std::to_string(begin);
  s += ", ";
  s += std::to_string(end);
  s += "]";
  return s;
}

// The JSON value's kind, for messages: "a string", "a negative integer", ...
std::string describe(const json& v) {
  if (v.is_number_unsigned()) return "the integer " + v.dump();
  if (v.is_number_integer()) return "the negative integer " + v.dump();
  if (v.is_number_float()) return "the non-integer number " + v.dump();
  return std::string("a JSON ") + v.type_name();
}

// Reads a non-negative integer that fits in `max`, or says why not.
std::optional<std::string> read_uint(const json& v, uint64_t max, uint64_t* out) {
  if (!v.is_number_unsigned()) return describe(v);
  *out = v.get<uint64_t>();
  if (*out > max) return "the integer " + v.dump() + ", above " + std::to_string(max);
  return std::nullopt;
}

// nlohmann SAX handler: the first duplicate key of any object, and the first syntax error.
struct DuplicateKeys {
  std::vector<std::set<std::string>> seen;  // keys of the open objects, innermost last
  std::vector<std::string> path;            // the key being read in each open object
  std::optional<std::string> duplicate;
  std::string error;  // the parser's exception text
  int error_id = 0;
  size_t error_byte = 0;

  bool start_object(std::size_t) {
    seen.emplace_back();
    path.emplace_back();
    return true;
  }
  bool end_object() {
    seen.pop_back();
    path.pop_back();
    return true;
  }
  bool key(std::string& k) {
    path.back() = k;
    if (!duplicate && !seen.back().insert(k).second) {
      duplicate = "header has duplicate key " + in_quotes(k);
      if (seen.size() >= 2) duplicate = *duplicate + " inside " + in_quotes(path[0]);
    }
    return true;
  }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool parse_error(std::size_t byte, const std::string&, const json::exception& e) {
    error = e.what();
    error_id = e.id;
    error_byte = byte;
    return false;
  }
};

class Parser {
 public:
  Parser(std::string label, const uint8_t* data, size_t size)
      : label_(std::move(label)), data_(data), size_(size) {}

  // Fills the outputs or returns the first rule broken.
  Status parse(const uint8_t** buffer, std::vector<TensorInfo>* tensors,
               std::map<std::string, std::string>* metadata) {
    if (size_ < 8)
      return fail("file is " + std::to_string(size_) +
                  " bytes, shorter than the 8-byte header length (file is truncated or not safetensors)");
    uint64_t n;
    std::memcpy(&n, data_, 8);
    if (n > kMaxHeaderBytes)
      return fail("header length " + std::to_string(n) + " exceeds the " + std::to_string(kMaxHeaderBytes) +
                  "-byte limit (file is truncated or not safetensors)");
    if (n > size_ - 8)
      return fail("header length " + std::to_string(n) + " runs past the end of the file, which has " +
                  std::to_string(size_ - 8) +
                  " bytes after the length (file is truncated or not safetensors)");
    const std::string_view text(reinterpret_cast<const char*>(data_) + 8, n);
    TSR_ASSIGN_OR_RETURN(json header, parse_json(text));
    if (!header.is_object())
      return fail("header is " + describe(header) + ", not a JSON object (not a safetensors file)");
    if (text.front() != '{')
      return fail(
          "header must start with '{' at byte 8, but starts with whitespace (rewrite the file with a "
          "conforming writer)");

    *buffer = data_ + 8 + n;
    buffer_size_ = size_ - 8 - n;
    for (auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        TSR_RETURN_IF_ERROR(read_metadata(value, metadata));
        continue;
      }
      TensorInfo info;
      info.name = key;
      TSR_RETURN_IF_ERROR(read_entry(value, &info));
      tensors->push_back(std::move(info));
    }
    std::sort(tensors->begin(), tensors->end(), [](const TensorInfo& a, const TensorInfo& b) {
      return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
    });
    return check_coverage(*tensors);
  }

 private:
  Status fail(const std::string& what) const { return Status::ParseError(label_ + ": " + what); }
  Status fail(const std::string& tensor, const std::string& what) const {
    return fail("tensor " + in_quotes(tensor) + ": " + what);
  }

  // Parses the header text, refusing duplicate keys at any depth. Two linear passes: a SAX pass
  // for syntax and duplicates, then the tree. (nlohmann's parse with a callback, used before,
  // scans an object's members each time one of them closes: a header of 50 000 tensors took
  // minutes, quadratic in their number.)
  Result<json> parse_json(std::string_view text) const {
    if (std::string why = jsonfile::prescan(text, kHeaderLimits, 8); !why.empty())
      return fail("header refused: " + why + " (the file is corrupt, hostile or not safetensors)");
    DuplicateKeys keys;
    if (!json::sax_parse(text.begin(), text.end(), &keys)) {
      std::string why = keys.error;
      if (keys.error_id >= 100 && keys.error_id < 200) {  // parse_error: "... at line 1, column 5: why"
        const size_t colon = why.find(": ");
        if (colon != std::string::npos) why = why.substr(colon + 2);
        return fail("header is not valid JSON at file byte " + std::to_string(8 + keys.error_byte - 1) + ": " + why +
                    " (file is corrupt or not safetensors)");
      }
      const size_t close = why.find("] ");  // out_of_range 406: a number beyond a double, such as 1e400
      if (close != std::string::npos) why = why.substr(close + 2);
      return fail("header is not valid JSON for Tessera: " + why + " (file is corrupt or not safetensors)");
    }
    std::optional<std::string>& duplicate = keys.duplicate;
    json header;
    try {
      header = json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {  // the SAX pass has seen the same text parse
      return fail(std::string("header could not be parsed: ") + e.what());
    }
    if (duplicate) return fail(*duplicate + " (each tensor name and field may appear once)");
    return header;
  }

  Status read_metadata(const json& value, std::map<std::string, std::string>* metadata) const {
    if (!value.is_object())
      return fail("__metadata__ is " + describe(value) + " but must be an object mapping strings to strings");
    for (auto& [k, v] : value.items()) {
      if (!v.is_string())
        return fail("__metadata__ value for " + in_quotes(k) + " is " + describe(v) +
                    " but must be a string (__metadata__ maps strings to strings)");
      (*metadata)[k] = v.get<std::string>();
    }
    return Status::Ok();
  }

  Status read_entry(const json& entry, TensorInfo* info) const {
    const std::string& name = info->name;
    const char* fields = " (an entry has exactly dtype, shape and data_offsets)";
    if (!entry.is_object()) return fail(name, "entry is " + describe(entry) + ", not an object" + fields);
    for (auto& [k, v] : entry.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        return fail(name, "unexpected field " + in_quotes(k) + fields);
    for (const char* k : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(k)) return fail(name, std::string("missing field \"") + k + "\"" + fields);

    const json& dtype = entry["dtype"];
    if (!dtype.is_string())
      return fail(name, "dtype is " + describe(dtype) + ", not a string such as \"F32\"");
    info->dtype_name = dtype.get<std::string>();
    const DTypeSpec* spec = find_dtype(info->dtype_name);
    if (spec == nullptr) {
      std::string known;
      for (const DTypeSpec& d : kDTypes) known += std::string(known.empty() ? "" : ", ") + d.name;
      return fail(name,
                  "unknown dtype " + in_quotes(info->dtype_name) + " (the format defines " + known + ")");
    }

    const json& shape = entry["shape"];
    if (!shape.is_array()) return fail(name, "shape is " + describe(shape) + ", not an array of integers");
    if (shape.size() > static_cast<size_t>(kMaxRank))
      return Status::Unsupported(label_ + ": tensor " + in_quotes(name) + ": shape has " +
                                 std::to_string(shape.size()) + " dimensions; Tessera tensors have at most " +
                                 std::to_string(kMaxRank) + " (reshape it before saving)");
    std::vector<int64_t> dims;
    int64_t nonzero_product = 1;  // kept within int64 so that strides never overflow
    bool has_zero = false;
    for (size_t i = 0; i < shape.size(); ++i) {
      uint64_t d;
      if (auto why = read_uint(shape[i], std::numeric_limits<int64_t>::max(), &d))
        return fail(name, "shape entry " + std::to_string(i) + " is " + *why +
                              " (shape entries must be non-negative integers)");
      dims.push_back(static_cast<int64_t>(d));
      has_zero |= d == 0;
      if (d != 0 && __builtin_mul_overflow(nonzero_product, static_cast<int64_t>(d), &nonzero_product))
        return fail(
            name, "shape " + shape.dump() + " has more elements than fit in 63 bits (the shape is corrupt)");
    }
    info->shape = Shape(dims);
    const uint64_t numel = has_zero ? 0 : static_cast<uint64_t>(nonzero_product);

    const json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2)
      return fail(name, "data_offsets is " +
                            (offsets.is_array() ? "an array of " + std::to_string(offsets.size()) + " entries"
                                                : describe(offsets)) +
                            ", not an array [begin, end] of two integers");
    for (size_t i = 0; i < 2; ++i) {
      uint64_t v;
      if (auto why = read_uint(offsets[i], std::numeric_limits<uint64_t>::max(), &v))
        return fail(name, "data_offsets entry " + std::to_string(i) + " is " + *why +
                              " (offsets are non-negative integers)");
      (i == 0 ? info->begin : info->end) = v;
    }
    const std::string span = "data_offsets " + offsets_str(info->begin, info->end);
    if (info->begin > info->end) return fail(name, span + " has begin > end (offsets are [begin, end))");
    if (info->end > buffer_size_)
      return fail(name, span + " end beyond the " + std::to_string(buffer_size_) +
                            "-byte data buffer (file is truncated or the offsets are wrong)");
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, spec->size, &nbytes))
      return fail(name, info->dtype_name + " shape " + info->shape.str() +
                            " needs more bytes than fit in 64 bits (the shape is corrupt)");
    if (nbytes != info->end - info->begin)
      return fail(name, span + " span " + std::to_string(info->end - info->begin) + " bytes but " +
                            info->dtype_name + " shape " + info->shape.str() + " needs " +
                            std::to_string(nbytes) + " (dtype × shape must equal the byte span)");
    return Status::Ok();
  }

  // Tensors sorted by offset must tile the buffer: no overlap, no hole, nothing after the last.
  Status check_coverage(const std::vector<TensorInfo>& tensors) const {
    uint64_t covered = 0;
    const TensorInfo* prev = nullptr;
    for (const TensorInfo& t : tensors) {
      if (t.begin < covered)
        return fail(t.name, "data_offsets " + offsets_str(t.begin, t.end) + " overlap tensor " +
                                in_quotes(prev->name) + " " + offsets_str(prev->begin, prev->end) +
                                " (tensors must not share bytes)");
      if (t.begin > covered)
        return fail("bytes [" + std::to_string(covered) + ", " + std::to_string(t.begin) +
                    ") of the data buffer belong to no tensor (a hole before tensor " + in_quotes(t.name) +
                    "; tensors must cover the buffer exactly)");
      covered = t.end;
      prev = &t;
    }
    if (covered != buffer_size_)
      return fail("the data buffer has " + std::to_string(buffer_size_ - covered) +
                  " bytes after the last tensor, which ends at " + std::to_string(covered) +
                  " (trailing bytes: the file is corrupt or has data appended)");
    return Status::Ok();
  }

  std::string label_;
  const uint8_t* data_;
  size_t size_;
  uint64_t buffer_size_ = 0;
};

}  // namespace

Result<File> File::open(const std::string& path) {
  TSR_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> map, MappedFile::open(path));
  File f;
  f.path_ = path;
  TSR_RETURN_IF_ERROR(Parser(path, map->data(), map->size()).parse(&f.buffer_, &f.tensors_, &f.metadata_));
  f.owner_ = std::move(map);
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

Result<File> File::from_bytes(std::string label, std::string bytes) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  File f;
  f.path_ = std::move(label);
  const auto* data = reinterpret_cast<const uint8_t*>(owned->data());
  TSR_RETURN_IF_ERROR(Parser(f.path_, data, owned->size()).parse(&f.buffer_, &f.tensors_, &f.metadata_));
  f.owner_ = std::move(owned);
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

const TensorInfo* File::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<Tensor> File::get(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (info == nullptr)
    return Status::NotFound(path_ + ": no tensor named " + in_quotes(name) + " (the file has " +
                            std::to_string(tensors_.size()) + " tensors; list them with `tensors()`)");
  const DTypeSpec* spec = find_dtype(info->dtype_name);
  if (!spec->tessera)
    return Status::Unsupported(
        path_ + ": tensor " + in_quotes(name) + " has dtype " + info->dtype_name +
        ", which Tessera does not load (supported: F32, BF16, F16, I32, I64, U8, BOOL; "
        "convert the checkpoint to one of them)");
  void* p = const_cast<uint8_t*>(buffer_ + info->begin);
  if (reinterpret_cast<uintptr_t>(p) % spec->size == 0)
    return Tensor::wrap(p, info->shape, *spec->tessera, owner_);
  // Offsets need not be aligned; typed loads must be, so a misaligned tensor is copied.
  Tensor t = Tensor::empty(info->shape, *spec->tessera);
  std::memcpy(t.raw_data(), p, info->end - info->begin);
  return t;
}

namespace {

// serialize(), with `label` (the path, or "safetensors") opening each message.
Result<Pieces> pieces_as(const std::string& label, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  std::vector<Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const std::string where = label + ": tensor " + in_quotes(name);
    if (name.empty())
      return Status::Invalid(label + ": a tensor has an empty name (give every tensor a name)");
    if (name == "__metadata__")
      return Status::Invalid(where + ": the name is reserved for the metadata map (rename the tensor)");
    if (!names.insert(name).second)
      return Status::Invalid(where + ": the name appears twice (names must be unique)");
    if (!t.defined()) return Status::Invalid(where + ": the tensor is undefined (a default Tensor())");
    contiguous.push_back(t.contiguous());
    const uint64_t end = offset + t.nbytes();
    header[name] = {
        {"dtype", file_dtype_name(t.dtype())}, {"shape", t.shape().vec()}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::type_error&) {
    return Status::Invalid(label +
                           ": a tensor name or metadata string is not valid UTF-8 (the header is JSON text)");
  }
  text.append((8 - text.size() % 8) % 8,
              ' ');  // the data starts 8-byte aligned, as the reference writer does
  const uint64_t n = text.size();
  Pieces out;
  out.head.assign(8, '\0');
  std::memcpy(out.head.data(), &n, 8);
  out.head += text;
  out.data = std::move(contiguous);
  return out;
}

}  // namespace

std::vector<std::string_view> Pieces::views() const {
  std::vector<std::string_view> v{head};
  for (const Tensor& t : data) v.emplace_back(static_cast<const char*>(t.raw_data()), t.nbytes());
  return v;
}

uint64_t Pieces::size() const {
  uint64_t n = head.size();
  for (const Tensor& t : data) n += t.nbytes();
  return n;
}

Result<Pieces> serialize_pieces(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  return pieces_as("safetensors", tensors, metadata);
}

Result<std::string> serialize(const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  TSR_ASSIGN_OR_RETURN(Pieces p, pieces_as("safetensors", tensors, metadata));
  std::string out;
  out.reserve(p.size());
  for (std::string_view v : p.views()) out += v;
  return out;
}

Status write(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
             const std::map<std::string, std::string>& metadata) {
  TSR_ASSIGN_OR_RETURN(Pieces p, pieces_as(path, tensors, metadata));
  const std::vector<std::string_view> views = p.views();
  return write_file_atomic(path, views);
}

}  // namespace tessera::safetensors
