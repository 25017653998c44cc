// Redlock against real redis-server masters: key layout, fan-out, renewal,
// notifications, release safety, credentials and bad input.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "distlock/distlock.hpp"
#include "masters.hpp"
#include "redlock/scripts.hpp"
#include "support/client_options.hpp"
#include "support/manual_clock.hpp"

namespace distlock {
namespace {

using namespace std::chrono_literals;
using testing::Masters;
using Clock = std::chrono::steady_clock;

const std::string kKeyPrefix = "distlock:redlock:lock:";

TEST(Redlock, ScriptDigestsMatchWhatTheServerComputes) {
  Masters m(1, {});
  for (const auto* s :
       {&detail::redlock::kAcquireScript, &detail::redlock::kReleaseScript, &detail::redlock::kRenewScript,
        &detail::redlock::kStatusScript, &detail::redlock::kPutIfAbsentScript,
        &detail::redlock::kRevokeScript, &detail::redlock::kFencedPutScript}) {
    auto r = m[0].command({"SCRIPT", "LOAD", std::string(s->body)});
    ASSERT_EQ(r->type, REDIS_REPLY_STRING) << r->str;
    EXPECT_EQ(std::string(r->str, r->len), s->sha1);
  }
}

TEST(Redlock, AcquireSetsTheKeyOnEveryMasterAndReleaseRemovesIt) {
  Masters m(3);
  auto client = connect(m.url());
  EXPECT_FALSE(client.has_fencing());
  EXPECT_EQ(client.scheme(), "redlock");
  LockOptions opts;
  opts.ttl = 10s;
  {
    Lease lease = client.acquire("orders/42", opts);
    EXPECT_TRUE(lease.owns());
    EXPECT_FALSE(lease.has_token());
    try {
      (void)lease.token();
      ADD_FAILURE() << "token() must throw without fencing";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), errc::not_supported);
    }
    // Validity = ttl - drift: the local deadline is below ttl - margin.
    EXPECT_LE(lease.remaining(), 10s - 102ms - 1s);
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::string holder = m.get(i, kKeyPrefix + "orders/42");
      EXPECT_EQ(holder.rfind(client.id() + ":", 0), 0u) << "master " << i << " holds " << holder;
      auto pttl = m[i].command({"PTTL", kKeyPrefix + "orders/42"});
      EXPECT_GT(pttl->integer, 8000);
      EXPECT_LE(pttl->integer, 10000);
    }
    LockInfo info = client.status("orders/42");
    EXPECT_TRUE(info.held);
    EXPECT_EQ(info.holder->rfind(client.id() + ":", 0), 0u);
    EXPECT_FALSE(info.token.has_value());
  }
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_TRUE(m.keys(i).empty()) << "master " << i;
  EXPECT_FALSE(client.status("orders/42").held);
  EXPECT_EQ(client.stats().released, 1u);
}

TEST(Redlock, PrefixFromTheUrlNamesEveryKey) {
  Masters m(3);
  auto client = connect(m.url("prefix=app:"));
  auto lease = client.acquire("x");
  for (std::size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m.keys(i), std::vector<std::string>{"app:lock:x"});
  }
}

TEST(Redlock, RenewalKeepsTheLockPastItsTtlOnAQuorum) {
  Masters m(3);
  auto client = connect(m.url());
  auto other = connect(m.url());
  LockOptions opts;
  opts.ttl = 1s;  // per-node timeout 100 ms: room for a loaded test machine
  auto lease = client.acquire("renewed", opts);
  std::this_thread::sleep_for(3500ms);  // three and a half TTLs
  EXPECT_TRUE(lease.owns());
  EXPECT_FALSE(lease.stop_token().stop_requested());
  EXPECT_FALSE(other.try_acquire("renewed", opts).has_value());
  EXPECT_GE(client.stats().renewed_leases, 3u);
  EXPECT_EQ(client.stats().lost, 0u);
}

TEST(Redlock, ManyLeasesAreRenewedInOneFanOutPerTick) {
  Masters m(3);
  auto client = connect(m.url());
  LockOptions opts;
  opts.ttl = 10s;
  std::vector<Lease> leases;
  for (int i = 0; i < 1200; ++i) leases.push_back(client.acquire("many/" + std::to_string(i), opts));
  const auto before = client.stats().renew_round_trips;
  EXPECT_EQ(client.renew_now(), 1200u);  // 3 chunks of <= 512 keys, pipelined: one fan-out
  EXPECT_EQ(client.stats().renew_round_trips, before + 1);
  for (auto& l : leases) EXPECT_TRUE(l.owns());
  auto pttl = m[2].command({"PTTL", kKeyPrefix + "many/1199"});
  EXPECT_GT(pttl->integer, 9000);
}

