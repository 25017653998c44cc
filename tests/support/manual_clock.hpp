// A Clock that moves only when a test advances it.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "distlock/clock.hpp"

namespace distlock::testing {

class ManualClock final : public Clock {
 public:
  time_point now() const override { return time_point(duration(ticks_.load())); }
  void advance(duration d) { ticks_.fetch_add(d.count()); }
  void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                  time_point deadline) override {
    // Real time is irrelevant here; wake often enough to observe advance().
    if (now() >= deadline) return;
    cv.wait_for(lock, std::chrono::milliseconds(1));
  }

 private:
  std::atomic<duration::rep> ticks_{std::chrono::duration_cast<duration>(std::chrono::hours(1000)).count()};
};

}  // namespace distlock::testing
