// `distlock run --shards`: what the runner does to its jobs when the set of shards it owns
// changes, a shard's stop token fires, or a job is started (shard_runner.hpp).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "cli/run/shard_decisions.hpp"
#include "cli/run/shard_runner.hpp"

extern char** environ;

namespace distlock::cli::run {

namespace {

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

}  // namespace

void signal_job(const Job& j, int sig) noexcept {
  if (j.pid <= 0) return;
  ::kill(-j.group, sig);
  ::kill(j.pid, sig);
  if (sig == SIGTERM) ::kill(-j.group, SIGCONT);
}

// Shard `index` (the ownership whose stop token is `stop`) is being given up or lost: on
// the thread that fires its stop token.
void ShardRunner::on_shard_stop(std::uint32_t index, const std::stop_token& stop) noexcept {
  std::lock_guard lk(st_.mu);
  end_shard_locked(index, stop);
}

void ShardRunner::end_shard_locked(std::uint32_t index, const std::stop_token& stop) noexcept {
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

// On the group's thread.
void ShardRunner::on_change(const ShardAssignment& a) {
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

}  // namespace distlock::cli::run
