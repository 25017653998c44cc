#include "support/watch_recorder.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <future>
#include <memory>
#include <utility>

#include "support/client_options.hpp"
#include "support/load_thread.hpp"
#include "support/lock_tool.hpp"

namespace distlock::testing {

namespace {
using Steady = std::chrono::steady_clock;
}  // namespace

std::string describe(const WatchEvent& e) {
  return std::string(to_string(e.kind)) + " " + e.name + " token=" + std::to_string(e.token) +
         " held=" + (e.held ? "1" : "0") + (e.inferred ? " inferred" : "") + " " + e.detail;
}

std::function<bool(const WatchEvent&)> event_of(WatchEventKind kind, std::string name, std::uint64_t token) {
  return [kind, name = std::move(name), token](const WatchEvent& e) {
    return e.kind == kind && (name.empty() || e.name == name) && (token == 0 || e.token == token);
  };
}

std::optional<WatchEvent> next_change(Watch& w, Millis limit) {
  return next_matching(w, limit, is_change);
}

std::optional<WatchEvent> next_matching(Watch& w, Millis limit,
                                        const std::function<bool(const WatchEvent&)>& match,
                                        std::vector<std::string>* seen) {
  const auto end = Steady::now() + limit;
  while (Steady::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Steady::now()));
    if (!e) return std::nullopt;
    if (seen) seen->push_back(describe(*e));
    if (match(*e)) return e;
  }
  return std::nullopt;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += "\n  " + l;
  return s;
}

void HandOffOrder::check(const WatchEvent& e) {
  Name& n = names_[e.name];
  switch (e.kind) {
    case WatchEventKind::acquired:
      ASSERT_FALSE(n.held) << "acquired before the end of token " << n.last << ": " << describe(e);
      ASSERT_GT(e.token, n.last) << describe(e);
      n.last = e.token;
      n.held = true;
      n.gap_since_acquired = false;
      ++n.acquired;
      holders_.insert(e.holder.substr(0, e.holder.find(':')));
      break;
    case WatchEventKind::released:
      ASSERT_TRUE(n.held) << describe(e);
      ASSERT_EQ(e.token, n.last) << describe(e);
      n.held = false;
      ++n.released;
      break;
    case WatchEventKind::lost:
      ASSERT_TRUE(e.inferred && n.held && n.gap_since_acquired && e.token == n.last)
          << "a loss that is not the inferred end of a lease held across a gap: " << describe(e);
      EXPECT_NE(e.detail.find("events were missed"), std::string::npos) << describe(e);
      n.held = false;
      break;
    default: FAIL() << "unexpected event: " << describe(e);
  }
}

void HandOffOrder::take_gap() {
  for (auto& [name, n] : names_)
    if (n.held) n.gap_since_acquired = true;
}

void HandOffOrder::take_state(const WatchEvent& e) {
  Name& n = names_[e.name];
  if (e.held) {
    ASSERT_GE(e.token, n.last) << describe(e);
    n.last = e.token;
  }
  n.held = e.held;
  n.gap_since_acquired = false;
}

WatchRecorder::WatchRecorder(Watch& w) : w_(w), thread_([this] { run(); }) {}

WatchRecorder::~WatchRecorder() {
  finish();
}

void WatchRecorder::finish() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::vector<Received> WatchRecorder::events() const {
  detail::LockGuard lk(mu_);
  return events_;
}

void WatchRecorder::run() {
  for (;;) {
    auto e = w_.next(Millis(100));
    if (e) {
      detail::LockGuard lk(mu_);
      events_.push_back({std::move(*e), Steady::now()});
    } else if (stop_) {
      return;
    }
  }
}

void expect_hand_offs_in_token_order(Watch& w, const std::string& url, const std::string& name, int hand_offs,
                                     Millis limit) {
  std::atomic<int> taken{0};
  std::vector<Client> clients = connect_clients(url, 2);
  std::vector<std::thread> threads;
  for (int c = 0; c < 2; ++c) {
    threads.push_back(load_thread([&, c] {
      while (taken.load() < hand_offs) {
        Lease l = clients[c].acquire(name, ttl_of(Millis(10000), Millis(60000)));
        if (taken.fetch_add(1) >= hand_offs) break;  // released as it leaves
      }
    }));
  }
  for (auto& t : threads) t.join();
  const int acquisitions = taken.load();  // hand_offs, plus at most one per thread that stopped
  HandOffOrder order;
  const auto& ho = order.of(name);
  const auto end = Steady::now() + limit;
  while ((ho.acquired < acquisitions || ho.held) && Steady::now() < end) {
    auto e = next_change(w, Millis(10000));
    ASSERT_TRUE(e) << "no event after " << ho.acquired << " acquisitions and " << ho.released << " releases";
    ASSERT_EQ(e->name, name) << describe(*e);
    ASSERT_NO_FATAL_FAILURE(order.check(*e));
  }
  EXPECT_EQ(ho.acquired, acquisitions);
  EXPECT_EQ(ho.released, acquisitions);
  EXPECT_GE(ho.acquired, hand_offs);
  EXPECT_EQ(order.holders().size(), 2u) << "both clients took the lock";
  EXPECT_FALSE(w.next(Millis(0))) << "an event after the last release";
}

