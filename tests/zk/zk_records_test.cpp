// Records (put/get/erase) and list_held of the zk:// backend against a real ZooKeeper
// server started by this binary (one per process; tests that stop a server start
// their own). Observed with a raw C-client session, not only through the code under test.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "support/backend_records.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_server.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using detail::PutMode;
using Steady = std::chrono::steady_clock;

Client connect_zk(const std::string& suffix = "?session_timeout=4s") {
  return connect(shared_server().url(suffix), quiet());
}

detail::Backend& backend_of(Client& c) {
  return distlock::detail::engine_of(c)->backend();
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
    one_won += got_one[i] == "from-one" ? 1 : 0;
  }
  std::printf("put-if-absent races: client one won %d of %d\n", one_won, kRounds);
}

TEST(ZkRecords, AlwaysOverwritesGetAndEraseBehave) {
  const std::string chroot = fresh_chroot("always");
  Client c = connect_zk(chroot + "?session_timeout=4s");
  auto& b = backend_of(c);
  distlock::detail::Error ec;
  bool found = true;
  get_ok(b, "cfg", found);
  EXPECT_FALSE(found);
  EXPECT_EQ(b.put_record("cfg", "1", PutMode::always, ec), "1");     // created
  EXPECT_EQ(b.put_record("cfg", "2", PutMode::if_absent, ec), "1");  // kept
  EXPECT_EQ(get_ok(b, "cfg", found), "1");
  EXPECT_EQ(b.put_record("cfg", "3", PutMode::always, ec), "3");  // set
  EXPECT_EQ(get_ok(b, "cfg", found), "3");
  ASSERT_FALSE(ec);
  // A persistent node in the records directory, not an ephemeral one.
  RawZk raw(shared_server().hostport());
  Stat st{};
  ASSERT_EQ(raw.exists(chroot + "/distlock/.records/cfg", &st), ZOK);
  EXPECT_EQ(st.ephemeralOwner, 0);
  EXPECT_EQ(st.dataLength, 1);
  EXPECT_TRUE(b.erase_record("cfg", ec));
  EXPECT_FALSE(ec);
  get_ok(b, "cfg", found);
  EXPECT_FALSE(found);
  EXPECT_FALSE(b.erase_record("cfg", ec));
  EXPECT_FALSE(ec);
  EXPECT_EQ(b.put_record("cfg", "4", PutMode::if_absent, ec), "4");
}

