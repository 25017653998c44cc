#include "postgres/postgres_records.hpp"

#include <libpq-fe.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>

#include "postgres/postgres_backend.hpp"

namespace distlock::detail::pg {

namespace {

// $1 key (hex), $2 value (hex). A digest collision (same digest, another key) updates
// nothing and returns no row.
constexpr const char* kPutAlwaysSql =
    "INSERT INTO public.distlock_records AS r (digest, key, value)"
    " VALUES (sha256(decode($1, 'hex')), decode($1, 'hex'), decode($2, 'hex'))"
    " ON CONFLICT (digest) DO UPDATE SET value = EXCLUDED.value WHERE r.key = EXCLUDED.key"
    " RETURNING encode(r.value, 'hex')";

// $1 key (hex), $2 value (hex). Columns: the row's key is $1, its value (hex). The row
// inserted, or the one that was there when it is visible to this statement's snapshot;
// no row when a concurrent writer committed it after that (or it was erased): the
// caller asks again, and a new statement sees it.
constexpr const char* kPutIfAbsentSql =
    "WITH i AS (INSERT INTO public.distlock_records (digest, key, value)"
    " VALUES (sha256(decode($1, 'hex')), decode($1, 'hex'), decode($2, 'hex'))"
    " ON CONFLICT (digest) DO NOTHING RETURNING value)"
    " SELECT true, encode(value, 'hex') FROM i"
    " UNION ALL SELECT r.key = decode($1, 'hex'), encode(r.value, 'hex') FROM public.distlock_records r"
    " WHERE r.digest = sha256(decode($1, 'hex')) AND NOT EXISTS (SELECT 1 FROM i)";

// $1 key (hex), $2 value (hex), $3 the value expected (hex): the compare-and-set of
// PutMode::fenced. One row when replaced (a concurrent update is waited for, and the
// condition checked again on the row it left, under READ COMMITTED).
constexpr const char* kReplaceSql =
    "UPDATE public.distlock_records SET value = decode($2, 'hex')"
    " WHERE digest = sha256(decode($1, 'hex')) AND key = decode($1, 'hex') AND value = decode($3, 'hex')"
    " RETURNING 1";

constexpr const char* kGetSql =
    "SELECT r.key = decode($1, 'hex'), encode(r.value, 'hex') FROM public.distlock_records r"
    " WHERE r.digest = sha256(decode($1, 'hex'))";

constexpr const char* kEraseSql =
    "DELETE FROM public.distlock_records WHERE digest = sha256(decode($1, 'hex')) AND key = decode($1, 'hex')"
    " RETURNING 1";

// $1 prefix (hex). Rows naming an owner whose session is alive (it holds some advisory
// lock) or whose lease has time left; the caller checks the session holds the name's
// key, as status() does. Columns: name (hex), token, owner, ttl_ms, the advisory keys
// the row's session holds (comma-separated), ms left of the lease since seen_at.
constexpr const char* kListSql =
    "WITH l AS MATERIALIZED (SELECT pid, string_agg(((classid::bigint << 32) | objid::bigint)::text, ',') AS "
    "keys"
    " FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 GROUP BY pid)"
    " SELECT encode(d.name, 'hex'), d.token, d.owner, d.ttl_ms, coalesce(l.keys, ''),"
    " coalesce(ceil(1000 * extract(epoch FROM d.seen_at + d.ttl_ms * interval '1 millisecond'"
    " - clock_timestamp())), 0)::bigint"
    " FROM public.distlock_locks d LEFT JOIN l ON l.pid = d.pid"
    " WHERE d.owner IS NOT NULL AND substr(d.name, 1, length(decode($1, 'hex'))) = decode($1, 'hex')"
    " AND (l.pid IS NOT NULL OR d.seen_at + d.ttl_ms * interval '1 millisecond' > clock_timestamp())"
    " ORDER BY d.name";

int nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool from_hex(std::string_view hex, std::string& out) {
  if (hex.size() % 2) return false;
  out.clear();
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

std::string printable(std::string_view key) {
  std::string out;
  for (char c : key.substr(0, 64)) out.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
  if (key.size() > 64) out += "...";
  return out;
}

void protocol(Error& ec, const std::string& detail) {
  ec = make_error_code(errc::protocol_error);
  ec.set_detail(detail);
}

// Reads (key matches, value hex) of a one-row answer into `value`; false with ec on a
// malformed answer or another key's row.
bool take_row(PGresult* r, std::string_view key, std::string& value, Error& ec) {
  if (PQnfields(r) != 2) {
    protocol(ec, "unexpected answer to a record statement");
    return false;
  }
  if (std::string_view(PQgetvalue(r, 0, 0)) != "t") {
    protocol(ec,
             "the record row of \"" + printable(key) + "\" belongs to another key (a SHA-256 collision?)");
    return false;
  }
  if (!from_hex(PQgetvalue(r, 0, 1), value)) {
    protocol(ec, "the record value of \"" + printable(key) + "\" came back malformed");
    return false;
  }
  return true;
}

}  // namespace

std::string put_record(const Runner& run, std::string_view key, std::string_view value, PutMode mode,
                       Error& ec) {
  ec.clear();
  if (!record_value_fits(key, value, ec)) return {};
  const std::vector<std::string> params{to_hex(key), to_hex(value)};
  if (mode == PutMode::fenced) {
    const auto replace = [&](std::string_view expected, Error& e) {
      Exec x = run(kReplaceSql, {params[0], params[1], to_hex(expected)}, "put record", e);
      return !e && PQntuples(x.res.get()) == 1;
    };
    return fenced_put_by_cas(
        key, value, [&](Error& e) { return get_record(run, key, e); },
        [&](Error& e) { return put_record(run, key, value, PutMode::if_absent, e); }, replace, ec);
  }
  if (mode == PutMode::always) {
    Exec e = run(kPutAlwaysSql, params, "put record", ec);
    if (ec) return {};
    std::string stored;
    if (PQntuples(e.res.get()) != 1) {
      protocol(ec,
               "the record row of \"" + printable(key) + "\" belongs to another key (a SHA-256 collision?)");
      return {};
    }
    if (!from_hex(PQgetvalue(e.res.get(), 0, 0), stored)) {
      protocol(ec, "the record value of \"" + printable(key) + "\" came back malformed");
      return {};
    }
    return stored;
  }
  // A row committed by a concurrent writer after our statement's snapshot conflicts
  // with our insert but is not visible to it: the next statement sees it. Between two
  // attempts it can only be erased again, so a few attempts are plenty.
  for (int attempt = 0; attempt < 8; ++attempt) {
    Exec e = run(kPutIfAbsentSql, params, "put record", ec);
    if (ec) return {};
    if (PQntuples(e.res.get()) == 0) continue;
    std::string stored;
    if (!take_row(e.res.get(), key, stored, ec)) return {};
    return stored;
  }
  ec = make_error_code(errc::backend_unavailable);
  ec.set_detail("the record \"" + printable(key) + "\" keeps being created and erased while we write it");
  return {};
}

std::optional<std::string> get_record(const Runner& run, std::string_view key, Error& ec) {
  ec.clear();
  Exec e = run(kGetSql, {to_hex(key)}, "get record", ec);
  if (ec) return std::nullopt;
  if (PQntuples(e.res.get()) == 0) return std::nullopt;
  std::string value;
  if (!take_row(e.res.get(), key, value, ec)) return std::nullopt;
  return value;
}

bool erase_record(const Runner& run, std::string_view key, Error& ec) {
  ec.clear();
  Exec e = run(kEraseSql, {to_hex(key)}, "erase record", ec);
  if (ec) return false;
  return PQntuples(e.res.get()) > 0;
}

std::vector<ListedLock> list_held(const Runner& run, std::string_view prefix, std::size_t limit,
                                  bool& truncated, Error& ec) {
  ec.clear();
  truncated = false;
  Exec e = run(kListSql, {to_hex(prefix)}, "list held locks", ec);
  if (ec) return {};
  PGresult* r = e.res.get();
  if (PQnfields(r) != 6) {
    protocol(ec, "unexpected answer to the listing of held locks");
    return {};
  }
  std::vector<ListedLock> out;
  for (int i = 0; i < PQntuples(r); ++i) {
    ListedLock l;
    if (!from_hex(PQgetvalue(r, i, 0), l.name)) {
      protocol(ec, "a lock name came back malformed from the listing");
      return {};
    }
    // The session holds the name's advisory key (status(): session_holds).
    const std::string want = std::to_string(postgres_lock_key(l.name));
    bool session_holds = false;
    std::string_view keys = PQgetvalue(r, i, 4);
    while (!keys.empty() && !session_holds) {
      const auto comma = keys.find(',');
      session_holds = keys.substr(0, comma) == want;
      keys = comma == std::string_view::npos ? std::string_view() : keys.substr(comma + 1);
    }
    const long long left = std::strtoll(PQgetvalue(r, i, 5), nullptr, 10);
    if (!session_holds && left <= 0) continue;  // its session ended and its lease is over: free
    if (out.size() == limit) {
      truncated = true;
      break;
    }
    l.info.held = true;
    l.info.token = std::strtoull(PQgetvalue(r, i, 1), nullptr, 10);
    l.info.holder = std::string(PQgetvalue(r, i, 2));
    l.info.ttl_remaining =
        lease_left(session_holds, Millis(std::strtoll(PQgetvalue(r, i, 3), nullptr, 10)), Millis(left));
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace distlock::detail::pg
