// redis:// direct hand-off under races, restarts, kills and give-ups.
// Written by the adversarial review of the hand-off (commit 210618e, first named handoff_review_test.cpp).
//
// Adversarial review of the redis:// direct hand-off (docs/redis.md "How waiting
// works"): tests that try to break the lock contract. Each test starts its own
// redis-server on a loopback port. Every wait is bounded in count and time.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "engine/thread_annotations.hpp"
#include "redis/redis_backend.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/lock_hammer.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_probes.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

long long server_pttl(RedisServer& s, const std::string& name) {
  auto r = s.command({"PTTL", "distlock:{" + name + "}"});
  return r && r->type == REDIS_REPLY_INTEGER ? r->integer : -100;
}

// The turns waiters take at one name, one at a time: take() holds a lease inside the critical
// section for a while, counts an overlap when another turn is inside, checks the lease still
// owns() at its end, and keeps its token in the order of entry.
class Turns {
 public:
  explicit Turns(std::vector<std::uint64_t> tokens = {}) : tokens_(std::move(tokens)) {}

  void take(const Lease& l, Millis hold) {
    if (inside_.fetch_add(1) != 0) ++overlaps_;
    {
      distlock::detail::LockGuard lk(mu_);
      tokens_.push_back(l.token());
    }
    std::this_thread::sleep_for(hold);
    EXPECT_TRUE(l.owns());
    inside_.fetch_sub(1);
  }

  int overlaps() const { return overlaps_.load(); }

  // The tokens, in the order their turns began (after those given to the constructor).
  std::vector<std::uint64_t> tokens() {
    distlock::detail::LockGuard lk(mu_);
    return tokens_;
  }

 private:
  std::atomic<int> inside_{0}, overlaps_{0};
  distlock::detail::AnnotatedMutex mu_;
  std::vector<std::uint64_t> tokens_ DISTLOCK_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------
// 1. The refresher sleeps for the period it computed before a new, shorter-TTL
//    wait was queued (wait_for with a predicate that ignores the new wait), so a
//    live waiter's entry expires: it loses its FIFO place and a release skips it.
// ---------------------------------------------------------------------------
TEST(RedisHandOffFaults, ShortTtlWaiterQueuedAfterALongTtlWaiterOnTheSameClientKeepsItsPlace) {
  RedisServer server;
  Client other = distlock::connect(server.url());
  Client holder_client = distlock::connect(server.url());
  Client c = distlock::connect(server.url());  // the client with both waits
  Client d = distlock::connect(server.url());
  Lease long_holder = other.acquire("long", ttl_of(30s));
  Lease holder = holder_client.acquire("short", ttl_of(30s));

  // Wait A (ttl 60 s, refresh period 5 s) makes c's refresher sleep 5 s.
  std::thread ta([&] {
    distlock::detail::Error ec;
    Lease l = c.acquire("long", ttl_of(60s, 40s), ec);
  });
  ASSERT_TRUE(eventually([&] { return waiters_of(holder_client, "long") == 1u; }, 10s));
  // Synchronise with c's refresher: wait for its first refresh of A's entry (the
  // entry's "<expiry>:<ttl>" value changes), after which it sleeps 5 s again.
  auto entry_value = [&] {
    auto r = server.command({"HVALS", "distlock:{long}:qx"});
    return r && r->type == REDIS_REPLY_ARRAY && r->elements == 1
               ? std::string(r->element[0]->str, r->element[0]->len)
               : std::string();
  };
  const std::string first_value = entry_value();
  ASSERT_FALSE(first_value.empty());
  ASSERT_TRUE(eventually([&] { return entry_value() != first_value; }, 12s))
      << "A's entry was never refreshed";
  std::mutex mu;
  std::vector<std::string> order;
  // A wait for "short" through `client` with `ttl` that notes `who` in `order` once granted.
  const auto waiter = [&](Client& client, Millis ttl, std::string who) {
    return std::thread([&client, ttl, who, &mu, &order] {
      distlock::detail::Error ec;
      Lease l = client.acquire("short", ttl_of(ttl, 30s), ec);
      EXPECT_FALSE(ec) << ec.message();
      std::lock_guard lk(mu);
      order.push_back(who);
    });
  };
  // Wait B on the same client, ttl 300 ms: its entry must be refreshed every 100 ms.
  std::thread tb = waiter(c, 300ms, "B");
  ASSERT_TRUE(eventually([&] { return waiters_of(holder_client, "short") == 1u; }, 10s));
  std::thread td = waiter(d, 10s, "D");
  ASSERT_TRUE(eventually([&] { return waiters_of(holder_client, "short") == 2u; }, 10s));
  // Watch the live entries for 1.5 s (five of B's TTLs): B is alive and waiting,
  // so both entries must stay live.
  std::uint64_t min_seen = 2;
  const auto until = Clock::now() + 1500ms;
  while (Clock::now() < until) {
    min_seen = std::min(min_seen, waiters_of(holder_client, "short"));
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(min_seen, 2u) << "a live waiter's queue entry expired (it was not refreshed every ttl/3)";
  holder.release();
  tb.join();
  td.join();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], "B") << "FIFO broken: the later waiter D was granted before the live waiter B";
  long_holder.release();
  ta.join();
}

