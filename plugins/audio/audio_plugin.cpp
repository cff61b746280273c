// The "audio" modality plugin: a sound file in, log-mel feature rows out — one row per frame, or
// AST's 16 × 16 spectrogram patches — with time × mel-band provenance and a spectrogram picture.
// Options and their checks live here; the signal path is in audio_dsp.h. See docs/plugins/audio.md.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "audio_dsp.h"
#include "tessera/plugin.hpp"

namespace {

using tessera::plugin::fail;
using tessera::plugin::Options;
using tessera::plugin::Sequence;
namespace audio = tessera::audio;

constexpr const char* kAstMean = "-4.2677393";
constexpr const char* kAstStd = "4.5689974";

const tsr_option_spec kOptions[] = {
    {sizeof(tsr_option_spec), "recipe", TSR_OPT_ENUM, "whisper",
     "front end: whisper (log_mel_spectrogram), kaldi_fbank (torchaudio's Kaldi fbank), ast (fbank, 1024 "
     "frames, "
     "AudioSet normalisation), frames (log-mel frames you configure)",
     "whisper|kaldi_fbank|ast|frames"},
    {sizeof(tsr_option_spec), "rows", TSR_OPT_ENUM, "frames",
     "frames: one row per spectrogram frame; patches: AST's patch_size² patches, frequency-major",
     "frames|patches"},
    {sizeof(tsr_option_spec), "n_mels", TSR_OPT_INT, "0",
     "mel bands; 0: the recipe's (whisper 80, kaldi_fbank and ast 128, frames 80); whisper takes 80 or 128",
     nullptr},
    {sizeof(tsr_option_spec), "target_frames", TSR_OPT_INT, "-1",
     "pad or trim to this many frames; -1: the recipe's (whisper 3000 = 30 s, ast 1024, others none); 0: "
     "none",
     nullptr},
    {sizeof(tsr_option_spec), "sample_rate", TSR_OPT_INT, "0",
     "rate the audio is resampled to, Hz; 0: the recipe's (16000); only recipe frames may change it",
     nullptr},
    {sizeof(tsr_option_spec), "n_fft", TSR_OPT_INT, "0",
     "FFT and frame length in samples, even; 0: the recipe's (400; Kaldi: 400-sample frames in a 512-point "
     "FFT); "
     "only recipe frames may change it",
     nullptr},
    {sizeof(tsr_option_spec), "hop", TSR_OPT_INT, "0",
     "samples between frames; 0: the recipe's (160); only recipe frames may change it", nullptr},
    {sizeof(tsr_option_spec), "window", TSR_OPT_ENUM, "recipe",
     "window; recipe: the recipe's (hann for whisper and frames, hann_symmetric for Kaldi's \"hanning\"); "
     "kaldi_fbank and frames may change it",
     "recipe|hann|hann_symmetric|hamming|hamming_symmetric|povey"},
    {sizeof(tsr_option_spec), "mel_scale", TSR_OPT_ENUM, "recipe",
     "mel filterbank; recipe: the recipe's (slaney for whisper and frames, kaldi for kaldi_fbank and ast); "
     "only "
     "recipe frames may change it",
     "recipe|slaney|htk|kaldi"},
    {sizeof(tsr_option_spec), "log", TSR_OPT_ENUM, "recipe",
     "log of the mel energies; recipe: the recipe's (whisper's own, ln for Kaldi, log10 for frames); only "
     "recipe "
     "frames may change it",
     "recipe|log10|ln|none"},
    {sizeof(tsr_option_spec), "log_floor", TSR_OPT_FLOAT, "0",
     "mel energies are raised to at least this before the log; 0: the recipe's (1e-10; Kaldi: float32 "
     "epsilon); "
     "only recipe frames may change it",
     nullptr},
    {sizeof(tsr_option_spec), "ast_mean", TSR_OPT_FLOAT, kAstMean,
     "recipe ast: features become (x - ast_mean) / (2 · ast_std); AudioSet's by default", nullptr},
    {sizeof(tsr_option_spec), "ast_std", TSR_OPT_FLOAT, kAstStd, "recipe ast: see ast_mean", nullptr},
    {sizeof(tsr_option_spec), "cmvn", TSR_OPT_ENUM, "none",
     "per-utterance normalisation after the log (Kaldi's apply-cmvn on one clip's own statistics): mean "
     "subtracts each mel band's mean over the clip's frames, mean_var also divides by its standard "
     "deviation; none: off (what pretrained checkpoints expect)",
     "none|mean|mean_var"},
    {sizeof(tsr_option_spec), "patch_size", TSR_OPT_INT, "16",
     "rows patches: patch side, in frames and bands", nullptr},
    {sizeof(tsr_option_spec), "patch_stride", TSR_OPT_INT, "10",
     "rows patches: step between patches, in frames and in bands", nullptr},
    {sizeof(tsr_option_spec), "special_rows", TSR_OPT_INT, "0",
     "zero rows with role CLS put first (AST: 2, its CLS and distillation tokens)", nullptr},
    {sizeof(tsr_option_spec), "resample_quality", TSR_OPT_ENUM, "vhq",
     "libsoxr's quality for files at another rate: vhq (28-bit, its best named one), hq (20-bit), mq, lq, qq",
     "vhq|hq|mq|lq|qq"},
    {sizeof(tsr_option_spec), "max_seconds", TSR_OPT_FLOAT, "3600",
     "longer files are refused as bad input (bounds the memory one item takes)", nullptr},
    {sizeof(tsr_option_spec), "augment_time_masks", TSR_OPT_INT, "0",
     "training only (SpecAugment): this many time masks per example, each of up to augment_time_mask_width "
     "frames set to 0",
     nullptr},
    {sizeof(tsr_option_spec), "augment_time_mask_width", TSR_OPT_INT, "0",
     "training only: the widest time mask, in frames (torchaudio's TimeMasking time_mask_param)", nullptr},
    {sizeof(tsr_option_spec), "augment_freq_masks", TSR_OPT_INT, "0",
     "training only (SpecAugment): this many frequency masks per example, each of up to "
     "augment_freq_mask_width mel bands set to 0",
     nullptr},
    {sizeof(tsr_option_spec), "augment_freq_mask_width", TSR_OPT_INT, "0",
     "training only: the widest frequency mask, in mel bands (torchaudio's FrequencyMasking freq_mask_param)",
     nullptr},
    {sizeof(tsr_option_spec), "augment_freq_warp", TSR_OPT_FLOAT, "0",
     "training only (VTLP, Jaitly & Hinton 2013): each example's frequency axis scaled by a factor drawn "
     "from [1 - w, 1 + w], as another speaker's vocal tract length moves the formants; each band takes the "
     "value at its centre frequency / factor, interpolated between bands. 0: off; at most 0.5",
     nullptr},
};

const tsr_plugin_info kInfo = {
    sizeof(tsr_plugin_info),
    "audio",
    "audio",
    "1.1.0",
    "sound files (WAV, FLAC, Ogg) as log-mel frames or AST patches: Whisper, Kaldi fbank, AST",
    kOptions,
    sizeof kOptions / sizeof kOptions[0],
    TSR_INPUT_FILE,
    ".wav|.flac|.ogg|.oga"};

const char* recipe_name(audio::Recipe r) {
  static const char* names[] = {"whisper", "kaldi_fbank", "ast", "frames"};
  return names[static_cast<int>(r)];
}

// A bad option value: the host names the option ("option n_fft: ...") in front of the message.
[[noreturn]] void bad(const std::string& name, const std::string& message) {
  fail(TSR_INVALID_ARGUMENT, message, name);
}

int64_t int_in(const Options& o, const std::string& name, int64_t lo, int64_t hi,
               const std::string& note = "") {
  const int64_t v = o.get_int(name);
  if (v < lo || v > hi)
    bad(name,
        std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]" + note);
  return v;
}

template <class E>
E enum_of(const Options& o, const std::string& name, std::initializer_list<const char*> names) {
  const std::string& v = o.get_string(name);
  int i = 0;
  for (const char* n : names) {
    if (v == n) return static_cast<E>(i);
    ++i;
  }
  std::string known;
  for (const char* n : names) known += (known.empty() ? "" : ", ") + std::string(n);
  bad(name, "unknown value \"" + v + "\"; use one of " + known);
}

// Reads the options into a FrontEnd. Each recipe fixes some settings: an option left at its
// default (0, or "recipe") takes the recipe's value, and so does the recipe's value written out;
// any other value is refused unless the recipe lets that setting change.
class OptionReader {
 public:
  explicit OptionReader(const Options& o) : o_(o) {
    fe_.recipe = enum_of<audio::Recipe>(o, "recipe", {"whisper", "kaldi_fbank", "ast", "frames"});
  }

