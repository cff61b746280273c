// The shared machinery of the oneDNN fast path: engine, per-thread streams and scratch, the
// primitive cache, thread settings, runtime_info() and Tensor <-> oneDNN memory. It runs no op.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "dnnl/onednn.h"

namespace tessera {

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::none:
      return "none";
    case Activation::relu:
      return "relu";
    case Activation::gelu_erf:
      return "gelu_erf";
    case Activation::gelu_tanh:
      return "gelu_tanh";
  }
  return "?";
}

namespace onednn {

// ---------------------------------------------------------------------------------------------
// Engine, stream, threads

dnnl::engine& engine() {
  // Never destroyed: cached primitives and thread_local streams refer to it until exit.
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

namespace {
std::atomic<int> g_threads{0};  // 0: not set, use the OpenMP default
int default_threads() {
  static const int n = std::max(1, omp_get_max_threads());  // OMP_NUM_THREADS or all cores
  return n;
}
}  // namespace

int apply_threads() {
  const int want = num_threads();
  if (omp_get_max_threads() != want) omp_set_num_threads(want);
  return want;
}

namespace {
thread_local bool t_emulate_bf16 = false;
thread_local bool t_mismatched_packing = false;
thread_local bool t_no_bf16_gemv = false;
}  // namespace

bool has_native_bf16() {
  static const bool native = [] {
    try {
      // A small bf16 matmul: if oneDNN can make a descriptor, it has kernels for this CPU.
      const dnnl::memory::desc a({8, 8}, dnnl::memory::data_type::bf16, dnnl::memory::format_tag::ab);
      const dnnl::memory::desc b({8, 8}, dnnl::memory::data_type::bf16, dnnl::memory::format_tag::any);
      const dnnl::memory::desc c({8, 8}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}
bool use_native_bf16() { return has_native_bf16() && !t_emulate_bf16; }
bool mismatched_packing_for_testing() { return t_mismatched_packing; }
bool no_bf16_gemv_for_testing() { return t_no_bf16_gemv; }

ScopedBf16Emulation::ScopedBf16Emulation() : saved_(t_emulate_bf16) { t_emulate_bf16 = true; }
ScopedBf16Emulation::~ScopedBf16Emulation() { t_emulate_bf16 = saved_; }
ScopedMismatchedPacking::ScopedMismatchedPacking() : saved_(t_mismatched_packing) {
  t_mismatched_packing = true;
}
ScopedMismatchedPacking::~ScopedMismatchedPacking() { t_mismatched_packing = saved_; }
ScopedNoBf16Gemv::ScopedNoBf16Gemv() : saved_(t_no_bf16_gemv) { t_no_bf16_gemv = true; }
ScopedNoBf16Gemv::~ScopedNoBf16Gemv() { t_no_bf16_gemv = saved_; }

// ---------------------------------------------------------------------------------------------
// Primitive cache

namespace {
struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const Prim>> map;
  std::atomic<int64_t> created{0}, hits{0};
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: primitives may outlive static destruction
  return *c;
}
std::atomic<int64_t> g_packed_calls{0}, g_plain_calls{0}, g_plain_copies{0}, g_gemv_calls{0}, g_sgemm_calls{0};
}  // namespace

// Keys are byte strings: numbers go in as their 8 raw bytes (cheaper than printing them, and
// unambiguous since every field has a fixed size or a terminator).
Key& Key::operator<<(int64_t v) {
  s_.append(reinterpret_cast<const char*>(&v), sizeof v);
  return *this;
}
Key& Key::operator<<(const char* w) {
  s_.append(w);
  s_ += '\0';
  return *this;
}
Key& Key::operator<<(const std::string& bytes) {
  s_ += bytes;
  return *this;
}
Key& Key::operator<<(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return *this << static_cast<int64_t>(u);
}
Key& Key::operator<<(const dnnl::memory::desc& md) {
  // Everything that tells two layouts apart: dims, type, strides, inner blocks, extra flags.
  // (v2's dnnl_memory_desc_t; a move to v3 rewrites this through its query API.)
  const dnnl_memory_desc_t& d = md.data;
  *this << "md";
  *this << static_cast<int64_t>(d.data_type) << static_cast<int64_t>(d.format_kind)
        << static_cast<int64_t>(d.offset0);
  for (int i = 0; i < d.ndims; ++i) *this << static_cast<int64_t>(d.dims[i]);
  if (d.format_kind == dnnl_blocked) {
    const dnnl_blocking_desc_t& b = d.format_desc.blocking;
    *this << "s";
    for (int i = 0; i < d.ndims; ++i) *this << static_cast<int64_t>(b.strides[i]);
    *this << "b";
    for (int i = 0; i < b.inner_nblks; ++i)
      *this << static_cast<int64_t>(b.inner_blks[i]) << static_cast<int64_t>(b.inner_idxs[i]);
    for (int i = 0; i < d.ndims; ++i) *this << static_cast<int64_t>(d.padded_dims[i]);
    *this << static_cast<int64_t>(d.extra.flags);
  }
  return *this;
}

std::shared_ptr<const Prim> cached(Key key, const std::function<Prim()>& make) {
  key << "threads" << static_cast<int64_t>(omp_get_max_threads());  // oneDNN sizes work by it
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.map.find(key.str());
  if (it != c.map.end()) {
    c.hits.fetch_add(1, std::memory_order_relaxed);
    return it->second;
  }
  // Created under the lock: creation is rare (once per shape) and this keeps it once.
  Prim made = make();
  made.id = static_cast<uint64_t>(c.created.fetch_add(1, std::memory_order_relaxed)) + 1;
  auto p = std::make_shared<const Prim>(std::move(made));
  c.map.emplace(key.str(), p);
  return p;
}

CacheStats cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.created.load(), c.hits.load(), static_cast<int64_t>(c.map.size()), g_sgemm_calls.load()};
}

LinearStats linear_stats() {
  return {g_packed_calls.load(), g_plain_calls.load(), g_plain_copies.load(), g_gemv_calls.load()};
}
void count_linear_call(bool packed) { (packed ? g_packed_calls : g_plain_calls).fetch_add(1); }
void count_plain_copy() { g_plain_copies.fetch_add(1); }
void count_gemv_call() { g_gemv_calls.fetch_add(1, std::memory_order_relaxed); }
void count_sgemm_call() { g_sgemm_calls.fetch_add(1, std::memory_order_relaxed); }

dnnl::primitive_attr base_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

namespace {
// This thread's memory objects for one primitive, by argument id.
struct Bound {
  uint64_t prim_id = 0;
  std::unordered_map<int, dnnl::memory> args;
};
}  // namespace

void execute(const Prim& p, std::span<const Arg> args, std::span<const std::pair<int, dnnl::memory>> ready) {
  thread_local std::unordered_map<const Prim*, Bound> bound;
  Bound& b = bound[&p];
  if (b.prim_id != p.id) b = Bound{p.id, {}};  // first use here (or a recycled address)
  auto point = [&](int id, const dnnl::memory::desc& md, const void* data) {
    auto it = b.args.find(id);
    if (it == b.args.end())
      b.args.emplace(id, mem(md, data));
    else
      it->second.set_data_handle(const_cast<void*>(data));
  };
  for (const Arg& a : args) point(a.id, p.mds[static_cast<size_t>(a.md)], a.data);
  if (p.scratch_bytes > 0) point(DNNL_ARG_SCRATCHPAD, p.scratch_md, scratch(Slot::pad, p.scratch_bytes));
  // Ready memories own their buffers (a Linear's packed weights): hold them only for this call,
  // or a freed layer's weights would live on in every thread that ran it.
  struct Release {
    Bound& b;
    std::span<const std::pair<int, dnnl::memory>> ready;
    ~Release() {
      for (const auto& r : ready) b.args[r.first] = dnnl::memory();
    }
  } release{b, ready};
  for (const auto& [id, m] : ready) b.args[id] = m;
  dnnl::stream& s = stream();
  p.prim.execute(s, b.args);
  s.wait();
}

// ---------------------------------------------------------------------------------------------
// Scratch

namespace {
struct Buffer {
  void* p = nullptr;
  size_t size = 0;
  ~Buffer() { std::free(p); }
};
}  // namespace

void* scratch(Slot s, size_t bytes) {
  thread_local Buffer bufs[static_cast<int>(Slot::count)];
  Buffer& b = bufs[static_cast<int>(s)];
  if (bytes > b.size) {
    // Grow to at least 1.5x so that slowly growing requests (rising M) do not reallocate each time.
    size_t n = std::max(bytes, b.size + b.size / 2);
    n = (n + Tensor::kAlignment - 1) / Tensor::kAlignment * Tensor::kAlignment;
    void* p = std::aligned_alloc(Tensor::kAlignment, n);
    if (!p) throw std::bad_alloc();
    std::free(b.p);
    b.p = p;
    b.size = n;
  }
  return b.p;
}

Tensor scratch_tensor(Slot s, const Shape& shape, DType dtype) {
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(shape.numel()) * dtype_size(dtype));
  return Tensor::wrap(scratch(s, bytes), shape, dtype, nullptr);
}

// ---------------------------------------------------------------------------------------------
// Tensors as oneDNN memory

dnnl::memory::data_type dt_of(DType t) {
  using dt = dnnl::memory::data_type;
  switch (t) {
    case DType::f32:
      return dt::f32;
    case DType::bf16:
      return dt::bf16;
    case DType::f16:
      return dt::f16;
    case DType::i32:
      return dt::s32;
    case DType::u8:
      return dt::u8;
    case DType::i64:
    case DType::f64:
      return dt::undef;
  }
  return dt::undef;
}

namespace {
// Size-1 dims may carry any stride (their index is always 0); give them the stride a dense
// layout would, so that oneDNN recognises e.g. a (1, N) row as plain row-major.
dnnl::memory::dims canonical_strides(const dnnl::memory::dims& dims, dnnl::memory::dims strides) {
  int64_t extent = 1;
  for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
    if (dims[i] == 1)
      strides[i] = extent;
    else
      extent = std::max(extent, dims[i] * strides[i]);
  }
  return strides;
}

// A view's dims and canonical strides (a scalar as (1)).
void view_of(const Tensor& t, dnnl::memory::dims& dims, dnnl::memory::dims& strides) {
  dims.assign(t.shape().begin(), t.shape().end());
  strides.resize(dims.size());
  for (int i = 0; i < t.rank(); ++i) strides[i] = t.stride(i);
  if (dims.empty()) {
    dims = {1};
    strides = {1};
  }
  strides = canonical_strides(dims, strides);
}
}  // namespace