TEST(ZkRecords, BinaryValuesUpTo64KiBAndNoMore) {
  const std::string chroot = fresh_chroot("binary");
  Client c = connect_zk(chroot + "?session_timeout=4s");
  auto& b = backend_of(c);
  std::string big(detail::kMaxRecordValue, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 % 256);
  const std::string key = std::string("bin/\xff\x01%2F/.records", 18);
  distlock::detail::Error ec;
  EXPECT_EQ(b.put_record(key, big, PutMode::always, ec), big);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.take_detail();
  bool found = false;
  EXPECT_EQ(get_ok(b, key, found), big);
  EXPECT_EQ(b.put_record(key, "short", PutMode::if_absent, ec), big);
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

TEST(ZkRecords, ARecordAndALockOfTheSameNameCoexist) {
  const std::string chroot = fresh_chroot("same-name");
  Client c = connect_zk(chroot + "?session_timeout=4s");
  auto& b = backend_of(c);
  // ".records" is the records directory's own name: as a lock name it is encoded.
  for (const std::string name : {"same", ".records"}) {
    Lease lease = c.acquire(name, ttl_of(4s));
    distlock::detail::Error ec;
    EXPECT_EQ(b.put_record(name, "record", PutMode::if_absent, ec), "record");
    ASSERT_FALSE(ec) << ec.message() << " " << ec.take_detail();
    const LockInfo info = c.status(name);
    EXPECT_TRUE(info.held);
    EXPECT_EQ(info.waiters, 0u) << "the record counted as a queued node";
    EXPECT_EQ(info.token, lease.token());
    bool truncated = true;
    EXPECT_EQ(names(list_ok(b, "", 100, truncated)), std::vector<std::string>{name});
    lease.release();
    EXPECT_FALSE(c.status(name).held);
    bool found = false;
    EXPECT_EQ(get_ok(b, name, found), "record");
    Lease again = c.acquire(name, ttl_of(4s));
    EXPECT_TRUE(b.erase_record(name, ec));
    EXPECT_TRUE(c.status(name).held);
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
  {
    Client writer = connect_zk(chroot + "?session_timeout=4s");
    Lease held = writer.acquire("writer-lock", ttl_of(4s));
    distlock::detail::Error ec;
    backend_of(writer).put_record("closed", "v1", PutMode::always, ec);
    ASSERT_FALSE(ec);
  }  // closing the session removes its ephemeral nodes
  EXPECT_FALSE(reader.status("writer-lock").held);
  bool found = false;
  EXPECT_EQ(get_ok(backend_of(reader), "closed", found), "v1");
  EXPECT_TRUE(found);

  // A writer SIGKILLed while holding a lock: its session expires on the server.
  TempDir dir("distlock-zk-records");
  const std::string out = (dir.path() / "tool.out").string();
  Process tool = Process::spawn({DISTLOCK_RECORD_TOOL, shared_server().url(chroot + "?session_timeout=2s"),
                                 "killed", "v2", "tool-lock", "2000"},
                                out);
  ASSERT_TRUE(wait_for_text(out, "ready", 20s)) << read_file(out);
  ASSERT_TRUE(reader.status("tool-lock").held);
  tool.signal(SIGKILL);
  const auto killed = Steady::now();
  ASSERT_TRUE(eventually([&] { return !reader.status("tool-lock").held; }, 30s)) << "session never expired";
  std::printf("killed writer's session ended after %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<Millis>(Steady::now() - killed).count()));
  EXPECT_EQ(get_ok(backend_of(reader), "killed", found), "v2");
  EXPECT_TRUE(found);
}

TEST(ZkRecords, ListHeldByPrefixWithLimitTruncationAndWaiters) {
  const std::string chroot = fresh_chroot("list-held");
  Client holder = connect_zk(chroot + "?session_timeout=4s");
  Client waiters_client = connect_zk(chroot + "?session_timeout=4s");
  auto& b = backend_of(holder);
  const std::vector<std::string> held_names = {"job/c",   "job/a", "job/%x", "jobs",
                                               "job%2Fq", "other", "job/b"};
  std::vector<Lease> leases;
  for (const auto& n : held_names) leases.push_back(holder.acquire(n, ttl_of(4s)));
  distlock::detail::Error ec;
  b.put_record("job/record", "not a lock", PutMode::always, ec);
  ASSERT_FALSE(ec);
  {
    Lease released = holder.acquire("job/released", ttl_of(4s));
  }  // its directory may linger (a container is removed later): not held, not listed
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&] { Lease l = waiters_client.acquire("job/b", ttl_of(4s, 60s)); });
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
    EXPECT_FALSE(l.info.ttl_remaining.has_value()) << "zk:// cannot tell a holder's remaining TTL";
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
  EXPECT_TRUE(list_ok(b, "job/", 0, truncated).empty());
  EXPECT_TRUE(truncated);

  EXPECT_EQ(names(list_ok(b, "job", 100, truncated)),
            (std::vector<std::string>{"job%2Fq", "job/%x", "job/a", "job/b", "job/c", "jobs"}));
  EXPECT_EQ(names(list_ok(b, "", 100, truncated)),
            (std::vector<std::string>{"job%2Fq", "job/%x", "job/a", "job/b", "job/c", "jobs", "other"}));
  EXPECT_EQ(names(list_ok(b, "job%", 100, truncated)), std::vector<std::string>{"job%2Fq"});
  EXPECT_TRUE(list_ok(b, "nothing", 100, truncated).empty());
  EXPECT_FALSE(truncated);

  leases.clear();
  for (auto& t : waiters) t.join();
  EXPECT_TRUE(list_ok(b, "", 100, truncated).empty());
}

TEST(ZkRecords, ExpiredLocksAreNotListed) {
  const std::string chroot = fresh_chroot("list-expired");
  Client c = connect_zk(chroot + "?session_timeout=4s");
  TempDir dir("distlock-zk-list");
  const std::string out = (dir.path() / "tool.out").string();
  Process tool = Process::spawn(
      {DISTLOCK_RECORD_TOOL, shared_server().url(chroot + "?session_timeout=2s"), "r", "v", "doomed", "2000"},
      out);
  ASSERT_TRUE(wait_for_text(out, "ready", 20s)) << read_file(out);
  bool truncated = false;
  EXPECT_EQ(names(list_ok(backend_of(c), "", 10, truncated)), std::vector<std::string>{"doomed"});
  tool.signal(SIGKILL);
  const auto killed = Steady::now();
  EXPECT_TRUE(eventually([&] { return list_ok(backend_of(c), "", 10, truncated).empty(); }, 30s));
  std::printf("expired lock left the listing after %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<Millis>(Steady::now() - killed).count()));
}

TEST(ZkRecords, ServerDownIsBackendUnavailableNamingTheServer) {
  ZkServer server;  // its own: this test stops it
  Client c = connect(server.url("?session_timeout=4s&timeout=300ms"), quiet());
  auto& b = backend_of(c);
  distlock::detail::Error ec;
  b.put_record("k", "v", PutMode::always, ec);
  ASSERT_FALSE(ec);
  server.kill();
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  auto expect_down = [&](const char* what) {
    EXPECT_EQ(ec, errc::backend_unavailable) << what << ": " << ec.message();
    const std::string why = ec.take_detail();
    EXPECT_NE(why.find(where), std::string::npos) << what << ": " << why;
  };
  const auto start = Steady::now();
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
  const auto took = std::chrono::duration_cast<Millis>(Steady::now() - start);
  std::printf("five calls against a dead server took %lld ms\n", static_cast<long long>(took.count()));
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
