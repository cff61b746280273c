// Tensor storage, views and dtype conversion. No arithmetic beyond element conversion lives here.
#include "tessera/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <numeric>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "tessera/status.h"
#include "tessera/tensor_reuse.h"

namespace tessera {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::f64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::f64: return "f64";
  }
  return "?";
}

bool dtype_is_float(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64;
}

float f16_to_f32(f16 v) {
  const uint32_t h = v.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;  // signed zero
    } else {     // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);  // inf or NaN
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16 f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return f16{static_cast<uint16_t>(sign | 0x7c00u)}; // overflow -> inf
  if (abs < 0x38800000u) {  // result is subnormal or zero: round |f| * 2^24 to an integer
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // exact: power of two
    // round half to even
    float fl = static_cast<float>(static_cast<uint32_t>(scaled));
    float rem = scaled - fl;
    uint32_t m = static_cast<uint32_t>(fl);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return f16{static_cast<uint16_t>(sign | m)};
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits, ties to even
  uint32_t v = abs - ((127u - 15u) << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return f16{static_cast<uint16_t>(sign | (v >> 13))};
}

// ---------------------------------------------------------------------------------------------
// Shape

Shape::Shape(std::initializer_list<int64_t> dims) {
  TSR_CHECK(dims.size() <= static_cast<size_t>(kMaxRank), "rank above kMaxRank");
  for (int64_t d : dims) d_[rank_++] = d;
}

Shape::Shape(const std::vector<int64_t>& dims) {
  TSR_CHECK(dims.size() <= static_cast<size_t>(kMaxRank), "rank above kMaxRank");
  for (int64_t d : dims) d_[rank_++] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= d_[i];
  return n;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < rank_; ++i) os << (i ? ", " : "") << d_[i];
  os << ")";
  return os.str();
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (d_[i] != o.d_[i]) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Tensor

namespace {

std::atomic<int64_t> g_allocations{0};

// The blocks TensorReuse keeps: free lists by size class. Blocks under kReuseMin come from
// malloc's own free lists cheaply and are not kept; larger ones are rounded up to one of eight
// classes per power of two (at most 12.5 % over), so that batches whose row counts vary a little
// still find a block. At most kReuseCap bytes are kept idle; a block beyond that is freed.
// Kept and live blocks together never hold more than the most the live ones ever held in this
// scope (peak_live): an allocation that finds no block of its class first frees idle blocks of
// other classes until that holds. A loop whose steps allocate the same tensors keeps every block
// (its misses are all in the first step, when nothing is idle yet); one whose shapes vary (batches
// of sequences padded to different lengths) no longer piles up blocks of sizes it has done with.
constexpr size_t kReuseMin = size_t{64} << 10;
constexpr size_t kReuseCap = size_t{4} << 30;

struct ReuseCache {
  std::mutex mu;
  int scopes = 0;
  size_t idle = 0;       // bytes kept for reuse
  size_t live = 0;       // bytes of blocks of kReuseMin or more in use
  size_t peak_live = 0;  // the most `live` has been since the first scope opened
  std::unordered_map<size_t, std::vector<void*>> free;
};

ReuseCache& reuse_cache() {
  static ReuseCache* cache = new ReuseCache;  // never destroyed: blocks may be freed at exit
  return *cache;
}

size_t reuse_class(size_t n) {
  if (n < kReuseMin) return n;
  size_t top = size_t{1} << (63 - __builtin_clzll(n));  // the power of two at or below n
  const size_t step = top / 8;
  return (n + step - 1) / step * step;
}

std::shared_ptr<void> allocate(size_t nbytes) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (nbytes > (SIZE_MAX >> 1)) throw std::bad_alloc();  // no machine has it; rounding up would wrap
  // Round up so that aligned_alloc's size is a multiple of the alignment; never zero bytes.
  size_t n = (nbytes + Tensor::kAlignment - 1) / Tensor::kAlignment * Tensor::kAlignment;
  if (n == 0) n = Tensor::kAlignment;
  if (n < kReuseMin) {
    void* p = std::aligned_alloc(Tensor::kAlignment, n);
    if (!p) throw std::bad_alloc();  // out of memory: ops turn it into a Status, `tessera` into exit 1
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  n = reuse_class(n);
  void* p = nullptr;
  ReuseCache& cache = reuse_cache();
  std::vector<void*> evicted;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.free.find(n);
    if (it != cache.free.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cache.idle -= n;
    }
    cache.live += n;
    cache.peak_live = std::max(cache.peak_live, cache.live);
    if (!p)  // a miss: idle blocks of other classes go first, so that idle + live <= peak_live
      for (auto e = cache.free.begin(); e != cache.free.end() && cache.idle + cache.live > cache.peak_live; ++e)
        while (!e->second.empty() && cache.idle + cache.live > cache.peak_live) {
          evicted.push_back(e->second.back());
          e->second.pop_back();
          cache.idle -= e->first;
        }
  }
  for (void* q : evicted) std::free(q);
  if (!p) p = std::aligned_alloc(Tensor::kAlignment, n);
  if (!p) {
    std::lock_guard<std::mutex> lock(cache.mu);
    cache.live -= n;
  }
  if (!p) throw std::bad_alloc();
  return std::shared_ptr<void>(p, [n](void* q) {
    ReuseCache& c = reuse_cache();
    {
      std::lock_guard<std::mutex> lock(c.mu);
      c.live -= n;
      if (c.scopes > 0 && c.idle + n <= kReuseCap) {
        c.free[n].push_back(q);
        c.idle += n;
        return;
      }
    }
    std::free(q);
  });
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<f16>() { return DType::f16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }

float load_as_float(const void* p, DType t) {
  switch (t) {
    case DType::f32: return *static_cast<const float*>(p);
    case DType::bf16: return bf16_to_f32(*static_cast<const bf16*>(p));
    case DType::f16: return f16_to_f32(*static_cast<const f16*>(p));
    case DType::i32: return static_cast<float>(*static_cast<const int32_t*>(p));
    case DType::i64: return static_cast<float>(*static_cast<const int64_t*>(p));
    case DType::u8: return static_cast<float>(*static_cast<const uint8_t*>(p));
    case DType::f64: return static_cast<float>(*static_cast<const double*>(p));
  }
  return 0.f;
}

// Converts one element; integer targets from integer sources are exact.
void convert_element(const void* src, DType st, void* dst, DType dt) {
  if (st == dt) {
    std::memcpy(dst, src, dtype_size(st));
    return;
  }
  if (!dtype_is_float(dt) && !dtype_is_float(st)) {
    int64_t v = st == DType::i32 ? *static_cast<const int32_t*>(src)
              : st == DType::i64 ? *static_cast<const int64_t*>(src)
                                 : *static_cast<const uint8_t*>(src);
    if (dt == DType::i32) *static_cast<int32_t*>(dst) = static_cast<int32_t>(v);
    else if (dt == DType::i64) *static_cast<int64_t*>(dst) = v;
    else *static_cast<uint8_t*>(dst) = static_cast<uint8_t>(v);
    return;
  }
  const float f = load_as_float(src, st);
  switch (dt) {
    case DType::f32: *static_cast<float*>(dst) = f; break;
    case DType::bf16: *static_cast<bf16*>(dst) = f32_to_bf16(f); break;
    case DType::f16: *static_cast<f16*>(dst) = f32_to_f16(f); break;
    case DType::i32: *static_cast<int32_t*>(dst) = static_cast<int32_t>(f); break;
    case DType::i64: *static_cast<int64_t*>(dst) = static_cast<int64_t>(f); break;
    case DType::u8: *static_cast<uint8_t*>(dst) = static_cast<uint8_t>(f); break;
    case DType::f64: *static_cast<double*>(dst) = f; break;
  }
}

}  // namespace

int64_t Tensor::allocations() { return g_allocations.load(std::memory_order_relaxed); }

TensorReuse::TensorReuse() {
  ReuseCache& c = reuse_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.scopes++ == 0) c.peak_live = c.live;
}

TensorReuse::Stats TensorReuse::stats() {
  ReuseCache& c = reuse_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.idle, c.live, c.peak_live};
}

