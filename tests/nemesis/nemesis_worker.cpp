// nemesis_worker — one process of a nemesis run (tests/nemesis/nemesis_test.cpp).
//
//   nemesis_worker URL DIR SECONDS TTL_MS SEED MUTEXES WORKLOADS   (SECONDS may have a fraction)
//
// WORKLOADS is a comma-separated subset of mutex,sem,rw,elect. Each workload appends
// its history to DIR/<workload>.history (format: history.hpp):
//
//   mutex  one thread per mutex k (0 <= k < MUTEXES) locks "nemesis-k", writes through
//          its fence, releases; history in DIR/mutex<k>.history. Two
//          sections in three hold for about one TTL (0.7 to 1.5 TTL), writing every
//          ~100 ms, so that faults strike leases mid-hold. Every write goes twice: once
//          through a FileFence (DIR/fence<k>; the write appends the token to
//          DIR/fenced<k>.register, under the fence's lock) and once unfenced (appends
//          the token to DIR/unfenced<k>.register, ignoring it). A section whose lease was lost
//          turns zombie: for up to 1.5 TTL it keeps writing with its old token, as a
//          holder that does not look at its stop token would, until the fence rejects
//          it once. The fenced register must never go back; the unfenced one, written
//          by the same writes, must (the checker's control).
//   sem    one thread takes a permit of the semaphore "nemesis-sem" (2 permits).
//   rw     one thread takes the read-write lock "nemesis-rw", shared or exclusive.
//   elect  one thread campaigns in the election "nemesis-elect", leads, resigns.
//   shards one thread joins the shard group "nemesis-shards" of kShards shards (rebalanced every
//          200 ms) and, for each shard it is told it owns, writes every 20-40 ms through that
//          shard's fence with the shard's token (DIR/shardfence<i>, DIR/shardfenced<i>.register)
//          and, the same write, unfenced (DIR/shardunfenced<i>.register); history per shard in
//          DIR/shard<i>.history, one section per (member, token). A section's belief (O line,
//          its time read before the check) is OwnedShard::held(), called right before each
//          write: it reads the shard lease's local deadline at the call, so a process resumed
//          from SIGSTOP, whose watchdog has not fired the stop token yet, believes nothing
//          past the deadline. A section whose held() turned false writes on as a zombie.
//          A shard that leaves the assignment ends its section with "E ... lost <stopped>"
//          (the group must have fired its stop token first: the silent-loss check). A section
//          whose stop token fired turns zombie as in the mutex workload. Joining is retried
//          within the run (X lines in DIR/shards.history). Every 2-6 s the member leaves
//          gracefully (its sections end with "E ... <t> left 1", t the moment leave() was
//          called; "V pid t_called t_returned shards" in DIR/shards.history) and joins again
//          50-400 ms later ("J pid t_called t_returned" for every join that succeeded). At each leave, and at
//          the end, the member appends "S pid lost given_up taken membership_lost" (its ShardGroupStats)
//          there.
//
// The client reads its deadlines through a clock the nemesis can skew: SIGUSR1 moves
// it one TTL forward (every lease of this process is then past its local deadline:
// the holder must give up, and does so before the server expires the lease).
// Exits 0 when the time is up; every call it makes is bounded in time.
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "distlock/fencing.hpp"
#include "support/backend_mono_clock.hpp"

