// Multi-head scaled dot-product attention: the only layer that mixes information across rows.
// Q, K and V come from one fused matmul; heads are strided views of that buffer, so splitting
// and merging heads costs no copy. The fast path runs ops::attention, the fused tiled kernel that
// never stores the (T, T) scores; attention weights a caller asks for are recomputed, for the
// chosen heads only. The materialised path — scores, mask, softmax, weighted sum, each step a
// tensor — is the reference, and serves what the fused kernel does not take (relative positions,
// a layout whose usable keys are not one run of rows).
#include <cmath>
#include <algorithm>
#include <limits>
#include <vector>

#include "arena.h"
#include "layers.h"

namespace tessera::model {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// (B, H, T, D) view of the columns [col0, col0 + H·D) of a (B·T, N) buffer.
Tensor head_view(const Tensor& buf, int64_t B, int64_t T, int64_t col0, int64_t H, int64_t D) {
  const int64_t N = buf.dim(1);
  return buf.reshape({B, T, N}).slice(2, col0, col0 + H * D).unflatten(2, H, D).transpose(1, 2);
}

// Copies the new rows' keys k (B, H, T, dk) and values v (B, H, T, dv) behind each sequence's
// cached rows; padding rows are not cached.
void append_to_cache(const Tensor& k, const Tensor& v, const RowLayout& rows, const CacheView& kv) {
  const int64_t B = k.dim(0), H = k.dim(1), T = k.dim(2), dk = k.dim(3), dv = v.dim(3), cap = kv.capacity;
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      if (rows.seg[static_cast<size_t>(b * T + t)] < 0) continue;
      const int64_t at = (*kv.past)[static_cast<size_t>(b)] + t;
      for (int64_t h = 0; h < H; ++h) {
        const float* ks = kp + b * k.stride(0) + h * k.stride(1) + t * k.stride(2);
        const float* vs = vp + b * v.stride(0) + h * v.stride(1) + t * v.stride(2);
        float* kd = kv.k + ((b * H + h) * cap + at) * dk;
        float* vd = kv.v + ((b * H + h) * cap + at) * dv;
        for (int64_t d = 0; d < dk; ++d) kd[d] = ks[d * k.stride(3)];
        for (int64_t d = 0; d < dv; ++d) vd[d] = vs[d * v.stride(3)];
      }
    }
}

// The attention of new rows that continue cached sequences: row i of batch row b (position
// past[b] + i) reads the cached rows and the new rows up to its own, all of them in the cache by
// now (causal). Plain loops on both paths: one query row against one head's contiguous cached
// keys is a matrix-vector product, a decode step's cost is in the weights rather than here, and
// oneDNN would want a new primitive for every cache length. Writes the heads into concat
// (B, T, H·dv); padding rows get zeros.
void attend_cached(const AttentionLayer& L, const Tensor& q, const RowLayout& rows, const CacheView& kv,
                   Tensor& concat) {
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), dk = L.d_k, dv = L.d_v, cap = kv.capacity;
  const float* qp = q.data<float>();
  const int64_t qb = q.stride(0), qh = q.stride(1), qt = q.stride(2), qd = q.stride(3);
  float* out = concat.data<float>();
  const bool relative = L.positions.kind == PositionKind::relative;
  const int64_t kmax = L.positions.max_distance, R = 2 * kmax + 1;
  const float* ak = relative ? L.rel_k.data<float>() : nullptr;  // (2k+1, dk)
  const float* av = relative ? L.rel_v.data<float>() : nullptr;  // (2k+1, dv)
