// redis+cluster:// against a 3-master Redis Cluster started by each test
// (tests/support/redis_cluster.hpp): routing by hash slot, MOVED from a one-node
// URL and after a resharding, a slot moved while its lock is held and waited for,
// a killed master, and the URL's errors. The shared lock contract runs in the
// conformance suite (tests/conformance/cluster_target.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "api/client_access.hpp"
#include "connect/registry.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "engine/url.hpp"
#include "rediscluster/cluster_backend.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/process.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_probes.hpp"

using namespace std::chrono_literals;
using distlock::detail::rediscluster::key_slot;
using distlock::detail::rediscluster::keys_of;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

long long integer(const distlock::testing::RedisReplyPtr& r) {
  return r && r->type == REDIS_REPLY_INTEGER ? r->integer : -999;
}

// PTTL of `key` on a node importing its slot (ASKING first, on one connection).
long long pttl_asking(const distlock::testing::RedisServer& node, const std::string& key) {
  timeval tv{5, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", node.port(), tv);
  if (c == nullptr || c->err) {
    if (c) redisFree(c);
    return -999;
  }
  redisSetTimeout(c, tv);
  distlock::testing::RedisReplyPtr asking(static_cast<redisReply*>(redisCommand(c, "ASKING")));
  distlock::testing::RedisReplyPtr r(
      static_cast<redisReply*>(redisCommand(c, "PTTL %b", key.data(), key.size())));
  redisFree(c);
  return integer(r);
}

std::string message_of(const std::function<void()>& fn, std::error_code& code) {
  try {
    fn();
  } catch (const std::system_error& e) {
    code = e.code();
    return e.what();
  }
  return {};
}

TEST(RedisClusterSlots, KeySlotAndOddNamesMatchTheServer) {
  RedisCluster cluster(3);
  EXPECT_EQ(key_slot("123456789"), 12739);  // the CRC16 check value, as in the cluster spec
  const std::vector<std::string> names{"job",  "a{b}c", "}x",  "{",     "}",          "{}",
                                       "{}{}", "x{}y",  "{a}", "a}b{c", "\x01{\xff}", std::string(4096, '{')};
  std::set<std::string> all_keys;
  for (const auto& name : names) {
    const auto k = keys_of("distlock", name);
    for (const std::string* key : {&k.lock, &k.fence, &k.channel}) {
      EXPECT_EQ(integer(cluster.node(0).command({"CLUSTER", "KEYSLOT", *key})), k.slot)
          << "key " << *key << " of name " << name;
      EXPECT_TRUE(all_keys.insert(*key).second) << "two names share key " << *key;
    }
  }
}

TEST(RedisClusterUrl, ErrorsNameTheProblem) {
  distlock::detail::Error ec;
  std::string msg = message_of([] { distlock::connect("redis+cluster://127.0.0.1:1?bogus=1", quiet()); }, ec);
  EXPECT_EQ(ec, errc::invalid_url);
  EXPECT_NE(msg.find("unknown query parameter \"bogus\""), std::string::npos) << msg;

  msg = message_of([] { distlock::connect("redis+cluster://127.0.0.1:1/3", quiet()); }, ec);
  EXPECT_EQ(ec, errc::invalid_url);
  EXPECT_NE(msg.find("only database 0"), std::string::npos) << msg;

  msg = message_of([] { distlock::connect("redis+cluster://127.0.0.1:1?prefix=a{b", quiet()); }, ec);
  EXPECT_EQ(ec, errc::invalid_url);
  EXPECT_NE(msg.find("prefix"), std::string::npos) << msg;

  msg = message_of([] { distlock::connect("redis+cluster://127.0.0.1:1?nat=127.0.0.1:7000", quiet()); }, ec);
  EXPECT_EQ(ec, errc::invalid_url);
  EXPECT_NE(msg.find("nat entry \"127.0.0.1:7000\""), std::string::npos) << msg;

  const auto port = std::to_string(distlock::testing::free_port());
  msg = message_of([&] { distlock::connect("redis+cluster://:secretpw@127.0.0.1:" + port, quiet()); }, ec);
  EXPECT_EQ(ec, errc::backend_unavailable);
  EXPECT_NE(msg.find("no node of the cluster"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("secretpw"), std::string::npos) << msg;

  distlock::testing::RedisServer plain;
  msg = message_of(
      [&] { distlock::connect("redis+cluster://127.0.0.1:" + std::to_string(plain.port()), quiet()); }, ec);
  EXPECT_EQ(ec, errc::protocol_error);
  EXPECT_NE(msg.find("is not a cluster node"), std::string::npos) << msg;
}

// Names on each master: held, busy for another client, stored on the right node;
// released, the other client gets them with a larger token. Odd names too.
TEST(RedisCluster, LocksOnEveryNodeExcludeAndRelease) {
  RedisCluster cluster(3);
  {
    auto a = distlock::connect(cluster.url(), quiet());
    auto b = distlock::connect(cluster.url(), quiet());
    std::vector<std::string> names;
    for (int i = 0; i < 3; ++i) names.push_back(cluster.name_on(i, "basic"));
    names.push_back("odd}{name");
    names.push_back("{}");
    std::vector<distlock::Lease> leases;
    for (const auto& n : names) {
      leases.push_back(a.acquire(n, ttl_of(5000ms)));
      EXPECT_FALSE(b.try_acquire(n, ttl_of(5000ms)).has_value()) << n;
      EXPECT_TRUE(b.status(n).held) << n;
      const auto k = keys_of("distlock", n);
      const int owner = cluster.owner_of(k.slot);
      ASSERT_GE(owner, 0);
      EXPECT_EQ(integer(cluster.node(owner).command({"EXISTS", k.lock})), 1) << n;
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      const auto first = leases[i].token();
      leases[i].release();
      auto again = b.try_acquire(names[i], ttl_of(5000ms));
      ASSERT_TRUE(again.has_value()) << names[i];
      EXPECT_GT(again->token(), first) << names[i];
    }
  }
  EXPECT_TRUE(eventually([&] { return cluster.leftovers().empty(); }, 5000ms));
}

// A waiter listens on the slot's node with SSUBSCRIBE and is woken by the release.
TEST(RedisCluster, AWaiterIsWokenByAShardedReleaseNotification) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(2, "wake");
  const auto k = keys_of("distlock", name);
  auto holder = distlock::connect(cluster.url(), quiet());
  auto waiter = distlock::connect(cluster.url(), quiet());
  // A long TTL: without the notification the waiter would re-check only after the
  // holder's remaining TTL (seconds), far beyond the bound below.
  auto lease = holder.acquire(name, ttl_of(20000ms));
  std::atomic<std::int64_t> got_at{0};
  std::thread t([&] {
    auto l = waiter.acquire(name, ttl_of(20000ms, 30000ms));
    got_at = Steady::now().time_since_epoch().count();
  });
  ASSERT_TRUE(eventually([&] { return shard_subscribers(cluster.node(2), k.channel) == 1; }, 10000ms));
  EXPECT_EQ(cluster.node(2).command({"PUBSUB", "CHANNELS", "*"})->elements, 0u) << "plain pub/sub used";
  const auto released_at = Steady::now();
  lease.release();
  t.join();
  const auto waited =
      std::chrono::duration_cast<Millis>(Steady::time_point(Steady::duration(got_at.load())) - released_at);
  EXPECT_LT(waited, 3000ms) << "the waiter was not woken by the release";
}

// Backend::forget (issue 27 item 4): the lost lease's lock is deleted on its slot's
// node, owner- and token-checked, and a waiter is woken by the sharded release
// notice; a wrong token or another owner changes nothing.
TEST(RedisCluster, ForgetDeletesOnlyTheLostLeaseAndWakesAWaiter) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(1, "forget");
  auto x = distlock::connect(cluster.url(), quiet());
  auto y = distlock::connect(cluster.url(), quiet());
  auto& backend = distlock::detail::engine_of(x)->backend();
  const std::string owner = "0123456789abcdef0123456789abcdef:7";
  distlock::detail::Error ec;
  const auto held = backend.try_acquire({name, owner, Millis(30000)}, ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(held.acquired);
  std::atomic<std::int64_t> got_at{0};
  std::thread t([&] {
    auto l = y.acquire(name, ttl_of(10000ms, 30000ms));
    got_at = Steady::now().time_since_epoch().count();
  });
  const auto k = keys_of("distlock", name);
  ASSERT_TRUE(eventually([&] { return shard_subscribers(cluster.node(1), k.channel) == 1; }, 10000ms));
  backend.forget(name, owner, held.token + 1);
  backend.forget(name, "fedcba9876543210fedcba9876543210:1", held.token);
  EXPECT_EQ(x.status(name).holder.value_or(""), owner) << "forget freed a lease it was not given";
  const auto forgotten = Steady::now();
  backend.forget(name, owner, held.token);
  t.join();
  const auto waited =
      std::chrono::duration_cast<Millis>(Steady::time_point(Steady::duration(got_at.load())) - forgotten);
  EXPECT_LT(waited, 3000ms) << "the waiter was not woken by the forget";
  EXPECT_EQ(backend.release(name, owner, held.token, ec), distlock::detail::ReleaseStatus::not_owner);
}

// A URL naming one node: the others come from its slot map.
TEST(RedisCluster, OneSeedFindsEveryNode) {
  RedisCluster cluster(3);
  auto c = distlock::connect(cluster.url_of(0), quiet());
  for (int i = 0; i < 3; ++i) {
    const std::string name = cluster.name_on(i, "seed");
    auto l = c.acquire(name, ttl_of(5000ms));
    EXPECT_EQ(integer(cluster.node(i).command({"EXISTS", keys_of("distlock", name).lock})), 1);
    l.release();
  }
}

// The client's map is stale after a resharding: MOVED sends it to the new owner.
TEST(RedisCluster, AStaleMapFollowsMoved) {
  RedisCluster cluster(3);
  auto c = distlock::connect(cluster.url(), quiet());
  const std::string name = cluster.name_on(0, "moved");
  const auto k = keys_of("distlock", name);
  auto l1 = c.acquire(name, ttl_of(5000ms));
  const auto t1 = l1.token();
  l1.release();
  cluster.move_slot(k.slot, 0, 1);
  auto l2 = c.acquire(name, ttl_of(5000ms));
  EXPECT_GT(l2.token(), t1);
  EXPECT_EQ(integer(cluster.node(1).command({"EXISTS", k.lock})), 1);
  EXPECT_EQ(integer(cluster.node(1).command({"EXISTS", k.fence})), 1);
  EXPECT_TRUE(c.status(name).held);
  l2.release();
}

// The slot of a held and waited-for lock moves from node 0 to node 1 in steps
// (keys migrated while the slot is MIGRATING/IMPORTING: ASK), then the map
// changes (MOVED, and the subscription is dropped by node 0). The holder renews
// on the new node, never alongside the waiter; the waiter, subscribed again on
// node 1, is woken by the release there and gets a larger token.
TEST(RedisCluster, ReshardingAHeldLockKeepsOneHolderAndWakesTheWaiterOnTheNewNode) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(0, "reshard");
  const auto k = keys_of("distlock", name);
  {
    auto holder = distlock::connect(cluster.url(), quiet());
    auto waiter = distlock::connect(cluster.url(), quiet());
    const Millis ttl = 3000ms;
    auto lease = holder.acquire(name, ttl_of(ttl));
    std::atomic<bool> lost{false};
    lease.on_lost([&] { lost = true; });
    std::atomic<bool> waiter_has{false};
    std::atomic<std::uint64_t> waiter_token{0};
    std::atomic<std::int64_t> got_at{0};
    std::thread t([&] {
      distlock::detail::Error ec;
      auto l = waiter.acquire(name, ttl_of(ttl, 60000ms), ec);
      if (l.owns()) {
        got_at = Steady::now().time_since_epoch().count();
        waiter_token = l.token();
        waiter_has = true;
        // Mutual exclusion: the holder no longer believes it holds the lock.
        EXPECT_FALSE(lease.owns() && !lost) << "two holders";
      }
    });
    ASSERT_TRUE(eventually([&] { return shard_subscribers(cluster.node(0), k.channel) == 1; }, 10000ms));

    cluster.begin_move(k.slot, 0, 1);
    cluster.migrate_keys(k.slot, 0, 1);
    // Keys on node 1, slot still node 0's: the holder renews through ASK.
    long long pttl = pttl_asking(cluster.node(1), k.lock);
    EXPECT_GT(pttl, 0);
    EXPECT_TRUE(eventually([&] { return pttl_asking(cluster.node(1), k.lock) > pttl; }, 10000ms))
        << "no renewal reached the importing node";
    cluster.finish_move(k.slot, 0, 1);

    // Node 0 dropped the waiter's subscription; it moves to node 1.
    EXPECT_TRUE(eventually([&] { return shard_subscribers(cluster.node(1), k.channel) == 1; }, 10000ms))
        << "the waiter did not subscribe on the new node";
    EXPECT_EQ(shard_subscribers(cluster.node(0), k.channel), 0);
    // A renewal on the new owner after the move (MOVED followed).
    pttl = integer(cluster.node(1).command({"PTTL", k.lock}));
    EXPECT_TRUE(eventually(
        [&] {
          return integer(cluster.node(1).command({"PTTL", k.lock})) > pttl;
        },
        10000ms))
        << "no renewal after the move";
    EXPECT_FALSE(waiter_has.load());
    if (lease.owns()) {
      EXPECT_FALSE(lost.load());
      auto s = waiter.status(name);
      EXPECT_TRUE(s.held);
    } else {
      EXPECT_TRUE(lease.stop_token().stop_requested()) << "lost without a stop token";
    }
    const auto holder_token = lease.token();
    const auto released_at = Steady::now();
    distlock::detail::Error ec;
    lease.release(ec);
    t.join();
    ASSERT_TRUE(waiter_has.load());
    EXPECT_GT(waiter_token.load(), holder_token) << "a token repeated or went back";
    const auto waited =
        std::chrono::duration_cast<Millis>(Steady::time_point(Steady::duration(got_at.load())) - released_at);
    // The holder's TTL is 3 s and it renewed just before: without the notification
    // the waiter re-checks after the remaining TTL (~2-3 s); with it, at once.
    EXPECT_LT(waited, 1500ms) << "the waiter was not woken on the new node";
  }
  std::vector<std::string> left;
  EXPECT_TRUE(eventually(
      [&] {
        left = cluster.leftovers();
        return left.empty();
      },
      5000ms))
      << (left.empty() ? "" : left.front());
}

