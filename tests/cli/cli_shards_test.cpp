// Black-box tests of `distlock run --shards M GROUP` and `distlock status --shards GROUP` on
// file:// and on real servers the test starts itself (tests/support/backend_targets): one
// redis-server, etcd as one member, ZooKeeper standalone, one PostgreSQL. A backend compiled in
// whose server is missing fails the test (the harnesses report it), it is never skipped:
//   - two members of 8 shards split 4/4; their commands see disjoint sets covering 0..7, one
//     token per shard, and `status --shards --json` shows the same split;
//   - a SIGKILLed member's shards reach the survivor's command (SIGHUP + $DISTLOCK_SHARDS_FILE)
//     within kill_bound(): TTL + one rebalance period (+1.5 s for round trips on a loaded CI
//     machine), plus how late the server may expire a lease past its TTL (etcd, zk; below),
//     measured on this process's steady clock from kill();
//   - --per-shard: one command per shard; a shard that moves has its old command killed before
//     the new owner's starts (no write of the old token after one of the new), and the new
//     owner's command gets a larger token;
//   - usage errors exit 64 with a line naming the flag.
//   - the tests' shared command (shared_reporter) ends on the newest set when a SIGHUP comes while
//     it reads the previous file (CliShardsReporter).
// Every wait is on a file the commands write, bounded by a stated deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
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

constexpr auto kTtl = 2000ms;
constexpr auto kPeriod = 200ms;
// Round trips of a list, a release and an acquisition, and the runner's SIGHUP/fork, on a
// 2-core machine shared with compilers.
constexpr auto kSlack = 1500ms;

/// How long after a member's SIGKILL its shards may reach another member: its leases expire
/// one TTL after their last renewal (at most TTL after the kill), the survivors notice at
/// their next listing (one period), plus kSlack. Servers that expire leases on a timer of
/// their own add that timer's step:
///   - etcd: the lessor revokes expired leases in a loop that runs every 500 ms;
///   - zk: a session expires at the first tick (tests/zk/zk_server: tickTime 200 ms) after
///     its timeout (the session timeout is the TTL, 2 s).
/// file:// frees a dead process's kernel locks at its death; PostgreSQL frees the advisory
/// lock when the dead client's connection closes, and a taker waits out the owner row's
/// seen_at + ttl (docs/postgres.md), within one TTL of the last renewal.
std::chrono::milliseconds kill_bound(const std::string& backend) {
  auto extra = 0ms;
  if (backend == "etcd1") extra = 500ms;
  if (backend == "zk1") extra = 200ms;
  return kTtl + kPeriod + kSlack + extra;
}

/// The backends of this build the suite runs on (tests/support/backend_targets).
std::vector<Kind> shard_kinds() {
  std::vector<Kind> out;
  for (auto& k : kinds())
    if (k.label == "file" || k.label == "redis" || k.label == "etcd1" || k.label == "zk1" ||
        k.label == "postgres")
      out.push_back(k);
  return out;
}

std::vector<std::uint64_t> split_numbers(const std::string& text) {
  std::vector<std::uint64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(std::stoull(item));
  }
  return out;
}

/// What a shared command last reported: "<shards>|<tokens>".
struct Report {
  std::vector<std::uint64_t> shards, tokens;
};
std::optional<Report> read_report(const fs::path& p) {
  std::string text = slurp(p);
  if (text.empty()) return std::nullopt;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const auto bar = text.find('|');
  if (bar == std::string::npos) return std::nullopt;
  return Report{split_numbers(text.substr(0, bar)), split_numbers(text.substr(bar + 1))};
}

