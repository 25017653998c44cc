// Opening a Socket: the TCP connect, the TLS context and handshake (OpenSSL), and
// AUTH/PING/SELECT; blocking (open_socket) or driven from a poll() loop (start_socket).
// Separate from socket.cpp, which holds the I/O on a socket once it is connected.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "engine/errno_text.hpp"
#include "redis/connection.hpp"
#include "redis/socket_impl.hpp"

namespace distlock::detail::redis {

namespace {

using Clock = Socket::Clock;

struct SslCtxFree {
  void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
};

bool is_ip_literal(const std::string& host) {
  in6_addr a6{};
  in_addr a4{};
  return ::inet_pton(AF_INET, host.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

void tune_tcp(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

// TCP connect to the first address of `host` that accepts. With a deadline, a
// connect in progress is waited for (a timeout moves on to the next address);
// without one, a connect in progress is returned as it is, with `pending` set, for
// the caller to finish (start_socket); a refusal at once still moves on.
// -1 with `err` (backend_unavailable and the cause, not naming the server) when no
// address could be connected to.
int connect_tcp(const ConnectionOptions& opts, std::optional<Clock::time_point> deadline, bool& pending,
                Error& err) {
  pending = false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(opts.port);
  const int rc = ::getaddrinfo(opts.host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    err.fail(errc::backend_unavailable, std::string("cannot resolve the host: ") + ::gai_strerror(rc));
    return -1;
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(found, ::freeaddrinfo);
  err.fail(errc::backend_unavailable, "no address");
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err.fail(errc::backend_unavailable, std::string("socket: ") + errno_text(errno));
      continue;
    }
    int e = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      e = errno;
      if (e == EINPROGRESS && !deadline) {
        pending = true;
        err.clear();
        return fd;
      }
      if (e == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int r = 0;
        while ((r = ::poll(&p, 1, poll_ms(*deadline))) < 0 && errno == EINTR) {
        }
        socklen_t len = sizeof e;
        if (r == 0) {
          e = ETIMEDOUT;
        } else if (r < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) {
          e = errno;
        }
      }
    }
    if (e == 0) {
      tune_tcp(fd);
      err.clear();
      return fd;
    }
    ::close(fd);
    err.fail(errc::backend_unavailable,
             e == ETIMEDOUT ? "no answer within " + std::to_string(opts.connect_timeout.count()) + " ms"
                            : std::string(errno_text(e)));
  }
  return -1;
}

// The client TLS context of `opts` (CA bundle, optional client certificate). Null
// with `err` (the cause, not naming the server) when the settings cannot be used.
std::unique_ptr<SSL_CTX, SslCtxFree> make_tls_context(const ConnectionOptions& opts, Error& err) {
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) {
    err.fail(errc::backend_unavailable, "TLS: " + ssl_errors());
    return nullptr;
  }
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  const bool loaded = opts.tls.ca_file.empty()
                          ? SSL_CTX_set_default_verify_paths(ctx.get()) == 1
                          : SSL_CTX_load_verify_locations(ctx.get(), opts.tls.ca_file.c_str(), nullptr) == 1;
  if (!loaded) {
    err.fail(errc::invalid_url,
             "cannot load the CA certificates" +
                 (opts.tls.ca_file.empty() ? std::string() : " \"" + opts.tls.ca_file + "\"") + ": " +
                 ssl_errors());
    return nullptr;
  }
  if (!opts.tls.cert_file.empty() &&
      (SSL_CTX_use_certificate_chain_file(ctx.get(), opts.tls.cert_file.c_str()) != 1 ||
       SSL_CTX_use_PrivateKey_file(
           ctx.get(), (opts.tls.key_file.empty() ? opts.tls.cert_file : opts.tls.key_file).c_str(),
           SSL_FILETYPE_PEM) != 1 ||
       SSL_CTX_check_private_key(ctx.get()) != 1)) {
    err.fail(errc::invalid_url, "cannot use the client certificate \"" + opts.tls.cert_file +
                                    "\" and key \"" + opts.tls.key_file + "\": " + ssl_errors());
    return nullptr;
  }
  return ctx;
}

// A TLS session over `fd` that verifies the server's name or IP address. Null when
// out of memory.
SSL* new_tls_session(SSL_CTX* ctx, int fd, const std::string& host) {
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr) return nullptr;
  SSL_set_fd(ssl, fd);
  // A write that had to wait is retried with whatever the caller's buffer holds
  // then: callers append to it meanwhile (a NOSCRIPT retry, a pipelined command),
  // which may move it. OpenSSL refuses a moved buffer ("bad write retry") unless
  // told that only the bytes matter.
  SSL_set_mode(ssl, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (is_ip_literal(host)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl, host.c_str());
    SSL_set1_host(ssl, host.c_str());
  }
  return ssl;
}

// Why SSL_connect failed with SSL_get_error() == e (not WANT_READ / WANT_WRITE).
std::string handshake_failure(SSL* ssl, int e) {
  const long verify = SSL_get_verify_result(ssl);
  std::string detail = verify != X509_V_OK ? std::string("certificate verification failed: ") +
                                                 X509_verify_cert_error_string(verify)
                                           : ssl_errors();
  if (detail.empty()) detail = e == SSL_ERROR_SYSCALL ? std::string(errno_text(errno)) : "unknown error";
  return std::string("TLS handshake failed") + (verify == X509_V_OK ? " (is it a TLS port?): " : ": ") +
         detail;
}

// The TLS context of `opts` into `out` (left empty without TLS). False with `err`
// (naming the server) when the settings cannot be used.
bool tls_context_for(const ConnectionOptions& opts, std::unique_ptr<SSL_CTX, SslCtxFree>& out, Error& err) {
  if (!opts.tls.enabled) return true;
  out = make_tls_context(opts, err);
  if (out) return true;
  err.set_detail(opts.describe() + ": " + err.detail());
  return false;
}

}  // namespace

