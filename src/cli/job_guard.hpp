// What `distlock run` adds for scheduled jobs: the holder description it stores with
// every lock it takes, and the --once-per mark (the record "once" of the lock, Client::
// get_record/put_record, stored under "<name>\x1fonce"; its value is
// "<slot>\n<token>\n<unix ms>\n<fired unix ms>", slot = floor(fired unix ms / period); a mark
// of three lines, as written before the fourth existed, is read as of the same period).
//
// Thread-safety: plain functions; the Client they are given is thread-safe.
//
// Example:
//   opts.holder_info = runner_holder_info({"backup", "--all"});  // "host=h pid=42 cmd=backup --all"
//   const std::int64_t fired = unix_ms_now();  // when fired, before waiting for the lock
//   auto lease = client.acquire("nightly", opts);
//   if (!once_due(read_once_mark(client, "nightly"), period, fired)) return 0;  // this slot ran
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distlock/client.hpp"

namespace distlock::cli {

/// "host=H pid=P cmd=C" for LockOptions::holder_info: bytes outside printable ASCII and
/// '|' in the command become '?'; the library cuts it at 160 bytes.
std::string runner_holder_info(const std::vector<std::string>& command);

/// What `distlock run --verbose` prints while it waits in the queue (LockOptions::
/// on_queue_position): "waiting: 3rd in line behind host=h pid=42 cmd=backup", the one
/// ahead named by its description, else its owner id; at position 1 it is the holder
/// ("waiting: 1st in line behind the holder host=...").
std::string waiting_line(std::size_t position, const WaiterInfo& ahead);

/// Milliseconds since the Unix epoch on the wall clock.
std::int64_t unix_ms_now();
/// floor(unix_ms / period).
std::uint64_t period_slot(Millis period, std::int64_t unix_ms);

struct OnceMark {
  std::uint64_t slot = 0;           ///< in the period of the runner that wrote it
  std::uint64_t token = 0;          ///< 0 where the backend issues none
  std::int64_t unix_ms = 0;         ///< when the run finished
  std::int64_t fired_unix_ms = -1;  ///< when the run was fired; -1 in a three-line mark
  bool malformed = false;           ///< a record was there but did not parse (then treated as none)
};
/// Whether a firing at `fired_unix_ms` of a job run once per `period` still has to run, given
/// the stored mark: not when the marked run was fired in the same slot of `period` or a later
/// one (a firing that waited for the lock past a later slot's run is not run out of order).
/// The mark's firing time is compared, not its slot number, so runners whose periods differ
/// (a changed crontab) agree; a three-line mark's slot is taken as of `period`. Marks only move
/// forward. No mark, or a malformed one, is due.
bool once_due(const std::optional<OnceMark>& mark, Millis period, std::int64_t fired_unix_ms);
/// The key the mark is stored under ("<name>\x1fonce": Client::put_record(name, "once")), for
/// messages and for checking its length before connecting.
std::string once_key(const std::string& name);
/// The stored mark (nullopt: none; `malformed` set: a record not in the format above; lines
/// after the fourth are ignored, for marks of later versions). Throws std::system_error
/// (errc::not_supported naming the backend when it keeps no records).
std::optional<OnceMark> read_once_mark(Client& client, const std::string& name);
/// Stores the mark (overwriting). Throws std::system_error.
void write_once_mark(Client& client, const std::string& name, const OnceMark& mark);

}  // namespace distlock::cli
