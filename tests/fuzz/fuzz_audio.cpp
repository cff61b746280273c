// Fuzzes the audio plugin's encode on raw file bytes (WAV, FLAC, Ogg, ... through libsndfile, then
// resampling and the spectrogram), through the plugin ABI as `tessera run` calls it. Two encoders:
// Kaldi fbank and configurable log-mel frames, neither padding to a fixed length (whisper's 30 s
// would make every execution the same slow 3000 frames); the input's length picks one.
#include <cstdlib>

#include "fuzz_util.h"

namespace {
tessera::Encoder make(std::map<std::string, std::string> o) {
  auto p = fuzz::plugin("audio");
  auto e = tessera::Encoder::create(p, fuzz::options(*p, o));
  if (!e.ok()) {
    fprintf(stderr, "%s\n", e.status().message().c_str());
    std::abort();
  }
  return std::move(e).value();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tessera::Encoder kaldi = make({{"recipe", "kaldi_fbank"}, {"target_frames", "0"}});
  static const tessera::Encoder frames = make({{"recipe", "frames"}, {"target_frames", "0"}, {"n_mels", "40"}});
  const tessera::Encoder& enc = size % 2 ? kaldi : frames;
  tessera::PluginItem item{"fuzz", "fuzz.wav", std::string_view(reinterpret_cast<const char*>(data), size)};
  auto rows = enc.encode(item);
  if (!rows.ok()) {
    if (rows.status().message().empty()) std::abort();
    return 0;
  }
  for (const auto& r : *rows) fuzz::touch(r.features.raw_data(), r.features.nbytes());
  return 0;
}
