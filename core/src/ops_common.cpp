// Argument checks shared by both op paths; each message names the op and the offending shape.
#include "ops_common.h"

#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>

namespace tessera::detail {

namespace {
bool is_float(const Tensor& t) { return t.dtype() == DType::f32 || t.dtype() == DType::bf16; }
Status need_defined(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) return Status::Invalid(std::string(op) + ": " + name + " is undefined");
  return Status::Ok();
}
// "(2, 3, 4)"
std::string shape_text(std::initializer_list<int64_t> dims) {
  std::string s = "(";
  for (int64_t x : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(x);
  return s + ")";
}
Status need_float(const char* op, const char* name, const Tensor& t) {
  TSR_RETURN_IF_ERROR(need_defined(op, name, t));
  if (!is_float(t))
    return Status::Invalid(std::string(op) + ": " + name + " must be f32 or bf16, got " +
                           t.describe());
  return Status::Ok();
}
}  // namespace

Status check_same_shape(const char* op, const Tensor& x, const Tensor& y) {
  TSR_RETURN_IF_ERROR(need_float(op, "x", x));
  TSR_RETURN_IF_ERROR(need_defined(op, "y", y));
  if (x.shape() != y.shape())
    return Status::Invalid(std::string(op) + ": output " + y.describe() + " does not match input " +
                           x.describe());
  return Status::Ok();
}

Status check_linear_shapes(const char* op, const Tensor& x, const Tensor& w, const Tensor& b,
                           const Tensor* residual, const Tensor& y) {
  TSR_RETURN_IF_ERROR(need_float(op, "x", x));
  TSR_RETURN_IF_ERROR(need_float(op, "weight", w));
  TSR_RETURN_IF_ERROR(need_defined(op, "y", y));
  if (x.rank() != 2 || w.rank() != 2)
    return Status::Invalid(std::string(op) + ": x must be (M, K) and weight (K, N); got x " +
                           x.describe() + ", weight " + w.describe());
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  if (w.dim(0) != K)
    return Status::Invalid(std::string(op) + ": x " + x.describe() + " has K = " +
                           std::to_string(K) + " but weight " + w.describe() + " has K = " +
                           std::to_string(w.dim(0)));
  if (b.defined() && (b.rank() != 1 || b.dim(0) != N))
    return Status::Invalid(std::string(op) + ": bias " + b.describe() + " should be (" +
                           std::to_string(N) + ")");
  if (y.rank() != 2 || y.dim(0) != M || y.dim(1) != N)
    return Status::Invalid(std::string(op) + ": output " + y.describe() + " should be (" +
                           std::to_string(M) + ", " + std::to_string(N) + ")");
  if (residual && residual->shape() != y.shape())
    return Status::Invalid(std::string(op) + ": residual " + residual->describe() +
                           " should match output " + y.describe());
  return Status::Ok();
}

Status check_matmul_shapes(const char* op, const Tensor& a, const Tensor& b, const Tensor& c) {
  TSR_RETURN_IF_ERROR(need_float(op, "a", a));
  TSR_RETURN_IF_ERROR(need_float(op, "b", b));
  TSR_RETURN_IF_ERROR(need_defined(op, "c", c));
  const int r = a.rank();
  if (r < 2 || r > 4 || b.rank() != r || c.rank() != r)
    return Status::Invalid(std::string(op) + ": a, b, c must have the same rank, 2 to 4; got " +
                           a.describe() + ", " + b.describe() + ", " + c.describe());
  bool ok = a.dim(-1) == b.dim(-2) && c.dim(-2) == a.dim(-2) && c.dim(-1) == b.dim(-1);
  for (int i = 0; i < r - 2; ++i) ok = ok && a.dim(i) == b.dim(i) && a.dim(i) == c.dim(i);
  if (!ok)
    return Status::Invalid(std::string(op) + ": shapes do not chain: a " + a.describe() + " · b " +
                           b.describe() + " -> c " + c.describe());
  if (c.dtype() != DType::f32)
    return Status::Invalid(std::string(op) + ": c must be f32, got " + c.describe());
  return Status::Ok();
}

Status check_layer_norm_shapes(const char* op, const Tensor& x, const Tensor& gamma,
                               const Tensor& beta, float eps, const Tensor& y) {
  TSR_RETURN_IF_ERROR(check_same_shape(op, x, y));
  TSR_RETURN_IF_ERROR(need_float(op, "gamma", gamma));
  TSR_RETURN_IF_ERROR(need_float(op, "beta", beta));
  const int64_t C = x.rank() ? x.dim(-1) : 0;
  if (x.rank() < 1 || C == 0)
    return Status::Invalid(std::string(op) + ": x must have a non-empty last axis, got " +
                           x.describe());
  if (gamma.rank() != 1 || gamma.dim(0) != C || beta.rank() != 1 || beta.dim(0) != C)
    return Status::Invalid(std::string(op) + ": gamma " + gamma.describe() + " and beta " +
                           beta.describe() + " should be (" + std::to_string(C) + ")");
  if (!(eps > 0.f))
    return Status::Invalid(std::string(op) + ": eps must be > 0 (a constant row would divide by "
                           "zero), got " + std::to_string(eps));
  return Status::Ok();
}

Status check_embedding(const char* op, const Tensor& table, const Tensor& ids, const Tensor& y) {
  TSR_RETURN_IF_ERROR(need_float(op, "table", table));
  TSR_RETURN_IF_ERROR(need_defined(op, "ids", ids));
  TSR_RETURN_IF_ERROR(need_defined(op, "y", y));
  if (table.rank() != 2)
    return Status::Invalid(std::string(op) + ": table must be (V, C), got " + table.describe());
  if (ids.dtype() != DType::i32)
    return Status::Invalid(std::string(op) + ": ids must be i32, got " + ids.describe());
  if (y.numel() != ids.numel() * table.dim(1) || y.rank() < 1 || y.dim(-1) != table.dim(1))
    return Status::Invalid(std::string(op) + ": output " + y.describe() + " should be ids " +
                           ids.shape().str() + " x " + std::to_string(table.dim(1)));
  if (!y.is_contiguous() || y.dtype() != DType::f32)
    return Status::Invalid(std::string(op) + ": output must be contiguous f32, got " + y.describe());
  return Status::Ok();
}

Status check_add_shapes(const char* op, const Tensor& a, const Tensor& b, const Tensor& y) {
  TSR_RETURN_IF_ERROR(check_same_shape(op, a, y));
  TSR_RETURN_IF_ERROR(need_float(op, "b", b));
  bool suffix = b.rank() <= a.rank();
  for (int i = 1; suffix && i <= b.rank(); ++i) suffix = b.dim(-i) == a.dim(-i);
  if (!suffix)
    return Status::Invalid(std::string(op) + ": b " + b.describe() +
                           " must have a's shape or a suffix of it; a is " + a.describe());
  return Status::Ok();
}

Status check_dropout(const char* op, const Tensor& x, const DropoutMask& mask, const Tensor& y, bool allow_f64) {
  TSR_RETURN_IF_ERROR(need_defined(op, "x", x));
  TSR_RETURN_IF_ERROR(need_defined(op, "y", y));
  const bool f64 = allow_f64 && x.dtype() == DType::f64;
  if (!(x.dtype() == DType::f32 || f64) || y.dtype() != x.dtype())
    return Status::Invalid(std::string(op) + ": x and y must be f32" + (allow_f64 ? " or f64" : "") + ", got " +
                           x.describe() + " and " + y.describe());
  if (x.shape() != y.shape())
    return Status::Invalid(std::string(op) + ": output " + y.describe() + " does not match input " + x.describe());
  if (!(mask.p >= 0.f && mask.p < 1.f))
    return Status::Invalid(std::string(op) + ": the drop probability must be in [0, 1), got " +
                           std::to_string(mask.p));
  return Status::Ok();
}

Status check_split_heads(const char* op, const Tensor& x, int64_t n_heads, const Tensor& y) {
  TSR_RETURN_IF_ERROR(need_float(op, "x", x));
  TSR_RETURN_IF_ERROR(need_defined(op, "y", y));
  if (x.rank() != 3 || n_heads <= 0 || x.dim(2) % n_heads != 0)
    return Status::Invalid(std::string(op) + ": x must be (B, T, H*D) with H = " +
                           std::to_string(n_heads) + " dividing the last axis; got " + x.describe());
  const int64_t D = x.dim(2) / n_heads;
  if (y.rank() != 4 || y.dim(0) != x.dim(0) || y.dim(1) != n_heads || y.dim(2) != x.dim(1) ||
      y.dim(3) != D)
    return Status::Invalid(std::string(op) + ": output " + y.describe() + " should be (" +
                           std::to_string(x.dim(0)) + ", " + std::to_string(n_heads) + ", " +
                           std::to_string(x.dim(1)) + ", " + std::to_string(D) + ")");
  return Status::Ok();
}

Status check_merge_heads(const char* op, const Tensor& x, const Tensor& y) {
  TSR_RETURN_IF_ERROR(need_float(op, "x", x));
  TSR_RETURN_IF_ERROR(need_defined(op, "y", y));
  if (x.rank() != 4)
    return Status::Invalid(std::string(op) + ": x must be (B, H, T, D), got " + x.describe());
  if (y.rank() != 3 || y.dim(0) != x.dim(0) || y.dim(1) != x.dim(2) ||
      y.dim(2) != x.dim(1) * x.dim(3))
    return Status::Invalid(std::string(op) + ": output " + y.describe() + " should be (" +
                           std::to_string(x.dim(0)) + ", " + std::to_string(x.dim(2)) + ", " +
                           std::to_string(x.dim(1) * x.dim(3)) + ")");
  return Status::Ok();
}

namespace {
// sgemm reads (and writes) rows of a (B, H, rows, d) view: unit stride along d, rows that do not
// overlap.
Status need_rows(const char* op, const char* name, const Tensor& t) {
  if ((t.dim(3) > 1 && t.stride(3) != 1) || (t.dim(2) > 1 && t.stride(2) < t.dim(3)))
    return Status::Invalid(std::string(op) + ": " + name + " " + t.describe() +
                           " needs unit stride along its last axis and rows that do not overlap");
  return Status::Ok();
}

// What every attention op asks of q, k, v and out, all of dtype dt: (B, H, rows, d) views whose
// rows sgemm can read, k and v matching q, out (B, H, T, dv), the causal and key-range rules.
Status check_attention_as(const char* op, DType dt, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, bool causal, const int32_t* key_lo, const int32_t* key_hi) {
  const std::pair<const char*, const Tensor*> all[] = {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}};
  for (const auto& [name, t] : all) {
    TSR_RETURN_IF_ERROR(need_defined(op, name, *t));
    if (t->dtype() != dt)
      return Status::Invalid(std::string(op) + ": " + name + " must be " + dtype_name(dt) + ", got " +
                             t->describe());
    if (t->rank() != 4)
      return Status::Invalid(std::string(op) + ": " + name + " must be (B, H, rows, d), got " + t->describe());
    TSR_RETURN_IF_ERROR(need_rows(op, name, *t));
  }
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), S = k.dim(2);
  if (k.dim(0) != B || k.dim(1) != H || k.dim(3) != q.dim(3))
    return Status::Invalid(std::string(op) + ": k " + k.describe() + " should be " +
                           shape_text({B, H, S, q.dim(3)}) + " for q " + q.describe());
  if (v.dim(0) != B || v.dim(1) != H || v.dim(2) != S)
    return Status::Invalid(std::string(op) + ": v " + v.describe() + " should be " +
                           shape_text({B, H, S, v.dim(3)}) + " for k " + k.describe());
  if (out.dim(0) != B || out.dim(1) != H || out.dim(2) != T || out.dim(3) != v.dim(3))
    return Status::Invalid(std::string(op) + ": out " + out.describe() + " should be " +
                           shape_text({B, H, T, v.dim(3)}));
  if (causal && S < T)
    return Status::Invalid(std::string(op) + ": causal attention needs at least as many keys as queries, got " +
                           std::to_string(S) + " keys for " + std::to_string(T) + " queries");
  if ((key_lo == nullptr) != (key_hi == nullptr))
    return Status::Invalid(std::string(op) + ": key ranges need both key_lo and key_hi, or neither");
  return Status::Ok();
}

