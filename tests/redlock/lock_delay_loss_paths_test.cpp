// redlock://'s lock-delay over each way a lease ends (docs/redlock.md "Lock-delay"), against 3
// redis-server masters started by each test:
//   - a release that finds the lease gone on a quorum (revoked, not yet seen by the holder's
//     renewer) is a loss (errc::lost): it must leave the lease's markers where it still found
//     its key, so the name stays held back until the lease's end plus D even when one master
//     had restarted empty before (the documented tolerance: N - quorum = 1 of 3 masters);
//   - a revoke of a live holder is a loss: nobody is granted the name before the revoke
//     plus D (the holder's lease ended no earlier than the revoke);
//   - a normal release that reaches a bare quorum (one master cut off from the holder) hands
//     the name over at once: the cut-off master's marker alone cannot refuse a quorum;
//   - a waiter blocked behind a holder with D is woken by its normal release (the release's
//     second step, which deletes the markers, announces it), not by its next re-check.
// Every instant is read on this process's steady clock; the masters run on this host.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "masters.hpp"
#include "redlock/quorum.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/fault_proxy.hpp"
#include "support/redis_lock_delay.hpp"
#include "support/redlock_keys.hpp"

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

long long marker_pttl(Masters& m, std::size_t i, const std::string& name) {
  auto rep = m[i].command({"PTTL", redlock_marker_key(name)});
  return rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -999;
}

// Proxies in front of every master, and the redlock:// URL through them.
struct Proxied {
  std::vector<std::unique_ptr<distlock::testing::FaultProxy>> proxies;
  std::string url = "redlock://";
  explicit Proxied(Masters& m) {
    for (std::size_t i = 0; i < m.size(); ++i) {
      proxies.push_back(std::make_unique<distlock::testing::FaultProxy>(m[i].port()));
      url += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(proxies.back()->port());
    }
  }
};

long long ms_between(Steady::time_point a, Steady::time_point b) {
  return static_cast<long long>(std::chrono::duration_cast<Millis>(b - a).count());
}

constexpr Millis kTtl = 3000ms;  // renewals every 1 s: the revoke and the release fit between two
constexpr Millis kDelay = 2000ms;

// A holder with TTL 3 s and D 2 s on all 3 masters; master 0 restarts empty (allowed: its two
// other markers still refuse a quorum). A revoker reaching masters 0 and 1 only (master 2 cut
// off from it) ends the lease: "revoked" (only master 2 may still have the key). The holder
// releases before its renewer learnt of it: masters 0 and 1 refuse (a quorum), so the release
// reports the loss (errc::lost). Its markers must all stay: master 1's (the revoke keeps it) and
// master 2's, where the release found its key. Then no prober (trying every 20 ms) may be granted
// the name before the revoke plus D (the lease ended no earlier than the revoke), and it must be
// granted by the release + TTL + D + 2 x drift(D) + 1 s (a loaded 2-core machine's slack).
TEST(RedlockLockDelayLossPaths, AReleaseThatFindsTheLeaseRevokedKeepsItsMarkers) {
  Masters m(3);
  Proxied revoker_net(m);
  const std::string name = "ld/release-after-revoke";
  auto holder = distlock::connect(m.url(), quiet());
  auto revoker = distlock::connect(revoker_net.url, quiet());
  auto prober = distlock::connect(m.url(), quiet());
  auto lease = acquire_within_tries(holder, name, delay_opts(kTtl, kDelay), errc::quorum_unavailable);
  m[0].restart();
  ASSERT_EQ(marker_pttl(m, 0, name), -2) << "master 0 kept its data over the restart";
  ASSERT_GT(marker_pttl(m, 1, name), kDelay.count());
  ASSERT_GT(marker_pttl(m, 2, name), kDelay.count());
  revoker_net.proxies[2]->freeze();
  const auto revoked_at = Steady::now();
  const distlock::RevokeResult rv = revoker.revoke(name, "lock-delay loss-path test");
  ASSERT_TRUE(rv.revoked) << "masters 0 and 1 answered: only master 2 may still have the key";
  std::error_code ec;
  lease.release(ec);
  const auto released_at = Steady::now();
  EXPECT_EQ(ec, distlock::make_error_code(distlock::errc::lost)) << ec.message();
  const long long m1 = marker_pttl(m, 1, name);
  const long long m2 = marker_pttl(m, 2, name);
  EXPECT_GT(m1, 0) << "the revoke deleted master 1's marker";
  EXPECT_GT(m2, 0) << "the release of a lost lease deleted master 2's marker";
  revoker_net.proxies[2]->pass();
  const auto granted = first_grant(prober, name, kTtl, 500);  // 500 x 20 ms: past release + TTL + D + 1 s
  ASSERT_TRUE(granted.has_value()) << "the name was never granted after the lock-delay";
  std::printf(
      "[ redlock3 ] release after a revoke (master 0 restarted empty): revoke +0, release +%lld, markers "
      "left %lld / %lld ms, granted +%lld ms\n",
      ms_between(revoked_at, released_at), m1, m2, ms_between(revoked_at, *granted));
  EXPECT_GE(*granted, revoked_at + kDelay - 1ms)
      << "granted during the lock-delay of a lease its own release reported lost";
  EXPECT_LE(*granted, released_at + kTtl + distlock::detail::redlock::lock_delay_extra(kDelay) + 1000ms)
      << "granted too late after the lock-delay ended";
}

