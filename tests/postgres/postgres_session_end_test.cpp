// postgres:// when the session ends early: no second holder, release after it, the TTL range.
// Written by the adversarial review of postgres:// (commit 1ac950a, first named
// postgres_session_end_test.cpp).
//
// postgres:// under adversarial review: a lease is a session-level advisory lock,
// and the server frees it the moment the session ends. These tests end the session
// early (the connection cut under a live holder, a server restart) and check that
// nobody else gets the lock while the holder still believes it holds it; plus the
// release of such a lease and the TTL range the session timeout can express.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/fault_proxy.hpp"
#include "support/incompressible_name.hpp"
#include "support/postgres_server.hpp"
#include "support/sql_lock_cases.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Polls try_acquire (one attempt each, bounded in count and time) until it gets the
// lock; returns it, or nullopt when `limit` passed.
std::optional<distlock::Lease> poll_acquire(distlock::Client& c, const std::string& name, Millis ttl,
                                            Millis limit) {
  const auto end = Clock::now() + limit;
  for (int i = 0; i < 100000 && Clock::now() < end; ++i) {
    std::error_code ec;
    auto l = c.acquire(name, ttl_of(ttl, 0ms), ec);
    if (!ec) return l;
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

// Client `a` takes `name` (TTL 60 s: its first renewal 20 s after the acquire), then
// `end_session` ends its session on the server under it while it lives, then client `b` polls for
// the lock for `poll_for`. If `b` gets it, tokens must have increased and the first holder must
// no longer own it: two holders otherwise (`how` says how its session ended, for the message).
void expect_nobody_else_in_while_it_owns(distlock::Client& a, distlock::Client& b, const std::string& name,
                                         const std::function<void()>& end_session, Millis poll_for,
                                         const std::string& how) {
  const Millis ttl = 60000ms;
  const auto acquired_at = Clock::now();
  auto held = a.acquire(name, ttl_of(ttl));
  ASSERT_TRUE(held.owns());
  end_session();
  auto other = poll_acquire(b, name, ttl, poll_for);
  const bool first_still_owns = held.owns();
  const Millis when = since(acquired_at);
  ::testing::Test::RecordProperty("second_acquired_after_ms", static_cast<int>(when.count()));
  if (other) {
    EXPECT_GT(other->token(), held.token());
    EXPECT_FALSE(first_still_owns)
        << "two holders of \"" << name << "\": another client acquired it (token " << other->token() << ") "
        << when.count() << " ms after the first holder's acquire, while the first holder (TTL 60 s, " << how
        << ") still owns it (token " << held.token() << ")";
  }
}

// The holder's connection is cut (the proxy closes both sides, as a dying router or
// a reset would) while the holder lives. The server ends the session at once and
// frees the advisory lock; the holder learns nothing until its next renewal (a third
// of its TTL later) and owns() stays true until then. Another client that gets the
// lock meanwhile is a second holder. Contract 1 requires that nobody else gets the
// lock before the first holder's local deadline (or that the holder stops first).
TEST(PostgresSessionEnd, AConnectionCutUnderALiveHolderLetsNobodyElseInWhileItStillOwns) {
  PostgresServer server;
  FaultProxy proxy(server.port());
  auto a = distlock::connect(PostgresServer::url_through(proxy.port()), quiet());
  auto b = distlock::connect(server.url(), quiet());
  // Polled well inside the holder's first renewal interval (20 s) and its TTL (60 s).
  expect_nobody_else_in_while_it_owns(
      a, b, "cut", [&] { proxy.drop(); }, 8000ms, "its connection cut");
}

// The server restarted (fast shutdown, started again) while a lock is held: the
// restart ended the holder's session, so the lock is free at once on the restarted
// server, while the holder (whose next renewal is a third of its TTL away) still
// owns it. Tokens do increase; exclusion does not hold.
TEST(PostgresSessionEnd, AServerRestartLetsNobodyElseInWhileTheHolderStillOwns) {
  PostgresServer server;
  auto a = distlock::connect(server.url(), quiet());
  auto b = distlock::connect(server.url(), quiet());
  expect_nobody_else_in_while_it_owns(
      a, b, "restarted",
      [&] {
        server.stop();
        server.restart();
      },
      10000ms, "its session ended by the restart");
}

// The release of a lease whose session the server has already ended (connection
// cut): the lock is lost (another client may hold it by now), so the release must
// say lost (contract 2), not a transient error that says "it will expire by its TTL".
TEST(PostgresSessionEnd, ReleaseAfterTheSessionEndedReportsLost) {
  PostgresServer server;
  FaultProxy proxy(server.port());
  auto a = distlock::connect(PostgresServer::url_through(proxy.port()), quiet());
  auto held = a.acquire("cut-release", ttl_of(60000ms));
  proxy.drop();
  // The server has ended the session: the advisory lock is gone.
  const auto end = Clock::now() + 10s;
  while (Clock::now() < end &&
         server.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0] != "0") {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(server.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0], "0");
  const std::stop_token stop = held.stop_token();  // the lease is empty after release()
  std::error_code ec;
  held.release(ec);
  EXPECT_EQ(ec, errc::lost) << "release of a lease whose session the server ended said: " << ec.message();
  EXPECT_TRUE(stop.stop_requested()) << "the lost lease was never signalled lost";
}

// A TTL the engine accepts (<= 366 days) but that idle_session_timeout cannot hold
// (its limit is INT_MAX ms, about 24.8 days): the error must be invalid_argument and
// name the limit, not backend_unavailable "cannot connect" (the server is fine).
TEST(PostgresSessionEnd, ATtlBeyondTheSessionTimeoutRangeIsInvalidArgumentNamingTheLimit) {
  PostgresServer server;
  auto a = distlock::connect(server.url(), quiet());
  std::error_code ec;
  std::string what;
  try {
    auto l = a.acquire("long-ttl", ttl_of(Millis(std::chrono::hours(24 * 25)), 0ms));
    ADD_FAILURE() << "a 25-day TTL was granted";
  } catch (const std::system_error& e) {
    ec = e.code();
    what = e.what();
  }
  EXPECT_EQ(ec, errc::invalid_argument) << what;
  EXPECT_NE(what.find("idle_session_timeout"), std::string::npos) << what;
  // The server was reachable all along: a short TTL works on the same client.
  std::error_code ec2;
  auto ok = a.acquire("short-ttl", ttl_of(2000ms, 0ms), ec2);
  EXPECT_FALSE(ec2) << ec2.message();
}

}  // namespace

