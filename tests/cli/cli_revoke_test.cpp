// `distlock revoke` (src/cli/cmd_revoke.cpp) against a real redis-server the test starts, and
// on file:// where the backend cannot revoke: the holder's `distlock run` has its command
// stopped and exits 76 naming the reason, the next waiter's `distlock run` gets the lock,
// `distlock status` shows the revoke, a second revoke finds nothing held (exit 3).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_harness.hpp"
#include "support/eventually.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A `distlock run` whose command writes its pid to `ready` (atomically) and then spins.
std::vector<std::string> spinning_run(const std::string& url, const std::string& name, const fs::path& ready,
                                      std::vector<std::string> flags) {
  std::vector<std::string> args{"run", "--url", url};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), {name, "--", "sh", "-c",
                           "echo $$ > " + ready.string() + ".tmp && mv " + ready.string() + ".tmp " +
                               ready.string() + "; while :; do sleep 0.05; done"});
  return args;
}

// A redis-server and a scratch directory for the runs.
struct CliRevokeRedis : ::testing::Test {
  TempDir dir{"distlock-cli-revoke"};
  RedisServer redis;

  // The holder: a spinning_run of `name` with TTL 3 s (renewals every 1 s, the bound the
  // holder is told within) and a 200 ms grace for its command.
  Cli start_holder(const std::string& name, const fs::path& ready) {
    return Cli::start(spinning_run(redis.url(), name, ready, {"--ttl", "3s", "--grace", "200ms"}),
                      dir.path());
  }

  // Whether `distlock status --json` counts a waiter on `name` within 20 s.
  bool waiter_counted(const std::string& name) {
    return eventually(
        [&] {
          Cli s = Cli::run({"status", "--json", "--url", redis.url(), name}, dir.path());
          const auto j = nlohmann::json::parse(s.out(), nullptr, false);
          return !j.is_discarded() && j["waiters"].is_number() && j["waiters"].get<int>() >= 1;
        },
        20s);
  }
};

TEST_F(CliRevokeRedis, RevokedRunHasItsCommandStoppedAndTheWaiterRuns) {
  const fs::path a_ready = dir.path() / "a.ready", b_ready = dir.path() / "b.ready";
  Cli a = start_holder("revjob", a_ready);
  ASSERT_TRUE(wait_for_file(a_ready, 20s)) << a.err();
  const pid_t a_child = std::stoi(slurp(a_ready));
  Cli b =
      Cli::start(spinning_run(redis.url(), "revjob", b_ready, {"--ttl", "3s", "--wait", "60s"}), dir.path());
  // b waits behind a (the server counts it) before the revoke.
  ASSERT_TRUE(waiter_counted("revjob")) << b.err();

  Cli revoke =
      Cli::run({"revoke", "--url", redis.url(), "--reason", "ticket 4711: stuck", "revjob"}, dir.path());
  ASSERT_EQ(revoke.code(), 0) << revoke.err();
  EXPECT_NE(revoke.out().find("revoked: revjob"), std::string::npos) << revoke.out();
  const auto revoked_at = revoke.ended_at();

  // The holder's run: told at its next renewal (<= 1 s), its command killed after the 200 ms
  // grace, exit 76 naming the revoke. Bound on this process's clock: 1 s + 200 ms + 2.8 s slack
  // for process start-up and the loaded machine.
  ASSERT_EQ(a.wait(20s), 76) << a.err();
  const auto stopped_after = std::chrono::duration_cast<std::chrono::milliseconds>(a.ended_at() - revoked_at);
  EXPECT_LE(stopped_after, 4000ms);
  std::printf("revoked run exited %lld ms after `distlock revoke` exited (bound 4000 ms)\n",
              static_cast<long long>(stopped_after.count()));
  EXPECT_NE(a.err().find("revoked by"), std::string::npos) << a.err();
  EXPECT_NE(a.err().find("ticket 4711: stuck"), std::string::npos) << a.err();
  EXPECT_TRUE(eventually([&] { return !process_alive(a_child); }, 5s))
      << "the revoked run's command still runs";

  // The waiter's run got the lock with a larger token.
  ASSERT_TRUE(wait_for_file(b_ready, 20s)) << b.err();
  Cli status = Cli::run({"status", "--json", "--url", redis.url(), "revjob"}, dir.path());
  ASSERT_EQ(status.code(), 0) << status.err();
  const auto j = nlohmann::json::parse(status.out());
  ASSERT_TRUE(j["last_revoke"].is_object()) << status.out();
  EXPECT_EQ(j["last_revoke"]["reason"], "ticket 4711: stuck");
  EXPECT_GT(j["token"].get<std::uint64_t>(), j["last_revoke"]["token"].get<std::uint64_t>());
  EXPECT_NE(j["last_revoke"]["by_info"].get<std::string>().find("cmd=distlock revoke"), std::string::npos)
      << status.out();
  EXPECT_NE(j["last_revoke"]["holder_info"].get<std::string>().find("cmd=sh"), std::string::npos)
      << status.out();
  Cli text = Cli::run({"status", "--url", redis.url(), "revjob"}, dir.path());
  EXPECT_NE(text.out().find("revoked: "), std::string::npos) << text.out();

  b.signal(SIGTERM);
  b.wait(20s);
  // Free now: a revoke does nothing and says so.
  Cli again = Cli::run({"revoke", "--url", redis.url(), "--reason", "again", "revjob"}, dir.path());
  EXPECT_EQ(again.code(), 3) << again.err();
  EXPECT_NE(again.out().find("nothing held"), std::string::npos) << again.out();
  Cli json = Cli::run({"revoke", "--json", "--url", redis.url(), "--reason", "again", "revjob"}, dir.path());
  EXPECT_EQ(json.code(), 3) << json.err();
  EXPECT_EQ(nlohmann::json::parse(json.out())["revoked"], false);
}

