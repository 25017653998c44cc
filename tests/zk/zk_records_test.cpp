// Records (put/get/erase) and list_held of the zk:// backend against a real ZooKeeper
// server started by this binary (one per process; tests that stop a server start
// their own). Observed with a raw C-client session, not only through the code under test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "support/backend_records.hpp"
#include "support/backend_session_records.hpp"
#include "support/client_options.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_server.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using detail::PutMode;

Client connect_zk(const std::string& suffix = "?session_timeout=4s") {
  return connect(shared_server().url(suffix), quiet());
}

// A chroot of its own (unique per process and call), so each test starts from nothing
// even when the tests of this binary share one server (a plain run, --gtest_repeat).
std::string fresh_chroot(const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string path = "/" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  RawZk raw(shared_server().hostport());
  EXPECT_EQ(raw.create(path), ZOK) << path;
  return path;
}

TEST(ZkRecords, PutIfAbsentRaceGivesBothClientsTheSameAnswer) {
  const std::string chroot = fresh_chroot("race");
  Client one = connect_zk(chroot + "?session_timeout=4s");
  Client two = connect_zk(chroot + "?session_timeout=4s");
  expect_put_if_absent_race_same_answer(one, two);
}

TEST(ZkRecords, AlwaysOverwritesGetAndEraseBehave) {
  const std::string chroot = fresh_chroot("always");
  Client c = connect_zk(chroot + "?session_timeout=4s");
  expect_always_overwrites_get_and_erase(backend_of(c), [&] {
    // A persistent node in the records directory, not an ephemeral one.
    RawZk raw(shared_server().hostport());
    Stat st{};
    ASSERT_EQ(raw.exists(chroot + "/distlock/.records/cfg", &st), ZOK);
    EXPECT_EQ(st.ephemeralOwner, 0);
    EXPECT_EQ(st.dataLength, 1);
  });
}

TEST(ZkRecords, BinaryValuesUpTo64KiBAndNoMore) {
  const std::string chroot = fresh_chroot("binary");
  Client c = connect_zk(chroot + "?session_timeout=4s");
  expect_binary_values_up_to_the_bound(backend_of(c), std::string("bin/\xff\x01%2F/.records", 18));
}

TEST(ZkRecords, ARecordAndALockOfTheSameNameCoexist) {
  const std::string chroot = fresh_chroot("same-name");
  Client c = connect_zk(chroot + "?session_timeout=4s");
  // ".records" is the records directory's own name: as a lock name it is encoded.
  for (const std::string name : {"same", ".records"}) {
    SCOPED_TRACE(name);
    expect_record_and_lock_of_one_name_coexist(c, name, 4s);
  }
}

TEST(ZkRecords, AnotherUserReadsButCannotChangeRecords) {
  const std::string chroot = fresh_chroot("records-auth");
  const std::string hp = shared_server().hostport();
  Client alice = connect("zk://alice:right@" + hp + chroot + "?session_timeout=4s", quiet());
  Client bob = connect("zk://bob:bobpw@" + hp + chroot + "?session_timeout=4s", quiet());
  distlock::detail::Error ec;
  EXPECT_EQ(backend_of(alice).put_record("cfg", "alice's", PutMode::always, ec), "alice's");
  ASSERT_FALSE(ec);
  bool found = false;
  EXPECT_EQ(get_ok(backend_of(bob), "cfg", found), "alice's");
  ec.clear();
  backend_of(bob).put_record("cfg", "bob's", PutMode::always, ec);
  EXPECT_EQ(ec, errc::auth_failed) << ec.message();
  std::string why = ec.take_detail();
  EXPECT_EQ(why.find("bobpw"), std::string::npos) << "password leaked: " << why;
  EXPECT_NE(why.find("ZooKeeper at zk://bob:***@"), std::string::npos) << why;
  backend_of(bob).erase_record("cfg", ec);
  EXPECT_EQ(ec, errc::auth_failed) << ec.message();
  backend_of(bob).put_record("new", "bob's", PutMode::if_absent, ec);
  EXPECT_EQ(ec, errc::auth_failed) << ec.message();
  EXPECT_EQ(get_ok(backend_of(alice), "cfg", found), "alice's");
  EXPECT_TRUE(backend_of(alice).erase_record("cfg", ec));
}

TEST(ZkRecords, RecordsOutliveTheirWritersSessionClosedOrKilled) {
  const std::string chroot = fresh_chroot("outlive");
  Client reader = connect_zk(chroot + "?session_timeout=4s");
  // Closing a session removes its ephemeral nodes; a killed one's session expires on the server.
  expect_records_outlive_their_writers(
      reader, [&] { return connect_zk(chroot + "?session_timeout=4s"); },
      shared_server().url(chroot + "?session_timeout=2s"), "2000", "distlock-zk-records", "session");
}

TEST(ZkRecords, ListHeldByPrefixWithLimitTruncationAndWaiters) {
  const std::string chroot = fresh_chroot("list-held");
  Client holder = connect_zk(chroot + "?session_timeout=4s");
  Client waiters_client = connect_zk(chroot + "?session_timeout=4s");
  // zk:// cannot tell a holder's remaining TTL.
  expect_list_held_prefix_limit_truncation_and_waiters(holder, waiters_client, 4s,
                                                       /*tells_ttl_remaining=*/false);
}

TEST(ZkRecords, ExpiredLocksAreNotListed) {
  const std::string chroot = fresh_chroot("list-expired");
  Client c = connect_zk(chroot + "?session_timeout=4s");
  expect_expired_locks_not_listed(c, shared_server().url(chroot + "?session_timeout=2s"), "2000",
                                  "distlock-zk-list");
}

TEST(ZkRecords, ServerDownIsBackendUnavailableNamingTheServer) {
  ZkServer server;  // its own: this test stops it
  // The 300 ms timeout keeps the calls after the kill short; a loaded machine (two CPU hogs beside
  // the suite) once kept the fresh server from answering the connect within it.
  Client c = connect_within_tries(server.url("?session_timeout=4s&timeout=300ms"), quiet(),
                                  errc::backend_unavailable);
  expect_records_calls_unavailable_naming(
      backend_of(c), [&] { server.kill(); }, "127.0.0.1:" + std::to_string(server.port()));
}

TEST(ZkRecords, ListingManyLocksPagesThroughThemAndSkipsRecords) {
  const std::string chroot = fresh_chroot("list-many");
  Client c = connect_zk(chroot + "?session_timeout=4s");
  expect_listing_many_locks_pages_and_skips_records(c, backend_of(c));
}

TEST(ZkRecords, DerivedNamesWithUnitSeparatorsListByTheirPrefix) {
  const std::string chroot = fresh_chroot("derived");
  Client c = connect_zk(chroot + "?session_timeout=4s");
  expect_derived_names_list_by_prefix(c, backend_of(c));
}

}  // namespace
}  // namespace distlock::testing
