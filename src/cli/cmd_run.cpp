// `distlock run`: run a command while holding a lock (the cron single-runner).
//
// The runner's life in four steps:
//   1. Validate every flag before touching the network (usage errors exit 64).
//   2. Block every catchable terminating signal, SIGCHLD and SIGTTOU (every thread
//      started later inherits the mask, so the signals only ever arrive through one
//      signalfd), then connect and acquire on a worker thread while the main thread
//      still answers a signal by dying of it, as a program blocked in a wait is
//      expected to.
//   3. Start the job's watchdog (it leads the job's group and kills it if the runner
//      dies), become a child subreaper, start the command in the watchdog's group
//      (the terminal's foreground group when the runner had it).
//   4. Wait in poll() on the signalfd and on an eventfd the engine's loss callback
//      bumps, with a timeout that ends at `deadline - grace`, then at the deadline.
//      Every wake-up looks at the lease FIRST: a runner that was stopped (SIGSTOP)
//      past its TTL learns of the loss before it forwards a signal or reaps and
//      releases. No renewal with --grace left: SIGTERM to the whole job; deadline
//      passed or loss signalled: SIGKILL to the whole job. Done when no child is left.
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <termios.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "cli/child_process.hpp"
#include "cli/commands.hpp"
#include "cli/job_guard.hpp"
#include "cli/metrics_http.hpp"
#include "distlock/client.hpp"
#include "distlock/semaphore.hpp"
#include "distlock/shared_mutex.hpp"
#include "distlock/text.hpp"

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
  bool leader_only = false;
  std::string name;
  std::vector<std::string> command;  // when given without "--"
  CLI::Option* wait_option = nullptr;
  int metrics_port = -1;
  std::string metrics_addr = "127.0.0.1";
  CLI::Option* metrics_addr_option = nullptr;
  bool wait_given = false, grace_given = false;  // set without CLI11 (run_under_lease)
  std::string max_hold, min_hold, once_per;      // empty: not given
  std::optional<int> permits;                    // --permits N; nullopt: not given
  bool shared = false, exclusive = false;        // --shared / --exclusive
};

enum class RwMode { none, shared, exclusive };

struct RunSettings {
  std::string url;  // as given, or the default the library resolves
  std::string name;
  LockOptions lock;
  Millis grace{};
  bool leader_only = false;
  std::vector<std::string> command;
  int metrics_port = -1;  // -1: no metrics endpoint
  std::string metrics_addr;
  // How the lease is taken (default: Client::acquire(name, lock)) and what the command
  // gets in its environment besides DISTLOCK_NAME/TOKEN/URL (run_under_lease).
  std::function<Lease(Client&, const std::string&, const LockOptions&)> acquire;
  std::vector<std::string> env;
  std::optional<Millis> min_hold;  // keep holding after the command until grant + min_hold
  std::optional<Millis> once_per;  // at most one successful run per period slot
  std::string once_name;           // whose mark: NAME, or NAME\x1fexclusive for the read-write lock NAME
  int permits = 0;                 // > 0: take a permit of the semaphore NAME of that many
  RwMode rw = RwMode::none;        // --shared / --exclusive: a hold of the read-write lock NAME
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
  if (validate_name(s.name, why)) usage_error(why);

