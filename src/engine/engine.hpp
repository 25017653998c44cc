// The lock engine: written once, used by every backend. It owns the acquire loop
// (wait for a change notification, re-check capped by the holder's remaining TTL),
// reentrancy per owner thread, the client's single renewer (batched renewals), the
// conservative local deadline and the loss signal.
//
// Engine composes parts that own their state, each under its own mutex (src/engine/):
// - the lease table (lease_table.hpp): held leases, acquisitions under way (with the
//   losses reported meanwhile), each lease's schedule, the validity cap;
// - the wait registry (wait_registry.hpp): wait slots, name watches, the idle sweep;
// - the renewer (renewer.hpp): the renewer and watchdog threads and their wake-ups;
// - the event queue (event_queue.hpp): the one thread that runs user callbacks, and
//   the hand-back queue (hand_back.hpp): lost leases handed back to the backend.
// Engine's acquire is validate → lease table (re-entry) → wait loop → lease table
// (record); its renewal batches and the loss signal (declare_lost) use the parts.
//
// Threads:
// - User threads call every public member (acquire*, release, wait_free, status,
//   NameWatch, tick/renew_all in tests) at once, on any thread.
// - The renewer (when background_renewal and the backend needs renewal) runs tick():
//   renewals in one backend batch, losses it finds.
// - The watchdog declares losses at local deadlines, so a renewal blocked on a hung
//   server cannot delay a stop signal; it also drops idle watches.
// - Backend threads (notifiers, subscribers, keep-alives) call the ChangeListener
//   members (on_change, on_session_lost, on_lease_lost) from any thread; a backend
//   never holds a lock of its own that a backend call from the engine could need.
// - The hand-back thread (started at the first loss) hands lost leases back to the
//   backend (Backend::forget); it runs no user code.
// - The event thread runs user callbacks (Lease::on_lost) and nothing else; see
//   add_loss_callback. Whoever detects a loss (any of the threads above) gives the
//   loss signal itself in declare_lost/fire_loss: `lost`, the stop token (so
//   std::stop_callbacks run there) and add_loss_signal's internal signals; then it
//   queues the callbacks. A blocking callback therefore delays later callbacks only.
// Locks, in the only order they nest:
// - the lease table's mutex, then the renewer's (a leaf);
// - HeldLock::callbacks_mu (a lease's loss reason, callbacks and signals), then the
//   event queue's (a leaf, taken inside callbacks_mu to queue in order);
// - the wait registry's and the hand-back queue's: never held with another.
// No engine lock is held across a backend call, user code (callbacks, the logger
// sink) or declare_lost; the only clock waits are condition-variable waits on a
// part's own mutex. Atomics read without a lock: HeldLock::lost, deadline_ns,
// hold_limit_ns, hold_count, the counters and the session epoch.
// Every field a lock guards says so in a checked annotation (DISTLOCK_GUARDED_BY,
// thread_annotations.hpp; a lease's and a wait slot's fields through their part's
// Role, engine/role.hpp), checked by the clang build of scripts/test.sh.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "distlock/client.hpp"
#include "distlock/clock.hpp"
#include "distlock/options.hpp"
#include "engine/backend.hpp"
#include "engine/event_queue.hpp"
#include "engine/hand_back.hpp"
#include "engine/lease.hpp"
#include "engine/lease_table.hpp"
#include "engine/log.hpp"
#include "engine/metrics.hpp"
#include "engine/renewer.hpp"
#include "engine/thread_annotations.hpp"
#include "engine/trace_spans.hpp"
#include "engine/wait_registry.hpp"

namespace distlock::detail {

class Engine final : public ChangeListener, public std::enable_shared_from_this<Engine> {
 public:
  /// Creates an engine over `backend` and starts its renewer (if enabled).
  static std::shared_ptr<Engine> create(std::unique_ptr<Backend> backend, ClientOptions opts);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// How an acquisition treats a hold the calling thread already has on the name.
  enum class Reentry {
    /// Mutex: re-enters a Mutex hold of this thread (hold count + 1, no round trip).
    by_thread,
    /// Lease: never re-enters. A Lease can be moved to another thread, so "this
    /// thread holds it" is not known; the acquisition asks the server (and waits for
    /// an earlier Lease of its own, like std::timed_mutex).
    never,
  };

