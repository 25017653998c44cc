// Test support: a Sentinel-managed Redis group started by the test itself on free
// loopback ports in temporary directories: one master, replicas (`replicaof` the
// master, authenticated as the ACL user "repl", so a test can stall replication by
// switching that user off on the master) and sentinels (redis-sentinel) with a short down-after-milliseconds
// and failover-timeout, so a failover takes a few seconds. Every process is stopped by pid (RedisServer,
// Process).
//
// A missing redis-server or redis-sentinel binary is a test failure with a clear
// message (never a skip).
//
// Thread-safety: driven from the test's thread; the command helpers open their own
// connection per call and may be used from any thread.
//
// Example:
//   distlock::testing::RedisSentinelGroup group;
//   auto client = distlock::connect(group.url());        // redis+sentinel://.../mymaster
//   const auto old = group.master_port();
//   group.kill_master();                                 // SIGKILL
//   const auto now = group.wait_failover(old, 30s);      // every sentinel names `now`
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "support/local_server_process.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {

struct RedisSentinelOptions {
  int replicas = 2;
  int sentinels = 3;
  std::string master_name = "mymaster";
  int down_after_ms = 1000;
  int failover_timeout_ms = 3000;
  /// requirepass (and masterauth) of the data nodes; the sentinels get `auth-pass`
  /// but no password of their own.
  std::string password;
};

class RedisSentinelGroup {
 public:
  /// Starts everything and waits (up to 60 s) until every sentinel sees the master,
  /// its replicas in sync and the other sentinels. Throws std::runtime_error (after
  /// ADD_FAILURE) when a binary is missing or the group does not come up.
  /// Each sentinel is stopped by pid when the group goes, before the data nodes.
  explicit RedisSentinelGroup(RedisSentinelOptions opts = {});

  /// redis+sentinel://[:password@]127.0.0.1:s1,127.0.0.1:s2,.../<master>[suffix]
  std::string url(std::string_view suffix = {}) const;
  std::vector<std::uint16_t> sentinel_ports() const;
  /// The pid of sentinel i (for SIGSTOP/SIGCONT by a test).
  pid_t sentinel_pid(std::size_t i) const { return sentinels_.at(i)->pid(); }

  /// The data nodes: index 0 started as master, then the replicas.
  std::size_t nodes() const { return nodes_.size(); }
  RedisServer& node(std::size_t i) { return *nodes_.at(i); }
  /// The node listening on `port` (throws if none).
  RedisServer& node_at_port(std::uint16_t port);
  /// Cuts replication from the current master: its ACL user "repl" is switched off
  /// and the replicas' links are killed, so they cannot reconnect (the sentinels keep
  /// seeing a healthy master and replicas). Writes from now on reach no replica.
  void stall_replication();
  /// Switches "repl" on again on every live node and waits (up to 30 s) until the
  /// master has `replicas` connected replicas again.
  void resume_replication();

  /// The master's port as the first sentinel that answers names it.
  std::uint16_t master_port() const;
  RedisServer& master() { return node_at_port(master_port()); }
  /// SIGKILLs the current master; returns its port.
  std::uint16_t kill_master();
  /// Waits until every sentinel names a master other than `old_port` and that node
  /// answers ROLE with "master"; returns its port. Throws on timeout (with the logs).
  std::uint16_t wait_failover(std::uint16_t old_port, std::chrono::milliseconds timeout);
  /// After a manual failover (SENTINEL FAILOVER) the old master stays writable until the
  /// sentinels reconfigure it: a client that has not heard of the switch yet writes there,
  /// and that write is lost. Waits until the node at `old_port` answers ROLE as a replica
  /// (from then on it refuses writes, READONLY, and such a client is sent to the new
  /// master); false on timeout.
  bool wait_demoted(std::uint16_t old_port, std::chrono::milliseconds timeout);

  /// One command to sentinel i on a fresh connection; throws when unreachable.
  RedisReplyPtr sentinel_command(std::size_t i, const std::vector<std::string>& argv) const;
  /// The sentinels' logs (for failure messages).
  std::string sentinel_logs() const;

 private:
  bool ready(std::string& why) const;

  RedisSentinelOptions opts_;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
  // Declared after nodes_ so that the sentinels stop first.
  std::vector<std::unique_ptr<LocalServerProcess>> sentinels_;
};

}  // namespace distlock::testing
