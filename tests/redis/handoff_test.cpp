// redis:// direct hand-off: waiters queue on the server, a release grants the lock
// to the first live waiter inside the release script and notifies only that
// waiter's client (docs/redis.md, model/redis_handoff.pml). Each test starts its
// own redis-server.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "redis/key_layout.hpp"
#include "redis/lock_scripts.hpp"
#include "redis/redis_backend.hpp"
#include "support/client_options.hpp"
#include "support/dead_waiter.hpp"
#include "support/eventually.hpp"
#include "support/lock_hammer.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_probes.hpp"
#include "support/redis_server.hpp"
#include "support/timed_acquire.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

distlock::detail::RedisStats stats_of(const Client& c) {
  auto st = distlock::detail::redis_stats(distlock::detail::engine_of(c)->backend());
  EXPECT_TRUE(st.has_value());
  return st.value_or(distlock::detail::RedisStats{});
}

// A redis-server, a client holding `name` (TTL 10 s) and `n` more clients, which
// queue_in_order() sets waiting for `name` behind it, one thread each.
struct WaitersBehindAHolder {
  RedisServer server;
  std::string name;
  Client holder_client = distlock::connect(server.url());
  Lease holder;
  std::vector<Client> clients;
  std::vector<std::thread> threads;

  WaitersBehindAHolder(std::string held, int n)
      : name(std::move(held)),
        holder(holder_client.acquire(name, ttl_of(10s))),
        clients(connect_clients(server.url(), n)) {}

  // Starts client i's wait (TTL 10 s, up to 60 s) in its own thread, each once the one before
  // is queued on the server; a waiter runs `granted(i)` holding the name, then releases it.
  template <class Granted>
  void queue_in_order(Granted granted) {
    for (int i = 0; i < static_cast<int>(clients.size()); ++i) {
      threads.emplace_back([this, i, granted] {
        distlock::detail::Error ec;
        Lease l = clients[i].acquire(name, ttl_of(10s, 60s), ec);
        ASSERT_FALSE(ec) << ec.message();
        granted(i);
      });
      ASSERT_TRUE(
          eventually([&] { return waiters_of(holder_client, name) == static_cast<unsigned>(i + 1); }, 10s))
          << "waiters: " << waiters_of(holder_client, name);
    }
  }

  void join() {
    for (auto& t : threads) t.join();
  }
};