  /// Acquires `name` for the calling thread. `wait`: nullopt = forever, 0 = one
  /// attempt. Busy with wait 0 → errc::busy; wait ran out → errc::timeout.
  std::shared_ptr<HeldLock> acquire(std::string_view name, const LockOptions& opts,
                                    std::optional<Millis> wait, Error& ec, Reentry reentry = Reentry::never);
  /// Acquires ONE of `names` (whichever is free first; several names waited on at
  /// once, e.g. a semaphore's permits) for the calling thread, never re-entering.
  /// Each name is tried once in the order given; then the caller waits for a change
  /// notification on any of them (the per-name watches of acquire()), re-checking
  /// only the names that changed, or all of them when a re-check falls due (capped
  /// by the shortest remaining TTL the busy names' holders reported), until `wait`
  /// runs out (nullopt = forever, 0 = one round; errc::busy / errc::timeout).
  /// `gate`: when not empty, a lock name that must be held by nobody before any of
  /// `names` is tried (a reader waits while a writer holds or queues for the intent
  /// lock); while it is held the caller waits for a change of the gate instead, and
  /// keeps no queued place on `names`. `index` (optional) receives the position in
  /// `names` of the name acquired. Whatever way it ends, no wait slot stays joined
  /// and no queued place on the server is left behind.
  std::shared_ptr<HeldLock> acquire_any(std::span<const std::string> names, const LockOptions& opts,
                                        std::optional<Millis> wait, Error& ec, std::string_view gate = {},
                                        std::size_t* index = nullptr);

  /// Waits until `name` is held by nobody (Backend::status), by change notification,
  /// re-checked at the latest when the holder's remaining TTL runs out. Returns true
  /// when free, false when `wait` ran out first (nullopt = forever, 0 = one check);
  /// `ec` set on errors (then false).
  bool wait_free(std::string_view name, std::optional<Millis> wait, Error& ec);

  /// Drops one hold; at zero releases on the server.
  void release(const std::shared_ptr<HeldLock>& held, Error& ec) noexcept;
  /// The calling thread's hold of `name`, or nullptr.
  std::shared_ptr<HeldLock> held_by_this_thread(std::string_view name) const;
  /// The calling thread's Mutex hold of `name` (taken with Reentry::by_thread, not yet
  /// released), or nullptr. Never a Lease: a Lease is keyed by the thread that took it
  /// but may have been moved to another thread, and is not that thread's Mutex hold.
  std::shared_ptr<HeldLock> mutex_hold_of_this_thread(std::string_view name) const;

  /// Runs one renewer pass at the clock's now(): declares leases past their local
  /// deadline lost, renews those due (in one backend batch). Returns leases renewed.
  std::size_t tick();
  /// Renews every held lease now regardless of schedule.
  std::size_t renew_all();

  void on_change(std::string_view name) noexcept override;
  void on_session_lost() noexcept override;
  void on_lease_lost(std::string_view name, std::string_view owner) noexcept override;
  void on_validity_changed(Millis validity) noexcept override;

  /// Queues `fn` to run once on the event thread when `held` is lost (queued at once
  /// if it already is). A callback that throws is logged; the others still run.
  void add_loss_callback(const std::shared_ptr<HeldLock>& held, std::function<void()> fn);
  /// Engine-internal: runs `fn` on the thread that declares `held` lost, right after
  /// its stop token (at once, on the caller, if it already is lost). `fn` must be
  /// short, non-blocking and must not throw: it is part of the loss signal.
  void add_loss_signal(const std::shared_ptr<HeldLock>& held, std::function<void()> fn);

  /// The thread that runs user callbacks (see "Threads" above).
  std::thread::id event_thread_id() const noexcept { return events_.thread_id(); }
  bool on_event_thread() const noexcept;
  /// Blocks until every user callback queued so far has run and the event thread is
  /// idle, then until every lost lease queued for its hand-back has been handed back
  /// (tests, and callers that must observe a callback's effect). Returns at once when
  /// called on the event thread itself (it would wait for itself).
  void drain_events();

