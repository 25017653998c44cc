// A lapse of the watcher-presence key "<prefix>:watching" (src/redis/redis_watch.cpp)
// against a real redis-server: while the key is gone the lock scripts publish nothing, so
// a release in that window reaches the watch as nothing. The watch's expiry check must not
// turn that silence into an inferred `lost` ("expired") ahead of the gap: its sync barrier
// proves delivery only of what was published, so it checks the key's generation too.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(RedisWatchPresenceLapse, AReleaseWhileTheKeyIsGoneIsAGapNotAnExpiry) {
  RedisServer server;
  Client c = distlock::connect(server.url());
  // Held before the watch starts: its `state` schedules the expiry check 1 s later, ahead
  // of the presence key's first renewal (5 s).
  Lease l = c.acquire("lapse/a", ttl_of(30s, 0ms));
  Client watcher = distlock::connect(server.url());
  distlock::Watch w = watcher.watch("lapse/");
  auto first = w.next(Millis(10000));  // bound: 10 s on the steady clock
  ASSERT_TRUE(first);
  ASSERT_EQ(first->kind, WatchEventKind::state);
  ASSERT_TRUE(first->held);
  // The key lapses (an eviction, a restart without persistence); the release is not published.
  ASSERT_EQ(server.command({"DEL", "distlock:watching"})->integer, 1);
  l.release();
  // Until the gap: no event about lapse/a. The watch renews the key within 5 s plus a
  // round trip and then reports the gap; 15 s on the steady clock bounds the wait.
  const auto end = Clock::now() + 15s;
  bool gap = false;
  while (!gap && Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    if (!e) break;
    if (e->kind == WatchEventKind::gap) {
      gap = true;
      break;
    }
    ADD_FAILURE() << "before the gap: " << distlock::to_string(e->kind) << " " << e->name << " token "
                  << e->token << " (" << e->detail << ")";
  }
  EXPECT_TRUE(gap) << "no gap within 15 s of the presence key's lapse";
}

}  // namespace
}  // namespace distlock::testing
