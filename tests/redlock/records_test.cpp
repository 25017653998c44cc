// redlock://: records with quorum semantics and list_held over the masters,
// against 3 redis-server masters started by each test (checks shared with the
// other Redis-family backends in tests/redis/record_checks.hpp).
#include <gtest/gtest.h>

#include "redis/record_checks.hpp"
#include "redlock/masters.hpp"
#include "support/backend_names.hpp"
#include "support/client_options.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;
namespace d = distlock::detail;

const std::string kRecord = "distlock:redlock:record:";

class RedlockRecords : public ::testing::Test {
 protected:
  Masters m_{3};
  std::unique_ptr<d::Backend> backend_ = open_backend(m_.url("timeout=1s"), quiet());
};

TEST_F(RedlockRecords, PutGetEraseIfAbsentValuesAndLocks) {
  ASSERT_TRUE(backend_);
  check_put_get_erase(*backend_);
  check_values(*backend_);
  check_record_and_lock_coexist(*backend_);
}

TEST_F(RedlockRecords, IfAbsentRaceBetweenTwoClientsGivesBothTheSameAnswer) {
  auto other = open_backend(m_.url("timeout=1s"), quiet());
  ASSERT_TRUE(backend_ && other);
  check_if_absent_race(*backend_, *other, 200);
}

// The record is a plain key without expiry on every master.
TEST_F(RedlockRecords, KeyLayoutOnEveryMaster) {
  ASSERT_TRUE(backend_);
  Error ec;
  backend_->put_record("k", "v", d::PutMode::always, ec);
  ASSERT_FALSE(ec) << ec.message();
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m_.get(i, kRecord + "k"), "v");
    EXPECT_EQ(m_[i].command({"PTTL", kRecord + "k"})->integer, -1);
  }
}

TEST_F(RedlockRecords, ListHeldExpiredAndMany) {
  ASSERT_TRUE(backend_);
  check_listing(*backend_);
  check_expired_not_listed(*backend_);
  check_many(*backend_, 600);
}

// A lock held on one master only (a leftover of a failed acquisition) is not listed.
TEST_F(RedlockRecords, ALockOnAMinorityIsNotListed) {
  ASSERT_TRUE(backend_);
  m_[0].command(
      {"SET", "distlock:redlock:lock:min/one", "0123456789abcdef0123456789abcdef:9", "PX", "60000"});
  Error ec;
  ASSERT_TRUE(backend_->try_acquire({"min/two", test_owner(1), 60000ms}, ec).acquired);
  bool truncated = true;
  auto listed = backend_->list_held("min/", 1, truncated, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(names_of(listed), std::vector<std::string>{"min/two"});
  EXPECT_FALSE(truncated);
}

// A minority holding another value does not change the answer: get and if_absent
// answer what the majority holds.
TEST_F(RedlockRecords, TheMajorityValueWins) {
  ASSERT_TRUE(backend_);
  m_[0].command({"SET", kRecord + "maj", "old"});
  m_[1].command({"SET", kRecord + "maj", "new"});
  m_[2].command({"SET", kRecord + "maj", "new"});
  Error ec;
  EXPECT_EQ(backend_->get_record("maj", ec), "new");
  EXPECT_EQ(backend_->put_record("maj", "mine", d::PutMode::if_absent, ec), "new");
  ASSERT_FALSE(ec) << ec.message();
  // A record on one master only is no record.
  m_[0].command({"SET", kRecord + "one", "x"});
  EXPECT_EQ(backend_->get_record("one", ec), std::nullopt);
  ASSERT_FALSE(ec) << ec.message();
}

// Masters that disagree with no value on a quorum: quorum_unavailable naming the
// values; an `always` put settles it.
TEST_F(RedlockRecords, NoValueOnAQuorumIsQuorumUnavailableNamingTheDisagreement) {
  ASSERT_TRUE(backend_);
  m_[0].command({"SET", kRecord + "split", "a"});
  m_[1].command({"SET", kRecord + "split", "bb"});
  Error ec;
  ec.clear();
  backend_->get_record("split", ec);
  EXPECT_EQ(ec, errc::quorum_unavailable);
  std::string detail = ec.take_detail();
  std::cout << "[ detail   ] " << detail << "\n";
  EXPECT_NE(detail.find("disagree"), std::string::npos) << detail;
  EXPECT_NE(detail.find("1 bytes \"a\""), std::string::npos) << detail;
  EXPECT_NE(detail.find("2 bytes \"bb\""), std::string::npos) << detail;
  EXPECT_NE(detail.find("no record on 1 master"), std::string::npos) << detail;
  // if_absent stores "c" on the third master: a, bb, c.
  backend_->put_record("split", "c", d::PutMode::if_absent, ec);
  EXPECT_EQ(ec, errc::quorum_unavailable);
  detail = ec.take_detail();
  EXPECT_NE(detail.find("1 bytes \"c\""), std::string::npos) << detail;
  EXPECT_EQ(backend_->put_record("split", "z", d::PutMode::always, ec), "z");
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(backend_->get_record("split", ec), "z");
}

TEST(RedlockRecordsDown, OneMasterDownStillWorks) {
  Masters m(3);
  auto b = open_backend(m.url("timeout=1s"), quiet());
  ASSERT_TRUE(b);
  m[2].kill();
  check_put_get_erase(*b);
  check_listing(*b);
  Error ec;
  EXPECT_EQ(b->put_record("one-down", "v", d::PutMode::if_absent, ec), "v");
  EXPECT_EQ(b->get_record("one-down", ec), "v");
  EXPECT_FALSE(ec) << ec.message();
}

TEST(RedlockRecordsDown, AMajorityDownIsQuorumUnavailableNamingTheMasters) {
  Masters m(3);
  auto b = open_backend(m.url("timeout=1s"), quiet());
  ASSERT_TRUE(b);
  Error ec;
  b->put_record("down", "v", d::PutMode::always, ec);
  ASSERT_FALSE(ec);
  m[1].kill();
  m[2].kill();
  ec.clear();
  b->get_record("down", ec);
  EXPECT_EQ(ec, errc::quorum_unavailable);
  std::cout << "[ detail   ] " << ec.take_detail() << "\n";
  // Each failed master is named (the detail lists them all); check the first one.
  check_all_fail(*b, make_error_code(errc::quorum_unavailable), "127.0.0.1:" + std::to_string(m[1].port()));
  check_all_fail(*b, make_error_code(errc::quorum_unavailable), "127.0.0.1:" + std::to_string(m[2].port()));
}

}  // namespace

}  // namespace distlock::testing