Key& Key::operator<<(const Tensor& t) {
  dnnl::memory::dims dims, strides;
  view_of(t, dims, strides);
  *this << "view" << static_cast<int64_t>(t.dtype()) << static_cast<int64_t>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) *this << dims[i] << strides[i];
  return *this;
}

dnnl::memory::desc md_of(const Tensor& t, const dnnl::memory::dims& dims, const dnnl::memory::dims& strides) {
  return dnnl::memory::desc(dims, dt_of(t.dtype()), canonical_strides(dims, strides));
}

dnnl::memory::desc md_of(const Tensor& t) {
  dnnl::memory::dims dims, strides;
  view_of(t, dims, strides);
  return dnnl::memory::desc(dims, dt_of(t.dtype()), strides);
}

dnnl::memory::desc dense_md(const dnnl::memory::dims& dims, dnnl::memory::data_type dt) {
  dnnl::memory::dims strides(dims.size());
  int64_t s = 1;
  for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= dims[i];
  }
  return dnnl::memory::desc(dims, dt, strides);
}

dnnl::memory mem(const dnnl::memory::desc& md, const void* data) {
  // oneDNN takes a non-const handle for inputs too; it does not write through inputs.
  return dnnl::memory(md, engine(), const_cast<void*>(data));
}
dnnl::memory mem_of(const Tensor& t) { return mem(md_of(t), t.raw_data()); }

