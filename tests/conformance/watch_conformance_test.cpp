// Client::watch (distlock/watch.hpp, docs/design.md "Watching locks") over every backend of the
// build, against the real servers each test starts itself (tests/support/backend_targets.hpp):
// hand-offs of several names by several clients come per name in token order, each lease's
// `acquired` after the previous lease's end and every lease with its `released`; a SIGKILLed
// holder is `lost` (never `released`), then the next holder's `acquired` with a larger token; a
// revoke is `revoked` (the reason kept beside the lock); names outside the prefix (one that is a
// prefix of it, ones that share its first characters) are never reported. The backends that
// publish no lock changes (file://, mysql://, redlock://) refuse a watch with
// errc::not_supported, naming it.
//
// What differs by design between the backends is stated once, in `traits_of`. A connection cut
// (fault proxy) is each backend's own watch test (docs/testing.md, the row of this file).
//
// On a loaded machine (CI runs this file at -j2 beside CPU hogs) a watch's connection or zk
// session can be lost: that is a `gap`, the contract's report of missed events, and the re-list's
// `state`s follow it. Each case then checks what the contract still promises (the next holder
// shown by its `acquired` or by a `state` held with its token; an end by its event or by a free
// `state` after the gap; order between gaps; nothing skipped after the last gap) and still fails
// on a wrong kind, a wrong or older token, a `state` with no gap before it, or silence; each
// prints how many gaps it took. Leases that only need to exist while the test waits hold a long
// TTL, so that a late renewal (rightly a loss on a 3 s TTL) does not end them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/backend_targets.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/lock_tool.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace {

// How a backend's watch differs by design (docs/design.md "Watching locks", "Per backend").
struct WatchTraits {
  /// client.watch() works; false: it throws errc::not_supported (the server publishes no lock
  /// changes a watcher could follow).
  bool watches = false;
  /// Client::revoke works, and the watch reports it as `revoked`.
  bool revokes = false;
  /// A holder that dies without a word is reported `lost` by the watcher's own re-read of the
  /// name (inferred: Redis and PostgreSQL publish no expiry); false: the server reports the end
  /// (etcd deletes the key with the lease, zk ends the session's nodes).
  bool infers_expiry = false;
  /// Events are inferred from readings of the server's state (zk://: one-shot watches re-armed
  /// on each trigger): a lease is reported only if it is still held when its directory is read,
  /// and one that came and went between two readings is a `gap` naming the lock. The hand-offs
  /// below then hold each lease until the watch has reported it.
  bool reports_from_readings = false;
};

// Keyed by the target's label without its member count ("etcd3" -> "etcd").
WatchTraits traits_of(const std::string& label) {
  std::string family = label;
  while (!family.empty() && family.back() >= '0' && family.back() <= '9') family.pop_back();
  static const std::map<std::string, WatchTraits> table = {
      {"file", {false, false, false, false}},    {"mysql", {false, false, false, false}},
      {"redlock", {false, false, false, false}}, {"redis", {true, true, true, false}},
      {"sentinel", {true, true, true, false}},   {"rediscluster", {true, true, true, false}},
      {"postgres", {true, false, true, false}},  {"etcd", {true, true, false, false}},
      {"zk", {true, true, false, true}},
  };
  const auto it = table.find(family);
  if (it == table.end()) {
    ADD_FAILURE() << "no watch traits for backend " << label << ": add it to traits_of";
    return {};
  }
  return it->second;
}

std::vector<Kind> kinds_where(bool watches) {
  std::vector<Kind> out;
  for (auto& k : kinds()) {
    if (traits_of(k.label).watches == watches) out.push_back(std::move(k));
  }
  return out;
}

std::string label_of(const ::testing::TestParamInfo<Kind>& p) {
  return p.param.label;
}

class WatchConformance : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    target_ = GetParam().make({});
    traits_ = traits_of(GetParam().label);
    // TTL 3 s, or the longest the target allows (zk://: twice its 2 s session timeout).
    ttl_ = Millis(std::min<std::int64_t>(3000, target_->max_ttl_ms()));
    // Leases that only need to exist while the test waits (for a watch to start, for the
    // watch to report them) hold 60 s, or the longest the target allows: a renewal that comes
    // late on a loaded machine must not end them (a late renewal of a 3 s lease is rightly a
    // loss). zk://'s leases are its session's and end with it, whatever the TTL.
    long_ttl_ = Millis(std::min<std::int64_t>(60000, target_->max_ttl_ms()));
  }
  distlock::Client client() { return distlock::connect(target_->url(), quiet()); }
  distlock::LockOptions lock_opts(Millis wait) const { return opts_of(ttl_, wait); }
  distlock::LockOptions long_lock_opts(Millis wait) const { return opts_of(long_ttl_, wait); }

  std::unique_ptr<Target> target_;
  WatchTraits traits_;
  Millis ttl_{3000};
  Millis long_ttl_{60000};

 private:
  static distlock::LockOptions opts_of(Millis ttl, Millis wait) {
    distlock::LockOptions o = ttl_of(ttl, wait);
    o.renew_interval = ttl / 3;
    return o;
  }
};

