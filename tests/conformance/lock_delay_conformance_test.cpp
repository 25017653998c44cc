// LockOptions::lock_delay (docs/design.md "Lock-delay") over every backend the build has:
//   - a holder with lock_delay D, SIGKILLed (a child process), holds the lock back: the
//     waiter's grant comes no earlier than the earliest moment the dead holder's lease could
//     have ended plus D, and no later than the latest such moment plus D plus kLateBound;
//   - a holder with lock_delay D, SIGSTOPped (a child process: from the server's view it is
//     partitioned, it cannot renew) and left stopped past its TTL, holds the lock back the same
//     way; resumed, it reports the loss, never answers owns() true after the waiter's grant, and
//     the waiter's token is larger;
//   - a normal release with lock_delay set hands over at once (within kHandOverBound);
//   - lock_delay above 60 s is an invalid_argument naming lock_delay; 60 s is accepted;
//   - a backend that cannot enforce it refuses any lock_delay > 0 with errc::not_supported,
//     naming lock_delay.
// Every instant is read on this process's steady clock; the servers run on this host, so
// the servers' clocks run at the same rate (the skew margin is the 1 ms of the servers'
// millisecond expiry resolution).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/backend_targets.hpp"
#include "support/client_options.hpp"
#include "support/lease_waiter.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

// The backends whose servers enforce lock_delay (docs/design.md "Lock-delay"); every
// other one must refuse it.
const std::set<std::string> kEnforcing = {"redis", "sentinel", "rediscluster3", "redlock3", "postgres",
                                          "mysql", "etcd1",    "etcd3",         "zk1",      "zk3"};

// A grant after a lost holder's delay ended: on redis:// the waiters' queue refresh (every
// 500 ms, redis/wait_queue.cpp) finds the lock free and grants the head, which claims it
// with one round trip; on redis+cluster:// and redlock:// the waiter re-checks at the
// marker's PTTL it was told (redlock: the largest among the masters, at most one TTL); on postgres:// the
// waiter re-checks at the time left it was told
// (+ at most 10 % jitter of it, here <= 250 ms); on etcd:// the waiter that saw the holder's
// key go waits the delay on its own clock and re-checks then (+ at most 10 % jitter, here
// <= 150 ms), after etcd's lease expiry, checked every 500 ms by the leader; 1 s leaves room
// for a loaded 2-core machine.
constexpr Millis kLateBound = 1000ms;
// A normal release grants the first waiter in the release's own script (one message on
// its grant channel, one claim round trip).
constexpr Millis kHandOverBound = 500ms;
// The servers expire keys on a millisecond clock: an expiry may read up to 1 ms early
// against this process's nanosecond clock.
constexpr Millis kSkew = 1ms;

// The latest a dead holder's lease of `ttl` can end after its last renewal, by the server:
//   - zk: the lease is the session, whose timeout the targets ask as 2 s
//     (tests/support/backend_targets: ?session_timeout=2s) whatever the lock's TTL, and it
//     expires at the first tick (tests/zk/zk_server: tickTime 200 ms) after that;
//   - etcd: the lease's TTL in whole seconds, and the leader's lessor revokes expired
//     leases in a loop that runs every 500 ms;
//   - the others: the TTL (the servers expire keys and rows on their own millisecond clocks).
Millis lease_end_bound(const std::string& label, Millis ttl) {
  if (label == "zk1" || label == "zk3") return std::max(ttl, Millis(2000)) + Millis(200);
  if (label == "etcd1" || label == "etcd3") return ttl + Millis(500);
  return ttl;
}

// How much longer than the holder's lease a revoked holder's key may stay first in the queue:
// etcd's revoke moves it onto a lease of the holder's TTL + 1 s (docs/etcd.md "Revoke").
Millis revoke_extra(const std::string& label) {
  return label == "etcd1" || label == "etcd3" ? Millis(1000) : Millis(0);
}

