// OwnedShard::held(): the check a shard's user makes right before a write, evaluated against
// the shard lease's local deadline at the moment of the call, never late.
//
// The shard group runs on the in-process memory:// backend with a manual clock and no
// background renewer: the engine's watchdog, which fires a lost lease's stop token at its
// local deadline, never runs unless the test calls tick(). That is the watchdog of a starved
// process (a thread that has not been scheduled yet, a process resumed from SIGSTOP): the
// deadline has passed and the stop token has not fired. held() must already say false then,
// and must follow the deadline as renewals move it.
//
// Every wait on the group's own thread is bounded by kWait (real time, this process's steady
// clock); the lease times are on the manual clock and exact.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "support/memory_fixture.hpp"

using namespace std::chrono_literals;
using distlock::Millis;

namespace {

constexpr Millis kTtl = 10s;    // local deadline = grant's send time + ttl - safety margin (ttl/10)
constexpr Millis kMargin = 1s;  // the default safety margin at kTtl
constexpr Millis kWait = 10s;   // real-time bound of waiting for the group's first assignment

struct ShardHeldTest : distlock::testing::ManualMemoryTest {
  distlock::ShardGroupOptions group_options() {
    distlock::ShardGroupOptions o;
    o.lock.ttl = kTtl;
    // One rebalance at the start, then none during the test: nothing but the test's own
    // tick() looks at the leases, so the stop tokens stay as the watchdog left them.
    o.rebalance_period = std::chrono::hours(1);
    o.member_id = "m1";
    return o;
  }
  // The single shard of a one-member group, once assigned (fails the test otherwise).
  distlock::OwnedShard first_shard(const distlock::ShardGroup& g) {
    const distlock::ShardAssignment a = g.wait_change(0, kWait);
    EXPECT_EQ(a.shards.size(), 1U) << "no assignment within " << kWait.count() << " ms";
    return a.shards.empty() ? distlock::OwnedShard{} : a.shards.front();
  }
};

TEST_F(ShardHeldTest, FalseOnceTheLocalDeadlinePassedThoughTheStopTokenHasNotFired) {
  distlock::Client c = client();
  distlock::ShardGroup g = c.shard_group("held-job", 1, group_options());
  const distlock::OwnedShard s = first_shard(g);
  ASSERT_TRUE(s.held());
  // 1 ms before the local deadline: still held.
  clock->advance(kTtl - kMargin - 1ms);
  EXPECT_TRUE(s.held());
  EXPECT_FALSE(s.stop.stop_requested());
  // At the deadline the watchdog has not run: its stop token is still unrequested, and a user
  // who checked it would write as an owner. held() reads the deadline itself.
  clock->advance(1ms);
  EXPECT_FALSE(s.stop.stop_requested()) << "the watchdog ran: the test shows nothing about a late one";
  EXPECT_FALSE(s.held()) << "held() says owned past the shard lease's local deadline";
  // The late watchdog fires the stop token; held() stays false.
  distlock::detail::engine_of(c)->tick();
  EXPECT_TRUE(s.stop.stop_requested());
  EXPECT_FALSE(s.held());
}

TEST_F(ShardHeldTest, FollowsTheDeadlineARenewalExtended) {
  distlock::Client c = client();
  distlock::ShardGroup g = c.shard_group("held-renew", 1, group_options());
  const distlock::OwnedShard s = first_shard(g);
  ASSERT_TRUE(s.held());
  // Half a TTL on, a renewal (sent now) moves the deadline to now + ttl - margin.
  clock->advance(kTtl / 2);
  distlock::detail::engine_of(c)->tick();
  ASSERT_FALSE(s.stop.stop_requested());
  // Past the first deadline, before the renewed one: held (a copy of the first deadline
  // would say lost here).
  clock->advance(kTtl / 2 - kMargin + 1ms);
  EXPECT_TRUE(s.held()) << "held() kept the deadline of the grant, not the renewed one";
  // Past the renewed deadline, no watchdog yet: not held.
  clock->advance(kTtl / 2);
  EXPECT_FALSE(s.stop.stop_requested());
  EXPECT_FALSE(s.held());
}

TEST_F(ShardHeldTest, FalseOnceGivenUpAndForAnEmptyShard) {
  distlock::Client c = client();
  distlock::ShardGroup g = c.shard_group("held-leave", 1, group_options());
  const distlock::OwnedShard s = first_shard(g);
  const distlock::OwnedShard copy = s;  // copies share the check
  ASSERT_TRUE(copy.held());
  g.leave();
  EXPECT_FALSE(s.held());
  EXPECT_FALSE(copy.held());
  EXPECT_FALSE(distlock::OwnedShard{}.held());
}

}  // namespace
