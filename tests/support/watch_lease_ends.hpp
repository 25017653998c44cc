// How a prefix watch (`Client::watch`) reports the end of a lease it has seen taken, as the
// watch tests of every backend check it (each call inside ASSERT_NO_FATAL_FAILURE):
//
//   expect_release_reported(w, lease)      `lease` released; the next change is its `released`
//   expect_revoke_then_nothing(w, holder, admin, name, quiet_for)
//                                          `holder` takes `name`, `admin` revokes it: `revoked`,
//                                          the holder told, then no change for `quiet_for`
//
// Every wait is bounded on the steady clock (next_change); none sleeps.
// Thread-safety: each call reads and writes only its arguments (a `Watch` is read by one thread).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {

/// `lease` (whose `acquired` `w` has already reported) is released; the next change of `w`,
/// within 10 s, is its `released` with the lease's token.
inline void expect_release_reported(Watch& w, Lease& lease) {
  const std::uint64_t token = lease.token();
  lease.release();
  auto rel = next_change(w, Millis(10000));
  ASSERT_TRUE(rel);
  EXPECT_EQ(rel->kind, WatchEventKind::released) << describe(*rel);
  EXPECT_EQ(rel->token, token);
}

/// `holder` takes `name` (TTL 2 s, waiting up to 60 s) under the prefix `w` watches; `admin`
/// revokes it: the watch reports `acquired` then `revoked` and the holder is told
/// (expect_revoke_reported), its lease no longer owns(), and `w` reports no other change
/// within `quiet_for`.
inline void expect_revoke_then_nothing(Watch& w, Client& holder, Client& admin, const std::string& name,
                                       Millis quiet_for) {
  Lease l = holder.acquire(name, ttl_of(Millis(2000), Millis(60000)));
  ASSERT_NO_FATAL_FAILURE(expect_revoke_reported(w, admin, l, name));
  EXPECT_FALSE(l.owns());
  auto more = next_change(w, quiet_for);
  EXPECT_FALSE(more) << describe(*more);
}

}  // namespace distlock::testing
