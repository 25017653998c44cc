// What a Redlock revoke reports (src/redlock/redlock_lease.cpp RedlockBackend::revoke and
// revoke_note, the revoke script in src/redlock/scripts.hpp), driven below the engine on three
// real masters:
//   - a waiter's fast-path attempt in flight, its key on every master beside a lost holder's live
//     lock-delay marker (the round trip before it takes those keys back), is no holder: the
//     revoke reports nobody revoked, writes no note and leaves the attempt's keys for its own
//     clean-up; a holder granted by a quorum of masters without a marker is still revoked, with
//     its key beside the marker on the third master or not, and so is a holder with its own
//     lock-delay (its key beside its own marker);
//   - the revoke note is reported only where a quorum of all the masters holds it: a minority
//     note (a revoke that found an attempt's key on one master) is not reported with a master
//     down, a note a revoke wrote on a quorum is, and with fewer than a quorum answering the read
//     is quorum_unavailable.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "direct_backend.hpp"
#include "engine/backend.hpp"
#include "lost_holder_marker.hpp"
#include "masters.hpp"
#include "redlock/redlock_backend.hpp"
#include "redlock/scripts.hpp"
#include "support/backend_names.hpp"
#include "support/fault_proxy.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;

const detail::redlock::Config kCfg{};

std::string key_of(std::string_view name) {
  return detail::redlock::lock_key(kCfg, name);
}
std::string marker_of(std::string_view name) {
  return detail::redlock::delay_key(kCfg, name);
}
std::string note_of(std::string_view name) {
  return detail::redlock::revoke_note_key(kCfg, name);
}

// The clean-up of a failed fast-path attempt on master i (redlock_acquire.cpp): the release
// script in its key-only mode, deleting only the attempt's exact value. Its integer answer.
long long undo_attempt(Masters& m, std::size_t i, const std::string& name, const std::string& value) {
  auto r = m[i].command({"EVAL", std::string(detail::redlock::kReleaseScript.body), "3", key_of(name),
                         detail::redlock::release_channel(kCfg, name), marker_of(name),
                         std::string(kWaiterId), "0", "", value});
  return r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
}

TEST(RedlockRevoke, AWaitersAttemptBesideALostHoldersMarkerIsNotReportedRevoked) {
  Masters m(3);
  ASSERT_NO_FATAL_FAILURE(lose_holder_with_delay(m, "job", kLostHolderId, 5000ms));
  // The waiter's attempt took the key on every master, beside the marker on each: it would
  // fail (busy on all three); the revoke lands before its clean-up.
  const std::string attempt = std::string(kWaiterId) + "\n00000000000000b1";
  for (std::size_t i = 0; i < 3; ++i)
    ASSERT_TRUE(fast_path_beside_marker(m, i, "job", attempt)) << "master " << i;

  auto b = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(b);
  Error ec;
  const auto r = b->revoke("job", "0\nrevoker\nduring the delay", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_FALSE(r.revoked)
      << "a waiter's attempt inside a lost holder's lock-delay was reported as the revoked "
         "holder \""
      << r.holder << "\"";
  EXPECT_EQ(r.holder, "");
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m[i].command({"EXISTS", note_of("job")})->integer, 0) << "master " << i << " got a revoke note";
    // The attempt's own clean-up still finds its key, and the lost holder's marker stays.
    EXPECT_EQ(undo_attempt(m, i, "job", attempt), 1)
        << "master " << i << " holds " << m.get(i, key_of("job"));
    EXPECT_GT(m[i].command({"PTTL", marker_of("job")})->integer, 0) << "master " << i;
  }
}