#pragma omp parallel for collapse(2) schedule(static) if (B * H * T * cap * (dk + dv) > 32768)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t past = (*kv.past)[static_cast<size_t>(b)];
      const float* K = kv.k + (b * H + h) * cap * dk;
      const float* V = kv.v + (b * H + h) * cap * dv;
      std::vector<float> w(static_cast<size_t>(past + T)), qi(static_cast<size_t>(dk));
      std::vector<float> qa(relative ? static_cast<size_t>(R) : 0), wr(relative ? static_cast<size_t>(R) : 0);
      for (int64_t i = 0; i < T; ++i) {
        float* o = out + (b * T + i) * H * dv + h * dv;
        std::fill(o, o + dv, 0.f);
        if (rows.seg[static_cast<size_t>(b * T + i)] < 0) continue;
        for (int64_t d = 0; d < dk; ++d) qi[static_cast<size_t>(d)] = qp[b * qb + h * qh + i * qt + d * qd];
        const int64_t n = past + i + 1, pos_i = rows.position(b, i);
        if (relative)  // Shaw et al.: q_i · a^K_r for every clipped offset r
          for (int64_t r = 0; r < R; ++r) {
            float acc = 0.f;
            for (int64_t d = 0; d < dk; ++d) acc += qi[static_cast<size_t>(d)] * ak[r * dk + d];
            qa[static_cast<size_t>(r)] = L.scale * acc;
          }
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          const float* kj = K + j * dk;
          float acc = 0.f;
#pragma omp simd reduction(+ : acc)
          for (int64_t d = 0; d < dk; ++d) acc += qi[static_cast<size_t>(d)] * kj[d];
          float sj = L.scale * acc;
          if (relative) sj += qa[static_cast<size_t>(relative_index(pos_i, j, kmax))];
          w[static_cast<size_t>(j)] = sj;
          mx = std::max(mx, sj);
        }
        float sum = 0.f;
        for (int64_t j = 0; j < n; ++j) sum += (w[static_cast<size_t>(j)] = std::exp(w[static_cast<size_t>(j)] - mx));
        const float inv = 1.f / sum;
        if (relative) std::fill(wr.begin(), wr.end(), 0.f);
        for (int64_t j = 0; j < n; ++j) {
          const float a = w[static_cast<size_t>(j)] * inv;
          const float* vj = V + j * dv;
#pragma omp simd
          for (int64_t d = 0; d < dv; ++d) o[d] += a * vj[d];
          if (relative) wr[static_cast<size_t>(relative_index(pos_i, j, kmax))] += a;
        }
        if (relative)  // O_i += Σ_j A_ij a^V_{clip(j - i)}
          for (int64_t r = 0; r < R; ++r)
            for (int64_t d = 0; d < dv; ++d) o[d] += wr[static_cast<size_t>(r)] * av[r * dv + d];
      }
    }
}

// 6. Output projection back to d_model, with the residual fused: y = [x +] concat · W_O + b_O.
Status project_out(const AttentionLayer& L, const Exec& ex, const Tensor& concat, const Tensor* residual, Tensor& y,
                   const Capture& cap, const std::string& p) {
  const int64_t B = concat.dim(0), T = concat.dim(1), H = L.n_heads, dv = L.d_v;
  if (!L.out.defined()) {
    if (residual) return Status::Invalid(p + ": a residual needs the output projection W_O");
    y.copy_from(concat);
    return Status::Ok();
  }
  Tensor y2 = y.reshape({B * T, L.out.out_features()});
  if (residual) {
    const Tensor r2 = residual->reshape({B * T, L.out.out_features()});
    TSR_RETURN_IF_ERROR(ex.linear(L.out, concat.reshape({B * T, H * dv}), y2, &r2));
  } else {
    TSR_RETURN_IF_ERROR(ex.linear(L.out, concat.reshape({B * T, H * dv}), y2));
  }
  if (cap.wants(p + ".out") && residual) {
    // The projection alone, for explain: recompute without the residual (captures only).
    Tensor u = Tensor::empty({B * T, L.out.out_features()});
    TSR_RETURN_IF_ERROR(ex.linear(L.out, concat.reshape({B * T, H * dv}), u));
    cap.put(p + ".out", u.reshape({B, T, L.out.out_features()}));
  } else {
    cap.put(p + ".out", y);
  }
  return Status::Ok();
}