// The training ops' element type: f64 where the reference loops are given f64, else f32.
DType attention_dtype(const Tensor& q, bool allow_f64) {
  return allow_f64 && q.defined() && q.dtype() == DType::f64 ? DType::f64 : DType::f32;
}
}  // namespace

Status check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                       bool causal, const int32_t* key_lo, const int32_t* key_hi) {
  return check_attention_as(op, DType::f32, q, k, v, out, causal, key_lo, key_hi);
}

Status check_attention_train(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, bool causal, const int32_t* key_lo,
                             const int32_t* key_hi, bool allow_f64) {
  const DType dt = attention_dtype(q, allow_f64);
  TSR_RETURN_IF_ERROR(check_attention_as(op, dt, q, k, v, out, causal, key_lo, key_hi));
  TSR_RETURN_IF_ERROR(need_defined(op, "lse", lse));
  if (lse.dtype() != dt)
    return Status::Invalid(std::string(op) + ": lse must be " + dtype_name(dt) + ", got " + lse.describe());
  if (lse.rank() != 3 || lse.dim(0) != q.dim(0) || lse.dim(1) != q.dim(1) || lse.dim(2) != q.dim(2))
    return Status::Invalid(std::string(op) + ": lse " + lse.describe() + " should be " +
                           shape_text({q.dim(0), q.dim(1), q.dim(2)}) + " for q " + q.describe());
  return Status::Ok();
}