  audio::FrontEnd front_end() {
    using audio::Recipe;
    const Recipe r = fe_.recipe;
    const bool kaldi = r == Recipe::kaldi_fbank || r == Recipe::ast, free = r == Recipe::frames;
    fe_.sample_rate = fixed_int("sample_rate", 16000, free, audio::kMinSampleRate, audio::kMaxSampleRate);
    if (kaldi) {
      fixed_int("n_fft", 400, false, 0, 0);  // Kaldi's 25 ms frame; its FFT is the next power of two
      fe_.win_length = 400;
      fe_.n_fft = 512;
    } else {
      fe_.n_fft = fixed_int("n_fft", 400, free, 16, 65536);
      if (fe_.n_fft % 2) bad("n_fft", std::to_string(fe_.n_fft) + " is odd; give an even FFT length");
      fe_.win_length = fe_.n_fft;
    }
    fe_.hop = fixed_int("hop", 160, free, 1, fe_.win_length);
    fe_.n_mels = fixed_int("n_mels", kaldi ? 128 : 80, true, 1, std::min(512, fe_.n_fft / 2));
    if (r == Recipe::whisper && fe_.n_mels != 80 && fe_.n_mels != 128)
      bad("n_mels",
          "recipe whisper has filterbanks of 80 or 128 bands (large-v3), not " + std::to_string(fe_.n_mels));
    fe_.framing = kaldi ? audio::Framing::kaldi_snip : audio::Framing::centered;
    fe_.window = fixed_enum("window", kaldi ? audio::Window::hann_symmetric : audio::Window::hann,
                            free || r == Recipe::kaldi_fbank,
                            {"hann", "hann_symmetric", "hamming", "hamming_symmetric", "povey"});
    fe_.mel_scale = fixed_enum("mel_scale", kaldi ? audio::MelScale::kaldi : audio::MelScale::slaney, free,
                               {"htk", "slaney", "kaldi"});
    const audio::LogKind log = r == Recipe::whisper ? audio::LogKind::whisper
                               : kaldi              ? audio::LogKind::ln
                                                    : audio::LogKind::log10;
    fe_.log = fixed_enum("log", log, free, {"whisper's own", "ln", "log10", "none"});

    const double floor = o_.get_float("log_floor");
    const double recipe_floor = kaldi ? static_cast<double>(std::numeric_limits<float>::epsilon()) : 1e-10;
    if (!(floor >= 0) || !std::isfinite(floor))
      bad("log_floor", o_.text("log_floor") + " is not a positive number (0: the recipe's)");
    if (floor != 0 && floor != recipe_floor && !free)
      refuse("log_floor", kaldi ? "float32's epsilon" : "1e-10");
    fe_.log_floor = floor == 0 ? recipe_floor : floor;

    const int64_t target = int_in(o_, "target_frames", -1, 1000000, " (-1: the recipe's, 0: no padding)");
    fe_.target_frames = target >= 0 ? target : r == Recipe::whisper ? 3000 : r == Recipe::ast ? 1024 : 0;
    if (static_cast<double>(fe_.target_frames) * fe_.hop > 86400.0 * fe_.sample_rate)
      bad("target_frames", std::to_string(fe_.target_frames) + " frames of " + std::to_string(fe_.hop) +
                               " samples are more than a day of audio");

    fe_.cmvn = enum_of<audio::Cmvn>(o_, "cmvn", {"none", "mean", "mean_var"});
    fe_.normalise = r == Recipe::ast;
    fe_.mean = o_.get_float("ast_mean");
    fe_.std = o_.get_float("ast_std");
    if (!std::isfinite(fe_.mean)) bad("ast_mean", o_.text("ast_mean") + " is not a finite number");
    if (!(fe_.std > 0) || !std::isfinite(fe_.std))
      bad("ast_std", o_.text("ast_std") + " is not a positive number");
    if (r != Recipe::ast && fe_.mean != std::stod(kAstMean)) only_with_ast("ast_mean");
    if (r != Recipe::ast && fe_.std != std::stod(kAstStd)) only_with_ast("ast_std");
    return fe_;
  }

