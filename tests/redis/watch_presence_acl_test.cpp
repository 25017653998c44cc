// The watcher-presence key "<prefix>:watching" (src/redis/redis_watch.cpp) read by every
// redis:// lock script, against a real redis-server with an ACL user whose key pattern
// covers the keys of names only ("<prefix>:{*": every key of a name, its queue, fence
// counter, lock-delay marker and revoke note; docs/redis.md). Such a user never watches;
// the lock contract must hold for it as it did before the watch existed: acquire,
// release and revoke succeed and leave nothing behind. A watch by that user is refused with
// an error naming the presence key, never the password. A user refused the events channel
// locks as before too; the watches of others get a gap for what it could not publish.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <system_error>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kUserPassword = "n4mesOnlyPw";

// An ACL user limited to the keys of names under the default prefix, every channel.
std::string names_only_url(RedisServer& server) {
  auto r = server.command(
      {"ACL", "SETUSER", "names", "on", std::string(">") + kUserPassword, "~distlock:{*", "&*", "+@all"});
  EXPECT_EQ(distlock::testing::reply_str(r), "OK");
  return "redis://names:" + std::string(kUserPassword) + "@127.0.0.1:" + std::to_string(server.port());
}

TEST(RedisWatchPresenceKey, AUserLimitedToTheKeysOfNamesAcquiresReleasesAndRevokes) {
  RedisServer server;
  const std::string url = names_only_url(server);
  Client a = distlock::connect(url);
  Client b = distlock::connect(url);

  std::uint64_t first = 0;
  {
    Lease l = a.acquire("job", ttl_of(10s, 0ms));
    first = l.token();
    EXPECT_GT(first, 0u);
  }
  // Released: the lock key is gone, the next acquire gets a greater token.
  EXPECT_EQ(server.command({"EXISTS", "distlock:{job}"})->integer, 0);
  Lease held = a.acquire("job", ttl_of(10s, 0ms));
  EXPECT_GT(held.token(), first);

  // Revoke by another client of the same user: the holder's field leaves the lock.
  distlock::RevokeResult rv = b.revoke("job", "maintenance");
  EXPECT_TRUE(rv.revoked);
  EXPECT_EQ(rv.token, held.token());
}

TEST(RedisWatchPresenceKey, AWatchByAUserDeniedThePresenceKeyIsRefusedNamingTheKey) {
  RedisServer server;
  Client c = distlock::connect(names_only_url(server));
  try {
    distlock::Watch w = c.watch("job");
    ADD_FAILURE() << "a watch started without the watcher-presence key";
  } catch (const std::system_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("distlock:watching"), std::string::npos) << what;
    EXPECT_EQ(what.find(kUserPassword), std::string::npos) << what;
  }
}

// A watch by a user with every key (the presence key exists) sees the changes made by the
// user denied that key: its scripts cannot tell whether anyone watches, so they publish.
TEST(RedisWatchPresenceKey, AWatchSeesTheChangesOfAUserDeniedThePresenceKey) {
  RedisServer server;
  Client watcher = distlock::connect(server.url());
  distlock::Watch w = watcher.watch("job", distlock::WatchOptions{.initial_state = false});
  Client c = distlock::connect(names_only_url(server));
  std::uint64_t token = 0;
  {
    Lease l = c.acquire("job", ttl_of(10s, 0ms));
    token = l.token();
  }
  std::vector<std::string> seen;
  for (int i = 0; i < 2; ++i) {
    auto e = w.next(Millis(10000));  // bound: 10 s on the steady clock per event
    ASSERT_TRUE(e) << "event " << i << " not delivered within 10 s";
    seen.push_back(std::string(distlock::to_string(e->kind)) + " " + e->name + " " +
                   std::to_string(e->token));
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"acquired job " + std::to_string(token),
                                            "released job " + std::to_string(token)}));
}

// An ACL user allowed every key but only the channels the lock scripts used before the
// watch ("<prefix>:grant:*" and "<prefix>:{*"), while another user's watch runs: the
// PUBLISH on "<prefix>:events" is refused. The lock operation must still succeed and
// leave nothing held, and the watch must hear of what it missed (a gap), not nothing.
TEST(RedisWatchPresenceKey, AUserDeniedTheEventsChannelStillLocksAndTheWatchGetsAGap) {
  RedisServer server;
  Client watcher = distlock::connect(server.url());
  distlock::Watch w = watcher.watch("job", distlock::WatchOptions{.initial_state = false});
  auto r = server.command({"ACL", "SETUSER", "chan", "on", std::string(">") + kUserPassword, "~distlock:*",
                           "&distlock:grant:*", "&distlock:{*", "+@all"});
  ASSERT_EQ(distlock::testing::reply_str(r), "OK");
  Client c = distlock::connect("redis://chan:" + std::string(kUserPassword) +
                               "@127.0.0.1:" + std::to_string(server.port()));
  {
    Lease l = c.acquire("job", ttl_of(10s, 0ms));
    EXPECT_GT(l.token(), 0u);
  }
  EXPECT_EQ(server.command({"EXISTS", "distlock:{job}"})->integer, 0) << "the release left the lock held";
  // Bound: the watch renews the presence key every 5 s; 15 s on the steady clock.
  bool gap = false;
  const auto end = std::chrono::steady_clock::now() + 15s;
  while (!gap && std::chrono::steady_clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - std::chrono::steady_clock::now()));
    if (!e) break;
    gap = e->kind == distlock::WatchEventKind::gap;
  }
  EXPECT_TRUE(gap) << "the changes the events channel refused were never reported as a gap";
}

}  // namespace
}  // namespace distlock::testing
