#include "postgres/postgres_backend.hpp"

#include <libpq-fe.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "core/worker_loop.hpp"
#include "postgres/pg_conn.hpp"
#include "postgres/postgres_records.hpp"

namespace distlock::detail {

std::int64_t postgres_lock_key(std::string_view name) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  // splitmix64's finaliser spreads FNV's weak low bits over the whole key.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return static_cast<std::int64_t>(h);
}

namespace {

using Clock = std::chrono::steady_clock;
using pg::code_of;
using pg::Config;
using pg::Conn;
using pg::Exec;
using pg::open;
using pg::pq_message;
using pg::Result;
using pg::run;

// Created once per database (under a transaction-level advisory lock of the
// two-int key space, which never meets the bigint keys of lock names, so that many
// clients starting at once create or migrate it once). The primary key is the
// name's SHA-256 (a B-tree entry holds at most about 2.7 kB; a name may have 4096
// bytes); the name itself is stored, unindexed, and compared. The records table
// (postgres_records.hpp) is created beside it. A table of an older
// layout (name as primary key, no seen_at) is migrated in place, its tokens kept.
// The fast path (the table is there in this layout) needs no CREATE privilege.
constexpr const char* kSetupSql =
    "BEGIN; SELECT pg_advisory_xact_lock(1684632419, 1);"
    "DO $distlock$ DECLARE pk name; BEGIN"
    " IF to_regclass('distlock_locks') IS NULL THEN"
    "  CREATE TABLE distlock_locks (digest bytea PRIMARY KEY, name bytea NOT NULL, token bigint NOT NULL,"
    "   owner text, pid integer, ttl_ms bigint, seen_at timestamptz);"
    " ELSIF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'distlock_locks'::regclass"
    "   AND attname = 'seen_at' AND NOT attisdropped) THEN"
    "  ALTER TABLE distlock_locks ADD COLUMN digest bytea, ADD COLUMN seen_at timestamptz;"
    "  UPDATE distlock_locks SET digest = sha256(name),"
    "   seen_at = CASE WHEN owner IS NOT NULL THEN clock_timestamp() END;"
    "  SELECT conname INTO pk FROM pg_constraint WHERE conrelid = 'distlock_locks'::regclass AND contype = "
    "'p';"
    "  IF pk IS NOT NULL THEN EXECUTE format('ALTER TABLE distlock_locks DROP CONSTRAINT %I', pk); END IF;"
    "  ALTER TABLE distlock_locks ALTER COLUMN digest SET NOT NULL, ADD PRIMARY KEY (digest);"
    " END IF;"
    // Records (postgres_records.cpp), keyed like the lock rows. A user that may not
    // create it (the lock table made by an administrator) still locks; its record
    // calls then fail naming the missing table.
    " IF to_regclass('distlock_records') IS NULL THEN BEGIN"
    "  CREATE TABLE distlock_records (digest bytea PRIMARY KEY, key bytea NOT NULL, value bytea NOT NULL);"
    "  EXCEPTION WHEN insufficient_privilege THEN NULL; END;"
    " END IF; END $distlock$; COMMIT";

// $1 name (hex), $2 key, $3 owner, $4 ttl ms. One statement, one transaction: the
// advisory lock and, only if it was granted, the row (next token, owner, this
// session's pid, seen_at = now). A row that still names an owner although the
// advisory lock was free belongs to a holder whose session ended without a release
// (connection cut, server restart or crash, killed client): that holder may still
// believe it holds the lock until its local deadline, which lies before its row's
// seen_at (its last acquire/renewal, stamped while the statement ran, after it was
// sent) + its TTL. Until then the row is not taken over: the advisory lock is given
// back in the same statement and the answer is busy with the time left. A digest
// collision (same digest, another name) is busy too, never a shared row.
// Columns: granted, token, holder TTL or time left (ms) when busy, (unlock result).
// The CTE o reads the row as it was before this statement.
constexpr const char* kAcquireSql =
    "WITH g AS MATERIALIZED (SELECT pg_try_advisory_lock($2::bigint) AS got),"
    " u AS (INSERT INTO distlock_locks AS d (digest, name, token, owner, pid, ttl_ms, seen_at)"
    " SELECT sha256(decode($1, 'hex')), decode($1, 'hex'), 1, $3, pg_backend_pid(), $4::bigint,"
    " clock_timestamp() FROM g WHERE g.got"
    " ON CONFLICT (digest) DO UPDATE SET token = d.token + 1, owner = EXCLUDED.owner, pid = EXCLUDED.pid,"
    " ttl_ms = EXCLUDED.ttl_ms, seen_at = EXCLUDED.seen_at WHERE d.name = EXCLUDED.name AND (d.owner IS NULL"
    " OR clock_timestamp() >= d.seen_at + d.ttl_ms * interval '1 millisecond') RETURNING d.token),"
    " o AS (SELECT owner, ttl_ms, seen_at FROM distlock_locks WHERE digest = sha256(decode($1, 'hex')))"
    " SELECT (SELECT token FROM u) IS NOT NULL, (SELECT token FROM u),"
    " (SELECT CASE WHEN o.owner IS NULL OR o.seen_at IS NULL THEN o.ttl_ms ELSE greatest(10, ceil(1000 *"
    " extract(epoch FROM o.seen_at + o.ttl_ms * interval '1 millisecond' - clock_timestamp())))::bigint END"
    " FROM o),"
    " CASE WHEN g.got AND (SELECT token FROM u) IS NULL THEN pg_advisory_unlock($2::bigint) END FROM g";

// $1 name (hex), $2 owner, $3 key, $4 notification payload. The row is cleared only
// for this owner on this session; the advisory lock is this session's (the caller
// checked it holds it); the notification is sent at commit. The commit need not
// wait for the WAL flush: the token is not touched, and a cleared owner lost to a
// crash makes the next acquirer wait out the released lease's TTL (spurious busy).
constexpr const char* kReleaseSql =
    "WITH r AS (UPDATE distlock_locks SET owner = NULL, pid = NULL WHERE digest = sha256(decode($1, 'hex'))"
    " AND name = decode($1, 'hex') AND owner = $2 AND pid = pg_backend_pid() RETURNING 1)"
    " SELECT (SELECT count(*) FROM r), pg_advisory_unlock($3::bigint), pg_notify('distlock_released', $4),"
    " set_config('synchronous_commit', 'off', true)";

// $1 text[] of hex names: the rows this session holds among them (and their owners),
// stamped seen_at = now, committed (synchronous_commit = on) before the answer: a
// renewal that succeeded is on disk, so a restarted server still knows how long its
// holder may believe it holds the lock.
constexpr const char* kRenewSql =
    "UPDATE distlock_locks SET seen_at = clock_timestamp() WHERE pid = pg_backend_pid()"
    " AND digest IN (SELECT sha256(decode(x, 'hex')) FROM unnest($1::text[]) AS x)"
    " RETURNING encode(name, 'hex'), owner";

// $1 name (hex), $2 high 32 bits of the key, $3 low 32 bits (pg_locks shows a bigint
// key as classid/objid with objsubid 1). Columns: token, owner, ttl ms, whether the
// owner's session holds the advisory lock, ms left of an orphaned lease (> 0: its
// session ended without a release and its holder may still believe it holds it).
constexpr const char* kStatusSql =
    "SELECT d.token, d.owner, d.ttl_ms, EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory'"
    " AND l.granted AND l.pid = d.pid AND l.objsubid = 1 AND l.classid = $2::bigint::oid"
    " AND l.objid = $3::bigint::oid),"
    " coalesce(ceil(1000 * extract(epoch FROM d.seen_at + d.ttl_ms * interval '1 millisecond'"
    " - clock_timestamp())), 0)::bigint"
    " FROM distlock_locks d WHERE d.digest = sha256(decode($1, 'hex')) AND d.name = decode($1, 'hex')";

std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string key_payload(std::int64_t key) {
  return to_hex(std::string_view(reinterpret_cast<const char*>(&key), sizeof key));
}

// One database session carrying every lease of one TTL: the server ends it (and
// every advisory lock it holds) after `ttl` without a statement.
struct Session {
  explicit Session(Millis t) : ttl(t) {}
  const Millis ttl;
  std::mutex mu;
  Conn conn;  // guarded by mu
  struct Held {
    std::string name, owner;
    // Send time of its last acquire/renewal + ttl: the engine's local deadline for
    // it lies before this, so past it the holder knows the lease is lost.
    Clock::time_point valid_until;
  };
  std::map<std::int64_t, Held> held;  // by advisory key; guarded by mu
};

using Lost = std::vector<std::pair<std::string, std::string>>;  // (name, owner)

class PostgresBackend final : public Backend {
 public:
  // Without an eventfd (listener_.valid() false) the listener still works: it then
  // notices a new socket or the stop request at its next poll timeout (<= 1 s).
  PostgresBackend(Config cfg, const ClientOptions& opts) : cfg_(std::move(cfg)), log_(opts.logger) {}

