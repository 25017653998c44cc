// An acquire on a thread of its own that notes when it returned with the lease, on this
// process's steady clock, then gives the lease back: for the tests that time a hand-over
// (how long after a release, a kill or a forget the next waiter got the lock).
//
//   TimedAcquire next(client, "line", ttl_of(30s, 60s));
//   ... the holder releases at `released_at` ...
//   next.join();
//   ASSERT_TRUE(next.got());
//   EXPECT_LE(next.got_at() - released_at, 3s);
//
// A failed acquire fails the test (EXPECT, naming the error) and leaves got() false.
// Thread-safety: one test thread uses the object; got() may be read at any time, got_at()
// after join(). The destructor joins (the acquire ends by its own wait bound).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "distlock/distlock.hpp"

namespace distlock::testing {

class TimedAcquire {
 public:
  TimedAcquire(Client& client, std::string name, LockOptions opts)
      : thread_([this, &client, name = std::move(name), opts = std::move(opts)] {
          std::error_code ec;
          Lease l = client.acquire(name, opts, ec);
          EXPECT_FALSE(ec) << "the acquire of \"" << name << "\" failed: " << ec.message();
          got_at_ = std::chrono::steady_clock::now();
          got_ = !ec;
        }) {}
  ~TimedAcquire() { join(); }
  TimedAcquire(const TimedAcquire&) = delete;
  TimedAcquire& operator=(const TimedAcquire&) = delete;

  void join() {
    if (thread_.joinable()) thread_.join();
  }
  /// Whether the acquire has returned with the lease.
  bool got() const { return got_.load(); }
  /// When it returned (after join()).
  std::chrono::steady_clock::time_point got_at() const { return got_at_; }

 private:
  std::atomic<bool> got_{false};
  std::chrono::steady_clock::time_point got_at_{};
  std::thread thread_;  // last: started once the fields it writes exist
};

}  // namespace distlock::testing
