// Black-box tests of the `distlock` binary on file:// and on a real redis-server
// the test starts itself: mutual exclusion of concurrent runners with increasing
// tokens, --no-wait/--wait, loss after SIGSTOP past the TTL (TERM, then KILL after
// the grace), runner SIGKILLed, signal forwarding, exit statuses, usage errors,
// unreachable servers and `status`.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_fixture.hpp"
#include "cli/cli_harness.hpp"
#include "distlock/client.hpp"
#include "support/cs_log.hpp"
#include "support/eventually.hpp"
#include "support/fault_proxy.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

/// The runner's stderr is exactly one line starting "distlock: " that contains `needle`.
::testing::AssertionResult one_error_line(const std::string& err, const std::string& needle) {
  const auto lines = lines_of(err);
  if (lines.size() != 1 || err.back() != '\n') {
    return ::testing::AssertionFailure() << "expected one line on stderr, got:\n" << err;
  }
  if (!lines[0].starts_with("distlock: ")) {
    return ::testing::AssertionFailure() << "stderr line lacks the \"distlock: \" prefix: " << lines[0];
  }
  if (lines[0].find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "stderr line does not mention \"" << needle << "\": " << lines[0];
  }
  return ::testing::AssertionSuccess();
}

class CliTest : public distlock::testing::FileOrRedisCliTest {
 protected:
  CliTest() : FileOrRedisCliTest("distlock-cli") {}

  /// A runner SIGKILLed by start_and_kill_runner: the process of its job it was killed
  /// under, and when the runner ended (this process's steady clock).
  struct KilledRunner {
    pid_t pid = 0;
    std::chrono::steady_clock::time_point ended_at;
  };

  /// Starts `distlock run --ttl 2s NAME -- sh -c SCRIPT`, where SCRIPT writes a pid to
  /// `pid_file`; once that process is seen alive, SIGKILLs the runner, which must die of it.
  void start_and_kill_runner(const std::string& name, const std::string& script, const fs::path& pid_file,
                             KilledRunner& killed) {
    Cli r = Cli::start(run_sh(name, script, {"--ttl", "2s"}), dir_.path());
    ASSERT_TRUE(wait_for_file(pid_file, 20s)) << r.err();
    killed.pid = std::stoi(slurp(pid_file));
    ASSERT_TRUE(process_alive(killed.pid));
    r.signal(SIGKILL);
    ASSERT_EQ(r.wait(10s), 128 + SIGKILL);
    killed.ended_at = r.ended_at();
  }
};

/// Whether process `pid` is gone within 5 s (this process's steady clock).
bool gone_within_5s(pid_t pid) {
  return eventually([&] { return !process_alive(pid); }, 5s);
}

// 8 runners on one name; each command records its critical section (start, end,
// $DISTLOCK_TOKEN) as one line in the cs_log format: pid tid token start_ns end_ns owned.
TEST_P(CliTest, ConcurrentRunnersNeverOverlapAndTokensIncrease) {
  const fs::path log = path("sections.log");
  const std::string script =
      "s=$(date +%s%N); sleep 0.05; e=$(date +%s%N); echo \"$$ 0 $DISTLOCK_TOKEN $s $e 1\" >> " +
      log.string();
  std::vector<Cli> runners;
  for (int i = 0; i < 8; ++i)
    runners.push_back(Cli::start(run_sh("cs", script, {"--ttl", "5s"}), dir_.path()));
  for (auto& r : runners) {
    ASSERT_EQ(r.wait(60s), 0) << r.err();
    EXPECT_EQ(r.err(), "");
  }
  const auto sections = read_sections(log.string());
  ASSERT_EQ(sections.size(), 8u) << slurp(log);
  EXPECT_TRUE(no_overlap(sections));
  EXPECT_TRUE(tokens_increase(sections));
}

TEST_P(CliTest, ChildEnvironmentNamesLockTokenAndUrl) {
  Cli r = Cli::run(run_sh("env-lock", "echo \"$DISTLOCK_NAME|${DISTLOCK_TOKEN-absent}|$DISTLOCK_URL\""),
                   dir_.path(), 20s, {"DISTLOCK_TOKEN=999999", "DISTLOCK_NAME=outer"});
  ASSERT_EQ(r.code(), 0) << r.err();
  const auto fields = lines_of(r.out());
  ASSERT_EQ(fields.size(), 1u) << r.out();
  const std::string expected_prefix = "env-lock|";
  EXPECT_TRUE(fields[0].starts_with(expected_prefix)) << fields[0];
  const std::string token =
      fields[0].substr(expected_prefix.size(), fields[0].rfind('|') - expected_prefix.size());
  EXPECT_NE(token, "absent");
  EXPECT_NE(token, "999999") << "an outer runner's token leaked into the command";
  EXPECT_GT(std::stoull(token), 0u);
  EXPECT_EQ(fields[0].substr(fields[0].rfind('|') + 1), url_);
}

TEST_P(CliTest, CommandSeesOnlyStandardDescriptors) {
  // The runner's sockets and lock files must not leak into the command; a
  // descriptor the runner inherited (here 7) is passed on as flock(1) does.
  Cli r = Cli::run(
      {"run", "--url", url_, "fds", "--", "sh", "-c",
       "exec 7>/dev/null; exec " DISTLOCK_CLI_PATH " run --url " + url_ + " fds-inner -- ls /proc/self/fd"},
      dir_.path());
  ASSERT_EQ(r.code(), 0) << r.err();
  auto fds = lines_of(r.out());
  std::sort(fds.begin(), fds.end());
  // 0 1 2, the inherited 7, and the descriptor ls opened on /proc/self/fd itself.
  ASSERT_EQ(fds.size(), 5u) << r.out();
  EXPECT_EQ(fds[0], "0");
  EXPECT_EQ(fds[1], "1");
  EXPECT_EQ(fds[2], "2");
  EXPECT_NE(std::find(fds.begin(), fds.end(), "7"), fds.end()) << r.out();
}