// `distlock run` treats a revoke as a loss: the revoked run's command is gone before the
// next holder's command starts. The waiter's command checks, as its first act, whether the
// revoked command's process still exists (kill -0) and writes what it saw.
TEST_F(CliRevokeRedis, RevokedRunsCommandIsGoneBeforeTheWaitersCommandStarts) {
  const fs::path a_ready = dir.path() / "a.ready", b_saw = dir.path() / "b.saw";
  Cli a = start_holder("revorder", a_ready);
  ASSERT_TRUE(wait_for_file(a_ready, 20s)) << a.err();
  const std::string a_child = std::to_string(std::stoi(slurp(a_ready)));
  Cli b =
      Cli::start({"run", "--url", redis.url(), "--ttl", "3s", "--wait", "60s", "revorder", "--", "sh", "-c",
                  "if kill -0 " + a_child + " 2>/dev/null; then s=running; else s=gone; fi; echo $s > " +
                      b_saw.string() + ".tmp && mv " + b_saw.string() + ".tmp " + b_saw.string()},
                 dir.path());
  ASSERT_TRUE(waiter_counted("revorder")) << b.err();
  Cli revoke = Cli::run({"revoke", "--url", redis.url(), "--reason", "order check", "revorder"}, dir.path());
  ASSERT_EQ(revoke.code(), 0) << revoke.err();
  ASSERT_TRUE(wait_for_file(b_saw, 30s)) << b.err();
  EXPECT_EQ(slurp(b_saw), "gone\n") << "the next holder's command started while the revoked one still ran";
  EXPECT_EQ(a.wait(20s), 76) << a.err();
  EXPECT_EQ(b.wait(20s), 0) << b.err();
}

TEST(CliRevokeFile, FileBackendSaysItCannotRevoke) {
  TempDir dir("distlock-cli-revoke");
  const std::string url = "file://" + (dir.path() / "locks").string();
  Cli r = Cli::run({"revoke", "--url", url, "--reason", "why", "job"}, dir.path());
  EXPECT_EQ(r.code(), 70) << r.err();
  EXPECT_NE(r.err().find("cannot end another process's hold"), std::string::npos) << r.err();
  Cli missing = Cli::run({"revoke", "--url", url, "job"}, dir.path());
  EXPECT_EQ(missing.code(), 64) << missing.err();
}

}  // namespace
}  // namespace distlock::testing
