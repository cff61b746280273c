// IDX files (the MNIST / Fashion-MNIST format), gzip'd or plain, read natively.
//
//   Result<Tensor> images = idx::load("t10k-images-idx3-ubyte.gz");   // u8 (10000, 28, 28)
//   Result<Tensor> labels = idx::load("t10k-labels-idx1-ubyte.gz");   // u8 (10000)
//
// The format: two zero bytes, the element type (0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d f32,
// 0x0e f64), the number of dimensions n, then n big-endian u32 sizes, then the elements in C order,
// big-endian. The tensor has the file's dims; u8, i32, f32 and f64 keep their type, i8 and i16
// widen to i32 (Tessera has no narrower signed type). A file is gzip'd when it starts with gzip's
// magic (1f 8b), whatever its name; concatenated gzip members are read as one stream.
//
// Hostile files are refused, never trusted: a bad magic, more than 6 dims, dims whose product
// overflows or needs more bytes than the file could hold (a plain file: its size; a gzip'd one:
// 1032 times its size, deflate's largest expansion), truncated data, trailing bytes, corrupt gzip
// data. Decompression stops at the size the header announces plus one byte, so a gzip bomb costs
// no more than that; memory that cannot be had is an error, not an abort. Each message names the
// file and the byte offset: of the file, or, for what lies inside a gzip stream, of the
// decompressed data ("decompressed byte 16").
#pragma once

#include <string>
#include <string_view>

#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::idx {

Result<Tensor> load(const std::string& path);
// The same from a file's bytes in memory (gzip'd or plain); `label` names it in messages.
Result<Tensor> parse(const std::string& label, std::string_view bytes);

}  // namespace tessera::idx
