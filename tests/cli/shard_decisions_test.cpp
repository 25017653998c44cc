// The decisions of `distlock run --shards` (src/cli/run/shard_decisions.hpp): which shards a
// job is started with, kept on and told of, and when the runner wakes up to act on a deadline.
//
// On the memory:// backend with a manual clock and no background renewer: the engine's
// watchdog, which fires a lost lease's stop token, runs only when the test calls tick(). That
// is the watchdog of a starved runner: the shard's local deadline has passed and its stop
// token has not fired. The decisions must already drop the shard then, and the runner's
// wake-up must fall at the deadline, not at the stop.
#include "cli/run/shard_decisions.hpp"

#include <gtest/gtest.h>

#include <chrono>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "support/memory_fixture.hpp"

using namespace std::chrono_literals;
using distlock::Millis;
using distlock::cli::run::ms_until_first_deadline;
using distlock::cli::run::shard_usable;
using distlock::cli::run::usable_shards;

namespace {

constexpr Millis kTtl = 10s;    // local deadline = grant's send time + ttl - safety margin (ttl/10)
constexpr Millis kMargin = 1s;  // the default safety margin at kTtl
constexpr Millis kWait = 10s;   // real-time bound of waiting for the group's assignment

struct ShardDecisionsTest : distlock::testing::ManualMemoryTest {
  distlock::ShardGroupOptions group_options() {
    distlock::ShardGroupOptions o;
    o.lock.ttl = kTtl;
    o.rebalance_period = std::chrono::hours(1);  // one rebalance at the start, then none
    o.member_id = "runner";
    return o;
  }
  // The assignment with all `n` shards of a one-member group (fails the test otherwise).
  std::vector<distlock::OwnedShard> all_shards(const distlock::ShardGroup& g, std::size_t n) {
    distlock::ShardAssignment a = g.wait_change(0, kWait);
    for (int i = 0; i < 100 && a.shards.size() < n; ++i) a = g.wait_change(a.version, kWait);
    EXPECT_EQ(a.shards.size(), n) << "not all shards assigned within the bound";
    return a.shards;
  }
};

TEST_F(ShardDecisionsTest, AShardPastItsDeadlineIsNotUsableBeforeItsStopTokenFires) {
  distlock::Client c = client();
  distlock::ShardGroup g = c.shard_group("decide-job", 1, group_options());
  const std::vector<distlock::OwnedShard> shards = all_shards(g, 1);
  ASSERT_EQ(shards.size(), 1U);
  EXPECT_TRUE(shard_usable(shards.front()));
  EXPECT_EQ(usable_shards(shards).size(), 1U);
  clock->advance(kTtl - kMargin);  // at the local deadline; the watchdog has not run
  ASSERT_FALSE(shards.front().stop.stop_requested()) << "the watchdog ran: the test shows nothing";
  EXPECT_FALSE(shard_usable(shards.front())) << "a job would be started or kept on a shard past its deadline";
  EXPECT_TRUE(usable_shards(shards).empty());
  EXPECT_EQ(ms_until_first_deadline(shards), -1);
}

TEST_F(ShardDecisionsTest, TheWakeUpFallsAtTheEarliestDeadlineNotAtTheStop) {
  distlock::Client c = client();
  distlock::ShardGroup g = c.shard_group("decide-wake", 2, group_options());
  const std::vector<distlock::OwnedShard> shards = all_shards(g, 2);
  ASSERT_EQ(shards.size(), 2U);
  // Both granted at manual time 0: a wake-up at the deadline (+1 ms, rounded up).
  const int first = ms_until_first_deadline(shards);
  EXPECT_GE(first, static_cast<int>((kTtl - kMargin).count()));
  EXPECT_LE(first, static_cast<int>((kTtl - kMargin).count()) + 2);
  // Half a TTL on: the wake-up has come nearer by that much (no renewal has run).
  clock->advance(kTtl / 2);
  const int later = ms_until_first_deadline(shards);
  EXPECT_GE(later, static_cast<int>((kTtl - kMargin - kTtl / 2).count()));
  EXPECT_LE(later, static_cast<int>((kTtl - kMargin - kTtl / 2).count()) + 2);
  // At the wake-up time both deadlines have passed: nothing is usable, nothing to wait for.
  clock->advance(Millis(later));
  EXPECT_TRUE(usable_shards(shards).empty());
  EXPECT_EQ(ms_until_first_deadline(shards), -1);
}

}  // namespace
