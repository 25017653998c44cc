// Revoke on ZooKeeper (Backend::revoke, docs/zookeeper.md "Revoke"). The holder's node is
// ephemeral, owned by the holder's session: another client cannot move it to a lease of its
// own, and deleting it would hand the lock on before the holder is told. So a revoke marks
// it: one multi of two setData, compared on the node's version, gives the holder's node the
// value "@revoked\n<owner>" and writes the revoke note <lock dir>/revoked. The node stays
// first in the queue; the holder's next renewal sees its version moved (refused: revoked,
// the note says by whom and why), and the holder deletes the node once its own lease would
// have run out (its valid_until: last confirmation + session timeout), or its session's end
// takes it. Only then is the next waiter granted.
#include "zk/zk_backend_impl.hpp"

namespace distlock::detail::zk {

namespace {
constexpr int kRevokeAttempts = 5;
}  // namespace

std::string ZkBackend::revoke_note_path(std::string_view name) const {
  return zk::lock_dir(name) + "/" + std::string(zk::kRevokedNode);
}

Backend::Revoked ZkBackend::revoke(std::string_view name, std::string_view note, Millis /*note_life*/,
                                   Error& ec) {
  ec.clear();
  auto s = usable_session(clock_->now() + cfg_.connect_timeout);
  if (!s) {
    ec = fail(zk::kTimedOut, "waiting for a ZooKeeper connection", name);
    return {};
  }
  const std::string dir = zk::lock_dir(name);
  // A sync first: the server this session talks to catches up with the leader before it answers
  // the listing queued behind it (a session's requests are answered in order). Without it a
  // lagging follower can list the queue without a holder whose acquire already returned, and
  // the revoke of a held lock is a no-op (seen on a 3-server ensemble under load: the holder
  // was never told).
  zk::ReplyPtr synced = zk::submit_sync(s->zh.get(), "/");
  for (int attempt = 0; attempt < kRevokeAttempts; ++attempt) {
    const SteadyTime deadline = clock_->now() + cfg_.command_timeout;
    auto listed = zk::submit_children(s->zh.get(), dir);
    if (synced) {
      const int sync_rc = zk::await(synced, *clock_, deadline);
      synced.reset();
      if (sync_rc != ZOK) {
        ec = fail(sync_rc, "syncing with the leader before the revoke", name);
        return {};
      }
    }
    int rc = zk::await(listed, *clock_, deadline);
    if (rc == ZNONODE) return {};
    if (rc != ZOK) {
      ec = fail(rc, "listing the queue", name);
      return {};
    }
    const auto queue = zk::queue_order(listed->children);
    if (queue.empty()) return {};
    const std::string path = dir + "/" + queue.front().node;
    auto got = zk::submit_get(s->zh.get(), path);
    rc = zk::await(got, *clock_, deadline);
    if (rc == ZNONODE) continue;  // released meanwhile: look again
    if (rc != ZOK) {
      ec = fail(rc, "reading the holder's node", name);
      return {};
    }
    // Revoked already: its node waits for its holder's lease to run out.
    if (got->value.starts_with(zk::kRevokedValue)) return {};
    // A waiter first in the queue waiting out a lost holder's lock-delay: nobody holds it.
    const bool holds = first_holds(s->zh.get(), name, listed->children,
                                   static_cast<std::uint64_t>(got->stat.czxid), deadline, rc);
    if (rc != ZOK) {
      ec = fail(rc, "reading the lock-delay marker", name);
      return {};
    }
    if (!holds) return {};
    const std::string owner = got->value;
    const std::uint64_t token = static_cast<std::uint64_t>(got->stat.czxid);
    auto made = zk::submit_create(s->zh.get(), revoke_note_path(name), {}, node_acl(), ZOO_PERSISTENT);
    made->undo_if_abandoned = false;
    rc = zk::await(made, *clock_, deadline);
    if (rc != ZOK && rc != ZNODEEXISTS) {
      ec = fail(rc, "creating the revoke note", name);
      return {};
    }
    auto set = zk::submit_set_both(s->zh.get(), path, std::string(zk::kRevokedValue) + owner,
                                   got->stat.version, revoke_note_path(name),
                                   std::to_string(token) + "\n" + owner + "\n" + std::string(note), -1);
    rc = zk::await(set, *clock_, deadline);
    if (rc == ZBADVERSION || rc == ZNONODE) continue;  // the holder changed: look again
    if (rc != ZOK) {
      ec = fail(rc, "revoking the holder's node", name);
      return {};
    }
    Revoked r;
    r.revoked = true;
    r.token = token;
    r.holder = owner;
    return r;
  }
  ec.fail(errc::backend_unavailable, "ZooKeeper revoke of lock \"" + std::string(name) +
                                         "\": the holder changed " + std::to_string(kRevokeAttempts) +
                                         " times under the revoke");
  return {};
}

std::optional<std::string> ZkBackend::revoke_note(std::string_view name, Error& ec) {
  ec.clear();
  auto s = usable_session(clock_->now() + cfg_.connect_timeout);
  if (!s) {
    ec = fail(zk::kTimedOut, "waiting for a ZooKeeper connection", name);
    return std::nullopt;
  }
  auto got = zk::submit_get(s->zh.get(), revoke_note_path(name));
  const int rc = zk::await(got, *clock_, clock_->now() + cfg_.command_timeout);
  if (rc == ZNONODE) return std::nullopt;
  if (rc != ZOK) {
    ec = fail(rc, "reading the revoke note", name);
    return std::nullopt;
  }
  if (got->value.empty()) return std::nullopt;  // created by a revoke that did not get through
  return got->value;
}

}  // namespace distlock::detail::zk
