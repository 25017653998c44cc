// Records and the listing of held locks for the mysql:// backend.
//
// Records are rows of `database`.`distlock_records` (digest BINARY(32) PRIMARY KEY =
// SHA-256 of the key, k, value), created beside the lock table; a record and a lock of
// one name are rows of different tables, so they never collide, and nothing expires
// them. Each call is one batch on the client's shared connection: PutMode::always is an
// upsert and PutMode::if_absent an INSERT IGNORE, each followed in the same transaction
// by a read of the row it wrote or found (the row is locked by then, so the answer is
// what is stored after the call). PutMode::fenced is a compare-and-set loop
// (engine/backend.hpp fenced_put_by_cas): a read, then that insert or an
// UPDATE ... WHERE value = <the value read>. A digest collision (same digest, another key) is an
// error naming it, never a shared row.
//
// The listing reads the lock table and says of each name what status() says (held =
// the row names an owner and the row's session holds the named lock, or that lease's
// seen_at + ttl_ms has not passed).
#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "mysql/mysql_backend_impl.hpp"

namespace distlock::detail::mysql {

using my::digest_sql;
using my::hex_literal;

namespace {

// Reads (key matches, value) of a one-row answer into `value`; false with ec on a
// malformed answer or another key's row.
bool take_row(const Exec& e, std::string_view key, std::string& value, Error& ec) {
  if (e.rows.size() != 1 || e.rows[0].size() != 2 || !e.rows[0][1]) {
    ec.fail(errc::protocol_error, "unexpected answer to a record statement");
    return false;
  }
  if (e.rows[0][0].value_or("0") != "1") {
    ec.fail(errc::protocol_error, "the record row of \"" + MysqlBackend::printable(key) +
                                      "\" belongs to another key (a SHA-256 collision?)");
    return false;
  }
  value = *e.rows[0][1];
  return true;
}

}  // namespace

std::string MysqlBackend::put_record(std::string_view key, std::string_view value, PutMode mode, Error& ec) {
  ec.clear();
  if (!record_value_fits(key, value, ec)) return {};
  const std::string D = digest_sql(key), K = hex_literal(key), V = hex_literal(value), R = cfg_.records_table;
  if (mode == PutMode::fenced) {
    // A compare-and-set loop: the UPDATE replaces the row only while it holds the value read.
    const auto replace = [&](std::string_view expected, Error& e) {
      Exec x = shared("UPDATE " + R + " SET value = " + V + " WHERE digest = " + D + " AND k = " + K +
                          " AND value = " + hex_literal(expected),
                      "put record", e);
      return !e && x.affected == 1;
    };
    return fenced_put_by_cas(
        key, value, [&](Error& e) { return get_record(key, e); },
        [&](Error& e) { return put_record(key, value, PutMode::if_absent, e); }, replace, ec);
  }
  const std::string write =
      mode == PutMode::always
          ? "INSERT INTO " + R + " (digest, k, value) VALUES (" + D + ", " + K + ", " + V +
                ") ON DUPLICATE KEY UPDATE value = IF(k = VALUES(k), VALUES(value), value)"
          : "INSERT IGNORE INTO " + R + " (digest, k, value) VALUES (" + D + ", " + K + ", " + V + ")";
  Exec e = shared("START TRANSACTION; " + write + "; SELECT k = " + K + ", value FROM " + R +
                      " WHERE digest = " + D + " LOCK IN SHARE MODE; COMMIT",
                  "put record", ec);
  if (ec) return {};
  std::string stored;
  if (!take_row(e, key, stored, ec)) return {};
  return stored;
}

std::optional<std::string> MysqlBackend::get_record(std::string_view key, Error& ec) {
  ec.clear();
  Exec e = shared("SELECT k = " + hex_literal(key) + ", value FROM " + cfg_.records_table +
                      " WHERE digest = " + digest_sql(key),
                  "get record", ec);
  if (ec) return std::nullopt;
  if (e.rows.empty()) return std::nullopt;
  std::string stored;
  if (!take_row(e, key, stored, ec)) return std::nullopt;
  return stored;
}

bool MysqlBackend::erase_record(std::string_view key, Error& ec) {
  ec.clear();
  Exec e = shared("DELETE FROM " + cfg_.records_table + " WHERE digest = " + digest_sql(key) +
                      " AND k = " + hex_literal(key),
                  "erase record", ec);
  if (ec) return false;
  return e.affected > 0;
}

std::vector<ListedLock> MysqlBackend::list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                                Error& ec) {
  ec.clear();
  truncated = false;
  const std::string P = hex_literal(prefix);
  const std::string lim = std::to_string(std::min<std::size_t>(limit, 1u << 30) + 1);
  Exec e = shared(
      "SELECT name, token, owner, holds, left_ms FROM (SELECT name, token, owner, IS_USED_LOCK(lock_name) "
      "<=> "
      "conn_id AS holds, CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), seen_at + INTERVAL ttl_ms * 1000 "
      "MICROSECOND) / 1000) AS left_ms FROM " +
          cfg_.locks_table + " AS t WHERE owner IS NOT NULL AND NOT " + released_sql("t") +
          " AND LEFT(name, LENGTH(" + P + ")) = " + P +
          ") AS l WHERE holds = 1 OR left_ms > 0 ORDER BY name LIMIT " + lim,
      "list", ec);
  if (ec) return {};
  std::vector<ListedLock> out;
  for (const auto& r : e.rows) {
    if (r.size() != 5 || !r[0] || !r[2]) continue;
    if (out.size() == limit) {
      truncated = true;
      break;
    }
    ListedLock l;
    l.name = *r[0];
    l.info.held = true;
    l.info.holder = *r[2];
    std::uint64_t token = 0;
    if (r[1] && std::from_chars(r[1]->data(), r[1]->data() + r[1]->size(), token).ec == std::errc{}) {
      l.info.token = token;
    }
    const long long left = r[4] ? static_cast<long long>(std::strtod(r[4]->c_str(), nullptr)) : 0;
    l.info.ttl_remaining = Millis(std::max<long long>(r[3].value_or("0") == "1" ? 1 : 0, left));
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace distlock::detail::mysql
