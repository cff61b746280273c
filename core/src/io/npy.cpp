// NumPy .npy: a strict reader for the header dict literal (no eval) and a writer whose output
// matches NumPy's own byte for byte. No .npz, no structured dtypes, no Fortran order.
#include "tessera/npy.h"

#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "tessera/fileio.h"

namespace tessera::npy {

static_assert(std::endian::native == std::endian::little, ".npy files written here are little-endian");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kMaxHeaderBytes = 10000;  // NumPy's own bound (numpy.lib.format._MAX_HEADER_SIZE)
constexpr size_t kAlign = 64;              // NumPy pads the header so data starts 64-byte aligned

struct Descr {
  const char* text;
  size_t item_size;  // in the file
  DType dtype;       // in the tensor
};
constexpr Descr kDescrs[] = {
    {"<f4", 4, DType::f32}, {"<f2", 2, DType::f16}, {"<f8", 8, DType::f32}, {"<i4", 4, DType::i32},
    {"<i8", 8, DType::i64}, {"|u1", 1, DType::u8},  {"|b1", 1, DType::u8},
};

const char* descr_for(DType t) {
  switch (t) {
    case DType::f32: return "<f4";
    case DType::bf16: return "<f4";  // NumPy has no bfloat16: written as f32
    case DType::f16: return "<f2";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::u8: return "|u1";
    case DType::f64: return "<f8";
  }
  return "?";
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Recursive descent over the dict literal NumPy writes, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Keys may come in any order; each of the three must appear once and nothing else may.
class HeaderParser {
 public:
  HeaderParser(const std::string& label, std::string_view text, size_t file_offset)
      : label_(label), text_(text), base_(file_offset) {}

  Result<Header> parse() {
    Header h;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    TSR_RETURN_IF_ERROR(expect('{', "the header dict"));
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const size_t key_at = pos_;
      TSR_ASSIGN_OR_RETURN(std::string key, string_literal("a key"));
      TSR_RETURN_IF_ERROR(expect(':', "':' after the key '" + key + "'"));
      bool* seen = key == "descr"           ? &seen_descr
                   : key == "fortran_order" ? &seen_fortran
                   : key == "shape"         ? &seen_shape
                                            : nullptr;
      if (seen == nullptr)
        return fail_at(key_at, "unexpected key '" + key +
                                   "' (a .npy header has exactly 'descr', 'fortran_order' and 'shape')");
      if (*seen) return fail_at(key_at, "key '" + key + "' appears twice");
      *seen = true;
      if (key == "descr") {
        TSR_ASSIGN_OR_RETURN(h.descr, string_literal("the 'descr' string"));
      } else if (key == "fortran_order") {
        TSR_ASSIGN_OR_RETURN(h.fortran_order, boolean());
      } else {
        TSR_ASSIGN_OR_RETURN(h.shape, tuple());
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') return fail_at(pos_, "expected ',' or '}' after the value of '" + key + "'");
    }
    const size_t close_at = pos_++;
    skip_space();
    if (pos_ != text_.size()) return fail_at(pos_, "unexpected text after the header dict's closing '}'");
    for (auto [seen, key] :
         {std::pair{seen_descr, "descr"}, {seen_fortran, "fortran_order"}, {seen_shape, "shape"}})
      if (!seen) return fail_at(close_at, std::string("missing key '") + key + "'");
    return h;
  }

 private:
  Status fail_at(size_t at, const std::string& what) const {
    return Status::ParseError(label_ + ": header, file byte " + std::to_string(base_ + at) + ": " + what +
                              " (the .npy header is corrupt or was not written by NumPy)");
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  Status expect(char c, const std::string& what) {
    skip_space();
    if (peek() != c) return fail_at(pos_, "expected " + what);
    ++pos_;
    return Status::Ok();
  }

  // '...' or "..." without escapes.
  Result<std::string> string_literal(const std::string& what) {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') return fail_at(pos_, "expected " + what + " in quotes");
    const size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' || static_cast<unsigned char>(text_[pos_]) < 0x20 ||
          static_cast<unsigned char>(text_[pos_]) > 0x7e)
        return fail_at(pos_, "unexpected character in " + what + " (only plain ASCII is expected)");
      ++pos_;
    }
    if (pos_ == text_.size()) return fail_at(start - 1, "unterminated string for " + what);
    return std::string(text_.substr(start, pos_++ - start));
  }

