#include "engine/renewer.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

namespace distlock::detail {

Renewer::Renewer(std::shared_ptr<Clock> clock, std::function<Clock::time_point()> renew_round,
                 std::function<Clock::time_point()> watchdog_round)
    : clock_(std::move(clock)),
      renew_round_(std::move(renew_round)),
      watchdog_round_(std::move(watchdog_round)) {}

void Renewer::start() {
  std::call_once(started_, [this] {
    renewer_thread_ = std::jthread([this](std::stop_token st) { run(st, false); });
    watchdog_thread_ = std::jthread([this](std::stop_token st) { run(st, true); });
  });
}

void Renewer::stop_and_join() {
  for (std::jthread* t : {&renewer_thread_, &watchdog_thread_}) {
    if (!t->joinable()) continue;
    t->request_stop();
    {
      LockGuard lk(mu_);
      renewer_.cv.notify_all();
      watchdog_.cv.notify_all();
    }
    t->join();
  }
}

void Renewer::earlier(Sleeper& s, Clock::time_point at) noexcept {
  if (s.wake == Clock::time_point::min()) {
    s.rescan = true;  // awake: its round may predate the change
  } else if (at < s.wake) {
    s.cv.notify_all();
  }
}

void Renewer::renew_earlier(Clock::time_point at) noexcept {
  LockGuard lk(mu_);
  earlier(renewer_, at);
}

void Renewer::deadline_earlier(Clock::time_point deadline) noexcept {
  LockGuard lk(mu_);
  earlier(watchdog_, deadline);
}

void Renewer::run(std::stop_token st, bool watchdog) {
  const std::function<Clock::time_point()>& round = watchdog ? watchdog_round_ : renew_round_;
  while (!st.stop_requested()) {
    const Clock::time_point next = round();
    UniqueLock lk(mu_);
    if (st.stop_requested()) break;
    if (std::exchange(sleeper(watchdog).rescan, false)) continue;  // the schedule changed after the round
    const Clock::time_point wake = std::min(next, clock_->now() + std::chrono::seconds(1));
    sleeper(watchdog).wake = wake;
    clock_->wait_until(sleeper(watchdog).cv, lk.native(), wake);
    sleeper(watchdog).wake = Clock::time_point::min();
  }
}

bool Renewer::on_thread() const noexcept {
  const auto self = std::this_thread::get_id();
  return (renewer_thread_.joinable() && renewer_thread_.get_id() == self) ||
         (watchdog_thread_.joinable() && watchdog_thread_.get_id() == self);
}

}  // namespace distlock::detail
