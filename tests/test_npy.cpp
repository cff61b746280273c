// .npy reader and writer: round trips, files written by NumPy (tests/data/npy) read bit-exactly
// and rewritten byte for byte, and each refusal on bytes built here. Never runs Python.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tessera/fileio.h"
#include "tessera/npy.h"

using namespace tessera;
using ::testing::HasSubstr;
using ::testing::StartsWith;
namespace fs = std::filesystem;

namespace {

const std::string kData = TESSERA_TEST_DATA "/npy/";

// A .npy file: magic, version, header length, the dict padded with spaces and '\n' to 64 bytes.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append(64 - (prefix + header.size() + 1) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const uint32_t len = static_cast<uint32_t>(header.size());
  out.append(reinterpret_cast<const char*>(&len), major == 1 ? 2 : 4);
  return out + header + data;
}

Status refusal(const std::string& bytes) {
  Result<Tensor> t = npy::parse("bad.npy", bytes);
  EXPECT_FALSE(t.ok()) << "accepted a file it should refuse";
  return t.status();
}

using testing_util::bytes_of;
using testing_util::hex_decode;

const std::string kF32x6(24, '\0');

}  // namespace

TEST(Npy, RoundTripsEveryDtypeTheWriterKeeps) {
  Tensor i64 = Tensor::empty({2, 1}, DType::i64);
  i64.data<int64_t>()[0] = std::numeric_limits<int64_t>::min();
  i64.data<int64_t>()[1] = 5;
  Tensor u8 = Tensor::empty({3}, DType::u8);
  for (int i = 0; i < 3; ++i) u8.data<uint8_t>()[i] = static_cast<uint8_t>(100 * i + 5);
  const Tensor f32 = Tensor::from_vector({2, 3}, {0.f, -0.f, 1.f / 3.f, -2.5f, 1e-45f, 3e38f});
  for (const Tensor& t : {f32, f32.to(DType::f16), Tensor::from_ids({1, 2, 2}, {-1, 0, 1, 2147483647}), i64,
                          u8, Tensor::from_vector({}, {4.f}), Tensor::zeros({0, 5})}) {
    SCOPED_TRACE(t.describe());
    Result<std::string> bytes = npy::serialize(t);
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    Result<Tensor> back = npy::parse("rt.npy", bytes.value());
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->dtype(), t.dtype());
    EXPECT_EQ(back->shape(), t.shape());
    EXPECT_EQ(bytes_of(back.value()), bytes_of(t));
  }
}

TEST(Npy, Bf16IsWrittenAsF32) {
  const Tensor b = Tensor::from_vector({2}, {1.f / 3.f, -7.f}).to(DType::bf16);
  Result<Tensor> back = npy::parse("b.npy", npy::serialize(b).value());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->dtype(), DType::f32);
  EXPECT_EQ(back->to_vector(), (std::vector<float>{round_to_bf16(1.f / 3.f), -7.f}));
}

TEST(Npy, WriterUsesNumpysHeaderLayoutAndCOrder) {
  const Tensor t = Tensor::from_vector({3, 2}, {0, 1, 2, 3, 4, 5}).transpose(0, 1);  // (2, 3), strided
  const std::string bytes = npy::serialize(t).value();
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_len = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
  EXPECT_EQ((10 + header_len) % 64, 0u);
  const std::string header = bytes.substr(10, header_len);
  EXPECT_THAT(header, StartsWith("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }   "));
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(npy::parse("t.npy", bytes)->to_vector(), (std::vector<float>{0, 2, 4, 1, 3, 5}));
}

TEST(Npy, SaveThenLoadAFile) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("tessera_npy_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "x.npy").string();
  ASSERT_TRUE(npy::save(path, Tensor::from_vector({2}, {1.5f, 2.5f})).ok());
  Result<Tensor> back = npy::load(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->to_vector(), (std::vector<float>{1.5f, 2.5f}));
  EXPECT_THAT(npy::save(path, Tensor()).message(), StartsWith(path + ": cannot write an undefined tensor"));
  fs::remove_all(dir);

  Result<Tensor> missing = npy::load(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::not_found);
  EXPECT_THAT(missing.status().message(), StartsWith(path + ": cannot open for reading"));
}

