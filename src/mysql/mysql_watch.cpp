// Waiting inside the server: per watched name, one connection blocked in
// SELECT GET_LOCK(lock, a year), RELEASE_LOCK(lock). The server answers when the lock
// is free (it grants it to this connection, which gives it back in the same statement:
// the name is taken for no longer than the statement takes), and the waiters of this
// client are told (on_change) and try again. No polling from the client: one thread
// polls the sockets of the armed watches and an eventfd.
//
// A watch is armed by watch() and again by every try_acquire() of its name (a waiter
// that was told and found the lock taken again waits for the next release); a watch
// that answered and whose name nobody tries again stays quiet, so an idle watch of a
// free lock costs nothing. unwatch() and the destructor end a blocked wait with
// KILL QUERY from the shared connection.
#include <poll.h>

#include <cerrno>

#include "mysql/mysql_backend_impl.hpp"

namespace distlock::detail::mysql {

// With watch_mu_ held. On failure the watch stays disarmed: its waiters re-check on
// the engine's bounded period, and the next try of the name arms it again.
void MysqlBackend::arm_locked(Watch& w) {
  if (w.armed) return;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!w.conn) {
      Error ec;
      w.conn = my::open(cfg_, ec);
      if (ec) {
        failure("watch \"" + printable(w.name) + "\"", ec.detail());
        return;
      }
      w.conn_id = mysql_thread_id(w.conn.get());
    }
    const std::string L = my::lock_name_sql(w.name);
    Exec e;
    if (my::send(
            w.conn.get(),
            "SELECT GET_LOCK(" + L + ", " + std::to_string(kMaxWaitSeconds) + "), RELEASE_LOCK(" + L + ")",
            e)) {
      w.armed = true;
      watcher_.wake();
      return;
    }
    w.conn.reset();  // an idle session the server ended: once more on a new one
  }
}

bool MysqlBackend::blocked(const Watch& w) {
  if (!w.armed || !w.conn) return false;
  pollfd p{mysql_get_socket(w.conn.get()), POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

void MysqlBackend::kill_query_locked(unsigned long id) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!aux_) {
      Error ec;
      aux_ = my::open(cfg_, ec);
      if (ec) {
        failure("end a wait", ec.detail());
        return;
      }
    }
    Exec e = my::run(aux_.get(), "KILL QUERY " + std::to_string(id));
    if (!e.io_failed) return;
    aux_.reset();
  }
}

void MysqlBackend::rearm(std::string_view name) {
  LockGuard lk(watch_mu_);
  auto it = watches_.find(std::string(name));
  if (it != watches_.end() && it->second.count > 0) arm_locked(it->second);
}

void MysqlBackend::watch(std::string_view name, Error& ec) {
  ec.clear();
  LockGuard lk(watch_mu_);
  auto [it, fresh] = watches_.try_emplace(std::string(name));
  Watch& w = it->second;
  if (fresh) w.name = std::string(name);
  ++w.count;
  if (w.armed) return;
  arm_locked(w);
  if (!w.armed) {
    // Once the statement is sent, a release cannot be missed: before the server runs
    // it, GET_LOCK finds the lock free and answers at once; after, it waits for it.
    if (--w.count == 0) watches_.erase(it);
    ec.fail(errc::backend_unavailable, cfg_.shown + ": cannot wait for \"" + printable(name) +
                                           "\" inside the server: no connection for the wait");
  }
}

void MysqlBackend::unwatch(std::string_view name) noexcept {
  try {
    LockGuard lk(watch_mu_);
    auto it = watches_.find(std::string(name));
    if (it == watches_.end() || --it->second.count > 0) return;
    if (blocked(it->second)) {
      LockGuard al(aux_mu_);
      kill_query_locked(it->second.conn_id);
    }
    watches_.erase(it);  // closes the connection
    watcher_.wake();
  } catch (...) {
  }
}

void MysqlBackend::watch_loop() {
  while (!watcher_.stopping()) {
    std::vector<pollfd> fds{{watcher_.wake_fd(), POLLIN, 0}};
    std::vector<std::string> names;
    {
      LockGuard lk(watch_mu_);
      for (auto& [name, w] : watches_) {
        if (!w.armed || !w.conn) continue;
        fds.push_back({mysql_get_socket(w.conn.get()), POLLIN, 0});
        names.push_back(name);
      }
    }
    int n;
    do {
      n = ::poll(fds.data(), fds.size(), -1);
    } while (n < 0 && errno == EINTR && !watcher_.stopping());
    if (watcher_.stopping()) return;
    if (fds[0].revents) watcher_.clear_wake();
    std::vector<std::string> changed;
    {
      LockGuard lk(watch_mu_);
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        auto it = watches_.find(names[i - 1]);
        if (it == watches_.end()) continue;
        Watch& w = it->second;
        // The watch may have been replaced since the poll: read only a socket that is
        // still this watch's and still has its answer waiting.
        if (!w.armed || !w.conn || mysql_get_socket(w.conn.get()) != fds[i].fd) continue;
        pollfd again{fds[i].fd, POLLIN, 0};
        if (::poll(&again, 1, 0) <= 0) continue;
        Exec e = my::finish(w.conn.get());
        w.armed = false;
        if (e.io_failed) {
          // The server went away: waiters try again now (and see it down, or the lock).
          w.conn.reset();
          changed.push_back(w.name);
        } else if (!e.ok()) {
          changed.push_back(w.name);
        } else if (e.rows.size() == 1 && e.rows[0].size() == 2 && e.rows[0][0] == "1") {
          changed.push_back(w.name);  // the lock was free
        } else {
          arm_locked(w);  // the wait's year ran out
        }
      }
    }
    ChangeListener* l = listener_cb_.load();
    if (l) {
      for (const auto& name : changed) l->on_change(name);
    }
  }
}

}  // namespace distlock::detail::mysql
