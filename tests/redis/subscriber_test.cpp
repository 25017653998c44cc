// redis::Subscriber against a real redis-server: confirmation before watch()
// returns, counted watches, delivery, reconnect with resubscription, prompt stop.
#include "redis/subscriber.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "support/fault_proxy.hpp"
#include "support/redis_probes.hpp"
#include "support/redis_server.hpp"

namespace distlock::detail::redis {
namespace {

using namespace std::chrono_literals;
using distlock::testing::RedisServer;
using distlock::testing::subscribers;
using Clock = std::chrono::steady_clock;

struct Seen {
  std::mutex mu;
  std::vector<std::string> channels;
  void add(std::string_view ch) {
    std::lock_guard lk(mu);
    channels.emplace_back(ch);
  }
  std::size_t count(const std::string& ch) {
    std::lock_guard lk(mu);
    return static_cast<std::size_t>(std::count(channels.begin(), channels.end(), ch));
  }
  bool wait_for(const std::string& ch, std::size_t n, std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      if (count(ch) >= n) return true;
      std::this_thread::sleep_for(5ms);
    }
    return count(ch) >= n;
  }
};

ConnectionOptions subscriber_opts(const RedisServer& s) {
  ConnectionOptions o;
  o.port = s.port();
  o.connect_timeout = 500ms;
  o.command_timeout = 500ms;
  return o;
}

TEST(RedisSubscriber, WatchIsLiveWhenItReturnsAndCounted) {
  RedisServer server;
  Seen seen;
  Subscriber sub(subscriber_opts(server), [&](std::string_view ch) { seen.add(ch); });
  Error ec;
  sub.watch("ch1", ec);
  ASSERT_FALSE(ec) << ec.detail();
  // Subscribed on the server before watch() returned: the publish reaches one client.
  EXPECT_EQ(server.command({"PUBLISH", "ch1", "x"})->integer, 1);
  EXPECT_TRUE(seen.wait_for("ch1", 1, 5s));

  sub.watch("ch1", ec);  // a second watch of the same channel
  ASSERT_FALSE(ec);
  sub.unwatch("ch1");
  EXPECT_EQ(subscribers(server, "ch1"), 1);  // still one watch left
  sub.unwatch("ch1");
  const auto end = Clock::now() + 5s;
  while (subscribers(server, "ch1") != 0 && Clock::now() < end) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(subscribers(server, "ch1"), 0);
  EXPECT_EQ(server.command({"PUBLISH", "ch1", "x"})->integer, 0);

  // Watch, unwatch, watch in quick succession ends subscribed.
  for (int i = 0; i < 20; ++i) {
    sub.watch("ch2", ec);
    ASSERT_FALSE(ec);
    EXPECT_EQ(server.command({"PUBLISH", "ch2", "x"})->integer, 1) << i;
    sub.unwatch("ch2");
  }
}

TEST(RedisSubscriber, ReconnectsAfterARestartAndWakesEveryWatcher) {
  RedisServer server;
  Seen seen;
  Subscriber sub(subscriber_opts(server), [&](std::string_view ch) { seen.add(ch); });
  Error ec;
  sub.watch("a", ec);
  ASSERT_FALSE(ec);
  sub.watch("b", ec);
  ASSERT_FALSE(ec);
  server.kill();
  // The broken connection wakes both watchers at once.
  EXPECT_TRUE(seen.wait_for("a", 1, 5s));
  EXPECT_TRUE(seen.wait_for("b", 1, 5s));

  // While the server is down a new watch fails clearly.
  sub.watch("c", ec);
  EXPECT_EQ(ec, errc::backend_unavailable);
  EXPECT_NE(ec.detail().find("127.0.0.1:" + std::to_string(server.port())), std::string::npos) << ec.detail();
  sub.unwatch("c");

  server.restart();
  // Resubscribed by itself; each watcher is woken once more after the resubscription.
  EXPECT_TRUE(seen.wait_for("a", 2, 10s));
  EXPECT_TRUE(seen.wait_for("b", 2, 10s));
  EXPECT_EQ(subscribers(server, "a"), 1);
  EXPECT_EQ(server.command({"PUBLISH", "b", "x"})->integer, 1);
  EXPECT_TRUE(seen.wait_for("b", 3, 5s));
  EXPECT_GE(sub.connects(), 2u);
}

TEST(RedisSubscriber, StopsPromptly) {
  RedisServer server;
  auto sub = std::make_unique<Subscriber>(subscriber_opts(server), [](std::string_view) {});
  Error ec;
  sub->watch("idle", ec);
  ASSERT_FALSE(ec);
  const auto start = Clock::now();
  sub.reset();
  EXPECT_LT(Clock::now() - start, 1s);

  // Also while it is waiting to reconnect to a dead server.
  auto down = std::make_unique<Subscriber>(subscriber_opts(server), [](std::string_view) {});
  down->watch("x", ec);
  ASSERT_FALSE(ec);
  server.kill();
  std::this_thread::sleep_for(200ms);
  const auto start2 = Clock::now();
  down.reset();
  EXPECT_LT(Clock::now() - start2, 1s);
}

TEST(RedisSubscriber, ARefusedSubscribeFailsAtOnceWithTheServersReasonAndIsNotRetried) {
  // An ACL user without channel permissions (Redis 7 gives new users none): the
  // connection and AUTH succeed, every SUBSCRIBE is answered with NOPERM.
  RedisServer server({.extra_args = {"--user", "nochan", "on", ">pw", "~*", "+@all"}});
  Seen seen;
  ConnectionOptions o = subscriber_opts(server);
  o.user = "nochan";
  o.password = "pw";
  Subscriber sub(o, [&](std::string_view ch) { seen.add(ch); });
  Error ec;
  const auto start = Clock::now();
  sub.watch("denied", ec);
  const auto took = Clock::now() - start;
  EXPECT_EQ(ec, errc::auth_failed) << ec.detail();
  EXPECT_NE(ec.detail().find("NOPERM"), std::string::npos) << ec.detail();
  EXPECT_NE(ec.detail().find("denied"), std::string::npos) << ec.detail();
  EXPECT_LT(took, 900ms);  // the answer, not the 1 s confirmation timeout
  // The failed watch does not count: nothing is sent again.
  auto subscribes = [&]() -> long long {  // SUBSCRIBEs refused by the ACL
    auto r = server.command({"INFO", "commandstats"});
    const std::string info(r->str, r->len);
    const auto line = info.find("cmdstat_subscribe:");
    if (line == std::string::npos) return 0;
    const auto at = info.find("rejected_calls=", line);
    return at == std::string::npos ? -1 : std::stoll(info.substr(at + 15));
  };
  const long long sent = subscribes();
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(subscribes(), sent);
  EXPECT_EQ(subscribers(server, "denied"), 0);
  // A later watch asks again (and is refused again).
  sub.watch("denied", ec);
  EXPECT_EQ(ec, errc::auth_failed);
  EXPECT_EQ(subscribes(), sent + 1);
}

// A watch kept after its confirmation did not come in time (Redlock subscribes on
// every master and waits for none longer than its confirm timeout): when the
// confirmation does come, the channel is reported once, because a release published
// before the server ran the SUBSCRIBE was not delivered. Here the server is paused
// with SIGSTOP while the SUBSCRIBE is in flight.
TEST(RedisSubscriber, AKeptWatchIsReportedWhenItsLateConfirmationArrives) {
  RedisServer server;
  Seen seen;
  Subscriber sub(subscriber_opts(server), [&](std::string_view ch) { seen.add(ch); });
  Error ec;
  sub.watch("up", ec);  // the connection is up
  ASSERT_FALSE(ec) << ec.detail();
  server.pause();
  const auto started = sub.begin_watch("late");
  EXPECT_FALSE(sub.await_watch("late", started, Clock::now() + 200ms, /*keep_on_failure=*/true, ec));
  EXPECT_TRUE(ec);
  server.resume();
  // The SUBSCRIBE, queued in the paused server's socket, is confirmed now: the
  // channel is reported although nobody published on it.
  EXPECT_TRUE(seen.wait_for("late", 1, 5s));
  EXPECT_EQ(seen.count("up"), 0u);
  // And it is live: a publish reaches it.
  EXPECT_EQ(server.command({"PUBLISH", "late", "x"})->integer, 1);
  EXPECT_TRUE(seen.wait_for("late", 2, 5s));
  sub.unwatch("late");
  sub.unwatch("up");
}

// The same when the subscriber could not connect at all while the watch was awaited:
// its first connection later subscribes the kept channel and reports it.
TEST(RedisSubscriber, AKeptWatchIsReportedWhenTheFirstConnectionComesUpLater) {
  RedisServer server;
  server.pause();  // TCP connects, the PING of the connection setup goes unanswered
  Seen seen;
  Subscriber sub(subscriber_opts(server), [&](std::string_view ch) { seen.add(ch); });
  const auto started = sub.begin_watch("first");
  Error ec;
  EXPECT_FALSE(sub.await_watch("first", started, Clock::now() + 200ms, /*keep_on_failure=*/true, ec));
  server.resume();
  EXPECT_TRUE(seen.wait_for("first", 1, 10s));
  EXPECT_EQ(server.command({"PUBLISH", "first", "x"})->integer, 1);
  sub.unwatch("first");
}

// A subscriber connection that dies silently (frozen: no FIN, no RST, TCP does not
// notice for minutes) is noticed within kPingEvery + command_timeout: the
// subscriber PINGs after a second of silence and drops a connection that does not
// answer within the command timeout, counts it (silent_drops, shown in the redis
// stats), tells every watched channel (waiters re-check), and reconnects. Measured
// on this process's steady clock; bound 1 s + 500 ms, asserted with 2 s of slack
// for a loaded host.
TEST(RedisSubscriber, ASilentlyDeadConnectionIsNoticedByPingAndReplaced) {
  RedisServer server;
  distlock::testing::FaultProxy proxy(server.port());
  ConnectionOptions o = subscriber_opts(server);
  o.port = proxy.port();
  Seen seen;
  Subscriber sub(o, [&](std::string_view ch) { seen.add(ch); });
  Error ec;
  sub.watch("frozen", ec);
  ASSERT_FALSE(ec) << ec.detail();
  ASSERT_EQ(sub.connects(), 1u);
  // Quiet for several ping periods: an answered PING never drops the connection.
  std::this_thread::sleep_for(3s);
  EXPECT_EQ(sub.silent_drops(), 0u);
  EXPECT_EQ(seen.count("frozen"), 0u);
  const auto frozen_at = Clock::now();
  proxy.freeze();
  ASSERT_TRUE(seen.wait_for("frozen", 1, 10s)) << "the dead connection was never noticed";
  const auto noticed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - frozen_at);
  std::printf("subscriber: a frozen connection noticed after %lld ms\n",
              static_cast<long long>(noticed.count()));
  EXPECT_LE(noticed, 1500ms + 2000ms);
  EXPECT_EQ(sub.silent_drops(), 1u);
  EXPECT_NE(sub.last_failure().detail().find("PING"), std::string::npos) << sub.last_failure().detail();
  // The network comes back: a new connection, subscribed again, delivers.
  proxy.pass();
  ASSERT_TRUE(seen.wait_for("frozen", 2, 10s)) << "no resubscription: " << sub.last_failure().detail();
  EXPECT_GE(sub.connects(), 2u);
  const auto before = seen.count("frozen");
  EXPECT_EQ(server.command({"PUBLISH", "frozen", "x"})->integer, 1);
  EXPECT_TRUE(seen.wait_for("frozen", before + 1, 5s));
}

}  // namespace
}  // namespace distlock::detail::redis
