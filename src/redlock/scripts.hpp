// The Lua scripts each Redis master runs for Redlock (one atomic step per
// master and request). A lock key holds "<owner>\n<nonce>" (the nonce: 16 hex digits, new per
// acquisition attempt and increasing within a process, redlock_acquire.cpp) and expires by PX.
// Release, renewal, status and revoke go by the owner part (everything before the last "\n<hex>";
// a value without that tail, written by an older version, is all owner); undoing a failed
// attempt compares the whole value, so it can only ever delete that attempt's own key, never
// the key a later attempt of the same owner took (docs/redlock.md "Connections"). A holder with
// lock_delay D also keeps the marker "<prefix>delay:<name>" = "<extra>\n<owner>\n<nonce>" (extra =
// D + 2 x clock_drift(D), quorum.hpp lock_delay_extra) living ttl + extra, moved with the key
// by each renewal and deleted by a normal release only (docs/redlock.md "Lock-delay"); while
// it lives no acquisition takes the key on that master. Nothing else is stored: independent
// masters cannot agree on a fencing counter.
//
// The SHA-1 constants are the digests of the bodies (the test redlock_test checks
// them against SCRIPT LOAD); if a body changes, update its digest.
//
// Thread-safety: constants.
//
// Example:
//   Command c = script_command(kAcquireScript, keys, args);  // EVALSHA, EVAL on NOSCRIPT
#pragma once

#include "redis/records.hpp"
#include "redlock/fanout.hpp"

namespace distlock::detail::redlock {

/// KEYS[1] lock key, KEYS[2] lock-delay marker key; ARGV[1] owner, ARGV[2] ttl ms, ARGV[3]
/// the marker's extra life ms beyond the ttl ("0": this acquisition has no lock-delay), ARGV[4]
/// the attempt's nonce (16 hex digits, new per acquisition attempt, increasing in a process).
/// While a marker lives (a lost holder's lock-delay, docs/redlock.md "Lock-delay") nobody
/// takes the key: {0, marker pttl}. Else takes the key ("<owner>\n<nonce>") for ttl if free, or
/// held by this owner with an earlier attempt's nonce (or none: an older version's value), with
/// the marker "<extra>\n<owner>\n<nonce>" for ttl + extra when extra > 0: {1, 0}; else {0, pttl}
/// (a later attempt's key of this owner included: an earlier attempt that arrives late must
/// not take it over, its clean-up would then delete it).
inline constexpr Script kAcquireScript{
    R"lua(local m = redis.call('PTTL', KEYS[2])
if m > 0 then
  return {0, m}
end
local v = redis.call('GET', KEYS[1])
local take = v == false
if not take then
  local who, n = string.match(v, '^(.*)\n(%x+)$')
  if who == nil then
    take = v == ARGV[1]
  else
    take = who == ARGV[1] and #n == #ARGV[4] and n <= ARGV[4]
  end
end
if take then
  redis.call('SET', KEYS[1], ARGV[1] .. '\n' .. ARGV[4], 'PX', ARGV[2])
  local extra = tonumber(ARGV[3])
  if extra and extra > 0 then
    redis.call('SET', KEYS[2], ARGV[3] .. '\n' .. ARGV[1] .. '\n' .. ARGV[4], 'PX', string.format('%.0f', tonumber(ARGV[2]) + extra))
  end
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
)lua",
    "9a6280641ecab44078ae9ba26ea2ec469f68e685"};

