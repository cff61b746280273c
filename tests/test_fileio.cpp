// read_file, write_file_atomic and MappedFile on real files in a fresh temporary directory:
// contents, error messages, and that a failed write leaves no temporary file behind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tessera/fileio.h"

using namespace tessera;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

// A directory of its own per test, removed afterwards.
class FileIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("tessera_fileio_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path dir_;
};

const std::string kBinary("a\0b\xff\n\r", 6);

}  // namespace

TEST_F(FileIo, WriteThenReadRoundTripsBinaryBytes) {
  ASSERT_TRUE(write_file_atomic(path("x.bin"), kBinary).ok());
  Result<std::string> r = read_file(path("x.bin"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value(), kBinary);
  EXPECT_EQ(listing(), std::vector<std::string>{"x.bin"});
}

TEST_F(FileIo, WriteOfPiecesWritesThemInOrder) {
  const std::string_view pieces[] = {"head|", "", std::string_view(kBinary), "|tail"};
  ASSERT_TRUE(write_file_atomic(path("p.bin"), std::span<const std::string_view>(pieces)).ok());
  EXPECT_EQ(read_file(path("p.bin")).value(), "head|" + std::string(kBinary) + "|tail");
  EXPECT_EQ(listing(), std::vector<std::string>{"p.bin"});
}

TEST_F(FileIo, WriteReplacesAnExistingFileAndLeavesNoTemporary) {
  ASSERT_TRUE(write_file_atomic(path("x.txt"), "first version, longer").ok());
  ASSERT_TRUE(write_file_atomic(path("x.txt"), "second").ok());
  EXPECT_EQ(read_file(path("x.txt")).value(), "second");
  EXPECT_EQ(listing(), std::vector<std::string>{"x.txt"});
}

TEST_F(FileIo, WriteOfNothingMakesAnEmptyFile) {
  ASSERT_TRUE(write_file_atomic(path("empty"), "").ok());
  EXPECT_EQ(fs::file_size(path("empty")), 0u);
}

TEST_F(FileIo, WrittenFileHasTheUsualPermissions) {
  const mode_t mask = ::umask(022);
  ::umask(mask);
  ASSERT_TRUE(write_file_atomic(path("p"), "x").ok());
  struct stat st {};
  ASSERT_EQ(::stat(path("p").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u & ~mask);
}

TEST_F(FileIo, WriteIntoAMissingDirectoryNamesThePathAndTheReason) {
  const std::string target = path("no/such/dir/x.bin");
  Status st = write_file_atomic(target, "x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::not_found);
  EXPECT_THAT(st.message(), HasSubstr(target + ": cannot create a temporary file"));
  EXPECT_THAT(st.message(), HasSubstr("No such file or directory"));
  EXPECT_TRUE(listing().empty());
}

TEST_F(FileIo, FailedRenameRemovesTheTemporaryFile) {
  fs::create_directories(dir_ / "occupied");  // renaming a file over a directory fails (EISDIR)
  Status st = write_file_atomic(path("occupied"), "x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::io_error);
  EXPECT_THAT(st.message(), HasSubstr(path("occupied") + ": cannot rename the temporary file over it"));
  EXPECT_THAT(st.message(), HasSubstr("removed"));
  EXPECT_EQ(listing(), std::vector<std::string>{"occupied"});
}

TEST_F(FileIo, ReadOfAMissingFileIsNotFound) {
  Result<std::string> r = read_file(path("missing"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::not_found);
  EXPECT_THAT(r.status().message(),
              HasSubstr(path("missing") + ": cannot open for reading: No such file or directory"));
}

TEST_F(FileIo, ReadOfADirectoryFails) {
  Result<std::string> r = read_file(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::io_error);
  EXPECT_THAT(r.status().message(), HasSubstr(dir_.string() + ": cannot read: Is a directory"));
}

TEST_F(FileIo, MappedFileSeesTheBytes) {
  std::ofstream(path("m.bin"), std::ios::binary) << kBinary;
  Result<std::shared_ptr<MappedFile>> m = MappedFile::open(path("m.bin"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->path(), path("m.bin"));
  ASSERT_EQ((*m)->size(), kBinary.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*m)->data()), (*m)->size()), kBinary);
}

TEST_F(FileIo, MappedEmptyFileHasNoData) {
  std::ofstream(path("empty")).flush();
  Result<std::shared_ptr<MappedFile>> m = MappedFile::open(path("empty"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->size(), 0u);
  EXPECT_EQ((*m)->data(), nullptr);
}

TEST_F(FileIo, MappingAMissingFileOrADirectoryFails) {
  Result<std::shared_ptr<MappedFile>> missing = MappedFile::open(path("missing"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::not_found);
  EXPECT_THAT(missing.status().message(), HasSubstr(path("missing") + ": cannot open for reading"));

  Result<std::shared_ptr<MappedFile>> dir = MappedFile::open(dir_.string());
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(dir.status().message(), HasSubstr(dir_.string() + ": not a regular file"));
}
