// redis+cluster:// under a hung master, a migrating slot and a killed node.
// Written by the adversarial review of redis+cluster:// (commit 65b9184, first named
// cluster_review_test.cpp).
//
// Adversarial review of redis+cluster:// (tests that try to break the lock contract
// or the guarantees docs/redis-cluster.md states). Each test starts its own 3-master
// cluster (tests/support/redis_cluster.hpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "rediscluster/cluster_backend.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_probes.hpp"

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

// docs/redis-cluster.md: "A master that dies. Its locks are lost [...]; locks on
// other masters are unaffected". A master that hangs (SIGSTOP: a stalled VM, a
// long fork, a frozen disk) instead of dying must not cost the locks held on the
// healthy masters either: their renewals do not depend on the hung node.
TEST(RedisClusterReview, AHungMasterDoesNotCostTheLocksOnOtherMasters) {
  RedisCluster cluster(3);
  auto c = distlock::connect(cluster.url(), quiet());
  const Millis ttl = 1500ms;
  std::vector<distlock::Lease> leases;
  for (int i = 0; i < 3; ++i) leases.push_back(c.acquire(cluster.name_on(i, "hung"), ttl_of(ttl)));
  cluster.node(0).pause();
  // Three TTLs: every healthy lease needs several renewals in that time.
  const auto until = Steady::now() + 3 * ttl;
  bool healthy_lost = false;
  Millis lost_after{0};
  const auto paused_at = Steady::now();
  while (Steady::now() < until && !healthy_lost) {
    if (leases[1].stop_token().stop_requested() || leases[2].stop_token().stop_requested()) {
      healthy_lost = true;
      lost_after = std::chrono::duration_cast<Millis>(Steady::now() - paused_at);
    }
    std::this_thread::sleep_for(10ms);
  }
  cluster.node(0).resume();
  EXPECT_FALSE(healthy_lost) << "a lease on a healthy master was lost " << lost_after.count()
                             << " ms after another master hung (TTL " << ttl.count() << " ms)";
  EXPECT_TRUE(leases[1].owns());
  EXPECT_TRUE(leases[2].owns());
}

// A holder releases while its slot is being migrated (keys already on the
// importing node, the slot still the source's: the release runs there through
// ASK). The waiter (subscribed on the source) must neither be handed an error nor
// be left waiting: once the move is finished at the latest it gets the lock.
TEST(RedisClusterReview, AWaiterGetsALockReleasedWhileItsSlotMigrates) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(0, "migrating");
  const auto k = distlock::detail::rediscluster::keys_of("distlock", name);
  auto holder_client = distlock::connect(cluster.url(), quiet());
  auto waiter_client = distlock::connect(cluster.url(), quiet());
  auto lease = holder_client.acquire(name, ttl_of(20000ms));
  std::atomic<bool> got{false};
  std::atomic<std::int64_t> got_at{0};
  std::mutex mu;
  std::string error;
  std::thread t([&] {
    try {
      auto l = waiter_client.acquire(name, ttl_of(20000ms, 60000ms));
      got_at = Steady::now().time_since_epoch().count();
      got = l.owns();
      std::error_code ec;
      l.release(ec);
    } catch (const std::system_error& e) {
      std::lock_guard lk(mu);
      error = e.what();
    }
  });
  ASSERT_TRUE(eventually([&] { return shard_subscribers(cluster.node(0), k.channel) == 1; }, 10000ms));
  cluster.begin_move(k.slot, 0, 1);
  cluster.migrate_keys(k.slot, 0, 1);
  std::error_code rec;
  lease.release(rec);
  EXPECT_FALSE(rec) << "release during the migration: " << rec.message();
  // The move takes a while (a large slot, a slow operator): 3 s here.
  std::this_thread::sleep_for(3000ms);
  const auto finished_at = Steady::now();
  cluster.finish_move(k.slot, 0, 1);
  const bool done = eventually(
      [&] {
        std::lock_guard lk(mu);
        return got.load() || !error.empty();
      },
      10000ms);
  t.join();
  EXPECT_TRUE(done);
  EXPECT_TRUE(error.empty())
      << "the waiter got an error although the lock was released and every node is up: " << error;
  if (got.load()) {
    const auto waited =
        std::chrono::duration_cast<Millis>(Steady::time_point(Steady::duration(got_at.load())) - finished_at);
    EXPECT_LT(waited, 1500ms) << "the waiter got the lock " << waited.count()
                              << " ms after the move finished";
  } else {
    ADD_FAILURE() << "the waiter did not get the released lock";
  }
}

