// Ids that must not repeat when something changes hands: a snowflake worker id taken
// over by a new generator (one after another, after a clock step back, while the old
// holder still runs), a generator used in a forked child, and redis-daily / snowflake
// over a Redis server that restarts without persistence.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "distlock/ids.hpp"
#include "fake/memory_backend.hpp"
#include "manual_wall_clock.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {

namespace {

using ids::RedisDailyGenerator;
using ids::RedisDailyOptions;
using ids::SnowflakeGenerator;
using ids::SnowflakeOptions;
using namespace std::chrono_literals;

constexpr std::int64_t kT = 1'700'000'000'123;  // 2023-11-14T22:13:20.123Z

std::string memory_url() {
  static int n = 0;
  return "memory://ids-handover-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
}

// A private lock directory, removed at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ids-handover-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// 2,000 generators created one after another on one client, one id each: every new
// holder of worker 0 starts above every id its predecessor issued.
void sequential_generators(const std::string& url) {
  auto client = distlock::connect(url);
  SnowflakeOptions o;
  o.prefix = "seq";
  std::set<std::uint64_t> seen;
  std::uint64_t prev = 0;
  int not_increasing = 0;
  for (int i = 0; i < 2000; ++i) {
    SnowflakeGenerator gen(client, o);
    const std::uint64_t id = gen.next();
    seen.insert(id);
    if (id <= prev) ++not_increasing;
    prev = id;
  }
  EXPECT_EQ(seen.size(), 2000u) << (2000 - seen.size()) << " duplicate ids on " << url;
  EXPECT_EQ(not_increasing, 0) << "a new holder of a worker id issued at or below its predecessor's ids";
}

TEST(SnowflakeHandover, SequentialGeneratorsOnMemoryNeverRepeat) {
  sequential_generators(memory_url());
}

TEST(SnowflakeHandover, SequentialGeneratorsOnFileNeverRepeat) {
  TempDir dir;
  sequential_generators("file://" + dir.path.string());
}

TEST(SnowflakeHandover, SequentialGeneratorsOnRedisNeverRepeat) {
  RedisServer redis;
  sequential_generators(redis.url());
}

// The wall clock steps back 10 s between two holders of worker 0 (on one host): the
// second holder must not issue at or below the first one's ids.
TEST(SnowflakeHandover, ClockSteppedBackBetweenHoldersIssuesNothingBelow) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  auto client = distlock::connect(memory_url());
  SnowflakeOptions o;
  o.prefix = "back";
  o.clock = clock;
  std::uint64_t last_a = 0;
  {
    SnowflakeGenerator a(client, o);
    for (int i = 0; i < 100; ++i) {
      last_a = a.next();
      clock->advance(1);
    }
  }
  clock->set(kT - 10'000);
  SnowflakeGenerator b(client, o);
  ASSERT_EQ(b.worker_id(), 0u);
  std::error_code ec;
  const std::uint64_t id = b.next(ec);
  if (ec) {
    EXPECT_EQ(ec, errc::clock_moved_backwards) << ec.message();
  } else {
    EXPECT_GT(id, last_a) << "worker 0's new holder issued at " << ids::decode_snowflake(id).unix_ms
                          << " ms, below its predecessor's " << ids::decode_snowflake(last_a).unix_ms
                          << " ms";
  }
  // A small step back (within max_backward) between holders is waited out, not refused.
  std::uint64_t last_c = 0;
  {
    clock->set(kT + 20'000);
    SnowflakeGenerator c(client, o);
    last_c = c.next();
  }
  clock->set(kT + 20'000 - 3);
  SnowflakeGenerator d(client, o);
  EXPECT_GT(d.next(), last_c);
}

// The worker lock vanishes on the server (DEL, eviction) while its holder still runs:
// a second generator takes worker 0 at once. Until the first notices, both issue; no id
// may be issued twice, and the first one stops.
TEST(SnowflakeHandover, VanishedWorkerLockOnMemoryGivesNoDuplicates) {
  const std::string url = memory_url();
  auto clock = std::make_shared<ManualWallClock>(kT);
  SnowflakeOptions o;
  o.prefix = "gone";
  o.clock = clock;
  auto store = detail::MemoryStore::named(url.substr(std::string("memory://").size()));
  SnowflakeGenerator a(distlock::connect(url), o);
  std::vector<std::uint64_t> ids;
  ids.push_back(a.next());
  store->drop("idgen:gone:worker:0");
  SnowflakeGenerator b(distlock::connect(url), o);
  ASSERT_EQ(b.worker_id(), 0u);
  bool a_stopped = false;
  for (int ms = 0; ms < 3000; ++ms) {  // 3 s of the injected clock, both issuing
    std::error_code ec;
    const std::uint64_t x = a.next(ec);
    if (ec) {
      EXPECT_EQ(ec, errc::lost) << ec.message();
      a_stopped = true;
    } else {
      ids.push_back(x);
    }
    ids.push_back(b.next());
    clock->advance(1);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end()) << "an id was issued twice";
  EXPECT_TRUE(a_stopped) << "the generator whose worker lock vanished kept issuing for 3 s";
}

// A worker lock DELeted on a real Redis: the same, with the real clock and the
// client's renewer, both generators issuing as fast as they can for 1.5 s.
TEST(SnowflakeHandover, DeletedWorkerLockOnRedisGivesNoDuplicates) {
  RedisServer redis;
  SnowflakeOptions o;
  o.prefix = "del";  // default lease: 30 s ttl, renewed every 10 s
  SnowflakeGenerator a(distlock::connect(redis.url()), o);
  const std::uint64_t first = a.next();
  ASSERT_EQ(redis.command({"DEL", "distlock:{idgen:del:worker:0}"})->integer, 1);
  SnowflakeGenerator b(distlock::connect(redis.url()), o);
  ASSERT_EQ(b.worker_id(), 0u);
  std::vector<std::uint64_t> ids_a{first}, ids_b;
  std::thread ta([&] {
    const auto end = std::chrono::steady_clock::now() + 1500ms;
    std::error_code ec;
    while (std::chrono::steady_clock::now() < end) {
      const std::uint64_t x = a.next(ec);
      if (ec) break;
      ids_a.push_back(x);
    }
  });
  const auto end = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < end) ids_b.push_back(b.next());
  ta.join();
  std::vector<std::uint64_t> all = ids_a;
  all.insert(all.end(), ids_b.begin(), ids_b.end());
  std::sort(all.begin(), all.end());
  const auto dups = all.size() - static_cast<std::size_t>(std::unique(all.begin(), all.end()) - all.begin());
  EXPECT_EQ(dups, 0u) << "of " << ids_a.size() << " + " << ids_b.size() << " ids";
}

// Runs `child_fn` in a forked child; returns its exit status (or -1).
template <class F>
int in_child(F&& child_fn) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(child_fn());
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// What `gen.next(ec)` gives in a forked child of this process: 0 when it is refused with
// errc::forked, 1 when it hands out an id, 2 for another error (-1: the child did not exit).
template <class Generator>
int next_in_forked_child(Generator& gen) {
  return in_child([&] {
    std::error_code ec;
    gen.next(ec);
    return ec == errc::forked ? 0 : (ec ? 2 : 1);
  });
}

// After fork() the child has the parent's worker id, sequence and (redis-daily) reserved
// range: it must not issue from them. It gets errc::forked (exit 0 below), not an id.
TEST(IdsFork, SnowflakeInForkedChildIsRefused) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  SnowflakeOptions o;
  o.prefix = "fork";
  o.clock = clock;
  SnowflakeGenerator gen(distlock::connect(memory_url()), o);
  gen.next();
  EXPECT_EQ(next_in_forked_child(gen), 0)
      << "1: the child issued an id from the parent's worker lease; 2: another error";
  EXPECT_NO_THROW(gen.next());  // the parent goes on
}

TEST(IdsFork, RedisDailyInForkedChildIsRefused) {
  RedisServer redis;
  RedisDailyOptions o;
  o.prefix = "fork";
  o.reserve = 1000;
  RedisDailyGenerator gen(redis.url(), o);
  gen.next();
  EXPECT_EQ(next_in_forked_child(gen), 0)
      << "1: the child handed out a value of the parent's reservation; 2: another error";
  EXPECT_NO_THROW(gen.next());
}

// Redis restarts without persistence while a generator works through a reserved range;
// another generator then reserves from the new (empty) counter. No id may repeat.
TEST(RedisDailyRestart, ReservedRangeAfterRestartWithoutPersistenceGivesNoDuplicates) {
  RedisServer redis;  // no appendonly, save "": a restart loses everything
  RedisDailyOptions o;
  o.prefix = "lost";
  o.reserve = 1000;
  RedisDailyGenerator a(redis.url(), o);
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(a.next());
  redis.restart();
  RedisDailyGenerator b(redis.url(), o);
  for (int i = 0; i < 990; ++i) {
    ids.push_back(b.next());
    ids.push_back(a.next());
  }
  std::sort(ids.begin(), ids.end());
  const auto dups = ids.size() - static_cast<std::size_t>(std::unique(ids.begin(), ids.end()) - ids.begin());
  EXPECT_EQ(dups, 0u) << "of " << ids.size() << " ids";
}

// The same for snowflake over Redis: the restart loses the worker lock, its fence
// counter and anything stored beside it; a new generator takes worker 0 at once.
TEST(SnowflakeHandover, RedisRestartWithoutPersistenceGivesNoDuplicates) {
  RedisServer redis;
  SnowflakeOptions o;
  o.prefix = "restart";
  SnowflakeGenerator a(distlock::connect(redis.url()), o);
  std::vector<std::uint64_t> ids{a.next()};
  redis.restart();
  SnowflakeGenerator b(distlock::connect(redis.url()), o);
  ASSERT_EQ(b.worker_id(), 0u);
  const auto end = std::chrono::steady_clock::now() + 1500ms;
  bool a_live = true;
  while (std::chrono::steady_clock::now() < end) {
    if (a_live) {
      std::error_code ec;
      const std::uint64_t x = a.next(ec);
      if (ec) {
        a_live = false;
      } else {
        ids.push_back(x);
      }
    }
    ids.push_back(b.next());
  }
  std::sort(ids.begin(), ids.end());
  const auto dups = ids.size() - static_cast<std::size_t>(std::unique(ids.begin(), ids.end()) - ids.begin());
  EXPECT_EQ(dups, 0u) << "of " << ids.size() << " ids";
}

}  // namespace

}  // namespace distlock::testing
