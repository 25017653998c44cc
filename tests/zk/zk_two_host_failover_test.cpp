// A zk:// URL naming two servers: after the connection to the serving one drops while the
// other is down, the client goes back to the serving one. ZooKeeper's C client (3.8) advances
// its host cursor twice per failed connection (once in its error handler, once when it picks
// the next server). With two hosts it then redials the same host every time: here the dead one,
// with no pause, and never the live one. The client must reach the live server again within
// the session timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/fault_proxy.hpp"
#include "zk/zk_test_util.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::Millis;
using distlock::testing::ZkEnsemble;
using Steady = std::chrono::steady_clock;

TEST(ZkTwoHostFailover, ReturnsToTheServingHostAfterItsConnectionDrops) {
  ZkEnsemble zk(3);
  int leader = -1;
  const auto setup_end = Steady::now() + 30s;
  while ((leader = zk.leader()) < 0 && Steady::now() < setup_end) std::this_thread::sleep_for(50ms);
  ASSERT_GE(leader, 0) << "no leader within 30 s";
  const int x = (leader + 1) % 3, y = (leader + 2) % 3;
  // The client reaches follower x through a proxy; follower y is down (x and the leader are
  // a quorum), so the client's session is on x.
  distlock::testing::FaultProxy to_x(zk.server(x).port());
  zk.server(y).kill();
  const std::string url = "zk://127.0.0.1:" + std::to_string(to_x.port()) + "," + zk.server(y).hostport() +
                          "?session_timeout=10s";
  auto client = distlock::connect(url, distlock::testing::quiet());
  distlock::LockOptions opts;
  opts.ttl = 3000ms;
  opts.wait = 5000ms;
  client.acquire("before", opts).release();

  // x's connection drops (closed, new dials refused) until the client has seen it: a status
  // call fails (bounded: 15 s on this process's steady clock); then x is reachable again.
  to_x.drop();
  const auto drop_end = Steady::now() + 15s;
  bool seen = false;
  while (!seen && Steady::now() < drop_end) {
    std::error_code sec;
    (void)client.status("after", sec);
    seen = static_cast<bool>(sec);
  }
  ASSERT_TRUE(seen) << "the client still answered 15 s after its connection was dropped";
  const int accepted_before = to_x.accepted();
  to_x.pass();
  const auto dropped = Steady::now();

  // Within the session timeout (10 s, on this process's steady clock) the client dials x
  // again, and then locks (each try bounded by its own wait).
  while (to_x.accepted() == accepted_before && Steady::now() - dropped < 10s)
    std::this_thread::sleep_for(10ms);
  const auto back = std::chrono::duration_cast<Millis>(Steady::now() - dropped);
  ASSERT_GT(to_x.accepted(), accepted_before)
      << "no new connection to the serving host " << back.count() << " ms after x was reachable again";
  std::error_code ec;
  distlock::Lease lease;
  while (Steady::now() - dropped < 20s) {
    lease = client.acquire("after", opts, ec);
    if (!ec && lease.owns()) break;
    std::this_thread::sleep_for(50ms);
  }
  const auto took = std::chrono::duration_cast<Millis>(Steady::now() - dropped);
  ASSERT_FALSE(ec) << "no lock " << took.count() << " ms after x was reachable again: " << ec.message();
  ASSERT_TRUE(lease.owns());
  EXPECT_LT(took, 10000ms) << "the client locked again only after its session timeout";
  RecordProperty("reconnected_after_drop_ms", static_cast<int>(back.count()));
  RecordProperty("relocked_after_drop_ms", static_cast<int>(took.count()));
  std::printf(
      "[ timing ] connection dropped (x reachable again) -> new connection to x %lld ms, locked again %lld "
      "ms\n",
      static_cast<long long>(back.count()), static_cast<long long>(took.count()));
  lease.release();
}

}  // namespace
