// Client::watch on redis+sentinel:// (src/redis/sentinel_watch.cpp) when the master
// freezes (SIGSTOP: its connections stay open and answer nothing) and the sentinels fail
// over: the watch must move (a gap naming the new master) although its old subscription
// hangs, the watching client's own lock calls must not wait on the frozen watch, live
// events must come from the new master, and stop() must return. Bounds on this process's
// steady clock: the move within 20 s of the freeze (down-after 1 s, failover about 2.3 s
// on one host), an acquire on the new master within 10 s, stop() within 5 s.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/redis_sentinel.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

long long ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<Millis>(Clock::now() - t).count();
}

TEST(SentinelWatchFrozenMaster, AFrozenMasterDoesNotStallTheWatchOrTheWatchingClientsLocks) {
  RedisSentinelGroup group;
  Client watcher = distlock::connect(group.url(), quiet());
  Client holder = distlock::connect(group.url(), quiet());
  Watch w = watcher.watch("fz/");
  {
    distlock::Lease l = holder.acquire("fz/a", ttl_of(30s));
    l.release();
  }
  int changes = 0;
  const auto first_end = Clock::now() + 10s;
  while (changes < 2 && Clock::now() < first_end) {
    auto e = w.next(std::chrono::ceil<Millis>(first_end - Clock::now()));
    ASSERT_TRUE(e) << "no event before the freeze";
    if (e->kind == WatchEventKind::acquired || e->kind == WatchEventKind::released) ++changes;
  }
  ASSERT_EQ(changes, 2);

  const auto old_port = group.master_port();
  struct Thaw {  // the frozen master is resumed whatever the test's outcome
    RedisSentinelGroup& g;
    std::uint16_t port;
    ~Thaw() { g.node_at_port(port).resume(); }
  } thaw{group, old_port};
  group.master().pause();
  const auto frozen_at = Clock::now();
  const auto new_port = group.wait_failover(old_port, 30s);
  const long long failover_ms = ms_since(frozen_at);
  const std::string moved = "to 127.0.0.1:" + std::to_string(new_port);

  bool saw_move = false;
  long long move_ms = 0;
  const auto end = frozen_at + 20s;
  while (!saw_move && Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    if (!e) break;
    if (e->kind == WatchEventKind::gap && e->detail.find(moved) != std::string::npos) {
      saw_move = true;
      move_ms = ms_since(frozen_at);
    }
  }
  ASSERT_TRUE(saw_move) << "no gap naming the move to port " << new_port << " within 20 s of the freeze";

  // The watching client's own lock call, on the new master.
  const auto acquire_at = Clock::now();
  distlock::Lease b = watcher.acquire("fz/b", ttl_of(30s, 10000ms));
  const long long acquire_ms = ms_since(acquire_at);
  EXPECT_LT(acquire_ms, 10000);
  std::optional<WatchEvent> live;
  const auto end2 = Clock::now() + 10s;
  while (!live && Clock::now() < end2) {
    auto e = w.next(std::chrono::ceil<Millis>(end2 - Clock::now()));
    if (!e) break;
    if (e->kind == WatchEventKind::acquired && e->name == "fz/b") live = e;
  }
  ASSERT_TRUE(live) << "no live event from the new master";
  EXPECT_EQ(live->token, b.token()) << describe(*live);

  const auto stop_at = Clock::now();
  w.stop();
  const long long stop_ms = ms_since(stop_at);
  EXPECT_LT(stop_ms, 5000);
  std::printf(
      "frozen master %u -> %u: failover seen after %lld ms, the watch's move gap after %lld ms, the watching "
      "client's acquire took %lld ms, stop() %lld ms\n",
      old_port, new_port, failover_ms, move_ms, acquire_ms, stop_ms);
}

}  // namespace
}  // namespace distlock::testing
