// Sound files from memory to mono samples: libsndfile through its virtual I/O, a WAV header check
// for truncation (which libsndfile tolerates silently), and the mean-of-channels mix-down.
// It does not resample or look at the content beyond refusing non-finite samples.
#include <sndfile.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "audio_dsp.h"

namespace tessera::audio {
namespace {

// The item's bytes as a seekable read-only file for sf_open_virtual.
struct MemoryFile {
  const uint8_t* data;
  sf_count_t size;
  sf_count_t pos = 0;
};

sf_count_t mem_length(void* user) { return static_cast<MemoryFile*>(user)->size; }
sf_count_t mem_seek(sf_count_t offset, int whence, void* user) {
  auto* f = static_cast<MemoryFile*>(user);
  sf_count_t base = whence == SEEK_CUR ? f->pos : whence == SEEK_END ? f->size : 0;
  f->pos = std::clamp<sf_count_t>(base + offset, 0, f->size);
  return f->pos;
}
sf_count_t mem_read(void* out, sf_count_t count, void* user) {
  auto* f = static_cast<MemoryFile*>(user);
  const sf_count_t n = std::clamp<sf_count_t>(f->size - f->pos, 0, std::max<sf_count_t>(count, 0));
  if (n > 0) std::memcpy(out, f->data + f->pos, static_cast<size_t>(n));
  f->pos += n;
  return n;
}
sf_count_t mem_write(const void*, sf_count_t, void*) { return 0; }
sf_count_t mem_tell(void* user) { return static_cast<MemoryFile*>(user)->pos; }

std::string format_name(int format, int mask) {
  SF_FORMAT_INFO info{};
  info.format = format & mask;
  if (sf_command(nullptr, SFC_GET_FORMAT_INFO, &info, sizeof info) != 0 || !info.name) return "?";
  return info.name;
}

struct SndFile {
  SNDFILE* f = nullptr;
  ~SndFile() {
    if (f) sf_close(f);
  }
};

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

std::string rate_problem(long long rate) {
  return "sample rate " + std::to_string(rate) + " Hz is outside [" + std::to_string(kMinSampleRate) + ", " +
         std::to_string(kMaxSampleRate) + "] (a corrupt header?)";
}

}  // namespace

void check_wav_header(const uint8_t* d, size_t n) {
  if (n < 12 || std::memcmp(d + 8, "WAVE", 4) != 0) return;
  const bool big = std::memcmp(d, "RIFX", 4) == 0, rf64 = std::memcmp(d, "RF64", 4) == 0;
  if (!big && !rf64 && std::memcmp(d, "RIFF", 4) != 0) return;
  auto u16 = [&](size_t o) { return big ? (d[o] << 8 | d[o + 1]) : (d[o] | d[o + 1] << 8); };
  auto u32 = [&](size_t o) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(d[o + i]) << (big ? 8 * (3 - i) : 8 * i);
    return v;
  };
  uint64_t ds64_data = 0;
  bool have_ds64 = false;
  unsigned block_align = 0;
  size_t off = 12;
  while (off + 8 <= n) {
    const uint8_t* id = d + off;
    const uint64_t size = u32(off + 4);
    const size_t body = off + 8;
    if (rf64 && std::memcmp(id, "ds64", 4) == 0 && size >= 16 && body + 16 <= n) {
      ds64_data = static_cast<uint64_t>(u32(body + 8)) | static_cast<uint64_t>(u32(body + 12)) << 32;
      have_ds64 = true;
    } else if (std::memcmp(id, "fmt ", 4) == 0 && size >= 16 && body + 16 <= n) {
      const unsigned channels = u16(body + 2);
      const uint32_t rate = u32(body + 4);
      block_align = u16(body + 12);
      if (channels == 0) throw AudioError("the WAV fmt chunk declares 0 channels (a corrupt header?)");
      if (rate < kMinSampleRate || rate > kMaxSampleRate)
        throw AudioError("the WAV fmt chunk's " + rate_problem(rate));
    } else if (std::memcmp(id, "data", 4) == 0) {
      uint64_t declared = size;
      if (rf64 && size == 0xFFFFFFFFu && have_ds64) declared = ds64_data;
      if (declared == 0 || declared == 0xFFFFFFFFu) return;  // written while streaming: length unknown
      const uint64_t available = n - body;
      if (declared > available) {
        auto frames = [&](uint64_t bytes) {
          return block_align ? " (" + std::to_string(bytes / block_align) + " frames)" : std::string();
        };
        throw AudioError("truncated WAV: its data chunk promises " + std::to_string(declared) + " bytes" +
                         frames(declared) + " but the file holds only " + std::to_string(available) +
                         frames(available));
      }
      return;
    }
    off = body + size + (size & 1);
  }
}

