// `distlock run`: the wait while the job runs. poll() on the signalfd and on an eventfd the
// loss signal bumps, with a timeout that ends at `deadline - grace`, then at the deadline.
// Every wake-up looks at the lease FIRST: a runner that was stopped (SIGSTOP) past its TTL
// learns of the loss before it forwards a signal or reaps and releases. No renewal with
// --grace left: SIGTERM to the whole job; deadline passed or loss signalled: SIGKILL to the
// whole job. Done when no child is left (or the command's first process, --leader-only).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <climits>

#include "cli/run/run.hpp"

namespace distlock::cli::run {

namespace {

class Supervisor {
 public:
  Supervisor(const RunSettings& s, const Hold& lease, Child& child, SignalFd& signals, Wakeup& wake)
      : s_(s), lease_(lease), child_(child), signals_(signals), wake_(wake) {}

  JobEnd run() {
    for (;;) {
      check_lease();
      forward_signals();
      reap();
      if (end_.leader_status && (no_children_ || s_.leader_only)) break;
      poll_for(signals_, wake_, next_timeout());
    }
    return end_;
  }

 private:
  // 1. The lease first, on every wake-up. Its deadline comes before the server
  //    can pass the lock on (by the safety margin), so the job is dead by then.
  void check_lease() {
    if (!end_.lost && !lease_.owns()) {
      end_.lost = true;
      end_.cause = loss_cause(lease_);
      child_.signal_job(SIGKILL);
    } else if (const Millis left = lease_.remaining(); !end_.lost && !end_.at_risk && left <= s_.grace) {
      end_.at_risk = true;
      const auto hold_left = lease_.max_hold_remaining();
      end_.at_max_hold = hold_left && *hold_left <= left;
      child_.signal_job(SIGTERM);
    }
  }

  // 2. Signals: forward the terminating ones to the whole job.
  void forward_signals() {
    wake_.drain();
    for (const auto& d : signals_.drain()) {
      if (!is_terminating(d.signal) && !is_catchable_stop(d.signal)) continue;
      // The kernel's SIGXCPU/SIGXFSZ are about the runner's own limits.
      if (d.from_kernel && (d.signal == SIGXCPU || d.signal == SIGXFSZ)) continue;
      child_.signal_job(d.signal);
      // A forwarded stop is not waited for: the process that stops may be one the
      // runner never hears of (not its child: a shell's command stopped between
      // vfork() and exec leaves the shell waiting for it, never stopped itself).
      // The job is ended as one stopped for the terminal.
      if (is_catchable_stop(d.signal) && end_.stopped_by == 0 && !end_.lost) {
        end_.stop_forwarded = true;
        stopped(d.signal);  // with SIGCONT: whatever did stop runs on to its end
      }
    }
  }

  // 3. Reap every child (the command, and orphans of the job adopted as a
  //    subreaper); notice a job stopped for the terminal.
  void reap() {
    bool reaped = false;
    for (const auto& ev : reap_children(no_children_)) {
      if (WIFSTOPPED(ev.status)) {
        if (is_terminal_stop(WSTOPSIG(ev.status)) && end_.stopped_by == 0 && !end_.lost) {
          stopped(WSTOPSIG(ev.status));
        }
        continue;
      }
      if (WIFCONTINUED(ev.status)) continue;
      reaped = true;
      if (ev.pid == child_.pid()) end_.leader_status = ev.status;
    }
    // Orphans of killed processes are adopted without a signal: kill them too.
    if (end_.lost && reaped && !no_children_) child_.signal_job(SIGKILL);
    if (end_.stopped_by != 0 && !end_.stop_killed && SteadyClock::now() >= stop_kill_at_) {
      end_.stop_killed = true;
      child_.signal_job(SIGKILL);
    }
  }

  /// The job stopped (or was sent a stop) by `sig`: SIGTERM now, SIGKILL after --grace.
  void stopped(int sig) {
    end_.stopped_by = sig;
    stop_kill_at_ = SteadyClock::now() + s_.grace;
    child_.signal_job(SIGTERM);
  }

  int next_timeout() const {
    int timeout = -1;
    if (!end_.lost) {
      const Millis left = lease_.remaining();
      if (left != Millis::max()) {
        const Millis until = end_.at_risk ? left : left - s_.grace;
        timeout = static_cast<int>(std::clamp<long long>(until.count() + 1, 1, INT_MAX));
      }
    } else {
      timeout = 20;  // an adopted orphan may appear without a SIGCHLD: look again
    }
    if (end_.stopped_by != 0 && !end_.stop_killed) {
      const int t = poll_timeout_until(stop_kill_at_);
      timeout = timeout < 0 ? t : std::min(timeout, t);
    }
    return timeout;
  }

  const RunSettings& s_;
  const Hold& lease_;
  Child& child_;
  SignalFd& signals_;
  Wakeup& wake_;
  JobEnd end_;
  bool no_children_ = false;
  SteadyClock::time_point stop_kill_at_{};
};

}  // namespace

JobEnd supervise(const RunSettings& s, const Hold& lease, Child& child, SignalFd& signals, Wakeup& wake) {
  return Supervisor(s, lease, child, signals, wake).run();
}

void hold_at_least(const RunSettings& s, const Hold& lease, SignalFd& signals, Wakeup& wake,
                   SteadyClock::time_point acquired_at) {
  const SteadyClock::time_point until = acquired_at + *s.min_hold;
  for (int rounds = 0; rounds < 1000000 && SteadyClock::now() < until && lease.owns(); ++rounds) {
    int timeout = poll_timeout_until(until);
    const Millis left = lease.remaining();
    if (left != Millis::max()) timeout = static_cast<int>(std::min<long long>(timeout, left.count() + 1));
    poll_for(signals, wake, std::max(timeout, 1));
    wake.drain();
    bool stop = false;
    for (const auto& d : signals.drain()) stop = stop || is_terminating(d.signal);
    if (stop) return;
  }
}

}  // namespace distlock::cli::run
