// The etcd watch's release marks (P/%released/<session lease>, put by every release Txn) and
// sync markers (P/%sync/...) against real etcd (src/etcd/etcd_prefix_watch.cpp,
// etcd_queue.cpp delete_place): locking itself is unharmed — a release hands over at once,
// status/list/try_acquire ignore the marks, nothing is left on the server once the clients
// close — and the watch tells releases apart per key: several releases of one session in a row,
// and many names sharing prefixes handed off at once, are each `released` (never `lost`), in
// token order per name, and names outside the watched prefix are not reported; a key deleted
// from outside is `lost` and the holder's later release adds nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "etcd_cluster.hpp"
#include "support/client_options.hpp"
#include "support/timed_acquire.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

// Every key under `prefix` on the server (etcdctl, keys only).
std::vector<std::string> keys_under(const EtcdCluster& etcd, const std::string& prefix) {
  const std::string out = etcd.etcdctl_ok({"get", "--prefix", prefix, "--keys-only"});
  std::vector<std::string> keys;
  std::size_t at = 0;
  while (at < out.size()) {
    std::size_t nl = out.find('\n', at);
    if (nl == std::string::npos) nl = out.size();
    if (nl > at) keys.push_back(out.substr(at, nl - at));
    at = nl + 1;
  }
  return keys;
}

struct NullSink final : detail::LockEventSink {
  void on_event(detail::LockEvent&&) noexcept override {}
  void on_gap(std::string) noexcept override {}
};

// The marks exist while the clients live and do not disturb locking: status shows the name
// free, list shows only held names, a waiter gets the lock at once after a release (under
// 1 s, steady clock), and once every client has closed nothing is left under the prefix.
TEST(EtcdWatchReleaseMark, MarksDoNotDisturbLockingAndAreGoneAfterClose) {
  EtcdCluster etcd(1);
  {
    Client watcher = connect(etcd.url("?prefix=rmk"), quiet());
    Client locker = connect(etcd.url("?prefix=rmk"), quiet());
    Client waiter = connect(etcd.url("?prefix=rmk"), quiet());
    Watch w = watcher.watch("m/");
    NullSink sink;
    detail::Error ec;
    auto pw = detail::engine_of(watcher)->backend().watch_prefix("m/", sink, ec);
    ASSERT_TRUE(pw) << ec.detail();
    for (const char* n : {"m/a", "m/b", "m/c"}) {
      Lease l = locker.acquire(n, ttl_of(10s, 60s));
    }
    ASSERT_TRUE(pw->sync(ec)) << ec.detail();
    EXPECT_FALSE(keys_under(etcd, "rmk/%released/").empty()) << "no release mark was written";
    EXPECT_FALSE(keys_under(etcd, "rmk/%sync/").empty()) << "no sync marker was written";
    EXPECT_FALSE(locker.status("m/a").held);
    EXPECT_TRUE(locker.list("").empty());
    {
      Lease held = locker.acquire("m/a", ttl_of(10s, 60s));
      const auto listed = waiter.list("");
      ASSERT_EQ(listed.size(), 1u);
      EXPECT_EQ(listed[0].name, "m/a");
      EXPECT_FALSE(waiter.try_acquire("m/a", ttl_of(10s, 0ms)));
      TimedAcquire next(waiter, "m/a", ttl_of(10s, 60s));
      // The waiter is queued behind the holder before the release.
      const auto until = Steady::now() + 10s;
      while (locker.status("m/a").waiters.value_or(0) < 1 && Steady::now() < until)
        std::this_thread::sleep_for(10ms);
      ASSERT_EQ(locker.status("m/a").waiters.value_or(0), 1u);
      const auto released_at = Steady::now();
      held.release();
      next.join();
      ASSERT_TRUE(next.got());
      EXPECT_LT(next.got_at() - released_at, 1s)
          << "the hand-off took " << std::chrono::duration_cast<Millis>(next.got_at() - released_at).count()
          << " ms";
    }
    EXPECT_TRUE(waiter.try_acquire("m/b", ttl_of(10s, 0ms))) << "a free name is taken at once";
  }
  const auto left = keys_under(etcd, "rmk/");
  std::string s;
  for (const auto& k : left) s += "\n  " + k;
  EXPECT_TRUE(left.empty()) << "keys left after every client closed:" << s;
}

// One session releases three names in a row, then takes one again and releases it: every
// end is `released` (its own mark names its own key), never `lost`.
TEST(EtcdWatchReleaseMark, ReleasesInARowOfOneSessionAreEachReleased) {
  EtcdCluster etcd(1);
  Client watcher = connect(etcd.url(), quiet());
  Client locker = connect(etcd.url(), quiet());
  Watch w = watcher.watch("row/");
  for (int round = 0; round < 20; ++round) {
    std::vector<Lease> leases;
    for (const char* n : {"row/a", "row/b", "row/c"}) leases.push_back(locker.acquire(n, ttl_of(10s, 60s)));
    leases.clear();  // three release Txns back to back
    Lease again = locker.acquire("row/a", ttl_of(10s, 60s));
  }
  HandOffOrder names;
  int releases = 0;
  const auto end = Steady::now() + 30s;
  while (releases < 80 && Steady::now() < end) {
    auto e = w.next(10s);
    ASSERT_TRUE(e) << "after " << releases << " releases";
    if (e->kind == WatchEventKind::state) continue;
    ASSERT_NO_FATAL_FAILURE(names.check(*e));
    if (e->kind == WatchEventKind::released) ++releases;
  }
  EXPECT_EQ(releases, 80);
  EXPECT_EQ(names.of("row/a").released, 40);
  EXPECT_EQ(names.of("row/b").released, 20);
  EXPECT_EQ(names.of("row/c").released, 20);
}