TensorReuse::~TensorReuse() {
  ReuseCache& c = reuse_cache();
  std::unordered_map<size_t, std::vector<void*>> blocks;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (--c.scopes > 0) return;
    blocks.swap(c.free);
    c.idle = 0;
  }
  for (auto& [size, list] : blocks)
    for (void* p : list) std::free(p);
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) TSR_CHECK(d >= 0, "negative dimension");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  // A size past 64 bits cannot be allocated: never wrap it around. A zero dimension makes any
  // shape empty, however large the others (a .npy header may say (huge, 0)).
  bool zero = false;
  for (int64_t d : shape) zero |= d == 0;
  size_t bytes = zero ? 0 : dtype_size(dtype);
  for (int64_t d : shape)
    if (!zero && __builtin_mul_overflow(bytes, static_cast<size_t>(d), &bytes)) throw std::bad_alloc();
  t.storage_ = allocate(bytes);
  int64_t s = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    t.strides_[i] = s;
    s *= shape[i];
  }
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value;
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, const std::vector<float>& values) {
  TSR_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_vector: size != numel");
  Tensor t = empty(shape, DType::f32);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::from_ids(const Shape& shape, const std::vector<int32_t>& ids) {
  TSR_CHECK(static_cast<int64_t>(ids.size()) == shape.numel(), "from_ids: size != numel");
  Tensor t = empty(shape, DType::i32);
  if (!ids.empty()) std::memcpy(t.raw_data(), ids.data(), ids.size() * sizeof(int32_t));
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<const void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  // Aliasing constructor: the control block is the owner's, the pointer is `data`.
  t.storage_ = std::shared_ptr<void>(std::const_pointer_cast<void>(owner), data);
  if (!t.storage_) t.storage_ = std::shared_ptr<void>(std::shared_ptr<void>{}, data);
  int64_t s = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    t.strides_[i] = s;
    s *= shape[i];
  }
  return t;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype_)) + " " + shape_.str(); }