bool is_dense_f32(const Tensor& t) { return t.dtype() == DType::f32 && t.is_contiguous(); }

namespace {
// [first byte, one past the last byte] of a view.
std::pair<uintptr_t, uintptr_t> byte_range(const Tensor& t) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(t.raw_data());
  if (t.numel() == 0) return {p, p};
  int64_t last = 0;
  for (int i = 0; i < t.rank(); ++i) last += (t.dim(i) - 1) * t.stride(i);
  return {p, p + static_cast<uintptr_t>((last + 1) * static_cast<int64_t>(dtype_size(t.dtype())))};
}
}  // namespace

bool overlaps(const Tensor& a, const Tensor& b) {
  const auto ra = byte_range(a), rb = byte_range(b);
  return ra.first < rb.second && rb.first < ra.second;
}

bool same_view(const Tensor& a, const Tensor& b) {
  if (a.raw_data() != b.raw_data() || a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  for (int i = 0; i < a.rank(); ++i)
    if (a.dim(i) > 1 && a.stride(i) != b.stride(i)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Conversion

namespace {
bool is_f32_or_bf16(DType t) { return t == DType::f32 || t == DType::bf16; }

// Offset (in elements) of row r of a view whose rows are its leading dims.
int64_t row_offset(const Tensor& t, int64_t r) {
  int64_t off = 0;
  for (int i = t.rank() - 2; i >= 0; --i) {
    off += (r % t.dim(i)) * t.stride(i);
    r /= t.dim(i);
  }
  return off;
}
}  // namespace

dnnl::algorithm eltwise_alg(Activation a) {
  switch (a) {
    case Activation::relu:
      return dnnl::algorithm::eltwise_relu;
    case Activation::gelu_erf:
      return dnnl::algorithm::eltwise_gelu_erf;
    case Activation::gelu_tanh:
      return dnnl::algorithm::eltwise_gelu_tanh;
    case Activation::none:
      break;
  }
  return dnnl::algorithm::undef;
}

namespace {

// Dense runs of the conversions bf16 compute makes at every matmul (mixed-precision training
// rounds every activation and gradient that enters one): the arithmetic of f32_to_bf16 and
// bf16_to_f32 (tensor.h), written without branches so that the compiler vectorises it, built
// for AVX-512, for AVX2 and for any x86-64, the widest the CPU has taken. Bit for bit the
// scalar functions'.
using u32_alias = uint32_t __attribute__((__may_alias__));
using u16_alias = uint16_t __attribute__((__may_alias__));

enum class Run { to_bf16, round_in_f32, from_bf16 };

inline uint32_t bf16_bits_of(uint32_t u) {
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // to nearest, ties to even
  const uint32_t nan = (u >> 16) | 0x40u;                            // a NaN stays a (quiet) NaN
  return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

template <Run kind>
inline void convert_run_body(const void* src, void* dst, int64_t n) {
  if constexpr (kind == Run::from_bf16) {
    const u16_alias* s = static_cast<const u16_alias*>(src);
    u32_alias* d = static_cast<u32_alias*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<uint32_t>(s[i]) << 16;
  } else {
    const u32_alias* s = static_cast<const u32_alias*>(src);
    if constexpr (kind == Run::to_bf16) {
      u16_alias* d = static_cast<u16_alias*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<uint16_t>(bf16_bits_of(s[i]));
    } else {
      u32_alias* d = static_cast<u32_alias*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = bf16_bits_of(s[i]) << 16;
    }
  }
}

template <Run kind>
__attribute__((target("avx2"))) void convert_run_avx2(const void* src, void* dst, int64_t n) {
  convert_run_body<kind>(src, dst, n);
}

// AVX-512 (F, BW, VL): 16 lanes, and the narrowing to bf16 one two-register word permute
// (vpermt2w) where AVX2 packs and then permutes; the Fashion-MNIST ViT's bf16 step spent 9 % of its
// time here with the AVX2 build, 6 % with this one.
template <Run kind>
__attribute__((target("avx512f,avx512bw,avx512vl,prefer-vector-width=512"))) void convert_run_avx512(const void* src,
                                                                                                    void* dst,
                                                                                                    int64_t n) {
  convert_run_body<kind>(src, dst, n);
}

template <Run kind>
void convert_run(const void* src, void* dst, int64_t n) {
  static const int isa = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") ? 2
                         : __builtin_cpu_supports("avx2")                                           ? 1
                                                                                                    : 0;
  if (isa == 2)
    convert_run_avx512<kind>(src, dst, n);
  else if (isa == 1)
    convert_run_avx2<kind>(src, dst, n);
  else
    convert_run_body<kind>(src, dst, n);
}

}  // namespace

void convert_rows(const Tensor& src, Tensor& dst, bool round_bf16, int64_t r0, int64_t r1) {
  const int64_t C = src.rank() ? src.dim(-1) : 1;
  const int64_t ss = src.rank() ? src.stride(-1) : 1, ds = dst.rank() ? dst.stride(-1) : 1;
  const bool sb = src.dtype() == DType::bf16, db = dst.dtype() == DType::bf16;
  const char* sp = static_cast<const char*>(src.raw_data());
  char* dp = static_cast<char*>(dst.raw_data());
  const int64_t se = static_cast<int64_t>(dtype_size(src.dtype()));
  const int64_t de = static_cast<int64_t>(dtype_size(dst.dtype()));
  for (int64_t r = r0; r < r1; ++r) {
    const char* s = sp + row_offset(src, r) * se;
    char* d = dp + row_offset(dst, r) * de;
    if (ss == 1 && ds == 1) {
      if (!sb && !db && !round_bf16) {
        std::memcpy(d, s, static_cast<size_t>(C) * 4);
        continue;
      }
      if (!sb && db) {
        convert_run<Run::to_bf16>(s, d, C);
        continue;
      }
      if (!sb && round_bf16) {
        convert_run<Run::round_in_f32>(s, d, C);
        continue;
      }
      if (sb && !db) {  // widening: exact, rounding changes nothing
        convert_run<Run::from_bf16>(s, d, C);
        continue;
      }
    }
    for (int64_t c = 0; c < C; ++c) {
      float v = sb ? bf16_to_f32(reinterpret_cast<const bf16*>(s)[c * ss])
                   : reinterpret_cast<const float*>(s)[c * ss];
      if (db) {
        reinterpret_cast<bf16*>(d)[c * ds] = f32_to_bf16(v);
      } else {
        if (round_bf16) v = round_to_bf16(v);
        reinterpret_cast<float*>(d)[c * ds] = v;
      }
    }
  }
}

void convert(const Tensor& src, Tensor& dst, bool round_bf16) {
  TSR_CHECK(src.shape() == dst.shape(), "convert: shapes differ");
  if (src.numel() == 0) return;
  if (!is_f32_or_bf16(src.dtype()) || !is_f32_or_bf16(dst.dtype())) {
    TSR_CHECK(!round_bf16, "convert: rounding needs f32/bf16 tensors");
    dst.copy_from(src);
    return;
  }
  const int64_t C = src.rank() ? src.dim(-1) : 1;
  const int64_t R = src.numel() / C;
  if (R * C <= 32768) return convert_rows(src, dst, round_bf16, 0, R);
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    convert_rows(src, dst, round_bf16, R * t / n, R * (t + 1) / n);
  }
}

Tensor dense_f32(const Tensor& t, Slot slot) {
  if (is_dense_f32(t)) return t;
  Tensor c = scratch_tensor(slot, t.shape(), DType::f32);
  convert(t, c);
  return c;
}

Tensor dense_input(const Tensor& t, const Tensor& out, Slot slot) {
  if (is_dense_f32(t) && (same_view(t, out) || !overlaps(t, out))) return t;
  Tensor c = scratch_tensor(slot, t.shape(), DType::f32);
  convert(t, c);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Errors

std::string describe(std::initializer_list<const Tensor*> ts) {
  std::string s;
  for (const Tensor* t : ts) {
    if (!s.empty()) s += ", ";
    s += t && t->defined() ? t->describe() : std::string("undefined");
  }
  return s;
}

Status from_dnnl_error(const char* op, const std::string& shapes, const dnnl::error& e) {
  std::string m = std::string(op) + ": oneDNN failed for " + shapes + ": " + e.what();
  if (e.status == dnnl_unimplemented)
    return Status::Unsupported(m + " (no oneDNN implementation for this case on this CPU)");
  return Status::Internal(m);
}

}  // namespace onednn

// ---------------------------------------------------------------------------------------------
// Public: threads and runtime_info

void set_num_threads(int n) {
  const int v = n > 0 ? n : std::max(1, omp_get_num_procs());
  onednn::g_threads.store(v);
  omp_set_num_threads(v);
}

int num_threads() {
  const int n = onednn::g_threads.load();
  return n > 0 ? n : onednn::default_threads();
}

namespace {
const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::all:
      return "all";
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
  }
  return "unknown";
}
}  // namespace

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  const dnnl_version_t* v = dnnl_version();
  info.onednn_version =
      std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  try {
    info.isa = isa_name(dnnl::get_effective_cpu_isa());
  } catch (const dnnl::error&) {
    info.isa = "unknown";
  }
  info.native_bf16 = onednn::has_native_bf16();
  info.threads = num_threads();
  return info;
}

}  // namespace tessera
