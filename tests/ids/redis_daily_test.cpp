// redis-daily against a real redis-server started by the test: the seed layout decodes
// back to the current time and the Redis counter, reservation (INCRBY n), the 2^32
// day-counter limit, day rollover, clock rollback, restart, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "distlock/ids.hpp"
#include "manual_wall_clock.hpp"
#include "support/distinct_ids.hpp"
#include "support/redis_server.hpp"
#include "support/thrown.hpp"

namespace distlock::testing {

namespace {

using ids::decode_redis_daily;
using ids::RedisDailyGenerator;
using ids::RedisDailyOptions;

constexpr std::int64_t kT = 1'700'000'000'000;  // 2023-11-14T22:13:20Z
constexpr const char* kKeyAtT = "icr:order:2023:11:14";

std::int64_t unix_seconds_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

long long get_counter(const RedisServer& redis, const std::string& key) {
  auto r = redis.command({"GET", key});
  return r && r->type == REDIS_REPLY_STRING ? std::stoll(r->str) : -1;
}

class RedisDaily : public ::testing::Test {
 protected:
  RedisServer redis;
  std::shared_ptr<ManualWallClock> clock = std::make_shared<ManualWallClock>(kT);

  // The tests below check the layout under an injected clock, so they start with day
  // counters whose epoch (see FreshDayCounterIsUsedFromTheNextSecond) is long established.
  void SetUp() override {
    for (const char* key : {kKeyAtT, "icr:order:2023:11:15"}) {
      redis.command({"SET", std::string(key) + ":epoch", "1:established"});
    }
  }

