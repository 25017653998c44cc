#include <chrono>
#include <thread>

#include "distlock/ids.hpp"

namespace distlock::ids {

namespace {

class SystemWallClock final : public WallClock {
 public:
  std::int64_t now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  void sleep_until_ms(std::int64_t target_ms) const override {
    const std::int64_t ahead = target_ms - now_ms();
    if (ahead <= 0) return;
    // The common wait is "until the next millisecond" (sequence exhausted): a sleep
    // would overshoot it by the scheduler's slack, so spin politely instead.
    if (ahead <= 2) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ahead - 1));
  }
};

}  // namespace

std::shared_ptr<WallClock> system_wall_clock() {
  static const std::shared_ptr<WallClock> clock = std::make_shared<SystemWallClock>();
  return clock;
}

}  // namespace distlock::ids
