#include "distlock/clock.hpp"

namespace distlock {

namespace {
class SteadyClock final : public Clock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
  void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                  time_point deadline) override {
    cv.wait_until(lock, deadline);
  }
};
}  // namespace

std::shared_ptr<Clock> system_steady_clock() {
  static const std::shared_ptr<Clock> instance = std::make_shared<SteadyClock>();
  return instance;
}

}  // namespace distlock
