// Client::watch on zk:// (distlock/watch.hpp, src/zk/zk_watch.cpp): the event stream of a
// prefix, inferred from one-shot ZooKeeper watches re-armed on each trigger, against real
// servers each test process starts (standalone, and a 3-server ensemble): hand-offs in token
// order, a killed holder as a loss, a revoke, the initial state and the prefix filter, a
// hand-off chain the watch cannot see as a gap (never a silent skip), a server restart as a
// gap then the state, and a stop from another thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <deque>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/watch_recorder.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// What a consumer checks on one name's stream: tokens go up, each lease ends before the
// next one starts, and an acquisition the stream did not report is covered by a gap.
struct Checker {
  std::uint64_t last = 0;
  bool held = false;
  int acquired = 0, released = 0, lost = 0, revoked = 0, gaps = 0;
  int reported_lost = 0;  // lost, not inferred by the API layer: the backend said so
  std::string problem;

  void add(const WatchEvent& e) {
    if (!problem.empty()) return;
    switch (e.kind) {
      case WatchEventKind::acquired:
        if (held) problem = "acquired before the end of token " + std::to_string(last) + ": " + describe(e);
        if (e.token <= last) problem = "token went back: " + describe(e);
        last = e.token;
        held = true;
        ++acquired;
        break;
      case WatchEventKind::released:
      case WatchEventKind::lost:
      case WatchEventKind::revoked:
        if (!held || e.token != last) problem = "end of a lease not current: " + describe(e);
        held = false;
        if (e.kind == WatchEventKind::released) ++released;
        if (e.kind == WatchEventKind::lost) ++lost;
        if (e.kind == WatchEventKind::lost && !e.inferred) ++reported_lost;
        if (e.kind == WatchEventKind::revoked) ++revoked;
        break;
      case WatchEventKind::gap: ++gaps; break;
      case WatchEventKind::state:  // a re-list after a gap: the lock as read then
        if (e.held && e.token < last) problem = "state went back: " + describe(e);
        if (e.held) last = e.token;
        held = e.held;
        break;
    }
  }
};

