#include "redis/lock_scripts.hpp"

#include <initializer_list>
#include <string>

#include "distlock/error.hpp"

namespace distlock::detail::redis {

namespace {

// publish_change(base, shard, kind, token, owner, lock): the one change message of a
// lock for Client::watch, "<kind> <token> <owner length> <owner><lock key>", sent one
// of two ways:
//   - shard (redis+cluster://, a non-empty sharded channel "<prefix>:events:{<slot tag>}"
//     in the lock's slot): SPUBLISH on it while this node has a subscriber of that channel
//     (`PUBSUB SHARDNUMSUB`, read once per script; a watch subscribes on the slot's master
//     and watch() returns only once every subscription is confirmed, so every change after
//     that finds the count above zero: docs/redis-cluster.md "Watching locks"). A refused
//     count (an ACL user without PUBSUB) publishes as if watched; a refused SPUBLISH (an
//     ACL user without the channel) is no error after the script's writes.
//   - base (redis://, redis+sentinel://, "<prefix>:"): PUBLISH on "<prefix>:events" only
//     while the watcher-presence key "<prefix>:watching" exists, or the server refuses
//     its read (an ACL user whose key pattern covers the keys of names only,
//     "<prefix>:{*", cannot tell; then the change is published, a watch of another user
//     may run). With nobody watching a change costs one EXISTS per script, not a PUBLISH
//     that every replica would also receive (docs/benchmarks.md "Watch events"); the
//     lookup is made once per script. A refused PUBLISH deletes the presence key, so
//     every watch finds a new generation at its next renewal: a gap, never a silent loss
//     (redis_watch.cpp).
// Neither: nothing is published. `token` is a string, or a function returning it, called
// only when the change is published (a release reads the lock's token only then).
// One function, its lookups written inline: every function a script defines is a closure
// made anew on each call (the comment above kTimePart says what that costs).
constexpr const char* kChangeEvent = R"lua(
local WATCHED
local function publish_change(base, shard, kind, token, owner, lock)
  if shard and shard ~= '' then
    if WATCHED == nil then
      local n = redis.pcall('PUBSUB', 'SHARDNUMSUB', shard)
      WATCHED = type(n) ~= 'table' or n[2] ~= 0
    end
    if not WATCHED then return end
    if type(token) == 'function' then token = token() end
    redis.pcall('SPUBLISH', shard, kind .. ' ' .. token .. ' ' .. #owner .. ' ' .. owner .. lock)
    return
  end
  if not base or base == '' then return end
  if WATCHED == nil then
    local n = redis.pcall('EXISTS', base .. 'watching')
    WATCHED = type(n) ~= 'number' or n == 1
  end
  if not WATCHED then return end
  if type(token) == 'function' then token = token() end
  if type(redis.pcall('PUBLISH', base .. 'events', kind .. ' ' .. token .. ' ' .. #owner .. ' ' .. owner .. lock)) ~= 'number' then
    redis.pcall('DEL', base .. 'watching')
    WATCHED = false
  end
end
)lua";

// The functions of the queue scripts, in five parts; each part uses only the parts above it
// (and the events functions and the transport below). A script carries only the parts it
// calls, and the acquire and release scripts define the queue's part after their uncontended
// path has returned: Redis runs a script's whole chunk on every call, so every `local
// function` makes a closure on every call, used or not (0.07–0.12 µs of server CPU each;
// an uncontended acquire + release pair made about 40 and makes 17, 1.6–3.3 µs less, in
// docs/benchmarks.md "The lock scripts' per-call prelude"). A definition has no effect of
// its own: where it stands changes nothing a script does, only what it costs.
//
// Time is the server's (TIME, read at most once per script, when first needed: it does
// not move during a script anyway), so queue entries expire on the same clock as the lock
// itself.
//
// next_token: max(counter + 1, server TIME in microseconds), written back to the
// counter. A counter lost to a restart without AOF, an eviction or a DEL restarts
// from the clock, above every token issued before as long as the server's clock
// reads later than it did when the highest of them was issued (docs/redis.md).
// INCR comes first: a non-integer or overflowing counter fails before anything is
// written. Tokens leave as decimal strings, exact over the whole int64 range: Lua
// numbers are doubles, so above 2^53 the counter is read back with GET.
//
// prune: drops dead entries (expired: a killed or paused waiter) from the head and
// returns the first live one with its ttl.
//
// entry_value: a queued entry's "<expiry>:<ttl>"; it expires ENTRY_LIFE ms after
// this refresh (the ttl if shorter), not after the lock's ttl: a dead or stopped
// waiter's place lapses within ENTRY_LIFE, whatever its ttl.
//
// keep_queue: the queue keys live as long as the entry just written (never
// shortened): they outlive no entry, and a dead waiter leaves nothing behind once
// its entry expired.
//
// take: the lock, which does not exist (callers check or delete it), goes to owner.
//
// Lock-delay (docs/design.md "Lock-delay"): a holder with lock_delay D > 0 keeps the
// marker (value D; "<lock>:delay" on redis://, a declared key on redis+cluster://: marker_of
// below) living PX ttl + D, set when it takes or claims the lock and moved by each renewal
// with the lease (renew_script), deleted by a normal release only. A lost holder (killed,
// cut off, expired, forgotten) leaves it behind: the lock's key goes at the lease's end, the
// marker D later, on the server's clock. While it lives nobody takes the free lock:
// hold_back() is its PTTL (> 0), grant_head hands nothing on, and a waiter is told the PTTL
// as the holder's remaining time (its re-check).
//
// event: one message on "<prefix>:events" per change of a lock (Client::watch,
// redis_watch.cpp), kind acquired, released or lost (revoke_script publishes revoked),
// sent by publish_change (kChangeEvent above) while a watch is registered.
//
// drop_lock: the lock goes (event, DEL); with drop_marker (a normal release) the lock-delay
// marker goes in the same DEL, so nothing holds the lock back and grant_head does not read
// the marker's PTTL (it would be -2). Returns the marker still standing (nil when dropped).
//
// release_onward: drop_lock, then the lock goes to the first live waiter (grant_head), or
// a 'released' message says it is free.
//
// grant_head: the lock (free) goes to the first live waiter: new owner, entry and
// token, and one message on that waiter's client channel. Nobody else is woken. The
// grant lives CLAIM ms (the ttl if shorter) until the grantee claims it (its call
// restarts the lock's ttl): a grant to a waiter that died since its last refresh
// lapses then, and the next waiter's refresh takes the free lock over.

// Every queue script opens with this (lua_header): effects replication where a server
// still needs asking (Redis < 5), before any command; then the two constants.
constexpr const char* kReplicateEffects = "if redis.replicate_commands then redis.replicate_commands() end\n";

// Part 1, time: the script's one TIME, and now in ms.
constexpr const char* kTimePart = R"lua(
local TIME
local function time()
  if not TIME then TIME = redis.call('TIME') end
  return TIME
end
local function now_ms()
  local t = time()
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
)lua";

// Part 2, taking a lock: next_token, mark_delay, take (uses part 1, the events functions
// and the transport).
constexpr const char* kTakePart = R"lua(
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
)lua";

// Part 3, drop_lock (uses the events functions): all the release script's uncontended path
// needs of the prelude.
constexpr const char* kDropPart = R"lua(
local function drop_lock(lock, marker, grant_prefix, owner, why, drop_marker)
  event(grant_prefix, why, function() return redis.call('HGET', lock, '@token') or '0' end, owner, lock)
  if drop_marker and marker then
    redis.call('DEL', lock, marker)
    return nil
  end
  redis.call('DEL', lock)
  return marker
end
)lua";

// Part 4, the queue: prune, entry_value, hold_back, grant_head, keep_queue (uses parts 1
// and 2 and the transport).
constexpr const char* kQueuePart = R"lua(
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
)lua";

