// dropout_key: the counters of one dropout site hashed into the key its mask is drawn from
// (tessera/random.h). The per-element draw is inline in the header; nothing else lives here.
#include "tessera/random.h"

namespace tessera {

namespace {
uint64_t fmix(uint64_t z) { return splitmix64_mix(z + 0x9e3779b97f4a7c15ull); }
}  // namespace

uint64_t dropout_key(uint64_t seed, uint64_t step, uint64_t micro_batch, uint64_t layer, uint64_t site) {
  return fmix(fmix(fmix(fmix(fmix(seed) ^ step) ^ micro_batch) ^ layer) ^ site);
}

}  // namespace tessera