// A revoke reaching every master ends a live holder's lease (TTL 3 s, D 2 s): the revoke
// deletes the keys and keeps the markers, so no prober is granted the name before the revoke
// plus D, and one is by the revoke + TTL + D + 2 x drift(D) + 1 s.
TEST(RedlockLockDelayLossPaths, ARevokedHolderHoldsTheNameBackForItsDelay) {
  Masters m(3);
  const std::string name = "ld/revoked";
  auto holder = distlock::connect(m.url(), quiet());
  auto revoker = distlock::connect(m.url(), quiet());
  auto prober = distlock::connect(m.url(), quiet());
  auto lease = acquire_within_tries(holder, name, delay_opts(kTtl, kDelay), errc::quorum_unavailable);
  const auto revoked_at = Steady::now();
  ASSERT_TRUE(revoker.revoke(name, "lock-delay loss-path test").revoked);
  const auto granted = first_grant(prober, name, kTtl, 500);
  ASSERT_TRUE(granted.has_value()) << "the name was never granted after the lock-delay";
  std::printf("[ redlock3 ] revoked holder: granted %lld ms after the revoke (D %lld ms)\n",
              ms_between(revoked_at, *granted), static_cast<long long>(kDelay.count()));
  EXPECT_GE(*granted, revoked_at + kDelay - 1ms) << "granted during a revoked holder's lock-delay";
  EXPECT_LE(*granted, revoked_at + kTtl + distlock::detail::redlock::lock_delay_extra(kDelay) + 1000ms)
      << "granted too late after the lock-delay ended";
  std::error_code ec;
  lease.release(ec);
  EXPECT_EQ(ec, distlock::make_error_code(distlock::errc::lost)) << ec.message();
}

// A holder (TTL 3 s, D 2 s) cut off from master 2 releases normally: masters 0 and 1 delete key
// and marker (a quorum: "released"); master 2 keeps both until they expire. The name is handed
// over at once: the prober's first attempt (on masters 0 and 1) is granted.
TEST(RedlockLockDelayLossPaths, ANormalReleaseOnABareQuorumHandsOverAtOnce) {
  Masters m(3);
  Proxied holder_net(m);
  const std::string name = "ld/bare-quorum-release";
  auto holder = distlock::connect(holder_net.url, quiet());
  auto prober = distlock::connect(m.url(), quiet());
  auto lease = acquire_within_tries(holder, name, delay_opts(kTtl, kDelay), errc::quorum_unavailable);
  holder_net.proxies[2]->freeze();
  std::error_code ec;
  lease.release(ec);
  EXPECT_FALSE(ec) << ec.message();
  const auto released_at = Steady::now();
  EXPECT_GT(marker_pttl(m, 2, name), 0) << "the cut-off master lost its marker";
  auto got = prober.try_acquire(name, delay_opts(kTtl, 0ms));
  std::printf("[ redlock3 ] normal release on a bare quorum: first attempt %s %lld ms after it\n",
              got ? "granted" : "busy", ms_between(released_at, Steady::now()));
  EXPECT_TRUE(got.has_value()) << "a normal release did not hand the name over at once";
  if (got) got->release();
  holder_net.proxies[2]->pass();
}

// A waiter (wait 10 s) blocks behind a holder with TTL 3 s and D 2 s: its first attempt is busy
// with the key's PTTL (about 3 s), so without a release message it would re-check no sooner
// than about 3 s later. The holder releases normally; the waiter must be granted within 1 s of
// the release's return (the second step's message woke it).
TEST(RedlockLockDelayLossPaths, AWaiterIsWokenByANormalReleaseOfAHolderWithADelay) {
  Masters m(3);
  const std::string name = "ld/waiter-woken";
  auto holder = distlock::connect(m.url(), quiet());
  auto waiter = distlock::connect(m.url(), quiet());
  auto lease = acquire_within_tries(holder, name, delay_opts(kTtl, kDelay), errc::quorum_unavailable);
  std::atomic<bool> granted{false};
  std::atomic<long long> granted_ns{0};
  std::thread t([&] {
    std::error_code ec;
    distlock::LockOptions o = distlock::testing::ttl_of(kTtl, Millis(10000));
    auto got = waiter.acquire(name, o, ec);
    if (got.owns()) {
      granted_ns = Steady::now().time_since_epoch().count();
      granted = true;
      got.release(ec);
    }
  });
  // The waiter found the name busy and listens for its release on every master (PUBSUB
  // NUMSUB of the release channel), at most 5 s.
  ASSERT_TRUE(eventually(
      [&] {
        for (std::size_t i = 0; i < m.size(); ++i) {
          auto r = m[i].command({"PUBSUB", "NUMSUB", "distlock:redlock:released:" + name});
          if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[1]->integer < 1)
            return false;
        }
        return true;
      },
      5000ms))
      << "the waiter never subscribed to the release channel";
  EXPECT_FALSE(granted.load()) << "granted while held";
  lease.release();
  const auto released_at = Steady::now();
  const bool woken = eventually([&] { return granted.load(); }, 1000ms);
  t.join();
  ASSERT_TRUE(granted.load()) << "the waiter was never granted";
  const auto after = std::chrono::duration_cast<Millis>(
      Steady::time_point(Steady::duration(granted_ns.load())) - released_at);
  std::printf("[ redlock3 ] waiter behind a holder with D: granted %lld ms after the normal release\n",
              static_cast<long long>(after.count()));
  EXPECT_TRUE(woken) << "the waiter was not woken by the release (granted " << after.count()
                     << " ms after it)";
}

}  // namespace
}  // namespace distlock::testing