// During a migration. While the lock is still on the source and its fence counter
// already on the target, a contender's acquire script (lock, fence, lock-delay marker)
// meets TRYAGAIN; the lock's PTTL alone, which the source serves, says it is held: busy,
// not an error (docs/redis-cluster.md "Lock-delay"); the holder renews and releases on
// the source. Once both keys are on the importing node, status, a busy
// acquire and the release follow ASK there. A free lock cannot be acquired until
// the slot is assigned (Redis refuses multi-key commands with a missing key in a
// slot being migrated: TRYAGAIN on both nodes); then MOVED leads to the new owner.
TEST(RedisCluster, AcquireDuringAMigrationFollowsAskAndASplitSlotIsABoundedError) {
  RedisCluster cluster(3);
  const std::string name = cluster.name_on(0, "migrating");
  const auto k = keys_of("distlock", name);
  auto holder = distlock::connect(cluster.url(), quiet());
  auto contender = distlock::connect(cluster.url(), quiet());
  contender.acquire(name, ttl_of(5000ms)).release();  // the fence counter exists
  auto lease = holder.acquire(name, ttl_of(3000ms));
  cluster.begin_move(k.slot, 0, 1);
  const std::string port1 = std::to_string(cluster.node(1).port());
  auto moved = cluster.node(0).command({"MIGRATE", "127.0.0.1", port1, "", "0", "5000", "KEYS", k.fence});
  ASSERT_TRUE(moved && moved->type == REDIS_REPLY_STATUS) << (moved && moved->str ? moved->str : "no reply");

  distlock::detail::Error ec;
  EXPECT_FALSE(contender.try_acquire(name, ttl_of(5000ms)).has_value());  // busy, not an error
  EXPECT_TRUE(lease.owns());

  cluster.migrate_keys(k.slot, 0, 1);        // the lock follows: both keys on node 1, slot still node 0's
  EXPECT_TRUE(contender.status(name).held);  // ASK, ASKING before each command
  EXPECT_FALSE(contender.try_acquire(name, ttl_of(5000ms)).has_value());  // ASK: busy, not an error
  const auto holder_token = lease.token();
  lease.release();  // ASK
  EXPECT_EQ(pttl_asking(cluster.node(1), k.lock), -2) << "the release did not reach the importing node";
  const auto started = Steady::now();
  std::string msg = message_of([&] { contender.try_acquire(name, ttl_of(5000ms)); }, ec);
  const auto took = std::chrono::duration_cast<Millis>(Steady::now() - started);
  EXPECT_EQ(ec, errc::backend_unavailable) << msg;
  EXPECT_NE(msg.find("TRYAGAIN"), std::string::npos) << msg;
  EXPECT_NE(msg.find("after 6 attempts"), std::string::npos) << msg;
  EXPECT_LT(took, 10000ms);  // bounded: 6 attempts with pauses of 10..320 ms, plus round trips

  cluster.finish_move(k.slot, 0, 1);
  auto next = contender.try_acquire(name, ttl_of(5000ms));  // MOVED
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(next->token(), holder_token);
  EXPECT_EQ(integer(cluster.node(1).command({"EXISTS", k.lock})), 1);
  next->release();
}