// ---------------------------------------------------------------------------
// 2. A hand-off grantee's local deadline vs the server's PTTL, right after
//    acquire returns (safety margin 1 ms, so the check is tight). PTTL is read
//    first, then remaining(): remaining <= pttl (+1 ms rounding).
// ---------------------------------------------------------------------------
TEST(RedisHandOffFaults, HandOffGranteeLocalDeadlineIsNotAfterTheServerExpiry) {
  RedisServer server;
  Client holder_client = distlock::connect(server.url());
  Client w = distlock::connect(server.url());
  int checked = 0;
  for (int i = 0; i < 16; ++i) {
    const Millis ttl = (i % 2 == 0) ? Millis(300) : Millis(1200);
    const std::string name = "pttl-" + std::to_string(i);
    Lease holder = holder_client.acquire(name, ttl_of(10s));
    long long pttl = -100;
    Millis local{};
    std::uint64_t token = 0;
    std::thread t([&] {
      distlock::detail::Error ec;
      Lease l = w.acquire(name, ttl_of(ttl, 30s, 1ms), ec);
      if (ec) return;
      pttl = server_pttl(server, name);
      local = l.remaining();
      token = l.token();
    });
    ASSERT_TRUE(eventually([&] { return waiters_of(holder_client, name) == 1u; }, 10s));
    // Vary where in the refresh period the release lands (the staleness of last_ok).
    std::this_thread::sleep_for(Millis(17 * i % (ttl.count() / 3 + 1)));
    const std::uint64_t htok = holder.token();
    holder.release();
    t.join();
    ASSERT_GT(token, htok);
    ASSERT_GE(pttl, 0) << "iteration " << i;
    EXPECT_LE(local.count(), pttl + 1)
        << "iteration " << i << " ttl " << ttl.count() << ": the local deadline outlives the server's grant";
    ++checked;
  }
  EXPECT_EQ(checked, 16);
}

