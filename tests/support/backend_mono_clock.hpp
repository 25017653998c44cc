// The time stamp that test programs and the processes they start write into shared histories:
// CLOCK_MONOTONIC in nanoseconds, one clock for every process of the machine, so stamps of
// different processes compare. Header-only, for the test tools too (tests/conformance/*_tool.cpp).
//
// Thread-safety: mono_ns() may be called from any thread.
#pragma once

#include <time.h>

#include <cstdint>

namespace distlock::testing {

/// CLOCK_MONOTONIC now, in nanoseconds.
inline std::int64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace distlock::testing
