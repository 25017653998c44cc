// The child process of `distlock run` and the descriptors its runner waits on.
//
// `spawn_child` forks and execs the command so that it can never run unprotected:
// the child asks the kernel for SIGKILL when the runner dies (PR_SET_PDEATHSIG,
// checked against a race with getppid), gets back the signal mask and SIGPIPE
// disposition the runner started with, and loses every descriptor the runner
// opened itself (backend sockets, lock files) while keeping the ones the runner
// inherited (so `distlock run x -- cmd 3>file` works as with flock(1)).
//
// Thread-safety: spawn_child may be called while other threads run (the engine's
// renewer); between fork and exec the child calls only async-signal-safe functions
// on data prepared before the fork. The other types are used by one thread.
//
// Example:
//   SignalFd signals({SIGINT, SIGTERM, SIGHUP, SIGCHLD});   // blocks them first
//   ChildSpec spec{.argv = {"sh", "-c", "echo $DISTLOCK_TOKEN"}, .env = env};
//   Child child = spawn_child(spec);                          // throws on exec failure
//   ... poll(signals.fd()) ... child.try_reap() ...
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace distlock::cli {

/// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const noexcept { return fd_; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

/// Blocks `signals` in the calling thread (threads started later inherit the mask)
/// and delivers them through a signalfd instead. The mask is not restored on
/// destruction: a signal still pending then would act with its default action and
/// replace the exit status the runner is about to return.
class SignalFd {
 public:
  explicit SignalFd(std::initializer_list<int> signals);
  ~SignalFd() = default;
  SignalFd(const SignalFd&) = delete;
  SignalFd& operator=(const SignalFd&) = delete;

  int fd() const noexcept { return fd_.get(); }
  /// The mask the process had before (what a child should get back).
  const sigset_t& previous_mask() const noexcept { return previous_; }

  struct Delivery {
    int signal = 0;
    bool from_kernel = false;  ///< sent by the kernel (e.g. the terminal's Ctrl-C), not by kill(2)
  };
  /// Reads every pending signal without blocking.
  std::vector<Delivery> drain();

 private:
  UniqueFd fd_;
  sigset_t previous_{};
};

/// A counter other threads can bump to wake a poll() (eventfd, non-blocking).
class Wakeup {
 public:
  Wakeup();
  int fd() const noexcept { return fd_.get(); }
  void notify() const noexcept;  ///< async-signal-safe
  void drain() const noexcept;

 private:
  UniqueFd fd_;
};

struct ChildSpec {
  std::vector<std::string> argv;  ///< argv[0] is searched in PATH
  std::vector<std::string> env;   ///< the complete environment, "KEY=value"
  /// Put the child in its own process group and signal the whole group (so a shell
  /// script's subprocesses stop too). Off for an interactive terminal job, where
  /// the child must stay in the terminal's foreground group.
  bool own_process_group = true;
  sigset_t signal_mask{};          ///< mask to restore in the child
  bool reset_sigpipe = false;      ///< restore SIGPIPE to SIG_DFL in the child
  std::vector<int> inherited_fds;  ///< sorted; every other descriptor >2 is closed in the child
};

/// Thrown by spawn_child when the command could not be executed.
struct ExecError {
  int error = 0;  ///< errno of execvpe (ENOENT: not found)
};

class Child {
 public:
  Child() = default;
  Child(pid_t pid, bool own_group) noexcept : pid_(pid), own_group_(own_group) {}
  pid_t pid() const noexcept { return pid_; }
  bool own_process_group() const noexcept { return own_group_; }

  /// Sends `sig` to the child's process group (own-group mode) or to the child.
  void signal(int sig) const noexcept;
  /// True while any process of the child's group (own-group mode) is alive.
  bool group_alive() const noexcept;
  /// Reaps the child if it has exited; returns its wait status.
  std::optional<int> try_reap() noexcept;
  /// Blocks until the child exits; returns its wait status.
  int reap_blocking() noexcept;

 private:
  pid_t pid_ = -1;
  bool own_group_ = false;
};

/// Forks and execs. Returns once the exec succeeded; throws ExecError otherwise
/// (the failed child is reaped).
Child spawn_child(const ChildSpec& spec);

/// The descriptors open in this process now, sorted (from /proc/self/fd).
std::vector<int> open_fds();

/// Wait status → shell exit status: the exit code, or 128+N when killed by signal N.
int exit_status_of(int wait_status) noexcept;

}  // namespace distlock::cli
