#include "zk/zk_backend.hpp"

#include "zk/zk_backend_impl.hpp"

namespace distlock::detail {
namespace zk {

LockInfo ZkBackend::status(std::string_view name, Error& ec) {
  ec.clear();
  status_reads_.fetch_add(1);
  auto s = usable_session(clock_->now() + cfg_.connect_timeout);
  if (!s) {
    ec = fail(zk::kTimedOut, "waiting for a ZooKeeper connection", name);
    return {};
  }
  const std::string dir = zk::lock_dir(name);
  for (int round = 0; round < 4; ++round) {
    const SteadyTime deadline = clock_->now() + cfg_.command_timeout;
    // A sync ahead of the listing, in the same round trip: a follower serves reads from what it
    // has applied, so without it a status through a lagging follower could report a name granted
    // (or released) through the leader before this call began as free (or held). A follower cut
    // off from the leader does not answer the sync: the call fails unavailable, never answers from
    // an old view.
    zk::ReplyPtr listed;
    if (const int sync_rc = zk::list_after_sync(s->zh.get(), dir, *clock_, deadline, listed);
        sync_rc != ZOK) {
      ec = fail(sync_rc, "syncing with the leader before listing the queue", name);
      return {};
    }
    const int rc = zk::await(listed, *clock_, deadline);
    LockInfo info;
    info.waiters = 0;
    info.waiters_listed = true;  // a free lock: nobody waits
    if (rc == ZNONODE) return info;
    if (rc != ZOK) {
      ec = fail(rc, "listing the queue", name);
      return {};
    }
    const auto queue = zk::queue_order(listed->children);
    if (queue.empty()) return info;
    auto st = zk::submit_get(s->zh.get(), dir + "/" + queue.front().node);
    const int src = zk::await(st, *clock_, deadline);
    if (src == ZNONODE) continue;  // released meanwhile: look again
    if (src != ZOK) {
      ec = fail(src, "reading the holder's node", name);
      return {};
    }
    // A revoked holder's node waits for its lease to run out first in the queue: held by nobody.
    info.held = !st->value.starts_with(zk::kRevokedValue);
    // So is a waiter's node first in the queue waiting out a lost holder's lock-delay: it is
    // listed as the first waiter.
    bool first_waits = false;
    if (info.held) {
      int mrc = ZOK;
      first_waits = !first_holds(s->zh.get(), name, listed->children,
                                 static_cast<std::uint64_t>(st->stat.czxid), deadline, mrc);
      if (mrc != ZOK) {
        ec = fail(mrc, "reading the lock-delay marker", name);
        return {};
      }
      info.held = !first_waits;
    }
    if (info.held) {
      info.token = static_cast<std::uint64_t>(st->stat.czxid);
      if (auto owner = zk::owner_of_guid(queue.front().guid)) info.holder = *owner;
    }
    // The waiters in queue order (ascending sequence: the order the lock passes on
    // in), each with its node's creation time; one that left meanwhile is not listed.
    const std::size_t from = first_waits ? 0 : 1;
    std::vector<zk::ReplyPtr> waiting;
    for (std::size_t i = from; i < queue.size(); ++i) {
      waiting.push_back(zk::submit_exists(s->zh.get(), dir + "/" + queue[i].node));
    }
    for (std::size_t i = from; i < queue.size(); ++i) {
      const int wrc = zk::await(waiting[i - from], *clock_, deadline);
      if (wrc == ZNONODE) continue;
      if (wrc != ZOK) {
        ec = fail(wrc, "reading a waiter's node", name);
        return {};
      }
      WaiterInfo w;
      w.owner = zk::owner_of_guid(queue[i].guid).value_or(queue[i].guid);
      w.waiting_since =
          std::chrono::system_clock::time_point(std::chrono::milliseconds(waiting[i - from]->stat.ctime));
      info.waiter_list.push_back(std::move(w));
    }
    info.waiters_listed = true;
    info.waiters = info.waiter_list.size();
    return info;  // ttl_remaining stays unknown: the holder's session decides
  }
  ec = make_error_code(errc::backend_unavailable);
  return {};
}

}  // namespace zk

std::optional<ZkStats> zk_stats(const Backend& backend) {
  if (const auto* zk = dynamic_cast<const zk::ZkBackend*>(&backend)) return zk->stats();
  return std::nullopt;
}

std::unique_ptr<Backend> make_zk_backend(const Url& url, const ClientOptions& opts, Error& err) {
  zk::ZkBackend::Config cfg;
  err = zk::parse_url(url, opts, cfg);
  std::unique_ptr<zk::ZkBackend> backend;
  if (!err) {
    backend = std::make_unique<zk::ZkBackend>(std::move(cfg), opts);
    backend->start(err);
  }
  if (err) return nullptr;
  return backend;
}

}  // namespace distlock::detail
