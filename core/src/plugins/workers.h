// Encoding in a worker process: a plugin's encode() that segfaults, aborts, loops forever, throws
// or allocates without bound takes down only its worker; the item becomes a bad item whose reason
// names the signal or the limit, and the next item gets a fresh worker.
// Internal to core/src/plugins (Encoder::isolate() is the public face). Not for decode() or
// augment(): those run in the calling process.
//
// How: fork() gives a child that shares the parent's memory copy-on-write, the loaded plugin and
// the plugin instance created by Encoder::create() included. The child closes every other
// worker's socket, ignores terminal signals (Ctrl-C is the parent's to handle), limits its address
// space, then serves requests on a UNIX socket: one item in, its rows (or the error) out, framed
// by a 64-bit length. The parent waits with poll() and a deadline; past it, it SIGKILLs the worker.
//
// Threads: the first worker is forked by Encoder::isolate(), which the runner calls before the
// model exists, so no oneDNN/OpenMP thread is alive yet. A replacement may be forked while other
// threads run. Every fork happens on a fresh, short-lived thread, so the child's one thread has
// no thread-local state of the caller's (libgomp keeps a thread's OpenMP pool there: a child of
// the model's thread hung in the plugin's first parallel region). The child touches only the
// plugin, malloc (fork-safe in glibc) and its socket, and ends with _exit(); were a lock that
// another parent thread held at fork time ever needed, the item's time limit ends the wait.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/plugins.h"

namespace tessera::plugin_workers {

using EncodeFn = std::function<Result<std::vector<TokenRows>>(const PluginItem&)>;

class Worker {
 public:
  // `encode` runs in the child (the in-process encoder); `who` names the plugin in messages.
  Worker(EncodeFn encode, ItemLimits limits, std::string who, int64_t max_response_bytes);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Forks the worker now (Encoder::isolate() calls it while the process has one thread).
  Status start();
  // The item's rows, or a bad-item status: the plugin's own error, or the worker's death or time
  // limit. A dead or stopped worker is replaced on the next call.
  Result<std::vector<TokenRows>> encode(const PluginItem& item);
  pid_t pid() const { return pid_; }  // 0 when none is running
  int64_t started() const { return started_; }  // workers forked so far (1 + replacements)

 private:
  Status spawn();               // fork; the child serves requests
  Status wait_ready();          // the child's first byte: its signal handlers and limits are set
  void stop();                 // SIGKILL and reap
  std::string reap(bool killed_by_us);  // waits for the child; says how it ended
  EncodeFn encode_;
  ItemLimits limits_;
  std::string who_;
  int64_t max_response_bytes_;
  pid_t pid_ = 0;
  int fd_ = -1;
  int64_t started_ = 0;
  std::string answer_;  // the last answer's bytes, reused
};

// The wire format, exposed for tests. A request: the item's fields and bytes. A response: a
// tessera::Code and a message, or the sequences with every field of TokenRows.
std::string pack_item(const PluginItem& item);
bool unpack_item(std::string_view bytes, PluginItem* item);  // item->data views bytes
std::string pack_result(const Result<std::vector<TokenRows>>& r);
void pack_result(const Result<std::vector<TokenRows>>& r, std::string* buffer);  // reuses buffer's memory
Result<std::vector<TokenRows>> unpack_result(std::string_view bytes);

// "SIGSEGV (segmentation fault)".
std::string signal_description(int sig);

}  // namespace tessera::plugin_workers
