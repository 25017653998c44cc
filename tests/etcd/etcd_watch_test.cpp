// Client::watch on etcd:// (distlock/watch.hpp, src/etcd/etcd_prefix_watch.cpp): the event
// stream of a prefix against real etcd members each test starts — hand-offs in token order,
// a killed holder as a loss from the server, a revoke as revoked, the initial state and the
// prefix filter, a server restart and a cut connection as gaps followed by the state, a
// compacted resume revision as a gap, sync as a barrier through the stream, a member of a
// 3-member cluster killed under the watch, and stop() from another thread.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "etcd_cluster.hpp"
#include "support/client_options.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/watch_lease_ends.hpp"
#include "support/watch_next_acquired.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

// Reads events until a gap whose detail holds `gap_text` (empty: any gap) and, after it, a
// `state` of `name` with held == `held` (and `token`, when non-zero); every event before is
// recorded in `seen`. False at `limit` (steady clock).
bool gap_then_state(Watch& w, const std::string& gap_text, const std::string& name, bool held,
                    std::uint64_t token, Millis limit, std::vector<std::string>& seen) {
  bool gap = false;
  const auto end = Steady::now() + limit;
  while (Steady::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Steady::now()));
    if (!e) return false;
    seen.push_back(describe(*e));
    if (e->kind == WatchEventKind::gap && e->detail.find(gap_text) != std::string::npos) gap = true;
    if (gap && e->kind == WatchEventKind::state && e->name == name && e->held == held &&
        (token == 0 || e->token == token))
      return true;
  }
  return false;
}

// 1,000 hand-offs of one name between two clients: every `acquired` carries a token above
// the last and is followed by the release of exactly that token before the next `acquired`;
// nothing is missing, nothing is a gap or a loss.
TEST(EtcdPrefixWatch, ThousandHandOffsComeInTokenOrder) {
  EtcdCluster etcd(1);
  Client watcher = connect(etcd.url(), quiet());
  Watch w = watcher.watch("ho/");
  ASSERT_NO_FATAL_FAILURE(expect_hand_offs_in_token_order(w, etcd.url(), "ho/x", 1000, 60s));
}

// A holder killed with SIGKILL: its session lease expires and etcd deletes its key with no
// release mark; the watch reports `lost` from that delete (not inferred) with the lease's
// token, within the TTL (2 s) plus etcd's expiry check and slack.
TEST(EtcdPrefixWatch, KilledHolderShowsAsLost) {
  EtcdCluster etcd(1);
  Client watcher = connect(etcd.url(), quiet());
  Watch w = watcher.watch("kill/");
  KilledHolder k;
  ASSERT_NO_FATAL_FAILURE(expect_killed_holder_lost(w, etcd.url(), "kill/x", 2000, k));
  const WatchEvent& lost = k.lost;
  EXPECT_FALSE(lost.inferred) << "the server's delete was not reported: " << describe(lost);
  EXPECT_NE(lost.detail.find("without a release"), std::string::npos) << lost.detail;
  EXPECT_LT(k.after_kill, 10s);
}

// A revoke moves the holder's key onto a lease of its own with the revoke value: the watch
// reports `revoked` with the token of that lease, and neither the holder's refused renewal
// nor the end of the revoked key's lease adds anything after it.
TEST(EtcdPrefixWatch, RevokeShowsAsRevoked) {
  EtcdCluster etcd(1);
  Client holder = connect(etcd.url(), quiet());
  Client admin = connect(etcd.url(), quiet());
  Watch w = admin.watch("rv/");
  // The revoked key waits out its lease (TTL 2 s + 1 s) and goes: no event of it.
  ASSERT_NO_FATAL_FAILURE(expect_revoke_then_nothing(w, holder, admin, "rv/x", 4s));
}

