// The MySQL backend: setup (connect, version and durability checks, the tables),
// acquire, renew, release, forget, status and the factory.
#include "mysql/mysql_backend.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "mysql/mysql_backend_impl.hpp"

namespace distlock::detail {

namespace mysql {

using my::digest_sql;
using my::hex_literal;
using my::lock_name_sql;

namespace {

constexpr std::size_t kMaxIdle = 4;

// ms left of a lease counted from its row: seen_at (the server's clock when the
// acquire or last renewal ran, after it was sent) + ttl_ms - now.
constexpr const char* kLeftMs =
    "CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), seen_at + INTERVAL ttl_ms * 1000 MICROSECOND) / 1000)";

// The end of a lost lease's hold on its row: seen_at + ttl_ms + the holder's lock-delay
// (delay_ms, null: none; docs/design.md "Lock-delay"), on the server's clock.
constexpr const char* kRowEnd = "seen_at + INTERVAL (ttl_ms + IFNULL(delay_ms, 0)) * 1000 MICROSECOND";

std::uint64_t to_u64(const std::optional<std::string>& v, bool& ok) {
  std::uint64_t x = 0;
  if (!v) {
    ok = false;
    return 0;
  }
  auto [p, er] = std::from_chars(v->data(), v->data() + v->size(), x);
  ok = er == std::errc{} && p == v->data() + v->size();
  return x;
}

long long to_i64(const std::optional<std::string>& v) {
  if (!v) return 0;
  double d = std::strtod(v->c_str(), nullptr);  // CEIL(...) of a decimal may come back as "12" or "12.0"
  return static_cast<long long>(d);
}

}  // namespace

MysqlBackend::~MysqlBackend() {
  watcher_.stop();
  LockGuard wl(watch_mu_);
  LockGuard al(aux_mu_);
  for (auto& [name, w] : watches_) {
    // A wait blocked inside the server is ended from another session, not left to run.
    if (blocked(w)) kill_query_locked(w.conn_id);
  }
  watches_.clear();
}

// Connects once (bad credentials, a down server or a missing database fail at
// connect()), checks the server, creates the tables if needed and starts the watcher.
Error MysqlBackend::connect_now() {
  UniqueLock aux_lock(aux_mu_);  // released before the watcher starts (it takes aux_mu_ too)
  Error err;
  aux_ = my::open(cfg_, err);
  if (err) return err;
  Exec e = my::run(aux_.get(), "SELECT VERSION(), @@GLOBAL.innodb_flush_log_at_trx_commit");
  if (!e.ok() || e.rows.size() != 1 || e.rows[0].size() != 2) {
    return {e.ok() ? make_error_code(errc::protocol_error) : my::code_of(e),
            cfg_.shown + ": cannot read the server's version: " + e.error};
  }
  const std::string version = e.rows[0][0].value_or("");
  const bool maria = version.find("MariaDB") != std::string::npos;
  int major = 0, minor = 0;
  {
    const char* p = version.c_str();
    char* end = nullptr;
    major = static_cast<int>(std::strtol(p, &end, 10));
    if (end && *end == '.') minor = static_cast<int>(std::strtol(end + 1, nullptr, 10));
  }
  if ((maria && (major < 10 || (major == 10 && minor < 6))) || (!maria && major < 8)) {
    return {make_error_code(errc::backend_unavailable),
            cfg_.shown + ": server version " + version +
                " is too old; mysql:// needs MariaDB 10.6 or later or MySQL 8.0 or later (several named "
                "locks per "
                "session, DATETIME(6))"};
  }
  if (e.rows[0][1].value_or("") != "1") {
    // Said once per client, as the Redis backend does for appendonly.
    log_.log(LogLevel::warning,
             "{}: innodb_flush_log_at_trx_commit is {}, not 1: a crash of the server host may lose the last "
             "fencing tokens issued, and a token may then be issued twice (see docs/mysql.md)",
             cfg_.shown, e.rows[0][1].value_or("unknown"));
  }
  // The tables, named with their schema (a user's default database cannot split them).
  // The fast path (the lock table is there) needs no CREATE privilege.
  e = my::run(aux_.get(), "SELECT 1 FROM " + cfg_.locks_table + " LIMIT 0");
  if (!e.ok() && e.errnum == 1146 /* ER_NO_SUCH_TABLE */) {
    e = my::run(aux_.get(),
                "CREATE TABLE IF NOT EXISTS " + cfg_.locks_table +
                    " (digest BINARY(32) NOT NULL PRIMARY KEY, name VARBINARY(4096) NOT NULL,"
                    " token BIGINT UNSIGNED NOT NULL, owner BLOB NULL, conn_id BIGINT UNSIGNED NULL,"
                    " lock_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL, ttl_ms BIGINT NULL,"
                    " seen_at DATETIME(6) NULL, delay_ms BIGINT NULL) ENGINE=InnoDB");
  }
  if (!e.ok()) {
    return {my::code_of(e),
            cfg_.shown + ": cannot create or read the table " + cfg_.locks_table + ": " + e.error};
  }
  // A table made before lock-delay gets its column (null: no delay); that needs ALTER on it.
  // An account that may not alter the table still connects and locks, without lock-delay
  // (Capabilities::lock_delay false; the statements then neither read nor write delay_ms).
  e = my::run(aux_.get(), "SELECT delay_ms FROM " + cfg_.locks_table + " LIMIT 0");
  bool with_delay = e.ok();
  if (!e.ok() && e.errnum == 1054 /* ER_BAD_FIELD_ERROR */) {
    e = my::run(aux_.get(), "ALTER TABLE " + cfg_.locks_table + " ADD COLUMN delay_ms BIGINT NULL");
    if (!e.ok() && e.errnum == 1060 /* ER_DUP_FIELDNAME: another client added it */)
      e = my::run(aux_.get(), "SELECT 1");
    with_delay = e.ok();
    if (!e.ok() && (e.errnum == 1142 /* ER_TABLEACCESS_DENIED_ERROR */ ||
                    e.errnum == 1044 /* ER_DBACCESS_DENIED_ERROR */)) {
      e = my::run(aux_.get(), "SELECT 1");
    }
  }
  has_delay_column_.store(with_delay);
  if (!e.ok()) {
    return {my::code_of(e), cfg_.shown + ": cannot add the column delay_ms to the table " + cfg_.locks_table +
                                ": " + e.error};
  }
  // Records (mysql_records.cpp), checked on their own: the client that made the lock
  // table may have failed to make this one (a command timeout on a busy server), and a
  // later client must not take the lock table for proof that both are there. A user that
  // may not create it still locks; a record call tries once more (shared()) and otherwise
  // fails naming the missing table.
  e = my::run(aux_.get(), "SELECT 1 FROM " + cfg_.records_table + " LIMIT 0");
  if (!e.ok() && e.errnum == 1146 /* ER_NO_SUCH_TABLE */) my::run(aux_.get(), create_records_sql());
  // Releases (see release_on): a MEMORY table, emptied by a server restart. Without it
  // (a user that may neither read nor create it) releases clear the row in InnoDB.
  e = my::run(aux_.get(), "SELECT 1 FROM " + cfg_.released_table + " LIMIT 0");
  if (!e.ok() && e.errnum == 1146) {
    e = my::run(aux_.get(), "CREATE TABLE IF NOT EXISTS " + cfg_.released_table +
                                " (digest BINARY(32) NOT NULL PRIMARY KEY, token BIGINT UNSIGNED NOT NULL)"
                                " ENGINE=MEMORY");
  }
  fast_release_ = e.ok();
  aux_lock.unlock();
  if (!watcher_.valid()) {
    return {std::error_code(watcher_.error(), std::system_category()),
            cfg_.shown + ": cannot make an eventfd for the watcher thread"};
  }
  watcher_.start([this] { watch_loop(); });
  return {};
}

std::string MysqlBackend::create_records_sql() const {
  return "CREATE TABLE IF NOT EXISTS " + cfg_.records_table +
         " (digest BINARY(32) NOT NULL PRIMARY KEY, k BLOB NOT NULL, value MEDIUMBLOB NOT NULL) "
         "ENGINE=InnoDB";
}

Exec MysqlBackend::shared(const std::string& sql, const char* what, Error& ec) {
  LockGuard lk(aux_mu_);
  Exec e;
  bool made_records = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!aux_) {
      aux_ = my::open(cfg_, ec);
      if (ec) {
        failure(what, ec.detail());
        ec.set_detail(ec.detail() + " (" + what + ")");
        return Exec{};
      }
    }
    e = my::run(aux_.get(), sql);
    if (!e.ok() && e.errnum == 1146 && !made_records && sql.find(cfg_.records_table) != std::string::npos) {
      // The records table is missing (never made, or dropped): make it and run once more.
      made_records = true;
      my::run(aux_.get(), "ROLLBACK");
      if (my::run(aux_.get(), create_records_sql()).ok()) e = my::run(aux_.get(), sql);
    }
    if (!e.io_failed) break;
    aux_.reset();
  }
  if (!e.ok()) {
    ec = my::code_of(e);
    failure(what, e.error);
    std::string detail = cfg_.shown + ": " + what + ": " + e.error;
    if (e.errnum == 1146) {
      detail +=
          " (the tables are created by the first client whose user may create tables; see docs/mysql.md)";
    }
    ec.set_detail(std::move(detail));
    // A batch that failed inside a transaction must not leave it open.
    if (aux_) my::run(aux_.get(), "ROLLBACK");
    return Exec{};
  }
  ok();
  return e;
}