TEST(Redlock, WaiterIsWokenByTheReleaseNotification) {
  Masters m(3);
  auto holder = connect(m.url());
  auto waiter = connect(m.url());
  LockOptions opts;
  opts.ttl = 30s;  // the fallback re-check would come only after seconds
  auto lease = holder.acquire("queue", opts);
  auto got = std::async(std::launch::async, [&] {
    LockOptions w = opts;
    w.wait = 20s;
    auto l = waiter.acquire("queue", w);
    return Clock::now();
  });
  std::this_thread::sleep_for(300ms);  // the waiter is subscribed and sleeping
  const auto released = Clock::now();
  lease.release();
  ASSERT_EQ(got.wait_for(10s), std::future_status::ready);
  EXPECT_LT(got.get() - released, 1s);
}

TEST(Redlock, ReentrantMutexTakesTheServersOnce) {
  Masters m(3);
  auto client = connect(m.url());
  auto mutex = client.mutex("re");
  std::scoped_lock outer(mutex);
  {
    std::unique_lock inner(mutex);
    EXPECT_EQ(mutex.hold_count(), 2);
  }
  EXPECT_EQ(mutex.hold_count(), 1);
  EXPECT_EQ(client.stats().acquired, 1u);
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m.keys(i).size(), 1u);
}

TEST(Redlock, ExpiredLeaseReleaseReportsLostAndLeavesTheNewOwnersKeys) {
  Masters m(3);
  ClientOptions no_renewal;
  no_renewal.background_renewal = false;
  auto stale = connect(m.url(), no_renewal);
  auto fresh = connect(m.url());
  LockOptions opts;
  opts.ttl = 200ms;
  auto old_lease = stale.acquire("handover", opts);
  std::this_thread::sleep_for(350ms);
  auto new_lease = fresh.acquire("handover", opts);
  std::error_code ec;
  old_lease.release(ec);
  EXPECT_EQ(ec, errc::lost);
  for (std::size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m.get(i, kKeyPrefix + "handover").rfind(fresh.id() + ":", 0), 0u) << "master " << i;
  }
}

TEST(Redlock, RenewalThatFindsAnotherOwnerOnAQuorumSignalsLoss) {
  Masters m(3);
  auto client = connect(m.url());
  auto lease = client.acquire("stolen", testing::ttl_of(2s));
  for (std::size_t i = 0; i < 2; ++i) m[i].command({"SET", kKeyPrefix + "stolen", "intruder", "PX", "60000"});
  client.renew_now();
  EXPECT_TRUE(lease.stop_token().stop_requested());
  EXPECT_FALSE(lease.owns());
  std::error_code ec;
  lease.release(ec);
  EXPECT_EQ(ec, errc::lost);
  EXPECT_EQ(m.get(0, kKeyPrefix + "stolen"), "intruder");
  EXPECT_EQ(m.get(1, kKeyPrefix + "stolen"), "intruder");
}

TEST(Redlock, ScriptCacheFlushIsRecoveredByEval) {
  Masters m(3);
  auto client = connect(m.url());
  { auto l = client.acquire("flush"); }
  for (std::size_t i = 0; i < m.size(); ++i) m[i].command({"SCRIPT", "FLUSH"});
  auto lease = client.acquire("flush");
  EXPECT_TRUE(lease.owns());
  lease.release();
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_TRUE(m.keys(i).empty());
}

TEST(Redlock, LeftoverKeyOfAnEarlierAcquisitionIsNeverRetaken) {
  Masters m(3);
  auto client = connect(m.url());
  std::string me;
  {
    auto lease = client.acquire("mine");
    me = *client.status("mine").holder;
  }
  // As if an earlier lease of this very thread had been lost locally while its keys
  // lived on: every acquisition is a new owner, so the leftover is somebody else's
  // until it expires; re-taking it would let the old lease's late release delete
  // the new one's keys.
  for (std::size_t i = 0; i < m.size(); ++i) m[i].command({"SET", kKeyPrefix + "mine", me, "PX", "1500"});
  LockOptions opts;
  opts.ttl = 60s;
  EXPECT_FALSE(client.try_acquire("mine", opts).has_value());
  opts.wait = 10s;
  auto lease = client.acquire("mine", opts);  // after the leftover expired
  EXPECT_TRUE(lease.owns());
  const std::string now = *client.status("mine").holder;
  EXPECT_NE(now, me);
  // A quorum took the new key (a master slower than the per-master timeout, as under
  // load, may have none); no master still has the leftover's owner.
  std::size_t fresh = 0;
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m[i].command({"PTTL", kKeyPrefix + "mine"})->integer > 50000) ++fresh;
    EXPECT_NE(m.get(i, kKeyPrefix + "mine"), me) << "master " << i;
  }
  EXPECT_GE(fresh, m.size() / 2 + 1);
}

