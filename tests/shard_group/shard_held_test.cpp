// OwnedShard::held(): the check a shard's user makes right before a write, evaluated against
// the shard lease's local deadline at the moment of the call, never late.
//
// The shard group runs on the in-process memory:// backend with a manual clock and no
// background renewer: the engine's watchdog, which fires a lost lease's stop token at its
// local deadline, never runs unless the test calls tick(). That is the watchdog of a starved
// process (a thread that has not been scheduled yet, a process resumed from SIGSTOP): the
// deadline has passed and the stop token has not fired. held() must already say false then,
// and must follow the deadline as renewals move it.
//
// Every wait on the group's own thread is bounded by kWait (real time, this process's steady
// clock); the lease times are on the manual clock and exact.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "support/memory_fixture.hpp"

using namespace std::chrono_literals;
using distlock::Millis;

namespace {

constexpr Millis kTtl = 10s;    // local deadline = grant's send time + ttl - safety margin (ttl/10)
constexpr Millis kMargin = 1s;  // the default safety margin at kTtl
constexpr Millis kWait = 10s;   // real-time bound of waiting for the group's first assignment

struct ShardHeldTest : distlock::testing::ManualMemoryTest {
  distlock::ShardGroupOptions group_options() {
    distlock::ShardGroupOptions o;
    o.lock.ttl = kTtl;
    // One rebalance at the start, then none during the test: nothing but the test's own
    // tick() looks at the leases, so the stop tokens stay as the watchdog left them.
    o.rebalance_period = std::chrono::hours(1);
    o.member_id = "m1";
    return o;
  }
  // The single shard of a one-member group, once assigned (fails the test otherwise).
  distlock::OwnedShard first_shard(const distlock::ShardGroup& g) {
    const distlock::ShardAssignment a = g.wait_change(0, kWait);
    EXPECT_EQ(a.shards.size(), 1U) << "no assignment within " << kWait.count() << " ms";
    return a.shards.empty() ? distlock::OwnedShard{} : a.shards.front();
  }
  // A client, its group of one shard for `job`, and that shard once assigned.
  struct OneShard {
    distlock::Client c;
    distlock::ShardGroup g;
    distlock::OwnedShard s;
  };
  OneShard one_shard(const std::string& job) {
    distlock::Client c = client();
    distlock::ShardGroup g = c.shard_group(job, 1, group_options());
    const distlock::OwnedShard s = first_shard(g);
    return {std::move(c), std::move(g), s};
  }
};

TEST_F(ShardHeldTest, FalseOnceTheLocalDeadlinePassedThoughTheStopTokenHasNotFired) {
  auto [c, g, s] = one_shard("held-job");
  ASSERT_TRUE(s.held());
  // 1 ms before the local deadline: still held.
  clock->advance(kTtl - kMargin - 1ms);
  EXPECT_TRUE(s.held());
  EXPECT_FALSE(s.stop.stop_requested());
  // At the deadline the watchdog has not run: its stop token is still unrequested, and a user
  // who checked it would write as an owner. held() reads the deadline itself.
  clock->advance(1ms);
  EXPECT_FALSE(s.stop.stop_requested()) << "the watchdog ran: the test shows nothing about a late one";
  EXPECT_FALSE(s.held()) << "held() says owned past the shard lease's local deadline";
  // The late watchdog fires the stop token; held() stays false.
  distlock::detail::engine_of(c)->tick();
  EXPECT_TRUE(s.stop.stop_requested());
  EXPECT_FALSE(s.held());
}

TEST_F(ShardHeldTest, FollowsTheDeadlineARenewalExtended) {
  auto [c, g, s] = one_shard("held-renew");
  ASSERT_TRUE(s.held());
  // Half a TTL on, a renewal (sent now) moves the deadline to now + ttl - margin.
  clock->advance(kTtl / 2);
  distlock::detail::engine_of(c)->tick();
  ASSERT_FALSE(s.stop.stop_requested());
  // Past the first deadline, before the renewed one: held (a copy of the first deadline
  // would say lost here).
  clock->advance(kTtl / 2 - kMargin + 1ms);
  EXPECT_TRUE(s.held()) << "held() kept the deadline of the grant, not the renewed one";
  // Past the renewed deadline, no watchdog yet: not held.
  clock->advance(kTtl / 2);
  EXPECT_FALSE(s.stop.stop_requested());
  EXPECT_FALSE(s.held());
}

TEST_F(ShardHeldTest, FalseOnceGivenUpAndForAnEmptyShard) {
  auto [c, g, s] = one_shard("held-leave");
  const distlock::OwnedShard copy = s;  // copies share the check
  ASSERT_TRUE(copy.held());
  g.leave();
  EXPECT_FALSE(s.held());
  EXPECT_FALSE(copy.held());
  EXPECT_FALSE(distlock::OwnedShard{}.held());
}

// A copy of an OwnedShard outlives its group and its client: held() and remaining() read the
// shared check, which the group emptied when it gave the shard up; no dangling read.
TEST_F(ShardHeldTest, CopiesOutlivingTheGroupAndTheClientSayNotHeld) {
  distlock::OwnedShard copy;
  {
    distlock::Client c = client();
    std::optional<distlock::ShardGroup> g;
    g.emplace(c.shard_group("held-outlive", 1, group_options()));
    copy = first_shard(*g);
    ASSERT_TRUE(copy.held());
    EXPECT_GT(copy.remaining().count(), 0);
    // A moved group keeps the shard: the copy still says held.
    distlock::ShardGroup moved = std::move(*g);
    g.reset();
    EXPECT_TRUE(copy.held()) << "moving the group gave the shard up";
  }
  EXPECT_FALSE(copy.held());
  EXPECT_EQ(copy.remaining().count(), 0);
}

// remaining() follows held(): the time to the local deadline, zero from the deadline on,
// before the watchdog has fired the stop token.
TEST_F(ShardHeldTest, RemainingIsTheTimeToTheDeadlineAndZeroPastIt) {
  auto [c, g, s] = one_shard("held-remaining");
  EXPECT_EQ(s.remaining(), kTtl - kMargin);
  clock->advance(kTtl - kMargin - 1ms);
  EXPECT_EQ(s.remaining(), 1ms);
  clock->advance(1ms);
  EXPECT_FALSE(s.stop.stop_requested());
  EXPECT_EQ(s.remaining().count(), 0);
}

// held() never waits for a renewal's round trip: the renewal (a store that hangs each renew for
// kHang, real time) runs on another thread while this one calls held() in a bounded loop until
// the renewal returns. Each call is timed on this process's steady clock: none may take
// kCallBound (a call that waited for the renewal would take about kHang).
TEST_F(ShardHeldTest, DoesNotWaitForARenewalsRoundTrip) {
  constexpr Millis kHang = 1500ms;
  constexpr Millis kCallBound = 500ms;
  auto [c, g, s] = one_shard("held-stall");
  ASSERT_TRUE(s.held());
  store->set_renew_delay(kHang);
  clock->advance(kTtl / 2);  // a renewal is due
  const int renews_before = store->renew_calls();
  std::atomic<bool> done{false};
  const auto started = std::chrono::steady_clock::now();
  std::thread renewer([&] {
    distlock::detail::engine_of(c)->tick();
    done = true;
  });
  std::chrono::steady_clock::duration slowest{};
  long calls = 0;
  const auto give_up_at = started + 4 * kHang;
  while (!done.load() && std::chrono::steady_clock::now() < give_up_at) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(s.held());  // the manual clock stands still: before the deadline throughout
    slowest = std::max(slowest, std::chrono::steady_clock::now() - t0);
    ++calls;
    std::this_thread::yield();
  }
  renewer.join();
  const auto renew_took = std::chrono::steady_clock::now() - started;
  store->set_renew_delay(0ms);
  ASSERT_GT(store->renew_calls(), renews_before) << "no renewal ran: the test shows nothing";
  ASSERT_GE(renew_took, kHang) << "the renewal did not hang: the test shows nothing";
  EXPECT_GT(calls, 0);
  EXPECT_LT(slowest, kCallBound) << "held() waited " << std::chrono::duration_cast<Millis>(slowest).count()
                                 << " ms behind a renewal's round trip";
}

