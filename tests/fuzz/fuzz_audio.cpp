// Fuzzes the audio plugin's encode on raw file bytes (WAV, FLAC, Ogg, ... through libsndfile, then
// resampling and the spectrogram), through the plugin ABI as `tessera run` calls it. Two encoders:
// Kaldi fbank and configurable log-mel frames, neither padding to a fixed length (whisper's 30 s
// would make every execution the same slow 3000 frames); the input's length picks one.
#include <cstdlib>

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tessera::Encoder kaldi =
      fuzz::encoder("audio", {{"recipe", "kaldi_fbank"}, {"target_frames", "0"}});
  static const tessera::Encoder frames =
      fuzz::encoder("audio", {{"recipe", "frames"}, {"target_frames", "0"}, {"n_mels", "40"}});
  fuzz::encode_file_bytes(size % 2 ? kaldi : frames, "fuzz.wav", data, size);
  return 0;
}
