// Non-finite values (NaN, ±inf): the scan of weights at load, and the watch over a forward pass
// that names the first intermediate where a batch row's values stop being finite. It does not
// decide what to do about them: the loader refuses, `tessera forward` and generation fail, the
// batch runner marks the item bad.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "exec.h"
#include "weights.h"
#include "tessera/model.h"
#include "tessera/parameters.h"

namespace tessera {

namespace {

// Float data read as integers of its width: may_alias tells the compiler so.
template <class U> struct Aliased;
template <> struct Aliased<uint16_t> { using type = uint16_t __attribute__((may_alias)); };
template <> struct Aliased<uint32_t> { using type = uint32_t __attribute__((may_alias)); };
template <> struct Aliased<uint64_t> { using type = uint64_t __attribute__((may_alias)); };

// any_nonfinite: whether any of n values of one width is non-finite, i.e. its exponent is all
// ones: |bits| (sign cleared) >= the bits of +inf. Adding (sign - inf) to |bits| carries into the sign bit exactly
// then, so an OR of those sums has its sign bit set iff some value is NaN or ±inf. Only AND, ADD
// and OR: it vectorises on plain SSE2 (no unsigned max before SSE4.1), with no early exit and no
// float compares that NaN would upset, so the common case — all finite — runs at memory speed.
template <class U>
U or_of_carries(const U* p_in, int64_t n, U abs_mask, U carry) {
  const auto* p = reinterpret_cast<const typename Aliased<U>::type*>(p_in);
  U acc = 0;
#pragma omp simd reduction(| : acc)
  for (int64_t i = 0; i < n; ++i) acc |= static_cast<U>((p[i] & abs_mask) + carry);
  return acc;
}

template <class U>
bool any_nonfinite(const U* p, int64_t n, U inf_bits, U sign_mask) {
  const U abs_mask = static_cast<U>(~sign_mask), carry = static_cast<U>(sign_mask - inf_bits);
  U acc = 0;
  constexpr int64_t kChunk = int64_t{1} << 20;
  if (n <= 4 * kChunk) {
    acc = or_of_carries(p, n, abs_mask, carry);
  } else {  // big tensors: chunks shared among the threads
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for reduction(| : acc) schedule(static)
    for (int64_t c = 0; c < chunks; ++c)
      acc |= or_of_carries(p + c * kChunk, std::min(kChunk, n - c * kChunk), abs_mask, carry);
  }
  return (acc & sign_mask) != 0;
}

template <class U>
NonFiniteScan scan_bits(const void* data, int64_t n, U inf_bits, U sign_mask, double (*value)(U)) {
  NonFiniteScan s;
  const auto* p = static_cast<const typename Aliased<U>::type*>(data);
  if (!any_nonfinite(p, n, inf_bits, sign_mask)) return s;
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<U>(p[i] & ~sign_mask) >= inf_bits) {
      if (s.index < 0) {
        s.index = i;
        s.value = value(p[i]);
      }
      ++s.count;
    }
  return s;
}

double f32_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
double bf16_bits(uint16_t u) { return bf16_to_f32(bf16{u}); }
double f16_bits(uint16_t u) { return f16_to_f32(f16{u}); }
double f64_bits(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

}  // namespace

NonFiniteScan find_nonfinite(const Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !dtype_is_float(t.dtype())) return {};
  const Tensor c = t.contiguous();  // weights and activations are contiguous: no copy
  const void* p = c.raw_data();
  const int64_t n = c.numel();
  switch (c.dtype()) {
    case DType::f32: return scan_bits<uint32_t>(p, n, 0x7f800000u, 0x80000000u, f32_bits);
    case DType::bf16: return scan_bits<uint16_t>(p, n, 0x7f80u, 0x8000u, bf16_bits);
    case DType::f16: return scan_bits<uint16_t>(p, n, 0x7c00u, 0x8000u, f16_bits);
    case DType::f64:
      return scan_bits<uint64_t>(p, n, 0x7ff0000000000000ull, 0x8000000000000000ull, f64_bits);
    default: return {};
  }
}

// Whether t holds a NaN or an infinity: the vectorised pass over dense data, row by row over a
// view whose last axis is dense (attention's q, k, v are strided views of one buffer), so that
// watching a forward pass copies nothing. Other layouts are made contiguous first.
bool has_nonfinite(const Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !dtype_is_float(t.dtype())) return false;
  if (t.dtype() != DType::f32 || t.is_contiguous() || t.stride(-1) != 1) return find_nonfinite(t).found();
  const int64_t inner = t.dim(-1), outer = t.numel() / inner;
  const float* base = t.data<float>();
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rest = o, offset = 0;
    for (int d = t.rank() - 2; d >= 0; --d) {
      offset += rest % t.dim(d) * t.stride(d);
      rest /= t.dim(d);
    }
    if (any_nonfinite(reinterpret_cast<const uint32_t*>(base + offset), inner, 0x7f800000u, 0x80000000u))
      return true;
  }
  return false;
}

std::string index_str(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(static_cast<size_t>(shape.rank()));
  for (int d = shape.rank() - 1; d >= 0; --d) {
    const int64_t n = shape[d] > 0 ? shape[d] : 1;
    idx[static_cast<size_t>(d)] = flat % n;
    flat /= n;
  }
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "]";
}

