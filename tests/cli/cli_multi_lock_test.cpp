// Black-box tests of `distlock run --lock A --lock B` (src/cli/run/multi_hold.cpp, the runner
// taking several locks through Client::acquire_all), on file:// and on a redis-server the test
// starts: two sets exclude each other; overlapping sets given in opposite orders never deadlock;
// the job sees one token per name ($DISTLOCK_TOKENS); the loss of one name stops the job; the
// flags that apply to one name only are refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_fixture.hpp"
#include "cli/cli_harness.hpp"
#include "support/eventually.hpp"
#include "support/process.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

class CliMultiLock : public FileOrRedisCliTest {
 protected:
  CliMultiLock() : FileOrRedisCliTest("distlock-cli-multi") {}

  /// `distlock run --url URL <flags...> --lock N... -- sh -c SCRIPT`
  std::vector<std::string> run_locks(const std::vector<std::string>& names, const std::string& script,
                                     std::vector<std::string> flags = {}) const {
    std::vector<std::string> args{"run", "--url", url_};
    args.insert(args.end(), flags.begin(), flags.end());
    for (const auto& n : names) args.insert(args.end(), {"--lock", n});
    args.insert(args.end(), {"--", "sh", "-c", script});
    return args;
  }

  /// A job that writes `ready`, then waits (polling every 20 ms) until `go` exists.
  static std::string until_go(const fs::path& ready, const fs::path& go) {
    return "echo x > " + ready.string() + "; while [ ! -e " + go.string() + " ]; do sleep 0.02; done";
  }

  /// Creates the file `go`: the job of until_go() ends. False when it could not be created.
  static bool let_go(const fs::path& go) {
    std::FILE* f = std::fopen(go.c_str(), "w");
    if (f == nullptr) return false;
    std::fclose(f);
    return true;
  }

  /// A job that writes its pid to `ready` (atomically), ignores SIGTERM and spins.
  std::string spinning(const fs::path& ready) const {
    return "trap '' TERM; echo $$ > " + ready.string() + ".tmp && mv " + ready.string() + ".tmp " +
           ready.string() + "; while :; do sleep 0.05; done";
  }
};

// The job gets DISTLOCK_TOKENS=name=token,... in sorted order whatever order the flags were in,
// and no DISTLOCK_TOKEN or DISTLOCK_NAME with several names (no single token means anything);
// with one --lock name it gets both, and they agree with DISTLOCK_TOKENS. The positional NAME
// joins the set.
TEST_P(CliMultiLock, JobSeesOneTokenPerName) {
  const std::string show =
      "echo \"$DISTLOCK_TOKENS\"; echo \"T=${DISTLOCK_TOKEN-unset}\"; "
      "echo \"N=${DISTLOCK_NAME-unset}\"";
  std::vector<std::string> args = run_locks({"tok/b", "tok/c"}, show);
  args.insert(args.end() - 4, "tok/a");  // the positional NAME, before "--"
  Cli both = Cli::run(args, dir_.path());
  ASSERT_EQ(both.code(), 0) << both.err();
  const auto lines = lines_of(both.out());
  ASSERT_EQ(lines.size(), 3u) << both.out();
  EXPECT_TRUE(std::regex_match(lines[0], std::regex("tok/a=[0-9]+,tok/b=[0-9]+,tok/c=[0-9]+"))) << lines[0];
  EXPECT_EQ(lines[1], "T=unset");
  EXPECT_EQ(lines[2], "N=unset");

  Cli one = Cli::run(run_locks({"tok/a"}, show), dir_.path());
  ASSERT_EQ(one.code(), 0) << one.err();
  const auto one_lines = lines_of(one.out());
  ASSERT_EQ(one_lines.size(), 3u) << one.out();
  std::smatch m;
  ASSERT_TRUE(std::regex_match(one_lines[0], m, std::regex("tok/a=([0-9]+)"))) << one_lines[0];
  EXPECT_EQ(one_lines[1], "T=" + m[1].str());
  EXPECT_EQ(one_lines[2], "N=tok/a");
}

