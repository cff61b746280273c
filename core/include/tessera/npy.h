// NumPy .npy files (format versions 1.0, 2.0 and 3.0), read and written natively.
// Written: f32, f16, i32, i64, u8 as themselves; bf16 as f32 (NumPy has no bfloat16), always
// C order, atomically (temp file, fsync, rename). Read: '<f4', '<f2', '<f8' (converted to f32),
// '<i4', '<i8', '|u1', '|b1' (as u8), C order; anything else is refused with a message naming the
// file and what was found. Headers are bounded (10000 bytes, NumPy's own limit) and parsed
// strictly (no Python eval); data shorter or longer than the shape says is refused. load()
// copies into an aligned tensor; it does not memory-map.
#pragma once

#include <string>

#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::npy {

Status save(const std::string& path, const Tensor& t);
Result<std::string> serialize(const Tensor& t);
Result<Tensor> load(const std::string& path);
Result<Tensor> parse(const std::string& label, const std::string& bytes);

}  // namespace tessera::npy
