// postgres:// against a paused server: every server process stopped (PostgresServer::pause,
// which stops the backends of existing sessions too), its sockets open, nothing answered.
// A holder must lose its lease within its TTL (the watchdog's local deadline, not the
// server, decides); a waiter must return within its wait plus one statement timeout; and
// after the server resumes, the lock of the holder that gave up is free again within one TTL.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/postgres_server.hpp"
#include "support/sql_lock_cases.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// All bounds below are measured on this process's steady clock. The statement timeout
// is 500 ms; the scheduling margin on a loaded machine is 600 ms (statement and connect
// timeouts are poll() deadlines, precise to a few ms when the thread runs).
constexpr Millis kMargin = 600ms;

// A waiter (wait 1 s) on a paused server, started at `t0`, that ended with `ec`: it must have
// failed, within its wait + one 500 ms timeout + the margin. `who` names it in the messages.
void expect_paused_waiter_failed_in_time(Clock::time_point t0, const std::error_code& ec, const char* who) {
  const Millis took = since(t0);
  EXPECT_TRUE(ec) << who << " acquired on a paused server";
  std::printf("%s returned after %lld ms: %s\n", who, static_cast<long long>(took.count()),
              ec.message().c_str());
  EXPECT_LE(took, 1000ms + 500ms + kMargin)
      << who << " on a paused server ran past its bound: " << ec.message();
}

TEST(PostgresPausedServer, AHolderLosesItsLeaseWithinItsTtlAndTheLockIsFreeSoonAfterResume) {
  PostgresServer server;
  // The set-up's connect and first acquisition (a session opened with a 500 ms timeout) are tried
  // again where a busy machine makes them miss it: the checks begin at the pause.
  auto a = connect_within_tries(server.url("?timeout=500ms"), quiet(), errc::backend_unavailable);
  const Millis ttl = 3000ms;
  auto held = acquire_within_tries(a, "paused-holder", ttl_of(ttl), errc::backend_unavailable);
  const std::uint64_t token = held.token();
  const std::stop_token stop = held.stop_token();

  server.pause();
  const auto paused_at = Clock::now();
  // The lease's validity runs from the send time of its last answered statement, which
  // was before the pause: the loss is signalled by paused_at + ttl at the latest.
  while (!stop.stop_requested() && Clock::now() < paused_at + ttl + 3 * kMargin) {
    std::this_thread::sleep_for(5ms);
  }
  const Millis lost_after = since(paused_at);
  EXPECT_TRUE(stop.stop_requested()) << "the holder never saw its loss on a paused server";
  EXPECT_LE(lost_after, ttl + kMargin) << "the holder believed it held past its TTL";
  EXPECT_FALSE(held.owns());
  std::printf("holder saw its loss %lld ms after the pause (ttl %lld ms)\n",
              static_cast<long long>(lost_after.count()), static_cast<long long>(ttl.count()));

  server.resume();
  const auto resumed_at = Clock::now();
  // Bounded: ttl + margin, 20 ms apart.
  auto advisory = [&] {
    return server.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0];
  };
  while (advisory() != "0" && Clock::now() < resumed_at + ttl + kMargin) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(advisory(), "0") << "the abandoned session still held its advisory lock";
  std::printf("the server freed the lock %lld ms after the resume\n",
              static_cast<long long>(since(resumed_at).count()));
  // The holder closed its connection when a statement got no answer; the session's
  // backend reads the close when it runs again and ends the session, freeing the advisory
  // lock at once. But it first runs the renewal that was waiting in its socket, which sets
  // the row's seen_at to the resume time: the next holder waits out seen_at + ttl (the row
  // is what bounds an unreachable holder's belief), so it gets the lock one TTL after the
  // resume at the latest.
  auto b = distlock::connect(server.url("?timeout=2s"), quiet());
  std::error_code ec;
  auto next = b.acquire("paused-holder", ttl_of(ttl, 10000ms), ec);
  ASSERT_FALSE(ec) << ec.message();
  // Measured 3.1-3.3 s on a loaded 2-core machine; the bound allows a busy CI machine a
  // connect and a few round trips more, and still tells one TTL from two.
  EXPECT_LE(since(resumed_at), ttl + 2 * kMargin + 300ms)
      << "the lock stayed held long after the server resumed";
  EXPECT_GT(next.token(), token);
  std::printf("next holder got the lock %lld ms after the resume\n",
              static_cast<long long>(since(resumed_at).count()));
}

TEST(PostgresPausedServer, AWaiterWithASessionReturnsWithinItsWaitPlusOneStatementTimeout) {
  PostgresServer server;
  auto b = connect_within_tries(server.url("?timeout=500ms"), quiet(), errc::backend_unavailable);
  {
    // The 3 s session exists (tried again where a busy machine misses the 500 ms timeout).
    auto warm = acquire_within_tries(b, "paused-warm", ttl_of(3000ms), errc::backend_unavailable);
    warm.release();
  }
  server.pause();
  const auto t0 = Clock::now();
  std::error_code ec;
  auto l = b.acquire("paused-waiter", ttl_of(3000ms, 1000ms), ec);
  expect_paused_waiter_failed_in_time(t0, ec, "a waiter with a session");
  server.resume();
}

TEST(PostgresPausedServer, ANewClientsWaiterReturnsWithinItsWaitPlusOneConnectTimeout) {
  PostgresServer server;
  server.pause();
  const auto t0 = Clock::now();
  std::error_code ec;
  // connect() opens its first session there or at the first acquire: either way one
  // connect attempt, bounded by the 500 ms connect timeout.
  auto b = distlock::connect(server.url("?timeout=500ms"), quiet(), ec);
  if (ec) {
    // connect() made the attempt and failed: one connect timeout.
    EXPECT_EQ(ec, errc::backend_unavailable) << ec.message();
    EXPECT_LE(since(t0), 500ms + kMargin) << "connect() to a paused server ran past its 500 ms timeout";
  } else {
    auto l = b.acquire("paused-new-waiter", ttl_of(3000ms, 1000ms), ec);
  }
  expect_paused_waiter_failed_in_time(t0, ec, "a new client's waiter");
  server.resume();
}

}  // namespace

}  // namespace distlock::testing