Millis ms_between(Steady::time_point a, Steady::time_point b) {
  return std::chrono::duration_cast<Millis>(b - a);
}

// Until the backend counts a waiter on `name` (at most 10 s); true then. A backend that
// does not count waiters (postgres://: nullopt) gets 300 ms for the waiter's first attempt:
// the bounds asserted after it hold whenever the waiter started (a late start only makes the
// kill test's grant later, and the hand-over measured from the release no longer).
bool waiter_queued(distlock::Client& c, const std::string& name) {
  const auto deadline = Steady::now() + 10s;
  for (;;) {
    const std::optional<std::uint64_t> w = c.status(name).waiters;
    if (!w) {
      std::this_thread::sleep_for(300ms);
      return true;
    }
    if (*w >= 1) return true;
    if (Steady::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
}

// Those of kinds() whose servers enforce lock_delay.
std::vector<Kind> enforcing_kinds() {
  std::vector<Kind> out;
  for (const Kind& k : distlock::testing::kinds())
    if (kEnforcing.count(k.label)) out.push_back(k);
  return out;
}

class LockDelay : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override { target_ = GetParam().make({}); }
  bool enforcing() const { return kEnforcing.count(GetParam().label) > 0; }
  distlock::Client client() { return distlock::connect(target_->url(), distlock::testing::quiet()); }
  distlock::LockOptions opts(Millis ttl, Millis delay, std::optional<Millis> wait = std::nullopt) const {
    distlock::LockOptions o = distlock::testing::ttl_of(ttl, wait);
    o.lock_delay = delay;
    return o;
  }
  std::unique_ptr<Target> target_;
};

// The holder releases and `waiter`, queued behind it, gets the name without an error (joined).
void release_to(distlock::Lease& held, LeaseWaiter& waiter) {
  held.release();
  waiter.join();
  EXPECT_FALSE(waiter.ec) << waiter.ec.message();
}

// The first grant of `name` after a holder was lost, to `waiter` or to a prober besides it that
// tries every 20 ms with one attempt (a waiter's re-check schedule alone could happen to fall
// after the delay); a prober's grant is released normally, so the waiter gets it at once. Joins
// the waiter. At most 1000 tries (20 s), within the waiter's 30-s wait.
struct FirstGrant {
  Steady::time_point at;
  bool to_prober = false;
};
FirstGrant first_grant_beside(distlock::Client& prober, const std::string& name,
                              const distlock::LockOptions& o, LeaseWaiter& waiter) {
  std::optional<Steady::time_point> probed_at;
  for (int i = 0; i < 1000 && !waiter.done.load(); ++i) {
    if (auto got = prober.try_acquire(name, o)) {
      probed_at = Steady::now();
      got->release();
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  waiter.join();
  if (probed_at && *probed_at < waiter.granted_at) return {*probed_at, true};
  return {waiter.granted_at, false};
}

// The instants of the "work <ns>" lines in `text`, a holder's output (tests/tools/lock_tool.cpp
// --work-ms): each one is at or before an owns() that answered true. CLOCK_MONOTONIC, which is
// this process's steady clock.
std::vector<Steady::time_point> work_instants(const std::string& text) {
  std::vector<Steady::time_point> at;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("work ", 0) == 0) at.emplace_back(std::chrono::nanoseconds(std::stoll(l.substr(5))));
  }
  return at;
}

// The timing tests: only where the servers enforce it (the others refuse it, above).
class LockDelayEnforced : public LockDelay {};

TEST_P(LockDelay, AboveSixtySecondsIsAnInvalidArgumentNamingTheOption) {
  auto c = client();
  try {
    (void)c.try_acquire("ld/limit", opts(2000ms, 60001ms));
    ADD_FAILURE() << "lock_delay 60001ms was accepted";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find("lock_delay"), std::string::npos) << e.what();
  }
  std::error_code ec;
  auto lease = c.acquire("ld/limit", opts(2000ms, -1ms, 0ms), ec);
  EXPECT_EQ(ec, errc::invalid_argument) << "a negative lock_delay was accepted";
  // The limit itself is a valid value.
  lease = c.acquire("ld/limit", opts(2000ms, 60000ms, 0ms), ec);
  if (enforcing()) {
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_TRUE(lease.owns());
    lease.release();
  } else {
    EXPECT_EQ(ec, errc::not_supported) << ec.message();
  }
}

