// redis://'s lock-delay marker (docs/design.md "Lock-delay", docs/redis.md's key table):
//   - while a lease with lock_delay D is held, through its renewals and after a queued
//     hand-off claimed by a waiter with D, its marker outlives the lock key by exactly D
//     (both read in one script, on the server's clock);
//   - a holder cut off from the server (a frozen TCP proxy) whose client declares the
//     lease lost and, once the network is back, hands it back (forget: the lock deleted
//     before the server's own expiry) still keeps the name from everybody until the
//     marker ends, and the name is granted again soon after (no stall).
// Every instant is read on this process's steady clock; the server runs on this host.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>

#include "distlock/distlock.hpp"
#include "redis/key_layout.hpp"
#include "support/client_options.hpp"
#include "support/fault_proxy.hpp"
#include "support/redis_lock_delay.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using distlock::Millis;
using distlock::testing::RedisServer;
using Steady = std::chrono::steady_clock;

namespace {

namespace r = distlock::detail::redis;

using distlock::testing::delay_opts;

// PTTL of the lock and of its marker, read in one script (one server instant).
std::pair<long long, long long> pttls(const RedisServer& server, const std::string& lock) {
  return distlock::testing::lock_and_marker_pttl(server, lock, r::delay_key(lock));
}

// Samples the lock and marker TTLs every 20 ms until `renewals` renewals were seen (the
// lock's TTL went up) or 10 s passed; every sample must show the marker outliving the
// lock by D (± 1 ms). Returns the renewals seen.
int check_marker_follows_lease(const RedisServer& server, const std::string& lock, Millis delay,
                               int renewals) {
  int seen = 0;
  long long last = -1;
  const auto until = Steady::now() + 10s;
  while (seen < renewals && Steady::now() < until) {
    const auto [l, m] = pttls(server, lock);
    EXPECT_GT(l, 0) << "the lock is not held";
    EXPECT_NEAR(static_cast<double>(m - l), static_cast<double>(delay.count()), 1.0)
        << "lock PTTL " << l << " ms, marker PTTL " << m << " ms";
    if (l <= 0 || m - l < delay.count() - 1 || m - l > delay.count() + 1) return seen;
    if (last >= 0 && l > last) ++seen;
    last = l;
    std::this_thread::sleep_for(20ms);
  }
  return seen;
}

// Waits (at most `limit`) for `stop` to fire; true if it did.
bool wait_stop(const std::stop_token& stop, Millis limit) {
  std::mutex mu;
  std::condition_variable cv;
  bool fired = false;
  std::stop_callback cb(stop, [&] {
    std::lock_guard lk(mu);
    fired = true;
    cv.notify_all();
  });
  std::unique_lock lk(mu);
  return cv.wait_for(lk, limit, [&] { return fired; });
}

TEST(RedisLockDelayMarker, OutlivesTheLeaseByTheDelayThroughRenewalsAndAQueuedHandOff) {
  RedisServer server;
  const std::string name = "ld/marker";
  const std::string lock = r::lock_key("distlock", name);
  constexpr Millis kTtl = 600ms;
  constexpr Millis kDelay = 1000ms;
  auto holder_client = distlock::connect(server.url(), distlock::testing::quiet());
  auto waiter_client = distlock::connect(server.url(), distlock::testing::quiet());
  auto held = holder_client.acquire(name, delay_opts(kTtl, kDelay));
  // Three renewals (one every ttl/3 = 200 ms).
  EXPECT_EQ(check_marker_follows_lease(server, lock, kDelay, 3), 3);

  // A queued waiter with its own D gets the lock by the hand-off (grant, then its claim).
  constexpr Millis kWaiterDelay = 700ms;
  std::error_code ec;
  distlock::Lease lease;
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    lease = waiter_client.acquire(name, delay_opts(kTtl, kWaiterDelay, 10s), ec);
    done = true;
  });
  bool queued = false;
  for (int i = 0; i < 500 && !queued; ++i) {  // 500 x 10 ms
    const std::optional<std::uint64_t> w = waiter_client.status(name).waiters;
    queued = w && *w >= 1;
    if (!queued) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(queued) << "the waiter never queued";
  held.release();  // a normal release: the marker goes, the waiter gets the lock at once
  waiter.join();
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(lease.owns());
  EXPECT_EQ(check_marker_follows_lease(server, lock, kWaiterDelay, 3), 3);
  lease.release();
  EXPECT_EQ(pttls(server, lock), std::make_pair(-2LL, -2LL)) << "a release left the lock or its marker";
}