// The usable keys of every row as one run [lo, hi) of key rows (before the causal limit): a
// sequence's rows read their own sequence; a padding row reads every real row. False when some
// row's keys are not one run (a sequence's rows not contiguous, or padding between real rows).
bool key_ranges(const RowLayout& rows, std::vector<int32_t>* lo, std::vector<int32_t>* hi) {
  const int64_t B = rows.B, T = rows.T;
  lo->assign(static_cast<size_t>(B * T), 0);
  hi->assign(static_cast<size_t>(B * T), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* seg = rows.seg.data() + b * T;
    int64_t first_real = -1, last_real = -1;
    for (int64_t t = 0; t < T; ++t)
      if (seg[t] >= 0) {
        if (first_real < 0) first_real = t;
        last_real = t;
      }
    for (int64_t t = 0; t < T;) {  // runs of one segment id
      int64_t e = t + 1;
      while (e < T && seg[e] == seg[t]) ++e;
      if (seg[t] >= 0)
        for (int64_t u = e; u < T; ++u)
          if (seg[u] == seg[t]) return false;  // the sequence continues after a gap
      for (int64_t u = t; u < e; ++u) {
        const size_t at = static_cast<size_t>(b * T + u);
        (*lo)[at] = static_cast<int32_t>(seg[t] >= 0 ? t : std::max<int64_t>(first_real, 0));
        (*hi)[at] = static_cast<int32_t>(seg[t] >= 0 ? e : last_real + 1);
      }
      if (seg[t] < 0 && first_real >= 0 && t > first_real && t < last_real) return false;  // padding inside
      t = e;
    }
  }
  return true;
}

// The heads whose scores and weights a caller keeps (Capture::heads), in order.
std::vector<int64_t> kept_heads(const Capture& cap, int64_t H) {
  std::vector<int64_t> hs;
  for (int64_t h : cap.heads())
    if (h >= 0 && h < H) hs.push_back(h);
  if (cap.heads().empty())
    for (int64_t h = 0; h < H; ++h) hs.push_back(h);
  return hs;
}

// x (B, H, ...) -> (B, heads.size(), ...), a copy of the chosen heads.
Tensor pick_heads(const Tensor& x, const std::vector<int64_t>& heads) {
  if (static_cast<int64_t>(heads.size()) == x.dim(1)) {
    bool identity = true;
    for (size_t i = 0; i < heads.size(); ++i) identity = identity && heads[i] == static_cast<int64_t>(i);
    if (identity) return x;
  }
  Shape shape = x.shape();
  shape[1] = static_cast<int64_t>(heads.size());
  Tensor y = Tensor::empty(shape, x.dtype());
  for (size_t i = 0; i < heads.size(); ++i) {
    Tensor dst = y.select(1, static_cast<int64_t>(i));
    dst.copy_from(x.select(1, heads[i]));
  }
  return y;
}

