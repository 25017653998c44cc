// Records, the listing of held locks and the forget hook on mysql:// (mysql_records.cpp,
// mysql_backend.cpp), through the backend adapter against a real MariaDB started by each
// test: put (always / if_absent, raced by several clients), get, erase, binary values and
// the 64 KiB bound, a record and a lock of one name side by side, a record surviving its
// killed writer, list_held with prefix / limit / truncation that leaves out released
// locks, ended leases and rows whose session does not hold the name, a server that is
// down, a user that may not create tables, and Backend::forget.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "mysql/mysql_backend.hpp"
#include "support/backend_names.hpp"
#include "support/backend_records.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/mariadb_server.hpp"
#include "support/process.hpp"
#include "support/sql_records_cases.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Backend> backend(const std::string& url) {
  return backend_of(url, &detail::make_mysql_backend);
}

TEST(MysqlRecords, PutGetEraseBinaryValuesAndTheBound) {
  MariadbServer server;
  ASSERT_NO_FATAL_FAILURE(expect_put_get_erase_binary_and_bound([&] { return backend(server.url()); }));
  EXPECT_EQ(server.query("SELECT COUNT(*) FROM distlock_test.distlock_records")[0][0], "5");
}

// Several clients race put(if_absent) on one key per round, released together: all get
// the same answer, one of the proposed values, which is what is stored.
TEST(MysqlRecords, IfAbsentRaceBetweenClientsAgrees) {
  MariadbServer server;
  expect_if_absent_race_agrees([&] { return backend(server.url()); });
}

TEST(MysqlRecords, RecordAndLockOfOneNameCoexist) {
  MariadbServer server;
  auto b = backend(server.url());
  expect_record_and_lock_coexist(*b);
}

// A writer process SIGKILLed while it overwrites a record again and again leaves a
// whole value (one statement, committed or not).
TEST(MysqlRecords, RecordSurvivesItsWriterKilled) {
  MariadbServer server;
  // The server may still run the batch the writer sent before it died: read once its
  // session is gone (its last transaction then committed or rolled back).
  const std::string sessions = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'distlock'";
  expect_record_survives_its_writer_killed(server.url(), &detail::make_mysql_backend, "distlock-myrec", [&] {
    ASSERT_TRUE(eventually([&] { return server.query(sessions)[0][0] == "0"; }, 20s));
  });
}

TEST(MysqlRecords, ListHeldPrefixLimitTruncatedAndWhatStatusSays) {
  MariadbServer server;
  auto a = backend(server.url());
  auto b = backend(server.url());
  expect_list_held_prefix_limit_truncated_and_status(
      *a, *b, /*ttl_read_apart=*/true,
      [&] {
        // A row naming an owner whose session is alive but does not hold that name's named
        // lock (its connection id reused after a restart, say) and whose lease is over:
        // status() says free, so is it listed.
        const std::string lease_conn =
            server.query("SELECT conn_id FROM distlock_test.distlock_locks WHERE name = 'job/c'")[0][0];
        server.query("UPDATE distlock_test.distlock_locks SET owner = 'ghost', conn_id = " + lease_conn +
                     ", seen_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE name = 'job/released'");
        // (and not released: its release record forgotten, as after a server restart)
        server.query(
            "DELETE FROM distlock_test.distlock_released WHERE digest = UNHEX(SHA2('job/released', 256))");
      },
      [&] {
        // The same row with time left on its lease is held for status(), and listed.
        server.query(
            "UPDATE distlock_test.distlock_locks SET seen_at = UTC_TIMESTAMP(6) WHERE name = 'job/released'");
      },
      [&] {
        server.query(
            "UPDATE distlock_test.distlock_locks SET owner = NULL, conn_id = NULL WHERE name = "
            "'job/released'");
      });
}

