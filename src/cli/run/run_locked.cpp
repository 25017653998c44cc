// `distlock run`: the runner's life in four steps.
//   1. The flags were checked (flags.cpp) before anything here runs.
//   2. Block every catchable terminating signal, SIGCHLD and SIGTTOU (every thread
//      started later inherits the mask, so the signals only ever arrive through one
//      signalfd), then connect and acquire on a worker thread while the main thread
//      still answers a signal by dying of it (acquire.cpp).
//   3. Start the job's watchdog (it leads the job's group and kills it if the runner
//      dies), become a child subreaper, start the command in the watchdog's group
//      (the terminal's foreground group when the runner had it).
//   4. Supervise the job until it ends (supervise.cpp), then release and report.
#include <signal.h>
#include <sys/prctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <stop_token>

#include "cli/metrics_http.hpp"
#include "cli/run/multi_hold.hpp"
#include "cli/run/run.hpp"
#include "distlock/text.hpp"

extern char** environ;

namespace distlock::cli::run {

namespace {

/// The job's parent span: the hold span of a Lease, the set span of --lock (multi_hold.hpp);
/// nullopt without a tracer, and for a read-write hold (several locks, no span of its own).
std::optional<TraceContext> job_parent_span(const Hold& hold) {
  if (const auto* lease = dynamic_cast<const Lease*>(&hold)) return lease->trace_context();
  if (const auto* multi = dynamic_cast<const MultiHold*>(&hold)) return multi->trace_context();
  return std::nullopt;
}

std::vector<std::string> child_environment(const RunSettings& s, const Hold& lease,
                                           const std::string& metrics_addr) {
  std::vector<std::string> env;
  const std::optional<TraceContext> trace = job_parent_span(lease);
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    // An outer runner's variables must not leak into this lock's command, nor the
    // runner's password (the job gets it only in DISTLOCK_URL, with --pass-url-password).
    if (kv.starts_with("DISTLOCK_NAME=") || kv.starts_with("DISTLOCK_TOKEN=") ||
        kv.starts_with("DISTLOCK_URL=") || kv.starts_with("DISTLOCK_PASSWORD=") ||
        kv.starts_with("DISTLOCK_METRICS_ADDR=") || kv.starts_with("DISTLOCK_PERMIT=") ||
        kv.starts_with("DISTLOCK_ONCE_SLOT=") || kv.starts_with("DISTLOCK_TOKENS=")) {
      continue;
    }
    // The job's parent span is the hold's (a Lease's hold span, the --lock set's span).
    if (kv.starts_with("TRACEPARENT=") && trace) continue;
    env.emplace_back(kv);
  }
  if (trace) env.push_back("TRACEPARENT=" + trace->traceparent());
  // --lock: $DISTLOCK_TOKENS (name=token per name); NAME and TOKEN only for a set of one.
  const auto* multi = dynamic_cast<const MultiHold*>(&lease);
  if (multi) env.push_back(multi->tokens_env());
  if (!multi || s.names.size() == 1) env.push_back("DISTLOCK_NAME=" + s.name);
  if (s.permits > 0) {  // the permit's lock is "<name>\x1fsem\x1f<i>"
    const std::string& held = lease.name();
    env.push_back("DISTLOCK_PERMIT=" + held.substr(held.rfind('\x1f') + 1));
  }
  if (lease.has_token()) env.push_back("DISTLOCK_TOKEN=" + std::to_string(lease.token()));
  env.push_back("DISTLOCK_URL=" + child_url(s.url));
  if (!metrics_addr.empty()) env.push_back("DISTLOCK_METRICS_ADDR=" + metrics_addr);
  env.insert(env.end(), s.env.begin(), s.env.end());
  return env;
}

/// The terminal whose foreground process group the runner is in (standard input,
/// output or error), or -1. The job's group is made that terminal's foreground for
/// the job's life, as a shell does, so Ctrl-C and job control reach the whole job.
int foreground_terminal() {
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
    if (::isatty(fd) && ::tcgetpgrp(fd) == ::getpgrp()) return fd;
  }
  return -1;
}

void take_back_terminal(int terminal) {
  if (terminal >= 0) ::tcsetpgrp(terminal, ::getpgrp());
}

