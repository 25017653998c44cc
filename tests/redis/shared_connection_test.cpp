// The shared, auto-pipelined connection against a real redis-server: many threads
// on one socket each get their own replies, calls overlap on the wire, a stuck
// server fails every call in flight (and the next call reconnects), a restart is
// noticed before a call is lost to the dead socket, and scripts recover from
// NOSCRIPT through it. The lock backend's use of it is tested in backend_test.cpp.
#include "redis/shared_connection.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support/eventually.hpp"
#include "support/process.hpp"
#include "support/redis_link_checks.hpp"
#include "support/redis_server.hpp"

namespace distlock::detail::redis {
namespace {

using distlock::testing::RedisServer;
using std::chrono::steady_clock;

ConnectionOptions shared_opts(const RedisServer& server, Millis command_timeout = Millis(5000)) {
  ConnectionOptions o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.connect_timeout = Millis(2000);
  o.command_timeout = command_timeout;
  return o;
}

// Polls `pred` every 2 ms until it holds or 10 s pass (the machine may be busy).
template <class Pred>
bool eventually(Pred pred) {
  return distlock::testing::eventually(pred, std::chrono::seconds(10), std::chrono::milliseconds(2));
}

// The call after a lost connection was answered `text`, over the second connect.
void expect_answered_after_reconnect(SharedConnection& shared, const Reply& r, const Error& ec,
                                     const std::string& text) {
  EXPECT_FALSE(ec) << ec.detail();
  EXPECT_EQ(reply_str(r.get()), text);
  EXPECT_EQ(shared.stats().connects, 2u);
}

// The first call (PING) on `shared` succeeds: it is connected.
void ping_connects(SharedConnection& shared) {
  Error ec;
  shared.command({"PING"}, ec);
  ASSERT_FALSE(ec) << ec.detail();
}

TEST(SharedRedisConnection, ManyThreadsEachGetTheirOwnRepliesOnOneSocket) {
  RedisServer server;
  SharedConnection shared(shared_opts(server));
  constexpr int kThreads = 16, kCalls = 300;
  std::vector<int> wrong(kThreads, 0), failed(kThreads, 0);
  std::vector<std::string> last_failure(kThreads);  // each thread's own message
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        const std::string a = "t" + std::to_string(t) + "-" + std::to_string(i);
        Error ec;
        if (i % 3 == 0) {  // a pipeline of three must come back whole and in order
          const std::string b = a + "b", c = a + "c";
          const std::vector<Argv> batch{{"ECHO", a}, {"ECHO", b}, {"ECHO", c}};
          auto r = shared.exchange(batch, ec);
          if (ec) {
            ++failed[t];
            last_failure[t] = ec.detail();
          } else if (r.size() != 3 || reply_str(r[0].get()) != a || reply_str(r[1].get()) != b ||
                     reply_str(r[2].get()) != c) {
            ++wrong[t];
          }
        } else {
          Reply r = shared.command({"ECHO", a}, ec);
          if (ec) {
            ++failed[t];
            last_failure[t] = ec.detail();
          } else if (reply_str(r.get()) != a) {
            ++wrong[t];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(wrong[t], 0) << "thread " << t;
    EXPECT_EQ(failed[t], 0) << "thread " << t << ": " << last_failure[t];
  }
  const auto st = shared.stats();
  EXPECT_EQ(st.connects, 1u);
  EXPECT_EQ(st.calls, static_cast<std::uint64_t>(kThreads) * kCalls);
  EXPECT_EQ(st.in_flight, 0u);
}

// While the server is stopped every thread's call is on the wire at once (none
// waits for another's reply, none opens a connection of its own); once it runs
// again each gets its own answer.
TEST(SharedRedisConnection, CallsFromManyThreadsOverlapOnTheWire) {
  RedisServer server;
  SharedConnection shared(shared_opts(server, Millis(30000)));
  ASSERT_NO_FATAL_FAILURE(ping_connects(shared));
  constexpr int kThreads = 8;
  server.pause();
  std::vector<std::string> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Error e;
      Reply r = shared.command({"ECHO", "x" + std::to_string(t)}, e);
      got[t] = e ? "error: " + e.detail() : std::string(reply_str(r.get()));
    });
  }
  const bool all_in_flight = eventually([&] { return shared.stats().in_flight == kThreads; });
  server.resume();
  for (auto& th : threads) th.join();
  EXPECT_TRUE(all_in_flight) << "in flight: " << shared.stats().in_flight;
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t], "x" + std::to_string(t));
  EXPECT_EQ(shared.stats().connects, 1u);
}

