// The MySQL/MariaDB backend: mysql://[user[:password]@]host[:port]/database[?timeout=DUR]
//
// A lock is the server's named lock (GET_LOCK) taken on a connection of its own (one
// session per lease), plus a row per name in the InnoDB table
// `database`.`distlock_locks` (digest, name, token, owner, conn_id, lock_name, ttl_ms,
// seen_at) written on that session while it holds the named lock: the row gives the
// fencing token (strictly increasing per name, durable with
// innodb_flush_log_at_trx_commit = 1) and names the holder.
//
// The lease: the session's wait_timeout is the TTL in whole seconds, so a holder that
// stops talking (killed, paused, partitioned) loses its session, and with it the named
// lock, at most TTL after its last statement; renewals are statements on that session.
// Waiters wait inside the server: one more connection per watched name blocks in
// GET_LOCK until the lock is free, and is cancelled with KILL QUERY. See docs/mysql.md.
//
// Thread-safety: called from many threads at once; each lease, the shared connection
// and the watches have their own mutex.
#pragma once

#include <memory>
#include <string>
#include <system_error>

#include "engine/backend.hpp"
#include "engine/backend_error.hpp"

namespace distlock::detail {

namespace my {
struct Config;
}

/// The connection settings of a mysql:// URL (host, port, user, database, the
/// schema-qualified table names, timeouts from `opts`). Returns errc::invalid_url, with the
/// sentence naming the problem, for a URL without a host or database, or with more than
/// one host.
Error mysql_config(const Url& url, const ClientOptions& opts, my::Config& cfg);

std::unique_ptr<Backend> make_mysql_backend(const Url& url, const ClientOptions& opts, Error& err);

}  // namespace distlock::detail
