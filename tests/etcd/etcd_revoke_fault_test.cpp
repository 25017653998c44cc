// The etcd revoke's keepalive window under fault (docs/etcd.md "Revoke", src/etcd/etcd_revoke.cpp).
// The revoke grants a lease L (the holder's TTL + 1 s, kept alive by nobody), moves the holder's
// key onto L in one Txn that also writes the lock-delay marker "lost\n<W ms>" (W: the holder's
// TTL) on a lease of its own, then sends a keepalive of L and, once one is answered, puts the
// marker back as it was. Faults injected between those steps with
// the etcd backend's revoke hook (EtcdBackend::set_revoke_hook_for_test) and a fault proxy on the
// revoker's connection, against a real etcd member:
//   - the keepalive after the Txn is never answered (the revoker's connection frozen right
//     after the Txn's answer), the holder having renewed between L's grant and the Txn;
//   - the time from L's grant to the Txn's answer exceeds one second (the holder renews in
//     between, the Txn and the keepalive are delayed), the keepalive answered;
//   - the revoker process SIGKILLed right after the Txn's answer (tests/tools/etcd_revoke_tool.cpp);
//   - the first two at once (before the marker, the waiter was granted before the holder's deadline);
//   - every keepalive of L delivered and applied but its answer lost (the proxy's lose_answers: the
//     connection cut a second after etcd answered), for the revoke's three tries of two command
//     timeouts each: L moves up to its TTL past each, and the marker's lease M must move with it;
//     the same through a follower of a 3-member cluster; some answers lost, then one answered
//     (the holder's armed marker put back, its lock-delay still run after L's real end).
// In each the test measures, on the engine's steady clock (system_steady_clock(), the clock the
// holder's deadline is kept on), when the revoked holder's stop token fired and when the waiter
// was granted, and checks that the waiter is never granted before the revoked holder's local
// deadline (its last confirmed renewal's send time + its TTL, without its safety margin), that
// the holder was told first and that the waiter's fencing token is larger; and, read with
// etcdctl once revoke() returned, that the marker stayed exactly when no keepalive was answered
// (answered: it is gone, so the hand-over is not delayed). Each case prints its figures
// (docs/etcd.md "Revoke" has a run's).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "engine/lease.hpp"
#include "etcd/etcd_backend_impl.hpp"
#include "etcd_cluster.hpp"
#include "support/client_options.hpp"
#include "support/fault_proxy.hpp"
#include "support/process.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using TimePoint = Clock::time_point;
using Step = detail::etcd::EtcdBackend::RevokeStep;

constexpr Millis kTtl = 3000ms;
constexpr Millis kRenewInterval = 1000ms;
constexpr Millis kMargin = 300ms;
// The waiter's wait: the revoker's keepalive tries (up to 3 x 2 command timeouts of 2 s), the revoke
// lease (TTL + 1 s) renewed by the last of them, etcd's lessor check (every 500 ms), the marker's
// wait (up to 5 s), with room for a loaded machine.
constexpr Millis kWaiterWait = 45000ms;

// The clock the engine keeps every lease deadline on (CLOCK_BOOTTIME): all figures are read on it.
TimePoint now() {
  static const std::shared_ptr<Clock> clock = system_steady_clock();
  return clock->now();
}

long long ms(Clock::duration d) {
  return std::chrono::duration_cast<Millis>(d).count();
}

LockOptions lock_opts(Millis wait) {
  LockOptions o = ttl_of(kTtl, wait, kMargin);
  o.renew_interval = kRenewInterval;
  return o;
}

