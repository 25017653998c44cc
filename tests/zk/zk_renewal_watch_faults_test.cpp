// zk:// renewals confirmed by a held node's data watch and the batch's sync (src/zk/zk_queue.cpp,
// ZkBackend::confirm) under the changes that could leave a node "armed" while it is gone or no
// longer this session's: the same path deleted and created again by another session between
// renewals; a session expiry (the next session reads its nodes itself); a holder, a waiter and a
// prefix watch of one client on one lock's queue; a node deleted while the holder's connection to
// its follower was frozen, with the renewal's sync answered after the freeze. Each renewal is a
// Client::renew_now() (no background renewer), so every confirmation is observed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "support/fault_proxy.hpp"
#include "zk/zk_backend.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_server.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

detail::ZkStats stats_of(Client& c) {
  return detail::zk_stats(detail::engine_of(c)->backend()).value();
}

// Renewals only by renew_now(); a TTL of twice the session timeout (the most zk:// accepts), so
// that no local deadline ends a lease during a test.
ClientOptions manual() {
  ClientOptions o = quiet();
  o.background_renewal = false;
  return o;
}

LockOptions long_ttl(std::chrono::milliseconds session) {
  LockOptions o;
  o.ttl = 2 * session;
  o.wait = 20s;
  return o;
}

// The one lock node of `name` (its queue has one node), as a full path.
std::string only_node(RawZk& raw, const std::string& name) {
  const std::string dir = detail::zk::lock_dir(name);
  std::string node;
  for (const auto& ch : raw.children(dir))
    if (ch.find("lock-") != std::string::npos) node = ch;
  return node.empty() ? std::string{} : dir + "/" + node;
}

// Two renewals: the first reads the node (arming its watch), the second is the sync alone.
void arm(Client& c, std::uint64_t reads_before) {
  ASSERT_EQ(c.renew_now(), 1U);
  ASSERT_EQ(c.renew_now(), 1U);
  ASSERT_EQ(stats_of(c).renew_reads, reads_before + 1) << "read once, then confirmed by the sync";
}

// The holder's node deleted and a node created at the very same path by another session
// (ephemeral, so a different czxid and owner) between two renewals: the delete's notification
// disarms the path, the next renewal reads it and refuses the lease.
TEST(ZkRenewalWatchFaults, SamePathCreatedAgainByAnotherSessionIsRefused) {
  ZkServer& zk = shared_server();
  Client c = connect(zk.url("?session_timeout=6s"), manual());
  Lease l = c.acquire("rwf/same-path", long_ttl(6s));
  arm(c, 0);
  RawZk other(zk.hostport());
  const std::string path = only_node(other, "rwf/same-path");
  ASSERT_FALSE(path.empty());
  ASSERT_EQ(other.remove(path), ZOK);
  ASSERT_EQ(other.create(path, ZOO_EPHEMERAL), ZOK);
  EXPECT_EQ(c.renew_now(), 0U) << "a renewal confirmed a node another session created at the same path";
  EXPECT_TRUE(l.stop_token().stop_requested());
  EXPECT_NE(l.loss_reason(), LossReason::none);
  EXPECT_EQ(stats_of(c).renew_reads, 2U);
  std::printf("same path re-created: lost with %s after %llu reads\n", to_string(l.loss_reason()),
              static_cast<unsigned long long>(stats_of(c).renew_reads));
}