Status check_attention_backward(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                const Tensor& dk, const Tensor& dv, bool causal, const int32_t* key_lo,
                                const int32_t* key_hi, bool allow_f64) {
  TSR_RETURN_IF_ERROR(check_attention_train(op, q, k, v, out, lse, causal, key_lo, key_hi, allow_f64));
  const DType dt = q.dtype();
  // Each gradient has its forward twin's shape and, like it, rows sgemm can read or write.
  const std::tuple<const char*, const Tensor*, const Tensor*> grads[] = {
      {"dout", &dout, &out}, {"dq", &dq, &q}, {"dk", &dk, &k}, {"dv", &dv, &v}};
  for (const auto& [name, g, like] : grads) {
    TSR_RETURN_IF_ERROR(need_defined(op, name, *g));
    if (g->dtype() != dt)
      return Status::Invalid(std::string(op) + ": " + name + " must be " + dtype_name(dt) + ", got " +
                             g->describe());
    if (g->shape() != like->shape())
      return Status::Invalid(std::string(op) + ": " + name + " " + g->describe() + " should be " +
                             like->shape().str());
    TSR_RETURN_IF_ERROR(need_rows(op, name, *g));
  }
  return Status::Ok();
}

Status bad_id(const char* op, int64_t position, int64_t id, int64_t vocab) {
  return Status::OutOfRange(std::string(op) + ": token id " + std::to_string(id) + " at position " +
                            std::to_string(position) + " is outside the vocabulary [0, " +
                            std::to_string(vocab) + ") (check the tokenizer's vocabulary against "
                            "the model's stem.vocab_size)");
}