// A backend that cannot hold a lost lease's name back says so, naming the option.
TEST_P(LockDelay, ABackendThatCannotEnforceItRefusesIt) {
  auto c = client();
  if (enforcing()) {
    auto lease = c.try_acquire("ld/refused", opts(2000ms, 100ms));
    ASSERT_TRUE(lease.has_value());
    EXPECT_TRUE(lease->owns());
    return;
  }
  try {
    (void)c.try_acquire("ld/refused", opts(2000ms, 100ms));
    ADD_FAILURE() << GetParam().label << " accepted a lock_delay it cannot enforce";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::not_supported) << e.what();
    EXPECT_NE(std::string(e.what()).find("lock_delay"), std::string::npos) << e.what();
  }
  // Without it the backend works as before.
  auto plain = c.try_acquire("ld/refused", opts(2000ms, 0ms));
  EXPECT_TRUE(plain.has_value());
}

// A holder with lock_delay D is SIGKILLed while a waiter waits. Its lease ended no
// earlier than the kill (it had not reported a loss: its local deadline is before the
// server's expiry) and no later than the kill plus L = lease_end_bound(TTL) (its last renewal
// was sent before the kill). The waiter's grant must lie in [kill + D, kill + L + D + kLateBound].
// With D = L + 500 ms, longer than the lease can last, a grant at the lease's end (no delay)
// falls before kill + D. The first grant counts, to the waiter or to a prober that tries every
// 20 ms.
TEST_P(LockDelayEnforced, KilledHolderHoldsTheLockBackForTheDelay) {
  constexpr Millis kTtl = 1000ms;
  const Millis kDelay = lease_end_bound(GetParam().label, kTtl) + 500ms;
  TempDir dir("distlock-lockdelay-kill");
  const std::string out = (dir.path() / "holder").string();
  Process holder = distlock::testing::spawn_holder(target_->url(), "ld/killed", out, kTtl.count(), 0,
                                                   {"--lock-delay", std::to_string(kDelay.count())});
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "acquired", 30s)) << distlock::testing::read_file(out);
  auto c = client();
  LeaseWaiter waiter(c, "ld/killed", opts(kTtl, 0ms, 30s));
  ASSERT_TRUE(waiter_queued(c, "ld/killed")) << "the waiter never queued";
  ASSERT_FALSE(waiter.done.load()) << "the waiter got the lock while its holder was alive";
  const Steady::time_point killed = Steady::now();
  holder.signal(SIGKILL);
  auto prober = client();
  const FirstGrant first = first_grant_beside(prober, "ld/killed", opts(kTtl, 0ms), waiter);
  (void)holder.wait_for(10s);
  ASSERT_FALSE(waiter.ec) << waiter.ec.message();
  ASSERT_TRUE(waiter.lease.owns());
  ASSERT_EQ(distlock::testing::read_file(out).find("lost"), std::string::npos)
      << "the holder lost its lease before the kill: the lower bound does not hold";
  const Millis after_kill = ms_between(killed, first.at);
  RecordProperty("granted_after_kill_ms", static_cast<int>(after_kill.count()));
  std::printf("[ %s ] lock_delay %lld ms, ttl %lld ms: first granted %lld ms after SIGKILL (to the %s)\n",
              GetParam().label.c_str(), static_cast<long long>(kDelay.count()),
              static_cast<long long>(kTtl.count()), static_cast<long long>(after_kill.count()),
              first.to_prober ? "prober" : "waiter");
  EXPECT_GE(after_kill, kDelay - kSkew) << "granted before the dead holder's lock-delay could have ended";
  EXPECT_LE(after_kill, lease_end_bound(GetParam().label, kTtl) + kDelay + kLateBound)
      << "granted too late after the lock-delay ended";
}

