// redlock://'s lock-delay markers (docs/redlock.md "Lock-delay") against 3 redis-server
// masters started by each test:
//   - a holder with lock_delay D keeps a marker beside its key on every master, living
//     D + 2 x clock_drift(D) past the key through its renewals; a normal release deletes
//     them all and the name is taken again at once;
//   - a holder cut off from every master and declared lost keeps the name back until a quorum
//     of its markers ended (no earlier than the freeze plus D);
//   - a SIGKILLed holder's markers hold the name back though one master restarts empty
//     (no persistence) during the delay: the two others still refuse it, so nobody is
//     granted it before the kill plus D, and it is granted soon after;
//   - an acquisition without a lock_delay that takes the key on a master where a marker lives
//     (the fast path) counts that master busy and takes its key back, leaving the marker,
//     whether the attempt failed or a quorum elsewhere granted it.
// Every instant is read on this process's steady clock; the masters run on this host.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "distlock/distlock.hpp"
#include "masters.hpp"
#include "redlock/quorum.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_delay_grant.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_lock_delay.hpp"
#include "support/redlock_keys.hpp"

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

// PTTL of the lock key and of its marker on master i, read in one script (one instant).
std::pair<long long, long long> pttls(Masters& m, std::size_t i, const std::string& name) {
  return distlock::testing::lock_and_marker_pttl(m[i], redlock_lock_key(name), redlock_marker_key(name));
}

// TTL 1 s, D 1.5 s: the marker outlives the key by D + 2 x (D / 100 + 2 ms) = 1,534 ms (± 2 ms:
// two PTTLs of one script, rounded) on each master, before and after renewals (sampled until
// the key's TTL went up on master 0 three times, at most 5 s); the release deletes both.
TEST(RedlockLockDelay, MarkersOutliveTheKeysByTheDelayPlusDriftUntilANormalRelease) {
  Masters m(3);
  auto c = distlock::connect(m.url(), quiet());
  constexpr Millis kTtl = 1000ms;
  constexpr Millis kDelay = 1500ms;
  const long long extra = distlock::detail::redlock::lock_delay_extra(kDelay).count();
  ASSERT_EQ(extra, 1534);
  const std::string name = "ld/markers";
  auto lease = acquire_within_tries(c, name, delay_opts(kTtl, kDelay), errc::quorum_unavailable);
  int renewals = 0;
  long long last = -1;
  const auto until = Steady::now() + 5s;
  while (renewals < 3 && Steady::now() < until) {
    for (std::size_t i = 0; i < m.size(); ++i) {
      const auto [l, mk] = pttls(m, i, name);
      ASSERT_GT(l, 0) << "master " << i;
      EXPECT_NEAR(static_cast<double>(mk - l), static_cast<double>(extra), 2.0) << "master " << i;
      if (i == 0) {
        if (last >= 0 && l > last) ++renewals;
        last = l;
      }
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_GE(renewals, 3) << "too few renewals seen";
  EXPECT_EQ(m.get(0, redlock_marker_key(name)).substr(0, 5), "1534\n");
  lease.release();
  for (std::size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(pttls(m, i, name), std::make_pair(-2LL, -2LL)) << "master " << i;
  }
  auto other = distlock::connect(m.url(), quiet());
  auto next = other.try_acquire(name, delay_opts(kTtl, 0ms));
  ASSERT_TRUE(next.has_value()) << "a normal release did not hand the name on at once";
  next->release();
}

// A holder (child process) with TTL 1 s and D 2 s is SIGKILLed, and master 0 is restarted
// without persistence right after (it loses the key and the marker). Masters 1 and 2 keep
// theirs: a quorum (2 of 3) can form only once their markers ended. A prober tries once every
// 20 ms (each attempt takes master 0's key and gives it back): its first grant must come no
// earlier than kill + D (- 1 ms: the masters' millisecond expiry) and no later than kill +
// TTL + D + 2 x drift(D) + 1 s (the markers end that long after the holder's last renewal,
// before the kill; 1 s of slack for a loaded 2-core machine).
TEST(RedlockLockDelay, AKilledHolderHoldsTheNameBackThoughOneMasterRestartsEmpty) {
  Masters m(3);
  constexpr Millis kTtl = 1000ms;
  constexpr Millis kDelay = 2000ms;
  const std::string name = "ld/restart";
  distlock::testing::TempDir dir("distlock-redlock-lockdelay");
  const std::string out = (dir.path() / "holder").string();
  distlock::testing::Process child = distlock::testing::spawn_holder(
      m.url(), name, out, kTtl.count(), 0, {"--lock-delay", std::to_string(kDelay.count())});
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "acquired", 30s)) << distlock::testing::read_file(out);
  for (std::size_t i = 0; i < m.size(); ++i) ASSERT_GT(pttls(m, i, name).second, 0) << "master " << i;
  const Steady::time_point killed = Steady::now();
  child.signal(SIGKILL);
  m[0].restart();
  const Millis restart_took = std::chrono::duration_cast<Millis>(Steady::now() - killed);
  EXPECT_EQ(pttls(m, 0, name), std::make_pair(-2LL, -2LL)) << "master 0 kept its data over the restart";
  (void)child.wait_for(10s);
  Millis after{};  // 500 probes x 20 ms: past kill + TTL + D + 1 s
  const std::string what = "[ redlock3 ] killed holder, master 0 restarted empty (" +
                           std::to_string(restart_took.count()) + " ms)";
  ASSERT_NO_FATAL_FAILURE(expect_granted_after_the_delay(m.url(), name, kTtl, kDelay, killed, what, after));
  EXPECT_LE(after, kTtl + distlock::detail::redlock::lock_delay_extra(kDelay) + 1000ms)
      << "granted too late after the lock-delay ended";
}

