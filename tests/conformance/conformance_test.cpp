// The lock contract, once, for every backend the build has: the same scenarios,
// written against the public API only, run against real servers that each test
// starts itself (one redis-server, three Redlock masters, etcd single member and a
// 3-member cluster, ZooKeeper standalone and a 3-server ensemble, a file:// dir).
//
// What is specific to one backend (URL options, its fault modes, its wire layout)
// stays in that backend's own tests; what every lock must do is here.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/backend_leftovers.hpp"
#include "support/backend_targets.hpp"
#include "support/client_options.hpp"
#include "support/cs_log.hpp"
#include "support/eventually.hpp"
#include "support/fault_proxy.hpp"
#include "support/lease_waiter.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace distlock::testing {
namespace {

constexpr Millis kTtl = 2000ms;

distlock::LockOptions opts(std::optional<Millis> wait = std::nullopt) {
  return distlock::testing::ttl_of(kTtl, wait);
}

// A lock_tool process holding `name` on the target (TTL kTtl), its output in a file in a
// directory of its own.
struct ToolHolder {
  ToolHolder(const std::string& url, const std::string& name)
      : out((dir.path() / "holder").string()), process(spawn_holder(url, name, out, kTtl.count())) {}
  /// Whether it said "acquired" within 30 s.
  bool acquired() const { return wait_for_text(out, "acquired", 30s); }
  /// The token it printed with "acquired" (-1: none, a backend without fencing tokens).
  long long token() const { return acquired_token(out); }

  TempDir dir{"distlock-conf-holder"};
  std::string out;
  Process process;
};

class Conformance : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override { target_ = GetParam().make({}); }
  distlock::Client client() { return distlock::connect(target_->url(), quiet()); }
  // Every client is gone when this is called; sessions and subscriptions close with them.
  void expect_nothing_left() {
    expect_no_leftovers([&] { return target_->leftovers(); }, 5000ms);
  }
  // The lock records and queue entries on the server now (leftovers() without the
  // subscriptions and session leases, which come and go with clients, not with locks).
  std::vector<std::string> records() {
    std::vector<std::string> out;
    for (auto& l : target_->leftovers()) {
      // Connections and sessions come and go with clients; records are what they leave.
      if (l.find("channel ") == std::string::npos && l.rfind("leases:", 0) != 0 &&
          l.rfind("session ", 0) != 0) {
        out.push_back(std::move(l));
      }
    }
    return out;
  }
  std::unique_ptr<Target> target_;
};

TEST_P(Conformance, ManyLockersOnOneNameExcludeAndTokensFollowAcquisitionOrder) {
  TempDir dir("distlock-conf-hammer");
  const std::string log = (dir.path() / "cs.log").string();
  const std::string counter = (dir.path() / "counter").string();
  // 16 threads in each of 4 processes: 64 contenders on one name.
  constexpr int kProcesses = 4, kThreads = 16, kIters = 5;
  std::vector<Process> hammers;
  for (int p = 0; p < kProcesses; ++p) {
    hammers.push_back(Process::spawn(
        {distlock::testing::lock_tool_path(), "hammer", "--url", target_->url(), "--name", "hammer", "--log",
         log, "--threads", std::to_string(kThreads), "--iters", std::to_string(kIters), "--ttl",
         std::to_string(kTtl.count()), "--hold-us", "100", "--counter", counter},
        (dir.path() / ("out" + std::to_string(p))).string()));
  }
  for (auto& h : hammers) EXPECT_EQ(h.exit_code(240s), 0) << "a hammer process failed or hung";
  const auto sections = distlock::testing::read_sections(log);
  ASSERT_EQ(sections.size(), static_cast<std::size_t>(kProcesses * kThreads * kIters));
  EXPECT_TRUE(distlock::testing::no_overlap(sections));
  if (target_->fencing()) {
    EXPECT_TRUE(distlock::testing::tokens_increase(sections));
  }
  EXPECT_EQ(distlock::testing::read_counter(counter), kProcesses * kThreads * kIters)
      << "read-modify-writes under the lock lost increments";
  if (target_->dense_tokens()) {
    // Every acquisition issues the next token, in acquisition order: 1, 2, ..., N.
    for (std::size_t i = 0; i < sections.size(); ++i) EXPECT_EQ(sections[i].token, i + 1) << "section " << i;
  }
  std::set<long> pids;
  for (const auto& s : sections) {
    EXPECT_TRUE(s.owned_at_end) << "a section ended without owning its lock";
    pids.insert(s.pid);
  }
  EXPECT_EQ(pids.size(), static_cast<std::size_t>(kProcesses)) << "every process took the lock";
  expect_nothing_left();
}

