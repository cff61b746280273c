// Safetensors reader and writer: round trips, zero-copy views, files written by the reference
// `safetensors` package (tests/data/safetensors), and one test per validation rule, each
// broken on purpose in bytes built here. Never runs Python.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tessera/safetensors.h"

using namespace tessera;
using ::testing::HasSubstr;
using ::testing::StartsWith;
namespace fs = std::filesystem;
namespace st = tessera::safetensors;

namespace {

const std::string kData = TESSERA_TEST_DATA "/safetensors/";

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s;
}

// The bytes of a file: length, header text as given, data buffer.
std::string file_bytes(const std::string& header, const std::string& buffer = "") {
  return le64(header.size()) + header + buffer;
}

// One header entry: "name":{"dtype":...,"shape":[...],"data_offsets":[begin,end]}.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// A header object of the given entries, {e1,e2,...}.
std::string object(std::initializer_list<std::string> entries) {
  std::string s = "{";
  for (const std::string& e : entries) {
    if (s.size() > 1) s += ",";
    s += e;
  }
  return s + "}";
}

// Opens bytes that must be refused and returns why.
Status refusal(const std::string& bytes) {
  Result<st::File> f = st::File::from_bytes("bad.safetensors", bytes);
  EXPECT_FALSE(f.ok()) << "accepted a file that breaks a rule";
  return f.status();
}
Status refusal(const std::string& header, const std::string& buffer) {
  return refusal(file_bytes(header, buffer));
}

using testing_util::bytes_of;
using testing_util::hex_decode;

// The path of the file mapped at address p, from /proc/self/maps ("" if none).
std::string mapped_path_at(const void* p) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode, path;
    in >> range >> perms >> offset >> dev >> inode >> path;
    const size_t dash = range.find('-');
    const auto lo = std::stoull(range.substr(0, dash), nullptr, 16),
               hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    const auto a = reinterpret_cast<uintptr_t>(p);
    if (lo <= a && a < hi) return path;
  }
  return "";
}

// One tensor of every dtype Tensor has, plus an empty and a rank-0 one.
std::vector<std::pair<std::string, Tensor>> every_dtype() {
  const std::vector<float> v = {0.f, -0.f, 1.f / 3.f, -2.5f, std::numeric_limits<float>::infinity(), 1e-45f};
  Tensor f32 = Tensor::from_vector({2, 3}, v);
  Tensor scalar = Tensor::from_vector({}, {7.5f});
  Tensor i64 = Tensor::empty({3}, DType::i64);
  i64.data<int64_t>()[0] = std::numeric_limits<int64_t>::min();
  i64.data<int64_t>()[1] = -1;
  i64.data<int64_t>()[2] = int64_t{1} << 40;
  Tensor u8 = Tensor::empty({5}, DType::u8);
  for (int i = 0; i < 5; ++i) u8.data<uint8_t>()[i] = static_cast<uint8_t>(i * 60);
  return {{"f32", f32},
          {"bf16", f32.to(DType::bf16)},
          {"f16", f32.to(DType::f16)},
          {"i32", Tensor::from_ids({2, 2}, {-5, 0, 7, 2147483647})},
          {"i64", i64},
          {"u8", u8},
          {"empty", Tensor::zeros({0, 4})},
          {"scalar", scalar}};
}

// A directory of its own per test, removed afterwards.
class SafetensorsFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("tessera_st_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Round trips and views

TEST(Safetensors, SerializeRoundTripsEveryDtypeWithMetadata) {
  const auto tensors = every_dtype();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "ünïcode"}};
  Result<std::string> bytes = st::serialize(tensors, metadata);
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();

  Result<st::File> f = st::File::from_bytes("rt.safetensors", bytes.value());
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->metadata(), metadata);
  ASSERT_EQ(f->tensors().size(), tensors.size());
  const char* file_dtypes[] = {"F32", "BF16", "F16", "I32", "I64", "U8", "F32", "F32"};
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    SCOPED_TRACE(name);
    const st::TensorInfo* info = f->find(name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype_name, file_dtypes[i]);
    Result<Tensor> back = f->get(name);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->dtype(), t.dtype());
    EXPECT_EQ(back->shape(), t.shape());
    EXPECT_EQ(bytes_of(back.value()), bytes_of(t));
  }
}

