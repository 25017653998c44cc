// redis:// safety regressions against a real redis-server: fencing tokens never
// repeat (restart from an RDB snapshot, lost counter), the connect-time warning
// about persistence and eviction, an owner already in the hash never gets a token
// as a fresh acquisition, and a failed watch leaves nothing subscribed and says why.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "redis/slots.hpp"
#include "support/client_options.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// One acquisition, released at once: its token.
std::uint64_t issue(distlock::Client& c, const std::string& name) {
  auto lease = c.acquire(name, ttl_of(5s));
  return lease.token();
}

// The server's TIME in microseconds.
std::uint64_t server_micros(const RedisServer& s) {
  auto r = s.command({"TIME"});
  return std::stoull(std::string(r->element[0]->str, r->element[0]->len)) * 1000000u +
         std::stoull(std::string(r->element[1]->str, r->element[1]->len));
}

TEST(RedisTokens, NeverRepeatAfterARestartFromAnRdbSnapshot) {
  RedisServer server;  // appendonly no: only the explicit SAVE below persists anything
  std::vector<std::uint64_t> tokens;
  {
    auto client = distlock::connect(server.url());
    for (int i = 0; i < 3; ++i) tokens.push_back(issue(client, "rdb"));
    ASSERT_EQ(server.command({"SAVE"})->type, REDIS_REPLY_STATUS);
    for (int i = 0; i < 3; ++i) tokens.push_back(issue(client, "rdb"));
  }
  server.kill();  // SIGKILL: the last three tokens exist only in memory
  server.restart();
  auto client = distlock::connect(server.url());
  for (int i = 0; i < 3; ++i) tokens.push_back(issue(client, "rdb"));
  for (std::size_t i = 1; i < tokens.size(); ++i) {
    EXPECT_GT(tokens[i], tokens[i - 1]) << "token " << i << " of 9";
  }
}

TEST(RedisTokens, NeverRepeatAfterTheCounterIsLost) {
  RedisServer server;
  auto client = distlock::connect(server.url());
  const std::uint64_t before = issue(client, "evicted");
  // What an eviction (allkeys-* policies), a FLUSHALL or an operator's DEL does.
  server.command(
      {"DEL", "distlock:{" +
                  distlock::detail::redis::slot_tag(distlock::detail::redis::key_slot("distlock:{evicted}")) +
                  "}:fence"});
  const std::uint64_t after = issue(client, "evicted");
  EXPECT_GT(after, before);
}

TEST(RedisTokens, AreAtLeastTheServerClockInMicroseconds) {
  RedisServer server;
  auto client = distlock::connect(server.url());
  const std::uint64_t t0 = server_micros(server);
  const std::uint64_t a = issue(client, "clock");
  const std::uint64_t b = issue(client, "clock");
  const std::uint64_t t1 = server_micros(server);
  EXPECT_GE(a, t0);
  EXPECT_GT(b, a);
  EXPECT_LE(b, t1);  // one script takes more than 1 us: the counter does not run ahead of TIME
}

// Bounded server state: fence counters are per hash slot, not per name, so any
// number of distinct names leaves at most 16,384 keys once released (before: one
// never-expiring "<prefix>:{<name>}:fence" per name, 17,000 keys here). Tokens stay
// strictly increasing per name, also between names that share a slot's counter.
TEST(RedisTokens, ManyNamesLeaveAtMostOneCounterPerHashSlot) {
  using distlock::detail::redis::key_slot;
  RedisServer server;
  auto client = distlock::connect(server.url());
  constexpr int kNames = 17000, kThreads = 4;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kNames; i += kThreads) {
        std::optional<distlock::Lease> l = client.try_acquire("order-" + std::to_string(i), ttl_of(5s));
        if (!l) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  const long long keys = server.command({"DBSIZE"})->integer;
  EXPECT_LE(keys, 16384) << "one key per name was left behind";
  EXPECT_GT(keys, 0);
  auto all = server.command({"KEYS", "*"});
  for (std::size_t i = 0; i < all->elements; ++i) {
    const std::string k(all->element[i]->str, all->element[i]->len);
    ASSERT_TRUE(k.rfind("distlock:{", 0) == 0 && k.size() > 16 && k.compare(k.size() - 7, 7, "}:fence") == 0)
        << k;
  }
  // Two names of one slot, interleaved: each name's tokens increase.
  std::string a, b;
  std::map<std::uint16_t, std::string> seen;
  for (int i = 0; b.empty() && i < kNames; ++i) {
    const std::string n = "order-" + std::to_string(i);
    auto [it, fresh] = seen.emplace(key_slot("distlock:{" + n + "}"), n);
    if (!fresh) {
      a = it->second;
      b = n;
    }
  }
  ASSERT_FALSE(b.empty());
  std::uint64_t last_a = 0, last_b = 0;
  for (int round = 0; round < 5; ++round) {
    const std::uint64_t ta = issue(client, a), tb = issue(client, b);
    EXPECT_GT(ta, last_a);
    EXPECT_GT(tb, last_b);
    EXPECT_GT(tb, ta);  // one counter: the later acquisition's token is larger
    last_a = ta;
    last_b = tb;
  }
}

