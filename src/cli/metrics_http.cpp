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
#include <vector>

#include "distlock/error.hpp"

namespace distlock::cli {

namespace {

using SteadyClock = std::chrono::steady_clock;

int ms_left(SteadyClock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
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

namespace {

/// One client connection of the event loop: read the request, write the reply, drain.
struct Connection {
  int fd = -1;
  enum class Phase { reading, writing, draining } phase = Phase::reading;
  std::string in;
  std::string out;
  std::size_t sent = 0;
  SteadyClock::time_point deadline;
};

bool request_complete(const std::string& req) {
  return req.find("\r\n\r\n") != std::string::npos || req.find("\n\n") != std::string::npos;
}

}  // namespace

// One thread, one poll() over the listening socket and every open connection: a
// connection that is idle, slow or stuck never delays another (each has its own
// deadline, kIoTimeout from its accept), and at most kMaxConnections are open at
// once — a new one past that closes the oldest.
void MetricsServer::serve() {
  std::vector<Connection> conns;
  bool stopping = false;
  auto close_at = [&](std::size_t i) {
    ::close(conns[i].fd);
    conns[i] = std::move(conns.back());
    conns.pop_back();
  };
  while (!stopping) {
    std::vector<pollfd> fds;
    fds.reserve(conns.size() + 2);
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({stop_fd_, POLLIN, 0});
    auto wake = SteadyClock::time_point::max();
    for (const Connection& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.phase == Connection::Phase::writing ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, c.deadline);
    }
    const int timeout = wake == SteadyClock::time_point::max() ? -1 : ms_left(wake);
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) break;
    const auto now = SteadyClock::now();
    // Connections first (their indexes match fds[2..]); closed ones are swapped out, so
    // walk backwards.
    for (std::size_t i = conns.size(); i-- > 0;) {
      Connection& c = conns[i];
      const short rev = fds[i + 2].revents;
      if (rev == 0) {
        if (now >= c.deadline) close_at(i);  // silent or stuck: closed unanswered
        continue;
      }
      if (step(c.fd, c.phase == Connection::Phase::reading, c.phase == Connection::Phase::writing, c.in,
               c.out, c.sent, c.deadline)) {
        c.phase = c.out.empty()           ? Connection::Phase::reading
                  : c.sent < c.out.size() ? Connection::Phase::writing
                                          : Connection::Phase::draining;
        continue;
      }
      close_at(i);
    }
    if (fds[0].revents != 0) {
      for (int n = 0; n < 16; ++n) {  // a burst, without starving the open ones
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          // EMFILE and the like: do not spin on a connection we cannot take.
          if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
            if (!conns.empty()) {
              close_at(0);  // make room
            } else {
              pollfd stop{stop_fd_, POLLIN, 0};
              if (::poll(&stop, 1, 100) > 0) stopping = true;
            }
          }
          break;
        }
        if (conns.size() >= kMaxConnections) {
          // The oldest open connection makes room: one client cannot hold every slot.
          std::size_t oldest = 0;
          for (std::size_t i = 1; i < conns.size(); ++i) {
            if (conns[i].deadline < conns[oldest].deadline) oldest = i;
          }
          close_at(oldest);
        }
        conns.push_back(
            Connection{fd, Connection::Phase::reading, {}, {}, 0, SteadyClock::now() + kIoTimeout});
      }
    }
  }
  for (Connection& c : conns) ::close(c.fd);
}

// Advances one connection without blocking: reads what is there (and answers once the
// request is complete), writes what the socket takes, or drains after the reply.
// False when the connection is finished (answered and drained, or failed).
bool MetricsServer::step(int fd, bool reading, bool writing, std::string& in, std::string& out,
                         std::size_t& sent, SteadyClock::time_point& deadline) {
  if (reading) {
    char buf[1024];
    bool eof = false;
    for (;;) {
      if (in.size() >= kMaxRequest) break;
      const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, kMaxRequest - in.size()), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return false;
      }
      if (n == 0) {
        eof = true;
        break;
      }
      in.append(buf, static_cast<std::size_t>(n));
    }
    const bool complete = request_complete(in);
    if (!complete && !eof && in.size() < kMaxRequest) return true;  // more to come
    out = reply_to(in, complete);
    sent = 0;
    writing = true;
  }
  if (writing) {
    while (sent < out.size()) {
      const ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;  // wait for POLLOUT
      return false;
    }
    // Half-close, then read what the client still sends (bounded) so that closing
    // does not reset the connection before it has read the reply.
    ::shutdown(fd, SHUT_WR);
    deadline = std::min(deadline, SteadyClock::now() + std::chrono::milliseconds(200));
    return true;
  }
  // Draining.
  char buf[1024];
  for (int i = 0; i < 64; ++i) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // closed by the client, or an error: done
  }
  return true;
}

std::string MetricsServer::reply_to(const std::string& req, bool complete) {
  const auto line_end = req.find('\n');
  if (!complete && line_end == std::string::npos) {
    return req.size() >= kMaxRequest ? response("431 Request Header Fields Too Large", "request too large\n")
                                     : response("400 Bad Request", "incomplete request\n");
  }
  if (!complete && req.size() >= kMaxRequest) {
    return response("431 Request Header Fields Too Large", "request too large\n");
  }
  std::string_view line(req.data(), line_end);
  if (line.ends_with('\r')) line.remove_suffix(1);
  const auto sp1 = line.find(' ');
  const auto sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos ||
      !line.substr(sp2 + 1).starts_with("HTTP/1.")) {
    return response("400 Bad Request", "malformed request line\n");
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view path = target.substr(0, target.find('?'));
  const bool head = method == "HEAD";
  if (path != "/metrics") return response("404 Not Found", "only /metrics is served here\n", head);
  if (method != "GET" && !head) {
    return response("405 Method Not Allowed", "use GET\n", false, "Allow: GET, HEAD\r\n");
  }
  try {
    return response("200 OK", render_(), head);
  } catch (...) {
    return response("500 Internal Server Error", "metrics unavailable\n");
  }
}

}  // namespace distlock::cli
