// `distlock run --shards M GROUP -- COMMAND`: this runner is a member of the shard group GROUP
// (Client::shard_group) and runs COMMAND for the shards it owns:
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
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <stop_token>
#include <thread>

#include "cli/run/run.hpp"
#include "cli/run/shard_decisions.hpp"
#include "distlock/shard_group.hpp"
#include "distlock/text.hpp"

extern char** environ;

namespace distlock::cli::run {

namespace {

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
void signal_job(const Job& j, int sig) noexcept {
  if (j.pid <= 0) return;
  ::kill(-j.group, sig);
  ::kill(j.pid, sig);
  if (sig == SIGTERM) ::kill(-j.group, SIGCONT);
}

std::string join_indexes(const std::vector<OwnedShard>& shards) {
  std::string out;
  for (const auto& s : shards) out += (out.empty() ? "" : ",") + std::to_string(s.index);
  return out;
}

std::string join_tokens(const std::vector<OwnedShard>& shards) {
  std::string out;
  for (const auto& s : shards) {
    out += (out.empty() ? "" : ",") + (s.token ? std::to_string(*s.token) : std::string("-"));
  }
  return out;
}

bool same_ownership(const OwnedShard& a, const OwnedShard& b) {
  return a.index == b.index && a.stop == b.stop;
}

bool same_set(const std::vector<OwnedShard>& a, const std::vector<OwnedShard>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), same_ownership);
}

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
  void on_shard_stop(std::uint32_t index, const std::stop_token& stop) noexcept {
    std::lock_guard lk(st_.mu);
    end_shard_locked(index, stop);
  }

  /// Acts on the job(s) of shard `index` (the ownership whose stop token is `stop`), which is
  /// being given up or lost: its stop token fired, or held() says it is no longer owned. Under
  /// st_.mu; a second call for the same ownership finds nothing left to do.
  void end_shard_locked(std::uint32_t index, const std::stop_token& stop) noexcept {
    if (s_.per_shard) {
      auto it = st_.jobs.find(index);
      if (it == st_.jobs.end() || it->second.shards.empty() || !(it->second.shards.front().stop == stop))
        return;
      if (it->second.killed) return;
      it->second.ended_by_runner = it->second.killed = true;
      signal_job(it->second, SIGKILL);
      return;
    }
    auto it = st_.jobs.find(0);
    if (it == st_.jobs.end()) return;
    Job& j = it->second;
    auto pos = std::find_if(j.shards.begin(), j.shards.end(),
                            [&](const OwnedShard& o) { return o.index == index && o.stop == stop; });
    if (pos == j.shards.end()) return;
    if (s_.restart_on_change) {
      if (j.killed) return;
      j.ended_by_runner = j.killed = true;
      signal_job(j, SIGKILL);
      return;
    }
    j.shards.erase(pos);
    write_shards_file(j.shards);  // before the signal, and before the shard is released
    if (j.shards.empty()) {
      if (!j.kill_at) {
        j.ended_by_runner = true;
        j.kill_at = SteadyClock::now() + s_.grace;
        signal_job(j, SIGTERM);
      }
    } else {
      j.hupped = true;
      signal_job(j, SIGHUP);
    }
  }

  // ---- on the group's thread ---------------------------------------------------------------
  void on_change(const ShardAssignment& a) {
    // Callbacks are registered (and dropped) outside the mutex: one whose token already fired
    // runs at once in this thread and takes the mutex itself.
    std::vector<std::unique_ptr<StopCallback>> dropped;
    for (const OwnedShard& o : a.shards) {
      auto it = callbacks_.find(o.index);
      if (it != callbacks_.end() && it->second.first == o.stop) continue;
      if (it != callbacks_.end()) dropped.push_back(std::move(it->second.second));
      callbacks_[o.index] = {o.stop, nullptr};
      callbacks_[o.index].second = std::make_unique<StopCallback>(o.stop, Forward{this, o.index, o.stop});
    }
    for (auto it = callbacks_.begin(); it != callbacks_.end();) {
      const bool kept = std::any_of(a.shards.begin(), a.shards.end(),
                                    [&](const OwnedShard& o) { return o.index == it->first; });
      if (kept) {
        ++it;
      } else {
        dropped.push_back(std::move(it->second.second));
        it = callbacks_.erase(it);
      }
    }
    dropped.clear();
    {
      std::lock_guard lk(st_.mu);
      st_.latest = a;
    }
    wake_->notify();
  }

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