Conn MysqlBackend::take_conn(bool fresh, bool& reused, Error& ec) {
  if (!fresh) {
    LockGuard lk(mu_);
    const auto now = Clock::now();
    std::erase_if(idle_, [&](const Idle& i) { return i.usable_until <= now; });
    if (!idle_.empty()) {
      Conn c = std::move(idle_.back().conn);
      idle_.pop_back();
      reused = true;
      return c;
    }
  }
  reused = false;
  Conn c = my::open(cfg_, ec);  // the detail names the server and the cause
  if (ec) failure("connect", ec.detail());
  return c;
}

void MysqlBackend::give_back(Conn c, Millis idle_for) {
  if (!c) return;
  // Half a second for the round trip that would find it gone.
  const auto until = Clock::now() + idle_for - Millis(500);
  LockGuard lk(mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back({std::move(c), until});
}

AcquireResult MysqlBackend::try_acquire(const AcquireRequest& req, Error& ec) {
  ec.clear();
  const long long wait_s = req.ttl.count() / 1000;
  if (wait_s < 1 || wait_s > kMaxWaitSeconds) {
    ec.fail(errc::invalid_argument,
            "TTL " + std::to_string(req.ttl.count()) + "ms of \"" + printable(req.name) +
                "\" is outside what mysql:// can hold: the lease is the session's wait_timeout, which counts "
                "whole seconds from 1s to 31536000s (a year)");
    return {};
  }
  const Millis validity(wait_s * 1000);
  const std::string L = lock_name_sql(req.name), D = digest_sql(req.name), N = hex_literal(req.name),
                    T = cfg_.locks_table;
  // Taken over when the row names no owner, its holder released it (distlock_released)
  // or its lease's time has passed (its session ended without a release).
  const std::string free_row = "owner IS NULL OR " + released_sql("l");
  // A table without delay_ms (an account that may not add it, connect_now): no lock-delay.
  const bool with_delay = has_delay_column_.load();
  const std::string row_end = with_delay ? kRowEnd : "seen_at + INTERVAL ttl_ms * 1000 MICROSECOND";
  const std::string sql =
      "SET SESSION wait_timeout = " + std::to_string(wait_s) + ", @dl_g = GET_LOCK(" + L +
      ", 0), @dl_ok = 1, @dl_left = NULL; SELECT name = " + N + " AND (" + free_row +
      " OR UTC_TIMESTAMP(6) >= " + row_end + "), IF(" + free_row +
      ", NULL, GREATEST(10, CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), " + row_end +
      ") / 1000))) INTO @dl_ok, @dl_left FROM " + T + " AS l WHERE digest = " + D + "; INSERT INTO " + T +
      " (digest, name, token, owner, conn_id, lock_name, ttl_ms, seen_at" + (with_delay ? ", delay_ms" : "") +
      ") SELECT " + D + ", " + N + ", 1, " + hex_literal(req.owner) + ", CONNECTION_ID(), " + L + ", " +
      std::to_string(validity.count()) + ", UTC_TIMESTAMP(6)" +
      (with_delay ? ", " + std::to_string(req.lock_delay.count()) : std::string()) +
      " FROM DUAL WHERE @dl_g = 1 AND @dl_ok = 1 ON DUPLICATE KEY UPDATE token = token + 1,"
      " owner = VALUES(owner), conn_id = VALUES(conn_id), lock_name = VALUES(lock_name),"
      " ttl_ms = VALUES(ttl_ms), seen_at = VALUES(seen_at)" +
      (with_delay ? ", delay_ms = VALUES(delay_ms)" : "") +
      "; SELECT @dl_g = 1 "
      "AND @dl_ok = 1, (SELECT token "
      "FROM " +
      T + " WHERE digest = " + D + "), @dl_left, IF(@dl_g = 1 AND NOT (@dl_ok <=> 1), RELEASE_LOCK(" + L +
      "), NULL)";
  AcquireResult res;
  // The named lock was free but the row keeps others out (its holder's session ended
  // without a release, less than its TTL ago).
  bool row_only = false;
  Conn c;
  Exec e;
  Clock::time_point sent{};
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool reused = false;
    c = take_conn(attempt > 0, reused, ec);
    if (ec) break;
    sent = Clock::now();
    e = my::run(c.get(), sql);
    // An idle session the server ended (its last lease's wait_timeout) is expected:
    // try once on a new one.
    if (e.io_failed && reused) continue;
    break;
  }
  if (!ec && !e.ok()) {
    ec = my::code_of(e);
    ec.set_detail(failure("acquire \"" + printable(req.name) + "\"", e.error));
    c.reset();  // the named lock may have been granted before the failure: the session goes with it
  } else if (!ec) {
    ok();
    if (e.rows.size() != 1 || e.rows[0].size() != 4) {
      ec.fail(errc::protocol_error, cfg_.shown + ": unexpected answer to an acquire");
      c.reset();
    } else if (e.rows[0][0].value_or("0") == "1") {
      bool good = false;
      const std::uint64_t token = to_u64(e.rows[0][1], good);
      if (!good) {
        ec.fail(errc::protocol_error,
                cfg_.shown + ": the token of \"" + printable(req.name) + "\" is malformed");
        c.reset();
      } else {
        auto l = std::make_shared<Lease>();
        l->name = std::string(req.name);
        l->owner = std::string(req.owner);
        l->token = token;
        l->validity = validity;
        {
          LockGuard lease_lock(l->mu);  // not shared yet: satisfies the annotation
          l->valid_until = sent + validity;
          l->conn = std::move(c);
        }
        {
          LockGuard lk(mu_);
          leases_[name_owner_key(req.name, req.owner)] = l;
        }
        res.acquired = true;
        res.token = token;
        // The server ends the session no earlier than wait_timeout after it answered,
        // which is later than the send time the engine counts from.
        res.validity = validity;
      }
    } else {
      if (e.rows[0][2]) res.holder_ttl = Millis(std::max<long long>(10, to_i64(e.rows[0][2])));
      row_only = e.rows[0][3].has_value() && res.holder_ttl.has_value();
      give_back(std::move(c), validity);
    }
  }
  // A wait inside the server would be answered at once (the named lock is free) and
  // the waiter would try again in a loop until the row's time has passed: then the
  // waiter looks again when holder_ttl has passed, and nobody can take the lock before.
  if (!row_only) rearm(req.name);
  if (ec) return {};
  return res;
}

