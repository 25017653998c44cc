// postgres:// lease sessions at their edges: a release that gets no answer (not a
// loss), a lease the engine declared lost handed back with forget() (its advisory
// lock freed at once), and a session whose startup options were dropped on the way
// (a transaction-pooling proxy) refused at connect.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/backend_error.hpp"
#include "engine/url.hpp"
#include "postgres/pg_conn.hpp"
#include "postgres/postgres_backend.hpp"
#include "support/client_options.hpp"
#include "support/fault_proxy.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"
#include "support/sql_lock_cases.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using distlock::detail::AcquireRequest;
using distlock::detail::Backend;
using Clock = std::chrono::steady_clock;

std::string advisory_locks(const PostgresServer& s) {
  return s.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0];
}

// ---- item 7: a release without an answer is not a loss ---------------------------

// The holder's connection freezes (a partition TCP does not see) just before it
// releases, 0.2 s into a 6 s lease. No answer within the 1 s statement timeout is no
// evidence that the server no longer held the lock: the release is a transient error
// (as on redis:// and etcd://), the lease is not signalled lost, and the server frees
// the lock by the session's idle timeout (one TTL after the last statement).
TEST(PostgresSession, AReleaseWithoutAnAnswerIsATransientErrorNotALoss) {
  PostgresServer server;
  FaultProxy proxy(server.port());
  auto a = distlock::connect(PostgresServer::url_through(proxy.port()), quiet(1000ms));
  auto b = distlock::connect(server.url(), quiet(5000ms));
  const Millis ttl = 6000ms;
  const auto acquired_at = Clock::now();
  auto held = a.acquire("frozen-release", ttl_of(ttl));
  const std::uint64_t token = held.token();
  std::this_thread::sleep_for(200ms);
  proxy.freeze();
  const std::stop_token stop = held.stop_token();
  const auto t0 = Clock::now();
  std::error_code ec;
  held.release(ec);
  const Millis took = since(t0);
  EXPECT_TRUE(ec) << "a release without an answer succeeded";
  EXPECT_NE(ec, errc::lost) << ec.message();
  EXPECT_EQ(ec, errc::backend_unavailable) << ec.message();
  EXPECT_FALSE(stop.stop_requested()) << "the lease was signalled lost";
  EXPECT_LT(took, 3000ms) << "the release waited past its 1 s statement timeout";
  // Nobody else gets it before the holder's lease ends; it is free once the server
  // ends the frozen session (idle_session_timeout = ttl after the acquire's answer).
  std::error_code bec;
  auto next = b.acquire("frozen-release", ttl_of(ttl, 15000ms), bec);
  ASSERT_FALSE(bec) << bec.message();
  EXPECT_GE(since(acquired_at), ttl - 100ms)
      << "another client got the lock while the lease could still be held";
  EXPECT_LT(since(acquired_at), ttl + 7000ms);
  EXPECT_GT(next.token(), token);
}

// A connection that is cut (closed) before the release still reports the loss: the
// server has ended the session and may have given the lock to somebody else.
TEST(PostgresSession, AReleaseOnACutConnectionIsStillALoss) {
  PostgresServer server;
  FaultProxy proxy(server.port());
  auto a = distlock::connect(PostgresServer::url_through(proxy.port()), quiet(1000ms));
  auto held = a.acquire("cut-release", ttl_of(60000ms));
  proxy.drop();
  const auto end = Clock::now() + 10s;
  while (Clock::now() < end && advisory_locks(server) != "0") std::this_thread::sleep_for(20ms);
  ASSERT_EQ(advisory_locks(server), "0");
  std::error_code ec;
  held.release(ec);
  EXPECT_EQ(ec, errc::lost) << ec.message();
}

