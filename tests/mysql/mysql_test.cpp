// mysql:// against a real MariaDB started by each test: what is specific to this
// backend (its URL, its errors, named-lock names, session leases sized by wait_timeout,
// waiting inside the server and its cancellation, tokens across a server restart, the
// durability check, the SQL fenced write). The contract every backend shares is in
// tests/conformance.
#include <gtest/gtest.h>
#include <mysql.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_tool.hpp"
#include "support/mariadb_server.hpp"
#include "support/process.hpp"
#include "support/sql_lock_cases.hpp"
#include "support/sql_wrong_password.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Sessions of the distlock account blocked in GET_LOCK (waits inside the server).
int waits_in_server(const MariadbServer& s) {
  return std::stoi(s.query(std::string("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = '") +
                           MariadbServer::kUser + "' AND INFO LIKE 'SELECT GET_LOCK(%'")[0][0]);
}

// ---- the SQL fenced write (docs/mysql.md, "Fenced writes") -----------------------
// UPDATE … SET …, fence = token WHERE id = … AND fence < token, in the caller's own
// transaction: 1 row means the write went through under the newest token, 0 that a
// newer holder has written already (or the row does not exist).
struct My {
  explicit My(const MariadbServer& s) {
    c = mysql_init(nullptr);
    if (!mysql_real_connect(c, "127.0.0.1", MariadbServer::kUser, MariadbServer::kPassword,
                            MariadbServer::kDatabase, s.port(), nullptr, 0)) {
      ADD_FAILURE() << mysql_error(c);
    }
  }
  ~My() { mysql_close(c); }
  // Rows the fenced update touched (in a transaction of its own), or -1 on an error.
  int fenced_update(long long id, const std::string& value, std::uint64_t token) {
    MYSQL_STMT* st = mysql_stmt_init(c);
    const std::string sql = "UPDATE jobs SET value = ?, fence = ? WHERE id = ? AND fence < ?";
    int n = -1;
    if (mysql_query(c, "START TRANSACTION") == 0 && mysql_stmt_prepare(st, sql.data(), sql.size()) == 0) {
      MYSQL_BIND b[4] = {};
      unsigned long len = value.size();
      unsigned long long tok = token;
      long long row = id;
      b[0].buffer_type = MYSQL_TYPE_STRING;
      b[0].buffer = const_cast<char*>(value.data());
      b[0].buffer_length = len;
      b[0].length = &len;
      b[1].buffer_type = MYSQL_TYPE_LONGLONG;
      b[1].buffer = &tok;
      b[1].is_unsigned = 1;
      b[2].buffer_type = MYSQL_TYPE_LONGLONG;
      b[2].buffer = &row;
      b[3] = b[1];
      if (mysql_stmt_bind_param(st, b) == 0 && mysql_stmt_execute(st) == 0) {
        n = static_cast<int>(mysql_stmt_affected_rows(st));
      }
    }
    if (n < 0) ADD_FAILURE() << mysql_error(c) << " " << mysql_stmt_error(st);
    mysql_stmt_close(st);
    if (mysql_query(c, n < 0 ? "ROLLBACK" : "COMMIT") != 0) ADD_FAILURE() << mysql_error(c);
    return n;
  }
  MYSQL* c;
};

// A holder process (lock_tool) that said "acquired" (within 30 s), then was SIGKILLed and reaped.
struct KilledHolder {
  long long token = 0;          // its lease's token
  Clock::time_point killed_at;  // when the signal was sent
};
void kill_holder_after_acquire(const MariadbServer& server, const std::string& name, int ttl_ms,
                               KilledHolder& out) {
  TempDir dir;
  const std::string file = (dir.path() / "holder").string();
  Process holder = distlock::testing::spawn_holder(server.url(), name, file, ttl_ms);
  ASSERT_TRUE(distlock::testing::wait_for_text(file, "acquired", 30s)) << distlock::testing::read_file(file);
  out.token = distlock::testing::acquired_token(file);
  holder.signal(SIGKILL);
  out.killed_at = Clock::now();
  EXPECT_EQ(holder.exit_code(10s), 128 + SIGKILL);
}

}  // namespace

