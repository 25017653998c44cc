// The scheduled-job pieces of issue 14 over every backend target of this build:
// the holder description round-trips through the server (status() and list() return
// it, renewals and the release still find the longer owner), and the --once-per
// protocol of `distlock run` (src/cli/job_guard.cpp: read the mark under the lock,
// run, store "<slot>\n<token>\n<unix ms>" while still held) gives at most one run per
// period slot with many contenders, on each target that keeps records.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "cli/job_guard.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "support/backend_targets.hpp"
#include "support/client_options.hpp"

using namespace std::chrono_literals;

namespace distlock::testing {
namespace {

class JobsConformance : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override { target_ = GetParam().make({}); }
  distlock::Client client() { return distlock::connect(target_->url(), quiet()); }
  std::unique_ptr<Target> target_;
};

TEST_P(JobsConformance, HolderInfoIsStoredWithTheLeaseAndReturnedByStatusAndList) {
  auto c = client();
  distlock::LockOptions o;
  o.ttl = 3000ms;
  // '.', ' ', '=' and '%' in the description: zk:// encodes owners into node names.
  o.holder_info =
      "host=node-1.example.org pid=4242 cmd=/usr/bin/backup --to=/srv/x 100% " + std::string(60, 'y');
  distlock::Lease lease = c.acquire("jobs/holder info", o);
  const distlock::LockInfo info = c.status("jobs/holder info");
  ASSERT_TRUE(info.held);
  ASSERT_TRUE(info.holder_info.has_value()) << "backend " << GetParam().label << " lost the description";
  EXPECT_EQ(*info.holder_info, o.holder_info);
  if (info.holder) {
    EXPECT_EQ(info.holder->find('|'), std::string::npos) << *info.holder;
  }
  // Renewal and release with the longer owner.
  EXPECT_EQ(c.renew_now(), target_->expires() ? 1u : 0u);
  EXPECT_TRUE(lease.owns());
  bool truncated = false;
  std::vector<distlock::ListedLock> listed;
  bool can_list = true;
  try {
    listed = c.list("jobs/", 10, truncated);
  } catch (const std::system_error& e) {
    // postgres:// keeps no list; the error says so.
    ASSERT_EQ(e.code(), errc::not_supported) << GetParam().label << ": list failed: " << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot list"), std::string::npos) << e.what();
    can_list = false;
  }
  if (can_list) {
    ASSERT_EQ(listed.size(), 1u);
    EXPECT_EQ(listed[0].name, "jobs/holder info");
    EXPECT_EQ(listed[0].info.holder_info, o.holder_info);
    EXPECT_FALSE(truncated);
  }
  lease.release();
  EXPECT_FALSE(c.status("jobs/holder info").held);
}

// 6 contenders, each firing 15 times 40 ms apart, with a 250 ms period: no slot has
// two runs, and runs happened in several slots.
TEST_P(JobsConformance, OncePerGivesAtMostOneRunPerSlot) {
  auto probe = client();
  {
    distlock::detail::Error ec;
    distlock::detail::engine_of(probe)->backend().get_record("jobs/once-probe", ec);
    if (ec == errc::not_supported) {
      // No records: the protocol refuses (distlock run --once-per exits 64 naming it).
      try {
        distlock::cli::read_once_mark(probe, "jobs/once");
        ADD_FAILURE() << "read_once_mark worked on a backend without records";
      } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), errc::not_supported);
        EXPECT_NE(std::string(e.what()).find("keeps no records"), std::string::npos) << e.what();
      }
      return;
    }
    ASSERT_FALSE(ec) << ec.message();
  }
  const Millis period = 250ms;
  std::mutex mu;
  std::map<std::uint64_t, int> runs_per_slot;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      try {
        auto c = client();
        distlock::LockOptions o;
        o.ttl = 2000ms;
        o.wait = 20000ms;
        for (int i = 0; i < 15; ++i) {
          if (i > 0) std::this_thread::sleep_for(40ms);  // this host's cron fires again
          // The slot of the firing, read before waiting for the lock (as `distlock run` does).
          const std::int64_t fired = distlock::cli::unix_ms_now();
          const std::uint64_t slot = distlock::cli::period_slot(period, fired);
          distlock::Lease lease = c.acquire("jobs/once", o);
          if (!distlock::cli::once_due(distlock::cli::read_once_mark(c, "jobs/once"), period, fired))
            continue;
          {
            std::lock_guard lk(mu);
            ++runs_per_slot[slot];
          }
          if (!lease.owns()) continue;
          distlock::cli::write_once_mark(c, "jobs/once",
                                         distlock::cli::OnceMark{slot, lease.has_token() ? lease.token() : 0,
                                                                 distlock::cli::unix_ms_now(), fired});
        }
      } catch (const std::exception& e) {
        ++errors;
        ADD_FAILURE() << e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  for (const auto& [slot, n] : runs_per_slot) EXPECT_EQ(n, 1) << "slot " << slot << " ran " << n << " times";
  EXPECT_GE(runs_per_slot.size(), 2u);  // each contender's firings span more than two periods
  // The mark left behind is the last slot run.
  auto last = distlock::cli::read_once_mark(probe, "jobs/once");
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->slot, runs_per_slot.rbegin()->first);
}

// once_due over marks of other periods and of the older three-line format (no backend needed).
TEST(OnceDue, ComparesTheMarkedFiringInTheRunnersOwnPeriod) {
  using distlock::cli::once_due;
  using distlock::cli::OnceMark;
  const std::int64_t t = 1795465361028;  // a firing, unix ms
  const Millis minute = std::chrono::minutes(1), hour = std::chrono::hours(1);
  // A run fired a minute earlier under a 1 min period: in the same hour unless the hour turned.
  const OnceMark m{distlock::cli::period_slot(minute, t - 60000), 7, t - 59000, t - 60000, false};
  EXPECT_EQ(once_due(m, hour, t), (t - 60000) / 3600000 < t / 3600000);
  // The same mark does not block the next hour (its slot number, ~10^7, is not compared with
  // hour slots, ~10^5).
  EXPECT_TRUE(once_due(m, hour, t + 3600000));
  // Fired in this slot: not due; fired in the previous slot: due.
  EXPECT_FALSE(once_due(OnceMark{0, 0, t, t, false}, minute, t));
  EXPECT_TRUE(once_due(OnceMark{0, 0, t, t - 60000, false}, minute, t));
  // A three-line mark (fired_unix_ms -1) is read as of the runner's period.
  EXPECT_FALSE(once_due(OnceMark{static_cast<std::uint64_t>(t / 60000), 0, t, -1, false}, minute, t));
  EXPECT_TRUE(once_due(OnceMark{static_cast<std::uint64_t>(t / 60000) - 1, 0, t, -1, false}, minute, t));
  // A later firing's mark keeps an earlier firing from running out of order.
  EXPECT_FALSE(once_due(OnceMark{0, 0, t + 60000, t + 60000, false}, minute, t));
  // No mark, or a malformed one: due.
  EXPECT_TRUE(once_due(std::nullopt, minute, t));
  EXPECT_TRUE(once_due(OnceMark{~0ULL, 0, t, t, true}, minute, t));
}

INSTANTIATE_TEST_SUITE_P(Backends, JobsConformance, ::testing::ValuesIn(distlock::testing::kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });

}  // namespace

}  // namespace distlock::testing