// Two clients hand one lock back and forth, each holding it until the watch has reported
// its `acquired` (so every lease is visible for at least one reading): every hand-off
// comes as released(A) then acquired(B), in token order, with no gap. Then without the
// pacing: tokens still go up, each lease ends before the next, and any acquisition the
// stream lacks is covered by a gap.
void hand_offs(const std::string& url_a, const std::string& url_b, const std::string& url_watch,
               const std::string& name, Millis budget, int max_paced) {
  Client watcher = quiet_client(url_watch);
  Watch w = watcher.watch(name);
  std::atomic<std::uint64_t> seen{0};  // the last acquired token the consumer took
  std::atomic<bool> paced{true};
  std::atomic<bool> done{false};
  std::atomic<int> taken{0}, paced_taken{0};
  std::atomic<long long> paced_ms{0};                      // how long the paced hand-offs took
  std::atomic<std::uint64_t> max_token{0};                 // of the holders' acquisitions
  std::atomic<bool> settled{false};                        // the consumer saw the end of max_token's lease
  Checker check;                                           // the consumer's until it is joined
  int paced_acquired = 0, paced_gaps = 0, paced_lost = 0;  // events taken while the holders paced
  const auto start = SteadyClock::now();
  // The last events the consumer took, with when (ms since the start), for a failure message.
  std::mutex tail_mu;
  std::deque<std::string> tail;
  auto tail_text = [&] {
    std::lock_guard lk(tail_mu);
    std::string all;
    for (const auto& line : tail) all += "\n  " + line;
    return all;
  };
  std::thread consumer([&] {
    while (!done.load()) {
      auto e = w.next(100ms);
      if (!e) continue;
      {
        std::lock_guard lk(tail_mu);
        tail.push_back(
            std::to_string(std::chrono::duration_cast<Millis>(SteadyClock::now() - start).count()) +
            " ms: " + describe(*e));
        if (tail.size() > 8) tail.pop_front();
      }
      const bool was_paced = paced.load();  // false only once every paced lease was reported
      check.add(*e);
      if (was_paced && e->kind == WatchEventKind::acquired) ++paced_acquired;
      if (was_paced && e->kind == WatchEventKind::gap) ++paced_gaps;
      if (was_paced && e->kind == WatchEventKind::lost) ++paced_lost;
      if (e->kind == WatchEventKind::acquired) seen.store(e->token);
      settled.store(!check.held && max_token.load() > 0 &&
                    (check.last >= max_token.load() || check.gaps > 0));
    }
  });
  auto holder = [&](const std::string& url) {
    Client c = quiet_client(url);
    while (SteadyClock::now() - start < budget) {
      Lease l = c.acquire(name, ttl_of(10s, 30s));
      taken.fetch_add(1);
      std::uint64_t m = max_token.load();
      while (m < l.token() && !max_token.compare_exchange_weak(m, l.token())) {
      }
      if (paced.load()) {
        paced_taken.fetch_add(1);
        const auto until = SteadyClock::now() + 10s;
        while (seen.load() != l.token() && SteadyClock::now() < until) std::this_thread::sleep_for(1ms);
        if (paced_taken.load() >= max_paced && paced.exchange(false))
          paced_ms.store(std::chrono::duration_cast<Millis>(SteadyClock::now() - start).count());
      }
    }
  };
  std::thread a(holder, url_a), b(holder, url_b);
  a.join();
  b.join();
  const auto took = SteadyClock::now() - start;
  // Let the stream drain: the last release is reported within a reading, or a gap says it may
  // have been missed and the re-list after it reads the lock free (bounded: 10 s).
  const bool drained = distlock::testing::eventually([&] { return settled.load(); }, 10s);
  const auto drain_ms = std::chrono::duration_cast<Millis>(SteadyClock::now() - start - took).count();
  EXPECT_TRUE(drained) << "the end of the last lease (token " << max_token.load()
                       << ") was not reported within 10 s of the holders' end (at "
                       << std::chrono::duration_cast<Millis>(took).count()
                       << " ms); the last events taken:" << tail_text();
  done.store(true);
  consumer.join();
  std::printf(
      "%s: %d acquisitions in %lld ms (%d paced), drained in %lld ms; events: %d acquired (%d while paced), "
      "%d released, "
      "%d lost (%d not inferred), %d gaps (%d while paced); paced: %lld ms, %.2f ms per hand-off (acquire to "
      "the watch's report)\n",
      name.c_str(), taken.load(), static_cast<long long>(std::chrono::duration_cast<Millis>(took).count()),
      paced_taken.load(), static_cast<long long>(drain_ms), check.acquired, paced_acquired, check.released,
      check.lost, check.reported_lost, check.gaps, paced_gaps, paced_ms.load(),
      static_cast<double>(paced_ms.load()) / std::max(1, paced_taken.load()));
  EXPECT_EQ(check.problem, "");
  EXPECT_GE(paced_taken.load(), 20) << "too few paced hand-offs to mean anything";
  EXPECT_GE(paced_acquired, paced_taken.load() - 1) << "a paced acquisition was not reported";
  EXPECT_EQ(paced_gaps, 0) << "a gap while every lease was held until the watch reported it";
  EXPECT_EQ(paced_lost, 0) << "a release reported as a loss";
  EXPECT_EQ(check.reported_lost, 0) << "a release reported as a loss (every holder released)";
  if (check.gaps == 0) {
    EXPECT_EQ(check.acquired, taken.load()) << "an acquisition went unreported, and no gap said so";
    EXPECT_EQ(check.released + check.lost, check.acquired) << "every reported lease ends";
  }
}

TEST(ZkPrefixWatch, HandOffsComeInTokenOrder) {
  ZkServer& zk = shared_server();
  hand_offs(zk.url(kTenSecondSessions), zk.url(kTenSecondSessions), zk.url(kTenSecondSessions), "ho/x",
            8000ms, 300);
}