// ---- the connect-time check of persistence and eviction -----------------------

struct Captured {
  std::mutex mu;
  std::vector<std::pair<distlock::LogLevel, std::string>> lines;
  distlock::ClientOptions options() {
    distlock::ClientOptions o;
    o.logger = [this](distlock::LogLevel l, std::string_view m) {
      std::lock_guard lk(mu);
      lines.emplace_back(l, std::string(m));
    };
    return o;
  }
  int count(distlock::LogLevel level, std::string_view part) {
    std::lock_guard lk(mu);
    int n = 0;
    for (const auto& [l, m] : lines) n += l == level && m.find(part) != std::string::npos;
    return n;
  }
};

// A client of a server started with `o` takes a name `calls` times (the check runs once, at
// its first lock); then each {part, n} of `warnings` is met by n warning lines containing part.
void expect_config_warnings(RedisServerOptions o, int calls,
                            std::initializer_list<std::pair<std::string_view, int>> warnings) {
  RedisServer server(std::move(o));
  Captured log;
  auto client = distlock::connect(server.url(), log.options());
  for (int i = 0; i < calls; ++i) issue(client, "checked");
  for (const auto& [part, n] : warnings) EXPECT_EQ(log.count(distlock::LogLevel::warning, part), n) << part;
}

TEST(RedisConfigCheck, AppendonlyNoIsWarnedOncePerClient) {
  // appendonly no, maxmemory 0
  expect_config_warnings({}, 3, {{"appendonly no", 1}, {"maxmemory-policy", 0}});
}

