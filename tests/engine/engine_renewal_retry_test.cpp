// The pace of renewal retries after a failed renewal (a server that answers with an
// error): retried soon, but never in a tight loop. The renewer renews whatever falls
// due within a quarter interval of now, so a retry time set less than a quarter
// interval ahead would be due again at once: the renewer would resend without pause
// for as long as the server keeps failing.
#include <gtest/gtest.h>

#include <thread>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "fake/memory_backend.hpp"
#include "support/manual_clock.hpp"
#include "support/memory_fixture.hpp"

using namespace std::chrono_literals;
using distlock::testing::ttl;

namespace {

struct RenewalRetry : distlock::testing::ManualMemoryTest {};

TEST_F(RenewalRetry, AFailedRenewalIsNotResentAtTheSameInstant) {
  auto c = client();
  const auto engine = distlock::detail::engine_of(c);
  auto lease = c.acquire("r", ttl(3s));  // renew_interval 1 s: retries 250 ms apart
  clock->advance(1s);
  store->fail_next(1000);
  engine->tick();
  const int after_first = store->renew_calls();
  ASSERT_GE(after_first, 1);
  // No time has passed on the engine's clock: nothing may be resent.
  for (int i = 0; i < 5; ++i) engine->tick();
  EXPECT_EQ(store->renew_calls(), after_first) << "a failed renewal is resent without any pause";
  // The retry does come, a quarter interval later, and succeeds once the server does.
  store->fail_next(0);
  clock->advance(250ms);
  engine->tick();
  EXPECT_EQ(store->renew_calls(), after_first + 1);
  EXPECT_TRUE(lease.owns());
}

// The background renewer against a server that keeps failing: the number of renewal
// round trips in a bounded real-time window stays near window / retry period instead
// of as many as the loop can send.
TEST(RenewalRetryRealTime, TheRenewerDoesNotSpinOnAFailingServer) {
  const std::string store_name = distlock::testing::fresh_store_name("retry");
  auto store = distlock::detail::MemoryStore::named(store_name);
  distlock::ClientOptions o;
  o.logger = [](distlock::LogLevel, std::string_view) {};
  auto c = distlock::connect("memory://" + store_name, o);
  distlock::LockOptions lo;
  lo.ttl = 4s;             // renew_interval 1333 ms: retries every 333 ms
  lo.safety_margin = 0ms;  // deadline 4 s after the grant
  auto lease = c.acquire("s", lo);
  store->fail_next(1000000);
  const int before = store->renew_calls();
  // The first renewal falls due ~1333 ms - 333 ms after the grant; watch 2 s on the
  // steady clock: at most ~4 retries are expected, 40 is generous.
  std::this_thread::sleep_for(2s);
  const int calls = store->renew_calls() - before;
  store->fail_next(0);
  EXPECT_LE(calls, 40) << "renewal round trips in 2 s against a failing server";
}

}  // namespace