// A killed master: the locks it held are lost with a stop token within ttl + slack;
// the locks on the other masters keep being renewed and new ones are granted there.
TEST(RedisCluster, AKilledMasterLosesItsLocksAndOnlyThose) {
  RedisCluster cluster(3);
  auto c = distlock::connect(cluster.url(), quiet());
  const Millis ttl = 1500ms;
  std::vector<distlock::Lease> leases;
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    names.push_back(cluster.name_on(i, "kill"));
    leases.push_back(c.acquire(names.back(), ttl_of(ttl)));
  }
  const auto killed_at = Steady::now();
  cluster.kill(0);
  ASSERT_TRUE(eventually([&] { return leases[0].stop_token().stop_requested(); }, ttl + 3000ms));
  const auto lost_after = std::chrono::duration_cast<Millis>(Steady::now() - killed_at);
  EXPECT_FALSE(leases[0].owns());
  // Past another full TTL the others still hold (renewed on their nodes).
  std::this_thread::sleep_for(ttl);
  EXPECT_TRUE(leases[1].owns());
  EXPECT_TRUE(leases[2].owns());
  EXPECT_FALSE(leases[1].stop_token().stop_requested());
  auto other = distlock::connect(cluster.url_of(1), quiet());
  EXPECT_FALSE(other.try_acquire(names[1], ttl_of(ttl)).has_value());
  auto fresh = other.acquire(cluster.name_on(2, "kill", 1), ttl_of(ttl));
  EXPECT_TRUE(fresh.owns());
  distlock::detail::Error ec;
  const std::string msg = message_of([&] { other.try_acquire(names[0], ttl_of(ttl)); }, ec);
  EXPECT_EQ(ec, errc::backend_unavailable) << msg;
  EXPECT_NE(msg.find(std::to_string(cluster.node(0).port())), std::string::npos) << msg;
  RecordProperty("lost_after_ms", static_cast<int>(lost_after.count()));
}

