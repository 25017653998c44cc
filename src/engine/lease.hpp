// One lease as the engine keeps it (HeldLock): what the grant said, its local deadline
// and hold limit, and its loss (reason, stop token, internal signals, user callbacks).
// Shared by the engine's parts (engine.hpp, lease_table, renewer) and the primitives.
#pragma once

#include <atomic>
#include <charconv>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distlock/client.hpp"
#include "distlock/clock.hpp"
#include "distlock/options.hpp"
#include "engine/backend.hpp"
#include "engine/metrics.hpp"
#include "engine/role.hpp"
#include "engine/thread_annotations.hpp"
#include "engine/trace_spans.hpp"

namespace distlock::detail {

/// What the lease table's lock guards in the leases it keeps (engine/role.hpp).
inline Role lease_table_state;

struct HeldLock {
  std::string name;
  /// Unique per acquisition: "<client id>:<thread seq>.<acquisition seq>". A later
  /// acquisition by the same thread is another owner on the server, so a late
  /// release, renewal or clean-up of this one can never touch that one.
  std::string owner;
  std::uint64_t fork_gen = 0;  // fork_generation() when acquired; a child never owns it
  bool reentrant = false;      // taken by a Mutex: its thread may re-enter it
  std::uint64_t token = 0;
  bool has_token = false;
  LockOptions opts;  // as asked for (renew_interval below is the one in force)
  std::shared_ptr<Clock> clock;

  // The lease's schedule, kept by the lease table (engine/lease_table.hpp).
  // Lease validity from a request's send time (see AcquireResult), lowered by a cap.
  Millis validity DISTLOCK_GUARDED_BY(lease_table_state){};
  Millis renew_interval DISTLOCK_GUARDED_BY(lease_table_state){};
  // Changed under the table's lock; read without it (an atomic).
  std::atomic<int> hold_count{0};
  // Set under the table's lock; read without it (Lease::owns(), an atomic).
  std::atomic<bool> released{false};
  Clock::time_point next_renew DISTLOCK_GUARDED_BY(lease_table_state){};
  bool renew_in_flight DISTLOCK_GUARDED_BY(lease_table_state) = false;
  // Send time of the request that last confirmed the lease (grant or renewal): the
  // deadline is confirmed_sent + validity - safety_margin, capped by the hold limit.
  Clock::time_point confirmed_sent DISTLOCK_GUARDED_BY(lease_table_state){};
  // grant (send time of the granted request) + opts.max_hold; max() when unbounded.
  // The local deadline never passes it; renewals stop once the deadline reaches it.
  // Only ever lowered (a reentrant acquisition with a nearer max_hold), under the
  // lease table's lock; read without it (hold_limit()).
  std::atomic<std::int64_t> hold_limit_ns{Clock::time_point::max().time_since_epoch().count()};
  // A lost hold of the same thread and name that this acquisition replaced in the
  // engine's map before the thread unlocked it (a nested re-lock after a loss); put
  // back when this one is released so the outer unlock still finds it.
  std::shared_ptr<HeldLock> displaced DISTLOCK_GUARDED_BY(lease_table_state);

  // Metrics (null when the client keeps none): set before the lease is published.
  MetricsSeries* metrics = nullptr;
  Clock::time_point granted_at{};
  std::atomic<bool> hold_observed{false};  // its hold time is counted once (release or loss)
  // Tracing (null when the client has no tracer): set before the lease is published.
  std::unique_ptr<HoldTrace> trace;

  // Read without a lock (owns(), remaining()).
  std::atomic<std::int64_t> deadline_ns{0};  // steady-clock ticks since epoch
  std::atomic<bool> lost{false};
  std::stop_source stop;
  // The hand-back of a lost lease to the backend (Backend::forget) runs once, by
  // whoever comes first: the engine's hand-back thread, release(), or ~Engine.
  std::once_flag forget_once;
  // Why it was lost (set once, before `lost`, under callbacks_mu).
  mutable AnnotatedMutex callbacks_mu;
  std::optional<LossReason> loss_reason DISTLOCK_GUARDED_BY(callbacks_mu);
  std::string loss_detail DISTLOCK_GUARDED_BY(callbacks_mu);
  // The reason text of a revoke (loss_reason revoked), set with it.
  std::optional<std::string> revoke_reason DISTLOCK_GUARDED_BY(callbacks_mu);

  // User callbacks (Lease::on_lost): run by the engine's event thread after the loss.
  std::vector<std::function<void()>> callbacks DISTLOCK_GUARDED_BY(callbacks_mu);
  bool callbacks_fired DISTLOCK_GUARDED_BY(callbacks_mu) = false;
  // Engine-internal loss signals (a read-write lease's combined stop token): run on
  // the thread that detects the loss, right after `stop`, never behind user code.
  // Short and non-blocking by contract.
  std::vector<std::function<void()>> signals DISTLOCK_GUARDED_BY(callbacks_mu);
  bool signals_fired DISTLOCK_GUARDED_BY(callbacks_mu) = false;

  Clock::time_point deadline() const noexcept {
    return Clock::time_point(Clock::duration(deadline_ns.load(std::memory_order_acquire)));
  }
  void set_deadline(Clock::time_point tp) noexcept {
    deadline_ns.store(tp.time_since_epoch().count(), std::memory_order_release);
  }
  Clock::time_point hold_limit() const noexcept {
    return Clock::time_point(Clock::duration(hold_limit_ns.load(std::memory_order_acquire)));
  }
  void set_hold_limit(Clock::time_point tp) noexcept {
    hold_limit_ns.store(tp.time_since_epoch().count(), std::memory_order_release);
  }
  bool owns() const noexcept;
  /// The reason a loss at the local deadline has: max_hold when the deadline is the
  /// hold limit, else local_deadline.
  LossReason expiry_reason() const noexcept;
  /// Public reason and text (none/empty while held).
  distlock::LossReason public_reason() const noexcept;
  std::string public_detail() const;
};

/// The owner id of the calling thread within a client: "<client id>:<thread seq>".
/// Reentrancy is counted per thread owner; the server sees `<thread owner>.<n>`.
std::string owner_for_this_thread(const std::string& client_id);
/// The calling thread's sequence number in this process (the <thread seq> above).
std::uint64_t this_thread_seq() noexcept;
/// Appends `n` in decimal to `out`.
inline void append_decimal(std::string& out, std::uint64_t n) {
  char buf[20];
  const auto end = std::to_chars(buf, buf + sizeof buf, n).ptr;
  out.append(buf, static_cast<std::size_t>(end - buf));
}
/// The thread part of an acquisition owner: the holder description (after the first
/// '|') dropped, then everything before the last '.'.
std::string_view thread_owner_of(std::string_view owner) noexcept;
/// Splits a stored owner "<id>|<holder info>" into its id and description (nullopt
/// when it carries none).
std::pair<std::string_view, std::optional<std::string_view>> split_owner(std::string_view owner) noexcept;
/// A backend's listed waiters (raw owner strings, in hand-off order) as the user sees
/// them: positions 1, 2, ..., holder_info split off each owner, `waiters` their count.
/// An unlisted queue's list is emptied.
void split_waiters(LockInfo& info);

/// The public name of an engine loss reason.
distlock::LossReason public_loss_reason(LossReason r) noexcept;

/// The text of a loss at the local deadline (`r` local_deadline or max_hold).
std::string expiry_text(const HeldLock& h, LossReason r);

}  // namespace distlock::detail
