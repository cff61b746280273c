// IDX files (tessera/idx.h): the committed Fashion-MNIST sample against values read from it with
// zcat and od (see tests/data/image/fashion-mnist/README.md), plain and gzip'd files alike, every
// element type, and every kind of hostile file refused with a message naming the file and the byte.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "tessera/idx.h"
#include "test_util.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

const std::string kSample = std::string(TESSERA_TEST_DATA) + "/image/fashion-mnist/";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string temp_file(const std::string& name, const std::string& bytes) {
  const std::string dir = ::testing::TempDir() + "tessera_idx_" + std::to_string(getpid());
  fs::create_directories(dir);
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// One gzip member holding `data` (what `gzip -9` writes, without a name or a time).
std::string gzip(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// An IDX header: type, then the dims.
std::string header(uint8_t type, const std::vector<uint32_t>& dims) {
  std::string h = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) h += be32(d);
  return h;
}

std::string error_of(const std::string& label, const std::string& bytes) {
  Result<Tensor> t = idx::parse(label, bytes);
  EXPECT_FALSE(t.ok()) << label << " was accepted as " << t->describe();
  return t.ok() ? "" : t.status().message();
}

}  // namespace

// The first images and labels of Fashion-MNIST's test set. Reference values from the sample with
// `zcat t10k-images-idx3-ubyte.gz | tail -c +$((17 + 7*28)) | head -c 28 | od -An -tu1` and the like.
TEST(Idx, ReadsTheFashionMnistSample) {
  Result<Tensor> images = idx::load(kSample + "t10k-images-idx3-ubyte.gz");
  ASSERT_TRUE(images.ok()) << images.status().message();
  EXPECT_EQ(images->describe(), "u8 (64, 28, 28)");
  const uint8_t* px = images->data<uint8_t>();
  // Image 0, an ankle boot: rows 0..6 are empty; row 7 and row 21 as od prints them.
  for (int x = 0; x < 7 * 28; ++x) ASSERT_EQ(px[x], 0) << "byte " << x;
  const std::vector<int> row7 = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  0, 0,
                                 0, 0, 0, 0, 0, 3, 1, 0, 0, 7, 0, 37, 0, 0};
  const std::vector<int> row21 = {0,   0,  0, 12, 67, 106, 164, 185, 199, 210, 211, 210, 208, 190,
                                  150, 82, 8, 0,  0,  0,   178, 208, 188, 175, 162, 158, 151, 11};
  for (int x = 0; x < 28; ++x) {
    EXPECT_EQ(px[7 * 28 + x], row7[static_cast<size_t>(x)]) << "row 7, column " << x;
    EXPECT_EQ(px[21 * 28 + x], row21[static_cast<size_t>(x)]) << "row 21, column " << x;
  }
  // Each image's pixel sum (od | awk), for images 0, 1 and 63.
  auto sum = [&](int i) {
    int64_t s = 0;
    for (int k = 0; k < 784; ++k) s += px[i * 784 + k];
    return s;
  };
  EXPECT_EQ(sum(0), 33456);
  EXPECT_EQ(sum(1), 100994);
  EXPECT_EQ(sum(63), 19281);

  Result<Tensor> labels = idx::load(kSample + "t10k-labels-idx1-ubyte.gz");
  ASSERT_TRUE(labels.ok()) << labels.status().message();
  EXPECT_EQ(labels->describe(), "u8 (64)");
  const std::vector<int> first = {9, 2, 1, 1, 6, 1, 4, 6,
                                  5, 7, 4, 5, 7, 3, 4, 1};  // 9: Ankle boot, 2: Pullover
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(labels->data<uint8_t>()[i], first[i]) << "label " << i;
  EXPECT_EQ(labels->data<uint8_t>()[63], 5);  // Sandal
}

TEST(Idx, PlainAndGzippedFilesReadTheSame) {
  Result<Tensor> gz = idx::load(kSample + "t10k-images-idx3-ubyte.gz");
  ASSERT_TRUE(gz.ok()) << gz.status().message();
  const std::string plain = header(0x08, {64, 28, 28}) + testing_util::bytes_of(*gz);
  Result<Tensor> p = idx::load(temp_file("t10k-images-idx3-ubyte", plain));
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->describe(), "u8 (64, 28, 28)");
  EXPECT_EQ(testing_util::bytes_of(*p), testing_util::bytes_of(*gz));
  // Two gzip members, cut inside the header, are one stream (as zcat reads them).
  Result<Tensor> two = idx::parse("two.gz", gzip(plain.substr(0, 7)) + gzip(plain.substr(7)));
  ASSERT_TRUE(two.ok()) << two.status().message();
  EXPECT_EQ(testing_util::bytes_of(*two), testing_util::bytes_of(*gz));
  // An empty member between them changes nothing.
  Result<Tensor> three = idx::parse("three.gz", gzip(plain.substr(0, 7)) + gzip("") + gzip(plain.substr(7)));
  ASSERT_TRUE(three.ok()) << three.status().message();
}