namespace {

// A 4096-byte name (the engine's limit) that does not compress: every backend takes
// it as a lock name, and postgres:// must too (or refuse it as invalid_argument at
// once); the name's row must not be beyond what the table's index can hold.
TEST(PostgresSessionEnd, ALongIncompressibleNameWithinTheEngineLimitCanBeLocked) {
  PostgresServer server;
  auto log = std::make_shared<std::string>();
  auto log_mu = std::make_shared<std::mutex>();
  distlock::ClientOptions co;
  co.logger = [log, log_mu](distlock::LogLevel, std::string_view m) {
    std::lock_guard lk(*log_mu);
    *log += std::string(m.substr(m.size() > 300 ? m.size() - 300 : 0)) + "\n";
  };
  auto a = distlock::connect(server.url(), co);
  const std::string name = incompressible_name(4096, 0x9e3779b97f4a7c15ULL);
  std::error_code ec;
  std::string what;
  try {
    auto l = a.acquire(name, ttl_of(2000ms, 0ms));
    EXPECT_TRUE(l.owns());
    EXPECT_GT(l.token(), 0u);
    // Held: its advisory lock is on the server while the lease lives.
    EXPECT_EQ(server.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0], "1");
  } catch (const std::system_error& e) {
    ec = e.code();
    what = e.what();
  }
  {
    std::lock_guard lk(*log_mu);
    EXPECT_FALSE(ec) << what.substr(what.size() > 200 ? what.size() - 200 : 0) << "\nclient log (tails):\n"
                     << *log;
  }
  // Nothing is left held after a failure, nor after the lease's release (its
  // destructor ran at the end of the try block).
  EXPECT_EQ(server.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0], "0");
}

}  // namespace

