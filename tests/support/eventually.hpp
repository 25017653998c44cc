// Bounded polling for tests: `eventually(pred, limit)` is true as soon as `pred()`
// is, false if it still is not after `limit` on the steady clock (checked once more
// at the end). For observing another process or server, never for timing a result.
#pragma once

#include <chrono>
#include <thread>

namespace distlock::testing {

template <class F>
bool eventually(F f, std::chrono::milliseconds limit,
                std::chrono::milliseconds every = std::chrono::milliseconds(5)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(every);
  }
  return f();
}

}  // namespace distlock::testing