  s.lock.ttl = parse_duration_flag("--ttl", flags.ttl);
  if (s.lock.ttl < LockOptions::min_ttl) {
    usage_error("--ttl " + flags.ttl + " is below the minimum of " + format_duration(LockOptions::min_ttl));
  }
  if (flags.no_wait) {
    s.lock.wait = Millis(0);
  } else if (flags.wait_given || (flags.wait_option && flags.wait_option->count() > 0)) {
    s.lock.wait = parse_duration_flag("--wait", flags.wait);
  }  // else: wait until acquired
  auto positive = [](const char* flag, const std::string& text) {
    const Millis d = parse_duration_flag(flag, text);
    if (d.count() <= 0) usage_error(std::string(flag) + " " + text + " must be above zero");
    return d;
  };
  if (!flags.max_hold.empty()) s.lock.max_hold = positive("--max-hold", flags.max_hold);
  if (!flags.min_hold.empty()) s.min_hold = positive("--min-hold", flags.min_hold);
  if (!flags.once_per.empty()) {
    s.once_per = positive("--once-per", flags.once_per);
  }
  if (flags.permits) {
    if (*flags.permits < 1 || *flags.permits > Semaphore::kMaxPermits) {
      usage_error("--permits " + std::to_string(*flags.permits) + " is out of range 1.." +
                  std::to_string(Semaphore::kMaxPermits));
    }
    if (s.once_per) usage_error("--once-per needs the lock itself, not one of --permits");
    s.permits = *flags.permits;
  }
  if (flags.shared && flags.exclusive) {
    usage_error(
        "--shared and --exclusive exclude each other: --shared runs beside other --shared "
        "runners of NAME, --exclusive runs alone");
  }
  if (flags.shared || flags.exclusive) {
    const char* mode = flags.shared ? "--shared" : "--exclusive";
    if (flags.permits) {
      usage_error(std::string(mode) +
                  " and --permits exclude each other: NAME is either a read-write lock or "
                  "a semaphore");
    }
    if (flags.shared && s.once_per) {
      usage_error("--once-per needs an exclusive hold, not --shared (readers run at the same time)");
    }
    s.rw = flags.shared ? RwMode::shared : RwMode::exclusive;
  }
  if (s.once_per) {
    // The read-write lock NAME and the lock NAME do not exclude each other, so each keeps
    // its own mark: a shared one would let both run in a slot while looking guarded.
    s.once_name = s.rw == RwMode::exclusive ? s.name +
                                                  "\x1f"
                                                  "exclusive"
                                            : s.name;
    if (validate_name(once_key(s.once_name), why)) usage_error("--once-per: the mark's key: " + why);
  }
  if (s.min_hold && s.lock.max_hold && *s.min_hold > *s.lock.max_hold) {
    usage_error("--min-hold " + flags.min_hold + " is longer than --max-hold " + flags.max_hold);
  }
  LockOptions filled = s.lock;
  if (filled.validate_and_fill()) usage_error("--ttl " + flags.ttl + " is not usable");
  // The whole job gets SIGTERM when the lease has --grace left before its local
  // deadline with no renewal since, and SIGKILL at the deadline. The grace must
  // leave room for one renewal interval, or a merely late renewal would stop it.
  const Millis grace_limit = filled.ttl - filled.safety_margin - filled.renew_interval;
  if (flags.grace_given || (flags.grace_option && flags.grace_option->count() > 0)) {
    s.grace = parse_duration_flag("--grace", flags.grace);
  } else {
    s.grace = std::min<Millis>(kDefaultGrace, s.lock.ttl / 4);
    if (s.lock.max_hold) s.grace = std::min<Millis>(s.grace, *s.lock.max_hold / 4);
  }
  if (s.lock.max_hold && s.grace >= *s.lock.max_hold) {
    usage_error("--grace " + format_duration(s.grace) + " must be shorter than --max-hold " +
                format_duration(*s.lock.max_hold) + " (the command gets SIGTERM --grace before it)");
  }
  if (s.grace >= grace_limit) {
    usage_error("--grace " + format_duration(s.grace) + " is too long for --ttl " +
                format_duration(s.lock.ttl) + ": it must be shorter than " + format_duration(grace_limit) +
                " (ttl minus safety margin minus renewal interval), since the command is stopped --grace "
                "before the lease's local deadline");
  }
  s.leader_only = flags.leader_only;
  if (flags.metrics_addr_option && flags.metrics_addr_option->count() > 0 && flags.metrics_port < 0) {
    usage_error("--metrics-addr needs --metrics-port");
  }
  s.metrics_port = flags.metrics_port;
  s.metrics_addr = flags.metrics_addr;
  if (auto ec = LockOptions(s.lock).validate_and_fill()) usage_error("--ttl " + flags.ttl + " is not usable");
  s.url = flags.url.empty() ? default_url() : flags.url;
  s.lock.holder_info = runner_holder_info(s.command);
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

/// The hold the runner watches: a Lease (lock, semaphore permit, election) or a
/// read-write lock's ReadWriteLease; the same members, forwarded.
class RunLease {
 public:
  explicit RunLease(Lease l) : v_(std::move(l)) {}
  explicit RunLease(ReadWriteLease l) : v_(std::move(l)) {}
  bool owns() const noexcept {
    return std::visit([](const auto& l) { return l.owns(); }, v_);
  }
  const std::string& name() const noexcept {
    return std::visit([](const auto& l) -> const std::string& { return l.name(); }, v_);
  }
  bool has_token() const noexcept {
    return std::visit([](const auto& l) { return l.has_token(); }, v_);
  }
  std::uint64_t token() const {
    return std::visit([](const auto& l) { return l.token(); }, v_);
  }
  std::stop_token stop_token() const noexcept {
    return std::visit([](const auto& l) { return l.stop_token(); }, v_);
  }
  Millis remaining() const noexcept {
    return std::visit([](const auto& l) { return l.remaining(); }, v_);
  }
  std::optional<Millis> max_hold_remaining() const noexcept {
    return std::visit([](const auto& l) { return l.max_hold_remaining(); }, v_);
  }
  LossReason loss_reason() const noexcept {
    return std::visit([](const auto& l) { return l.loss_reason(); }, v_);
  }
  std::string loss_detail() const {
    return std::visit([](const auto& l) { return l.loss_detail(); }, v_);
  }
  void release(std::error_code& ec) noexcept {
    std::visit([&ec](auto& l) { l.release(ec); }, v_);
  }

