// What a backend's servers still hold once every client is gone, checked the same way by the
// suites that run over many backends (tests/conformance, tests/shard_group):
//
//   expect_no_leftovers(leftovers, limit, where)   waits (at most `limit`, this process's steady
//                                                  clock) until `leftovers()` lists nothing; else
//                                                  fails the test listing what is left
//
// `leftovers` is a Target's (support/backend_targets.hpp) or a cluster's own listing: one line
// a thing left (a key, a node, a row, a session).
//
// Thread-safety: uses only its arguments.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "support/eventually.hpp"

namespace distlock::testing {

inline void expect_no_leftovers(const std::function<std::vector<std::string>()>& leftovers,
                                std::chrono::milliseconds limit, const std::string& where = "server") {
  std::vector<std::string> left;
  const bool clean = eventually(
      [&] {
        left = leftovers();
        return left.empty();
      },
      limit);
  std::string all;
  for (auto& l : left) all += "\n  " + l;
  EXPECT_TRUE(clean) << "left on the " << where << ":" << all;
}

}  // namespace distlock::testing
