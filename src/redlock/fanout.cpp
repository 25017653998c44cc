#include "redlock/fanout.hpp"

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <ctime>

namespace distlock::detail::redlock {

namespace {

// After a failed connection attempt, lanes fail fast for this long instead of
// reconnecting on every fan-out.
constexpr Millis kReconnectBackoff{100};

bool starts_with(const redisReply* r, std::string_view prefix) {
  return r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).substr(0, prefix.size()) == prefix;
}

}  // namespace

void OutBuffer::append(const std::vector<std::string>& argv) {
  if (empty()) clear();
  const std::vector<std::string_view> views(argv.begin(), argv.end());
  if (!redis::format_command(buf_, views)) throw std::bad_alloc();
}

bool OutBuffer::flush(redis::Socket& sock, short& want, Error& err) {
  err.clear();
  while (pos_ < buf_.size()) {
    const long n = sock.write(buf_.data() + pos_, buf_.size() - pos_, want, err);
    if (n > 0) {
      pos_ += static_cast<std::size_t>(n);
      continue;
    }
    // The socket buffer is full (or TLS must read first): poll() says when to go on.
    if (n == redis::Socket::kWouldBlock) return true;
    if (!err) err.fail(errc::backend_unavailable, "the connection is closed");
    return false;
  }
  clear();
  return true;
}

Command script_command(const Script& script, std::span<const std::string> keys,
                       std::span<const std::string> args) {
  Command c;
  c.script = &script;
  c.argv.reserve(3 + keys.size() + args.size());
  c.argv.emplace_back("EVALSHA");
  c.argv.emplace_back(script.sha1);
  c.argv.push_back(std::to_string(keys.size()));
  c.argv.insert(c.argv.end(), keys.begin(), keys.end());
  c.argv.insert(c.argv.end(), args.begin(), args.end());
  return c;
}

std::string reply_text(const redisReply* r) {
  if (!r) return "(no reply)";
  switch (r->type) {
    case REDIS_REPLY_ERROR:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_STRING: return std::string(r->str, r->len);
    case REDIS_REPLY_INTEGER: return std::to_string(r->integer);
    case REDIS_REPLY_NIL: return "(nil)";
    case REDIS_REPLY_ARRAY: return fmt::format("(array of {})", r->elements);
    default: return fmt::format("(reply type {})", r->type);
  }
}

bool is_auth_error(const redisReply* r) {
  return r && (starts_with(r, "NOAUTH") || starts_with(r, "WRONGPASS") ||
               starts_with(r, "ERR invalid password") || starts_with(r, "ERR AUTH"));
}

// ---- Master -----------------------------------------------------------------

redis::ConnectionOptions master_options(const Url& url, std::size_t host_index, const ClientOptions& client,
                                        Error& err) {
  redis::ConnectionOptions o = redis::options_from_url(url, host_index, client, err);
  if (!err) err = redis::check_tls_settings(o);
  return o;
}

Master::Master(redis::ConnectionOptions opts) : opts_(std::move(opts)) {
  label_ = opts_.host.find(':') != std::string::npos ? fmt::format("[{}]:{}", opts_.host, opts_.port)
                                                     : fmt::format("{}:{}", opts_.host, opts_.port);
}

std::unique_ptr<redis::Socket> Master::open(Error& err) {
  err.clear();
  {
    LockGuard lk(mu_);
    if (SteadyClock::now() < retry_after_) {
      err.fail(errc::backend_unavailable, last_failure_);
      return nullptr;
    }
  }
  auto sock = redis::start_socket(opts_, err);
  if (!sock) {
    // start_socket names "redis host:port"; the fan-out's messages name masters by label.
    std::string cause = err.detail();
    const std::string prefix = opts_.describe() + ": ";
    if (cause.rfind(prefix, 0) == 0) cause.erase(0, prefix.size());
    err.set_detail(fmt::format("{}: {}", label_, cause));
    connect_failed(err.detail());
    return nullptr;
  }
  return sock;
}

