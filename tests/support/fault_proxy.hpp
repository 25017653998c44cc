// Test support: a TCP proxy on 127.0.0.1 that a test puts between a client and one
// server, to cut or slow that client's network without touching the server.
//
//   pass       forward both ways (the default)
//   freeze     stop forwarding, keep every socket open (a partition that TCP does not
//              see: requests hang until a timeout)
//   delay      forward each chunk `latency` (+ up to `jitter`) after it arrived
//   drop       close every proxied connection and refuse new ones (reset at once)
//
// A partition of a set of clients from a set of servers is one proxy per (client
// group, server) pair, each frozen or dropped; see FaultProxyGroup.
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

#include <chrono>
#include <cstdint>
#include <memory>
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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

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
