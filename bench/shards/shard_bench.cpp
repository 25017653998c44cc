// distlock-shard-bench — how fast a shard group (include/distlock/shard_group.hpp) rebalances.
//
//   distlock-shard-bench [--backend file,redis,etcd,zk,postgres | --url URL] [--members W]
//                        [--shards M] [--rounds R] [--ttl-ms T] [--period-ms P]
//                        [--phase-timeout-ms D]
//
// Per backend: --backend starts its own server on a free loopback port in a temporary
// directory (the test harnesses of tests/support/backend_targets: one redis-server, etcd as
// one member, ZooKeeper standalone with a 200 ms tick, one PostgreSQL), stopped by pid at the
// end; --url uses a server that runs already. Each round makes a fresh group of M shards with
// W member processes (this program re-executed with --member; each one a Client of its own,
// as separate machines would be), and measures:
//   join_ms         from a new member holding its membership (after the W-1 others balanced)
//                   to a balanced assignment among the W (every shard owned by a live member,
//                   each member ⌊M/W⌋ or ⌈M/W⌉);
//   leave_ms        from a member's leave() (on SIGTERM) to all its shards owned again by the
//                   others, balanced;
//   kill_ms         from a SIGKILL of a member to all its shards owned again, balanced
//                   (expected ≈ TTL + rebalance period; less on file://, whose kernel locks a
//                   dead process loses at once);
//   max_unowned_ms  the longest time any one shard had no live owner during the round's three
//                   phases (a shard held by the killed member's unexpired lease counts as
//                   unowned: nobody works on it).
// On redis (--backend redis), also what the server sees, from INFO commandstats and DBSIZE:
//   steady_commands_per_s  every command of the W-1 balanced members, per second, over three
//                          rebalance periods (their listings and renewals);
//   join_commands          the commands from the joiner's start to balance, less the steady rate
//                          over that time: what the join cost (the joiner's connection set-up,
//                          its membership, the hand-overs, the moved shards' acquisitions);
//   moved_shards, join_commands_per_moved_shard;
//   server_keys            DBSIZE once the W members balanced, beside M + W.
// Ownership is what each member was told: a shard is owned from the on_change that listed it
// until its stop token fired (or its member was killed). Every time is a steady_clock
// (CLOCK_MONOTONIC) reading, taken in the member that saw the event or in this process before
// kill(); all processes run on one host, so the readings are comparable.
//
// Output: one JSON line per backend with the median, min and max of each figure over the
// rounds, and the figures of every round. Bounded: at most 20 rounds, 64 members, 4096 shards,
// and each phase gives up after --phase-timeout-ms (the figure is then null and "timeouts"
// counts it). Measurements only: nothing here asserts a time.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#ifdef DISTLOCK_SHARD_BENCH_REDIS_PROBE
#include <hiredis/hiredis.h>
#endif
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/backend_targets.hpp"

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch()).count();
}

// ---- member process -------------------------------------------------------------------

