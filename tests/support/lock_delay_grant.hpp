// The end of a lock-delay after its holder was SIGKILLed, as the Redis-family lock-delay tests
// (tests/rediscluster/lock_delay_test.cpp, tests/redlock/lock_delay_test.cpp) check it: a new
// client probes the name until it is granted, and the grant must not come before the delay
// has run from the kill.
//
//   Millis after{};
//   ASSERT_NO_FATAL_FAILURE(
//       expect_granted_after_the_delay(url, name, kTtl, kDelay, killed, "[ redis ] killed holder", after));
//   EXPECT_LE(after, kTtl + kDelay + 1000ms);   // the backend's own upper bound
//
// Every instant is read on this process's steady clock. Thread-safety: one call per thread;
// it uses only its arguments.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/redis_lock_delay.hpp"

namespace distlock::testing {

/// A new client of `url` tries `name` (a lease of `ttl`, no lock-delay) every 20 ms, at most 500
/// times (10 s; an error counts as a refusal), after a holder with lock-delay `delay` was killed
/// at `killed`: it must be granted, and no earlier than `delay` after the kill (- 1 ms: the
/// servers' millisecond expiry). `after` is set to how long after the kill the grant came, and a
/// line "<what>, lock_delay D ms, ttl T ms: granted A ms after SIGKILL" is printed.
inline void expect_granted_after_the_delay(const std::string& url, const std::string& name, Millis ttl,
                                           Millis delay, std::chrono::steady_clock::time_point killed,
                                           const std::string& what, Millis& after) {
  auto prober = distlock::connect(url, quiet());
  const auto granted = first_grant(prober, name, ttl, 500, ProbeErrors::retried);
  ASSERT_TRUE(granted.has_value()) << "the name was never granted after the lock-delay";
  after = std::chrono::duration_cast<Millis>(*granted - killed);
  std::printf("%s, lock_delay %lld ms, ttl %lld ms: granted %lld ms after SIGKILL\n", what.c_str(),
              static_cast<long long>(delay.count()), static_cast<long long>(ttl.count()),
              static_cast<long long>(after.count()));
  EXPECT_GE(after, delay - Millis(1)) << "granted before the dead holder's lock-delay could have ended";
}

}  // namespace distlock::testing
