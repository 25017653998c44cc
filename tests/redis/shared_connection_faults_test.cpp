// The shared pipelined Redis connection under kills, restarts, pauses, SCRIPT FLUSH and huge pipelines.
// Written by the adversarial review of the shared connection (commit 59b99c9, first named
// shared_connection_review_test.cpp).
//
// Adversarial review of the shared, auto-pipelined Redis connection
// (src/redis/shared_connection.cpp) and the lock contract that runs on it: every
// call gets its own reply whatever happens to the socket (CLIENT KILL, restart,
// SIGSTOP longer than the command timeout, SCRIPT FLUSH, huge pipelines), and every
// call returns within about the command timeout (plus the connect timeout) whatever
// the other threads do. Each test starts its own redis-server on a loopback port;
// every loop is bounded in count and time.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "redis/shared_connection.hpp"
#include "redis/wait_queue.hpp"
#include "support/eventually.hpp"
#include "support/lock_hammer.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace distlock::detail::redis {
namespace {

using namespace std::chrono_literals;
using distlock::testing::connect_clients;
using distlock::testing::RedisServer;
using distlock::testing::start_hammer_threads;
using Clock = std::chrono::steady_clock;

ConnectionOptions opts_for(const RedisServer& server, Millis command_timeout,
                           Millis connect_timeout = Millis(2000)) {
  ConnectionOptions o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.connect_timeout = connect_timeout;
  o.command_timeout = command_timeout;
  return o;
}

// Polled every millisecond: the in-flight counts waited for below last a few milliseconds.
template <class Pred>
bool eventually(Pred pred, Millis limit = Millis(10000)) {
  return distlock::testing::eventually(pred, limit, Millis(1));
}

long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// Runs `call(t)` on `threads` threads released together (a latch): the ms each call took.
std::vector<long long> timed_together(int threads, const std::function<void(int)>& call) {
  std::vector<long long> took(threads, 0);
  std::latch go(threads);
  std::vector<std::thread> v;
  for (int t = 0; t < threads; ++t) {
    v.emplace_back([&, t] {
      go.arrive_and_wait();
      const auto t0 = Clock::now();
      call(t);
      took[t] = ms_since(t0);
    });
  }
  for (auto& th : v) th.join();
  return took;
}

// Counters of an echo hammer: every call sends unique payloads and checks that the
// replies it gets are exactly its own.
struct EchoTally {
  std::atomic<long> ok{0}, failed{0}, wrong{0};
  std::atomic<long long> max_ok_ms{0};  // slowest call that succeeded
  std::mutex mu;
  std::string first_wrong;
  std::string first_failure;  // the first failed call's error detail
  void note_wrong(const std::string& s) {
    ++wrong;
    std::lock_guard lk(mu);
    if (first_wrong.empty()) first_wrong = s;
  }
  void note_failed(const std::string& detail) {
    ++failed;
    remember_failure(detail);
  }
  void remember_failure(const std::string& detail) {
    std::lock_guard lk(mu);
    if (first_failure.empty()) first_failure = detail;
  }
  void note_ok_ms(long long ms) {
    long long cur = max_ok_ms.load();
    while (ms > cur && !max_ok_ms.compare_exchange_weak(cur, ms)) {
    }
  }
};

// One call of the hammer: a single ECHO, a pipeline of 2..6 ECHOs, or (1 in 40) a
// large ECHO of 64 KiB..1 MiB. Payloads name the thread and the sequence number.
void one_echo_call(SharedConnection& shared, int t, long seq, std::minstd_rand& rng, EchoTally& tally) {
  const std::string tag = "t" + std::to_string(t) + "-" + std::to_string(seq) + "-";
  const int kind = static_cast<int>(rng() % 40);
  Error ec;
  const auto t0 = Clock::now();
  if (kind == 0) {
    std::string big(64 * 1024 + rng() % (960 * 1024), static_cast<char>('a' + t % 26));
    big.replace(0, tag.size(), tag);
    Reply r = shared.command({"ECHO", big}, ec);
    if (ec) {
      tally.note_failed(ec.detail());
    } else if (reply_str(r.get()) != big) {
      tally.note_wrong(tag + " big echo came back as " + std::string(reply_str(r.get()).substr(0, 40)));
    } else {
      ++tally.ok;
      tally.note_ok_ms(ms_since(t0));
    }
    return;
  }
  if (kind < 20) {
    Reply r = shared.command({"ECHO", tag}, ec);
    if (ec) {
      tally.note_failed(ec.detail());
    } else if (reply_str(r.get()) != tag) {
      tally.note_wrong(tag + " got " + std::string(reply_str(r.get())));
    } else {
      ++tally.ok;
      tally.note_ok_ms(ms_since(t0));
    }
    return;
  }
  const int n = 2 + static_cast<int>(rng() % 5);
  std::vector<std::string> texts;
  for (int i = 0; i < n; ++i) texts.push_back(tag + std::to_string(i));
  std::vector<Argv> batch;
  for (const auto& s : texts) batch.push_back({"ECHO", s});
  auto r = shared.exchange(batch, ec);
  if (ec) {
    tally.note_failed(ec.detail());
    return;
  }
  for (int i = 0; i < n; ++i) {
    if (r.size() != static_cast<std::size_t>(n) || !r[i] || reply_str(r[i].get()) != texts[i]) {
      tally.note_wrong(tag + " pipeline element " + std::to_string(i) + " got " +
                       (r.size() == static_cast<std::size_t>(n) && r[i] ? std::string(reply_str(r[i].get()))
                                                                        : std::string("<none>")));
      return;
    }
  }
  ++tally.ok;
  tally.note_ok_ms(ms_since(t0));
}

// Echo hammers on one shared connection: `threads` threads from construction, each making up to
// `max_calls` calls (one_echo_call) until stopped; `tally` counts their outcomes. The destructor
// stops and joins them.
class EchoHammer {
 public:
  EchoHammer(SharedConnection& shared, int threads, long max_calls) : shared_(shared) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, t, max_calls] {
        std::minstd_rand rng(static_cast<unsigned>(t * 7919 + 1));
        for (long i = 0; i < max_calls && !stop_.load(); ++i) one_echo_call(shared_, t, i, rng, tally);
      });
    }
  }
  ~EchoHammer() { stop_and_join(); }

  void stop_and_join() {
    stop_ = true;
    for (auto& th : threads_) {
      if (th.joinable()) th.join();
    }
  }

  // Stops the hammer, prints "<what> <count> ok .. failed .. connects .." and checks that no
  // call got a reply meant for another.
  void stop_and_check(const char* what, int count) {
    stop_and_join();
    std::printf("%s %d ok %ld failed %ld connects %llu\n", what, count, tally.ok.load(), tally.failed.load(),
                static_cast<unsigned long long>(shared_.stats().connects));
    EXPECT_EQ(tally.wrong.load(), 0) << tally.first_wrong;
  }

  EchoTally tally;

 private:
  SharedConnection& shared_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// ---------------------------------------------------------------------------
