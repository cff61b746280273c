// The normal ziggurat behind Rng::standard_normal, opened up for tests: its tables, and the same
// sampling code run with branch counters or on a scripted input stream. Private to core/src and
// the tests; nothing here is a public API or needed to draw numbers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessera/random.h"

namespace tessera::detail {

constexpr int kZigguratLayers = 256;

// Layer i (1..255) is the rectangle [0, x_i] x [f(x_i), f(x_{i-1})], f(x) = exp(-x^2 / 2),
// x_0 = 0 < x_1 < ... < x_255 = r; every layer has the same area v. Layer 0 is the base strip
// [0, r] x [0, f(r)] plus the tail beyond r, drawn as one strip of width q = v / f(r).
// A draw picks layer i and a 52-bit magnitude m, x = m * w[i], and returns x at once when
// m < k[i], i.e. when x < x_{i-1} (under the layer above; for layer 0, when x < r).
struct ZigguratTables {
  uint64_t k[kZigguratLayers];  // round(2^52 * x_{i-1} / x_i); k[0] = round(2^52 * r / q)
  double w[kZigguratLayers];    // x_i / 2^52; w[0] = q / 2^52
  double f[kZigguratLayers];    // f(x_i); f[0] = 1
};

// Computed once, on first use, as NumPy's tables were built (see random.cpp).
const ZigguratTables& normal_ziggurat();

// How draws left the ziggurat; only the instrumented entry points below fill it in.
struct ZigguratCounts {
  int64_t words = 0;          // 64-bit draws taken (one per try)
  int64_t layer_words[kZigguratLayers] = {};  // those, by layer
  int64_t fast = 0;           // returned at once (m < k[i])
  int64_t wedge_accept = 0;   // layers 1..255, accepted by the exp test
  int64_t wedge_reject = 0;   // layers 1..255, rejected: a new 64-bit draw follows
  int64_t tail_accept = 0;    // layer 0 beyond r: accepted pairs of uniforms
  int64_t tail_reject = 0;    // layer 0 beyond r: rejected pairs
};

// Rng::standard_normal, counting branches; draws exactly what rng.standard_normal() would.
double standard_normal_counted(Rng& rng, ZigguratCounts& counts);

// Scripted inputs: 64-bit words and uniform doubles handed out in order. Running past the end
// sets `overrun` and yields words/doubles that end any loop.
struct ScriptedDraws {
  const uint64_t* words = nullptr;
  size_t n_words = 0;
  const double* doubles = nullptr;
  size_t n_doubles = 0;
  size_t used_words = 0;
  size_t used_doubles = 0;
  bool overrun = false;
};

// The ziggurat run on scripted inputs: what NumPy's standard_normal returns on them.
double standard_normal_scripted(ScriptedDraws& draws, ZigguratCounts* counts);

}  // namespace tessera::detail
