// The PostgreSQL backend's lock key, its setup (connect, the table), status, the
// shared connection for status and records, and the factory.
#include "postgres/postgres_backend.hpp"

#include "postgres/postgres_backend_impl.hpp"

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

namespace postgres {

namespace {

// Created once per database, in the schema public whatever the user (schema-qualified
// everywhere: with the default search_path "$user", public, two users that each own a
// schema of their name would otherwise get two token tables over one advisory lock),
// under a transaction-level advisory lock of the two-int key space, which never meets
// the bigint keys of lock names, so that many clients starting at once create or
// migrate it once. The client that creates it takes over the largest token of each
// name from every older distlock_locks of another schema it may read (tables such
// users made before the names were qualified), so tokens never go back. The primary
// key is the name's SHA-256 (a B-tree entry holds at most about 2.7 kB; a name may
// have 4096 bytes); the name itself is stored, unindexed, and compared. The records
// table (postgres_records.hpp) is created beside it. A table of an older layout (name
// as primary key, no seen_at) is migrated in place, its tokens kept; one without
// delay_ms gets the column (null: no lock-delay).
// The fast path (the table is there in this layout) needs no CREATE privilege.
constexpr const char* kSetupSql =
    "BEGIN; SELECT pg_advisory_xact_lock(1684632419, 1);"
    "DO $distlock$ DECLARE pk name; sch name; BEGIN"
    " IF to_regclass('public.distlock_locks') IS NULL THEN"
    "  CREATE TABLE public.distlock_locks (digest bytea PRIMARY KEY, name bytea NOT NULL,"
    "   token bigint NOT NULL, owner text, pid integer, ttl_ms bigint, seen_at timestamptz, delay_ms bigint);"
    "  FOR sch IN SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    "   WHERE c.relname = 'distlock_locks' AND c.relkind = 'r' AND n.nspname <> 'public' LOOP BEGIN"
    "   EXECUTE format('INSERT INTO public.distlock_locks AS d (digest, name, token)"
    " SELECT sha256(name), name, max(token) FROM %I.distlock_locks GROUP BY name"
    " ON CONFLICT (digest) DO UPDATE SET token = greatest(d.token, EXCLUDED.token)', sch);"
    "   EXCEPTION WHEN insufficient_privilege THEN NULL; END; END LOOP;"
    " ELSIF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'public.distlock_locks'::regclass"
    "   AND attname = 'seen_at' AND NOT attisdropped) THEN"
    "  ALTER TABLE public.distlock_locks ADD COLUMN digest bytea, ADD COLUMN seen_at timestamptz;"
    "  UPDATE public.distlock_locks SET digest = sha256(name),"
    "   seen_at = CASE WHEN owner IS NOT NULL THEN clock_timestamp() END;"
    "  SELECT conname INTO pk FROM pg_constraint"
    "   WHERE conrelid = 'public.distlock_locks'::regclass AND contype = 'p';"
    "  IF pk IS NOT NULL THEN"
    "   EXECUTE format('ALTER TABLE public.distlock_locks DROP CONSTRAINT %I', pk);"
    "  END IF;"
    "  ALTER TABLE public.distlock_locks ALTER COLUMN digest SET NOT NULL, ADD PRIMARY KEY (digest);"
    " END IF;"
    // The holder's lock-delay (docs/design.md "Lock-delay"), added to a table made before it.
    // A role that may not alter the table still connects and locks, without lock-delay
    // (connect_now reads whether the column is there).
    " IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'public.distlock_locks'::regclass"
    "   AND attname = 'delay_ms' AND NOT attisdropped) THEN BEGIN"
    "  ALTER TABLE public.distlock_locks ADD COLUMN delay_ms bigint;"
    "  EXCEPTION WHEN insufficient_privilege THEN NULL; END;"
    " END IF;"
    // Records (postgres_records.cpp), keyed like the lock rows. A user that may not
    // create it (the lock table made by an administrator) still locks; its record
    // calls then fail naming the missing table.
    " IF to_regclass('public.distlock_records') IS NULL THEN BEGIN"
    "  CREATE TABLE public.distlock_records (digest bytea PRIMARY KEY, key bytea NOT NULL,"
    "   value bytea NOT NULL);"
    "  EXCEPTION WHEN insufficient_privilege THEN NULL; END;"
    " END IF; END $distlock$; COMMIT";

// $1 name (hex), $2 high 32 bits of the key, $3 low 32 bits (pg_locks shows a bigint
// key as classid/objid with objsubid 1). Columns: token, owner, ttl ms, whether the
// owner's session holds the advisory lock, ms left of the lease since its last renewal
// (lease_left; for an orphaned lease, > 0: its session ended without a release and its
// holder may still believe it holds it).
constexpr const char* kStatusSql =
    "SELECT d.token, d.owner, d.ttl_ms, EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory'"
    " AND l.granted AND l.pid = d.pid AND l.objsubid = 1 AND l.classid = $2::bigint::oid"
    " AND l.objid = $3::bigint::oid),"
    " coalesce(ceil(1000 * extract(epoch FROM d.seen_at + d.ttl_ms * interval '1 millisecond'"
    " - clock_timestamp())), 0)::bigint"
    " FROM public.distlock_locks d WHERE d.digest = sha256(decode($1, 'hex')) AND d.name = decode($1, 'hex')";

}  // namespace

// Connects once (bad credentials, a down server or a missing database fail at
// connect()), creates the table if needed and starts listening.
Error PostgresBackend::connect_now() {
  {
    LockGuard lk(aux_mu_);
    Error err;
    aux_ = open(cfg_, Millis(0), "distlock", err);
    if (err) return err;
    Exec e;
    Result r(PQexec(aux_.get(), kSetupSql));
    if (!r || PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
      const std::string m = r ? PQresultErrorMessage(r.get()) : pq_message(aux_.get());
      const char* st = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
      e.sqlstate = st ? st : "";
      e.io_failed = PQstatus(aux_.get()) != CONNECTION_OK;
      std::string why = cfg_.shown + ": cannot create the table public.distlock_locks: " + m;
      while (!why.empty() && why.back() == '\n') why.pop_back();
      return {code_of(e), std::move(why)};
    }
  }
  {
    // Whether the table has the lock-delay column (a role that may not add it to an older
    // table locks without it: Capabilities::lock_delay false, the SQL of before).
    LockGuard lk(aux_mu_);
    Result r(PQexec(aux_.get(),
                    "SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.distlock_locks'::regclass"
                    " AND attname = 'delay_ms' AND NOT attisdropped"));
    if (!r || PQresultStatus(r.get()) != PGRES_TUPLES_OK || PQntuples(r.get()) != 1) {
      const std::string m = r ? PQresultErrorMessage(r.get()) : pq_message(aux_.get());
      std::string why = cfg_.shown + ": cannot read the columns of public.distlock_locks: " + m;
      while (!why.empty() && why.back() == '\n') why.pop_back();
      return {make_error_code(errc::backend_unavailable), std::move(why)};
    }
    has_delay_column_.store(std::string_view(PQgetvalue(r.get(), 0, 0)) == "1");
  }
  if (Error err = listen_now()) return err;
  listener_.start([this] { listen_loop(); });
  return {};
}

LockInfo PostgresBackend::status(std::string_view name, Error& ec) {
  ec.clear();
  const std::int64_t key = postgres_lock_key(name);
  const auto ukey = static_cast<std::uint64_t>(key);
  LockGuard lk(aux_mu_);
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!aux_ || PQstatus(aux_.get()) != CONNECTION_OK) {
      aux_ = open(cfg_, Millis(0), "distlock", ec);
      if (ec) {
        ec.set_detail(failure("status", ec.detail()));
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
      ec.set_detail(failure("status", e.error));
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
        info.ttl_remaining = pg::lease_left(
            session_holds, Millis(std::strtoll(PQgetvalue(r, 0, 2), nullptr, 10)), Millis(orphan_left));
      }
    }
    return info;
  }
  return {};
}

