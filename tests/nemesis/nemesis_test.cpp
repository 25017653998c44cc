// A nemesis run per backend: worker processes (nemesis_worker) take a mutex, a
// semaphore, a read-write lock and an election in a loop, writing through a fence
// while they hold the mutex, and are members of a shard group writing each owned shard
// through its fence; a seeded fault schedule strikes them and their servers. Most
// faults are aimed at the process that holds the mutex right now (read from the history
// as it is written): its network frozen or cut, the process stopped (SIGSTOP) past its
// TTL, killed, or its clock skewed a TTL forward; the others pause a server member, cut
// it off from its peers (etcd3, zk3), kill and restart it with its data, or without it
// where the guarantee survives that (etcd3 and zk3: the quorum keeps the data; redlock3:
// restarted after 1.2 max TTL), or strike a random worker.
// The recorded histories are then judged by history.hpp's checkers; the shard group's also
// against the fault windows (when each fault struck, when it was healed, which worker it
// struck): no shard may stay unowned past the bound while a member lives (UnownedBound), and
// a member that leaves gracefully (every 2-6 s) must have its shards taken within one period.
//
// A run must bite: with leases that expire (every backend but file://) it fails
// unless the mutex's holders signalled at least ceil(30 * SECONDS / 60) losses, and
// with fencing tokens unless the fence rejected at least ceil(15 * SECONDS / 60) stale
// writes (the 60 s figures of docs/testing.md, scaled to the run's length); and the
// same writes, sent unfenced to a second register, must leave stale writes there that
// the checker reports (the checker's control).
//
// Bounded: DISTLOCK_NEMESIS_SECONDS (default 40) of load per backend, every fault
// healed before the end, every process reaped. DISTLOCK_NEMESIS_SEED replays a
// schedule (the same faults, durations and gaps; which process holds the lock when a
// fault strikes is up to timing); the seed is printed in every run. scripts/nemesis.sh
// runs long soaks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stop_token>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "distlock/distlock.hpp"
#include "nemesis/history.hpp"
#include "support/backend_targets.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"

