// postgres:// against a real PostgreSQL started by each test: what is specific to
// this backend (its URL, its errors, session leases, LISTEN/NOTIFY waiting, tokens
// across a server restart, the SQL fenced write). The contract every backend shares
// is in tests/conformance.
#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/fault_proxy.hpp"
#include "support/incompressible_name.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"
#include "support/sql_lock_cases.hpp"
#include "support/sql_wrong_password.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---- the SQL fenced write (docs/postgres.md, "Fenced writes") --------------------
// UPDATE … SET …, fence = $token WHERE id = … AND fence < $token, in the caller's own
// transaction: 1 row means the write went through under the newest token, 0 that a
// newer holder has written already (or the row does not exist).
struct Pg {
  explicit Pg(const PostgresServer& s) {
    const std::string port = std::to_string(s.port());
    const char* keys[] = {"host", "port", "user", "password", "dbname", nullptr};
    const char* vals[] = {"127.0.0.1", port.c_str(), PostgresServer::kUser, PostgresServer::kPassword,
                          "postgres",  nullptr};
    c = PQconnectdbParams(keys, vals, 0);
    EXPECT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
  }
  ~Pg() { PQfinish(c); }
  // Rows the fenced update touched, or -1 on an error.
  int fenced_update(long long id, const std::string& value, std::uint64_t token) {
    const std::string ids = std::to_string(id), tok = std::to_string(token);
    const char* params[] = {value.c_str(), tok.c_str(), ids.c_str()};
    PGresult* r = PQexecParams(
        c, "UPDATE jobs SET value = $1, fence = $2::bigint WHERE id = $3::bigint AND fence < $2::bigint", 3,
        nullptr, params, nullptr, nullptr, 0);
    const int n = PQresultStatus(r) == PGRES_COMMAND_OK ? std::atoi(PQcmdTuples(r)) : -1;
    if (n < 0) ADD_FAILURE() << PQresultErrorMessage(r);
    PQclear(r);
    return n;
  }
  PGconn* c;
};

TEST(Postgres, AcquireReleaseTokensAndStatus) {
  PostgresServer server;
  auto a = distlock::connect(server.url(), quiet());
  auto b = distlock::connect(server.url(), quiet());
  auto lease = a.acquire("job", ttl_of(2000ms));
  EXPECT_TRUE(lease.has_token());
  const auto st = b.status("job");
  EXPECT_TRUE(st.held);
  ASSERT_TRUE(st.token.has_value());
  EXPECT_EQ(*st.token, lease.token());
  ASSERT_TRUE(st.holder.has_value());
  EXPECT_FALSE(b.try_acquire("job", ttl_of(2000ms)).has_value());
  // The server shows one advisory lock and a row naming the holder.
  EXPECT_EQ(server.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0], "1");
  EXPECT_EQ(server.query("SELECT owner FROM distlock_locks WHERE name = 'job'::bytea")[0][0], *st.holder);
  const std::uint64_t first = lease.token();
  lease.release();
  EXPECT_FALSE(b.status("job").held);
  EXPECT_EQ(server.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0], "0");
  auto again = b.acquire("job", ttl_of(2000ms, 1000ms));
  EXPECT_GT(again.token(), first);
}

TEST(Postgres, WrongPasswordIsAuthFailedAndTheMessageHidesThePassword) {
  PostgresServer server;
  const std::string what = expect_wrong_password_refused(server, "not-the-Password-42");
  EXPECT_NE(what.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos) << what;
}

TEST(Postgres, ServerDownIsBackendUnavailable) {
  const std::uint16_t port = distlock::testing::free_port();
  const auto e = connect_error("postgres://u:pw@127.0.0.1:" + std::to_string(port) + "/db");
  EXPECT_EQ(e.code(), errc::backend_unavailable) << e.what();
  EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  EXPECT_EQ(std::string(e.what()).find(":pw@"), std::string::npos) << e.what();
}

TEST(Postgres, MalformedUrlsNameTheProblem) {
  struct Case {
    std::string url, needle;
  };
  const std::vector<Case> cases{
      {"postgres://u:pw@h1:5432,h2:5432/db", "one server"},
      {"postgres://u:pw@127.0.0.1:5432/db?table=x", "unknown query parameter \"table\""},
      {"postgres://u:pw@127.0.0.1:5432/db?sslmode=always", "sslmode \"always\""},
      {"postgres://u:pw@127.0.0.1:5432/a/b", "contains '/'"},
      {"postgres://u:pw@127.0.0.1:99999/db", "99999"},
      {"postgres://u:pw@127.0.0.1:5432", "names no database"},
      {"postgres://u:pw@127.0.0.1:5432/", "names no database"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.url);
    const auto e = connect_error(c.url);
    EXPECT_EQ(e.code(), errc::invalid_url) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("pw@"), std::string::npos) << e.what();
  }
}