// How often a case took a path the watch contract allows but a quiet machine rarely shows (a
// `gap` from a lost connection or session, then the re-list's `state`s): printed by each case,
// so a run shows that the tolerant path was taken and checked.
void print_gaps(const std::string& label, const char* what, int gaps) {
  std::printf("%s: %s: %d gap(s)%s\n", label.c_str(), what, gaps,
              gaps > 0 ? " (connection or session lost; the re-list's states checked instead)" : "");
}

// How the next holder of `name`, whose lease has `token`, showed on the watch.
enum class Shown { acquired, state_after_gap, not_shown };

// The next event of `w` that is not a gap, read until `until` (steady clock), with every event
// read noted in `seen`; each gap on the way is counted into `*gaps`, sets `after_gap`, and must
// name nothing outside `prefix`. Nothing: `until` passed.
std::optional<WatchEvent> next_past_gaps(distlock::Watch& w, const std::string& prefix,
                                         Steady::time_point until, std::vector<std::string>& seen, int* gaps,
                                         bool& after_gap) {
  while (Steady::now() < until) {
    auto e = w.next(std::chrono::ceil<Millis>(until - Steady::now()));
    if (!e) return std::nullopt;
    seen.push_back(describe(*e));
    if (e->kind != WatchEventKind::gap) return e;
    for (const auto& n : e->gap_names) {
      EXPECT_EQ(n.rfind(prefix, 0), 0u) << "a gap named " << n << ", outside \"" << prefix << "\"";
    }
    after_gap = true;
    ++*gaps;
  }
  return std::nullopt;
}

// Reads `w` for up to `limit` (steady clock) until the next holder of `name` is shown (into
// `*out` when given): by its `acquired` with `token` (0: any token), or, after a gap (the watch's contract
// for missed events), by the re-list's `state` held with `token`. Also allowed on the way: gaps (counted into
// `*gaps`; a gap naming a name outside `prefix` fails), `state`s after a gap that show `name` free (the
// re-list ran before the next holder took it). Anything else fails the test: a wrong kind, a
// wrong or older token, a `state` without a gap before it, another name, or silence.
Shown next_holder_shown(distlock::Watch& w, const std::string& prefix, const std::string& name,
                        std::uint64_t token, Millis limit, std::vector<std::string>& seen, int* gaps,
                        WatchEvent* out = nullptr) {
  const Steady::time_point until = Steady::now() + limit;
  bool after_gap = *gaps > 0;
  while (const auto e = next_past_gaps(w, prefix, until, seen, gaps, after_gap)) {
    EXPECT_EQ(e->name, name) << joined(seen);
    if (e->kind == WatchEventKind::state) {
      EXPECT_TRUE(after_gap) << "a state with no gap before it:" << joined(seen);
      if (!e->held) continue;
      if (out != nullptr) *out = *e;
      if (token == 0) return Shown::state_after_gap;
      EXPECT_EQ(e->token, token) << "the re-list showed a holder other than the next one:" << joined(seen);
      return e->token == token ? Shown::state_after_gap : Shown::not_shown;
    }
    if (out != nullptr) *out = *e;
    EXPECT_EQ(e->kind, WatchEventKind::acquired) << "expected the next holder's acquired:" << joined(seen);
    if (token == 0) return e->kind == WatchEventKind::acquired ? Shown::acquired : Shown::not_shown;
    EXPECT_EQ(e->token, token) << joined(seen);
    return e->kind == WatchEventKind::acquired && e->token == token ? Shown::acquired : Shown::not_shown;
  }
  ADD_FAILURE() << "the next holder (token " << token << ") was not shown within " << limit.count()
                << " ms:" << joined(seen);
  return Shown::not_shown;
}

// How the end of `name`'s lease with `token` showed on the watch.
enum class Ended { as_expected, state_after_gap, not_shown };