 private:
  std::variant<Lease, ReadWriteLease> v_;
};

struct Acquisition {
  std::optional<Client> client;
  std::optional<RunLease> lease;
  std::error_code ec;
  std::string what;
  std::function<void(const Client&)> on_connected;  // called once connected (--metrics-port)
};

/// Connects and acquires on a worker thread; the main thread keeps answering
/// signals meanwhile. A terminating signal (systemd's or Kubernetes' SIGTERM, Ctrl-C)
/// cancels the wait first (LockOptions::cancel), so the runner leaves the server's queue
/// before it dies of the signal: a queued place left behind would hold up the next
/// waiter until the server expires it (its TTL on etcd). Bounded: after kLeaveQueueLimit
/// the runner dies anyway (the worker may be stuck connecting).
Acquisition connect_and_acquire(const RunSettings& s, SignalFd& signals, const std::shared_ptr<Wakeup>& wake,
                                std::function<void(const Client&)> on_connected) {
  constexpr std::chrono::milliseconds kLeaveQueueLimit{3000};
  auto result = std::make_shared<Acquisition>();
  auto done = std::make_shared<std::atomic<bool>>(false);  // the worker has set ec or lease
  result->on_connected = std::move(on_connected);
  std::stop_source cancel;
  LockOptions cancellable = s.lock;
  cancellable.cancel = cancel.get_token();
  std::thread worker([result, done, wake, url = s.url, name = s.name, lock = cancellable, acquire = s.acquire,
                      permits = s.permits, rw = s.rw] {
    try {
      ClientOptions options = tool_client_options();
      // zk://: the session (whose timeout is the lease's real length: a killed runner
      // frees the lock when it ends) is sized to --ttl unless the URL sets session_timeout.
      options.lock_defaults.ttl = lock.ttl;
      Client client = connect(url, options);
      result->client = client;
      if (result->on_connected) result->on_connected(client);
      if (rw == RwMode::shared) {
        result->lease.emplace(client.shared_mutex(name, lock).acquire_shared());
      } else if (rw == RwMode::exclusive) {
        result->lease.emplace(client.shared_mutex(name, lock).acquire_exclusive());
      } else {
        result->lease.emplace(acquire       ? acquire(client, name, lock)
                              : permits > 0 ? client.semaphore(name, permits, lock).acquire()
                                            : client.acquire(name, lock));
      }
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
    done->store(true, std::memory_order_release);
    wake->notify();
  });
  for (;;) {
    poll_for(signals, *wake, -1);
    for (const auto& d : signals.drain()) {
      if (is_catchable_stop(d.signal)) ::kill(::getpid(), SIGSTOP);  // Ctrl-Z while waiting
      if (is_terminating(d.signal)) {
        cancel.request_stop();
        const auto until = std::chrono::steady_clock::now() + kLeaveQueueLimit;
        while (!done->load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
          const auto left =
              std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
          poll_for(signals, *wake, static_cast<int>(std::max<std::int64_t>(1, left.count())));
          wake->drain();
          (void)signals.drain();  // the runner is dying of the first one already
        }
        if (!done->load(std::memory_order_acquire)) {
          worker.detach();  // still connecting: nothing queued yet that the exit would not end
          die_of_signal(d.signal);
        }
        worker.join();
        // Granted just before the cancel: given back before dying (a plain exit would
        // leave it to the server's expiry).
        result->lease.reset();
        result->client.reset();
        die_of_signal(d.signal);
      }
    }
    if (done->load(std::memory_order_acquire)) break;
  }
  worker.join();
  wake->drain();
  return std::move(*result);
}

std::string not_acquired_message(const RunSettings& s, const std::error_code& ec, const std::string& what) {
  if (s.permits > 0 && (ec == errc::busy || ec == errc::timeout)) {
    return "all " + std::to_string(s.permits) + " permits of semaphore \"" + s.name + "\" are held" +
           (ec == errc::busy ? std::string(" (one attempt, not waiting)")
                             : " (not acquired within --wait " + format_duration(*s.lock.wait) + ")");
  }
  if (s.rw != RwMode::none && (ec == errc::busy || ec == errc::timeout)) {
    return "read-write lock \"" + s.name + "\" is held " +
           (s.rw == RwMode::shared ? std::string("by a writer (or a writer waits for it)")
                                   : std::string("by readers or a writer")) +
           (ec == errc::busy ? std::string(" (one attempt, not waiting)")
                             : " (not acquired within --wait " + format_duration(*s.lock.wait) + ")");
  }
  if (ec == errc::busy) return "lock \"" + s.name + "\" is held by another owner (one attempt, not waiting)";
  if (ec == errc::timeout) {
    return "lock \"" + s.name + "\" was not acquired within --wait " + format_duration(*s.lock.wait) +
           ": another owner holds it";
  }
  return what;
}

std::vector<std::string> child_environment(const RunSettings& s, const RunLease& lease,
                                           const std::string& metrics_addr) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    // An outer runner's variables must not leak into this lock's command, nor the
    // runner's password (the job gets it only in DISTLOCK_URL, with --pass-url-password).
    if (kv.starts_with("DISTLOCK_NAME=") || kv.starts_with("DISTLOCK_TOKEN=") ||
        kv.starts_with("DISTLOCK_URL=") || kv.starts_with("DISTLOCK_PASSWORD=") ||
        kv.starts_with("DISTLOCK_METRICS_ADDR=") || kv.starts_with("DISTLOCK_PERMIT=") ||
        kv.starts_with("DISTLOCK_ONCE_SLOT=")) {
      continue;
    }
    env.emplace_back(kv);
  }
  env.push_back("DISTLOCK_NAME=" + s.name);
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

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string loss_cause(const RunLease& lease) {
  if (lease.loss_reason() == LossReason::max_hold) {
    return "--max-hold passed since the lock was granted (" + lease.loss_detail() + ")";
  }
  // The library says why (Lease::loss_detail), on any thread and before the log line.
  if (lease.stop_token().stop_requested()) {
    if (std::string detail = lease.loss_detail(); !detail.empty()) return detail;
  }
  return "its local deadline passed without a successful renewal (runner paused or server unreachable)";
}

/// What the metrics endpoint serves: the client's metrics once it is connected.
class MetricsSource {
 public:
  void set(const Client& c) {
    std::lock_guard lk(mu_);
    client_ = c;
  }
  std::string text() const {
    std::lock_guard lk(mu_);
    return client_ ? client_->metrics() : std::string();
  }

