// The end-to-end fault the fence exists for: a holder process is frozen (SIGSTOP)
// past its lease, another process acquires the lock with a larger token and
// writes; the frozen holder is resumed, its loss signal fires, and its fenced write
// — attempted as soon as it runs again — is rejected, leaving the newer write.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>

#include "distlock/distlock.hpp"
#include "distlock/fencing.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::testing::Process;
using distlock::testing::read_file;
using distlock::testing::wait_for_line;
using distlock::testing::wait_for_text;

TEST(FenceFault, HolderPausedPastItsTtlHasItsWriteRejected) {
  distlock::testing::RedisServer redis;
  distlock::testing::TempDir dir;
  const std::string out = (dir.path() / "holder.out").string();
  const std::string key = "{fault}:doc";
  constexpr long kTtlMs = 800;

  Process holder = Process::spawn({DISTLOCK_FENCE_HOLDER_PATH, "--url", redis.url(), "--name", "fault",
                                   "--store", redis.url(), "--key", key, "--ttl", std::to_string(kTtlMs)},
                                  out);
  ASSERT_TRUE(wait_for_text(out, "acquired ", 10s)) << read_file(out);
  const long long old_token = distlock::testing::acquired_token(out);
  ASSERT_GT(old_token, 0) << read_file(out);

  // The holder writes once while it legitimately holds the lock.
  holder.signal(SIGUSR1);
  ASSERT_TRUE(wait_for_text(out, "write applied", 5s)) << read_file(out);

  holder.signal(SIGSTOP);  // a GC pause, a swapped-out process, a VM migration...

  // Another process (this test) takes the lock once the frozen holder's lease expires.
  auto client = distlock::connect(redis.url());
  distlock::LockOptions opts;
  opts.ttl = 5s;
  opts.wait = std::chrono::milliseconds(kTtlMs * 4 + 2000);
  const auto t0 = std::chrono::steady_clock::now();
  distlock::Lease lease = client.acquire("fault", opts);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(kTtlMs + 2000));
  ASSERT_GT(lease.token(), static_cast<std::uint64_t>(old_token));
  distlock::RedisFence store(redis.url());
  ASSERT_TRUE(store.set(key, "new-holder", lease.token()).applied());

  // The old holder wakes up and writes at once, before it may have noticed the loss.
  holder.signal(SIGUSR1);  // pending until it runs again
  holder.signal(SIGCONT);
  ASSERT_TRUE(wait_for_text(out, "write stale " + std::to_string(lease.token()), 5s)) << read_file(out);
  // And its stop signal fires (its renewal is refused or its local deadline passed).
  ASSERT_TRUE(wait_for_line(out, "lost", 5s)) << read_file(out);
  // A write after noticing the loss is rejected too.
  holder.signal(SIGUSR1);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(read_file(out).find("write applied", read_file(out).find("write stale")), std::string::npos)
      << read_file(out);

  auto value = redis.command({"GET", key});
  ASSERT_EQ(value->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(value->str, value->len), "new-holder");
  EXPECT_EQ(store.highest_token(key), lease.token());

  // The old holder's release must not touch the new holder's lock.
  holder.signal(SIGTERM);
  EXPECT_NE(holder.wait_for(10s), -1) << read_file(out);
  EXPECT_TRUE(lease.owns());
  auto info = client.status("fault");
  EXPECT_TRUE(info.held);
  if (info.token) {
    EXPECT_EQ(*info.token, lease.token());
  }
}

}  // namespace