#ifdef DISTLOCK_CLI_PATH
// The same through `distlock run`: a job that ends 1 s into a 6 s lease while the
// connection is frozen exits with its own status (0) and a warning, not 76 ("the server
// no longer held it").
TEST(PostgresSession, DistlockRunWhoseReleaseGetsNoAnswerKeepsTheJobsStatus) {
  PostgresServer server;
  FaultProxy proxy(server.port());
  TempDir dir("distlock-pg-run-release");
  const std::string started = (dir.path() / "started").string();
  const std::string out = (dir.path() / "out").string();
  Process run = Process::spawn(
      {DISTLOCK_CLI_PATH, "run", "--url", PostgresServer::url_through(proxy.port(), "?timeout=1s"), "--ttl",
       "6s", "frozen-run", "--", "sh", "-c", "touch " + started + "; sleep 1"},
      out);
  const auto end = Clock::now() + 20s;
  while (Clock::now() < end && !std::filesystem::exists(started)) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(std::filesystem::exists(started)) << "the job never started";
  proxy.freeze();  // the job ends 1 s later; its release gets no answer
  const int status = run.wait_for(20000ms);
  ASSERT_NE(status, -1) << "distlock run did not exit";
  std::ifstream in(out);
  std::stringstream said;
  said << in.rdbuf();
  ASSERT_TRUE(WIFEXITED(status)) << said.str();
  EXPECT_EQ(WEXITSTATUS(status), 0) << said.str();
  EXPECT_NE(said.str().find("release"), std::string::npos) << "no warning about the release: " << said.str();
}
#endif

// ---- item 4: forget() frees the advisory lock of exactly that lease --------------

std::unique_ptr<Backend> backend(const std::string& url) {
  distlock::detail::Url u;
  distlock::detail::Error ec;
  EXPECT_FALSE(ec = distlock::detail::parse_url(url, u)) << ec.detail();
  auto b = distlock::detail::make_postgres_backend(u, quiet(5000ms), ec);
  EXPECT_TRUE(b) << ec.message() << ": " << ec.detail();
  return b;
}

// Two backends of one server: the first holds the leases under test, the second is another client.
std::pair<std::unique_ptr<Backend>, std::unique_ptr<Backend>> two_backends(const PostgresServer& server) {
  return {backend(server.url()), backend(server.url())};
}

distlock::detail::AcquireResult take(Backend& b, std::string_view name, std::string_view owner, Millis ttl) {
  distlock::detail::Error ec;
  auto r = b.try_acquire(AcquireRequest{name, owner, ttl}, ec);
  EXPECT_FALSE(ec) << ec.message() << ": " << ec.take_detail();
  return r;
}

// The engine declared a 60 s lease lost (its hold bound, a refused renewal) and hands
// it back: its advisory lock is freed and its row cleared at once, so the same client
// and another one take the name again without waiting for the server to expire it.
TEST(PostgresSession, ForgetFreesTheLostLeaseAtOnceForThisClientAndAnother) {
  PostgresServer server;
  auto [a, b] = two_backends(server);
  ASSERT_TRUE(a && b);
  const Millis ttl = 60000ms;
  auto first = take(*a, "job", "owner-1", ttl);
  ASSERT_TRUE(first.acquired);
  EXPECT_FALSE(take(*b, "job", "owner-b", ttl).acquired);

  // Not this lease: another owner, another token, another name: nothing is freed.
  a->forget("job", "owner-2", first.token);
  a->forget("job", "owner-1", first.token + 1);
  a->forget("other", "owner-1", first.token);
  EXPECT_EQ(advisory_locks(server), "1");
  EXPECT_FALSE(take(*b, "job", "owner-b", ttl).acquired);

  const auto t0 = Clock::now();
  a->forget("job", "owner-1", first.token);
  const Millis forget_took = since(t0);
  auto again = take(*a, "job", "owner-3", ttl);  // the same client, a new owner
  const Millis retake = since(t0);
  ASSERT_TRUE(again.acquired) << "the same client could not take the lock it was told was lost";
  EXPECT_GT(again.token, first.token);
  EXPECT_LT(forget_took, 1000ms);
  EXPECT_LT(retake, 1000ms);

  a->forget("job", "owner-3", again.token);
  const auto t1 = Clock::now();
  auto other = take(*b, "job", "owner-b", ttl);  // another client
  EXPECT_LT(since(t1), 1000ms);
  ASSERT_TRUE(other.acquired) << "another client could not take a lock whose lease was handed back";
  EXPECT_GT(other.token, again.token);
  EXPECT_EQ(server.query("SELECT count(*) FROM distlock_locks WHERE owner IS NOT NULL")[0][0], "1");
  // A forgotten lease is not renewed nor released any more.
  distlock::detail::Error ec;
  EXPECT_EQ(a->release("job", "owner-3", again.token, ec), distlock::detail::ReleaseStatus::not_owner);
}