namespace {

// A renewal batch is checked against the session's bookkeeping (find_holder) for
// every item first, then each session's SELECT runs in turn. While the batch waits
// on an earlier session (here: that session's server process is stopped), the holder
// of "race" releases it and the same client acquires it again (a new owner on the
// same session). When the batch reaches that session, the old owner's item finds
// the row naming the new owner, and the "row names someone else" branch erases the
// NEW owner's entry and runs pg_advisory_unlock on the session: the new lease's lock
// is gone on the server while it owns() it. Contract 4 (never delete another
// owner's lock) and 1 (another client gets it: two holders).
TEST(PostgresSessionEnd, ARenewalInFlightAcrossAReleaseAndReacquireNeverUnlocksTheNewLease) {
  PostgresServer server;
  // renew() walks a client's sessions in the map order of their addresses: the race
  // shows only when the "race" session comes after a stopped one. Each attempt is a
  // new client (new sessions, new addresses); the assertions hold in every attempt.
  int attempts_blocked = 0;
  for (int attempt = 0; attempt < 6 && !HasFailure(); ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    const std::string race = "race" + std::to_string(attempt);
    auto a = distlock::connect(server.url(), quiet());
    auto b = distlock::connect(server.url(), quiet());
    std::vector<distlock::Lease> pads;
    for (int i = 0; i < 4; ++i) {
      pads.push_back(
          a.acquire("pad" + std::to_string(attempt) + "-" + std::to_string(i), ttl_of(Millis(60000 + i))));
    }
    auto old_lease = a.acquire(race, ttl_of(61000ms));
    std::vector<pid_t> pad_pids;
    for (const auto& row :
         server.query("SELECT DISTINCT d.pid FROM distlock_locks d WHERE d.owner IS NOT NULL"
                      " AND d.name LIKE 'pad" +
                      std::to_string(attempt) + "-%'::bytea")) {
      pad_pids.push_back(static_cast<pid_t>(std::stol(row[0])));
    }
    ASSERT_EQ(pad_pids.size(), 4u);
    for (pid_t p : pad_pids) ASSERT_EQ(::kill(p, SIGSTOP), 0);
    std::atomic<bool> renew_done{false};
    std::thread renewer([&] {
      a.renew_now();  // blocks in the first stopped padding session's SELECT
      renew_done = true;
    });
    std::this_thread::sleep_for(300ms);  // let it get there; the assertions do not depend on it
    if (!renew_done.load()) ++attempts_blocked;
    old_lease.release();
    std::error_code ec;
    auto new_lease = a.acquire(race, ttl_of(61000ms, 0ms), ec);
    for (pid_t p : pad_pids) ::kill(p, SIGCONT);
    renewer.join();
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_TRUE(new_lease.owns());
    const auto rows = server.query(
        "SELECT count(*) FROM pg_locks l JOIN distlock_locks d ON d.pid = l.pid WHERE l.locktype = 'advisory'"
        " AND l.granted AND d.name = '" +
        race + "'::bytea");
    EXPECT_EQ(rows[0][0], "1") << "the session of the new lease of \"" << race
                               << "\" no longer holds its advisory lock";
    auto other = b.acquire(race, ttl_of(61000ms, 0ms), ec);
    const bool still_owns = new_lease.owns();
    EXPECT_TRUE(ec == errc::busy || !still_owns)
        << "two holders of \"" << race << "\": another client acquired it (token " << (ec ? 0 : other.token())
        << ") while the same-client re-acquisition (token " << new_lease.token() << ") owns it";
  }
  RecordProperty("attempts_with_the_renewal_blocked", attempts_blocked);
}

}  // namespace

namespace {

// Any server process that crashes (here: an unrelated session's backend, SIGKILLed as
// the OOM killer would) makes the postmaster end every session and reinitialise:
// every advisory lock of every client is free a moment later, while their holders
// (next renewal a third of the TTL away) still own them.
TEST(PostgresSessionEnd, AnUnrelatedBackendCrashLetsNobodyElseInWhileTheHolderStillOwns) {
  PostgresServer server;
  auto a = distlock::connect(server.url(), quiet());
  auto b = distlock::connect(server.url(), quiet());
  const auto acquired_at = Clock::now();
  auto held = a.acquire("crash-elsewhere", ttl_of(60000ms));  // first renewal 20 s later
  const std::string port = std::to_string(server.port());
  const char* keys[] = {"host", "port", "user", "password", "dbname", nullptr};
  const char* vals[] = {"127.0.0.1", port.c_str(), PostgresServer::kUser, PostgresServer::kPassword,
                        "postgres",  nullptr};
  PGconn* unrelated = PQconnectdbParams(keys, vals, 0);
  ASSERT_EQ(PQstatus(unrelated), CONNECTION_OK) << PQerrorMessage(unrelated);
  const pid_t victim = PQbackendPID(unrelated);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  auto other = poll_acquire(b, "crash-elsewhere", 60000ms, 15000ms);
  const bool first_still_owns = held.owns();
  const Millis when = since(acquired_at);
  PQfinish(unrelated);
  RecordProperty("second_acquired_after_ms", static_cast<int>(when.count()));
  if (other) {
    EXPECT_FALSE(first_still_owns)
        << "two holders of \"crash-elsewhere\": another client acquired it (token " << other->token() << ") "
        << when.count()
        << " ms after the first holder's acquire, while the first holder (TTL 60 s) "
           "still owns it (token "
        << held.token() << ")";
  }
}

}  // namespace

}  // namespace distlock::testing
