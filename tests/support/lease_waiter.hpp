// An acquire on a thread of its own that keeps what it got: the lease, the error, and when
// the call returned on this process's steady clock. For the tests that time a hand-over and
// then use the new holder's lease (its token, owns(), its release).
//
//   LeaseWaiter next(client, "line", ttl_of(2s, 20s));
//   ... the holder is lost or released at `lost_at` ...
//   next.join();
//   ASSERT_FALSE(next.ec) << next.ec.message();
//   EXPECT_LT(next.granted_at - lost_at, 2s);
//   EXPECT_TRUE(next.lease.owns());
//
// (support/timed_acquire.hpp's TimedAcquire gives the lease back at once and only says
// whether it came.)
// Thread-safety: `done` may be read at any time; the other fields after join(). The
// destructor joins (the acquire ends by its own wait bound).
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "distlock/distlock.hpp"

namespace distlock::testing {

struct LeaseWaiter {
  LeaseWaiter(Client& c, std::string name, LockOptions o)
      : thread([this, &c, name = std::move(name), o = std::move(o)] {
          lease = c.acquire(name, o, ec);
          granted_at = std::chrono::steady_clock::now();
          done = true;
        }) {}
  LeaseWaiter(const LeaseWaiter&) = delete;
  LeaseWaiter& operator=(const LeaseWaiter&) = delete;
  ~LeaseWaiter() { join(); }
  void join() {
    if (thread.joinable()) thread.join();
  }

  std::error_code ec;
  Lease lease;
  std::atomic<bool> done{false};
  /// When the acquire returned (with the lease or with `ec`).
  std::chrono::steady_clock::time_point granted_at{};
  std::thread thread;  // last: started once the members it writes are made
};

}  // namespace distlock::testing