// Steps 2–4 for the heads q and k hold: S = scale · Q Kᵀ (+ relative keys), masked, softmax.
// Captures the scores, the mask and the weights of the heads `keep` (indices into q's heads);
// returns the weights (B, h, T, T) of all of q's heads.
Result<Tensor> attention_weights(const AttentionLayer& L, const Exec& ex, const Tensor& q, const Tensor& k,
                                 const RowLayout& rows, const Capture& cap, const std::string& p,
                                 const std::vector<int64_t>& keep) {
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), dk = L.d_k;
  // 2. Score every pair: S (B, h, T, T) = scale · Q Kᵀ.
  Tensor scores = Tensor::empty({B, H, T, T});
  TSR_RETURN_IF_ERROR(ex.matmul(q, k.transpose(2, 3), scores, L.scale));
  float* s = scores.data<float>();

  // Relative keys (Shaw et al.): S_ij += scale · q_i · a^K_{clip(j - i)}.
  const bool relative = L.positions.kind == PositionKind::relative;
  const int64_t kmax = L.positions.max_distance, R = 2 * kmax + 1;
  if (relative) {
    const float* a = L.rel_k.data<float>();  // (2k+1, dk), f32 contiguous since build
    const float* qp = q.data<float>();
    const int64_t qb = q.stride(0), qh = q.stride(1), qt = q.stride(2);
#pragma omp parallel for collapse(2) schedule(static) if (B * H * T * R * dk > 32768)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<float> qa(static_cast<size_t>(R));
        for (int64_t i = 0; i < T; ++i) {
          const float* qi = qp + b * qb + h * qh + i * qt;
          for (int64_t r = 0; r < R; ++r) {
            float acc = 0.f;
            for (int64_t d = 0; d < dk; ++d) acc += qi[d] * a[r * dk + d];
            qa[r] = L.scale * acc;
          }
          float* srow = s + ((b * H + h) * T + i) * T;
          for (int64_t j = 0; j < T; ++j) srow[j] += qa[relative_index(rows.position(b, i), rows.position(b, j), kmax)];
        }
      }
  }
  if (cap.wants(p + ".scores")) cap.put(p + ".scores", pick_heads(scores, keep));

  // 3. Mask: -inf on every column a row may not use (future columns, padding); softmax turns
  //    them into exact zeros. A row with no allowed column becomes all zeros, not NaN.
  if (cap.wants(p + ".mask")) {
    Tensor mask = Tensor::empty({B, T, T});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j)
          mask.data<float>()[(b * T + i) * T + j] = rows.allowed(b, i, j, L.causal) ? 0.f : kNegInf;
    cap.put(p + ".mask", mask);
  }
  if (L.causal || !rows.plain) {
#pragma omp parallel for collapse(2) schedule(static) if (B * H * T * T > 32768)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i) {
          float* srow = s + ((b * H + h) * T + i) * T;
          for (int64_t j = 0; j < T; ++j)
            if (!rows.allowed(b, i, j, L.causal)) srow[j] = kNegInf;
        }
  }

  // 4. Weights: A = softmax over each row.
  TSR_RETURN_IF_ERROR(ex.softmax(scores, scores));
  if (cap.wants(p + ".weights")) cap.put(p + ".weights", pick_heads(scores, keep));
  return scores;
}

}  // namespace

