// Election and with_lock on the engine, against the in-process memory backend and a
// manual clock: one leader at a time, terms strictly increasing, proclaim refused to
// non-leaders, observers woken by notification (backend calls counted while the
// clock moves), a leader whose lease ended never reported.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "fake/memory_backend.hpp"
#include "support/call_in_thread.hpp"
#include "support/eventually.hpp"
#include "support/forwarding_backend.hpp"
#include "support/manual_clock.hpp"
#include "support/thrown.hpp"

using namespace std::chrono_literals;
using distlock::detail::MemoryStore;

namespace distlock::testing {
namespace {

int g_store_seq = 0;

// Forwards every call to a memory backend and counts the reads an observer makes.
class CountingBackend final : public distlock::testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::atomic<int> status_calls{0}, record_reads{0};

  distlock::LockInfo status(std::string_view n, distlock::detail::Error& ec) override {
    ++status_calls;
    return ForwardingBackend::status(n, ec);
  }
  std::optional<std::string> get_record(std::string_view k, distlock::detail::Error& ec) override {
    ++record_reads;
    return ForwardingBackend::get_record(k, ec);
  }
};

struct Election : ::testing::Test {
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::string store_name = "election-" + std::to_string(++g_store_seq);
  std::shared_ptr<MemoryStore> store = MemoryStore::named(store_name);

  distlock::ClientOptions client_opts() {
    distlock::ClientOptions o;
    o.clock = clock;
    o.background_renewal = false;
    o.logger = [](distlock::LogLevel, std::string_view) {};
    return o;
  }
  distlock::Client client() { return distlock::connect("memory://" + store_name, client_opts()); }
  // A client whose backend calls are counted (`counter` points into it).
  distlock::Client counted_client(CountingBackend*& counter) {
    auto counting =
        std::make_unique<CountingBackend>(distlock::testing::memory_backend(store_name, client_opts()));
    counter = counting.get();
    return distlock::connect_with_engine(
        distlock::detail::Engine::create(std::move(counting), client_opts()));
  }
  static distlock::LockOptions ttl(Millis t, std::optional<Millis> wait = std::nullopt) {
    distlock::LockOptions o;
    o.ttl = t;
    o.wait = wait;
    return o;
  }
};

TEST_F(Election, OneLeaderAtATimeTermsStrictlyIncreaseAndLeaderShowsTheValue) {
  auto a = client();
  auto b = client();
  auto ea = a.election("svc", ttl(10s));
  auto eb = b.election("svc", ttl(10s, 0ms));
  EXPECT_FALSE(ea.leader().has_value());

  distlock::Lease la = ea.campaign("host-a");
  ASSERT_TRUE(la.owns());
  const std::uint64_t t1 = la.token();
  EXPECT_EQ(la.name(), std::string("svc\x1f"
                                   "elect"));
  distlock::detail::Error ec;
  distlock::Lease lb = eb.campaign("host-b", ec);
  EXPECT_EQ(ec, errc::busy) << "a second campaigner must not lead while the first does";
  EXPECT_FALSE(lb.owns());
  {
    std::string what;
    EXPECT_EQ(distlock::testing::code_of([&] { eb.campaign("host-b"); }, &what), errc::busy)
        << "expected errc::busy";
    EXPECT_NE(what.find("election \"svc\""), std::string::npos) << what;
    EXPECT_EQ(what.find('\x1f'), std::string::npos) << "the separator is written \\x1f in messages: " << what;
  }

  auto l = eb.leader();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->term, t1);
  EXPECT_EQ(l->value, "host-a");
  EXPECT_TRUE(l->value_known);
  EXPECT_EQ(l->holder, store->holder(ea.lock_name()));

  ea.proclaim(la, "host-a:v2");
  EXPECT_EQ(eb.leader()->value, "host-a:v2");
  EXPECT_EQ(eb.leader()->term, t1);

  ea.resign(la);
  EXPECT_FALSE(la.owns());
  EXPECT_FALSE(eb.leader().has_value());

  std::uint64_t last = t1;
  for (int i = 0; i < 3; ++i) {
    distlock::Lease next = (i % 2 ? ea : eb).campaign("v" + std::to_string(i));
    EXPECT_GT(next.token(), last) << "terms strictly increase";
    last = next.token();
    EXPECT_EQ(ea.leader()->term, last);
    EXPECT_EQ(ea.leader()->value, "v" + std::to_string(i));
  }
}

