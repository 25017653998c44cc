// `distlock id` black-box: the real binary prints unique increasing ids for each scheme,
// decodes them back, and exits 64 / 69 / 70 with one clear line on bad input,
// an unreachable server, or all worker ids leased.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <vector>

#include "cli/cli_harness.hpp"
#include "distlock/distlock.hpp"
#include "distlock/ids.hpp"
#include "support/distinct_ids.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/workload_size.hpp"

namespace {

using distlock::testing::Cli;
using distlock::testing::expect_no_id_twice;
using distlock::testing::RedisServer;
using distlock::testing::TempDir;
using namespace std::chrono_literals;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::uint64_t> numbers_of(const std::string& text) {
  std::vector<std::uint64_t> out;
  for (const auto& l : lines_of(text)) out.push_back(std::stoull(l));
  return out;
}

void expect_strictly_increasing(const std::vector<std::uint64_t>& v) {
  EXPECT_EQ(std::adjacent_find(v.begin(), v.end(), [](auto a, auto b) { return a >= b; }), v.end());
}

TEST(CliId, SnowflakeOverFilePrintsIncreasingIdsThatDecode) {
  TempDir dir("distlock-cli-id");
  const std::string url = "file://" + (dir.path() / "locks").string();
  Cli c = Cli::run({"id", "--url", url, "--local-only", "-n", "5000"}, dir.path());
  ASSERT_EQ(c.code(), 0) << c.err();
  const auto ids = numbers_of(c.out());
  ASSERT_EQ(ids.size(), 5000u);
  expect_strictly_increasing(ids);
  const auto parts = distlock::ids::decode_snowflake(ids.back());
  Cli d = Cli::run({"id", "--decode", std::to_string(ids.back())}, dir.path());
  ASSERT_EQ(d.code(), 0) << d.err();
  EXPECT_EQ(d.out(), "time=" + d.out().substr(5, 24) + " unix_ms=" + std::to_string(parts.unix_ms) +
                         " worker=" + std::to_string(parts.worker) +
                         " sequence=" + std::to_string(parts.sequence) + "\n");
}

TEST(CliId, ConcurrentSnowflakeRunsNeverCollide) {
  TempDir dir("distlock-cli-id");
  const std::string url = "file://" + (dir.path() / "locks").string();
  std::vector<Cli> runs;
  for (int i = 0; i < 4; ++i)
    runs.push_back(Cli::start({"id", "--url", url, "--local-only", "-n", "50000"}, dir.path()));
  std::vector<std::uint64_t> all;
  for (auto& r : runs) {
    ASSERT_EQ(r.wait(60s), 0) << r.err();
    const auto ids = numbers_of(r.out());
    EXPECT_EQ(ids.size(), 50000u);
    expect_strictly_increasing(ids);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  expect_no_id_twice(std::move(all));
}

TEST(CliId, RedisDailyTakesOneReservationAndDecodesToItsKey) {
  RedisServer redis;
  TempDir dir("distlock-cli-id");
  Cli c = Cli::run({"id", "--url", redis.url(), "--scheme", "redis-daily", "--prefix", "order", "-n", "2500"},
                   dir.path());
  ASSERT_EQ(c.code(), 0) << c.err();
  const auto ids = numbers_of(c.out());
  ASSERT_EQ(ids.size(), 2500u);
  expect_strictly_increasing(ids);
  const auto last = distlock::ids::decode_redis_daily(ids.back());
  EXPECT_EQ(last.counter, 2500u);
  const std::string key = distlock::ids::redis_daily_key("order", last.unix_seconds);
  EXPECT_EQ(std::string(redis.command({"GET", key})->str), "2500");  // one INCRBY 2500
  EXPECT_EQ(redis.command_calls("incrby"), 1);
  Cli d =
      Cli::run({"id", "--scheme", "redis-daily", "--prefix", "order", "--decode", std::to_string(ids.back())},
               dir.path());
  ASSERT_EQ(d.code(), 0) << d.err();
  EXPECT_NE(d.out().find(" counter=2500 key=" + key + "\n"), std::string::npos) << d.out();
}

TEST(CliId, Uuid7TextIsVersion7AndIncreasing) {
  TempDir dir("distlock-cli-id");
  Cli c = Cli::run({"id", "--scheme", "uuid7", "-n", "3000"}, dir.path());
  ASSERT_EQ(c.code(), 0) << c.err();
  const auto lines = lines_of(c.out());
  ASSERT_EQ(lines.size(), 3000u);
  EXPECT_TRUE(std::is_sorted(lines.begin(), lines.end()));
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()).size(), 3000u);
  for (const auto& l : lines) {
    const auto u = distlock::ids::Uuid::parse(l);
    ASSERT_EQ(u.version(), 7u);
    ASSERT_EQ(u.variant_bits(), 2u);
  }
  Cli d = Cli::run({"id", "--scheme", "uuid7", "--decode", lines[0]}, dir.path());
  ASSERT_EQ(d.code(), 0) << d.err();
  EXPECT_NE(d.out().find(" version=7 counter="), std::string::npos);
}