  Result<bool> boolean() {
    skip_space();
    for (auto [word, value] : {std::pair{"True", true}, {"False", false}}) {
      if (text_.substr(pos_, std::strlen(word)) == word) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    return fail_at(pos_, "'fortran_order' must be True or False");
  }

  // (), (n,), (n, m), (n, m,) of non-negative integers.
  Result<std::vector<int64_t>> tuple() {
    TSR_RETURN_IF_ERROR(expect('(', "'(' opening the 'shape' tuple"));
    std::vector<int64_t> dims;
    bool trailing_comma = false;
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      const size_t at = pos_;
      if (peek() < '0' || peek() > '9') return fail_at(at, "shape entries must be non-negative integers");
      int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, peek() - '0', &v))
          return fail_at(at, "shape entry does not fit in 63 bits");
        ++pos_;
      }
      dims.push_back(v);
      skip_space();
      trailing_comma = peek() == ',';
      if (trailing_comma)
        ++pos_;
      else if (peek() != ')')
        return fail_at(pos_, "expected ',' or ')' in the 'shape' tuple");
    }
    if (dims.size() == 1 && !trailing_comma)
      return fail_at(pos_, "'shape' is a parenthesised integer, not a tuple (a 1-tuple is written (n,))");
    ++pos_;
    return dims;
  }

  const std::string& label_;
  std::string_view text_;
  size_t base_;  // file offset of text_[0]
  size_t pos_ = 0;
};

std::string shape_repr(const Shape& s) {
  if (s.rank() != 1) return s.str();
  std::string r = "(";  // appended piecewise: "(" + to_string(...) trips GCC 12's -Wrestrict (bug 105651)
  r += std::to_string(s[0]);
  r += ",)";
  return r;
}

// serialize(), with `label` (the path, or "npy") opening each message.
Result<std::string> serialize_as(const std::string& label, const Tensor& t) {
  if (!t.defined()) return Status::Invalid(label + ": cannot write an undefined tensor (a default Tensor())");
  const Tensor data = t.dtype() == DType::bf16 ? t.to(DType::f32) : t.contiguous();
  std::string header = std::string("{'descr': '") + descr_for(t.dtype()) +
                       "', 'fortran_order': False, 'shape': " + shape_repr(t.shape()) + ", }";
  // Version 1.0 (2-byte length) suffices: rank <= 6 keeps the header far below 64 KiB.
  const size_t prefix = kMagicLen + 2 + 2;
  header.append(kAlign - (prefix + header.size() + 1) % kAlign, ' ');
  header += '\n';
  const auto len = static_cast<uint16_t>(header.size());
  std::string out(kMagic, kMagicLen);
  out += '\x01';
  out += '\x00';
  out.append(reinterpret_cast<const char*>(&len), 2);
  out += header;
  out.append(static_cast<const char*>(data.raw_data()), data.nbytes());
  return out;
}

}  // namespace

Result<std::string> serialize(const Tensor& t) { return serialize_as("npy", t); }

Status save(const std::string& path, const Tensor& t) {
  TSR_ASSIGN_OR_RETURN(std::string bytes, serialize_as(path, t));
  return write_file_atomic(path, bytes);
}

