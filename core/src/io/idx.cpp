// IDX: the header checked against what the file can hold before anything is allocated, then the
// elements read (through zlib for gzip'd files) straight into the tensor, byte-swapped in place.
#include "tessera/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "tessera/fileio.h"

namespace tessera::idx {

namespace {

struct ElementType {
  uint8_t code;
  const char* name;
  size_t size;  // in the file
  DType dtype;  // in the tensor
};
constexpr ElementType kTypes[] = {
    {0x08, "u8", 1, DType::u8},   {0x09, "i8", 1, DType::i32},  {0x0b, "i16", 2, DType::i32},
    {0x0c, "i32", 4, DType::i32}, {0x0d, "f32", 4, DType::f32}, {0x0e, "f64", 8, DType::f64},
};
constexpr const char* kTypeList = "0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d f32, 0x0e f64";

// Deflate's largest expansion is about 1032:1 (a run of one byte); no gzip file of n bytes holds
// more than this many times n, which bounds what a header may claim before decompressing.
constexpr uint64_t kMaxInflateRatio = 1032;

std::string hex_bytes(const uint8_t* p, size_t n) {
  std::string s;
  char buf[4];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", p[i]);
    if (i) s += ' ';
    s += buf;
  }
  return s;
}

// The file's IDX bytes in order: the file itself, or what its gzip stream inflates to.
class Source {
 public:
  Source(const std::string& label, std::string_view bytes)
      : label_(label),
        in_(bytes),
        gzip_(bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x1f &&
              static_cast<uint8_t>(bytes[1]) == 0x8b) {}
  ~Source() {
    if (z_open_) inflateEnd(&z_);
  }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  bool gzip() const { return gzip_; }

  // "byte 16" in a plain file, "decompressed byte 16" in a gzip'd one.
  std::string at(uint64_t offset) const {
    return (gzip_ ? "decompressed byte " : "byte ") + std::to_string(offset);
  }

  // The most IDX bytes that can follow what was read: exact for a plain file, deflate's bound for
  // a gzip'd one.
  uint64_t most_left() const {
    if (!gzip_) return in_.size() - produced_;
    const uint64_t n = in_.size();
    return n > std::numeric_limits<uint64_t>::max() / kMaxInflateRatio ? std::numeric_limits<uint64_t>::max()
                                                                       : n * kMaxInflateRatio;
  }

  // Reads up to n bytes into out; fewer only where the data ends. A gzip stream that is cut short
  // ends the data too (cut_short() then says where); corrupt gzip data is an error.
  Result<size_t> read(uint8_t* out, size_t n) {
    if (!gzip_) {
      const size_t k = std::min<uint64_t>(n, in_.size() - produced_);
      std::memcpy(out, in_.data() + produced_, k);
      produced_ += k;
      return k;
    }
    if (!z_open_) {
      if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK)
        return Status::Internal(label_ + ": zlib could not start inflating");
      z_open_ = true;
    }
    size_t done = 0;
    while (done < n && !ended_) {
      if (z_.avail_in == 0) {  // zlib counts in uInt: feed the file 1 GiB at a time
        const size_t k = std::min<size_t>(in_.size() - fed_, size_t{1} << 30);
        z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in_.data() + fed_));
        z_.avail_in = static_cast<uInt>(k);
        fed_ += k;
      }
      const size_t want = std::min<size_t>(n - done, size_t{1} << 30);
      z_.next_out = out + done;
      z_.avail_out = static_cast<uInt>(want);
      const int rc = inflate(&z_, Z_NO_FLUSH);
      done += want - z_.avail_out;
      const uint64_t at_in = fed_ - z_.avail_in;  // the file byte zlib has reached
      if (rc == Z_STREAM_END) {
        if (at_in == in_.size()) {
          ended_ = true;
        } else if (in_.size() - at_in >= 2 && static_cast<uint8_t>(in_[at_in]) == 0x1f &&
                   static_cast<uint8_t>(in_[at_in + 1]) == 0x8b) {
          inflateReset(&z_);  // another gzip member follows: the data goes on in it
        } else {
          return Status::ParseError(label_ + ": " + std::to_string(in_.size() - at_in) +
                                    " bytes after the end of the gzip stream at byte " +
                                    std::to_string(at_in) +
                                    " are not another gzip member (the file has trailing garbage; "
                                    "re-download or re-compress it)");
        }
      } else if (rc == Z_BUF_ERROR ||
                 (rc == Z_OK && z_.avail_in == 0 && fed_ == in_.size() && z_.avail_out > 0)) {
        ended_ = true;  // no input left before the end of the stream
        cut_at_ = in_.size();
      } else if (rc == Z_MEM_ERROR) {
        return Status::Internal(label_ + ": zlib ran out of memory inflating the file");
      } else if (rc != Z_OK) {
        return Status::ParseError(label_ + ": corrupt gzip data at byte " + std::to_string(at_in) +
                                  " of the file, " + at(produced_ + done) + ": zlib says \"" +
                                  (z_.msg ? z_.msg : "error " + std::to_string(rc)) +
                                  "\" (the file is damaged; re-download it)");
      }
    }
    produced_ += done;
    return done;
  }

  // Where a gzip stream that ended early was cut, for messages; "" when it was not.
  std::string cut_short() const {
    return cut_at_ ? " (the gzip stream is cut short: the file ends at byte " + std::to_string(*cut_at_) +
                         " before the stream's end; re-download it)"
                   : "";
  }

 private:
  const std::string& label_;
  std::string_view in_;
  bool gzip_;
  z_stream z_{};
  bool z_open_ = false, ended_ = false;
  size_t fed_ = 0;
  uint64_t produced_ = 0;
  std::optional<uint64_t> cut_at_;
};