// 1. Liveness: a stuck server (SIGSTOP: the kernel still accepts connections, the
//    handshake's PING is never answered). wire_for_call() connects while holding
//    mu_, so N threads that all need a new connection open it one after another:
//    the last one returns after N x command timeout, not "about the command timeout
//    plus the connect timeout".
// ---------------------------------------------------------------------------
TEST(SharedConnectionFaults, ConnectsToAStuckServerAreNotSerialisedBehindEachOther) {
  RedisServer server;
  const Millis timeout(300);
  SharedConnection shared(opts_for(server, timeout, timeout));
  server.pause();
  constexpr int kThreads = 8;
  std::vector<Error> codes(kThreads);
  const std::vector<long long> took =
      timed_together(kThreads, [&](int t) { shared.command({"PING"}, codes[t]); });
  server.resume();
  const long long worst = *std::max_element(took.begin(), took.end());
  std::string all;
  for (int t = 0; t < kThreads; ++t) all += " " + std::to_string(took[t]);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(codes[t], errc::backend_unavailable) << t;
  // command timeout + connect timeout + generous slack for a loaded machine
  EXPECT_LE(worst, 2 * timeout.count() + 700) << "per-thread durations (ms):" << all;
}

// The same through the public API: threads of one client calling try_acquire while
// the server is stopped (after its connection failed once).
TEST(SharedConnectionFaults, TryAcquireOnAStuckServerReturnsWithinTheTimeoutsForEveryThread) {
  RedisServer server;
  ClientOptions co;
  co.connect_timeout = Millis(300);
  co.command_timeout = Millis(300);
  auto client = distlock::connect(server.url(), co);
  LockOptions lo;
  lo.ttl = Millis(5000);
  lo.wait = Millis(0);
  {  // the shared connection is up
    std::error_code ec;
    Lease l = client.acquire("warm", lo, ec);
    ASSERT_FALSE(ec) << ec.message();
  }
  server.pause();
  constexpr int kThreads = 8;
  // One try_acquire per thread, all at once: how long each took, its code in `codes`.
  auto round = [&](std::vector<std::error_code>& codes) {
    std::vector<char> owned(kThreads, 0);  // not vector<bool>: each thread writes its own element
    const auto took = timed_together(kThreads, [&](int t) {
      Lease l = client.acquire("n" + std::to_string(t), lo, codes[t]);
      owned[t] = l.owns() ? 1 : 0;
    });
    for (int t = 0; t < kThreads; ++t) EXPECT_FALSE(owned[t]) << t;
    return took;
  };
  std::vector<std::error_code> c1(kThreads), c2(kThreads);
  const std::vector<long long> took1 = round(c1);  // fails the established connection
  const std::vector<long long> took2 = round(c2);  // every thread needs a new one
  server.resume();
  std::string all;
  for (int t = 0; t < kThreads; ++t) all += " " + std::to_string(took1[t]) + "/" + std::to_string(took2[t]);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(c1[t]) << t;
    EXPECT_TRUE(c2[t]) << t;
  }
  const long long worst =
      std::max(*std::max_element(took1.begin(), took1.end()), *std::max_element(took2.begin(), took2.end()));
  EXPECT_LE(worst, 600 + 900) << "durations round1/round2 (ms):" << all
                              << " first error: " << c2[0].message();
}

