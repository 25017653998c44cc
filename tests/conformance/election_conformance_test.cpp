// Leader election over every backend the build has (distlock/election.hpp): four
// campaigner processes and three observer processes (tests/conformance/election_tool.cpp)
// on one election, while the test SIGKILLs one leader and SIGSTOPs another past its TTL.
//
// Checked:
//   - exactly one leader at any time: the leaders' sections [start, last moment
//     lease.owns() said true] never overlap (CLOCK_MONOTONIC, one host), and terms
//     strictly increase from section to section (backends with tokens);
//   - every observer sees the same sequence of leaders: exactly the terms of the leaders
//     that acted (see "Reckoning"), in order, each once, with the value that leader proclaimed.
// Pacing: a leader resigns only once every observer has reported its term (the
// campaigner reads the observers' files) and it led for at least 300 ms, and not while
// the test's file `hold` exists (the test creates it, then picks the leader of the
// moment to kill or stop, so that leader is still leading when the signal lands); the test kills or stops a
// leader only after every observer has reported it, so no observer can miss a leader; what the test proves is
// that they see them once, in order, all the same. A SIGKILLed leader's section ends when the test sent
// SIGKILL (it cannot act after it is dead; the window between kill() and its death is microseconds).
// Reckoning. The leader the test kills or stops is the NEWEST leadership without its E line
// (highest term; latest start where there are no terms), and a leadership whose first owns()
// check already said false has no section (its E line says -1; observers may or may not have
// reported its term, as its value may never have been readable). The old reckoning took the
// FIRST leadership without its E line, and gave every leadership [start, start] before any
// check; on a loaded machine each reported overlaps with no second leader:
//   - a leader starved (or stopped) for longer than its session after its last true check has
//     no E line yet when its session expires and the next leader is elected: the log then
//     holds two leaderships without E lines and the first is not the current one. Step 1
//     waits for the second S line, so it then killed that first one and ended its section at
//     the kill, a few ms after the next leader's start, though it had stopped leading at its
//     last true check, before its lease lapsed. Shown by SIGSTOPping the first leader from
//     outside for 3.5 s right after its S line (a stand-in for starvation): "sections overlap"
//     by 2.0 and 5.3 ms in 2 of 3 runs on zk3; after the change 0 of 3, and in each the
//     stopped leader was left alone and wrote its own E line when continued.
//   - a campaigner whose lease lapsed between its grant and its first check (its process
//     starved past its session within campaign() or right after it) logs a start after the
//     next leader's and finds its lease lapsed: [start, start] with its older term lay after
//     the next leader's start (inside that leader's section if it still led: an overlap), and
//     failed "token N does not exceed the previous section's" and the observers' sequence
//     (they never saw that term). Seen in 1 of 20 runs on zk3 beside two `yes` CPU hogs (load
//     average 20): term ...337 logged its start 481 ms after term ...347's, its first check
//     false.
// redlock:// has no terms: there, exclusivity only (observe() is errc::not_supported, checked too); file://
// locks do not expire, so the SIGSTOP step is skipped there.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/backend_mono_clock.hpp"
#include "support/backend_targets.hpp"
#include "support/cs_log.hpp"
#include "support/eventually.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"

