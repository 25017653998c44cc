// The test harness's "server paused" fault (MariadbServer::pause/resume,
// tests/support/mariadb_server.hpp) freezes the whole server, existing sessions
// included. mariadbd is one process whose sessions are threads: a SIGSTOP to the process
// stops every thread, and it forks no session process (unlike PostgreSQL's backends,
// see tests/postgres/postgres_server_pause_test.cpp).
#include <gtest/gtest.h>
#include <mysql.h>
#include <poll.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "support/mariadb_server.hpp"
#include "support/process.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::testing::MariadbServer;

struct ConnDeleter {
  void operator()(MYSQL* c) const { mysql_close(c); }
};
using Conn = std::unique_ptr<MYSQL, ConnDeleter>;

// Whether the socket becomes readable (an answer arrives) within `timeout` (poll's own bound).
bool readable_within(MYSQL* c, std::chrono::milliseconds timeout) {
  pollfd p{static_cast<int>(mysql_get_socket(c)), POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

TEST(MariadbServerPause, FreezesAnExistingSession) {
  MariadbServer server;
  Conn conn(mysql_init(nullptr));
  ASSERT_NE(conn, nullptr);
  ASSERT_NE(mysql_real_connect(conn.get(), "127.0.0.1", MariadbServer::kUser, MariadbServer::kPassword,
                               MariadbServer::kDatabase, server.port(), nullptr, 0),
            nullptr)
      << mysql_error(conn.get());
  // Sessions are threads of the one server process: no child process to stop besides it.
  EXPECT_EQ(distlock::testing::child_pids(server.pid()).size(), 0u);

  server.pause();
  // Bound: 1 s on poll's clock, against an answer that takes milliseconds.
  ASSERT_EQ(mysql_send_query(conn.get(), "SELECT 1", 8), 0) << mysql_error(conn.get());
  EXPECT_FALSE(readable_within(conn.get(), 1000ms)) << "a session answered on a paused server";

  server.resume();
  ASSERT_TRUE(readable_within(conn.get(), 10000ms)) << "no answer after resume";
  ASSERT_EQ(mysql_read_query_result(conn.get()), 0) << mysql_error(conn.get());
  MYSQL_RES* res = mysql_store_result(conn.get());
  ASSERT_NE(res, nullptr) << mysql_error(conn.get());
  MYSQL_ROW row = mysql_fetch_row(res);
  ASSERT_NE(row, nullptr);
  EXPECT_STREQ(row[0], "1");
  mysql_free_result(res);
}

}  // namespace