std::mutex g_out_mu;
void emit(const std::string& line) {
  std::lock_guard lk(g_out_mu);
  std::string l = line + "\n";
  const char* p = l.data();
  std::size_t left = l.size();
  while (left > 0) {
    const ssize_t n = ::write(STDOUT_FILENO, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

// Prints "G <ns> <shard>" when told of a shard, "S <ns> <shard>" when its stop token fires,
// "J <ns>" once a member, "L <ns>" before leave() (on SIGTERM), "E <ns>" after it.
int run_member(const std::string& url, const std::string& job, std::uint32_t shards, long ttl_ms,
               long period_ms, const std::string& id) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  try {
    distlock::ClientOptions co;
    co.lock_defaults.ttl = std::chrono::milliseconds(ttl_ms);
    distlock::Client client = distlock::connect(url, co);
    std::mutex mu;
    // Stop callbacks of the shards told, keyed by (shard, token): one per ownership.
    std::map<std::pair<std::uint32_t, std::uint64_t>,
             std::unique_ptr<std::stop_callback<std::function<void()>>>>
        watching;
    distlock::ShardGroupOptions o;
    o.lock.ttl = std::chrono::milliseconds(ttl_ms);
    o.rebalance_period = std::chrono::milliseconds(period_ms);
    o.member_id = id;
    o.on_change = [&](const distlock::ShardAssignment& a) {
      std::lock_guard lk(mu);
      for (const auto& s : a.shards) {
        const auto key = std::make_pair(s.index, s.token.value_or(0));
        if (watching.contains(key)) continue;
        emit("G " + std::to_string(now_ns()) + " " + std::to_string(s.index));
        const std::uint32_t index = s.index;
        watching.emplace(key, std::make_unique<std::stop_callback<std::function<void()>>>(
                                  s.stop, std::function<void()>([index] {
                                    emit("S " + std::to_string(now_ns()) + " " + std::to_string(index));
                                  })));
      }
    };
    distlock::ShardGroup group = client.shard_group(job, shards, o);
    emit("J " + std::to_string(now_ns()));
    int sig = 0;
    sigwait(&set, &sig);
    emit("L " + std::to_string(now_ns()));
    group.leave();
    emit("E " + std::to_string(now_ns()));
    std::lock_guard lk(mu);
    watching.clear();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "member %s: %s\n", id.c_str(), e.what());
    return 1;
  }
  return 0;
}

// ---- coordinator ------------------------------------------------------------------------

struct Member {
  std::string id;
  pid_t pid = -1;
  int fd = -1;
  std::string buf;
  bool live = false;  // joined and neither left nor killed
  bool gone = false;  // left or killed
  std::optional<std::int64_t> joined_ns, leave_ns;
  std::set<std::uint32_t> owned;
};

struct Interval {
  std::int64_t start, end;  // end: INT64_MAX while owned
};

class Round {
 public:
  Round(std::string self, std::string url, std::string job, std::uint32_t shards, long ttl_ms, long period_ms,
        std::chrono::milliseconds phase_timeout)
      : self_(std::move(self)),
        url_(std::move(url)),
        job_(std::move(job)),
        shards_(shards),
        ttl_ms_(ttl_ms),
        period_ms_(period_ms),
        phase_timeout_(phase_timeout),
        open_(shards),
        intervals_(shards) {}
  ~Round() {
    for (auto& m : members_) {
      if (m.pid > 0) {
        ::kill(m.pid, SIGKILL);
        ::waitpid(m.pid, nullptr, 0);
      }
      if (m.fd >= 0) ::close(m.fd);
    }
  }
  Round(const Round&) = delete;
  Round& operator=(const Round&) = delete;

  std::size_t spawn() {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    Member m;
    m.id = "m" + std::to_string(members_.size());
    std::vector<std::string> args{self_,
                                  "--member",
                                  m.id,
                                  "--url",
                                  url_,
                                  "--job",
                                  job_,
                                  "--shards",
                                  std::to_string(shards_),
                                  "--ttl-ms",
                                  std::to_string(ttl_ms_),
                                  "--period-ms",
                                  std::to_string(period_ms_)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::dup2(p[1], STDOUT_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(p[1]);
    m.pid = pid;
    m.fd = p[0];
    members_.push_back(std::move(m));
    return members_.size() - 1;
  }

  /// Reads what members printed until `done()` holds or the timeout passes; returns the time
  /// of the event that made it hold, or nullopt on timeout.
  std::optional<std::int64_t> until(const std::function<bool()>& done) {
    const auto end = SteadyClock::now() + phase_timeout_;
    if (done()) return last_event_ns_;
    // Lines read before the last phase ended but not handled yet come first.
    for (std::size_t i = 0; i < members_.size(); ++i)
      if (handle_lines(i, done)) return last_event_ns_;
    while (SteadyClock::now() < end) {
      std::vector<pollfd> fds;
      std::vector<std::size_t> who;
      for (std::size_t i = 0; i < members_.size(); ++i) {
        if (members_[i].fd < 0) continue;
        fds.push_back({members_[i].fd, POLLIN, 0});
        who.push_back(i);
      }
      if (fds.empty()) return std::nullopt;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - SteadyClock::now());
      if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<long>(1, left.count()))) <= 0) continue;
      for (std::size_t k = 0; k < fds.size(); ++k) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Member& m = members_[who[k]];
        char buf[4096];
        const ssize_t n = ::read(m.fd, buf, sizeof buf);
        if (n <= 0) {
          ::close(m.fd);
          m.fd = -1;
          continue;
        }
        m.buf.append(buf, static_cast<std::size_t>(n));
        if (handle_lines(who[k], done)) return last_event_ns_;
      }
    }
    return std::nullopt;
  }

  /// Handles the complete lines member i printed, one by one, until `done()` holds (true) or
  /// none is left (false); the rest stays for the next phase.
  bool handle_lines(std::size_t i, const std::function<bool()>& done) {
    Member& m = members_[i];
    for (std::size_t nl; (nl = m.buf.find('\n')) != std::string::npos;) {
      const std::string line = m.buf.substr(0, nl);
      m.buf.erase(0, nl + 1);
      event(i, line);
      if (done()) return true;
    }
    return false;
  }

  std::size_t owned_count(std::size_t i) const { return members_[i].owned.size(); }
  long period_ms() const { return period_ms_; }

  /// Every shard owned by exactly one live member, each live member ⌊M/W⌋ or ⌈M/W⌉ of them.
  bool balanced() const {
    std::size_t live = 0;
    std::vector<int> owners(shards_, 0);
    for (const auto& m : members_) {
      if (!m.live) continue;
      ++live;
      for (auto s : m.owned) ++owners[s];
    }
    if (live == 0) return false;
    for (int o : owners)
      if (o != 1) return false;
    const std::size_t lo = shards_ / live, hi = (shards_ + live - 1) / live;
    for (const auto& m : members_)
      if (m.live && (m.owned.size() < lo || m.owned.size() > hi)) return false;
    return true;
  }
  bool joined(std::size_t i) const { return members_[i].joined_ns.has_value(); }
  std::int64_t joined_ns(std::size_t i) const { return *members_[i].joined_ns; }
  std::optional<std::int64_t> leave_ns(std::size_t i) const { return members_[i].leave_ns; }

  void terminate(std::size_t i) { ::kill(members_[i].pid, SIGTERM); }
  /// SIGKILL: its shards have no live owner from this moment.
  std::int64_t kill(std::size_t i) {
    Member& m = members_[i];
    const std::int64_t t = now_ns();
    ::kill(m.pid, SIGKILL);
    ::waitpid(m.pid, nullptr, 0);
    m.pid = -1;
    m.live = false;
    m.gone = true;
    for (auto s : m.owned) close_interval(i, s, t);
    m.owned.clear();
    return t;
  }
  /// Waits (bounded) for the members still running to exit after SIGTERM; SIGKILL after.
  void stop_all() {
    for (auto& m : members_)
      if (m.pid > 0) ::kill(m.pid, SIGTERM);
    const auto end = SteadyClock::now() + 10s;
    for (auto& m : members_) {
      while (m.pid > 0) {
        if (::waitpid(m.pid, nullptr, WNOHANG) == m.pid) {
          m.pid = -1;
        } else if (SteadyClock::now() > end) {
          ::kill(m.pid, SIGKILL);
          ::waitpid(m.pid, nullptr, 0);
          m.pid = -1;
        } else {
          std::this_thread::sleep_for(10ms);
        }
      }
    }
  }

  /// The longest time in [from, to] during which some shard had no live owner, in ms.
  double max_unowned_ms(std::int64_t from, std::int64_t to) const {
    std::int64_t worst = 0;
    for (std::uint32_t s = 0; s < shards_; ++s) {
      std::vector<Interval> iv = intervals_[s];
      for (const auto& [member, start] : open_[s]) iv.push_back({start, INT64_MAX});
      std::sort(iv.begin(), iv.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
      std::int64_t covered = from;  // owned up to here
      for (const auto& i : iv) {
        if (i.end <= covered) continue;
        if (i.start > covered) {
          worst = std::max(worst, std::min(i.start, to) - covered);
          if (i.start >= to) break;
        }
        covered = std::max(covered, i.end);
        if (covered >= to) break;
      }
      if (covered < to) worst = std::max(worst, to - covered);
    }
    return static_cast<double>(worst) / 1e6;
  }

 private:
  void close_interval(std::size_t member, std::uint32_t s, std::int64_t t) {
    auto& open = open_[s];
    auto it = open.find(member);
    if (it == open.end()) return;
    intervals_[s].push_back({it->second, t});
    open.erase(it);
  }

  void event(std::size_t i, const std::string& line) {
    Member& m = members_[i];
    if (std::getenv("DISTLOCK_SHARD_BENCH_TRACE"))
      std::fprintf(stderr, "%s %s\n", m.id.c_str(), line.c_str());
    std::istringstream in(line);
    char kind = 0;
    std::int64_t t = 0;
    in >> kind >> t;
    if (!in) return;
    last_event_ns_ = t;
    std::uint32_t s = 0;
    switch (kind) {
      case 'J':
        m.joined_ns = t;
        m.live = !m.gone;
        break;
      case 'G':
        if (in >> s && s < shards_ && !m.gone) {
          m.owned.insert(s);
          open_[s][i] = t;
        }
        break;
      case 'S':
        if (in >> s && s < shards_) {
          m.owned.erase(s);
          close_interval(i, s, t);
        }
        break;
      case 'L':
        m.leave_ns = t;
        m.live = false;
        m.gone = true;
        break;
      default: break;
    }
  }

  std::string self_, url_, job_;
  std::uint32_t shards_;
  long ttl_ms_, period_ms_;
  std::chrono::milliseconds phase_timeout_;
  std::vector<Member> members_;
  std::vector<std::map<std::size_t, std::int64_t>> open_;  // shard -> member -> since
  std::vector<std::vector<Interval>> intervals_;
  std::int64_t last_event_ns_ = 0;
};

