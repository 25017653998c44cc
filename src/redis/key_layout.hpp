// redis/key_layout.hpp — the keys and channels of redis:// and redis+sentinel:// for
// one prefix (docs/redis.md "Keys").
//
// The layout is injective: no (prefix, kind, name) gives the key of another. A prefix
// has no '{' or '}' (redis_prefix_ok), so the first '{' of a key ends "<prefix>:" and
// names the prefix; what follows is "{<name>}" and a suffix that names the kind by
// its last byte: "" (lock, ends '}'), ":q", ":qx", ":record", ":fence". The fence
// counter of a hash slot is "<prefix>:{<tag>}:fence" (its tag is digits, so the key is
// in that slot). Before, it was "<prefix>:fence:{<tag>}": the lock of name "<tag>"
// under prefix "<prefix>:fence".
//
// Channels (a namespace of their own): "<prefix>:{<name>}:released",
// "<prefix>:grant:<client id>" (the id is hex: no ':' or '{') and "<prefix>:events"
// (every change, for Client::watch; lock_scripts.cpp derives it from the grant prefix).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "redis/slots.hpp"

namespace distlock::detail::redis {

/// "<prefix>:{<name>}"
inline std::string lock_key(std::string_view prefix, std::string_view name) {
  std::string k;
  k.reserve(prefix.size() + name.size() + 3);
  k.append(prefix).append(":{").append(name).append("}");
  return k;
}

/// "<prefix>:{<tag>}:fence": the fence counter of the hash slot of `lock` (a key of
/// lock_key()), shared by every name of that slot.
inline std::string fence_key(std::string_view prefix, std::string_view lock) {
  return std::string(prefix) + ":{" + slot_tag(key_slot(lock)) + "}:fence";
}

/// "<prefix>:{<key>}:record"
inline std::string record_key(std::string_view prefix, std::string_view key) {
  return lock_key(prefix, key) + ":record";
}

}  // namespace distlock::detail::redis