// Reads `w` for up to `limit` (steady clock) until the end of `name`'s lease with `token` is
// shown: by an event of `kind` with `token`, or, after a gap, by the re-list's `state` showing
// `name` free (the end fell inside the gap). Also allowed on the way: gaps (counted into
// `*gaps`), `state`s after a gap that show the same lease still held. Anything else fails the
// test: a wrong kind or token, a `state` without a gap before it, another name, or silence.
Ended end_shown(distlock::Watch& w, const std::string& prefix, const std::string& name, std::uint64_t token,
                WatchEventKind kind, Millis limit, std::vector<std::string>& seen, int* gaps,
                WatchEvent* out = nullptr) {
  const Steady::time_point until = Steady::now() + limit;
  bool after_gap = *gaps > 0;
  while (const auto e = next_past_gaps(w, prefix, until, seen, gaps, after_gap)) {
    EXPECT_EQ(e->name, name) << joined(seen);
    if (out != nullptr) *out = *e;
    if (e->kind == WatchEventKind::state) {
      EXPECT_TRUE(after_gap) << "a state with no gap before it:" << joined(seen);
      if (!e->held) return after_gap ? Ended::state_after_gap : Ended::not_shown;
      EXPECT_EQ(e->token, token) << "the re-list showed another holder:" << joined(seen);
      if (e->token != token) return Ended::not_shown;
      continue;
    }
    EXPECT_EQ(e->kind, kind) << "expected `" << to_string(kind) << "`:" << joined(seen);
    EXPECT_EQ(e->token, token) << joined(seen);
    return e->kind == kind && e->token == token ? Ended::as_expected : Ended::not_shown;
  }
  ADD_FAILURE() << "the end (`" << to_string(kind) << "`) of token " << token << " was not shown within "
                << limit.count() << " ms:" << joined(seen);
  return Ended::not_shown;
}

// The acquisitions the clients made, as they saw them.
struct Taken {
  std::mutex mu;
  std::map<std::string, std::vector<std::uint64_t>> tokens;  // per name, in the order taken
  void add(const std::string& name, std::uint64_t token) {
    std::lock_guard lk(mu);
    tokens[name].push_back(token);
  }
};

// Whether `events` hold a `kind` of `name` with `token`.
bool has_event(const std::vector<Received>& events, WatchEventKind kind, const std::string& name,
               std::uint64_t token) {
  return std::any_of(events.begin(), events.end(), [&](const Received& r) {
    return r.ev.kind == kind && r.ev.name == name && r.ev.token == token;
  });
}

std::vector<std::string> described(const std::vector<Received>& events) {
  std::vector<std::string> out;
  for (const auto& r : events) out.push_back(describe(r.ev));
  return out;
}