TEST(Mysql, AcquireReleaseTokensStatusAndNothingLeftOnTheServer) {
  MariadbServer server;
  auto c = distlock::connect(server.url(), quiet());
  EXPECT_TRUE(c.has_fencing());
  EXPECT_EQ(c.scheme(), "mysql");
  EXPECT_EQ(c.url().find(MariadbServer::kPassword), std::string::npos) << c.url();
  std::uint64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    auto l = c.acquire("basic", ttl_of(5000ms));
    EXPECT_GT(l.token(), last);
    last = l.token();
    const auto st = c.status("basic");
    EXPECT_TRUE(st.held);
    EXPECT_EQ(st.token, l.token());
    ASSERT_TRUE(st.holder.has_value());
    ASSERT_TRUE(st.ttl_remaining.has_value());
    EXPECT_LE(*st.ttl_remaining, 5000ms);
    EXPECT_GT(*st.ttl_remaining, 0ms);
    // The named lock is held by the session the row names.
    EXPECT_EQ(
        server.query("SELECT IS_USED_LOCK('basic') = conn_id FROM distlock_test.distlock_locks WHERE name = "
                     "'basic'")[0][0],
        "1");
    l.release();
    EXPECT_FALSE(c.status("basic").held);
  }
  // Released: no named lock; the row's token is recorded as released (in the MEMORY
  // table, no log flush); the token row stays (tokens never go back).
  EXPECT_EQ(server.query("SELECT IS_USED_LOCK('basic')")[0][0], "<null>");
  EXPECT_EQ(server.query("SELECT l.token, r.token FROM distlock_test.distlock_locks l JOIN "
                         "distlock_test.distlock_released r USING (digest) WHERE l.name = 'basic'")[0],
            (std::vector<std::string>{std::to_string(last), std::to_string(last)}));
  EXPECT_EQ(
      server.query("SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'distlock_test' AND "
                   "TABLE_NAME = 'distlock_released'")[0][0],
      "MEMORY");
  // A restart forgets the releases: the row then keeps others out until the released
  // lease's time has passed (as if its session had died), never longer.
  server.restart();
  EXPECT_EQ(server.query("SELECT COUNT(*) FROM distlock_test.distlock_released")[0][0], "0");
  {
    auto b = distlock::connect(server.url(), quiet());
    const auto t0 = Clock::now();
    auto again = b.acquire("basic", ttl_of(5000ms, 10000ms));
    EXPECT_LT(since(t0), 5000ms + 1000ms);
    EXPECT_GT(again.token(), last);
    again.release();
  }
  // The table is InnoDB (durable tokens) in the URL's database.
  EXPECT_EQ(
      server.query("SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'distlock_test' AND "
                   "TABLE_NAME = 'distlock_locks'")[0][0],
      "InnoDB");
}

TEST(Mysql, UrlFormsAndMalformedUrlsNameTheProblem) {
  MariadbServer server;
  {  // the query key of every scheme
    auto c = distlock::connect(server.url("?timeout=3s"), quiet());
    EXPECT_GT(c.acquire("url-forms", ttl_of(2000ms)).token(), 0u);
  }
  auto invalid = [&](const std::string& url, const std::string& part) {
    SCOPED_TRACE(url);
    const auto e = connect_error(url);
    EXPECT_EQ(e.code(), errc::invalid_url) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find(MariadbServer::kPassword), std::string::npos) << e.what();
  };
  const std::string auth = std::string(MariadbServer::kUser) + ":" + MariadbServer::kPassword + "@";
  const std::string port = std::to_string(server.port());
  invalid("mysql://" + auth + "127.0.0.1:" + port, "names no database");
  invalid("mysql://" + auth + "127.0.0.1:" + port + "/", "names no database");
  invalid("mysql://" + auth + "127.0.0.1:" + port + ",127.0.0.1:1/x", "takes one server");
  invalid("mysql://" + auth + "127.0.0.1:" + port + "/a/b", "not a database name");
  invalid("mysql://" + auth + "127.0.0.1:" + port + "/" + std::string(65, 'd'), "not a database name");
  invalid(server.url("?sslmode=require"), "sslmode");
  // A database that does not exist: named, with what to do.
  const auto e = connect_error("mysql://" + auth + "127.0.0.1:" + port + "/nosuchdb");
  EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
  EXPECT_NE(std::string(e.what()).find("nosuchdb"), std::string::npos) << e.what();
  EXPECT_EQ(std::string(e.what()).find(MariadbServer::kPassword), std::string::npos) << e.what();
}

