// One transformer block, as the diagram draws it. Post-LN (the 2017 paper, BERT, the seeds):
//   U = MultiHead(X);  R = LN1(X + U);  F = FFN(R);  Y = LN2(R + F)      (norm none: no LN)
// and pre-LN (GPT-2, ViT):  R = X + MultiHead(LN1(X));  Y = R + FFN(LN2(R)).
// The residual stream x is updated in place; the FFN's activation and the residuals are fused into
// its linear layers.
#include "arena.h"
#include "assembly.h"

namespace tessera::model {

Status block_forward(const ModelConfig& c, const Block& blk, const Exec& ex, const RowLayout& lay, Tensor& x,
                     Tensor& h, const Capture& cap, const std::string& p, const CacheView* cache) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  cap.put(p + ".in", x);
  const float eps = static_cast<float>(c.norm_eps);
  const int64_t F = c.d_ff;
  auto ffn = [&](const Tensor& in, Tensor& y, const Tensor* residual) -> Status {
    Tensor hidden = Arena::get(ArenaSlot::hidden, {B * T, F});
    TSR_RETURN_IF_ERROR(ex.linear(blk.ffn1, in.reshape({B * T, C}), hidden));
    cap.put(p + ".ffn.hidden", hidden.reshape({B, T, F}));
    Tensor y2 = y.reshape({B * T, C});
    if (residual) {
      const Tensor r2 = residual->reshape({B * T, C});
      TSR_RETURN_IF_ERROR(ex.linear(blk.ffn2, hidden, y2, &r2));
    } else {
      TSR_RETURN_IF_ERROR(ex.linear(blk.ffn2, hidden, y2));
    }
    cap.put(p + ".ffn.out", y);
    return Status::Ok();
  };

