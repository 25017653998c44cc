// `distlock run`: run a command while holding a lock (the cron single-runner).
//
// The runner's life in four steps:
//   1. Validate every flag before touching the network (usage errors exit 64).
//   2. Block SIGINT/SIGTERM/SIGHUP/SIGCHLD (every thread started later inherits the
//      mask, so the signals only ever arrive through one signalfd), then connect and
//      acquire on a worker thread while the main thread still answers a signal by
//      dying of it, as a program blocked in a wait is expected to.
//   3. Start the command (see child_process.hpp: parent-death signal, clean fds).
//   4. Wait in poll() on the signalfd and on an eventfd the engine's loss callback
//      bumps, with a timeout that ends at the lease's local deadline. Every wake-up
//      looks at Lease::owns() FIRST: a runner that was stopped (SIGSTOP) past its TTL
//      learns of the loss before it forwards a signal or reaps and releases.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/child_process.hpp"
#include "cli/commands.hpp"
#include "core/engine.hpp"
#include "distlock/client.hpp"

extern char** environ;

namespace distlock::cli {

namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr Millis kDefaultGrace{std::chrono::seconds(5)};

struct RunFlags {
  std::string url;
  std::string ttl = "30s";
  std::string wait;
  bool no_wait = false;
  std::string grace;
  CLI::Option* grace_option = nullptr;
  std::string name;
  std::vector<std::string> command;  // when given without "--"
  CLI::Option* wait_option = nullptr;
};

struct RunSettings {
  std::string url;  // as given, or the default the library resolves
  std::string name;
  LockOptions lock;
  Millis grace{};
  std::vector<std::string> command;
};

[[noreturn]] void usage_error(const std::string& message) {
  throw_error(make_error_code(errc::invalid_argument), message);
}

RunSettings validate(const RunFlags& flags, const std::vector<std::string>& after_dashes) {
  RunSettings s;
  s.name = flags.name;
  if (!flags.command.empty() && !after_dashes.empty()) {
    usage_error("unexpected argument \"" + flags.command.front() +
                "\" before \"--\": write distlock run [OPTIONS] NAME -- COMMAND [ARGS...]");
  }
  s.command = after_dashes.empty() ? flags.command : after_dashes;
  if (s.command.empty()) {
    usage_error("no command given: write it after \"--\", e.g. distlock run " +
                (s.name.empty() ? std::string("NAME") : s.name) + " -- /usr/local/bin/job");
  }
  if (s.command.front().empty()) usage_error("the command name is empty");
  std::string why;
  if (detail::Engine::check_name(s.name, why)) usage_error(why);

  s.lock.ttl = parse_duration_flag("--ttl", flags.ttl);
  if (s.lock.ttl < LockOptions::min_ttl) {
    usage_error("--ttl " + flags.ttl + " is below the minimum of " + format_duration(LockOptions::min_ttl));
  }
  if (flags.no_wait) {
    s.lock.wait = Millis(0);
  } else if (flags.wait_option && flags.wait_option->count() > 0) {
    s.lock.wait = parse_duration_flag("--wait", flags.wait);
  }  // else: wait until acquired
  if (flags.grace_option && flags.grace_option->count() > 0) {
    s.grace = parse_duration_flag("--grace", flags.grace);
  } else {
    // The 5 s default gives way to a shorter --ttl (half of it), so a short lease
    // does not need an explicit --grace; an explicit one must be shorter than --ttl.
    s.grace = std::min<Millis>(kDefaultGrace, s.lock.ttl / 2);
  }
  if (s.grace >= s.lock.ttl) {
    usage_error("--grace " + format_duration(s.grace) + " must be shorter than --ttl " +
                format_duration(s.lock.ttl) +
                " (a command that lost its lock must be stopped before the lease could pass on)");
  }
  if (auto ec = LockOptions(s.lock).validate_and_fill()) usage_error("--ttl " + flags.ttl + " is not usable");
  s.url = flags.url.empty() ? default_url() : flags.url;
  return s;
}

/// Dies of `sig` with its default action, so the shell sees "killed by SIGINT"
/// exactly as if no handler had been in the way.
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

bool is_terminating(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
}

int poll_for(const SignalFd& signals, const Wakeup& wake, int timeout_ms) {
  pollfd fds[2] = {{signals.fd(), POLLIN, 0}, {wake.fd(), POLLIN, 0}};
  const int rc = ::poll(fds, 2, timeout_ms);
  return rc < 0 && errno == EINTR ? 0 : rc;
}

struct Acquisition {
  std::optional<Client> client;
  std::optional<Lease> lease;
  std::error_code ec;
  std::string what;
};

/// Connects and acquires on a worker thread; the main thread keeps answering
/// signals meanwhile (a terminating signal ends the runner: nothing is held yet).
Acquisition connect_and_acquire(const RunSettings& s, SignalFd& signals,
                                const std::shared_ptr<Wakeup>& wake) {
  auto result = std::make_shared<Acquisition>();
  std::thread worker([result, wake, url = s.url, name = s.name, lock = s.lock] {
    try {
      ClientOptions options = tool_client_options();
      // zk://: the session (whose timeout is the lease's real length: a killed runner
      // frees the lock when it ends) is sized to --ttl unless the URL sets session_timeout.
      options.lock_defaults.ttl = lock.ttl;
      Client client = connect(url, options);
      result->client = client;
      result->lease.emplace(client.acquire(name, lock));
    } catch (const std::system_error& e) {
      result->ec = e.code();
      result->what = e.what();
    } catch (const std::exception& e) {
      result->ec = make_error_code(errc::protocol_error);
      result->what = e.what();
    } catch (...) {
      result->ec = make_error_code(errc::protocol_error);
      result->what = "unexpected error while acquiring lock \"" + name + "\"";
    }
    wake->notify();
  });
  for (;;) {
    poll_for(signals, *wake, -1);
    for (const auto& d : signals.drain()) {
      if (is_terminating(d.signal)) {
        worker.detach();
        die_of_signal(d.signal);
      }
    }
    if (result->ec || result->lease) break;
  }
  worker.join();
  wake->drain();
  return std::move(*result);
}

std::string not_acquired_message(const RunSettings& s, const std::error_code& ec, const std::string& what) {
  if (ec == errc::busy) return "lock \"" + s.name + "\" is held by another owner (one attempt, not waiting)";
  if (ec == errc::timeout) {
    return "lock \"" + s.name + "\" was not acquired within --wait " + format_duration(*s.lock.wait) +
           ": another owner holds it";
  }
  return what;
}

std::vector<std::string> child_environment(const RunSettings& s, const Lease& lease) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    // An outer runner's variables must not leak into this lock's command.
    if (kv.starts_with("DISTLOCK_NAME=") || kv.starts_with("DISTLOCK_TOKEN=") ||
        kv.starts_with("DISTLOCK_URL=")) {
      continue;
    }
    env.emplace_back(kv);
  }
  env.push_back("DISTLOCK_NAME=" + s.name);
  if (lease.has_token()) env.push_back("DISTLOCK_TOKEN=" + std::to_string(lease.token()));
  env.push_back("DISTLOCK_URL=" + s.url);
  return env;
}