// Lock-delay: a revoked holder with lock_delay 3 s leaves its marker armed; the waiter that
// becomes first when the revoked key's lease ends (TTL 1 s + 1 s) waits the delay out before
// it takes the marker over. The watch reports its `acquired` at that takeover, not when its
// key became first: no earlier than 1.5 s before its acquire() returned (half the delay, on
// the test's steady clock), and after the `revoked` of the first holder.
TEST(EtcdPrefixWatch, LockDelayHoldsTheAcquiredBackUntilTheMarkerIsTaken) {
  EtcdCluster etcd(1);
  Client holder = connect(etcd.url(), quiet());
  Client waiter = connect(etcd.url(), quiet());
  Client admin = connect(etcd.url(), quiet());
  Watch w = admin.watch("ld/");
  LockOptions o = ttl_of(1s, 60s);
  o.lock_delay = 3s;
  Lease first = holder.acquire("ld/x", o);
  ASSERT_NO_FATAL_FAILURE(expect_next_acquired(w, first));
  std::promise<std::pair<std::uint64_t, Steady::time_point>> got;
  std::thread t([&] {
    Lease l = waiter.acquire("ld/x", ttl_of(10s, 60s));
    got.set_value({l.token(), Steady::now()});
  });
  ASSERT_TRUE(admin.revoke("ld/x", "test").revoked);
  auto rv = next_change(w, 10s);
  ASSERT_TRUE(rv);
  EXPECT_EQ(rv->kind, WatchEventKind::revoked) << describe(*rv);
  auto second = next_change(w, 20s);
  const auto seen_at = Steady::now();
  t.join();
  const auto [token, returned_at] = got.get_future().get();
  ASSERT_TRUE(second);
  EXPECT_EQ(second->kind, WatchEventKind::acquired) << describe(*second);
  EXPECT_EQ(second->token, token);
  EXPECT_GT(seen_at + 1500ms, returned_at)
      << "acquired reported "
      << std::chrono::duration_cast<std::chrono::milliseconds>(returned_at - seen_at).count()
      << " ms before the waiter was granted";
}

// The initial state lists what was held before the watch started (under the prefix only),
// and a change of a name outside the prefix is never reported.
TEST(EtcdPrefixWatch, InitialStateAndPrefixFilter) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url(), quiet());
  Lease held = c.acquire("pre/held", ttl_of(30s, 60s));
  Lease other = c.acquire("other/x", ttl_of(30s, 60s));
  Lease near = c.acquire("prf/x", ttl_of(30s, 60s));  // shares "pr" only
  Watch w = c.watch("pre/");
  const std::uint64_t held_token = held.token();
  ASSERT_NO_FATAL_FAILURE(expect_held_state(w, "pre/held", held_token));
  other.release();
  near.release();
  Lease again = c.acquire("other/x", ttl_of(30s, 60s));
  held.release();
  auto e = w.next(10s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, WatchEventKind::released) << describe(*e);
  EXPECT_EQ(e->name, "pre/held");
  EXPECT_EQ(e->token, held_token);
  auto more = w.next(1s);
  EXPECT_FALSE(more) << describe(*more);
}

// The member stops (SIGKILL) and comes back on the same data: the held lock survives. The
// watch reports a gap, then the held lock as a `state` with its token, and live events after.
TEST(EtcdPrefixWatch, ServerRestartIsAGapThenTheState) {
  EtcdCluster etcd(1);
  Client holder = connect(etcd.url(), quiet());
  Client watcher = connect(etcd.url(), quiet());
  Watch w = watcher.watch("gap/");
  Lease a = holder.acquire("gap/a", ttl_of(60s, 60s));
  ASSERT_NO_FATAL_FAILURE(expect_next_acquired(w, a));
  etcd.kill(0);
  etcd.restart(0);
  std::vector<std::string> seen;
  ASSERT_TRUE(gap_then_state(w, "", "gap/a", true, a.token(), 30s, seen)) << joined(seen);
  for (const auto& s : seen) EXPECT_EQ(s.find("acquired"), std::string::npos) << joined(seen);
  // Live again: a new lock's events arrive, in order.
  ASSERT_NO_FATAL_FAILURE(expect_live_again(w, holder, "gap/b", 15s));
}

