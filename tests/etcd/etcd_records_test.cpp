// Records (put/get/erase) and list_held of the etcd backend against a real etcd
// member started by each test (tests/etcd/etcd_cluster.hpp).
#include <gtest/gtest.h>
#include <signal.h>

#include <barrier>
#include <chrono>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "etcd_cluster.hpp"
#include "support/backend_records.hpp"
#include "support/client_options.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using detail::PutMode;
using Steady = std::chrono::steady_clock;

detail::Backend& backend_of(Client& c) {
  return distlock::detail::engine_of(c)->backend();
}

using distlock::testing::ttl_of;

using distlock::testing::quiet;

// Waits (bounded) until `pred` holds; false at the deadline.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout) {
  const auto end = Steady::now() + timeout;
  while (Steady::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

TEST(EtcdRecords, PutIfAbsentRaceGivesBothClientsTheSameAnswer) {
  EtcdCluster etcd(1);
  Client one = connect(etcd.url(), quiet());
  Client two = connect(etcd.url(), quiet());
  constexpr int kRounds = 40;
  std::vector<std::string> got_one(kRounds), got_two(kRounds);
  std::barrier sync(2);
  auto racer = [&](Client& c, const std::string& value, std::vector<std::string>& got) {
    for (int i = 0; i < kRounds; ++i) {
      sync.arrive_and_wait();
      distlock::detail::Error ec;
      got[i] = backend_of(c).put_record("race/" + std::to_string(i), value, PutMode::if_absent, ec);
      EXPECT_FALSE(ec) << ec.message();
    }
  };
  std::thread a([&] { racer(one, "from-one", got_one); });
  std::thread b([&] { racer(two, "from-two", got_two); });
  a.join();
  b.join();
  int one_won = 0;
  for (int i = 0; i < kRounds; ++i) {
    EXPECT_EQ(got_one[i], got_two[i]) << "round " << i;
    EXPECT_TRUE(got_one[i] == "from-one" || got_one[i] == "from-two") << got_one[i];
    bool found = false;
    EXPECT_EQ(get_ok(backend_of(one), "race/" + std::to_string(i), found), got_one[i]);
    EXPECT_TRUE(found);
    one_won += got_one[i] == "from-one" ? 1 : 0;
  }
  std::printf("put-if-absent races: client one won %d of %d\n", one_won, kRounds);
}

TEST(EtcdRecords, AlwaysOverwritesGetAndEraseBehave) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url("?prefix=app"), quiet());
  auto& b = backend_of(c);
  distlock::detail::Error ec;
  bool found = true;
  get_ok(b, "cfg", found);
  EXPECT_FALSE(found);
  EXPECT_EQ(b.put_record("cfg", "1", PutMode::always, ec), "1");
  EXPECT_EQ(b.put_record("cfg", "2", PutMode::if_absent, ec), "1");  // kept
  EXPECT_EQ(get_ok(b, "cfg", found), "1");
  EXPECT_EQ(b.put_record("cfg", "3", PutMode::always, ec), "3");  // overwritten
  EXPECT_EQ(get_ok(b, "cfg", found), "3");
  ASSERT_FALSE(ec);
  // Stored as a plain key (no lease) in the records namespace below the prefix.
  const std::string fields = etcd.etcdctl_ok({"get", "app/%records/cfg", "-w", "fields"});
  EXPECT_NE(fields.find("\"Lease\" : 0"), std::string::npos) << fields;
  EXPECT_NE(fields.find("\"Value\" : \"3\""), std::string::npos) << fields;
  EXPECT_TRUE(b.erase_record("cfg", ec));
  EXPECT_FALSE(ec);
  get_ok(b, "cfg", found);
  EXPECT_FALSE(found);
  EXPECT_FALSE(b.erase_record("cfg", ec));
  EXPECT_FALSE(ec);
  EXPECT_EQ(b.put_record("cfg", "4", PutMode::if_absent, ec), "4");  // absent again
}

