// seckill end to end: the flash sale on the host-local backend and on a real
// redis-server, checked through the JSON summary it prints as its last line and
// through the store itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "examples/seckill_run.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;

void expect_clean_sale(const SaleRun& r, const std::string& url, long sold, long left) {
  expect_balanced_sale(r, url, sold, left);
  if (!r.summary.is_object()) return;
  EXPECT_GT(r.summary.at("requests_per_s").get<double>(), 0.0);
  EXPECT_GE(r.summary.at("wait_p99_us").get<double>(), r.summary.at("wait_p50_us").get<double>());
  for (const char* key :
       {"url", "sold", "stock_left", "oversold", "duplicate_buyers", "requests_per_s", "wait_p50_us",
        "wait_p99_us", "mode", "fenced", "fence_rejected", "stock", "requests", "processes", "threads",
        "think_us", "sold_out_requests", "errors", "ok"}) {
    EXPECT_TRUE(r.summary.contains(key)) << key;
  }
  // The human summary comes first.
  EXPECT_NE(r.output.find("sold " + std::to_string(sold) + " of"), std::string::npos) << r.output;
}

TEST(Seckill, DefaultsOnTheFileBackend) {
  TempDir dir;
  const std::string url = "file://" + dir.path().string();
  SaleRun r = run_seckill({"--url", url});
  expect_clean_sale(r, url, 300, 0);
  // The books on disk agree: 300 buyer lines, stock file says 0.
  const std::string buyers = read_file((dir.path() / "seckill-data" / "seckill.buyers").string());
  EXPECT_EQ(std::count(buyers.begin(), buyers.end(), '\n'), 300);
  EXPECT_EQ(read_file((dir.path() / "seckill-data" / "seckill.stock").string()), "0\n");
}

TEST(Seckill, DefaultsOnRedis) {
  RedisServer redis;
  SaleRun r = run_seckill({"--url", redis.url()});
  expect_clean_sale(r, redis.url(), 300, 0);
  auto stock = redis.command({"GET", "{seckill}:stock"});
  ASSERT_EQ(stock->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(stock->str, stock->len), "0");
  EXPECT_EQ(redis.command({"LLEN", "{seckill}:buyers"})->integer, 300);
  // Every sale went through the fence: it holds the last holder's token.
  EXPECT_EQ(redis.command({"EXISTS", "{seckill}:stock:distlock-fence"})->integer, 1);
  // A second sale on the same server starts from fresh stock and still balances.
  SaleRun again = run_seckill(
      {"--url", redis.url(), "--stock", "40", "--requests", "60", "--processes", "3", "--threads", "4"});
  expect_clean_sale(again, redis.url(), 40, 0);
}

TEST(Seckill, MoreStockThanRequestsLeavesTheRest) {
  TempDir dir;
  const std::string url = "file://" + dir.path().string();
  SaleRun r =
      run_seckill({"--url", url, "--stock", "50", "--requests", "20", "--processes", "3", "--threads", "2"});
  expect_clean_sale(r, url, 20, 30);
}

TEST(Seckill, WithoutUrlUsesTheEmbeddedDefault) {
  TempDir dir;
  const std::string url = "file://" + dir.path().string();
  SaleRun r = run_seckill({"--stock", "30", "--requests", "40"}, {"DISTLOCK_URL=" + url});
  expect_clean_sale(r, url, 30, 0);
}

TEST(Seckill, InProcessMemoryBackend) {
  SaleRun r = run_seckill(
      {"--url", "memory://seckill-test", "--processes", "1", "--stock", "100", "--requests", "150"});
  expect_clean_sale(r, "memory://seckill-test", 100, 0);
}

TEST(Seckill, BadArgumentsAreRejected) {
  SaleRun mem = run_seckill({"--url", "memory://x", "--processes", "2"});
  EXPECT_EQ(mem.exit_code, 2) << mem.output;
  EXPECT_NE(mem.output.find("--processes 1"), std::string::npos) << mem.output;
  SaleRun neg = run_seckill({"--stock", "-1"});
  EXPECT_NE(neg.exit_code, 0) << neg.output;
  SaleRun bad_url = run_seckill({"--url", "nosuch://x", "--processes", "1"});
  EXPECT_EQ(bad_url.exit_code, 1) << bad_url.output;
  EXPECT_NE(bad_url.output.find("nosuch"), std::string::npos) << bad_url.output;
}

