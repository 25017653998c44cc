// seckill end to end: the flash sale on the host-local backend and on a real
// redis-server, checked through the JSON summary it prints as its last line and
// through the store itself.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::testing::Process;
using distlock::testing::TempDir;

struct SaleRun {
  int exit_code = -1;
  std::string output;
  nlohmann::json summary;  // the last line, parsed (null if it is not JSON)
};

SaleRun run_seckill(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  TempDir dir("distlock-seckill-out");
  const std::string out = (dir.path() / "out").string();
  std::vector<std::string> argv{DISTLOCK_SECKILL_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p = Process::spawn(argv, out, env);
  const int status = p.wait_for(180s);
  SaleRun r;
  r.output = distlock::testing::read_file(out);
  EXPECT_NE(status, -1) << "seckill did not finish in time:\n" << r.output;
  if (status != -1 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  std::string text = r.output;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const std::string last = text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
  r.summary = nlohmann::json::parse(last, nullptr, /*allow_exceptions=*/false);
  return r;
}

void expect_clean_sale(const SaleRun& r, const std::string& url, long sold, long left) {
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(r.summary.is_object()) << "last line is not a JSON object:\n" << r.output;
  EXPECT_EQ(r.summary.at("url"), url);
  EXPECT_EQ(r.summary.at("sold"), sold) << r.output;
  EXPECT_EQ(r.summary.at("stock_left"), left) << r.output;
  EXPECT_EQ(r.summary.at("oversold"), 0) << r.output;
  EXPECT_EQ(r.summary.at("duplicate_buyers"), 0) << r.output;
  EXPECT_GT(r.summary.at("requests_per_s").get<double>(), 0.0);
  EXPECT_GE(r.summary.at("wait_p99_us").get<double>(), r.summary.at("wait_p50_us").get<double>());
  for (const char* key : {"url", "sold", "stock_left", "oversold", "duplicate_buyers", "requests_per_s",
                          "wait_p50_us", "wait_p99_us"}) {
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
  const std::string buyers =
      distlock::testing::read_file((dir.path() / "seckill-data" / "seckill.buyers").string());
  EXPECT_EQ(std::count(buyers.begin(), buyers.end(), '\n'), 300);
  EXPECT_EQ(distlock::testing::read_file((dir.path() / "seckill-data" / "seckill.stock").string()), "0\n");
}

TEST(Seckill, DefaultsOnRedis) {
  distlock::testing::RedisServer redis;
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
  const auto port = distlock::testing::free_port();
  SaleRun r = run_seckill({"--url", "redis://127.0.0.1:" + std::to_string(port) + "?timeout=300ms",
                           "--processes", "1", "--requests", "5"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(std::to_string(port)), std::string::npos) << r.output;
}

}  // namespace

namespace {

// The checks are real: the same sale without the lock (read, then write stock - 1)
// oversells or loses updates, and seckill says so and exits 1.
TEST(Seckill, WithoutTheLockTheChecksCatchOverselling) {
  TempDir dir;
  const std::string url = "file://" + dir.path().string();
  SaleRun r = run_seckill({"--url", url, "--no-lock"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  ASSERT_TRUE(r.summary.is_object()) << r.output;
  const long sold = r.summary.at("sold"), left = r.summary.at("stock_left"),
             oversold = r.summary.at("oversold");
  EXPECT_TRUE(oversold > 0 || sold + left != 300) << r.output;
  EXPECT_NE(r.output.find("VIOLATION"), std::string::npos) << r.output;
}

TEST(Seckill, WithoutTheLockOnRedisToo) {
  distlock::testing::RedisServer redis;
  SaleRun r = run_seckill({"--url", redis.url(), "--no-lock"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  ASSERT_TRUE(r.summary.is_object()) << r.output;
  const long sold = r.summary.at("sold"), left = r.summary.at("stock_left"),
             oversold = r.summary.at("oversold");
  EXPECT_TRUE(oversold > 0 || sold + left != 300) << r.output;
}

}  // namespace
