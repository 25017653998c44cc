// PostgreSQL leases after acquisition: renewal and release, and the per-TTL
// sessions that carry them (finding, reconnecting, expiring, dropping).
#include <algorithm>
#include <iterator>
#include <set>

#include "postgres/postgres_backend_impl.hpp"

namespace distlock::detail::postgres {

namespace {

// $1 name (hex), $2 owner, $3 key, $4 notification payload. The row is cleared only
// for this owner on this session; the advisory lock is this session's (the caller
// checked it holds it); the notifications are sent at commit: the waiters' wake-up, and
// the watch event (postgres_watch.cpp: only if the row was ours and a watch holds the
// watcher key). The commit need not wait for the WAL flush: the token is not touched,
// and a cleared owner lost to a crash makes the next acquirer wait out the released
// lease's TTL (spurious busy).
constexpr const char* kReleaseSql =
    "WITH r AS (UPDATE public.distlock_locks SET owner = NULL, pid = NULL"
    " WHERE digest = sha256(decode($1, 'hex')) AND name = decode($1, 'hex') AND owner = $2"
    " AND pid = pg_backend_pid() RETURNING token)"
    " SELECT (SELECT count(*) FROM r), pg_advisory_unlock($3::bigint), pg_notify('distlock_released', $4),"
    " set_config('synchronous_commit', 'off', true),"
    " CASE WHEN NOT EXISTS (SELECT 1 FROM r) THEN NULL WHEN CASE WHEN NOT "
    "pg_try_advisory_xact_lock_shared(1684632419, 4) THEN false"
    " WHEN NOT pg_try_advisory_lock(1684632419, 2) THEN false ELSE pg_advisory_unlock(1684632419, 2) END"
    " THEN NULL"
    " ELSE pg_notify('distlock_events', CASE WHEN octet_length($1) + octet_length($2) < 7900 THEN"
    " 'released ' || (SELECT token FROM r) || ' ' || $1 || ' ' || $2 ELSE 'overflow' END) END";

// As kReleaseSql, for a lease the engine declared lost (give_up): a row with a
// lock-delay keeps naming its owner, so nobody takes it over before its seen_at + ttl
// + delay (postgres_acquire.cpp); the advisory lock is given up all the same. The watch
// event is `lost`, with the token of the row as it was (CTE m) if it named this owner on
// this session, cleared or kept.
constexpr const char* kGiveUpSql =
    "WITH m AS (SELECT token FROM public.distlock_locks WHERE digest = sha256(decode($1, 'hex'))"
    " AND name = decode($1, 'hex') AND owner = $2 AND pid = pg_backend_pid()),"
    " r AS (UPDATE public.distlock_locks SET owner = NULL, pid = NULL"
    " WHERE digest = sha256(decode($1, 'hex')) AND name = decode($1, 'hex') AND owner = $2"
    " AND pid = pg_backend_pid() AND coalesce(delay_ms, 0) = 0 RETURNING 1)"
    " SELECT (SELECT count(*) FROM r), pg_advisory_unlock($3::bigint), pg_notify('distlock_released', $4),"
    " set_config('synchronous_commit', 'off', true),"
    " CASE WHEN NOT EXISTS (SELECT 1 FROM m) THEN NULL WHEN CASE WHEN NOT "
    "pg_try_advisory_xact_lock_shared(1684632419, 4) THEN false"
    " WHEN NOT pg_try_advisory_lock(1684632419, 2) THEN false ELSE pg_advisory_unlock(1684632419, 2) END"
    " THEN NULL"
    " ELSE pg_notify('distlock_events', CASE WHEN octet_length($1) + octet_length($2) < 7900 THEN"
    " 'lost ' || (SELECT token FROM m) || ' ' || $1 || ' ' || $2 ELSE 'overflow' END) END";

// kGiveUpSql for a table without delay_ms (connect_now): the row is cleared as by a release.
constexpr const char* kGiveUpWithoutDelaySql =
    "WITH r AS (UPDATE public.distlock_locks SET owner = NULL, pid = NULL"
    " WHERE digest = sha256(decode($1, 'hex')) AND name = decode($1, 'hex') AND owner = $2"
    " AND pid = pg_backend_pid() RETURNING token)"
    " SELECT (SELECT count(*) FROM r), pg_advisory_unlock($3::bigint), pg_notify('distlock_released', $4),"
    " set_config('synchronous_commit', 'off', true),"
    " CASE WHEN NOT EXISTS (SELECT 1 FROM r) THEN NULL WHEN CASE WHEN NOT "
    "pg_try_advisory_xact_lock_shared(1684632419, 4) THEN false"
    " WHEN NOT pg_try_advisory_lock(1684632419, 2) THEN false ELSE pg_advisory_unlock(1684632419, 2) END"
    " THEN NULL"
    " ELSE pg_notify('distlock_events', CASE WHEN octet_length($1) + octet_length($2) < 7900 THEN"
    " 'lost ' || (SELECT token FROM r) || ' ' || $1 || ' ' || $2 ELSE 'overflow' END) END";

// $1 text[] of hex names: the rows this session holds among them (and their owners),
// stamped seen_at = now, committed (synchronous_commit = on) before the answer: a
// renewal that succeeded is on disk, so a restarted server still knows how long its
// holder may believe it holds the lock.
constexpr const char* kRenewSql =
    "UPDATE public.distlock_locks SET seen_at = clock_timestamp() WHERE pid = pg_backend_pid()"
    " AND digest IN (SELECT sha256(decode(x, 'hex')) FROM unnest($1::text[]) AS x)"
    " RETURNING encode(name, 'hex'), owner";

}  // namespace

void PostgresBackend::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) {
  ec.clear();
  std::fill(out.begin(), out.end(), RenewStatus::failed);
  std::map<Session*, std::vector<std::size_t>> by_session;
  for (std::size_t i = 0; i < items.size(); ++i) {
    Session* s = find_holder(items[i].name, items[i].owner);
    if (s == nullptr) {
      out[i] = RenewStatus::not_owner;  // its session ended (or it was released)
    } else {
      by_session[s].push_back(i);
    }
  }
  Lost lost;
  for (auto& [s, idx] : by_session) {
    LockGuard lk(s->mu);
    expire_stale(*s, lost);
    if (!s->conn) {
      for (auto i : idx) out[i] = RenewStatus::not_owner;
      continue;
    }
    // find_holder() looked before this lock: a lease released meanwhile (its key
    // perhaps held again by a new owner on this session) is not ours to touch.
    std::size_t kept = 0;
    for (const std::size_t i : idx) {
      auto h = s->held.find(postgres_lock_key(items[i].name));
      const bool current =
          h != s->held.end() && h->second.name == items[i].name && h->second.owner == items[i].owner;
      if (current) {
        idx[kept++] = i;
      } else {
        out[i] = RenewStatus::not_owner;
      }
    }
    idx.resize(kept);
    if (idx.empty()) continue;
    std::string arr = "{";
    for (std::size_t j = 0; j < idx.size(); ++j) {
      if (j) arr += ",";
      arr += to_hex(items[idx[j]].name);
    }
    arr += "}";
    const Clock::time_point sent = Clock::now();
    Exec e = run(s->conn.get(), kRenewSql, {arr}, cfg_.command_timeout);
    if (e.io_failed) {
      // The session is gone or cannot be trusted: its advisory locks end with it
      // (now, or at the server's idle timeout), and no later statement can renew them.
      failure("renew", e.error);
      drop(*s, lost);
      for (auto i : idx) out[i] = RenewStatus::not_owner;
      continue;
    }
    if (!e.ok()) {
      failure("renew", e.error);
      continue;  // stays failed: retried until the local deadline
    }
    ok();
    std::set<std::pair<std::string, std::string>> rows;
    for (int r = 0; r < PQntuples(e.res.get()); ++r) {
      rows.emplace(PQgetvalue(e.res.get(), r, 0), PQgetvalue(e.res.get(), r, 1));
    }
    for (auto i : idx) {
      const bool mine = rows.count({to_hex(items[i].name), std::string(items[i].owner)}) > 0;
      out[i] = mine ? RenewStatus::renewed : RenewStatus::not_owner;
      if (mine) {
        auto h = s->held.find(postgres_lock_key(items[i].name));
        if (h != s->held.end()) h->second.valid_until = sent + s->ttl;
      } else {
        // The row names someone else: the advisory lock is ours but the record is
        // not; give the lock up so the record's owner is the only holder.
        const std::int64_t key = postgres_lock_key(items[i].name);
        s->held.erase(key);
        run(s->conn.get(), "SELECT pg_advisory_unlock($1::bigint)", {std::to_string(key)},
            cfg_.command_timeout);
      }
    }
  }
  report_lost(lost);
}