TEST_P(CliTest, NoWaitWhileHeldExits75AtOnceAndWaitGivesUpAfterItsDeadline) {
  const fs::path ready = path("holder.ready");
  Cli holder = Cli::start(run_sh("busy", "echo up > " + ready.string() + "; exec sleep 60"), dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << holder.err();

  Cli no_wait = Cli::run({"run", "--url", url_, "--no-wait", "busy", "--", "true"}, dir_.path());
  EXPECT_EQ(no_wait.code(), 75);
  EXPECT_LT(no_wait.elapsed(), 5s);
  EXPECT_TRUE(one_error_line(no_wait.err(), "held by another owner"));

  Cli wait1 = Cli::run({"run", "--url", url_, "--wait", "1s", "busy", "--", "true"}, dir_.path());
  EXPECT_EQ(wait1.code(), 75);
  EXPECT_GE(wait1.elapsed(), 900ms);
  EXPECT_LT(wait1.elapsed(), 8s);
  EXPECT_TRUE(one_error_line(wait1.err(), "not acquired within --wait 1s"));

  // The holder's command ends by the forwarded SIGTERM: 128+15.
  holder.signal(SIGTERM);
  EXPECT_EQ(holder.wait(20s), 143) << holder.err();
  EXPECT_EQ(holder.err(), "");
  // Released: the next attempt gets it at once.
  Cli after = Cli::run({"run", "--url", url_, "--no-wait", "busy", "--", "true"}, dir_.path());
  EXPECT_EQ(after.code(), 0) << after.err();
}

TEST_P(CliTest, ExitStatusesPassThrough) {
  EXPECT_EQ(Cli::run(run_sh("st", "exit 0"), dir_.path()).code(), 0);
  EXPECT_EQ(Cli::run(run_sh("st", "exit 3"), dir_.path()).code(), 3);
  EXPECT_EQ(Cli::run(run_sh("st", "exit 42"), dir_.path()).code(), 42);
  EXPECT_EQ(Cli::run(run_sh("st", "kill -USR1 $$"), dir_.path()).code(), 128 + SIGUSR1);
  EXPECT_EQ(Cli::run(run_sh("st", "kill -KILL $$"), dir_.path()).code(), 128 + SIGKILL);
  Cli missing = Cli::run({"run", "--url", url_, "st", "--", "/nonexistent/program"}, dir_.path());
  EXPECT_EQ(missing.code(), 127);
  EXPECT_TRUE(one_error_line(missing.err(), "/nonexistent/program"));
  // Not executable: 126. And the lock was released after each of these.
  const fs::path plain = path("not-executable");
  { std::ofstream(plain) << "echo should not run\n"; }
  fs::permissions(plain, fs::perms::owner_read | fs::perms::owner_write);
  Cli not_exec = Cli::run({"run", "--url", url_, "st", "--", plain.string()}, dir_.path());
  EXPECT_EQ(not_exec.code(), 126);
  EXPECT_TRUE(one_error_line(not_exec.err(), "cannot run"));
  EXPECT_EQ(Cli::run({"run", "--url", url_, "--no-wait", "st", "--", "true"}, dir_.path()).code(), 0);
}

TEST_P(CliTest, SignalsAreForwardedToTheCommand) {
  // Every signal that would end the runner by default reaches the command instead:
  // a runner killed by USR1 would free the lock while its command still ran.
  const std::vector<std::pair<int, std::string>> signals = {
      {SIGINT, "INT"},   {SIGTERM, "TERM"}, {SIGHUP, "HUP"},   {SIGUSR1, "USR1"},
      {SIGUSR2, "USR2"}, {SIGQUIT, "QUIT"}, {SIGALRM, "ALRM"}, {SIGPWR, "PWR"}};
  for (const auto& [sig, sig_name] : signals) {
    const fs::path ready = path("fwd-" + sig_name + ".ready");
    const fs::path got = path("fwd-" + sig_name + ".got");
    const std::string script = "trap 'echo " + sig_name + " > " + got.string() + "; exit 7' " + sig_name +
                               "; echo up > " + ready.string() + "; while :; do sleep 0.05; done";
    Cli r = Cli::start(run_sh("fwd", script), dir_.path());
    ASSERT_TRUE(wait_for_file(ready, 20s)) << r.err();
    r.signal(sig);
    EXPECT_EQ(r.wait(20s), 7) << sig_name << ": " << r.err();
    EXPECT_EQ(slurp(got), sig_name + "\n");
    // (The shell may report its killed `sleep`; the runner itself says nothing.)
    EXPECT_EQ(r.err().find("distlock:"), std::string::npos) << r.err();
  }
}

TEST_P(CliTest, RunnerKilledTakesItsCommandAlongAndFreesTheLock) {
  const fs::path pid_file = path("victim.pid");
  KilledRunner runner;
  ASSERT_NO_FATAL_FAILURE(start_and_kill_runner(
      "victim", "echo $$ > " + pid_file.string() + "; exec sleep 60", pid_file, runner));
  EXPECT_TRUE(gone_within_5s(runner.pid)) << "the command outlived its runner";

  if (redis()) {
    // Free once the 2 s TTL runs out: within ttl + 1 s of the kill. Watched from
    // this process, so a slow start of another runner does not blur the figure.
    auto client = distlock::connect(url_);
    std::error_code ec;
    while (client.status("victim", ec).held && !ec &&
           std::chrono::steady_clock::now() - runner.ended_at < 10s) {
      std::this_thread::sleep_for(20ms);
    }
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_LT(std::chrono::steady_clock::now() - runner.ended_at, 3s);
  }
  // Free (on file:// at once: the kernel dropped the lock with the runner's descriptors).
  Cli next = Cli::run({"run", "--url", url_, "--no-wait", "victim", "--", "true"}, dir_.path());
  EXPECT_EQ(next.code(), 0) << next.err();
}

// `sh -c '(work) & exit 0'`: the lock is held until the backgrounded work has
// exited too, not only the command's first process; --leader-only releases it
// when the first process exits and leaves the rest running.
TEST_P(CliTest, BackgroundedWorkKeepsTheLockUntilItExits) {
  const fs::path ready = path("bg.ready"), go = path("bg.go"), done = path("bg.done");
  const std::string script = "(while [ ! -e " + go.string() + " ]; do sleep 0.02; done; echo done > " +
                             done.string() + ") & echo up > " + ready.string() + "; exit 0";
  Cli a = Cli::start(run_sh("bg", script), dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << a.err();
  Cli b = Cli::run({"run", "--url", url_, "--no-wait", "bg", "--", "true"}, dir_.path());
  EXPECT_EQ(b.code(), 75) << "a second runner got the lock while the first job's work still ran";
  EXPECT_TRUE(a.running()) << "the runner exited (" << a.code() << ") while its job's work still ran";
  { std::ofstream(go) << "go\n"; }
  EXPECT_EQ(a.wait(20s), 0) << a.err();
  EXPECT_EQ(slurp(done), "done\n") << "the runner exited before the backgrounded work finished";
  EXPECT_EQ(a.err(), "");
}

TEST_P(CliTest, LeaderOnlyReleasesWhenTheFirstProcessExits) {
  const fs::path ready = path("lo.ready"), go = path("lo.go"), done = path("lo.done");
  const std::string script = "(while [ ! -e " + go.string() + " ]; do sleep 0.02; done; echo done > " +
                             done.string() + ") & echo up > " + ready.string() + "; exit 0";
  Cli a = Cli::run(run_sh("lo", script, {"--leader-only"}), dir_.path());
  EXPECT_EQ(a.code(), 0) << a.err();
  ASSERT_TRUE(wait_for_file(ready, 1s));
  Cli b = Cli::run({"run", "--url", url_, "--no-wait", "lo", "--", "true"}, dir_.path());
  EXPECT_EQ(b.code(), 0) << b.err();
  // The daemon-like rest was left running, not killed with the runner.
  { std::ofstream(go) << "go\n"; }
  EXPECT_TRUE(wait_for_file(done, 20s)) << "the backgrounded work was killed";
}

// The runner SIGKILLed: every process of its job dies with it, not only the first
// one (a parent-death signal reaches only that one).
TEST_P(CliTest, RunnerKilledTakesTheWholeJobAlong) {
  const fs::path pid_file = path("tree.pid");
  KilledRunner runner;
  ASSERT_NO_FATAL_FAILURE(start_and_kill_runner(
      "tree", "sleep 60 & echo $! > " + pid_file.string() + "; wait", pid_file, runner));
  const bool survived = !gone_within_5s(runner.pid);
  if (survived) ::kill(runner.pid, SIGKILL);
  EXPECT_FALSE(survived) << "the job's backgrounded process outlived its SIGKILLed runner";
}

TEST_P(CliTest, StatusReportsHeldAndFree) {
  const fs::path ready = path("status.ready");
  Cli holder = Cli::start(run_sh("inspect", "echo $DISTLOCK_TOKEN > " + ready.string() + "; exec sleep 60"),
                          dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << holder.err();
  const std::string token = lines_of(slurp(ready)).at(0);

  Cli text = Cli::run({"status", "--url", url_, "inspect"}, dir_.path());
  EXPECT_EQ(text.code(), 0) << text.err();
  EXPECT_NE(text.out().find("held:    yes\n"), std::string::npos) << text.out();
  EXPECT_NE(text.out().find("token:   " + token + "\n"), std::string::npos) << text.out();
  EXPECT_NE(text.out().find("waiters: "), std::string::npos) << text.out();

  Cli json = Cli::run({"status", "--url", url_, "--json", "inspect"}, dir_.path());
  EXPECT_EQ(json.code(), 0) << json.err();
  const auto j = nlohmann::json::parse(json.out());
  EXPECT_EQ(j.at("name"), "inspect");
  EXPECT_EQ(j.at("held"), true);
  EXPECT_EQ(j.at("token").get<std::uint64_t>(), std::stoull(token));
  EXPECT_TRUE(j.contains("ttl_ms") && j.contains("holder") && j.contains("waiters")) << json.out();
  if (redis()) {
    EXPECT_GT(j.at("ttl_ms").get<long>(), 0);
    EXPECT_LE(j.at("ttl_ms").get<long>(), 30000);
    EXPECT_TRUE(j.at("holder").is_string());
  }

  holder.signal(SIGTERM);
  ASSERT_EQ(holder.wait(20s), 143);
  Cli free_text = Cli::run({"status", "--url", url_, "inspect"}, dir_.path());
  EXPECT_EQ(free_text.code(), 3) << free_text.err();
  EXPECT_NE(free_text.out().find("held:    no\n"), std::string::npos) << free_text.out();
  Cli free_json = Cli::run({"status", "--url", url_, "--json", "inspect"}, dir_.path());
  EXPECT_EQ(free_json.code(), 3);
  EXPECT_EQ(nlohmann::json::parse(free_json.out()).at("held"), false);
}

INSTANTIATE_TEST_SUITE_P(Backends, CliTest, ::testing::Values("file", "redis"),
                         [](const auto& param_info) { return param_info.param; });

// A runner SIGSTOPped past its TTL loses the lock to another runner (larger token).
// On SIGCONT it must see the loss from its local deadline before anything else —
// even with a SIGTERM pending for it. The lock is already somebody else's then, so
// there is no grace left to give: the whole job gets SIGKILL at once, and the
// runner exits 76.
TEST(CliRedis, RunnerStoppedPastItsTtlKillsItsCommandAndExits76) {
  TempDir dir("distlock-cli");
  RedisServer redis;
  const fs::path a_ready = dir.path() / "a.ready", b_ready = dir.path() / "b.ready";
  Cli a = Cli::start(
      {"run", "--url", redis.url(), "--ttl", "2s", "--grace", "1s", "paused", "--", "sh", "-c",
       "exec 2>/dev/null; trap 'echo TERM >> " + (dir.path() / "a.term").string() +
           "' TERM; echo \"$$ $DISTLOCK_TOKEN\" > " + a_ready.string() + "; while :; do sleep 0.05; done"},
      dir.path());
  ASSERT_TRUE(wait_for_file(a_ready, 20s)) << a.err();
  const auto a_fields = lines_of(slurp(a_ready)).at(0);
  const pid_t a_child = std::stoi(a_fields.substr(0, a_fields.find(' ')));
  const std::uint64_t a_token = std::stoull(a_fields.substr(a_fields.find(' ') + 1));

  a.signal(SIGSTOP);
  Cli b = Cli::start({"run", "--url", redis.url(), "--wait", "20s", "paused", "--", "sh", "-c",
                      "echo $DISTLOCK_TOKEN > " + b_ready.string() + "; sleep 2"},
                     dir.path());
  ASSERT_TRUE(wait_for_file(b_ready, 20s)) << b.err();
  const std::uint64_t b_token = std::stoull(slurp(b_ready));
  EXPECT_GT(b_token, a_token);

  a.signal(SIGTERM);  // pending while stopped: must not be acted on before the loss
  a.signal(SIGCONT);
  EXPECT_EQ(a.wait(20s), 76) << a.err();
  EXPECT_TRUE(one_error_line(a.err(), "lost while the command ran"));
  EXPECT_NE(a.err().find("SIGKILL"), std::string::npos) << a.err();
  EXPECT_FALSE(process_alive(a_child));
  // No SIGTERM (and so no trap) first: a grace after the loss would be unprotected time.
  EXPECT_EQ(slurp(dir.path() / "a.term"), "") << "the command got SIGTERM after the lock was gone";

  // The new holder was not disturbed and releases normally.
  EXPECT_EQ(b.wait(20s), 0) << b.err();
}

// The server frozen: no renewal succeeds. With --grace left before the local
// deadline the whole job gets SIGTERM; a well-behaved command exits within it, so
// no SIGKILL is needed, and the runner exits 76 without touching the server.
TEST(CliRedis, RenewalsFailingTerminateTheCommandWithinGraceBeforeTheDeadline) {
  TempDir dir("distlock-cli");
  RedisServer redis;
  const fs::path ready = dir.path() / "ready";
  Cli a = Cli::start({"run", "--url", redis.url(), "--ttl", "1s", "--grace", "500ms", "dropped", "--", "sh",
                      "-c", "echo up > " + ready.string() + "; exec sleep 60"},
                     dir.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << a.err();
  redis.pause();
  const int code = a.wait(20s);
  redis.resume();
  EXPECT_EQ(code, 76) << a.err();
  EXPECT_TRUE(one_error_line(a.err(), "SIGTERM"));
  EXPECT_EQ(a.err().find("SIGKILL"), std::string::npos) << a.err();
}

// Two jobs each wrote `date +%s%N` lines to their log: every line of the first
// must come before the second job's single line (the lock never covered both).
::testing::AssertionResult first_job_ended_before_the_next_began(const fs::path& a_log,
                                                                 const fs::path& b_log) {
  const auto a_lines = lines_of(slurp(a_log));
  const auto b_lines = lines_of(slurp(b_log));
  if (a_lines.empty()) return ::testing::AssertionFailure() << "the first job wrote nothing";
  if (b_lines.size() != 1u) return ::testing::AssertionFailure() << "the next job wrote: " << slurp(b_log);
  long long a_last = 0;
  for (const auto& l : a_lines) {
    if (!l.empty()) a_last = std::max(a_last, std::stoll(l));
  }
  const long long b_first = std::stoll(b_lines[0]);
  if (a_last >= b_first) {
    return ::testing::AssertionFailure() << "the first job wrote " << (a_last - b_first) / 1000000
                                         << " ms after the next holder's job had started";
  }
  std::cout << "[ measured ] the first job's last write came " << (b_first - a_last) / 1000000
            << " ms before the next job's first\n";
  return ::testing::AssertionSuccess();
}

// Issue: the job outlived the lock. The holder's connection frozen (a proxy stops
// moving bytes; the server itself still answers others): the server hands the lock
// on once the TTL has run out after the last renewal it saw, and the next holder's
// job starts. The first job ignores SIGTERM and writes a wall-clock timestamp every
// 10 ms; all of its writes must come before the next job's first one.
TEST(CliRedis, JobIsDeadBeforeTheServerCanHandTheLockOn) {
  TempDir dir("distlock-cli");
  RedisServer redis;
  distlock::testing::FaultProxy proxy(redis.port());
  const fs::path a_log = dir.path() / "a.log", b_log = dir.path() / "b.log";
  const std::string a_url = "redis://127.0.0.1:" + std::to_string(proxy.port());
  Cli a = Cli::start({"run", "--url", a_url, "--ttl", "5s", "frozen", "--", "sh", "-c",
                      "trap '' TERM; while :; do date +%s%N >> " + a_log.string() + "; sleep 0.01; done"},
                     dir.path());
  ASSERT_TRUE(wait_for_file(a_log, 20s)) << a.err();
  proxy.freeze();
  Cli b = Cli::start({"run", "--url", redis.url(), "--wait", "30s", "frozen", "--", "sh", "-c",
                      "date +%s%N >> " + b_log.string()},
                     dir.path());
  EXPECT_EQ(b.wait(40s), 0) << b.err();
  const int a_code = a.wait(20s);
  proxy.pass();
  EXPECT_EQ(a_code, 76) << a.err();
  EXPECT_TRUE(first_job_ended_before_the_next_began(a_log, b_log));
}

// SIGTSTP and SIGTTIN are catchable: unlike SIGSTOP they must not pause the runner
// (a paused runner renews nothing while its job runs on past the hand-over). They go
// to the job like every other signal; a job stopped for them is ended (SIGTERM,
// SIGKILL after --grace) and the lock released. The job ignores SIGTERM and writes a
// wall-clock timestamp every 10 ms; all of its writes must come before the next
// holder's job's first one.
TEST(CliRedis, StopSignalsSentToTheRunnerNeverLeaveItsJobRunningUnprotected) {
  TempDir dir("distlock-cli");
  RedisServer redis;
  const fs::path a_log = dir.path() / "a.log", b_log = dir.path() / "b.log";
  Cli a = Cli::start({"run", "--url", redis.url(), "--ttl", "2s", "tstp", "--", "sh", "-c",
                      "trap '' TERM; while :; do date +%s%N >> " + a_log.string() + "; sleep 0.01; done"},
                     dir.path());
  ASSERT_TRUE(wait_for_file(a_log, 20s)) << a.err();
  a.signal(SIGTSTP);
  Cli b = Cli::start({"run", "--url", redis.url(), "--wait", "30s", "tstp", "--", "sh", "-c",
                      "date +%s%N >> " + b_log.string()},
                     dir.path());
  EXPECT_EQ(b.wait(40s), 0) << b.err();
  a.signal(SIGCONT);  // a runner that did stop must end now (it finds its lease gone)
  const int a_code = a.wait(20s);
  EXPECT_NE(a_code, 0) << a.err();
  EXPECT_TRUE(first_job_ended_before_the_next_began(a_log, b_log))
      << "runner exit " << a_code << ": " << a.err();
}

// A forwarded SIGTSTP may stop a process of the job that is not the runner's child
// while the runner's child does not stop (dash runs a command through vfork(): a stop
// that reaches the new process before its exec leaves it stopped and the shell
// waiting in vfork() for ever, in state D, not T). Here the shell catches SIGTSTP
// (so it never stops) and waits for its stopped `sleep`: no stop of the runner's
// child is ever reported, yet the job is stuck while holding the lock. The forwarded
// stop itself must end the job (SIGTERM with SIGCONT, SIGKILL after --grace).
TEST(CliFile, ForwardedStopEndsTheJobEvenIfOnlyAGrandchildStops) {
  TempDir dir("distlock-cli");
  const std::string url = "file://" + (dir.path() / "locks").string();
  const fs::path ready = dir.path() / "ready";
  Cli a = Cli::start(
      {"run", "--url", url, "--ttl", "4s", "--grace", "500ms", "gc-stop", "--", "sh", "-c",
       "trap '' TERM; trap ':' TSTP; echo $$ > " + ready.string() + "; while :; do sleep 0.05; done"},
      dir.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << a.err();
  const pid_t shell = std::stoi(slurp(ready));
  a.signal(SIGTSTP);
  const int code = a.wait(20s);
  EXPECT_NE(code, -1) << "the runner kept the lock with its job stuck behind a stopped grandchild";
  EXPECT_NE(code, 0) << a.err();
  EXPECT_TRUE(one_error_line(a.err(), "SIGTSTP")) << a.err();
  EXPECT_FALSE(process_alive(shell));
  Cli next = Cli::run({"run", "--url", url, "--no-wait", "gc-stop", "--", "true"}, dir.path());
  EXPECT_EQ(next.code(), 0) << next.err();
}

// file://: a lock file removed from outside is a loss the next holder can act on at
// once (no TTL to wait out), so the whole job gets SIGKILL at once, not a grace.
TEST(CliFile, LockFileRemovedKillsTheJobAtOnce) {
  TempDir dir("distlock-cli");
  const fs::path locks = dir.path() / "locks", ready = dir.path() / "ready";
  const std::string url = "file://" + locks.string();
  Cli a = Cli::start({"run", "--url", url, "--ttl", "60s", "--grace", "10s", "removed", "--", "sh", "-c",
                      "trap '' TERM; echo $$ > " + ready.string() + "; while :; do sleep 0.05; done"},
                     dir.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << a.err();
  const pid_t job = std::stoi(slurp(ready));
  int removed = 0;
  for (const auto& e : fs::directory_iterator(locks)) {
    if (e.is_regular_file()) removed += fs::remove(e.path()) ? 1 : 0;
  }
  ASSERT_GE(removed, 1);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(a.wait(20s), 76) << a.err();
  // Far below the 10 s grace that would have been given before (generous for a busy machine).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_FALSE(process_alive(job));
  EXPECT_NE(a.err().find("SIGKILL"), std::string::npos) << a.err();
}

// Process groups: the command always leads a group of its own (so a loss or a
// forwarded signal reaches the whole job, never the runner's caller). Under a
// terminal whose foreground the runner is in, that group becomes the terminal's
// foreground group for the job's life (Ctrl-C and job control reach the whole job).
TEST(CliProcessGroup, OwnGroupAndUnderATerminalTheForegroundGroup) {
  TempDir dir("distlock-cli");
  const std::string url = "file://" + (dir.path() / "locks").string();
  // Fields 5 and 8 of /proc/PID/stat: process group and terminal foreground group.
  const std::string report = "read -r a b c d e f g h i < /proc/$$/stat; echo \"pid=$$ pgrp=$e tpgid=$h\"";
  auto field = [](const std::string& text, const std::string& key) {
    const auto p = text.find(key + "=");
    return p == std::string::npos ? -100L : std::stol(text.substr(p + key.size() + 1));
  };
  Cli plain = Cli::run({"run", "--url", url, "pg", "--", "sh", "-c", report}, dir.path());
  ASSERT_EQ(plain.code(), 0) << plain.err();
  // A group of its own (led by the job's watchdog), not the runner's.
  EXPECT_GT(field(plain.out(), "pgrp"), 0) << plain.out();
  EXPECT_NE(field(plain.out(), "pgrp"), plain.pid()) << plain.out();

  ASSERT_TRUE(have_program("script")) << "script(1) from util-linux is needed to run under a terminal";
  // script(1) gives the runner a pseudo-terminal with the runner in its foreground.
  const std::string inner =
      std::string(DISTLOCK_CLI_PATH) + " run --url " + url + " pg -- sh -c '" + report + "'";
  Process terminal = Process::spawn({"script", "-qec", inner, (dir.path() / "typescript").string()},
                                    (dir.path() / "tty.out").string());
  ASSERT_TRUE(wait_for_file(dir.path() / "tty.out", 20s));
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (slurp(dir.path() / "tty.out").find("tpgid=") == std::string::npos &&
         std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(terminal.wait_for(20s), 0);
  const std::string out = slurp(dir.path() / "tty.out");
  ASSERT_GT(field(out, "pid"), 0) << out;
  EXPECT_EQ(field(out, "pgrp"), field(out, "tpgid"))
      << "the job's group is not the terminal's foreground: " << out;
  EXPECT_NE(field(out, "pid"), field(out, "pgrp")) << "the job's group is led by its watchdog: " << out;
}

// A runner started in the background of a terminal (job control on): its command
// reads the terminal, is stopped by SIGTTIN and would hold the lock forever. The
// runner sees the stop, ends the job (SIGTERM with SIGCONT) and releases the lock.
TEST(CliProcessGroup, JobStoppedForTerminalInputIsEndedAndTheLockReleased) {
  TempDir dir("distlock-cli");
  const std::string url = "file://" + (dir.path() / "locks").string();
  ASSERT_TRUE(have_program("script")) << "script(1) from util-linux is needed to run under a terminal";
  const fs::path rc = dir.path() / "rc", err = dir.path() / "err";
  // `set -m`: the shell puts the background runner in a group of its own, not the
  // terminal's foreground.
  const std::string inner = "sh -c 'set -m; " + std::string(DISTLOCK_CLI_PATH) + " run --url " + url +
                            " ttin -- sh -c \"read x < /dev/tty\" 2>" + err.string() +
                            " & wait $!; echo $? > " + rc.string() + "'";
  Process terminal = Process::spawn({"script", "-qec", inner, (dir.path() / "typescript").string()},
                                    (dir.path() / "tty.out").string());
  ASSERT_TRUE(wait_for_file(rc, 20s)) << "the runner hung with its job stopped by SIGTTIN";
  EXPECT_EQ(slurp(rc), "143\n") << slurp(err);
  EXPECT_TRUE(one_error_line(slurp(err), "SIGTTIN")) << slurp(err);
  Cli next = Cli::run({"run", "--url", url, "--no-wait", "ttin", "--", "true"}, dir.path());
  EXPECT_EQ(next.code(), 0) << next.err();
  EXPECT_EQ(terminal.wait_for(20s), 0);
}

TEST(CliUsage, BadFlagsUrlsAndDurationsExit64WithOneClearLine) {
  TempDir dir("distlock-cli");
  const std::string url = "file://" + (dir.path() / "locks").string();
  struct Case {
    std::vector<std::string> args;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {{"run", "--url", url, "--ttl", "abc", "job", "--", "true"}, "--ttl \"abc\""},
      {{"run", "--url", url, "--ttl", "10", "job", "--", "true"}, "below the minimum"},
      {{"run", "--url", url, "--wait", "5parsecs", "job", "--", "true"}, "--wait \"5parsecs\""},
      {{"run", "--url", url, "--grace", "1x", "job", "--", "true"}, "--grace \"1x\""},
      {{"run", "--url", url, "--grace", "10s", "--ttl", "5s", "job", "--", "true"}, "too long for --ttl"},
      {{"run", "--url", url, "--wait", "1s", "--no-wait", "job", "--", "true"}, "--no-wait"},
      {{"run", "--url", url, "--bogus", "job", "--", "true"}, "--bogus"},
      // Issue 27, item 8: 0 ran the job under the plain lock beside the permit holders.
      {{"run", "--url", url, "--permits", "0", "job", "--", "true"}, "--permits 0 is out of range 1.."},
      {{"run", "--url", url, "--permits", "-1", "job", "--", "true"}, "--permits -1 is out of range 1.."},
      {{"run", "--url", url, "job"}, "no command"},
      {{"run", "--url", url, "job", "--"}, "no command"},
      {{"run", "--url", url, "", "--", "true"}, "lock name is empty"},
      {{"run", "--url", url, "--", "true"}, "NAME"},
      {{"run", "--url", "nope", "job", "--", "true"}, "nope"},
      {{"run", "--url", "redis://127.0.0.1:99999", "job", "--", "true"}, "99999"},
      {{"run", "--url", "gopher://127.0.0.1:70", "job", "--", "true"}, "gopher"},
      {{"run", "--url", "redis://127.0.0.1:6379?timeout=soon", "job", "--", "true"}, "soon"},
      {{"status", "--url", url}, "NAME"},
      {{"status", "--url", "file://relative/dir", "job"}, "file://relative/dir"},
      {{"status", "--bogus", "job"}, "--bogus"},
      {{"frobnicate"}, "frobnicate"},
      {{}, "subcommand"},
  };
  for (const auto& c : cases) {
    Cli r = Cli::run(c.args, dir.path());
    std::string joined;
    for (const auto& a : c.args) joined += " " + a;
    EXPECT_EQ(r.code(), 64) << "distlock" << joined << "\n" << r.err();
    EXPECT_TRUE(one_error_line(r.err(), c.mentions)) << "distlock" << joined;
    EXPECT_EQ(r.out(), "") << "distlock" << joined;
  }
}

TEST(CliUsage, HelpAndVersion) {
  TempDir dir("distlock-cli");
  Cli help = Cli::run({"--help"}, dir.path());
  EXPECT_EQ(help.code(), 0);
  EXPECT_NE(help.out().find("run"), std::string::npos);
  EXPECT_NE(help.out().find("status"), std::string::npos);
  Cli run_help = Cli::run({"run", "--help"}, dir.path());
  EXPECT_EQ(run_help.code(), 0);
  EXPECT_NE(run_help.out().find("Usage: distlock run [--url URL] [--ttl DUR] [--wait DUR | --no-wait] "
                                "[--grace DUR] [--leader-only] [--max-hold DUR] [--min-hold DUR] "
                                "[--once-per DUR] [--permits N] NAME -- COMMAND"),
            std::string::npos)
      << run_help.out();
  EXPECT_NE(run_help.out().find("distlock run --shards M [--per-shard | --on-change hup|restart]"),
            std::string::npos)
      << run_help.out();
  for (const char* section : {"EXIT STATUS", "ENVIRONMENT", "EXAMPLES", "SHARDS", "DISTLOCK_TOKEN",
                              "DISTLOCK_SHARDS", "76", "75", "69", "64"}) {
    EXPECT_NE(run_help.out().find(section), std::string::npos) << section;
  }
  Cli status_help = Cli::run({"status", "--help"}, dir.path());
  EXPECT_EQ(status_help.code(), 0);
  EXPECT_NE(status_help.out().find("Usage: distlock status [--url URL] [--json] [--shards] NAME"),
            std::string::npos);
  Cli version = Cli::run({"--version"}, dir.path());
  EXPECT_EQ(version.code(), 0);
  EXPECT_TRUE(version.out().starts_with("distlock ")) << version.out();
}

// `distlock urls` prints the table connect() enforces; a key it does not list is a usage error.
TEST(CliUsage, UrlsListsEverySchemeItsKeysAndNothingElseIsAccepted) {
  TempDir dir("distlock-cli");
  Cli urls = Cli::run({"urls"}, dir.path());
  EXPECT_EQ(urls.code(), 0) << urls.err();
  for (const char* part :
       {"file:///absolute/dir", "?recheck=duration", "?sync=true|false", "?timeout=duration"}) {
    EXPECT_NE(urls.out().find(part), std::string::npos) << part << "\n" << urls.out();
  }
  Cli help = Cli::run({"--help"}, dir.path());
  EXPECT_NE(help.out().find("file:///absolute/dir"), std::string::npos) << help.out();
  EXPECT_NE(help.out().find("'distlock urls'"), std::string::npos) << help.out();
  const std::string url = "file://" + (dir.path() / "locks").string();
  Cli bad = Cli::run({"status", "--url", url + "?recheck=1s&syncc=1", "job"}, dir.path());
  EXPECT_EQ(bad.code(), 64);
  EXPECT_TRUE(one_error_line(bad.err(), "unknown query parameter \"syncc\"")) << bad.err();
  EXPECT_NE(bad.err().find("file:// knows recheck, sync, timeout"), std::string::npos) << bad.err();
  Cli good = Cli::run({"status", "--url", url + "?recheck=1s&sync=yes", "job"}, dir.path());
  EXPECT_EQ(good.code(), 3) << good.err();  // free
}

TEST(CliUnreachable, RunAndStatusExit69WithOneLine) {
  TempDir dir("distlock-cli");
  const std::string url = "redis://127.0.0.1:" + std::to_string(free_port()) + "?timeout=500ms";
  Cli run = Cli::run({"run", "--url", url, "job", "--", "true"}, dir.path());
  EXPECT_EQ(run.code(), 69);
  EXPECT_TRUE(one_error_line(run.err(), "127.0.0.1"));
  Cli status = Cli::run({"status", "--url", url, "job"}, dir.path());
  EXPECT_EQ(status.code(), 69);
  EXPECT_TRUE(one_error_line(status.err(), "127.0.0.1"));
  EXPECT_EQ(status.out(), "");
  // The URL also comes from $DISTLOCK_URL.
  Cli env = Cli::run({"run", "job", "--", "true"}, dir.path(), 20s, {"DISTLOCK_URL=" + url});
  EXPECT_EQ(env.code(), 69);
}

TEST(CliRedis, WrongPasswordExits69) {
  TempDir dir("distlock-cli");
  RedisServer redis({.password = "right"});
  const std::string url = "redis://:wrong@127.0.0.1:" + std::to_string(redis.port());
  Cli run = Cli::run({"run", "--url", url, "job", "--", "true"}, dir.path());
  EXPECT_EQ(run.code(), 69);
  EXPECT_EQ(lines_of(run.err()).size(), 1u) << run.err();
  EXPECT_EQ(run.err().find("wrong"), std::string::npos) << "password printed: " << run.err();
}

// The password can come from $DISTLOCK_PASSWORD or --password-file instead of the
// command line (where ps shows it); the command's DISTLOCK_URL carries no password
// unless --pass-url-password asks for it; no error line ever shows it.
TEST(CliRedis, PasswordFromEnvironmentOrFileAndNotInTheChildUrl) {
  TempDir dir("distlock-cli");
  RedisServer redis({.password = "S3cretPw"});
  const std::string bare = "redis://127.0.0.1:" + std::to_string(redis.port());
  const std::string with_pw = "redis://:S3cretPw@127.0.0.1:" + std::to_string(redis.port());
  const std::string out = (dir.path() / "child-url").string();
  const std::vector<std::string> print_url = {"--", "sh", "-c", "printf %s \"$DISTLOCK_URL\" > " + out};
  auto args = [&](std::vector<std::string> head) {
    head.insert(head.end(), print_url.begin(), print_url.end());
    return head;
  };
  auto child_url = [&] {
    std::ifstream in(out);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };

  Cli env = Cli::run(args({"run", "--url", bare, "job"}), dir.path(), 20s, {"DISTLOCK_PASSWORD=S3cretPw"});
  EXPECT_EQ(env.code(), 0) << env.err();
  EXPECT_EQ(child_url(), bare);

  const std::string pw_file = (dir.path() / "pw").string();
  std::ofstream(pw_file) << "S3cretPw\n";
  Cli file = Cli::run(args({"run", "--url", bare, "--password-file", pw_file, "job"}), dir.path());
  EXPECT_EQ(file.code(), 0) << file.err();
  EXPECT_EQ(child_url(), bare);
  Cli status = Cli::run({"status", "--password-file", pw_file, "--url", bare, "job"}, dir.path());
  EXPECT_EQ(status.code(), 3) << status.err();
  EXPECT_EQ(status.out().find("S3cret"), std::string::npos) << status.out();

  // Written in the URL: the child still gets none, unless asked.
  Cli in_url = Cli::run(args({"run", "--url", with_pw, "job"}), dir.path());
  EXPECT_EQ(in_url.code(), 0) << in_url.err();
  EXPECT_EQ(child_url(), bare);
  Cli asked = Cli::run(args({"run", "--url", bare, "--pass-url-password", "job"}), dir.path(), 20s,
                       {"DISTLOCK_PASSWORD=S3cretPw"});
  EXPECT_EQ(asked.code(), 0) << asked.err();
  EXPECT_EQ(child_url(), with_pw);

  // A wrong password from the environment: 69, and never printed.
  Cli wrong =
      Cli::run({"run", "--url", bare, "job", "--", "true"}, dir.path(), 20s, {"DISTLOCK_PASSWORD=Wr0ngPw"});
  EXPECT_EQ(wrong.code(), 69);
  EXPECT_EQ(wrong.err().find("Wr0ng"), std::string::npos) << wrong.err();
  // A missing password file: 64, naming the file.
  Cli missing = Cli::run({"status", "--password-file", pw_file + ".nope", "--url", bare, "job"}, dir.path());
  EXPECT_EQ(missing.code(), 64);
  EXPECT_TRUE(one_error_line(missing.err(), "pw.nope"));
  // file:// takes no password: $DISTLOCK_PASSWORD is ignored there, --password-file refused.
  const std::string local = "file://" + (dir.path() / "locks").string();
  Cli local_env =
      Cli::run({"run", "--url", local, "job", "--", "true"}, dir.path(), 20s, {"DISTLOCK_PASSWORD=S3cretPw"});
  EXPECT_EQ(local_env.code(), 0) << local_env.err();
  Cli local_file =
      Cli::run({"run", "--url", local, "--password-file", pw_file, "job", "--", "true"}, dir.path());
  EXPECT_EQ(local_file.code(), 64);
  EXPECT_TRUE(one_error_line(local_file.err(), "take no password"));
}

// $DISTLOCK_PASSWORD is the runner's, not the job's: the job's environment carries
// the password only when --pass-url-password asks for it, and then in DISTLOCK_URL
// (PasswordFromEnvironmentOrFileAndNotInTheChildUrl).
TEST(CliRedis, PasswordVariableIsNotPassedToTheJob) {
  TempDir dir("distlock-cli");
  RedisServer redis({.password = "S3cretPw"});
  const std::string bare = "redis://127.0.0.1:" + std::to_string(redis.port());
  const std::string out = (dir.path() / "child-env").string();
  const std::vector<std::string> job = {"--", "sh", "-c", "printf '[%s]' \"$DISTLOCK_PASSWORD\" > " + out};
  std::vector<std::string> args = {"run", "--url", bare, "job"};
  args.insert(args.end(), job.begin(), job.end());
  Cli run = Cli::run(args, dir.path(), 20s, {"DISTLOCK_PASSWORD=S3cretPw"});
  ASSERT_EQ(run.code(), 0) << run.err();
  EXPECT_EQ(slurp(out), "[]") << "the job was given the password";
}

// A password written in --url is overwritten in the runner's own argument memory
// as soon as the arguments are parsed, so ps and /proc/<pid>/cmdline of a long
// job's runner do not show it; the job's own arguments are left as they were.
TEST(CliRedis, PasswordInUrlIsNotShownByPs) {
  TempDir dir("distlock-cli");
  RedisServer redis({.password = "S3cretPw"});
  const std::string with_pw = "redis://:S3cretPw@127.0.0.1:" + std::to_string(redis.port());
  const auto ready = dir.path() / "ready";
  Cli run = Cli::start({"run", "--url=" + with_pw, "--wait", "10s", "job", "--", "sh", "-c",
                        "echo go > " + ready.string() + "; exec sleep 30", "redis://:JobArg@h"},
                       dir.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << run.err();
  const std::string cmdline = slurp("/proc/" + std::to_string(run.pid()) + "/cmdline");
  ASSERT_NE(cmdline.find("--url=redis://"), std::string::npos) << cmdline;
  EXPECT_EQ(cmdline.find("S3cretPw"), std::string::npos) << "ps shows the password: " << cmdline;
  EXPECT_NE(cmdline.find("redis://:JobArg@h"), std::string::npos)
      << "the job's arguments changed: " << cmdline;
  run.signal(SIGTERM);
  EXPECT_NE(run.wait(20s), -1);
}

}  // namespace
}  // namespace distlock::testing

namespace distlock::testing {
namespace {
TEST(CliBench, PrintsOneJsonLinePerWorkload) {
  TempDir dir("distlock-cli");
  const std::string url = "file://" + (dir.path() / "locks").string();
  Cli r = Cli::run({"bench", "--url", url, "--workload", "uncontended,contended", "--clients", "2", "--ops",
                    "40", "--warmup", "4"},
                   dir.path(), 60s);
  ASSERT_EQ(r.code(), 0) << r.err();
  const auto out = lines_of(r.out());
  ASSERT_EQ(out.size(), 2u) << r.out();
  const auto first = nlohmann::json::parse(out[0]);
  const auto second = nlohmann::json::parse(out[1]);
  EXPECT_EQ(first.at("workload"), "uncontended");
  EXPECT_EQ(second.at("workload"), "contended");
  EXPECT_EQ(first.at("url"), url);
  EXPECT_GT(first.at("ops_per_s").get<double>(), 0.0);
}

}  // namespace
}  // namespace distlock::testing
