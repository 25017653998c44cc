// The queue recipe on ZooKeeper: an ephemeral sequential node per acquisition; the
// lowest holds; a waiter watches only its predecessor.
#include "zk/zk_backend_impl.hpp"

namespace distlock::detail::zk {

void ZkBackend::add_orphan(std::string dir, std::string guid, std::uint64_t generation) {
  std::lock_guard lk(mu_);
  orphans_.push_back(Orphan{std::move(dir), std::move(guid), generation});
  cv_.notify_all();
}

void ZkBackend::delete_or_orphan(const std::shared_ptr<Session>& s, const Entry& e) noexcept {
  try {
    const std::string dir = zk::lock_dir(e.name);
    if (!e.node.empty() && s && s->generation() == e.generation) {
      auto r = zk::submit_delete(s->zh.get(), dir + "/" + e.node, e.version);
      const int rc = zk::await(r, *clock_, clock_->now() + cfg_.command_timeout);
      if (rc == ZOK || rc == ZNONODE || rc == ZBADVERSION) return;
      log_.log(LogLevel::debug, "zk: deleting {}/{} failed ({}); retried after reconnect", dir, e.node,
               zk::describe(rc));
    }
    if (!e.guid.empty() && (!e.node.empty() || e.uncertain)) add_orphan(dir, e.guid, e.generation);
  } catch (...) {
    log_.log(LogLevel::warning, "zk: could not schedule clean-up of lock \"{}\"", e.name);
  }
}

Error ZkBackend::fail(int rc, const std::string& what, std::string_view name) {
  // The error the caller sees names the step, the server and ZooKeeper's reason.
  const std::string detail = what + " failed at " + cfg_.redacted_url + ": " + zk::describe(rc);
  if (rc == ZNOAUTH || rc == ZAUTHFAILED) {
    log_.log(LogLevel::warning,
             "zk: {} for lock \"{}\" was denied: {}; the credentials of {} are not allowed to use this lock "
             "(wrong user or password?)",
             what, name, zk::describe(rc), cfg_.redacted_url);
    return Error(make_error_code(errc::auth_failed), detail);
  }
  if (zk::is_transient(rc)) {
    log_.log(LogLevel::warning, "zk: {} for lock \"{}\" failed: {} ({})", what, name, zk::describe(rc),
             cfg_.redacted_url);
    return Error(make_error_code(errc::backend_unavailable), detail);
  }
  log_.log(LogLevel::warning, "zk: {} for lock \"{}\" failed: {}", what, name, zk::describe(rc));
  return Error(make_error_code(rc == ZBADARGUMENTS ? errc::invalid_argument : errc::protocol_error), detail);
}

void ZkBackend::ensure_dirs(zhandle_t* zh, const std::string& dir, SteadyTime deadline, int& rc) {
  // Pipelined: root (persistent), then the lock directory (a container, so the server
  // deletes it once its last lock node is gone). "Already exists" is success.
  auto root = zk::submit_create(zh, std::string(zk::kRoot), {}, &acls().root_vec, ZOO_PERSISTENT);
  root->undo_if_abandoned = false;
  auto leaf = zk::submit_create(zh, dir, {}, node_acl(), ZOO_CONTAINER);
  leaf->undo_if_abandoned = false;
  rc = zk::await(root, *clock_, deadline);
  if (rc != ZOK && rc != ZNODEEXISTS) return;
  rc = zk::await(leaf, *clock_, deadline);
  if (rc == ZUNIMPLEMENTED || rc == ZBADARGUMENTS) {
    // A server without container nodes (< 3.5.3): a persistent directory instead.
    auto plain = zk::submit_create(zh, dir, {}, node_acl(), ZOO_PERSISTENT);
    plain->undo_if_abandoned = false;
    rc = zk::await(plain, *clock_, deadline);
  }
  if (rc == ZNODEEXISTS) rc = ZOK;
}

AcquireResult ZkBackend::try_acquire(const AcquireRequest& req, Error& ec) {
  ec.clear();
  const SteadyTime budget_end = clock_->now() + cfg_.connect_timeout + cfg_.command_timeout;
  const std::string key = key_of(req.name, req.owner);
  const std::string dir = zk::lock_dir(req.name);
  const std::string name(req.name);

  auto s = usable_session(budget_end);
  if (!s) {
    ec = fail(zk::kTimedOut, "waiting for a ZooKeeper connection", name);
    return {};
  }
  // The lease lives as long as the session; the engine renews every ttl/3 (at most
  // ttl/2) and must do so well within the session timeout.
  if (session_timeout().count() > 0 && req.ttl > 2 * session_timeout()) {
    std::string why =
        "ttl " + std::to_string(req.ttl.count()) + "ms is more than twice the ZooKeeper session timeout " +
        std::to_string(session_timeout().count()) + "ms (" +
        (cfg_.session_timeout_from_url ? "session_timeout="
                                       : "requested from the client's lock_defaults.ttl: ") +
        std::to_string(cfg_.session_timeout.count()) + "ms, negotiated by the server " + cfg_.redacted_url +
        " as " + std::to_string(session_timeout().count()) +
        "ms); a zk:// lease lasts as long as its session, so it could not be renewed in time. Use a ttl "
        "of at most " +
        std::to_string((2 * session_timeout()).count()) +
        "ms, or ask for a longer session with "
        "session_timeout= in the URL (the server grants between its minSessionTimeout and "
        "maxSessionTimeout, by default 2 and 20 times its tickTime)";
    log_.log(LogLevel::warning, "zk: lock \"{}\": {}", name, why);
    ec.set_detail(std::move(why));
    ec = make_error_code(errc::invalid_argument);
    return {};
  }

  Entry e;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) e = it->second;
  }
  e.name = name;
  e.owner = std::string(req.owner);
  if (e.generation != s->generation()) {
    e = Entry{name, e.owner};
    e.generation = s->generation();
  }
  if (e.held) {
    // The engine asks again, so it no longer counts this lease as held (its local
    // deadline passed): give the old node up and queue afresh with a new token.
    delete_or_orphan(s, e);
    e = Entry{name, e.owner};
    e.generation = s->generation();
  }

  auto store = [&] {
    std::lock_guard lk(mu_);
    entries_[key] = e;
  };
  auto forget = [&] {
    std::lock_guard lk(mu_);
    entries_.erase(key);
  };
  // Ours: the lease counts from the send time of the request that showed it.
  // Read under mu_, where a reconnect that lowers the floor also shortens the stored
  // entries: either this entry is stored first and shortened with the others, or it
  // reads the new value.
  // The validity is the floor of the session that answered (not of a later one), and
  // a session that has ended since (expired, replaced) took our node with it: not ours.
  auto owned = [&](SteadyTime sent) {
    AcquireResult res;
    std::lock_guard lk(mu_);
    if (s->expired || session_ != s || s->floor_ms <= 0) {
      entries_.erase(key);
      return res;
    }
    res.acquired = true;
    res.token = static_cast<std::uint64_t>(e.czxid);
    e.held = true;
    res.validity = Millis(s->floor_ms);
    e.confirmed = sent;
    e.valid_until = sent + res.validity;
    entries_[key] = e;
    return res;
  };
  // A transient failure: wait (bounded) for the connection to come back; a new session
  // means our nodes are gone, so start over in it. A request that got no answer within
  // the command timeout ends the attempt: the server counts as unavailable, and
  // retrying on a connection the client still believes alive would only pile up
  // requests behind the silent one.
  auto recover = [&](int rc, const char* what) -> bool {
    s = rc == zk::kTimedOut ? nullptr : usable_session(budget_end);
    if (!s) {
      delete_or_orphan(current_session(), e);
      forget();
      ec = fail(rc, what, name);
      return false;
    }
    if (s->generation() != e.generation) {
      e = Entry{name, e.owner};
      e.generation = s->generation();
    }
    return true;
  };

  for (int round = 0; round < kMaxRounds; ++round) {
    zhandle_t* zh = s->zh.get();
    const SteadyTime deadline = std::min(budget_end, clock_->now() + cfg_.command_timeout);
    const SteadyTime sent = clock_->now();
    zk::ReplyPtr created, listed;
    if (e.node.empty() && !e.uncertain && !req.keep_queued) {
      // One attempt only: a non-empty queue means busy, no need to write anything.
      listed = zk::submit_children(zh, dir);
      const int rc = zk::await(listed, *clock_, deadline);
      if (rc == ZOK && !zk::queue_order(listed->children).empty()) {
        forget();
        return {};
      }
      if (rc != ZOK && rc != ZNONODE) {
        if (zk::is_transient(rc) && recover(rc, "listing the queue")) continue;
        ec = fail(rc, "listing the queue", name);
        forget();
        return {};
      }
    }
    if (e.node.empty() && !e.uncertain) {
      e.guid = zk::make_guid(req.owner, attempts_.fetch_add(1));
      // Create our node and touch the directory in one transaction: the directory's
      // Stat tells whether anybody else is queued (uncontended: one round trip, no
      // listing), and its mzxid is the transaction's zxid, i.e. our node's czxid.
      created = zk::submit_create_and_touch(zh, dir + "/" + e.guid + std::string(zk::kLockMarker), req.owner,
                                            node_acl(), ZOO_EPHEMERAL_SEQUENTIAL, dir);
      listed.reset();
      const int rc = zk::await(created, *clock_, deadline);
      if (rc == ZNONODE) {
        int dir_rc = ZOK;
        ensure_dirs(zh, dir, deadline, dir_rc);
        if (dir_rc == ZOK) continue;
        if (zk::is_transient(dir_rc) && recover(dir_rc, "creating the lock directory")) continue;
        ec = fail(dir_rc, "creating the lock directory " + dir, name);
        forget();
        return {};
      }
      if (rc == zk::kTimedOut) {
        // Still in flight: its completion deletes the node if it lands; the keeper also
        // looks for it by guid. Retry with a new guid.
        add_orphan(dir, e.guid, e.generation);
        e.node.clear();
        e.guid.clear();
        if (recover(rc, "creating the lock node")) continue;
        return {};
      }
      if (zk::is_transient(rc)) {
        // The create may or may not have been applied: find it by guid once reconnected.
        e.uncertain = true;
        if (recover(rc, "creating the lock node")) continue;
        return {};
      }
      if (rc != ZOK) {
        ec = fail(rc, "creating a lock node under " + dir, name);
        forget();
        return {};
      }
      e.node = created->value.substr(created->value.rfind('/') + 1);
      e.czxid = created->stat.mzxid;  // the directory's Stat: same transaction, same zxid
      e.version = 0;                  // a new node
      if (created->stat.numChildren == 1) {
        return owned(sent);
      }
    }

    if (!listed || e.uncertain) {
      listed = zk::submit_children(zh, dir);
    }
    int rc = zk::await(listed, *clock_, deadline);
    if (rc == ZNONODE) rc = ZOK;  // directory gone: our node is not there either
    if (rc != ZOK) {
      if (zk::is_transient(rc) && recover(rc, "listing the queue")) continue;
      ec = fail(rc, "listing the queue", name);
      delete_or_orphan(s, e);
      forget();
      return {};
    }
    const std::vector<zk::LockNode> queue = zk::queue_order(listed->children);
    if (e.uncertain) {
      e.uncertain = false;
      auto mine =
          std::find_if(queue.begin(), queue.end(), [&](const zk::LockNode& n) { return n.guid == e.guid; });
      if (mine == queue.end()) {
        e.node.clear();  // the lost create was never applied: create again
        continue;
      }
      // Adopt the node the lost create made; its czxid comes with its Stat.
      auto st = zk::submit_exists(zh, dir + "/" + mine->node);
      const int src = zk::await(st, *clock_, deadline);
      if (src != ZOK) {
        e.node.clear();
        if (src != ZNONODE) add_orphan(dir, e.guid, e.generation);
        continue;
      }
      e.node = mine->node;
      e.czxid = st->stat.czxid;
      e.version = st->stat.version;
      continue;  // list again with the adopted node known
    }
    auto me =
        std::find_if(queue.begin(), queue.end(), [&](const zk::LockNode& n) { return n.node == e.node; });
    if (me == queue.end()) {
      // Our node was deleted from outside (or the directory went away): queue again.
      e.node.clear();
      continue;
    }
    if (me == queue.begin()) {
      return owned(sent);
    }
    if (!req.keep_queued) {
      delete_or_orphan(s, e);
      forget();
      return {};
    }
    // Queued: watch only the immediate predecessor (no herd). If it is already gone
    // the exists call says so and we look again.
    const std::string predecessor = dir + "/" + std::prev(me)->node;
    auto w = zk::submit_exists(zh, predecessor, &node_watcher, this);
    const int wrc = zk::await(w, *clock_, deadline);
    if (wrc == ZNONODE) continue;
    if (wrc != ZOK) {
      if (zk::is_transient(wrc) && recover(wrc, "watching the predecessor")) continue;
      ec = fail(wrc, "watching the predecessor", name);
      delete_or_orphan(s, e);
      forget();
      return {};
    }
    store();
    return {};  // busy; the watch calls on_change(name) when the predecessor goes
  }
  // The queue kept changing under us; report busy and let the engine come back.
  if (req.keep_queued) {
    store();
  } else {
    delete_or_orphan(s, e);
    forget();
  }
  return {};
}

