// Records and the listing of held locks for the postgres:// backend.
//
// Records are rows of distlock_records (digest bytea PRIMARY KEY = sha256(key), key
// bytea, value bytea), created with distlock_locks by the backend's setup; a record
// and a lock of one name are rows of different tables, so they never collide, and
// nothing ever expires them. Each call is one statement on the client's shared
// "distlock" connection (synchronous_commit on): PutMode::always is an upsert,
// PutMode::if_absent an INSERT ... ON CONFLICT DO NOTHING that returns the row it
// inserted or, in the same statement, the one that was there (a row committed by a
// concurrent writer after the statement's snapshot is read by the next attempt);
// PutMode::fenced is a compare-and-set loop (engine/backend.hpp fenced_put_by_cas): a
// read, then that insert or an UPDATE ... WHERE value = <the value read>.
//
// The listing reads distlock_locks and pg_locks in one statement and says of each
// name what status() says (held = the row names an owner and the row's session holds
// the advisory key, or that lease's seen_at + ttl_ms has not passed).
//
// Thread-safety: free functions; the runner serialises the connection.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine/backend.hpp"
#include "postgres/pg_conn.hpp"

namespace distlock::detail::pg {

/// Runs one statement on the client's shared connection (reconnecting when it
/// failed). On failure returns an Exec that is not ok() and sets `ec` and the error
/// detail (naming the server and `what`).
using Runner =
    std::function<Exec(const char* sql, const std::vector<std::string>& params, const char* what, Error& ec)>;

std::string put_record(const Runner& run, std::string_view key, std::string_view value, PutMode mode,
                       Error& ec);
std::optional<std::string> get_record(const Runner& run, std::string_view key, Error& ec);
bool erase_record(const Runner& run, std::string_view key, Error& ec);
std::vector<ListedLock> list_held(const Runner& run, std::string_view prefix, std::size_t limit,
                                  bool& truncated, Error& ec);

/// A held lock's `ttl_remaining`, as status() and list_held() report it: the time left of the
/// holder's lease since its last renewal (`since_seen`: seen_at + ttl - now), never more than
/// its TTL and at least 10 ms while its session still holds the key (the server ends a silent
/// session a TTL after it answered its last statement, a little after seen_at); for a session
/// that ended without a release, `since_seen` itself. A holder frozen or cut off therefore
/// shows its lease running out, as on the other backends, not a full TTL until the server
/// ends its session.
inline Millis lease_left(bool session_holds, Millis ttl, Millis since_seen) {
  if (!session_holds) return since_seen;
  return std::clamp(since_seen, std::min(Millis(10), ttl), ttl);
}

}  // namespace distlock::detail::pg
