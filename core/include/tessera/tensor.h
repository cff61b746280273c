// Tensor: an n-dimensional strided view over 64-byte-aligned storage, in f32, bf16, f16 or ints.
// It is a handle, like a shared_ptr: copying a Tensor shares the storage; views (reshape, slice,
// select, transpose) share it too; clone() and contiguous() copy. It does no arithmetic: the ops
// in ops.h do, on the fast path (oneDNN) and on the reference path (plain loops).
//
//   Tensor x = Tensor::zeros({2, 3});             // (T, C) f32, contiguous, zero-filled
//   x.data<float>()[1 * 3 + 2] = 1.0f;            // row 1, column 2
//   Tensor row = x.select(0, 1);                  // (C) view of row 1
//   Tensor xt  = x.transpose(0, 1).contiguous();  // (C, T) copy
//
// Ownership: storage lives as long as any Tensor that refers to it. Tensor::wrap borrows memory
// (a memory-mapped file) and keeps the given owner alive instead of copying.
// Thread-safety: distinct Tensors may be used from distinct threads; writing into shared storage
// from two threads at once is the caller's race. Shapes use one alphabet in comments everywhere:
// B batch, T rows (tokens), C width (d_model), H heads, D head size, V vocabulary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

// Element types. Only grows: numbers are stored in files and never reused.
enum class DType : uint8_t {
  f32 = 0,
  bf16 = 1,
  f16 = 2,
  i32 = 3,
  i64 = 4,
  u8 = 5,
  f64 = 6,  // reference loops and gradient checks in double precision; no fast path reads it
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ...
bool dtype_is_float(DType t);

// bfloat16: the upper half of an IEEE f32. Conversion rounds to nearest, ties to even.
struct bf16 {
  uint16_t bits;
};
// IEEE 754 half precision.
struct f16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}
// The f32 nearest to f that a bf16 can hold.
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
float f16_to_f32(f16 v);
f16 f32_to_f16(float f);

constexpr int kMaxRank = 6;

// A shape of up to kMaxRank dimensions.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  int64_t numel() const;
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + rank_; }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  std::string str() const;  // "(2, 3)"
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }

 private:
  int rank_ = 0;
  int64_t d_[kMaxRank] = {};
};

class Tensor {
 public:
  static constexpr size_t kAlignment = 64;

  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype = DType::f32);  // uninitialised
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32);
  static Tensor full(const Shape& shape, float value);                // f32
  static Tensor from_vector(const Shape& shape, const std::vector<float>& values);
  static Tensor from_ids(const Shape& shape, const std::vector<int32_t>& ids);
  // Borrow `data` (contiguous, at least kAlignment-aligned is best but not required);
  // `owner` is kept alive while any view refers to it.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<const void> owner);
  // Storage blocks Tensor has allocated in this process so far (empty, zeros, clone, ...): for
  // tests and benchmarks that check a loop allocates nothing.
  static int64_t allocations();

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t stride(int i) const { return strides_[i < 0 ? i + rank() : i]; }  // in elements
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  std::string describe() const;  // "f32 (2, 3)"

  void* raw_data() { return static_cast<char*>(storage_.get()) + offset_ * dtype_size(dtype_); }
  const void* raw_data() const {
    return static_cast<const char*>(storage_.get()) + offset_ * dtype_size(dtype_);
  }
  // Typed pointer to the first element; aborts if T does not match dtype().
  template <class T> T* data();
  template <class T> const T* data() const;

  // Element as float, any dtype, any strides: for tests and printing, not for hot loops.
  float at(std::initializer_list<int64_t> index) const;

  // Views: share storage.
  Tensor reshape(const Shape& shape) const;  // needs is_contiguous()
  Tensor slice(int dim, int64_t begin, int64_t end) const;
  Tensor select(int dim, int64_t index) const;  // rank - 1
  Tensor transpose(int a, int b) const;
  Tensor unsqueeze(int dim) const;
  // Split one dim into (outer, inner), outer·inner == dim(d); works on strided views too:
  // (B, T, H·D) -> unflatten(2, H, D) -> (B, T, H, D).
  Tensor unflatten(int dim, int64_t outer, int64_t inner) const;

  // Copies.
  Tensor contiguous() const;  // *this when already contiguous
  Tensor clone() const;
  Tensor to(DType dtype) const;           // converts; same shape, contiguous
  void copy_from(const Tensor& src);      // same shape; any strides on either side; converts dtype

  // Floats as a flat f32 vector in row-major order (tests, printing).
  std::vector<float> to_vector() const;

 private:
  std::shared_ptr<void> storage_;
  DType dtype_ = DType::f32;
  Shape shape_;
  int64_t strides_[kMaxRank] = {};
  int64_t offset_ = 0;  // in elements
};

}  // namespace tessera