 private:
  [[noreturn]] void refuse(const std::string& name, const std::string& fixed) const {
    bad(name, "recipe " + std::string(recipe_name(fe_.recipe)) + " fixes it at " + fixed + ", so " +
                  o_.text(name) + " cannot be used; leave the option at its default, or use recipe: frames");
  }
  [[noreturn]] void only_with_ast(const std::string& name) const {
    bad(name, "applies only with recipe: ast (got " + o_.text(name) + " with recipe " +
                  recipe_name(fe_.recipe) + ")");
  }
  int fixed_int(const std::string& name, int recipe_value, bool may_change, int lo, int hi) const {
    const int64_t v = o_.get_int(name);
    if (v == 0 || v == recipe_value) return recipe_value;
    if (!may_change) refuse(name, std::to_string(recipe_value));
    return static_cast<int>(int_in(o_, name, lo, hi, " (0: the recipe's)"));
  }
  template <class E>
  E fixed_enum(const std::string& name, E recipe_value, bool may_change,
               std::initializer_list<const char*> names) const {
    if (o_.get_string(name) == "recipe") return recipe_value;
    const E v = enum_of<E>(o_, name, names);
    if (v != recipe_value && !may_change) refuse(name, names.begin()[static_cast<int>(recipe_value)]);
    return v;
  }

