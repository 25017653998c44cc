// Concurrent fan-out to N independent Redis masters over non-blocking connections
// driven by one poll() loop: every master's request is written first, then the
// replies are collected as they arrive, each master bounded by the same per-node
// deadline. Latency is that of the slowest answering master (capped by the
// timeout), not the sum over masters.
//
// The connections are the Redis stack's own (redis/socket.hpp: TCP, or TLS for
// redlocks:// URLs; hiredis only formats commands and reads RESP). A connection is
// opened without blocking (redis::start_socket) and its TCP connect and TLS
// handshake go on inside the same poll() loop, so a master that is slow to accept
// costs its own per-node timeout and never delays the others. AUTH is pipelined
// in front of the first request on a new connection; its error replies map as on
// redis:// (auth_failed, or unavailable for a full server).
//
// A `Lane` is one connection per master, used by one fan-out at a time; a
// `LanePool` hands lanes to concurrent callers. A connection on which a master did
// not answer in time is never read again: its late replies could otherwise be
// taken for the answers to a later request. It is closed and the next request
// to that master opens a new connection, except for a clean-up sent with
// `Pending::queue_behind` (the release after a failed acquisition): that one is
// written behind the unanswered request on the same connection, so the master
// runs it after the late acquisition, and the connection is closed right after,
// without waiting for any reply.
//
// Thread-safety: `Master` and `LanePool` are thread-safe; a `Lane` is used by one
// thread at a time (take it from the pool).
//
// Example:
//   auto masters = make_masters(url);        // shared by every lane
//   LanePool pool(masters);
//   auto lane = pool.take();
//   std::vector<std::vector<Command>> cmds(masters.size(), {Command{{"PING"}}});
//   auto replies = lane->run(cmds, std::chrono::milliseconds(50));
//   pool.give(std::move(lane));
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distlock/options.hpp"
#include "engine/thread_annotations.hpp"
#include "redis/connection.hpp"
#include "redis/socket.hpp"

namespace distlock::detail::redlock {

using SteadyClock = std::chrono::steady_clock;

using ReplyPtr = redis::Reply;

/// A Lua script called by EVALSHA; `sha1` must be the SHA-1 of `body` (a test
/// checks it against SCRIPT LOAD).
struct Script {
  std::string_view body;
  std::string_view sha1;
};

/// One command for one master, binary-safe. With `script` set, `argv` is
/// {"EVALSHA", sha1, numkeys, keys..., args...}; a NOSCRIPT reply makes the link
/// resend it once as EVAL with the body (which also caches it on the server).
struct Command {
  std::vector<std::string> argv;
  const Script* script = nullptr;
};

/// Commands formatted by hiredis, written through the socket (which never raises
/// SIGPIPE) as far as it takes them now.
class OutBuffer {
 public:
  void append(const std::vector<std::string>& argv);
  bool empty() const noexcept { return pos_ == buf_.size(); }
  /// Writes what the socket takes now; `want` is set when it has to wait. False with
  /// `err` (backend_unavailable and the cause) on a socket error.
  bool flush(redis::Socket& sock, short& want, Error& err);
  void clear() noexcept {
    buf_.clear();
    pos_ = 0;
  }

 private:
  std::string buf_;
  std::size_t pos_ = 0;
};

/// Makes the EVALSHA command for `script` over `keys` and `args`.
Command script_command(const Script& script, std::span<const std::string> keys,
                       std::span<const std::string> args);

/// What a request does on a master whose connection still carries a request
/// that timed out.
enum class Pending {
  reconnect,     ///< close that connection, send on a new one and read the answer
  queue_behind,  ///< write behind the unanswered request, then close; no answer (status timeout)
};

enum class NodeStatus {
  ok,           ///< every command got a reply (which may itself be an error reply)
  timeout,      ///< no complete answer within the deadline
  unreachable,  ///< could not connect, or the connection broke
  auth_failed,  ///< the master rejected the credentials
};

struct NodeReply {
  NodeStatus status = NodeStatus::unreachable;
  std::string error;              ///< why, when status != ok
  std::vector<ReplyPtr> replies;  ///< one per command, in order, when ok
};

/// One master, shared by all lanes: its address, credentials, TLS settings and
/// reconnect backoff.
class Master {
 public:
  explicit Master(redis::ConnectionOptions opts);

  const std::string& label() const noexcept { return label_; }  ///< "host:port"
  const std::string& user() const noexcept { return opts_.user; }
  const std::string& password() const noexcept { return opts_.password; }
  const redis::ConnectionOptions& options() const noexcept { return opts_; }

