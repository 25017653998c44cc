// redis/connection.hpp — RAII hiredis connections shared by every Redis-based part
// of distlock (the redis:// backend, Redlock, fenced writes, id generators).
//
// What is here:
//   * `ConnectionOptions`  where and how to connect (host, port, ACL user/password,
//                          db, connect and command timeouts as std::chrono durations);
//   * `Connection`         one exclusive connection (redis/socket.hpp: TCP or TLS,
//                          then AUTH + SELECT), blocking calls with deadlines,
//                          binary-safe argv commands, pipelining, error mapping,
//                          lazy reconnect after an I/O error;
//   * `ConnectionPool`     a few connections checked out by threads (grows on demand,
//                          keeps a bounded number idle, discards broken ones, so a
//                          restarted server is reconnected transparently);
//   * `Script`             a Lua script run with EVALSHA, loaded with SCRIPT LOAD on
//                          first use and again whenever a server answers NOSCRIPT.
//
// Errors are `detail::Error`s (engine/backend_error.hpp): a code in distlock::category()
//   backend_unavailable  refused / timed out / connection broken (names host:port),
//                        and server replies LOADING, BUSY, MASTERDOWN, TRYAGAIN, READONLY,
//                        "ERR max number of clients reached" (also when it answers AUTH);
//   auth_failed          WRONGPASS / NOAUTH / NOPERM / invalid password (names the server);
//   invalid_url          the server refused the SELECT of the configured database;
//   protocol_error       any other error reply, or a reply of an unexpected type.
// The socket is ours (redis/socket.hpp: Debian's hiredis 0.14 has no TLS); hiredis
// formats the commands and parses the replies.
// and a detail naming the server and the problem ("redis 127.0.0.1:6379: connection
// refused"), filled by the call that failed and travelling with it (callers put it into
// their own message).
//
// Thread-safety: a `Connection` belongs to one thread at a time (hiredis contexts
// are not thread-safe). `ConnectionPool` and `Script` are safe to share between
// threads; a connection checked out of the pool is exclusively the caller's until
// the handle is destroyed.
//
// Example:
//   ConnectionOptions o;
//   o.host = "127.0.0.1"; o.port = 6379; o.password = "s3cret";
//   ConnectionPool pool(o);
//   detail::Error ec;
//   auto conn = pool.checkout(ec);                         // PooledConnection
//   if (ec) throw_error(ec, ec.detail());
//   Reply r = conn->command({"SET", key, value, "PX", "5000", "NX"}, ec);
//
//   static const Script& kIncr = *new Script("return redis.call('INCR', KEYS[1])");
//   Reply n = kIncr.run(*conn, {key}, {}, ec);              // EVALSHA, NOSCRIPT handled
//
//   conn->append({"PING"});                                 // pipelining
//   conn->append({"GET", key});
//   std::vector<Reply> both = conn->read_replies(2, ec);
#pragma once

#include <hiredis/hiredis.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "distlock/error.hpp"
#include "distlock/options.hpp"
#include "engine/backend_error.hpp"
#include "engine/round_trips.hpp"
#include "engine/thread_annotations.hpp"
#include "engine/url.hpp"
#include "redis/socket.hpp"

namespace distlock::detail::redis {

/// Where and how to connect to one Redis server.
struct ConnectionOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  /// ACL user name. Empty: `AUTH <password>` (the "default" user) when a password is set.
  std::string user;
  /// Empty: no AUTH is sent.
  std::string password;
  /// Logical database selected after connecting (SELECT), 0..(databases-1). 0 sends no SELECT.
  int db = 0;
  /// Time to establish the TCP connection. Default 2 s.
  Millis connect_timeout{std::chrono::seconds(2)};
  /// Time one command (send + reply) may take. Default 2 s.
  Millis command_timeout{std::chrono::seconds(2)};
  /// TLS (rediss:// URLs): the server's certificate is verified against `ca_file` (the
  /// system's CAs when empty) and the host name or IP address it was reached by.
  struct Tls {
    bool enabled = false;
    std::string ca_file;    ///< PEM CA bundle (URL ?cacert=)
    std::string cert_file;  ///< PEM client certificate chain for mutual TLS (?cert=)
    std::string key_file;   ///< PEM private key of cert_file (?key=; default: cert_file)
  };
  Tls tls;
  /// Where every connection made with these options adds its round trips (a command, a
  /// flushed pipeline, a subscriber's write): the owning client's count
  /// (engine/round_trips.hpp). Null: not counted.
  std::shared_ptr<RoundTrips> round_trips;