TEST(RedisHandOff, WaitersAreGrantedInArrivalOrder) {
  constexpr int kWaiters = 6;
  WaitersBehindAHolder q("fifo", kWaiters);
  std::mutex mu;
  std::vector<int> order;
  ASSERT_NO_FATAL_FAILURE(q.queue_in_order([&](int i) {
    std::lock_guard lk(mu);
    order.push_back(i);
  }));
  q.holder.release();
  q.join();
  std::vector<int> expected(kWaiters);
  for (int i = 0; i < kWaiters; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
  EXPECT_EQ(waiters_of(q.holder_client, "fifo"), 0u);
}

// The herd check. Before the hand-off every release published on the name's
// channel and woke every waiting client, each of which retried. Now a release with
// waiters publishes one grant, to the first waiter's client, and nothing else.
TEST(RedisHandOff, OneReleaseWakesExactlyOneClient) {
  constexpr int kWaiters = 16;
  WaitersBehindAHolder q("herd", kWaiters);
  std::atomic<int> acquired{0};
  std::atomic<bool> let_go{false};
  // Each holder hands on at once, except the last, which holds until the counts are checked
  // (its release finds nobody queued and publishes "released").
  ASSERT_NO_FATAL_FAILURE(q.queue_in_order([&](int) {
    if (++acquired == kWaiters) {
      while (!let_go) std::this_thread::sleep_for(5ms);
    }
  }));
  auto total = [&](auto field) {
    std::uint64_t n = 0;
    for (auto& c : q.clients) n += stats_of(c).*field;
    return n;
  };
  using S = distlock::detail::RedisStats;
  ASSERT_EQ(total(&S::grants_received), 0u);
  q.holder.release();
  ASSERT_TRUE(eventually([&] { return acquired.load() == kWaiters; }, 60s)) << acquired.load();
  // 16 releases (the first holder's and 15 waiters'), each with someone queued:
  // exactly one grant each, one per client, and no release message to anyone.
  EXPECT_EQ(total(&S::grants_received), static_cast<std::uint64_t>(kWaiters));
  for (int i = 0; i < kWaiters; ++i) EXPECT_EQ(stats_of(q.clients[i]).grants_received, 1u) << "client " << i;
  EXPECT_EQ(total(&S::release_messages), 0u) << "a release with waiters must not wake the others";
  EXPECT_EQ(waiters_of(q.holder_client, "herd"), 0u);
  let_go = true;
  q.join();
  for (auto& c : q.clients) EXPECT_EQ(stats_of(c).queued_waits, 0u);
}

// A waiter that gives up leaves the queue at once (status counts live entries,
// not idle subscriptions), and a grant that raced the give-up is handed on.
TEST(RedisHandOff, GivingUpLeavesTheQueueAndARacingGrantIsHandedOn) {
  RedisServer server;
  Client holder_client = distlock::connect(server.url());
  Client x = distlock::connect(server.url());
  Client y = distlock::connect(server.url());
  {
    Lease holder = holder_client.acquire("give-up", ttl_of(10s));
    distlock::detail::Error ec;
    x.acquire("give-up", ttl_of(10s, 300ms), ec);
    EXPECT_EQ(ec, distlock::errc::timeout);
    EXPECT_EQ(waiters_of(holder_client, "give-up"), 0u) << "the timed-out waiter is still counted";
    EXPECT_EQ(stats_of(x).queued_waits, 0u);
  }
  // The race, made deterministic on the backend: X queues, the holder's release
  // grants the lock to X's entry, and only then does X give up.
  Lease holder = holder_client.acquire("race", ttl_of(10s));
  auto& backend = distlock::detail::engine_of(x)->backend();
  const std::string owner = "0123456789abcdef0123456789abcdef:7";
  distlock::detail::AcquireRequest req{"race", owner, Millis(10000), true};
  distlock::detail::Error ec;
  ASSERT_FALSE(backend.try_acquire(req, ec).acquired);
  ASSERT_FALSE(ec) << ec.message();
  TimedAcquire yt(y, "race", ttl_of(10s, 30s));
  ASSERT_TRUE(eventually([&] { return waiters_of(holder_client, "race") == 2u; }, 10s));
  holder.release();
  ASSERT_TRUE(eventually([&] { return holder_client.status("race").holder.value_or("") == owner; }, 10s))
      << "the lock was not granted to the first waiter";
  EXPECT_FALSE(yt.got());
  backend.cancel_acquire("race", owner);
  const auto given_up = Clock::now();
  yt.join();
  EXPECT_TRUE(yt.got());
  // Handed on by the give-up itself, not after X's 10 s grant ran out.
  EXPECT_LT(std::chrono::duration_cast<Millis>(Clock::now() - given_up), 5000ms);
}

// A killed waiter's entry is no longer refreshed: once it expired, a release skips
// it. A paused waiter's entry expires the same way; on resume its refresh finds the
// entry gone and it queues again, behind the others.
TEST(RedisHandOff, KilledAndPausedWaitersAreSkipped) {
  using distlock::testing::spawn_holder;
  distlock::testing::TempDir dir("distlock-handoff");
  RedisServer server;
  Client holder_client = distlock::connect(server.url());
  Lease holder = holder_client.acquire("skip", ttl_of(30s));
  const std::string killed_out = (dir.path() / "killed.out").string();
  const std::string paused_out = (dir.path() / "paused.out").string();
  // Waiter TTL 1 s: a dead entry expires 1 s after its last refresh.
  auto killed = spawn_holder(server.url(), "skip", killed_out, 1000, 100, {"--wait", "60000"});
  ASSERT_TRUE(eventually([&] { return waiters_of(holder_client, "skip") == 1u; }, 10s));
  auto paused = spawn_holder(server.url(), "skip", paused_out, 1000, 100, {"--wait", "60000"});
  ASSERT_TRUE(eventually([&] { return waiters_of(holder_client, "skip") == 2u; }, 10s));
  Client live = distlock::connect(server.url());
  TimedAcquire lt(live, "skip", ttl_of(10s, 60s));
  ASSERT_TRUE(eventually([&] { return waiters_of(holder_client, "skip") == 3u; }, 10s));
  killed.signal(SIGKILL);
  paused.signal(SIGSTOP);
  // Both entries expire (status counts live entries only).
  ASSERT_TRUE(eventually([&] { return waiters_of(holder_client, "skip") == 1u; }, 10s))
      << waiters_of(holder_client, "skip");
  const auto released_at = Clock::now();
  holder.release();
  lt.join();
  ASSERT_TRUE(lt.got());
  EXPECT_LT(std::chrono::duration_cast<Millis>(lt.got_at() - released_at), 2000ms)
      << "the live waiter waited for a dead one's grant to run out";
  // The paused waiter resumes, finds its entry gone, queues anew and gets the lock.
  paused.signal(SIGCONT);
  EXPECT_TRUE(distlock::testing::wait_for_text(paused_out, "released", 20s))
      << distlock::testing::read_file(paused_out);
  EXPECT_EQ(distlock::testing::read_file(killed_out).find("acquired"), std::string::npos);
}

}  // namespace