// A holder cut off from all 3 masters (frozen TCP proxies) with TTL 900 ms and D 1.2 s: its
// client declares the lease lost (stop token), then the network comes back. Read at the freeze
// on each master, every marker ends at least D after the key (the lease's server end), and a
// quorum (2 of 3) is free only once the second-earliest marker ended: a prober trying every
// 20 ms must be first granted no earlier than that (- 1 ms: the masters' millisecond expiry) nor
// before freeze + D, and no later than the network's return + TTL + D + 2 x drift(D) + 1 s (a
// renewal sent during the freeze may reach a master after it and move its key and marker once
// more).
TEST(RedlockLockDelay, AHolderCutOffAndDeclaredLostKeepsTheNameBackUntilAQuorumOfMarkersEnds) {
  Masters m(3);
  constexpr Millis kTtl = 900ms;
  constexpr Millis kDelay = 1200ms;
  const std::string name = "ld/partitioned";
  std::vector<std::unique_ptr<distlock::testing::FaultProxy>> proxies;
  std::string url = "redlock://";
  for (std::size_t i = 0; i < m.size(); ++i) {
    proxies.push_back(std::make_unique<distlock::testing::FaultProxy>(m[i].port()));
    url += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(proxies.back()->port());
  }
  auto holder_client = distlock::connect(url, quiet());
  auto prober = distlock::connect(m.url(), quiet());
  // Through the proxies with the default 50 ms per-node timeout: tried again while a busy
  // machine (two CPU hogs beside parallel copies) lets a quorum miss it.
  auto held = acquire_within_tries(holder_client, name, delay_opts(kTtl, kDelay), errc::quorum_unavailable);
  std::this_thread::sleep_for(kTtl);  // a few renewals
  for (auto& p : proxies) p->freeze();
  const auto frozen = Steady::now();
  std::vector<Steady::time_point> marker_end;
  for (std::size_t i = 0; i < m.size(); ++i) {
    const auto [l, mk] = pttls(m, i, name);
    ASSERT_GT(l, 0) << "master " << i;
    EXPECT_GE(mk - l, kDelay.count()) << "master " << i;
    marker_end.push_back(frozen + Millis(mk));
  }
  std::sort(marker_end.begin(), marker_end.end());
  ASSERT_TRUE(eventually([&] { return held.stop_token().stop_requested(); }, kTtl + 2s))
      << "the holder never learnt of its loss";
  for (auto& p : proxies) p->pass();
  const auto passed = Steady::now();
  const auto granted = distlock::testing::first_grant(prober, name, kTtl, 400);  // 400 x 20 ms = 8 s
  ASSERT_TRUE(granted.has_value()) << "the name was never granted again after the delay";
  const auto ms = [&](Steady::time_point t) {
    return static_cast<long long>(std::chrono::duration_cast<Millis>(t - frozen).count());
  };
  std::printf(
      "[ redlock3 ] cut off: freeze +0; markers end +%lld/+%lld/+%lld; network back +%lld; granted +%lld "
      "ms\n",
      ms(marker_end[0]), ms(marker_end[1]), ms(marker_end[2]), ms(passed), ms(*granted));
  EXPECT_GE(*granted, marker_end[1] - 1ms)
      << "granted while a quorum of masters kept the lost holder's marker";
  EXPECT_GE(*granted, frozen + kDelay - 1ms);
  // Liveness, not safety: 3 s of slack for a busy machine (a late renewal's arrival after the
  // network comes back, then the prober's next 20 ms attempt and its round trips to 3 masters);
  // the delay review saw this bound missed once with 1 s of slack at -j2 on a loaded machine.
  EXPECT_LE(*granted, passed + kTtl + distlock::detail::redlock::lock_delay_extra(kDelay) + 3000ms)
      << "granted too late after the lock-delay ended";
}