// One statement on the shared connection (aux_), reconnecting it once when it
// failed; on failure `ec` and the error detail (naming the server) are set.
pg::Runner PostgresBackend::runner() {
  return [this](const char* sql, const std::vector<std::string>& params, const char* what, Error& ec) {
    LockGuard lk(aux_mu_);
    Exec e;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!aux_ || PQstatus(aux_.get()) != CONNECTION_OK) {
        aux_ = open(cfg_, Millis(0), "distlock", ec);
        if (ec) {
          failure(what, ec.detail());
          ec.set_detail(ec.detail() + " (" + what + ")");
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
      ec.set_detail(std::move(detail));
      return Exec{};
    }
    ok();
    return e;
  };
}

}  // namespace postgres

Error postgres_config(const Url& url, const ClientOptions& opts, pg::Config& cfg) {
  cfg.shown = url.redacted();
  cfg.url = url;
  const std::string shown = "\"" + cfg.shown + "\"";
  auto bad = [](std::string msg) { return Error(make_error_code(errc::invalid_url), std::move(msg)); };
  if (url.hosts.empty() || url.hosts[0].host.empty()) {
    return bad("URL " + shown + " names no host (expected postgres://user:password@host:port/database)");
  }
  if (url.hosts.size() > 1) {
    return bad("URL " + shown + " names " + std::to_string(url.hosts.size()) +
               " hosts; postgres:// takes one server (advisory locks live on one primary)");
  }
  // sslmode= was checked against this folder's scheme entry (postgres_scheme.cpp).
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
  return {};
}

std::unique_ptr<Backend> make_postgres_backend(const Url& url, const ClientOptions& opts, Error& err) {
  postgres::Config cfg;
  if ((err = postgres_config(url, opts, cfg))) return nullptr;
  auto backend = std::make_unique<postgres::PostgresBackend>(std::move(cfg), opts);
  if ((err = backend->connect_now())) return nullptr;
  return backend;
}

}  // namespace distlock::detail
