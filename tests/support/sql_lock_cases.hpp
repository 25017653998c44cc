// Helpers and case bodies the mysql:// and postgres:// lock tests (tests/mysql/mysql_test.cpp,
// tests/postgres/postgres_test.cpp) share, written once. Each body runs on a real server the
// test started (MariadbServer or PostgresServer: url(), kill(), restart(), query()); what
// differs between the backends (TTLs, bounds, SQL, the fenced writer) comes in as arguments,
// and the backend's own checks stay in its test:
//
//   connect_error(url)     the std::system_error a connect() to `url` throws (success ADDs a failure)
//   since(t)               steady-clock milliseconds since `t`
//   expect_stopped_holder_is_fenced_out<Writer>(server, holder_ttl, select_value, freed_within)
//       a lock_tool holder SIGSTOPped past its TTL: the next holder gets a newer token, the
//       stopped one's fenced write (Writer(server).fenced_update) is rejected, and on resume
//       its first look says lost (exit 76)
//   expect_server_kill_signals_loss_and_tokens_increase(server, ttl, signalled_within)
//       the server SIGKILLed while two leases are held: both stop tokens fire, both leases
//       stop owning; after the restart tokens continue above the old ones and the old lease's
//       release is errc::lost and touches nothing
//
// The caller creates the table `Writer` updates (id 1, value 'initial', fence 0) first.
// Thread-safety: each call uses only its arguments, from the test's thread.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"

namespace distlock::testing {

inline std::system_error connect_error(const std::string& url) {
  try {
    auto c = distlock::connect(url, quiet());
    ADD_FAILURE() << "connect succeeded";
  } catch (const std::system_error& e) {
    return e;
  }
  return std::system_error(make_error_code(errc::protocol_error));
}

inline Millis since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t);
}

// `select_value` reads the value of row 1 of the writer's table; `freed_within`, when given,
// bounds the time from the stop to the next holder's acquire.
template <class Writer, class Server>
void expect_stopped_holder_is_fenced_out(Server& server, long holder_ttl_ms, const std::string& select_value,
                                         std::optional<Millis> freed_within) {
  TempDir dir;
  const std::string out = (dir.path() / "holder").string();
  Process holder = spawn_holder(server.url(), "fenced", out, holder_ttl_ms);
  ASSERT_TRUE(wait_for_text(out, "acquired", std::chrono::seconds(30))) << read_file(out);
  const long long old_token = acquired_token(out);
  ASSERT_GT(old_token, 0);
  Writer writer(server);
  EXPECT_EQ(writer.fenced_update(1, "old holder", static_cast<std::uint64_t>(old_token)), 1);
  holder.signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  auto c = distlock::connect(server.url(), quiet());
  // The new holder's own TTL is long: it must still hold after the checks below, up
  // to 20 s on a busy machine, and the case is about the stopped holder's TTL.
  auto lease = c.acquire("fenced", ttl_of(Millis(10000), Millis(30000)));
  // The server frees it no earlier than the TTL after the holder's last statement.
  const Millis took = since(stopped);
  ::testing::Test::RecordProperty("freed_after_stop_ms", static_cast<int>(took.count()));
  if (freed_within) {
    EXPECT_LT(took, *freed_within);
  }
  EXPECT_GT(lease.token(), static_cast<std::uint64_t>(old_token));
  EXPECT_EQ(writer.fenced_update(1, "new holder", lease.token()), 1);
  EXPECT_EQ(writer.fenced_update(1, "stale", static_cast<std::uint64_t>(old_token)), 0)
      << "a stale write went through";
  EXPECT_EQ(server.query(select_value)[0][0], "new holder");
  holder.signal(SIGCONT);
  holder.signal(SIGUSR1);
  ASSERT_TRUE(wait_for_text(out, "owns 0", std::chrono::seconds(10))) << read_file(out);
  EXPECT_EQ(read_file(out).find("owns 1"), std::string::npos);
  holder.signal(SIGTERM);
  EXPECT_EQ(holder.exit_code(std::chrono::seconds(10)), 76);
  EXPECT_TRUE(lease.owns());
  EXPECT_TRUE(c.status("fenced").held);
}

// `signalled_within`, when given, bounds the time from the kill to both stop tokens firing.
template <class Server>
void expect_server_kill_signals_loss_and_tokens_increase(Server& server, Millis ttl,
                                                         std::optional<Millis> signalled_within) {
  auto a = distlock::connect(server.url(), quiet());
  auto one = a.acquire("crash1", ttl_of(ttl));
  auto two = a.acquire("crash2", ttl_of(ttl));
  const std::uint64_t t1 = one.token(), t2 = two.token();
  server.kill();
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually(
      [&] { return one.stop_token().stop_requested() && two.stop_token().stop_requested(); }, Millis(10000)));
  const Millis took = since(killed);
  ::testing::Test::RecordProperty("loss_signalled_after_ms", static_cast<int>(took.count()));
  if (signalled_within) {
    EXPECT_LT(took, *signalled_within);
  }
  EXPECT_FALSE(one.owns());
  EXPECT_FALSE(two.owns());
  server.restart();
  auto again1 = a.acquire("crash1", ttl_of(ttl, Millis(10000)));
  auto again2 = a.acquire("crash2", ttl_of(ttl, Millis(10000)));
  EXPECT_GT(again1.token(), t1);
  EXPECT_GT(again2.token(), t2);
  std::error_code ec;
  one.release(ec);
  EXPECT_EQ(ec, errc::lost);
  EXPECT_TRUE(again1.owns()) << "the old lease's release touched the new one";
}

}  // namespace distlock::testing
