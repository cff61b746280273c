// Masked-LM masking (train.objective: mlm): which content rows of an example are chosen for the
// loss and what each becomes (the mask token, a random token, itself). Pure functions of a key:
// the trainer's data side only; the loss itself is compute_gradients' token cross-entropy.
#include <cstdint>

#include "tessera/plugin.h"
#include "tessera/train.h"

namespace tessera {

namespace {

// SplitMix64's finaliser: a bijective mix of a 64-bit counter (Steele, Lea and Flood 2014).
uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t combine(uint64_t a, uint64_t b) { return splitmix(splitmix(a) ^ b); }

// Draw k of row t under `key`: three independent streams per row (choose, split, replacement).
uint64_t draw(uint64_t key, int64_t t, uint64_t k) { return combine(key, static_cast<uint64_t>(t) * 4 + k); }

double unit(uint64_t x) { return static_cast<double>(x >> 11) * 0x1.0p-53; }  // [0, 1)

}  // namespace

uint64_t mlm_train_key(int64_t seed, int64_t step, int64_t example) {
  return combine(
      combine(combine(0x6d6c6d5f74726eull, static_cast<uint64_t>(seed)), static_cast<uint64_t>(step)),
      static_cast<uint64_t>(example));
}

uint64_t mlm_eval_key(int64_t seed, int64_t example) {
  return combine(combine(0x6d6c6d5f6576616cull, static_cast<uint64_t>(seed)), static_cast<uint64_t>(example));
}

void mask_sequence(const MaskSpec& spec, uint64_t key, const int32_t* ids, const uint8_t* roles, int64_t n,
                   int32_t* out_ids, int32_t* targets, MaskChoice* choices) {
  int64_t chosen = 0, fallback = -1;
  double fallback_u = 2;
  for (int64_t t = 0; t < n; ++t) {
    out_ids[t] = ids[t];
    targets[t] = -1;
    if (choices) choices[t] = MaskChoice::none;
    if (roles[t] != TSR_ROLE_CONTENT) continue;
    const double u = unit(draw(key, t, 0));
    if (u < fallback_u) fallback_u = u, fallback = t;
    chosen += u < spec.prob;
  }
  for (int64_t t = 0; t < n; ++t) {
    if (roles[t] != TSR_ROLE_CONTENT) continue;
    if (!(unit(draw(key, t, 0)) < spec.prob) && !(chosen == 0 && t == fallback)) continue;
    targets[t] = ids[t];
    const double v = unit(draw(key, t, 1));
    MaskChoice what = MaskChoice::kept;
    if (v < spec.replace) {
      out_ids[t] = spec.mask_id;
      what = MaskChoice::masked;
    } else if (v < spec.replace + spec.random) {
      out_ids[t] = spec.random_ids[draw(key, t, 2) % spec.random_ids.size()];
      what = MaskChoice::random;
    }
    if (choices) choices[t] = what;
  }
}

}  // namespace tessera