Error check_tls_settings(const ConnectionOptions& opts) {
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx;
  Error err;
  tls_context_for(opts, ctx, err);
  return err;
}

std::unique_ptr<Socket> start_socket(const ConnectionOptions& opts, Error& err) {
  err.clear();
  auto fail = [&](errc code, std::string text) -> std::unique_ptr<Socket> {
    err.fail(code, opts.describe() + ": " + std::move(text));
    return nullptr;
  };
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx;
  if (!tls_context_for(opts, ctx, err)) return nullptr;
  bool pending = false;
  const int fd = connect_tcp(opts, std::nullopt, pending, err);
  if (fd < 0) return fail(errc::backend_unavailable, "cannot connect: " + err.detail());
  std::unique_ptr<Socket> sock(new Socket());
  sock->fd_ = fd;
  sock->timeout_ms_ = static_cast<long>(opts.command_timeout.count());
  sock->state_ = Socket::State::tcp;  // progress_connect() finishes it (at once when done)
  if (ctx) {
    sock->ssl_ = new_tls_session(ctx.get(), fd, opts.host);
    if (sock->ssl_ == nullptr) return fail(errc::backend_unavailable, "TLS: " + ssl_errors());
  }
  return sock;
}

long Socket::progress_connect(short& want, Error& err) {
  if (state_ == State::tcp) {
    pollfd p{fd_, POLLOUT, 0};
    int r = 0;
    while ((r = ::poll(&p, 1, 0)) < 0 && errno == EINTR) {
    }
    if (r == 0) {
      want = POLLOUT;
      return kWouldBlock;
    }
    int so_error = 0;
    socklen_t len = sizeof so_error;
    if (r < 0 || ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
    if (so_error != 0) {
      err.fail(errc::backend_unavailable, std::string("cannot connect: ") + errno_text(so_error));
      return -1;
    }
    tune_tcp(fd_);
    state_ = ssl_ != nullptr ? State::tls : State::open;
  }
  if (state_ == State::tls) {
    std::lock_guard lk(ssl_mu_);
    ERR_clear_error();
    const int r = SSL_connect(ssl_);
    if (r != 1) {
      const int e = SSL_get_error(ssl_, r);
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        want = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return kWouldBlock;
      }
      err.fail(errc::backend_unavailable, handshake_failure(ssl_, e));
      return -1;
    }
    state_ = State::open;
  }
  return 1;
}