  /// "redis 127.0.0.1:6379" — the prefix of every message about this server.
  std::string describe() const;
};

/// Builds options for `url.hosts[host_index]` (default port 6379) with the URL's
/// user/password and the client's timeouts; a rediss:// (or redlocks://) URL turns TLS on, with its
/// cacert/cert/key query parameters (files that must be readable: invalid_url otherwise). The db comes from
/// the URL path "/N" (see parse_db_path); a bad path sets invalid_url naming it.
ConnectionOptions options_from_url(const Url& url, std::size_t host_index, const ClientOptions& client,
                                   Error& err);

/// `opts` with its round trips added to `counter` (ConnectionOptions::round_trips).
inline ConnectionOptions counted(ConnectionOptions opts, std::shared_ptr<RoundTrips> counter) {
  opts.round_trips = std::move(counter);
  return opts;
}

/// `opts` counting into its own counter when it has none yet.
inline ConnectionOptions counted(ConnectionOptions opts) {
  if (!opts.round_trips) opts.round_trips = std::make_shared<RoundTrips>();
  return opts;
}

/// Parses the "/N" database path of a redis URL ("" or "/" → 0). invalid_url naming
/// the path when it is not a number in 0..9999.
Error parse_db_path(const Url& url, int& db);

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
/// One reply (with its nested elements), freed by freeReplyObject.
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

/// A list of binary-safe arguments; views must outlive the call.
using Argv = std::vector<std::string_view>;

/// Appends one command in RESP to `out` (hiredis formats it). False when out of memory.
bool format_command(std::string& out, std::span<const std::string_view> argv);

/// The (argc, argv, argvlen) form hiredis takes, pointing into `argv` (which must
/// outlive it).
struct ArgvArrays {
  explicit ArgvArrays(std::span<const std::string_view> argv) : argc_(argv.size()) {
    // A lock call has a dozen arguments: its arrays live here, not on the heap.
    if (argv.size() > kInline) {
      more_ptrs_.resize(argv.size());
      more_lens_.resize(argv.size());
    }
    const char** p = ptrs();
    std::size_t* l = lens();
    for (std::size_t i = 0; i < argv.size(); ++i) {
      p[i] = argv[i].data();
      l[i] = argv[i].size();
    }
  }
  ArgvArrays(const ArgvArrays&) = delete;
  ArgvArrays& operator=(const ArgvArrays&) = delete;
  int argc() const noexcept { return static_cast<int>(argc_); }
  const char** ptrs() noexcept { return argc_ > kInline ? more_ptrs_.data() : inline_ptrs_; }
  std::size_t* lens() noexcept { return argc_ > kInline ? more_lens_.data() : inline_lens_; }

 private:
  static constexpr std::size_t kInline = 16;
  std::size_t argc_;
  const char* inline_ptrs_[kInline];
  std::size_t inline_lens_[kInline];
  std::vector<const char*> more_ptrs_;
  std::vector<std::size_t> more_lens_;
};

// ---- reply helpers ----------------------------------------------------------

/// The reply's string payload (string, status, error or verbatim), else empty.
std::string_view reply_str(const redisReply* r) noexcept;
/// True for an error reply whose text starts with `prefix` (e.g. "NOSCRIPT").
bool is_error(const redisReply* r, std::string_view prefix = {}) noexcept;
/// Maps an error reply to a distlock code (see the banner). Non-error → {}.
std::error_code error_code_of(const redisReply* r) noexcept;
/// A non-negative integer reply, or a string reply of decimal digits only, into `out`;
/// false (and `out` unchanged) for anything else: null, a negative integer, another type.
bool to_u64(const redisReply* r, std::uint64_t& out) noexcept;