void ShardRunner::write_shards_file(const std::vector<OwnedShard>& shards) noexcept {
  if (dir_.empty()) return;
  const std::string text = "DISTLOCK_SHARDS=" + join_indexes(shards) +
                           "\nDISTLOCK_TOKENS=" + join_tokens(shards) +
                           "\nDISTLOCK_SHARD_COUNT=" + std::to_string(s_.shards) + "\n";
  const std::string tmp = (dir_ / "shards.tmp").string(), final_path = (dir_ / "shards").string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (ok) ::rename(tmp.c_str(), final_path.c_str());
}

std::vector<std::string> ShardRunner::job_environment(const std::vector<OwnedShard>& shards) const {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    if (kv.starts_with("DISTLOCK_") && !kv.starts_with("DISTLOCK_LOG="))
      continue;  // an outer runner's, or the password
    env.emplace_back(kv);
  }
  env.push_back("DISTLOCK_NAME=" + s_.name);
  env.push_back("DISTLOCK_URL=" + url_);
  env.push_back("DISTLOCK_MEMBER=" + member_);
  env.push_back("DISTLOCK_SHARD_COUNT=" + std::to_string(s_.shards));
  if (s_.per_shard) {
    env.push_back("DISTLOCK_SHARD=" + std::to_string(shards.front().index));
    if (shards.front().token) env.push_back("DISTLOCK_TOKEN=" + std::to_string(*shards.front().token));
  } else {
    env.push_back("DISTLOCK_SHARDS=" + join_indexes(shards));
    env.push_back("DISTLOCK_TOKENS=" + join_tokens(shards));
    env.push_back("DISTLOCK_SHARDS_FILE=" + (dir_ / "shards").string());
  }
  return env;
}

bool ShardRunner::start_job(std::uint32_t key, std::vector<OwnedShard> shards) {
  if (!s_.per_shard) write_shards_file(shards);
  Job j;
  j.dog.emplace(Watchdog::start());
  ChildSpec spec;
  spec.argv = s_.command;
  spec.env = job_environment(shards);
  spec.process_group = j.dog->group();
  spec.signal_mask = signals_.previous_mask();
  spec.reset_sigpipe = reset_sigpipe_;
  spec.inherited_fds = inherited_fds_;
  try {
    Child c = spawn_child(spec);
    j.pid = c.pid();
    j.group = c.group();
  } catch (const ExecError& e) {
    exec_error_ = e.error;
    return false;
  }
  j.shards = std::move(shards);
  st_.jobs[key] = std::move(j);
  return true;
}

void ShardRunner::reconcile() {
  std::lock_guard lk(st_.mu);
  // A running job's shard that is no longer held (its local deadline passed, the watchdog has
  // not fired its stop token yet) is acted on now, as its stop token would.
  std::vector<std::pair<std::uint32_t, std::stop_token>> ended;
  for (const auto& [key, j] : st_.jobs) {
    for (const auto& o : j.shards)
      if (!shard_usable(o)) ended.emplace_back(o.index, o.stop);
  }
  for (const auto& [index, stop] : ended) end_shard_locked(index, stop);
  // What is owned now and not being given up: a token that fired, or a shard held() says is
  // not owned, is never started on nor written for SIGHUP.
  const std::vector<OwnedShard> live = usable_shards(st_.latest.shards);
  if (s_.per_shard) {
    for (const auto& o : live) {
      if (st_.jobs.count(o.index)) continue;
      if (std::any_of(finished_.begin(), finished_.end(),
                      [&](const std::stop_token& t) { return t == o.stop; }))
        continue;
      if (!start_job(o.index, {o})) return;
    }
    return;
  }
  auto it = st_.jobs.find(0);
  if (it == st_.jobs.end()) {
    if (!live.empty()) start_job(0, live);
    return;
  }
  Job& j = it->second;
  if (j.ended_by_runner || same_set(j.shards, live)) return;
  if (s_.restart_on_change || live.empty()) {
    j.ended_by_runner = true;
    j.kill_at = SteadyClock::now() + s_.grace;
    signal_job(j, SIGTERM);
    return;
  }
  j.shards = live;
  write_shards_file(j.shards);
  j.hupped = true;
  signal_job(j, SIGHUP);
}