// The same on a 3-server ensemble: the holders on two members, the watch on the third.
TEST(ZkPrefixWatch, HandOffsAcrossAnEnsemble) {
  ZkEnsemble ensemble(3);
  hand_offs(ensemble.server(0).url(kTenSecondSessions), ensemble.server(1).url(kTenSecondSessions),
            ensemble.server(2).url(kTenSecondSessions), "ens/x", 5000ms, 100);
}

// A holder process killed with SIGKILL: its session expires (2 s) and its node goes with it;
// the watch reports `lost` for its token (not `released`: the holder's session presence
// node went in the same transaction).
TEST(ZkPrefixWatch, KilledHolderShowsAsLost) {
  ZkServer& zk = shared_server();
  Client watcher = quiet_client(zk.url(kTenSecondSessions));
  Watch w = watcher.watch("kill/");
  distlock::testing::TempDir dir("zk-watch-kill");
  const std::string out = (dir.path() / "holder.out").string();
  auto holder = distlock::testing::spawn_holder(zk.url("?session_timeout=2s"), "kill/x", out, 2000);
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "acquired ", 20s)) << distlock::testing::read_file(out);
  auto a = next_change(w, 10s);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->kind, WatchEventKind::acquired) << describe(*a);
  const auto killed = SteadyClock::now();
  holder.signal(SIGKILL);
  auto e = next_change(w, 20s);
  ASSERT_TRUE(e) << "no event within 20 s of the kill";
  EXPECT_EQ(e->kind, WatchEventKind::lost) << describe(*e);
  EXPECT_EQ(e->token, a->token);
  EXPECT_FALSE(e->inferred) << describe(*e);
  EXPECT_NE(e->detail.find("session ended"), std::string::npos) << e->detail;
  std::printf(
      "lost reported %lld ms after the kill (session timeout 2 s)\n",
      static_cast<long long>(std::chrono::duration_cast<Millis>(SteadyClock::now() - killed).count()));
}

// A revoke: the holder's node is marked (its data) and stays first until its lease would
// have run out; the watch reports `revoked` for its token, then the next holder's
// `acquired`, and nothing for the marked node's later delete.
TEST(ZkPrefixWatch, RevokeShowsAsRevoked) {
  ZkServer& zk = shared_server();
  Client watcher = quiet_client(zk.url(kTenSecondSessions));
  // A's marked node goes once its lease would have run out: its session timeout, 2 s.
  Client a = quiet_client(zk.url("?session_timeout=2s"));
  Client b = quiet_client(zk.url(kTenSecondSessions));
  Watch w = watcher.watch("rv/");
  Lease held = a.acquire("rv/x", ttl_of(2000ms, 30s));
  auto got = next_change(w, 10s);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->kind, WatchEventKind::acquired) << describe(*got);
  auto next = std::async(std::launch::async, [&] { return b.acquire("rv/x", ttl_of(2000ms, 30s)); });
  auto r = watcher.revoke("rv/x", "test");
  ASSERT_TRUE(r.revoked);
  auto e = next_change(w, 10s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, WatchEventKind::revoked) << describe(*e);
  EXPECT_EQ(e->token, held.token());
  // Then B's acquire (its token, above A's), and nothing for A's marked node's delete.
  Lease b_lease = next.get();
  const std::uint64_t b_token = b_lease.token();
  std::optional<WatchEvent> n;
  const auto end = SteadyClock::now() + 20s;
  while (!n && SteadyClock::now() < end) {
    auto x = w.next(10s);
    if (!x) break;
    if (x->kind == WatchEventKind::gap) {
      ADD_FAILURE() << "a gap: " << describe(*x);
    } else if (x->kind == WatchEventKind::acquired || (x->kind == WatchEventKind::state && x->held)) {
      n = x;
    } else {
      ASSERT_EQ(x->kind, WatchEventKind::state) << describe(*x);
    }
  }
  ASSERT_TRUE(n) << "B's acquire was not reported";
  EXPECT_EQ(n->token, b_token) << describe(*n);
  EXPECT_GT(b_token, held.token());
  auto after = w.next(300ms);
  EXPECT_TRUE(!after || after->kind == WatchEventKind::state) << "an event after the next holder's acquire";
}

