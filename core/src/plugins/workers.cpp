// Worker processes for plugin encoding: fork, the request/response wire format, deadlines, and
// telling how a worker ended. See workers.h for the model and its thread-safety argument.
#include "plugins/workers.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <system_error>
#include <thread>

namespace tessera::plugin_workers {

namespace {

using Clock = std::chrono::steady_clock;

// The parent's end of every worker's socket. A child closes them all, so that a worker never
// holds another worker's socket open (its EOF must mean that its parent is gone).
std::mutex g_fds_mutex;
std::set<int>& parent_fds() {
  static std::set<int> fds;
  return fds;
}

// ---- Wire format: little helpers over a byte string --------------------------------------------
template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_bytes(std::string& out, const void* p, size_t n) {
  put<uint64_t>(out, n);
  if (n) out.append(static_cast<const char*>(p), n);
}
void put_string(std::string& out, const std::string& s) { put_bytes(out, s.data(), s.size()); }

// Reads what put() wrote, refusing to run past the end (the bytes came from another process).
struct Reader {
  std::string_view in;
  size_t at = 0;
  bool ok = true;
  template <class T>
  T get() {
    T v{};
    if (!ok || in.size() - at < sizeof v) {
      ok = false;
      return v;
    }
    std::memcpy(&v, in.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
  // n elements of `elem` bytes, counted in the frame; nullptr when the frame is short.
  const char* span(uint64_t n, size_t elem) {
    uint64_t bytes = 0;
    if (!ok || __builtin_mul_overflow(n, elem, &bytes) || bytes > in.size() - at) {
      ok = false;
      return nullptr;
    }
    const char* p = in.data() + at;
    at += bytes;
    return p;
  }
  std::string string() {
    const uint64_t n = get<uint64_t>();
    const char* p = span(n, 1);
    return p ? std::string(p, n) : std::string();
  }
};

// ---- Blocking I/O with a deadline ---------------------------------------------------------------
enum class Io { ok, eof, timeout, error, too_big };

// Waits until fd is ready for `events`, or the deadline (none: wait forever).
Io wait_for(int fd, short events, const Clock::time_point* deadline) {
  for (;;) {
    int ms = -1;
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return Io::timeout;
      ms = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    }
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Io::error;
    if (rc == 0) continue;  // loop: the deadline decides
    if (p.revents & events) return Io::ok;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return Io::eof;
  }
}

Io write_all(int fd, const char* p, size_t n, const Clock::time_point* deadline) {
  while (n > 0) {
    const Io w = wait_for(fd, POLLOUT, deadline);
    if (w != Io::ok) return w;
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) return errno == EPIPE || errno == ECONNRESET ? Io::eof : Io::error;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Io::ok;
}

Io read_all(int fd, char* p, size_t n, const Clock::time_point* deadline) {
  while (n > 0) {
    const Io w = wait_for(fd, POLLIN, deadline);
    if (w == Io::timeout || w == Io::error) return w;
    const ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) return errno == ECONNRESET ? Io::eof : Io::error;
    if (k == 0) return Io::eof;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Io::ok;
}

Io send_frame(int fd, const std::string& body, const Clock::time_point* deadline) {
  const uint64_t n = body.size();
  const Io h = write_all(fd, reinterpret_cast<const char*>(&n), sizeof n, deadline);
  return h == Io::ok ? write_all(fd, body.data(), body.size(), deadline) : h;
}

// A frame of at most `cap` bytes (a longer one is an error: the other side is not ours any more)
// into (*buffer)[0, *n). The buffer only grows: reused, it is not cleared again for every item.
Io recv_frame(int fd, std::string* buffer, uint64_t* n, uint64_t cap, const Clock::time_point* deadline) {
  const Io h = read_all(fd, reinterpret_cast<char*>(n), sizeof *n, deadline);
  if (h != Io::ok) return h;
  if (*n > cap) return Io::too_big;
  if (buffer->size() < *n) buffer->resize(*n);
  return read_all(fd, buffer->data(), *n, deadline);
}

// Bigger socket buffers than the default ~200 KB: an image's rows and picture are ~1.5 MB.
void widen(int fd) {
  const int bytes = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

// ---- The child ---------------------------------------------------------------------------------

// Bytes of address space this process maps now (the first field of /proc/self/statm, in pages).
uint64_t mapped_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long pages = 0;
  if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
  std::fclose(f);
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// CPU seconds this process has used.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

[[noreturn]] void serve(int fd, const EncodeFn& encode, const ItemLimits& limits) {
  // Ctrl-C, a hangup or a terminal stop go to the whole process group; they are the parent's to
  // act on (it stops the run cleanly), and must not turn the item in flight into a bad item.
  signal(SIGINT, SIG_IGN);
  signal(SIGQUIT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGTSTP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  // A hostile item's crash is reported by its signal; a core file of it helps nobody.
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer reserves terabytes of shadow address space: an RLIMIT_AS would break it.
  const bool limit_memory = false;
#else
  const bool limit_memory = limits.worker_memory_mb > 0;
#endif
  if (limit_memory) {
    // The child already maps what the parent mapped (copy-on-write); it may add this much more.
    const uint64_t cap = mapped_bytes() + static_cast<uint64_t>(limits.worker_memory_mb) * (1u << 20);
    rlimit r{};
    getrlimit(RLIMIT_AS, &r);
    if (r.rlim_max == RLIM_INFINITY || cap < r.rlim_max) {
      r.rlim_cur = cap;
      setrlimit(RLIMIT_AS, &r);
    }
  }
  const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  // Ready: from here on a signal sent to the process group finds the handlers above in place.
  const char ready = 'R';
  if (write_all(fd, &ready, 1, nullptr) != Io::ok) _exit(0);
  std::string request, response;
  uint64_t request_size = 0;
  for (;;) {
    // The parent never sends more than max_item_bytes of data plus the item's names.
    const uint64_t cap = limits.max_item_bytes > 0 ? static_cast<uint64_t>(limits.max_item_bytes) + (uint64_t{1} << 24)
                                                   : UINT64_MAX;
    const Io got = recv_frame(fd, &request, &request_size, cap, nullptr);
    if (got != Io::ok) _exit(got == Io::eof ? 0 : 2);  // the parent closed the socket, or died
    if (limits.item_timeout_s > 0) {
      // A backstop for an orphan: should the parent die while the plugin spins, the CPU limit
      // ends the spinning (the parent itself stops a worker at the wall-clock limit).
      rlimit r{};
      getrlimit(RLIMIT_CPU, &r);
      const double allow = cpu_seconds() + limits.item_timeout_s * static_cast<double>(cpus) + 2;
      const rlim_t soft = static_cast<rlim_t>(std::ceil(allow));
      if (r.rlim_max == RLIM_INFINITY || soft <= r.rlim_max) {
        r.rlim_cur = soft;
        setrlimit(RLIMIT_CPU, &r);
      }
    }
    try {
      PluginItem item;
      if (!unpack_item(std::string_view(request.data(), request_size), &item)) _exit(3);  // item.data views request
      pack_result(encode(item), &response);
      if (request.size() > (uint64_t{64} << 20)) std::string().swap(request);  // keep no huge item's copy
    } catch (const std::bad_alloc&) {
      pack_result(Status::Internal("out of memory while encoding"), &response);
    } catch (...) {
      pack_result(Status::Internal("the plugin threw a C++ exception out of encode() (a bug in the plugin)"), &response);
    }
    if (send_frame(fd, response, nullptr) != Io::ok) _exit(0);
  }
}

}  // namespace

// ---- Wire format --------------------------------------------------------------------------------

std::string pack_item(const PluginItem& item) {
  std::string out;
  out.reserve(item.data.size() + item.id.size() + item.source.size() + 64);
  put_string(out, item.id);
  put_string(out, item.source);
  put<uint64_t>(out, item.source_offset);
  put<uint32_t>(out, item.source_line);
  put_bytes(out, item.data.data(), item.data.size());
  return out;
}

bool unpack_item(std::string_view bytes, PluginItem* item) {
  Reader r{bytes};
  item->id = r.string();
  item->source = r.string();
  item->source_offset = r.get<uint64_t>();
  item->source_line = r.get<uint32_t>();
  const uint64_t n = r.get<uint64_t>();
  const char* p = r.span(n, 1);
  if (!r.ok) return false;
  item->data = std::string_view(p, n);
  return true;
}

std::string pack_result(const Result<std::vector<TokenRows>>& result) {
  std::string out;
  pack_result(result, &out);
  return out;
}

void pack_result(const Result<std::vector<TokenRows>>& result, std::string* buffer) {
  std::string& out = *buffer;
  out.clear();  // keeps its capacity: one allocation for the first item, none after
  if (!result.ok()) {
    put<int32_t>(out, static_cast<int32_t>(result.status().code()));
    put_string(out, result.status().message());
    return;
  }
  const std::vector<TokenRows>& seqs = result.value();
  size_t bytes = 16;
  for (const TokenRows& t : seqs)
    bytes += 160 + t.ids.size() * sizeof(int32_t) + (t.features.defined() ? t.features.nbytes() : 0) +
             t.positions.size() * sizeof t.positions[0] + t.roles.size() + t.provenance.size() * sizeof(tsr_provenance) +
             t.picture.pixels.size() + t.label.size();
  out.reserve(bytes);
  put<int32_t>(out, 0);
  put<uint64_t>(out, seqs.size());
  for (const TokenRows& t : seqs) {
    const uint64_t n = static_cast<uint64_t>(t.size());
    put<uint32_t>(out, t.kind);
    put<uint64_t>(out, n);
    if (t.kind == TSR_ROWS_IDS) {
      put_bytes(out, t.ids.data(), t.ids.size() * sizeof(int32_t));
    } else {
      // Features from take_rows() are a fresh contiguous (T, F) tensor.
      put<uint64_t>(out, static_cast<uint64_t>(t.features.dim(1)));
      put_bytes(out, t.features.raw_data(), t.features.nbytes());
    }
    put_bytes(out, t.positions.data(), t.positions.size() * sizeof t.positions[0]);
    put_bytes(out, t.roles.data(), t.roles.size());
    put_bytes(out, t.provenance.data(), t.provenance.size() * sizeof(tsr_provenance));
    put<int32_t>(out, t.grid_rows);
    put<int32_t>(out, t.grid_cols);
    const Picture& p = t.picture;
    put<int32_t>(out, p.width);
    put<int32_t>(out, p.height);
    put<int32_t>(out, p.channels);
    put<double>(out, p.x0);
    put<double>(out, p.x1);
    put<double>(out, p.y0);
    put<double>(out, p.y1);
    put_bytes(out, p.pixels.data(), p.pixels.size());
    put_string(out, t.label);
  }
}

Result<std::vector<TokenRows>> unpack_result(std::string_view bytes) {
  const Status garbled = Status::Internal("the worker's answer is garbled (a bug in the plugin or in Tessera)");
  Reader r{bytes};
  const int32_t code = r.get<int32_t>();
  if (!r.ok) return garbled;
  if (code != 0) {
    const std::string message = r.string();
    if (!r.ok) return garbled;
    return Status(code >= 1 && code <= 7 ? static_cast<Code>(code) : Code::internal, message);
  }
  const uint64_t n_seqs = r.get<uint64_t>();
  std::vector<TokenRows> out;
  for (uint64_t s = 0; s < n_seqs && r.ok; ++s) {
    TokenRows t;
    const uint32_t kind = r.get<uint32_t>();
    const uint64_t n = r.get<uint64_t>();
    if (!r.ok || kind > TSR_ROWS_FEATURES) return garbled;
    t.kind = static_cast<tsr_rows_kind>(kind);
    // Each block's byte count must be what n rows need: a mismatch is a garbled frame.
    auto block = [&](size_t elem) -> const char* {
      const uint64_t bytes_n = r.get<uint64_t>();
      uint64_t want = 0;
      if (!r.ok || __builtin_mul_overflow(n, elem, &want) || bytes_n != want) {
        r.ok = false;
        return nullptr;
      }
      return r.span(bytes_n, 1);
    };
    if (t.kind == TSR_ROWS_IDS) {
      const char* p = block(sizeof(int32_t));
      if (!p) return garbled;
      t.ids.resize(n);
      std::memcpy(t.ids.data(), p, n * sizeof(int32_t));
    } else {
      const uint64_t width = r.get<uint64_t>();
      uint64_t row_bytes = 0;
      if (!r.ok || width == 0 || __builtin_mul_overflow(width, sizeof(float), &row_bytes)) return garbled;
      const char* p = block(static_cast<size_t>(row_bytes));
      if (!p) return garbled;
      t.features = Tensor::empty({static_cast<int64_t>(n), static_cast<int64_t>(width)});
      std::memcpy(t.features.raw_data(), p, t.features.nbytes());
    }
    const char* pos = block(sizeof t.positions[0]);
    if (!pos) return garbled;
    t.positions.resize(n);
    std::memcpy(t.positions.data(), pos, n * sizeof t.positions[0]);
    const char* roles = block(1);
    if (!roles) return garbled;
    t.roles.assign(roles, roles + n);
    const char* prov = block(sizeof(tsr_provenance));
    if (!prov) return garbled;
    t.provenance.resize(n);
    std::memcpy(t.provenance.data(), prov, n * sizeof(tsr_provenance));
    t.grid_rows = r.get<int32_t>();
    t.grid_cols = r.get<int32_t>();
    Picture& p = t.picture;
    p.width = r.get<int32_t>();
    p.height = r.get<int32_t>();
    p.channels = r.get<int32_t>();
    p.x0 = r.get<double>();
    p.x1 = r.get<double>();
    p.y0 = r.get<double>();
    p.y1 = r.get<double>();
    const uint64_t n_pixels = r.get<uint64_t>();
    const char* px = r.span(n_pixels, 1);
    if (!r.ok) return garbled;
    p.pixels.assign(px, px + n_pixels);
    t.label = r.string();
    if (!r.ok) return garbled;
    out.push_back(std::move(t));
  }
  if (!r.ok || r.at != bytes.size()) return garbled;
  return out;
}

std::string signal_description(int sig) {
  const char* name = sigabbrev_np(sig);
  const char* what = sigdescr_np(sig);
  std::string s = name ? std::string("SIG") + name : "signal " + std::to_string(sig);
  if (what) {
    std::string w = what;
    if (!w.empty()) w[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(w[0])));
    s += " (" + w + ")";
  }
  return s;
}

// ---- Worker -------------------------------------------------------------------------------------

Worker::Worker(EncodeFn encode, ItemLimits limits, std::string who, int64_t max_response_bytes)
    : encode_(std::move(encode)), limits_(limits), who_(std::move(who)), max_response_bytes_(max_response_bytes) {
  // A limit beyond 10^7 s (four months), NaN or negative is no limit: the deadline's arithmetic
  // stays in range.
  if (!(limits_.item_timeout_s > 0) || limits_.item_timeout_s > 1e7) limits_.item_timeout_s = 0;
}

Worker::~Worker() { stop(); }

Status Worker::start() {
  if (pid_ > 0) return Status::Ok();
  TSR_RETURN_IF_ERROR(spawn());
  return wait_ready();
}

Status Worker::spawn() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return Status::IoError(who_ + ": cannot make a socket for a worker process: " + std::strerror(errno));
  widen(sv[0]);
  widen(sv[1]);
  std::lock_guard<std::mutex> lock(g_fds_mutex);  // held across fork: the child's copy of the set is whole
  std::set<int>& others = parent_fds();
  // fork() from a fresh thread: the child's one thread then has no thread-local state of the
  // caller's. The caller may be the model's thread, whose OpenMP pool (thread-local in libgomp)
  // names threads the child does not have: forked from it, a plugin's first parallel region hung.
  pid_t pid = -1;
  int e = 0;
  try {
    std::thread forker([&] {
      pid = fork();
      e = errno;
      if (pid == 0) {
        // The child: only its own end of its own socket stays open of the workers' sockets.
        for (int fd : others) close(fd);
        close(sv[0]);
        serve(sv[1], encode_, limits_);  // never returns
      }
    });
    forker.join();
  } catch (const std::system_error& x) {  // no thread to fork from
    pid = -1;
    e = x.code().value();
  }
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    return Status::IoError(who_ + ": cannot start a worker process (fork: " + std::strerror(e) +
                           "); set runtime.isolate: false to encode in the run's own process");
  }
  close(sv[1]);
  pid_ = pid;
  fd_ = sv[0];
  others.insert(fd_);
  ++started_;
  return Status::Ok();
}

Status Worker::wait_ready() {
  char ready = 0;
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  if (read_all(fd_, &ready, 1, &deadline) == Io::ok && ready == 'R') return Status::Ok();
  kill(pid_, SIGKILL);
  const std::string how = reap(false);
  return Status::Internal(who_ + ": a worker process did not start (it " + (how.empty() ? "ended" : how) +
                          "); set runtime.isolate: false to encode in the run's own process");
}

std::string Worker::reap(bool killed_by_us) {
  int status = 0;
  pid_t r;
  do r = waitpid(pid_, &status, 0);
  while (r < 0 && errno == EINTR);
  {
    std::lock_guard<std::mutex> lock(g_fds_mutex);
    parent_fds().erase(fd_);
  }
  close(fd_);
  fd_ = -1;
  pid_ = 0;
  if (killed_by_us || r < 0) return "";
  if (WIFSIGNALED(status)) return "was killed by " + signal_description(WTERMSIG(status));
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended";
}

void Worker::stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  reap(true);
}

