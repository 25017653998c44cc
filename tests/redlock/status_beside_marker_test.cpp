// What Redlock status and list report for a key beside a lock-delay marker
// (src/redlock/redlock_records.cpp RedlockBackend::status, list_held and status_from, the status
// script in src/redlock/scripts.hpp), driven below the engine on three real masters:
//   - a waiter's fast-path attempt in flight, its key on every master beside a lost holder's live
//     lock-delay marker (the round trip before it takes those keys back), is no holder: status
//     reports the lock free and list does not list it, as the revoke script reports it "not held"
//     (revoke_test.cpp); the attempt's keys are left for its own clean-up;
//   - the rule hides no real holder: a holder granted by a quorum of masters without a marker is
//     still held and listed with its key beside the marker on the third master, and so is a
//     holder with its own lock-delay (its key beside its own marker), and a holder granted beside
//     a marker without expiry (the acquisition reads a marker by PTTL > 0; so does status).
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "direct_backend.hpp"
#include "engine/backend.hpp"
#include "lost_holder_marker.hpp"
#include "masters.hpp"
#include "redlock/redlock_backend.hpp"
#include "support/backend_names.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;

// The owner part of a key's value "<owner>\n<nonce>".
std::string owner_of_value(const std::string& value) {
  return value.substr(0, value.rfind('\n'));
}

// The entry of `name` in a listing of every lock (empty prefix); nullptr when it is not listed.
const detail::ListedLock* listed_entry(const std::vector<detail::ListedLock>& all, const std::string& name) {
  for (const detail::ListedLock& l : all)
    if (l.name == name) return &l;
  return nullptr;
}

TEST(RedlockStatusBesideMarker, AnAttemptBesideALostHoldersMarkerIsNotHeld) {
  Masters m(3);
  ASSERT_NO_FATAL_FAILURE(lose_holder_with_delay(m, "job", kLostHolderId, 5000ms));
  // The waiter's attempt took the key on every master, beside the marker on each: it fails
  // (busy on all three) and takes the keys back; status and list run before that clean-up.
  const std::string attempt = std::string(kWaiterId) + "\n00000000000000d1";
  for (std::size_t i = 0; i < 3; ++i)
    ASSERT_TRUE(fast_path_beside_marker(m, i, "job", attempt)) << "master " << i;

  auto b = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(b);
  Error ec;
  const LockInfo info = b->status("job", ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_FALSE(info.held) << "status showed an attempt inside a lost holder's lock-delay as the holder \""
                          << info.holder.value_or("") << "\"";
  EXPECT_FALSE(info.holder.has_value());
  bool truncated = true;
  const std::vector<detail::ListedLock> all = b->list_held("", 100, truncated, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_FALSE(truncated);
  const detail::ListedLock* l = listed_entry(all, "job");
  EXPECT_EQ(l, nullptr) << "list showed an attempt inside a lost holder's lock-delay as the holder \""
                        << (l ? l->info.holder.value_or("") : "") << "\"";
  // Status and list wrote nothing: the attempt's keys and the lost holder's markers stand.
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m.get(i, redlock_lock_key("job")), attempt) << "master " << i;
    EXPECT_GT(m[i].command({"PTTL", redlock_marker_key("job")})->integer, 0) << "master " << i;
  }
}

// The rule must not hide a real holder: a key stands beside another acquisition's live marker
// only on masters that did not count toward its grant.
TEST(RedlockStatusBesideMarker, AHolderWithAKeyBesideAMarkerOnAMinorityIsHeld) {
  Masters m(3);
  ASSERT_NO_FATAL_FAILURE(lose_holder_with_delay(m, "job", kLostHolderId, 5000ms));
  // Masters 1 and 2 lost the marker (restarted empty, say); master 0 keeps it.
  ASSERT_EQ(m[1].command({"DEL", redlock_marker_key("job")})->integer, 1);
  ASSERT_EQ(m[2].command({"DEL", redlock_marker_key("job")})->integer, 1);
  auto waiter = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(waiter);
  Error ec;
  ASSERT_TRUE(waiter->try_acquire(AcquireRequest{"job", kWaiterId, 30s, false, 0ms}, ec).acquired)
      << ec.message() << " " << ec.detail();
  // Granted by masters 1 and 2; its key on master 0 went back. Put it there again, as in the
  // round trip before the take-back: status then finds it on all three, beside the marker on 0.
  ASSERT_EQ(m[0].command({"EXISTS", redlock_lock_key("job")})->integer, 0)
      << m.get(0, redlock_lock_key("job"));
  const std::string held = m.get(1, redlock_lock_key("job"));
  ASSERT_EQ(m[0].command({"SET", redlock_lock_key("job"), held, "PX", "30000"})->type, REDIS_REPLY_STATUS);
  // A holder with its own lock-delay: its key beside its own marker (one nonce) on every master.
  ASSERT_TRUE(waiter->try_acquire(AcquireRequest{"own", kWaiterId, 30s, false, 2000ms}, ec).acquired)
      << ec.message() << " " << ec.detail();

  bool truncated = true;
  const std::vector<detail::ListedLock> all = waiter->list_held("", 100, truncated, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  for (const std::string name : {"job", "own"}) {
    const LockInfo info = waiter->status(name, ec);
    ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
    EXPECT_TRUE(info.held) << name << ": a holder granted by a quorum was shown free";
    EXPECT_EQ(info.holder.value_or(""), kWaiterId) << name;
    EXPECT_GT(info.ttl_remaining.value_or(0ms), 0ms) << name;
    const detail::ListedLock* l = listed_entry(all, name);
    ASSERT_NE(l, nullptr) << name << ": a holder granted by a quorum was not listed";
    EXPECT_EQ(l->info.holder.value_or(""), kWaiterId) << name;
  }
}

// A marker without expiry (PTTL -1: none the scripts write, which always set PX) holds nothing
// back: the acquisition reads a marker by its PTTL > 0, so a holder is granted beside it on every
// master. Status and list read it the same way and show that holder.
TEST(RedlockStatusBesideMarker, AHolderBesideAMarkerWithoutExpiryIsHeld) {
  Masters m(3);
  const std::string stale = "5000\n" + std::string(kLostHolderId) + "\n00000000000000e1";
  for (std::size_t i = 0; i < 3; ++i)
    ASSERT_EQ(m[i].command({"SET", redlock_marker_key("job"), stale})->type, REDIS_REPLY_STATUS)
        << "master " << i;
  auto b = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(b);
  Error ec;
  ASSERT_TRUE(b->try_acquire(AcquireRequest{"job", kWaiterId, 30s, false, 0ms}, ec).acquired)
      << "a marker without expiry held the name back: " << ec.message() << " " << ec.detail();
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(m[i].command({"PTTL", redlock_marker_key("job")})->integer, -1) << "master " << i;
    ASSERT_EQ(owner_of_value(m.get(i, redlock_lock_key("job"))), kWaiterId) << "master " << i;
  }
  const LockInfo info = b->status("job", ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  EXPECT_TRUE(info.held) << "a holder granted on every master beside a marker without expiry was shown free";
  EXPECT_EQ(info.holder.value_or(""), kWaiterId);
  bool truncated = true;
  const std::vector<detail::ListedLock> all = b->list_held("", 100, truncated, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  const detail::ListedLock* l = listed_entry(all, "job");
  ASSERT_NE(l, nullptr) << "a holder granted on every master beside a marker without expiry was not listed";
  EXPECT_EQ(l->info.holder.value_or(""), kWaiterId);
}

}  // namespace

}  // namespace distlock::testing
