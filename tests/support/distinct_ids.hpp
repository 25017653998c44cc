// What the id generators' tests check on the ids they were handed out, and how they take
// them from several threads at once:
//
//   ids_from_threads(gen, threads, each)
//                                   `threads` threads share `gen`, each calling gen.next()
//                                   `each` times: the ids of each thread, in the order it
//                                   got them
//   expect_no_id_twice(all)         no value occurs twice in `all`
//   expect_runs_sorted_and_distinct(runs)
//                                   each run (one thread's or one generator's ids, in the
//                                   order they came) is sorted, and no value occurs twice
//                                   across all runs
//
// Thread-safety: each call uses only its arguments (ids_from_threads: `gen` must be safe to
// share between threads, as the generators under test are).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

namespace distlock::testing {

template <class Generator>
auto ids_from_threads(Generator& gen, int threads, int each) {
  std::vector<std::vector<decltype(gen.next())>> got(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      got[t].reserve(each);
      for (int i = 0; i < each; ++i) got[t].push_back(gen.next());
    });
  }
  for (auto& th : pool) th.join();
  return got;
}

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