void Master::connect_failed(const std::string& message) {
  LockGuard lk(mu_);
  retry_after_ = SteadyClock::now() + kReconnectBackoff;
  last_failure_ = message;
}

// ---- Link -------------------------------------------------------------------

void Link::begin(std::span<const Command> cmds, Pending pending) {
  cmds_ = cmds;
  expect_.clear();
  replies_.clear();
  replies_.resize(cmds.size());
  failed_ = false;
  status_ = NodeStatus::ok;
  error_.clear();
  if (cmds.empty()) return;
  if (unanswered_) {
    if (pending == Pending::queue_behind && sock_ && !sock_->connecting()) {
      // Best effort: what the socket takes now is run by the master after the
      // unanswered request; the rest is dropped with the connection.
      for (const auto& c : cmds) append(c.argv);
      Error ignored;
      short want = 0;
      (void)out_.flush(*sock_, want, ignored);
      drop();
      failed_ = true;
      status_ = NodeStatus::timeout;
      error_ = fmt::format(
          "{} had not answered an earlier request; this one was queued behind it and the "
          "connection closed",
          master_->label());
      return;
    }
    drop();
  } else if (sock_ && !sock_->connecting() && sock_->idle_but_readable()) {
    // The master closed this idle connection (its idle timeout, CLIENT KILL, a
    // restart): a request written on it would fail with the master up. It never saw
    // this request, so a new connection carries it.
    drop();
  }
  if (!sock_) {
    Error err;
    sock_ = master_->open(err);
    reader_ = redis::make_reader();
    if (!sock_ || !reader_) {
      sock_.reset();
      failed_ = true;
      status_ = NodeStatus::unreachable;
      error_ = err.detail().empty() ? fmt::format("{}: out of memory", master_->label()) : err.take_detail();
      return;
    }
    fresh_ = true;
    if (!master_->password().empty()) {
      std::vector<std::string> auth{"AUTH"};
      if (!master_->user().empty()) auth.push_back(master_->user());
      auth.push_back(master_->password());
      append(auth);
      expect_.push_back({Kind::auth, 0, false});
    }
  }
  for (std::size_t i = 0; i < cmds.size(); ++i) {
    append(cmds[i].argv);
    expect_.push_back({Kind::command, i, false});
  }
  // Send now: every master gets its request before the lane waits for any reply.
  // On a connection still being set up this writes nothing and poll() reports
  // when it can.
  write();
}

short Link::events() const noexcept {
  if (finished() || !sock_) return 0;
  if (sock_->connecting()) return want_;
  return static_cast<short>(POLLIN | want_ | (out_.empty() ? 0 : POLLOUT));
}

bool Link::progress() {
  if (!sock_->connecting()) return true;
  Error err;
  want_ = 0;
  const long r = sock_->progress_connect(want_, err);
  if (r == 1) {
    want_ = 0;
    return true;
  }
  if (r != redis::Socket::kWouldBlock)
    fail(NodeStatus::unreachable, fmt::format("{}: {}", master_->label(), err.detail()));
  return false;
}

void Link::write() {
  if (!sock_ || !progress() || out_.empty()) return;
  Error err;
  want_ = 0;
  if (!out_.flush(*sock_, want_, err)) {
    fail(NodeStatus::unreachable, fmt::format("{}: {}", master_->label(), err.detail()));
    return;
  }
  if (want_ == POLLOUT) want_ = 0;  // events() asks for POLLOUT while output is queued
}

void Link::handle(short revents) {
  if (!sock_) return;
  if (sock_->connecting()) {
    write();  // goes on connecting, then sends what is queued
    return;
  }
  // A TLS record may need the other direction (want_): either event retries both.
  if ((revents & POLLOUT) != 0 || want_ != 0) {
    write();
    if (failed_) return;
  }
  if ((revents & (POLLIN | POLLHUP | POLLERR)) != 0 || want_ != 0) read();
}

