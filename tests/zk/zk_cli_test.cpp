// The `distlock` tools on zk:// against a real ZooKeeper server: `run` sizes the
// session to its --ttl (a SIGKILLed runner frees the lock after about --ttl, not after
// the default 30 s session), `bench` picks a TTL its session can honour, and a TTL the
// session cannot honour is explained in the error itself.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "cli/cli_harness.hpp"
#include "support/process.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_server.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

TEST(ZkCli, RunSizesTheSessionToItsTtlSoAKilledRunnerFreesTheLockAfterIt) {
  TempDir dir("distlock-zk-cli");
  RawZk raw(shared_server().hostport());
  const std::string lock_dir = detail::zk::lock_dir("cli/killed");
  Cli runner = Cli::start(
      {"run", "--url", shared_server().url(), "--ttl", "2s", "cli/killed", "--", "sleep", "60"}, dir.path());
  ASSERT_TRUE(eventually([&] { return raw.children(lock_dir).size() == 1; }, 20s))
      << "the runner did not take the lock: " << runner.err();
  const auto node = lock_dir + "/" + raw.children(lock_dir).at(0);
  const auto killed_at = std::chrono::steady_clock::now();
  runner.signal(SIGKILL);
  ASSERT_EQ(runner.wait(10s), 128 + SIGKILL);
  // The session (2 s, sized to --ttl) ends on the server, and the node with it; the
  // default session (30 s) would keep it for 30 s. Bound: 2 s + a few 200 ms ticks of
  // the test server + 3 s slack for a loaded machine.
  ASSERT_TRUE(eventually([&] { return raw.exists(node) == ZNONODE; }, 40s)) << "node never went away";
  const auto freed_after =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed_at);
  std::printf("runner with --ttl 2s SIGKILLed: lock node gone after %lld ms\n",
              static_cast<long long>(freed_after.count()));
  EXPECT_LT(freed_after, 5500ms);
}

TEST(ZkCli, RunWithATtlTheSessionCannotHonourExplainsWhy) {
  TempDir dir("distlock-zk-cli");
  Cli runner = Cli::run(
      {"run", "--url", shared_server().url("?session_timeout=2s"), "--ttl", "10s", "cli/long", "--", "true"},
      dir.path(), 30s);
  EXPECT_EQ(runner.code(), 64) << runner.err();
  const std::string err = runner.err();
  for (const char* needle :
       {"ttl 10000ms", "session timeout 2000ms", "negotiated", "at most 4000ms", "session_timeout="}) {
    EXPECT_NE(err.find(needle), std::string::npos) << "missing \"" << needle << "\" in: " << err;
  }
  EXPECT_EQ(err.find("invalid lock options"), std::string::npos) << err;
}

TEST(ZkCli, BenchPicksATtlTheSessionHonours) {
  TempDir dir("distlock-zk-cli");
  // A URL that fixes a short session: the default TTL follows it.
  Cli shortsession = Cli::run({"bench", "--url", shared_server().url("?session_timeout=2s"), "--workload",
                               "uncontended", "--ops", "20", "--warmup", "2"},
                              dir.path(), 60s);
  EXPECT_EQ(shortsession.code(), 0) << shortsession.err();
  EXPECT_NE(shortsession.out().find("\"workload\":\"uncontended\""), std::string::npos) << shortsession.out();
  // No session_timeout: the session is sized to the default TTL.
  Cli plain = Cli::run(
      {"bench", "--url", shared_server().url(), "--workload", "uncontended", "--ops", "20", "--warmup", "2"},
      dir.path(), 60s);
  EXPECT_EQ(plain.code(), 0) << plain.err();
  // An explicit TTL the session cannot honour: the error says why and how to fix it.
  Cli explicit_ttl = Cli::run({"bench", "--url", shared_server().url("?session_timeout=2s"), "--ttl-ms",
                               "30000", "--workload", "uncontended", "--ops", "5", "--warmup", "0"},
                              dir.path(), 60s);
  EXPECT_NE(explicit_ttl.code(), 0);
  EXPECT_NE(explicit_ttl.err().find("session timeout 2000ms"), std::string::npos) << explicit_ttl.err();
  EXPECT_NE(explicit_ttl.err().find("at most 4000ms"), std::string::npos) << explicit_ttl.err();
}

}  // namespace
}  // namespace distlock::testing
