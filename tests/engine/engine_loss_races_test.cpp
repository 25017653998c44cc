// Losses racing the engine: re-entry after a loss, the watchdog busy, a loss while a grant is recorded.
// Written by an adversarial review of the engine (commit b804aea, first named engine_review_test.cpp).
//
// Adversarial engine tests: re-entry after a loss, a lease taken while the watchdog
// is busy, a session lost while an acquisition is being granted.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "engine/url.hpp"
#include "fake/memory_backend.hpp"
#include "support/backend_names.hpp"
#include "support/forwarding_backend.hpp"
#include "support/manual_clock.hpp"
#include "support/memory_fixture.hpp"

namespace distlock::testing {

using namespace std::chrono_literals;
using detail::MemoryStore;

namespace {

struct EngineLossRaces : ManualMemoryTest {};

// A thread that holds a Mutex whose lease was lost and locks it again (a nested
// lock_guard) gets a new acquisition; unwinding both guards must not throw (a throw
// from a lock_guard's destructor terminates the process).
TEST_F(EngineLossRaces, NestedRelockAfterALossUnwindsWithoutThrowing) {
  auto c = client();
  distlock::Mutex m = c.mutex("nested", ttl(3s));
  m.lock();
  std::stop_token outer = m.stop_token();
  clock->advance(3100ms);  // past the local deadline and the server's expiry
  detail::engine_of(c)->tick();
  ASSERT_TRUE(outer.stop_requested());
  m.lock();  // the outer hold is lost: this is a new acquisition
  EXPECT_TRUE(m.owns());
  m.unlock();  // inner: releases the new acquisition
  EXPECT_FALSE(store->held("nested", clock->now()));
  std::error_code ec;
  m.unlock(ec);  // outer: the lost hold
  EXPECT_NE(ec, make_error_code(errc::not_owner)) << "the outer unlock found no hold: " << ec.message();
  EXPECT_EQ(m.hold_count(), 0);
  EXPECT_EQ(detail::engine_of(c)->held_count(), 0u);
}

// The same thread re-acquires a name whose hold has passed its local deadline before
// the watchdog declared it: the old hold must still be signalled as lost.
TEST_F(EngineLossRaces, AHoldReplacedByARelockBeforeTheWatchdogRanIsStillSignalled) {
  auto c = client();
  distlock::Mutex m = c.mutex("replaced", ttl(3s));
  m.lock();
  std::stop_token outer = m.stop_token();
  std::atomic<int> callbacks{0};
  detail::engine_of(c)->add_loss_callback(detail::engine_of(c)->held_by_this_thread("replaced"),
                                          [&] { ++callbacks; });
  clock->advance(3100ms);  // no tick: the loss has not been declared yet
  m.lock();                // new acquisition (the server record has expired)
  detail::engine_of(c)->tick();
  EXPECT_TRUE(outer.stop_requested()) << "the replaced hold's loss was never signalled";
  detail::engine_of(c)->drain_events();  // callbacks run on the event thread
  EXPECT_EQ(callbacks.load(), 1);
  m.unlock();
  std::error_code ec;
  m.unlock(ec);
  EXPECT_NE(ec, make_error_code(errc::not_owner)) << ec.message();
  EXPECT_TRUE(outer.stop_requested());
}

// A lease acquired while the watchdog is between its scan and its sleep (here: running
// the loss callback of another lease, with the renewer stuck on a hung server) must
// still get its stop signal at its own local deadline, not after the watchdog's 1 s
// fallback period.
TEST(EngineLossRacesRealTime, LeaseTakenWhileTheWatchdogIsBusyIsStillWatched) {
  auto store = MemoryStore::named("review-rt-watchdog");
  distlock::ClientOptions o;
  o.logger = [](distlock::LogLevel, std::string_view) {};
  auto c = distlock::connect("memory://review-rt-watchdog", o);
  store->set_renew_delay(4s);  // the renewer hangs on its first renewal
  std::mutex mu;
  std::condition_variable cv;
  bool in_callback = false, second_taken = false;
  auto first = c.acquire("w0", ttl(300ms));
  first.on_lost([&] {  // runs on the event thread
    std::unique_lock lk(mu);
    in_callback = true;
    cv.notify_all();
    cv.wait_for(lk, 5s, [&] { return second_taken; });
  });
  {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 5s, [&] { return in_callback; })) << "first lease never lost";
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto second = c.acquire("w1", ttl(100ms));  // local deadline 90 ms from now
  {
    std::lock_guard lk(mu);
    second_taken = true;
    cv.notify_all();
  }
  std::stop_token st = second.stop_token();
  while (!st.stop_requested() && std::chrono::steady_clock::now() - t0 < 3s) std::this_thread::sleep_for(2ms);
  const auto fired_after = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t0);
  ASSERT_TRUE(st.stop_requested());
  std::printf("stop signal %lld ms after the acquire (local deadline 90 ms)\n",
              static_cast<long long>(fired_after.count()));
  // The server lets the lease go 100 ms after the acquire was sent; the watchdog's
  // fallback wake is 1 s. 700 ms of slack for a loaded machine.
  EXPECT_LT(fired_after, 800ms) << "stop signal came " << fired_after.count()
                                << " ms after the acquire; the local deadline was 90 ms";
  store->set_renew_delay(0ms);
}

