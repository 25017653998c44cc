#include "support/backend_targets.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "support/backend_leftovers.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#ifdef DISTLOCK_TEST_REDIS
#include "support/redis_sentinel.hpp"
#include "support/redis_server.hpp"
#endif
#ifdef DISTLOCK_TEST_REDISCLUSTER
#include "support/redis_cluster.hpp"
#endif
#ifdef DISTLOCK_TEST_ETCD
#include "etcd/etcd_cluster.hpp"
#endif
#ifdef DISTLOCK_TEST_ZK
#include "zk/zk_server.hpp"
#endif
#ifdef DISTLOCK_TEST_POSTGRES
#include "support/postgres_server.hpp"
#endif
#ifdef DISTLOCK_TEST_MYSQL
#include "support/mariadb_server.hpp"
#endif

namespace distlock::testing {
namespace {

#ifdef DISTLOCK_TEST_REDIS
std::vector<std::string> redis_keys(const RedisServer& s, bool with_channels) {
  std::vector<std::string> out;
  auto keys = s.command({"KEYS", "*"});
  for (std::size_t i = 0; keys && i < keys->elements; ++i) {
    std::string k(keys->element[i]->str, keys->element[i]->len);
    // Fence counters outlive every holder by design: tokens never go back
    // ("<prefix>:{<name>}:fence" per name, "<prefix>:{<tag>}:fence" per hash slot;
    // "<prefix>:fence:{<tag>}" before the layout change).
    const bool fence = (k.size() >= 6 && k.compare(k.size() - 6, 6, ":fence") == 0) ||
                       k.find(":fence:{") != std::string::npos;
    if (!fence) out.push_back("key " + k);
  }
  if (with_channels) {
    auto ch = s.command({"PUBSUB", "CHANNELS", "*"});
    for (std::size_t i = 0; ch && i < ch->elements; ++i) {
      out.push_back("channel " + std::string(ch->element[i]->str, ch->element[i]->len));
    }
  }
  return out;
}

RedisServerOptions redis_options(const TargetOptions& o) {
  RedisServerOptions r;
  r.appendonly = o.durable;
  return r;
}

// redis:// (one server) or redlock:// (several masters).
class RedisTarget final : public Target {
 public:
  RedisTarget(int servers, const TargetOptions& o) : query_(servers > 1 ? o.redlock_query : "") {
    for (int i = 0; i < servers; ++i) servers_.push_back(std::make_unique<RedisServer>(redis_options(o)));
  }
  std::string url() override {
    std::string hosts;
    for (std::size_t i = 0; i < servers_.size(); ++i) {
      if (i) hosts += ",";
      hosts += "127.0.0.1:" + std::to_string(servers_[i]->port());
    }
    return url_via(hosts);
  }
  bool fencing() const override { return servers_.size() == 1; }
  std::vector<std::uint16_t> ports() override {
    std::vector<std::uint16_t> out;
    for (auto& s : servers_) out.push_back(s->port());
    return out;
  }
  std::string url_via(const std::string& hosts) override {
    return (servers_.size() == 1 ? "redis://" : "redlock://") + hosts + query_;
  }
  std::vector<std::string> leftovers() override {
    if (servers_.size() == 1) return redis_keys(*servers_[0], true);
    std::vector<std::string> out;
    for (auto& s : servers_) {
      for (auto& k : redis_keys(*s, true)) out.push_back(std::to_string(s->port()) + ": " + k);
    }
    return out;
  }
  int members() override { return static_cast<int>(servers_.size()); }
  void pause(int m) override { servers_[m]->pause(); }
  void resume(int m) override { servers_[m]->resume(); }
  void kill_and_restart(int m) override {
    servers_[m]->kill();
    servers_[m]->restart();
  }
  // Redlock: a wiped master restarted only after every lock it held has expired
  // (docs/redlock.md, the delayed restart); one Redis server: never (its data is the lock).
  bool survives_wipe() const override { return servers_.size() > 1; }
  // One max TTL, plus a fifth for the clock rate assumption (docs/design.md).
  std::chrono::milliseconds wipe_down_for(std::chrono::milliseconds max_ttl) const override {
    return max_ttl * 6 / 5;
  }
  // Everything in the server's directory but its log (the AOF) goes.
  bool wipe_and_restart(int m, std::chrono::milliseconds down_for) override {
    servers_[m]->kill();
    std::this_thread::sleep_for(down_for);
    for (const auto& e : std::filesystem::directory_iterator(servers_[m]->dir())) {
      if (e.path().filename() != "redis.log") std::filesystem::remove_all(e.path());
    }
    servers_[m]->restart();
    return true;
  }

