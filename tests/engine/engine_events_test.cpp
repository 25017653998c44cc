// Which thread runs user callbacks (issue 13): every Lease::on_lost callback runs on
// the client's one event thread; the loss signal (owns() false, stop token) happens
// on the thread that detects the loss and never waits for a callback.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "api/client_access.hpp"
#include "distlock/shared_mutex.hpp"
#include "engine/engine.hpp"
#include "support/memory_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::testing::ttl;

struct EngineEvents : distlock::testing::ManualMemoryTest {};

// Long enough for any loaded machine, only ever spent when the test fails.
constexpr auto kBound = 5s;

TEST_F(EngineEvents, OnLostRunsOnTheEventThreadNotOnTheDetectingThread) {
  auto c = client();
  auto lease = c.acquire("ev", ttl(1s));
  std::promise<std::thread::id> ran;
  lease.on_lost([&] { ran.set_value(std::this_thread::get_id()); });
  clock->advance(950ms);
  distlock::detail::engine_of(c)->tick();  // this thread detects the loss
  EXPECT_TRUE(lease.stop_token().stop_requested()) << "the loss signal is given by the detecting thread";
  auto f = ran.get_future();
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready) << "on_lost never ran";
  const std::thread::id id = f.get();
  EXPECT_NE(id, std::this_thread::get_id()) << "on_lost ran on the thread that called tick()";
  EXPECT_EQ(id, distlock::detail::engine_of(c)->event_thread_id());
}

TEST_F(EngineEvents, ABackendThreadsLossReportRunsCallbacksOnTheEventThread) {
  auto c = client();
  auto lease = c.acquire("ev-session", ttl(3s));
  std::promise<std::thread::id> ran;
  lease.on_lost([&] { ran.set_value(std::this_thread::get_id()); });
  std::thread::id reporter;
  std::thread backend_thread([&] {  // as a keep-alive thread reports an ended session
    reporter = std::this_thread::get_id();
    distlock::detail::engine_of(c)->on_session_lost();
  });
  backend_thread.join();
  EXPECT_TRUE(lease.stop_token().stop_requested()) << "signalled before on_session_lost returned";
  auto f = ran.get_future();
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
  const std::thread::id id = f.get();
  EXPECT_NE(id, reporter) << "the callback ran on the backend's thread";
  EXPECT_EQ(id, distlock::detail::engine_of(c)->event_thread_id());
}

TEST_F(EngineEvents, ACallbackAddedAfterTheLossRunsOnTheEventThreadToo) {
  auto c = client();
  auto lease = c.acquire("ev-late", ttl(1s));
  clock->advance(950ms);
  distlock::detail::engine_of(c)->tick();
  ASSERT_FALSE(lease.owns());
  std::promise<std::thread::id> ran;
  lease.on_lost([&] { ran.set_value(std::this_thread::get_id()); });
  auto f = ran.get_future();
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
  const std::thread::id id = f.get();
  EXPECT_NE(id, std::this_thread::get_id()) << "the late callback ran on the registering thread";
  EXPECT_EQ(id, distlock::detail::engine_of(c)->event_thread_id());
}

// The safety half of the rule: a callback that blocks holds up later callbacks only,
// never another lease's loss signal.
TEST_F(EngineEvents, ABlockingCallbackDoesNotDelayAnotherLeasesStopToken) {
  auto c = client();
  auto a = c.acquire("a-blocks", ttl(1s));  // sorted first: declared lost first
  auto b = c.acquire("b-signalled", ttl(1s));
  std::mutex mu;
  std::condition_variable cv;
  bool in_a = false, let_go = false;
  a.on_lost([&] {
    std::unique_lock lk(mu);
    in_a = true;
    cv.notify_all();
    cv.wait(lk, [&] { return let_go; });
  });
  std::promise<void> b_stopped;
  std::stop_callback on_b(b.stop_token(), [&] { b_stopped.set_value(); });
  clock->advance(950ms);
  std::thread detector([&] { distlock::detail::engine_of(c)->tick(); });
  const bool signalled = b_stopped.get_future().wait_for(kBound) == std::future_status::ready;
  bool a_ran = false;
  {
    std::unique_lock lk(mu);
    a_ran = cv.wait_for(lk, kBound, [&] { return in_a; });
    let_go = true;
    cv.notify_all();
  }
  detector.join();
  EXPECT_TRUE(signalled) << "b's stop token waited for a's blocking on_lost callback";
  EXPECT_TRUE(a_ran);
  EXPECT_FALSE(b.owns());
}