// initial_state: one `state` per lock held under the prefix before the watch, none for
// another prefix; a later change under another prefix is not reported.
TEST(ZkPrefixWatch, InitialStateAndPrefixFilter) {
  ZkServer& zk = shared_server();
  Client c = quiet_client(zk.url(kTenSecondSessions));
  Lease in_a = c.acquire("in/a", ttl_of(10s, 30s));
  Lease out_b = c.acquire("out/b", ttl_of(10s, 30s));
  WatchOptions o;
  o.initial_state = true;
  Watch w = c.watch("in/", o);
  ASSERT_NO_FATAL_FAILURE(expect_held_state(w, "in/a", in_a.token()));
  Lease out_c = c.acquire("out/c", ttl_of(10s, 30s));
  Lease in_d = c.acquire("in/d", ttl_of(10s, 30s));
  auto e = w.next(10s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, WatchEventKind::acquired) << describe(*e);
  EXPECT_EQ(e->name, "in/d");
  EXPECT_EQ(e->token, in_d.token());
  in_a.release();
  auto r = w.next(10s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, WatchEventKind::released) << describe(*r);
  EXPECT_EQ(r->name, "in/a");
  out_b.release();
  out_c.release();
  EXPECT_FALSE(w.next(300ms)) << "a change under another prefix was reported";
}

// A hand-off chain faster than the watch can re-arm, forced: the watch's connection is
// frozen (a fault proxy) while A hands to B, B releases and C takes the lock. B was seen
// waiting and is gone: it may have held, so the watch reports a gap for the name, or B's
// lease — never acquired(C) right after released(A) with nothing between.
TEST(ZkPrefixWatch, ChainFasterThanTheRearmIsAGap) {
  ZkServer& zk = shared_server();
  distlock::testing::FaultProxy proxy(zk.port());
  Client watcher = quiet_client("zk://127.0.0.1:" + std::to_string(proxy.port()) + kTenSecondSessions);
  Client a = quiet_client(zk.url(kTenSecondSessions)), b = quiet_client(zk.url(kTenSecondSessions)),
         c = quiet_client(zk.url(kTenSecondSessions));
  Lease la = a.acquire("chain/x", ttl_of(10s, 30s));
  std::promise<void> b_may_release;
  auto b_token = std::async(std::launch::async, [&] {
    Lease l = b.acquire("chain/x", ttl_of(10s, 30s));
    b_may_release.get_future().wait();
    return l.token();
  });
  ASSERT_TRUE(distlock::testing::eventually([&] { return c.status("chain/x").waiters == 1; }, 10s));
  auto c_lease = std::async(std::launch::async, [&] { return c.acquire("chain/x", ttl_of(10s, 30s)); });
  ASSERT_TRUE(distlock::testing::eventually([&] { return c.status("chain/x").waiters == 2; }, 10s));
  Watch w = watcher.watch("chain/");  // reads [A, B, C]
  proxy.freeze();
  const std::uint64_t a_token = la.token();
  la.release();
  b_may_release.set_value();
  const std::uint64_t bt = b_token.get();  // B held and released
  Lease lc = c_lease.get();
  proxy.pass();
  std::vector<WatchEvent> events;
  bool c_seen = false;
  const auto end = SteadyClock::now() + 20s;
  while (!c_seen && SteadyClock::now() < end) {
    auto e = next_change(w, 10s);
    if (!e) break;
    events.push_back(*e);
    c_seen = e->kind == WatchEventKind::acquired && e->token == lc.token();
  }
  ASSERT_TRUE(c_seen) << "C's acquire was not reported";
  bool gap = false, b_seen = false;
  std::string all;
  for (const auto& e : events) {
    all += describe(e) + "\n";
    if (e.kind == WatchEventKind::gap && !gap) {
      EXPECT_EQ(e.gap_names, std::vector<std::string>{"chain/x"})
          << "the gap names its lock: " << describe(e);
    }
    gap = gap || e.kind == WatchEventKind::gap;
    b_seen = b_seen || (e.kind == WatchEventKind::acquired && e.token == bt);
  }
  EXPECT_TRUE(gap || b_seen) << "B's lease was skipped silently:\n" << all;
  EXPECT_TRUE(gap) << "the frozen watch could not have seen B, so a gap is due:\n" << all;
  EXPECT_EQ(events.front().kind, WatchEventKind::released) << all;
  EXPECT_EQ(events.front().token, a_token) << all;
}

