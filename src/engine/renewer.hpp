// The engine's two background threads and when they wake:
// - the renewer runs renewal rounds (Engine::renew_round: a batch of the renewals due,
//   then the time the next one falls due);
// - the watchdog runs watchdog rounds (Engine::watchdog_round: losses at local
//   deadlines and idle watches dropped, then the next deadline), on a thread of its
//   own so a renewal blocked on a hung server cannot delay a stop signal.
// Whoever changes the schedule (a lease recorded, a validity lowered, a hold limit
// brought nearer) calls renew_earlier/deadline_earlier after the change is visible to
// the next round. A thread that is asleep is woken if the new time comes before its
// wake time; a thread that is awake (its round may predate the change) runs another
// round before it sleeps. So no change is missed, and an uncontended acquire costs no
// context switch.
// Its mutex is a leaf: taken under the engine's lease mutex, never the other way round.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>

#include "distlock/clock.hpp"
#include "engine/thread_annotations.hpp"

namespace distlock::detail {

class Renewer {
 public:
  /// `renew_round` and `watchdog_round` each return the time their thread should next
  /// run a round (capped by the renewer at one second from now).
  Renewer(std::shared_ptr<Clock> clock, std::function<Clock::time_point()> renew_round,
          std::function<Clock::time_point()> watchdog_round);
  /// stop_and_join() must have run (the engine's destructor calls it).
  ~Renewer() = default;
  Renewer(const Renewer&) = delete;
  Renewer& operator=(const Renewer&) = delete;

  /// Starts both threads, once (later calls do nothing).
  void start();
  /// Stops and joins both threads (the round under way ends first).
  void stop_and_join() DISTLOCK_EXCLUDES(mu_);
  /// A renewal may now fall due at `at`, earlier than planned.
  void renew_earlier(Clock::time_point at) noexcept DISTLOCK_EXCLUDES(mu_);
  /// A local deadline may now come at `deadline`, earlier than planned.
  void deadline_earlier(Clock::time_point deadline) noexcept DISTLOCK_EXCLUDES(mu_);
  /// True on the renewer or the watchdog thread.
  bool on_thread() const noexcept;

 private:
  struct Sleeper {
    std::condition_variable cv;
    // When the sleeping thread wakes next; min() while it is awake.
    Clock::time_point wake = Clock::time_point::min();
    // The schedule changed while it was awake: run another round before sleeping.
    bool rescan = false;
  };
  void earlier(Sleeper& s, Clock::time_point at) noexcept DISTLOCK_REQUIRES(mu_);
  Sleeper& sleeper(bool watchdog) DISTLOCK_REQUIRES(mu_) { return watchdog ? watchdog_ : renewer_; }
  void run(std::stop_token st, bool watchdog) DISTLOCK_EXCLUDES(mu_);

  const std::shared_ptr<Clock> clock_;
  const std::function<Clock::time_point()> renew_round_;
  const std::function<Clock::time_point()> watchdog_round_;
  std::once_flag started_;
  mutable AnnotatedMutex mu_;
  Sleeper renewer_ DISTLOCK_GUARDED_BY(mu_);
  Sleeper watchdog_ DISTLOCK_GUARDED_BY(mu_);
  std::jthread renewer_thread_;
  std::jthread watchdog_thread_;
};

}  // namespace distlock::detail