TEST(Mysql, WrongPasswordIsAuthFailedAndTheMessageHidesThePassword) {
  MariadbServer server;
  expect_wrong_password_refused(server, "wr0ng-pa55word");
}

TEST(Mysql, ServerDownIsBackendUnavailableNamingTheServer) {
  const std::uint16_t port = distlock::testing::free_port();
  const auto t0 = Clock::now();
  const auto e = connect_error(MariadbServer::url_through(port) + "?timeout=1s");
  EXPECT_EQ(e.code(), errc::backend_unavailable) << e.what();
  EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  EXPECT_EQ(std::string(e.what()).find(MariadbServer::kPassword), std::string::npos) << e.what();
  EXPECT_LT(since(t0), 5000ms);
}

TEST(Mysql, ATtlTheSessionTimeoutCannotHoldIsRefusedNamingIt) {
  MariadbServer server;
  auto c = distlock::connect(server.url(), quiet());
  std::error_code ec;
  auto l = c.acquire("short", ttl_of(900ms), ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  try {
    c.acquire("short", ttl_of(500ms));
    ADD_FAILURE() << "a TTL under 1 s was accepted";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("wait_timeout"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server.query("SELECT COUNT(*) FROM distlock_test.distlock_locks")[0][0], "0");
}

// Names longer than the server's 64-character limit, or with bytes MySQL might fold
// (upper case, non-ASCII), are hashed; two long names sharing a long prefix, and two
// names differing in case, are different locks.
TEST(Mysql, LongAndOddNamesAreHashedAndDoNotCollide) {
  MariadbServer server;
  auto a = distlock::connect(server.url(), quiet());
  auto b = distlock::connect(server.url(), quiet());
  const std::string prefix(80, 'p');
  const std::string one = prefix + "/first", two = prefix + "/second";
  auto l1 = a.acquire(one, ttl_of(5000ms));
  auto l2 = b.acquire(two, ttl_of(5000ms, 0ms));  // no wait: a collision would be busy
  EXPECT_TRUE(l1.owns());
  EXPECT_TRUE(l2.owns());
  auto hashed_holder = [&](const std::string& name) {
    return server.query("SELECT IS_USED_LOCK(CONCAT('#', LEFT(SHA2('" + name + "', 256), 63)))")[0][0];
  };
  EXPECT_NE(hashed_holder(one), "<null>");
  EXPECT_NE(hashed_holder(two), "<null>");
  EXPECT_NE(hashed_holder(one), hashed_holder(two));
  // The same name is still one lock.
  std::error_code ec;
  b.acquire(one, ttl_of(5000ms, 0ms), ec);
  EXPECT_EQ(ec, errc::busy);
  // Case matters: "Case" is hashed, "case" is the name itself.
  auto upper = a.acquire("Case", ttl_of(5000ms));
  auto lower = b.acquire("case", ttl_of(5000ms, 0ms));
  EXPECT_NE(hashed_holder("Case"), "<null>");
  EXPECT_NE(server.query("SELECT IS_USED_LOCK('case')")[0][0], "<null>");
  // A direct name cannot be taken for a hashed one.
  auto hashy = a.acquire("#abc", ttl_of(5000ms));
  EXPECT_EQ(server.query("SELECT IS_USED_LOCK('#abc')")[0][0], "<null>");
  EXPECT_NE(hashed_holder("#abc"), "<null>");
}

// A waiter waits inside the server (a session blocked in GET_LOCK), is woken by the
// release, and the wait is gone once it has the lock.
TEST(Mysql, AWaiterWaitsInsideTheServerAndIsWokenByTheRelease) {
  MariadbServer server;
  auto a = distlock::connect(server.url(), quiet());
  auto b = distlock::connect(server.url(), quiet());
  auto held = a.acquire("waited", ttl_of(10000ms));
  const std::uint64_t held_token = held.token();
  std::atomic<bool> done{false};
  Clock::time_point granted{};
  std::thread waiter([&] {
    auto l = b.acquire("waited", ttl_of(10000ms, 20000ms));
    granted = Clock::now();
    done = true;
    EXPECT_GT(l.token(), held_token);
  });
  ASSERT_TRUE(eventually([&] { return waits_in_server(server) == 1; }, 10000ms))
      << "no session of the waiter is blocked in GET_LOCK";
  EXPECT_FALSE(done.load());
  const auto released = Clock::now();
  held.release();
  waiter.join();
  const Millis took = std::chrono::duration_cast<Millis>(granted - released);
  RecordProperty("granted_after_release_ms", static_cast<int>(took.count()));
  // Woken by the server, not by the engine's re-check (5 s at the holder's 10 s TTL).
  EXPECT_LT(took, 2000ms);
}

// A waiter that gives up, and then closes its client, leaves no wait on the server:
// the wait is ended with KILL QUERY, not left blocked until the lock is freed.
TEST(Mysql, AWaitIsCancelledOnTheServerWhenTheWaiterGivesUpAndCloses) {
  MariadbServer server;
  auto a = distlock::connect(server.url(), quiet());
  auto held = a.acquire("abandoned", ttl_of(20000ms));
  {
    auto b = distlock::connect(server.url(), quiet());
    std::error_code ec;
    const auto t0 = Clock::now();
    b.acquire("abandoned", ttl_of(5000ms, 1500ms), ec);
    EXPECT_EQ(ec, errc::timeout);
    EXPECT_GE(since(t0), 1500ms);
  }
  ASSERT_TRUE(eventually([&] { return waits_in_server(server) == 0; }, 5000ms))
      << "the closed client's wait is still blocked in GET_LOCK on the server";
  // The holder is untouched.
  EXPECT_TRUE(held.owns());
  EXPECT_TRUE(a.status("abandoned").held);
  held.release();
}

// A holder process SIGKILLed: its connection closes, the server ends its session and
// frees the named lock at once; the row still names it until its TTL after its last
// renewal has passed, so the next holder starts no later than that (+ slack).
TEST(Mysql, KilledHolderProcessFreesTheLockWithinItsTtl) {
  MariadbServer server;
  KilledHolder old;
  ASSERT_NO_FATAL_FAILURE(kill_holder_after_acquire(server, "killed", 2000, old));
  auto c = distlock::connect(server.url(), quiet());
  auto l = c.acquire("killed", ttl_of(5000ms, 20000ms));
  const Millis took = since(old.killed_at);
  RecordProperty("acquired_after_kill_ms", static_cast<int>(took.count()));
  EXPECT_LT(took, 2000ms + 1000ms);
  EXPECT_GT(l.token(), static_cast<std::uint64_t>(old.token));
}

// A holder stopped (its TCP connection open) past its TTL: the server ends its session
// at its wait_timeout, the next holder gets a newer token, the stopped one's fenced
// write is rejected, and on resume its first look says lost.
TEST(Mysql, StoppedHolderLosesTheLockOnTheServerAndItsFencedWriteIsRejected) {
  MariadbServer server;
  server.query(
      "CREATE TABLE distlock_test.jobs (id BIGINT PRIMARY KEY, value TEXT, fence BIGINT UNSIGNED NOT NULL "
      "DEFAULT 0) "
      "ENGINE=InnoDB; INSERT INTO distlock_test.jobs VALUES (1, 'initial', 0)");
  // Never later than one TTL after the last renewal (which came before the stop) + slack.
  distlock::testing::expect_stopped_holder_is_fenced_out<My>(
      server, 2000, "SELECT value FROM distlock_test.jobs WHERE id = 1", 2000ms + 1000ms);
}

// The holder's connection frozen (a partition the server does not see as a close):
// the holder gives the lease up on its own clock first, and the server ends the
// frozen session at its wait_timeout, so the next holder starts after the first one
// stopped owning and no later than TTL + slack after the freeze.
TEST(Mysql, FrozenHolderConnectionStopsTheHolderBeforeTheServerFreesTheLock) {
  MariadbServer server;
  FaultProxy proxy(server.port());
  auto a = distlock::connect(MariadbServer::url_through(proxy.port()), quiet());
  auto b = distlock::connect(server.url(), quiet());
  const Millis ttl = 3000ms;
  auto held = a.acquire("frozen", ttl_of(ttl));
  proxy.freeze();
  const auto frozen = Clock::now();
  auto next = b.acquire("frozen", ttl_of(ttl, 20000ms));
  const bool first_still_owned = held.owns();
  const Millis took = since(frozen);
  RecordProperty("acquired_after_freeze_ms", static_cast<int>(took.count()));
  EXPECT_FALSE(first_still_owned) << "two holders: the frozen one still owned it " << took.count()
                                  << " ms after the freeze";
  EXPECT_TRUE(held.stop_token().stop_requested());
  EXPECT_LT(took, ttl + 1500ms);
  EXPECT_GT(next.token(), held.token());
  proxy.pass();
}

// The server restarted while locks are held: every session ends, the holders' stop
// tokens fire within the TTL, and tokens continue above every token issued before
// (the InnoDB row is durable).
TEST(Mysql, ServerRestartSignalsTheLossAndTokensStillIncrease) {
  MariadbServer server;
  distlock::testing::expect_server_kill_signals_loss_and_tokens_increase(server, 2000ms, 2000ms + 500ms);
}

// A lease the engine declares lost on its own (renewals failing with an SQL error
// until its local deadline): each failed renewal leaves the session's idle limit at
// what is left of the lease, rounded up to a second, so the server gives the named
// lock up at most about a second after the holder's deadline, not a whole TTL after
// its last failed renewal (Backend::forget, when the engine calls it, is sooner still:
// mysql_records_test).
TEST(Mysql, ALeaseLostLocallyIsGivenUpSoonAfterItsDeadline) {
  MariadbServer server;
  auto a = distlock::connect(server.url(), quiet());
  const Millis ttl = 6000ms;
  auto lost = a.acquire("zombie", ttl_of(ttl));
  // Renewals now fail with an SQL error (no such table) while the session lives.
  server.query("RENAME TABLE distlock_test.distlock_locks TO distlock_test.moved");
  ASSERT_TRUE(eventually([&] { return lost.stop_token().stop_requested(); }, 15000ms));
  const auto declared = Clock::now();
  ASSERT_TRUE(
      eventually([&] { return server.query("SELECT IS_USED_LOCK('zombie')")[0][0] == "<null>"; }, 10000ms));
  const Millis took = since(declared);
  RecordProperty("freed_after_loss_ms", static_cast<int>(took.count()));
  EXPECT_LT(took, 2500ms) << "the lost lease's named lock was kept for a TTL after its last renewal";
  server.query("RENAME TABLE distlock_test.moved TO distlock_test.distlock_locks");
}

// innodb_flush_log_at_trx_commit other than 1 may lose the last tokens in a crash of
// the server host: said once, at connect.
TEST(Mysql, ANonDurableServerIsWarnedAboutOnce) {
  MariadbServer server;
  std::mutex mu;
  std::vector<std::string> warnings;
  distlock::ClientOptions o;
  o.logger = [&](distlock::LogLevel level, std::string_view msg) {
    std::lock_guard lk(mu);
    if (level >= distlock::LogLevel::warning) warnings.emplace_back(msg);
  };
  {
    auto c = distlock::connect(server.url(), o);
    c.acquire("durable", ttl_of(2000ms)).release();
  }
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  server.query("SET GLOBAL innodb_flush_log_at_trx_commit = 2");
  {
    auto c = distlock::connect(server.url(), o);
    c.acquire("durable", ttl_of(2000ms)).release();
    c.acquire("durable", ttl_of(2000ms)).release();
  }
  std::lock_guard lk(mu);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("innodb_flush_log_at_trx_commit"), std::string::npos) << warnings[0];
  EXPECT_EQ(warnings[0].find(MariadbServer::kPassword), std::string::npos) << warnings[0];
}

// list() reads the rows: held locks with their token and holder, by prefix, in order.
TEST(Mysql, ListShowsHeldLocksByPrefix) {
  MariadbServer server;
  auto c = distlock::connect(server.url(), quiet());
  auto l1 = c.acquire("jobs/b", ttl_of(5000ms));
  auto l2 = c.acquire("jobs/a", ttl_of(5000ms));
  auto l3 = c.acquire("other", ttl_of(5000ms));
  c.acquire("jobs/released", ttl_of(5000ms)).release();
  const auto listed = c.list("jobs/");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].name, "jobs/a");
  EXPECT_EQ(listed[1].name, "jobs/b");
  EXPECT_EQ(listed[0].info.token, l2.token());
  bool truncated = false;
  EXPECT_EQ(c.list("", 1, truncated).size(), 1u);
  EXPECT_TRUE(truncated);
}

