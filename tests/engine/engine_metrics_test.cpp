// Client::metrics() against the memory backend and a manual clock: exact counts per
// result and reason, histogram buckets placed by fake time, the prefix label rule
// and its cap, each loss counted once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "support/memory_fixture.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

/// Every sample of an exposition text: "name{labels}" → value. Fails the test on a
/// line that is neither a comment nor `key value`, or on a key seen twice.
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) continue;
    const auto sp = line.rfind(' ');
    if (sp == std::string::npos || line.empty() || line[0] == '#') {
      ADD_FAILURE() << "not a sample line: " << line;
      continue;
    }
    const std::string key = line.substr(0, sp);
    EXPECT_TRUE(out.emplace(key, std::stod(line.substr(sp + 1))).second) << "duplicate sample " << key;
  }
  return out;
}

/// The value of `name{backend="memory",prefix="P",<extra>}`, or nullopt.
std::optional<double> value(const std::string& text, const std::string& name, const std::string& prefix,
                            const std::string& extra = "") {
  const auto all = samples(text);
  std::string key = name + "{backend=\"memory\"";
  if (!prefix.empty()) key += ",prefix=\"" + prefix + "\"";
  if (!extra.empty()) key += "," + extra;
  key += "}";
  const auto it = all.find(key);
  if (it == all.end()) return std::nullopt;
  return it->second;
}

double acquisitions(const Client& c, const std::string& prefix, const std::string& result) {
  return value(c.metrics(), "distlock_acquisitions_total", prefix, "result=\"" + result + "\"").value_or(-1);
}
double losses(const Client& c, const std::string& prefix, const std::string& reason) {
  return value(c.metrics(), "distlock_losses_total", prefix, "reason=\"" + reason + "\"").value_or(-1);
}
double releases(const Client& c, const std::string& prefix, const std::string& result) {
  return value(c.metrics(), "distlock_releases_total", prefix, "result=\"" + result + "\"").value_or(-1);
}
double renewals(const Client& c, const std::string& prefix, const std::string& result) {
  return value(c.metrics(), "distlock_renewals_total", prefix, "result=\"" + result + "\"").value_or(-1);
}
double bucket(const Client& c, const std::string& hist, const std::string& prefix, const std::string& le) {
  return value(c.metrics(), hist + "_bucket", prefix, "le=\"" + le + "\"").value_or(-1);
}

using Metrics = ManualMemoryTest;

// Issue 27, item 10: a notification channel found dead (Redis: a subscriber connection
// that answered no PING) is counted in the exposition, from the backend's own count.
TEST_F(Metrics, NotificationChannelDropsAreExportedFromTheBackendsCount) {
  auto c = client();
  const std::string key = "distlock_notification_channel_drops_total{backend=\"memory\"}";
  auto all = samples(c.metrics());
  ASSERT_TRUE(all.count(key)) << c.metrics();
  EXPECT_EQ(all.at(key), 0.0);
  store->set_notification_channel_drops(3);
  all = samples(c.metrics());
  EXPECT_EQ(all.at(key), 3.0);
  EXPECT_NE(c.metrics().find("# TYPE distlock_notification_channel_drops_total counter"), std::string::npos);
}

TEST_F(Metrics, AcquisitionsAreCountedByResultUnderTheirPrefix) {
  Client a = client();
  Client b = client();
  Lease held = a.acquire("orders/1", ttl(3s));
  EXPECT_FALSE(b.try_acquire("orders/1", ttl(3s)).has_value());   // busy
  EXPECT_TRUE(b.try_acquire("orders:2/x", ttl(3s)).has_value());  // ok (released at once), same prefix
  // timeout: a bounded wait on the fake clock, moved by this thread.
  std::atomic<bool> done{false};
  std::error_code timeout_ec;
  std::thread waiter([&] {
    auto o = ttl(3s);
    o.wait = 200ms;
    Lease l = b.acquire("orders/1", o, timeout_ec);
    done = true;
  });
  for (int i = 0; i < 20000 && !done; ++i) {
    clock->advance(1ms);
    std::this_thread::sleep_for(100us);
  }
  waiter.join();
  ASSERT_TRUE(done);
  EXPECT_EQ(timeout_ec, errc::timeout);
  store->fail_next(1);  // the server is unreachable for one call
  std::error_code ec;
  Lease failed = b.acquire("orders/3", ttl(3s), ec);
  EXPECT_EQ(ec, errc::backend_unavailable);
  EXPECT_THROW(b.acquire("", ttl(3s)), std::system_error);  // invalid name: counted under "other"

  EXPECT_EQ(acquisitions(a, "orders", "ok"), 1);
  EXPECT_EQ(acquisitions(a, "orders", "busy"), 0);
  EXPECT_EQ(acquisitions(b, "orders", "ok"), 1);
  EXPECT_EQ(acquisitions(b, "orders", "busy"), 1);
  EXPECT_EQ(acquisitions(b, "orders", "timeout"), 1);
  EXPECT_EQ(acquisitions(b, "orders", "error"), 1);
  EXPECT_EQ(acquisitions(b, "other", "error"), 1);
  EXPECT_EQ(value(a.metrics(), "distlock_leases_held", ""), 1);
  EXPECT_EQ(value(b.metrics(), "distlock_leases_held", ""), 0) << "the try_acquire'd lease was dropped";
}

