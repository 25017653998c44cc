#include "redis/shared_connection.hpp"

#include <poll.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>

namespace distlock::detail::redis {

namespace {

using Clock = std::chrono::steady_clock;

// Buffers kept for the next call keep at most this much capacity: a large pipeline (a
// renewal batch) does not pin its memory for the connection's life.
constexpr std::size_t kKeptCapacity = 64 * 1024;

// The calling thread's buffer for formatting its commands, empty, its capacity kept from
// the thread's last call: formatting a call allocates nothing once it has grown.
std::string& format_buffer() {
  thread_local std::string buf;
  if (buf.capacity() > kKeptCapacity) std::string().swap(buf);
  buf.clear();
  return buf;
}

}  // namespace

// One call (a command or a pipeline) waiting for its replies. Lives on the
// caller's stack; it is in a wire's `inflight` until it is complete or failed.
struct SharedConnection::Pending {
  std::size_t expected = 0;
  std::vector<Reply> replies;
  Error ec;  // set when the wire failed before the replies came: names the server and the cause
  bool done = false;
  Clock::time_point deadline;
  std::condition_variable cv;
};

// One socket. Replaced (never repaired) after a failure: its calls failed, and
// bytes still on it could be taken for the answers to later calls. Role holders
// keep it alive through their shared_ptr, so the descriptor is closed only when
// nobody is in a system call on it.
struct SharedConnection::Wire {
  std::unique_ptr<Socket> sock;
  ReaderPtr reader = make_reader();
  std::string out;                // formatted commands not yet written
  std::string spare;              // the last written buffer, emptied: the next `out` (its capacity reused)
  std::vector<Reply> got;         // the reader's replies of one read (only the reading role touches it)
  std::deque<Pending*> inflight;  // calls whose replies are due, in the order they were queued
  bool writing = false;
  bool reading = false;
  bool broken = false;
};

SharedConnection::SharedConnection(ConnectionOptions opts) : opts_(std::move(opts)) {}

SharedConnection::~SharedConnection() = default;

bool SharedConnection::connected() const noexcept {
  LockGuard lk(mu_);
  return wire_ != nullptr && !wire_->broken;
}

SharedConnection::Stats SharedConnection::stats() const noexcept {
  Stats st{calls_.load(std::memory_order_relaxed), writes_.load(std::memory_order_relaxed),
           connects_.load(std::memory_order_relaxed), 0};
  LockGuard lk(mu_);
  if (wire_) st.in_flight = wire_->inflight.size();
  return st;
}

// The wire to queue a call on, connected now if there is none. A wire that is idle
// and readable was closed by the server (restart, CLIENT KILL, idle timeout): it is
// dropped before use, so the call is not lost to a dead socket.
std::shared_ptr<SharedConnection::Wire> SharedConnection::wire_for_call(UniqueLock& lk, Error& ec) {
  if (wire_ && wire_->inflight.empty() && !wire_->reading && !wire_->writing &&
      wire_->sock->idle_but_readable()) {
    wire_.reset();
  }
  if (wire_) return wire_;
  // One connect at a time, outside the lock: callers that arrive meanwhile wait for
  // it and share its outcome, so against a stuck server each call waits for at most
  // one attempt (connect + command timeout), not for every caller's attempt in turn.
  while (connecting_) {
    const std::uint64_t attempt = connect_attempts_;
    while (connecting_) connected_cv_.wait(lk.native());
    if (wire_) return wire_;
    if (connect_attempts_ != attempt && connect_ec_) {  // the attempt waited for failed: so does this call
      ec = connect_ec_;
      return nullptr;
    }
    // It connected and the connection already broke, or another caller began an
    // attempt first: wait for that one, or connect.
  }
  if (wire_) return wire_;
  connecting_ = true;
  lk.unlock();
  auto w = std::make_shared<Wire>();
  Error e;
  w->sock = open_socket(opts_, e);  // TCP or TLS, AUTH, SELECT; non-blocking
  if (!e && !w->reader) e.fail(errc::backend_unavailable, opts_.describe() + ": out of memory");
  lk.lock();
  connecting_ = false;
  ++connect_attempts_;
  connect_ec_ = e;
  connected_cv_.notify_all();
  if (e) {
    ec = std::move(e);
    return nullptr;
  }
  connects_.fetch_add(1, std::memory_order_relaxed);
  wire_ = w;
  return w;
}

void SharedConnection::fail(const std::shared_ptr<Wire>& w, const Error& err) {
  if (w->broken) return;
  w->broken = true;
  for (Pending* p : w->inflight) {
    p->ec = err;
    p->done = true;
    p->cv.notify_one();
  }
  w->inflight.clear();
  w->out.clear();
  w->sock->shutdown();  // wakes a reader blocked in poll() on it
  if (wire_ == w) wire_.reset();
}

// Writes everything queued, including what other threads queue meanwhile: no
// command is left in the buffer when the writing role is given up.
void SharedConnection::write_out(UniqueLock& lk, const std::shared_ptr<Wire>& w) {
  w->writing = true;
  while (!w->out.empty() && !w->broken) {
    std::string buf;
    buf.swap(w->out);
    w->out.swap(w->spare);  // empty, with the capacity of the buffer written before
    const Clock::time_point deadline = Clock::now() + opts_.command_timeout;
    lk.unlock();
    Error io;
    if (!w->sock->write_all(buf, deadline, io)) io.set_detail(opts_.describe() + ": " + io.detail());
    writes_.fetch_add(1, std::memory_order_relaxed);
    buf.clear();
    if (buf.capacity() > kKeptCapacity) std::string().swap(buf);
    lk.lock();
    if (w->spare.capacity() < buf.capacity()) w->spare.swap(buf);
    if (io) fail(w, io);
  }
  w->writing = false;
}

// Reads replies for every call in flight until `mine` is complete (or the wire
// failed), then hands the reading role to the oldest call still waiting.
//
// `just_wrote`: this caller wrote the socket a moment ago (its own commands among what
// went out), so no reply can be there before a round trip: it waits for the socket to be
// readable before reading, instead of a read that finds nothing, then the wait, then the
// read again. That is one system call fewer per call (of five: the idle check, the write,
// the read, the wait, the read). Later reads are tried first only after a read that filled
// the buffer (more is likely waiting); after a shorter one the socket was drained, so the
// next bytes come later and the wait goes first. A TLS connection with decrypted bytes
// already buffered is always read first: poll() cannot see them (OpenSSL's read-ahead is
// off, so SSL_pending counts every byte it took from the socket and has not returned).
void SharedConnection::read_for(UniqueLock& lk, const std::shared_ptr<Wire>& w, Pending& mine,
                                bool just_wrote) {
  w->reading = true;
  char buf[16 * 1024];
  std::vector<Reply>& got = w->got;  // the reading role's: its capacity kept between reads
  bool wait_first = just_wrote;
  while (!mine.done && !w->broken) {
    const Clock::time_point deadline = w->inflight.front()->deadline;
    lk.unlock();
    // Every failure of the wire is backend_unavailable; `io` names the server and the cause.
    Error io;
    auto broke = [&](const std::string& cause) {
      io.fail(errc::backend_unavailable, opts_.describe() + ": " + cause);
    };
    got.clear();
    short want = POLLIN;
    long n =
        wait_first && !w->sock->buffered() ? Socket::kWouldBlock : w->sock->read(buf, sizeof buf, want, io);
    if (n == Socket::kWouldBlock) {
      if (w->sock->wait(want, deadline)) {
        n = w->sock->read(buf, sizeof buf, want, io);
      } else {
        io.fail(errc::backend_unavailable,
                "no reply within " + std::to_string(opts_.command_timeout.count()) + " ms");
      }
    }
    if (io) {
      broke(io.detail());
    } else if (n == 0) {
      broke("the server closed the connection");
    } else if (n > 0) {
      wait_first = static_cast<std::size_t>(n) < sizeof buf;
      if (redisReaderFeed(w->reader.get(), buf, static_cast<std::size_t>(n)) != REDIS_OK) {
        broke("out of memory reading a reply");
      }
      for (;;) {
        void* raw = nullptr;
        if (redisReaderGetReply(w->reader.get(), &raw) != REDIS_OK) {
          broke("protocol error: " + std::string(w->reader->errstr));
          break;
        }
        if (raw == nullptr) break;
        got.emplace_back(static_cast<redisReply*>(raw));
      }
    }  // else: would block again (a spurious wake-up); read on
    lk.lock();
    if (w->broken) break;  // another thread failed it: its calls are answered
    for (Reply& reply : got) {
      if (w->inflight.empty()) {
        broke("a reply nobody asked for");
        break;
      }
      Pending* front = w->inflight.front();
      front->replies.push_back(std::move(reply));
      if (front->replies.size() == front->expected) {
        front->done = true;
        w->inflight.pop_front();
        if (front != &mine) front->cv.notify_one();
      }
    }
    if (io) fail(w, io);
  }
  got.clear();
  w->reading = false;
  if (!w->inflight.empty()) w->inflight.front()->cv.notify_one();
}

std::vector<Reply> SharedConnection::exchange(std::span<const Argv> batch, Error& ec) {
  ec.clear();
  if (batch.empty()) return {};
  std::string& cmds = format_buffer();
  for (const Argv& argv : batch) {
    if (!format_command(cmds, argv)) {
      ec.fail(errc::backend_unavailable, opts_.describe() + ": cannot format a command (out of memory)");
      return std::vector<Reply>(batch.size());
    }
  }
  return send(cmds, batch.size(), ec);
}

// Queues `n` formatted commands as one call and waits for their n replies (the caller's
// `cmds` are copied into the wire's buffer before anything waits). On a failure `ec` is
// set and the n replies are null. `cmds` is the thread's format_buffer(): nothing before
// the copy formats on this thread (connecting writes AUTH and SELECT through socket.hpp).
std::vector<Reply> SharedConnection::send(const std::string& cmds, std::size_t n, Error& ec) {
  std::vector<Reply> out;
  send_into(cmds, n, out, ec);
  return out;
}

void SharedConnection::send_into(const std::string& cmds, std::size_t n, std::vector<Reply>& into,
                                 Error& ec) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  if (opts_.round_trips) opts_.round_trips->add();
  Pending mine;
  mine.expected = n;
  into.clear();
  mine.replies.swap(into);
  mine.replies.reserve(n);
  UniqueLock lk(mu_);
  const std::shared_ptr<Wire> w = wire_for_call(lk, ec);
  if (ec) {
    lk.unlock();
    into.swap(mine.replies);
    into.resize(n);
    return;
  }
  mine.deadline = Clock::now() + opts_.command_timeout;
  w->out += cmds;
  w->inflight.push_back(&mine);
  bool just_wrote = false;  // the step before was this caller's write (see read_for)
  while (!mine.done) {
    if (!w->out.empty() && !w->writing) {
      write_out(lk, w);
      just_wrote = true;
    } else if (!w->reading) {
      read_for(lk, w, mine, just_wrote);
      just_wrote = false;
    } else {
      mine.cv.wait(lk.native());  // woken when complete, failed, or handed the reading role
      just_wrote = false;
    }
  }
  lk.unlock();
  into.swap(mine.replies);
  if (mine.ec) {
    ec = std::move(mine.ec);
    into.clear();
    into.resize(n);
  }
}

Reply SharedConnection::command(std::span<const std::string_view> argv, Error& ec) {
  ec.clear();
  std::string& cmds = format_buffer();
  if (!format_command(cmds, argv)) {
    ec.fail(errc::backend_unavailable, opts_.describe() + ": cannot format a command (out of memory)");
    return nullptr;
  }
  // The calling thread's reply vector: its capacity is kept from one call to the next.
  thread_local std::vector<Reply> replies;
  send_into(cmds, 1, replies, ec);
  Reply r = std::move(replies.front());
  replies.clear();
  if (ec) return nullptr;
  if (r->type == REDIS_REPLY_ERROR) {
    ec.fail(error_code_of(r.get()), opts_.describe() + " answered: " + std::string(reply_str(r.get())));
  }
  return r;
}

}  // namespace distlock::detail::redis
