// The watch's expiry check (src/api/watch.cpp) against a real redis-server: a held name is
// re-read 1 s after its `acquired` (docs/design.md "Watching locks"), also when the watch's
// thread was asleep with nothing held. The lease here ends without any publish (its key is
// deleted on the server, as an expiry does), so only that re-read can report it.
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

TEST(RedisWatchExpiryRecheck, AnAcquireWhileNothingWasHeldIsReReadAfterOneSecond) {
  RedisServer server;
  Client watcher = distlock::connect(server.url());
  distlock::Watch w = watcher.watch("exp/");  // nothing held: the watch's thread sleeps
  Client c = distlock::connect(server.url());
  Lease l = c.acquire("exp/a", ttl_of(60s, 0ms));
  auto a = w.next(Millis(10000));  // bound: 10 s on the steady clock
  ASSERT_TRUE(a);
  ASSERT_EQ(a->kind, WatchEventKind::acquired);
  const auto acquired_at = Clock::now();
  ASSERT_EQ(server.command({"DEL", "distlock:{exp/a}"})->integer, 1);  // ends unpublished
  auto lost = w.next(Millis(15000));                                   // bound: 15 s
  ASSERT_TRUE(lost) << "the ended lease was not reported within 15 s";
  const auto took = Clock::now() - acquired_at;
  EXPECT_EQ(lost->kind, WatchEventKind::lost);
  EXPECT_TRUE(lost->inferred);
  // The re-read is due 1 s after the `acquired`; 2 s more allowed for a loaded machine
  // (one status read and one sync round trip), on the steady clock.
  EXPECT_LT(took, 3s) << "reported after "
                      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
}

}  // namespace
}  // namespace distlock::testing
