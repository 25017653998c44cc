#include "cli/child_process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <system_error>

#include "cli/commands.hpp"

namespace distlock::cli {

namespace {

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// ---- async-signal-safe helpers for the child between fork and exec ----------

bool is_inherited(const std::vector<int>& sorted_fds, int fd) noexcept {
  // std::binary_search on a vector neither allocates nor locks.
  return std::binary_search(sorted_fds.begin(), sorted_fds.end(), fd);
}

int parse_fd_name(const char* name) noexcept {
  if (*name == '\0') return -1;
  int v = 0;
  for (; *name; ++name) {
    if (*name < '0' || *name > '9') return -1;
    v = v * 10 + (*name - '0');
    if (v > 1 << 24) return -1;
  }
  return v;
}

// Closes every descriptor above stderr that the runner opened itself: the
// backend's sockets and lock files must not leak into the command (a leaked
// lock-file descriptor would even keep a kernel lock alive after the runner died).
void close_runner_fds(const std::vector<int>& inherited, int keep) noexcept {
  struct LinuxDirent64 {
    std::uint64_t d_ino;
    std::int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[1];
  };
  const int dir = ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    for (int fd = 3; fd < 4096; ++fd) {
      if (fd != keep && !is_inherited(inherited, fd)) ::close(fd);
    }
    return;
  }
  alignas(8) char buf[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      const auto* d = reinterpret_cast<const LinuxDirent64*>(buf + off);
      off += d->d_reclen;
      const int fd = parse_fd_name(d->d_name);
      if (fd > 2 && fd != dir && fd != keep && !is_inherited(inherited, fd)) ::close(fd);
    }
  }
  ::close(dir);
}

void write_errno_and_exit(int pipe_fd, int err) noexcept {
  ssize_t ignored = ::write(pipe_fd, &err, sizeof err);
  (void)ignored;
  ::_exit(127);
}

}  // namespace

// ---- UniqueFd ---------------------------------------------------------------

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

// ---- SignalFd ---------------------------------------------------------------

SignalFd::SignalFd(const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  if (int rc = ::pthread_sigmask(SIG_BLOCK, &set, &previous_); rc != 0) {
    throw std::system_error(rc, std::generic_category(), "pthread_sigmask");
  }
  fd_ = UniqueFd(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  if (fd_.get() < 0) throw_errno("signalfd");
}

std::vector<SignalFd::Delivery> SignalFd::drain() {
  std::vector<Delivery> out;
  signalfd_siginfo info{};
  for (;;) {
    const ssize_t n = ::read(fd_.get(), &info, sizeof info);
    if (n == static_cast<ssize_t>(sizeof info)) {
      out.push_back(Delivery{static_cast<int>(info.ssi_signo), info.ssi_code == SI_KERNEL});
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN: nothing more pending
  }
  return out;
}

// ---- Wakeup -----------------------------------------------------------------

Wakeup::Wakeup() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_.get() < 0) throw_errno("eventfd");
}

void Wakeup::notify() const noexcept {
  const std::uint64_t one = 1;
  ssize_t ignored = ::write(fd_.get(), &one, sizeof one);
  (void)ignored;
}

void Wakeup::drain() const noexcept {
  std::uint64_t value = 0;
  ssize_t ignored = ::read(fd_.get(), &value, sizeof value);
  (void)ignored;
}

// ---- Child ------------------------------------------------------------------

void Child::signal_job(int sig) const noexcept {
  if (pid_ <= 0) return;
  ::kill(-group_, sig);
  std::vector<pid_t> children;
  try {
    children = child_pids();
  } catch (...) {
    children.clear();
  }
  if (children.empty()) ::kill(pid_, sig);  // no /proc children list: the first process at least
  for (pid_t c : children) ::kill(c, sig);
  if (sig == SIGTERM) signal_job(SIGCONT);
}

std::vector<ChildEvent> reap_children(bool& no_children) noexcept {
  std::vector<ChildEvent> out;
  no_children = false;
  for (int i = 0; i < 4096; ++i) {  // bounded: one round of state changes
    int status = 0;
    const pid_t r = ::waitpid(-1, &status, WNOHANG | WUNTRACED);
    if (r > 0) {
      try {
        out.push_back({r, status});
      } catch (...) {
      }
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == ECHILD) no_children = true;
    break;
  }
  return out;
}

std::vector<pid_t> child_pids() {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const int fd = ::open((task.path() / "children").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
    ::close(fd);
    long v = 0;
    bool in = false;
    for (char c : text) {
      if (c >= '0' && c <= '9') {
        v = v * 10 + (c - '0');
        in = true;
      } else if (in) {
        out.push_back(static_cast<pid_t>(v));
        v = 0;
        in = false;
      }
    }
    if (in) out.push_back(static_cast<pid_t>(v));
  }
  return out;
}

// ---- Watchdog ---------------------------------------------------------------