template <class T>
T* Tensor::data() {
  TSR_CHECK(dtype_ == dtype_of<T>(), "Tensor::data<T>: T does not match dtype");
  return static_cast<T*>(raw_data());
}
template <class T>
const T* Tensor::data() const {
  TSR_CHECK(dtype_ == dtype_of<T>(), "Tensor::data<T>: T does not match dtype");
  return static_cast<const T*>(raw_data());
}
template double* Tensor::data<double>();
template const double* Tensor::data<double>() const;
template float* Tensor::data<float>();
template const float* Tensor::data<float>() const;
template bf16* Tensor::data<bf16>();
template const bf16* Tensor::data<bf16>() const;
template f16* Tensor::data<f16>();
template const f16* Tensor::data<f16>() const;
template int32_t* Tensor::data<int32_t>();
template const int32_t* Tensor::data<int32_t>() const;
template int64_t* Tensor::data<int64_t>();
template const int64_t* Tensor::data<int64_t>() const;
template uint8_t* Tensor::data<uint8_t>();
template const uint8_t* Tensor::data<uint8_t>() const;

float Tensor::at(std::initializer_list<int64_t> index) const {
  TSR_CHECK(static_cast<int>(index.size()) == rank(), "Tensor::at: wrong number of indices");
  int64_t off = 0;
  int i = 0;
  for (int64_t ix : index) {
    TSR_CHECK(ix >= 0 && ix < shape_[i], "Tensor::at: index out of range");
    off += ix * strides_[i++];
  }
  return load_as_float(static_cast<const char*>(raw_data()) + off * dtype_size(dtype_), dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  TSR_CHECK(is_contiguous(), "reshape of a non-contiguous tensor; call contiguous() first");
  TSR_CHECK(shape.numel() == numel(), "reshape changes the number of elements");
  Tensor t = *this;
  t.shape_ = shape;
  int64_t s = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    t.strides_[i] = s;
    s *= shape[i];
  }
  for (int i = shape.rank(); i < kMaxRank; ++i) t.strides_[i] = 0;
  return t;
}