  if (c.norm == NormPlacement::pre) {
    // R = X + MultiHead(LN1(X));  Y = R + FFN(LN2(R))
    TSR_RETURN_IF_ERROR(ex.layer_norm(x, blk.ln1_g, blk.ln1_b, eps, h));
    cap.put(p + ".ln1", h);
    cap.put(p + ".attn.in", h);
    TSR_RETURN_IF_ERROR(attention_forward(blk.attn, ex, h, lay, &x, x, cap, p + ".attn", cache));
    cap.put(p + ".attn.residual", x);
    if (F > 0) {
      TSR_RETURN_IF_ERROR(ex.layer_norm(x, blk.ln2_g, blk.ln2_b, eps, h));
      cap.put(p + ".ln2", h);
      TSR_RETURN_IF_ERROR(ffn(h, x, &x));
    }
  } else {
    // post-LN: R = LN1(X + MultiHead(X));  Y = LN2(R + FFN(R))   (norm none: no LN)
    cap.put(p + ".attn.in", x);
    const int64_t width = blk.attn.out.defined() ? C : c.n_heads * c.d_v;
    Tensor u = width == C ? h : Arena::get(ArenaSlot::wide, {B, T, width});
    TSR_RETURN_IF_ERROR(
        attention_forward(blk.attn, ex, x, lay, c.residual ? &x : nullptr, u, cap, p + ".attn", cache));
    cap.put(p + ".attn.residual", u);
    if (c.norm == NormPlacement::post) {
      TSR_RETURN_IF_ERROR(ex.layer_norm(u, blk.ln1_g, blk.ln1_b, eps, x));
      cap.put(p + ".ln1", x);
    } else if (width == C) {
      x.copy_from(u);
    } else {
      x = u;  // a bare attention layer whose output is the concatenated heads
    }
    if (F > 0) {
      TSR_RETURN_IF_ERROR(ffn(x, h, c.residual ? &x : nullptr));
      if (c.norm == NormPlacement::post) {
        TSR_RETURN_IF_ERROR(ex.layer_norm(h, blk.ln2_g, blk.ln2_b, eps, x));
        cap.put(p + ".ln2", x);
      } else {
        x.copy_from(h);
      }
    }
  }
  cap.put(p + ".out", x);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Training: the same equations, each step's input kept for the backward; nothing fused or in place.
// Residual dropout (as BERT, GPT-2 and ViT place it) multiplies each sub-layer's output by its
// mask before the residual add: R = X + Drop(MultiHead(·)), Y = R + Drop(FFN(·)) (pre-LN), and
// likewise inside the post-LN sums. The backward regenerates the masks from their counters.

namespace {

Tensor rows2(const Tensor& t) { return t.reshape({t.numel() / t.dim(-1), t.dim(-1)}); }

// y = [x +] FFN(x) rows: a = x·W1 + b1, g = act(a), y = g·W2 + b2 (+ residual). x and g are
// kept as the products read them (Exec::product_input); x as it is where the block keeps it
// anyway (post-LN: it is R).
Status ffn_train(const ModelConfig& c, const BlockParams& w, const Exec& ex, const Tensor& in, BlockSaved* s,
                 Tensor& out) {
  const int64_t M = in.numel() / c.d_model;
  if (c.norm == NormPlacement::pre)
    TSR_RETURN_IF_ERROR(ex.product_input(rows2(in), &s->ffn_in));
  else
    s->ffn_in = rows2(in);
  s->a = Tensor::empty({M, c.d_ff});
  TSR_RETURN_IF_ERROR(ex.linear_plain(s->ffn_in, w.w1, w.b1, s->a));
  Tensor g = Tensor::empty({M, c.d_ff});
  TSR_RETURN_IF_ERROR(ex.activation(c.activation, s->a, g));
  TSR_RETURN_IF_ERROR(ex.product_input(g, &s->g));
  Tensor o2 = rows2(out);
  return ex.linear_plain(s->g, w.w2, w.b2, o2);
}

// dout -> din (written) through the FFN.
Status ffn_backward(const ModelConfig& c, const BlockParams& w, const Exec& ex, const BlockSaved& s, const Tensor& dout,
                    Tensor& din, Parameters& grads, const std::string& p) {
  Tensor dg = Tensor::empty(s.g.shape());
  TSR_RETURN_IF_ERROR(ex.linear_backward(s.g, w.w2, rows2(dout), &dg, grads.find(p + ".ffn.w2"), grads.find(p + ".ffn.b2")));
  TSR_RETURN_IF_ERROR(ex.activation_backward(c.activation, s.a, dg, dg));
  Tensor d2 = rows2(din);
  return ex.linear_backward(s.ffn_in, w.w1, dg, &d2, grads.find(p + ".ffn.w1"), grads.find(p + ".ffn.b1"));
}

// In place: t ⊙ mask (nothing when its p is 0).
Status drop(const Exec& ex, const DropoutMask& m, Tensor& t) { return m.active() ? ex.dropout(t, m, t) : Status::Ok(); }
// A new tensor d ⊙ mask, or d itself when its p is 0: d is still needed as it was.
Status drop_copy(const Exec& ex, const DropoutMask& m, const Tensor& d, Tensor* out) {
  if (!m.active()) {
    *out = d;
    return Status::Ok();
  }
  *out = Tensor::empty(d.shape());
  return ex.dropout(d, m, *out);
}

Status norm_train(const Exec& ex, const ModelConfig& c, const Tensor& x, const Tensor& g, const Tensor& b, Tensor& y,
                  Tensor* in, Tensor* mean, Tensor* rstd) {
  *in = x;
  *mean = Tensor::empty({x.numel() / x.dim(-1)});
  *rstd = Tensor::empty({x.numel() / x.dim(-1)});
  return ex.layer_norm_train(x, g, b, static_cast<float>(c.norm_eps), y, *mean, *rstd);
}

}  // namespace

Status block_forward_train(const ModelConfig& c, const AttentionLayer& L, const BlockParams& w, const Exec& ex,
                           const RowLayout& lay, const Tensor& x, Tensor& y, BlockSaved* s,
                           const BlockDropout& dropout) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  s->attn_out_drop = dropout.attn_out;
  s->ffn_out_drop = dropout.ffn_out;
  const int64_t width = w.attn.w_o.defined() ? w.attn.w_o.dim(1) : L.n_heads * L.d_v;
  if (c.norm == NormPlacement::pre) {
    // R = X + MultiHead(LN1(X));  Y = R + FFN(LN2(R))
    Tensor h1 = Tensor::empty({B, T, C});
    TSR_RETURN_IF_ERROR(norm_train(ex, c, x, w.ln1_g, w.ln1_b, h1, &s->ln1_in, &s->ln1_mean, &s->ln1_rstd));
    Tensor u = Tensor::empty({B, T, width});
    TSR_RETURN_IF_ERROR(attention_forward_train(L, w.attn, ex, h1, lay, u, &s->attn, dropout.attention));
    TSR_RETURN_IF_ERROR(drop(ex, dropout.attn_out, u));
    s->r = Tensor::empty({B, T, C});
    TSR_RETURN_IF_ERROR(ex.add(x, u, s->r));
    if (c.d_ff == 0) {
      y = s->r;
      return Status::Ok();
    }
    Tensor h2 = Tensor::empty({B, T, C});
    TSR_RETURN_IF_ERROR(norm_train(ex, c, s->r, w.ln2_g, w.ln2_b, h2, &s->ln2_in, &s->ln2_mean, &s->ln2_rstd));
    Tensor f = Tensor::empty({B, T, C});
    TSR_RETURN_IF_ERROR(ffn_train(c, w, ex, h2, s, f));
    TSR_RETURN_IF_ERROR(drop(ex, dropout.ffn_out, f));
    y = Tensor::empty({B, T, C});
    return ex.add(s->r, f, y);
  }
  // post-LN: R = LN1(X + MultiHead(X));  Y = LN2(R + FFN(R))   (norm none: no LN)
  const bool post = c.norm == NormPlacement::post;
  Tensor u = Tensor::empty({B, T, width});
  TSR_RETURN_IF_ERROR(attention_forward_train(L, w.attn, ex, x, lay, u, &s->attn, dropout.attention));
  TSR_RETURN_IF_ERROR(drop(ex, dropout.attn_out, u));
  if (c.residual) TSR_RETURN_IF_ERROR(ex.add(u, x, u));
  if (post) {
    s->r = Tensor::empty({B, T, width});
    TSR_RETURN_IF_ERROR(norm_train(ex, c, u, w.ln1_g, w.ln1_b, s->r, &s->ln1_in, &s->ln1_mean, &s->ln1_rstd));
  } else {
    s->r = u;
  }
  if (c.d_ff == 0) {
    y = s->r;
    return Status::Ok();
  }
  Tensor z = Tensor::empty({B, T, C});
  TSR_RETURN_IF_ERROR(ffn_train(c, w, ex, s->r, s, z));
  TSR_RETURN_IF_ERROR(drop(ex, s->ffn_out_drop, z));
  if (c.residual) TSR_RETURN_IF_ERROR(ex.add(z, s->r, z));
  if (!post) {
    y = z;
    return Status::Ok();
  }
  y = Tensor::empty({B, T, C});
  return norm_train(ex, c, z, w.ln2_g, w.ln2_b, y, &s->ln2_in, &s->ln2_mean, &s->ln2_rstd);
}