// ---------------------------------------------------------------------------
// 2. Liveness under steady load: the thread holding the writing role writes
//    "everything queued, including what other threads queue meanwhile". With 16
//    busy threads the queue may never be empty when it looks, so its own call
//    (answered long ago) does not return. A call that succeeds but returns long
//    after the command timeout breaks "every call returns within about the
//    command timeout".
// ---------------------------------------------------------------------------
TEST(SharedConnectionFaults, NoCallIsHeldFarBeyondTheCommandTimeoutUnderSteadyLoad) {
  RedisServer server;
  const Millis timeout(1000);
  SharedConnection shared(opts_for(server, timeout));
  EchoHammer hammer(shared, 16, 200000);
  std::this_thread::sleep_for(5s);  // the test's duration, not a synchronisation
  hammer.stop_and_join();
  std::printf("ok %ld failed %ld wrong %ld slowest ok call %lld ms writes %llu calls %llu\n",
              hammer.tally.ok.load(), hammer.tally.failed.load(), hammer.tally.wrong.load(),
              hammer.tally.max_ok_ms.load(), static_cast<unsigned long long>(shared.stats().writes),
              static_cast<unsigned long long>(shared.stats().calls));
  EXPECT_EQ(hammer.tally.wrong.load(), 0) << hammer.tally.first_wrong;
  EXPECT_EQ(hammer.tally.failed.load(), 0) << hammer.tally.first_failure;
  EXPECT_LE(hammer.tally.max_ok_ms.load(), timeout.count() + 500);
}

// ---------------------------------------------------------------------------
// 3. Misattribution: CLIENT KILL of the shared socket while calls (single, pipelined,
//    large) are in flight; each kill is made while the wire has calls queued.
// ---------------------------------------------------------------------------
TEST(SharedConnectionFaults, ClientKillMidFlightNeverHandsAReplyToTheWrongCall) {
  RedisServer server;
  SharedConnection shared(opts_for(server, Millis(2000)));
  EchoHammer hammer(shared, 12, 100000);
  int kills = 0;
  const auto end = Clock::now() + 6s;
  for (int i = 0; i < 60 && Clock::now() < end; ++i) {
    if (!eventually([&] { return shared.stats().in_flight >= 3; }, Millis(2000))) continue;
    server.command({"CLIENT", "KILL", "TYPE", "normal"});
    ++kills;
    const long before = hammer.tally.ok.load();
    eventually([&] { return hammer.tally.ok.load() > before + 20; }, Millis(2000));
  }
  hammer.stop_and_check("kills", kills);
  EXPECT_GT(kills, 10);
  EXPECT_GT(hammer.tally.ok.load(), 1000);
}

