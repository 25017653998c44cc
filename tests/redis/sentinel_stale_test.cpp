// redis+sentinel:// with a stale or paused sentinel: never two holders, never stuck on the old master.
// Written by the first review of redis+sentinel:// (commit 86fad3e, first named sentinel_review_test.cpp).
//
// Adversarial review of redis+sentinel:// (tests that try to break the lock
// contract). Each test starts its own Sentinel group (tests/support/redis_sentinel.hpp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/redis_probes.hpp"
#include "support/redis_second_holder.hpp"
#include "support/redis_sentinel.hpp"
#include "support/scripted_resp_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

// A sentinel that has not learnt of a failover: it keeps answering
// `SENTINEL get-master-addr-by-name` with the old master, as a real sentinel does
// while it is cut off from the others (on the old master's side of a partition) or
// until the others' hello messages reach it after it was paused. It speaks RESP on
// a loopback port (requests parsed with hiredis's reader); SUBSCRIBE is confirmed
// and never followed by a message. Stopped (threads joined) by its destructor.
class StaleSentinel {
 public:
  explicit StaleSentinel(std::uint16_t names_port)
      : server_("stale sentinel", [this, names_port](const std::vector<std::string>& args) {
          using S = distlock::testing::ScriptedRespServer;
          const std::string cmd = S::upper(args.empty() ? std::string() : args[0]);
          if (cmd == "SENTINEL") {
            ++asked_;
            return "*2\r\n" + S::bulk("127.0.0.1") + S::bulk(std::to_string(names_port));
          }
          if (cmd == "SUBSCRIBE") {
            return "*3\r\n" + S::bulk("subscribe") + S::bulk(args.size() > 1 ? args[1] : std::string()) +
                   ":1\r\n";
          }
          if (cmd == "PING") return std::string("+PONG\r\n");
          return std::string("-ERR unknown command\r\n");
        }) {}
  std::uint16_t port() const { return server_.port(); }
  int asked() const { return asked_.load(); }

 private:
  std::atomic<int> asked_{0};
  distlock::testing::ScriptedRespServer server_;  // last: stopped before asked_ goes
};

std::string url_with_first(const StaleSentinel& stale, const RedisSentinelGroup& group,
                           const std::string& extra = "") {
  std::string url = "redis+sentinel://127.0.0.1:" + std::to_string(stale.port());
  for (auto p : group.sentinel_ports()) url += ",127.0.0.1:" + std::to_string(p);
  return url + "/mymaster?timeout=500ms" + extra;
}

// True when `c` acquires a fresh name and the key lands on `node`.
bool lands_on(distlock::Client& c, distlock::testing::RedisServer& node, int& probe) {
  const std::string name = "probe" + std::to_string(probe++);
  std::optional<distlock::Lease> l;
  try {
    l = c.try_acquire(name, ttl_of(5s));
  } catch (const std::system_error&) {
    return false;
  }
  if (!l || !l->owns()) return false;
  const bool there = key_exists(node, "distlock:{" + name + "}");
  std::error_code ec;
  l->release(ec);
  return there;
}

// The master hangs (SIGSTOP) and the sentinels fail over to a replica. One sentinel,
// first in the client's list, has not learnt of it and still names the old master
// (cut off from the other sentinels, or not yet reached by their hello messages);
// the other two name the new one. The client must follow the failover: it is told
// to re-discover on every failed call and every second.
TEST(SentinelStale, AStaleFirstSentinelDoesNotKeepTheClientOnAHungMaster) {
  RedisSentinelGroup group;
  const std::uint16_t old_port = group.master_port();
  StaleSentinel stale(old_port);
  auto c1 = distlock::connect(url_with_first(stale, group), quiet());
  ASSERT_GT(stale.asked(), 0) << "the client did not ask the first sentinel of its list";
  auto& old_master = group.node_at_port(old_port);
  old_master.pause();
  const std::uint16_t new_port = group.wait_failover(old_port, 60s);
  auto& new_master = group.node_at_port(new_port);
  int probe = 0;
  const auto since = Steady::now();
  const bool followed = eventually([&] { return lands_on(c1, new_master, probe); }, 30s);
  old_master.resume();
  EXPECT_TRUE(followed) << "client 1 did not follow the failover to port " << new_port << " in "
                        << std::chrono::duration_cast<Millis>(Steady::now() - since).count()
                        << " ms (2 of 3 sentinels name it; " << probe << " acquisitions tried)";
}

// Tries for `limit` to have `c1` granted "job" (released at once) while `held`, client 2's
// lease on the master at `new_port`, is held; "" when it never was, else what happened (and
// whether the old master at `old_port` has the key).
std::string second_holder(distlock::Client& c1, const distlock::Lease& held,
                          distlock::testing::RedisServer& old_master, std::uint16_t old_port,
                          std::uint16_t new_port, Millis limit) {
  return granted_while_held(c1, "job", held, limit, [&](const distlock::Lease& l) {
    return "client 1 acquired \"job\" (token " + std::to_string(l.token()) +
           ") while client 2 holds it on the master at port " + std::to_string(new_port) + " (token " +
           std::to_string(held.token()) + "); key on the old master at port " + std::to_string(old_port) +
           ": " + (key_exists(old_master, "distlock:{job}") ? "yes" : "no");
  });
}

