// Helpers for tests that run code in another process, so that whatever crashes, aborts or runs out
// of memory there is reported instead of taking the suite with it: the built `tessera` binary run
// as a user runs it, and a function run in a forked child (optionally under an address-space
// limit) that sends back a string.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace tessera::testing_util {

// How the built `tessera` ended: its exit code (-1 when a signal killed it), stdout and stderr.
struct CliRun {
  int code = -1;
  std::string out, err;
};

// `tessera ARGS` run from the source folder through the shell; `before` is shell text put first
// ("ulimit -v 300000 && "). stderr goes through a file of its own per process and call: ctest
// runs suites side by side.
inline CliRun run_tessera_cli(const std::string& args, const std::string& before = "") {
  static int calls = 0;
  const std::string err_file = ::testing::TempDir() + "tessera_cli_stderr." + std::to_string(getpid()) + "." +
                               std::to_string(calls++) + ".txt";
  const std::string cmd = std::string("cd ") + TESSERA_SOURCE_DIR + " && " + before + TESSERA_BINARY_DIR +
                          "/tessera " + args + " 2>" + err_file;
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(err_file);
  r.err.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  std::remove(err_file.c_str());
  return r;
}

// What a forked child sent back, and how it ended (waitpid's status).
struct ChildRun {
  int status = 0;
  std::string text;
  bool exited() const { return WIFEXITED(status); }
};

// body() run in a forked child and its string sent back through a pipe. `headroom` > 0: the
// child's address space may grow by that many bytes only (RLIMIT_AS of its size plus headroom),
// so that an allocation of gigabytes fails there. The fork is made from a fresh thread: a child
// of a thread that has run OpenMP would hang in its first parallel region.
inline ChildRun run_in_child(const std::function<std::string()>& body, uint64_t headroom = 0) {
  ChildRun r;
  int fds[2];
  if (::pipe(fds) != 0) return r;
  pid_t pid = -1;
  std::thread([&] {
    pid = ::fork();
    if (pid != 0) return;
    ::close(fds[0]);
    if (headroom > 0) {
      unsigned long long pages = 0;
      if (FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
        std::fclose(f);
      }
      rlimit lim{};
      lim.rlim_cur = lim.rlim_max = pages * static_cast<unsigned long long>(::sysconf(_SC_PAGESIZE)) + headroom;
      ::setrlimit(RLIMIT_AS, &lim);
    }
    const std::string m = body();
    if (::write(fds[1], m.data(), m.size()) < 0) ::_exit(2);
    ::_exit(0);
  }).join();
  ::close(fds[1]);
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) r.text.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  if (pid > 0) ::waitpid(pid, &r.status, 0);
  return r;
}

}  // namespace tessera::testing_util