// ---------------------------------------------------------------------------
// 4. A server stopped for longer than the command timeout with replies still to
//    come: the calls in flight fail; when it runs again it answers them on the old
//    socket, and none of those late answers may reach a later call.
// ---------------------------------------------------------------------------
TEST(SharedConnectionFaults, LateRepliesAfterAPauseLongerThanTheTimeoutReachNobody) {
  RedisServer server;
  const Millis timeout(250);
  SharedConnection shared(opts_for(server, timeout, Millis(250)));
  EchoHammer hammer(shared, 10, 100000);
  int pauses = 0, recoveries = 0;
  for (int i = 0; i < 8; ++i) {
    if (!eventually([&] { return shared.stats().in_flight >= 4; }, Millis(3000))) continue;
    const long failed_before = hammer.tally.failed.load();
    server.pause();
    const auto t_pause = Clock::now();
    ++pauses;
    // Longer than the timeout: some calls in flight have failed...
    eventually([&] { return hammer.tally.failed.load() > failed_before + 4; }, Millis(5000));
    // ...and new calls queued again (on new sockets whose PING waits in the kernel).
    eventually(
        [&] { return shared.stats().in_flight >= 2 || hammer.tally.failed.load() > failed_before + 12; },
        Millis(3000));
    const auto paused_for = ms_since(t_pause);
    server.resume();
    const auto t_resume = Clock::now();
    const long ok_before = hammer.tally.ok.load();
    const bool recovered = eventually([&] { return hammer.tally.ok.load() > ok_before + 200; }, Millis(5000));
    std::printf("round %d: paused %lld ms, %s after %lld ms (failed %ld)\n", i,
                static_cast<long long>(paused_for), recovered ? "recovered" : "NOT recovered",
                ms_since(t_resume), hammer.tally.failed.load());
    recoveries += recovered;
  }
  hammer.stop_and_check("pauses", pauses);
  EXPECT_EQ(recoveries, pauses) << "calls did not succeed again within 5 s of the resume";
  EXPECT_GE(pauses, 5);
  EXPECT_GT(hammer.tally.failed.load(), 0);
}

// ---------------------------------------------------------------------------
// 5. A server restarted (SIGTERM + start on the same port) with calls in flight.
// ---------------------------------------------------------------------------
TEST(SharedConnectionFaults, RestartMidFlightNeverHandsAReplyToTheWrongCall) {
  RedisServer server;
  SharedConnection shared(opts_for(server, Millis(1000), Millis(500)));
  EchoHammer hammer(shared, 10, 100000);
  int restarts = 0;
  for (int i = 0; i < 4; ++i) {
    if (!eventually([&] { return shared.stats().in_flight >= 3; }, Millis(3000))) continue;
    server.restart();
    ++restarts;
    const long ok_before = hammer.tally.ok.load();
    eventually([&] { return hammer.tally.ok.load() > ok_before + 200; }, Millis(5000));
  }
  hammer.stop_and_check("restarts", restarts);
  EXPECT_EQ(restarts, 4);
}

