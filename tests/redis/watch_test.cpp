// Client::watch on redis:// (distlock/watch.hpp, src/redis/redis_watch.cpp): the event
// stream of a prefix against a real redis-server each test starts — hand-offs in token
// order, a server restart as a gap followed by a re-list, a killed holder as a loss.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/watch_lease_ends.hpp"
#include "support/watch_next_acquired.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// 1,000 hand-offs of one name between two clients: every `acquired` carries a token
// above the last and is followed by the release of exactly that token before the next
// `acquired`; nothing is missing, nothing is a gap.
TEST(RedisPrefixWatch, ThousandHandOffsComeInTokenOrder) {
  RedisServer server;
  Client watcher = distlock::connect(server.url());
  Watch w = watcher.watch("ho/");
  ASSERT_NO_FATAL_FAILURE(expect_hand_offs_in_token_order(w, server.url(), "ho/x", 1000, 60s));
}

// The server stops and comes back (appendonly: the held lock survives): the watch
// reports a gap, then the held lock as a `state` with its token, and live events after.
TEST(RedisPrefixWatch, RestartIsAGapFollowedByTheHeldState) {
  RedisServer server({.appendonly = true});
  Client holder = distlock::connect(server.url());
  Client watcher = distlock::connect(server.url());
  Watch w = watcher.watch("gap/");
  Lease a = holder.acquire("gap/a", ttl_of(60s, 60s));
  ASSERT_NO_FATAL_FAILURE(expect_next_acquired(w, a));

  server.stop();  // SIGTERM: the AOF is flushed
  server.restart();

  bool gap = false, state = false;
  const auto end = Clock::now() + 30s;
  while (!(gap && state) && Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    if (!e) break;
    if (e->kind == WatchEventKind::gap) {
      gap = true;
      EXPECT_TRUE(e->gap_since.has_value());
      EXPECT_FALSE(e->detail.empty());
    } else if (e->kind == WatchEventKind::state && gap) {
      EXPECT_EQ(e->name, "gap/a");
      EXPECT_TRUE(e->held);
      EXPECT_EQ(e->token, a.token());
      state = true;
    } else {
      ADD_FAILURE() << "unexpected before the re-list: " << describe(*e);
    }
  }
  ASSERT_TRUE(gap) << "no gap reported for the restart";
  ASSERT_TRUE(state) << "no state of gap/a after the gap";

  // Live again: a new lock's events arrive.
  ASSERT_NO_FATAL_FAILURE(expect_live_again(w, holder, "gap/b", 10s));
}