std::vector<int> blocked_signals() {
  std::vector<int> blocked = terminating_signals();
  blocked.push_back(SIGCHLD);
  blocked.push_back(SIGTTOU);  // so the runner may hand the terminal on and take it back
  blocked.push_back(SIGTSTP);  // stops go to the job: a stopped runner would not renew
  blocked.push_back(SIGTTIN);
  return blocked;
}

/// The job was ended because the lease was lost or about to be: the exit status, or -1.
int report_ended_job(const RunSettings& s, const JobEnd& end, const Child& child, Hold& lease) {
  const std::string group = " (group " + std::to_string(child.group()) + ")";
  if (end.lost) {
    print_error(lock_label(s) + " lost while the command ran: " + end.cause +
                "; sent SIGKILL to the command's processes" + group);
    return exit_status::lost;
  }
  if (!end.at_risk) return -1;
  std::error_code ignored;
  if (lease.owns()) lease.release(ignored);
  if (end.at_max_hold) {
    print_error(lock_label(s) + " reached --max-hold " + format_duration(*s.lock.max_hold) +
                ": sent SIGTERM to the command's processes" + group + " --grace " + format_duration(s.grace) +
                " before it; they ended before it");
  } else {
    print_error(lock_label(s) + " was about to be lost: no renewal succeeded and only --grace " +
                format_duration(s.grace) + " was left before its local deadline; sent SIGTERM to the " +
                "command's processes" + group + ", which ended before it");
  }
  return exit_status::lost;
}

/// The release after the command; its status, or the runner's when the lease was found lost.
int release_after(const RunSettings& s, const JobEnd& end, Hold& lease, int status) {
  std::error_code ec;
  lease.release(ec);
  if (end.stopped_by != 0) {
    print_error(
        (end.stop_forwarded
             ? "the runner was sent " + signal_name(end.stopped_by) +
                   ", forwarded to the command (a stopped command would hold " + lock_label(s) +
                   " for ever); sent it SIGTERM"
             : "the command was stopped by " + signal_name(end.stopped_by) +
                   " (it waited for the terminal while holding " + lock_label(s) + "); sent it SIGTERM") +
        (end.stop_killed ? " and SIGKILL after the " + format_duration(s.grace) + " grace" : std::string()) +
        "; lock released");
    return status;
  }
  if (ec == errc::lost) {
    print_error(lock_label(s) + " was found lost when the command ended (status " + std::to_string(status) +
                "): the server no longer held it for this runner");
    return exit_status::lost;
  }
  if (ec) {
    // The command ran protected; only the early release failed. Its status wins.
    print_error("warning: release of " + lock_label(s) + " failed (" + ec.message() +
                "); it will expire by its TTL");
  }
  return status;
}

struct Held {
  Client& client;
  Hold& lease;
  SteadyClock::time_point acquired_at;
  std::optional<OnceMark> once;  // the mark to store after a successful run
};

/// Steps 3 and 4: starts the job under the lease, supervises it, releases and reports.
int run_job(const RunSettings& s, Held& h, SignalFd& signals, Wakeup& wake, const std::string& metrics_addr,
            const std::vector<int>& inherited_fds, bool reset_sigpipe) {
  // The watchdog leads the job's group and kills it if the runner dies; it is
  // started before the runner becomes a subreaper, so it is not the runner's child.
  Watchdog watchdog = Watchdog::start();
  if (!s.leader_only) ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const int terminal = foreground_terminal();
  ChildSpec spec;
  spec.argv = s.command;
  spec.env = child_environment(s, h.lease, metrics_addr);
  if (h.once) spec.env.push_back("DISTLOCK_ONCE_SLOT=" + std::to_string(h.once->slot));
  spec.process_group = watchdog.group();
  spec.terminal_fd = terminal;
  spec.signal_mask = signals.previous_mask();
  spec.reset_sigpipe = reset_sigpipe;
  spec.inherited_fds = inherited_fds;
  Child child;
  try {
    child = spawn_child(spec);
  } catch (const ExecError& e) {
    take_back_terminal(terminal);
    std::error_code ignored;
    h.lease.release(ignored);
    print_error("cannot run \"" + s.command.front() + "\": " + std::generic_category().message(e.error));
    return e.error == ENOENT ? exit_status::not_found : exit_status::cannot_execute;
  }
  const JobEnd end = supervise(s, h.lease, child, signals, wake);
  take_back_terminal(terminal);
  if (s.leader_only && !end.lost) watchdog.disarm();
  if (int rc = report_ended_job(s, end, child, h.lease); rc >= 0) return rc;

  const int status = exit_status_of(*end.leader_status);
  // A command that exited 0 ran, also when a stop signal was forwarded to it on the way.
  if (h.once && status == 0) {
    if (int rc = record_once_per(s, h.client, h.lease, *h.once); rc >= 0) return rc;
  }
  if (s.min_hold && end.stopped_by == 0) {
    hold_at_least(s, h.lease, signals, wake, h.acquired_at);
    if (!h.lease.owns()) {  // lost while held on after the command: nothing ran unprotected
      std::error_code ignored;
      h.lease.release(ignored);
      return status;
    }
  }
  return release_after(s, end, h.lease, status);
}

}  // namespace