Status attention_forward(const AttentionLayer& L, const Exec& ex, const Tensor& x, const RowLayout& rows,
                         const Tensor* residual, Tensor& y, const Capture& cap, const std::string& p,
                         const CacheView* kv) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  const int64_t H = L.n_heads, dk = L.d_k, dv = L.d_v;
  const int32_t* positions = rows.plain ? nullptr : rows.pos.data();

  // 1. Project: [Q | K | V] (B·T, H·(2dk + dv)) = x · [W_Q | W_K | W_V] + b.
  Tensor qkv = Arena::get(ArenaSlot::qkv, {B * T, L.qkv.out_features()});
  TSR_RETURN_IF_ERROR(ex.linear(L.qkv, x.reshape({B * T, C}), qkv));
  Tensor q = head_view(qkv, B, T, 0, H, dk);           // (B, H, T, dk)
  Tensor k = head_view(qkv, B, T, H * dk, H, dk);      // (B, H, T, dk)
  Tensor v = head_view(qkv, B, T, 2 * H * dk, H, dv);  // (B, H, T, dv)

  if (L.positions.kind == PositionKind::rotary) {
    apply_rotary(q, L.positions.rotary_dims, L.positions.base, L.positions.rotary_style, 0, positions);
    apply_rotary(k, L.positions.rotary_dims, L.positions.base, L.positions.rotary_style, 0, positions);
  }
  cap.put(p + ".q", q);
  cap.put(p + ".k", k);
  cap.put(p + ".v", v);
  if (kv) {
    append_to_cache(k, v, rows, *kv);
    if (kv->any_past()) {  // without cached rows, the new rows alone are the whole story: go on below
      Tensor concat = Arena::get(ArenaSlot::concat, {B, T, H * dv});
      attend_cached(L, q, rows, *kv, concat);
      cap.put(p + ".heads", concat.unflatten(2, H, dv).transpose(1, 2));
      cap.put(p + ".concat", concat);
      return project_out(L, ex, concat, residual, y, cap, p);
    }
  }

  // 5. The weighted sum of values, written straight into the concatenation: O_h = A_h V_h.
  Tensor concat = Arena::get(ArenaSlot::concat, {B, T, H * dv});
  Tensor heads = concat.unflatten(2, H, dv).transpose(1, 2);  // (B, H, T, dv) view
  const bool relative = L.positions.kind == PositionKind::relative;
  const bool wants_weights = cap.wants(p + ".scores") || cap.wants(p + ".mask") || cap.wants(p + ".weights");
  std::vector<int32_t> lo, hi;
  if (!ex.reference && !relative && (rows.plain || key_ranges(rows, &lo, &hi))) {
    // Fused: no (T, T) tensor; weights, if asked for, recomputed for the kept heads only.
    TSR_RETURN_IF_ERROR(ops::attention(q, k, v, heads, L.scale, L.causal, lo.empty() ? nullptr : lo.data(),
                                       hi.empty() ? nullptr : hi.data()));
    if (wants_weights) {
      const std::vector<int64_t> hs = kept_heads(cap, H);
      std::vector<int64_t> all(hs.size());
      for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
      const Result<Tensor> w = attention_weights(L, ex, pick_heads(q, hs), pick_heads(k, hs), rows, cap, p, all);
      if (!w.ok()) return w.status();
    }
  } else {
    // Materialised: every head's weights, of which the caller keeps the heads it chose.
    Result<Tensor> w = attention_weights(L, ex, q, k, rows, cap, p, kept_heads(cap, H));
    if (!w.ok()) return w.status();
    const Tensor& scores = *w;
    TSR_RETURN_IF_ERROR(ex.matmul(scores, v, heads));
    if (relative) {  // O_i += Σ_j A_ij a^V_{clip(j - i)}
      const int64_t kmax = L.positions.max_distance, R = 2 * kmax + 1;
      const float* a = L.rel_v.data<float>();  // (2k+1, dv)
      const float* s = scores.data<float>();
      float* hp = heads.data<float>();
      const int64_t hb = heads.stride(0), hh = heads.stride(1), ht = heads.stride(2);
#pragma omp parallel for collapse(2) schedule(static) if (B * H * T * R * dv > 32768)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
          std::vector<float> wr(static_cast<size_t>(R));
          for (int64_t i = 0; i < T; ++i) {
            std::fill(wr.begin(), wr.end(), 0.f);
            const float* arow = s + ((b * H + h) * T + i) * T;
            for (int64_t j = 0; j < T; ++j) wr[relative_index(rows.position(b, i), rows.position(b, j), kmax)] += arow[j];
            float* oi = hp + b * hb + h * hh + i * ht;
            for (int64_t r = 0; r < R; ++r)
              for (int64_t d = 0; d < dv; ++d) oi[d] += wr[r] * a[r * dv + d];
          }
        }
    }
  }
  cap.put(p + ".heads", heads);
  cap.put(p + ".concat", concat);
  return project_out(L, ex, concat, residual, y, cap, p);
}

// ---------------------------------------------------------------------------------------------
// Training

namespace {

// Adds the columns [c0, c0 + n) of src (rows, N) (or entries of a vector) to dst (rows, n).
void add_columns(const Tensor& src, int64_t c0, Tensor& dst) {
  const bool vec = src.rank() == 1;
  const int64_t R = vec ? 1 : src.dim(0), N = src.dim(-1), n = dst.dim(-1);
  const float* s = src.data<float>();
  float* d = dst.data<float>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < n; ++j) d[r * n + j] += s[r * N + c0 + j];
}

// Element (b, h, t, d) of a (B, H, T, D) strided view.
inline float& at4(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t d) {
  return const_cast<float*>(t.data<float>())[b * t.stride(0) + h * t.stride(1) + i * t.stride(2) + d * t.stride(3)];
}