// ---------------------------------------------------------------------------------------------
// The training ops

namespace {
std::string dims(std::initializer_list<int64_t> d) {
  std::string s = "(";
  for (int64_t x : d) s += (s.size() > 1 ? ", " : "") + std::to_string(x);
  return s + ")";
}
Status shape_is(const char* op, const char* name, const Tensor& t, std::initializer_list<int64_t> want) {
  if (t.shape() != Shape(want))
    return Status::Invalid(std::string(op) + ": " + name + " " + t.describe() + " should be " + dims(want));
  return Status::Ok();
}
// Per-row statistics (mean, rstd) of x (..., C): contiguous, (rows) or x's shape without C.
Status check_row_stats(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  const int64_t R = x.numel() / x.dim(-1);
  const Shape lead(std::vector<int64_t>(x.shape().begin(), x.shape().end() - 1));
  if (!t.is_contiguous() || (t.shape() != Shape{R} && t.shape() != lead))
    return Status::Invalid(std::string(op) + ": " + name + " " + t.describe() + " should be contiguous (" +
                           std::to_string(R) + "), one value per row of x " + x.describe());
  return Status::Ok();
}
// x (..., C) with C >= 1; returns C through *C.
Status check_rows(const char* op, const Tensor& x, int64_t* C) {
  if (x.rank() < 1 || x.dim(-1) == 0)
    return Status::Invalid(std::string(op) + ": x must have a non-empty last axis, got " + x.describe());
  *C = x.dim(-1);
  return Status::Ok();
}
}  // namespace

