#include "postgres/pg_conn.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "distlock/error.hpp"

namespace distlock::detail::pg {

namespace {

using Clock = std::chrono::steady_clock;

void discard_notice(void*, const char*) {}

// PQconnectdbParams with a deadline of `timeout` (milliseconds, on the steady clock) over
// the whole startup: TCP connect, TLS, authentication, the server's first answer. libpq's
// own connect_timeout is whole seconds, at least 2, so a `timeout=500ms` waited 2 s on a
// server that accepts the TCP connection and never answers (a hung server). Sets
// `timed_out` when the deadline passed first (the connection is then not usable).
PGconn* connect_within(const char* const* keys, const char* const* vals, Millis timeout, bool& timed_out) {
  timed_out = false;
  PGconn* c = PQconnectStartParams(keys, vals, 0);
  if (c == nullptr || PQstatus(c) == CONNECTION_BAD) return c;
  const auto end = Clock::now() + timeout;
  // Before the first PQconnectPoll, wait as if it had returned PGRES_POLLING_WRITING.
  PostgresPollingStatusType st = PGRES_POLLING_WRITING;
  while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
    const auto left = std::chrono::ceil<Millis>(end - Clock::now());
    if (left <= Millis::zero()) {
      timed_out = true;
      return c;
    }
    pollfd p{PQsocket(c), static_cast<short>(st == PGRES_POLLING_READING ? POLLIN : POLLOUT), 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));  // at most 1 h (ClientOptions::validate)
    if (r < 0 && errno != EINTR) return c;  // PQstatus is not CONNECTION_OK: reported as a failure
    if (r > 0) st = PQconnectPoll(c);
  }
  return c;
}

}  // namespace

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

// libpq's message without the trailing newline and its "FATAL:  " prefixes kept.
std::string pq_message(const PGconn* c) {
  std::string m = c ? PQerrorMessage(c) : "out of memory";
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  for (std::size_t p; (p = m.find('\n')) != std::string::npos;) m.replace(p, 1, "; ");
  return m;
}

namespace {
bool is_auth_failure(const std::string& msg, const PGconn* c) {
  return (c && PQconnectionNeedsPassword(c)) || msg.find("authentication failed") != std::string::npos ||
         msg.find("password") != std::string::npos || msg.find("no pg_hba.conf entry") != std::string::npos ||
         msg.find("permission denied") != std::string::npos;
}
}  // namespace

// One statement with text parameters, bounded by `timeout`: libpq's synchronous
// calls would wait for ever on a frozen peer.
Exec run(PGconn* c, const char* sql, const std::vector<std::string>& params, Millis timeout) {
  Exec out;
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p.c_str());
  const auto deadline = Clock::now() + timeout;
  auto wait = [&](short events) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{PQsocket(c), events, 0};
    int n;
    do {
      n = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000 * 3600)));
    } while (n < 0 && errno == EINTR);
    return n > 0;
  };
  auto io_fail = [&](std::string why) {
    out.io_failed = true;
    out.error = std::move(why);
    out.res.reset();
    return std::move(out);
  };
  auto timed_out = [&] {
    out.timed_out = true;
    return io_fail("no answer within " + std::to_string(timeout.count()) + "ms");
  };
  if (PQstatus(c) != CONNECTION_OK) return io_fail("connection lost: " + pq_message(c));
  if (!PQsendQueryParams(c, sql, static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr,
                         0)) {
    return io_fail(pq_message(c));
  }
  for (;;) {
    const int f = PQflush(c);
    if (f == 0) break;
    if (f < 0) return io_fail(pq_message(c));
    if (!wait(POLLOUT | POLLIN)) return timed_out();
    if (!PQconsumeInput(c)) return io_fail(pq_message(c));
  }
  for (;;) {
    while (PQisBusy(c)) {
      if (!wait(POLLIN)) return timed_out();
      if (!PQconsumeInput(c)) return io_fail(pq_message(c));
    }
    Result r(PQgetResult(c));
    if (!r) break;
    const ExecStatusType st = PQresultStatus(r.get());
    if (st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE || st == PGRES_NONFATAL_ERROR) {
      if (out.error.empty()) {
        std::string m = PQresultErrorMessage(r.get());
        while (!m.empty() && m.back() == '\n') m.pop_back();
        out.error = m;
        const char* state = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
        out.sqlstate = state ? state : "";
      }
    } else if (!out.res) {
      out.res = std::move(r);
    }
  }
  if (PQstatus(c) != CONNECTION_OK)
    return io_fail("connection lost: " + (out.error.empty() ? pq_message(c) : out.error));
  return out;
}

std::error_code code_of(const Exec& e) {
  if (e.io_failed) return make_error_code(errc::backend_unavailable);
  if (e.sqlstate.rfind("28", 0) == 0 || e.sqlstate == "42501") return make_error_code(errc::auth_failed);
  if (e.sqlstate.rfind("08", 0) == 0 || e.sqlstate.rfind("57", 0) == 0 || e.sqlstate.rfind("53", 0) == 0) {
    return make_error_code(errc::backend_unavailable);
  }
  return make_error_code(errc::protocol_error);
}