// The leftovers check below every scenario must be able to fail: while a lock is
// held and a waiter queued, the server shows them.
TEST_P(Conformance, TheLeftoverCheckSeesAHeldLock) {
  auto a = client();
  auto lease = a.acquire("seen", opts());
  if (target_->expires()) {
    EXPECT_FALSE(target_->leftovers().empty()) << "a held lock is invisible to the leftover check";
  }
  lease.release();
}

TEST_P(Conformance, TryLockIsBusyWhileHeldAndStatusSaysHeld) {
  {
    auto a = client();
    auto b = client();
    auto lease = a.acquire("busy", opts());
    const auto held_records = records();
    for (int i = 0; i < 3; ++i) EXPECT_FALSE(b.try_acquire("busy", opts()).has_value());
    std::error_code ec;
    b.acquire("busy", opts(0ms), ec);
    EXPECT_EQ(ec, errc::busy);
    EXPECT_TRUE(b.status("busy").held);
    distlock::Mutex m = b.mutex("busy", opts());
    EXPECT_FALSE(m.try_lock());
    EXPECT_EQ(records(), held_records) << "a busy try left a record or queue entry on the server";
    // A timed wait that runs out: it returns at its deadline, not much later (2 s of
    // slack for a loaded 2-core machine: only the order of magnitude is asserted), and
    // takes whatever it queued away with it.
    const auto t0 = Steady::now();
    EXPECT_FALSE(m.try_lock_for(400ms));
    const auto took = std::chrono::duration_cast<Millis>(Steady::now() - t0);
    EXPECT_GE(took, 400ms);
    EXPECT_LT(took, 2000ms) << "try_lock_for(400ms) took " << took.count() << " ms";
    b.acquire("busy", opts(150ms), ec);
    EXPECT_EQ(ec, errc::timeout);
    std::vector<std::string> now;
    EXPECT_TRUE(eventually(
        [&] {
          now = records();
          return now == held_records;
        },
        5000ms))
        << "a timed-out wait left a queue entry (" << now.size() << " records, " << held_records.size()
        << " while only held)";
    EXPECT_TRUE(lease.owns());
    lease.release();
    EXPECT_TRUE(eventually([&] { return !b.status("busy").held; }, 2000ms));
  }
  expect_nothing_left();
}

// Names are opaque bytes: each of these is its own lock, none shares a queue or a
// record with another (escaping and key layouts differ per backend; the contract not).
TEST_P(Conformance, OddNamesAreDistinctLocks) {
  const std::vector<std::string> names{"a/b",
                                       "a%2Fb",
                                       "a",
                                       "a b",
                                       "cr\r\nlf",
                                       "{braces}",
                                       "}{",
                                       "..",
                                       "tab\tand\x01\xff",
                                       std::string(4096, 'n')};
  {
    auto a = client();
    auto b = client();
    std::vector<distlock::Lease> held;
    for (const auto& name : names) {
      SCOPED_TRACE(name.substr(0, 20));
      auto lease = a.try_acquire(name, opts());
      ASSERT_TRUE(lease.has_value()) << "a name was taken by another name's lock";
      held.push_back(std::move(*lease));
      EXPECT_FALSE(b.try_acquire(name, opts()).has_value());
      EXPECT_TRUE(b.status(name).held);
    }
    for (auto& l : held) l.release();
    for (const auto& name : names) EXPECT_TRUE(b.try_acquire(name, opts()).has_value());
  }
  expect_nothing_left();
}

