// Fixtures for engine tests against the in-process memory:// backend: each test gets
// its own store; `ManualMemoryTest` drives time by hand (no background renewer: the
// test calls tick()), `RealTimeMemoryTest` runs on the real clock with the renewer.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "distlock/distlock.hpp"
#include "fake/memory_backend.hpp"
#include "support/client_options.hpp"
#include "support/manual_clock.hpp"

namespace distlock::testing {

inline LockOptions ttl(Millis t) {
  LockOptions o;
  o.ttl = t;
  return o;
}

/// A store name no other test of this process uses.
inline std::string fresh_store_name(const char* prefix) {
  static std::atomic<int> seq{0};
  return std::string(prefix) + "-" + std::to_string(++seq);
}

struct ManualMemoryTest : ::testing::Test {
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::string store_name = fresh_store_name("manual");
  std::shared_ptr<detail::MemoryStore> store = detail::MemoryStore::named(store_name);
  ClientOptions options(bool background = false) {
    ClientOptions o = quiet();
    o.clock = clock;
    o.background_renewal = background;
    return o;
  }
  Client client(bool background = false) { return connect("memory://" + store_name, options(background)); }
};

struct RealTimeMemoryTest : ::testing::Test {
  std::string store_name = fresh_store_name("realtime");
  std::shared_ptr<detail::MemoryStore> store = detail::MemoryStore::named(store_name);
  Client client() { return connect("memory://" + store_name, quiet()); }
};

}  // namespace distlock::testing
