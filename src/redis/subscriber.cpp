#include "redis/subscriber.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace distlock::detail::redis {

namespace {

constexpr Millis kFirstBackoff{50};
constexpr Millis kMaxBackoff{1000};

std::string_view element_str(const redisReply* r, std::size_t i) {
  if (r == nullptr || r->type != REDIS_REPLY_ARRAY || i >= r->elements) return {};
  return reply_str(r->element[i]);
}

}  // namespace

Subscriber::Subscriber(ConnectionOptions opts, Callback on_message)
    : Subscriber(std::move(opts), std::move(on_message), Callback{}) {}

Subscriber::Subscriber(ConnectionOptions opts, Callback on_message, Callback on_dropped)
    : opts_(std::move(opts)), on_message_(std::move(on_message)), on_dropped_(std::move(on_dropped)) {
  if (!loop_.valid())
    throw std::system_error(loop_.error(), std::generic_category(), "eventfd for the Redis subscriber");
}

Subscriber::~Subscriber() {
  {
    LockGuard lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  loop_.stop();
}

void Subscriber::wake() noexcept {
  loop_.wake();
}

Error Subscriber::last_failure() const {
  LockGuard lk(mu_);
  return last_failure_;
}

std::uint64_t Subscriber::silent_drops() const {
  LockGuard lk(mu_);
  return silent_drops_;
}

std::uint64_t Subscriber::connects() const {
  LockGuard lk(mu_);
  return connects_;
}

void Subscriber::watch(std::string_view channel, Error& ec) {
  const WatchStart started = begin_watch(channel);
  await_watch(channel, started,
              std::chrono::steady_clock::now() + opts_.connect_timeout + opts_.command_timeout, false, ec);
}

Subscriber::WatchStart Subscriber::begin_watch(std::string_view channel) {
  LockGuard lk(mu_);
  if (!thread_started_) {
    loop_.start([this] { run(); });
    thread_started_ = true;
  }
  auto it = channels_.find(channel);
  if (it == channels_.end()) it = channels_.emplace(std::string(channel), Channel{}).first;
  if (++it->second.watchers == 1) ++watched_;
  changed_ = true;
  WatchStart started{it->second.refusals, failures_, std::chrono::steady_clock::now()};
  if (it->second.live()) return started;
  it->second.refused = false;  // ask the server again
  if (!connected_) retry_now_ = true;
  wake();
  return started;
}

bool Subscriber::await_watch(std::string_view channel, const WatchStart& started,
                             std::chrono::steady_clock::time_point deadline, bool keep_on_failure,
                             Error& ec) {
  ec.clear();
  UniqueLock lk(mu_);
  auto it = channels_.find(channel);  // the entry stays while watchers > 0
  for (;;) {
    it = channels_.find(channel);
    if (it->second.live()) return true;
    if (stop_) {
      ec.fail(errc::backend_unavailable, opts_.describe() + ": the subscriber is shutting down");
      break;
    }
    if (it->second.refusals != started.refusals) {
      ec = it->second.refusal;
      break;
    }
    if (failures_ != started.failures) {
      ec = last_failure_;
      if (!ec) ec = make_error_code(errc::backend_unavailable);  // keeps the detail
      break;
    }
    if (cv_.wait_until(lk.native(), deadline) == std::cv_status::timeout) {
      it = channels_.find(channel);
      if (it->second.live()) return true;
      if (it->second.refusals != started.refusals || failures_ != started.failures) continue;
      const auto waited =
          std::chrono::ceil<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started.at);
      const std::string& last = last_failure_.detail();
      ec.fail(errc::backend_unavailable, opts_.describe() + ": no SUBSCRIBE confirmation within " +
                                             std::to_string(waited.count()) + " ms" +
                                             (last.empty() ? std::string() : " (last error: " + last + ")"));
      break;
    }
  }
  if (keep_on_failure) {
    // Still counted: the thread keeps trying; unwatch() ends it. A release published
    // before the server runs the SUBSCRIBE is not delivered, so the channel is
    // reported once it is live.
    it->second.report_when_live = true;
    return false;
  }
  // Undo this watch: nothing of a failed watch stays counted, so the thread neither
  // keeps the channel subscribed nor keeps reconnecting for it.
  last_failure_.set_detail(ec.detail());
  if (--it->second.watchers == 0) {
    --watched_;
    changed_ = true;
    wake();  // the thread unsubscribes or forgets it
  }
  return false;
}

void Subscriber::unwatch(std::string_view channel) noexcept {
  {
    LockGuard lk(mu_);
    auto it = channels_.find(channel);
    if (it == channels_.end() || it->second.watchers == 0) return;
    if (--it->second.watchers > 0) return;
    --watched_;
    changed_ = true;
  }
  wake();  // the thread sends UNSUBSCRIBE
}