  const Options& o_;
  audio::FrontEnd fe_;
};

class Audio {
 public:
  explicit Audio(const Options& o)
      : extractor_(OptionReader(o).front_end()),
        quality_(enum_of<audio::ResampleQuality>(o, "resample_quality", {"qq", "lq", "mq", "hq", "vhq"})),
        patches_(enum_of<int>(o, "rows", {"frames", "patches"}) == 1),
        max_seconds_(o.get_float("max_seconds")) {
    const std::pair<const char*, int64_t> patch_defaults[] = {{"patch_size", 16}, {"patch_stride", 10}};
    for (const auto& [name, fallback] : patch_defaults)
      if (!patches_ && o.get_int(name) != fallback)
        bad(name, "applies only with rows: patches (got " + o.text(name) + " with rows: frames)");
    patch_ = static_cast<int>(int_in(o, "patch_size", 2, 128));
    stride_ = static_cast<int>(int_in(o, "patch_stride", 1, patch_, " (at most patch_size)"));
    special_ = static_cast<int>(int_in(o, "special_rows", 0, 16));
    const audio::FrontEnd& fe = extractor_.front_end();
    if (patches_ && fe.n_mels < patch_)
      bad("patch_size",
          std::to_string(patch_) + " is more than the " + std::to_string(fe.n_mels) + " mel bands");
    if (patches_ && fe.target_frames > 0 && fe.target_frames < patch_)
      bad("target_frames",
          std::to_string(fe.target_frames) + " frames hold no " + std::to_string(patch_) + "-frame patch");
    if (!(max_seconds_ > 0) || max_seconds_ > 86400)
      bad("max_seconds", o.text("max_seconds") + " is outside (0, 86400]");
    time_masks_ = static_cast<int>(int_in(o, "augment_time_masks", 0, 64));
    time_width_ = static_cast<int>(int_in(o, "augment_time_mask_width", 0, 100000));
    freq_masks_ = static_cast<int>(int_in(o, "augment_freq_masks", 0, 64));
    freq_width_ = static_cast<int>(int_in(o, "augment_freq_mask_width", 0, fe.n_mels, " (the mel bands)"));
    freq_warp_ = o.get_float("augment_freq_warp");
    if (!(freq_warp_ >= 0 && freq_warp_ <= 0.5))
      bad("augment_freq_warp", o.text("augment_freq_warp") + " is outside [0, 0.5]");
    if (time_masks_ > 0 && time_width_ == 0)
      bad("augment_time_mask_width", "must be at least 1 with augment_time_masks " + o.text("augment_time_masks"));
    if (freq_masks_ > 0 && freq_width_ == 0)
      bad("augment_freq_mask_width", "must be at least 1 with augment_freq_masks " + o.text("augment_freq_masks"));
  }