// leave() on one thread while others call held(): every reader sees held() false once leave()
// has returned, and none blocks (each reader's loop is bounded in count and time). Run under
// -DDISTLOCK_SANITIZE=thread for the data races.
TEST_F(ShardHeldTest, LeaveRacingHeldOnOtherThreadsEndsFalse) {
  auto [c, g, s] = one_shard("held-race");
  ASSERT_TRUE(s.held());
  std::atomic<bool> left{false};
  std::atomic<int> saw_true{0}, false_after_leave{0}, true_after_leave{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&, copy = s] {
      const auto end = std::chrono::steady_clock::now() + kWait;
      bool seen_true = false;
      for (long i = 0; i < 10'000'000 && std::chrono::steady_clock::now() < end; ++i) {
        const bool after = left.load();
        const bool h = copy.held();
        if (h && !seen_true) {
          seen_true = true;
          ++saw_true;
        }
        if (after) {
          ++(h ? true_after_leave : false_after_leave);
          return;
        }
      }
    });
  }
  // Let every reader see the shard held first (bounded).
  const auto until = std::chrono::steady_clock::now() + kWait;
  while (saw_true.load() < 3 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  ASSERT_EQ(saw_true.load(), 3);
  g.leave();
  left = true;
  for (auto& r : readers) r.join();
  EXPECT_EQ(true_after_leave.load(), 0) << "held() said owned after leave() returned";
  EXPECT_EQ(false_after_leave.load(), 3);
}

