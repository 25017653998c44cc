// The Lua scripts each Redis master runs for Redlock (one atomic step per
// master and request). A lock key holds its owner id and expires by PX; nothing
// else is stored: independent masters cannot agree on a fencing counter.
//
// The SHA-1 constants are the digests of the bodies (the test redlock_test checks
// them against SCRIPT LOAD); if a body changes, update its digest.
//
// Thread-safety: constants.
//
// Example:
//   Command c = script_command(kAcquireScript, keys, args);  // EVALSHA, EVAL on NOSCRIPT
#pragma once

#include "redlock/fanout.hpp"

namespace distlock::detail::redlock {

/// KEYS[1] lock key; ARGV[1] owner, ARGV[2] ttl ms.
/// Takes the key if free (or already this owner's) for ttl: {1, 0}; else {0, pttl}.
inline constexpr Script kAcquireScript{
    R"lua(local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
)lua",
    "181b4a8c7920e218a5a48cdb7f3c1008d6767a6e"};

/// KEYS[1] lock key, KEYS[2] release channel; ARGV[1] owner.
/// Deletes the key only if this owner holds it and announces it: 1; else 0.
inline constexpr Script kReleaseScript{
    R"lua(if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], 'released')
  return 1
end
return 0
)lua",
    "a126899f0944469d3fb2d078bfb4faaca5f5af2b"};

/// KEYS[1] lock key, KEYS[2] revoke note key, KEYS[3] release channel (unused); ARGV[1]
/// note, ARGV[2] note life ms. Backend::revoke on one master: whoever holds the key loses
/// it (its value becomes "@revoked", which no owner renews, for the key's remaining life:
/// nobody is granted the lock before the revoked holder's lease runs out, docs/design.md
/// "Revoke"), and the note "0\n<owner>\n<note>" is stored (no token: Redlock has none):
/// {1, owner}; {0} when the key was not held (nothing written).
inline constexpr Script kRevokeScript{
    R"lua(local v = redis.call('GET', KEYS[1])
if v == false or string.sub(v, 1, 1) == '@' then
  return {0}
end
redis.call('SET', KEYS[2], '0\n' .. v .. '\n' .. ARGV[1], 'PX', ARGV[2])
local left = redis.call('PTTL', KEYS[1])
if left > 0 then
  redis.call('SET', KEYS[1], '@revoked', 'PX', left)
else
  redis.call('DEL', KEYS[1])
end
return {1, v}
)lua",
    "6a74df6f930f9f979848ea9294d76fe0feb61dd3"};

/// KEYS[i] lock keys; ARGV[2i-1] owner, ARGV[2i] ttl ms of key i.
/// Extends each key this owner holds: an array of 1 (extended) / 0 (not ours).
inline constexpr Script kRenewScript{
    R"lua(local out = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
)lua",
    "1625ed64232f65b81a1fe8a9410e286b5ca26f4f"};

/// KEYS[1] lock key: {holder or nil, pttl}.
inline constexpr Script kStatusScript{
    R"lua(return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
)lua",
    "2170fc65895d14f2eac3a77defa9568bea1a34a5"};

/// KEYS[1] record key; ARGV[1] value. Stores the value unless the key exists and
/// returns the value the master holds after the call (the existing one, or ARGV[1]).
inline constexpr Script kPutIfAbsentScript{
    R"lua(local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
)lua",
    "9213b607991a5cc94e88a4d9f373c1abd1c16c08"};

}  // namespace distlock::detail::redlock
