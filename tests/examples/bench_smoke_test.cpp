// distlock-bench and the raw Redis baseline run end to end and print one well-formed
// JSON line per workload. Figures are measured, never asserted (the machine is noisy);
// what is checked is the shape, the counts, that renewals are batched, and that the lock
// workloads carry their CPU and context switches per pair.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;

struct Output {
  int exit_code = -1;
  std::string text;
  std::vector<nlohmann::json> lines;
};

Output run(const std::vector<std::string>& argv) {
  distlock::testing::TempDir dir("distlock-bench-out");
  const std::string out = (dir.path() / "out").string();
  distlock::testing::Process p = distlock::testing::Process::spawn(argv, out);
  const int status = p.wait_for(180s);
  Output o;
  o.text = distlock::testing::read_file(out);
  EXPECT_NE(status, -1) << "did not finish:\n" << o.text;
  if (status != -1 && WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
  std::stringstream ss(o.text);
  for (std::string line; std::getline(ss, line);) {
    if (!line.empty() && line.front() == '{') o.lines.push_back(nlohmann::json::parse(line));
  }
  return o;
}

void expect_shape(const nlohmann::json& j, const std::string& workload, long ops) {
  EXPECT_EQ(j.at("workload"), workload);
  EXPECT_EQ(j.at("ops"), ops) << j.dump();
  for (const char* k : {"url", "clients", "ops_per_s", "p50_us", "p99_us", "p999_us"}) {
    EXPECT_TRUE(j.contains(k)) << k << " missing in " << j.dump();
  }
  EXPECT_GT(j.at("ops_per_s").get<double>(), 0) << j.dump();
  EXPECT_LE(j.at("p50_us").get<double>(), j.at("p99_us").get<double>()) << j.dump();
  EXPECT_LE(j.at("p99_us").get<double>(), j.at("p999_us").get<double>()) << j.dump();
}

// The client's cost per acquire + release pair (getrusage around the measured part):
// `pairs` at least the measured ops, CPU per pair positive and the sum of user and sys,
// context switches per pair present. Their sizes are measured, never asserted.
void expect_usage(const nlohmann::json& j, long at_least_pairs) {
  for (const char* k : {"pairs", "cpu_us_per_pair", "user_us_per_pair", "sys_us_per_pair", "vcsw_per_pair",
                        "ivcsw_per_pair"}) {
    ASSERT_TRUE(j.contains(k)) << k << " missing in " << j.dump();
  }
  EXPECT_GE(j.at("pairs").get<long>(), at_least_pairs) << j.dump();
  EXPECT_GT(j.at("cpu_us_per_pair").get<double>(), 0) << j.dump();
  EXPECT_NEAR(j.at("cpu_us_per_pair").get<double>(),
              j.at("user_us_per_pair").get<double>() + j.at("sys_us_per_pair").get<double>(), 0.02)
      << j.dump();
  EXPECT_GE(j.at("vcsw_per_pair").get<double>(), 0) << j.dump();
  EXPECT_GE(j.at("ivcsw_per_pair").get<double>(), 0) << j.dump();
}

TEST(Bench, AllWorkloadsOnTheMemoryBackend) {
  Output o = run({DISTLOCK_BENCH_PATH, "--url", "memory://bench", "--workload", "all", "--ops", "300",
                  "--clients", "3", "--keys", "50", "--warmup", "10"});
  ASSERT_EQ(o.exit_code, 0) << o.text;
  ASSERT_EQ(o.lines.size(), 4u) << o.text;
  expect_shape(o.lines[0], "uncontended", 300);
  expect_shape(o.lines[1], "contended", 300);
  EXPECT_EQ(o.lines[1].at("clients"), 3);
  EXPECT_EQ(o.lines[1].at("handoffs").get<long>() + o.lines[1].at("self_reacquired").get<long>(), 300);
  expect_shape(o.lines[2], "many-keys", 300);
  expect_usage(o.lines[0], 300);
  EXPECT_EQ(o.lines[0].at("pairs"), 300);  // uncontended: the measured loop only
  expect_usage(o.lines[1], 300);           // contended: every acquisition, warm-up ones included
  expect_usage(o.lines[2], 300);
  expect_shape(o.lines[3], "renew", 5);
  EXPECT_EQ(o.lines[3].at("leases"), 50);
  EXPECT_EQ(o.lines[3].at("renewed_per_call"), 50.0);
}

TEST(Bench, RedisWorkloadsAndRawBaseline) {
  distlock::testing::RedisServer redis;
  Output raw = run({DISTLOCK_BENCH_RAW_PATH, "--port", std::to_string(redis.port()), "--ops", "200",
                    "--handoff-clients", "2,4"});
  ASSERT_EQ(raw.exit_code, 0) << raw.text;
  ASSERT_EQ(raw.lines.size(), 4u) << raw.text;
  expect_shape(raw.lines[0], "raw-lock", 200);
  expect_shape(raw.lines[1], "raw-ping", 200);
  // The raw direct hand-off: ops / 4 grants, each to a waiter that queued itself.
  expect_shape(raw.lines[2], "raw-handoff", 50);
  EXPECT_EQ(raw.lines[2].at("clients"), 2);
  EXPECT_GT(raw.lines[2].at("handoffs").get<long>(), 0);
  expect_shape(raw.lines[3], "raw-handoff", 50);
  EXPECT_EQ(raw.lines[3].at("clients"), 4);
  EXPECT_EQ(redis.command({"EXISTS", "bench-raw:lock"})->integer, 0);  // the raw lock was released
  expect_usage(raw.lines[0], 200);
  EXPECT_EQ(raw.lines[0].at("pairs"), 200);
  expect_usage(raw.lines[2], 50);
  EXPECT_FALSE(raw.lines[1].contains("pairs")) << raw.lines[1].dump();  // PING is no pair

  // --workload runs only the baselines named, one process per workload for bench_redis.sh.
  Output one = run({DISTLOCK_BENCH_RAW_PATH, "--port", std::to_string(redis.port()), "--ops", "100",
                    "--workload", "raw-many-keys", "--many-keys-threads", "4", "--keys", "1000"});
  ASSERT_EQ(one.exit_code, 0) << one.text;
  ASSERT_EQ(one.lines.size(), 1u) << one.text;
  EXPECT_EQ(one.lines[0].at("workload"), "raw-many-keys");
  EXPECT_EQ(one.lines[0].at("threads"), 4);
  expect_usage(one.lines[0], 1);

  Output o =
      run({DISTLOCK_BENCH_PATH, "--url", redis.url(), "--workload", "uncontended,contended", "--workload",
           "renew", "--ops", "200", "--clients", "2", "--keys", "2000", "--rounds", "2"});
  ASSERT_EQ(o.exit_code, 0) << o.text;
  ASSERT_EQ(o.lines.size(), 3u) << o.text;
  expect_shape(o.lines[0], "uncontended", 200);
  expect_shape(o.lines[1], "contended", 200);
  expect_usage(o.lines[0], 200);
  expect_usage(o.lines[1], 200);
  expect_shape(o.lines[2], "renew", 2);
  EXPECT_EQ(o.lines[2].at("renewed_per_call"), 2000.0);
  // 2,000 leases renewed by the client's batch: one renewer round trip per tick.
  EXPECT_EQ(o.lines[2].at("round_trips_per_call"), 1.0);
  EXPECT_EQ(o.lines[2].at("url"), redis.url());
}

TEST(Bench, UnknownWorkloadAndServerDown) {
  Output bad = run({DISTLOCK_BENCH_PATH, "--url", "memory://b", "--workload", "nosuch"});
  EXPECT_EQ(bad.exit_code, 2) << bad.text;
  EXPECT_NE(bad.text.find("nosuch"), std::string::npos) << bad.text;
  const auto port = std::to_string(distlock::testing::free_port());
  Output down =
      run({DISTLOCK_BENCH_PATH, "--url", "redis://127.0.0.1:" + port + "?timeout=300ms", "--ops", "5"});
  EXPECT_EQ(down.exit_code, 1) << down.text;
  EXPECT_NE(down.text.find(port), std::string::npos) << down.text;
  Output raw_down = run({DISTLOCK_BENCH_RAW_PATH, "--port", port, "--ops", "5"});
  EXPECT_EQ(raw_down.exit_code, 1) << raw_down.text;
}

}  // namespace