void Link::read() {
  char buf[16 * 1024];
  std::string closed;  // why the connection ended, after the replies read before it
  for (;;) {
    Error err;
    short want = 0;
    const long n = sock_->read(buf, sizeof buf, want, err);
    if (n > 0) {
      if (redisReaderFeed(reader_.get(), buf, static_cast<std::size_t>(n)) != REDIS_OK) {
        fail(NodeStatus::unreachable, fmt::format("{}: out of memory reading a reply", master_->label()));
        return;
      }
      continue;
    }
    if (n == redis::Socket::kWouldBlock) {
      want_ = want == POLLOUT ? POLLOUT : 0;
    } else {
      closed = n == 0 ? "the server closed the connection" : err.detail();
    }
    break;
  }
  take_replies();
  if (closed.empty() || failed_) return;
  if (expect_.empty()) {
    drop();  // every reply arrived; the next request connects again
  } else {
    fail(NodeStatus::unreachable, fmt::format("{}: {}", master_->label(), closed));
  }
}

void Link::take_replies() {
  for (;;) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader_.get(), &raw) != REDIS_OK) {
      fail(NodeStatus::unreachable, fmt::format("{}: protocol error: {}", master_->label(), reader_->errstr));
      return;
    }
    if (!raw) return;
    ReplyPtr reply(static_cast<redisReply*>(raw));
    fresh_ = false;
    if (expect_.empty()) {
      fail(NodeStatus::unreachable,
           fmt::format("{}: unexpected reply {}", master_->label(), reply_text(reply.get())));
      return;
    }
    const Expect e = expect_.front();
    expect_.pop_front();
    if (e.kind == Kind::auth && starts_with(reply.get(), "ERR max number of clients")) {
      // A full master, not bad credentials (as on redis://).
      fail(NodeStatus::unreachable,
           fmt::format("{} refused the connection: {}", master_->label(), reply_text(reply.get())));
      return;
    }
    if (e.kind == Kind::auth || is_auth_error(reply.get())) {
      if (reply->type == REDIS_REPLY_ERROR) {
        fail(NodeStatus::auth_failed,
             fmt::format("{} rejected the credentials: {}", master_->label(), reply_text(reply.get())));
        return;
      }
      if (e.kind == Kind::auth) continue;
    }
    const Command& cmd = cmds_[e.index];
    if (cmd.script && !e.retried && starts_with(reply.get(), "NOSCRIPT")) {
      // The master does not have the script cached (restarted, or SCRIPT FLUSH):
      // send the body once; EVAL caches it for the next EVALSHA.
      std::vector<std::string> argv;
      argv.reserve(cmd.argv.size());
      argv.emplace_back("EVAL");
      argv.emplace_back(cmd.script->body);
      argv.insert(argv.end(), cmd.argv.begin() + 2, cmd.argv.end());
      append(argv);
      expect_.push_back({Kind::command, e.index, true});
      write();
      if (failed_) return;
      continue;
    }
    replies_[e.index] = std::move(reply);
  }
}

void Link::fail(NodeStatus status, std::string message) {
  failed_ = true;
  status_ = status;
  error_ = std::move(message);
  if (fresh_) master_->connect_failed(error_);
  drop();
}

void Link::drop() noexcept {
  sock_.reset();
  reader_.reset();
  want_ = 0;
  unanswered_ = false;
  out_.clear();
  fresh_ = true;
  expect_.clear();
}

