// The redis+sentinel:// backend's monitor thread (+switch-master on one sentinel after
// another, a re-check every second) and its count of watches, carried over a switch.
#include "redis/sentinel_backend_impl.hpp"

namespace distlock::detail::redis {

// Watches are counted here too, so a switch can subscribe them on the new master.
// The count and the backend are read together under watch_mu_, which a switch holds
// while it copies the counts to the new master and swaps it in: a watch counted
// before the swap is made there by the switch, one after it on the new master. The
// subscription itself runs without the lock (a hung master must not hold up a switch).
void SentinelBackend::watch(std::string_view name, Error& ec) {
  std::shared_ptr<Backend> b;
  std::uint64_t generation = 0;
  {
    LockGuard wl(watch_mu_);
    ++watches_[std::string(name)];
    std::tie(b, generation) = current();
  }
  b->watch(name, ec);
  if (!ec) return;
  std::shared_ptr<Backend> now;
  {
    LockGuard wl(watch_mu_);
    auto it = watches_.find(name);
    if (it != watches_.end() && --it->second == 0) watches_.erase(it);
    auto [cur, gen] = current();
    if (gen != generation) now = std::move(cur);
  }
  if (now) now->unwatch(name);  // a switch meanwhile subscribed it there for this watch
}

void SentinelBackend::unwatch(std::string_view name) noexcept {
  try {
    std::shared_ptr<Backend> b;
    {
      LockGuard wl(watch_mu_);
      auto it = watches_.find(name);
      if (it == watches_.end()) return;
      if (--it->second == 0) watches_.erase(it);
      b = current().first;
    }
    b->unwatch(name);
  } catch (...) {  // out of memory: the subscription stays, harmless
  }
}

// Subscribes to +switch-master on one sentinel after another; re-discovers on each
// message for this master and every kRecheckEvery.
void SentinelBackend::monitor() {
  std::size_t next = 0;
  while (!monitor_.stopping()) {
    const std::size_t i = next;
    ConnectionOptions o;
    {
      LockGuard lk(discover_mu_);
      next = (next + 1) % sentinel_opts_.size();
      o = sentinel_opts_[i];
    }
    Error ec;  // a failed connect or SUBSCRIBE is retried below; discovery reports outages
    std::unique_ptr<redis::Socket> sock = redis::open_socket(o, ec);
    redis::ReaderPtr reader = redis::make_reader();
    if (sock && reader) {
      std::string cmd;
      const std::string_view argv[] = {"SUBSCRIBE", "+switch-master"};
      if (redis::format_command(cmd, argv) &&
          sock->write_all(cmd, redis::Socket::Clock::now() + o.command_timeout, ec)) {
        listen(*sock, *reader);
      }
    }
    if (monitor_.stopping()) break;
    recheck();
    wait_wake(kResubscribeDelay);
  }
}

// Reads messages until the connection fails or the backend stops.
void SentinelBackend::listen(redis::Socket& sock, redisReader& reader) {
  recheck();  // a switch between discovery and this subscription
  auto next_check = Steady::now() + kRecheckEvery;
  while (!monitor_.stopping()) {
    const auto left = std::chrono::duration_cast<Millis>(next_check - Steady::now()).count();
    pollfd fds[2] = {{monitor_.wake_fd(), POLLIN, 0}, {sock.fd(), POLLIN, 0}};
    const int n = ::poll(fds, 2, static_cast<int>(std::max<long long>(0, left)));
    if (n < 0 && errno != EINTR) return;
    if (fds[0].revents & POLLIN) monitor_.clear_wake();
    if (monitor_.stopping()) return;
    if (recheck_requested_.exchange(false)) {  // a prefix watch's channel broke
      recheck();
      next_check = Steady::now() + kRecheckEvery;
    }
    if (n > 0 && fds[1].revents != 0) {
      char buf[4096];
      short want = 0;
      Error ec;  // the connection is dropped and opened again by monitor()
      const long got = sock.read(buf, sizeof buf, want, ec);
      if (got == 0 || got == -1) return;
      if (got > 0 && redisReaderFeed(&reader, buf, static_cast<std::size_t>(got)) != REDIS_OK) return;
      bool switched = false;
      for (;;) {
        void* raw = nullptr;
        if (redisReaderGetReply(&reader, &raw) != REDIS_OK) return;
        if (raw == nullptr) break;
        Reply r(static_cast<redisReply*>(raw));
        // {"message", "+switch-master", "<name> <old-ip> <old-port> <new-ip> <new-port>"}
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
            redis::reply_str(r->element[0]) == "message") {
          const std::string text(redis::reply_str(r->element[2]));
          if (text.compare(0, master_name_.size() + 1, master_name_ + " ") != 0) continue;
          switched = true;
          log_.log(LogLevel::info, "{}: a sentinel announced +switch-master {}", settings_.url, text);
        }
      }
      // One sentinel's message is not enough to move (discover()): it makes the
      // client ask them all now.
      if (switched) rediscover(current().second, true);
    }
    if (Steady::now() >= next_check) {
      recheck();
      next_check = Steady::now() + kRecheckEvery;
    }
  }
}

}  // namespace distlock::detail::redis