// Many locks over all nodes stay renewed by the client; one backend renew() of 30
// leases (10 per node) runs one EVALSHA per slot, grouped per node (one pipeline
// each), and renews every one of them.
TEST(RedisCluster, RenewalIsBatchedPerNodeAndKeepsManyLocks) {
  RedisCluster cluster(3);
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 10; ++j) names.push_back(cluster.name_on(i, "many", j));
  }
  {
    auto c = distlock::connect(cluster.url(), quiet());
    std::vector<distlock::Lease> leases;
    for (const auto& n : names) leases.push_back(c.acquire(n, ttl_of(1000ms)));
    std::this_thread::sleep_for(3000ms);  // three TTLs: renewed or lost, nothing else
    for (auto& l : leases) EXPECT_TRUE(l.owns()) << l.name();
  }
  distlock::detail::Url url;
  distlock::detail::Error ec;
  ASSERT_FALSE(ec = distlock::detail::parse_url(cluster.url(), url)) << ec.detail();
  auto backend = distlock::detail::find_backend("redis+cluster")(url, quiet(), ec);
  ASSERT_TRUE(backend) << ec.detail();
  std::vector<std::string> owners;
  for (std::size_t i = 0; i < names.size(); ++i)
    owners.push_back("0123456789abcdef0123456789abcdef:" + std::to_string(i));
  std::vector<distlock::detail::RenewItem> items;
  for (std::size_t i = 0; i < names.size(); ++i) {
    auto r = backend->try_acquire({names[i], owners[i], 5000ms}, ec);
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_TRUE(r.acquired) << names[i];
    items.push_back({names[i], owners[i], r.token, 5000ms});
  }
  std::vector<long long> before;
  for (int i = 0; i < 3; ++i) before.push_back(cluster.node(i).command_calls("evalsha"));
  std::vector<distlock::detail::RenewStatus> out(items.size());
  backend->renew(items, out, ec);
  EXPECT_FALSE(ec) << ec.message();
  for (auto s : out) EXPECT_EQ(s, distlock::detail::RenewStatus::renewed);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cluster.node(i).command_calls("evalsha") - before[i], 10) << "node " << i;
  }
  for (std::size_t i = 0; i < names.size(); ++i) backend->release(names[i], owners[i], items[i].token, ec);
}

