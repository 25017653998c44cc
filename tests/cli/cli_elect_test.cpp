// Black-box tests of `distlock elect` and `distlock leader` on file:// and on a real
// redis-server the test starts itself: the command runs only while leader, with the
// term in DISTLOCK_TOKEN; `leader` shows value, term and holder; `leader --watch
// --json` prints each new leader once, in term order; a leader stopped past its TTL
// has its command killed (exit 76) exactly as `run` does for a lost lock.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_fixture.hpp"
#include "cli/cli_harness.hpp"
#include "support/eventually.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

void touch(const fs::path& p) {
  std::ofstream(p) << "x";
}

class CliElect : public distlock::testing::FileOrRedisCliTest {
 protected:
  CliElect() : FileOrRedisCliTest("distlock-cli-elect") {}
  // `distlock elect --url URL --value V NAME -- sh -c SCRIPT`
  std::vector<std::string> elect_sh(const std::string& name, const std::string& value,
                                    const std::string& script, std::vector<std::string> flags = {}) const {
    std::vector<std::string> args{"elect", "--url", url_, "--value", value};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {name, "--", "sh", "-c", script});
    return args;
  }
  // A command that writes "$DISTLOCK_NAME|$DISTLOCK_TOKEN|$DISTLOCK_ELECTION_VALUE" to
  // `ready`, then runs until `stop` exists.
  static std::string hold_until(const fs::path& ready, const fs::path& stop) {
    return "echo \"$DISTLOCK_NAME|${DISTLOCK_TOKEN-absent}|$DISTLOCK_ELECTION_VALUE\" > " + ready.string() +
           ".tmp && mv " + ready.string() + ".tmp " + ready.string() + "; while [ ! -e " + stop.string() +
           " ]; do sleep 0.02; done";
  }
};

TEST_P(CliElect, CommandRunsWhileLeaderAndLeaderShowsValueTermAndHolder) {
  Cli none = Cli::run({"leader", "--url", url_, "svc"}, dir_.path());
  EXPECT_EQ(none.code(), 3) << none.err();
  EXPECT_EQ(none.out(), "election svc: no leader\n");

  Cli a =
      Cli::start(elect_sh("svc", "host-a:8080", hold_until(path("a.ready"), path("a.stop"))), dir_.path());
  ASSERT_TRUE(wait_for_file(path("a.ready"), 20s)) << a.err();
  const std::string env = lines_of(slurp(path("a.ready"))).at(0);
  ASSERT_TRUE(env.starts_with("svc|")) << env;
  const std::string token = env.substr(4, env.rfind('|') - 4);
  ASSERT_NE(token, "absent");
  EXPECT_EQ(env.substr(env.rfind('|') + 1), "host-a:8080");

  Cli shown = Cli::run({"leader", "--url", url_, "--json", "svc"}, dir_.path());
  ASSERT_EQ(shown.code(), 0) << shown.err();
  const auto j = nlohmann::json::parse(shown.out());
  EXPECT_EQ(j["election"], "svc");
  EXPECT_EQ(j["leader"], true);
  EXPECT_EQ(j["term"].get<std::uint64_t>(), std::stoull(token)) << "the term is the command's DISTLOCK_TOKEN";
  EXPECT_EQ(j["value"], "host-a:8080");
  EXPECT_EQ(j["value_known"], true);
  EXPECT_FALSE(j["holder"].get<std::string>().empty());
  Cli text = Cli::run({"leader", "--url", url_, "svc"}, dir_.path());
  EXPECT_EQ(text.code(), 0);
  EXPECT_TRUE(text.out().starts_with("election svc: term " + token + ", value \"host-a:8080\", holder "))
      << text.out();

  // Another candidate with --no-wait is not leader while the first is: exit 75, command never run.
  Cli b = Cli::run(elect_sh("svc", "host-b", "touch " + path("b.ran").string(), {"--no-wait"}), dir_.path());
  EXPECT_EQ(b.code(), 75) << b.err();
  EXPECT_FALSE(fs::exists(path("b.ran")));

  touch(path("a.stop"));
  ASSERT_EQ(a.wait(20s), 0) << a.err();
  EXPECT_EQ(a.err(), "");
  Cli after = Cli::run({"leader", "--url", url_, "svc"}, dir_.path());
  EXPECT_EQ(after.code(), 3) << "resigned when the command ended: " << after.out();
}