// The watcher's connection is cut (a fault proxy drops it) while locks change and the
// revisions it has not seen are compacted; when it comes back its resume revision is gone:
// a gap naming the compaction, then the state read again (the lock taken while cut, held;
// the one released while cut, free), then live events.
TEST(EtcdPrefixWatch, CompactedResumeRevisionIsAGapThenTheState) {
  EtcdCluster etcd(1);
  FaultProxy proxy(etcd.client_port(0));
  Client watcher = connect("etcd://127.0.0.1:" + std::to_string(proxy.port()), quiet());
  Client locker = connect(etcd.url(), quiet());
  Watch w = watcher.watch("cp/");
  std::optional<Lease> a = locker.acquire("cp/a", ttl_of(60s, 60s));
  const std::uint64_t a_token = a->token();
  auto acq = next_change(w, 10s);
  ASSERT_TRUE(acq);
  ASSERT_EQ(acq->kind, WatchEventKind::acquired) << describe(*acq);
  proxy.drop();
  auto broke = next_change(w, 15s);
  ASSERT_TRUE(broke) << "the cut was not reported";
  ASSERT_EQ(broke->kind, WatchEventKind::gap) << describe(*broke);
  a.reset();  // released while the watcher is cut off
  Lease b = locker.acquire("cp/b", ttl_of(60s, 60s));
  for (int i = 0; i < 5; ++i) Lease c = locker.acquire("cp/c", ttl_of(60s, 60s));
  etcd.etcdctl_ok({"compaction", std::to_string(etcd.revision())});
  proxy.pass();
  std::vector<std::string> seen;
  // The gap naming the compaction comes first; the one after the state was read again, then
  // the re-list's state.
  ASSERT_TRUE(gap_then_state(w, "read the state again", "cp/b", true, b.token(), 30s, seen)) << joined(seen);
  bool compaction_named = false;
  for (const auto& s : seen)
    if (s.starts_with("gap") && s.find("compacted the revisions up to") != std::string::npos)
      compaction_named = true;
  EXPECT_TRUE(compaction_named) << joined(seen);
  // cp/a was believed held: the re-list reports it free (before or after cp/b's state).
  bool a_free = false;
  for (const auto& s : seen)
    if (s.starts_with("state cp/a token=" + std::to_string(a_token))) a_free = true;
  for (int i = 0; i < 10 && !a_free; ++i) {
    auto e = w.next(3s);
    if (!e) break;
    seen.push_back(describe(*e));
    if (e->kind == WatchEventKind::state && e->name == "cp/a" && !e->held) a_free = true;
  }
  EXPECT_TRUE(a_free) << joined(seen);
  for (const auto& s : seen)
    EXPECT_FALSE(s.starts_with("acquired cp/c")) << "an event from the compacted revisions";
  Lease d = locker.acquire("cp/d", ttl_of(60s, 60s));
  std::optional<WatchEvent> e;
  do {
    e = next_change(w, 15s);
    if (e) seen.push_back(describe(*e));
  } while (e && e->kind == WatchEventKind::gap);
  ASSERT_TRUE(e) << "no live event after the re-read:" << joined(seen);
  EXPECT_EQ(e->kind, WatchEventKind::acquired) << describe(*e);
  EXPECT_EQ(e->token, d.token());
}

// A sink that records what the backend gives it.
struct RecordingSink final : detail::LockEventSink {
  std::mutex mu;
  std::vector<detail::LockEvent> events;
  int gaps = 0;
  void on_event(detail::LockEvent&& ev) noexcept override {
    std::lock_guard lk(mu);
    events.push_back(std::move(ev));
  }
  void on_gap(std::string) noexcept override {
    std::lock_guard lk(mu);
    ++gaps;
  }
};