  /// The backend's status with the holder description split off LockInfo::holder.
  LockInfo status(std::string_view name, Error& ec);
  /// Client::revoke (engine/revoke.cpp): `reason` checked, the backend's revoke with this
  /// client's note, logged and counted. {revoked = false} when the lock was free.
  RevokeResult revoke(std::string_view name, std::string_view reason, Error& ec);
  /// Client::last_revoke: the backend's revoke note of `name`, decoded.
  std::optional<RevokeRecord> last_revoke(std::string_view name, Error& ec);
  /// Backend::list_held with holder descriptions split off as in status().
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated, Error& ec);
  Backend& backend() noexcept { return *backend_; }
  const Capabilities& capabilities() const noexcept { return caps_; }
  const std::string& client_id() const noexcept { return client_id_; }
  /// The URL text `connect()` was given (with any password: never print it). Empty for
  /// engines made by hand. Tools that keep records beside the locks (ids) read it.
  const std::string& source_url() const noexcept { return source_url_; }
  void set_source_url(std::string url) { source_url_ = std::move(url); }
  const ClientOptions& options() const noexcept { return opts_; }
  const std::shared_ptr<Clock>& clock() const noexcept { return clock_; }
  Logger& logger() noexcept { return log_; }
  ClientStats stats() const noexcept;
  std::size_t held_count() const;
  /// Prometheus text exposition of this client's metrics (engine/metrics.hpp); empty
  /// when ClientOptions::metrics is false.
  std::string metrics_text() const;

  /// Validates a lock name; errc::invalid_argument with the detail naming the problem.
  static Error check_name(std::string_view name);

  /// Waiting for a change of one name without acquiring it (a reader waiting for the
  /// writer-intent lock, an election observer waiting for the leader to change), through the per-name watch
  /// the acquire loop uses. Pattern, which misses no change:
  ///   NameWatch w(engine, name);
  ///   for (;;) {
  ///     const bool live = w.arm(deadline);   // subscribe first
  ///     const auto seen = w.generation();    // then read the state
  ///     if (state is what we want) break;
  ///     w.wait(seen, min(deadline, now + (live ? cap : Engine::kDegradedRecheck)));
  ///   }
  /// Not thread-safe (one waiting thread); the destructor leaves the wait slot.
  class NameWatch {
   public:
    NameWatch(std::shared_ptr<Engine> engine, std::string name);
    ~NameWatch();
    NameWatch(const NameWatch&) = delete;
    NameWatch& operator=(const NameWatch&) = delete;
    /// Makes sure change notifications for the name are live; false means they are
    /// not (the caller re-checks every kDegradedRecheck).
    bool arm(Clock::time_point until);
    /// Bumped by every change notification of the name.
    std::uint64_t generation() const;
    /// Waits until generation() != seen or `until`; true when it changed.
    bool wait(std::uint64_t seen, Clock::time_point until);

   private:
    std::shared_ptr<Engine> engine_;
    std::string name_;
    std::shared_ptr<WaitRegistry::Slot> slot_;
  };

  /// True in a child process forked after this engine was made: every call then
  /// fails with errc::forked and nothing inherited (connections, leases) is touched.
  bool forked() const noexcept;
  /// True on the engine's renewer or watchdog thread.
  bool on_own_thread() const noexcept;

