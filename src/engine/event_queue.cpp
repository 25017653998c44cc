#include "engine/event_queue.hpp"

#include <utility>

namespace distlock::detail {

namespace {
thread_local int t_user_code_depth = 0;
}  // namespace

UserCodeScope::UserCodeScope() noexcept {
  ++t_user_code_depth;
}

UserCodeScope::~UserCodeScope() {
  --t_user_code_depth;
}

bool UserCodeScope::active() noexcept {
  return t_user_code_depth > 0;
}

EventQueue::~EventQueue() {
  stop_and_join();
}

void EventQueue::start() {
  thread_ = std::thread([this] { main(); });
}

bool EventQueue::post(std::function<void()> fn) noexcept {
  LockGuard lk(mu_);
  try {
    queue_.push_back(std::move(fn));
  } catch (...) {
    return false;  // out of memory: never run user code here instead (the caller may hold a lock)
  }
  cv_.notify_one();
  return true;
}

void EventQueue::main() noexcept {
  UniqueLock lk(mu_);
  for (;;) {
    while (!stop_ && queue_.empty()) cv_.wait(lk.native());
    if (queue_.empty()) return;  // stopped, and everything queued has run
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lk.unlock();
    {
      // Counted while the callback (and what it captured) is destroyed too: it may
      // hold the last Client copy, and the engine's deleter must then not join this
      // thread from itself.
      UserCodeScope user_code;
      try {
        fn();
      } catch (...) {
      }
      fn = nullptr;
    }
    lk.lock();
    running_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void EventQueue::drain() {
  if (on_thread()) return;
  UniqueLock lk(mu_);
  while (!queue_.empty() || running_) idle_cv_.wait(lk.native());
}

void EventQueue::stop_and_join() {
  if (!thread_.joinable()) return;
  {
    LockGuard lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  thread_.join();
}

bool EventQueue::on_thread() const noexcept {
  return thread_.joinable() && thread_.get_id() == std::this_thread::get_id();
}

}  // namespace distlock::detail
