// The clean-up of a failed Redlock attempt never deletes the key a later attempt of the same
// acquire() call took (the engine sends every attempt of one call with the same owner id).
//
// The sequence, on 3 masters (quorum 2) behind fault proxies: attempt A finds masters 1 and 2
// held by others and gets no answer from master 0, whose connection the proxy holds back; A
// fails and queues its clean-up release behind its unanswered request on that connection, which
// the client then closes. Master 2's holder goes; attempt B, same owner, takes master 0 on a new
// connection and master 2: granted by exactly a quorum including master 0. Then master 0 runs
// A's held request and clean-up (a master that wakes with an old connection still to read).
// The clean-up must leave B's key there; else, once master 1's holder goes too, a third client
// would be granted the lock while B's lease is valid: two holders.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

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

constexpr std::string_view kOwner = "0123456789abcdef0123456789abcdef:1";
constexpr std::string_view kThirdOwner = "fedcba9876543210fedcba9876543210:1";

// The owner a lock key's value names: the part before the attempt's nonce, if any.
std::string owner_part(const std::string& value) {
  const auto nl = value.find('\n');
  return nl == std::string::npos ? value : value.substr(0, nl);
}

class RedlockAttemptCleanup : public ::testing::TestWithParam<std::chrono::milliseconds> {};

TEST_P(RedlockAttemptCleanup, AFailedAttemptsLateCleanUpLeavesTheNextAttemptsKey) {
  const std::chrono::milliseconds lock_delay = GetParam();
  const std::string key = detail::redlock::lock_key(detail::redlock::Config{}, "job");
  const AcquireRequest req{"job", kOwner, 10s, false, lock_delay};

  // The client's connection to every master is open (a first lease, released); others hold
  // masters 1 and 2; master 0's open connection is held back.
  HeldMaster0 s;
  ASSERT_NO_FATAL_FAILURE(s.set_up(kOwner, key, lock_delay));
  auto& m = s.m;
  auto& p0 = s.p0;
  auto& client = s.client;
  auto& third = s.third;
  const int accepted_before = p0.accepted();
  Error ec;

  // Attempt A: busy on 1 and 2, no answer from 0: not granted; its clean-up for master 0 is
  // queued behind its request there.
  const auto a = client->try_acquire(req, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  ASSERT_FALSE(a.acquired);

  // Master 2's holder goes; attempt B (same owner) takes 0, on a new connection, and 2.
  ASSERT_EQ(m[2].command({"DEL", key})->integer, 1);
  const auto b_sent = std::chrono::steady_clock::now();
  const auto b = client->try_acquire(req, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.detail();
  ASSERT_TRUE(b.acquired);
  EXPECT_GT(p0.accepted(), accepted_before) << "attempt B reached master 0 on a new connection";
  ASSERT_EQ(owner_part(m.get(0, key)), kOwner);
  ASSERT_EQ(owner_part(m.get(2, key)), kOwner);
  ASSERT_EQ(m.get(1, key), "other-holder-x");

  // Master 0 now reads A's held request and its clean-up (an EVAL: wait until it ran).
  const long long evals = m[0].command_calls("eval");
  p0.release_held();
  ASSERT_TRUE(eventually([&] { return m[0].command_calls("eval") > evals; }, 10s))
      << "master 0 never ran attempt A's held clean-up";

  // B's key is still on master 0 ...
  EXPECT_EQ(owner_part(m.get(0, key)), kOwner) << "attempt A's clean-up deleted attempt B's key";
  // ... so once master 1's holder goes, a third client is not granted while B's lease lives.
  ASSERT_EQ(m[1].command({"DEL", key})->integer, 1);
  const AcquireRequest other{"job", kThirdOwner, 10s, false, lock_delay};
  const auto c = third->try_acquire(other, ec);
  const auto b_age =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - b_sent);
  ASSERT_LT(b_age, b.validity) << "B's lease ran out before the check; the check proves nothing";
  EXPECT_FALSE(c.acquired) << "a third client was granted the lock while attempt B's lease ("
                           << b.validity.count() << " ms from " << b_age.count() << " ms ago) was valid";

  EXPECT_EQ(client->release("job", kOwner, 0, ec), ReleaseStatus::released)
      << ec.message() << " " << ec.detail();
}

// The acquire script (the slow path's, and every attempt's with a lock_delay) on one master:
// a key of this owner is taken over from an earlier attempt's nonce, or an older version's
// value without one, never from a later attempt's: an earlier attempt that arrives late (its
// script pending on an old connection) must not overwrite the later attempt's key, which its
// clean-up would then delete.
TEST(RedlockAttemptNonce, TheAcquireScriptNeverTakesOverALaterAttemptsKey) {
  RedisServer master;
  const std::string key = "distlock:redlock:lock:n", marker = "distlock:redlock:delay:n";
  const std::string owner(kOwner);
  auto acquire = [&](const std::string& nonce) {
    auto r = master.command({"EVAL", std::string(detail::redlock::kAcquireScript.body), "2", key, marker,
                             owner, "10000", "0", nonce});
    EXPECT_EQ(r->type, REDIS_REPLY_ARRAY);
    return r->type == REDIS_REPLY_ARRAY && r->elements == 2 ? r->element[0]->integer : -1;
  };
  auto value = [&] {
    auto r = master.command({"GET", key});
    return r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : std::string("(nil)");
  };
  ASSERT_EQ(master.command({"SET", key, owner + "\n0000000000000005", "PX", "60000"})->type,
            REDIS_REPLY_STATUS);
  EXPECT_EQ(acquire("0000000000000004"), 0) << "an earlier attempt took over a later one's key";
  EXPECT_EQ(value(), owner + "\n0000000000000005");
  EXPECT_EQ(acquire("0000000000000007"), 1);
  EXPECT_EQ(value(), owner + "\n0000000000000007");
  EXPECT_EQ(acquire("0000000000000007"), 1);  // its own key again (a retried round)
  ASSERT_EQ(master.command({"SET", key, owner, "PX", "60000"})->type, REDIS_REPLY_STATUS);
  EXPECT_EQ(acquire("0000000000000001"), 1) << "an older version's value of this owner";
  EXPECT_EQ(value(), owner + "\n0000000000000001");
  ASSERT_EQ(
      master.command({"SET", key, std::string(kThirdOwner) + "\n0000000000000000", "PX", "60000"})->type,
      REDIS_REPLY_STATUS);
  EXPECT_EQ(acquire("00000000000000ff"), 0) << "another owner's key";
}

INSTANTIATE_TEST_SUITE_P(LockDelay, RedlockAttemptCleanup, ::testing::Values(0ms, 2000ms), lock_delay_name);

}  // namespace

}  // namespace distlock::testing
