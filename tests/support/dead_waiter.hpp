// The dead-waiter case of the FIFO wait queue (docs/design.md "A dead waiter"), written once
// for the backends that queue on Redis (redis://, redis+cluster://):
//
//   expect_dead_waiter_delay_at_most_3s(url, name, SIGKILL, queued, "distlock-deadwaiter")
//
// A holds `name` (TTL 5 s); B, a lock_tool process, queues with TTL 30 s; C (here, on a thread)
// queues behind it with TTL 30 s; B is SIGKILLed or SIGSTOPped and A releases at once, while
// B's entry is still live on the server, so the release grants the lock to B. C's wait from
// the release is measured on this process's steady clock and must be at most 3 s (the grant
// to a dead entry lapses after its claim window and C's next refresh takes the lock over).
// B never printed "acquired"; a stopped B, resumed, queues anew and gets the lock after C.
// `queued()` counts the entries of the name's queue on the server.
//
// Thread-safety: call from the test's thread.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <string>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/timed_acquire.hpp"

namespace distlock::testing {

inline void expect_dead_waiter_delay_at_most_3s(const std::string& url, const std::string& name, int sig,
                                                const std::function<long long()>& queued,
                                                const char* tmp_prefix) {
  using namespace std::chrono_literals;
  using Steady = std::chrono::steady_clock;
  TempDir dir(tmp_prefix);
  Client a_client = connect(url, quiet());
  Lease a = a_client.acquire(name, ttl_of(5s));
  const std::string b_out = (dir.path() / "b.out").string();
  auto b = spawn_holder(url, name, b_out, 30000, 100, {"--wait", "60000"});
  ASSERT_TRUE(eventually([&] { return queued() == 1; }, 10s));
  Client c_client = connect(url, quiet());
  TimedAcquire c(c_client, name, ttl_of(30s, 60s));
  ASSERT_TRUE(eventually([&] { return queued() == 2; }, 10s));
  b.signal(sig);
  if (sig == SIGKILL) {
    ASSERT_NE(b.wait_for(10s), -1) << "the waiter did not die";
  } else {
    ASSERT_TRUE(eventually([&] { return process_state(b.pid()) == 'T'; }, 10s)) << "the waiter did not stop";
  }
  // B's entry is still live: the release grants the lock to it.
  EXPECT_EQ(queued(), 2);
  const auto released_at = Steady::now();
  a.release();
  c.join();
  ASSERT_TRUE(c.got());
  const auto stall = std::chrono::duration_cast<Millis>(c.got_at() - released_at);
  std::printf("dead waiter (signal %d): the next live waiter got the lock %lld ms after the release\n", sig,
              static_cast<long long>(stall.count()));
  EXPECT_LE(stall, 3000ms) << "the live waiter waited for a dead one's grant to run out";
  EXPECT_EQ(read_file(b_out).find("acquired"), std::string::npos);
  if (sig == SIGSTOP) {
    // On resume B finds its entry gone or its grant lapsed: it queues anew and gets the
    // lock after C (C's lease ended with its thread).
    b.signal(SIGCONT);
    EXPECT_TRUE(wait_for_text(b_out, "released", 30s)) << read_file(b_out);
  }
}

}  // namespace distlock::testing