  tsr_encoder_info describe() const {
    const audio::FrontEnd& fe = extractor_.front_end();
    tsr_encoder_info i{};
    i.rows_kind = TSR_ROWS_FEATURES;
    i.width = static_cast<uint32_t>(patches_ ? patch_ * patch_ : fe.n_mels);
    i.causal = 0;
    i.pad_id = -1;
    if (fe.target_frames > 0) {
      const audio::PatchGrid g =
          audio::patch_grid(static_cast<int>(fe.target_frames), fe.n_mels, patch_, stride_);
      i.max_rows =
          special_ + (patches_ ? static_cast<int64_t>(g.freq_patches) * g.time_patches : fe.target_frames);
    }
    i.augments = (time_masks_ > 0 || freq_masks_ > 0 || freq_warp_ > 0) ? 1 : 0;
    return i;
  }

  // Training augmentation on a sequence encode() made: SpecAugment's masks (Park et al. 2019), as
  // torchaudio's TimeMasking and FrequencyMasking apply them to one spectrogram. Each of the
  // augment_time_masks time masks has a width w drawn from [0, min(augment_time_mask_width,
  // frames)] and a start from [0, frames - w]; then each of the augment_freq_masks frequency masks
  // the same over the n_mels bands; every value in a masked frame or band becomes 0 (torchaudio's
  // mask_value). Draws in that order: width then start, time masks first. Frame rows: the
  // content rows are the frames, in order. Patch rows: each value is a copy of one spectrogram cell
  // (frame ti·stride + dt, band fi·stride + df, unfold_patches' order) and is masked with its
  // cell, so overlapping patches agree; the frames are those the patches cover. CLS rows are kept.
  // With augment_freq_warp w, a factor alpha is drawn after the masks (uniform in [1 - w, 1 + w],
  // 2^-24 steps) and every frame is warped (warp_bands) before the masks are applied; patch rows
  // are warped as their spectrogram, over the bands the patches cover.
  void augment(const tsr_rows& in, uint64_t seed, float* out) const {
    const int64_t n = in.n_rows, width = in.width;
    const int n_mels = extractor_.front_end().n_mels;
    const bool patches = in.grid_rows > 0 && in.grid_cols > 0;
    if (patches != patches_ || width != (patches_ ? static_cast<int64_t>(patch_) * patch_ : n_mels))
      fail(TSR_INVALID_ARGUMENT, "augment: the rows are not this encoder's " +
                                     std::string(patches_ ? "patches" : "frames") + " (width " +
                                     std::to_string(width) + ")");
    std::copy(in.features, in.features + n * width, out);
    int64_t frames = 0;
    if (patches)
      frames = static_cast<int64_t>(in.grid_cols - 1) * stride_ + patch_;
    else
      for (int64_t r = 0; r < n; ++r) frames += in.roles[r] == TSR_ROLE_CONTENT;
    std::vector<uint8_t> frame_masked(static_cast<size_t>(frames), 0), band_masked(static_cast<size_t>(n_mels), 0);
    tessera::plugin::Draws draws(seed);
    auto draw = [&draws](int count, int64_t widest, int64_t size, std::vector<uint8_t>& masked) {
      for (int k = 0; k < count; ++k) {
        const int64_t w = draws.between(0, std::min(widest, size));
        const int64_t start = draws.between(0, size - w);
        std::fill(masked.begin() + start, masked.begin() + start + w, uint8_t{1});
      }
    };
    draw(time_masks_, time_width_, frames, frame_masked);
    draw(freq_masks_, freq_width_, n_mels, band_masked);
    if (freq_warp_ > 0) {
      const double u = static_cast<double>(draws.between(0, (int64_t{1} << 24) - 1)) / static_cast<double>(int64_t{1} << 24);
      const audio::FrontEnd& fe = extractor_.front_end();
      const std::vector<double> sources =
          audio::warped_band_sources(fe.mel_scale, n_mels, fe.sample_rate, 1 - freq_warp_ + 2 * freq_warp_ * u);
      if (!patches) {
        for (int64_t r = 0; r < n; ++r)
          if (in.roles[r] == TSR_ROLE_CONTENT) audio::warp_bands(out + r * width, n_mels, 1, sources);
      } else {
        // The cells the patches cover, (frames, bands) time-major; warped; copied back to every patch.
        const int64_t bands = static_cast<int64_t>(in.grid_rows - 1) * stride_ + patch_;
        std::vector<float> cells(static_cast<size_t>(frames * bands), 0.0f);
        auto each_cell = [&](auto&& visit) {
          for (int64_t r = 0; r < n; ++r) {
            if (in.roles[r] != TSR_ROLE_CONTENT) continue;
            const int64_t fi = in.positions[2 * r], ti = in.positions[2 * r + 1];
            for (int64_t df = 0; df < patch_; ++df)
              for (int64_t dt = 0; dt < patch_; ++dt)
                visit(out[r * width + df * patch_ + dt], cells[static_cast<size_t>((ti * stride_ + dt) * bands + fi * stride_ + df)]);
          }
        };
        each_cell([](float& patch_value, float& cell) { cell = patch_value; });
        for (int64_t t = 0; t < frames; ++t) audio::warp_bands(cells.data() + t * bands, bands, 1, sources);
        each_cell([](float& patch_value, float& cell) { patch_value = cell; });
      }
    }
    int64_t frame = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (in.roles[r] != TSR_ROLE_CONTENT) continue;
      float* o = out + r * width;
      if (!patches) {
        if (frame_masked[static_cast<size_t>(frame++)]) std::fill(o, o + width, 0.0f);
        for (int64_t b = 0; b < n_mels; ++b)
          if (band_masked[static_cast<size_t>(b)]) o[b] = 0.0f;
        continue;
      }
      const int64_t fi = in.positions[2 * r], ti = in.positions[2 * r + 1];
      for (int64_t df = 0; df < patch_; ++df)
        for (int64_t dt = 0; dt < patch_; ++dt) {
          const int64_t t = ti * stride_ + dt, b = fi * stride_ + df;
          const bool masked = (t >= 0 && t < frames && frame_masked[static_cast<size_t>(t)]) ||
                              (b >= 0 && b < n_mels && band_masked[static_cast<size_t>(b)]);
          if (masked) o[df * patch_ + dt] = 0.0f;
        }
    }
  }

