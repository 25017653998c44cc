// redis:// counts a handed-off grant on the client's injected clock
// (ClientOptions::clock), the clock the engine counts every lease on. A waiter's lease
// counts from the send time of the last call the server answered while its entry was
// queued; if that time and "now" are read on another clock (std::chrono::steady_clock
// stops during a host suspend while the engine's CLOCK_BOOTTIME and the server's TTL
// run on), a grant that arrived before a suspend is handed to the engine with the
// suspend's length added to its validity: the holder outlives the server's grant.
// The test moves a manual clock between the grant's arrival and its use.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/url.hpp"
#include "redis/redis_backend.hpp"
#include "redis/wait_queue.hpp"
#include "support/eventually.hpp"
#include "support/manual_clock.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::Millis;
using distlock::detail::Error;

struct NoListener final : distlock::detail::ChangeListener {
  void on_change(std::string_view) noexcept override {}
  void on_session_lost() noexcept override {}
  void on_lease_lost(std::string_view, std::string_view) noexcept override {}
  void on_validity_changed(Millis) noexcept override {}
};

TEST(RedisClock, AGrantThatArrivedBeforeAPauseIsCountedOnTheInjectedClock) {
  distlock::testing::RedisServer server;
  auto clock = std::make_shared<distlock::testing::ManualClock>();
  distlock::ClientOptions opts;
  opts.clock = clock;
  opts.logger = [](distlock::LogLevel, std::string_view) {};
  distlock::detail::Url url;
  distlock::detail::Error make_ec;
  ASSERT_FALSE(make_ec = distlock::detail::parse_url(server.url(), url)) << make_ec.detail();
  auto waiter = distlock::detail::make_redis_backend(url, opts, make_ec);
  ASSERT_TRUE(waiter) << make_ec.detail();
  NoListener listener;
  waiter->set_listener(&listener);

  distlock::ClientOptions holder_opts;
  holder_opts.logger = opts.logger;
  distlock::Client holder_client = distlock::connect(server.url(), holder_opts);
  distlock::LockOptions lo;
  lo.ttl = 9s;
  distlock::Lease holder = holder_client.acquire("paused", lo);

  const distlock::detail::AcquireRequest req{"paused", "waiter:1.1", 9s, /*keep_queued=*/true};
  Error ec;
  auto first = waiter->try_acquire(req, ec);  // queued at the manual clock's T0
  ASSERT_FALSE(ec) << ec.message() << ec.suffix();
  ASSERT_FALSE(first.acquired);

  holder.release();  // the release script grants the lock to the waiter's entry
  ASSERT_TRUE(distlock::testing::eventually(
      [&] { return distlock::detail::redis_stats(*waiter)->grants_received == 1; }, 10s));

  // The waiter's host is paused for 6 s after the grant arrived: of the 9 s the server
  // gave the grant, at most 3 s are left when the waiter goes on.
  clock->advance(6s);
  const long long calls_before = server.command_calls("evalsha") + server.command_calls("eval");
  auto granted = waiter->try_acquire(req, ec);
  const long long calls_after = server.command_calls("evalsha") + server.command_calls("eval");
  ASSERT_FALSE(ec) << ec.message() << ec.suffix();
  ASSERT_TRUE(granted.acquired);
  if (calls_after == calls_before) {
    // Answered from the grant message, without a round trip: the validity is what is
    // left of the grant on the injected clock.
    EXPECT_LE(granted.validity, 3000ms) << "a grant that arrived 6 s (on the client's clock) before it was "
                                           "used was counted as if no time had passed";
  } else {
    // Claimed from the server, which restarts the lock's TTL after this call was sent.
    auto pttl = server.command({"PTTL", "distlock:{paused}"});
    ASSERT_TRUE(pttl);
    EXPECT_GE(Millis(pttl->integer), granted.validity - 1000ms);
  }
}

// A grant message marks the wait granted with its token (the waiter then claims it
// from the server: a grant holds the lock only for the claim window), whether or not
// a "queued" answer came before it; a second message for the same entry changes
// nothing, and a grant of an entry this client does not know is handed back.
TEST(RedisClock, AGrantMessageMarksTheWaitForItsClaim) {
  using distlock::detail::redis::WaitQueue;
  auto clock = std::make_shared<distlock::testing::ManualClock>();
  clock->advance(-std::chrono::hours(1000));
  WaitQueue q(
      clock, [](const std::vector<WaitQueue::Wait>& ws) { return std::vector<WaitQueue::Answer>(ws.size()); },
      [](std::string_view) {}, [](const WaitQueue::Wait&) { return true; });
  const WaitQueue::Begun w = q.begin("n", "o", Millis(9000));
  const std::string key = "distlock:{n}";
  EXPECT_FALSE(q.on_grant(w.entry + " 7 " + std::to_string(key.size()) + " " + key + "o").has_value());
  const WaitQueue::Begun granted = q.begin("n", "o", Millis(9000));
  ASSERT_TRUE(granted.granted);
  EXPECT_EQ(granted.token, 7u);
  EXPECT_FALSE(q.on_grant(w.entry + " 9 " + std::to_string(key.size()) + " " + key + "o").has_value());
  EXPECT_EQ(q.begin("n", "o", Millis(9000)).token, 7u);

  const WaitQueue::Begun w2 = q.begin("m", "o", Millis(9000));
  q.queued("m", "o", w2.entry);
  const std::string key2 = "distlock:{m}";
  q.on_grant(w2.entry + " 8 " + std::to_string(key2.size()) + " " + key2 + "o");
  const WaitQueue::Begun g2 = q.begin("m", "o", Millis(9000));
  ASSERT_TRUE(g2.granted);
  EXPECT_EQ(g2.token, 8u);

  const auto unknown = q.on_grant("12345 3 " + std::to_string(key2.size()) + " " + key2 + "o");
  ASSERT_TRUE(unknown.has_value());
  EXPECT_EQ(unknown->entry, "12345");
  EXPECT_EQ(unknown->lock, key2);
  EXPECT_EQ(unknown->owner, "o");
}

}  // namespace