// A read-write lease's combined stop token is part of the loss signal too: it must
// not wait behind a user callback that blocks the event thread.
TEST_F(EngineEvents, ABlockingCallbackDoesNotDelayAReadWriteLeasesStopToken) {
  auto c = client();
  auto a = c.acquire("a-blocks", ttl(1s));
  auto rw = c.shared_mutex("rw", ttl(1s));
  distlock::ReadWriteLease w = rw.acquire_exclusive();
  std::mutex mu;
  std::condition_variable cv;
  bool let_go = false;
  a.on_lost([&] {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return let_go; });
  });
  clock->advance(950ms);
  auto ticked = std::async(std::launch::async, [&] { distlock::detail::engine_of(c)->tick(); });
  const bool tick_returned = ticked.wait_for(kBound) == std::future_status::ready;
  const bool signalled = w.stop_token().stop_requested();
  {
    std::lock_guard lk(mu);
    let_go = true;
    cv.notify_all();
  }
  ticked.wait();
  EXPECT_TRUE(tick_returned) << "the detecting thread ran the blocking callback";
  EXPECT_TRUE(signalled) << "the read-write lease's stop token waited for a user callback";
  EXPECT_FALSE(w.owns());
}

// A callback may call back into its client (release another lease, acquire a lock,
// even wait for one) without deadlocking the thread that detected the loss.
TEST_F(EngineEvents, ACallbackMayReleaseAndAcquireOnTheSameClient) {
  auto c = client();
  auto lost = c.acquire("cb-lost", ttl(1s));
  auto other = std::make_shared<distlock::Lease>(c.acquire("cb-other", ttl(10s)));
  auto held = c.acquire("cb-held", ttl(10s));  // released by this thread after tick() returns
  std::promise<bool> done;
  lost.on_lost([&, c, other]() mutable {
    try {
      other->release();
      auto again = c.acquire("cb-held", ttl(10s));  // waits for this test's thread
      done.set_value(again.owns());
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  });
  clock->advance(950ms);
  auto ticked = std::async(std::launch::async, [&] { distlock::detail::engine_of(c)->tick(); });
  const bool tick_returned = ticked.wait_for(kBound) == std::future_status::ready;
  held.release();  // lets the callback's acquisition through either way
  ticked.wait();
  EXPECT_TRUE(tick_returned) << "tick() ran a callback that waits for this thread: deadlock";
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready) << "the callback's acquisition never completed";
  EXPECT_TRUE(f.get());
  EXPECT_FALSE(store->held("cb-other", clock->now())) << "the callback's release reached the server";
}

TEST_F(EngineEvents, AThrowingCallbackIsLoggedAndTheNextOneStillRuns) {
  std::atomic<int> errors{0};
  auto o = options();
  o.logger = [&](distlock::LogLevel level, std::string_view) {
    if (level == distlock::LogLevel::error) ++errors;
  };
  auto c = distlock::connect("memory://" + store_name, o);
  auto lease = c.acquire("ev-throws", ttl(1s));
  std::promise<void> second;
  lease.on_lost([] { throw std::runtime_error("user bug"); });
  lease.on_lost([&] { second.set_value(); });
  clock->advance(950ms);
  distlock::detail::engine_of(c)->tick();
  ASSERT_EQ(second.get_future().wait_for(kBound), std::future_status::ready);
  distlock::detail::engine_of(c)->drain_events();
  EXPECT_EQ(errors.load(), 1);
}

TEST_F(EngineEvents, DrainEventsWaitsForQueuedCallbacks) {
  auto c = client();
  auto lease = c.acquire("ev-drain", ttl(1s));
  std::atomic<int> calls{0};
  lease.on_lost([&] { ++calls; });
  lease.on_lost([&] { ++calls; });
  clock->advance(950ms);
  distlock::detail::engine_of(c)->tick();
  distlock::detail::engine_of(c)->drain_events();
  EXPECT_EQ(calls.load(), 2);
}

}  // namespace
