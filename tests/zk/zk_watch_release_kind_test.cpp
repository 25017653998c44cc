// The zk:// watch's released-vs-lost inference (src/zk/zk_watch.cpp): A's end is `lost` only
// when A's node went in the same transaction as A's session's presence node. Here A releases
// and then closes its client (its presence node goes in a later transaction), and the next
// holder W is killed and its session expires (W's node and W's presence node go together,
// the last change of both directories), all while the watch's connection is frozen (a fault
// proxy). A's end must be reported `released`: W's session end is not A's.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/watch_recorder.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

Client connect(const std::string& url) {
  return distlock::connect(url, distlock::testing::quiet());
}

TEST(ZkWatchReleaseKind, ReleaseBeforeAnotherSessionsExpiryIsNotLost) {
  ZkServer& zk = shared_server();
  distlock::testing::FaultProxy proxy(zk.port());
  // The watch's session outlives the freeze (about 2 s of W's session timeout plus its
  // detection) by far: 30 s, so no disconnection gap.
  Client watcher = connect("zk://127.0.0.1:" + std::to_string(proxy.port()) + "?session_timeout=30s");
  Client observer = connect(zk.url("?session_timeout=10s"));
  const std::string name = "kind/x";
  std::optional<Client> a = connect(zk.url("?session_timeout=10s"));
  LockOptions o;
  o.ttl = Millis(10000);
  Lease la = a->acquire(name, o);
  const std::uint64_t a_token = la.token();
  Watch w = watcher.watch("kind/");
  distlock::testing::TempDir dir("zk-watch-kind");
  const std::string out = (dir.path() / "w.out").string();
  auto waiter = distlock::testing::spawn_holder(zk.url("?session_timeout=2s"), name, out, 2000);
  ASSERT_TRUE(distlock::testing::eventually([&] { return observer.status(name).waiters == 1; }, 20s));
  proxy.freeze();
  la.release();  // A's node goes; A's session is still there
  a.reset();     // A's session closes: its presence node goes, in a transaction of its own
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "acquired ", 20s)) << distlock::testing::read_file(out);
  waiter.signal(SIGKILL);  // W's session expires: W's node and its presence node go together
  ASSERT_TRUE(distlock::testing::eventually([&] { return !observer.status(name).held; }, 20s));
  proxy.pass();
  std::vector<std::string> seen;
  const auto first = next_matching(w, 20s, is_change, &seen);
  ASSERT_TRUE(first) << "no event after the freeze:" << joined(seen);
  ASSERT_EQ(first->token, a_token) << joined(seen);
  EXPECT_EQ(first->kind, WatchEventKind::released)
      << "A released; W's session end was reported as A's:" << joined(seen);
}

}  // namespace
}  // namespace distlock::testing