void expect_live_again(Watch& w, Client& holder, const std::string& name, Millis limit) {
  std::uint64_t token = 0;
  {
    Lease l = holder.acquire(name, ttl_of(Millis(60000), Millis(60000)));
    token = l.token();
    std::optional<WatchEvent> e;
    do {
      e = next_change(w, limit);
    } while (e && e->kind == WatchEventKind::gap);
    ASSERT_TRUE(e) << "no live event of " << name;
    EXPECT_EQ(e->kind, WatchEventKind::acquired) << describe(*e);
    EXPECT_EQ(e->name, name);
    EXPECT_EQ(e->token, token);
  }
  auto rel = next_change(w, Millis(10000));
  ASSERT_TRUE(rel) << "no release of " << name;
  EXPECT_EQ(rel->kind, WatchEventKind::released) << describe(*rel);
  EXPECT_EQ(rel->name, name);
  EXPECT_EQ(rel->token, token);
}

void expect_held_state(Watch& w, const std::string& name, std::uint64_t token) {
  auto s = w.next(Millis(10000));
  ASSERT_TRUE(s) << "no state of " << name << " within 10 s";
  EXPECT_EQ(s->kind, WatchEventKind::state) << describe(*s);
  EXPECT_EQ(s->name, name);
  EXPECT_TRUE(s->held);
  EXPECT_EQ(s->token, token);
}

void expect_stop_from_another_thread_ends_next(Watch& w) {
  std::thread stopper([&w] {
    std::this_thread::yield();
    w.stop();
  });
  const auto start = Steady::now();
  while (auto ev = w.next(Millis(30000))) {
    ADD_FAILURE() << "unexpected event " << describe(*ev);
  }
  stopper.join();
  EXPECT_LT(Steady::now() - start, Millis(10000));
}

void expect_killed_holder_lost(Watch& w, const std::string& url, const std::string& name, int ttl_ms,
                               KilledHolder& out) {
  TempDir dir("distlock-watch-kill");
  const std::string file = (dir.path() / "holder.out").string();
  Process holder = spawn_holder(url, name, file, ttl_ms);
  auto acq = next_change(w, Millis(20000));
  ASSERT_TRUE(acq) << read_file(file);
  ASSERT_EQ(acq->kind, WatchEventKind::acquired) << describe(*acq);
  out.acquired = *acq;
  const auto killed_at = Steady::now();
  holder.signal(SIGKILL);
  auto lost = next_change(w, Millis(15000));
  out.after_kill = std::chrono::duration_cast<Millis>(Steady::now() - killed_at);
  ASSERT_TRUE(lost) << "no loss reported";
  out.lost = *lost;
  EXPECT_EQ(lost->kind, WatchEventKind::lost) << describe(*lost);
  EXPECT_EQ(lost->name, name);
  EXPECT_EQ(lost->token, acq->token);
}

void expect_revoke_reported(Watch& w, Client& admin, Lease& lease, const std::string& lease_name) {
  auto acq = next_change(w, Millis(10000));
  ASSERT_TRUE(acq);
  ASSERT_EQ(acq->kind, WatchEventKind::acquired) << describe(*acq);
  ASSERT_EQ(acq->token, lease.token());
  const auto r = admin.revoke(lease_name, "maintenance");
  ASSERT_TRUE(r.revoked);
  auto rv = next_change(w, Millis(10000));
  ASSERT_TRUE(rv);
  EXPECT_EQ(rv->kind, WatchEventKind::revoked) << describe(*rv);
  EXPECT_EQ(rv->token, lease.token());
  EXPECT_EQ(rv->token, acq->token);
  // The holder finds out at its next renewal (within its TTL).
  auto told = std::make_shared<std::promise<void>>();
  lease.on_lost([told] { told->set_value(); });
  EXPECT_EQ(told->get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the holder was not told within 10 s";
}

}  // namespace distlock::testing