TEST_F(Election, ProclaimByANonLeaderOrWithALostLeaseIsRefusedAndWritesNothing) {
  auto a = client();
  auto b = client();
  auto ea = a.election("p", ttl(3s));
  auto eb = b.election("p", ttl(3s));
  distlock::Lease la = ea.campaign("mine");
  const std::uint64_t t1 = la.token();

  auto expect_not_owner = [](const std::function<void()>& f) {
    std::string what;
    EXPECT_EQ(distlock::testing::code_of(f, &what), errc::not_owner) << "expected errc::not_owner: " << what;
  };
  // Another lock's lease, an empty lease: not this election's leadership.
  distlock::Lease other = b.acquire("p", ttl(3s));
  expect_not_owner([&] { eb.proclaim(other, "usurper"); });
  distlock::Lease empty;
  expect_not_owner([&] { eb.proclaim(empty, "usurper"); });
  // Another election's leadership.
  auto eq = b.election("q", ttl(3s));
  distlock::Lease lq = eq.campaign("q-value");
  expect_not_owner([&] { eb.proclaim(lq, "usurper"); });
  EXPECT_EQ(eb.leader()->value, "mine");

  // The leader's lease lost (the server gave the lock to somebody else): refused too.
  store->steal(ea.lock_name(), "intruder");
  a.renew_now();
  ASSERT_FALSE(la.owns());
  expect_not_owner([&] { ea.proclaim(la, "too-late"); });
  distlock::detail::Error ec;
  auto rec = distlock::detail::engine_of(a)->backend().get_record(ea.lock_name(), ec);
  ASSERT_FALSE(ec);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(*rec, distlock::Election::encode_record(t1, "mine")) << "a refused proclaim writes nothing";

  // The intruder holds a newer term and wrote no value: the old value is not shown as its.
  auto l = eb.leader();
  ASSERT_TRUE(l.has_value());
  EXPECT_GT(l->term, t1);
  EXPECT_FALSE(l->value_known);
  EXPECT_EQ(l->value, "");
  EXPECT_EQ(l->holder, "intruder");
}

TEST_F(Election, LeaderWhoseLeaseExpiredIsNotReported) {
  auto a = client();
  auto b = client();
  auto ea = a.election("x", ttl(3s));
  auto eb = b.election("x", ttl(3s));
  distlock::Lease la = ea.campaign("a");
  ASSERT_TRUE(eb.leader().has_value());
  clock->advance(3s + 1ms);  // no renewal: the server's lease has ended
  EXPECT_FALSE(eb.leader().has_value());
  EXPECT_FALSE(eb.observe(std::nullopt, 0ms).has_value()) << "observe must not report an ended lease";
  EXPECT_FALSE(la.owns());
}

TEST_F(Election, ObserversSeeEachLeaderOnceInTermOrderWokenByNotification) {
  CountingBackend* counter = nullptr;
  auto obs_client = counted_client(counter);
  auto a = client();
  auto b = client();
  auto ea = a.election("o", ttl(30s));
  auto eb = b.election("o", ttl(30s));
  auto eo = obs_client.election("o", ttl(30s));

  std::mutex mu;
  std::vector<distlock::Leader> seen;
  std::atomic<bool> done{false}, finished{false};
  std::thread observer([&] {
    std::optional<std::uint64_t> after;
    while (!done) {
      auto l = eo.observe(after, 60s);  // manual-clock wait; the test moves the clock
      if (!l) continue;
      std::lock_guard lk(mu);
      seen.push_back(*l);
      after = l->term;
    }
    finished = true;
  });
  // Ends the observer on every way out of the test (a failed ASSERT too).
  auto stop_observer = [&] {
    done = true;
    for (int i = 0; i < 1000 && !finished; ++i) {  // ends the observer's current 60 s wait
      clock->advance(61s);
      std::this_thread::sleep_for(2ms);
    }
    if (observer.joinable()) observer.join();
  };
  struct Guard {
    std::function<void()> f;
    ~Guard() { f(); }
  } guard{stop_observer};
  auto seen_count = [&] {
    std::lock_guard lk(mu);
    return seen.size();
  };

  distlock::Lease la = ea.campaign("a");
  ASSERT_TRUE(eventually([&] { return seen_count() == 1; }, 10s));

  // While the leader holds, the observer makes no call, though the clock moves (4 s
  // in 40 steps, under the 5 s re-check cap; the leader renews on time). One read is
  // allowed: the observer's next observe() reads once before it parks, and that read
  // may come after reads_before is taken (it did once under ASan); a polling observer
  // would read at every step.
  const int reads_before = counter->status_calls.load();
  for (int i = 0; i < 40; ++i) {
    clock->advance(100ms);
    if (i % 10 == 9) a.renew_now();
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_LE(counter->status_calls.load(), reads_before + 1) << "the observer polled while nothing changed";

  // With the clock frozen from here on, only notifications can wake the observer: the
  // release (then a vacancy) and the next leader's bell.
  ea.resign(la);
  distlock::Lease lb = eb.campaign("b");
  ASSERT_TRUE(eventually([&] { return seen_count() == 2; }, 10s)) << "woken by the release and the bell";
  eb.resign(lb);
  la = ea.campaign("a2");
  ASSERT_TRUE(eventually([&] { return seen_count() == 3; }, 10s));
  const int reads_for_two_changes = counter->status_calls.load() - reads_before;
  EXPECT_LE(reads_for_two_changes, 12) << "a few reads per change, not a polling loop";

  stop_observer();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].value, "a");
  EXPECT_EQ(seen[1].value, "b");
  EXPECT_EQ(seen[2].value, "a2");
  EXPECT_LT(seen[0].term, seen[1].term);
  EXPECT_LT(seen[1].term, seen[2].term);
  for (const auto& l : seen) EXPECT_TRUE(l.value_known);
}

