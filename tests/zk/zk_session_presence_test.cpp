// Every zk:// session makes an ephemeral presence node /distlock/.sessions/<session id> at
// start (src/zk/zk_session.cpp; the watch reads it, src/zk/zk_watch.cpp). Locking must not
// depend on it: the nodes go with their sessions (nothing left after the clients close), and
// when the node cannot be made (here /distlock/.sessions is an ephemeral node, which takes no
// children) clients still acquire, hand over and release, and a watch still reports the
// hand-off.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

TEST(ZkSessionPresence, PresenceNodesGoWithTheirSessions) {
  ZkServer zk;
  RawZk raw(zk.hostport());
  {
    std::vector<Client> clients;
    for (int i = 0; i < 3; ++i) {
      clients.push_back(quiet_client(zk.url(kTenSecondSessions)));
      Lease l =
          clients.back().acquire("presence/x", ten_second_ttl(20s));  // a session (and its node) exists now
    }
    EXPECT_TRUE(eventually([&] { return raw.children("/distlock/.sessions").size() == 3; }, 10s))
        << raw.children("/distlock/.sessions").size() << " presence nodes for 3 open clients";
  }
  const auto closed = SteadyClock::now();
  EXPECT_TRUE(eventually([&] { return raw.children("/distlock/.sessions").empty(); }, 10s))
      << raw.children("/distlock/.sessions").size() << " presence nodes left after every client closed";
  std::printf(
      "presence nodes gone %lld ms after the clients closed\n",
      static_cast<long long>(std::chrono::duration_cast<Millis>(SteadyClock::now() - closed).count()));
}

TEST(ZkSessionPresence, LockingWorksWithoutPresenceNodes) {
  ZkServer zk;
  {
    RawZk setup(zk.hostport());
    ASSERT_EQ(setup.create("/distlock"), ZOK);
  }
  RawZk raw(zk.hostport());  // keeps the ephemeral /distlock/.sessions for the whole test
  ASSERT_EQ(raw.create("/distlock/.sessions", ZOO_EPHEMERAL), ZOK);
  Client watcher = quiet_client(zk.url(kTenSecondSessions));
  Client a = quiet_client(zk.url(kTenSecondSessions)), b = quiet_client(zk.url(kTenSecondSessions));
  distlock::Watch w = watcher.watch("nopresence/");
  Lease la = a.acquire("nopresence/x", ten_second_ttl(20s));
  auto lb = std::async(std::launch::async, [&] { return b.acquire("nopresence/x", ten_second_ttl(20s)); });
  ASSERT_TRUE(eventually([&] { return a.status("nopresence/x").waiters == 1; }, 10s));
  const std::uint64_t a_token = la.token();
  const auto released = SteadyClock::now();
  la.release();
  Lease held = lb.get();
  const auto handed = SteadyClock::now() - released;
  EXPECT_GT(held.token(), a_token);
  EXPECT_LT(handed, 2s) << "the hand-off took " << std::chrono::duration_cast<Millis>(handed).count()
                        << " ms";
  EXPECT_TRUE(raw.children("/distlock/.sessions").empty());
  std::vector<std::string> kinds;
  const auto end = SteadyClock::now() + 10s;
  while (kinds.size() < 3 && SteadyClock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - SteadyClock::now()));
    if (!e) break;
    if (e->kind == WatchEventKind::state) continue;
    kinds.push_back(std::string(distlock::to_string(e->kind)) + " " + std::to_string(e->token));
  }
  const std::vector<std::string> want{"acquired " + std::to_string(a_token),
                                      "released " + std::to_string(a_token),
                                      "acquired " + std::to_string(held.token())};
  EXPECT_EQ(kinds, want);
  std::printf("hand-off without presence nodes: %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<Millis>(handed).count()));
}

}  // namespace

}  // namespace distlock::testing
