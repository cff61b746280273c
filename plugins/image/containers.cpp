// Container checks for the six formats the image plugin reads; see containers.h. Every read is
// bounds-checked against the item's size, so a hostile file can only make inspect() throw.
// Not a decoder: pixel data (JPEG scans, PNG IDAT streams, TIFF strips) is only measured here.
#include "containers.h"

#include <array>
#include <cstring>
#include <string_view>

namespace tessera::image {

namespace {

[[noreturn]] void bad(const std::string& what) { throw BadImage(what); }

std::string at(uint64_t offset) { return "at byte " + std::to_string(offset); }

uint32_t be16(const uint8_t* p) { return static_cast<uint32_t>(p[0]) << 8 | p[1]; }
uint32_t be32(const uint8_t* p) { return be16(p) << 16 | be16(p + 2); }
uint32_t le16(const uint8_t* p) { return static_cast<uint32_t>(p[1]) << 8 | p[0]; }
uint32_t le32(const uint8_t* p) { return le16(p + 2) << 16 | le16(p); }

bool starts_with(const uint8_t* data, size_t size, std::string_view magic) {
  return size >= magic.size() && std::memcmp(data, magic.data(), magic.size()) == 0;
}

void check_dimensions(Format f, int64_t width, int64_t height, int64_t max_pixels) {
  if (width <= 0 || height <= 0)
    bad(std::string("zero-size ") + format_name(f) + " image: its header says " + std::to_string(width) +
        "×" + std::to_string(height) + " pixels");
  if (width > max_pixels / height)
    bad(std::string(format_name(f)) + " image of " + std::to_string(width) + "×" + std::to_string(height) +
        " pixels is larger than max_pixels (" + std::to_string(max_pixels) +
        "); raise the option max_pixels if the image is genuine");
}

// ---- EXIF (a TIFF structure) ------------------------------------------------------------------

// Reads IFD0 of a TIFF structure: calls visit(tag, type, count, value_field) for each entry.
// value_field points at the entry's 4-byte value/offset field. Returns false when malformed.
struct Tiff {
  const uint8_t* data;
  size_t size;
  bool little;
  uint32_t u16(const uint8_t* p) const { return little ? le16(p) : be16(p); }
  uint32_t u32(const uint8_t* p) const { return little ? le32(p) : be32(p); }
};

bool tiff_header(const uint8_t* data, size_t size, Tiff* t, uint32_t* ifd0) {
  if (size < 8) return false;
  if (std::memcmp(data, "II*\0", 4) == 0)
    t->little = true;
  else if (std::memcmp(data, "MM\0*", 4) == 0)
    t->little = false;
  else
    return false;
  t->data = data;
  t->size = size;
  *ifd0 = t->u32(data + 4);
  return true;
}

// ---- PNG --------------------------------------------------------------------------------------

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  return table;
}

uint32_t crc32(const uint8_t* p, size_t n) {
  const auto& table = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

Container inspect_png(const uint8_t* data, size_t size, int64_t max_pixels) {
  Container c;
  c.format = Format::png;
  size_t pos = 8;
  bool seen_ihdr = false, seen_idat = false, ancillary = false;
  std::vector<std::pair<size_t, size_t>> critical;  // [start, end) of each critical chunk
  while (true) {
    if (size - pos < 12)
      bad("truncated PNG: the file ends " + at(size) +
          " without its IEND chunk (the file was cut short; "
          "re-download or re-export it)");
    const uint32_t length = be32(data + pos);
    const uint8_t* type = data + pos + 4;
    const std::string name(reinterpret_cast<const char*>(type), 4);
    if (length > 0x7FFFFFFFu) bad("corrupt PNG: chunk length " + std::to_string(length) + " " + at(pos));
    if (size - pos - 12 < length)
      bad("truncated PNG: chunk " + name + " " + at(pos) + " needs " + std::to_string(length + 12) +
          " bytes but the file ends " + at(size) + " (the file was cut short; re-download or re-export it)");
    const uint8_t* body = type + 4;
    if (crc32(type, length + 4) != be32(body + length))
      bad("corrupt PNG: chunk " + name + " " + at(pos) + " fails its CRC check (the file is damaged)");
    if (!seen_ihdr) {
      if (name != "IHDR" || length != 13)
        bad("corrupt PNG: the first chunk is " + name + ", not a 13-byte IHDR");
      seen_ihdr = true;
      c.width = be32(body);
      c.height = be32(body + 4);
      check_dimensions(Format::png, c.width, c.height, max_pixels);
    }
    if (name == "IDAT" && !seen_idat) {
      // The pixel data is one zlib stream; its 2-byte header has a checksum (RFC 1950).
      if (length >= 2 && ((body[0] & 0x0F) != 8 || (body[0] * 256 + body[1]) % 31 != 0))
        bad("corrupt PNG: the image data (IDAT " + at(pos) + ") is not a zlib stream");
      seen_idat = true;
    }
    if (name == "eXIf") c.orientation = exif_orientation(body, length);
    if (type[0] & 0x20)
      ancillary = true;  // lower-case first letter: ancillary
    else
      critical.emplace_back(pos, pos + 12 + length);
    pos += 12 + length;
    if (name == "IEND") break;
  }
  if (!seen_idat) bad("corrupt PNG: no IDAT chunk, so no pixel data");
  if (ancillary) {
    size_t total = 8;
    for (const auto& [b, e] : critical) total += e - b;
    c.cleaned.reserve(total);
    c.cleaned.assign(data, data + 8);
    for (const auto& [b, e] : critical) c.cleaned.insert(c.cleaned.end(), data + b, data + e);
  }
  return c;
}

// ---- JPEG -------------------------------------------------------------------------------------

bool is_sof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

Container inspect_jpeg(const uint8_t* data, size_t size, int64_t max_pixels) {
  Container c;
  c.format = Format::jpeg;
  const std::string cut = " (the file was cut short; re-download or re-export it)";
  bool seen_sof = false, seen_exif = false;
  size_t pos = 2;
  while (true) {
    // Markers are 0xFF, any number of 0xFF fill bytes, then the marker code.
    // Bytes before a marker are skipped, as libjpeg does (it warns about "extraneous bytes").
    const void* ff = pos < size ? std::memchr(data + pos, 0xFF, size - pos) : nullptr;
    if (!ff) bad("truncated JPEG: the file ends " + at(size) + " without its end-of-image marker" + cut);
    pos = static_cast<size_t>(static_cast<const uint8_t*>(ff) - data);
    while (pos < size && data[pos] == 0xFF) ++pos;
    if (pos >= size)
      bad("truncated JPEG: the file ends " + at(size) + " without its end-of-image marker" + cut);
    const uint8_t marker = data[pos++];
    if (marker == 0xD9) break;                                           // EOI
    if ((marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) continue;  // RSTn, TEM: no length
    if (marker == 0xD8) bad("corrupt JPEG: a second start-of-image marker " + at(pos - 2));
    if (size - pos < 2) bad("truncated JPEG: the file ends " + at(size) + " inside a marker segment" + cut);
    const uint32_t length = be16(data + pos);
    if (length < 2)
      bad("corrupt JPEG: marker segment " + at(pos - 2) + " has length " + std::to_string(length));
    if (size - pos < length)
      bad("truncated JPEG: the marker segment " + at(pos - 2) + " needs " + std::to_string(length) +
          " bytes but the file ends " + at(size) + cut);
    const uint8_t* seg = data + pos + 2;
    const size_t seg_len = length - 2;
    if (is_sof(marker) && !seen_sof) {
      if (seg_len < 5) bad("corrupt JPEG: frame header " + at(pos - 2) + " is too short");
      seen_sof = true;
      c.height = be16(seg + 1);
      c.width = be16(seg + 3);
      check_dimensions(Format::jpeg, c.width, c.height, max_pixels);
    }
    if (marker == 0xE1 && !seen_exif && seg_len >= 6 && std::memcmp(seg, "Exif\0\0", 6) == 0) {
      seen_exif = true;
      c.orientation = exif_orientation(seg + 6, seg_len - 6);
    }
    pos += length;
    if (marker == 0xDA) {  // SOS: entropy-coded data up to the next marker that is not RSTn
      if (!seen_sof) bad("corrupt JPEG: scan data " + at(pos) + " before any frame header");
      const size_t scan = pos;
      while (true) {
        const void* ff = pos < size ? std::memchr(data + pos, 0xFF, size - pos) : nullptr;
        if (!ff || static_cast<const uint8_t*>(ff) + 1 >= data + size)
          bad("truncated JPEG: the file ends " + at(size) + " inside the scan data that starts " + at(scan) +
              ", before the end-of-image marker" + cut);
        pos = static_cast<size_t>(static_cast<const uint8_t*>(ff) - data);
        const uint8_t next = data[pos + 1];
        if (next == 0x00 || (next >= 0xD0 && next <= 0xD7)) {
          pos += 2;  // a stuffed 0xFF byte or a restart marker: still scan data
        } else if (next == 0xFF) {
          pos += 1;  // fill byte before a marker
        } else {
          break;
        }
      }
    }
  }
  if (!seen_sof) bad("corrupt JPEG: no frame header (SOF), so no image size");
  return c;
}

// ---- BMP --------------------------------------------------------------------------------------

Container inspect_bmp(const uint8_t* data, size_t size, int64_t max_pixels) {
  Container c;
  c.format = Format::bmp;
  const std::string cut = " (the file was cut short; re-download or re-export it)";
  if (size < 26) bad("truncated BMP: " + std::to_string(size) + " bytes cannot hold its headers" + cut);
  const uint64_t pixels_at = le32(data + 10);
  const uint32_t header = le32(data + 14);
  if (header != 12 && header < 40) bad("corrupt BMP: unknown header size " + std::to_string(header));
  if (size < 14 + static_cast<uint64_t>(header))
    bad("truncated BMP: its " + std::to_string(header) + "-byte header ends past the end of the file " +
        at(size) + cut);
  int64_t bits = 0, compression = 0, image_bytes = 0;
  if (header == 12) {  // OS/2 BITMAPCOREHEADER
    c.width = le16(data + 18);
    c.height = le16(data + 20);
    bits = le16(data + 24);
  } else {
    c.width = static_cast<int32_t>(le32(data + 18));
    c.height = static_cast<int32_t>(le32(data + 22));  // negative: rows stored top-down
    if (c.height < 0) c.height = -c.height;
    bits = le16(data + 28);
    compression = le32(data + 30);
    image_bytes = le32(data + 34);
  }
  check_dimensions(Format::bmp, c.width, c.height, max_pixels);
  if (pixels_at > size)
    bad("truncated BMP: its pixel data should start " + at(pixels_at) + ", past the end of the file " +
        at(size) + cut);
  // Uncompressed rows are padded to 4 bytes; compressed data says its own size.
  const int64_t needed = (compression == 0 || compression == 3 || compression == 6)
                             ? (c.width * bits + 31) / 32 * 4 * c.height
                             : image_bytes;
  if (static_cast<uint64_t>(needed) > size - pixels_at)
    bad("truncated BMP: its pixel data needs " + std::to_string(needed) + " bytes from byte " +
        std::to_string(pixels_at) + " but the file ends " + at(size) + cut);
  return c;
}

// ---- PNM (P1-P6) -------------------------------------------------------------------------------

struct PnmReader {
  const uint8_t* data;
  size_t size;
  size_t pos;
  void skip_space_and_comments() {
    while (pos < size) {
      if (data[pos] == '#') {
        while (pos < size && data[pos] != '\n' && data[pos] != '\r') ++pos;
      } else if (data[pos] == ' ' || data[pos] == '\t' || data[pos] == '\n' || data[pos] == '\r' ||
                 data[pos] == '\v' || data[pos] == '\f') {
        ++pos;
      } else {
        break;
      }
    }
  }
  // A decimal header field; -1 when there is none.
  int64_t number() {
    skip_space_and_comments();
    if (pos >= size || data[pos] < '0' || data[pos] > '9') return -1;
    int64_t v = 0;
    while (pos < size && data[pos] >= '0' && data[pos] <= '9') {
      v = v * 10 + (data[pos++] - '0');
      if (v > (int64_t{1} << 40)) return -1;
    }
    return v;
  }
};

Container inspect_pnm(const uint8_t* data, size_t size, int64_t max_pixels) {
  Container c;
  c.format = Format::pnm;
  const std::string cut = " (the file was cut short; re-download or re-export it)";
  const char kind = static_cast<char>(data[1]);
  PnmReader r{data, size, 2};
  c.width = r.number();
  c.height = r.number();
  const int64_t maxval = (kind == '1' || kind == '4') ? 1 : r.number();
  if (c.width < 0 || c.height < 0 || maxval < 0)
    bad("truncated or corrupt PNM: its header (P" + std::string(1, kind) + " width height" +
        (kind == '1' || kind == '4' ? "" : " maxval") + ") ends early " + at(r.pos));
  check_dimensions(Format::pnm, c.width, c.height, max_pixels);
  if (maxval < 1 || maxval > 65535)
    bad("corrupt PNM: maxval " + std::to_string(maxval) + " is outside 1..65535");
  const int64_t channels = (kind == '3' || kind == '6') ? 3 : 1;
  const int64_t samples = c.width * c.height * channels;
  if (kind >= '4') {  // binary: exactly one whitespace byte after the header, then raster bytes
    if (r.pos >= size) bad("truncated PNM: the file ends " + at(size) + " right after its header" + cut);
    const size_t raster = r.pos + 1;
    const int64_t bytes_per_sample = maxval > 255 ? 2 : 1;
    const int64_t needed = kind == '4' ? (c.width + 7) / 8 * c.height : samples * bytes_per_sample;
    if (static_cast<uint64_t>(needed) > size - raster)
      bad("truncated PNM: its raster needs " + std::to_string(needed) + " bytes from byte " +
          std::to_string(raster) + " but the file ends " + at(size) + cut);
    return c;
  }
  // ASCII: count the samples that are there (P1 digits may run together).
  int64_t found = 0;
  while (found < samples) {
    r.skip_space_and_comments();
    if (r.pos >= size) break;
    if (data[r.pos] < '0' || data[r.pos] > '9')
      bad("corrupt PNM: sample " + std::to_string(found) + " " + at(r.pos) + " is not a number");
    if (kind == '1')
      ++r.pos;
    else
      while (r.pos < size && data[r.pos] >= '0' && data[r.pos] <= '9') ++r.pos;
    ++found;
  }
  if (found < samples)
    bad("truncated PNM: it holds " + std::to_string(found) + " of its " + std::to_string(samples) +
        " samples" + cut);
  if (r.pos == size) {  // OpenCV's reader needs a byte after the last number
    c.cleaned.assign(data, data + size);
    c.cleaned.push_back('\n');
  }
  return c;
}

// ---- TIFF -------------------------------------------------------------------------------------

Container inspect_tiff(const uint8_t* data, size_t size, int64_t max_pixels) {
  Container c;
  c.format = Format::tiff;
  const std::string cut = " (the file was cut short; re-download or re-export it)";
  Tiff t{};
  uint32_t ifd = 0;
  if (!tiff_header(data, size, &t, &ifd))
    bad("truncated TIFF: " + std::to_string(size) + " bytes cannot hold its header" + cut);
  if (ifd < 8 || size - 2 < ifd)
    bad("truncated TIFF: its first directory should be " + at(ifd) + ", past the end " + at(size) + cut);
  const uint32_t n = t.u16(data + ifd);
  if ((size - ifd - 2) / 12 < n)
    bad("truncated TIFF: its first directory " + at(ifd) + " runs past the end " + at(size) + cut);
  // Values of a SHORT or LONG array tag, read from the entry or from where it points.
  auto values = [&](const uint8_t* entry, const char* what) {
    const uint32_t type = t.u16(entry + 2), count = t.u32(entry + 4);
    const size_t unit = type == 3 ? 2 : type == 4 ? 4 : 0;
    if (unit == 0) bad(std::string("corrupt TIFF: tag ") + what + " has value type " + std::to_string(type));
    const uint8_t* p = entry + 8;
    if (count > 4 / unit) {
      const uint32_t offset = t.u32(entry + 8);
      if (offset > size || (size - offset) / unit < count)
        bad(std::string("truncated TIFF: the ") + what + " table " + at(offset) + " runs past the end " +
            at(size) + cut);
      p = data + offset;
    }
    if (count == 0) bad(std::string("corrupt TIFF: tag ") + what + " has no value");
    std::vector<uint64_t> v(count);
    for (uint32_t i = 0; i < count; ++i) v[i] = unit == 2 ? t.u16(p + 2 * i) : t.u32(p + 4 * i);
    return v;
  };
  std::vector<uint64_t> offsets, counts;
  uint64_t bits = 8, sample_format = 1;
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* e = data + ifd + 2 + 12 * i;
    switch (t.u16(e)) {
      case 256:
        c.width = static_cast<int64_t>(values(e, "ImageWidth")[0]);
        break;
      case 257:
        c.height = static_cast<int64_t>(values(e, "ImageLength")[0]);
        break;
      case 273:
      case 324:
        offsets = values(e, "StripOffsets/TileOffsets");
        break;
      case 279:
      case 325:
        counts = values(e, "StripByteCounts/TileByteCounts");
        break;
      case 258:
        bits = values(e, "BitsPerSample")[0];
        break;
      case 339:
        sample_format = values(e, "SampleFormat")[0];
        break;
      default:
        break;
    }
  }
  check_dimensions(Format::tiff, c.width, c.height, max_pixels);
  if (bits > 16 || sample_format == 3)
    bad("TIFF with " + std::to_string(bits) + "-bit " + (sample_format == 3 ? "floating-point" : "integer") +
        " samples: only 8- and 16-bit integer images are read (convert it to an 8- or 16-bit PNG)");
  if (offsets.empty() || offsets.size() != counts.size())
    bad("corrupt TIFF: its strip or tile offsets and byte counts are missing or do not match");
  for (size_t i = 0; i < offsets.size(); ++i)
    if (offsets[i] > size || size - offsets[i] < counts[i])
      bad("truncated TIFF: strip or tile " + std::to_string(i) + " occupies bytes " +
          std::to_string(offsets[i]) + ".." + std::to_string(offsets[i] + counts[i]) + " but the file ends " +
          at(size) + cut);
  return c;  // OpenCV's TIFF reader applies the Orientation tag itself
}

// ---- WebP -------------------------------------------------------------------------------------

Container inspect_webp(const uint8_t* data, size_t size, int64_t max_pixels) {
  Container c;
  c.format = Format::webp;
  const std::string cut = " (the file was cut short; re-download or re-export it)";
  const uint64_t riff_end = 8 + static_cast<uint64_t>(le32(data + 4));
  if (riff_end > size)
    bad("truncated WebP: its RIFF header says " + std::to_string(riff_end) + " bytes but the file ends " +
        at(size) + cut);
  size_t pos = 12;
  bool image = false;
  while (pos + 8 <= riff_end) {
    const std::string name(reinterpret_cast<const char*>(data + pos), 4);
    const uint32_t length = le32(data + pos + 4);
    if (riff_end - pos - 8 < length)
      bad("truncated WebP: chunk " + name + " " + at(pos) + " needs " + std::to_string(length) +
          " bytes but the RIFF data ends " + at(riff_end) + cut);
    const uint8_t* body = data + pos + 8;
    if (name == "VP8 " && length >= 10) {
      c.width = le16(body + 6) & 0x3FFF;
      c.height = le16(body + 8) & 0x3FFF;
      image = true;
    } else if (name == "VP8L" && length >= 5) {
      const uint32_t bits = le32(body + 1);
      c.width = (bits & 0x3FFF) + 1;
      c.height = ((bits >> 14) & 0x3FFF) + 1;
      image = true;
    } else if (name == "VP8X" && length >= 10) {
      c.width = static_cast<int64_t>(le16(body + 4) | static_cast<uint32_t>(body[6]) << 16) + 1;
      c.height = static_cast<int64_t>(le16(body + 7) | static_cast<uint32_t>(body[9]) << 16) + 1;
    } else if (name == "EXIF") {
      const bool prefixed = length >= 6 && std::memcmp(body, "Exif\0\0", 6) == 0;
      c.orientation = prefixed ? exif_orientation(body + 6, length - 6) : exif_orientation(body, length);
    }
    pos += 8 + static_cast<size_t>(length) + (length & 1);
  }
  if (!image) bad("corrupt WebP: no VP8 or VP8L image chunk (animated WebP is not supported)");
  check_dimensions(Format::webp, c.width, c.height, max_pixels);
  return c;
}

std::string hex_start(const uint8_t* data, size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string hex, text;
  for (size_t i = 0; i < size && i < 8; ++i) {
    if (i) hex += ' ';
    hex += digits[data[i] >> 4];
    hex += digits[data[i] & 15];
    text += (data[i] >= 32 && data[i] < 127 && data[i] != '"') ? static_cast<char>(data[i]) : '.';
  }
  return hex + " (\"" + text + "\")";
}

}  // namespace

const char* format_name(Format f) {
  switch (f) {
    case Format::png:
      return "PNG";
    case Format::jpeg:
      return "JPEG";
    case Format::bmp:
      return "BMP";
    case Format::pnm:
      return "PNM";
    case Format::tiff:
      return "TIFF";
    case Format::webp:
      return "WebP";
  }
  return "?";
}

int exif_orientation(const uint8_t* data, size_t size) {
  Tiff t{};
  uint32_t ifd = 0;
  if (!tiff_header(data, size, &t, &ifd) || ifd < 8 || ifd > size - 2) return 1;
  const uint32_t n = t.u16(data + ifd);
  if ((size - ifd - 2) / 12 < n) return 1;
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* e = data + ifd + 2 + 12 * i;
    if (t.u16(e) == 0x0112 && t.u16(e + 2) == 3 && t.u32(e + 4) >= 1) {
      const uint32_t v = t.u16(e + 8);
      return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
    }
  }
  return 1;
}