Watchdog Watchdog::start() {
  int cmd[2], report[2];
  if (::pipe2(cmd, O_CLOEXEC) != 0) throw_errno("pipe2");
  UniqueFd cmd_read(cmd[0]), cmd_write(cmd[1]);
  if (::pipe2(report, O_CLOEXEC) != 0) throw_errno("pipe2");
  UniqueFd report_read(report[0]), report_write(report[1]);

  const pid_t middle = ::fork();
  if (middle < 0) throw_errno("fork");
  if (middle == 0) {
    const pid_t dog = ::fork();
    if (dog != 0) ::_exit(dog < 0 ? 1 : 0);  // the watchdog is nobody's child but init's
    ::setpgid(0, 0);
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig == SIGKILL || sig == SIGSTOP) continue;
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      sigemptyset(&ign.sa_mask);
      ::sigaction(sig, &ign, nullptr);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // NOLINT(concurrency-mt-unsafe): single thread after fork
    const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd <= 2; ++fd) {
      if (null_fd >= 0) ::dup2(null_fd, fd);
    }
    const pid_t self = ::getpid();
    ssize_t ignored = ::write(report_write.get(), &self, sizeof self);
    (void)ignored;
    close_runner_fds({}, cmd_read.get());  // the runner's sockets, lock files and this pipe's write end
    for (;;) {
      char c = 0;
      const ssize_t n = ::read(cmd_read.get(), &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n == 1 && c == 'd') ::_exit(0);  // disarmed
      if (n == 1) continue;
      break;  // end-of-file: the runner is gone
    }
    ::kill(-self, SIGKILL);  // the whole job, and this process last
    ::_exit(0);
  }
  int status = 0;
  while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
  }
  report_write = UniqueFd();
  cmd_read = UniqueFd();
  pid_t dog = -1;
  ssize_t n = 0;
  do {
    n = ::read(report_read.get(), &dog, sizeof dog);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof dog) || dog <= 0) {
    throw std::system_error(ECHILD, std::generic_category(), "cannot start the job's watchdog process");
  }
  Watchdog w;
  w.pid_ = dog;
  w.pipe_ = std::move(cmd_write);
  return w;
}

void Watchdog::disarm() noexcept {
  const char d = 'd';
  ssize_t ignored = ::write(pipe_.get(), &d, 1);
  (void)ignored;
  pipe_ = UniqueFd();
}

Child spawn_child(const ChildSpec& spec) {
  // Everything the child touches is built here, before fork: after fork in a
  // multi-threaded process the child may only call async-signal-safe functions.
  std::vector<char*> argv;
  argv.reserve(spec.argv.size() + 1);
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  envp.reserve(spec.env.size() + 1);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw_errno("pipe2");
  UniqueFd exec_result_read(pipe_fds[0]);
  UniqueFd exec_result_write(pipe_fds[1]);

  const pid_t runner = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork");
  if (pid == 0) {
    const int report = exec_result_write.get();
    if (::setpgid(0, spec.process_group) != 0) write_errno_and_exit(report, errno);
    if (spec.terminal_fd >= 0) {
      // SIGTTOU is blocked (the runner's mask): a background group may take the terminal.
      ::tcsetpgrp(spec.terminal_fd, spec.process_group != 0 ? spec.process_group : ::getpid());
    }
    // The command must never outlive its runner: it would run unprotected.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) write_errno_and_exit(report, errno);
    // The runner may have died before prctl took effect: then our parent is
    // already somebody else and no death signal will come.
    if (::getppid() != runner) ::_exit(127);
    close_runner_fds(spec.inherited_fds, report);
    if (spec.reset_sigpipe) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      ::sigaction(SIGPIPE, &dfl, nullptr);
    }
    // After fork the child has a single thread, so the process mask is its own.
    ::sigprocmask(SIG_SETMASK, &spec.signal_mask, nullptr);  // NOLINT(concurrency-mt-unsafe)
    ::execvpe(argv[0], argv.data(), envp.data());
    write_errno_and_exit(report, errno);
  }

  // Both sides set the group (and the terminal's foreground), so a signal sent to
  // it right after fork cannot miss, and the command never reads the terminal
  // from a background group.
  const pid_t group = spec.process_group != 0 ? spec.process_group : pid;
  ::setpgid(pid, group);
  if (spec.terminal_fd >= 0) ::tcsetpgrp(spec.terminal_fd, group);
  exec_result_write = UniqueFd();
  int child_errno = 0;
  ssize_t n = 0;
  do {
    n = ::read(exec_result_read.get(), &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  Child child(pid, group);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throw ExecError{child_errno};
  }
  return child;
}

std::vector<int> open_fds() {
  std::vector<int> fds;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = parse_fd_name(entry.path().filename().c_str());
    if (fd >= 0) fds.push_back(fd);
  }
  // The listing includes the directory's own descriptor, closed by now: drop it, or
  // a socket later given the same number would pass as inherited.
  std::erase_if(fds, [](int fd) { return ::fcntl(fd, F_GETFD) == -1; });
  std::sort(fds.begin(), fds.end());
  return fds;
}

int exit_status_of(int wait_status) noexcept {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return exit_status::software;
}

}  // namespace distlock::cli
