// The history a nemesis run records, and the checker that judges it.
//
// Every worker thread appends one line per event to a shared file with a single
// O_APPEND write; times are CLOCK_MONOTONIC nanoseconds, comparable across the
// processes of one host:
//
//   A pid tid seq token t_ret [mode] acquire returned (token 0 on a backend without fencing;
//                                    mode "s" or "x" for a read-write lock's hold)
//   O pid tid seq t                  owns() was true when read at t (read before the call)
//   W pid tid seq token t status     a fenced write attempt: applied | stale | error (stale:
//                                    the fence rejected it)
//   L pid tid seq t                  the stop token fired (the loss was signalled) at t
//   E pid tid seq t status stopped   release returned: ok | lost | error; stopped = stop token fired
//   X err t                          acquire failed with error code `err` (timeouts are normal)
//
// A section is one acquisition (pid, tid, seq). Its belief interval runs from A's
// t_ret to its last O. Soundness of the exclusion check: owns() is true at t only if
// t < local deadline < the server's expiry of that lease <= the moment the server
// grants the lock to anybody else < that holder's t_ret. So two belief intervals can
// overlap only if mutual exclusion (or the clock assumption) was broken, however the
// processes were paused, partitioned or killed.
//
// Violations:
//   overlap      two belief intervals of different sections overlap
//   token        a token repeats, or tokens of sections with a belief go backwards in
//                acquisition order (fencing backends)
//   stale-write  a write was applied with a token below one applied before it: read from
//                the register the writes went to (check_register), whose lines are the
//                tokens in the order the resource applied them
//   capacity     more than N semaphore permits believed held at one moment
//   exclusion    a read-write lock's exclusive hold overlaps another hold
//   silent-loss  a section's release said lost, but its stop token never fired
//   unowned      (shards, check_unowned) a shard without an owner for longer than the bound
//                while a member lives: see UnownedBound
//   slow-leave   (shards, check_unowned) a shard of a member that left gracefully was not
//                owned by another member within the handover bound
//   incomplete   (reported by the driver) an operation or process that never finished
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace distlock::nemesis {

struct Section {
  long pid = 0, tid = 0, seq = 0;
  std::uint64_t token = 0;
  std::int64_t acquired = -1;   // A
  std::int64_t last_true = -1;  // last O
  std::int64_t lost_at = -1;    // L
  std::int64_t ended_at = -1;   // E
  std::int64_t last_seen = -1;  // the last O or W line
  std::string release;          // E status ("" if the process died first)
  bool stopped = false;         // E: the stop token had fired
  std::string mode;             // A: "s" or "x" for a read-write lock's hold
};

struct Write {
  long pid = 0, tid = 0, seq = 0;
  std::uint64_t token = 0;
  std::int64_t t = 0;
  std::string status;
};

struct History {
  std::vector<Section> sections;
  std::vector<Write> writes;
  std::vector<std::string> lines;  // raw, for printing slices
  long acquire_errors = 0;
};

inline History parse_history(const std::string& path) {
  History h;
  std::map<std::tuple<long, long, long>, std::size_t> index;
  auto section = [&](long pid, long tid, long seq) -> Section& {
    auto key = std::make_tuple(pid, tid, seq);
    auto it = index.find(key);
    if (it == index.end()) {
      Section s;
      s.pid = pid;
      s.tid = tid;
      s.seq = seq;
      h.sections.push_back(s);
      it = index.emplace(key, h.sections.size() - 1).first;
    }
    return h.sections[it->second];
  };
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind;
    long pid = 0, tid = 0, seq = 0;
    if (!(ls >> kind)) continue;
    h.lines.push_back(line);
    if (kind == "X") {
      ++h.acquire_errors;
      continue;
    }
    if (!(ls >> pid >> tid >> seq)) continue;
    Section& s = section(pid, tid, seq);
    if (kind == "A") {
      ls >> s.token >> s.acquired >> s.mode;
    } else if (kind == "O") {
      std::int64_t t = 0;
      ls >> t;
      s.last_true = std::max(s.last_true, t);
      s.last_seen = std::max(s.last_seen, t);
    } else if (kind == "L") {
      ls >> s.lost_at;
    } else if (kind == "E") {
      std::int64_t t = 0;
      int stopped = 0;
      ls >> t >> s.release >> stopped;
      s.ended_at = t;
      s.stopped = stopped != 0;
    } else if (kind == "W") {
      Write w;
      w.pid = pid;
      w.tid = tid;
      w.seq = seq;
      ls >> w.token >> w.t >> w.status;
      s.last_seen = std::max(s.last_seen, w.t);
      h.writes.push_back(w);
    }
  }
  return h;
}

