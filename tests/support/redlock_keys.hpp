// The keys a redlock:// master holds for a lock name under the default prefix, spelled out as
// docs/redlock.md documents them (not derived from the backend's code, so a test that reads
// them checks that layout too):
//
//   redlock_lock_key(name)    "distlock:redlock:lock:<name>", the lock's key
//   redlock_marker_key(name)  "distlock:redlock:delay:<name>", its lock-delay marker
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace distlock::testing {

inline std::string redlock_lock_key(std::string_view name) {
  return "distlock:redlock:lock:" + std::string(name);
}

inline std::string redlock_marker_key(std::string_view name) {
  return "distlock:redlock:delay:" + std::string(name);
}

}  // namespace distlock::testing
