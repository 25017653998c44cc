// engine/round_trips.hpp — a client's count of request/response exchanges with its
// servers (Client::stats().round_trips).
//
// One exchange is one request sent and its answer awaited: a command or a script call,
// a pipelined batch of commands written together (one), a listing's SCAN page (one
// each), one gRPC call attempt, one ZooKeeper request (a multi is one). Each backend
// counts where it sends, in its transport (redis/connection.cpp, shared_connection.cpp
// and subscriber.cpp; etcd/etcd_transport.hpp and its streams; zk/zk_call.cpp), so no
// call site counts by hand. The backend owns one counter and hands a shared pointer to
// every connection it opens; the engine reads it through Backend::round_trips().
//
// Thread-safety: add() and count() may be called from any thread (a relaxed atomic).
#pragma once

#include <atomic>
#include <cstdint>

namespace distlock::detail {

class RoundTrips {
 public:
  void add(std::uint64_t n = 1) noexcept { n_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t count() const noexcept { return n_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> n_{0};
};

}  // namespace distlock::detail
