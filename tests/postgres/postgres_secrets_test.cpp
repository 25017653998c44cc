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
#include <vector>

#include "distlock/distlock.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::testing::PostgresServer;
using distlock::testing::Process;
using distlock::testing::TempDir;

distlock::ClientOptions quick() {
  distlock::ClientOptions o;
  o.connect_timeout = 3000ms;
  o.command_timeout = 3000ms;
  o.logger = [](distlock::LogLevel, std::string_view) {};
  return o;
}

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
      // The password as the user: the server answers that the role does not exist.
      "postgres://SECRETb@" + host + "/postgres",
      "postgres://SECRETc%40x@" + host + "/postgres",
      // Unknown database, right password, and the password as the user with one.
      "postgres://distlock:" + std::string(PostgresServer::kPassword) + "@" + host + "/SECRETd",
      "postgres://SECRETe@" + host + "/SECRETf",
  };
}

TEST(PostgresSecrets, NoErrorOfTheLibraryQuotesTheSecret) {
  PostgresServer server;
  for (const auto& url : urls_of(server)) {
    std::string what;
    try {
      auto c = distlock::connect(url, quick());
    } catch (const std::system_error& e) {
      what = e.what();
    }
    EXPECT_FALSE(what.empty()) << url << ": connected";
    EXPECT_EQ(what.find("SECRET"), std::string::npos) << url << "\n  said: " << what;
  }
  // The server did see the attempts (the test reaches it, not only the parser).
  EXPECT_NE(server.log().find("SECRETb"), std::string::npos)
      << "no attempt reached the server as role SECRETb";
}

#ifdef DISTLOCK_CLI_PATH
TEST(PostgresSecrets, NoErrorOfTheCliQuotesTheSecret) {
  PostgresServer server;
  TempDir dir("distlock-pg-secrets");
  int n = 0;
  for (const auto& url : urls_of(server)) {
    const std::string out = (dir.path() / ("out" + std::to_string(n++))).string();
    Process p = Process::spawn({DISTLOCK_CLI_PATH, "status", "--url", url, "job"}, out);
    const int status = p.wait_for(20000ms);
    ASSERT_NE(status, -1) << url << ": the CLI did not exit";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << url << ": exit status " << status;
    std::ifstream in(out);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_FALSE(text.str().empty()) << url << ": said nothing";
    EXPECT_EQ(text.str().find("SECRET"), std::string::npos) << url << "\n  said: " << text.str();
  }
}
#endif

}  // namespace
