// `distlock run --shards`: joining the group, the runner's main loop, reaping and signals
// (shard_runner.hpp says what the runner does and on which thread).
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

#include "cli/run/shard_decisions.hpp"
#include "cli/run/shard_runner.hpp"
#include "distlock/text.hpp"

namespace distlock::cli::run {

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

namespace {

/// What join()'s worker thread made: the client and the group, or the error. Handed to the main
/// thread through an atomic flag (done).
struct ShardJoin {
  std::optional<Client> client;
  std::optional<ShardGroup> group;
  std::string error;  // the line to print when it failed
  int status = 0;     // and the exit status then
};

}  // namespace

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
