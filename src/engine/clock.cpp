#include "distlock/clock.hpp"

#include <time.h>

#include <algorithm>

namespace distlock {

namespace {
// Lease deadlines are taken on CLOCK_BOOTTIME: like CLOCK_MONOTONIC it never steps,
// but it keeps counting while the host is suspended. A lease's server-side TTL runs
// on during a suspend, so a holder resumed from one must see that time as passed
// (CLOCK_MONOTONIC, std::chrono::steady_clock's clock, would not).
class BootClock final : public Clock {
 public:
  time_point now() const override {
    timespec ts{};
    ::clock_gettime(CLOCK_BOOTTIME, &ts);
    return time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
  }
  void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                  time_point deadline) override {
    // The condition variable waits on CLOCK_MONOTONIC, so the wait is relative and
    // bounded; callers re-read now() and loop. A suspend makes the wait end late (the
    // monotonic clock stops meanwhile), by at most the rest of `left`: callers that
    // must not overrun bound their waits (the engine's watchdog waits at most 1 s).
    const auto left = deadline - now();
    if (left <= duration::zero()) return;
    cv.wait_for(lock, std::min<duration>(left, std::chrono::minutes(10)));
  }
};
}  // namespace

std::shared_ptr<Clock> system_steady_clock() {
  static const std::shared_ptr<Clock> instance = std::make_shared<BootClock>();
  return instance;
}

}  // namespace distlock