  std::vector<Sequence> encode(const tessera::plugin::Item& item) {
    const std::string id(item.id);
    audio::Features f;
    try {
      const audio::Decoded d = audio::decode(item.data, item.size, max_seconds_);
      const int rate = extractor_.front_end().sample_rate;
      const std::vector<double> x = audio::resample(d.samples, d.sample_rate, rate, quality_);
      if (x.empty())
        fail(TSR_BAD_INPUT, id + ": " + std::to_string(d.samples.size()) + " samples at " +
                                std::to_string(d.sample_rate) + " Hz are less than one at " +
                                std::to_string(rate) + " Hz");
      f = extractor_.compute(x);
    } catch (const audio::AudioError& e) {
      fail(TSR_BAD_INPUT, id + ": " + e.what());
    }
    Sequence s;
    s.kind = TSR_ROWS_FEATURES;
    s.width = static_cast<uint32_t>(patches_ ? patch_ * patch_ : f.n_mels);
    const std::vector<float> zeros(s.width, 0.0f);
    for (int k = 0; k < special_; ++k)
      s.add_features(zeros.data(), TSR_ROLE_CLS, tessera::plugin::no_provenance(), k);
    if (patches_)
      add_patches(id, f, s);
    else
      add_frames(f, s);
    add_picture(f, s);
    return {std::move(s)};
  }

 private:
  // Row k + f is frame f: position (k + f, -1), provenance [t0, t1) s × [0, n_mels) bands.
  void add_frames(const audio::Features& f, Sequence& s) const {
    for (int t = 0; t < f.n_frames; ++t) {
      const auto [t0, t1] = extractor_.frame_seconds(t, f);
      s.add_features(f.values.data() + static_cast<size_t>(t) * f.n_mels, TSR_ROLE_CONTENT,
                     tessera::plugin::time_freq_box(t0, t1, 0, f.n_mels), special_ + t);
    }
  }