TEST(Idx, ReadsEveryElementType) {
  auto ok = [](const std::string& bytes) {
    Result<Tensor> t = idx::parse("t.idx", bytes);
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? *t : Tensor();
  };
  Tensor u8 = ok(header(0x08, {2, 3}) + std::string("\x00\x01\x7f\x80\xfe\xff", 6));
  EXPECT_EQ(u8.describe(), "u8 (2, 3)");
  EXPECT_EQ(u8.data<uint8_t>()[3], 0x80);
  EXPECT_EQ(u8.data<uint8_t>()[5], 0xff);

  Tensor i8 = ok(header(0x09, {3}) + std::string("\x7f\x80\xff", 3));  // widened to i32
  EXPECT_EQ(i8.describe(), "i32 (3)");
  EXPECT_EQ(std::vector<int32_t>(i8.data<int32_t>(), i8.data<int32_t>() + 3),
            (std::vector<int32_t>{127, -128, -1}));

  Tensor i16 = ok(header(0x0b, {3}) + std::string("\x01\x02\x80\x00\xff\xfe", 6));
  EXPECT_EQ(i16.describe(), "i32 (3)");
  EXPECT_EQ(std::vector<int32_t>(i16.data<int32_t>(), i16.data<int32_t>() + 3),
            (std::vector<int32_t>{258, -32768, -2}));

  Tensor i32 = ok(header(0x0c, {2}) + be32(0x01020304) + be32(0xfffffffe));
  EXPECT_EQ(i32.describe(), "i32 (2)");
  EXPECT_EQ(i32.data<int32_t>()[0], 0x01020304);
  EXPECT_EQ(i32.data<int32_t>()[1], -2);

  Tensor f32 = ok(header(0x0d, {1, 2}) + be32(0x3fc00000) + be32(0xc0490fdb));  // 1.5, -pi
  EXPECT_EQ(f32.describe(), "f32 (1, 2)");
  EXPECT_EQ(f32.data<float>()[0], 1.5f);
  EXPECT_EQ(f32.data<float>()[1], -3.14159274f);

  Tensor f64 = ok(header(0x0e, {1}) + be32(0xc0020000) + be32(0));  // -2.25
  EXPECT_EQ(f64.describe(), "f64 (1)");
  EXPECT_EQ(f64.data<double>()[0], -2.25);

  // No images is an empty array, not an error.
  EXPECT_EQ(ok(header(0x08, {0, 28, 28})).describe(), "u8 (0, 28, 28)");
}