TEST(Safetensors, SerializedDataStartsEightByteAlignedAfterSpacePadding) {
  for (std::string name : {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"}) {
    Result<std::string> bytes = st::serialize({{name, Tensor::full({3}, 1.f)}});
    ASSERT_TRUE(bytes.ok());
    uint64_t n;
    std::memcpy(&n, bytes->data(), 8);
    EXPECT_EQ((8 + n) % 8, 0u) << name;
    const std::string header = bytes->substr(8, n);
    EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
              "{\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}");
    EXPECT_EQ(bytes->size(), 8 + n + 12);
  }
}

TEST(Safetensors, WriterKeepsTheGivenOrderAndWritesStridedTensorsContiguous) {
  Tensor t = Tensor::from_vector({2, 3}, {0, 1, 2, 3, 4, 5}).transpose(0, 1);  // (3, 2), strided
  Result<std::string> bytes = st::serialize({{"z", Tensor::full({1}, 9.f)}, {"a", t}});
  ASSERT_TRUE(bytes.ok());
  EXPECT_LT(bytes->find("\"z\""), bytes->find("\"a\""));
  Result<st::File> f = st::File::from_bytes("strided.safetensors", bytes.value());
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->tensors()[0].name, "z");
  EXPECT_EQ(f->get("a")->to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

// The pieces a large file is written from: the header, then the tensors' own bytes (no copy of a
// contiguous tensor, a contiguous copy of a strided one), the same bytes as serialize().
TEST(Safetensors, PiecesAreTheSerializedBytesAndReadContiguousTensorsInPlace) {
  const Tensor big = Tensor::full({3, 4}, 2.5f);
  const Tensor strided = Tensor::from_vector({2, 3}, {0, 1, 2, 3, 4, 5}).transpose(0, 1);
  const std::vector<std::pair<std::string, Tensor>> tensors = {{"big", big}, {"t", strided}};
  Result<st::Pieces> p = st::serialize_pieces(tensors, {{"k", "v"}});
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->data.size(), 2u);
  EXPECT_EQ(p->data[0].raw_data(), big.raw_data());  // read in place
  EXPECT_NE(p->data[1].raw_data(), strided.raw_data());
  const std::vector<std::string_view> views = p->views();
  ASSERT_EQ(views.size(), 3u);
  std::string joined;
  for (std::string_view v : views) joined += v;
  EXPECT_EQ(joined.size(), p->size());
  EXPECT_EQ(joined, st::serialize(tensors, {{"k", "v"}}).value());
}

TEST_F(SafetensorsFile, WriteThenOpenGivesViewsIntoTheMappingThatOutliveTheFile) {
  const std::string path = (dir_ / "model.safetensors").string();
  ASSERT_TRUE(st::write(path, every_dtype(), {{"k", "v"}}).ok());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), {}), 1);  // no temporary file left

  Tensor w;
  {
    Result<st::File> f = st::File::open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f->path(), path);
    w = f->get("f32").value();
    EXPECT_EQ(mapped_path_at(w.raw_data()), fs::canonical(path).string());
  }
  EXPECT_EQ(w.at({0, 2}), 1.f / 3.f);  // the File is gone, the view keeps the mapping
  EXPECT_EQ(mapped_path_at(w.raw_data()), fs::canonical(path).string());
}

TEST(Safetensors, FromBytesViewsPointIntoTheGivenString) {
  std::string bytes = st::serialize({{"a", Tensor::full({4}, 1.f)}, {"b", Tensor::full({2}, 2.f)}}).value();
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  const char* b_data = bytes.data() + 8 + n + 16;
  Result<st::File> f = st::File::from_bytes("mem", std::move(bytes));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->get("b")->raw_data(), b_data);
}

TEST(Safetensors, MisalignedTensorComesBackAsAnAlignedCopy) {
  // 3 bytes of U8 put the F32 tensor at an odd address; the format allows it.
  Tensor u8 = Tensor::zeros({3}, DType::u8);
  Result<std::string> bytes = st::serialize({{"pad", u8}, {"x", Tensor::from_vector({2}, {1.5f, -4.f})}});
  ASSERT_TRUE(bytes.ok());
  Result<st::File> f = st::File::from_bytes("odd.safetensors", bytes.value());
  ASSERT_TRUE(f.ok()) << f.status().message();
  Result<Tensor> x = f->get("x");
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x->raw_data()) % alignof(float), 0u);
  EXPECT_EQ(x->to_vector(), (std::vector<float>{1.5f, -4.f}));
}

