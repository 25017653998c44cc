// The queue on the command line: `distlock status --waiters` lists the runners waiting for a
// lock in hand-off order (text and --json), `distlock run --verbose` prints its place as it
// changes, on redis:// (which queues its waiters); on file://, which keeps no queue,
// status says so instead of inventing an order. Every wait is bounded (20 s).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_fixture.hpp"
#include "cli/cli_harness.hpp"
#include "distlock/client.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

class CliQueueTest : public FileOrRedisCliTest {
 protected:
  CliQueueTest() : FileOrRedisCliTest("distlock-cli-queue") {}
};

/// Whether the --verbose runner `waiter` reports, within 20 s, the line `place` naming the
/// runner ahead of it (`ahead`: its "pid=N ").
bool reports_place(const Cli& waiter, const std::string& place, const std::string& ahead) {
  return eventually(
      [&] {
        const std::string e = waiter.err();
        return e.find(place) != std::string::npos && e.find(ahead) != std::string::npos;
      },
      20s);
}

TEST_P(CliQueueTest, StatusListsWaitersInOrderAndRunVerboseTellsItsPlace) {
  const std::filesystem::path ready = path("queue.ready");
  Cli holder = Cli::start(run_sh("queue", "echo > " + ready.string() + "; exec sleep 60"), dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << holder.err();
  Client observer = connect(url_, quiet());

  if (!redis()) {
    Cli text = Cli::run({"status", "--url", url_, "--waiters", "queue"}, dir_.path());
    EXPECT_EQ(text.code(), 0) << text.err();
    EXPECT_NE(text.out().find("queue:   not listed by this backend\n"), std::string::npos) << text.out();
    Cli json = Cli::run({"status", "--url", url_, "--json", "--waiters", "queue"}, dir_.path());
    EXPECT_EQ(json.code(), 0) << json.err();
    EXPECT_TRUE(nlohmann::json::parse(json.out()).at("queue").is_null()) << json.out();
    holder.signal(SIGTERM);
    EXPECT_EQ(holder.wait(20s), 143);
    return;
  }

  std::vector<Cli> waiters;
  for (std::size_t i = 1; i <= 2; ++i) {
    waiters.push_back(Cli::start(run_sh("queue", "true", {"--verbose"}), dir_.path()));
    ASSERT_TRUE(eventually([&] { return observer.status("queue").waiter_list.size() == i; }, 20s))
        << "runner " << i << " was not queued within 20 s: " << waiters.back().err();
  }
  const std::string holder_pid = "pid=" + std::to_string(holder.pid()) + " ";
  const std::string first_pid = "pid=" + std::to_string(waiters[0].pid()) + " ";
  const std::string second_pid = "pid=" + std::to_string(waiters[1].pid()) + " ";

  Cli json = Cli::run({"status", "--url", url_, "--json", "--waiters", "queue"}, dir_.path());
  ASSERT_EQ(json.code(), 0) << json.err();
  const auto j = nlohmann::json::parse(json.out());
  EXPECT_EQ(j.at("waiters"), 2);
  const auto& queue = j.at("queue");
  ASSERT_TRUE(queue.is_array() && queue.size() == 2) << json.out();
  EXPECT_EQ(queue[0].at("position"), 1);
  EXPECT_EQ(queue[1].at("position"), 2);
  EXPECT_NE(queue[0].at("holder_info").get<std::string>().find(first_pid), std::string::npos) << json.out();
  EXPECT_NE(queue[1].at("holder_info").get<std::string>().find(second_pid), std::string::npos) << json.out();
  EXPECT_TRUE(queue[0].at("owner").is_string());
  EXPECT_TRUE(queue[0].at("waiting_since").is_null()) << "redis records no time a wait began";

  Cli text = Cli::run({"status", "--url", url_, "--waiters", "queue"}, dir_.path());
  ASSERT_EQ(text.code(), 0) << text.err();
  const std::string out = text.out();
  const auto one = out.find("\n  1. "), two = out.find("\n  2. ");
  ASSERT_NE(one, std::string::npos) << out;
  ASSERT_NE(two, std::string::npos) << out;
  EXPECT_LT(one, two);
  EXPECT_NE(out.find(first_pid, one), std::string::npos) << out;
  EXPECT_LT(out.find(first_pid, one), two) << out;

  // Each runner's first report: its place and who is ahead of it.
  EXPECT_TRUE(reports_place(waiters[0], "distlock: waiting: 1st in line behind the holder host=", holder_pid))
      << waiters[0].err();
  EXPECT_TRUE(reports_place(waiters[1], "distlock: waiting: 2nd in line behind host=", first_pid))
      << waiters[1].err();

  holder.signal(SIGTERM);
  EXPECT_EQ(holder.wait(20s), 143);
  EXPECT_EQ(waiters[0].wait(20s), 0) << waiters[0].err();
  EXPECT_EQ(waiters[1].wait(20s), 0) << waiters[1].err();
}

INSTANTIATE_TEST_SUITE_P(Backends, CliQueueTest, ::testing::Values("file", "redis"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace distlock::testing