// Contract 5: a waiter whose connection dies gets an error, not the lock and not
// an endless wait. The waiter waits (60 s) for a lock on node 0; node 0 is killed.
TEST(RedisClusterReview, AWaiterOnAKilledNodeGetsAnError) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(0, "killed-wait");
  const auto k = distlock::detail::rediscluster::keys_of("distlock", name);
  auto holder_client = distlock::connect(cluster.url(), quiet());
  auto waiter_client = distlock::connect(cluster.url(), quiet());
  auto lease = holder_client.acquire(name, ttl_of(20000ms));
  std::atomic<bool> ended{false};
  std::atomic<bool> got{false};
  std::mutex mu;
  std::string error;
  std::thread t([&] {
    try {
      auto l = waiter_client.acquire(name, ttl_of(20000ms, 60000ms));
      got = l.owns();
    } catch (const std::system_error& e) {
      std::lock_guard lk(mu);
      error = e.what();
    }
    ended = true;
  });
  ASSERT_TRUE(eventually([&] { return shard_subscribers(cluster.node(0), k.channel) == 1; }, 10000ms));
  const auto killed_at = Steady::now();
  cluster.node(0).kill();
  const bool done = eventually([&] { return ended.load(); }, 15000ms);
  const auto after = std::chrono::duration_cast<Millis>(Steady::now() - killed_at);
  cluster.node(0).restart();
  t.join();
  EXPECT_TRUE(done) << "the waiter was still waiting " << after.count() << " ms after its node died";
  EXPECT_FALSE(got.load()) << "the waiter was given the lock of a dead node";
  std::lock_guard lk(mu);
  EXPECT_FALSE(error.empty());
  RecordProperty("ended_after_ms", static_cast<int>(after.count()));
}

// A resharding that has begun but not yet moved the keys: the slot is MIGRATING on
// the source, which still holds the lock's key. Redis serves commands on keys that
// exist there; a script command on a key of that slot that does not exist there is
// refused ("non local key": it may live on the target). The renewal must touch only
// keys that exist (the lock), so the holder keeps its lease through the whole
// window; a lease without lock_delay never names a lock-delay marker (one with it names
// its own, which exists: tests/rediscluster/lock_delay_test.cpp). Bound: three TTLs of 1 s
// on this process's steady clock, about nine renewals.
TEST(RedisClusterReview, AHolderKeepsRenewingWhileItsSlotIsMigratingWithTheKeyStillOnTheSource) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(0, "renew-migrating");
  const auto k = distlock::detail::rediscluster::keys_of("distlock", name);
  auto c = distlock::connect(cluster.url(), quiet());
  const Millis ttl = 1000ms;
  auto lease = c.acquire(name, ttl_of(ttl));
  std::mutex mu;
  std::condition_variable cv;
  bool lost = false;
  std::stop_callback on_stop(lease.stop_token(), [&] {
    std::lock_guard lk(mu);
    lost = true;
    cv.notify_all();
  });
  cluster.begin_move(k.slot, 0, 1);
  const auto begun = Steady::now();
  {
    std::unique_lock lk(mu);
    cv.wait_for(lk, 3 * ttl, [&] { return lost; });
  }
  const auto after = std::chrono::duration_cast<Millis>(Steady::now() - begun);
  // The key never left the source: its TTL there shows the renewals.
  auto pttl = cluster.node(0).command({"PTTL", k.lock});
  const long long left = pttl && pttl->type == REDIS_REPLY_INTEGER ? pttl->integer : -999;
  {
    std::lock_guard lk(mu);
    EXPECT_FALSE(lost) << "the lease was lost " << after.count()
                       << " ms after its slot began to migrate (its key still on the source)";
  }
  EXPECT_TRUE(lease.owns());
  EXPECT_GT(left, 0) << "the lock's key on the source was not renewed";
  cluster.migrate_keys(k.slot, 0, 1);
  cluster.finish_move(k.slot, 0, 1);
  std::error_code ec;
  lease.release(ec);
  EXPECT_FALSE(ec) << ec.message();
}

}  // namespace
}  // namespace distlock::testing