NodeReply Link::finish(Millis timeout) {
  NodeReply out;
  if (failed_) {
    out.status = status_;
    out.error = std::move(error_);
  } else if (!expect_.empty()) {
    out.status = NodeStatus::timeout;
    if (sock_ && sock_->handshaking()) {
      out.error = fmt::format("{}: TLS handshake: no answer within {} ms (is it a TLS port?)",
                              master_->label(), timeout.count());
    } else if (sock_ && sock_->connecting()) {
      out.error =
          fmt::format("{}: cannot connect: no answer within {} ms", master_->label(), timeout.count());
    } else {
      out.error = fmt::format("{} did not answer within {} ms", master_->label(), timeout.count());
    }
    // Never read this connection again: a late reply could be taken for the
    // answer to a later request. It stays open only until the next request on
    // this link, which closes it (after queueing a clean-up behind the
    // unanswered request, with Pending::queue_behind).
    // Bytes not yet written stay queued: a clean-up appended behind them must
    // not cut a command in half.
    unanswered_ = true;
    expect_.clear();
  } else {
    out.status = NodeStatus::ok;
    out.replies = std::move(replies_);
  }
  cmds_ = {};
  replies_.clear();
  return out;
}

// ---- Lane -------------------------------------------------------------------

Lane::Lane(const std::vector<std::shared_ptr<Master>>& masters) : masters_(masters) {
  links_.reserve(masters_.size());
  for (auto& m : masters_) links_.emplace_back(*m);
}

std::vector<NodeReply> Lane::run(const std::vector<std::vector<Command>>& per_node, Millis timeout,
                                 Pending pending) {
  const auto deadline = SteadyClock::now() + timeout;
  for (std::size_t i = 0; i < links_.size(); ++i) {
    links_[i].begin(i < per_node.size() ? std::span<const Command>(per_node[i]) : std::span<const Command>(),
                    pending);
  }
  return collect(deadline, timeout);
}

std::vector<NodeReply> Lane::run_all(std::span<const Command> cmds, Millis timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  for (auto& link : links_) link.begin(cmds);
  return collect(deadline, timeout);
}

std::vector<NodeReply> Lane::collect(SteadyClock::time_point deadline, Millis timeout) {
  std::vector<pollfd> fds;
  std::vector<std::size_t> which;
  fds.reserve(links_.size());
  which.reserve(links_.size());
  for (;;) {
    fds.clear();
    which.clear();
    for (std::size_t i = 0; i < links_.size(); ++i) {
      const short ev = links_[i].events();
      if (ev == 0) continue;
      fds.push_back({links_[i].fd(), ev, 0});
      which.push_back(i);
    }
    if (fds.empty()) break;
    // Past the deadline, one last look without waiting: if this thread was
    // descheduled, answers that arrived in time are already in the sockets and
    // must not be counted as timeouts.
    const auto left =
        std::max(std::chrono::nanoseconds(0),
                 std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - SteadyClock::now()));
    const bool last_look = left.count() == 0;
    timespec ts{static_cast<std::time_t>(left.count() / 1'000'000'000),
                static_cast<long>(left.count() % 1'000'000'000)};
    const int n = ppoll(fds.data(), fds.size(), &ts, nullptr);
    if (n < 0 && errno != EINTR) break;
    for (std::size_t k = 0; n > 0 && k < fds.size(); ++k) {
      if (fds[k].revents != 0) links_[which[k]].handle(fds[k].revents);
    }
    if (last_look) break;
  }
  std::vector<NodeReply> out;
  out.reserve(links_.size());
  for (auto& l : links_) out.push_back(l.finish(timeout));
  return out;
}

// ---- LanePool ---------------------------------------------------------------

LanePool::LanePool(std::vector<std::shared_ptr<Master>> masters, std::size_t max_idle)
    : masters_(std::move(masters)), max_idle_(max_idle) {}

std::unique_ptr<Lane> LanePool::take() {
  {
    LockGuard lk(mu_);
    if (!idle_.empty()) {
      auto lane = std::move(idle_.back());
      idle_.pop_back();
      return lane;
    }
  }
  return std::make_unique<Lane>(masters_);
}

void LanePool::give(std::unique_ptr<Lane> lane) {
  if (!lane) return;
  LockGuard lk(mu_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(lane));
}

}  // namespace distlock::detail::redlock