// A server whose sessions start with autocommit off (autocommit=0 in its configuration)
// must not leave a token write in a transaction that never commits: the session's end
// would roll it back, and the next holder would get the same token again.
TEST(Mysql, TokensCommitOnAServerWhoseSessionsStartWithoutAutocommit) {
  MariadbServer server;
  server.query("SET GLOBAL autocommit = 0");
  std::uint64_t first = 0;
  {
    auto c = distlock::connect(server.url(), quiet());
    auto l = c.acquire("nocommit", ttl_of(5000ms));
    first = l.token();
    // Another session sees the token row as soon as the lease is granted.
    EXPECT_EQ(
        server.query("SELECT COUNT(*) FROM distlock_test.distlock_locks WHERE name = 'nocommit' AND token "
                     "= " +
                     std::to_string(first))[0][0],
        "1");
    l.release();
  }  // the client's sessions end here
  auto b = distlock::connect(server.url(), quiet());
  auto again = b.acquire("nocommit", ttl_of(5000ms, 10000ms));
  EXPECT_GT(again.token(), first);
  again.release();
}

// Statements the server has run for clients so far.
long long questions(const MariadbServer& s) {
  return std::stoll(s.query("SHOW GLOBAL STATUS LIKE 'Questions'")[0][1]);
}