namespace distlock::testing {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace {

constexpr int kWorkers = 3;
constexpr int kMutexes = 4;  // names nemesis-0..3, one thread per name in each worker
constexpr long kTtlMs = 1000;
constexpr int kPermits = 2;           // nemesis_worker's semaphore
constexpr int kShards = 6;            // nemesis_worker's shard group "nemesis-shards"
constexpr long kShardPeriodMs = 200;  // its rebalance period
// The margins of the unowned-shard bound (history.hpp, UnownedBound; docs/testing.md): a
// hand-over with no fault near may take one period plus kHandoverMarginMs (round trips of a
// list, a release and an acquisition, and the worker's 20-40 ms polling of assigned(), on a
// shared 2-core machine); after a fault, one TTL plus one period plus kFaultMarginMs (a
// reconnection: the client's connect and command timeouts are 500 ms each).
// 1300 ms: first 500, which a CI run broke with a quiet 919-ms hand-over after a leave on etcd3
// (seed 1515620023, while two other tests ran beside it: step 1 of scripts/test.sh runs three at
// a time); the longest quiet gap of 31 runs one backend at a time had been 417 ms.
// 2000 ms: then 1300, which a run beside two CPU hogs and another test broke on etcd3 (seed
// 1238935381): two shards given up in one rebalance at the same moment, released 580 ms later by
// their giver (its polling of assigned() starved) and taken 1.1 s after that, 1682 and 1692 ms
// without an owner; the same seed then passed 3 of 3 runs beside two hogs with 841-1019 ms of
// slack. A liveness margin on a starved machine, not a safety bound: every safety check of the
// run is unchanged, and the JSON line still reports the longest quiet gap.
constexpr long kHandoverMarginMs = 2000;
constexpr long kFaultMarginMs = 1000;

std::int64_t mono_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The wall clock less the monotonic one, in ns: a step of the machine's wall clock (a time
// sync) changes it. Redis expires keys by its wall clock (docs/design.md: the server's clock
// runs at the client's rate within the margin), so a forward step ends leases early.
std::int64_t wall_minus_mono() {
  timespec wall{};
  ::clock_gettime(CLOCK_REALTIME, &wall);
  return static_cast<std::int64_t>(wall.tv_sec) * 1'000'000'000 + wall.tv_nsec - mono_now();
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::vector<Kind> nemesis_kinds() {
  std::vector<Kind> out;
  for (auto& k : kinds()) {
    if (k.in_nemesis) out.push_back(std::move(k));
  }
  return out;
}

// Follows the mutexes' history files as they grow: which sections are open (acquired,
// not lost, not released) and by which process.
class HolderWatch {
 public:
  explicit HolderWatch(std::vector<std::string> paths)
      : paths_(std::move(paths)), offsets_(paths_.size(), 0) {}
  // The pid with the most open sections (the most recent acquisition breaks a tie), 0
  // if none: the process a fault there strikes hardest.
  pid_t holder() {
    for (std::size_t f = 0; f < paths_.size(); ++f) {
      std::ifstream in(paths_[f]);
      in.seekg(offsets_[f]);
      std::string line;
      while (std::getline(in, line)) {
        if (in.eof()) break;  // a line still being written: read it next time
        offsets_[f] += static_cast<std::streamoff>(line.size() + 1);
        std::istringstream ls(line);
        std::string kind;
        long pid = 0, tid = 0, seq = 0;
        if (!(ls >> kind >> pid >> tid >> seq) || kind == "X") continue;
        const auto key = std::make_tuple(pid, tid, seq);
        if (kind == "A") {
          open_[key] = ++order_;
        } else if (kind == "L" || kind == "E") {
          open_.erase(key);
        }
      }
    }
    std::map<long, std::pair<int, long>> per_pid;  // pid -> (open sections, latest)
    for (const auto& [k, o] : open_) {
      auto& e = per_pid[std::get<0>(k)];
      ++e.first;
      e.second = std::max(e.second, o);
    }
    pid_t pid = 0;
    std::pair<int, long> best{0, 0};
    for (const auto& [p, e] : per_pid) {
      if (e > best) {
        best = e;
        pid = static_cast<pid_t>(p);
      }
    }
    return pid;
  }
  // A killed process's sections end without an E line.
  void forget(pid_t pid) {
    std::erase_if(open_, [pid](const auto& e) { return std::get<0>(e.first) == pid; });
  }

 private:
  std::vector<std::string> paths_;
  std::vector<std::streamoff> offsets_;
  long order_ = 0;
  std::map<std::tuple<long, long, long>, long> open_;
};

// A witness of the servers' availability, apart from the workers and their proxies: a client
// of the driver's own, on the servers' own address, takes and releases a lock every 100 ms
// (each attempt bounded by the 500 ms command timeout and a 500 ms wait). A stretch in which it
// could not, or took longer than kWitnessSlowMs, from the first failed attempt to the next success, is one in
// which no member could reach the servers either, whatever the schedule did (a ZooKeeper ensemble electing a
// leader after a member's restart, a starved server): the unowned-shard check counts it as a fault at every
// worker. Stopped (and joined) by stop(); every window closed by then.
constexpr long kWitnessSlowMs = 250;

class ServerWitness {
 public:
  ServerWitness(std::string url, std::chrono::milliseconds ttl)
      : thread_([this, url = std::move(url), ttl](std::stop_token st) { run(st, url, ttl); }) {}
  ~ServerWitness() { stop(); }
  std::vector<distlock::nemesis::FaultWindow> stop() {
    if (thread_.joinable()) {
      thread_.request_stop();
      thread_.join();
    }
    return windows_;
  }

 private:
  void run(const std::stop_token& st, const std::string& url, std::chrono::milliseconds ttl) {
    distlock::ClientOptions o;
    o.command_timeout = 500ms;
    o.connect_timeout = 500ms;
    std::optional<distlock::Client> client;
    std::int64_t down_since = -1;
    long n = 0;
    while (!st.stop_requested()) {
      const std::int64_t t0 = mono_now();
      bool ok = false;
      std::error_code ec;
      if (!client) {
        auto c = distlock::connect(url, o, ec);
        if (!ec) client = std::move(c);
      }
      if (client) {
        distlock::LockOptions lo;
        lo.ttl = ttl;
        lo.wait = 500ms;
        // A name per attempt (64 in turn): a release that failed leaves no lock in the way.
        distlock::Lease lease = client->acquire("nemesis-witness-" + std::to_string(n++ % 64), lo, ec);
        if (!ec) {
          lease.release(ec);
          ok = !ec;
        }
      }
      // An attempt slower than kWitnessSlowMs counts as an outage too: a renewal that waits that
      // long for a server (redis+cluster: 250 ms per node) gives the lease up.
      ok = ok && mono_now() - t0 < kWitnessSlowMs * 1'000'000;
      if (!ok && down_since < 0) down_since = t0;
      if (ok && down_since >= 0) {
        windows_.push_back({down_since, mono_now(), "the servers did not answer a client of their own", -1});
        down_since = -1;
      }
      std::this_thread::sleep_for(100ms);
    }
    if (down_since >= 0) {
      windows_.push_back({down_since, mono_now(), "the servers did not answer a client of their own", -1});
    }
  }
  std::vector<distlock::nemesis::FaultWindow> windows_;
  std::jthread thread_;  // last: started once windows_ exists
};

std::string read_text(const std::filesystem::path& p) {
  return read_file(p.string());
}

class Nemesis : public ::testing::TestWithParam<Kind> {};

TEST_P(Nemesis, HistoryHasNoViolations) {
  const int seconds = env_int("DISTLOCK_NEMESIS_SECONDS", 40);
  const unsigned seed = static_cast<unsigned>(
      env_int("DISTLOCK_NEMESIS_SEED", static_cast<int>(std::random_device{}() & 0x7fffffff)));
  std::printf("nemesis %s: seed %u, %d s (replay: DISTLOCK_NEMESIS_SEED=%u DISTLOCK_NEMESIS_SECONDS=%d)\n",
              GetParam().label.c_str(), seed, seconds, seed, seconds);
  std::mt19937 rng(seed);
  // Durable servers (Redis: appendfsync always) keep locks and fence counters across a
  // kill and restart; Redlock keeps its default per-master timeout.
  // Members of a cluster reach each other through fault proxies, so that a member can be
  // cut off from its peers.
  auto servers = GetParam().make({.durable = true, .redlock_query = "", .peer_proxies = true});
  TempDir dir("distlock-nemesis");
  const auto file = [&](const std::string& name) { return (dir.path() / name).string(); };
  const std::string worker_bin = (self_dir() / "nemesis_worker").string();

  std::vector<std::unique_ptr<FaultProxyGroup>> nets;
  std::vector<Process> workers;
  std::vector<std::string> urls;
  std::vector<int> incarnation(kWorkers, 0);
  const auto ports = servers->ports();
  for (int i = 0; i < kWorkers; ++i) {
    if (!ports.empty()) {
      nets.push_back(std::make_unique<FaultProxyGroup>(ports));
      urls.push_back(servers->url_via(nets.back()->hosts()));
    } else {
      urls.push_back(servers->url_via(""));
    }
    // A zk:// lease lasts its session (the target asks for 2 s): the run asks for a
    // session of its TTL, so that a fault of 1.2 TTL outlasts every backend's lease.
    const std::string zk_session = "session_timeout=2s";
    if (auto at = urls.back().find(zk_session);
        urls.back().rfind("zk://", 0) == 0 && at != std::string::npos) {
      urls.back().replace(at, zk_session.size(), "session_timeout=" + std::to_string(kTtlMs) + "ms");
    }
  }
  ServerWitness witness(servers->url(), std::chrono::milliseconds(kTtlMs));
  const std::int64_t start_ns = mono_now();
  const auto end = Steady::now() + std::chrono::seconds(seconds);
  // The histories' clock at the end: the unowned-shard check runs to here (the members
  // leave after it).
  const std::int64_t end_ns = start_ns + static_cast<std::int64_t>(seconds) * 1'000'000'000;
  auto spawn = [&](int i) {
    // A worker started after a kill runs to the same end (a fraction of a second is kept).
    const double left = std::chrono::duration<double>(end - Steady::now()).count();
    return Process::spawn({worker_bin, urls[i], dir.path().string(), std::to_string(std::max(1.0, left)),
                           std::to_string(kTtlMs), std::to_string(seed + 1000u * incarnation[i]++ + i),
                           std::to_string(kMutexes), "mutex,sem,rw,elect,shards"},
                          file("worker" + std::to_string(i) + ".log"));
  };
  std::map<long, int> worker_of_pid;  // every process a worker was, for the unowned-shard check
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(spawn(i));
    worker_of_pid[workers.back().pid()] = i;
  }
  std::vector<std::string> mutex_files;
  for (int k = 0; k < kMutexes; ++k) mutex_files.push_back(file("mutex" + std::to_string(k) + ".history"));
  HolderWatch watch(mutex_files);
  // The worker (index) that holds the mutex now; waits up to 1 s for one. -1: none.
  auto holder = [&]() -> int {
    const auto until = Steady::now() + 1s;
    do {
      const pid_t pid = watch.holder();
      for (int i = 0; i < kWorkers && pid != 0; ++i) {
        if (workers[i].pid() == pid) return i;
      }
      std::this_thread::sleep_for(10ms);
    } while (Steady::now() < until);
    return -1;
  };

  // The schedule: one fault at a time, each healed before the next; the last 3 s are
  // quiet. Every step draws the same numbers whatever it does, so a seed gives the same
  // sequence of faults, durations and gaps.
  std::vector<std::string> faults;
  // When each fault struck and was healed, for the unowned-shard check.
  std::vector<distlock::nemesis::FaultWindow> windows;
  int holder_faults = 0;
  const int ttl = static_cast<int>(kTtlMs);
  // Where the target has them, the 5th fault cuts a member off from its peers and the
  // 10th wipes one (a 40 s run plays about 22 faults), whatever the roll, so that every
  // run has both; the roll can draw more (wipes: up to one per 40 s of run).
  int step = 0;
  // An etcd member's rejoin takes about 7 s with no other fault meanwhile: one wipe per
  // 40 s of run keeps the holder faults that make the run bite.
  int wipes = 0;
  const int max_wipes = std::max(1, seconds / 40);
  // How long the schedule waited for a killed server to serve again (a wipe's rejoin, a
  // restart): one fault at a time, so no holder can be struck meanwhile. On a busy machine an
  // etcd member's rejoin can take 20 s of a 40 s run; the bite is asked of the rest.
  auto server_wait = std::chrono::milliseconds(0);
  // Runs a server operation that returns once the server serves again; adds its time to
  // server_wait and returns it.
  auto until_serving = [&](auto&& operation) {
    const auto t0 = Steady::now();
    operation();
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - t0);
    server_wait += took;
    return took;
  };
  // The largest step of the machine's wall clock against the monotonic one seen between faults
  // (a CI machine's time sync once stepped it 49 s forward in a run, and a Redis lock expired at
  // once: two holders, outside the documented assumption). Named in every failure.
  const std::int64_t wall_offset = wall_minus_mono();
  std::int64_t wall_step_ns = 0;
  while (Steady::now() + 3s < end) {
    wall_step_ns = std::max<std::int64_t>(wall_step_ns, std::llabs(wall_minus_mono() - wall_offset));
    const auto gap = std::chrono::milliseconds(100 + rng() % 201);
    const int drawn = static_cast<int>(rng() % 100);
    ++step;
    const int roll = step == 5 ? 72 : step == 10 ? 80 : drawn;
    // Faults aimed at a holder outlast its TTL: 1.2 to 1.8 TTL.
    const auto d = std::chrono::milliseconds(ttl * 12 / 10 + static_cast<int>(rng() % (ttl * 6 / 10 + 1)));
    const int random_worker = static_cast<int>(rng() % kWorkers);
    const int member_pick = static_cast<int>(rng() % 1024);
    const auto latency = std::chrono::milliseconds(5 + rng() % 146);
    std::this_thread::sleep_for(gap);
    std::int64_t struck = mono_now();
    int struck_worker = -1;  // -1: every worker, or the servers
    bool slowed = false;
    const bool net = !nets.empty();
    const int members = servers->members();
    std::string what;
    bool timed = true;  // false: the fault is over at once (a kill)
    if (roll < 72) {
      // At the holder: 0-17 freeze its network, 18-35 cut it, 36-53 stop it, 54-62 kill
      // it, 63-71 skew its clock (where a fault is not possible here: stop it).
      const int w = holder();
      if (w < 0) {
        faults.push_back("no holder within 1 s");
        continue;
      }
      struck = mono_now();
      struck_worker = w;
      ++holder_faults;
      const std::string who = "holder (worker " + std::to_string(w) + ")";
      if (roll < 18 && net) {
        what = "freeze " + who;
        nets[w]->freeze_all();
        std::this_thread::sleep_for(d);
        nets[w]->pass_all();
      } else if (roll < 36 && net) {
        what = "cut " + who;
        nets[w]->drop_all();
        std::this_thread::sleep_for(d);
        nets[w]->pass_all();
      } else if (roll >= 54 && roll < 63) {
        what = "kill " + who;
        timed = false;
        workers[w].signal(SIGKILL);
        workers[w].wait_for(10s);
        watch.forget(workers[w].pid());
        workers[w] = spawn(w);
        worker_of_pid[workers[w].pid()] = w;
      } else if (roll >= 63) {
        // The clock jumps one TTL forward; the holder must give up at once.
        what = "skew the clock of " + who + ", then wait";
        workers[w].signal(SIGUSR1);
        std::this_thread::sleep_for(d);
      } else {
        what = "stop " + who;
        workers[w].signal(SIGSTOP);
        std::this_thread::sleep_for(d);
        workers[w].signal(SIGCONT);
      }
    } else if (roll < 76 && members > 1 && servers->isolate(member_pick % members)) {
      // A member cut off from its peers (its clients still reach it).
      what = "cut server " + std::to_string(member_pick % members) + " off from its peers";
      std::this_thread::sleep_for(d);
      servers->heal();
    } else if (roll < 80 && members > 0) {
      const int m = member_pick % members;
      what = "pause server " + std::to_string(m);
      servers->pause(m);
      std::this_thread::sleep_for(d);
      servers->resume(m);
    } else if (roll < 83 && members > 0 && servers->survives_wipe() && wipes < max_wipes) {
      ++wipes;
      // Restarted without its data, where the guarantee does not need it: the quorum
      // keeps it (zk3), or the member stays down until its locks have expired (redlock3).
      const int m = member_pick % members;
      const auto down = servers->wipe_down_for(std::chrono::milliseconds(kTtlMs));
      const auto took = until_serving([&] { servers->wipe_and_restart(m, down); });
      what = "kill server " + std::to_string(m) + ", delete its data, restart it after " +
             std::to_string(down.count()) + " ms (serving again " + std::to_string(took.count()) +
             " ms after the kill)";
      timed = false;
    } else if (roll < 86 && members > 0) {
      const int m = member_pick % members;
      timed = false;
      const auto took = until_serving([&] { servers->kill_and_restart(m); });
      what = "kill and restart server " + std::to_string(m) + " (with its data; serving again " +
             std::to_string(took.count()) + " ms after the kill)";
    } else if (roll < 93 && net) {
      const int w = random_worker;
      what = "delay worker " + std::to_string(w);
      struck_worker = w;
      slowed = true;
      for (std::size_t p = 0; p < nets[w]->size(); ++p) nets[w]->at(p).delay(latency, latency / 2);
      std::this_thread::sleep_for(d);
      nets[w]->pass_all();
    } else if (net && roll < 96) {
      // Every worker cut off at once: whoever holds the lock must lose it.
      what = "freeze every worker";
      for (auto& n : nets) n->freeze_all();
      std::this_thread::sleep_for(d);
      for (auto& n : nets) n->pass_all();
    } else {
      const int w = random_worker;
      what = "stop worker " + std::to_string(w);
      struck_worker = w;
      workers[w].signal(SIGSTOP);
      std::this_thread::sleep_for(d);
      workers[w].signal(SIGCONT);
    }
    faults.push_back(timed ? what + " for " + std::to_string(d.count()) + " ms" : what);
    windows.push_back({struck, mono_now(), faults.back(), struck_worker, slowed});
  }
  for (auto& n : nets) n->pass_all();
  const std::vector<distlock::nemesis::FaultWindow> outages = witness.stop();
  std::int64_t longest_outage = 0;
  for (const auto& o : outages) {
    longest_outage = std::max(longest_outage, o.end - o.start);
    windows.push_back(o);
  }
  std::vector<std::string> hung;
  for (int i = 0; i < kWorkers; ++i) {
    workers[i].signal(SIGCONT);
    const int status = workers[i].wait_for(std::chrono::seconds(30));
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      hung.push_back("worker " + std::to_string(i) + " status " + std::to_string(status) + ": " +
                     read_text(dir.path() / ("worker" + std::to_string(i) + ".log")));
    }
  }

