// Stopping a zk:// watch whose server is gone (src/zk/zk_watch.cpp): the watch's thread is
// between readings (disconnected, waiting to read again) or its session is being opened
// again; the destructor must return within a bound: the client's timeout (2 s here, which
// bounds the API layer's re-list after the gap against the dead server) plus 1 s. Measured:
// 2,000 ms in each of 3 runs (the re-list's timeout).
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>

#include "distlock/distlock.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

TEST(ZkWatchShutdown, StopWithTheServerDownReturnsPromptly) {
  ZkServer zk;
  Client watcher = distlock::connect(zk.url("?session_timeout=4s&timeout=2s"), distlock::testing::quiet());
  Client holder = distlock::connect(zk.url("?session_timeout=4s"), distlock::testing::quiet());
  std::optional<distlock::Watch> w(watcher.watch("down/"));
  distlock::Lease l = holder.acquire("down/x", [] {
    distlock::LockOptions o;
    o.ttl = Millis(4000);
    return o;
  }());
  zk.kill();
  // The watch notices: a gap (its connection lost).
  bool gap = false;
  const auto end = SteadyClock::now() + 15s;
  while (!gap && SteadyClock::now() < end) {
    auto e = w->next(1000ms);
    if (e && e->kind == WatchEventKind::gap) gap = true;
  }
  ASSERT_TRUE(gap) << "no gap within 15 s of the server's kill";
  const auto t0 = SteadyClock::now();
  w.reset();  // the destructor: stop, join the thread, close the session
  const auto took = std::chrono::duration_cast<Millis>(SteadyClock::now() - t0);
  std::printf("watch destroyed %lld ms after the stop, server down\n", static_cast<long long>(took.count()));
  EXPECT_LT(took, 3000ms) << "destroying a watch with its server down took " << took.count() << " ms";
}

}  // namespace
}  // namespace distlock::testing