ReleaseStatus PostgresBackend::release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                                       Error& ec) {
  ec.clear();
  Session* s = find_holder(name, owner);
  if (s == nullptr) return ReleaseStatus::not_owner;
  const std::int64_t key = postgres_lock_key(name);
  Lost lost;
  ReleaseStatus st = ReleaseStatus::released;
  {
    LockGuard lk(s->mu);
    expire_stale(*s, lost);
    auto it = s->held.find(key);
    if (it == s->held.end() || it->second.owner != owner || !s->conn) return ReleaseStatus::not_owner;
    Exec e =
        run(s->conn.get(), kReleaseSql,
            {to_hex(name), std::string(owner), std::to_string(key), key_payload(key)}, cfg_.command_timeout);
    if (e.io_failed && e.timed_out) {
      // No answer within the timeout is no evidence that the session ended: the
      // lease may well have been held to the end. The connection is closed (an
      // unanswered statement leaves it unusable), so the server ends the session
      // and frees the lock when the close reaches it, or one TTL after the last
      // statement at the latest. A transient error, as on the other backends.
      ec = make_error_code(errc::backend_unavailable);
      ec.set_detail(failure("release \"" + printable(name) + "\"", e.error) +
                    "; the server frees the lock when the session ends, within its TTL");
      s->held.erase(key);
      drop(*s, lost);
    } else if (e.io_failed) {
      // The connection failed (closed, reset): the session has ended, now or
      // earlier (the server freed the lock when it did, perhaps long before this
      // release, and somebody else may hold it by now). This lease is lost, not
      // released. No code: the engine counts not_owner as a loss and says so, with this cause.
      ec.set_detail(failure("release \"" + printable(name) + "\"", e.error));
      s->held.erase(key);
      drop(*s, lost);
      st = ReleaseStatus::not_owner;
    } else if (!e.ok()) {
      ec = code_of(e);
      ec.set_detail(failure("release \"" + printable(name) + "\"", e.error));
    } else {
      ok();
      s->held.erase(key);
      const bool row_was_ours =
          PQntuples(e.res.get()) == 1 && std::string_view(PQgetvalue(e.res.get(), 0, 0)) == "1";
      st = row_was_ours ? ReleaseStatus::released : ReleaseStatus::not_owner;
    }
  }
  report_lost(lost);
  return st;
}