// Part 5, release_onward (uses parts 3 and 4 and the transport).
constexpr const char* kReleaseOnwardPart = R"lua(
local function release_onward(lock, q, x, fence, marker, grant_prefix, channel, owner, why, drop_marker)
  marker = drop_lock(lock, marker, grant_prefix, owner, why, drop_marker)
  if not grant_head(lock, q, x, fence, marker, grant_prefix) then
    send_released(channel)
  end
end
)lua";

// How the queue scripts find a name's lock-delay marker and send their messages: the only
// part that differs between redis:// (and redis+sentinel://) and redis+cluster://.
//   KPER: keys per name in a batch (the refresh script).
//   marker_of(i, lock): the marker of the name whose keys start at KEYS[i] (nil: not named).
//   send_grant(grant_prefix, lock, owner, message): the grant to one waiter.
//   send_released(channel): a release that left the lock free.
//   event(grant_prefix, kind, token, owner, lock): a change for Client::watch.
//
// redis://: four keys per name (lock, queue, expiries, fence); the marker is
// "<lock>:delay" (redis/key_layout.hpp delay_key); the grant goes on the grantee
// client's channel "<grant prefix><client id>", the release on the name's channel, both
// PUBLISH; `grant_prefix` is "<prefix>:grant:", so the events base is "<prefix>:".
constexpr const char* kRedisTransport = R"lua(
local KPER = 4
local function marker_of(i, lock) return lock .. ':delay' end
local function send_grant(grant_prefix, lock, owner, message)
  redis.call('PUBLISH', grant_prefix .. string.match(owner, '^[^:]*'), message)