TEST(Safetensors, AcceptsPaddingEmptyTensorsAndNoTensors) {
  EXPECT_TRUE(st::File::from_bytes("a", file_bytes("{}")).ok());
  EXPECT_TRUE(st::File::from_bytes("b", file_bytes("{}      ")).ok());
  Result<st::File> f = st::File::from_bytes(
      "c",
      file_bytes(object({entry("e", "F32", "[0,3]", 0, 0), entry("one", "U8", "[1]", 0, 1)}) + "  ", "x"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->get("e")->shape(), Shape({0, 3}));
  EXPECT_EQ(f->get("one")->at({0}), static_cast<float>('x'));
}

TEST(Safetensors, GetRefusesDtypesTesseraDoesNotLoadAndUnknownNames) {
  Result<st::File> f = st::File::from_bytes(
      "m.safetensors", file_bytes(object({entry("d", "F64", "[1]", 0, 8), entry("b", "BOOL", "[2]", 8, 10)}),
                                  std::string("\0\0\0\0\0\0\xf0\x3f\x01\x00", 10)));
  ASSERT_TRUE(f.ok()) << f.status().message();
  Result<Tensor> d = f->get("d");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::unsupported);
  EXPECT_THAT(d.status().message(),
              StartsWith("m.safetensors: tensor \"d\" has dtype F64, which Tessera does not load"));
  Result<Tensor> b = f->get("b");  // BOOL loads as u8
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype(), DType::u8);
  EXPECT_EQ(b->at({0}), 1.f);
  Result<Tensor> missing = f->get("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::not_found);
  EXPECT_THAT(missing.status().message(), StartsWith("m.safetensors: no tensor named \"nope\""));
}

TEST(Safetensors, OpenOfAMissingFileNamesIt) {
  Result<st::File> f = st::File::open("/nonexistent/model.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::not_found);
  EXPECT_THAT(f.status().message(), StartsWith("/nonexistent/model.safetensors: cannot open for reading"));
}

TEST(Safetensors, WriterRefusesBadNames) {
  const Tensor t = Tensor::full({1}, 1.f);
  auto why = [](const std::vector<std::pair<std::string, Tensor>>& tensors) {
    Result<std::string> r = st::serialize(tensors);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::invalid_argument);
    return r.status().message();
  };
  EXPECT_EQ(why({{"", t}}), "safetensors: a tensor has an empty name (give every tensor a name)");
  EXPECT_THAT(why({{"a", t}, {"a", t}}), StartsWith("safetensors: tensor \"a\": the name appears twice"));
  EXPECT_THAT(why({{"__metadata__", t}}),
              StartsWith("safetensors: tensor \"__metadata__\": the name is reserved"));
  EXPECT_THAT(why({{"u", Tensor()}}), StartsWith("safetensors: tensor \"u\": the tensor is undefined"));
  EXPECT_THAT(why({{"\xff", t}}), HasSubstr("not valid UTF-8"));

  Status write_st = st::write("/nonexistent-dir/x.safetensors", {{"", t}});
  EXPECT_THAT(write_st.message(), StartsWith("/nonexistent-dir/x.safetensors: a tensor has an empty name"));
}

// ---------------------------------------------------------------------------------------------
// Files written by the reference implementation (tools/reference/make_safetensors_fixtures.py)

TEST(Safetensors, ReadsReferenceFilesBitExactlyAndWritesThemByteForByte) {
  std::ifstream in(kData + "expected.json");
  ASSERT_TRUE(in) << "missing " << kData << "expected.json";
  const nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_EQ(expected["files"].size(), 7u);
  for (const auto& [fname, want] : expected["files"].items()) {
    SCOPED_TRACE(fname);
    Result<st::File> f = st::File::open(kData + fname);
    ASSERT_TRUE(f.ok()) << f.status().message();
    using Metadata = std::map<std::string, std::string>;
    EXPECT_EQ(f->metadata(), want["metadata"].get<Metadata>());
    ASSERT_EQ(f->tensors().size(), want["tensors"].size());
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const st::TensorInfo& info : f->tensors()) {
      SCOPED_TRACE(info.name);
      const auto& w = want["tensors"].at(info.name);
      Result<Tensor> t = f->get(info.name);
      ASSERT_TRUE(t.ok()) << t.status().message();
      EXPECT_EQ(t->shape().vec(), w["shape"].get<std::vector<int64_t>>());
      EXPECT_EQ(bytes_of(t.value()), hex_decode(w["hex"].get<std::string>()));
      tensors.emplace_back(info.name, t.value());
    }
    // Same tensors in the same order give the reference writer's exact bytes, except that BOOL
    // comes back as u8 and so is written as U8.
    if (fname == "bool.safetensors") continue;
    Result<std::string> ours = st::serialize(tensors, f->metadata());
    ASSERT_TRUE(ours.ok());
    std::ifstream ref(kData + fname, std::ios::binary);
    EXPECT_EQ(ours.value(), std::string(std::istreambuf_iterator<char>(ref), {}));
  }
}

