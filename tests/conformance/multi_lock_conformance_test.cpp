// Client::acquire_all / MultiLease (several names at once) over every backend the build has:
//   - two groups of 8 clients take overlapping name sets written in opposite orders, over
//     and over: no call runs out its wait (a deadlock would), and the per-name history of
//     (token, begin, end) intervals has no overlap and strictly increasing tokens;
//   - a loss of one name fires the whole multi-lease's stop token and turns owns() false;
//   - a call that cannot have every name within its wait returns errc::timeout within a
//     stated bound, with the names it took already released (another client takes the
//     first name with one attempt right after);
//   - duplicates are dropped, each name keeps its own token.
// Intervals are logged on CLOCK_MONOTONIC (one host, one process).
//
// The rounds per client are DISTLOCK_MULTI_LOCK_ROUNDS (default 40: 2 x 8 x 40 = 640 calls
// per backend, a few seconds each on 2 shared cores); scripts/multi_lock_soak.sh runs
// 10,000 per backend, one backend at a time, with DISTLOCK_MULTI_LOCK_SECONDS as a time
// budget: past it on the steady clock no client starts another round, and the history is
// checked against the calls that were made (unset, as in CI: no budget, every round runs).
#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/backend_mono_clock.hpp"
#include "support/backend_targets.hpp"
#include "support/client_options.hpp"

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

int rounds_per_client() {
  if (const char* v = std::getenv("DISTLOCK_MULTI_LOCK_ROUNDS")) {
    const int n = std::atoi(v);
    if (n > 0) return n;
  }
  return 40;
}

// 0: no time budget (every round runs).
int budget_seconds() {
  if (const char* v = std::getenv("DISTLOCK_MULTI_LOCK_SECONDS")) {
    const int n = std::atoi(v);
    if (n > 0) return n;
  }
  return 0;
}

// The q-quantile (nearest rank) of sorted durations, in ms.
double quantile_ms(const std::vector<std::int64_t>& sorted_ns, double q) {
  if (sorted_ns.empty()) return 0;
  const auto rank = static_cast<std::size_t>(q * static_cast<double>(sorted_ns.size() - 1) + 0.5);
  return static_cast<double>(sorted_ns[std::min(rank, sorted_ns.size() - 1)]) / 1e6;
}

// The client's count of notification channels found dead and connected anew (a waiter
// re-checks meanwhile), from its metrics text: said with a failed call.
std::string drops_line(const std::string& metrics) {
  std::size_t at = 0;
  while ((at = metrics.find("distlock_notification_channel_drops_total", at)) != std::string::npos) {
    if (at == 0 || metrics[at - 1] == '\n') return metrics.substr(at, metrics.find('\n', at) - at);
    ++at;
  }
  return "no notification channel drops line";
}

struct Interval {
  std::uint64_t token = 0;
  bool has_token = false;
  std::int64_t begin = 0;  // after acquire_all returned
  std::int64_t end = 0;    // before release
  int client = 0;          // group * 8 + index in the group
};

class MultiLock : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override { target_ = GetParam().make({}); }
  distlock::Client client() {
    distlock::ClientOptions o = quiet();
    o.lock_defaults.ttl = ttl(30s);
    return distlock::connect(target_->url(), o);
  }
  // Default options but for a TTL the target accepts.
  distlock::LockOptions plain() const {
    distlock::LockOptions o;
    o.ttl = ttl(30s);
    return o;
  }
  // A TTL the target accepts (zk:// allows at most twice its session timeout).
  Millis ttl(Millis wanted) const {
    return Millis(std::min<std::int64_t>(wanted.count(), target_->max_ttl_ms()));
  }
  std::unique_ptr<Target> target_;
};