// Three clients take and release two names under the watched prefix, 60 acquisitions in all
// (bounded by 60 s on this process's steady clock). Every lease began after watch() returned,
// so the stream must hold, per name, exactly the clients' acquisitions in token order, each
// `acquired` after the previous lease's `released`, every lease's `released`, and nothing else.
// A gap (the watch's connection or zk session lost on a loaded machine) is the contract's report
// of missed events: the run is then checked against what still holds — order between gaps, the
// re-list's `state`s never older than what was reported, a lease's end without its release
// (`lost`, inferred) only for a lease begun before a gap, and after the last gap nothing
// skipped: every acquisition after the first holder the stream shows there is reported, and
// every name ends free. The runs that took a gap are counted and printed.
TEST_P(WatchConformance, HandOffsOfSeveralNamesComeInTokenOrderEachLeaseWithItsRelease) {
  constexpr int kClients = 3;
  constexpr int kAcquisitions = 60;
  const std::string prefix = "cw/ho/";
  const std::vector<std::string> names = {"cw/ho/a", "cw/ho/b"};
  distlock::Client watcher = client();
  distlock::Watch w = watcher.watch(prefix);
  WatchRecorder rec(w);

  // Shown: the lease's `acquired`, or after a gap the re-list's `state` held with its token.
  const auto shown = [](const std::vector<Received>& events, const std::string& name, std::uint64_t token) {
    return std::any_of(events.begin(), events.end(), [&](const Received& r) {
      return r.ev.name == name && r.ev.token == token &&
             (r.ev.kind == WatchEventKind::acquired || (r.ev.kind == WatchEventKind::state && r.ev.held));
    });
  };

  Taken taken;
  std::atomic<int> count{0};
  std::atomic<int> unseen{0};  // paced leases not shown within 10 s
  const Steady::time_point start = Steady::now();
  const Steady::time_point deadline = start + 60s;
  std::vector<std::thread> clients;
  std::vector<std::exception_ptr> errors(kClients);
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      try {
        distlock::Client cl = client();
        for (int i = c;; i += kClients) {
          const int n = count.fetch_add(1);
          if (n >= kAcquisitions || Steady::now() > deadline) break;
          const std::string& name = names[static_cast<std::size_t>(i) % names.size()];
          // Held up to 10 s where the backend reports from readings: the long TTL.
          distlock::Lease l = cl.acquire(name, long_lock_opts(20000ms));
          taken.add(name, l.token());
          if (traits_.reports_from_readings &&
              !eventually([&] { return shown(rec.events(), name, l.token()); }, 10000ms))
            unseen.fetch_add(1);
        }
      } catch (...) {
        errors[static_cast<std::size_t>(c)] = std::current_exception();
      }
    });
  }
  for (auto& t : clients) t.join();
  for (const auto& e : errors) ASSERT_FALSE(e) << "a client's acquire failed";
  const auto took = std::chrono::duration_cast<Millis>(Steady::now() - start);

  // The end of each name's last lease is reported (bounded: 10 s after the last release): its
  // `released`; or, once a gap came, the stream leaves every name free (its last event a
  // `released`, a `lost` or a free `state`: the last lease may have begun and ended inside the
  // gap, and then it is not reported, docs/design.md "Watching locks") and nothing more came for
  // 1 s (this process's steady clock).
  std::map<std::string, std::vector<std::uint64_t>> tokens;
  {
    std::lock_guard lk(taken.mu);
    tokens = taken.tokens;
  }
  const auto settled_in = [&](const std::vector<Received>& events) {
    if (std::all_of(tokens.begin(), tokens.end(), [&](const auto& nl) {
          return has_event(events, WatchEventKind::released, nl.first, nl.second.back());
        }))
      return true;
    const bool gap = std::any_of(events.begin(), events.end(),
                                 [](const Received& r) { return r.ev.kind == WatchEventKind::gap; });
    if (!gap || Steady::now() - events.back().at < 1s) return false;
    std::map<std::string, bool> held;
    for (const auto& r : events) {
      if (r.ev.kind != WatchEventKind::gap) held[r.ev.name] = r.ev.held;
    }
    return std::none_of(held.begin(), held.end(), [](const auto& nh) { return nh.second; });
  };
  const bool settled = eventually([&] { return settled_in(rec.events()); }, 10000ms);
  rec.finish();
  const auto events = rec.events();
  ASSERT_TRUE(settled) << "the end of a name's last lease was not reported:" << joined(described(events));

  int total = 0;
  for (const auto& [name, list] : tokens) total += static_cast<int>(list.size());
  EXPECT_EQ(total, kAcquisitions) << "the clients stopped at the 60 s bound";
  EXPECT_EQ(unseen.load(), 0) << "a lease held until the watch reported it was not reported within 10 s";

  // The stream, per name, in order.
  struct Seen {
    std::uint64_t last = 0;  // the token of the last `acquired` or held `state`
    bool held = false;
    bool gap_since_acquired = false;  // a gap came after the lease `last` began
    int acquired = 0, released = 0;
    std::vector<std::uint64_t> since_last_gap;  // tokens shown after the last gap, in order
  };
  std::map<std::string, Seen> by_name;
  std::set<std::string> holders;
  int gaps = 0;
  int inferred_lost = 0;
  const std::string all = joined(described(events));
  for (const auto& r : events) {
    const WatchEvent& e = r.ev;
    if (e.kind == WatchEventKind::gap) {
      for (const auto& n : e.gap_names) ASSERT_EQ(n.rfind(prefix, 0), 0u) << "a gap named " << n << all;
      ++gaps;
      for (const auto& n : names) {
        by_name[n].gap_since_acquired = true;
        by_name[n].since_last_gap.clear();
      }
      continue;
    }
    ASSERT_EQ(e.name.rfind(prefix, 0), 0u) << describe(e);
    Seen& n = by_name[e.name];
    switch (e.kind) {
      case WatchEventKind::state:
        ASSERT_GT(gaps, 0) << "a state with no gap before it: " << describe(e) << all;
        if (e.held) {
          ASSERT_GE(e.token, n.last) << "a re-list older than what was reported: " << describe(e) << all;
          n.last = e.token;
          n.since_last_gap.push_back(e.token);
          holders.insert(e.holder.substr(0, e.holder.find(':')));
        }
        n.held = e.held;
        break;
      case WatchEventKind::acquired:
        ASSERT_FALSE(n.held) << "acquired before the end of token " << n.last << ": " << describe(e) << all;
        ASSERT_GT(e.token, n.last) << describe(e) << all;
        n.last = e.token;
        n.held = true;
        n.gap_since_acquired = false;
        ++n.acquired;
        n.since_last_gap.push_back(e.token);
        holders.insert(e.holder.substr(0, e.holder.find(':')));
        break;
      case WatchEventKind::released:
        ASSERT_TRUE(n.held) << describe(e) << all;
        ASSERT_EQ(e.token, n.last) << describe(e) << all;
        n.held = false;
        ++n.released;
        break;
      case WatchEventKind::lost:
        // Every holder released: a `lost` is only the contract's inferred end of a lease
        // whose release fell inside a gap.
        ASSERT_TRUE(e.inferred && n.held && e.token == n.last && n.gap_since_acquired)
            << "a loss of a lease every holder released, not after a gap: " << describe(e) << all;
        n.held = false;
        ++inferred_lost;
        break;
      default: FAIL() << "unexpected event: " << describe(e) << all;
    }
  }
  std::printf(
      "%s: %d acquisitions of %zu names by %d clients in %lld ms%s; %zu events, %d gap(s), "
      "%d inferred loss(es) after a gap\n",
      GetParam().label.c_str(), total, tokens.size(), kClients, static_cast<long long>(took.count()),
      traits_.reports_from_readings ? " (each held until the watch reported it)" : "", events.size(), gaps,
      inferred_lost);

  for (const auto& [name, list] : tokens) {
    // The clients' own order of a name's acquisitions is its token order.
    EXPECT_TRUE(std::is_sorted(list.begin(), list.end()) &&
                std::adjacent_find(list.begin(), list.end()) == list.end())
        << name;
    const Seen& n = by_name[name];
    EXPECT_FALSE(n.held) << name << " ends held in the stream:" << all;
    if (gaps == 0) {
      for (const std::uint64_t t : list) {
        EXPECT_TRUE(has_event(events, WatchEventKind::acquired, name, t))
            << name << " token " << t << " not reported";
        EXPECT_TRUE(has_event(events, WatchEventKind::released, name, t))
            << name << " token " << t << " never released";
      }
      EXPECT_EQ(n.acquired, static_cast<int>(list.size())) << name;
      EXPECT_EQ(n.released, static_cast<int>(list.size())) << name;
      continue;
    }
    // After the last gap nothing is skipped: from the first lease shown there, every later
    // acquisition of the clients is shown, in their order (and each ended, as checked above).
    if (n.since_last_gap.empty()) continue;  // the gap came after the name's last lease began
    const auto from = std::find(list.begin(), list.end(), n.since_last_gap.front());
    ASSERT_NE(from, list.end()) << name << " showed a token no client took:" << all;
    EXPECT_EQ(std::vector<std::uint64_t>(from, list.end()), n.since_last_gap)
        << name << ": an acquisition after the last gap was skipped:" << all;
  }
  if (gaps == 0) {
    EXPECT_EQ(holders.size(), static_cast<std::size_t>(kClients)) << "every client took a name";
  }
}

