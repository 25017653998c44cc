// distlock-shard-bench — how fast a shard group (include/distlock/shard_group.hpp) rebalances,
// and what it costs the server, over a grid of member counts W and shard counts M.
//
//   distlock-shard-bench [--backend file,redis,etcd,zk,postgres | --url URL]
//                        [--members W[,W...]] [--shards M[,M...]] [--quick] [--rounds R]
//                        [--ttl-ms T] [--period-ms P] [--phase-timeout-ms D] [--budget-s S]
//                        [--settle-ms S]
//
// Per backend and round: --backend starts a server of the round's own on a free loopback port
// in a temporary directory (the test harnesses of tests/support/backend_targets: one
// redis-server, etcd as one member, ZooKeeper standalone with a 200 ms tick, one PostgreSQL),
// stopped by pid after the round; --url uses a server that runs already. Each round makes a
// group of M shards with W member processes (this program re-executed with --member; each one
// a Client of its own, as separate machines would be: processes, not threads, because a
// member's death is a SIGKILL, which takes its connections and renewals with it as a machine's
// death would, and a thread cannot be killed alone), and measures:
//   join_ms         from the W-th member holding its membership (after the W-1 others
//                   balanced) to a balanced assignment among the W (every shard owned by a
//                   live member, each member floor(M/W) or ceil(M/W));
//   leave_ms        (W >= 3) from a member's leave() (on SIGTERM) to all its shards owned
//                   again by the others, balanced;
//   kill_ms         from a SIGKILL of a member to all its shards owned again, balanced
//                   (expected about TTL + rebalance period; less on file://, whose kernel
//                   locks a dead process loses at once);
//   max_unowned_ms  the longest time any one shard had no live owner during the round's
//                   phases (a shard held by the killed member's unexpired lease counts as
//                   unowned: nobody works on it);
//   moved_shards_join / _kill   the shards the join moved to the joiner / the killed member had;
//   final_owned_once, final_balanced   the end state as the members were told it.
// On redis, etcd and zk, what the server sees (Probe: INFO commandstats and DBSIZE; etcd's
// /metrics; ZooKeeper's mntr):
//   steady_ops_per_s       the server's operations per second while the W-1 members are
//                          balanced, over three rebalance periods (their listings, renewals,
//                          keep-alives); steady_ops_per_member_period = that per member and period.
//                          With --settle-ms S the window starts S ms after the balance: the
//                          members' watches may still be reading what the balancing changed
//                          (zk: seconds at M = 1,024), which a window right after the balance
//                          counts as steady;
//   join_ops               the operations from the joiner's start to balance (with --settle-ms,
//                          to S ms after it: the other members' watches read the join's changes
//                          after the balance too), less the steady rate over that time: what the
//                          join cost (the joiner's connection set-up and membership, its
//                          listings, the hand-overs, the moved shards' acquisitions, the watches'
//                          reads); join_ops_per_moved_shard;
//   server_keys            keys (redis, etcd) or znodes (zk) once the W members balanced, less
//                          those of the round's server before the first member: beside M + W.
// On every backend whose client counts its round trips (Client::stats().round_trips: redis, etcd,
// zk; a member prints its count when it joins and on each SIGUSR1 from this process):
//   steady_round_trips_per_member_period   an old member's client round trips per rebalance
//                          period while balanced (its renewals; the backend's background calls),
//                          read over max(3 periods, TTL) starting max(TTL, 2 s) after the balance;
//   join_round_trips_members       the W-1 old members' round trips from the window's end to
//                          max(TTL, 2 s) after the join's balance, each less its own steady rate
//                          over that time: what the join cost them (their releases of the moved
//                          shards, their watches' work, also what it set off later);
//   join_round_trips_joiner_setup  the joiner's round trips until it is a member (shard_group()
//                          returned): connect, the shard-count check, its membership, its two
//                          watches' first listings (a SCAN page or a directory read each): O(M + W),
//                          once per member's life;
//   join_round_trips_joiner_rest   the joiner's round trips after that, to the same reading, less
//                          the old members' mean steady rate: its acquisitions of the moved shards;
//   join_round_trips_per_moved_shard   (members + joiner_rest) / moved_shards_join: the issue's
//                          "round trips per moved shard" (the joiner's set-up is left out: it is
//                          reported apart, and does not depend on what moved).
// Ownership is what each member was told: a shard is owned from the on_change that listed it
// until its stop token fired (or its member was killed). Every time is a steady_clock
// (CLOCK_MONOTONIC) reading, taken in the member that saw the event or in this process before
// kill(); all processes run on one host, so the readings are comparable.
//
// Output: one JSON line per backend and grid cell (W, M) with the median, min and max of each
// figure over the rounds, and the figures of every round. --quick is the test's grid: W 2,3 x
// M 4,16, one round, TTL 1 s, period 100 ms. Bounded: at most 20 rounds, 16 cells per backend,
// 64 members, 4096 shards; each phase gives up after --phase-timeout-ms (the figure is then null
// and "timeouts" counts it), and no cell starts after --budget-s (it is reported "skipped").
// Measurements only: nothing here asserts a time.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
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
// "J <ns> <round trips>" once a member, "R <ns> <round trips>" on each SIGUSR1, "L <ns>" before
// leave() (on SIGTERM), "E <ns>" after it. <round trips> is its client's count so far
// (Client::stats().round_trips).
int run_member(const std::string& url, const std::string& job, std::uint32_t shards, long ttl_ms,
               long period_ms, const std::string& id) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
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
    auto trips = [&] { return std::to_string(now_ns()) + " " + std::to_string(client.stats().round_trips); };
    emit("J " + trips());
    int sig = 0;
    while (sigwait(&set, &sig) == 0 && sig == SIGUSR1) emit("R " + trips());
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

