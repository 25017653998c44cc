// redis+cluster://: records routed to their key's slot and list_held over every
// master, against a 3-master cluster started by each test (checks shared with the
// other Redis-family backends in tests/redis/record_checks.hpp).
#include <gtest/gtest.h>

#include "redis/record_checks.hpp"
#include "rediscluster/cluster_backend.hpp"
#include "support/client_options.hpp"
#include "support/redis_cluster.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::errc;
using distlock::testing::open_backend;
using distlock::testing::RedisCluster;
namespace d = distlock::detail;
namespace rc = distlock::detail::rediscluster;

using distlock::testing::quiet;

using distlock::testing::reply_str;

class ClusterRecords : public ::testing::Test {
 protected:
  RedisCluster cluster_{3};
  std::unique_ptr<d::Backend> backend_ = open_backend(cluster_.url(), quiet());
};

TEST_F(ClusterRecords, PutGetEraseIfAbsentValuesAndLocks) {
  ASSERT_TRUE(backend_);
  distlock::testing::check_put_get_erase(*backend_);
  distlock::testing::check_values(*backend_);
  distlock::testing::check_record_and_lock_coexist(*backend_);
}

TEST_F(ClusterRecords, IfAbsentRaceBetweenTwoClientsGivesBothTheSameAnswer) {
  auto other = open_backend(cluster_.url(), quiet());
  ASSERT_TRUE(backend_ && other);
  distlock::testing::check_if_absent_race(*backend_, *other, 200);
}

// Each record lives on the master serving its key's slot (the key shares the slot
// of the lock of the same name); keys with braces get the hashed tag.
TEST_F(ClusterRecords, RecordsOnDifferentSlotsLiveOnTheirMasters) {
  ASSERT_TRUE(backend_);
  distlock::detail::Error ec;
  std::vector<std::string> keys;
  for (int i = 0; i < 3; ++i) keys.push_back(cluster_.name_on(i, "rec"));
  keys.push_back("with {braces}");
  keys.push_back("}");
  for (const auto& k : keys) {
    SCOPED_TRACE(k);
    ASSERT_EQ(backend_->put_record(k, "value of " + k, d::PutMode::if_absent, ec), "value of " + k);
    ASSERT_FALSE(ec) << ec.message();
    const std::string key = rc::record_key("distlock", k);
    EXPECT_EQ(rc::key_slot(key), rc::keys_of("distlock", k).slot);
    const int owner = cluster_.owner_of(rc::key_slot(key));
    ASSERT_GE(owner, 0);
    EXPECT_EQ(reply_str(cluster_.node(owner).command(std::vector<std::string>{"GET", key})), "value of " + k);
    EXPECT_EQ(cluster_.node(owner).command(std::vector<std::string>{"PTTL", key})->integer, -1);
    EXPECT_EQ(backend_->get_record(k, ec), "value of " + k);
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(cluster_.owner_of(rc::key_slot(rc::record_key("distlock", keys[i]))), i);
  for (const auto& k : keys) EXPECT_TRUE(backend_->erase_record(k, ec)) << k;
}

TEST_F(ClusterRecords, ListHeldAcrossEveryMaster) {
  ASSERT_TRUE(backend_);
  std::vector<std::string> more;
  for (int i = 0; i < 3; ++i) more.push_back(cluster_.name_on(i, "ls/n"));
  distlock::testing::check_listing(*backend_, more);
}

TEST_F(ClusterRecords, ExpiredLocksAreNotListedAndManyLocksAreListedInOrder) {
  ASSERT_TRUE(backend_);
  distlock::testing::check_expired_not_listed(*backend_);
  distlock::testing::check_many(*backend_, 1200);
}

// A dead master: its records fail with backend_unavailable naming it, the other
// masters' records still work, and a list (which would miss its locks) fails.
TEST(ClusterRecordsDown, ADeadMasterFailsItsRecordsAndTheList) {
  RedisCluster cluster(3);
  auto b = open_backend(cluster.url("?timeout=500ms"), quiet());
  ASSERT_TRUE(b);
  const std::string on0 = cluster.name_on(0, "rec"), on1 = cluster.name_on(1, "rec");
  distlock::detail::Error ec;
  b->put_record(on1, "one", d::PutMode::always, ec);
  ASSERT_FALSE(ec) << ec.message();
  const std::string where = "127.0.0.1:" + std::to_string(cluster.node(0).port());
  cluster.kill(0);
  for (int round = 0; round < 2; ++round) {  // also after the map was read again
    ec.clear();
    b->put_record(on0, "zero", d::PutMode::if_absent, ec);
    EXPECT_EQ(ec, errc::backend_unavailable) << ec.message();
    EXPECT_NE(ec.take_detail().find(where), std::string::npos);
    b->get_record(on0, ec);
    EXPECT_EQ(ec, errc::backend_unavailable) << ec.message();
    EXPECT_EQ(b->get_record(on1, ec), "one");
    EXPECT_FALSE(ec) << ec.message();
    bool truncated = false;
    b->list_held("", 10, truncated, ec);
    EXPECT_EQ(ec, errc::backend_unavailable) << ec.message();
    EXPECT_NE(ec.take_detail().find(where), std::string::npos) << "list";
  }
}

}  // namespace