/// A shared command (sh -c) that writes "$DISTLOCK_SHARDS|$DISTLOCK_TOKENS" to `out` at start
/// and, after each SIGHUP, what $DISTLOCK_SHARDS_FILE says; runs until `stop` exists.
///
/// The trap only sets a flag; the main loop reads the file. A trap that read the file itself
/// would report a stale set: sh runs the trap of a SIGHUP that arrives while the trap is still
/// running inside it, before the next command of the file the outer trap is reading, so the
/// inner trap reads and reports the newest file, and then the outer one goes on with the
/// older file's lines and reports those last. The runner sends one SIGHUP per change, to the
/// job's whole process group (which also ends the loop's `sleep` at once), so a shard group
/// that gives up or gains several shards one after another sends them that close together.
/// Here a SIGHUP while the file is read sets the flag again, and the loop reads it once more.
std::string shared_reporter(const fs::path& out, const fs::path& stop) {
  const std::string o = out.string();
  return "report() { echo \"$DISTLOCK_SHARDS|$DISTLOCK_TOKENS\" > " + o + ".tmp && mv " + o + ".tmp " + o +
         "; }; hup=0; trap 'hup=1' HUP; "
         "[ \"$DISTLOCK_SHARD_COUNT\" = 8 ] || exit 9; report; "
         "while [ ! -e " +
         stop.string() +
         " ]; do if [ \"$hup\" = 1 ]; then hup=0; . \"$DISTLOCK_SHARDS_FILE\"; report; fi; sleep 0.02; done";
}

class CliShards : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    target_ = GetParam().make({});
    url_ = target_->url();
  }
  const std::string& backend() const { return GetParam().label; }
  fs::path path(const std::string& name) const { return dir_.path() / name; }

  /// A runner whose $DISTLOCK_SHARDS_FILE directory is made under the test's directory (a
  /// SIGKILLed runner cannot remove it).
  Cli start_member(const std::vector<std::string>& args) const {
    return Cli::start(args, dir_.path(), {"TMPDIR=" + dir_.path().string()});
  }

  std::vector<std::string> run_args(const std::string& group, int shards, std::vector<std::string> flags,
                                    const std::string& script) const {
    std::vector<std::string> args{"run",   "--url",    url_,
                                  "--ttl", "2s",       "--rebalance-period",
                                  "200ms", "--shards", std::to_string(shards)};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {group, "--", "sh", "-c", script});
    return args;
  }

  std::string reporter(const fs::path& out) const { return shared_reporter(out, path("stop")); }

  TempDir dir_{"distlock-cli-shards"};
  std::unique_ptr<Target> target_;
  std::string url_;
};

/// Both reports hold 4 shards each, disjoint, covering 0..7, with one token per shard.
bool split_evenly(const fs::path& a, const fs::path& b) {
  auto ra = read_report(a), rb = read_report(b);
  if (!ra || !rb) return false;
  if (ra->shards.size() != 4 || rb->shards.size() != 4) return false;
  if (ra->tokens.size() != 4 || rb->tokens.size() != 4) return false;
  std::set<std::uint64_t> all(ra->shards.begin(), ra->shards.end());
  all.insert(rb->shards.begin(), rb->shards.end());
  return all == std::set<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7};
}