// ---------------------------------------------------------------------------
// 3. Give-up racing a grant at the engine level: a waiter's timeout equals
//    (roughly) the moment of the release. Whatever the outcome, the next waiter
//    must get the lock promptly (not after the given-up waiter's 10 s TTL), and
//    the given-up waiter's owner must not stay the server's holder.
// ---------------------------------------------------------------------------
TEST(RedisHandOffFaults, GiveUpRacingTheGrantNeverStrandsTheLock) {
  RedisServer server;
  Client h = distlock::connect(server.url());
  Client x = distlock::connect(server.url());
  Client y = distlock::connect(server.url());
  int x_got = 0, x_timeouts = 0;
  std::uint64_t last_token = 0;
  for (int i = 0; i < 24; ++i) {
    const std::string name = "race";
    Lease holder = h.acquire(name, ttl_of(10s));
    EXPECT_GT(holder.token(), last_token);
    last_token = holder.token();
    const Millis xwait(150);
    std::atomic<bool> x_done{false};
    std::optional<std::uint64_t> x_token;
    distlock::detail::Error xec;
    Clock::time_point x_start{};
    std::thread xt([&] {
      x_start = Clock::now();
      Lease l = x.acquire(name, ttl_of(10s, xwait), xec);
      if (!xec) x_token = l.token();
      x_done = true;
    });
    ASSERT_TRUE(eventually([&] { return waiters_of(h, name) == 1u; }, 10s));
    std::optional<std::uint64_t> y_token;
    Clock::time_point y_at{};
    std::thread yt([&] {
      distlock::detail::Error ec;
      Lease l = y.acquire(name, ttl_of(10s, 30s), ec);
      EXPECT_FALSE(ec) << ec.message();
      if (!ec) y_token = l.token();
      y_at = Clock::now();
    });
    ASSERT_TRUE(eventually([&] { return waiters_of(h, name) == 2u; }, 10s));
    // Release around X's deadline: -12 .. +11 ms.
    const auto target = x_start + xwait + Millis(i - 12);
    std::this_thread::sleep_until(target);
    const auto released_at = Clock::now();
    holder.release();
    xt.join();
    yt.join();
    if (x_token) {
      ++x_got;
      EXPECT_GT(*x_token, last_token);
      last_token = *x_token;
    } else {
      ++x_timeouts;
      EXPECT_EQ(xec, distlock::errc::timeout) << xec.message();
    }
    ASSERT_TRUE(y_token.has_value());
    EXPECT_GT(*y_token, last_token) << "iteration " << i;
    last_token = *y_token;
    EXPECT_LT(std::chrono::duration_cast<Millis>(y_at - released_at), 4000ms)
        << "iteration " << i << ": the lock sat with a given-up waiter";
  }
  EXPECT_EQ(waiters_of(h, "race"), 0u);
  std::printf("x acquired %d, x timed out %d\n", x_got, x_timeouts);
}

// ---------------------------------------------------------------------------
// 4. try_acquire never queues and never jumps the queue, even when the lock is
//    free because its holder's lease ran out with a live waiter queued.
// ---------------------------------------------------------------------------
TEST(RedisHandOffFaults, TryAcquireNeitherQueuesNorJumpsTheQueue) {
  RedisServer server;
  Client h = distlock::connect(server.url());
  Client w = distlock::connect(server.url());
  Client t = distlock::connect(server.url());
  // A holder that never renews: one raw backend acquisition with a 400 ms TTL.
  auto& backend = distlock::detail::engine_of(h)->backend();
  const std::string owner = "0123456789abcdef0123456789abcdef:9.1";
  distlock::detail::AcquireRequest req{"jump", owner, Millis(400), false};
  distlock::detail::Error ec;
  ASSERT_TRUE(backend.try_acquire(req, ec).acquired) << ec.message();
  std::atomic<bool> w_got{false};
  std::thread wt([&] {
    distlock::detail::Error wec;
    Lease l = w.acquire("jump", ttl_of(5s, 30s), wec);
    EXPECT_FALSE(wec) << wec.message();
    w_got = true;
    // Hold until the main thread has finished trying.
    for (int i = 0; i < 400 && w_got.load(); ++i) std::this_thread::sleep_for(5ms);
  });
  ASSERT_TRUE(eventually([&] { return waiters_of(h, "jump") == 1u; }, 10s));
  int tries = 0, got = 0;
  const auto end = Clock::now() + 1500ms;
  while (Clock::now() < end && !w_got.load()) {
    auto l = t.try_acquire("jump", ttl_of(5s));
    ++tries;
    if (l) {
      ++got;
      break;
    }
    EXPECT_LE(waiters_of(h, "jump"), 1u) << "try_acquire queued";
  }
  EXPECT_EQ(got, 0) << "try_acquire jumped the queue ahead of a live waiter";
  EXPECT_GT(tries, 0);
  ASSERT_TRUE(eventually([&] { return w_got.load(); }, 10s));
  w_got = false;
  wt.join();
}

