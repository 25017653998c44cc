// The semaphore and read-write lock examples end to end, on the host-local default
// (file://, also through $DISTLOCK_URL) and on a real redis-server: each prints one
// JSON line with what it checked. Their "unsafe" modes (--no-limit, --no-lock) show
// that the checks catch a pool without a semaphore and readers without a lock.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "examples/example_run.hpp"
#include "support/redis_server.hpp"

namespace {

using distlock::testing::ExampleRun;
using distlock::testing::TempDir;

ExampleRun run(const std::string& program, const std::vector<std::string>& args,
               const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv{program};
  argv.insert(argv.end(), args.begin(), args.end());
  return distlock::testing::run_example(argv, env);
}

void expect_pool_ok(const ExampleRun& r, const std::string& url, int permits, int jobs) {
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(r.summary.is_object()) << r.output;
  EXPECT_EQ(r.summary.at("url"), url);
  EXPECT_EQ(r.summary.at("ok"), true) << r.output;
  EXPECT_EQ(r.summary.at("done"), jobs) << r.output;
  EXPECT_EQ(r.summary.at("each_job_once"), true) << r.output;
  EXPECT_LE(r.summary.at("max_concurrent").get<int>(), permits) << r.output;
  EXPECT_GE(r.summary.at("max_concurrent").get<int>(), 1) << r.output;
}

void expect_store_ok(const ExampleRun& r, const std::string& url) {
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(r.summary.is_object()) << r.output;
  EXPECT_EQ(r.summary.at("url"), url);
  EXPECT_EQ(r.summary.at("ok"), true) << r.output;
  EXPECT_EQ(r.summary.at("torn_reads"), 0) << r.output;
  EXPECT_EQ(r.summary.at("writes_overlapped"), 0) << r.output;
  EXPECT_EQ(r.summary.at("final_version"), r.summary.at("expected_version")) << r.output;
}

// `program --url file://<a new temp dir> args...`, run to its end.
ExampleRun run_on_a_new_file_url(const std::string& program, std::vector<std::string> args) {
  TempDir dir("distlock-example");
  args.insert(args.begin(), {"--url", "file://" + dir.path().string()});
  return run(program, args);
}

// An example run in its unsafe mode: it exits 1 and its summary says the check failed.
void expect_caught(const ExampleRun& r) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  ASSERT_TRUE(r.summary.is_object()) << r.output;
  EXPECT_EQ(r.summary.at("ok"), false) << r.output;
}

TEST(WorkerPoolExample, NeverMoreJobsAtOnceThanPermitsOnFile) {
  TempDir dir("distlock-pool");
  const std::string url = "file://" + dir.path().string();
  expect_pool_ok(run(DISTLOCK_WORKER_POOL_PATH, {"--url", url}), url, 3, 48);
  // Through $DISTLOCK_URL, as the embedded default is reached.
  expect_pool_ok(run(DISTLOCK_WORKER_POOL_PATH, {"--jobs", "12"}, {"DISTLOCK_URL=" + url}), url, 3, 12);
}

TEST(WorkerPoolExample, NeverMoreJobsAtOnceThanPermitsOnRedis) {
  distlock::testing::RedisServer redis;
  expect_pool_ok(run(DISTLOCK_WORKER_POOL_PATH, {"--url", redis.url(), "--permits", "2"}), redis.url(), 2,
                 48);
}

TEST(WorkerPoolExample, APoolWithoutTheSemaphoreIsCaught) {
  // 12 threads, 3 permits, each job 20 ms: without the semaphore more than 3 run at once.
  const ExampleRun r = run_on_a_new_file_url(DISTLOCK_WORKER_POOL_PATH, {"--no-limit", "--work-us", "20000"});
  ASSERT_NO_FATAL_FAILURE(expect_caught(r));
  EXPECT_GT(r.summary.at("max_concurrent").get<int>(), 3) << r.output;
}

TEST(WorkerPoolExample, AnotherPermitCountForTheSameNameIsRefused) {
  TempDir dir("distlock-pool");
  const std::string url = "file://" + dir.path().string();
  expect_pool_ok(run(DISTLOCK_WORKER_POOL_PATH, {"--url", url, "--jobs", "6"}), url, 3, 6);
  const ExampleRun r = run(DISTLOCK_WORKER_POOL_PATH, {"--url", url, "--jobs", "6", "--permits", "5"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("3 permits; asked for 5"), std::string::npos) << r.output;
}

TEST(ConfigStoreExample, NoReaderSeesATornWriteOnFile) {
  TempDir dir("distlock-config");
  const std::string url = "file://" + dir.path().string();
  expect_store_ok(run(DISTLOCK_CONFIG_STORE_PATH, {"--url", url}), url);
  expect_store_ok(run(DISTLOCK_CONFIG_STORE_PATH, {"--rounds", "5"}, {"DISTLOCK_URL=" + url}), url);
}

TEST(ConfigStoreExample, NoReaderSeesATornWriteOnRedis) {
  distlock::testing::RedisServer redis;
  const ExampleRun r = run(DISTLOCK_CONFIG_STORE_PATH, {"--url", redis.url(), "--rounds", "10"});
  expect_store_ok(r, redis.url());
}

TEST(ConfigStoreExample, ReadersWithoutTheLockAreCaught) {
  const ExampleRun r = run_on_a_new_file_url(DISTLOCK_CONFIG_STORE_PATH, {"--no-lock", "--think-us", "2000"});
  ASSERT_NO_FATAL_FAILURE(expect_caught(r));
  EXPECT_GT(r.summary.at("torn_reads").get<int>() + r.summary.at("writes_overlapped").get<int>(), 0)
      << r.output;
}

}  // namespace
