// A nemesis run per backend: worker processes (nemesis_worker) lock, write through a
// fence and release in a loop, while faults chosen by a seeded schedule hit them and
// their servers: a worker's network frozen, slowed or cut (a fault proxy per worker),
// a worker paused (SIGSTOP) or killed, a server paused or killed and restarted. The
// recorded history is then judged by check_history (history.hpp).
//
// Bounded: DISTLOCK_NEMESIS_SECONDS (default 20) of load per backend, every fault
// healed before the end, every process reaped. DISTLOCK_NEMESIS_SEED replays a
// schedule; the seed is printed in every run. scripts/nemesis.sh runs long soaks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nemesis/history.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#ifdef DISTLOCK_TEST_REDIS
#include "support/redis_server.hpp"
#endif
#ifdef DISTLOCK_TEST_REDISCLUSTER
#include "conformance/cluster_target.hpp"
#endif
#ifdef DISTLOCK_TEST_ETCD
#include "etcd/etcd_cluster.hpp"
#endif
#ifdef DISTLOCK_TEST_ZK
#include "zk/zk_server.hpp"
#endif

using namespace std::chrono_literals;
using distlock::testing::FaultProxyGroup;
using distlock::testing::Process;
using distlock::testing::TempDir;
using Steady = std::chrono::steady_clock;

