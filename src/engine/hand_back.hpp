// The hand-back thread: lost leases wait here for their hand-back to the backend
// (Backend::forget), on a thread of its own, started at the first loss, so a hand-back
// the server does not answer (a command timeout per lease) delays no loss callback and
// no stop signal. It runs no user code. Its mutex is a leaf like the event queue's.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "engine/lease.hpp"
#include "engine/thread_annotations.hpp"

namespace distlock::detail {

class HandBackQueue {
 public:
  /// `hand_back` hands one lost lease back (Engine::forget_now); it must not throw.
  explicit HandBackQueue(std::function<void(HeldLock&)> hand_back) : hand_back_(std::move(hand_back)) {}
  /// close_and_join() must have run (the engine's destructor calls it).
  ~HandBackQueue() = default;
  HandBackQueue(const HandBackQueue&) = delete;
  HandBackQueue& operator=(const HandBackQueue&) = delete;

  /// Queues `held`, starting the thread at the first call. Dropped (the server's own
  /// expiry stays the bound) when closed or out of memory.
  void queue(const std::shared_ptr<HeldLock>& held) noexcept DISTLOCK_EXCLUDES(mu_);
  /// Blocks until every lease queued so far has been handed back (at once on the
  /// hand-back thread itself, or once closed).
  void drain() DISTLOCK_EXCLUDES(mu_);
  /// Closes the queue, lets the batch under way finish, joins the thread and returns
  /// what was still queued (the caller hands it back while the backend exists).
  std::vector<std::shared_ptr<HeldLock>> close_and_join() DISTLOCK_EXCLUDES(mu_);
  bool on_thread() const noexcept {
    return thread_id_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }

 private:
  void main() noexcept DISTLOCK_EXCLUDES(mu_);

  const std::function<void(HeldLock&)> hand_back_;
  AnnotatedMutex mu_;
  std::condition_variable cv_;       // work queued, or closed
  std::condition_variable idle_cv_;  // queue empty, nothing running (drain)
  std::thread thread_ DISTLOCK_GUARDED_BY(mu_);
  std::atomic<std::thread::id> thread_id_{};  // read without the lock (on_thread)
  std::vector<std::shared_ptr<HeldLock>> queue_ DISTLOCK_GUARDED_BY(mu_);
  int running_ DISTLOCK_GUARDED_BY(mu_) = 0;
  bool closed_ DISTLOCK_GUARDED_BY(mu_) = false;
};

}  // namespace distlock::detail