TEST(SharedRedisConnection, AStuckServerFailsEveryCallInFlightAndTheNextCallReconnects) {
  RedisServer server;
  SharedConnection shared(shared_opts(server, Millis(300)));
  Error ec;
  ASSERT_NO_FATAL_FAILURE(ping_connects(shared));
  server.pause();
  constexpr int kThreads = 4;
  std::vector<Error> codes(kThreads);
  std::vector<std::string> whys(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Reply r = shared.command({"PING"}, codes[t]);
      if (codes[t]) whys[t] = codes[t].detail();  // the call's own message
    });
  }
  for (auto& th : threads) th.join();
  server.resume();
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(codes[t], errc::backend_unavailable) << t;
    EXPECT_NE(whys[t].find(where), std::string::npos) << whys[t];
    EXPECT_NE(whys[t].find("no reply within 300 ms"), std::string::npos) << whys[t];
  }
  EXPECT_FALSE(shared.connected());
  Reply r = shared.command({"PING"}, ec);
  expect_answered_after_reconnect(shared, r, ec, "PONG");
}

TEST(SharedRedisConnection, ARestartedServerIsNoticedBeforeTheNextCall) {
  RedisServer server;
  SharedConnection shared(shared_opts(server));
  Error ec;
  ASSERT_NO_FATAL_FAILURE(ping_connects(shared));
  server.restart();
  Reply r = shared.command({"ECHO", "after"}, ec);  // not lost to the closed socket
  expect_answered_after_reconnect(shared, r, ec, "after");
}

TEST(SharedRedisConnection, AnErrorReplyKeepsTheConnection) {
  RedisServer server;
  SharedConnection shared(shared_opts(server));
  ASSERT_NO_FATAL_FAILURE(distlock::testing::expect_error_reply_keeps_link(shared, server.port()));
  EXPECT_EQ(shared.stats().connects, 1u);
}

TEST(SharedRedisConnection, DownServerAndWrongPasswordAreDistinctErrors) {
  ConnectionOptions o;
  o.port = distlock::testing::free_port();  // nobody listens there
  SharedConnection down(o);
  Error ec;
  EXPECT_FALSE(down.command({"PING"}, ec));
  EXPECT_EQ(ec, errc::backend_unavailable);
  EXPECT_NE(ec.detail().find("127.0.0.1:" + std::to_string(o.port)), std::string::npos) << ec.detail();

  RedisServer server({.password = "right"});
  ConnectionOptions bad = shared_opts(server);
  bad.password = "wrong";
  SharedConnection wrong(bad);
  wrong.command({"PING"}, ec);
  EXPECT_EQ(ec, errc::auth_failed) << ec.detail();
}

TEST(SharedRedisConnection, ScriptsRecoverFromAFlushedScriptCache) {
  RedisServer server;
  SharedConnection shared(shared_opts(server));
  static const Script kIncr("return redis.call('INCR', KEYS[1])");
  Error ec;
  Reply r = kIncr.run(shared, {"n"}, {}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(r->integer, 1);
  server.command({"SCRIPT", "FLUSH"});
  const std::string_view keys[] = {"n"};
  const Script::Call calls[] = {{keys, {}}, {keys, {}}};
  auto both = kIncr.run_pipelined(shared, calls, ec);
  ASSERT_FALSE(ec) << ec.detail();
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0]->integer, 2);
  EXPECT_EQ(both[1]->integer, 3);
}

}  // namespace
}  // namespace distlock::detail::redis