namespace {

constexpr int kWorkers = 3;
constexpr int kThreads = 3;
constexpr long kTtlMs = 2000;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The servers of one backend and the faults that can hit them.
struct Servers {
  virtual ~Servers() = default;
  virtual std::vector<std::uint16_t> ports() = 0;  // empty: host-local, no network faults
  virtual std::string url_via(const std::string& hosts) = 0;
  virtual bool fencing() const { return true; }
  virtual int members() { return static_cast<int>(ports().size()); }
  virtual void pause(int member) = 0;
  virtual void resume(int member) = 0;
  virtual void kill_and_restart(int member) = 0;
};

#ifdef DISTLOCK_TEST_REDIS
struct RedisServers : Servers {
  explicit RedisServers(int n) {
    for (int i = 0; i < n; ++i) {
      // appendfsync always: a restarted server keeps its lock keys and fence counters,
      // the persistence the Redis and Redlock backends document as required.
      servers.push_back(std::make_unique<distlock::testing::RedisServer>(
          distlock::testing::RedisServerOptions{.appendonly = true}));
    }
  }
  std::vector<std::uint16_t> ports() override {
    std::vector<std::uint16_t> p;
    for (auto& s : servers) p.push_back(s->port());
    return p;
  }
  std::string url_via(const std::string& hosts) override {
    return (servers.size() == 1 ? "redis://" : "redlock://") + hosts;
  }
  bool fencing() const override { return servers.size() == 1; }
  void pause(int m) override { servers[m]->pause(); }
  void resume(int m) override { servers[m]->resume(); }
  void kill_and_restart(int m) override {
    servers[m]->kill();
    servers[m]->restart();
  }
  std::vector<std::unique_ptr<distlock::testing::RedisServer>> servers;
};
#endif

#ifdef DISTLOCK_TEST_ETCD
struct EtcdServers : Servers {
  EtcdServers() : cluster(3) {}
  std::vector<std::uint16_t> ports() override {
    std::vector<std::uint16_t> p;
    for (int i = 0; i < cluster.size(); ++i) p.push_back(cluster.client_port(i));
    return p;
  }
  std::string url_via(const std::string& hosts) override { return "etcd://" + hosts; }
  void pause(int m) override { cluster.pause(m); }
  void resume(int m) override { cluster.resume(m); }
  void kill_and_restart(int m) override {
    cluster.kill(m);
    cluster.restart(m);
  }
  distlock::testing::EtcdCluster cluster;
};
#endif

#ifdef DISTLOCK_TEST_ZK
struct ZkServers : Servers {
  ZkServers() : ensemble(3) {}
  std::vector<std::uint16_t> ports() override {
    std::vector<std::uint16_t> p;
    for (int i = 0; i < ensemble.size(); ++i) p.push_back(ensemble.server(i).port());
    return p;
  }
  std::string url_via(const std::string& hosts) override { return "zk://" + hosts + "?session_timeout=2s"; }
  void pause(int m) override { ensemble.server(m).pause(); }
  void resume(int m) override { ensemble.server(m).resume(); }
  void kill_and_restart(int m) override {
    ensemble.server(m).kill();
    ensemble.server(m).start();
  }
  distlock::testing::ZkEnsemble ensemble;
};
#endif

struct FileServers : Servers {
  std::vector<std::uint16_t> ports() override { return {}; }
  std::string url_via(const std::string&) override { return "file://" + dir.path().string(); }
  int members() override { return 0; }
  void pause(int) override {}
  void resume(int) override {}
  void kill_and_restart(int) override {}
  TempDir dir{"distlock-nemesis-file"};
};

struct Backend {
  std::string label;
  std::function<std::unique_ptr<Servers>()> make;
};

void PrintTo(const Backend& b, std::ostream* os) {
  *os << b.label;
}

std::vector<Backend> backends() {
  std::vector<Backend> b;
  b.push_back({"file", [] { return std::make_unique<FileServers>(); }});
#ifdef DISTLOCK_TEST_REDIS
  b.push_back({"redis", [] { return std::make_unique<RedisServers>(1); }});
#endif
#ifdef DISTLOCK_TEST_REDLOCK
  b.push_back({"redlock3", [] { return std::make_unique<RedisServers>(3); }});
#endif
#ifdef DISTLOCK_TEST_REDISCLUSTER
  b.push_back(
      {"rediscluster3", [] { return std::make_unique<distlock::testing::RedisClusterServers<Servers>>(); }});
#endif
#ifdef DISTLOCK_TEST_ETCD
  b.push_back({"etcd3", [] { return std::make_unique<EtcdServers>(); }});
#endif
#ifdef DISTLOCK_TEST_ZK
  b.push_back({"zk3", [] { return std::make_unique<ZkServers>(); }});
#endif
  return b;
}

class Nemesis : public ::testing::TestWithParam<Backend> {};

TEST_P(Nemesis, HistoryHasNoViolations) {
  const int seconds = env_int("DISTLOCK_NEMESIS_SECONDS", 20);
  const unsigned seed = static_cast<unsigned>(
      env_int("DISTLOCK_NEMESIS_SEED", static_cast<int>(std::random_device{}() & 0x7fffffff)));
  std::printf("nemesis %s: seed %u, %d s (replay: DISTLOCK_NEMESIS_SEED=%u)\n", GetParam().label.c_str(),
              seed, seconds, seed);
  std::mt19937 rng(seed);
  auto servers = GetParam().make();
  TempDir dir("distlock-nemesis");
  const std::string history = (dir.path() / "history").string();
  const std::string fence = (dir.path() / "fence").string();
  const std::string worker_bin = (distlock::testing::self_dir() / "nemesis_worker").string();

  std::vector<std::unique_ptr<FaultProxyGroup>> nets;
  std::vector<Process> workers;
  std::vector<std::string> urls;
  const auto ports = servers->ports();
  for (int i = 0; i < kWorkers; ++i) {
    if (!ports.empty()) {
      nets.push_back(std::make_unique<FaultProxyGroup>(ports));
      urls.push_back(servers->url_via(nets.back()->hosts()));
    } else {
      urls.push_back(servers->url_via(""));
    }
  }
  const auto end = Steady::now() + std::chrono::seconds(seconds);
  auto spawn = [&](int i) {
    const auto left = std::chrono::duration_cast<std::chrono::seconds>(end - Steady::now()).count();
    return Process::spawn(
        {worker_bin, urls[i], "nemesis", history, fence, std::to_string(kThreads),
         std::to_string(std::max<long>(1, left)), std::to_string(kTtlMs), std::to_string(seed + i)},
        (dir.path() / ("worker" + std::to_string(i) + ".log")).string());
  };
  for (int i = 0; i < kWorkers; ++i) workers.push_back(spawn(i));

  // The schedule: one fault at a time, each healed before the next; the last 3 s are quiet.
  std::vector<std::string> faults;
  auto ms = [&](int lo, int hi) {
    return std::chrono::milliseconds(lo + static_cast<int>(rng() % (hi - lo + 1)));
  };
  while (Steady::now() + 3s < end) {
    std::this_thread::sleep_for(ms(100, 400));
    const int w = static_cast<int>(rng() % kWorkers);
    const int kind = static_cast<int>(rng() % 8);
    // Half the faults outlast the TTL, so holders do lose leases.
    const auto d = ms(200, 2 * static_cast<int>(kTtlMs) + 500);
    const bool net = !nets.empty();
    const int members = servers->members();
    std::string what;
    if (kind == 0 && net) {
      what = "freeze worker " + std::to_string(w);
      nets[w]->freeze_all();
      std::this_thread::sleep_for(d);
      nets[w]->pass_all();
    } else if (kind == 1 && net) {
      what = "delay worker " + std::to_string(w);
      for (std::size_t p = 0; p < nets[w]->size(); ++p) nets[w]->at(p).delay(ms(5, 150), ms(0, 100));
      std::this_thread::sleep_for(d);
      nets[w]->pass_all();
    } else if (kind == 2 && net) {
      what = "drop worker " + std::to_string(w);
      nets[w]->drop_all();
      std::this_thread::sleep_for(d);
      nets[w]->pass_all();
    } else if (kind == 3 && members > 0) {
      const int m = static_cast<int>(rng() % members);
      what = "pause server " + std::to_string(m);
      servers->pause(m);
      std::this_thread::sleep_for(d);
      servers->resume(m);
    } else if (kind == 4 && members > 0) {
      const int m = static_cast<int>(rng() % members);
      what = "kill and restart server " + std::to_string(m);
      servers->kill_and_restart(m);
    } else if (kind == 7 && net) {
      // Every worker cut off at once: whoever holds the lock must lose it.
      what = "freeze every worker";
      for (auto& n : nets) n->freeze_all();
      std::this_thread::sleep_for(d);
      for (auto& n : nets) n->pass_all();
    } else if (kind == 5) {
      what = "kill worker " + std::to_string(w);
      workers[w].signal(SIGKILL);
      workers[w].wait_for(10s);
      workers[w] = spawn(w);
    } else {
      what = "pause worker " + std::to_string(w);
      workers[w].signal(SIGSTOP);
      std::this_thread::sleep_for(d);
      workers[w].signal(SIGCONT);
    }
    faults.push_back(what + " for " + std::to_string(d.count()) + " ms");
  }
  for (auto& n : nets) n->pass_all();
  std::vector<std::string> hung;
  for (int i = 0; i < kWorkers; ++i) {
    workers[i].signal(SIGCONT);
    const int status = workers[i].wait_for(std::chrono::seconds(30));
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      hung.push_back(
          "worker " + std::to_string(i) + " status " + std::to_string(status) + ": " +
          distlock::testing::read_file((dir.path() / ("worker" + std::to_string(i) + ".log")).string()));
    }
  }