TEST_F(Metrics, AWaitOf300FakeMillisecondsLandsInTheHalfSecondBucket) {
  Client a = client();
  Client b = client();
  Lease held = a.acquire("jobs/nightly", ttl(3s));
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    Lease l = b.acquire("jobs/nightly", ttl(3s));  // waits as long as it takes
    got = l.owns();
  });
  // b has made its first attempt (a's acquisition was call 1) before the clock moves.
  for (int i = 0; i < 5000 && store->try_acquire_calls() < 2; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_GE(store->try_acquire_calls(), 2);
  clock->advance(300ms);
  held.release();
  waiter.join();
  ASSERT_TRUE(got);
  const std::string h = "distlock_acquire_wait_seconds";
  EXPECT_EQ(bucket(b, h, "jobs", "0.1"), 0);
  EXPECT_EQ(bucket(b, h, "jobs", "0.25"), 0);
  EXPECT_EQ(bucket(b, h, "jobs", "0.5"), 1);
  EXPECT_EQ(bucket(b, h, "jobs", "+Inf"), 1);
  EXPECT_EQ(value(b.metrics(), h + "_sum", "jobs"), 0.3);
  EXPECT_EQ(value(b.metrics(), h + "_count", "jobs"), 1);
  // a did not wait: 0 s is in the first bucket.
  EXPECT_EQ(bucket(a, h, "jobs", "0.001"), 1);
  EXPECT_EQ(value(a.metrics(), h + "_sum", "jobs"), 0);
}

TEST_F(Metrics, HoldTimeIsCountedAtReleaseInItsBucket) {
  Client c = client();
  Lease l = c.acquire("report", ttl(3s));
  clock->advance(1500ms);
  l.release();
  const std::string h = "distlock_hold_seconds";
  EXPECT_EQ(bucket(c, h, "report", "1"), 0);
  EXPECT_EQ(bucket(c, h, "report", "5"), 1);
  EXPECT_EQ(value(c.metrics(), h + "_sum", "report"), 1.5);
  EXPECT_EQ(value(c.metrics(), h + "_count", "report"), 1);
  EXPECT_EQ(releases(c, "report", "ok"), 1);
  EXPECT_EQ(releases(c, "report", "lost"), 0);
}

TEST_F(Metrics, ARenewalRefusedByTheServerIsOneLossWithItsReasonAndOneHold) {
  Client c = client();
  Lease l = c.acquire("steal/me", ttl(3s));
  clock->advance(1s);
  distlock::detail::engine_of(c)->tick();  // renewed
  EXPECT_EQ(renewals(c, "steal", "ok"), 1);
  store->steal("steal/me", "intruder:1");
  clock->advance(1s);
  distlock::detail::engine_of(c)->tick();  // refused: lost
  EXPECT_TRUE(l.stop_token().stop_requested());
  EXPECT_EQ(renewals(c, "steal", "not_owner"), 1);
  EXPECT_EQ(losses(c, "steal", "renewal_refused"), 1);
  clock->advance(5s);
  distlock::detail::engine_of(c)->tick();  // nothing more to count: the lease is already lost
  std::error_code ec;
  l.release(ec);
  EXPECT_EQ(ec, errc::lost);
  EXPECT_EQ(losses(c, "steal", "renewal_refused"), 1) << "a loss is counted once";
  EXPECT_EQ(losses(c, "steal", "local_deadline"), 0);
  EXPECT_EQ(releases(c, "steal", "lost"), 1);
  EXPECT_EQ(releases(c, "steal", "ok"), 0);
  // The hold ended at the loss (2 s), not at the release (7 s).
  EXPECT_EQ(value(c.metrics(), "distlock_hold_seconds_sum", "steal"), 2);
  EXPECT_EQ(value(c.metrics(), "distlock_hold_seconds_count", "steal"), 1);
  // Two renewal requests, each answered at once on the fake clock.
  EXPECT_EQ(value(c.metrics(), "distlock_renewal_round_trip_seconds_count", ""), 2);
  EXPECT_EQ(value(c.metrics(), "distlock_renewal_round_trip_seconds_bucket", "", "le=\"0.0001\""), 2);
}

