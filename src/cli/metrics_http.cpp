#include "cli/metrics_http.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <system_error>

#include "distlock/error.hpp"

namespace distlock::cli {

namespace {

using SteadyClock = std::chrono::steady_clock;

int ms_left(SteadyClock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

/// Waits for `events` on `fd` until `deadline`; false on timeout or error.
bool wait_for(int fd, short events, SteadyClock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc > 0) return true;
    if (rc == 0 || errno != EINTR) return false;
  }
}

bool send_all(int fd, std::string_view data, SteadyClock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd, POLLOUT, deadline)) continue;
    return false;
  }
  return true;
}

std::string response(std::string_view status, std::string_view body, bool head = false,
                     std::string_view extra_headers = {}) {
  std::string r = "HTTP/1.0 ";
  r += status;
  r += "\r\n";
  r += status.starts_with("200") ? "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                                 : "Content-Type: text/plain; charset=utf-8\r\n";
  r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  r += extra_headers;
  r += "Connection: close\r\n\r\n";
  if (!head) r += body;
  return r;
}

}  // namespace

std::unique_ptr<MetricsServer> MetricsServer::start(const std::string& addr, int port,
                                                    std::function<std::string()> render) {
  if (port < 0 || port > 65535) {
    throw_error(make_error_code(errc::invalid_argument),
                "--metrics-port " + std::to_string(port) + " is not a port (0 to 65535)");
  }
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, addr.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    len = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, addr.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    len = sizeof(sockaddr_in6);
  } else {
    throw_error(
        make_error_code(errc::invalid_argument),
        "--metrics-addr \"" + addr + "\" is not a numeric IPv4 or IPv6 address (e.g. 127.0.0.1, ::1)");
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  const std::string shown = ss.ss_family == AF_INET6 ? "[" + addr + "]" : addr;
  auto fail = [&](const char* what) {
    const int err = errno;
    throw_error(make_error_code(errc::backend_unavailable), "cannot serve metrics on " + shown + ":" +
                                                                std::to_string(port) + ": " + what + ": " +
                                                                std::generic_category().message(err));
  };
  s->listen_fd_ = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s->listen_fd_ < 0) fail("socket");
  const int one = 1;
  ::setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&ss), len) != 0) fail("bind");
  if (::listen(s->listen_fd_, 16) != 0) fail("listen");
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  if (::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) fail("getsockname");
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  s->address_ = shown + ":" + std::to_string(bound_port);
  s->stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->stop_fd_ < 0) fail("eventfd");
  s->render_ = std::move(render);
  s->thread_ = std::thread([srv = s.get()] { srv->serve(); });
  return s;
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void MetricsServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // EMFILE and the like: do not spin on a connection we cannot take.
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        pollfd stop{stop_fd_, POLLIN, 0};
        if (::poll(&stop, 1, 100) > 0) return;
      }
      continue;
    }
    answer(fd);
    ::close(fd);
  }
}

void MetricsServer::answer(int fd) {
  const auto deadline = SteadyClock::now() + kIoTimeout;
  std::string req;
  bool complete = false, eof = false;
  while (!complete && !eof && req.size() < kMaxRequest) {
    if (!wait_for(fd, POLLIN, deadline)) return;  // silent client: closed unanswered
    char buf[1024];
    const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, kMaxRequest - req.size()), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return;
    }
    if (n == 0) eof = true;
    req.append(buf, static_cast<std::size_t>(n));
    complete = req.find("\r\n\r\n") != std::string::npos || req.find("\n\n") != std::string::npos;
  }
  std::string reply;
  const auto line_end = req.find('\n');
  if (!complete && line_end == std::string::npos) {
    reply = req.size() >= kMaxRequest ? response("431 Request Header Fields Too Large", "request too large\n")
                                      : response("400 Bad Request", "incomplete request\n");
  } else if (!complete && req.size() >= kMaxRequest) {
    reply = response("431 Request Header Fields Too Large", "request too large\n");
  } else {
    std::string_view line(req.data(), line_end);
    if (line.ends_with('\r')) line.remove_suffix(1);
    const auto sp1 = line.find(' ');
    const auto sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos ||
        !line.substr(sp2 + 1).starts_with("HTTP/1.")) {
      reply = response("400 Bad Request", "malformed request line\n");
    } else {
      const std::string_view method = line.substr(0, sp1);
      const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
      const std::string_view path = target.substr(0, target.find('?'));
      const bool head = method == "HEAD";
      if (path != "/metrics") {
        reply = response("404 Not Found", "only /metrics is served here\n", head);
      } else if (method != "GET" && !head) {
        reply = response("405 Method Not Allowed", "use GET\n", false, "Allow: GET, HEAD\r\n");
      } else {
        try {
          reply = response("200 OK", render_(), head);
        } catch (...) {
          reply = response("500 Internal Server Error", "metrics unavailable\n");
        }
      }
    }
  }
  if (!send_all(fd, reply, deadline)) return;
  // Half-close, then read what the client still sends (bounded) so that closing
  // does not reset the connection before it has read the reply.
  ::shutdown(fd, SHUT_WR);
  const auto drain_deadline = std::min(deadline, SteadyClock::now() + std::chrono::milliseconds(200));
  for (int i = 0; i < 64 && wait_for(fd, POLLIN, drain_deadline); ++i) {
    char buf[1024];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
  }
}

}  // namespace distlock::cli
