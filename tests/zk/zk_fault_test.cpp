// zk:// under faults: the server paused or the connection dropped while a create is
// in flight, renewal through a follower, and a 3-server ensemble losing its leader
// during contention. Killed and paused holders: tests/conformance.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include <chrono>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "support/backend_mono_clock.hpp"
#include "support/cs_log.hpp"
#include "support/lock_tool.hpp"
#include "zk/zk_backend.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_server.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

std::vector<Process> start_hammers(const std::string& url, const std::string& name, const TempDir& dir,
                                   int processes, int threads, int iters, long hold_us) {
  std::vector<Process> out;
  for (int p = 0; p < processes; ++p) {
    out.push_back(Process::spawn(
        {lock_tool_path(), "hammer", "--url", url, "--name", name, "--log", (dir.path() / "cs.log").string(),
         "--counter", (dir.path() / "counter").string(), "--threads", std::to_string(threads), "--iters",
         std::to_string(iters), "--ttl", "4000", "--hold-us", std::to_string(hold_us)},
        (dir.path() / ("hammer" + std::to_string(p) + ".out")).string()));
  }
  return out;
}

// The create is sent, the server stops answering; the client gives up. Once the server
// is back, the node that create made must not stay in the queue (it would block
// everybody until the session ends).
void expect_no_orphan_after_pause(std::chrono::milliseconds pause, const std::string& suffix) {
  ZkServer& zk = shared_server();
  Client client = connect(zk.url(suffix), quiet());
  // Another client holds the lock, so the directory exists and a stray node of ours
  // would sit in the queue behind it.
  Client holder_client = connect(zk.url(suffix), quiet());
  LockOptions o;
  o.ttl = 2s;
  o.wait = 2s;
  Lease holder = holder_client.acquire("orphan", o);
  zk.pause();
  std::error_code ec;
  const auto started = std::chrono::steady_clock::now();
  {
    Lease lease = client.acquire("orphan", o, ec);
    EXPECT_TRUE(ec == errc::backend_unavailable || ec == errc::timeout) << ec.message();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s) << "acquire must not hang on a silent server";
  std::this_thread::sleep_until(started + pause);
  zk.resume();
  RawZk raw(zk.hostport());
  const std::string dir = detail::zk::lock_dir("orphan");
  // Only the holder's node may remain.
  EXPECT_TRUE(eventually([&] { return raw.children(dir).size() == 1; }, 10s))
      << raw.children(dir).size() - 1 << " node(s) left behind";
  ASSERT_TRUE(holder.owns()) << "the holder's session must survive the pause";
  holder.release();
  EXPECT_TRUE(raw.children(dir).empty());
  const auto st = detail::zk_stats(distlock::detail::engine_of(client)->backend()).value();
  std::printf("after a %lld ms pause: sessions %llu, orphans removed by guid %llu\n",
              static_cast<long long>(pause.count()), static_cast<unsigned long long>(st.sessions),
              static_cast<unsigned long long>(st.orphans_removed));
  // And the lock works normally afterwards.
  o.wait = 10s;
  Lease lease = client.acquire("orphan", o, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(raw.children(dir).size(), 1u);
  lease.release();
  EXPECT_TRUE(raw.children(dir).empty());
}

TEST(ZkFault, ServerPausedDuringCreateLeavesNoOrphan) {
  // Short pause: the requests stay queued on the connection and land after the resume.
  expect_no_orphan_after_pause(1500ms, "?session_timeout=6s&timeout=300ms");
}

TEST(ZkFault, ConnectionDroppedDuringCreateLeavesNoOrphan) {
  // Longer than 2/3 of the session timeout: the client drops the connection (the
  // create's outcome is unknown), reconnects after the resume and cleans up by guid.
  expect_no_orphan_after_pause(5000ms, "?session_timeout=6s&timeout=300ms");
}

// Renewal confirms against the leader's state (a sync before the reads), so a client
// connected to a follower that lags behind, or is cut off from, the leader cannot have
// its lease confirmed by the follower's stale copy of the tree.
TEST(ZkFault, RenewalThroughAFollowerConfirmsWithTheLeader) {
  ZkEnsemble ensemble(3);
  const int leader = ensemble.leader();
  ASSERT_GE(leader, 0) << "no leader elected";
  const int follower = (leader + 1) % ensemble.size();
  ClientOptions o = quiet();
  o.background_renewal = false;  // only renew_now() renews: each call is one observed renewal
  // The client knows only the follower.
  Client client = connect(ensemble.server(follower).url("?session_timeout=8s&timeout=1500ms"), o);
  LockOptions lo;
  lo.ttl = 8s;
  RawZk on_leader(ensemble.server(leader).hostport());

  // A node deleted through the leader is a loss at the very next renewal through the follower.
  Lease deleted = client.acquire("follower/deleted", lo);
  const std::string dir = detail::zk::lock_dir("follower/deleted");
  const auto nodes = on_leader.children(dir);
  ASSERT_EQ(nodes.size(), 1u);
  ASSERT_EQ(on_leader.remove(dir + "/" + nodes[0]), ZOK);
  EXPECT_EQ(client.renew_now(), 0u);
  EXPECT_TRUE(deleted.stop_token().stop_requested()) << "the deletion must be seen at once";

  // With the leader silent, the follower still answers reads from its own copy (until
  // syncLimit, 2 s here, passes): a renewal must not take that as a confirmation.
  Lease held = client.acquire("follower/held", lo);
  ASSERT_EQ(client.renew_now(), 1u) << "healthy ensemble: the renewal confirms";
  const auto syncs_before =
      detail::zk_stats(distlock::detail::engine_of(client)->backend()).value().renew_syncs;
  ensemble.server(leader).pause();
  const auto paused_at = std::chrono::steady_clock::now();
  const std::size_t renewed = client.renew_now();
  const auto renew_took = std::chrono::steady_clock::now() - paused_at;
  ensemble.server(leader).resume();
  EXPECT_EQ(renewed, 0u) << "a follower cut off from its leader confirmed the lease";
  EXPECT_GT(detail::zk_stats(distlock::detail::engine_of(client)->backend()).value().renew_syncs,
            syncs_before);
  std::printf(
      "renewal through a follower with the leader paused: %zu renewed, %lld ms\n", renewed,
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(renew_took).count()));
  // Back to normal once the leader answers again (the lease may have expired meanwhile
  // only if the ensemble took longer than the session to recover).
  EXPECT_TRUE(eventually([&] { return client.renew_now() == 1 || !held.owns(); }, 30s));
}

