// zk:// a raised or lowered session timeout and what the server restores after a restart.
// Written by the review of 5285af8 (commit 7087ef2, first named zk_timeout_after_restart_test.cpp).
//
// Review of 5285af8 (the session timeout read on every CONNECTED event). Real
// ZooKeeper servers restarted with a new zoo.cfg (ZkServer::reconfigure).
//
// ZooKeeper persists a session's timeout once, when the session is created (the
// createSession transaction, kept in the snapshot): a reconnect that negotiates another
// value changes only the live connection's expiry, not the stored one. A server that
// restarts (or a new leader after an election) rebuilds its session tracker from the
// stored value and expires the session that long after it came up, unless the client
// reconnects. A client that believes a RAISED timeout from a reconnect therefore
// counts on more than the server grants after a restart.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "support/fault_proxy.hpp"
#include "support/manual_clock.hpp"
#include "zk/zk_backend.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_server.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

detail::ZkStats stats_of(Client& c) {
  return detail::zk_stats(detail::engine_of(c)->backend()).value();
}

// The session is created with 4 s (the server's max), the server is restarted with a
// minSessionTimeout of 30 s (an operator raising tickTime raises it too), the client
// reconnects to the same session and now negotiates 30 s. A lease taken then (ttl 8 s,
// accepted before the change too) counts on 30 s. The server restarts once more while the holder is cut off:
// it restores the session with the 4 s it was created with and expires it ~4 s after coming up, then grants
// the lock to another client. The holder still owns it (its deadline is the grant + 30 s - 800 ms). Before
// 5285af8 the client kept the 4 s read at start: passes.
TEST(ZkTimeoutAfterRestart, ARaisedTimeoutIsNotWhatTheServerRestoresAfterARestart) {
  ZkServerOptions low;
  low.min_session_ms = 400;
  low.max_session_ms = 4'000;
  ZkServer zk(low);
  FaultProxy proxy(zk.port());
  Client holder = connect("zk://127.0.0.1:" + std::to_string(proxy.port()) + "?session_timeout=30s", quiet());
  ASSERT_EQ(stats_of(holder).session_timeout_ms, 4'000);
  const std::int64_t session = stats_of(holder).session_id;

  ZkServerOptions high = low;
  high.min_session_ms = 30'000;
  high.max_session_ms = 60'000;
  zk.kill();
  zk.reconfigure(high);
  zk.start();
  LockOptions o;
  o.ttl = 8s;  // <= 2 x 4 s: accepted before the change too (safety margin 800 ms)
  o.wait = 20s;
  // Back on the restarted server (a lock operation goes through).
  ASSERT_TRUE(eventually(
      [&] {
        try {
          holder.acquire("probe", o).release();
          return true;
        } catch (const std::exception&) {
          return false;
        }
      },
      20s));
  // The scenario needs the session created with 4 s to have survived the restart.
  ASSERT_EQ(stats_of(holder).session_id, session) << "a new session was opened: scenario not reached";
  std::printf("after the first restart: negotiated %lld ms\n",
              static_cast<long long>(stats_of(holder).session_timeout_ms));

  Lease held = holder.acquire("raised", o);
  ASSERT_TRUE(held.owns());
  std::printf("lease granted, remaining %lld ms\n", static_cast<long long>(held.remaining().count()));

  // Cut the holder off, then restart the server (same config): it restores the
  // session from its snapshot/log.
  proxy.freeze();
  zk.kill();
  zk.start();
  const auto restarted = std::chrono::steady_clock::now();

  Client other = connect(zk.url(), quiet());
  LockOptions wait_long = o;
  wait_long.wait = 45s;  // a server that restored 30 s grants it only after ~30 s
  Lease taken = other.acquire("raised", wait_long);
  ASSERT_TRUE(taken.owns());
  const auto after =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - restarted);
  std::printf("granted to the other client %lld ms after the restart; holder %s (remaining %lld ms)\n",
              static_cast<long long>(after.count()), held.owns() ? "STILL OWNS" : "gave up",
              static_cast<long long>(held.remaining().count()));
  EXPECT_FALSE(held.owns()) << "two holders: the server restored the session with the 4 s it was "
                               "created with and expired it; the holder counts on the 30 s a "
                               "reconnect negotiated";
  EXPECT_TRUE(held.stop_token().stop_requested());
  proxy.pass();
}

// True once the server lists a connection of session `sid` ("cons": "sid=0x...").
bool server_lists_session(const ZkServer& zk, std::int64_t sid) {
  char hex[32];
  std::snprintf(hex, sizeof hex, "sid=0x%llx", static_cast<unsigned long long>(sid));
  return four_letter(zk.port(), "cons").find(hex) != std::string::npos;
}