// A lock_tool holder (its own process) SIGKILLed: its lease is reported `lost` (never
// `released`: nobody released it), inferred by the watcher's re-read where the server
// publishes no expiry, and then the next holder's `acquired` with a larger token, then its
// `released`.
TEST_P(WatchConformance, KilledHolderIsLostNeverReleasedThenTheNextHolderHasALargerToken) {
  const std::string name = "cw/kill/x";
  distlock::Client watcher = client();
  distlock::Watch w = watcher.watch("cw/kill/");
  std::vector<std::string> seen;
  int gaps = 0;
  TempDir dir("distlock-watch-kill");
  const std::string file = (dir.path() / "holder.out").string();
  Process holder_process = spawn_holder(target_->url(), name, file, static_cast<long>(ttl_.count()));
  // The holder's `acquired`, or after a gap the re-list's `state` held.
  WatchEvent acquired;
  ASSERT_NE(next_holder_shown(w, "cw/kill/", name, 0, 20000ms, seen, &gaps, &acquired), Shown::not_shown)
      << read_file(file);
  const Steady::time_point killed_at = Steady::now();
  holder_process.signal(SIGKILL);
  // Its end: `lost` (never `released`), or, after a gap it fell into, the re-list's free state.
  WatchEvent end;
  const Ended lost =
      end_shown(w, "cw/kill/", name, acquired.token, WatchEventKind::lost, 15000ms, seen, &gaps, &end);
  const auto after_kill = std::chrono::duration_cast<Millis>(Steady::now() - killed_at);
  ASSERT_NE(lost, Ended::not_shown) << "no loss reported";
  std::printf("%s: the killed holder (TTL %lld ms) shown ended %lld ms after the SIGKILL: %s\n",
              GetParam().label.c_str(), static_cast<long long>(ttl_.count()),
              static_cast<long long>(after_kill.count()), describe(end).c_str());
  // Inferred where the server publishes no expiry; a free state after a gap carries no such mark.
  if (lost == Ended::as_expected) {
    EXPECT_EQ(end.inferred, traits_.infers_expiry) << describe(end);
  }
  // docs/design.md "Watching locks": an end the server does not publish is found by re-reading
  // the name at its remaining TTL, at most 5 s apart; the servers that publish one (etcd's lease,
  // zk's session) end it within the TTL. 1 s more for the round trips on 2 shared cores.
  EXPECT_LE(after_kill, ttl_ + 6000ms) << "the killed holder's loss came later than its TTL + 5 s + 1 s";

  // The next holder: its `acquired`, or after a gap the re-list's `state` held with its token;
  // then its `released`, or after a (further) gap the re-list's `state` showing the name free.
  distlock::Client next_client = client();
  distlock::Lease next = next_client.acquire(name, long_lock_opts(20000ms));  // only waits to be shown
  EXPECT_GT(next.token(), acquired.token)
      << "the next holder's token must be larger than the killed holder's";
  const Shown shown = next_holder_shown(w, "cw/kill/", name, next.token(), 10000ms, seen, &gaps);
  ASSERT_NE(shown, Shown::not_shown) << joined(seen);
  const std::uint64_t token = next.token();
  next.release();
  EXPECT_NE(end_shown(w, "cw/kill/", name, token, WatchEventKind::released, 10000ms, seen, &gaps),
            Ended::not_shown)
      << "the next holder's release was not shown";
  print_gaps(GetParam().label, "after the kill", gaps);
}