// A holder with lock_delay D is SIGSTOPped while a waiter waits: it cannot renew, so from the
// server's view it is partitioned (its connections stay open: postgres:// and mysql:// end its
// session by their idle timeout, a TTL after its last statement). It stays stopped until the
// lock was granted again, D > TTL after the stop. Its lease cannot end on the server before its
// last renewal + TTL; its last renewal is at or before the stop; and it had not reported a loss
// before the stop. What this process can know: grant − stop ≥ D (asserted, less the 1-ms expiry
// resolution), and grant ≥ the last "work" instant + D (the holder's owns() answered true at or
// after that instant, so its lease had not ended on the server; certain). grant − stop is printed
// against TTL + D; the upper bound is the kill test's. Resumed (SIGCONT), the holder reports
// "lost" within 10 s, its owns() never answered true at or after the grant (no "work" line from
// then: lock_tool --work-ms checks owns() every 20 ms), it exits 76 (lost) on SIGTERM, and with
// fencing the waiter's token is larger than the stopped holder's.
TEST_P(LockDelayEnforced, StoppedHolderHoldsTheLockBackForTheDelay) {
  constexpr Millis kTtl = 1000ms;
  const Millis kDelay = lease_end_bound(GetParam().label, kTtl) + 500ms;
  const std::string name = "ld/stopped";
  TempDir dir("distlock-lockdelay-stop");
  const std::string out = (dir.path() / "holder").string();
  Process holder =
      distlock::testing::spawn_holder(target_->url(), name, out, kTtl.count(), 0,
                                      {"--lock-delay", std::to_string(kDelay.count()), "--work-ms", "20"});
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "acquired", 30s)) << distlock::testing::read_file(out);
  const long long holder_token = distlock::testing::acquired_token(out);
  auto c = client();
  // The waiter's own lease lasts 4 s (zk:// refuses more than twice its 2-s session): it is
  // checked after the SIGCONT, and a 1-s lease's renewal can come late on a loaded machine
  // (seen once on postgres at ctest -j2). It does not enter the bounds: the holder's D does.
  LeaseWaiter waiter(c, name, opts(4000ms, 0ms, 30s));
  ASSERT_TRUE(waiter_queued(c, name)) << "the waiter never queued";
  ASSERT_FALSE(waiter.done.load()) << "the waiter got the lock while its holder was alive";
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "\nwork ", 10s)) << "the holder never worked";
  const Steady::time_point stopped = Steady::now();
  holder.signal(SIGSTOP);
  auto prober = client();
  const FirstGrant first = first_grant_beside(prober, name, opts(kTtl, 0ms), waiter);
  const std::string while_stopped = distlock::testing::read_file(out);
  const char state = distlock::testing::process_state(holder.pid());
  holder.signal(SIGCONT);
  ASSERT_FALSE(waiter.ec) << waiter.ec.message();
  ASSERT_TRUE(waiter.lease.owns()) << "the waiter's lease ended: " << waiter.lease.loss_detail();
  EXPECT_EQ(state, 'T') << "the holder was not stopped when the lock was granted";
  ASSERT_EQ(while_stopped.find("lost"), std::string::npos)
      << "the holder lost its lease before the stop: the lower bound does not hold";
  const std::vector<Steady::time_point> worked = work_instants(while_stopped);
  ASSERT_FALSE(worked.empty());
  const Millis after_stop = ms_between(stopped, first.at);
  RecordProperty("granted_after_stop_ms", static_cast<int>(after_stop.count()));
  std::printf(
      "[ %s ] lock_delay %lld ms, ttl %lld ms: first granted %lld ms after SIGSTOP (to the %s); "
      "ttl + lock_delay = %lld ms; last owns() true %lld ms before the stop\n",
      GetParam().label.c_str(), static_cast<long long>(kDelay.count()), static_cast<long long>(kTtl.count()),
      static_cast<long long>(after_stop.count()), first.to_prober ? "prober" : "waiter",
      static_cast<long long>((kTtl + kDelay).count()),
      static_cast<long long>(ms_between(worked.back(), stopped).count()));
  EXPECT_GE(after_stop, kDelay - kSkew) << "granted before the stopped holder's lock-delay could have ended";
  EXPECT_GE(ms_between(worked.back(), first.at), kDelay - kSkew)
      << "granted less than the delay after the holder last owned the lock";
  EXPECT_LE(after_stop, lease_end_bound(GetParam().label, kTtl) + kDelay + kLateBound)
      << "granted too late after the lock-delay ended";
  // Resumed: the holder reports the loss and never owned the lock after the grant.
  EXPECT_TRUE(distlock::testing::wait_for_line(out, "lost", 10s))
      << "the resumed holder did not report its loss: " << distlock::testing::read_file(out);
  holder.signal(SIGTERM);
  EXPECT_EQ(holder.exit_code(10s), 76) << distlock::testing::read_file(out);
  int after_grant = 0;
  for (const Steady::time_point t : work_instants(distlock::testing::read_file(out)))
    if (t >= first.at) ++after_grant;
  EXPECT_EQ(after_grant, 0) << "the resumed holder's owns() answered true after the lock was granted again";
  if (waiter.lease.has_token()) {
    ASSERT_GE(holder_token, 0) << distlock::testing::read_file(out);
    EXPECT_GT(waiter.lease.token(), static_cast<std::uint64_t>(holder_token));
  }
}