TEST(Idx, RefusesHostileHeaders) {
  EXPECT_EQ(error_of("a.idx", ""), "a.idx: empty file (0 bytes): not an IDX file");
  EXPECT_EQ(error_of("a.idx", std::string("\0\0\x08", 3)),
            "a.idx: not an IDX file: it holds only 3 bytes, fewer than the 4 of an IDX header");
  EXPECT_EQ(
      error_of("a.idx", "PK\x03\x04rest"),
      "a.idx: not an IDX file: it starts with bytes 50 4b 03 04, but an IDX file starts with 00 00, its "
      "element type and its number of dimensions");
  EXPECT_EQ(error_of("a.gz", gzip("PK\x03\x04rest")),
            "a.gz: not an IDX file: it starts with bytes 50 4b 03 04 (decompressed), but an IDX file starts "
            "with 00 00, its element type and its number of dimensions");
  EXPECT_EQ(error_of("a.idx", header(0x07, {1}) + "x"),
            "a.idx: byte 2: element type 0x07 is not an IDX type (0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d "
            "f32, 0x0e f64)");
  EXPECT_EQ(error_of("a.idx", header(0x08, {})),
            "a.idx: byte 3: 0 dimensions (an IDX file holds an array of at least one)");
  EXPECT_EQ(error_of("a.gz", gzip(header(0x08, {1, 1, 1, 1, 1, 1, 1}) + "x")),
            "a.gz: decompressed byte 3: 7 dimensions; Tessera's tensors have at most 6");
  EXPECT_EQ(error_of("a.idx", header(0x08, {10, 28, 28}).substr(0, 10)),
            "a.idx: truncated: the header needs 16 bytes for its 3 dimensions, but the data ends at byte 10");
  // 2^32 - 1 cubed, times 8 bytes: more than 64 bits.
  EXPECT_EQ(
      error_of("a.idx", header(0x0e, {0xffffffff, 0xffffffff, 0xffffffff})),
      "a.idx: bytes 4..16: dimensions 4294967295 × 4294967295 × 4294967295 f64 need more bytes than any "
      "file holds (the header is corrupt)");
  // An empty array whose other dimensions multiply past int64: its strides could not be computed
  // (accepted before, with overflowing strides: undefined behaviour, found reviewing idx.cpp for
  // tests/fuzz/fuzz_idx; the input is tests/data/fuzz-regressions/idx/).
  EXPECT_EQ(error_of("a.idx", header(0x08, {0, 0xffffffff, 0xffffffff, 0xffffffff})),
            "a.idx: bytes 4..20: dimensions 0 × 4294967295 × 4294967295 × 4294967295 u8: the array is empty, "
            "but its other dimensions multiply to more than 2^63 elements, more than a tensor can index (the "
            "header is corrupt)");
  EXPECT_EQ(error_of("a.gz", gzip(header(0x08, {0xffffffff, 0, 0xffffffff, 0xffffffff}))),
            "a.gz: decompressed bytes 4..20: dimensions 4294967295 × 0 × 4294967295 × 4294967295 u8: the array "
            "is empty, but its other dimensions multiply to more than 2^63 elements, more than a tensor can "
            "index (the header is corrupt)");
  // Empty arrays whose dimensions fit are read.
  Result<Tensor> empty = idx::parse("e.idx", header(0x08, {0, 0xffffffff, 0x7fffffff}));
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(empty->dim(2), 0x7fffffff);
  // A header claiming more than the file holds is refused before anything is allocated.
  EXPECT_EQ(
      error_of("a.idx", header(0x08, {10000, 28, 28}) + std::string(100, '\0')),
      "a.idx: truncated: the header says 10000 × 28 × 28 u8 = 7840000 bytes of data from byte 16, but the "
      "file ends at byte 116 (the file was cut short, or its header is wrong)");
  const std::string claim = gzip(header(0x08, {60000, 1000, 1000}) + std::string(100, '\0'));
  EXPECT_EQ(
      error_of("a.gz", claim),
      "a.gz: the header says 60000 × 1000 × 1000 u8 = 60000000000 bytes of data from decompressed byte 16, "
      "more than the " +
          std::to_string(claim.size()) +
          " bytes of this gzip file can inflate to (deflate expands at most 1032 times): the header is "
          "corrupt");
}