TEST(RedisConfigCheck, AnEvictingPolicyIsWarnedOncePerClient) {
  expect_config_warnings(
      {.appendonly = true, .extra_args = {"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}}, 1,
      {{"maxmemory-policy allkeys-lru", 1}, {"appendonly", 0}});
}

TEST(RedisConfigCheck, ADurableNonEvictingServerIsNotWarned) {
  expect_config_warnings({.appendonly = true}, 1, {{"appendonly", 0}, {"maxmemory", 0}});
}

TEST(RedisConfigCheck, ConfigDeniedIsADebugLineNotAFailure) {
  RedisServer server({.password = "pw", .acl_user = "app", .acl_password = "apppw"});
  server.command({"ACL", "SETUSER", "app", "-config"});
  Captured log;
  auto client =
      distlock::connect("redis://app:apppw@127.0.0.1:" + std::to_string(server.port()), log.options());
  issue(client, "no-config");
  EXPECT_EQ(log.count(distlock::LogLevel::debug, "CONFIG"), 1);
  EXPECT_EQ(log.count(distlock::LogLevel::warning, "appendonly"), 0);
}

// ---- an owner already present is not a fresh acquisition -----------------------

TEST(RedisOwners, AnOwnerAlreadyInTheHashIsBusyNotHandedTheSameToken) {
  RedisServer server;
  auto client = distlock::connect(server.url());
  auto& backend = distlock::detail::engine_of(client)->backend();
  distlock::detail::Error ec;
  const distlock::detail::AcquireRequest req{"dup", "0123456789abcdef0123456789abcdef:1", Millis(5000)};
  const auto first = backend.try_acquire(req, ec);
  ASSERT_FALSE(ec);
  ASSERT_TRUE(first.acquired);
  const auto second = backend.try_acquire(req, ec);
  ASSERT_FALSE(ec);
  EXPECT_FALSE(second.acquired) << "second acquisition by the same owner got token " << second.token
                                << " (first: " << first.token << ")";
  ASSERT_TRUE(second.holder_ttl.has_value());
  EXPECT_GT(second.holder_ttl->count(), 0);
  // One server hold, released by one release; nothing else changed.
  auto count = server.command({"HGET", "distlock:{dup}", std::string(req.owner)});
  EXPECT_EQ(std::string(count->str, count->len), "0");  // its entry: an acquisition that never queued
  EXPECT_EQ(backend.release("dup", req.owner, first.token, ec), distlock::detail::ReleaseStatus::released);
  EXPECT_EQ(server.command({"EXISTS", "distlock:{dup}"})->integer, 0);
  const auto third = backend.try_acquire(req, ec);
  ASSERT_TRUE(third.acquired);
  EXPECT_GT(third.token, first.token);
  backend.release("dup", req.owner, third.token, ec);
}

// ---- a failed watch ------------------------------------------------------------

// A connection of its own, opened before the server is full.
class Admin {
 public:
  explicit Admin(std::uint16_t port) : c_(redisConnect("127.0.0.1", port)) {
    if (c_ == nullptr || c_->err) throw std::runtime_error("admin connection failed");
  }
  ~Admin() { redisFree(c_); }
  distlock::testing::RedisReplyPtr cmd(std::vector<std::string> argv) {
    std::vector<const char*> p;
    std::vector<std::size_t> l;
    for (const auto& a : argv) {
      p.push_back(a.data());
      l.push_back(a.size());
    }
    return distlock::testing::RedisReplyPtr(
        static_cast<redisReply*>(redisCommandArgv(c_, static_cast<int>(p.size()), p.data(), l.data())));
  }
  long long info_field(const std::string& section, const std::string& field) {
    auto r = cmd({"INFO", section});
    const std::string text(r->str, r->len);
    const auto at = text.find(field + ":");
    return at == std::string::npos ? -1 : std::stoll(text.substr(at + field.size() + 1));
  }
  long long numsub(const std::string& channel) {
    return cmd({"PUBSUB", "NUMSUB", channel})->element[1]->integer;
  }

 private:
  redisContext* c_;
};

TEST(RedisWatch, AFailedWatchLeavesNothingBehindAndSaysWhy) {
  RedisServer server;
  Admin admin(server.port());
  auto client = distlock::connect(server.url("?timeout=500ms"));
  auto& backend = distlock::detail::engine_of(client)->backend();
  const std::string channel = "distlock:{full}:released";
  // A limit below the connections already open (the admin's, the client's pool):
  // those stay, the subscriber's new connection is refused with "max number of
  // clients reached".
  ASSERT_EQ(admin.cmd({"CONFIG", "SET", "maxclients", "1"})->type, REDIS_REPLY_STATUS);

  distlock::detail::Error ec;
  const auto start = Clock::now();
  backend.watch("full", ec);
  const auto took = std::chrono::duration_cast<Millis>(Clock::now() - start);
  EXPECT_EQ(ec, errc::backend_unavailable) << ec.message();
  const std::string why = ec.take_detail();
  EXPECT_NE(why.find("max number of clients"), std::string::npos) << why;
  EXPECT_LT(took, Millis(3000)) << "watch took " << took.count() << " ms";

  // Nothing is left wanting a subscription: no more connection attempts. The
  // subscriber's reconnect backoff is at most 1 s, so a leftover watch shows up as
  // several rejected connections within 3 s.
  const long long rejected = admin.info_field("stats", "rejected_connections");
  std::this_thread::sleep_for(3s);
  EXPECT_EQ(admin.info_field("stats", "rejected_connections"), rejected);

  // With room again, nothing is subscribed, and a new watch works and is undone.
  admin.cmd({"CONFIG", "SET", "maxclients", "10000"});
  EXPECT_EQ(admin.numsub(channel), 0);
  backend.watch("full", ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(admin.numsub(channel), 1);
  backend.unwatch("full");
  const auto end = Clock::now() + 5s;
  while (admin.numsub(channel) != 0 && Clock::now() < end) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(admin.numsub(channel), 0);
}

}  // namespace
}  // namespace distlock::testing