namespace {

// Calls of `command` the server counted (INFO commandstats), including those made
// inside scripts.
long long calls_of(RedisServer& server, const std::string& command) {
  auto r = server.command({"INFO", "commandstats"});
  if (!r || r->str == nullptr) return -1;
  const std::string text(r->str, r->len);
  const std::string key = "cmdstat_" + command + ":calls=";
  const auto at = text.find(key);
  return at == std::string::npos ? 0 : std::stoll(text.substr(at + key.size()));
}

// A blocking acquisition of a free lock with nobody queued takes it at once inside
// the acquire script: it does not put an entry in the queue only to take it out
// again (which cost 19 commands per acquisition instead of 9). The free lock's
// token still comes from the fence, and a queued waiter still goes first.
TEST(RedisHandOff, AnUncontendedAcquisitionDoesNotTouchTheQueue) {
  RedisServer server;
  auto client = distlock::connect(server.url());
  { auto warm = client.acquire("lean", ttl_of(10s, 5s)); }
  server.command({"CONFIG", "RESETSTAT"});
  std::uint64_t last = 0;
  for (int i = 0; i < 20; ++i) {
    auto lease = client.acquire("lean", ttl_of(10s, 5s));
    ASSERT_TRUE(lease.owns());
    EXPECT_GT(lease.token(), last);
    last = lease.token();
  }
  EXPECT_EQ(calls_of(server, "evalsha"), 40);  // one acquire and one release script each
  EXPECT_EQ(calls_of(server, "rpush"), 0);
  EXPECT_EQ(calls_of(server, "lpop"), 0);
  EXPECT_EQ(calls_of(server, "hdel"), 0);
  auto keys = server.command({"KEYS", "distlock:{lean}*"});
  ASSERT_TRUE(keys && keys->type == REDIS_REPLY_ARRAY);
  EXPECT_EQ(keys->elements, 0u) << "queue keys left behind";
}

}  // namespace