struct Violation {
  std::string kind;
  std::string what;
  std::int64_t at = 0;  // a time near the violation, for the slice
};

inline std::string describe(const Section& s) {
  std::ostringstream o;
  o << "section pid " << s.pid << " tid " << s.tid << " seq " << s.seq << " token " << s.token << " belief ["
    << s.acquired << ", " << s.last_true << "]";
  return o.str();
}

/// A release that said lost while the stop token had never fired.
inline std::vector<Violation> check_silent_losses(const History& h) {
  std::vector<Violation> out;
  for (const auto& s : h.sections) {
    if (s.release == "lost" && !s.stopped) {
      out.push_back(
          {"silent-loss", "release said lost but the stop token never fired: " + describe(s), s.acquired});
    }
    if (s.release == "left" && !s.stopped) {
      out.push_back(
          {"silent-loss", "left the group but the stop token never fired: " + describe(s), s.acquired});
    }
  }
  return out;
}

inline std::vector<Violation> check_history(const History& h, bool fencing) {
  std::vector<Violation> out;
  // Sections that believed they held the lock at least once.
  std::vector<const Section*> believed;
  for (const auto& s : h.sections) {
    if (s.acquired >= 0 && s.last_true >= s.acquired) believed.push_back(&s);
  }
  std::sort(believed.begin(), believed.end(),
            [](const Section* a, const Section* b) { return a->acquired < b->acquired; });
  // overlap: in start order, each interval must start after every earlier one ended.
  std::int64_t max_end = -1;
  const Section* max_sec = nullptr;
  for (const Section* s : believed) {
    if (max_sec != nullptr && s->acquired < max_end) {
      out.push_back({"overlap", describe(*max_sec) + " overlaps " + describe(*s), s->acquired});
    }
    if (s->last_true > max_end) {
      max_end = s->last_true;
      max_sec = s;
    }
  }
  if (fencing) {
    std::map<std::uint64_t, const Section*> by_token;
    for (const auto& s : h.sections) {
      if (s.acquired < 0) continue;
      auto [it, fresh] = by_token.emplace(s.token, &s);
      if (!fresh)
        out.push_back(
            {"token", "token repeated: " + describe(*it->second) + " and " + describe(s), s.acquired});
    }
    for (std::size_t i = 1; i < believed.size(); ++i) {
      if (believed[i]->token <= believed[i - 1]->token) {
        out.push_back(
            {"token",
             "token went backwards: " + describe(*believed[i - 1]) + " then " + describe(*believed[i]),
             believed[i]->acquired});
      }
    }
  }
  auto silent = check_silent_losses(h);
  out.insert(out.end(), silent.begin(), silent.end());
  return out;
}

/// The belief intervals of the sections that believed at least once.
inline std::vector<const Section*> believed_sections(const History& h) {
  std::vector<const Section*> out;
  for (const auto& s : h.sections) {
    if (s.acquired >= 0 && s.last_true >= s.acquired) out.push_back(&s);
  }
  return out;
}

/// Semaphore: never more than `permits` belief intervals at one moment (an interval
/// that ends at t does not meet one that starts at t).
inline std::vector<Violation> check_semaphore(const History& h, int permits) {
  std::vector<Violation> out;
  std::vector<std::pair<std::int64_t, int>> events;  // (time, -1 end / +1 start)
  for (const Section* s : believed_sections(h)) {
    events.emplace_back(s->acquired, +1);
    events.emplace_back(s->last_true, -1);
  }
  std::sort(events.begin(), events.end());
  int inside = 0;
  for (const auto& [t, d] : events) {
    inside += d;
    if (inside > permits) {
      out.push_back(
          {"capacity",
           std::to_string(inside) + " permits believed held at once (of " + std::to_string(permits) + ")",
           t});
    }
  }
  return out;
}