Tensor Tensor::slice(int dim, int64_t begin, int64_t end) const {
  if (dim < 0) dim += rank();
  TSR_CHECK(dim >= 0 && dim < rank(), "slice: bad dim");
  TSR_CHECK(0 <= begin && begin <= end && end <= shape_[dim], "slice: range outside the dim");
  Tensor t = *this;
  t.offset_ += begin * strides_[dim];
  t.shape_[dim] = end - begin;
  return t;
}

Tensor Tensor::select(int dim, int64_t index) const {
  if (dim < 0) dim += rank();
  TSR_CHECK(dim >= 0 && dim < rank(), "select: bad dim");
  TSR_CHECK(0 <= index && index < shape_[dim], "select: index outside the dim");
  Tensor t;
  t.storage_ = storage_;
  t.dtype_ = dtype_;
  t.offset_ = offset_ + index * strides_[dim];
  std::vector<int64_t> dims;
  int j = 0;
  for (int i = 0; i < rank(); ++i) {
    if (i == dim) continue;
    dims.push_back(shape_[i]);
    t.strides_[j++] = strides_[i];
  }
  t.shape_ = Shape(dims);
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  if (a < 0) a += rank();
  if (b < 0) b += rank();
  TSR_CHECK(a >= 0 && a < rank() && b >= 0 && b < rank(), "transpose: bad dims");
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::unsqueeze(int dim) const {
  if (dim < 0) dim += rank() + 1;
  TSR_CHECK(dim >= 0 && dim <= rank() && rank() < kMaxRank, "unsqueeze: bad dim");
  Tensor t;
  t.storage_ = storage_;
  t.dtype_ = dtype_;
  t.offset_ = offset_;
  std::vector<int64_t> dims = shape_.vec();
  dims.insert(dims.begin() + dim, 1);
  t.shape_ = Shape(dims);
  for (int i = 0, j = 0; i < t.rank(); ++i) {
    if (i == dim) t.strides_[i] = (dim < rank()) ? strides_[dim] * shape_[dim] : 1;
    else t.strides_[i] = strides_[j++];
  }
  return t;
}

Tensor Tensor::unflatten(int dim, int64_t outer, int64_t inner) const {
  if (dim < 0) dim += rank();
  TSR_CHECK(dim >= 0 && dim < rank() && rank() < kMaxRank, "unflatten: bad dim");
  TSR_CHECK(outer * inner == shape_[dim], "unflatten: outer * inner != dim");
  Tensor t;
  t.storage_ = storage_;
  t.dtype_ = dtype_;
  t.offset_ = offset_;
  std::vector<int64_t> dims;
  for (int i = 0, j = 0; i < rank(); ++i) {
    if (i == dim) {
      dims.push_back(outer);
      dims.push_back(inner);
      t.strides_[j++] = strides_[i] * inner;
      t.strides_[j++] = strides_[i];
    } else {
      dims.push_back(shape_[i]);
      t.strides_[j++] = strides_[i];
    }
  }
  t.shape_ = Shape(dims);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  TSR_CHECK(defined() && src.defined(), "copy_from: undefined tensor");
  TSR_CHECK(src.shape() == shape_, "copy_from: shapes differ");
  const int64_t n = numel();
  if (n == 0) return;
  if (src.dtype_ == dtype_ && is_contiguous() && src.is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  const size_t ss = dtype_size(src.dtype_), ds = dtype_size(dtype_);
  const char* sp = static_cast<const char*>(src.raw_data());
  char* dp = static_cast<char*>(raw_data());
  int64_t idx[kMaxRank] = {};
  const int r = rank();
  for (int64_t k = 0; k < n; ++k) {
    int64_t so = 0, d_off = 0;
    for (int i = 0; i < r; ++i) {
      so += idx[i] * src.strides_[i];
      d_off += idx[i] * strides_[i];
    }
    convert_element(sp + so * static_cast<int64_t>(ss), src.dtype_, dp + d_off * static_cast<int64_t>(ds), dtype_);
    for (int i = r - 1; i >= 0; --i) {
      if (++idx[i] < shape_[i]) break;
      idx[i] = 0;
    }
  }
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype);
  t.copy_from(*this);
  return t;
}

std::vector<float> Tensor::to_vector() const {
  Tensor c = dtype_ == DType::f32 ? contiguous() : to(DType::f32);
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

}  // namespace tessera
