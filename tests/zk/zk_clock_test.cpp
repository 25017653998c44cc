// zk:// takes every deadline on the client's injected clock (ClientOptions::clock):
// the connect wait, and the keeper that frees the node of a lease nobody renews any
// more. Each test sets a limit far beyond what the test waits in real time, then
// moves a manual clock past it: only a backend reading the injected clock reacts.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>

#include "distlock/distlock.hpp"
#include "support/manual_clock.hpp"
#include "support/process.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_server.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

TEST(ZkClock, ConnectTimeoutRunsOnTheInjectedClock) {
  auto clock = std::make_shared<ManualClock>();
  ClientOptions opts = quiet();
  opts.clock = clock;
  opts.connect_timeout = std::chrono::hours(1);  // never reached in real time here
  // Nothing listens there: the session never connects.
  const std::string url = "zk://127.0.0.1:" + std::to_string(free_port());
  auto connecting = std::async(std::launch::async, [&] {
    try {
      (void)connect(url, opts);
      return std::error_code{};
    } catch (const std::system_error& e) {
      return e.code();
    }
  });
  // The hour passes on the manual clock only; keep moving it until the wait ends.
  ASSERT_TRUE(eventually(
      [&] {
        clock->advance(std::chrono::hours(2));
        return connecting.wait_for(0ms) == std::future_status::ready;
      },
      20s))
      << "the connect wait did not end when the injected clock passed connect_timeout";
  EXPECT_EQ(connecting.get(), errc::backend_unavailable);
}

TEST(ZkClock, AnUnrenewedLeaseIsFreedAfterASessionTimeoutOnTheInjectedClock) {
  auto clock = std::make_shared<ManualClock>();
  ClientOptions opts = quiet();
  opts.clock = clock;
  // A session timeout of 50 s of real time: the server would not free the node, nor
  // would a keeper on the real clock, within the 10 s this test waits.
  Client client = connect(shared_server().url("?session_timeout=50s"), opts);
  RawZk raw(shared_server().hostport());
  LockOptions lo;
  lo.ttl = 50s;
  Lease lease = client.acquire("clocked", lo);
  ASSERT_TRUE(lease.owns());
  ASSERT_EQ(raw.children(detail::zk::lock_dir("clocked")).size(), 1u);

  clock->advance(2min);  // past the lease's local deadline and the session timeout
  EXPECT_TRUE(eventually([&] { return raw.children(detail::zk::lock_dir("clocked")).empty(); }, 10s))
      << "the node of the lease nobody renews was not deleted";
  EXPECT_TRUE(eventually([&] { return lease.stop_token().stop_requested(); }, 10s));
  EXPECT_FALSE(lease.owns());
}

}  // namespace
}  // namespace distlock::testing
