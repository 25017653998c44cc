#include "mysql/my_conn.hpp"

#include <errmsg.h>

#include <algorithm>

#include "distlock/error.hpp"

namespace distlock::detail::my {

namespace {

constexpr char kDigits[] = "0123456789abcdef";

bool direct_lock_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == ':' ||
         c == '/' || c == '@' || c == '+' || c == '=' || c == ',' || c == '~';
}

std::string one_line(std::string m) {
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  for (std::size_t p; (p = m.find('\n')) != std::string::npos;) m.replace(p, 1, "; ");
  return m;
}

void fill_error(MYSQL* c, Exec& out) {
  out.errnum = mysql_errno(c);
  out.error = one_line(mysql_error(c));
  if (out.error.empty()) out.error = "error " + std::to_string(out.errnum);
  out.io_failed = is_connection_error(out.errnum);
  out.rows.clear();
}

// Reads every result of the batch; keeps the rows of the last result set.
void read_results(MYSQL* c, Exec& out) {
  for (;;) {
    MYSQL_RES* res = mysql_store_result(c);
    if (res) {
      out.rows.clear();
      const unsigned n = mysql_num_fields(res);
      while (MYSQL_ROW row = mysql_fetch_row(res)) {
        const unsigned long* len = mysql_fetch_lengths(res);
        Row r;
        r.reserve(n);
        for (unsigned i = 0; i < n; ++i) {
          if (row[i]) {
            r.emplace_back(std::string(row[i], len[i]));
          } else {
            r.emplace_back(std::nullopt);
          }
        }
        out.rows.push_back(std::move(r));
      }
      mysql_free_result(res);
    } else if (mysql_field_count(c) != 0) {
      fill_error(c, out);
      return;
    } else {
      out.affected = mysql_affected_rows(c);
    }
    const int next = mysql_next_result(c);
    if (next > 0) {
      fill_error(c, out);
      return;
    }
    if (next < 0) return;
  }
}

}  // namespace