TEST_P(MultiLock, OverlappingSetsInOppositeOrdersNeitherDeadlockNorOverlap) {
  constexpr int kGroups = 2;
  constexpr int kPerGroup = 8;
  const int rounds = rounds_per_client();
  const int budget_s = budget_seconds();
  // Group 0 writes its names ascending, group 1 descending; they share m/2 and m/3.
  const std::vector<std::vector<std::string>> sets = {{"m/1", "m/2", "m/3"}, {"m/4", "m/3", "m/2"}};
  constexpr Millis kWait = 30s;  // a deadlock shows as a call that runs out this wait
  distlock::LockOptions opts;
  opts.ttl = ttl(10s);
  opts.wait = kWait;

  std::mutex mu;
  std::map<std::string, std::vector<Interval>> history;
  std::vector<std::int64_t> took_ns;  // every successful call's duration
  std::atomic<int> failures{0};
  std::string first_failure;
  std::atomic<std::int64_t> calls[kGroups] = {0, 0};  // successful calls per group
  // Every client's exchanges with its servers (Client::stats().round_trips; 0 where the
  // backend does not count them), reported per call.
  std::atomic<std::uint64_t> round_trips{0};
  const auto started = Steady::now();
  const auto stop_at = started + std::chrono::seconds(budget_s);
  std::vector<std::thread> threads;
  for (int g = 0; g < kGroups; ++g) {
    for (int c = 0; c < kPerGroup; ++c) {
      threads.emplace_back([&, g, c] {
        distlock::Client cl = client();
        std::map<std::string, std::vector<Interval>> mine;
        std::vector<std::int64_t> my_took;
        my_took.reserve(static_cast<std::size_t>(rounds));
        std::int64_t done = 0;
        // Merged on every way out, so a failed call's history is still checked.
        const auto merge = [&] {
          std::lock_guard lk(mu);
          for (auto& [name, v] : mine) history[name].insert(history[name].end(), v.begin(), v.end());
          took_ns.insert(took_ns.end(), my_took.begin(), my_took.end());
          calls[g] += done;
          round_trips += cl.stats().round_trips;
        };
        for (int r = 0; r < rounds; ++r) {
          if (budget_s > 0 && Steady::now() >= stop_at) break;
          const std::int64_t t0 = mono_ns();
          std::error_code ec;
          distlock::MultiLease all = cl.acquire_all(sets[g], opts, ec);
          const std::int64_t took = mono_ns() - t0;
          if (ec) {
            {
              std::lock_guard lk(mu);
              if (failures++ == 0) {
                first_failure = ec.message() + " after " + std::to_string(took / 1'000'000) + " ms; " +
                                drops_line(cl.metrics());
              }
            }
            merge();
            return;
          }
          my_took.push_back(took);
          const std::int64_t begin = mono_ns();
          std::this_thread::yield();
          const std::int64_t end = mono_ns();
          if (!all.owns()) {
            {
              std::lock_guard lk(mu);
              if (failures++ == 0) first_failure = "a fresh multi-lease did not own its names";
            }
            merge();
            return;
          }
          for (const auto& l : all.leases()) {
            Interval iv;
            iv.has_token = l.has_token();
            if (iv.has_token) iv.token = l.token();
            iv.begin = begin;
            iv.end = end;
            iv.client = g * kPerGroup + c;
            mine[l.name()].push_back(iv);
          }
          ++done;
          all.release(ec);
          if (ec) {
            {
              std::lock_guard lk(mu);
              if (failures++ == 0) first_failure = "release: " + ec.message();
            }
            merge();
            return;
          }
        }
        merge();
      });
    }
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Steady::now() - started).count();

  // Every name's holds: as many as the successful calls that named it, none overlapping, tokens
  // increasing. Every violation is counted (the first of each name described) before failing.
  const std::int64_t made = calls[0] + calls[1];
  const std::map<std::string, std::int64_t> expected = {
      {"m/1", calls[0].load()}, {"m/2", made}, {"m/3", made}, {"m/4", calls[1].load()}};
  const bool fencing = target_->fencing();
  std::int64_t violations = 0;
  // Fairness, reported only: the longest run of consecutive holds of one name by one client,
  // and the time from its first hold's begin to its last hold's end.
  std::size_t longest_run = 0;
  std::int64_t longest_run_ns = 0;
  std::string longest_run_name;
  for (const auto& [name, count] : expected) {
    auto& v = history[name];
    EXPECT_EQ(static_cast<std::int64_t>(v.size()), count) << name << ": holds logged vs calls that named it";
    std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
    bool described = false;
    for (std::size_t i = 0, first = 0; i < v.size(); ++i) {
      if (i > 0 && v[i].client != v[i - 1].client) first = i;
      if (i + 1 - first > longest_run) {
        longest_run = i + 1 - first;
        longest_run_ns = v[i].end - v[first].begin;
        longest_run_name = name;
      }
    }
    for (std::size_t i = 1; i < v.size(); ++i) {
      std::string what;
      if (v[i].begin < v[i - 1].end) {
        what = "hold " + std::to_string(i) + " began before the previous one ended";
      } else if (fencing && !(v[i].has_token && v[i - 1].has_token)) {
        what = "hold " + std::to_string(i) + " or the one before has no token";
      } else if (fencing && v[i].token <= v[i - 1].token) {
        what = "token did not increase at hold " + std::to_string(i) + " (" + std::to_string(v[i - 1].token) +
               " then " + std::to_string(v[i].token) + ")";
      }
      if (what.empty()) continue;
      ++violations;
      if (!described) ADD_FAILURE() << name << ": " << what;
      described = true;
    }
  }

  std::sort(took_ns.begin(), took_ns.end());
  const std::int64_t slowest = took_ns.empty() ? 0 : took_ns.back();
  const std::int64_t over_wait = std::count_if(took_ns.begin(), took_ns.end(), [&](std::int64_t t) {
    return t >= std::chrono::nanoseconds(kWait).count();
  });
  std::cout << "[ multi-lock ] " << GetParam().label << ": " << kGroups << " groups x " << kPerGroup
            << " clients x " << rounds << " rounds asked" << (budget_s > 0 ? ", budget " : "")
            << (budget_s > 0 ? std::to_string(budget_s) + " s" : "") << "; " << made << " of "
            << kGroups * kPerGroup * rounds << " acquire_all calls made (group 0: " << calls[0].load()
            << ", group 1: " << calls[1].load() << ") in " << secs
            << " s = " << static_cast<double>(made) / secs << " calls/s ("
            << 3.0 * static_cast<double>(made) / secs << " names/s); call p50 " << quantile_ms(took_ns, 0.50)
            << " ms, p99 " << quantile_ms(took_ns, 0.99) << " ms, max " << static_cast<double>(slowest) / 1e6
            << " ms (wait " << kWait.count() << " ms); calls over the wait " << over_wait << "; failed calls "
            << failures.load() << "; violations " << violations
            << "; longest run of one client's holds: " << longest_run << " of " << longest_run_name
            << " over " << static_cast<double>(longest_run_ns) / 1e6 << " ms; round trips per call "
            << (made > 0 ? static_cast<double>(round_trips.load()) / static_cast<double>(made) : 0.0)
            << " (releases, renewals and the clients' start included)\n";
  EXPECT_EQ(failures.load(), 0) << "first failure: " << first_failure;
  EXPECT_EQ(over_wait, 0) << "slowest call " << slowest / 1'000'000 << " ms";
  EXPECT_EQ(violations, 0);
  if (budget_s == 0) {
    EXPECT_EQ(made, kGroups * kPerGroup * rounds) << "every round runs without a budget";
  }
  EXPECT_GT(made, 0);
}