  namespace nm = distlock::nemesis;
  const bool fencing = servers->fencing();
  std::vector<nm::History> mutexes;
  for (const auto& f : mutex_files) mutexes.push_back(nm::parse_history(f));
  const auto sem = nm::parse_history(file("sem.history"));
  const auto rw = nm::parse_history(file("rw.history"));
  const auto elect = nm::parse_history(file("elect.history"));
  std::vector<std::pair<std::string, nm::Violation>> violations;
  auto add = [&](const std::string& workload, const std::vector<nm::Violation>& v) {
    for (const auto& x : v) violations.emplace_back(workload, x);
  };
  // The control: the same writes, unfenced. Its stale writes are what the fence stopped.
  std::vector<nm::Violation> control;
  for (int k = 0; k < kMutexes; ++k) {
    const std::string n = std::to_string(k);
    add("mutex" + n, nm::check_history(mutexes[k], fencing));
    add("mutex" + n, nm::check_register(file("fenced" + n + ".register")));
    const auto c = nm::check_register(file("unfenced" + n + ".register"));
    control.insert(control.end(), c.begin(), c.end());
  }
  add("sem", nm::check_semaphore(sem, kPermits));
  add("sem", nm::check_silent_losses(sem));
  add("rw", nm::check_rw(rw));
  add("rw", nm::check_silent_losses(rw));
  add("elect", nm::check_history(elect, fencing));
  // Shards: per shard, the members' sections (one per owner and token) must not overlap in
  // belief, their tokens must increase, a shard that left a member's assignment must have
  // had its stop token fired, and no stale write may reach the fenced register.
  std::vector<nm::History> shard_histories;
  std::vector<nm::Violation> shard_control;
  for (int i = 0; i < kShards; ++i) {
    const std::string n = std::to_string(i);
    shard_histories.push_back(nm::parse_history(file("shard" + n + ".history")));
    add("shard" + n, nm::check_history(shard_histories.back(), fencing));
    add("shard" + n, nm::check_register(file("shardfenced" + n + ".register")));
    const auto c = nm::check_register(file("shardunfenced" + n + ".register"));
    shard_control.insert(shard_control.end(), c.begin(), c.end());
  }
  const nm::ShardGroupLog shard_log =
      nm::parse_shard_group_log(file("shards.history"), static_cast<int>(distlock::errc::not_supported));
  // The fault windows beside the histories (kept with DISTLOCK_NEMESIS_KEEP): "F start end worker
  // slow what", worker -1 for every worker or the servers; "P pid worker" for every process.
  {
    std::ofstream out(file("faults.log"));
    for (const auto& [pid, w] : worker_of_pid) out << "P " << pid << " " << w << "\n";
    for (const auto& w : windows)
      out << "F " << w.start << " " << w.end << " " << w.worker << " " << (w.slow ? 1 : 0) << " " << w.what
          << "\n";
  }
  // No shard unowned longer than the bound while a member lives; a leaver's shards owned by
  // another member within the hand-over bound.
  // After a fault, etcd ends a struck member's lease later than its TTL: a new leader extends
  // every lease by its election timeout (500 ms: tests/etcd/etcd_cluster.cpp) when it takes over,
  // and revokes expired leases in a 500 ms loop (docs/etcd.md). A CI run broke the bound without
  // them by 491 ms on etcd3 (seed 1938085771: a member frozen right after a leader change).
  const long lease_end_extra_ms = GetParam().label.rfind("etcd", 0) == 0 ? 1000 : 0;
  const nm::UnownedBound unowned_bound{
      (kShardPeriodMs + kHandoverMarginMs) * 1'000'000,
      (kTtlMs + lease_end_extra_ms + kShardPeriodMs + kFaultMarginMs) * 1'000'000};
  std::string unowned_longest;
  std::vector<std::int64_t> leave_handovers;
  std::int64_t unowned_quiet = 0, leave_handover = 0,
               unowned_slack = std::numeric_limits<std::int64_t>::max();
  long unowned_violations = 0, slow_leaves = 0, shard_leaves = 0;
  for (int i = 0; i < kShards; ++i) {
    const auto u = nm::check_unowned(shard_histories[i], windows, end_ns, unowned_bound, worker_of_pid);
    add("shard" + std::to_string(i), u.violations);
    for (const auto& v : u.violations) (v.kind == "unowned" ? unowned_violations : slow_leaves) += 1;
    unowned_longest += (i ? "," : "") + std::to_string(u.longest_gap_ns / 1'000'000);
    unowned_quiet = std::max(unowned_quiet, u.longest_quiet_gap_ns);
    unowned_slack = std::min(unowned_slack, u.min_slack_ns);
    leave_handover = std::max(leave_handover, u.longest_leave_handover_ns);
    leave_handovers.insert(leave_handovers.end(), u.leave_handovers_ns.begin(), u.leave_handovers_ns.end());
    shard_leaves += u.leaves;
  }
  // How fast a leaver's shards found their next owner: the median, and how many within one
  // rebalance period plus the hand-over margin (the rest had a fault near).
  auto median_ns = [](std::vector<std::int64_t> v) -> std::int64_t {
    if (v.empty()) return 0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const auto within_one_period =
      std::count_if(leave_handovers.begin(), leave_handovers.end(),
                    [&](std::int64_t ns) { return ns <= unowned_bound.handover_ns; });
  const std::string unowned_json =
      "\"shard_unowned_longest_ms\":[" + unowned_longest +
      "],\"shard_unowned_quiet_longest_ms\":" + std::to_string(unowned_quiet / 1'000'000) +
      ",\"shard_unowned_min_slack_ms\":" +
      (unowned_slack == std::numeric_limits<std::int64_t>::max()
           ? std::string("null")
           : std::to_string(unowned_slack / 1'000'000)) +
      ",\"shard_unowned_violations\":" + std::to_string(unowned_violations) +
      ",\"server_outages\":" + std::to_string(outages.size()) +
      ",\"server_outage_longest_ms\":" + std::to_string(longest_outage / 1'000'000) +
      ",\"shard_leaves\":" + std::to_string(shard_log.leaves) +
      ",\"shard_leaves_owning\":" + std::to_string(shard_leaves) +
      ",\"shard_leave_handover_longest_ms\":" + std::to_string(leave_handover / 1'000'000) +
      ",\"shard_leave_handover_median_ms\":" + std::to_string(median_ns(leave_handovers) / 1'000'000) +
      ",\"shard_leave_handovers_in_one_period\":" + std::to_string(within_one_period) +
      ",\"shard_leave_call_longest_ms\":" + std::to_string(shard_log.longest_leave_call_ns / 1'000'000) +
      ",\"shard_slow_leaves\":" + std::to_string(slow_leaves) + ",";

  auto lost = [](const nm::History& x) {
    long n = 0;
    for (const auto& s : x.sections) n += s.lost_at >= 0;
    return n;
  };
  long applied = 0, rejected = 0, write_errors = 0, mutex_losses = 0, believed = 0, acquire_errors = 0;
  std::size_t sections = 0;
  for (const auto& h : mutexes) {
    for (const auto& w : h.writes) {
      (w.status == "applied" ? applied : w.status == "stale" ? rejected : write_errors) += 1;
    }
    mutex_losses += lost(h);
    believed += static_cast<long>(nm::believed_sections(h).size());
    acquire_errors += h.acquire_errors;
    sections += h.sections.size();
  }
  // Every signalled loss of a held lease counts: the mutexes', the semaphore permits',
  // the read-write holds' and the leaderships'.
  const long losses = mutex_losses + lost(sem) + lost(rw) + lost(elect);
  long shard_sections = 0, shard_believed = 0, shard_stops = 0, shard_applied = 0, shard_rejected = 0;
  for (const auto& h : shard_histories) {
    shard_sections += static_cast<long>(h.sections.size());
    shard_believed += static_cast<long>(nm::believed_sections(h).size());
    shard_stops += lost(h);
    for (const auto& w : h.writes) {
      shard_applied += w.status == "applied";
      shard_rejected += w.status == "stale";
    }
  }
  const bool expires = servers->expires();
  // The bite is asked of the part of the run the schedule could strike holders in: the run
  // less the time it waited for killed servers to serve again.
  const long strike_ms = std::max<long>(0, seconds * 1000L - static_cast<long>(server_wait.count()));
  const long min_losses = expires ? (30L * strike_ms + 59'999) / 60'000 : 0;
  const long min_rejected = expires && fencing ? (15L * strike_ms + 59'999) / 60'000 : 0;
  std::printf(
      "{\"nemesis\":\"%s\",\"seed\":%u,\"seconds\":%d,\"ttl_ms\":%ld,\"faults\":%zu,\"holder_faults\":%d,"
      "\"sections\":%zu,\"believed\":%ld,\"acquire_errors\":%ld,\"writes_applied\":%ld,"
      "\"writes_rejected\":%ld,\"write_errors\":%ld,\"losses_signalled\":%ld,\"mutex_losses\":%ld,"
      "\"unfenced_stale_applied\":%zu,\"sem_sections\":%zu,\"sem_losses\":%ld,\"rw_sections\":%zu,"
      "\"rw_losses\":%ld,\"elect_sections\":%zu,\"elect_losses\":%ld,\"min_losses\":%ld,"
      "\"min_rejected\":%ld,\"server_wait_ms\":%ld,"
      "\"shard_sections\":%ld,\"shard_believed\":%ld,\"shard_stops\":%ld,"
      "\"shard_leases_lost\":%ld,\"shard_join_errors\":%ld,\"shard_writes_applied\":%ld,"
      "\"shard_writes_rejected\":%ld,\"shard_unfenced_stale_applied\":%zu,%s\"violations\":%zu}\n",
      GetParam().label.c_str(), seed, seconds, kTtlMs, faults.size(), holder_faults, sections, believed,
      acquire_errors, applied, rejected, write_errors, losses, mutex_losses, control.size(),
      sem.sections.size(), lost(sem), rw.sections.size(), lost(rw), elect.sections.size(), lost(elect),
      min_losses, min_rejected, static_cast<long>(server_wait.count()), shard_sections, shard_believed,
      shard_stops, shard_log.leases_lost, shard_log.join_errors, shard_applied, shard_rejected,
      shard_control.size(), unowned_json.c_str(), violations.size() + hung.size());
  std::fflush(stdout);
  RecordProperty("seed", static_cast<int>(seed));
  if (const char* keep = std::getenv("DISTLOCK_NEMESIS_KEEP"); keep != nullptr && *keep) {
    std::filesystem::create_directories(keep);
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      std::filesystem::copy_file(e.path(), std::filesystem::path(keep) / e.path().filename(),
                                 std::filesystem::copy_options::overwrite_existing);
    }
    for (const auto& [name, text] : servers->server_logs()) {
      std::ofstream(std::filesystem::path(keep) / name) << text;
    }
  }
  // The fault windows on the histories' clock (CLOCK_MONOTONIC ns), in order, the servers' outages
  // the witness saw among them: a violation's times can be read against them.
  std::vector<nm::FaultWindow> by_start = windows;
  std::sort(by_start.begin(), by_start.end(),
            [](const nm::FaultWindow& x, const nm::FaultWindow& y) { return x.start < y.start; });
  std::string sched;
  for (const auto& f : by_start) {
    sched += "  " + std::to_string(f.start) + " .. " + std::to_string(f.end) + " (" +
             std::to_string((f.end - f.start) / 1'000'000) + " ms): " + f.what + "\n";
  }
  if (std::getenv("DISTLOCK_NEMESIS_VERBOSE") != nullptr) std::printf("faults:\n%s", sched.c_str());

  wall_step_ns = std::max<std::int64_t>(wall_step_ns, std::llabs(wall_minus_mono() - wall_offset));
  const std::string replay =
      " (replay: DISTLOCK_NEMESIS_SEED=" + std::to_string(seed) +
      " DISTLOCK_NEMESIS_SECONDS=" + std::to_string(seconds) + ")" +
      (wall_step_ns > 100'000'000
           ? "; the machine's wall clock stepped by up to " + std::to_string(wall_step_ns / 1'000'000) +
                 " ms against the monotonic clock during the run"
           : std::string());
  // The schedule has no server fault for a target without members; a failover that
  // happened anyway (sentinel: a master starved past down-after-milliseconds) is
  // named, so that the overlaps it causes (docs/sentinel.md: a failover loses
  // acknowledged writes) are not taken for something else. They still count.
  if (const std::string changed = servers->unplanned_role_changes(); !changed.empty()) {
    ADD_FAILURE() << "the servers changed roles without a scheduled fault: " << changed
                  << "; overlaps after a failover are the documented limit of asynchronous replication, "
                     "which this run does not test"
                  << replay;
  }
  EXPECT_GT(believed, 10) << "the workers made no progress" << replay;
  for (const auto& [name, x] : std::vector<std::pair<std::string, const nm::History*>>{
           {"semaphore", &sem}, {"read-write lock", &rw}, {"election", &elect}}) {
    EXPECT_GT(nm::believed_sections(*x).size(), 2u)
        << "the " << name << " workload made no progress" << replay;
  }
  if (shard_log.unsupported) {
    std::printf("nemesis %s: the backend has no shard groups (not_supported): no shard workload\n",
                GetParam().label.c_str());
  } else {
    EXPECT_GT(shard_believed, kShards) << "the shard workload made no progress" << replay;
    // Members left gracefully and joined again within the run (each worker every 2-6 s).
    EXPECT_GE(shard_log.leaves, 3) << "too few graceful leaves in the shard workload" << replay;
    EXPECT_GE(shard_leaves, 1) << "no member left the shard group while owning a shard" << replay;
    // Shard losses and rejected shard writes are counted, not required: the mutex's
    // thresholds above are the run's bite; a shard is struck whenever its member is.
  }
  for (const auto& v : hung) ADD_FAILURE() << "incomplete: " << v << replay;
  // A run that never bit proves nothing; nor does one whose servers took most of it to come back.
  const std::string with_faults = replay + "\nfaults:\n" + sched;
  EXPECT_GE(strike_ms, seconds * 1000L / 4)
      << "the schedule waited " << server_wait.count()
      << " ms for killed servers to serve again: too little of the run was left to strike holders"
      << with_faults;
  EXPECT_GE(losses, min_losses) << "too few signalled losses: the faults did not strike held leases"
                                << with_faults;
  EXPECT_GE(rejected, min_rejected) << "too few stale writes rejected by the fence" << with_faults;
  if (fencing && expires) {
    EXPECT_FALSE(control.empty())
        << "the unfenced control register holds no stale write: the same writes without a fence "
           "must show the checker a lost update, or the run proves nothing"
        << replay;
  }
  for (std::size_t i = 0; i < violations.size() && i < 5; ++i) {
    const auto& [workload, v] = violations[i];
    const auto index = static_cast<std::size_t>(workload.back() - '0');
    const auto& hist = workload == "sem"                 ? sem
                       : workload == "rw"                ? rw
                       : workload == "elect"             ? elect
                       : workload.rfind("shard", 0) == 0 ? shard_histories[index]
                                                         : mutexes[index];
    ADD_FAILURE() << workload << ": " << v.kind << ": " << v.what << replay << "\nhistory near it:\n"
                  << (v.at > 0 ? nm::slice(hist, v.at, 3'000'000'000LL) : std::string()) << "faults:\n"
                  << sched;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Nemesis, ::testing::ValuesIn(nemesis_kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });

// The durable-storage assumption matters: a single server (Redis with appendfsync
// always, PostgreSQL, MariaDB) that loses its data while a lease is held gives the lock again,
// and the checker reports it (an overlap of beliefs, or a token that repeats or goes
// back). Bounded: at most 5 attempts and 15 s per backend.
std::vector<Kind> single_server_kinds() {
  std::vector<Kind> out;
  for (auto& k : kinds()) {
    if (k.label == "redis" || k.label == "postgres" || k.label == "mysql") out.push_back(std::move(k));
  }
  return out;
}

class WipedServer : public ::testing::TestWithParam<Kind> {};

TEST_P(WipedServer, ARestartWithoutItsDataUnderAHeldLeaseIsReportedByTheChecker) {
  auto mono_ns = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return std::to_string(static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec);
  };
  const auto start = Steady::now();
  int attempts = 0;
  std::vector<distlock::nemesis::Violation> found;
  std::string history;
  while (found.empty() && attempts < 5 && Steady::now() - start < 15s) {
    ++attempts;
    auto target = GetParam().make({.durable = true});
    distlock::Client a = distlock::connect(target->url());
    distlock::LockOptions o;
    o.ttl = 5s;
    o.wait = 3s;
    history.clear();
    // Three sections first, so that the fence counter is past its first values.
    for (int seq = 1; seq <= 3; ++seq) {
      distlock::Lease l = a.acquire("wiped", o);
      history += "A 1 1 " + std::to_string(seq) + " " + std::to_string(l.token()) + " " + mono_ns() + "\n";
      history += "O 1 1 " + std::to_string(seq) + " " + mono_ns() + "\n";
      l.release();
      history += "E 1 1 " + std::to_string(seq) + " " + mono_ns() + " ok 0\n";
    }
    distlock::Lease held = a.acquire("wiped", o);
    history += "A 1 1 4 " + std::to_string(held.token()) + " " + mono_ns() + "\n";
    history += "O 1 1 4 " + mono_ns() + "\n";
    ASSERT_TRUE(target->wipe_and_restart(0, 0ms)) << "the target cannot wipe its server";
    distlock::Client b = distlock::connect(target->url());
    distlock::Lease taken = b.acquire("wiped", o);
    history += "A 2 2 1 " + std::to_string(taken.token()) + " " + mono_ns() + "\n";
    if (taken.owns()) history += "O 2 2 1 " + mono_ns() + "\n";
    if (const std::string t = mono_ns(); held.owns()) history += "O 1 1 4 " + t + "\n";
    TempDir d("distlock-wiped");
    const std::string path = (d.path() / "h").string();
    std::ofstream(path) << history;
    found = distlock::nemesis::check_history(distlock::nemesis::parse_history(path), true);
  }
  ASSERT_FALSE(found.empty()) << GetParam().label << " wiped under a held lease produced no violation in "
                              << attempts << " attempts; last history:\n"
                              << history;
  std::printf("wiped %s: %zu violation(s) after %d attempt(s), the first: %s: %s\n", GetParam().label.c_str(),
              found.size(), attempts, found[0].kind.c_str(), found[0].what.c_str());
  for (const auto& v : found)
    EXPECT_TRUE(v.kind == "overlap" || v.kind == "token") << v.kind << ": " << v.what;
}

INSTANTIATE_TEST_SUITE_P(Backends, WipedServer, ::testing::ValuesIn(single_server_kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(WipedServer);

// The checker must be able to fail: hand-made histories with each violation.
class HistoryChecker : public ::testing::Test {
 protected:
  // Writes `text` as the file `name` of this test's directory (replacing it); its path.
  std::string write(const std::string& text, const std::string& name = "h") {
    const std::string path = (dir_.path() / name).string();
    std::ofstream(path, std::ios::trunc) << text;
    return path;
  }
  std::vector<distlock::nemesis::Violation> check(const std::string& text, bool fencing = true) {
    return distlock::nemesis::check_history(distlock::nemesis::parse_history(write(text)), fencing);
  }

 private:
  TempDir dir_{"distlock-history"};
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
  EXPECT_TRUE(distlock::nemesis::check_register(write("5\n5\n6\n7\n", "register")).empty());
  auto v = distlock::nemesis::check_register(write("5\n6\n5\n7\n6\n", "register"));
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].kind, "stale-write");
  v = check("A 1 1 1 5 1000000000000\nE 1 1 1 1000000000100 lost 0\n");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, "silent-loss");
}

TEST_F(HistoryChecker, ASliceKeepsLinesWithLongTokens) {
  const std::string path = write(
      "A 1 1 1 1795910433679600 16573524465509\nO 1 1 1 16573524483443\nX 5 16573524500000\n"
      "O 1 1 1 19000000000000\n");
  const auto text =
      distlock::nemesis::slice(distlock::nemesis::parse_history(path), 16573524465509, 1'000'000);
  EXPECT_NE(text.find("A 1 1 1 1795910433679600"), std::string::npos) << text;
  EXPECT_NE(text.find("X 5"), std::string::npos) << text;
  EXPECT_EQ(text.find("19000000000000"), std::string::npos) << text;
}

TEST_F(HistoryChecker, TooManyPermitsAreCaught) {
  auto judge = [&](const char* text) {
    return distlock::nemesis::check_semaphore(distlock::nemesis::parse_history(write(text)), 2);
  };
  // Two at once, and a third that starts when one ended: fine.
  EXPECT_TRUE(
      judge("A 1 1 1 0 100\nA 2 2 1 0 150\nO 1 1 1 200\nO 2 2 1 300\nA 3 3 1 0 200\nO 3 3 1 400\n").empty());
  auto v = judge("A 1 1 1 0 100\nA 2 2 1 0 150\nA 3 3 1 0 160\nO 1 1 1 200\nO 2 2 1 300\nO 3 3 1 400\n");
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0].kind, "capacity");
}

TEST_F(HistoryChecker, AWriterWithAnyoneIsCaught) {
  auto judge = [&](const char* text) {
    return distlock::nemesis::check_rw(distlock::nemesis::parse_history(write(text)));
  };
  // Readers together, then a writer alone.
  EXPECT_TRUE(
      judge("A 1 1 1 0 100 s\nA 2 2 1 0 150 s\nO 1 1 1 200\nO 2 2 1 300\nA 3 3 1 7 400 x\nO 3 3 1 500\n")
          .empty());
  auto v = judge("A 1 1 1 0 100 s\nO 1 1 1 300\nA 3 3 1 7 200 x\nO 3 3 1 250\n");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, "exclusion");
  v = judge("A 1 1 1 6 100 x\nO 1 1 1 300\nA 3 3 1 7 200 x\nO 3 3 1 250\n");
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0].kind, "exclusion");
}

