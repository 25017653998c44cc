// libpq plumbing for the postgres:// backend: connections opened with the lease's
// session timeout, and statements bounded by a timeout (libpq's synchronous calls
// would wait for ever on a frozen peer). Error mapping to the distlock category.
#pragma once

#include <libpq-fe.h>

#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "distlock/options.hpp"
#include "engine/backend_error.hpp"
#include "engine/url.hpp"

namespace distlock::detail::pg {

struct ResultDeleter {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

struct ConnDeleter {
  void operator()(PGconn* c) const noexcept { PQfinish(c); }
};
using Conn = std::unique_ptr<PGconn, ConnDeleter>;

struct Config {
  std::string host, port, user, password, dbname, sslmode;
  std::string shown;  // the URL, password masked
  Url url;            // for scrub_secrets() over libpq's and the server's messages
  Millis connect_timeout{}, command_timeout{};
};

// What a statement did: ok with a result, an SQL error (the connection is fine) or
// a connection failure (the session is gone or cannot be trusted any more).
struct Exec {
  Result res;
  bool io_failed = false;
  // io_failed because no answer came within the timeout (no evidence the session ended).
  bool timed_out = false;
  std::string error;
  std::string sqlstate;
  bool ok() const { return res != nullptr && error.empty(); }
};

/// libpq's last message on one line.
std::string pq_message(const PGconn* c);
/// Lowercase hex of `bytes`: how names and values travel as text parameters
/// (decoded with decode($n, 'hex') in SQL), so any byte is safe.
std::string to_hex(std::string_view bytes);

/// One statement with text parameters, bounded by `timeout`.
Exec run(PGconn* c, const char* sql, const std::vector<std::string>& params, Millis timeout);

/// backend_unavailable (connection), auth_failed (SQLSTATE 28xxx, 42501), backend_unavailable
/// (08xxx, 57xxx, 53xxx), else protocol_error.
std::error_code code_of(const Exec& e);

/// Whether the session of `c` runs with the settings open() asked for in its startup
/// options: idle_session_timeout and idle_in_transaction_session_timeout = `idle_timeout`
/// (ms), synchronous_commit = on. A connection pooler in transaction mode (PgBouncer)
/// may drop startup options, and a lease session without its idle timeout would keep a
/// dead holder's lock for ever. Read from pg_settings (the values SHOW gives). Empty
/// when they took effect; else the sentence saying which did not, and `ec`
/// not_supported (or the statement's error code when they could not be read).
std::string check_session(PGconn* c, Millis idle_timeout, Millis timeout, std::error_code& ec);

/// Opens a connection named `role` (application_name) whose server session ends after
/// `idle_timeout` without a statement (0: never), checked (check_session) before it is
/// returned. On failure returns null and `err`: auth_failed / backend_unavailable /
/// invalid_argument / not_supported, its detail naming the server and the cause (every
/// secret of the URL masked: the server may echo a role or database that was part of it).
Conn open(const Config& cfg, Millis idle_timeout, const char* role, Error& err);

}  // namespace distlock::detail::pg
