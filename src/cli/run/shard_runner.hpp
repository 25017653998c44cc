// `distlock run --shards M GROUP -- COMMAND` (docs/cli.md): this runner is a member of the
// shard group GROUP (Client::shard_group) and runs COMMAND for the shards it owns:
//   - shared (default): one job while at least one shard is owned, with DISTLOCK_SHARDS,
//     DISTLOCK_TOKENS, DISTLOCK_SHARD_COUNT and DISTLOCK_SHARDS_FILE; a change of the set is
//     told by rewriting that file (atomically, rename) and then SIGHUP to the job, or with
//     --on-change restart by ending the job and starting it again with the new set;
//   - --per-shard: one job per owned shard, with DISTLOCK_SHARD and DISTLOCK_TOKEN.
//
// Kill before hand-over: every owned shard's stop token carries a stop_callback that acts on
// the job synchronously, on the thread that fires the token — the group's thread before it
// releases the shard, or the lease's loss detection at the conservative local deadline — so
// the job is told (file + SIGHUP) or killed (SIGKILL: restart mode, --per-shard, and a shared
// job left with no shard gets SIGTERM) BEFORE another member can own the shard. A job is only
// started under the state mutex after checking that none of its shards' stop tokens fired and
// that each is held() at that moment (shard_decisions.hpp); a token firing meanwhile waits for
// the mutex, so it finds the job and acts on it.
//
// Never on the watchdog alone: the stop tokens are fired by the engine's watchdog thread, which
// a starved runner schedules after the lease's local deadline. The main loop also wakes up at
// the earliest local deadline of the shards its jobs run on (OwnedShard::remaining()) and, in
// reconcile(), acts on every shard of a job that held() no longer owns exactly as on its stop
// token (kill, or file + SIGHUP); the set it starts a job with or writes for SIGHUP holds only
// shards held() at that moment.
//
// Thread-safety: the main thread runs the loop; the group's thread runs on_change and (with
// the lease renewer) the stop callbacks; everything they share is in ShardRunner::State under
// its mutex.
//
// Code: shard_jobs.cpp (what a change of the owned set or a fired stop token does to the
// jobs, and starting one), shards.cpp (joining, the main loop, reaping and signals).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "cli/run/run.hpp"
#include "distlock/shard_group.hpp"

namespace distlock::cli::run {

/// One running job (a process group led by its watchdog).
struct Job {
  std::optional<Watchdog> dog;
  pid_t pid = -1;
  pid_t group = -1;
  std::vector<OwnedShard> shards;  // shared: what the job was last told; per-shard: its one shard
  bool ended_by_runner = false;    // SIGTERM/SIGKILL sent by the runner (loss, change, empty set)
  bool killed = false;
  bool hupped = false;  // told of a change by SIGHUP: dying of it (not handled yet) is a restart
  std::optional<SteadyClock::time_point> kill_at;  // SIGTERM sent: SIGKILL then
};

/// Sends `sig` to the job's process group and its first process (never to other jobs).
void signal_job(const Job& j, int sig) noexcept;

class ShardRunner {
 public:
  ShardRunner(const RunSettings& s, SignalFd& signals, std::vector<int> inherited_fds, bool reset_sigpipe)
      : s_(s), signals_(signals), inherited_fds_(std::move(inherited_fds)), reset_sigpipe_(reset_sigpipe) {}

  int run();

 private:
  /// Connects and joins the group (worker thread; signals read meanwhile): nullopt when
  /// joined, else the exit status (a terminating signal meanwhile: the runner dies of it).
  std::optional<int> join(std::optional<Client>& client, std::optional<ShardGroup>& group);

  struct State {
    std::mutex mu;
    ShardAssignment latest;
    std::map<std::uint32_t, Job> jobs;  // shared: key 0; per-shard: the shard's index
  };

  // ---- on the thread that fires a shard's stop token -------------------------------------
  /// Shard `index` (the ownership whose stop token is `stop`) is being given up or lost.
  void on_shard_stop(std::uint32_t index, const std::stop_token& stop) noexcept;

  /// Acts on the job(s) of shard `index` (the ownership whose stop token is `stop`), which is
  /// being given up or lost: its stop token fired, or held() says it is no longer owned. Under
  /// st_.mu; a second call for the same ownership finds nothing left to do.
  void end_shard_locked(std::uint32_t index, const std::stop_token& stop) noexcept;

  // ---- on the group's thread ---------------------------------------------------------------
  void on_change(const ShardAssignment& a);

  // ---- main thread ---------------------------------------------------------------------------
  void write_shards_file(const std::vector<OwnedShard>& shards) noexcept;
  std::vector<std::string> job_environment(const std::vector<OwnedShard>& shards) const;
  /// Starts a job for `shards` (under st_.mu); false if it cannot be executed (`exec_error`).
  bool start_job(std::uint32_t key, std::vector<OwnedShard> shards);
  void reconcile();
  /// Reaps; returns the exit status of a shared job that ended on its own, else nullopt.
  std::optional<int> reap();
  void forward(int sig);
  int next_timeout();

  struct Forward {
    ShardRunner* self;
    std::uint32_t index;
    std::stop_token stop;
    void operator()() const noexcept { self->on_shard_stop(index, stop); }
  };
  using StopCallback = std::stop_callback<Forward>;

  const RunSettings& s_;
  SignalFd& signals_;
  std::vector<int> inherited_fds_;
  bool reset_sigpipe_;
  std::shared_ptr<Wakeup> wake_ = std::make_shared<Wakeup>();
  State st_;
  std::map<std::uint32_t, std::pair<std::stop_token, std::unique_ptr<StopCallback>>>
      callbacks_;                          // group thread
  std::vector<std::stop_token> finished_;  // --per-shard: ownerships whose job ended on its own
  std::filesystem::path dir_;              // holds the shards file
  std::string url_;
  std::string member_;
  int exec_error_ = 0;
};

}  // namespace distlock::cli::run