namespace {

// A waiter's queue keys live as long as its entries (min(TTL, 2 s) after the last
// refresh), not its TTL: a waiter killed with a TTL of 10 minutes leaves nothing on the
// server 2 s after its last refresh, with no other client coming by.
TEST(RedisHandOff, ADeadWaitersQueueKeysExpireWithItsEntryNotItsTtl) {
  namespace rs = distlock::detail::redis;
  RedisServer server;
  const std::string lock = rs::lock_key("distlock", "leftover");
  const std::string q = lock + ":q", x = lock + ":qx", fence = rs::fence_key("distlock", lock);
  const std::string grants = "distlock:grant:";
  auto eval = [&](const std::string& owner, const std::string& entry, const std::string& mode) {
    return server.command({"EVAL", rs::queue_acquire_script().source(), "4", lock, q, x, fence, owner,
                           "600000", entry, mode, grants});
  };
  auto h = eval("0123456789abcdef0123456789abcdef:1.1", "0", "0");
  ASSERT_TRUE(h && h->type == REDIS_REPLY_ARRAY && h->element[0]->integer == 1);
  auto w = eval("fedcba9876543210fedcba9876543210:1.2", "3", "1");  // queued, then never refreshed
  ASSERT_TRUE(w && w->type == REDIS_REPLY_ARRAY && w->element[0]->integer == 0);
  EXPECT_GT(server.command({"PTTL", q})->integer, 0);
  EXPECT_LE(server.command({"PTTL", q})->integer, rs::kEntryLife.count()) << "the queue outlives its entries";
  EXPECT_LE(server.command({"PTTL", x})->integer, rs::kEntryLife.count()) << "the queue outlives its entries";
  // Redis expires keys lazily and by a sampling sweep: EXISTS reads the expiry itself.
  EXPECT_TRUE(eventually(
      [&] {
        return server.command({"EXISTS", q})->integer == 0 && server.command({"EXISTS", x})->integer == 0;
      },
      4s))
      << "a dead waiter's queue keys are still there 4 s after its last refresh";
}

// A queued waiter's refresh that finds the lock granted to its entry reports the
// grant; the waiter's own acquire call claims it (its lease counts from that call's
// send). Until that claim the grant must stay a claim window: a waiter killed or
// stopped between its refresh and its claim would otherwise hold the lock for its
// whole TTL (here 30 s) and stall the next live waiter that long. A refresh that
// runs after the claim must not shorten the claimed lease either. Scripts run as
// the backend runs them (EVAL of the same source, the backend's key layout).
TEST(RedisHandOff, ARefreshThatFindsItsGrantLeavesItAClaimWindowUntilTheWaiterClaims) {
  namespace rs = distlock::detail::redis;
  RedisServer server;
  const std::string lock = rs::lock_key("distlock", "window");
  const std::string q = lock + ":q", x = lock + ":qx", fence = rs::fence_key("distlock", lock);
  const std::string grants = "distlock:grant:", released = lock + ":released";
  const std::string holder = "0123456789abcdef0123456789abcdef:1.1";
  const std::string waiter = "fedcba9876543210fedcba9876543210:1.2";
  auto eval = [&](const rs::Script& s, std::vector<std::string> argv) {
    std::vector<std::string> cmd{"EVAL", s.source(), "4", lock, q, x, fence};
    cmd.insert(cmd.end(), argv.begin(), argv.end());
    auto r = server.command(cmd);
    EXPECT_TRUE(r);
    if (r) {
      EXPECT_NE(r->type, REDIS_REPLY_ERROR) << std::string(r->str, r->len);
    }
    return r;
  };
  auto pttl = [&] { return Millis(server.command({"PTTL", lock})->integer); };
  auto refresh = [&] { return eval(rs::queue_refresh_script(), {grants, waiter, "7", "30000"}); };

  auto h = eval(rs::queue_acquire_script(), {holder, "30000", "0", "0", grants});
  ASSERT_TRUE(h && h->type == REDIS_REPLY_ARRAY && h->element[0]->integer == 1);
  auto w = eval(rs::queue_acquire_script(), {waiter, "30000", "7", "1", grants});
  ASSERT_TRUE(w && w->type == REDIS_REPLY_ARRAY && w->element[0]->integer == 0);  // queued
  auto rel = eval(rs::queue_release_script(), {holder, released, grants});
  ASSERT_TRUE(rel && rel->type == REDIS_REPLY_INTEGER && rel->integer == 0);
  ASSERT_LE(pttl(), rs::kClaimWindow);  // granted to the waiter's entry for the claim window

  auto found = refresh();
  ASSERT_TRUE(found && found->type == REDIS_REPLY_ARRAY && found->elements == 1);
  ASSERT_EQ(found->element[0]->type, REDIS_REPLY_STRING) << "the refresh did not report the grant";
  EXPECT_GT(pttl(), 0ms);
  EXPECT_LE(pttl(), rs::kClaimWindow)
      << "the refresh claimed the grant for the whole TTL: a waiter that dies "
         "before its own claim holds the lock that long";

  // The waiter's claim (its acquire call) restarts the TTL; a refresh racing after it
  // leaves the claimed lease alone.
  auto claim = eval(rs::queue_acquire_script(), {waiter, "30000", "7", "2", grants});
  ASSERT_TRUE(claim && claim->type == REDIS_REPLY_ARRAY && claim->element[0]->integer == 1);
  EXPECT_GT(pttl(), 29000ms);
  refresh();
  EXPECT_GT(pttl(), 29000ms) << "a refresh after the claim shortened the claimed lease";
  EXPECT_EQ(server.command({"HGET", lock, waiter})->str, std::string("7"));
}

// Issue 27 item 2 (docs/design.md "A dead waiter"): a waiter that died or stopped
// while its entry was still live delays the next live waiter by at most 3 s after
// the release, whatever its own TTL. A holds (ttl 5 s); B (another process) queues
// with ttl 30 s, C (here) behind it with ttl 30 s; B is SIGKILLed or SIGSTOPped and
// A releases at once, while B's entry is still live on the server. C's wait from
// the release is measured on this process's steady clock; the bound is 3 s (the
// grant to a dead entry lapses after its claim window, and C's next refresh takes
// the lock over).
class RedisDeadWaiter : public ::testing::TestWithParam<int> {};

TEST_P(RedisDeadWaiter, DelaysTheNextLiveWaiterByAtMost3sAfterTheRelease) {
  RedisServer server;
  Client probe = distlock::connect(server.url(), quiet());
  expect_dead_waiter_delay_at_most_3s(
      server.url(), "line", GetParam(), [&] { return static_cast<long long>(waiters_of(probe, "line")); },
      "distlock-deadwaiter");
}

INSTANTIATE_TEST_SUITE_P(Signals, RedisDeadWaiter, ::testing::Values(SIGKILL, SIGSTOP),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::string(p.param == SIGKILL ? "Killed" : "Stopped");
                         });

}  // namespace

