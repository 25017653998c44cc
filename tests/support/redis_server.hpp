// Test support: a real redis-server started by the test itself on a free loopback
// port in a temporary directory, stopped by pid. Fault helpers (kill, pause,
// restart on the same port and directory) and a plain hiredis `command()` for
// assertions that do not go through the code under test.
//
// A missing redis-server binary is a test failure with a clear message (never a skip).
//
// Thread-safety: one RedisServer per test or test suite, driven from one thread;
// command() opens its own connection per call and may be used from any thread.
//
// Example:
//   distlock::testing::RedisServer redis({.appendonly = true});
//   auto client = distlock::connect(redis.url());
//   EXPECT_EQ(redis.command({"PTTL", "distlock:{job}:fence"})->integer, -1);
//   redis.kill();     // SIGKILL
//   redis.restart();  // same port and dir: the AOF brings the data back
#pragma once

#include <hiredis/hiredis.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "support/local_server_process.hpp"
#include "support/process.hpp"

namespace distlock::testing {

/// Frees a hiredis context (std::unique_ptr<redisContext, RedisContextDeleter>).
struct RedisContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};

struct RedisServerOptions {
  /// requirepass for the default user (empty: none).
  std::string password;
  /// Adds an ACL user with every permission (e.g. {"alice", "pw"}); empty: none.
  std::string acl_user;
  std::string acl_password;
  /// appendonly yes, so restart() keeps the data (with appendfsync below).
  bool appendonly = false;
  std::string appendfsync = "always";
  /// More "--option value" arguments for redis-server.
  std::vector<std::string> extra_args;
  /// TLS: with a certificate, the server also listens on tls_port() (PEM files; the
  /// plain port stays for the test's own commands). tls_auth_clients: require a
  /// client certificate signed by tls_ca.
  std::string tls_cert, tls_key, tls_ca;
  bool tls_auth_clients = false;
};

struct RedisReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyDeleter>;

/// A reply's string (a status, a bulk string or an error's text), or "" for none.
inline std::string reply_str(const RedisReplyPtr& r) {
  return r && r->str ? std::string(r->str, r->len) : std::string();
}

class RedisServer : public LocalServerProcess {
 public:
  /// Starts redis-server (save "" so nothing is written unless appendonly) and waits
  /// until it answers PING. Throws std::runtime_error (after ADD_FAILURE) when the
  /// binary is missing or the server does not come up; the message includes its log.
  explicit RedisServer(RedisServerOptions opts = {});

  /// redis://[:password@]127.0.0.1:<port>[suffix], e.g. url("/2?prefix=t").
  std::string url(std::string_view suffix = {}) const;
  /// The TLS port (0 without RedisServerOptions::tls_cert).
  std::uint16_t tls_port() const { return tls_port_; }
  // port(), pid(), dir(), running(), kill() (SIGKILL), pause(), resume() (SIGSTOP / SIGCONT)
  // and the stop by pid when it goes: LocalServerProcess.

  /// SIGTERM and wait (the server flushes its AOF); SIGKILL after 5 s.
  void stop();
  /// Stops it if running, then starts it again on the same port and directory and
  /// waits for PING (data survives when appendonly is on).
  void restart();

  /// One command on a fresh plain hiredis connection (authenticated); throws
  /// std::runtime_error when the server cannot be reached. Error replies are returned.
  RedisReplyPtr command(std::initializer_list<std::string_view> argv) const;
  RedisReplyPtr command(const std::vector<std::string>& argv) const;
  /// The integer of `INFO commandstats` calls for one command (e.g. "evalsha"), 0 if never called.
  long long command_calls(std::string_view command) const;
  /// The server's log so far (for failure messages).
  std::string log() const;

 private:
  void start();
  bool wait_ready(std::chrono::milliseconds timeout);

  RedisServerOptions opts_;
  std::uint16_t tls_port_ = 0;
};

}  // namespace distlock::testing
