// Client::watch on etcd:// (src/etcd/etcd_prefix_watch.cpp) when the member serving the
// watch stops delivering without closing the stream: the lock keeps changing through the
// other members, and the watch must report a gap (then the state, then live events), never
// stall silently (docs/design.md "Watching locks": nothing is skipped silently).
//   - the member is cut off from its peers (EtcdCluster::isolate): it keeps the client's
//     stream open but, without a leader, never commits another revision;
//   - the client's connection to that member is frozen (FaultProxy::freeze): no RST, no
//     data, the stream's Read blocks;
//   - the consumer falls behind the queue bound, or destroys the watch during delivery.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "etcd_cluster.hpp"
#include "support/client_options.hpp"
#include "support/fault_proxy.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

LockOptions quick(Millis wait) {
  LockOptions o;
  o.ttl = Millis(10000);
  o.wait = wait;
  return o;
}

// One acquire and release of `name`, retried (bounded by `limit` on the steady clock) while
// the members elect a leader; the token, or 0.
std::uint64_t hand_off(Client& c, const std::string& name, Millis limit) {
  const auto end = Steady::now() + limit;
  while (Steady::now() < end) {
    try {
      Lease l = c.acquire(name, quick(Millis(5000)));
      return l.token();
    } catch (const std::exception&) {
    }
  }
  return 0;
}

// Waits for `name`'s release of `token` (true), or a gap (false); nullopt at `limit`
// (steady clock). Every event read goes to `seen`.
std::optional<bool> released_or_gap(Watch& w, const std::string& name, std::uint64_t token, Millis limit,
                                    std::vector<std::string>& seen) {
  const auto release = event_of(WatchEventKind::released, name, token);
  const auto e = next_matching(
      w, limit, [&](const WatchEvent& x) { return x.kind == WatchEventKind::gap || release(x); }, &seen);
  if (!e) return std::nullopt;
  return e->kind != WatchEventKind::gap;
}

// Waits for `name`'s release of `token`, reading past gaps and states; false at `limit`.
bool released(Watch& w, const std::string& name, std::uint64_t token, Millis limit,
              std::vector<std::string>& seen) {
  return next_matching(w, limit, event_of(WatchEventKind::released, name, token), &seen).has_value();
}

// Before the stall: one hand-off of `name` through the other members, reported live (its release
// within 10 s).
void expect_live_hand_off(Client& locker, Watch& w, const std::string& name, std::vector<std::string>& seen) {
  const std::uint64_t t = hand_off(locker, name, 20000ms);
  ASSERT_NE(t, 0u);
  ASSERT_EQ(released_or_gap(w, name, t, 10000ms, seen), std::optional<bool>(true)) << joined(seen);
}

// With the watch's member or connection stalled (`stall` says how, for the messages): five
// hand-offs of `name` through the other members (each retried up to `hand_off_limit`) must show,
// within `report_limit` of the last one (steady clock), as the events or as a gap; and the watch
// goes on: the next hand-off is reported within `report_limit`.
void expect_hand_offs_reported_across_a_stall(Client& locker, Watch& w, const std::string& name,
                                              Millis hand_off_limit, Millis report_limit,
                                              const std::string& stall, std::vector<std::string>& seen) {
  std::uint64_t t = 0;
  for (int i = 0; i < 5; ++i) {
    t = hand_off(locker, name, hand_off_limit);
    ASSERT_NE(t, 0u) << "the other members took no lock";
  }
  const auto r = released_or_gap(w, name, t, report_limit, seen);
  EXPECT_TRUE(r.has_value()) << "5 hand-offs (last token " << t << ") while " << stall
                             << ": neither reported nor a gap within " << report_limit.count() / 1000
                             << " s; events:" << joined(seen);
  t = hand_off(locker, name, hand_off_limit);
  ASSERT_NE(t, 0u);
  EXPECT_TRUE(released(w, name, t, report_limit, seen)) << "no live event after the gap:" << joined(seen);
}

