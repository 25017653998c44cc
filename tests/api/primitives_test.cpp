// Semaphore and SharedMutex on the memory backend with a manual clock: the count
// is never exceeded, waiters are woken by notification (counted try_acquire calls),
// timeouts, the stored size, writer exclusion and fairness, downgrade, refused
// upgrade, and a writer's partial loss.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "support/eventually.hpp"
#include "support/memory_fixture.hpp"
#include "support/thrown.hpp"

using namespace std::chrono_literals;

namespace distlock::testing {
namespace {

using SemaphoreTest = ManualMemoryTest;
using SharedMutexTest = ManualMemoryTest;

// ---- Semaphore ------------------------------------------------------------

TEST_F(SemaphoreTest, NeverMoreThanNHoldersAndAllGetTheirTurn) {
  constexpr int kPermits = 3, kThreads = 12, kRounds = 15;
  std::atomic<int> inside{0}, most{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto c = client();  // a client per thread: contenders in separate "processes"
      auto sem = c.semaphore("pool", kPermits, ttl(30s));
      for (int r = 0; r < kRounds; ++r) {
        distlock::Lease permit = sem.acquire();
        const int now = ++inside;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        if ((t + r) % 3 == 0) std::this_thread::sleep_for(1ms);
        --inside;
        permit.release();
        ++done;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(done.load(), kThreads * kRounds);
  EXPECT_LE(most.load(), kPermits);
  EXPECT_GE(most.load(), 1);
}

TEST_F(SemaphoreTest, WaiterIsWokenByAReleaseWithoutPolling) {
  auto a = client();
  auto b = client();
  auto sem_a = a.semaphore("s", 2, ttl(3s));
  auto p0 = sem_a.acquire();
  auto p1 = sem_a.acquire();
  EXPECT_EQ(sem_a.available(), 0u);
  const int base = store->try_acquire_calls();
  auto sem_b = b.semaphore("s", 2, ttl(3s));
  std::optional<distlock::Lease> got;
  std::thread waiter([&] { got.emplace(sem_b.acquire()); });
  // One round over both permits, the subscriptions, one more round; then sleep.
  ASSERT_TRUE(eventually([&] { return store->try_acquire_calls() - base >= 4; }, 10s));
  std::this_thread::sleep_for(300ms);  // the clock stands still: only polling would try again
  EXPECT_EQ(store->try_acquire_calls() - base, 4) << "the waiter polls";
  const std::string freed = p1.name();
  p1.release();
  waiter.join();
  ASSERT_TRUE(got->owns());
  EXPECT_EQ(got->name(), freed);
  EXPECT_EQ(store->try_acquire_calls() - base, 5) << "only the released permit is tried again";
}

TEST_F(SemaphoreTest, TimeoutsAndSingleAttempts) {
  auto a = client();
  auto b = client();
  auto sem_a = a.semaphore("t", 1, ttl(30s));
  auto held = sem_a.acquire();
  auto opts = ttl(30s);
  auto sem_b = b.semaphore("t", 1, opts);
  EXPECT_FALSE(sem_b.try_acquire().has_value());
  std::atomic<bool> done{false};
  std::optional<distlock::Lease> got;
  std::thread waiter([&] {
    got = sem_b.try_acquire_for(2s);
    done = true;
  });
  const Millis advanced = advance_until(*clock, done);
  waiter.join();
  EXPECT_FALSE(got.has_value());
  EXPECT_GE(advanced, 2s);
  opts.wait = 0ms;
  auto sem_c = b.semaphore("t", 1, opts);
  std::string what;
  EXPECT_EQ(code_of([&] { sem_c.acquire(); }, &what), errc::busy) << what;
  distlock::detail::Error ec;
  auto none = sem_c.acquire(ec);
  EXPECT_EQ(ec, errc::busy);
  EXPECT_FALSE(none.owns());
}

TEST_F(SemaphoreTest, PermitCountIsStoredAndAnotherCountIsRefused) {
  auto a = client();
  auto sem = a.semaphore("jobs", 3);
  EXPECT_EQ(sem.permits(), 3);
  distlock::detail::Error ec;
  auto stored =
      distlock::detail::engine_of(a)->backend().get_record(distlock::Semaphore::definition_key("jobs"), ec);
  ASSERT_FALSE(ec);
  EXPECT_EQ(stored.value_or(""), "3");
  std::string what;
  EXPECT_EQ(code_of([&] { client().semaphore("jobs", 4); }, &what), errc::invalid_argument);
  EXPECT_NE(what.find("3 permits"), std::string::npos) << what;
  EXPECT_NE(what.find("asked for 4"), std::string::npos) << what;
  EXPECT_EQ(client().semaphore("jobs", 3).permits(), 3);
  EXPECT_EQ(code_of([&] { a.semaphore("zero", 0); }, &what), errc::invalid_argument);
  EXPECT_NE(what.find("1..1024"), std::string::npos) << what;
  EXPECT_EQ(code_of([&] { a.semaphore("big", 1025); }), errc::invalid_argument);
  EXPECT_EQ(code_of([&] { a.semaphore(std::string("bad\x1fname"), 2); }), errc::invalid_argument);
  EXPECT_EQ(code_of([&] { a.semaphore("", 2); }), errc::invalid_argument);
  EXPECT_EQ(a.semaphore("big", 1024).permits(), 1024);
}

TEST_F(SemaphoreTest, EachPermitIsALeaseWithItsOwnTokenAndStopToken) {
  auto a = client();
  auto sem = a.semaphore("p", 2, ttl(3s));
  auto x = sem.acquire();
  auto y = sem.acquire();
  EXPECT_NE(x.name(), y.name());
  EXPECT_TRUE(x.has_token());
  const std::uint64_t tx = x.token();
  const std::string x_name = x.name();
  x.release();
  auto x2 = sem.acquire();  // the only free permit: x's
  EXPECT_EQ(x2.name(), x_name);
  EXPECT_GT(x2.token(), tx) << "a permit's token increases across its holders";
  // Losing one permit fires that permit's stop token only.
  store->steal(y.name(), "intruder");
  a.renew_now();
  EXPECT_TRUE(y.stop_token().stop_requested());
  EXPECT_FALSE(y.owns());
  EXPECT_FALSE(x2.stop_token().stop_requested());
  EXPECT_TRUE(x2.owns());
}

TEST_F(SemaphoreTest, ADeadHoldersPermitReturnsAfterItsTtl) {
  auto dead = client();  // never renews: no renewer, nobody calls tick()
  auto live = client();
  auto sem_dead = dead.semaphore("d", 1, ttl(1s));
  auto held = sem_dead.acquire();
  auto sem = live.semaphore("d", 1, ttl(1s));
  EXPECT_FALSE(sem.try_acquire().has_value());
  clock->advance(1001ms);
  auto got = sem.try_acquire();
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->owns());
}

TEST_F(SemaphoreTest, AvailableCountsFreePermits) {
  auto a = client();
  auto sem = a.semaphore("av", 4, ttl(3s));
  EXPECT_EQ(sem.available(), 4u);
  auto p = sem.acquire();
  auto q = sem.acquire();
  EXPECT_EQ(sem.available(), 2u);
}

// ---- SharedMutex ----------------------------------------------------------

TEST_F(SharedMutexTest, ReadersShareAWriterIsExclusive) {
  auto a = client();
  auto b = client();
  auto rw_a = a.shared_mutex("cfg", ttl(3s));
  auto rw_b = b.shared_mutex("cfg", ttl(3s));
  EXPECT_EQ(rw_a.max_readers(), distlock::SharedMutex::kDefaultMaxReaders);
  {
    std::shared_lock r1(rw_a);
    std::shared_lock r2(rw_b);  // another client reads at the same time
    EXPECT_TRUE(rw_a.owns_shared());
    EXPECT_TRUE(rw_b.owns_shared());
    std::atomic<int> result{-1};
    std::thread([&] { result = rw_a.try_lock() ? 1 : 0; }).join();
    EXPECT_EQ(result.load(), 0) << "a writer got in beside readers";
  }
  {
    std::unique_lock w(rw_a);
    EXPECT_TRUE(rw_a.owns_exclusive());
    EXPECT_FALSE(rw_b.try_lock_shared());
    EXPECT_FALSE(rw_b.try_lock());
    distlock::detail::Error ec;
    const auto info =
        distlock::detail::engine_of(a)->status(distlock::SharedMutex::intent_lock_name("cfg"), ec);
    EXPECT_EQ(rw_a.token(), info.token.value_or(0)) << "the writer's token is the intent lock's";
  }
  EXPECT_TRUE(rw_b.try_lock_shared());
  rw_b.unlock_shared();
}

TEST_F(SharedMutexTest, AQueuedWriterBlocksNewReadersAndIsNotStarved) {
  auto r = client();
  auto w = client();
  auto late = client();
  auto rw_r = r.shared_mutex("q", ttl(3s));
  auto rw_w = w.shared_mutex("q", ttl(3s));
  auto rw_late = late.shared_mutex("q", ttl(3s));
  rw_r.lock_shared();
  std::atomic<bool> writer_in{false};
  std::thread writer([&] {
    rw_w.lock();
    writer_in = true;
    std::this_thread::sleep_for(20ms);
    rw_w.unlock();
  });
  // The writer holds the intent lock while it waits for the reader's slot.
  ASSERT_TRUE(eventually(
      [&] { return store->held(distlock::SharedMutex::intent_lock_name("q"), clock->now()); }, 10s));
  EXPECT_FALSE(rw_late.try_lock_shared()) << "a new reader overtook a queued writer";
  std::atomic<bool> late_in{false};
  std::thread late_reader([&] {
    rw_late.lock_shared();
    late_in = true;
    EXPECT_FALSE(writer_in.load() && rw_w.owns()) << "reader inside while the writer holds it";
    rw_late.unlock_shared();
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(writer_in.load());
  EXPECT_FALSE(late_in.load());
  rw_r.unlock_shared();  // the writer goes first, then the late reader
  writer.join();
  late_reader.join();
  EXPECT_TRUE(writer_in.load());
  EXPECT_TRUE(late_in.load());
}

TEST_F(SharedMutexTest, DowngradeKeepsWritersOutAndLetsReadersIn) {
  auto a = client();
  auto b = client();
  auto rw = a.shared_mutex("dg", ttl(3s));
  auto rw_b = b.shared_mutex("dg", ttl(3s));
  rw.lock();
  const auto stop = rw.stop_token();
  rw.downgrade();
  EXPECT_TRUE(rw.owns_shared());
  EXPECT_FALSE(rw.owns_exclusive());
  EXPECT_EQ(code_of([&] { (void)rw.token(); }), errc::not_owner) << "a reader has no token";
  EXPECT_EQ(rw.stop_token(), stop) << "the same hold, the same loss signal";
  EXPECT_TRUE(rw_b.try_lock_shared()) << "another reader gets in after the downgrade";
  rw_b.unlock_shared();
  std::atomic<int> writer{-1};
  std::thread([&] { writer = rw_b.try_lock() ? 1 : 0; }).join();
  EXPECT_EQ(writer.load(), 0) << "a writer got in beside the downgraded hold";
  EXPECT_EQ(code_of([&] { rw.unlock(); }), errc::not_owner) << "the hold is shared now";
  rw.unlock_shared();
  EXPECT_TRUE(rw_b.try_lock());
  rw_b.unlock();
  EXPECT_EQ(code_of([&] { rw.downgrade(); }), errc::not_owner);
}

TEST_F(SharedMutexTest, UpgradeAndRelockAreRefusedNotDeadlocked) {
  auto a = client();
  auto rw = a.shared_mutex("up", ttl(3s));
  auto rw2 = a.shared_mutex("up", ttl(3s));  // another handle, same client and name
  rw.lock_shared();
  std::string what;
  EXPECT_EQ(code_of([&] { rw.lock(); }, &what), errc::invalid_argument);
  EXPECT_NE(what.find("upgrade refused"), std::string::npos) << what;
  EXPECT_EQ(code_of([&] { rw2.try_lock(); }, &what), errc::invalid_argument);
  EXPECT_NE(what.find("upgrade refused"), std::string::npos) << what;
  EXPECT_EQ(code_of([&] { rw.lock_shared(); }, &what), errc::invalid_argument);
  EXPECT_NE(what.find("not reentrant"), std::string::npos) << what;
  EXPECT_TRUE(rw.owns_shared()) << "a refused call leaves the hold alone";
  rw.unlock_shared();
  rw.lock();
  EXPECT_EQ(code_of([&] { rw2.lock(); }, &what), errc::invalid_argument);
  EXPECT_NE(what.find("not reentrant"), std::string::npos) << what;
  EXPECT_EQ(code_of([&] { rw.unlock_shared(); }), errc::not_owner);
  rw.unlock();
  EXPECT_EQ(code_of([&] { rw.unlock(); }), errc::not_owner);
}

TEST_F(SharedMutexTest, LosingOneSlotLosesTheWritersHold) {
  auto a = client();
  auto rw = a.shared_mutex("pl", ttl(3s));
  rw.lock();
  const auto stop = rw.stop_token();
  EXPECT_TRUE(rw.owns());
  // One reader slot out of 32 taken away: the writer is no longer exclusive.
  store->steal(distlock::SharedMutex::slot_lock_name("pl", 17), "intruder");
  a.renew_now();
  EXPECT_TRUE(stop.stop_requested());
  EXPECT_FALSE(rw.owns());
  EXPECT_FALSE(rw.owns_exclusive());
  rw.unlock();  // no throw: the loss was signalled already
  EXPECT_FALSE(store->held(distlock::SharedMutex::intent_lock_name("pl"), clock->now()));
  EXPECT_FALSE(store->held(distlock::SharedMutex::slot_lock_name("pl", 3), clock->now()));
}

TEST_F(SharedMutexTest, LosingTheIntentLockLosesTheWritersHoldAndStaysLost) {
  auto a = client();
  auto rw = a.shared_mutex("pi", ttl(3s));
  rw.lock();
  store->steal(distlock::SharedMutex::intent_lock_name("pi"), "intruder");
  a.renew_now();
  EXPECT_TRUE(rw.stop_token().stop_requested());
  EXPECT_FALSE(rw.owns());
  rw.downgrade();
  EXPECT_FALSE(rw.owns()) << "a lost hold stays lost after a downgrade";
  rw.unlock_shared();
}

TEST_F(SharedMutexTest, TimedWaitsRunOut) {
  auto a = client();
  auto b = client();
  auto rw_a = a.shared_mutex("tw", ttl(30s));
  auto rw_b = b.shared_mutex("tw", ttl(30s));
  // b's timed try on a thread of its own while the manual clock runs on: 1 if it got the lock.
  auto timed_try = [&](const std::function<bool()>& try_for) {
    std::atomic<bool> done{false};
    std::atomic<int> got{-1};
    std::thread t([&] {
      got = try_for() ? 1 : 0;
      done = true;
    });
    advance_until(*clock, done);
    t.join();
    return got.load();
  };
  rw_a.lock_shared();
  EXPECT_EQ(timed_try([&] { return rw_b.try_lock_for(1s); }), 0);
  EXPECT_FALSE(store->held(distlock::SharedMutex::intent_lock_name("tw"), clock->now()))
      << "a writer that gave up keeps nothing";
  rw_a.unlock_shared();
  rw_a.lock();
  EXPECT_EQ(timed_try([&] { return rw_b.try_lock_shared_for(1s); }), 0);
  rw_a.unlock();
}

TEST_F(SharedMutexTest, MaxReadersIsStoredAndAdopted) {
  auto a = client();
  distlock::SharedMutex small(a, "few", ttl(3s), 2);
  EXPECT_EQ(small.max_readers(), 2);
  EXPECT_EQ(a.shared_mutex("few").max_readers(), 2) << "a handle without a size adopts the stored one";
  std::string what;
  EXPECT_EQ(code_of([&] { distlock::SharedMutex(a, "few", ttl(3s), 3); }, &what), errc::invalid_argument);
  EXPECT_NE(what.find("2 reader slots"), std::string::npos) << what;
  // Two readers fill it; a third waits.
  auto b = client();
  auto c = client();
  small.lock_shared();
  auto rb = b.shared_mutex("few", ttl(3s));
  auto rc = c.shared_mutex("few", ttl(3s));
  EXPECT_TRUE(rb.try_lock_shared());
  EXPECT_FALSE(rc.try_lock_shared());
  rb.unlock_shared();
  small.unlock_shared();
}

// ReadWriteLease: holds not tied to a thread. Two shared ones at once (even on one
// thread), an exclusive one only without them, with the intent lock's token; a reader
// has no token; losing one part fires the stop token and on_lost once, and release()
// then says errc::lost and frees the other parts; the destructor releases.
TEST_F(SharedMutexTest, ReadWriteLeasesAreHoldsUsableFromAnyThread) {
  auto a = client();
  auto b = client();
  distlock::LockOptions once = ttl(3s);
  once.wait = Millis(0);  // one attempt: busy instead of waiting
  auto rw_a = a.shared_mutex("rl", once);
  auto rw_b = b.shared_mutex("rl", once);
  {
    distlock::ReadWriteLease r1 = rw_a.acquire_shared();
    distlock::ReadWriteLease r2 = rw_a.acquire_shared();  // the same thread, a second hold
    EXPECT_TRUE(r1.owns());
    EXPECT_TRUE(r2.owns());
    EXPECT_FALSE(r1.exclusive());
    EXPECT_EQ(r1.name(), "rl");
    EXPECT_FALSE(r1.has_token());
    EXPECT_EQ(code_of([&] { (void)r1.token(); }), errc::not_supported);
    EXPECT_GT(r1.remaining(), Millis(0));
    EXPECT_EQ(code_of([&] { (void)rw_b.acquire_exclusive(); }), errc::busy) << "a writer beside readers";
    // Moved to another thread and released there.
    std::thread([h = std::move(r2)]() mutable { h.release(); }).join();
    EXPECT_EQ(code_of([&] { (void)rw_b.acquire_exclusive(); }), errc::busy) << "r1 still reads";
  }  // r1's destructor releases it
  distlock::ReadWriteLease w = rw_b.acquire_exclusive();
  EXPECT_TRUE(w.owns());
  EXPECT_TRUE(w.exclusive());
  distlock::detail::Error ec;
  EXPECT_EQ(w.token(), distlock::detail::engine_of(b)
                           ->status(distlock::SharedMutex::intent_lock_name("rl"), ec)
                           .token.value_or(0));
  EXPECT_EQ(code_of([&] { (void)rw_a.acquire_shared(); }), errc::busy) << "a reader beside the writer";
  std::atomic<int> fired{0};
  w.on_lost([&] { ++fired; });
  store->steal(distlock::SharedMutex::slot_lock_name("rl", 5), "intruder");
  b.renew_now();
  EXPECT_TRUE(w.stop_token().stop_requested());
  EXPECT_FALSE(w.owns());
  EXPECT_NE(w.loss_reason(), distlock::LossReason::none);
  EXPECT_EQ(w.remaining(), Millis(0));
  b.renew_now();
  distlock::detail::engine_of(b)->drain_events();  // callbacks run on the event thread
  EXPECT_EQ(fired.load(), 1) << "on_lost runs once for the hold, not once per part";
  w.release(ec);
  EXPECT_EQ(ec, errc::lost);
  EXPECT_FALSE(store->held(distlock::SharedMutex::intent_lock_name("rl"), clock->now()))
      << "the parts not lost are released";
  EXPECT_FALSE(store->held(distlock::SharedMutex::slot_lock_name("rl", 0), clock->now()));
}

}  // namespace

}  // namespace distlock::testing