// Shard histories (one file per shard, one section per member and token): the checker
// must fail two owners of one shard, a shard token that goes back across owners, a shard
// that left a member's assignment without its stop token, and a stale shard write applied.
TEST_F(HistoryChecker, ShardViolationsAreCaught) {
  // A clean hand-over: member 10 is told (L), gives the shard up, member 20 takes it with a
  // larger token.
  EXPECT_TRUE(check("A 10 1 1 7 100\nO 10 1 1 110\nL 10 1 1 115\nE 10 1 1 120 lost 1\nA 20 2 1 8 200\n"
                    "O 20 2 1 210\nE 20 2 1 300 ok 1\n")
                  .empty());
  auto v = check("A 10 1 1 7 100\nO 10 1 1 110\nA 20 2 1 8 150\nO 20 2 1 160\nO 10 1 1 300\n");
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0].kind, "overlap");
  v = check(
      "A 10 1 1 7 100\nO 10 1 1 110\nL 10 1 1 115\nE 10 1 1 120 lost 1\nA 20 2 1 6 200\nO 20 2 1 210\n");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, "token");
  v = check("A 10 1 1 7 100\nO 10 1 1 110\nE 10 1 1 120 lost 0\nA 20 2 1 8 200\nO 20 2 1 210\n");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, "silent-loss");
  v = distlock::nemesis::check_register(write("7\n7\n8\n7\n", "shardfenced0.register"));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, "stale-write");
}