Result<std::vector<TokenRows>> Worker::encode(const PluginItem& item) {
  // A worker that died between items (the out-of-memory killer, a stray kill) is replaced before
  // this item is sent, so that an innocent item is not blamed for it.
  int idle_status = 0;
  if (pid_ > 0 && waitpid(pid_, &idle_status, WNOHANG) == pid_) reap(true);
  TSR_RETURN_IF_ERROR(start().with_prefix(item.id));
  const bool timed = limits_.item_timeout_s > 0;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timed ? limits_.item_timeout_s : 0));
  const Clock::time_point* dl = timed ? &deadline : nullptr;
  Io io = send_frame(fd_, pack_item(item), dl);
  uint64_t n = 0;
  if (io == Io::ok) io = recv_frame(fd_, &answer_, &n, static_cast<uint64_t>(max_response_bytes_), dl);
  if (io == Io::ok) {
    Result<std::vector<TokenRows>> r = unpack_result(std::string_view(answer_.data(), n));
    if (answer_.size() > (uint64_t{64} << 20)) std::string().swap(answer_);  // keep no huge answer's buffer
    return r;
  }
  const std::string replaced = "; a new worker takes the next item";
  if (io == Io::timeout) {
    stop();
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", limits_.item_timeout_s);
    return Status::OutOfRange(item.id + ": " + who_ + " did not finish encoding it in " + secs +
                              " s (limit runtime.item_timeout_s = " + secs +
                              "): its worker process was stopped" + replaced +
                              " (raise runtime.item_timeout_s if such items are expected to be slow)");
  }
  if (io == Io::too_big) {
    // The worker checked the row limit already: only a picture over 1 GiB, or a worker whose
    // memory is not what it should be, gets here.
    stop();
    return Status::OutOfRange(item.id + ": " + who_ + "'s answer is larger than " + std::to_string(max_response_bytes_) +
                              " bytes (runtime.max_item_rows rows and 1 GiB of pictures and labels); its worker was stopped" +
                              replaced);
  }
  // The worker closed its socket: it died. waitpid says how.
  kill(pid_, SIGKILL);  // in case it only closed the socket
  std::string how = reap(false);
  if (how.empty()) how = "ended";
  std::string hint;
  if (how.find("SIGKILL") != std::string::npos || how.find("SIGXCPU") != std::string::npos)
    hint = " (something outside it stopped it: the kernel's out-of-memory killer, or its CPU-time backstop)";
  else if (limits_.worker_memory_mb > 0 && how.find("SIGABRT") != std::string::npos)
    hint = " (abort(), a failed assertion, an uncaught exception, or running out of its memory limit runtime.worker_memory_mb = " +
           std::to_string(limits_.worker_memory_mb) + " MiB)";
  return Status::Internal(item.id + ": " + who_ + "'s worker process " + how + " while encoding it" + hint + replaced);
}

}  // namespace tessera::plugin_workers