Result<Tensor> parse(const std::string& label, const std::string& bytes) {
  auto fail = [&](const std::string& what) { return Status::ParseError(label + ": " + what); };
  if (bytes.size() < kMagicLen + 4)
    return fail("file is " + std::to_string(bytes.size()) +
                " bytes, too short for a .npy preamble (truncated or not .npy)");
  if (bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0)
    return fail("bytes 0-5 are not the .npy magic \\x93NUMPY (not a .npy file)");
  const int major = static_cast<uint8_t>(bytes[6]), minor = static_cast<uint8_t>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0)
    return Status::Unsupported(label + ": .npy format version " + std::to_string(major) + "." +
                               std::to_string(minor) + " (this reader knows 1.0, 2.0 and 3.0)");
  size_t header_len = 0, header_at = 0;
  if (major == 1) {
    uint16_t n;
    std::memcpy(&n, bytes.data() + 8, 2);
    header_len = n;
    header_at = 10;
  } else {
    uint32_t n;
    if (bytes.size() < 12)
      return fail("file is " + std::to_string(bytes.size()) + " bytes, too short for a version " +
                  std::to_string(major) + ".0 preamble (truncated)");
    std::memcpy(&n, bytes.data() + 8, 4);
    header_len = n;
    header_at = 12;
  }
  if (header_len > kMaxHeaderBytes)
    return fail("header length " + std::to_string(header_len) + " exceeds the " +
                std::to_string(kMaxHeaderBytes) + "-byte limit (NumPy's own bound; the file is corrupt)");
  if (header_len > bytes.size() - header_at)
    return fail("header length " + std::to_string(header_len) + " runs past the end of the " +
                std::to_string(bytes.size()) + "-byte file (truncated)");
  TSR_ASSIGN_OR_RETURN(
      Header h,
      HeaderParser(label, std::string_view(bytes).substr(header_at, header_len), header_at).parse());

  const Descr* descr = nullptr;
  for (const Descr& d : kDescrs)
    if (h.descr == d.text) descr = &d;
  if (descr == nullptr)
    return Status::Unsupported(
        label + ": 'descr' is '" + h.descr +
        "', which Tessera does not read (supported: <f4 <f2 <f8 <i4 <i8 |u1 |b1, little-endian; "
        "convert with a.astype('<f4') before saving)");
  if (h.fortran_order)
    return Status::Unsupported(label +
                               ": 'fortran_order' is True (column-major data is not read; save "
                               "np.ascontiguousarray(a) instead)");
  if (h.shape.size() > static_cast<size_t>(kMaxRank))
    return Status::Unsupported(label + ": 'shape' has " + std::to_string(h.shape.size()) +
                               " dimensions; Tessera tensors have at most " + std::to_string(kMaxRank));
  int64_t nonzero_product = 1;  // kept within int64 so that strides never overflow
  bool has_zero = false;
  for (int64_t d : h.shape) {
    has_zero |= d == 0;
    if (d != 0 && __builtin_mul_overflow(nonzero_product, d, &nonzero_product))
      return fail("'shape' has more elements than fit in 63 bits (corrupt)");
  }
  const int64_t numel = has_zero ? 0 : nonzero_product;
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), descr->item_size, &nbytes))
    return fail("'shape' needs more bytes than fit in 64 bits (corrupt)");
  const Shape shape(h.shape);
  const size_t data_at = header_at + header_len, have = bytes.size() - data_at;
  if (have != nbytes)
    return fail("data is " + std::to_string(have) + " bytes after the header (at byte " +
                std::to_string(data_at) + ") but " + h.descr + " shape " + shape.str() + " needs " +
                std::to_string(nbytes) +
                (have < nbytes ? " (the file is truncated)" : " (the file has trailing bytes)"));

  Tensor t = Tensor::empty(shape, descr->dtype);
  const char* src = bytes.data() + data_at;
  if (h.descr == "<f8") {
    float* dst = t.data<float>();
    for (int64_t i = 0; i < numel; ++i) {
      double v;
      std::memcpy(&v, src + i * 8, 8);
      dst[i] = static_cast<float>(v);
    }
  } else {
    std::memcpy(t.raw_data(), src, nbytes);
  }
  return t;
}

Result<Tensor> load(const std::string& path) {
  TSR_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  return parse(path, bytes);
}

}  // namespace tessera::npy