void Subscriber::set_payload_handler(std::string channel, PayloadCallback handler) {
  LockGuard lk(mu_);
  payload_channel_ = std::move(channel);
  payload_by_prefix_ = false;
  payload_handler_ = std::move(handler);
}

void Subscriber::set_payload_prefix_handler(std::string prefix, PayloadCallback handler) {
  LockGuard lk(mu_);
  payload_channel_ = std::move(prefix);
  payload_by_prefix_ = true;
  payload_handler_ = std::move(handler);
}

std::size_t Subscriber::pending() const {
  LockGuard lk(mu_);
  std::size_t n = 0;
  for (const auto& [name, c] : channels_)
    if (c.watchers > 0 && (!connected_ || !c.live() || c.refused)) ++n;
  return n;
}

void Subscriber::dropped(const std::vector<std::string>& channels) {
  for (const auto& ch : channels) {
    try {
      if (on_dropped_) on_dropped_(ch);
    } catch (...) {  // a listener must not kill the subscriber thread
    }
  }
  notify(channels);
}

void Subscriber::notify(const std::vector<std::string>& channels) {
  for (const auto& ch : channels) {
    try {
      on_message_(ch);
    } catch (...) {  // a listener must not kill the subscriber thread
    }
  }
}

bool Subscriber::connect_once() {
  Error ec;
  std::unique_ptr<Socket> sock = open_socket(opts_, ec);
  ReaderPtr reader = sock ? make_reader() : nullptr;
  if (sock && !reader) ec.fail(errc::backend_unavailable, opts_.describe() + ": out of memory");
  if (!sock || !reader) {
    LockGuard lk(mu_);
    ++failures_;
    last_failure_.fail(ec, "subscriber: " + ec.detail());
    cv_.notify_all();
    return false;
  }
  sock_ = std::move(sock);  // keep-alive is on (open_socket), but takes minutes: see check_alive()
  reader_ = std::move(reader);
  last_heard_ = std::chrono::steady_clock::now();
  ping_sent_.reset();
  LockGuard lk(mu_);
  connected_ = true;
  const bool reconnect = ++connects_ > 1;
  inflight_.clear();
  changed_ = true;
  for (auto& [name, c] : channels_) {
    c.sent = false;
    c.sent_seq = c.confirmed_seq = 0;
    c.refused = false;
    c.resubscribed = (reconnect || c.report_when_live) && c.watchers > 0;
    c.report_when_live = false;
  }
  return true;
}

void Subscriber::disconnect(const std::string& cause) {
  sock_.reset();
  reader_.reset();
  inflight_.clear();
  std::vector<std::string> watched;
  {
    LockGuard lk(mu_);
    connected_ = false;
    changed_ = true;
    last_failure_.fail(errc::backend_unavailable, "subscriber: " + cause);
    for (auto it = channels_.begin(); it != channels_.end();) {
      auto& c = it->second;
      c.sent = false;
      c.sent_seq = c.confirmed_seq = 0;
      if (c.watchers > 0) {
        watched.push_back(it->first);
        ++it;
      } else {
        it = channels_.erase(it);
      }
    }
    cv_.notify_all();
  }
  // Waiters re-check now: they see the outage (or a lock freed meanwhile).
  notify(watched);
}

bool Subscriber::flush_changes() {
  std::vector<std::pair<bool, std::string>> ops;  // {subscribe?, channel}
  {
    LockGuard lk(mu_);
    // Nothing changed since the last scan: nothing to send (the scan is over every channel, and
    // a sharded subscriber holds thousands; a message changes none of them).
    if (!changed_) return true;
    changed_ = false;
    for (auto it = channels_.begin(); it != channels_.end();) {
      auto& c = it->second;
      if (c.watchers > 0 && !c.sent && !c.refused) {
        c.sent = true;
        ++c.sent_seq;
        ops.emplace_back(true, it->first);
      } else if (c.watchers == 0 && c.sent) {
        c.sent = false;
        ops.emplace_back(false, it->first);
      } else if (c.watchers == 0 && !c.sent && c.confirmed_seq == c.sent_seq) {
        // Nothing of it is in flight any more (unsubscribe confirmations are not
        // matched: a late one is harmless since live() needs a fresh SUBSCRIBE).
        it = channels_.erase(it);
        continue;
      }
      ++it;
    }
    // What was sent now is forgotten (erased) by a later scan once answered.
    changed_ = !ops.empty();
  }
  if (ops.empty()) return true;
  const bool sharded = static_cast<bool>(on_dropped_);
  std::string out;
  for (auto& [subscribe, ch] : ops) {
    const std::string_view cmd =
        subscribe ? (sharded ? "SSUBSCRIBE" : "SUBSCRIBE") : (sharded ? "SUNSUBSCRIBE" : "UNSUBSCRIBE");
    const std::string_view argv[] = {cmd, ch};
    if (!format_command(out, argv)) {
      io_error_.fail(errc::backend_unavailable, "out of memory");
      return false;
    }
    inflight_.emplace_back(subscribe, std::move(ch));
  }
  if (opts_.round_trips) opts_.round_trips->add();  // the (un)subscribes written together
  return sock_->write_all(out, Socket::Clock::now() + opts_.command_timeout, io_error_);
}

