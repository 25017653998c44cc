// Client::watch on redis+sentinel:// with many prefix watches on one client through a
// manual failover: the switch starts each watch on the new master one after the other
// while it holds the backend's watch lock (src/redis/sentinel_watch.cpp,
// move_prefix_watches), so the spread of the move gaps' times is how long that client's
// waiting lock calls (which take the same lock) may wait. Every watch must move (a gap
// naming the new master within 20 s of the failover), the spread must stay under 2 s
// (WatchEvent::at, the system clock of this process), and the watching client's acquire
// right after the failover under 5 s (this process's steady clock).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/redis_sentinel.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(SentinelWatchManyWatchesFailover, FortyWatchesAllMoveAndTheSwitchStaysShort) {
  RedisSentinelGroup group;
  Client watcher = distlock::connect(group.url(), quiet());
  constexpr int kWatches = 40;
  std::vector<Watch> watches;
  for (int i = 0; i < kWatches; ++i) watches.push_back(watcher.watch("mw" + std::to_string(i) + "/"));

  const auto old_port = group.master_port();
  auto r = group.sentinel_command(0, {"SENTINEL", "FAILOVER", "mymaster"});
  ASSERT_TRUE(r && r->type == REDIS_REPLY_STATUS) << (r ? std::string(r->str, r->len) : "no reply");
  const auto new_port = group.wait_failover(old_port, 30s);
  const auto acquire_at = Clock::now();
  distlock::Lease l = watcher.acquire("mw0/x", ttl_of(30s, 10000ms));
  const auto acquire_ms = std::chrono::duration_cast<Millis>(Clock::now() - acquire_at).count();
  EXPECT_LT(acquire_ms, 5000);
  const std::string moved = "to 127.0.0.1:" + std::to_string(new_port);

  std::vector<std::chrono::system_clock::time_point> moved_at;
  const auto end = Clock::now() + 20s;
  for (int i = 0; i < kWatches; ++i) {
    bool found = false;
    while (!found && Clock::now() < end) {
      auto e = watches[static_cast<std::size_t>(i)].next(std::chrono::ceil<Millis>(end - Clock::now()));
      if (!e) break;
      if (e->kind == WatchEventKind::gap && e->detail.find(moved) != std::string::npos) {
        found = true;
        moved_at.push_back(e->at);
      }
    }
    EXPECT_TRUE(found) << "watch " << i << " never moved to port " << new_port;
  }
  ASSERT_EQ(moved_at.size(), static_cast<std::size_t>(kWatches));
  const auto [lo, hi] = std::minmax_element(moved_at.begin(), moved_at.end());
  const auto spread_ms = std::chrono::duration_cast<Millis>(*hi - *lo).count();
  EXPECT_LT(spread_ms, 2000);
  std::printf(
      "%d watches moved %u -> %u; the move gaps spread over %lld ms; the client's acquire took %lld ms\n",
      kWatches, old_port, new_port, static_cast<long long>(spread_ms), static_cast<long long>(acquire_ms));
}

}  // namespace
}  // namespace distlock::testing