#ifdef DISTLOCK_SHARD_BENCH_REDIS_PROBE
/// A plain connection to the benchmark's own redis-server (nothing else uses it): the server's
/// total command count and its number of keys.
class RedisProbe {
 public:
  explicit RedisProbe(const std::string& url) {
    // redis://host:port
    const auto at = url.find("://");
    const std::string hp = url.substr(at == std::string::npos ? 0 : at + 3);
    const auto colon = hp.rfind(':');
    if (colon == std::string::npos) return;
    const std::string host = hp.substr(0, colon);
    const int port = std::atoi(hp.substr(colon + 1).c_str());
    ctx_ = redisConnect(host.c_str(), port);
    if (ctx_ != nullptr && ctx_->err) {
      redisFree(ctx_);
      ctx_ = nullptr;
    }
  }
  ~RedisProbe() {
    if (ctx_ != nullptr) redisFree(ctx_);
  }
  RedisProbe(const RedisProbe&) = delete;
  RedisProbe& operator=(const RedisProbe&) = delete;
  bool ok() const { return ctx_ != nullptr; }

  /// The sum of calls= over INFO commandstats, less the probe's own INFO calls.
  std::optional<long long> commands() {
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "INFO commandstats"));
    if (r == nullptr) return std::nullopt;
    long long total = 0;
    if (r->type == REDIS_REPLY_STRING) {
      std::istringstream in(std::string(r->str, r->len));
      for (std::string line; std::getline(in, line);) {
        const auto p = line.find("calls=");
        if (line.rfind("cmdstat_", 0) != 0 || p == std::string::npos) continue;
        total += std::atoll(line.c_str() + p + 6);
      }
    }
    freeReplyObject(r);
    ++own_;
    return total - own_;
  }
  std::optional<long long> keys() {
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "DBSIZE"));
    if (r == nullptr) return std::nullopt;
    const long long n = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    ++own_;
    return n;
  }

 private:
  redisContext* ctx_ = nullptr;
  long long own_ = 0;
};
#else
class RedisProbe {  // built without hiredis: no server figures
 public:
  explicit RedisProbe(const std::string&) {}
  bool ok() const { return false; }
  std::optional<long long> commands() { return std::nullopt; }
  std::optional<long long> keys() { return std::nullopt; }
};
#endif