// The watch is live on member 0 (the watcher's first endpoint); member 0 is then cut off
// from its peers. Five hand-offs through members 1 and 2 (which elect a leader among
// themselves) must show, within 15 s of the last one (steady clock), as the events or as a
// gap. etcd cancels a watch stream on a member without a leader for 3 election timeouts
// (here 3 × 500 ms) only when the client asks for it (the "hasleader" metadata).
TEST(EtcdWatchStall, MemberCutOffFromItsPeersIsAGapNotASilentStall) {
  EtcdClusterOptions opts;
  opts.peer_proxies = true;
  EtcdCluster etcd(3, opts);
  Client watcher = connect(etcd.url(), quiet());
  Client locker = connect("etcd://" + etcd.endpoint(1) + "," + etcd.endpoint(2), quiet());
  Watch w = watcher.watch("iso/");
  std::vector<std::string> seen;
  ASSERT_NO_FATAL_FAILURE(expect_live_hand_off(locker, w, "iso/x", seen));

  etcd.isolate(0);
  // The watch goes on from another member.
  ASSERT_NO_FATAL_FAILURE(expect_hand_offs_reported_across_a_stall(locker, w, "iso/x", 30000ms, 15000ms,
                                                                   "the watch's member was cut off", seen));
  etcd.heal();
}

// The watcher reaches member 0 through a proxy (members 1 and 2 directly); the watch is live
// there; the proxy then freezes (the stream's connection stays open, nothing flows). Five
// hand-offs through members 1 and 2 must show as the events or a gap within 30 s of the last
// one (steady clock).
TEST(EtcdWatchStall, FrozenConnectionIsAGapNotASilentStall) {
  EtcdCluster etcd(3);
  FaultProxy proxy(etcd.client_port(0));
  Client watcher = connect(
      "etcd://127.0.0.1:" + std::to_string(proxy.port()) + "," + etcd.endpoint(1) + "," + etcd.endpoint(2),
      quiet());
  Client locker = connect("etcd://" + etcd.endpoint(1) + "," + etcd.endpoint(2), quiet());
  Watch w = watcher.watch("frz/");
  std::vector<std::string> seen;
  ASSERT_NO_FATAL_FAILURE(expect_live_hand_off(locker, w, "frz/x", seen));
  ASSERT_GE(proxy.accepted(), 1) << "the watcher never used the proxy";

  proxy.freeze();
  ASSERT_NO_FATAL_FAILURE(expect_hand_offs_reported_across_a_stall(
      locker, w, "frz/x", 20000ms, 30000ms, "the watch's connection was frozen", seen));
  proxy.pass();
}

// The watch's server is replaced by one whose revisions start again (a member wiped and
// started afresh at the same address; here: the watcher's URL names two independent
// single-member servers, the first killed after 100 hand-offs, so the watch resumes on the
// second, whose revision is far below the last one the watch delivered). A watch from that
// old revision on the new server waits, silently, for revisions the server reaches only much
// later. Hand-offs of a name the watch never saw (so no older token of it can make the API
// drop them as stale) must be reported: at least one of up to 10, each waited for 3 s
// (steady clock), after the gap of the kill.
TEST(EtcdWatchStall, ServerWhoseRevisionWentBackIsReadAgainNotWaitedFor) {
  EtcdCluster a(1);
  EtcdCluster b(1);
  Client watcher = connect("etcd://" + a.endpoint(0) + "," + b.endpoint(0), quiet());
  Watch w = watcher.watch("back/");
  std::vector<std::string> seen;
  {
    Client on_a = connect(a.url(), quiet());
    std::uint64_t t = 0;
    for (int i = 0; i < 100; ++i) t = hand_off(on_a, "back/x", 10000ms);
    ASSERT_NE(t, 0u);
    ASSERT_EQ(released_or_gap(w, "back/x", t, 15000ms, seen), std::optional<bool>(true)) << joined(seen);
  }
  a.kill(0);
  ASSERT_EQ(released_or_gap(w, "back/x", 0, 15000ms, seen), std::optional<bool>(false))
      << "the kill was not a gap:" << joined(seen);
  Client on_b = connect(b.url(), quiet());
  bool reported = false;
  for (int i = 0; i < 10 && !reported; ++i) {
    const std::uint64_t t = hand_off(on_b, "back/y", 10000ms);
    ASSERT_NE(t, 0u);
    reported = released(w, "back/y", t, 3000ms, seen);
  }
  EXPECT_TRUE(reported) << "10 hand-offs on the new server, none reported:" << joined(seen);
}

