// scheduler — a "cron" job fired on several nodes at once, run exactly once per slot.
//
//   scheduler [--url URL] [--nodes 4] [--ticks 5] [--period 1000] [--distlock PATH] [--dir DIR]
//
// Each of --nodes processes (this program re-executed with --node I) is one host's cron:
// at the start of each of --ticks period slots (by the wall clock, plus a random 0-100 ms
// of clock skew between hosts) it fires
//
//   distlock run --url URL --once-per PERIODms --wait 10s scheduler-job -- sh -c 'echo ...'
//
// `--once-per` makes the runner look, under the lock, at the mark of the last
// successful run; if it is this slot's, it exits 0 without running, else it runs the job
// and, on success, records the slot while it still holds the lock. So every node may
// fire and exactly one runs per slot. The job appends "<slot> <node> <token>" to a
// log file (DISTLOCK_ONCE_SLOT and DISTLOCK_TOKEN come from the runner).
//
// At the end it checks the log: every slot fired ran exactly once, nothing ran twice,
// the tokens increase with the slots (where the backend issues tokens); prints a
// summary line and, as its last line, one JSON object; exits 1 on a violation, 2 on bad
// arguments. Runs on the default file:// (this host only) and on any URL, e.g. redis://.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;

std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int spawn_wait(const std::vector<std::string>& argv) {
  std::vector<char*> c;
  for (const auto& a : argv) c.push_back(const_cast<char*>(a.c_str()));
  c.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawnp(&pid, c[0], nullptr, nullptr, c.data(), environ) != 0) return 127;
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

struct Config {
  std::string url;
  int nodes = 4;
  int ticks = 5;
  long period_ms = 1000;
  std::string distlock = "distlock";
  std::string dir;
  int node = -1;                // >= 0: run as that node
  std::int64_t first_slot = 0;  // the node's first slot (given by the parent)
};