/// Read-write lock: an exclusive hold's belief interval overlaps no other hold's.
inline std::vector<Violation> check_rw(const History& h) {
  std::vector<Violation> out;
  const auto b = believed_sections(h);
  for (const Section* x : b) {
    if (x->mode != "x") continue;
    for (const Section* o : b) {
      if (o == x) continue;
      if (o->acquired < x->last_true && x->acquired < o->last_true) {
        out.push_back({"exclusion",
                       "writer " + describe(*x) + " overlaps " + (o->mode == "x" ? "writer " : "reader ") +
                           describe(*o),
                       std::max(x->acquired, o->acquired)});
      }
    }
  }
  return out;
}

/// A register's lines are the tokens of the writes it applied, in the order it applied
/// them. Every line with a token below an earlier one is a stale write that was applied.
inline std::vector<Violation> check_register(const std::string& path) {
  std::vector<Violation> out;
  std::ifstream in(path);
  std::uint64_t highest = 0, token = 0;
  long line = 0;
  while (in >> token) {
    ++line;
    if (token < highest) {
      out.push_back({"stale-write",
                     "write with token " + std::to_string(token) + " applied after token " +
                         std::to_string(highest) + " (line " + std::to_string(line) + " of " + path + ")",
                     0});
    }
    highest = std::max(highest, token);
  }
  return out;
}

/// One fault of the schedule on the histories' clock (CLOCK_MONOTONIC ns): from the moment
/// it struck to the moment it was healed (a kill: until the new process was started; a
/// server restart: until the server served again).
struct FaultWindow {
  std::int64_t start = 0, end = 0;
  std::string what;
  int worker = -1;    // the worker (index) it struck; -1: every worker, or the servers
  bool slow = false;  // the worker was slowed (its round trips delayed), not cut off or stopped
};

/// How long a shard may stay without an owner while a member lives. X below is
/// `after_fault`: one TTL (the leases of a struck member expire on the server within one TTL
/// of its last renewal, which came before the strike), one rebalance period (the survivors'
/// next listing sees it gone) and a margin (round trips, a reconnection).
///   - With no fault near: `handover` from the moment its owner gave it up (stop token),
///     released it or began to leave: one period (the others' next listing, or the release
///     waking a waiting taker) plus a margin for the round trips and the worker's polling.
///   - A fault that struck the worker of the last owner (killed, stopped, cut off, frozen,
///     its clock skewed): X from the strike, the survivors' take-over.
///   - A fault that struck another worker while the shard was still allowed to be unowned
///     (it may have been the one the shard was moving to): X from the strike, once per
///     worker among the strikes that began within the gap (the group then moves the shard to
///     a member that was not struck; a shard cannot wait on a chain of faults forever). A
///     strike before the gap began counts too, without using up that one: the member came
///     back, rejoined, was to take the shard and was struck again.
///   - A slowed worker (its round trips delayed): X from the end of the delay, once per
///     worker and gap (a slow member stays a member, and the shard may be moving to it) —
///     counted apart from the strikes: a worker killed within the gap, whose new process
///     joined, was to take the shard and was then slowed, gets both (etcd3 seed 896976451).
///   - A fault at every worker or at the servers (a server paused, cut off from its peers,
///     killed and restarted, wiped; every worker frozen): X from its end. During it the shard
///     may have no reachable member at all.
struct UnownedBound {
  std::int64_t handover_ns = 0;
  std::int64_t after_fault_ns = 0;
};

