// Races between the engine's parts (lease table, wait registry, renewer/watchdog, event
// queue, hand-back queue) on the in-process memory backend, in real time with the
// background renewer: many threads on one name while losses (session, lease, late
// renewals, validity caps) are injected from other threads. Each scenario is bounded in
// iterations and wall time and checks, on every grant:
// - two holders: no two leases of the name answer owns() at the same moment;
// - stale token: a lease that still owns has a token above every token seen before;
// - silent loss: a release that reports errc::lost comes with the stop token fired and
//   exactly one on_lost callback; no lease's callback runs twice; a fired stop token
//   always comes with its callback;
// - stall: no acquisition waits more than its bound (plus scheduling slack) and every
//   thread finishes (a hang shows as the test's timeout).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <stop_token>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "fake/memory_backend.hpp"
#include "support/memory_fixture.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using distlock::errc;
using distlock::Millis;

namespace {

using SteadyClock = std::chrono::steady_clock;

struct EngineRace : distlock::testing::RealTimeMemoryTest {
  // Per name: the leases inside their critical section (under mu).
  std::mutex mu;
  std::vector<const distlock::Lease*> inside;
  std::atomic<std::uint64_t> max_token{0};
  std::atomic<int> two_holders{0}, stale_tokens{0}, stalls{0}, silent_losses{0}, double_callbacks{0},
      missing_callbacks{0}, grants{0}, losses{0};

  struct Record {
    std::atomic<int> callbacks{0};
    std::stop_token stop;  // the lease's, kept past its release
    bool release_said_lost = false;
  };

  // Enter: compare with everyone inside, check the token, join.
  void enter(const distlock::Lease& lease) {
    std::lock_guard lk(mu);
    for (const distlock::Lease* other : inside) {
      if (other->owns() && lease.owns()) ++two_holders;
    }
    const std::uint64_t t = lease.token();
    std::uint64_t prev = max_token.load();
    while (prev < t && !max_token.compare_exchange_weak(prev, t)) {
    }
    if (t <= prev && lease.owns()) ++stale_tokens;
    inside.push_back(&lease);
  }
  void leave(const distlock::Lease& lease) {
    std::lock_guard lk(mu);
    inside.erase(std::remove(inside.begin(), inside.end(), &lease), inside.end());
  }

  // Checks the records once every callback queued so far has run.
  void check_records(distlock::Client& c, const std::vector<std::shared_ptr<Record>>& records) {
    distlock::detail::engine_of(c)->drain_events();
    for (const auto& r : records) {
      const int cb = r->callbacks.load(), st = r->stop.stop_requested() ? 1 : 0;
      if (cb > 1) ++double_callbacks;
      if (st != cb) ++missing_callbacks;
      if (r->release_said_lost && (st != 1 || cb != 1)) ++silent_losses;
      if (st) ++losses;
    }
  }

