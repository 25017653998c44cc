// A minimal HTTP/1.0 responder for `distlock run --metrics-port`: serves
// `GET /metrics` (and HEAD) with the client's Prometheus text on one thread of the
// runner. Connections are served side by side by one poll() loop, so an idle or slow
// client never delays another scrape (at most kMaxConnections open; a new one past
// that closes the oldest); a request is read up to kMaxRequest bytes within
// kIoTimeout of its accept, answered, and the connection closed. Anything else gets 400,
// 404, 405 or 431 and is closed too. No keep-alive, no chunking, no TLS.
//
// Thread-safety: start() and the destructor on one thread; `render` runs on the
// server's thread and must be safe to call from there (Client::metrics() is).
//
// Example:
//   auto server = MetricsServer::start("127.0.0.1", 0, [&] { return client.metrics(); });
//   std::string where = server->address();  // "127.0.0.1:40123"
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace distlock::cli {

class MetricsServer {
 public:
  static constexpr std::size_t kMaxRequest = 8192;
  static constexpr std::chrono::milliseconds kIoTimeout{2000};
  static constexpr std::size_t kMaxConnections = 64;

  /// Binds `addr` (a numeric IPv4 or IPv6 address) and `port` (0: any free port)
  /// and starts serving. Throws std::system_error: errc::invalid_argument for an
  /// address that is not numeric, errc::backend_unavailable naming the address and
  /// the system's reason when it cannot be bound.
  static std::unique_ptr<MetricsServer> start(const std::string& addr, int port,
                                              std::function<std::string()> render);
  ~MetricsServer();  ///< stops serving and joins the thread
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  /// "host:port" as bound ("[::1]:port" for IPv6), with the port the kernel chose.
  const std::string& address() const noexcept { return address_; }

 private:
  MetricsServer() = default;
  void serve();
  bool step(int fd, bool reading, bool writing, std::string& in, std::string& out, std::size_t& sent,
            std::chrono::steady_clock::time_point& deadline);
  std::string reply_to(const std::string& req, bool complete);

  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd: the destructor wakes the thread with it
  std::string address_;
  std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace distlock::cli