// One node: fires once at the start of each slot.
int run_node(const Config& cfg) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> skew(0, 100);
  const std::string log = (fs::path(cfg.dir) / "runs.log").string();
  int failures = 0;
  for (int t = 0; t < cfg.ticks; ++t) {
    const std::int64_t fire_at = (cfg.first_slot + t) * cfg.period_ms + skew(rng);
    while (unix_ms() < fire_at) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int rc =
        spawn_wait({cfg.distlock, "run", "--url", cfg.url, "--once-per", std::to_string(cfg.period_ms) + "ms",
                    "--wait", "10s", "scheduler-job", "--", "sh", "-c",
                    "echo \"$DISTLOCK_ONCE_SLOT " + std::to_string(cfg.node) +
                        " ${DISTLOCK_TOKEN:-0}\" >> '" + log + "'"});
    if (rc != 0) {
      std::fprintf(stderr, "scheduler: node %d: distlock run exited %d in tick %d\n", cfg.node, rc, t);
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"a cron job fired on several nodes, run exactly once per period slot", "scheduler"};
  app.add_option("--url", cfg.url, "Lock service URL (default: $DISTLOCK_URL, else this host's file://)");
  app.add_option("--nodes", cfg.nodes, "Nodes firing the job")->check(CLI::Range(1, 64));
  app.add_option("--ticks", cfg.ticks, "Slots each node fires in")->check(CLI::Range(1, 1000));
  app.add_option("--period", cfg.period_ms, "Slot length in milliseconds")->check(CLI::Range(200, 3600000));
  app.add_option("--distlock", cfg.distlock, "The distlock command-line tool");
  app.add_option("--dir", cfg.dir, "Where the run log goes (default: a new temporary directory)");
  app.add_option("--node", cfg.node, "(internal) run as node I")->group("");
  app.add_option("--first-slot", cfg.first_slot, "(internal) the first slot")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (cfg.url.empty()) cfg.url = distlock::default_url();
  if (cfg.node >= 0) return run_node(cfg);

  if (cfg.dir.empty()) {
    char tmpl[] = "/tmp/distlock-scheduler-XXXXXX";
    if (!::mkdtemp(tmpl)) {
      std::perror("scheduler: mkdtemp");
      return 2;
    }
    cfg.dir = tmpl;
  }
  fs::create_directories(cfg.dir);
  const std::string log = (fs::path(cfg.dir) / "runs.log").string();
  fs::remove(log);
  // Start at the slot after next, so every node is up before the first one begins.
  const std::int64_t first_slot = unix_ms() / cfg.period_ms + 2;
  std::vector<pid_t> pids;
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  for (int i = 0; i < cfg.nodes; ++i) {
    std::vector<std::string> a{self,
                               "--node",
                               std::to_string(i),
                               "--url",
                               cfg.url,
                               "--ticks",
                               std::to_string(cfg.ticks),
                               "--period",
                               std::to_string(cfg.period_ms),
                               "--distlock",
                               cfg.distlock,
                               "--dir",
                               cfg.dir,
                               "--first-slot",
                               std::to_string(first_slot)};
    std::vector<char*> c;
    for (auto& s : a) c.push_back(s.data());
    c.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, self.c_str(), nullptr, nullptr, c.data(), environ) != 0) {
      std::perror("scheduler: posix_spawn");
      return 2;
    }
    pids.push_back(pid);
  }
  int node_failures = 0;
  for (pid_t p : pids) {
    int st = 0;
    while (::waitpid(p, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++node_failures;
  }

  // Check the log.
  std::map<std::int64_t, std::vector<std::pair<int, std::uint64_t>>> runs;  // slot -> (node, token)
  std::ifstream in(log);
  long malformed = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::int64_t slot = 0;
    int node = 0;
    std::uint64_t token = 0;
    if (ls >> slot >> node >> token) {
      runs[slot].push_back({node, token});
    } else {
      ++malformed;
    }
  }
  long twice = 0, missing = 0, outside = 0, token_order = 0;
  std::uint64_t last_token = 0;
  for (std::int64_t s = first_slot; s < first_slot + cfg.ticks; ++s) {
    auto it = runs.find(s);
    if (it == runs.end()) {
      ++missing;
      continue;
    }
    if (it->second.size() > 1) ++twice;
    const std::uint64_t tok = it->second.front().second;
    if (tok != 0 && tok <= last_token) ++token_order;
    if (tok != 0) last_token = tok;
  }
  for (const auto& [s, v] : runs) {
    if (s < first_slot || s >= first_slot + cfg.ticks) outside += static_cast<long>(v.size());
  }
  long total = 0;
  for (const auto& [s, v] : runs) total += static_cast<long>(v.size());
  const bool ok =
      twice == 0 && missing == 0 && outside == 0 && token_order == 0 && malformed == 0 && node_failures == 0;
  std::printf(
      "scheduler: %d nodes fired %d slots of %ld ms each: %ld runs, %ld slots ran twice, %ld missed%s\n",
      cfg.nodes, cfg.ticks, cfg.period_ms, total, twice, missing, ok ? "" : " - VIOLATION");
  nlohmann::ordered_json j;
  j["url"] = distlock::connect(cfg.url).url();
  j["nodes"] = cfg.nodes;
  j["ticks"] = cfg.ticks;
  j["period_ms"] = cfg.period_ms;
  j["fired"] = cfg.nodes * cfg.ticks;
  j["runs"] = total;
  j["slots_run_once"] = static_cast<long>(cfg.ticks) - missing - twice;
  j["slots_run_twice"] = twice;
  j["slots_missed"] = missing;
  j["runs_outside_slots"] = outside;
  j["token_order_violations"] = token_order;
  j["node_failures"] = node_failures;
  j["log"] = log;
  j["ok"] = ok;
  std::printf("%s\n", j.dump().c_str());
  return ok ? 0 : 1;
}