std::string dims_text(const std::vector<uint64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? " × " : "") + std::to_string(dims[i]);
  return s;
}

uint32_t big_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// The n elements of `type` read in big-endian order into `data`, turned in place into the
// tensor's type in host order: the widened types go from the last element back, so that no
// element is overwritten before it is read.
void to_host(const ElementType& type, uint8_t* data, size_t n) {
  auto* wide = reinterpret_cast<int32_t*>(data);
  switch (type.code) {
    case 0x08:
      break;  // bytes are bytes
    case 0x09:
      for (size_t i = n; i-- > 0;) wide[i] = static_cast<int8_t>(data[i]);
      break;
    case 0x0b:
      for (size_t i = n; i-- > 0;) wide[i] = static_cast<int16_t>((data[2 * i] << 8) | data[2 * i + 1]);
      break;
    case 0x0c:
    case 0x0d:  // 4 bytes: the same bits, swapped into host order
      for (size_t i = 0; i < n; ++i) {
        const uint32_t v = big_u32(data + 4 * i);
        std::memcpy(data + 4 * i, &v, 4);
      }
      break;
    case 0x0e:
      for (size_t i = 0; i < n; ++i) {
        const uint64_t v = (uint64_t{big_u32(data + 8 * i)} << 32) | big_u32(data + 8 * i + 4);
        std::memcpy(data + 8 * i, &v, 8);
      }
      break;
  }
}

}  // namespace