// The backend shortened its own entries by (old - new) on a lowered timeout, whatever
// timeout the entry was counted with. An entry counted with 12 s, then a raise to 24 s
// (entry unchanged, it is never lengthened), then a lowering to 18 s (still above the
// 12 s the entry counts on): the entry was cut by 6 s to grant + 6 s, and the keeper
// freed the node (on_lease_lost) before the engine's own deadline (grant + 12 s -
// 1.2 s). Manual clock: no renewal runs unless the test moves the clock. Now the
// session's validity never goes above the 12 s it started with (a raise is not trusted,
// see the test above), and an entry is cut only below its own validity.
//
// The scenario needs the client's session to survive two server restarts. The server
// restores it with the 12 s it was created with and expires it unless the client is back
// within that time of the server's start; how long the client takes depends on the machine
// (the JVM's start, the client library's reconnect pace: it waits a third of the session
// timeout between rounds of attempts), not on distlock: 10 runs beside two busy loops at load
// 10-14 measured the server serving 0.5-2.0 s after its kill and the client back 0-358 ms
// later in 17 of 20 restarts, 6.9-7.1 s later in 3 (a missed round); one more missed round
// is past the 12 s. (The timeouts were 6/12/9 s; a CI
// run under ASan failed once at a reconnect; at 12/24/18 s a run at load 10-17 on 2 cores
// failed once the same way.) So each restart's reconnect is timed on the test's steady
// clock, and a run whose session did not survive a restart (the server no longer lists it
// within 20 s) did not reach the scenario: it proves nothing either way and the scenario is
// run again on a new server, at most kRuns times. The test fails when the keeper cuts the
// lease in a run that reached the scenario, or when no run reached it (the reconnect times
// are printed). A run that reached it is one where the property was checked in full.
enum class RaiseLower { held, cut, not_reached };

RaiseLower raise_then_lower_once(int run) {
  ZkServerOptions first;
  first.min_session_ms = 400;
  first.max_session_ms = 12'000;
  ZkServer zk(first);
  auto clock = std::make_shared<ManualClock>();
  ClientOptions co = quiet();
  co.clock = clock;
  Client holder = connect(zk.url("?session_timeout=30s"), co);
  EXPECT_EQ(stats_of(holder).session_timeout_ms, 12'000);

  LockOptions o;
  o.ttl = 12s;  // margin 1.2 s: engine deadline grant + 10.8 s
  o.wait = 0s;
  Lease held = holder.acquire("cut", o);
  EXPECT_TRUE(held.owns());
  EXPECT_EQ(held.remaining(), 10800ms);
  const std::int64_t sid = stats_of(holder).session_id;

  // Restarts the server with `cfg`; true once the client is back on its session. Prints
  // how long the restart and the reconnect took (steady clock of this process).
  const auto restart = [&](const ZkServerOptions& cfg, const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    zk.kill();
    zk.reconfigure(cfg);
    zk.start();
    const auto serving = std::chrono::steady_clock::now();
    const bool back = eventually([&] { return server_lists_session(zk, sid); }, 20s);
    const auto ms = [](auto d) {
      return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
    };
    std::printf(
        "run %d, %s: the server served %lld ms after the kill; the client %s %lld ms after that "
        "(its session: 12,000 ms from the server's start)\n",
        run, what, ms(serving - t0), back ? "was back on its session" : "was NOT back on its session",
        ms(std::chrono::steady_clock::now() - serving));
    if (!back) std::printf("the server lists:\n%s\n", four_letter(zk.port(), "cons").c_str());
    return back;
  };

  ZkServerOptions raised = first;  // the client asks for its last 12 s: min raises it
  raised.min_session_ms = 24'000;
  raised.max_session_ms = 40'000;
  if (!restart(raised, "raise")) return RaiseLower::not_reached;
  EXPECT_EQ(stats_of(holder).session_timeout_ms, 12'000) << "a raise on reconnect must not be trusted";

  ZkServerOptions lowered = first;  // the client asks for 24 s: max 18 s
  lowered.max_session_ms = 18'000;
  if (!restart(lowered, "lower")) return RaiseLower::not_reached;
  EXPECT_EQ(stats_of(holder).session_timeout_ms, 12'000);
  EXPECT_EQ(held.remaining(), 10800ms) << "the engine leaves the 12 s lease alone (18 s > 12 s)";

  // 7 s after the grant (manual clock): the lease is 3.8 s from its engine deadline.
  clock->advance(7000ms);
  RawZk raw(zk.hostport());
  // Give the keeper (it wakes at least every second of the manual clock, polling every
  // ms of real time) a bounded chance to act; it must not free the node.
  const bool freed = eventually(
      [&] { return held.stop_token().stop_requested() || raw.children(detail::zk::lock_dir("cut")).empty(); },
      3s);
  if (freed) {
    std::printf("run %d: freed; loss reason %d, session %s\n", run, static_cast<int>(held.loss_reason()),
                server_lists_session(zk, sid) ? "still listed" : "no longer listed");
  }
  EXPECT_TRUE(held.owns());
  return freed ? RaiseLower::cut : RaiseLower::held;
}

TEST(ZkTimeoutAfterRestart, ARaiseThenALowerStillAboveTheLeaseDoesNotCutIt) {
  constexpr int kRuns = 3;
  int reached = 0;
  for (int run = 1; run <= kRuns && reached == 0; ++run) {
    const RaiseLower r = raise_then_lower_once(run);
    if (r == RaiseLower::not_reached) continue;
    ++reached;
    EXPECT_EQ(r, RaiseLower::held)
        << "the keeper freed a lease 3.8 s before its deadline: its entry was cut by "
           "24 s - 18 s although it was counted with 12 s";
  }
  EXPECT_EQ(reached, 1) << "in " << kRuns << " runs the client's session never survived both restarts "
                        << "(reconnect times above): the scenario was not reached";
}

}  // namespace
}  // namespace distlock::testing
