// Records and the listing of held locks on postgres:// (postgres_records.cpp), through
// the backend adapter against a real PostgreSQL started by each test: put (always /
// if_absent, raced by several clients), get, erase, binary values and the 64 KiB
// bound, a record and a lock of one name side by side, a record surviving its killed
// writer, list_held with prefix / limit / truncation that leaves out released locks,
// ended leases and rows whose session does not hold the name, and a server that is
// down.
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
#include "postgres/postgres_backend.hpp"
#include "support/backend_names.hpp"
#include "support/backend_records.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"
#include "support/sql_records_cases.hpp"

namespace distlock::testing {
namespace {

std::unique_ptr<Backend> backend(const std::string& url) {
  return backend_of(url, &detail::make_postgres_backend);
}

TEST(PostgresRecords, PutGetEraseBinaryValuesAndTheBound) {
  PostgresServer server;
  ASSERT_NO_FATAL_FAILURE(expect_put_get_erase_binary_and_bound([&] { return backend(server.url()); }));
  EXPECT_EQ(server.query("SELECT count(*) FROM distlock_records")[0][0], "5");
}

// Several clients race put(if_absent) on one key per round, released together: all get
// the same answer, one of the proposed values, which is what is stored.
TEST(PostgresRecords, IfAbsentRaceBetweenClientsAgrees) {
  PostgresServer server;
  expect_if_absent_race_agrees([&] { return backend(server.url()); });
}

TEST(PostgresRecords, RecordAndLockOfOneNameCoexist) {
  PostgresServer server;
  auto b = backend(server.url());
  expect_record_and_lock_coexist(*b);
}

// A writer process SIGKILLed while it overwrites a record again and again leaves a
// whole value (one statement, committed or not).
TEST(PostgresRecords, RecordSurvivesItsWriterKilled) {
  PostgresServer server;
  expect_record_survives_its_writer_killed(server.url(), &detail::make_postgres_backend, "distlock-pgrec",
                                           [] {});
}

// A holder whose session still holds the key but has sent nothing since its last renewal
// (frozen, cut off: the server ends the session only a TTL after that) shows its lease
// running out in status() and list_held(), not a full TTL: a watch's expiry re-check (and a
// shard group) reads the lock again when the lease can end, not a TTL later.
TEST(PostgresRecords, AHolderSilentSinceItsLastRenewalShowsItsLeaseRunningOut) {
  PostgresServer server;
  auto a = backend(server.url());
  auto b = backend(server.url());
  Error ec;
  ASSERT_TRUE(a->try_acquire(AcquireRequest{"silent", "oa", Millis(30000)}, ec).acquired) << ec.message();
  // The row's last renewal `seconds` ago, as it says after that long a silence.
  auto silent_for = [&](int seconds) {
    server.query("UPDATE distlock_locks SET seen_at = clock_timestamp() - interval '" +
                 std::to_string(seconds) + " seconds' WHERE name = 'silent'::bytea");
  };
  silent_for(20);
  const auto st = b->status("silent", ec);
  ASSERT_FALSE(ec) << ec.detail();
  ASSERT_TRUE(st.held);
  EXPECT_LE(st.ttl_remaining, Millis(10000));
  EXPECT_GT(st.ttl_remaining, Millis(8000));  // the statements took less than 2 s
  bool truncated = true;
  auto listed = b->list_held("silent", 10, truncated, ec);
  ASSERT_FALSE(ec) << ec.detail();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_LE(listed[0].info.ttl_remaining, Millis(10000));
  EXPECT_GT(listed[0].info.ttl_remaining, Millis(8000));
  // Past its TTL since the last renewal, with the session still holding the key (the
  // server has not ended it yet): still held, and a short time left, never zero.
  silent_for(31);
  const auto late = b->status("silent", ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_TRUE(late.held);
  EXPECT_EQ(late.ttl_remaining, Millis(10));
}

TEST(PostgresRecords, ListHeldPrefixLimitTruncatedAndWhatStatusSays) {
  PostgresServer server;
  auto a = backend(server.url());
  auto b = backend(server.url());
  expect_list_held_prefix_limit_truncated_and_status(
      *a, *b, /*ttl_read_apart=*/true,
      [&] {
        // A row naming an owner whose session is alive but does not hold that name's key
        // (its pid reused, say) and whose lease is over: status() says free, so is it listed.
        const std::string lease_pid =
            server.query("SELECT pid FROM distlock_locks WHERE name = 'job/c'::bytea")[0][0];
        server.query("UPDATE distlock_locks SET owner = 'ghost', pid = " + lease_pid +
                     ", seen_at = now() - interval '1 hour' WHERE name = 'job/released'::bytea");
      },
      [&] {
        // The same row with time left on its lease is held for status(), and listed.
        server.query("UPDATE distlock_locks SET seen_at = now() WHERE name = 'job/released'::bytea");
      },
      [&] {
        server.query("UPDATE distlock_locks SET owner = NULL, pid = NULL WHERE name = 'job/released'::bytea");
      });
}

// A holder process SIGKILLed: its session ends at once, and its lease is listed exactly
// while status() says it is held (until seen_at + TTL, so a holder that may still
// believe it holds is never shown as free), then not.
TEST(PostgresRecords, ListHeldDropsAKilledHolderWhenStatusDoes) {
  PostgresServer server;
  auto b = backend(server.url());
  expect_listing_drops_a_killed_holder_when_status_does(
      server.url(), *b, 1500, "distlock-pgrec",
      [&] { return server.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0] == "0"; },
      [&] {
        return std::stoll(
            server.query("SELECT ceil(1000 * extract(epoch FROM seen_at + ttl_ms * interval '1 "
                         "millisecond' - clock_timestamp()))"
                         " FROM distlock_locks WHERE name = 'svc/worker'::bytea")[0][0]);
      });
}

TEST(PostgresRecords, ServerDownIsBackendUnavailableNamingTheServer) {
  PostgresServer server;
  auto b = backend(server.url());
  expect_record_calls_unavailable_naming_the_server(server, *b);
}

}  // namespace

namespace {

// A user that may not create tables (the lock table made by an administrator) still
// connects and locks; its record calls fail naming the missing records table.
TEST(PostgresRecords, AUserThatMayNotCreateTablesStillLocks) {
  PostgresServer server;
  backend(server.url()).reset();  // creates both tables as the superuser
  server.query("DROP TABLE distlock_records");
  server.query("CREATE ROLE limited LOGIN PASSWORD 'limited-pw'");
  server.query("REVOKE CREATE ON SCHEMA public FROM PUBLIC");
  server.query("GRANT SELECT, INSERT, UPDATE ON distlock_locks TO limited");
  const std::string url =
      "postgres://limited:limited-pw@127.0.0.1:" + std::to_string(server.port()) + "/postgres";
  auto b = backend(url);
  ASSERT_TRUE(b);
  expect_locks_but_record_calls_name_the_missing_table(
      *b, [&] { EXPECT_EQ(server.query("SELECT to_regclass('distlock_records') IS NULL")[0][0], "t"); });
}

}  // namespace

namespace {

// An upgrade: the lock table was made by an administrator with the version before
// lock-delay (no delay_ms column). A role that may read and write it but not alter it,
// and never asks for a lock-delay, still connects and locks, as it did before; it has
// no lock-delay (Capabilities::lock_delay false: refused) until the owner has connected
// and added the column, and a client of that role connecting then has it.
TEST(PostgresRecords, AUserThatMayNotAlterAnOlderLockTableStillLocks) {
  PostgresServer server;
  server.query(
      "CREATE TABLE public.distlock_locks (digest bytea PRIMARY KEY, name bytea NOT NULL, token bigint NOT "
      "NULL,"
      " owner text, pid integer, ttl_ms bigint, seen_at timestamptz)");
  server.query("CREATE ROLE limited LOGIN PASSWORD 'limited-pw'");
  server.query("REVOKE CREATE ON SCHEMA public FROM PUBLIC");
  server.query("GRANT SELECT, INSERT, UPDATE ON distlock_locks TO limited");
  const std::string url =
      "postgres://limited:limited-pw@127.0.0.1:" + std::to_string(server.port()) + "/postgres";
  expect_older_lock_table_locks_without_lock_delay_until_altered(
      [&] { return backend(server.url()); },  // the owner (the superuser)
      [&] { return backend(url); }, "a role",
      [&](Backend& b, std::uint64_t token) {
        Error ec;
        b.release("x", "o", token, ec);
        EXPECT_FALSE(ec) << ec.message();
        EXPECT_EQ(server.query("SELECT owner IS NULL FROM distlock_locks")[0][0], "t");
      },
      [&] { return server.query("SELECT delay_ms FROM distlock_locks")[0][0]; });
}

}  // namespace
}  // namespace distlock::testing
