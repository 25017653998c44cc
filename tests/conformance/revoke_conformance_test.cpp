// Revoke (Client::revoke, docs/design.md "Revoke") over every backend of the build, against
// the real servers each test starts itself: the holder is told within one renewal
// interval, reads the reason, the next waiter gets the lock with a larger token, the
// revoked holder's fenced write is refused, the revoke is kept for status and counted;
// a revoke of a free lock does nothing. A backend that cannot revoke says so with
// errc::not_supported (file://, postgres://, mysql://: docs/design.md "Revoke").
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#ifdef DISTLOCK_TEST_FENCING
#include "distlock/fencing.hpp"
#endif
#include "support/backend_targets.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

constexpr Millis kTtl = 3000ms;
constexpr Millis kRenewInterval = 1000ms;
// What "within one renewal interval" is allowed on top of the interval itself: the
// renewal's round trip and the read of the revoke note (two round trips), on a machine
// of 2 shared cores with other builds running. Measured on this process's steady clock
// from the moment revoke() returned to the moment the holder's stop callback ran.
constexpr Millis kNoticeSlack = 1000ms;

// The schemes whose backend can revoke another process's hold.
bool revocable(const std::string& scheme) {
  static const std::set<std::string> yes = {"redis",   "rediss",   "redis+sentinel", "redis+cluster",
                                            "redlock", "redlocks", "etcd",           "zk"};
  return yes.count(scheme) > 0;
}

distlock::LockOptions lock_opts(std::optional<Millis> wait = std::nullopt, std::string holder_info = {}) {
  distlock::LockOptions o = distlock::testing::ttl_of(kTtl, wait);
  o.renew_interval = kRenewInterval;
  o.holder_info = std::move(holder_info);
  return o;
}

class Revoke : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override { target_ = GetParam().make({}); }
  distlock::Client client(std::string holder_info = {}) {
    distlock::ClientOptions o = distlock::testing::quiet();
    o.lock_defaults.holder_info = std::move(holder_info);
    return distlock::connect(target_->url(), o);
  }
  std::unique_ptr<Target> target_;
};

// The value of `family` for prefix "revoke" (every name here starts "revoke/") and `label`.
// Whether a waiter on `name` is waiting within 5 s: the server counts one, or it does not
// count waiters at all.
bool waiter_counted(distlock::Client& c, const std::string& name) {
  return eventually(
      [&] {
        const distlock::LockInfo i = c.status(name);
        return !i.waiters || *i.waiters >= 1;
      },
      5000ms);
}