TEST_F(Election, ObserveWaitsForTheNewLeadersValueThenReportsIt) {
  auto a = client();
  auto o = client();
  auto ea = a.election("w", ttl(30s));
  auto eo = o.election("w", ttl(30s));
  distlock::Lease la = ea.campaign("first");
  const std::uint64_t t1 = la.token();
  ea.resign(la);
  // A new holder that has not written its value yet (taken behind the engine's back,
  // so no notification), then its value and the bell, as campaign() does them.
  std::optional<distlock::Leader> got;
  std::thread observer([&] { got = eo.observe(t1, 60s); });
  store->steal(ea.lock_name(), "next");
  const std::uint64_t t2 = o.status(ea.lock_name()).token.value();
  distlock::detail::Error ec;
  distlock::detail::engine_of(a)->backend().put_record(
      ea.lock_name(), distlock::Election::encode_record(t2, "second"), distlock::detail::PutMode::always, ec);
  ASSERT_FALSE(ec);
  { auto bell = a.acquire(ea.bell_name(), ttl(1s)); }
  observer.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->term, t2);
  EXPECT_EQ(got->value, "second");
  EXPECT_TRUE(got->value_known);
}

// LockOptions::cancel ends an election's waits: campaign() (an acquire) and observe()
// alike, with errc::cancelled, within one wake-up of the stop request. The manual clock
// never moves while the observer waits, so only the cancel can end its wait; if it does
// not within 10 s (real time), the clock is moved past the observe's own bound so the
// thread ends, and the test fails.
TEST_F(Election, CancelEndsAnObserversWaitWithErrcCancelled) {
  CountingBackend* counter = nullptr;
  auto o = counted_client(counter);
  std::stop_source stop;
  distlock::LockOptions opts = ttl(30s);
  opts.cancel = stop.get_token();
  auto eo = o.election("w", opts);
  CallInThread observer([&] {
    return distlock::testing::code_of(
        [&] { (void)eo.observe(std::nullopt, 1h); });  // vacant: waits for a leader
  });
  // The observer has read the election (vacant) and waits; bounded at 10 s.
  EXPECT_TRUE(eventually([&] { return counter->status_calls.load() > 0; }, 10s));
  stop.request_stop();
  const bool in_time = observer.returned_within(10s);
  if (!in_time) clock->advance(2h);  // ends the wait by its own bound
  observer.join();
  EXPECT_TRUE(in_time) << "observe() kept waiting after its cancel token was stopped";
  EXPECT_EQ(observer.code(), errc::cancelled);
  // Already stopped: refused at once, as acquire() is.
  {
    std::string what;
    EXPECT_EQ(distlock::testing::code_of([&] { (void)eo.observe(std::nullopt, 0ms); }, &what),
              errc::cancelled)
        << "observe() with a stopped cancel token did not fail";
  }
}

