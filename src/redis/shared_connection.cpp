#include "redis/shared_connection.hpp"

#include <poll.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>

namespace distlock::detail::redis {

namespace {

using Clock = std::chrono::steady_clock;

thread_local std::string tl_last_error;

}  // namespace

// One call (a command or a pipeline) waiting for its replies. Lives on the
// caller's stack; it is in a wire's `inflight` until it is complete or failed.
struct SharedConnection::Pending {
  std::size_t expected = 0;
  std::vector<Reply> replies;
  std::error_code ec;
  std::string why;
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
  std::deque<Pending*> inflight;  // calls whose replies are due, in the order they were queued
  bool writing = false;
  bool reading = false;
  bool broken = false;
};

SharedConnection::SharedConnection(ConnectionOptions opts) : opts_(std::move(opts)) {}

SharedConnection::~SharedConnection() = default;

std::string SharedConnection::last_error() const {
  return tl_last_error;
}

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
std::shared_ptr<SharedConnection::Wire> SharedConnection::wire_for_call(UniqueLock& lk, std::error_code& ec,
                                                                        std::string& why) {
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
      why = connect_why_;
      return nullptr;
    }
    // It connected and the connection already broke, or another caller began an
    // attempt first: wait for that one, or connect.
  }
  if (wire_) return wire_;
  connecting_ = true;
  lk.unlock();
  auto w = std::make_shared<Wire>();
  std::error_code e;
  std::string text;
  w->sock = open_socket(opts_, e, text);  // TCP or TLS, AUTH, SELECT; non-blocking
  if (!e && !w->reader) {
    e = make_error_code(errc::backend_unavailable);
    text = opts_.describe() + ": out of memory";
  }
  lk.lock();
  connecting_ = false;
  ++connect_attempts_;
  connect_ec_ = e;
  connect_why_ = text;
  connected_cv_.notify_all();
  if (e) {
    ec = e;
    why = text;
    return nullptr;
  }
  connects_.fetch_add(1, std::memory_order_relaxed);
  wire_ = w;
  return w;
}

void SharedConnection::fail(const std::shared_ptr<Wire>& w, const std::string& why) {
  if (w->broken) return;
  w->broken = true;
  for (Pending* p : w->inflight) {
    p->ec = make_error_code(errc::backend_unavailable);
    p->why = why;
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
    const Clock::time_point deadline = Clock::now() + opts_.command_timeout;
    lk.unlock();
    std::string why;
    if (!w->sock->write_all(buf, deadline, why)) why = opts_.describe() + ": " + why;
    writes_.fetch_add(1, std::memory_order_relaxed);
    lk.lock();
    if (!why.empty()) fail(w, why);
  }
  w->writing = false;
}

// Reads replies for every call in flight until `mine` is complete (or the wire
// failed), then hands the reading role to the oldest call still waiting.
void SharedConnection::read_for(UniqueLock& lk, const std::shared_ptr<Wire>& w, Pending& mine) {
  w->reading = true;
  char buf[16 * 1024];
  std::vector<Reply> got;
  while (!mine.done && !w->broken) {
    const Clock::time_point deadline = w->inflight.front()->deadline;
    lk.unlock();
    std::string why;
    got.clear();
    short want = POLLIN;
    long n = w->sock->read(buf, sizeof buf, want, why);
    if (n == Socket::kWouldBlock) {
      if (w->sock->wait(want, deadline)) {
        n = w->sock->read(buf, sizeof buf, want, why);
      } else {
        why = "no reply within " + std::to_string(opts_.command_timeout.count()) + " ms";
      }
    }
    if (!why.empty()) {
      why = opts_.describe() + ": " + why;
    } else if (n == 0) {
      why = opts_.describe() + ": the server closed the connection";
    } else if (n > 0) {
      if (redisReaderFeed(w->reader.get(), buf, static_cast<std::size_t>(n)) != REDIS_OK) {
        why = opts_.describe() + ": out of memory reading a reply";
      }
      for (;;) {
        void* raw = nullptr;
        if (redisReaderGetReply(w->reader.get(), &raw) != REDIS_OK) {
          why = opts_.describe() + ": protocol error: " + std::string(w->reader->errstr);
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
        why = opts_.describe() + ": a reply nobody asked for";
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
    if (!why.empty()) fail(w, why);
  }
  w->reading = false;
  if (!w->inflight.empty()) w->inflight.front()->cv.notify_one();
}

std::vector<Reply> SharedConnection::exchange(std::span<const Argv> batch, std::error_code& ec) {
  ec.clear();
  std::vector<Reply> out(batch.size());
  if (batch.empty()) return out;
  std::string cmds;
  for (const Argv& argv : batch) {
    if (!format_command(cmds, argv)) {
      ec = make_error_code(errc::backend_unavailable);
      tl_last_error = opts_.describe() + ": cannot format a command (out of memory)";
      return out;
    }
  }
  calls_.fetch_add(1, std::memory_order_relaxed);
  Pending mine;
  mine.expected = batch.size();
  mine.replies.reserve(batch.size());
  UniqueLock lk(mu_);
  std::string why;
  const std::shared_ptr<Wire> w = wire_for_call(lk, ec, why);
  if (ec) {
    tl_last_error = why;
    return out;
  }
  mine.deadline = Clock::now() + opts_.command_timeout;
  w->out += cmds;
  w->inflight.push_back(&mine);
  while (!mine.done) {
    if (!w->out.empty() && !w->writing) {
      write_out(lk, w);
    } else if (!w->reading) {
      read_for(lk, w, mine);
    } else {
      mine.cv.wait(lk.native());  // woken when complete, failed, or handed the reading role
    }
  }
  lk.unlock();
  if (mine.ec) {
    ec = mine.ec;
    tl_last_error = mine.why;
    return out;
  }
  return std::move(mine.replies);
}

Reply SharedConnection::command(std::span<const std::string_view> argv, std::error_code& ec) {
  const Argv one(argv.begin(), argv.end());
  std::vector<Reply> r = exchange(std::span(&one, 1), ec);
  if (ec) return nullptr;
  if (r.front()->type == REDIS_REPLY_ERROR) {
    tl_last_error = opts_.describe() + " answered: " + std::string(reply_str(r.front().get()));
    ec = error_code_of(r.front().get());
  }
  return std::move(r.front());
}

}  // namespace distlock::detail::redis