Status check_training_dtypes(const char* op, std::initializer_list<NamedTensor> ts, bool f64_ok) {
  const NamedTensor* first = nullptr;
  for (const NamedTensor& t : ts) {
    if (!t.second) continue;
    TSR_RETURN_IF_ERROR(need_defined(op, t.first, *t.second));
    const DType d = t.second->dtype();
    if (d != DType::f32 && !(f64_ok && d == DType::f64))
      return Status::Invalid(std::string(op) + ": " + t.first + " must be " +
                             (f64_ok ? "f32 or f64" : "f32") + ", got " + t.second->describe() +
                             (d == DType::f64 ? " (f64 is for the reference loops, tessera::ref)" : ""));
    if (!first) {
      first = &t;
    } else if (d != first->second->dtype()) {
      return Status::Invalid(std::string(op) + ": " + t.first + " is " + t.second->describe() + " but " +
                             first->first + " is " + first->second->describe() +
                             ": every tensor of one call must be f32, or every one f64");
    }
  }
  return Status::Ok();
}

Status check_elementwise_training(const char* op, std::initializer_list<NamedTensor> ts, bool f64_ok) {
  TSR_RETURN_IF_ERROR(check_training_dtypes(op, ts, f64_ok));
  const NamedTensor& first = *ts.begin();
  if (first.second->rank() < 1)
    return Status::Invalid(std::string(op) + ": " + first.first + " needs rank >= 1, got a scalar");
  for (const NamedTensor& t : ts)
    if (t.second->shape() != first.second->shape())
      return Status::Invalid(std::string(op) + ": " + t.first + " " + t.second->describe() +
                             " does not match " + first.first + " " + first.second->describe());
  return Status::Ok();
}

namespace {
// The compute dtype of a training linear, and x's and w's dtypes under it: with bf16 compute x and
// w are each f32 or bf16 (w a step's rounded copy, x a layer's: ops::to_bf16), and the other
// tensors f32 (checked with them).
Status check_linear_compute(const char* op, const Tensor& x, const Tensor& w, DType compute) {
  if (compute == DType::f32) return Status::Ok();
  if (compute != DType::bf16)
    return Status::Invalid(std::string(op) + ": compute must be f32 or bf16, got " + dtype_name(compute));
  for (const NamedTensor& t : {NamedTensor{"x", &x}, NamedTensor{"w", &w}}) {
    TSR_RETURN_IF_ERROR(need_defined(op, t.first, *t.second));
    if (t.second->dtype() != DType::f32 && t.second->dtype() != DType::bf16)
      return Status::Invalid(std::string(op) + ": " + t.first + " must be f32 or bf16 for bf16 compute, got " +
                             t.second->describe());
  }
  return Status::Ok();
}
}  // namespace

Status check_linear_plain(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                          bool f64_ok, DType compute) {
  TSR_RETURN_IF_ERROR(check_linear_compute(op, x, w, compute));
  const bool mixed = compute == DType::bf16;
  TSR_RETURN_IF_ERROR(check_training_dtypes(
      op, {{"x", mixed ? nullptr : &x}, {"w", mixed ? nullptr : &w}, {"b", b.defined() ? &b : nullptr}, {"y", &y}},
      f64_ok && !mixed));
  if (x.rank() != 2 || w.rank() != 2)
    return Status::Invalid(std::string(op) + ": x must be (M, K) and w (K, N); got x " + x.describe() +
                           ", w " + w.describe());
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  if (w.dim(0) != K)
    return Status::Invalid(std::string(op) + ": x " + x.describe() + " has K = " + std::to_string(K) +
                           " but w " + w.describe() + " has K = " + std::to_string(w.dim(0)));
  if (b.defined()) TSR_RETURN_IF_ERROR(shape_is(op, "b", b, {N}));
  return shape_is(op, "y", y, {M, N});
}