end
local function send_released(channel) redis.call('PUBLISH', channel, 'released') end
local function event(grant_prefix, kind, token, owner, lock)
  publish_change(string.sub(grant_prefix, 1, -7), nil, kind, token, owner, lock)
end
)lua";

// redis+cluster:// (src/rediscluster, docs/redis-cluster.md "How waiting works"): five keys
// per name, all in the name's slot (lock, queue, expiries, fence, marker; the marker may be
// left out, then nil: a release of a lease without lock-delay, whose lock no marker can hold
// back); a script may SPUBLISH only on a channel of its slot, so the grant goes on the name's
// sharded release channel, which every waiting client of the name subscribes to, and names
// the entry and the owner: only the grantee's client wakes a thread for it. The channel is
// derived from the lock key as rediscluster::keys_of() does ("<lock>:released", or
// "<prefix>:{#H}:r:<name>" for "<prefix>:{#H}:l:<name>": a prefix has no '}', so the first
// "}:l:" ends the hash tag). `grant_prefix` is the slot's sharded events channel.
constexpr const char* kClusterTransport = R"lua(
local KPER = 5
local function marker_of(i, lock) return KEYS[i + 4] end
local function name_channel(lock)
  local s, e = string.find(lock, '}:l:', 1, true)
  if s then return string.sub(lock, 1, s) .. ':r:' .. string.sub(lock, e + 1) end
  return lock .. ':released'
end
local function send_grant(grant_prefix, lock, owner, message)
  redis.call('SPUBLISH', name_channel(lock), message)
end
local function send_released(channel) redis.call('SPUBLISH', channel, 'released') end
local function event(grant_prefix, kind, token, owner, lock)
  publish_change(nil, grant_prefix, kind, token, owner, lock)
end
)lua";

// The opening of every queue script: effects replication (kReplicateEffects), the entry
// life and claim window of lock_scripts.hpp, the events functions and the transport.
std::string lua_header(const char* transport) {
  return std::string(kReplicateEffects) + "local ENTRY_LIFE = " + std::to_string(kEntryLife.count()) +
         "\nlocal CLAIM = " + std::to_string(kClaimWindow.count()) + "\n" + std::string(change_event_lua()) +
         transport;
}

// A queue script: the header, then `parts` (prelude parts and pieces of its body) in order.
std::string script_of(const char* transport, std::initializer_list<const char*> parts) {
  std::string s = lua_header(transport);
  for (const char* part : parts) s += part;
  return s;
}

}  // namespace

std::string_view change_event_lua() {
  return kChangeEvent;
}

namespace {
// The acquire script up to its uncontended path, which needs only parts 1 and 2.
constexpr const char* kQueueAcquireFast = R"lua(
local lock, q, x, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl, entry, mode, grant_prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local delay = ARGV[6] or '0'
local marker = marker_of(1, lock)
-- Nobody holds the lock, waits for it or holds it back (none of the lock, its queue
-- and its lock-delay marker exists): a try (mode 0) or a new wait (mode 1) takes it
-- at once, after one EXISTS instead of the HGET, PTTL, EXISTS and LINDEX below, which
-- would find the same (no entry in a lock that does not exist, no marker: PTTL -2, no
-- queue: LINDEX nil) and then take it the same way.
if mode ~= '2' and redis.call('EXISTS', lock, q, marker or lock) == 0 then
  return {1, take(lock, fence, marker, owner, mode == '0' and '0' or entry, ttl, delay, grant_prefix)}
end
)lua";
// The rest of the acquire script, after the queue's functions (kQueuePart).
constexpr const char* kQueueAcquireRest = R"lua(
if mode ~= '0' and redis.call('HGET', lock, owner) == entry then
  redis.call('PEXPIRE', lock, ttl)
  mark_delay(marker, ttl, delay)
  return {1, redis.call('HGET', lock, '@token')}