TEST(Safetensors, ReferenceValuesDecodeAsExpected) {
  Result<st::File> f32 = st::File::open(kData + "f32.safetensors");
  ASSERT_TRUE(f32.ok()) << f32.status().message();
  EXPECT_EQ(f32->get("weight")->at({1, 2}), 6.f / 8.f);
  Result<st::File> bf16 = st::File::open(kData + "bf16.safetensors");
  ASSERT_TRUE(bf16.ok()) << bf16.status().message();
  EXPECT_EQ(bf16->get("w")->dtype(), DType::bf16);
  EXPECT_EQ(bf16->get("w")->at({0, 0, 1}), round_to_bf16(-5.f / 3.f));
  Result<st::File> i64 = st::File::open(kData + "i64.safetensors");
  ASSERT_TRUE(i64.ok()) << i64.status().message();
  EXPECT_EQ(i64->get("positions")->data<int64_t>()[4], std::numeric_limits<int64_t>::min());
  Result<st::File> mixed = st::File::open(kData + "mixed.safetensors");
  ASSERT_TRUE(mixed.ok()) << mixed.status().message();
  EXPECT_EQ(mixed->get("nothing")->shape(), Shape({0, 4}));
  Result<st::File> boolean = st::File::open(kData + "bool.safetensors");
  ASSERT_TRUE(boolean.ok()) << boolean.status().message();
  EXPECT_EQ(boolean->find("mask")->dtype_name, "BOOL");
  EXPECT_EQ(boolean->get("mask")->to_vector(), (std::vector<float>{1, 0, 1}));
}

// ---------------------------------------------------------------------------------------------
// One test per rule, each broken on purpose

TEST(SafetensorsRule, FileShorterThanEightBytes) {
  Status s = refusal(std::string("\x02\0\0\0", 4));
  EXPECT_EQ(s.code(), Code::parse_error);
  EXPECT_THAT(s.message(),
              StartsWith("bad.safetensors: file is 4 bytes, shorter than the 8-byte header length"));
}

TEST(SafetensorsRule, HeaderLengthAboveTheLimit) {
  EXPECT_EQ(refusal(le64(std::numeric_limits<uint64_t>::max()) + "{}").message(),
            "bad.safetensors: header length 18446744073709551615 exceeds the 100000000-byte limit "
            "(file is truncated or not safetensors)");
  EXPECT_THAT(refusal(le64(st::kMaxHeaderBytes + 1) + "{}").message(),
              HasSubstr("exceeds the 100000000-byte limit"));
}

TEST(SafetensorsRule, HeaderLengthBeyondTheFile) {
  EXPECT_THAT(
      refusal(le64(40) + "{}").message(),
      StartsWith("bad.safetensors: header length 40 runs past the end of the file, which has 2 bytes"));
}

TEST(SafetensorsRule, HeaderNotJson) {
  Status s = refusal("{\"a\":", "");
  EXPECT_EQ(s.code(), Code::parse_error);
  EXPECT_THAT(s.message(), StartsWith("bad.safetensors: header is not valid JSON at file byte 13: "));
  EXPECT_THAT(refusal("{\"\xff\":1}", "").message(), HasSubstr("header is not valid JSON"));  // not UTF-8
  // A number beyond a double (fuzz regression safetensors/json-number-overflow): nlohmann's
  // out_of_range used to escape as std::terminate.
  EXPECT_THAT(refusal("{\"__metadata__\":{\"a\":1e400}}", "").message(),
              HasSubstr("bad.safetensors: header is not valid JSON for Tessera: number overflow parsing '1e400'"));
}

TEST(SafetensorsRule, HeaderNotAnObject) {
  EXPECT_THAT(refusal("[1, 2]", "").message(),
              StartsWith("bad.safetensors: header is a JSON array, not a JSON object"));
}