/// KEYS[1] lock key, KEYS[2] release channel, KEYS[3] lock-delay marker key; ARGV[1] owner,
/// ARGV[4] (optional, with modes "0" and "="): the exact key value "<owner>\n<nonce>" of the
/// attempt being undone: the key goes only if it holds exactly that (else it must be held by
/// ARGV[1], the owner part compared); ARGV[2] the mode:
///   "1": a release's first step: the key only; answers 2 instead of 1 where this owner's marker
///        stays beside it (the client deletes it in the second step, "m", only once a quorum
///        confirmed the release: a release that finds the lease gone on a quorum is a loss and
///        keeps every marker; docs/redlock.md "Lock-delay");
///   "0": the key only (a lost lease's hand-back, or undoing an acquisition that wrote no
///        marker: a marker there is somebody's lost lease's);
///   "=": the key, and the marker only if it is exactly ARGV[3] (undoing an attempt with a
///        lock-delay: the marker it wrote, never one of this owner's lost lease);
///   "m": the release's second step: this owner's marker only (not the key): 1 if deleted,
///        announced on the channel unless a key lives there; else 0.
/// Other modes delete the key only if this owner holds it: 1 or 2 (announced on the channel
/// unless a marker still holds the name back there: a waiter woken then would only find it busy,
/// and its own undone attempt would wake the others in turn); else 0.
inline constexpr Script kReleaseScript{
    R"lua(if ARGV[2] == 'm' then
  local m = redis.call('GET', KEYS[3])
  if m and string.match(m, '^%d+\n(.*)\n%x+$') == ARGV[1] then
    redis.call('DEL', KEYS[3])
    if redis.call('EXISTS', KEYS[1]) == 0 then
      redis.call('PUBLISH', KEYS[2], 'released')
    end
    return 1
  end
  return 0
end
local v = redis.call('GET', KEYS[1])
local mine
if ARGV[4] and ARGV[4] ~= '' then
  mine = v == ARGV[4]
else
  mine = v and (string.match(v, '^(.*)\n%x+$') or v) == ARGV[1]
end
if mine then
  redis.call('DEL', KEYS[1])
  local m = redis.call('GET', KEYS[3])
  if m and ARGV[2] == '=' and m == ARGV[3] then
    redis.call('DEL', KEYS[3])
  end
  if redis.call('PTTL', KEYS[3]) <= 0 then
    redis.call('PUBLISH', KEYS[2], 'released')
    return 1
  end
  if ARGV[2] == '1' and m and string.match(m, '^%d+\n(.*)\n%x+$') == ARGV[1] then
    return 2
  end
  return 1
end
return 0
)lua",
    "c327b15fd025fa47d1c97c6c9664964f419bd50c"};

/// KEYS[1] lock key, KEYS[2] revoke note key, KEYS[3] release channel (unused), KEYS[4] lock-delay
/// marker key; ARGV[1] note, ARGV[2] note life ms. Backend::revoke on one master: whoever holds the
/// key loses it (its value becomes "@revoked", which no owner renews, for the key's remaining life:
/// nobody is granted the lock before the revoked holder's lease runs out, docs/design.md
/// "Revoke"), and the note "0\n<owner>\n<note>" is stored (no token: Redlock has none):
/// {1, owner} (the owner part of the key's value, without the attempt's nonce); {0} when the key
/// is not held there (nothing written): no key, or a key beside a live marker (PTTL > 0, as the
/// acquisition reads it) that another acquisition wrote (its "<owner>\n<nonce>" is not the key's
/// value): a fast-path attempt that took the key inside a lost holder's lock-delay, which counts
/// busy there and takes the key back itself (redlock_acquire.cpp; docs/redlock.md "Lock-delay"),
/// and which no renewal counts either (kRenewScript); {2, note or nil} when the key is already
/// "@revoked" (another revoke reached this master first; nothing written): the note that revoke
/// wrote with it, "0\n<owner>\n...", names whose key it took.
inline constexpr Script kRevokeScript{
    R"lua(local v = redis.call('GET', KEYS[1])
if v == false then
  return {0}
end
if string.sub(v, 1, 1) == '@' then
  return {2, redis.call('GET', KEYS[2])}
end
local m = redis.call('GET', KEYS[4])
if m and redis.call('PTTL', KEYS[4]) > 0 and string.match(m, '^%d+\n(.*)$') ~= v then
  return {0}
end
v = string.match(v, '^(.*)\n%x+$') or v
redis.call('SET', KEYS[2], '0\n' .. v .. '\n' .. ARGV[1], 'PX', ARGV[2])
local left = redis.call('PTTL', KEYS[1])
if left > 0 then
  redis.call('SET', KEYS[1], '@revoked', 'PX', left)
else
  redis.call('DEL', KEYS[1])
end
return {1, v}
)lua",
    "6bde17a38b14bdb94b0f1a46fe4dbab98ba030f0"};