// Shaw et al.'s attention, materialised (as at inference: the fused kernel takes no relative
// positions): S_ij = scale · q_i · (k_j + a^K_r), r = clip(p_j - p_i); masked; P = softmax(S);
// O_i = Σ_j P_ij M_ij (v_j + a^V_r), M attention dropout's mask (1 without). Keeps P (B, H, T, T),
// undropped, for the backward.
void relative_forward(const AttentionLayer& L, const AttentionParams& w, const Tensor& q, const Tensor& k,
                      const Tensor& v, const RowLayout& rows, Tensor& P, Tensor& heads, const DropoutMask& drop) {
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), dk = L.d_k, dv = L.d_v, kmax = L.positions.max_distance;
  const float* ak = w.rel_k.data<float>();
  const float* av = w.rel_v.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        float* p = P.data<float>() + ((b * H + h) * T + i) * T;
        float mx = kNegInf;
        for (int64_t j = 0; j < T; ++j) {
          if (!rows.allowed(b, i, j, L.causal)) {
            p[j] = kNegInf;
            continue;
          }
          const float* a = ak + relative_index(rows.position(b, i), rows.position(b, j), kmax) * dk;
          float acc = 0.f;
          for (int64_t d = 0; d < dk; ++d) acc += at4(q, b, h, i, d) * (at4(k, b, h, j, d) + a[d]);
          p[j] = L.scale * acc;
          mx = std::max(mx, p[j]);
        }
        float sum = 0.f;
        for (int64_t j = 0; j < T; ++j) sum += (p[j] = mx == kNegInf ? 0.f : std::exp(p[j] - mx));
        for (int64_t j = 0; j < T; ++j) p[j] = sum > 0 ? p[j] / sum : 0.f;
        for (int64_t d = 0; d < dv; ++d) at4(heads, b, h, i, d) = 0.f;
        const uint64_t row = static_cast<uint64_t>(((b * H + h) * T + i) * T);
        for (int64_t j = 0; j < T; ++j) {
          if (p[j] == 0.f) continue;
          const float pj = drop.active() ? p[j] * drop.factor(row + static_cast<uint64_t>(j)) : p[j];
          const float* a = av + relative_index(rows.position(b, i), rows.position(b, j), kmax) * dv;
          for (int64_t d = 0; d < dv; ++d) at4(heads, b, h, i, d) += pj * (at4(v, b, h, j, d) + a[d]);
        }
      }
}

// Its backward: dV_j = Σ_i P_ij M_ij dO_i; dP_ij = M_ij dO_i · (v_j + a^V_r); dS = P ⊙ (dP - Σ_j P_ij dP_ij);
// dQ_i = scale Σ_j dS_ij (k_j + a^K_r); dK_j = scale Σ_i dS_ij q_i; da^K_r, da^V_r collect the
// pairs at offset r. Written per (batch row, head); the tables' gradients summed after.
void relative_backward(const AttentionLayer& L, const AttentionParams& w, const Tensor& q, const Tensor& k,
                       const Tensor& v, const RowLayout& rows, const Tensor& P, const Tensor& dO, Tensor& dq,
                       Tensor& dk, Tensor& dv, Tensor* g_ak, Tensor* g_av, const DropoutMask& drop) {
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), Dk = L.d_k, Dv = L.d_v, kmax = L.positions.max_distance;
  const int64_t R = 2 * kmax + 1;
  const float* ak = w.rel_k.data<float>();
  const float* av = w.rel_v.data<float>();
  std::vector<float> gak(static_cast<size_t>(B * H * R * Dk), 0.f), gav(static_cast<size_t>(B * H * R * Dv), 0.f);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      float* gk = gak.data() + (b * H + h) * R * Dk;
      float* gv = gav.data() + (b * H + h) * R * Dv;
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t d = 0; d < Dk; ++d) at4(dq, b, h, t, d) = at4(dk, b, h, t, d) = 0.f;
        for (int64_t d = 0; d < Dv; ++d) at4(dv, b, h, t, d) = 0.f;
      }
      std::vector<float> ds(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) {
        const float* p = P.data<float>() + ((b * H + h) * T + i) * T;
        float dot = 0.f;
        const uint64_t row = static_cast<uint64_t>(((b * H + h) * T + i) * T);
        for (int64_t j = 0; j < T; ++j) {
          ds[static_cast<size_t>(j)] = 0.f;
          if (p[j] == 0.f) continue;
          const int64_t r = relative_index(rows.position(b, i), rows.position(b, j), kmax);
          const float m = drop.active() ? drop.factor(row + static_cast<uint64_t>(j)) : 1.f;
          const float pm = drop.active() ? p[j] * m : p[j];
          float dp = 0.f;
          for (int64_t d = 0; d < Dv; ++d) {
            const float g = at4(dO, b, h, i, d);
            dp += g * (at4(v, b, h, j, d) + av[r * Dv + d]);
            at4(dv, b, h, j, d) += pm * g;
            gv[r * Dv + d] += pm * g;
          }
          if (drop.active()) dp *= m;
          ds[static_cast<size_t>(j)] = dp;
          dot += p[j] * dp;
        }
        for (int64_t j = 0; j < T; ++j) {
          if (p[j] == 0.f) continue;
          const float s = L.scale * p[j] * (ds[static_cast<size_t>(j)] - dot);
          const int64_t r = relative_index(rows.position(b, i), rows.position(b, j), kmax);
          for (int64_t d = 0; d < Dk; ++d) {
            const float qi = at4(q, b, h, i, d);
            at4(dq, b, h, i, d) += s * (at4(k, b, h, j, d) + ak[r * Dk + d]);
            at4(dk, b, h, j, d) += s * qi;
            gk[r * Dk + d] += s * qi;
          }
        }
      }
    }
  for (int64_t bh = 0; bh < B * H; ++bh) {
    if (g_ak)
      for (int64_t e = 0; e < R * Dk; ++e) g_ak->data<float>()[e] += gak[static_cast<size_t>(bh * R * Dk + e)];
    if (g_av)
      for (int64_t e = 0; e < R * Dv; ++e) g_av->data<float>()[e] += gav[static_cast<size_t>(bh * R * Dv + e)];
  }
}

}  // namespace

