// ZooKeeper sessions: opening one, its events, the keeper that replaces an expired
// session, nudges waiters after a reconnect, frees stale leases and sweeps orphans.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/errno_text.hpp"
#include "zk/zk_backend_impl.hpp"

namespace distlock::detail::zk {

// The C client's own log lines (connection refused, reconnecting, ...) are noise for
// a library user; DISTLOCK_ZK_LOG=1 shows them for debugging.
void zk_log_line(const char* message) {
  static const bool enabled = [] {
    const char* v = std::getenv("DISTLOCK_ZK_LOG");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  if (enabled) std::fprintf(stderr, "zookeeper: %s\n", message);
}

const Acls& acls() {
  static const Acls instance;
  return instance;
}

void session_watcher(zhandle_t* zh, int type, int state, const char*, void* ctx) {
  if (type != ZOO_SESSION_EVENT || ctx == nullptr) return;
  auto* s = static_cast<Session*>(static_cast<SessionContext*>(ctx));
  s->backend->on_session_event(zh, *s, state);
}

void node_watcher(zhandle_t*, int type, int, const char* path, void* ctx) {
  if (ctx == nullptr || type == ZOO_SESSION_EVENT || type == ZOO_NOTWATCHING_EVENT) return;
  static_cast<ZkBackend*>(ctx)->on_node_event(type, path);
}

void held_watcher(zhandle_t*, int type, int, const char* path, void* ctx) {
  if (ctx == nullptr || path == nullptr || type == ZOO_SESSION_EVENT) return;
  auto* s = static_cast<Session*>(ctx);
  s->backend->on_held_node_event(*s, path);
}

void ZkBackend::on_held_node_event(Session& s, const char* path) noexcept {
  LockGuard lk(recipe_.mutex());
  s.armed.erase(path);
  s.unwatched(path);  // a notification ends the watch in the C client too
}

std::shared_ptr<Session> ZkBackend::open_session(Error& ec) {
  auto s = std::make_shared<Session>();
  s->backend = this;
  s->round_trips = round_trips_.get();
  s->gen = next_generation_.fetch_add(1);
  errno = 0;
  s->zh.reset(zookeeper_init2(cfg_.connect_string.c_str(), &session_watcher,
                              static_cast<int>(cfg_.session_timeout.count()), nullptr,
                              static_cast<SessionContext*>(s.get()), 0, &zk_log_line));
  if (!s->zh) {
    const int err = errno;
    ec.fail(errc::backend_unavailable,
            "cannot start a ZooKeeper session for " + cfg_.redacted_url + ": " +
                (err == EINVAL ? std::string("a host name does not resolve or the host list is malformed")
                               : std::string(errno_text(err))));
    return nullptr;
  }
  sessions_.fetch_add(1);
  return s;
}

void ZkBackend::on_session_event(zhandle_t* zh, Session& s, int state) noexcept {
  int before = 0, granted = 0;
  {
    LockGuard lk(recipe_.mutex());
    granted = record_session_event(zh, s, state, before);
  }
  if (granted == 0) return;
  // The engine shortens its leases before this completion thread delivers any reply
  // that arrived on the new connection (a renewal confirmed there is counted with the
  // new validity). Outside mu_: the engine's lock is never taken under ours.
  if (ChangeListener* l = recipe_.listener()) l->on_validity_changed(Millis(granted));
  if (before > 0) {
    log_.log(granted < before ? LogLevel::warning : LogLevel::info,
             "zk: {} now grants a session timeout of {}ms (was {}ms); leases count on it from now on",
             cfg_.redacted_url, granted, before);
  }
}

int ZkBackend::record_session_event(zhandle_t* zh, Session& s, int state, int& before) noexcept {
  // Recorded on the session itself (current or not yet published), so a CONNECTED
  // event that arrives before the session is installed is not lost.
  int changed_to = 0;
  if (state == ZOO_CONNECTED_STATE && !s.auth_sent && !cfg_.credentials.empty()) {
    // The C client accepts credentials only on a live handle (not between connection
    // attempts), so they are added on the first connection, before the session counts
    // as usable: they reach the server ahead of any of our requests, and the client
    // re-sends them after every reconnect.
    try {
      zk::submit_auth(zh, cfg_.credentials);
    } catch (...) {
    }
    s.auth_sent = true;
  }
  if (state == ZOO_CONNECTED_STATE && !s.ever_connected) {
    // The session's presence node (zk_names.hpp, kSessionsDir): a watch reads it to tell a
    // release (the holder's session still there) from the end of the holder's session.
    // Fire and forget, pipelined behind the credentials: "already exists" is fine, a failure
    // only makes a watch report this session's releases as they look without it.
    try {
      auto root = zk::submit_create(zh, std::string(zk::kRoot), {}, &acls().root_vec, ZOO_PERSISTENT);
      root->undo_if_abandoned = false;
      auto dir = zk::submit_create(zh, std::string(zk::kSessionsDir), {}, &acls().root_vec, ZOO_PERSISTENT);
      dir->undo_if_abandoned = false;
      if (const clientid_t* id = zoo_client_id(zh)) {
        auto mine =
            zk::submit_create(zh, zk::session_presence_path(id->client_id), {}, node_acl(), ZOO_EPHEMERAL);
        mine->undo_if_abandoned = false;
      }
    } catch (...) {
    }
  }
  if (state == ZOO_CONNECTED_STATE) {
    if (s.ever_connected && !s.connected) s.reconnected = true;
    // The C client sets the session's watches again on a new connection, but the renewals do
    // not count on it: each held node is read (and its watch armed) once more.
    if (s.reconnected) s.armed.clear();
    s.connected = true;
    s.ever_connected = true;
    // The server negotiates the session timeout on every connection, not only when the
    // session is created: a server restarted with a lower maxSessionTimeout (or another
    // member of the ensemble configured differently) expires the session sooner from
    // now on. A higher value is not to be trusted (the server restores the session's
    // stored timeout after a restart): the session's floor only ever goes down.
    const int granted = zoo_recv_timeout(zh);
    if (granted > 0) s.floor_ms = s.floor_ms == 0 ? granted : std::min(s.floor_ms, granted);
    before = negotiated_ms_.load();
    // Only the current session (or one about to be installed: no other is connecting)
    // speaks for the leases.
    if (s.floor_ms > 0 && s.floor_ms != before && (!session_ || session_.get() == &s || session_->expired)) {
      negotiated_ms_.store(s.floor_ms);
      changed_to = s.floor_ms;
      const Millis validity(s.floor_ms);
      recipe_.for_each_locked([&](QueueEntry& qe) {
        auto& e = static_cast<Entry&>(qe);
        if (e.held) e.valid_until = std::min(e.valid_until, e.confirmed + validity);
      });
    }
  } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
    s.connected = false;
    s.expired = true;
  } else {
    // CONNECTING / ASSOCIATING / NOTCONNECTED: ownership is uncertain until we hear from
    // the ensemble again; the engine's local deadline takes care of owns().
    s.connected = false;
    s.armed.clear();
  }
  cv_.notify_all();
  return changed_to;
}

void ZkBackend::on_node_event(int type, const char* path) noexcept {
  if (path == nullptr) return;
  if (type == ZOO_DELETED_EVENT) watch_events_.fetch_add(1);
  auto name = zk::name_of_node_path(path);
  ChangeListener* l = recipe_.listener();
  if (name && l != nullptr) l->on_change(*name);
}

void ZkBackend::keeper_main() {
  UniqueLock lk(recipe_.mutex());
  while (!stopping_) {
    const SteadyTime soon = clock_->now() + std::chrono::milliseconds(10);
    SteadyTime wake = clock_->now() + std::chrono::seconds(1);
    if (session_ && session_->connected) {  // both jobs need the connection
      recipe_.for_each_locked([&](const QueueEntry& e) {
        if (e.held) wake = std::min(wake, std::max(static_cast<const Entry&>(e).valid_until, soon));
      });
      if (recipe_.has_orphans_locked()) wake = std::min(wake, std::max(orphan_retry_at_, soon));
    }
    wait_until(lk, wake, [&]() DISTLOCK_REQUIRES(recipe_.mutex()) {
      return stopping_ || (session_ && (session_->expired || session_->reconnected)) ||
             (session_ && session_->connected && recipe_.has_orphans_locked() &&
              clock_->now() >= orphan_retry_at_);
    });
    if (stopping_) break;
    if (session_ && session_->expired) {
      lk.unlock();
      replace_expired_session();
      lk.lock();
      continue;
    }
    std::vector<std::string> nudge;
    if (session_ && session_->reconnected) {
      // Back within the session: our nodes and watches survived, but a predecessor may
      // have gone while we were away; let every waiter look again.
      session_->reconnected = false;
      recipe_.for_each_locked([&](const QueueEntry& e) {
        if (!e.held) nudge.push_back(e.name);
      });
    }
    // Leases past their validity: the engine has already declared them lost (its
    // deadline is earlier); free the node so others are not blocked by a lease nobody uses.
    const SteadyTime now = clock_->now();
    const bool connected = session_ && session_->connected;
    std::vector<QueueEntryPtr> stale = recipe_.take_locked([&](const QueueEntry& e) {
      return connected && e.held && static_cast<const Entry&>(e).valid_until <= now;
    });
    std::vector<QueueEntryPtr> orphans;
    if (connected && now >= orphan_retry_at_) orphans = recipe_.take_orphans_locked();
    lk.unlock();
    ChangeListener* l = recipe_.listener();
    for (const auto& n : nudge) {
      if (l != nullptr) l->on_change(n);
    }
    recipe_.drop_stale(stale);
    if (!orphans.empty()) orphans_removed_.fetch_add(recipe_.retry_orphans(std::move(orphans)));
    lk.lock();
    // Those still unknown wait a little: the server does not answer them now.
    if (recipe_.has_orphans_locked()) orphan_retry_at_ = clock_->now() + std::chrono::milliseconds(200);
  }
}

void ZkBackend::replace_expired_session() {
  std::shared_ptr<Session> old;
  std::vector<QueueEntryPtr> lost;
  {
    LockGuard lk(recipe_.mutex());
    if (!session_ || !session_->expired) return;
    old = session_;
    // Every node of that session is gone with it (an entry of no session, made while
    // this one had expired, is not live and is replaced by its next try).
    const std::uint64_t gen = old->generation();
    auto of_old = [gen](const QueueEntry& e) { return static_cast<const Entry&>(e).generation == gen; };
    lost = recipe_.take_locked(of_old);
    recipe_.drop_orphans_locked(of_old);
  }
  log_.log(LogLevel::warning, "zk: session to {} expired; every lock it held is lost; opening a new session",
           cfg_.redacted_url);
  Error why;
  auto fresh = open_session(why);
  {
    LockGuard lk(recipe_.mutex());
    if (fresh) {
      session_ = fresh;
    } else {
      log_.log(LogLevel::warning, "zk: {}; retrying", why.detail());
      orphan_retry_at_ = clock_->now() + std::chrono::milliseconds(500);
    }
    cv_.notify_all();
  }
  old.reset();  // zookeeper_close, outside our lock and off the completion thread
  if (!fresh) {
    UniqueLock lk(recipe_.mutex());
    wait_until(lk, clock_->now() + std::chrono::milliseconds(500),
               [&]() DISTLOCK_REQUIRES(recipe_.mutex()) { return stopping_; });
  }
  recipe_.end_session(lost);
}

}  // namespace distlock::detail::zk