// Hand-offs between two clients while the watcher's connection is cut in the middle (a
// fault proxy between the watcher and the server; the lockers go direct): the cut shows
// as a gap and the re-list as a `state` of the lock, held by a locker that keeps it until
// the state was seen; before and after, each lease is closed before the next opens with
// a higher token. Bounded: 300 + 1,000 hand-offs, 60 s.
TEST(RedisPrefixWatch, HandOffsWithTheWatcherCutOffShowAGapThenTheState) {
  RedisServer server;
  distlock::testing::FaultProxy proxy(server.port());
  Client watcher = distlock::connect("redis://127.0.0.1:" + std::to_string(proxy.port()));
  Watch w = watcher.watch("cut/");
  std::atomic<bool> stop{false}, hold{false}, holding{false};
  std::atomic<int> taken{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&server, &taken, &stop, &hold, &holding] {
      Client client = distlock::connect(server.url());
      while (!stop.load() && taken.load() < 100000) {
        Lease l = client.acquire("cut/x", ttl_of(30s, 60s));
        taken.fetch_add(1);
        // While the watcher is cut off, the holder keeps the lock (bounded by the test's
        // 60 s and `stop`), so the re-list finds it held. `holding` tells the test that a
        // holder is in this loop: before, the lock may be free for a moment between two
        // hand-offs (a locker preempted between its release and its next acquire), and a
        // re-list that read it then rightly reported it free.
        const auto until = Clock::now() + 60s;
        if (hold.load()) holding.store(true);
        while (hold.load() && !stop.load() && Clock::now() < until) std::this_thread::yield();
        holding.store(false);
      }
    });
  }
  struct Join {  // the lockers stop however the test ends
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~Join() {
      stop.store(true);
      for (auto& t : threads) t.join();
    }
  } join{stop, threads};
  std::uint64_t last = 0;
  bool held = false;
  int before = 0, after = 0, gaps = 0, states = 0;
  const auto end = Clock::now() + 60s;
  while (after < 1000 && Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    ASSERT_TRUE(e) << "no event; " << before << " acquisitions before the cut, " << after
                   << " after the state; gaps " << gaps << ", states " << states << ", lockers took "
                   << taken.load();
    switch (e->kind) {
      case WatchEventKind::acquired:
        ASSERT_FALSE(held) << describe(*e);
        ASSERT_GT(e->token, last) << describe(*e);
        held = true;
        last = e->token;
        if (states > 0) {
          ++after;
        } else if (++before == 300) {
          hold.store(true);
          // Cut only once a holder keeps the lock (the lockers run on; bounded: 10 s).
          const auto until = Clock::now() + 10s;
          while (!holding.load() && Clock::now() < until) std::this_thread::yield();
          ASSERT_TRUE(holding.load()) << "no locker held the lock within 10 s of being asked to";
          proxy.drop();  // cut: the subscriber sees its connection close
        }
        break;
      case WatchEventKind::released:
        ASSERT_TRUE(held) << describe(*e);
        ASSERT_EQ(e->token, last) << describe(*e);
        held = false;
        break;
      case WatchEventKind::gap:
        ++gaps;
        proxy.pass();  // the subscriber reconnects (with backoff) and the watch re-lists
        break;
      case WatchEventKind::state:
        ASSERT_GT(gaps, 0) << describe(*e);
        ASSERT_EQ(e->name, "cut/x");
        ASSERT_TRUE(e->held) << describe(*e);
        ASSERT_GE(e->token, last) << describe(*e);
        held = true;
        last = e->token;
        ++states;
        hold.store(false);  // hand-offs go on
        break;
      case WatchEventKind::lost:  // a lease that ended while the watcher was cut off
        ASSERT_GT(gaps, 0) << describe(*e);
        ASSERT_TRUE(e->inferred) << describe(*e);
        ASSERT_TRUE(held) << describe(*e);
        ASSERT_EQ(e->token, last) << describe(*e);
        held = false;
        break;
      default: FAIL() << describe(*e);
    }
  }
  EXPECT_GE(before, 300);
  EXPECT_GE(gaps, 1);
  EXPECT_GE(states, 1);
  EXPECT_EQ(after, 1000) << "hand-offs seen after the re-list";
}

// A holder killed with SIGKILL: its lease expires on the server, which publishes
// nothing; the watch reports it as an inferred `lost` within the TTL plus the re-check
// bound (1 s after the acquire, then the remaining TTL, at most 5 s).
TEST(RedisPrefixWatch, KilledHolderShowsAsLost) {
  RedisServer server;
  Client watcher = distlock::connect(server.url());
  Watch w = watcher.watch("kill/");
  KilledHolder k;
  ASSERT_NO_FATAL_FAILURE(expect_killed_holder_lost(w, server.url(), "kill/x", 1000, k));
  const WatchEvent& lost = k.lost;
  EXPECT_TRUE(lost.inferred);
  // TTL 1 s + at most 5 s to the next check + slack for a loaded machine.
  EXPECT_LT(k.after_kill, 10s);
}

// A Watch taken before locks exist sees nothing of other prefixes, and the initial
// state lists what was held before it started.
TEST(RedisPrefixWatch, InitialStateAndPrefixFilter) {
  RedisServer server;
  Client c = distlock::connect(server.url());
  Lease held = c.acquire("pre/held", ttl_of(30s, 60s));
  Lease other = c.acquire("other/x", ttl_of(30s, 60s));
  Watch w = c.watch("pre/");
  ASSERT_NO_FATAL_FAILURE(expect_held_state(w, "pre/held", held.token()));
  other.release();
  held.release();
  auto e = w.next(10s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, WatchEventKind::released) << describe(*e);
  EXPECT_EQ(e->name, "pre/held");
}

