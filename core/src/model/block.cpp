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

}  // namespace tessera::model
