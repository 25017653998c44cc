// Threads that put load on a backend (lockers handing names around) for tests that check what a
// watch or a server saw meanwhile. A locker's call that throws (a command that failed on a busy
// machine) would otherwise end the whole test binary through std::terminate, its message the only
// trace; here it is a failure of the running test that names it, and the other threads go on.
//
//   std::vector<Client> clients = connect_clients(url, 2);  // on the test's thread
//   std::vector<std::thread> threads;
//   for (int c = 0; c < 2; ++c) threads.push_back(load_thread([&, c] { clients[c].acquire("x"); }));
//   for (auto& t : threads) t.join();
//
// Thread-safety: the body runs on the new thread; gtest's failures may be added from any thread.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"

namespace distlock::testing {

/// Runs `body` on a thread of its own; an exception it throws is a failure of the test.
inline std::thread load_thread(std::function<void()> body) {
  return std::thread([body = std::move(body)] {
    try {
      body();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "a load thread's call threw: " << e.what();
    }
  });
}

/// `n` clients of `url` with `options` (default quiet()), connected on the caller's thread before
/// the load starts: a connect that a busy machine makes miss its timeout (PostgreSQL forks a
/// backend and checks a SCRAM password per connection) is tried again (connect_within_tries);
/// what the tests check comes after.
inline std::vector<Client> connect_clients(const std::string& url, int n,
                                           const ClientOptions& options = quiet()) {
  std::vector<Client> out;
  for (int i = 0; i < n; ++i) out.push_back(connect_within_tries(url, options, errc::backend_unavailable));
  return out;
}

}  // namespace distlock::testing
