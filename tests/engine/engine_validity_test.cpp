// A backend lowers the validity of its leases while they are held (ZooKeeper: the
// server grants a shorter session timeout on a reconnect). The engine must move every
// held lease's local deadline earlier by the difference, count later renewals and
// grants with the new validity, and never lengthen a lease. Memory backend, manual
// clock: the engine's own listener entry point is called as a backend would call it.
#include <gtest/gtest.h>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "support/memory_fixture.hpp"

using namespace std::chrono_literals;
using distlock::testing::ttl;

namespace {

struct EngineValidity : distlock::testing::ManualMemoryTest {};

// ttl 9 s: safety margin 900 ms, local deadline 8.1 s after the send time.

TEST_F(EngineValidity, AHeldLeaseIsShortenedByTheDifference) {
  auto c = client();
  auto lease = c.acquire("v", ttl(9s));
  clock->advance(1s);
  ASSERT_EQ(lease.remaining(), 7100ms);
  distlock::detail::engine_of(c)->on_validity_changed(3s);
  // Counted from the same send time with 3 s instead of 9 s: 2.1 s after it.
  EXPECT_EQ(lease.remaining(), 1100ms);
  clock->advance(1100ms);
  EXPECT_FALSE(lease.owns()) << "the lease outlived the validity the backend now grants";
  distlock::detail::engine_of(c)->tick();
  EXPECT_TRUE(lease.stop_token().stop_requested());
  EXPECT_EQ(lease.loss_reason(), distlock::LossReason::local_deadline);
}

TEST_F(EngineValidity, ALeaseAlreadyPastTheNewValidityIsLostAtOnce) {
  auto c = client();
  auto lease = c.acquire("v", ttl(9s));
  clock->advance(4s);  // no renewal ran (the test drives the renewer by hand)
  distlock::detail::engine_of(c)->on_validity_changed(3s);
  EXPECT_FALSE(lease.owns());
  distlock::detail::engine_of(c)->tick();
  EXPECT_TRUE(lease.stop_token().stop_requested());
  // Never renewed again: the server's record ends 9 s after the grant.
  const int renewals = store->renew_calls();
  clock->advance(5s);
  distlock::detail::engine_of(c)->tick();
  EXPECT_EQ(store->renew_calls(), renewals) << "a lease declared lost locally must not be renewed";
  EXPECT_FALSE(store->held("v", clock->now()));
}

TEST_F(EngineValidity, RenewalsAfterTheChangeCountTheNewValidityAndComeSooner) {
  auto c = client();
  auto lease = c.acquire("v", ttl(9s));
  clock->advance(500ms);
  distlock::detail::engine_of(c)->on_validity_changed(3s);
  // Renewed at once (not on the old 3 s schedule), and counted with 3 s.
  EXPECT_EQ(distlock::detail::engine_of(c)->tick(), 1u);
  EXPECT_EQ(lease.remaining(), 2100ms);
  // Then every validity/3 (1 s; the old schedule was every 3 s).
  clock->advance(1s);
  EXPECT_EQ(distlock::detail::engine_of(c)->tick(), 1u);
  EXPECT_EQ(lease.remaining(), 2100ms);
  EXPECT_TRUE(lease.owns());
}

TEST_F(EngineValidity, ALeaseGrantedAfterTheChangeGetsAtMostTheNewValidity) {
  auto c = client();
  distlock::detail::engine_of(c)->on_validity_changed(3s);
  auto lease = c.acquire("v", ttl(9s));  // the backend answers with its ttl: 9 s
  EXPECT_EQ(lease.remaining(), 2100ms);
}

TEST_F(EngineValidity, ALongerValidityNeverLengthensALease) {
  auto c = client();
  auto lease = c.acquire("v", ttl(9s));
  distlock::detail::engine_of(c)->on_validity_changed(60s);
  EXPECT_EQ(lease.remaining(), 8100ms);
  clock->advance(3s);
  EXPECT_EQ(distlock::detail::engine_of(c)->tick(), 1u);
  EXPECT_EQ(lease.remaining(), 8100ms)
      << "a renewal counts the backend's own validity (the ttl), not the cap";
  // And a lowered, then raised, validity leaves the lease at the lower one.
  distlock::detail::engine_of(c)->on_validity_changed(3s);
  distlock::detail::engine_of(c)->on_validity_changed(9s);
  EXPECT_EQ(lease.remaining(), 2100ms);
}

TEST_F(EngineValidity, AMaxHoldLimitStaysAnUpperBound) {
  auto c = client();
  auto o = ttl(9s);
  o.max_hold = 5s;
  auto lease = c.acquire("v", o);
  EXPECT_EQ(lease.remaining(), 5000ms);  // the hold limit comes before 8.1 s
  distlock::detail::engine_of(c)->on_validity_changed(3s);
  // Counted from the grant with 3 s, not the hold limit shifted by the difference.
  EXPECT_EQ(lease.remaining(), 2100ms);
  EXPECT_EQ(lease.max_hold_remaining(), 5000ms);
  clock->advance(2s);
  EXPECT_EQ(distlock::detail::engine_of(c)->tick(), 1u);
  EXPECT_EQ(lease.remaining(), 2100ms);
  clock->advance(2s);
  EXPECT_EQ(distlock::detail::engine_of(c)->tick(), 1u);
  EXPECT_EQ(lease.remaining(), 1000ms) << "the hold limit stays the upper bound";
}

}  // namespace
