// The per-attempt nonce in a Redlock key's value ("<owner>\n<nonce>", src/redlock/scripts.hpp)
// never leaks out of the backend and never lets one attempt act on another's key:
//   - status, list and revoke name the holder (owner id and holder_info) without the nonce, and the
//     revoke note stores the owner part; a revoked lease is not renewed back; a key on fewer
//     masters than a quorum is an attempt, and a revoke that finds only it revoked nobody;
//   - a late clean-up of an earlier attempt of the same owner leaves the later attempt's key,
//     which the lease's renewal then extends and its release deletes, on every master;
//   - with a lock_delay, the marker carries the same nonce as the key it stands beside;
//   - a failed attempt's request, held back on a master's old connection and run there once that
//     master is free again, after the same call's next attempt was granted without it: its
//     clean-up runs right behind it, so no key of the earlier attempt stays there for the
//     lease's renewal to extend and count, and a third client stays refused;
//   - two backends in one process, acquiring from two threads, never reuse a nonce, and each
//     one's nonces increase from attempt to attempt (the acquire script's take-over order).
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "direct_backend.hpp"
#include "engine/backend.hpp"
#include "engine/url.hpp"
#include "masters.hpp"
#include "redlock/redlock_backend.hpp"
#include "redlock/scripts.hpp"
#include "support/backend_names.hpp"
#include "support/eventually.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;

// An engine-shaped owner id with a holder_info whose tail is hex: the nonce must not be read
// into it, nor part of it taken for a nonce.
constexpr std::string_view kOwner = "0123456789abcdef0123456789abcdef:1.7|cafe";

std::string key_of(std::string_view name) {
  return detail::redlock::lock_key(detail::redlock::Config{}, name);
}

// The nonce of a stored key value "<owner>\n<nonce>" ("" when the value has none).
std::string nonce_of(const std::string& value) {
  const auto nl = value.rfind('\n');
  return nl == std::string::npos ? std::string() : value.substr(nl + 1);
}

// Connects `b` to the three masters of `m` (timeout 2 s) and takes `name` with it for kOwner
// (TTL 30 s, `lock_delay`).
void hold(Masters& m, const std::string& name, std::chrono::milliseconds lock_delay,
          std::unique_ptr<Backend>& b) {
  b = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(b);
  Error ec;
  ASSERT_TRUE(b->try_acquire(AcquireRequest{name, kOwner, 30s, false, lock_delay}, ec).acquired)
      << ec.message() << " " << ec.detail();
}