/// A way to send commands to one server and read their replies in order: an
/// exclusive `Connection`, or a `SharedConnection` (redis/shared_connection.hpp)
/// that many threads pipeline through. Scripts and the lock calls take a Link, so
/// they run on either.
class Link {
 public:
  virtual ~Link() = default;
  /// One command and its reply. `ec` is set on a transport failure (reply is null)
  /// and on an error reply (the reply is returned so the caller can read its text);
  /// its detail names the server and the problem: "redis 127.0.0.1:6379: connection
  /// refused", "redis 127.0.0.1:6379 answered: NOPERM ...".
  virtual Reply command(std::span<const std::string_view> argv, Error& ec) = 0;
  Reply command(std::initializer_list<std::string_view> argv, Error& ec) {
    return command(std::span<const std::string_view>(argv.begin(), argv.size()), ec);
  }
  /// A pipeline: every command sent before any reply is awaited; one reply per
  /// command, in order. Error replies are returned as such; `ec` means the transport
  /// failed (every reply of the batch is then null), its detail naming the server.
  virtual std::vector<Reply> exchange(std::span<const Argv> batch, Error& ec) = 0;
  /// False once the transport failed (the next call connects again).
  virtual bool connected() const noexcept = 0;
};

/// One blocking connection to one server. Move-only; reconnects lazily: after an
/// I/O error or timeout the socket is dropped (the stream may be out of sync)
/// and the next call connects again (AUTH and SELECT included).
class Connection final : public Link {
 public:
  explicit Connection(ConnectionOptions opts);
  Connection(Connection&&) noexcept = default;
  Connection& operator=(Connection&&) noexcept = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() override = default;

  /// Connects now if not connected (TCP, timeouts, AUTH, SELECT). On failure the
  /// connection stays closed: backend_unavailable naming host:port, or auth_failed
  /// naming the server.
  void connect(Error& ec);
  bool connected() const noexcept override { return sock_ != nullptr; }
  /// Closes the socket; the next call reconnects.
  void close() noexcept;

  /// Sends one command and reads its reply (connecting first if needed).
  /// `ec` is set on a transport failure (reply is null) and on an error reply
  /// (the reply is returned so the caller can read its text).
  Reply command(std::span<const std::string_view> argv, Error& ec) override;
  using Link::command;
  /// append() every command, then read_replies().
  std::vector<Reply> exchange(std::span<const Argv> batch, Error& ec) override;

  /// Pipelining: append() buffers commands locally (nothing is sent); read_reply()
  /// flushes the buffer and reads the next reply in order; read_replies(n) reads n.
  /// Unlike command(), error replies are returned without setting `ec` (each reply
  /// of a pipeline is judged by the caller); `ec` means the transport failed and
  /// the connection was dropped (later replies of the batch are gone).
  /// append() connects first if needed; a failed connect is reported by the read.
  void append(std::span<const std::string_view> argv);
  void append(std::initializer_list<std::string_view> argv) {
    append(std::span<const std::string_view>(argv.begin(), argv.size()));
  }
  /// Sends the appended commands now without waiting for replies, so a caller
  /// talking to several servers (Redlock) can send to all of them first and then
  /// read: the latency is the slowest server's, not the sum. read_reply() flushes
  /// too; this is only needed for that fan-out.
  void flush(Error& ec);
  Reply read_reply(Error& ec);
  std::vector<Reply> read_replies(std::size_t n, Error& ec);
  /// Replies still expected for appended commands.
  std::size_t pending() const noexcept { return pending_; }

  const ConnectionOptions& options() const noexcept { return opts_; }
  /// Counts round trips (a command, or one flushed pipeline) since construction.
  std::uint64_t round_trips() const noexcept { return round_trips_; }

  /// True when the idle socket is readable (EOF or unsolicited data): the server
  /// closed it or restarted. Cheap (poll with zero timeout). Used by the pool.
  bool looks_broken() const noexcept;

 private:
  void fail_io(Error& ec, std::string_view during, const std::string& cause);
  void fail_reply(const redisReply* r, Error& ec) const;
  bool send_buffered(Error& ec);

  ConnectionOptions opts_;
  std::unique_ptr<Socket> sock_;
  ReaderPtr reader_;
  std::string obuf_;  // appended commands not sent yet
  std::size_t pending_ = 0;
  bool pending_connect_failed_ = false;
  Error pending_ec_;  // why the replies still pending are lost (a failed connect or send)
  std::uint64_t round_trips_ = 0;
};

class ConnectionPool;

/// A connection checked out of a pool; returned to it on destruction unless it
/// broke (then it is discarded and the pool opens a new one next time).
class PooledConnection {
 public:
  PooledConnection() noexcept = default;
  PooledConnection(PooledConnection&&) noexcept;
  PooledConnection& operator=(PooledConnection&&) noexcept;
  PooledConnection(const PooledConnection&) = delete;
  PooledConnection& operator=(const PooledConnection&) = delete;
  ~PooledConnection();

