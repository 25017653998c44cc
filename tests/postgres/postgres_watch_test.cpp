// client.watch(prefix) on postgres:// (src/postgres/postgres_watch.cpp): hand-offs in
// token order, a killed holder as an inferred loss within its bound, a lease given up as
// lost as a published loss, events published only while a watch exists, a silent server, an event too long
// for NOTIFY, the initial state and the prefix filter, the watch's own connection terminated as a gap then
// the state, and a stop from another thread.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <poll.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/db_postgres_events.hpp"
#include "support/eventually.hpp"
#include "support/load_thread.hpp"
#include "support/lock_tool.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"
#include "support/watch_next_acquired.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Two clients hand one name to each other for 8 s (at most 5,000 times): every `acquired`
// carries a token above the last and is followed by the release of exactly that token
// before the next `acquired`; nothing is missing, nothing is a gap or inferred.
TEST(PostgresPrefixWatch, HandOffsComeInTokenOrder) {
  PostgresServer server;
  Client watcher = distlock::connect(server.url(), quiet());
  Watch w = watcher.watch("ho/");
  constexpr int kMaxHandOffs = 5000;
  const auto stop_at = Clock::now() + 8s;
  std::atomic<int> taken{0};
  std::vector<Client> clients = connect_clients(server.url(), 2);
  std::vector<std::thread> threads;
  for (int c = 0; c < 2; ++c) {
    threads.push_back(load_thread([&clients, &taken, stop_at, c] {
      Client& client = clients[c];
      while (Clock::now() < stop_at) {
        Lease l = client.acquire("ho/x", ttl_of(10s, 30s));
        if (taken.fetch_add(1) >= kMaxHandOffs) {
          taken.fetch_sub(1);
          break;  // not counted; released as it leaves
        }
        l.release();
      }
    }));
  }
  for (auto& t : threads) t.join();
  const int total = taken.load();
  ASSERT_GT(total, 50) << "too few hand-offs to say anything";
  HandOffOrder order;
  const auto& ho = order.of("ho/x");
  // The leases over the bound were released too: wait for `total` releases at least.
  while (ho.released < total) {
    auto e = next_change(w, 20s);
    ASSERT_TRUE(e) << "after " << ho.acquired << " acquired and " << ho.released << " released of " << total;
    ASSERT_EQ(e->name, "ho/x") << describe(*e);
    ASSERT_FALSE(e->inferred) << describe(*e);
    ASSERT_NO_FATAL_FAILURE(order.check(*e));
  }
  std::cout << "hand-offs watched: " << total << " in 8 s\n";
}

// A holder killed with SIGKILL: the server ends its session and frees the advisory lock,
// and nothing of ours publishes; the lease's row shows it held until its last renewal +
// TTL (1 s), then the watch's re-read reports an inferred `lost`: within the TTL plus the
// re-check bound (at most 5 s).
TEST(PostgresPrefixWatch, KilledHolderShowsAsLost) {
  PostgresServer server;
  Client watcher = distlock::connect(server.url(), quiet());
  Watch w = watcher.watch("kill/");
  KilledHolder k;
  ASSERT_NO_FATAL_FAILURE(expect_killed_holder_lost(w, server.url(), "kill/x", 1000, k));
  const WatchEvent& lost = k.lost;
  EXPECT_TRUE(lost.inferred);
  const auto took = k.after_kill;
  std::cout << "killed holder reported lost after " << took.count() << " ms\n";
  // TTL 1 s + at most 5 s to the next check + slack for a loaded machine.
  EXPECT_LT(took, 10s);
}

// A lease the engine declares lost (its hold bound of 500 ms reached) is given up with a
// statement (forget): the watch reports `lost` with its token as published, not inferred,
// and the next holder's `acquired` after it.
TEST(PostgresPrefixWatch, ALeaseGivenUpAsLostShowsAsLostNotInferred) {
  PostgresServer server;
  Client c = distlock::connect(server.url(), quiet());
  Watch w = c.watch("bound/");
  LockOptions bounded = ttl_of(60s, 30s);
  bounded.max_hold = 500ms;
  Lease l = c.acquire("bound/x", bounded);
  ASSERT_NO_FATAL_FAILURE(expect_next_acquired(w, l));
  auto lost = next_change(w, 10s);
  ASSERT_TRUE(lost) << "no loss reported";
  EXPECT_EQ(lost->kind, WatchEventKind::lost) << describe(*lost);
  EXPECT_EQ(lost->token, l.token());
  EXPECT_FALSE(lost->inferred) << describe(*lost);
  Lease next = c.acquire("bound/x", ttl_of(30s, 30s));
  ASSERT_NO_FATAL_FAILURE(expect_next_acquired(w, next));
}

