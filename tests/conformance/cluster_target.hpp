// The Redis Cluster kind of the conformance suite: a 3-master cluster
// (tests/support/redis_cluster.hpp) behind redis+cluster://. A template over the
// suite's `Target` interface (wherever that is defined), instantiated in
// conformance_test.cpp as RedisClusterTarget<Target>.
//
// Leftovers are the keys (fence counters excepted) and the channels, plain and
// sharded, on every node. Through fault proxies the URL names the proxies and maps
// every node's announced address to its proxy (`nat=`), so the slot map and the
// redirections lead through the proxies too.
#pragma once

#include <string>
#include <vector>

#include "support/redis_cluster.hpp"

namespace distlock::testing {

template <class Target>
class RedisClusterTarget final : public Target {
 public:
  std::string url() override { return cluster_.url(); }
  std::vector<std::string> leftovers() override { return cluster_.leftovers(); }
  std::vector<std::uint16_t> ports() override {
    std::vector<std::uint16_t> out;
    for (int i = 0; i < cluster_.size(); ++i) out.push_back(cluster_.node(i).port());
    return out;
  }
  std::string url_via(const std::string& hosts) override {
    std::string nat;
    std::size_t at = 0;
    for (auto port : ports()) {
      const auto comma = hosts.find(',', at);
      if (!nat.empty()) nat += ",";
      nat += "127.0.0.1:" + std::to_string(port) + "=" + hosts.substr(at, comma - at);
      at = comma == std::string::npos ? hosts.size() : comma + 1;
    }
    return "redis+cluster://" + hosts + "?nat=" + nat;
  }

 private:
  RedisCluster cluster_{3};
};

/// The same cluster for the nemesis run (tests/nemesis/nemesis_test.cpp), a
/// template over its `Servers` interface: appendonly on, so a killed and restarted
/// master comes back with its locks and fence counters.
template <class Servers>
class RedisClusterServers final : public Servers {
 public:
  std::vector<std::uint16_t> ports() override {
    std::vector<std::uint16_t> out;
    for (int i = 0; i < cluster_.size(); ++i) out.push_back(cluster_.node(i).port());
    return out;
  }
  std::string url_via(const std::string& hosts) override {
    if (hosts.empty()) return cluster_.url();
    std::string nat;
    std::size_t at = 0;
    for (auto port : ports()) {
      const auto comma = hosts.find(',', at);
      if (!nat.empty()) nat += ",";
      nat += "127.0.0.1:" + std::to_string(port) + "=" + hosts.substr(at, comma - at);
      at = comma == std::string::npos ? hosts.size() : comma + 1;
    }
    return "redis+cluster://" + hosts + "?nat=" + nat;
  }
  void pause(int m) override { cluster_.node(m).pause(); }
  void resume(int m) override { cluster_.node(m).resume(); }
  void kill_and_restart(int m) override {
    cluster_.kill(m);
    cluster_.restart(m);
  }

 private:
  RedisCluster cluster_{3, true};
};

}  // namespace distlock::testing