  /// Starts a non-blocking connection (TCP connect and TLS handshake may still be
  /// in progress: Socket::progress_connect). Returns nullptr with `err` (its detail
  /// naming the master by label) if connecting failed at once or the master is in its
  /// reconnect backoff after a recent failure.
  std::unique_ptr<redis::Socket> open(Error& err);
  /// Records a failed connection attempt (`message` names the master and the cause):
  /// no new connection for a short backoff.
  void connect_failed(const std::string& message);

 private:
  redis::ConnectionOptions opts_;
  std::string label_;
  AnnotatedMutex mu_;
  SteadyClock::time_point retry_after_ DISTLOCK_GUARDED_BY(mu_){};
  std::string last_failure_ DISTLOCK_GUARDED_BY(mu_);  // said by open() during the backoff
};

/// One connection to one master inside a lane; drives one request at a time.
class Link {
 public:
  explicit Link(Master& master) : master_(&master) {}

  /// Starts a request: connects if needed, queues AUTH on a new connection, queues
  /// `cmds` and writes what it can at once.
  void begin(std::span<const Command> cmds, Pending pending = Pending::reconnect);
  bool finished() const noexcept { return failed_ || expect_.empty(); }
  /// The fd and poll events wanted while unfinished.
  int fd() const noexcept { return sock_ ? sock_->fd() : -1; }
  short events() const noexcept;
  void handle(short revents);
  /// Ends the request (a timeout if unfinished) and hands over the result.
  NodeReply finish(Millis timeout);

 private:
  enum class Kind { auth, command };
  struct Expect {
    Kind kind;
    std::size_t index;
    bool retried;
  };
  void append(const std::vector<std::string>& argv) { out_.append(argv); }
  bool progress();  // connecting: false until the socket is ready (or failed)
  void write();
  void read();
  void take_replies();
  void fail(NodeStatus status, std::string message);
  void drop() noexcept;

  Master* master_;
  std::unique_ptr<redis::Socket> sock_;
  redis::ReaderPtr reader_;
  OutBuffer out_;
  short want_ = 0;           // what the socket waits for besides replies (connecting, TLS)
  bool fresh_ = true;        // no reply yet on this connection: a failure counts as a failed connect
  bool unanswered_ = false;  // a request timed out on this connection: never read it again
  // Current request.
  std::span<const Command> cmds_;
  std::deque<Expect> expect_;
  std::vector<ReplyPtr> replies_;
  bool failed_ = false;
  NodeStatus status_ = NodeStatus::ok;
  std::string error_;
};

/// One connection per master; one fan-out at a time.
class Lane {
 public:
  explicit Lane(const std::vector<std::shared_ptr<Master>>& masters);

  /// Sends `per_node[i]` to master i (an empty list skips it), all before waiting
  /// for any reply, then collects until every master answered or `timeout` passed.
  std::vector<NodeReply> run(const std::vector<std::vector<Command>>& per_node, Millis timeout,
                             Pending pending = Pending::reconnect);
  /// The same commands to every master.
  std::vector<NodeReply> run_all(std::span<const Command> cmds, Millis timeout);
  std::size_t size() const noexcept { return links_.size(); }

 private:
  std::vector<NodeReply> collect(SteadyClock::time_point deadline, Millis timeout);
  std::vector<std::shared_ptr<Master>> masters_;  // keeps the masters alive
  std::vector<Link> links_;
};

/// Lanes for concurrent callers; keeps a few idle ones connected.
class LanePool {
 public:
  explicit LanePool(std::vector<std::shared_ptr<Master>> masters, std::size_t max_idle = 64);
  std::unique_ptr<Lane> take();
  void give(std::unique_ptr<Lane> lane);
  const std::vector<std::shared_ptr<Master>>& masters() const noexcept { return masters_; }

 private:
  std::vector<std::shared_ptr<Master>> masters_;
  std::size_t max_idle_;
  AnnotatedMutex mu_;
  std::vector<std::unique_ptr<Lane>> idle_ DISTLOCK_GUARDED_BY(mu_);
};

/// Text of an error or status reply, or a short description of another reply.
std::string reply_text(const redisReply* r);
/// True for an error reply meaning "bad credentials" or "authentication required".
bool is_auth_error(const redisReply* r);

/// One master's connection settings from a redlock:// or redlocks:// URL: the
/// host's address, the URL's credentials, the client's timeouts, and for
/// redlocks:// TLS with the URL's cacert/cert/key (checked: invalid_url naming the
/// problem when they cannot be used).
redis::ConnectionOptions master_options(const Url& url, std::size_t host_index, const ClientOptions& client,
                                        Error& err);

}  // namespace distlock::detail::redlock