// A revoke is `revoked` with the revoked lease's token, the holder is told, the reason is the
// one kept beside the lock (the event itself carries no reason), the revoked holder's release
// adds no `released`, and the next holder's `acquired` has a larger token. A backend that
// cannot revoke (postgres://) refuses the revoke with errc::not_supported and its watch reports
// nothing for it.
TEST_P(WatchConformance, RevokeIsRevokedWithItsReasonKeptThenTheNextHolder) {
  const std::string name = "cw/rv/x";
  distlock::Client watcher = client();
  distlock::Client holder_client = client();
  distlock::Client admin = client();
  distlock::Watch w = watcher.watch("cw/rv/");
  // The revoked lease keeps the 3 s TTL: its holder finds the revoke at its next renewal, within
  // the 10 s the case allows. Where the revoke is refused, the lease only waits: the long TTL.
  distlock::Lease held =
      holder_client.acquire(name, traits_.revokes ? lock_opts(10000ms) : long_lock_opts(10000ms));
  std::vector<std::string> seen;
  int gaps = 0;
  // The holder's `acquired`, or after a gap the re-list's `state` held with its token.
  ASSERT_NE(next_holder_shown(w, "cw/rv/", name, held.token(), 10000ms, seen, &gaps), Shown::not_shown);
  if (!traits_.revokes) {
    std::error_code ec;
    admin.revoke(name, "maintenance", ec);
    EXPECT_EQ(ec, errc::not_supported) << ec.message();
    EXPECT_TRUE(held.owns());
    const std::uint64_t token = held.token();
    held.release();
    EXPECT_NE(end_shown(w, "cw/rv/", name, token, WatchEventKind::released, 10000ms, seen, &gaps),
              Ended::not_shown);
    print_gaps(GetParam().label, "refused revoke", gaps);
    return;
  }
  const std::uint64_t revoked_token = held.token();
  // The revoke: `revoked` with the lease's token (or, after a gap it fell into, the re-list's
  // `state` showing the name free); the holder finds out at its next renewal (within its TTL).
  auto told = std::make_shared<std::promise<void>>();
  held.on_lost([told] { told->set_value(); });
  const auto r = admin.revoke(name, "maintenance");
  ASSERT_TRUE(r.revoked);
  const Ended revoked =
      end_shown(w, "cw/rv/", name, revoked_token, WatchEventKind::revoked, 10000ms, seen, &gaps);
  EXPECT_NE(revoked, Ended::not_shown) << "the revoke was not shown";
  EXPECT_EQ(told->get_future().wait_for(10s), std::future_status::ready)
      << "the holder was not told within 10 s";
  EXPECT_EQ(held.loss_reason(), distlock::LossReason::revoked) << held.loss_detail();
  EXPECT_EQ(held.revoke_reason().value_or("(none)"), "maintenance");
  const auto rec = admin.last_revoke(name);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->reason, "maintenance");
  EXPECT_EQ(rec->token.value_or(0), revoked_token);
  std::error_code rel_ec;
  held.release(rel_ec);
  EXPECT_EQ(rel_ec, errc::lost) << rel_ec.message();

  // The next holder: its `acquired`, or, after a gap (a lost connection or zk session: the
  // contract's report of missed events), the re-list's `state` held with its token.
  distlock::Client next_client = client();
  distlock::Lease next = next_client.acquire(name, long_lock_opts(20000ms));  // only waits to be shown
  EXPECT_GT(next.token(), revoked_token);
  const Shown shown = next_holder_shown(w, "cw/rv/", name, next.token(), 10000ms, seen, &gaps);
  EXPECT_NE(shown, Shown::not_shown) << "the revoked lease's end is `revoked`, then the next holder:"
                                     << joined(seen);
  print_gaps(
      GetParam().label,
      revoked == Ended::as_expected ? "revoke shown as `revoked`" : "revoke shown by a state after a gap",
      gaps);
  next.release();
}