// A hung master (SIGSTOP) costs a renewal batch at most a quarter of the shortest
// TTL, not the command timeout (10 s here): the other nodes' items come back
// renewed, the hung node's `failed`. While its pipeline is still unanswered the next
// batch does not wait for it at all; once it answers again its items renew again.
TEST(RedisCluster, ARenewalWithAHungMasterIsBoundedAndRenewsTheOtherNodes) {
  RedisCluster cluster(3);
  distlock::detail::Url url;
  distlock::detail::Error ec;
  ASSERT_FALSE(ec = distlock::detail::parse_url(cluster.url(), url)) << ec.detail();
  distlock::ClientOptions o = quiet();
  o.command_timeout = 10000ms;
  auto backend = distlock::detail::find_backend("redis+cluster")(url, o, ec);
  ASSERT_TRUE(backend) << ec.detail();
  const Millis ttl = 8000ms;  // budget: 2 s
  using distlock::detail::RenewStatus;
  std::vector<std::string> names, owners;
  std::vector<distlock::detail::RenewItem> items;
  for (int i = 0; i < 3; ++i) {
    names.push_back(cluster.name_on(i, "hung"));
    owners.push_back("0123456789abcdef0123456789abcdef:" + std::to_string(i));
  }
  for (int i = 0; i < 3; ++i) {
    auto r = backend->try_acquire({names[i], owners[i], ttl}, ec);
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_TRUE(r.acquired) << names[i];
    items.push_back({names[i], owners[i], r.token, ttl});
  }
  std::vector<RenewStatus> out(items.size());
  auto renew_once = [&] {
    std::fill(out.begin(), out.end(), RenewStatus::failed);
    const auto t0 = Steady::now();
    backend->renew(items, out, ec);
    return std::chrono::duration_cast<Millis>(Steady::now() - t0);
  };
  cluster.node(0).pause();
  const Millis first = renew_once();
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(out[0], RenewStatus::failed);
  EXPECT_EQ(out[1], RenewStatus::renewed);
  EXPECT_EQ(out[2], RenewStatus::renewed);
  EXPECT_GE(first, 1900ms) << "the batch did not wait its budget for the hung node";
  EXPECT_LT(first, 5000ms) << "the batch waited for the hung node's command timeout";
  const Millis second = renew_once();
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(out[0], RenewStatus::failed);
  EXPECT_EQ(out[1], RenewStatus::renewed);
  EXPECT_EQ(out[2], RenewStatus::renewed);
  EXPECT_LT(second, 1000ms) << "the batch waited again for a node whose earlier pipeline is unanswered";
  cluster.node(0).resume();
  EXPECT_TRUE(eventually(
      [&] {
        renew_once();
        return !ec &&
               std::all_of(out.begin(), out.end(), [](RenewStatus s) { return s == RenewStatus::renewed; });
      },
      15000ms))
      << "the node that hung did not renew again after it came back";
  for (std::size_t i = 0; i < names.size(); ++i) backend->release(names[i], owners[i], items[i].token, ec);
  RecordProperty("first_batch_ms", static_cast<int>(first.count()));
  RecordProperty("second_batch_ms", static_cast<int>(second.count()));
}

