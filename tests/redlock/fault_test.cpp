// Redlock under faults with real processes: masters killed, paused, slowed and
// restarted; holders SIGKILLed and SIGSTOPped; 16 threads x 4 processes.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>

#include "distlock/distlock.hpp"
#include "masters.hpp"
#include "redlock/fanout.hpp"
#include "support/client_options.hpp"
#include "support/cs_log.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/workload_size.hpp"

namespace distlock {
namespace {

using namespace std::chrono_literals;
using testing::Masters;
using testing::ttl_of;
using Clock = std::chrono::steady_clock;

Millis since(Clock::time_point t) {
  return std::chrono::duration_cast<Millis>(Clock::now() - t);
}

// Keys the test client's owner left on master i.
std::size_t keys_of(Masters& m, std::size_t i, const Client& c) {
  std::size_t n = 0;
  for (const auto& k : m.keys(i)) {
    if (m.get(i, k).rfind(c.id() + ":", 0) == 0) ++n;
  }
  return n;
}

// 16 threads x 4 processes on one name: critical sections never overlap, and a
// read-modify-write counter protected only by the lock loses no increment.
void hammer(std::size_t masters) {
  Masters m(masters);
  testing::TempDir dir("redlock-hammer");
  const std::string log = (dir.path() / "cs.log").string();
  const std::string counter = (dir.path() / "counter").string();
  // A per-master timeout of 1 s: 64 contenders and the masters share 2 cores
  // here, and a starved master must not turn into a spurious quorum failure.
  const std::string url = m.url("timeout=1s");
  constexpr int kProcesses = 4, kThreads = 16, kIters = 6;
  std::vector<testing::Process> procs;
  for (int p = 0; p < kProcesses; ++p) {
    procs.push_back(
        testing::Process::spawn({testing::lock_tool_path(), "hammer", "--url", url, "--name", "hot", "--log",
                                 log, "--counter", counter, "--threads", std::to_string(kThreads), "--iters",
                                 std::to_string(kIters), "--ttl", "5000", "--hold-us", "200"},
                                (dir.path() / ("p" + std::to_string(p) + ".out")).string()));
  }
  for (int p = 0; p < kProcesses; ++p) {
    const int status = procs[p].wait_for(120s);
    ASSERT_NE(status, -1) << "hammer process " << p << " did not finish";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "process " << p << ": "
        << testing::read_file((dir.path() / ("p" + std::to_string(p) + ".out")).string());
  }
  const auto sections = testing::read_sections(log);
  EXPECT_EQ(sections.size(), std::size_t{kProcesses * kThreads * kIters});
  EXPECT_TRUE(testing::no_overlap(sections));
  for (const auto& s : sections) EXPECT_TRUE(s.owned_at_end);
  EXPECT_EQ(testing::read_counter(counter), kProcesses * kThreads * kIters);
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_TRUE(m.keys(i).empty()) << "master " << i;
}

TEST(RedlockFault, SixteenThreadsTimesFourProcessesNeverOverlapOnFiveMasters) {
  hammer(5);
}

// Progress under contention: 64 contenders (4 clients x 16 threads) on one name
// over 5 masters. Split votes (no contender takes a quorum) end in randomized
// backoff, so every acquisition completes; each one is timed on this process's
// steady clock and must finish within a bound far above the work queued ahead of
// it (64 x 6 short critical sections), yet far below the wait limit, so a
// livelock shows as a failed bound, not as a hang.
TEST(RedlockFault, SixtyFourContendersOnFiveMastersEachAcquireWithinABound) {
  Masters m(5);
  const std::string url = m.url("timeout=1s");
  constexpr int kClients = 4, kThreads = 16, kIters = 6;
  // Under a sanitizer every client step is slower: the slowest acquisition took 16.2 s in an
  // ASan run at -j3 (13.6 s in the CI run before); the release tree keeps 15 s.
  constexpr auto kBound = distlock::testing::kSanitizedBuild ? 30s : 15s;
  std::vector<Client> clients;
  for (int c = 0; c < kClients; ++c) clients.push_back(connect(url));
  std::atomic<int> inside{0}, overlaps{0}, acquired{0};
  std::mutex mu;
  std::vector<std::string> failures;
  Millis slowest{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, c] {
        LockOptions opts;
        opts.ttl = 5s;
        opts.wait = 120s;
        for (int i = 0; i < kIters; ++i) {
          const auto t0 = Clock::now();
          std::error_code ec;
          auto lease = clients[c].acquire("crowd", opts, ec);
          const Millis took = since(t0);
          {
            std::lock_guard lk(mu);
            slowest = std::max(slowest, took);
            if (!lease.owns()) failures.push_back(ec.message());
          }
          if (!lease.owns()) continue;
          if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
          std::this_thread::sleep_for(200us);
          inside.fetch_sub(1);
          ++acquired;
          lease.release();
        }
      });
    }
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures.front();
  EXPECT_EQ(acquired.load(), kClients * kThreads * kIters);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_LT(slowest, kBound) << "slowest acquisition took " << slowest.count() << " ms";
  std::printf("slowest of %d acquisitions: %lld ms\n", kClients * kThreads * kIters,
              static_cast<long long>(slowest.count()));
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_TRUE(m.keys(i).empty()) << "master " << i;
}