TEST_P(Conformance, RelockAfterUnlockOnOneClientGivesIncreasingTokens) {
  {
    auto c = client();
    std::uint64_t last = 0;
    for (int i = 0; i < 10; ++i) {
      auto lease = c.acquire("relock", opts(5000ms));
      ASSERT_TRUE(lease.owns());
      if (target_->fencing()) {
        EXPECT_GT(lease.token(), last);
        last = lease.token();
      } else {
        EXPECT_FALSE(lease.has_token());
      }
    }
  }
  expect_nothing_left();
}

// Issue 27, item 4: a lease the client declares lost while it lives (here: its max_hold
// ran out although every renewal would succeed) is handed back to the server at once, so
// the name is free for another client and for the same client, on every backend.
// Without the hand-back the name stayed held until the server's record expired (5 s
// after the grant, 4.5 s after the loss) or, on file:// and the session backends
// (etcd, ZooKeeper, PostgreSQL), until the client was destroyed. The bound, 2 s from
// the stop token to the waiter's grant on this process's clock, covers the hand-back's
// round trip and the release notification on a loaded machine; it is well under the
// 4.5 s the server's expiry would take.
TEST_P(Conformance, ALeaseLostWhileItsClientLivesIsFreedAtOnceForOthersAndItself) {
  distlock::LockOptions bounded;
  // 5 s, or the longest the target allows (zk://: twice its 2 s session timeout).
  bounded.ttl = Millis(std::min<std::int64_t>(5000, target_->max_ttl_ms()));
  bounded.max_hold = 500ms;
  auto wait_for_stop = [](const distlock::Lease& l) {
    return eventually([&] { return l.stop_token().stop_requested(); }, 10000ms);
  };
  {
    auto a = client();
    auto b = client();
    // Another client waits, and gets the name soon after the loss.
    distlock::Lease first = a.acquire("handback", bounded);
    LeaseWaiter next(b, "handback", opts(20000ms));
    ASSERT_TRUE(wait_for_stop(first)) << "max_hold 500 ms never fired";
    const auto lost_at = Steady::now();
    EXPECT_EQ(first.loss_reason(), distlock::LossReason::max_hold);
    next.join();
    ASSERT_FALSE(next.ec) << next.ec.message();
    const auto took = std::chrono::duration_cast<Millis>(next.granted_at - lost_at);
    RecordProperty("other_client_after_loss_ms", static_cast<int>(took.count()));
    EXPECT_LT(took, 2000ms) << "another client waited " << took.count() << " ms after the loss";
    if (target_->fencing()) {
      EXPECT_GT(next.lease.token(), first.token());
    }
    // The old holder's release says lost and leaves the new holder's lock alone.
    std::error_code rel;
    first.release(rel);
    EXPECT_EQ(rel, errc::lost);
    EXPECT_TRUE(next.lease.owns());
    EXPECT_TRUE(b.status("handback").held);
    next.lease.release();

    // The same client, another thread, while the lost lease is not yet released.
    distlock::Lease mine = a.acquire("handback", bounded);
    ASSERT_TRUE(wait_for_stop(mine));
    const auto lost_again = Steady::now();
    distlock::Lease again;
    std::error_code ec;
    std::thread same_client([&] { again = a.acquire("handback", opts(20000ms), ec); });
    same_client.join();
    ASSERT_FALSE(ec) << ec.message();
    const auto took_again = std::chrono::duration_cast<Millis>(Steady::now() - lost_again);
    RecordProperty("same_client_after_loss_ms", static_cast<int>(took_again.count()));
    EXPECT_LT(took_again, 2000ms) << "the holder's own client waited " << took_again.count() << " ms";
    EXPECT_TRUE(again.owns());
    if (target_->fencing()) {
      EXPECT_GT(again.token(), mine.token());
    }
  }
  expect_nothing_left();
}

