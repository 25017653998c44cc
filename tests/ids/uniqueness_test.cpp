// Uniqueness across processes: 4 ids_worker processes x 4 threads x 100k ids per scheme
// (redis-daily over redis://; snowflake over redis:// and file://; uuid7), all running
// at once. Every id is written to files; the test sorts them all and requires zero
// duplicates, and requires each thread's ids to strictly increase (one generator).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "distlock/ids.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/workload_size.hpp"

namespace {

using distlock::testing::Process;
using distlock::testing::RedisServer;
using distlock::testing::TempDir;

constexpr int kProcesses = 4;
constexpr int kThreads = 4;
// 100,000 ids a thread; a quarter in a sanitized build (support/workload_size.hpp).
constexpr int kPerThread = distlock::testing::workload_size(100'000);

std::vector<char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

template <std::size_t N>
using Record = std::array<unsigned char, N>;

// Runs the workers and returns every thread's ids (as big-endian-comparable records for
// UUIDs, or decoded uint64 for 64-bit ids).
struct WorkerOutput {
  std::vector<std::vector<std::uint64_t>> ids64;  // one vector per (process, thread)
  std::vector<std::vector<Record<16>>> uuids;
  std::vector<std::string> workers;  // snowflake worker id per process
};

// `reserves`: redis-daily reservation size per process (empty: not passed).
WorkerOutput run_workers(const std::string& scheme, const std::string& url,
                         const std::vector<std::string>& reserves = {}) {
  TempDir dir("distlock-ids-uniq");
  const std::string go = (dir.path() / "go").string();
  std::vector<Process> procs;
  std::vector<std::string> outs;
  for (int p = 0; p < kProcesses; ++p) {
    const std::string out = (dir.path() / ("p" + std::to_string(p))).string();
    outs.push_back(out);
    std::vector<std::string> argv{DISTLOCK_IDS_WORKER_PATH,
                                  "--scheme",
                                  scheme,
                                  "--url",
                                  url,
                                  "--prefix",
                                  "uniq",
                                  "--threads",
                                  std::to_string(kThreads),
                                  "--count",
                                  std::to_string(kPerThread),
                                  "--out",
                                  out,
                                  "--go",
                                  go};
    if (!reserves.empty()) {
      argv.push_back("--reserve");
      argv.push_back(reserves[static_cast<std::size_t>(p)]);
    }
    procs.push_back(Process::spawn(argv, out + ".log"));
  }
  // All workers hold their generator (and worker lease) before any starts issuing.
  const auto ready_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (const auto& out : outs) {
    while (!std::filesystem::exists(out + ".ready") && std::chrono::steady_clock::now() < ready_by) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::ofstream(go) << "go\n";
  WorkerOutput run;
  for (int p = 0; p < kProcesses; ++p) {
    const int status = procs[static_cast<std::size_t>(p)].wait_for(std::chrono::seconds(240));
    const std::string log = read_text(outs[static_cast<std::size_t>(p)] + ".log");
    EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "worker " << p << " status " << status << ": " << log;
    if (scheme == "snowflake")
      run.workers.push_back(read_text(outs[static_cast<std::size_t>(p)] + ".worker"));
    for (int t = 0; t < kThreads; ++t) {
      const std::vector<char> bytes =
          read_all(outs[static_cast<std::size_t>(p)] + ".t" + std::to_string(t) + ".bin");
      if (scheme == "uuid7") {
        EXPECT_EQ(bytes.size(), std::size_t{kPerThread} * 16) << "process " << p << " thread " << t;
        std::vector<Record<16>> v(bytes.size() / 16);
        std::memcpy(v.data(), bytes.data(), v.size() * 16);
        run.uuids.push_back(std::move(v));
      } else {
        EXPECT_EQ(bytes.size(), std::size_t{kPerThread} * 8) << "process " << p << " thread " << t;
        std::vector<std::uint64_t> v(bytes.size() / 8);
        std::memcpy(v.data(), bytes.data(), v.size() * 8);
        run.ids64.push_back(std::move(v));
      }
    }
  }
  return run;
}

template <class T>
void expect_increasing_and_unique(const std::vector<std::vector<T>>& per_thread) {
  std::vector<T> all;
  for (std::size_t i = 0; i < per_thread.size(); ++i) {
    const auto& v = per_thread[i];
    EXPECT_EQ(std::adjacent_find(v.begin(), v.end(), [](const T& a, const T& b) { return !(a < b); }),
              v.end())
        << "ids of thread file " << i << " do not strictly increase";
    all.insert(all.end(), v.begin(), v.end());
  }
  EXPECT_EQ(all.size(), std::size_t{kProcesses} * kThreads * kPerThread);
  std::sort(all.begin(), all.end());
  const auto dup = std::adjacent_find(all.begin(), all.end());
  EXPECT_EQ(dup, all.end()) << "duplicate id found among " << all.size();
  EXPECT_EQ(std::unique(all.begin(), all.end()) - all.begin(), static_cast<std::ptrdiff_t>(all.size()));
}

TEST(IdsUniqueness, RedisDailyWithMixedReservationsOverRedis) {
  RedisServer redis;
  // One process without reservation (one INCR round trip per id: 400k of them), three
  // with reservations of different sizes, all at once on one day key.
  WorkerOutput run = run_workers("redis-daily", redis.url(), {"1000", "7", "256", "1"});
  expect_increasing_and_unique(run.ids64);
  // Every id decodes to a counter Redis handed out today.
  const auto parts = distlock::ids::decode_redis_daily(run.ids64[0][0]);
  auto r = redis.command({"GET", distlock::ids::redis_daily_key("uniq", parts.unix_seconds)});
  ASSERT_EQ(r->type, REDIS_REPLY_STRING);
  EXPECT_GE(std::stoll(r->str), kProcesses * kThreads * kPerThread);
}

void expect_distinct_workers(const WorkerOutput& run) {
  std::set<std::string> workers(run.workers.begin(), run.workers.end());
  EXPECT_EQ(workers.size(), std::size_t{kProcesses}) << "live generators shared a worker id";
  for (const auto& v : run.ids64) {
    std::set<unsigned> in_file;
    for (auto id : v) in_file.insert(distlock::ids::decode_snowflake(id).worker);
    EXPECT_EQ(in_file.size(), 1u);
  }
}

TEST(IdsUniqueness, SnowflakeWorkersLeasedOverRedis) {
  RedisServer redis;
  WorkerOutput run = run_workers("snowflake", redis.url());
  expect_increasing_and_unique(run.ids64);
  expect_distinct_workers(run);
}

TEST(IdsUniqueness, SnowflakeWorkersLeasedOverFile) {
  TempDir locks("distlock-ids-file");
  WorkerOutput run = run_workers("snowflake", "file://" + locks.path().string());
  expect_increasing_and_unique(run.ids64);
  expect_distinct_workers(run);
}

TEST(IdsUniqueness, Uuid7AcrossProcesses) {
  WorkerOutput run = run_workers("uuid7", "");
  expect_increasing_and_unique(run.uuids);
  for (const auto& v : run.uuids) {
    for (const auto& r : v) {
      ASSERT_EQ(r[6] >> 4, 7);
      ASSERT_EQ(r[8] >> 6, 2);
    }
  }
}

}  // namespace