std::shared_ptr<Lease> MysqlBackend::find_lease(std::string_view name, std::string_view owner) {
  LockGuard lk(mu_);
  auto it = leases_.find(name_owner_key(name, owner));
  return it == leases_.end() ? nullptr : it->second;
}

void MysqlBackend::drop_lease(const std::shared_ptr<Lease>& l) {
  LockGuard lk(mu_);
  auto it = leases_.find(name_owner_key(l->name, l->owner));
  if (it != leases_.end() && it->second == l) leases_.erase(it);
}

void MysqlBackend::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) {
  ec.clear();
  std::fill(out.begin(), out.end(), RenewStatus::failed);
  for (std::size_t i = 0; i < items.size(); ++i) {
    auto l = find_lease(items[i].name, items[i].owner);
    if (!l) {
      out[i] = RenewStatus::not_owner;  // its session ended (or it was released)
      continue;
    }
    LockGuard lk(l->mu);
    if (!l->conn) {
      out[i] = RenewStatus::not_owner;
      continue;
    }
    // The row still names this owner on this session, and this session holds the
    // named lock: then the batch also restarts the session's idle clock. Its idle limit
    // is first cut to what is left of the lease (rounded up to a whole second, so never
    // before the holder's own deadline) and set back to the full validity only if the
    // row was renewed: a renewal that fails with an SQL error (the engine retries until
    // its local deadline) leaves a session the server ends at most a second after that
    // deadline, not a whole TTL after the last failed attempt.
    const auto sent = Clock::now();
    const long long left_ms = std::chrono::duration_cast<Millis>(l->valid_until - sent).count();
    const long long left_s = std::clamp<long long>((left_ms + 999) / 1000, 1, l->validity.count() / 1000);
    Exec e = my::run(
        l->conn.get(),
        "SET SESSION wait_timeout = " + std::to_string(left_s) + "; UPDATE " + cfg_.locks_table +
            " SET seen_at = UTC_TIMESTAMP(6) WHERE digest = " + digest_sql(l->name) +
            " AND name = " + hex_literal(l->name) + " AND owner = " + hex_literal(l->owner) +
            " AND conn_id = CONNECTION_ID() AND IS_USED_LOCK(" + lock_name_sql(l->name) +
            ") <=> CONNECTION_ID(); SET @dl_n = ROW_COUNT(); SET SESSION wait_timeout = IF(@dl_n = 1, " +
            std::to_string(l->validity.count() / 1000) + ", " + std::to_string(left_s) + "); SELECT @dl_n");
    if (e.io_failed) {
      // The session is gone or cannot be trusted: its named lock ends with it (now, or
      // at the server's wait_timeout), and no later statement can renew it.
      failure("renew \"" + printable(l->name) + "\"", e.error);
      l->conn.reset();
      drop_lease(l);
      out[i] = RenewStatus::not_owner;
      continue;
    }
    if (!e.ok()) {
      failure("renew \"" + printable(l->name) + "\"", e.error);
      continue;  // stays failed: retried until the local deadline
    }
    ok();
    if (e.rows.size() == 1 && e.rows[0].size() == 1 && e.rows[0][0] == "1") {
      out[i] = RenewStatus::renewed;
      l->valid_until = sent + l->validity;
    } else {
      // The row names someone else, or the session lost the named lock: not ours.
      Exec r;
      release_on(*l, r, /*lost=*/true);
      l->conn.reset();
      drop_lease(l);
      out[i] = RenewStatus::not_owner;
    }
  }
}