TEST(EtcdRecords, BinaryValuesUpTo64KiBAndNoMore) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url(), quiet());
  auto& b = backend_of(c);
  std::string big(detail::kMaxRecordValue, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 % 256);
  const std::string key = std::string("bin/\xff\x01%2F/key", 13);
  distlock::detail::Error ec;
  EXPECT_EQ(b.put_record(key, big, PutMode::always, ec), big);
  ASSERT_FALSE(ec) << ec.message();
  bool found = false;
  EXPECT_EQ(get_ok(b, key, found), big);
  EXPECT_EQ(b.put_record("empty", "", PutMode::if_absent, ec), "");
  EXPECT_EQ(get_ok(b, "empty", found), "");
  EXPECT_TRUE(found) << "an empty value is a record, not its absence";

  ec.clear();
  const std::string too_big(detail::kMaxRecordValue + 1, 'x');
  for (const auto mode : {PutMode::always, PutMode::if_absent}) {
    b.put_record("big", too_big, mode, ec);
    EXPECT_EQ(ec, errc::invalid_argument);
    const std::string why = ec.take_detail();
    EXPECT_NE(why.find("65537"), std::string::npos) << why;
  }
  get_ok(b, "big", found);
  EXPECT_FALSE(found);
}

TEST(EtcdRecords, ARecordAndALockOfTheSameNameCoexist) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url(), quiet());
  auto& b = backend_of(c);
  Lease lease = c.acquire("same", ttl_of(5s));
  distlock::detail::Error ec;
  EXPECT_EQ(b.put_record("same", "record", PutMode::if_absent, ec), "record");
  ASSERT_FALSE(ec);
  const LockInfo info = c.status("same");
  EXPECT_TRUE(info.held);
  EXPECT_EQ(info.waiters, 0u) << "the record counted as a queued key";
  EXPECT_EQ(info.token, lease.token());
  bool truncated = true;
  EXPECT_EQ(names(list_ok(b, "", 100, truncated)), std::vector<std::string>{"same"});
  EXPECT_FALSE(truncated);
  lease.release();
  EXPECT_FALSE(c.status("same").held);
  bool found = false;
  EXPECT_EQ(get_ok(b, "same", found), "record");
  // The lock's key did not take the record along, nor the record the lock.
  Lease again = c.acquire("same", ttl_of(5s));
  EXPECT_TRUE(b.erase_record("same", ec));
  EXPECT_TRUE(c.status("same").held);
}

TEST(EtcdRecords, RecordsOutliveTheirWritersLeaseClosedOrKilled) {
  EtcdCluster etcd(1);
  Client reader = connect(etcd.url(), quiet());
  {
    Client writer = connect(etcd.url(), quiet());
    Lease held = writer.acquire("writer-lock", ttl_of(5s));
    distlock::detail::Error ec;
    backend_of(writer).put_record("closed", "v1", PutMode::always, ec);
    ASSERT_FALSE(ec);
  }  // the client revokes its session lease: its lock key goes
  EXPECT_FALSE(reader.status("writer-lock").held);
  bool found = false;
  EXPECT_EQ(get_ok(backend_of(reader), "closed", found), "v1");
  EXPECT_TRUE(found);

  // A writer SIGKILLed while holding a lock: its lease expires on the server.
  TempDir dir("distlock-etcd-records");
  const std::string out = (dir.path() / "tool.out").string();
  Process tool = Process::spawn({DISTLOCK_RECORD_TOOL, etcd.url(), "killed", "v2", "tool-lock", "1000"}, out);
  ASSERT_TRUE(wait_for_text(out, "ready", 20s)) << read_file(out);
  ASSERT_TRUE(reader.status("tool-lock").held);
  tool.signal(SIGKILL);
  const auto killed = Steady::now();
  ASSERT_TRUE(eventually([&] { return !reader.status("tool-lock").held; }, 30s)) << "lease never expired";
  std::printf("killed writer's lock expired after %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<Millis>(Steady::now() - killed).count()));
  EXPECT_EQ(get_ok(backend_of(reader), "killed", found), "v2");
  EXPECT_TRUE(found);
}

TEST(EtcdRecords, ListHeldByPrefixWithLimitTruncationAndWaiters) {
  EtcdCluster etcd(1);
  Client holder = connect(etcd.url(), quiet());
  Client waiters_client = connect(etcd.url(), quiet());
  auto& b = backend_of(holder);
  // '/' and '%' are encoded in keys; the prefix matches the user's bytes exactly.
  const std::vector<std::string> held_names = {"job/c",   "job/a", "job/%x", "jobs",
                                               "job%2Fq", "other", "job/b"};
  std::vector<Lease> leases;
  for (const auto& n : held_names) leases.push_back(holder.acquire(n, ttl_of(10s)));
  distlock::detail::Error ec;
  b.put_record("job/record", "not a lock", PutMode::always, ec);
  ASSERT_FALSE(ec);
  { Lease released = holder.acquire("job/released", ttl_of(10s)); }
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&] { Lease l = waiters_client.acquire("job/b", ttl_of(10s, 60s)); });
  }
  ASSERT_TRUE(eventually([&] { return holder.status("job/b").waiters == 2u; }, 20s));

  bool truncated = true;
  auto all = list_ok(b, "job/", 100, truncated);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(names(all), (std::vector<std::string>{"job/%x", "job/a", "job/b", "job/c"}));
  for (const auto& l : all) {
    const LockInfo st = holder.status(l.name);
    EXPECT_TRUE(l.info.held);
    EXPECT_EQ(l.info.holder, st.holder) << l.name;
    EXPECT_EQ(l.info.token, st.token) << l.name;
    EXPECT_EQ(l.info.waiters, st.waiters) << l.name;
    ASSERT_TRUE(l.info.ttl_remaining.has_value()) << l.name;
    EXPECT_GT(l.info.ttl_remaining->count(), 0);
    EXPECT_LE(*l.info.ttl_remaining, Millis(10s));
  }
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[2].info.waiters, 2u);
  EXPECT_EQ(all[0].info.waiters, 0u);
  EXPECT_EQ(all[1].info.token, leases[1].token());

  auto two = list_ok(b, "job/", 2, truncated);
  EXPECT_TRUE(truncated);
  EXPECT_EQ(names(two), (std::vector<std::string>{"job/%x", "job/a"}));
  auto four = list_ok(b, "job/", 4, truncated);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(four.size(), 4u);
  auto none = list_ok(b, "job/", 0, truncated);
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(truncated);

  EXPECT_EQ(names(list_ok(b, "job", 100, truncated)),
            (std::vector<std::string>{"job%2Fq", "job/%x", "job/a", "job/b", "job/c", "jobs"}));
  EXPECT_EQ(names(list_ok(b, "", 100, truncated)),
            (std::vector<std::string>{"job%2Fq", "job/%x", "job/a", "job/b", "job/c", "jobs", "other"}));
  EXPECT_EQ(names(list_ok(b, "job%", 100, truncated)), std::vector<std::string>{"job%2Fq"});
  EXPECT_TRUE(list_ok(b, "nothing", 100, truncated).empty());
  EXPECT_FALSE(truncated);

  leases.clear();  // released: the waiters take job/b in turn and leave
  for (auto& t : waiters) t.join();
  EXPECT_TRUE(list_ok(b, "", 100, truncated).empty());
}

