// Helpers shared by the zk:// test binaries: one ZooKeeper server per test process,
// a client without log output (quiet(), tests/support/client_options.hpp), and a bounded
// wait for a condition.
#pragma once

#include <chrono>
#include <string>
#include <thread>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "zk/zk_server.hpp"

namespace distlock::testing {

/// The standalone server of this test process, started on first use (~1 s).
inline ZkServer& shared_server() {
  static ZkServer server;
  return server;
}

/// The query of the watch tests' zk:// URLs: sessions of 10 s, so that a freeze of well under a
/// second stays far from a disconnection.
inline const std::string kTenSecondSessions = "?session_timeout=10s";

/// A client of `url` without log output.
inline Client quiet_client(const std::string& url) {
  return distlock::connect(url, quiet());
}

/// Lock options of a 10 s TTL (the sessions' timeout above) that wait up to `wait`.
inline LockOptions ten_second_ttl(Millis wait) {
  LockOptions o;
  o.ttl = Millis(10000);
  o.wait = wait;
  return o;
}

/// Polls `pred` every 10 ms until it holds (true) or `timeout` passes on this
/// process's steady clock (false).
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

}  // namespace distlock::testing