// A holder process SIGKILLed: its session ends at once, and its lease is listed exactly
// while status() says it is held (until seen_at + TTL, so a holder that may still
// believe it holds is never shown as free), then not.
TEST(MysqlRecords, ListHeldDropsAKilledHolderWhenStatusDoes) {
  MariadbServer server;
  auto b = backend(server.url());
  expect_listing_drops_a_killed_holder_when_status_does(
      server.url(), *b, 2000, "distlock-myrec",
      [&] { return server.query("SELECT IS_USED_LOCK('svc/worker') IS NULL")[0][0] == "1"; },
      [&] {
        return std::stoll(
            server.query("SELECT CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), seen_at + INTERVAL "
                         "ttl_ms * 1000 MICROSECOND) / "
                         "1000) FROM distlock_test.distlock_locks WHERE name = 'svc/worker'")[0][0]);
      });
}

TEST(MysqlRecords, ServerDownIsBackendUnavailableNamingTheServer) {
  MariadbServer server;
  auto b = backend(server.url());
  expect_record_calls_unavailable_naming_the_server(server, *b);
}

}  // namespace

namespace {

// The records table was made only when the lock table was missing, and whether that
// CREATE worked was not looked at: an earlier client that made the lock table but whose
// CREATE of the records table failed (a command timeout on a loaded server; the nemesis
// run lost every semaphore, rw-lock and election section of a CI run to it) left a
// database where no later client ever made it, and every record call failed. Each client
// now checks the records table on its own, and a record call that finds it missing
// creates it and runs again.
TEST(MysqlRecords, AMissingRecordsTableIsCreatedThoughTheLockTableExists) {
  MariadbServer server;
  backend(server.url()).reset();  // the first client: both tables
  server.query("DROP TABLE distlock_test.distlock_records");
  auto b = backend(server.url());  // a later client: the lock table is there
  ASSERT_TRUE(b);
  Error ec;
  b->put_record("k", "v", PutMode::always, ec);
  EXPECT_FALSE(ec) << ec.take_detail();
  EXPECT_EQ(get(*b, "k"), "v");

  // Dropped under a connected client: its next record call makes it again.
  server.query("DROP TABLE distlock_test.distlock_records");
  ec.clear();
  b->put_record("k2", "v2", PutMode::always, ec);
  EXPECT_FALSE(ec) << ec.take_detail();
  EXPECT_EQ(get(*b, "k2"), "v2");
}

// A user that may not create tables (the lock table made by an administrator) still
// connects and locks; its record calls fail naming the missing records table.
TEST(MysqlRecords, AUserThatMayNotCreateTablesStillLocks) {
  MariadbServer server;
  backend(server.url()).reset();  // creates both tables as an account that may
  server.query("DROP TABLE distlock_test.distlock_records");
  server.query(
      "CREATE USER 'limited'@'127.0.0.1' IDENTIFIED BY 'limited-pw'; GRANT SELECT, INSERT, UPDATE ON "
      "distlock_test.distlock_locks TO 'limited'@'127.0.0.1'");
  const std::string url =
      "mysql://limited:limited-pw@127.0.0.1:" + std::to_string(server.port()) + "/distlock_test";
  auto b = backend(url);
  ASSERT_TRUE(b);
  expect_locks_but_record_calls_name_the_missing_table(*b, [&] {
    EXPECT_EQ(
        server.query("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'distlock_test' "
                     "AND TABLE_NAME = 'distlock_records'")[0][0],
        "0");
  });
}

}  // namespace