TEST(SafetensorsRule, HeaderNotStartingWithBrace) {
  EXPECT_THAT(refusal(" {}", "").message(),
              StartsWith("bad.safetensors: header must start with '{' at byte 8"));
}

TEST(SafetensorsRule, DuplicateTensorName) {
  const std::string e = entry("w", "U8", "[1]", 0, 1);
  EXPECT_THAT(refusal(object({e, e}), "x").message(),
              StartsWith("bad.safetensors: header has duplicate key \"w\" (each tensor name"));
}

TEST(SafetensorsRule, DuplicateField) {
  EXPECT_THAT(refusal(R"({"w":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x").message(),
              StartsWith("bad.safetensors: header has duplicate key \"dtype\" inside \"w\""));
}

TEST(SafetensorsRule, EntryNotAnObject) {
  EXPECT_THAT(refusal(R"({"w":[1]})", "").message(),
              StartsWith("bad.safetensors: tensor \"w\": entry is a JSON array, not an object"));
}

TEST(SafetensorsRule, MissingField) {
  EXPECT_THAT(
      refusal(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", "x").message(),
      StartsWith("bad.safetensors: tensor \"w\": missing field \"shape\" (an entry has exactly dtype, shape "
                 "and data_offsets)"));
}

TEST(SafetensorsRule, ExtraField) {
  EXPECT_THAT(refusal(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"stride":[1]}})", "x").message(),
              StartsWith("bad.safetensors: tensor \"w\": unexpected field \"stride\""));
}

TEST(SafetensorsRule, UnknownDtype) {
  EXPECT_THAT(
      refusal(object({entry("w", "F33", "[1]", 0, 4)}), "xxxx").message(),
      StartsWith("bad.safetensors: tensor \"w\": unknown dtype \"F33\" (the format defines BOOL, U8,"));
  EXPECT_THAT(refusal(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "xxxx").message(),
              StartsWith("bad.safetensors: tensor \"w\": dtype is the integer 4, not a string"));
}

TEST(SafetensorsRule, EveryFormatDtypeHasItsSize) {
  const std::pair<const char*, int> sizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"I16", 2}, {"U16", 2}, {"F16", 2},     {"BF16", 2},   {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F8_E5M2", 1}, {"F8_E4M3", 1}};
  for (auto [dtype, size] : sizes) {
    SCOPED_TRACE(dtype);
    const std::string buffer(3 * size, 'x');
    EXPECT_TRUE(
        st::File::from_bytes("ok", file_bytes(object({entry("w", dtype, "[3]", 0, 3 * size)}), buffer)).ok());
    EXPECT_THAT(refusal(object({entry("w", dtype, "[3]", 0, 3 * size + 1)}), buffer + "x").message(),
                HasSubstr("dtype × shape must equal the byte span"));
  }
}

TEST(SafetensorsRule, NegativeShapeEntry) {
  EXPECT_THAT(
      refusal(object({entry("w", "U8", "[2,-1]", 0, 0)}), "").message(),
      StartsWith("bad.safetensors: tensor \"w\": shape entry 1 is the negative integer -1 (shape entries "
                 "must be non-negative integers)"));
}

TEST(SafetensorsRule, NonIntegerShapeEntry) {
  EXPECT_THAT(refusal(object({entry("w", "U8", "[2.5]", 0, 2)}), "xx").message(),
              StartsWith("bad.safetensors: tensor \"w\": shape entry 0 is the non-integer number 2.5"));
  EXPECT_THAT(refusal(object({entry("w", "U8", "[\"2\"]", 0, 2)}), "xx").message(),
              StartsWith("bad.safetensors: tensor \"w\": shape entry 0 is a JSON string"));
  EXPECT_THAT(
      refusal(object({entry("w", "U8", "9223372036854775808", 0, 2)}), "xx").message(),
      StartsWith("bad.safetensors: tensor \"w\": shape is the integer 9223372036854775808, not an array"));
  EXPECT_THAT(refusal(object({entry("w", "U8", "[9223372036854775808]", 0, 2)}), "xx").message(),
              HasSubstr("shape entry 0 is the integer 9223372036854775808, above 9223372036854775807"));
}

TEST(SafetensorsRule, RankAboveTesseraLimitIsUnsupported) {
  Status s = refusal(object({entry("w", "U8", "[1,1,1,1,1,1,1]", 0, 1)}), "x");
  EXPECT_EQ(s.code(), Code::unsupported);
  EXPECT_THAT(
      s.message(),
      StartsWith("bad.safetensors: tensor \"w\": shape has 7 dimensions; Tessera tensors have at most 6"));
}

