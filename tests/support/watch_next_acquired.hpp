// Test support: the check, written once for every backend's watch tests, that the next change
// a watch reports is the `acquired` of a lease the test has just taken.
//
// Thread-safety: as Watch::next (one reader of the watch at a time).
#pragma once

#include <gtest/gtest.h>

#include "distlock/distlock.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {

/// Fails (fatally) unless the next change of `w` within `limit` is `acquired` with the token of
/// `lease`.
inline void expect_next_acquired(Watch& w, const Lease& lease, Millis limit = std::chrono::seconds(10)) {
  const auto e = next_change(w, limit);
  ASSERT_TRUE(e) << "no change reported within " << limit.count() << " ms after \"" << lease.name()
                 << "\" was acquired";
  ASSERT_EQ(e->kind, WatchEventKind::acquired) << describe(*e);
  ASSERT_EQ(e->token, lease.token()) << describe(*e);
}

}  // namespace distlock::testing
