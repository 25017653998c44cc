// Client::watch on redis+sentinel:// (src/redis/sentinel_watch.cpp): the redis:// watch
// run on the current master of a real Sentinel group (1 master, 2 replicas, 3
// sentinels, tests/support/redis_sentinel.hpp) and moved to each new master — hand-offs
// in token order, a failover in the middle as a gap then the new master's state (a lock
// whose write never reached the promoted replica shows free, one whose release it lost
// shows with its older token), live events from the new master after it, a manual
// failover, a promoted replica that refuses the watch at first, a killed holder as a
// loss, a stop from another thread.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_sentinel.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Whether every replica has the lock key of each name (polled up to 10 s): the locks
// then survive a failover. Not wait=N: its renewals would fail (and lose the lease) while
// replication is stalled or a failover re-points the replicas.
bool on_every_replica(RedisSentinelGroup& g, const std::vector<std::string>& names) {
  const auto master = g.master_port();
  return distlock::testing::eventually(
      [&] {
        for (std::size_t i = 0; i < g.nodes(); ++i) {
          if (g.node(i).port() == master) continue;
          for (const auto& n : names) {
            auto r = g.node(i).command({"EXISTS", "distlock:{" + n + "}"});
            if (!r || r->type != REDIS_REPLY_INTEGER || r->integer != 1) return false;
          }
        }
        return true;
      },
      10000ms);
}

// One group for the tests that do not fail it over, when the binary runs them together
// (a group takes seconds to start; ctest runs each test in a process of its own).
class SentinelPrefixWatch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { group_ = std::make_unique<RedisSentinelGroup>(); }
  static void TearDownTestSuite() { group_.reset(); }
  static RedisSentinelGroup& group() { return *group_; }

 private:
  static inline std::unique_ptr<RedisSentinelGroup> group_;
};

// 1,000 hand-offs (issue 32 §3) of one name between two clients: each `acquired` has a token above the
// last and is followed by the release of exactly that token; no gap, nothing missing.
TEST_F(SentinelPrefixWatch, HandOffsComeInTokenOrder) {
  Client watcher = distlock::connect(group().url(), quiet());
  Watch w = watcher.watch("ho/");
  ASSERT_NO_FATAL_FAILURE(expect_hand_offs_in_token_order(w, group().url(), "ho/x", 1000, 30s));
}

// A holder process SIGKILLed: its lease expires unpublished, and the watcher's re-read
// on the current master reports it lost (inferred) within TTL + 5 s (+ slack).
TEST_F(SentinelPrefixWatch, KilledHolderShowsAsLost) {
  Client watcher = distlock::connect(group().url(), quiet());
  Watch w = watcher.watch("kill/");
  KilledHolder k;
  ASSERT_NO_FATAL_FAILURE(expect_killed_holder_lost(w, group().url(), "kill/x", 1000, k));
  const WatchEvent& lost = k.lost;
  EXPECT_TRUE(lost.inferred);
  // TTL 1 s + at most 5 s to the next re-read + slack for a loaded machine.
  EXPECT_LT(k.after_kill, 10s);
}

TEST_F(SentinelPrefixWatch, StopFromAnotherThreadEndsNext) {
  Client client = distlock::connect(group().url(), quiet());
  Watch w = client.watch("orders/");
  ASSERT_NO_FATAL_FAILURE(expect_stop_from_another_thread_ends_next(w));
  EXPECT_FALSE(w.next(0ms));
}

