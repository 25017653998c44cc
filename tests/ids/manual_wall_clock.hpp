// A WallClock that moves only when a test sets it (or when a generator sleeps on it),
// so clock rollbacks and frozen milliseconds can be injected.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>

#include "distlock/ids.hpp"

namespace distlock::testing {

class ManualWallClock final : public ids::WallClock {
 public:
  explicit ManualWallClock(std::int64_t start_ms) : ms_(start_ms) {}

  std::int64_t now_ms() const override { return ms_.load(); }

  /// Records the request; when `advance_on_sleep` is on, jumps forward to the target
  /// (a sleeping generator then finds the time it waited for), else yields.
  void sleep_until_ms(std::int64_t target_ms) const override {
    sleeps_.fetch_add(1);
    last_target_.store(target_ms);
    if (advance_on_sleep_.load()) {
      std::int64_t cur = ms_.load();
      while (cur < target_ms && !ms_.compare_exchange_weak(cur, target_ms)) {
      }
    } else {
      std::this_thread::yield();
    }
  }

  void set(std::int64_t ms) { ms_.store(ms); }
  void advance(std::int64_t ms) { ms_.fetch_add(ms); }
  void set_advance_on_sleep(bool on) { advance_on_sleep_.store(on); }
  int sleeps() const { return sleeps_.load(); }
  std::int64_t last_sleep_target() const { return last_target_.load(); }

 private:
  mutable std::atomic<std::int64_t> ms_;
  std::atomic<bool> advance_on_sleep_{true};
  mutable std::atomic<int> sleeps_{0};
  mutable std::atomic<std::int64_t> last_target_{0};
};

}  // namespace distlock::testing
