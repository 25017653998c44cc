// The buffers a redis:// call reuses instead of allocating: Script::run's argument array (on
// the stack up to 24 arguments, on the heap beyond) and its copied SHA1, kept for the retry
// after NOSCRIPT; SharedConnection's per-thread format buffer when one thread alternates
// between two connections, one of them connecting meanwhile, with commands above the 64 KiB
// the buffer keeps. Against real redis-servers on loopback ports; every wait is bounded by
// the connections' command timeout.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "redis/connection.hpp"
#include "redis/shared_connection.hpp"
#include "support/redis_server.hpp"

namespace distlock::detail::redis {
namespace {

using distlock::testing::RedisServer;

ConnectionOptions opts_of(const RedisServer& server) {
  ConnectionOptions o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.connect_timeout = Millis(2000);
  o.command_timeout = Millis(5000);
  return o;
}

// Every key and argument back, in order, joined by '|': a mangled or shifted argument list
// (a stale view into a reused array, a wrong numkeys) shows in the reply.
const Script& echo_all() {
  static const Script& s = *new Script(R"lua(
local out = {}
for i = 1, #KEYS do out[#out + 1] = 'k' .. KEYS[i] end
for i = 1, #ARGV do out[#out + 1] = 'a' .. ARGV[i] end
return table.concat(out, '|')
)lua");
  return s;
}

// Script::run on both link kinds, with 3 to 40 arguments (the array on the stack and on the
// heap), each call after a SCRIPT FLUSH (so every call after the first meets NOSCRIPT and retries with the
// same array and the SHA1 copied again): the script sees exactly the keys and arguments given.
TEST(RedisScriptRunBuffers, EveryArgumentSurvivesTheNoscriptRetryOnTheStackAndOnTheHeap) {
  RedisServer server;
  SharedConnection shared(opts_of(server));
  Connection plain(opts_of(server));
  int calls = 0, heap_calls = 0;
  for (Link* link : {static_cast<Link*>(&shared), static_cast<Link*>(&plain)}) {
    for (std::size_t nkeys : {0u, 4u, 5u, 12u, 21u}) {
      for (std::size_t nargs : {0u, 3u, 6u, 19u}) {
        server.command({"SCRIPT", "FLUSH"});
        std::vector<std::string> keys, args;
        for (std::size_t i = 0; i < nkeys; ++i)
          keys.push_back("{t}key" + std::to_string(i) + std::string(i, 'x'));
        for (std::size_t i = 0; i < nargs; ++i)
          args.push_back("arg" + std::to_string(i) + std::string(2 * i, 'y'));
        const std::vector<std::string_view> kv(keys.begin(), keys.end()), av(args.begin(), args.end());
        std::string want;
        for (const auto& k : keys) want += (want.empty() ? "k" : "|k") + k;
        for (const auto& a : args) want += (want.empty() ? "a" : "|a") + a;
        Error ec;
        Reply r = echo_all().run(*link, kv, av, ec);
        ASSERT_FALSE(ec) << ec.detail();
        ASSERT_TRUE(r);
        EXPECT_EQ(reply_str(r.get()), want) << nkeys << " keys, " << nargs << " args";
        ++calls;
        if (3 + nkeys + nargs > 24) ++heap_calls;
      }
    }
  }
  EXPECT_EQ(calls, 40);
  EXPECT_GE(heap_calls, 10);
  // Every call but the first (which loads the script before its EVALSHA) met NOSCRIPT once
  // (the server's error count): each retry was exercised.
  const auto info = server.command({"INFO", "errorstats"});
  const std::string text = info ? std::string(info->str, info->len) : std::string();
  EXPECT_NE(text.find("errorstat_NOSCRIPT:count=39\r"), std::string::npos) << text;
}

// One thread alternates between connections to two servers; the second server restarts
// every 25 calls, so that connection reconnects (AUTH-less connect, then the formatted
// call) in the middle of the thread's sequence. Four such threads at once, every fourth
// command above 64 KiB (the per-thread buffer is dropped and grown again). Each reply is
// the command's own payload: nothing formatted for one connection reaches the other.
TEST(RedisSharedConnectionBuffers, OneThreadOnTwoConnectionsKeepsEachCommandWithItsConnection) {
  RedisServer a, b;
  SharedConnection on_a(opts_of(a)), on_b(opts_of(b));
  constexpr int kThreads = 4, kCalls = 100;
  std::vector<int> wrong(kThreads, 0), ok(kThreads, 0), failed(kThreads, 0);
  std::vector<std::string> first_wrong(kThreads);
  for (int round = 0; round < 4; ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kCalls / 4; ++i) {
          for (SharedConnection* c : {&on_a, &on_b}) {
            const std::string tag = (c == &on_a ? "A" : "B") + std::to_string(t) + "-" +
                                    std::to_string(round) + "-" + std::to_string(i);
            const std::string payload = i % 4 == 0 ? tag + std::string(70 * 1024, 'z') : tag;
            Error ec;
            Reply r = c->command({"ECHO", payload}, ec);
            if (ec) {
              ++failed[t];  // counted, not expected: no call is in flight across a restart
            } else if (reply_str(r.get()) != payload) {
              if (wrong[t]++ == 0) first_wrong[t] = std::string(reply_str(r.get()).substr(0, 40));
            } else {
              ++ok[t];
            }
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    b.restart();  // the next round's first call on `on_b` connects again
  }
  int oks = 0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(wrong[t], 0) << "thread " << t << " first wrong reply " << first_wrong[t];
    oks += ok[t];
  }
  EXPECT_GE(on_b.stats().connects, 4u);  // it reconnected after each restart
  EXPECT_GE(oks, kThreads * kCalls * 2 * 9 / 10);
}

}  // namespace
}  // namespace distlock::detail::redis
