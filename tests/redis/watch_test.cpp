// Client::watch on redis:// (distlock/watch.hpp, src/redis/redis_watch.cpp): the event
// stream of a prefix against a real redis-server each test starts — hand-offs in token
// order, a server restart as a gap followed by a re-list, a killed holder as a loss.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::Client;
using distlock::Lease;
using distlock::LockOptions;
using distlock::Millis;
using distlock::Watch;
using distlock::WatchEvent;
using distlock::WatchEventKind;
using distlock::testing::RedisServer;
using Clock = std::chrono::steady_clock;

LockOptions opts_ttl(Millis ttl) {
  LockOptions o;
  o.ttl = ttl;
  o.wait = Millis(60000);
  return o;
}

// The next event that is not a `state`, waiting up to `limit` (measured on the steady clock).
std::optional<WatchEvent> next_change(Watch& w, Millis limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    if (!e) return std::nullopt;
    if (e->kind != WatchEventKind::state) return e;
  }
  return std::nullopt;
}

std::string describe(const WatchEvent& e) {
  return std::string(distlock::to_string(e.kind)) + " " + e.name + " token=" + std::to_string(e.token) + " " +
         e.detail;
}

// 1,000 hand-offs of one name between two clients: every `acquired` carries a token
// above the last and is followed by the release of exactly that token before the next
// `acquired`; nothing is missing, nothing is a gap.
TEST(RedisPrefixWatch, ThousandHandOffsComeInTokenOrder) {
  RedisServer server;
  Client watcher = distlock::connect(server.url());
  Watch w = watcher.watch("ho/");
  constexpr int kHandOffs = 1000;
  std::atomic<int> taken{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&server, &taken] {
      Client client = distlock::connect(server.url());
      while (taken.load() < kHandOffs) {
        Lease l = client.acquire("ho/x", opts_ttl(10s));
        if (taken.fetch_add(1) >= kHandOffs) break;  // released as it leaves
      }
    });
  }
  for (auto& t : threads) t.join();
  const int acquisitions = taken.load();  // kHandOffs, plus at most one per thread that stopped

  std::uint64_t last_token = 0;
  bool held = false;
  int acquired = 0, released = 0;
  std::set<std::string> holders;  // client ids
  const auto end = Clock::now() + 60s;
  while ((acquired < acquisitions || held) && Clock::now() < end) {
    auto e = next_change(w, 10s);
    ASSERT_TRUE(e) << "no event after " << acquired << " acquisitions and " << released << " releases";
    ASSERT_EQ(e->name, "ho/x");
    switch (e->kind) {
      case WatchEventKind::acquired:
        ASSERT_FALSE(held) << "acquired token " << e->token << " before the end of " << last_token;
        ASSERT_GT(e->token, last_token);
        last_token = e->token;
        held = true;
        ++acquired;
        holders.insert(e->holder.substr(0, e->holder.find(':')));
        break;
      case WatchEventKind::released:
        ASSERT_TRUE(held) << describe(*e);
        ASSERT_EQ(e->token, last_token);
        held = false;
        ++released;
        break;
      default: FAIL() << "unexpected event: " << describe(*e);
    }
  }
  EXPECT_EQ(acquired, acquisitions);
  EXPECT_EQ(released, acquisitions);
  EXPECT_GE(acquired, kHandOffs);
  EXPECT_EQ(holders.size(), 2u) << "both clients took the lock";
  EXPECT_FALSE(w.next(0ms)) << "an event after the last release";
}

// The server stops and comes back (appendonly: the held lock survives): the watch
// reports a gap, then the held lock as a `state` with its token, and live events after.
TEST(RedisPrefixWatch, RestartIsAGapFollowedByTheHeldState) {
  RedisServer server({.appendonly = true});
  Client holder = distlock::connect(server.url());
  Client watcher = distlock::connect(server.url());
  Watch w = watcher.watch("gap/");
  Lease a = holder.acquire("gap/a", opts_ttl(60s));
  auto first = next_change(w, 10s);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->kind, WatchEventKind::acquired) << describe(*first);
  EXPECT_EQ(first->token, a.token());

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
  {
    Lease b = holder.acquire("gap/b", opts_ttl(60s));
    std::optional<WatchEvent> e;
    do {
      e = next_change(w, 10s);
    } while (e && e->kind == WatchEventKind::gap);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind, WatchEventKind::acquired) << describe(*e);
    EXPECT_EQ(e->name, "gap/b");
    EXPECT_EQ(e->token, b.token());
  }
  auto rel = next_change(w, 10s);
  ASSERT_TRUE(rel);
  EXPECT_EQ(rel->kind, WatchEventKind::released) << describe(*rel);
  EXPECT_EQ(rel->name, "gap/b");
}

