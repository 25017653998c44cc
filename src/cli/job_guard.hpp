// What `distlock run` adds for scheduled jobs: the holder description it stores with
// every lock it takes, and the --once-per mark (record "<name>\x1fonce" =
// "<slot>\n<token>\n<unix ms>", slot = floor(unix ms / period)).
//
// Thread-safety: plain functions; the Client they are given is thread-safe.
//
// Example:
//   opts.holder_info = runner_holder_info({"backup", "--all"});  // "host=h pid=42 cmd=backup --all"
//   const std::uint64_t slot = period_slot(period, unix_ms_now());  // when fired, before waiting
//   auto lease = client.acquire("nightly", opts);
//   if (!once_due(read_once_mark(client, "nightly"), slot)) return 0;  // this slot (or a later) ran
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distlock/client.hpp"

namespace distlock::cli {

/// "host=H pid=P cmd=C" for LockOptions::holder_info: bytes outside printable ASCII and
/// '|' in the command become '?'; the library cuts it at 160 bytes.
std::string runner_holder_info(const std::vector<std::string>& command);

/// Milliseconds since the Unix epoch on the wall clock.
std::int64_t unix_ms_now();
/// floor(unix_ms / period).
std::uint64_t period_slot(Millis period, std::int64_t unix_ms);

struct OnceMark {
  std::uint64_t slot = 0;
  std::uint64_t token = 0;  ///< 0 where the backend issues none
  std::int64_t unix_ms = 0;
};
/// Whether a firing for `fired_slot` still has to run, given the stored mark: not when the
/// mark names that slot or a later one (a firing that waited for the lock past a later slot's
/// run is not run out of order). Marks therefore only move forward.
bool once_due(const std::optional<OnceMark>& mark, std::uint64_t fired_slot);
/// The record key of `name`'s once-per mark ("<name>\x1fonce").
std::string once_key(const std::string& name);
/// The stored mark (nullopt: none, or not in the format above). Throws std::system_error
/// (errc::not_supported naming the backend when it keeps no records).
std::optional<OnceMark> read_once_mark(Client& client, const std::string& name);
/// Stores the mark (overwriting). Throws std::system_error.
void write_once_mark(Client& client, const std::string& name, const OnceMark& mark);

}  // namespace distlock::cli