Status attention_forward_train(const AttentionLayer& L, const AttentionParams& w, const Exec& ex, const Tensor& x,
                               const RowLayout& rows, Tensor& y, AttentionSaved* sv, const DropoutMask& dropout) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  const int64_t H = L.n_heads, dk = L.d_k, dv = L.d_v;
  const bool relative = L.positions.kind == PositionKind::relative;
  sv->lo.clear();
  sv->hi.clear();
  sv->dropout = dropout;
  if (!relative && !rows.plain && !key_ranges(rows, &sv->lo, &sv->hi))
    return Status::Invalid("training: a batch whose sequences are not each one run of rows (padding between "
                                 "real rows, or a sequence split by another)");
  TSR_RETURN_IF_ERROR(ex.product_input(x.reshape({B * T, C}), &sv->x));
  sv->qkv = Tensor::empty({B * T, w.w_qkv.dim(1)});
  TSR_RETURN_IF_ERROR(ex.linear_plain(sv->x, w.w_qkv, w.b_qkv, sv->qkv));
  Tensor q = head_view(sv->qkv, B, T, 0, H, dk);
  Tensor k = head_view(sv->qkv, B, T, H * dk, H, dk);
  Tensor v = head_view(sv->qkv, B, T, 2 * H * dk, H, dv);
  if (L.positions.kind == PositionKind::rotary) {
    const int32_t* positions = rows.plain ? nullptr : rows.pos.data();
    apply_rotary(q, L.positions.rotary_dims, L.positions.base, L.positions.rotary_style, 0, positions);
    apply_rotary(k, L.positions.rotary_dims, L.positions.base, L.positions.rotary_style, 0, positions);
  }
  sv->concat = Tensor::empty({B, T, H * dv});
  Tensor heads = sv->concat.unflatten(2, H, dv).transpose(1, 2);
  if (relative) {
    sv->weights = Tensor::empty({B, H, T, T});
    relative_forward(L, w, q, k, v, rows, sv->weights, heads, dropout);
  } else {
    sv->lse = Tensor::empty({B, H, T});
    TSR_RETURN_IF_ERROR(ex.attention_train(q, k, v, heads, sv->lse, L.scale, L.causal,
                                           sv->lo.empty() ? nullptr : sv->lo.data(),
                                           sv->hi.empty() ? nullptr : sv->hi.data(),
                                           dropout.active() ? &dropout : nullptr));
  }
  if (!w.w_o.defined()) {
    y.copy_from(sv->concat);
    return Status::Ok();
  }
  Tensor y2 = y.reshape({B * T, w.w_o.dim(1)});
  return ex.linear_plain(sv->concat.reshape({B * T, H * dv}), w.w_o, w.b_o, y2);
}