namespace distlock::testing {

using namespace std::chrono_literals;

namespace {

constexpr Millis kTtl = 2000ms;
constexpr int kCampaigners = 4;
constexpr int kObservers = 3;
constexpr std::size_t kLeaders = 7;  // leaderships to see before stopping

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

struct Leadership {
  long pid = 0;
  std::string term;
  std::int64_t start = 0, end = 0;
  bool ended = false, owned = true;
  bool acted = true;  // some owns() check said true (E line's last_owned_ns >= 0)
};

// The campaigners' log: one Leadership per S line, completed by its E line.
std::vector<Leadership> read_log(const std::filesystem::path& log) {
  std::vector<Leadership> out;
  for (const auto& line : lines_of(read_file(log))) {
    std::istringstream ls(line);
    std::string kind, term;
    long pid = 0;
    std::int64_t start = 0;
    if (!(ls >> kind >> pid >> term >> start)) continue;
    if (kind == "S") {
      out.push_back({pid, term, start, 0, false, true, true});
    } else if (kind == "E") {
      std::int64_t end = 0;
      int owned = 1;
      ls >> end >> owned;
      for (auto& l : out) {
        if (l.pid == pid && l.term == term && l.start == start) {
          l.end = end;
          l.ended = true;
          l.owned = owned != 0;
          l.acted = end >= 0;
        }
      }
    }
  }
  return out;
}

// `a` was granted after `b`: a higher term, or a later start where there are no terms.
bool newer(const Leadership& a, const Leadership& b) {
  if (a.term != "-" && b.term != "-") return std::stoull(a.term) > std::stoull(b.term);
  return a.start > b.start;
}

// Terms reported by an observer, in order.
std::vector<std::string> observed_terms(const std::filesystem::path& file) {
  std::vector<std::string> out;
  for (const auto& line : lines_of(read_file(file))) {
    std::istringstream ls(line);
    std::string t, term;
    if (ls >> t >> term && t == "T") out.push_back(term);
  }
  return out;
}

class ElectionConformance : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override { target_ = GetParam().make({}); }
  std::unique_ptr<Target> target_;
};

TEST_P(ElectionConformance, OneLeaderAtATimeAndEveryObserverSeesTheSameLeaders) {
  TempDir dir("distlock-elect-conf");
  const auto log = dir.path() / "leaders.log";
  const auto stop = dir.path() / "stop", obs_stop = dir.path() / "obs-stop";
  const int observers = target_->fencing() ? kObservers : 0;
  const std::string url = target_->url();

  if (!target_->fencing()) {
    auto c = distlock::connect(url);
    try {
      c.election("elect-conf").observe(std::nullopt, 0ms);
      ADD_FAILURE() << "observe without fencing tokens must be refused";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), distlock::errc::not_supported) << e.what();
    }
  }

  std::vector<Process> obs;
  for (int i = 0; i < observers; ++i) {
    obs.push_back(
        Process::spawn({DISTLOCK_ELECTION_TOOL_PATH, "observe", "--url", url, "--name", "elect-conf", "--out",
                        (dir.path() / ("obs-" + std::to_string(i))).string(), "--stop", obs_stop.string()},
                       (dir.path() / ("obs-" + std::to_string(i) + ".err")).string()));
  }
  std::map<long, Process> campaigners;
  for (int i = 0; i < kCampaigners; ++i) {
    Process p = Process::spawn(
        {DISTLOCK_ELECTION_TOOL_PATH, "campaign", "--url", url, "--name", "elect-conf", "--log", log.string(),
         "--stop", stop.string(), "--ttl", std::to_string(kTtl.count()), "--obs-dir", dir.path().string(),
         "--observers", std::to_string(observers), "--hold-ms", "300"},
        (dir.path() / ("camp-" + std::to_string(i) + ".err")).string());
    const long pid = p.pid();
    campaigners.emplace(pid, std::move(p));
  }

  auto observed_by_all = [&](const std::string& term) {
    for (int i = 0; i < observers; ++i) {
      const auto seen = observed_terms(dir.path() / ("obs-" + std::to_string(i)));
      if (std::find(seen.begin(), seen.end(), term) == seen.end()) return false;
    }
    return true;
  };
  // The current leader once every observer reported it: of the leaderships without their E
  // line (but the killed one), the newest. An older one is a leader whose lease lapsed while
  // its process could not yet write its E line (see the file comment).
  long killed_pid = 0;  // its leadership stays open in the log
  auto current_reported = [&](Leadership& out) {
    const std::vector<Leadership> all = read_log(log);
    const Leadership* newest = nullptr;
    for (const auto& l : all) {
      if (l.ended || l.pid == killed_pid) continue;
      if (newest == nullptr || newer(l, *newest)) newest = &l;
    }
    if (newest == nullptr || !observed_by_all(newest->term)) return false;
    out = *newest;
    return true;
  };
  std::string diag;
  auto describe = [&] {
    diag = "log:\n" + read_file(log);
    for (int i = 0; i < observers; ++i)
      diag += "obs-" + std::to_string(i) + ":\n" + read_file(dir.path() / ("obs-" + std::to_string(i)));
    return diag;
  };

  // While the file `hold` exists no leader resigns (it may still lose its lease), so
  // the leader the test picks is still leading when it is killed or stopped.
  const auto hold = dir.path() / "hold";
  // 1. Two leaderships, then SIGKILL the current leader (reported by every observer).
  Leadership victim;
  ASSERT_TRUE(eventually([&] { return read_log(log).size() >= 2; }, 60s)) << describe();
  { std::ofstream(hold) << "x"; }
  ASSERT_TRUE(eventually([&] { return current_reported(victim); }, 60s)) << describe();
  std::int64_t killed_at = mono_ns();
  campaigners.at(victim.pid).signal(SIGKILL);
  campaigners.at(victim.pid).wait_for(10s);
  std::filesystem::remove(hold);
  killed_pid = victim.pid;
  const std::string killed_term = victim.term;

  // 2. The next leader, SIGSTOPped past its TTL until a newer leader starts (not on
  //    host-local locks, which a stopped process keeps).
  long stopped_pid = 0;
  if (target_->expires()) {
    Leadership paused;
    { std::ofstream(hold) << "x"; }
    ASSERT_TRUE(eventually([&] { return current_reported(paused); }, 60s)) << describe();
    stopped_pid = paused.pid;
    campaigners.at(stopped_pid).signal(SIGSTOP);
    const std::size_t before = read_log(log).size();
    EXPECT_TRUE(eventually([&] { return read_log(log).size() > before; }, kTtl + 15s))
        << "no new leader while the old one was stopped past its TTL\n"
        << describe();
    std::filesystem::remove(hold);
    campaigners.at(stopped_pid).signal(SIGCONT);
  }

  // 3. More leaderships, then stop; the last leader still waits for the observers.
  ASSERT_TRUE(eventually([&] { return read_log(log).size() >= kLeaders; }, 120s)) << describe();
  { std::ofstream(stop) << "x"; }
  for (auto& [pid, p] : campaigners) {
    if (pid == killed_pid) continue;
    const int st = p.wait_for(90s);
    EXPECT_NE(st, -1) << "campaigner " << pid << " did not stop\n" << describe();
  }
  { std::ofstream(obs_stop) << "x"; }
  for (auto& p : obs) EXPECT_NE(p.wait_for(30s), -1) << "observer did not stop";

  // Exactly one leader at any time.
  std::vector<Leadership> leaders = read_log(log);
  std::vector<Section> sections;
  for (auto& l : leaders) {
    if (!l.ended) {
      ASSERT_EQ(l.pid, killed_pid) << "a leadership without its end line that was not killed\n" << describe();
      ASSERT_EQ(l.term, killed_term);
      l.end = killed_at;
    }
    if (!l.acted) continue;  // no check said it held: it never acted as leader
    Section s;
    s.pid = l.pid;
    s.has_token = l.term != "-";
    if (s.has_token) s.token = std::stoull(l.term);
    s.start_ns = l.start;
    s.end_ns = l.end;
    s.owned_at_end = l.owned;
    sections.push_back(s);
  }
  std::sort(sections.begin(), sections.end(),
            [](const Section& a, const Section& b) { return a.start_ns < b.start_ns; });
  EXPECT_TRUE(no_overlap(sections)) << describe();
  if (target_->fencing()) {
    EXPECT_TRUE(tokens_increase(sections)) << describe();
  }
  if (stopped_pid != 0) {
    bool stopped_saw_loss = false;
    for (const auto& l : leaders) stopped_saw_loss |= l.pid == stopped_pid && !l.owned;
    EXPECT_TRUE(stopped_saw_loss) << "the leader stopped past its TTL did not see its loss\n" << describe();
  }

  // Every observer saw exactly the leaders, in order, once each, with their values.
  if (observers > 0) {
    // Every leadership that acted, in term order; one that never acted may be seen or not.
    std::vector<std::uint64_t> terms;
    std::set<std::string> never_acted;
    for (const auto& l : leaders) {
      if (l.acted) {
        terms.push_back(std::stoull(l.term));
      } else {
        never_acted.insert(l.term);
      }
    }
    std::sort(terms.begin(), terms.end());
    std::vector<std::string> expected;
    for (const auto t : terms) expected.push_back(std::to_string(t));
    for (int i = 0; i < observers; ++i) {
      const auto file = dir.path() / ("obs-" + std::to_string(i));
      const std::vector<std::string> seen = observed_terms(file);
      std::vector<std::string> seen_acted;
      for (std::size_t k = 0; k < seen.size(); ++k) {
        if (k > 0) {
          EXPECT_GT(std::stoull(seen[k]), std::stoull(seen[k - 1]))
              << "observer " << i << " reported terms out of order\n"
              << describe();
        }
        if (!never_acted.count(seen[k])) seen_acted.push_back(seen[k]);
      }
      EXPECT_EQ(seen_acted, expected) << "observer " << i << "\n" << describe();
      for (const auto& line : lines_of(read_file(file))) {
        std::istringstream ls(line);
        std::string t, term, value;
        ls >> t >> term >> value;
        // value "<pid>-<round>": the value of the leader holding that term.
        bool matches = false;
        for (const auto& l : leaders)
          matches |= l.term == term && value.rfind(std::to_string(l.pid) + "-", 0) == 0;
        EXPECT_TRUE(matches) << "observer " << i << " reported " << line;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ElectionConformance, ::testing::ValuesIn(kinds()),
                         [](const auto& param_info) { return param_info.param.label; });

}  // namespace

}  // namespace distlock::testing
