// scheduler — a "cron" job run exactly once per period slot by a cluster of nodes.
//
//   scheduler [--url URL] [--nodes 4] [--ticks 5] [--period 1000] [--distlock PATH] [--dir DIR]
//             [--ttl 2s] [--kill-leader-at K] [--no-elect]
//
// Default (leader-elected): each of --nodes processes is one host, run as
//
//   distlock elect --url URL --ttl TTL --value node-I scheduler-leader -- scheduler --node I --leader-loop
//   ...
//
// so exactly one of them leads at a time (its term is DISTLOCK_TOKEN; `elect` kills it when
// leadership is lost). Only the leader fires: at the start of each of --ticks period slots
// (by the wall clock) whose first half has not passed yet, it appends "<slot> <node> <term>" to fires.log
// and runs
//
//   distlock run --url URL --once-per PERIODms --wait 10s scheduler-job -- sh -c 'echo ...'
//
// `--once-per` guards the failover window: a new leader that fires a slot its predecessor
// already completed finds the slot's mark under the lock and does not run it again. With
// --kill-leader-at K the parent SIGKILLs the leader's `distlock elect` process a quarter of a
// period into slot K (found through the pid file the leader loop writes), or later, once the
// leader's run of slot K has ended (ended.log): `elect` takes the leader loop and its runs with
// it (its job dies with the runner), and a run killed after its command but before it stored
// the mark leaves the slot to run again -- the window `--once-per` documents, not the failover
// shown here. A waiting node takes over once the leadership lease is free (at once on file://,
// after --ttl on a TTL backend). The slots in between are not fired by anybody.
//
// With --no-elect (leader-less): every node fires every slot (plus a random 0-100 ms of clock
// skew between hosts) and `--once-per` alone makes exactly one of them run.
//
// The job appends "<slot> <node> <token> <term>" to runs.log (DISTLOCK_ONCE_SLOT and
// DISTLOCK_TOKEN come from the runner; the term is 0 leader-less). At the end the parent
// checks the logs: no slot ran twice; every slot ran (leader-less, or elected without a kill);
// with a kill, every slot fired after the takeover ran and only the slots between the kill and
// the takeover were missed; the leaders' terms increase (in fires.log order and by slot in
// runs.log; a term belongs to one node); the job tokens increase with the slots. It prints a
// summary line and, as its last line, one JSON object; exits 1 on a violation, 2 on bad
// arguments. Runs on the default file:// (this host only) and on any URL, e.g. redis://.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
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

constexpr const char* kElection = "scheduler-leader";

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

// One line, appended with a single write (O_APPEND): lines of several processes never mix.
void append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const std::string l = line + "\n";
  [[maybe_unused]] const auto n = ::write(fd, l.data(), l.size());
  ::close(fd);
}

struct Config {
  std::string url;
  int nodes = 4;
  int ticks = 5;
  long period_ms = 1000;
  std::string distlock = "distlock";
  std::string dir;
  std::string ttl = "2s";
  int kill_leader_at = -1;
  bool no_elect = false;
  bool leader_loop = false;     // (internal) run as the elected leader's loop
  int node = -1;                // >= 0: run as that node
  std::int64_t first_slot = 0;  // the node's first slot (given by the parent)
};

// Fires the job for one slot through `distlock run --once-per`; the job logs
// "<slot> <node> <token> <term>". The job's lock has the leadership's --ttl too: a leader
// killed while its job run holds that lock leaves it behind until the TTL ends on the server,
// and the new leader's runs (waiting up to 10 s) must get it (with the default 30 s TTL they
// did not, beside two CPU hogs, and the slots after the takeover were missed).
int fire(const Config& cfg, const std::string& term) {
  const std::string log = (fs::path(cfg.dir) / "runs.log").string();
  return spawn_wait({cfg.distlock, "run", "--url", cfg.url, "--once-per",
                     std::to_string(cfg.period_ms) + "ms", "--ttl", cfg.ttl, "--wait", "10s", "scheduler-job",
                     "--", "sh", "-c",
                     "echo \"$DISTLOCK_ONCE_SLOT " + std::to_string(cfg.node) + " ${DISTLOCK_TOKEN:-0} " +
                         term + "\" >> '" + log + "'"});
}