void ZkBackend::cancel_acquire(std::string_view name, std::string_view owner) noexcept {
  try {
    Entry e;
    {
      std::lock_guard lk(mu_);
      auto it = entries_.find(key_of(name, owner));
      if (it == entries_.end()) return;
      e = it->second;
      entries_.erase(it);
    }
    delete_or_orphan(current_session(), e);
  } catch (...) {
    log_.log(LogLevel::warning, "zk: cancelling the wait for lock \"{}\" failed", name);
  }
}

void ZkBackend::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) {
  ec.clear();
  auto s = current_session();
  {
    std::lock_guard lk(mu_);
    if (!s || !s->connected) {
      ec = make_error_code(errc::backend_unavailable);
      return;
    }
  }
  // One round trip from here: a sync, then an exists per lease, all in flight at once.
  // The sync makes the server we are connected to catch up with the leader before it
  // answers the reads behind it (per-session FIFO), so a lagging or partitioned
  // follower cannot confirm a node the leader has already deleted: it either answers
  // with the leader's state or not at all (failed: the local deadline decides).
  zk::ReplyPtr synced;
  std::vector<zk::ReplyPtr> replies(items.size());
  std::vector<std::string> keys(items.size());
  const SteadyTime sent = clock_->now();
  {
    std::vector<std::string> paths(items.size());
    {
      std::lock_guard lk(mu_);
      for (std::size_t i = 0; i < items.size(); ++i) {
        keys[i] = key_of(items[i].name, items[i].owner);
        auto it = entries_.find(keys[i]);
        if (it == entries_.end() || !it->second.held || it->second.generation != s->generation() ||
            static_cast<std::uint64_t>(it->second.czxid) != items[i].token) {
          out[i] = RenewStatus::not_owner;
          continue;
        }
        paths[i] = zk::lock_dir(items[i].name) + "/" + it->second.node;
      }
    }
    // The path of a sync only names the server's tree; "/" (the chroot) always exists.
    if (std::any_of(paths.begin(), paths.end(), [](const std::string& p) { return !p.empty(); })) {
      synced = zk::submit_sync(s->zh.get(), "/");
      renew_syncs_.fetch_add(1);
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!paths[i].empty()) replies[i] = zk::submit_exists(s->zh.get(), paths[i]);
    }
  }
  const SteadyTime deadline = sent + cfg_.command_timeout;
  const clientid_t* id = zoo_client_id(s->zh.get());
  const std::int64_t session_id = id != nullptr ? id->client_id : 0;
  const int sync_rc = synced ? zk::await(synced, *clock_, deadline) : ZOK;
  std::vector<int> codes(items.size(), ZOK);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!replies[i]) continue;
    codes[i] = zk::await(replies[i], *clock_, deadline);
    // Without a completed sync the answer may be a follower's stale view: unknown.
    if (sync_rc != ZOK) codes[i] = zk::kTimedOut;
  }
  if (sync_rc != ZOK) {
    log_.log(LogLevel::debug, "zk: renewal sync with the leader failed: {}", zk::describe(sync_rc));
  }
  std::lock_guard lk(mu_);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!replies[i]) continue;
    const int rc = codes[i];
    if (rc == ZOK && replies[i]->stat.ephemeralOwner == session_id &&
        static_cast<std::uint64_t>(replies[i]->stat.czxid) == items[i].token) {
      out[i] = RenewStatus::renewed;
      auto it = entries_.find(keys[i]);
      if (it != entries_.end() && it->second.held) {
        it->second.confirmed = std::max(it->second.confirmed, sent);
        it->second.valid_until = std::max(it->second.valid_until, sent + Millis(s->floor_ms));
      }
    } else if (rc == ZOK || rc == ZNONODE) {
      out[i] = RenewStatus::not_owner;
      entries_.erase(keys[i]);
    } else {
      out[i] = RenewStatus::failed;
    }
  }
}