TEST_P(CliShards, TwoMembersSplitEvenlyAndSurvivorGetsAllAfterSigkill) {
  const fs::path a_out = path("a.report"), b_out = path("b.report");
  Cli a = start_member(run_args("migrate", 8, {}, reporter(a_out)));
  // Alone, the first member owns every shard (bounded: 10 s for connect + first rebalance).
  ASSERT_TRUE(eventually(
      [&] {
        auto r = read_report(a_out);
        return r && r->shards.size() == 8;
      },
      10s))
      << a.err();
  Cli b = start_member(run_args("migrate", 8, {}, reporter(b_out)));
  ASSERT_TRUE(eventually([&] { return split_evenly(a_out, b_out); }, 10s))
      << slurp(a_out) << " / " << slurp(b_out) << "\n"
      << a.err() << b.err();
  // Tokens are fencing tokens: above zero on these backends.
  const Report b_split = *read_report(b_out);
  for (auto t : b_split.tokens) EXPECT_GT(t, 0U);

  // status --shards --json shows the same split.
  Cli st = Cli::run({"status", "--url", url_, "--shards", "--json", "migrate"}, dir_.path());
  ASSERT_EQ(st.code(), 0) << st.err();
  const auto j = nlohmann::json::parse(st.out());
  ASSERT_EQ(j["members"].size(), 2U) << st.out();
  std::set<std::uint64_t> listed;
  for (const auto& m : j["members"]) {
    EXPECT_EQ(m["shards"].size(), 4U) << st.out();
    EXPECT_EQ(m["tokens"].size(), 4U) << st.out();
    for (const auto& s : m["shards"]) listed.insert(s.get<std::uint64_t>());
  }
  EXPECT_EQ(listed.size(), 8U);
  Cli text = Cli::run({"status", "--url", url_, "--shards", "migrate"}, dir_.path());
  EXPECT_EQ(text.code(), 0);
  EXPECT_NE(text.out().find("members: 2"), std::string::npos) << text.out();

  // SIGKILL member a: b's command is told the full set by SIGHUP + the shards file.
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(a.pid(), SIGKILL);
  const auto bound = kill_bound(backend());
  ASSERT_TRUE(eventually(
      [&] {
        auto r = read_report(b_out);
        return r && r->shards.size() == 8 && r->tokens.size() == 8;
      },
      bound + 5s))
      << slurp(b_out) << b.err();
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed_at);
  std::printf("[ %s ] survivor's command had all 8 shards %lld ms after SIGKILL (bound %lld ms)\n",
              backend().c_str(), static_cast<long long>(took.count()), static_cast<long long>(bound.count()));
  EXPECT_LE(took, bound);

  // SIGTERM to the runner: forwarded to its command (which dies of it), exit 128+15.
  b.signal(SIGTERM);
  EXPECT_EQ(b.wait(10s), 128 + SIGTERM) << b.err();
}

TEST_P(CliShards, PerShardCommandsAreKilledWhenTheirShardMoves) {
  // Each command appends "<shard> <token> <pid>" to started, then runs until stop exists.
  const std::string started = path("started").string();
  // ... and appends its token to shard-<i>.log every 20 ms while it runs: a killed command
  // writes nothing after its shard's next owner started, so each log never goes down.
  const std::string script = "echo \"$DISTLOCK_SHARD $DISTLOCK_TOKEN $$\" >> " + started + "; while [ ! -e " +
                             path("stop").string() + " ]; do echo $DISTLOCK_TOKEN >> " +
                             dir_.path().string() + "/shard-$DISTLOCK_SHARD.log; sleep 0.02; done";
  auto starts = [&] {
    std::vector<std::array<std::uint64_t, 3>> out;
    std::stringstream in(slurp(started));
    for (std::uint64_t s, t, p; in >> s >> t >> p;) out.push_back({s, t, p});
    return out;
  };
  Cli a = start_member(run_args("perShard", 4, {"--per-shard"}, script));
  ASSERT_TRUE(eventually([&] { return starts().size() == 4; }, 10s)) << a.err();
  const auto first = starts();
  Cli b = start_member(run_args("perShard", 4, {"--per-shard"}, script));
  ASSERT_TRUE(eventually([&] { return starts().size() == 6; }, 10s)) << slurp(started) << a.err() << b.err();
  const auto all = starts();
  // The two new commands are for shards that moved: their old command is dead and the new
  // token is larger.
  for (std::size_t i = 4; i < all.size(); ++i) {
    const auto& moved = all[i];
    bool found = false;
    for (const auto& old : first) {
      if (old[0] != moved[0]) continue;
      found = true;
      EXPECT_GT(moved[1], old[1]) << "shard " << moved[0];
      EXPECT_TRUE(eventually([&] { return !process_alive(static_cast<pid_t>(old[2])); }, 5s))
          << "shard " << moved[0] << "'s old command still runs";
    }
    EXPECT_TRUE(found);
  }
  // Balanced: no further command starts once each member has 2 (a short look, 3 periods).
  std::this_thread::sleep_for(3 * kPeriod);
  EXPECT_EQ(starts().size(), 6U);
  for (int shard = 0; shard < 4; ++shard) {
    std::stringstream log(slurp(path("shard-" + std::to_string(shard) + ".log")));
    std::uint64_t last = 0, lines = 0;
    for (std::uint64_t token; log >> token; ++lines) {
      EXPECT_GE(token, last) << "shard " << shard << ": a write with token " << token << " after one with "
                             << last;
      last = token;
    }
    EXPECT_GT(lines, 0U) << "shard " << shard;
  }
  a.signal(SIGTERM);
  b.signal(SIGTERM);
  EXPECT_EQ(a.wait(10s), 128 + SIGTERM) << a.err();
  EXPECT_EQ(b.wait(10s), 128 + SIGTERM) << b.err();
}

