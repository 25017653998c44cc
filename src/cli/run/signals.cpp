// Which signals `distlock run` blocks, forwards to its job or dies of, and its poll().
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "cli/run/run.hpp"

namespace distlock::cli::run {

[[noreturn]] void die_of_signal(int sig) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(sig);
  ::_exit(128 + sig);
}

/// Every signal whose default action ends the runner and that a process can
/// catch: blocked from the start and read through the signalfd, so none of them can
/// end the runner (and free the lock) while its job runs; forwarded to the job.
std::vector<int> terminating_signals() {
  std::vector<int> v = {SIGINT,    SIGTERM, SIGHUP,  SIGQUIT, SIGUSR1,   SIGUSR2, SIGALRM,
                        SIGVTALRM, SIGPROF, SIGPOLL, SIGPWR,  SIGSTKFLT, SIGXCPU, SIGXFSZ};
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) v.push_back(s);
  return v;
}

bool is_terminating(int sig) {
  return sig != SIGCHLD && sig != SIGTTOU && sig != SIGTSTP && sig != SIGTTIN;
}

/// The catchable stops. Unlike SIGSTOP they must not pause the runner while its job
/// runs: a paused runner renews nothing, and its job would run on past the hand-over.
/// They are forwarded to the job instead (which is then ended like any job stopped
/// for the terminal); before the job exists they stop the runner as usual.
bool is_catchable_stop(int sig) {
  return sig == SIGTSTP || sig == SIGTTIN;
}

/// The job-control stops that mean a job waits for the terminal or the user: it
/// would hold the lock while stopped, and nothing would end it.
bool is_terminal_stop(int sig) {
  return sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU;
}

int poll_for(const SignalFd& signals, const Wakeup& wake, int timeout_ms) {
  pollfd fds[2] = {{signals.fd(), POLLIN, 0}, {wake.fd(), POLLIN, 0}};
  const int rc = ::poll(fds, 2, timeout_ms);
  return rc < 0 && errno == EINTR ? 0 : rc;
}

int poll_timeout_until(SteadyClock::time_point deadline) {
  const auto left = std::chrono::ceil<Millis>(deadline - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace distlock::cli::run
