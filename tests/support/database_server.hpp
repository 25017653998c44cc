// Test support: what the SQL server harnesses (support/mariadb_server.hpp,
// support/postgres_server.hpp) have in common, written once: a database server process the
// test starts itself with its data directory in a private temporary directory (a copy of a
// template made once per user), listening on a free loopback port, stopped by pid.
//
//   port(), pid()        where it listens; its process id (-1 while it is down)
//   kill()               SIGKILL (a crash), reaped; a server made of several processes overrides it
//   pause(), resume()    SIGSTOP / SIGCONT: the server hangs with its sockets open (likewise)
//   stop()               its normal shutdown signal, SIGKILL after 10 s
//   restart()            starts again on the same port and data directory; waits until it accepts
//   wipe_and_restart()   kills it, replaces its data directory with a fresh copy of the
//                        template (every table, lock and counter gone), restarts it
//   log()                the server's log (server.log in its directory)
//
// A harness derives from DatabaseServer, gives start() and wait_ready(), calls
// start_from_template() at the end of its constructor, and calls stop() in its own destructor
// (no virtual call reaches it from this one).
//
// Thread-safety: one server per test, driven from one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "support/process.hpp"

namespace distlock::testing {

class DatabaseServer {
 public:
  DatabaseServer(const DatabaseServer&) = delete;
  DatabaseServer& operator=(const DatabaseServer&) = delete;

  std::uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  /// SIGKILL (a crash), reaped.
  virtual void kill();
  /// SIGSTOP / SIGCONT: the server hangs with its sockets open.
  virtual void pause();
  virtual void resume();
  /// The shutdown signal given at construction, SIGKILL after 10 s.
  void stop();
  /// Starts again on the same port and data directory; waits until it accepts.
  void restart();
  /// Kills it, replaces its data directory with a fresh copy of the template and starts it
  /// again on the same port; waits until it accepts.
  void wipe_and_restart();
  std::string log() const;

 protected:
  /// `program` names the server in errors ("mariadbd"), `product` too ("MariaDB");
  /// `shutdown_signal` is its normal shutdown; `ready_within` bounds each start in restart().
  DatabaseServer(std::string program, std::string product, const std::string& tmp_prefix, int shutdown_signal,
                 std::chrono::milliseconds ready_within);
  virtual ~DatabaseServer() = default;
  /// Builds the template once per user: under an flock on `tmpl`.lock, `build` runs (and
  /// returns an error, "" on success) unless `tmpl`/data/`built_marker` exists. Copies
  /// `tmpl`/data to dir_/data, then starts the server on a free port: three attempts, each
  /// awaited for ready_within. Fails the setup (fail_setup) with the error or the logs.
  void start_from_template(const std::string& tmpl, const std::string& built_marker,
                           const std::function<std::string()>& build);
  /// Spawns the server on port_ with its data in dir_/data; sets process_ and pid_.
  virtual void start() = 0;
  /// True once it accepts (false if its process ended or `timeout` passed).
  virtual bool wait_ready(std::chrono::milliseconds timeout) = 0;

  std::string template_;  // the data directory every server copies
  TempDir dir_;
  std::uint16_t port_ = 0;
  Process process_;
  pid_t pid_ = -1;

 private:
  std::string program_;
  std::string product_;
  int shutdown_signal_;
  std::chrono::milliseconds ready_within_;
};

}  // namespace distlock::testing