// A shard without an owner: allowed for one period plus a margin after a hand-over, for as long
// as a fault lasts and one TTL plus a period plus a margin after it; not longer.
TEST_F(HistoryChecker, AShardUnownedPastTheBoundIsCaught) {
  namespace nm = distlock::nemesis;
  auto judge = [&](const std::string& text, const std::vector<nm::FaultWindow>& faults,
                   std::int64_t horizon) {
    const std::string path = write(text, "shard0.history");
    // Times in ms below; the bound: 700 ms after a hand-over, 2200 ms after a fault's end.
    return nm::check_unowned(nm::parse_history(path), faults, horizon * 1'000'000,
                             nm::UnownedBound{700'000'000, 2'200'000'000});
  };
  auto ms = [](long v) { return std::to_string(v * 1'000'000L); };
  // Member 10 owns the shard from 100 ms, its stop token fires at 1000 ms (L); member 20 sees it
  // at 3000 ms: 2000 ms without an owner.
  const std::string late = "A 10 1 1 7 " + ms(100) + "\nO 10 1 1 " + ms(900) + "\nL 10 1 1 " + ms(1000) +
                           "\nE 10 1 1 " + ms(1010) + " lost 1\nA 20 2 1 8 " + ms(3000) + "\nO 20 2 1 " +
                           ms(3010) + "\nE 20 2 1 " + ms(5000) + " ok 1\n";
  // No fault: past the hand-over bound.
  auto r = judge(late, {}, 5000);
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_EQ(r.violations[0].kind, "unowned");
  EXPECT_EQ(r.longest_gap_ns, 2'000'000'000);
  EXPECT_EQ(r.longest_quiet_gap_ns, 2'000'000'000);
  // A fault from 500 to 900 ms (the member cut off): allowed until 900 + 2200 ms.
  r = judge(late, {{500'000'000, 900'000'000, "cut"}}, 5000);
  EXPECT_TRUE(r.violations.empty()) << r.violations[0].what;
  EXPECT_EQ(r.longest_quiet_gap_ns, 0);
  // A fault that struck only after the shard was overdue (1800 ms > 1000 + 700) excuses nothing.
  r = judge(late, {{1'800'000'000, 1'900'000'000, "stop"}}, 5000);
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_EQ(r.violations[0].kind, "unowned");
  // Two faults in a row, the second while the first's allowance ran: allowed until 2500 + 2200.
  const std::string later = "A 10 1 1 7 " + ms(100) + "\nL 10 1 1 " + ms(1000) + "\nA 20 2 1 8 " + ms(4500) +
                            "\nE 20 2 1 " + ms(5000) + " ok 1\n";
  EXPECT_TRUE(judge(later, {{500'000'000, 900'000'000, "a"}, {2'000'000'000, 2'500'000'000, "b"}}, 5000)
                  .violations.empty());
  EXPECT_EQ(judge(later, {{500'000'000, 900'000'000, "a"}}, 5000).violations.size(), 1u);
  // Faults at single workers. Member pid 10 is worker 0, pid 20 worker 1, pid 30 worker 2.
  const std::map<long, int> workers{{10, 0}, {20, 1}, {30, 2}};
  auto judge_at = [&](const std::string& text, const std::vector<nm::FaultWindow>& faults) {
    return nm::check_unowned(nm::parse_history(write(text, "shard0.history")), faults, 9'000'000'000,
                             nm::UnownedBound{700'000'000, 2'200'000'000}, workers);
  };
  // The owner (worker 0) killed at 900 ms: its lease lives on, the others take over by
  // 900 + 2200 ms.
  auto killed_then_taken_at = [&](long taken) {
    return "A 10 1 1 7 " + ms(100) + "\nW 10 1 1 7 " + ms(899) + " applied\nA 20 2 1 8 " + ms(taken) +
           "\nE 20 2 1 " + ms(9000) + " ok 1\n";
  };
  const nm::FaultWindow kill0{900'000'000, 950'000'000, "kill worker 0", 0};
  EXPECT_TRUE(judge_at(killed_then_taken_at(3000), {kill0}).violations.empty());
  EXPECT_EQ(judge_at(killed_then_taken_at(3200), {kill0}).violations.size(), 1u);
  // A fault at another worker, while the shard was still allowed to be unowned, extends the bound
  // once per worker: worker 1 stopped at 1500 ms (until 3700), again at 3500 (no more), worker 2
  // at 3600 (until 5800).
  auto lost_then_taken_at = [&](long taken) {
    return "A 10 1 1 7 " + ms(100) + "\nL 10 1 1 " + ms(1000) + "\nA 30 3 1 8 " + ms(taken) + "\nE 30 3 1 " +
           ms(9000) + " ok 1\n";
  };
  const nm::FaultWindow stop1{1'500'000'000, 3'000'000'000, "stop worker 1", 1};
  const nm::FaultWindow stop1_again{3'500'000'000, 5'000'000'000, "stop worker 1", 1};
  const nm::FaultWindow stop2{3'600'000'000, 5'100'000'000, "stop worker 2", 2};
  EXPECT_TRUE(judge_at(lost_then_taken_at(3600), {stop1}).violations.empty());
  EXPECT_EQ(judge_at(lost_then_taken_at(4000), {stop1, stop1_again}).violations.size(), 1u);
  EXPECT_TRUE(judge_at(lost_then_taken_at(5700), {stop1, stop1_again, stop2}).violations.empty());
  EXPECT_EQ(judge_at(lost_then_taken_at(5900), {stop1, stop1_again, stop2}).violations.size(), 1u);
  // Worker 1 struck before the gap began (500 to 900 ms: until 2700) and again within it
  // (2500 ms: until 4700): it came back, was to take the shard, and was stopped again.
  const nm::FaultWindow before1{500'000'000, 900'000'000, "stop worker 1", 1};
  const nm::FaultWindow within1{2'500'000'000, 3'000'000'000, "stop worker 1", 1};
  EXPECT_TRUE(judge_at(lost_then_taken_at(4600), {before1, within1}).violations.empty());
  EXPECT_EQ(judge_at(lost_then_taken_at(4800), {before1, within1}).violations.size(), 1u);
  EXPECT_EQ(judge_at(lost_then_taken_at(2800), {before1}).violations.size(), 1u);
  // A slowed worker: from the end of the delay (1500 to 3000 ms: until 5200).
  const nm::FaultWindow delay1{1'500'000'000, 3'000'000'000, "delay worker 1", 1, true};
  EXPECT_TRUE(judge_at(lost_then_taken_at(5100), {delay1}).violations.empty());
  EXPECT_EQ(judge_at(lost_then_taken_at(5300), {delay1}).violations.size(), 1u);
  // A strike and a delay of one worker within the gap each extend it once: worker 2 killed at
  // 1500 ms (until 3700), the process started in its place (the shard's next owner) delayed from
  // 3200 to 4500 ms (until 6700); a second delay (5000 to 6000 ms) extends nothing more (etcd3
  // seed 896976451 beside two hogs: the shard was taken 147 ms after such a delay ended).
  const nm::FaultWindow kill2{1'500'000'000, 1'550'000'000, "kill worker 2", 2};
  const nm::FaultWindow delay2{3'200'000'000, 4'500'000'000, "delay worker 2", 2, true};
  const nm::FaultWindow delay2_again{5'000'000'000, 6'000'000'000, "delay worker 2", 2, true};
  EXPECT_TRUE(judge_at(lost_then_taken_at(6600), {kill2, delay2}).violations.empty());
  EXPECT_EQ(judge_at(lost_then_taken_at(6800), {kill2, delay2}).violations.size(), 1u);
  EXPECT_EQ(judge_at(lost_then_taken_at(6800), {kill2, delay2, delay2_again}).violations.size(), 1u);
  // A killed member (no L, no E) owns until its last line; the shard is then unowned to the
  // horizon: 4000 ms past its last write with no fault after it.
  r = judge("A 10 1 1 7 " + ms(100) + "\nW 10 1 1 7 " + ms(1000) + " applied\n", {}, 5000);
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_EQ(r.longest_gap_ns, 4'000'000'000);
  // A hand-over within the bound passes; the last owner's end is judged up to the horizon.
  const std::string quick = "A 10 1 1 7 " + ms(100) + "\nL 10 1 1 " + ms(1000) + "\nA 20 2 1 8 " + ms(1300) +
                            "\nE 20 2 1 " + ms(5000) + " ok 1\n";
  EXPECT_TRUE(judge(quick, {}, 5200).violations.empty());
  EXPECT_EQ(judge(quick, {}, 6000).violations.size(), 1u);
}

// A member that leaves gracefully: its shard must be owned by another within the hand-over
// bound, and leave() must have fired its stop token.
TEST_F(HistoryChecker, ASlowHandOverAfterALeaveIsCaught) {
  namespace nm = distlock::nemesis;
  auto judge = [&](const std::string& text) {
    return nm::check_unowned(nm::parse_history(write(text, "shard0.history")), {}, 5'000'000'000,
                             nm::UnownedBound{700'000'000, 2'200'000'000});
  };
  auto ms = [](long v) { return std::to_string(v * 1'000'000L); };
  auto left_then_taken_at = [&](long taken) {
    return "A 10 1 1 7 " + ms(100) + "\nO 10 1 1 " + ms(900) + "\nE 10 1 1 " + ms(1000) +
           " left 1\nA 20 2 1 8 " + ms(taken) + "\nE 20 2 1 " + ms(5000) + " ok 1\n";
  };
  auto r = judge(left_then_taken_at(1250));
  EXPECT_TRUE(r.violations.empty());
  EXPECT_EQ(r.leaves, 1);
  EXPECT_EQ(r.longest_leave_handover_ns, 250'000'000);
  EXPECT_EQ(r.leave_handovers_ns, std::vector<std::int64_t>{250'000'000});
  r = judge(left_then_taken_at(1900));
  ASSERT_EQ(r.violations.size(), 2u);
  EXPECT_EQ(r.violations[0].kind, "unowned");
  EXPECT_EQ(r.violations[1].kind, "slow-leave");
  EXPECT_EQ(r.longest_leave_handover_ns, 900'000'000);
  // leave() fires every stop token: a "left" section whose token had not fired is a silent loss.
  auto v = check("A 10 1 1 7 100\nO 10 1 1 110\nE 10 1 1 120 left 0\n");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, "silent-loss");
}

TEST_F(HistoryChecker, TheShardGroupLogIsRead) {
  const std::string path =
      write("X 4 100\nS 10 3 2 9 1\nV 20 1000 1300 2\nS 20 1 0 4 0\nV 20 2000 2100 0\n", "shards.history");
  const int unsupported = static_cast<int>(distlock::errc::not_supported);
  auto g = distlock::nemesis::parse_shard_group_log(path, unsupported);
  EXPECT_EQ(g.join_errors, 1);
  EXPECT_FALSE(g.unsupported);
  EXPECT_EQ(g.leases_lost, 4);
  EXPECT_EQ(g.taken, 13);
  EXPECT_EQ(g.membership_lost, 1);
  EXPECT_EQ(g.leaves, 2);
  EXPECT_EQ(g.longest_leave_call_ns, 300);
  std::ofstream(path, std::ios::app) << "X " << unsupported << " 200\n";
  EXPECT_TRUE(distlock::nemesis::parse_shard_group_log(path, unsupported).unsupported);
}

}  // namespace

}  // namespace distlock::testing
