// Which hold a Mutex's per-thread calls (owns, hold_count, token, stop_token,
// loss_reason, unlock) act on: only a hold the calling thread took through a Mutex.
// A Lease is keyed by the thread that acquired it too, but it is not the thread's
// Mutex hold: it may have been moved to another thread, and unlocking the Mutex must
// never release it (its holder would see owns() turn false with no stop signal, and
// another client could take the name while the holder's stop token never fires).
#include <gtest/gtest.h>

#include <future>
#include <optional>
#include <thread>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "fake/memory_backend.hpp"
#include "support/memory_fixture.hpp"

using namespace std::chrono_literals;
using distlock::errc;
using distlock::testing::ttl;

namespace {

struct MutexOwnership : distlock::testing::ManualMemoryTest {};

// Thread A acquires a Lease and moves it to thread B. A never locked the Mutex: it
// must not own it, and its unlock must be refused, leaving B's lease held.
TEST_F(MutexOwnership, ALeaseMovedToAnotherThreadIsNotTheFirstThreadsMutexHold) {
  auto c = client();
  distlock::Lease lease = c.acquire("x", ttl(3s));
  const std::string server_owner = store->holder("x");
  std::promise<void> moved, checked;
  std::future<void> checked_f = checked.get_future();
  std::optional<bool> owns_in_b_after;
  std::thread b([&, l = std::move(lease)]() mutable {
    moved.set_value();
    checked_f.wait();
    owns_in_b_after = l.owns();
    std::error_code ignored;  // the old code released it under the Lease: not_owner here
    l.release(ignored);
  });
  moved.get_future().wait();

  distlock::Mutex m = c.mutex("x", ttl(3s));
  EXPECT_FALSE(m.owns()) << "thread A never locked the Mutex";
  EXPECT_EQ(m.hold_count(), 0);
  EXPECT_EQ(m.loss_reason(), distlock::LossReason::none);
  std::error_code ec;
  m.unlock(ec);
  EXPECT_EQ(ec, errc::not_owner) << "unlock by a thread that does not hold the Mutex";
  EXPECT_EQ(store->holder("x"), server_owner) << "the Mutex's unlock released another thread's Lease";
  checked.set_value();
  b.join();
  ASSERT_TRUE(owns_in_b_after.has_value());
  EXPECT_TRUE(*owns_in_b_after) << "the Lease moved to thread B stopped owning without a loss signal";
}

// A thread's Mutex hold is lost; before unlocking it the thread acquires a Lease on the
// same name (the Lease's record displaces the lost hold in the lease table). Unlocking
// the Mutex ends the lost Mutex hold (errc::lost), never the Lease.
TEST_F(MutexOwnership, UnlockingALostMutexHoldDoesNotReleaseTheThreadsLease) {
  auto c = client();
  const auto engine = distlock::detail::engine_of(c);
  distlock::Mutex m = c.mutex("y", ttl(3s));
  m.lock();
  const std::stop_token mutex_stop = m.stop_token();
  engine->on_lease_lost("y", store->holder("y"));
  engine->drain_events();  // the lost hold is handed back: the server record is gone
  ASSERT_TRUE(mutex_stop.stop_requested());
  ASSERT_EQ(store->holder("y"), "");

  distlock::Lease lease = c.acquire("y", ttl(3s));
  const std::string lease_owner = store->holder("y");
  const std::stop_token lease_stop = lease.stop_token();
  EXPECT_FALSE(m.owns()) << "the Mutex hold is lost";

  std::error_code ec;
  m.unlock(ec);
  EXPECT_EQ(ec, errc::lost) << "the unlock ends the lost Mutex hold";
  EXPECT_EQ(m.hold_count(), 0);
  EXPECT_TRUE(lease.owns()) << "unlocking the Mutex ended the Lease";
  EXPECT_FALSE(lease_stop.stop_requested());
  EXPECT_EQ(store->holder("y"), lease_owner) << "unlocking the Mutex released the Lease on the server";
  lease.release();
  EXPECT_EQ(engine->held_count(), 0u);
}

}  // namespace
