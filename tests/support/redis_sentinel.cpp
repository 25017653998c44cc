#include "support/redis_sentinel.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/harness_setup.hpp"

namespace distlock::testing {

namespace {

std::string field(const redisReply* entry, std::string_view name) {
  // SENTINEL replicas/sentinels answer one flat array of name/value pairs per entry.
  if (entry == nullptr || entry->type != REDIS_REPLY_ARRAY) return {};
  for (std::size_t i = 0; i + 1 < entry->elements; i += 2) {
    if (std::string_view(entry->element[i]->str, entry->element[i]->len) == name) {
      return std::string(entry->element[i + 1]->str, entry->element[i + 1]->len);
    }
  }
  return {};
}

}  // namespace

RedisSentinelGroup::RedisSentinelGroup(RedisSentinelOptions opts) : opts_(std::move(opts)) {
  require_program("redis-sentinel", "Sentinel tests", "redis-sentinel");
  // Replicas log in as "repl" (every node has it: any of them may become master).
  RedisServerOptions base;
  base.password = opts_.password;
  base.acl_user = "repl";
  base.acl_password = "replpw";
  base.extra_args = {"--masteruser", "repl", "--masterauth", "replpw"};
  nodes_.push_back(std::make_unique<RedisServer>(base));
  const std::uint16_t master = nodes_[0]->port();
  for (int i = 0; i < opts_.replicas; ++i) {
    RedisServerOptions r = base;
    r.extra_args.insert(r.extra_args.end(), {"--replicaof", "127.0.0.1", std::to_string(master)});
    nodes_.push_back(std::make_unique<RedisServer>(r));
  }
  const int quorum = opts_.sentinels / 2 + 1;
  for (int i = 0; i < opts_.sentinels; ++i) {
    auto s = std::make_unique<LocalServerProcess>("distlock-sentinel");
    s->pick_free_port();
    const auto conf = s->dir() / "sentinel.conf";
    {
      std::ofstream out(conf);
      out << "port " << s->port() << "\nbind 127.0.0.1\ndaemonize no\ndir " << s->dir().string()
          << "\nsentinel monitor " << opts_.master_name << " 127.0.0.1 " << master << " " << quorum
          << "\nsentinel down-after-milliseconds " << opts_.master_name << " " << opts_.down_after_ms
          << "\nsentinel failover-timeout " << opts_.master_name << " " << opts_.failover_timeout_ms
          << "\nsentinel parallel-syncs " << opts_.master_name << " 1\n";
      if (!opts_.password.empty())
        out << "sentinel auth-pass " << opts_.master_name << " " << opts_.password << "\n";
    }
    s->launch({"redis-sentinel", conf.string()}, "sentinel.log");
    if (!wait_port_open(s->port(), std::chrono::seconds(10))) {
      const std::string msg =
          "redis-sentinel did not start on port " + std::to_string(s->port()) + "; log:\n" + sentinel_logs();
      sentinels_.push_back(std::move(s));
      fail_setup(msg);
    }
    sentinels_.push_back(std::move(s));
  }
  // Sentinels find the replicas through the master's INFO and each other through
  // hello messages every 2 s: wait until all of that is known everywhere.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string why;
  while (std::chrono::steady_clock::now() < end) {
    if (ready(why)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string msg = "the sentinel group did not come up: " + why + "\n" + sentinel_logs();
  fail_setup(msg);
}

bool RedisSentinelGroup::ready(std::string& why) const {
  try {
    for (std::size_t i = 0; i < sentinels_.size(); ++i) {
      auto replicas = sentinel_command(i, {"SENTINEL", "replicas", opts_.master_name});
      int in_sync = 0;
      for (std::size_t k = 0; replicas && replicas->type == REDIS_REPLY_ARRAY && k < replicas->elements;
           ++k) {
        const auto* e = replicas->element[k];
        if (field(e, "flags") == "slave" && field(e, "master-link-status") == "ok") ++in_sync;
      }
      if (in_sync < opts_.replicas) {
        why = "sentinel " + std::to_string(i) + " sees " + std::to_string(in_sync) + " replicas in sync";
        return false;
      }
      auto others = sentinel_command(i, {"SENTINEL", "sentinels", opts_.master_name});
      const std::size_t n = others && others->type == REDIS_REPLY_ARRAY ? others->elements : 0;
      if (n + 1 < sentinels_.size()) {
        why = "sentinel " + std::to_string(i) + " knows " + std::to_string(n) + " other sentinels";
        return false;
      }
    }
    return true;
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
}

std::string RedisSentinelGroup::url(std::string_view suffix) const {
  std::string u = "redis+sentinel://";
  if (!opts_.password.empty()) u += ":" + opts_.password + "@";
  for (std::size_t i = 0; i < sentinels_.size(); ++i) {
    if (i) u += ",";
    u += "127.0.0.1:" + std::to_string(sentinels_[i]->port());
  }
  u += "/" + opts_.master_name;
  u += suffix;
  return u;
}

std::vector<std::uint16_t> RedisSentinelGroup::sentinel_ports() const {
  std::vector<std::uint16_t> out;
  for (const auto& s : sentinels_) out.push_back(s->port());
  return out;
}

RedisServer& RedisSentinelGroup::node_at_port(std::uint16_t port) {
  for (auto& n : nodes_) {
    if (n->port() == port) return *n;
  }
  throw std::runtime_error("no data node listens on port " + std::to_string(port));
}

std::uint16_t RedisSentinelGroup::master_port() const {
  std::string errors;
  for (std::size_t i = 0; i < sentinels_.size(); ++i) {
    try {
      auto r = sentinel_command(i, {"SENTINEL", "get-master-addr-by-name", opts_.master_name});
      if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
        return static_cast<std::uint16_t>(std::stoi(std::string(r->element[1]->str, r->element[1]->len)));
      }
    } catch (const std::exception& e) {
      errors += std::string(e.what()) + "; ";
    }
  }
  throw std::runtime_error("no sentinel names a master: " + errors);
}

std::uint16_t RedisSentinelGroup::kill_master() {
  const std::uint16_t port = master_port();
  node_at_port(port).kill();
  return port;
}

std::uint16_t RedisSentinelGroup::wait_failover(std::uint16_t old_port, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  std::string why;
  while (std::chrono::steady_clock::now() < end) {
    try {
      std::uint16_t agreed = 0;
      bool all = true;
      for (std::size_t i = 0; i < sentinels_.size() && all; ++i) {
        auto r = sentinel_command(i, {"SENTINEL", "get-master-addr-by-name", opts_.master_name});
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
          all = false;
          break;
        }
        const auto p =
            static_cast<std::uint16_t>(std::stoi(std::string(r->element[1]->str, r->element[1]->len)));
        if (p == old_port || (agreed != 0 && p != agreed)) all = false;
        agreed = p;
      }
      if (all && agreed != 0) {
        auto role = node_at_port(agreed).command({"ROLE"});
        if (role && role->type == REDIS_REPLY_ARRAY && role->elements > 0 &&
            std::string_view(role->element[0]->str, role->element[0]->len) == "master") {
          return agreed;
        }
        why = "port " + std::to_string(agreed) + " does not answer ROLE master yet";
      } else {
        why = "the sentinels do not agree on a new master yet";
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string msg =
      "no failover within " + std::to_string(timeout.count()) + " ms: " + why + "\n" + sentinel_logs();
  fail_setup(msg);
}

bool RedisSentinelGroup::wait_demoted(std::uint16_t old_port, std::chrono::milliseconds timeout) {
  RedisServer& old_master = node_at_port(old_port);
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    try {
      auto role = old_master.command({"ROLE"});
      if (role && role->type == REDIS_REPLY_ARRAY && role->elements > 0 &&
          std::string_view(role->element[0]->str, role->element[0]->len) != "master") {
        return true;
      }
    } catch (const std::runtime_error&) {
      // The demotion itself kills the node's clients (Sentinel sends CLIENT KILL TYPE
      // normal with REPLICAOF), this ROLE probe's connection among them: ask again.
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

void RedisSentinelGroup::stall_replication() {
  RedisServer& m = master();
  m.command({"ACL", "SETUSER", "repl", "off"});
  m.command({"CLIENT", "KILL", "USER", "repl"});
}

void RedisSentinelGroup::resume_replication() {
  for (auto& n : nodes_) {
    if (n->running()) n->command({"ACL", "SETUSER", "repl", "on"});
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string info;
  while (std::chrono::steady_clock::now() < end) {
    auto r = master().command({"INFO", "replication"});
    info = r && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : std::string();
    if (info.find("connected_slaves:" + std::to_string(opts_.replicas)) != std::string::npos) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string msg = "replication did not resume within 30 s:\n" + info;
  fail_setup(msg);
}

RedisReplyPtr RedisSentinelGroup::sentinel_command(std::size_t i,
                                                   const std::vector<std::string>& argv) const {
  const std::uint16_t port = sentinels_.at(i)->port();
  timeval tv{5, 0};
  std::unique_ptr<redisContext, RedisContextDeleter> c(redisConnectWithTimeout("127.0.0.1", port, tv));
  if (!c || c->err)
    throw std::runtime_error("cannot connect to redis-sentinel on port " + std::to_string(port));
  redisSetTimeout(c.get(), tv);
  std::vector<const char*> ptrs;
  std::vector<std::size_t> lens;
  for (const auto& a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  RedisReplyPtr r(static_cast<redisReply*>(
      redisCommandArgv(c.get(), static_cast<int>(argv.size()), ptrs.data(), lens.data())));
  if (!r) throw std::runtime_error("redis-sentinel on port " + std::to_string(port) + ": " + c->errstr);
  return r;
}

std::string RedisSentinelGroup::sentinel_logs() const {
  std::string out;
  for (const auto& s : sentinels_) {
    out += "--- sentinel " + std::to_string(s->port()) + "\n" + file_text(s->dir() / "sentinel.log");
  }
  return out;
}

}  // namespace distlock::testing
