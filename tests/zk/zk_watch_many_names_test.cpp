// A zk:// watch over names that share prefixes ("mn/a", "mn/a1", "mn/a/b", "mn/ab"), each
// handed back and forth unpaced by two clients at once (src/zk/zk_watch.cpp): per name, every
// acquisition a holder made is either reported `acquired` or covered by a gap (naming the
// name, or every name) that comes between the reported acquisitions around it; tokens go up.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

TEST(ZkWatchManyNames, EveryAcquisitionReportedOrCoveredByAGap) {
  auto& zk = shared_server();
  const std::string q = "?session_timeout=10s";
  const std::vector<std::string> names{"mn/a", "mn/a1", "mn/a/b", "mn/ab"};
  Client watcher = distlock::connect(zk.url(q), distlock::testing::quiet());
  distlock::Watch w = watcher.watch("mn/");
  std::mutex mu;
  std::map<std::string, std::set<std::uint64_t>> taken;  // by the holders
  std::atomic<bool> stop{false};
  std::vector<std::thread> holders;
  std::vector<Client> clients;
  for (std::size_t i = 0; i < names.size() * 2; ++i)
    clients.push_back(distlock::connect(zk.url(q), distlock::testing::quiet()));
  // Each holder: at most 40 acquisitions or 4 s (steady clock), whichever first.
  const auto until = SteadyClock::now() + 4s;
  for (std::size_t i = 0; i < clients.size(); ++i) {
    holders.emplace_back([&, i] {
      const std::string& name = names[i / 2];
      distlock::LockOptions o;
      o.ttl = Millis(10000);
      o.wait = Millis(10000);
      for (int n = 0; n < 40 && SteadyClock::now() < until; ++n) {
        auto l = clients[i].acquire(name, o);
        {
          std::lock_guard lk(mu);
          taken[name].insert(l.token());
        }
        l.release();
      }
    });
  }
  // Events per name, in order: acquired tokens and gaps (0 = gap).
  std::map<std::string, std::vector<std::uint64_t>> stream;
  std::vector<std::string> problems;
  std::map<std::string, std::uint64_t> last;
  std::vector<std::string> log;  // every event, for a failure's message
  auto take = [&](const WatchEvent& e) {
    log.push_back(std::string(distlock::to_string(e.kind)) + " " + e.name + " " + std::to_string(e.token) +
                  (e.held ? " held" : "") + (e.inferred ? " inferred" : "") + " [" + e.detail + "]");
    if (e.kind == WatchEventKind::gap) {
      for (const auto& n : names)
        if (e.gap_names.empty() || std::find(e.gap_names.begin(), e.gap_names.end(), n) != e.gap_names.end())
          stream[n].push_back(0);
      return;
    }
    if (e.kind == WatchEventKind::state) {
      if (e.held) last[e.name] = std::max(last[e.name], e.token);
      return;
    }
    if (e.kind != WatchEventKind::acquired) return;
    if (e.token <= last[e.name])
      problems.push_back(e.name + ": token went back to " + std::to_string(e.token));
    last[e.name] = e.token;
    stream[e.name].push_back(e.token);
  };
  std::thread consumer([&] {
    while (!stop.load()) {
      auto e = w.next(100ms);
      if (!e) continue;
      std::lock_guard lk(mu);
      take(*e);
    }
  });
  for (auto& t : holders) t.join();
  // Drain: the watch has read every directory once its stream holds each name's last token.
  std::map<std::string, std::uint64_t> final_token;
  for (const auto& n : names) final_token[n] = taken[n].empty() ? 0 : *taken[n].rbegin();
  (void)distlock::testing::eventually(
      [&] {
        std::lock_guard lk(mu);
        return std::all_of(names.begin(), names.end(), [&](const std::string& n) {
          return !stream[n].empty() && (stream[n].back() >= final_token[n] || stream[n].back() == 0);
        });
      },
      20s);
  stop.store(true);
  consumer.join();
  int reported = 0, covered = 0, total = 0;
  for (const auto& n : names) {
    const auto& s = stream[n];
    for (std::uint64_t t : taken[n]) {
      ++total;
      if (std::find(s.begin(), s.end(), t) != s.end()) {
        ++reported;
        continue;
      }
      // A gap between the last reported acquisition before t and the first after it.
      bool gap = false;
      bool after_prev = true;
      for (std::size_t k = 0; k < s.size(); ++k) {
        if (s[k] != 0 && s[k] < t) after_prev = true, gap = false;
        if (s[k] == 0 && after_prev) gap = true;
        if (s[k] != 0 && s[k] > t) break;
      }
      if (gap)
        ++covered;
      else {
        std::string around;
        for (std::uint64_t x : s) around += x == 0 ? std::string(" gap") : " " + std::to_string(x);
        problems.push_back(n + ": token " + std::to_string(t) +
                           " neither reported nor covered by a gap; stream:" + around);
      }
    }
  }
  std::printf("%d acquisitions over %zu names: %d reported, %d covered by a gap\n", total, names.size(),
              reported, covered);
  EXPECT_GT(total, 0);
  for (const auto& p : problems) ADD_FAILURE() << p;
  if (!problems.empty() && std::getenv("ZK_WATCH_LOG") != nullptr)
    for (const auto& l : log) std::printf("%s\n", l.c_str());
}

}  // namespace
}  // namespace distlock::testing