TEST(Npy, AcceptsThePythonLiteralsNumpyMightWrite) {
  const std::string data(8, '\0');
  for (const std::string& dict :
       {std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"),
        std::string("{\"shape\":(2,),\"descr\":\"<f4\",\"fortran_order\":False}"),
        std::string("{ 'fortran_order' : False , 'shape' : ( 2 , ) , 'descr' : '<f4' }")}) {
    SCOPED_TRACE(dict);
    Result<Tensor> t = npy::parse("ok.npy", npy_bytes(dict, data));
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->shape(), Shape({2}));
  }
}

// ---------------------------------------------------------------------------------------------
// Files written by NumPy (tools/reference/make_npy_fixtures.py)

TEST(Npy, ReadsNumpyFilesBitExactly) {
  std::ifstream in(kData + "expected.json");
  ASSERT_TRUE(in) << "missing " << kData << "expected.json";
  const nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_EQ(expected["files"].size(), 10u);
  for (const auto& [fname, want] : expected["files"].items()) {
    SCOPED_TRACE(fname);
    Result<Tensor> t = npy::load(kData + fname);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->shape().vec(), want["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(bytes_of(t.value()), hex_decode(want["hex"].get<std::string>()));
  }
  EXPECT_EQ(npy::load(kData + "f8.npy")->dtype(), DType::f32);
  EXPECT_EQ(npy::load(kData + "f8.npy")->at({1, 0}), std::numeric_limits<float>::infinity());  // 1e300
  EXPECT_EQ(npy::load(kData + "b1.npy")->dtype(), DType::u8);
  EXPECT_EQ(npy::load(kData + "f4.npy")->at({1, 2}), 5.f / 3.f);
}

TEST(Npy, WritesWhatNumpyWritesByteForByte) {
  for (const char* fname : {"f4.npy", "f2.npy", "i4.npy", "i8.npy", "u1.npy", "scalar.npy", "empty.npy"}) {
    SCOPED_TRACE(fname);
    Result<Tensor> t = npy::load(kData + fname);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(npy::serialize(t.value()).value(), read_file(kData + fname).value());
  }
}

// ---------------------------------------------------------------------------------------------
// Refusals

TEST(NpyRefuses, BadMagic) {
  Status s = refusal(std::string("\x93NUMPZ\x01\x00\x00\x00", 10));
  EXPECT_EQ(s.code(), Code::parse_error);
  EXPECT_EQ(s.message(), "bad.npy: bytes 0-5 are not the .npy magic \\x93NUMPY (not a .npy file)");
  EXPECT_THAT(refusal("\x93NUM").message(),
              StartsWith("bad.npy: file is 4 bytes, too short for a .npy preamble"));
}

TEST(NpyRefuses, UnknownFormatVersion) {
  std::string bytes = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", "abcd");
  bytes[6] = 4;
  Status s = refusal(bytes);
  EXPECT_EQ(s.code(), Code::unsupported);
  EXPECT_THAT(s.message(),
              StartsWith("bad.npy: .npy format version 4.0 (this reader knows 1.0, 2.0 and 3.0)"));
}

TEST(NpyRefuses, UnsupportedDescr) {
  for (const char* descr : {">f4", "<c8", "|O", "<U3", "<u2"}) {
    Status s = refusal(
        npy_bytes(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (0,), }", ""));
    EXPECT_EQ(s.code(), Code::unsupported);
    EXPECT_THAT(s.message(),
                StartsWith(std::string("bad.npy: 'descr' is '") + descr + "', which Tessera does not read"));
  }
}

TEST(NpyRefuses, FortranOrder) {
  Status s = refusal(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", kF32x6));
  EXPECT_EQ(s.code(), Code::unsupported);
  EXPECT_THAT(s.message(), StartsWith("bad.npy: 'fortran_order' is True"));
}

TEST(NpyRefuses, TruncatedData) {
  Status s =
      refusal(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", kF32x6.substr(4)));
  EXPECT_EQ(s.code(), Code::parse_error);
  EXPECT_EQ(s.message(),
            "bad.npy: data is 20 bytes after the header (at byte 128) but <f4 shape (2, 3) needs 24 (the "
            "file is truncated)");
}

TEST(NpyRefuses, TrailingBytes) {
  EXPECT_THAT(refusal(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", kF32x6 + "x"))
                  .message(),
              HasSubstr("data is 25 bytes after the header (at byte 128) but <f4 shape (2, 3) needs 24 (the "
                        "file has trailing bytes)"));
}

TEST(NpyRefuses, HeaderTooLong) {
  std::string bytes = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", "abcd", 2);
  const uint32_t huge = 20000;
  std::memcpy(bytes.data() + 8, &huge, 4);
  EXPECT_THAT(refusal(bytes).message(),
              StartsWith("bad.npy: header length 20000 exceeds the 10000-byte limit"));
}

TEST(NpyRefuses, HeaderPastTheEnd) {
  const std::string bytes =
      npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", "").substr(0, 40);
  EXPECT_THAT(refusal(bytes).message(),
              StartsWith("bad.npy: header length 118 runs past the end of the 40-byte file"));
}

TEST(NpyRefuses, MalformedHeaderDicts) {
  const std::pair<std::string, std::string> cases[] = {
      {"{'descr': '<f4', 'fortran_order': False}", "header, file byte 49: missing key 'shape'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}",
       "header, file byte 64: unexpected key 'extra'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}",
       "header, file byte 27: key 'descr' appears twice"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1)}",
       "'shape' is a parenthesised integer, not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
       "header, file byte 61: shape entries must be non-negative"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
       "shape entry does not fit in 63 bits"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': ()}", "'fortran_order' must be True or False"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': ()}",
       "header, file byte 19: expected ':' after the key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False 'shape': ()}",
       "expected ',' or '}' after the value of 'fortran_order'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ()} x",
       "unexpected text after the header dict's closing '}'"},
      {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': ()}",
       "unexpected character in the 'descr' string"},
      {"['descr', '<f4']", "header, file byte 10: expected the header dict"},
      {"{descr: '<f4'}", "header, file byte 11: expected a key in quotes"},
  };
  for (const auto& [dict, why] : cases) {
    SCOPED_TRACE(dict);
    Status s = refusal(npy_bytes(dict, "abcd"));
    EXPECT_EQ(s.code(), Code::parse_error);
    EXPECT_THAT(s.message(), StartsWith("bad.npy: header, file byte "));
    EXPECT_THAT(s.message(), HasSubstr(why));
  }
}

TEST(NpyRefuses, MoreDimensionsThanATensorHas) {
  Status s =
      refusal(npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1), }", "x"));
  EXPECT_EQ(s.code(), Code::unsupported);
  EXPECT_THAT(s.message(), StartsWith("bad.npy: 'shape' has 7 dimensions; Tessera tensors have at most 6"));
}

TEST(NpyRefuses, ShapeWhoseByteCountOverflows) {
  EXPECT_THAT(
      refusal(npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (2147483648, 2147483648), }", ""))
          .message(),
      StartsWith("bad.npy: 'shape' needs more bytes than fit in 64 bits"));
  EXPECT_THAT(
      refusal(
          npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 2), }", ""))
          .message(),
      StartsWith("bad.npy: 'shape' has more elements than fit in 63 bits"));
}

// A zero dimension beside a huge one is an empty array, not an allocation past 64 bits (the npy
// fuzzer's finding, tests/data/fuzz-regressions/npy/).
TEST(NpyReads, AZeroDimensionBesideAHugeOneIsEmpty) {
  std::ifstream in(std::string(TESSERA_TEST_DATA) + "/fuzz-regressions/npy/zero-dim-beside-a-huge-one.npy",
                   std::ios::binary);
  ASSERT_TRUE(in);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Result<Tensor> t = npy::parse("found.npy", bytes);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->numel(), 0);
  EXPECT_EQ(t->dim(0), 6450984253743169534);
}