// A consumer that falls behind: max_queued 8, 100 hand-offs made before it reads anything.
// It gets a gap (nothing dropped silently) and, per name, never an older token than one
// already seen nor an `acquired` while the last lease is open; once it has caught up, the
// next hand-off is reported within 10 s (steady clock).
TEST(EtcdWatchStall, ConsumerBehindTheQueueBoundGetsAGapThenGoesOn) {
  EtcdCluster etcd(1);
  Client watcher = connect(etcd.url(), quiet());
  Client locker = connect(etcd.url(), quiet());
  WatchOptions wo;
  wo.max_queued = 8;
  Watch w = watcher.watch("slow/", wo);
  std::uint64_t t = 0;
  for (int i = 0; i < 100; ++i) t = hand_off(locker, "slow/x", 10000ms);
  ASSERT_NE(t, 0u);
  std::vector<std::string> seen;
  bool gap = false, held = false;
  std::uint64_t last = 0;
  auto take = [&](const WatchEvent& e) {
    seen.push_back(describe(e));
    switch (e.kind) {
      case WatchEventKind::gap: gap = true; break;
      case WatchEventKind::state:
        if (e.held) {
          ASSERT_GE(e.token, last) << joined(seen);
          last = e.token;
        }
        held = e.held;
        break;
      case WatchEventKind::acquired:
        ASSERT_FALSE(held) << joined(seen);
        ASSERT_GT(e.token, last) << joined(seen);
        last = e.token;
        held = true;
        break;
      case WatchEventKind::released:
        ASSERT_TRUE(held) << joined(seen);
        ASSERT_EQ(e.token, last) << joined(seen);
        held = false;
        break;
      default: FAIL() << "unexpected: " << joined(seen);
    }
  };
  const auto end = Steady::now() + 15s;
  while (Steady::now() < end) {  // until caught up: 1 s without an event after the gap
    auto e = w.next(1000ms);
    if (!e && gap) break;
    if (e) {
      ASSERT_NO_FATAL_FAILURE(take(*e));
    }
  }
  ASSERT_TRUE(gap) << "100 hand-offs into a queue of 8 without a gap:" << joined(seen);
  ASSERT_FALSE(held) << joined(seen);
  const std::uint64_t t2 = hand_off(locker, "slow/x", 10000ms);
  ASSERT_GT(t2, t);
  bool done = false;
  const auto end2 = Steady::now() + 10s;
  while (!done && Steady::now() < end2) {
    auto e = w.next(std::chrono::ceil<Millis>(end2 - Steady::now()));
    if (!e) break;
    ASSERT_NO_FATAL_FAILURE(take(*e));
    done = e->kind == WatchEventKind::released && e->token == t2;
  }
  EXPECT_TRUE(done) << "the hand-off after catching up (token " << t2
                    << ") was not reported:" << joined(seen);
}

// The watch destroyed from another thread while hand-offs stream in (50 events read, 150
// more coming): the destructor returns within 5 s (steady clock) and locking goes on.
TEST(EtcdWatchStall, DestroyedDuringDeliveryReturnsPromptly) {
  EtcdCluster etcd(1);
  Client watcher = connect(etcd.url(), quiet());
  Client locker = connect(etcd.url(), quiet());
  auto w = std::make_unique<Watch>(watcher.watch("dd/"));
  std::atomic<int> made{0};
  std::thread churn([&] {
    for (int i = 0; i < 200; ++i)
      if (hand_off(locker, "dd/x", 10000ms) != 0) made.fetch_add(1);
  });
  int read = 0;
  const auto end = Steady::now() + 30s;
  while (read < 50 && Steady::now() < end) {
    if (auto e = w->next(5000ms)) ++read;
  }
  ASSERT_EQ(read, 50);
  Steady::duration took{};
  std::thread killer([&] {
    const auto start = Steady::now();
    w.reset();
    took = Steady::now() - start;
  });
  killer.join();
  churn.join();
  EXPECT_LT(took, 5s) << std::chrono::duration_cast<Millis>(took).count() << " ms";
  EXPECT_EQ(made.load(), 200) << "locking stalled";
}

}  // namespace
}  // namespace distlock::testing
