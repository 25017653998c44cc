// redis+sentinel:// discovery: which master the client picks by config-epoch.
// Written by the second review of sentinel discovery (commit 51eb053, first named sentinel_review2_test.cpp).
//
// Second adversarial review of redis+sentinel:// discovery (discover() in
// src/redis/sentinel_backend.cpp). The sentinels here are scripted: each speaks RESP
// on a loopback port and answers `SENTINEL MASTER <name>` with a chosen config-epoch
// and `SENTINEL get-master-addr-by-name` with a chosen address, so that the choice
// rule can be put in states a real group passes through only briefly (the failover's
// leader is the only sentinel that knows the new epoch until its hello messages reach
// the others). The masters are real redis-servers (tests/support/redis_server.hpp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <memory>
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
#include "support/redis_server.hpp"
#include "support/scripted_resp_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

// A scripted sentinel for master "mymaster": config-epoch `epoch`, address
// 127.0.0.1:`port`. SUBSCRIBE is confirmed and never followed by a message. The
// destructor stops it (listening socket closed, connections closed, threads joined):
// from then on it refuses connections, as a sentinel that is down or cut off.
class ScriptedSentinel {
 public:
  ScriptedSentinel(long long epoch, std::uint16_t port)
      : server_("scripted sentinel", [epoch, port](const std::vector<std::string>& args) {
          using S = distlock::testing::ScriptedRespServer;
          auto arg = [&](std::size_t i) { return i < args.size() ? args[i] : std::string(); };
          const std::string cmd = S::upper(arg(0));
          if (cmd == "SENTINEL" && S::upper(arg(1)) == "MASTER") {
            // RESP2: a flat list of field, value (a real sentinel sends some 40 of them).
            return "*8\r\n" + S::bulk("name") + S::bulk("mymaster") + S::bulk("ip") + S::bulk("127.0.0.1") +
                   S::bulk("port") + S::bulk(std::to_string(port)) + S::bulk("config-epoch") +
                   S::bulk(std::to_string(epoch));
          }
          if (cmd == "SENTINEL" && S::upper(arg(1)) == "GET-MASTER-ADDR-BY-NAME") {
            return "*2\r\n" + S::bulk("127.0.0.1") + S::bulk(std::to_string(port));
          }
          if (cmd == "SUBSCRIBE") return "*3\r\n" + S::bulk("subscribe") + S::bulk(arg(1)) + ":1\r\n";
          if (cmd == "PING") return std::string("+PONG\r\n");
          return std::string("-ERR unknown command\r\n");
        }) {}
  void stop() { server_.stop(); }
  std::uint16_t port() const { return server_.port(); }

 private:
  distlock::testing::ScriptedRespServer server_;
};

// A failover has just made `fresh` the master under config-epoch 5; its leader (the
// first sentinel) knows, the two others have not yet received its hello messages and
// still name the old master `old` under epoch 4 (as real sentinels do for a moment
// after every failover, or for as long as they are cut off from the leader). `old`
// still answers ROLE "master" (it is demoted only once the sentinels reach it). Both
// clients start on `fresh` (the highest epoch wins). Then the leader stops answering
// client 1. By the documented rule "the sentinels converge on the configuration with
// the highest epoch", `fresh` is and stays the master; but two of three sentinels now
// name `old`, a majority, and the client moves there although it was chosen under a
// newer epoch — and is granted a lock that client 2 holds on `fresh`.
TEST(SentinelEpochChoice, AMajorityNamingAnOlderEpochDoesNotMoveTheClientBackToTheOldMaster) {
  RedisServer old_master, fresh_master;
  ScriptedSentinel leader(5, fresh_master.port());
  ScriptedSentinel lagging1(4, old_master.port());
  ScriptedSentinel lagging2(4, old_master.port());
  const std::string url = "redis+sentinel://127.0.0.1:" + std::to_string(leader.port()) +
                          ",127.0.0.1:" + std::to_string(lagging1.port()) +
                          ",127.0.0.1:" + std::to_string(lagging2.port()) + "/mymaster?timeout=500ms";
  auto c1 = distlock::connect(url, quiet());
  auto c2 = distlock::connect(url, quiet());
  auto held = c2.acquire("job", ttl_of(30s));
  ASSERT_TRUE(held.owns());
  ASSERT_TRUE(key_exists(fresh_master, "distlock:{job}")) << "client 2 did not start on the epoch-5 master";
  {
    auto probe = c1.try_acquire("probe", ttl_of(5s));
    ASSERT_TRUE(probe && probe->owns());
    ASSERT_TRUE(key_exists(fresh_master, "distlock:{probe}"))
        << "client 1 did not start on the epoch-5 master";
    std::error_code ec;
    probe->release(ec);
  }

  leader.stop();  // the only sentinel that knows epoch 5 no longer answers

  // Client 1 re-discovers at least once a second. For 4 s, it must not be granted
  // "job" while client 2 holds it.
  const auto since = Steady::now();
  const std::string both = granted_while_held(c1, "job", held, 4s, [&](const distlock::Lease& l) {
    return "client 1 acquired \"job\" (token " + std::to_string(l.token()) + ") " +
           std::to_string(std::chrono::duration_cast<Millis>(Steady::now() - since).count()) +
           " ms after the epoch-5 leader stopped answering, while client 2 holds it on the epoch-5 " +
           "master at port " + std::to_string(fresh_master.port()) + " (token " +
           std::to_string(held.token()) + "); key on the epoch-4 master at port " +
           std::to_string(old_master.port()) + ": " +
           (key_exists(old_master, "distlock:{job}") ? "yes" : "no");
  });
  EXPECT_TRUE(both.empty()) << both;
}

}  // namespace
}  // namespace distlock::testing