std::string MysqlBackend::released_sql(const std::string& row) const {
  if (!fast_release_) return "FALSE";
  return "(" + row + ".token <=> (SELECT r.token FROM " + cfg_.released_table + " r WHERE r.digest = " + row +
         ".digest))";
}

// A release must tell the next acquirer that this lease ended by a release, not by its
// session dying (then the row keeps others out until the holder's deadline). Clearing
// the row's owner says it durably but costs a redo-log flush; recording the row's token
// in distlock_released (a MEMORY table) costs none. A restart empties that table, so a
// release it forgets only makes the next holder wait out the released lease's TTL, as
// if its session had died. The row is checked to be this owner's on this session in the
// same statement; the named lock is given up after it, in the same batch.
bool MysqlBackend::release_on(Lease& l, Exec& e, bool lost) {
  const std::string where = " WHERE digest = " + digest_sql(l.name) + " AND name = " + hex_literal(l.name) +
                            " AND owner = " + hex_literal(l.owner) + " AND conn_id = CONNECTION_ID()" +
                            (lost && has_delay_column_.load() ? " AND IFNULL(delay_ms, 0) = 0" : "");
  const std::string unlock = "; SELECT RELEASE_LOCK(" + lock_name_sql(l.name) + ")";
  auto done = [&] {
    return e.ok() && e.affected >= 1 && e.rows.size() == 1 && e.rows[0].size() == 1 && e.rows[0][0] == "1";
  };
  if (fast_release_) {
    e = my::run(l.conn.get(), "INSERT INTO " + cfg_.released_table +
                                  " (digest, token) SELECT digest, token FROM " + cfg_.locks_table + where +
                                  " ON DUPLICATE KEY UPDATE token = VALUES(token)" + unlock);
    // An SQL error (the MEMORY table full, say) left the named lock held: release durably.
    if (e.ok() || e.io_failed) return done();
  }
  e = my::run(l.conn.get(),
              "UPDATE " + cfg_.locks_table + " SET owner = NULL, conn_id = NULL" + where + unlock);
  return done();
}

