// A Clock that moves only when a test advances it (ManualClock, on TickClock: a count of ticks
// a test's own clock may also move), and advance_until(clock, done), which moves it on while a
// waiter on another thread runs against it.
// Thread-safety: a ManualClock may be read and advanced from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "distlock/clock.hpp"

namespace distlock::testing {

/// A Clock on a count of ticks of its own, from 1,000 h on: no real time passes on it. Its
/// wait_until wakes every real millisecond, so that a waiter sees the count moved by another
/// thread. ManualClock moves it by advance(); a test's own clock may move it otherwise.
class TickClock : public Clock {
 public:
  void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                  time_point deadline) override {
    // Real time is irrelevant here; wake often enough to observe the count move.
    if (now() >= deadline) return;
    cv.wait_for(lock, std::chrono::milliseconds(1));
  }

 protected:
  mutable std::atomic<duration::rep> ticks_{
      std::chrono::duration_cast<duration>(std::chrono::hours(1000)).count()};
};

class ManualClock final : public TickClock {
 public:
  time_point now() const override { return time_point(duration(ticks_.load())); }
  void advance(duration d) { ticks_.fetch_add(d.count()); }
};

/// Moves `clock` on by 10 ms every real millisecond until `done` is set or 5,000 steps (50 s of
/// the clock's time, about 5 s real) have passed: for a waiter on another thread whose deadline
/// is on `clock`. Returns how far the clock moved.
inline std::chrono::milliseconds advance_until(ManualClock& clock, const std::atomic<bool>& done) {
  std::chrono::milliseconds advanced{0};
  for (int i = 0; i < 5000 && !done; ++i) {
    clock.advance(std::chrono::milliseconds(10));
    advanced += std::chrono::milliseconds(10);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return advanced;
}

}  // namespace distlock::testing