// A member's client round trips (Client::stats().round_trips) at a moment of its steady clock.
struct Trips {
  std::int64_t ns = 0;
  std::uint64_t count = 0;
};

struct Member {
  std::string id;
  pid_t pid = -1;
  int fd = -1;
  std::string buf;
  bool live = false;  // joined and neither left nor killed
  bool gone = false;  // left or killed
  std::optional<std::int64_t> joined_ns, leave_ns;
  std::set<std::uint32_t> owned;
  std::uint64_t joined_trips = 0;  // its client's round trips when it became a member
  std::optional<Trips> trips;      // the last "R" line's reading
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

  /// Every shard owned by exactly one live member (as the members were told).
  bool owned_once() const {
    std::vector<int> owners(shards_, 0);
    for (const auto& m : members_)
      if (m.live)
        for (auto s : m.owned) ++owners[s];
    return std::all_of(owners.begin(), owners.end(), [](int o) { return o == 1; });
  }
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

  std::uint64_t joined_trips(std::size_t i) const { return members_[i].joined_trips; }

  /// Each of the members `who` (joined, running) reads its client's round trips (SIGUSR1, an
  /// "R" line); one reading per member, or nullopt when one did not answer in time.
  std::optional<std::vector<Trips>> read_trips(const std::vector<std::size_t>& who) {
    for (std::size_t i : who) {
      members_[i].trips.reset();
      ::kill(members_[i].pid, SIGUSR1);
    }
    const bool all = until([&] {
                       return std::all_of(who.begin(), who.end(),
                                          [&](std::size_t i) { return members_[i].trips.has_value(); });
                     }).has_value();
    if (!all) return std::nullopt;
    std::vector<Trips> out;
    for (std::size_t i : who) out.push_back(*members_[i].trips);
    return out;
  }

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
        in >> m.joined_trips;
        break;
      case 'R': {
        Trips r{t, 0};
        if (in >> r.count) m.trips = r;
        break;
      }
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

/// What the benchmark's own server sees (nothing but this benchmark uses it): its count of
/// operations so far (the backend's own counter) and its number of keys / znodes. Either may be
/// unknown (nullopt).
class Probe {
 public:
  virtual ~Probe() = default;
  virtual std::optional<long long> ops() = 0;
  virtual std::optional<long long> keys() = 0;
};

/// One request on a fresh loopback TCP connection, the whole answer read until the server
/// closes it (bounded: 5 s, 16 MiB). Empty on failure.
std::string tcp_exchange(std::uint16_t port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    char buf[65536];
    const auto end = SteadyClock::now() + 5s;
    while (out.size() < (16u << 20) && SteadyClock::now() < end) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

/// The sum of the values of the lines of `text` that start with `prefix` (Prometheus text
/// format "name{labels} value", or ZooKeeper's mntr "name<TAB>value"); nullopt if none.
std::optional<long long> sum_lines(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  long double total = 0;
  bool any = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) != 0) continue;
    const auto sp = line.find_last_of(" \t");
    if (sp == std::string::npos) continue;
    total += std::strtold(line.c_str() + sp + 1, nullptr);
    any = true;
  }
  if (!any) return std::nullopt;
  return static_cast<long long>(total);
}

