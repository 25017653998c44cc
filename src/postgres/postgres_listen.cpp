// Waiting for releases on PostgreSQL: watch/unwatch and the listener thread on one
// LISTEN distlock_released connection.
#include <poll.h>

#include <algorithm>

#include "postgres/postgres_backend_impl.hpp"

namespace distlock::detail::postgres {

void PostgresBackend::watch(std::string_view name, Error& ec) {
  ec.clear();
  const std::int64_t key = postgres_lock_key(name);
  LockGuard lk(listen_mu_);
  if (!listen_conn_) {
    if (Error err = listen_now_locked()) {
      ec.fail(err, "cannot wait for a release of \"" + printable(name) + "\": " + err.detail());
      return;
    }
  }
  ++watched_[key][std::string(name)];
}

void PostgresBackend::unwatch(std::string_view name) noexcept {
  try {
    const std::int64_t key = postgres_lock_key(name);
    LockGuard lk(listen_mu_);
    auto it = watched_.find(key);
    if (it == watched_.end()) return;
    auto n = it->second.find(std::string(name));
    if (n != it->second.end() && --n->second <= 0) it->second.erase(n);
    if (it->second.empty()) watched_.erase(it);
  } catch (...) {
  }
}

Error PostgresBackend::listen_now() {
  LockGuard lk(listen_mu_);
  return listen_now_locked();
}

// With listen_mu_ held: a connection that LISTENs, live when this returns.
Error PostgresBackend::listen_now_locked() {
  Error err;
  Conn c = open(cfg_, Millis(0), "distlock-listen", err);
  if (err) return err;
  Exec e = run(c.get(), "LISTEN distlock_released", {}, cfg_.command_timeout);
  if (!e.ok()) return {code_of(e), cfg_.shown + ": LISTEN: " + e.error};
  listen_conn_ = std::move(c);
  listener_.wake();  // the loop polls the new socket
  return {};
}

// Delivers notifications; when the listening connection breaks, wakes every
// waiter (a release may have been missed) and reconnects while anyone waits.
void PostgresBackend::listen_loop() {
  while (!listener_.stopping()) {
    int fd = -1;
    {
      LockGuard lk(listen_mu_);
      if (listen_conn_) fd = PQsocket(listen_conn_.get());
    }
    pollfd pfd[2] = {{listener_.wake_fd(), POLLIN, 0}, {fd, POLLIN, 0}};
    ::poll(pfd, fd >= 0 ? 2 : 1, fd >= 0 ? 1000 : 250);
    if (pfd[0].revents & POLLIN) listener_.clear_wake();
    if (listener_.stopping()) break;
    std::vector<std::string> wake;
    {
      LockGuard lk(listen_mu_);
      if (listen_conn_ && fd >= 0 && fd == PQsocket(listen_conn_.get()) && (pfd[1].revents != 0)) {
        if (!PQconsumeInput(listen_conn_.get()) || PQstatus(listen_conn_.get()) != CONNECTION_OK) {
          log_.log(LogLevel::warning, "{}: the listening connection broke: {}", cfg_.shown,
                   pq_message(listen_conn_.get()));
          listen_conn_.reset();
          for (auto& [k, names] : watched_) {
            for (auto& [n, c] : names) wake.push_back(n);
          }
        } else {
          while (PGnotify* n = PQnotifies(listen_conn_.get())) {
            auto it = std::find_if(watched_.begin(), watched_.end(),
                                   [&](const auto& w) { return key_payload(w.first) == n->extra; });
            if (it != watched_.end()) {
              for (auto& [name, c] : it->second) wake.push_back(name);
            }
            PQfreemem(n);
          }
        }
      }
      if (!listen_conn_ && !watched_.empty()) {
        if (!listen_now_locked()) {  // listening again: a release may have been missed meanwhile
          for (auto& [k, names] : watched_) {
            for (auto& [n, c] : names) wake.push_back(n);
          }
        }
      }
    }
    ChangeListener* l = listener_cb_.load();
    if (l) {
      for (const auto& n : wake) l->on_change(n);
    }
  }
}

}  // namespace distlock::detail::postgres