// Watched prefix "pf/ab/". Outside it: "pf/ab" and "pf/a" (prefixes of the watched prefix),
// "pf/ab_x" and "pf/abc/x" (they share its first characters), "pf/b/ab/x". Held before the watch
// starts, only the inside name is in the initial state; taken and released while it runs,
// interleaved with the inside names' hand-offs (each held, where the backend reports from
// readings, until the watch reported it), none of them is reported, nor named by a gap. Once the inside
// names' last release is reported, the stream stays silent for 1 s (this process's steady
// clock): an outside name's event delivered late would show there.
TEST_P(WatchConformance, NamesOutsideThePrefixAreNeverReported) {
  const std::string prefix = "pf/ab/";
  const std::vector<std::string> outside = {"pf/ab", "pf/a", "pf/ab_x", "pf/abc/x", "pf/b/ab/x"};
  const std::vector<std::string> inside = {"pf/ab/x", "pf/ab/y/z"};
  distlock::Client holder = client();
  distlock::Client other = client();
  // Held across the watch's start and the wait for its initial state (a redis+cluster://
  // watch subscribes 16,384 channels): the long TTL, so that no late renewal ends them.
  std::vector<distlock::Lease> before;
  for (const auto& n : outside) before.push_back(other.acquire(n, long_lock_opts(10000ms)));
  before.push_back(holder.acquire(inside[0], long_lock_opts(10000ms)));
  const std::uint64_t held_token = before.back().token();

  distlock::Client watcher = client();
  distlock::Watch w = watcher.watch(prefix);
  std::vector<std::string> seen;
  int gaps = 0;
  // The initial state; a gap before it (the watch's connection lost while it started) is
  // followed by the re-list, which states the same.
  const auto st = next_matching(
      w, 10000ms,
      [&](const WatchEvent& e) {
        if (e.kind != WatchEventKind::gap) return true;
        ++gaps;
        return false;
      },
      &seen);
  ASSERT_TRUE(st) << "no initial state:" << joined(seen);
  EXPECT_EQ(st->kind, WatchEventKind::state) << describe(*st);
  EXPECT_EQ(st->name, inside[0]);
  EXPECT_TRUE(st->held);
  EXPECT_EQ(st->token, held_token);
  for (auto& l : before) l.release();

  // Each event read: under the prefix (a gap: every name it names), and the releases noted.
  std::map<std::string, std::uint64_t> last;              // inside name -> its last token
  std::set<std::pair<std::string, std::uint64_t>> ended;  // the `released` read
  const auto done = [&] {
    return std::all_of(last.begin(), last.end(), [&](const auto& nt) { return ended.count(nt) > 0; });
  };
  // After a gap, the re-list's `state` of a name stands for the events it may have missed: held
  // with its last token, the lease is shown (as its `acquired` would); free after its last
  // token was released (it was read after that), the lease's end is shown (as its `released`
  // would).
  std::map<std::string, std::chrono::system_clock::time_point> released_at;  // its last lease's
  bool after_gap = gaps > 0;
  std::set<std::pair<std::string, std::uint64_t>> shown_held;  // `state` held read after a gap
  const auto take = [&](const WatchEvent& e) {
    seen.push_back(describe(e));
    if (e.kind == WatchEventKind::gap) {
      for (const auto& n : e.gap_names)
        EXPECT_EQ(n.rfind(prefix, 0), 0u)
            << "a gap named " << n << ", outside \"" << prefix << "\":" << joined(seen);
      after_gap = true;
      ++gaps;
      return;
    }
    EXPECT_EQ(e.name.rfind(prefix, 0), 0u)
        << "a name outside \"" << prefix << "\" was reported:" << joined(seen);
    if (e.kind == WatchEventKind::released) ended.emplace(e.name, e.token);
    if (e.kind == WatchEventKind::state) {
      EXPECT_TRUE(after_gap) << "a state with no gap before it:" << joined(seen);
      const auto it = last.find(e.name);
      if (e.held) shown_held.emplace(e.name, e.token);
      const auto rel = released_at.find(e.name);
      if (!e.held && it != last.end() && rel != released_at.end() && e.at >= rel->second) ended.insert(*it);
    }
  };
  // Three rounds: every outside name taken and released, then every inside name (held, where
  // the backend reports from readings, until the watch reported it).
  for (int round = 0; round < 3; ++round) {
    for (const auto& n : outside) other.acquire(n, lock_opts(10000ms)).release();
    for (const auto& n : inside) {
      // Held up to 10 s until the watch reports it: the long TTL.
      distlock::Lease l = holder.acquire(n, long_lock_opts(10000ms));
      last[n] = l.token();
      released_at.erase(n);
      if (!traits_.reports_from_readings) {
        l.release();
        released_at[n] = std::chrono::system_clock::now();
        continue;
      }
      const auto match = event_of(WatchEventKind::acquired, n, l.token());
      const Steady::time_point until = Steady::now() + 10s;
      bool reported = false;
      while (!reported && Steady::now() < until) {
        const auto e = w.next(std::chrono::ceil<Millis>(until - Steady::now()));
        if (!e) break;
        take(*e);
        reported = match(*e) || shown_held.count({n, l.token()}) > 0;
      }
      ASSERT_TRUE(reported) << n << " token " << l.token()
                            << " was not reported within 10 s:" << joined(seen);
      l.release();
      released_at[n] = std::chrono::system_clock::now();
    }
  }
  const Steady::time_point until = Steady::now() + 15s;
  while (!done() && Steady::now() < until) {
    const auto e = w.next(std::chrono::ceil<Millis>(until - Steady::now()));
    if (!e) break;
    take(*e);
  }
  ASSERT_TRUE(done()) << "the inside names' last releases were not all reported:" << joined(seen);
  // 1 s of silence; only a gap (naming no outside name) and its re-list's free states of
  // inside names may come there (nothing is held).
  const Steady::time_point quiet_until = Steady::now() + 1s;
  while (Steady::now() < quiet_until) {
    const auto e = w.next(std::chrono::ceil<Millis>(quiet_until - Steady::now()));
    if (!e) break;
    take(*e);
    EXPECT_TRUE(e->kind == WatchEventKind::gap || (e->kind == WatchEventKind::state && !e->held))
        << "an event after the inside names' last release:" << joined(seen);
  }
  print_gaps(GetParam().label, "prefix filter", gaps);
}

