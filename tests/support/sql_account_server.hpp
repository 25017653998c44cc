// Test support: the account a SQL server harness (support/mariadb_server.hpp,
// support/postgres_server.hpp) creates for the tests, and the URLs that log in with it,
// written once. A harness names its account (SqlAccount: scheme, user, password, database)
// and derives from SqlAccountServer<its account>, which adds to DatabaseServer:
//
//   kUser, kPassword, kDatabase    the account, for a client of the test's own (libpq, libmariadb)
//   url(suffix)                    <scheme>://<user>:<password>@127.0.0.1:<port>/<database><suffix>
//   url_with_password(password)    the same with another password
//   url_at(hosts, suffix)          this account through other hosts (a FaultProxy, a list of them)
//   url_through(port, suffix)      the same through 127.0.0.1:<port>
//
// Thread-safety: as DatabaseServer (one server per test, driven from one thread); the static
// calls may be made from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "support/database_server.hpp"

namespace distlock::testing {

struct SqlAccount {
  const char* scheme;    // "mysql", "postgres"
  const char* user;      // an account with a password (never a trust or socket login)
  const char* password;  // the right one; url_with_password() gives others
  const char* database;  // the database the URLs name
};

template <const SqlAccount& kAccount>
class SqlAccountServer : public DatabaseServer {
 public:
  static constexpr const char* kUser = kAccount.user;
  static constexpr const char* kPassword = kAccount.password;
  static constexpr const char* kDatabase = kAccount.database;

  static std::string url_at(const std::string& hosts, const std::string& suffix = {}) {
    return login_url(kPassword, hosts) + suffix;
  }
  static std::string url_through(std::uint16_t port, const std::string& suffix = {}) {
    return url_at("127.0.0.1:" + std::to_string(port), suffix);
  }
  std::string url(const std::string& suffix = {}) const { return url_with_password(kPassword) + suffix; }
  std::string url_with_password(const std::string& password) const {
    return login_url(password, "127.0.0.1:" + std::to_string(port_));
  }

 protected:
  using DatabaseServer::DatabaseServer;

 private:
  static std::string login_url(const std::string& password, const std::string& hosts) {
    return std::string(kAccount.scheme) + "://" + kUser + ":" + password + "@" + hosts + "/" + kDatabase;
  }
};

}  // namespace distlock::testing
