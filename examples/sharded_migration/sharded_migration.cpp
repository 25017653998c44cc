// sharded_migration — the "asynchronous task migration" of a task table over 16 shards, run by
// worker processes that join and die while it runs (issue 31 §3).
//
// The table is a directory: rows 0..N-1, row r belonging to shard r % 16; per shard a fence
// file (the highest fencing token that wrote) and a log of the rows done ("row token" lines).
// Each worker is `distlock run --shards 16 --per-shard migration -- sharded_migration process`:
// the runner owns some shards and starts one `process` per owned shard with $DISTLOCK_SHARD and
// $DISTLOCK_TOKEN. A `process` first claims the shard's fence with its token (so a previous
// owner that still runs can no longer write), reads which rows are done, then does the rest,
// marking each row done with a fenced append (flock; rejected when a newer token claimed it).
//
//   sharded_migration drive --url URL --dir DIR --rows N --distlock PATH
//     creates the table, starts 3 workers, adds 2 when 20% of the rows are done, SIGKILLs 3 when
//     half are done, waits until every row is done, then checks that every row was done exactly
//     once and prints one JSON line: rows, processed, duplicates, missing, stale writes rejected,
//     and how long shards were unowned (no holder) and without a live owner (no holder, or one
//     whose runner was SIGKILLed and whose lease had not expired yet), per shard at most and in
//     total, from the group's locks listed every 20 ms from the moment all 16 were first owned.
//     Exit 0 when every row was done once.
//   sharded_migration process --dir DIR --rows N [--delay-ms D]
//     the per-shard job (run by `distlock run --per-shard`).
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <distlock/distlock.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr std::uint32_t kShards = 16;
const char* const kGroup = "migration";

fs::path fence_path(const fs::path& dir, std::uint32_t shard) {
  return dir / ("shard-" + std::to_string(shard) + ".fence");
}
fs::path done_path(const fs::path& dir, std::uint32_t shard) {
  return dir / ("shard-" + std::to_string(shard) + ".done");
}

/// The shard's fence file, locked (flock) for one fenced operation.
class FenceLock {
 public:
  FenceLock(const fs::path& dir, std::uint32_t shard) : fd_(::open(fence_path(dir, shard).c_str(), O_RDWR)) {
    if (fd_ < 0 || ::flock(fd_, LOCK_EX) != 0)
      throw std::runtime_error("cannot lock " + fence_path(dir, shard).string());
  }
  ~FenceLock() { ::close(fd_); }
  FenceLock(const FenceLock&) = delete;
  FenceLock& operator=(const FenceLock&) = delete;
  std::uint64_t fence() const {
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    return n > 0 ? std::strtoull(buf, nullptr, 10) : 0;
  }
  void set_fence(std::uint64_t token) const {
    const std::string text = std::to_string(token) + "\n";
    if (::ftruncate(fd_, 0) != 0 ||
        ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
      throw std::runtime_error("cannot write the fence");
  }

 private:
  int fd_;
};

std::set<std::uint64_t> rows_done(const fs::path& dir, std::uint32_t shard) {
  std::set<std::uint64_t> done;
  std::ifstream in(done_path(dir, shard));
  for (std::uint64_t row, token; in >> row >> token;) done.insert(row);
  return done;
}

/// The per-shard job: claim the fence, then do the rows not done yet.
int process(const fs::path& dir, std::uint64_t rows, int delay_ms) {
  const char* shard_text = std::getenv("DISTLOCK_SHARD");
  const char* token_text = std::getenv("DISTLOCK_TOKEN");
  if (!shard_text || !token_text) {
    std::fprintf(stderr, "process: run me under distlock run --shards %u --per-shard\n", kShards);
    return 64;
  }
  const auto shard = static_cast<std::uint32_t>(std::strtoul(shard_text, nullptr, 10));
  const std::uint64_t token = std::strtoull(token_text, nullptr, 10);
  std::set<std::uint64_t> done;
  {
    FenceLock lock(dir, shard);
    if (lock.fence() > token) {
      std::fprintf(stderr, "process: shard %u: token %llu is stale (fence %llu)\n", shard,
                   static_cast<unsigned long long>(token), static_cast<unsigned long long>(lock.fence()));
      return 3;
    }
    lock.set_fence(token);  // from now on, a previous owner's write is rejected
    done = rows_done(dir, shard);
  }
  for (std::uint64_t row = shard; row < rows; row += kShards) {
    if (done.count(row)) continue;
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));  // the row's work
    FenceLock lock(dir, shard);
    if (lock.fence() > token) {  // a newer owner claimed the shard: this write is rejected
      std::ofstream(dir / "stale", std::ios::app) << shard << " " << token << "\n";
      return 3;
    }
    std::ofstream(done_path(dir, shard), std::ios::app) << row << " " << token << "\n";
  }
  return 0;
}