TEST_P(MultiLock, LossOfOneNameFiresTheWholeStopToken) {
  auto cl = client();
  distlock::LockOptions opts;
  opts.ttl = ttl(5s);
  opts.wait = 10s;
  // max_hold ends each lease on its own at grant + 600 ms: the first name taken is lost first.
  opts.max_hold = 600ms;
  distlock::MultiLease both = cl.acquire_all({"loss/b", "loss/a"}, opts);
  ASSERT_TRUE(both.owns());
  std::promise<void> fired;
  std::future<void> fired_event = fired.get_future();
  std::stop_callback cb(both.stop_token(), [&] { fired.set_value(); });
  // Bound: max_hold (600 ms) plus a 5 s allowance for the watchdog on 2 loaded cores,
  // measured on the steady clock.
  ASSERT_EQ(fired_event.wait_for(5600ms), std::future_status::ready) << "no loss signal within 5.6 s";
  EXPECT_FALSE(both.owns());
  bool one_lost = false;
  for (const auto& l : both.leases())
    one_lost = one_lost || l.loss_reason() == distlock::LossReason::max_hold;
  EXPECT_TRUE(one_lost);
  try {
    both.release();
    ADD_FAILURE() << "release after a loss did not report it";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::lost) << e.what();
  }
  EXPECT_EQ(both.size(), 0u);
  // Both names can be had again within the TTL (a lost lease's record may stay on the server
  // until its TTL, at most 5 s, runs out): a wait of 10 s.
  distlock::LockOptions later;
  later.ttl = ttl(5s);
  later.wait = 10s;
  EXPECT_TRUE(cl.acquire_all({"loss/a", "loss/b"}, later).owns());
}