 private:
  std::string query_;
  std::vector<std::unique_ptr<RedisServer>> servers_;
};
#endif

#ifdef DISTLOCK_TEST_REDIS
// redis+sentinel://: 1 master, 2 replicas, 3 sentinels, reached through the sentinels'
// URL. Not networked: the client reaches the master at the address the sentinels
// name, which a proxy in front of the sentinels does not cover.
//
// No test of this target fails its master over (members() is 0; failovers are tested
// with their own groups: SentinelFailover, SentinelMeasured). down-after-milliseconds
// is therefore 5 s, not the group's default 1 s: on a starved machine a master that
// answers no PING for 1 s was failed over in the nemesis soak (seed 1098792964), and a
// failover loses acknowledged lock writes by design (docs/sentinel.md). A failover that
// happens all the same is reported by unplanned_role_changes().
class SentinelTarget final : public Target {
 public:
  SentinelTarget() : group_(RedisSentinelOptions{.down_after_ms = kDownAfterMs}) {}
  std::string url() override { return group_.url(); }
  // Keys (but fence counters) and channels on the current master; the sentinels'
  // own hello channel is theirs, not ours.
  std::vector<std::string> leftovers() override {
    std::vector<std::string> out;
    for (auto& l : redis_keys(group_.master(), true)) {
      if (l != "channel __sentinel__:hello") out.push_back(std::move(l));
    }
    return out;
  }
  // Each sentinel's log (+sdown, +odown, +switch-master, +convert-to-slave with their
  // times) and each data node's (role changes).
  std::vector<std::pair<std::string, std::string>> server_logs() override {
    std::vector<std::pair<std::string, std::string>> out{{"sentinels.log", group_.sentinel_logs()}};
    for (std::size_t i = 0; i < group_.nodes(); ++i) {
      out.emplace_back("redis" + std::to_string(i) + ".log", group_.node(i).log());
    }
    return out;
  }
  // A failover raises the sentinels' config-epoch for the master above 0 and makes
  // them name another node than the one the group started with.
  std::string unplanned_role_changes() override {
    const std::string first = std::to_string(group_.node(0).port());
    std::string out;
    for (std::size_t i = 0; i < group_.sentinel_ports().size(); ++i) {
      std::string epoch = "?", named = "?";
      try {
        auto m = group_.sentinel_command(i, {"SENTINEL", "MASTER", RedisSentinelOptions{}.master_name});
        for (std::size_t k = 0; m && m->type == REDIS_REPLY_ARRAY && k + 1 < m->elements; k += 2) {
          const auto text = [](const redisReply* r) {
            return r->str ? std::string(r->str, r->len) : std::string();
          };
          const std::string f = text(m->element[k]), v = text(m->element[k + 1]);
          if (f == "config-epoch") epoch = v;
          if (f == "port") named = v;
        }
      } catch (const std::exception& e) {
        epoch = named = std::string("unknown (") + e.what() + ")";
      }
      if (epoch != "0" || named != first) {
        out += (out.empty() ? "" : "; ") + std::string("sentinel ") + std::to_string(i) +
               " names the master on port " + named + " with config-epoch " + epoch +
               " (the group started with port " + first + ", epoch 0)";
      }
    }
    return out;
  }