struct Config {
  std::vector<std::string> backends;
  std::string url;
  int members = 4;
  std::uint32_t shards = 16;
  int rounds = 3;
  long ttl_ms = 2000;
  long period_ms = 300;
  long phase_timeout_ms = 30000;
};

nlohmann::json ms_or_null(std::optional<std::int64_t> from, std::optional<std::int64_t> to) {
  if (!from || !to) return nullptr;
  return static_cast<double>(*to - *from) / 1e6;
}

nlohmann::json one_round(const Config& c, const std::string& self, const std::string& url,
                         const std::string& job, RedisProbe* probe) {
  Round r(self, url, job, c.shards, c.ttl_ms, c.period_ms, std::chrono::milliseconds(c.phase_timeout_ms));
  const int w = c.members;
  nlohmann::json out;
  // W-1 members, balanced.
  for (int i = 0; i < w - 1; ++i) r.spawn();
  auto all_joined = [&](int n) {
    for (int i = 0; i < n; ++i)
      if (!r.joined(static_cast<std::size_t>(i))) return false;
    return true;
  };
  if (!r.until([&] { return all_joined(w - 1) && r.balanced(); })) {
    out["error"] = "the first " + std::to_string(w - 1) + " members did not balance";
    return out;
  }
  // The server's steady traffic of the balanced W-1, over three periods (redis only).
  std::optional<double> steady_per_ns;
  std::optional<long long> join_calls_from;
  if (probe != nullptr) {
    const auto c0 = probe->commands();
    const std::int64_t t0 = now_ns();
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * c.period_ms));
    const auto c1 = probe->commands();
    const std::int64_t t1 = now_ns();
    if (c0 && c1 && t1 > t0) steady_per_ns = static_cast<double>(*c1 - *c0) / static_cast<double>(t1 - t0);
    join_calls_from = probe->commands();
  }
  // Join.
  const std::int64_t spawn_at = now_ns();
  const std::size_t joiner = r.spawn();
  std::optional<std::int64_t> join_at, join_done, leave_at, leave_done, kill_at, kill_done;
  if (r.until([&] { return r.joined(joiner); })) join_at = r.joined_ns(joiner);
  if (join_at) join_done = r.until([&] { return r.balanced(); });
  if (probe != nullptr && join_done && steady_per_ns && join_calls_from) {
    const auto calls = probe->commands();
    const auto keys = probe->keys();
    const std::size_t moved = r.owned_count(joiner);
    out["steady_commands_per_s"] = std::round(*steady_per_ns * 1e9);
    if (calls) {
      const double extra = static_cast<double>(*calls - *join_calls_from) -
                           *steady_per_ns * static_cast<double>(*join_done - spawn_at);
      out["join_commands"] = std::round(extra);
      out["moved_shards"] = moved;
      if (moved > 0)
        out["join_commands_per_moved_shard"] = std::round(extra / static_cast<double>(moved) * 10) / 10;
    }
    if (keys) {
      out["server_keys"] = *keys;
      out["shards_plus_members"] = c.shards + static_cast<std::uint32_t>(w);
    }
  }
  const std::int64_t from = join_at.value_or(0);
  // Graceful leave of member 0.
  r.terminate(0);
  if (r.until([&] { return r.leave_ns(0).has_value(); })) leave_at = r.leave_ns(0);
  if (leave_at) leave_done = r.until([&] { return r.balanced(); });
  // SIGKILL of member 1.
  kill_at = r.kill(1);
  kill_done = r.until([&] { return r.balanced(); });
  const std::int64_t to = now_ns();
  out["join_ms"] = ms_or_null(join_at, join_done);
  out["leave_ms"] = ms_or_null(leave_at, leave_done);
  out["kill_ms"] = ms_or_null(kill_at, kill_done);
  if (join_at) {
    out["max_unowned_ms"] = r.max_unowned_ms(from, to);
    out["max_unowned_join_ms"] = r.max_unowned_ms(from, leave_at.value_or(to));
    if (leave_at) out["max_unowned_leave_ms"] = r.max_unowned_ms(*leave_at, *kill_at);
    out["max_unowned_kill_ms"] = r.max_unowned_ms(*kill_at, to);
  } else {
    out["max_unowned_ms"] = nullptr;
  }
  r.stop_all();
  return out;
}