std::string nonfinite_name(double v) { return std::isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf"; }

namespace model {

std::string nonfinite_problem(const std::string& name, const std::string& origin, const Tensor& t) {
  const NonFiniteScan s = find_nonfinite(t);
  if (!s.found()) return "";
  return "tensor \"" + name + "\"" + origin + " (" + t.describe() + ") holds " + nonfinite_name(s.value) +
         " at flat index " + std::to_string(s.index) + " = " + index_str(t.shape(), s.index) +
         (s.count > 1 ? " (" + std::to_string(s.count) + " non-finite values in all)" : "");
}

}  // namespace model

Status Parameters::check_finite(const std::string& origin) const {
  std::string problems;
  int n = 0;
  const std::string in = origin.empty() ? "" : " in " + origin;
  for (const auto& [name, t] : entries_) {
    const std::string p = model::nonfinite_problem(name, in, t);
    if (p.empty()) continue;
    problems += "\n  " + p;
    ++n;
  }
  if (n == 0) return Status::Ok();
  return Status::Invalid(std::to_string(n) + " parameter tensor(s) hold NaN or infinite values:" + problems +
                         "\n  " + model::kNonFiniteWeightsHint);
}

// ---------------------------------------------------------------------------------------------
// The watch over a forward pass

namespace model {

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// The mask is -inf by design; .heads is a view of .concat, which comes next (dense, cheaper).
bool skipped(const std::string& name) { return ends_with(name, ".mask") || ends_with(name, ".heads"); }

}  // namespace

void FiniteWatch::see(const std::string& name, const Tensor& t) {
  if (pending_ == 0 || t.rank() < 1 || t.dim(0) != static_cast<int64_t>(found_->size())) return;
  if (skipped(name)) return;
  // A block's .in, .attn.in and .out are the values just seen under another name (the previous
  // output, ln1, ln2 or ffn.out): the same buffer as the last tensor read is not read again.
  const void* data = t.raw_data();
  if (data == last_data_ && t.numel() == last_numel_) return;
  last_data_ = data;
  last_numel_ = t.numel();
  if (!has_nonfinite(t)) return;  // the usual case: one pass over the whole batch
  for (size_t b = 0; b < found_->size(); ++b) {
    NonFinite& f = (*found_)[b];
    if (f.found()) continue;
    const Tensor row = t.select(0, static_cast<int64_t>(b));
    if (!has_nonfinite(row)) continue;
    const NonFiniteScan s = find_nonfinite(row);  // copies a strided row: rare
    f.layer = name;
    f.index = index_str(row.shape(), s.index);
    f.value = s.value;
    --pending_;
  }
}

}  // namespace model

namespace {

// "blocks.3.ffn.hidden" -> "block 3's feed-forward: first linear and activation".
std::string layer_gloss(const std::string& name) {
  static const std::pair<const char*, const char*> kParts[] = {
      {".attn.in", "attention input"},
      {".attn.q", "attention: the query projection"},
      {".attn.k", "attention: the key projection"},
      {".attn.v", "attention: the value projection"},
      {".attn.scores", "attention: the scores Q·Kᵀ"},
      {".attn.weights", "attention: the softmax weights"},
      {".attn.heads", "attention: the weighted sum of values"},
      {".attn.concat", "attention: the weighted sum of values"},
      {".attn.out", "attention: the output projection"},
      {".attn.residual", "attention: the output projection and residual"},
      {".ln1", "first layer norm"},
      {".ln2", "second layer norm"},
      {".ffn.hidden", "feed-forward: first linear and activation"},
      {".ffn.out", "feed-forward: second linear (and residual)"},
      {".out", "output"},
      {".in", "input"},
  };
  if (name == "stem.out") return "the stem (embedding or projection, and positions)";
  if (name == "final_norm.out") return "the final layer norm";
  if (name == "head.pooled") return "the head: the pooled vector";
  if (name == "head.logits") return "the head: the logits";
  if (name == "head.probs") return "the head: the probabilities";
  if (name.rfind("blocks.", 0) == 0) {
    const size_t dot = name.find('.', 7);
    const std::string block = "block " + name.substr(7, dot - 7) + "'s ";
    const std::string rest = dot == std::string::npos ? "" : name.substr(dot);
    for (const auto& [suffix, gloss] : kParts)
      if (rest == suffix) return block + gloss;
  }
  return name;
}

}  // namespace

std::string NonFinite::describe() const {
  if (!found()) return "all values finite";
  return nonfinite_name(value) + " first appears in " + layer + " (" + layer_gloss(layer) + ") at " + index;
}

Result<std::vector<NonFinite>> first_nonfinite_layers(const Model& model, const Batch& batch,
                                                     const ForwardOptions& options) {
  if (options.cache)
    return Status::Invalid("first_nonfinite_layers: cannot run a step of a KV cache again; set "
                           "ForwardOptions::find_nonfinite on the step itself");
  ForwardOptions o = options;
  o.find_nonfinite = true;
  o.capture.clear();
  Outputs out;
  TSR_RETURN_IF_ERROR(model.forward(batch, o, &out));
  return out.nonfinite;
}

Status nonfinite_status(const std::vector<NonFinite>& found, const std::string& what) {
  std::string lines;
  int n = 0;
  for (size_t b = 0; b < found.size(); ++b) {
    if (!found[b].found()) continue;
    lines += "\n  " + what + " " + std::to_string(b) + ": " + found[b].describe();
    ++n;
  }
  if (n == 0) return Status::Ok();
  return Status::OutOfRange(
      "the model's outputs are not finite for " + std::to_string(n) + " " + what + "(s):" + lines +
      "\n  with finite weights (they are checked at load) a NaN or inf comes from inputs too large for f32 "
      "(|x| beyond about 1e19 overflows in a product or a square) or from a layer whose values overflow; "
      "check the inputs' scale, or dump that layer and its input with --dump <name> to see where values grow");
}

}  // namespace tessera
