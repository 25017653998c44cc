// redis+cluster://'s lock-delay marker (docs/design.md "Lock-delay", docs/redis-cluster.md
// "Lock-delay") through slot migrations:
//   - a lease with lock_delay D keeps renewing while its slot migrates (its keys still on the
//     source, then moved), its marker outlives the lock by D on whichever node has the slot,
//     a contender is told busy throughout, and a normal release ends the delay at once;
//   - a SIGKILLed holder's marker moves with the slot (MIGRATE keeps its expiry): on the new
//     node nobody is granted the name before the kill plus D, and the name is granted soon
//     after (no stall).
// Every instant is read on this process's steady clock; the nodes run on this host.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "distlock/distlock.hpp"
#include "rediscluster/cluster_backend.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/lock_delay_grant.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_lock_delay.hpp"

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

// One try_acquire: {granted, error text ("" when none)}; a lease granted is released.
std::pair<bool, std::string> try_once(distlock::Client& c, const std::string& name, Millis ttl) {
  try {
    auto got = c.try_acquire(name, delay_opts(ttl, 0ms));
    if (!got) return {false, ""};
    got->release();
    return {true, ""};
  } catch (const std::system_error& e) {
    return {false, e.what()};
  }
}

// PTTL of the lock and of its marker on `node`, read in one script (one server instant).
// ASKING first: the slot may be importing there.
std::pair<long long, long long> pttls(distlock::testing::RedisServer& node,
                                      const distlock::detail::rediscluster::NameKeys& k) {
  return distlock::testing::lock_and_marker_pttl(node, k.lock, k.delay);
}

// The slot migrates from node 0 to node 1 under a held lease with TTL 1 s and D 1.5 s: three
// TTLs (about nine renewals) with the slot MIGRATING and the keys still on the source, then
// the keys moved and the slot assigned to node 1. The lease is never lost, the marker stays
// D (± 2 ms: two PTTLs of one script, rounded) past the lock on the node that has them, a
// contender is busy (not an error) before and after the keys move, and the release deletes
// the marker: the contender takes the name at once.
TEST(RedisClusterLockDelay, AHeldLeaseKeepsItsMarkerThroughAMigrationAndAReleaseEndsIt) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(0, "delay-migrating");
  const auto k = distlock::detail::rediscluster::keys_of("distlock", name);
  auto holder = distlock::connect(cluster.url(), quiet());
  auto contender = distlock::connect(cluster.url(), quiet());
  constexpr Millis kTtl = 1000ms;
  constexpr Millis kDelay = 1500ms;
  auto lease = holder.acquire(name, delay_opts(kTtl, kDelay));
  {
    const auto [l, m] = pttls(cluster.node(0), k);
    ASSERT_GT(l, 0);
    EXPECT_NEAR(static_cast<double>(m - l), static_cast<double>(kDelay.count()), 2.0);
  }
  cluster.begin_move(k.slot, 0, 1);
  const auto until = Steady::now() + 3 * kTtl;
  int busy_seen = 0;
  while (Steady::now() < until) {
    const auto [got, error] = try_once(contender, name, kTtl);
    EXPECT_EQ(error, "") << "a contender of a held lock in a migrating slot got an error";
    EXPECT_FALSE(got) << "a contender was granted a held lock";
    if (error.empty() && !got) ++busy_seen;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_GE(busy_seen, 10);
  ASSERT_TRUE(lease.owns()) << "the lease was lost while its slot migrated (keys on the source)";
  {
    const auto [l, m] = pttls(cluster.node(0), k);
    ASSERT_GT(l, 0) << "the lock was not renewed on the source";
    EXPECT_NEAR(static_cast<double>(m - l), static_cast<double>(kDelay.count()), 2.0);
  }
  cluster.migrate_keys(k.slot, 0, 1);
  {
    const auto [got, error] = try_once(contender, name, kTtl);
    EXPECT_EQ(error, "") << "a contender of a held lock whose keys moved (ASK) got an error";
    EXPECT_FALSE(got);
  }
  cluster.finish_move(k.slot, 0, 1);
  // Renewals now run on node 1: wait for one (the lock's TTL there goes up), then compare.
  long long first = pttls(cluster.node(1), k).first;
  ASSERT_TRUE(eventually([&] { return pttls(cluster.node(1), k).first > first; }, 2 * kTtl))
      << "no renewal reached the new node";
  {
    const auto [l, m] = pttls(cluster.node(1), k);
    ASSERT_GT(l, 0);
    EXPECT_NEAR(static_cast<double>(m - l), static_cast<double>(kDelay.count()), 2.0);
  }
  ASSERT_TRUE(lease.owns());
  lease.release();
  EXPECT_EQ(pttls(cluster.node(1), k).second, -2) << "a normal release left the lock-delay marker";
  auto next = contender.try_acquire(name, delay_opts(kTtl, 0ms));
  ASSERT_TRUE(next.has_value()) << "a normal release did not hand the name on at once";
  next->release();
}