  ~PostgresBackend() override { listener_.stop(); }

  // Connects once (bad credentials, a down server or a missing database fail at
  // connect()), creates the table if needed and starts listening.
  std::error_code connect_now(std::string& why) {
    std::error_code ec;
    aux_ = open(cfg_, Millis(0), "distlock", ec, why);
    if (ec) return ec;
    Exec e;
    Result r(PQexec(aux_.get(), kSetupSql));
    if (!r || PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
      const std::string m = r ? PQresultErrorMessage(r.get()) : pq_message(aux_.get());
      const char* st = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
      e.sqlstate = st ? st : "";
      e.io_failed = PQstatus(aux_.get()) != CONNECTION_OK;
      why = cfg_.shown + ": cannot create the table distlock_locks: " + m;
      while (!why.empty() && why.back() == '\n') why.pop_back();
      return code_of(e);
    }
    if ((ec = listen_now(why))) return ec;
    listener_.start([this] { listen_loop(); });
    return {};
  }

  Capabilities capabilities() const noexcept override { return {true, true}; }
  void set_listener(ChangeListener* l) override { listener_cb_.store(l); }

  AcquireResult try_acquire(const AcquireRequest& req, std::error_code& ec) override {
    ec.clear();
    if (req.ttl.count() > std::numeric_limits<std::int32_t>::max()) {
      // idle_session_timeout is an int of milliseconds: the server would refuse the
      // session's startup options, which is no connection problem.
      ec = make_error_code(errc::invalid_argument);
      set_error_detail("TTL " + std::to_string(req.ttl.count()) + "ms of \"" + printable(req.name) +
                       "\" exceeds what postgres:// can hold: the lease is the session's "
                       "idle_session_timeout, at most 2147483647ms (about 24.8 days)");
      return {};
    }
    Session& s = session(req.ttl);
    const std::int64_t key = postgres_lock_key(req.name);
    Lost lost;
    AcquireResult res;
    {
      std::lock_guard lk(s.mu);
      expire_stale(s, lost);
      if (s.held.count(key)) {
        // This session holds the key already (another owner of this client, or a
        // name with the same hash): advisory locks re-enter within a session, so
        // asking the server would grant it twice.
        res.holder_ttl = s.ttl;
        return res;
      }
      const std::vector<std::string> params{to_hex(req.name), std::to_string(key), std::string(req.owner),
                                            std::to_string(req.ttl.count())};
      Exec e;
      Clock::time_point sent{};
      for (int attempt = 0; attempt < 2; ++attempt) {
        if (!ensure_connected(s, lost, ec)) break;
        sent = Clock::now();
        e = run(s.conn.get(), kAcquireSql, params, cfg_.command_timeout);
        if (!e.io_failed) break;
        // The session is gone: every lease on it went with it. An idle session the
        // server ended (idle_session_timeout) is expected: try once on a new one.
        const bool had_leases = !s.held.empty();
        drop(s, lost);
        if (had_leases) break;
      }
      if (!ec && !e.ok()) {
        ec = code_of(e);
        failure("acquire \"" + printable(req.name) + "\"", e.error);
        if (!e.io_failed && s.conn) {
          // The advisory lock may have been granted before the statement failed;
          // a session-level lock outlives a rolled-back transaction.
          run(s.conn.get(), "SELECT pg_advisory_unlock($1::bigint)", {std::to_string(key)},
              cfg_.command_timeout);
        }
      } else if (!ec) {
        ok();
        PGresult* r = e.res.get();
        if (PQntuples(r) != 1 || PQnfields(r) != 4) {
          ec = make_error_code(errc::protocol_error);
        } else if (std::string_view(PQgetvalue(r, 0, 0)) == "t") {
          std::uint64_t token = 0;
          const char* t = PQgetvalue(r, 0, 1);
          auto [p, er] = std::from_chars(t, t + std::strlen(t), token);
          if (er != std::errc{} || PQgetisnull(r, 0, 1)) {
            ec = make_error_code(errc::protocol_error);
          } else {
            s.held[key] = {std::string(req.name), std::string(req.owner), sent + s.ttl};
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

  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) override {
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
      std::lock_guard lk(s->mu);
      expire_stale(*s, lost);
      if (!s->conn) {
        for (auto i : idx) out[i] = RenewStatus::not_owner;
        continue;
      }
      // find_holder() looked before this lock: a lease released meanwhile (its key
      // perhaps held again by a new owner on this session) is not ours to touch.
      std::erase_if(idx, [&](std::size_t i) {
        auto h = s->held.find(postgres_lock_key(items[i].name));
        const bool current =
            h != s->held.end() && h->second.name == items[i].name && h->second.owner == items[i].owner;
        if (!current) out[i] = RenewStatus::not_owner;
        return !current;
      });
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

  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                        std::error_code& ec) override {
    ec.clear();
    Session* s = find_holder(name, owner);
    if (s == nullptr) return ReleaseStatus::not_owner;
    const std::int64_t key = postgres_lock_key(name);
    Lost lost;
    ReleaseStatus st = ReleaseStatus::released;
    {
      std::lock_guard lk(s->mu);
      expire_stale(*s, lost);
      auto it = s->held.find(key);
      if (it == s->held.end() || it->second.owner != owner || !s->conn) return ReleaseStatus::not_owner;
      Exec e = run(s->conn.get(), kReleaseSql,
                   {to_hex(name), std::string(owner), std::to_string(key), key_payload(key)},
                   cfg_.command_timeout);
      if (e.io_failed) {
        // The session ends with the connection (or has ended already: the server
        // freed the lock when it did, perhaps long before this release, and somebody
        // else may hold it by now). Either way this lease is lost, not released.
        failure("release \"" + printable(name) + "\"", e.error);
        s->held.erase(key);
        drop(*s, lost);
        st = ReleaseStatus::not_owner;
      } else if (!e.ok()) {
        failure("release \"" + printable(name) + "\"", e.error);
        ec = code_of(e);
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

  void watch(std::string_view name, std::error_code& ec) override {
    ec.clear();
    const std::int64_t key = postgres_lock_key(name);
    std::lock_guard lk(listen_mu_);
    if (!listen_conn_) {
      std::string why;
      if ((ec = listen_now_locked(why))) {
        set_error_detail("cannot wait for a release of \"" + printable(name) + "\": " + why);
        return;
      }
    }
    ++watched_[key][std::string(name)];
  }

  void unwatch(std::string_view name) noexcept override {
    try {
      const std::int64_t key = postgres_lock_key(name);
      std::lock_guard lk(listen_mu_);
      auto it = watched_.find(key);
      if (it == watched_.end()) return;
      auto n = it->second.find(std::string(name));
      if (n != it->second.end() && --n->second <= 0) it->second.erase(n);
      if (it->second.empty()) watched_.erase(it);
    } catch (...) {
    }
  }

  LockInfo status(std::string_view name, std::error_code& ec) override {
    ec.clear();
    const std::int64_t key = postgres_lock_key(name);
    const auto ukey = static_cast<std::uint64_t>(key);
    std::lock_guard lk(aux_mu_);
    std::string why;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!aux_ || PQstatus(aux_.get()) != CONNECTION_OK) {
        aux_ = open(cfg_, Millis(0), "distlock", ec, why);
        if (ec) {
          failure("status", why);
          return {};
        }
      }
      Exec e = run(aux_.get(), kStatusSql,
                   {to_hex(name), std::to_string(ukey >> 32), std::to_string(ukey & 0xffffffffULL)},
                   cfg_.command_timeout);
      if (e.io_failed) {
        aux_.reset();
        if (attempt == 0) continue;
      }
      if (!e.ok()) {
        ec = code_of(e);
        failure("status", e.error);
        return {};
      }
      LockInfo info;
      PGresult* r = e.res.get();
      if (PQntuples(r) == 1) {
        info.token = std::strtoull(PQgetvalue(r, 0, 0), nullptr, 10);
        const bool session_holds = std::string_view(PQgetvalue(r, 0, 3)) == "t";
        const long long orphan_left = std::strtoll(PQgetvalue(r, 0, 4), nullptr, 10);
        // Held: the owner's session holds the advisory lock, or it ended without a
        // release less than its TTL after its last renewal (nobody else gets it yet).
        info.held = !PQgetisnull(r, 0, 1) && (session_holds || orphan_left > 0);
        if (info.held) {
          info.holder = std::string(PQgetvalue(r, 0, 1));
          // A session lease: the holder's TTL is the most it has left.
          info.ttl_remaining =
              session_holds ? Millis(std::strtoll(PQgetvalue(r, 0, 2), nullptr, 10)) : Millis(orphan_left);
        }
      }
      return info;
    }
    return {};
  }

  // Records and listing: postgres_records.cpp, on the shared connection.
  std::string put_record(std::string_view key, std::string_view value, PutMode mode,
                         std::error_code& ec) override {
    return pg::put_record(runner(), key, value, mode, ec);
  }
  std::optional<std::string> get_record(std::string_view key, std::error_code& ec) override {
    return pg::get_record(runner(), key, ec);
  }
  bool erase_record(std::string_view key, std::error_code& ec) override {
    return pg::erase_record(runner(), key, ec);
  }
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    std::error_code& ec) override {
    return pg::list_held(runner(), prefix, limit, truncated, ec);
  }

  std::string url() const override { return cfg_.shown; }

 private:
  // One statement on the shared connection (aux_), reconnecting it once when it
  // failed; on failure `ec` and the error detail (naming the server) are set.
  pg::Runner runner() {
    return [this](const char* sql, const std::vector<std::string>& params, const char* what,
                  std::error_code& ec) {
      std::lock_guard lk(aux_mu_);
      std::string why;
      Exec e;
      for (int attempt = 0; attempt < 2; ++attempt) {
        if (!aux_ || PQstatus(aux_.get()) != CONNECTION_OK) {
          aux_ = open(cfg_, Millis(0), "distlock", ec, why);
          if (ec) {
            failure(what, why);
            set_error_detail(why + " (" + what + ")");
            return Exec{};
          }
        }
        e = run(aux_.get(), sql, params, cfg_.command_timeout);
        if (!e.io_failed) break;
        aux_.reset();
      }
      if (!e.ok()) {
        ec = code_of(e);
        failure(what, e.error);
        std::string detail = cfg_.shown + ": " + what + ": " + e.error;
        if (e.sqlstate == "42P01") {
          detail +=
              " (the table is created by the first client whose user may create tables; see "
              "docs/postgres.md)";
        }
        set_error_detail(std::move(detail));
        return Exec{};
      }
      ok();
      return e;
    };
  }

  static std::string printable(std::string_view name) {
    std::string out;
    for (char c : name.substr(0, 64)) out.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
    if (name.size() > 64) out += "...";
    return out;
  }

  Session& session(Millis ttl) {
    std::lock_guard lk(sessions_mu_);
    auto& s = sessions_[ttl];
    if (!s) s = std::make_unique<Session>(ttl);
    return *s;
  }

  Session* find_holder(std::string_view name, std::string_view owner) {
    const std::int64_t key = postgres_lock_key(name);
    std::vector<Session*> all;
    {
      std::lock_guard lk(sessions_mu_);
      for (auto& [ttl, s] : sessions_) all.push_back(s.get());
    }
    for (Session* s : all) {
      std::lock_guard lk(s->mu);
      auto it = s->held.find(key);
      if (it != s->held.end() && it->second.name == name && it->second.owner == owner) return s;
    }
    return nullptr;
  }

  // With s.mu held: a live connection, or false with ec.
  bool ensure_connected(Session& s, Lost& lost, std::error_code& ec) {
    if (s.conn && PQstatus(s.conn.get()) == CONNECTION_OK) return true;
    drop(s, lost);
    std::string why;
    s.conn = open(cfg_, s.ttl, "distlock-lease", ec, why);
    if (ec) {
      failure("connect", why);
      set_error_detail(why);
      return false;
    }
    return true;
  }

  // With s.mu held: gives up the advisory locks of leases not renewed for their TTL.
  // The engine has declared them lost (its local deadline came first) and does not
  // release lost leases; while other leases keep this session busy, the server would
  // otherwise keep them locked. Clears their rows and wakes their waiters. A release
  // that fails with an SQL error keeps the entry (the session still holds the lock)
  // and is retried at the next statement on the session; one that fails on the
  // connection ends the session (and its advisory locks) with its other leases.
  void expire_stale(Session& s, Lost& lost) {
    if (!s.conn) return;
    const auto now = Clock::now();
    for (auto it = s.held.begin(); it != s.held.end();) {
      if (now < it->second.valid_until) {
        ++it;
        continue;
      }
      Exec e =
          run(s.conn.get(), kReleaseSql,
              {to_hex(it->second.name), it->second.owner, std::to_string(it->first), key_payload(it->first)},
              cfg_.command_timeout);
      if (e.io_failed) {
        failure("give up the expired lease of \"" + printable(it->second.name) + "\"", e.error);
        s.held.erase(it);
        drop(s, lost);
        return;
      }
      if (!e.ok()) {
        log_.log(LogLevel::warning,
                 "{}: cannot give up the expired lease of \"{}\" (retried at the next statement): {}",
                 cfg_.shown, printable(it->second.name), e.error);
        ++it;
        continue;
      }
      it = s.held.erase(it);
    }
  }

  // With s.mu held: closes the session; every lease it carried is lost.
  void drop(Session& s, Lost& lost) {
    for (auto& [key, h] : s.held) lost.emplace_back(h.name, h.owner);
    s.held.clear();
    s.conn.reset();
  }

  void report_lost(const Lost& lost) {
    if (lost.empty()) return;
    log_.log(LogLevel::warning, "{}: a session ended; {} lease(s) on it are lost", cfg_.shown, lost.size());
    ChangeListener* l = listener_cb_.load();
    if (!l) return;
    for (const auto& [name, owner] : lost) l->on_lease_lost(name, owner);
  }

  std::error_code listen_now(std::string& why) {
    std::lock_guard lk(listen_mu_);
    return listen_now_locked(why);
  }

  // With listen_mu_ held: a connection that LISTENs, live when this returns.
  std::error_code listen_now_locked(std::string& why) {
    std::error_code ec;
    Conn c = open(cfg_, Millis(0), "distlock-listen", ec, why);
    if (ec) return ec;
    Exec e = run(c.get(), "LISTEN distlock_released", {}, cfg_.command_timeout);
    if (!e.ok()) {
      why = cfg_.shown + ": LISTEN: " + e.error;
      return code_of(e);
    }
    listen_conn_ = std::move(c);
    listener_.wake();  // the loop polls the new socket
    return {};
  }

  // Delivers notifications; when the listening connection breaks, wakes every
  // waiter (a release may have been missed) and reconnects while anyone waits.
  void listen_loop() {
    while (!listener_.stopping()) {
      int fd = -1;
      {
        std::lock_guard lk(listen_mu_);
        if (listen_conn_) fd = PQsocket(listen_conn_.get());
      }
      pollfd pfd[2] = {{listener_.wake_fd(), POLLIN, 0}, {fd, POLLIN, 0}};
      ::poll(pfd, fd >= 0 ? 2 : 1, fd >= 0 ? 1000 : 250);
      if (pfd[0].revents & POLLIN) listener_.clear_wake();
      if (listener_.stopping()) break;
      std::vector<std::string> wake;
      {
        std::lock_guard lk(listen_mu_);
        if (listen_conn_ && fd >= 0 && fd == PQsocket(listen_conn_.get()) && (pfd[1].revents != 0)) {
          if (!PQconsumeInput(listen_conn_.get()) || PQstatus(listen_conn_.get()) != CONNECTION_OK) {
            log_.log(LogLevel::warning, "{}: the listening connection broke: {}", cfg_.shown,
                     pq_message(listen_conn_.get()));
            listen_conn_.reset();
            for (auto& [k, names] : watched_) {
              for (auto& [n, c] : names) wake.push_back(n);
            }
          } else {
            while (PGnotify* n = PQnotifies(listen_conn_.get())) {
              auto it = std::find_if(watched_.begin(), watched_.end(),
                                     [&](const auto& w) { return key_payload(w.first) == n->extra; });
              if (it != watched_.end()) {
                for (auto& [name, c] : it->second) wake.push_back(name);
              }
              PQfreemem(n);
            }
          }
        }
        if (!listen_conn_ && !watched_.empty()) {
          std::string why;
          if (!listen_now_locked(why)) {
            for (auto& [k, names] : watched_) {
              for (auto& [n, c] : names) wake.push_back(n);
            }
          }
        }
      }
      ChangeListener* l = listener_cb_.load();
      if (l) {
        for (const auto& n : wake) l->on_change(n);
      }
    }
  }

  // Logged once per outage; every failing call's error names the server and cause.
  void failure(const std::string& what, const std::string& why) {
    set_error_detail(why.find(cfg_.shown) != std::string::npos ? what + ": " + why
                                                               : cfg_.shown + ": " + what + ": " + why);
    if (!failing_.exchange(true)) log_.log(LogLevel::warning, "{}: {}: {}", cfg_.shown, what, why);
  }
  void ok() {
    if (failing_.exchange(false)) log_.log(LogLevel::info, "{} answers again", cfg_.shown);
  }

  const Config cfg_;
  Logger log_;
  std::atomic<ChangeListener*> listener_cb_{nullptr};
  std::atomic<bool> failing_{false};
  std::mutex sessions_mu_;
  std::map<Millis, std::unique_ptr<Session>> sessions_;  // guarded by sessions_mu_; never erased
  std::mutex aux_mu_;
  Conn aux_;  // status queries; guarded by aux_mu_
  std::mutex listen_mu_;
  Conn listen_conn_;                                            // guarded by listen_mu_
  std::map<std::int64_t, std::map<std::string, int>> watched_;  // key → name → watch count
  WorkerLoop listener_;  // last: stopped in the destructor before anything above goes
};

}  // namespace

std::unique_ptr<Backend> make_postgres_backend(const Url& url, const ClientOptions& opts, std::error_code& ec,
                                               std::string& why) {
  ec.clear();
  Config cfg;
  cfg.shown = url.redacted();
  const std::string shown = "\"" + cfg.shown + "\"";
  auto bad = [&](std::string msg) -> std::unique_ptr<Backend> {
    ec = make_error_code(errc::invalid_url);
    why = std::move(msg);
    return nullptr;
  };
  if (url.hosts.empty() || url.hosts[0].host.empty()) {
    return bad("URL " + shown + " names no host (expected postgres://user:password@host:port/database)");
  }
  if (url.hosts.size() > 1) {
    return bad("URL " + shown + " names " + std::to_string(url.hosts.size()) +
               " hosts; postgres:// takes one server (advisory locks live on one primary)");
  }
  // sslmode= was checked against the scheme's table (registry.cpp).
  cfg.sslmode = url.query_or("sslmode", cfg.sslmode);
  std::string db = url.path;
  if (!db.empty() && db[0] == '/') db.erase(0, 1);
  if (db.empty()) {
    // libpq would pick the user's name: clients naming different users would then
    // lock in different databases and never exclude each other.
    return bad("URL " + shown +
               " names no database (expected postgres://host:port/database): advisory locks and the "
               "lock table are per database, so every client of a lock must name the same one");
  }
  if (db.find('/') != std::string::npos) {
    return bad("database \"" + db + "\" in URL " + shown +
               " contains '/' (expected postgres://host:port/database)");
  }
  cfg.host = url.hosts[0].host;
  if (url.hosts[0].port != 0) cfg.port = std::to_string(url.hosts[0].port);
  cfg.user = url.user;
  cfg.password = url.password;
  cfg.dbname = db;
  cfg.connect_timeout = opts.connect_timeout;
  cfg.command_timeout = opts.command_timeout;
  auto backend = std::make_unique<PostgresBackend>(std::move(cfg), opts);
  if ((ec = backend->connect_now(why))) return nullptr;
  return backend;
}

}  // namespace distlock::detail