TEST(RedlockFault, OneOfThreeMastersKilledLockingGoesOn) {
  Masters m(3);
  // The per-master timeout is 1 s, not the default 50 ms: what is tested is a quorum of two
  // live masters (the killed one refuses at once). Under ASan, beside the hammers of this
  // file, the two live masters did not answer a release within 50 ms in a CI run.
  const std::string url = m.url("timeout=1s");
  auto a = connect(url);
  auto b = connect(url);
  m[1].kill();
  auto lease = a.acquire("job");
  EXPECT_TRUE(lease.owns());
  EXPECT_FALSE(b.try_acquire("job").has_value());
  EXPECT_EQ(a.renew_now(), 1u);  // two of three renew: still a quorum
  lease.release();
  EXPECT_TRUE(b.try_acquire("job").has_value());
  // A client connecting while one master is down works too.
  auto c = connect(url);
  EXPECT_TRUE(c.try_acquire("other").has_value());
}

TEST(RedlockFault, TwoOfThreeKilledAcquisitionFailsWithQuorumUnavailableInTime) {
  Masters m(3);
  auto client = connect(m.url());
  m[0].kill();
  m[2].kill();
  LockOptions opts;
  opts.wait = 2s;
  std::error_code ec;
  const auto t0 = Clock::now();
  auto lease = client.acquire("job", opts, ec);
  EXPECT_EQ(ec, errc::quorum_unavailable) << ec.message();
  EXPECT_LT(since(t0), 2s);
  EXPECT_FALSE(lease.owns());
  auto mutex = client.mutex("job");
  try {
    mutex.lock();
    ADD_FAILURE() << "lock() succeeded without a quorum";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::quorum_unavailable);
    EXPECT_NE(std::string(e.what()).find("only 1 of 3"), std::string::npos) << e.what();
  }
  // The one reachable master kept nothing.
  EXPECT_TRUE(m.keys(1).empty());
  // A new client cannot connect without a quorum, and says how many answered.
  try {
    connect(m.url());
    ADD_FAILURE() << "connected without a quorum";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::quorum_unavailable);
    EXPECT_NE(std::string(e.what()).find("only 1 of 3"), std::string::npos) << e.what();
  }
}

TEST(RedlockFault, ProcessWithoutAQuorumExitsWithTheUnavailableStatus) {
  Masters m(3);
  m[0].kill();
  m[1].kill();
  testing::TempDir dir("redlock-noquorum");
  const std::string out = (dir.path() / "holder.out").string();
  auto holder = testing::spawn_holder(m.url(), "job", out, 1000, 0, {"--wait", "2000"});
  const int status = holder.wait_for(10s);
  ASSERT_NE(status, -1) << "the process hung without a quorum";
  EXPECT_EQ(WEXITSTATUS(status), 69) << testing::read_file(out);  // EX_UNAVAILABLE, as the CLI
  EXPECT_NE(testing::read_file(out).find("fewer than a quorum"), std::string::npos)
      << testing::read_file(out);
}