// etcd's "waits on current holder" case: a waiter behind a waiter that gives up
// must keep waiting for the holder, not take the lock when the quitter leaves.
TEST_P(Conformance, WaiterWhosePredecessorGivesUpStillWaitsForTheHolder) {
  {
    auto holder = client();
    auto quitter = client();
    auto patient = client();
    auto lease = holder.acquire("queue", opts());
    std::atomic<bool> quitter_done{false};
    std::thread q([&] {
      std::error_code ec;
      quitter.acquire("queue", opts(600ms), ec);
      EXPECT_EQ(ec, errc::timeout);
      quitter_done = true;
    });
    std::this_thread::sleep_for(100ms);  // let the quitter queue first (ordering, not timing, is asserted)
    std::atomic<bool> got{false};
    std::atomic<bool> holder_released{false};
    Steady::time_point got_at{};
    std::thread p([&] {
      auto l = patient.acquire("queue", opts(60000ms));
      got_at = Steady::now();
      EXPECT_TRUE(holder_released.load()) << "the patient waiter got the lock while the holder held it";
      got = l.owns();
    });
    q.join();
    ASSERT_TRUE(quitter_done);
    // The quitter has left; for a while the holder still holds it and the patient
    // waiter must still be waiting.
    const auto until = Steady::now() + 500ms;
    while (Steady::now() < until) {
      ASSERT_FALSE(got.load());
      std::this_thread::sleep_for(20ms);
    }
    ASSERT_TRUE(lease.owns());
    holder_released = true;
    const auto released_at = Steady::now();
    lease.release();
    p.join();
    EXPECT_TRUE(got);
    // Handed to the patient waiter, not first to the quitter's left-over place (which
    // would hold it until the quitter's TTL ran out: redis+sentinel:// did, before
    // its give-up reached the server).
    EXPECT_LT(std::chrono::duration_cast<Millis>(got_at - released_at), kTtl * 3 / 4)
        << "the lock went to the waiter that gave up";
  }
  expect_nothing_left();
}

TEST_P(Conformance, ReentrantPerThreadAndAnotherThreadIsAnotherOwner) {
  {
    auto c = client();
    auto other = client();
    distlock::Mutex m = c.mutex("reentrant", opts());
    m.lock();
    const std::uint64_t token = target_->fencing() ? m.token() : 0;
    m.lock();  // re-entry: no second acquisition on the server
    EXPECT_EQ(m.hold_count(), 2);
    if (target_->fencing()) {
      EXPECT_EQ(m.token(), token) << "re-entry issued a new token";
    }
    std::thread t(
        [&] { EXPECT_FALSE(m.try_lock()) << "another thread of the same client is another owner"; });
    t.join();
    m.unlock();
    EXPECT_FALSE(other.try_acquire("reentrant", opts()).has_value()) << "released after one of two unlocks";
    EXPECT_TRUE(c.status("reentrant").held);
    m.unlock();
    EXPECT_EQ(m.hold_count(), 0);
    EXPECT_FALSE(c.status("reentrant").held) << "the last unlock returned before the lock was released";
    try {
      m.unlock();
      ADD_FAILURE() << "a third unlock of a lock locked twice succeeded";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), errc::not_owner);
    }
    EXPECT_TRUE(eventually([&] { return other.try_acquire("reentrant", opts()).has_value(); }, 2000ms));
  }
  expect_nothing_left();
}