void Subscriber::handle_reply(redisReply* r) {
  if (r != nullptr && r->type == REDIS_REPLY_ERROR) {
    handle_error(r);
    return;
  }
  std::string_view kind = element_str(r, 0);
  const std::string_view ch = element_str(r, 1);
  if (on_dropped_ && !kind.empty() && kind.front() == 's') kind.remove_prefix(1);  // ssubscribe, smessage...
  // In sharded mode the server unsubscribes a channel whose slot moved away on its
  // own: an "sunsubscribe" that does not answer our oldest command in flight.
  const bool unasked = on_dropped_ && kind == "unsubscribe" &&
                       (inflight_.empty() || inflight_.front().first || inflight_.front().second != ch);
  if ((kind == "subscribe" || kind == "unsubscribe") && !inflight_.empty() && !unasked) inflight_.pop_front();
  std::vector<std::string> to_notify;
  PayloadCallback with_payload;
  if (unasked) {
    {
      LockGuard lk(mu_);
      auto it = channels_.find(ch);
      if (it == channels_.end() || !it->second.sent) return;
      auto& c = it->second;
      c.sent = false;
      c.refused = true;  // not sent to this node again until a new watch or a reconnect
      changed_ = true;
      c.refusal.set_detail(opts_.describe() + " dropped the subscription to " + std::string(ch) +
                           " (its slot moved to another node)");
      if (c.watchers > 0) to_notify.emplace_back(ch);
    }
    dropped(to_notify);
    return;
  }
  {
    LockGuard lk(mu_);
    auto it = channels_.find(ch);
    if (it == channels_.end()) return;
    auto& c = it->second;
    if (kind == "message") {
      const bool with_handler =
          payload_handler_ && (payload_by_prefix_ ? ch.substr(0, payload_channel_.size()) == payload_channel_
                                                  : ch == payload_channel_);
      if (c.watchers > 0 && with_handler) {
        with_payload = payload_handler_;
      } else if (c.watchers > 0) {
        to_notify.emplace_back(ch);
      }
    } else if (kind == "subscribe") {
      if (c.confirmed_seq < c.sent_seq) ++c.confirmed_seq;
      changed_ = true;  // an unwatched channel may be forgotten now
      if (c.live()) {
        cv_.notify_all();
        if (c.resubscribed || c.report_when_live) {
          c.resubscribed = c.report_when_live = false;
          if (c.watchers > 0) to_notify.emplace_back(ch);
        }
      }
    }
  }
  if (with_payload) {
    try {
      with_payload(ch, element_str(r, 2));
    } catch (...) {  // a listener must not kill the subscriber thread
    }
  }
  notify(to_notify);
}

// An error reply answers the oldest command in flight (replies keep the order of
// the commands). A refused SUBSCRIBE fails the watches waiting for it with the
// server's answer and is not sent again until the next watch or reconnect; a
// channel already watched is told at once, so its waiters re-check rather than
// wait for a message that cannot come.
void Subscriber::handle_error(redisReply* r) {
  const std::string text(reply_str(r));
  if (inflight_.empty()) {  // e.g. "max number of clients reached" before any command
    LockGuard lk(mu_);
    last_failure_.set_detail("subscriber: " + opts_.describe() + ": " + text);
    return;
  }
  auto [subscribe, channel] = std::move(inflight_.front());
  inflight_.pop_front();
  std::vector<std::string> to_notify;
  {
    LockGuard lk(mu_);
    auto it = channels_.find(channel);
    if (it == channels_.end()) return;
    auto& c = it->second;
    if (!subscribe) return;                               // a refused UNSUBSCRIBE: not subscribed either way
    if (c.confirmed_seq < c.sent_seq) ++c.confirmed_seq;  // answered
    c.sent = false;
    c.refused = true;
    changed_ = true;
    ++c.refusals;
    const std::error_code mapped = error_code_of(r);
    c.refusal.fail(mapped == errc::auth_failed ? mapped : make_error_code(errc::backend_unavailable),
                   opts_.describe() + " refused " + (on_dropped_ ? "SSUBSCRIBE " : "SUBSCRIBE ") + channel +
                       ": " + text);
    last_failure_.set_detail(c.refusal.detail());
    cv_.notify_all();
    if (c.watchers > 0) to_notify.push_back(channel);
  }
  if (on_dropped_) {
    dropped(to_notify);  // e.g. MOVED: the owner may watch it on another node
  } else {
    notify(to_notify);
  }
}