TEST_F(Election, WithoutFencingTokensCampaignWorksButTermsAndObserveAreNotSupported) {
  store->set_fencing(false);
  auto a = client();
  auto b = client();
  auto ea = a.election("nf", ttl(3s));
  auto eb = b.election("nf", ttl(3s, 0ms));
  distlock::Lease la = ea.campaign("a");
  EXPECT_TRUE(la.owns());
  EXPECT_FALSE(la.has_token());
  distlock::detail::Error ec;
  auto lb = eb.campaign("b", ec);
  EXPECT_EQ(ec, errc::busy);
  auto l = eb.leader();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->term, 0u);
  EXPECT_FALSE(l->value_known);
  {
    std::string what;
    EXPECT_EQ(distlock::testing::code_of([&] { eb.observe(std::nullopt, 0ms); }, &what), errc::not_supported)
        << "observe without terms must be refused: " << what;
  }
}

TEST_F(Election, RecordsRoundTrip) {
  EXPECT_EQ(distlock::Election::encode_record(42, "a\nb"), "42\na\nb");
  auto d = distlock::Election::decode_record("42\na\nb");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->first, 42u);
  EXPECT_EQ(d->second, "a\nb");
  EXPECT_FALSE(distlock::Election::decode_record("x\nv").has_value());
  EXPECT_FALSE(distlock::Election::decode_record("42").has_value());
  EXPECT_FALSE(distlock::Election::decode_record("\nv").has_value());
}

using WithLock = Election;

TEST_F(WithLock, ReturnsTheResultAndReleases) {
  auto c = client();
  std::uint64_t seen_token = 0;
  int r = distlock::with_lock(c, "job", ttl(3s), [&](std::uint64_t token, std::stop_token stop) {
    EXPECT_FALSE(stop.stop_requested());
    EXPECT_TRUE(store->held("job", clock->now()));
    seen_token = token;
    return 7;
  });
  EXPECT_EQ(r, 7);
  EXPECT_GT(seen_token, 0u);
  EXPECT_FALSE(store->held("job", clock->now()));
  distlock::with_lock(c, "job", ttl(3s), [&](std::stop_token) {});
  EXPECT_FALSE(store->held("job", clock->now()));
}

TEST_F(WithLock, ReleasesWhenFnThrowsAndPassesTheExceptionOn) {
  auto c = client();
  EXPECT_THROW(
      distlock::with_lock(c, "job", ttl(3s),
                          [&](std::uint64_t, std::stop_token) -> int { throw std::runtime_error("boom"); }),
      std::runtime_error);
  EXPECT_FALSE(store->held("job", clock->now()));
  EXPECT_EQ(c.stats().released, 1u);
}

TEST_F(WithLock, LossWhileFnRunsIsThrownAsLostAfterFnReturns) {
  auto c = client();
  bool fn_saw_stop = false;
  try {
    distlock::with_lock(c, "job", ttl(3s), [&](std::uint64_t, std::stop_token stop) {
      store->steal("job", "other");
      c.renew_now();  // refused: the lease is lost, its stop token fires
      fn_saw_stop = stop.stop_requested();
      return 1;
    });
    ADD_FAILURE() << "a loss while fn ran must be reported";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::lost) << e.what();
  }
  EXPECT_TRUE(fn_saw_stop);
  EXPECT_EQ(store->holder("job"), "other") << "nothing released on the other holder's behalf";

  // The local deadline passing (no renewal) counts as a loss too.
  {
    std::string what;
    EXPECT_EQ(
        distlock::testing::code_of(
            [&] { distlock::with_lock(c, "job2", ttl(3s), [&](std::stop_token) { clock->advance(3s); }); },
            &what),
        errc::lost)
        << "a lease past its deadline must be reported: " << what;
  }
}

TEST_F(WithLock, BusyLockIsBusyAndFnNeverRuns) {
  auto a = client();
  auto b = client();
  auto held = a.acquire("job", ttl(3s));
  bool ran = false;
  try {
    distlock::with_lock(b, "job", ttl(3s, 0ms), [&](std::stop_token) { ran = true; });
    ADD_FAILURE();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::busy);
  }
  EXPECT_FALSE(ran);
}

TEST_F(WithLock, TokenFormWithoutFencingIsNotSupportedAndFnNeverRuns) {
  store->set_fencing(false);
  auto c = client();
  bool ran = false;
  try {
    distlock::with_lock(c, "job", ttl(3s), [&](std::uint64_t, std::stop_token) { ran = true; });
    ADD_FAILURE();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::not_supported);
  }
  EXPECT_FALSE(ran);
  EXPECT_FALSE(store->held("job", clock->now()));
  int r = distlock::with_lock(c, "job", ttl(3s), [&](std::stop_token) { return 3; });
  EXPECT_EQ(r, 3);
}

}  // namespace

}  // namespace distlock::testing