ReleaseStatus MysqlBackend::release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                                    Error& ec) {
  ec.clear();
  auto l = find_lease(name, owner);
  if (!l) return ReleaseStatus::not_owner;
  LockGuard lk(l->mu);
  if (!l->conn) return ReleaseStatus::not_owner;
  Exec e;
  const bool ours = release_on(*l, e);
  if (e.io_failed) {
    // The session ends with the connection (or has ended already: the server freed
    // the lock when it did, perhaps long before this release, and somebody else may
    // hold it by now). Either way this lease is lost, not released. No code: the
    // engine counts not_owner as a loss and says so, with this cause.
    ec.set_detail(failure("release \"" + printable(name) + "\"", e.error));
    l->conn.reset();
    drop_lease(l);
    return ReleaseStatus::not_owner;
  }
  if (!e.ok()) {
    ec = my::code_of(e);
    ec.set_detail(failure("release \"" + printable(name) + "\"", e.error));
    return ReleaseStatus::released;
  }
  ok();
  drop_lease(l);
  if (ours) {
    give_back(std::move(l->conn), l->validity);
  } else {
    l->conn.reset();  // whatever it held goes with the session
  }
  return ours ? ReleaseStatus::released : ReleaseStatus::not_owner;
}

// The engine declared the lease lost while this client lives: clear its row (unless it
// has a lock-delay: then the row keeps others out until seen_at + ttl + delay) and give
// up its named lock now, rather than at the server's wait_timeout. Closing the session
// ends the named lock even if the statement fails.
void MysqlBackend::forget(std::string_view name, std::string_view owner, std::uint64_t /*token*/) noexcept {
  try {
    auto l = find_lease(name, owner);
    if (!l) return;
    drop_lease(l);
    LockGuard lk(l->mu);
    if (!l->conn) return;
    Exec e;
    if (release_on(*l, e, /*lost=*/true)) {
      give_back(std::move(l->conn), l->validity);
    } else {
      l->conn.reset();
    }
  } catch (...) {  // best effort: the server's wait_timeout stays the bound
  }
}

