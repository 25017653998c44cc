// A shard group on a backend that watches (redis://, a real redis-server started by the test)
// follows the group from its watches' events, not by listing it every period
// (src/api/shard_group.cpp, docs/sharding.md "How it works"):
//   - the steady state lists nothing: INFO commandstats shows no SCAN (what Client::list is on
//     redis) over 20 rebalance periods while nothing changes (polling, the same three members
//     make 2 SCANs each per period: 118 seen with the group forced to poll);
//   - a gap leads to a re-list and correct ownership: while the watcher-presence key is gone the
//     lock scripts publish nothing, so a member that joins then is never an event; its peers'
//     watches find the lapse at their next renewal (5 s), report a gap and re-list, and the
//     group balances over the three (without the re-list the two others would own all shards
//     until the safety re-list 30 s later: with the gap's `state`s ignored, seen failing with
//     a 4, b 4, c 0 after 20 s).
// Times are measured on this process's steady clock; each bound is stated where it is asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "shard_group/watching_members.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::Millis;
using distlock::testing::RedisServer;
using SteadyClock = std::chrono::steady_clock;
using namespace distlock::testing::shard_watch;

constexpr Millis kPresenceRenewal = 5000ms;  // a redis watch renews its presence key this often

TEST(ShardGroupWatch, TheSteadyStateListsNothingPerPeriod) {
  RedisServer server;
  constexpr std::uint32_t kShards = 16;
  Member a = join(server, "steady", kShards, "a");
  Member b = join(server, "steady", kShards, "b");
  Member c = join(server, "steady", kShards, "c");
  std::vector<Member*> all{&a, &b, &c};
  ASSERT_TRUE(wait_until([&] { return balanced(all, kShards); }, kDeadline)) << "not balanced within 20 s";
  for (auto* m : all) EXPECT_TRUE(m->group.stats().watching) << m->group.member_id() << " polls";
  const std::vector<std::set<std::uint32_t>> before{owned_by(a), owned_by(b), owned_by(c)};
  std::vector<std::uint64_t> rebalances0;
  for (auto* m : all) rebalances0.push_back(m->group.stats().rebalances);
  const long long scans0 = server.command_calls("scan");
  const auto t0 = SteadyClock::now();
  // The window itself is what is measured: 20 periods with nothing changing.
  std::this_thread::sleep_for(kPeriod * 20);
  const long long scans1 = server.command_calls("scan");
  const std::int64_t window = ms_since(t0);
  ASSERT_GE(window, (kPeriod * 20).count());
  EXPECT_EQ(scans1 - scans0, 0) << "SCANs over " << window
                                << " ms of a steady group of 3 (polling makes about " << 3 * 2 * 20 << ")";
  // Nothing moved meanwhile, and no member needed a safety re-list (every 30 s at the least).
  EXPECT_EQ(owned_by(a), before[0]);
  EXPECT_EQ(owned_by(b), before[1]);
  EXPECT_EQ(owned_by(c), before[2]);
  for (auto* m : all) EXPECT_EQ(m->group.stats().safety_relists, 0U) << m->group.member_id();
  // No member's target changed either (a plan flapping between two answers would start and
  // cancel waiters without moving a shard).
  for (std::size_t k = 0; k < all.size(); ++k)
    EXPECT_EQ(all[k]->group.stats().rebalances, rebalances0[k]) << all[k]->group.member_id();
  std::printf("steady group of 3 x %u shards: %lld SCANs in %lld ms\n", kShards, scans1 - scans0,
              static_cast<long long>(window));
}

TEST(ShardGroupWatch, AGapLeadsToARelistAndCorrectOwnership) {
  RedisServer server;
  constexpr std::uint32_t kShards = 8;
  Member a = join(server, "gap", kShards, "a");
  Member b = join(server, "gap", kShards, "b");
  ASSERT_TRUE(wait_until([&] { return balanced({&a, &b}, kShards); }, kDeadline)) << "a and b not balanced";
  ASSERT_TRUE(a.group.stats().watching);
  ASSERT_TRUE(b.group.stats().watching);
  const auto gaps_a = a.group.stats().watch_gaps;
  const auto gaps_b = b.group.stats().watch_gaps;
  const long long scans0 = server.command_calls("scan");
  // The presence key lapses (an eviction, a restart without persistence): c's membership is
  // taken while no script publishes, so a and b never get it as an event.
  ASSERT_EQ(server.command({"DEL", "distlock:watching"})->integer, 1);
  const auto t0 = SteadyClock::now();
  Member c = join(server, "gap", kShards, "c");
  // a's and b's watches find the lapse at their next renewal (at most kPresenceRenewal plus a
  // round trip), report a gap, re-list, and the group rebalances: one period, a release and
  // an acquisition.
  const Millis bound = kPresenceRenewal + kPeriod + kSlack;
  const auto took = ms_until_balanced({&a, &b, &c}, kShards, t0);
  ASSERT_TRUE(took) << "a, b, c not balanced within 20 s of c's join: " << owned_counts({&a, &b, &c});
  EXPECT_LE(*took, bound.count()) << "balanced " << *took << " ms after c joined in the lapse";
  EXPECT_GE(a.group.stats().watch_gaps, gaps_a + 1);
  EXPECT_GE(b.group.stats().watch_gaps, gaps_b + 1);
  EXPECT_GT(server.command_calls("scan"), scans0) << "no re-list after the gap";
  // Not the safety re-list (every 30 s at the least): the gap's.
  EXPECT_EQ(a.group.stats().safety_relists, 0U);
  EXPECT_EQ(b.group.stats().safety_relists, 0U);
  std::printf("c joined while the presence key was gone: balanced over 3 after %lld ms (bound %lld)\n",
              static_cast<long long>(*took), static_cast<long long>(bound.count()));
}

}  // namespace