// sync is a barrier through the stream: once it returns, the release another client made
// before the call has been given to the sink (200 rounds, each checked at once).
TEST(EtcdPrefixWatch, SyncDeliversEveryEarlierChange) {
  EtcdCluster etcd(1);
  Client watcher = connect(etcd.url(), quiet());
  Client locker = connect(etcd.url(), quiet());
  RecordingSink sink;
  detail::Error ec;
  auto pw = detail::engine_of(watcher)->backend().watch_prefix("sy/", sink, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  ASSERT_TRUE(pw);
  constexpr int kRounds = 200;
  for (int i = 0; i < kRounds; ++i) {
    std::uint64_t token = 0;
    {
      Lease l = locker.acquire("sy/x", ttl_of(10s, 60s));
      token = l.token();
    }
    ASSERT_TRUE(pw->sync(ec)) << ec.message() << " " << ec.detail();
    std::lock_guard lk(sink.mu);
    ASSERT_GE(sink.events.size(), 2u);
    const auto& last = sink.events.back();
    ASSERT_EQ(last.kind, detail::LockEvent::Kind::released) << "round " << i;
    ASSERT_EQ(last.token, token) << "round " << i;
  }
  std::lock_guard lk(sink.mu);
  EXPECT_EQ(sink.events.size(), 2u * kRounds);
  EXPECT_EQ(sink.gaps, 0);
}

// A 3-member cluster: the member serving the watch is killed; the watch reports a gap,
// resumes on another member, and hand-offs before and after come in token order, each
// closed before the next.
TEST(EtcdPrefixWatch, ClusterMemberKilledUnderTheWatch) {
  EtcdCluster etcd(3);
  Client watcher = connect(etcd.url(), quiet());
  Client locker = connect(etcd.url(), quiet());
  Watch w = watcher.watch("c3/");
  HandOffOrder order;
  const auto& ho = order.of("c3/x");
  // n hand-offs of c3/x; returns the last token.
  auto hand_offs = [&](int n) {
    std::uint64_t last = 0;
    for (int i = 0; i < n; ++i) last = locker.acquire("c3/x", ttl_of(10s, 60s)).token();
    return last;
  };
  std::uint64_t final_token = hand_offs(20);
  while (ho.last != final_token || ho.held) {
    auto e = next_change(w, 10s);
    ASSERT_TRUE(e) << "after " << ho.acquired;
    ASSERT_NO_FATAL_FAILURE(order.check(*e));
  }
  EXPECT_EQ(ho.acquired, 20);
  etcd.kill(0);  // the first endpoint: where the watcher's stream is
  auto gap = next_change(w, 15s);
  ASSERT_TRUE(gap) << "the killed member was not reported";
  EXPECT_EQ(gap->kind, WatchEventKind::gap) << describe(*gap);
  final_token = hand_offs(20);
  // The re-list after the gap may run during these hand-offs: a `state` then stands for
  // the lease it shows (never older than the last one seen).
  const auto end = Steady::now() + 30s;
  while ((ho.last != final_token || ho.held) && Steady::now() < end) {
    auto e = w.next(15s);
    ASSERT_TRUE(e) << "after token " << ho.last;
    if (e->kind == WatchEventKind::gap) continue;
    if (e->kind == WatchEventKind::state) {
      ASSERT_NO_FATAL_FAILURE(order.take_state(*e));
      continue;
    }
    ASSERT_NO_FATAL_FAILURE(order.check(*e));
  }
  EXPECT_EQ(ho.last, final_token);
  EXPECT_FALSE(ho.held);
  EXPECT_GE(ho.acquired, 21) << "no live event after the member was killed";
}

// stop() from another thread ends a blocked next().
TEST(EtcdPrefixWatch, StopFromAnotherThreadEndsNext) {
  EtcdCluster etcd(1);
  Client client = connect(etcd.url(), quiet());
  Watch w = client.watch("orders/");
  ASSERT_NO_FATAL_FAILURE(expect_stop_from_another_thread_ends_next(w));
}

}  // namespace
}  // namespace distlock::testing