 private:
  Engine(std::unique_ptr<Backend> backend, ClientOptions opts);
  /// Starts the renewer/watchdog for a backend that needs no renewal once a lease
  /// with a max_hold appears (its stop token must fire at the limit).
  void ensure_watchdog();
  /// The renewer's round: tick(), then when the next renewal falls due.
  Clock::time_point renew_round();
  /// The watchdog's round: losses at local deadlines, idle watches; the next deadline.
  Clock::time_point watchdog_round();
  /// Declares every lease past its local deadline lost; returns the next deadline.
  Clock::time_point declare_expired();
  std::size_t renew_items(std::vector<std::shared_ptr<HeldLock>> due);
  void declare_lost(const std::shared_ptr<HeldLock>& held, LossReason reason, const char* why,
                    const std::string* revoke_reason = nullptr) noexcept;
  /// The refused renewals of a batch: each is declared lost, as revoked when the lock's
  /// revoke note names its token and owner, else as renewal_refused (engine/revoke.cpp).
  void declare_refused(const std::vector<std::shared_ptr<HeldLock>>& refused) noexcept;
  /// Metrics: counts the hold time of `held`, ended at `now`, if not counted yet.
  void end_hold(HeldLock& held, Clock::time_point now) noexcept;
  void count_acquire_failure(std::string_view name, const std::error_code& ec) noexcept;
  void fire_loss(const std::shared_ptr<HeldLock>& held) noexcept;
  // Runs the lease's internal loss signals (add_loss_signal) once, on the calling
  // thread: by declare_lost, or by release() before it hands a lost lease back.
  void fire_signals(HeldLock& held) noexcept;
  // Hands a lease declared lost back to the backend (Backend::forget), once, then wakes
  // this client's waiters for its name. Blocks for the backend's call (or for another
  // thread's call of it already under way); never under an engine lock.
  void forget_now(HeldLock& held) noexcept;
  std::shared_ptr<HeldLock> acquire_impl(std::span<const std::string_view> names, std::string_view gate,
                                         const LockOptions& opts, std::optional<Millis> wait, Error& ec,
                                         Reentry reentry, std::size_t* index);
  /// Validates an acquisition's names and options (filled in) and its wait.
  bool validate(std::span<const std::string_view> names, std::string_view gate, LockOptions& opts,
                std::optional<Millis>& wait, Error& ec);
  /// The wait loop of one acquisition (engine/acquire_loop.cpp).
  class AcquireLoop;
  std::shared_ptr<HeldLock> wait_loop(std::span<const std::string_view> names, std::string_view gate,
                                      const LockOptions& opts, std::optional<Millis> wait,
                                      const std::string& owner, Clock::time_point start,
                                      std::uint64_t& epoch_at_send, std::size_t& index, Error& ec);
  /// Counts and records a granted lease, then declares what raced the grant lost.
  void record_grant(const std::shared_ptr<HeldLock>& held, const std::string& owner, Clock::time_point called,
                    std::uint64_t epoch_at_send, const WaitTrace* trace);
  /// Tracing: the loss span of `held` and the end of its hold span, on the event thread.
  void trace_loss(const HeldLock& held, LossReason reason, const std::string& detail_text,
                  Clock::time_point at) noexcept;
  /// Tracing: a renewal span per traced lease of a batch, on the event thread.
  void trace_renewals(const std::vector<std::shared_ptr<HeldLock>>& due, const std::vector<RenewStatus>& out,
                      Clock::time_point sent, Clock::time_point replied, const std::error_code& ec) noexcept;
  /// Tracing: the end of `held`'s hold span on the calling thread (once); after a loss that
  /// ended it, the loss's spans if the event thread has not given them yet.
  void trace_hold_end(const HeldLock& held, SpanOutcome outcome, Clock::time_point end,
                      const std::error_code& ec = {}) noexcept;
  /// Gives a loss's spans to the tracer unless they were given already.
  void deliver_loss_spans(LossSpans& loss) noexcept;

 public:
  /// Drops subscriptions nobody has waited on for kIdleWatchKeep (all of them if `all`).
  void sweep_idle_watches(bool all) noexcept;
  /// Subscriptions kept after their last waiter left (tests).
  std::size_t idle_watches() const;
  /// Re-check period of a waiter whose name cannot be watched (degraded mode).
  static constexpr Millis kDegradedRecheck = WaitRegistry::kDegradedRecheck;

 private:
  std::unique_ptr<Backend> backend_;
  std::string source_url_;
  ClientOptions opts_;
  Capabilities caps_;
  std::shared_ptr<Clock> clock_;
  std::string client_id_;
  std::uint64_t fork_gen_;  // fork_generation() when made
  Logger log_;
  std::unique_ptr<Metrics> metrics_;     // null when ClientOptions::metrics is false
  std::unique_ptr<TraceSpans> tracing_;  // null when ClientOptions::tracer is not set
  std::atomic<std::uint64_t> next_acquisition_{1};

  std::atomic<std::uint64_t> n_acquired_{0}, n_released_{0}, n_release_failures_{0}, n_renew_round_trips_{0},
      n_renewed_{0}, n_lost_{0}, n_brain_splits_{0};

  // Wait slots and name watches (engine/wait_registry.hpp).
  WaitRegistry waits_;
  // The renewer and watchdog threads (engine/renewer.hpp); its mutex nests inside the
  // lease table's.
  Renewer renewer_;
  // Held leases, acquisitions under way, validity caps (engine/lease_table.hpp).
  LeaseTable leases_;

  // The event thread (user callbacks) and the hand-back thread (Backend::forget of lost
  // leases). Each owns its queue and a leaf mutex; the event thread is joined last.
  HandBackQueue hand_back_;
  EventQueue events_;
};

}  // namespace distlock::detail
