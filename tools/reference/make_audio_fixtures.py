#!/usr/bin/env python3
"""Writes tests/data/audio/: short real recordings from Debian packages, files derived from them
(FLAC, 16/24/32-bit and float WAV, a stereo mix), and the reference features the audio plugin is
tested against: Whisper's log_mel_spectrogram, torchaudio's Kaldi fbank, HF's ASTFeatureExtractor,
HF's audio_utils spectrogram for the `frames` recipe, libsoxr and SciPy resampling, and the order of
HF ASTPatchEmbeddings' patches. Developer tool only; the build and the tests never run it.

Needs Debian packages pocketsphinx-testdata, alsa-utils, sound-theme-freedesktop, espeak-ng, and a
Python with numpy, torch, transformers, openai-whisper, scipy, soxr, soundfile and torchaudio's
compliance/kaldi.py (see tests/data/audio/README.md for the exact environment). Run from the
repository root:  .venv-audio/bin/python tools/reference/make_audio_fixtures.py
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import scipy
import scipy.signal
import soundfile
import soxr
import torch

OUT = os.path.join("tests", "data", "audio")
SR = 16000
AST_MEAN, AST_STD = -4.2677393, 4.5689974


def load_torchaudio_kaldi():
    """torchaudio.compliance.kaldi is pure Python on torch ops, but `import torchaudio` loads a
    compiled extension built for another torch. Load the one file by path, with a stand-in
    `torchaudio` module (kaldi.py uses it only for MFCC's DCT), and register it where HF's
    ASTFeatureExtractor imports it from, so that the extractor takes its torchaudio path."""
    spec = importlib.util.find_spec("torchaudio")
    if spec is None:
        sys.exit("torchaudio is not installed: pip install --no-deps torchaudio==2.0.2 (see README)")
    path = os.path.join(os.path.dirname(spec.origin), "compliance", "kaldi.py")
    stub, compliance = types.ModuleType("torchaudio"), types.ModuleType("torchaudio.compliance")
    stub.__spec__ = spec  # transformers asks find_spec("torchaudio") whether it is installed
    sys.modules["torchaudio"], sys.modules["torchaudio.compliance"] = stub, compliance
    kspec = importlib.util.spec_from_file_location("torchaudio.compliance.kaldi", path)
    kaldi = importlib.util.module_from_spec(kspec)
    sys.modules["torchaudio.compliance.kaldi"] = kaldi
    kspec.loader.exec_module(kaldi)
    stub.compliance, compliance.kaldi = compliance, kaldi
    stub.__version__ = "2.0.2 (compliance/kaldi.py only)"
    return kaldi


ta_kaldi = load_torchaudio_kaldi()
import transformers  # noqa: E402  (after the torchaudio stand-in)
import whisper  # noqa: E402
import whisper.audio as wa  # noqa: E402
from transformers import ASTConfig, ASTFeatureExtractor  # noqa: E402
from transformers.audio_utils import mel_filter_bank, spectrogram, window_function  # noqa: E402
from transformers.models.audio_spectrogram_transformer import (  # noqa: E402
    feature_extraction_audio_spectrogram_transformer as ast_fe,
)
from transformers.models.audio_spectrogram_transformer.modeling_audio_spectrogram_transformer import (  # noqa: E402
    ASTPatchEmbeddings,
)

manifest = {"clips": {}, "derived": {}, "frames": {}, "patches": {}}


def save(name, array, dtype=np.float32):
    np.save(os.path.join(OUT, name), np.ascontiguousarray(array, dtype=dtype))
    return name


def read(path):
    """Samples as the plugin decodes them: float64, integer PCM / 2^(bits-1), channels averaged."""
    x, rate = soundfile.read(path, dtype="float64", always_2d=True)
    return x.mean(axis=1), rate, x.shape[1]


def write(path, data, subtype, fmt="WAV"):
    """soundfile.write without the PEAK chunk libsndfile adds to float files (it holds a timestamp,
    which would make every run's files differ)."""
    channels = 1 if data.ndim == 1 else data.shape[1]
    with soundfile.SoundFile(path, "w", SR, channels, subtype, format=fmt) as f:
        soundfile._snd.sf_command(f._file, 0x1050, soundfile._ffi.NULL, 0)  # SFC_SET_ADD_PEAK_CHUNK, false
        f.write(data)


def to_16k(x, rate):
    return x if rate == SR else soxr._resample_oneshot(x, rate, SR, "VHQ")


def whisper_ref(x, n_mels=80, pad=False):
    audio = x.astype(np.float32)
    if pad:
        audio = wa.pad_or_trim(audio)
    return wa.log_mel_spectrogram(audio, n_mels=n_mels).numpy().T  # (T, n_mels), the plugin's rows


def kaldi_ref(x):
    """torchaudio's Kaldi fbank, the AST recipe's settings, run in float64."""
    wave = torch.from_numpy(x.astype(np.float64))[None]
    return ta_kaldi.fbank(wave, sample_frequency=SR, num_mel_bins=128, frame_length=25, frame_shift=10,
                          window_type="hanning", dither=0.0, htk_compat=True, use_energy=False).numpy()


def ast_ref(x, max_length=1024):
    fe = ASTFeatureExtractor(max_length=max_length)
    return fe(x.astype(np.float32), sampling_rate=SR, return_tensors="np").input_values[0]


def whisper_ref64(x, n_mels=80):
    """whisper.log_mel_spectrogram's steps in float64 (Whisper itself runs them in float32)."""
    audio = torch.from_numpy(x.astype(np.float64))
    stft = torch.stft(audio, wa.N_FFT, wa.HOP_LENGTH, window=torch.hann_window(wa.N_FFT, dtype=torch.float64),
                      return_complex=True)
    mel = wa.mel_filters("cpu", n_mels).double() @ (stft[..., :-1].abs() ** 2)
    log = torch.clamp(mel, min=1e-10).log10()
    return ((torch.maximum(log, log.max() - 8.0) + 4.0) / 4.0).numpy().T


def ast_ref64(x):
    """HF ASTFeatureExtractor's own steps (torchaudio fbank, padding, normalisation) fed float64;
    its __call__ casts to float32 first."""
    fe = ASTFeatureExtractor()
    return fe.normalize(fe._extract_fbank_features(x.astype(np.float64), fe.max_length))


def ast_numpy_ref(x):
    """HF's own numpy Kaldi-style path (what it uses without torchaudio), for comparison only."""
    real = ast_fe.is_speech_available
    ast_fe.is_speech_available = lambda: False
    try:
        return ast_ref(x)
    finally:
        ast_fe.is_speech_available = real


def add_clip(name, path, source, licence, whisper_pad=False, kaldi=False, mels128=False, scipy_ref=False,
             float64=False):
    file = name + os.path.splitext(path)[1]
    if os.path.dirname(path) != OUT:
        shutil.copyfile(path, os.path.join(OUT, file))
    x, rate, channels = read(path)
    x16 = to_16k(x, rate)
    entry = {"file": file, "source": source + ": " + path, "licence": licence, "sample_rate": rate,
             "channels": channels, "frames": int(len(x)), "samples_16k": int(len(x16))}
    if rate != SR:
        entry["resampled"] = save(f"{name}.soxr16k.npy", x16)
    if scipy_ref:
        up, down = SR // np.gcd(SR, rate), rate // np.gcd(SR, rate)
        y = scipy.signal.resample_poly(x, up, down)
        entry["scipy16k"] = save(f"{name}.scipy16k.npy", y)
        n = min(len(y), len(x16))
        entry["soxr_vs_scipy_max_abs"] = float(np.abs(y[:n] - x16[:n])[100:-100].max())
    entry["whisper"] = save(f"{name}.whisper.npy", whisper_ref(x16))
    if mels128:
        entry["whisper128"] = save(f"{name}.whisper128.npy", whisper_ref(x16, 128))
    if whisper_pad:
        full = whisper_ref(x16, 80, pad=True)
        keep = -(-len(x16) // 160) + 3
        tail = full[keep:]
        assert tail.shape[0] == 3000 - keep and np.all(tail == tail.flat[0]), "padded frames are not constant"
        entry["whisper_pad"] = save(f"{name}.whisper_pad.npy", full[:keep])
        entry["whisper_pad_frames"], entry["whisper_pad_tail"] = int(full.shape[0]), float(tail.flat[0])
        trimmed = wa.log_mel_spectrogram(wa.pad_or_trim(x16.astype(np.float32), 50 * 160)).numpy().T
        entry["whisper_trim50"] = save(f"{name}.whisper_trim50.npy", trimmed)
    ast = ast_ref(x16)
    content = kaldi_ref(x16).shape[0]
    assert np.all(ast[content:] == np.float32((0 - AST_MEAN) / (2 * AST_STD))), "AST padding rows"
    entry["ast"] = save(f"{name}.ast.npy", ast[:content])
    entry["ast_frames"], entry["ast_tail"] = int(ast.shape[0]), float(ast[-1, 0])
    entry["ast_numpy_vs_torchaudio_max_abs"] = float(np.abs(ast_numpy_ref(x16) - ast).max())
    if kaldi:
        entry["kaldi"] = save(f"{name}.kaldi.npy", kaldi_ref(x16))
    if float64:  # where the float32 references' own rounding shows (quiet bands near the log floor)
        w64, a64 = whisper_ref64(x16), ast_ref64(x16)
        entry["whisper64"], entry["ast64"] = save(f"{name}.whisper64.npy", w64), save(f"{name}.ast64.npy", a64[:content])
        entry["whisper_float32_vs_float64_max_abs"] = float(np.abs(whisper_ref(x16) - w64).max())
        entry["ast_float32_vs_float64_max_abs"] = float(np.abs(ast - a64).max())
    manifest["clips"][name] = entry
    return x16


def espeak(text, voice, name):
    path = os.path.join(OUT, name)
    subprocess.run(["espeak-ng", "-v", voice, "-s", "140", "-w", path, text], check=True)
    return path


def write_derived(x):
    """cards_001 × 0.7 at several depths, so that formats can be compared within their quantisation."""
    g = x * 0.7
    files = {
        "cards_001_g07_f32.wav": (g.astype(np.float32), "FLOAT", "WAV"),
        "cards_001_g07_s32.wav": (np.round(g * 2**31).astype(np.int32), "PCM_32", "WAV"),
        "cards_001_g07_s24.wav": (np.round(g * 2**23).astype(np.int32) << 8, "PCM_24", "WAV"),
        "cards_001_g07_s24.flac": (np.round(g * 2**23).astype(np.int32) << 8, "PCM_24", "FLAC"),
        "cards_001_g07_s16.wav": (np.round(g * 2**15).astype(np.int16), "PCM_16", "WAV"),
        "cards_001.flac": (np.round(x * 2**15).astype(np.int16), "PCM_16", "FLAC"),
    }
    for name, (data, subtype, fmt) in files.items():
        write(os.path.join(OUT, name), data, subtype, fmt)
        manifest["derived"][name] = {"from": "cards_001.wav", "gain": 1.0 if name == "cards_001.flac" else 0.7,
                                     "subtype": subtype, "format": fmt}
    # Stereo: left = cards_001, right = cards_001 reversed at half level; and its mean as float32
    # (exact: (a + b) / 2 of 16-bit values fits float32's mantissa).
    left = np.round(x * 2**15).astype(np.int16)
    right = (left[::-1].astype(np.int32) // 2).astype(np.int16)
    write(os.path.join(OUT, "stereo_mix.wav"), np.stack([left, right], 1), "PCM_16")
    mono = (left.astype(np.float64) + right.astype(np.float64)) / 2 / 2**15
    write(os.path.join(OUT, "stereo_mix_mean.wav"), mono.astype(np.float32), "FLOAT")
    manifest["derived"]["stereo_mix.wav"] = {"from": "cards_001.wav", "left": "cards_001", "right": "reversed, halved"}
    manifest["derived"]["stereo_mix_mean.wav"] = {"from": "stereo_mix.wav", "subtype": "FLOAT", "is": "(L + R) / 2"}


def frames_refs(x):
    """The `frames` recipe against HF audio_utils.spectrogram (float64 numpy, center=True, reflect)."""
    variants = {
        # name: (n_fft, hop, n_mels, mel_scale, window, periodic, log)
        "htk_hamming_512_128_64_ln": (512, 128, 64, "htk", "hamming", True, "log"),
        "kaldi_povey_400_160_40_log10": (400, 160, 40, "kaldi", "povey", False, "log10"),
        "slaney_hannsym_256_100_32_none": (256, 100, 32, "slaney", "hann", False, None),
    }
    for name, (n_fft, hop, n_mels, scale, win, periodic, log) in variants.items():
        if scale == "kaldi":  # Kaldi's construction on n_fft / 2 bins from 20 Hz, Nyquist bin 0
            fb = mel_filter_bank(n_fft // 2, n_mels, 20.0, SR / 2, SR, None, "kaldi", triangularize_in_mel_space=True)
            fb = np.pad(fb, ((0, 1), (0, 0)))
        else:
            fb = mel_filter_bank(n_fft // 2 + 1, n_mels, 0.0, SR / 2, SR, "slaney" if scale == "slaney" else None, scale)
        spec = spectrogram(x, window_function(n_fft, win, periodic=periodic), frame_length=n_fft, hop_length=hop,
                           power=2.0, center=True, pad_mode="reflect", mel_filters=fb, mel_floor=1e-10, log_mel=log)
        manifest["frames"][name] = {
            "file": save(f"cards_001.frames.{name}.npy", spec.T), "n_fft": n_fft, "hop": hop, "n_mels": n_mels,
            "mel_scale": scale, "window": win + ("" if periodic or win == "povey" else "_symmetric"),
            "log": {"log": "ln", "log10": "log10", None: "none"}[log]}


def patch_order():
    """HF ASTPatchEmbeddings on an index map: a Conv2d whose output channel d is the one-hot kernel
    element d reads each patch back in AST's order. Saved for max_length 128 (144 patches)."""
    out = {}
    for frames in (128, 1024):
        cfg = ASTConfig(hidden_size=256, patch_size=16, frequency_stride=10, time_stride=10, max_length=frames,
                        num_mel_bins=128)
        pe = ASTPatchEmbeddings(cfg)
        with torch.no_grad():
            pe.projection.weight.zero_()
            pe.projection.bias.zero_()
            for d in range(256):
                pe.projection.weight[d, 0, d // 16, d % 16] = 1.0
            index = torch.arange(frames * 128, dtype=torch.float32).reshape(1, frames, 128)  # (B, T, F)
            patches = pe(index)[0].numpy()
        assert np.all(patches == np.round(patches))
        f_out = (128 - 16) // 10 + 1
        t_out = (frames - 16) // 10 + 1
        assert patches.shape == (f_out * t_out, 256)
        out[str(frames)] = {"freq_patches": f_out, "time_patches": t_out, "patches": int(patches.shape[0])}
        if frames == 128:
            out["128"]["index"] = save("ast_patch_index_128x128.npy", patches, np.int32)
    manifest["patches"] = out


def main():
    os.makedirs(OUT, exist_ok=True)
    ps = "/usr/share/pocketsphinx/test/data"
    bsd = "BSD-2-Clause (pocketsphinx-testdata, Carnegie Mellon University)"
    cards = add_clip("cards_001", f"{ps}/cards/001.wav", "Debian pocketsphinx-testdata 0.8+5prealpha+1-15", bsd,
                     whisper_pad=True, kaldi=True, mels128=True)
    add_clip("librivox_0880", f"{ps}/librivox/sense_and_sensibility_01_austen_64kb-0880.wav",
             "Debian pocketsphinx-testdata 0.8+5prealpha+1-15", bsd, kaldi=True)
    add_clip("Front_Center", "/usr/share/sounds/alsa/Front_Center.wav", "Debian alsa-utils 1.2.8-1",
                    "GPL-2 (alsa-utils)", scipy_ref=True)
    add_clip("complete", "/usr/share/sounds/freedesktop/stereo/complete.oga",
             "Debian sound-theme-freedesktop 0.8-2", "CC-BY-3.0 (Dr. Richard Boulanger et al.)", float64=True)
    for text, voice in (("seven", "en-us"), ("three", "en+f3")):
        name = f"espeak_{text}"
        add_clip(name, espeak(text, voice, name + ".wav"), f"espeak-ng 1.51 (Debian 1.51+dfsg-10+deb12u2), "
                 f"voice {voice}, -s 140", "synthesised by espeak-ng (GPL-3+ program; its output is not covered)",
                 scipy_ref=text == "seven")
    write_derived(read(f"{ps}/cards/001.wav")[0])
    frames_refs(cards)
    patch_order()
    manifest["versions"] = {"python": sys.version.split()[0], "numpy": np.__version__, "torch": torch.__version__,
                            "torchaudio": sys.modules["torchaudio"].__version__,
                            "transformers": transformers.__version__, "openai-whisper": whisper.__version__,
                            "scipy": scipy.__version__, "soxr": soxr.__version__,
                            "libsoxr": soxr.__libsoxr_version__, "soundfile": soundfile.__version__,
                            "libsndfile": soundfile.__libsndfile_version__}
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(manifest["versions"], indent=1))


if __name__ == "__main__":
    main()
