// Black-box tests of `distlock run --shared/--exclusive` (a read-write lock, like
// flock -s/-x): readers overlap, a writer waits for them and keeps them out, a reader
// stopped past its TTL has its command killed (exit 76), conflicting flags are refused;
// on file:// and on a redis-server the test starts.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_fixture.hpp"
#include "cli/cli_harness.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A shell loop that waits (bounded: 60 s) until `file` exists.
std::string await(const fs::path& file) {
  return "i=0; while [ ! -e " + file.string() + " ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; ";
}

class CliReadWrite : public distlock::testing::FileOrRedisCliTest {
 protected:
  CliReadWrite() : FileOrRedisCliTest("distlock-cli-rw") {}
  std::vector<std::string> run_sh(const std::string& mode, const std::string& script,
                                  std::vector<std::string> flags = {}) const {
    std::vector<std::string> args{"run", "--url", url_, mode};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"cfg", "--", "sh", "-c", script});
    return args;
  }
};

// Two --shared runners are inside at the same time: each waits, inside, until the
// other's file appears, and records that it saw it. Readers get no DISTLOCK_TOKEN.
TEST_P(CliReadWrite, SharedRunnersOverlap) {
  const fs::path a_in = path("a.in"), b_in = path("b.in");
  Cli a = Cli::start(
      run_sh("--shared", "echo \"${DISTLOCK_TOKEN-none}\" > " + a_in.string() + "; " + await(b_in) + "[ -e " +
                             b_in.string() + " ] && echo saw > " + path("a.saw").string()),
      dir_.path());
  Cli b = Cli::start(
      run_sh("--shared", "echo \"${DISTLOCK_TOKEN-none}\" > " + b_in.string() + "; " + await(a_in) + "[ -e " +
                             a_in.string() + " ] && echo saw > " + path("b.saw").string()),
      dir_.path());
  EXPECT_EQ(a.wait(90s), 0) << a.err();
  EXPECT_EQ(b.wait(90s), 0) << b.err();
  EXPECT_EQ(slurp(path("a.saw")), "saw\n") << "reader a never saw reader b inside";
  EXPECT_EQ(slurp(path("b.saw")), "saw\n") << "reader b never saw reader a inside";
  EXPECT_EQ(slurp(a_in), "none\n") << "a reader got a DISTLOCK_TOKEN";
}

// An --exclusive runner waits until the reader inside is gone, then runs alone: a
// reader with --no-wait is refused (75) while it runs, a waiting reader enters only
// after its command ended. Its DISTLOCK_TOKEN is the writer's token.
TEST_P(CliReadWrite, ExclusiveWaitsForReadersAndKeepsThemOut) {
  const fs::path r1_in = path("r1.in"), r1_go = path("r1.go"), r1_out = path("r1.out");
  const fs::path w_in = path("w.in"), w_go = path("w.go"), w_out = path("w.out");
  const fs::path r3_in = path("r3.in");
  Cli r1 = Cli::start(run_sh("--shared", "echo in > " + r1_in.string() + "; " + await(r1_go) + "echo out > " +
                                             r1_out.string()),
                      dir_.path());
  ASSERT_TRUE(wait_for_file(r1_in, 30s)) << r1.err();
  // The token file is written before w.in: the test reads it as soon as w.in appears.
  Cli w = Cli::start(run_sh("--exclusive",
                            "echo $DISTLOCK_TOKEN > " + path("w.token").string() + "; if [ -e " +
                                r1_out.string() + " ]; then echo after; else echo beside; fi > " +
                                w_in.string() + "; " + await(w_go) + "echo out > " + w_out.string(),
                            {"--wait", "60s"}),
                     dir_.path());
  // The writer does not get in beside the reader (it is still waiting after 1 s).
  EXPECT_FALSE(wait_for_file(w_in, 1s)) << "the writer ran beside a reader";
  { std::ofstream(r1_go.string()) << "go"; }
  EXPECT_EQ(r1.wait(60s), 0) << r1.err();
  ASSERT_TRUE(wait_for_file(w_in, 60s)) << w.err();
  EXPECT_EQ(slurp(w_in), "after\n") << "the writer entered before the reader left";
  const std::string token = slurp(path("w.token"));
  ASSERT_FALSE(token.empty());
  EXPECT_GT(std::stoull(token), 0u) << token;
  // While the writer runs: no reader gets in.
  Cli r2 = Cli::run(run_sh("--shared", "touch " + path("r2.in").string(), {"--no-wait"}), dir_.path());
  EXPECT_EQ(r2.code(), 75) << r2.err();
  EXPECT_NE(r2.err().find("read-write lock \"cfg\" is held"), std::string::npos) << r2.err();
  EXPECT_FALSE(fs::exists(path("r2.in")));
  Cli r3 = Cli::start(
      run_sh("--shared",
             "if [ -e " + w_out.string() + " ]; then echo after; else echo beside; fi > " + r3_in.string(),
             {"--wait", "60s"}),
      dir_.path());
  EXPECT_FALSE(wait_for_file(r3_in, 1s)) << "a reader ran beside the writer";
  { std::ofstream(w_go.string()) << "go"; }
  EXPECT_EQ(w.wait(60s), 0) << w.err();
  EXPECT_EQ(r3.wait(60s), 0) << r3.err();
  EXPECT_EQ(slurp(r3_in), "after\n") << "the reader entered before the writer left";
}

