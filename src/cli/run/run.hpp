// `distlock run`: run a command while holding a lock (the cron single-runner), in parts:
//   flags.cpp      the flags as given (RunFlags) checked into RunSettings before any network
//                  use (usage errors exit 64);
//   help.cpp       the subcommand's options and help text, and run_under_lease for `elect`;
//   signals.cpp    which signals the runner blocks, forwards or dies of, and poll();
//   acquire.cpp    connect and acquire on a worker thread while the main thread answers
//                  signals (a terminating one cancels the wait, then the runner dies of it);
//   once_per.cpp   --once-per: the mark read before the command and written after it;
//   run_locked.cpp the runner's life: block signals, acquire, start the watchdog and the job,
//                  supervise it, report how it ended;
//   telemetry.cpp  --metrics-port and --trace-file / $TRACEPARENT, set up before connecting;
//   supervise.cpp  the wait in poll() on the signalfd and the loss eventfd: every wake-up
//                  looks at the lease FIRST (a runner stopped past its TTL learns of the loss
//                  before it forwards a signal or reaps and releases); no renewal with --grace
//                  left: SIGTERM to the whole job; deadline passed or loss signalled: SIGKILL.
//
// The hold is a distlock::Hold (a Lease of a lock, semaphore permit or election, a
// read-write lock's ReadWriteLease, or with --lock the MultiHold of several locks taken by
// Client::acquire_all: multi_hold.hpp).
//
// Thread-safety: the main thread of the `distlock` process, except the acquiring worker
// (acquire.cpp), which shares only its Acquisition result, handed over through an atomic flag.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "cli/child_process.hpp"
#include "cli/commands.hpp"
#include "cli/job_guard.hpp"
#include "distlock/client.hpp"
#include "distlock/hold.hpp"
#include "distlock/tracing.hpp"

namespace CLI {
class Option;
}  // namespace CLI

namespace distlock::cli {
class MetricsServer;
}  // namespace distlock::cli