TEST(Seckill, RedisDownIsAFailureNotASale) {
  const auto port = free_port();
  SaleRun r = run_seckill({"--url", "redis://127.0.0.1:" + std::to_string(port) + "?timeout=300ms",
                           "--processes", "1", "--requests", "5"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(std::to_string(port)), std::string::npos) << r.output;
}

// ---- a broken lock is caught, every run, with any number of buyers ----------------
//
// The purchase is read -> think -> write with nothing but the lock between the read and
// the write, so two buyers not excluded by the lock read the same stock and both sell
// it. Each layout runs several times: the race must be caught on every run, not now and
// then (docs/design.md, "The flash-sale example", has the argument).

constexpr int kRuns = 2;

// The broken modes with 40 items and 80 requests, kRuns times in each layout of `ls`.
void expect_every_broken_run_caught(std::vector<std::string> base, const std::vector<Layout>& ls) {
  base.insert(base.end(), {"--stock", "40", "--requests", "80"});
  expect_every_broken_run_caught(base, ls, kRuns);
}

void expect_every_locked_run_balanced(const std::vector<std::string>& base, const std::string& url,
                                      const std::vector<Layout>& ls) {
  for (const bool fence : {true, false}) {
    for (const Layout& l : ls) {
      SCOPED_TRACE(std::string(fence ? "fenced" : "--no-fence") + " --processes " +
                   std::to_string(l.processes) + " --threads " + std::to_string(l.threads));
      std::vector<std::string> args = base;
      args.insert(args.end(), {"--stock", "40", "--requests", "80"});
      if (!fence) args.push_back("--no-fence");
      SaleRun r = run_seckill(with_layout(args, l));
      expect_balanced_sale(r, url, 40, 0);
      if (r.summary.is_object()) {
        EXPECT_EQ(r.summary.at("fenced"), fence) << r.output;
      }
    }
  }
}

TEST(Seckill, BrokenLockIsCaughtEveryRunOnTheFileBackend) {
  TempDir dir;
  const std::string url = "file://" + dir.path().string();
  expect_every_broken_run_caught({"--url", url}, layouts());
  // And with the defaults (2 processes x 8 threads, 300 items, 500 requests).
  for (const std::string mode : {"no-lock", "lock-per-buyer"}) {
    expect_caught(run_seckill({"--url", url, "--" + mode}), mode);
  }
}

TEST(Seckill, BrokenLockIsCaughtEveryRunOnRedis) {
  RedisServer redis;
  expect_every_broken_run_caught({"--url", redis.url()}, layouts());
  for (const std::string mode : {"no-lock", "lock-per-buyer"}) {
    expect_caught(run_seckill({"--url", redis.url(), "--" + mode}), mode);
  }
}

TEST(Seckill, BrokenLockIsCaughtEveryRunInProcessMemory) {
  expect_every_broken_run_caught({"--url", "memory://seckill-broken"}, {{1, 2}, {1, 8}});
}

TEST(Seckill, TheLockAloneKeepsTheBooksWithTheSameLayoutsOnTheFileBackend) {
  TempDir dir;
  const std::string url = "file://" + dir.path().string();
  expect_every_locked_run_balanced({"--url", url}, url, layouts());
}

TEST(Seckill, TheLockAloneKeepsTheBooksWithTheSameLayoutsOnRedis) {
  RedisServer redis;
  expect_every_locked_run_balanced({"--url", redis.url()}, redis.url(), layouts());
  // Unfenced writes leave no fence behind; fenced ones do (checked in DefaultsOnRedis).
  EXPECT_EQ(redis.command({"EXISTS", "{seckill}:stock:distlock-fence"})->integer, 0);
}

TEST(Seckill, TheLockAloneKeepsTheBooksInProcessMemory) {
  expect_every_locked_run_balanced({"--url", "memory://seckill-ok"}, "memory://seckill-ok", {{1, 2}, {1, 8}});
}

TEST(Seckill, BrokenModesNeedTwoBuyers) {
  TempDir dir;
  const std::string url = "file://" + dir.path().string();
  for (const std::string mode : {"--no-lock", "--lock-per-buyer"}) {
    SaleRun one = run_seckill({"--url", url, mode, "--processes", "1", "--threads", "1"});
    EXPECT_EQ(one.exit_code, 2) << one.output;
    EXPECT_NE(one.output.find(">= 2"), std::string::npos) << one.output;
  }
  SaleRun both = run_seckill({"--url", url, "--no-lock", "--lock-per-buyer"});
  EXPECT_EQ(both.exit_code, 2) << both.output;
}

}  // namespace

}  // namespace distlock::testing