// What `forks` children did, each running child(k) under alarm(child_bound) and exiting with
// its result: killed by the alarm (hung), exit 1, or anything but exit 0 (other).
struct ForkOutcomes {
  int hung = 0, exited_1 = 0, other = 0;
};
template <class Child>
ForkOutcomes fork_children(int forks, unsigned child_bound, Child child) {
  ForkOutcomes out;
  for (int k = 0; k < forks; ++k) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(child_bound);
      ::_exit(child(k));
    }
    EXPECT_GT(pid, 0);
    if (pid <= 0) break;
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
      ++out.hung;
    else if (WIFEXITED(status) && WEXITSTATUS(status) == 1)
      ++out.exited_1;
    else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      ++out.other;
  }
  return out;
}

// A thread that calls `busy()` over and over, holding whatever mutex it takes, while children are
// forked: it stops when `busy()` returns false, at `stop`, or at its bounds (10^9 calls, 4 x kWait
// on the steady clock).
std::thread spin_while(std::atomic<bool>& stop, std::function<bool()> busy) {
  return std::thread([&stop, busy = std::move(busy)] {
    const auto end = std::chrono::steady_clock::now() + 4 * kWait;
    for (long i = 0; i < 1'000'000'000 && !stop.load(std::memory_order_relaxed); ++i) {
      if (!busy()) break;
      if ((i & 1023) == 0 && std::chrono::steady_clock::now() > end) break;
    }
  });
}

constexpr int kForks = 200;
constexpr unsigned kChildBound = 2;  // seconds, each child's own alarm

// kForks children forked one after another (fork_children, each under alarm(kChildBound)) while
// another thread keeps calling `busy` (spin_while), so that a child is likely forked while that
// thread holds a mutex of the library; that thread is stopped and joined before this returns.
template <class Child>
ForkOutcomes fork_children_while_busy(std::function<bool()> busy, Child child) {
  std::atomic<bool> stop{false};
  std::thread spinner = spin_while(stop, std::move(busy));
  const ForkOutcomes o = fork_children(kForks, kChildBound, child);
  stop = true;
  spinner.join();
  return o;
}

// A child forked while another thread is inside held() (holding the check's mutex) never owns
// the shard (a child never owns its parent's leases) and must say so without waiting for that
// mutex, which no thread of the child will ever unlock. Each child answers under alarm(kChildBound):
// one killed by SIGALRM waited on the mutex. Bounded: kForks forks, each child within its alarm.
TEST_F(ShardHeldTest, AForkedChildSaysNotHeldWithoutWaitingForTheParentsThreads) {
  auto [c, g, s] = one_shard("held-fork");
  ASSERT_TRUE(s.held());
  const ForkOutcomes o =
      fork_children_while_busy([&] { return s.held(); }, [&](int) { return s.held() ? 1 : 0; });
  const int hung = o.hung, said_held = o.exited_1, other = o.other;
  EXPECT_TRUE(s.held()) << "the parent lost the shard: the spinner stopped early";
  EXPECT_EQ(hung, 0) << hung << " of " << kForks << " children hung in held() for " << kChildBound << " s";
  EXPECT_EQ(said_held, 0) << "a forked child said it holds its parent's shard";
  EXPECT_EQ(other, 0);
}

// A child forked from a process with a live member: the group is the parent's. Its leave()
// (and destructor) in the child returns at once, touches nothing of the parent's (the parent
// still owns its shard and is still listed), and the child's group then owns nothing. The
// children are forked while another thread reads the assignment (holding the group's mutex,
// as the group's own thread does during a rebalance): a child whose leave() waited for that
// mutex, which no thread of the child will ever unlock, hung. Each child answers under
// alarm(kChildBound); a child killed by SIGALRM hung.
TEST_F(ShardHeldTest, AForkedChildsLeaveReturnsAtOnceAndLeavesTheParentsShards) {
  auto [c, g, s] = one_shard("leave-fork");
  ASSERT_TRUE(s.held());
  const ForkOutcomes o = fork_children_while_busy([&] { return g.assigned().shards.size() == 1; },
                                                  [&](int k) {
                                                    if (k % 2 == 0) {
                                                      g.leave();
                                                    } else {
                                                      distlock::ShardGroup moved =
                                                          std::move(g);  // the destructor leaves
                                                    }
                                                    return g.assigned().shards.empty() && !s.held() ? 0 : 1;
                                                  });
  const int hung = o.hung, owned_after = o.exited_1, other = o.other;
  EXPECT_EQ(hung, 0) << hung << " of " << kForks << " children hung in leave() for " << kChildBound << " s";
  EXPECT_EQ(owned_after, 0) << "a child's group still listed a shard after its leave()";
  EXPECT_EQ(other, 0);
  EXPECT_TRUE(s.held()) << "a child's leave() gave up the parent's shard";
  EXPECT_EQ(g.assigned().shards.size(), 1U);
  EXPECT_EQ(c.list("leave-fork/members/").size(), 1U) << "a child's leave() released the parent's membership";
}

}  // namespace