// A set held by one runner: another runner asking for the same set, or for one name of it, is
// refused at once with --no-wait (exit 75, naming the set, nothing held); a runner with --wait
// for an overlapping set runs once the first one's job has ended, not before.
TEST_P(CliMultiLock, TwoSetsExcludeEachOther) {
  const fs::path ready = path("ready"), go = path("go"), ended = path("a-ended");
  Cli a = Cli::start(run_locks({"ex/a", "ex/b"}, until_go(ready, go) + "; echo x > " + ended.string()),
                     dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << a.err();

  Cli same = Cli::run(run_locks({"ex/b", "ex/a"}, "echo ran", {"--no-wait"}), dir_.path());
  EXPECT_EQ(same.code(), 75) << same.err();
  EXPECT_EQ(same.out(), "");
  EXPECT_NE(same.err().find("locks \"ex/a\", \"ex/b\" were not all acquired"), std::string::npos)
      << same.err();
  EXPECT_NE(same.err().find("none is held"), std::string::npos) << same.err();

  Cli part = Cli::run(run_locks({"ex/b", "ex/z"}, "echo ran", {"--no-wait"}), dir_.path());
  EXPECT_EQ(part.code(), 75) << part.err();
  EXPECT_EQ(part.out(), "");
  // All or nothing: the refused set left "ex/z" free.
  Cli z = Cli::run(run_sh("ex/z", "echo ran", {"--no-wait"}), dir_.path());
  EXPECT_EQ(z.code(), 0) << z.err();

  // Its job fails (99) unless the first job has ended: it must not run beside it.
  Cli waiter = Cli::start(
      run_locks({"ex/b", "ex/c"}, "[ -e " + ended.string() + " ] || exit 99; echo ran", {"--wait", "30s"}),
      dir_.path());
  ASSERT_TRUE(let_go(go));
  EXPECT_EQ(a.wait(20s), 0) << a.err();
  EXPECT_EQ(waiter.wait(30s), 0) << waiter.err();
  EXPECT_EQ(waiter.out(), "ran\n");
}

// Overlapping sets in opposite orders ({a,b} and {b,a}, and {b,c} beside them), 20 rounds per
// runner loop, three loops at once: every run gets its set (exit 0, none times out after its
// 30 s --wait, which a deadlock would need) and no two jobs holding a common name overlap (each
// job makes the directory of each of its names; mkdir fails, exit 99, if another job has it).
// Bound: all 60 runs within 90 s on this process's steady clock (measured: see the printed
// figure; each run is a process start, connect and acquire).
TEST_P(CliMultiLock, OppositeOrdersNeverDeadlock) {
  constexpr int kRounds = 20;
  const auto crit = [&](const std::vector<std::string>& names) {
    std::string enter, leave;
    for (const auto& n : names) {
      const std::string d = path("in-" + n).string();
      enter += "mkdir " + d + " || exit 99; ";
      leave += "rmdir " + d + "; ";
    }
    return enter + "sleep 0.01; " + leave;
  };
  const std::vector<std::vector<std::string>> sets{{"a", "b"}, {"b", "a"}, {"c", "b"}};
  std::atomic<int> failures{0};
  std::vector<std::string> first_failure(sets.size());
  const auto t0 = SteadyClock::now();
  std::vector<std::thread> loops;
  for (std::size_t i = 0; i < sets.size(); ++i) {
    loops.emplace_back([&, i] {
      std::vector<std::string> names;
      for (const auto& n : sets[i]) names.push_back("dl/" + n);
      std::vector<std::string> dirs = sets[i];
      for (int r = 0; r < kRounds; ++r) {
        Cli c = Cli::run(run_locks(names, crit(dirs), {"--wait", "30s"}), dir_.path(), 60s);
        if (c.code() != 0) {
          failures.fetch_add(1);
          first_failure[i] =
              "round " + std::to_string(r) + ": exit " + std::to_string(c.code()) + ": " + c.err();
          return;
        }
      }
    });
  }
  for (auto& t : loops) t.join();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t0);
  EXPECT_EQ(failures.load(), 0) << first_failure[0] << first_failure[1] << first_failure[2];
  EXPECT_LE(took, 90s);
  std::printf("%s: %d runs of overlapping sets in opposite orders in %lld ms (bound 90000 ms)\n",
              GetParam().c_str(), kRounds * static_cast<int>(sets.size()),
              static_cast<long long>(took.count()));
}