  RedisDailyOptions opts(std::uint32_t reserve = 1) {
    RedisDailyOptions o;
    o.prefix = "order";
    o.reserve = reserve;
    o.clock = clock;
    return o;
  }
};

TEST_F(RedisDaily, LayoutDecodesBackToTheCurrentTimeAndTheRedisCounter) {
  RedisDailyGenerator gen(redis.url(), {.prefix = "order"});  // the real wall clock
  const std::int64_t before = unix_seconds_now();
  const std::uint64_t a = gen.next();
  const std::uint64_t b = gen.next();
  const std::int64_t after = unix_seconds_now();
  EXPECT_EQ(a >> 63, 0u);
  const auto pa = decode_redis_daily(a);
  const auto pb = decode_redis_daily(b);
  EXPECT_GE(pa.unix_seconds, before);
  EXPECT_LE(pb.unix_seconds, after);
  EXPECT_EQ(pa.counter, 1u);
  EXPECT_EQ(pb.counter, 2u);
  // The counter in the id is the value of today's key, and the seconds field counts
  // from the seed's epoch 2022-06-12T00:00:00Z.
  const std::string key = distlock::ids::redis_daily_key("order", pb.unix_seconds);
  EXPECT_EQ(get_counter(redis, key), 2);
  EXPECT_EQ(static_cast<std::int64_t>(b >> 32), pb.unix_seconds - 1654992000);
  // Today's counter is fresh here: its first reservation is used from the next second,
  // after one GET confirming its epoch there (3 round trips for 2 ids; a second boundary
  // between the two ids on a slow machine adds one more confirming GET).
  EXPECT_GE(gen.round_trips(), 3u);
  EXPECT_LE(gen.round_trips(), 5u);
}

TEST_F(RedisDaily, ExactSeedLayoutUnderAnInjectedClock) {
  RedisDailyGenerator gen(redis.url(), opts());
  const std::uint64_t id = gen.next();
  EXPECT_EQ(id, (static_cast<std::uint64_t>(kT / 1000 - 1654992000) << 32) | 1u);
  EXPECT_EQ(get_counter(redis, kKeyAtT), 1);
  // A configurable epoch moves only the seconds field.
  RedisDailyOptions o = opts();
  o.epoch_seconds = 1'600'000'000;
  RedisDailyGenerator gen2(redis.url(), o);
  const auto parts = decode_redis_daily(gen2.next(), 1'600'000'000);
  EXPECT_EQ(parts.unix_seconds, kT / 1000);
  EXPECT_EQ(parts.counter, 2u);
}

TEST_F(RedisDaily, ReservationServesManyIdsPerRoundTripAndStaysUnique) {
  RedisDailyGenerator a(redis.url(), opts(100));
  RedisDailyGenerator b(redis.url(), opts(100));
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 250; ++i) {
    ids.push_back(a.next());
    ids.push_back(b.next());
  }
  EXPECT_EQ(a.round_trips(), 3u);
  EXPECT_EQ(b.round_trips(), 3u);
  EXPECT_EQ(get_counter(redis, kKeyAtT), 600);  // 6 ranges of 100 taken
  std::vector<std::uint64_t> from_a;
  for (std::size_t i = 0; i < ids.size(); i += 2) from_a.push_back(ids[i]);
  EXPECT_TRUE(std::is_sorted(from_a.begin(), from_a.end()));
  EXPECT_EQ(decode_redis_daily(from_a[0]).counter, 1u);  // a took 1..100 first
  EXPECT_EQ(decode_redis_daily(from_a[99]).counter, 100u);
  EXPECT_EQ(decode_redis_daily(ids[1]).counter, 101u);  // b took 101..200
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end());
}

TEST_F(RedisDaily, DayCounterAt2Pow32IsExhaustedNeverWrapped) {
  ASSERT_EQ(redis.command({"SET", kKeyAtT, "4294967290"})->type, REDIS_REPLY_STATUS);
  RedisDailyGenerator gen(redis.url(), opts());
  for (std::uint32_t c = 4294967291u; c != 0; ++c) {  // ...91 to ...95 (2^32 - 1)
    const std::uint64_t id = gen.next();
    EXPECT_EQ(decode_redis_daily(id).counter, c);
    if (c == 0xffffffffu) break;
  }
  for (int i = 0; i < 3; ++i) {
    std::error_code ec;
    EXPECT_EQ(gen.next(ec), 0u);
    EXPECT_EQ(ec, errc::exhausted);
  }
  const std::string msg = message_of([&] { gen.next(); });
  EXPECT_NE(msg.find("day counter icr:order:2023:11:14 reached"), std::string::npos) << msg;
  // The next UTC day has a fresh counter.
  clock->advance(24LL * 3600 * 1000);
  EXPECT_EQ(decode_redis_daily(gen.next()).counter, 1u);
}

TEST_F(RedisDaily, ReservationCrossing2Pow32HandsOutOnlyValidValues) {
  ASSERT_EQ(redis.command({"SET", kKeyAtT, "4294967290"})->type, REDIS_REPLY_STATUS);
  RedisDailyGenerator gen(redis.url(), opts(10));  // INCRBY 10 → 4294967300: 6 of them fit
  std::uint32_t last = 0;
  int issued = 0;
  std::error_code ec;
  for (int i = 0; i < 20; ++i) {
    const std::uint64_t id = gen.next(ec);
    if (ec) break;
    last = decode_redis_daily(id).counter;
    ++issued;
  }
  EXPECT_EQ(ec, errc::exhausted);
  EXPECT_EQ(issued, 5);
  EXPECT_EQ(last, 0xffffffffu);
}

TEST_F(RedisDaily, NewUtcDayUsesANewKeyAndDropsTheOldRange) {
  clock->set(1700006399000);  // 2023-11-14T23:59:59Z
  RedisDailyGenerator gen(redis.url(), opts(100));
  const std::uint64_t last_of_day = gen.next();
  clock->advance(1000);  // midnight
  const std::uint64_t first_of_day = gen.next();
  EXPECT_GT(first_of_day, last_of_day);
  EXPECT_EQ(decode_redis_daily(first_of_day).counter, 1u);
  EXPECT_EQ(get_counter(redis, "icr:order:2023:11:15"), 100);
  EXPECT_EQ(gen.round_trips(), 2u);
}

TEST_F(RedisDaily, ClockGoingBackNeverMakesIdsDecrease) {
  RedisDailyGenerator gen(redis.url(), opts(3));
  std::uint64_t prev = gen.next();
  clock->set(kT - 3'600'000);  // an hour back: same day, earlier second
  for (int i = 0; i < 10; ++i) {
    const std::uint64_t id = gen.next();
    EXPECT_GT(id, prev);
    EXPECT_EQ(decode_redis_daily(id).unix_seconds, kT / 1000);  // held at the last second used
    prev = id;
  }
  clock->set(kT - 86'400'000);  // a day back: still no decrease, no reuse of counters
  const std::uint64_t id = gen.next();
  EXPECT_GT(id, prev);
}

TEST_F(RedisDaily, SharedByThreadsUniqueAndIncreasingPerThread) {
  RedisDailyGenerator gen(redis.url(), {.prefix = "threads", .reserve = 64});
  expect_runs_sorted_and_distinct(ids_from_threads(gen, 4, 5000));
}

TEST_F(RedisDaily, ReconnectsAfterServerRestart) {
  RedisDailyGenerator gen(redis.url(), opts());
  const std::uint64_t before = gen.next();
  redis.restart();  // no persistence: the day counter starts over at 1
  // Still in the same second: counter 1 of this second was issued already, so the
  // generator moves to the next second (ahead of the clock) rather than repeat it.
  const std::uint64_t after = gen.next();
  EXPECT_GT(after, before);
  // The recreated counter's values are used only from the second after its creation:
  // the generator waited for it (the injected clock jumps there).
  EXPECT_GE(clock->sleeps(), 1);
  EXPECT_EQ(decode_redis_daily(after), (distlock::ids::RedisDailyParts{kT / 1000 + 1, 1}));
  EXPECT_EQ(decode_redis_daily(gen.next()), (distlock::ids::RedisDailyParts{kT / 1000 + 1, 2}));
}

// A day counter created now (the day's first reservation, or one recreated after Redis
// lost it) gets an epoch key; its values are used from the next second on, confirmed in
// that second, because a range of a lost counter may still be in use in this second.
TEST_F(RedisDaily, FreshDayCounterIsUsedFromTheNextSecond) {
  clock->set(kT + 400);
  RedisDailyOptions o = opts(10);
  o.prefix = "fresh";
  RedisDailyGenerator gen(redis.url(), o);
  const auto parts = decode_redis_daily(gen.next());
  EXPECT_EQ(parts, (distlock::ids::RedisDailyParts{kT / 1000 + 1, 1}));
  EXPECT_GE(clock->sleeps(), 1);
  auto epoch = redis.command({"GET", "icr:fresh:2023:11:14:epoch"});
  ASSERT_EQ(epoch->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(epoch->str, epoch->len).substr(0, 14), std::to_string(kT + 400).substr(0, 13) + ":");
  EXPECT_EQ(gen.round_trips(), 2u);  // INCRBY (+ epoch), then GET of the epoch in the next second
}

TEST_F(RedisDaily, ServerDownIsBackendUnavailable) {
  RedisDailyGenerator gen(redis.url(), opts());
  gen.next();
  redis.kill();
  std::error_code ec;
  EXPECT_EQ(gen.next(ec), 0u);
  EXPECT_EQ(ec, errc::backend_unavailable);
  const std::string msg = message_of([&] { gen.next(); });
  EXPECT_NE(msg.find(std::to_string(redis.port())), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { RedisDailyGenerator g(redis.url(), opts()); }), errc::backend_unavailable);
}

