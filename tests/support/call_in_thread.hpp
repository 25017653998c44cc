// A blocking call run on a thread of its own, for the tests that check it returns once
// something else happens (a cancel, an answer) and within a bound on the steady clock:
//
//   CallInThread waiter([&] {
//     std::error_code e;
//     (void)c.acquire("job", opts, e);
//     return e;
//   });
//   stop.request_stop();
//   EXPECT_TRUE(waiter.returned_within(5s)) << "the cancelled wait went on";
//   waiter.join();
//   EXPECT_EQ(waiter.code(), errc::cancelled);
//
// Thread-safety: one test thread uses the object; the call runs on the object's own thread.
// The destructor joins that thread (a call that never returns hangs the test there: end it
// first, as the tests do after a failed returned_within).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace distlock::testing {

class CallInThread {
 public:
  /// Starts `call` on a new thread; its returned code is code() once it has returned.
  explicit CallInThread(std::function<std::error_code()> call)
      : thread_([this, call = std::move(call)] {
          const std::error_code c = call();
          std::lock_guard lk(m_);
          code_ = c;
          returned_ = true;
          cv_.notify_all();
        }) {}
  ~CallInThread() { join(); }
  CallInThread(const CallInThread&) = delete;
  CallInThread& operator=(const CallInThread&) = delete;

  /// Whether the call has returned, waiting for it up to `bound` (steady clock).
  bool returned_within(std::chrono::milliseconds bound) {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, bound, [&] { return returned_; });
  }
  /// Waits for the call's thread to end.
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  /// The code the call returned (empty while it has not).
  std::error_code code() {
    std::lock_guard lk(m_);
    return code_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool returned_ = false;
  std::error_code code_;
  std::thread thread_;  // last: started once the fields it writes exist
};

}  // namespace distlock::testing