std::string to_hex(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string hex_literal(std::string_view bytes) {
  return "X'" + to_hex(bytes) + "'";
}

std::string quote_ident(std::string_view ident) {
  std::string out = "`";
  for (char c : ident) {
    if (c == '`') out.push_back('`');
    out.push_back(c);
  }
  out.push_back('`');
  return out;
}

std::string lock_name_sql(std::string_view name) {
  const bool direct = !name.empty() && name.size() <= 64 && name[0] != '#' &&
                      std::all_of(name.begin(), name.end(), direct_lock_char);
  if (direct) return "'" + std::string(name) + "'";  // no quote or backslash can be among them
  return "CONCAT('#', LEFT(SHA2(" + hex_literal(name) + ", 256), 63))";
}

std::string digest_sql(std::string_view name) {
  return "UNHEX(SHA2(" + hex_literal(name) + ", 256))";
}

bool is_connection_error(unsigned errnum) {
  return (errnum >= 2000 && errnum < 3000) || errnum == 1053 /* ER_SERVER_SHUTDOWN */ ||
         errnum == 1927 /* ER_CONNECTION_KILLED (MariaDB) */ ||
         errnum == 4031 /* ER_CLIENT_INTERACTION_TIMEOUT (MySQL) */ ||
         errnum == 1184 /* ER_NEW_ABORTING_CONNECTION */;
}

bool send(MYSQL* c, const std::string& sql, Exec& out) {
  if (mysql_send_query(c, sql.data(), static_cast<unsigned long>(sql.size())) != 0) {
    fill_error(c, out);
    out.io_failed = true;
    return false;
  }
  return true;
}

Exec finish(MYSQL* c) {
  Exec out;
  if (mysql_read_query_result(c) != 0) {
    fill_error(c, out);
    return out;
  }
  read_results(c, out);
  return out;
}

Exec run(MYSQL* c, const std::string& sql) {
  Exec out;
  if (mysql_real_query(c, sql.data(), static_cast<unsigned long>(sql.size())) != 0) {
    fill_error(c, out);
    return out;
  }
  read_results(c, out);
  return out;
}

std::error_code code_of(const Exec& e) {
  if (e.io_failed) return make_error_code(errc::backend_unavailable);
  switch (e.errnum) {
    case 1044:  // ER_DBACCESS_DENIED_ERROR
    case 1045:  // ER_ACCESS_DENIED_ERROR
    case 1142:  // ER_TABLEACCESS_DENIED_ERROR
    case 1227:  // ER_SPECIFIC_ACCESS_DENIED_ERROR
    case 1095:  // ER_KILL_DENIED_ERROR
      return make_error_code(errc::auth_failed);
    case 1049:  // ER_BAD_DB_ERROR
      return make_error_code(errc::invalid_argument);
    case 1040:  // ER_CON_COUNT_ERROR
    case 1205:  // ER_LOCK_WAIT_TIMEOUT
    case 1213:  // ER_LOCK_DEADLOCK
    case 1317:  // ER_QUERY_INTERRUPTED
    case 1290:  // ER_OPTION_PREVENTS_STATEMENT (read-only server)
      return make_error_code(errc::backend_unavailable);
    default: return make_error_code(errc::protocol_error);
  }
}

Conn open(const Config& cfg, Error& err) {
  err.clear();
  Conn c(mysql_init(nullptr));
  if (!c) {
    err.fail(std::make_error_code(std::errc::not_enough_memory), cfg.shown + ": out of memory");
    return nullptr;
  }
  auto seconds = [](Millis m) {
    return static_cast<unsigned>(std::max<long long>(1, (m.count() + 999) / 1000));
  };
  const unsigned connect_s = seconds(cfg.connect_timeout), command_s = seconds(cfg.command_timeout);
  mysql_options(c.get(), MYSQL_OPT_CONNECT_TIMEOUT, &connect_s);
  mysql_options(c.get(), MYSQL_OPT_READ_TIMEOUT, &command_s);
  mysql_options(c.get(), MYSQL_OPT_WRITE_TIMEOUT, &command_s);
  const my_bool no = 0;
  mysql_options(c.get(), MYSQL_OPT_RECONNECT, &no);  // a new session would have lost every lock
  mysql_options(c.get(), MYSQL_SET_CHARSET_NAME, "utf8mb4");
  // TCP always (a host of "localhost" would otherwise mean the Unix socket).
  const unsigned protocol = MYSQL_PROTOCOL_TCP;
  mysql_options(c.get(), MYSQL_OPT_PROTOCOL, &protocol);
  if (mysql_real_connect(c.get(), cfg.host.c_str(), cfg.user.empty() ? nullptr : cfg.user.c_str(),
                         cfg.password.c_str(), cfg.database.c_str(), cfg.port, nullptr,
                         CLIENT_MULTI_STATEMENTS | CLIENT_FOUND_ROWS)) {
    // Every statement commits on its own (the records' batches say START TRANSACTION
    // themselves), whatever the server's default: with autocommit off, a token written
    // by an acquire would stay uncommitted and the session's end would roll it back
    // (the next holder would get the same token), and reads would see an old snapshot.
    if (mysql_autocommit(c.get(), 1) == 0) return c;
  }
  const unsigned n = mysql_errno(c.get());
  const std::string msg = one_line(mysql_error(c.get()));
  errc code = errc::backend_unavailable;
  std::string why;
  if (n == 1045 || n == 1044 || n == 1698 /* ER_ACCESS_DENIED_NO_PASSWORD_ERROR */ || n == 1251) {
    code = errc::auth_failed;
    why = cfg.shown + ": the server refused the credentials of user \"" + cfg.user + "\": " + msg;
  } else if (n == 1049) {
    code = errc::invalid_argument;
    why = cfg.shown + ": " + msg +
          " (create the database first; every client of a lock must name the same one)";
  } else {
    why = cfg.shown + ": cannot connect: " + msg;
  }
  // The client library never puts the password into its messages; make sure of it.
  if (!cfg.password.empty()) {
    for (std::size_t p; (p = why.find(cfg.password)) != std::string::npos;)
      why.replace(p, cfg.password.size(), "***");
  }
  err.fail(code, std::move(why));
  return nullptr;
}

}  // namespace distlock::detail::my
