// What the shard-group watch tests share (shard_group_watch_test.cpp,
// shard_group_watch_faults_test.cpp): members of one group on a redis-server, each with its
// own client, a 2 s TTL and a 100 ms period, and the checks on what they own.
//
//   Member a = join(server, "job", 16, "a");
//   ASSERT_TRUE(wait_until([&] { return balanced({&a, &b}, 16); }, kPeriod + kSlack));
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/eventually.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing::shard_watch {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

constexpr Millis kTtl = 2000ms;
constexpr Millis kPeriod = 100ms;
constexpr Millis kSlack = 1500ms;  // round trips of a release and an acquisition on a loaded 2-core machine
constexpr Millis kDeadline = 20s;  // outer bound of a wait that has no tighter one

inline bool wait_until(const std::function<bool()>& cond, Millis limit) {
  return eventually(cond, limit, 10ms) || cond();
}

inline std::int64_t ms_since(SteadyClock::time_point t) {
  return std::chrono::duration_cast<Millis>(SteadyClock::now() - t).count();
}

struct Member {
  Client client;
  ShardGroup group;
};

inline Member join(const RedisServer& server, const std::string& job, std::uint32_t shards,
                   const std::string& id) {
  Client c = connect(server.url());
  ShardGroupOptions o;
  o.lock.ttl = kTtl;
  o.rebalance_period = kPeriod;
  o.member_id = id;
  ShardGroup g = c.shard_group(job, shards, o);
  return Member{std::move(c), std::move(g)};
}

inline std::set<std::uint32_t> owned_by(const Member& m) {
  std::set<std::uint32_t> out;
  for (const auto& s : m.group.assigned().shards) out.insert(s.index);
  return out;
}

// Every shard owned by exactly one of `members`, each owning floor(M/W) or ceil(M/W).
inline bool balanced(const std::vector<Member*>& members, std::uint32_t shards) {
  std::multiset<std::uint32_t> owned;
  const auto w = static_cast<std::uint32_t>(members.size());
  for (auto* m : members) {
    const auto a = m->group.assigned();
    if (a.shards.size() < shards / w || a.shards.size() > (shards + w - 1) / w) return false;
    for (const auto& s : a.shards) owned.insert(s.index);
  }
  if (owned.size() != shards) return false;
  for (std::uint32_t i = 0; i < shards; ++i)
    if (owned.count(i) != 1) return false;
  return true;
}

// The ms from `t0` until `members` are balanced over `shards` (checked every 10 ms, up to
// kDeadline from now), or nullopt when they are not by then.
inline std::optional<std::int64_t> ms_until_balanced(const std::vector<Member*>& members,
                                                     std::uint32_t shards, SteadyClock::time_point t0) {
  if (!wait_until([&] { return balanced(members, shards); }, kDeadline)) return std::nullopt;
  return ms_since(t0);
}

// How many shards each of `members` owns, for a message: "a 3, b 2".
inline std::string owned_counts(const std::vector<Member*>& members) {
  std::string out;
  for (const Member* m : members) {
    if (!out.empty()) out += ", ";
    out += m->group.member_id() + " " + std::to_string(owned_by(*m).size());
  }
  return out;
}

}  // namespace distlock::testing::shard_watch