// A normal release with lock_delay set hands over at once: the waiter's grant comes within
// kHandOverBound of the release call's return, far below the delay (5 s) and the TTL (4 s:
// zk:// refuses a TTL above twice its session timeout, 2 s here).
TEST_P(LockDelayEnforced, NormalReleaseHandsOverAtOnce) {
  constexpr Millis kTtl = 4000ms;
  constexpr Millis kDelay = 5000ms;
  auto holder_client = client();
  auto waiter_client = client();
  auto held = holder_client.try_acquire("ld/released", opts(kTtl, kDelay));
  ASSERT_TRUE(held.has_value());
  LeaseWaiter waiter(waiter_client, "ld/released", opts(kTtl, kDelay, 30s));
  ASSERT_TRUE(waiter_queued(waiter_client, "ld/released")) << "the waiter never queued";
  ASSERT_FALSE(waiter.done.load());
  held->release();
  const Steady::time_point released = Steady::now();
  waiter.join();
  ASSERT_FALSE(waiter.ec) << waiter.ec.message();
  ASSERT_TRUE(waiter.lease.owns());
  const Millis took = ms_between(released, waiter.granted_at);
  RecordProperty("handed_over_ms", static_cast<int>(took.count()));
  std::printf("[ %s ] normal release with lock_delay %lld ms: handed over in %lld ms\n",
              GetParam().label.c_str(), static_cast<long long>(kDelay.count()),
              static_cast<long long>(took.count()));
  EXPECT_LT(took, kHandOverBound);
  waiter.lease.release();
  // Released normally again: another client gets it within 1 s, far below the 5-s delay
  // (not by one try: mysql://'s waiter may still hold the name in its watcher session for
  // a moment after it was granted).
  std::error_code again_ec;
  auto again = holder_client.acquire("ld/released", opts(kTtl, 0ms, 1000ms), again_ec);
  EXPECT_FALSE(again_ec) << again_ec.message();
  EXPECT_TRUE(again.owns());
}