// Reads what the socket has now (and what TLS has decrypted already) and handles
// every complete reply. False with io_error_ set when the connection failed.
bool Subscriber::read_available() {
  char buf[16 * 1024];
  do {
    short want = 0;
    const long n = sock_->read(buf, sizeof buf, want, io_error_);
    if (n == Socket::kWouldBlock) return true;
    if (n == 0) io_error_.fail(errc::backend_unavailable, "the server closed the connection");
    if (n <= 0) return false;
    last_heard_ = std::chrono::steady_clock::now();  // alive: a PING in flight is answered by now or soon
    ping_sent_.reset();
    if (redisReaderFeed(reader_.get(), buf, static_cast<std::size_t>(n)) != REDIS_OK) {
      io_error_.fail(errc::backend_unavailable, "out of memory");
      return false;
    }
    for (;;) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader_.get(), &raw) != REDIS_OK) {
        io_error_.fail(errc::backend_unavailable, std::string("protocol error: ") + reader_->errstr);
        return false;
      }
      if (raw == nullptr) break;
      Reply reply(static_cast<redisReply*>(raw));
      handle_reply(reply.get());
      if (!sock_) return true;  // a handler disconnected
    }
  } while (sock_->buffered());
  return true;
}

bool Subscriber::check_alive() {
  const auto now = std::chrono::steady_clock::now();
  if (ping_sent_) {
    if (now < *ping_sent_ + opts_.command_timeout) return true;
    {
      LockGuard lk(mu_);
      ++silent_drops_;
    }
    disconnect(opts_.describe() + ": no answer to PING within " +
               std::to_string(opts_.command_timeout.count()) +
               " ms on the subscriber connection (dropped as dead)");
    return false;
  }
  if (now < last_heard_ + kPingAfter) return true;
  static constexpr std::string_view kPing = "*1\r\n$4\r\nPING\r\n";
  if (opts_.round_trips) opts_.round_trips->add();
  if (!sock_->write_all(kPing, now + opts_.command_timeout, io_error_)) {
    disconnect(opts_.describe() + ": sending PING failed: " + io_error_.detail());
    return false;
  }
  ping_sent_ = now;
  return true;
}

void Subscriber::run() {
  Millis backoff = kFirstBackoff;
  auto next_attempt = std::chrono::steady_clock::now();
  for (;;) {
    bool wanted = false;
    bool retry_now = false;
    {
      LockGuard lk(mu_);
      if (stop_) break;
      wanted = watched_ > 0;
      retry_now = std::exchange(retry_now_, false);
    }
    if (!sock_ && wanted && (retry_now || std::chrono::steady_clock::now() >= next_attempt)) {
      if (connect_once()) {
        backoff = kFirstBackoff;
      } else {
        next_attempt = std::chrono::steady_clock::now() + backoff;
        backoff = std::min(backoff * 2, kMaxBackoff);
      }
    }
    if (sock_ && !flush_changes()) {
      disconnect(opts_.describe() + ": sending SUBSCRIBE failed: " + io_error_.detail());
      continue;
    }
    if (sock_ && !check_alive()) continue;
    pollfd fds[2] = {{loop_.wake_fd(), POLLIN, 0}, {sock_ ? sock_->fd() : -1, POLLIN, 0}};
    int timeout_ms = -1;
    if (!sock_ && wanted) {
      const auto left = std::chrono::duration_cast<Millis>(next_attempt - std::chrono::steady_clock::now());
      timeout_ms = static_cast<int>(std::max<std::int64_t>(0, left.count()));
    } else if (sock_) {
      const auto due = ping_sent_ ? *ping_sent_ + opts_.command_timeout : last_heard_ + kPingAfter;
      const auto left = std::chrono::ceil<Millis>(due - std::chrono::steady_clock::now());
      timeout_ms = static_cast<int>(std::max<std::int64_t>(0, left.count()));
    }
    const int n = ::poll(fds, sock_ ? 2 : 1, timeout_ms);
    if (n < 0 && errno != EINTR) {
      // Should not happen; avoid a hot loop.
      std::this_thread::sleep_for(Millis(10));
      continue;
    }
    if (fds[0].revents & POLLIN) loop_.clear_wake();
    if (sock_ && fds[1].revents != 0 && !read_available()) {
      disconnect(opts_.describe() + ": " + io_error_.detail());
    }
  }
  sock_.reset();
}

}  // namespace distlock::detail::redis
