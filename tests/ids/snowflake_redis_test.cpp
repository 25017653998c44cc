// Snowflake worker leases over a real redis-server: the lease is kept by the engine's
// renewer past its TTL; a worker lock deleted on the server stops the generator
// (errc::lost) and the freed worker id goes to somebody else; relet() finds another.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "distlock/distlock.hpp"
#include "distlock/ids.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {

namespace {

using ids::decode_snowflake;
using ids::SnowflakeGenerator;
using ids::SnowflakeOptions;
using namespace std::chrono_literals;

SnowflakeOptions short_lease() {
  SnowflakeOptions o;
  o.prefix = "t";
  // Renewed about every 330 ms by the client's renewer. Not 300 ms: its 100 ms renewals missed
  // their 200 ms of slack in an ASan run beside a compile (the lease was declared lost).
  o.lease.ttl = 1000ms;
  return o;
}

TEST(SnowflakeRedis, LeaseIsRenewedPastItsTtlAndStaysExclusive) {
  RedisServer redis;
  SnowflakeGenerator a(distlock::connect(redis.url()), short_lease());
  EXPECT_EQ(a.worker_id(), 0u);
  std::this_thread::sleep_for(3200ms);  // more than three TTLs
  EXPECT_TRUE(a.leased());
  SnowflakeGenerator b(distlock::connect(redis.url()), short_lease());
  EXPECT_EQ(b.worker_id(), 1u);
  EXPECT_EQ(decode_snowflake(a.next()).worker, 0u);
  EXPECT_EQ(decode_snowflake(b.next()).worker, 1u);
}

TEST(SnowflakeRedis, DeletedWorkerLockStopsIssuingUntilRelet) {
  RedisServer redis;
  auto client = distlock::connect(redis.url());
  SnowflakeGenerator gen(client, short_lease());
  const std::uint64_t before = gen.next();
  ASSERT_EQ(redis.command({"DEL", "distlock:{idgen:t:worker:0}"})->integer, 1);

  // The next renewal (within ~330 ms) finds the lock gone: the stop token fires.
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  while (!gen.stop_token().stop_requested() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(gen.stop_token().stop_requested());
  std::error_code ec;
  EXPECT_EQ(gen.next(ec), 0u);
  EXPECT_EQ(ec, errc::lost);

  // Somebody else takes the freed worker id 0; the old generator never issues under it.
  SnowflakeGenerator other(distlock::connect(redis.url()), short_lease());
  EXPECT_EQ(other.worker_id(), 0u);
  EXPECT_EQ(gen.next(ec), 0u);
  EXPECT_EQ(ec, errc::lost);

  gen.relet();
  EXPECT_EQ(gen.worker_id(), 1u);
  const std::uint64_t after = gen.next();
  EXPECT_GT(after, before);
  EXPECT_EQ(decode_snowflake(after).worker, 1u);
}

TEST(SnowflakeRedis, ServerDownAtStartIsBackendUnavailable) {
  const std::string url = "redis://127.0.0.1:" + std::to_string(free_port());
  try {
    SnowflakeGenerator gen(distlock::connect(url), short_lease());
    FAIL() << "a generator was made without a server";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::backend_unavailable) << e.what();
  }
}

}  // namespace

}  // namespace distlock::testing