TEST(RedlockFault, RestartedMastersLockingResumes) {
  Masters m(3);
  auto client = connect(m.url());
  { auto l = client.acquire("job"); }
  m[0].kill();
  m[1].kill();
  std::error_code ec;
  LockOptions once;
  once.wait = Millis(0);
  auto failed = client.acquire("job", once, ec);
  EXPECT_EQ(ec, errc::quorum_unavailable);
  m[0].restart();
  m[1].restart();
  // Reconnection happens on the next fan-outs (after a short backoff).
  const auto t0 = Clock::now();
  Lease lease;
  while (!lease.owns() && since(t0) < 5s) {
    lease = client.acquire("job", once, ec);
    if (!lease.owns()) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(lease.owns()) << ec.message();
  EXPECT_EQ(keys_of(m, 0, client), 1u);
  EXPECT_EQ(keys_of(m, 1, client), 1u);
}

TEST(RedlockFault, FailedAcquisitionLeavesNoKeysOnTheMinority) {
  Masters m(3);
  auto client = connect(m.url("timeout=200ms"));
  // Busy: another owner holds masters 1 and 2; master 0 is free and is taken,
  // then released when the quorum is not reached.
  for (std::size_t i = 1; i < 3; ++i)
    m[i].command({"SET", "distlock:redlock:lock:contended", "other", "PX", "60000"});
  EXPECT_FALSE(client.try_acquire("contended").has_value());
  EXPECT_TRUE(m.keys(0).empty());
  EXPECT_EQ(m.get(1, "distlock:redlock:lock:contended"), "other");

  // Unreachable: masters 1 and 2 are paused; master 0 takes the key and the two
  // paused ones queue the request unanswered. The clean-up release goes to all
  // three on the same connections, so once they resume each runs the acquire and
  // then the release: no key remains anywhere.
  m[1].pause();
  m[2].pause();
  std::error_code ec;
  LockOptions once;
  once.wait = Millis(0);
  (void)client.acquire("paused", once, ec);
  EXPECT_EQ(ec, errc::quorum_unavailable);
  EXPECT_TRUE(m.keys(0).empty());
  m[1].resume();
  m[2].resume();
  const auto t0 = Clock::now();
  while (since(t0) < 3s && (!m.keys(1, "*paused").empty() || !m.keys(2, "*paused").empty())) {
    std::this_thread::sleep_for(20ms);
  }
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(m.keys(i, "*paused").empty()) << "master " << i;
  // And the client works normally afterwards (late replies were skipped).
  auto lease = client.try_acquire("paused");
  ASSERT_TRUE(lease.has_value());
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(keys_of(m, i, client), 1u) << "master " << i;
}

TEST(RedlockFault, PausedMasterCostsOnePerNodeTimeout) {
  Masters m(5);
  constexpr auto kTimeout = 400ms;
  auto client = connect(m.url("timeout=400ms"));
  { auto warm = client.acquire("warm"); }
  m[1].pause();
  m[3].pause();
  const auto t0 = Clock::now();
  auto lease = client.acquire("slow");
  const auto took = since(t0);
  EXPECT_TRUE(lease.owns());
  // Concurrent fan-out: one timeout plus a round trip, not one per slow master
  // (asked one after another, two paused masters would cost 800 ms).
  EXPECT_GE(took, kTimeout - 50ms);
  EXPECT_LT(took, 2 * kTimeout - 50ms) << "took " << took.count() << " ms";
  lease.release();
  m[1].resume();
  m[3].resume();
}

// One master slow for one client only (a fault proxy delays that client's traffic to
// it): its votes arrive late or not at all, its late SETs land after the lock moved on.
// Two clients hand the lock back and forth; their belief intervals (acquire returned
// .. last owns() true, on this process's clock) never overlap, and every key the slow
// master kept expires by its TTL.
TEST(RedlockFault, OneMasterSlowForOneClientNeverBreaksExclusion) {
  Masters m(3);
  distlock::testing::FaultProxy slow(m[0].port());
  slow.delay(150ms, 150ms);
  const std::string via = "redlock://127.0.0.1:" + std::to_string(slow.port()) +
                          ",127.0.0.1:" + std::to_string(m[1].port()) +
                          ",127.0.0.1:" + std::to_string(m[2].port());
  auto a = connect(via);
  auto b = connect(m.url());
  std::mutex mu;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> beliefs;
  std::atomic<int> acquired{0};
  auto work = [&](distlock::Client& c) {
    for (int i = 0; i < 15; ++i) {
      distlock::LockOptions o;
      o.ttl = 1000ms;
      o.wait = 20s;
      std::error_code ec;
      auto lease = c.acquire("slow-master", o, ec);
      if (ec) continue;
      const auto start = Clock::now();
      std::this_thread::sleep_for(5ms);
      const auto last = Clock::now();
      if (lease.owns()) {
        ++acquired;
        std::lock_guard lk(mu);
        beliefs.emplace_back(start, last);
      }
    }
  };
  std::thread ta([&] { work(a); });
  std::thread tb([&] { work(b); });
  ta.join();
  tb.join();
  EXPECT_GE(acquired.load(), 20) << "little progress with one slow master of three";
  std::sort(beliefs.begin(), beliefs.end());
  for (std::size_t i = 1; i < beliefs.size(); ++i) {
    EXPECT_GE(beliefs[i].first, beliefs[i - 1].second) << "two holders at once (interval " << i << ")";
  }
  slow.pass();
  const auto until = Clock::now() + 5s;
  while (Clock::now() < until && !(m.keys(0).empty() && m.keys(1).empty() && m.keys(2).empty())) {
    std::this_thread::sleep_for(20ms);
  }
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_TRUE(m.keys(i).empty()) << "master " << i;
}

TEST(RedlockFault, MasterBusyInDebugSleepDoesNotStallAcquire) {
  Masters m(3);
  auto client = connect(m.url("timeout=100ms"));
  { auto warm = client.acquire("warm"); }
  auto sleeper = std::async(std::launch::async, [&] { m[2].command({"DEBUG", "SLEEP", "1.5"}); });
  std::this_thread::sleep_for(100ms);  // the master is inside DEBUG SLEEP
  const auto t0 = Clock::now();
  auto lease = client.acquire("slow");
  EXPECT_LT(since(t0), 1s);
  EXPECT_TRUE(lease.owns());
  sleeper.get();
}

// A master that did not answer in time: its connection is closed, never used
// again with the request still pending (whose late reply could otherwise be taken
// for the answer to a later request). The next request to it goes on a new
// connection and gets its own answer.
TEST(RedlockFault, TimedOutConnectionIsDiscardedNotReused) {
  Masters m(3);
  std::vector<std::shared_ptr<detail::redlock::Master>> masters;
  for (std::size_t i = 0; i < m.size(); ++i) {
    detail::redis::ConnectionOptions o;
    o.port = m[i].port();
    masters.push_back(std::make_shared<detail::redlock::Master>(o));
  }
  detail::redlock::Lane lane(masters);
  const std::array<detail::redlock::Command, 1> client_id{
      detail::redlock::Command{{"CLIENT", "ID"}, nullptr}};
  auto id_of = [](const detail::redlock::NodeReply& r) {
    return r.status == detail::redlock::NodeStatus::ok && r.replies[0]->type == REDIS_REPLY_INTEGER
               ? r.replies[0]->integer
               : -1;
  };
  auto first = lane.run_all(client_id, 2s);
  const long long old_id = id_of(first[0]);
  ASSERT_GE(old_id, 0) << first[0].error;

  m[0].pause();
  const std::array<detail::redlock::Command, 1> echo{detail::redlock::Command{{"ECHO", "late"}, nullptr}};
  auto timed_out = lane.run_all(echo, 200ms);
  EXPECT_EQ(timed_out[0].status, detail::redlock::NodeStatus::timeout);
  EXPECT_EQ(timed_out[1].status, detail::redlock::NodeStatus::ok);
  m[0].resume();

  auto again = lane.run_all(client_id, 2s);
  ASSERT_EQ(again[0].status, detail::redlock::NodeStatus::ok) << again[0].error;
  const long long new_id = id_of(again[0]);
  EXPECT_GE(new_id, 0) << detail::redlock::reply_text(again[0].replies[0].get());
  EXPECT_NE(new_id, old_id) << "the connection with the unanswered ECHO was used again";
  // The old connection is gone from the master (bounded poll: the master notices
  // the close once it runs again).
  const std::string old_tag = "id=" + std::to_string(old_id) + " ";
  const auto t0 = Clock::now();
  bool gone = false;
  while (!gone && since(t0) < 5s) {
    auto list = m[0].command({"CLIENT", "LIST"});
    ASSERT_TRUE(list && list->str != nullptr);
    gone = std::string(list->str, list->len).find(old_tag) == std::string::npos;
    if (!gone) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(gone) << "connection " << old_id << " still open on the master";
}

TEST(RedlockFault, RenewalWithoutAQuorumEndsInLossAtTheLocalDeadline) {
  Masters m(3);
  auto client = connect(m.url());
  auto lease = client.acquire("fragile", ttl_of(600ms));
  m[0].kill();
  m[1].kill();
  const auto t0 = Clock::now();
  while (!lease.stop_token().stop_requested() && since(t0) < 3s) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(lease.stop_token().stop_requested());
  EXPECT_LT(since(t0), 600ms + 500ms);
  EXPECT_FALSE(lease.owns());
}

TEST(RedlockFault, WaiterNotifiedAfterItsSubscriptionMasterRestarted) {
  Masters m(3);
  auto holder = connect(m.url());
  auto waiter = connect(m.url());
  auto lease = holder.acquire("sub", ttl_of(30s));
  auto got = std::async(std::launch::async, [&] { return waiter.acquire("sub", ttl_of(30s, 20s)).owns(); });
  std::this_thread::sleep_for(300ms);
  m[0].restart();  // its subscription connection breaks and is re-established
  std::this_thread::sleep_for(500ms);
  const auto released = Clock::now();
  lease.release();
  ASSERT_EQ(got.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(got.get());
  EXPECT_LT(since(released), 2s);
}

// A revoke that reached only a minority of the masters that hold the holder's key cannot end
// its lease (the holder still renews on a quorum): it must not report "revoked". Two of three
// masters are cut from the revoker only (its proxies dropped); the holder reaches all three.
// Either the revoke fails, or the holder is told within its renewal interval (1 s at TTL 3 s)
// plus 2 s, on this process's steady clock.
TEST(RedlockFault, RevokeThatReachedOnlyAMinorityIsNotReportedAsDone) {
  Masters m(3);
  distlock::testing::FaultProxy p1(m[1].port()), p2(m[2].port());
  const std::string via = "redlock://127.0.0.1:" + std::to_string(m[0].port()) +
                          ",127.0.0.1:" + std::to_string(p1.port()) +
                          ",127.0.0.1:" + std::to_string(p2.port()) + "?timeout=200ms";
  auto holder = connect(m.url());
  auto ops = connect(via);
  distlock::LockOptions o;
  o.ttl = 3000ms;
  o.renew_interval = 1000ms;
  auto lease = holder.acquire("revoke-minority", o);
  ASSERT_TRUE(lease.owns());
  p1.drop();
  p2.drop();
  distlock::RevokeResult r;
  try {
    r = ops.revoke("revoke-minority", "minority");
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), distlock::errc::quorum_unavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find("only 1 of 3 masters answered"), std::string::npos) << e.what();
    EXPECT_TRUE(lease.owns()) << "the holder keeps its lease on the masters the revoke did not reach";
    return;
  }
  ASSERT_TRUE(r.revoked) << "the lock is held: a revoke that answered must not say it was free";
  const auto deadline = Clock::now() + 3000ms;
  while (Clock::now() < deadline && !lease.stop_token().stop_requested()) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(lease.stop_token().stop_requested())
      << "revoke() reported the lease revoked but its holder still renews on a quorum";
}

}  // namespace
}  // namespace distlock
