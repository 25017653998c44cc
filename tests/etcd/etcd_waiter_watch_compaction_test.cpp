// A waiter's watch on its predecessor (src/etcd/etcd_watch.cpp) whose start revision was
// compacted before the watch reached etcd: etcd cancels the watch with its compact revision
// (ErrCompacted), and the waiter must read its predecessor again and watch from that read at
// once, not sit until its periodic re-check (recheck_delay: min(holder TTL, 5 s) + jitter,
// src/engine/wait_registry.cpp). Against a real etcd, through the backend's predecessor
// watch hook: between the waiter's read of its predecessor and its watch request the test
// writes two keys and compacts up to the current revision, so the watch's start revision
// (read + 1) is below the compaction.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "etcd/etcd_backend_impl.hpp"
#include "etcd_cluster.hpp"
#include "support/client_options.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

detail::etcd::EtcdBackend& etcd_backend(Client& c) {
  auto* b = dynamic_cast<detail::etcd::EtcdBackend*>(&detail::engine_of(c)->backend());
  if (b == nullptr) throw std::runtime_error("not an etcd backend");
  return *b;
}

// The holder keeps a 30 s TTL, so the waiter's periodic re-check is 5 s away (the cap): a
// waiter that missed the cancel would read its predecessor again only then. Bounds on the
// test's steady clock: the second read within 2 s of the compaction (5 s without the cancel
// handled), the grant within 2 s of the release.
TEST(EtcdWaiterWatch, CompactedStartRevisionIsReadAgainAtOnceAndTheWaiterIsGranted) {
  EtcdCluster etcd(1);
  Client holder = connect(etcd.url("?prefix=wc"), quiet());
  std::mutex log_mu;
  std::vector<std::string> logged;
  ClientOptions wopts = quiet();
  wopts.logger = [&](LogLevel, std::string_view line) {
    std::lock_guard lk(log_mu);
    logged.emplace_back(line);
  };
  Client waiter = connect(etcd.url("?prefix=wc"), wopts);

  auto held = holder.acquire("c", ttl_of(30s));
  ASSERT_TRUE(held.owns());

  std::mutex mu;
  std::condition_variable cv;
  int reads = 0;  // the waiter's reads of its predecessor
  Steady::time_point compacted_at{};
  Steady::time_point second_read_at{};
  std::string hook_error;
  etcd_backend(waiter).set_predecessor_watch_hook_for_test([&](std::int64_t read_revision) {
    int n = 0;
    {
      std::lock_guard lk(mu);
      n = ++reads;
    }
    if (n == 1) {
      // Two writes: the compaction's revision is then past the watch's start (read + 1).
      std::string error;
      for (const char* k : {"wc-other/1", "wc-other/2"}) {
        const auto r = etcd.etcdctl({"put", k, "x"});
        if (r.exit_code != 0) error += r.output;
      }
      const std::int64_t now = etcd.revision();
      if (now < read_revision + 2) error += "the revision did not move past the read's + 1";
      const auto r = etcd.etcdctl({"compaction", std::to_string(now)});
      if (r.exit_code != 0) error += r.output;
      std::lock_guard lk(mu);
      hook_error = error;
      compacted_at = Steady::now();
    } else if (n == 2) {
      std::lock_guard lk(mu);
      second_read_at = Steady::now();
    }
    cv.notify_all();
  });

  auto granted = std::async(std::launch::async, [&] {
    auto lease = waiter.acquire("c", ttl_of(30s, 20s));
    return std::make_pair(lease.owns() ? lease.token() : std::uint64_t{0}, Steady::now());
  });

  {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 20s, [&] { return reads >= 2; }))
        << "the waiter did not read its predecessor again within 20 s (reads: " << reads << ")";
    ASSERT_EQ(hook_error, "");
    const auto again = std::chrono::duration_cast<std::chrono::milliseconds>(second_read_at - compacted_at);
    std::cout << "[ waiter watch ] compaction to the second read of the predecessor: " << again.count()
              << " ms\n";
    EXPECT_LT(again, 2s) << "the cancelled watch was not followed up at once";
  }
  {
    // The cancel came from the compaction (etcd names the compact revision).
    std::lock_guard lk(log_mu);
    bool named = false;
    for (const auto& l : logged) named = named || l.find("start revision was compacted") != std::string::npos;
    EXPECT_TRUE(named) << "no compaction cancel logged";
  }

  const std::uint64_t held_token = held.token();
  held.release();
  const auto released_at = Steady::now();
  ASSERT_EQ(granted.wait_for(20s), std::future_status::ready) << "the waiter was not granted within 20 s";
  const auto [token, at] = granted.get();
  EXPECT_GT(token, held_token);
  const auto after = std::chrono::duration_cast<std::chrono::milliseconds>(at - released_at);
  std::cout << "[ waiter watch ] release to grant: " << after.count() << " ms\n";
  EXPECT_LT(after, 2s);
}

}  // namespace
}  // namespace distlock::testing
