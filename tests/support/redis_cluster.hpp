// Test support: a Redis Cluster of N masters (no replicas) started by the test
// itself: N redis-servers with cluster-enabled yes on free loopback ports in
// temporary directories (tests/support/redis_server.hpp), the 16384 slots split
// evenly with CLUSTER ADDSLOTSRANGE, joined with CLUSTER MEET, and ready once every
// node says cluster_state:ok and maps every slot (bounded polling). Stopped by pid.
//
// cluster-require-full-coverage is off, so the slots of a killed master fail while
// the other masters keep serving theirs.
//
// Resharding helpers move one slot the way redis-cli --cluster reshard does:
// SETSLOT IMPORTING on the target, MIGRATING on the source, MIGRATE of its keys,
// SETSLOT NODE on every node.
//
// A missing redis-server is a test failure with a clear message (never a skip).
//
// Example:
//   distlock::testing::RedisCluster cluster(3);
//   auto client = distlock::connect(cluster.url());
//   const int owner = cluster.owner_of(slot);
//   cluster.move_slot(slot, owner, (owner + 1) % 3);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "support/redis_server.hpp"

namespace distlock::testing {

class RedisCluster {
 public:
  /// `appendonly`: appendonly yes / appendfsync always, so restart() keeps the keys.
  explicit RedisCluster(int masters = 3, bool appendonly = false);
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  /// redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...[suffix]
  std::string url(std::string_view suffix = {}) const;
  /// redis+cluster:// naming node `i` only (the others are found from its map).
  std::string url_of(int i, std::string_view suffix = {}) const;
  int size() const { return static_cast<int>(nodes_.size()); }
  RedisServer& node(int i) { return *nodes_.at(i); }
  const std::string& node_id(int i) const { return ids_.at(i); }

  /// The index of the master serving `slot` as node 0 sees it (-1: none).
  int owner_of(std::uint16_t slot) const;
  /// A name without braces whose slot node `i` serves, distinct per `seq`.
  std::string name_on(int i, const std::string& stem, int seq = 0) const;
  /// "?nat=127.0.0.1:<node i's port>=127.0.0.1:<proxy_port>": the query of a url() whose
  /// client reaches node `i` through a proxy listening on `proxy_port` (further keys follow
  /// with '&').
  std::string nat_through(int i, std::uint16_t proxy_port) const;

  /// Resharding one slot, in steps (a test can act between them) or at once.
  void begin_move(std::uint16_t slot, int from, int to);
  void migrate_keys(std::uint16_t slot, int from, int to);
  void finish_move(std::uint16_t slot, int from, int to);
  void move_slot(std::uint16_t slot, int from, int to);

  /// SIGKILL of node `i` (its slots are then served by nobody).
  void kill(int i);
  /// Starts node `i` again on its port and directory (its nodes.conf brings back its
  /// id and slots) and waits until every node says cluster_state:ok again.
  void restart(int i);
  /// Keys (fence counters excluded when asked) and shard channels on every live node,
  /// one "port: key k" / "port: channel c" per entry.
  std::vector<std::string> leftovers(bool skip_fences = true) const;

 private:
  void wait_ok(const std::string& why) const;

  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::vector<std::string> ids_;
  std::vector<std::uint16_t> bus_ports_;
  std::vector<bool> dead_;
};

/// The slot of lock `name` (under the prefix "distlock").
std::uint16_t slot_of(const std::string& name);

}  // namespace distlock::testing