end
-- A lost holder's lock-delay still running: nobody takes the lock before it ends.
local held_back = hold_back(marker)
-- A new wait (mode 1) for a free lock with no live waiter (a queue of dead entries
-- only, when the check above found one): queueing it would make it the head and grant
-- it at once. It takes the lock without writing the queue: the same outcome (the
-- script is atomic, nobody sees the difference). An entry of this wait already queued
-- by a call whose reply was lost is either live (then it is the head: not nil) or pruned.
if mode == '1' and held_back <= 0 and redis.call('EXISTS', lock) == 0 and prune(q, x) == nil then
  return {1, take(lock, fence, marker, owner, entry, ttl, delay, grant_prefix)}
end
local me = entry .. ' ' .. owner
if mode ~= '0' then
  local expiry = entry_value(ttl)
  if redis.call('HEXISTS', x, me) == 1 then
    redis.call('HSET', x, me, expiry)
  elseif mode == '2' then
    return {2}
  else
    redis.call('RPUSH', q, me)
    redis.call('HSET', x, me, expiry)
  end
  keep_queue(q, x, ttl)
end
if redis.call('EXISTS', lock) == 1 then
  return {0, redis.call('PTTL', lock)}
end
if held_back > 0 then
  return {0, held_back}
end
local head = prune(q, x)
if head == nil then
  return {1, take(lock, fence, marker, owner, '0', ttl, delay, grant_prefix)}
end
if mode ~= '0' and head == me then
  redis.call('LPOP', q)
  redis.call('HDEL', x, me)
  return {1, take(lock, fence, marker, owner, entry, ttl, delay, grant_prefix)}
end
return {0, tonumber(grant_head(lock, q, x, fence, marker, grant_prefix))}
)lua";
}  // namespace

const Script& queue_acquire_script() {
  static const Script& s = *new Script(
      script_of(kRedisTransport, {kTimePart, kTakePart, kQueueAcquireFast, kQueuePart, kQueueAcquireRest}));
  return s;
}

const Script& cluster_queue_acquire_script() {
  static const Script& s = *new Script(
      script_of(kClusterTransport, {kTimePart, kTakePart, kQueueAcquireFast, kQueuePart, kQueueAcquireRest}));
  return s;
}

namespace {
// The release script up to its uncontended path (nobody queued), which needs only drop_lock.
constexpr const char* kQueueReleaseFast = R"lua(
local lock, q, x, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, channel, grant_prefix = ARGV[1], ARGV[2], ARGV[3]
if redis.call('HEXISTS', lock, owner) == 0 then
  return -1
end
-- A normal release: the holder's lock-delay is off (its marker goes with the lock, in
-- one DEL), the next waiter gets it at once. With nobody queued (no queue key: Redis
-- deletes an empty list) the lock is left free; this LINDEX is the one prune would make
-- first in grant_head, which would find nothing to hand on.
drop_lock(lock, marker_of(1, lock), grant_prefix, owner, 'released', true)
if not redis.call('LINDEX', q, 0) then
  send_released(channel)
  return 0
end
)lua";
// The rest of the release script, after the queue's functions: as release_onward after
// its drop_lock (the marker is gone). prune reads the queue's head again.
constexpr const char* kQueueReleaseRest = R"lua(
if not grant_head(lock, q, x, fence, nil, grant_prefix) then
  send_released(channel)
end
return 0
)lua";
}  // namespace

const Script& queue_release_script() {
  static const Script& s = *new Script(script_of(
      kRedisTransport, {kDropPart, kQueueReleaseFast, kTimePart, kTakePart, kQueuePart, kQueueReleaseRest}));
  return s;
}

const Script& cluster_queue_release_script() {
  static const Script& s =
      *new Script(script_of(kClusterTransport, {kDropPart, kQueueReleaseFast, kTimePart, kTakePart,
                                                kQueuePart, kQueueReleaseRest}));
  return s;
}

namespace {
constexpr const char* kQueueCancelBody = R"lua(
local lock, q, x, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, entry, channel, grant_prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if redis.call('HGET', lock, owner) == entry then
  release_onward(lock, q, x, fence, marker_of(1, lock), grant_prefix, channel, owner, 'released')
  return 1
end
local me = entry .. ' ' .. owner
if redis.call('HDEL', x, me) == 1 then
  redis.call('LREM', q, 1, me)
end
return 0
)lua";
}  // namespace

