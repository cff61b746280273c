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

}  // namespace tessera
