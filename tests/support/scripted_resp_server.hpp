// A RESP server with scripted answers on a loopback port, for tests that need a peer in a
// state a real server passes through only briefly (a sentinel that has not learnt of a
// failover, one naming a chosen config-epoch). Requests are parsed with hiredis's reader;
// `answer` gets each request's arguments and returns the raw RESP reply. stop() (also the
// destructor) closes the listening socket and joins every thread: from then on the port
// refuses connections, as a server that is down or cut off.
#pragma once

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/fault_proxy.hpp"

namespace distlock::testing {

class ScriptedRespServer {
 public:
  using Answer = std::function<std::string(const std::vector<std::string>& args)>;

  /// `what` names the server in the error thrown when it cannot listen.
  ScriptedRespServer(const std::string& what, Answer answer) : answer_(std::move(answer)) {
    fd_ = listen_loopback(16, port_);
    if (fd_ < 0) throw std::runtime_error(what + ": cannot listen on loopback");
    accepter_ = std::thread([this] { accept_loop(); });
  }
  ScriptedRespServer(const ScriptedRespServer&) = delete;
  ScriptedRespServer& operator=(const ScriptedRespServer&) = delete;
  ~ScriptedRespServer() { stop(); }

  void stop() {
    if (stop_.exchange(true)) return;
    accepter_.join();
    ::close(fd_);
    std::lock_guard lk(mu_);
    for (auto& t : conns_) t.join();
  }
  std::uint16_t port() const { return port_; }

  /// RESP helpers for answers.
  static std::string bulk(const std::string& s) {
    return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n";
  }
  static std::string upper(std::string s) {
    for (auto& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return s;
  }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::lock_guard lk(mu_);
      conns_.emplace_back([this, c] { serve(c); });
    }
  }
  void serve(int c) {
    redisReader* reader = redisReaderCreate();
    char buf[4096];
    while (!stop_) {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::read(c, buf, sizeof buf);
      if (n <= 0) break;
      redisReaderFeed(reader, buf, static_cast<size_t>(n));
      void* raw = nullptr;
      while (redisReaderGetReply(reader, &raw) == REDIS_OK && raw != nullptr) {
        auto* r = static_cast<redisReply*>(raw);
        std::vector<std::string> args;
        if (r->type == REDIS_REPLY_ARRAY) {
          for (std::size_t i = 0; i < r->elements; ++i)
            args.emplace_back(r->element[i]->str, r->element[i]->len);
        }
        freeReplyObject(r);
        raw = nullptr;
        const std::string out = answer_(args);
        if (::write(c, out.data(), out.size()) < 0) break;
      }
    }
    redisReaderFree(reader);
    ::close(c);
  }

  const Answer answer_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::thread> conns_;
  std::thread accepter_;
};

}  // namespace distlock::testing
