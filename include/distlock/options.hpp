// distlock/options.hpp — settings for clients and locks, as std::chrono durations.
//
// Each field documents its default and its preconditions; `validate_and_fill()` checks the
// relations between them (for example the safety margin must be below ttl/3, so a
// holder always gives up before the server can hand the lock to somebody else).
//
// Thread-safety: plain value types.
//
// Example:
//   distlock::LockOptions opts;
//   opts.ttl = std::chrono::seconds(10);        // lease length on the server
//   opts.wait = std::chrono::seconds(2);        // acquire() gives up after 2 s
//   auto guard = client.acquire("reports/nightly", opts);
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>

#include "distlock/clock.hpp"
#include "distlock/export.hpp"

namespace distlock {

using Millis = std::chrono::milliseconds;

class Tracer;  // distlock/tracing.hpp

/// One client waiting in a lock's queue (LockInfo::waiter_list, the queue-position
/// callback).
struct DISTLOCK_EXPORT WaiterInfo {
  /// 1 for the waiter the lock goes to next, then 2, 3, ... in hand-off order.
  std::size_t position = 0;
  std::string owner;                       ///< the waiter's owner id
  std::optional<std::string> holder_info;  ///< its LockOptions::holder_info, when it set one
  /// When it joined the queue (the server's clock), where the backend records it.
  std::optional<std::chrono::system_clock::time_point> waiting_since{};
};

/// Per-lock settings.
struct DISTLOCK_EXPORT LockOptions {
  /// Lease length on the server. Default 30 s. Must be >= 100 ms (min_ttl) and
  /// <= 366 days (max_ttl): the lease is renewed while held, so the TTL only bounds
  /// how long a crashed holder blocks others.
  Millis ttl{std::chrono::seconds(30)};

  /// How long acquire()/lock() waits for a busy lock. Default: no limit
  /// (std::nullopt). Zero means one attempt; a negative wait is zero; a wait of
  /// max_wait (100 years) or more is no limit. `try_lock_for` ignores this field.
  std::optional<Millis> wait{};

  /// The holder declares the lock lost at
  /// `send time of the last successful renewal + ttl - safety_margin`, on the steady
  /// clock, i.e. before the server could let another owner in. Default: ttl/10
  /// capped at 2 s (computed when 0). Must be < ttl/3.
  Millis safety_margin{0};

  /// How often the client's renewer extends this lease. Default ttl/3 (when 0).
  /// Must be > 0 and <= ttl/2.
  Millis renew_interval{0};

  /// Upper bound on how long one acquisition may be held, counted from the send
  /// time of the request that was granted. Default: no bound (std::nullopt). Must
  /// be > 0 and <= max_wait. The renewer never extends the lease past
  /// `grant + max_hold`: at that moment the lease is declared lost (its stop token
  /// fires, `Lease::loss_reason()` says LossReason::max_hold) even though renewals
  /// still succeed, so a holder that is alive but hung cannot keep the lock for
  /// ever. The server's record then expires by its TTL (no later than the last
  /// renewal's send time + ttl) unless the holder releases it first.
  std::optional<Millis> max_hold{};

  /// A description of the holder for people (`distlock status`, `distlock list`),
  /// e.g. "host=web1 pid=4242 cmd=backup". Stored with the lease on the server (in
  /// the owner string after a '|', no extra round trip) and returned by
  /// `Client::status()` in LockInfo::holder_info. Printable ASCII (0x20..0x7e)
  /// without '|'; longer than max_holder_info bytes is cut. Default empty (none).
  std::string holder_info{};

  /// Cancels a wait from another thread (a binding's Ctrl-C, a Go context, a shutdown
  /// path): once stop is requested on this token, a waiting acquire() — and the waits of
  /// semaphores, read-write locks and elections given these options — ends within one
  /// wake-up with `errc::cancelled`, and whatever it queued on the server is withdrawn
  /// before the call returns. A token already stopped fails the call before any request.
  /// Only the wait is cancelled: a lease already granted is unaffected. Default: none.
  std::stop_token cancel{};

  /// The W3C trace context this acquisition's wait and hold spans are children of
  /// ("00-<trace id>-<span id>-<flags>", distlock/tracing.hpp), when the client has a
  /// ClientOptions::tracer. Empty: ClientOptions::traceparent. A malformed value is
  /// ignored with a warning (the spans then start a new trace); it never fails the call.
  std::string traceparent{};