// Three names sharing prefixes (a, ab, abc) and one outside the watched prefix, each handed
// off 30 times between two clients at once (six threads): the watch of "mn/a" reports the
// three names only, each in token order, every end a release.
TEST(EtcdWatchReleaseMark, ManyNamesSharingPrefixesHandedOffAtOnce) {
  EtcdCluster etcd(1);
  Client watcher = connect(etcd.url(), quiet());
  Watch w = watcher.watch("mn/a");
  Client c1 = connect(etcd.url(), quiet());
  Client c2 = connect(etcd.url(), quiet());
  const std::vector<std::string> watched = {"mn/a", "mn/ab", "mn/abc"};
  constexpr int kEach = 15;  // per (client, name)
  std::vector<std::thread> threads;
  for (Client* c : {&c1, &c2}) {
    for (const std::string& n :
         {std::string("mn/a"), std::string("mn/ab"), std::string("mn/abc"), std::string("mn/b")}) {
      threads.emplace_back([c, n] {
        for (int i = 0; i < kEach; ++i) Lease l = c->acquire(n, ttl_of(10s, 60s));
      });
    }
  }
  for (auto& t : threads) t.join();
  HandOffOrder names;
  int releases = 0;
  const int expected = 3 * 2 * kEach;
  const auto end = Steady::now() + 60s;
  while (releases < expected && Steady::now() < end) {
    auto e = w.next(10s);
    ASSERT_TRUE(e) << "after " << releases << " releases";
    if (e->kind == WatchEventKind::state) continue;
    ASSERT_NE(e->name, "mn/b") << "a name outside the prefix: " << describe(*e);
    ASSERT_NO_FATAL_FAILURE(names.check(*e));
    if (e->kind == WatchEventKind::released) ++releases;
  }
  EXPECT_EQ(releases, expected);
  for (const auto& n : watched) {
    EXPECT_EQ(names.of(n).acquired, 2 * kEach) << n;
    EXPECT_EQ(names.of(n).released, 2 * kEach) << n;
  }
  EXPECT_FALSE(w.next(200ms)) << "an event after the last release";
}

// A holder's key deleted from outside (etcdctl del) is `lost` from the server's delete; the
// holder's release afterwards (its guarded Txn finds the key gone) writes no mark and reports
// nothing; the same session's next lease is `acquired` and its release `released`: a
// session's release mark never turns another end of that session into a release.
TEST(EtcdWatchReleaseMark, DeleteFromOutsideThenReleaseIsLostOnceThenTheNextLeaseReleases) {
  EtcdCluster etcd(1);
  Client watcher = connect(etcd.url(), quiet());
  Client holder = connect(etcd.url(), quiet());
  Watch w = watcher.watch("race/");
  std::vector<std::string> seen;
  auto next_change = [&](Millis limit) { return next_matching(w, limit, is_change, &seen); };
  {
    Lease l = holder.acquire("race/x", ttl_of(10s, 60s));
    auto acq = next_change(10s);
    ASSERT_TRUE(acq && acq->kind == WatchEventKind::acquired && acq->token == l.token()) << joined(seen);
    std::string key;
    for (const auto& k : keys_under(etcd, "distlock/race%2Fx/")) key = k;
    ASSERT_FALSE(key.empty()) << "the lock key was not found";
    etcd.etcdctl_ok({"del", key});
    auto lost = next_change(10s);
    ASSERT_TRUE(lost) << joined(seen);
    EXPECT_EQ(lost->kind, WatchEventKind::lost) << joined(seen);
    EXPECT_EQ(lost->token, l.token());
    EXPECT_FALSE(lost->inferred) << joined(seen);
    std::error_code ec;
    l.release(ec);  // the key is gone: nothing to release, no mark
  }
  {
    Lease l2 = holder.acquire("race/x", ttl_of(10s, 60s));
    auto acq = next_change(10s);
    ASSERT_TRUE(acq) << joined(seen);
    EXPECT_EQ(acq->kind, WatchEventKind::acquired) << joined(seen);
    EXPECT_EQ(acq->token, l2.token()) << joined(seen);
    const std::uint64_t t2 = l2.token();
    l2.release();
    auto rel = next_change(10s);
    ASSERT_TRUE(rel) << joined(seen);
    EXPECT_EQ(rel->kind, WatchEventKind::released) << joined(seen);
    EXPECT_EQ(rel->token, t2) << joined(seen);
  }
  EXPECT_FALSE(next_change(500ms)) << "an event after the release:" << joined(seen);
}

}  // namespace
}  // namespace distlock::testing
