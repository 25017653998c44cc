// etcd:// takes its lease bookkeeping on the client's injected clock
// (ClientOptions::clock), the clock the engine counts validity on: the session
// keepalive schedule, the validity a grant reports, and the keeper that deletes the
// key of a hold nobody renews any more. The test sets a TTL far beyond what it waits
// in real time, then moves a manual clock past it: only a backend reading the
// injected clock reacts. (Before, etcd read std::chrono::steady_clock, which stops
// during a host suspend while the engine's CLOCK_BOOTTIME and the server's lease run on.)
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "distlock/distlock.hpp"
#include "etcd_cluster.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/manual_clock.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

using distlock::testing::quiet;

TEST(EtcdClock, AnUnrenewedHoldIsDeletedAfterASessionTtlOnTheInjectedClock) {
  EtcdCluster etcd(1);
  auto clock = std::make_shared<ManualClock>();
  ClientOptions opts = quiet();
  opts.clock = clock;
  Client client = connect(etcd.url(), opts);
  LockOptions lo;
  lo.ttl = 60s;  // the session lease: 60 s of real time, far beyond this test
  Lease lease = client.acquire("clocked", lo);
  ASSERT_TRUE(lease.owns());
  EXPECT_EQ(lease.remaining(), 58s) << "validity counted on the injected clock (ttl - 2 s margin)";

  Client other = connect(etcd.url(), quiet());
  ASSERT_TRUE(other.status("clocked").held);
  clock->advance(3min);  // past the local deadline and a whole session TTL
  EXPECT_TRUE(eventually([&] { return lease.stop_token().stop_requested(); }, 10s));
  EXPECT_FALSE(lease.owns());
  EXPECT_TRUE(eventually([&] { return !other.status("clocked").held; }, 10s))
      << "the key of the hold nobody renews was not deleted: the keeper does not read the injected clock";
}

}  // namespace
}  // namespace distlock::testing
