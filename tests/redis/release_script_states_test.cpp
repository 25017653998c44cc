// redis:// release script: the one that skips the work of a release nobody waits for (one
// DEL of the lock and its lock-delay marker, the marker's PTTL not read, the lock's token
// read only for a watch) against the script before that change, on the same states.
// Starts its own redis-server on a loopback port; every read is bounded by a PING.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "redis/lock_scripts.hpp"
#include "support/redis_script_states.hpp"

namespace distlock::testing {
namespace {

// The release script as it was before (src/redis/lock_scripts.cpp at 87d78b9): the events
// functions, the redis:// transport, the queue prelude and the release body, with the
// entry life and claim window of lock_scripts.hpp.
const char* kOldRelease = R"lua(local ENTRY_LIFE = 2000
local CLAIM = 1000

local function watched(base)
  local n = redis.pcall('EXISTS', base .. 'watching')
  return type(n) ~= 'number' or n == 1
end
local function notify(base, message)
  if type(redis.pcall('PUBLISH', base .. 'events', message)) ~= 'number' then
    redis.pcall('DEL', base .. 'watching')
    return false
  end
  return true
end
local function shard_watched(shard)
  local n = redis.pcall('PUBSUB', 'SHARDNUMSUB', shard)
  return type(n) ~= 'table' or n[2] ~= 0
end
local WATCHED
local function publish_change(base, shard, kind, token, owner, lock)
  if shard and shard ~= '' then
    if WATCHED == nil then WATCHED = shard_watched(shard) end
    if WATCHED then redis.pcall('SPUBLISH', shard, kind .. ' ' .. token .. ' ' .. #owner .. ' ' .. owner .. lock) end
    return
  end
  if not base or base == '' then return end
  if WATCHED == nil then WATCHED = watched(base) end
  if not WATCHED then return end
  WATCHED = notify(base, kind .. ' ' .. token .. ' ' .. #owner .. ' ' .. owner .. lock)
end

local KPER = 4
local function marker_of(i, lock) return lock .. ':delay' end
local function send_grant(grant_prefix, lock, owner, message)
  redis.call('PUBLISH', grant_prefix .. string.match(owner, '^[^:]*'), message)
end
local function send_released(channel) redis.call('PUBLISH', channel, 'released') end
local function event(grant_prefix, kind, token, owner, lock)
  publish_change(string.sub(grant_prefix, 1, -7), nil, kind, token, owner, lock)
end

if redis.replicate_commands then redis.replicate_commands() end
local TIME
local function time()
  if not TIME then TIME = redis.call('TIME') end
  return TIME
end
local function now_ms()
  local t = time()
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function next_token(fence)
  local counted = redis.call('INCR', fence)
  local t = time()
  local usec = t[2]
  local now = t[1] .. string.rep('0', 6 - #usec) .. usec
  if counted < tonumber(now) then
    redis.call('SET', fence, now)
    return now
  end
  if counted < 9007199254740992 then return string.format('%.0f', counted) end
  return redis.call('GET', fence)
end
local function prune(q, x)
  while true do
    local head = redis.call('LINDEX', q, 0)
    if not head then return nil end
    local v = redis.call('HGET', x, head)
    if v then
      local exp, ttl = string.match(v, '^(%d+):(%d+)$')
      if exp and tonumber(exp) > now_ms() then return head, ttl end
    end
    redis.call('LPOP', q)
    redis.call('HDEL', x, head)
  end
end
local function entry_value(ttl)
  local life = math.min(tonumber(ttl), ENTRY_LIFE)
  return string.format('%.0f', now_ms() + life) .. ':' .. ttl
end
local function hold_back(marker)
  if not marker then return -2 end
  return redis.call('PTTL', marker)
end
local function mark_delay(marker, ttl, delay)
  local d = tonumber(delay)
  if d and d > 0 then
    redis.call('SET', marker, delay, 'PX', string.format('%.0f', tonumber(ttl) + d))
  end
end
local function take(lock, fence, marker, owner, entry, ttl, delay, grant_prefix)
  local token = next_token(fence)
  redis.call('HSET', lock, owner, entry, '@token', token)
  redis.call('PEXPIRE', lock, ttl)
  mark_delay(marker, ttl, delay)
  event(grant_prefix, 'acquired', token, owner, lock)
  return token
end
local function grant_head(lock, q, x, fence, marker, grant_prefix)
  if hold_back(marker) > 0 then return nil end
  local head, ttl = prune(q, x)
  if not head then return nil end
  redis.call('LPOP', q)
  redis.call('HDEL', x, head)
  local sp = string.find(head, ' ', 1, true)
  local entry, owner = string.sub(head, 1, sp - 1), string.sub(head, sp + 1)
  local window = math.min(tonumber(ttl), CLAIM)
  local token = take(lock, fence, marker, owner, entry, window, '0', grant_prefix)
  send_grant(grant_prefix, lock, owner, entry .. ' ' .. token .. ' ' .. #lock .. ' ' .. lock .. owner)
  return window
end
local function keep_queue(q, x, ttl)
  local life = math.min(tonumber(ttl), ENTRY_LIFE)
  if redis.call('PTTL', q) < life then redis.call('PEXPIRE', q, life) end
  if redis.call('PTTL', x) < life then redis.call('PEXPIRE', x, life) end
end
local function release_onward(lock, q, x, fence, marker, grant_prefix, channel, owner, why)
  event(grant_prefix, why, redis.call('HGET', lock, '@token') or '0', owner, lock)
  redis.call('DEL', lock)
  if not grant_head(lock, q, x, fence, marker, grant_prefix) then
    send_released(channel)
  end
end

local lock, q, x, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, channel, grant_prefix = ARGV[1], ARGV[2], ARGV[3]
if redis.call('HEXISTS', lock, owner) == 0 then
  return -1
end
-- A normal release: the holder's lock-delay is off, the next waiter gets it at once.
local marker = marker_of(1, lock)
if marker then redis.call('DEL', marker) end
release_onward(lock, q, x, fence, marker, grant_prefix, channel, owner, 'released')
return 0
)lua";

// Every state of one name that a release can meet, run through the old and the new script
// (each on its own copy, under prefixes "a:" and "b:"): the holder (none, this owner with or
// without its lock-delay marker, another owner), a lost holder's marker, queues of live and
// dead entries, a registered watch or none. The replies, the keys left (lock fields, lock and
// marker expiry, queue, expiries, fence) and the messages published (grants, 'released',
// watch events, read on a PSUBSCRIBE connection up to a PING) must agree.
TEST(RedisReleaseScriptStates, TheNewReleaseScriptMatchesTheOldOneOnEveryState) {
  RedisServer server;
  RawRedisConnection raw(server.port());
  RawRedisConnection sub(server.port());
  sub.cmd({"PSUBSCRIBE", "a:*", "b:*"});
  sub.read();  // the second pattern's confirmation
  const std::string new_src = distlock::detail::redis::queue_release_script().source();
  ASSERT_NE(new_src, std::string(kOldRelease));
  const std::string me = "eeee:1", me_entry = "7";
  std::mt19937 rng(20261130);
  int compared = 0, released_free = 0, handed_on = 0, watched = 0, mismatches = 0;
  for (int n = 0; n < 600 && mismatches < 5; ++n) {
    auto t = raw.cmd({"TIME"});
    const long long now_ms =
        std::stoll(reply_text(t->element[0])) * 1000 + std::stoll(reply_text(t->element[1])) / 1000;
    const int holder = static_cast<int>(rng() % 4);  // 0 none, 1 me, 2 me with a marker, 3 another owner
    const bool lost_marker = holder != 2 && rng() % 4 == 0;  // a lost holder's lock-delay still running
    const bool watch = rng() % 3 == 0;
    const int qlen = static_cast<int>(rng() % 4);
    std::vector<std::pair<std::string, bool>> q;  // member, live
    for (int i = 0; i < qlen; ++i)
      q.emplace_back(std::to_string(100 + i) + " wwww:" + std::to_string(i), rng() % 2);
    std::map<std::string, std::vector<std::string>> seen;  // per variant: reply, keys, messages
    for (const std::string v : {"a:", "b:"}) {
      const std::string name = v + "{n" + std::to_string(n) + "}";
      const std::string lock = name, qk = name + ":q", xk = name + ":qx", marker = name + ":delay",
                        fence = v + "{f" + std::to_string(n) + "}:fence", released = name + ":released";
      if (watch) raw.cmd({"SET", v + "watching", "1"});
      if (holder == 1 || holder == 2) raw.cmd({"HSET", lock, me, me_entry, "@token", "5"});
      if (holder == 3) raw.cmd({"HSET", lock, "cccc:9", "9", "@token", "5"});
      if (holder != 0) raw.cmd({"PEXPIRE", lock, "10000"});
      if (holder == 2 || lost_marker) raw.cmd({"SET", marker, "2000", "PX", "12000"});
      for (const auto& [member, live] : q) {
        raw.cmd({"RPUSH", qk, member});
        const long long exp = live ? now_ms + 60000 : now_ms - 5000;
        raw.cmd({"HSET", xk, member, std::to_string(exp) + ":5000"});
      }
      if (!q.empty()) {
        raw.cmd({"PEXPIRE", qk, "60000"});
        raw.cmd({"PEXPIRE", xk, "60000"});
      }
      const std::string& src = v == "a:" ? std::string(kOldRelease) : new_src;
      auto& d = seen[v];
      d.push_back(
          "reply " +
          reply_text(raw.cmd({"EVAL", src, "4", lock, qk, xk, fence, me, released, v + "grant:"}).get()));
      auto h = raw.cmd({"HGETALL", lock});
      std::vector<std::string> fields;
      for (std::size_t i = 0; i + 1 < h->elements; i += 2) {
        fields.push_back(reply_text(h->element[i]) + "=" + reply_text(h->element[i + 1]));
      }
      std::sort(fields.begin(), fields.end());
      for (auto& f : fields) d.push_back("lock " + variant_normalized(f, v, "<token>"));
      for (const auto& [what, key] : {std::pair{"lock", lock}, std::pair{"marker", marker}}) {
        const long long pttl = raw.cmd({"PTTL", key})->integer;
        d.push_back(std::string(what) + " pttl " +
                    (pttl < 0      ? std::to_string(pttl)
                     : pttl > 1500 ? ">1.5s"
                                   : "<=1.5s"));
      }
      auto l = raw.cmd({"LRANGE", qk, "0", "-1"});
      for (std::size_t i = 0; i < l->elements; ++i) d.push_back("q " + reply_text(l->element[i]));
      auto xs = raw.cmd({"HKEYS", xk});
      for (std::size_t i = 0; i < xs->elements; ++i) d.push_back("x " + reply_text(xs->element[i]));
      d.push_back("fence " + std::to_string(raw.cmd({"EXISTS", fence})->integer));
      for (auto& m : messages_until_ping(sub, v, "<token>")) d.push_back(std::move(m));
    }
    ++compared;
    const auto& b = seen["b:"];
    const auto has = [&](std::string_view prefix) {
      return std::any_of(b.begin(), b.end(), [&](const std::string& s) { return s.rfind(prefix, 0) == 0; });
    };
    if (has("message v:{n" + std::to_string(n) + "}:released")) ++released_free;
    if (has("message v:grant:")) ++handed_on;
    if (has("message v:events")) ++watched;
    if (seen["a:"] != b) {
      ++mismatches;
      std::string sa, sb;
      for (auto& s : seen["a:"]) sa += "  " + s + "\n";
      for (auto& s : b) sb += "  " + s + "\n";
      ADD_FAILURE() << "case " << n << " holder " << holder << " lost marker " << lost_marker << " watch "
                    << watch << " queue " << qlen << "\nold:\n"
                    << sa << "new:\n"
                    << sb;
    }
  }
  std::printf(
      "compared %d states: %d left the lock free ('released'), %d handed it on, %d published an event\n",
      compared, released_free, handed_on, watched);
  EXPECT_EQ(mismatches, 0);
  // Each path was met, or the comparison proved little.
  EXPECT_GT(released_free, 20);
  EXPECT_GT(handed_on, 20);
  EXPECT_GT(watched, 20);
}

}  // namespace
}  // namespace distlock::testing
