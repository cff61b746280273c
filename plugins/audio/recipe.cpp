// The log-mel recipes on top of the spectrogram: Whisper's log_mel_spectrogram (pad_or_trim, last
// frame dropped, log10 clamped to max - 8, (x + 4) / 4), Kaldi's log fbank as torchaudio computes
// it, AST's padding and AudioSet normalisation, and plain log-mel frames. Not the decoding, the
// resampling or the rows.
#include <algorithm>
#include <cmath>
#include <limits>

#include "audio_dsp.h"

namespace tessera::audio {

Extractor::Extractor(const FrontEnd& fe)
    : fe_(fe),
      window_(make_window(fe.window, fe.win_length)),
      filterbank_(mel_filterbank(fe.mel_scale, fe.n_mels, fe.n_fft, fe.sample_rate)),
      fft_(fe.n_fft) {}

Features Extractor::compute(const std::vector<double>& audio) {
  Features out;
  out.n_mels = fe_.n_mels;
  out.n_samples = static_cast<int64_t>(audio.size());
  const bool centred = fe_.framing == Framing::centered;
  const int64_t target = fe_.target_frames;

  // Whisper's pad_or_trim works on samples: zeros appended, or the tail cut, to target · hop.
  std::vector<double> padded;
  const std::vector<double>* x = &audio;
  if (centred && target > 0) {
    padded.assign(audio.begin(), audio.begin() + std::min<int64_t>(out.n_samples, target * fe_.hop));
    padded.resize(static_cast<size_t>(target * fe_.hop), 0.0);
    x = &padded;
  }
  const Spectrogram s = power_spectrogram(*x, fe_.framing, fe_.win_length, fe_.hop, window_, fft_);
  std::vector<double> mel = apply_filterbank(s, filterbank_, fe_.n_mels);

  // Frames kept: Whisper drops the STFT's last frame; padded centred recipes keep `target`.
  int kept = s.n_frames;
  if (centred && (target > 0 || fe_.recipe == Recipe::whisper)) kept = s.n_frames - 1;
  if (kept <= 0)
    throw AudioError(std::to_string(out.n_samples) + " samples give no " + std::to_string(fe_.hop) +
                     "-sample frame once Whisper drops the last one");
  mel.resize(static_cast<size_t>(kept) * fe_.n_mels);

  switch (fe_.log) {
    case LogKind::whisper: {
      double top = -std::numeric_limits<double>::infinity();
      for (double& v : mel) {
        v = std::log10(std::max(v, fe_.log_floor));
        top = std::max(top, v);
      }
      for (double& v : mel) v = (std::max(v, top - 8.0) + 4.0) / 4.0;
      break;
    }
    case LogKind::ln:
      for (double& v : mel) v = std::log(std::max(v, fe_.log_floor));
      break;
    case LogKind::log10:
      for (double& v : mel) v = std::log10(std::max(v, fe_.log_floor));
      break;
    case LogKind::none:
      break;
  }

  // Content frames: those whose centre lies inside the audio.
  int content = 0;
  while (content < kept && frame_centre(content) * fe_.sample_rate < static_cast<double>(out.n_samples)) ++content;
  if (fe_.cmvn != Cmvn::none) apply_cmvn(mel, kept, fe_.n_mels, std::max(content, 1), fe_.cmvn);

  // Kaldi-framed recipes pad or trim the finished rows, with zero rows (HF's ASTFeatureExtractor).
  out.n_frames = kept;
  if (!centred && target > 0) {
    mel.resize(static_cast<size_t>(target) * fe_.n_mels, 0.0);
    out.n_frames = static_cast<int>(target);
  }
  if (fe_.normalise)
    for (double& v : mel) v = (v - fe_.mean) / (2 * fe_.std);

  out.content_frames = std::min(content, out.n_frames);  // trimmed rows are no content
  out.values.assign(mel.begin(), mel.end());
  return out;
}

void apply_cmvn(std::vector<double>& values, int n_frames, int n_mels, int stats_frames, Cmvn cmvn) {
  for (int m = 0; m < n_mels; ++m) {
    auto at = [&](int f) -> double& { return values[static_cast<size_t>(f) * n_mels + m]; };
    double mean = 0, var = 0;
    for (int f = 0; f < stats_frames; ++f) mean += at(f);
    mean /= stats_frames;
    for (int f = 0; f < stats_frames; ++f) var += (at(f) - mean) * (at(f) - mean);
    var /= stats_frames;
    const double scale = cmvn == Cmvn::mean_var ? 1.0 / std::sqrt(std::max(var, 1e-10)) : 1.0;
    for (int f = 0; f < n_frames; ++f) at(f) = (at(f) - mean) * scale;
  }
}

double Extractor::frame_centre(int f) const {
  const double first = static_cast<double>(f) * fe_.hop;
  return (fe_.framing == Framing::centered ? first : first + fe_.win_length / 2.0) / fe_.sample_rate;
}

std::pair<double, double> Extractor::frame_seconds(int f, const Features& features) const {
  double a = static_cast<double>(f) * fe_.hop, b = a + fe_.win_length;
  if (fe_.framing == Framing::centered) {
    const double end = fe_.target_frames > 0 ? static_cast<double>(fe_.target_frames) * fe_.hop
                                             : static_cast<double>(features.n_samples);
    a = std::max(0.0, a - fe_.n_fft / 2.0);
    b = std::min(end, static_cast<double>(f) * fe_.hop + fe_.n_fft / 2.0);
  }
  return {a / fe_.sample_rate, b / fe_.sample_rate};
}

}  // namespace tessera::audio