// A revoke is a loss, not a release: a holder with lock_delay D that is revoked holds the
// name back like a lost one (docs/design.md "Revoke"). Its lease could have ended no earlier
// than the revoke, so the waiter's grant must come no earlier than the revoke's start plus D;
// the marker lives until the holder's last renewal + TTL + D, so no later than the revoke's
// return + TTL + D + kLateBound. The holder is told: LossReason::revoked. A backend that cannot
// revoke (postgres://, mysql://: session locks) says not_supported and keeps the holder.
// On etcd:// and zk:// D is longer than the revoked lease can last after the revoke
// (lease_end_bound + revoke_extra + 500 ms), so a grant at the revoked lease's end without the delay falls
// before the revoke + D (seen: granted 3,215 / 2,081 ms after the revoke with the delay left
// out, and the test failing); elsewhere D stays 1.5 s, as measured there before.
TEST_P(LockDelayEnforced, ARevokedHolderHoldsTheLockBackForTheDelay) {
  constexpr Millis kTtl = 3000ms;
  const std::string& label = GetParam().label;
  const bool session = label == "etcd1" || label == "etcd3" || label == "zk1" || label == "zk3";
  const Millis kDelay = session ? lease_end_bound(label, kTtl) + revoke_extra(label) + 500ms : Millis(1500);
  auto holder_client = client();
  auto waiter_client = client();
  auto revoker = client();
  auto held = holder_client.try_acquire("ld/revoked", opts(kTtl, kDelay));
  ASSERT_TRUE(held.has_value());
  LeaseWaiter waiter(waiter_client, "ld/revoked", opts(kTtl, 0ms, 30s));
  ASSERT_TRUE(waiter_queued(waiter_client, "ld/revoked")) << "the waiter never queued";
  ASSERT_FALSE(waiter.done.load());
  const Steady::time_point revoking = Steady::now();
  std::error_code revoke_ec;
  const distlock::RevokeResult r = revoker.revoke("ld/revoked", "lock-delay test", revoke_ec);
  const Steady::time_point revoked = Steady::now();
  if (revoke_ec == errc::not_supported) {
    EXPECT_TRUE(GetParam().label == "postgres" || GetParam().label == "mysql")
        << GetParam().label << " cannot revoke: " << revoke_ec.message();
    EXPECT_TRUE(held->owns()) << "a refused revoke touched the holder";
    release_to(*held, waiter);
    return;
  }
  ASSERT_FALSE(revoke_ec) << revoke_ec.message();
  EXPECT_TRUE(r.revoked);
  waiter.join();
  ASSERT_FALSE(waiter.ec) << waiter.ec.message();
  ASSERT_TRUE(waiter.lease.owns());
  const Millis after_revoke = ms_between(revoking, waiter.granted_at);
  std::printf(
      "[ %s ] revoked holder with lock_delay %lld ms, ttl %lld ms: next granted %lld ms after the "
      "revoke began\n",
      GetParam().label.c_str(), static_cast<long long>(kDelay.count()), static_cast<long long>(kTtl.count()),
      static_cast<long long>(after_revoke.count()));
  EXPECT_GE(after_revoke, kDelay - kSkew) << "a revoked holder's lock-delay did not hold the name back";
  EXPECT_LE(ms_between(revoked, waiter.granted_at),
            lease_end_bound(GetParam().label, kTtl) + revoke_extra(GetParam().label) + kDelay + kLateBound)
      << "granted too late";
  const auto told_by = Steady::now() + 10s;
  while (held->owns() && Steady::now() < told_by) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(held->owns());
  EXPECT_EQ(held->loss_reason(), distlock::LossReason::revoked) << held->loss_detail();
}