  // Patches in ASTPatchEmbeddings' order: grid row = frequency patch (0 = lowest bands), grid
  // column = time patch; each patch's values as the Conv2d kernel reads them (see unfold_patches).
  void add_patches(const std::string& id, const audio::Features& f, Sequence& s) const {
    const audio::PatchGrid g = audio::patch_grid(f.n_frames, f.n_mels, patch_, stride_);
    if (g.time_patches == 0)
      fail(TSR_BAD_INPUT, id + ": " + std::to_string(f.n_frames) + " frames are too few for one " +
                              std::to_string(patch_) + "-frame patch (set target_frames to pad short clips)");
    const std::vector<float> p = audio::unfold_patches(f.values, f.n_frames, f.n_mels, patch_, stride_);
    s.grid_rows = static_cast<uint32_t>(g.freq_patches);
    s.grid_cols = static_cast<uint32_t>(g.time_patches);
    for (int fi = 0; fi < g.freq_patches; ++fi)
      for (int ti = 0; ti < g.time_patches; ++ti) {
        const double t0 = extractor_.frame_seconds(ti * stride_, f).first;
        const double t1 = extractor_.frame_seconds(ti * stride_ + patch_ - 1, f).second;
        const size_t index = static_cast<size_t>(fi) * g.time_patches + ti;
        s.add_features(p.data() + index * s.width, TSR_ROLE_CONTENT,
                       tessera::plugin::time_freq_box(t0, t1, fi * stride_, fi * stride_ + patch_), fi, ti);
      }
  }

  // The spectrogram of the audio itself (padding left out) as 8-bit grey: x = time over
  // [0, duration), one column per hop (at most kMaxColumns, each showing the frame whose centre is
  // nearest), y = mel band with the lowest at the bottom; black = the smallest feature value.
  void add_picture(const audio::Features& f, Sequence& s) const {
    static constexpr int64_t kMaxColumns = 4096;
    const audio::FrontEnd& fe = extractor_.front_end();
    if (f.content_frames == 0) return;
    const double duration = static_cast<double>(f.n_samples) / fe.sample_rate;
    const int64_t width = std::clamp<int64_t>((f.n_samples + fe.hop - 1) / fe.hop, 1, kMaxColumns);
    const int height = f.n_mels;
    const float* v = f.values.data();
    const auto [lo, hi] = std::minmax_element(v, v + static_cast<size_t>(f.content_frames) * f.n_mels);
    const double scale = *hi > *lo ? 255.0 / (*hi - *lo) : 0.0;
    s.picture.assign(static_cast<size_t>(width) * height, 0);
    for (int64_t c = 0; c < width; ++c) {
      const double t = (static_cast<double>(c) + 0.5) * duration / static_cast<double>(width);
      const double centre_offset = fe.framing == audio::Framing::centered ? 0.0 : fe.win_length / 2.0;
      const int64_t frame = std::clamp<int64_t>(std::llround((t * fe.sample_rate - centre_offset) / fe.hop),
                                                0, f.content_frames - 1);
      for (int y = 0; y < height; ++y) {
        const float value = v[static_cast<size_t>(frame) * f.n_mels + static_cast<size_t>(height - 1 - y)];
        s.picture[static_cast<size_t>(y) * width + c] =
            static_cast<uint8_t>(std::lround((value - *lo) * scale));
      }
    }
    s.picture_width = static_cast<uint32_t>(width);
    s.picture_height = static_cast<uint32_t>(height);
    s.picture_channels = 1;
    s.picture_x0 = 0;
    s.picture_x1 = duration;
    s.picture_y0 = 0;
    s.picture_y1 = height;
  }

  audio::Extractor extractor_;
  audio::ResampleQuality quality_;
  bool patches_;
  double max_seconds_;
  int patch_ = 16, stride_ = 10, special_ = 0;
  int time_masks_ = 0, time_width_ = 0, freq_masks_ = 0, freq_width_ = 0;  // augment()
  double freq_warp_ = 0;
};

}  // namespace

TESSERA_DEFINE_PLUGIN(Audio, kInfo)
