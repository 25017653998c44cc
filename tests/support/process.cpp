#include "support/process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace distlock::testing {

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Process Process::spawn(const std::vector<std::string>& argv, const std::string& log_file,
                       const std::vector<std::string>& extra_env) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    // A server must not outlive the test that started it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);
    if (!log_file.empty()) {
      const int fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
    }
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    for (const auto& e : extra_env) ::putenv(const_cast<char*>(e.c_str()));
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  Process p;
  p.pid_ = pid;
  return p;
}

Process::Process(Process&& o) noexcept : pid_(o.pid_), reaped_(o.reaped_), status_(o.status_) {
  o.pid_ = -1;
}

Process& Process::operator=(Process&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0 && !reaped_) stop(std::chrono::milliseconds(0));
    pid_ = o.pid_;
    reaped_ = o.reaped_;
    status_ = o.status_;
    o.pid_ = -1;
  }
  return *this;
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
}

bool Process::running() {
  if (pid_ <= 0 || reaped_) return false;
  const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    return false;
  }
  return true;
}

namespace {
// Whether every thread of `pid` is stopped (or gone): /proc/<pid>/task/*/stat state.
bool all_threads_stopped(pid_t pid) {
  std::error_code ec;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream in(t.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) continue;  // thread gone meanwhile
    const char state = stat[paren + 2];
    if (state != 'T' && state != 't' && state != 'Z' && state != 'X') return false;
  }
  return true;
}
}  // namespace

void Process::signal(int sig) const {
  if (pid_ <= 0 || reaped_) return;
  ::kill(pid_, sig);
  if (sig != SIGSTOP) return;
  // kill() only queues the stop: a thread running on another CPU may still answer a
  // request for a moment. A test that pauses a server relies on it being silent once
  // this returns, so wait (bounded, 5 s) until every thread is stopped.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!all_threads_stopped(pid_) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int Process::wait_for(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  if (reaped_) return status_;
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return status_;
    }
    if (std::chrono::steady_clock::now() >= end) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int Process::exit_code(std::chrono::milliseconds limit) {
  const int status = wait_for(limit);
  if (status == -1) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void Process::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0 || reaped_) return;
  ::kill(pid_, SIGCONT);
  ::kill(pid_, SIGTERM);
  if (wait_for(grace) == -1) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
    reaped_ = true;
  }
}

char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // pid (comm) state ppid ...: comm may hold spaces and parentheses, so parse after the last ')'.
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return 0;
  return stat[paren + 2];
}

std::vector<pid_t> child_pids(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string line;
    std::getline(in, line);
    const auto paren = line.rfind(')');
    if (paren == std::string::npos) continue;  // gone meanwhile
    std::istringstream rest(line.substr(paren + 1));
    char state = 0;
    pid_t ppid = 0;
    if (rest >> state >> ppid && ppid == parent) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

std::uint16_t free_port() {
  // Bind to port 0 to let the kernel pick; random start avoids reuse races
  // between parallel test binaries.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::runtime_error("bind failed");
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool wait_port_open(std::uint16_t port, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::close(fd);
    if (rc == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string run_to_end(const std::vector<std::string>& argv, const std::string& log) {
  Process p = Process::spawn(argv, log);
  const int st = p.wait_for(std::chrono::seconds(120));
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return "\"" + argv[0] + " ... " + argv.back() + "\" failed (status " + std::to_string(st) + "):\n" + text;
  }
  return {};
}

bool have_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= p.size()) {
    const auto colon = p.find(':', start);
    const std::string dir = p.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (!dir.empty() && ::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return false;
}

bool in_ci() {
  const char* v = std::getenv("CI");
  return v && (std::strcmp(v, "true") == 0 || std::strcmp(v, "1") == 0);
}

std::filesystem::path self_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::current_path() : p.parent_path();
}

}  // namespace distlock::testing