// Refused calls change nothing: a release by a non-owner (another client, another
// thread of the holder's client, or of a lock nobody holds) is not_owner; names and
// TTLs the contract refuses are invalid_argument naming the problem, before anything
// reaches the server. The holder's lock and its records stay as they were.
TEST_P(Conformance, ReleaseByANonOwnerAndBadNamesOrTtlsAreRefusedAndChangeNothing) {
  {
    auto a = client();
    auto b = client();
    distlock::Mutex unheld = a.mutex("mine", opts());
    std::error_code unheld_ec;
    unheld.unlock(unheld_ec);
    EXPECT_EQ(unheld_ec, errc::not_owner);
    auto lease = a.acquire("mine", opts());
    const auto before = b.status("mine");
    const auto held_records = records();
    distlock::Mutex m = b.mutex("mine", opts());
    try {
      m.unlock();
      ADD_FAILURE() << "unlock by a non-owner succeeded";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), errc::not_owner);
    }
    std::thread t([&] {  // another thread of the holder's own client
      distlock::Mutex same = a.mutex("mine", opts());
      std::error_code ec;
      same.unlock(ec);
      EXPECT_EQ(ec, errc::not_owner);
      try {
        same.unlock();
        ADD_FAILURE() << "unlock by a thread that does not hold the lock succeeded";
      } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), errc::not_owner);
      }
    });
    t.join();
    auto refused = [&](const std::string& name, Millis ttl, const std::string& part) {
      SCOPED_TRACE(part);
      distlock::LockOptions o = opts();
      o.ttl = ttl;
      std::error_code ec;
      b.acquire(name, o, ec);
      EXPECT_EQ(ec, errc::invalid_argument);
      try {
        b.acquire(name, o);
        ADD_FAILURE() << "accepted";
      } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      }
    };
    refused("", kTtl, "empty");
    refused(std::string("nul\0inside", 10), kTtl, "NUL");
    refused(std::string(4097, 'x'), kTtl, "4096");
    refused("mine", 0ms, "ttl");
    refused("mine", Millis(-5), "ttl");
    refused("mine", distlock::LockOptions::min_ttl - 1ms, "ttl");
    EXPECT_TRUE(lease.owns());
    EXPECT_EQ(records(), held_records) << "a refused call changed the holder's records on the server";
    EXPECT_FALSE(b.try_acquire("mine", opts()).has_value());
    const auto after = b.status("mine");
    EXPECT_TRUE(after.held);
    EXPECT_EQ(after.token, before.token);
    EXPECT_EQ(after.holder, before.holder);
  }
  expect_nothing_left();
}

// A waiter queued before the holder is SIGKILLed gets the lock once the dead holder's
// lease is gone: within TTL + 1 s, and not before the lease could have run out.
TEST_P(Conformance, KilledHolderFreesTheLockWithinTtlPlusOneSecond) {
  ToolHolder holder(target_->url(), "killed");
  ASSERT_TRUE(holder.acquired()) << read_file(holder.out);
  const long long holder_token = holder.token();
  {
    auto c = client();
    ASSERT_FALSE(c.try_acquire("killed", opts()).has_value());
    EXPECT_TRUE(c.status("killed").held);
    LeaseWaiter waiter(c, "killed", opts(30000ms));
    // Let it queue: where the backend counts waiters, until it counts this one.
    std::this_thread::sleep_for(300ms);
    EXPECT_TRUE(eventually([&] { return c.status("killed").waiters.value_or(1) >= 1; }, 10000ms))
        << "the waiter was not counted within 10 s";
    EXPECT_FALSE(waiter.done.load()) << "the waiter got the lock while its holder was alive";
    const auto killed = Steady::now();
    holder.process.signal(SIGKILL);
    waiter.join();
    holder.process.exit_code(10s);
    ASSERT_FALSE(waiter.ec) << waiter.ec.message();
    const auto took = std::chrono::duration_cast<Millis>(waiter.granted_at - killed);
    RecordProperty("freed_after_kill_ms", static_cast<int>(took.count()));
    if (target_->expires()) {
      // The dead holder's last renewal (or its session's last heartbeat) was at most
      // a third of the TTL before the kill; the server then frees it by the TTL. One
      // second of slack covers expiry granularity and the hand-off; a loaded machine
      // adds to the measured time, never to the server's TTL, so this bound is the
      // contract. The lower bound: the lease did not end before it could have run out.
      EXPECT_LT(took, kTtl + 1000ms);
      EXPECT_GE(took, kTtl / 2) << "the lock was handed over before the dead holder's lease could expire";
    } else {
      // Host-local kernel locks: dropped when the dead holder's descriptors close.
      EXPECT_LT(took, 1000ms) << "the waiter took " << took.count() << " ms after SIGKILL";
    }
    EXPECT_TRUE(waiter.lease.owns());
    if (target_->fencing()) {
      EXPECT_GT(static_cast<long long>(waiter.lease.token()), holder_token);
    }
    if (target_->dense_tokens()) {
      EXPECT_EQ(static_cast<long long>(waiter.lease.token()), holder_token + 1);
    }
  }
  expect_nothing_left();
}