// A session expired under an armed lease: the lease is lost, and a lease of the
// next session is read by its own first renewal (no armed path is carried over), after which a
// delete of its node from outside still ends it at the next renewal.
TEST(ZkRenewalWatchFaults, NextSessionArmsItsOwnNodes) {
  ZkServer& zk = shared_server();
  Client c = connect(zk.url("?session_timeout=4s"), manual());
  Lease first = c.acquire("rwf/expiry/a", long_ttl(4s));
  arm(c, 0);
  {
    const auto st = stats_of(c);
    clientid_t id{};
    id.client_id = st.session_id;
    ASSERT_EQ(st.session_password.size(), sizeof(id.passwd));
    std::copy(st.session_password.begin(), st.session_password.end(), id.passwd);
    RawZk attach(zk.hostport(), id);  // closing it expires the holder's session
  }
  // The C client reconnects, learns the expiry, and the backend opens a new session; bound 20 s.
  ASSERT_TRUE(eventually([&] { return stats_of(c).sessions >= 2 && stats_of(c).session_id != 0; }, 20s))
      << "no new session";
  EXPECT_EQ(c.renew_now(), 0U);
  EXPECT_TRUE(eventually([&] { return first.stop_token().stop_requested(); }, 5s));
  // zk:// reports each held lease of the expired session through on_lease_lost: lease_ended
  // (docs/metrics.md); LossReason::session_lost is documented for it in hold.hpp too.
  EXPECT_TRUE(first.loss_reason() == LossReason::lease_ended ||
              first.loss_reason() == LossReason::session_lost)
      << to_string(first.loss_reason());

  const auto reads = stats_of(c).renew_reads;
  Lease second = c.acquire("rwf/expiry/b", long_ttl(4s));
  arm(c, reads);
  RawZk other(zk.hostport());
  const std::string path = only_node(other, "rwf/expiry/b");
  ASSERT_FALSE(path.empty());
  ASSERT_EQ(other.remove(path), ZOK);
  EXPECT_EQ(c.renew_now(), 0U) << "the next session confirmed a deleted node";
  EXPECT_TRUE(second.stop_token().stop_requested());
}

// One client holds a lock, waits for the same lock under another acquisition, and watches the
// prefix (its readings of the queue set data and child watches of the same session on the same
// paths): a delete of the holder's node from outside ends the hold at the next renewal, the
// waiter is granted with a greater token, and a second lock of the client stays held and read once.
TEST(ZkRenewalWatchFaults, HolderWaiterAndWatchOfOneClientOnOneQueue) {
  ZkServer& zk = shared_server();
  Client c = connect(zk.url("?session_timeout=6s"), manual());
  Watch w = c.watch("rwf/queue/");
  Lease held = c.acquire("rwf/queue/x", long_ttl(6s));
  Lease kept = c.acquire("rwf/queue/y", long_ttl(6s));
  ASSERT_EQ(c.renew_now(), 2U);
  auto waiter = std::async(std::launch::async, [&] { return c.acquire("rwf/queue/x", long_ttl(6s)); });
  RawZk other(zk.hostport());
  const std::string dir = detail::zk::lock_dir("rwf/queue/x");
  // The waiter's node is queued behind the holder's (bound 10 s).
  ASSERT_TRUE(eventually([&] { return other.children(dir).size() >= 2; }, 10s)) << "waiter not queued";
  ASSERT_EQ(c.renew_now(), 2U);
  ASSERT_EQ(c.renew_now(), 2U);
  EXPECT_EQ(stats_of(c).renew_reads, 2U) << "two held nodes, each read once";

  // The holder's node: the first in the queue.
  const auto queue = detail::zk::queue_order(other.children(dir));
  ASSERT_GE(queue.size(), 2U);
  ASSERT_EQ(other.remove(dir + "/" + queue.front().node), ZOK);
  ASSERT_EQ(waiter.wait_for(20s), std::future_status::ready) << "the waiter was not granted";
  Lease next = waiter.get();
  EXPECT_GT(next.token(), held.token());
  // The old hold ends at the next renewal at the latest (the waiter is held now: 2 renewed).
  const std::size_t renewed = c.renew_now();
  EXPECT_TRUE(held.stop_token().stop_requested()) << "the holder was not told at its next renewal";
  EXPECT_EQ(renewed, 2U);
  EXPECT_TRUE(kept.owns());
  EXPECT_TRUE(next.owns());
}