// ---------------------------------------------------------------------------
// 6. NOSCRIPT retries while SCRIPT FLUSH runs again and again: every script call
//    (single and pipelined) gets its own answer; a failure is an error, never
//    somebody else's result.
// ---------------------------------------------------------------------------
TEST(SharedConnectionFaults, ScriptFlushStormNeverHandsAScriptResultToTheWrongCall) {
  RedisServer server;
  SharedConnection shared(opts_for(server, Millis(2000)));
  static const Script kEcho("return ARGV[1]");
  std::atomic<long> ok{0}, failed{0}, noscript{0}, wrong{0};
  std::mutex mu;
  std::string first_wrong;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 12; ++t) {
    threads.emplace_back([&, t] {
      for (long i = 0; i < 100000 && !stop.load(); ++i) {
        const std::string a = "s" + std::to_string(t) + "-" + std::to_string(i);
        Error ec;
        if (i % 2 == 0) {
          const std::string_view args[] = {a};
          Reply r = kEcho.run(shared, {}, args, ec);
          if (ec) {
            ++failed;
            if (is_error(r.get(), "NOSCRIPT")) ++noscript;
          } else if (reply_str(r.get()) != a) {
            ++wrong;
            std::lock_guard lk(mu);
            if (first_wrong.empty()) first_wrong = a + " got " + std::string(reply_str(r.get()));
          } else {
            ++ok;
          }
        } else {
          const std::string b = a + "b", c = a + "c";
          const std::string_view aa[] = {a}, bb[] = {b}, cc[] = {c};
          const Script::Call calls[] = {{{}, aa}, {{}, bb}, {{}, cc}};
          auto r = kEcho.run_pipelined(shared, calls, ec);
          if (ec) {
            ++failed;
            continue;
          }
          const std::string want[] = {a, b, c};
          bool good = r.size() == 3;
          for (int k = 0; good && k < 3; ++k) {
            if (is_error(r[k].get(), "NOSCRIPT")) {
              ++noscript;
              good = false;
              break;
            }
            good = r[k] && reply_str(r[k].get()) == want[k];
          }
          if (good) {
            ++ok;
          } else if (r.size() != 3 || !std::any_of(r.begin(), r.end(), [](const Reply& x) {
                       return is_error(x.get(), "NOSCRIPT");
                     })) {
            ++wrong;
            std::lock_guard lk(mu);
            if (first_wrong.empty()) first_wrong = "pipeline " + a;
          }
        }
      }
    });
  }
  int flushes = 0;
  const auto end = Clock::now() + 6s;
  for (int i = 0; i < 300 && Clock::now() < end; ++i) {
    if (!eventually([&] { return shared.stats().in_flight >= 2; }, Millis(2000))) continue;
    server.command({"SCRIPT", "FLUSH"});
    ++flushes;
    const long before = ok.load();
    eventually([&] { return ok.load() > before + 5; }, Millis(2000));
  }
  stop = true;
  for (auto& th : threads) th.join();
  std::printf("flushes %d ok %ld failed %ld (NOSCRIPT surfaced %ld)\n", flushes, ok.load(), failed.load(),
              noscript.load());
  EXPECT_EQ(wrong.load(), 0) << first_wrong;
  EXPECT_GT(flushes, 50);
  EXPECT_GT(ok.load(), 1000);
}

// ---------------------------------------------------------------------------
// 7. A 10,000-command pipeline (large request and large reply: a renew batch of
//    10,000 leases is 10 such EVALSHAs, here 10,000 ECHOs) while small calls run.
// ---------------------------------------------------------------------------
TEST(SharedConnectionFaults, HugePipelinesBesideSmallCallsKeepEveryReplyWithItsCall) {
  RedisServer server;
  SharedConnection shared(opts_for(server, Millis(5000)));
  EchoHammer hammer(shared, 8, 1000000);
  ASSERT_TRUE(eventually([&] { return hammer.tally.ok.load() > 200; }));  // the small calls are running
  std::atomic<long> big_ok{0}, big_wrong{0}, big_failed{0};
  const long small_before = hammer.tally.ok.load();
  std::vector<std::thread> bigs;
  for (int b = 0; b < 2; ++b) {
    bigs.emplace_back([&, b] {
      for (int round = 0; round < 6; ++round) {
        std::vector<std::string> texts;
        texts.reserve(10000);
        for (int i = 0; i < 10000; ++i) {
          texts.push_back("big" + std::to_string(b) + "-" + std::to_string(round) + "-" + std::to_string(i) +
                          std::string(100, 'x'));
        }
        std::vector<Argv> batch;
        batch.reserve(texts.size());
        for (const auto& s : texts) batch.push_back({"ECHO", s});
        Error ec;
        auto r = shared.exchange(batch, ec);
        if (ec) {
          ++big_failed;
          hammer.tally.remember_failure(ec.detail());
          continue;
        }
        bool good = r.size() == texts.size();
        for (std::size_t i = 0; good && i < texts.size(); ++i)
          good = r[i] && reply_str(r[i].get()) == texts[i];
        good ? ++big_ok : ++big_wrong;
      }
    });
  }
  for (auto& th : bigs) th.join();
  hammer.stop_and_join();
  std::printf("big ok %ld failed %ld; small ok %ld failed %ld\n", big_ok.load(), big_failed.load(),
              hammer.tally.ok.load(), hammer.tally.failed.load());
  EXPECT_GT(hammer.tally.ok.load(), small_before) << "no small call ran beside the big ones";
  EXPECT_EQ(big_wrong.load(), 0);
  EXPECT_EQ(hammer.tally.wrong.load(), 0) << hammer.tally.first_wrong;
  EXPECT_EQ(big_failed.load(), 0) << hammer.tally.first_failure;
  EXPECT_EQ(hammer.tally.failed.load(), 0) << hammer.tally.first_failure;
}

