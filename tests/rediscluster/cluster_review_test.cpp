// Adversarial review of redis+cluster:// (tests that try to break the lock contract
// or the guarantees docs/redis-cluster.md states). Each test starts its own 3-master
// cluster (tests/support/redis_cluster.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/redis_cluster.hpp"

using namespace std::chrono_literals;
using distlock::Millis;
using distlock::testing::RedisCluster;
using Steady = std::chrono::steady_clock;

namespace {

distlock::ClientOptions quiet() {
  distlock::ClientOptions o;
  o.logger = [](distlock::LogLevel, std::string_view) {};
  return o;
}

distlock::LockOptions opts(Millis ttl) {
  distlock::LockOptions o;
  o.ttl = ttl;
  return o;
}

// docs/redis-cluster.md: "A master that dies. Its locks are lost [...]; locks on
// other masters are unaffected". A master that hangs (SIGSTOP: a stalled VM, a
// long fork, a frozen disk) instead of dying must not cost the locks held on the
// healthy masters either: their renewals do not depend on the hung node.
TEST(RedisClusterReview, AHungMasterDoesNotCostTheLocksOnOtherMasters) {
  RedisCluster cluster(3);
  auto c = distlock::connect(cluster.url(), quiet());
  const Millis ttl = 1500ms;
  std::vector<distlock::Lease> leases;
  for (int i = 0; i < 3; ++i) leases.push_back(c.acquire(cluster.name_on(i, "hung"), opts(ttl)));
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

}  // namespace