namespace {

// Backend::forget: the engine's hand-back of a lease it declared lost. The named lock
// and the row's owner are given up at once, so another client takes the name without
// waiting for the session's wait_timeout; another owner's lease is never touched.
TEST(MysqlRecords, ForgetGivesUpTheLeaseAtOnceAndOnlyThatOne) {
  MariadbServer server;
  auto a = backend(server.url());
  auto b = backend(server.url());
  Error ec;
  auto got = a->try_acquire(AcquireRequest{"forgotten", "oa", Millis(30000)}, ec);
  ASSERT_TRUE(got.acquired) << ec.message();
  auto other = a->try_acquire(AcquireRequest{"kept", "oa", Millis(30000)}, ec);
  ASSERT_TRUE(other.acquired) << ec.message();
  a->forget("forgotten", "someone-else", got.token);  // not that owner's: nothing happens
  EXPECT_TRUE(a->status("forgotten", ec).held);
  a->forget("forgotten", "oa", got.token);
  EXPECT_EQ(server.query("SELECT IS_USED_LOCK('forgotten')")[0][0], "<null>");
  EXPECT_EQ(server.query("SELECT l.token = r.token FROM distlock_test.distlock_locks l JOIN "
                         "distlock_test.distlock_released r USING (digest) WHERE l.name = 'forgotten'")[0][0],
            "1");
  auto next = b->try_acquire(AcquireRequest{"forgotten", "ob", Millis(30000)}, ec);
  EXPECT_TRUE(next.acquired) << "the forgotten lease still blocks the name";
  EXPECT_GT(next.token, got.token);
  // The forgotten lease cannot be renewed or released any more; the other lease can.
  const RenewItem items[] = {{"forgotten", "oa", got.token, Millis(30000)},
                             {"kept", "oa", other.token, Millis(30000)}};
  RenewStatus out[2];
  a->renew(items, out, ec);
  EXPECT_EQ(out[0], RenewStatus::not_owner);
  EXPECT_EQ(out[1], RenewStatus::renewed);
  EXPECT_EQ(a->release("forgotten", "oa", got.token, ec), ReleaseStatus::not_owner);
  EXPECT_EQ(b->release("forgotten", "ob", next.token, ec), ReleaseStatus::released);
  EXPECT_EQ(a->release("kept", "oa", other.token, ec), ReleaseStatus::released);
}

}  // namespace

namespace {

// An upgrade: the lock table is of the layout before lock-delay (no delay_ms column) and
// the account may read and write it but not alter it. A client of that account, which
// never asks for a lock-delay, still connects and locks, as it did before; it has no
// lock-delay (Capabilities::lock_delay false: refused) until an account that may alter
// the table has connected and added the column, and a client connecting then has it.
TEST(MysqlRecords, AUserThatMayNotAlterAnOlderLockTableStillLocks) {
  MariadbServer server;
  backend(server.url()).reset();  // creates both tables as an account that may
  server.query("ALTER TABLE distlock_test.distlock_locks DROP COLUMN delay_ms");
  server.query(
      "CREATE USER 'limited'@'127.0.0.1' IDENTIFIED BY 'limited-pw'; GRANT SELECT, INSERT, UPDATE, DELETE ON "
      "distlock_test.distlock_locks TO 'limited'@'127.0.0.1'; GRANT SELECT, INSERT, UPDATE, DELETE ON "
      "distlock_test.distlock_records TO 'limited'@'127.0.0.1'");
  const std::string url =
      "mysql://limited:limited-pw@127.0.0.1:" + std::to_string(server.port()) + "/distlock_test";
  expect_older_lock_table_locks_without_lock_delay_until_altered(
      [&] { return backend(server.url()); }, [&] { return backend(url); }, "an account",
      [](Backend& b, std::uint64_t token) {
        b.forget("x", "o", token);  // the lost-lease path of a table without the column
        Error ec;
        auto again = b.try_acquire(AcquireRequest{"x", "o1", Millis(5000)}, ec);
        EXPECT_FALSE(ec) << ec.message();
        ASSERT_TRUE(again.acquired) << "a forgotten lease without lock-delay did not free the name";
        b.release("x", "o1", again.token, ec);
        EXPECT_FALSE(ec) << ec.message();
      },
      [&] { return server.query("SELECT delay_ms FROM distlock_test.distlock_locks")[0][0]; });
}

}  // namespace
}  // namespace distlock::testing