// Pacing: each leader resigns only after the watcher has printed it, so the watcher
// must print exactly the three leaders, in term order, once each.
TEST_P(CliElect, LeaderWatchJsonPrintsEachNewLeaderOnceInTermOrder) {
  Cli watcher =
      Cli::start({"leader", "--url", url_, "--watch", "--json", "--timeout", "120s", "w"}, dir_.path());
  std::vector<std::uint64_t> tokens;
  for (int i = 0; i < 3; ++i) {
    const std::string v = "v" + std::to_string(i);
    const fs::path ready = path(v + ".ready"), stop = path(v + ".stop");
    Cli e = Cli::start(elect_sh("w", v, hold_until(ready, stop)), dir_.path());
    ASSERT_TRUE(wait_for_file(ready, 20s)) << e.err();
    const std::string env = lines_of(slurp(ready)).at(0);
    tokens.push_back(std::stoull(env.substr(2, env.rfind('|') - 2)));
    ASSERT_TRUE(
        eventually([&] { return lines_of(watcher.out()).size() == static_cast<std::size_t>(i + 1); }, 20s))
        << "watcher did not print leader " << v << "; it printed:\n"
        << watcher.out() << watcher.err();
    touch(stop);
    ASSERT_EQ(e.wait(20s), 0) << e.err();
  }
  EXPECT_TRUE(watcher.running()) << "--timeout 120s has not passed";
  watcher.signal(SIGTERM);
  watcher.wait(10s);
  const auto lines = lines_of(watcher.out());
  ASSERT_EQ(lines.size(), 3u) << watcher.out();
  for (int i = 0; i < 3; ++i) {
    const auto j = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(j["value"], "v" + std::to_string(i)) << lines[i];
    EXPECT_EQ(j["term"].get<std::uint64_t>(), tokens[i]) << lines[i];
    EXPECT_EQ(j["value_known"], true);
  }
}

TEST_P(CliElect, LeaderWatchEndsAtItsTimeout) {
  Cli w = Cli::run({"leader", "--url", url_, "--watch", "--timeout", "300ms", "idle"}, dir_.path(), 20s);
  EXPECT_EQ(w.code(), 0) << w.err();
  EXPECT_EQ(w.out(), "");
  EXPECT_GE(w.elapsed(), 300ms);
  Cli bad = Cli::run({"leader", "--url", url_, "--timeout", "1s", "idle"}, dir_.path());
  EXPECT_EQ(bad.code(), 64) << "--timeout without --watch";
}

INSTANTIATE_TEST_SUITE_P(Backends, CliElect, ::testing::Values("file", "redis"),
                         [](const auto& param_info) { return param_info.param; });

// A leader SIGSTOPped past its TTL loses leadership to another candidate; on SIGCONT
// its command is killed at once and it exits 76, as `distlock run` does for a lost lock.
TEST(CliElectRedis, LeaderStoppedPastItsTtlHasItsCommandKilledAndExits76) {
  TempDir dir("distlock-cli-elect");
  RedisServer redis;
  const fs::path a_ready = dir.path() / "a.ready";
  Cli a = Cli::start({"elect", "--url", redis.url(), "--ttl", "2s", "--grace", "500ms", "--value", "a",
                      "paused", "--", "sh", "-c",
                      "echo $$ > " + a_ready.string() + ".tmp && mv " + a_ready.string() + ".tmp " +
                          a_ready.string() + "; while :; do sleep 0.05; done"},
                     dir.path());
  ASSERT_TRUE(wait_for_file(a_ready, 20s)) << a.err();
  const pid_t a_child = std::stoi(slurp(a_ready));
  a.signal(SIGSTOP);
  const fs::path b_ready = dir.path() / "b.ready";
  Cli b = Cli::start({"elect", "--url", redis.url(), "--ttl", "2s", "--value", "b", "paused", "--", "sh",
                      "-c", "echo $DISTLOCK_TOKEN > " + b_ready.string() + "; sleep 30"},
                     dir.path());
  ASSERT_TRUE(wait_for_file(b_ready, 20s)) << b.err();
  Cli shown = Cli::run({"leader", "--url", redis.url(), "--json", "paused"}, dir.path());
  EXPECT_EQ(nlohmann::json::parse(shown.out())["value"], "b");
  a.signal(SIGCONT);
  EXPECT_EQ(a.wait(20s), 76) << a.err();
  EXPECT_NE(a.err().find("lost while the command ran"), std::string::npos) << a.err();
  EXPECT_TRUE(eventually([&] { return !process_alive(a_child); }, 5s))
      << "the deposed leader's command still runs";
  b.signal(SIGTERM);
  b.wait(20s);
}

}  // namespace
}  // namespace distlock::testing