/// Per shard, the stretches of time it was not in a set (observed every 20 ms).
struct Gaps {
  std::vector<std::optional<std::chrono::steady_clock::time_point>> since = decltype(since)(kShards);
  std::int64_t max_ms = 0, total_ms = 0;
  void observe(const std::set<std::uint32_t>& in, std::chrono::steady_clock::time_point now) {
    for (std::uint32_t s = 0; s < kShards; ++s) {
      if (!in.count(s) && !since[s]) since[s] = now;
      if (in.count(s) && since[s]) end(s, now);
    }
  }
  void close(std::chrono::steady_clock::time_point now) {
    for (std::uint32_t s = 0; s < kShards; ++s) {
      if (since[s]) end(s, now);
    }
  }
  void end(std::uint32_t s, std::chrono::steady_clock::time_point now) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - *since[s]).count();
    total_ms += ms;
    max_ms = std::max<std::int64_t>(max_ms, ms);
    since[s].reset();
  }
};

std::uint64_t count_done(const fs::path& dir) {
  std::uint64_t n = 0;
  for (std::uint32_t s = 0; s < kShards; ++s) {
    std::ifstream in(done_path(dir, s));
    for (std::string line; std::getline(in, line);) n += line.empty() ? 0 : 1;
  }
  return n;
}

pid_t start_worker(const std::string& distlock, const std::string& url, const fs::path& dir,
                   std::uint64_t rows, int delay_ms, int n) {
  const std::string self = fs::canonical("/proc/self/exe").string();
  std::vector<std::string> argv{distlock,
                                "run",
                                "--url",
                                url,
                                "--ttl",
                                "2s",
                                "--rebalance-period",
                                "200ms",
                                "--shards",
                                std::to_string(kShards),
                                "--per-shard",
                                kGroup,
                                "--",
                                self,
                                "process",
                                "--dir",
                                dir.string(),
                                "--rows",
                                std::to_string(rows),
                                "--delay-ms",
                                std::to_string(delay_ms)};
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const std::string log = (dir / ("worker-" + std::to_string(n) + ".err")).string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) ::dup2(fd, 2);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  return pid;
}