TEST(Redlock, OddNamesAreBinarySafe) {
  Masters m(3);
  auto client = connect(m.url());
  for (const std::string& name : {std::string("with space"), std::string("crlf\r\nSET x y"),
                                  std::string("bin\x01\xff", 5), std::string(4096, 'n')}) {
    auto lease = client.acquire(name);
    EXPECT_TRUE(lease.owns());
    EXPECT_EQ(m.get(1, kKeyPrefix + name).rfind(client.id(), 0), 0u);
  }
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_TRUE(m.keys(i).empty());
}

TEST(Redlock, BadUrlsAreRejectedWithTheirReason) {
  Masters m(2);
  const std::string two =
      "redlock://127.0.0.1:" + std::to_string(m[0].port()) + ",127.0.0.1:" + std::to_string(m[1].port());
  try {
    connect(two);
    ADD_FAILURE() << "two masters accepted";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_url);
    EXPECT_NE(std::string(e.what()).find("at least 3"), std::string::npos) << e.what();
  }
  std::error_code ec;
  connect(two + ",127.0.0.1:" + std::to_string(m[0].port()), {}, ec);
  EXPECT_EQ(ec, errc::invalid_url);
}

TEST(Redlock, PasswordAndAclUserAreUsedAndAWrongOneIsAuthFailed) {
  testing::RedisServerOptions o;
  o.password = "pw-default";
  o.acl_user = "alice";
  o.acl_password = "pw-alice";
  Masters m(3, o);
  {
    auto client = connect(m.url({}, ":pw-default"));
    auto lease = client.acquire("auth");
    EXPECT_TRUE(lease.owns());
    auto waiter = connect(m.url({}, "alice:pw-alice"));  // the subscriber authenticates too
    auto got = std::async(std::launch::async, [&] {
      LockOptions w;
      w.wait = 20s;
      return waiter.acquire("auth", w).owns();
    });
    std::this_thread::sleep_for(200ms);
    lease.release();
    ASSERT_EQ(got.wait_for(5s), std::future_status::ready);
    EXPECT_TRUE(got.get());
  }
  std::error_code ec;
  connect(m.url({}, ":wrong"), {}, ec);
  EXPECT_EQ(ec, errc::auth_failed);
  connect(m.url(), {}, ec);  // no password at all
  EXPECT_EQ(ec, errc::auth_failed);
  try {
    connect(m.url({}, "alice:bad-secret-77"));
    ADD_FAILURE() << "wrong password accepted";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::auth_failed);
    EXPECT_NE(std::string(e.what()).find("rejected the credentials"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("bad-secret-77"), std::string::npos)
        << "password leaked: " << e.what();
  }
}

// A clock that, once given a step, reads `step` later at every read: an acquisition
// round across the masters then takes longer than the TTL by this clock alone.
class SteppingClock final : public testing::TickClock {
 public:
  time_point now() const override {
    return time_point(duration(ticks_.fetch_add(step_.load()) + step_.load()));
  }
  void set_step(duration d) { step_.store(d.count()); }

 private:
  std::atomic<duration::rep> step_{0};
};

// Redlock's validity check (ttl - elapsed - drift > 0) reads the injected clock: a
// round that took longer than the TTL by that clock is no acquisition, and the keys
// it set on the masters are removed. Failed first: elapsed was read on
// std::chrono::steady_clock (a few ms), so the lock was granted.
TEST(Redlock, TheValidityCheckMeasuresTheRoundOnTheInjectedClock) {
  Masters m(3);
  auto clock = std::make_shared<SteppingClock>();
  ClientOptions o;
  o.clock = clock;
  o.background_renewal = false;
  o.logger = [](LogLevel, std::string_view) {};
  auto client = connect(m.url(), o);
  LockOptions opts;
  opts.ttl = 10s;
  clock->set_step(11s);  // between the round's start and its end: more than the TTL
  std::optional<Lease> slow = client.try_acquire("slow-round", opts);
  clock->set_step(0s);
  EXPECT_FALSE(slow.has_value()) << "a round longer than the TTL (by the client's clock) was taken as held";
  for (std::size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m.get(i, kKeyPrefix + "slow-round"), "(nil)")
        << "master " << i << " kept the too-slow round's key";
  }
  std::optional<Lease> quick = client.try_acquire("slow-round", opts);
  ASSERT_TRUE(quick.has_value()) << "the same round on a still clock is an acquisition";
  EXPECT_TRUE(quick->owns());
}

}  // namespace
}  // namespace distlock
