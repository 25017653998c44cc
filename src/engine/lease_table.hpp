// The lease table: this client's held leases (by name and thread owner), the
// acquisitions under way (with the losses and validity changes reported while they
// were), and the validity cap. It owns each lease's schedule (HeldLock's fields
// guarded by lease_table_state: validity, renewal interval, next renewal, renewal in
// flight, last confirmation, the hold it displaced) and marks a lease released. Its mutex is never held
// across a backend call, a clock wait, user code or a loss signal; only the renewer's (a leaf) nests inside
// it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distlock/clock.hpp"
#include "engine/backend.hpp"
#include "engine/lease.hpp"
#include "engine/renewer.hpp"
#include "engine/role.hpp"
#include "engine/thread_annotations.hpp"

namespace distlock::detail {

/// A time that never comes: no deadline (a wait without a bound, a lease with no cap).
inline constexpr Clock::time_point kNever = Clock::time_point::max();

class LeaseTable {
 public:
  LeaseTable(std::shared_ptr<Clock> clock, bool needs_renewal, Renewer& renewer)
      : clock_(std::move(clock)), needs_renewal_(needs_renewal), renewer_(renewer) {}

  /// The table's key of a lease: (name, thread owner), views into the lease's own strings
  /// when stored, into the caller's when looking one up (no string is built).
  using Key = std::pair<std::string_view, std::string_view>;
  static Key key(std::string_view name, std::string_view thread_owner) noexcept {
    return {name, thread_owner};
  }

  // Acquisition: reenter, or begin → schedule → record (or abandon).
  /// The calling thread's hold under `key` re-entered (hold count + 1; a nearer
  /// `max_hold` brings its hold limit nearer) when it is a Mutex hold that still owns
  /// and `by_thread`; else nullptr, with `expired` set to that hold when it is past its
  /// local deadline but not yet declared lost (the caller declares it).
  std::shared_ptr<HeldLock> reenter(Key key, bool by_thread, std::optional<Millis> max_hold,
                                    std::shared_ptr<HeldLock>& expired) DISTLOCK_EXCLUDES(mu_);
  /// An acquisition by `owner` is under way: losses reported for it are kept. The table
  /// keeps a view of `owner`, which must stay in place until record() or abandon().
  void begin(const std::string& owner) DISTLOCK_EXCLUDES(mu_);
  /// It failed. True when `key` (if given) names a hold still listed, not released
  /// and not lost (the calling thread holds the name itself).
  bool abandon(const std::string& owner, const Key* key) DISTLOCK_EXCLUDES(mu_);
  /// A new lease's schedule, from the send time of its granted request and the
  /// validity granted (before it is recorded).
  void schedule(HeldLock& h, Clock::time_point sent, Millis validity) DISTLOCK_EXCLUDES(mu_);
  struct Recorded {
    std::shared_ptr<HeldLock> replaced;  // this thread's earlier hold, past its deadline: lost
    bool session_gone = false;           // a session loss raced the grant
    bool lease_gone = false;             // a loss of this lease was reported before it was recorded
  };
  /// Records the lease granted to `owner` (held->owner) under key(held->name, its
  /// thread owner) (the caller declares the losses).
  Recorded record(const std::shared_ptr<HeldLock>& held, const std::string& owner,
                  std::uint64_t epoch_at_send) DISTLOCK_EXCLUDES(mu_);
  /// Bumped by every session loss: a grant answered across a bump may belong to the
  /// session that ended.
  std::uint64_t session_epoch() const noexcept { return session_epoch_.load(std::memory_order_acquire); }

  std::shared_ptr<HeldLock> find(Key key) const DISTLOCK_EXCLUDES(mu_);
  /// The hold under `key`, or the first one it displaced (in turn), that was taken by
  /// a Mutex (reentrant) and is not released; nullptr if none.
  std::shared_ptr<HeldLock> find_reentrant(Key key) const DISTLOCK_EXCLUDES(mu_);
  enum class Drop { not_held, still_held, dropped };
  /// Drops one hold of `held`; at zero it is released and leaves the table (the
  /// outer, lost hold it displaced is put back).
  Drop drop(const std::shared_ptr<HeldLock>& held) DISTLOCK_EXCLUDES(mu_);
  /// Empties the table (the engine's destructor).
  std::vector<std::shared_ptr<HeldLock>> take_all() DISTLOCK_EXCLUDES(mu_);
  std::size_t size() const DISTLOCK_EXCLUDES(mu_);

