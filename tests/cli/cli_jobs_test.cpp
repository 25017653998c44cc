// Black-box tests of the scheduled-job guards of `distlock run` (--max-hold,
// --min-hold, --once-per), of the holder description it stores, and of `distlock
// status`/`distlock list` showing it; on file:// and on a redis-server the test starts.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
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
using SteadyClock = std::chrono::steady_clock;

std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class CliJobs : public distlock::testing::FileOrRedisCliTest {
 protected:
  CliJobs() : FileOrRedisCliTest("distlock-cli-jobs") {}

  /// `distlock run FLAGS NAME -- sh -c 'echo WORD >> runs'`, run to its end: a run whose job
  /// ran adds the line WORD to the file path("runs").
  Cli run_appending(const std::string& name, const std::string& word, std::vector<std::string> flags) {
    return Cli::run(run_sh(name, "echo " + word + " >> " + path("runs").string(), std::move(flags)),
                    dir_.path());
  }
};

// A command that ignores SIGTERM and never ends (hung but alive): the lease is renewed
// fine, yet --max-hold ends it; the job gets SIGKILL at the limit and distlock exits 76
// naming --max-hold. Measured on this process's steady clock: not before 2 s.
TEST_P(CliJobs, MaxHoldKillsAHungCommandAndExits76) {
  const fs::path started = path("hung.started");
  const auto t0 = SteadyClock::now();
  Cli runner =
      Cli::run(run_sh("hung", "trap '' TERM; touch " + started.string() + "; while :; do sleep 1; done",
                      {"--ttl", "3s", "--max-hold", "2s", "--grace", "500ms"}),
               dir_.path(), 30s);
  ASSERT_EQ(runner.code(), 76) << runner.err();
  EXPECT_TRUE(fs::exists(started));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(runner.ended_at() - t0);
  EXPECT_GE(took, 2000ms);
  EXPECT_LT(took, 20000ms);  // generous: the limit is 2 s, the rest is a busy machine
  const auto err = lines_of(runner.err());
  ASSERT_EQ(err.size(), 1u) << runner.err();
  EXPECT_NE(err[0].find("--max-hold"), std::string::npos) << err[0];
  EXPECT_NE(err[0].find("SIGKILL"), std::string::npos) << err[0];
  // The lock is free again for the next runner (file://: at once; redis: by the TTL at most).
  Cli next = Cli::run(run_sh("hung", "exit 0", {"--wait", "10s"}), dir_.path());
  EXPECT_EQ(next.code(), 0) << next.err();
}

// A command that honours SIGTERM ends at --grace before the limit; exit 76 all the same.
TEST_P(CliJobs, MaxHoldSendsSigtermGraceBeforeTheLimit) {
  Cli runner =
      Cli::run(run_sh("slow", "exec sleep 60", {"--ttl", "3s", "--max-hold", "2s", "--grace", "500ms"}),
               dir_.path(), 30s);
  ASSERT_EQ(runner.code(), 76) << runner.err();
  EXPECT_GE(runner.elapsed(), 1500ms);
  const auto err = lines_of(runner.err());
  ASSERT_EQ(err.size(), 1u) << runner.err();
  EXPECT_NE(err[0].find("reached --max-hold 2s"), std::string::npos) << err[0];
  EXPECT_NE(err[0].find("SIGTERM"), std::string::npos) << err[0];
}

TEST_P(CliJobs, MaxHoldAndMinHoldFlagsAreChecked) {
  Cli zero = Cli::run(run_sh("x", "true", {"--max-hold", "0s"}), dir_.path());
  EXPECT_EQ(zero.code(), 64);
  EXPECT_NE(zero.err().find("--max-hold"), std::string::npos) << zero.err();
  Cli order = Cli::run(run_sh("x", "true", {"--max-hold", "2s", "--min-hold", "3s"}), dir_.path());
  EXPECT_EQ(order.code(), 64);
  EXPECT_NE(order.err().find("--min-hold 3s is longer than --max-hold 2s"), std::string::npos) << order.err();
  Cli grace = Cli::run(run_sh("x", "true", {"--max-hold", "1s", "--grace", "2s"}), dir_.path());
  EXPECT_EQ(grace.code(), 64);
  EXPECT_NE(grace.err().find("--grace"), std::string::npos) << grace.err();
  Cli bad = Cli::run(run_sh("x", "true", {"--once-per", "soon"}), dir_.path());
  EXPECT_EQ(bad.code(), 64);
}