// The backends that publish no lock changes: client.watch() throws errc::not_supported, naming
// the watch and why, never an empty stream (docs/design.md "Watching locks").
class WatchRefused : public ::testing::TestWithParam<Kind> {};

TEST_P(WatchRefused, WatchIsNotSupportedNamingTheWatch) {
  std::unique_ptr<Target> target = GetParam().make({});
  distlock::Client c = distlock::connect(target->url(), quiet());
  try {
    distlock::Watch w = c.watch("cw/");
    ADD_FAILURE() << GetParam().label << ": a watch was started on a backend that publishes no lock changes";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::not_supported) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("watch of \"cw/\""), std::string::npos) << what;
    EXPECT_NE(what.find("publishes no lock changes"), std::string::npos) << what;
  }
  // Locking on the same client is unharmed by the refusal.
  distlock::Lease l = c.acquire("cw/after", ttl_of(3000ms, 10000ms));
  EXPECT_TRUE(l.owns());
}

INSTANTIATE_TEST_SUITE_P(Backends, WatchConformance, ::testing::ValuesIn(kinds_where(true)), label_of);
INSTANTIATE_TEST_SUITE_P(Backends, WatchRefused, ::testing::ValuesIn(kinds_where(false)), label_of);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(WatchConformance);

}  // namespace

}  // namespace distlock::testing