  void expect_clean() {
    EXPECT_EQ(two_holders.load(), 0) << "two leases of one name owned at once";
    EXPECT_EQ(stale_tokens.load(), 0) << "a lease owned with a token not above the previous ones";
    EXPECT_EQ(silent_losses.load(), 0) << "release said lost without stop token + one callback";
    EXPECT_EQ(double_callbacks.load(), 0) << "a loss callback ran twice";
    EXPECT_EQ(missing_callbacks.load(), 0)
        << "a stop token fired without its on_lost callback (or vice versa)";
    EXPECT_EQ(stalls.load(), 0) << "an acquisition waited past its bound";
    EXPECT_GT(grants.load(), 0);
  }
};

// A chaos thread for the scenarios of this file: session losses, lease losses of the current
// holder of `name`, validity caps and slow renewals, at random, until `done` or `t_end`.
std::thread start_chaos(distlock::detail::Engine& engine, distlock::detail::MemoryStore& store,
                        std::string name, std::atomic<bool>& done, SteadyClock::time_point t_end,
                        unsigned seed) {
  return std::thread([&engine, &store, name, &done, t_end, seed] {
    std::minstd_rand rng(seed);
    while (!done.load() && SteadyClock::now() < t_end) {
      switch (rng() % 8) {
        case 0: engine.on_session_lost(); break;
        case 1: {
          const std::string h = store.holder(name);
          if (!h.empty()) engine.on_lease_lost(name, h);
          break;
        }
        case 2: engine.on_validity_changed(Millis(90 + rng() % 120)); break;
        case 3: store.set_renew_delay(Millis(rng() % 3 == 0 ? 70 : rng() % 5 == 0 ? 200 : 0)); break;
        default: break;
      }
      std::this_thread::sleep_for(Millis(1 + rng() % 6));
    }
    store.set_renew_delay(0ms);
  });
}

// `threads` threads (spread over `clients`, each its own engine) take Leases on `name`
// up to `iters` times each, or until `t_end`, while `chaos` (started first, stopped
// with `done`) injects faults; then every record is checked.
template <class Chaos>
void hammer(EngineRace& f, std::vector<distlock::Client>& clients, const std::string& name, Millis ttl,
            int threads_n, int iters, SteadyClock::time_point t_end, Chaos chaos) {
  constexpr Millis kWait{3000};
  std::mutex rec_mu;
  std::vector<std::shared_ptr<EngineRace::Record>> records;
  std::atomic<bool> done{false};
  std::thread chaos_thread([&] { chaos(done); });
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_n; ++t) {
    threads.emplace_back([&, t] {
      distlock::Client& c = clients[static_cast<std::size_t>(t) % clients.size()];
      std::minstd_rand rng(100 + t);
      for (int i = 0; i < iters && SteadyClock::now() < t_end; ++i) {
        distlock::LockOptions o;
        o.ttl = ttl;
        o.wait = kWait;
        std::error_code ec;
        const auto asked = SteadyClock::now();
        distlock::Lease lease = c.acquire(name, o, ec);
        // A free name is granted within the wait; a wait that overruns its bound by
        // more than 1.5 s (scheduling slack under ThreadSanitizer) is a stall.
        if (SteadyClock::now() - asked > kWait + 1500ms) ++f.stalls;
        if (ec) continue;
        ++f.grants;
        auto rec = std::make_shared<EngineRace::Record>();
        lease.on_lost([rec] { ++rec->callbacks; });
        rec->stop = lease.stop_token();
        f.enter(lease);
        std::this_thread::sleep_for(Millis(rng() % 4));
        f.leave(lease);
        std::error_code rec_ec;
        lease.release(rec_ec);
        rec->release_said_lost = rec_ec == errc::lost;
        std::lock_guard lk(rec_mu);
        records.push_back(rec);
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  chaos_thread.join();
  for (auto& c : clients) f.check_records(c, {});  // every client's callbacks have run
  f.check_records(clients.front(), records);
  f.expect_clean();
  std::printf("grants %d, losses %d\n", f.grants.load(), f.losses.load());
}

// Holders on one name with Lease; one chaos thread declares session losses, lease
// losses of the current holder, validity caps and slow renewals, all at random.
// Bounded: 6 threads x 1000 acquisitions, and 25 s of wall time.
TEST_F(EngineRace, ManyThreadsOneNameUnderInjectedLossesKeepExclusionTokensAndSignals) {
  const auto t_end = SteadyClock::now() + 25s;
  std::vector<distlock::Client> clients{client()};
  const auto engine = distlock::detail::engine_of(clients.front());
  hammer(*this, clients, "n", 240ms, 6, 1000, t_end,
         [&](std::atomic<bool>& done) { start_chaos(*engine, *store, "n", done, t_end, 7).join(); });
}

// The same on file:// with two clients (two engines: exclusion between them is the
// kernel's lock): session and lease losses declared on either client at random.
TEST_F(EngineRace, TwoFileClientsUnderInjectedLossesKeepExclusionTokensAndSignals) {
  distlock::testing::TempDir dir("distlock-race");
  const std::string url = "file://" + dir.path().string();
  distlock::ClientOptions o;
  o.logger = [](distlock::LogLevel, std::string_view) {};
  std::vector<distlock::Client> clients{distlock::connect(url, o), distlock::connect(url, o)};
  const auto t_end = SteadyClock::now() + 20s;
  hammer(*this, clients, "f", 1000ms, 6, 400, t_end, [&](std::atomic<bool>& done) {
    std::minstd_rand rng(17);
    while (!done.load() && SteadyClock::now() < t_end) {
      auto& e = *distlock::detail::engine_of(clients[rng() % 2]);
      std::error_code ec;
      if (rng() % 2) {
        e.on_session_lost();
      } else if (const auto info = clients[0].status("f", ec); !ec && info.held && info.holder) {
        e.on_lease_lost("f", *info.holder);
      }
      std::this_thread::sleep_for(Millis(2 + rng() % 8));
    }
  });
}

// The same on redis:// (a real server started here) with two clients: the server is
// paused now and then (renewals answered late or not at all: losses at the local
// deadline while replies arrive), and session losses are declared at random.
TEST_F(EngineRace, TwoRedisClientsWithAPausingServerKeepExclusionTokensAndSignals) {
  distlock::testing::RedisServer redis;
  distlock::ClientOptions o;
  o.logger = [](distlock::LogLevel, std::string_view) {};
  std::vector<distlock::Client> clients{distlock::connect(redis.url(), o), distlock::connect(redis.url(), o)};
  const auto t_end = SteadyClock::now() + 20s;
  hammer(*this, clients, "r", 600ms, 6, 400, t_end, [&](std::atomic<bool>& done) {
    std::minstd_rand rng(23);
    while (!done.load() && SteadyClock::now() < t_end) {
      switch (rng() % 6) {
        case 0:
          redis.pause();
          std::this_thread::sleep_for(Millis(100 + rng() % 400));  // the fault's length
          redis.resume();
          break;
        case 1: distlock::detail::engine_of(clients[rng() % 2])->on_session_lost(); break;
        default: break;
      }
      std::this_thread::sleep_for(Millis(5 + rng() % 20));
    }
  });
}

// Nested Mutex holds (re-entry) on one name while losses are declared: re-entry racing
// a loss, a nested re-lock after a loss, unlocks of lost holds. Every thread ends
// (no hang), unlock fails only with errc::lost, and once all are done nothing is
// left in the lease table or on the server (a leaked hold would be renewed forever
// and block every other client).
TEST_F(EngineRace, NestedMutexHoldsUnderInjectedLossesLeaveNothingBehind) {
  constexpr int kThreads = 4;
  constexpr int kIters = 300;
  constexpr auto kBudget = 20s;
  const auto t_end = SteadyClock::now() + kBudget;
  distlock::Client c = client();
  const auto engine = distlock::detail::engine_of(c);
  distlock::LockOptions o;
  o.ttl = 240ms;
  std::atomic<bool> done{false};
  std::atomic<int> unexpected{0}, inner_wait{0};
  std::thread chaos = start_chaos(*engine, *store, "m", done, t_end, 11);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      distlock::Mutex m = c.mutex("m", o);
      std::minstd_rand rng(200 + t);
      for (int i = 0; i < kIters && SteadyClock::now() < t_end; ++i) {
        if (!m.try_lock_for(2s)) continue;
        ++grants;
        const int depth = 1 + static_cast<int>(rng() % 3);
        int locked = 1;
        for (int d = 1; d < depth; ++d) {
          // Re-entry of a live hold costs no round trip; after a loss it waits for
          // the server like a fresh lock.
          if (m.try_lock_for(2s)) {
            ++locked;
          } else {
            ++inner_wait;
          }
        }
        std::this_thread::sleep_for(Millis(rng() % 3));
        for (; locked > 0; --locked) {
          std::error_code ec;
          m.unlock(ec);
          if (ec && ec != errc::lost) ++unexpected;
        }
        if (m.hold_count() != 0) ++unexpected;
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  chaos.join();
  engine->drain_events();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(grants.load(), 0);
  EXPECT_EQ(engine->held_count(), 0u) << "a hold stayed in the lease table after every unlock";
  EXPECT_FALSE(store->held("m", distlock::system_steady_clock()->now()))
      << "a hold stayed on the server after every unlock";
}

// Cancels racing grants: waiters on one busy name, each cancelled from another thread
// at a random moment while holders come and go. A cancelled wait ends with
// errc::cancelled within its bound; a granted lease is a real one (exclusion, token);
// once all are done nothing stays in the lease table or on the server.
TEST_F(EngineRace, CancelsRacingGrantsLeaveNoHoldAndNoStall) {
  constexpr int kThreads = 6;
  constexpr int kIters = 300;
  constexpr auto kBudget = 20s;
  const auto t_end = SteadyClock::now() + kBudget;
  distlock::Client c = client();
  const auto engine = distlock::detail::engine_of(c);
  std::atomic<int> cancelled{0}, unexpected{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::minstd_rand rng(300 + t);
      for (int i = 0; i < kIters && SteadyClock::now() < t_end; ++i) {
        std::stop_source cancel;
        distlock::LockOptions o;
        o.ttl = 300ms;
        o.wait = 3000ms;
        o.cancel = cancel.get_token();
        const Millis after{rng() % 4};
        std::thread canceller([&cancel, after] {
          std::this_thread::sleep_for(after);
          cancel.request_stop();
        });
        std::error_code ec;
        const auto asked = SteadyClock::now();
        distlock::Lease lease = c.acquire("k", o, ec);
        // The cancel comes at most 3 ms after the start: the wait must end soon after.
        canceller.join();
        if (ec == errc::cancelled) {
          ++cancelled;
          if (SteadyClock::now() - asked > 1500ms) ++stalls;
          continue;
        }
        if (ec) {
          if (ec != errc::timeout) ++unexpected;
          continue;
        }
        ++grants;
        enter(lease);
        std::this_thread::sleep_for(Millis(rng() % 3));
        leave(lease);
        lease.release(ec);
        if (ec) ++unexpected;
      }
    });
  }
  for (auto& th : threads) th.join();
  engine->drain_events();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(cancelled.load(), 0);
  expect_clean();
  EXPECT_EQ(engine->held_count(), 0u);
  EXPECT_FALSE(store->held("k", distlock::system_steady_clock()->now()))
      << "a cancelled wait left a hold on the server";
}

}  // namespace
