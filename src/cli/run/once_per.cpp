// `distlock run --once-per`: at most one successful run per period slot. Under the lock the
// runner reads the mark (Client::get_record, job_guard.hpp), skips the command when its slot
// already ran, and after a successful run stores the mark while the lease is still held.
#include "cli/run/run.hpp"
#include "distlock/text.hpp"

namespace distlock::cli::run {

/// The slot is the one the runner was started in (`fired_unix_ms`, read before it waited for
/// the lock): a cron firing that waits into the next slot is still its own slot's run, and does
/// not use up the next slot.
int check_once_per(const RunSettings& s, Client& client, Hold& lease, std::int64_t fired_unix_ms,
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

/// Stores the mark only while the lease is held: the write then lands before the lease can
/// have ended on the server, since the local deadline comes before the server's expiry.
int record_once_per(const RunSettings& s, Client& client, Hold& lease, OnceMark mark) {
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

}  // namespace distlock::cli::run
