// What the id generators' tests check on the ids they were handed out:
//
//   expect_no_id_twice(all)         no value occurs twice in `all`
//   expect_runs_sorted_and_distinct(runs)
//                                   each run (one thread's or one generator's ids, in the
//                                   order they came) is sorted, and no value occurs twice
//                                   across all runs
//
// Thread-safety: each call uses only its arguments.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace distlock::testing {

template <class T>
void expect_no_id_twice(std::vector<T> all) {
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "an id was handed out twice";
}

template <class T>
void expect_runs_sorted_and_distinct(const std::vector<std::vector<T>>& runs) {
  std::vector<T> all;
  for (const auto& run : runs) {
    EXPECT_TRUE(std::is_sorted(run.begin(), run.end()));
    all.insert(all.end(), run.begin(), run.end());
  }
  expect_no_id_twice(std::move(all));
}

}  // namespace distlock::testing