// The only waiter's process is gone (SIGKILL) while it waits with a TTL of 30 s (or
// the longest the target allows); the holder releases at once: the lock is free
// within 3 s of the release (on this process's steady clock), whatever the dead
// waiter's TTL (docs/design.md "A dead waiter"), or within the floor a backend
// documents (etcd: the dead waiter's session lease). A queue place held by a dead
// process is not the dead process's lease.
TEST_P(Conformance, AReleaseFreesTheLockWithin3sWhenTheOnlyWaiterIsDead) {
  TempDir dir("distlock-conf-deadwaiter");
  const std::string out = (dir.path() / "waiter").string();
  std::int64_t waiter_ttl = std::min<std::int64_t>(30000, target_->max_ttl_ms());
  // A backend whose floor grows with the dead waiter's TTL is measured with 5 s.
  if (target_->dead_waiter_bound_ms(waiter_ttl) > 3000) waiter_ttl = 5000;
  const Millis bound(target_->dead_waiter_bound_ms(waiter_ttl));
  auto holder = client();
  auto lease = holder.acquire("orphan", opts());
  Process waiter =
      distlock::testing::spawn_holder(target_->url(), "orphan", out, waiter_ttl, 0, {"--wait", "60000"});
  // Let it queue: where the backend counts waiters, until it counts this one.
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(eventually([&] { return holder.status("orphan").waiters.value_or(1) >= 1; }, 10000ms))
      << distlock::testing::read_file(out);
  waiter.signal(SIGKILL);
  ASSERT_EQ(waiter.exit_code(10s), 128 + SIGKILL) << distlock::testing::read_file(out);
  const auto released_at = Steady::now();
  lease.release();
  auto other = client();
  std::optional<distlock::Lease> got;
  // Polled past the bound (up to 10 s more), so the stall is measured, not only bounded.
  while (!got && Steady::now() - released_at < bound + 10000ms) {
    got = other.try_acquire("orphan", opts());
    if (!got) std::this_thread::sleep_for(20ms);
  }
  const auto took = std::chrono::duration_cast<Millis>(Steady::now() - released_at);
  RecordProperty("free_after_release_ms", static_cast<int>(took.count()));
  std::printf("%s: free %lld ms after the release (dead waiter's ttl %lld ms, bound %lld ms)\n",
              GetParam().label.c_str(), static_cast<long long>(took.count()),
              static_cast<long long>(waiter_ttl), static_cast<long long>(bound.count()));
  ASSERT_TRUE(got.has_value()) << "the lock was not free " << (bound + 10000ms).count()
                               << " ms after the release; its only waiter was dead";
  EXPECT_LE(took, bound) << "the dead waiter held the line";
  EXPECT_EQ(distlock::testing::read_file(out).find("acquired"), std::string::npos);
}

