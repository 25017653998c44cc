// A scene the Redlock revoke and status tests share, on three real masters (masters.hpp): a
// holder with a lock-delay whose lease was lost, so that its markers hold the name back, and a
// waiter without a lock-delay whose fast-path attempt takes the key beside such a marker.
//
//   kLostHolderId, kWaiterId       engine-shaped owner ids of the two
//   lose_holder_with_delay(...)    the lost holder's markers on every master, no key
//   fast_path_beside_marker(...)   what the waiter's attempt sends first to one master
//
// Thread-safety: each function drives the masters from the calling thread only.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "direct_backend.hpp"
#include "engine/backend.hpp"
#include "masters.hpp"
#include "support/redlock_keys.hpp"

namespace distlock::testing {

inline constexpr std::string_view kLostHolderId = "0123456789abcdef0123456789abcdef:1.1|lost";
inline constexpr std::string_view kWaiterId = "fedcba9876543210fedcba9876543210:2.1|waiter";

/// `owner` takes `name` with lock-delay `delay` (TTL 30 s) on every master through a backend of
/// its own, then its lease is lost: the hand-back of a lost lease (Backend::forget) deletes its
/// keys and leaves its markers, which hold the name back for the delay. Fails the test (fatally)
/// unless every master then has the marker and no key.
inline void lose_holder_with_delay(Masters& m, const std::string& name, std::string_view owner,
                                   std::chrono::milliseconds delay) {
  auto lost = make_backend(m.url("timeout=2s"));
  ASSERT_TRUE(lost);
  detail::Error ec;
  ASSERT_TRUE(
      lost->try_acquire(detail::AcquireRequest{name, owner, std::chrono::seconds(30), false, delay}, ec)
          .acquired)
      << ec.message() << " " << ec.detail();
  lost->forget(name, owner, 0);
  for (std::size_t i = 0; i < m.size(); ++i) {
    ASSERT_EQ(m[i].command({"EXISTS", redlock_lock_key(name)})->integer, 0) << "master " << i;
    ASSERT_GT(m[i].command({"PTTL", redlock_marker_key(name)})->integer, 0)
        << "master " << i << " lost the marker";
  }
}

/// Master i runs what a waiter without a lock-delay sends first (redlock_acquire.cpp, the fast
/// path): SET NX GET of `value`, then the marker's PTTL. True when the SET took the key and the
/// marker lives there: that attempt votes busy on master i and takes its key back one round
/// trip later.
inline bool fast_path_beside_marker(Masters& m, std::size_t i, const std::string& name,
                                    const std::string& value) {
  auto set = m[i].command({"SET", redlock_lock_key(name), value, "NX", "GET", "PX", "30000"});
  auto marker = m[i].command({"PTTL", redlock_marker_key(name)});
  return set && set->type == REDIS_REPLY_NIL && marker && marker->type == REDIS_REPLY_INTEGER &&
         marker->integer > 0;
}

}  // namespace distlock::testing
