// The validity cap against a grant that races a lowered or raised validity.
// Written by the review of 5285af8 (commit 915885b, first named engine_validity_grant_race_test.cpp).
//
// Review of 5285af8 (Engine::on_validity_changed / cap_validity), memory backend,
// manual clock. A wrapper backend calls the engine's listener from inside try_acquire,
// after the grant was answered and before the engine records the lease: the window in
// which a ZooKeeper completion thread delivers CONNECTED events of new connections.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "engine/url.hpp"
#include "fake/memory_backend.hpp"
#include "support/forwarding_backend.hpp"
#include "support/manual_clock.hpp"
#include "support/memory_fixture.hpp"

using namespace std::chrono_literals;
using distlock::Millis;
using distlock::testing::ttl;

namespace {

struct EngineValidityGrantRace : distlock::testing::ManualMemoryTest {};

// Forwards to the memory backend; after a grant, reports the validities queued in
// `on_next_grant` to the engine (in order), as a backend's event thread would.
class ValidityChangesOnGrant final : public distlock::testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::vector<Millis> on_next_grant;

  distlock::detail::AcquireResult try_acquire(const distlock::detail::AcquireRequest& req,
                                              distlock::detail::Error& ec) override {
    auto r = ForwardingBackend::try_acquire(req, ec);
    if (r.acquired) {
      for (Millis v : on_next_grant) listener()->on_validity_changed(v);
      on_next_grant.clear();
    }
    return r;
  }
};

// The grant was confirmed (sent) before the validity was lowered to 3 s; by the
// contract of on_validity_changed it is valid for at most 3 s after that send time.
// The validity is raised back to 9 s before the engine records the lease: the raise
// says nothing about a lease confirmed before the lowering, yet the insertion applies
// only the latest cap (9 s) and the lease keeps the 9 s its answer counted.
TEST_F(EngineValidityGrantRace, ALowerThenRaiseDuringAGrantStillCapsThatGrant) {
  auto opts = options();
  ValidityChangesOnGrant* raw = nullptr;
  auto c = distlock::testing::client_through<ValidityChangesOnGrant>(store_name, opts, &raw);

  raw->on_next_grant = {3s, 9s};
  auto lease = c.acquire("v", ttl(9s));  // answered with 9 s (the ttl); margin 900 ms
  EXPECT_LE(lease.remaining(), 2100ms)
      << "a grant sent before the validity was lowered to 3 s kept the 9 s its answer counted "
         "(the cap in force at insertion, 9 s again, is all the engine applies)";
}

// The same order without a raise: the lowered cap is applied at insertion (holds up).
TEST_F(EngineValidityGrantRace, ALowerDuringAGrantCapsThatGrant) {
  auto opts = options();
  ValidityChangesOnGrant* raw = nullptr;
  auto c = distlock::testing::client_through<ValidityChangesOnGrant>(store_name, opts, &raw);

  raw->on_next_grant = {3s};
  auto lease = c.acquire("v", ttl(9s));
  EXPECT_EQ(lease.remaining(), 2100ms);
}

// A renewal in flight when the validity is lowered and raised again: the reply is
// counted with the lowered validity (h->validity is never raised) — holds up.
TEST_F(EngineValidityGrantRace, ARenewalAfterALowerThenRaiseCountsTheLowerValidity) {
  auto c = client();
  auto lease = c.acquire("v", ttl(9s));
  auto engine = distlock::detail::engine_of(c);
  engine->on_validity_changed(3s);
  engine->on_validity_changed(9s);
  clock->advance(500ms);
  EXPECT_EQ(engine->tick(), 1u);
  EXPECT_EQ(lease.remaining(), 2100ms);
}

}  // namespace