Status check_linear_backward(const char* op, const Tensor& x, const Tensor& w, const Tensor& dy,
                             const Tensor* dx, const Tensor* dw, const Tensor* db, bool f64_ok, DType compute) {
  TSR_RETURN_IF_ERROR(check_linear_compute(op, x, w, compute));
  const bool mixed = compute == DType::bf16;
  TSR_RETURN_IF_ERROR(check_training_dtypes(
      op, {{"x", mixed ? nullptr : &x}, {"w", mixed ? nullptr : &w}, {"dy", &dy}, {"dx", dx}, {"dw", dw}, {"db", db}},
      f64_ok && !mixed));
  if (x.rank() != 2 || w.rank() != 2)
    return Status::Invalid(std::string(op) + ": x must be (M, K) and w (K, N); got x " + x.describe() +
                           ", w " + w.describe());
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  if (w.dim(0) != K)
    return Status::Invalid(std::string(op) + ": x " + x.describe() + " has K = " + std::to_string(K) +
                           " but w " + w.describe() + " has K = " + std::to_string(w.dim(0)));
  TSR_RETURN_IF_ERROR(shape_is(op, "dy", dy, {M, N}));
  if (dx) TSR_RETURN_IF_ERROR(shape_is(op, "dx", *dx, {M, K}));
  if (dw) TSR_RETURN_IF_ERROR(shape_is(op, "dw", *dw, {K, N}));
  if (db) TSR_RETURN_IF_ERROR(shape_is(op, "db", *db, {N}));
  return Status::Ok();
}

Status check_to_bf16(const char* op, const Tensor& x, const Tensor& y) {
  TSR_RETURN_IF_ERROR(need_defined(op, "x", x));
  TSR_RETURN_IF_ERROR(need_defined(op, "y", y));
  if (x.dtype() != DType::f32 || y.dtype() != DType::bf16)
    return Status::Invalid(std::string(op) + ": x must be f32 and y bf16, got x " + x.describe() + ", y " +
                           y.describe());
  if (x.shape() != y.shape())
    return Status::Invalid(std::string(op) + ": y " + y.describe() + " does not match x " + x.describe());
  return Status::Ok();
}

Status check_activation_backward(const char* op, Activation act, const Tensor& x, const Tensor& dy,
                                 const Tensor& dx, bool f64_ok) {
  if (act != Activation::none && act != Activation::relu && act != Activation::gelu_erf &&
      act != Activation::gelu_tanh)
    return Status::Invalid(std::string(op) + ": unknown activation " + std::to_string(static_cast<int>(act)));
  return check_elementwise_training(op, {{"x", &x}, {"dy", &dy}, {"dx", &dx}}, f64_ok);
}

Status check_layer_norm_train(const char* op, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              float eps, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                              bool f64_ok) {
  TSR_RETURN_IF_ERROR(check_training_dtypes(
      op, {{"x", &x}, {"gamma", &gamma}, {"beta", &beta}, {"y", &y}, {"mean", &mean}, {"rstd", &rstd}},
      f64_ok));
  int64_t C = 0;
  TSR_RETURN_IF_ERROR(check_rows(op, x, &C));
  if (y.shape() != x.shape())
    return Status::Invalid(std::string(op) + ": output " + y.describe() + " does not match input " +
                           x.describe());
  if (gamma.shape() != Shape{C} || beta.shape() != Shape{C})
    return Status::Invalid(std::string(op) + ": gamma " + gamma.describe() + " and beta " + beta.describe() +
                           " should be (" + std::to_string(C) + ")");
  if (!(eps > 0.f))
    return Status::Invalid(std::string(op) + ": eps must be > 0 (a constant row would divide by zero), got " +
                           std::to_string(eps));
  TSR_RETURN_IF_ERROR(check_row_stats(op, "mean", mean, x));
  return check_row_stats(op, "rstd", rstd, x);
}