  Connection& operator*() const noexcept { return *conn_; }
  Connection* operator->() const noexcept { return conn_.get(); }
  explicit operator bool() const noexcept { return conn_ != nullptr; }

 private:
  friend class ConnectionPool;
  PooledConnection(ConnectionPool* pool, std::unique_ptr<Connection> conn) noexcept
      : pool_(pool), conn_(std::move(conn)) {}
  ConnectionPool* pool_ = nullptr;
  std::unique_ptr<Connection> conn_;
};

/// Connections to one server shared by threads: checkout() hands out an idle
/// connection (or opens a new one: the pool grows lazily, without a hard limit,
/// since every caller holds at most one), and keeps at most `max_idle` idle ones.
/// A connection that broke or whose socket shows EOF is discarded, so the first
/// call after a server restart goes out on a fresh connection.
/// Must outlive every PooledConnection it handed out.
class ConnectionPool {
 public:
  explicit ConnectionPool(ConnectionOptions opts, std::size_t max_idle = 4);
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;
  ~ConnectionPool();

  /// An open connection, or an empty handle with ec (backend_unavailable or
  /// auth_failed), its detail naming the server and the cause.
  PooledConnection checkout(Error& ec);
  const ConnectionOptions& options() const noexcept { return opts_; }
  /// Idle connections now held (for tests).
  std::size_t idle() const;

 private:
  friend class PooledConnection;
  void give_back(std::unique_ptr<Connection> conn) noexcept;

  const ConnectionOptions opts_;
  const std::size_t max_idle_;
  mutable AnnotatedMutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_ DISTLOCK_GUARDED_BY(mu_);
};

/// A Lua script called with EVALSHA. The SHA1 comes from SCRIPT LOAD the first
/// time the script runs anywhere; on NOSCRIPT (a restarted or flushed server) it is
/// loaded on that connection and the call is retried once. Safe to share. The shared
/// ones are made with `new` and never destroyed (`static const Script& s = *new
/// Script(...)`): a renewer thread may still run one while the process exits (an
/// engine whose last handle was dropped inside a loss signal is destroyed on a thread
/// of its own), and a destroyed static would be read after its destructor ran.
class Script {
 public:
  explicit Script(std::string source);
  Script(const Script&) = delete;
  Script& operator=(const Script&) = delete;

  /// EVALSHA with `keys` and `args` (binary-safe). Same ec rules as Connection::command.
  Reply run(Link& conn, std::span<const std::string_view> keys, std::span<const std::string_view> args,
            Error& ec) const;
  Reply run(Link& conn, std::initializer_list<std::string_view> keys,
            std::initializer_list<std::string_view> args, Error& ec) const {
    return run(conn, std::span<const std::string_view>(keys.begin(), keys.size()),
               std::span<const std::string_view>(args.begin(), args.size()), ec);
  }

  /// One call of a pipelined batch.
  struct Call {
    std::span<const std::string_view> keys;
    std::span<const std::string_view> args;
  };
  /// Runs every call in one pipeline (one round trip; a second one only for the
  /// calls that met NOSCRIPT). Returns one reply per call, in order; error replies
  /// are returned as such, `ec` only reports a transport failure.
  std::vector<Reply> run_pipelined(Link& conn, std::span<const Call> calls, Error& ec) const;

  /// Loads the script on this connection (SCRIPT LOAD) and remembers its SHA1.
  void load(Link& conn, Error& ec) const;
  /// The SHA1 once loaded, else empty.
  std::string sha() const;
  const std::string& source() const noexcept { return source_; }

 private:
  Argv evalsha_argv(const std::string& sha, std::span<const std::string_view> keys,
                    std::span<const std::string_view> args, std::string& numkeys) const;
  std::string ensure_sha(Link& conn, Error& ec) const;
  using Sha = std::array<char, 40>;
  /// The SHA1 into `out` once loaded; false before.
  bool copy_sha(Sha& out) const;

  const std::string source_;
  mutable AnnotatedMutex mu_;
  mutable std::string sha_ DISTLOCK_GUARDED_BY(mu_);
};

}  // namespace distlock::detail::redis