// ---------------------------------------------------------------------------
// 5. Server restart (SIGKILL, same port) while waiters are queued: without and
//    with persistence. Tokens never go backwards; the holder whose lock the
//    restart lost is told; every waiter eventually gets the lock, one at a time.
// ---------------------------------------------------------------------------
void restart_with_waiters(bool aof) {
  distlock::testing::RedisServerOptions o;
  o.appendonly = aof;
  RedisServer server(o);
  Client h = distlock::connect(server.url());
  constexpr int kWaiters = 4;
  std::vector<Client> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(distlock::connect(server.url()));
  Lease holder = h.acquire("restart", ttl_of(2s));
  const std::uint64_t first = holder.token();
  Turns turns({first});
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      // An outage fails a wait with backend_unavailable (documented): wait again,
      // a bounded number of times.
      distlock::detail::Error ec;
      Lease l;
      const auto give_up = Clock::now() + 60s;
      for (int attempt = 0; attempt < 200 && Clock::now() < give_up; ++attempt) {
        l = clients[i].acquire("restart", ttl_of(2s, 60s), ec);
        if (ec != distlock::errc::backend_unavailable) break;
        std::this_thread::sleep_for(50ms);
      }
      EXPECT_FALSE(ec) << ec.message();
      if (ec) {
        ++done;
        return;
      }
      turns.take(l, 20ms);
      distlock::detail::Error rec;
      l.release(rec);
      ++done;
    });
    ASSERT_TRUE(eventually([&] { return waiters_of(h, "restart") == static_cast<unsigned>(i + 1); }, 10s));
  }
  server.kill();
  server.restart();
  if (!aof) {
    // The lock is gone from the server: the holder must learn it (renewal refused).
    EXPECT_TRUE(eventually([&] { return holder.stop_token().stop_requested(); }, 5s))
        << "the holder whose lock the restart lost was not told";
  } else {
    // The lock survived: the holder still owns it and releases it.
    ASSERT_TRUE(eventually([&] { return server_holder(server, "restart").size() > 0; }, 5s));
  }
  distlock::detail::Error rec;
  holder.release(rec);
  ASSERT_TRUE(eventually([&] { return done.load() == kWaiters; }, 60s)) << done.load();
  for (auto& t : threads) t.join();
  EXPECT_EQ(turns.overlaps(), 0);
  const std::vector<std::uint64_t> tokens = turns.tokens();
  for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_GT(tokens[i], tokens[i - 1]) << "grant " << i;
  server.kill();
}

TEST(RedisHandOffFaults, ServerRestartWithoutPersistenceWhileWaitersQueued) {
  restart_with_waiters(false);
}

TEST(RedisHandOffFaults, ServerRestartWithAofWhileWaitersQueued) {
  restart_with_waiters(true);
}

