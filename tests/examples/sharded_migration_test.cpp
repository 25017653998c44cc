// examples/sharded_migration end to end on file:// and on a real redis-server the test starts:
// 2000 task rows over 16 shards, 3 workers (`distlock run --shards 16 --per-shard`), 2 added at
// 20% done, 3 SIGKILLed at 50%; every row done exactly once (fenced appends), and no shard left
// unowned, or held only by a killed worker's unexpired lease, longer than TTL (2 s) + one rebalance period
// (200 ms) + 1.5 s for round trips on a loaded CI machine, as listed by the driver every 20 ms on its own
// steady clock. The driver gives up after 60 s (bounded run; a few seconds normally).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "examples/example_run.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace {

using distlock::testing::ExampleRun;

ExampleRun run_migration(const std::string& url, const std::string& dir) {
  const std::string cmd = std::string(DISTLOCK_SHARDED_MIGRATION_PATH) + " drive --url '" + url +
                          "' --dir '" + dir + "/table' --rows 2000 --limit-s 60 --distlock " +
                          DISTLOCK_CLI_PATH + " 2>&1";
  return distlock::testing::run_shell(cmd);
}

void expect_exactly_once(const ExampleRun& r, const char* backend) {
  ASSERT_TRUE(r.summary.is_object()) << r.output;
  std::printf("[ %s ] %s\n", backend, r.summary.dump().c_str());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.summary.at("processed"), 2000) << r.output;
  EXPECT_EQ(r.summary.at("duplicates"), 0) << r.output;
  EXPECT_EQ(r.summary.at("missing"), 0) << r.output;
  EXPECT_EQ(r.summary.at("workers_started"), 5);
  EXPECT_EQ(r.summary.at("workers_killed"), 3);
  EXPECT_LE(r.summary.at("max_unowned_ms").get<std::int64_t>(), 2000 + 200 + 1500) << r.output;
  EXPECT_LE(r.summary.at("max_without_live_owner_ms").get<std::int64_t>(), 2000 + 200 + 1500) << r.output;
}

TEST(ShardedMigration, EveryRowOnceWhileWorkersJoinAndDieOnFile) {
  distlock::testing::TempDir dir("distlock-sharded-migration");
  expect_exactly_once(run_migration("file://" + (dir.path() / "locks").string(), dir.path().string()),
                      "file");
}

TEST(ShardedMigration, EveryRowOnceWhileWorkersJoinAndDieOnRedis) {
  distlock::testing::TempDir dir("distlock-sharded-migration");
  distlock::testing::RedisServer redis;
  expect_exactly_once(run_migration(redis.url(), dir.path().string()), "redis");
}

}  // namespace
