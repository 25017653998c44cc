// The PostgreSQL backend: postgres://[user[:password]@]host[:port][/db][?timeout=DUR&sslmode=M]
//
// A lock is a session-level advisory lock (pg_try_advisory_lock on a 64-bit hash of
// the name) taken on a connection of this client, plus a row per name in the table
// distlock_locks (name bytea, token, owner, pid, ttl_ms) written in the same
// statement: the row gives the fencing token (strictly increasing per name, durable)
// and names the holder, so status and renewals see the name, not only its hash.
//
// The lease: each connection is opened with idle_session_timeout = the TTL of the
// leases it carries (one connection per distinct TTL), so a holder that stops
// talking (killed, paused, partitioned) loses its session, and with it every
// advisory lock, TTL after its last statement. Renewals are statements on that
// connection. Waiters LISTEN on one more connection (channel distlock_released).
// See docs/postgres.md.
//
// Thread-safety: called from many threads at once; each connection has its own mutex.
#pragma once

#include <memory>
#include <string>
#include <system_error>

#include "engine/backend.hpp"
#include "engine/backend_error.hpp"

namespace distlock::detail {

namespace pg {
struct Config;
}

/// The connection settings of a postgres:// URL (host, port, user, database, sslmode,
/// timeouts from `opts`). Returns errc::invalid_url, with the sentence naming the problem,
/// for a URL without a host or database, or with more than one host.
Error postgres_config(const Url& url, const ClientOptions& opts, pg::Config& cfg);

std::unique_ptr<Backend> make_postgres_backend(const Url& url, const ClientOptions& opts, Error& err);

/// The advisory-lock key of a lock name (FNV-1a 64 with a final mix), as PostgreSQL's bigint.
std::int64_t postgres_lock_key(std::string_view name) noexcept;

}  // namespace distlock::detail
