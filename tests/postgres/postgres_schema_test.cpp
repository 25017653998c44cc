// postgres:// and schemas: one set of tables per database, whatever the user and its
// search_path. Two login roles that each own a schema of their own name (PostgreSQL's
// default search_path is "$user", public) lock one name: the advisory lock is per
// database, so the token row and its seen_at guard must be too.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/postgres_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

std::string url_as(const PostgresServer& s, const std::string& role) {
  return "postgres://" + role + ":" + role + "-pw@127.0.0.1:" + std::to_string(s.port()) + "/postgres";
}

// A login role owning a schema of its own name, allowed to create in public (as the
// owner of public or a grant would allow; PostgreSQL 15 no longer grants it to all).
void add_role_with_own_schema(PostgresServer& s, const std::string& role) {
  s.query("CREATE ROLE " + role + " LOGIN PASSWORD '" + role + "-pw'");
  s.query("CREATE SCHEMA " + role + " AUTHORIZATION " + role);
  s.query("GRANT CREATE, USAGE ON SCHEMA public TO " + role);
}

void grant_tables(PostgresServer& s) {
  s.query("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ra, rb");
}

// ra takes tokens, then holds; rb's acquisition waits for ra's release and gets a
// larger token than every token ra was given.
TEST(PostgresSchema, TwoRolesOwningSchemasOfTheirNameShareOneTokenRowAndExcludeEachOther) {
  PostgresServer server;
  add_role_with_own_schema(server, "ra");
  add_role_with_own_schema(server, "rb");
  auto a = distlock::connect(url_as(server, "ra"), quiet());
  grant_tables(server);  // whatever the first client created, both roles may use it
  auto b = distlock::connect(url_as(server, "rb"), quiet());
  grant_tables(server);

  std::uint64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    auto l = a.acquire("job", ttl_of(6000ms, 0ms));
    EXPECT_GT(l.token(), last);
    last = l.token();
  }
  auto held = a.acquire("job", ttl_of(6000ms, 0ms));
  ASSERT_GT(held.token(), last);
  last = held.token();

  std::atomic<bool> released{false};
  std::atomic<std::uint64_t> b_token{0};
  std::atomic<bool> b_early{false};
  std::string b_error;
  std::thread waiter([&] {
    std::error_code ec;
    auto l = b.acquire("job", ttl_of(6000ms, 10000ms), ec);
    if (ec) {
      b_error = ec.message();
      return;
    }
    b_early = !released.load();
    b_token = l.token();
  });
  std::this_thread::sleep_for(500ms);  // rb's client is waiting (or wrongly holding) by now
  released = true;
  held.release();
  waiter.join();
  ASSERT_TRUE(b_error.empty()) << b_error;
  EXPECT_FALSE(b_early) << "rb got the lock while ra held it";
  EXPECT_GT(b_token.load(), last) << "rb's token " << b_token.load() << " after ra's " << last
                                  << ": two token rows for one advisory lock";

  // And back: ra's next token is above rb's.
  auto again = a.acquire("job", ttl_of(6000ms, 10000ms));
  EXPECT_GT(again.token(), b_token.load());

  // One table, in public; none in the roles' own schemas.
  EXPECT_EQ(server.query("SELECT string_agg(n.nspname, ',') FROM pg_class c JOIN pg_namespace n"
                         " ON n.oid = c.relnamespace WHERE c.relname = 'distlock_locks'")[0][0],
            "public");
}

// A deployment whose roles had split the table into their own schemas (before the
// names were schema-qualified): the first client that creates public.distlock_locks
// takes over the largest token of every such table it can read, so tokens never go
// back across the upgrade.
TEST(PostgresSchema, TheTableCreatedInPublicKeepsTheTokensOfOlderPerSchemaTables) {
  PostgresServer server;
  add_role_with_own_schema(server, "ra");
  add_role_with_own_schema(server, "rb");
  for (const std::string s : {"ra", "rb"}) {
    server.query("CREATE TABLE " + s +
                 ".distlock_locks (digest bytea PRIMARY KEY, name bytea NOT NULL, token bigint NOT NULL,"
                 " owner text, pid integer, ttl_ms bigint, seen_at timestamptz)");
  }
  server.query(
      "INSERT INTO ra.distlock_locks VALUES (sha256('job'::bytea), 'job'::bytea, 7, NULL, NULL, 2000, NULL)");
  server.query(
      "INSERT INTO rb.distlock_locks VALUES (sha256('job'::bytea), 'job'::bytea, 4, NULL, NULL, 2000, NULL)");
  server.query(
      "INSERT INTO rb.distlock_locks VALUES (sha256('other'::bytea), 'other'::bytea, 9, NULL, NULL, 2000,"
      " NULL)");
  auto c = distlock::connect(server.url(), quiet());
  EXPECT_EQ(c.acquire("job", ttl_of(2000ms, 0ms)).token(), 8u);
  EXPECT_EQ(c.acquire("other", ttl_of(2000ms, 0ms)).token(), 10u);
  EXPECT_EQ(c.acquire("new", ttl_of(2000ms, 0ms)).token(), 1u);
}

// Many clients connecting at once to a database without the tables create them once
// (one setup transaction at a time); every one of them then locks the same rows.
TEST(PostgresSchema, ClientsConnectingAtOnceCreateTheTablesOnce) {
  PostgresServer server;
  constexpr int kClients = 6;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kClients);
  std::vector<std::uint64_t> tokens(kClients, 0);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto c = distlock::connect(server.url(), quiet());
        tokens[static_cast<std::size_t>(i)] = c.acquire("once", ttl_of(4000ms, 20000ms)).token();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_TRUE(e.empty()) << e;
  std::sort(tokens.begin(), tokens.end());
  for (int i = 0; i < kClients; ++i)
    EXPECT_EQ(tokens[static_cast<std::size_t>(i)], static_cast<std::uint64_t>(i + 1));
  EXPECT_EQ(
      server.query(
          "SELECT count(*) FROM pg_class WHERE relname IN ('distlock_locks', 'distlock_records')")[0][0],
      "2");
}

}  // namespace

}  // namespace distlock::testing