Result<Tensor> parse(const std::string& label, std::string_view bytes) {
  Source src(label, bytes);
  auto fail = [&](const std::string& what) { return Status::ParseError(label + ": " + what); };
  if (bytes.empty()) return fail("empty file (0 bytes): not an IDX file");
  uint8_t head[4];
  TSR_ASSIGN_OR_RETURN(const size_t got, src.read(head, 4));
  if (got < 4)
    return fail("not an IDX file: it holds only " + std::to_string(got) +
                (src.gzip() ? " decompressed" : "") + (got == 1 ? " byte" : " bytes") +
                ", fewer than the 4 of an IDX header" + src.cut_short());
  if (head[0] != 0 || head[1] != 0)
    return fail("not an IDX file: it starts with bytes " + hex_bytes(head, 4) +
                (src.gzip() ? " (decompressed)" : "") +
                ", but an IDX file starts with 00 00, its element type and its number of dimensions");
  const ElementType* type = nullptr;
  for (const ElementType& t : kTypes)
    if (t.code == head[2]) type = &t;
  if (!type)
    return fail(src.at(2) + ": element type 0x" + hex_bytes(head + 2, 1) + " is not an IDX type (" +
                kTypeList + ")");
  const int rank = head[3];
  if (rank == 0) return fail(src.at(3) + ": 0 dimensions (an IDX file holds an array of at least one)");
  if (rank > kMaxRank)
    return fail(src.at(3) + ": " + std::to_string(rank) + " dimensions; Tessera's tensors have at most " +
                std::to_string(kMaxRank));

  uint8_t raw_dims[4 * kMaxRank];
  TSR_ASSIGN_OR_RETURN(const size_t got_dims, src.read(raw_dims, 4 * static_cast<size_t>(rank)));
  const uint64_t header = 4 + 4 * static_cast<uint64_t>(rank);
  if (got_dims < 4 * static_cast<size_t>(rank))
    return fail("truncated: the header needs " + std::to_string(header) + " bytes for its " +
                std::to_string(rank) + " dimensions, but the data ends at " + src.at(4 + got_dims) +
                src.cut_short());
  std::vector<uint64_t> dims(static_cast<size_t>(rank));
  uint64_t data_bytes = type->size;  // checked against overflow as it grows
  bool overflow = false;
  // A dimension of 0 empties the array, but the other dimensions still give the tensor's element
  // count and strides, which are int64: their product must fit too (as in npy.cpp).
  int64_t nonzero_product = 1;
  bool nonzero_overflow = false;
  for (int i = 0; i < rank; ++i) {
    const uint64_t d = big_u32(raw_dims + 4 * i);
    dims[static_cast<size_t>(i)] = d;
    overflow = overflow || __builtin_mul_overflow(data_bytes, d, &data_bytes);
    if (d != 0) nonzero_overflow = nonzero_overflow || __builtin_mul_overflow(nonzero_product, static_cast<int64_t>(d), &nonzero_product);
  }
  const std::string what = dims_text(dims) + " " + type->name;
  const std::string where = (src.gzip() ? "decompressed bytes 4.." : "bytes 4..") + std::to_string(header);
  if (overflow || data_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / 8)
    return fail(where + ": dimensions " + what + " need more bytes than any file holds (the header is corrupt)");
  if (nonzero_overflow)
    return fail(where + ": dimensions " + what + ": the array is empty, but its other dimensions multiply to more "
                "than 2^63 elements, more than a tensor can index (the header is corrupt)");
  // Before allocating: the data must fit in what the file can hold.
  if (data_bytes > src.most_left()) {
    if (!src.gzip())
      return fail("truncated: the header says " + what + " = " + std::to_string(data_bytes) +
                  " bytes of data from " + src.at(header) + ", but the file ends at byte " +
                  std::to_string(bytes.size()) + " (the file was cut short, or its header is wrong)");
    return fail("the header says " + what + " = " + std::to_string(data_bytes) + " bytes of data from " +
                src.at(header) + ", more than the " + std::to_string(bytes.size()) +
                " bytes of this gzip file can inflate to (deflate expands at most " +
                std::to_string(kMaxInflateRatio) + " times): the header is corrupt");
  }

  // The tensor's storage: the file's elements are read into it and converted in place (i8 and i16
  // are read into the front of their i32 storage and widened from the end).
  std::vector<int64_t> shape(dims.begin(), dims.end());
  const uint64_t numel = data_bytes / type->size;
  const size_t out_bytes = static_cast<size_t>(numel * dtype_size(type->dtype));
  const size_t alloc =
      (std::max<size_t>(out_bytes, 1) + Tensor::kAlignment - 1) / Tensor::kAlignment * Tensor::kAlignment;
  std::shared_ptr<void> storage(std::aligned_alloc(Tensor::kAlignment, alloc), std::free);
  if (!storage)
    return Status::Internal(label + ": out of memory: " + what + " needs " + std::to_string(out_bytes) +
                            " bytes");
  auto* raw = static_cast<uint8_t*>(storage.get());
  TSR_ASSIGN_OR_RETURN(const size_t got_data, src.read(raw, static_cast<size_t>(data_bytes)));
  if (got_data < data_bytes)
    return fail("truncated: the header says " + what + " = " + std::to_string(data_bytes) +
                " bytes of data from " + src.at(header) + " to " + src.at(header + data_bytes) +
                ", but the data ends at " + src.at(header + got_data) +
                (src.cut_short().empty() ? " (the file was cut short; re-download it)" : src.cut_short()));
  uint8_t extra = 0;
  TSR_ASSIGN_OR_RETURN(const size_t trailing, src.read(&extra, 1));
  if (trailing > 0)
    return fail(src.gzip()
                    ? "the decompressed data goes on past " + src.at(header + data_bytes) +
                          ", where the header's " + what + " end (trailing bytes, or the header is wrong)"
                    : std::to_string(bytes.size() - header - data_bytes) +
                          " trailing bytes after the data's end at " + src.at(header + data_bytes) +
                          " (the file ends at byte " + std::to_string(bytes.size()) + "; the header's " +
                          what + " are wrong, or the file is not IDX)");
  to_host(*type, raw, static_cast<size_t>(numel));
  return Tensor::wrap(raw, Shape(shape), type->dtype, std::move(storage));
}

Result<Tensor> load(const std::string& path) {
  TSR_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::open(path));
  return parse(path, std::string_view(reinterpret_cast<const char*>(file->data()), file->size()));
}

}  // namespace tessera::idx