// The loss of one name of the set stops the whole job: on file:// its lock file removed from
// outside (a loss known at once: SIGKILL without the 10 s grace), on redis:// `distlock revoke`
// of that one name (told at the next renewal, <= 1 s at --ttl 3s). The runner exits 76 naming
// the lost name; the job, which ignores SIGTERM, is dead; afterwards the whole set is free.
TEST_P(CliMultiLock, LossOfOneNameStopsTheJob) {
  const fs::path ready = path("ready");
  const std::vector<std::string> flags = redis() ? std::vector<std::string>{"--ttl", "3s", "--grace", "200ms"}
                                                 : std::vector<std::string>{"--ttl", "60s", "--grace", "10s"};
  Cli a = Cli::start(run_locks({"loss/b", "loss/a"}, spinning(ready), flags), dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << a.err();
  const pid_t job = std::stoi(slurp(ready));

  SteadyClock::time_point lost_at;
  if (redis()) {
    Cli revoke = Cli::run({"revoke", "--url", url_, "--reason", "multi test", "loss/b"}, dir_.path());
    ASSERT_EQ(revoke.code(), 0) << revoke.err();
    lost_at = revoke.ended_at();
  } else {
    ASSERT_TRUE(fs::remove(path("locks") / "loss%2Fb.lock") || fs::remove(path("locks") / "loss/b.lock"))
        << "the lock file of loss/b";
    lost_at = SteadyClock::now();
  }
  ASSERT_EQ(a.wait(20s), 76) << a.err();
  // Bound on this process's clock: redis 1 s renewal + 200 ms grace + slack; file at once + slack.
  const auto stopped_after = std::chrono::duration_cast<std::chrono::milliseconds>(a.ended_at() - lost_at);
  EXPECT_LE(stopped_after, 4000ms);
  std::printf("%s: run of {loss/a, loss/b} exited 76 %lld ms after loss/b was taken away (bound 4000 ms)\n",
              GetParam().c_str(), static_cast<long long>(stopped_after.count()));
  EXPECT_NE(a.err().find("locks \"loss/a\", \"loss/b\" lost while the command ran"), std::string::npos)
      << a.err();
  EXPECT_NE(a.err().find("lock \"loss/b\" of the set"), std::string::npos) << a.err();
  EXPECT_NE(a.err().find("SIGKILL"), std::string::npos) << a.err();
  EXPECT_TRUE(eventually([&] { return !process_alive(job); }, 5s)) << "the job still runs";

  Cli next = Cli::run(run_locks({"loss/a", "loss/b"}, "true", {"--wait", "10s"}), dir_.path());
  EXPECT_EQ(next.code(), 0) << next.err();
}

// A runner waiting for the second name of its set, already holding the first, that is sent
// SIGTERM or SIGINT dies of the signal (143 / 130) without running the job, and leaves the first
// name free AT ONCE: a --no-wait run of it succeeds right after, not after the 60 s --ttl (on
// redis:// a name left behind would stay held until then).
TEST_P(CliMultiLock, SignalWhileWaitingForTheSecondNameLeavesNoneHeld) {
  const fs::path ready = path("holder-ready"), go = path("holder-go");
  Cli holder = Cli::start(run_sh("sig/b", until_go(ready, go), {"--ttl", "60s"}), dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << holder.err();
  for (const int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(sig == SIGTERM ? "SIGTERM" : "SIGINT");
    Cli r =
        Cli::start(run_locks({"sig/b", "sig/a"}, "echo ran", {"--ttl", "60s", "--wait", "60s"}), dir_.path());
    // The runner holds sig/a (taken first, in sorted order) and waits for sig/b.
    ASSERT_TRUE(eventually(
        [&] { return Cli::run(run_sh("sig/a", "true", {"--no-wait"}), dir_.path()).code() == 75; }, 20s))
        << r.err();
    ASSERT_TRUE(r.running()) << r.err();
    r.signal(sig);
    ASSERT_EQ(r.wait(10s), 128 + sig) << r.err();
    EXPECT_EQ(r.out(), "");
    Cli after = Cli::run(run_sh("sig/a", "true", {"--no-wait"}), dir_.path());
    EXPECT_EQ(after.code(), 0) << "sig/a left held after the runner died: " << after.err();
  }
  ASSERT_TRUE(let_go(go));
  EXPECT_EQ(holder.wait(20s), 0) << holder.err();
}

// The same name written twice (--lock a --lock a), and the positional NAME equal to a --lock, is
// taken once: no stall on the runner's own lock (bounded by --wait 5s: exit 0, not 75), one
// entry in $DISTLOCK_TOKENS, and a set that is one name in the end gets DISTLOCK_NAME and
// DISTLOCK_TOKEN agreeing with it.
TEST_P(CliMultiLock, DuplicateNamesAreTakenOnce) {
  const std::string show =
      "echo \"$DISTLOCK_TOKENS\"; echo \"N=${DISTLOCK_NAME-unset}\"; echo \"T=${DISTLOCK_TOKEN-unset}\"";
  std::vector<std::string> args = run_locks({"dup/a", "dup/a"}, show, {"--wait", "5s"});
  args.insert(args.end() - 4, "dup/a");  // the positional NAME, before "--"
  Cli one = Cli::run(args, dir_.path(), 20s);
  ASSERT_EQ(one.code(), 0) << one.err();
  const auto lines = lines_of(one.out());
  ASSERT_EQ(lines.size(), 3u) << one.out();
  std::smatch m;
  ASSERT_TRUE(std::regex_match(lines[0], m, std::regex("dup/a=([0-9]+)"))) << lines[0];
  EXPECT_EQ(lines[1], "N=dup/a");
  EXPECT_EQ(lines[2], "T=" + m[1].str());

  Cli two = Cli::run(run_locks({"dup/b", "dup/a", "dup/b"}, show, {"--wait", "5s"}), dir_.path(), 20s);
  ASSERT_EQ(two.code(), 0) << two.err();
  const auto two_lines = lines_of(two.out());
  ASSERT_EQ(two_lines.size(), 3u) << two.out();
  EXPECT_TRUE(std::regex_match(two_lines[0], std::regex("dup/a=[0-9]+,dup/b=[0-9]+"))) << two_lines[0];
  EXPECT_EQ(two_lines[1], "N=unset");
  EXPECT_EQ(two_lines[2], "T=unset");
}

// Each token in $DISTLOCK_TOKENS is the one of its own name: tokens of one name grow from one
// grant to the next, so a single run of each name before and after the set's run brackets the
// set's token for that name. tk/b is taken three times first, so its counter differs from tk/a's
// and a swap of the two would put a token outside its bracket.
TEST_P(CliMultiLock, EachTokenBelongsToItsName) {
  const auto single = [&](const std::string& name) {
    Cli c = Cli::run(run_sh(name, "echo $DISTLOCK_TOKEN"), dir_.path());
    EXPECT_EQ(c.code(), 0) << c.err();
    return std::stoull(c.out());
  };
  (void)single("tk/b");
  (void)single("tk/b");
  const std::uint64_t a0 = single("tk/a"), b0 = single("tk/b");
  Cli set = Cli::run(run_locks({"tk/b", "tk/a"}, "echo \"$DISTLOCK_TOKENS\""), dir_.path());
  ASSERT_EQ(set.code(), 0) << set.err();
  std::smatch m;
  const std::string line = lines_of(set.out()).at(0);
  ASSERT_TRUE(std::regex_match(line, m, std::regex("tk/a=([0-9]+),tk/b=([0-9]+)"))) << line;
  const std::uint64_t a = std::stoull(m[1].str()), b = std::stoull(m[2].str());
  const std::uint64_t a1 = single("tk/a"), b1 = single("tk/b");
  EXPECT_LT(a0, a) << line;
  EXPECT_LT(a, a1) << line;
  EXPECT_LT(b0, b) << line;
  EXPECT_LT(b, b1) << line;
}

// Many names (40) in one set: taken and released as one, within a bound (20 s on this process's
// steady clock; the printed figure is the measured time), and afterwards every name is free (a
// --no-wait run of the whole set succeeds); refused with --no-wait for its last name, it leaves
// the 39 others free.
TEST_P(CliMultiLock, ManyNamesAreTakenAndFreed) {
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) names.push_back("many/" + std::to_string(i));
  const auto t0 = SteadyClock::now();
  Cli c = Cli::run(run_locks(names, "echo \"$DISTLOCK_TOKENS\"", {"--wait", "10s"}), dir_.path(), 30s);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t0);
  ASSERT_EQ(c.code(), 0) << c.err();
  const std::string out = c.out();
  EXPECT_EQ(std::count(out.begin(), out.end(), '='), 40) << out;
  EXPECT_LE(took, 20s);
  std::printf("%s: run of 40 names took %lld ms (bound 20000 ms)\n", GetParam().c_str(),
              static_cast<long long>(took.count()));
  Cli again = Cli::run(run_locks(names, "true", {"--no-wait"}), dir_.path(), 30s);
  EXPECT_EQ(again.code(), 0) << again.err();

  // The last name in sorted order ("many/9") held by another runner: --no-wait takes the 39
  // before it, is refused (75) and gives them all back: each of them is free at once.
  const fs::path ready = path("holder-ready"), go = path("holder-go");
  Cli holder = Cli::start(run_sh("many/9", until_go(ready, go)), dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << holder.err();
  Cli refused = Cli::run(run_locks(names, "echo ran", {"--no-wait"}), dir_.path(), 30s);
  EXPECT_EQ(refused.code(), 75) << refused.err();
  EXPECT_EQ(refused.out(), "");
  std::vector<std::string> others(names);
  others.erase(std::find(others.begin(), others.end(), "many/9"));
  Cli rest = Cli::run(run_locks(others, "true", {"--no-wait"}), dir_.path(), 30s);
  EXPECT_EQ(rest.code(), 0) << "a name of the refused set left held: " << rest.err();
  ASSERT_TRUE(let_go(go));
  EXPECT_EQ(holder.wait(20s), 0) << holder.err();
}

// A name lost while the runner still waits for a later one (the partial state of acquire_all):
// the runner holds part/a and waits for part/b; part/a is revoked (file://: its lock file
// removed) and part/b set free right
// after, so the runner may get part/b before it learns of the loss of part/a. Whichever way it
// goes (the runner starts over and runs later: exit 0; or its job starts and is killed: exit 76),
// a runner C that waits for part/a never runs its job while the first runner's job is alive
// (C's job checks the other job's pid: exit 99 on an overlap).
TEST_P(CliMultiLock, LossInThePartialStateNeverOverlapsTheNextHolder) {
  const fs::path ready = path("holder-ready"), go = path("holder-go"), rpid = path("r.pid");
  Cli holder =
      Cli::start(run_sh("part/b", until_go(ready, go), {"--ttl", "3s", "--grace", "200ms"}), dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << holder.err();
  Cli r = Cli::start(
      run_locks({"part/a", "part/b"},
                "trap '' TERM; echo $$ > " + rpid.string() + ".tmp && mv " + rpid.string() + ".tmp " +
                    rpid.string() + "; i=0; while [ $i -lt 60 ]; do sleep 0.05; i=$((i+1)); done",
                {"--ttl", "3s", "--grace", "200ms", "--wait", "30s"}),
      dir_.path());
  ASSERT_TRUE(eventually(
      [&] { return Cli::run(run_sh("part/a", "true", {"--no-wait"}), dir_.path()).code() == 75; }, 20s))
      << r.err();
  if (redis()) {
    Cli revoke = Cli::run({"revoke", "--url", url_, "--reason", "partial state test", "part/a"}, dir_.path());
    ASSERT_EQ(revoke.code(), 0) << revoke.err();
  } else {  // file:// has no revoke: its lock file removed from outside is the loss
    ASSERT_TRUE(fs::remove(path("locks") / "part%2Fa.lock") || fs::remove(path("locks") / "part/a.lock"))
        << "the lock file of part/a";
  }
  ASSERT_TRUE(let_go(go));
  Cli c = Cli::start(
      run_sh("part/a",
             "p=$(cat " + rpid.string() +
                 " 2>/dev/null); if [ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null; then echo overlap; "
                 "exit 99; fi; echo ok",
             {"--wait", "30s"}),
      dir_.path());
  EXPECT_EQ(holder.wait(20s), 0) << holder.err();
  const int r_code = r.wait(40s);
  EXPECT_TRUE(r_code == 0 || r_code == 76) << r_code << ": " << r.err();
  EXPECT_EQ(c.wait(40s), 0) << c.out() << c.err();
  EXPECT_EQ(c.out(), "ok\n");
  std::printf("%s: the runner that lost part/a in its partial state exited %d\n", GetParam().c_str(), r_code);
}

// --max-hold counts from each name's own grant: a set whose first name was granted 1.5 s before
// the second (another runner held it) has its job stopped by the first name's --max-hold 3s,
// not 3 s after the second grant. The runner exits 76 naming --max-hold before 2.5 s (--max-hold
// less --grace: when a count from the second grant would send SIGTERM) have passed since the
// holder of the second name was let go (this process's steady clock): the second grant cannot
// come before that moment, so a count from it fails however slow the machine, while a count
// from the first grant has about 1.5 s to spare for the runner's exit.
TEST_P(CliMultiLock, MaxHoldCountsFromTheFirstGrant) {
  const fs::path ready = path("holder-ready"), go = path("holder-go");
  Cli holder = Cli::start(run_sh("mh/b", until_go(ready, go), {"--ttl", "10s"}), dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << holder.err();
  Cli r = Cli::start(run_locks({"mh/a", "mh/b"}, "while :; do sleep 0.05; done",
                               {"--ttl", "10s", "--max-hold", "3s", "--grace", "500ms", "--wait", "20s"}),
                     dir_.path());
  ASSERT_TRUE(eventually(
      [&] { return Cli::run(run_sh("mh/a", "true", {"--no-wait"}), dir_.path()).code() == 75; }, 20s))
      << r.err();
  const auto a_seen = SteadyClock::now();
  // Hold mh/b 1.5 s more, then let the runner have it.
  ASSERT_FALSE(eventually([&] { return !r.running(); }, 1500ms)) << r.err();
  const auto b_free_from = SteadyClock::now();
  ASSERT_TRUE(let_go(go));
  EXPECT_EQ(holder.wait(20s), 0) << holder.err();
  ASSERT_EQ(r.wait(20s), 76) << r.err();
  const auto after_a = std::chrono::duration_cast<std::chrono::milliseconds>(r.ended_at() - a_seen);
  const auto after_b_free = std::chrono::duration_cast<std::chrono::milliseconds>(r.ended_at() - b_free_from);
  EXPECT_LT(after_b_free, 2500ms) << "a count from the second grant would end no sooner\n" << r.err();
  EXPECT_NE(r.err().find("--max-hold"), std::string::npos) << r.err();
  std::printf(
      "%s: runner ended %lld ms after its first name was seen held and %lld ms after the second was let go "
      "(max-hold 3000 ms, grace 500 ms)\n",
      GetParam().c_str(), static_cast<long long>(after_a.count()),
      static_cast<long long>(after_b_free.count()));
}

// --max-hold reached by a job that ignores SIGTERM: the job is SIGKILLed at the first name's
// --max-hold and a runner waiting for that name (--wait 20s) runs its job only once the first
// job is dead (its job checks /proc for the other job's pid: exit 99 if it still runs, a zombie
// not counted). The first runner exits 76.
TEST_P(CliMultiLock, MaxHoldKillsTheJobBeforeTheNextHolderRuns) {
  const fs::path rpid = path("r.pid");
  Cli r = Cli::start(run_locks({"mh2/b", "mh2/a"},
                               "trap '' TERM; echo $$ > " + rpid.string() + ".tmp && mv " + rpid.string() +
                                   ".tmp " + rpid.string() + "; while :; do sleep 0.05; done",
                               {"--ttl", "3s", "--max-hold", "2s", "--grace", "500ms"}),
                     dir_.path());
  ASSERT_TRUE(wait_for_file(rpid, 20s)) << r.err();
  const std::string check =
      "p=$(cat " + rpid.string() +
      "); st=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); if [ -n \"$st\" ] && [ \"$st\" != Z ]; "
      "then echo overlap; exit 99; fi; echo ok";
  Cli c = Cli::start(run_sh("mh2/a", check, {"--wait", "20s"}), dir_.path());
  EXPECT_EQ(r.wait(20s), 76) << r.err();
  EXPECT_EQ(c.wait(30s), 0) << c.out() << c.err();
  EXPECT_EQ(c.out(), "ok\n");
  EXPECT_NE(r.err().find("max-hold"), std::string::npos) << r.err();
  const auto gap = std::chrono::duration_cast<std::chrono::milliseconds>(c.ended_at() - r.ended_at());
  std::printf("%s: the next holder's run ended %lld ms after the max-hold runner exited\n",
              GetParam().c_str(), static_cast<long long>(gap.count()));
}

INSTANTIATE_TEST_SUITE_P(Backends, CliMultiLock, ::testing::Values("file", "redis"),
                         [](const auto& param_info) { return param_info.param; });

// Flags about one NAME only are refused beside --lock (exit 64, naming both flags), as are a
// --lock name with "," (the separator of $DISTLOCK_TOKENS), an empty name and a run with no name.
TEST(CliMultiLockFlags, ConflictsAreRefused) {
  TempDir dir("distlock-cli-multi");
  const std::string url = "file://" + (dir.path() / "locks").string();
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{{"--shards", "4"},
                                                                                    {"--permits", "2"},
                                                                                    {"--shared", ""},
                                                                                    {"--exclusive", ""},
                                                                                    {"--once-per", "1m"}}) {
    std::vector<std::string> args{"run", "--url", url, "--lock", "a", "--lock", "b", flag};
    if (!value.empty()) args.push_back(value);
    args.insert(args.end(), {"--", "true"});
    Cli c = Cli::run(args, dir.path());
    EXPECT_EQ(c.code(), 64) << flag << ": " << c.err();
    EXPECT_NE(c.err().find("--lock and " + flag + " exclude each other"), std::string::npos) << c.err();
  }
  Cli comma = Cli::run({"run", "--url", url, "--lock", "a,b", "--", "true"}, dir.path());
  EXPECT_EQ(comma.code(), 64) << comma.err();
  EXPECT_NE(comma.err().find("cannot contain \",\""), std::string::npos) << comma.err();

  // An empty NAME written out is an empty name, beside --lock too.
  Cli empty = Cli::run({"run", "--url", url, "--lock", "a", "", "--", "true"}, dir.path());
  EXPECT_EQ(empty.code(), 64) << empty.err();
  EXPECT_NE(empty.err().find("lock name is empty"), std::string::npos) << empty.err();

  Cli none = Cli::run({"run", "--url", url, "--", "true"}, dir.path());
  EXPECT_EQ(none.code(), 64) << none.err();
  EXPECT_NE(none.err().find("no lock name given"), std::string::npos) << none.err();

  // Without "--" the first word is the positional NAME, and then there is no command.
  Cli no_dashes = Cli::run({"run", "--url", url, "--lock", "a", "true"}, dir.path());
  EXPECT_EQ(no_dashes.code(), 64) << no_dashes.err();
  EXPECT_NE(no_dashes.err().find("no command given"), std::string::npos) << no_dashes.err();
}

}  // namespace
}  // namespace distlock::testing