/// In an interactive terminal job the command stays in our process group (so the
/// terminal's Ctrl-C and job control reach it as usual); otherwise (cron, scripts,
/// services) it leads its own group and every signal goes to the whole group, so a
/// shell script's subprocesses stop with it.
bool interactive_foreground() {
  return ::isatty(STDIN_FILENO) && ::tcgetpgrp(STDIN_FILENO) == ::getpgrp();
}

std::string loss_cause(const Lease& lease) {
  if (lease.stop_token().stop_requested()) {
    const std::string warning = last_library_warning();
    if (const auto p = warning.find(" lost: "); p != std::string::npos) return warning.substr(p + 7);
  }
  return "its local deadline passed without a successful renewal (runner paused or server unreachable)";
}

int poll_timeout_until(SteadyClock::time_point deadline) {
  const auto left = std::chrono::ceil<Millis>(deadline - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

int run_locked(const RunSettings& s) {
  const std::vector<int> inherited_fds = open_fds();
  SignalFd signals({SIGINT, SIGTERM, SIGHUP, SIGCHLD});
  // A write to a server that closed its socket must not kill the runner; the
  // command gets SIGPIPE back if the runner's own parent had left it default.
  struct sigaction ignore_pipe {};
  struct sigaction previous_pipe {};
  ignore_pipe.sa_handler = SIG_IGN;
  sigemptyset(&ignore_pipe.sa_mask);
  ::sigaction(SIGPIPE, &ignore_pipe, &previous_pipe);

  auto wake = std::make_shared<Wakeup>();
  Acquisition acq = connect_and_acquire(s, signals, wake);
  if (acq.ec) {
    print_error(not_acquired_message(s, acq.ec, acq.what));
    return exit_code_for(acq.ec);
  }
  Lease lease = std::move(*acq.lease);
  // The callback may run on the engine's renewer thread at any later time; it owns
  // its share of the eventfd so a late call can never write into a reused fd.
  lease.on_lost([wake] { wake->notify(); });

  // Nothing is done on the command's behalf with a lease that is already gone.
  if (!lease.owns()) {
    print_error("lock \"" + s.name + "\" was lost before the command started: " + loss_cause(lease));
    return exit_status::lost;
  }

  ChildSpec spec;
  spec.argv = s.command;
  spec.env = child_environment(s, lease);
  spec.own_process_group = !interactive_foreground();
  spec.signal_mask = signals.previous_mask();
  spec.reset_sigpipe = previous_pipe.sa_handler == SIG_DFL;
  spec.inherited_fds = inherited_fds;
  Child child;
  try {
    child = spawn_child(spec);
  } catch (const ExecError& e) {
    std::error_code ignored;
    lease.release(ignored);
    print_error("cannot run \"" + s.command.front() + "\": " + std::generic_category().message(e.error));
    return e.error == ENOENT ? exit_status::not_found : exit_status::cannot_execute;
  }

  std::optional<int> child_status;
  bool lost = false;
  bool killed = false;
  std::string cause;
  SteadyClock::time_point kill_at{};
  for (;;) {
    // 1. The lease first, on every wake-up.
    if (!lost && !lease.owns()) {
      lost = true;
      cause = loss_cause(lease);
      child.signal(SIGTERM);
      kill_at = SteadyClock::now() + s.grace;
    }
    // 2. Signals: forward the terminating ones; SIGCHLD only wakes us to reap.
    wake->drain();
    for (const auto& d : signals.drain()) {
      if (!is_terminating(d.signal) || child_status) continue;
      // A terminal's Ctrl-C already reached a command in our own process group.
      if (d.from_kernel && !child.own_process_group()) continue;
      child.signal(d.signal);
    }
    // 3. The command.
    if (!child_status) child_status = child.try_reap();
    if (!lost) {
      if (child_status) break;
      const Millis left = lease.remaining();
      const int timeout =
          left == Millis::max() ? -1 : static_cast<int>(std::clamp<long long>(left.count() + 1, 1, INT_MAX));
      poll_for(signals, *wake, timeout);
      continue;
    }
    // Lost: SIGTERM was sent; SIGKILL (to the whole group) once the grace is over.
    // Done when the command is reaped and nothing of its group is left running.
    if (child_status && (killed || !child.group_alive())) break;
    if (!killed && SteadyClock::now() >= kill_at) {
      child.signal(SIGKILL);
      killed = true;
      continue;
    }
    int timeout = killed ? -1 : poll_timeout_until(kill_at);
    // Leader gone but some of its group still running: no SIGCHLD will tell us
    // when they finish, so look again shortly (bounded by the grace).
    if (child_status && !killed) timeout = std::min(timeout, 20);
    poll_for(signals, *wake, timeout);
  }

  if (lost) {
    std::string how = "sent SIGTERM to the command (pid " + std::to_string(child.pid()) + ")";
    if (killed) how += " and SIGKILL after the " + format_duration(s.grace) + " grace";
    print_error("lock \"" + s.name + "\" lost while the command ran: " + cause + "; " + how);
    return exit_status::lost;
  }

  const int status = exit_status_of(*child_status);
  std::error_code ec;
  lease.release(ec);
  if (ec == errc::lost) {
    print_error("lock \"" + s.name + "\" was found lost when the command ended (status " +
                std::to_string(status) + "): the server no longer held it for this runner");
    return exit_status::lost;
  }
  if (ec) {
    // The command ran protected; only the early release failed. Its status wins.
    print_error("warning: release of lock \"" + s.name + "\" failed (" + ec.message() +
                "); it will expire by its TTL");
  }
  return status;
}

constexpr const char* kRunDescription =
    "Acquire the lock NAME, run COMMAND while holding it, release it when COMMAND exits, and exit with\n"
    "COMMAND's status (128+N if it died of signal N). Meant for jobs deployed on many machines that must\n"
    "run on exactly one at a time, and must stop if they lose the lock.\n"
    "\n"
    "COMMAND runs with DISTLOCK_NAME, DISTLOCK_TOKEN (the fencing token, a decimal number that increases\n"
    "with every acquisition of NAME; absent only where the backend has none) and DISTLOCK_URL in its\n"
    "environment. The lease is renewed while it runs. SIGINT, SIGTERM and SIGHUP are forwarded to it.\n"
    "It is killed (SIGKILL) if the runner itself dies, even of SIGKILL, so it never runs unprotected.\n"
    "If the lock is lost while COMMAND runs, COMMAND gets SIGTERM at once and SIGKILL after --grace,\n"
    "and distlock exits 76.";

constexpr const char* kRunFooter =
    "EXIT STATUS\n"
    "  COMMAND's status  COMMAND ran under the lock (128+N if it died of signal N)\n"
    "  64   usage error: bad flag, malformed URL, name or duration, --grace not below --ttl\n"
    "  69   the lock service is unreachable or rejected the credentials\n"
    "  75   not acquired: held by another owner with --no-wait, or --wait ran out\n"
    "  76   the lock was lost while COMMAND ran (COMMAND was stopped)\n"
    "  126  COMMAND could not be executed;  127  COMMAND was not found\n"
    "  Every error is one line on standard error that names its cause.\n"
    "\n"
    "PROCESS GROUP\n"
    "  Run from cron, a script or a service, COMMAND leads its own process group and signals (forwarded\n"
    "  ones, and SIGTERM/SIGKILL on loss) go to the whole group, so a shell script's subprocesses stop\n"
    "  too. In an interactive terminal COMMAND stays in the terminal's foreground group instead.\n"
    "\n"
    "ENVIRONMENT\n"
    "  DISTLOCK_URL  the lock service when --url is not given (default: file:// in\n"
    "                $XDG_RUNTIME_DIR/distlock, else /tmp/distlock-<uid>: this host only)\n"
    "  DISTLOCK_LOG  debug|info|warning|error: show the library's diagnostics on standard error\n"
    "\n"
    "EXAMPLES\n"
    "  distlock run nightly-report -- /usr/local/bin/report --all\n"
    "  distlock run --url redis://10.0.0.5:6379 --no-wait --ttl 30s backup -- /usr/local/bin/backup\n"
    "  */5 * * * *  distlock run --no-wait --url redis://lock:6379 sync -- /opt/sync/run.sh\n";

}  // namespace

void add_run_command(CLI::App& app, int& exit_code, const std::vector<std::string>& command_after_dashes) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* run = app.add_subcommand("run", "Run a command while holding a lock (exit 75 if not acquired)");
  run->description(kRunDescription);
  run->footer(kRunFooter);
  run->add_option("--url", flags->url,
                  "Lock service URL: redis://[user:password@]host:port[/db], file:///dir, ... "
                  "(default: $DISTLOCK_URL, else this host's file:// directory)")
      ->option_text("URL");
  run->add_option("--ttl", flags->ttl,
                  "Lease length on the server; renewed every ttl/3 while COMMAND runs. A runner that cannot "
                  "renew (paused, server unreachable) declares the lock lost before the server could pass "
                  "it on")
      ->option_text("DUR (default 30s)");
  flags->wait_option = run->add_option("--wait", flags->wait,
                                       "Give up (exit 75) if the lock is not acquired within DUR "
                                       "(default: wait as long as it takes)")
                           ->option_text("DUR");
  auto* no_wait = run->add_flag("--no-wait", flags->no_wait, "Try once; exit 75 at once if the lock is held");
  flags->wait_option->excludes(no_wait);
  flags->grace_option =
      run->add_option("--grace", flags->grace,
                      "After a loss, time between SIGTERM and SIGKILL to COMMAND; must be shorter than --ttl "
                      "(default 5s, or half of a --ttl shorter than 10s)")
          ->option_text("DUR");
  run->add_option("NAME", flags->name, "Lock name (any bytes but NUL, at most 4096)")
      ->required()
      ->type_name("");
  run->add_option("COMMAND", flags->command, "Program and arguments, after \"--\"")->type_name("");
  run->callback([flags, &exit_code, &command_after_dashes] {
    const RunSettings settings = validate(*flags, command_after_dashes);
    exit_code = run_locked(settings);
  });
}

}  // namespace distlock::cli