 private:
  static constexpr int kDownAfterMs = 5000;
  RedisSentinelGroup group_;
};
#endif

#ifdef DISTLOCK_TEST_REDISCLUSTER
// redis+cluster://: 3 masters (appendonly when durable, so a killed and restarted
// master comes back with its locks and fence counters). Leftovers: keys (fence
// counters excepted) and channels, plain and sharded, on every node. Through fault
// proxies the URL names the proxies and maps every node's announced address to its
// proxy (`nat=`), so the slot map and the redirections lead through them too.
class RedisClusterTarget final : public Target {
 public:
  explicit RedisClusterTarget(const TargetOptions& o) : cluster_(3, o.durable) {}
  std::string url() override { return cluster_.url(); }
  std::vector<std::string> leftovers() override { return cluster_.leftovers(); }
  std::vector<std::uint16_t> ports() override {
    std::vector<std::uint16_t> out;
    for (int i = 0; i < cluster_.size(); ++i) out.push_back(cluster_.node(i).port());
    return out;
  }
  std::string url_via(const std::string& hosts) override {
    if (hosts.empty()) return url();
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
  int members() override { return cluster_.size(); }
  void pause(int m) override { cluster_.node(m).pause(); }
  void resume(int m) override { cluster_.node(m).resume(); }
  void kill_and_restart(int m) override {
    cluster_.kill(m);
    cluster_.restart(m);
  }

 private:
  RedisCluster cluster_;
};
#endif

#ifdef DISTLOCK_TEST_ETCD
class EtcdTarget final : public Target {
 public:
  EtcdTarget(int members, const TargetOptions& o)
      : cluster_(members, EtcdClusterOptions{.peer_proxies = o.peer_proxies && members > 1}),
        peer_proxies_(o.peer_proxies && members > 1) {}
  std::string url() override { return cluster_.url(); }
  std::vector<std::uint16_t> ports() override {
    std::vector<std::uint16_t> out;
    for (int i = 0; i < cluster_.size(); ++i) out.push_back(cluster_.client_port(i));
    return out;
  }
  std::string url_via(const std::string& hosts) override { return "etcd://" + hosts; }
  // A waiter's queue key lives on its session lease, whose TTL is the waiter's lock
  // TTL: a dead waiter holds the line until that lease expires (docs/design.md "A dead
  // waiter"), plus a second of expiry granularity.
  std::int64_t dead_waiter_bound_ms(std::int64_t waiter_ttl_ms) const override {
    return waiter_ttl_ms + 1000;
  }
  std::vector<std::string> leftovers() override { return etcd_leftovers(cluster_); }
  int members() override { return cluster_.size(); }
  void pause(int m) override { cluster_.pause(m); }
  void resume(int m) override { cluster_.resume(m); }
  void kill_and_restart(int m) override {
    cluster_.kill(m);
    cluster_.restart(m);
  }
  // A member removed, wiped and added back: the quorum keeps the data; the new member
  // receives it from the leader before it serves.
  bool survives_wipe() const override { return cluster_.size() > 1; }
  bool wipe_and_restart(int m, std::chrono::milliseconds down_for) override {
    if (cluster_.size() < 2) return false;
    cluster_.kill(m);
    std::this_thread::sleep_for(down_for);
    cluster_.wipe_and_rejoin(m);
    return true;
  }
  bool isolate(int m) override {
    if (!peer_proxies_) return false;
    cluster_.isolate(m);
    return true;
  }
  void heal() override {
    if (peer_proxies_) cluster_.heal();
  }

 private:
  EtcdCluster cluster_;
  bool peer_proxies_ = false;
};
#endif

#ifdef DISTLOCK_TEST_ZK
class ZkTarget final : public Target {
 public:
  ZkTarget(int servers, const TargetOptions& o) {
    if (servers == 1) {
      single_ = std::make_unique<ZkServer>();
    } else {
      ensemble_ = std::make_unique<ZkEnsemble>(servers, ZkServerOptions{.peer_proxies = o.peer_proxies});
      peer_proxies_ = o.peer_proxies;
    }
  }
  // The session is the lease: its timeout is the TTL the tests use.
  static constexpr const char* kQuery = "?session_timeout=2s";
  std::string url() override { return single_ ? single_->url(kQuery) : ensemble_->url(kQuery); }
  std::vector<std::uint16_t> ports() override {
    std::vector<std::uint16_t> out;
    for (int i = 0; i < members(); ++i) out.push_back(server(i).port());
    return out;
  }
  std::string url_via(const std::string& hosts) override { return "zk://" + hosts + kQuery; }
  std::int64_t max_ttl_ms() const override { return 4000; }
  std::vector<std::string> leftovers() override {
    RawZk raw(single_ ? single_->hostport() : ensemble_->hostports());
    return zk_leftovers(raw);
  }
  int members() override { return single_ ? 1 : ensemble_->size(); }
  void pause(int m) override { server(m).pause(); }
  void resume(int m) override { server(m).resume(); }
  void kill_and_restart(int m) override {
    server(m).kill();
    server(m).start();
  }
  // An ensemble member's transaction log and snapshots go (its myid stays): it joins as
  // a new follower and the leader sends it the whole state (SNAP) before it serves.
  bool survives_wipe() const override { return ensemble_ != nullptr; }
  bool wipe_and_restart(int m, std::chrono::milliseconds down_for) override {
    if (!ensemble_) return false;
    server(m).kill();
    std::this_thread::sleep_for(down_for);
    std::filesystem::remove_all(server(m).data_dir() / "version-2");
    // A member that exits before serving could not bind one of its fixed ports, held for a
    // moment by another process (seen once in CI: the member was gone 8 s into the run): it is
    // started again, 3 times at most, within 30 s in all.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (int attempt = 1;; ++attempt) {
      server(m).start();
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (server(m).wait_serving(std::max(left, std::chrono::milliseconds(0)))) return true;
      const bool exited = !server(m).running();
      if (!exited || attempt == 3 || std::chrono::steady_clock::now() >= until) {
        const std::string log = read_file((server(m).dir() / "server.log").string());
        throw std::runtime_error("ZooKeeper server " + std::to_string(m) +
                                 (exited ? " exited before serving, " + std::to_string(attempt) + " times,"
                                         : " did not serve within 30 s") +
                                 " after its restart with an empty data directory; the end of its log:\n" +
                                 log.substr(log.size() > 4000 ? log.size() - 4000 : 0));
      }
    }
  }
  bool isolate(int m) override {
    if (!peer_proxies_) return false;
    ensemble_->isolate(m);
    return true;
  }
  void heal() override {
    if (peer_proxies_) ensemble_->heal();
  }

