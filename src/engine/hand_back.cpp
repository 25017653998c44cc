#include "engine/hand_back.hpp"

#include <utility>

namespace distlock::detail {

void HandBackQueue::queue(const std::shared_ptr<HeldLock>& held) noexcept {
  LockGuard lk(mu_);
  if (closed_) return;
  try {
    queue_.push_back(held);
  } catch (...) {
    return;  // no memory: the server's own expiry stays the bound
  }
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { main(); });
      thread_id_.store(thread_.get_id(), std::memory_order_release);
    } catch (...) {
      queue_.pop_back();  // no thread to be had: as above
      return;
    }
  }
  cv_.notify_one();
}

void HandBackQueue::main() noexcept {
  UniqueLock lk(mu_);
  for (;;) {
    while (!closed_ && queue_.empty()) cv_.wait(lk.native());
    if (closed_) return;  // the engine's destructor hands back what is left
    std::vector<std::shared_ptr<HeldLock>> batch;
    batch.swap(queue_);
    ++running_;
    lk.unlock();
    for (auto& h : batch) hand_back_(*h);
    batch.clear();
    lk.lock();
    --running_;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void HandBackQueue::drain() {
  if (on_thread()) return;
  UniqueLock lk(mu_);
  while (!closed_ && (!queue_.empty() || running_ > 0)) idle_cv_.wait(lk.native());
}

std::vector<std::shared_ptr<HeldLock>> HandBackQueue::close_and_join() {
  std::vector<std::shared_ptr<HeldLock>> left;
  std::thread thread;
  {
    LockGuard lk(mu_);
    closed_ = true;
    left.swap(queue_);
    thread.swap(thread_);
    cv_.notify_all();
    idle_cv_.notify_all();  // a drain() under way returns
  }
  if (thread.joinable()) thread.join();
  return left;
}

}  // namespace distlock::detail