TEST_F(Metrics, EveryLossReasonTheEngineTellsApartIsCountedOnce) {
  Client c = client();
  // local deadline: no renewal before it.
  Lease deadline = c.acquire("a/1", ttl(1s));
  clock->advance(950ms);
  distlock::detail::engine_of(c)->tick();
  EXPECT_EQ(losses(c, "a", "local_deadline"), 1);
  // failed renewals: counted as failed, and then the deadline.
  Lease flaky = c.acquire("b/1", ttl(1s));
  store->fail_next(1000);
  for (int i = 0; i < 40 && flaky.owns(); ++i) {
    clock->advance(100ms);
    distlock::detail::engine_of(c)->tick();
  }
  store->fail_next(0);
  EXPECT_GE(renewals(c, "b", "failed"), 1);
  EXPECT_EQ(losses(c, "b", "local_deadline"), 1);
  // deleted on the server behind the holder's back, found at release.
  Lease dropped = c.acquire("c/1", ttl(3s));
  store->drop("c/1");
  std::error_code ec;
  dropped.release(ec);
  EXPECT_EQ(ec, errc::lost);
  EXPECT_EQ(losses(c, "c", "gone_at_release"), 1);
  EXPECT_EQ(releases(c, "c", "lost"), 1);
  // one lease ended by the server.
  Lease ended = c.acquire("d/1", ttl(3s));
  distlock::detail::engine_of(c)->on_lease_lost("d/1", store->holder("d/1"));
  EXPECT_TRUE(ended.stop_token().stop_requested());
  EXPECT_EQ(losses(c, "d", "lease_ended"), 1);
  // the session: every lease, each once.
  Lease s1 = c.acquire("e/1", ttl(3s));
  Lease s2 = c.acquire("e/2", ttl(3s));
  distlock::detail::engine_of(c)->on_session_lost();
  distlock::detail::engine_of(c)->on_session_lost();
  EXPECT_EQ(losses(c, "e", "session_lost"), 2);
  EXPECT_EQ(losses(c, "d", "session_lost"), 0) << "already lost leases are not lost again";
  EXPECT_EQ(c.stats().lost, 6u);
  double total = 0;
  for (const auto& [k, v] : samples(c.metrics())) {
    if (k.starts_with("distlock_losses_total{")) total += v;
  }
  EXPECT_EQ(total, 6) << "every loss the engine signalled, counted once";
}

/// A backend whose renewals succeed but take `delay` of the test's clock: the reply
/// comes after the lease's local deadline when the delay is long enough.
class SlowRenewBackend final : public detail::Backend {
 public:
  SlowRenewBackend(std::shared_ptr<ManualClock> clock, Clock::duration delay)
      : clock_(std::move(clock)), delay_(delay) {}
  detail::Capabilities capabilities() const noexcept override { return {}; }
  void set_listener(detail::ChangeListener*) override {}
  detail::AcquireResult try_acquire(const detail::AcquireRequest&, distlock::detail::Error& ec) override {
    ec.clear();
    return {true, ++token_, Millis(0), std::nullopt};
  }
  void renew(std::span<const detail::RenewItem> items, std::span<detail::RenewStatus> out,
             distlock::detail::Error& ec) override {
    ec.clear();
    clock_->advance(delay_);
    for (std::size_t i = 0; i < items.size(); ++i) out[i] = detail::RenewStatus::renewed;
  }
  detail::ReleaseStatus release(std::string_view, std::string_view, std::uint64_t,
                                distlock::detail::Error& ec) override {
    ec.clear();
    return detail::ReleaseStatus::released;
  }
  void watch(std::string_view, distlock::detail::Error& ec) override { ec.clear(); }
  void unwatch(std::string_view) noexcept override {}
  LockInfo status(std::string_view, distlock::detail::Error& ec) override {
    ec.clear();
    return {};
  }
  std::string url() const override { return "memory://slow-renew"; }

 private:
  std::shared_ptr<ManualClock> clock_;
  Clock::duration delay_;
  std::uint64_t token_ = 0;
};

TEST_F(Metrics, ARenewalAnsweredAfterTheLocalDeadlineIsALateLossAndItsRoundTripIsTimed) {
  Client c = connect_with_engine(
      detail::Engine::create(std::make_unique<SlowRenewBackend>(clock, 600ms), options()));
  Lease l = c.acquire("slow/1", ttl(1s));  // local deadline 900 ms, renewal due at 333 ms
  clock->advance(400ms);
  distlock::detail::engine_of(c)->tick();  // sent at 400 ms, answered "renewed" at 1000 ms: past the deadline
  EXPECT_TRUE(l.stop_token().stop_requested());
  EXPECT_EQ(renewals(c, "slow", "ok"), 1) << "the server did renew";
  EXPECT_EQ(losses(c, "slow", "renewal_late"), 1);
  EXPECT_EQ(losses(c, "slow", "local_deadline"), 0);
  EXPECT_EQ(value(c.metrics(), "distlock_renewal_round_trip_seconds_bucket", "", "le=\"0.5\""), 0);
  EXPECT_EQ(value(c.metrics(), "distlock_renewal_round_trip_seconds_bucket", "", "le=\"1\""), 1);
  EXPECT_EQ(value(c.metrics(), "distlock_renewal_round_trip_seconds_sum", ""), 0.6);
  // The hold ended at the loss: 1 s after the grant.
  EXPECT_EQ(value(c.metrics(), "distlock_hold_seconds_sum", "slow"), 1);
}

