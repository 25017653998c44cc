// The wait registry: one wait slot per name somebody of this client waits on (an
// acquisition, a NameWatch), with the name's change generation (bumped by every change
// notification), its waiters, and whether the backend delivers notifications for it
// (the name's watch). A watch outlives its last waiter for a while (idle, bounded in
// number and age, dropped by sweep()): under contention the same name is waited for
// again at once, and subscribing again costs round trips on the hand-off path.
// Its mutex is never held across a backend call, user code or another part's lock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "distlock/clock.hpp"
#include "engine/backend.hpp"
#include "engine/log.hpp"
#include "engine/role.hpp"
#include "engine/thread_annotations.hpp"

namespace distlock::detail {

class WaitRegistry {
 public:
  static constexpr std::chrono::seconds kIdleWatchKeep{10};
  static constexpr int kMaxIdleWatches = 256;
  /// After a failed watch: how soon a waiter of that name may subscribe again.
  static constexpr Millis kWatchRetry{1000};
  /// Re-check period of a waiter whose name cannot be watched (degraded mode).
  static constexpr Millis kDegradedRecheck{250};

  /// What the registry's lock guards in the slots it hands out (engine/role.hpp).
  static inline Role slot_state;
  struct Slot {
    std::uint64_t generation DISTLOCK_GUARDED_BY(slot_state) = 0;
    int waiters DISTLOCK_GUARDED_BY(slot_state) = 0;
    // A waiter is subscribing; the others wait for it to finish.
    bool watch_pending DISTLOCK_GUARDED_BY(slot_state) = false;
    bool watched DISTLOCK_GUARDED_BY(slot_state) = false;  // the backend delivers on_change for it
    // After a failed watch: when a waiter may try again.
    Clock::time_point watch_retry_at DISTLOCK_GUARDED_BY(slot_state){};
    Clock::time_point idle_since DISTLOCK_GUARDED_BY(slot_state){};
    std::condition_variable cv;
    // Waiters on several names at once (wait_any) wait on a condition variable of their
    // own, registered here: notify() wakes them too.
    std::vector<std::condition_variable*> listeners DISTLOCK_GUARDED_BY(slot_state);
  };

  /// One name a waiter on several names waits on (the engine's acquire loop).
  struct Entry {
    std::string name;
    std::shared_ptr<Slot> slot;    // joined on the first wait
    std::uint64_t generation = 0;  // the slot's generation before the last try
    bool watched = false;          // notifications for it were live at the last look
    bool try_now = true;           // to be tried at the next round
  };

  WaitRegistry(Backend& backend, std::shared_ptr<Clock> clock, Logger& log)
      : backend_(backend), clock_(std::move(clock)), log_(log) {}

  /// Joins (making if needed) the slot of `name`; leave() once per join().
  std::shared_ptr<Slot> join(const std::string& name) DISTLOCK_EXCLUDES(mu_);
  void leave(const std::string& name) DISTLOCK_EXCLUDES(mu_);
  /// Makes sure `name` is watched before the caller re-checks: subscribes if nobody
  /// is, or waits (up to `until`, or until `cancel` is stopped) for the waiter that is
  /// subscribing. Returns whether notifications are live; false means the caller falls
  /// back to bounded re-checks (or, cancelled, ends its wait).
  bool ensure_watched(std::string_view name, const std::shared_ptr<Slot>& slot, Clock::time_point until,
                      const std::stop_token& cancel = {}) DISTLOCK_EXCLUDES(mu_);
  std::uint64_t generation(const Slot& slot) const DISTLOCK_EXCLUDES(mu_);
  /// Waits until the slot's generation != seen or `until`; true when it changed.
  bool wait(Slot& slot, std::uint64_t seen, Clock::time_point until) DISTLOCK_EXCLUDES(mu_);
  /// A change of `name`: its generation bumped, its waiters woken.
  void notify(std::string_view name) noexcept DISTLOCK_EXCLUDES(mu_);
  /// Drops subscriptions nobody has waited on for kIdleWatchKeep (all of them if `all`).
  void sweep(bool all) noexcept DISTLOCK_EXCLUDES(mu_);
  /// Subscriptions kept after their last waiter left.
  std::size_t idle() const DISTLOCK_EXCLUDES(mu_);

  // A waiter on several names at once, through one condition variable `wake`:
  /// Joins e's slot (once) and registers `wake` there; records its generation.
  void join_listening(Entry& e, std::condition_variable* wake) DISTLOCK_EXCLUDES(mu_);
  /// Undoes join_listening (nothing if e never joined).
  void leave_listening(Entry& e, std::condition_variable* wake) DISTLOCK_EXCLUDES(mu_);
  /// Records the generation of every joined entry about to be tried (try_now): a
  /// change after this is not missed.
  void snapshot(std::span<Entry* const> entries) DISTLOCK_EXCLUDES(mu_);
  /// Wakes whoever waits on the slots of `entries` (a cancel).
  void wake_slots(std::span<Entry* const> entries) noexcept DISTLOCK_EXCLUDES(mu_);
  /// Waits on `wake` until a generation of `waited` changes, `cancel` is stopped or
  /// `until`; then marks what changed (or lost its watch) try_now, and what lost its
  /// watch !watched. Returns whether something changed.
  bool wait_any(std::span<Entry* const> waited, std::condition_variable& wake, const std::stop_token& cancel,
                Clock::time_point until) DISTLOCK_EXCLUDES(mu_);

 private:
  Backend& backend_;
  const std::shared_ptr<Clock> clock_;
  Logger& log_;
  std::atomic<bool> warned_watch_failure_{false};
  mutable AnnotatedMutex mu_;
  std::map<std::string, std::shared_ptr<Slot>, std::less<>> slots_ DISTLOCK_GUARDED_BY(mu_);
  int idle_watches_ DISTLOCK_GUARDED_BY(mu_) = 0;  // slots with no waiter kept subscribed
};

/// Re-check interval while waiting when no notification arrives: capped by the
/// holder's remaining TTL (a lost notification cannot stall a waiter longer than
/// the lease it waits for), jittered so waiters do not re-check in lockstep.
Millis recheck_delay(std::optional<Millis> holder_ttl, Millis ttl);

}  // namespace distlock::detail