// Through the engine: a 60 s lease whose hold bound (500 ms) is reached is declared
// lost, handed back (forget) and freed at once, so the same client and another client
// take the name again within 1 s of the loss, long before the session's idle timeout.
TEST(PostgresSession, ALeaseLostToItsHoldBoundIsFreeAtOnceForThisClientAndAnother) {
  PostgresServer server;
  auto a = distlock::connect(server.url(), quiet(5000ms));
  auto b = distlock::connect(server.url(), quiet(5000ms));
  LockOptions bounded = ttl_of(60000ms);
  bounded.max_hold = 500ms;
  auto lost = a.acquire("bounded", bounded);
  const std::uint64_t lost_token = lost.token();
  const auto end = Clock::now() + 10s;
  while (Clock::now() < end && !lost.stop_token().stop_requested()) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(lost.stop_token().stop_requested()) << "the hold bound never fired";
  const auto t0 = Clock::now();
  std::error_code ec;
  auto other = b.acquire("bounded", ttl_of(60000ms, 3000ms), ec);
  ASSERT_FALSE(ec) << ec.message() << " after " << since(t0).count() << " ms";
  EXPECT_LT(since(t0), 1000ms);
  const std::uint64_t other_token = other.token();
  EXPECT_GT(other_token, lost_token);
  other.release();
  const auto t1 = Clock::now();
  auto again = a.acquire("bounded", ttl_of(60000ms, 3000ms), ec);
  ASSERT_FALSE(ec) << ec.message() << " after " << since(t1).count() << " ms";
  EXPECT_LT(since(t1), 1000ms);
  EXPECT_GT(again.token(), other_token);
}

// Giving up fails on the table (renamed away): the advisory lock alone is freed, and
// the row still naming the owner keeps everybody out until its seen_at + ttl_ms, as
// for a session that ended without a release: nobody gets in early.
TEST(PostgresSession, ForgetWhenTheTableFailsFreesTheLockButTheRowGuardsTheTtl) {
  PostgresServer server;
  auto [a, b] = two_backends(server);
  ASSERT_TRUE(a && b);
  const Millis ttl = 3000ms;
  const auto t0 = Clock::now();
  auto first = take(*a, "guarded", "owner-1", ttl);
  ASSERT_TRUE(first.acquired);
  server.query("ALTER TABLE distlock_locks RENAME TO distlock_locks_away");
  a->forget("guarded", "owner-1", first.token);
  EXPECT_EQ(advisory_locks(server), "0") << "the advisory lock was kept";
  server.query("ALTER TABLE distlock_locks_away RENAME TO distlock_locks");
  auto early = take(*b, "guarded", "owner-b", ttl);
  EXPECT_FALSE(early.acquired) << "taken " << since(t0).count() << " ms after the lost lease's acquire";
  const auto end = Clock::now() + 10s;
  distlock::detail::AcquireResult later;
  while (Clock::now() < end && !(later = take(*b, "guarded", "owner-b", ttl)).acquired) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(later.acquired);
  EXPECT_GE(since(t0), ttl);
  EXPECT_GT(later.token, first.token);
}

// ---- item 12: the session's settings must have taken effect ----------------------

