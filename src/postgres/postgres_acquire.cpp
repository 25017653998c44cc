// Acquiring a PostgreSQL lock: the advisory lock and its row in one statement, on
// the session of the lease's TTL.
#include <charconv>
#include <cstring>
#include <limits>

#include "postgres/postgres_backend_impl.hpp"

namespace distlock::detail::postgres {

namespace {

// $1 name (hex), $2 key, $3 owner, $4 ttl ms, $5 lock-delay ms (0: none). One statement, one transaction: the
// advisory lock and, only if it was granted, the row (next token, owner, this
// session's pid, seen_at = now). A row that still names an owner although the
// advisory lock was free belongs to a holder whose session ended without a release
// (connection cut, server restart or crash, killed client): that holder may still
// believe it holds the lock until its local deadline, which lies before its row's
// seen_at (its last acquire/renewal, stamped while the statement ran, after it was
// sent) + its TTL. Until then the row is not taken over: the advisory lock is given
// back in the same statement and the answer is busy with the time left. A holder
// with a lock-delay D (its row's delay_ms) keeps its row for seen_at + ttl + D
// instead, by the server's clock (docs/design.md "Lock-delay"): a normal release
// clears the owner (no delay), a lost lease leaves it. A digest
// collision (same digest, another name) is busy too, never a shared row.
// Columns: granted, token, holder TTL or time left (ms) when busy, (unlock result),
// (the watch event: postgres_watch.cpp; NOTIFY distlock_events only while a watch
// holds the watcher key, and only if the lock was granted).
// The CTE o reads the row as it was before this statement.
constexpr const char* kAcquireSql =
    "WITH g AS MATERIALIZED (SELECT pg_try_advisory_lock($2::bigint) AS got),"
    " u AS (INSERT INTO public.distlock_locks AS d (digest, name, token, owner, pid, ttl_ms, seen_at,"
    " delay_ms) SELECT sha256(decode($1, 'hex')), decode($1, 'hex'), 1, $3, pg_backend_pid(), $4::bigint,"
    " clock_timestamp(), $5::bigint FROM g WHERE g.got"
    " ON CONFLICT (digest) DO UPDATE SET token = d.token + 1, owner = EXCLUDED.owner, pid = EXCLUDED.pid,"
    " ttl_ms = EXCLUDED.ttl_ms, seen_at = EXCLUDED.seen_at, delay_ms = EXCLUDED.delay_ms"
    " WHERE d.name = EXCLUDED.name AND (d.owner IS NULL OR clock_timestamp() >= d.seen_at"
    " + (d.ttl_ms + coalesce(d.delay_ms, 0)) * interval '1 millisecond') RETURNING d.token),"
    " o AS (SELECT owner, ttl_ms, seen_at, delay_ms FROM public.distlock_locks"
    " WHERE digest = sha256(decode($1, 'hex')))"
    " SELECT (SELECT token FROM u) IS NOT NULL, (SELECT token FROM u),"
    " (SELECT CASE WHEN o.owner IS NULL OR o.seen_at IS NULL THEN o.ttl_ms ELSE greatest(10, ceil(1000 *"
    " extract(epoch FROM o.seen_at + (o.ttl_ms + coalesce(o.delay_ms, 0)) * interval '1 millisecond'"
    " - clock_timestamp())))::bigint END FROM o),"
    " CASE WHEN g.got AND (SELECT token FROM u) IS NULL THEN pg_advisory_unlock($2::bigint) END,"
    " CASE WHEN (SELECT token FROM u) IS NULL THEN NULL WHEN CASE WHEN NOT "
    "pg_try_advisory_xact_lock_shared(1684632419, 4) THEN false"
    " WHEN NOT pg_try_advisory_lock(1684632419, 2) THEN false ELSE pg_advisory_unlock(1684632419, 2) END"
    " THEN NULL"
    " ELSE pg_notify('distlock_events', CASE WHEN octet_length($1) + octet_length($3) < 7900 THEN"
    " 'acquired ' || (SELECT token FROM u) || ' ' || $1 || ' ' || $3 ELSE 'overflow' END) END FROM g";

// kAcquireSql for a table without delay_ms (made before lock-delay, and this role may
// not add the column: connect_now): $1..$4 as above, no lock-delay.
constexpr const char* kAcquireWithoutDelaySql =
    "WITH g AS MATERIALIZED (SELECT pg_try_advisory_lock($2::bigint) AS got),"
    " u AS (INSERT INTO public.distlock_locks AS d (digest, name, token, owner, pid, ttl_ms, seen_at)"
    " SELECT sha256(decode($1, 'hex')), decode($1, 'hex'), 1, $3, pg_backend_pid(), $4::bigint,"
    " clock_timestamp() FROM g WHERE g.got"
    " ON CONFLICT (digest) DO UPDATE SET token = d.token + 1, owner = EXCLUDED.owner, pid = EXCLUDED.pid,"
    " ttl_ms = EXCLUDED.ttl_ms, seen_at = EXCLUDED.seen_at WHERE d.name = EXCLUDED.name AND (d.owner IS NULL"
    " OR clock_timestamp() >= d.seen_at + d.ttl_ms * interval '1 millisecond') RETURNING d.token),"
    " o AS (SELECT owner, ttl_ms, seen_at FROM public.distlock_locks"
    " WHERE digest = sha256(decode($1, 'hex')))"
    " SELECT (SELECT token FROM u) IS NOT NULL, (SELECT token FROM u),"
    " (SELECT CASE WHEN o.owner IS NULL OR o.seen_at IS NULL THEN o.ttl_ms ELSE greatest(10, ceil(1000 *"
    " extract(epoch FROM o.seen_at + o.ttl_ms * interval '1 millisecond' - clock_timestamp())))::bigint END"
    " FROM o),"
    " CASE WHEN g.got AND (SELECT token FROM u) IS NULL THEN pg_advisory_unlock($2::bigint) END,"
    " CASE WHEN (SELECT token FROM u) IS NULL THEN NULL WHEN CASE WHEN NOT "
    "pg_try_advisory_xact_lock_shared(1684632419, 4) THEN false"
    " WHEN NOT pg_try_advisory_lock(1684632419, 2) THEN false ELSE pg_advisory_unlock(1684632419, 2) END"
    " THEN NULL"
    " ELSE pg_notify('distlock_events', CASE WHEN octet_length($1) + octet_length($3) < 7900 THEN"
    " 'acquired ' || (SELECT token FROM u) || ' ' || $1 || ' ' || $3 ELSE 'overflow' END) END FROM g";

}  // namespace

AcquireResult PostgresBackend::try_acquire(const AcquireRequest& req, Error& ec) {
  ec.clear();
  if (req.ttl.count() > std::numeric_limits<std::int32_t>::max()) {
    // idle_session_timeout is an int of milliseconds: the server would refuse the
    // session's startup options, which is no connection problem.
    ec = make_error_code(errc::invalid_argument);
    ec.set_detail("TTL " + std::to_string(req.ttl.count()) + "ms of \"" + printable(req.name) +
                  "\" exceeds what postgres:// can hold: the lease is the session's "
                  "idle_session_timeout, at most 2147483647ms (about 24.8 days)");
    return {};
  }
  Session& s = session(req.ttl);
  const std::int64_t key = postgres_lock_key(req.name);
  Lost lost;
  AcquireResult res;
  {
    LockGuard lk(s.mu);
    expire_stale(s, lost);
    if (s.held.count(key)) {
      // This session holds the key already (another owner of this client, or a
      // name with the same hash): advisory locks re-enter within a session, so
      // asking the server would grant it twice.
      res.holder_ttl = s.ttl;
      return res;
    }
    const bool with_delay = has_delay_column_.load();
    std::vector<std::string> params{to_hex(req.name), std::to_string(key), std::string(req.owner),
                                    std::to_string(req.ttl.count())};
    if (with_delay) params.push_back(std::to_string(req.lock_delay.count()));
    const char* const acquire_sql = with_delay ? kAcquireSql : kAcquireWithoutDelaySql;
    Exec e;
    Clock::time_point sent{};
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!ensure_connected(s, lost, ec)) break;
      sent = Clock::now();
      e = run(s.conn.get(), acquire_sql, params, cfg_.command_timeout);
      if (!e.io_failed) break;
      // The session is gone: every lease on it went with it. An idle session the
      // server ended (idle_session_timeout) is expected: try once on a new one.
      const bool had_leases = !s.held.empty();
      drop(s, lost);
      if (had_leases) break;
    }
    if (!ec && !e.ok()) {
      ec = code_of(e);
      ec.set_detail(failure("acquire \"" + printable(req.name) + "\"", e.error));
      if (!e.io_failed && s.conn) {
        // The advisory lock may have been granted before the statement failed;
        // a session-level lock outlives a rolled-back transaction.
        run(s.conn.get(), "SELECT pg_advisory_unlock($1::bigint)", {std::to_string(key)},
            cfg_.command_timeout);
      }
    } else if (!ec) {
      ok();
      PGresult* r = e.res.get();
      if (PQntuples(r) != 1 || PQnfields(r) != 5) {
        ec = make_error_code(errc::protocol_error);
      } else if (std::string_view(PQgetvalue(r, 0, 0)) == "t") {
        std::uint64_t token = 0;
        const char* t = PQgetvalue(r, 0, 1);
        auto [p, er] = std::from_chars(t, t + std::strlen(t), token);
        if (er != std::errc{} || PQgetisnull(r, 0, 1)) {
          ec = make_error_code(errc::protocol_error);
        } else {
          s.held[key] = {std::string(req.name), std::string(req.owner), token, sent + s.ttl};
          res.acquired = true;
          res.token = token;
          // The server ends the session no earlier than ttl after it finished this
          // statement, which is later than the send time the engine counts from.
          res.validity = s.ttl;
        }
      } else if (!PQgetisnull(r, 0, 2)) {
        long long ms = 0;
        const char* t = PQgetvalue(r, 0, 2);
        std::from_chars(t, t + std::strlen(t), ms);
        if (ms > 0) res.holder_ttl = Millis(ms);
      }
    }
  }
  report_lost(lost);
  if (ec) return {};
  return res;
}

}  // namespace distlock::detail::postgres
