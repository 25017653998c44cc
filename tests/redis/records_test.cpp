// redis://: records (put always / if_absent, get, erase) and list_held against a
// real redis-server started by each test (checks shared with the other
// Redis-family backends in record_checks.hpp), plus the key layout, persistence
// across a restart and a server that is down.
#include <gtest/gtest.h>

#include <future>

#include "distlock/distlock.hpp"
#include "redis/record_checks.hpp"
#include "support/backend_names.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;
namespace d = distlock::detail;

class RedisRecords : public ::testing::Test {
 protected:
  RedisServer server_;
  std::unique_ptr<d::Backend> backend_ = open_backend(server_.url());
};

TEST_F(RedisRecords, PutGetEraseAndIfAbsent) {
  ASSERT_TRUE(backend_);
  check_put_get_erase(*backend_);
}

TEST_F(RedisRecords, IfAbsentRaceBetweenTwoClientsGivesBothTheSameAnswer) {
  auto other = open_backend(server_.url());
  ASSERT_TRUE(backend_ && other);
  check_if_absent_race(*backend_, *other, 200);
}

TEST_F(RedisRecords, BinaryValuesUpTo64KiB) {
  ASSERT_TRUE(backend_);
  check_values(*backend_);
}

TEST_F(RedisRecords, ARecordAndALockOfTheSameNameCoexist) {
  ASSERT_TRUE(backend_);
  check_record_and_lock_coexist(*backend_);
}

// A record is a string `<prefix>:{<key>}:record` with no expiry, beside the lock
// hash `<prefix>:{<key>}` and its counter; the URL's prefix applies.
TEST_F(RedisRecords, KeyLayoutNeverExpires) {
  auto app = open_backend(server_.url("?prefix=app"));
  ASSERT_TRUE(app);
  Error ec;
  app->put_record("k", "v", d::PutMode::always, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(reply_str(server_.command({"GET", "app:{k}:record"})), "v");
  EXPECT_EQ(server_.command({"PTTL", "app:{k}:record"})->integer, -1);
  EXPECT_EQ(server_.command({"EXISTS", "app:{k}"})->integer, 0);
  EXPECT_EQ(backend_->get_record("k", ec), std::nullopt);  // another prefix, another namespace
}

TEST_F(RedisRecords, ListHeldWithPrefixLimitAndGlobCharacters) {
  ASSERT_TRUE(backend_);
  check_listing(*backend_);
}

TEST_F(RedisRecords, ListHeldShowsWaiters) {
  ASSERT_TRUE(backend_);
  auto client = distlock::connect(server_.url());
  auto lease = client.acquire("w/held");
  auto waiter = distlock::connect(server_.url());
  distlock::LockOptions o;
  o.wait = Millis(20000);
  auto waiting = std::async(std::launch::async, [&] {
    Error ec;
    waiter.acquire("w/held", o, ec);
    return ec;
  });
  Error ec;
  bool truncated = false;
  std::vector<d::ListedLock> listed;
  const auto end = std::chrono::steady_clock::now() + 10s;
  do {
    listed = backend_->list_held("w/", 10, truncated, ec);
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_EQ(listed.size(), 1u);
  } while (listed[0].info.waiters.value_or(0) < 1 && std::chrono::steady_clock::now() < end &&
           (std::this_thread::sleep_for(10ms), true));
  EXPECT_EQ(listed[0].info.waiters, 1u);
  EXPECT_EQ(listed[0].info.holder, client.status("w/held").holder);
  EXPECT_EQ(listed[0].info.token, lease.token());
  lease.release();
  EXPECT_FALSE(waiting.get());
}

TEST_F(RedisRecords, ExpiredLocksAreNotListed) {
  ASSERT_TRUE(backend_);
  check_expired_not_listed(*backend_);
}

TEST_F(RedisRecords, ListHeldOverManyLocks) {
  ASSERT_TRUE(backend_);
  check_many(*backend_);
}

TEST(RedisRecordsDown, EveryCallFailsWithBackendUnavailableNamingTheServer) {
  RedisServer server;
  auto b = open_backend(server.url("?timeout=500ms"));
  ASSERT_TRUE(b);
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  server.kill();
  check_all_fail(*b, make_error_code(errc::backend_unavailable), where);
}

/// get_record of `name` after a restart of the server: retried every 20 ms for up to 10 s (steady
/// clock) while it fails, as the first call after the restart may meet the old socket.
std::optional<std::string> get_after_restart(Backend& b, const std::string& name, Error& ec) {
  std::optional<std::string> got;
  const auto end = std::chrono::steady_clock::now() + 10s;
  do {
    got = b.get_record(name, ec);
  } while (ec && std::chrono::steady_clock::now() < end && (std::this_thread::sleep_for(20ms), true));
  return got;
}

// Puts a record of `name` with `mode` on `server`, restarts the server and reads the record
// back into `got`.
void put_restart_get(RedisServer& server, const std::string& name, d::PutMode mode,
                     std::optional<std::string>& got) {
  auto b = open_backend(server.url("?timeout=500ms"));
  ASSERT_TRUE(b);
  Error ec;
  b->put_record(name, "value", mode, ec);
  ASSERT_FALSE(ec) << ec.message();
  server.restart();
  got = get_after_restart(*b, name, ec);
  ASSERT_FALSE(ec) << ec.message();
}

// Records are stored like the fence counters: kept across a restart with
// appendonly (docs/redis.md), lost without persistence.
TEST(RedisRecordsRestart, KeptAcrossARestartWithAppendonly) {
  RedisServer server({.appendonly = true});
  std::optional<std::string> got;
  ASSERT_NO_FATAL_FAILURE(put_restart_get(server, "kept", d::PutMode::if_absent, got));
  EXPECT_EQ(got, "value");
}

TEST(RedisRecordsRestart, LostAcrossARestartWithoutPersistence) {
  RedisServer server;  // save "" and no AOF
  std::optional<std::string> got = "not read";
  ASSERT_NO_FATAL_FAILURE(put_restart_get(server, "gone", d::PutMode::always, got));
  EXPECT_EQ(got, std::nullopt);
}

}  // namespace

}  // namespace distlock::testing