// ---------------------------------------------------------------------------
// 6. Hammer: several clients and threads, short TTLs, waits of random length
//    (many give up, racing grants), some try_acquires. Mutual exclusion is
//    checked with owns() at both ends of the critical section; tokens strictly
//    increase in the order of entry.
// ---------------------------------------------------------------------------
TEST(RedisHandOffFaults, HammerWithGiveUpsKeepsExclusionAndTokenOrder) {
  RedisServer server;
  constexpr int kClients = 4, kThreadsPer = 3;
  std::vector<Client> clients = connect_clients(server.url(), kClients);
  std::atomic<int> inside{0}, overlaps{0}, acquired{0}, timeouts{0}, errors{0}, lost_inside{0};
  std::mutex mu;
  std::uint64_t last_token = 0;
  int token_regressions = 0;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads =
      start_hammer_threads(kClients, kThreadsPer, 31, [&](int c, std::minstd_rand& rng) {
        for (int n = 0; n < 2000 && !stop.load(); ++n) {
          const int kind = static_cast<int>(rng() % 10);
          std::optional<Lease> l;
          if (kind == 0) {
            l = clients[c].try_acquire("hammer", ttl_of(500ms));
            if (!l) continue;
          } else {
            const Millis wait(kind < 5 ? static_cast<long>(1 + rng() % 20) : 3000);
            distlock::detail::Error ec;
            Lease got = clients[c].acquire("hammer", ttl_of(500ms, wait), ec);
            if (ec == distlock::errc::timeout) {
              ++timeouts;
              continue;
            }
            if (ec) {
              ++errors;
              continue;
            }
            l.emplace(std::move(got));
          }
          ++acquired;
          if (inside.fetch_add(1) != 0) ++overlaps;
          {
            std::lock_guard lk(mu);
            if (l->token() <= last_token) ++token_regressions;
            last_token = std::max(last_token, l->token());
          }
          if (!l->owns()) ++lost_inside;
          if (rng() % 3 == 0) std::this_thread::sleep_for(Millis(rng() % 3));
          if (!l->owns()) ++lost_inside;
          inside.fetch_sub(1);
          distlock::detail::Error rec;
          l->release(rec);
          if (rec) ++errors;
        }
      });
  run_hammer_for(8s, stop, threads);
  std::printf("acquired %d timeouts %d errors %d\n", acquired.load(), timeouts.load(), errors.load());
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(token_regressions, 0);
  EXPECT_EQ(lost_inside.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(acquired.load(), 50);
  // Nothing stranded: the lock is free and nobody queued.
  EXPECT_TRUE(eventually([&] { return !clients[0].status("hammer").held; }, 3s))
      << server_holder(server, "hammer");
  EXPECT_EQ(waiters_of(clients[0], "hammer"), 0u);
}

// ---------------------------------------------------------------------------
// 7. A grant published while the grantee's subscriber connection is being
//    reconnected (CLIENT KILL TYPE pubsub right before the release).
// ---------------------------------------------------------------------------
TEST(RedisHandOffFaults, GrantWhileTheGranteesSubscriberReconnects) {
  RedisServer server;
  Client h = distlock::connect(server.url());
  Client w = distlock::connect(server.url());
  for (int i = 0; i < 4; ++i) {
    const std::string name = "resub-" + std::to_string(i);
    Lease holder = h.acquire(name, ttl_of(10s));
    Clock::time_point got_at{};
    long long pttl = -100;
    Millis local{};
    std::thread t([&] {
      distlock::detail::Error ec;
      Lease l = w.acquire(name, ttl_of(1s, 30s, 1ms), ec);
      EXPECT_FALSE(ec) << ec.message();
      if (ec) return;
      got_at = Clock::now();
      pttl = server_pttl(server, name);
      local = l.remaining();
    });
    ASSERT_TRUE(eventually([&] { return waiters_of(h, name) == 1u; }, 10s));
    server.command({"CLIENT", "KILL", "TYPE", "pubsub"});
    const auto released_at = Clock::now();
    holder.release();
    t.join();
    EXPECT_LT(std::chrono::duration_cast<Millis>(got_at - released_at), 3000ms) << "iteration " << i;
    EXPECT_LE(local.count(), pttl + 1) << "iteration " << i;
  }
}

// ---------------------------------------------------------------------------
// 8. Many waiters and kill -9 of the holder (a child process): each waiter gets
//    the lock in turn, one at a time, tokens increasing, within a bounded time.
// ---------------------------------------------------------------------------
TEST(RedisHandOffFaults, ManyWaitersAndTheHolderKilled) {
  distlock::testing::TempDir dir("distlock-handoff-review");
  RedisServer server;
  Client probe = distlock::connect(server.url());
  const std::string out = (dir.path() / "holder.out").string();
  auto child = distlock::testing::spawn_holder(server.url(), "killed", out, 1000, 60000);
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "acquired", 10s)) << distlock::testing::read_file(out);
  const std::uint64_t child_token = probe.status("killed").token.value_or(0);
  constexpr int kWaiters = 8;
  std::vector<Client> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(distlock::connect(server.url()));
  Turns turns;
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      distlock::detail::Error ec;
      Lease l = clients[i].acquire("killed", ttl_of(1s, 60s), ec);
      EXPECT_FALSE(ec) << ec.message();
      if (!ec) turns.take(l, 10ms);
      ++done;
    });
    ASSERT_TRUE(eventually([&] { return waiters_of(probe, "killed") == static_cast<unsigned>(i + 1); }, 10s));
  }
  child.signal(SIGKILL);
  const auto killed_at = Clock::now();
  ASSERT_TRUE(eventually([&] { return done.load() == kWaiters; }, 60s)) << done.load();
  for (auto& t : threads) t.join();
  EXPECT_LT(std::chrono::duration_cast<Millis>(Clock::now() - killed_at), 10s);
  EXPECT_EQ(turns.overlaps(), 0);
  const std::vector<std::uint64_t> tokens = turns.tokens();
  ASSERT_EQ(tokens.size(), static_cast<std::size_t>(kWaiters));
  EXPECT_GT(tokens[0], child_token);
  for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_GT(tokens[i], tokens[i - 1]);
}

