// zk:// renewals confirmed by a data watch and a sync (src/zk/zk_queue.cpp, ZkBackend::confirm):
// each held node is read once (the read arms its data watch), later renewals send the sync
// alone; a revoke's mark or a delete of the node from outside fires the watch, and the next
// renewal reads the node again and ends the lease, as when every renewal read every node.
// Also: a zk:// watch makes no expiry re-reads (the server publishes every lease's end).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "zk/zk_backend.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_server.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

// The clients below ask for a 4 s session with 1 s leases: renewals every 333 ms as with any
// session, and a connection the C client drops only after about 2.7 s without an answer (a
// reconnect disarms every node, and the exact read counts below would then be off).
detail::ZkStats stats_of(Client& c) {
  return detail::zk_stats(detail::engine_of(c)->backend()).value();
}

LockOptions ttl_of(std::chrono::milliseconds ttl) {
  LockOptions o;
  o.ttl = ttl;
  o.wait = 10s;
  return o;
}

// 20 leases: each read once at its first renewal (arming its watch); over the next three
// renewal intervals (1 s; at least 8 batches) the batches are syncs alone and every lease
// stays held.
TEST(ZkRenewalWatch, EachHeldNodeIsReadOnce) {
  ZkServer& zk = shared_server();
  Client c = connect(zk.url("?session_timeout=4s"), quiet());
  std::vector<Lease> held;
  for (int i = 0; i < 20; ++i) held.push_back(c.acquire("rw/once/" + std::to_string(i), ttl_of(1s)));
  // First renewals at about ttl/3 = 333 ms after each acquisition; bound 10 s.
  ASSERT_TRUE(eventually([&] { return stats_of(c).renew_reads >= 20; }, 10s))
      << "renew_reads " << stats_of(c).renew_reads;
  const auto armed = stats_of(c);
  const auto from = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually(
      [&] {
        return stats_of(c).renew_syncs >= armed.renew_syncs + 8 &&
               std::chrono::steady_clock::now() - from >= 1s;
      },
      15s))
      << "renew_syncs " << stats_of(c).renew_syncs << " from " << armed.renew_syncs;
  const auto after = stats_of(c);
  EXPECT_EQ(after.renew_reads, 20U) << "one read per held node, then syncs alone";
  EXPECT_EQ(after.sessions, 1U);
  for (auto& l : held) EXPECT_TRUE(l.owns()) << l.name();
  std::printf("20 leases over 1 s after the first reads: %llu renewal batches (syncs), %llu node reads\n",
              static_cast<unsigned long long>(after.renew_syncs - armed.renew_syncs),
              static_cast<unsigned long long>(after.renew_reads - armed.renew_reads));
}

// Armed nodes, then a revoke of one (its data rewritten) and a delete of another from
// outside: each ends its lease at the next renewal (its stop token fires), the third lease
// stays held; two more reads than nodes.
TEST(ZkRenewalWatch, RevokeAndOutsideDeleteStillEndTheLease) {
  ZkServer& zk = shared_server();
  Client c = connect(zk.url("?session_timeout=4s"), quiet());
  Client admin = connect(zk.url(), quiet());
  Lease revoked = c.acquire("rw/end/revoked", ttl_of(1s));
  Lease deleted = c.acquire("rw/end/deleted", ttl_of(1s));
  Lease kept = c.acquire("rw/end/kept", ttl_of(1s));
  // Every node read once (armed), and one sync-only batch after that.
  ASSERT_TRUE(eventually([&] { return stats_of(c).renew_reads >= 3; }, 10s));
  const auto armed = stats_of(c);
  ASSERT_TRUE(eventually([&] { return stats_of(c).renew_syncs >= armed.renew_syncs + 2; }, 10s));
  ASSERT_EQ(stats_of(c).renew_reads, 3U);

  ASSERT_TRUE(admin.revoke("rw/end/revoked", "test").revoked);
  RawZk raw(zk.hostport());
  const std::string dir = detail::zk::lock_dir("rw/end/deleted");
  const auto children = raw.children(dir);
  std::string node;
  for (const auto& ch : children)
    if (ch.find("lock-") != std::string::npos) node = ch;
  ASSERT_FALSE(node.empty()) << "no lock node under " << dir;
  ASSERT_EQ(raw.remove(dir + "/" + node), ZOK);

  // Found at the next renewal: within one renewal interval (333 ms) and its round trip; bound 5 s.
  EXPECT_TRUE(eventually([&] { return revoked.stop_token().stop_requested(); }, 5s)) << "revoke not seen";
  EXPECT_TRUE(eventually([&] { return deleted.stop_token().stop_requested(); }, 5s)) << "delete not seen";
  EXPECT_TRUE(kept.owns());
  EXPECT_EQ(stats_of(c).renew_reads, 5U) << "the two notified nodes read again, the kept one not";
}

// A watch of zk:// with WatchOptions::expiry_checks on (the default) reads no lock status:
// the API layer would re-read a held name 1 s after its `acquired`, then every 1-1.1 s (its
// remaining TTL is unknown on zk://); over 3.5 s with the lock held, the watching client's
// backend counts no status read and the watch reports nothing.
TEST(ZkRenewalWatch, WatchMakesNoExpiryReads) {
  ZkServer& zk = shared_server();
  Client holder = connect(zk.url(), quiet());
  Client watcher = connect(zk.url(), quiet());
  Watch w = watcher.watch("rw/exp/");
  Lease l = holder.acquire("rw/exp/x", ttl_of(2s));
  auto got = w.next(10s);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->kind, WatchEventKind::acquired);
  const auto reads_before = stats_of(watcher).status_reads;
  // Three expiry checks would have run by now (1 s after the acquired, then every 1-1.1 s).
  const auto end = std::chrono::steady_clock::now() + 3500ms;
  while (std::chrono::steady_clock::now() < end) {
    auto e = w.next(100ms);
    EXPECT_FALSE(e) << "unexpected event " << to_string(e->kind);
  }
  EXPECT_EQ(stats_of(watcher).status_reads, reads_before) << "a zk:// watch re-read a lock's status";
  EXPECT_TRUE(l.owns());
}

}  // namespace
}  // namespace distlock::testing