// A consumer that falls behind the queue bound gets a gap (not a silent hole), then the
// state of every lock: the one held throughout and the one it last saw held, free now.
TEST(RedisPrefixWatch, ConsumerBehindTheBoundGetsAGapThenTheState) {
  RedisServer server;
  Client c = distlock::connect(server.url());
  distlock::WatchOptions wo;
  wo.initial_state = false;
  wo.max_queued = 8;
  Watch w = c.watch("q/", wo);
  Watch barrier = c.watch("q/h");  // unbounded: tells when the server has published everything
  constexpr int kCycles = 20;      // 40 events on q/a, 32 beyond the bound
  for (int i = 0; i < kCycles; ++i) c.acquire("q/a", ttl_of(30s, 60s)).release();
  Lease h = c.acquire("q/h", ttl_of(30s, 60s));
  auto seen = next_change(barrier, 10s);
  ASSERT_TRUE(seen && seen->kind == WatchEventKind::acquired);
  // Everything is published; `w` has the first events queued and dropped the rest. Read
  // it: q/a events in token order (each acquired closed before the next), then a gap,
  // then q/h by the re-list's `state` (or live, if its message came after the room).
  std::uint64_t last_a = 0;
  bool a_held = false, gap = false;
  std::optional<WatchEvent> h_event;
  int events = 0;
  const auto end = Clock::now() + 20s;
  while (!h_event && Clock::now() < end && events < 200) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    ASSERT_TRUE(e) << "no q/h after " << events << " events (gap seen: " << gap << ")";
    ++events;
    if (e->kind == WatchEventKind::gap) {
      EXPECT_NE(e->detail.find("fell behind"), std::string::npos) << e->detail;
      gap = true;
    } else if (e->name == "q/h") {
      EXPECT_TRUE(gap) << "q/h before the gap: " << describe(*e);
      h_event = *e;
    } else {
      ASSERT_EQ(e->name, "q/a") << describe(*e);
      if (e->kind == WatchEventKind::acquired) {
        ASSERT_FALSE(a_held) << describe(*e);
        ASSERT_GT(e->token, last_a) << describe(*e);
        a_held = true;
      } else if (e->kind == WatchEventKind::released) {
        if (!gap) {
          ASSERT_TRUE(a_held) << describe(*e);
        }
        ASSERT_GE(e->token, last_a) << describe(*e);
        a_held = false;
      } else {
        ASSERT_TRUE(gap) << "a snapshot before any gap: " << describe(*e);
        a_held = e->held;
      }
      last_a = e->token;
    }
  }
  EXPECT_TRUE(gap) << "40 events against a bound of 8 and no gap";
  ASSERT_TRUE(h_event);
  EXPECT_TRUE(h_event->kind == WatchEventKind::state || h_event->kind == WatchEventKind::acquired)
      << describe(*h_event);
  EXPECT_TRUE(h_event->held);
  EXPECT_EQ(h_event->token, h.token());
}

