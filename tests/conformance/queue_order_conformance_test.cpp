// The queue, visible (LockInfo::waiter_list, LockOptions::on_queue_position), over every
// backend this build has:
//   - on a backend that queues its waiters (redis, sentinel, rediscluster, etcd, zk): 16 waiters queued
//     one after another behind a holder are listed by status() at positions 1..16 with
//     their holder descriptions, each waiter's progress callback first reports that same
//     position with the one ahead of it, positions reported later only go down, and once
//     the holder releases they acquire in exactly that order;
//   - on a backend that keeps no queue (file, postgres, mysql: waiters race on a
//     notification; Redlock) status() says the list is not kept
//     (waiters_listed false, an empty list) rather than inventing an order.
// Every wait is bounded: enqueueing is observed through status() within 20 s per waiter,
// the whole hand-off within 120 s.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/backend_targets.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"

using namespace std::chrono_literals;
using distlock::Millis;
using distlock::testing::eventually;
using distlock::testing::Kind;
using distlock::testing::Target;

namespace {

using distlock::testing::quiet;

// The backends whose status() lists the queue in hand-off order (docs/design.md
// "Seeing the queue").
bool lists_waiters(const std::string& label) {
  return label == "redis" || label == "sentinel" || label.rfind("rediscluster", 0) == 0 ||
         label.rfind("etcd", 0) == 0 || label.rfind("zk", 0) == 0;
}

struct Report {
  std::size_t position = 0;
  distlock::WaiterInfo ahead;
};

class QueueOrder : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override { target_ = GetParam().make({}); }
  distlock::Client client() { return distlock::connect(target_->url(), quiet()); }
  distlock::LockOptions opts(const std::string& info) const {
    distlock::LockOptions o;
    o.ttl = Millis(std::min<std::int64_t>(30'000, target_->max_ttl_ms()));
    o.wait = 120s;
    o.holder_info = info;
    return o;
  }
  std::unique_ptr<Target> target_;
};

TEST_P(QueueOrder, SixteenWaitersAreListedAndAcquireInTheOrderReported) {
  constexpr std::size_t kWaiters = 16;
  const std::string name = "queue/order";
  auto observer = client();
  auto holder_client = client();
  distlock::Lease held = holder_client.acquire(name, opts("holder"));

  if (!lists_waiters(GetParam().label)) {
    // One waiter is enough to show the backend does not pretend to list.
    auto c = client();
    auto waiter = std::async(std::launch::async, [&] {
      distlock::LockOptions o = opts("waiter=1");
      o.wait = 5s;
      std::error_code ec;
      (void)c.acquire(name, o, ec);
      return ec;
    });
    const distlock::LockInfo info = observer.status(name);
    EXPECT_FALSE(info.waiters_listed);
    EXPECT_TRUE(info.waiter_list.empty());
    held.release();
    ASSERT_EQ(waiter.wait_for(30s), std::future_status::ready);
    EXPECT_FALSE(waiter.get()) << "the waiter did not get the released lock";
    return;
  }

  std::mutex mu;
  std::vector<std::vector<Report>> reports(kWaiters + 1);  // by waiter number 1..16
  std::vector<std::size_t> order;                          // waiter numbers as they acquired
  std::vector<distlock::Client> clients;
  for (std::size_t i = 1; i <= kWaiters; ++i) clients.push_back(client());
  std::vector<std::future<std::error_code>> waiters;
  // On a failed assertion the holder lets go before the futures are waited for, so the
  // waiters end (acquire and release in turn) instead of running out their 120 s wait.
  struct ReleaseFirst {
    distlock::Lease& lease;
    ~ReleaseFirst() {
      std::error_code ignored;
      if (lease.owns()) lease.release(ignored);
    }
  } release_first{held};
  for (std::size_t i = 1; i <= kWaiters; ++i) {
    waiters.push_back(std::async(std::launch::async, [&, i] {
      distlock::LockOptions o = opts("waiter=" + std::to_string(i));
      o.on_queue_position = [&, i](std::size_t position, const distlock::WaiterInfo& ahead) {
        std::lock_guard lk(mu);
        reports[i].push_back({position, ahead});
      };
      std::error_code ec;
      distlock::Lease lease = clients[i - 1].acquire(name, o, ec);
      if (ec) return ec;
      {
        std::lock_guard lk(mu);
        order.push_back(i);
      }
      lease.release(ec);
      return ec;
    }));
    // Waiter i is queued (last, behind i-1) before waiter i+1 starts.
    const std::string mine = "waiter=" + std::to_string(i);
    ASSERT_TRUE(eventually(
        [&] {
          const distlock::LockInfo info = observer.status(name);
          return info.waiter_list.size() == i && info.waiter_list.back().holder_info == mine;
        },
        20s))
        << "waiter " << i << " was not listed last in the queue within 20 s";
  }

  const distlock::LockInfo info = observer.status(name);
  ASSERT_TRUE(info.held);
  EXPECT_EQ(info.holder_info, "holder");
  ASSERT_TRUE(info.waiters_listed);
  ASSERT_EQ(info.waiters, kWaiters) << "the count disagrees with the list";
  ASSERT_EQ(info.waiter_list.size(), kWaiters);
  std::vector<std::string> owners;
  for (std::size_t k = 0; k < kWaiters; ++k) {
    const distlock::WaiterInfo& w = info.waiter_list[k];
    EXPECT_EQ(w.position, k + 1);
    EXPECT_EQ(w.holder_info, "waiter=" + std::to_string(k + 1));
    EXPECT_FALSE(w.owner.empty());
    EXPECT_EQ(w.owner.find('|'), std::string::npos) << "holder_info left in the owner id";
    EXPECT_NE(w.owner, *info.holder);
    owners.push_back(w.owner);
    if (k > 0 && w.waiting_since && info.waiter_list[k - 1].waiting_since) {
      EXPECT_GE(*w.waiting_since, *info.waiter_list[k - 1].waiting_since);
    }
  }
  std::sort(owners.begin(), owners.end());
  EXPECT_EQ(std::unique(owners.begin(), owners.end()), owners.end()) << "two waiters share an owner id";

  // Every waiter's callback has reported its first position (queued on the event thread).
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard lk(mu);
        for (std::size_t i = 1; i <= kWaiters; ++i) {
          if (reports[i].empty()) return false;
        }
        return true;
      },
      20s))
      << "a waiter's queue-position callback did not run within 20 s";
  {
    std::lock_guard lk(mu);
    for (std::size_t i = 1; i <= kWaiters; ++i) {
      const Report& first = reports[i].front();
      EXPECT_EQ(first.position, i) << "waiter " << i;
      EXPECT_EQ(first.ahead.position, i - 1) << "waiter " << i;
      EXPECT_EQ(first.ahead.holder_info, i == 1 ? std::string("holder") : "waiter=" + std::to_string(i - 1))
          << "waiter " << i;
    }
  }

  held.release();
  for (std::size_t i = 0; i < kWaiters; ++i) {
    ASSERT_EQ(waiters[i].wait_for(120s), std::future_status::ready) << "waiter " << i + 1 << " hangs";
    EXPECT_FALSE(waiters[i].get()) << "waiter " << i + 1;
  }
  std::vector<std::size_t> expected(kWaiters);
  for (std::size_t i = 0; i < kWaiters; ++i) expected[i] = i + 1;
  EXPECT_EQ(order, expected) << "the waiters did not acquire in the order status() listed them";
  std::lock_guard lk(mu);
  for (std::size_t i = 1; i <= kWaiters; ++i) {
    for (std::size_t r = 1; r < reports[i].size(); ++r) {
      EXPECT_LT(reports[i][r].position, reports[i][r - 1].position)
          << "waiter " << i << ": a later report did not move forward";
    }
  }
  const distlock::LockInfo after = observer.status(name);
  EXPECT_FALSE(after.held);
  EXPECT_EQ(after.waiters, 0u);
  EXPECT_TRUE(after.waiter_list.empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, QueueOrder, ::testing::ValuesIn(distlock::testing::kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });

}  // namespace
