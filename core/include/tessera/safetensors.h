// Safetensors, read and written natively (https://huggingface.co/docs/safetensors).
// Reading memory-maps the file and validates it as the format demands before any tensor is
// touched; tensors come back as zero-copy views that keep the mapping alive.
//
//   Result<safetensors::File> f = safetensors::File::open("model.safetensors");
//   if (!f.ok()) { /* message names the file, the tensor and the rule broken */ }
//   Result<Tensor> w = f->get("blocks.0.attn.w_q");
//
// Layout: 8 bytes little-endian u64 N, then N bytes of UTF-8 JSON header (may be padded with
// trailing spaces), then the byte buffer. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} relative to the buffer, plus an optional
// "__metadata__" map of string to string.
// Rules checked on open, each failure naming the file, the tensor and the rule:
//   - the file holds at least 8 bytes; N is at most kMaxHeaderBytes and fits in the file;
//   - before it is parsed, the header nests at most kMaxHeaderDepth (4) arrays and objects and
//     its parsed tree would take at most kMaxHeaderTreeBytes (512 MiB, estimated from the text:
//     16 bytes a value, 64 more an array or object, 80 more an object member, long strings their
//     length; ordinary headers cost 6-11 bytes a byte, so this is a header of 50 MB or more);
//     a refusal names the file byte: "header refused: nesting deeper than 4 levels at byte 16";
//   - the header is valid JSON, an object, starts with '{'; no duplicate keys;
//   - every entry has exactly dtype, shape and data_offsets with the right JSON types;
//     dtype is one the format defines; shape entries are non-negative integers;
//   - begin <= end, end within the buffer;
//   - the element count times the dtype size equals end - begin, computed without overflow;
//   - the tensors, sorted by offset, cover the buffer exactly: no overlap, no hole, nothing
//     after the last tensor;
//   - __metadata__, if present, maps strings to strings.
//   - a shape has at most kMaxRank (6) dimensions: a deeper one is `unsupported`, not malformed.
// Thread-safety: a File is immutable after open() and may be shared.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/fileio.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::safetensors {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's bound
constexpr int kMaxHeaderDepth = 4;                  // file, entry, shape, and one more to name it
constexpr uint64_t kMaxHeaderTreeBytes = 512ull << 20;

struct TensorInfo {
  std::string name;
  std::string dtype_name;  // as in the file: "F32", "BF16", "F16", "I32", "I64", "U8", "BOOL", "F64", ...
  Shape shape;
  uint64_t begin = 0;  // byte offsets within the buffer
  uint64_t end = 0;
};

class File {
 public:
  static Result<File> open(const std::string& path);
  // Parse bytes already in memory; `label` names them in messages (tests, embedded data).
  static Result<File> from_bytes(std::string label, std::string bytes);

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file (offset) order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;

  // Zero-copy view for F32, BF16, F16, I32, I64, U8 and BOOL (as u8); other dtypes give an
  // `unsupported` status naming the tensor and its dtype. The view is read-only: the mapping is
  // PROT_READ, so writing through it faults (clone() first). Offsets need not be aligned; a
  // tensor whose data is not aligned to its element size comes back as an aligned copy.
  Result<Tensor> get(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<const void> owner_;  // the mapping or the byte string
  const uint8_t* buffer_ = nullptr;    // start of the byte buffer (after the header)
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Write tensors (any dtype in DType, any strides: written contiguous) in the given order,
// atomically. Names must be unique and non-empty; "__metadata__" is reserved. The header is
// compact JSON ("__metadata__" first, if any), space-padded so the data starts 8-byte aligned,
// as the reference writer does. u8 is written as U8 (a BOOL read back is written as U8). Order
// tensors by element size, largest first, to keep every tensor's data aligned.
Status write(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
             const std::map<std::string, std::string>& metadata = {});

// The bytes write() would produce, for tests and in-memory use.
Result<std::string> serialize(const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// The same bytes as pieces, in order: `head` (the 8-byte header length and the header), then
// each tensor's data, read from the tensor itself where it is contiguous (else from a contiguous
// copy). A file of any size can be written from them (write_file_atomic) without a second copy
// of the tensors in memory; the tensors must not change until then.
struct Pieces {
  std::string head;
  std::vector<Tensor> data;
  std::vector<std::string_view> views() const;  // head, then each tensor's bytes
  uint64_t size() const;                       // bytes in all
};
Result<Pieces> serialize_pieces(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                const std::map<std::string, std::string>& metadata = {});

}  // namespace tessera::safetensors
