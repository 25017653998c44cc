// The fault proxy's "delivered, answer lost" mode (tests/support/fault_proxy.hpp,
// FaultProxy::lose_answers), against a TCP echo server of the test's own on 127.0.0.1: a
// connection open when the mode is set has its next request reach the server, gets none of the
// server's answer and is cut `cut_after` after the server answered; a connection opened later
// passes. Every wait is bounded (5 s) on the steady clock.
#include "support/fault_proxy.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/eventually.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// Echoes every byte back on every connection, and records what each connection received.
class EchoServer {
 public:
  EchoServer() {
    listen_fd_ = listen_loopback(16, port_);
    if (listen_fd_ < 0) throw std::runtime_error("echo server: cannot listen on 127.0.0.1");
    thread_ = std::thread([this] { run(); });
  }
  ~EchoServer() {
    stop_ = true;
    thread_.join();
    for (int fd : conns_) ::close(fd);
    ::close(listen_fd_);
  }
  std::uint16_t port() const { return port_; }
  // Everything received so far, all connections in arrival order.
  std::string received() {
    std::lock_guard lk(mu_);
    return received_;
  }

 private:
  void run() {
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      for (int fd : conns_) fds.push_back({fd, POLLIN, 0});
      ::poll(fds.data(), fds.size(), 20);  // 20 ms: the stop flag is seen within it
      if (fds[0].revents & POLLIN) {
        const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) conns_.push_back(c);
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[4096];
        const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        if (n <= 0) continue;  // a closed peer: left open until the end (polls as readable)
        {
          std::lock_guard lk(mu_);
          received_.append(buf, static_cast<std::size_t>(n));
        }
        (void)!::send(fds[i].fd, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL);
      }
    }
  }

  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> conns_;  // the server thread's
  std::mutex mu_;
  std::string received_;
  std::thread thread_;
};

int dial(std::uint16_t port) {
  const int fd = dial_loopback(port);
  if (fd < 0) throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port));
  return fd;
}

// What the peer sent on `fd` within `limit`: `bytes` wanted bytes, or fewer when the connection
// ended (`closed`) or the limit passed.
struct ReadResult {
  std::string data;
  bool closed = false;
  SteadyClock::time_point closed_at{};
};
ReadResult read_up_to(int fd, std::size_t bytes, std::chrono::milliseconds limit) {
  ReadResult r;
  const auto end = SteadyClock::now() + limit;
  while (r.data.size() < bytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - SteadyClock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      r.data.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    r.closed = true;  // EOF or reset
    r.closed_at = SteadyClock::now();
    break;
  }
  return r;
}

void send_all(int fd, const std::string& s) {
  ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
}

TEST(FaultProxyLoseAnswers, TheRequestIsDeliveredItsAnswerDroppedAndTheConnectionCut) {
  constexpr auto kCutAfter = 300ms;
  EchoServer server;
  FaultProxy proxy(server.port());
  const int fd = dial(proxy.port());
  // Passes first: an echo comes back.
  ASSERT_NO_FATAL_FAILURE(send_all(fd, "one\n"));
  EXPECT_EQ(read_up_to(fd, 4, 5000ms).data, "one\n");

  ASSERT_TRUE(proxy.lose_answers(kCutAfter)) << "the proxy did not apply the mode within 5 s";
  const auto sent = SteadyClock::now();
  ASSERT_NO_FATAL_FAILURE(send_all(fd, "two\n"));
  // Delivered: the server has it (and answered it)...
  EXPECT_TRUE(eventually([&] { return server.received() == "one\ntwo\n"; }, 5000ms)) << server.received();
  // ...but the answer never comes back: the connection ends with nothing read, cut_after after the
  // server's answer reached the proxy (which was after `sent`).
  const ReadResult r = read_up_to(fd, 1, 5000ms);
  EXPECT_EQ(r.data, "") << "an answer was forwarded";
  ASSERT_TRUE(r.closed) << "the connection was not cut within 5 s";
  const auto cut_ms = std::chrono::duration_cast<std::chrono::milliseconds>(r.closed_at - sent).count();
  std::printf("lose_answers(300 ms): the connection was cut %lld ms after the request was sent\n",
              static_cast<long long>(cut_ms));
  EXPECT_GE(r.closed_at - sent, kCutAfter);
  EXPECT_EQ(proxy.answers_lost(), 1);
  EXPECT_EQ(proxy.answer_bytes_dropped(), 4u);
  ::close(fd);
}

TEST(FaultProxyLoseAnswers, AConnectionOpenedAfterwardsPasses) {
  EchoServer server;
  FaultProxy proxy(server.port());
  const int first = dial(proxy.port());
  ASSERT_NO_FATAL_FAILURE(send_all(first, "a"));
  EXPECT_EQ(read_up_to(first, 1, 5000ms).data, "a");
  ASSERT_TRUE(proxy.lose_answers(0ms));
  const int second = dial(proxy.port());
  ASSERT_NO_FATAL_FAILURE(send_all(second, "bc"));
  EXPECT_EQ(read_up_to(second, 2, 5000ms).data, "bc")
      << "a connection opened after lose_answers lost its answer";
  // The first one, open when the mode was set, loses its next answer and is cut at once.
  ASSERT_NO_FATAL_FAILURE(send_all(first, "d"));
  const ReadResult r = read_up_to(first, 1, 5000ms);
  EXPECT_EQ(r.data, "");
  EXPECT_TRUE(r.closed);
  EXPECT_TRUE(eventually([&] { return server.received().find('d') != std::string::npos; }, 5000ms));
  EXPECT_EQ(proxy.answers_lost(), 1);
  // The second one still passes.
  ASSERT_NO_FATAL_FAILURE(send_all(second, "e"));
  EXPECT_EQ(read_up_to(second, 1, 5000ms).data, "e");
  ::close(first);
  ::close(second);
}

}  // namespace
}  // namespace distlock::testing
