// Test support: a real PostgreSQL server (initdb + postgres from Debian's
// /usr/lib/postgresql/<version>/bin) started by the test itself in a temporary
// directory, listening on a free loopback port, with password (SCRAM) auth for the
// superuser "distlock". Stopped by pid. The postmaster leads its own process group,
// but PostgreSQL puts every backend it forks in a process group of its own (setsid in
// InitPostmasterChild), so kill() and pause() signal the postmaster's children one by
// one (found by their ppid in /proc), the postmaster stopped first so it forks none more.
//
// PostgreSQL refuses to run as root: when the test runs as root, initdb and postgres
// run as the "postgres" system user (setpriv, which execs without forking, so the
// pid is the postmaster's) and the directory is chowned to it.
//
// A missing server binary is a test failure with a clear message (never a skip).
// fsync is off: the faults here are process kills, not power cuts, and the page
// cache keeps every committed write across them.
//
// Thread-safety: one PostgresServer per test, driven from one thread; query() opens
// its own connection per call.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/process.hpp"
#include "support/sql_account_server.hpp"

namespace distlock::testing {

/// The account the tests log in with: the superuser "distlock", with a password (SCRAM).
inline constexpr SqlAccount kPostgresAccount{"postgres", "distlock", "s3cret-pg", "postgres"};

class PostgresServer : public SqlAccountServer<kPostgresAccount> {
 public:
  PostgresServer();
  ~PostgresServer() override;
  // kUser, kPassword, kDatabase, url(), url_with_password(), url_at() and url_through():
  // SqlAccountServer.
  /// SIGKILL to the postmaster and every backend (a crash), reaped.
  void kill() override;
  /// SIGSTOP / SIGCONT to the postmaster and every backend (each leads a process group of its
  /// own, so these signal them one by one: the postmaster stopped first and continued last).
  /// pause() returns once all are stopped: the server hangs with its sockets open, existing
  /// sessions included.
  void pause() override;
  void resume() override;
  // port(), pid(), stop() (SIGINT: fast shutdown, SIGKILL after 10 s), restart(),
  // wipe_and_restart() (a freshly initialised data directory) and log(): DatabaseServer.

  /// One statement on a fresh superuser connection; rows of text values (NULL as "<null>").
  /// Throws std::runtime_error on any failure.
  std::vector<std::vector<std::string>> query(const std::string& sql) const;

 private:
  void start() override;
  bool wait_ready(std::chrono::milliseconds timeout) override;
  std::string bin_;
  bool as_postgres_ = false;
};

/// The directory holding initdb and postgres, or empty.
std::string postgres_bin_dir();

}  // namespace distlock::testing