  /// Lock-delay (as Chubby's): after this holder is *lost* — killed, partitioned, expired,
  /// revoked, anything but a normal release — nobody is granted the lock before the loss
  /// plus lock_delay, to protect resources that cannot check fencing tokens. A normal
  /// release (Lease::release, the guard's destructor) hands over at once. The server
  /// enforces it (a dead client cannot; etcd://: timed by the next acquirer); those that cannot
  /// enforce it reject a non-zero value with errc::not_supported (docs/design.md
  /// "Lock-delay"). The holder's value counts, not the waiter's. Default 0 (off); at most
  /// max_lock_delay (60 s), more is errc::invalid_argument naming lock_delay.
  Millis lock_delay{0};
  /// Called while acquire() waits in the lock's queue, each time this waiter's place
  /// changes: `position` is 1 when it is next, and `ahead` is the one just ahead of it
  /// (the holder, with position 0, when it is next). Runs on the client's event thread
  /// (as Lease::on_lost), never while a lock of the library is held. The place is read
  /// from the server on the wake-ups the wait has anyway (a notification, a re-check):
  /// one status round trip each, and nothing when this is empty. Only a single-name
  /// acquire() on a backend that lists its waiters (LockInfo::waiters_listed) reports;
  /// elsewhere it is never called. Default: none.
  std::function<void(std::size_t position, const WaiterInfo& ahead)> on_queue_position{};

  static constexpr Millis min_ttl{100};
  static constexpr Millis max_lock_delay{std::chrono::seconds(60)};
  static constexpr Millis max_ttl{std::chrono::hours(24 * 366)};
  static constexpr Millis max_wait{std::chrono::hours(24 * 365 * 100)};
  static constexpr std::size_t max_holder_info = 160;

  /// Fills in defaults (margin, interval), cuts holder_info to max_holder_info bytes
  /// and checks every relation (max_hold > 0, holder_info printable without '|'). Returns an
  /// `errc::invalid_argument` error naming the offending field, or {}.
  std::error_code validate_and_fill() noexcept;
  /// The same, with `message` set to a sentence naming the field, its value and the rule
  /// ("safety_margin 4000ms must be below ttl/3 (3333ms)") when it fails.
  std::error_code validate_and_fill(std::string& message);
};

/// Log severity for `ClientOptions::logger`.
enum class LogLevel { debug, info, warning, error };

/// Per-client settings.
struct DISTLOCK_EXPORT ClientOptions {
  /// Time to establish a connection to a server. Default 2 s. A `timeout=` query
  /// parameter in the URL overrides it (and `command_timeout`). Both must be in
  /// (0, 1 h].
  Millis connect_timeout{std::chrono::seconds(2)};
  /// Time one request may take before the server counts as unavailable. Default 2 s.
  Millis command_timeout{std::chrono::seconds(2)};
  /// Defaults for locks made by this client (`Client::mutex(name)` without options).
  LockOptions lock_defaults{};
  /// Where diagnostics go. Default: warnings and errors to stderr; set
  /// DISTLOCK_LOG=debug|info|warning|error|off to change the threshold.
  std::function<void(LogLevel, std::string_view)> logger{};
  /// The clock for every deadline (the engine's and the backends'). Default:
  /// system_steady_clock(), CLOCK_BOOTTIME, which keeps counting while the host is
  /// suspended, as the servers' lease timers do. Do not inject std::chrono::steady_clock
  /// (CLOCK_MONOTONIC stops in a suspend: a lease would look valid after its server
  /// expired it). Tests inject a manual clock.
  std::shared_ptr<Clock> clock{};
  /// Whether the client runs its background renewer thread. Tests of the engine
  /// turn it off and call the renewer's tick by hand. Default true.
  bool background_renewal{true};
  /// Whether the client keeps the counters `Client::metrics()` exposes (a few relaxed
  /// atomic increments per acquire, release and renewal). Default true; false makes
  /// `metrics()` return an empty string.
  bool metrics{true};
  /// Receives spans of waits, holds, renewals and losses (distlock/tracing.hpp). Default
  /// none: the engine then only tests this pointer.
  std::shared_ptr<Tracer> tracer{};
  /// The parent of every acquisition's spans whose LockOptions::traceparent is empty
  /// (W3C traceparent; empty: none, each acquisition starts a new trace). Checked once at
  /// connect(): a malformed value is ignored with a warning.
  std::string traceparent{};

  /// Checks the timeouts' ranges and `lock_defaults` (as LockOptions::validate_and_fill
  /// does); `errc::invalid_argument` with `message` naming the field, or {}. connect()
  /// calls it after applying the URL's `timeout=`.
  std::error_code validate(std::string& message) const;
};

}  // namespace distlock