// --lock-delay: over 60 s is a usage error naming the flag; file:// cannot enforce it (exit
// 64 naming lock_delay); redis:// takes it, and the normal release at the job's end hands
// the lock over at once (the next --no-wait runner gets it, though the delay is 30 s).
TEST_P(CliJobs, LockDelayFlag) {
  Cli over = Cli::run(run_sh("ld", "true", {"--lock-delay", "61s"}), dir_.path());
  EXPECT_EQ(over.code(), 64);
  EXPECT_NE(over.err().find("--lock-delay 61s"), std::string::npos) << over.err();
  Cli bad = Cli::run(run_sh("ld", "true", {"--lock-delay", "soon"}), dir_.path());
  EXPECT_EQ(bad.code(), 64) << bad.err();
  Cli first = Cli::run(run_sh("ld", "exit 0", {"--ttl", "5s", "--lock-delay", "30s"}), dir_.path());
  if (!redis()) {
    EXPECT_EQ(first.code(), 64);
    EXPECT_NE(first.err().find("lock_delay is not supported"), std::string::npos) << first.err();
    return;
  }
  ASSERT_EQ(first.code(), 0) << first.err();
  Cli next = Cli::run(run_sh("ld", "exit 0", {"--no-wait"}), dir_.path());
  EXPECT_EQ(next.code(), 0) << next.err();
}

// --min-hold 3s: the command ends at once, yet the lock stays held until 3 s after the
// grant, so a second "node" cannot run the job in that window. Every attempt of the
// second node that ended (on this process's clock) before start + 3 s was refused.
TEST_P(CliJobs, MinHoldKeepsTheLockAfterTheCommandEnds) {
  const fs::path ran = path("first.ran");
  const auto t0 = SteadyClock::now();
  Cli first = Cli::start(run_sh("minhold", "echo x > " + ran.string(), {"--ttl", "2s", "--min-hold", "3s"}),
                         dir_.path());
  ASSERT_TRUE(wait_for_file(ran, 20s)) << first.err();
  int refused = 0;
  bool second_ran = false;
  for (int i = 0; i < 400 && !second_ran; ++i) {
    Cli second = Cli::run(run_sh("minhold", "true", {"--no-wait"}), dir_.path());
    if (second.code() == 0) {
      second_ran = true;
      // It got the lock only after the first one released it: >= 3 s after t0.
      EXPECT_GE(second.ended_at() - t0, 3000ms);
    } else {
      ASSERT_EQ(second.code(), 75) << second.err();
      ++refused;
      std::this_thread::sleep_for(50ms);
    }
  }
  EXPECT_TRUE(second_ran);
  EXPECT_GE(refused, 1);  // the command's end did not free the lock
  ASSERT_EQ(first.wait(20s), 0) << first.err();
  EXPECT_EQ(first.err(), "");
  EXPECT_GE(first.elapsed(), 3000ms);
}

// Four "nodes" fire in the same slot: exactly one runs; the others exit 0 saying so.
TEST_P(CliJobs, OncePerRunsOncePerSlotAcrossNodes) {
  const fs::path runs = path("runs");
  // A period of 240000 h: the slot does not change while the test runs (until 2052).
  std::vector<Cli> nodes;
  for (int i = 0; i < 4; ++i) {
    nodes.push_back(Cli::start(
        run_sh("cron", "echo $DISTLOCK_TOKEN >> " + runs.string(), {"--once-per", "240000h"}), dir_.path()));
  }
  int skipped = 0;
  for (auto& n : nodes) {
    ASSERT_EQ(n.wait(30s), 0) << n.err();
    if (n.err().find("already ran in this --once-per") != std::string::npos) ++skipped;
  }
  EXPECT_EQ(lines_of(slurp(runs)).size(), 1u) << slurp(runs);
  EXPECT_EQ(skipped, 3);
  // Later in the same slot: still skipped.
  Cli late = run_appending("cron", "late", {"--once-per", "240000h"});
  EXPECT_EQ(late.code(), 0) << late.err();
  EXPECT_EQ(lines_of(slurp(runs)).size(), 1u);
}

