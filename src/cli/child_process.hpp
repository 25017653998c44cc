// The child process of `distlock run` and the descriptors its runner waits on.
//
// `spawn_child` forks and execs the command in the job's process group: the child
// asks the kernel for SIGKILL when the runner dies (PR_SET_PDEATHSIG, checked
// against a race with getppid; it reaches this first process only, the rest of the
// job is the Watchdog's), gets back the signal mask and SIGPIPE
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
//   Watchdog dog = Watchdog::start();                        // leads the job's group
//   ChildSpec spec{.argv = {"sh", "-c", "echo $DISTLOCK_TOKEN"}, .env = env,
//                  .process_group = dog.group()};
//   Child child = spawn_child(spec);                          // throws on exec failure
//   ... poll(signals.fd()) ... reap_children() ... child.signal_job(SIGTERM) ...
#pragma once

#include <signal.h>
#include <sys/types.h>

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
  explicit SignalFd(const std::vector<int>& signals);
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
  /// The process group the child joins (the Watchdog's); 0: a new one it leads.
  pid_t process_group = 0;
  /// A terminal whose foreground process group becomes the child's group (the
  /// runner was in the foreground: Ctrl-C and job control go to the job), or -1.
  int terminal_fd = -1;
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
  Child(pid_t pid, pid_t group) noexcept : pid_(pid), group_(group) {}
  pid_t pid() const noexcept { return pid_; }
  pid_t group() const noexcept { return group_; }

  /// Sends `sig` to the whole job: its process group and every process the runner
  /// is the parent of (orphans it adopted as a child subreaper, even those that
  /// left the group). SIGTERM is followed by SIGCONT, so a stopped job acts on it.
  void signal_job(int sig) const noexcept;

 private:
  pid_t pid_ = -1;
  pid_t group_ = -1;
};

/// One change of state of a child of the runner (waitpid(-1, WNOHANG|WUNTRACED)).
struct ChildEvent {
  pid_t pid = 0;
  int status = 0;  ///< wait status: exited, killed or stopped
};
/// Reaps every child that changed state. `no_children` is set when the runner has
/// no child left at all (ECHILD): with PR_SET_CHILD_SUBREAPER that means no
/// process of the job is left.
std::vector<ChildEvent> reap_children(bool& no_children) noexcept;

/// The pids of the runner's children now (/proc/self/task/*/children).
std::vector<pid_t> child_pids();

/// A tiny process that leads the job's process group and kills that group with
/// SIGKILL when the runner dies (its pipe from the runner reaches end-of-file), so
/// no process of the job outlives a runner killed even by SIGKILL. It is not a
/// child of the runner (started through an intermediate process before the runner
/// becomes a subreaper), ignores every signal but SIGKILL/SIGSTOP, and holds the
/// group's id so it cannot be reused while the job runs. Started while other
/// threads run: between fork and _exit only async-signal-safe calls are made.
class Watchdog {
 public:
  static Watchdog start();
  pid_t group() const noexcept { return pid_; }
  /// The runner leaves on purpose with processes of the job still running
  /// (--leader-only): the watchdog exits without killing anybody.
  void disarm() noexcept;

 private:
  pid_t pid_ = -1;
  UniqueFd pipe_;  // write end; closed by the runner's death
};

/// Forks and execs. Returns once the exec succeeded; throws ExecError otherwise
/// (the failed child is reaped).
Child spawn_child(const ChildSpec& spec);

/// The descriptors open in this process now, sorted (from /proc/self/fd).
std::vector<int> open_fds();

/// Wait status → shell exit status: the exit code, or 128+N when killed by signal N.
int exit_status_of(int wait_status) noexcept;

}  // namespace distlock::cli