TEST(ZkFault, EnsembleLeaderKilledDuringContention) {
  ZkEnsemble ensemble(3);
  const int leader = ensemble.leader();
  ASSERT_GE(leader, 0) << "no leader elected";
  TempDir dir("distlock-zk-ensemble");
  // Generous timeouts: on a loaded 2-core machine an election takes seconds.
  auto hammers =
      start_hammers(ensemble.url("?session_timeout=8s&timeout=5s"), "ensemble", dir, 2, 4, 60, 2000);
  const std::string log = (dir.path() / "cs.log").string();
  ASSERT_TRUE(eventually([&] { return read_sections(log).size() >= 40; }, 60s))
      << "no progress before the kill";
  const std::int64_t killed_at = mono_ns();
  ensemble.server(leader).kill();
  for (auto& h : hammers) {
    const int status = h.wait_for(120s);
    ASSERT_NE(status, -1) << "hammer did not finish within 120 s after the leader was killed";
    // A hammer counts acquisitions that failed during the election (exit 1); it must
    // not crash.
    EXPECT_TRUE(WIFEXITED(status)) << "hammer crashed";
  }
  const auto sections = read_sections(log);
  EXPECT_TRUE(no_overlap(sections));
  EXPECT_TRUE(tokens_increase(sections));
  EXPECT_EQ(read_counter((dir.path() / "counter").string()), static_cast<long>(sections.size()));
  std::size_t after = 0;
  for (const auto& s : sections) after += s.start_ns > killed_at ? 1 : 0;
  EXPECT_GT(after, 0u) << "locking must go on after the leader died";
  std::printf("ensemble: %zu sections, %zu after the leader was killed, new leader %d\n", sections.size(),
              after, ensemble.leader());
}

}  // namespace
}  // namespace distlock::testing
