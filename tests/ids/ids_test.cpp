// Unit tests of the id generators without servers: snowflake over the memory://
// backend (worker leases, loss, exhaustion, clock rollback, sequence overflow),
// UUIDv7 (layout, monotonicity, randomness, fork safety) and the redis-daily codec.
#include "distlock/ids.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <regex>
#include <set>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "fake/memory_backend.hpp"
#include "manual_wall_clock.hpp"
#include "support/distinct_ids.hpp"
#include "support/manual_clock.hpp"
#include "support/thrown.hpp"

namespace distlock::testing {

namespace {

using ids::SnowflakeGenerator;
using ids::SnowflakeOptions;
using ids::Uuid;
using ids::Uuid7Generator;

constexpr std::int64_t kT = 1'700'000'000'123;  // 2023-11-14T22:13:20.123Z

// A fresh memory:// store per test, so tests do not see each other's worker leases.
std::string memory_url() {
  static int n = 0;
  return "memory://ids-test-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
}

SnowflakeOptions sf_opts(std::shared_ptr<ManualWallClock> clock, std::string prefix = "t") {
  SnowflakeOptions o;
  o.prefix = std::move(prefix);
  o.clock = std::move(clock);
  return o;
}

// ---- snowflake ----------------------------------------------------------------------------

TEST(Snowflake, LayoutDecodesToClockWorkerAndSequence) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  auto client = distlock::connect(memory_url());
  SnowflakeGenerator gen(client, sf_opts(clock));
  EXPECT_EQ(gen.worker_id(), 0u);
  const std::uint64_t a = gen.next();
  const std::uint64_t b = gen.next();
  EXPECT_EQ(a >> 63, 0u);
  EXPECT_EQ(distlock::ids::decode_snowflake(a), (distlock::ids::SnowflakeParts{kT, 0, 0}));
  EXPECT_EQ(distlock::ids::decode_snowflake(b), (distlock::ids::SnowflakeParts{kT, 0, 1}));
  // The raw layout: 41 bits of ms since 2022-06-12, 10 bits worker, 12 bits sequence.
  EXPECT_EQ(a, static_cast<std::uint64_t>(kT - 1654992000000LL) << 22);
  clock->advance(7);
  EXPECT_EQ(distlock::ids::decode_snowflake(gen.next()), (distlock::ids::SnowflakeParts{kT + 7, 0, 0}));
}

TEST(Snowflake, DecodeRejectsSignBit) {
  EXPECT_EQ(code_of([] { distlock::ids::decode_snowflake(std::uint64_t{1} << 63); }), errc::invalid_argument);
}

TEST(Snowflake, GeneratorsNeverShareAWorkerIdEvenOnOneThreadAndClient) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  const std::string url = memory_url();
  auto client = distlock::connect(url);
  auto other = distlock::connect(url);
  // Same client, same thread: try_acquire would re-enter the first worker lock.
  SnowflakeGenerator g0(client, sf_opts(clock));
  SnowflakeGenerator g1(client, sf_opts(clock));
  SnowflakeGenerator g2(other, sf_opts(clock));
  EXPECT_EQ(g0.worker_id(), 0u);
  EXPECT_EQ(g1.worker_id(), 1u);
  EXPECT_EQ(g2.worker_id(), 2u);
  // Another thread of the same client is another owner: refused by the backend.
  unsigned from_thread = 99;
  std::thread([&] {
    SnowflakeGenerator g3(client, sf_opts(clock));
    from_thread = g3.worker_id();
  }).join();
  EXPECT_EQ(from_thread, 3u);
  // Another prefix is another worker-id space.
  SnowflakeGenerator other_space(client, sf_opts(clock, "other"));
  EXPECT_EQ(other_space.worker_id(), 0u);
}

TEST(Snowflake, WorkerIdIsFreedWhenTheGeneratorIsDestroyed) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  auto client = distlock::connect(memory_url());
  { SnowflakeGenerator g(client, sf_opts(clock)); }
  SnowflakeGenerator again(client, sf_opts(clock));
  EXPECT_EQ(again.worker_id(), 0u);
}

TEST(Snowflake, AllWorkerIdsLeasedIsExhaustedWithAClearMessage) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  const std::string url = memory_url();
  auto hog = distlock::connect(url);
  std::vector<distlock::Lease> held;
  for (unsigned n = 0; n < distlock::ids::kSnowflakeWorkers; ++n) {
    held.push_back(hog.acquire("idgen:t:worker:" + std::to_string(n)));
  }
  auto client = distlock::connect(url);
  const std::string msg = message_of([&] { SnowflakeGenerator g(client, sf_opts(clock)); });
  EXPECT_NE(msg.find("all 1024 snowflake worker ids are leased"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { SnowflakeGenerator g(client, sf_opts(clock)); }), errc::exhausted);
  // One freed worker id is found, whichever it is.
  held[517].release();
  SnowflakeGenerator g(client, sf_opts(clock));
  EXPECT_EQ(g.worker_id(), 517u);
  EXPECT_EQ(distlock::ids::decode_snowflake(g.next()).worker, 517u);
}

