// The zk:// watch's gap rule (src/zk/zk_watch.cpp) against waiters it never saw: while the
// watch's connection is frozen (a fault proxy), B and then C queue behind the holder A, A
// releases, B holds and releases, and C takes the lock. The watch's next reading finds A gone
// and C first; B came and went unseen. B's lease must be reported or covered by a gap naming
// the lock: acquired(C) right after released(A) with nothing between is a silent skip.
// A paced hand-off whose waiter queued after the reading (A releases, then C queues) stays
// free of gaps.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/fault_proxy.hpp"
#include "support/watch_recorder.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

LockOptions opts() {
  return ten_second_ttl(Millis(30000));
}

// Clients of the shared server with ten-second sessions: the watcher, through `proxy` (which the
// tests freeze), and the lockers, straight to it.
Client watcher_through(const FaultProxy& proxy) {
  return quiet_client("zk://127.0.0.1:" + std::to_string(proxy.port()) + kTenSecondSessions);
}
Client locker_of(const ZkServer& zk) {
  return quiet_client(zk.url(kTenSecondSessions));
}

// Every non-state event until acquired(token) (or 20 s on the steady clock).
std::vector<WatchEvent> events_until_acquired(Watch& w, std::uint64_t token, bool& found) {
  std::vector<WatchEvent> events;
  found = false;
  const auto end = SteadyClock::now() + 20s;
  while (!found && SteadyClock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - SteadyClock::now()));
    if (!e) break;
    if (e->kind == WatchEventKind::state) continue;
    events.push_back(*e);
    found = e->kind == WatchEventKind::acquired && e->token == token;
  }
  return events;
}

TEST(ZkWatchGapRule, WaitersQueuedAndGoneUnseenAreAGap) {
  ZkServer& zk = shared_server();
  distlock::testing::FaultProxy proxy(zk.port());
  Client watcher = watcher_through(proxy);
  Client a = locker_of(zk), b = locker_of(zk), c = locker_of(zk);
  const std::string name = "unseen/x";
  Lease la = a.acquire(name, opts());
  Watch w = watcher.watch("unseen/");  // reads [A]
  proxy.freeze();                      // the watch hears nothing from here until pass()
  std::promise<void> b_may_release;
  auto b_token = std::async(std::launch::async, [&] {
    Lease l = b.acquire(name, opts());
    b_may_release.get_future().wait();
    return l.token();
  });
  ASSERT_TRUE(distlock::testing::eventually([&] { return c.status(name).waiters == 1; }, 10s));
  auto c_lease = std::async(std::launch::async, [&] { return c.acquire(name, opts()); });
  ASSERT_TRUE(distlock::testing::eventually([&] { return c.status(name).waiters == 2; }, 10s));
  la.release();
  b_may_release.set_value();
  const std::uint64_t bt = b_token.get();  // B held and released
  Lease lc = c_lease.get();
  proxy.pass();
  bool c_seen = false;
  const auto events = events_until_acquired(w, lc.token(), c_seen);
  std::string all;
  bool gap = false, b_seen = false;
  for (const auto& e : events) {
    all += describe(e) + "\n";
    gap = gap || e.kind == WatchEventKind::gap;
    b_seen = b_seen || (e.kind == WatchEventKind::acquired && e.token == bt);
  }
  ASSERT_TRUE(c_seen) << "C's acquire was not reported:\n" << all;
  EXPECT_TRUE(gap || b_seen) << "B's lease (token " << bt << ") was skipped silently:\n" << all;
}

// The ordinary hand-off the rule must not flag: A releases, then C queues and takes the lock,
// both while the watch is frozen.
TEST(ZkWatchGapRule, ReleaseThenNewWaiterIsNoGap) {
  ZkServer& zk = shared_server();
  distlock::testing::FaultProxy proxy(zk.port());
  Client watcher = watcher_through(proxy);
  Client a = locker_of(zk), c = locker_of(zk);
  const std::string name = "plain/x";
  Lease la = a.acquire(name, opts());
  Watch w = watcher.watch("plain/");
  proxy.freeze();
  la.release();
  Lease lc = c.acquire(name, opts());
  proxy.pass();
  bool c_seen = false;
  const auto events = events_until_acquired(w, lc.token(), c_seen);
  std::string all;
  for (const auto& e : events) all += describe(e) + "\n";
  ASSERT_TRUE(c_seen) << all;
  ASSERT_EQ(events.size(), 2u) << all;
  EXPECT_EQ(events[0].kind, WatchEventKind::released) << all;
}

}  // namespace
}  // namespace distlock::testing