  // Losses reported by the backend (the caller declares them).
  /// Every lease, the session epoch bumped.
  std::vector<std::shared_ptr<HeldLock>> session_lost() DISTLOCK_EXCLUDES(mu_);
  /// The lease of `owner` on `name`, or nullptr (kept for its acquisition if under way).
  std::shared_ptr<HeldLock> lease_lost(std::string_view name, std::string_view owner) noexcept
      DISTLOCK_EXCLUDES(mu_);
  /// No lease has a validity above `validity` from now on.
  void cap_validity(Millis validity) noexcept DISTLOCK_EXCLUDES(mu_);

  // Renewals and deadlines (the renewer's and the watchdog's rounds).
  /// Leases past their local deadline at `now`, not yet lost; `next` gets the
  /// nearest deadline of the others.
  std::vector<std::shared_ptr<HeldLock>> expired(Clock::time_point now, Clock::time_point& next) const
      DISTLOCK_EXCLUDES(mu_);
  /// Leases whose renewal falls due within a quarter interval of `now` (all of them
  /// that may be renewed with `all`), marked in flight.
  std::vector<std::shared_ptr<HeldLock>> take_due(Clock::time_point now, bool all) DISTLOCK_EXCLUDES(mu_);
  struct Renewed {
    std::size_t renewed = 0;
    std::vector<std::shared_ptr<HeldLock>> refused, late;
  };
  /// Applies the answers of a renewal batch sent at `sent`, answered at `replied`.
  Renewed apply_renewals(std::span<const std::shared_ptr<HeldLock>> due, std::span<const RenewStatus> out,
                         Clock::time_point sent, Clock::time_point replied) DISTLOCK_EXCLUDES(mu_);
  /// When the next renewal falls due (at the latest `cap`).
  Clock::time_point next_renewal(Clock::time_point cap) const DISTLOCK_EXCLUDES(mu_);

 private:
  struct InflightLosses {
    std::vector<std::string> names;  // the names on_lease_lost reported lost for the owner
    bool all = false;                // a name could not be recorded
    // The smallest validity on_validity_changed reported while the acquisition was
    // under way (0: none): its grant may have been counted before a lower value that
    // a later, higher one replaced in validity_cap_.
    Millis min_cap{0};
  };
  /// Shortens `h` to `cap` (validity, deadline, renewal interval).
  void cap(HeldLock& h, Millis cap) DISTLOCK_REQUIRES(mu_, lease_table_state);
  using Held = std::map<Key, std::shared_ptr<HeldLock>>;
  /// Puts `h` under `it`, its key then viewing h's own name and owner (the lease it
  /// replaces there, whose strings the key viewed, may go away).
  void set(Held::iterator it, std::shared_ptr<HeldLock> h) DISTLOCK_REQUIRES(mu_);

  const std::shared_ptr<Clock> clock_;
  const bool needs_renewal_;
  Renewer& renewer_;
  mutable AnnotatedMutex mu_;
  // Key: key(name, thread owner), viewing the name and owner of the lease it maps to.
  Held held_ DISTLOCK_GUARDED_BY(mu_);
  // Owners of acquisitions under way (not yet in held_) → what was reported meanwhile.
  // Views of the acquiring call's owner string (begin() to record() or abandon()).
  std::map<std::string_view, InflightLosses> inflight_ DISTLOCK_GUARDED_BY(mu_);
  // The longest validity a lease may have from now on (on_validity_changed), 0 for
  // no limit beyond the backend's answers. Applied to every held lease and to each
  // lease as it is recorded, so a change racing a grant is never missed.
  Millis validity_cap_ DISTLOCK_GUARDED_BY(mu_){0};
  // Bumped under mu_ (read without it): see session_epoch().
  std::atomic<std::uint64_t> session_epoch_{0};
};

}  // namespace distlock::detail
