// Engine tests against the in-process memory backend and a manual clock: renewal,
// local deadline, loss signal, reentrancy, waiting and deadlines, refused renewals.
#include "engine/engine.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "fake/memory_backend.hpp"
#include "support/manual_clock.hpp"
#include "support/memory_fixture.hpp"
#include "support/thrown.hpp"

using namespace std::chrono_literals;
using distlock::detail::MemoryStore;

namespace distlock::testing {
namespace {

using Fixture = distlock::testing::ManualMemoryTest;

using Engine = Fixture;

TEST_F(Engine, AcquireReleaseAndTokensIncrease) {
  auto c = client();
  std::uint64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    distlock::Lease lease = c.acquire("a", ttl(3s));
    ASSERT_TRUE(lease.owns());
    EXPECT_GT(lease.token(), last);
    last = lease.token();
    EXPECT_TRUE(store->held("a", clock->now()));
  }
  EXPECT_FALSE(store->held("a", clock->now()));
  EXPECT_EQ(c.stats().acquired, 5u);
  EXPECT_EQ(c.stats().released, 5u);
}

TEST_F(Engine, TryAcquireBusyFromAnotherClient) {
  auto a = client();
  auto b = client();
  auto held = a.acquire("x", ttl(3s));
  EXPECT_FALSE(b.try_acquire("x", ttl(3s)).has_value());
  std::error_code ec;
  auto opts = ttl(3s);
  opts.wait = 0ms;
  auto lease = b.acquire("x", opts, ec);
  EXPECT_EQ(ec, errc::busy);
  EXPECT_FALSE(lease.owns());
  held.release();
  EXPECT_TRUE(b.try_acquire("x", ttl(3s)).has_value());
}

TEST_F(Engine, ReentrantPerThreadWithHoldCount) {
  auto c = client();
  distlock::Mutex m = c.mutex("r", ttl(3s));
  m.lock();
  m.lock();
  EXPECT_EQ(m.hold_count(), 2);
  EXPECT_EQ(store->try_acquire_calls(), 1) << "reentry must not go to the server";
  const auto token = m.token();

  std::atomic<bool> other_got{false};
  std::thread other([&] { other_got = m.try_lock(); });
  other.join();
  EXPECT_FALSE(other_got) << "another thread of the same client is another owner";

  m.unlock();
  EXPECT_EQ(m.hold_count(), 1);
  EXPECT_TRUE(store->held("r", clock->now())) << "still held after one of two unlocks";
  EXPECT_EQ(m.token(), token);
  m.unlock();
  EXPECT_EQ(m.hold_count(), 0);
  EXPECT_FALSE(store->held("r", clock->now()));
}

TEST_F(Engine, UnlockByNonOwnerIsNotOwnerError) {
  auto c = client();
  distlock::Mutex m = c.mutex("n", ttl(3s));
  EXPECT_THROW(
      {
        try {
          m.unlock();
        } catch (const std::system_error& e) {
          EXPECT_EQ(e.code(), errc::not_owner);
          throw;
        }
      },
      std::system_error);
  m.lock();
  std::error_code ec;
  std::thread([&] { m.unlock(ec); }).join();
  EXPECT_EQ(ec, errc::not_owner);
  EXPECT_TRUE(store->held("n", clock->now())) << "a non-owner's unlock must not release";
  m.unlock();
}

TEST_F(Engine, StandardLockableAdapters) {
  auto c = client();
  distlock::Mutex a = c.mutex("std-a", ttl(3s));
  distlock::Mutex b = c.mutex("std-b", ttl(3s));
  {
    std::scoped_lock both(a, b);
    EXPECT_TRUE(a.owns());
    EXPECT_TRUE(b.owns());
  }
  EXPECT_FALSE(store->held("std-a", clock->now()));
  {
    std::unique_lock lk(a, std::try_to_lock);
    EXPECT_TRUE(lk.owns_lock());
  }
  {
    std::unique_lock lk(a, std::defer_lock);
    EXPECT_TRUE(lk.try_lock_for(10ms));
  }
}

TEST_F(Engine, RenewalExtendsTheLocalDeadline) {
  auto c = client();
  auto lease = c.acquire("renew", ttl(3s));  // margin 300 ms, interval 1 s
  clock->advance(999ms);
  EXPECT_EQ(distlock::detail::engine_of(c)->tick(), 1u) << "due within a quarter interval";
  EXPECT_EQ(store->renew_calls(), 1);
  clock->advance(2500ms);  // 3.5 s after acquire, 2.5 s after renewal
  EXPECT_TRUE(lease.owns()) << "renewal moved the deadline to renewal + ttl - margin";
  clock->advance(300ms);  // 2.8 s after renewal: past 3 s - 300 ms
  EXPECT_FALSE(lease.owns());
}

TEST_F(Engine, DeadlinePassedFiresStopTokenAndCallbackBeforeRenewing) {
  auto c = client();
  auto lease = c.acquire("dl", ttl(1s));
  std::atomic<int> callbacks{0};
  lease.on_lost([&] { ++callbacks; });
  std::stop_token st = lease.stop_token();
  clock->advance(950ms);  // a paused process: no renewal happened
  EXPECT_FALSE(lease.owns());
  distlock::detail::engine_of(c)->tick();
  EXPECT_TRUE(st.stop_requested());
  distlock::detail::engine_of(c)->drain_events();  // callbacks run on the event thread
  EXPECT_EQ(callbacks.load(), 1);
  EXPECT_EQ(store->renew_calls(), 0) << "a lease past its deadline is declared lost, not renewed";
  std::error_code ec;
  lease.release(ec);
  EXPECT_EQ(ec, errc::lost);
  // The loss was handed back to the server once (Backend::forget: an owner-checked
  // release), and the holder's own release after it sends nothing more.
  EXPECT_EQ(store->release_calls(), 1) << "a lost lease is handed back exactly once";
  EXPECT_EQ(c.stats().lost, 1u);
  // A callback added after the loss is queued at once.
  bool late = false;
  distlock::Lease lost_one = c.acquire("dl2", ttl(1s));
  clock->advance(950ms);
  distlock::detail::engine_of(c)->tick();
  lost_one.on_lost([&] { late = true; });
  distlock::detail::engine_of(c)->drain_events();
  EXPECT_TRUE(late);
}

TEST_F(Engine, RenewalFindingAnotherOwnerLosesAtOnceAndCountsBrainSplit) {
  auto c = client();
  auto lease = c.acquire("steal", ttl(3s));
  store->steal("steal", "intruder:1");
  clock->advance(1s);
  distlock::detail::engine_of(c)->tick();
  EXPECT_TRUE(lease.stop_token().stop_requested());
  EXPECT_FALSE(lease.owns());
  EXPECT_EQ(c.stats().brain_splits, 1u);
  std::error_code ec;
  lease.release(ec);
  EXPECT_EQ(ec, errc::lost);
  EXPECT_EQ(store->holder("steal"), "intruder:1") << "the other owner's lock is untouched";
}

TEST_F(Engine, FailedRenewalsRetryUntilTheDeadline) {
  auto c = client();
  auto lease = c.acquire("flaky", ttl(3s));
  store->fail_next(1);
  clock->advance(1s);
  distlock::detail::engine_of(c)->tick();  // fails
  EXPECT_TRUE(lease.owns());
  clock->advance(260ms);
  distlock::detail::engine_of(c)->tick();  // retried after interval/4 and succeeds
  EXPECT_EQ(store->renew_calls(), 2);
  clock->advance(2500ms);
  EXPECT_TRUE(lease.owns());
  store->fail_next(1000);
  for (int i = 0; i < 40 && lease.owns(); ++i) {
    clock->advance(100ms);
    distlock::detail::engine_of(c)->tick();
  }
  EXPECT_FALSE(lease.owns());
  EXPECT_TRUE(lease.stop_token().stop_requested());
  store->fail_next(0);
}

TEST_F(Engine, OneBatchRenewsManyLeases) {
  auto c = client();
  std::vector<distlock::Lease> leases;
  for (int i = 0; i < 1000; ++i) leases.push_back(c.acquire("k" + std::to_string(i), ttl(3s)));
  clock->advance(1s);
  EXPECT_EQ(distlock::detail::engine_of(c)->tick(), 1000u);
  EXPECT_EQ(store->renew_calls(), 1);
  EXPECT_EQ(store->last_renew_batch(), 1000u);
  EXPECT_EQ(c.renew_now(), 1000u);
  EXPECT_EQ(store->renew_calls(), 2);
}

TEST_F(Engine, SessionLossLosesEveryLease) {
  auto c = client();
  auto a = c.acquire("s1", ttl(3s));
  auto b = c.acquire("s2", ttl(3s));
  distlock::detail::engine_of(c)->on_session_lost();
  EXPECT_TRUE(a.stop_token().stop_requested());
  EXPECT_TRUE(b.stop_token().stop_requested());
  EXPECT_FALSE(a.owns());
}

TEST_F(Engine, InvalidArgumentsAreRejectedWithReasons) {
  auto c = client();
  auto expect_invalid = [&](const std::string& name, distlock::LockOptions o, const std::string& needle) {
    {
      std::string what;
      EXPECT_EQ(distlock::testing::code_of([&] { c.acquire(name, o); }, &what), errc::invalid_argument)
          << "accepted " << needle;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  };
  expect_invalid("", ttl(3s), "empty");
  expect_invalid(std::string("a\0b", 3), ttl(3s), "NUL");
  expect_invalid(std::string(4097, 'x'), ttl(3s), "4096");
  expect_invalid("ok", ttl(0ms), "minimum");
  expect_invalid("ok", ttl(-5ms), "minimum");
  auto o = ttl(3s);
  o.safety_margin = 1500ms;
  expect_invalid("ok", o, "safety_margin");
  o = ttl(3s);
  o.renew_interval = 2s;
  expect_invalid("ok", o, "renew_interval");
  // Odd but valid names work.
  for (std::string name : {std::string("a b"), std::string("line\r\nbreak"), std::string(4096, 'y')}) {
    auto lease = c.acquire(name, ttl(3s));
    EXPECT_TRUE(lease.owns());
  }
}

TEST_F(Engine, ReleaseFailureIsCountedNeverThrownFromDestructor) {
  auto c = client();
  {
    auto lease = c.acquire("rf", ttl(3s));
    store->fail_next(1);
  }  // destructor: release fails, must not throw
  EXPECT_EQ(c.stats().release_failures, 1u);
}

// ---- waiting (real time, short) ---------------------------------------------------

using RealTime = distlock::testing::RealTimeMemoryTest;

TEST_F(RealTime, WaiterWakesOnReleaseNotOnExpiry) {
  auto a = client();
  auto b = client();
  distlock::LockOptions o;
  o.ttl = 30s;  // the fallback re-check would take ~30 s
  auto held = a.acquire("w", o);
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    auto lease = b.acquire("w", o);
    got = lease.owns();
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(got);
  const auto released = std::chrono::steady_clock::now();
  held.release();
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_LT(std::chrono::steady_clock::now() - released, 5s) << "woken by the release notification";
  // The subscription outlives its last waiter for a while (re-subscribing would cost
  // round trips on the next hand-off), and is dropped by the sweep.
  EXPECT_EQ(distlock::detail::engine_of(b)->idle_watches(), 1u);
  distlock::detail::engine_of(b)->sweep_idle_watches(true);
  EXPECT_EQ(distlock::detail::engine_of(b)->idle_watches(), 0u);
}

TEST_F(RealTime, TryLockForHonoursItsDeadline) {
  auto a = client();
  auto b = client();
  distlock::LockOptions o;
  o.ttl = 30s;
  auto held = a.acquire("d", o);
  distlock::Mutex m = b.mutex("d", o);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(m.try_lock_for(150ms));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 150ms);
  EXPECT_LT(took, 2s);
  std::error_code ec;
  o.wait = 50ms;
  b.acquire("d", o, ec);
  EXPECT_EQ(ec, errc::timeout);
}

TEST_F(RealTime, BackgroundRenewerKeepsShortLeasesAlive) {
  auto a = client();
  distlock::LockOptions o;
  o.ttl = 300ms;
  auto lease = a.acquire("bg", o);
  std::this_thread::sleep_for(1s);
  EXPECT_TRUE(lease.owns());
  EXPECT_GE(a.stats().renewed_leases, 2u);
  EXPECT_TRUE(store->held("bg", distlock::system_steady_clock()->now()));
}

TEST_F(RealTime, StopSignalIsOnTimeWhileARenewalHangs) {
  auto a = client();
  distlock::LockOptions o;
  o.ttl = 300ms;  // margin 30 ms, renewal every 100 ms
  auto lease = a.acquire("hung", o);
  const auto acquired = std::chrono::steady_clock::now();
  store->set_renew_delay(3s);  // the first renewal (at ~100 ms) blocks until ~3.1 s
  std::stop_token st = lease.stop_token();
  while (!st.stop_requested() && std::chrono::steady_clock::now() - acquired < 2500ms) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_TRUE(st.stop_requested())
      << "the watchdog must fire at the local deadline, not after the hung renewal";
  EXPECT_FALSE(lease.owns());
  store->set_renew_delay(0ms);
}

TEST_F(RealTime, ManyThreadsNeverOverlap) {
  auto a = client();
  auto b = client();
  distlock::LockOptions o;
  o.ttl = 5s;
  std::atomic<int> inside{0};
  std::atomic<int> violations{0};
  long counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      distlock::Client& c = (t % 2) ? a : b;
      distlock::Mutex m = c.mutex("hammer", o);
      for (int i = 0; i < 100; ++i) {
        std::lock_guard lk(m);
        if (inside.fetch_add(1) != 0) ++violations;
        ++counter;
        inside.fetch_sub(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(counter, 800);
}

}  // namespace

}  // namespace distlock::testing
