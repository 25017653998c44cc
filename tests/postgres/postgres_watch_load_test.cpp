// client.watch(prefix) on postgres:// under load and interference: with nobody watching,
// concurrent lock statements (almost) never NOTIFY (a NOTIFY serialises commit flushes over
// the whole server); the watcher key never blocks or breaks a lock statement (a foreign
// session waiting for it exclusively behind a watch); every token of fast hand-offs over
// many names reaches two watches of nested prefixes (none skipped, none out of order, no
// gap, none inferred); a watch whose server went silent is destroyed within its connect and
// statement timeouts; a watch connection frozen for less than the idle check delays its
// events and skips none; a restart is a gap, then events again.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/db_postgres_events.hpp"
#include "support/fault_proxy.hpp"
#include "support/load_thread.hpp"
#include "support/postgres_server.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The tokens each name was acquired under, as the lockers saw them.
using Tokens = std::map<std::string, std::set<std::uint64_t>>;

// Reads `w` until every token of `expect` under `prefix` has been acquired and released,
// at most `limit` (steady clock). Fails on a gap, an inferred loss, a token out of order,
// an `acquired` before the previous release, a release of another token, or a name outside
// the prefix.
void expect_every_token(Watch& w, const std::string& prefix, const Tokens& expect, Millis limit) {
  Tokens want;
  std::size_t left = 0;
  for (const auto& [name, tokens] : expect) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    want[name] = tokens;
    left += tokens.size();
  }
  std::map<std::string, std::uint64_t> open, last;
  const auto end = Clock::now() + limit;
  while (left > 0) {
    ASSERT_LT(Clock::now(), end) << prefix << ": " << left << " releases not reported within "
                                 << limit.count() << " ms";
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    ASSERT_TRUE(e) << prefix << ": " << left << " releases not reported";
    if (e->kind == WatchEventKind::state) continue;  // the initial listing
    ASSERT_EQ(e->name.compare(0, prefix.size(), prefix), 0) << prefix << ": " << describe(*e);
    ASSERT_NE(e->kind, WatchEventKind::gap) << prefix << ": " << describe(*e);
    ASSERT_FALSE(e->inferred) << prefix << ": " << describe(*e);
    if (e->kind == WatchEventKind::acquired) {
      ASSERT_EQ(open.count(e->name), 0u)
          << prefix << ": acquired before the release of token " << open[e->name] << ": " << describe(*e);
      ASSERT_GT(e->token, last[e->name]) << prefix << ": " << describe(*e);
      auto& ts = want[e->name];
      ASSERT_EQ(ts.count(e->token), 1u) << prefix << ": a token no locker had: " << describe(*e);
      // Every token below it was reported before: nothing skipped.
      ASSERT_EQ(*ts.begin(), e->token) << prefix << ": token " << *ts.begin() << " skipped: " << describe(*e);
      open[e->name] = e->token;
      last[e->name] = e->token;
    } else {
      ASSERT_EQ(e->kind, WatchEventKind::released) << prefix << ": " << describe(*e);
      ASSERT_EQ(open.count(e->name), 1u) << prefix << ": " << describe(*e);
      ASSERT_EQ(open[e->name], e->token) << prefix << ": " << describe(*e);
      open.erase(e->name);
      want[e->name].erase(e->token);
      --left;
    }
  }
}

// With nobody watching, four clients acquire and release names of their own concurrently
// for 3 s (at most 400 each): fewer than 5% of the changes NOTIFY. A NOTIFY in a transaction
// takes PostgreSQL's cluster-wide notify lock until its commit is flushed, so statements
// that publish to nobody serialise every client's commits (docs/postgres.md "Cost with a
// watch under concurrency"); a check of the watcher key that two lock statements fail on
// each other (one holding it exclusively to its commit) publishes most changes.
TEST(PostgresWatchLoad, ConcurrentLockStatementsPublishNothingWhileNobodyWatches) {
  PostgresServer server;
  EventListener l(server.url());
  ASSERT_TRUE(l.ok()) << l.error();
  std::atomic<std::size_t> changes{0};
  std::vector<Client> clients = connect_clients(server.url(), 4);
  const auto stop_at = Clock::now() + 3s;
  std::vector<std::thread> threads;
  for (int c = 0; c < 4; ++c) {
    threads.push_back(load_thread([&, c] {
      Client& client = clients[c];
      const std::string name = "nobody/" + std::to_string(c);
      for (int i = 0; i < 400 && Clock::now() < stop_at; ++i) {
        Lease lease = client.acquire(name, ttl_of(10s, 30s));
        lease.release();
        changes.fetch_add(2);
      }
    }));
  }
  for (auto& t : threads) t.join();
  const std::size_t heard = l.events_until("marker-of-the-load-test").size();
  std::cout << "changes with nobody watching: " << changes.load() << ", published: " << heard << "\n";
  ASSERT_GT(changes.load(), 100u) << "too few changes to say anything";
  EXPECT_LT(heard * 20, changes.load()) << heard << " of " << changes.load() << " changes published a NOTIFY";
}

