// libmariadb plumbing for the mysql:// backend: connections with bounded connect,
// read and write timeouts (the client library's synchronous calls would otherwise wait
// for ever on a frozen peer), statements in the text protocol whose every value is a
// hex literal or a number built here (no user text is ever spliced into SQL), and the
// mapping of server and client errors to the distlock category.
#pragma once

#include <mysql.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "distlock/options.hpp"
#include "engine/backend_error.hpp"

namespace distlock::detail::my {

struct ConnDeleter {
  void operator()(MYSQL* c) const noexcept { mysql_close(c); }
};
using Conn = std::unique_ptr<MYSQL, ConnDeleter>;

struct Config {
  std::string host, user, password, database;
  unsigned port = 3306;
  std::string shown;  // the URL, password masked
  // `database`.`distlock_locks` etc., schema-qualified
  std::string locks_table, records_table, released_table;
  Millis connect_timeout{}, command_timeout{};
};

using Row = std::vector<std::optional<std::string>>;

// What a batch of statements did: the rows of its last result set, or an SQL error
// (the connection is fine), or a connection failure (the session is gone or cannot be
// trusted any more).
struct Exec {
  std::vector<Row> rows;
  unsigned long long affected = 0;  // of the last statement without a result set
  bool io_failed = false;
  unsigned errnum = 0;
  std::string error;
  bool ok() const { return error.empty() && !io_failed; }
};

/// Lowercase hex of `bytes`.
std::string to_hex(std::string_view bytes);
/// X'..' — a binary string literal of any bytes (X'' for none).
std::string hex_literal(std::string_view bytes);
/// `ident` with backticks doubled, in backticks.
std::string quote_ident(std::string_view ident);

/// The server's named lock (GET_LOCK) for a lock name, as an SQL expression: the name
/// itself in quotes when it is at most 64 bytes of lowercase-safe printable ASCII
/// (letters a-z, digits and -_.:/@+=,~ not starting with '#'), else '#' and the first
/// 63 hex digits of its SHA-256, computed by the server. Both MySQL (64 characters at
/// most, case-insensitive on some versions) and MariaDB then see distinct names for
/// distinct lock names; a 252-bit digest makes a collision out of reach.
std::string lock_name_sql(std::string_view name);
/// The row key of a name: UNHEX(SHA2(X'..', 256)).
std::string digest_sql(std::string_view name);

/// A batch of statements (';'-separated) on `c`.
Exec run(MYSQL* c, const std::string& sql);
/// Sends the batch without waiting for the answer (read it with finish()).
bool send(MYSQL* c, const std::string& sql, Exec& out);
/// Reads the answer of a batch sent with send().
Exec finish(MYSQL* c);

/// backend_unavailable (connection, shutdown, killed), auth_failed (access denied),
/// invalid_argument (unknown database), else protocol_error.
std::error_code code_of(const Exec& e);
/// True for errors after which the session cannot be trusted (lost, killed, shut down).
bool is_connection_error(unsigned errnum);

/// Opens a connection (multi-statements on; affected rows count matched rows). On
/// failure returns null and `err` (auth_failed / backend_unavailable / invalid_argument),
/// its detail naming the server and the cause (password masked).
Conn open(const Config& cfg, Error& err);

}  // namespace distlock::detail::my