// The cure must not hide a real holder: a key stands beside another attempt's live marker only
// on masters that did not count toward its grant.
TEST(RedlockRevoke, AHolderBesideALostHoldersMarkerOnAMinorityIsStillRevoked) {
  Masters m(3);
  ASSERT_NO_FATAL_FAILURE(lose_holder_with_delay(m, "job", kLostHolderId, 5000ms));
  // Masters 1 and 2 lost the marker (restarted empty, say); master 0 keeps it.
  ASSERT_EQ(m[1].command({"DEL", marker_of("job")})->integer, 1);
  ASSERT_EQ(m[2].command({"DEL", marker_of("job")})->integer, 1);
  auto waiter = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(waiter);
  Error ec;
  ASSERT_TRUE(waiter->try_acquire(AcquireRequest{"job", kWaiterId, 30s, false, 0ms}, ec).acquired)
      << ec.message() << " " << ec.detail();
  // Granted by masters 1 and 2; its key on master 0 went back. Put it there again, as in the
  // round trip before the take-back: a revoke then finds it on all three.
  ASSERT_EQ(m[0].command({"EXISTS", key_of("job")})->integer, 0) << m.get(0, key_of("job"));
  const std::string held = m.get(1, key_of("job"));
  ASSERT_EQ(m[0].command({"SET", key_of("job"), held, "PX", "30000"})->type, REDIS_REPLY_STATUS);
  const auto r = waiter->revoke("job", "0\nrevoker\nstuck", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_TRUE(r.revoked);
  EXPECT_EQ(r.holder, kWaiterId);
  const RenewItem item{"job", kWaiterId, 0, 30s};
  RenewStatus out = RenewStatus::renewed;
  waiter->renew(std::span(&item, 1), std::span(&out, 1), ec);
  EXPECT_EQ(out, RenewStatus::not_owner) << "the revoked holder renewed on a quorum";

  // A holder with its own lock-delay (its key beside its own marker, one nonce) is revoked.
  ASSERT_TRUE(waiter->try_acquire(AcquireRequest{"own", kWaiterId, 30s, false, 2000ms}, ec).acquired)
      << ec.message() << " " << ec.detail();
  const auto own = waiter->revoke("own", "0\nrevoker\nstuck", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_TRUE(own.revoked);
  EXPECT_EQ(own.holder, kWaiterId);
}

// A revoke that found an attempt's key on one master (it revoked nobody) leaves its note there.
// With another master down, that one note against one master without any is no quorum: it
// must not be reported (a holder reading it would report its loss as that revoke's).
TEST(RedlockRevoke, ANoteOnFewerThanAQuorumIsNotReportedWithAMasterDown) {
  Masters m(3);
  auto b = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(b);
  const std::string attempt = std::string(kWaiterId) + "\n00000000000000c1";
  ASSERT_EQ(m[1].command({"SET", key_of("minority"), attempt, "PX", "30000"})->type, REDIS_REPLY_STATUS);
  Error ec;
  const auto r = b->revoke("minority", "0\nrevoker\nminority", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  ASSERT_FALSE(r.revoked);
  ASSERT_EQ(m[1].command({"EXISTS", note_of("minority")})->integer, 1);

  // A holder on every master, revoked while master 2 is down: its note is on masters 0 and 1.
  ASSERT_TRUE(b->try_acquire(AcquireRequest{"quorum", kWaiterId, 30s, false, 0ms}, ec).acquired)
      << ec.message() << " " << ec.detail();
  m[2].kill();
  const auto q = b->revoke("quorum", "0\nrevoker\nquorum", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  ASSERT_TRUE(q.revoked);

  // Masters 0 and 1 answer (a quorum): the minority note is not reported, the quorum's is.
  const auto minority = b->revoke_note("minority", ec);
  EXPECT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_FALSE(minority.has_value()) << "a note held by 1 of 3 masters was reported: "
                                     << minority.value_or("");
  const auto quorum = b->revoke_note("quorum", ec);
  EXPECT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_EQ(quorum.value_or("(none)"), "0\n" + std::string(kWaiterId) + "\n0\nrevoker\nquorum");

  // Master 1 alone answers: no note is known, and the read says why.
  m[0].kill();
  const auto alone = b->revoke_note("minority", ec);
  EXPECT_EQ(ec, errc::quorum_unavailable) << ec.message() << " " << ec.detail();
  EXPECT_FALSE(alone.has_value()) << "a note read on 1 of 3 masters was reported: " << alone.value_or("");
}

// A holder granted by masters 0 and 1 whose attempt also took the key on master 2, beside a lost
// holder's live marker, and whose take-back never reached master 2 (the grant's clean-up is one
// best-effort round trip: a master that times out keeps the key). The grant did not count
// master 2, so renewal must not count it either: a revoke partitioned from master 0 answers
// "not held" on master 2 (the marker) and revokes master 1; it reports the holder revoked,
// counting master 0 for it. The holder must then fail to renew: masters 0 and 2 alone are a
// quorum that still has its key.
TEST(RedlockRevoke, AHolderRevokedWithAMasterUnreachableDoesNotRenewOnItsKeyBesideAForeignMarker) {
  Masters m(3);
  ASSERT_NO_FATAL_FAILURE(lose_holder_with_delay(m, "job", kLostHolderId, 10000ms));
  ASSERT_EQ(m[0].command({"DEL", marker_of("job")})->integer, 1);
  ASSERT_EQ(m[1].command({"DEL", marker_of("job")})->integer, 1);
  auto holder = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(holder);
  Error ec;
  ASSERT_TRUE(holder->try_acquire(AcquireRequest{"job", kWaiterId, 30s, false, 0ms}, ec).acquired)
      << ec.message() << " " << ec.detail();
  // The take-back on master 2 lost: the attempt's key stays there beside the lost marker.
  const std::string held = m.get(1, key_of("job"));
  ASSERT_EQ(m[2].command({"SET", key_of("job"), held, "PX", "30000"})->type, REDIS_REPLY_STATUS);

  // The revoker reaches master 0 through a proxy that refuses it now.
  FaultProxy p0(m[0].port());
  p0.drop();
  auto revoker = make_backend("redlock://127.0.0.1:" + std::to_string(p0.port()) +
                              ",127.0.0.1:" + std::to_string(m[1].port()) +
                              ",127.0.0.1:" + std::to_string(m[2].port()) + "?timeout=2s");
  ASSERT_TRUE(revoker);
  const auto r = revoker->revoke("job", "0\nrevoker\npartitioned", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  ASSERT_TRUE(r.revoked) << "master 0 did not answer and holds the key: the holder must be counted revoked";
  EXPECT_EQ(r.holder, kWaiterId);

  const RenewItem item{"job", kWaiterId, 0, 30s};
  RenewStatus out = RenewStatus::renewed;
  holder->renew(std::span(&item, 1), std::span(&out, 1), ec);
  EXPECT_EQ(out, RenewStatus::not_owner)
      << "renewal status " << static_cast<int>(out)
      << ": the holder the revoke reported revoked renewed on masters 0 and 2 (master 2: its key beside a "
         "lost holder's marker, which no grant and no revoke counts): master 0 "
      << m.get(0, key_of("job")) << ", master 1 " << m.get(1, key_of("job")) << ", master 2 "
      << m.get(2, key_of("job"));
}

// A marker that does not expire (PTTL -1; this version always writes one with a TTL, but an
// operator's PERSIST or a restore without TTLs leaves one) holds nothing back for an acquisition
// (kAcquireScript and the fast path count a marker only while its PTTL is above 0). The revoke
// must read it the same way: a holder granted beside it on every master is revoked, not "nothing
// held" while it goes on renewing.
TEST(RedlockRevoke, AHolderBesideAMarkerWithoutExpiryIsRevoked) {
  Masters m(3);
  const std::string lost_marker = "5000\n" + std::string(kLostHolderId) + "\n00000000000000a1";
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(m[i].command({"SET", marker_of("job"), lost_marker})->type, REDIS_REPLY_STATUS);
    ASSERT_EQ(m[i].command({"PTTL", marker_of("job")})->integer, -1);
  }
  auto holder = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(holder);
  Error ec;
  ASSERT_TRUE(holder->try_acquire(AcquireRequest{"job", kWaiterId, 30s, false, 0ms}, ec).acquired)
      << "a marker without expiry held the acquisition back: " << ec.message() << " " << ec.detail();
  const auto r = holder->revoke("job", "0\nrevoker\npersisted marker", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_TRUE(r.revoked) << "a holder granted on every master beside a marker without expiry was reported "
                            "'nothing held'";
  EXPECT_EQ(r.holder, kWaiterId);
  const RenewItem item{"job", kWaiterId, 0, 30s};
  RenewStatus out = RenewStatus::renewed;
  holder->renew(std::span(&item, 1), std::span(&out, 1), ec);
  EXPECT_EQ(out, RenewStatus::not_owner) << "the holder still renews after the revoke";
}

// "Already revoked" ({2}) counts toward a holder only where the revoke that wrote that
// "@revoked" took the key from that same holder. A revoke of holder P (granted by masters 0 and 1;
// master 2 free) leaves "@revoked" there for P's remaining life; a second revoke that lands while
// another owner's attempt holds master 2 alone (its attempt is failing: busy on 0 and 1) must not
// count P's "@revoked" keys for that owner and report it revoked: it never held a quorum.
TEST(RedlockRevoke, AnEarlierRevokeOfAnotherHolderDoesNotMakeAnAttemptARevokedHolder) {
  Masters m(3);
  constexpr std::string_view kFirst = "00112233445566778899aabbccddeeff:3.1|first";
  // Master 2 busy for P's acquisition (a leftover key), freed right after it.
  ASSERT_EQ(m[2].command({"SET", key_of("job"), "someone\n00000000000000d1", "PX", "30000"})->type,
            REDIS_REPLY_STATUS);
  auto b = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(b);
  Error ec;
  ASSERT_TRUE(b->try_acquire(AcquireRequest{"job", kFirst, 30s, false, 0ms}, ec).acquired)
      << ec.message() << " " << ec.detail();
  ASSERT_EQ(m[2].command({"DEL", key_of("job")})->integer, 1);
  const auto first = b->revoke("job", "0\nrevoker\nfirst", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  ASSERT_TRUE(first.revoked);
  ASSERT_EQ(first.holder, kFirst);

  // A waiter's attempt took master 2 (its SET on 0 and 1 finds "@revoked": busy there).
  const std::string attempt = std::string(kWaiterId) + "\n00000000000000d2";
  ASSERT_EQ(m[2].command({"SET", key_of("job"), attempt, "NX", "PX", "30000"})->type, REDIS_REPLY_STATUS);
  const auto second = b->revoke("job", "0\nrevoker\nsecond", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_FALSE(second.revoked) << "an attempt holding 1 of 3 masters was reported as the revoked holder \""
                               << second.holder << "\", counting the 2 masters an earlier revoke of "
                               << kFirst << " made @revoked";
  EXPECT_EQ(second.holder, "");
}

// Five masters: holder H granted by masters 0, 1 and 2 (3 and 4 busy then), a waiter's failing
// attempt X on masters 3 and 4 (busy on 0-2). A revoker that cannot reach masters 1 and 2 finds
// H on one master and X on two: counting the two silent masters, either could have held a
// quorum. It must end H's lease and report it ended, but must not name X, an owner that never
// held a quorum, as the revoked holder: no holder is named (RevokeResult::holder empty).
void hold_beside_an_attempt(Masters& m, const std::string& name, std::string_view holder_owner,
                            std::unique_ptr<Backend>& holder) {
  for (std::size_t i = 3; i < 5; ++i)
    ASSERT_EQ(m[i].command({"SET", key_of(name), "someone\n00000000000000e1", "PX", "30000"})->type,
              REDIS_REPLY_STATUS);
  holder = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(holder);
  Error ec;
  ASSERT_TRUE(holder->try_acquire(AcquireRequest{name, holder_owner, 30s, false, 0ms}, ec).acquired)
      << ec.message() << " " << ec.detail();
  const std::string attempt = std::string(kWaiterId) + "\n00000000000000e2";
  for (std::size_t i = 3; i < 5; ++i)
    ASSERT_EQ(m[i].command({"SET", key_of(name), attempt, "PX", "30000"})->type, REDIS_REPLY_STATUS);
}

TEST(RedlockRevoke, ARevokeWithMastersSilentDoesNotNameAnAttemptAsTheHolder) {
  Masters m(5);
  constexpr std::string_view kHolder = "00112233445566778899aabbccddeeff:4.1|holder";
  FaultProxy p1(m[1].port()), p2(m[2].port());
  p1.drop();
  p2.drop();
  const std::string url =
      "redlock://127.0.0.1:" + std::to_string(m[0].port()) + ",127.0.0.1:" + std::to_string(p1.port()) +
      ",127.0.0.1:" + std::to_string(p2.port()) + ",127.0.0.1:" + std::to_string(m[3].port()) +
      ",127.0.0.1:" + std::to_string(m[4].port()) + "?timeout=2s";

  std::unique_ptr<Backend> holder;
  ASSERT_NO_FATAL_FAILURE(hold_beside_an_attempt(m, "job", kHolder, holder));
  auto revoker = make_backend(url);
  ASSERT_TRUE(revoker);
  Error ec;
  const auto r = revoker->revoke("job", "0\nrevoker\ntwo silent", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_TRUE(r.revoked);
  EXPECT_EQ(r.holder, "")
      << "a waiter's attempt on 2 of 5 masters (or the holder on 1 answering of its 3) was "
         "named the revoked holder; either could have held a quorum";
  const RenewItem item{"job", kHolder, 0, 30s};  // views: kHolder outlives the call
  RenewStatus out = RenewStatus::renewed;
  holder->renew(std::span(&item, 1), std::span(&out, 1), ec);
  EXPECT_EQ(out, RenewStatus::not_owner) << "renewal status " << static_cast<int>(out);

  // Through the client: revoked, holder unknown.
  std::unique_ptr<Backend> second;
  ASSERT_NO_FATAL_FAILURE(hold_beside_an_attempt(m, "client", kHolder, second));
  auto client = distlock::connect(url, quiet());
  const RevokeResult cr = client.revoke("client", "two silent");
  EXPECT_TRUE(cr.revoked);
  EXPECT_FALSE(cr.holder.has_value()) << "named " << cr.holder.value_or("");
  EXPECT_FALSE(cr.holder_info.has_value());
}

}  // namespace

}  // namespace distlock::testing
