// Small models that several suites build: configs with every default resolved, as the config
// loader would leave them, and building one as a test step.
#pragma once

#include <gtest/gtest.h>

#include <cmath>

#include "tessera/model.h"

namespace tessera::testing_util {

// A causal LM of 2 pre-LN layers (32 wide, 4 heads, gelu_tanh, final norm, tied head) over 61
// tokens, with the given positions.
inline ModelConfig tiny_decoder(PositionKind kind, int64_t max_len = 64) {
  ModelConfig c;
  c.arch = Arch::decoder;
  c.causal = true;
  c.d_model = 32;
  c.n_heads = 4;
  c.d_k = c.d_v = 8;
  c.d_ff = 64;
  c.n_layers = 2;
  c.activation = Activation::gelu_tanh;
  c.norm = NormPlacement::pre;
  c.final_norm = true;
  c.attention.scale = 1.0 / std::sqrt(8.0);
  c.stem.kind = StemKind::tokens;
  c.stem.vocab_size = 61;
  c.positions.kind = kind;
  c.positions.max_len = max_len;
  c.positions.rotary_dims = c.d_k;
  c.positions.max_distance = 3;
  c.head.kind = HeadKind::lm;
  c.head.tied = true;
  c.init.scheme = InitScheme::glorot_normal;
  c.init.seed = 5;
  c.weights.allow_missing = true;
  return c;
}

// Model::build, failing the test (with the status) when it does not build.
inline Model build_model(const ModelConfig& c) {
  Result<Model> m = Model::build(c);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

}  // namespace tessera::testing_util