TEST_P(CliShards, RestartModeStartsTheCommandAgainWithTheNewSet) {
  // Each start appends "<pid> <count of shards>" to a's log; runs until stop exists.
  const std::string log = path("a.starts").string();
  const std::string script = "n=$(echo \"$DISTLOCK_SHARDS\" | tr ',' '\\n' | wc -l); echo \"$$ $n\" >> " +
                             log + "; while [ ! -e " + path("stop").string() + " ]; do sleep 0.02; done";
  auto last_start = [&]() -> std::pair<pid_t, int> {
    std::stringstream in(slurp(log));
    std::pair<pid_t, int> last{-1, 0};
    for (long pid, n; in >> pid >> n;) last = {static_cast<pid_t>(pid), static_cast<int>(n)};
    return last;
  };
  Cli a = start_member(run_args("restarting", 8, {"--on-change", "restart"}, script));
  ASSERT_TRUE(eventually([&] { return last_start().second == 8; }, 10s)) << slurp(log) << a.err();
  const pid_t with_eight = last_start().first;
  Cli b = start_member(run_args("restarting", 8, {}, reporter(path("b.report"))));
  ASSERT_TRUE(eventually([&] { return last_start().second == 4 && !process_alive(with_eight); }, 10s))
      << slurp(log) << a.err() << b.err();
  EXPECT_NE(last_start().first, with_eight);
  a.signal(SIGTERM);
  b.signal(SIGTERM);
  EXPECT_EQ(a.wait(10s), 128 + SIGTERM) << a.err();
  EXPECT_EQ(b.wait(10s), 128 + SIGTERM) << b.err();
}

TEST_P(CliShards, AMemberWithoutAShardRunsNoCommandUntilItGetsOne) {
  // Two shards, three members: one of them owns nothing and starts nothing.
  const fs::path r[3] = {path("m0.report"), path("m1.report"), path("m2.report")};
  std::vector<Cli> members;
  auto started = [&] {
    int n = 0;
    for (const auto& p : r) n += read_report(p) ? 1 : 0;
    return n;
  };
  for (int i = 0; i < 3; ++i) {
    const std::string o = r[i].string();
    const std::string script = "echo \"$DISTLOCK_SHARDS|$DISTLOCK_TOKENS\" > " + o + ".tmp && mv " + o +
                               ".tmp " + o + "; trap '' HUP; while [ ! -e " + path("stop").string() +
                               " ]; do sleep 0.02; done";
    members.push_back(start_member(run_args("few", 2, {"--on-change", "restart"}, script)));
    if (i < 2) {
      ASSERT_TRUE(eventually([&] { return started() == i + 1; }, 10s)) << members[i].err();
    }
  }
  // The third member joined, listed the group (3 periods) and took nothing.
  ASSERT_TRUE(eventually(
      [&] {
        Cli st = Cli::run({"status", "--url", url_, "--shards", "--json", "few"}, dir_.path());
        const auto j = nlohmann::json::parse(st.out(), nullptr, false);
        return j.is_object() && j["members"].size() == 3U;
      },
      10s));
  std::this_thread::sleep_for(3 * kPeriod);
  EXPECT_FALSE(read_report(r[2])) << slurp(r[2]);
  // SIGKILL the owner of the first report: the third member gets a shard and starts.
  const auto killed_at = std::chrono::steady_clock::now();
  members[0].signal(SIGKILL);
  const auto bound = kill_bound(backend());
  ASSERT_TRUE(eventually([&] { return read_report(r[2]).has_value(); }, bound + 5s)) << members[2].err();
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed_at);
  std::printf("[ %s ] the idle member's command started %lld ms after SIGKILL of an owner (bound %lld ms)\n",
              backend().c_str(), static_cast<long long>(took.count()), static_cast<long long>(bound.count()));
  EXPECT_LE(took, bound);
  EXPECT_EQ(read_report(r[2])->shards.size(), 1U);
}