TEST(Snowflake, StolenLeaseStopsIssuingUntilRelet) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  const std::string url = memory_url();
  auto client = distlock::connect(url);
  SnowflakeGenerator gen(client, sf_opts(clock));
  const std::uint64_t before = gen.next();
  ASSERT_TRUE(gen.leased());

  detail::MemoryStore::named(url.substr(9))->steal("idgen:t:worker:0", "intruder:1");
  client.renew_now();  // the renewer learns the lease is gone: the stop token fires
  EXPECT_TRUE(gen.stop_token().stop_requested());
  EXPECT_FALSE(gen.leased());
  for (int i = 0; i < 3; ++i) {
    clock->advance(1);
    std::error_code ec;
    EXPECT_EQ(gen.next(ec), 0u);
    EXPECT_EQ(ec, errc::lost);
  }
  EXPECT_NE(message_of([&] { gen.next(); }).find("worker id 0"), std::string::npos);

  gen.relet();  // worker 0 belongs to the intruder now
  EXPECT_TRUE(gen.leased());
  EXPECT_EQ(gen.worker_id(), 1u);
  const std::uint64_t after = gen.next();
  EXPECT_GT(after, before);
  EXPECT_EQ(distlock::ids::decode_snowflake(after).worker, 1u);
}

TEST(Snowflake, LeasePastItsLocalDeadlineStopsIssuingWithoutTheRenewer) {
  // A process paused past its lease: the renewer has not run yet, so the stop token
  // has not fired, but the generator must not issue under a worker id someone else
  // may hold by now.
  auto wall = std::make_shared<ManualWallClock>(kT);
  auto steady = std::make_shared<ManualClock>();
  distlock::ClientOptions co;
  co.clock = steady;
  co.background_renewal = false;
  auto client = distlock::connect(memory_url(), co);
  SnowflakeOptions o = sf_opts(wall);
  o.lease.ttl = std::chrono::seconds(1);
  SnowflakeGenerator gen(client, o);
  gen.next();
  steady->advance(std::chrono::seconds(2));
  wall->advance(2000);
  EXPECT_FALSE(gen.stop_token().stop_requested());
  EXPECT_EQ(code_of([&] { gen.next(); }), errc::lost);
}

TEST(Snowflake, SequenceExhaustedWaitsForTheNextMillisecond) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  auto client = distlock::connect(memory_url());
  SnowflakeGenerator gen(client, sf_opts(clock));
  std::uint64_t prev = 0;
  for (unsigned i = 0; i < distlock::ids::kSnowflakeSequencePerMs; ++i) {
    const std::uint64_t id = gen.next();
    ASSERT_GT(id, prev);
    prev = id;
  }
  EXPECT_EQ(clock->sleeps(), 0);
  EXPECT_EQ(distlock::ids::decode_snowflake(prev).sequence, 4095u);
  const std::uint64_t id = gen.next();  // sleeps until kT + 1 (the clock jumps there)
  EXPECT_EQ(clock->sleeps(), 1);
  EXPECT_EQ(clock->last_sleep_target(), kT + 1);
  EXPECT_EQ(distlock::ids::decode_snowflake(id), (distlock::ids::SnowflakeParts{kT + 1, 0, 0}));
}

TEST(Snowflake, BatchIsTheSameAsRepeatedNext) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  auto client = distlock::connect(memory_url());
  SnowflakeGenerator gen(client, sf_opts(clock));
  const std::uint64_t first = gen.next();  // kT, sequence 0
  std::vector<std::uint64_t> batch(10'000);
  gen.next_batch(batch);
  // 4095 more in kT, then 4096 in kT + 1, then the rest in kT + 2 (two waits).
  EXPECT_EQ(distlock::ids::decode_snowflake(batch[0]), (distlock::ids::SnowflakeParts{kT, 0, 1}));
  EXPECT_EQ(distlock::ids::decode_snowflake(batch[4094]), (distlock::ids::SnowflakeParts{kT, 0, 4095}));
  EXPECT_EQ(distlock::ids::decode_snowflake(batch[4095]), (distlock::ids::SnowflakeParts{kT + 1, 0, 0}));
  EXPECT_EQ(distlock::ids::decode_snowflake(batch[9999]), (distlock::ids::SnowflakeParts{kT + 2, 0, 1808}));
  EXPECT_EQ(clock->sleeps(), 2);
  EXPECT_GT(batch[0], first);
  EXPECT_EQ(std::adjacent_find(batch.begin(), batch.end(), [](auto a, auto b) { return b <= a; }),
            batch.end());
  EXPECT_EQ(distlock::ids::decode_snowflake(gen.next()), (distlock::ids::SnowflakeParts{kT + 2, 0, 1809}));

  detail::MemoryStore::named(client.url().substr(9))->steal("idgen:t:worker:0", "intruder:1");
  client.renew_now();
  EXPECT_EQ(code_of([&] { gen.next_batch(batch); }), errc::lost);
}