// A holder killed with SIGKILL: its lease expires on the server, which publishes
// nothing; the watch reports it as an inferred `lost` within the TTL plus the re-check
// bound (1 s after the acquire, then the remaining TTL, at most 5 s).
TEST(RedisPrefixWatch, KilledHolderShowsAsLost) {
  RedisServer server;
  Client watcher = distlock::connect(server.url());
  Watch w = watcher.watch("kill/");
  distlock::testing::TempDir dir("distlock-watch");
  const std::string out = (dir.path() / "holder.out").string();
  distlock::testing::Process holder = distlock::testing::spawn_holder(server.url(), "kill/x", out, 1000);
  auto acq = next_change(w, 20s);
  ASSERT_TRUE(acq) << distlock::testing::read_file(out);
  ASSERT_EQ(acq->kind, WatchEventKind::acquired) << describe(*acq);
  const auto killed_at = Clock::now();
  holder.signal(SIGKILL);
  auto lost = next_change(w, 15s);
  ASSERT_TRUE(lost) << "no loss reported";
  EXPECT_EQ(lost->kind, WatchEventKind::lost) << describe(*lost);
  EXPECT_EQ(lost->name, "kill/x");
  EXPECT_EQ(lost->token, acq->token);
  EXPECT_TRUE(lost->inferred);
  // TTL 1 s + at most 5 s to the next check + slack for a loaded machine.
  EXPECT_LT(Clock::now() - killed_at, 10s);
}

// A Watch taken before locks exist sees nothing of other prefixes, and the initial
// state lists what was held before it started.
TEST(RedisPrefixWatch, InitialStateAndPrefixFilter) {
  RedisServer server;
  Client c = distlock::connect(server.url());
  Lease held = c.acquire("pre/held", opts_ttl(30s));
  Lease other = c.acquire("other/x", opts_ttl(30s));
  Watch w = c.watch("pre/");
  auto s = w.next(10s);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, WatchEventKind::state);
  EXPECT_EQ(s->name, "pre/held");
  EXPECT_TRUE(s->held);
  EXPECT_EQ(s->token, held.token());
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
  constexpr int kCycles = 20;  // 40 events: 32 beyond the bound
  for (int i = 0; i < kCycles; ++i) c.acquire("q/a", opts_ttl(30s)).release();
  Lease h = c.acquire("q/h", opts_ttl(30s));  // after the overflow: not queued either
  std::vector<WatchEvent> got;
  for (int i = 0; i < 8; ++i) {
    auto e = w.next(10s);
    ASSERT_TRUE(e) << "only " << i << " of the 8 queued events";
    EXPECT_EQ(e->name, "q/a");
    got.push_back(*e);
  }
  auto gap = w.next(10s);
  ASSERT_TRUE(gap);
  ASSERT_EQ(gap->kind, WatchEventKind::gap) << describe(*gap);
  EXPECT_NE(gap->detail.find("fell behind"), std::string::npos) << gap->detail;
  std::map<std::string, WatchEvent> states;
  while (states.size() < 1) {
    auto e = w.next(10s);
    ASSERT_TRUE(e) << "no state after the gap";
    ASSERT_EQ(e->kind, WatchEventKind::state) << describe(*e);
    states.emplace(e->name, *e);
  }
  ASSERT_TRUE(states.count("q/h")) << describe(states.begin()->second);
  EXPECT_TRUE(states.at("q/h").held);
  EXPECT_EQ(states.at("q/h").token, h.token());
  // The last queued event was a release (8 events: 4 cycles), so q/a was seen free and
  // needs no state line; nothing else is pending.
  EXPECT_EQ(got.back().kind, WatchEventKind::released);
  if (auto extra = w.next(0ms)) ADD_FAILURE() << "pending: " << describe(*extra);
}

// The header's example, as written there (thread-safety: stop() from another thread ends
// a blocked next()).
TEST(RedisPrefixWatch, StopFromAnotherThreadEndsNext) {
  RedisServer server;
  Client client = distlock::connect(server.url());
  Watch w = client.watch("orders/");
  std::thread stopper([&w] {
    std::this_thread::yield();
    w.stop();
  });
  const auto start = Clock::now();
  while (auto ev = w.next(std::chrono::seconds(30))) {
    ADD_FAILURE() << "unexpected event " << describe(*ev);
  }
  stopper.join();
  EXPECT_LT(Clock::now() - start, 10s);
}

}  // namespace