Status block_backward(const ModelConfig& c, const AttentionLayer& L, const BlockParams& w, const Exec& ex,
                      const BlockSaved& s, const RowLayout& lay, const Tensor& dy, Tensor& dx, Parameters& grads,
                      const std::string& p) {
  const Shape xs = s.attn.x.shape();  // (B·T, C)
  const int64_t B = dy.dim(0), T = dy.dim(1), C = xs[1];
  auto norm_back = [&](const Tensor& in, const Tensor& mean, const Tensor& rstd, const Tensor& g, const Tensor& d,
                       Tensor& out, const std::string& name) {
    return ex.layer_norm_backward(in, g, mean, rstd, d, &out, grads.find(p + "." + name + ".gamma"),
                                  grads.find(p + "." + name + ".beta"));
  };
  if (c.norm == NormPlacement::pre) {
    // dR = dY + LN2ᵀ(FFNᵀ(M_F ⊙ dY));  dX = dR + LN1ᵀ(Attnᵀ(M_U ⊙ dR))
    Tensor dr = dy;
    if (c.d_ff > 0) {
      Tensor dh2 = Tensor::empty({B, T, C}), dn = Tensor::empty({B, T, C}), df;
      TSR_RETURN_IF_ERROR(drop_copy(ex, s.ffn_out_drop, dy, &df));
      TSR_RETURN_IF_ERROR(ffn_backward(c, w, ex, s, df, dh2, grads, p));
      TSR_RETURN_IF_ERROR(norm_back(s.ln2_in, s.ln2_mean, s.ln2_rstd, w.ln2_g, dh2, dn, "ln2"));
      dr = Tensor::empty({B, T, C});
      TSR_RETURN_IF_ERROR(ex.add(dy, dn, dr));
    }
    Tensor dh1 = Tensor::empty({B, T, C}), dn = Tensor::empty({B, T, C}), du;
    TSR_RETURN_IF_ERROR(drop_copy(ex, s.attn_out_drop, dr, &du));
    TSR_RETURN_IF_ERROR(attention_backward(L, w.attn, ex, s.attn, lay, du, dh1, grads, p + ".attn"));
    TSR_RETURN_IF_ERROR(norm_back(s.ln1_in, s.ln1_mean, s.ln1_rstd, w.ln1_g, dh1, dn, "ln1"));
    dx = Tensor::empty({B, T, C});
    return ex.add(dr, dn, dx);
  }
  const bool post = c.norm == NormPlacement::post;
  const int64_t width = s.r.dim(2);
  Tensor dz = dy;
  if (post && c.d_ff > 0) {
    dz = Tensor::empty(dy.shape());
    TSR_RETURN_IF_ERROR(norm_back(s.ln2_in, s.ln2_mean, s.ln2_rstd, w.ln2_g, dy, dz, "ln2"));
  }
  Tensor dr = dz;
  if (c.d_ff > 0) {
    dr = Tensor::empty({B, T, width});
    Tensor df;
    TSR_RETURN_IF_ERROR(drop_copy(ex, s.ffn_out_drop, dz, &df));
    TSR_RETURN_IF_ERROR(ffn_backward(c, w, ex, s, df, dr, grads, p));
    if (c.residual) TSR_RETURN_IF_ERROR(ex.add(dr, dz, dr));
  }
  Tensor du = dr;
  if (post) {
    du = Tensor::empty({B, T, width});
    TSR_RETURN_IF_ERROR(norm_back(s.ln1_in, s.ln1_mean, s.ln1_rstd, w.ln1_g, dr, du, "ln1"));
  }
  dx = Tensor::empty({B, T, C});
  Tensor dud;
  TSR_RETURN_IF_ERROR(drop_copy(ex, s.attn_out_drop, du, &dud));
  TSR_RETURN_IF_ERROR(attention_backward(L, w.attn, ex, s.attn, lay, dud, dx, grads, p + ".attn"));
  if (c.residual) TSR_RETURN_IF_ERROR(ex.add(dx, du, dx));
  return Status::Ok();
}

}  // namespace tessera::model