// A failover in the middle of a watch. "fo/kept" and "fo/back" are taken and reach both
// replicas; then replication is stalled, "fo/lost" is taken
// on the master alone, and "fo/back" is released and taken again by another client
// (token T2 > T1) on the master alone; the master is SIGKILLed. The watch shows those
// changes; a gap naming the move to the promoted replica; the new master's state:
// fo/kept held with its token, fo/lost free (the new master never had it), and fo/back
// held with T1 — an older token than the last one reported, which the watch reports
// rather than drops as stale (the new master lost the release and T2); then live events
// from the new master (fo/lost taken by another client, fo/kept released).
TEST(SentinelPrefixWatchFailover, FailoverIsAGapThenTheNewMastersState) {
  RedisSentinelGroup group;
  Client watcher = distlock::connect(group.url(), quiet());
  Client keeper = distlock::connect(group.url(), quiet());
  Client loser = distlock::connect(group.url(), quiet());
  Client other = distlock::connect(group.url(), quiet());
  Watch w = watcher.watch("fo/");

  Lease kept = keeper.acquire("fo/kept", ttl_of(30s));
  Lease back1 = keeper.acquire("fo/back", ttl_of(30s));
  const std::uint64_t kept_token = kept.token(), back1_token = back1.token();
  ASSERT_TRUE(on_every_replica(group, {"fo/kept", "fo/back"}));
  group.stall_replication();
  Lease lost = loser.acquire("fo/lost", ttl_of(30s));
  back1.release();
  Lease back2 = loser.acquire("fo/back", ttl_of(30s));
  const std::uint64_t lost_token = lost.token(), back2_token = back2.token();
  ASSERT_GT(back2_token, back1_token);
  std::vector<std::string> seen;
  while (seen.size() < 5) {
    auto e = next_change(w, 10s);
    ASSERT_TRUE(e) << "only " << seen.size() << " changes before the failover";
    seen.push_back(describe(*e));
  }
  const std::vector<std::string> expected = {
      "acquired fo/kept token=" + std::to_string(kept_token) + " held=1 ",
      "acquired fo/back token=" + std::to_string(back1_token) + " held=1 ",
      "acquired fo/lost token=" + std::to_string(lost_token) + " held=1 ",
      "released fo/back token=" + std::to_string(back1_token) + " held=0 ",
      "acquired fo/back token=" + std::to_string(back2_token) + " held=1 "};
  ASSERT_EQ(seen, expected);

  const auto old_port = group.kill_master();
  const auto killed_at = Clock::now();
  const auto killed_wall = std::chrono::system_clock::now();  // to compare with WatchEvent::at
  const auto new_port = group.wait_failover(old_port, 30s);
  const auto failover_ms = std::chrono::duration_cast<Millis>(Clock::now() - killed_at).count();
  const std::string moved = "to 127.0.0.1:" + std::to_string(new_port);

  // Until the gap of the move, only gaps (the old master's channel broke) may come.
  bool saw_move = false;
  long long moved_ms = 0;  // from the kill to the watcher's receipt of the gap (system clock)
  const auto end = Clock::now() + 20s;
  while (!saw_move && Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    ASSERT_TRUE(e) << "no gap for the move to port " << new_port;
    if (e->kind == WatchEventKind::gap) {
      saw_move = e->detail.find(moved) != std::string::npos;
      if (saw_move) moved_ms = std::chrono::duration_cast<Millis>(e->at - killed_wall).count();
      continue;
    }
    // A re-list after the break may read the new master already (a call switched it).
    ASSERT_EQ(e->kind, WatchEventKind::state) << describe(*e);
  }
  ASSERT_TRUE(saw_move) << "no gap naming the move to port " << new_port;

  // The new master's state, as the re-list after the gap reads it.
  std::optional<WatchEvent> kept_state, lost_state, back_state;
  const auto end2 = Clock::now() + 20s;
  while ((!kept_state || !lost_state || !back_state) && Clock::now() < end2) {
    auto e = w.next(std::chrono::ceil<Millis>(end2 - Clock::now()));
    ASSERT_TRUE(e) << "no state after the gap";
    // fo/lost is free on the new master: a `state` says so, or an inferred `lost` when the
    // watcher's expiry re-read found it first (its change then wins over the listing).
    // T2 of fo/back may be reported lost the same way before the state of T1.
    const bool inferred_loss = e->kind == WatchEventKind::lost && e->inferred;
    ASSERT_TRUE(e->kind == WatchEventKind::state || inferred_loss) << describe(*e);
    if (e->name == "fo/kept") kept_state = e;
    if (e->name == "fo/lost") lost_state = e;
    if (e->name == "fo/back" && e->kind == WatchEventKind::state) back_state = e;
  }
  ASSERT_TRUE(kept_state && lost_state && back_state)
      << "kept " << !!kept_state << ", lost " << !!lost_state << ", back " << !!back_state;
  EXPECT_TRUE(back_state->held);
  EXPECT_EQ(back_state->token, back1_token) << "the new master's state of fo/back: " << describe(*back_state);
  EXPECT_TRUE(kept_state->held);
  EXPECT_EQ(kept_state->token, kept_token);
  EXPECT_FALSE(lost_state->held) << "the new master never had fo/lost: " << describe(*lost_state);

  // Live events from the new master.
  Lease taken = other.acquire("fo/lost", ttl_of(30s, 30000ms));
  const std::uint64_t taken_token = taken.token();
  kept.release();
  std::optional<WatchEvent> taken_ev, released_ev;
  const auto end3 = Clock::now() + 20s;
  while ((!taken_ev || !released_ev) && Clock::now() < end3) {
    auto e = next_change(w, std::chrono::ceil<Millis>(end3 - Clock::now()));
    ASSERT_TRUE(e) << "no live event from the new master";
    if (e->kind == WatchEventKind::acquired && e->name == "fo/lost") {
      taken_ev = e;
    } else if (e->kind == WatchEventKind::released && e->name == "fo/kept") {
      released_ev = e;
    } else if (e->kind != WatchEventKind::gap && e->kind != WatchEventKind::state) {
      FAIL() << "unexpected event: " << describe(*e);
    }
  }
  ASSERT_TRUE(taken_ev && released_ev);
  EXPECT_EQ(taken_ev->token, taken_token);
  EXPECT_GT(taken_token, lost_token);
  EXPECT_EQ(released_ev->token, kept_token);
  std::printf(
      "failover: master %u -> %u; every sentinel named the new master %lld ms after the kill (as polled); "
      "the watch received the gap naming the move %lld ms after the kill\n",
      old_port, new_port, static_cast<long long>(failover_ms), moved_ms);
  RecordProperty("failover_ms", static_cast<int>(failover_ms));
  RecordProperty("move_gap_after_kill_ms", static_cast<int>(moved_ms));
}

}  // namespace