/// `faults` sorted by start; `last_owner` the worker (index) of the shard's last owner, -2 if
/// unknown. The moment a shard unowned since `from` must be owned again by, and whether a
/// fault extended it.
inline std::pair<std::int64_t, bool> unowned_allowed_until(std::int64_t from, int last_owner,
                                                           const std::vector<FaultWindow>& faults,
                                                           const UnownedBound& b) {
  std::int64_t allowed = from + b.handover_ns;
  bool faulted = false;
  std::vector<int> struck;  // other workers whose strike (not a delay) extended this gap
  std::vector<int> slowed;  // workers whose delay extended this gap
  for (const auto& f : faults) {
    if (f.start > allowed) break;
    std::int64_t until = 0;
    if (f.worker < 0) {
      until = f.end + b.after_fault_ns;
    } else if (f.worker == last_owner && !f.slow) {
      until = f.start + b.after_fault_ns;
    } else {
      // Strikes that began before the gap (the member was struck, came back and was to take
      // the shard) do not count against the worker's one strike within the gap.
      const bool within = f.start >= from;
      std::vector<int>& once = f.slow ? slowed : struck;
      if (within && std::find(once.begin(), once.end(), f.worker) != once.end()) continue;
      until = (f.slow ? f.end : f.start) + b.after_fault_ns;
      if (within && until > allowed) once.push_back(f.worker);
    }
    if (until > allowed) {
      allowed = until;
      faulted = true;
    }
  }
  return {allowed, faulted};
}

struct UnownedReport {
  std::int64_t longest_gap_ns = 0;        // the longest stretch without an owner, faults or not
  std::int64_t longest_quiet_gap_ns = 0;  // the longest one that no fault extended
  long gaps = 0;
  // The closest call: the least time left between a gap's end and its bound (negative: a
  // violation); INT64_MAX if there was no gap.
  std::int64_t min_slack_ns = std::numeric_limits<std::int64_t>::max();
  long leaves = 0;                               // sections ended by a graceful leave ("left")
  std::int64_t longest_leave_handover_ns = 0;    // from a leave to the shard's next owner
  std::vector<std::int64_t> leave_handovers_ns;  // every leave's, in the shard's order
  std::vector<Violation> violations;
};

/// One shard's history: the stretches in which no member owned it, from the first time it was
/// owned to `horizon` (the end of the run; the members leave after it). A section owns the
/// shard from its A line (the member saw it in assigned()) to its stop token (L), else its end
/// (E: a release, or the start of a leave), else its last O or W line (a killed process).
/// A member stopped by a fault therefore owns until its watchdog runs again: faults excuse
/// that time anyway. Violations: "unowned" (a stretch past UnownedBound), "slow-leave" (a
/// shard of a member that left was not owned by another member by the same bound).
/// `worker_of_pid`: the worker (index) each process was, to match faults with owners.
inline UnownedReport check_unowned(const History& h, std::vector<FaultWindow> faults, std::int64_t horizon,
                                   const UnownedBound& b, const std::map<long, int>& worker_of_pid = {}) {
  std::sort(faults.begin(), faults.end(),
            [](const FaultWindow& x, const FaultWindow& y) { return x.start < y.start; });
  UnownedReport r;
  struct Cover {
    std::int64_t from, to;
    const Section* s;
  };
  std::vector<Cover> cover;
  for (const auto& s : h.sections) {
    if (s.acquired < 0) continue;
    const std::int64_t to = s.lost_at >= 0    ? s.lost_at
                            : s.ended_at >= 0 ? s.ended_at
                                              : std::max(s.last_seen, s.acquired);
    cover.push_back({s.acquired, std::max(to, s.acquired), &s});
  }
  std::sort(cover.begin(), cover.end(), [](const Cover& x, const Cover& y) { return x.from < y.from; });
  auto ms = [](std::int64_t ns) { return std::to_string(ns / 1'000'000) + " ms"; };
  auto worker = [&](long pid) {
    const auto it = worker_of_pid.find(pid);
    return it == worker_of_pid.end() ? -2 : it->second;
  };
  auto gap = [&](std::int64_t from, std::int64_t to, long last_pid) {
    to = std::min(to, horizon);
    if (to <= from) return;
    ++r.gaps;
    r.longest_gap_ns = std::max(r.longest_gap_ns, to - from);
    const auto [allowed, faulted] = unowned_allowed_until(from, worker(last_pid), faults, b);
    if (!faulted) r.longest_quiet_gap_ns = std::max(r.longest_quiet_gap_ns, to - from);
    r.min_slack_ns = std::min(r.min_slack_ns, allowed - to);
    if (to > allowed) {
      r.violations.push_back({"unowned",
                              "no owner from " + std::to_string(from) + " to " + std::to_string(to) + " (" +
                                  ms(to - from) + "), " + ms(to - allowed) + " past the bound" +
                                  (faulted ? " (after a fault)" : " (no fault near)"),
                              from});
    }
  };
  std::int64_t covered_until = -1;
  long last_pid = 0;  // the owner whose section ended last
  for (const auto& c : cover) {
    if (covered_until >= 0 && c.from > covered_until) gap(covered_until, c.from, last_pid);
    if (c.to > covered_until) {
      covered_until = c.to;
      last_pid = c.s->pid;
    }
  }
  if (covered_until >= 0 && covered_until < horizon) gap(covered_until, horizon, last_pid);
  // Graceful leaves: the next owner's A line after the leave began.
  for (const auto& c : cover) {
    if (c.s->release != "left" || c.from >= horizon) continue;
    ++r.leaves;
    const std::int64_t left = c.to;
    std::int64_t next = horizon;
    for (const auto& o : cover) {
      if (o.s != c.s && o.from > c.from && o.to >= left) {
        next = std::max(o.from, left);
        break;
      }
    }
    r.longest_leave_handover_ns = std::max(r.longest_leave_handover_ns, next - left);
    const auto [allowed, faulted] = unowned_allowed_until(left, worker(c.s->pid), faults, b);
    r.leave_handovers_ns.push_back(next - left);
    if (next > allowed) {
      r.violations.push_back({"slow-leave",
                              "the shard of member pid " + std::to_string(c.s->pid) + ", which left at " +
                                  std::to_string(left) + ", had no other owner for " + ms(next - left) +
                                  (faulted ? " (after a fault)" : " (no fault near)"),
                              left});
    }
  }
  return r;
}