INSTANTIATE_TEST_SUITE_P(Backends, CliShards, ::testing::ValuesIn(shard_kinds()),
                         [](const auto& p) { return p.param.label; });

/// Writes `text` to `file` as the runner does (a temporary file renamed over it).
void replace_file(const fs::path& file, const std::string& text) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
  }
  fs::rename(tmp, file);
}

// The shared command the tests above use (shared_reporter) reports the newest set after a burst
// of SIGHUPs: a SIGHUP that comes while it is still reading the previous file is not lost to
// that older file. Deterministic: the first file read blocks (its first line waits for `go`)
// until the second file is in place and its SIGHUP sent, to the job's process group and to the
// job, as the runner's signal_job() does. Each file marks the end of its reading; once both
// were read the job is stopped and its last report checked. Every wait is bounded (10 s, on
// conditions).
TEST(CliShardsReporter, AHupWhileTheFileIsReadLeavesTheNewestSetReported) {
  TempDir dir("distlock-cli-shards-reporter");
  const fs::path out = dir.path() / "report", stop = dir.path() / "stop", file = dir.path() / "shards";
  const fs::path reading = dir.path() / "reading", go = dir.path() / "go";
  const fs::path first_read = dir.path() / "first-read", second_read = dir.path() / "second-read";
  Process job = Process::spawn({"sh", "-c", shared_reporter(out, stop)}, (dir.path() / "log").string(),
                               {"DISTLOCK_SHARDS=0", "DISTLOCK_TOKENS=10", "DISTLOCK_SHARD_COUNT=8",
                                "DISTLOCK_SHARDS_FILE=" + file.string()});
  ASSERT_TRUE(eventually([&] { return slurp(out) == "0|10\n"; }, 10s)) << slurp(out);
  auto hup = [&] {
    ::kill(-job.pid(), SIGHUP);  // Process::spawn makes the job a process group of its own
    ::kill(job.pid(), SIGHUP);
  };
  replace_file(file, ": > " + reading.string() + "; while [ ! -e " + go.string() +
                         " ]; do sleep 0.01; done\nDISTLOCK_SHARDS=0,1\nDISTLOCK_TOKENS=10,11\n: > " +
                         first_read.string() + "\n");
  hup();
  ASSERT_TRUE(eventually([&] { return fs::exists(reading); }, 10s)) << "the job never read the first file";
  replace_file(file, "DISTLOCK_SHARDS=1\nDISTLOCK_TOKENS=11\n: > " + second_read.string() + "\n");
  hup();
  { std::ofstream(go.string()); }
  ASSERT_TRUE(eventually([&] { return fs::exists(first_read) && fs::exists(second_read); }, 10s))
      << "the job did not read both files; last report: " << slurp(out);
  { std::ofstream(stop.string()); }
  EXPECT_EQ(job.exit_code(10s), 0) << slurp(dir.path() / "log");
  EXPECT_EQ(slurp(out), "1|11\n") << "a stale set: the job went on with the first file after the SIGHUP of "
                                     "the second";
}