// A holder whose session ended without a release (its process was killed: the server
// frees the named lock at once, the row keeps others out until the lease's time has
// passed). A waiter then waits for that time: its wait inside the server must not be
// answered (the named lock is free) and retried over and over until then.
TEST(Mysql, AWaiterForADeadHoldersLeaseDoesNotSpinUntilItsTimeHasPassed) {
  MariadbServer server;
  KilledHolder dead;
  ASSERT_NO_FATAL_FAILURE(kill_holder_after_acquire(server, "dead", 3000, dead));
  auto c = distlock::connect(server.url(), quiet());
  const long long before = questions(server);
  auto l = c.acquire("dead", ttl_of(5000ms, 20000ms));
  const long long asked = questions(server) - before;
  RecordProperty("statements_while_waiting", static_cast<int>(asked));
  EXPECT_LT(since(dead.killed_at), 3000ms + 1000ms);
  // Seconds of waiting: a few acquire batches and waits (each batch is about ten
  // statements), not one round per millisecond.
  EXPECT_LT(asked, 200) << "statements run while waiting out a dead holder's lease of 3s";
}

// A client whose shared connection died with a server restart: a wait it gave up must
// still be ended on the server when it closes (the KILL goes over a new connection),
// not left blocked in GET_LOCK until the lock is freed.
TEST(Mysql, AWaitGivenUpAfterAServerRestartIsCancelledOnTheServer) {
  MariadbServer server;
  std::optional<distlock::Client> b(distlock::connect(server.url(), quiet()));
  server.restart();  // b's shared connection is gone; b has not used it since
  auto a = distlock::connect(server.url(), quiet());
  auto held = a.acquire("after-restart", ttl_of(20000ms));
  std::error_code ec;
  b->acquire("after-restart", ttl_of(5000ms, 1500ms), ec);
  EXPECT_EQ(ec, errc::timeout);
  b.reset();
  ASSERT_TRUE(eventually([&] { return waits_in_server(server) == 0; }, 5000ms))
      << "the closed client's wait is still blocked in GET_LOCK on the server";
  EXPECT_TRUE(held.owns());
  held.release();
}

}  // namespace distlock::testing