// One client renews leases with and without a lock-delay on the same node in one batch (the
// renewal splits them into a call with markers and one without): six names on node 0, D 1.5 s
// on every other one, TTL 1 s, for three TTLs (about nine renewals). All are still held, each
// marker is D (± 2 ms) past its lock, and the leases without D have none.
TEST(RedisClusterLockDelay, LeasesWithAndWithoutADelayRenewTogether) {
  RedisCluster cluster(3);
  auto c = distlock::connect(cluster.url(), quiet());
  constexpr Millis kTtl = 1000ms;
  constexpr Millis kDelay = 1500ms;
  std::vector<std::string> names;
  std::vector<distlock::Lease> leases;
  for (int i = 0; i < 6; ++i) {
    names.push_back(cluster.name_on(0, "delay-mixed", i));
    leases.push_back(c.acquire(names.back(), delay_opts(kTtl, i % 2 == 0 ? kDelay : 0ms)));
  }
  std::this_thread::sleep_for(3 * kTtl);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(leases[i].owns()) << names[i] << " was lost";
    const auto k = distlock::detail::rediscluster::keys_of("distlock", names[i]);
    const auto [l, m] = pttls(cluster.node(0), k);
    ASSERT_GT(l, 0) << names[i];
    if (i % 2 == 0) {
      EXPECT_NEAR(static_cast<double>(m - l), static_cast<double>(kDelay.count()), 2.0) << names[i];
    } else {
      EXPECT_EQ(m, -2) << names[i] << " has a marker without a lock_delay";
    }
  }
  for (auto& l : leases) l.release();
}

// A holder (a child process) with TTL 1 s and D 4 s is SIGKILLed; once its lock key expired
// on node 0 (at most TTL after the kill) the slot moves to node 1 with the marker alone. A
// prober tries once every 20 ms: its first grant must come no earlier than kill + D (- 1 ms:
// the servers' millisecond expiry) and no later than kill + TTL + D + 1 s (the marker ends
// TTL + D after the holder's last renewal, before the kill; 1 s of slack for a loaded
// 2-core machine). While the slot migrates a free lock cannot be acquired at all
// (TRYAGAIN, docs/redis-cluster.md): the move is done before the probing starts.
TEST(RedisClusterLockDelay, AKilledHoldersMarkerMovesWithItsSlotAndHoldsTheNameBack) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(0, "delay-killed");
  const auto k = distlock::detail::rediscluster::keys_of("distlock", name);
  constexpr Millis kTtl = 1000ms;
  constexpr Millis kDelay = 4000ms;
  distlock::testing::TempDir dir("distlock-cluster-lockdelay");
  const std::string out = (dir.path() / "holder").string();
  distlock::testing::Process child = distlock::testing::spawn_holder(
      cluster.url(), name, out, kTtl.count(), 0, {"--lock-delay", std::to_string(kDelay.count())});
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "acquired", 30s)) << distlock::testing::read_file(out);
  const Steady::time_point killed = Steady::now();
  child.signal(SIGKILL);
  (void)child.wait_for(10s);
  ASSERT_TRUE(eventually([&] { return pttls(cluster.node(0), k).first == -2; }, 3 * kTtl))
      << "the dead holder's lock never expired";
  ASSERT_GT(pttls(cluster.node(0), k).second, 0) << "the dead holder left no marker";
  cluster.begin_move(k.slot, 0, 1);
  cluster.migrate_keys(k.slot, 0, 1);
  cluster.finish_move(k.slot, 0, 1);
  const auto [lock_left, marker_left] = pttls(cluster.node(1), k);
  EXPECT_EQ(lock_left, -2);
  ASSERT_GT(marker_left, 0) << "the marker did not move with its slot";
  Millis after{};  // 500 probes x 20 ms: past kill + TTL + D + 1 s
  ASSERT_NO_FATAL_FAILURE(expect_granted_after_the_delay(
      cluster.url(), name, kTtl, kDelay, killed, "[ rediscluster ] killed holder, slot moved", after));
  EXPECT_LE(after, kTtl + kDelay + 1000ms) << "granted too late after the lock-delay ended";
}

}  // namespace
}  // namespace distlock::testing
