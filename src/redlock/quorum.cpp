#include "redlock/quorum.hpp"

#include <algorithm>

namespace distlock::detail::redlock {

Millis clock_drift(Millis ttl) noexcept {
  return Millis(ttl.count() / 100 + 2);
}

Millis lock_delay_extra(Millis delay) noexcept {
  return delay.count() > 0 ? delay + 2 * clock_drift(delay) : Millis(0);
}

Millis default_node_timeout(Millis ttl) noexcept {
  return std::clamp(ttl / 10, Millis(1), Millis(50));
}

AcquireDecision decide_acquire(const AcquireTally& tally, Millis ttl, Millis elapsed) noexcept {
  const std::size_t quorum = quorum_of(tally.nodes);
  AcquireDecision d;
  if (tally.acquired >= quorum) {
    const Millis left = ttl - elapsed - clock_drift(ttl);
    if (left.count() > 0) {
      d.verdict = AcquireVerdict::acquired;
      d.validity = ttl - clock_drift(ttl);
      return d;
    }
    // Nobody else can hold it (we had a quorum): re-check soon.
    d.verdict = AcquireVerdict::too_slow;
    d.holder_ttl = Millis(0);
    return d;
  }
  if (tally.answered() < quorum) {
    d.verdict = AcquireVerdict::quorum_unavailable;
    return d;
  }
  d.verdict = AcquireVerdict::busy;
  // The holder's lease cannot outlast a TTL; without a busy master (a split
  // vote between contenders) the next attempt can come soon.
  d.holder_ttl = std::min(tally.max_busy_ttl.value_or(Millis(0)), ttl);
  if (d.holder_ttl->count() < 0) d.holder_ttl = Millis(0);
  return d;
}

RenewStatus decide_renew(std::size_t nodes, std::size_t renewed, std::size_t refused) noexcept {
  const std::size_t quorum = quorum_of(nodes);
  if (renewed >= quorum) return RenewStatus::renewed;
  if (refused > nodes - quorum) return RenewStatus::not_owner;
  return RenewStatus::failed;
}

ReleaseVerdict decide_release(std::size_t nodes, std::size_t deleted, std::size_t refused) noexcept {
  const std::size_t quorum = quorum_of(nodes);
  if (refused > nodes - quorum) return ReleaseVerdict::not_owner;
  if (deleted + refused < quorum) return ReleaseVerdict::quorum_unavailable;
  return ReleaseVerdict::released;
}

}  // namespace distlock::detail::redlock
