// The audio plugin's signal path, private to plugins/audio and its test: decode a sound file held
// in memory (libsndfile), mix down to mono, resample (libsoxr), frame, window, FFT (FFTW), mel
// filterbanks and the log-mel recipes. It knows nothing of the plugin ABI; errors are thrown as
// AudioError (a message without the item id, which the plugin adds) and never escape the plugin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera::audio {

// A problem with the input itself (not a bug): the plugin reports it as TSR_BAD_INPUT.
class AudioError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- Decoding ---------------------------------------------------------------------------------

// The sample rates a file may declare; outside this range the file is refused as corrupt.
inline constexpr int kMinSampleRate = 1000;
inline constexpr int kMaxSampleRate = 768000;

struct Decoded {
  std::vector<double> samples;  // (N) mono: the mean of the channels, in [-1, 1] for integer PCM
  int sample_rate = 0;          // as the file declares it, Hz
  int channels = 0;             // before the mix-down
  std::string format;           // "WAV 16-bit PCM", "FLAC 24-bit", "Ogg Vorbis", ...
};

// Decodes a whole sound file (WAV, FLAC, Ogg Vorbis/Opus, or anything else libsndfile reads)
// from memory. Integer PCM is scaled by 1/2^(bits-1), as libsndfile, soundfile and Whisper's
// loader do; float data is taken as it is. Refuses (AudioError) empty or unrecognised data, a
// WAV whose header promises more sample data than the file holds, a FLAC that stops decoding
// early, 0 channels, a rate outside [kMinSampleRate, kMaxSampleRate], non-finite samples, no
// samples at all, and audio longer than max_seconds.
Decoded decode(const uint8_t* data, size_t size, double max_seconds);

// Checks a RIFF/RIFX/RF64 WAVE header against the bytes present (libsndfile silently shortens a
// data chunk that runs past the end of the file, so a truncated WAV would otherwise pass).
// Does nothing for other formats. Throws AudioError naming the chunk and both sizes.
void check_wav_header(const uint8_t* data, size_t size);

// ---- Resampling -------------------------------------------------------------------------------

enum class ResampleQuality { quick, low, medium, high, very_high };  // libsoxr's QQ, LQ, MQ, HQ, VHQ

// Band-limited resampling with libsoxr (linear phase, soxr_oneshot). The output has
// round(N · out_rate / in_rate) samples. Returns x unchanged when the rates are equal.
std::vector<double> resample(const std::vector<double>& x, int in_rate, int out_rate, ResampleQuality q);

// ---- Windows, filterbanks ---------------------------------------------------------------------

enum class Window { hann, hann_symmetric, hamming, hamming_symmetric, povey };
// Length-n window. "periodic" ones (hann, hamming) are torch.*_window(n, periodic=True); the
// symmetric ones are Kaldi's (periodic=False); povey is Kaldi's hann_symmetric^0.85.
std::vector<double> make_window(Window w, int n);

enum class MelScale { htk, slaney, kaldi };
// A mel filterbank as dense weights (n_mels, n_bins) over the FFT bins k · sample_rate / n_fft,
// k in [0, n_bins), n_bins = n_fft / 2 + 1.
//   slaney: librosa.filters.mel(norm="slaney", htk=False) as Whisper ships it: Slaney's scale,
//           triangles in Hz, each scaled to unit area (2 / band width); f in [0, sample_rate / 2].
//   htk:    2595 · log10(1 + f / 700), triangles in Hz, peak 1 (torchaudio melscale_fbanks
//           norm=None); f in [0, sample_rate / 2].
//   kaldi:  1127 · ln(1 + f / 700), triangles built in mel space on the bins (Kaldi's MelBanks,
//           torchaudio.compliance.kaldi.get_mel_banks), peak 1, the Nyquist bin weighted 0;
//           f in [20 Hz, sample_rate / 2] (Kaldi's defaults).
std::vector<double> mel_filterbank(MelScale scale, int n_mels, int n_fft, int sample_rate);

// VTLP's frequency warp (Jaitly & Hinton 2013) on a mel axis: a vocal tract shorter by a factor
// alpha moves every formant from f to alpha · f, so after the warp band m holds what the spectrum
// had at centre(m) / alpha. Returns, for each band m, that frequency's position on the band axis
// (band k's centre is at k; fractional between centres, below 0 or above n_mels - 1 off the ends),
// for the filterbank mel_filterbank(scale, n_mels, ., sample_rate) builds. alpha 1 gives m itself.
std::vector<double> warped_band_sources(MelScale scale, int n_mels, int sample_rate, double alpha);
// One frame's n bands (value k at v[k · step]) replaced by their values at `sources` (the first n),
// linearly interpolated between bands, each source clamped to [0, n - 1].
void warp_bands(float* v, int64_t n, int64_t step, const std::vector<double>& sources);

// ---- Spectrograms -----------------------------------------------------------------------------

// Real FFT of a fixed size through FFTW (double precision, FFTW_ESTIMATE: deterministic). One per
// encoder; not to be shared between threads. Planning is made thread-safe process-wide.
class RealFft {
 public:
  explicit RealFft(int n);
  ~RealFft();
  RealFft(const RealFft&) = delete;
  RealFft& operator=(const RealFft&) = delete;
  int size() const { return n_; }
  double* input();  // n_ values to fill before power()
  // |X_k|^2 for k in [0, n/2] into out (n/2 + 1 values).
  void power(double* out);