TEST_F(Metrics, PrefixLabelsFollowTheRuleAndAreCappedPerClient) {
  EXPECT_EQ(detail::Metrics::prefix_label("orders/42"), "orders");
  EXPECT_EQ(detail::Metrics::prefix_label("user:7:cart"), "user");
  EXPECT_EQ(detail::Metrics::prefix_label("/jobs/nightly"), "jobs");
  EXPECT_EQ(detail::Metrics::prefix_label("::a"), "a");
  EXPECT_EQ(detail::Metrics::prefix_label("nightly-report"), "nightly-report");
  // The locks of a semaphore or read-write lock count under the primitive's name.
  EXPECT_EQ(detail::Metrics::prefix_label("pool\x1fsem\x1f"
                                          "3"),
            "pool");
  EXPECT_EQ(detail::Metrics::prefix_label("cfg\x1frw\x1fw"), "cfg");
  EXPECT_EQ(detail::Metrics::prefix_label("//"), "other");
  EXPECT_EQ(detail::Metrics::prefix_label("a b/c"), "other");
  EXPECT_EQ(detail::Metrics::prefix_label("caf\xc3\xa9/1"), "other");
  EXPECT_EQ(detail::Metrics::prefix_label("q\"uote/1"), "other");
  EXPECT_EQ(detail::Metrics::prefix_label(std::string(64, 'x') + "/1"), std::string(64, 'x'));
  EXPECT_EQ(detail::Metrics::prefix_label(std::string(65, 'x') + "/1"), "other");

  Client c = client();
  for (int i = 0; i < 40; ++i) {
    Lease l = c.acquire("p" + std::to_string(i) + "/x", ttl(3s));
  }
  std::set<std::string> prefixes;
  for (const auto& [k, v] : samples(c.metrics())) {
    const auto p = k.find("prefix=\"");
    if (p == std::string::npos) continue;
    prefixes.insert(k.substr(p + 8, k.find('"', p + 8) - (p + 8)));
  }
  EXPECT_EQ(prefixes.size(), detail::Metrics::kMaxPrefixes + 1) << "32 prefixes and \"other\"";
  EXPECT_TRUE(prefixes.count("p0"));
  EXPECT_TRUE(prefixes.count("p31"));
  EXPECT_FALSE(prefixes.count("p32"));
  EXPECT_EQ(acquisitions(c, "p0", "ok"), 1);
  EXPECT_EQ(acquisitions(c, "other", "ok"), 8) << "p32..p39";
  EXPECT_EQ(releases(c, "other", "ok"), 8);
}

TEST_F(Metrics, ReentryIsNotAnAcquisitionAndTheFormatIsWellFormed) {
  Client c = client();
  Mutex m = c.mutex("cron/cleanup", ttl(3s));
  m.lock();
  m.lock();
  m.unlock();
  EXPECT_EQ(releases(c, "cron", "ok"), 0) << "an inner unlock is not a release";
  m.unlock();
  EXPECT_EQ(acquisitions(c, "cron", "ok"), 1);
  EXPECT_EQ(releases(c, "cron", "ok"), 1);
  EXPECT_EQ(value(c.metrics(), "distlock_hold_seconds_count", "cron"), 1);

  const std::string text = c.metrics();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  // Each family is announced once, with HELP then TYPE, before its samples.
  std::set<std::string> types;
  std::istringstream in(text);
  std::string family;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("# TYPE ")) {
      std::istringstream f(line.substr(7));
      std::string type;
      f >> family >> type;
      EXPECT_TRUE(types.insert(family).second) << family;
      EXPECT_TRUE(type == "counter" || type == "histogram" || type == "gauge") << line;
    } else if (!line.starts_with("# HELP ")) {
      EXPECT_TRUE(line.starts_with(family)) << line << " outside its family " << family;
    }
  }
  // Nine families (distlock_revokes_total too) and distlock_notification_channel_drops_total.
  EXPECT_EQ(types.size(), 10u);
}

TEST_F(Metrics, OffMeansAnEmptyText) {
  ClientOptions o = options();
  o.metrics = false;
  Client c = connect("memory://" + store_name, o);
  Lease l = c.acquire("x/1", ttl(3s));
  EXPECT_EQ(c.metrics(), "");
}

}  // namespace
}  // namespace distlock::testing
