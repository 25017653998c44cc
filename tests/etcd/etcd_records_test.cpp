// Records (put/get/erase) and list_held of the etcd backend against a real etcd
// member started by each test (tests/etcd/etcd_cluster.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "etcd_cluster.hpp"
#include "support/backend_records.hpp"
#include "support/backend_session_records.hpp"
#include "support/client_options.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using detail::PutMode;

TEST(EtcdRecords, PutIfAbsentRaceGivesBothClientsTheSameAnswer) {
  EtcdCluster etcd(1);
  Client one = connect(etcd.url(), quiet());
  Client two = connect(etcd.url(), quiet());
  expect_put_if_absent_race_same_answer(one, two);
}

TEST(EtcdRecords, AlwaysOverwritesGetAndEraseBehave) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url("?prefix=app"), quiet());
  expect_always_overwrites_get_and_erase(backend_of(c), [&] {
    // Stored as a plain key (no lease) in the records namespace below the prefix.
    const std::string fields = etcd.etcdctl_ok({"get", "app/%records/cfg", "-w", "fields"});
    EXPECT_NE(fields.find("\"Lease\" : 0"), std::string::npos) << fields;
    EXPECT_NE(fields.find("\"Value\" : \"3\""), std::string::npos) << fields;
  });
}

TEST(EtcdRecords, BinaryValuesUpTo64KiBAndNoMore) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url(), quiet());
  expect_binary_values_up_to_the_bound(backend_of(c), std::string("bin/\xff\x01%2F/key", 13));
}

TEST(EtcdRecords, ARecordAndALockOfTheSameNameCoexist) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url(), quiet());
  expect_record_and_lock_of_one_name_coexist(c, "same", 5s);
}

TEST(EtcdRecords, RecordsOutliveTheirWritersLeaseClosedOrKilled) {
  EtcdCluster etcd(1);
  Client reader = connect(etcd.url(), quiet());
  // A closed client revokes its session lease; a killed one's lease expires on the server.
  expect_records_outlive_their_writers(
      reader, [&] { return connect(etcd.url(), quiet()); }, etcd.url(), "1000", "distlock-etcd-records",
      "lease");
}

TEST(EtcdRecords, ListHeldByPrefixWithLimitTruncationAndWaiters) {
  EtcdCluster etcd(1);
  Client holder = connect(etcd.url(), quiet());
  Client waiters_client = connect(etcd.url(), quiet());
  expect_list_held_prefix_limit_truncation_and_waiters(holder, waiters_client, 10s,
                                                       /*tells_ttl_remaining=*/true);
}

TEST(EtcdRecords, ExpiredLocksAreNotListed) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url(), quiet());
  expect_expired_locks_not_listed(c, etcd.url(), "1000", "distlock-etcd-list");
}

TEST(EtcdRecords, ServerDownIsBackendUnavailableNamingTheServer) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url("?timeout=300ms"), quiet());
  expect_records_calls_unavailable_naming(
      backend_of(c), [&] { etcd.kill(0); }, "127.0.0.1:" + std::to_string(etcd.client_port(0)));
}

TEST(EtcdRecords, RecordsNeedNoPermissionBeyondThePrefixAndPrefixesAreApart) {
  EtcdCluster etcd(1);
  etcd.etcdctl_ok({"user", "add", "root:rootpw"});
  etcd.etcdctl_ok({"user", "add", "locker:s3cret"});
  etcd.etcdctl_ok({"user", "add", "stranger:other"});
  etcd.etcdctl_ok({"role", "add", "lockers"});
  etcd.etcdctl_ok({"role", "add", "strangers"});
  etcd.etcdctl_ok({"role", "grant-permission", "lockers", "--prefix=true", "readwrite", "distlock/"});
  etcd.etcdctl_ok({"role", "grant-permission", "strangers", "--prefix=true", "readwrite", "elsewhere/"});
  etcd.etcdctl_ok({"user", "grant-role", "locker", "lockers"});
  etcd.etcdctl_ok({"user", "grant-role", "stranger", "strangers"});
  etcd.etcdctl_ok({"auth", "enable"});
  Client c = connect("etcd://locker:s3cret@" + etcd.endpoints(), quiet());
  auto& b = backend_of(c);
  distlock::detail::Error ec;
  EXPECT_EQ(b.put_record("k", "v", PutMode::if_absent, ec), "v");
  EXPECT_FALSE(ec) << ec.message() << " " << ec.take_detail();
  Lease lease = c.acquire("held", ttl_of(5s));
  bool truncated = false;
  EXPECT_EQ(names(list_ok(b, "", 10, truncated)), std::vector<std::string>{"held"});

  // Another user, confined to its own prefix, has its own records: it neither sees
  // nor changes ours (and cannot even connect with our prefix: the probe is refused).
  Client s = connect("etcd://stranger:other@" + etcd.endpoints() + "?prefix=elsewhere", quiet());
  bool theirs = true;
  get_ok(backend_of(s), "k", theirs);
  EXPECT_FALSE(theirs);
  EXPECT_EQ(backend_of(s).put_record("k", "mine", PutMode::always, ec), "mine");
  EXPECT_TRUE(list_ok(backend_of(s), "", 10, truncated).empty());
  bool found = false;
  EXPECT_EQ(get_ok(b, "k", found), "v");
}

TEST(EtcdRecords, ListingManyLocksPagesThroughThemAndSkipsRecords) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url(), quiet());
  expect_listing_many_locks_pages_and_skips_records(c, backend_of(c));
}

TEST(EtcdRecords, DerivedNamesWithUnitSeparatorsListByTheirPrefix) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url(), quiet());
  expect_derived_names_list_by_prefix(c, backend_of(c));
}

}  // namespace
}  // namespace distlock::testing
