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
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
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
#include "support/watch_recorder.hpp"

using namespace std::chrono_literals;
using distlock::errc;
using distlock::Millis;
using distlock::WatchEvent;
using distlock::WatchEventKind;
using distlock::testing::describe;
using distlock::testing::joined;
using distlock::testing::Kind;
using distlock::testing::Target;
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
  for (auto& k : distlock::testing::kinds()) {
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
  }
  distlock::Client client() { return distlock::connect(target_->url(), distlock::testing::quiet()); }
  distlock::LockOptions lock_opts(Millis wait) const {
    distlock::LockOptions o = distlock::testing::ttl_of(ttl_, wait);
    o.renew_interval = ttl_ / 3;
    return o;
  }

  std::unique_ptr<Target> target_;
  WatchTraits traits_;
  Millis ttl_{3000};
};

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
bool has_event(const std::vector<distlock::testing::Received>& events, WatchEventKind kind,
               const std::string& name, std::uint64_t token) {
  return std::any_of(events.begin(), events.end(), [&](const distlock::testing::Received& r) {
    return r.ev.kind == kind && r.ev.name == name && r.ev.token == token;
  });
}

std::vector<std::string> described(const std::vector<distlock::testing::Received>& events) {
  std::vector<std::string> out;
  for (const auto& r : events) out.push_back(describe(r.ev));
  return out;
}

// Three clients take and release two names under the watched prefix, 60 acquisitions in all
// (bounded by 60 s on this process's steady clock). Every lease began after watch() returned,
// so the stream must hold, per name, exactly the clients' acquisitions in token order, each
// `acquired` after the previous lease's `released`, every lease's `released`, and nothing else
// (no gap, no state, no loss: every holder released).
TEST_P(WatchConformance, HandOffsOfSeveralNamesComeInTokenOrderEachLeaseWithItsRelease) {
  constexpr int kClients = 3;
  constexpr int kAcquisitions = 60;
  const std::vector<std::string> names = {"cw/ho/a", "cw/ho/b"};
  distlock::Client watcher = client();
  distlock::Watch w = watcher.watch("cw/ho/");
  distlock::testing::WatchRecorder rec(w);

  Taken taken;
  std::atomic<int> count{0};
  std::atomic<int> unseen{0};  // paced leases whose `acquired` did not come within 10 s
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
          distlock::Lease l = cl.acquire(name, lock_opts(20000ms));
          taken.add(name, l.token());
          if (traits_.reports_from_readings &&
              !distlock::testing::eventually(
                  [&] { return has_event(rec.events(), WatchEventKind::acquired, name, l.token()); },
                  10000ms))
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

  // The end of each name's last lease is reported (bounded: 10 s after the last release).
  std::map<std::string, std::vector<std::uint64_t>> tokens;
  {
    std::lock_guard lk(taken.mu);
    tokens = taken.tokens;
  }
  const bool settled = distlock::testing::eventually(
      [&] {
        const auto events = rec.events();
        for (const auto& [name, list] : tokens) {
          if (!has_event(events, WatchEventKind::released, name, list.back())) return false;
        }
        return true;
      },
      10000ms);
  rec.finish();
  const auto events = rec.events();
  ASSERT_TRUE(settled) << "the end of a name's last lease was not reported:" << joined(described(events));

  int total = 0;
  for (const auto& [name, list] : tokens) total += static_cast<int>(list.size());
  std::printf("%s: %d acquisitions of %zu names by %d clients in %lld ms%s; %zu events\n",
              GetParam().label.c_str(), total, tokens.size(), kClients, static_cast<long long>(took.count()),
              traits_.reports_from_readings ? " (each held until the watch reported it)" : "", events.size());
  EXPECT_EQ(total, kAcquisitions) << "the clients stopped at the 60 s bound";
  EXPECT_EQ(unseen.load(), 0) << "a lease held until the watch reported it was not reported within 10 s";

  distlock::testing::HandOffOrder order;
  for (const auto& r : events) {
    ASSERT_EQ(r.ev.name.rfind("cw/ho/", 0), 0u) << describe(r.ev);
    ASSERT_NO_FATAL_FAILURE(order.check(r.ev)) << joined(described(events));
  }
  for (const auto& [name, list] : tokens) {
    // The clients' own order of a name's acquisitions is its token order.
    EXPECT_TRUE(std::is_sorted(list.begin(), list.end()) &&
                std::adjacent_find(list.begin(), list.end()) == list.end())
        << name;
    for (const std::uint64_t t : list) {
      EXPECT_TRUE(has_event(events, WatchEventKind::acquired, name, t))
          << name << " token " << t << " not reported";
      EXPECT_TRUE(has_event(events, WatchEventKind::released, name, t))
          << name << " token " << t << " never released";
    }
    EXPECT_EQ(order.of(name).acquired, static_cast<int>(list.size())) << name;
    EXPECT_EQ(order.of(name).released, static_cast<int>(list.size())) << name;
  }
  EXPECT_EQ(order.holders().size(), static_cast<std::size_t>(kClients)) << "every client took a name";
}