TEST(RedlockOwnerNonce, StatusListAndRevokeNameTheHolderWithoutTheAttemptsNonce) {
  Masters m(3);
  std::unique_ptr<Backend> b;
  ASSERT_NO_FATAL_FAILURE(hold(m, "report", 0ms, b));
  Error ec;
  const std::string stored = m.get(0, key_of("report"));
  ASSERT_EQ(stored.substr(0, kOwner.size() + 1), std::string(kOwner) + "\n") << "the key holds " << stored;
  ASSERT_EQ(nonce_of(stored).size(), 16U) << "the key holds " << stored;

  const auto info = b->status("report", ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_TRUE(info.held);
  // The whole owner id (the engine splits off the holder_info), the nonce not in it.
  EXPECT_EQ(info.holder.value_or("(none)"), kOwner);

  bool truncated = true;
  const auto listed = b->list_held("", 10, truncated, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(listed[0].name, "report");
  EXPECT_EQ(listed[0].info.holder, info.holder);

  const auto revoked = b->revoke("report", "rotating", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_TRUE(revoked.revoked);
  EXPECT_EQ(revoked.holder, kOwner);
  const auto note = b->revoke_note("report", ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_EQ(note.value_or("(none)"), "0\n" + std::string(kOwner) + "\nrotating");

  // The revoked lease is not renewed back to life, though its owner part was in the value.
  const RenewItem item{"report", kOwner, 0, 30s};
  RenewStatus out = RenewStatus::renewed;
  b->renew(std::span(&item, 1), std::span(&out, 1), ec);
  EXPECT_EQ(out, RenewStatus::not_owner);
  EXPECT_FALSE(b->status("report", ec).holder.has_value());
}

// A key on fewer masters than a quorum is an attempt in flight (or one that failed and is
// being cleaned up), not a holder: a revoke that finds only it has revoked nobody. Seen in
// LockDelayEnforced.ARevokeWhileALostHoldersDelayRunsIsANoOp/redlock3 (about 1 run in 8 beside
// two CPU hogs): a waiter's attempt took the one master the lost holder's marker was not on,
// and a revoke inside the lock-delay reported it as a revoked holder.
TEST(RedlockOwnerNonce, ARevokeThatFindsAKeyOnFewerThanAQuorumRevokedNobody) {
  Masters m(3);
  auto b = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(b);
  const std::string attempt = std::string(kOwner) + "\n00000000000000aa";
  m[1].command({"SET", key_of("minority"), attempt, "PX", "30000"});
  Error ec;
  const auto one = b->revoke("minority", "rotating", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_FALSE(one.revoked) << "a key on 1 of 3 masters was reported as a revoked holder";
  EXPECT_EQ(one.holder, "");

  // On a quorum it is a holder: revoked, and named.
  m[0].command({"SET", key_of("quorum"), attempt, "PX", "30000"});
  m[2].command({"SET", key_of("quorum"), attempt, "PX", "30000"});
  const auto two = b->revoke("quorum", "rotating", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_TRUE(two.revoked);
  EXPECT_EQ(two.holder, kOwner);
}

// The revoke script run on master `i` alone, as another revoke's would: the owner it found
// there ("" when none).
std::string revoke_on(Masters& m, std::size_t i, const std::string& name, const std::string& note) {
  const detail::redlock::Config cfg;
  auto r = m[i].command({"EVAL", std::string(detail::redlock::kRevokeScript.body), "4",
                         detail::redlock::lock_key(cfg, name), detail::redlock::revoke_note_key(cfg, name),
                         detail::redlock::release_channel(cfg, name), detail::redlock::delay_key(cfg, name),
                         note, "60000"});
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) return "";
  return std::string(r->element[1]->str, r->element[1]->len);
}

// Overlapping revokes of one holder each find part of its keys (another revoke reached the
// rest first): every one of them ended the lease, and says so. A holder on exactly a quorum
// (master 2 restarted empty): revoke A reaches master 0 first, revoke B then finds it on
// master 1 only; a holder on all three, two other revokes first: the third finds it on one.
TEST(RedlockOwnerNonce, OverlappingRevokesOfOneHolderEachReportItRevoked) {
  Masters m(3);
  std::unique_ptr<Backend> b;
  ASSERT_NO_FATAL_FAILURE(hold(m, "split", 0ms, b));
  m[2].command({"DEL", key_of("split")});
  EXPECT_EQ(revoke_on(m, 0, "split", "1\nrevoker-a\nconcurrent"), kOwner);
  Error ec;
  const auto second = b->revoke("split", "rotating", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_TRUE(second.revoked);
  EXPECT_EQ(second.holder, kOwner);
  const RenewItem item{"split", kOwner, 0, 30s};
  RenewStatus out = RenewStatus::renewed;
  b->renew(std::span(&item, 1), std::span(&out, 1), ec);
  EXPECT_EQ(out, RenewStatus::not_owner);

  ASSERT_NO_FATAL_FAILURE(hold(m, "three", 0ms, b));
  EXPECT_EQ(revoke_on(m, 0, "three", "1\nrevoker-a\nconcurrent"), kOwner);
  EXPECT_EQ(revoke_on(m, 1, "three", "2\nrevoker-b\nconcurrent"), kOwner);
  const auto third = b->revoke("three", "rotating", 60s, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_TRUE(third.revoked);
  EXPECT_EQ(third.holder, kOwner);
}

TEST(RedlockOwnerNonce, AnEarlierAttemptsLateCleanUpLeavesTheKeyTheLeaseRenewsAndReleases) {
  Masters m(3);
  std::unique_ptr<Backend> b;
  ASSERT_NO_FATAL_FAILURE(hold(m, "job", 0ms, b));
  const std::string key = key_of("job");
  const std::string held = m.get(1, key);
  ASSERT_EQ(nonce_of(held).size(), 16U) << held;

  // An earlier attempt's clean-up (exactly its own value, one nonce below) reaching every
  // master late: nothing deleted.
  const std::string earlier = std::string(kOwner) + "\n" + std::string(15, '0') + "0";
  ASSERT_NE(earlier, held);
  const std::string marker = detail::redlock::delay_key(detail::redlock::Config{}, "job");
  for (std::size_t i = 0; i < 3; ++i) {
    auto r = m[i].command({"EVAL", std::string(detail::redlock::kReleaseScript.body), "3", key,
                           "distlock:redlock:chan:job", marker, std::string(kOwner), "0", "", earlier});
    ASSERT_EQ(r->type, REDIS_REPLY_INTEGER);
    EXPECT_EQ(r->integer, 0) << "master " << i << ": an earlier attempt's clean-up deleted the lease's key";
    EXPECT_EQ(m.get(i, key), held);
  }

  const RenewItem item{"job", kOwner, 0, 30s};
  RenewStatus out = RenewStatus::failed;
  Error ec;
  b->renew(std::span(&item, 1), std::span(&out, 1), ec);
  EXPECT_EQ(out, RenewStatus::renewed) << ec.message() << " " << ec.detail();
  // Another owner whose id is this one's prefix renews and releases nothing.
  const std::string prefix(kOwner.substr(0, kOwner.size() - 1));
  const RenewItem other{"job", prefix, 0, 30s};
  b->renew(std::span(&other, 1), std::span(&out, 1), ec);
  EXPECT_EQ(out, RenewStatus::not_owner);
  EXPECT_EQ(b->release("job", prefix, 0, ec), ReleaseStatus::not_owner);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(m.get(i, key), held) << "master " << i;

  EXPECT_EQ(b->release("job", kOwner, 0, ec), ReleaseStatus::released) << ec.message() << " " << ec.detail();
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m[i].command({"EXISTS", key})->integer, 0) << "master " << i << " kept the released key";
  }
}

TEST(RedlockOwnerNonce, TheLockDelayMarkerCarriesTheKeysNonce) {
  Masters m(3);
  std::unique_ptr<Backend> b;
  ASSERT_NO_FATAL_FAILURE(hold(m, "batch", 2000ms, b));
  const std::string key = key_of("batch");
  const std::string marker = detail::redlock::delay_key(detail::redlock::Config{}, "batch");
  for (std::size_t i = 0; i < 3; ++i) {
    const std::string v = m.get(i, key), mk = m.get(i, marker);
    EXPECT_EQ(nonce_of(mk), nonce_of(v)) << "master " << i << ": key " << v << ", marker " << mk;
    EXPECT_NE(mk.find("\n" + std::string(kOwner) + "\n"), std::string::npos) << mk;
  }
  Error ec;
  EXPECT_EQ(b->release("batch", kOwner, 0, ec), ReleaseStatus::released)
      << ec.message() << " " << ec.detail();
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m[i].command({"EXISTS", key, marker})->integer, 0) << "master " << i;
  }
}

class RedlockHeldAttempt : public ::testing::TestWithParam<std::chrono::milliseconds> {};

TEST_P(RedlockHeldAttempt, AHeldAttemptRunLateOnAFreeMasterLeavesNoKeyTheRenewalCounts) {
  const std::chrono::milliseconds lock_delay = GetParam();
  const std::string key = key_of("job");
  const AcquireRequest req{"job", kOwner, 10s, false, lock_delay};
  HeldMaster0 s;
  ASSERT_NO_FATAL_FAILURE(s.set_up(kOwner, key, lock_delay));
  auto& m = s.m;
  auto& client = s.client;
  auto& third = s.third;
  Error ec;

  // Attempt A: busy on 1 and 2, no answer from 0 (its old connection held back).
  ASSERT_FALSE(client->try_acquire(req, ec).acquired);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();

  // Attempt B: master 0 busy with another holder, 1 and 2 free: granted by 1 and 2 only.
  ASSERT_EQ(m[0].command({"SET", key, "other-holder-z", "PX", "60000"})->type, REDIS_REPLY_STATUS);
  ASSERT_EQ(m[1].command({"DEL", key})->integer, 1);
  ASSERT_EQ(m[2].command({"DEL", key})->integer, 1);
  const auto b_sent = std::chrono::steady_clock::now();
  const auto b = client->try_acquire(req, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  ASSERT_TRUE(b.acquired);

  // Master 0 frees, then runs A's held request (it finds the key free) and its clean-up.
  ASSERT_EQ(m[0].command({"DEL", key})->integer, 1);
  const long long evals = m[0].command_calls("eval");
  s.p0.release_held();
  ASSERT_TRUE(eventually([&] { return m[0].command_calls("eval") > evals; }, 10s))
      << "master 0 never ran attempt A's held clean-up";
  EXPECT_EQ(m[0].command({"EXISTS", key})->integer, 0)
      << "attempt A's key stayed on master 0: " << m.get(0, key);

  // B renews on 1 and 2 (nothing of it on 0), and a third client is still refused.
  const RenewItem item{"job", kOwner, 0, 10s};
  RenewStatus out = RenewStatus::failed;
  client->renew(std::span(&item, 1), std::span(&out, 1), ec);
  EXPECT_EQ(out, RenewStatus::renewed) << ec.message() << " " << ec.detail();
  EXPECT_EQ(m[0].command({"EXISTS", key})->integer, 0) << "the renewal made a key on master 0";
  const auto c = third->try_acquire(
      AcquireRequest{"job", "fedcba9876543210fedcba9876543210:1.1", 10s, false, lock_delay}, ec);
  const auto b_age =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - b_sent);
  ASSERT_LT(b_age, b.validity) << "B's lease ran out before the check; the check proves nothing";
  EXPECT_FALSE(c.acquired) << "a third client was granted the lock while B's lease was valid";
  EXPECT_EQ(client->release("job", kOwner, 0, ec), ReleaseStatus::released)
      << ec.message() << " " << ec.detail();
}

INSTANTIATE_TEST_SUITE_P(LockDelay, RedlockHeldAttempt, ::testing::Values(0ms, 2000ms), lock_delay_name);

TEST(RedlockOwnerNonce, TwoBackendsOnTwoThreadsNeverReuseANonceAndEachOnesIncrease) {
  Masters m(3);
  auto b1 = make_backend(m.url("timeout=2s"));
  auto b2 = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(b1 && b2);
  constexpr int kRounds = 20;  // bounded: 20 acquire/release pairs per thread
  std::vector<std::string> seen1, seen2;
  auto run = [&m](Backend& b, const std::string& name, std::vector<std::string>& seen) {
    const std::string owner = std::string(kOwner) + name;
    for (int i = 0; i < kRounds; ++i) {
      Error ec;
      if (!b.try_acquire(AcquireRequest{name, owner, 30s, false, 0ms}, ec).acquired) return;
      seen.push_back(nonce_of(m.get(0, key_of(name))));
      if (b.release(name, owner, 0, ec) != ReleaseStatus::released) return;
    }
  };
  std::thread t1([&] { run(*b1, "n1", seen1); });
  std::thread t2([&] { run(*b2, "n2", seen2); });
  t1.join();
  t2.join();
  ASSERT_EQ(seen1.size(), static_cast<std::size_t>(kRounds));
  ASSERT_EQ(seen2.size(), static_cast<std::size_t>(kRounds));
  std::set<std::string> all(seen1.begin(), seen1.end());
  all.insert(seen2.begin(), seen2.end());
  EXPECT_EQ(all.size(), static_cast<std::size_t>(2 * kRounds)) << "a nonce was used twice";
  for (int i = 1; i < kRounds; ++i) {
    EXPECT_LT(seen1[i - 1], seen1[i]) << "round " << i;
    EXPECT_LT(seen2[i - 1], seen2[i]) << "round " << i;
  }
}

}  // namespace

}  // namespace distlock::testing
