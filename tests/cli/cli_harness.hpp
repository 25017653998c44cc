// Black-box harness for the `distlock` binary: start it with separate stdout and
// stderr files, signal it, wait for it with a deadline, read what it printed.
//
// Thread-safety: one Cli per thread.
//
// Example:
//   Cli runner = Cli::start({"run", "--url", url, "job", "--", "true"}, dir);
//   ASSERT_EQ(runner.wait(5s), 0);
//   EXPECT_EQ(runner.err(), "");
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace distlock::testing {

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The lines of `text`, without their newlines (a last line without one counts too).
inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

/// Polls until `path` exists (true) or `timeout` passes (false).
inline bool wait_for_file(const std::filesystem::path& path, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec) && std::filesystem::file_size(path, ec) > 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

/// True while `pid` is a live process (a zombie counts as dead).
inline bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == EPERM;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

class Cli {
 public:
  /// Starts `distlock args...` with stdout/stderr in files under `dir`, stdin from
  /// /dev/null, in its own process group (as cron would), with `env` added.
  static Cli start(const std::vector<std::string>& args, const std::filesystem::path& dir,
                   const std::vector<std::string>& env = {}) {
    static int seq = 0;
    Cli c;
    const std::string stem = "cli-" + std::to_string(::getpid()) + "-" + std::to_string(seq++);
    c.out_path_ = dir / (stem + ".out");
    c.err_path_ = dir / (stem + ".err");
    std::vector<std::string> argv{DISTLOCK_CLI_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const std::string out = c.out_path_.string(), err = c.err_path_.string();
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no runner outlives a crashed test
      if (::getppid() != parent) ::_exit(127);
      ::setpgid(0, 0);
      const int in_fd = ::open("/dev/null", O_RDONLY);
      const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(in_fd, 0);
      ::dup2(out_fd, 1);
      ::dup2(err_fd, 2);
      ::close_range(3, ~0U, 0);  // only what a cron job would have: 0, 1, 2
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    c.pid_ = pid;
    c.started_ = std::chrono::steady_clock::now();
    return c;
  }

  /// Runs to completion (bounded by `timeout`); returns the exit status or -1.
  static Cli run(const std::vector<std::string>& args, const std::filesystem::path& dir,
                 std::chrono::milliseconds timeout = std::chrono::seconds(20),
                 const std::vector<std::string>& env = {}) {
    Cli c = start(args, dir, env);
    c.wait(timeout);
    return c;
  }

  Cli() = default;
  Cli(Cli&& o) noexcept { *this = std::move(o); }
  Cli& operator=(Cli&& o) noexcept {
    std::swap(pid_, o.pid_);
    std::swap(status_, o.status_);
    std::swap(out_path_, o.out_path_);
    std::swap(err_path_, o.err_path_);
    std::swap(started_, o.started_);
    std::swap(ended_, o.ended_);
    return *this;
  }
  ~Cli() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }

  pid_t pid() const { return pid_; }
  void signal(int sig) const {
    if (pid_ > 0 && !status_) ::kill(pid_, sig);
  }

  /// The exit status (128+N when killed by signal N), or -1 if still running after `timeout`.
  int wait(std::chrono::milliseconds timeout) {
    if (status_) return code();
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = st;
        ended_ = std::chrono::steady_clock::now();
        return code();
      }
      if (std::chrono::steady_clock::now() >= end) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  bool running() { return wait(std::chrono::milliseconds(0)) == -1; }

  int code() const {
    if (!status_) return -1;
    if (WIFEXITED(*status_)) return WEXITSTATUS(*status_);
    return 128 + WTERMSIG(*status_);
  }
  /// Start to exit.
  std::chrono::milliseconds elapsed() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(ended_ - started_);
  }
  std::chrono::steady_clock::time_point ended_at() const { return ended_; }
  std::string out() const { return slurp(out_path_); }
  std::string err() const { return slurp(err_path_); }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::filesystem::path out_path_, err_path_;
  std::chrono::steady_clock::time_point started_{}, ended_{};
};

}  // namespace distlock::testing
