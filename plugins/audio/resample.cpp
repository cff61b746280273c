// Sample-rate conversion with libsoxr's one-shot call: linear phase, double-precision samples in
// and out, one thread (so results do not depend on the machine's core count). No streaming: an
// item is one whole file already in memory.
#include <soxr.h>

#include <cmath>
#include <string>

#include "audio_dsp.h"

namespace tessera::audio {

std::vector<double> resample(const std::vector<double>& x, int in_rate, int out_rate, ResampleQuality q) {
  if (in_rate == out_rate) return x;
  static constexpr unsigned long kRecipe[] = {SOXR_QQ, SOXR_LQ, SOXR_MQ, SOXR_HQ, SOXR_VHQ};
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT64_I, SOXR_FLOAT64_I);
  const soxr_quality_spec_t quality = soxr_quality_spec(kRecipe[static_cast<int>(q)], SOXR_LINEAR_PHASE);
  const soxr_runtime_spec_t runtime = soxr_runtime_spec(1);
  const double ratio = static_cast<double>(out_rate) / in_rate;
  std::vector<double> y(static_cast<size_t>(std::llround(static_cast<double>(x.size()) * ratio)));
  if (y.empty()) return y;
  size_t done = 0;
  const soxr_error_t err = soxr_oneshot(in_rate, out_rate, 1, x.data(), x.size(), nullptr, y.data(), y.size(),
                                        &done, &io, &quality, &runtime);
  if (err) throw std::runtime_error(std::string("libsoxr: ") + err);  // a bug or out of memory, not the input
  y.resize(done);
  return y;
}

}  // namespace tessera::audio