// The initial state lists what was held before the watch; locks of other prefixes are
// never reported.
TEST(PostgresPrefixWatch, InitialStateAndPrefixFilter) {
  PostgresServer server;
  Client c = distlock::connect(server.url(), quiet());
  Lease held = c.acquire("pre/held", ttl_of(30s, 30s));
  Watch w = c.watch("pre/");
  ASSERT_NO_FATAL_FAILURE(expect_held_state(w, "pre/held", held.token()));
  {
    Lease other = c.acquire("other/x", ttl_of(30s, 30s));
    Lease near = c.acquire("prefix-not/x", ttl_of(30s, 30s));
  }
  Lease mine = c.acquire("pre/new", ttl_of(30s, 30s));
  auto e = next_change(w, 10s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, WatchEventKind::acquired) << describe(*e);
  EXPECT_EQ(e->name, "pre/new");
  EXPECT_EQ(e->token, mine.token());
}

// The watch's own connection terminated by the server (pg_terminate_backend): a gap, then
// the re-list's state of the lock held all along, then later changes as events again.
TEST(PostgresPrefixWatch, WatchConnectionTerminatedIsAGapThenTheState) {
  PostgresServer server;
  Client c = distlock::connect(server.url(), quiet());
  Lease held = c.acquire("term/held", ttl_of(30s, 30s));
  Watch w = c.watch("term/");
  auto s = w.next(10s);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->kind, WatchEventKind::state);
  const auto rows = server.query(
      "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = "
      "'distlock-watch'");
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(rows[0][0], "1");
  auto g = w.next(10s);
  ASSERT_TRUE(g) << "no gap reported";
  EXPECT_EQ(g->kind, WatchEventKind::gap) << describe(*g);
  // The state after the gap (more gaps may come first: the re-connection is one too).
  bool state_seen = false;
  const auto end = Clock::now() + 20s;
  while (!state_seen && Clock::now() < end) {
    auto e = w.next(5s);
    if (!e) continue;
    if (e->kind == WatchEventKind::gap) continue;
    ASSERT_EQ(e->kind, WatchEventKind::state) << describe(*e);
    EXPECT_EQ(e->name, "term/held");
    EXPECT_TRUE(e->held);
    EXPECT_EQ(e->token, held.token());
    state_seen = true;
  }
  ASSERT_TRUE(state_seen);
  // Listening again: the next change is an event (after the re-connection's gap and
  // state, if they come after the first state).
  const std::uint64_t token = held.token();
  held.release();
  bool released = false;
  const auto end2 = Clock::now() + 20s;
  while (!released && Clock::now() < end2) {
    auto e = w.next(5s);
    if (!e) continue;
    if (e->kind == WatchEventKind::released) {
      EXPECT_EQ(e->token, token);
      released = true;
    } else if (e->kind == WatchEventKind::state && !e->held) {
      released = true;  // the re-list of the re-connection read it first: reported as free
    } else {
      ASSERT_TRUE(e->kind == WatchEventKind::gap || e->kind == WatchEventKind::state) << describe(*e);
    }
  }
  EXPECT_TRUE(released);
}

