// A background thread woken through an eventfd: the shape every backend's
// notification thread shares (file notifier, Redis subscriber, Sentinel monitor,
// PostgreSQL listener). The body polls wake_fd() beside its own descriptors and
// returns once stopping() is true (or its own stop condition holds). stop() (also
// run by the destructor) sets stopping(), wakes the body and joins it, so a backend
// destroys everything the body uses only after the thread is gone.
//
// Thread-safety: every member from any thread (start() once); stop() from any thread
// but the worker itself. mu_ guards the thread object only and is never held while
// joining, so a body may call wake() or stopping() at any time.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <thread>
#include <utility>

#include "engine/thread_annotations.hpp"

namespace distlock::detail {

class WorkerLoop {
 public:
  /// Makes the wake eventfd. On failure valid() is false and error() holds errno:
  /// the owner decides whether that is fatal (most throw) or degraded (file://).
  WorkerLoop() noexcept : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), error_(fd_ < 0 ? errno : 0) {}
  ~WorkerLoop() {
    stop();
    if (fd_ >= 0) ::close(fd_);
  }
  WorkerLoop(const WorkerLoop&) = delete;
  WorkerLoop& operator=(const WorkerLoop&) = delete;

  bool valid() const noexcept { return fd_ >= 0; }
  int error() const noexcept { return error_; }
  int wake_fd() const noexcept { return fd_; }

  /// Runs `body` on a new thread. Once per loop; throws std::system_error if no
  /// thread can be had.
  template <class F>
  void start(F&& body) {
    LockGuard lk(mu_);
    thread_ = std::thread(std::forward<F>(body));
  }
  bool started() noexcept {
    LockGuard lk(mu_);
    return thread_.joinable();
  }

  /// Makes wake_fd() readable until clear_wake().
  void wake() const noexcept {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(fd_, &one, sizeof one);
  }
  /// Consumes pending wake-ups (the body, after poll saw wake_fd() readable).
  void clear_wake() const noexcept {
    std::uint64_t v = 0;
    [[maybe_unused]] const auto n = ::read(fd_, &v, sizeof v);
  }
  bool stopping() const noexcept { return stop_.load(std::memory_order_acquire); }

  /// Asks the body to return (stopping(), a wake-up) and joins it. Idempotent.
  void stop() noexcept {
    stop_.store(true, std::memory_order_release);
    std::thread t;
    {
      LockGuard lk(mu_);
      t = std::move(thread_);
    }
    if (!t.joinable()) return;
    if (fd_ >= 0) wake();
    t.join();
  }

 private:
  const int fd_;
  const int error_;
  std::atomic<bool> stop_{false};
  AnnotatedMutex mu_;
  std::thread thread_ DISTLOCK_GUARDED_BY(mu_);
};

}  // namespace distlock::detail