nlohmann::json summary(const std::vector<nlohmann::json>& rounds, const std::string& key, int& timeouts) {
  std::vector<double> v;
  for (const auto& r : rounds) {
    if (r.contains(key) && r[key].is_number()) {
      v.push_back(r[key].get<double>());
    } else {
      ++timeouts;
    }
  }
  if (v.empty()) return nullptr;
  std::sort(v.begin(), v.end());
  const double median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  auto r1 = [](double x) { return std::round(x * 10) / 10; };  // 0.1 ms
  return {{"median", r1(median)}, {"min", r1(v.front())}, {"max", r1(v.back())}, {"n", v.size()}};
}

int run(const Config& c, const std::string& self) {
  struct Backend {
    std::string label;
    std::unique_ptr<distlock::testing::Target> target;
    std::string url;
  };
  std::vector<std::string> labels = c.backends;
  if (!c.url.empty()) labels = {""};
  int failures = 0;
  for (const auto& label : labels) {
    Backend b{label, nullptr, c.url};
    try {
      if (!label.empty()) {
        const std::string kind = label == "etcd" ? "etcd1" : label == "zk" ? "zk1" : label;
        for (auto& k : distlock::testing::kinds())
          if (k.label == kind) b.target = k.make({});
        if (!b.target) throw std::runtime_error("backend " + label + " is not in this build");
        b.url = b.target->url();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "distlock-shard-bench: cannot start %s: %s\n", label.c_str(), e.what());
      ++failures;
      continue;
    }
    std::unique_ptr<RedisProbe> probe;
    if (label == "redis") {
      probe = std::make_unique<RedisProbe>(b.url);
      if (!probe->ok()) probe.reset();
    }
    std::vector<nlohmann::json> rounds;
    for (int i = 0; i < c.rounds; ++i) {
      const std::string job = "rebalance-bench-" + std::to_string(::getpid()) + "-" + std::to_string(i);
      rounds.push_back(one_round(c, self, b.url, job, probe.get()));
    }
    int timeouts = 0;
    nlohmann::json line = {
        {"workload", "rebalance"}, {"backend", label.empty() ? b.url.substr(0, b.url.find(':')) : label},
        {"members", c.members},    {"shards", c.shards},
        {"ttl_ms", c.ttl_ms},      {"period_ms", c.period_ms},
        {"rounds", c.rounds}};
    for (const char* k : {"join_ms", "leave_ms", "kill_ms", "max_unowned_ms"})
      line[k] = summary(rounds, k, timeouts);
    if (probe) {
      int ignored = 0;
      for (const char* k :
           {"steady_commands_per_s", "join_commands", "join_commands_per_moved_shard", "server_keys"})
        line[k] = summary(rounds, k, ignored);
    }
    line["timeouts"] = timeouts;
    line["per_round"] = rounds;
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
    if (timeouts) ++failures;
  }
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distlock-shard-bench: shard group rebalance times, one JSON line per backend"};
  Config c;
  std::string member, job, backends = "file,redis,etcd,zk,postgres";
  app.add_option("--backend", backends, "backends to start and measure, comma-separated");
  app.add_option("--url", c.url, "measure on this running server instead");
  app.add_option("--members", c.members, "W, members at the join (>= 3)")->check(CLI::Range(3, 64));
  app.add_option("--shards", c.shards, "M, shards")->check(CLI::Range(1, 4096));
  app.add_option("--rounds", c.rounds, "rounds per backend")->check(CLI::Range(1, 20));
  app.add_option("--ttl-ms", c.ttl_ms, "lease TTL")->check(CLI::Range(100L, 600000L));
  app.add_option("--period-ms", c.period_ms, "rebalance period")->check(CLI::Range(10L, 600000L));
  app.add_option("--phase-timeout-ms", c.phase_timeout_ms, "give a phase up after this")
      ->check(CLI::Range(100L, 600000L));
  app.add_option("--member", member)->group("");  // internal: run as one member
  app.add_option("--job", job)->group("");
  CLI11_PARSE(app, argc, argv);
  if (!member.empty()) return run_member(c.url, job, c.shards, c.ttl_ms, c.period_ms, member);
  std::stringstream in(backends);
  for (std::string b; std::getline(in, b, ',');)
    if (!b.empty()) c.backends.push_back(b);
  std::string self = "/proc/self/exe";
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) self.assign(buf, static_cast<std::size_t>(n));
  return run(c, self);
}