double metric(const std::string& text, const std::string& family, const std::string& label) {
  std::size_t at = 0;
  while ((at = text.find(family + "{", at)) != std::string::npos) {
    const std::size_t eol = text.find('\n', at);
    const std::string line = text.substr(at, eol - at);
    at = eol;
    if (line.find(label) == std::string::npos || line.find("prefix=\"revoke\"") == std::string::npos)
      continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

TEST_P(Revoke, RevokeOfAFreeLockDoesNothing) {
  distlock::Client c = client();
  std::error_code ec;
  const distlock::RevokeResult r = c.revoke("revoke/free", "nobody holds it", ec);
  if (!revocable(c.scheme())) {
    EXPECT_EQ(ec, errc::not_supported) << ec.message();
    EXPECT_THROW(c.revoke("revoke/free", "nobody holds it"), std::system_error);
    return;
  }
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_FALSE(r.revoked);
  EXPECT_FALSE(r.token);
  EXPECT_FALSE(r.holder);
  EXPECT_FALSE(c.last_revoke("revoke/free")) << "a no-op revoke leaves no note";
  // Released before: still nothing held, nothing revoked.
  { distlock::Lease l = c.acquire("revoke/free", lock_opts()); }
  EXPECT_FALSE(c.revoke("revoke/free", "released already").revoked);
  EXPECT_EQ(metric(c.metrics(), "distlock_revokes_total", "result=\"nothing_held\""), 2.0);
  EXPECT_EQ(metric(c.metrics(), "distlock_revokes_total", "result=\"revoked\""), 0.0);
}

TEST_P(Revoke, ReasonIsCheckedBeforeTheServerIsAsked) {
  distlock::Client c = client();
  std::error_code ec;
  c.revoke("revoke/reason", "", ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  c.revoke("revoke/reason", std::string(1025, 'x'), ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  c.revoke("", "why", ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  // Printed raw in logs and `distlock status`: a newline could forge an audit line, an escape
  // drive the reader's terminal. The error names the byte.
  for (const std::string& bad : {std::string("ok\nrevoked by root: fine"), std::string("\x1b[2Jcleared"),
                                 std::string("nul\0byte", 8), std::string("del\x7f")}) {
    try {
      c.revoke("revoke/reason", bad);
      ADD_FAILURE() << "a reason with a control character was accepted";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
      EXPECT_NE(std::string(e.what()).find("without control characters: byte"), std::string::npos)
          << e.what();
    }
  }
}

TEST_P(Revoke, HolderIsToldWithinOneRenewalIntervalAndTheNextWaiterGetsALargerToken) {
  distlock::Client holder_client = client("host=h1 pid=1 cmd=holder");
  distlock::Client waiter_client = client("host=h2 pid=2 cmd=waiter");
  distlock::Client operator_client = client("host=ops pid=3 cmd=revoke");
  const std::string name = "revoke/held";
  const std::string reason = "stuck since 03:00, ticket 4711 (é)";

  distlock::Lease held = holder_client.acquire(name, lock_opts(std::nullopt, "host=h1 pid=1 cmd=holder"));
  ASSERT_TRUE(held.owns());

  // The holder's stop signal, time-stamped on this process's clock when it fires.
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Steady::time_point> told;
  std::stop_callback on_stop(held.stop_token(), [&] {
    std::lock_guard lk(mu);
    told = Steady::now();
    cv.notify_all();
  });

  // A waiter, queued behind the holder.
  std::atomic<bool> waiter_done{false};
  std::optional<distlock::Lease> next;
  std::exception_ptr waiter_error;
  std::thread waiter([&] {
    try {
      next.emplace(waiter_client.acquire(name, lock_opts(20000ms, "host=h2 pid=2 cmd=waiter")));
    } catch (...) {
      waiter_error = std::current_exception();
    }
    waiter_done = true;
  });
  // The waiter is waiting (the server counts it, where it can) before the revoke.
  EXPECT_TRUE(waiter_counted(operator_client, name));

  std::error_code ec;
  const distlock::RevokeResult r = operator_client.revoke(name, reason, ec);
  const Steady::time_point revoked_at = Steady::now();
  if (!revocable(operator_client.scheme())) {
    EXPECT_EQ(ec, errc::not_supported) << ec.message();
    EXPECT_TRUE(held.owns()) << "a revoke that is not supported leaves the holder alone";
    held.release();
    waiter.join();
    ASSERT_FALSE(waiter_error);
    ASSERT_TRUE(next);
    return;
  }
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(r.revoked);
  ASSERT_TRUE(r.holder);
  EXPECT_EQ(r.holder->rfind(holder_client.id(), 0), 0u) << *r.holder;
  EXPECT_EQ(r.holder_info.value_or(""), "host=h1 pid=1 cmd=holder");
  if (held.has_token()) {
    ASSERT_TRUE(r.token);
    EXPECT_EQ(*r.token, held.token());
  }

  // Told within one renewal interval (plus kNoticeSlack for the round trips).
  {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, kRenewInterval + kNoticeSlack + 5000ms, [&] { return told.has_value(); }))
        << "the holder's stop token never fired";
    const auto took = std::chrono::duration_cast<Millis>(*told - revoked_at);
    EXPECT_LE(took, kRenewInterval + kNoticeSlack) << "the holder was told after " << took.count() << " ms";
    std::printf("holder told %lld ms after revoke() returned (bound %lld ms)\n",
                static_cast<long long>(took.count()),
                static_cast<long long>((kRenewInterval + kNoticeSlack).count()));
  }
  EXPECT_FALSE(held.owns());
  EXPECT_EQ(held.loss_reason(), distlock::LossReason::revoked) << held.loss_detail();
  EXPECT_EQ(held.revoke_reason().value_or("(none)"), reason);
  EXPECT_NE(held.loss_detail().find(reason), std::string::npos) << held.loss_detail();
  EXPECT_NE(held.loss_detail().find(operator_client.id()), std::string::npos) << held.loss_detail();
  EXPECT_NE(held.loss_detail().find("host=ops pid=3 cmd=revoke"), std::string::npos) << held.loss_detail();

  // The next waiter has the lock, with a larger token; the revoked holder's fenced write
  // is refused once the new holder has written.
  waiter.join();
  ASSERT_FALSE(waiter_error);
  ASSERT_TRUE(next && next->owns());
  if (held.has_token()) {
    EXPECT_GT(next->token(), held.token());
#ifdef DISTLOCK_TEST_FENCING
    distlock::FenceGuard fence;
    EXPECT_TRUE(fence.apply(next->token(), [] {}).applied());
    EXPECT_FALSE(fence.apply(held.token(), [] {}).applied()) << "the revoked holder's write must be refused";
#endif
  }

  // The revoke is kept beside the lock.
  const std::optional<distlock::RevokeRecord> rec = operator_client.last_revoke(name);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->reason, reason);
  EXPECT_EQ(rec->by, operator_client.id());
  EXPECT_EQ(rec->by_info.value_or(""), "host=ops pid=3 cmd=revoke");
  EXPECT_EQ(rec->holder.rfind(holder_client.id(), 0), 0u) << rec->holder;
  EXPECT_EQ(rec->holder_info.value_or(""), "host=h1 pid=1 cmd=holder");
  if (held.has_token()) {
    EXPECT_EQ(rec->token.value_or(0), held.token());
  }
  const auto age = std::chrono::system_clock::now() - rec->at;
  EXPECT_LT(age, 60s);
  EXPECT_GT(age, -60s);

  // Counted: the revoker's revokes, the holder's loss by reason.
  EXPECT_EQ(metric(operator_client.metrics(), "distlock_revokes_total", "result=\"revoked\""), 1.0);
  // The loss is counted right after the stop signal (the signal comes first), on the thread
  // that declared it: wait for it, bounded.
  EXPECT_TRUE(distlock::testing::eventually(
      [&] { return metric(holder_client.metrics(), "distlock_losses_total", "reason=\"revoked\"") == 1.0; },
      5000ms))
      << holder_client.metrics();
  EXPECT_EQ(metric(holder_client.metrics(), "distlock_losses_total", "reason=\"renewal_refused\""), 0.0);

  // A release of the revoked lease reports the loss and touches nothing of the new holder's.
  std::error_code rel;
  held.release(rel);
  EXPECT_EQ(rel, errc::lost);
  EXPECT_TRUE(next->owns());
  const distlock::LockInfo now = operator_client.status(name);
  EXPECT_TRUE(now.held);
  EXPECT_EQ(now.holder.value_or("").rfind(waiter_client.id(), 0), 0u);
  next->release();
}

// One holder at a time holds with revoke as without it: the server hands the lock on only
// once the revoked holder can no longer count itself the holder. The waiter's acquire
// returns after the holder's stop token fired (both seen on this process's steady clock:
// the stop callback's time-stamp is taken before the waiter's grant is checked against it).
TEST_P(Revoke, NextHolderIsGrantedOnlyAfterTheRevokedHolderWasTold) {
  distlock::Client holder_client = client();
  distlock::Client waiter_client = client();
  distlock::Client ops = client();
  const std::string name = "revoke/overlap";
  distlock::Lease held = holder_client.acquire(name, lock_opts());
  ASSERT_TRUE(held.owns());
  std::mutex mu;
  std::optional<Steady::time_point> told;
  std::stop_callback on_stop(held.stop_token(), [&] {
    std::lock_guard lk(mu);
    told = Steady::now();
  });
  std::optional<distlock::Lease> next;
  std::optional<Steady::time_point> granted;
  bool holder_told_at_grant = false;
  std::exception_ptr waiter_error;
  std::thread waiter([&] {
    try {
      distlock::Lease l = waiter_client.acquire(name, lock_opts(20000ms));
      const bool stopped = held.stop_token().stop_requested();
      std::lock_guard lk(mu);
      granted = Steady::now();
      holder_told_at_grant = stopped && told.has_value();
      next.emplace(std::move(l));
    } catch (...) {
      waiter_error = std::current_exception();
    }
  });
  EXPECT_TRUE(waiter_counted(ops, name));
  std::error_code ec;
  const distlock::RevokeResult r = ops.revoke(name, "overlap check", ec);
  if (!revocable(ops.scheme())) {
    EXPECT_EQ(ec, errc::not_supported) << ec.message();
    held.release();
    waiter.join();
    ASSERT_FALSE(waiter_error);
    return;
  }
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(r.revoked);
  waiter.join();
  ASSERT_FALSE(waiter_error);
  ASSERT_TRUE(next && next->owns());
  std::lock_guard lk(mu);
  ASSERT_TRUE(granted);
  EXPECT_TRUE(holder_told_at_grant)
      << "the waiter was granted while the revoked holder still held a valid lease (its stop token "
      << (told ? "fired " + std::to_string(std::chrono::duration_cast<Millis>(*told - *granted).count()) +
                     " ms after the grant"
               : std::string("had not fired"))
      << ")";
  EXPECT_EQ(held.loss_reason(), distlock::LossReason::revoked) << held.loss_detail();
  next->release();
}

TEST_P(Revoke, EachRevokeReachesTheLeaseItRevokedAndNoOther) {
  distlock::Client a = client();
  distlock::Client ops = client();
  const std::string name = "revoke/again";
  distlock::Lease first = a.acquire(name, lock_opts());
  std::error_code ec;
  const distlock::RevokeResult revoked = ops.revoke(name, "first", ec);
  if (!revocable(ops.scheme())) {
    EXPECT_EQ(ec, errc::not_supported) << ec.message();
    return;
  }
  ASSERT_FALSE(ec) << ec.message();
  // The lease was taken before the revoke was called (by another client, possibly through
  // another server of an ensemble): the revoke must find it held.
  ASSERT_TRUE(revoked.revoked) << "the revoke of a held lock was a no-op";
  ASSERT_TRUE(distlock::testing::eventually([&] { return first.stop_token().stop_requested(); },
                                            kRenewInterval + kNoticeSlack + 5000ms));
  EXPECT_EQ(first.revoke_reason().value_or("(none)"), "first");
  // The same client takes the name again: the note of the first revoke (its token and owner)
  // is still there, and must not end the new lease, nor be read as the second revoke's.
  distlock::Lease second = a.acquire(name, lock_opts(10000ms));
  ASSERT_TRUE(second.owns());
  if (second.has_token()) {
    EXPECT_GT(second.token(), first.token());
  }
  const Steady::time_point until = Steady::now() + 2 * kRenewInterval;
  while (Steady::now() < until) {
    ASSERT_TRUE(second.owns()) << second.loss_detail();
    std::this_thread::sleep_for(50ms);
  }
  const distlock::RevokeResult r = ops.revoke(name, "second");
  ASSERT_TRUE(r.revoked);
  if (second.has_token()) {
    EXPECT_EQ(r.token.value_or(0), second.token());
  }
  ASSERT_TRUE(distlock::testing::eventually([&] { return second.stop_token().stop_requested(); },
                                            kRenewInterval + kNoticeSlack + 5000ms));
  EXPECT_EQ(second.loss_reason(), distlock::LossReason::revoked) << second.loss_detail();
  EXPECT_EQ(second.revoke_reason().value_or("(none)"), "second");
  EXPECT_EQ(first.revoke_reason().value_or("(none)"), "first");
  EXPECT_EQ(ops.last_revoke(name).value_or(distlock::RevokeRecord{}).reason, "second");
}

// A holder frozen (SIGSTOP) while it is revoked: it cannot be told, so only the server's lease
// stands between it and the next holder. The waiter is not granted before half a TTL after the
// freeze (the holder's last renewal, due every TTL/3, was sent at most a renewal interval and a
// round trip before it, so its lease and its local deadline run at least that long; the bound the
// SIGKILLed holder of tests/conformance/conformance_test.cpp uses), and within TTL + 3 s; with a
// larger token. Resumed, the holder's first word is the loss, it no longer owns, and its release
// finds the lease lost without touching the new holder's lock.
TEST_P(Revoke, FrozenHolderRevokedIsNotOverlappedAndSeesTheLossOnResume) {
  distlock::testing::TempDir dir("distlock-revoke-frozen");
  const std::string out = (dir.path() / "holder").string();
  const std::string name = "revoke/frozen";
  distlock::testing::Process holder =
      distlock::testing::spawn_holder(target_->url(), name, out, kTtl.count());
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "acquired", 30s)) << distlock::testing::read_file(out);
  const long long old_token = distlock::testing::acquired_token(out);
  holder.signal(SIGSTOP);
  const Steady::time_point stopped = Steady::now();
  distlock::Client ops = client();
  std::error_code ec;
  const distlock::RevokeResult r = ops.revoke(name, "frozen holder", ec);
  if (!revocable(ops.scheme())) {
    EXPECT_EQ(ec, errc::not_supported) << ec.message();
    holder.signal(SIGCONT);
    holder.signal(SIGTERM);
    EXPECT_EQ(holder.exit_code(10s), 0) << distlock::testing::read_file(out);
    return;
  }
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(r.revoked);
  if (old_token >= 0) {
    EXPECT_EQ(static_cast<long long>(r.token.value_or(0)), old_token);
  }
  distlock::Client waiter_client = client();
  distlock::Lease next = waiter_client.acquire(name, lock_opts(20000ms));
  const auto took = std::chrono::duration_cast<Millis>(Steady::now() - stopped);
  std::printf(
      "%s: frozen holder revoked; the waiter granted %lld ms after the freeze (bounds %lld..%lld ms)\n",
      GetParam().label.c_str(), static_cast<long long>(took.count()),
      static_cast<long long>((kTtl / 2).count()), static_cast<long long>((kTtl + 3000ms).count()));
  EXPECT_GE(took, kTtl / 2) << "the waiter was granted while the frozen holder's lease could still run";
  EXPECT_LT(took, kTtl + 3000ms) << "the revoked, frozen holder's lease outlived its TTL";
  if (old_token >= 0 && next.has_token()) {
    EXPECT_GT(static_cast<long long>(next.token()), old_token);
  }
  holder.signal(SIGCONT);
  ASSERT_TRUE(distlock::testing::wait_for_line(out, "lost", 10s)) << distlock::testing::read_file(out);
  holder.signal(SIGUSR1);
  ASSERT_TRUE(distlock::testing::wait_for_text(out, "owns 0", 10s)) << distlock::testing::read_file(out);
  const std::vector<std::string> lines = tool_lines(out);
  ASSERT_GE(lines.size(), 3u) << distlock::testing::read_file(out);
  EXPECT_EQ(lines[0].rfind("acquired", 0), 0u);
  EXPECT_EQ(lines[1], "lost") << "the resumed holder's first word must be the loss";
  EXPECT_EQ(lines[2], "owns 0");
  holder.signal(SIGTERM);
  EXPECT_EQ(holder.exit_code(10s), 76) << "its release must find the lease lost";
  EXPECT_TRUE(next.owns()) << "the revoked holder's release touched the new holder's lock";
  const distlock::LockInfo now = ops.status(name);
  EXPECT_TRUE(now.held);
  EXPECT_EQ(now.holder.value_or("").rfind(waiter_client.id(), 0), 0u) << now.holder.value_or("(none)");
  next.release();
}

INSTANTIATE_TEST_SUITE_P(Backends, Revoke, ::testing::ValuesIn(distlock::testing::kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });

}  // namespace
}  // namespace distlock::testing
