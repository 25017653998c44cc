// redis/socket.hpp — the transport under every Redis connection of distlock: a TCP
// socket, with TLS (OpenSSL) for rediss:// URLs, connected and authenticated
// (AUTH / PING / SELECT) by `open_socket`. hiredis is kept for what it does well,
// formatting commands and reading RESP (redisFormatCommandArgv, redisReader); the
// socket is ours because Debian's hiredis 0.14 has no TLS.
//
// The descriptor is non-blocking. `read` and `write` do what the socket allows now
// and say what to wait for otherwise (TLS may need to write to read, and read to
// write); `write_all` and `read_reply` wait with poll() up to a deadline. Writes
// never raise SIGPIPE (MSG_NOSIGNAL for TCP; for TLS, whose writes go through
// write(2), SIGPIPE is blocked and consumed in the calling thread only).
//
// Thread-safety: one thread may read while another writes (the shared, pipelined
// connection does): TLS calls are serialised inside; each call is short because the
// socket never blocks. Two concurrent readers or two concurrent writers are not
// allowed.
//
// Example:
// Errors are a detail::Error: the code (backend_unavailable for a transport failure) and
// the cause ("reading failed: Connection reset by peer"); open_socket and start_socket
// name the server in it.
//
// Example:
//   detail::Error err;
//   auto sock = open_socket(opts, err);              // TCP or TLS, then AUTH and SELECT
//   ReaderPtr reader = make_reader();
//   sock->write_all(formatted, deadline, err);
//   Reply r = sock->read_reply(*reader, deadline, err);
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>

#include "engine/backend_error.hpp"

struct ssl_st;  // OpenSSL's SSL

namespace distlock::detail::redis {

struct ConnectionOptions;

struct ReaderDeleter {
  void operator()(redisReader* r) const noexcept { redisReaderFree(r); }
};
using ReaderPtr = std::unique_ptr<redisReader, ReaderDeleter>;
/// A fresh RESP reader (null when out of memory).
ReaderPtr make_reader();

struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};

class Socket {
 public:
  using Clock = std::chrono::steady_clock;
  /// Result of read/write when the socket cannot go on now: poll for `want`.
  static constexpr long kWouldBlock = -2;

  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();

  int fd() const noexcept { return fd_; }
  bool tls() const noexcept { return ssl_ != nullptr; }

  /// Bytes read (> 0), 0 at EOF, -1 on an error (`err`: backend_unavailable and the
  /// cause), or kWouldBlock with `want` set to POLLIN or POLLOUT.
  long read(char* buf, std::size_t n, short& want, Error& err);
  /// Bytes written (> 0), -1 on an error (`err` as for read), or kWouldBlock with `want` set.
  long write(const char* buf, std::size_t n, short& want, Error& err);
  /// True when TLS holds decrypted bytes not read yet (poll() does not see them).
  bool buffered() const;
  /// For a connection with no request in flight: true when anything is readable (EOF
  /// from a server that closed it on an idle timeout, CLIENT KILL or a restart; an
  /// error; stray data). Such a connection must not carry the next request.
  bool idle_but_readable() const noexcept;

  /// Writes all of `data`, waiting up to `deadline`. False with `err` on failure
  /// (backend_unavailable; "the server took no data within N ms" past the deadline, N the
  /// command timeout).
  bool write_all(std::string_view data, Clock::time_point deadline, Error& err);
  /// Reads until `reader` yields one reply, waiting up to `deadline`. Null with `err`
  /// (backend_unavailable) on failure (EOF, error, protocol error, "no reply within N ms"
  /// past the deadline).
  std::unique_ptr<redisReply, ReplyFree> read_reply(redisReader& reader, Clock::time_point deadline,
                                                    Error& err);
  /// Waits until the socket is ready for `want` or the deadline passes (false).
  bool wait(short want, Clock::time_point deadline);

  /// Wakes a thread blocked in poll() on it; later calls fail.
  void shutdown() noexcept;

  /// For a socket from start_socket(): goes on with the TCP connect and then the TLS
  /// handshake as far as possible without waiting. 1 once the socket is ready for
  /// commands (at once for one from open_socket()), kWouldBlock with `want` set, or
  /// -1 with `err` (backend_unavailable: refused, reset, certificate rejected, ...).
  long progress_connect(short& want, Error& err);
  /// True until progress_connect() returned 1.
  bool connecting() const noexcept { return state_ != State::open; }
  /// True while the TLS handshake of a started socket is under way (TCP is up).
  bool handshaking() const noexcept { return state_ == State::tls; }

 private:
  friend std::unique_ptr<Socket> open_socket(const ConnectionOptions&, Error&);
  friend std::unique_ptr<Socket> start_socket(const ConnectionOptions&, Error&);
  enum class State { tcp, tls, open };
  Socket() = default;
  State state_ = State::open;
  int fd_ = -1;
  long timeout_ms_ = 0;  // the command timeout, for messages
  ::ssl_st* ssl_ = nullptr;
  mutable std::mutex ssl_mu_;  // TLS calls of a reader and a writer thread
};

/// Connects to the server of `opts` (TCP, then TLS when opts.tls.enabled, verifying the
/// server's certificate against opts.tls.ca_file and its name or IP against the host),
/// then AUTH (or PING to find out whether a password is required) and SELECT, within
/// the connect and command timeouts. Errors: backend_unavailable (refused, timed out,
/// TLS handshake or certificate failed, naming host:port and the cause), auth_failed,
/// invalid_url (SELECT refused; a TLS file that cannot be read), with the detail naming
/// the server.
std::unique_ptr<Socket> open_socket(const ConnectionOptions& opts, Error& err);

/// Starts connecting to the server of `opts` without waiting, for callers that drive
/// several connections from one poll() loop (Redlock's fan-out): the TCP connect and
/// the TLS handshake go on in Socket::progress_connect(); no AUTH or SELECT is sent
/// (the caller pipelines them before its first command). Of the host's addresses, the
/// first whose connect does not fail at once is used. Fails at once with invalid_url
/// (TLS settings that cannot be used) or backend_unavailable (no address, refused at
/// once), the detail naming the server.
std::unique_ptr<Socket> start_socket(const ConnectionOptions& opts, Error& err);

/// invalid_url naming the problem when the TLS settings of `opts` (CA bundle, client
/// certificate and key) cannot be used; no error otherwise or without TLS. No connection.
Error check_tls_settings(const ConnectionOptions& opts);

}  // namespace distlock::detail::redis
