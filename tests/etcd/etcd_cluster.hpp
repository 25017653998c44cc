// Test support: real etcd members started by the test itself on free loopback
// ports in a temporary directory, stopped by pid; a single member or a cluster of
// N. Fault helpers (kill/pause/restart a member, find the leader) and `etcdctl()`
// to observe and disturb the cluster without going through the code under test.
//
// A missing etcd or etcdctl binary is a test failure with a clear message (never a skip).
//
// Thread-safety: one EtcdCluster per test, driven from one thread; etcdctl() may
// be called from any thread.
//
// Example:
//   distlock::testing::EtcdCluster etcd(3);
//   auto client = distlock::connect(etcd.url());        // all three endpoints
//   etcd.kill(etcd.leader());                            // SIGKILL the leader
//   auto out = etcd.etcdctl({"get", "--prefix", "distlock/"});
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "support/fault_proxy.hpp"
#include "support/process.hpp"

namespace distlock::testing {

/// Runs argv to completion (bounded by `timeout`), returning stdout+stderr and the exit code.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

struct EtcdClusterOptions {
  bool tls = false;
  /// Members reach each other's peer port only through fault proxies (one per member,
  /// at the member's advertised peer URL), so that isolate() can cut one member off.
  bool peer_proxies = false;
  /// etcd's --auto-compaction-retention in periodic mode (etcd 3.4: every period, the
  /// history older than one period is compacted): on by default, as a production server
  /// runs, so that a long test does not slow down on the history its locks leave
  /// (docs/etcd.md "Compaction"). "0" turns it off.
  std::string auto_compaction_retention = "1m";
};

class EtcdCluster {
 public:
  /// Starts `members` etcd processes forming one cluster and waits until it has a
  /// leader. Throws std::runtime_error (after ADD_FAILURE) when a binary is missing
  /// or the cluster does not come up; the message includes the member logs.
  /// With `tls`, clients must speak TLS and present a certificate signed by the
  /// test CA (ca_file(), client_cert_file(), client_key_file(); made with openssl).
  explicit EtcdCluster(int members = 1, bool tls = false);
  EtcdCluster(int members, EtcdClusterOptions opts);
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  /// "etcd://127.0.0.1:p1,127.0.0.1:p2,..." plus `suffix` (e.g. "?prefix=t").
  std::string url(const std::string& suffix = "") const;
  /// "127.0.0.1:p" of one member, and every member comma-separated.
  std::string endpoint(int member) const;
  std::string endpoints() const;
  std::uint16_t client_port(int member) const { return members_[member].client_port; }

  /// Runs etcdctl against every live member (extra args appended, e.g. {"get","k"}).
  /// Adds --user when `user` is given.
  CommandResult etcdctl(const std::vector<std::string>& args, const std::string& user = "") const;
  /// etcdctl, failing the test on a non-zero exit; returns the output.
  std::string etcdctl_ok(const std::vector<std::string>& args, const std::string& user = "") const;

  /// Index of the current leader, or -1.
  int leader() const;
  void kill(int member);     ///< SIGKILL and reap
  void pause(int member);    ///< SIGSTOP
  void resume(int member);   ///< SIGCONT
  void restart(int member);  ///< start again on the same ports and data dir
  /// Kills `member`, removes it from the cluster, deletes its data directory, adds it
  /// back (same name and peer URL) and starts it empty with --initial-cluster-state
  /// existing; returns once a linearizable read through it alone succeeds (it has the
  /// leader's state). Each step bounded (10 s, 10 s, 20 s to serve; the whole rejoin is tried
  /// once more with 40 s to serve); throws std::runtime_error.
  void wipe_and_rejoin(int member);
  /// One attempt of wipe_and_rejoin: false with `why` when a step missed its bound.
  bool try_wipe_and_rejoin(int member, std::chrono::seconds serve_within, std::string& why);
  bool running(int member) const { return members_[member].up; }
  /// The cluster's current revision (from a linearizable read).
  std::int64_t revision(const std::string& user = "") const;
  std::string log(int member) const;

  /// With peer_proxies: cuts every peer connection between `member` and the other
  /// members, both ways (frozen: sockets stay open, nothing flows), until heal().
  /// Its client port stays reachable. Connections are told apart by the process
  /// that opened them (dialer_pid); see etcd_cluster.cpp for the policy.
  void isolate(int member);
  void heal();
  /// Peer connections whose dialer could not be identified (expected: none).
  int unclassified_peer_connections() const;

  std::string ca_file() const { return (dir_.path() / "ca.pem").string(); }
  std::string client_cert_file() const { return (dir_.path() / "client.pem").string(); }
  std::string client_key_file() const { return (dir_.path() / "client.key").string(); }

 private:
  struct Member {
    std::string name;
    std::uint16_t client_port = 0;
    std::uint16_t peer_port = 0;
    Process proc;
    bool up = false;
    std::unique_ptr<FaultProxy> peer_proxy;  // with peer_proxies: at the advertised peer URL
  };
  int member_of_dialer(int accepted_fd) const;
  static constexpr int kDialerGone = -2;  // a peer connection closed by its dialer before it was accepted
  void start(int member, bool initial);
  void make_certificates();
  TempDir dir_;
  bool tls_ = false;
  std::string compaction_retention_;
  std::vector<Member> members_;
  std::string initial_cluster_;
  mutable std::mutex pids_mu_;  // the proxies' threads read the member pids
  std::vector<pid_t> pids_;
};

}  // namespace distlock::testing
