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

#include "support/process.hpp"
#include "support/sql_account_server.hpp"

namespace distlock::testing {

/// The account the tests log in with: "distlock", with a password (root logs in over the socket).
inline constexpr SqlAccount kMariadbAccount{"mysql", "distlock", "s3cret-my", "distlock_test"};

class MariadbServer : public SqlAccountServer<kMariadbAccount> {
 public:
  MariadbServer();
  ~MariadbServer() override;
  // kUser, kPassword, kDatabase, url(), url_with_password(), url_at() and url_through():
  // SqlAccountServer.
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
