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

namespace {

using namespace std::chrono_literals;
using distlock::Client;
using distlock::Lease;
using distlock::Millis;
using distlock::Watch;
using distlock::WatchEvent;
using distlock::WatchEventKind;
using distlock::testing::quiet;
using distlock::testing::RedisSentinelGroup;
using distlock::testing::ttl_of;
using Clock = std::chrono::steady_clock;

std::string describe(const WatchEvent& e) {
  return std::string(distlock::to_string(e.kind)) + " " + e.name + " token=" + std::to_string(e.token) +
         " held=" + (e.held ? "1" : "0") + " " + e.detail;
}

std::optional<WatchEvent> next_change(Watch& w, Millis limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    if (!e) return std::nullopt;
    if (e->kind != WatchEventKind::state) return e;
  }
  return std::nullopt;
}

TEST(SentinelWatchRevoke, ARevokeIsReportedAsRevokedThenTheNextAcquire) {
  RedisSentinelGroup group;
  Client holder = distlock::connect(group.url(), quiet());
  Client admin = distlock::connect(group.url(), quiet());
  Client next_holder = distlock::connect(group.url(), quiet());
  Watch w = admin.watch("rv/");
  Lease l = holder.acquire("rv/x", ttl_of(2s));
  const std::uint64_t revoked_token = l.token();
  auto acq = next_change(w, 10s);
  ASSERT_TRUE(acq);
  ASSERT_EQ(acq->kind, WatchEventKind::acquired) << describe(*acq);
  ASSERT_EQ(acq->token, revoked_token);
  const auto r = admin.revoke("rv/x", "maintenance");
  ASSERT_TRUE(r.revoked);
  auto rv = next_change(w, 10s);
  ASSERT_TRUE(rv);
  EXPECT_EQ(rv->kind, WatchEventKind::revoked) << describe(*rv);
  EXPECT_EQ(rv->token, revoked_token);
  auto told = std::make_shared<std::promise<void>>();
  l.on_lost([told] { told->set_value(); });
  EXPECT_EQ(told->get_future().wait_for(10s), std::future_status::ready)
      << "the holder was not told within 10 s";
  Lease n = next_holder.acquire("rv/x", ttl_of(30s, 10000ms));
  auto nx = next_change(w, 10s);
  ASSERT_TRUE(nx);
  EXPECT_EQ(nx->kind, WatchEventKind::acquired) << describe(*nx);
  EXPECT_EQ(nx->token, n.token());
  EXPECT_GT(nx->token, revoked_token);
  const std::uint64_t next_token = n.token();
  n.release();
  auto rel = next_change(w, 10s);
  ASSERT_TRUE(rel);
  EXPECT_EQ(rel->kind, WatchEventKind::released) << describe(*rel);
  EXPECT_EQ(rel->token, next_token);
}

}  // namespace
