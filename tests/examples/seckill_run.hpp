// Test support for the seckill example: run the program as a user would and read the
// JSON summary it prints as its last line.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "examples/example_run.hpp"

namespace distlock::testing {

using SaleRun = ExampleRun;

/// Runs the seckill program with `args` (and `env` added to its environment).
inline SaleRun run_seckill(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv{DISTLOCK_SECKILL_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_example(argv, env);
}

/// A correct sale: exit 0, the books balance, `sold` sold and `left` left.
inline void expect_balanced_sale(const SaleRun& r, const std::string& url, long sold, long left) {
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(r.summary.is_object()) << "last line is not a JSON object:\n" << r.output;
  EXPECT_EQ(r.summary.at("url"), url);
  EXPECT_EQ(r.summary.at("mode"), "lock") << r.output;
  EXPECT_EQ(r.summary.at("sold"), sold) << r.output;
  EXPECT_EQ(r.summary.at("stock_left"), left) << r.output;
  EXPECT_EQ(r.summary.at("oversold"), 0) << r.output;
  EXPECT_EQ(r.summary.at("duplicate_buyers"), 0) << r.output;
  EXPECT_EQ(r.summary.at("fence_rejected"), 0) << r.output;
  EXPECT_EQ(r.summary.at("errors"), 0) << r.output;
  EXPECT_EQ(r.summary.at("ok"), true) << r.output;
  EXPECT_EQ(r.summary.at("sold").get<long>() + r.summary.at("stock_left").get<long>(),
            r.summary.at("stock").get<long>())
      << r.output;
  EXPECT_NE(r.output.find("OK: no overselling"), std::string::npos) << r.output;
}

/// A broken sale (--no-lock, --lock-per-buyer): caught — exit 1, items sold that the
/// stock never had (sold + left > stock), reported as a violation.
inline void expect_caught(const SaleRun& r, const std::string& mode) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  ASSERT_TRUE(r.summary.is_object()) << "last line is not a JSON object:\n" << r.output;
  EXPECT_EQ(r.summary.at("mode"), mode) << r.output;
  EXPECT_EQ(r.summary.at("fenced"), false) << r.output;
  EXPECT_EQ(r.summary.at("errors"), 0) << r.output;
  EXPECT_EQ(r.summary.at("ok"), false) << r.output;
  const long oversold = r.summary.at("oversold"), sold = r.summary.at("sold"),
             left = r.summary.at("stock_left"), stock = r.summary.at("stock");
  EXPECT_GT(oversold, 0) << r.output;
  EXPECT_EQ(oversold, sold + left - stock) << r.output;
  EXPECT_NE(r.output.find("VIOLATION: oversold by"), std::string::npos) << r.output;
}

/// The buyer layouts every broken mode must be caught with: two processes of one thread,
/// one process of several threads, several of several.
struct Layout {
  int processes;
  int threads;
};
inline const std::vector<Layout>& layouts() {
  static const std::vector<Layout> l{{2, 1}, {1, 2}, {1, 8}, {2, 4}};
  return l;
}

inline std::vector<std::string> with_layout(std::vector<std::string> args, Layout l) {
  args.insert(args.end(),
              {"--processes", std::to_string(l.processes), "--threads", std::to_string(l.threads)});
  return args;
}

/// Runs the sale with `base` and each broken mode (--no-lock, --lock-per-buyer) `runs` times
/// in each layout of `ls`: every run must be caught (expect_caught), not now and then.
inline void expect_every_broken_run_caught(const std::vector<std::string>& base,
                                           const std::vector<Layout>& ls, int runs) {
  for (const std::string mode : {"no-lock", "lock-per-buyer"}) {
    for (const Layout& l : ls) {
      for (int run = 0; run < runs; ++run) {
        SCOPED_TRACE("--" + mode + " --processes " + std::to_string(l.processes) + " --threads " +
                     std::to_string(l.threads) + ", run " + std::to_string(run + 1));
        std::vector<std::string> args = base;
        args.push_back("--" + mode);
        expect_caught(run_seckill(with_layout(args, l)), mode);
      }
    }
  }
}

}  // namespace distlock::testing