// The watch-before-answer order, observed through the C client's two threads (the watcher
// callback and the sync's completion both run on its completion thread, in the order the server
// sent them): a node deleted through the leader, the delete answered, then at once a renewal
// through a follower. The follower applied the delete before it answers the sync, so the
// notification reaches the holder first and the renewal never confirms the node. 40 rounds,
// each a fresh lease armed by two renewals (bounded by the rounds, about 6 s in all).
void delete_then_renew_rounds(Client& c, RawZk& deleter, const std::string& prefix, int rounds) {
  int confirmed_after_delete = 0;
  for (int i = 0; i < rounds; ++i) {
    const std::string name = prefix + std::to_string(i);
    Lease l = c.acquire(name, long_ttl(6s));
    ASSERT_EQ(c.renew_now(), 1U);
    ASSERT_EQ(c.renew_now(), 1U);
    const std::string path = only_node(deleter, name);
    ASSERT_FALSE(path.empty());
    ASSERT_EQ(deleter.remove(path), ZOK);
    if (c.renew_now() != 0U) ++confirmed_after_delete;
    EXPECT_TRUE(l.stop_token().stop_requested()) << name;
  }
  EXPECT_EQ(confirmed_after_delete, 0) << "renewals confirmed a node already deleted, of " << rounds;
}

TEST(ZkRenewalWatchFaults, DeleteAnsweredBeforeTheRenewalIsNeverConfirmed) {
  ZkServer& zk = shared_server();
  Client c = connect(zk.url("?session_timeout=6s"), manual());
  RawZk other(zk.hostport());
  delete_then_renew_rounds(c, other, "rwf/order/", 40);
  EXPECT_EQ(stats_of(c).renew_reads, 80U) << "each lease read at its first renewal and after the delete";
}

TEST(ZkRenewalWatchFaults, DeleteThroughTheLeaderIsNeverConfirmedThroughAFollower) {
  ZkEnsemble ensemble(3);
  const int leader = ensemble.leader();
  ASSERT_GE(leader, 0) << "no leader elected";
  const int follower = (leader + 1) % ensemble.size();
  Client c = connect(ensemble.server(follower).url("?session_timeout=6s&timeout=5s"), manual());
  RawZk on_leader(ensemble.server(leader).hostport());
  delete_then_renew_rounds(c, on_leader, "rwf/order-follower/", 40);
}

// Holder on a follower through a proxy, node armed. The proxy freezes (the connection stays
// open), the node is deleted through the leader, and a renewal is sent into the frozen
// connection; the proxy passes again while that renewal waits for its sync. The follower sends
// the delete's notification before the sync's answer, so the renewal reads the node again and
// refuses the lease: no renewal is confirmed after the freeze.
TEST(ZkRenewalWatchFaults, NodeDeletedWhileFrozenIsNotConfirmedByTheLateSync) {
  ZkEnsemble ensemble(3);
  const int leader = ensemble.leader();
  ASSERT_GE(leader, 0) << "no leader elected";
  const int follower = (leader + 1) % ensemble.size();
  FaultProxy proxy(ensemble.server(follower).port());
  // 9 s sessions: the C client gives up on a silent connection after 2/3 of it (6 s), well
  // after the freeze below ends; renewals wait up to 5 s for the sync.
  Client c =
      connect("zk://127.0.0.1:" + std::to_string(proxy.port()) + "?session_timeout=9s&timeout=5s", manual());
  Lease l = c.acquire("rwf/frozen", long_ttl(9s));
  arm(c, 0);
  const auto renewed_before = c.stats().renewed_leases;

  proxy.freeze();
  RawZk on_leader(ensemble.server(leader).hostport());
  RawZk on_follower(ensemble.server(follower).hostport());
  const std::string path = only_node(on_leader, "rwf/frozen");
  ASSERT_FALSE(path.empty());
  ASSERT_EQ(on_leader.remove(path), ZOK);
  // The follower applied the delete (its own client sees it gone; bound 10 s).
  ASSERT_TRUE(eventually([&] { return on_follower.exists(path) == ZNONODE; }, 10s));
  const auto syncs = stats_of(c).renew_syncs;
  auto renewal = std::async(std::launch::async, [&] { return c.renew_now(); });
  // The renewal's sync is sent into the frozen connection (bound 5 s), then the proxy passes.
  ASSERT_TRUE(eventually([&] { return stats_of(c).renew_syncs > syncs; }, 5s));
  proxy.pass();
  ASSERT_EQ(renewal.wait_for(20s), std::future_status::ready);
  EXPECT_EQ(renewal.get(), 0U) << "the late sync confirmed a node deleted during the freeze";
  EXPECT_TRUE(eventually([&] { return l.stop_token().stop_requested(); }, 10s));
  EXPECT_EQ(c.stats().renewed_leases, renewed_before) << "a renewal was confirmed after the freeze";
  // One connection all along: the notification came on it, not with a reconnect's re-read.
  EXPECT_EQ(proxy.accepted(), 1) << "the client reconnected";
  std::printf("frozen follower: lost with %s; %llu reads, %llu sessions, %d connections\n",
              to_string(l.loss_reason()), static_cast<unsigned long long>(stats_of(c).renew_reads),
              static_cast<unsigned long long>(stats_of(c).sessions), proxy.accepted());
}

}  // namespace
}  // namespace distlock::testing

