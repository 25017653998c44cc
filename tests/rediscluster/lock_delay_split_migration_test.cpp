// redis+cluster://'s lock-delay while a slot migration has split a lease's keys between the two
// nodes (docs/redis-cluster.md "Lock-delay"): MIGRATE moves keys in batches (redis-cli
// --cluster moves 10 per call; a reshard that stops midway leaves the slot MIGRATING until
// `--cluster fix`), so a lock and its marker can sit on different nodes for a while. A lease
// with a lock_delay must keep renewing there as a lease without one does when its lock and its
// fence counter are split (a script naming two keys the node does not both have is refused with
// TRYAGAIN; the lease without D names its lock only).
// Every instant is read on this process's steady clock; the nodes run on this host.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "distlock/distlock.hpp"
#include "rediscluster/cluster_backend.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_lock_delay.hpp"

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

// MIGRATE of one key from node `from` to node `to` (the slot already MIGRATING / IMPORTING).
void migrate_one(RedisCluster& cluster, int from, int to, const std::string& key) {
  auto r = cluster.node(from).command(
      {"MIGRATE", "127.0.0.1", std::to_string(cluster.node(to).port()), "", "0", "5000", "KEYS", key});
  ASSERT_TRUE(r && r->type == REDIS_REPLY_STATUS) << "MIGRATE " << key << ": " << (r ? r->str : "no reply");
}

constexpr Millis kTtl = 1000ms;
constexpr Millis kDelay = 1500ms;

// Two leases on node 0, TTL 1 s, in two slots, each slot MIGRATING to node 1 with one key moved
// ahead: the lease without D has its fence counter moved (its lock stays on node 0), the lease
// with D (1.5 s) has its marker moved (its lock and fence stay on node 0). For three TTLs
// (about nine renewals) neither lease may be lost, and the marker must have moved with the lease
// (it would have ended 2.5 s after the split otherwise). Then every key moves, both slots go to
// node 1, and both leases release normally.
TEST(RedisClusterLockDelaySplitMigration, ALeaseWithADelayKeepsRenewingWhileItsMarkerMovedAheadOfItsLock) {
  RedisCluster cluster(3);
  const std::string plain_name = cluster.name_on(0, "split-plain");
  const std::string delayed_name = cluster.name_on(0, "split-delayed");
  const auto kp = distlock::detail::rediscluster::keys_of("distlock", plain_name);
  const auto kd = distlock::detail::rediscluster::keys_of("distlock", delayed_name);
  ASSERT_NE(kp.slot, kd.slot);
  auto holder = distlock::connect(cluster.url(), quiet());
  auto plain = holder.acquire(plain_name, delay_opts(kTtl, 0ms));
  auto delayed = holder.acquire(delayed_name, delay_opts(kTtl, kDelay));
  cluster.begin_move(kp.slot, 0, 1);
  cluster.begin_move(kd.slot, 0, 1);
  migrate_one(cluster, 0, 1, kp.fence);
  migrate_one(cluster, 0, 1, kd.delay);
  const auto split = Steady::now();
  std::optional<Steady::time_point> plain_lost, delayed_lost;
  (void)eventually(
      [&] {
        if (!plain_lost && plain.stop_token().stop_requested()) plain_lost = Steady::now();
        if (!delayed_lost && delayed.stop_token().stop_requested()) delayed_lost = Steady::now();
        return plain_lost && delayed_lost;
      },
      3 * kTtl);
  const auto ms = [&](const std::optional<Steady::time_point>& t) {
    return t ? static_cast<long long>(std::chrono::duration_cast<Millis>(*t - split).count()) : -1LL;
  };
  std::printf(
      "[ rediscluster3 ] keys split by a migration for %lld ms: lease without D lost at %lld ms, "
      "lease with D lost at %lld ms (-1: held)\n",
      static_cast<long long>(3 * kTtl.count()), ms(plain_lost), ms(delayed_lost));
  EXPECT_FALSE(plain_lost.has_value()) << "a lease without D was lost while its fence had moved ahead";
  EXPECT_FALSE(delayed_lost.has_value())
      << "a lease with D was lost while its marker had moved ahead of its lock";
  // The marker lives ttl + D = 2.5 s from a renewal that moved it: still there on node 1 after
  // the 3 s split only if the renewals moved it too (SCAN skips expired keys; it is not
  // redirected, as PTTL would be on an importing node).
  auto scan = cluster.node(1).command({"SCAN", "0", "MATCH", kd.delay, "COUNT", "1000"});
  ASSERT_TRUE(scan && scan->type == REDIS_REPLY_ARRAY && scan->elements == 2);
  EXPECT_EQ(scan->element[1]->elements, 1u) << "the marker was not moved with the lease while split from it";
  cluster.migrate_keys(kp.slot, 0, 1);
  cluster.migrate_keys(kd.slot, 0, 1);
  cluster.finish_move(kp.slot, 0, 1);
  cluster.finish_move(kd.slot, 0, 1);
  std::error_code ec;
  plain.release(ec);
  delayed.release(ec);
}

// A lease with D (TTL 1 s, D 1.5 s) whose marker a migration moved ahead of its lock is released
// normally while so split: the release must succeed (no error) and, once the keys are together
// on node 1 and the slot is its, another client must take the name at once (no lock left, no
// marker).
TEST(RedisClusterLockDelaySplitMigration, AReleaseWhileTheMarkerMovedAheadHandsOverAtOnce) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(0, "split-release");
  const auto k = distlock::detail::rediscluster::keys_of("distlock", name);
  auto holder = distlock::connect(cluster.url(), quiet());
  auto contender = distlock::connect(cluster.url(), quiet());
  auto lease = holder.acquire(name, delay_opts(kTtl, kDelay));
  cluster.begin_move(k.slot, 0, 1);
  migrate_one(cluster, 0, 1, k.delay);
  std::error_code ec;
  lease.release(ec);
  EXPECT_FALSE(ec) << "a normal release during a split migration failed: " << ec.message();
  cluster.migrate_keys(k.slot, 0, 1);
  cluster.finish_move(k.slot, 0, 1);
  const auto finished = Steady::now();
  std::optional<distlock::Lease> got;
  try {
    got = contender.try_acquire(name, delay_opts(kTtl, 0ms));
  } catch (const std::system_error& e) {
    ADD_FAILURE() << "the contender got an error: " << e.what();
  }
  std::printf(
      "[ rediscluster3 ] release during a split migration: the contender's first attempt %s %lld ms "
      "after the slot moved\n",
      got.has_value() ? "granted" : "busy",
      static_cast<long long>(std::chrono::duration_cast<Millis>(Steady::now() - finished).count()));
  EXPECT_TRUE(got.has_value()) << "the name was not handed over at once after a normal release";
}

}  // namespace
}  // namespace distlock::testing
