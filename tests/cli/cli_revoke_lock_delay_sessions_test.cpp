// `distlock revoke` and `distlock run --lock-delay` on the queue backends (etcd://, zk://; the
// servers each test starts itself through tests/support/backend_targets; a backend of this
// build whose server is missing fails, never skips):
//   - a revoked `distlock run` has its command stopped and exits 76 naming the reason; the
//     waiting `distlock run` gets the lock, and its command starts only after the revoked
//     command is gone; `distlock status` shows the revoke;
//   - a `distlock run --lock-delay D` (3 s) SIGKILLed with its command: a `distlock run --wait`
//     started right after the kill runs its command no earlier than kill + D (measured on
//     this process's steady clock from just before the kill to the waiter's command writing
//     its file); a run with --lock-delay that ends normally hands over at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_harness.hpp"
#include "support/backend_targets.hpp"
#include "support/eventually.hpp"
#include "support/process.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// The queue backends of this build that revoke and enforce lock-delay.
std::vector<Kind> session_kinds() {
  std::vector<Kind> out;
  for (auto& k : kinds())
    if (k.label == "etcd1" || k.label == "zk1") out.push_back(k);
  return out;
}

// A command that writes its pid to `ready` (atomically) and then spins.
std::string spin_script(const fs::path& ready) {
  return "echo $$ > " + ready.string() + ".tmp && mv " + ready.string() + ".tmp " + ready.string() +
         "; while :; do sleep 0.05; done";
}

class CliSessionBackends : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    target_ = GetParam().make({});
    url_ = target_->url();
  }
  fs::path path(const std::string& name) const { return dir_.path() / name; }
  std::vector<std::string> run(const std::string& name, std::vector<std::string> flags,
                               const std::string& script) const {
    std::vector<std::string> args{"run", "--url", url_};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {name, "--", "sh", "-c", script});
    return args;
  }
  bool waiter_counted(const std::string& name) const {
    return eventually(
        [&] {
          Cli s = Cli::run({"status", "--json", "--url", url_, name}, dir_.path());
          const auto j = nlohmann::json::parse(s.out(), nullptr, false);
          return !j.is_discarded() && j["waiters"].is_number() && j["waiters"].get<int>() >= 1;
        },
        20s);
  }
  TempDir dir_{"distlock-cli-sessions"};
  std::unique_ptr<Target> target_;
  std::string url_;
};

TEST_P(CliSessionBackends, RevokedRunIsStoppedBeforeTheWaitersCommandStarts) {
  const fs::path a_ready = path("a.ready"), b_saw = path("b.saw");
  Cli a = Cli::start(run("revjob", {"--ttl", "3s", "--grace", "200ms"}, spin_script(a_ready)), dir_.path());
  ASSERT_TRUE(wait_for_file(a_ready, 20s)) << a.err();
  const std::string a_child = std::to_string(std::stoi(slurp(a_ready)));
  Cli b =
      Cli::start(run("revjob", {"--ttl", "3s", "--wait", "60s"},
                     "if kill -0 " + a_child + " 2>/dev/null; then s=running; else s=gone; fi; echo $s > " +
                         b_saw.string() + ".tmp && mv " + b_saw.string() + ".tmp " + b_saw.string()),
                 dir_.path());
  ASSERT_TRUE(waiter_counted("revjob")) << b.err();

  Cli revoke = Cli::run({"revoke", "--url", url_, "--reason", "ticket 4711: stuck", "revjob"}, dir_.path());
  ASSERT_EQ(revoke.code(), 0) << revoke.err();
  EXPECT_NE(revoke.out().find("revoked: revjob"), std::string::npos) << revoke.out();
  // Told at its next renewal (<= 1 s), its command killed after the 200 ms grace: exit 76.
  ASSERT_EQ(a.wait(20s), 76) << a.err();
  EXPECT_NE(a.err().find("revoked by"), std::string::npos) << a.err();
  EXPECT_NE(a.err().find("ticket 4711: stuck"), std::string::npos) << a.err();
  ASSERT_TRUE(wait_for_file(b_saw, 30s)) << b.err();
  EXPECT_EQ(slurp(b_saw), "gone\n") << "the next holder's command started while the revoked one still ran";
  EXPECT_EQ(b.wait(20s), 0) << b.err();

  // Exit 3: free again (the waiter's command has ended); the revoke is shown all the same.
  Cli status = Cli::run({"status", "--json", "--url", url_, "revjob"}, dir_.path());
  ASSERT_EQ(status.code(), 3) << status.err();
  const auto j = nlohmann::json::parse(status.out());
  ASSERT_TRUE(j["last_revoke"].is_object()) << status.out();
  EXPECT_EQ(j["last_revoke"]["reason"], "ticket 4711: stuck");
  // Free now: a second revoke finds nothing held.
  Cli again = Cli::run({"revoke", "--url", url_, "--reason", "again", "revjob"}, dir_.path());
  EXPECT_EQ(again.code(), 3) << again.err();
}

TEST_P(CliSessionBackends, KilledRunWithLockDelayHoldsTheNameBack) {
  // Longer than a dead holder's lease can last after the kill (zk: the targets' 2-s session +
  // a 200-ms tick; etcd: the 1-s TTL + the lessor's 500-ms loop): a grant at the lease's end,
  // without the delay, would come before kill + D.
  constexpr auto kDelay = 3000ms;
  const fs::path a_ready = path("a.ready"), b_ran = path("b.ran");
  Cli a = Cli::start(run("ldjob", {"--ttl", "1s", "--lock-delay", "3s"}, spin_script(a_ready)), dir_.path());
  ASSERT_TRUE(wait_for_file(a_ready, 20s)) << a.err();
  const pid_t a_child = std::stoi(slurp(a_ready));
  Cli b =
      Cli::start(run("ldjob", {"--ttl", "1s", "--wait", "30s"}, "echo ran > " + b_ran.string()), dir_.path());
  ASSERT_TRUE(waiter_counted("ldjob")) << b.err();
  const auto killed = std::chrono::steady_clock::now();
  a.signal(SIGKILL);
  ::kill(a_child, SIGKILL);
  ASSERT_TRUE(wait_for_file(b_ran, 30s)) << b.err();
  const auto ran = std::chrono::steady_clock::now();
  EXPECT_EQ(b.wait(20s), 0) << b.err();
  const auto after = std::chrono::duration_cast<std::chrono::milliseconds>(ran - killed);
  std::printf(
      "[ %s ] waiter's command ran %lld ms after the SIGKILL of a run with --lock-delay 3s --ttl 1s\n",
      GetParam().label.c_str(), static_cast<long long>(after.count()));
  EXPECT_GE(after, kDelay) << "the waiter ran before the killed holder's lock-delay could have ended";

  // A run with --lock-delay that ends normally hands over at once: a try (--wait 0) right
  // after it succeeds.
  Cli first = Cli::run(run("ldjob", {"--ttl", "4s", "--lock-delay", "30s"}, "exit 0"), dir_.path());
  EXPECT_EQ(first.code(), 0) << first.err();
  Cli second = Cli::run(run("ldjob", {"--ttl", "4s", "--wait", "0"}, "exit 0"), dir_.path());
  EXPECT_EQ(second.code(), 0) << second.err();
}

INSTANTIATE_TEST_SUITE_P(Backends, CliSessionBackends, ::testing::ValuesIn(session_kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CliSessionBackends);

}  // namespace
}  // namespace distlock::testing
