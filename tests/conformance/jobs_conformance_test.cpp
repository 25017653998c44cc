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

#include "cli/job_guard.hpp"
#include "core/engine.hpp"
#include "distlock/distlock.hpp"
#include "support/backend_targets.hpp"

using namespace std::chrono_literals;
using distlock::errc;
using distlock::Millis;
using distlock::testing::Kind;
using distlock::testing::Target;

namespace {

distlock::ClientOptions quiet() {
  distlock::ClientOptions o;
  o.logger = [](distlock::LogLevel, std::string_view) {};
  return o;
}

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
    std::error_code ec;
    probe.engine()->backend().get_record("jobs/once-probe", ec);
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
          const std::uint64_t slot = distlock::cli::period_slot(period, distlock::cli::unix_ms_now());
          distlock::Lease lease = c.acquire("jobs/once", o);
          if (!distlock::cli::once_due(distlock::cli::read_once_mark(c, "jobs/once"), slot)) continue;
          {
            std::lock_guard lk(mu);
            ++runs_per_slot[slot];
          }
          if (!lease.owns()) continue;
          distlock::cli::write_once_mark(c, "jobs/once",
                                         distlock::cli::OnceMark{slot, lease.has_token() ? lease.token() : 0,
                                                                 distlock::cli::unix_ms_now()});
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

INSTANTIATE_TEST_SUITE_P(Backends, JobsConformance, ::testing::ValuesIn(distlock::testing::kinds()),
                         [](const ::testing::TestParamInfo<Kind>& p) { return p.param.label; });

}  // namespace