// A holder SIGSTOPped past its TTL: the next holder gets the lock within TTL + 2 s; on
// resume the stopped holder's first word is the loss (stop token, callback), owns()
// is false, and its release finds the lease lost without touching the new holder's
// lock or records. Host-local locks have no TTL: the stopped holder keeps its lock.
TEST_P(Conformance, PausedHolderSeesItsLossOnResumeAndItsTokenIsStale) {
  ToolHolder holder(target_->url(), "paused");
  ASSERT_TRUE(holder.acquired()) << read_file(holder.out);
  const long long old_token = holder.token();
  holder.process.signal(SIGSTOP);
  const auto stopped = Steady::now();
  {
    auto c = client();
    if (!target_->expires()) {
      std::error_code ec;
      c.acquire("paused", opts(kTtl + 500ms), ec);  // past the stopped holder's TTL
      EXPECT_EQ(ec, errc::timeout);
      const auto info = c.status("paused");
      EXPECT_TRUE(info.held);
      ASSERT_TRUE(info.holder.has_value());
      EXPECT_NE(info.holder->find("(pid " + std::to_string(holder.process.pid()) + ")"), std::string::npos)
          << *info.holder;
      holder.process.signal(SIGCONT);
      holder.process.signal(SIGUSR1);
      EXPECT_TRUE(distlock::testing::wait_for_text(holder.out, "owns 1", 10s))
          << distlock::testing::read_file(holder.out);
      holder.process.signal(SIGTERM);
      EXPECT_EQ(holder.process.exit_code(10s), 0);
      EXPECT_TRUE(distlock::testing::wait_for_text(holder.out, "released", 10s))
          << distlock::testing::read_file(holder.out);
      EXPECT_EQ(distlock::testing::read_file(holder.out).find("lost"), std::string::npos);
      auto next = c.acquire("paused", opts(10000ms));
      if (target_->dense_tokens()) {
        EXPECT_EQ(static_cast<long long>(next.token()), old_token + 1);
      }
    } else {
      auto lease = c.acquire("paused", opts(30000ms));  // after the paused holder's TTL ran out
      const auto took = std::chrono::duration_cast<Millis>(Steady::now() - stopped);
      EXPECT_LT(took, kTtl + 2000ms) << "the paused holder's lease outlived its TTL";
      if (target_->fencing()) {
        EXPECT_GT(static_cast<long long>(lease.token()), old_token);
      }
      const auto mine = c.status("paused");
      const auto new_records = records();
      holder.process.signal(SIGCONT);
      ASSERT_TRUE(distlock::testing::wait_for_line(holder.out, "lost", 10s))
          << distlock::testing::read_file(holder.out);
      // owns() reads the local deadline, which passed while it was stopped.
      holder.process.signal(SIGUSR1);
      ASSERT_TRUE(distlock::testing::wait_for_text(holder.out, "owns 0", 10s))
          << distlock::testing::read_file(holder.out);
      // Its first word after resuming was the loss; it never claimed to own the lock.
      const auto lines = tool_lines(holder.out);
      ASSERT_GE(lines.size(), 3u) << distlock::testing::read_file(holder.out);
      EXPECT_EQ(lines[0].rfind("acquired", 0), 0u);
      EXPECT_EQ(lines[1], "lost");
      EXPECT_EQ(lines[2], "owns 0");
      EXPECT_TRUE(lease.owns());
      holder.process.signal(SIGTERM);
      EXPECT_EQ(holder.process.exit_code(10s), 76) << "its release must find the lease lost";
      EXPECT_TRUE(lease.owns()) << "the old holder's release touched the new holder's lock";
      const auto after = c.status("paused");
      EXPECT_TRUE(after.held);
      EXPECT_EQ(after.holder, mine.holder);
      EXPECT_EQ(after.token, mine.token);
      EXPECT_EQ(records(), new_records) << "the old holder's release changed the records on the server";
    }
  }
  expect_nothing_left();
}

// ---- network faults, through a proxy between one client and its servers ----------

using NetworkFaults = Conformance;

TEST_P(NetworkFaults, HolderPartitionedPastItsTtlStopsBeforeTheNextHolderStarts) {
  distlock::testing::FaultProxyGroup net(target_->ports());
  {
    auto cut = distlock::connect(target_->url_via(net.hosts()), quiet());
    auto other = client();
    auto lease = cut.acquire("partitioned", opts());
    std::atomic<std::int64_t> lost_at{0};
    // Stamped by the loss signal itself (a stop_callback runs on the detecting thread);
    // on_lost callbacks run later, on the client's event thread.
    std::stop_callback on_stop(lease.stop_token(),
                               [&] { lost_at = Steady::now().time_since_epoch().count(); });
    net.freeze_all();  // sockets stay open: every renewal hangs
    auto next = other.acquire("partitioned", opts(30000ms));
    const auto next_at = Steady::now().time_since_epoch().count();
    // The partitioned holder gave up (stop token, callback) before the server could
    // let the next holder in: its local deadline is ahead of the server's expiry by
    // the safety margin, whatever the load (both times are read in this process).
    ASSERT_NE(lost_at.load(), 0) << "the next holder got the lock before the partitioned one was told";
    EXPECT_LT(lost_at.load(), next_at);
    EXPECT_TRUE(lease.stop_token().stop_requested());
    EXPECT_FALSE(lease.owns());
    if (target_->fencing()) {
      EXPECT_GT(next.token(), lease.token());
    }
    net.pass_all();
    std::error_code ec;
    lease.release(ec);
    EXPECT_EQ(ec, errc::lost);
    EXPECT_TRUE(next.owns()) << "the partitioned holder's release touched the next holder's lock";
    EXPECT_TRUE(other.status("partitioned").held);
  }
  expect_nothing_left();
}

