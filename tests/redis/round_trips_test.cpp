// Client::stats().round_trips on redis:// against a real redis-server: the transports count
// one per command, per pipelined batch and per subscriber write into the counter their
// options carry, and a known sequence of client calls adds a known count.
#include "engine/round_trips.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "redis/connection.hpp"
#include "redis/shared_connection.hpp"
#include "support/backend_names.hpp"
#include "support/client_options.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;
using detail::RoundTrips;
namespace redis = detail::redis;

redis::ConnectionOptions counted_options(const RedisServer& server, std::shared_ptr<RoundTrips> counter) {
  redis::ConnectionOptions o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.connect_timeout = distlock::Millis(1000);
  o.command_timeout = distlock::Millis(1000);
  o.round_trips = std::move(counter);
  return o;
}

// Two connections of one counter: each command one, a pipeline of three one, a shared
// connection's batch of five one; the connect handshake (no password, db 0) none.
TEST(RedisRoundTrips, TransportsCountCommandsAndBatchesIntoTheirCounter) {
  RedisServer server;
  auto counter = std::make_shared<RoundTrips>();
  redis::Connection conn(counted_options(server, counter));
  redis::SharedConnection shared(counted_options(server, counter));
  Error ec;
  conn.command({"SET", "k", "v"}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  conn.command({"GET", "k"}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(counter->count(), 2u);
  const std::vector<redis::Argv> three{{"INCR", "n"}, {"INCR", "n"}, {"GET", "n"}};
  auto replies = conn.exchange(three, ec);
  ASSERT_FALSE(ec) << ec.detail();
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(redis::reply_str(replies[2].get()), "2");
  EXPECT_EQ(counter->count(), 3u);
  const std::vector<redis::Argv> five(5, redis::Argv{"PING"});
  replies = shared.exchange(five, ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(replies.size(), 5u);
  EXPECT_EQ(counter->count(), 4u);
  shared.command({"GET", "k"}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(counter->count(), 5u);
  // A connection without a counter counts only its own.
  redis::Connection uncounted(counted_options(server, nullptr));
  uncounted.command({"GET", "k"}, ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(uncounted.round_trips(), 1u);
  EXPECT_EQ(counter->count(), 5u);
}

// A client's known calls on free names, after a first pass that loaded the scripts (a
// NOSCRIPT answer costs a SCRIPT LOAD and a second EVALSHA): an attempt on a free name is
// one script call, a release one, a status one, and a renewal of three leases one pipeline.
// TTL 60 s: no renewal of the background renewer falls inside the counted calls.
TEST(RedisRoundTrips, ClientCallsAddAKnownCount) {
  RedisServer server;
  auto client = distlock::connect(server.url());
  const auto opts = ttl_of(60s);
  {
    auto warm = client.try_acquire("warm", opts);
    ASSERT_TRUE(warm);
    (void)client.status("warm");
    EXPECT_EQ(client.renew_now(), 1u);
  }  // released
  const auto start = client.stats().round_trips;
  EXPECT_GT(start, 0u);

  auto a = client.try_acquire("a", opts);
  ASSERT_TRUE(a);
  EXPECT_EQ(client.stats().round_trips - start, 1u);
  auto b = client.try_acquire("b", opts);
  auto c = client.try_acquire("c", opts);
  ASSERT_TRUE(b && c);
  EXPECT_EQ(client.stats().round_trips - start, 3u);

  EXPECT_TRUE(client.status("a").held);
  EXPECT_EQ(client.stats().round_trips - start, 4u);

  const auto renew_batches = client.stats().renew_round_trips;
  EXPECT_EQ(client.renew_now(), 3u);
  EXPECT_EQ(client.stats().renew_round_trips - renew_batches, 1u);
  EXPECT_EQ(client.stats().round_trips - start, 5u);

  a->release();
  b->release();
  c->release();
  EXPECT_EQ(client.stats().round_trips - start, 8u);
  // A busy attempt is one call too.
  auto other = distlock::connect(server.url());
  auto held = other.try_acquire("a", opts);
  ASSERT_TRUE(held);
  const auto before_busy = client.stats().round_trips;
  EXPECT_FALSE(client.try_acquire("a", opts));
  EXPECT_EQ(client.stats().round_trips - before_busy, 1u);
}

}  // namespace

}  // namespace distlock::testing
