// Test support: child processes, free loopback ports, temporary directories and
// the "server required under CI" rule shared by every test binary.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace distlock::testing {

/// A temporary directory removed (recursively) on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "distlock-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// A child process started with execvp; killed (SIGKILL) and reaped on destruction.
class Process {
 public:
  Process() = default;
  /// Starts argv[0] (searched in PATH). stdout/stderr go to `log_file` if given.
  static Process spawn(const std::vector<std::string>& argv, const std::string& log_file = {},
                       const std::vector<std::string>& extra_env = {});
  Process(Process&& o) noexcept;
  Process& operator=(Process&& o) noexcept;
  ~Process();

  pid_t pid() const { return pid_; }
  bool running();
  void signal(int sig) const;
  /// Waits for exit up to `timeout`; returns the raw wait status or -1 on timeout.
  int wait_for(std::chrono::milliseconds timeout);
  /// Waits for exit up to `limit`; the exit code, 128 + N after signal N, or -1 on timeout.
  int exit_code(std::chrono::milliseconds limit);
  /// SIGTERM, then SIGKILL after `grace`; reaps.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

/// The scheduler state letter of process `pid` ('R', 'S', 'T', 'Z', … from /proc/<pid>/stat),
/// or 0 when it is gone.
char process_state(pid_t pid);
/// The processes whose parent is `parent` (every /proc/<pid>/stat's ppid field).
std::vector<pid_t> child_pids(pid_t parent);

/// A TCP port on 127.0.0.1 that was free a moment ago.
std::uint16_t free_port();
/// True once 127.0.0.1:port accepts connections (polls until `timeout`).
bool wait_port_open(std::uint16_t port, std::chrono::milliseconds timeout);
/// Runs `argv` to its end (at most 120 s), its output in `log`: "" when it exited 0, else a
/// message naming the command and its status, followed by the log.
std::string run_to_end(const std::vector<std::string>& argv, const std::string& log);
/// True if `program` is found in PATH (or is an executable path).
bool have_program(const std::string& program);
/// True when running under CI (CI=true): a missing server is then a failure, not a skip.
bool in_ci();
/// Directory of the running test binary (to find sibling helper executables).
std::filesystem::path self_dir();

}  // namespace distlock::testing