// The old master hangs (SIGSTOP), the sentinels fail over to a replica, and a
// client started then finds the new master (the stale first sentinel names the hung
// old one, which does not answer ROLE). Then the old master resumes: until the
// sentinels demote it (they wait several seconds before sending it REPLICAOF) it
// still answers ROLE with "master". The client must not go back to it while the
// real master is elsewhere: a second client, asking up-to-date sentinels, holds a
// lock on the real master, and the first must not be granted the same lock on the
// old one (two holders, neither told, no key lost anywhere).
// Returns "" or a description of two holders at once.
std::string pulled_back(const std::string& extra) {
  RedisSentinelGroup group;
  const std::uint16_t old_port = group.master_port();
  StaleSentinel stale(old_port);
  auto c2 = distlock::connect(group.url(extra.empty() ? "" : "?" + extra.substr(1)), quiet());
  auto& old_master = group.node_at_port(old_port);
  old_master.pause();
  const std::uint16_t new_port = group.wait_failover(old_port, 60s);
  auto& new_master = group.node_at_port(new_port);
  auto c1 = distlock::connect(url_with_first(stale, group, extra), quiet());
  EXPECT_GT(stale.asked(), 0) << "the client did not ask the first sentinel of its list";
  int probe = 0;
  if (!eventually([&] { return lands_on(c1, new_master, probe); }, 30s)) {
    ADD_FAILURE() << "client 1 did not start on the master at port " << new_port;
    old_master.resume();
    return {};
  }
  auto held = c2.acquire("job", ttl_of(30s, 20s));
  EXPECT_TRUE(key_exists(new_master, "distlock:{job}"));
  old_master.resume();
  // Client 1 keeps trying for 5 s (the sentinels demote the old master only later).
  return second_holder(c1, held, old_master, old_port, new_port, 5s);
}

TEST(SentinelStale, AStaleSentinelDoesNotPullAClientBackToTheOldMaster) {
  const std::string both = pulled_back("");
  EXPECT_TRUE(both.empty()) << both;
}

// The same with wait=1: the old master has no replica any more, so WAIT refuses
// every acquisition there (this mitigation holds).
TEST(SentinelStale, WithWaitAStaleSentinelCannotGrantALockOnTheOldMaster) {
  const std::string both = pulled_back("&wait=1&wait_timeout=200ms");
  EXPECT_TRUE(both.empty()) << both;
}

// The same with real sentinels only: sentinel 0 and the master are paused together
// (a host or a rack that stalls), sentinels 1 and 2 fail over; then both resume.
// Sentinel 0 names the old master until the others' hello messages reach it (about
// 2 s); the old master answers ROLE "master" until it is demoted (longer). A client
// that lists sentinel 0 first must not be granted a lock held on the new master.
TEST(SentinelStale, APausedSentinelResumingStaleDoesNotGiveTwoHolders) {
  RedisSentinelGroup group;
  const std::uint16_t old_port = group.master_port();
  auto& old_master = group.node_at_port(old_port);
  auto c2 = distlock::connect(group.url(), quiet());
  ASSERT_EQ(::kill(group.sentinel_pid(0), SIGSTOP), 0);
  old_master.pause();
  std::uint16_t new_port = 0;
  {
    // wait_failover asks every sentinel; the paused one would not answer.
    const auto end = Steady::now() + 60s;
    while (Steady::now() < end && new_port == 0) {
      for (std::size_t i = 1; i < 3; ++i) {
        try {
          auto r = group.sentinel_command(i, {"SENTINEL", "get-master-addr-by-name", "mymaster"});
          if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
            const auto p = static_cast<std::uint16_t>(std::stoi(r->element[1]->str));
            if (p != old_port) new_port = p;
          }
        } catch (const std::exception&) {
        }
      }
      std::this_thread::sleep_for(50ms);
    }
  }
  ASSERT_NE(new_port, 0) << "no failover";
  auto& new_master = group.node_at_port(new_port);
  ASSERT_TRUE(eventually(
      [&] {
        auto r = new_master.command({"ROLE"});
        return r && r->type == REDIS_REPLY_ARRAY && std::string(r->element[0]->str) == "master";
      },
      30s));
  auto c1 = distlock::connect(group.url("?timeout=500ms"), quiet());
  int probe = 0;
  ASSERT_TRUE(eventually([&] { return lands_on(c1, new_master, probe); }, 30s));
  auto held = c2.acquire("job", ttl_of(30s, 20s));
  ASSERT_TRUE(key_exists(new_master, "distlock:{job}"));
  ::kill(group.sentinel_pid(0), SIGCONT);
  old_master.resume();
  const std::string both = second_holder(c1, held, old_master, old_port, new_port, 6s);
  EXPECT_TRUE(both.empty()) << both;
}

}  // namespace
}  // namespace distlock::testing