// ---------------------------------------------------------------------------
// 8. Destroying the connection right after every call returned (failed on a stuck
//    server) is clean; repeated many times.
// ---------------------------------------------------------------------------
TEST(SharedConnectionFaults, DestroyRightAfterCallsFailedOnAStuckServerIsClean) {
  RedisServer server;
  for (int round = 0; round < 10; ++round) {
    auto shared = std::make_unique<SharedConnection>(opts_for(server, Millis(100), Millis(100)));
    Error ec;
    shared->command({"PING"}, ec);
    ASSERT_FALSE(ec) << ec.detail();
    server.pause();
    std::vector<std::thread> threads;
    std::atomic<int> done{0};
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&, t] {
        Error e;
        shared->command({"ECHO", std::string(t * 50000 + 1, 'z')}, e);
        EXPECT_TRUE(e);
        ++done;
      });
    }
    for (auto& th : threads) th.join();
    shared.reset();
    server.resume();
  }
  EXPECT_EQ(server.command({"PING"})->type, REDIS_REPLY_STATUS);
}

// ---------------------------------------------------------------------------
// 9. The lock contract through the public API on one shared connection per client:
//    threads of 3 clients hammer a few names while the shared sockets are killed,
//    the script cache flushed, and the server stopped longer than the command
//    timeout. Exclusion is checked with owns() at both ends; tokens per name
//    strictly increase in the order of entry.
// ---------------------------------------------------------------------------
TEST(SharedConnectionFaults, LockHammerUnderKillsFlushesAndPausesKeepsExclusionAndTokens) {
  RedisServer server;
  ClientOptions co;
  co.connect_timeout = Millis(300);
  co.command_timeout = Millis(300);
  constexpr int kClients = 3, kThreadsPer = 4, kNames = 3;
  std::vector<Client> clients = connect_clients(server.url(), kClients, co);
  std::atomic<int> inside[kNames] = {0, 0, 0};
  std::atomic<int> overlaps{0}, acquired{0}, errors{0}, lost_inside{0};
  std::mutex mu;
  std::uint64_t last_token[kNames] = {0, 0, 0};
  int regressions = 0;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads =
      start_hammer_threads(kClients, kThreadsPer, 131, [&](int c, std::minstd_rand& rng) {
        for (int n = 0; n < 20000 && !stop.load(); ++n) {
          const int k = static_cast<int>(rng() % kNames);
          LockOptions lo;
          lo.ttl = Millis(1500);
          lo.wait = Millis(rng() % 2 ? 0 : 200);
          std::error_code ec;
          Lease l = clients[c].acquire("h" + std::to_string(k), lo, ec);
          if (ec) {
            if (ec != distlock::errc::timeout) ++errors;
            continue;
          }
          ++acquired;
          if (inside[k].fetch_add(1) != 0) ++overlaps;
          {
            std::lock_guard lk(mu);
            if (l.token() <= last_token[k]) ++regressions;
            last_token[k] = std::max(last_token[k], l.token());
          }
          const bool owned_at_start = l.owns();
          if (rng() % 4 == 0) std::this_thread::sleep_for(Millis(rng() % 3));
          const bool owned_at_end = l.owns();
          // Leave before the lease can end, so `inside` counts believing holders only.
          inside[k].fetch_sub(1);
          if (!owned_at_start) ++lost_inside;
          (void)owned_at_end;
          std::error_code rec;
          l.release(rec);
        }
      });
  int kills = 0, flushes = 0, pauses = 0;
  const auto end = Clock::now() + 9s;
  for (int i = 0; i < 200 && Clock::now() < end; ++i) {
    const long before = acquired.load();
    eventually([&] { return acquired.load() > before + 10; }, Millis(3000));
    switch (i % 5) {
      case 0:
      case 1: server.command({"CLIENT", "KILL", "TYPE", "normal"}), ++kills; break;
      case 2:
      case 3: server.command({"SCRIPT", "FLUSH"}), ++flushes; break;
      case 4: {
        const int e0 = errors.load();
        server.pause();
        ++pauses;
        eventually([&] { return errors.load() > e0 + 3; }, Millis(3000));
        server.resume();
        break;
      }
    }
  }
  stop = true;
  // A thread stuck in acquire() for good (see the wait-queue test below) cannot be
  // joined: report it and end the process rather than hang until the ctest timeout.
  std::atomic<int> finished{0};
  std::thread joiner([&] {
    for (auto& t : threads) t.join(), ++finished;
  });
  if (!eventually([&] { return finished.load() == static_cast<int>(threads.size()); }, Millis(20000))) {
    std::printf(
        "HANG: %d of %zu hammer threads still inside acquire()/release() 20 s after the end "
        "(acquired %d errors %d kills %d flushes %d pauses %d; so far overlaps %d token regressions %d)\n",
        static_cast<int>(threads.size()) - finished.load(), threads.size(), acquired.load(), errors.load(),
        kills, flushes, pauses, overlaps.load(), [&] {
          std::lock_guard lk(mu);
          return regressions;
        }());
    ADD_FAILURE() << "lock calls hang";
    std::fflush(stdout);
    server.kill();
    std::_Exit(1);
  }
  joiner.join();
  std::printf("acquired %d errors %d kills %d flushes %d pauses %d\n", acquired.load(), errors.load(), kills,
              flushes, pauses);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(regressions, 0);
  EXPECT_EQ(lost_inside.load(), 0);
  EXPECT_GT(acquired.load(), 200);
}

