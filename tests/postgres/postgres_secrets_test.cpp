// postgres:// never prints a secret of its URL, against a real server that answers:
// a wrong password, an unknown role (a password written alone as the user, which the
// server names in "role ... does not exist"), an unknown database, and passwords
// holding '@', '/', '?', '#', '%' written unencoded (the text an unencoded '@' pushes
// into the path is the database the server is asked for). The library's what() and,
// when the CLI is built, `distlock status`'s stderr are checked.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::testing::PostgresServer;
using distlock::testing::Process;
using distlock::testing::quiet;
using distlock::testing::TempDir;

// Every secret contains "SECRET"; the server's user, host and database do not.
std::vector<std::string> urls_of(const PostgresServer& s) {
  const std::string host = "127.0.0.1:" + std::to_string(s.port());
  const std::string closed = "127.0.0.1:" + std::to_string(distlock::testing::free_port());
  return {
      // Wrong password, written encoded and unencoded in every awkward way.
      "postgres://distlock:SECRET1%40%2F%3F%23%25@" + host + "/postgres",
      "postgres://distlock:SECRET2#x@" + host + "/postgres",
      "postgres://distlock:SECRET3@" + host + "/SECRET4@" + host + "/postgres",  // '@' then '/'
      "postgres://distlock:SECRET5@" + host + "?SECRET6@" + host + "/postgres",  // '@' then '?'
      "postgres://distlock:SECRET7@" + closed + "/SECRET8@" + host + "/postgres",
      "postgres://distlock:SECRET9@" + host + "/SECRETa%zz@" + host + "/postgres",
      // '@' then '/' with no further '/': the rest is the database the server is asked for.
      "postgres://distlock:SECRETb@" + host + "/SECRETc@" + host,
      // The password as the user (the server may name the role).
      "postgres://SECRETd@" + host + "/postgres",
      "postgres://SECRETe%40x@" + host + "/postgres",
      "postgres://SECRETf@" + host + "/nodb",
      // The right password, an unknown database (not a secret, shown).
      "postgres://distlock:" + std::string(PostgresServer::kPassword) + "@" + host + "/nodb",
  };
}

// `must_fail`: every URL is refused (with trust authentication a wrong password is not).
void expect_no_secret_from_connect(const PostgresServer& server, bool must_fail) {
  for (const auto& url : urls_of(server)) {
    std::string what;
    try {
      auto c = distlock::connect(url, quiet(3000ms));
    } catch (const std::system_error& e) {
      what = e.what();
    }
    if (must_fail) {
      EXPECT_FALSE(what.empty()) << url << ": connected";
    }
    EXPECT_EQ(what.find("SECRET"), std::string::npos) << url << "\n  said: " << what;
  }
}

#ifdef DISTLOCK_CLI_PATH
// `distlock status --url URL job` for each URL: it fails, says why, and never the secret.
// With `must_fail`, every command fails and says why; either way its output never holds the secret.
void expect_no_secret_from_cli(const PostgresServer& server, bool must_fail) {
  TempDir dir("distlock-pg-secrets");
  int n = 0;
  for (const auto& url : urls_of(server)) {
    const std::string out = (dir.path() / ("out" + std::to_string(n++))).string();
    Process p = Process::spawn({DISTLOCK_CLI_PATH, "status", "--url", url, "job"}, out);
    const int status = p.wait_for(20000ms);
    ASSERT_NE(status, -1) << url << ": the CLI did not exit";
    if (must_fail) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << url << ": exit " << status;
    }
    std::ifstream in(out);
    std::stringstream text;
    text << in.rdbuf();
    if (must_fail) {
      EXPECT_FALSE(text.str().empty()) << url << ": said nothing";
    }
    EXPECT_EQ(text.str().find("SECRET"), std::string::npos) << url << "\n  said: " << text.str();
  }
}

TEST(PostgresSecrets, NoErrorOfTheCliQuotesTheSecret) {
  PostgresServer server;
  expect_no_secret_from_cli(server, true);
}
#endif

// Password authentication (the harness's scram-sha-256): the server asks every role for a
// password before it says anything about the role or the database.
TEST(PostgresSecrets, NoErrorOfTheLibraryQuotesTheSecret) {
  PostgresServer server;
  expect_no_secret_from_connect(server, true);
}

// Trust authentication (as on many development and socket setups): no password is asked
// for, so the server answers `role "…" does not exist` and `database "…" does not exist`
// with the text it was given, which here holds the secret.
TEST(PostgresSecrets, NoErrorQuotesTheSecretWhenTheServerNamesTheRoleAndTheDatabase) {
  PostgresServer server;
  const std::string hba = server.query("SHOW hba_file")[0][0];
  server.query("COPY (SELECT 'host all all 127.0.0.1/32 trust') TO '" + hba + "'");
  server.query("SELECT pg_reload_conf()");
  // The reload is asynchronous: wait (bounded) until a connection without a password works.
  const std::string bare = "postgres://distlock@127.0.0.1:" + std::to_string(server.port()) + "/postgres";
  bool trusted = false;
  for (int i = 0; i < 200 && !trusted; ++i) {
    try {
      auto c = distlock::connect(bare, quiet(3000ms));
      trusted = true;
    } catch (const std::system_error&) {
      std::this_thread::sleep_for(25ms);
    }
  }
  ASSERT_TRUE(trusted) << "pg_hba.conf's trust line never took effect";
  expect_no_secret_from_connect(server, false);
#ifdef DISTLOCK_CLI_PATH
  expect_no_secret_from_cli(server, false);
#endif
  // The server did name what it was given: the messages were scrubbed, not avoided.
  const std::string log = server.log();
  EXPECT_NE(log.find("role \"SECRETd\" does not exist"), std::string::npos) << log;
  EXPECT_NE(log.find("database \"SECRETc@"), std::string::npos) << log;
}

}  // namespace