Container inspect(const uint8_t* data, size_t size, int64_t max_pixels) {
  if (size == 0) bad("empty file (0 bytes): not an image");
  if (starts_with(data, size, "\x89PNG\r\n\x1a\n")) return inspect_png(data, size, max_pixels);
  if (starts_with(data, size, "\xFF\xD8\xFF")) return inspect_jpeg(data, size, max_pixels);
  if (starts_with(data, size, "BM")) return inspect_bmp(data, size, max_pixels);
  if (size >= 3 && data[0] == 'P' && data[1] >= '1' && data[1] <= '6' &&
      (data[2] == ' ' || data[2] == '\t' || data[2] == '\n' || data[2] == '\r' || data[2] == '#'))
    return inspect_pnm(data, size, max_pixels);
  if (starts_with(data, size, std::string_view("II*\0", 4)) ||
      starts_with(data, size, std::string_view("MM\0*", 4)))
    return inspect_tiff(data, size, max_pixels);
  if (size >= 12 && starts_with(data, size, "RIFF") && std::memcmp(data + 8, "WEBP", 4) == 0)
    return inspect_webp(data, size, max_pixels);
  std::string hint = "";
  if (starts_with(data, size, "GIF8"))
    hint = "; GIF is not supported (OpenCV has no GIF reader): convert it to PNG";
  else if (starts_with(data, size, std::string_view("II+\0", 4)) ||
           starts_with(data, size, std::string_view("MM\0+", 4)))
    hint = "; BigTIFF is not supported: save it as a classic TIFF";
  bad("not an image in a format this plugin reads (PNG, JPEG, BMP, PNM, TIFF, WebP): it starts with bytes " +
      hex_start(data, size) + hint);
}

}  // namespace tessera::image
