// Lock-delay on ZooKeeper (docs/zookeeper.md "Lock-delay"). A holder with lock_delay D
// keeps the persistent node <lock dir>/delay = "armed\n<its node's czxid>\n<D ms>", written
// after it found itself first and before the acquisition returns (a holder that dies before
// then never held the lock for its user), deleted by its release only (one multi with its
// node's delete). A lost holder (session expired, node revoked, declared lost) leaves it.
// Whoever is next first in the queue finds an armed marker naming another node: that node is
// gone without a release, so it was lost no later than this read. It turns the marker into
// "lost\n<D ms>" (compared on the marker's version): the write's mtime, the ZooKeeper leader's
// wall clock at that transaction, is a moment after the loss. The name is granted once the
// server's clock is D past it: a touch of the lock directory (setData) reads the leader's
// clock now (its mtime); until then the acquirer is busy with the time left (a waiter keeps
// its place), and then takes the marker over (compared on its version).
#include <algorithm>

#include "engine/delay_marker.hpp"
#include "zk/zk_backend_impl.hpp"

namespace distlock::detail::zk {

using Marker = DelayMarker<std::uint64_t>;

std::string ZkBackend::delay_path(std::string_view name) const {
  return zk::lock_dir(name) + "/" + std::string(zk::kDelayNode);
}

bool ZkBackend::first_holds(zhandle_t* zh, std::string_view name, const std::vector<std::string>& children,
                            std::uint64_t first_czxid, SteadyTime deadline, int& rc) {
  rc = ZOK;
  if (std::find(children.begin(), children.end(), std::string(zk::kDelayNode)) == children.end()) return true;
  auto got = zk::submit_get(zh, delay_path(name));
  rc = zk::await(got, *clock_, deadline);
  if (rc == ZNONODE) {
    rc = ZOK;
    return true;
  }
  if (rc != ZOK) return true;
  // A holder writes its armed marker before its grant returns and takes a lost one over
  // (or deletes it) before that: any other marker means the first node waits a delay out.
  return zk::marker_lets_first_hold(got->value, first_czxid);
}

ReleaseStatus ZkBackend::release(std::string_view name, std::string_view owner, std::uint64_t token,
                                 Error& ec) {
  {
    LockGuard lk(recipe_.mutex());
    QueueEntry* e = recipe_.find_locked(name, owner);
    if (e != nullptr && e->token == token && e->held) entry_of<Entry>(*e).releasing = true;
  }
  return recipe_.release(name, owner, token, ec);
}

void ZkBackend::forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept {
  try {
    Error ignored;
    (void)recipe_.release(name, owner, token, ignored);  // the node only: the marker stays
  } catch (...) {                                        // the session's end is the bound
  }
}

QueuePosition::Kind ZkBackend::settle_delay(Entry& entry, const AcquireRequest& req, std::uint64_t my_czxid,
                                            zhandle_t* zh, SteadyTime deadline, QueuePosition& pos,
                                            Error& ec) {
  const std::string dir = zk::lock_dir(entry.name);
  const std::string mpath = delay_path(entry.name);
  const std::string mine =
      req.lock_delay > Millis(0) ? armed_delay_marker(my_czxid, req.lock_delay) : std::string();
  auto failed = [&](int rc, const char* what) {
    ec = fail(rc, what, entry.name);
    return QueuePosition::Kind::failed;
  };
  auto got = zk::submit_get(zh, mpath);
  int rc = zk::await(got, *clock_, deadline);
  if (rc != ZOK && rc != ZNONODE) return failed(rc, "reading the lock-delay marker");
  // Takes the marker (at `version`; -1: there is none): ours, or gone when we set no delay.
  auto take = [&](int version) -> QueuePosition::Kind {
    int trc = ZOK;
    int new_version = -1;
    if (version < 0) {
      if (mine.empty()) return QueuePosition::Kind::first;
      auto made = zk::submit_create(zh, mpath, mine, node_acl(), ZOO_PERSISTENT);
      made->undo_if_abandoned = false;
      trc = zk::await(made, *clock_, deadline);
      if (trc == ZNODEEXISTS) return QueuePosition::Kind::again;
      new_version = 0;
    } else if (mine.empty()) {
      auto d = zk::submit_delete(zh, mpath, version);
      trc = zk::await(d, *clock_, deadline);
    } else {
      auto set = zk::submit_set(zh, mpath, mine, version);
      trc = zk::await(set, *clock_, deadline);
      if (trc == ZOK) new_version = set->stat.version;
    }
    if (trc == ZBADVERSION || trc == ZNONODE) return QueuePosition::Kind::again;
    if (trc != ZOK) return failed(trc, "writing the lock-delay marker");
    LockGuard lk(recipe_.mutex());
    entry.delay_version = new_version;
    return QueuePosition::Kind::first;
  };
  if (rc == ZNONODE) return take(-1);
  const std::optional<Marker> m = parse_delay_marker<std::uint64_t>(got->value);
  if (!m) {
    ec.fail(errc::protocol_error,
            "the lock-delay marker of lock \"" + entry.name + "\" is not one distlock wrote: " + mpath);
    return QueuePosition::Kind::failed;
  }
  if (m->armed && m->holder == my_czxid) {  // ours (an earlier round of this acquisition)
    LockGuard lk(recipe_.mutex());
    entry.delay_version = got->stat.version;
    return QueuePosition::Kind::first;
  }
  if (m->delay == Millis(0)) return take(got->stat.version);
  std::int64_t lost_at = got->stat.mtime;
  int version = got->stat.version;
  if (m->armed) {
    // The holder it names is gone (we are first): lost. The write's mtime starts the delay.
    auto set = zk::submit_set(zh, mpath, lost_delay_marker(m->delay), version);
    rc = zk::await(set, *clock_, deadline);
    if (rc == ZBADVERSION || rc == ZNONODE) return QueuePosition::Kind::again;
    if (rc != ZOK) return failed(rc, "writing the lock-delay marker");
    lost_at = set->stat.mtime;
    version = set->stat.version;
    log_.log(LogLevel::info, "zk: lock \"{}\" was lost by its holder: held back for its lock-delay of {} ms",
             entry.name, m->delay.count());
  }
  // The leader's clock now: the mtime of a touch of the lock directory.
  auto touch = zk::submit_set(zh, dir, {}, -1);
  rc = zk::await(touch, *clock_, deadline);
  if (rc != ZOK) return failed(rc, "reading the server's clock (touching the lock directory)");
  const Millis passed(touch->stat.mtime - lost_at);
  if (passed >= m->delay) return take(version);
  pos.holder_ttl = m->delay - passed;
  return QueuePosition::Kind::held_back;
}

}  // namespace distlock::detail::zk
