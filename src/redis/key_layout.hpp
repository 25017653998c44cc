// redis/key_layout.hpp — the keys and channels of redis:// and redis+sentinel:// for
// one prefix (docs/redis.md "Keys").
//
// The layout is injective: no (prefix, kind, name) gives the key of another. A prefix
// has no '{' or '}' (redis_prefix_ok), so the first '{' of a key ends "<prefix>:" and
// names the prefix; what follows is "{<name>}" and a suffix that names the kind by
// its last byte: "" (lock, ends '}'), ":q", ":qx", ":record", ":fence", ":delay" (a lost
// holder's lock-delay marker, redis/lock_scripts.hpp; the scripts derive it from the lock
// key as delay_key() does), ":rv" (the note of the last revoke of the lock, Backend::revoke;
// it expires), and "<prefix>:watching" (the watcher-presence key: the one key with no '{',
// so it is no key of any name). The fence
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

/// "<prefix>:{<name>}:delay": the lock-delay marker of the lock `lock` (a key of lock_key()),
/// in its hash slot. The Lua scripts derive it the same way (lock .. ':delay').
inline std::string delay_key(std::string_view lock) {
  return std::string(lock) + ":delay";
}

/// "<prefix>:{<key>}:record"
inline std::string record_key(std::string_view prefix, std::string_view key) {
  return lock_key(prefix, key) + ":record";
}

/// "<prefix>:{<name>}:rv": the note of the last revoke of lock `name`, in the lock's slot.
inline std::string revoke_note_key(std::string_view prefix, std::string_view name) {
  return lock_key(prefix, name) + ":rv";
}

/// "<prefix>:watching": exists while a watch of the prefix is registered (redis_watch.cpp);
/// the lock scripts publish their changes only then. Its value is the generation: the
/// server's TIME in microseconds when it was last created.
inline std::string watching_key(std::string_view prefix) {
  return std::string(prefix) + ":watching";
}

}  // namespace distlock::detail::redis