namespace {

using distlock::testing::mono_ns;
using Steady = std::chrono::steady_clock;

int open_append(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

// One history file: one line per event, each a single O_APPEND write. Copied by value
// into loss callbacks (they run on the client's event thread, which may outlive the
// workload's thread); the descriptor stays open until the process exits.
struct HistoryFile {
  int fd = -1;
  void record(const std::string& line) const {
    const std::string l = line + "\n";
    (void)!::write(fd, l.data(), l.size());
  }
};

std::string id(long tid, long seq) {
  return std::to_string(::getpid()) + " " + std::to_string(tid) + " " + std::to_string(seq);
}

// The engine's clock, skewed forward by SIGUSR1 (one TTL per signal).
std::atomic<std::int64_t> g_skew_ns{0};
std::int64_t g_skew_step_ns = 0;
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

extern "C" void on_skew(int) {
  g_skew_ns.fetch_add(g_skew_step_ns, std::memory_order_relaxed);
}

class SkewedClock final : public distlock::Clock {
 public:
  time_point now() const override {
    return base_->now() + std::chrono::nanoseconds(g_skew_ns.load(std::memory_order_relaxed));
  }
  // Waits on the base clock in slices of at most 20 ms, so that a skew that arrives
  // during a wait is seen within 20 ms (spurious returns are allowed; callers loop).
  void wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                  time_point deadline) override {
    const auto skew = std::chrono::nanoseconds(g_skew_ns.load(std::memory_order_relaxed));
    const auto slice = base_->now() + std::chrono::milliseconds(20);
    base_->wait_until(cv, lock, std::min(deadline - skew, slice));
  }

 private:
  std::shared_ptr<distlock::Clock> base_ = distlock::system_steady_clock();
};

struct Run {
  std::string dir;
  std::chrono::milliseconds ttl{};
  Steady::time_point end;
  unsigned seed = 0;
  distlock::Client* client = nullptr;
  bool fencing = false;
};

distlock::LockOptions lock_options(const Run& r) {
  distlock::LockOptions o;
  o.ttl = r.ttl;
  o.wait = std::chrono::milliseconds(3000);
  return o;
}

// The hold of one section: `holds` says whether it is still owned; writes and the
// zombie phase are the mutex workload's.
void hold(const Run& r, std::minstd_rand& rng, const HistoryFile& h, long tid, long seq,
          const std::function<bool()>& owns, const std::function<void(bool owned)>& write) {
  // Two sections in three hold for 0.7 to 1.5 TTL; the others are short.
  const bool long_hold = rng() % 3 != 0;
  const auto hold_until =
      Steady::now() + (long_hold ? r.ttl * 7 / 10 + r.ttl * static_cast<int>(rng() % 80) / 100 : r.ttl * 0);
  const int short_writes = 1 + static_cast<int>(rng() % 3);
  for (int w = 0; long_hold ? Steady::now() < hold_until : w < short_writes; ++w) {
    const std::int64_t t0 = mono_ns();
    const bool o = owns();
    if (!o) break;
    h.record("O " + id(tid, seq) + " " + std::to_string(t0));
    if (write) write(true);
    std::this_thread::sleep_for(
        std::chrono::microseconds(long_hold ? 50'000 + rng() % 100'000 : rng() % 8'000));
  }
  const std::int64_t t1 = mono_ns();
  if (owns()) h.record("O " + id(tid, seq) + " " + std::to_string(t1));
}

void mutex_thread(const Run& r, int t, const HistoryFile& h, distlock::FileFence& fence, int fenced_reg,
                  int unfenced_reg) {
  const std::string name = "nemesis-" + std::to_string(t);
  std::minstd_rand rng(r.seed * 7919u + static_cast<unsigned>(t));
  const long tid = static_cast<long>(::syscall(SYS_gettid));
  long seq = 0;
  while (Steady::now() < r.end) {
    ++seq;
    std::error_code ec;
    distlock::Lease lease = r.client->acquire(name, lock_options(r), ec);
    if (ec) {
      h.record("X " + std::to_string(ec.value()) + " " + std::to_string(mono_ns()));
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
      continue;
    }
    const std::uint64_t token = r.fencing ? lease.token() : 0;
    h.record("A " + id(tid, seq) + " " + std::to_string(token) + " " + std::to_string(mono_ns()));
    lease.on_lost([h, tid, seq] { h.record("L " + id(tid, seq) + " " + std::to_string(mono_ns())); });
    // One write: through the fence (the resource appends the token it accepted), and
    // the same write unfenced (the resource appends whatever comes).
    bool rejected = false;
    auto write = [&](bool) {
      if (!r.fencing) return;
      std::error_code fec;
      const std::int64_t tw = mono_ns();
      const std::string line = std::to_string(token) + "\n";
      const auto res = fence.apply(
          token, [&] { (void)!::write(fenced_reg, line.data(), line.size()); }, fec);
      const char* st = fec ? "error" : (res.status == distlock::FenceStatus::applied ? "applied" : "stale");
      rejected = rejected || (!fec && res.status == distlock::FenceStatus::stale);
      h.record("W " + id(tid, seq) + " " + std::to_string(token) + " " + std::to_string(tw) + " " + st);
      (void)!::write(unfenced_reg, line.data(), line.size());
    };
    hold(
        r, rng, h, tid, seq, [&] { return lease.owns(); }, write);
    const std::stop_token stop = lease.stop_token();
    // A lost lease's holder turns zombie: it keeps writing with its old token for up to
    // 1.5 TTL (every 50-100 ms), until the fence rejects a write once.
    if (stop.stop_requested() || !lease.owns()) {
      const auto zombie_end = Steady::now() + r.ttl * 3 / 2;
      while (r.fencing && !rejected && Steady::now() < zombie_end) {
        write(false);
        std::this_thread::sleep_for(std::chrono::microseconds(50'000 + rng() % 50'000));
      }
    }
    lease.release(ec);
    const char* st = !ec ? "ok" : (ec == distlock::errc::lost ? "lost" : "error");
    h.record("E " + id(tid, seq) + " " + std::to_string(mono_ns()) + " " + st + " " +
             (stop.stop_requested() ? "1" : "0"));
  }
}

// A semaphore permit, a read-write hold or a leadership: the same A/O/L/E lines, the
// A line ending with the mode for the read-write lock ("s" or "x").
template <class Take, class Release>
void primitive_thread(const Run& r, const HistoryFile& h, unsigned salt, Take take, Release release) {
  std::minstd_rand rng(r.seed * 104729u + salt);
  const long tid = static_cast<long>(::syscall(SYS_gettid));
  long seq = 0;
  while (Steady::now() < r.end) {
    ++seq;
    std::string mode;
    std::error_code ec;
    auto lease = take(rng, mode, ec);
    if (ec) {
      h.record("X " + std::to_string(ec.value()) + " " + std::to_string(mono_ns()));
      if (ec == distlock::errc::not_supported || ec == distlock::errc::invalid_argument) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
      continue;
    }
    const std::uint64_t token = r.fencing && lease.has_token() ? lease.token() : 0;
    h.record("A " + id(tid, seq) + " " + std::to_string(token) + " " + std::to_string(mono_ns()) +
             (mode.empty() ? "" : " " + mode));
    lease.on_lost([h, tid, seq] { h.record("L " + id(tid, seq) + " " + std::to_string(mono_ns())); });
    hold(r, rng, h, tid, seq, [&] { return lease.owns(); }, {});
    const std::stop_token stop = lease.stop_token();
    release(lease, ec);
    const char* st = !ec ? "ok" : (ec == distlock::errc::lost ? "lost" : "error");
    h.record("E " + id(tid, seq) + " " + std::to_string(mono_ns()) + " " + st + " " +
             (stop.stop_requested() ? "1" : "0"));
  }
}

constexpr std::uint32_t kShards = 6;

struct ShardFiles {
  HistoryFile history;
  std::unique_ptr<distlock::FileFence> fence;
  int fenced_reg = -1, unfenced_reg = -1;
};

// One section of one shard: this member owned it with `token`.
struct ShardSection {
  long seq = 0;
  std::uint64_t token = 0;
  distlock::OwnedShard shard;  // held(): the check before each belief and write
  std::stop_token stop;
  std::unique_ptr<std::stop_callback<std::function<void()>>> on_stop;
  bool rejected = false;  // the fence rejected one of its writes
  bool zombie = false;
  Steady::time_point zombie_end{};
};

void shard_thread(const Run& r, const HistoryFile& group_file, std::vector<ShardFiles>& files) {
  std::minstd_rand rng(r.seed * 15485863u + 5u);
  const long tid = static_cast<long>(::syscall(SYS_gettid));
  long seq = 0;
  std::optional<distlock::ShardGroup> group;
  distlock::ShardGroupOptions opts;
  opts.lock = lock_options(r);
  opts.rebalance_period = std::chrono::milliseconds(200);
  std::map<std::uint32_t, ShardSection> open;  // shard -> the section it is in now
  std::vector<std::pair<std::uint32_t, ShardSection>> zombies;
  auto write = [&](std::uint32_t i, ShardSection& s) {
    ShardFiles& f = files[i];
    std::error_code fec;
    const std::int64_t tw = mono_ns();
    const std::string line = std::to_string(s.token) + "\n";
    const auto res = f.fence->apply(
        s.token, [&] { (void)!::write(f.fenced_reg, line.data(), line.size()); }, fec);
    const char* st = fec ? "error" : (res.status == distlock::FenceStatus::applied ? "applied" : "stale");
    s.rejected = s.rejected || (!fec && res.status == distlock::FenceStatus::stale);
    f.history.record("W " + id(tid, s.seq) + " " + std::to_string(s.token) + " " + std::to_string(tw) + " " +
                     st);
    (void)!::write(f.unfenced_reg, line.data(), line.size());
  };
  auto end_section = [&](std::uint32_t i, ShardSection s, const char* status) {
    files[i].history.record("E " + id(tid, s.seq) + " " + std::to_string(mono_ns()) + " " + status + " " +
                            (s.stop.stop_requested() ? "1" : "0"));
    if (r.fencing && s.stop.stop_requested() && !s.rejected) {
      if (!s.zombie) s.zombie_end = Steady::now() + r.ttl * 3 / 2;
      s.zombie = true;
      zombies.emplace_back(i, std::move(s));
    }
  };
  // Now and then the member leaves gracefully and joins again after a short pause.
  auto next_leave_at = [&] { return Steady::now() + std::chrono::milliseconds(2000 + rng() % 4000); };
  Steady::time_point next_leave = next_leave_at();
  auto record_stats = [&] {
    const auto st = group->stats();
    group_file.record("S " + std::to_string(::getpid()) + " " + std::to_string(st.shards_lost) + " " +
                      std::to_string(st.shards_given_up) + " " + std::to_string(st.shards_taken) + " " +
                      std::to_string(st.membership_lost));
  };
  // Leaves the group: the sections end with "E ... <t> <status> <stopped>", t the moment the
  // leave began (the member owns nothing from then on).
  auto leave = [&](const char* status) {
    // The stop callbacks go first: leave() fires every stop token, which is no loss.
    for (auto& [i, s] : open) s.on_stop.reset();
    const std::int64_t t = mono_ns();
    group->leave();
    const std::int64_t done = mono_ns();
    for (auto& [i, s] : open) {
      files[i].history.record("E " + id(tid, s.seq) + " " + std::to_string(t) + " " + status + " " +
                              (s.stop.stop_requested() ? "1" : "0"));
    }
    group_file.record("V " + std::to_string(::getpid()) + " " + std::to_string(t) + " " +
                      std::to_string(done) + " " + std::to_string(open.size()));
    open.clear();
  };
  while (Steady::now() < r.end) {
    if (group && Steady::now() >= next_leave) {
      record_stats();
      leave("left");
      group.reset();
      // A short pause (50-400 ms, within the run), then join again.
      std::this_thread::sleep_until(
          std::min(r.end, Steady::now() + std::chrono::milliseconds(50 + rng() % 351)));
      next_leave = next_leave_at();
      continue;
    }
    if (!group) {
      try {
        const std::int64_t called = mono_ns();
        group.emplace(r.client->shard_group("nemesis-shards", kShards, opts));
        group_file.record("J " + std::to_string(::getpid()) + " " + std::to_string(called) + " " +
                          std::to_string(mono_ns()));
      } catch (const std::system_error& e) {
        // The server may be down right now: try again, within the run.
        group_file.record("X " + std::to_string(e.code().value()) + " " + std::to_string(mono_ns()));
        if (e.code() == distlock::errc::not_supported) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 80));
        continue;
      }
    }
    const distlock::ShardAssignment now = group->assigned();
    std::map<std::uint32_t, const distlock::OwnedShard*> owned;
    for (const auto& o : now.shards) owned[o.index] = &o;
    // Shards that left the assignment, or came back with another token.
    for (auto it = open.begin(); it != open.end();) {
      auto o = owned.find(it->first);
      if (o == owned.end() || o->second->token.value_or(0) != it->second.token) {
        const std::uint32_t i = it->first;
        ShardSection s = std::move(it->second);
        it = open.erase(it);
        end_section(i, std::move(s), "lost");
      } else {
        ++it;
      }
    }
    for (const auto& [i, o] : owned) {
      if (open.contains(i)) continue;
      ShardSection s;
      s.seq = ++seq;
      s.token = r.fencing ? o->token.value_or(0) : 0;
      s.shard = *o;
      s.stop = o->stop;
      files[i].history.record("A " + id(tid, s.seq) + " " + std::to_string(s.token) + " " +
                              std::to_string(mono_ns()));
      s.on_stop = std::make_unique<std::stop_callback<std::function<void()>>>(
          s.stop, std::function<void()>([h = files[i].history, tid, sq = s.seq] {
            h.record("L " + id(tid, sq) + " " + std::to_string(mono_ns()));
          }));
      open.emplace(i, std::move(s));
    }
    for (auto& [i, s] : open) {
      const std::int64_t t = mono_ns();
      // held() after t: true means the lease's deadline is later than the call, so later than t.
      if (!s.shard.held()) {
        // Past its deadline, lost or given up, and not yet out of the assignment (its stop
        // token may not have fired yet): a zombie writes on.
        if (!s.zombie) {
          s.zombie = true;
          s.zombie_end = Steady::now() + r.ttl * 3 / 2;
        }
        if (r.fencing && !s.rejected && Steady::now() < s.zombie_end) write(i, s);
        continue;
      }
      files[i].history.record("O " + id(tid, s.seq) + " " + std::to_string(t));
      if (r.fencing) write(i, s);
    }
    for (auto& [i, s] : zombies) {
      if (!s.rejected && Steady::now() < s.zombie_end) write(i, s);
    }
    std::erase_if(zombies,
                  [](const auto& z) { return z.second.rejected || Steady::now() >= z.second.zombie_end; });
    std::this_thread::sleep_for(std::chrono::microseconds(20'000 + rng() % 20'000));
  }
  if (!group) return;
  record_stats();
  leave("ok");
}

// Makes a semaphore or read-write lock, whose creation talks to the server: a failure
// (the server down at that moment) is recorded as an X line and tried again 20-100 ms
// later, until the run ends; not_supported and invalid_argument end the workload.
template <class Make>
auto create_within_run(const Run& r, const HistoryFile& h, unsigned salt, Make make)
    -> std::optional<decltype(make())> {
  std::minstd_rand rng(r.seed * 32452843u + salt);
  while (Steady::now() < r.end) {
    try {
      return make();
    } catch (const std::system_error& e) {
      h.record("X " + std::to_string(e.code().value()) + " " + std::to_string(mono_ns()));
      if (e.code() == distlock::errc::not_supported || e.code() == distlock::errc::invalid_argument) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 80));
    }
  }
  return std::nullopt;
}