/// The shard group's own log (DIR/shards.history): "X err t" for a join that failed,
/// "V pid t_called t_returned shards" for each graceful leave, "S pid lost given_up taken
/// membership_lost" from each member at each leave (within the run and at its end).
struct ShardGroupLog {
  long join_errors = 0;
  bool unsupported = false;  // a join failed with errc::not_supported
  long leases_lost = 0, given_up = 0, taken = 0, membership_lost = 0;
  long leaves = 0;                         // V lines: graceful leaves within the run
  std::int64_t longest_leave_call_ns = 0;  // the longest leave() call
};

inline ShardGroupLog parse_shard_group_log(const std::string& path, int not_supported_code) {
  ShardGroupLog g;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind;
    if (!(ls >> kind)) continue;
    if (kind == "X") {
      int err = 0;
      ls >> err;
      ++g.join_errors;
      g.unsupported = g.unsupported || err == not_supported_code;
    } else if (kind == "V") {
      long pid = 0;
      std::int64_t called = 0, returned = 0;
      if (ls >> pid >> called >> returned) {
        ++g.leaves;
        g.longest_leave_call_ns = std::max(g.longest_leave_call_ns, returned - called);
      }
    } else if (kind == "S") {
      long pid = 0, lost = 0, given = 0, taken = 0, member = 0;
      if (ls >> pid >> lost >> given >> taken >> member) {
        g.leases_lost += lost;
        g.given_up += given;
        g.taken += taken;
        g.membership_lost += member;
      }
    }
  }
  return g;
}

/// The history lines within `window` ns of `at`.
inline std::string slice(const History& h, std::int64_t at, std::int64_t window) {
  std::string out;
  for (const auto& l : h.lines) {
    std::istringstream ls(l);
    std::vector<std::string> f;
    std::string x;
    while (ls >> x) f.push_back(x);
    // The time's field: A and W lines carry a token before it (tokens can be as long as
    // times: Sentinel's are microsecond-based), X lines only the error code.
    std::size_t at_field = 0;
    if (!f.empty()) at_field = f[0] == "A" || f[0] == "W" ? 5 : f[0] == "X" ? 2 : 4;
    std::int64_t t = -1;
    if (at_field < f.size() && !f[at_field].empty() &&
        std::all_of(f[at_field].begin(), f[at_field].end(), ::isdigit))
      t = std::stoll(f[at_field]);
    if (t >= at - window && t <= at + window) out += "  " + l + "\n";
  }
  return out;
}

}  // namespace distlock::nemesis