/// The signals `pid` has blocked (SigBlk of /proc/<pid>/status), or 0.
std::uint64_t blocked_signals(pid_t pid) {
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(in, line);)
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  return 0;
}

// A runner whose server does not answer — a paused redis-server: the kernel accepts the TCP
// connection, no reply comes, the URL's timeout is 30 s — answers SIGTERM while it connects and
// joins: it ends with 128 + SIGTERM within kSignalBound of the signal (the plain `distlock run`'s
// bound for leaving a queue, 3 s, plus 2 s for a loaded machine), measured on this process's
// steady clock. The connect and the join run on a worker thread while the main thread reads
// the signalfd.
TEST(CliShardsSignals, SigtermWhileTheServerDoesNotAnswerEndsTheRunner) {
  constexpr auto kSignalBound = 5000ms;
  std::unique_ptr<Target> redis;
  for (auto& k : kinds())
    if (k.label == "redis") redis = k.make({});
  if (!redis) {  // a build without redis:// (a developer's): nothing to pause; CI builds it
    ASSERT_FALSE(in_ci()) << "redis:// is not in this build";
    return;
  }
  TempDir dir("distlock-cli-shards-signal");
  redis->pause(0);
  Cli c = Cli::start({"run", "--url", redis->url() + "?timeout=30s", "--ttl", "2s", "--shards", "4",
                      "connecting", "--", "sleep", "60"},
                     dir.path(), {"TMPDIR=" + dir.path().string()});
  // The runner has blocked SIGTERM (to read it from its signalfd) before it connects: from
  // then on a SIGTERM is its to handle (bounded: 10 s for the exec).
  ASSERT_TRUE(eventually([&] { return (blocked_signals(c.pid()) >> (SIGTERM - 1)) & 1U; }, 10s)) << c.err();
  // It is connecting now, or about to: the server answers nothing until resume().
  const auto sent = std::chrono::steady_clock::now();
  c.signal(SIGTERM);
  const int code = c.wait(kSignalBound);
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - sent);
  redis->resume(0);
  EXPECT_EQ(code, 128 + SIGTERM) << "after " << took.count() << " ms (-1: still running): " << c.err();
  if (code == -1) {
    c.signal(SIGKILL);
    c.wait(10s);
  }
}

TEST(CliShardsUsage, BadInputIsAUsageError) {
  TempDir dir("distlock-cli-shards-usage");
  const std::string url = "file://" + (dir.path() / "locks").string();
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"run", "--url", url, "--shards", "0", "g", "--", "true"}, "--shards 0 is out of range 1..65536"},
      {{"run", "--url", url, "--shards", "70000", "g", "--", "true"}, "--shards 70000 is out of range"},
      {{"run", "--url", url, "--per-shard", "g", "--", "true"}, "--per-shard needs --shards M"},
      {{"run", "--url", url, "--shards", "4", "--per-shard", "--on-change", "restart", "g", "--", "true"},
       "--on-change does not apply to --per-shard"},
      {{"run", "--url", url, "--shards", "4", "--on-change", "later", "g", "--", "true"},
       "--on-change later is neither hup nor restart"},
      {{"run", "--url", url, "--shards", "4", "--permits", "2", "g", "--", "true"},
       "--shards and --permits exclude each other"},
      {{"run", "--url", url, "--shards", "4", "--", "true"}, "NAME"},
  };
  for (const auto& c : cases) {
    Cli r = Cli::run(c.args, dir.path(), 10s);
    EXPECT_EQ(r.code(), 64) << c.says << ": " << r.err();
    EXPECT_NE(r.err().find(c.says), std::string::npos) << r.err();
  }
}

}  // namespace
}  // namespace distlock::testing