TEST(Postgres, UnlockWhenNotHeldIsNotOwnerAndTouchesNothing) {
  PostgresServer server;
  auto a = distlock::connect(server.url(), quiet());
  auto b = distlock::connect(server.url(), quiet());
  distlock::Mutex m = b.mutex("free", ttl_of(2000ms));
  std::error_code ec;
  m.unlock(ec);
  EXPECT_EQ(ec, errc::not_owner);
  auto lease = a.acquire("free", ttl_of(2000ms));
  m.unlock(ec);
  EXPECT_EQ(ec, errc::not_owner);
  EXPECT_TRUE(lease.owns());
  EXPECT_TRUE(b.status("free").held);
  EXPECT_EQ(server.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0], "1");
}

// Waiting is by LISTEN/NOTIFY: with the holder's TTL at 30 s, a waiter that only
// re-checked would look again after ≥ 5 s (the engine's re-check cap); the release's
// NOTIFY wakes it at once.
TEST(Postgres, AWaiterIsWokenByTheReleaseNotification) {
  PostgresServer server;
  auto a = distlock::connect(server.url(), quiet());
  auto b = distlock::connect(server.url(), quiet());
  auto lease = a.acquire("notified", ttl_of(30000ms));
  std::atomic<bool> waiting{false};
  Clock::time_point started;
  Millis took{};
  std::thread t([&] {
    started = Clock::now();
    waiting = true;
    auto l = b.acquire("notified", ttl_of(30000ms, 20000ms));
    took = since(started);
    EXPECT_TRUE(l.owns());
  });
  ASSERT_TRUE(eventually([&] { return waiting.load(); }, 5000ms));
  std::this_thread::sleep_for(300ms);  // let it wait; the bound below does not depend on it
  lease.release();
  t.join();
  RecordProperty("wait_ms", static_cast<int>(took.count()));
  EXPECT_LT(took, 4500ms) << "the waiter was not woken by the release (it re-checked on its timer)";
}

// A session whose leases are all released is still ended by the server after its
// TTL of idleness; the next acquire opens a new session instead of failing.
TEST(Postgres, AnIdleSessionEndedByTheServerIsReopened) {
  PostgresServer server;
  auto a = distlock::connect(server.url(), quiet());
  a.acquire("idle", ttl_of(1000ms)).release();
  const std::string count_sessions =
      "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'distlock-lease'";
  ASSERT_TRUE(eventually([&] { return server.query(count_sessions)[0][0] == "0"; }, 10000ms))
      << "the idle session was not ended by idle_session_timeout";
  auto lease = a.acquire("idle", ttl_of(1000ms, 0ms));
  EXPECT_TRUE(lease.owns());
}

// A holder stopped (its TCP connection open) past its TTL: the server ends its
// session, the next holder gets a newer token, the stopped one's fenced write is
// rejected, and on resume its first look says lost.
TEST(Postgres, StoppedHolderLosesTheLockOnTheServerAndItsFencedWriteIsRejected) {
  PostgresServer server;
  server.query("CREATE TABLE jobs (id bigint PRIMARY KEY, value text, fence bigint NOT NULL DEFAULT 0)");
  server.query("INSERT INTO jobs VALUES (1, 'initial', 0)");
  distlock::testing::expect_stopped_holder_is_fenced_out<Pg>(
      server, 1000, "SELECT value FROM jobs WHERE id = 1", std::nullopt);
}

// The server killed while locks are held: every lease on the dead session is
// signalled lost (stop token) within the TTL, and after the restart tokens continue
// above every token issued before (the row is durable).
TEST(Postgres, ServerKilledWhileHeldSignalsTheLossAndTokensStillIncreaseAfterRestart) {
  PostgresServer server;
  distlock::testing::expect_server_kill_signals_loss_and_tokens_increase(server, 1500ms, std::nullopt);
}

// A lease the engine declared lost on its own (renewals failing with an SQL error
// until its local deadline) while its session stays busy with another lease: the
// engine never releases a lost lease, so the backend gives the advisory lock up
// itself once its TTL has passed; otherwise the busy session would keep it for ever.
TEST(Postgres, ALeaseLostLocallyIsGivenUpWhileItsSessionStaysBusy) {
  PostgresServer server;
  auto a = distlock::connect(server.url(), quiet());
  auto b = distlock::connect(server.url(), quiet());
  auto lost = a.acquire("zombie", ttl_of(1000ms));
  server.query("ALTER TABLE distlock_locks RENAME TO distlock_locks_away");  // renewals now fail
  ASSERT_TRUE(eventually([&] { return lost.stop_token().stop_requested(); }, 10000ms));
  server.query("ALTER TABLE distlock_locks_away RENAME TO distlock_locks");
  auto busy = a.acquire("keeps-the-session-busy", ttl_of(1000ms, 5000ms));
  std::error_code ec;
  auto next = b.acquire("zombie", ttl_of(1000ms, 8000ms), ec);
  EXPECT_FALSE(ec) << ec.message() << ": the lost lease's advisory lock was never given up";
  EXPECT_TRUE(busy.owns()) << "the busy session was not renewed meanwhile";
}