std::string check_session(PGconn* c, Millis idle_timeout, Millis timeout, std::error_code& ec) {
  ec.clear();
  Exec e = run(c,
               "SELECT name, setting FROM pg_settings WHERE name IN ('idle_session_timeout',"
               " 'idle_in_transaction_session_timeout', 'synchronous_commit') ORDER BY name",
               {}, timeout);
  if (!e.ok()) {
    ec = code_of(e);
    return "cannot read the session's settings: " + e.error;
  }
  const std::string want = std::to_string(idle_timeout.count());
  std::string wrong;
  int seen = 0;
  for (int r = 0; r < PQntuples(e.res.get()); ++r) {
    const std::string name = PQgetvalue(e.res.get(), r, 0), value = PQgetvalue(e.res.get(), r, 1);
    const std::string expected = name == "synchronous_commit" ? "on" : want;
    ++seen;
    if (value != expected) {
      if (!wrong.empty()) wrong += ", ";
      wrong += name + " is " + value + " instead of " + expected;
    }
  }
  if (wrong.empty() && seen == 3) return {};
  ec = make_error_code(errc::not_supported);
  if (seen != 3)
    return "the server shows " + std::to_string(seen) + " of the 3 session settings postgres:// sets";
  return "the session did not take the settings of its startup options (" + wrong +
         "): a connection pooler in transaction mode (PgBouncer pool_mode=transaction) drops them, and a "
         "lease session without its idle timeout would keep a dead holder's lock for ever; connect "
         "directly or through a session-pooling proxy";
}

// Opens a connection; idle_session_timeout (ms) when > 0. On failure returns null,
// `err` (auth_failed / backend_unavailable / invalid_argument, the detail saying why).
Conn open(const Config& cfg, Millis idle_timeout, const char* role, Error& err) {
  err.clear();
  // Every lease on this connection ends with it; the server ends it after this much idleness.
  const std::string options =
      "-c idle_session_timeout=" + std::to_string(idle_timeout.count()) +
      " -c idle_in_transaction_session_timeout=" + std::to_string(idle_timeout.count()) +
      // A token row lost to a crash would let tokens repeat.
      " -c synchronous_commit=on";
  std::vector<const char*> keys{"host", "application_name", "options", "client_encoding"};
  std::vector<const char*> vals{cfg.host.c_str(), role, options.c_str(), "UTF8"};
  auto add = [&](const char* k, const std::string& v) {
    if (v.empty()) return;
    keys.push_back(k);
    vals.push_back(v.c_str());
  };
  add("port", cfg.port);
  add("user", cfg.user);
  add("password", cfg.password);
  add("dbname", cfg.dbname);
  add("sslmode", cfg.sslmode);
  keys.push_back(nullptr);
  vals.push_back(nullptr);
  bool timed_out = false;
  Conn c(connect_within(keys.data(), vals.data(), cfg.connect_timeout, timed_out));
  if (timed_out) {
    err.fail(errc::backend_unavailable, cfg.shown +
                                            ": cannot connect: no answer within the connect timeout (" +
                                            std::to_string(cfg.connect_timeout.count()) + " ms)");
    return nullptr;
  }
  if (c && PQstatus(c.get()) == CONNECTION_OK) {
    PQsetNoticeProcessor(c.get(), &discard_notice, nullptr);
    if (PQserverVersion(c.get()) < 140000) {
      err.fail(errc::backend_unavailable,
               cfg.shown + ": PostgreSQL " + std::to_string(PQserverVersion(c.get()) / 10000) +
                   " has no idle_session_timeout; postgres:// needs PostgreSQL 14 or later");
      return nullptr;
    }
    std::error_code ec;
    if (std::string bad = check_session(c.get(), idle_timeout, cfg.command_timeout, ec); !bad.empty()) {
      err.fail(ec, scrub_secrets(cfg.shown + ": " + bad, cfg.url));
      return nullptr;
    }
    return c;
  }
  const std::string msg = pq_message(c.get());
  errc code = errc::backend_unavailable;
  std::string why;
  if (is_auth_failure(msg, c.get())) {
    code = errc::auth_failed;
    why = cfg.shown + ": the server refused the credentials of user \"" + cfg.user + "\": " + msg;
  } else if (msg.find("does not exist") != std::string::npos) {
    code = errc::invalid_argument;
    why = cfg.shown + ": " + msg;
  } else {
    why = cfg.shown + ": cannot connect: " + msg;
  }
  // libpq never puts the password into its messages, but the server names the role
  // and the database it was given, which may be a password written alone as the user
  // or text an unencoded '@' pushed into the path.
  why = scrub_secrets(why, cfg.url);
  if (!cfg.password.empty()) {
    for (std::size_t p; (p = why.find(cfg.password)) != std::string::npos;)
      why.replace(p, cfg.password.size(), "***");
  }
  err.fail(code, std::move(why));
  return nullptr;
}

}  // namespace distlock::detail::pg