TEST(Snowflake, SmallClockRollbackIsWaitedOut) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  auto client = distlock::connect(memory_url());
  SnowflakeGenerator gen(client, sf_opts(clock));
  std::set<std::uint64_t> seen;
  std::uint64_t prev = gen.next();
  seen.insert(prev);
  clock->set(kT - 5);  // exactly the default tolerance
  const std::uint64_t id = gen.next();
  EXPECT_EQ(clock->sleeps(), 1);
  EXPECT_EQ(clock->last_sleep_target(), kT);
  EXPECT_GT(id, prev);
  EXPECT_TRUE(seen.insert(id).second);
  EXPECT_EQ(distlock::ids::decode_snowflake(id), (distlock::ids::SnowflakeParts{kT, 0, 1}));
}

TEST(Snowflake, LargeClockRollbackIsAnErrorAndIssuesNothing) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  auto client = distlock::connect(memory_url());
  SnowflakeGenerator gen(client, sf_opts(clock));
  const std::uint64_t prev = gen.next();
  clock->set(kT - 6);
  std::error_code ec;
  EXPECT_EQ(gen.next(ec), 0u);
  EXPECT_EQ(ec, errc::clock_moved_backwards);
  EXPECT_NE(message_of([&] { gen.next(); }).find("moved back by 6 ms"), std::string::npos);
  EXPECT_EQ(clock->sleeps(), 0);
  clock->set(kT);  // the clock recovers: ids go on, above the last one
  const std::uint64_t id = gen.next();
  EXPECT_GT(id, prev);
  EXPECT_EQ(distlock::ids::decode_snowflake(id).sequence, 1u);
}

TEST(Snowflake, RollbackToleranceIsConfigurable) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  auto client = distlock::connect(memory_url());
  SnowflakeOptions o = sf_opts(clock);
  o.max_backward = std::chrono::milliseconds(0);
  SnowflakeGenerator strict(client, o);
  strict.next();
  clock->set(kT - 1);
  EXPECT_EQ(code_of([&] { strict.next(); }), errc::clock_moved_backwards);

  o.max_backward = std::chrono::milliseconds(-1);
  EXPECT_EQ(code_of([&] { SnowflakeGenerator g(client, o); }), errc::invalid_argument);
  o.max_backward = std::chrono::milliseconds(5);
  o.prefix = "";
  EXPECT_EQ(code_of([&] { SnowflakeGenerator g(client, o); }), errc::invalid_argument);
}

TEST(Snowflake, SharedByThreadsUniqueAndIncreasingPerThread) {
  auto client = distlock::connect(memory_url());
  SnowflakeGenerator gen(client, SnowflakeOptions{.prefix = "threads"});  // real wall clock
  constexpr int kThreads = 8, kEach = 50'000;
  const auto got = ids_from_threads(gen, kThreads, kEach);
  expect_runs_sorted_and_distinct(got);
  std::size_t total = 0;
  for (const auto& v : got) {
    EXPECT_EQ(std::adjacent_find(v.begin(), v.end()), v.end());
    total += v.size();
  }
  EXPECT_EQ(total, std::size_t{kThreads} * kEach);
}

// ---- uuid7 --------------------------------------------------------------------------------

