// A waiting `distlock run` that is stopped or killed never holds the line on
// redis:// (issue 27 items 2 and 3, docs/design.md "A dead waiter"): the next live
// waiter gets the lock (or a semaphore permit) within 3 s of the release, measured
// on this process's steady clock, whatever the dead waiter's TTL.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_harness.hpp"
#include "distlock/client.hpp"
#include "distlock/semaphore.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/process.hpp"
#include "support/redis_probes.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

using distlock::testing::ttl_of;

long long ms_between(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration_cast<Millis>(to - from).count();
}

// A holds "line" (ttl 5 s); a `distlock run --ttl 30s --wait 60s line` queues behind
// it, a live client C behind that. The runner gets SIGTERM or SIGINT (how systemd,
// Kubernetes and Ctrl-C stop it), withdraws its queue entry and exits with the signal's
// conventional status; A releases; C has the lock within 3 s of the release.
class CliDeadWaiter : public ::testing::TestWithParam<int> {};

TEST_P(CliDeadWaiter, ARunnerStoppedWhileWaitingDelaysTheNextWaiterByAtMost3s) {
  const int sig = GetParam();
  TempDir dir("distlock-cli-deadwaiter");
  RedisServer redis;
  Client a_client = connect(redis.url());
  Lease a = a_client.acquire("line", ttl_of(5s));
  Cli b = Cli::start({"run", "--url", redis.url(), "--ttl", "30s", "--wait", "60s", "line", "--", "true"},
                     dir.path());
  ASSERT_TRUE(eventually([&] { return waiters_of(a_client, "line") == 1u; }, 20s)) << b.err();
  Client c_client = connect(redis.url());
  std::atomic<bool> got{false};
  SteadyClock::time_point got_at{};
  std::thread ct([&] {
    std::error_code ec;
    Lease l = c_client.acquire("line", ttl_of(30s, 60s), ec);
    EXPECT_FALSE(ec) << ec.message();
    got_at = SteadyClock::now();
    got = true;
  });
  ASSERT_TRUE(eventually([&] { return waiters_of(a_client, "line") == 2u; }, 20s));
  b.signal(sig);
  EXPECT_EQ(b.wait(10s), 128 + sig) << b.err();
  // The runner cancelled its wait (LockOptions::cancel) before dying of the signal: its
  // queue entry is gone by the time it has exited, not left for the server to expire.
  EXPECT_EQ(waiters_of(a_client, "line"), 1u) << "the stopped runner left its queue entry behind";
  const auto released_at = SteadyClock::now();
  a.release();
  ct.join();
  ASSERT_TRUE(got.load());
  const long long stall = ms_between(released_at, got_at);
  std::printf(
      "runner stopped by signal %d while waiting: the next waiter got the lock %lld ms after the release\n",
      sig, stall);
  EXPECT_LE(stall, 3000) << "the live waiter waited for the stopped runner's queue entry";
}

INSTANTIATE_TEST_SUITE_P(Signals, CliDeadWaiter, ::testing::Values(SIGTERM, SIGINT),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::string(p.param == SIGTERM ? "Term" : "Int");
                         });

// Item 3: a semaphore waiter queues in every permit's queue. With 3 permits all held
// and one SIGKILLed `distlock run --permits 3` waiter (ttl 30 s) queued in each, a
// try_acquire gets a permit within 3 s of one release (polled, bounded by that
// deadline), and a live waiter gets one within 3 s of a second release.
TEST(CliDeadWaiterSemaphore, OneKilledWaiterDoesNotTakeEveryPermit) {
  TempDir dir("distlock-cli-deadsem");
  RedisServer redis;
  Client holder = connect(redis.url());
  Semaphore held_sem = holder.semaphore("pool", 3, ttl_of(10s, 10s));
  std::vector<Lease> permits;
  for (int i = 0; i < 3; ++i) permits.push_back(held_sem.acquire());
  auto permit = [](int i) { return std::string("pool") + '\x1f' + "sem" + '\x1f' + std::to_string(i); };
  Cli b = Cli::start(
      {"run", "--url", redis.url(), "--permits", "3", "--ttl", "30s", "--wait", "60s", "pool", "--", "true"},
      dir.path());
  ASSERT_TRUE(eventually(
      [&] {
        for (int i = 0; i < 3; ++i) {
          if (waiters_of(holder, permit(i)) != 1u) return false;
        }
        return true;
      },
      20s))
      << b.err();
  b.signal(SIGKILL);
  ASSERT_EQ(b.wait(10s), 128 + SIGKILL);

  // try_acquire, by another client, after one release.
  Client d_client = connect(redis.url());
  Semaphore d_sem = d_client.semaphore("pool", 3, ttl_of(30s));
  const auto released_at = SteadyClock::now();
  permits.pop_back();
  std::optional<Lease> d;
  while (!d && SteadyClock::now() - released_at < 3s) {
    d = d_sem.try_acquire();
    if (!d) std::this_thread::sleep_for(20ms);
  }
  std::printf("semaphore: try_acquire got a permit %lld ms after a release\n",
              ms_between(released_at, SteadyClock::now()));
  EXPECT_TRUE(d.has_value()) << "try_acquire found no permit within 3 s of a release";

  // A live waiter, after a second release. It has queued once the first permit's queue
  // holds a member that was not there before it started (the dead waiter's may be).
  const std::string queue0 = "distlock:{" + permit(0) + "}:q";
  auto members = [&] {
    std::vector<std::string> out;
    auto r = redis.command({"LRANGE", queue0, "0", "-1"});
    for (std::size_t i = 0; r && i < r->elements; ++i)
      out.emplace_back(r->element[i]->str, r->element[i]->len);
    return out;
  };
  const std::vector<std::string> before = members();
  Client c_client = connect(redis.url());
  std::atomic<bool> got{false};
  SteadyClock::time_point got_at{};
  std::thread ct([&] {
    Semaphore sem = c_client.semaphore("pool", 3, ttl_of(30s, 60s));
    std::error_code ec;
    Lease l = sem.acquire(ec);
    EXPECT_FALSE(ec) << ec.message();
    got_at = SteadyClock::now();
    got = true;
  });
  ASSERT_TRUE(eventually(
      [&] {
        for (const auto& m : members()) {
          if (std::find(before.begin(), before.end(), m) == before.end()) return true;
        }
        return false;
      },
      20s));
  const auto released2_at = SteadyClock::now();
  permits.pop_back();
  ct.join();
  ASSERT_TRUE(got.load());
  const long long stall = ms_between(released2_at, got_at);
  std::printf("semaphore: the next waiter got a permit %lld ms after a release\n", stall);
  EXPECT_LE(stall, 3000) << "a killed waiter held the released permit";
}

}  // namespace
}  // namespace distlock::testing