// ---------------------------------------------------------------------------
// 9. A waiter (child process) paused by SIGSTOP right after the lock was granted
//    to its entry: the grant runs out on the server, another waiter W gets the
//    lock, and the paused one resumes with the grant message still in its socket.
//    It must not believe it holds while W does; it queues again and gets the lock
//    after W, with a larger token.
// ---------------------------------------------------------------------------
TEST(RedisHandOffFaults, WaiterPausedWithAGrantInFlightResumesWhileAnotherHolds) {
  distlock::testing::TempDir dir("distlock-handoff-review");
  RedisServer server;
  Client h = distlock::connect(server.url());
  Client w = distlock::connect(server.url());
  Lease holder = h.acquire("paused", ttl_of(3s));
  const std::string out = (dir.path() / "paused.out").string();
  auto paused = distlock::testing::spawn_holder(server.url(), "paused", out, 1000, 100, {"--wait", "60000"});
  ASSERT_TRUE(eventually([&] { return waiters_of(h, "paused") == 1u; }, 10s));
  std::atomic<int> w_state{0};  // 1 holding, 2 released
  std::uint64_t w_token = 0;
  std::atomic<bool> let_go{false};
  std::thread wt([&] {
    distlock::detail::Error ec;
    Lease l = w.acquire("paused", ttl_of(1s, 60s), ec);
    EXPECT_FALSE(ec) << ec.message();
    if (ec) return;
    w_token = l.token();
    w_state = 1;
    for (int i = 0; i < 3000 && !let_go.load(); ++i) std::this_thread::sleep_for(5ms);
    EXPECT_TRUE(l.owns());
    w_state = 2;
  });
  ASSERT_TRUE(eventually([&] { return waiters_of(h, "paused") == 2u; }, 10s));
  paused.signal(SIGSTOP);
  holder.release();
  // Granted to the paused child's entry (the head), which cannot take it.
  const std::string child_owner = server_holder(server, "paused");
  ASSERT_FALSE(child_owner.empty());
  EXPECT_EQ(w_state.load(), 0);
  // The grant runs out; W gets the lock.
  ASSERT_TRUE(eventually([&] { return w_state.load() == 1; }, 15s)) << server_holder(server, "paused");
  EXPECT_NE(server_holder(server, "paused"), child_owner);
  paused.signal(SIGCONT);
  // The child resumes, finds its grant lost, and queues again behind W.
  ASSERT_TRUE(eventually([&] { return waiters_of(h, "paused") == 1u; }, 15s))
      << distlock::testing::read_file(out);
  EXPECT_EQ(distlock::testing::read_file(out).find("acquired"), std::string::npos)
      << "the resumed waiter believes it holds while W does: " << distlock::testing::read_file(out);
  let_go = true;
  wt.join();
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "released", 20s)) << distlock::testing::read_file(out);
  const std::string text = distlock::testing::read_file(out);
  const auto at = text.find("acquired ");
  ASSERT_NE(at, std::string::npos);
  const std::uint64_t child_token = std::stoull(text.substr(at + 9));
  EXPECT_GT(child_token, w_token);
}

