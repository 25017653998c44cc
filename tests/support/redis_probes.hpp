// Read-only probes the Redis-family tests (redis://, redis+sentinel://, redis+cluster://,
// redlock://, and the CLI over them) make of a server or a client, written once:
//
//   EXPECT_TRUE(key_exists(server, "distlock:{job}"));
//   EXPECT_EQ(server_holder(server, "job"), lease_owner);
//   ASSERT_TRUE(eventually([&] { return subscribers(server, channel) == 1; }, 10s));
//
// Each probe opens its own connection (RedisServer::command) and may be used from any thread.
#pragma once

#include <hiredis/hiredis.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/redis_server.hpp"
#include "support/thrown.hpp"

namespace distlock::testing {

/// Whether `key` exists on `node`; false also when the server gives no integer reply.
inline bool key_exists(const RedisServer& node, const std::string& key) {
  auto r = node.command({"EXISTS", key});
  return r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

/// The length of the list `key` on `node` (a wait queue's entries: LLEN), -1 without an integer reply.
inline long long list_length(const RedisServer& node, const std::string& key) {
  auto r = node.command({"LLEN", key});
  return r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
}

/// The elements of the list `key` on `node` (a wait queue's entries: LRANGE 0 -1), empty without
/// an array reply.
inline std::vector<std::string> list_entries(const RedisServer& node, const std::string& key) {
  std::vector<std::string> out;
  auto r = node.command({"LRANGE", key, "0", "-1"});
  if (!r || r->type != REDIS_REPLY_ARRAY) return out;
  for (std::size_t i = 0; i < r->elements; ++i) out.emplace_back(r->element[i]->str, r->element[i]->len);
  return out;
}

/// The holder field of redis://'s lock hash `distlock:{name}` (every field but `@token`), or ""
/// when the name is free or the server gives no array reply.
inline std::string server_holder(const RedisServer& node, const std::string& name) {
  auto r = node.command({"HKEYS", "distlock:{" + name + "}"});
  if (!r || r->type != REDIS_REPLY_ARRAY) return {};
  for (std::size_t i = 0; i < r->elements; ++i) {
    std::string f(r->element[i]->str, r->element[i]->len);
    if (f != "@token") return f;
  }
  return {};
}

/// Subscribers of the pub/sub `channel` on `node` (PUBSUB NUMSUB), -1 without a reply.
inline long long subscribers(const RedisServer& node, const std::string& channel) {
  auto r = node.command({"PUBSUB", "NUMSUB", channel});
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) return -1;
  return r->element[1]->integer;
}

/// Subscribers of the sharded pub/sub `channel` on `node` (PUBSUB SHARDNUMSUB), -1 without a reply.
inline long long shard_subscribers(const RedisServer& node, const std::string& channel) {
  auto r = node.command({"PUBSUB", "SHARDNUMSUB", channel});
  return r && r->elements == 2 ? r->element[1]->integer : -1;
}

/// The waiters `c.status(name)` reports; ~0 when the backend does not count them.
inline std::uint64_t waiters_of(Client& c, const std::string& name) {
  return c.status(name).waiters.value_or(~0ull);
}

/// What `connect(url)` (with a quiet logger) throws: its code and message (support/thrown.hpp);
/// an empty code and "connect succeeded" when it throws none.
inline std::pair<std::error_code, std::string> connect_outcome(const std::string& url) {
  std::string what = "connect succeeded";
  const std::error_code ec = code_of([&] { (void)connect(url, quiet()); }, &what);
  return {ec, what};
}

}  // namespace distlock::testing
