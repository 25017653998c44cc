// Engine: acquiring one of several names (Engine::acquire_any) and waiting for a name
// to be free (Engine::wait_free), on the memory backend with a manual clock. Waiting
// is by notification: with the clock standing still nobody re-checks on a timer, so
// the number of try_acquire calls shows that nothing polls.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "engine/url.hpp"
#include "fake/memory_backend.hpp"
#include "support/eventually.hpp"
#include "support/forwarding_backend.hpp"
#include "support/memory_fixture.hpp"

using namespace std::chrono_literals;

namespace distlock::testing {
namespace {

using EngineMulti = ManualMemoryTest;

const std::vector<std::string> kNames{"m/0", "m/1", "m/2"};

/// A lease of every name of kNames, taken by `c` with TTL `t`.
std::vector<distlock::Lease> hold_all(distlock::Client& c, Millis t) {
  std::vector<distlock::Lease> held;
  for (const auto& n : kNames) held.push_back(c.acquire(n, ttl(t)));
  return held;
}

/// `acquire_any(kNames, ttl(t), wait)` by `c`'s engine on a thread of its own: the lock it got
/// (or none), the error, the index of the name, and `done` once the call returned. The test
/// joins it (a std::thread left joinable ends the process, as a stuck waiter should).
struct AnyWaiter {
  AnyWaiter(distlock::Client& c, Millis t, std::optional<Millis> wait)
      : thread([this, &c, t, wait] {
          got = distlock::detail::engine_of(c)->acquire_any(kNames, ttl(t), wait, ec, {}, &index);
          done = true;
        }) {}
  void join() { thread.join(); }

  distlock::detail::Error ec;
  std::shared_ptr<distlock::detail::HeldLock> got;
  std::size_t index = 99;
  std::atomic<bool> done{false};
  std::thread thread;  // last: started once the members it writes are made
};

/// Client `a` holds every name of kNames (TTL `held_ttl`); client `b` waits for any of them
/// (an AnyWaiter with TTL 30 s and `wait`).
struct HeldAndAwaited {
  HeldAndAwaited(EngineMulti& t, Millis held_ttl, std::optional<Millis> wait)
      : a(t.client()), b(t.client()), held(hold_all(a, held_ttl)), waiter(b, 30s, wait) {}