// PgBouncer in transaction mode drops the startup packet's `options` (and may hand the
// statements to a server session that never had them). The proxy here does what it
// does: it strips "options" from the startup packet. The client must refuse at
// connect, naming the setting, rather than hold leases on a session without its idle
// timeout.
bool strip_options(std::string& head) {
  if (head.size() < 8) return false;
  const auto be32 = [&](std::size_t at) {
    return (static_cast<std::uint32_t>(static_cast<unsigned char>(head[at])) << 24) |
           (static_cast<std::uint32_t>(static_cast<unsigned char>(head[at + 1])) << 16) |
           (static_cast<std::uint32_t>(static_cast<unsigned char>(head[at + 2])) << 8) |
           static_cast<std::uint32_t>(static_cast<unsigned char>(head[at + 3]));
  };
  const std::uint32_t len = be32(0);
  if (head.size() < len) return false;
  if (be32(4) != 0x00030000) return true;  // not a startup packet: forward as is
  std::string body;
  std::size_t p = 8;
  while (p < len && head[p] != '\0') {
    const std::size_t k_end = head.find('\0', p);
    const std::size_t v_end = head.find('\0', k_end + 1);
    const std::string key = head.substr(p, k_end - p);
    if (key != "options") body += head.substr(p, v_end + 1 - p);
    p = v_end + 1;
  }
  body.push_back('\0');
  const std::uint32_t n = static_cast<std::uint32_t>(8 + body.size());
  std::string out;
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((n >> s) & 0xff));
  out += head.substr(4, 4) + body + head.substr(len);
  head = std::move(out);
  return true;
}

TEST(PostgresSession, ASessionWhoseStartupOptionsWereDroppedIsRefusedAtConnect) {
  PostgresServer server;
  FaultProxy proxy(server.port());
  proxy.set_head_rewriter(&strip_options);
  try {
    auto c = distlock::connect(PostgresServer::url_through(proxy.port(), "?sslmode=disable"), quiet(5000ms));
    // connect() opens the shared and listening connections (idle timeout 0 asked and
    // got: the default); the lease session is opened by the first acquisition.
    std::error_code ec;
    auto l = c.acquire("pooled", ttl_of(5000ms, 0ms), ec);
    ASSERT_TRUE(ec) << "a lease was granted on a session without its idle timeout";
    EXPECT_EQ(ec, errc::not_supported) << ec.message();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::not_supported) << e.what();
    EXPECT_NE(std::string(e.what()).find("idle_session_timeout"), std::string::npos) << e.what();
  }
  EXPECT_EQ(advisory_locks(server), "0");
}

// The check itself, on real sessions: one opened with the settings passes, one opened
// without (or with other values) fails naming each setting that differs.
TEST(PostgresSession, TheSessionCheckNamesEverySettingThatDidNotTakeEffect) {
  PostgresServer server;
  const std::string port = std::to_string(server.port());
  auto open_with = [&](const char* options) {
    const char* keys[] = {"host", "port", "user", "password", "dbname", "options", nullptr};
    const char* vals[] = {
        "127.0.0.1", port.c_str(), PostgresServer::kUser, PostgresServer::kPassword, "postgres",
        options,     nullptr};
    PGconn* c = PQconnectdbParams(keys, vals, 0);
    EXPECT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
    return distlock::detail::pg::Conn(c);
  };
  auto good = open_with(
      "-c idle_session_timeout=4000 -c idle_in_transaction_session_timeout=4000 -c synchronous_commit=on");
  std::error_code ec;
  EXPECT_EQ(distlock::detail::pg::check_session(good.get(), 4000ms, 5000ms, ec), "");
  EXPECT_FALSE(ec) << ec.message();
  auto plain = open_with("-c synchronous_commit=off");
  const std::string why = distlock::detail::pg::check_session(plain.get(), 4000ms, 5000ms, ec);
  EXPECT_EQ(ec, errc::not_supported) << ec.message();
  EXPECT_NE(why.find("idle_session_timeout is 0 instead of 4000"), std::string::npos) << why;
  EXPECT_NE(why.find("idle_in_transaction_session_timeout is 0 instead of 4000"), std::string::npos) << why;
  EXPECT_NE(why.find("synchronous_commit is off instead of on"), std::string::npos) << why;
  EXPECT_NE(why.find("PgBouncer"), std::string::npos) << why;
}

}  // namespace

}  // namespace distlock::testing