 private:
  ZkServer& server(int m) { return single_ ? *single_ : ensemble_->server(m); }
  bool peer_proxies_ = false;
  std::unique_ptr<ZkServer> single_;
  std::unique_ptr<ZkEnsemble> ensemble_;
};
#endif

#if defined(DISTLOCK_TEST_POSTGRES) || defined(DISTLOCK_TEST_MYSQL)
// One database server (a PostgresServer, a MariadbServer) as a target of one member: its URL,
// its port, and the member's faults, which are the server's own.
template <class Server>
class DatabaseTarget : public Target {
 public:
  std::string url() override { return server_.url(); }
  std::vector<std::uint16_t> ports() override { return {server_.port()}; }
  std::string url_via(const std::string& hosts) override { return Server::url_at(hosts); }
  int members() override { return 1; }
  void pause(int) override { server_.pause(); }
  void resume(int) override { server_.resume(); }
  void kill_and_restart(int) override {
    server_.kill();
    server_.restart();
  }
  bool wipe_and_restart(int, std::chrono::milliseconds down_for) override {
    server_.kill();
    std::this_thread::sleep_for(down_for);
    server_.wipe_and_restart();
    return true;
  }

 protected:
  using Row = std::vector<std::string>;  // one row of a query's answer, as text
  // Appends to `out` one line per row of `sql` on the server, made by `line`.
  void append_rows(std::vector<std::string>& out, const std::string& sql,
                   const std::function<std::string(const Row&)>& line) const {
    for (const auto& r : server_.query(sql)) out.push_back(line(r));
  }