// A backend whose session ends while it is granting an acquisition (the grant is
// answered, then the session's keep-alive reports the lease gone): the server has
// forgotten the lock, so the lease the engine hands out must be signalled lost.
class SessionLossOnGrant final : public ForwardingBackend {
 public:
  SessionLossOnGrant(std::unique_ptr<Backend> inner, std::shared_ptr<MemoryStore> store)
      : ForwardingBackend(std::move(inner)), store_(std::move(store)) {}
  std::atomic<bool> lose_next_grant{false};
  std::atomic<bool> lose_lease_of_next_grant{false};

  detail::AcquireResult try_acquire(const AcquireRequest& req, Error& ec) override {
    auto r = ForwardingBackend::try_acquire(req, ec);
    if (r.acquired && lose_next_grant.exchange(false)) {
      store_->drop(std::string(req.name));  // the session's keys go with it
      listener()->on_session_lost();        // reported by the keep-alive thread
    }
    if (r.acquired && lose_lease_of_next_grant.exchange(false)) {
      store_->drop(std::string(req.name));             // its node deleted, its session ended
      listener()->on_lease_lost(req.name, req.owner);  // reported by the session thread
    }
    return r;
  }

 private:
  std::shared_ptr<MemoryStore> store_;
};

/// `lease` was reported lost between its grant and the engine recording it: the server no
/// longer has it, so `other` takes `name` right now (and gives it back), never while `lease`
/// still claims it, and the loss was signalled.
void expect_lost_at_grant(Client& other, const Lease& lease, const std::string& name) {
  auto rival = other.try_acquire(name, ttl(3s));
  ASSERT_TRUE(rival.has_value());
  EXPECT_FALSE(lease.owns() && rival->owns()) << "two holders at once";
  EXPECT_TRUE(lease.stop_token().stop_requested()) << "a loss the engine was told of was not signalled";
}

TEST_F(EngineLossRaces, SessionLostWhileGrantingSignalsTheNewLease) {
  SessionLossOnGrant* raw = nullptr;
  auto c = client_through<SessionLossOnGrant>(store_name, options(), &raw, store);
  auto other = client();

  raw->lose_next_grant = true;
  auto lease = c.acquire("s", ttl(3s));
  ASSERT_NO_FATAL_FAILURE(expect_lost_at_grant(other, lease, "s"));
}