TEST(Uuid7, VersionVariantTimestampAndCanonicalText) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  Uuid7Generator gen({.clock = clock});
  const Uuid u = gen.next();
  EXPECT_EQ(u.version(), 7u);
  EXPECT_EQ(u.variant_bits(), 0b10u);
  EXPECT_EQ(u.unix_ms(), kT);
  EXPECT_LT(u.rand_a(), 2048u);  // a new millisecond's counter starts below 2048
  const std::string text = u.to_string();
  EXPECT_TRUE(std::regex_match(
      text, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")))
      << text;
  EXPECT_EQ(text.substr(0, 13), "018bcfe5-687b");  // 0x018bcfe5687b == kT
  EXPECT_EQ(Uuid::parse(text), u);
  std::string upper = text;
  std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
  EXPECT_EQ(Uuid::parse(upper), u);
}

TEST(Uuid7, ParseRejectsMalformedText) {
  EXPECT_EQ(code_of([] { Uuid::parse("not-a-uuid"); }), errc::invalid_argument);
  EXPECT_EQ(code_of([] { Uuid::parse("018bcfe5-687b-7000-8000-00000000000g"); }), errc::invalid_argument);
  EXPECT_EQ(code_of([] { Uuid::parse("018bcfe5x687b-7000-8000-000000000000"); }), errc::invalid_argument);
  EXPECT_NE(message_of([] { Uuid::parse("018bcfe5-687b-7000-8000-00000000000g"); }).find("position 36"),
            std::string::npos);
}

TEST(Uuid7, MonotonicInAFrozenMillisecondAndAcrossRollback) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  Uuid7Generator gen({.clock = clock});
  Uuid prev = gen.next();
  // 10,000 in one frozen millisecond: more than the 12-bit counter holds, so the
  // timestamp runs ahead of the clock instead of repeating or wrapping.
  for (int i = 0; i < 10'000; ++i) {
    const Uuid u = gen.next();
    ASSERT_LT(prev, u) << i;
    ASSERT_LT(prev.to_string(), u.to_string());  // text order is time order too
    prev = u;
  }
  EXPECT_GT(prev.unix_ms(), kT);
  EXPECT_LE(prev.unix_ms(), kT + 10);
  clock->set(kT - 60'000);  // the clock jumps back a minute: still increasing
  for (int i = 0; i < 100; ++i) {
    const Uuid u = gen.next();
    ASSERT_LT(prev, u);
    prev = u;
  }
  EXPECT_EQ(clock->sleeps(), 0);  // never blocks
}

TEST(Uuid7, RandomBitsDiffer) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  Uuid7Generator a({.clock = clock}), b({.clock = clock});
  std::set<std::string> rand_b;
  for (int i = 0; i < 1000; ++i) {
    for (Uuid u : {a.next(), b.next()}) {
      std::string tail(u.bytes.begin() + 8, u.bytes.end());
      rand_b.insert(tail);
    }
  }
  EXPECT_EQ(rand_b.size(), 2000u);
}

TEST(Uuid7, ParentAndForkedChildDoNotRepeatRandomBits) {
  auto clock = std::make_shared<ManualWallClock>(kT);
  Uuid7Generator gen({.clock = clock});
  gen.next();  // fills the random pool before the fork
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const Uuid u = gen.next();
    const ssize_t w = ::write(fds[1], u.bytes.data(), u.bytes.size());
    ::_exit(w == 16 ? 0 : 1);
  }
  const Uuid mine = gen.next();
  Uuid theirs;
  ASSERT_EQ(::read(fds[0], theirs.bytes.data(), 16), 16);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // Same generator state, same millisecond, same counter: only fresh random bytes differ.
  EXPECT_EQ(mine.unix_ms(), theirs.unix_ms());
  EXPECT_EQ(mine.rand_a(), theirs.rand_a());
  EXPECT_NE(mine, theirs);
}

TEST(Uuid7, SharedByThreadsUnique) {
  Uuid7Generator gen;
  expect_runs_sorted_and_distinct(ids_from_threads(gen, 4, 100'000));
}

// ---- redis-daily codec --------------------------------------------------------------------

TEST(RedisDailyCodec, KeyIsTheUtcDate) {
  EXPECT_EQ(distlock::ids::redis_daily_key("order", 1654992000), "icr:order:2022:06:12");
  EXPECT_EQ(distlock::ids::redis_daily_key("order", 1654992000 + 86399), "icr:order:2022:06:12");
  EXPECT_EQ(distlock::ids::redis_daily_key("order", 1654992000 + 86400), "icr:order:2022:06:13");
  EXPECT_EQ(distlock::ids::redis_daily_key("o", 1709251199), "icr:o:2024:02:29");  // leap day
}

TEST(RedisDailyCodec, EncodeDecodeRoundTripAndLayout) {
  const distlock::ids::RedisDailyParts p{1654992000 + 12345, 678};
  const std::uint64_t id = distlock::ids::encode_redis_daily(p);
  EXPECT_EQ(id, (std::uint64_t{12345} << 32) | 678);
  EXPECT_EQ(distlock::ids::decode_redis_daily(id), p);
  EXPECT_EQ(distlock::ids::decode_redis_daily(id, 0).unix_seconds, 12345);
  // The 31-bit field: the last representable second, and one past it.
  const distlock::ids::RedisDailyParts last{1654992000 + 0x7fffffffLL, 0xffffffffu};
  EXPECT_EQ(distlock::ids::encode_redis_daily(last), 0x7fffffffffffffffULL);
  EXPECT_EQ(code_of([] {
              distlock::ids::encode_redis_daily({1654992000 + 0x80000000LL, 1});
            }),
            errc::invalid_argument);
  EXPECT_EQ(code_of([] { distlock::ids::encode_redis_daily({1654991999, 1}); }), errc::invalid_argument);
  EXPECT_EQ(code_of([] { distlock::ids::decode_redis_daily(std::uint64_t{1} << 63); }),
            errc::invalid_argument);
}

}  // namespace

}  // namespace distlock::testing