// Leases of different TTLs live on different sessions, each ended after its own TTL.
TEST(Postgres, EachTtlHasItsOwnSessionTimeout) {
  PostgresServer server;
  auto a = distlock::connect(server.url(), quiet());
  auto short_lease = a.acquire("short", ttl_of(500ms));
  auto long_lease = a.acquire("long", ttl_of(5000ms));
  const auto rows = server.query(
      "SELECT d.ttl_ms, count(DISTINCT d.pid) FROM distlock_locks d WHERE d.owner IS NOT NULL GROUP BY "
      "d.ttl_ms "
      "ORDER BY 1");
  ASSERT_EQ(rows.size(), 2u);
  const auto pids = server.query("SELECT count(DISTINCT pid) FROM distlock_locks WHERE owner IS NOT NULL");
  EXPECT_EQ(pids[0][0], "2");
  EXPECT_TRUE(short_lease.owns());
  EXPECT_TRUE(long_lease.owns());
}

}  // namespace

namespace {

// A session that ends without a release (here: its connection cut under a live
// holder) frees the advisory lock at once, but its holder believes it holds the lock
// until its local deadline (last acquire/renewal + TTL − margin). A waiter gets the
// lock only once that holder no longer owns it, and then in time: no later than the
// holder's TTL after the cut + 1 s (the busy answer names the time left, so the
// waiter re-checks when it ends, not at the engine's 5 s fallback).
TEST(Postgres, AWaiterGetsALockWhoseSessionWasCutOnlyAfterTheHoldersDeadlineAndInTime) {
  PostgresServer server;
  FaultProxy proxy(server.port());
  auto a = distlock::connect(PostgresServer::url_through(proxy.port()), quiet());
  auto b = distlock::connect(server.url(), quiet());
  const Millis ttl = 6000ms;  // above the engine's 5 s re-check cap
  auto held = a.acquire("cut-wait", ttl_of(ttl));
  ASSERT_TRUE(held.owns());
  std::error_code ec;
  distlock::Lease got;
  std::atomic<bool> done{false};
  bool first_owned_at_grant = true;
  Clock::time_point granted_at{};
  std::thread waiter([&] {
    got = b.acquire("cut-wait", ttl_of(ttl, 30000ms), ec);
    first_owned_at_grant = held.owns();
    granted_at = Clock::now();
    done = true;
  });
  std::this_thread::sleep_for(300ms);  // let it wait; the assertions do not depend on it
  EXPECT_FALSE(done.load()) << "the waiter got the lock while its holder was alive";
  const auto cut = Clock::now();
  proxy.drop();
  {
    // Before the holder's first renewal (2 s after its acquire) it cannot know of the
    // cut: a third client polling now must not get the lock while the holder owns it.
    auto c = distlock::connect(server.url(), quiet());
    for (int i = 0; i < 1000 && since(cut) < 1200ms; ++i) {
      std::error_code busy;
      auto l = c.acquire("cut-wait", ttl_of(ttl, 0ms), busy);
      if (!busy) {
        EXPECT_FALSE(held.owns()) << "two holders of \"cut-wait\": a poller got it (token " << l.token()
                                  << ") " << since(cut).count()
                                  << " ms after the cut while the first holder owns it";
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  waiter.join();
  ASSERT_FALSE(ec) << ec.message();
  const Millis took = std::chrono::duration_cast<Millis>(granted_at - cut);
  RecordProperty("granted_after_cut_ms", static_cast<int>(took.count()));
  EXPECT_FALSE(first_owned_at_grant) << "two holders of \"cut-wait\": the waiter got it " << took.count()
                                     << " ms after the cut while the first holder still owned it";
  EXPECT_LT(took, ttl + 1000ms) << "the waiter was not woken when the cut lease's time ran out";
  EXPECT_GT(got.token(), held.token());
}

// A table of the older layout (the name as primary key, no seen_at) is migrated in
// place when a client connects: its tokens keep increasing, and a name too long for
// a B-tree entry can be locked afterwards. A second client finds it migrated.
TEST(Postgres, ATableOfTheOlderLayoutIsMigratedAndItsTokensKept) {
  PostgresServer server;
  server.query(
      "CREATE TABLE distlock_locks (name bytea PRIMARY KEY, token bigint NOT NULL, owner text, pid integer,"
      " ttl_ms bigint)");
  server.query("INSERT INTO distlock_locks VALUES ('old'::bytea, 41, NULL, NULL, 2000)");
  auto a = distlock::connect(server.url(), quiet());
  auto b = distlock::connect(server.url(), quiet());
  {
    auto l = a.acquire("old", ttl_of(2000ms, 0ms));
    EXPECT_EQ(l.token(), 42u);
  }
  {
    auto l = b.acquire("old", ttl_of(2000ms, 0ms));
    EXPECT_EQ(l.token(), 43u);
  }
  // 4000 bytes that do not compress: past a B-tree entry's limit had it been the key.
  const std::string long_name = incompressible_name(4000, 0x2545f4914f6cdd1dULL);
  auto l = b.acquire(long_name, ttl_of(2000ms, 0ms));
  EXPECT_EQ(l.token(), 1u);
  EXPECT_EQ(server.query("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
                         " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'distlock_locks'::regclass"
                         " AND i.indisprimary")[0][0],
            "digest");
}

}  // namespace

}  // namespace distlock::testing
