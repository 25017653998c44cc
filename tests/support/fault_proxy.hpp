// Test support: a TCP proxy on 127.0.0.1 that a test puts between a client and one
// server, to cut or slow that client's network without touching the server.
//
//   pass       forward both ways (the default)
//   freeze     stop forwarding, keep every socket open (a partition that TCP does not
//              see: requests hang until a timeout)
//   delay      forward each chunk `latency` (+ up to `jitter`) after it arrived
//   drop       close every proxied connection and refuse new ones (reset at once)
//   lose_answers  (the connections open when it is called) forward the client's bytes to
//              the server, never forward the server's bytes back, and cut the connection a
//              moment after the server's first bytes: a request delivered, its answer lost
//
// A partition of a set of clients from a set of servers is one proxy per (client
// group, server) pair, each frozen or dropped; see FaultProxyGroup.
//
// When one listening port is shared by several dialers (etcd members all dial the one
// advertised peer URL of a member), a classifier names each accepted connection's
// class once (e.g. which process opened it: dialer_pid()), and freeze_class /
// drop_class / pass_class override the proxy's mode for the connections of one
// class only. A head rewriter may edit the first bytes a dialer sends (a handshake
// that announces the dialer's own address) before they are forwarded.
//
// Thread-safety: the proxy forwards on its own thread; every member may be called
// from any thread. Bounded: the forwarding thread stops in the destructor.
//
// Example:
//   distlock::testing::FaultProxy proxy(server.port());
//   auto client = distlock::connect("redis://127.0.0.1:" + std::to_string(proxy.port()));
//   proxy.freeze();   // the client's requests now hang
//   proxy.pass();     // and flow again
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace distlock::testing {

class FaultProxy {
 public:
  /// Listens on a free loopback port and forwards to 127.0.0.1:`upstream_port`.
  explicit FaultProxy(std::uint16_t upstream_port);
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  std::uint16_t port() const;

  void pass();
  void freeze();
  void delay(std::chrono::milliseconds latency, std::chrono::milliseconds jitter = {});
  void drop();

  /// Connections accepted so far (for assertions that a client did reconnect).
  int accepted() const;
  /// Proxied connections open (neither side closed) as of the forwarding thread's last look.
  int open_connections() const;

  /// Names the class of each connection accepted from now on, called once on the
  /// proxy's thread with the accepted socket (not yet read from). kUnclassified
  /// when it cannot tell.
  static constexpr int kUnclassified = -1;
  using Classifier = std::function<int(int accepted_fd)>;
  void set_classifier(Classifier classify);
  /// Overrides the proxy-wide mode for the connections of one class (existing and
  /// new ones); pass_class(c) forwards them again.
  void freeze_class(int cls);
  void drop_class(int cls);
  void pass_class(int cls);
  void pass_all_classes();
  /// Connections the classifier returned kUnclassified for, so far.
  int unclassified() const;

  /// Holds back both directions of every connection accepted so far (as freeze, but for
  /// those only: connections accepted later pass, or follow the proxy's mode), until
  /// release_held(). Bytes a dialer sends on a held connection, and its close, wait in
  /// the proxy's socket and are forwarded in order once released. Returns once the
  /// forwarding thread applies it (true), or false if it did not within 5 s.
  /// Models a master that, frozen or slow, wakes with an old connection's requests
  /// still to read while newer connections were served.
  bool hold_open();
  /// Forwards the held connections again (their queued bytes first, then a close).
  void release_held();

  /// "Delivered, answer lost", for every connection accepted so far (connections accepted
  /// later pass, or follow the proxy's mode): the dialer's bytes go on to the server as in
  /// pass, the server's bytes are read and dropped (never forwarded, nor any not yet
  /// forwarded), and `cut_after` after the first server bytes dropped both sockets are
  /// closed (the dialer sees its connection end without an answer). The wait lets the
  /// server finish what the dropped bytes answered. Overrides freeze, delay, hold_open and
  /// class modes for those connections; drop still closes them at once. Returns once the
  /// forwarding thread applies it (true), or false if it did not within 5 s.
  bool lose_answers(std::chrono::milliseconds cut_after);
  /// Connections cut by lose_answers after dropping at least one byte of the server's, and
  /// the server bytes dropped on them, so far.
  int answers_lost() const;
  std::uint64_t answer_bytes_dropped() const;

  /// Given the bytes a new connection's dialer sent so far, returns false to wait for
  /// more, or true once `head` (possibly edited) may be forwarded. Applies to
  /// connections accepted from now on.
  using HeadRewriter = std::function<bool(std::string& head)>;
  void set_head_rewriter(HeadRewriter rewrite);

  /// By default a connection whose upstream refuses is closed at once. With a retry
  /// the proxy keeps the accepted connection (forwarding nothing) and tries the
  /// upstream again until `retry` has passed, as a dialer that meets "connection
  /// refused" would retry: a server that binds its port a moment after a peer dials
  /// it (a new ZooKeeper leader's quorum port) is then reached, not seen as gone.
  void set_upstream_retry(std::chrono::milliseconds retry);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The pid among `candidates` whose process holds the other end of `accepted_fd`, a
/// loopback TCP connection accepted by this process (found through /proc/net/tcp and
/// /proc/<pid>/fd); -1 when none of them does. Linux only.
pid_t dialer_pid(int accepted_fd, const std::vector<pid_t>& candidates);
/// True when the dialer of `accepted_fd` has already closed its end (or the socket is
/// not an established TCP connection): no process holds that end any more.
bool dialer_closed(int accepted_fd);

/// A blocking TCP socket connected to 127.0.0.1:`port`, or -1 when it cannot be made.
int dial_loopback(std::uint16_t port);

/// A blocking TCP socket listening on 127.0.0.1 on a port the kernel chose (SO_REUSEADDR,
/// `backlog` pending connections), that port in `port`; -1 when it cannot be made.
int listen_loopback(int backlog, std::uint16_t& port);

/// One proxy per server, for partitioning one group of clients from some servers.
class FaultProxyGroup {
 public:
  explicit FaultProxyGroup(const std::vector<std::uint16_t>& upstream_ports);
  FaultProxy& at(std::size_t i) { return *proxies_.at(i); }
  std::size_t size() const { return proxies_.size(); }
  /// "127.0.0.1:p1,127.0.0.1:p2,..." of the proxies (for a multi-host URL).
  std::string hosts() const;
  void pass_all();
  void freeze_all();
  void drop_all();

 private:
  std::vector<std::unique_ptr<FaultProxy>> proxies_;
};

}  // namespace distlock::testing