  const auto h = distlock::nemesis::parse_history(history);
  const auto violations = distlock::nemesis::check_history(h, servers->fencing());
  long applied = 0, stale = 0, losses = 0;
  for (const auto& w : h.writes) (w.status == "applied" ? applied : stale) += (w.status != "error");
  for (const auto& s : h.sections) losses += s.lost_at >= 0;
  std::printf(
      "{\"nemesis\":\"%s\",\"seed\":%u,\"seconds\":%d,\"faults\":%zu,\"sections\":%zu,\"acquire_errors\":%ld,"
      "\"writes_applied\":%ld,\"writes_rejected\":%ld,\"losses_signalled\":%ld,\"violations\":%zu}\n",
      GetParam().label.c_str(), seed, seconds, faults.size(), h.sections.size(), h.acquire_errors, applied,
      stale, losses, violations.size() + hung.size());
  RecordProperty("seed", static_cast<int>(seed));
  if (const char* keep = std::getenv("DISTLOCK_NEMESIS_KEEP"); keep != nullptr && *keep) {
    std::filesystem::copy_file(history, keep, std::filesystem::copy_options::overwrite_existing);
  }
  if (std::getenv("DISTLOCK_NEMESIS_VERBOSE") != nullptr) {
    for (const auto& f : faults) std::printf("fault: %s\n", f.c_str());
  }
  EXPECT_GT(h.sections.size(), 10u) << "the workers made no progress";
  for (const auto& v : hung) ADD_FAILURE() << "incomplete: " << v << " (seed " << seed << ")";
  for (std::size_t i = 0; i < violations.size() && i < 5; ++i) {
    std::string sched;
    for (const auto& f : faults) sched += "  " + f + "\n";
    ADD_FAILURE() << violations[i].kind << ": " << violations[i].what << " (seed " << seed
                  << ")\nhistory near it:\n"
                  << distlock::nemesis::slice(h, violations[i].at, 3'000'000'000LL) << "faults:\n"
                  << sched;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Nemesis, ::testing::ValuesIn(backends()),
                         [](const ::testing::TestParamInfo<Backend>& p) { return p.param.label; });

// The checker must be able to fail: hand-made histories with each violation.
class HistoryChecker : public ::testing::Test {
 protected:
  std::vector<distlock::nemesis::Violation> check(const std::string& text, bool fencing = true) {
    TempDir d("distlock-history");
    const std::string path = (d.path() / "h").string();
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    return distlock::nemesis::check_history(distlock::nemesis::parse_history(path), fencing);
  }
};

TEST_F(HistoryChecker, ACleanHistoryPasses) {
  EXPECT_TRUE(check("A 1 1 1 5 1000000000000\nO 1 1 1 1000000000100\nW 1 1 1 5 1000000000150 applied\n"
                    "E 1 1 1 1000000000200 ok 0\nA 2 2 1 6 1000000000300\nO 2 2 1 1000000000400\n"
                    "E 2 2 1 1000000000500 ok 0\n")
                  .empty());
}

TEST_F(HistoryChecker, OverlappingBeliefsAreCaught) {
  auto v = check(
      "A 1 1 1 5 1000000000000\nA 2 2 1 6 1000000000100\nO 1 1 1 1000000000200\nO 2 2 1 1000000000300\n");
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0].kind, "overlap");
}

TEST_F(HistoryChecker, RepeatedAndBackwardTokensAreCaught) {
  auto v = check(
      "A 1 1 1 5 1000000000000\nO 1 1 1 1000000000010\nA 2 2 1 5 1000000000100\nO 2 2 1 1000000000110\n"
      "A 3 3 1 4 1000000000200\nO 3 3 1 1000000000210\n");
  ASSERT_GE(v.size(), 2u);
  for (const auto& x : v) EXPECT_EQ(x.kind, "token");
  EXPECT_TRUE(check("A 1 1 1 0 1000000000000\nO 1 1 1 1000000000010\nA 2 2 1 0 1000000000100\n"
                    "O 2 2 1 1000000000110\n",
                    /*fencing=*/false)
                  .empty());
}

TEST_F(HistoryChecker, StaleWritesAndSilentLossesAreCaught) {
  auto v = check("W 1 1 1 6 1000000000000 applied\nW 2 2 1 5 1000000000100 applied\n");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, "stale-write");
  v = check("A 1 1 1 5 1000000000000\nE 1 1 1 1000000000100 lost 0\n");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, "silent-loss");
}

}  // namespace
