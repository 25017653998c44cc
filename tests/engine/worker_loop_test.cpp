// engine/worker_loop.hpp: the backends' notification-thread helper.
#include "engine/worker_loop.hpp"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <future>

namespace {

using distlock::detail::WorkerLoop;

// The body's shape in every backend: poll the wake fd (beside its own), return on stop.
void poll_until_stopped(WorkerLoop& loop, std::atomic<int>& wakes) {
  while (!loop.stopping()) {
    pollfd p{loop.wake_fd(), POLLIN, 0};
    if (::poll(&p, 1, -1) > 0 && (p.revents & POLLIN)) {
      loop.clear_wake();
      ++wakes;
    }
  }
}

TEST(WorkerLoop, WakeReachesABodyBlockedInPollAndStopJoinsIt) {
  WorkerLoop loop;
  ASSERT_TRUE(loop.valid());
  std::atomic<int> wakes{0};
  loop.start([&] { poll_until_stopped(loop, wakes); });
  EXPECT_TRUE(loop.started());
  loop.wake();
  // Bounded: poll blocks forever (-1), so only the wake-up can end the wait.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (wakes.load() == 0 && std::chrono::steady_clock::now() < end) std::this_thread::yield();
  EXPECT_GE(wakes.load(), 1);
  auto stopped = std::async(std::launch::async, [&] { loop.stop(); });
  ASSERT_EQ(stopped.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "stop() did not wake the body";
  EXPECT_TRUE(loop.stopping());
  EXPECT_FALSE(loop.started()) << "joined";
  loop.stop();  // idempotent
}

TEST(WorkerLoop, NeverStartedIsDestroyedWithoutJoining) {
  WorkerLoop loop;
  loop.wake();
  loop.clear_wake();
  EXPECT_FALSE(loop.started());
}

}  // namespace