// ---------------------------------------------------------------------------
// 10. (Last in the file: when it fails it leaves a spinning thread behind.) The
//     hand-off's refresher (src/redis/wait_queue.cpp) found by test 9 hanging:
//     hand_on() sets kick_ for an abandoned entry; when another thread's
//     flush_abandoned() cancels that entry first, and no entry is queued, run()
//     finds no period and calls cv_.wait(lk, pred) with pred already true (kick_),
//     so it loops forever without ever releasing mu_: every later begin(),
//     forget(), flush_abandoned(), on_grant() of that client blocks for good.
//     Driven deterministically through the refresh callback (which runs unlocked).
// ---------------------------------------------------------------------------
TEST(SharedConnectionFaults, WaitQueueRefresherKeepsItsLockFreeWhenAKickOutlivesTheCancelItAskedFor) {
  struct Sync {
    std::mutex m;
    std::condition_variable cv;
    bool in_refresh = false, release = false;
  };
  auto sync = std::make_shared<Sync>();
  auto* q = new WaitQueue(
      distlock::system_steady_clock(),
      [sync](const std::vector<WaitQueue::Wait>& ws) {
        std::unique_lock lk(sync->m);
        sync->in_refresh = true;
        sync->cv.notify_all();
        sync->cv.wait_for(lk, 10s, [&] { return sync->release; });
        return std::vector<WaitQueue::Answer>(ws.size());  // failed: nothing changes
      },
      [](std::string_view) {}, [](const WaitQueue::Wait&) { return true; });
  // A queued entry: the refresher calls refresh() within ttl/3 and blocks there.
  const WaitQueue::Begun w = q->begin("n", "o", Millis(30));
  q->queued("n", "o", w.entry);
  {
    std::unique_lock lk(sync->m);
    ASSERT_TRUE(sync->cv.wait_for(lk, 5s, [&] { return sync->in_refresh; }));
  }
  // Meanwhile: a grant to an unknown entry is handed on (kick_), and an acquiring
  // thread's flush_abandoned() cancels it; the queued wait ends.
  WaitQueue::Wait h;
  h.name = "m";
  h.owner = "x";
  h.entry = "999";
  h.ttl = Millis(30);
  q->hand_on(h, Millis(10000));
  q->flush_abandoned();
  q->forget("n", "o", w.entry);
  {
    std::lock_guard lk(sync->m);
    sync->release = true;
  }
  sync->cv.notify_all();
  // Probe the queue's lock from a detached thread, 20 times: each must answer within 2 s.
  bool stuck = false;
  for (int i = 0; i < 20 && !stuck; ++i) {
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread([q, done] {
      (void)q->size();
      done->store(true);
    }).detach();
    stuck = !eventually([&] { return done->load(); }, Millis(2000));
  }
  EXPECT_FALSE(stuck) << "WaitQueue::size() blocked for 2 s: the refresher spins holding its mutex "
                         "(kick_ set, nothing queued or abandoned)";
  if (!stuck) delete q;  // else leaked: its destructor would block on the same mutex
}

}  // namespace
}  // namespace distlock::detail::redis