// Reads `w` until `name` is shown held (bounded by `limit`): its `acquired`, or the `state` of a
// re-list after a gap (which may come first: the `acquired` is then stale and dropped). Every
// event read on the way, and whether a gap naming `gap_name` came before it.
struct UntilHeld {
  bool held = false, gap = false;
  std::string all;
};
UntilHeld read_until_held(Watch& w, const std::string& name, const std::string& gap_name, Millis limit) {
  UntilHeld r;
  const auto end = SteadyClock::now() + limit;
  while (!r.held && SteadyClock::now() < end) {
    auto e = w.next(Millis(100));
    if (!e) continue;
    r.all += "\n  " + describe(*e);
    if (e->kind == WatchEventKind::gap && e->gap_names == std::vector<std::string>{gap_name}) r.gap = true;
    r.held = e->name == name &&
             (e->kind == WatchEventKind::acquired || (e->kind == WatchEventKind::state && e->held));
  }
  return r;
}

// A lease that came and went while the watch's connection was frozen, in a lock directory
// whose queue was empty at the reading before and is empty at the reading after (a directory
// the server has not deleted yet; here a foreign child keeps it): a gap naming the lock —
// never nothing. The API layer may have listed that lease held (a re-list after an earlier
// gap read it), and then only this gap's re-list ends it in the stream: without it the stream
// reported the lock held for ever (seen once in a loaded CI run of HandOffsComeInTokenOrder).
// Another lock under the prefix, taken after the thaw, is the barrier: the watch reads the
// first directory (its notification came first) before it reports the second's `acquired`
// (or the re-list after the gap shows it held first).
TEST(ZkPrefixWatch, LeaseBetweenTwoEmptyReadingsIsAGap) {
  ZkServer& zk = shared_server();
  distlock::testing::RawZk raw(zk.hostport());
  distlock::testing::FaultProxy proxy(zk.port());
  Client watcher = quiet_client("zk://127.0.0.1:" + std::to_string(proxy.port()) + kTenSecondSessions);
  Client a = quiet_client(zk.url(kTenSecondSessions));
  const std::string keep = detail::zk::lock_dir("empty/x") + "/keep";
  {
    Lease first = a.acquire("empty/x", ttl_of(10s, 30s));
    ASSERT_EQ(raw.create(keep), ZOK);  // the directory stays once its queue is empty
  }
  WatchOptions o;
  o.initial_state = false;
  Watch w = watcher.watch("empty/", o);  // reads the empty queue
  proxy.freeze();
  std::uint64_t unseen = 0;
  {
    Lease l = a.acquire("empty/x", ttl_of(10s, 30s));
    unseen = l.token();
  }
  proxy.pass();
  Lease barrier = a.acquire("empty/y", ttl_of(10s, 30s));
  const auto r = read_until_held(w, "empty/y", "empty/x", 10s);
  EXPECT_EQ(raw.remove(keep), ZOK);
  ASSERT_TRUE(r.held) << "empty/y's acquire was not reported:" << r.all;
  EXPECT_TRUE(r.gap) << "the lease of token " << unseen
                     << " came and went between two readings of an empty queue, and no gap said so:" << r.all;
}