Session& PostgresBackend::session(Millis ttl) {
  LockGuard lk(sessions_mu_);
  auto& s = sessions_[ttl];
  if (!s) s = std::make_unique<Session>(ttl);
  return *s;
}

Session* PostgresBackend::find_holder(std::string_view name, std::string_view owner) {
  const std::int64_t key = postgres_lock_key(name);
  std::vector<Session*> all;
  {
    LockGuard lk(sessions_mu_);
    for (auto& [ttl, s] : sessions_) all.push_back(s.get());
  }
  for (Session* s : all) {
    LockGuard lk(s->mu);
    auto it = s->held.find(key);
    if (it != s->held.end() && it->second.name == name && it->second.owner == owner) return s;
  }
  return nullptr;
}

// With s.mu held: a live connection, or false with ec.
bool PostgresBackend::ensure_connected(Session& s, Lost& lost, Error& ec) {
  if (s.conn && PQstatus(s.conn.get()) == CONNECTION_OK) return true;
  drop(s, lost);
  s.conn = open(cfg_, s.ttl, "distlock-lease", ec);  // the detail names the server and the cause
  if (ec) {
    failure("connect", ec.detail());
    return false;
  }
  return true;
}

void PostgresBackend::forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept {
  try {
    Session* s = find_holder(name, owner);
    if (s == nullptr) return;  // released, or its session ended (reported lost already)
    Lost lost;
    {
      LockGuard lk(s->mu);
      auto it = s->held.find(postgres_lock_key(name));
      // Exactly this lease: find_holder() looked before this lock, and the key may
      // have been released and taken again by another lease of this client since.
      if (it == s->held.end() || it->second.name != name || it->second.owner != owner ||
          it->second.token != token || !s->conn) {
        return;
      }
      it->second.forgotten = true;
      give_up(*s, it, lost);
    }
    report_lost(lost);
  } catch (...) {
    // Best effort: the server's session expiry stays the bound.
  }
}

