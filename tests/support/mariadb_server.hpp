// Test support: a real MariaDB server (Debian's mariadb-install-db + mariadbd) started
// by the test itself in a temporary directory, listening on a free loopback port only
// (and a Unix socket inside that directory), with a real account "distlock" that has a
// password (no --skip-grant-tables). Stopped by pid.
//
// Fast start: the system tables are installed once per user into a template that every
// server copies (mariadb-install-db takes seconds; a copy and a start about one); the
// InnoDB buffer pool, redo log and system tablespace are small. The redo log is flushed
// at every commit (innodb_flush_log_at_trx_commit = 1, what the backend checks for), so
// a SIGKILLed server keeps every committed token.
//
// When the test runs as root, mariadbd runs as root too (--user=root): the data lives in
// a private temporary directory and the server listens on 127.0.0.1 only.
//
// A missing server binary is a test failure with a clear message (never a skip).
//
// Thread-safety: one MariadbServer per test, driven from one thread; query() opens its
// own connection per call.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "support/database_server.hpp"
#include "support/process.hpp"

namespace distlock::testing {

class MariadbServer : public DatabaseServer {
 public:
  static constexpr const char* kUser = "distlock";
  static constexpr const char* kPassword = "s3cret-my";
  static constexpr const char* kDatabase = "distlock_test";

  MariadbServer();
  ~MariadbServer() override;
  MariadbServer(const MariadbServer&) = delete;
  MariadbServer& operator=(const MariadbServer&) = delete;

  /// mysql://distlock:<password>@127.0.0.1:<port>/distlock_test[suffix]
  std::string url(const std::string& suffix = {}) const;
  /// The same with another password.
  std::string url_with_password(const std::string& password) const;
  /// mysql://distlock:<password>@<hosts>/distlock_test[suffix]: this account through other
  /// hosts (a FaultProxy in front of the server, a list of them).
  static std::string url_at(const std::string& hosts, const std::string& suffix = {}) {
    return std::string("mysql://") + kUser + ":" + kPassword + "@" + hosts + "/" + kDatabase + suffix;
  }
  /// The same through 127.0.0.1:`port`.
  static std::string url_through(std::uint16_t port, const std::string& suffix = {}) {
    return url_at("127.0.0.1:" + std::to_string(port), suffix);
  }
  // port(), pid(), kill() (SIGKILL), pause(), resume(), stop() (SIGTERM, SIGKILL after 10 s),
  // restart(), wipe_and_restart() (a fresh copy of the template) and log(): DatabaseServer.

  /// Statements (';'-separated allowed) as root over the Unix socket; the rows of the
  /// last result as text (NULL as "<null>"). Throws std::runtime_error on any failure.
  std::vector<std::vector<std::string>> query(const std::string& sql) const;

 private:
  void start() override;
  bool wait_ready(std::chrono::milliseconds timeout) override;
  std::string socket() const;
};

/// The path of mariadbd, or empty.
std::string mariadbd_path();

}  // namespace distlock::testing
