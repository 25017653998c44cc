// The hiredis connection layer against a real redis-server: connect, AUTH, SELECT,
// binary-safe argv, pipelining, error mapping, the pool after a restart, and
// Script's NOSCRIPT recovery.
#include "redis/connection.hpp"

#include <gtest/gtest.h>

#include "distlock/client.hpp"
#include "support/process.hpp"
#include "support/redis_link_checks.hpp"
#include "support/redis_server.hpp"

namespace distlock::detail::redis {
namespace {

using distlock::testing::RedisServer;
using distlock::testing::RedisServerOptions;

ConnectionOptions opts_for(const RedisServer& server, std::string password = {}) {
  ConnectionOptions o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.password = std::move(password);
  o.connect_timeout = Millis(1000);
  o.command_timeout = Millis(1000);
  return o;
}

// A connection with `o` fails to connect with `code`, and its message names `named`.
void expect_connect_fails(const ConnectionOptions& o, errc code, const std::string& named) {
  Connection conn(o);
  Error ec;
  conn.connect(ec);
  EXPECT_EQ(ec, code) << ec.detail();
  EXPECT_NE(ec.detail().find(named), std::string::npos) << ec.detail();
}

TEST(RedisConnection, BinarySafeArgumentsRoundTrip) {
  RedisServer server;
  Connection conn(opts_for(server));
  Error ec;
  const std::string key("k\0ey \r\n{x}", 10);
  const std::string value("v\0\r\nal", 6);
  Reply r = conn.command({"SET", key, value}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  r = conn.command({"GET", key}, ec);
  ASSERT_FALSE(ec);
  EXPECT_EQ(reply_str(r.get()), value);
  EXPECT_EQ(conn.round_trips(), 2u);  // SET and GET; the connect handshake is not counted
}

TEST(RedisConnection, ErrorReplySetsProtocolErrorButKeepsTheConnection) {
  RedisServer server;
  Connection conn(opts_for(server));
  ASSERT_NO_FATAL_FAILURE(distlock::testing::expect_error_reply_keeps_link(conn, server.port()));
}

TEST(RedisConnection, WrongPasswordIsAuthFailedNamingTheServer) {
  RedisServer server({.password = "right"});
  Connection conn(opts_for(server, "wrong"));
  Error ec;
  conn.connect(ec);
  EXPECT_EQ(ec, errc::auth_failed);
  EXPECT_NE(ec.detail().find("redis 127.0.0.1:" + std::to_string(server.port())), std::string::npos)
      << ec.detail();
  EXPECT_FALSE(conn.connected());

  expect_connect_fails(opts_for(server), errc::auth_failed, "requires a password");

  Connection good(opts_for(server, "right"));
  good.connect(ec);
  EXPECT_FALSE(ec) << ec.detail();
}

// A full server answers the first command (AUTH or PING) with "max number of
// clients reached": unavailable, not bad credentials.
TEST(RedisConnection, AFullServerIsUnavailableNotAnAuthFailure) {
  RedisServer server({.password = "right"});
  Connection first(opts_for(server, "right"));
  Error ec;
  // Below the connections already open: those stay, every new one is refused.
  first.command({"CONFIG", "SET", "maxclients", "1"}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  Connection second(opts_for(server, "right"));
  second.connect(ec);
  EXPECT_EQ(ec, errc::backend_unavailable) << ec.detail();
  EXPECT_NE(ec.detail().find("max number of clients"), std::string::npos) << ec.detail();
  first.command({"CONFIG", "SET", "maxclients", "100"}, ec);
  EXPECT_FALSE(ec) << ec.detail();
}

TEST(RedisConnection, AclUserAndPassword) {
  RedisServer server({.password = "admin", .acl_user = "alice", .acl_password = "alicepw"});
  ConnectionOptions o = opts_for(server, "alicepw");
  o.user = "alice";
  Connection conn(o);
  Error ec;
  Reply r = conn.command({"ACL", "WHOAMI"}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(reply_str(r.get()), "alice");

  o.password = "bad";
  expect_connect_fails(o, errc::auth_failed, "alice");
}

TEST(RedisConnection, RefusedIsBackendUnavailableNamingHostPort) {
  ConnectionOptions o;
  o.port = distlock::testing::free_port();  // nobody listens there
  Connection conn(o);
  Error ec;
  Reply r = conn.command({"PING"}, ec);
  EXPECT_EQ(ec, errc::backend_unavailable);
  EXPECT_FALSE(r);
  EXPECT_NE(ec.detail().find("127.0.0.1:" + std::to_string(o.port)), std::string::npos) << ec.detail();
}

TEST(RedisConnection, SelectsTheDatabase) {
  RedisServer server;
  ConnectionOptions o = opts_for(server);
  o.db = 3;
  Connection conn(o);
  Error ec;
  conn.command({"SET", "only-in-3", "1"}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(server.command({"EXISTS", "only-in-3"})->integer, 0);
  EXPECT_EQ(server.command({"SELECT", "3"})->type, REDIS_REPLY_STATUS);

  o.db = 999;
  expect_connect_fails(o, errc::invalid_url, "999");
}

TEST(RedisConnection, PipelineIsOneRoundTripAndKeepsOrder) {
  RedisServer server;
  Connection conn(opts_for(server));
  Error ec;
  conn.connect(ec);
  ASSERT_FALSE(ec);
  const auto before = conn.round_trips();
  std::vector<std::string> keys;
  for (int i = 0; i < 100; ++i) keys.push_back("p" + std::to_string(i));
  for (auto& k : keys) conn.append({"INCRBY", k, k.substr(1)});
  conn.append({"NOSUCHCOMMAND"});
  EXPECT_EQ(conn.pending(), 101u);
  auto replies = conn.read_replies(101, ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(conn.round_trips() - before, 1u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(replies[i]->integer, i);
  EXPECT_TRUE(is_error(replies[100].get()));  // error replies come back as replies
  EXPECT_EQ(conn.pending(), 0u);

  // flush() sends without reading (fan-out to several servers); reads then just read.
  conn.append({"SET", "f", "1"});
  conn.append({"GET", "f"});
  conn.flush(ec);
  ASSERT_FALSE(ec);
  replies = conn.read_replies(2, ec);
  ASSERT_FALSE(ec);
  EXPECT_EQ(reply_str(replies[1].get()), "1");
  EXPECT_EQ(conn.round_trips() - before, 2u);
}

TEST(RedisConnection, CommandTimeoutDropsTheConnectionAndNextCallReconnects) {
  RedisServer server;
  ConnectionOptions o = opts_for(server);
  o.command_timeout = Millis(200);
  Connection conn(o);
  Error ec;
  conn.connect(ec);
  ASSERT_FALSE(ec);
  server.pause();
  Reply r = conn.command({"PING"}, ec);
  server.resume();
  EXPECT_EQ(ec, errc::backend_unavailable);
  EXPECT_NE(ec.detail().find("no reply within 200 ms"), std::string::npos) << ec.detail();
  EXPECT_FALSE(conn.connected());
  r = conn.command({"PING"}, ec);
  EXPECT_FALSE(ec) << ec.detail();
  EXPECT_EQ(reply_str(r.get()), "PONG");
}

TEST(RedisConnectionPool, ReusesConnectionsAndSurvivesARestart) {
  RedisServer server;
  ConnectionPool pool(opts_for(server), 2);
  Error ec;
  {
    auto a = pool.checkout(ec);
    ASSERT_FALSE(ec) << ec.detail();
    auto b = pool.checkout(ec);
    ASSERT_FALSE(ec);
    auto c = pool.checkout(ec);  // grows beyond max_idle while in use
    ASSERT_FALSE(ec);
    a->command({"SET", "x", "1"}, ec);
    ASSERT_FALSE(ec);
  }
  EXPECT_EQ(pool.idle(), 2u);

  server.restart();
  // The idle connections see EOF and are discarded: the first call goes through.
  auto conn = pool.checkout(ec);
  ASSERT_FALSE(ec) << ec.detail();
  Reply r = conn->command({"PING"}, ec);
  EXPECT_FALSE(ec) << ec.detail();

  server.kill();
  auto down = pool.checkout(ec);
  if (!ec) {
    // The kill may race the checkout's EOF check; the command itself must then fail.
    down->command({"PING"}, ec);
  }
  EXPECT_EQ(ec, errc::backend_unavailable);
  server.restart();
  auto again = pool.checkout(ec);
  ASSERT_FALSE(ec) << ec.detail();
  again->command({"PING"}, ec);
  EXPECT_FALSE(ec);
}

TEST(RedisScript, LoadsOnceAndReloadsAfterNoscript) {
  RedisServer server;
  static const Script incr("return redis.call('INCRBY', KEYS[1], ARGV[1])");
  Connection conn(opts_for(server));
  Error ec;
  Reply r = incr.run(conn, {"n"}, {"5"}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(r->integer, 5);
  EXPECT_EQ(incr.sha().size(), 40u);
  EXPECT_EQ(server.command_calls("script|load"), 1);

  server.command({"SCRIPT", "FLUSH"});
  r = incr.run(conn, {"n"}, {"2"}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(r->integer, 7);
  EXPECT_EQ(server.command_calls("script|load"), 2);

  server.command({"SCRIPT", "FLUSH"});
  std::vector<std::string> keys{"a", "b", "c"};
  const std::string_view one[] = {"1"};
  std::vector<std::string_view> kv(keys.begin(), keys.end());
  std::vector<Script::Call> calls;
  for (std::size_t i = 0; i < kv.size(); ++i) calls.push_back({std::span(&kv[i], 1), one});
  auto replies = incr.run_pipelined(conn, calls, ec);
  ASSERT_FALSE(ec) << ec.detail();
  ASSERT_EQ(replies.size(), 3u);
  for (auto& rep : replies) EXPECT_EQ(rep->integer, 1);
}

}  // namespace
}  // namespace distlock::detail::redis

namespace {
// A bare password written where the user goes (redis://PASSWORD@host) is refused
// without being echoed.
TEST(RedisConnectionUrl, ABarePasswordInTheUserPartIsNeverEchoed) {
  std::error_code ec;
  try {
    distlock::connect("redis://hunter2@127.0.0.1:1");
    ADD_FAILURE() << "accepted a user without a password";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), distlock::errc::invalid_url);
    EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no password"), std::string::npos) << e.what();
  }
}
}  // namespace