TEST(CliId, UsageErrorsExit64WithOneLine) {
  TempDir dir("distlock-cli-id");
  const std::vector<std::vector<std::string>> bad = {
      {"id", "--scheme", "bogus"},
      {"id", "-n", "0"},
      {"id", "--decode", "12x"},
      {"id", "--decode", "9223372036854775808"},  // sign bit set
      {"id", "--scheme", "uuid7", "--decode", "018bcfe5-687b-4000-8000-000000000000"},
      {"id", "--scheme", "redis-daily", "--url", "file:///tmp"},
      {"id", "--url", "redis://127.0.0.1:99999"},
      {"id", "--scheme", "redis-daily", "--url", "redis://127.0.0.1:6379", "--prefix", ""},
  };
  for (const auto& args : bad) {
    Cli c = Cli::run(args, dir.path());
    EXPECT_EQ(c.code(), 64) << args.back() << ": " << c.err();
    EXPECT_EQ(lines_of(c.err()).size(), 1u) << c.err();
    EXPECT_EQ(c.err().rfind("distlock: ", 0), 0u) << c.err();
    EXPECT_EQ(c.out(), "");
  }
}

TEST(CliId, UnreachableRedisExits69) {
  TempDir dir("distlock-cli-id");
  const std::string url = "redis://127.0.0.1:" + std::to_string(distlock::testing::free_port());
  for (const char* scheme : {"redis-daily", "snowflake"}) {
    Cli c = Cli::run({"id", "--scheme", scheme, "--url", url}, dir.path());
    EXPECT_EQ(c.code(), 69) << scheme << ": " << c.err();
    EXPECT_NE(c.err().find("127.0.0.1"), std::string::npos) << c.err();
  }
}

TEST(CliId, AllWorkerIdsLeasedExits70) {
  TempDir dir("distlock-cli-id");
  const std::string url = "file://" + (dir.path() / "locks").string();
  auto hog = distlock::connect(url);
  std::vector<distlock::Lease> held;
  for (unsigned n = 0; n < distlock::ids::kSnowflakeWorkers; ++n) {
    held.push_back(hog.acquire("idgen:default:worker:" + std::to_string(n)));
  }
  Cli c = Cli::run({"id", "--url", url, "--local-only"}, dir.path());
  EXPECT_EQ(c.code(), 70) << c.err();
  EXPECT_NE(c.err().find("all 1024 snowflake worker ids are leased"), std::string::npos) << c.err();
  EXPECT_EQ(c.out(), "");
}