 private:
  mutable std::mutex mu_;
  std::optional<Client> client_;
};

int poll_timeout_until(SteadyClock::time_point deadline) {
  const auto left = std::chrono::ceil<Millis>(deadline - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

/// --once-per, before the command: -1 to run it (with `once` set to the mark to store
/// after success), else the exit status (0: this slot, or a later one, already had its run).
/// The slot is the one the runner was started in (`fired_unix_ms`, read before it waited for
/// the lock): a cron firing that waits into the next slot is still its own slot's run, and does
/// not use up the next slot.
int check_once_per(const RunSettings& s, Client& client, RunLease& lease, std::int64_t fired_unix_ms,
                   std::optional<OnceMark>& once) {
  const std::uint64_t slot = period_slot(*s.once_per, fired_unix_ms);
  std::optional<OnceMark> mark;
  try {
    mark = read_once_mark(client, s.once_name);
  } catch (const std::system_error& e) {
    std::error_code ignored;
    lease.release(ignored);
    print_error(std::string(e.what()) + "; --once-per needs it");
    return e.code() == errc::not_supported ? exit_status::usage : exit_code_for(e.code());
  }
  if (mark && mark->malformed) {
    print_error("warning: lock \"" + s.name + "\": the --once-per mark (record " +
                once_key(s.once_name).substr(0, 200) +
                ") is not in the expected format; treating the period as not yet run");
  }
  if (!once_due(mark, *s.once_per, fired_unix_ms)) {
    std::error_code ignored;
    lease.release(ignored);
    // The marked run's slot, in this runner's period (its firing time, if the mark has one).
    const std::uint64_t marked =
        mark->fired_unix_ms >= 0 ? period_slot(*s.once_per, mark->fired_unix_ms) : mark->slot;
    const std::string which = marked == slot ? "already ran in this --once-per "
                                             : "a later period already ran (fired in slot " +
                                                   std::to_string(slot) + ") under --once-per ";
    print_error("lock \"" + s.name + "\": " + which + format_duration(*s.once_per) + " period (slot " +
                std::to_string(marked) + ", run finished at unix ms " + std::to_string(mark->unix_ms) +
                (mark->token != 0 ? " with token " + std::to_string(mark->token) : std::string()) +
                "); not running the command");
    return exit_status::ok;
  }
  once = OnceMark{slot, lease.has_token() ? lease.token() : 0, 0, fired_unix_ms};
  return -1;
}

/// --once-per, after a successful run: stores the mark, only while the lease is held
/// (the write then lands before the lease can have ended on the server, since the
/// local deadline comes before the server's expiry). -1 when stored.
int record_once_per(const RunSettings& s, Client& client, RunLease& lease, OnceMark mark) {
  mark.unix_ms = unix_ms_now();
  if (!lease.owns()) {
    std::error_code ignored;
    lease.release(ignored);
    print_error("lock \"" + s.name + "\" was lost before the --once-per mark could be stored: " +
                loss_cause(lease) + "; this period may run again");
    return exit_status::lost;
  }
  try {
    write_once_mark(client, s.once_name, mark);
  } catch (const std::system_error& e) {
    std::error_code ignored;
    lease.release(ignored);
    print_error(std::string(e.what()) + "; the command succeeded, but this period may run again");
    return exit_code_for(e.code());
  }
  return -1;
}

/// --min-hold: keeps the lease (renewed) until min_hold has passed since the grant, as
/// measured on this host's steady clock from just after the grant. Ends early when the
/// lease is lost or a terminating signal arrives.
void hold_at_least(const RunSettings& s, const RunLease& lease, SignalFd& signals, Wakeup& wake,
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

int run_locked(const RunSettings& s) {
  const std::int64_t fired_unix_ms = unix_ms_now();  // --once-per: the slot this firing is for
  const std::vector<int> inherited_fds = open_fds();
  std::vector<int> blocked = terminating_signals();
  blocked.push_back(SIGCHLD);
  blocked.push_back(SIGTTOU);  // so the runner may hand the terminal on and take it back
  blocked.push_back(SIGTSTP);  // stops go to the job: a stopped runner would not renew
  blocked.push_back(SIGTTIN);
  SignalFd signals(blocked);
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
  if (s.metrics_port >= 0) {
    auto source = std::make_shared<MetricsSource>();
    try {
      metrics = MetricsServer::start(s.metrics_addr, s.metrics_port, [source] { return source->text(); });
    } catch (const std::system_error& e) {
      print_error(e.what());
      return exit_code_for(e.code());
    }
    on_connected = [source](const Client& c) { source->set(c); };
  }

  auto wake = std::make_shared<Wakeup>();
  Acquisition acq = connect_and_acquire(s, signals, wake, std::move(on_connected));
  if (acq.ec) {
    print_error(not_acquired_message(s, acq.ec, acq.what));
    return exit_code_for(acq.ec);
  }
  RunLease lease = std::move(*acq.lease);
  const SteadyClock::time_point acquired_at = SteadyClock::now();  // after the grant
  // Woken by the loss signal itself (the stop token), on the thread that detects the
  // loss, not by an on_lost callback queued behind others on the event thread. The
  // callback owns its share of the eventfd so a late call can never write into a
  // reused fd.
  std::stop_callback wake_on_loss(lease.stop_token(), [wake] { wake->notify(); });

  // Nothing is done on the command's behalf with a lease that is already gone.
  if (!lease.owns()) {
    print_error("lock \"" + s.name + "\" was lost before the command started: " + loss_cause(lease));
    return exit_status::lost;
  }
  std::optional<OnceMark> once;  // the mark to store after a successful run
  if (s.once_per) {
    if (int rc = check_once_per(s, *acq.client, lease, fired_unix_ms, once); rc >= 0) return rc;
  }

  // The watchdog leads the job's group and kills it if the runner dies; it is
  // started before the runner becomes a subreaper, so it is not the runner's child.
  Watchdog watchdog = Watchdog::start();
  if (!s.leader_only) ::prctl(PR_SET_CHILD_SUBREAPER, 1);

  const int terminal = foreground_terminal();
  ChildSpec spec;
  spec.argv = s.command;
  spec.env = child_environment(s, lease, metrics ? metrics->address() : std::string());
  if (once) spec.env.push_back("DISTLOCK_ONCE_SLOT=" + std::to_string(once->slot));
  spec.process_group = watchdog.group();
  spec.terminal_fd = terminal;
  spec.signal_mask = signals.previous_mask();
  spec.reset_sigpipe = previous_pipe.sa_handler == SIG_DFL;
  spec.inherited_fds = inherited_fds;
  auto take_back_terminal = [terminal] {
    if (terminal >= 0) ::tcsetpgrp(terminal, ::getpgrp());
  };
  Child child;
  try {
    child = spawn_child(spec);
  } catch (const ExecError& e) {
    take_back_terminal();
    std::error_code ignored;
    lease.release(ignored);
    print_error("cannot run \"" + s.command.front() + "\": " + std::generic_category().message(e.error));
    return e.error == ENOENT ? exit_status::not_found : exit_status::cannot_execute;
  }

  std::optional<int> leader_status;
  bool no_children = false;
  bool lost = false;         // the lease is gone: the job got SIGKILL
  bool at_risk = false;      // --grace before the local deadline, no renewal: SIGTERM
  bool at_max_hold = false;  // at_risk because --max-hold ends the lease, not a renewal
  int stopped_by = 0;        // the job stopped for the terminal: SIGTERM, SIGKILL after --grace
  SteadyClock::time_point stop_kill_at{};
  bool stop_killed = false;
  bool stop_forwarded = false;  // the stop was a SIGTSTP/SIGTTIN sent to the runner
  std::string cause;
  for (;;) {
    // 1. The lease first, on every wake-up. Its deadline comes before the server
    //    can pass the lock on (by the safety margin), so the job is dead by then.
    if (!lost && !lease.owns()) {
      lost = true;
      cause = loss_cause(lease);
      child.signal_job(SIGKILL);
    } else if (const Millis left = lease.remaining(); !lost && !at_risk && left <= s.grace) {
      at_risk = true;
      const auto hold_left = lease.max_hold_remaining();
      at_max_hold = hold_left && *hold_left <= left;
      child.signal_job(SIGTERM);
    }
    // 2. Signals: forward the terminating ones to the whole job.
    wake->drain();
    for (const auto& d : signals.drain()) {
      if (!is_terminating(d.signal) && !is_catchable_stop(d.signal)) continue;
      // The kernel's SIGXCPU/SIGXFSZ are about the runner's own limits.
      if (d.from_kernel && (d.signal == SIGXCPU || d.signal == SIGXFSZ)) continue;
      child.signal_job(d.signal);
      // A forwarded stop is not waited for: the process that stops may be one the
      // runner never hears of (not its child: a shell's command stopped between
      // vfork() and exec leaves the shell waiting for it, never stopped itself).
      // The job is ended as one stopped for the terminal.
      if (is_catchable_stop(d.signal) && stopped_by == 0 && !lost) {
        stopped_by = d.signal;
        stop_forwarded = true;
        stop_kill_at = SteadyClock::now() + s.grace;
        child.signal_job(SIGTERM);  // with SIGCONT: whatever did stop runs on to its end
      }
    }
    // 3. Reap every child (the command, and orphans of the job adopted as a
    //    subreaper); notice a job stopped for the terminal.
    bool reaped = false;
    for (const auto& ev : reap_children(no_children)) {
      if (WIFSTOPPED(ev.status)) {
        if (is_terminal_stop(WSTOPSIG(ev.status)) && stopped_by == 0 && !lost) {
          stopped_by = WSTOPSIG(ev.status);
          stop_kill_at = SteadyClock::now() + s.grace;
          child.signal_job(SIGTERM);
        }
        continue;
      }
      if (WIFCONTINUED(ev.status)) continue;
      reaped = true;
      if (ev.pid == child.pid()) leader_status = ev.status;
    }
    // Orphans of killed processes are adopted without a signal: kill them too.
    if (lost && reaped && !no_children) child.signal_job(SIGKILL);
    if (stopped_by != 0 && !stop_killed && SteadyClock::now() >= stop_kill_at) {
      stop_killed = true;
      child.signal_job(SIGKILL);
    }
    if (leader_status && (no_children || s.leader_only)) break;

    int timeout = -1;
    if (!lost) {
      const Millis left = lease.remaining();
      if (left != Millis::max()) {
        const Millis until = at_risk ? left : left - s.grace;
        timeout = static_cast<int>(std::clamp<long long>(until.count() + 1, 1, INT_MAX));
      }
    } else {
      timeout = 20;  // an adopted orphan may appear without a SIGCHLD: look again
    }
    if (stopped_by != 0 && !stop_killed) {
      const int t = poll_timeout_until(stop_kill_at);
      timeout = timeout < 0 ? t : std::min(timeout, t);
    }
    poll_for(signals, *wake, timeout);
  }
  take_back_terminal();
  if (s.leader_only && !lost) watchdog.disarm();

  if (lost) {
    print_error("lock \"" + s.name + "\" lost while the command ran: " + cause +
                "; sent SIGKILL to the command's processes (group " + std::to_string(child.group()) + ")");
    return exit_status::lost;
  }
  if (at_risk && at_max_hold) {
    std::error_code ignored;
    if (lease.owns()) lease.release(ignored);
    print_error("lock \"" + s.name + "\" reached --max-hold " + format_duration(*s.lock.max_hold) +
                ": sent SIGTERM to the command's processes (group " + std::to_string(child.group()) +
                ") --grace " + format_duration(s.grace) + " before it; they ended before it");
    return exit_status::lost;
  }
  if (at_risk) {
    std::error_code ignored;
    if (lease.owns()) lease.release(ignored);
    print_error("lock \"" + s.name + "\" was about to be lost: no renewal succeeded and only --grace " +
                format_duration(s.grace) + " was left before its local deadline; sent SIGTERM to the " +
                "command's processes (group " + std::to_string(child.group()) + "), which ended before it");
    return exit_status::lost;
  }

  const int status = exit_status_of(*leader_status);
  // A command that exited 0 ran, also when a stop signal was forwarded to it on the way.
  if (once && status == 0) {
    if (int rc = record_once_per(s, *acq.client, lease, *once); rc >= 0) return rc;
  }
  if (s.min_hold && stopped_by == 0) {
    hold_at_least(s, lease, signals, *wake, acquired_at);
    if (!lease.owns()) {  // lost while held on after the command: nothing ran unprotected
      std::error_code ignored;
      lease.release(ignored);
      return status;
    }
  }
  std::error_code ec;
  lease.release(ec);
  if (stopped_by != 0) {
    print_error(
        (stop_forwarded
             ? "the runner was sent " + signal_name(stopped_by) +
                   ", forwarded to the command (a stopped command would hold lock \"" + s.name +
                   "\" for ever); sent it SIGTERM"
             : "the command was stopped by " + signal_name(stopped_by) +
                   " (it waited for the terminal while holding lock \"" + s.name + "\"); sent it SIGTERM") +
        (stop_killed ? " and SIGKILL after the " + format_duration(s.grace) + " grace" : std::string()) +
        "; lock released");
    return status;
  }
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
    "Acquire the lock NAME, run COMMAND while holding it, release it when every process of the job has\n"
    "exited, and exit with COMMAND's status (128+N if it died of signal N). Meant for jobs deployed on many\n"
    "machines that must run on exactly one at a time, and must stop if they lose the lock.\n"
    "\n"
    "COMMAND runs with DISTLOCK_NAME, DISTLOCK_TOKEN (the fencing token, a decimal number that increases\n"
    "with every acquisition of NAME; absent only where the backend has none) and DISTLOCK_URL in its\n"
    "environment. The lease is renewed while it runs. Every signal that would end the runner (INT, TERM,\n"
    "HUP, QUIT, USR1, USR2, ALRM, PWR, real-time ...) is forwarded to the whole job instead.\n"
    "If no renewal succeeds, the whole job gets SIGTERM --grace before the lease's local deadline and\n"
    "SIGKILL at it (before the server can pass the lock on); a loss the runner is told about (lock taken\n"
    "over, file:// lock file removed) kills it at once. The job is reaped, then distlock exits 76.\n"
    "If the runner dies, even of SIGKILL, a watchdog process kills the job's whole process group.\n"
    "\n"
    "With --shared/--exclusive NAME is a read-write lock (readers and a writer, like flock -s/-x): a\n"
    "--shared job gets no DISTLOCK_TOKEN, an --exclusive job the writer's token; a --shared hold that is\n"
    "lost (a reader slot past its TTL) ends its job the same way (exit 76).";

constexpr const char* kRunFooter =
    "EXIT STATUS\n"
    "  COMMAND's status  COMMAND ran under the lock (128+N if it died of signal N)\n"
    "  0    also: --once-per found this period's run already done (COMMAND not run; one line says so)\n"
    "  64   usage error: bad flag, malformed URL, name or duration, --grace too long for --ttl; --once-per "
    "on\n"
    "       a backend that keeps no records\n"
    "  69   the lock service is unreachable or rejected the credentials, or --metrics-port cannot be bound\n"
    "  75   not acquired: held by another owner with --no-wait, or --wait ran out\n"
    "  76   the lock was lost (or about to be) while the job ran, or --max-hold ended it; the job was "
    "stopped\n"
    "       and reaped\n"
    "  126  COMMAND could not be executed;  127  COMMAND was not found\n"
    "  Every error is one line on standard error that names its cause.\n"
    "\n"
    "THE JOB\n"
    "  COMMAND runs in a process group of its own; the runner is a child subreaper and holds the lock\n"
    "  until every process of the job (also those that left the group) has exited, unless --leader-only.\n"
    "  Under a terminal the job's group is the terminal's foreground group (Ctrl-C reaches the whole\n"
    "  job). A job stopped by SIGTSTP/SIGTTIN/SIGTTOU is sent SIGTERM (SIGKILL after --grace); so is a\n"
    "  job the runner forwards a SIGTSTP/SIGTTIN to (a stopped job would hold the lock for ever).\n"
    "\n"
    "ENVIRONMENT\n"
    "  DISTLOCK_URL  the lock service when --url is not given (default: file:// in\n"
    "                $XDG_RUNTIME_DIR/distlock, else /tmp/distlock-<uid>: this host only)\n"
    "  DISTLOCK_LOG  debug|info|warning|error: show the library's diagnostics on standard error\n"
    "\n"
    "EXAMPLES\n"
    "  distlock run nightly-report -- /usr/local/bin/report --all\n"
    "  distlock run --shared config -- ./read-config;  distlock run --exclusive config -- ./write-config\n"
    "  distlock run --url redis://10.0.0.5:6379 --no-wait --ttl 30s backup -- /usr/local/bin/backup\n"
    "  */5 * * * *  distlock run --no-wait --url redis://lock:6379 sync -- /opt/sync/run.sh\n";

}  // namespace

int run_under_lease(const LeaseRun& r) {
  RunFlags flags;
  flags.url = r.url;
  flags.ttl = r.ttl;
  flags.wait = r.wait;
  flags.wait_given = !r.wait.empty();
  flags.no_wait = r.no_wait;
  flags.grace = r.grace;
  flags.grace_given = !r.grace.empty();
  flags.name = r.name;
  flags.command = r.command;
  RunSettings settings = validate(flags, r.after_dashes);
  settings.acquire = r.acquire;
  settings.env = r.env;
  return run_locked(settings);
}

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
      run->add_option(
             "--grace", flags->grace,
             "With no renewal, the job gets SIGTERM when DUR is left before the lease's local deadline "
             "and SIGKILL at it; must be below ttl - margin - renew interval (default 5s, or ttl/4)")
          ->option_text("DUR");
  run->add_flag("--leader-only", flags->leader_only,
                "Release the lock when COMMAND's first process exits, leaving any process it started "
                "running unprotected (for commands that start daemons). Default: hold the lock until every "
                "process of the job has exited");
  run->add_option("--metrics-port", flags->metrics_port,
                  "Serve this runner's metrics in the Prometheus text format at http://ADDR:PORT/metrics "
                  "while it waits and runs (0: any free port; the command gets it in "
                  "$DISTLOCK_METRICS_ADDR). See docs/metrics.md")
      ->option_text("PORT")
      ->check(CLI::Range(0, 65535));
  flags->metrics_addr_option =
      run->add_option("--metrics-addr", flags->metrics_addr,
                      "Numeric address the metrics endpoint binds (default 127.0.0.1; e.g. ::1, 0.0.0.0)")
          ->option_text("ADDR");
  run->add_option("--max-hold", flags->max_hold,
                  "Hold the lock at most DUR from the grant, even while renewals succeed: the command gets "
                  "SIGTERM --grace before, SIGKILL at it (a hung job cannot keep the lock); exit 76")
      ->option_text("DUR");
  run->add_option(
         "--min-hold", flags->min_hold,
         "After COMMAND ends, keep holding (renewing) the lock until DUR has passed since the grant, "
         "so another host cannot run the job again at once (ShedLock's lockAtLeastFor)")
      ->option_text("DUR");
  run->add_option("--once-per", flags->once_per,
                  "At most one successful run per period slot (floor(unix time / DUR)): under the lock, "
                  "skip (exit 0) if this slot already has one, else run and, on exit 0, record the slot")
      ->option_text("DUR");
  run->add_option("--permits", flags->permits,
                  "Take one of N permits of the semaphore NAME instead of the lock NAME: up to N jobs run at "
                  "once (every runner of NAME must give the same N); the job gets its permit number in "
                  "$DISTLOCK_PERMIT")
      ->option_text("N");
  run->add_flag("--shared", flags->shared,
                "Take a reader's hold of the read-write lock NAME instead of the lock NAME (like flock -s): "
                "--shared runners run at the same time, never beside an --exclusive one. The command gets "
                "no DISTLOCK_TOKEN (readers have no fencing token)");
  run->add_flag("--exclusive", flags->exclusive,
                "Take the writer's hold of the read-write lock NAME (like flock -x): runs alone, after the "
                "--shared runners are gone; a waiting --exclusive runner keeps new --shared ones out. "
                "DISTLOCK_TOKEN is the writer's fencing token");
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