std::optional<int> ShardRunner::reap() {
  std::optional<int> shared_status;
  for (int i = 0; i < 4096; ++i) {
    int status = 0;
    const pid_t r = ::waitpid(-1, &status, WNOHANG);
    if (r <= 0) break;
    std::lock_guard lk(st_.mu);
    for (auto it = st_.jobs.begin(); it != st_.jobs.end(); ++it) {
      if (it->second.pid != r) continue;
      Job& j = it->second;
      // A job that died of the SIGHUP that told it of a change (it had no handler yet, e.g. it
      // was still starting) is started again with the current set, as with --on-change restart.
      const bool died_of_hup = j.hupped && WIFSIGNALED(status) && WTERMSIG(status) == SIGHUP;
      if (!j.ended_by_runner && !died_of_hup) {
        if (s_.per_shard) {
          finished_.push_back(j.shards.front().stop);
          print_error("shard " + std::to_string(j.shards.front().index) + "'s command exited with status " +
                      std::to_string(exit_status_of(status)) +
                      "; not started again while the shard stays here");
        } else {
          shared_status = exit_status_of(status);
        }
      }
      st_.jobs.erase(it);  // the watchdog kills what is left of the job's group
      break;
    }
  }
  return shared_status;
}

void ShardRunner::forward(int sig) {
  std::lock_guard lk(st_.mu);
  for (auto& [key, j] : st_.jobs) {
    j.ended_by_runner = true;
    if (!j.kill_at) j.kill_at = SteadyClock::now() + s_.grace;
    signal_job(j, sig);
  }
}

int ShardRunner::next_timeout() {
  std::lock_guard lk(st_.mu);
  int timeout = -1;
  const auto now = SteadyClock::now();
  for (auto& [key, j] : st_.jobs) {
    if (!j.kill_at || j.killed) continue;
    if (now >= *j.kill_at) {
      j.killed = true;
      signal_job(j, SIGKILL);
      continue;
    }
    const int t = poll_timeout_until(*j.kill_at) + 1;
    timeout = timeout < 0 ? t : std::min(timeout, t);
  }
  // The earliest local deadline of a shard a job runs on: reconcile() acts on it then, not only
  // when the watchdog fires its stop token.
  for (const auto& [key, j] : st_.jobs) {
    if (j.killed) continue;
    const int t = ms_until_first_deadline(j.shards);
    if (t >= 0) timeout = timeout < 0 ? t : std::min(timeout, t);
  }
  // Orphaned processes of a killed job need no reaping here (the watchdog's group kill);
  // a killed first process is reaped at its SIGCHLD.
  return timeout;
}

/// What join()'s worker thread made: the client and the group, or the error. Handed to the main
/// thread through an atomic flag (done).
struct ShardJoin {
  std::optional<Client> client;
  std::optional<ShardGroup> group;
  std::string error;  // the line to print when it failed
  int status = 0;     // and the exit status then
};