  Server server_;
};
#endif

#ifdef DISTLOCK_TEST_POSTGRES
// One PostgreSQL server. Left on it after every client is gone: advisory locks, lock
// rows still naming an owner, and sessions of distlock clients (lease sessions and
// LISTEN connections). The token rows stay by design: tokens never go back.
class PostgresTarget final : public DatabaseTarget<PostgresServer> {
 public:
  std::vector<std::string> leftovers() override {
    std::vector<std::string> out;
    append_rows(out, "SELECT pid, classid, objid FROM pg_locks WHERE locktype = 'advisory'",
                [](const Row& r) { return "advisory lock " + r[1] + "/" + r[2] + " of backend " + r[0]; });
    if (server_.query("SELECT to_regclass('distlock_locks') IS NOT NULL")[0][0] == "t") {
      append_rows(
          out,
          "SELECT encode(substr(name, 1, 40), 'escape'), owner FROM distlock_locks WHERE owner IS NOT NULL",
          [](const Row& r) { return "row " + r[0] + " owned by " + r[1]; });
    }
    append_rows(out,
                "SELECT application_name, pid FROM pg_stat_activity WHERE application_name LIKE 'distlock%'",
                [](const Row& r) { return "session " + r[0] + " (backend " + r[1] + ")"; });
    return out;
  }
};
#endif

#ifdef DISTLOCK_TEST_MYSQL
// One MariaDB server. Left on it after every client is gone: named locks of the lock
// rows, lock rows still naming an owner, and sessions of the distlock account (lease
// sessions, waits, the shared connection). The token rows stay by design: tokens never
// go back.
class MysqlTarget final : public DatabaseTarget<MariadbServer> {
 public:
  std::vector<std::string> leftovers() override {
    const std::string db = MariadbServer::kDatabase;
    std::vector<std::string> out;
    if (server_.query("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '" + db +
                      "' AND TABLE_NAME = 'distlock_locks'")[0][0] == "1") {
      append_rows(out,
                  "SELECT lock_name, IS_USED_LOCK(lock_name) FROM " + db +
                      ".distlock_locks WHERE IS_USED_LOCK(lock_name) IS NOT NULL",
                  [](const Row& r) { return "named lock " + r[0] + " of session " + r[1]; });
      // A released row keeps its owner; its token is then in distlock_released.
      append_rows(out,
                  "SELECT LEFT(name, 40), owner FROM " + db +
                      ".distlock_locks l WHERE owner IS NOT NULL AND NOT token <=> (SELECT r.token FROM " +
                      db + ".distlock_released r WHERE r.digest = l.digest)",
                  [](const Row& r) { return "row " + r[0] + " owned by " + r[1]; });
    }
    append_rows(out,
                "SELECT ID, COMMAND, IFNULL(INFO, '') FROM information_schema.PROCESSLIST WHERE USER = '" +
                    std::string(MariadbServer::kUser) + "'",
                [](const Row& r) {
                  return "session " + r[0] + " (" + r[1] + (r[2].empty() ? "" : ": " + r[2].substr(0, 60)) +
                         ")";
                });
    return out;
  }
};
#endif

class FileTarget final : public Target {
 public:
  std::string url() override { return "file://" + dir_.path().string(); }
  bool dense_tokens() const override { return true; }
  bool expires() const override { return false; }
  std::vector<std::string> leftovers() override { return {}; }  // lock files stay; kernel locks die with fds

 private:
  TempDir dir_{"distlock-target-file"};
};

}  // namespace

void PrintTo(const Kind& k, std::ostream* os) {
  *os << k.label;
}

std::vector<Kind> kinds() {
  std::vector<Kind> k;
  k.push_back({"file", [](const TargetOptions&) { return std::make_unique<FileTarget>(); }, false});
#ifdef DISTLOCK_TEST_REDIS
  k.push_back({"redis", [](const TargetOptions& o) { return std::make_unique<RedisTarget>(1, o); }});
  // In the nemesis with holder faults only (pause, kill): a master failover loses
  // acknowledged writes by design (asynchronous replication), which the checker would
  // rightly call an overlap; failovers are measured in SentinelMeasured instead.
  k.push_back(
      {"sentinel", [](const TargetOptions&) { return std::make_unique<SentinelTarget>(); }, false, true});
#endif
#ifdef DISTLOCK_TEST_REDISCLUSTER
  k.push_back(
      {"rediscluster3", [](const TargetOptions& o) { return std::make_unique<RedisClusterTarget>(o); }});
#endif
#ifdef DISTLOCK_TEST_REDLOCK
  k.push_back({"redlock3", [](const TargetOptions& o) { return std::make_unique<RedisTarget>(3, o); }});
#endif
#ifdef DISTLOCK_TEST_ETCD
  k.push_back(
      {"etcd1", [](const TargetOptions& o) { return std::make_unique<EtcdTarget>(1, o); }, true, false});
  k.push_back({"etcd3", [](const TargetOptions& o) { return std::make_unique<EtcdTarget>(3, o); }});
#endif
#ifdef DISTLOCK_TEST_ZK
  k.push_back({"zk1", [](const TargetOptions& o) { return std::make_unique<ZkTarget>(1, o); }, true, false});
  k.push_back({"zk3", [](const TargetOptions& o) { return std::make_unique<ZkTarget>(3, o); }});
#endif
#ifdef DISTLOCK_TEST_POSTGRES
  k.push_back({"postgres", [](const TargetOptions&) { return std::make_unique<PostgresTarget>(); }});
#endif
#ifdef DISTLOCK_TEST_MYSQL
  k.push_back({"mysql", [](const TargetOptions&) { return std::make_unique<MysqlTarget>(); }});
#endif
  return k;
}

std::vector<Kind> networked_kinds() {
  std::vector<Kind> out;
  for (auto& k : kinds()) {
    if (k.networked) out.push_back(std::move(k));
  }
  return out;
}

}  // namespace distlock::testing
