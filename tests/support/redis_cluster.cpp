#include "support/redis_cluster.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "rediscluster/cluster_backend.hpp"

namespace distlock::testing {

namespace {

constexpr int kSlots = 16384;

std::string str(const redisReply* r) {
  return r && r->str ? std::string(r->str, r->len) : std::string();
}

void expect_ok(const RedisReplyPtr& r, const std::string& what) {
  if (!r || r->type == REDIS_REPLY_ERROR) {
    const std::string msg = what + " failed: " + (r ? str(r.get()) : std::string("no reply"));
    ADD_FAILURE() << msg;
    throw std::runtime_error(msg);
  }
}

}  // namespace

RedisCluster::RedisCluster(int masters, bool appendonly) {
  for (int i = 0; i < masters; ++i) {
    RedisServerOptions o;
    o.appendonly = appendonly;
    // The cluster bus listens on a port of its own (by default port + 10000, which
    // does not exist above 55535 and may be taken).
    bus_ports_.push_back(free_port());
    o.extra_args = {"--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    std::to_string(bus_ports_.back()),
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-require-full-coverage",
                    "no"};
    nodes_.push_back(std::make_unique<RedisServer>(o));
    dead_.push_back(false);
  }
  for (int i = 0; i < masters; ++i) {
    auto id = nodes_[i]->command({"CLUSTER", "MYID"});
    expect_ok(id, "CLUSTER MYID");
    ids_.push_back(str(id.get()));
    const int from = kSlots * i / masters, to = kSlots * (i + 1) / masters - 1;
    expect_ok(nodes_[i]->command({"CLUSTER", "ADDSLOTSRANGE", std::to_string(from), std::to_string(to)}),
              "CLUSTER ADDSLOTSRANGE");
  }
  for (int i = 1; i < masters; ++i) {
    expect_ok(nodes_[0]->command({"CLUSTER", "MEET", "127.0.0.1", std::to_string(nodes_[i]->port()),
                                  std::to_string(bus_ports_[i])}),
              "CLUSTER MEET");
  }
  wait_ok("the cluster did not form");
}

void RedisCluster::wait_ok(const std::string& why) const {
  // Every live node says ok and maps every slot to a node that agrees (bounded: 30 s).
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string last;
  for (int round = 0; round < 3000 && std::chrono::steady_clock::now() < end; ++round) {
    bool all = true;
    for (std::size_t i = 0; i < nodes_.size() && all; ++i) {
      if (dead_[i]) continue;
      auto info = nodes_[i]->command({"CLUSTER", "INFO"});
      const std::string text = str(info.get());
      if (text.find("cluster_state:ok") == std::string::npos ||
          text.find("cluster_slots_assigned:16384") == std::string::npos ||
          text.find("cluster_known_nodes:" + std::to_string(nodes_.size())) == std::string::npos) {
        all = false;
        last = "node " + std::to_string(i) + ": " + text.substr(0, 200);
      }
    }
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string logs;
  for (auto& n : nodes_) logs += n->log();
  const std::string msg = why + " within 30 s (" + last + "); logs:\n" + logs;
  ADD_FAILURE() << msg;
  throw std::runtime_error(msg);
}

std::string RedisCluster::url(std::string_view suffix) const {
  std::string u = "redis+cluster://";
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (i) u += ",";
    u += "127.0.0.1:" + std::to_string(nodes_[i]->port());
  }
  return u + std::string(suffix);
}

std::string RedisCluster::url_of(int i, std::string_view suffix) const {
  return "redis+cluster://127.0.0.1:" + std::to_string(nodes_.at(i)->port()) + std::string(suffix);
}

int RedisCluster::owner_of(std::uint16_t slot) const {
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    if (dead_[n]) continue;
    auto slots = nodes_[n]->command({"CLUSTER", "SLOTS"});
    for (std::size_t i = 0; slots && i < slots->elements; ++i) {
      const redisReply* e = slots->element[i];
      if (e->element[0]->integer <= slot && slot <= e->element[1]->integer) {
        const long long port = e->element[2]->element[1]->integer;
        for (std::size_t j = 0; j < nodes_.size(); ++j) {
          if (nodes_[j]->port() == port) return static_cast<int>(j);
        }
      }
    }
    return -1;
  }
  return -1;
}

