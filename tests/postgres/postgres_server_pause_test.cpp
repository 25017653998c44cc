// The test harness's "server paused" fault (PostgresServer::pause/resume,
// tests/support/postgres_server.hpp) freezes the whole server: not only the postmaster
// but every backend serving an existing session, which PostgreSQL puts in a process
// group of its own. The conformance suite and the nemesis use this fault to claim how
// postgres:// behaves under a hung server, so the fault must be what it says.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <poll.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "support/postgres_server.hpp"
#include "support/process.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::testing::PostgresServer;
using Clock = std::chrono::steady_clock;

struct ConnDeleter {
  void operator()(PGconn* c) const { PQfinish(c); }
};
using Conn = std::unique_ptr<PGconn, ConnDeleter>;

Conn connect(const PostgresServer& server) {
  const std::string port = std::to_string(server.port());
  const char* keys[] = {"host", "port", "user", "password", "dbname", "connect_timeout", nullptr};
  const char* vals[] = {
      "127.0.0.1", port.c_str(), PostgresServer::kUser, PostgresServer::kPassword, "postgres", "5", nullptr};
  return Conn(PQconnectdbParams(keys, vals, 0));
}

// Waits (poll on the session's socket, bounded by `timeout`) for the answer to the query
// sent on `c`; true when it is complete, false when the timeout passed first.
bool answer_within(PGconn* c, std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  for (;;) {
    if (!PQconsumeInput(c)) return false;
    if (!PQisBusy(c)) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
    if (left <= 0ms) return false;
    pollfd p{PQsocket(c), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
  }
}

TEST(PostgresServerPause, FreezesTheBackendOfAnExistingSession) {
  PostgresServer server;
  Conn conn = connect(server);
  ASSERT_EQ(PQstatus(conn.get()), CONNECTION_OK) << PQerrorMessage(conn.get());
  const int backend = PQbackendPID(conn.get());
  ASSERT_GT(backend, 0);
  ASSERT_NE(backend, server.pid());

  server.pause();
  // pause() returns once the server is stopped: the session's backend process included.
  EXPECT_EQ(distlock::testing::process_state(backend), 'T')
      << "the backend of an existing session was left running";
  EXPECT_EQ(distlock::testing::process_state(server.pid()), 'T') << "the postmaster was left running";

  // A query on the existing session gets no answer while the server is paused. Bound:
  // 1 s on this process's steady clock, against an answer that takes milliseconds.
  ASSERT_EQ(PQsendQuery(conn.get(), "SELECT 1"), 1) << PQerrorMessage(conn.get());
  ASSERT_EQ(PQflush(conn.get()), 0);
  EXPECT_FALSE(answer_within(conn.get(), 1000ms)) << "a session answered on a paused server";

  server.resume();
  // After resume() the same session answers (bound: 10 s, far above a loaded machine's delay).
  ASSERT_TRUE(answer_within(conn.get(), 10000ms)) << "no answer after resume: " << PQerrorMessage(conn.get());
  PGresult* r = PQgetResult(conn.get());
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(PQresultStatus(r), PGRES_TUPLES_OK) << PQresultErrorMessage(r);
  EXPECT_STREQ(PQgetvalue(r, 0, 0), "1");
  PQclear(r);
  while ((r = PQgetResult(conn.get())) != nullptr) PQclear(r);
  EXPECT_NE(distlock::testing::process_state(backend), 'T');
  EXPECT_EQ(server.query("SELECT 2"), (std::vector<std::vector<std::string>>{{"2"}}));
}

TEST(PostgresServerPause, SessionsOpenedAfterResumeArePausedToo) {
  // The postmaster forks a backend per session (and restarts its auxiliary processes):
  // pause() stops the children alive at its call, whichever they are.
  PostgresServer server;
  server.pause();
  server.resume();
  Conn conn = connect(server);
  ASSERT_EQ(PQstatus(conn.get()), CONNECTION_OK) << PQerrorMessage(conn.get());
  const int backend = PQbackendPID(conn.get());
  server.pause();
  EXPECT_EQ(distlock::testing::process_state(backend), 'T')
      << "the backend of a session opened after a resume was left running";
  server.resume();
  EXPECT_EQ(server.query("SELECT 3"), (std::vector<std::vector<std::string>>{{"3"}}));
}

}  // namespace