// The same lease, and then its directory deleted by the server (an empty container; this
// server checks for them every 200 ms) before the watch read it again: a gap naming the lock.
TEST(ZkPrefixWatch, LeaseBeforeItsDirectoryWentIsAGap) {
  ZkServerOptions so;
  so.container_check_ms = 200;
  ZkServer zk(so);
  distlock::testing::RawZk raw(zk.hostport());
  distlock::testing::FaultProxy proxy(zk.port());
  Client watcher = quiet_client("zk://127.0.0.1:" + std::to_string(proxy.port()) + kTenSecondSessions);
  Client a = quiet_client(zk.url(kTenSecondSessions));
  const std::string dir = detail::zk::lock_dir("gone/x");
  {
    Lease first = a.acquire("gone/x", ttl_of(10s, 30s));
    ASSERT_EQ(raw.create(dir + "/keep"), ZOK);  // the directory stays until the watch read it
  }
  WatchOptions o;
  o.initial_state = false;
  Watch w = watcher.watch("gone/", o);  // reads the empty queue
  proxy.freeze();
  std::uint64_t unseen = 0;
  {
    Lease l = a.acquire("gone/x", ttl_of(10s, 30s));
    unseen = l.token();
  }
  ASSERT_EQ(raw.remove(dir + "/keep"), ZOK);
  const auto emptied = SteadyClock::now();
  ASSERT_TRUE(distlock::testing::eventually([&] { return raw.exists(dir) == ZNONODE; }, 10s))
      << dir << " was not deleted within 10 s (container check every 200 ms)";
  std::printf(
      "the server deleted the empty directory in %lld ms\n",
      static_cast<long long>(std::chrono::duration_cast<Millis>(SteadyClock::now() - emptied).count()));
  proxy.pass();
  Lease barrier = a.acquire("gone/y", ttl_of(10s, 30s));
  const auto r = read_until_held(w, "gone/y", "gone/x", 10s);
  ASSERT_TRUE(r.held) << "gone/y's acquire was not reported:" << r.all;
  EXPECT_TRUE(r.gap) << "the lease of token " << unseen
                     << " came and went, then its directory, between two readings, and no gap said so:"
                     << r.all;
}

// The server is killed and started again (its data kept: the holder's session survives):
// the watch reports a gap, then the lock as a `state` with the same token.
TEST(ZkPrefixWatch, ServerRestartIsAGapThenTheState) {
  ZkServer zk;
  Client holder = quiet_client(zk.url("?session_timeout=20s"));
  Client watcher = quiet_client(zk.url("?session_timeout=20s"));
  Lease l = holder.acquire("rs/x", ttl_of(10s, 30s));
  WatchOptions o;
  o.initial_state = true;
  Watch w = watcher.watch("rs/", o);
  auto s = w.next(10s);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->kind, WatchEventKind::state) << describe(*s);
  zk.kill();
  zk.start();
  ASSERT_TRUE(zk.wait_serving(30s));
  bool gap = false;
  std::optional<WatchEvent> after;
  const auto end = SteadyClock::now() + 30s;
  while (SteadyClock::now() < end) {
    auto e = w.next(5s);
    if (!e) continue;
    if (e->kind == WatchEventKind::gap) gap = true;
    if (gap && e->kind == WatchEventKind::state) {
      after = e;
      break;
    }
    ASSERT_NE(e->kind, WatchEventKind::released) << describe(*e);
  }
  EXPECT_TRUE(gap) << "no gap within 30 s of the restart";
  ASSERT_TRUE(after) << "no state after the gap";
  EXPECT_EQ(after->name, "rs/x");
  EXPECT_TRUE(after->held);
  EXPECT_EQ(after->token, l.token());
}

// stop() from another thread ends a next() blocked without a timeout.
TEST(ZkPrefixWatch, StopFromAnotherThread) {
  ZkServer& zk = shared_server();
  Client watcher = quiet_client(zk.url(kTenSecondSessions));
  Watch w = watcher.watch("stop/");
  auto blocked = std::async(std::launch::async, [&] { return w.next(std::nullopt); });
  EXPECT_EQ(blocked.wait_for(200ms), std::future_status::timeout) << "next() returned with nothing to report";
  const auto t0 = SteadyClock::now();
  w.stop();
  ASSERT_EQ(blocked.wait_for(5s), std::future_status::ready) << "next() still blocked 5 s after stop()";
  EXPECT_FALSE(blocked.get());
  std::printf("stop took %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<Millis>(SteadyClock::now() - t0).count()));
}

}  // namespace
}  // namespace distlock::testing