std::unique_ptr<Socket> open_socket(const ConnectionOptions& opts, Error& err) {
  err.clear();
  const Clock::time_point connect_deadline = Clock::now() + opts.connect_timeout;
  auto fail = [&](errc code, std::string text) -> std::unique_ptr<Socket> {
    err.fail(code, opts.describe() + ": " + std::move(text));
    return nullptr;
  };
  // TLS settings first: a bad file is the same error whether the server is up or not.
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx;
  if (!tls_context_for(opts, ctx, err)) return nullptr;
  bool pending = false;
  const int fd = connect_tcp(opts, connect_deadline, pending, err);
  if (fd < 0) return fail(errc::backend_unavailable, "cannot connect: " + err.detail());
  std::unique_ptr<Socket> sock(new Socket());
  sock->fd_ = fd;
  sock->timeout_ms_ = static_cast<long>(opts.command_timeout.count());

  if (ctx) {
    SSL* ssl = new_tls_session(ctx.get(), fd, opts.host);
    if (ssl == nullptr) return fail(errc::backend_unavailable, "TLS: " + ssl_errors());
    sock->ssl_ = ssl;
    for (;;) {
      ERR_clear_error();
      const int r = SSL_connect(ssl);
      if (r == 1) break;
      const int e = SSL_get_error(ssl, r);
      if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) &&
          sock->wait(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, connect_deadline)) {
        continue;
      }
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        return fail(errc::backend_unavailable, "TLS handshake: no answer within " +
                                                   std::to_string(opts.connect_timeout.count()) + " ms");
      }
      return fail(errc::backend_unavailable, handshake_failure(ssl, e));
    }
  }

  // AUTH (or PING) and SELECT, one command at a time, within the command timeout.
  ReaderPtr reader = make_reader();
  if (!reader) return fail(errc::backend_unavailable, "out of memory");
  auto run = [&](std::initializer_list<std::string_view> argv, const char* what) -> Reply {
    std::vector<std::string_view> v(argv);
    ArgvArrays args(v);
    char* cmd = nullptr;
    const int len = redisFormatCommandArgv(&cmd, args.argc(), args.ptrs(), args.lens());
    if (len < 0) {
      fail(errc::backend_unavailable, "out of memory");
      return nullptr;
    }
    const std::string formatted(cmd, static_cast<std::size_t>(len));
    redisFreeCommand(cmd);
    const Clock::time_point deadline = Clock::now() + opts.command_timeout;
    Error io;
    if (!sock->write_all(formatted, deadline, io)) {
      fail(errc::backend_unavailable, std::string(what) + " failed: " + io.detail());
      return nullptr;
    }
    auto r = sock->read_reply(*reader, deadline, io);
    if (!r) {
      fail(errc::backend_unavailable, std::string(what) + " failed: " + io.detail());
      return nullptr;
    }
    return Reply(r.release());
  };

  if (!opts.password.empty()) {
    Reply r = opts.user.empty() ? run({"AUTH", opts.password}, "AUTH")
                                : run({"AUTH", opts.user, opts.password}, "AUTH");
    if (!r) return nullptr;
    if (is_error(r.get(), "ERR max number of clients")) {  // a full server, not bad credentials
      err.fail(errc::backend_unavailable,
               opts.describe() + " refused the connection: " + std::string(reply_str(r.get())));
      return nullptr;
    }
    if (r->type == REDIS_REPLY_ERROR) {
      err.fail(errc::auth_failed, opts.describe() + " rejected the credentials" +
                                      (opts.user.empty() ? std::string() : " of user \"" + opts.user + "\"") +
                                      ": " + std::string(reply_str(r.get())));
      return nullptr;
    }
  } else {
    // Without credentials, find out now whether the server wants some, so a
    // connect fails with auth_failed instead of the first lock call.
    Reply r = run({"PING"}, "PING");
    if (!r) return nullptr;
    if (is_error(r.get(), "NOAUTH")) {
      err.fail(errc::auth_failed,
               opts.describe() + " requires a password and none was given (redis://:password@host:port)");
      return nullptr;
    }
    if (r->type == REDIS_REPLY_ERROR) {
      err.fail(error_code_of(r.get()), opts.describe() + ": PING failed: " + std::string(reply_str(r.get())));
      return nullptr;
    }
  }
  if (opts.db != 0) {
    const std::string db = std::to_string(opts.db);
    Reply r = run({"SELECT", db}, "SELECT");
    if (!r) return nullptr;
    if (r->type == REDIS_REPLY_ERROR) {
      err.fail(errc::invalid_url,
               opts.describe() + " refused database " + db + ": " + std::string(reply_str(r.get())));
      return nullptr;
    }
  }
  return sock;
}

}  // namespace distlock::detail::redis