TEST_P(MultiLock, PartialSetIsReleasedWhenTheWaitRunsOut) {
  auto holder = client();
  auto caller = client();
  auto other = client();
  distlock::LockOptions opts;
  opts.ttl = ttl(5s);
  distlock::Lease second = holder.acquire("part/2", opts);
  opts.wait = 500ms;
  const auto t0 = Steady::now();
  try {
    auto all = caller.acquire_all({"part/2", "part/1"}, opts);
    ADD_FAILURE() << "acquire_all took a name another client holds";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::timeout) << e.what();
  }
  const auto took = Steady::now() - t0;
  // The whole call is bounded by its wait: at least 500 ms, and at most 500 ms plus 2 s of
  // scheduling allowance on 2 loaded cores, on the steady clock.
  EXPECT_GE(took, 500ms);
  EXPECT_LT(took, 2500ms);
  // part/1 was taken first (sorted order) and must already be free: one attempt, no wait.
  auto first = other.try_acquire("part/1", plain());
  EXPECT_TRUE(first.has_value()) << "the name taken before the timeout was not released";
  if (first) first->release();

  // try_acquire_all: one attempt, nothing left held when it fails.
  EXPECT_FALSE(caller.try_acquire_all({"part/1", "part/2"}, plain()).has_value());
  auto again = other.try_acquire("part/1", plain());
  EXPECT_TRUE(again.has_value());
  if (again) again->release();

  // A wait of zero: errc::busy, and the partial set released.
  opts.wait = Millis(0);
  try {
    auto all = caller.acquire_all({"part/1", "part/2"}, opts);
    ADD_FAILURE() << "acquire_all took a held name";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::busy) << e.what();
  }
  EXPECT_TRUE(other.try_acquire("part/1", plain()).has_value());
}

TEST_P(MultiLock, ACancelledCallReleasesWhatItTook) {
  auto holder = client();
  auto caller = client();
  distlock::LockOptions opts;
  opts.ttl = ttl(5s);
  distlock::Lease second = holder.acquire("cancel/2", opts);
  std::stop_source stop;
  opts.wait = 30s;
  opts.cancel = stop.get_token();
  std::promise<std::error_code> result;
  std::future<std::error_code> done = result.get_future();
  std::thread call([&] {
    std::error_code ec;
    auto all = caller.acquire_all({"cancel/2", "cancel/1"}, opts, ec);
    result.set_value(ec);
  });
  // The call holds cancel/1 (taken first) and waits for cancel/2: seen through status, polled
  // for at most 10 s on the steady clock.
  const auto until = Steady::now() + 10s;
  bool first_held = false;
  while (!(first_held = holder.status("cancel/1").held) && Steady::now() < until) std::this_thread::yield();
  const auto cancelled_at = Steady::now();
  stop.request_stop();
  // Bound: the engine ends a cancelled wait within one wake-up; 5 s of allowance on 2 loaded cores.
  const bool returned = done.wait_for(5s) == std::future_status::ready;
  const auto took = Steady::now() - cancelled_at;
  call.join();
  ASSERT_TRUE(first_held) << "the call never took cancel/1";
  ASSERT_TRUE(returned);
  EXPECT_EQ(done.get(), errc::cancelled);
  EXPECT_LT(took, 5s);
  auto first = holder.try_acquire("cancel/1", plain());
  EXPECT_TRUE(first.has_value()) << "the cancelled call left cancel/1 held";
}

TEST_P(MultiLock, DuplicatesAreDroppedAndEachNameKeepsItsToken) {
  auto cl = client();
  distlock::LockOptions opts;
  opts.ttl = ttl(5s);
  opts.wait = 5s;
  {
    distlock::MultiLease all = cl.acquire_all({"dup/b", "dup/a", "dup/b"}, opts);
    ASSERT_EQ(all.names(), (std::vector<std::string>{"dup/a", "dup/b"}));
    ASSERT_TRUE(all.owns());
    if (target_->fencing()) {
      for (const char* n : {"dup/a", "dup/b"}) {
        const auto info = cl.status(n);
        ASSERT_TRUE(info.token.has_value()) << n;
        EXPECT_EQ(all.token(n), *info.token) << n;
      }
    }
    try {
      (void)all.lease("dup/c");
      ADD_FAILURE() << "a name outside the set was found";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument);
    }
  }  // the destructor releases both
  EXPECT_TRUE(cl.try_acquire_all({"dup/a", "dup/b"}, opts).has_value());
  std::error_code ec;
  (void)cl.acquire_all({}, opts, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  (void)cl.acquire_all({"dup/a", ""}, opts, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  EXPECT_TRUE(cl.try_acquire("dup/a", plain()).has_value()) << "a failed call left dup/a held";
}

INSTANTIATE_TEST_SUITE_P(Backends, MultiLock, ::testing::ValuesIn(distlock::testing::kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });

}  // namespace
}  // namespace distlock::testing