// A watch holds the watcher key shared and a foreign session waits for it exclusively (so
// every lock statement's pg_try_advisory_xact_lock on it fails: a waiter is queued): two
// clients hand one name to each other 150 times each; no acquire or release waits on the
// key (each well under the 5 s statement timeout), never two holders at once, and the
// watch reports every token.
TEST(PostgresWatchLoad, AWaiterForTheWatcherKeyNeitherBlocksNorBreaksLocking) {
  PostgresServer server;
  Client watcher = distlock::connect(server.url(), quiet());
  Watch w = watcher.watch("key/");
  PGconn* foreign = PQconnectdb(server.url().c_str());
  ASSERT_EQ(PQstatus(foreign), CONNECTION_OK) << PQerrorMessage(foreign);
  ASSERT_EQ(PQsendQuery(foreign, "SELECT pg_advisory_lock(1684632419, 2)"), 1) << PQerrorMessage(foreign);
  // Waiting (not granted) while the watch holds the key shared.
  bool waiting = false;
  for (int i = 0; i < 100 && !waiting; ++i) {
    waiting = server.query(
                  "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1684632419 AND "
                  "objid = 2 AND objsubid = 2 AND NOT granted")[0][0] == "1";
    if (!waiting) std::this_thread::sleep_for(50ms);  // polled for a condition, bounded at 5 s
  }
  ASSERT_TRUE(waiting) << "the foreign session's request for the watcher key is not queued";
  constexpr int kEach = 150;
  std::atomic<int> inside{0}, overlaps{0};
  std::atomic<long long> slowest_ms{0};
  std::mutex mu;
  Tokens tokens;
  std::vector<Client> clients = connect_clients(server.url(), 2);
  std::vector<std::thread> threads;
  for (int c = 0; c < 2; ++c) {
    threads.push_back(load_thread([&, c] {
      Client& client = clients[c];
      for (int i = 0; i < kEach; ++i) {
        const auto t0 = Clock::now();
        Lease l = client.acquire("key/x", ttl_of(10s, 30s));
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        {
          std::lock_guard lk(mu);
          tokens["key/x"].insert(l.token());
        }
        inside.fetch_sub(1);
        l.release();
        const auto ms = std::chrono::duration_cast<Millis>(Clock::now() - t0).count();
        long long prev = slowest_ms.load();
        while (ms > prev && !slowest_ms.compare_exchange_weak(prev, ms)) {
        }
      }
    }));
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  std::cout << "slowest acquire+release with the key contended: " << slowest_ms.load() << " ms\n";
  EXPECT_LT(slowest_ms.load(), 4000);  // a statement waiting on the key would take the 5 s statement timeout
  expect_every_token(w, "key/", tokens, 30s);
  PQfinish(foreign);
}

// Three clients hand six names (three under "nest/a/", three under "nest/b/") around for
// 4 s (at most 400 acquisitions each); a watch of "nest/" and one of "nest/a/" each report
// every token of their names in order, each released before the next acquired, no gap,
// none inferred, and nothing of "nest/b/" on the narrower watch.
TEST(PostgresWatchLoad, NestedPrefixesManyNamesEveryTokenReported) {
  PostgresServer server;
  Client watcher = distlock::connect(server.url(), quiet());
  Watch wide = watcher.watch("nest/");
  Watch narrow = watcher.watch("nest/a/");
  const std::vector<std::string> names = {"nest/a/0", "nest/a/1", "nest/a/2",
                                          "nest/b/0", "nest/b/1", "nest/b/2"};
  std::mutex mu;
  Tokens tokens;
  std::vector<Client> clients = connect_clients(server.url(), 3);
  const auto stop_at = Clock::now() + 4s;
  std::vector<std::thread> threads;
  for (int c = 0; c < 3; ++c) {
    threads.push_back(load_thread([&, c] {
      Client& client = clients[c];
      for (int i = 0; i < 400 && Clock::now() < stop_at; ++i) {
        const std::string& name = names[(i * 5 + c) % names.size()];
        Lease l = client.acquire(name, ttl_of(10s, 30s));
        {
          std::lock_guard lk(mu);
          tokens[name].insert(l.token());
        }
        l.release();
      }
    }));
  }
  for (auto& t : threads) t.join();
  std::size_t total = 0;
  for (const auto& [n, ts] : tokens) total += ts.size();
  ASSERT_GT(total, 60u) << "too few acquisitions to say anything";
  std::cout << "acquisitions over 6 names: " << total << "\n";
  expect_every_token(wide, "nest/", tokens, 30s);
  expect_every_token(narrow, "nest/a/", tokens, 30s);
}

// A watch whose server went silent (every server process SIGSTOPped) reports its gap and
// then keeps trying to connect; destroying it meanwhile returns within the connect and
// statement timeouts (1 s each here) plus slack, not blocked on the silent server.
TEST(PostgresWatchLoad, DestroyingAWatchOfASilentServerReturnsWithinItsTimeouts) {
  PostgresServer server;
  Client c = distlock::connect(server.url(), quiet(1s));
  auto w = std::make_unique<Watch>(c.watch("silent/"));
  server.pause();
  ASSERT_TRUE(next_matching(*w, 15s, event_of(WatchEventKind::gap))) << "no gap within 15 s of the pause";
  std::this_thread::sleep_for(300ms);  // into a re-connection attempt; the bound below holds either way
  const auto t0 = Clock::now();
  w.reset();
  const auto took = std::chrono::duration_cast<Millis>(Clock::now() - t0);
  server.resume();
  std::cout << "watch of a silent server destroyed in " << took.count() << " ms\n";
  EXPECT_LT(took, 4s);  // connect 1 s + LISTEN 1 s + watcher key 1 s, plus slack
}

// The watcher's connections go through a fault proxy that freezes them for 2.5 s (less than
// the 5 s idle check) while two clients hand a name to each other directly for 4 s (at most 5,000 times
// each): the events held up in the frozen connection arrive after the thaw, every token in order, no gap and
// nothing inferred (the expiry re-reads through the frozen proxy fail and are retried; none decides a loss).
TEST(PostgresWatchLoad, AFrozenWatchConnectionDelaysButSkipsNothing) {
  PostgresServer server;
  FaultProxy proxy(server.port());
  Client watcher = distlock::connect(PostgresServer::url_through(proxy.port()), quiet());
  Watch w = watcher.watch("frz/");
  std::mutex mu;
  Tokens tokens;
  // The lockers' statements get 10 s (not 2 s): what this test checks is the watch; beside two
  // CPU hogs and three other tests a release once went unanswered for 2 s (measured alone beside
  // the hogs: the slowest acquire + release 84-691 ms in 4 runs, printed below).
  std::vector<Client> clients = connect_clients(server.url(), 2, quiet(10s));
  const auto stop_at = Clock::now() + 4s;
  std::atomic<long long> slowest_ms{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 2; ++c) {
    threads.push_back(load_thread([&, c] {
      Client& client = clients[c];
      for (int i = 0; i < 5000 && Clock::now() < stop_at; ++i) {
        const auto t0 = Clock::now();
        Lease l = client.acquire("frz/x", ttl_of(10s, 30s));
        {
          std::lock_guard lk(mu);
          tokens["frz/x"].insert(l.token());
        }
        l.release();
        const auto ms = std::chrono::duration_cast<Millis>(Clock::now() - t0).count();
        long long prev = slowest_ms.load();
        while (ms > prev && !slowest_ms.compare_exchange_weak(prev, ms)) {
        }
      }
    }));
  }
  std::this_thread::sleep_for(500ms);  // hand-offs before the freeze; the checks do not depend on it
  proxy.freeze();
  std::this_thread::sleep_for(2500ms);  // the fault's length (below the 5 s idle check)
  proxy.pass();
  for (auto& t : threads) t.join();
  std::cout << "hand-offs: " << tokens["frz/x"].size()
            << "; slowest acquire+release with the watch frozen part of the time: " << slowest_ms.load()
            << " ms\n";
  ASSERT_GT(tokens["frz/x"].size(), 20u) << "too few hand-offs to say anything";
  expect_every_token(w, "frz/", tokens, 30s);
}

// A server restart (fast shutdown, started again on the same port and data) while a
// watch runs: a gap, and afterwards the watch delivers again — a hand-off made after the
// restart is reported as `acquired` then `released` of its token within 20 s (no stall;
// hand-offs are repeated, as one made before the re-connection is covered by its gap).
TEST(PostgresWatchLoad, ARestartIsAGapThenEventsAgain) {
  PostgresServer server;
  Client watcher = distlock::connect(server.url(), quiet(1s));
  Watch w = watcher.watch("rs/");
  server.restart();
  ASSERT_TRUE(next_matching(w, 15s, event_of(WatchEventKind::gap))) << "no gap within 15 s of the restart";
  // Hand-offs until one is reported (one made before the re-connection is covered by its
  // gap, not reported), at most 20 s on the steady clock.
  Client c = distlock::connect(server.url(), quiet());
  bool acquired = false, released = false;
  int tries = 0;
  const auto end2 = Clock::now() + 20s;
  while (!released && Clock::now() < end2) {
    ++tries;
    Lease l = c.acquire("rs/x", ttl_of(10s, 30s));
    const std::uint64_t token = l.token();
    l.release();
    acquired = false;
    const auto round_end = Clock::now() + 1s;
    while (!released && Clock::now() < round_end) {
      auto e = w.next(std::chrono::ceil<Millis>(round_end - Clock::now()));
      if (!e) break;
      if (e->kind == WatchEventKind::acquired && e->token == token) acquired = true;
      if (e->kind == WatchEventKind::released && e->token == token) released = acquired;
    }
  }
  std::cout << "hand-offs after the restart until one was reported: " << tries << "\n";
  EXPECT_TRUE(released) << "no hand-off after the restart was reported (acquired then released) within 20 s";
}

}  // namespace
}  // namespace distlock::testing