std::string loss_cause(const Hold& lease) {
  if (lease.loss_reason() == LossReason::max_hold) {
    return "--max-hold passed since the lock was granted (" + lease.loss_detail() + ")";
  }
  // The library says why (Hold::loss_detail), on any thread and before the log line.
  if (lease.stop_token().stop_requested()) {
    if (std::string detail = lease.loss_detail(); !detail.empty()) return detail;
  }
  return "its local deadline passed without a successful renewal (runner paused or server unreachable)";
}

int run_locked(const RunSettings& settings) {
  RunSettings s = settings;
  if (int rc = start_tracing(s); rc >= 0) return rc;
  const std::int64_t fired_unix_ms = unix_ms_now();  // --once-per: the slot this firing is for
  const std::vector<int> inherited_fds = open_fds();
  SignalFd signals(blocked_signals());
  // A write to a server that closed its socket must not kill the runner; the
  // command gets SIGPIPE back if the runner's own parent had left it default.
  struct sigaction ignore_pipe {};
  struct sigaction previous_pipe {};
  ignore_pipe.sa_handler = SIG_IGN;
  sigemptyset(&ignore_pipe.sa_mask);
  ::sigaction(SIGPIPE, &ignore_pipe, &previous_pipe);

  // Started after the signals are blocked: its thread inherits the mask.
  std::unique_ptr<MetricsServer> metrics;
  std::function<void(const Client&)> on_connected;
  if (int rc = start_metrics(s, metrics, on_connected); rc >= 0) return rc;

  auto wake = std::make_shared<Wakeup>();
  Acquisition acq = connect_and_acquire(s, signals, wake, std::move(on_connected));
  if (acq.ec) {
    print_error(not_acquired_message(s, acq.ec, acq.what));
    // --lock-delay on a backend that cannot enforce it: a flag this URL does not take.
    if (acq.ec == errc::not_supported && s.lock.lock_delay.count() > 0) return exit_status::usage;
    return exit_code_for(acq.ec);
  }
  const std::unique_ptr<Hold> lease = std::move(acq.lease);
  Held held{*acq.client, *lease, SteadyClock::now(), std::nullopt};  // acquired_at: after the grant
  // Woken by the loss signal itself (the stop token), on the thread that detects the
  // loss, not by an on_lost callback queued behind others on the event thread. The
  // callback owns its share of the eventfd so a late call can never write into a
  // reused fd.
  std::stop_callback wake_on_loss(lease->stop_token(), [wake] { wake->notify(); });

  // Nothing is done on the command's behalf with a lease that is already gone.
  if (!lease->owns()) {
    print_error(lock_label(s) + " was lost before the command started: " + loss_cause(*lease));
    return exit_status::lost;
  }
  if (s.once_per) {
    if (int rc = check_once_per(s, *acq.client, *lease, fired_unix_ms, held.once); rc >= 0) return rc;
  }
  return run_job(s, held, signals, *wake, metrics ? metrics->address() : std::string(), inherited_fds,
                 previous_pipe.sa_handler == SIG_DFL);
}

}  // namespace distlock::cli::run
