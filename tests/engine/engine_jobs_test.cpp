// Engine tests of the hold bounds and holder descriptions (issue 14), on the memory
// backend with a manual clock: max_hold ends a lease at exactly grant + max_hold
// although every renewal succeeds; loss_reason() names each kind of loss; the holder
// description rides in the owner string and comes back from status()/list().
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "fake/memory_backend.hpp"
#include "support/backend_names.hpp"
#include "support/call_in_thread.hpp"
#include "support/forwarding_backend.hpp"
#include "support/manual_clock.hpp"
#include "support/memory_fixture.hpp"
#include "support/thrown.hpp"

namespace distlock::testing {

using namespace std::chrono_literals;
using detail::MemoryStore;

namespace {

struct Jobs : ManualMemoryTest {
  static distlock::LockOptions opts(Millis ttl, std::optional<Millis> max_hold = std::nullopt) {
    distlock::LockOptions o;
    o.ttl = ttl;
    o.max_hold = max_hold;
    return o;
  }

  // Two clients of the store; the first holds "job" (TTL 3 s) through its engine; `once` is
  // one try (wait 0) of the same options.
  struct JobHeld {
    distlock::Client c, other;
    detail::Engine& engine;
    std::shared_ptr<detail::HeldLock> held;
    distlock::LockOptions once;
  };
  JobHeld job_held() {
    auto c = client();
    auto other = client();
    auto& engine = *detail::engine_of(c);
    Error ec;
    auto held = engine.acquire("job", opts(3s), Millis(0), ec);
    EXPECT_TRUE(held && !ec) << ec.message();
    distlock::LockOptions once = opts(3s);
    once.wait = 0ms;
    return {std::move(c), std::move(other), engine, std::move(held), once};
  }
};

TEST_F(Jobs, MaxHoldEndsTheLeaseAtExactlyGrantPlusMaxHoldAlthoughRenewalsSucceed) {
  auto c = client();
  // ttl 3 s: renew every 1 s, margin 300 ms. max_hold 4.5 s.
  distlock::Lease lease = c.acquire("job", opts(3s, 4500ms));
  const auto granted = clock->now();
  ASSERT_TRUE(lease.owns());
  EXPECT_EQ(lease.max_hold_remaining(), 4500ms);
  EXPECT_FALSE(c.acquire("other", opts(3s)).max_hold_remaining().has_value());
  const auto renewals_before = c.stats().renewed_leases;
  const int releases_before = store->release_calls();  // "other" above was released
  // Walk in 100 ms steps, ticking the renewer each time: every renewal succeeds.
  while (clock->now() - granted < 4500ms - 100ms) {
    clock->advance(100ms);
    detail::engine_of(c)->tick();
    ASSERT_TRUE(lease.owns()) << "lost early at +"
                              << std::chrono::duration_cast<Millis>(clock->now() - granted).count() << "ms";
    ASSERT_EQ(lease.loss_reason(), LossReason::none);
  }
  EXPECT_GE(c.stats().renewed_leases - renewals_before, 3u);  // renewed at ~1 s, 2 s, 3 s
  EXPECT_EQ(lease.remaining(), 100ms);                        // the deadline is the hold limit
  clock->advance(99ms);
  detail::engine_of(c)->tick();
  EXPECT_TRUE(lease.owns());
  clock->advance(1ms);  // grant + 4500 ms
  EXPECT_FALSE(lease.owns());
  EXPECT_EQ(lease.loss_reason(), LossReason::max_hold);  // before the watchdog runs, too
  detail::engine_of(c)->tick();
  EXPECT_TRUE(lease.stop_token().stop_requested());
  EXPECT_EQ(lease.loss_reason(), LossReason::max_hold);
  EXPECT_NE(lease.loss_detail().find("max_hold 4500ms"), std::string::npos) << lease.loss_detail();
  EXPECT_EQ(c.stats().lost, 1u);
  // The lost lease is handed back to the backend (Backend::forget, on the event thread)
  // without waiting for the server's record to end by its TTL (+6 s here): once the
  // event thread has run, the store no longer has it, and another client takes it now.
  detail::engine_of(c)->drain_events();
  EXPECT_FALSE(store->held("job", clock->now()));
  EXPECT_EQ(store->release_calls(), releases_before + 1);
  auto other = client();
  auto taken = other.try_acquire("job", opts(3s));
  ASSERT_TRUE(taken.has_value());
  EXPECT_GT(taken->token(), lease.token());
  // The holder's own release then says lost and touches nothing: no second server call.
  Error ec;
  lease.release(ec);
  EXPECT_EQ(ec, errc::lost);
  EXPECT_EQ(store->release_calls(), releases_before + 1);
  EXPECT_TRUE(store->held("job", clock->now()));
}

// The hand-back is done by release() itself when the caller gets there first: the
// caller may take the name again right after release() says lost, also on the same
// thread and client (the failing case of issue 27, item 4: the lock stayed with the
// client until it was destroyed).
TEST_F(Jobs, ALostLeaseReleasedAtOnceCanBeTakenAgainByItsOwnThread) {
  store->set_needs_renewal(false);  // like file://: nothing expires on the server
  auto c = client();
  distlock::Lease lease = c.acquire("job", opts(3s, 1s));
  const std::uint64_t token = lease.token();
  clock->advance(1s);
  EXPECT_FALSE(lease.owns());
  detail::engine_of(c)->tick();  // the watchdog's round declares the loss
  Error ec;
  lease.release(ec);  // the hand-back is done (here or on the event thread) when this returns
  EXPECT_EQ(ec, errc::lost);
  EXPECT_FALSE(store->held("job", clock->now()));
  auto again = c.try_acquire("job", opts(3s));
  ASSERT_TRUE(again.has_value());
  EXPECT_GT(again->token(), token);
  detail::engine_of(c)->drain_events();
  EXPECT_EQ(store->release_calls(), 1);  // handed back once, whoever came first
}

// A lease whose server said "not yours" at release has nothing to hand back.
TEST_F(Jobs, ALeaseGoneAtReleaseIsNotHandedBack) {
  auto c = client();
  distlock::Lease lease = c.acquire("job", opts(3s));
  store->steal("job", "someone-else");
  Error ec;
  lease.release(ec);
  EXPECT_EQ(ec, errc::lost);
  detail::engine_of(c)->drain_events();
  EXPECT_EQ(store->release_calls(), 1);  // the release itself, and no forget after it
  EXPECT_EQ(store->holder("job"), "someone-else");
}

// Issue 27, item 9: a Lease asked for by the thread whose Mutex holds the name says so.
TEST_F(Jobs, ALeaseRefusedBecauseThisThreadsMutexHoldsTheNameSaysSo) {
  auto c = client();
  auto m = c.mutex("job", opts(3s));
  m.lock();
  distlock::LockOptions once = opts(3s);
  once.wait = 0ms;
  {
    std::string what;
    EXPECT_EQ(code_of([&] { (void)c.acquire("job", once); }, &what), errc::busy)
        << "a Lease re-entered a Mutex's hold";
    EXPECT_NE(what.find("held by this thread through a Mutex or another Lease"), std::string::npos) << what;
    EXPECT_NE(what.find("only Mutex re-enters"), std::string::npos) << what;
  }
  m.unlock();
  // Held by another client: the plain busy sentence, without the re-entry hint.
  auto holder = client();
  auto lease = holder.acquire("job", opts(3s));
  {
    std::string what;
    EXPECT_EQ(code_of([&] { (void)c.acquire("job", once); }, &what), errc::busy) << "busy lock acquired";
    EXPECT_EQ(what.find("this thread"), std::string::npos) << what;
  }
}

// A lost lease is handed back (Backend::forget) only after its engine-internal loss
// signals (a read-write lease's combined stop token, Engine::add_loss_signal) have been
// given: the hand-back lets another client take the name, and a read-write holder whose
// combined token has not fired yet would then still believe it holds the lock. Here the
// signal itself runs everything the engine queued for its event thread so far, then
// tries the name from another client: it must still be busy.
TEST_F(Jobs, ALostLeaseIsHandedBackOnlyAfterItsInternalLossSignals) {
  auto [c, other, engine, held, once] = job_held();
  ASSERT_TRUE(held);
  Error ec;
  bool signalled = false;
  std::error_code taken_in_signal;
  engine.add_loss_signal(held, [&] {
    signalled = true;
    engine.drain_events();  // the forget round too, had it been queued before this signal
    distlock::Lease l = other.acquire("job", once, taken_in_signal);
  });
  // Past the local deadline (grant + 3 s - 300 ms margin), before the server's expiry (+3 s).
  clock->advance(2800ms);
  engine.tick();  // the watchdog's round declares the loss on this thread
  ASSERT_TRUE(signalled);
  EXPECT_EQ(taken_in_signal, errc::busy) << "the name was handed back before the loss signal was given";
  // The hand-back itself still happens, on the event thread.
  engine.drain_events();
  EXPECT_FALSE(store->held("job", clock->now()));
  auto taken = other.try_acquire("job", opts(3s));
  ASSERT_TRUE(taken.has_value());
  EXPECT_GT(taken->token(), held->token);
  engine.release(held, ec);
  EXPECT_EQ(ec, errc::lost);
}

// The same order when release() does the hand-back: the caller's release() may find the
// lease lost while the detecting thread is still inside the stop token's callbacks (a
// std::stop_callback of the user), before the internal signals. release() then gives
// those signals itself before it frees the name, so no other client can hold the name
// while a read-write lease's combined token is still unfired.
TEST_F(Jobs, AReleaseThatHandsBackALostLeaseGivesItsInternalLossSignalsFirst) {
  auto [c, other, engine, held, once] = job_held();
  ASSERT_TRUE(held);
  std::atomic<bool> signalled{false};
  engine.add_loss_signal(held, [&] { signalled = true; });
  bool released = false, signalled_at_release = false, free_at_release = false;
  Error release_ec;
  // Runs on the detecting thread (tick below), before the internal signals: meanwhile
  // another thread releases the lease.
  std::stop_callback in_detection(held->stop.get_token(), [&] {
    std::thread releaser([&] {
      engine.release(held, release_ec);
      signalled_at_release = signalled.load();
      std::error_code e;
      distlock::Lease l = other.acquire("job", once, e);
      free_at_release = !e;
      released = true;
    });
    releaser.join();  // release() never waits for the detecting thread
  });
  clock->advance(2800ms);
  engine.tick();
  ASSERT_TRUE(released);
  EXPECT_EQ(release_ec, errc::lost);
  EXPECT_TRUE(free_at_release);  // release() handed it back before returning
  EXPECT_TRUE(signalled_at_release) << "the name was free before the internal loss signal was given";
  EXPECT_TRUE(signalled.load());
}

// A server that does not answer the hand-back of a lost lease (the usual cause of a
// loss) must not hold back the client's loss callbacks: the hand-back may wait a whole
// command timeout per lease, and the callbacks are how the holder learns of the loss.
// Here release() blocks (at most 10 s, real time) until the test lets it go; the lease's
// callback must run meanwhile (checked for 5 s).
namespace {
class HungRelease final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void hang() {
    std::lock_guard lk(m_);
    hung_ = true;
  }
  void answer() {
    std::lock_guard lk(m_);
    hung_ = false;
    cv_.notify_all();
  }
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        Error& ec) override {
    {
      std::unique_lock lk(m_);
      cv_.wait_for(lk, 10s, [&] { return !hung_; });
    }
    return ForwardingBackend::release(name, owner, token, ec);
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool hung_ = false;
};
}  // namespace

TEST_F(Jobs, ALossCallbackIsNotHeldBackByAHandBackTheServerDoesNotAnswer) {
  HungRelease* hung = nullptr;
  auto c = client_through<HungRelease>(store_name, options(), &hung);
  distlock::Lease lease = c.acquire("job", opts(3s));
  std::mutex m;
  std::condition_variable cv;
  bool called = false;
  lease.on_lost([&] {
    std::lock_guard lk(m);
    called = true;
    cv.notify_all();
  });
  hung->hang();
  clock->advance(2800ms);  // past the local deadline (grant + 3 s - 300 ms margin)
  detail::engine_of(c)->tick();
  EXPECT_TRUE(lease.stop_token().stop_requested());
  bool in_time = false;
  {
    std::unique_lock lk(m);
    in_time = cv.wait_for(lk, 5s, [&] { return called; });
  }
  hung->answer();
  EXPECT_TRUE(in_time) << "the loss callback waited for the hand-back's unanswered release";
  detail::engine_of(c)->drain_events();
  EXPECT_FALSE(store->held("job", clock->now()));  // handed back once the server answered
}

// LockOptions::cancel ends a wait from another thread with errc::cancelled, and a token
// already stopped fails before any request.
TEST_F(Jobs, CancelEndsAWaitFromAnotherThreadAndLeavesNothingQueued) {
  auto holder = client();
  auto lease = holder.acquire("job", opts(3s));
  auto c = client(/*background=*/true);
  std::stop_source stop;
  distlock::LockOptions o = opts(3s);
  o.cancel = stop.get_token();  // no wait bound: only the cancel ends it
  std::error_code ec;
  std::atomic<bool> returned{false};
  const int tries_before = store->try_acquire_calls();
  const int cancels_before = store->cancel_calls();
  std::thread waiter([&] {
    (void)c.acquire("job", o, ec);
    returned = true;
  });
  // The waiter has made its attempt (busy) before the cancel; bounded at 10 s.
  for (int i = 0; i < 10000 && store->try_acquire_calls() == tries_before; ++i)
    std::this_thread::sleep_for(1ms);
  EXPECT_GT(store->try_acquire_calls(), tries_before);
  EXPECT_FALSE(returned.load());
  stop.request_stop();
  waiter.join();  // the manual clock never moves: only the cancel can end this wait
  EXPECT_EQ(ec, errc::cancelled);
  EXPECT_EQ(ec.default_error_condition(), std::errc::operation_canceled);
  EXPECT_EQ(ec.message(), "the wait was cancelled");
  EXPECT_EQ(store->cancel_calls(), cancels_before + 1);  // its queued place withdrawn
  EXPECT_TRUE(lease.owns());
  // Already stopped: refused before any request reaches the backend.
  const int tries = store->try_acquire_calls();
  std::error_code ec2;
  (void)c.acquire("free-name", o, ec2);
  EXPECT_EQ(ec2, errc::cancelled);
  EXPECT_EQ(store->try_acquire_calls(), tries);
  EXPECT_FALSE(store->held("free-name", clock->now()));
}

// A cancel also ends a wait for another waiter's subscription: a waiter of a name that
// another waiter of this client is subscribing to (a watch the server has not answered
// yet) waits for that subscription before it re-checks, and the cancel must end that
// wait too, not the server's answer. Here the first waiter's watch() blocks (at most
// 10 s, real time) until the test lets it go; the second waiter's cancel must end its
// acquire meanwhile (checked for 5 s).
namespace {
class HungWatch final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::atomic<int> watch_calls{0};
  void answer() {
    std::lock_guard lk(m_);
    hung_ = false;
    cv_.notify_all();
  }
  void watch(std::string_view name, Error& ec) override {
    ++watch_calls;
    {
      std::unique_lock lk(m_);
      cv_.wait_for(lk, 10s, [&] { return !hung_; });
    }
    ForwardingBackend::watch(name, ec);
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool hung_ = true;
};
}  // namespace

TEST_F(Jobs, CancelEndsAWaitForAnotherWaitersSubscription) {
  auto holder = client();
  auto lease = holder.acquire("job", opts(3s));
  HungWatch* hung = nullptr;
  auto c = client_through<HungWatch>(store_name, options(), &hung);
  std::stop_source stop_first, stop_second;
  distlock::LockOptions first = opts(3s), second = opts(3s);
  first.cancel = stop_first.get_token();  // no wait bound: only a cancel ends these waits
  second.cancel = stop_second.get_token();
  std::error_code ec_first;
  std::thread w1([&] { (void)c.acquire("job", first, ec_first); });
  // The first waiter is inside its (unanswered) watch; bounded at 10 s.
  for (int i = 0; i < 10000 && hung->watch_calls.load() == 0; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(hung->watch_calls.load(), 1);
  const int tries_before = store->try_acquire_calls();
  CallInThread w2([&] {
    std::error_code e;
    (void)c.acquire("job", second, e);
    return e;
  });
  // The second waiter has made its attempt (busy); bounded at 10 s.
  for (int i = 0; i < 10000 && store->try_acquire_calls() == tries_before; ++i)
    std::this_thread::sleep_for(1ms);
  stop_second.request_stop();
  const bool in_time = w2.returned_within(5s);
  hung->answer();
  stop_first.request_stop();
  w2.join();
  w1.join();
  EXPECT_TRUE(in_time) << "the cancelled waiter waited for another waiter's unanswered watch";
  EXPECT_EQ(w2.code(), errc::cancelled);
  EXPECT_EQ(ec_first, errc::cancelled);
  EXPECT_EQ(hung->watch_calls.load(), 1);  // the second waiter never subscribed itself
  EXPECT_TRUE(lease.owns());
}

TEST_F(Jobs, MaxHoldStopsRenewalsOnceTheDeadlineReachesTheLimit) {
  auto c = client();
  distlock::Lease lease = c.acquire("job", opts(3s, 2s));
  // The first deadline (ttl - margin = 2.7 s) is past the limit: no renewal is due ever.
  EXPECT_EQ(lease.remaining(), 2000ms);
  const int before = store->renew_calls();
  for (int i = 0; i < 19; ++i) {
    clock->advance(100ms);
    detail::engine_of(c)->tick();
  }
  EXPECT_EQ(store->renew_calls(), before);
  EXPECT_EQ(c.renew_now(), 0u);  // renew_all skips it as well
  EXPECT_TRUE(lease.owns());
  clock->advance(100ms);
  detail::engine_of(c)->tick();
  EXPECT_EQ(lease.loss_reason(), LossReason::max_hold);
}

TEST_F(Jobs, MaxHoldFiresTheStopTokenOnABackendWithoutRenewals) {
  store->set_needs_renewal(false);  // like file://: held until released
  auto c = client(/*background=*/true);
  distlock::Lease lease = c.acquire("job", opts(3s, 1s));
  EXPECT_EQ(lease.remaining(), 1000ms);
  clock->advance(1s);
  // The watchdog thread (started for the max_hold) declares it; bounded wait.
  for (int i = 0; i < 5000 && !lease.stop_token().stop_requested(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(lease.stop_token().stop_requested());
  EXPECT_EQ(lease.loss_reason(), LossReason::max_hold);
}

// A reentrant lock() (a second Mutex on the same name, same thread) shares the outer
// hold's lease: its own max_hold must still bound that lease, counted from its lock().
TEST_F(Jobs, MaxHoldOfAReentrantMutexLockBoundsTheSharedHold) {
  auto c = client();
  distlock::Mutex outer = c.mutex("re", opts(3s));
  distlock::Mutex capped = c.mutex("re", opts(3s, 1s));
  outer.lock();
  clock->advance(500ms);
  capped.lock();  // re-entry: no round trip, hold count 2
  ASSERT_EQ(capped.hold_count(), 2);
  const auto locked = clock->now();
  // Every renewal succeeds; walk to just before locked + 1 s: still held.
  while (clock->now() - locked < 900ms) {
    clock->advance(100ms);
    detail::engine_of(c)->tick();
    ASSERT_TRUE(capped.owns());
  }
  clock->advance(100ms);  // locked + 1 s
  detail::engine_of(c)->tick();
  EXPECT_FALSE(capped.owns()) << "held for "
                              << std::chrono::duration_cast<Millis>(clock->now() - locked).count()
                              << " ms under a max_hold of 1000 ms";
  EXPECT_EQ(capped.loss_reason(), LossReason::max_hold);
  EXPECT_TRUE(capped.stop_token().stop_requested());
  capped.unlock();
  outer.unlock();
  // The limit only ever comes earlier: a reentrant lock() with a longer max_hold
  // than the outer hold's keeps the outer one.
  distlock::Mutex short_cap = c.mutex("re2", opts(3s, 1s));
  distlock::Mutex long_cap = c.mutex("re2", opts(3s, 5s));
  short_cap.lock();
  long_cap.lock();
  clock->advance(1s);
  detail::engine_of(c)->tick();
  EXPECT_FALSE(long_cap.owns());
  EXPECT_EQ(long_cap.loss_reason(), LossReason::max_hold);
  long_cap.unlock();
  short_cap.unlock();
}

TEST_F(Jobs, MaxHoldMustBePositive) {
  auto c = client();
  Error ec;
  c.acquire("job", opts(3s, 0ms), ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  {
    std::string what;
    EXPECT_EQ(code_of([&] { c.acquire("job", opts(3s, -5ms)); }, &what), errc::invalid_argument)
        << "accepted a negative max_hold";
    EXPECT_NE(what.find("max_hold"), std::string::npos) << what;
  }
}

TEST_F(Jobs, LossReasonForEachKindOfLoss) {
  auto c = client();
  {  // held: none
    distlock::Lease lease = c.acquire("a", opts(3s));
    EXPECT_EQ(lease.loss_reason(), LossReason::none);
    EXPECT_EQ(lease.loss_detail(), "");
  }
  {  // local deadline: no renewal succeeds
    distlock::Lease lease = c.acquire("a", opts(3s));
    store->fail_next(1000);
    for (int i = 0; i < 30; ++i) {
      clock->advance(100ms);
      detail::engine_of(c)->tick();
    }
    store->fail_next(0);
    EXPECT_EQ(lease.loss_reason(), LossReason::local_deadline);
    EXPECT_NE(lease.loss_detail().find("local deadline"), std::string::npos);
  }
  clock->advance(5s);
  {  // renewal refused: somebody else has it
    distlock::Lease lease = c.acquire("b", opts(3s));
    store->steal("b", "intruder");
    clock->advance(1s);
    detail::engine_of(c)->tick();
    EXPECT_EQ(lease.loss_reason(), LossReason::renewal_refused);
  }
  {  // lease ended / session lost: reported by the backend
    distlock::Lease l1 = c.acquire("c", opts(3s));
    distlock::Lease l2 = c.acquire("d", opts(3s));
    detail::engine_of(c)->on_lease_lost("c", *c.status("c").holder);
    EXPECT_EQ(l1.loss_reason(), LossReason::lease_ended);
    EXPECT_EQ(l2.loss_reason(), LossReason::none);
    detail::engine_of(c)->on_session_lost();
    EXPECT_EQ(l2.loss_reason(), LossReason::session_lost);
    EXPECT_EQ(l1.loss_reason(), LossReason::lease_ended);  // the first reason stays
  }
  {  // gone at release
    distlock::Lease lease = c.acquire("e", opts(3s));
    store->drop("e");
    std::atomic<bool> fired{false};
    lease.on_lost([&] { fired = true; });
    Error ec;
    lease.release(ec);
    EXPECT_EQ(ec, errc::lost);
    detail::engine_of(c)->drain_events();  // callbacks run on the event thread
    EXPECT_TRUE(fired);
    EXPECT_EQ(lease.loss_reason(), LossReason::none);  // released: an empty Lease
    // (gone_at_release itself is checked through a Mutex's hold below)
  }
  EXPECT_STREQ(distlock::to_string(LossReason::max_hold), "max_hold");
  EXPECT_STREQ(distlock::to_string(LossReason::lease_ended), "lease_ended");
}

TEST_F(Jobs, LossReasonLeaseEndedAndGoneAtReleaseThroughAMutex) {
  auto c = client();
  distlock::Mutex m = c.mutex("m", opts(3s));
  m.lock();
  EXPECT_EQ(m.loss_reason(), LossReason::none);
  auto held = detail::engine_of(c)->held_by_this_thread("m");
  ASSERT_NE(held, nullptr);
  detail::engine_of(c)->on_lease_lost("m", held->owner);
  EXPECT_EQ(m.loss_reason(), LossReason::lease_ended);
  EXPECT_NE(m.loss_detail().find("ended its lease"), std::string::npos) << m.loss_detail();
  m.unlock();
  EXPECT_EQ(m.loss_reason(), LossReason::none);  // no hold any more

  store->drop("m");  // the notification above was made up: the server still had it
  ASSERT_TRUE(m.try_lock());
  held = detail::engine_of(c)->held_by_this_thread("m");
  store->drop("m");
  Error ec;
  detail::engine_of(c)->release(held, ec);  // what unlock() does, keeping the handle to look at
  EXPECT_EQ(ec, errc::lost);
  EXPECT_EQ(held->public_reason(), LossReason::gone_at_release);
}

TEST_F(Jobs, HolderInfoRoundTripsThroughStatusAndList) {
  auto c = client();
  auto o = opts(3s);
  o.holder_info = "host=web1 pid=42 cmd=backup --all . x";
  distlock::Lease lease = c.acquire("backup", o);
  const distlock::LockInfo info = c.status("backup");
  ASSERT_TRUE(info.holder_info.has_value());
  EXPECT_EQ(*info.holder_info, o.holder_info);
  ASSERT_TRUE(info.holder.has_value());
  EXPECT_EQ(info.holder->find('|'), std::string::npos);
  EXPECT_EQ(info.holder->substr(0, 32), c.id());
  // The server stores the whole owner; renewals and the release use it as is.
  EXPECT_EQ(store->holder("backup"), *info.holder + "|" + o.holder_info);
  clock->advance(1s);
  EXPECT_EQ(detail::engine_of(c)->tick(), 1u);
  EXPECT_TRUE(lease.owns());
  auto listed = c.list("");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].info.holder_info, o.holder_info);
  EXPECT_EQ(listed[0].info.holder, info.holder);
  lease.release();
  EXPECT_FALSE(store->held("backup", clock->now()));
  // Without a description there is none.
  distlock::Lease plain = c.acquire("plain", opts(3s));
  EXPECT_FALSE(c.status("plain").holder_info.has_value());
}

TEST_F(Jobs, HolderInfoIsCutAt160BytesAndMustBePrintableWithoutBar) {
  auto c = client();
  auto o = opts(3s);
  o.holder_info = std::string(300, 'x');
  distlock::Lease lease = c.acquire("long", o);
  EXPECT_EQ(c.status("long").holder_info, std::string(160, 'x'));
  for (std::string bad :
       {std::string("a|b"), std::string("tab\there"), std::string("nl\n"), std::string("\xc3\xa9")}) {
    auto b = opts(3s);
    b.holder_info = bad;
    {
      std::string what;
      EXPECT_EQ(code_of([&] { c.acquire("bad", b); }, &what), errc::invalid_argument)
          << "accepted holder_info " << bad;
      EXPECT_NE(what.find("holder_info"), std::string::npos) << what;
    }
  }
}

TEST_F(Jobs, ThreadOwnerOfIgnoresTheDescription) {
  using detail::thread_owner_of;
  EXPECT_EQ(thread_owner_of("abc:7.12"), "abc:7");
  // A '.' in the description must not be taken for the acquisition separator.
  EXPECT_EQ(thread_owner_of("abc:7.12|host=a.b.c cmd=x.sh"), "abc:7");
  EXPECT_EQ(thread_owner_of("abc:7.12|"), "abc:7");
  // Reentrancy and per-thread lookups work with a description set.
  auto c = client();
  auto o = opts(3s);
  o.holder_info = "host=h.example pid=1";
  distlock::Mutex m = c.mutex("r", o);
  m.lock();
  m.lock();
  EXPECT_EQ(m.hold_count(), 2);
  EXPECT_TRUE(m.owns());
  auto held = detail::engine_of(c)->held_by_this_thread("r");
  ASSERT_NE(held, nullptr);
  detail::engine_of(c)->on_lease_lost("r", held->owner);  // found by thread owner despite the '.'s
  EXPECT_EQ(m.loss_reason(), LossReason::lease_ended);
  m.unlock();
  m.unlock();
  EXPECT_EQ(m.hold_count(), 0);
}

TEST_F(Jobs, ListDecodesDerivedNames) {
  auto c = client();
  Error ec;
  detail::engine_of(c)->backend().put_record("pool\x1fsem", "5", PutMode::always, ec);
  ASSERT_FALSE(ec);
  distlock::Lease a = c.acquire(
      "pool\x1fsem\x1f"
      "2",
      opts(3s));
  distlock::Lease b = c.acquire("cfg\x1frw\x1fw", opts(3s));
  distlock::Lease d = c.acquire(
      "cfg\x1frw\x1f"
      "7",
      opts(3s));
  distlock::Lease e = c.acquire(
      "lead\x1f"
      "elect",
      opts(3s));
  distlock::Lease f = c.acquire("plain", opts(3s));
  distlock::Lease g = c.acquire("odd\x1fzzz", opts(3s));
  bool truncated = true;
  auto all = c.list("", 100, truncated);
  EXPECT_FALSE(truncated);
  ASSERT_EQ(all.size(), 6u);
  std::map<std::string, distlock::ListedLock> by;
  for (auto& l : all) by[l.name] = l;
  auto& sem =
      by["pool\x1fsem\x1f"
         "2"];
  EXPECT_EQ(sem.kind, distlock::LockKind::semaphore_permit);
  EXPECT_EQ(sem.base, "pool");
  EXPECT_EQ(sem.index, 2u);
  EXPECT_EQ(sem.of, 5u);
  EXPECT_EQ(sem.display, "semaphore permit 2 of 5");
  EXPECT_EQ(by["cfg\x1frw\x1fw"].kind, distlock::LockKind::rw_writer);
  EXPECT_EQ(by["cfg\x1frw\x1f"
               "7"]
                .kind,
            distlock::LockKind::rw_reader);
  EXPECT_EQ(by["cfg\x1frw\x1f"
               "7"]
                .index,
            7u);
  EXPECT_FALSE(by["cfg\x1frw\x1f"
                  "7"]
                   .of.has_value());  // no definition record stored
  EXPECT_EQ(by["lead\x1f"
               "elect"]
                .kind,
            distlock::LockKind::election);
  EXPECT_EQ(by["lead\x1f"
               "elect"]
                .base,
            "lead");
  EXPECT_EQ(by["plain"].kind, distlock::LockKind::lock);
  EXPECT_EQ(by["odd\x1fzzz"].kind, distlock::LockKind::lock);
  EXPECT_EQ(by["odd\x1fzzz"].base, "odd\x1fzzz");
  // Prefix and limit.
  auto some = c.list("cfg", 1, truncated);
  ASSERT_EQ(some.size(), 1u);
  EXPECT_TRUE(truncated);
  EXPECT_EQ(some[0].name,
            "cfg\x1frw\x1f"
            "7");
}

}  // namespace

}  // namespace distlock::testing