// While a lost holder's lock-delay runs nobody holds the lock, though a waiter may already be
// first in the queue waiting the delay out: a revoke then is a no-op (revoked false: there is
// no holder to tell), status shows the lock not held, and the waiter is granted after the
// delay without an error (and `list` does not show it). The holder (lock_delay D) is revoked; every revoke
// and status call that returns before the first revoke's start plus D falls inside the delay (the lock cannot
// be granted before then: ARevokedHolderHoldsTheLockBackForTheDelay). TTL 1 s, D 5 s: the
// revoked holder's lease ends within lease_end_bound(1 s) <= 2.2 s, so for about 3 s the waiter
// is first and held back while the probes run (one every 50 ms, at most 200 of them).
TEST_P(LockDelayEnforced, ARevokeWhileALostHoldersDelayRunsIsANoOp) {
  constexpr Millis kTtl = 1000ms;
  constexpr Millis kDelay = 5000ms;
  const std::string name = "ld/revoke-in-delay";
  auto holder_client = client();
  auto waiter_client = client();
  auto revoker = client();
  auto held = holder_client.try_acquire(name, opts(kTtl, kDelay));
  ASSERT_TRUE(held.has_value());
  LeaseWaiter waiter(waiter_client, name, opts(kTtl, 0ms, 30s));
  ASSERT_TRUE(waiter_queued(waiter_client, name)) << "the waiter never queued";
  const Steady::time_point revoking = Steady::now();
  std::error_code revoke_ec;
  const distlock::RevokeResult first = revoker.revoke(name, "lock-delay test", revoke_ec);
  if (revoke_ec == errc::not_supported) {  // session locks (postgres://, mysql://)
    release_to(*held, waiter);
    return;
  }
  ASSERT_FALSE(revoke_ec) << revoke_ec.message();
  ASSERT_TRUE(first.revoked);
  int probes = 0;
  int held_seen = 0;
  int listed_seen = 0;             // `list` shows held locks only
  std::vector<std::string> bogus;  // revokes inside the delay that reported a holder
  for (int i = 0; i < 200 && !waiter.done.load(); ++i) {
    std::error_code pec;
    const distlock::LockInfo info = revoker.status(name);
    const std::vector<distlock::ListedLock> listed = revoker.list(name);
    const distlock::RevokeResult r = revoker.revoke(name, "revoke during the lock-delay", pec);
    if (Steady::now() >= revoking + kDelay - 100ms) break;  // past here a grant may be legal
    ASSERT_FALSE(pec) << "a revoke during the lock-delay failed: " << pec.message();
    ++probes;
    if (r.revoked) {
      bogus.push_back("token " + std::to_string(r.token.value_or(0)) + " holder \"" + r.holder.value_or("") +
                      "\" at " + std::to_string(ms_between(revoking, Steady::now()).count()) + " ms");
    }
    if (info.held) ++held_seen;
    for (const distlock::ListedLock& l : listed)
      if (l.name == name) ++listed_seen;
    std::this_thread::sleep_for(50ms);
  }
  waiter.join();
  std::printf(
      "[ %s ] %d revokes and status reads inside the lock-delay: %zu revoked something, %d "
      "showed it held\n",
      GetParam().label.c_str(), probes, bogus.size(), held_seen);
  EXPECT_GE(probes, 20) << "too few probes inside the delay to mean anything";
  for (const std::string& b : bogus) ADD_FAILURE() << "a revoke inside the lock-delay revoked " << b;
  EXPECT_EQ(held_seen, 0) << "status showed the lock held while nobody could hold it";
  EXPECT_EQ(listed_seen, 0) << "list showed the lock held while nobody could hold it";
  ASSERT_FALSE(waiter.ec) << "the waiter's acquire failed: " << waiter.ec.message();
  ASSERT_TRUE(waiter.lease.owns());
  EXPECT_GE(ms_between(revoking, waiter.granted_at), kDelay - kSkew);
  EXPECT_EQ(waiter.lease.loss_reason(), distlock::LossReason::none);
}

INSTANTIATE_TEST_SUITE_P(Backends, LockDelay, ::testing::ValuesIn(distlock::testing::kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });
// A build without an enforcing backend (no redis component) has no timing tests to run.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(LockDelayEnforced);
INSTANTIATE_TEST_SUITE_P(Backends, LockDelayEnforced, ::testing::ValuesIn(enforcing_kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });

}  // namespace
}  // namespace distlock::testing
