// redis:// acquire fast path: a free lock taken inside the acquire script without queueing.
// Written by the adversarial review of 787fba2 (commit 943a5fc, first named fastpath_review_test.cpp).
//
// Adversarial review of 787fba2 ("a new wait for a free lock with nobody queued
// takes it inside the acquire script without writing the queue"; TIME read lazily).
// Each test starts its own redis-server on a loopback port; every wait is bounded.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "redis/lock_scripts.hpp"
#include "redis/redis_backend.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_hammer.hpp"
#include "support/redis_probes.hpp"
#include "support/redis_script_states.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The acquire script as it was before 787fba2 (prelude with TIME read at the start,
// then the body that queues the entry first), for a differential comparison; with
// the entry life (min(ttl, 2 s)) and the grant's claim window (min(ttl, 1 s)) that
// came later (docs/redis.md), which the fast path does not touch.
const char* kOldAcquire = R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local TIME = redis.call('TIME')
local function now_ms()
  return tonumber(TIME[1]) * 1000 + math.floor(tonumber(TIME[2]) / 1000)
end
local function next_token(fence)
  local counted = redis.call('INCR', fence)
  local usec = TIME[2]
  local now = TIME[1] .. string.rep('0', 6 - #usec) .. usec
  if counted < tonumber(now) then
    redis.call('SET', fence, now)
    return now
  end
  if counted < 9007199254740992 then return string.format('%.0f', counted) end
  return redis.call('GET', fence)
end
local function prune(q, x, now)
  while true do
    local head = redis.call('LINDEX', q, 0)
    if not head then return nil end
    local v = redis.call('HGET', x, head)
    if v then
      local exp, ttl = string.match(v, '^(%d+):(%d+)$')
      if exp and tonumber(exp) > now then return head, ttl end
    end
    redis.call('LPOP', q)
    redis.call('HDEL', x, head)
  end
end
local function take(lock, fence, owner, entry, ttl)
  local token = next_token(fence)
  redis.call('HSET', lock, owner, entry, '@token', token)
  redis.call('PEXPIRE', lock, ttl)
  return token
end
local function grant_head(lock, q, x, fence, now, grant_prefix)
  local head, ttl = prune(q, x, now)
  if not head then return nil end
  redis.call('LPOP', q)
  redis.call('HDEL', x, head)
  local sp = string.find(head, ' ', 1, true)
  local entry, owner = string.sub(head, 1, sp - 1), string.sub(head, sp + 1)
  local window = math.min(tonumber(ttl), 1000)
  local token = take(lock, fence, owner, entry, window)
  redis.call('PUBLISH', grant_prefix .. string.match(owner, '^[^:]*'),
             entry .. ' ' .. token .. ' ' .. #lock .. ' ' .. lock .. owner)
  return window
end
local function keep_queue(q, x, ttl)
  if redis.call('PTTL', q) < tonumber(ttl) then redis.call('PEXPIRE', q, ttl) end
  if redis.call('PTTL', x) < tonumber(ttl) then redis.call('PEXPIRE', x, ttl) end
end
local function release_onward(lock, q, x, fence, now, grant_prefix, channel)
  redis.call('DEL', lock)
  if not grant_head(lock, q, x, fence, now, grant_prefix) then
    redis.call('PUBLISH', channel, 'released')
  end
end

local lock, q, x, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl, entry, mode, grant_prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now = now_ms()
if mode ~= '0' and redis.call('HGET', lock, owner) == entry then
  redis.call('PEXPIRE', lock, ttl)
  return {1, redis.call('HGET', lock, '@token')}
end
local me = entry .. ' ' .. owner
if mode ~= '0' then
  if redis.call('HEXISTS', x, me) == 1 then
    redis.call('HSET', x, me, string.format('%.0f', now + math.min(tonumber(ttl), 2000)) .. ':' .. ttl)
  elseif mode == '2' then
    return {2}
  else
    redis.call('RPUSH', q, me)
    redis.call('HSET', x, me, string.format('%.0f', now + math.min(tonumber(ttl), 2000)) .. ':' .. ttl)
  end
  keep_queue(q, x, ttl)
end
if redis.call('EXISTS', lock) == 1 then
  return {0, redis.call('PTTL', lock)}
end
local head = prune(q, x, now)
if head == nil then
  return {1, take(lock, fence, owner, '0', ttl)}
end
if mode ~= '0' and head == me then
  redis.call('LPOP', q)
  redis.call('HDEL', x, me)
  return {1, take(lock, fence, owner, entry, ttl)}
end
return {0, tonumber(grant_head(lock, q, x, fence, now, grant_prefix))}
)lua";

// ---------------------------------------------------------------------------
// 1. Differential: the new acquire script and the one before 787fba2, run on the
//    same (consistent) random states of lock, queue and expiries, modes 0/1/2,
//    including states a lost reply leaves (this wait's entry already queued, live
//    or dead, head or not) and dead heads before live entries. Replies, holder,
//    queue and expiries must agree (tokens: both issued or neither; expiry values
//    within a tolerance, both live or both dead).
// ---------------------------------------------------------------------------
TEST(RedisAcquireFastPath, NewAcquireScriptMatchesTheQueueingScriptOnEveryState) {
  RedisServer server;
  RawRedisConnection raw(server.port());
  const std::string new_src = distlock::detail::redis::queue_acquire_script().source();
  std::mt19937 rng(12345);
  const std::string me_owner = "aaaa:1", me_entry = "7";
  int compared = 0, fast = 0, mismatches = 0, diverging = 0;
  for (int n = 0; n < 1500 && mismatches < 5; ++n) {
    auto t = raw.cmd({"TIME"});
    const long long now_ms =
        std::stoll(reply_text(t->element[0])) * 1000 + std::stoll(reply_text(t->element[1])) / 1000;
    const int lock_state = static_cast<int>(rng() % 5);
    const int qlen = static_cast<int>(rng() % 4);
    const std::string mode = std::to_string(rng() % 3);
    struct E {
      std::string member;
      bool live;
      std::string ttl;
    };
    std::vector<E> q;
    bool me_used = false;
    for (int i = 0; i < qlen; ++i) {
      E e;
      if (!me_used && rng() % 3 == 0) {
        e.member = me_entry + " " + me_owner;
        me_used = true;
      } else {
        e.member = std::to_string(100 + i) + " bbbb:" + std::to_string(i);
      }
      e.live = rng() % 2;
      e.ttl = rng() % 2 ? "5000" : "300";
      q.push_back(e);
    }
    std::map<std::string, std::vector<std::string>> state_of;  // per variant: dump
    std::map<std::string, std::string> reply_of;
    for (const std::string v : {"a", "b"}) {
      const std::string name = v + ":{n" + std::to_string(n) + "}";
      const std::string lock = name, qk = name + ":q", xk = name + ":qx",
                        fence = v + ":{n" + std::to_string(n) + "}:fence";
      switch (lock_state) {
        case 0: break;
        case 1: raw.cmd({"HSET", lock, "cccc:9", "9", "@token", "5"}); break;
        case 2: raw.cmd({"HSET", lock, me_owner, me_entry, "@token", "5"}); break;
        case 3: raw.cmd({"HSET", lock, me_owner, "0", "@token", "5"}); break;
        case 4: raw.cmd({"HSET", lock, me_owner, "6", "@token", "5"}); break;
      }
      if (lock_state != 0) raw.cmd({"PEXPIRE", lock, "10000"});
      for (const auto& e : q) {
        raw.cmd({"RPUSH", qk, e.member});
        const long long exp = e.live ? now_ms + 60000 : now_ms - 5000;
        raw.cmd({"HSET", xk, e.member, std::to_string(exp) + ":" + e.ttl});
      }
      if (!q.empty()) {
        raw.cmd({"PEXPIRE", qk, "60000"});
        raw.cmd({"PEXPIRE", xk, "60000"});
      }
      const std::string& src = v == "a" ? std::string(kOldAcquire) : new_src;
      auto r = raw.cmd({"EVAL", src, "4", lock, qk, xk, fence, me_owner, "5000", mode == "0" ? "0" : me_entry,
                        mode, v + ":grant:"});
      std::string rep;
      if (r->type == REDIS_REPLY_ARRAY) {
        rep = reply_text(r->element[0]);
        if (r->elements > 1) {
          const std::string second = reply_text(r->element[1]);
          if (rep == "1") {
            rep += second.empty() ? " <none>" : " <token>";
          } else if (r->element[1]->type == REDIS_REPLY_INTEGER && r->element[1]->integer > 300 &&
                     lock_state != 0) {
            rep += " <pttl>";
          } else {
            rep += " " + second;
          }
        }
        rep += " n=" + std::to_string(r->elements);
      } else {
        rep = "non-array " + reply_text(r.get());
      }
      reply_of[v] = rep;
      auto& d = state_of[v];
      auto h = raw.cmd({"HGETALL", lock});
      std::vector<std::string> fields;
      for (std::size_t i = 0; i + 1 < h->elements; i += 2) {
        const std::string f = reply_text(h->element[i]);
        fields.push_back(f + "=" + (f == "@token" ? "<token>" : reply_text(h->element[i + 1])));
      }
      std::sort(fields.begin(), fields.end());
      for (auto& f : fields) d.push_back("lock " + f);
      const long long pttl = raw.cmd({"PTTL", lock})->integer;
      d.push_back(std::string("lock pttl ") + (pttl < 0      ? std::to_string(pttl)
                                               : pttl > 6000 ? ">6s"
                                                             : "<=6s"));
      auto l = raw.cmd({"LRANGE", qk, "0", "-1"});
      for (std::size_t i = 0; i < l->elements; ++i) d.push_back("q " + reply_text(l->element[i]));
      auto xs = raw.cmd({"HGETALL", xk});
      std::vector<std::string> xf;
      for (std::size_t i = 0; i + 1 < xs->elements; i += 2) {
        const std::string val = reply_text(xs->element[i + 1]);
        const auto colon = val.find(':');
        const long long exp = std::stoll(val.substr(0, colon));
        xf.push_back("x " + reply_text(xs->element[i]) + (exp > now_ms ? " live " : " dead ") +
                     (exp > now_ms + 30000 ? "far" : "near") + " ttl " + val.substr(colon + 1));
      }
      std::sort(xf.begin(), xf.end());
      for (auto& f : xf) d.push_back(f);
      d.push_back("fence " + std::to_string(raw.cmd({"EXISTS", fence})->integer));
      d.push_back("q pttl>0 " + std::to_string(raw.cmd({"PTTL", qk})->integer > 0));
    }
    std::string before;
    bool me_dead = false;
    for (const auto& e : q) {
      before += "  " + e.member + (e.live ? " live" : " dead") + "\n";
      if (e.member == me_entry + " " + me_owner && !e.live) me_dead = true;
    }
    if (me_dead && mode == "1" && lock_state != 2) {
      // Known divergence, not compared: the old script refreshed this wait's own dead
      // entry (resurrecting it in its old place) before pruning; the new one prunes
      // it first, as the model's acquire step does (q_prune, then q_find), and queues
      // it anew at the tail. Unreachable from the backend (mode 1 is never resent with
      // the same entry: an error ends the wait and cancels it). Checked instead: the
      // new script never grants anyone while another holder's lock exists, and takes
      // the lock only when no live entry remains.
      ++diverging;
      const bool took = reply_of["b"].rfind("1 ", 0) == 0;
      bool other_live = false;
      for (const auto& e : q) other_live = other_live || (e.live && e.member != me_entry + " " + me_owner);
      if (took && (lock_state == 1 || lock_state == 4 || other_live)) {
        ++mismatches;
        ADD_FAILURE() << "case " << n << ": took the lock past a live entry or a holder";
      }
      continue;
    }
    ++compared;
    if (mode == "1" && lock_state == 0 && reply_of["b"].rfind("1 ", 0) == 0) ++fast;
    if (reply_of["a"] != reply_of["b"] || state_of["a"] != state_of["b"]) {
      ++mismatches;
      std::string sa, sb;
      for (auto& s : state_of["a"]) sa += "  " + s + "\n";
      for (auto& s : state_of["b"]) sb += "  " + s + "\n";
      ADD_FAILURE() << "case " << n << " lock_state " << lock_state << " mode " << mode << "\nqueue before\n"
                    << before << "old reply " << reply_of["a"] << "\n"
                    << sa << "new reply " << reply_of["b"] << "\n"
                    << sb;
    }
  }
  std::printf("compared %d states (%d took the new fast path's branch), %d with a dead own entry\n", compared,
              fast, diverging);
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(fast, 20);
}

// Raw backend calls: an owner id per (client, thread) of the form "<32 hex>:<seq>".
std::string owner_of(char c, int seq) {
  return std::string(32, c) + ":" + std::to_string(seq);
}

distlock::detail::AcquireResult raw_acquire(Client& c, const std::string& name, const std::string& owner,
                                            Millis ttl, bool queued, distlock::detail::Error& ec) {
  distlock::detail::AcquireRequest req{name, owner, ttl, queued};
  return distlock::detail::engine_of(c)->backend().try_acquire(req, ec);
}

// ---------------------------------------------------------------------------
// 2. The lock is free because its holder's lease ran out while a live waiter is
//    queued (nobody re-checked yet). A new wait (mode 1) must not take it: the
//    queued waiter is granted. Also behind a dead head, and with only dead
//    entries (then the new wait takes it and leaves no queue behind).
// ---------------------------------------------------------------------------
TEST(RedisAcquireFastPath, NewWaitDoesNotTakeAFreeLockFromALiveQueuedWaiter) {
  RedisServer server;
  Client hc = distlock::connect(server.url());
  Client w1c = distlock::connect(server.url());
  Client w2c = distlock::connect(server.url());
  for (int variant = 0; variant < 3; ++variant) {
    const std::string name = "free-" + std::to_string(variant);
    const std::string key = "distlock:{" + name + "}";
    distlock::detail::Error ec;
    const std::string h = owner_of('a', 1 + variant), w1 = owner_of('b', 1 + variant),
                      w2 = owner_of('c', 1 + variant);
    auto hr = raw_acquire(hc, name, h, 300ms, false, ec);
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_TRUE(hr.acquired);
    if (variant != 2) {
      auto r1 = raw_acquire(w1c, name, w1, 3000ms, true, ec);  // queued, refreshed by w1c
      ASSERT_FALSE(ec) << ec.message();
      ASSERT_FALSE(r1.acquired);
    }
    if (variant >= 1) {
      // A dead entry in front (a paused or killed waiter whose entry expired).
      auto t = server.command({"TIME"});
      const long long now_ms =
          std::stoll(reply_text(t->element[0])) * 1000 + std::stoll(reply_text(t->element[1])) / 1000;
      server.command({"LPUSH", key + ":q", "999 " + owner_of('d', 1)});
      server.command({"HSET", key + ":qx", "999 " + owner_of('d', 1), std::to_string(now_ms - 1) + ":300"});
    }
    ASSERT_TRUE(eventually([&] { return server.command({"EXISTS", key})->integer == 0; }, 2s));
    const std::uint64_t htoken = hr.token;
    auto r2 = raw_acquire(w2c, name, w2, 3000ms, true, ec);
    ASSERT_FALSE(ec) << ec.message();
    if (variant == 2) {
      EXPECT_TRUE(r2.acquired) << "only a dead entry queued: the new wait takes the free lock";
      EXPECT_GT(r2.token, htoken);
      EXPECT_EQ(server_holder(server, name), w2);
      EXPECT_EQ(server.command({"EXISTS", key + ":q"})->integer, 0);
      EXPECT_EQ(server.command({"EXISTS", key + ":qx"})->integer, 0);
      distlock::detail::Error rec;
      distlock::detail::engine_of(w2c)->backend().release(name, w2, r2.token, rec);
      continue;
    }
    EXPECT_FALSE(r2.acquired) << "variant " << variant
                              << ": a new wait took the free lock ahead of the live queued waiter";
    EXPECT_EQ(server_holder(server, name), w1) << "variant " << variant;
    // W1 claims its grant; W2 stays queued behind it and gets it on release.
    auto c1 = raw_acquire(w1c, name, w1, 3000ms, true, ec);
    ASSERT_FALSE(ec);
    EXPECT_TRUE(c1.acquired);
    EXPECT_GT(c1.token, htoken);
    distlock::detail::Error rec;
    distlock::detail::engine_of(w1c)->backend().release(name, w1, c1.token, rec);
    EXPECT_EQ(server_holder(server, name), w2);
    auto c2 = raw_acquire(w2c, name, w2, 3000ms, true, ec);
    EXPECT_TRUE(c2.acquired);
    EXPECT_GT(c2.token, c1.token);
    distlock::detail::engine_of(w2c)->backend().release(name, w2, c2.token, rec);
  }
}

// ---------------------------------------------------------------------------
// 3. FIFO at the engine level around the moment a non-renewing holder's lease
//    ends: W1 queued first (engine wait), W2 starts its wait at -40..+40 ms of the
//    holder's expiry. W1 must get the lock before W2 every time.
// ---------------------------------------------------------------------------
TEST(RedisAcquireFastPath, WaiterQueuedBeforeAHolderExpiryGoesBeforeANewWait) {
  RedisServer server;
  Client hc = distlock::connect(server.url());
  Client c1 = distlock::connect(server.url());
  Client c2 = distlock::connect(server.url());
  int checked = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string name = "expiry-" + std::to_string(i);
    distlock::detail::Error ec;
    const auto h_at = Clock::now();
    auto hr = raw_acquire(hc, name, owner_of('a', 100 + i), 250ms, false, ec);
    ASSERT_TRUE(hr.acquired) << ec.message();
    std::mutex mu;
    std::vector<std::pair<int, std::uint64_t>> order;
    // Waiter `who` through `client`: once granted, notes (who, token) in `order` and holds for `hold`.
    const auto waiter = [&](int who, Client& client, Millis hold) {
      return std::thread([&, who, hold] {
        distlock::detail::Error e;
        Lease l = client.acquire(name, ttl_of(2s, 10s), e);
        EXPECT_FALSE(e) << e.message();
        if (e) return;
        {
          std::lock_guard lk(mu);
          order.emplace_back(who, l.token());
        }
        std::this_thread::sleep_for(hold);
      });
    };
    std::thread t1 = waiter(1, c1, 20ms);
    ASSERT_TRUE(eventually([&] { return c1.status(name).waiters.value_or(0) == 1u; }, 5s));
    std::this_thread::sleep_until(h_at + 250ms + Millis(i * 5 - 40));
    std::thread t2 = waiter(2, c2, 0ms);
    t1.join();
    t2.join();
    ASSERT_EQ(order.size(), 2u);
    EXPECT_EQ(order[0].first, 1) << "iteration " << i << ": the new wait was granted before the queued W1";
    EXPECT_GT(order[0].second, hr.token);
    EXPECT_GT(order[1].second, order[0].second);
    ++checked;
  }
  EXPECT_EQ(checked, 16);
}

