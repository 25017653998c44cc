// `distlock run`'s flags checked into RunSettings before the runner touches the network:
// every usage error exits 64 with one line naming the flag.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/run/run.hpp"
#include "distlock/semaphore.hpp"
#include "distlock/text.hpp"

namespace distlock::cli::run {

namespace {

constexpr Millis kDefaultGrace{std::chrono::seconds(5)};

[[noreturn]] void usage_error(const std::string& message) {
  throw_error(make_error_code(errc::invalid_argument), message);
}

bool given(bool set_directly, const CLI::Option* option) {
  return set_directly || (option && option->count() > 0);
}

Millis positive(const char* flag, const std::string& text) {
  const Millis d = parse_duration_flag(flag, text);
  if (d.count() <= 0) usage_error(std::string(flag) + " " + text + " must be above zero");
  return d;
}

/// The command, the name, --ttl and --wait.
void check_command_and_lease(const RunFlags& flags, const std::vector<std::string>& after_dashes,
                             RunSettings& s) {
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
  if (flags.locks.empty() && validate_name(s.name, why)) usage_error(why);

  s.lock.ttl = parse_duration_flag("--ttl", flags.ttl);
  if (s.lock.ttl < LockOptions::min_ttl) {
    usage_error("--ttl " + flags.ttl + " is below the minimum of " + format_duration(LockOptions::min_ttl));
  }
  if (flags.no_wait) {
    s.lock.wait = Millis(0);
  } else if (given(flags.wait_given, flags.wait_option)) {
    s.lock.wait = parse_duration_flag("--wait", flags.wait);
  }  // else: wait until acquired
  if (!flags.max_hold.empty()) s.lock.max_hold = positive("--max-hold", flags.max_hold);
  if (!flags.lock_delay.empty()) {
    s.lock.lock_delay = parse_duration_flag("--lock-delay", flags.lock_delay);
    if (s.lock.lock_delay > LockOptions::max_lock_delay) {
      usage_error("--lock-delay " + flags.lock_delay + " is above the maximum of " +
                  format_duration(LockOptions::max_lock_delay));
    }
  }
  if (!flags.min_hold.empty()) s.min_hold = positive("--min-hold", flags.min_hold);
  if (!flags.once_per.empty()) s.once_per = positive("--once-per", flags.once_per);
}

/// --permits, --shared/--exclusive and what --once-per needs of them.
void check_kind(const RunFlags& flags, RunSettings& s) {
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
    std::string why;
    if (validate_name(once_key(s.once_name), why)) usage_error("--once-per: the mark's key: " + why);
  }
  if (s.min_hold && s.lock.max_hold && *s.min_hold > *s.lock.max_hold) {
    usage_error("--min-hold " + flags.min_hold + " is longer than --max-hold " + flags.max_hold);
  }
}

/// --grace: the whole job gets SIGTERM when the lease has --grace left before its local
/// deadline with no renewal since, and SIGKILL at the deadline. The grace must leave room
/// for one renewal interval, or a merely late renewal would stop it.
void check_grace(const RunFlags& flags, RunSettings& s) {
  LockOptions filled = s.lock;
  if (filled.validate_and_fill()) usage_error("--ttl " + flags.ttl + " is not usable");
  const Millis grace_limit = filled.ttl - filled.safety_margin - filled.renew_interval;
  if (given(flags.grace_given, flags.grace_option)) {
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
}

/// --shards M, --per-shard, --on-change and --rebalance-period, and what they exclude.
void check_shards(const RunFlags& flags, RunSettings& s) {
  if (!flags.shards) {
    if (flags.per_shard) usage_error("--per-shard needs --shards M (one command per owned shard of M)");
    if (!flags.on_change.empty()) usage_error("--on-change needs --shards M");
    if (!flags.rebalance_period.empty()) usage_error("--rebalance-period needs --shards M");
    return;
  }
  if (*flags.shards < 1 || *flags.shards > 65536) {
    usage_error("--shards " + std::to_string(*flags.shards) + " is out of range 1..65536");
  }
  s.shards = static_cast<std::uint32_t>(*flags.shards);
  s.per_shard = flags.per_shard;
  if (!flags.on_change.empty()) {
    if (flags.per_shard) {
      usage_error(
          "--on-change does not apply to --per-shard: each shard's command is started when the "
          "shard is gained and killed when it is lost");
    }
    if (flags.on_change != "hup" && flags.on_change != "restart") {
      usage_error("--on-change " + flags.on_change + " is neither hup nor restart");
    }
    s.restart_on_change = flags.on_change == "restart";
  }
  if (!flags.rebalance_period.empty()) {
    s.rebalance_period = parse_duration_flag("--rebalance-period", flags.rebalance_period);
    if (s.rebalance_period < Millis(10) || s.rebalance_period > std::chrono::hours(1)) {
      usage_error("--rebalance-period " + flags.rebalance_period + " is outside 10ms..1h");
    }
  }
  const char* other = flags.permits                                ? "--permits"
                      : flags.shared                               ? "--shared"
                      : flags.exclusive                            ? "--exclusive"
                      : s.once_per                                 ? "--once-per"
                      : s.min_hold                                 ? "--min-hold"
                      : s.lock.max_hold                            ? "--max-hold"
                      : flags.leader_only                          ? "--leader-only"
                      : flags.metrics_port >= 0                    ? "--metrics-port"
                      : !flags.trace_file.empty()                  ? "--trace-file"
                      : flags.no_wait                              ? "--no-wait"
                      : given(flags.wait_given, flags.wait_option) ? "--wait"
                                                                   : nullptr;
  if (other) usage_error(std::string("--shards and ") + other + " exclude each other");
  // The group's lock names are "<NAME>/members/<id>" and "<NAME>/shard/<i>".
  std::string why;
  if (validate_name(s.name + "/shard/" + std::to_string(s.shards - 1), why))
    usage_error("shard group: " + why);
}

/// --lock NAME (repeatable): every name, with the positional NAME if given, taken together by
/// Client::acquire_all. Refuses what holds one name's lock in another way, or needs one name.
void check_locks(const RunFlags& flags, RunSettings& s) {
  if (flags.locks.empty()) return;
  std::vector<std::string> names = flags.locks;
  if (!flags.name.empty() || given(false, flags.name_option)) names.push_back(flags.name);
  for (const auto& n : names) {
    std::string why;
    if (validate_name(n, why)) usage_error("--lock: " + why);
    if (n.find(',') != std::string::npos) {
      usage_error("--lock \"" + n +
                  "\": a name taken with --lock cannot contain \",\" (it separates the names in "
                  "$DISTLOCK_TOKENS)");
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  const char* other = flags.shards              ? "--shards"
                      : flags.permits           ? "--permits"
                      : flags.shared            ? "--shared"
                      : flags.exclusive         ? "--exclusive"
                      : !flags.once_per.empty() ? "--once-per"
                                                : nullptr;
  if (other) {
    usage_error(std::string("--lock and ") + other +
                " exclude each other: --lock takes several plain locks as one set, " + other +
                " applies to one NAME");
  }
  s.names = std::move(names);
  s.name.clear();
  for (const auto& n : s.names) s.name += (s.name.empty() ? "" : ",") + n;
}

}  // namespace

std::string lock_label(const RunSettings& s) {
  if (s.names.empty()) return "lock \"" + s.name + "\"";
  std::string out = s.names.size() == 1 ? "lock " : "locks ";
  for (std::size_t i = 0; i < s.names.size(); ++i) out += (i ? ", \"" : "\"") + s.names[i] + "\"";
  return out;
}

RunSettings validate(const RunFlags& flags, const std::vector<std::string>& after_dashes) {
  RunSettings s;
  // An empty NAME written out is refused as an empty name (validate_name), not as a missing one.
  if (flags.locks.empty() && flags.name.empty() && flags.name_option && flags.name_option->count() == 0) {
    usage_error(
        "no lock name given: write distlock run [OPTIONS] NAME -- COMMAND, or --lock NAME (repeatable)");
  }
  check_command_and_lease(flags, after_dashes, s);
  check_locks(flags, s);
  check_kind(flags, s);
  check_grace(flags, s);
  check_shards(flags, s);
  s.leader_only = flags.leader_only;
  if (flags.metrics_addr_option && flags.metrics_addr_option->count() > 0 && flags.metrics_port < 0) {
    usage_error("--metrics-addr needs --metrics-port");
  }
  s.metrics_port = flags.metrics_port;
  s.metrics_addr = flags.metrics_addr;
  s.trace_file = flags.trace_file;
  if (const char* tp = std::getenv("TRACEPARENT"); tp && *tp) s.traceparent = tp;
  if (auto ec = LockOptions(s.lock).validate_and_fill()) usage_error("--ttl " + flags.ttl + " is not usable");
  s.url = flags.url.empty() ? default_url() : flags.url;
  s.lock.holder_info = runner_holder_info(s.command);
  if (flags.verbose) {
    // On the client's event thread, each time the place in the queue changes.
    s.lock.on_queue_position = [](std::size_t position, const WaiterInfo& ahead) {
      print_error(waiting_line(position, ahead));
    };
  }
  return s;
}

}  // namespace distlock::cli::run