// ---------------------------------------------------------------------------
// 10. A semaphore (several names, queued in each) under contention with
//     give-ups: never more holders than permits, nothing left behind.
// ---------------------------------------------------------------------------
TEST(RedisHandOffFaults, SemaphoreHammerNeverExceedsItsPermits) {
  RedisServer server;
  constexpr int kClients = 3, kThreadsPer = 2, kPermits = 2;
  std::vector<Client> clients = connect_clients(server.url(), kClients);
  std::atomic<int> inside{0}, over{0}, acquired{0}, errors{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads =
      start_hammer_threads(kClients, kThreadsPer, 7, [&](int c, std::minstd_rand& rng) {
        auto sem = clients[c].semaphore("sem", kPermits, ttl_of(500ms));
        for (int n = 0; n < 2000 && !stop.load(); ++n) {
          std::optional<Lease> l;
          try {
            l = (rng() % 2) ? sem.try_acquire_for(Millis(1 + rng() % 15)) : sem.try_acquire_for(3s);
          } catch (const std::exception&) {
            ++errors;
            continue;
          }
          if (!l) continue;
          ++acquired;
          if (inside.fetch_add(1) >= kPermits) ++over;
          if (rng() % 2) std::this_thread::sleep_for(Millis(rng() % 3));
          if (!l->owns()) ++over;
          inside.fetch_sub(1);
          distlock::detail::Error ec;
          l->release(ec);
          if (ec) ++errors;
        }
      });
  run_hammer_for(6s, stop, threads);
  std::printf("semaphore: acquired %d errors %d\n", acquired.load(), errors.load());
  EXPECT_EQ(over.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(acquired.load(), 50);
}

// ---------------------------------------------------------------------------
// 11. Several names, many waits per client (the refresher's batches carry many
//     entries), short TTLs, give-ups, and a killer thread that breaks the
//     clients' connections (CLIENT KILL TYPE normal / pubsub) every 150 ms:
//     renewals, refreshes, releases and give-ups fail at random points. Whoever
//     enters a name's critical section checks that no other lease of that name
//     still owns(); tokens per name increase in order of entry.
// ---------------------------------------------------------------------------
TEST(RedisHandOffFaults, ConnectionKillsDuringHandOffsKeepExclusion) {
  RedisServer server;
  constexpr int kClients = 3, kThreadsPer = 6, kNames = 3;
  std::vector<Client> clients = connect_clients(server.url(), kClients);
  NameSections sections(kNames);
  std::atomic<int> acquired{0}, failures{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads =
      start_hammer_threads(kClients, kThreadsPer, 131, [&](int c, std::minstd_rand& rng) {
        for (int n = 0; n < 5000 && !stop.load(); ++n) {
          const int k = static_cast<int>(rng() % kNames);
          const std::string name = "kill-" + std::to_string(k);
          const Millis wait(rng() % 3 == 0 ? static_cast<long>(1 + rng() % 30) : 2000);
          distlock::detail::Error ec;
          Lease l = clients[c].acquire(name, ttl_of(300ms, wait), ec);
          if (ec) {
            ++failures;
            continue;
          }
          ++acquired;
          sections.enter(k, l);
          if (rng() % 2) std::this_thread::sleep_for(Millis(rng() % 5));
          sections.leave(k, l);
          distlock::detail::Error rec;
          l.release(rec);
        }
      });
  threads.emplace_back([&] {  // kills the clients' connections
    for (int i = 0; i < 60 && !stop.load(); ++i) {
      std::this_thread::sleep_for(150ms);
      try {
        server.command({"CLIENT", "KILL", "TYPE", i % 4 == 3 ? "pubsub" : "normal"});
      } catch (...) {
      }
    }
  });
  run_hammer_for(9s, stop, threads);
  std::printf("acquired %d failures %d\n", acquired.load(), failures.load());
  EXPECT_EQ(sections.overlaps(), 0);
  EXPECT_EQ(sections.regressions(), 0);
  EXPECT_GT(acquired.load(), 50);
  // Nothing stranded for long: every name is free again within a TTL or two.
  for (int k = 0; k < kNames; ++k) {
    const std::string name = "kill-" + std::to_string(k);
    EXPECT_TRUE(eventually([&] { return !clients[0].status(name).held; }, 3s)) << name;
  }
}

}  // namespace
}  // namespace distlock::testing
