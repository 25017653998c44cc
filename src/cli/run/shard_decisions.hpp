// The decisions of `distlock run --shards` (shards.cpp) about which shards a job may act on,
// apart so that they can be tested on the memory:// backend with a manual clock.
//
// A shard is usable while its stop token has not fired AND OwnedShard::held() says so at the
// moment of deciding: the stop token is fired by the engine's watchdog, which a starved or
// stopped process runs after the lease's local deadline has passed, so the token alone would
// let the runner start (or keep, or tell) a job on a shard past its deadline.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

#include "distlock/shard_group.hpp"

namespace distlock::cli::run {

/// True while `o` may be acted on as owned: its stop has not fired and it is held now.
inline bool shard_usable(const OwnedShard& o) noexcept {
  return !o.stop.stop_requested() && o.held();
}

/// The shards of `shards` that are usable now, in order.
inline std::vector<OwnedShard> usable_shards(const std::vector<OwnedShard>& shards) {
  std::vector<OwnedShard> out;
  for (const auto& o : shards)
    if (shard_usable(o)) out.push_back(o);
  return out;
}

/// Milliseconds until the earliest local deadline of the usable shards of `shards`, rounded
/// up and one more (a wake-up at that time finds the deadline passed); -1 when none is usable.
inline int ms_until_first_deadline(const std::vector<OwnedShard>& shards) noexcept {
  int out = -1;
  for (const auto& o : shards) {
    if (!shard_usable(o)) continue;
    const Millis left = o.remaining();
    const long long ms = std::min<long long>(left.count(), 1'000'000'000LL) + 1;
    if (out < 0 || ms < out) out = static_cast<int>(ms);
  }
  return out;
}

}  // namespace distlock::cli::run