TEST(EtcdRecords, ExpiredLocksAreNotListed) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url(), quiet());
  TempDir dir("distlock-etcd-list");
  const std::string out = (dir.path() / "tool.out").string();
  Process tool = Process::spawn({DISTLOCK_RECORD_TOOL, etcd.url(), "r", "v", "doomed", "1000"}, out);
  ASSERT_TRUE(wait_for_text(out, "ready", 20s)) << read_file(out);
  bool truncated = false;
  EXPECT_EQ(names(list_ok(backend_of(c), "", 10, truncated)), std::vector<std::string>{"doomed"});
  tool.signal(SIGKILL);
  const auto killed = Steady::now();
  EXPECT_TRUE(eventually([&] { return list_ok(backend_of(c), "", 10, truncated).empty(); }, 30s));
  std::printf("expired lock left the listing after %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<Millis>(Steady::now() - killed).count()));
}

TEST(EtcdRecords, ServerDownIsBackendUnavailableNamingTheServer) {
  EtcdCluster etcd(1);
  Client c = connect(etcd.url("?timeout=300ms"), quiet());
  auto& b = backend_of(c);
  distlock::detail::Error ec;
  b.put_record("k", "v", PutMode::always, ec);
  ASSERT_FALSE(ec);
  etcd.kill(0);
  const std::string port = std::to_string(etcd.client_port(0));
  auto expect_down = [&](const char* what) {
    EXPECT_EQ(ec, errc::backend_unavailable) << what << ": " << ec.message();
    const std::string why = ec.take_detail();
    EXPECT_NE(why.find("127.0.0.1:" + port), std::string::npos) << what << ": " << why;
  };
  b.put_record("k", "v", PutMode::always, ec);
  expect_down("put always");
  b.put_record("k", "v", PutMode::if_absent, ec);
  expect_down("put if_absent");
  b.get_record("k", ec);
  expect_down("get");
  b.erase_record("k", ec);
  expect_down("erase");
  bool truncated = false;
  b.list_held("", 10, truncated, ec);
  expect_down("list_held");
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
