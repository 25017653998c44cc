// redis+sentinel://: records and list_held go to the current master (checks
// shared with the other Redis-family backends in record_checks.hpp), follow a
// failover to the promoted replica, and with wait=N a record write no replica
// acknowledged fails.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "redis/record_checks.hpp"
#include "support/backend_names.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/redis_sentinel.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;
namespace d = distlock::detail;

std::string get_on(RedisServer& node, const std::string& key) {
  auto r = node.command({"GET", key});
  return r && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : "(nil)";
}

TEST(SentinelRecords, RecordsAndListingOnTheMaster) {
  RedisSentinelGroup group;
  auto b = open_backend(group.url(), quiet());
  auto other = open_backend(group.url(), quiet());
  ASSERT_TRUE(b && other);
  check_put_get_erase(*b);
  check_values(*b);
  check_record_and_lock_coexist(*b);
  check_if_absent_race(*b, *other, 100);
  check_listing(*b);
  check_expired_not_listed(*b);
  Error ec;
  b->put_record("where", "master", d::PutMode::always, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(get_on(group.master(), "distlock:{where}:record"), "master");
}

// A manual failover: a record acknowledged by both replicas (wait=2) is read on the
// promoted replica, and new records and locks are written and listed there.
TEST(SentinelRecords, RecordsFollowAFailover) {
  RedisSentinelGroup group;
  auto b = open_backend(group.url("?wait=2"), quiet());
  ASSERT_TRUE(b);
  Error ec;
  ASSERT_EQ(b->put_record("kept", "before", d::PutMode::if_absent, ec), "before");
  ASSERT_FALSE(ec) << ec.message() << " " << ec.take_detail();
  const auto old_port = group.master_port();
  auto r = group.sentinel_command(0, {"SENTINEL", "FAILOVER", "mymaster"});
  ASSERT_TRUE(r && r->type == REDIS_REPLY_STATUS) << (r ? std::string(r->str, r->len) : "no reply");
  const auto new_port = group.wait_failover(old_port, 60s);
  // The backend moves at its next failing call or its monitor's check.
  ASSERT_TRUE(eventually(
      [&] {
        Error e;
        b->put_record("after", "failover", d::PutMode::always, e);
        return !e && get_on(group.node_at_port(new_port), "distlock:{after}:record") == "failover";
      },
      20000ms))
      << "records did not move to the new master " << new_port;
  EXPECT_EQ(b->get_record("kept", ec), "before");
  EXPECT_EQ(b->put_record("kept", "other", d::PutMode::if_absent, ec), "before");
  ASSERT_TRUE(b->try_acquire({"moved/lock", test_owner(1), 30000ms}, ec).acquired) << ec.message();
  bool truncated = true;
  auto listed = b->list_held("moved/", 10, truncated, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(names_of(listed), std::vector<std::string>{"moved/lock"});
}

// wait=1 with replication stalled: the write is on the master but no replica has
// it, so the call fails (quorum_unavailable) saying a failover may lose it.
TEST(SentinelRecords, WaitRefusesARecordWriteNoReplicaAcknowledged) {
  RedisSentinelGroup group;
  auto b = open_backend(group.url("?wait=1&wait_timeout=300ms"), quiet());
  ASSERT_TRUE(b);
  Error ec;
  b->put_record("acked", "v", d::PutMode::always, ec);
  ASSERT_FALSE(ec) << ec.message();
  group.stall_replication();
  for (auto mode : {d::PutMode::always, d::PutMode::if_absent}) {
    ec.clear();
    b->put_record("stalled", "v", mode, ec);
    EXPECT_EQ(ec, errc::quorum_unavailable) << ec.message();
    const std::string detail = ec.take_detail();
    EXPECT_NE(detail.find("a failover may lose it"), std::string::npos) << detail;
  }
  b->erase_record("acked", ec);
  EXPECT_EQ(ec, errc::quorum_unavailable) << ec.message();
  EXPECT_EQ(b->get_record("stalled", ec), "v");  // reads need no acknowledgement
  EXPECT_FALSE(ec) << ec.message();
  group.resume_replication();
}

}  // namespace

}  // namespace distlock::testing