LockInfo MysqlBackend::status(std::string_view name, Error& ec) {
  ec.clear();
  Exec e = shared("SELECT token, IF(" + released_sql("l") + ", NULL, owner), ttl_ms, IS_USED_LOCK(" +
                      lock_name_sql(name) + ") <=> conn_id, " + kLeftMs + " FROM " + cfg_.locks_table +
                      " AS l WHERE digest = " + digest_sql(name) + " AND name = " + hex_literal(name),
                  "status", ec);
  if (ec) return {};
  LockInfo info;
  if (e.rows.size() == 1 && e.rows[0].size() == 5) {
    const auto& r = e.rows[0];
    bool good = false;
    const std::uint64_t token = to_u64(r[0], good);
    if (good) info.token = token;
    const bool session_holds = r[3].value_or("0") == "1";
    const long long left = to_i64(r[4]);
    // Held: the owner's session holds the named lock, or it ended without a release
    // less than its TTL after its last renewal (nobody else gets it yet).
    info.held = r[1].has_value() && (session_holds || left > 0);
    if (info.held) {
      info.holder = *r[1];
      info.ttl_remaining = Millis(std::max<long long>(session_holds ? 1 : 0, left));
    }
  }
  return info;
}

}  // namespace mysql

Error mysql_config(const Url& url, const ClientOptions& opts, my::Config& cfg) {
  cfg.shown = url.redacted();
  const std::string shown = "\"" + cfg.shown + "\"";
  auto bad = [](std::string msg) { return Error(make_error_code(errc::invalid_url), std::move(msg)); };
  if (url.hosts.empty() || url.hosts[0].host.empty()) {
    return bad("URL " + shown + " names no host (expected mysql://user:password@host:port/database)");
  }
  if (url.hosts.size() > 1) {
    return bad("URL " + shown + " names " + std::to_string(url.hosts.size()) +
               " hosts; mysql:// takes one server (named locks live on one primary)");
  }
  std::string db = url.path;
  if (!db.empty() && db[0] == '/') db.erase(0, 1);
  if (db.empty()) {
    return bad(
        "URL " + shown +
        " names no database (expected mysql://host:port/database): the lock table lives in it, so every "
        "client of a lock must name the same one");
  }
  if (db.find('/') != std::string::npos || db.size() > 64) {
    return bad(
        "database \"" + db + "\" in URL " + shown +
        " is not a database name (at most 64 characters, no '/'; expected mysql://host:port/database)");
  }
  cfg.host = url.hosts[0].host;
  cfg.port = url.hosts[0].port != 0 ? url.hosts[0].port : 3306;
  cfg.user = url.user;
  cfg.password = url.password;
  cfg.database = db;
  cfg.locks_table = my::quote_ident(db) + ".`distlock_locks`";
  cfg.records_table = my::quote_ident(db) + ".`distlock_records`";
  cfg.released_table = my::quote_ident(db) + ".`distlock_released`";
  cfg.connect_timeout = opts.connect_timeout;
  cfg.command_timeout = opts.command_timeout;
  return {};
}

std::unique_ptr<Backend> make_mysql_backend(const Url& url, const ClientOptions& opts, Error& err) {
  mysql::Config cfg;
  if ((err = mysql_config(url, opts, cfg))) return nullptr;
  auto backend = std::make_unique<mysql::MysqlBackend>(std::move(cfg), opts);
  if ((err = backend->connect_now())) return nullptr;
  return backend;
}

}  // namespace distlock::detail