// A failed run does not use up the slot; the next firing runs, and then the slot is done.
TEST_P(CliJobs, OncePerFailedRunDoesNotRecordTheSlot) {
  const fs::path runs = path("runs");
  Cli failed = Cli::run(
      run_sh("flaky", "echo fail >> " + runs.string() + "; exit 3", {"--once-per", "240000h"}), dir_.path());
  EXPECT_EQ(failed.code(), 3) << failed.err();
  Cli retry = run_appending("flaky", "ok", {"--once-per", "240000h"});
  EXPECT_EQ(retry.code(), 0) << retry.err();
  EXPECT_EQ(retry.err(), "");
  Cli again = run_appending("flaky", "again", {"--once-per", "240000h"});
  EXPECT_EQ(again.code(), 0);
  EXPECT_NE(again.err().find("already ran"), std::string::npos) << again.err();
  EXPECT_EQ(lines_of(slurp(runs)), (std::vector<std::string>{"fail", "ok"}));
}

// A new period slot (by the wall clock) runs again.
TEST_P(CliJobs, OncePerNextSlotRunsAgain) {
  const fs::path runs = path("runs");
  const std::int64_t period = 2000;
  // Start early in a slot, so both runs below fit into it on a busy machine.
  for (int i = 0; i < 400 && unix_ms() % period > 300; ++i) std::this_thread::sleep_for(10ms);
  const std::int64_t slot = unix_ms() / period;
  Cli a = run_appending("tick", "a", {"--once-per", "2s"});
  Cli b = run_appending("tick", "b", {"--once-per", "2s"});
  ASSERT_EQ(a.code(), 0) << a.err();
  ASSERT_EQ(b.code(), 0) << b.err();
  const std::int64_t after = unix_ms() / period;
  const bool same_slot = after == slot;
  // Bounded wait for the next slot (at most one period, 2 s).
  for (int i = 0; i < 500 && unix_ms() / period <= after; ++i) std::this_thread::sleep_for(10ms);
  Cli c = run_appending("tick", "c", {"--once-per", "2s"});
  ASSERT_EQ(c.code(), 0) << c.err();
  const auto r = lines_of(slurp(runs));
  if (same_slot) {
    EXPECT_EQ(r, (std::vector<std::string>{"a", "c"}));
  } else {
    EXPECT_EQ(r.back(), "c");  // the machine was too slow to keep a and b in one slot
  }
}

// True once `pid` has a connection to the server or a lock file open, i.e. it is trying
// to acquire (and, so, was started and read its clock before).
bool is_acquiring(pid_t pid, const fs::path& locks) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code link_ec;
    const std::string target = fs::read_symlink(e.path(), link_ec).string();
    if (target.starts_with("socket:") || target.starts_with(locks.string())) return true;
  }
  return false;
}

