// Test support: real ZooKeeper servers (Debian's `zookeeper` package, Java) started by
// the test itself on free loopback ports in temporary directories, stopped by pid; a
// standalone server or an N-server ensemble; fault helpers (kill, pause, resume,
// restart) and a raw C-client handle for assertions that bypass the code under test.
//
// A missing java binary or ZooKeeper jar is a test failure with a clear message
// (never a skip): the constructors call ADD_FAILURE and throw std::runtime_error.
//
// Thread-safety: a server or ensemble is driven from one thread; RawZk is one session
// usable from one thread.
//
// Example:
//   distlock::testing::ZkServer zk;                      // standalone, ~1 s to start
//   auto client = distlock::connect(zk.url("?session_timeout=2s"));
//   distlock::testing::RawZk raw(zk.hostport());
//   EXPECT_TRUE(raw.children("/distlock/job").empty());
//   zk.pause(); zk.resume();                              // SIGSTOP / SIGCONT
#pragma once

#ifndef THREADED
#define THREADED
#endif
#include <zookeeper/zookeeper.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "support/fault_proxy.hpp"
#include "support/local_server_process.hpp"
#include "support/process.hpp"

namespace distlock::testing {

struct ZkServerOptions {
  int tick_ms = 200;  ///< session expiry is checked every tick
  int min_session_ms = 400;
  int max_session_ms = 60'000;
  /// Ensemble only: servers reach each other's quorum and election ports only through
  /// fault proxies, one per ordered pair (i -> j), so that isolate() can cut a server off.
  bool peer_proxies = false;
  /// How often the server deletes empty container nodes (lock directories), in ms; 0: the
  /// server's default, a minute. A JVM system property (-Dznode.container.checkIntervalMs):
  /// ZooKeeper reads it from no config file.
  int container_check_ms = 0;
};

/// One ZooKeeper server process (standalone, or member `id` of an ensemble).
class ZkServer : public LocalServerProcess {
 public:
  /// A standalone server; waits until it serves clients.
  explicit ZkServer(ZkServerOptions opts = {});

  std::string hostport() const { return "127.0.0.1:" + std::to_string(port_); }
  /// "zk://127.0.0.1:<port><suffix>", e.g. suffix "/chroot?session_timeout=2s".
  std::string url(const std::string& suffix = {}) const { return "zk://" + hostport() + suffix; }
  // port() (the client port), pid(), kill() (SIGKILL and reap), pause(), resume() (SIGSTOP /
  // SIGCONT) and the stop by pid when it goes: LocalServerProcess.

  void start();  ///< (re)starts the process with the same port and data directory
  /// Rewrites the configuration (session bounds, tick) for the next start(); the
  /// running process is not affected. Models an operator changing zoo.cfg before a
  /// restart.
  void reconfigure(const ZkServerOptions& opts);
  /// True once the server answers "srvr" with a mode (leader/follower/standalone).
  bool wait_serving(std::chrono::milliseconds timeout);
  /// "leader", "follower", "standalone" or "" (not serving).
  std::string mode() const;
  /// The dataDir: myid (ensemble) and version-2/ (transaction log and snapshots).
  std::filesystem::path data_dir() const { return dir_.path() / "data"; }

 private:
  void spawn();  ///< starts the process (no wait)
  friend class ZkEnsemble;
  ZkServer(ZkServerOptions opts, int id, std::vector<std::uint16_t> quorum_ports,
           std::vector<std::uint16_t> election_ports, std::vector<std::uint16_t> client_ports);
  void write_config();

  ZkServerOptions opts_;
  int id_ = 0;  // 0: standalone
  std::vector<std::uint16_t> quorum_ports_, election_ports_, client_ports_;
};

/// N servers forming one ensemble.
class ZkEnsemble {
 public:
  explicit ZkEnsemble(int servers, ZkServerOptions opts = {});
  ZkServer& server(int i) { return *servers_.at(static_cast<std::size_t>(i)); }
  int size() const { return static_cast<int>(servers_.size()); }
  /// "127.0.0.1:p1,127.0.0.1:p2,..."
  std::string hostports() const;
  std::string url(const std::string& suffix = {}) const { return "zk://" + hostports() + suffix; }
  /// Index of the current leader, or -1.
  int leader() const;

  /// With peer_proxies: freezes every quorum and election connection between server
  /// `i` and the others, both ways, until heal(). Its client port stays reachable.
  void isolate(int i);
  void heal();

 private:
  struct PairProxies {
    std::unique_ptr<FaultProxy> quorum, election;
  };
  // Starts the members on fresh ports; "" once all serve, else why one exited first.
  std::string start_members(int servers, const ZkServerOptions& opts);
  // [i][j]: what server i dials to reach server j (empty when i == j). Declared
  // before servers_ so that the servers stop first.
  std::vector<std::vector<PairProxies>> proxies_;
  std::vector<std::unique_ptr<ZkServer>> servers_;
};

/// The java binary and class path to run ZooKeeper, or a reason why they are missing.
struct ZkInstall {
  std::string java;
  std::string classpath;
  std::string problem;  ///< empty when usable
};
ZkInstall find_zookeeper();

/// Sends a four-letter command ("srvr", "ruok", ...) and returns the answer ("" on failure).
std::string four_letter(std::uint16_t port, const std::string& cmd);

/// A raw C-client session for assertions that must not go through distlock.
class RawZk {
 public:
  /// Connects (waits up to 10 s); `credentials` "user:password" adds digest auth.
  explicit RawZk(const std::string& hostport, const std::string& credentials = {});
  /// Attaches to an existing session (id + password) — closing it expires that session.
  RawZk(const std::string& hostport, const clientid_t& session);
  ~RawZk();
  RawZk(const RawZk&) = delete;
  RawZk& operator=(const RawZk&) = delete;

  bool connected() const;
  /// Children of `path` (empty if it does not exist).
  std::vector<std::string> children(const std::string& path);
  /// ZOK, ZNONODE, ZNOAUTH, ...
  int create(const std::string& path, int mode = ZOO_PERSISTENT);
  int remove(const std::string& path, int version = -1);
  int exists(const std::string& path, Stat* stat = nullptr);

 private:
  void wait_connected();
  zhandle_t* zh_ = nullptr;
};

}  // namespace distlock::testing