// Short runs one after another and side by side (a shell loop calling `distlock id -n 3`):
// each run takes a worker id another run has just released; no id may repeat.
TEST(CliId, ShortRunsReusingWorkerIdsNeverRepeat) {
  TempDir dir("distlock-cli-id");
  const std::string url = "file://" + (dir.path() / "locks").string();
  std::set<std::uint64_t> seen;
  std::size_t printed = 0;
  // 40 rounds of 4 processes; a quarter in a sanitized build (support/workload_size.hpp).
  const int rounds = distlock::testing::workload_size(40);
  for (int round = 0; round < rounds; ++round) {
    std::vector<Cli> runs;
    for (int i = 0; i < 4; ++i)
      runs.push_back(Cli::start({"id", "--url", url, "--local-only", "-n", "3"}, dir.path()));
    for (auto& r : runs) {
      ASSERT_EQ(r.wait(30s), 0) << r.err();
      for (auto id : numbers_of(r.out())) {
        seen.insert(id);
        ++printed;
      }
    }
  }
  EXPECT_EQ(printed, static_cast<std::size_t>(rounds) * 4 * 3);
  EXPECT_EQ(seen.size(), printed) << (printed - seen.size()) << " ids printed twice";
}

// Snowflake over a host-local URL (file://, the default without $DISTLOCK_URL) would give
// every host worker 0: refused with a usage error unless --local-only says the ids never
// leave this host.
TEST(CliId, SnowflakeOnAHostLocalUrlIsRefusedWithoutLocalOnly) {
  TempDir dir("distlock-cli-id");
  const std::string url = "file://" + (dir.path() / "locks").string();
  Cli c = Cli::run({"id", "--url", url, "-n", "3"}, dir.path());
  EXPECT_EQ(c.code(), 64) << c.err();
  EXPECT_NE(c.err().find("--local-only"), std::string::npos) << c.err();
  EXPECT_EQ(c.out(), "");
  Cli d = Cli::run({"id", "--url", url, "-n", "3", "--local-only"}, dir.path());
  EXPECT_EQ(d.code(), 0) << d.err();
  EXPECT_EQ(lines_of(d.out()).size(), 3u);
}

// A write error (a full disk) is a failure, not a silent success.
TEST(CliId, WriteErrorExitsNonZero) {
  TempDir dir("distlock-cli-id");
  const std::string err = (dir.path() / "err").string();
  const std::string snowflake = " id --url file://" + (dir.path() / "locks").string() + " --local-only";
  for (const std::string& args : {std::string(" id --scheme uuid7"), snowflake}) {
    const std::string cmd = std::string(DISTLOCK_CLI_PATH) + args + " -n 5 >/dev/full 2>" + err;
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << args;
    EXPECT_EQ(WEXITSTATUS(status), 74)
        << args << ": ids written to /dev/full reported " << WEXITSTATUS(status);
    std::ifstream in(err);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("No space left on device"), std::string::npos) << args << ": " << text;
  }
}

// The day counter runs out after 5 ids: those 5 are printed, then the error.
TEST(CliId, IdsIssuedBeforeTheCounterRunsOutAreStillPrinted) {
  TempDir dir("distlock-cli-id");
  RedisServer redis;
  const auto now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  for (std::int64_t t : {now, now + 5}) {  // today's key (and tomorrow's, near midnight)
    const std::string key = distlock::ids::redis_daily_key("full", t);
    redis.command({"SET", key, "4294967290"});
    redis.command({"SET", key + ":epoch", "1:established"});
  }
  Cli c = Cli::run({"id", "--url", redis.url(), "--scheme", "redis-daily", "--prefix", "full", "-n", "10"},
                   dir.path());
  EXPECT_EQ(c.code(), 70) << c.err();
  EXPECT_NE(c.err().find("reached"), std::string::npos) << c.err();
  const auto ids = numbers_of(c.out());
  ASSERT_EQ(ids.size(), 5u) << c.out();
  EXPECT_EQ(distlock::ids::decode_redis_daily(ids.back()).counter, 0xffffffffu);
}

}  // namespace