// The same for one lease: the backend reports the lease of this very acquisition
// lost (etcd: its session's lease ended; ZooKeeper: its node is gone) between the
// grant and the engine recording it.
TEST_F(EngineLossRaces, LeaseLostWhileGrantingSignalsTheNewLease) {
  SessionLossOnGrant* raw = nullptr;
  auto c = client_through<SessionLossOnGrant>(store_name, options(), &raw, store);
  auto other = client();

  auto kept = c.acquire("kept", ttl(3s));  // another lease of the client is not touched
  raw->lose_lease_of_next_grant = true;
  auto lease = c.acquire("l", ttl(3s));
  ASSERT_NO_FATAL_FAILURE(expect_lost_at_grant(other, lease, "l"));
  EXPECT_TRUE(kept.owns());
  EXPECT_FALSE(kept.stop_token().stop_requested());
  // A later acquisition is not affected.
  lease = c.acquire("l", ttl(3s));
  EXPECT_TRUE(lease.owns());
  EXPECT_FALSE(lease.stop_token().stop_requested());
}

// A Lease "belongs to one thread at a time" and may be moved to another. After the
// acquiring thread has handed its lease to a worker, an acquire of the same name by
// the acquiring thread must wait for the worker, not re-enter the worker's hold (two
// threads would then run the critical section at once).
TEST_F(EngineLossRaces, LeaseMovedToAnotherThreadIsNotReenteredByTheFirstThread) {
  auto c = client();
  distlock::Lease lease = c.acquire("moved", ttl(3s));
  std::mutex mu;
  std::condition_variable cv;
  bool worker_has_it = false, done = false;
  std::thread worker([&, l = std::move(lease)]() mutable {
    std::unique_lock lk(mu);
    worker_has_it = l.owns();
    cv.notify_all();
    cv.wait_for(lk, 10s, [&] { return done; });
  });
  {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 10s, [&] { return worker_has_it; }));
  }
  auto again = c.try_acquire("moved", ttl(3s));
  const bool both = again.has_value() && again->owns();
  {
    std::lock_guard lk(mu);
    done = true;
    cv.notify_all();
  }
  worker.join();
  EXPECT_FALSE(both) << "the first thread re-entered the lease the worker holds: two threads hold the lock";
}

// A loss callback that keeps a copy of its Client (to take the lock again, say) can
// hold the last reference to the engine: when the application has dropped its own
// handles while the callback ran, the engine is destroyed on the event thread that
// ran the callback. That must not join that thread from itself (std::terminate) nor
// free the engine under the running thread.
[[noreturn]] void last_client_copy_in_a_loss_callback() {
  auto store = MemoryStore::named("review-rt-last-ref");
  std::weak_ptr<detail::Engine> weak;
  std::mutex mu;
  std::condition_variable cv;
  bool in_callback = false, dropped = false;
  {
    distlock::ClientOptions o;
    o.logger = [](distlock::LogLevel, std::string_view) {};
    auto c = distlock::connect("memory://review-rt-last-ref", o);
    weak = detail::engine_of(c);
    auto lease = c.acquire("cb", ttl(300ms));
    lease.on_lost([c, &mu, &cv, &in_callback, &dropped] {  // on the event thread
      std::unique_lock lk(mu);
      in_callback = true;
      cv.notify_all();
      cv.wait_for(lk, 5s, [&] { return dropped; });
    });
    store->drop("cb");  // the next renewal finds it gone: lost
    std::unique_lock lk(mu);
    if (!cv.wait_for(lk, 5s, [&] { return in_callback; })) std::_Exit(2);
  }  // the lease and the application's Client go here
  {
    std::lock_guard lk(mu);
    dropped = true;
    cv.notify_all();
  }
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (!weak.expired() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
  std::_Exit(weak.expired() ? 0 : 3);
}

TEST(EngineLossRacesRealTime, LossCallbackHoldingTheLastClientCopyDoesNotCrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(last_client_copy_in_a_loss_callback(), ::testing::ExitedWithCode(0), "");
}

}  // namespace

}  // namespace distlock::testing