// Connect and join on a worker thread; the main thread keeps reading the signalfd meanwhile
// (a connect to a server that does not answer lasts up to the URL's timeout, a join a few
// round trips more): a terminating signal is answered within kJoinLimit even then. The worker
// is given kJoinLimit to finish after the signal; a group it joined meanwhile is left at once
// (its membership released: the peers do not wait one TTL for it); one still joining is
// abandoned with the process (a membership it writes after that expires within one TTL).
std::optional<int> ShardRunner::join(std::optional<Client>& client, std::optional<ShardGroup>& group) {
  constexpr std::chrono::milliseconds kJoinLimit{3000};
  auto result = std::make_shared<ShardJoin>();
  auto done = std::make_shared<std::atomic<bool>>(false);
  const std::string dir = dir_;
  std::thread worker([this, result, done, wake = wake_] {
    try {
      ClientOptions options = tool_client_options();
      options.lock_defaults.ttl = s_.lock.ttl;
      result->client = connect(s_.url, options);
      ShardGroupOptions opts;
      opts.lock = s_.lock;
      opts.rebalance_period = s_.rebalance_period;
      opts.info = "pid=" + std::to_string(::getpid());
      opts.on_change = [this](const ShardAssignment& a) { on_change(a); };
      result->group.emplace(result->client->shard_group(s_.name, s_.shards, opts));
    } catch (const std::system_error& e) {
      result->error = "cannot join shard group \"" + s_.name + "\": " + std::string(e.what());
      result->status = exit_code_for(e.code());
    } catch (const std::exception& e) {
      result->error = "cannot join shard group \"" + s_.name + "\": " + std::string(e.what());
      result->status = exit_status::software;
    } catch (...) {
      result->error = "cannot join shard group \"" + s_.name + "\": unexpected error";
      result->status = exit_status::software;
    }
    done->store(true, std::memory_order_release);
    wake->notify();
  });
  std::optional<int> signal;
  std::optional<std::chrono::steady_clock::time_point> give_up_at;
  while (!done->load(std::memory_order_acquire)) {
    int timeout = -1;
    if (give_up_at) {
      if (std::chrono::steady_clock::now() >= *give_up_at) break;
      timeout = poll_timeout_until(*give_up_at) + 1;
    }
    poll_for(signals_, *wake_, timeout);
    wake_->drain();
    for (const auto& d : signals_.drain()) {
      if (is_catchable_stop(d.signal) && !signal) ::kill(::getpid(), SIGSTOP);  // Ctrl-Z while joining
      if (is_terminating(d.signal) && !signal) {
        signal = d.signal;
        give_up_at = std::chrono::steady_clock::now() + kJoinLimit;
      }
    }
  }
  if (!done->load(std::memory_order_acquire)) {
    worker.detach();  // still connecting or joining: it ends with the process
    if (!dir.empty()) std::filesystem::remove_all(dir);
    die_of_signal(*signal);
  }
  worker.join();
  if (signal) {
    if (result->group) result->group->leave();  // no job was started: the loop has not run
    if (!dir.empty()) std::filesystem::remove_all(dir);
    die_of_signal(*signal);
  }
  if (!result->group) {
    print_error(result->error);
    if (!dir.empty()) std::filesystem::remove_all(dir);
    return result->status;
  }
  client = std::move(result->client);
  group = std::move(result->group);
  member_ = group->member_id();
  return std::nullopt;
}

int ShardRunner::run() {
  std::optional<Client> client;
  std::optional<ShardGroup> group;
  url_ = child_url(s_.url);
  if (!s_.per_shard) {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/distlock-shards-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      print_error("cannot create a directory for $DISTLOCK_SHARDS_FILE under " +
                  pattern.substr(0, pattern.rfind('/')) + ": " + std::generic_category().message(errno));
      return exit_status::software;
    }
    dir_ = pattern;
  }
  if (std::optional<int> failed = join(client, group)) return *failed;

  int result = -1;
  std::optional<int> ending_signal;
  for (int rounds = 0;; ++rounds) {
    wake_->drain();
    for (const auto& d : signals_.drain()) {
      if (!is_terminating(d.signal) && !is_catchable_stop(d.signal)) continue;
      if (!ending_signal) ending_signal = d.signal;
      forward(d.signal);
    }
    if (std::optional<int> status = reap(); status && !ending_signal) {
      result = *status;  // the shared job ended on its own: the runner ends with its status
      ending_signal = 0;
      forward(SIGTERM);
    }
    if (exec_error_ != 0 && !ending_signal) {
      print_error("cannot run \"" + s_.command.front() +
                  "\": " + std::generic_category().message(exec_error_));
      result = exec_error_ == ENOENT ? exit_status::not_found : exit_status::cannot_execute;
      ending_signal = 0;
      forward(SIGTERM);
    }
    if (ending_signal) {
      std::lock_guard lk(st_.mu);
      if (st_.jobs.empty()) break;
    } else {
      reconcile();
    }
    poll_for(signals_, *wake_, next_timeout());
  }
  group->leave();
  callbacks_.clear();  // the group's thread has ended
  if (!dir_.empty()) std::filesystem::remove_all(dir_);
  if (result >= 0) return result;
  return 128 + *ending_signal;
}

}  // namespace

int run_shards(const RunSettings& s) {
  const std::vector<int> inherited_fds = open_fds();
  std::vector<int> blocked = terminating_signals();
  for (int sig : {SIGCHLD, SIGTTOU, SIGTSTP, SIGTTIN}) blocked.push_back(sig);
  SignalFd signals(blocked);
  struct sigaction ignore_pipe {};
  struct sigaction previous_pipe {};
  ignore_pipe.sa_handler = SIG_IGN;
  sigemptyset(&ignore_pipe.sa_mask);
  ::sigaction(SIGPIPE, &ignore_pipe, &previous_pipe);
  ShardRunner runner(s, signals, inherited_fds, previous_pipe.sa_handler == SIG_DFL);
  return runner.run();
}

}  // namespace distlock::cli::run