Decoded decode(const uint8_t* data, size_t size, double max_seconds) {
  if (size == 0 || !data) throw AudioError("empty file (0 bytes)");
  check_wav_header(data, size);
  MemoryFile mem{data, static_cast<sf_count_t>(size)};
  SF_VIRTUAL_IO io{mem_length, mem_seek, mem_read, mem_write, mem_tell};
  SF_INFO info{};
  SndFile file;
  file.f = sf_open_virtual(&io, SFM_READ, &info, &mem);
  if (!file.f)
    throw AudioError(std::string("not a sound file libsndfile can read: ") + sf_strerror(nullptr) +
                     " (expected WAV, FLAC or Ogg Vorbis)");
  Decoded out;
  out.format =
      format_name(info.format, SF_FORMAT_TYPEMASK) + ", " + format_name(info.format, SF_FORMAT_SUBMASK);
  if (info.channels <= 0)
    throw AudioError(out.format + " with " + std::to_string(info.channels) + " channels");
  if (info.samplerate < kMinSampleRate || info.samplerate > kMaxSampleRate)
    throw AudioError(out.format + ": " + rate_problem(info.samplerate));
  out.sample_rate = info.samplerate;
  out.channels = info.channels;
  const double limit = max_seconds * info.samplerate;
  const bool known_length = info.frames >= 0 && info.frames != SF_COUNT_MAX;
  if (known_length && static_cast<double>(info.frames) > limit)
    throw AudioError(number(static_cast<double>(info.frames) / info.samplerate) +
                     " s of audio is more than max_seconds = " + number(max_seconds) +
                     " (cut the file, or raise the option)");

  const int ch = info.channels;
  const sf_count_t block = 4096;
  std::vector<double> buffer(static_cast<size_t>(block) * ch);
  // A header's length is only a hint: reserve no more than a minute at 48 kHz on its word.
  if (known_length) out.samples.reserve(static_cast<size_t>(std::min<sf_count_t>(info.frames, 1 << 22)));
  for (;;) {
    const sf_count_t got = sf_readf_double(file.f, buffer.data(), block);
    if (got <= 0) break;
    for (sf_count_t i = 0; i < got; ++i) {
      double sum = 0;
      for (int c = 0; c < ch; ++c) sum += buffer[static_cast<size_t>(i * ch + c)];
      const double v = sum / ch;
      if (!std::isfinite(v))
        throw AudioError("sample " + std::to_string(out.samples.size()) + " is not a finite number (" +
                         out.format + ")");
      out.samples.push_back(v);
    }
    if (static_cast<double>(out.samples.size()) > limit)
      throw AudioError("more than max_seconds = " + number(max_seconds) +
                       " s of audio (cut the file, or raise the option)");
  }
  const sf_count_t decoded = static_cast<sf_count_t>(out.samples.size());
  if (sf_error(file.f) != SF_ERR_NO_ERROR)
    throw AudioError("decoding stopped after " + std::to_string(decoded) + " frames" +
                     (known_length ? " of " + std::to_string(info.frames) : std::string()) + ": " +
                     sf_strerror(file.f) + " (" + out.format + "; the file is truncated or corrupt)");
  if (known_length && decoded < info.frames)
    throw AudioError("truncated " + out.format + ": the header promises " + std::to_string(info.frames) +
                     " frames but only " + std::to_string(decoded) + " could be decoded");
  if (decoded == 0) throw AudioError("no audio samples (zero-length audio, " + out.format + ")");
  return out;
}

}  // namespace tessera::audio