namespace distlock::testing {
namespace {

// Long names (4,000 bytes, the limit is 4,096) make each held node's path about 4 KB. `n` leases
// acquired through a proxy; `armed`: renewed twice (each node's data watch set), else never
// renewed (no watch). Then the proxy drops the connection and passes again: the C client
// reconnects and sends, first on the new connection, one SetWatches request naming every watched
// path. Returns the leases renewed by the first renew_now() that renews any after the drop
// (polled for up to `within`), 0 if none did.
std::size_t renewed_after_reconnect(int n, bool armed, std::chrono::milliseconds within, int& connections) {
  ZkServer& zk = shared_server();
  FaultProxy proxy(zk.port());
  // A 30 s session: the leases' validity is the session's, and 300 acquisitions of 4 KB names
  // took about 10 s in a loaded CI run (the first 27 leases had expired before their first
  // renewal with a 10 s session); on a quiet machine they take about 1 s.
  Client c =
      connect("zk://127.0.0.1:" + std::to_string(proxy.port()) + "?session_timeout=30s&timeout=3s", manual());
  std::vector<Lease> held;
  const std::string tail(4000, 'x');
  const std::string prefix = armed ? "rwf/big-armed/" : "rwf/big-plain/";
  const auto acquiring = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i)
    held.push_back(c.acquire(prefix + std::to_string(i) + "/" + tail, long_ttl(30s)));
  std::printf("%d acquisitions took %lld ms\n", n,
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - acquiring)
                                         .count()));
  if (armed) {
    EXPECT_EQ(c.renew_now(), static_cast<std::size_t>(n));
    EXPECT_EQ(c.renew_now(), static_cast<std::size_t>(n));
  }
  proxy.drop();
  // The client sees the connection gone: a renewal fails (bound 10 s).
  EXPECT_TRUE(eventually([&] { return c.renew_now() == 0; }, 10s));
  proxy.pass();
  std::size_t renewed = 0;
  const auto end = std::chrono::steady_clock::now() + within;
  while (renewed == 0 && std::chrono::steady_clock::now() < end) {
    renewed = c.renew_now();
    if (renewed == 0) std::this_thread::sleep_for(100ms);
  }
  connections = proxy.accepted();
  return renewed;
}

// Control: 300 held leases whose nodes carry no watch reconnect at once.
TEST(ZkRenewalWatchFaults, ManyLongNamedLeasesWithoutWatchesReconnect) {
  int connections = 0;
  const std::size_t renewed = renewed_after_reconnect(300, false, 15s, connections);
  std::printf("300 unwatched long-named leases: %zu renewed after the reconnect, %d connections\n", renewed,
              connections);
  EXPECT_EQ(renewed, 300U);
}

// 300 armed leases: their 300 data watches (about 1.2 MB of paths) go into the reconnect's one
// SetWatches request, over the server's 1 MB jute.maxbuffer.
TEST(ZkRenewalWatchFaults, ManyLongNamedArmedLeasesReconnect) {
  int connections = 0;
  const std::size_t renewed = renewed_after_reconnect(300, true, 15s, connections);
  std::printf("300 armed long-named leases: %zu renewed after the reconnect, %d connections\n", renewed,
              connections);
  EXPECT_EQ(renewed, 300U) << "the client could not work again after a reconnect (" << connections
                           << " connections accepted)";
}

}  // namespace
}  // namespace distlock::testing