// A manual failover (SENTINEL FAILOVER): the old master stays up and turns replica, so
// the watch's old subscription stays connected (a replica passes on the new master's
// messages). The watch still moves: a gap naming the new master, the state read there
// (the lease, on both replicas before the failover, survives with its token), then each live change exactly
// once (nothing from the old subscription is passed on twice).
TEST(SentinelPrefixWatchFailover, ManualFailoverMovesTheWatchToTheNewMaster) {
  RedisSentinelGroup group;
  Client watcher = distlock::connect(group.url(), quiet());
  Client keeper = distlock::connect(group.url(), quiet());
  Client other = distlock::connect(group.url(), quiet());
  Watch w = watcher.watch("mf/");
  Lease kept = keeper.acquire("mf/a", ttl_of(30s));
  const std::uint64_t kept_token = kept.token();
  ASSERT_TRUE(on_every_replica(group, {"mf/a"}));
  auto first = next_change(w, 10s);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->kind, WatchEventKind::acquired) << describe(*first);
  ASSERT_EQ(first->token, kept_token);

  const auto old_port = group.master_port();
  auto r = group.sentinel_command(0, {"SENTINEL", "FAILOVER", "mymaster"});
  ASSERT_TRUE(r && r->type == REDIS_REPLY_STATUS) << (r ? std::string(r->str, r->len) : "no reply");
  const auto new_port = group.wait_failover(old_port, 30s);
  const std::string moved = "to 127.0.0.1:" + std::to_string(new_port);

  bool saw_move = false;
  std::optional<WatchEvent> state;
  const auto end = Clock::now() + 20s;
  while (!state && Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    ASSERT_TRUE(e) << (saw_move ? "no state after the gap" : "no gap naming the move to the new master");
    if (e->kind == WatchEventKind::gap) {
      saw_move = saw_move || e->detail.find(moved) != std::string::npos;
      continue;
    }
    ASSERT_EQ(e->kind, WatchEventKind::state) << describe(*e);
    if (saw_move && e->name == "mf/a") state = e;
  }
  ASSERT_TRUE(saw_move);
  ASSERT_TRUE(state);
  EXPECT_TRUE(state->held);
  EXPECT_EQ(state->token, kept_token);

  // The live changes below must reach the new master: a release landing on the old one,
  // still writable until the sentinels demote it, would be lost with the failover (and
  // rightly reported as an expiry 30 s later; seen once in CI).
  ASSERT_TRUE(group.wait_demoted(old_port, 30s)) << "the old master " << old_port << " was not demoted";

  kept.release();
  Lease next = other.acquire("mf/a", ttl_of(30s, 30000ms));
  const std::uint64_t next_token = next.token();
  next.release();
  std::vector<WatchEvent> changes;
  const auto end2 = Clock::now() + 20s;
  while (changes.size() < 3 && Clock::now() < end2) {
    auto e = next_change(w, std::chrono::ceil<Millis>(end2 - Clock::now()));
    ASSERT_TRUE(e) << "after " << changes.size() << " live events, no more";
    if (e->kind == WatchEventKind::gap) continue;  // the old master's connection, if it broke late
    changes.push_back(*e);
  }
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].kind, WatchEventKind::released) << describe(changes[0]);
  EXPECT_EQ(changes[0].token, kept_token);
  EXPECT_EQ(changes[1].kind, WatchEventKind::acquired) << describe(changes[1]);
  EXPECT_EQ(changes[1].token, next_token);
  EXPECT_EQ(changes[2].kind, WatchEventKind::released) << describe(changes[2]);
  EXPECT_EQ(changes[2].token, next_token);
  auto extra = next_change(w, 500ms);  // a duplicate would follow at once
  EXPECT_FALSE(extra && extra->kind != WatchEventKind::gap) << describe(*extra);
}

