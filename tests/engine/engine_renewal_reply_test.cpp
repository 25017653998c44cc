// A renewal reply read before the local deadline but applied after it (the renewer
// thread preempted, or waiting for the lease table's lock, between reading the reply's
// time and applying it). owns() compares the clock with the deadline without a lock:
// in between it has already answered false, and the holder may have acted on that. A
// loss once seen stays a loss: the late reply must not extend the deadline back to
// life; the lease is declared lost (stop token) instead.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "fake/memory_backend.hpp"
#include "support/forwarding_backend.hpp"
#include "support/manual_clock.hpp"
#include "support/memory_fixture.hpp"

using namespace std::chrono_literals;
using distlock::Millis;

namespace {

// A manual clock that, once armed, moves forward by `step` right after the next
// reading (that reading still answers the time before the step), then calls `after`.
class SteppingClock final : public distlock::testing::TickClock {
 public:
  time_point now() const override {
    const auto t = time_point(duration(ticks_.load()));
    if (armed_.exchange(false)) {
      ticks_.fetch_add(step_.count());
      if (after_) after_();
    }
    return t;
  }
  void advance(duration d) { ticks_.fetch_add(d.count()); }
  // Not thread-safe with now(): the test arms it from the only thread that reads it.
  void arm(duration step, std::function<void()> after) {
    step_ = step;
    after_ = std::move(after);
    armed_ = true;
  }

 private:
  mutable std::atomic<bool> armed_{false};
  duration step_{};
  std::function<void()> after_;
};

// Arms the clock when a renewal's answer comes back: the engine's next reading (the
// reply's time) is before the step, every later one after it.
class ArmsOnRenew final : public distlock::testing::ForwardingBackend {
 public:
  ArmsOnRenew(std::unique_ptr<distlock::detail::Backend> inner, std::function<void()> on_renewed)
      : ForwardingBackend(std::move(inner)), on_renewed_(std::move(on_renewed)) {}
  void renew(std::span<const distlock::detail::RenewItem> items, std::span<distlock::detail::RenewStatus> out,
             distlock::detail::Error& ec) override {
    ForwardingBackend::renew(items, out, ec);
    if (on_renewed_) on_renewed_();
  }

 private:
  std::function<void()> on_renewed_;
};

TEST(RenewalReply, AReplyAppliedAfterTheDeadlineOwnsAnsweredFalseForIsALoss) {
  const std::string store_name = distlock::testing::fresh_store_name("reply");
  auto store = distlock::detail::MemoryStore::named(store_name);
  auto clock = std::make_shared<SteppingClock>();
  distlock::ClientOptions o;
  o.clock = clock;
  o.background_renewal = false;
  o.logger = [](distlock::LogLevel, std::string_view) {};
  std::shared_ptr<distlock::detail::HeldLock> held;
  bool owns_seen_false = false;
  std::function<void()> on_renewed;
  auto c = distlock::testing::client_through<ArmsOnRenew>(store_name, o, nullptr, [&] { on_renewed(); });
  const auto engine = distlock::detail::engine_of(c);
  auto lease = c.acquire("p", distlock::testing::ttl(3s));
  held = engine->held_by_this_thread("p");
  ASSERT_NE(held, nullptr);
  const auto deadline = held->deadline();
  clock->advance(2s);  // the renewal is due; 1 s or less is left before the deadline
  on_renewed = [&] {
    // The reply is read at T (before the deadline); right after, time is 1 ms past
    // the deadline, and a holder asking owns() then is told false.
    const auto t = clock->now();  // not armed yet: T
    clock->arm(deadline - t + 1ms, [&] { owns_seen_false = !held->owns(); });
  };
  engine->tick();
  ASSERT_TRUE(owns_seen_false) << "the scenario did not happen: owns() was not false between reply and apply";
  EXPECT_FALSE(lease.owns()) << "owns() answered false, then true again: the late reply revived the lease";
  EXPECT_TRUE(lease.stop_token().stop_requested()) << "owns() answered false with no stop signal";
}

}  // namespace
