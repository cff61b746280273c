// Windows, mel filterbanks (Slaney, HTK, Kaldi), framing and the power spectrogram on FFTW, and
// AST's patch unfold. Double precision throughout; the recipes (log, clamp, normalisation,
// padding) live in recipe.cpp.
#include <fftw3.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numbers>

#include "audio_dsp.h"

namespace tessera::audio {

// ---- Windows ----------------------------------------------------------------------------------

std::vector<double> make_window(Window w, int n) {
  std::vector<double> out(static_cast<size_t>(n), 1.0);
  const bool symmetric = w == Window::hann_symmetric || w == Window::hamming_symmetric || w == Window::povey;
  const double denominator = symmetric ? n - 1 : n;
  if (denominator <= 0) return out;
  for (int i = 0; i < n; ++i) {
    const double c = std::cos(2 * std::numbers::pi * i / denominator);
    double v = (w == Window::hamming || w == Window::hamming_symmetric) ? 0.54 - 0.46 * c : 0.5 - 0.5 * c;
    if (w == Window::povey) v = std::pow(v, 0.85);
    out[static_cast<size_t>(i)] = v;
  }
  return out;
}

// ---- Mel filterbanks --------------------------------------------------------------------------

namespace {

double slaney_mel(double hz) {
  const double f_sp = 200.0 / 3, min_log_hz = 1000, logstep = std::log(6.4) / 27;
  return hz < min_log_hz ? hz / f_sp : min_log_hz / f_sp + std::log(hz / min_log_hz) / logstep;
}
double slaney_hz(double mel) {
  const double f_sp = 200.0 / 3, min_log_hz = 1000, min_log_mel = min_log_hz / f_sp,
               logstep = std::log(6.4) / 27;
  return mel < min_log_mel ? mel * f_sp : min_log_hz * std::exp(logstep * (mel - min_log_mel));
}
double htk_mel(double hz) { return 2595 * std::log10(1 + hz / 700); }
double htk_hz(double mel) { return 700 * (std::pow(10.0, mel / 2595) - 1); }
double kaldi_mel(double hz) { return 1127 * std::log(1 + hz / 700); }
double kaldi_hz(double mel) { return 700 * (std::exp(mel / 1127) - 1); }

}  // namespace

std::vector<double> mel_filterbank(MelScale scale, int n_mels, int n_fft, int sample_rate) {
  const int n_bins = n_fft / 2 + 1;
  const double bin_hz = static_cast<double>(sample_rate) / n_fft;
  std::vector<double> fb(static_cast<size_t>(n_mels) * n_bins, 0.0);
  if (scale == MelScale::kaldi) {
    // Triangles in mel space: band m rises from left to centre and falls to right, evaluated at
    // each bin's mel value; the Nyquist bin stays 0 (Kaldi uses n_fft / 2 bins). Kaldi builds its
    // banks in single precision (BaseFloat), and torchaudio does the same in float32 tensors; the
    // float arithmetic below repeats torchaudio's step by step so the weights agree to the last
    // bits (double weights would move high bands' log energies by up to 1e-4).
    const double lo = kaldi_mel(20.0), hi = kaldi_mel(0.5 * sample_rate), delta = (hi - lo) / (n_mels + 1);
    const float lo_f = static_cast<float>(lo), delta_f = static_cast<float>(delta);
    const float bin_hz_f = static_cast<float>(bin_hz);
    for (int m = 0; m < n_mels; ++m) {
      const float left = lo_f + static_cast<float>(m) * delta_f;
      const float centre = lo_f + static_cast<float>(m + 1) * delta_f;
      const float right = lo_f + static_cast<float>(m + 2) * delta_f;
      for (int k = 0; k < n_fft / 2; ++k) {
        const float mel = 1127.0f * std::log(1.0f + static_cast<float>(k) * bin_hz_f / 700.0f);
        const float up = (mel - left) / (centre - left), down = (right - mel) / (right - centre);
        fb[static_cast<size_t>(m) * n_bins + k] = std::max(0.0f, std::min(up, down));
      }
    }
    return fb;
  }
  // Slaney and HTK: n_mels + 2 points evenly spaced in mel between 0 Hz and Nyquist, triangles in Hz.
  const bool slaney = scale == MelScale::slaney;
  const double top = slaney ? slaney_mel(0.5 * sample_rate) : htk_mel(0.5 * sample_rate);
  std::vector<double> f(static_cast<size_t>(n_mels) + 2);
  for (size_t i = 0; i < f.size(); ++i) {
    const double mel = top * static_cast<double>(i) / (n_mels + 1);
    f[i] = slaney ? slaney_hz(mel) : htk_hz(mel);
  }
  for (int m = 0; m < n_mels; ++m) {
    const double norm = slaney ? 2.0 / (f[m + 2] - f[m]) : 1.0;  // unit area
    for (int k = 0; k < n_bins; ++k) {
      const double hz = bin_hz * k;
      const double lower = (hz - f[m]) / (f[m + 1] - f[m]), upper = (f[m + 2] - hz) / (f[m + 2] - f[m + 1]);
      fb[static_cast<size_t>(m) * n_bins + k] = norm * std::max(0.0, std::min(lower, upper));
    }
  }
  return fb;
}

std::vector<double> warped_band_sources(MelScale scale, int n_mels, int sample_rate, double alpha) {
  // The n_mels + 2 edge points are evenly spaced in mel over [lo, hi]; band m's centre is point m + 1.
  auto mel = [scale](double hz) {
    return scale == MelScale::slaney ? slaney_mel(hz) : scale == MelScale::htk ? htk_mel(hz) : kaldi_mel(hz);
  };
  auto hz = [scale](double m) {
    return scale == MelScale::slaney ? slaney_hz(m) : scale == MelScale::htk ? htk_hz(m) : kaldi_hz(m);
  };
  const double lo = scale == MelScale::kaldi ? kaldi_mel(20.0) : 0.0, hi = mel(0.5 * sample_rate);
  const double delta = (hi - lo) / (n_mels + 1);
  std::vector<double> sources(static_cast<size_t>(n_mels));
  for (int m = 0; m < n_mels; ++m) {
    const double centre = hz(lo + (m + 1) * delta);
    sources[static_cast<size_t>(m)] = (mel(centre / alpha) - lo) / delta - 1;
  }
  return sources;
}

void warp_bands(float* v, int64_t n, int64_t step, const std::vector<double>& sources) {
  std::vector<float> was(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) was[static_cast<size_t>(k)] = v[k * step];
  for (int64_t k = 0; k < n; ++k) {
    const double at = std::clamp(sources[static_cast<size_t>(k)], 0.0, static_cast<double>(n - 1));
    const int64_t below = std::min<int64_t>(static_cast<int64_t>(at), n - 1), above = std::min(below + 1, n - 1);
    const double t = at - static_cast<double>(below);
    v[k * step] = static_cast<float>((1 - t) * was[static_cast<size_t>(below)] + t * was[static_cast<size_t>(above)]);
  }
}

// ---- FFT --------------------------------------------------------------------------------------

namespace {
// FFTW's planner is not thread-safe; encoders are created on several threads at once. The hook
// guards every FFTW planner in the process; the mutex also covers plan destruction.
std::mutex& planner_mutex() {
  static std::mutex m;
  return m;
}
void make_planner_thread_safe() {
  static std::once_flag once;
  std::call_once(once, [] { fftw_make_planner_thread_safe(); });
}
}  // namespace

struct RealFft::Plan {
  double* in = nullptr;
  fftw_complex* out = nullptr;
  fftw_plan plan = nullptr;
};

RealFft::RealFft(int n) : n_(n), plan_(std::make_unique<Plan>()) {
  make_planner_thread_safe();
  std::lock_guard<std::mutex> lock(planner_mutex());
  plan_->in = fftw_alloc_real(static_cast<size_t>(n));
  plan_->out = fftw_alloc_complex(static_cast<size_t>(n / 2 + 1));
  if (plan_->in && plan_->out) plan_->plan = fftw_plan_dft_r2c_1d(n, plan_->in, plan_->out, FFTW_ESTIMATE);
  if (!plan_->plan) {
    fftw_free(plan_->in);
    fftw_free(plan_->out);
    throw std::bad_alloc();
  }
}

RealFft::~RealFft() {
  std::lock_guard<std::mutex> lock(planner_mutex());
  fftw_destroy_plan(plan_->plan);
  fftw_free(plan_->in);
  fftw_free(plan_->out);
}

double* RealFft::input() { return plan_->in; }

void RealFft::power(double* out) {
  fftw_execute(plan_->plan);
  for (int k = 0; k <= n_ / 2; ++k)
    out[k] = plan_->out[k][0] * plan_->out[k][0] + plan_->out[k][1] * plan_->out[k][1];
}

// ---- Spectrograms -----------------------------------------------------------------------------

Spectrogram power_spectrogram(const std::vector<double>& x, Framing framing, int win_length, int hop,
                              const std::vector<double>& window, RealFft& fft) {
  const int64_t n = static_cast<int64_t>(x.size());
  const int n_fft = fft.size();
  Spectrogram s;
  s.n_bins = n_fft / 2 + 1;
  if (framing == Framing::centered) {
    const int64_t pad = n_fft / 2;
    if (n <= pad)
      throw AudioError(std::to_string(n) + " samples are too few for a centred " + std::to_string(n_fft) +
                       "-point frame (reflection needs more than " + std::to_string(pad) + ")");
    s.n_frames = static_cast<int>(1 + n / hop);
  } else {
    if (n < win_length)
      throw AudioError(std::to_string(n) + " samples are too few for one " + std::to_string(win_length) +
                       "-sample frame");
    s.n_frames = static_cast<int>(1 + (n - win_length) / hop);
  }
  s.power.resize(static_cast<size_t>(s.n_frames) * s.n_bins);
  double* in = fft.input();
  for (int f = 0; f < s.n_frames; ++f) {
    if (framing == Framing::centered) {
      // torch.stft(center=True, pad_mode="reflect"): index -j reads j, index n - 1 + j reads n - 1 - j.
      const int64_t start = static_cast<int64_t>(f) * hop - n_fft / 2;
      for (int j = 0; j < n_fft; ++j) {
        int64_t i = start + j;
        if (i < 0) i = -i;
        if (i >= n) i = 2 * (n - 1) - i;
        in[j] = x[static_cast<size_t>(i)] * window[static_cast<size_t>(j)];
      }
    } else {
      // Kaldi: remove the frame's DC offset, pre-emphasise (the first sample against itself),
      // window, zero-pad to the FFT length.
      const double* frame = x.data() + static_cast<int64_t>(f) * hop;
      double mean = 0;
      for (int j = 0; j < win_length; ++j) mean += frame[j];
      mean /= win_length;
      for (int j = 0; j < win_length; ++j) {
        const double previous = frame[j > 0 ? j - 1 : 0] - mean;
        in[j] = ((frame[j] - mean) - 0.97 * previous) * window[static_cast<size_t>(j)];
      }
      std::fill(in + win_length, in + n_fft, 0.0);
    }
    fft.power(s.power.data() + static_cast<size_t>(f) * s.n_bins);
  }
  return s;
}

std::vector<double> apply_filterbank(const Spectrogram& s, const std::vector<double>& filterbank,
                                     int n_mels) {
  // Each band is non-zero over one run of bins; multiply over that run only.
  std::vector<std::pair<int, int>> runs(static_cast<size_t>(n_mels), {0, 0});
  for (int m = 0; m < n_mels; ++m) {
    const double* w = filterbank.data() + static_cast<size_t>(m) * s.n_bins;
    int a = 0, b = s.n_bins;
    while (a < b && w[a] == 0) ++a;
    while (b > a && w[b - 1] == 0) --b;
    runs[static_cast<size_t>(m)] = {a, b};
  }
  std::vector<double> mel(static_cast<size_t>(s.n_frames) * n_mels);
  for (int f = 0; f < s.n_frames; ++f) {
    const double* p = s.power.data() + static_cast<size_t>(f) * s.n_bins;
    for (int m = 0; m < n_mels; ++m) {
      const double* w = filterbank.data() + static_cast<size_t>(m) * s.n_bins;
      double sum = 0;
      for (int k = runs[static_cast<size_t>(m)].first; k < runs[static_cast<size_t>(m)].second; ++k)
        sum += w[k] * p[k];
      mel[static_cast<size_t>(f) * n_mels + m] = sum;
    }
  }
  return mel;
}

// ---- Patches ----------------------------------------------------------------------------------

PatchGrid patch_grid(int n_frames, int n_mels, int patch, int stride) {
  PatchGrid g;
  if (n_frames >= patch && n_mels >= patch) {
    g.freq_patches = (n_mels - patch) / stride + 1;
    g.time_patches = (n_frames - patch) / stride + 1;
  }
  return g;
}

std::vector<float> unfold_patches(const std::vector<float>& spec, int n_frames, int n_mels, int patch,
                                  int stride) {
  const PatchGrid g = patch_grid(n_frames, n_mels, patch, stride);
  const size_t width = static_cast<size_t>(patch) * patch;
  std::vector<float> out(static_cast<size_t>(g.freq_patches) * g.time_patches * width);
  float* o = out.data();
  for (int fi = 0; fi < g.freq_patches; ++fi)
    for (int ti = 0; ti < g.time_patches; ++ti)
      for (int df = 0; df < patch; ++df)
        for (int dt = 0; dt < patch; ++dt)
          *o++ = spec[static_cast<size_t>(ti * stride + dt) * n_mels + static_cast<size_t>(fi * stride + df)];
  return out;
}

}  // namespace tessera::audio
