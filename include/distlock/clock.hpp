// distlock/clock.hpp — the steady clock the lock engine reads, made injectable.
//
// Every deadline in distlock (lease validity, wait deadlines, renewal ticks) is
// taken on a monotonic clock that also counts host suspend (CLOCK_BOOTTIME), never
// on wall time. Production code uses
// `system_steady_clock()`; tests inject a manual clock to move time by hand.
//
// Thread-safety: implementations must be safe to call from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "distlock/export.hpp"

namespace distlock {

class DISTLOCK_EXPORT Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;
  virtual time_point now() const = 0;
  /// Blocks on `cv` (with `lock` held on entry and exit) until notified or until
  /// `deadline` on this clock. Spurious returns are allowed; callers loop.
  virtual void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          time_point deadline) = 0;
};

/// The process-wide monotonic clock for lease deadlines: CLOCK_BOOTTIME (monotonic,
/// and counting through host suspend), in std::chrono::steady_clock's time_point
/// type. Do not compare its readings with std::chrono::steady_clock::now().
DISTLOCK_EXPORT std::shared_ptr<Clock> system_steady_clock();

}  // namespace distlock