  distlock::Client a, b;
  std::vector<distlock::Lease> held;
  AnyWaiter waiter;
};

TEST_F(EngineMulti, TakesTheFirstFreeNameInOrder) {
  auto a = client();
  auto b = client();
  auto h0 = a.acquire("m/0", ttl(3s));
  auto h1 = a.acquire("m/1", ttl(3s));
  distlock::detail::Error ec;
  std::size_t index = 99;
  auto held = distlock::detail::engine_of(b)->acquire_any(kNames, ttl(3s), 0ms, ec, {}, &index);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(held);
  EXPECT_EQ(index, 2u);
  EXPECT_EQ(held->name, "m/2");
  EXPECT_EQ(store->holder("m/2"), held->owner);
  distlock::detail::engine_of(b)->release(held, ec);
  EXPECT_FALSE(ec);
}

TEST_F(EngineMulti, AllBusyWithoutWaitIsBusyAndLeavesNothingBehind) {
  auto a = client();
  auto b = client();
  std::vector<distlock::Lease> held = hold_all(a, 3s);
  const int tries = store->try_acquire_calls();
  distlock::detail::Error ec;
  auto got = distlock::detail::engine_of(b)->acquire_any(kNames, ttl(3s), 0ms, ec);
  EXPECT_EQ(ec, errc::busy);
  EXPECT_FALSE(got);
  EXPECT_EQ(store->try_acquire_calls() - tries, 3) << "one attempt per name";
  EXPECT_EQ(store->cancel_calls(), 0) << "no queued place was asked for";
  EXPECT_EQ(distlock::detail::engine_of(b)->idle_watches(), 0u);
  EXPECT_EQ(store->live_watches(), 0);
}

TEST_F(EngineMulti, WaiterIsWokenByTheReleaseOfAnyNameWithoutPolling) {
  auto a = client();
  auto b = client();
  std::vector<distlock::Lease> held = hold_all(a, 3s);
  const int base = store->try_acquire_calls();
  AnyWaiter waiter(b, 3s, std::nullopt);
  // One round (3 tries), the subscriptions, then one more round before sleeping.
  ASSERT_TRUE(eventually([&] { return store->try_acquire_calls() - base >= 6; }, 10s));
  ASSERT_TRUE(eventually([&] { return store->live_watches() == 3; }, 10s));
  // The clock stands still: a waiter that polled would keep calling try_acquire.
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(store->try_acquire_calls() - base, 6) << "the waiter polls";
  held[1].release();  // notifies
  waiter.join();
  ASSERT_FALSE(waiter.ec) << waiter.ec.message();
  ASSERT_TRUE(waiter.got);
  EXPECT_EQ(waiter.index, 1u);
  EXPECT_EQ(waiter.got->name, "m/1");
  EXPECT_EQ(store->try_acquire_calls() - base, 7) << "only the name that changed is tried again";
  EXPECT_EQ(store->cancel_calls(), 2) << "the queued places on the other names are given up";
  distlock::detail::engine_of(b)->release(waiter.got, waiter.ec);
}

TEST_F(EngineMulti, WaitRunsOutWithTimeoutAndCleansUp) {
  HeldAndAwaited setup(*this, 30s, 2s);
  ASSERT_TRUE(eventually([&] { return store->live_watches() == 3; }, 10s));
  advance_until(*clock, setup.waiter.done);
  setup.waiter.join();
  EXPECT_EQ(setup.waiter.ec, errc::timeout);
  EXPECT_FALSE(setup.waiter.got);
  EXPECT_EQ(store->cancel_calls(), 3) << "every queued place is given up";
  // The subscriptions stay (idle, bounded) for the next waiter; no waiter is left.
  EXPECT_EQ(distlock::detail::engine_of(setup.b)->idle_watches(), 3u);
  distlock::detail::engine_of(setup.b)->sweep_idle_watches(true);
  EXPECT_EQ(store->live_watches(), 0);
}

TEST_F(EngineMulti, ReCheckIsCappedByTheHoldersRemainingTtl) {
  HeldAndAwaited setup(*this, 1s, 60s);
  ASSERT_TRUE(eventually([&] { return store->live_watches() == 3; }, 10s));
  store->drop("m/2");  // gone without a notification (a lost message)
  const Millis advanced = advance_until(*clock, setup.waiter.done);
  setup.waiter.join();
  ASSERT_FALSE(setup.waiter.ec) << setup.waiter.ec.message();
  ASSERT_TRUE(setup.waiter.got);
  // The holders reported ~1 s left: the re-check comes within that plus jitter
  // (10 %), far before the 5 s cap of a lease whose TTL is unknown.
  EXPECT_LE(advanced, 2s);
  distlock::detail::engine_of(setup.b)->release(setup.waiter.got, setup.waiter.ec);
}

TEST_F(EngineMulti, ErrorMidRoundGivesUpEveryQueuedPlace) {
  auto a = client();
  auto b = client();
  auto h0 = a.acquire("m/0", ttl(3s));
  store->throw_next_acquires(1, /*after=*/1);  // the attempt on m/1 throws
  distlock::detail::Error ec;
  auto got = distlock::detail::engine_of(b)->acquire_any(kNames, ttl(3s), std::nullopt, ec);
  EXPECT_TRUE(ec);
  EXPECT_FALSE(got);
  EXPECT_EQ(store->cancel_calls(), 2);
  EXPECT_FALSE(store->held("m/2", clock->now())) << "names after the failure are not tried";
}

TEST_F(EngineMulti, GateHeldMeansNoNameIsTriedUntilItIsFree) {
  auto a = client();
  auto b = client();
  auto gate = a.acquire("g", ttl(3s));
  const int base = store->try_acquire_calls();
  distlock::detail::Error ec;
  std::shared_ptr<distlock::detail::HeldLock> got;
  std::thread waiter(
      [&] { got = distlock::detail::engine_of(b)->acquire_any(kNames, ttl(3s), std::nullopt, ec, "g"); });
  ASSERT_TRUE(eventually([&] { return store->live_watches() == 1; }, 10s));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(store->try_acquire_calls(), base) << "a name was tried while the gate was held";
  EXPECT_FALSE(store->held("m/0", clock->now()));
  gate.release();
  waiter.join();
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->name, "m/0");
  EXPECT_EQ(store->try_acquire_calls() - base, 1);
  EXPECT_EQ(store->cancel_calls(), 0) << "a gated acquisition keeps no queued place";
  distlock::detail::engine_of(b)->release(got, ec);
}

TEST_F(EngineMulti, GateGivesUpWhenTheWaitRunsOut) {
  auto a = client();
  auto b = client();
  auto gate = a.acquire("g", ttl(30s));
  distlock::detail::Error ec;
  auto got = distlock::detail::engine_of(b)->acquire_any(kNames, ttl(3s), 0ms, ec, "g");
  EXPECT_EQ(ec, errc::busy);
  EXPECT_FALSE(got);
}

TEST_F(EngineMulti, WaitFreeReturnsOnReleaseWithoutPolling) {
  auto a = client();
  auto b = client();
  auto x = a.acquire("x", ttl(3s));
  distlock::detail::Error ec;
  std::atomic<int> result{-1};
  std::thread waiter(
      [&] { result = distlock::detail::engine_of(b)->wait_free("x", std::nullopt, ec) ? 1 : 0; });
  ASSERT_TRUE(eventually([&] { return store->live_watches() == 1; }, 10s));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(result.load(), -1);
  EXPECT_EQ(store->try_acquire_calls(), 1) << "waiting for a name to be free never acquires it";
  x.release();
  waiter.join();
  EXPECT_FALSE(ec);
  EXPECT_EQ(result.load(), 1);
  // Not held: at once; held with a zero wait: false.
  EXPECT_TRUE(distlock::detail::engine_of(b)->wait_free("x", 0ms, ec));
  auto y = a.acquire("x", ttl(3s));
  EXPECT_FALSE(distlock::detail::engine_of(b)->wait_free("x", 0ms, ec));
  EXPECT_FALSE(ec);
}

TEST_F(EngineMulti, SingleNameAcquireStillWaitsByNotification) {
  auto a = client();
  auto b = client();
  auto x = a.acquire("x", ttl(3s));
  const int base = store->try_acquire_calls();
  std::optional<distlock::Lease> got;
  std::thread waiter([&] { got.emplace(b.acquire("x", ttl(3s))); });
  ASSERT_TRUE(eventually([&] { return store->try_acquire_calls() - base >= 2; }, 10s));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(store->try_acquire_calls() - base, 2);
  x.release();
  waiter.join();
  EXPECT_TRUE(got->owns());
  EXPECT_EQ(store->try_acquire_calls() - base, 3);
}

// A queue-based backend may report a queued place of the waiter as ended (its node
// deleted, or its cancellation seen as a deletion) while the same acquisition wins
// another name: only a loss of the name won may mark the new lease lost.
class ReportsQueuedPlaceLoss final : public distlock::testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  distlock::detail::AcquireResult try_acquire(const distlock::detail::AcquireRequest& req,
                                              distlock::detail::Error& ec) override {
    auto r = ForwardingBackend::try_acquire(req, ec);
    if (!ec && !r.acquired) listener()->on_lease_lost(req.name, req.owner);
    return r;
  }
};

TEST_F(EngineMulti, ALossReportedForAnotherNameDoesNotMarkTheWonLeaseLost) {
  auto a = client();
  auto h0 = a.acquire("m/0", ttl(3s));
  distlock::detail::Error ec;
  auto engine = distlock::detail::Engine::create(
      std::make_unique<ReportsQueuedPlaceLoss>(distlock::testing::memory_backend(store_name, options())),
      options());
  auto held = engine->acquire_any(kNames, ttl(3s), std::nullopt, ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(held);
  EXPECT_EQ(held->name, "m/1");
  EXPECT_FALSE(held->lost.load()) << "the loss of the queued place on m/0 was taken for the lease on m/1";
  EXPECT_FALSE(held->stop.stop_requested());
  engine->release(held, ec);
  EXPECT_FALSE(ec) << ec.message();
}

}  // namespace

}  // namespace distlock::testing
