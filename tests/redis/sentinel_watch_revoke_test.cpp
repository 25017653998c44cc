// Client::watch on redis+sentinel:// (src/redis/sentinel_watch.cpp): a revoke is
// reported as `revoked` (not `released` or `lost`) with the revoked lease's token, the
// holder's refused renewal adds nothing after it, and the next holder's `acquired`
// carries a larger token — the kinds the redis:// watch tells apart hold on the master a
// Sentinel group names. Bounds on this process's steady clock: each event within 10 s,
// the holder told within 10 s (ttl 2 s).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/redis_sentinel.hpp"
#include "support/watch_lease_ends.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

TEST(SentinelWatchRevoke, ARevokeIsReportedAsRevokedThenTheNextAcquire) {
  RedisSentinelGroup group;
  Client holder = distlock::connect(group.url(), quiet());
  Client admin = distlock::connect(group.url(), quiet());
  Client next_holder = distlock::connect(group.url(), quiet());
  Watch w = admin.watch("rv/");
  Lease l = holder.acquire("rv/x", ttl_of(2s));
  const std::uint64_t revoked_token = l.token();
  ASSERT_NO_FATAL_FAILURE(expect_revoke_reported(w, admin, l, "rv/x"));
  Lease n = next_holder.acquire("rv/x", ttl_of(30s, 10000ms));
  auto nx = next_change(w, 10s);
  ASSERT_TRUE(nx);
  EXPECT_EQ(nx->kind, WatchEventKind::acquired) << describe(*nx);
  EXPECT_EQ(nx->token, n.token());
  EXPECT_GT(nx->token, revoked_token);
  ASSERT_NO_FATAL_FAILURE(expect_release_reported(w, n));
}

}  // namespace
}  // namespace distlock::testing
