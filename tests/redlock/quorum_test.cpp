// Redlock's arithmetic and URL checks, without servers.
#include "redlock/quorum.hpp"

#include <gtest/gtest.h>

#include "engine/url.hpp"
#include "redlock/redlock_backend.hpp"

namespace distlock::detail::redlock {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(RedlockQuorum, IsAStrictMajority) {
  EXPECT_EQ(quorum_of(3), 2u);
  EXPECT_EQ(quorum_of(4), 3u);
  EXPECT_EQ(quorum_of(5), 3u);
  EXPECT_EQ(quorum_of(7), 4u);
}

TEST(RedlockQuorum, DriftIsOnePercentPlusTwoMilliseconds) {
  EXPECT_EQ(clock_drift(seconds(10)), milliseconds(102));
  EXPECT_EQ(clock_drift(milliseconds(100)), milliseconds(3));
  EXPECT_EQ(clock_drift(seconds(30)), milliseconds(302));
}

// The lock-delay marker's extra life (docs/redlock.md "Lock-delay"): D + 2 x drift(D), and
// the inequality the guarantee rests on, checked in whole milliseconds over every D up to
// 60 s (step 7 ms) and TTLs from 10 ms to 10 min: a marker of ttl + extra on a master whose
// clock runs 1 % fast lasts 0.99 x (ttl + extra) of real time, no less than the holder's
// lease end (ttl - drift(ttl) after the send) plus D.
TEST(RedlockQuorum, LockDelayMarkerOutlivesTheLeaseEndPlusTheDelayUnderTheDriftModel) {
  EXPECT_EQ(lock_delay_extra(milliseconds(0)), milliseconds(0));
  EXPECT_EQ(lock_delay_extra(milliseconds(1500)), milliseconds(1534));
  EXPECT_EQ(lock_delay_extra(seconds(60)), milliseconds(61204));
  for (long long ttl : {10LL, 100LL, 1000LL, 30000LL, 600000LL}) {
    for (long long d = 1; d <= 60000; d += 7) {
      const long long extra = lock_delay_extra(milliseconds(d)).count();
      const long long lease_end = ttl - clock_drift(milliseconds(ttl)).count();
      // 0.99 x (ttl + extra) >= lease_end + d, in integers: 99 x (ttl + extra) >= 100 x (...)
      ASSERT_GE(99 * (ttl + extra), 100 * (lease_end + d)) << "ttl " << ttl << " ms, D " << d << " ms";
    }
  }
}

TEST(RedlockQuorum, DefaultNodeTimeoutIsSmallAgainstTheTtl) {
  EXPECT_EQ(default_node_timeout(seconds(30)), milliseconds(50));
  EXPECT_EQ(default_node_timeout(milliseconds(200)), milliseconds(20));
  EXPECT_EQ(default_node_timeout(milliseconds(5)), milliseconds(1));
}

TEST(RedlockAcquire, QuorumWithValidityLeftAcquires) {
  AcquireTally t{.nodes = 3, .acquired = 2, .busy = 1, .max_busy_ttl = milliseconds(500)};
  const auto d = decide_acquire(t, seconds(10), milliseconds(5));
  EXPECT_EQ(d.verdict, AcquireVerdict::acquired);
  EXPECT_EQ(d.validity, seconds(10) - milliseconds(102));  // counted by the engine from the send time
}

TEST(RedlockAcquire, QuorumThatTookTooLongIsNotAcquired) {
  // validity = ttl - elapsed - drift must stay > 0: 1000 - 988 - 12 = 0.
  AcquireTally t{.nodes = 3, .acquired = 3};
  EXPECT_EQ(decide_acquire(t, milliseconds(1000), milliseconds(988)).verdict, AcquireVerdict::too_slow);
  EXPECT_EQ(decide_acquire(t, milliseconds(1000), milliseconds(987)).verdict, AcquireVerdict::acquired);
  EXPECT_EQ(decide_acquire(t, milliseconds(1000), milliseconds(988)).holder_ttl, milliseconds(0));
}

TEST(RedlockAcquire, MinorityIsBusyWithTheLongestHolderTtlCappedByTtl) {
  AcquireTally t{.nodes = 5, .acquired = 2, .busy = 3, .max_busy_ttl = milliseconds(700)};
  auto d = decide_acquire(t, seconds(1), milliseconds(1));
  EXPECT_EQ(d.verdict, AcquireVerdict::busy);
  EXPECT_EQ(d.holder_ttl, milliseconds(700));
  t.max_busy_ttl = seconds(90);  // a key set by hand with a longer PX than ours
  EXPECT_EQ(decide_acquire(t, seconds(1), milliseconds(1)).holder_ttl, seconds(1));
}

TEST(RedlockAcquire, SplitVoteIsBusyAndRetriesSoon) {
  AcquireTally t{.nodes = 3, .acquired = 1, .busy = 1};  // one master did not answer
  auto d = decide_acquire(t, seconds(1), milliseconds(1));
  EXPECT_EQ(d.verdict, AcquireVerdict::busy);
  EXPECT_EQ(d.holder_ttl, milliseconds(0));
}

TEST(RedlockAcquire, FewerThanAQuorumAnsweringIsQuorumUnavailable) {
  EXPECT_EQ(decide_acquire({.nodes = 3, .acquired = 1}, seconds(1), milliseconds(1)).verdict,
            AcquireVerdict::quorum_unavailable);
  EXPECT_EQ(decide_acquire({.nodes = 3, .busy = 1}, seconds(1), milliseconds(1)).verdict,
            AcquireVerdict::quorum_unavailable);
  EXPECT_EQ(decide_acquire({.nodes = 5, .acquired = 1, .busy = 1}, seconds(1), milliseconds(1)).verdict,
            AcquireVerdict::quorum_unavailable);
  EXPECT_EQ(decide_acquire({.nodes = 5, .acquired = 2, .busy = 1}, seconds(1), milliseconds(1)).verdict,
            AcquireVerdict::busy);
}

TEST(RedlockRenew, NeedsAQuorumAndIsLostOnceAQuorumIsOutOfReach) {
  EXPECT_EQ(decide_renew(3, 2, 1), RenewStatus::renewed);
  EXPECT_EQ(decide_renew(3, 1, 0), RenewStatus::failed);     // two unknown: retry until the deadline
  EXPECT_EQ(decide_renew(3, 1, 1), RenewStatus::failed);     // the third may still renew next time
  EXPECT_EQ(decide_renew(3, 0, 2), RenewStatus::not_owner);  // a quorum says not ours
  EXPECT_EQ(decide_renew(3, 1, 2), RenewStatus::not_owner);
  EXPECT_EQ(decide_renew(5, 3, 2), RenewStatus::renewed);
  EXPECT_EQ(decide_renew(5, 2, 2), RenewStatus::failed);
  EXPECT_EQ(decide_renew(5, 2, 3), RenewStatus::not_owner);
  EXPECT_EQ(decide_renew(4, 2, 2), RenewStatus::not_owner);  // even N: 3 of 4 can no longer renew
}

TEST(RedlockRelease, VerdictFromDeletedAndRefusedCounts) {
  EXPECT_EQ(decide_release(3, 3, 0), ReleaseVerdict::released);
  EXPECT_EQ(decide_release(3, 2, 0), ReleaseVerdict::released);   // one master down
  EXPECT_EQ(decide_release(3, 1, 1), ReleaseVerdict::released);   // a stale foreign key on one
  EXPECT_EQ(decide_release(3, 1, 2), ReleaseVerdict::not_owner);  // we cannot have held a quorum
  EXPECT_EQ(decide_release(3, 1, 0), ReleaseVerdict::quorum_unavailable);
  EXPECT_EQ(decide_release(5, 0, 3), ReleaseVerdict::not_owner);
}

Config parse_ok(const std::string& text) {
  Url url;
  const distlock::detail::Error parsed = parse_url(text, url);
  EXPECT_FALSE(parsed) << parsed.detail();
  Config cfg;
  const distlock::detail::Error err = parse_config(url, cfg);
  EXPECT_FALSE(err) << err.detail();
  return cfg;
}

std::string parse_error(const std::string& text) {
  Url url;
  if (const distlock::detail::Error parsed = parse_url(text, url)) return "url: " + parsed.detail();
  Config cfg;
  const distlock::detail::Error err = parse_config(url, cfg);
  EXPECT_EQ(err, errc::invalid_url) << text;
  return err.detail();
}

TEST(RedlockUrl, ParsesMastersCredentialsPrefixAndTimeout) {
  Config c = parse_ok("redlock://alice:s3cret@h1:7001,h2,[::1]:7003?prefix=app:&timeout=20ms");
  ASSERT_EQ(c.masters.size(), 3u);
  EXPECT_EQ(c.masters[0].host, "h1");
  EXPECT_EQ(c.masters[0].port, 7001);
  EXPECT_EQ(c.masters[1].port, 6379);  // default port
  EXPECT_EQ(c.masters[2].host, "::1");
  EXPECT_EQ(c.user, "alice");
  EXPECT_EQ(c.password, "s3cret");
  EXPECT_EQ(c.prefix, "app:");
  EXPECT_EQ(c.node_timeout, milliseconds(20));
  EXPECT_EQ(lock_key(c, "job"), "app:lock:job");
  EXPECT_EQ(release_channel(c, "job"), "app:released:job");

  Config d = parse_ok("redlock://a:1,b:2,c:3");
  EXPECT_EQ(d.prefix, "distlock:redlock:");
  EXPECT_FALSE(d.node_timeout.has_value());
  EXPECT_TRUE(d.password.empty());
}

TEST(RedlockUrl, RejectsEachProblemByName) {
  EXPECT_NE(parse_error("redlock://a:1,b:2").find("at least 3 independent masters"), std::string::npos);
  EXPECT_NE(parse_error("redlock://a:1").find("names 1"), std::string::npos);
  EXPECT_NE(parse_error("redlock://a:1,b:2,a:1").find("a:1 appears twice"), std::string::npos);
  EXPECT_NE(parse_error("redlock://a,b,a:6379").find("appears twice"), std::string::npos);
  EXPECT_NE(parse_error("redlock://a:1,b:2,c:3?timeout=fast").find("timeout \"fast\""), std::string::npos);
  EXPECT_NE(parse_error("redlock://a:1,b:2,c:3?timeout=0").find("positive duration"), std::string::npos);
  EXPECT_NE(parse_error("redlock://a:1,b:2,c:3?quorum=1").find("unknown query parameter \"quorum\""),
            std::string::npos);
  EXPECT_NE(parse_error("redlock://a:1,b:2,c:3/2").find("no database path"), std::string::npos);
  EXPECT_NE(parse_error("redlock://bob@a:1,b:2,c:3").find("no password"), std::string::npos);
  // A bare password written where the user goes is never echoed.
  EXPECT_EQ(parse_error("redlock://hunter2@a:1,b:2,c:3").find("hunter2"), std::string::npos);
  // The password never appears in a message.
  EXPECT_EQ(parse_error("redlock://bob:hunter2@a:1,b:2").find("hunter2"), std::string::npos);
}

}  // namespace
}  // namespace distlock::detail::redlock