// A new master that refuses the watch at first: the replicas' default user may use only
// the sentinels' channels (ACL), so the switch cannot subscribe there. The failover gap
// says the new master cannot be watched yet; once the channel is allowed, the monitor's
// retry (every second) starts the watch, reports another gap, the state is read again and
// live events come from the new master.
TEST(SentinelPrefixWatchFailover, ANewMasterThatRefusesTheWatchIsRetried) {
  RedisSentinelGroup group;
  Client watcher = distlock::connect(group.url(), quiet());
  Client holder = distlock::connect(group.url(), quiet());
  Watch w = watcher.watch("nw/");
  Lease lease = holder.acquire("nw/a", ttl_of(30s));
  const std::uint64_t token = lease.token();
  auto first = next_change(w, 10s);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->kind, WatchEventKind::acquired) << describe(*first);
  ASSERT_TRUE(on_every_replica(group, {"nw/a"}));
  const auto old_port = group.master_port();
  for (std::size_t i = 0; i < group.nodes(); ++i) {
    if (group.node(i).port() == old_port) continue;
    auto r = group.node(i).command({"ACL", "SETUSER", "default", "resetchannels", "&__sentinel__:*"});
    ASSERT_TRUE(r && r->type == REDIS_REPLY_STATUS) << (r ? std::string(r->str, r->len) : "no reply");
  }
  group.kill_master();
  const auto new_port = group.wait_failover(old_port, 30s);

  // The gap of the move, saying the new master cannot be watched yet.
  bool refused = false;
  const auto end = Clock::now() + 20s;
  while (!refused && Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    ASSERT_TRUE(e) << "no gap for the move to port " << new_port;
    if (e->kind == WatchEventKind::gap)
      refused = e->detail.find("cannot be watched yet") != std::string::npos &&
                e->detail.find(std::to_string(new_port)) != std::string::npos;
  }
  ASSERT_TRUE(refused) << "no gap saying the new master cannot be watched";

  auto r = group.node_at_port(new_port).command({"ACL", "SETUSER", "default", "allchannels"});
  ASSERT_TRUE(r && r->type == REDIS_REPLY_STATUS) << (r ? std::string(r->str, r->len) : "no reply");
  bool late = false;
  std::optional<WatchEvent> state;
  const auto end2 = Clock::now() + 20s;
  while (!(late && state) && Clock::now() < end2) {
    auto e = w.next(std::chrono::ceil<Millis>(end2 - Clock::now()));
    ASSERT_TRUE(e) << (late ? "no state after the retry's gap" : "the watch never started on the new master");
    if (e->kind == WatchEventKind::gap) {
      late = late || e->detail.find("started late") != std::string::npos;
    } else if (late && e->kind == WatchEventKind::state && e->name == "nw/a") {
      state = e;
    }
  }
  ASSERT_TRUE(late && state);
  EXPECT_TRUE(state->held);
  EXPECT_EQ(state->token, token);

  lease.release();
  std::optional<WatchEvent> released;
  const auto end3 = Clock::now() + 10s;
  while (!released && Clock::now() < end3) {
    auto e = next_change(w, std::chrono::ceil<Millis>(end3 - Clock::now()));
    ASSERT_TRUE(e) << "no release seen on the new master";
    if (e->kind == WatchEventKind::gap) continue;
    released = e;
  }
  ASSERT_TRUE(released);
  EXPECT_EQ(released->kind, WatchEventKind::released) << describe(*released);
  EXPECT_EQ(released->token, token);
}

}  // namespace distlock::testing