namespace {

// Backend::forget (issue 27 item 4, redis part): the engine hands back a lease it
// declared lost. The backend deletes that lease's lock, owner- and token-checked,
// and hands it to the next live waiter as a release does; a wrong token or another
// owner changes nothing. Every queue entry of the owner goes too.
TEST(RedisForget, ALostLeaseIsHandedToTheNextWaiterAndOnlyThatLease) {
  RedisServer server;
  Client x = distlock::connect(server.url());
  Client y = distlock::connect(server.url());
  auto& backend = distlock::detail::engine_of(x)->backend();
  const std::string owner = "0123456789abcdef0123456789abcdef:7";
  distlock::detail::Error ec;
  const auto held = backend.try_acquire({"lost", owner, Millis(30000)}, ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(held.acquired);
  TimedAcquire yt(y, "lost", ttl_of(10s, 30s));
  ASSERT_TRUE(eventually([&] { return waiters_of(x, "lost") == 1u; }, 10s));
  backend.forget("lost", owner, held.token + 1);                             // another lease of the owner
  backend.forget("lost", "fedcba9876543210fedcba9876543210:1", held.token);  // another owner
  EXPECT_EQ(x.status("lost").holder.value_or(""), owner) << "forget freed a lease it was not given";
  EXPECT_FALSE(yt.got());
  const auto forgotten = Clock::now();
  backend.forget("lost", owner, held.token);
  yt.join();
  ASSERT_TRUE(yt.got());
  // One grant and its claim: two round trips on loopback; 2 s is the slack for a loaded host.
  EXPECT_LT(std::chrono::duration_cast<Millis>(yt.got_at() - forgotten), 2000ms)
      << "the next waiter was not granted the forgotten lock";
  EXPECT_EQ(backend.release("lost", owner, held.token, ec), distlock::detail::ReleaseStatus::not_owner);

  // A queued entry of the owner goes, the holder's lock stays.
  Lease h = y.acquire("queued", ttl_of(10s));
  const std::string waiter = "0123456789abcdef0123456789abcdef:8";
  ASSERT_FALSE(backend.try_acquire({"queued", waiter, Millis(30000), true}, ec).acquired);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_EQ(waiters_of(x, "queued"), 1u);
  backend.forget("queued", waiter, 0);
  EXPECT_EQ(waiters_of(x, "queued"), 0u) << "the owner's queue entry is still there";
  EXPECT_TRUE(x.status("queued").held);
  EXPECT_EQ(server.command({"EXISTS", "distlock:{queued}:q"})->integer, 0);
  backend.cancel_acquire("queued", waiter);  // the wait's local state
}

}  // namespace
}  // namespace distlock::testing
