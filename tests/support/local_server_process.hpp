// Test support: what every harness of one server process has in common, written once: the
// temporary directory it keeps its data and log in, the loopback port it listens on and its
// process, stopped by pid when the harness goes. RedisServer, each sentinel of
// RedisSentinelGroup and ZkServer are one each (the SQL servers have DatabaseServer, which
// also copies a data template).
//
//   port(), pid(), dir()  where it listens; its process id (-1 before the first start); its directory
//   running()             whether the process is still alive (reaps it when it has exited)
//   kill()                SIGKILL (a crash), reaped within 10 s
//   pause(), resume()     SIGSTOP / SIGCONT: the server hangs with its sockets open
//   ~LocalServerProcess   SIGCONT and SIGTERM (Process::stop), SIGKILL after 2 s, reaped
//
// Thread-safety: one harness per test or test suite, driven from one thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "support/process.hpp"

namespace distlock::testing {

class LocalServerProcess {
 public:
  /// An empty temporary directory named after `tmp_prefix`; no port and no process yet.
  explicit LocalServerProcess(const std::string& tmp_prefix);
  virtual ~LocalServerProcess();
  LocalServerProcess(const LocalServerProcess&) = delete;
  LocalServerProcess& operator=(const LocalServerProcess&) = delete;

  std::uint16_t port() const { return port_; }
  pid_t pid() const { return process_.pid(); }
  const std::filesystem::path& dir() const { return dir_.path(); }
  bool running() { return process_.running(); }
  /// SIGKILL and reap (10 s at the most): a crash.
  void kill();
  /// SIGSTOP / SIGCONT: the server hangs without closing its sockets.
  void pause();
  void resume();

  /// Starts `argv` with its output to dir()/`log_name` (the port is the caller's to choose).
  void launch(const std::vector<std::string>& argv, const std::string& log_name);
  /// The port the next start listens on: a free loopback port.
  void pick_free_port() { port_ = free_port(); }

 protected:
  TempDir dir_;
  std::uint16_t port_ = 0;
  Process process_;
};

}  // namespace distlock::testing