// ---------------------------------------------------------------------------
// 4. Hammer dominated by the fast path: many names, so most waits find the lock
//    free and the queue empty, short TTLs (100-300 ms), waits that give up, some
//    try_acquires, and the server paused (SIGSTOP) for 60-250 ms now and then.
//    Checks: no two leases of one name own() at once; tokens per name strictly
//    increase in the order of entry; a lease that owns() with >= 60 ms left finds
//    its own token on the server (no silent loss).
// ---------------------------------------------------------------------------
TEST(RedisAcquireFastPath, FastPathHammerWithServerPausesKeepsExclusion) {
  RedisServer server;
  constexpr int kClients = 3, kThreadsPer = 4, kNames = 6;
  std::vector<Client> clients = connect_clients(server.url(), kClients);
  NameSections sections(kNames);
  std::atomic<int> acquired{0}, failures{0}, silent{0}, checked{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads =
      start_hammer_threads(kClients, kThreadsPer, 977, [&](int c, std::minstd_rand& rng) {
        RawRedisConnection raw(server.port());
        for (int n = 0; n < 20000 && !stop.load(); ++n) {
          const int k = static_cast<int>(rng() % kNames);
          const std::string name = "fp-" + std::to_string(k);
          const Millis ttl(100 + 100 * static_cast<long>(rng() % 3));
          std::optional<Lease> l;
          if (rng() % 8 == 0) {
            try {
              l = clients[c].try_acquire(name, ttl_of(ttl));
            } catch (const std::exception&) {
              ++failures;
              continue;
            }
            if (!l) continue;
          } else {
            const Millis wait(rng() % 3 == 0 ? static_cast<long>(1 + rng() % 20) : 1500);
            distlock::detail::Error ec;
            Lease got = clients[c].acquire(name, ttl_of(ttl, wait), ec);
            if (ec) {
              ++failures;
              continue;
            }
            l.emplace(std::move(got));
          }
          ++acquired;
          // Overlaps and token order are checked among leases that still own() when they are
          // recorded: a lease whose thread was descheduled past its 100-300 ms TTL between the
          // grant and this line is no longer a holder (its loss was signalled, and since the
          // lost-lease hand-back the server may already have granted the name again with a larger
          // token that was recorded first). Among valid holders the record order is the grant
          // order: one that owns() here is still held on the server, so no later grant can precede it.
          sections.enter(k, *l, /*only_while_owned=*/true);
          if (rng() % 2) {
            const auto before = Clock::now();
            if (l->owns() && l->remaining() >= 60ms) {
              auto r = raw.cmd({"HGET", "distlock:{" + name + "}", "@token"});
              const bool quick = Clock::now() - before < 40ms;
              if (quick && r && l->owns()) {
                ++checked;
                if (reply_text(r.get()) != std::to_string(l->token())) ++silent;
              }
            }
          }
          if (rng() % 2) std::this_thread::sleep_for(Millis(rng() % 4));
          sections.leave(k, *l);
          distlock::detail::Error rec;
          l->release(rec);
        }
      });
  threads.emplace_back([&] {
    std::minstd_rand rng(7);
    for (int i = 0; i < 20 && !stop.load(); ++i) {
      std::this_thread::sleep_for(Millis(300 + rng() % 200));
      server.pause();
      std::this_thread::sleep_for(Millis(60 + rng() % 190));
      server.resume();
    }
  });
  run_hammer_for(8s, stop, threads);
  std::printf("acquired %d failures %d checked %d\n", acquired.load(), failures.load(), checked.load());
  EXPECT_EQ(sections.overlaps(), 0);
  EXPECT_EQ(sections.regressions(), 0);
  EXPECT_EQ(silent.load(), 0) << "a lease owns() with time left while the server holds another token";
  EXPECT_GT(acquired.load(), 100);
  for (int k = 0; k < kNames; ++k) {
    const std::string name = "fp-" + std::to_string(k);
    EXPECT_TRUE(eventually([&] { return !clients[0].status(name).held; }, 3s)) << name;
    EXPECT_EQ(clients[0].status(name).waiters.value_or(99), 0u) << name;
  }
}

// ---------------------------------------------------------------------------
// 5. Tokens of fast-path acquisitions across crashes (SIGKILL, restart), with AOF
//    and without: strictly increasing.
// ---------------------------------------------------------------------------
void tokens_across_restarts(bool aof) {
  distlock::testing::RedisServerOptions o;
  o.appendonly = aof;
  RedisServer server(o);
  std::uint64_t last = 0;
  for (int round = 0; round < 4; ++round) {
    Client c = distlock::connect(server.url());
    for (int i = 0; i < 10; ++i) {
      distlock::detail::Error ec;
      Lease l = c.acquire("restart-token", ttl_of(5s, 5s), ec);
      ASSERT_FALSE(ec) << ec.message();
      EXPECT_GT(l.token(), last) << "round " << round << " acquisition " << i;
      last = l.token();
      if (i % 3 == 2) continue;  // some left held: the crash takes them (or the AOF keeps them)
      l.release();
    }
    server.kill();
    server.restart();
  }
}

TEST(RedisAcquireFastPath, FastPathTokensIncreaseAcrossRestartsWithAof) {
  tokens_across_restarts(true);
}

TEST(RedisAcquireFastPath, FastPathTokensIncreaseAcrossRestartsWithoutAof) {
  tokens_across_restarts(false);
}

// ---------------------------------------------------------------------------
// 6. A client behind a proxy that delays each chunk past the client's command
//    timeout: its uncontended waits fail (the engine gives them up). Once the
//    network is back, another client must get each lock promptly, with tokens
//    still increasing, and the failed client holds nothing. (In the review's runs
//    the delayed requests did not reach the server before the client gave up, so
//    this does not cover a fast path that ran with its reply lost; the
//    differential test above covers that state at the script level.)
// ---------------------------------------------------------------------------
TEST(RedisAcquireFastPath, WaitsThatTimeOutLeaveTheirLocksToOthers) {
  RedisServer server;
  distlock::testing::FaultProxy proxy(server.port());
  Client slow = distlock::connect("redis://127.0.0.1:" + std::to_string(proxy.port()) + "?timeout=100ms");
  Client other = distlock::connect(server.url());
  int executed = 0;
  std::uint64_t last = 0;
  for (int i = 0; i < 6; ++i) {
    const std::string name = "lost-" + std::to_string(i);
    proxy.delay(Millis(150 + 20 * i));
    distlock::detail::Error ec;
    Lease l = slow.acquire(name, ttl_of(3s, 300ms), ec);
    EXPECT_TRUE(ec) << "iteration " << i << ": acquired through a proxy slower than the timeout";
    if (!ec) continue;
    EXPECT_FALSE(l.owns());
    std::this_thread::sleep_for(400ms);  // the delayed request reaches the server (or not)
    if (!server_holder(server, name).empty()) ++executed;
    proxy.pass();
    const auto back = Clock::now();
    distlock::detail::Error oec;
    Lease o = other.acquire(name, ttl_of(3s, 10s), oec);
    ASSERT_FALSE(oec) << oec.message();
    EXPECT_LT(std::chrono::duration_cast<Millis>(Clock::now() - back), 2500ms)
        << "iteration " << i << ": the lock sat with the given-up wait";
    EXPECT_GT(o.token(), last);
    last = o.token();
    o.release();
  }
  std::printf("the server ran %d of the failed calls\n", executed);
}

}  // namespace
}  // namespace distlock::testing