// The fast path (no lock_delay: SET NX GET, then the marker's PTTL) on a master where only a
// lost holder's marker lives takes the key, sees the marker and gives the key back: the
// master votes busy, its marker stays. Here the marker is planted on masters 0 and 1 by hand
// (a lost holder's, 3 s); master 2 is free. The attempt is busy; afterwards no key of the
// prober is left anywhere and both markers are intact.
TEST(RedlockLockDelay, AFastPathAttemptOnAMarkedMasterIsBusyAndLeavesTheMarker) {
  Masters m(3);
  const std::string name = "ld/fast";
  for (std::size_t i = 0; i < 2; ++i) {
    auto r = m[i].command({"SET", redlock_marker_key(name), "1534\nlost-owner\n00ff", "PX", "3000"});
    ASSERT_TRUE(r && r->type == REDIS_REPLY_STATUS);
  }
  auto c = distlock::connect(m.url(), quiet());
  std::error_code ec;
  auto got = c.acquire(name, delay_opts(1000ms, 0ms, 0ms), ec);
  EXPECT_FALSE(got.owns()) << "granted while a quorum of masters holds a lost holder's marker";
  for (std::size_t i = 0; i < m.size(); ++i) {
    EXPECT_TRUE(eventually([&] { return pttls(m, i, name).first == -2; }, 2000ms))
        << "master " << i << " kept the refused attempt's key";
  }
  for (std::size_t i = 0; i < 2; ++i) {
    const auto [l, mk] = pttls(m, i, name);
    EXPECT_GT(mk, 1000) << "master " << i << ": the marker was touched";
    EXPECT_EQ(m.get(i, redlock_marker_key(name)), "1534\nlost-owner\n00ff");
  }
}

// The same with the marker on master 0 only: masters 1 and 2 grant the fast-path attempt; the
// key it took on master 0 goes back right after the grant (the marker stays), so the lease's
// key is on masters 1 and 2 only.
TEST(RedlockLockDelay, AGrantedFastPathAttemptGivesBackTheKeyItTookBesideAMarker) {
  Masters m(3);
  const std::string name = "ld/fast-granted";
  auto r = m[0].command({"SET", redlock_marker_key(name), "1534\nlost-owner\n00ff", "PX", "5000"});
  ASSERT_TRUE(r && r->type == REDIS_REPLY_STATUS);
  auto c = distlock::connect(m.url(), quiet());
  auto got = c.try_acquire(name, delay_opts(3000ms, 0ms));
  ASSERT_TRUE(got.has_value()) << "masters 1 and 2 are free: a quorum";
  EXPECT_EQ(pttls(m, 0, name).first, -2) << "the key taken beside the marker was not given back";
  EXPECT_EQ(m.get(0, redlock_marker_key(name)), "1534\nlost-owner\n00ff");
  EXPECT_GT(pttls(m, 1, name).first, 0);
  EXPECT_GT(pttls(m, 2, name).first, 0);
  got->release();
  EXPECT_EQ(m.get(0, redlock_marker_key(name)), "1534\nlost-owner\n00ff")
      << "a release deleted another owner's marker";
}

}  // namespace
}  // namespace distlock::testing
