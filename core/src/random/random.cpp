// Rng (NumPy's default_rng: SeedSequence -> PCG64 -> Generator), the normal ziggurat and its
// tables, and the weight fills built on them. No other distributions, no jumping or spawning.
// Compiled with -ffp-contract=off (sources.cmake): a fused multiply-add would round differently.
#include <cmath>

#include "random/ziggurat.h"
#include "tessera/random.h"

namespace tessera {
namespace {

__extension__ typedef unsigned __int128 u128;  // GCC and Clang; __extension__ quiets -Wpedantic

u128 join(uint64_t hi, uint64_t lo) { return (static_cast<u128>(hi) << 64) | lo; }
uint64_t high(u128 v) { return static_cast<uint64_t>(v >> 64); }
uint64_t low(u128 v) { return static_cast<uint64_t>(v); }

// PCG64: a 128-bit LCG (O'Neill's default multiplier) with the XSL-RR output function.
const u128 kPcgMultiplier = join(0x2360ED051FC65DA4ull, 0x4385DF649FCCF645ull);

uint64_t xsl_rr(u128 state) {
  const uint64_t folded = high(state) ^ low(state);
  const unsigned rot = static_cast<unsigned>(state >> 122);  // top 6 bits
  return (folded >> rot) | (folded << ((64u - rot) & 63u));
}

// NumPy's SeedSequence(seed).generate_state(4, uint64) for an integer seed with no spawn key.
// The seed is cut into 32-bit words, low word first (one word for seeds below 2^32), hashed
// into a pool of four words, and the pool is hashed again into the output words.
struct SeedWords {
  uint64_t words[4];
};

SeedWords seed_sequence(uint64_t seed) {
  constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
  constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
  constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
  constexpr int kXShift = 16;
  constexpr int kPool = 4;

  uint32_t entropy[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const int n_entropy = (seed >> 32) != 0 ? 2 : 1;

  uint32_t hash_const = kInitA;
  auto hashmix = [&hash_const](uint32_t value) {
    value ^= hash_const;
    hash_const *= kMultA;
    value *= hash_const;
    value ^= value >> kXShift;
    return value;
  };
  auto mix = [](uint32_t x, uint32_t y) {
    uint32_t result = kMixMultL * x - kMixMultR * y;
    result ^= result >> kXShift;
    return result;
  };

  uint32_t pool[kPool];
  for (int i = 0; i < kPool; ++i) pool[i] = hashmix(i < n_entropy ? entropy[i] : 0u);
  for (int src = 0; src < kPool; ++src) {
    for (int dst = 0; dst < kPool; ++dst) {
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
    }
  }
  // (Entropy longer than the pool would be mixed in here; a uint64_t seed never is.)

  uint32_t state[8];
  uint32_t out_const = kInitB;
  for (int i = 0; i < 8; ++i) {
    uint32_t v = pool[i % kPool];
    v ^= out_const;
    out_const *= kMultB;
    v *= out_const;
    v ^= v >> kXShift;
    state[i] = v;
  }
  SeedWords out;
  for (int i = 0; i < 4; ++i) out.words[i] = state[2 * i] | (static_cast<uint64_t>(state[2 * i + 1]) << 32);
  return out;
}

// ------------------------------------------------------------------------------------------
// The ziggurat tables, built as NumPy's were (Marsaglia & Tsang's construction, 256 layers):
// x_255 = r, x_i = f^-1(f(x_{i+1}) + v / x_{i+1}) for i = 254..1, x_0 = 0, in double arithmetic,
// every step rounded to nearest. r and v are the constants NumPy's tables use; v is the layers'
// common area (the integral r f(r) + int_r^inf f itself is four ulps higher: 0.00492867323397465494).
constexpr double kZigR = 3.6541528853610088;
constexpr double kZigInvR = 1.0 / kZigR;  // 0.27366123732975828, as NumPy spells it
constexpr double kZigV = 0.0049286732339746519;

detail::ZigguratTables build_normal_ziggurat() {
  detail::ZigguratTables t;
  constexpr double k2p52 = 0x1p52;
  auto f = [](double x) { return std::exp(-0.5 * x * x); };

  double x[detail::kZigguratLayers];
  x[0] = 0.0;
  x[255] = kZigR;
  t.f[255] = f(kZigR);
  for (int i = 254; i >= 1; --i) {
    x[i] = std::sqrt(-2.0 * std::log(t.f[i + 1] + kZigV / x[i + 1]));
    t.f[i] = f(x[i]);
    // NumPy's tables were computed once, with a libm whose exp rounded this one value up:
    // exp(-x_38^2 / 2) lies 0.0017 ulp below the midpoint of two doubles, and the table holds
    // the upper one. Everything else in them is the correctly rounded result of each step.
    // Layer 38's f and, through it, every x_i below (i < 38) carry that ulp; test_random checks
    // the three tables against NumPy's, value for value.
    if (i == 38) t.f[i] = std::nextafter(t.f[i], 1.0);
  }
  t.f[0] = f(x[0]);  // 1

  const double q = kZigV / t.f[255];  // the base strip's width: area v at height f(r)
  t.k[0] = static_cast<uint64_t>(std::nearbyint(kZigR * t.f[255] / kZigV * k2p52));
  t.w[0] = q / k2p52;
  for (int i = 1; i < detail::kZigguratLayers; ++i) {
    t.k[i] = static_cast<uint64_t>(std::nearbyint(x[i - 1] / x[i] * k2p52));  // ties to even
    t.w[i] = x[i] / k2p52;
  }
  return t;
}

// Generator.standard_normal: one 64-bit word per try. Its low 8 bits pick the layer, the next
// bit the sign, the 52 above that the magnitude m; x = +-m * w[i]. If m < k[i] the point lies
// under the layer above and x is returned (99.3% of draws). Otherwise layer 0 samples the tail
// beyond r from pairs of uniforms (Marsaglia's method, with log1p(-U) so that U = 0 is safe),
// its sign taken from bit 8 of m; layers 1..255 accept x if a uniform height in the wedge falls
// under f(x), and else start again with a new word.
template <class Draws>
double ziggurat_normal(Draws& draws, detail::ZigguratCounts* counts) {
  const detail::ZigguratTables& t = detail::normal_ziggurat();
  for (;;) {
    uint64_t r = draws.next_word();
    const int idx = static_cast<int>(r & 0xff);
    r >>= 8;
    const bool negative = (r & 1) != 0;
    const uint64_t m = (r >> 1) & 0x000fffffffffffffull;
    double x = static_cast<double>(m) * t.w[idx];
    if (negative) x = -x;
    if (counts) {
      ++counts->words;
      ++counts->layer_words[idx];
    }
    if (m < t.k[idx]) {
      if (counts) ++counts->fast;
      return x;
    }
    if (idx == 0) {
      for (;;) {
        const double xx = -kZigInvR * std::log1p(-draws.next_double());
        const double yy = -std::log1p(-draws.next_double());
        if (yy + yy > xx * xx) {
          if (counts) ++counts->tail_accept;
          return ((m >> 8) & 1) ? -(kZigR + xx) : kZigR + xx;
        }
        if (counts) ++counts->tail_reject;
      }
    }
    const double height = (t.f[idx - 1] - t.f[idx]) * draws.next_double() + t.f[idx];
    if (height < std::exp(-0.5 * x * x)) {
      if (counts) ++counts->wedge_accept;
      return x;
    }
    if (counts) ++counts->wedge_reject;
  }
}

struct RngDraws {
  Rng& rng;
  uint64_t next_word() { return rng.next_u64(); }
  double next_double() { return rng.uniform(); }
};

struct ScriptedSource {
  detail::ScriptedDraws& s;
  uint64_t next_word() {
    if (s.used_words < s.n_words) return s.words[s.used_words++];
    s.overrun = true;
    return (uint64_t{1} << 9) | 255;  // layer 255, m = 1: returns at once
  }
  double next_double() {
    if (s.used_doubles < s.n_doubles) return s.doubles[s.used_doubles++];
    s.overrun = true;
    return 0.5;  // accepted by the tail test
  }
};

}  // namespace

namespace detail {

const ZigguratTables& normal_ziggurat() {
  static const ZigguratTables tables = build_normal_ziggurat();
  return tables;
}

double standard_normal_counted(Rng& rng, ZigguratCounts& counts) {
  RngDraws draws{rng};
  return ziggurat_normal(draws, &counts);
}

double standard_normal_scripted(ScriptedDraws& draws, ZigguratCounts* counts) {
  ScriptedSource source{draws};
  return ziggurat_normal(source, counts);
}

}  // namespace detail

// ------------------------------------------------------------------------------------------
Rng::Rng(uint64_t seed) {
  // PCG64 seeding from SeedSequence words {s0, s1, i0, i1}: initstate = s0:s1, initseq = i0:i1,
  // then O'Neill's srandom: state = 0; inc = initseq << 1 | 1; step; state += initstate; step.
  const SeedWords seeds = seed_sequence(seed);
  const u128 initstate = join(seeds.words[0], seeds.words[1]);
  const u128 initseq = join(seeds.words[2], seeds.words[3]);
  const u128 inc = (initseq << 1) | 1u;
  u128 state = 0;
  state = state * kPcgMultiplier + inc;
  state += initstate;
  state = state * kPcgMultiplier + inc;
  state_hi_ = high(state);
  state_lo_ = low(state);
  inc_hi_ = high(inc);
  inc_lo_ = low(inc);
}

uint64_t Rng::next_u64() {
  // Step first, then output the new state.
  const u128 state = join(state_hi_, state_lo_) * kPcgMultiplier + join(inc_hi_, inc_lo_);
  state_hi_ = high(state);
  state_lo_ = low(state);
  return xsl_rr(state);
}

uint32_t Rng::next_u32() {
  if (has_u32_) {
    has_u32_ = false;
    return u32_;
  }
  const uint64_t word = next_u64();
  has_u32_ = true;
  u32_ = static_cast<uint32_t>(word >> 32);
  return static_cast<uint32_t>(word);
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1p-53; }

double Rng::standard_normal() {
  RngDraws draws{*this};
  return ziggurat_normal(draws, nullptr);
}

double Rng::normal(double mean, double sd) { return mean + sd * standard_normal(); }

double Rng::uniform(double low, double high) { return low + (high - low) * uniform(); }

// ------------------------------------------------------------------------------------------
namespace {

// Writes draw() into every element in row-major order; f32 gets the double rounded to nearest,
// bf16 gets that f32 rounded to nearest even.
template <class Draw>
void fill_with(Tensor& t, const char* what, Draw draw) {
  TSR_CHECK(t.defined(), what);
  TSR_CHECK(t.is_contiguous(), what);
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::f32: {
      float* p = t.data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(draw());
      return;
    }
    case DType::bf16: {
      bf16* p = t.data<bf16>();
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(static_cast<float>(draw()));
      return;
    }
    default:
      TSR_CHECK(false, what);
  }
}

}  // namespace

void fill_normal(Tensor& t, Rng& rng, double mean, double sd) {
  TSR_CHECK(sd >= 0.0, "fill_normal: sd must be >= 0 (and not NaN)");
  fill_with(t, "fill_normal needs a defined, contiguous f32 or bf16 tensor",
            [&] { return rng.normal(mean, sd); });
}

void fill_uniform(Tensor& t, Rng& rng, double low, double high) {
  TSR_CHECK(std::isfinite(high - low) && high - low >= 0.0,
            "fill_uniform: needs low <= high, both finite");
  fill_with(t, "fill_uniform needs a defined, contiguous f32 or bf16 tensor",
            [&] { return rng.uniform(low, high); });
}

namespace {

struct SchemeName {
  InitScheme scheme;
  const char* name;
};
constexpr SchemeName kSchemeNames[] = {
    {InitScheme::glorot_normal, "glorot_normal"},
    {InitScheme::glorot_uniform, "glorot_uniform"},
    {InitScheme::he_normal, "he_normal"},
    {InitScheme::normal, "normal"},
    {InitScheme::zeros, "zeros"},
};

}  // namespace

const char* init_scheme_name(InitScheme s) {
  for (const SchemeName& e : kSchemeNames) {
    if (e.scheme == s) return e.name;
  }
  return "unknown";
}

bool parse_init_scheme(const std::string& name, InitScheme* out) {
  for (const SchemeName& e : kSchemeNames) {
    if (name == e.name) {
      *out = e.scheme;
      return true;
    }
  }
  return false;
}

void init_matrix(Tensor& w, InitScheme scheme, double std, Rng& rng) {
  TSR_CHECK(w.rank() == 2, "init_matrix: the weight must be a (rows, cols) matrix");
  if (w.numel() == 0) return;  // nothing to draw (and rows + cols may be 0)
  const double rows = static_cast<double>(w.dim(0));
  const double fan_sum = static_cast<double>(w.dim(0) + w.dim(1));
  switch (scheme) {
    case InitScheme::glorot_normal:
      fill_normal(w, rng, 0.0, std::sqrt(2.0 / fan_sum));
      return;
    case InitScheme::glorot_uniform: {
      const double a = std::sqrt(6.0 / fan_sum);
      fill_uniform(w, rng, -a, a);
      return;
    }
    case InitScheme::he_normal:
      fill_normal(w, rng, 0.0, std::sqrt(2.0 / rows));
      return;
    case InitScheme::normal:
      fill_normal(w, rng, 0.0, std);
      return;
    case InitScheme::zeros:
      fill_with(w, "init_matrix(zeros) needs a contiguous f32 or bf16 tensor", [] { return 0.0; });
      return;
  }
  TSR_CHECK(false, "init_matrix: unknown InitScheme");
}

}  // namespace tessera