namespace distlock::cli::run {

using SteadyClock = std::chrono::steady_clock;

/// The flags as given on the command line (or by run_under_lease).
struct RunFlags {
  std::string url;
  std::string ttl = "30s";
  std::string wait;
  bool no_wait = false;
  std::string grace;
  CLI::Option* grace_option = nullptr;
  bool leader_only = false;
  std::string name;
  CLI::Option* name_option = nullptr;  // the positional NAME (given, maybe empty, or not)
  std::vector<std::string> locks;      // --lock NAME, each time given
  std::vector<std::string> command;    // when given without "--"
  CLI::Option* wait_option = nullptr;
  int metrics_port = -1;
  std::string metrics_addr = "127.0.0.1";
  CLI::Option* metrics_addr_option = nullptr;
  bool wait_given = false, grace_given = false;  // set without CLI11 (run_under_lease)
  std::string max_hold, min_hold, once_per;      // empty: not given
  std::string lock_delay;                        // --lock-delay; empty: not given
  std::optional<int> permits;                    // --permits N; nullopt: not given
  bool shared = false, exclusive = false;        // --shared / --exclusive
  std::optional<long long> shards;               // --shards M; nullopt: not given
  bool per_shard = false;                        // --per-shard
  std::string on_change;                         // --on-change hup|restart; empty: not given
  std::string rebalance_period;                  // --rebalance-period; empty: not given
  std::string trace_file;                        // --trace-file; empty: not given
  bool verbose = false;                          // --verbose: the place in the queue on stderr
};

enum class RwMode { none, shared, exclusive };

/// What the runner does, checked.
struct RunSettings {
  std::string url;                 // as given, or the default the library resolves
  std::string name;                // the positional NAME, or with --lock the names joined by ","
  std::vector<std::string> names;  // --lock: every name (and NAME), sorted, no duplicates; empty: one lock
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
  std::uint32_t shards = 0;        // > 0: --shards M, NAME is a shard group (shards.cpp)
  bool per_shard = false;          // --per-shard: one job per owned shard
  bool restart_on_change = false;  // --on-change restart (default: hup)
  Millis rebalance_period{std::chrono::seconds(1)};
  // Tracing (docs/tracing.md): --trace-file, and $TRACEPARENT as the runner found it (the
  // parent of its wait and hold spans; the library checks it). With either, the client has
  // a tracer and the job gets the hold span's context in its TRACEPARENT.
  std::string trace_file;
  std::string traceparent;
  std::shared_ptr<Tracer> tracer;  // made by run_locked before it connects
};

// flags.cpp
/// `lock "NAME"`, or with --lock `locks "A", "B"`: what the runner's messages name.
std::string lock_label(const RunSettings& s);
/// Checks every flag; throws std::system_error(errc::invalid_argument) naming the problem.
RunSettings validate(const RunFlags& flags, const std::vector<std::string>& after_dashes);

// signals.cpp
/// Every catchable signal whose default action ends the runner (blocked, read through the
/// signalfd and forwarded to the job).
std::vector<int> terminating_signals();
bool is_terminating(int sig);
/// SIGTSTP, SIGTTIN: forwarded to the job, which is then ended; they never stop the runner
/// while its job runs.
bool is_catchable_stop(int sig);
/// SIGTSTP, SIGTTIN, SIGTTOU: a job stopped by one waits for the terminal holding the lock.
bool is_terminal_stop(int sig);
/// Dies of `sig` with its default action (the shell sees "killed by SIGINT").
[[noreturn]] void die_of_signal(int sig);
/// poll() on both descriptors (EINTR counts as a timeout).
int poll_for(const SignalFd& signals, const Wakeup& wake, int timeout_ms);
/// Milliseconds from now until `deadline`, clamped to [0, INT_MAX].
int poll_timeout_until(SteadyClock::time_point deadline);
/// "SIGTERM", or "signal N".
std::string signal_name(int sig);

// acquire.cpp
struct Acquisition {
  std::optional<Client> client;
  std::unique_ptr<Hold> lease;
  std::error_code ec;
  std::string what;
  std::function<void(const Client&)> on_connected;  // called once connected (--metrics-port)
};
/// Connects and acquires on a worker thread while this thread answers signals.
Acquisition connect_and_acquire(const RunSettings& s, SignalFd& signals, const std::shared_ptr<Wakeup>& wake,
                                std::function<void(const Client&)> on_connected);
/// The one line for an acquisition that failed with `ec` (`what`: its message).
std::string not_acquired_message(const RunSettings& s, const std::error_code& ec, const std::string& what);

// once_per.cpp
/// Before the command: -1 to run it (with `once` set to the mark to store after success),
/// else the exit status (0: this slot, or a later one, already had its run).
int check_once_per(const RunSettings& s, Client& client, Hold& lease, std::int64_t fired_unix_ms,
                   std::optional<OnceMark>& once);
/// After a successful run: stores the mark while the lease is held; -1 when stored, else
/// the exit status.
int record_once_per(const RunSettings& s, Client& client, Hold& lease, OnceMark mark);

// run_locked.cpp
/// Why the lease was lost, for the runner's message.
std::string loss_cause(const Hold& lease);
/// The whole run: acquire, run the command under the lease, release; the exit status.
int run_locked(const RunSettings& s);

// telemetry.cpp
/// --metrics-port: serves the client's metrics from before it connects (`on_connected` hands
/// the client over). -1, or the exit status when the endpoint cannot be started.
int start_metrics(const RunSettings& s, std::unique_ptr<MetricsServer>& metrics,
                  std::function<void(const Client&)>& on_connected);
/// --trace-file / $TRACEPARENT: sets s.tracer before connecting. -1, or the exit status when
/// the trace file cannot be opened.
int start_tracing(RunSettings& s);

// shards.cpp
/// `run --shards`: a member of the shard group NAME running the command for its shards; the
/// exit status.
int run_shards(const RunSettings& s);

// supervise.cpp
/// How the job ended, as the supervision saw it.
struct JobEnd {
  std::optional<int> leader_status;  // the command's wait status
  bool lost = false;                 // the lease is gone: the job got SIGKILL
  bool at_risk = false;              // --grace before the local deadline, no renewal: SIGTERM
  bool at_max_hold = false;          // at_risk because --max-hold ends the lease, not a renewal
  int stopped_by = 0;                // the job stopped for the terminal: SIGTERM, SIGKILL after --grace
  bool stop_killed = false;
  bool stop_forwarded = false;  // the stop was a SIGTSTP/SIGTTIN sent to the runner
  std::string cause;            // why the lease was lost
};
/// Waits for the job to end (every process of it, or its leader with --leader-only),
/// forwarding signals and ending it on loss, at risk or when stopped.
JobEnd supervise(const RunSettings& s, const Hold& lease, Child& child, SignalFd& signals, Wakeup& wake);
/// --min-hold: keeps the lease (renewed) until min_hold has passed since `acquired_at`.
void hold_at_least(const RunSettings& s, const Hold& lease, SignalFd& signals, Wakeup& wake,
                   SteadyClock::time_point acquired_at);

}  // namespace distlock::cli::run