std::error_code code_of(const std::system_error& e) {
  return e.code();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: nemesis_worker URL DIR SECONDS TTL_MS SEED MUTEXES WORKLOADS\n");
    return 64;
  }
  Run r;
  const std::string url = argv[1];
  r.dir = argv[2];
  r.end = Steady::now() +
          std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(std::atof(argv[3])));
  r.ttl = std::chrono::milliseconds(std::atol(argv[4]));
  r.seed = static_cast<unsigned>(std::strtoul(argv[5], nullptr, 10));
  const int mutexes = std::atoi(argv[6]);
  std::vector<std::string> workloads;
  {
    std::stringstream ss(argv[7]);
    std::string w;
    while (std::getline(ss, w, ',')) workloads.push_back(w);
  }
  g_skew_step_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(r.ttl).count();
  struct sigaction sa {};
  sa.sa_handler = on_skew;
  sa.sa_flags = SA_RESTART;
  ::sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);

  distlock::ClientOptions copts;
  copts.command_timeout = std::chrono::milliseconds(500);
  copts.connect_timeout = std::chrono::milliseconds(500);
  // The client's notes and warnings (a master switch, an unreachable server, a lost
  // lease) go to DIR/client.log, one O_APPEND write per line from every worker, stamped
  // "<ns> <pid>" on the histories' clock so that they can be set beside them.
  copts.logger = [log = open_append(r.dir + "/client.log")](distlock::LogLevel level, std::string_view text) {
    if (level == distlock::LogLevel::debug) return;
    const std::string l =
        std::to_string(mono_ns()) + " " + std::to_string(::getpid()) + " " + std::string(text) + "\n";
    (void)!::write(log, l.data(), l.size());
  };
  copts.clock = std::make_shared<SkewedClock>();
  std::optional<distlock::Client> client;
  // The server may be down when this process starts: retry the connection, bounded.
  while (!client && Steady::now() < r.end) {
    std::error_code ec;
    auto c = distlock::connect(url, copts, ec);
    if (!ec) {
      client = std::move(c);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (!client) return 0;
  r.client = &*client;
  r.fencing = client->has_fencing();
  std::vector<std::unique_ptr<distlock::FileFence>> fences;
  std::vector<int> fenced_regs, unfenced_regs;
  std::vector<HistoryFile> mutex_files;
  for (int k = 0; k < mutexes; ++k) {
    const std::string n = std::to_string(k);
    fences.push_back(std::make_unique<distlock::FileFence>(r.dir + "/fence" + n));
    fenced_regs.push_back(open_append(r.dir + "/fenced" + n + ".register"));
    unfenced_regs.push_back(open_append(r.dir + "/unfenced" + n + ".register"));
    mutex_files.push_back({open_append(r.dir + "/mutex" + n + ".history")});
    if (fenced_regs.back() < 0 || unfenced_regs.back() < 0 || mutex_files.back().fd < 0) return 70;
  }

  std::vector<ShardFiles> shard_files;
  if (std::find(workloads.begin(), workloads.end(), "shards") != workloads.end()) {
    for (std::uint32_t i = 0; i < kShards; ++i) {
      const std::string n = std::to_string(i);
      ShardFiles f;
      f.history = {open_append(r.dir + "/shard" + n + ".history")};
      f.fence = std::make_unique<distlock::FileFence>(r.dir + "/shardfence" + n);
      f.fenced_reg = open_append(r.dir + "/shardfenced" + n + ".register");
      f.unfenced_reg = open_append(r.dir + "/shardunfenced" + n + ".register");
      if (f.history.fd < 0 || f.fenced_reg < 0 || f.unfenced_reg < 0) return 70;
      shard_files.push_back(std::move(f));
    }
  }
  std::vector<HistoryFile> files;
  files.reserve(workloads.size());
  std::vector<std::thread> threads;
  for (const auto& w : workloads) {
    files.push_back({w == "mutex" ? -1 : open_append(r.dir + "/" + w + ".history")});
    if (w != "mutex" && files.back().fd < 0) return 70;
  }
  for (std::size_t i = 0; i < workloads.size(); ++i) {
    const auto& w = workloads[i];
    const HistoryFile& h = files[i];
    if (w == "mutex") {
      for (int k = 0; k < mutexes; ++k) {
        threads.emplace_back(
            [&, k] { mutex_thread(r, k, mutex_files[k], *fences[k], fenced_regs[k], unfenced_regs[k]); });
      }
    } else if (w == "sem") {
      threads.emplace_back([&] {
        // The permit count is stored on the server: it may be down right now (try again).
        auto sem =
            create_within_run(r, h, 1, [&] { return client->semaphore("nemesis-sem", 2, lock_options(r)); });
        if (!sem) return;
        primitive_thread(
            r, h, 1, [&](std::minstd_rand&, std::string&, std::error_code& ec) { return sem->acquire(ec); },
            [](distlock::Lease& l, std::error_code& ec) { l.release(ec); });
      });
    } else if (w == "rw") {
      threads.emplace_back([&] {
        auto rw =
            create_within_run(r, h, 2, [&] { return client->shared_mutex("nemesis-rw", lock_options(r)); });
        if (!rw) return;
        primitive_thread(
            r, h, 2,
            [&](std::minstd_rand& rng, std::string& mode, std::error_code& ec) {
              const bool exclusive = rng() % 2 == 0;
              mode = exclusive ? "x" : "s";
              try {
                return exclusive ? rw->acquire_exclusive() : rw->acquire_shared();
              } catch (const std::system_error& e) {
                ec = code_of(e);
                return distlock::ReadWriteLease{};
              }
            },
            [](distlock::ReadWriteLease& l, std::error_code& ec) { l.release(ec); });
      });
    } else if (w == "shards") {
      threads.emplace_back([&] { shard_thread(r, h, shard_files); });
    } else if (w == "elect") {
      threads.emplace_back([&] {
        distlock::Election e = client->election("nemesis-elect", lock_options(r));
        primitive_thread(
            r, h, 3,
            [&](std::minstd_rand&, std::string&, std::error_code& ec) {
              return e.campaign(std::to_string(::getpid()), ec);
            },
            [](distlock::Lease& l, std::error_code& ec) { l.release(ec); });
      });
    }
  }
  for (auto& t : threads) t.join();
  return 0;
}
