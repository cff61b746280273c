// Seeded random numbers and weight initialisation, identical on every run and every machine.
// Rng reproduces NumPy's default generator bit for bit: Rng(seed) draws what
// numpy.random.default_rng(seed) draws (SeedSequence -> PCG64; ziggurat normals; 53-bit
// uniforms), so a model initialised here equals one initialised by the seeds' NumPy code:
//
//   rng = np.random.default_rng(9)                      Rng rng(9);
//   sd = np.sqrt(2.0 / (rows + cols))                   Tensor w = Tensor::empty({rows, cols});
//   w = rng.normal(0.0, sd, size=(rows, cols))          fill_normal(w, rng, 0.0, sd);
//
// Only what weight initialisation needs: no other distributions, no jumping, no spawning.
// (Dropout's masks, at the end, are counter-based instead: no generator state at all.)
// Not cryptographic. Thread-safety: one Rng per thread; it is a plain value, and a copy
// continues the same stream independently of the original.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

class Rng {
 public:
  explicit Rng(uint64_t seed);  // numpy.random.default_rng(seed), any seed in [0, 2^64)

  uint64_t next_u64();        // PCG64 (XSL-RR) output, as bit_generator.random_raw()
  uint32_t next_u32();        // as NumPy's next_uint32: the low half of a 64-bit draw, then
                              // its high half (kept across next_u64 and other draws)
  double uniform();           // [0, 1), as Generator.random(): (next_u64() >> 11) * 2^-53
  double standard_normal();   // as Generator.standard_normal() (NumPy's 256-layer ziggurat)
  double normal(double mean, double sd);          // as Generator.normal(mean, sd)
  double uniform(double low, double high);        // as Generator.uniform(low, high)

 private:
  uint64_t state_hi_ = 0, state_lo_ = 0;  // 128-bit LCG state
  uint64_t inc_hi_ = 0, inc_lo_ = 0;      // 128-bit increment (odd)
  bool has_u32_ = false;
  uint32_t u32_ = 0;
};

// Fill in row-major order, as NumPy's size=(rows, cols) does: element i is the i-th draw.
// f32 gets each double draw rounded to nearest; bf16 gets that f32 rounded to nearest even,
// so a bf16 fill equals an f32 fill converted with Tensor::to(DType::bf16).
// The tensor must be defined, contiguous, f32 or bf16; sd >= 0; low <= high, both finite.
// Anything else is a caller's bug and aborts with a message.
void fill_normal(Tensor& t, Rng& rng, double mean, double sd);
void fill_uniform(Tensor& t, Rng& rng, double low, double high);

// Only grows.
enum class InitScheme : int {
  glorot_normal = 0,   // N(0, sd²), sd = sqrt(2 / (rows + cols)): Glorot & Bengio 2010, the seeds
  glorot_uniform = 1,  // U(-a, a), a = sqrt(6 / (rows + cols))
  he_normal = 2,       // N(0, 2 / rows): He et al. 2015 (rows = fan-in)
  normal = 3,          // N(0, std²) with a fixed std (GPT-2 and BERT use 0.02)
  zeros = 4,
};
const char* init_scheme_name(InitScheme s);  // "glorot_normal", ...; "unknown" for no scheme
// Exact, case-sensitive names as init_scheme_name spells them; false (and *out untouched) for
// anything else.
bool parse_init_scheme(const std::string& name, InitScheme* out);

// Initialise a (rows, cols) weight, rows being the fan-in (y = x @ w); `std` is used by
// `normal` only. Draws exactly what the scheme's NumPy line draws from the same generator, in
// row-major order; `zeros` and empty matrices draw nothing.
void init_matrix(Tensor& w, InitScheme scheme, double std, Rng& rng);

// ---- Dropout masks: counter-based, so a mask is a function of its counters and nothing else ----
//
//   DropoutMask m{dropout_key(seed, step, micro_batch, layer, site), 0.1f};
//   y[e] = x[e] * m.factor(e)        // 0 (dropped) or 1 / (1 - p) (kept: inverted dropout)
//
// Element e's draw is the e-th output of SplitMix64 (Steele et al. 2014) started at the key:
// u = fmix64(key + (e + 1) · 0x9e3779b97f4a7c15), and e is kept when u's high 32 bits are
// >= floor(p · 2^32). The key is SplitMix64's finaliser chained over the counters. Nothing depends
// on the order the elements are visited in, on threads or on earlier draws, so a backward pass
// regenerates the forward's mask, and a resumed run the uninterrupted one's. Plain values; any
// thread may use one. tools/reference/ regenerates the same masks in NumPy from this formula.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// fmix64(fmix64(fmix64(fmix64(fmix64(seed) ^ step) ^ micro_batch) ^ layer) ^ site), fmix64 being
// splitmix64_mix after adding the golden-ratio increment.
uint64_t dropout_key(uint64_t seed, uint64_t step, uint64_t micro_batch, uint64_t layer, uint64_t site);

struct DropoutMask {
  uint64_t key = 0;
  float p = 0.f;  // the drop probability, in [0, 1); 0: nothing is dropped
  bool active() const { return p > 0.f; }
  uint32_t threshold() const { return static_cast<uint32_t>(static_cast<double>(p) * 4294967296.0); }
  float scale() const { return 1.f / (1.f - p); }
  bool keep(uint64_t element, uint32_t threshold) const {
    const uint64_t u = splitmix64_mix(key + (element + 1) * 0x9e3779b97f4a7c15ull);
    return static_cast<uint32_t>(u >> 32) >= threshold;
  }
  bool keep(uint64_t element) const { return keep(element, threshold()); }
  float factor(uint64_t element) const { return keep(element) ? scale() : 0.f; }
};

}  // namespace tessera