/// KEYS[i] (i <= n) lock keys, KEYS[n + i] their lock-delay marker keys; ARGV[2i-1] owner,
/// ARGV[2i] ttl ms of key i. Extends each key this owner holds (the owner part of its value),
/// and its marker when the marker
/// is this owner's ("<extra>\n<owner>\n<nonce>": it then lives ttl + extra from now, so it outlives the
/// lease by its extra): an array of n 1 (extended) / 0 (not ours). A key beside a live marker
/// (PTTL > 0) that another acquisition wrote (its "<owner>\n<nonce>" is not the key's value) is
/// not held there: 0, nothing extended. It is an attempt's key taken inside a lost holder's
/// lock-delay whose take-back did not arrive; no grant counted it and the revoke answers "not
/// held" for it (kRevokeScript), so no renewal may count it either.
inline constexpr Script kRenewScript{
    R"lua(local n = #KEYS / 2
local out = {}
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  local mine = v and (string.match(v, '^(.*)\n%x+$') or v) == ARGV[2 * i - 1]
  local m = mine and redis.call('GET', KEYS[n + i])
  if m and redis.call('PTTL', KEYS[n + i]) > 0 and string.match(m, '^%d+\n(.*)$') ~= v then
    mine = false
  end
  if mine then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    if m then
      local extra, who = string.match(m, '^(%d+)\n(.*)\n%x+$')
      if who == ARGV[2 * i - 1] then
        redis.call('PEXPIRE', KEYS[n + i], string.format('%.0f', tonumber(ARGV[2 * i]) + tonumber(extra)))
      end
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
)lua",
    "013e0fb694bfb115cea60b15bbd8c5d9cf732986"};

/// KEYS[1] lock key, KEYS[2] lock-delay marker key: {value or nil, pttl} (the value
/// "<owner>\n<nonce>": owner_of() takes the owner). {nil, -2}, as for no key, where the key
/// stands beside a live marker (PTTL > 0, as the acquisition reads it) that another acquisition
/// wrote (its "<owner>\n<nonce>" is not the key's value): a fast-path attempt that took the key
/// inside a lost holder's lock-delay, which counts busy there and takes the key back itself; no
/// grant counts such a key, so status and list do not either (the rule kRevokeScript applies;
/// docs/redlock.md "Lock-delay").
inline constexpr Script kStatusScript{
    R"lua(local v = redis.call('GET', KEYS[1])
if v then
  local m = redis.call('GET', KEYS[2])
  if m and redis.call('PTTL', KEYS[2]) > 0 and string.match(m, '^%d+\n(.*)$') ~= v then
    return {false, -2}
  end
end
return {v, redis.call('PTTL', KEYS[1])}
)lua",
    "7df4cb4c3389ce00859c416800b8421bf2815d34"};

/// KEYS[1] record key; ARGV[1] value. Stores the value unless the key exists and
/// returns the value the master holds after the call (the existing one, or ARGV[1]).
inline constexpr Script kPutIfAbsentScript{
    R"lua(local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
)lua",
    "9213b607991a5cc94e88a4d9f373c1abd1c16c08"};

/// PutMode::fenced on one master: redis::kFencedPutLua (redis/records.hpp), the script
/// the other Redis-family backends run. KEYS[1] record key; ARGV[1] value, ARGV[2] its term.
inline constexpr Script kFencedPutScript{redis::kFencedPutLua, "b556529c0c3cf0b2a57b7dc2d2b1fefdd9dec464"};

}  // namespace distlock::detail::redlock