// Nobody watching: the lock scripts publish nothing on the events channel (one PUBLISH
// per release stays: the "<lock>:released" wake-up of main's release); a registered watch
// turns the events on (two more per acquire + release); when it ends and its
// watcher-presence key is gone, they stop again. Counted on the server (INFO commandstats,
// which counts a script's calls too).
TEST(RedisPrefixWatch, ScriptsPublishEventsOnlyWhileAWatchIsRegistered) {
  RedisServer server;
  Client c = distlock::connect(server.url());
  constexpr int kCycles = 50;
  auto cycles = [&c] {
    for (int i = 0; i < kCycles; ++i) c.acquire("pub/x", ttl_of(30s, 60s)).release();
  };
  const long long start = server.command_calls("publish");
  cycles();
  const long long unwatched = server.command_calls("publish") - start;
  EXPECT_EQ(unwatched, kCycles) << "nobody watches: one wake-up per release and no events";
  {
    Watch w = c.watch("pub/");
    const long long before = server.command_calls("publish");
    cycles();
    // Every event arrives (the count below is not a guess): 50 acquired + 50 released.
    int seen = 0;
    while (seen < 2 * kCycles) {
      auto e = next_change(w, 10s);
      ASSERT_TRUE(e) << "after " << seen << " events";
      ++seen;
    }
    EXPECT_EQ(server.command_calls("publish") - before, 3 * kCycles)
        << "watched: acquired + released + wake-up";
  }
  // The watch is gone; its presence key lives on until its PX runs out. Deleting it stands
  // for that expiry (30 s): the events stop.
  server.command({"DEL", "distlock:watching"});
  const long long after_watch = server.command_calls("publish");
  cycles();
  EXPECT_EQ(server.command_calls("publish") - after_watch, kCycles);
}

// The watcher-presence key lapses (deleted here: an eviction, or a watch that stalled past
// the key's 30 s life): the scripts publish nothing meanwhile, and the watch reports it as a
// gap at its next renewal (every 5 s), then the re-listed state shows the lock taken while
// nothing was published. Bound: 5 s renewal + a round trip; 15 s allowed on a loaded machine,
// measured on the steady clock from the deletion.
TEST(RedisPrefixWatch, PresenceKeyLapseIsAGapThenTheState) {
  RedisServer server;
  Client c = distlock::connect(server.url());
  Watch w = c.watch("lapse/");
  ASSERT_EQ(server.command({"EXISTS", "distlock:watching"})->integer, 1);
  server.command({"DEL", "distlock:watching"});
  const auto deleted_at = Clock::now();
  Lease b = c.acquire("lapse/b", ttl_of(60s, 60s));  // published to nobody
  bool gap = false;
  std::optional<WatchEvent> state;
  const auto end = Clock::now() + 15s;
  while (!state && Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    if (!e) break;
    if (e->kind == WatchEventKind::gap) {
      EXPECT_NE(e->detail.find("watcher-presence"), std::string::npos) << e->detail;
      gap = true;
    } else if (e->kind == WatchEventKind::state) {
      state = e;
    } else {
      ADD_FAILURE() << "an event of a change made while nothing was published: " << describe(*e);
    }
  }
  ASSERT_TRUE(gap) << "the lapse was not reported";
  ASSERT_TRUE(state) << "no re-list after the gap";
  EXPECT_LT(Clock::now() - deleted_at, 15s);
  EXPECT_EQ(state->name, "lapse/b");
  EXPECT_TRUE(state->held);
  EXPECT_EQ(state->token, b.token());
  EXPECT_EQ(server.command({"EXISTS", "distlock:watching"})->integer, 1) << "the watch registered again";
  // Live again.
  ASSERT_NO_FATAL_FAILURE(expect_release_reported(w, b));
}

// A revoke ends the holder's lease on the server: the watch reports `revoked` with the
// token of that lease, and the holder's refused renewal adds no `lost` after it.
TEST(RedisPrefixWatch, RevokeShowsAsRevoked) {
  RedisServer server;
  Client holder = distlock::connect(server.url());
  Client admin = distlock::connect(server.url());
  Watch w = admin.watch("rv/");
  // The holder finds out at its next renewal (within the 2 s ttl); nothing more is reported
  // of that lease.
  ASSERT_NO_FATAL_FAILURE(expect_revoke_then_nothing(w, holder, admin, "rv/x", 3s));
}

// The header's example, as written there (thread-safety: stop() from another thread ends
// a blocked next()).
TEST(RedisPrefixWatch, StopFromAnotherThreadEndsNext) {
  RedisServer server;
  Client client = distlock::connect(server.url());
  Watch w = client.watch("orders/");
  ASSERT_NO_FATAL_FAILURE(expect_stop_from_another_thread_ends_next(w));
}

}  // namespace
}  // namespace distlock::testing