Status check_layer_norm_backward(const char* op, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& dy, const Tensor* dx, const Tensor* dgamma,
                                 const Tensor* dbeta, bool f64_ok) {
  TSR_RETURN_IF_ERROR(check_training_dtypes(op,
                                            {{"x", &x},
                                             {"gamma", &gamma},
                                             {"mean", &mean},
                                             {"rstd", &rstd},
                                             {"dy", &dy},
                                             {"dx", dx},
                                             {"dgamma", dgamma},
                                             {"dbeta", dbeta}},
                                            f64_ok));
  int64_t C = 0;
  TSR_RETURN_IF_ERROR(check_rows(op, x, &C));
  TSR_RETURN_IF_ERROR(shape_is(op, "gamma", gamma, {C}));
  TSR_RETURN_IF_ERROR(check_row_stats(op, "mean", mean, x));
  TSR_RETURN_IF_ERROR(check_row_stats(op, "rstd", rstd, x));
  for (const auto& [name, t] : {NamedTensor{"dy", &dy}, NamedTensor{"dx", dx}})
    if (t && t->shape() != x.shape())
      return Status::Invalid(std::string(op) + ": " + name + " " + t->describe() + " does not match x " +
                             x.describe());
  if (dgamma) TSR_RETURN_IF_ERROR(shape_is(op, "dgamma", *dgamma, {C}));
  if (dbeta) TSR_RETURN_IF_ERROR(shape_is(op, "dbeta", *dbeta, {C}));
  return Status::Ok();
}

Status check_embedding_backward(const char* op, const Tensor& ids, const Tensor& dy, const Tensor& dtable,
                                bool f64_ok) {
  TSR_RETURN_IF_ERROR(need_defined(op, "ids", ids));
  if (ids.dtype() != DType::i32)
    return Status::Invalid(std::string(op) + ": ids must be i32, got " + ids.describe());
  TSR_RETURN_IF_ERROR(check_training_dtypes(op, {{"dy", &dy}, {"dtable", &dtable}}, f64_ok));
  if (dtable.rank() != 2)
    return Status::Invalid(std::string(op) + ": dtable must be (V, C), got " + dtable.describe());
  const int64_t C = dtable.dim(1);
  if (dy.rank() < 1 || dy.dim(-1) != C || dy.numel() != ids.numel() * C)
    return Status::Invalid(std::string(op) + ": dy " + dy.describe() + " should be ids " + ids.shape().str() +
                           " x " + std::to_string(C) + " for dtable " + dtable.describe());
  return Status::Ok();
}

Status check_cross_entropy(const char* op, const Tensor& logits, const Tensor& targets, float label_smoothing,
                           const Tensor* dlogits, bool f64_ok) {
  TSR_RETURN_IF_ERROR(check_training_dtypes(op, {{"logits", &logits}, {"dlogits", dlogits}}, f64_ok));
  if (logits.rank() != 2 || logits.dim(1) == 0)
    return Status::Invalid(std::string(op) + ": logits must be (N, V) with V >= 1, got " + logits.describe());
  const int64_t N = logits.dim(0), V = logits.dim(1);
  TSR_RETURN_IF_ERROR(need_defined(op, "targets", targets));
  if (targets.dtype() != DType::i32 || targets.shape() != Shape{N})
    return Status::Invalid(std::string(op) + ": targets should be i32 (" + std::to_string(N) +
                           ") for logits " + logits.describe() + ", got " + targets.describe());
  if (dlogits) TSR_RETURN_IF_ERROR(shape_is(op, "dlogits", *dlogits, {N, V}));
  if (!(label_smoothing >= 0.f && label_smoothing < 1.f))
    return Status::Invalid(std::string(op) + ": label_smoothing must be in [0, 1), got " +
                           std::to_string(label_smoothing));
  const Tensor tc = targets.contiguous();
  const int32_t* t = tc.data<int32_t>();
  for (int64_t i = 0; i < N; ++i)
    if (t[i] < -1 || t[i] >= V)
      return Status::OutOfRange(std::string(op) + ": target " + std::to_string(t[i]) + " at row " +
                                std::to_string(i) + " is outside [-1, " + std::to_string(V) + ") (" +
                                std::to_string(V) + " classes; -1 marks a row without loss)");
  return Status::Ok();
}

}  // namespace tessera::detail
