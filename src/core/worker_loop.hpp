// A background thread woken through an eventfd: the shape every backend's
// notification thread shares (file notifier, Redis subscriber, Sentinel monitor,
// PostgreSQL listener). The body polls wake_fd() beside its own descriptors and
// returns once stopping() is true (or its own stop condition holds). stop() (also
// run by the destructor) sets stopping(), wakes the body and joins it, so a backend
// destroys everything the body uses only after the thread is gone.
//
// Thread-safety: wake(), clear_wake(), stopping() and wake_fd() from any thread;
// start() once; stop() from any thread but the worker itself.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <thread>
#include <utility>

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
    thread_ = std::thread(std::forward<F>(body));
  }
  bool started() const noexcept { return thread_.joinable(); }

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
    if (!thread_.joinable()) return;
    if (fd_ >= 0) wake();
    thread_.join();
  }

 private:
  const int fd_;
  const int error_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace distlock::detail