ReleaseStatus ZkBackend::release(std::string_view name, std::string_view owner, std::uint64_t token,
                                 Error& ec) {
  ec.clear();
  Entry e;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(key_of(name, owner));
    if (it == entries_.end()) return ReleaseStatus::not_owner;
    if (!it->second.held || static_cast<std::uint64_t>(it->second.czxid) != token) {
      return ReleaseStatus::not_owner;
    }
    e = it->second;
    entries_.erase(it);
  }
  auto s = current_session();
  if (!s || s->generation() != e.generation) return ReleaseStatus::not_owner;  // session ended: node gone
  auto r = zk::submit_delete(s->zh.get(), zk::lock_dir(name) + "/" + e.node, e.version);
  const int rc = zk::await(r, *clock_, clock_->now() + cfg_.command_timeout);
  if (rc == ZOK) return ReleaseStatus::released;
  if (rc == ZNONODE || rc == ZBADVERSION) return ReleaseStatus::not_owner;
  if (zk::is_transient(rc)) {
    // Still ours while the session lives: delete it as soon as we are connected again.
    add_orphan(zk::lock_dir(name), e.guid, e.generation);
  }
  ec = fail(rc, "deleting the lock node", name);
  return ReleaseStatus::released;
}

}  // namespace distlock::detail::zk