TEST(Idx, RefusesTruncatedAndTrailingData) {
  const std::string good = header(0x08, {4, 2, 2}) + std::string(16, '\x05');
  EXPECT_EQ(
      error_of("b.gz", gzip(good.substr(0, 25))),
      "b.gz: truncated: the header says 4 × 2 × 2 u8 = 16 bytes of data from decompressed byte 16 to "
      "decompressed byte 32, but the data ends at decompressed byte 25 (the file was cut short; re-download "
      "it)");
  EXPECT_EQ(
      error_of("b.idx", good + "xyz"),
      "b.idx: 3 trailing bytes after the data's end at byte 32 (the file ends at byte 35; the header's 4 × 2 "
      "× 2 u8 are wrong, or the file is not IDX)");
  EXPECT_EQ(
      error_of("b.gz", gzip(good + "xyz")),
      "b.gz: the decompressed data goes on past decompressed byte 32, where the header's 4 × 2 × 2 u8 end "
      "(trailing bytes, or the header is wrong)");
  // The gzip file itself cut short, inside the header and inside the data.
  const std::string big =
      header(0x08, {64, 28, 28}) + slurp(kSample + "t10k-images-idx3-ubyte.gz");  // incompressible
  const std::string gz = gzip(big);
  const std::string cut = gz.substr(0, gz.size() / 2);
  const std::string msg = error_of("c.gz", cut);
  EXPECT_EQ(
      msg.rfind("c.gz: truncated: the header says 64 × 28 × 28 u8 = 50176 bytes of data from decompressed "
                "byte 16 to decompressed byte 50192, but the data ends at decompressed byte ",
                0),
      0u)
      << msg;
  EXPECT_NE(msg.find(" (the gzip stream is cut short: the file ends at byte " + std::to_string(cut.size()) +
                     " before the stream's end; re-download it)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(error_of("d.gz", gzip(good).substr(0, 10)),  // the gzip header alone
            "d.gz: not an IDX file: it holds only 0 decompressed bytes, fewer than the 4 of an IDX header "
            "(the gzip "
            "stream is cut short: the file ends at byte 10 before the stream's end; re-download it)");
}

TEST(Idx, RefusesCorruptGzip) {
  const std::string good = header(0x08, {4, 2, 2}) + "0123456789abcdef";
  const std::string gz = gzip(good);
  // The CRC-32 at the end of the stream no longer matches the data.
  std::string bad_crc = gz;
  bad_crc[bad_crc.size() - 6] ^= 0x01;
  const std::string crc = error_of("e.gz", bad_crc);
  EXPECT_EQ(crc.rfind("e.gz: corrupt gzip data at byte ", 0), 0u) << crc;
  EXPECT_NE(crc.find(": zlib says \"incorrect data check\" (the file is damaged; re-download it)"),
            std::string::npos)
      << crc;
  // A damaged deflate block header.
  std::string bad_block = gz;
  bad_block[10] = static_cast<char>(0xff);
  const std::string block = error_of("e.gz", bad_block);
  EXPECT_EQ(block.rfind("e.gz: corrupt gzip data at byte ", 0), 0u) << block;
  EXPECT_NE(block.find(", decompressed byte 0: zlib says \""), std::string::npos) << block;
  // Bytes after the stream that are not another gzip member.
  EXPECT_EQ(
      error_of("e.gz", gz + "junk!"),
      "e.gz: 5 bytes after the end of the gzip stream at byte " + std::to_string(gz.size()) +
          " are not another gzip member (the file has trailing garbage; re-download or re-compress it)");
}

// A 4 MB gzip file of 4096 members that inflates to 4 GiB, with a header that announces 16 bytes:
// reading stops after 17, in far less time than inflating it all takes (seconds).
TEST(Idx, StopsAGzipBombAtTheHeadersSize) {
  const std::string zeros = gzip(std::string(size_t{1} << 20, '\0'));
  std::string bomb = gzip(header(0x08, {16}) + std::string(size_t{1} << 20, '\0'));
  for (int k = 1; k < 4096; ++k) bomb += zeros;
  ASSERT_LT(bomb.size(), size_t{5} << 20);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(error_of("bomb.gz", bomb),
            "bomb.gz: the decompressed data goes on past decompressed byte 24, where the header's 16 u8 end "
            "(trailing bytes, or the header is wrong)");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);
}

// Every prefix of the sample and random byte flips: refused with a message or read, never a crash
// (run under ASan and UBSan too).
TEST(Idx, NeverAbortsOnCutOrFlippedFiles) {
  const std::string gz = slurp(kSample + "t10k-images-idx3-ubyte.gz");
  Result<Tensor> whole = idx::parse("s.gz", gz);
  ASSERT_TRUE(whole.ok());
  const std::string plain = header(0x08, {64, 28, 28}) + testing_util::bytes_of(*whole);
  for (const std::string* file : {&gz, &plain}) {
    for (size_t n = 0; n < file->size(); n += file->size() / 61 + 1) {
      Result<Tensor> t = idx::parse("s", file->substr(0, n));
      EXPECT_FALSE(t.ok()) << "a prefix of " << n << " bytes was read";
      if (!t.ok()) {
        EXPECT_EQ(t.status().message().rfind("s: ", 0), 0u);
      }
    }
    std::mt19937 rng(7);
    for (int k = 0; k < 40; ++k) {
      std::string flipped = *file;
      flipped[rng() % flipped.size()] ^= static_cast<char>(1 + rng() % 255);
      Result<Tensor> t = idx::parse("s", flipped);
      if (t.ok()) {
        EXPECT_EQ(t->numel(), 64 * 28 * 28);  // a flip among the pixels of the plain file
      }
    }
  }
}

TEST(Idx, LoadNamesAMissingFile) {
  const std::string path = ::testing::TempDir() + "no-such-images-idx3-ubyte.gz";
  Result<Tensor> t = idx::load(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
}
