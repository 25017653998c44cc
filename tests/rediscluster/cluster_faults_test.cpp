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
#include <cstdint>
#include <functional>
#include <mutex>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "engine/thread_annotations.hpp"
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
TEST(RedisClusterFaults, AHungMasterDoesNotCostTheLocksOnOtherMasters) {
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

// A client of `url` that waits for `name` (TTL 20 s, up to 60 s) in its own thread from its
// construction: it records whether it got the lock and when (on this process's steady clock;
// it releases it at once), or the error it was given, and then that its wait ended.
// Thread-safety: the atomics and error() may be read from any thread; join() from one.
class WaiterThread {
 public:
  WaiterThread(const std::string& url, const std::string& name)
      : client_(distlock::connect(url, quiet())), thread_([this, name] { wait_for(name); }) {}
  ~WaiterThread() { join(); }

  void join() {
    if (thread_.joinable()) thread_.join();
  }
  std::string error() {
    distlock::detail::LockGuard lk(mu_);
    return error_;
  }

  std::atomic<bool> got{false};
  std::atomic<std::int64_t> got_at{0};
  std::atomic<bool> ended{false};

 private:
  void wait_for(const std::string& name) {
    try {
      auto l = client_.acquire(name, ttl_of(20000ms, 60000ms));
      got_at = Steady::now().time_since_epoch().count();
      got = l.owns();
      std::error_code ec;
      l.release(ec);
    } catch (const std::system_error& e) {
      distlock::detail::LockGuard lk(mu_);
      error_ = e.what();
    }
    ended = true;
  }

  Client client_;
  distlock::detail::AnnotatedMutex mu_;
  std::string error_ DISTLOCK_GUARDED_BY(mu_);
  std::thread thread_;
};

// A client of `cluster` holding `name` (a name on node 0; TTL 20 s) and a WaiterThread for it;
// `k` are the name's keys.
struct HeldWithAWaiter {
  HeldWithAWaiter(RedisCluster& c, const std::string& name)
      : cluster(c),
        k(distlock::detail::rediscluster::keys_of("distlock", name)),
        holder_client(distlock::connect(c.url(), quiet())),
        lease(holder_client.acquire(name, ttl_of(20000ms))),
        waiter(c.url(), name) {}

  // Whether the waiter listens for the release on node 0 within 10 s.
  bool waiter_subscribed() {
    return eventually([&] { return shard_subscribers(cluster.node(0), k.channel) == 1; }, 10000ms);
  }

  RedisCluster& cluster;
  const distlock::detail::rediscluster::NameKeys k;
  Client holder_client;
  Lease lease;
  WaiterThread waiter;
};

// A holder releases while its slot is being migrated (keys already on the
// importing node, the slot still the source's: the release runs there through
// ASK). The waiter (subscribed on the source) must neither be handed an error nor
// be left waiting: once the move is finished at the latest it gets the lock.
TEST(RedisClusterFaults, AWaiterGetsALockReleasedWhileItsSlotMigrates) {
  RedisCluster cluster(3);
  HeldWithAWaiter held(cluster, cluster.name_on(0, "migrating"));
  ASSERT_TRUE(held.waiter_subscribed());
  cluster.begin_move(held.k.slot, 0, 1);
  cluster.migrate_keys(held.k.slot, 0, 1);
  std::error_code rec;
  held.lease.release(rec);
  EXPECT_FALSE(rec) << "release during the migration: " << rec.message();
  // The move takes a while (a large slot, a slow operator): 3 s here.
  std::this_thread::sleep_for(3000ms);
  const auto finished_at = Steady::now();
  cluster.finish_move(held.k.slot, 0, 1);
  const bool done =
      eventually([&] { return held.waiter.got.load() || !held.waiter.error().empty(); }, 10000ms);
  held.waiter.join();
  EXPECT_TRUE(done);
  EXPECT_TRUE(held.waiter.error().empty())
      << "the waiter got an error although the lock was released and every node is up: "
      << held.waiter.error();
  if (held.waiter.got.load()) {
    const auto waited = std::chrono::duration_cast<Millis>(
        Steady::time_point(Steady::duration(held.waiter.got_at.load())) - finished_at);
    EXPECT_LT(waited, 1500ms) << "the waiter got the lock " << waited.count()
                              << " ms after the move finished";
  } else {
    ADD_FAILURE() << "the waiter did not get the released lock";
  }
}

// Contract 5: a waiter whose connection dies gets an error, not the lock and not
// an endless wait. The waiter waits (60 s) for a lock on node 0; node 0 is killed.
TEST(RedisClusterFaults, AWaiterOnAKilledNodeGetsAnError) {
  RedisCluster cluster(3);
  HeldWithAWaiter held(cluster, cluster.name_on(0, "killed-wait"));
  ASSERT_TRUE(held.waiter_subscribed());
  const auto killed_at = Steady::now();
  cluster.node(0).kill();
  const bool done = eventually([&] { return held.waiter.ended.load(); }, 15000ms);
  const auto after = std::chrono::duration_cast<Millis>(Steady::now() - killed_at);
  cluster.node(0).restart();
  held.waiter.join();
  EXPECT_TRUE(done) << "the waiter was still waiting " << after.count() << " ms after its node died";
  EXPECT_FALSE(held.waiter.got.load()) << "the waiter was given the lock of a dead node";
  EXPECT_FALSE(held.waiter.error().empty());
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
TEST(RedisClusterFaults, AHolderKeepsRenewingWhileItsSlotIsMigratingWithTheKeyStillOnTheSource) {
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
