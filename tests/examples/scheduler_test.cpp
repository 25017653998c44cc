// examples/scheduler end to end: 4 nodes fire a cron job in each of 4 slots through
// `distlock run --once-per`; exactly one run per slot, on file:// and on redis://.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace {

struct Result {
  int status = -1;
  std::string output;
  nlohmann::json summary;
};

Result run_scheduler(const std::string& url, const std::string& dir) {
  Result r;
  const std::string cmd = std::string(DISTLOCK_SCHEDULER_PATH) + " --url '" + url +
                          "' --nodes 4 --ticks 4 --period 700" + " --distlock " + DISTLOCK_CLI_PATH +
                          " --dir '" + dir + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  const auto end = r.output.find_last_not_of('\n');
  const auto start = r.output.rfind('\n', end);
  const std::string last = r.output.substr(start == std::string::npos ? 0 : start + 1, end - start);
  r.summary = nlohmann::json::parse(last, nullptr, false);
  return r;
}

void expect_once_per_slot(const Result& r) {
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_TRUE(r.summary.is_object()) << r.output;
  EXPECT_EQ(r.summary.at("ok"), true) << r.output;
  EXPECT_EQ(r.summary.at("fired"), 16);
  EXPECT_EQ(r.summary.at("runs"), 4) << r.output;
  EXPECT_EQ(r.summary.at("slots_run_once"), 4);
  EXPECT_EQ(r.summary.at("slots_run_twice"), 0);
  EXPECT_EQ(r.summary.at("slots_missed"), 0);
  EXPECT_NE(r.output.find("4 nodes fired 4 slots"), std::string::npos) << r.output;
}

TEST(Scheduler, OncePerSlotOnTheFileBackend) {
  distlock::testing::TempDir dir("distlock-scheduler");
  Result r = run_scheduler("file://" + (dir.path() / "locks").string(), (dir.path() / "work").string());
  expect_once_per_slot(r);
}

TEST(Scheduler, OncePerSlotOnRedis) {
  distlock::testing::RedisServer redis;
  distlock::testing::TempDir dir("distlock-scheduler");
  Result r = run_scheduler(redis.url(), (dir.path() / "work").string());
  expect_once_per_slot(r);
}

}  // namespace