// The slot of a --once-per run is the one in which `distlock run` was started (fired by cron),
// not the one in which it got the lock: a runner fired in slot S that waits for the lock into
// slot S+1 runs as S's run, and a runner fired in S+1 still runs S+1. No timing is assumed: the
// holder releases only after the waiting runner is seen connected (so it has read its clock)
// and the test's wall clock has passed into a later slot.
TEST_P(CliJobs, OncePerSlotIsTakenWhenFiredNotWhenTheLockIsGranted) {
  const fs::path runs = path("runs"), started = path("started"), release = path("release");
  const std::int64_t period = 2000;
  Cli holder =
      Cli::start(run_sh("tick", "touch " + started.string() + "; i=0; while [ ! -e " + release.string() +
                                    " ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done"),
                 dir_.path());
  for (int i = 0; i < 3000 && !fs::exists(started); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(fs::exists(started)) << holder.err();
  Cli late = Cli::start(run_sh("tick", "echo late $DISTLOCK_ONCE_SLOT >> " + runs.string(),
                               {"--once-per", "2s", "--wait", "60s"}),
                        dir_.path());
  for (int i = 0; i < 3000 && !is_acquiring(late.pid(), dir_.path() / "locks"); ++i)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(is_acquiring(late.pid(), dir_.path() / "locks")) << late.err();
  const std::int64_t fired_by = unix_ms() / period;  // `late` read its clock before this
  for (int i = 0; i < 500 && unix_ms() / period <= fired_by; ++i) std::this_thread::sleep_for(10ms);
  const std::int64_t granted_after = unix_ms() / period;
  ASSERT_GT(granted_after, fired_by);
  { std::ofstream(release.string()) << "go"; }
  ASSERT_EQ(holder.wait(30s), 0) << holder.err();
  ASSERT_EQ(late.wait(30s), 0) << late.err();
  Cli next = Cli::run(
      run_sh("tick", "echo next $DISTLOCK_ONCE_SLOT >> " + runs.string(), {"--once-per", "2s"}), dir_.path());
  ASSERT_EQ(next.code(), 0) << next.err();
  const auto r = lines_of(slurp(runs));
  ASSERT_EQ(r.size(), 2u) << slurp(runs) << late.err() << next.err();
  std::istringstream late_line(r[0]), next_line(r[1]);
  std::string late_word, next_word;
  std::int64_t late_slot = 0, next_slot = 0;
  late_line >> late_word >> late_slot;
  next_line >> next_word >> next_slot;
  EXPECT_EQ(late_word, "late");
  EXPECT_LE(late_slot, fired_by);  // its firing slot, though granted in a later one
  EXPECT_EQ(next_word, "next");
  EXPECT_GE(next_slot, granted_after);
}

// Runners whose --once-per periods differ (a crontab changed, or a fleet half updated) judge
// the last run by when it was fired, in their own period: a run fired in this slot of the
// shorter period uses it up, and a mark written under a short period does not make a longer
// period's later slots look done. Periods of 240000 h and 120000 h: the current slots do not
// change while the test runs.
TEST_P(CliJobs, OncePerChangedPeriodJudgesTheLastRunByItsFiringTime) {
  const fs::path runs = path("runs");
  Cli longer = run_appending("cron", "long", {"--once-per", "240000h"});
  ASSERT_EQ(longer.code(), 0) << longer.err();
  // Fired within the current 120000 h slot too: that slot has had its run.
  Cli shorter = run_appending("cron", "short", {"--once-per", "120000h"});
  ASSERT_EQ(shorter.code(), 0) << shorter.err();
  EXPECT_NE(shorter.err().find("already ran"), std::string::npos) << shorter.err();
  EXPECT_EQ(lines_of(slurp(runs)), (std::vector<std::string>{"long"}));
  // A mark written under a 1 ms period (slot numbers ~10^12) does not block the 240000 h
  // period's slot forever: that slot already ran here (the first run), so it is skipped as done
  // in this slot, and the message names the mark's firing, not a "later period".
  Cli tiny = run_appending("cron", "tiny", {"--once-per", "1ms"});
  ASSERT_EQ(tiny.code(), 0) << tiny.err();
  Cli again = run_appending("cron", "again", {"--once-per", "240000h"});
  ASSERT_EQ(again.code(), 0) << again.err();
  EXPECT_NE(again.err().find("already ran in this --once-per"), std::string::npos) << again.err();
  EXPECT_EQ(lines_of(slurp(runs)), (std::vector<std::string>{"long", "tiny"}));
}

// --exclusive runners keep their own mark: the read-write lock NAME and the lock NAME do not
// exclude each other, so sharing one mark would let both run in one slot while looking guarded.
TEST_P(CliJobs, OncePerExclusiveHasItsOwnMark) {
  const fs::path runs = path("runs");
  Cli plain = run_appending("job", "plain", {"--once-per", "240000h"});
  ASSERT_EQ(plain.code(), 0) << plain.err();
  Cli rw = run_appending("job", "exclusive", {"--once-per", "240000h", "--exclusive"});
  ASSERT_EQ(rw.code(), 0) << rw.err();
  Cli rw2 = run_appending("job", "exclusive2", {"--once-per", "240000h", "--exclusive"});
  ASSERT_EQ(rw2.code(), 0) << rw2.err();
  EXPECT_NE(rw2.err().find("already ran"), std::string::npos) << rw2.err();
  EXPECT_EQ(lines_of(slurp(runs)), (std::vector<std::string>{"plain", "exclusive"}));
}

// A command that exits 0 after the runner forwarded a stop (Ctrl-Z: SIGTSTP becomes SIGTERM
// for the job) ran: its slot is recorded like any other successful run.
TEST_P(CliJobs, OncePerRecordsACommandThatExitedZeroAfterAForwardedStop) {
  const fs::path runs = path("runs"), started = path("started");
  Cli r = Cli::start(run_sh("job", "trap 'exit 0' TERM; touch " + started.string() + "; sleep 30 & wait",
                            {"--once-per", "240000h"}),
                     dir_.path());
  for (int i = 0; i < 3000 && !fs::exists(started); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(fs::exists(started)) << r.err();
  r.signal(SIGTSTP);
  ASSERT_EQ(r.wait(30s), 0) << r.err();
  Cli again = run_appending("job", "again", {"--once-per", "240000h"});
  ASSERT_EQ(again.code(), 0) << again.err();
  EXPECT_NE(again.err().find("already ran"), std::string::npos) << again.err();
  EXPECT_FALSE(fs::exists(runs)) << slurp(runs);
}

// `status` and `list` show the runner's description: host, pid and command.
TEST_P(CliJobs, StatusAndListShowTheHolderDescription) {
  const fs::path ready = path("ready");
  Cli holder =
      Cli::start(run_sh("jobs/report", "echo x > " + ready.string() + "; exec sleep 60"), dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << holder.err();
  Cli other = Cli::start(run_sh("misc", "exec sleep 60"), dir_.path());
  const std::string pid = "pid=" + std::to_string(holder.pid());

  Cli text = Cli::run({"status", "--url", url_, "jobs/report"}, dir_.path());
  EXPECT_EQ(text.code(), 0) << text.err();
  EXPECT_NE(text.out().find("info:    host="), std::string::npos) << text.out();
  EXPECT_NE(text.out().find(pid + " cmd=sh -c echo x >"), std::string::npos) << text.out();

  Cli json = Cli::run({"status", "--url", url_, "--json", "jobs/report"}, dir_.path());
  ASSERT_EQ(json.code(), 0) << json.err();
  const auto j = nlohmann::json::parse(json.out());
  ASSERT_TRUE(j.at("holder_info").is_string()) << json.out();
  EXPECT_NE(j.at("holder_info").get<std::string>().find(pid), std::string::npos);
  EXPECT_EQ(j.at("holder").get<std::string>().find('|'), std::string::npos);

  // Both held: wait (bounded) for the second runner to hold its lock.
  bool both = false;
  nlohmann::json all;
  for (int i = 0; i < 200 && !both; ++i) {
    Cli l = Cli::run({"list", "--url", url_, "--json"}, dir_.path());
    ASSERT_EQ(l.code(), 0) << l.err();
    all = nlohmann::json::parse(l.out());
    both = all.at("locks").size() == 2;
    if (!both) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(both) << all.dump();
  EXPECT_EQ(all.at("truncated"), false);
  EXPECT_EQ(all.at("locks")[0].at("name"), "jobs/report");  // sorted
  EXPECT_EQ(all.at("locks")[0].at("kind"), "lock");
  EXPECT_NE(all.at("locks")[0].at("holder_info").get<std::string>().find(pid), std::string::npos);
  EXPECT_EQ(all.at("locks")[1].at("name"), "misc");
  if (GetParam() == "redis") {
    EXPECT_GT(all.at("locks")[0].at("ttl_ms").get<long>(), 0);
    EXPECT_TRUE(all.at("locks")[0].at("token").is_number());
  }

  Cli prefixed = Cli::run({"list", "--url", url_, "--prefix", "jobs/"}, dir_.path());
  ASSERT_EQ(prefixed.code(), 0) << prefixed.err();
  const auto rows = lines_of(prefixed.out());
  ASSERT_EQ(rows.size(), 2u) << prefixed.out();  // header + one lock
  EXPECT_TRUE(rows[0].starts_with("NAME")) << rows[0];
  EXPECT_TRUE(rows[1].starts_with("jobs/report")) << rows[1];
  EXPECT_NE(rows[1].find(pid), std::string::npos) << rows[1];

  Cli limited = Cli::run({"list", "--url", url_, "--json", "--limit", "1"}, dir_.path());
  ASSERT_EQ(limited.code(), 0) << limited.err();
  const auto lj = nlohmann::json::parse(limited.out());
  EXPECT_EQ(lj.at("locks").size(), 1u);
  EXPECT_EQ(lj.at("truncated"), true);

  holder.signal(SIGTERM);
  other.signal(SIGTERM);
  EXPECT_EQ(holder.wait(20s), 143);
  EXPECT_EQ(other.wait(20s), 143);
  Cli none = Cli::run({"list", "--url", url_}, dir_.path());
  EXPECT_EQ(none.code(), 0) << none.err();
  EXPECT_NE(none.out().find("(no locks held)"), std::string::npos) << none.out();
}

// --permits 2: two jobs run at once, a third is refused; list shows the semaphore.
TEST_P(CliJobs, PermitsRunUpToNJobsAtOnceAndListShowsTheSemaphore) {
  const fs::path a = path("a.ready"), b = path("b.ready");
  Cli first = Cli::start(
      run_sh("pool", "echo $DISTLOCK_PERMIT > " + a.string() + "; exec sleep 60", {"--permits", "2"}),
      dir_.path());
  Cli second = Cli::start(
      run_sh("pool", "echo $DISTLOCK_PERMIT > " + b.string() + "; exec sleep 60", {"--permits", "2"}),
      dir_.path());
  ASSERT_TRUE(wait_for_file(a, 20s)) << first.err();
  ASSERT_TRUE(wait_for_file(b, 20s)) << second.err();
  const auto pa = lines_of(slurp(a)), pb = lines_of(slurp(b));
  ASSERT_EQ(pa.size(), 1u);
  ASSERT_EQ(pb.size(), 1u);
  EXPECT_NE(pa[0], pb[0]);  // two different permits
  Cli third = Cli::run(run_sh("pool", "true", {"--permits", "2", "--no-wait"}), dir_.path());
  EXPECT_EQ(third.code(), 75);
  EXPECT_NE(third.err().find("all 2 permits of semaphore \"pool\" are held"), std::string::npos)
      << third.err();
  Cli other_n = Cli::run(run_sh("pool", "true", {"--permits", "3", "--no-wait"}), dir_.path());
  EXPECT_EQ(other_n.code(), 64) << other_n.err();

  Cli list = Cli::run({"list", "--url", url_, "--json"}, dir_.path());
  ASSERT_EQ(list.code(), 0) << list.err();
  const auto j = nlohmann::json::parse(list.out());
  ASSERT_EQ(j.at("locks").size(), 2u) << list.out();
  for (const auto& l : j.at("locks")) {
    EXPECT_EQ(l.at("kind"), "semaphore");
    EXPECT_EQ(l.at("base"), "pool");
    EXPECT_EQ(l.at("of"), 2);
  }
  ASSERT_EQ(j.at("semaphores").size(), 1u);
  EXPECT_EQ(j.at("semaphores")[0].at("held"), 2);
  EXPECT_EQ(j.at("semaphores")[0].at("permits"), 2);
  Cli text = Cli::run({"list", "--url", url_}, dir_.path());
  EXPECT_NE(text.out().find("semaphore pool: 2/2 permits held"), std::string::npos) << text.out();
  EXPECT_NE(text.out().find("semaphore permit " + pa[0] + " of 2"), std::string::npos) << text.out();

  first.signal(SIGTERM);
  EXPECT_EQ(first.wait(20s), 143);
  Cli fourth = Cli::run(run_sh("pool", "true", {"--permits", "2", "--wait", "10s"}), dir_.path());
  EXPECT_EQ(fourth.code(), 0) << fourth.err();
  second.signal(SIGTERM);
  EXPECT_EQ(second.wait(20s), 143);
}

INSTANTIATE_TEST_SUITE_P(Backends, CliJobs, ::testing::Values("file", "redis"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace distlock::testing