Status attention_backward(const AttentionLayer& L, const AttentionParams& w, const Exec& ex, const AttentionSaved& sv,
                          const RowLayout& rows, const Tensor& dy, Tensor& dx, Parameters& grads, const std::string& p) {
  const int64_t B = dy.dim(0), T = dy.dim(1), C = sv.x.dim(1);
  const int64_t H = L.n_heads, dk = L.d_k, dv = L.d_v;
  // Through W_O: d concat = dy · W_Oᵀ.
  Tensor dconcat = Tensor::empty({B * T, H * dv});
  if (w.w_o.defined()) {
    TSR_RETURN_IF_ERROR(ex.linear_backward(sv.concat.reshape({B * T, H * dv}), w.w_o, dy.reshape({B * T, w.w_o.dim(1)}),
                                           &dconcat, grads.find(p + ".w_o"), grads.find(p + ".b_o")));
  } else {
    dconcat.copy_from(dy.reshape({B * T, H * dv}));
  }
  // Through the softmax-weighted sum, into one buffer laid out as the forward's [Q | K | V].
  const int64_t N = sv.qkv.dim(1);
  Tensor dqkv = Tensor::empty({B * T, N});
  Tensor q = head_view(sv.qkv, B, T, 0, H, dk), k = head_view(sv.qkv, B, T, H * dk, H, dk);
  Tensor v = head_view(sv.qkv, B, T, 2 * H * dk, H, dv);
  Tensor dq = head_view(dqkv, B, T, 0, H, dk), dk_ = head_view(dqkv, B, T, H * dk, H, dk);
  Tensor dv_ = head_view(dqkv, B, T, 2 * H * dk, H, dv);
  const Tensor heads = sv.concat.unflatten(2, H, dv).transpose(1, 2);
  const Tensor dheads = dconcat.reshape({B, T, H * dv}).unflatten(2, H, dv).transpose(1, 2);
  if (L.positions.kind == PositionKind::relative) {
    relative_backward(L, w, q, k, v, rows, sv.weights, dheads, dq, dk_, dv_, grads.find(p + ".rel_k"),
                      grads.find(p + ".rel_v"), sv.dropout);
  } else {
    TSR_RETURN_IF_ERROR(ex.attention_backward(q, k, v, heads, sv.lse, dheads, dq, dk_, dv_, L.scale, L.causal,
                                              sv.lo.empty() ? nullptr : sv.lo.data(),
                                              sv.hi.empty() ? nullptr : sv.hi.data(),
                                              sv.dropout.active() ? &sv.dropout : nullptr));
  }
  if (L.positions.kind == PositionKind::rotary) {  // back through the rotation: rotate the other way
    const int32_t* positions = rows.plain ? nullptr : rows.pos.data();
    apply_rotary(dq, L.positions.rotary_dims, L.positions.base, L.positions.rotary_style, 0, positions, true);
    apply_rotary(dk_, L.positions.rotary_dims, L.positions.base, L.positions.rotary_style, 0, positions, true);
  }
  // Through the projections: dx = dQKV · [W_Q | W_K | W_V]ᵀ; the fused weights' gradient is split
  // back into the parameters' own names.
  Tensor dw = Tensor::zeros({C, N});
  Tensor db = w.b_qkv.defined() ? Tensor::zeros({N}) : Tensor();
  Tensor dx2 = dx.reshape({B * T, C});
  TSR_RETURN_IF_ERROR(ex.linear_backward(sv.x, w.w_qkv, dqkv, &dx2, &dw, db.defined() ? &db : nullptr));
  const char* names[3] = {"q", "k", "v"};
  const int64_t c0[3] = {0, H * dk, 2 * H * dk};
  for (int i = 0; i < 3; ++i) {
    if (Tensor* g = grads.find(p + ".w_" + names[i])) add_columns(dw, c0[i], *g);
    if (Tensor* g = grads.find(p + ".b_" + names[i]); g && db.defined()) add_columns(db, c0[i], *g);
  }
  return Status::Ok();
}

}  // namespace tessera::model
