// Redlock's arithmetic, kept free of I/O so it can be unit-tested on its own:
// the quorum of N masters, the clock-drift allowance, the default per-node
// timeout, and the verdicts that turn per-master answers into one outcome for an
// acquisition, a renewal or a release.
//
// Thread-safety: pure functions over values.
//
// Example:
//   redlock::AcquireTally t{.nodes = 3, .acquired = 2, .busy = 1};
//   auto d = redlock::decide_acquire(t, std::chrono::seconds(10), std::chrono::milliseconds(3));
//   // d.verdict == AcquireVerdict::acquired, d.validity == 10 s - drift
#pragma once

#include <cstddef>
#include <optional>

#include "distlock/options.hpp"
#include "engine/backend.hpp"

namespace distlock::detail::redlock {

/// A strict majority of `nodes` masters: N/2 + 1.
constexpr std::size_t quorum_of(std::size_t nodes) noexcept {
  return nodes / 2 + 1;
}

/// Allowance for clock-rate differences between this host and the masters over a
/// lease of `ttl`: 1 % of the TTL plus 2 ms (the figure from the Redlock description).
Millis clock_drift(Millis ttl) noexcept;

/// How much longer than the lease a holder's lock-delay marker lives on each master, for
/// a lock_delay D (docs/redlock.md "Lock-delay"): D + 2 x clock_drift(D). A master's clock
/// may run up to 1 % fast against the holder's (the drift model above), so a marker of
/// ttl + extra on its clock lasts at least 0.99 (ttl + extra) of real time, which is no less
/// than the lease's end as the holder counted it (ttl - clock_drift(ttl) from the send) plus
/// D for every D <= 60 s. 0 for D = 0 (no marker).
Millis lock_delay_extra(Millis delay) noexcept;

/// Default time one master may take to answer one request: min(50 ms, ttl/10), at
/// least 1 ms. Small against the TTL, so a dead or paused master costs little of
/// the lease's validity.
Millis default_node_timeout(Millis ttl) noexcept;

/// How the masters answered one acquisition fan-out.
struct AcquireTally {
  std::size_t nodes = 0;                 ///< masters asked
  std::size_t acquired = 0;              ///< took the key (or already had it for this owner)
  std::size_t busy = 0;                  ///< another owner holds the key there
  std::optional<Millis> max_busy_ttl{};  ///< largest remaining PTTL among the busy masters
  // The rest (nodes - acquired - busy) did not answer in time, could not be
  // reached or answered with an error.
  std::size_t answered() const noexcept { return acquired + busy; }
};

enum class AcquireVerdict {
  acquired,            ///< a quorum took it and some validity is left
  busy,                ///< a quorum answered but fewer than a quorum took it
  too_slow,            ///< a quorum took it but the fan-out used up the validity
  quorum_unavailable,  ///< fewer than a quorum answered at all
};

struct AcquireDecision {
  AcquireVerdict verdict = AcquireVerdict::busy;
  /// When acquired: ttl - drift, counted (by the engine) from the send time.
  Millis validity{0};
  /// When not acquired: how long the caller may sleep before re-checking.
  std::optional<Millis> holder_ttl{};
};

/// Success iff a quorum acquired and ttl - elapsed - drift > 0 (steady clock).
AcquireDecision decide_acquire(const AcquireTally& tally, Millis ttl, Millis elapsed) noexcept;

/// One renewed lease's outcome from how many masters extended it and how many
/// said it is not ours there. Renewed iff a quorum extended it; not_owner once a
/// quorum can no longer extend it (more than N - quorum refused: for odd N that is
/// "a quorum said not owner"); otherwise failed (unknown; the engine retries until
/// its local deadline).
RenewStatus decide_renew(std::size_t nodes, std::size_t renewed, std::size_t refused) noexcept;

enum class ReleaseVerdict { released, not_owner, quorum_unavailable };

/// Release outcome: not_owner when more than N - quorum masters had no key of
/// ours (we cannot have held a quorum); quorum_unavailable when fewer than a
/// quorum answered; released otherwise.
ReleaseVerdict decide_release(std::size_t nodes, std::size_t deleted, std::size_t refused) noexcept;

}  // namespace distlock::detail::redlock
