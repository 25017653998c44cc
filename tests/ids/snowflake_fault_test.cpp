// Snowflake worker leases with real processes and a real redis-server: a generator
// process SIGSTOPped past its lease TTL loses its worker id to another process and,
// once resumed, issues not a single id more (it exits reporting the loss); a SIGKILLed
// generator's worker id is free again within ttl + 1 s.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "distlock/ids.hpp"
#include "support/distinct_ids.hpp"
#include "support/ids_worker_output.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {

namespace {

using ids::decode_snowflake;
using namespace std::chrono_literals;

constexpr long kTtlMs = 1000;

Process stream_worker(const std::string& url, const std::string& out, long stream_ms) {
  return Process::spawn(
      {DISTLOCK_IDS_WORKER_PATH, "--scheme", "snowflake", "--url", url, "--prefix", "fault", "--ttl-ms",
       std::to_string(kTtlMs), "--stream-ms", std::to_string(stream_ms), "--out", out},
      out + ".log");
}

// True once /proc says `pid` is stopped (state T).
bool wait_stopped(pid_t pid, std::chrono::milliseconds timeout) {
  return eventually([&] { return process_state(pid) == 'T'; }, timeout, 1ms);
}

std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TEST(SnowflakeFault, PausedPastTtlLosesTheWorkerIdAndIssuesNothingAfterResume) {
  RedisServer redis;
  TempDir dir("distlock-ids-fault");
  const std::string a_out = (dir.path() / "a").string(), b_out = (dir.path() / "b").string();

  Process a = stream_worker(redis.url(), a_out, 20'000);
  ASSERT_TRUE(wait_for_file(a_out + ".issuing", 10s)) << first_line(a_out + ".log");
  EXPECT_EQ(first_line(a_out + ".worker"), "0");
  std::this_thread::sleep_for(200ms);  // a issues ids for a while
  a.signal(SIGSTOP);
  ASSERT_TRUE(wait_stopped(a.pid(), 5s));  // kill() returns before the stop takes effect
  const std::int64_t stopped_at = wall_ms();
  std::this_thread::sleep_for(std::chrono::milliseconds(kTtlMs + 1000));  // the lease expires on the server

  Process b = stream_worker(redis.url(), b_out, 1500);
  ASSERT_TRUE(wait_for_file(b_out + ".worker", 10s)) << first_line(b_out + ".log");
  EXPECT_EQ(first_line(b_out + ".worker"), "0") << "the paused generator's worker id was not freed";
  std::this_thread::sleep_for(300ms);

  a.signal(SIGCONT);
  const int a_status = a.wait_for(10s);
  ASSERT_NE(a_status, -1) << "the resumed generator went on issuing";
  EXPECT_TRUE(WIFEXITED(a_status) && WEXITSTATUS(a_status) == 3) << "status " << a_status;
  EXPECT_TRUE(std::filesystem::exists(a_out + ".lost"));
  const int b_status = b.wait_for(20s);
  EXPECT_TRUE(b_status != -1 && WIFEXITED(b_status) && WEXITSTATUS(b_status) == 0)
      << first_line(b_out + ".log");

  const auto a_ids = read_ids(a_out + ".t0.bin");
  const auto b_ids = read_ids(b_out + ".t0.bin");
  ASSERT_FALSE(a_ids.empty());
  ASSERT_FALSE(b_ids.empty());
  // Every id of the paused generator was made before it was stopped: none after resuming.
  for (auto id : a_ids) {
    ASSERT_LE(decode_snowflake(id).unix_ms, stopped_at);
    ASSERT_EQ(decode_snowflake(id).worker, 0u);
  }
  std::vector<std::uint64_t> all(a_ids);
  all.insert(all.end(), b_ids.begin(), b_ids.end());
  expect_no_id_twice(std::move(all));
}

TEST(SnowflakeFault, KilledGeneratorsWorkerIdIsFreeWithinTtlPlusOneSecond) {
  RedisServer redis;
  TempDir dir("distlock-ids-fault");
  const std::string a_out = (dir.path() / "a").string();
  Process a = stream_worker(redis.url(), a_out, 20'000);
  ASSERT_TRUE(wait_for_file(a_out + ".worker", 10s)) << first_line(a_out + ".log");
  a.signal(SIGKILL);
  a.wait_for(5s);
  const auto killed = std::chrono::steady_clock::now();

  auto client = distlock::connect(redis.url());
  distlock::ids::SnowflakeOptions o{.prefix = "fault"};
  o.lease.ttl = std::chrono::milliseconds(kTtlMs);
  // Until the dead holder's lease expires, a new generator gets worker 1; after it, 0.
  for (;;) {
    distlock::ids::SnowflakeGenerator gen(client, o);
    if (gen.worker_id() == 0) break;
    ASSERT_LT(std::chrono::steady_clock::now() - killed, std::chrono::milliseconds(kTtlMs + 1000));
    std::this_thread::sleep_for(50ms);
  }
}

}  // namespace

}  // namespace distlock::testing