// The lock statements publish only while a watch holds the watcher key: a plain LISTEN
// connection hears nothing of an acquire and a release before any watch exists, and both
// while one does; after the watch stops, nothing again.
TEST(PostgresPrefixWatch, EventsArePublishedOnlyWhileAWatchExists) {
  PostgresServer server;
  EventListener l(server.url());
  ASSERT_TRUE(l.ok()) << l.error();
  Client c = distlock::connect(server.url(), quiet());
  c.acquire("q/x", ttl_of(30s, 30s)).release();
  EXPECT_EQ(l.events_until("probe1").size(), 0u);
  {
    Watch w = c.watch("q/");
    c.acquire("q/x", ttl_of(30s, 30s)).release();
    const auto seen = l.events_until("probe2");
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[0].rfind("acquired 2 712f78 ", 0), 0u) << seen[0];  // "q/x" in hex
    EXPECT_EQ(seen[1].rfind("released 2 712f78 ", 0), 0u) << seen[1];
  }
  // The watch's session ends after its connection closed: wait (at most 10 s) until the
  // server dropped its hold of the watcher key (two-int advisory keys have objsubid 2).
  ASSERT_TRUE(distlock::testing::eventually(
      [&] {
        return server.query(
                   "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1684632419"
                   " AND objid = 2 AND objsubid = 2")[0][0] == "0";
      },
      10s));
  c.acquire("q/x", ttl_of(30s, 30s)).release();
  EXPECT_EQ(l.events_until("probe3").size(), 0u);
}

// A server that stops answering (every server process SIGSTOPped) without closing the
// watch's connection: the watch's idle check (SELECT 1 every 5 s, statement timeout 1 s
// here) reports a gap within 6 s; once the server answers again the re-connection is a
// gap too and the held lock's `state` follows.
TEST(PostgresPrefixWatch, ASilentServerIsAGapWithinTheIdleCheck) {
  PostgresServer server;
  Client c = distlock::connect(server.url(), quiet(1s));
  Lease held = c.acquire("silent/held", ttl_of(60s, 30s));
  Watch w = c.watch("silent/");
  auto s = w.next(10s);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->kind, WatchEventKind::state);
  const auto paused_at = Clock::now();
  server.pause();
  auto g = w.next(15s);
  const auto took = std::chrono::duration_cast<Millis>(Clock::now() - paused_at);
  server.resume();
  ASSERT_TRUE(g) << "no gap within 15 s of the pause";
  EXPECT_EQ(g->kind, WatchEventKind::gap) << describe(*g);
  std::cout << "silent server reported as a gap after " << took.count() << " ms\n";
  EXPECT_LT(took, 10s);  // 5 s idle check + 1 s statement timeout + slack for a loaded machine
  bool again = false, state = false;
  const auto end = Clock::now() + 20s;
  while (!(again && state) && Clock::now() < end) {
    auto e = w.next(5s);
    if (!e) continue;
    if (e->kind == WatchEventKind::gap) {
      again = true;
      state = false;  // the state of interest is the one after the re-connection
    } else if (e->kind == WatchEventKind::state && again) {
      EXPECT_EQ(e->name, "silent/held");
      EXPECT_TRUE(e->held);
      state = true;
    }
  }
  EXPECT_TRUE(again) << "no gap for the re-connection";
  EXPECT_TRUE(state) << "no state after the re-connection";
}

// A name too long for NOTIFY's 8,000-byte payload once in hex (4,000 bytes): the lock is
// taken all the same, the watch reports a gap, and the re-list's state shows the lock held.
TEST(PostgresPrefixWatch, AnEventTooLongForNotifyIsAGapThenTheState) {
  PostgresServer server;
  Client c = distlock::connect(server.url(), quiet());
  Watch w = c.watch("ov/");
  const std::string name = "ov/" + std::string(4000, 'a');
  Lease l = c.acquire(name, ttl_of(30s, 30s));
  auto g = w.next(10s);
  ASSERT_TRUE(g) << "no gap for the oversized event";
  EXPECT_EQ(g->kind, WatchEventKind::gap) << describe(*g);
  ASSERT_NO_FATAL_FAILURE(expect_held_state(w, name, l.token()));  // the re-list after the gap
}

// stop() from another thread ends a next() blocked with no timeout.
TEST(PostgresPrefixWatch, StopFromAnotherThreadEndsABlockedNext) {
  PostgresServer server;
  Client c = distlock::connect(server.url(), quiet());
  Watch w = c.watch("quiet/");
  std::atomic<bool> returned{false};
  std::thread t([&] {
    auto e = w.next();
    EXPECT_FALSE(e);
    returned.store(true);
  });
  std::this_thread::sleep_for(200ms);  // let next() block; the assertion below does not depend on it
  const auto t0 = Clock::now();
  w.stop();
  t.join();
  EXPECT_TRUE(returned.load());
  EXPECT_LT(Clock::now() - t0, 5s);
}

}  // namespace
}  // namespace distlock::testing