TEST_P(NetworkFaults, WaiterWhoseConnectionDiesGetsAnErrorNeverTheLock) {
  distlock::testing::FaultProxyGroup net(target_->ports());
  {
    auto holder = client();
    auto lease = holder.acquire("cutwaiter", opts());
    auto waiter = distlock::connect(target_->url_via(net.hosts()), quiet());
    std::error_code ec;
    std::atomic<bool> done{false};
    bool got = false;
    std::thread t([&] {
      auto l = waiter.acquire("cutwaiter", opts(8000ms), ec);
      got = l.owns();
      done = true;
    });
    std::this_thread::sleep_for(300ms);  // let it queue; the assertion does not depend on it
    net.drop_all();                      // its connections die and cannot come back
    std::this_thread::sleep_for(200ms);
    lease.release();  // the lock is free now, but the waiter cannot reach it
    t.join();
    EXPECT_FALSE(got) << "a waiter without a connection reported the lock as acquired";
    EXPECT_TRUE(ec == errc::backend_unavailable || ec == errc::quorum_unavailable || ec == errc::timeout ||
                ec == errc::lost)
        << ec.message();
    net.pass_all();
    // Whatever it queued is gone (its session/lease ends): another client gets it.
    auto third = client();
    auto l3 = third.acquire("cutwaiter", opts(10000ms));
    EXPECT_TRUE(l3.owns());
  }
  expect_nothing_left();
}

// The servers become unreachable under a connected client. The error of the next
// acquire names where the client tried (the URL's host:port) and why it failed (more
// than the error code's own words), on every backend: a user reading only e.what()
// knows which server to look at.
TEST_P(NetworkFaults, AnUnreachableServerGivesAnErrorNamingItAndTheCause) {
  distlock::testing::FaultProxyGroup net(target_->ports());
  {
    auto c = distlock::connect(target_->url_via(net.hosts()), quiet());
    c.acquire("gone", opts()).release();  // the path through the proxies works
    net.drop_all();                       // every connection dies, none can be made
    std::string what;
    std::error_code code;
    try {
      auto lease = c.acquire("gone", opts(2000ms));
      ADD_FAILURE() << "acquired with every server unreachable";
    } catch (const std::system_error& e) {
      what = e.what();
      code = e.code();
    }
    std::printf("%s: %s\n", GetParam().label.c_str(), what.c_str());
    ASSERT_FALSE(what.empty());
    bool names_server = false;
    for (std::size_t i = 0; i < net.size(); ++i) {
      names_server = names_server || what.find(":" + std::to_string(net.at(i).port())) != std::string::npos;
    }
    EXPECT_TRUE(names_server) << "the error does not name the server it tried (" << net.hosts()
                              << "): " << what;
    const std::string generic = "lock \"gone\": " + code.message();
    EXPECT_GT(what.size(), generic.size() + 12) << "the error gives no cause beyond its code: " << what;
    // So does a status query.
    try {
      (void)c.status("gone");
      ADD_FAILURE() << "status answered with every server unreachable";
    } catch (const std::system_error& e) {
      what = e.what();
      std::printf("%s status: %s\n", GetParam().label.c_str(), what.c_str());
      bool named = false;
      for (std::size_t i = 0; i < net.size(); ++i) {
        named = named || what.find(":" + std::to_string(net.at(i).port())) != std::string::npos;
      }
      EXPECT_TRUE(named) << "the status error does not name the server it tried (" << net.hosts()
                         << "): " << what;
    }
    net.pass_all();
  }
  expect_nothing_left();
}

INSTANTIATE_TEST_SUITE_P(Backends, NetworkFaults, ::testing::ValuesIn(distlock::testing::networked_kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(distlock::testing::kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });

}  // namespace
}  // namespace distlock::testing