TEST(SafetensorsRule, DataOffsetsNotTwoIntegers) {
  EXPECT_THAT(
      refusal(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", "x").message(),
      StartsWith(
          "bad.safetensors: tensor \"w\": data_offsets is an array of 3 entries, not an array [begin, end]"));
  EXPECT_THAT(refusal(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", "x").message(),
              StartsWith("bad.safetensors: tensor \"w\": data_offsets entry 0 is the negative integer -1"));
}

TEST(SafetensorsRule, BeginAfterEnd) {
  EXPECT_THAT(refusal(object({entry("w", "U8", "[0]", 2, 1)}), "xx").message(),
              StartsWith("bad.safetensors: tensor \"w\": data_offsets [2, 1] has begin > end"));
}

TEST(SafetensorsRule, EndBeyondTheBuffer) {
  EXPECT_THAT(
      refusal(object({entry("w", "F32", "[2]", 0, 8)}), "xxxx").message(),
      StartsWith("bad.safetensors: tensor \"w\": data_offsets [0, 8] end beyond the 4-byte data buffer"));
}

TEST(SafetensorsRule, DtypeTimesShapeDiffersFromTheSpan) {
  EXPECT_EQ(
      refusal(object({entry("blocks.0.attn.w_q", "F32", "[3,5]", 0, 48)}), std::string(48, 'x')).message(),
      "bad.safetensors: tensor \"blocks.0.attn.w_q\": data_offsets [0, 48] span 48 bytes but F32 shape (3, "
      "5) "
      "needs 60 (dtype × shape must equal the byte span)");
}

TEST(SafetensorsRule, ShapeProductOverflows) {
  EXPECT_THAT(
      refusal(object({entry("w", "U8", "[4294967296,4294967296,16]", 0, 1)}), "x").message(),
      StartsWith(
          "bad.safetensors: tensor \"w\": shape [4294967296,4294967296,16] has more elements than fit"));
  EXPECT_THAT(
      refusal(object({entry("w", "F64", "[2305843009213693952]", 0, 1)}), "x").message(),
      StartsWith(
          "bad.safetensors: tensor \"w\": F64 shape (2305843009213693952) needs more bytes than fit in 64"));
}

TEST(SafetensorsRule, OverlappingTensors) {
  EXPECT_THAT(
      refusal(object({entry("a", "U8", "[4]", 0, 4), entry("b", "U8", "[4]", 2, 6)}), "xxxxxx").message(),
      StartsWith("bad.safetensors: tensor \"b\": data_offsets [2, 6] overlap tensor \"a\" [0, 4]"));
}

TEST(SafetensorsRule, HoleBetweenTensors) {
  EXPECT_THAT(
      refusal(object({entry("a", "U8", "[2]", 0, 2), entry("b", "U8", "[2]", 4, 6)}), "xxxxxx").message(),
      StartsWith("bad.safetensors: bytes [2, 4) of the data buffer belong to no tensor (a hole before tensor "
                 "\"b\""));
  EXPECT_THAT(refusal(object({entry("a", "U8", "[2]", 1, 3)}), "xxx").message(),
              StartsWith("bad.safetensors: bytes [0, 1) of the data buffer belong to no tensor"));
}

TEST(SafetensorsRule, TrailingBytesAfterTheLastTensor) {
  EXPECT_THAT(
      refusal(object({entry("a", "U8", "[2]", 0, 2)}), "xxxxx").message(),
      StartsWith("bad.safetensors: the data buffer has 3 bytes after the last tensor, which ends at 2"));
  EXPECT_THAT(refusal("{}", "x").message(),
              StartsWith("bad.safetensors: the data buffer has 1 bytes after the last tensor"));
}

TEST(SafetensorsRule, MetadataNotStringToString) {
  EXPECT_THAT(
      refusal(R"({"__metadata__":["a"]})", "").message(),
      StartsWith(
          "bad.safetensors: __metadata__ is a JSON array but must be an object mapping strings to strings"));
  EXPECT_THAT(
      refusal(R"({"__metadata__":{"epoch":3}})", "").message(),
      StartsWith("bad.safetensors: __metadata__ value for \"epoch\" is the integer 3 but must be a string"));
}
