// The wait queue of redis+cluster:// (docs/redis-cluster.md "How waiting works"), against a
// 3-master Redis Cluster started by each test (tests/support/redis_cluster.hpp):
// waiters are granted in the order they queued, even against a holder that releases and
// asks again at once, and a waiter that was killed or stopped while queued delays the next
// live one by a bounded time after the release, as on redis:// (docs/design.md "A dead waiter").
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "rediscluster/cluster_backend.hpp"
#include "support/client_options.hpp"
#include "support/dead_waiter.hpp"
#include "support/eventually.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_probes.hpp"

using namespace std::chrono_literals;
using distlock::detail::rediscluster::keys_of;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

// Six clients queue one after another on a name held by R; then R releases and asks
// again at once, in a loop. FIFO: the six are granted in the order they queued, each
// before R's second release (R re-queues behind them), with tokens increasing in that
// order. Before the queue (a release woke every waiter and the lock went to whoever
// reached the master first, most often R), the order was arbitrary and R held the name
// again and again while they waited.
TEST(RedisClusterQueue, WaitersAreGrantedInQueueOrderAgainstAHolderThatAsksAgainAtOnce) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(1, "fifo");
  const auto k = keys_of("distlock", name);
  constexpr int kWaiters = 6;
  auto r_client = distlock::connect(cluster.url(), quiet());
  std::vector<Client> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(distlock::connect(cluster.url(), quiet()));

  auto lease = r_client.acquire(name, ttl_of(20000ms));
  std::atomic<int> r_releases{0};
  std::atomic<int> granted{0};
  std::mutex mu;
  std::vector<int> order;                          // waiter indexes in grant order
  std::vector<int> releases_before(kWaiters, -1);  // R's releases before each grant
  std::vector<std::uint64_t> tokens(kWaiters, 0);  // each waiter's token
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      distlock::detail::Error ec;
      auto l = clients[i].acquire(name, ttl_of(10000ms, 20000ms), ec);
      if (ec) return;
      {
        std::lock_guard g(mu);
        order.push_back(i);
        releases_before[i] = r_releases.load();
        tokens[i] = l.token();
      }
      l.release();
      granted.fetch_add(1);
    });
    // The next waiter starts once this one waits: its client subscribes the name's channel
    // after its first attempt (which, with the queue, queued it).
    ASSERT_TRUE(eventually([&] { return shard_subscribers(cluster.node(1), k.channel) == i + 1; }, 10000ms))
        << "waiter " << i << " did not start waiting";
  }
  const std::uint64_t r_token = lease.token();
  // R: release and ask again at once, bounded in count and time (20 s on this process's
  // steady clock), until every waiter was granted.
  const auto until = Steady::now() + 20000ms;
  int cycles = 0;
  for (; granted.load() < kWaiters && cycles < 100000 && Steady::now() < until; ++cycles) {
    // Counted before the release: the release's grant can reach a waiter, which reads the
    // count, before this thread runs again. A waiter granted after R's second release
    // began (R passed it over) still reads 2.
    r_releases.fetch_add(1);
    lease.release();
    distlock::detail::Error ec;
    lease = r_client.acquire(name, ttl_of(20000ms, 20000ms), ec);
    if (ec) break;
  }
  lease.release();
  for (auto& t : threads) t.join();
  std::printf("R released %d times; grant order:", cycles + 1);
  for (int i : order) std::printf(" %d(after %d)", i, releases_before[i]);
  std::printf("\n");
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kWaiters)) << "a waiter ran out its 20 s wait";
  for (int i = 0; i < kWaiters; ++i) {
    EXPECT_EQ(order[i], i) << "grant " << i << " went to waiter " << order[i] << ", not the longest waiter";
    EXPECT_EQ(releases_before[i], 1) << "waiter " << i << " was passed over by R's re-acquisitions";
  }
  std::uint64_t last = r_token;
  for (int i : order) {
    EXPECT_GT(tokens[i], last) << "tokens do not increase in grant order";
    last = tokens[i];
  }
}

// A waiter B (lock_tool, TTL 30 s) queued behind A, C (here) behind B; B is SIGKILLed or
// SIGSTOPped and A releases at once, while B's entry is still live on the server. C's wait
// from the release is measured on this process's steady clock; the bound is 3 s: the grant
// to B's entry lapses after its claim window (1 s) and C's next refresh (within 500 ms)
// takes the lock over — 1.5 s, and 1.5 s of slack for a loaded host.
class RedisClusterDeadWaiter : public ::testing::TestWithParam<int> {};