std::string RedisCluster::name_on(int i, const std::string& stem, int seq) const {
  int found = 0;
  for (int n = 0; n < 100000; ++n) {
    const std::string name = stem + "-" + std::to_string(n);
    if (owner_of(slot_of(name)) == i && found++ == seq) return name;
  }
  throw std::runtime_error("no name found for node " + std::to_string(i));
}

std::string RedisCluster::nat_through(int i, std::uint16_t proxy_port) const {
  return "?nat=127.0.0.1:" + std::to_string(nodes_.at(i)->port()) +
         "=127.0.0.1:" + std::to_string(proxy_port);
}

void RedisCluster::begin_move(std::uint16_t slot, int from, int to) {
  const std::string s = std::to_string(slot);
  expect_ok(nodes_[to]->command({"CLUSTER", "SETSLOT", s, "IMPORTING", ids_[from]}), "SETSLOT IMPORTING");
  expect_ok(nodes_[from]->command({"CLUSTER", "SETSLOT", s, "MIGRATING", ids_[to]}), "SETSLOT MIGRATING");
}

void RedisCluster::migrate_keys(std::uint16_t slot, int from, int to) {
  for (int round = 0; round < 1000; ++round) {
    auto keys = nodes_[from]->command({"CLUSTER", "GETKEYSINSLOT", std::to_string(slot), "100"});
    expect_ok(keys, "CLUSTER GETKEYSINSLOT");
    if (keys->elements == 0) return;
    std::vector<std::string> argv{"MIGRATE", "127.0.0.1", std::to_string(nodes_[to]->port()), "", "0",
                                  "5000",    "KEYS"};
    for (std::size_t i = 0; i < keys->elements; ++i) argv.push_back(str(keys->element[i]));
    expect_ok(nodes_[from]->command(argv), "MIGRATE");
  }
  ADD_FAILURE() << "keys of slot " << slot << " did not all migrate";
}

void RedisCluster::finish_move(std::uint16_t slot, int from, int to) {
  const std::string s = std::to_string(slot);
  expect_ok(nodes_[to]->command({"CLUSTER", "SETSLOT", s, "NODE", ids_[to]}), "SETSLOT NODE (target)");
  expect_ok(nodes_[from]->command({"CLUSTER", "SETSLOT", s, "NODE", ids_[to]}), "SETSLOT NODE (source)");
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (static_cast<int>(i) == from || static_cast<int>(i) == to || dead_[i]) continue;
    expect_ok(nodes_[i]->command({"CLUSTER", "SETSLOT", s, "NODE", ids_[to]}), "SETSLOT NODE (other)");
  }
}

void RedisCluster::move_slot(std::uint16_t slot, int from, int to) {
  begin_move(slot, from, to);
  migrate_keys(slot, from, to);
  finish_move(slot, from, to);
}

void RedisCluster::kill(int i) {
  nodes_.at(i)->kill();
  dead_.at(i) = true;
}

void RedisCluster::restart(int i) {
  nodes_.at(i)->restart();
  dead_.at(i) = false;
  wait_ok("node " + std::to_string(i) + " did not rejoin");
}

std::vector<std::string> RedisCluster::leftovers(bool skip_fences) const {
  std::vector<std::string> out;
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    if (dead_[n]) continue;
    const std::string port = std::to_string(nodes_[n]->port());
    auto keys = nodes_[n]->command({"KEYS", "*"});
    for (std::size_t i = 0; keys && i < keys->elements; ++i) {
      const std::string k = str(keys->element[i]);
      // Fence counters outlive every holder by design: tokens never go back.
      const bool fence = (k.size() >= 6 && k.compare(k.size() - 6, 6, ":fence") == 0) ||
                         (k.find("}:f:") != std::string::npos && k.find("{#") != std::string::npos);
      if (!(skip_fences && fence)) out.push_back(port + ": key " + k);
    }
    auto ch = nodes_[n]->command({"PUBSUB", "SHARDCHANNELS", "*"});
    for (std::size_t i = 0; ch && i < ch->elements; ++i)
      out.push_back(port + ": channel " + str(ch->element[i]));
    auto plain = nodes_[n]->command({"PUBSUB", "CHANNELS", "*"});
    for (std::size_t i = 0; plain && i < plain->elements; ++i) {
      out.push_back(port + ": channel " + str(plain->element[i]));
    }
  }
  return out;
}

std::uint16_t slot_of(const std::string& name) {
  return distlock::detail::rediscluster::keys_of("distlock", name).slot;
}

}  // namespace distlock::testing
