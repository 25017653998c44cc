// `distlock watch PREFIX` (src/cli/cmd_watch.cpp) against a real redis-server: one line
// per event, stops by itself at --count and on SIGINT with exit 0, --json lines parse; and
// the same lines end to end on etcd:// (a real etcd member), zk:// (a ZooKeeper server) and
// postgres:// (a real PostgreSQL).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_harness.hpp"
#include "distlock/config.hpp"
#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/process.hpp"
#if DISTLOCK_HAS_POSTGRES
#include "support/postgres_server.hpp"
#endif
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#ifdef DISTLOCK_TEST_ZK
#include "zk/zk_server.hpp"
#endif
#ifdef DISTLOCK_TEST_ETCD
#include "etcd_cluster.hpp"
#endif

namespace {

using namespace std::chrono_literals;
using distlock::testing::Cli;
using distlock::testing::eventually;
using distlock::testing::lines_of;
#if DISTLOCK_HAS_POSTGRES
using distlock::testing::PostgresServer;
#endif
using distlock::testing::RedisServer;
using distlock::testing::TempDir;
using distlock::testing::ttl_of;

// `distlock watch --count 3 <dir>/` on `url`: the state of the lock `<dir>/x` held before
// (the first line shows the subscription is live), then its release and the next acquire,
// each with its token; --count 3 ends the tool with exit 0. Every backend's case runs this.
void expect_state_release_acquire(const std::string& url, const std::string& dir_prefix) {
  TempDir dir("distlock-cli-watch");
  const std::string name = dir_prefix + "/x";
  distlock::Client c = distlock::connect(url);
  distlock::Lease first = c.acquire(name, ttl_of(30s, 30s));
  const std::uint64_t first_token = first.token();
  Cli w =
      Cli::start({"watch", "--url", url, "--count", "3", "--timeout", "60s", dir_prefix + "/"}, dir.path());
  ASSERT_TRUE(eventually([&] { return lines_of(w.out()).size() == 1; }, 20s)) << w.out() << w.err();
  first.release();
  distlock::Lease second = c.acquire(name, ttl_of(30s, 30s));
  ASSERT_EQ(w.wait(20s), 0) << w.out() << w.err();
  const auto out = lines_of(w.out());
  ASSERT_EQ(out.size(), 3u) << w.out();
  EXPECT_NE(out[0].find(" state " + name + " held token=" + std::to_string(first_token)), std::string::npos)
      << out[0];
  EXPECT_NE(out[1].find(" released " + name + " token=" + std::to_string(first_token)), std::string::npos)
      << out[1];
  EXPECT_NE(out[2].find(" acquired " + name + " token=" + std::to_string(second.token())), std::string::npos)
      << out[2];
  EXPECT_EQ(w.err(), "");
}

// The first line (the state of the lock held before) shows the subscription is live;
// a release and an acquire then make three lines and --count 3 ends the tool with 0.
TEST(CliWatch, PrintsOneLinePerEventAndStopsAtCount) {
  RedisServer server;
  expect_state_release_acquire(server.url(), "cli");
}

// The same on redis+cluster:// (sharded events channels per slot:
// src/rediscluster/cluster_prefix_watch.cpp), a 3-master cluster the test starts.
TEST(CliWatch, RedisClusterPrintsOneLinePerEventAndStopsAtCount) {
  distlock::testing::RedisCluster cluster(3);
  expect_state_release_acquire(cluster.url(), "cli");
}

#if DISTLOCK_HAS_POSTGRES
// The same on postgres:// (LISTEN/NOTIFY: src/postgres/postgres_watch.cpp): the state of
// the lock held before, its release and the next acquire, then exit 0 at --count 3.
TEST(CliWatch, PostgresPrintsOneLinePerEventAndStopsAtCount) {
  PostgresServer server;
  expect_state_release_acquire(server.url(), "cli");
}
#endif  // DISTLOCK_HAS_POSTGRES

// --json: one object per line (the state line shows the subscription is live); SIGINT
// ends the tool with exit 0.
TEST(CliWatch, JsonLinesAndSigintExitsZero) {
  RedisServer server;
  TempDir dir("distlock-cli-watch");
  distlock::Client c = distlock::connect(server.url());
  distlock::Lease l = c.acquire("j/a", ttl_of(30s, 30s));
  const std::uint64_t token = l.token();
  Cli w = Cli::start({"watch", "--url", server.url(), "--json", "j/"}, dir.path());
  ASSERT_TRUE(eventually([&] { return lines_of(w.out()).size() == 1; }, 20s)) << w.out() << w.err();
  l.release();
  ASSERT_TRUE(eventually([&] { return lines_of(w.out()).size() == 2; }, 20s)) << w.out() << w.err();
  const auto out = lines_of(w.out());
  const auto s0 = nlohmann::json::parse(out[0]);
  EXPECT_EQ(s0.at("event"), "state") << out[0];
  EXPECT_EQ(s0.at("name"), "j/a");
  EXPECT_EQ(s0.at("held"), true);
  EXPECT_EQ(s0.at("token").get<std::uint64_t>(), token);
  EXPECT_EQ(s0.at("holder").get<std::string>().rfind(c.id(), 0), 0u) << "holder is this client: " << out[0];
  const auto s1 = nlohmann::json::parse(out[1]);
  EXPECT_EQ(s1.at("event"), "released") << out[1];
  EXPECT_EQ(s1.at("token").get<std::uint64_t>(), token);
  w.signal(SIGINT);
  EXPECT_EQ(w.wait(20s), 0) << w.err();
}

#ifdef DISTLOCK_TEST_ETCD
// On etcd://: the state of the lock held before, its release and the next acquire, with the
// tokens the leases carry (the keys' create revisions); --count 3 ends the tool with 0.
TEST(CliWatch, EtcdPrintsStateReleaseAndAcquire) {
  distlock::testing::EtcdCluster etcd(1);
  expect_state_release_acquire(etcd.url(), "cli");
}
#endif

#ifdef DISTLOCK_TEST_ZK
// The same on zk:// (src/zk/zk_watch.cpp: events inferred from one-shot watches): the
// state of the lock held before, then its release (the holder's session lives on: released,
// not lost) and the next acquire, each with its token (the lock node's czxid).
TEST(CliWatch, ZooKeeperPrintsStateReleaseAndAcquire) {
  distlock::testing::ZkServer zk;
  expect_state_release_acquire(zk.url("?session_timeout=30s"), "zcli");
}
#endif

// The backends that publish no lock changes a watch could follow: a clear error, exit 70,
// never an empty stream. file:// (kernel locks publish nothing) and redlock:// (its masters
// publish only the waiters' wake-ups: docs/redlock.md "Watching locks"); the redlock URL names
// three live masters, so the refusal is the watch's, not a failed connect.
TEST(CliWatch, BackendsThatPublishNoChangesAreNotSupported) {
  TempDir dir("distlock-cli-watch");
  RedisServer m1, m2, m3;
  const std::string redlock = "redlock://127.0.0.1:" + std::to_string(m1.port()) +
                              ",127.0.0.1:" + std::to_string(m2.port()) +
                              ",127.0.0.1:" + std::to_string(m3.port());
  for (const std::string& url : {"file://" + dir.path().string(), redlock}) {
    Cli w = Cli::run({"watch", "--url", url, "--count", "1", "x/"}, dir.path());
    EXPECT_EQ(w.code(), 70) << url << ": " << w.err();
    EXPECT_NE(w.err().find("publishes no lock changes"), std::string::npos) << url << ": " << w.err();
  }
}

}  // namespace
