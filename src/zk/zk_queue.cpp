// The queue store on ZooKeeper (the recipe is engine/queue_recipe.cpp): an ephemeral
// sequential node per acquisition; the lowest holds; a waiter watches only its
// predecessor.
#include "zk/zk_backend_impl.hpp"

namespace distlock::detail::zk {

namespace {

// What enqueue works on: a copy of the entry's place, written back under the mutex.
struct Place {
  std::uint64_t generation = 0;
  std::string guid, node, predecessor;
  std::uint64_t czxid = 0;
  int version = 0;
  bool uncertain = false;
};

Place place_of(const Entry& e) {
  return Place{e.generation, e.guid, e.node, e.predecessor, e.token, e.version, e.uncertain};
}

void set_place(Entry& e, const Place& p) {
  e.generation = p.generation;
  e.guid = p.guid;
  e.node = p.node;
  e.predecessor = p.predecessor;
  e.token = p.czxid;
  e.version = p.version;
  e.uncertain = p.uncertain;
}

}  // namespace

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

bool ZkBackend::admit(const AcquireRequest& req, Clock::time_point started, Error& ec) {
  auto s = usable_session(started + cfg_.connect_timeout + cfg_.command_timeout);
  if (!s) {
    ec = fail(zk::kTimedOut, "waiting for a ZooKeeper connection", req.name);
    return false;
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
    log_.log(LogLevel::warning, "zk: lock \"{}\": {}", req.name, why);
    ec.set_detail(std::move(why));
    ec = make_error_code(errc::invalid_argument);
    return false;
  }
  return true;
}

QueueEntryPtr ZkBackend::new_entry(const AcquireRequest& req, Error& /*ec*/) {
  auto e = std::make_shared<Entry>(req.name, req.owner);
  LockGuard lk(recipe_.mutex());
  // Of the current session while it lives; else of none (not live: the recipe makes
  // another once a session is usable).
  e->generation = session_ && !session_->expired ? session_->generation() : 0;
  return e;
}

bool ZkBackend::live(const QueueEntry& e) const {
  return session_ && !session_->expired && session_->generation() == entry_of<Entry>(e).generation;
}

QueuePosition ZkBackend::enqueue(QueueEntry& qe, const AcquireRequest& req, Clock::time_point started,
                                 Error& ec) {
  Entry& entry = entry_of<Entry>(qe);
  const SteadyTime budget_end = started + cfg_.connect_timeout + cfg_.command_timeout;
  const std::string& name = entry.name;
  const std::string dir = zk::lock_dir(name);
  Place p;
  {
    LockGuard lk(recipe_.mutex());
    p = place_of(entry);
  }
  QueuePosition pos;
  auto done = [&](QueuePosition::Kind kind) {
    LockGuard lk(recipe_.mutex());
    set_place(entry, p);
    pos.kind = kind;
    return pos;
  };
  // This attempt's node may exist (or appear) under its guid: an orphan looks for it and
  // deletes it; the entry goes on with a new guid.
  auto abandon_attempt = [&] {
    auto lost = std::make_shared<Entry>(entry.name, entry.owner);
    lost->generation = p.generation;
    lost->guid = p.guid;
    lost->uncertain = true;
    recipe_.orphan(std::move(lost));
    p.node.clear();
    p.guid.clear();
  };

  auto s = usable_session(budget_end);
  if (!s) {
    ec = fail(zk::kTimedOut, "waiting for a ZooKeeper connection", name);
    return done(QueuePosition::Kind::failed);
  }
  // An entry lives in one session: if that one has ended, so has its node, and the
  // recipe starts over with a new entry (never moves this one: a session's end takes
  // the entries of that session only).
  if (p.generation != s->generation()) return done(QueuePosition::Kind::again);

  // A transient failure: wait (bounded) for the connection to come back, and look again
  // (with a new entry if the session ended meanwhile). A request that got no answer within the
  // command timeout ends the attempt: the server counts as unavailable, and retrying on
  // a connection the client still believes alive would only pile up requests behind
  // the silent one.
  auto recover = [&](int rc, const char* what) -> QueuePosition {
    s = rc == zk::kTimedOut ? nullptr : usable_session(budget_end);
    if (!s) {
      ec = fail(rc, what, name);
      return done(QueuePosition::Kind::failed);
    }
    return done(QueuePosition::Kind::again);
  };

  zhandle_t* zh = s->zh.get();
  const SteadyTime deadline = std::min(budget_end, clock_->now() + cfg_.command_timeout);
  // The answer to a sync sent ahead of a listing: nothing when it was applied, else how this
  // attempt ends (a transient failure recovers; any other fails the call).
  auto sync_failed = [&](const zk::ReplyPtr& synced) -> std::optional<QueuePosition> {
    const int sync_rc = zk::await(synced, *clock_, deadline);
    if (sync_rc == ZOK) return std::nullopt;
    if (zk::is_transient(sync_rc))
      return recover(sync_rc, "syncing with the leader before listing the queue");
    ec = fail(sync_rc, "syncing with the leader before listing the queue", name);
    return done(QueuePosition::Kind::failed);
  };
  const SteadyTime sent = clock_->now();
  zk::ReplyPtr created, listed;
  if (p.node.empty() && !p.uncertain && !req.keep_queued) {
    // One attempt only: a non-empty queue means busy, no need to write anything. A sync first,
    // pipelined with the listing (one round trip): the server this session talks to catches up
    // with the leader before it answers the listing queued behind it (a session's requests are
    // answered in order). Without it a lagging follower of an ensemble listed a node whose
    // delete the leader had already confirmed to its owner, and a name released (or left by a
    // cancelled acquire_all) before this call began was reported busy (seen once in CI on zk3:
    // MultiLock.ACancelledCallReleasesWhatItTook; tests/zk/zk_follower_lag_test.cpp). A follower
    // cut off from the leader does not answer the sync: the attempt fails (unavailable), it
    // never answers busy from its old view.
    auto synced = zk::submit_sync(zh, "/");
    listed = zk::submit_children(zh, dir);
    if (auto failed = sync_failed(synced)) return *failed;
    const int rc = zk::await(listed, *clock_, deadline);
    if (rc == ZOK && !zk::queue_order(listed->children).empty()) return done(QueuePosition::Kind::busy);
    if (rc != ZOK && rc != ZNONODE) {
      if (zk::is_transient(rc)) return recover(rc, "listing the queue");
      ec = fail(rc, "listing the queue", name);
      return done(QueuePosition::Kind::failed);
    }
  }
  if (p.node.empty() && !p.uncertain) {
    p.guid = zk::make_guid(req.owner, attempts_.fetch_add(1));
    // Create our node and touch the directory in one transaction: the directory's Stat
    // tells whether anybody else is queued (uncontended: one round trip, no listing),
    // and its mzxid is the transaction's zxid, i.e. our node's czxid.
    created = zk::submit_create_and_touch(zh, dir + "/" + p.guid + std::string(zk::kLockMarker), req.owner,
                                          node_acl(), ZOO_EPHEMERAL_SEQUENTIAL, dir);
    listed.reset();
    const int rc = zk::await(created, *clock_, deadline);
    if (rc == ZNONODE) {
      int dir_rc = ZOK;
      ensure_dirs(zh, dir, deadline, dir_rc);
      if (dir_rc == ZOK) return done(QueuePosition::Kind::again);
      if (zk::is_transient(dir_rc)) return recover(dir_rc, "creating the lock directory");
      ec = fail(dir_rc, "creating the lock directory " + dir, name);
      return done(QueuePosition::Kind::failed);
    }
    if (rc == zk::kTimedOut) {
      // Still in flight: its completion deletes the node if it lands; an orphan looks
      // for it by guid as well. A retry gets a new guid.
      abandon_attempt();
      return recover(rc, "creating the lock node");
    }
    if (zk::is_transient(rc)) {
      // The create may or may not have been applied: find it by guid once reconnected.
      p.uncertain = true;
      return recover(rc, "creating the lock node");
    }
    if (rc != ZOK) {
      ec = fail(rc, "creating a lock node under " + dir, name);
      return done(QueuePosition::Kind::failed);
    }
    p.node = created->value.substr(created->value.rfind('/') + 1);
    p.czxid = static_cast<std::uint64_t>(created->stat.mzxid);  // the directory's Stat: same transaction
    p.version = 0;                                              // a new node
    if (created->stat.numChildren == 1) {
      pos.sent = sent;
      // Nothing else in the directory: no lock-delay marker either.
      if (req.lock_delay > Millis(0)) {
        const auto k = settle_delay(entry, req, p.czxid, zh, deadline, pos, ec);
        if (k != QueuePosition::Kind::first) return done(k);
      }
      return done(QueuePosition::Kind::first);
    }
  }

  zk::ReplyPtr synced;
  if (p.uncertain) {
    // Looking for a create whose answer was lost: it may have been applied by the leader and
    // not yet by the server this session now talks to (a reconnect may land on a lagging
    // follower). The sync makes the listing behind it see it, so it is adopted, not made twice.
    synced = zk::submit_sync(zh, "/");
  }
  if (!listed || p.uncertain) listed = zk::submit_children(zh, dir);
  if (synced) {
    if (auto failed = sync_failed(synced)) return *failed;
  }
  int rc = zk::await(listed, *clock_, deadline);
  if (rc == ZNONODE) rc = ZOK;  // directory gone: our node is not there either
  if (rc != ZOK) {
    if (zk::is_transient(rc)) return recover(rc, "listing the queue");
    ec = fail(rc, "listing the queue", name);
    return done(QueuePosition::Kind::failed);
  }
  const std::vector<zk::LockNode> queue = zk::queue_order(listed->children);
  if (p.uncertain) {
    p.uncertain = false;
    auto mine =
        std::find_if(queue.begin(), queue.end(), [&](const zk::LockNode& n) { return n.guid == p.guid; });
    if (mine == queue.end()) {
      p.node.clear();  // the lost create was never applied: create again
      return done(QueuePosition::Kind::again);
    }
    // Adopt the node the lost create made; its czxid comes with its Stat.
    auto st = zk::submit_exists(zh, dir + "/" + mine->node);
    const int src = zk::await(st, *clock_, deadline);
    if (src != ZOK) {
      if (src != ZNONODE) {
        abandon_attempt();
      } else {
        p.node.clear();
        p.guid.clear();
      }
      return done(QueuePosition::Kind::again);
    }
    p.node = mine->node;
    p.czxid = static_cast<std::uint64_t>(st->stat.czxid);
    p.version = st->stat.version;
    return done(QueuePosition::Kind::again);  // list again with the adopted node known
  }
  auto me = std::find_if(queue.begin(), queue.end(), [&](const zk::LockNode& n) { return n.node == p.node; });
  if (me == queue.end()) {
    // Our node was deleted from outside (or the directory went away): queue again.
    p.node.clear();
    return done(QueuePosition::Kind::again);
  }
  if (me == queue.begin()) {
    pos.sent = sent;
    // A marker is a child of the directory: without one listed, there is none to settle.
    const bool marker = std::find(listed->children.begin(), listed->children.end(),
                                  std::string(zk::kDelayNode)) != listed->children.end();
    if (marker || req.lock_delay > Millis(0)) {
      const auto k = settle_delay(entry, req, p.czxid, zh, deadline, pos, ec);
      if (k != QueuePosition::Kind::first) return done(k);
    }
    return done(QueuePosition::Kind::first);
  }
  p.predecessor = std::prev(me)->node;
  return done(QueuePosition::Kind::behind);
}

// Ours: the validity is the floor of the session that answered (not of a later one),
// and a session that has ended since (expired, replaced) took our node with it. Read
// under the mutex, where a reconnect that lowers the floor also shortens the held
// entries: either this entry is granted first and shortened with the others, or it
// reads the new value.
std::optional<Millis> ZkBackend::grant(QueueEntry& qe, const QueuePosition& pos) {
  Entry& e = entry_of<Entry>(qe);
  if (!session_ || session_->expired || session_->generation() != e.generation || session_->floor_ms <= 0) {
    return std::nullopt;
  }
  const Millis validity(session_->floor_ms);
  e.confirmed = pos.sent;
  e.valid_until = pos.sent + validity;
  return validity;
}

QueueStore::Watch ZkBackend::watch_predecessor(QueueEntry& qe, Clock::time_point started, Error& ec) {
  Entry& e = entry_of<Entry>(qe);
  const SteadyTime budget_end = started + cfg_.connect_timeout + cfg_.command_timeout;
  std::string predecessor;
  std::uint64_t generation = 0;
  {
    LockGuard lk(recipe_.mutex());
    predecessor = zk::lock_dir(e.name) + "/" + e.predecessor;
    generation = e.generation;
  }
  auto s = usable_session(budget_end);
  if (!s || s->generation() != generation) {
    if (s) return Watch::gone;  // a new session: look again (with a new entry in it)
    ec = fail(zk::kTimedOut, "waiting for a ZooKeeper connection", e.name);
    return Watch::failed;
  }
  // Only the immediate predecessor (no herd). If it is already gone the exists call
  // says so and the recipe looks again.
  auto w = zk::submit_exists(s->zh.get(), predecessor, &node_watcher, this);
  const int wrc = zk::await(w, *clock_, std::min(budget_end, clock_->now() + cfg_.command_timeout));
  if (wrc == ZOK) return Watch::watching;  // node_watcher calls on_change(name) when it goes
  if (wrc == ZNONODE) return Watch::gone;
  if (zk::is_transient(wrc) && wrc != zk::kTimedOut && usable_session(budget_end)) return Watch::gone;
  ec = fail(wrc, "watching the predecessor", e.name);
  return Watch::failed;
}

QueueStore::Deleted ZkBackend::delete_place(QueueEntry& qe, Error& ec) {
  const Entry& e = entry_of<Entry>(qe);
  Place p;
  {
    LockGuard lk(recipe_.mutex());
    p = place_of(e);
  }
  auto s = current_session();
  // Another session: this one's nodes went with the old one.
  if (!s || s->generation() != p.generation) return Deleted::gone;
  const std::string dir = zk::lock_dir(e.name);
  const SteadyTime deadline = clock_->now() + cfg_.command_timeout;
  int delay_version = -1;
  {
    LockGuard lk(recipe_.mutex());
    if (e.releasing) delay_version = e.delay_version;
  }
  if (!p.node.empty() && delay_version >= 0) {
    // A release takes our lock-delay marker with it (both or neither): handed over at once.
    auto r =
        zk::submit_delete_both(s->zh.get(), dir + "/" + p.node, p.version, delay_path(e.name), delay_version);
    const int rc = zk::await(r, *clock_, deadline);
    if (rc == ZOK) return Deleted::deleted;
    if (zk::is_transient(rc)) {
      ec = fail(rc, "deleting the lock node", e.name);
      return Deleted::retry;
    }
    // The marker moved or went (or the node did): the node alone, below.
  }
  if (!p.node.empty()) {
    auto r = zk::submit_delete(s->zh.get(), dir + "/" + p.node, p.version);
    const int rc = zk::await(r, *clock_, deadline);
    if (rc == ZOK) return Deleted::deleted;
    if (rc == ZBADVERSION) return delete_revoked(e, s, dir + "/" + p.node, deadline, ec);
    if (rc == ZNONODE) return Deleted::gone;
    ec = fail(rc, "deleting the lock node", e.name);
    return zk::is_transient(rc) ? Deleted::retry : Deleted::failed;
  }
  if (!p.uncertain || p.guid.empty()) return Deleted::gone;  // nothing was created
  // A create whose answer was lost: its node, if it was made, carries our guid. A sync first
  // (pipelined): a lagging server would list no node of a create the leader applied, and the
  // node would stay, first in line, until the session ends.
  zk::ReplyPtr listed;
  int rc = zk::list_after_sync(s->zh.get(), dir, *clock_, deadline, listed);
  if (rc != ZOK) {
    ec = fail(rc, "syncing with the leader before listing the queue", e.name);
    return Deleted::retry;
  }
  rc = zk::await(listed, *clock_, deadline);
  if (rc == ZNONODE) return Deleted::gone;
  if (rc != ZOK) {
    ec = fail(rc, "listing the queue", e.name);
    return Deleted::retry;
  }
  Deleted result = Deleted::gone;
  for (const auto& n : zk::queue_order(listed->children)) {
    if (n.guid != p.guid) continue;
    auto d = zk::submit_delete(s->zh.get(), dir + "/" + n.node, -1);
    rc = zk::await(d, *clock_, deadline);
    if (rc == ZOK) {
      if (result == Deleted::gone) result = Deleted::deleted;
    } else if (rc != ZNONODE) {
      ec = fail(rc, "deleting the lock node", e.name);
      result = Deleted::retry;
    }
  }
  return result;
}

QueueStore::Deleted ZkBackend::delete_revoked(const Entry& e, const std::shared_ptr<Session>& s,
                                              const std::string& path, SteadyTime deadline, Error& ec) {
  auto got = zk::submit_get(s->zh.get(), path);
  const int rc = zk::await(got, *clock_, deadline);
  if (rc == ZNONODE) return Deleted::gone;
  if (rc != ZOK) {
    ec = fail(rc, "reading the lock node", e.name);
    return zk::is_transient(rc) ? Deleted::retry : Deleted::failed;
  }
  const clientid_t* id = zoo_client_id(s->zh.get());
  if (id == nullptr || got->stat.ephemeralOwner != id->client_id ||
      !got->value.starts_with(zk::kRevokedValue)) {
    return Deleted::gone;  // not our node any more
  }
  // Revoked: the node holds the lock back until our own lease would have run out (the
  // holder's local deadline), then goes. Until then the keeper retries (every 200 ms).
  SteadyTime until;
  {
    LockGuard lk(recipe_.mutex());
    until = e.valid_until;
  }
  if (clock_->now() < until) return Deleted::retry;
  auto d = zk::submit_delete(s->zh.get(), path, got->stat.version);
  const int drc = zk::await(d, *clock_, deadline);
  if (drc == ZOK) return Deleted::deleted;
  if (drc == ZNONODE || drc == ZBADVERSION) return Deleted::gone;
  ec = fail(drc, "deleting the revoked lock node", e.name);
  return zk::is_transient(drc) ? Deleted::retry : Deleted::failed;
}

void ZkBackend::orphans_waiting() noexcept {
  LockGuard lk(recipe_.mutex());
  cv_.notify_all();
}

void ZkBackend::confirm(std::span<QueueEntry* const> entries, std::span<RenewStatus> out,
                        Clock::time_point sent, Error& ec) {
  auto s = current_session();
  std::vector<std::string> paths(entries.size());
  std::vector<std::uint64_t> tokens(entries.size());
  std::vector<int> versions(entries.size());
  // Whether the node is read (its data watch armed by the read) or confirmed by the sync alone.
  std::vector<bool> read(entries.size(), false);
  // Whether that read asks for the node's data watch (Session::may_watch): only then is it armed.
  std::vector<bool> watch(entries.size(), false);
  {
    LockGuard lk(recipe_.mutex());
    if (!s || !s->connected) {
      ec = make_error_code(errc::backend_unavailable);
      ec.set_detail("not connected to ZooKeeper at " + cfg_.redacted_url);
      return;
    }
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entry_of<Entry>(*entries[i]);
      tokens[i] = e.token;
      versions[i] = e.version;
      if (e.generation != s->generation()) {
        out[i] = RenewStatus::not_owner;  // its session ended: the node went with it
        continue;
      }
      paths[i] = zk::lock_dir(e.name) + "/" + e.node;
      auto armed = s->armed.find(paths[i]);
      read[i] = armed == s->armed.end() || armed->second != std::make_pair(e.token, e.version);
      // Armed before the read is sent: a notification that comes after it disarms it again.
      if (read[i]) {
        s->armed.erase(paths[i]);
        watch[i] = s->may_watch(paths[i]);
        if (watch[i]) s->armed[paths[i]] = {e.token, e.version};
      }
    }
  }
  // One round trip: a sync, then a get (which arms the node's data watch, within the session's
  // watch budget: Session::may_watch) per lease not armed yet, all in flight at once. The sync makes the
  // server we are connected to catch up with the leader before it answers the reads queued behind it
  // (per-session FIFO), so a lagging or partitioned follower cannot confirm a node the leader has already
  // deleted: it either answers with the leader's state or not at all (failed: the local deadline decides).
  // The server sends a watch's notification before the answer to any later request of the
  // session, and the C client delivers both in that order: once the sync is answered, an armed
  // node that is still armed has not changed (not revoked, not deleted) up to the leader's state
  // at the sync. The path of a sync only names the server's tree; "/" (the chroot) always exists.
  zk::ReplyPtr synced;
  std::vector<zk::ReplyPtr> replies(entries.size());
  if (std::any_of(paths.begin(), paths.end(), [](const std::string& p) { return !p.empty(); })) {
    synced = zk::submit_sync(s->zh.get(), "/");
    renew_syncs_.fetch_add(1);
  }
  const auto submit_read = [&](std::size_t i) {
    // A get, not an exists: an exists of a missing node would leave a watch behind for good.
    replies[i] = watch[i] ? zk::submit_get(s->zh.get(), paths[i], &held_watcher, s.get())
                          : zk::submit_get(s->zh.get(), paths[i]);
    renew_reads_.fetch_add(1);
  };
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (!paths[i].empty() && read[i]) submit_read(i);
  }
  const SteadyTime deadline = sent + cfg_.command_timeout;
  const clientid_t* id = zoo_client_id(s->zh.get());
  const std::int64_t session_id = id != nullptr ? id->client_id : 0;
  const int sync_rc = synced ? zk::await(synced, *clock_, deadline) : ZOK;
  if (sync_rc != ZOK) {
    log_.log(LogLevel::debug, "zk: renewal sync with the leader failed: {}", zk::describe(sync_rc));
  } else {
    // Confirmed by the sync: still armed with the token and version it was armed at. A node
    // disarmed meanwhile (a notification, a reconnect) is read now, in a second round.
    std::vector<std::size_t> again;
    {
      LockGuard lk(recipe_.mutex());
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (paths[i].empty() || read[i]) continue;
        auto armed = s->armed.find(paths[i]);
        if (armed != s->armed.end() && armed->second == std::make_pair(tokens[i], versions[i])) {
          out[i] = RenewStatus::renewed;
          continue;
        }
        read[i] = true;
        s->armed.erase(paths[i]);
        watch[i] = s->may_watch(paths[i]);
        if (watch[i]) s->armed[paths[i]] = {tokens[i], versions[i]};
        again.push_back(i);
      }
    }
    for (const std::size_t i : again) submit_read(i);
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (paths[i].empty()) continue;
    if (!read[i]) {
      if (sync_rc != ZOK) out[i] = RenewStatus::failed;  // not confirmed: the local deadline decides
      continue;
    }
    int rc = zk::await(replies[i], *clock_, deadline);
    // Without a completed sync the answer may be a follower's stale view: unknown.
    if (sync_rc != ZOK) rc = zk::kTimedOut;
    // A version moved by somebody else: a revoke marked the node (zk_revoke.cpp).
    if (rc == ZOK && replies[i]->stat.ephemeralOwner == session_id &&
        static_cast<std::uint64_t>(replies[i]->stat.czxid) == tokens[i] &&
        replies[i]->stat.version == versions[i]) {
      out[i] = RenewStatus::renewed;
    } else {
      {
        // Not confirmed: read again next time (a node that is not ours keeps no armed entry).
        LockGuard lk(recipe_.mutex());
        s->armed.erase(paths[i]);
        if (watch[i] && rc == ZNONODE) s->unwatched(paths[i]);  // a get of no node leaves no watch
      }
      if (rc == ZOK || rc == ZNONODE) {
        out[i] = RenewStatus::not_owner;
        if (rc == ZOK && replies[i]->stat.ephemeralOwner == session_id &&
            static_cast<std::uint64_t>(replies[i]->stat.czxid) == tokens[i]) {
          // Our node, marked by a revoke: the recipe forgets the hold without deleting anything,
          // and our session would keep the node first in the queue for as long as it lives. An
          // orphan of it deletes it once our lease would have run out (delete_revoked).
          auto left = std::make_shared<Entry>(entries[i]->name, entries[i]->owner);
          {
            LockGuard lk(recipe_.mutex());
            const Entry& e = entry_of<Entry>(*entries[i]);
            left->generation = e.generation;
            left->node = e.node;
            left->version = e.version;
            left->token = e.token;
            left->valid_until = e.valid_until;
          }
          recipe_.orphan(std::move(left));
        }
      } else {
        out[i] = RenewStatus::failed;
      }
    }
  }
}

void ZkBackend::confirmed(QueueEntry& qe, Clock::time_point sent) {
  Entry& e = entry_of<Entry>(qe);
  e.confirmed = std::max(e.confirmed, sent);
  if (session_ && session_->generation() == e.generation) {
    e.valid_until = std::max(e.valid_until, sent + Millis(session_->floor_ms));
  }
}

}  // namespace distlock::detail::zk