// Polls `pred` every 5 ms until it holds (true) or `limit` has passed on the engine's clock (false).
template <class Pred>
bool wait_until(Pred pred, Millis limit) {
  const TimePoint end = now() + limit;
  while (!pred()) {
    if (now() >= end) return pred();
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// The log lines of one client.
struct LogLines {
  std::mutex mu;
  std::vector<std::pair<LogLevel, std::string>> lines;
  ClientOptions options() {
    ClientOptions o;
    o.logger = [this](LogLevel level, std::string_view line) {
      std::lock_guard lk(mu);
      lines.emplace_back(level, std::string(line));
    };
    return o;
  }
  // The level of the first line containing `text`, or nullopt.
  std::optional<LogLevel> level_of(const std::string& text) {
    std::lock_guard lk(mu);
    for (const auto& [level, line] : lines) {
      if (line.find(text) != std::string::npos) return level;
    }
    return std::nullopt;
  }
  std::string all() {
    std::lock_guard lk(mu);
    std::string out;
    for (const auto& l : lines) out += l.second + "\n";
    return out;
  }
};

detail::etcd::EtcdBackend& etcd_backend(Client& c) {
  auto* b = dynamic_cast<detail::etcd::EtcdBackend*>(&detail::engine_of(c)->backend());
  if (b == nullptr) throw std::runtime_error("not an etcd backend");
  return *b;
}

// A holder of `name` (this thread's acquisition) and a waiter queued behind it, each in a client
// of its own, observed on the engine's clock.
class RevokeWindow {
 public:
  // `holder_delay`: the holder's lock_delay (0: none).
  RevokeWindow(EtcdCluster& etcd, std::string name, Millis holder_delay = 0ms)
      : name_(std::move(name)),
        holder_delay_(holder_delay),
        holder_client_(connect(etcd.url(), quiet())),
        waiter_client_(connect(etcd.url(), quiet())) {
    const TimePoint asked = now();
    LockOptions ho = lock_opts(5000ms);
    ho.lock_delay = holder_delay;
    held_ = holder_client_.acquire(name_, ho);
    hold_ = detail::engine_of(holder_client_)->held_by_this_thread(name_);
    if (!hold_) throw std::runtime_error("the holder's lease is not in its engine's table");
    // The lease's validity (etcd: what was left of the session lease at the grant, at most the
    // TTL), from the first deadline: at least the true one, by the few ms between `asked` and
    // the request's send.
    validity_ = holder_deadline() - asked;
    on_stop_.emplace(held_.stop_token(), [this] {
      std::lock_guard lk(mu_);
      stop_at_ = now();
    });
    waiter_ = std::jthread([this] {
      try {
        Lease l = waiter_client_.acquire(name_, lock_opts(kWaiterWait));
        const TimePoint at = now();
        const bool stopped = held_.stop_token().stop_requested();
        std::lock_guard lk(mu_);
        granted_at_ = at;
        holder_stopped_at_grant_ = stopped;
        next_.emplace(std::move(l));
      } catch (const std::exception& e) {
        std::lock_guard lk(mu_);
        waiter_error_ = e.what();
      }
    });
    if (!wait_until(
            [&] {
              const LockInfo i = waiter_client_.status(name_);
              return i.waiters.value_or(0) >= 1;
            },
            5000ms)) {
      throw std::runtime_error("the waiter did not queue within 5 s");
    }
  }
  ~RevokeWindow() {
    if (waiter_.joinable()) waiter_.join();
    std::lock_guard lk(mu_);
    if (next_) next_->release(ignored_);
  }

  const std::string& name() const { return name_; }
  // When the waiter was granted (joins it first).
  TimePoint granted_at() {
    if (waiter_.joinable()) waiter_.join();
    std::lock_guard lk(mu_);
    return granted_at_.value_or(TimePoint{});
  }
  std::uint64_t holder_token() const { return held_.token(); }
  // The lock-delay marker the holder armed when it was granted (with a lock-delay).
  std::string armed_marker() const {
    return "armed\n" + std::to_string(holder_token()) + "\n" + std::to_string(holder_delay_.count());
  }

  // The holder's local deadline without its safety margin: the send time of its last confirmed
  // renewal (or grant) + its validity (at most its TTL). The engine declares the loss kMargin
  // earlier.
  TimePoint holder_deadline() const { return hold_->deadline() + kMargin; }
  // The send time of the holder's last confirmed renewal (never later than the true one).
  TimePoint holder_last_sent() const { return holder_deadline() - validity_; }

  // Waits until a renewal of the holder sent at or after `t` was confirmed; false after `limit`.
  bool holder_renewed_since(TimePoint t, Millis limit) const {
    return wait_until([&] { return holder_last_sent() >= t; }, limit);
  }

  // Waits until a confirmed renewal moved the holder's local deadline past `t`; false after `limit`.
  bool holder_deadline_past(TimePoint t, Millis limit) const {
    return wait_until([&] { return holder_deadline() > t; }, limit);
  }

  // Returns `lead` before the holder's next renewal is sent (its last confirmed send + three
  // quarters of the renewal interval: the renewer batches renewals due within a quarter interval,
  // engine/lease_table.cpp), after first waiting for a renewal sent from now on, so the position
  // is fresh.
  void just_before_next_renewal(Millis lead) const {
    ASSERT_TRUE(holder_renewed_since(now(), 2 * kRenewInterval + 2000ms)) << "the holder stopped renewing";
    const TimePoint at = holder_last_sent() + kRenewInterval * 3 / 4 - lead;
    ASSERT_TRUE(wait_until([&] { return now() >= at; }, kRenewInterval));
  }

  // Joins the waiter and checks the hand-over, printing the figures relative to `revoke_called`.
  // `deadline_covered`: whether the waiter must be granted at or after the holder's local deadline
  // (false: the one case the revoke cannot cover; the figure is printed, not checked). With a
  // holder's lock-delay D the waiter is granted no earlier than `revoke_called` + D (a revoke is a
  // loss).
  void check_hand_over(const char* what, TimePoint revoke_called, bool deadline_covered = true) {
    waiter_.join();
    std::lock_guard lk(mu_);
    ASSERT_FALSE(waiter_error_) << "the waiter's acquire failed: " << *waiter_error_;
    ASSERT_TRUE(next_ && next_->owns());
    ASSERT_TRUE(granted_at_);
    ASSERT_TRUE(stop_at_) << "the revoked holder's stop token never fired";
    const TimePoint deadline = holder_deadline();
    std::printf("%s: the holder's lease validity %lld ms\n", what, ms(validity_));
    std::printf(
        "%s: holder told %lld ms and waiter granted %lld ms after revoke() was called; the holder's local "
        "deadline (last confirmed send + TTL) %lld ms after it: granted %lld ms after that deadline\n",
        what, ms(*stop_at_ - revoke_called), ms(*granted_at_ - revoke_called), ms(deadline - revoke_called),
        ms(*granted_at_ - deadline));
    if (deadline_covered) {
      EXPECT_GE(*granted_at_, deadline) << "the waiter was granted " << ms(deadline - *granted_at_)
                                        << " ms before the revoked holder's local deadline";
    }
    EXPECT_TRUE(holder_stopped_at_grant_) << "the waiter was granted before the holder's stop token fired";
    EXPECT_LT(*stop_at_, *granted_at_);
    EXPECT_GT(next_->token(), held_.token());
    EXPECT_FALSE(held_.owns());
    EXPECT_EQ(held_.loss_reason(), LossReason::revoked) << held_.loss_detail();
    if (holder_delay_ > 0ms) {
      EXPECT_GE(*granted_at_ - revoke_called, holder_delay_)
          << "the waiter was granted before the revoked holder's lock-delay ended";
    }
  }

 private:
  std::string name_;
  Millis holder_delay_;
  Client holder_client_;
  Client waiter_client_;
  Lease held_;
  std::shared_ptr<detail::HeldLock> hold_;
  Clock::duration validity_{};
  std::optional<std::stop_callback<std::function<void()>>> on_stop_;
  mutable std::mutex mu_;
  std::optional<TimePoint> stop_at_;
  std::optional<TimePoint> granted_at_;
  bool holder_stopped_at_grant_ = false;
  std::optional<Lease> next_;
  std::optional<std::string> waiter_error_;
  std::error_code ignored_;
  std::jthread waiter_;
};

// The lock-delay marker of `name` (a name without '/' or '%' past its first '/'), read with
// etcdctl: its value, or "" when there is none.
std::string delay_marker(const EtcdCluster& etcd, const std::string& name) {
  std::string enc = name;
  for (std::size_t i = enc.find('/'); i != std::string::npos; i = enc.find('/', i)) enc.replace(i, 1, "%2F");
  const std::string out = etcd.etcdctl_ok({"get", "--print-value-only", "distlock/%delay/" + enc});
  return out.empty() || out.back() != '\n' ? out : out.substr(0, out.size() - 1);
}

// The revoke's marker for a holder of TTL kTtl (3 s, a whole number of seconds, so its granted TTL).
const std::string kRevokeMarker = "lost\n3000";

std::string via(const FaultProxy& proxy) {
  return "etcd://127.0.0.1:" + std::to_string(proxy.port());
}

// A revoker client that reaches etcd through a fault proxy (commands and connects time out after
// `timeout`), with its log lines and, on the engine's clock, when its revoke's steps happened (L
// granted, the Txn answered as applied) and when revoke() was called and returned. `on_step` runs
// at each step, after its instant is taken, on the revoking thread.
class ProxiedRevoker {
 public:
  // `member`: the etcd member the proxy forwards to.
  ProxiedRevoker(EtcdCluster& etcd, Millis command_timeout, std::optional<Millis> connect_timeout,
                 std::function<void(Step)> on_step, int member = 0)
      : proxy(etcd.client_port(member)),
        client_(connect(via(proxy), options(command_timeout, connect_timeout))) {
    etcd_backend(client_).set_revoke_hook_for_test([this, on_step = std::move(on_step)](Step step) {
      const TimePoint at = now();
      if (step == Step::kGranted) {
        granted = at;
      } else if (step == Step::kApplied) {
        applied = at;
      } else {
        keepalive_attempts.push_back(at);
      }
      on_step(step);
    });
  }

  RevokeResult revoke(const std::string& name, const std::string& reason) {
    called = now();
    RevokeResult r = client_.revoke(name, reason);
    returned = now();
    return r;
  }
  // From L's grant to the Txn's answer (both steps happened).
  Clock::duration grant_to_txn() const { return *applied - *granted; }
  // "L granted -> Txn answered N ms; revoke() returned after M ms", for a test's printout.
  std::string steps() const {
    return "L granted -> Txn answered " + std::to_string(ms(grant_to_txn())) +
           " ms; revoke() returned after " + std::to_string(ms(returned - called)) + " ms";
  }
  // Whether the proxy has a connection open within 2 s: an attempt's stream goes on the channel's
  // connection, which may still be coming up after the last cut (one accepted after an arm of the
  // proxy would pass the answer).
  bool connection_open_within_2s() {
    return wait_until([&] { return proxy.open_connections() > 0; }, 2000ms);
  }

  FaultProxy proxy;
  LogLines logs;
  std::optional<TimePoint> granted, applied;
  // Each transport attempt of a keepalive of L after the Txn (before its request is written).
  std::vector<TimePoint> keepalive_attempts;
  TimePoint called{}, returned{};

 private:
  ClientOptions options(Millis command_timeout, std::optional<Millis> connect_timeout) {
    ClientOptions o = logs.options();
    o.command_timeout = command_timeout;
    if (connect_timeout) o.connect_timeout = *connect_timeout;
    return o;
  }
  Client client_;
};

// Fails (fatally) unless the revoke `r` through `revoker` was done and its hook saw both of its
// steps (L granted, the Txn answered as applied).
void expect_revoked_with_steps(const RevokeResult& r, const ProxiedRevoker& revoker) {
  ASSERT_TRUE(r.revoked);
  ASSERT_TRUE(revoker.granted && revoker.applied) << "the revoke's hook did not see L's grant and the Txn";
}

// When etcd deleted the revoked key (its lease L ended), bracketed on the engine's clock by Ranges
// of the whole prefix every 20 ms on a connection of the test's own: `alive_sent` is the send time
// of the last Range that found a key whose value is "@revoked\n..." (L ended after it), `gone_at`
// the answer time of the first that found none (L ended before it).
struct KeyEnd {
  TimePoint alive_sent{};
  TimePoint gone_at{};
};
std::optional<KeyEnd> revoked_key_end(const EtcdCluster& etcd, Millis limit) {
  const auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(etcd.client_port(0)),
                                           grpc::InsecureChannelCredentials());
  const auto kv = etcdserverpb::KV::NewStub(channel);
  etcdserverpb::RangeRequest req;
  req.set_key("distlock/");
  req.set_range_end("distlock0");  // the prefix "distlock/"
  const TimePoint end = now() + limit;
  std::optional<TimePoint> alive;
  while (now() < end) {
    const TimePoint sent = now();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 2s);
    etcdserverpb::RangeResponse resp;
    if (kv->Range(&ctx, req, &resp).ok()) {
      bool found = false;
      for (const auto& k : resp.kvs()) found = found || k.value().starts_with("@revoked\n");
      if (!found) {
        if (!alive) return std::nullopt;  // gone before the first look: no bracket
        return KeyEnd{*alive, now()};
      }
      alive = sent;
    }
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

// What a revoke through the proxy left, read as it returned: the delay marker then, the revoked
// key's end (bracketed by the poll) and, its hand-over checked, when the waiter was granted.
struct AfterRevoke {
  std::string marker_at_return;
  KeyEnd l_end;
  TimePoint granted{};
};
// Revokes w's key through the proxy (`what` its reason) and reads what followed into `out`.
// `not_armed`, counted by the revoker's step hook during the revoke, must be 0. Fails (fatally)
// when the revoke was not done, its steps' instants not taken or L's end not seen.
void revoke_and_read_after(const EtcdCluster& etcd, RevokeWindow& w, ProxiedRevoker& revoker,
                           const char* what, const int& not_armed, AfterRevoke& out) {
  const RevokeResult r = revoker.revoke(w.name(), what);
  EXPECT_EQ(not_armed, 0)
      << "an attempt's connection was not armed to lose its answer (none open within 2 s, "
         "or lose_answers not applied within 5 s)";
  ASSERT_NO_FATAL_FAILURE(expect_revoked_with_steps(r, revoker));
  out.marker_at_return = delay_marker(etcd, w.name());
  const std::optional<KeyEnd> l_end = revoked_key_end(etcd, kWaiterWait);
  ASSERT_TRUE(l_end)
      << "the revoked key's end was not seen (gone before the first look, or alive after 45 s)";
  out.l_end = *l_end;
  w.check_hand_over(what, revoker.called);
  out.granted = w.granted_at();
}

// The keepalives were applied: L, unrenewed, ends by its grant (before `granted`) + TTL + 1 s
// (+ 500 ms of etcd's lessor); it was seen alive well after that. The bracket of L's end is
// narrow (the last check uses its lower end): a slow poll would weaken it without failing. The
// guarantee: no grant before max(the holder's local deadline, L's end) + `wait` (called
// `wait_name` in the message).
void expect_granted_past_l_end(const AfterRevoke& after, RevokeWindow& w, const ProxiedRevoker& revoker,
                               Millis wait, const char* wait_name) {
  const KeyEnd& l_end = after.l_end;
  EXPECT_GT(l_end.alive_sent, *revoker.granted + kTtl + 2s) << "no keepalive of L was applied";
  EXPECT_LT(l_end.gone_at - l_end.alive_sent, 1s) << "L's end bracketed only within a second or more";
  const TimePoint from = std::max(w.holder_deadline(), l_end.alive_sent);
  EXPECT_GE(after.granted, from + wait) << "the waiter was granted " << ms(from + wait - after.granted)
                                        << " ms before max(the holder's deadline, L's end) + " << wait_name;
}

// Checks that the revoker logged, at warning level, that no keepalive was answered after its Txn.
void expect_no_keepalive_warning(LogLines& logs) {
  const std::string kNoKeepalive = "no keepalive after the revoke was answered";
  ASSERT_TRUE(logs.level_of(kNoKeepalive)) << logs.all();
  EXPECT_EQ(*logs.level_of(kNoKeepalive), LogLevel::warning) << logs.all();
}

// (a) No keepalive after the Txn is ever answered: the revoker's connection is frozen as soon as
// the Txn's answer is in, and the holder renewed between L's grant and the Txn. L then ends at
// its grant + TTL + 1 s; the revoke's marker stays, so the waiter, first once L ends, waits the
// holder's TTL more. The revoke says so at warning level.
TEST(EtcdRevokeFault, KeepaliveAfterTheTxnNeverAnsweredStillOutlastsTheHoldersDeadline) {
  EtcdCluster etcd(1);
  RevokeWindow w(etcd, "fault/keepalive-cut");
  std::optional<TimePoint> renewed_hook;
  bool renewed_in_gap = false;
  // Each of the three keepalive tries gives up after 2 x 500 ms.
  ProxiedRevoker revoker(etcd, 500ms, 500ms, [&](Step step) {
    if (step == Step::kGranted) {
      // The holder's renewal lands between L's grant and the Txn: its deadline then passes
      // L's grant + TTL; only the extra second covers it.
      renewed_in_gap = w.holder_renewed_since(*revoker.granted, 2 * kRenewInterval);
      renewed_hook = now();
    } else {
      revoker.proxy.freeze();
    }
  });
  w.just_before_next_renewal(100ms);
  const RevokeResult r = revoker.revoke(w.name(), "keepalive cut");
  ASSERT_NO_FATAL_FAILURE(expect_revoked_with_steps(r, revoker));
  EXPECT_EQ(r.token.value_or(0), w.holder_token());
  EXPECT_TRUE(renewed_in_gap) << "the holder did not renew between L's grant and the Txn";
  std::printf("keepalive cut: %s (the holder's renewal in between confirmed after %lld ms: %s)\n",
              revoker.steps().c_str(), ms(*renewed_hook - *revoker.granted), renewed_in_gap ? "yes" : "no");
  EXPECT_LT(revoker.grant_to_txn(), 1000ms) << "the case needs a grant->Txn time below the extra second";
  // The revoke reports the unanswered keepalive and the marker it leaves (a warning).
  ASSERT_NO_FATAL_FAILURE(expect_no_keepalive_warning(revoker.logs));
  EXPECT_TRUE(revoker.logs.level_of("marker stays")) << revoker.logs.all();
  EXPECT_EQ(delay_marker(etcd, w.name()), kRevokeMarker);
  w.check_hand_over("keepalive cut", revoker.called);
}

// (b) The time from L's grant to the Txn's answer exceeds one second: a renewal of the holder,
// confirmed before the Txn is sent, moves its deadline past L's grant + TTL + 1.1 s (so L alone
// would end before it), and the Txn and the keepalive are slowed by 300 ms each way. The
// keepalive after the Txn is answered and moves L's end past the holder's deadline.
TEST(EtcdRevokeFault, GrantToTxnOverOneSecondIsCoveredByTheKeepalive) {
  EtcdCluster etcd(1);
  RevokeWindow w(etcd, "fault/slow-txn");
  bool renewed_late = false;
  // A delayed call (two 300 ms hops each way) is answered within the 5 s command timeout.
  ProxiedRevoker revoker(etcd, 5000ms, std::nullopt, [&](Step step) {
    if (step == Step::kGranted) {
      // L alone (its grant + TTL + 1 s) would end before the holder's deadline.
      renewed_late = w.holder_deadline_past(*revoker.granted + kTtl + 1100ms, 2 * kRenewInterval + 2000ms);
      revoker.proxy.delay(300ms);
    }
  });
  const RevokeResult r = revoker.revoke(w.name(), "slow txn");
  revoker.proxy.pass();
  ASSERT_NO_FATAL_FAILURE(expect_revoked_with_steps(r, revoker));
  EXPECT_TRUE(renewed_late) << "no renewal of the holder moved its deadline past L's grant + TTL + 1.1 s";
  const long long gap = ms(revoker.grant_to_txn());
  std::printf("slow txn: %s; the holder's deadline %lld ms after L's grant\n", revoker.steps().c_str(),
              ms(w.holder_deadline() - *revoker.granted));
  EXPECT_GT(gap, 1000) << "the case needs a grant->Txn time above the extra second";
  // Without the keepalive L would end at its grant + TTL + 1 s, before this deadline.
  EXPECT_GT(w.holder_deadline(), *revoker.granted + kTtl + 1s);
  EXPECT_FALSE(revoker.logs.level_of("no keepalive after the revoke was answered")) << revoker.logs.all();
  // The keepalive was answered: the marker is gone (the holder set no lock-delay), so the
  // waiter is granted when L ends, not W later.
  EXPECT_EQ(delay_marker(etcd, w.name()), "");
  w.check_hand_over("slow txn", revoker.called);
}

// (a) and (b) together: a renewal of the holder, confirmed before the Txn is sent, moves its
// deadline past L's grant + TTL + 1.5 s, and no keepalive after the Txn is answered. L ends at its
// grant + TTL + 1 s, before the holder's local deadline (without the marker the waiter was granted
// then: 697 ms before that deadline on main, 576b6c4); the marker makes the waiter wait the
// holder's TTL from a read after the Txn's apply, so it is granted after that deadline. The holder,
// still connected, is told at its next renewal: its stop token fires before the waiter's grant,
// and the waiter's token is larger.
TEST(EtcdRevokeFault, SlowTxnAndNoKeepaliveStillOutlastsTheHoldersDeadline) {
  EtcdCluster etcd(1);
  RevokeWindow w(etcd, "fault/slow-txn-keepalive-cut");
  bool renewed_late = false;
  ProxiedRevoker revoker(etcd, 500ms, 500ms, [&](Step step) {
    if (step == Step::kGranted) {
      renewed_late = w.holder_deadline_past(*revoker.granted + kTtl + 1500ms, 2 * kRenewInterval + 2500ms);
    } else {
      revoker.proxy.freeze();
    }
  });
  const RevokeResult r = revoker.revoke(w.name(), "slow txn, keepalive cut");
  ASSERT_NO_FATAL_FAILURE(expect_revoked_with_steps(r, revoker));
  EXPECT_TRUE(renewed_late) << "no renewal of the holder moved its deadline past L's grant + TTL + 1.5 s";
  std::printf(
      "slow txn, keepalive cut: L granted -> Txn answered %lld ms; the holder's deadline %lld ms after "
      "L's grant\n",
      ms(revoker.grant_to_txn()), ms(w.holder_deadline() - *revoker.granted));
  EXPECT_GT(revoker.grant_to_txn(), 1000ms);
  // L alone (its grant + TTL + 1 s) ends before the holder's deadline.
  EXPECT_GT(w.holder_deadline(), *revoker.granted + kTtl + 1s);
  ASSERT_NO_FATAL_FAILURE(expect_no_keepalive_warning(revoker.logs));
  EXPECT_EQ(delay_marker(etcd, w.name()), kRevokeMarker);
  w.check_hand_over("slow txn, keepalive cut", revoker.called);
}

// (c) The revoker process is SIGKILLed right after its Txn's answer, before any keepalive of L
// (tests/tools/etcd_revoke_tool.cpp kills itself from the revoke hook). The revoke was issued
// just before the holder's next renewal is due.
TEST(EtcdRevokeFault, RevokerKilledRightAfterTheTxnStillOutlastsTheHoldersDeadline) {
  EtcdCluster etcd(1);
  RevokeWindow w(etcd, "fault/revoker-killed");
  TempDir dir("distlock-etcd-revoke-fault");
  const std::string log = (dir.path() / "revoker.log").string();
  w.just_before_next_renewal(100ms);
  const TimePoint called = now();
  Process revoker = Process::spawn({DISTLOCK_ETCD_REVOKE_TOOL, etcd.url(), w.name(), "revoker killed"}, log);
  const int status = revoker.wait_for(15000ms);
  const TimePoint died = now();
  ASSERT_NE(status, -1) << "the revoker did not end within 15 s";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the revoker did not die by SIGKILL after its Txn (status " << status << ")";
  std::printf("revoker killed: it died %lld ms after it was started\n", ms(died - called));
  // The Txn was applied: the holder's key waits out L as a revoked key.
  const std::string keys = etcd.etcdctl_ok({"get", "--prefix", "distlock/"});
  EXPECT_NE(keys.find("@revoked"), std::string::npos) << keys;
  // No keepalive was sent: the marker stays on its own lease (it ends by itself, W + 1 s after
  // L would; the waiter takes it over before that).
  EXPECT_EQ(delay_marker(etcd, w.name()), kRevokeMarker);
  w.check_hand_over("revoker killed", called);
  // The waiter, granted, took the marker over (it set no lock-delay: deleted it).
  EXPECT_EQ(delay_marker(etcd, w.name()), "");
}

// (e) Keepalives of L delivered, their answers lost (docs/etcd.md "Revoke"): in every transport
// attempt of every keepalive of L after the Txn, the revoker's connection (open then) forwards the
// request to etcd, which applies it and answers; the proxy drops the answer and cuts the connection
// a second later (FaultProxy::lose_answers). The revoke's three tries of up to two command timeouts
// (2 s) each send about fourteen, over about 12 s: each moves L's end to its apply + TTL + 1 s, past
// the end of the marker's lease M as granted (L's grant + TTL + 1 s + W + 1 s). No keepalive is
// answered, so the revoke is unconfirmed and the marker must stay until L ends: the waiter,
// first once L ends, must wait W (the holder's TTL, or its own lock-delay D if longer) after it.
// Checked: the waiter is granted no earlier than max(the holder's local deadline, L's real end) + W,
// on the engine's clock, with L's end bracketed by a poll of the key (revoked_key_end). Before M
// was kept alive with L, the marker was gone when revoke() returned and the waiter was granted at
// L's end (9 ms after it; 2,990 ms short of the bound).
// `members`: the cluster's size; with more than one the revoker reaches a follower (each renewal
// of M and of L forwarded to the leader in turn: the gap δ between them is the follower's).
void expect_answers_lost_still_delay(const char* what, const std::string& name, Millis holder_delay,
                                     int members = 1) {
  constexpr Millis kCutAfter = 1000ms;
  const Millis wait = std::max(kTtl, holder_delay);  // W
  EtcdCluster etcd(members);
  const int leader = etcd.leader();
  ASSERT_GE(leader, 0) << "no etcd leader";
  const int member = members == 1 ? 0 : (leader + 1) % members;
  RevokeWindow w(etcd, name, holder_delay);
  int not_armed = 0;
  int no_connection = 0;
  ProxiedRevoker revoker(
      etcd, 2000ms, std::nullopt,
      [&](Step step) {
        if (step != Step::kKeepAlive) return;
        if (!revoker.connection_open_within_2s()) ++no_connection;
        if (!revoker.proxy.lose_answers(kCutAfter)) ++not_armed;
      },
      member);
  AfterRevoke after;
  ASSERT_NO_FATAL_FAILURE(revoke_and_read_after(etcd, w, revoker, what, not_armed, after));
  const auto& [marker_at_return, l_end, granted] = after;

  const TimePoint txn = *revoker.applied;
  const auto& ka = revoker.keepalive_attempts;
  ASSERT_FALSE(ka.empty());
  std::printf(
      "%s: %zu keepalive attempts of L, %lld ms to %lld ms after the Txn's answer; %d connections cut after "
      "%llu answer bytes dropped; revoke() returned %lld ms after the Txn\n",
      what, ka.size(), ms(ka.front() - txn), ms(ka.back() - txn), revoker.proxy.answers_lost(),
      static_cast<unsigned long long>(revoker.proxy.answer_bytes_dropped()), ms(revoker.returned - txn));
  std::printf(
      "%s: %d attempts found no connection open at the proxy within 2 s; the marker when revoke() returned: "
      "\"%s\"; the unanswered keepalive logged: %s\n",
      what, no_connection, marker_at_return.c_str(),
      revoker.logs.level_of("no keepalive after the revoke was answered") ? "yes" : "no");
  std::printf(
      "%s: M unrenewed would end at most %lld ms after the Txn; L ended between %lld and %lld ms after it; "
      "the holder's deadline %lld ms after it; the waiter granted %lld ms after it: %lld ms after L's end "
      "(its lower bound), W = %lld ms\n",
      what, ms(*revoker.granted + kTtl + 1s + wait + 1s - txn), ms(l_end.alive_sent - txn),
      ms(l_end.gone_at - txn), ms(w.holder_deadline() - txn), ms(granted - txn),
      ms(granted - l_end.alive_sent), static_cast<long long>(wait.count()));

  if (members > 1) {
    const int leader_after = etcd.leader();
    std::printf("%s: the revoker on member %d, the leader member %d before and %d after\n", what, member,
                leader, leader_after);
    EXPECT_EQ(leader_after, leader) << "the leader changed: the revoker's member may have been the leader";
  }
  // Several attempts, delivered with their answers lost on several connections (an attempt that
  // timed out before its connection's cut leaves the next attempt the same connection).
  EXPECT_GE(ka.size(), 4u);
  EXPECT_GE(revoker.proxy.answers_lost(), 3);
  // Unconfirmed: the revoke says so, and its marker is there when it returns.
  ASSERT_NO_FATAL_FAILURE(expect_no_keepalive_warning(revoker.logs));
  EXPECT_EQ(marker_at_return, "lost\n" + std::to_string(wait.count()))
      << "the marker's lease ended while the revoked key's lives";
  ASSERT_NO_FATAL_FAILURE(expect_granted_past_l_end(after, w, revoker, wait, "W"));
}

TEST(EtcdRevokeFault, KeepalivesDeliveredWithTheirAnswersLostStillDelayTheNextHolderPastLsEnd) {
  expect_answers_lost_still_delay("answers lost", "fault/answers-lost", 0ms);
}

// The same with a holder's lock-delay D of 5 s, longer than its TTL: W = D.
TEST(EtcdRevokeFault, KeepalivesDeliveredWithTheirAnswersLostStillDelayByTheHoldersLongerLockDelay) {
  expect_answers_lost_still_delay("answers lost, lock-delay 5 s", "fault/answers-lost-delay", 5000ms);
}

// The same on a 3-member cluster, the revoker's connection to a follower: each keepalive of M and
// of L is forwarded to the leader in turn (docs/etcd.md "Revoke", the assumption on δ).
TEST(EtcdRevokeFault, KeepalivesDeliveredWithTheirAnswersLostThroughAFollowerStillDelayTheNextHolder) {
  expect_answers_lost_still_delay("answers lost, via a follower", "fault/answers-lost-follower", 0ms, 3);
}

// Some keepalives of L delivered with their answers lost, then one answered (docs/etcd.md
// "Revoke"): the revoke is confirmed, so its second Txn puts the holder's armed marker (lock-delay
// D = 5 s, longer than the TTL) back; L, moved by every applied keepalive, ends later than
// unrenewed. The holder's D must still run after L's real end: the waiter is granted no earlier
// than max(the holder's local deadline, L's end) + D, L's end bracketed by the poll of the key.
TEST(EtcdRevokeFault, AnswersLostThenOneAnsweredPutsTheHoldersMarkerBackAndKeepsItsDelayPastLsEnd) {
  constexpr Millis kCutAfter = 1000ms;
  constexpr Millis kDelay = 5000ms;
  constexpr int kLost = 2;  // transport attempts armed to lose their answers
  const char* const what = "answers lost, then one answered";
  EtcdCluster etcd(1);
  RevokeWindow w(etcd, "fault/answers-lost-then-answered", kDelay);
  ASSERT_EQ(delay_marker(etcd, w.name()), w.armed_marker());
  int armed = 0;
  int not_armed = 0;
  ProxiedRevoker revoker(etcd, 2000ms, std::nullopt, [&](Step step) {
    if (step != Step::kKeepAlive || armed >= kLost) return;
    ++armed;
    if (!revoker.connection_open_within_2s() || !revoker.proxy.lose_answers(kCutAfter)) ++not_armed;
  });
  AfterRevoke after;
  ASSERT_NO_FATAL_FAILURE(revoke_and_read_after(etcd, w, revoker, what, not_armed, after));
  const auto& [marker_at_return, l_end, granted] = after;
  const TimePoint txn = *revoker.applied;
  const auto& ka = revoker.keepalive_attempts;
  std::printf(
      "%s: %zu keepalive attempts of L (%d armed), %d connections cut; the marker when revoke() returned: "
      "\"%s\"; "
      "L ended between %lld and %lld ms after the Txn; the holder's deadline %lld ms after it; the waiter "
      "granted "
      "%lld ms after it: %lld ms after L's end, D = %lld ms\n",
      what, ka.size(), armed, revoker.proxy.answers_lost(), marker_at_return.c_str(),
      ms(l_end.alive_sent - txn), ms(l_end.gone_at - txn), ms(w.holder_deadline() - txn), ms(granted - txn),
      ms(granted - l_end.alive_sent), static_cast<long long>(kDelay.count()));
  EXPECT_GE(revoker.proxy.answers_lost(), 1);
  EXPECT_GT(ka.size(), static_cast<std::size_t>(kLost)) << "no attempt after the lost ones";
  // Confirmed: no warning, and the holder's armed marker is back.
  EXPECT_FALSE(revoker.logs.level_of("no keepalive after the revoke was answered"))
      << "the answered keepalive was not seen: " << revoker.logs.all();
  EXPECT_EQ(marker_at_return, w.armed_marker()) << "the holder's marker was not put back";
  // L was moved by the applied keepalives past its unrenewed end.
  ASSERT_NO_FATAL_FAILURE(expect_granted_past_l_end(after, w, revoker, kDelay, "D"));
}

// A holder with a lock-delay D longer than its TTL (docs/etcd.md "Revoke", W = max(TTL, D)):
// revoked with no fault, the keepalive is answered and the holder's armed marker is put back as
// it was (the next holder waits D after the revoked key's lease, as for any loss); revoked with the
// keepalive cut, the revoke's marker waits D, not the TTL. In both the waiter is granted no earlier
// than the revoke's call + D (a revoke is a loss) and after the holder's local deadline.
TEST(EtcdRevokeFault, AHoldersLongerLockDelayIsKeptByTheRevokesMarker) {
  constexpr Millis kDelay = 5000ms;
  EtcdCluster etcd(1);
  {
    // The revoker's client first: the revoke then follows the window's start at once.
    Client revoker = connect(etcd.url(), quiet());
    RevokeWindow w(etcd, "fault/delay-confirmed", kDelay);
    const std::string armed = delay_marker(etcd, w.name());
    EXPECT_EQ(armed, w.armed_marker());
    const TimePoint called = now();
    ASSERT_TRUE(revoker.revoke(w.name(), "delay, confirmed").revoked);
    EXPECT_EQ(delay_marker(etcd, w.name()), armed) << "the holder's marker was not put back";
    w.check_hand_over("lock-delay 5 s, confirmed", called);
  }
  {
    RevokeWindow w(etcd, "fault/delay-keepalive-cut", kDelay);
    ProxiedRevoker revoker(etcd, 500ms, 500ms, [&](Step step) {
      if (step == Step::kApplied) revoker.proxy.freeze();
    });
    ASSERT_TRUE(revoker.revoke(w.name(), "delay, keepalive cut").revoked);
    EXPECT_EQ(delay_marker(etcd, w.name()), "lost\n5000");
    w.check_hand_over("lock-delay 5 s, keepalive cut", revoker.called);
  }
}

// Two revokes of one name at once (two clients, released together): exactly one revokes (the
// other finds the key moved, reads again and finds it revoked: a no-op that writes nothing), the
// holder's armed marker (lock-delay D, 1 s) is back when both have returned, and the waiter is
// granted after the holder's local deadline and at least D after the calls, with a larger token.
TEST(EtcdRevokeFault, TwoRevokesAtOnceRevokeOnceAndKeepTheHoldersLockDelay) {
  constexpr Millis kDelay = 1000ms;
  EtcdCluster etcd(1);
  RevokeWindow w(etcd, "fault/two-revokes", kDelay);
  const std::string armed = delay_marker(etcd, w.name());
  ASSERT_EQ(armed, w.armed_marker());
  Client a = connect(etcd.url(), quiet());
  Client b = connect(etcd.url(), quiet());
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  RevokeResult ra, rb;
  auto run = [&](Client& c, RevokeResult& out) {
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return go; });
    }
    out = c.revoke(w.name(), "two at once");
  };
  std::jthread ta([&] { run(a, ra); });
  std::jthread tb([&] { run(b, rb); });
  const TimePoint called = now();
  {
    std::lock_guard lk(mu);
    go = true;
  }
  cv.notify_all();
  ta.join();
  tb.join();
  std::printf("two revokes: both returned %lld ms after the call; revoked: %d and %d\n", ms(now() - called),
              ra.revoked ? 1 : 0, rb.revoked ? 1 : 0);
  EXPECT_NE(ra.revoked, rb.revoked) << "exactly one of two revokes at once must revoke";
  EXPECT_EQ(delay_marker(etcd, w.name()), armed) << "the holder's lock-delay marker was not put back";
  w.check_hand_over("two revokes", called);
}

}  // namespace
}  // namespace distlock::testing
