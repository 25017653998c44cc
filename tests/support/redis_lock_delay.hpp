// What the lock-delay tests of the Redis family (redis://, redis+cluster://, redlock://) share:
// the options of a lease with a lock-delay, the two TTLs of a lock and its marker read at one
// server instant, and a prober that finds the first instant a name is granted again.
//
//   auto got = first_grant(prober, name, kTtl, 500);           // every 20 ms, at most 500 times
//   EXPECT_GE(*got, killed + kDelay - 1ms);
//
// Not thread-safe by itself: each call uses only what it is given.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {

/// Lock options with `ttl`, `lock_delay` = `delay` and `wait` (none: LockOptions' default).
inline LockOptions delay_opts(Millis ttl, Millis delay, std::optional<Millis> wait = std::nullopt) {
  LockOptions o = ttl_of(ttl, wait);
  o.lock_delay = delay;
  return o;
}

/// PTTL of `lock` and of `marker` on `node`, read in one script (one server instant);
/// {-999, -999} when the script gives no two-element reply.
inline std::pair<long long, long long> lock_and_marker_pttl(const RedisServer& node, const std::string& lock,
                                                            const std::string& marker) {
  auto rep = node.command(
      {"EVAL", "return {redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[2])}", "2", lock, marker});
  if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) return {-999, -999};
  return {rep->element[0]->integer, rep->element[1]->integer};
}

/// What `first_grant` does with an error from the backend: let `try_acquire`'s exception out
/// (the test fails), or count the try as not granted and go on (a server is known to be away).
enum class ProbeErrors { thrown, retried };

/// The first instant on this process's steady clock `prober` is granted `name` (a lease of `ttl`
/// without a lock-delay, no wait), trying every 20 ms, at most `tries` times; nullopt if never.
/// Each grant is released at once.
inline std::optional<std::chrono::steady_clock::time_point> first_grant(
    Client& prober, const std::string& name, Millis ttl, int tries,
    ProbeErrors errors = ProbeErrors::thrown) {
  for (int i = 0; i < tries; ++i) {
    std::optional<Lease> got;
    if (errors == ProbeErrors::thrown) {
      got = prober.try_acquire(name, delay_opts(ttl, Millis(0)));
    } else {
      std::error_code ec;
      Lease lease = prober.acquire(name, delay_opts(ttl, Millis(0), Millis(0)), ec);
      if (lease.owns()) got = std::move(lease);
    }
    if (got) {
      const auto at = std::chrono::steady_clock::now();
      got->release();
      return at;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

}  // namespace distlock::testing