// With s.mu held: gives up the advisory locks of leases the engine declared lost
// whose give-up failed (forget), and of leases not renewed for their TTL (the
// engine's local deadline lies before that, so it has declared them lost too; this
// is the backstop for a loss the engine did not hand back through forget()). While
// other leases keep this session busy, the server would otherwise keep them locked.
void PostgresBackend::expire_stale(Session& s, Lost& lost) {
  if (!s.conn) return;
  const auto now = Clock::now();
  for (auto it = s.held.begin(); it != s.held.end();) {
    if (!it->second.forgotten && now < it->second.valid_until) {
      ++it;
      continue;
    }
    // Erased or kept (retried at the next statement), `next` stays valid; unless the
    // session ended with all its leases.
    const auto next = std::next(it);
    give_up(s, it, lost);
    if (!s.conn) return;
    it = next;
  }
}

// With s.mu held: frees the advisory lock of one lost lease at once. Clears its row
// (only if it names this owner on this session and has no lock-delay), unlocks and wakes its waiters. If
// that fails with an SQL error (the table unreadable, say), the advisory lock alone
// is given up: the row still naming the owner keeps every acquirer out until its
// seen_at + ttl_ms, as for a session that ended (docs/postgres.md), so nobody gets in
// early. If even that fails with an SQL error, the entry stays (the session still
// holds the lock), a warning is logged, and it is retried at the next statement
// (expire_stale). A failure on the connection ends the session and every lease on it
// (reported lost).
void PostgresBackend::give_up(Session& s, std::map<std::int64_t, Session::Held>::iterator it, Lost& lost) {
  const std::int64_t key = it->first;
  const std::string name = it->second.name;
  Exec e = run(s.conn.get(), has_delay_column_.load() ? kGiveUpSql : kGiveUpWithoutDelaySql,
               {to_hex(name), it->second.owner, std::to_string(key), key_payload(key)}, cfg_.command_timeout);
  if (!e.ok() && !e.io_failed) {
    e = run(s.conn.get(), "SELECT pg_advisory_unlock($1::bigint), pg_notify('distlock_released', $2)",
            {std::to_string(key), key_payload(key)}, cfg_.command_timeout);
  }
  if (e.io_failed) {
    failure("give up the lost lease of \"" + printable(name) + "\"", e.error);
    s.held.erase(it);
    drop(s, lost);
    return;
  }
  if (!e.ok()) {
    log_.log(LogLevel::warning,
             "{}: cannot give up the lost lease of \"{}\" (retried at the next statement): {}", cfg_.shown,
             printable(name), e.error);
    return;
  }
  s.held.erase(it);
}

// With s.mu held: closes the session; every lease it carried is lost.
void PostgresBackend::drop(Session& s, Lost& lost) {
  for (auto& [key, h] : s.held) lost.emplace_back(h.name, h.owner);
  s.held.clear();
  s.conn.reset();
}

void PostgresBackend::report_lost(const Lost& lost) {
  if (lost.empty()) return;
  log_.log(LogLevel::warning, "{}: a session ended; {} lease(s) on it are lost", cfg_.shown, lost.size());
  ChangeListener* l = listener_cb_.load();
  if (!l) return;
  for (const auto& [name, owner] : lost) l->on_lease_lost(name, owner);
}

}  // namespace distlock::detail::postgres