const Script& queue_cancel_script() {
  static const Script& s = *new Script(script_of(
      kRedisTransport, {kTimePart, kTakePart, kDropPart, kQueuePart, kReleaseOnwardPart, kQueueCancelBody}));
  return s;
}

const Script& cluster_queue_cancel_script() {
  static const Script& s =
      *new Script(script_of(kClusterTransport, {kTimePart, kTakePart, kDropPart, kQueuePart,
                                                kReleaseOnwardPart, kQueueCancelBody}));
  return s;
}

const Script& revoke_script() {
  static const Script& s = *new Script(std::string(change_event_lua()) + R"lua(
local lock, note_key, note, life, base, shard = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local fields = redis.call('HGETALL', lock)
local owner, token = nil, ''
for i = 1, #fields, 2 do
  if fields[i] == '@token' then
    token = fields[i + 1]
  elseif string.sub(fields[i], 1, 1) ~= '@' then
    owner = fields[i]
  end
end
if not owner then
  return {0}
end
redis.call('SET', note_key, token .. '\n' .. owner .. '\n' .. note, 'PX', life)
-- The holder's record goes (its next renewal is refused), the key stays until its own
-- expiry: the server lease the holder's local deadline was computed against. Nobody is
-- granted before then, as after a holder that died; then the queue's refresh (redis://)
-- or a waiter's retry (redis+cluster://) takes it. Handing on now would give the lock away
-- while the holder still counts it held.
redis.call('HDEL', lock, owner)
-- A watch is told, as by the lock scripts' event(): redis:// passes "<prefix>:" (ARGV[3]),
-- redis+cluster:// "" and the slot's sharded events channel (ARGV[4]).
publish_change(base, shard, 'revoked', token, owner, lock)
return {1, token, owner}
)lua");
  return s;
}

namespace {
constexpr const char* kQueueForgetBody = R"lua(
local lock, q, x, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, token, channel, grant_prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- Every queue entry of the owner ("<entry digits> <owner>") goes first: the lock
-- is then never handed to the owner that lost it.
local tail = ' ' .. owner
local members = redis.call('HKEYS', x)
for i = 1, #members do
  local m = members[i]
  if #m > #tail and string.sub(m, -#tail) == tail and string.match(string.sub(m, 1, #m - #tail), '^%d+$') then
    redis.call('HDEL', x, m)
    redis.call('LREM', q, 0, m)
  end
end
if redis.call('HEXISTS', lock, owner) == 1 and redis.call('HGET', lock, '@token') == token then
  release_onward(lock, q, x, fence, marker_of(1, lock), grant_prefix, channel, owner, 'lost')
  return 1
end
return 0
)lua";
}  // namespace

const Script& queue_forget_script() {
  static const Script& s = *new Script(script_of(
      kRedisTransport, {kTimePart, kTakePart, kDropPart, kQueuePart, kReleaseOnwardPart, kQueueForgetBody}));
  return s;
}

const Script& cluster_queue_forget_script() {
  static const Script& s =
      *new Script(script_of(kClusterTransport, {kTimePart, kTakePart, kDropPart, kQueuePart,
                                                kReleaseOnwardPart, kQueueForgetBody}));
  return s;
}

namespace {
constexpr const char* kQueueRefreshBody = R"lua(
local grant_prefix = ARGV[1]
local out = {}
for i = 1, #KEYS / KPER do
  local at = KPER * (i - 1)
  local lock, q, x, fence = KEYS[at + 1], KEYS[at + 2], KEYS[at + 3], KEYS[at + 4]
  local owner, entry, ttl = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local me = entry .. ' ' .. owner
  if redis.call('HEXISTS', x, me) == 1 then
    redis.call('HSET', x, me, entry_value(ttl))
    keep_queue(q, x, ttl)
    -- A free lock with live waiters (a grant to a dead waiter lapsed, or a holder
    -- expired): the head gets it now, not at some waiter's re-check.
    if redis.call('EXISTS', lock) == 0 then
      grant_head(lock, q, x, fence, marker_of(at + 1, lock), grant_prefix)
    end
  end
  if redis.call('HEXISTS', x, me) == 1 then
    out[i] = 0
  elseif redis.call('HGET', lock, owner) == entry then
    -- Granted: reported, not claimed. The waiter's own acquire call claims it (the
    -- lease counts from that call's send); until then the grant keeps a claim window
    -- from now, so a waiter that dies after this refresh holds it no longer. A lease
    -- already claimed (a refresh sent before the claim) is never shortened.
    local window = math.min(tonumber(ttl), CLAIM)
    if redis.call('PTTL', lock) < window then redis.call('PEXPIRE', lock, window) end
    out[i] = redis.call('HGET', lock, '@token')
  else
    out[i] = 2
  end
end
return out
)lua";
}  // namespace