// The holder's network freezes after some renewals. Its client declares the lease lost
// at its local deadline (before the server's expiry); the network then comes back, so
// the hand-back (forget) deletes the lock on the server early. Nobody may get the name
// before the marker ends: the lease's end on the server plus D. A prober tries every
// 20 ms from the freeze; its first grant must come no earlier than the marker's end as
// read at the freeze (- 1 ms: the server's millisecond clock), and no later than the
// network's return + TTL + D + 1 s: a renewal sent during the freeze reaches the server
// when the network comes back and, the lock still being there, moves the lease and its
// marker once more (a later end, never an earlier one); 1 s: a loaded 2-core machine.
TEST(RedisLockDelayMarker, AHolderCutOffAndDeclaredLostKeepsTheNameBackUntilTheMarkerEnds) {
  RedisServer server;
  const std::string name = "ld/partitioned";
  const std::string lock = r::lock_key("distlock", name);
  constexpr Millis kTtl = 900ms;
  constexpr Millis kDelay = 1200ms;
  distlock::testing::FaultProxy proxy(server.port());
  auto holder_client =
      distlock::connect("redis://127.0.0.1:" + std::to_string(proxy.port()), distlock::testing::quiet());
  auto prober = distlock::connect(server.url(), distlock::testing::quiet());
  auto held = holder_client.acquire(name, delay_opts(kTtl, kDelay));
  ASSERT_EQ(check_marker_follows_lease(server, lock, kDelay, 2), 2);

  proxy.freeze();
  const auto frozen = Steady::now();
  const auto [lock_left, marker_left] = pttls(server, lock);
  ASSERT_GT(lock_left, 0);
  const Steady::time_point lease_end = frozen + Millis(lock_left);
  const Steady::time_point marker_end = frozen + Millis(marker_left);

  // The client declares the loss no later than the server's expiry; then the network
  // comes back and the client hands the lease back.
  ASSERT_TRUE(wait_stop(held.stop_token(), kTtl + 2s)) << "the holder never learnt of its loss";
  const auto lost_at = Steady::now();
  EXPECT_LE(lost_at, lease_end + 5ms) << "the holder declared the loss after the server's expiry";
  proxy.pass();
  const auto passed = Steady::now();
  std::error_code rec;
  held.release(rec);  // the lost lease: handed back (forget), the caller told it was lost
  const auto handed_back = Steady::now();

  const auto granted_at = distlock::testing::first_grant(prober, name, kTtl, 400);  // 400 x 20 ms = 8 s
  ASSERT_TRUE(granted_at.has_value()) << "the name was never granted again after the delay";
  const auto ms = [&](Steady::time_point t) {
    return std::chrono::duration_cast<Millis>(t - frozen).count();
  };
  std::printf(
      "freeze +0; lost +%lld; handed back +%lld; server lease end +%lld; marker end +%lld; granted +%lld "
      "ms\n",
      static_cast<long long>(ms(lost_at)), static_cast<long long>(ms(handed_back)),
      static_cast<long long>(ms(lease_end)), static_cast<long long>(ms(marker_end)),
      static_cast<long long>(ms(*granted_at)));
  EXPECT_GE(*granted_at, marker_end - 1ms) << "granted before the lost holder's lock-delay ended";
  EXPECT_LE(*granted_at, passed + kTtl + kDelay + 1s) << "granted too late after the delay";
}

}  // namespace
