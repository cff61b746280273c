// Whole-file reads, atomic writes (temp file beside the target, fsync, rename, fsync the
// directory) and read-only memory maps, on POSIX. Knows nothing about file formats.
#include "tessera/fileio.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace tessera {

namespace {

// "<path>: <what>: <strerror>", as not_found for a missing file and io_error otherwise.
Status os_error(const std::string& path, const std::string& what, int err) {
  std::string m = path + ": " + what + ": " + std::strerror(err);
  if (err == ENOENT) return Status::NotFound(m + " (check the path and that its directory exists)");
  if (err == EACCES || err == EPERM) return Status::IoError(m + " (check the permissions)");
  return Status::IoError(m);
}

// Closes the descriptor on scope exit unless released.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Creates a new, unique file beside `path` (O_EXCL, so never someone else's) with mode 0666
// before the umask, like an ordinary create.
Result<std::pair<std::string, int>> create_temp_beside(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  for (int attempt = 0;; ++attempt) {
    std::string tmp =
        dir + "." + base + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) return std::make_pair(std::move(tmp), fd);
    if (errno != EEXIST || attempt == 100)
      return os_error(path, "cannot create a temporary file beside it (" + tmp + ")", errno);
  }
}

// Writes everything; returns 0 or the errno of the failed write.
int write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

}  // namespace

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Result<std::string> read_file(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return os_error(path, "cannot open for reading", errno);
  std::string out;
  struct stat st {};
  if (::fstat(f.fd, &st) == 0 && S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n == 0) return out;
    if (n < 0) {
      if (errno == EINTR) continue;
      return os_error(path, "cannot read", errno);
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

Status write_file_atomic(const std::string& path, std::string_view bytes) {
  return write_file_atomic(path, std::span<const std::string_view>(&bytes, 1));
}

Status write_file_atomic(const std::string& path, std::span<const std::string_view> pieces) {
  TSR_ASSIGN_OR_RETURN(auto temp, create_temp_beside(path));
  const std::string& tmp = temp.first;
  Fd f{temp.second};
  auto fail = [&](const std::string& what, int err) {
    if (f.fd >= 0) ::close(f.release());
    ::unlink(tmp.c_str());
    return os_error(path, what + " (temporary file " + tmp + " removed)", err);
  };
  for (std::string_view bytes : pieces)
    if (int err = write_all(f.fd, bytes)) return fail("cannot write", err);
  if (::fsync(f.fd) != 0) return fail("cannot fsync", errno);
  if (::close(f.release()) != 0) return fail("cannot close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return fail("cannot rename the temporary file over it", errno);

  // The rename is durable only once the directory entry is on disk.
  const std::string dir = parent_dir(path);
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0 || ::fsync(d.fd) != 0)
    return os_error(path, "written, but cannot fsync its directory " + dir, errno);
  return Status::Ok();
}

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return os_error(path, "cannot open for reading", errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return os_error(path, "cannot stat", errno);
  if (!S_ISREG(st.st_mode))
    return Status::IoError(path + ": not a regular file, so it cannot be memory-mapped (give a file path)");
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = static_cast<size_t>(st.st_size);
  if (m->size_ == 0) return m;
  void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (p == MAP_FAILED)
    return os_error(path, "cannot memory-map " + std::to_string(m->size_) + " bytes", errno);
  m->data_ = static_cast<const uint8_t*>(p);
  return m;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace tessera