// A lock_tool holder (its own process) SIGKILLed: its lease is reported `lost` (never
// `released`: nobody released it), inferred by the watcher's re-read where the server
// publishes no expiry, and then the next holder's `acquired` with a larger token, then its
// `released`.
TEST_P(WatchConformance, KilledHolderIsLostNeverReleasedThenTheNextHolderHasALargerToken) {
  const std::string name = "cw/kill/x";
  distlock::Client watcher = client();
  distlock::Watch w = watcher.watch("cw/kill/");
  distlock::testing::KilledHolder k;
  ASSERT_NO_FATAL_FAILURE(distlock::testing::expect_killed_holder_lost(w, target_->url(), name,
                                                                       static_cast<int>(ttl_.count()), k));
  std::printf("%s: the killed holder (TTL %lld ms) reported %s%s %lld ms after the SIGKILL\n",
              GetParam().label.c_str(), static_cast<long long>(ttl_.count()),
              std::string(to_string(k.lost.kind)).c_str(), k.lost.inferred ? " (inferred)" : "",
              static_cast<long long>(k.after_kill.count()));
  EXPECT_EQ(k.lost.inferred, traits_.infers_expiry) << describe(k.lost);
  // docs/design.md "Watching locks": an end the server does not publish is found by re-reading
  // the name at its remaining TTL, at most 5 s apart; the servers that publish one (etcd's lease,
  // zk's session) end it within the TTL. 1 s more for the round trips on 2 shared cores.
  EXPECT_LE(k.after_kill, ttl_ + 6000ms) << "the killed holder's loss came later than its TTL + 5 s + 1 s";

  distlock::Client next_client = client();
  distlock::Lease next = next_client.acquire(name, lock_opts(20000ms));
  const auto acq = distlock::testing::next_change(w, 10000ms);
  ASSERT_TRUE(acq) << "the next holder's acquisition was not reported";
  EXPECT_EQ(acq->kind, WatchEventKind::acquired) << describe(*acq);
  EXPECT_EQ(acq->name, name);
  EXPECT_EQ(acq->token, next.token());
  EXPECT_GT(acq->token, k.acquired.token)
      << "the next holder's token must be larger than the killed holder's";
  const std::uint64_t token = next.token();
  next.release();
  const auto rel = distlock::testing::next_change(w, 10000ms);
  ASSERT_TRUE(rel) << "the next holder's release was not reported";
  EXPECT_EQ(rel->kind, WatchEventKind::released) << describe(*rel);
  EXPECT_EQ(rel->token, token);
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
  distlock::Lease held = holder_client.acquire(name, lock_opts(10000ms));
  if (!traits_.revokes) {
    const auto acq = distlock::testing::next_change(w, 10000ms);
    ASSERT_TRUE(acq);
    EXPECT_EQ(acq->kind, WatchEventKind::acquired) << describe(*acq);
    std::error_code ec;
    admin.revoke(name, "maintenance", ec);
    EXPECT_EQ(ec, errc::not_supported) << ec.message();
    EXPECT_TRUE(held.owns());
    held.release();
    const auto rel = distlock::testing::next_change(w, 10000ms);
    ASSERT_TRUE(rel);
    EXPECT_EQ(rel->kind, WatchEventKind::released) << describe(*rel);
    return;
  }
  const std::uint64_t revoked_token = held.token();
  ASSERT_NO_FATAL_FAILURE(distlock::testing::expect_revoke_reported(w, admin, held, name));
  EXPECT_EQ(held.loss_reason(), distlock::LossReason::revoked) << held.loss_detail();
  EXPECT_EQ(held.revoke_reason().value_or("(none)"), "maintenance");
  const auto rec = admin.last_revoke(name);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->reason, "maintenance");
  EXPECT_EQ(rec->token.value_or(0), revoked_token);
  std::error_code rel_ec;
  held.release(rel_ec);
  EXPECT_EQ(rel_ec, errc::lost) << rel_ec.message();

  distlock::Client next_client = client();
  distlock::Lease next = next_client.acquire(name, lock_opts(20000ms));
  std::vector<std::string> seen;
  const auto acq = distlock::testing::next_matching(w, 10000ms, distlock::testing::is_change, &seen);
  ASSERT_TRUE(acq) << "the next holder's acquisition was not reported";
  EXPECT_EQ(acq->kind, WatchEventKind::acquired)
      << "the revoked lease's end is `revoked`, nothing after it:" << joined(seen);
  EXPECT_EQ(acq->token, next.token());
  EXPECT_GT(acq->token, revoked_token);
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
  std::vector<distlock::Lease> before;
  for (const auto& n : outside) before.push_back(other.acquire(n, lock_opts(10000ms)));
  before.push_back(holder.acquire(inside[0], lock_opts(10000ms)));
  const std::uint64_t held_token = before.back().token();

  distlock::Client watcher = client();
  distlock::Watch w = watcher.watch(prefix);
  std::vector<std::string> seen;
  const auto st = distlock::testing::next_matching(
      w, 10000ms, [](const WatchEvent&) { return true; }, &seen);
  ASSERT_TRUE(st) << "no initial state";
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
  const auto take = [&](const WatchEvent& e) {
    seen.push_back(describe(e));
    if (e.kind == WatchEventKind::gap) {
      for (const auto& n : e.gap_names)
        EXPECT_EQ(n.rfind(prefix, 0), 0u)
            << "a gap named " << n << ", outside \"" << prefix << "\":" << joined(seen);
      return;
    }
    EXPECT_EQ(e.name.rfind(prefix, 0), 0u)
        << "a name outside \"" << prefix << "\" was reported:" << joined(seen);
    if (e.kind == WatchEventKind::released) ended.emplace(e.name, e.token);
  };
  // Three rounds: every outside name taken and released, then every inside name (held, where
  // the backend reports from readings, until the watch reported it).
  for (int round = 0; round < 3; ++round) {
    for (const auto& n : outside) other.acquire(n, lock_opts(10000ms)).release();
    for (const auto& n : inside) {
      distlock::Lease l = holder.acquire(n, lock_opts(10000ms));
      last[n] = l.token();
      if (!traits_.reports_from_readings) continue;
      const auto match = distlock::testing::event_of(WatchEventKind::acquired, n, l.token());
      const Steady::time_point until = Steady::now() + 10s;
      bool reported = false;
      while (!reported && Steady::now() < until) {
        const auto e = w.next(std::chrono::ceil<Millis>(until - Steady::now()));
        if (!e) break;
        take(*e);
        reported = match(*e);
      }
      ASSERT_TRUE(reported) << n << " token " << l.token()
                            << " was not reported within 10 s:" << joined(seen);
    }
  }
  const Steady::time_point until = Steady::now() + 15s;
  while (!done() && Steady::now() < until) {
    const auto e = w.next(std::chrono::ceil<Millis>(until - Steady::now()));
    if (!e) break;
    take(*e);
  }
  ASSERT_TRUE(done()) << "the inside names' last releases were not all reported:" << joined(seen);
  if (const auto e = w.next(1000ms)) {
    seen.push_back(describe(*e));
    ADD_FAILURE() << "an event after the inside names' last release:" << joined(seen);
  }
}

// The backends that publish no lock changes: client.watch() throws errc::not_supported, naming
// the watch and why, never an empty stream (docs/design.md "Watching locks").
class WatchRefused : public ::testing::TestWithParam<Kind> {};

TEST_P(WatchRefused, WatchIsNotSupportedNamingTheWatch) {
  std::unique_ptr<Target> target = GetParam().make({});
  distlock::Client c = distlock::connect(target->url(), distlock::testing::quiet());
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
  distlock::Lease l = c.acquire("cw/after", distlock::testing::ttl_of(3000ms, 10000ms));
  EXPECT_TRUE(l.owns());
}

INSTANTIATE_TEST_SUITE_P(Backends, WatchConformance, ::testing::ValuesIn(kinds_where(true)), label_of);
INSTANTIATE_TEST_SUITE_P(Backends, WatchRefused, ::testing::ValuesIn(kinds_where(false)), label_of);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(WatchConformance);

}  // namespace