// As redis:// does at connect, every master's configuration is checked, once per
// node and client: a master without AOF gets a warning naming it and the
// consequence; with appendonly yes (and no maxmemory) no warning, a debug line.
TEST(RedisCluster, EveryMasterGetsTheServerConfigurationCheck) {
  for (const bool aof : {false, true}) {
    SCOPED_TRACE(aof ? "appendonly yes" : "appendonly no");
    RedisCluster cluster(3, aof);
    std::mutex mu;
    std::vector<std::pair<distlock::LogLevel, std::string>> lines;
    distlock::ClientOptions o;
    o.logger = [&](distlock::LogLevel level, std::string_view msg) {
      std::lock_guard lk(mu);
      lines.emplace_back(level, std::string(msg));
    };
    auto c = distlock::connect(cluster.url(), o);
    auto count = [&](int node, distlock::LogLevel level, std::string_view what) {
      const std::string port = ":" + std::to_string(cluster.node(node).port());
      std::lock_guard lk(mu);
      return std::count_if(lines.begin(), lines.end(), [&](const auto& l) {
        return l.first == level && l.second.find(port) != std::string::npos &&
               l.second.find(what) != std::string::npos;
      });
    };
    for (int i = 0; i < 3; ++i) {
      if (!aof) {
        EXPECT_TRUE(
            eventually([&] { return count(i, distlock::LogLevel::warning, "appendonly no") > 0; }, 10000ms))
            << "no warning for node " << i;
      } else {
        EXPECT_TRUE(eventually(
            [&] { return count(i, distlock::LogLevel::debug, "configuration checked") > 0; }, 10000ms))
            << "node " << i << " not checked";
      }
    }
    // A lock on every node (more map reads may come) and still one check per node.
    for (int i = 0; i < 3; ++i) c.acquire(cluster.name_on(i, "cfg"), ttl_of(5000ms)).release();
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(count(i, distlock::LogLevel::warning, "appendonly no"), aof ? 0 : 1) << "node " << i;
      EXPECT_EQ(count(i, distlock::LogLevel::debug, "configuration checked"), aof ? 1 : 0) << "node " << i;
    }
    std::lock_guard lk(mu);
    for (const auto& [level, msg] : lines) {
      if (aof) {
        EXPECT_NE(level, distlock::LogLevel::warning) << msg;
      }
    }
  }
}

}  // namespace
}  // namespace distlock::testing