 private:
  int n_;
  struct Plan;
  std::unique_ptr<Plan> plan_;
};

// How frames are cut from the signal.
enum class Framing {
  centered,    // torch.stft(center=True, pad_mode="reflect"): frame f is centred on sample f · hop;
               // 1 + N / hop frames; window length = FFT length = n_fft
  kaldi_snip,  // Kaldi with snip_edges: frame f is samples [f · hop, f · hop + win_length);
               // 1 + (N - win_length) / hop frames; DC offset removed, pre-emphasis 0.97,
               // zero-padded to the FFT length
};

struct Spectrogram {
  int n_frames = 0, n_bins = 0;
  std::vector<double> power;  // (n_frames, n_bins) |STFT|^2
};

// The power spectrogram of x. Throws AudioError when x is too short for one frame (centered:
// reflection needs more than n_fft / 2 samples; kaldi_snip: at least win_length samples).
Spectrogram power_spectrogram(const std::vector<double>& x, Framing framing, int win_length, int hop,
                              const std::vector<double>& window, RealFft& fft);

// mel (n_frames, n_mels) = power (n_frames, n_bins) · filterbank (n_mels, n_bins)ᵀ.
std::vector<double> apply_filterbank(const Spectrogram& s, const std::vector<double>& filterbank, int n_mels);

// ---- Patches ----------------------------------------------------------------------------------

// AST's patch grid over a (T, F) = (frames, mel bands) spectrogram, time-major as the plugin
// stores it. HF's ASTPatchEmbeddings transposes the input to (F, T) and runs a Conv2d with kernel
// (patch, patch) and stride (stride, stride) over it, then flattens the (F', T') output: so patch
// p = fi · T' + ti (frequency-major), and its patch · patch values are in the kernel's order,
// element (df, dt) at df · patch + dt holding spectrogram[ti · stride + dt][fi · stride + df].
struct PatchGrid {
  int freq_patches = 0, time_patches = 0;  // F' = (F - patch) / stride + 1, T' likewise
};
PatchGrid patch_grid(int n_frames, int n_mels, int patch, int stride);
// (F' · T', patch²) patches of spec (n_frames, n_mels), in ASTPatchEmbeddings' order.
std::vector<float> unfold_patches(const std::vector<float>& spec, int n_frames, int n_mels, int patch,
                                  int stride);

// ---- Recipes ----------------------------------------------------------------------------------

enum class Recipe { whisper, kaldi_fbank, ast, frames };
enum class LogKind { whisper, ln, log10, none };  // whisper: log10, clamp to max - 8, (x + 4) / 4
// Per-utterance normalisation of the log-mel bands (Kaldi's apply-cmvn with one utterance's stats):
// each band's mean over the clip's content frames is subtracted (mean), and the band is also
// divided by its standard deviation there (mean_var).
enum class Cmvn { none, mean, mean_var };

// Every setting of the log-mel front end, resolved from the plugin's options (recipe.cpp says
// what each recipe fixes).
struct FrontEnd {
  Recipe recipe = Recipe::whisper;
  int sample_rate = 16000;
  int n_fft = 400;       // FFT length
  int win_length = 400;  // samples per frame (= n_fft when centred)
  int hop = 160;
  int n_mels = 80;
  Window window = Window::hann;
  MelScale mel_scale = MelScale::slaney;
  Framing framing = Framing::centered;
  LogKind log = LogKind::whisper;
  double log_floor = 1e-10;
  int64_t target_frames = 0;  // 0: as many frames as the audio gives; > 0: padded or trimmed to this
  Cmvn cmvn = Cmvn::none;     // after the log, before padding rows and the AST normalisation
  bool normalise = false;     // ast: (x - mean) / (2 · std)
  double mean = 0, std = 1;
};

// Per-utterance CMVN in place on (n_frames, n_mels) time-major values: each band's mean (and, with
// mean_var, standard deviation, floored at 1e-10) over the first `stats_frames` frames, applied to
// all n_frames.
void apply_cmvn(std::vector<double>& values, int n_frames, int n_mels, int stats_frames, Cmvn cmvn);

struct Features {
  int n_frames = 0, n_mels = 0;
  int content_frames = 0;     // frames before any padding (their centre lies inside the audio)
  int64_t n_samples = 0;      // the audio at the front end's rate, before padding or trimming
  std::vector<float> values;  // (n_frames, n_mels) final features, time-major
};

// One front end: the window, the filterbank and the FFT plan are made once.
class Extractor {
 public:
  explicit Extractor(const FrontEnd& fe);
  const FrontEnd& front_end() const { return fe_; }
  // x: mono samples at fe.sample_rate. Throws AudioError when x is too short for the recipe.
  Features compute(const std::vector<double>& x);
  // The samples frame f was computed from, [first, last), in seconds, clipped at 0 and, for
  // centred frames, at the end of the (padded) signal.
  std::pair<double, double> frame_seconds(int f, const Features& features) const;
  // The centre of frame f, in seconds.
  double frame_centre(int f) const;

 private:
  FrontEnd fe_;
  std::vector<double> window_, filterbank_;
  RealFft fft_;
};

}  // namespace tessera::audio