const Script& queue_refresh_script() {
  static const Script& s =
      *new Script(script_of(kRedisTransport, {kTimePart, kTakePart, kQueuePart, kQueueRefreshBody}));
  return s;
}

const Script& cluster_queue_refresh_script() {
  static const Script& s =
      *new Script(script_of(kClusterTransport, {kTimePart, kTakePart, kQueuePart, kQueueRefreshBody}));
  return s;
}

const Script& queue_status_script() {
  static const Script& s = *new Script(std::string(kReplicateEffects) + kTimePart + R"lua(
local lock, x, q = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms()
local held = {}
if redis.call('TYPE', lock).ok == 'hash' then held = redis.call('HGETALL', lock) end
-- The live waiters in queue order (the order grant_head hands the lock on in):
-- "<entry> <owner>" members whose expiry has not passed. Nothing is written.
local waiting = {}
local members = {}
if redis.call('TYPE', q).ok == 'list' then members = redis.call('LRANGE', q, 0, -1) end
for i = 1, #members do
  local v = redis.call('HGET', x, members[i])
  local exp = v and string.match(v, '^(%d+):')
  if exp and tonumber(exp) > now then
    local sp = string.find(members[i], ' ', 1, true)
    if sp then waiting[#waiting + 1] = string.sub(members[i], sp + 1) end
  end
end
return {held, redis.call('PTTL', lock), #waiting, waiting}
)lua");
  return s;
}

namespace {
Error malformed_acquire_reply(std::string what) {
  return {make_error_code(errc::protocol_error),
          "unexpected reply to the acquire script: " + std::move(what)};
}
}  // namespace

AcquireReply read_acquire_reply(const redisReply* r, Error& ec) {
  AcquireReply out;
  if (r == nullptr) {
    ec = malformed_acquire_reply("no reply");
    return out;
  }
  if (r->type == REDIS_REPLY_ERROR) {
    ec = Error(error_code_of(r), "acquire script: " + std::string(reply_str(r)));
    return out;
  }
  if (r->type != REDIS_REPLY_ARRAY) {
    ec = malformed_acquire_reply("not an array (reply type " + std::to_string(r->type) + ")");
    return out;
  }
  std::uint64_t flag = 0;
  if (r->elements < 1 || !to_u64(r->element[0], flag) || flag > 2) {
    ec = malformed_acquire_reply("its first element is not 0, 1 or 2");
    return out;
  }
  const std::size_t want = flag == 2 ? 1 : 2;
  if (r->elements != want) {
    ec = malformed_acquire_reply(std::to_string(r->elements) + " elements for flag " + std::to_string(flag) +
                                 ", not " + std::to_string(want));
    return out;
  }
  if (flag == 2) {
    out.kind = AcquireReply::Kind::gone;
    return out;
  }
  if (flag == 1) {
    if (!to_u64(r->element[1], out.token)) {
      ec = malformed_acquire_reply("the token is not a non-negative integer");
      out.token = 0;
      return out;
    }
    out.kind = AcquireReply::Kind::acquired;
    return out;
  }
  const redisReply* pttl = r->element[1];
  if (pttl == nullptr || pttl->type != REDIS_REPLY_INTEGER || pttl->integer < -2) {
    ec = malformed_acquire_reply("the holder's pttl is not an integer of at least -2");
    return out;
  }
  if (pttl->integer > 0) out.holder_ttl = std::chrono::milliseconds(pttl->integer);
  return out;
}

QueueAnswer answer_of(const AcquireReply& reply, std::chrono::milliseconds ttl) {
  QueueAnswer a;
  switch (reply.kind) {
    case AcquireReply::Kind::gone: a.gone = true; break;
    case AcquireReply::Kind::acquired:
      a.result.acquired = true;
      a.result.token = reply.token;
      a.result.validity = ttl;
      break;
    case AcquireReply::Kind::busy: a.result.holder_ttl = reply.holder_ttl; break;
  }
  return a;
}

}  // namespace distlock::detail::redis