TEST(RedisDailyInput, BadUrlsAndOptionsAreRejectedClearly) {
  EXPECT_EQ(code_of([] { RedisDailyGenerator g("file:///tmp/x"); }), errc::invalid_url);
  EXPECT_NE(message_of([] { RedisDailyGenerator g("file:///tmp/x"); }).find("need a redis:// URL"),
            std::string::npos);
  EXPECT_EQ(code_of([] { RedisDailyGenerator g("redis://h1:1,h2:2"); }), errc::invalid_url);
  EXPECT_EQ(code_of([] { RedisDailyGenerator g("redis://127.0.0.1:99999"); }), errc::invalid_url);
  EXPECT_EQ(code_of([] { RedisDailyGenerator g("redis://127.0.0.1:1/x"); }), errc::invalid_url);
  EXPECT_EQ(code_of([] { RedisDailyGenerator g("redis://127.0.0.1:1", {.prefix = ""}); }),
            errc::invalid_argument);
  EXPECT_EQ(code_of([] { RedisDailyGenerator g("redis://127.0.0.1:1", {.prefix = "a\r\nb"}); }),
            errc::invalid_argument);
  EXPECT_EQ(code_of([] { RedisDailyGenerator g("redis://127.0.0.1:1", {.reserve = 0}); }),
            errc::invalid_argument);
  EXPECT_EQ(code_of([] { RedisDailyGenerator g("redis://127.0.0.1:1", {.reserve = 2'000'000}); }),
            errc::invalid_argument);
  EXPECT_EQ(code_of([] { RedisDailyGenerator g("redis://127.0.0.1:1", {.epoch_seconds = 1LL << 40}); }),
            errc::invalid_argument);
}

TEST(RedisDailyAuth, WrongPasswordIsAuthFailed) {
  RedisServer redis({.password = "s3cret"});
  RedisDailyGenerator ok(redis.url(), {.prefix = "auth"});
  EXPECT_EQ(decode_redis_daily(ok.next()).counter, 1u);
  const std::string wrong = "redis://:nope@127.0.0.1:" + std::to_string(redis.port());
  EXPECT_EQ(code_of([&] { RedisDailyGenerator g(wrong); }), errc::auth_failed);
  const std::string none = "redis://127.0.0.1:" + std::to_string(redis.port());
  EXPECT_EQ(code_of([&] {
              RedisDailyGenerator g(none);
              g.next();
            }),
            errc::auth_failed);
}

}  // namespace

}  // namespace distlock::testing