int drive(const std::string& url, const fs::path& dir, std::uint64_t rows, const std::string& distlock,
          int delay_ms, int limit_s) {
  fs::create_directories(dir);
  for (std::uint32_t s = 0; s < kShards; ++s) {
    std::ofstream(fence_path(dir, s)) << "0\n";
    std::ofstream(done_path(dir, s));
  }
  distlock::Client client = distlock::connect(url);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(limit_s);
  std::vector<pid_t> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(start_worker(distlock, url, dir, rows, delay_ms, i));
  int started = 3, killed = 0;
  bool added = false, cut = false, all_owned_once = false;
  Gaps unowned, orphaned;  // no holder; no holder that is a live worker
  std::set<pid_t> killed_pids;
  std::uint64_t done = 0;
  for (; std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    // Who owns which shard now (the group's shard locks, holder info "member=<id>"), and which
    // members are live runners (membership info "shards=16 pid=<runner pid>").
    std::map<std::string, pid_t> member_pid;
    const std::string members_prefix = std::string(kGroup) + "/members/";
    for (const auto& l : client.list(members_prefix, 1000)) {
      const std::string info = l.info.holder_info.value_or("");
      const auto at = info.find("pid=");
      member_pid[l.name.substr(members_prefix.size())] =
          at == std::string::npos ? 0 : static_cast<pid_t>(std::stol(info.substr(at + 4)));
    }
    std::set<std::uint32_t> owned, live_owned;
    const std::string shard_prefix = std::string(kGroup) + "/shard/";
    for (const auto& l : client.list(shard_prefix, 1000)) {
      const auto s = static_cast<std::uint32_t>(std::stoul(l.name.substr(shard_prefix.size())));
      owned.insert(s);
      const std::string info = l.info.holder_info.value_or("");
      const auto it = member_pid.find(info.rfind("member=", 0) == 0 ? info.substr(7) : std::string());
      if (it != member_pid.end() && !killed_pids.count(it->second)) live_owned.insert(s);
    }
    const auto now = std::chrono::steady_clock::now();
    if (!all_owned_once && owned.size() == kShards) all_owned_once = true;
    if (all_owned_once) {
      unowned.observe(owned, now);
      orphaned.observe(live_owned, now);
    }
    done = count_done(dir);
    if (done >= rows) break;
    if (!added && done * 5 >= rows) {  // 20% done: 3 -> 5 workers
      added = true;
      for (int i = 0; i < 2; ++i)
        workers.push_back(start_worker(distlock, url, dir, rows, delay_ms, started++));
    }
    if (added && !cut && done * 2 >= rows) {  // half done: SIGKILL three of them -> 2
      cut = true;
      for (int i = 0; i < 3; ++i) {
        ::kill(workers[i], SIGKILL);
        killed_pids.insert(workers[i]);
        ::waitpid(workers[i], nullptr, 0);
        ++killed;
      }
      workers.erase(workers.begin(), workers.begin() + 3);
    }
  }
  for (pid_t w : workers) ::kill(w, SIGTERM);
  for (pid_t w : workers) ::waitpid(w, nullptr, 0);
  // Exactly once: every row in exactly one "done" line.
  std::map<std::uint64_t, int> seen;
  for (std::uint32_t s = 0; s < kShards; ++s) {
    std::ifstream in(done_path(dir, s));
    for (std::uint64_t row, token; in >> row >> token;) ++seen[row];
  }
  std::uint64_t duplicates = 0, missing = 0;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const auto it = seen.find(r);
    if (it == seen.end()) {
      ++missing;
    } else if (it->second > 1) {
      duplicates += static_cast<std::uint64_t>(it->second - 1);
    }
  }
  std::uint64_t stale = 0;
  {
    std::ifstream in(dir / "stale");
    for (std::string line; std::getline(in, line);) stale += line.empty() ? 0 : 1;
  }
  nlohmann::ordered_json j;
  j["rows"] = rows;
  j["processed"] = seen.size();
  j["duplicates"] = duplicates;
  j["missing"] = missing;
  j["stale_writes_rejected"] = stale;
  j["workers_started"] = started;
  j["workers_killed"] = killed;
  const auto end = std::chrono::steady_clock::now();
  unowned.close(end);
  orphaned.close(end);
  j["max_unowned_ms"] = unowned.max_ms;
  j["total_unowned_ms"] = unowned.total_ms;
  j["max_without_live_owner_ms"] = orphaned.max_ms;
  j["total_without_live_owner_ms"] = orphaned.total_ms;
  j["elapsed_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s\n", j.dump().c_str());
  return duplicates == 0 && missing == 0 && cut ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"task migration over 16 shards (distlock run --shards --per-shard)", "sharded_migration"};
  app.require_subcommand(1);
  std::string url, dir, distlock_path;
  std::uint64_t rows = 2000;
  int delay_ms = 20, limit_s = 120;
  auto* drive_cmd =
      app.add_subcommand("drive", "create the table, run and churn the workers, check the result");
  drive_cmd->add_option("--url", url, "lock service URL")->required();
  drive_cmd->add_option("--dir", dir, "the table's directory")->required();
  drive_cmd->add_option("--rows", rows, "task rows");
  drive_cmd->add_option("--distlock", distlock_path, "the distlock tool")->required();
  drive_cmd->add_option("--delay-ms", delay_ms, "work per row");
  drive_cmd->add_option("--limit-s", limit_s, "give up after this many seconds");
  auto* process_cmd = app.add_subcommand("process", "the per-shard job");
  process_cmd->add_option("--dir", dir)->required();
  process_cmd->add_option("--rows", rows)->required();
  process_cmd->add_option("--delay-ms", delay_ms);
  CLI11_PARSE(app, argc, argv);
  try {
    if (*process_cmd) return process(dir, rows, delay_ms);
    return drive(url, dir, rows, distlock_path, delay_ms, limit_s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharded_migration: %s\n", e.what());
    return 70;
  }
}