// Leader-less: one node, fires once at the start of each slot.
int run_node(const Config& cfg) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> skew(0, 100);
  int failures = 0;
  for (int t = 0; t < cfg.ticks; ++t) {
    const std::int64_t fire_at = (cfg.first_slot + t) * cfg.period_ms + skew(rng);
    while (unix_ms() < fire_at) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int rc = fire(cfg, "0");
    if (rc != 0) {
      std::fprintf(stderr, "scheduler: node %d: distlock run exited %d in tick %d\n", cfg.node, rc, t);
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

// Elected: runs as `distlock elect`'s command, i.e. only while this node leads. Fires each
// slot that has not ended yet; returns after the last one (elect then resigns).
int run_leader_loop(const Config& cfg) {
  const char* tok = std::getenv("DISTLOCK_TOKEN");
  const std::string term = tok && *tok ? tok : "0";
  // The pid file: who leads, in which term, and the pid of its `distlock elect` (our parent).
  const fs::path leader = fs::path(cfg.dir) / "leader";
  const fs::path tmp = fs::path(cfg.dir) / ("leader." + std::to_string(::getpid()));
  {
    std::ofstream out(tmp);
    out << cfg.node << ' ' << term << ' ' << ::getppid() << ' ' << ::getpid() << '\n';
  }
  fs::rename(tmp, leader);
  const std::string fires = (fs::path(cfg.dir) / "fires.log").string();
  const std::string ended = (fs::path(cfg.dir) / "ended.log").string();
  int failures = 0;
  for (int t = 0; t < cfg.ticks; ++t) {
    const std::int64_t slot = cfg.first_slot + t;
    // A slot whose first half has passed (before this node led) is left alone: fired that late,
    // the runner, which takes the slot from its clock when it starts, could already be in the
    // next slot.
    if (unix_ms() >= slot * cfg.period_ms + cfg.period_ms / 2) continue;
    while (unix_ms() < slot * cfg.period_ms) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const std::string entry = std::to_string(slot) + " " + std::to_string(cfg.node) + " " + term;
    append_line(fires, entry);
    const int rc = fire(cfg, term);
    append_line(ended, entry);
    if (rc != 0) {
      std::fprintf(stderr, "scheduler: leader node %d (term %s): distlock run exited %d in slot %lld\n",
                   cfg.node, term.c_str(), rc, static_cast<long long>(slot));
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

struct Killed {
  int node = -1;
  std::uint64_t term = 0;
  std::int64_t slot = 0;
  long waited_ms = 0;      // from the quarter-period point to the kill
  bool run_ended = false;  // the leader's run of the slot had ended (else the wait ran out)
};

// Whether ended.log has the line of `node`'s run of `slot` in term `term`.
bool run_has_ended(const Config& cfg, std::int64_t slot, int node, std::uint64_t term) {
  std::ifstream in(fs::path(cfg.dir) / "ended.log");
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::int64_t s = 0;
    int n = -1;
    std::uint64_t t = 0;
    if (ls >> s >> n >> t && s == slot && n == node && t == term) return true;
  }
  return false;
}

// A quarter of a period into slot first_slot + K, and not before the leader's run of that slot
// has ended (for at most three periods more): SIGKILL the `distlock elect` of the node named in
// the pid file. Killed in the middle of that run, the runner could die between its command and
// the --once-per mark, and the slot would rightly run again under the next leader (a busy CI
// machine saw it). Returns what was killed, or nothing (no leader, or not one of ours).
std::optional<Killed> kill_leader(const Config& cfg, std::int64_t first_slot,
                                  const std::vector<pid_t>& pids) {
  const std::int64_t slot = first_slot + cfg.kill_leader_at;
  const std::int64_t quarter = slot * cfg.period_ms + cfg.period_ms / 4;
  while (unix_ms() < quarter) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::ifstream in(fs::path(cfg.dir) / "leader");
  Killed k;
  k.slot = slot;
  long elect_pid = 0;
  if (!(in >> k.node >> k.term >> elect_pid) || k.node < 0 || k.node >= static_cast<int>(pids.size()) ||
      pids[static_cast<std::size_t>(k.node)] != static_cast<pid_t>(elect_pid)) {
    std::fprintf(stderr, "scheduler: no leader to kill in slot %lld\n", static_cast<long long>(slot));
    return std::nullopt;
  }
  const std::int64_t give_up = quarter + 3 * cfg.period_ms;
  while (!(k.run_ended = run_has_ended(cfg, slot, k.node, k.term)) && unix_ms() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  k.waited_ms = static_cast<long>(unix_ms() - quarter);
  if (::kill(static_cast<pid_t>(elect_pid), SIGKILL) != 0) {
    std::perror("scheduler: kill");
    return std::nullopt;
  }
  std::fprintf(
      stderr,
      "scheduler: killed the leader, node %d (term %llu), in slot %lld (%ld ms after the quarter, %s)\n",
      k.node, static_cast<unsigned long long>(k.term), static_cast<long long>(slot), k.waited_ms,
      k.run_ended ? "its run of the slot had ended" : "its run of the slot had not ended");
  return k;
}

struct Run {
  int node = 0;
  std::uint64_t token = 0;
  std::uint64_t term = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"a cron job run exactly once per period slot by an elected leader (or by every node)",
               "scheduler"};
  app.add_option("--url", cfg.url, "Lock service URL (default: $DISTLOCK_URL, else this host's file://)");
  app.add_option("--nodes", cfg.nodes, "Nodes (hosts) of the cluster")->check(CLI::Range(1, 64));
  app.add_option("--ticks", cfg.ticks, "Slots to fire in")->check(CLI::Range(1, 1000));
  app.add_option("--period", cfg.period_ms, "Slot length in milliseconds")->check(CLI::Range(200, 3600000));
  app.add_option("--distlock", cfg.distlock, "The distlock command-line tool");
  app.add_option("--dir", cfg.dir, "Where the logs go (default: a new temporary directory)");
  app.add_option("--ttl", cfg.ttl, "Leadership lease length (distlock elect --ttl)");
  auto* kill_opt =
      app.add_option("--kill-leader-at", cfg.kill_leader_at,
                     "SIGKILL the leader's distlock elect a quarter period into slot K (0-based)")
          ->check(CLI::NonNegativeNumber);
  auto* no_elect =
      app.add_flag("--no-elect", cfg.no_elect, "Leader-less: every node fires every slot (--once-per alone)");
  kill_opt->excludes(no_elect);
  app.add_option("--node", cfg.node, "(internal) run as node I")->group("");
  app.add_flag("--leader-loop", cfg.leader_loop, "(internal) run as the elected leader")->group("");
  app.add_option("--first-slot", cfg.first_slot, "(internal) the first slot")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (cfg.url.empty()) cfg.url = distlock::default_url();
  if (cfg.node >= 0) return cfg.leader_loop ? run_leader_loop(cfg) : run_node(cfg);
  if (cfg.kill_leader_at >= cfg.ticks) {
    std::fprintf(stderr, "scheduler: --kill-leader-at %d is not one of the %d slots\n", cfg.kill_leader_at,
                 cfg.ticks);
    return 2;
  }
  const bool elected = !cfg.no_elect;

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
  const std::string fires_log = (fs::path(cfg.dir) / "fires.log").string();
  fs::remove(log);
  fs::remove(fires_log);
  fs::remove(fs::path(cfg.dir) / "ended.log");
  fs::remove(fs::path(cfg.dir) / "leader");
  // Start at the slot after next, so every node is up (and a leader elected) before the first one begins.
  const std::int64_t first_slot = unix_ms() / cfg.period_ms + 2;
  std::vector<pid_t> pids;
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  for (int i = 0; i < cfg.nodes; ++i) {
    std::vector<std::string> a;
    if (elected) {
      a = {cfg.distlock, "elect", "--url",   cfg.url,
           "--ttl",      cfg.ttl, "--value", "node-" + std::to_string(i),
           kElection,    "--",    self,      "--leader-loop"};
    } else {
      a = {self};
    }
    for (const std::string& s :
         {std::string("--node"), std::to_string(i), std::string("--url"), cfg.url, std::string("--ticks"),
          std::to_string(cfg.ticks), std::string("--period"), std::to_string(cfg.period_ms),
          std::string("--distlock"), cfg.distlock, std::string("--dir"), cfg.dir, std::string("--ttl"),
          cfg.ttl, std::string("--first-slot"), std::to_string(first_slot)}) {
      a.push_back(s);
    }
    std::vector<char*> c;
    for (auto& s : a) c.push_back(s.data());
    c.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawnp(&pid, c[0], nullptr, nullptr, c.data(), environ) != 0) {
      std::perror("scheduler: posix_spawn");
      return 2;
    }
    pids.push_back(pid);
  }
  std::optional<Killed> killed;
  if (elected && cfg.kill_leader_at >= 0) killed = kill_leader(cfg, first_slot, pids);
  int node_failures = 0;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    int st = 0;
    while (::waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {
    }
    const bool was_killed = killed && static_cast<std::size_t>(killed->node) == i;
    const bool fine =
        was_killed ? (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) : (WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!fine) {
      std::fprintf(stderr, "scheduler: node %zu ended with wait status %d\n", i, st);
      ++node_failures;
    }
  }

  // Read the logs.
  long malformed = 0;
  std::map<std::int64_t, std::vector<Run>> runs;  // slot -> runs
  {
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);) {
      std::istringstream ls(line);
      std::int64_t slot = 0;
      Run r;
      if (ls >> slot >> r.node >> r.token >> r.term) {
        runs[slot].push_back(r);
      } else {
        ++malformed;
      }
    }
  }
  std::vector<std::pair<std::int64_t, Run>> fires;  // in the order they were fired
  {
    std::ifstream in(fires_log);
    for (std::string line; std::getline(in, line);) {
      std::istringstream ls(line);
      std::int64_t slot = 0;
      Run r;
      if (ls >> slot >> r.node >> r.term) {
        fires.push_back({slot, r});
      } else {
        ++malformed;
      }
    }
  }

  // Slots.
  long twice = 0, outside = 0, token_order = 0, total = 0;
  std::vector<std::int64_t> missed;
  std::uint64_t last_token = 0;
  for (std::int64_t s = first_slot; s < first_slot + cfg.ticks; ++s) {
    auto it = runs.find(s);
    if (it == runs.end()) {
      missed.push_back(s);
      continue;
    }
    if (it->second.size() > 1) ++twice;
    const std::uint64_t tok = it->second.front().token;
    if (tok != 0 && tok <= last_token) ++token_order;
    if (tok != 0) last_token = tok;
  }
  for (const auto& [s, v] : runs) {
    total += static_cast<long>(v.size());
    if (s < first_slot || s >= first_slot + cfg.ticks) outside += static_cast<long>(v.size());
  }

  nlohmann::ordered_json j;
  j["url"] = distlock::connect(cfg.url).url();
  j["mode"] = elected ? "elected" : "leaderless";
  j["nodes"] = cfg.nodes;
  j["ticks"] = cfg.ticks;
  j["period_ms"] = cfg.period_ms;
  bool ok = twice == 0 && outside == 0 && token_order == 0 && malformed == 0 && node_failures == 0;
  std::string summary;
  if (!elected) {
    ok = ok && missed.empty();
    j["fired"] = cfg.nodes * cfg.ticks;
    summary = std::to_string(cfg.nodes) + " nodes fired " + std::to_string(cfg.ticks) + " slots";
  } else {
    // Terms: in fires.log order never down, and one term is one node's; by slot, the same in runs.log.
    long term_order = 0;
    std::set<std::uint64_t> terms;
    // (A pointer, not std::optional<Run>: GCC 12 -O2 warns that an engaged optional's copy may be
    // uninitialized.)
    auto check_terms = [&term_order](const Run& r, const Run*& prev) {
      // Term 0: the backend has no terms (redlock://), nothing to check.
      if (prev && r.term != 0 && (r.term < prev->term || (r.term == prev->term && r.node != prev->node))) {
        ++term_order;
      }
      prev = &r;
    };
    const Run* prev = nullptr;
    for (const auto& [s, r] : fires) {
      check_terms(r, prev);
      terms.insert(r.term);
    }
    prev = nullptr;
    for (const auto& [s, v] : runs) {
      for (const Run& r : v) check_terms(r, prev);
    }
    // Fires that did not run: the slot had already run (the failover guard of --once-per).
    std::map<std::int64_t, long> fired_per_slot;
    for (const auto& [s, r] : fires) ++fired_per_slot[s];
    long guarded = 0;
    for (const auto& [s, n] : fired_per_slot) {
      auto it = runs.find(s);
      const long ran = it == runs.end() ? 0 : static_cast<long>(it->second.size());
      if (n > ran) guarded += n - ran;
    }
    // Takeover: the first fire of a term above the killed leader's. Every slot it fired from then on ran;
    // slots were missed only between the kill and the takeover.
    std::optional<std::pair<std::int64_t, std::uint64_t>> takeover;  // slot, term
    long after_takeover = 0, after_takeover_not_run = 0, missed_outside_failover = 0;
    bool kill_ok = true;
    if (cfg.kill_leader_at >= 0) {
      kill_ok = killed.has_value();
      for (const auto& [s, r] : fires) {
        if (killed && r.term > killed->term) {
          if (!takeover) takeover = {s, r.term};
          ++after_takeover;
          if (runs.find(s) == runs.end()) ++after_takeover_not_run;
        }
      }
      kill_ok = kill_ok && takeover.has_value();
      for (std::int64_t s : missed) {
        if (!killed || !takeover || s < killed->slot || s >= takeover->first) ++missed_outside_failover;
      }
    } else {
      missed_outside_failover = static_cast<long>(missed.size());
    }
    ok = ok && term_order == 0 && kill_ok && after_takeover_not_run == 0 && missed_outside_failover == 0;
    j["fired"] = fires.size();
    j["leaders"] = terms.size();
    j["term_order_violations"] = term_order;
    j["fires_guarded"] = guarded;
    if (killed) {
      j["killed_leader"] = {{"node", killed->node},
                            {"term", killed->term},
                            {"slot", killed->slot - first_slot},
                            {"waited_ms", killed->waited_ms},
                            {"run_ended", killed->run_ended}};
    } else {
      j["killed_leader"] = nullptr;
    }
    j["takeover_term"] =
        takeover ? nlohmann::ordered_json(takeover->second) : nlohmann::ordered_json(nullptr);
    j["takeover_slot"] =
        takeover ? nlohmann::ordered_json(takeover->first - first_slot) : nlohmann::ordered_json(nullptr);
    j["fired_after_takeover"] = after_takeover;
    j["fired_after_takeover_not_run"] = after_takeover_not_run;
    j["missed_outside_failover"] = missed_outside_failover;
    summary = "the leader of " + std::to_string(cfg.nodes) + " nodes (" + std::to_string(terms.size()) +
              " terms) fired " + std::to_string(fires.size()) + " times in " + std::to_string(cfg.ticks) +
              " slots";
  }
  const long missing = static_cast<long>(missed.size());
  j["runs"] = total;
  j["slots_run_once"] = static_cast<long>(cfg.ticks) - missing - twice;
  j["slots_run_twice"] = twice;
  j["slots_missed"] = missing;
  j["runs_outside_slots"] = outside;
  j["token_order_violations"] = token_order;
  j["node_failures"] = node_failures;
  j["log"] = log;
  j["ok"] = ok;
  std::printf("scheduler: %s of %ld ms each: %ld runs, %ld slots ran twice, %ld missed%s\n", summary.c_str(),
              cfg.period_ms, total, twice, missing, ok ? "" : " - VIOLATION");
  std::printf("%s\n", j.dump().c_str());
  return ok ? 0 : 1;
}
