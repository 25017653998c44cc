// The engine's event thread: the one thread that runs user callbacks (Lease::on_lost
// callbacks, the loss log lines whose sink is user code), one at a time, in the order
// queued. Its mutex is a leaf: nothing else is locked while holding it, and user code
// never runs under it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>

#include "engine/thread_annotations.hpp"

namespace distlock::detail {

/// Counts, per thread, the user code that may drop the last handle to an engine
/// (loss callbacks, the std::stop_callbacks a loss signal runs). While one is up the
/// engine's deleter must not join the current thread: it finishes on a thread of its
/// own (Engine::create).
class UserCodeScope {
 public:
  UserCodeScope() noexcept;
  ~UserCodeScope();
  UserCodeScope(const UserCodeScope&) = delete;
  UserCodeScope& operator=(const UserCodeScope&) = delete;
  /// True while the calling thread is inside a UserCodeScope.
  static bool active() noexcept;
};

class EventQueue {
 public:
  EventQueue() = default;
  /// Stops and joins the thread if stop_and_join() has not.
  ~EventQueue();
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  /// Starts the event thread.
  void start();
  /// Queues `fn`; false (fn dropped) only when out of memory. Never runs user code on
  /// the caller, which may hold a lease's callbacks_mu.
  bool post(std::function<void()> fn) noexcept DISTLOCK_EXCLUDES(mu_);
  /// Blocks until everything queued so far has run and the thread is idle; returns at
  /// once on the event thread itself (it would wait for itself).
  void drain() DISTLOCK_EXCLUDES(mu_);
  /// Lets what is queued run, then ends and joins the thread.
  void stop_and_join() DISTLOCK_EXCLUDES(mu_);
  bool on_thread() const noexcept;
  std::thread::id thread_id() const noexcept { return thread_.get_id(); }

 private:
  void main() noexcept DISTLOCK_EXCLUDES(mu_);

  AnnotatedMutex mu_;
  std::condition_variable cv_;       // work queued, or stop
  std::condition_variable idle_cv_;  // queue empty and nothing running (drain)
  std::deque<std::function<void()>> queue_ DISTLOCK_GUARDED_BY(mu_);
  bool running_ DISTLOCK_GUARDED_BY(mu_) = false;  // a callback is running
  bool stop_ DISTLOCK_GUARDED_BY(mu_) = false;
  std::thread thread_;  // written by start() before any other thread sees the queue
};

}  // namespace distlock::detail