TEST_P(RedisClusterDeadWaiter, DelaysTheNextLiveWaiterByAtMost3sAfterTheRelease) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(2, "line");
  const std::string queue = keys_of("distlock", name).lock + ":q";  // the layout of a name without braces
  expect_dead_waiter_delay_at_most_3s(
      cluster.url(), name, GetParam(), [&] { return list_length(cluster.node(2), queue); },
      "distlock-cluster-deadwaiter");
}

INSTANTIATE_TEST_SUITE_P(Signals, RedisClusterDeadWaiter, ::testing::Values(SIGKILL, SIGSTOP),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::string(p.param == SIGKILL ? "Killed" : "Stopped");
                         });

// A waiter that gives up (its wait runs out) leaves the queue at once: the next release
// grants the one behind it, and nothing of the queue is left on the server afterwards.
TEST(RedisClusterQueue, GivingUpLeavesTheQueue) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(0, "giveup");
  const auto k = keys_of("distlock", name);
  const std::string queue = k.lock + ":q";  // the layout of a name without braces
  auto holder = distlock::connect(cluster.url(), quiet());
  auto quitter = distlock::connect(cluster.url(), quiet());
  auto waiter = distlock::connect(cluster.url(), quiet());
  auto lease = holder.acquire(name, ttl_of(20000ms));
  distlock::detail::Error ec;
  std::thread q([&] {
    distlock::detail::Error qec;
    auto l = quitter.acquire(name, ttl_of(10000ms, 1000ms), qec);
    EXPECT_EQ(qec, distlock::errc::timeout);
  });
  ASSERT_TRUE(eventually([&] { return list_length(cluster.node(0), queue) == 1; }, 10000ms));
  q.join();
  EXPECT_EQ(list_length(cluster.node(0), queue), 0) << "the entry of a wait given up is still queued";
  std::atomic<bool> got{false};
  std::thread w([&] {
    auto l = waiter.acquire(name, ttl_of(10000ms, 20000ms));
    got = true;
  });
  ASSERT_TRUE(eventually([&] { return list_length(cluster.node(0), queue) == 1; }, 10000ms));
  const auto released_at = Steady::now();
  lease.release();
  w.join();
  EXPECT_TRUE(got.load());
  EXPECT_LT(Steady::now() - released_at, 2000ms);
  EXPECT_TRUE(eventually(
      [&] { return !key_exists(cluster.node(0), queue) && !key_exists(cluster.node(0), (k.lock + ":qx")); },
      5000ms))
      << "queue keys left behind";
}

// A release while the name's slot is MIGRATING with its keys still on the source: the queue's
// release script names the queue keys, which the source does not have (nobody queued), and
// Redis refuses it (TRYAGAIN). The release then goes by the lock alone: it succeeds, the lock
// is gone, and once the slot has moved the name is taken on its new master with a larger token.
// (With the queue script only, the release failed after 6 attempts and the lock stayed for
// its TTL.)
TEST(RedisClusterQueue, AReleaseWhileItsSlotMigratesWithTheLockOnTheSourceReleasesIt) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(0, "moving");
  const auto k = keys_of("distlock", name);
  auto holder = distlock::connect(cluster.url(), quiet());
  auto later = distlock::connect(cluster.url(), quiet());
  auto lease = holder.acquire(name, ttl_of(20000ms));
  const std::uint64_t first = lease.token();
  cluster.begin_move(k.slot, 0, 1);
  std::error_code ec;
  lease.release(ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(key_exists(cluster.node(0), k.lock)) << "the lock is still on the source";
  cluster.migrate_keys(k.slot, 0, 1);
  cluster.finish_move(k.slot, 0, 1);
  distlock::detail::Error aec;
  auto next = later.acquire(name, ttl_of(5000ms, 10000ms), aec);
  ASSERT_FALSE(aec) << aec.message();
  EXPECT_GT(next.token(), first);
  EXPECT_TRUE(key_exists(cluster.node(1), k.lock)) << "not taken on the slot's new master";
}

}  // namespace
}  // namespace distlock::testing