/// etcd: gRPC messages received by the server (grpc_server_msg_received_total over every
/// method: unary requests, and each message on a stream — a lease keep-alive, a watch
/// request) and its key count (etcd_debugging_mvcc_keys_total), from /metrics on the client port.
class EtcdProbe final : public Probe {
 public:
  explicit EtcdProbe(std::uint16_t port) : port_(port) {}
  std::optional<long long> ops() override { return sum_lines(metrics(), "grpc_server_msg_received_total{"); }
  std::optional<long long> keys() override { return sum_lines(metrics(), "etcd_debugging_mvcc_keys_total"); }

 private:
  std::string metrics() { return tcp_exchange(port_, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"); }
  std::uint16_t port_;
};

/// ZooKeeper: packets received (zk_packets_received: every request and every session ping)
/// and znodes (zk_znode_count, the server's whole tree), from the mntr command.
class ZkProbe final : public Probe {
 public:
  explicit ZkProbe(std::uint16_t port) : port_(port) {}
  std::optional<long long> ops() override {
    return sum_lines(tcp_exchange(port_, "mntr"), "zk_packets_received");
  }
  std::optional<long long> keys() override {
    return sum_lines(tcp_exchange(port_, "mntr"), "zk_znode_count");
  }

 private:
  std::uint16_t port_;
};

#ifdef DISTLOCK_SHARD_BENCH_REDIS_PROBE
/// redis: the server's total command count (INFO commandstats, less the probe's own calls)
/// and its number of keys (DBSIZE).
class RedisProbe final : public Probe {
 public:
  explicit RedisProbe(std::uint16_t port) {
    ctx_ = redisConnect("127.0.0.1", port);
    if (ctx_ != nullptr && ctx_->err) {
      redisFree(ctx_);
      ctx_ = nullptr;
    }
  }
  ~RedisProbe() override {
    if (ctx_ != nullptr) redisFree(ctx_);
  }
  RedisProbe(const RedisProbe&) = delete;
  RedisProbe& operator=(const RedisProbe&) = delete;
  bool ok() const { return ctx_ != nullptr; }

  std::optional<long long> ops() override {
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
  std::optional<long long> keys() override {
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
#endif

std::unique_ptr<Probe> make_probe(const std::string& label, distlock::testing::Target& target) {
  const auto ports = target.ports();
  if (ports.size() != 1) return nullptr;
  if (label == "etcd") return std::make_unique<EtcdProbe>(ports[0]);
  if (label == "zk") return std::make_unique<ZkProbe>(ports[0]);
#ifdef DISTLOCK_SHARD_BENCH_REDIS_PROBE
  if (label == "redis") {
    auto p = std::make_unique<RedisProbe>(ports[0]);
    if (p->ok()) return p;
  }
#endif
  return nullptr;
}

struct Config {
  std::vector<std::string> backends;
  std::string url;
  std::vector<int> members{4};
  std::vector<std::uint32_t> shards{16};
  int rounds = 3;
  long ttl_ms = 2000;
  long period_ms = 300;
  long phase_timeout_ms = 30000;
  long budget_s = 3600;
  long settle_ms = 0;  // wait after each balance before counting on (0: count at once)
};

nlohmann::json ms_or_null(std::optional<std::int64_t> from, std::optional<std::int64_t> to) {
  if (!from || !to) return nullptr;
  return static_cast<double>(*to - *from) / 1e6;
}

/// One round of one grid cell: W-1 members balance; the W-th joins (join_ms); with W >= 3
/// member 0 leaves (leave_ms); then one more member is SIGKILLed (kill_ms). With W = 2 there is
/// no leave: the kill leaves the joiner alone with every shard.
nlohmann::json one_round(const Config& c, int w, std::uint32_t m, const std::string& self,
                         const std::string& url, const std::string& job, Probe* probe) {
  Round r(self, url, job, m, c.ttl_ms, c.period_ms, std::chrono::milliseconds(c.phase_timeout_ms));
  nlohmann::json out;
  // The server's keys before this group's first member (a server of this round's own: none on
  // redis and etcd, ZooKeeper's own znodes on zk).
  const std::optional<long long> keys_before = probe != nullptr ? probe->keys() : std::nullopt;
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
  // The server's steady traffic of the balanced W-1, over max(three periods, one TTL): their
  // renewals, keep-alives / pings and (polling) listings; and each one's client round trips
  // over the same window (its own steady rate). It starts one settle time (max(TTL, 2 s)) after
  // the balance, so what the members do once after balancing (cancelled waits, a watch's
  // re-read of the expiries 1 s after an acquisition) is not taken for their steady rate.
  const auto settle = std::chrono::milliseconds(std::max(c.ttl_ms, 2000L));
  std::this_thread::sleep_for(settle);
  std::optional<double> steady_per_ns;
  std::optional<long long> join_ops_from;
  // --settle-ms: longer still, for a backend whose watches read for seconds after a balance.
  if (c.settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(c.settle_ms));
  std::vector<std::size_t> old_members;
  for (int i = 0; i < w - 1; ++i) old_members.push_back(static_cast<std::size_t>(i));
  const auto trips0 = r.read_trips(old_members);
  {
    const auto c0 = probe != nullptr ? probe->ops() : std::nullopt;
    const std::int64_t t0 = now_ns();
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::max(3 * c.period_ms, c.ttl_ms)));  // the window
    const auto c1 = probe != nullptr ? probe->ops() : std::nullopt;
    const std::int64_t t1 = now_ns();
    if (c0 && c1 && t1 > t0) steady_per_ns = static_cast<double>(*c1 - *c0) / static_cast<double>(t1 - t0);
    if (probe != nullptr) join_ops_from = probe->ops();
  }
  const auto trips1 = r.read_trips(old_members);
  // Each old member's steady round trips per ns (its renewals, the backend's background calls).
  std::vector<double> trip_rate;
  if (trips0 && trips1) {
    for (std::size_t k = 0; k < old_members.size(); ++k) {
      const auto dt = (*trips1)[k].ns - (*trips0)[k].ns;
      trip_rate.push_back(dt > 0 ? static_cast<double>((*trips1)[k].count - (*trips0)[k].count) / dt : 0.0);
    }
  }
  // Join.
  const std::int64_t spawn_at = now_ns();
  const std::size_t joiner = r.spawn();
  std::optional<std::int64_t> join_at, join_done, leave_at, leave_done, kill_at, kill_done;
  if (r.until([&] { return r.joined(joiner); })) join_at = r.joined_ns(joiner);
  if (join_at) join_done = r.until([&] { return r.balanced(); });
  out["moved_shards_join"] = r.owned_count(joiner);
  if (probe != nullptr && join_done && c.settle_ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(c.settle_ms));
  const std::int64_t join_counted_to = c.settle_ms > 0 ? now_ns() : join_done.value_or(0);
  if (probe != nullptr && join_done) {
    const auto ops = probe->ops();
    const auto keys = probe->keys();
    const std::size_t moved = r.owned_count(joiner);
    if (steady_per_ns) {
      out["steady_ops_per_s"] = std::round(*steady_per_ns * 1e9);
      // What one balanced member costs the server per rebalance period.
      out["steady_ops_per_member_period"] =
          std::round(*steady_per_ns * 1e6 * static_cast<double>(c.period_ms) / (w - 1) * 10) / 10;
    }
    if (ops && steady_per_ns && join_ops_from) {
      const double extra = static_cast<double>(*ops - *join_ops_from) -
                           *steady_per_ns * static_cast<double>(join_counted_to - spawn_at);
      out["join_ops"] = std::round(extra);
      if (moved > 0)
        out["join_ops_per_moved_shard"] = std::round(extra / static_cast<double>(moved) * 10) / 10;
    }
    if (keys && keys_before) out["server_keys"] = *keys - *keys_before;
    out["shards_plus_members"] = m + static_cast<std::uint32_t>(w);
  }
  // Client round trips of the join: each old member's beyond its steady rate, and the joiner's,
  // split into its set-up (until it is a member: the shard-count check, its membership, its
  // watches' first listings) and the rest, less the old members' mean steady rate since then.
  // Read one settle time after the balance: what the join set off later (a watch's re-read of the
  // expiries 1 s after the acquisitions) is counted; the steady rate over that time is not.
  if (join_done && !trip_rate.empty() && r.joined_trips(joiner) > 0) {  // 0: the backend counts none
    std::this_thread::sleep_for(settle);
    std::vector<std::size_t> all = old_members;
    all.push_back(joiner);
    if (const auto after = r.read_trips(all)) {
      double members = 0, mean_rate = 0;
      for (std::size_t k = 0; k < old_members.size(); ++k) {
        members += static_cast<double>((*after)[k].count - (*trips1)[k].count) -
                   trip_rate[k] * static_cast<double>((*after)[k].ns - (*trips1)[k].ns);
        mean_rate += trip_rate[k] / static_cast<double>(old_members.size());
      }
      const Trips& j = after->back();
      const double setup = static_cast<double>(r.joined_trips(joiner));
      const double rest =
          static_cast<double>(j.count) - setup - mean_rate * static_cast<double>(j.ns - r.joined_ns(joiner));
      auto r1 = [](double x) { return std::round(x * 10) / 10; };
      out["steady_round_trips_per_member_period"] = r1(mean_rate * 1e6 * static_cast<double>(c.period_ms));
      out["join_round_trips_members"] = r1(members);
      out["join_round_trips_joiner_setup"] = setup;
      out["join_round_trips_joiner_rest"] = r1(rest);
      if (const std::size_t moved = r.owned_count(joiner); moved > 0)
        out["join_round_trips_per_moved_shard"] = r1((members + rest) / static_cast<double>(moved));
    }
  }
  const std::int64_t from = join_at.value_or(0);
  // Graceful leave of member 0 (W >= 3).
  if (w >= 3) {
    r.terminate(0);
    if (r.until([&] { return r.leave_ns(0).has_value(); })) leave_at = r.leave_ns(0);
    if (leave_at) leave_done = r.until([&] { return r.balanced(); });
  }
  // SIGKILL of member 1 (W >= 3) or 0 (W = 2).
  const std::size_t victim = w >= 3 ? 1 : 0;
  out["moved_shards_kill"] = r.owned_count(victim);
  kill_at = r.kill(victim);
  kill_done = r.until([&] { return r.balanced(); });
  const std::int64_t to = now_ns();
  out["join_ms"] = ms_or_null(join_at, join_done);
  if (w >= 3) out["leave_ms"] = ms_or_null(leave_at, leave_done);
  out["kill_ms"] = ms_or_null(kill_at, kill_done);
  // The end state as the members were told it: every shard owned by exactly one live member.
  out["final_owned_once"] = r.owned_once();
  out["final_balanced"] = r.balanced();
  if (join_at) {
    out["max_unowned_ms"] = r.max_unowned_ms(from, to);
    out["max_unowned_join_ms"] = r.max_unowned_ms(from, leave_at.value_or(kill_at.value_or(to)));
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
  std::vector<std::string> labels = c.backends;
  if (!c.url.empty()) labels = {""};
  const auto started = SteadyClock::now();
  const auto budget = std::chrono::seconds(c.budget_s);
  int failures = 0;
  for (const auto& label : labels) {
    // Each round on a server of its own, started for it (and stopped by pid after it): what
    // the server holds and counts is that round's group alone, and a round that overloaded
    // its server leaves nothing behind for the next.
    auto start_server = [&](std::unique_ptr<distlock::testing::Target>& target) {
      const std::string kind = label == "etcd" ? "etcd1" : label == "zk" ? "zk1" : label;
      for (auto& k : distlock::testing::kinds())
        if (k.label == kind) target = k.make({});
      if (!target) throw std::runtime_error("backend " + label + " is not in this build");
    };
    for (const int w : c.members) {
      for (const std::uint32_t m : c.shards) {
        nlohmann::json line = {{"workload", "rebalance"},
                               {"backend", label.empty() ? c.url.substr(0, c.url.find(':')) : label},
                               {"members", w},
                               {"shards", m},
                               {"ttl_ms", c.ttl_ms},
                               {"settle_ms", c.settle_ms},
                               {"period_ms", c.period_ms},
                               {"rounds", c.rounds}};
        if (SteadyClock::now() - started > budget) {
          // Out of time: the cell is reported, not run.
          line["skipped"] = "budget of " + std::to_string(c.budget_s) + " s spent";
          std::printf("%s\n", line.dump().c_str());
          std::fflush(stdout);
          continue;
        }
        const auto cell_start = SteadyClock::now();
        std::vector<nlohmann::json> rounds;
        for (int i = 0; i < c.rounds; ++i) {
          const std::string job = "rebalance-bench-" + std::to_string(::getpid()) + "-w" + std::to_string(w) +
                                  "-m" + std::to_string(m) + "-" + std::to_string(i);
          std::unique_ptr<distlock::testing::Target> target;
          std::unique_ptr<Probe> probe;
          std::string url = c.url;
          if (!label.empty()) {
            try {
              start_server(target);
              url = target->url();
            } catch (const std::exception& e) {
              std::fprintf(stderr, "distlock-shard-bench: cannot start %s: %s\n", label.c_str(), e.what());
              rounds.push_back({{"error", "cannot start " + label + ": " + e.what()}});
              continue;
            }
            probe = make_probe(label, *target);
          }
          rounds.push_back(one_round(c, w, m, self, url, job, probe.get()));
        }
        int timeouts = 0;
        std::vector<const char*> timed{"join_ms", "kill_ms", "max_unowned_ms"};
        if (w >= 3) timed.push_back("leave_ms");
        for (const char* k : timed) line[k] = summary(rounds, k, timeouts);
        int ignored = 0;
        for (const char* k :
             {"moved_shards_join", "moved_shards_kill", "steady_round_trips_per_member_period",
              "join_round_trips_members", "join_round_trips_joiner_setup", "join_round_trips_joiner_rest",
              "join_round_trips_per_moved_shard"})
          line[k] = summary(rounds, k, ignored);
        if (label == "redis" || label == "etcd" || label == "zk") {
          for (const char* k : {"steady_ops_per_s", "steady_ops_per_member_period", "join_ops",
                                "join_ops_per_moved_shard", "server_keys"})
            line[k] = summary(rounds, k, ignored);
          line["shards_plus_members"] = m + static_cast<std::uint32_t>(w);
          line["ops"] = label == "redis"  ? "redis commands (INFO commandstats)"
                        : label == "etcd" ? "etcd gRPC messages received (grpc_server_msg_received_total)"
                                          : "ZooKeeper packets received (mntr zk_packets_received)";
        }
        bool owned_once = true;
        for (const auto& r : rounds) owned_once = owned_once && r.value("final_owned_once", false);
        line["final_owned_once"] = owned_once;
        line["timeouts"] = timeouts;
        line["cell_s"] =
            std::round(std::chrono::duration<double>(SteadyClock::now() - cell_start).count() * 10) / 10;
        line["per_round"] = rounds;
        std::printf("%s\n", line.dump().c_str());
        std::fflush(stdout);
        if (timeouts || !owned_once) ++failures;
      }
    }
  }
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distlock-shard-bench: shard group rebalance times, one JSON line per backend and grid cell"};
  Config c;
  std::string member, job, backends = "file,redis,etcd,zk,postgres";
  std::vector<int> members;
  std::vector<std::uint32_t> shards;
  bool quick = false;
  app.add_option("--backend", backends, "backends to start and measure, comma-separated");
  app.add_option("--url", c.url, "measure on this running server instead");
  app.add_option("--members", members, "W, members at the join (2..64), comma-separated for a grid")
      ->delimiter(',')
      ->check(CLI::Range(2, 64));
  app.add_option("--shards", shards, "M, shards (1..4096), comma-separated for a grid")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  app.add_flag(
      "--quick", quick,
      "the test grid: W 2,3 x M 4,16, one round, TTL 1 s, period 100 ms (--members/--shards override)");
  app.add_option("--rounds", c.rounds, "rounds per grid cell")->check(CLI::Range(1, 20));
  app.add_option("--ttl-ms", c.ttl_ms, "lease TTL")->check(CLI::Range(100L, 600000L));
  app.add_option("--period-ms", c.period_ms, "rebalance period")->check(CLI::Range(10L, 600000L));
  app.add_option("--phase-timeout-ms", c.phase_timeout_ms, "give a phase up after this")
      ->check(CLI::Range(100L, 600000L));
  app.add_option("--settle-ms", c.settle_ms,
                 "wait this long after each balance before the steady window and before the join's count "
                 "ends (0: at once)")
      ->check(CLI::Range(0L, 600000L));
  app.add_option("--budget-s", c.budget_s,
                 "start no grid cell after this many seconds (the rest are reported skipped)")
      ->check(CLI::Range(1L, 86400L));
  app.add_option("--member", member)->group("");  // internal: run as one member
  app.add_option("--job", job)->group("");
  CLI11_PARSE(app, argc, argv);
  if (!member.empty()) {
    const std::uint32_t m = shards.empty() ? 16 : shards.front();
    return run_member(c.url, job, m, c.ttl_ms, c.period_ms, member);
  }
  if (quick) {
    c.members = {2, 3};
    c.shards = {4, 16};
    if (app.count("--rounds") == 0) c.rounds = 1;
    if (app.count("--ttl-ms") == 0) c.ttl_ms = 1000;
    if (app.count("--period-ms") == 0) c.period_ms = 100;
  }
  if (!members.empty()) c.members = members;
  if (!shards.empty()) c.shards = shards;
  // Bounded: at most 16 grid cells per backend.
  if (c.members.size() * c.shards.size() > 16) {
    std::fprintf(stderr, "distlock-shard-bench: at most 16 grid cells (W x M) per backend\n");
    return 2;
  }
  std::stringstream in(backends);
  for (std::string b; std::getline(in, b, ',');)
    if (!b.empty()) c.backends.push_back(b);
  std::string self = "/proc/self/exe";
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) self.assign(buf, static_cast<std::size_t>(n));
  return run(c, self);
}