// Conflicting flags: one line naming both, exit 64, nothing run.
TEST_P(CliReadWrite, ConflictingFlagsAreRefused) {
  const std::string touch = "touch " + path("ran").string();
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--shared", "--exclusive"}, "--shared and --exclusive exclude each other"},
      {{"--shared", "--permits", "2"}, "--shared and --permits exclude each other"},
      {{"--exclusive", "--permits", "2"}, "--exclusive and --permits exclude each other"},
      {{"--shared", "--once-per", "1m"}, "--once-per needs an exclusive hold, not --shared"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args{"run", "--url", url_};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    args.insert(args.end(), {"cfg", "--", "sh", "-c", touch});
    Cli cli = Cli::run(args, dir_.path());
    EXPECT_EQ(cli.code(), 64) << cli.err();
    EXPECT_NE(cli.err().find(c.says), std::string::npos) << cli.err();
  }
  EXPECT_FALSE(fs::exists(path("ran")));
}

INSTANTIATE_TEST_SUITE_P(Backends, CliReadWrite, ::testing::Values("file", "redis"),
                         [](const auto& param_info) { return param_info.param; });

// A --shared runner SIGSTOPped past its TTL loses its reader slot; a writer gets in.
// (redis only: file:// has no TTL, a stopped holder keeps its lock there, see
// docs/file-backend.md.) On SIGCONT the runner sees the loss first and kills its command: exit 76.
TEST(CliReadWriteRedis, ReaderStoppedPastItsTtlHasItsCommandKilled) {
  TempDir dir("distlock-cli-rw");
  RedisServer redis;
  auto path = [&](const std::string& name) { return dir.path() / name; };
  auto run_sh = [&](const std::string& mode, const std::string& script, std::vector<std::string> flags) {
    std::vector<std::string> args{"run", "--url", redis.url(), mode};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"cfg", "--", "sh", "-c", script});
    return args;
  };
  const fs::path ready = path("r.ready"), w_ready = path("w.ready");
  Cli r = Cli::start(
      run_sh("--shared", "exec 2>/dev/null; echo $$ > " + ready.string() + "; while :; do sleep 0.05; done",
             {"--ttl", "2s", "--grace", "1s"}),
      dir.path());
  ASSERT_TRUE(wait_for_file(ready, 30s)) << r.err();
  const pid_t child = std::stoi(slurp(ready));
  r.signal(SIGSTOP);
  Cli w = Cli::start(run_sh("--exclusive", "echo in > " + w_ready.string(), {"--wait", "60s"}), dir.path());
  ASSERT_TRUE(wait_for_file(w_ready, 60s)) << w.err();
  EXPECT_EQ(w.wait(60s), 0) << w.err();
  r.signal(SIGCONT);
  EXPECT_EQ(r.wait(60s), 76) << r.err();
  EXPECT_NE(r.err().find("lost while the command ran"), std::string::npos) << r.err();
  EXPECT_NE(r.err().find("SIGKILL"), std::string::npos) << r.err();
  EXPECT_FALSE(process_alive(child));
}

}  // namespace
}  // namespace distlock::testing
