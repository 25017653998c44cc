// The redis+cluster:// backend's acquire and wait queue: the queue scripts of redis://
// (redis/lock_scripts.hpp, cluster_* variants) on the master serving the name's slot, grants
// on the name's sharded release channel, refreshes and give-ups by the shared
// redis::WaitQueue (docs/redis-cluster.md "How waiting works").
#include <algorithm>
#include <set>

#include "redis/lock_scripts.hpp"
#include "rediscluster/cluster_backend_impl.hpp"

namespace distlock::detail::rediscluster {

AcquireResult ClusterBackend::try_acquire(const AcquireRequest& req, Error& ec) {
  ec.clear();
  if (req.keep_queued) return acquire_queued(req, ec);
  // One attempt that never queues and never jumps a live queue (mode "0").
  return run_acquire(req, "0", "0", ec).result;
}

ClusterBackend::Answer ClusterBackend::run_acquire(const AcquireRequest& req, const std::string& entry,
                                                   const char* mode, Error& ec) {
  ec.clear();
  const NameKeys k = rediscluster::keys_of(prefix_, req.name);
  const std::string ttl = std::to_string(req.ttl.count());
  const std::string delay = std::to_string(req.lock_delay.count());
  const std::string events = events_channel(prefix_, k.slot);
  Reply r;
  Reply busy;  // a held lock's PTTL, read when the script was refused during a migration
  const redisReply* d = route(
      k.slot, "acquire",
      [&](Connection& c, bool asking, Error& e) {
        r = redis::cluster_queue_acquire_script().run(c, {k.lock, k.queue, k.expiries, k.fence, k.delay},
                                                      {req.owner, ttl, entry, mode, events, delay}, e);
        // The script names the queue keys and the lock-delay marker, which a node migrating
        // the slot may not have (TRYAGAIN). A contender of a lock that is held there is busy
        // all the same: the lock's PTTL alone (one key: served, or ASK) says so.
        if (r && r->type == REDIS_REPLY_ERROR && starts_with(redis::reply_str(r.get()), "TRYAGAIN")) {
          Error pe;
          if (asking) c.command({"ASKING"}, pe);
          if (!pe) {
            busy = c.command({"PTTL", k.lock}, pe);
            if (!pe && busy && busy->type == REDIS_REPLY_INTEGER && busy->integer > 0) {
              e.clear();  // the script's TRYAGAIN is answered
              return busy.get();
            }
          }
        }
        return r.get();
      },
      ec);
  Answer a;
  if (d == nullptr || ec) return a;
  if (d->type == REDIS_REPLY_INTEGER) {  // the PTTL above: held
    a.result.holder_ttl = Millis(d->integer);
    return a;
  }
  const redis::AcquireReply reply = redis::read_acquire_reply(d, ec);
  if (ec) return a;
  a = redis::answer_of(reply, req.ttl);
  if (a.result.acquired) note_delayed(req.name, req.owner, req.lock_delay.count() > 0);
  return a;
}

// A wait that keeps its place in the name's queue. A grant (a message on the name's
// channel naming this client's entry, or found by a refresh) is claimed with the same
// script, mode "2": the grant holds the lock only for the claim window, and the claim
// restarts its ttl after this call was sent, where the lease counts from.
AcquireResult ClusterBackend::acquire_queued(const AcquireRequest& req, Error& ec) {
  {
    LockGuard lk(client_mu_);
    if (client_id_.empty()) client_id_ = std::string(req.owner.substr(0, req.owner.find(':')));
  }
  // This name's entries left behind by an outage go first. Those of other names are left to
  // the refresher: their master may hang, and this call must not wait out its command timeout
  // for them (RedisClusterQueueHungMaster.AGiveUpOnAHungMasterDoesNotHoldUpAWaitOnAHealthyOne).
  waits_->flush_abandoned(req.name);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const redis::WaitQueue::Begun w = waits_->begin(req.name, req.owner, req.ttl);
    const Answer a = run_acquire(req, w.entry, w.queued ? "2" : "1", ec);
    if (ec) return {};
    if (a.gone) {
      waits_->forget(req.name, req.owner, w.entry);  // the next attempt queues a new entry
      continue;
    }
    if (a.result.acquired) {
      waits_->forget(req.name, req.owner, w.entry);
    } else {
      waits_->queued(req.name, req.owner, w.entry);
    }
    return a.result;
  }
  return {};
}

void ClusterBackend::cancel_acquire(std::string_view name, std::string_view owner) noexcept {
  try {
    const auto w = waits_->find(name, owner);
    if (!w) return;
    waits_->forget(name, owner, w->entry);
    if (!cancel_wait(*w)) waits_->abandon(*w);
  } catch (...) {  // out of memory: the entry expires within its entry life
  }
}

// Removes a wait's entry from its queue, or hands the lock on if it was granted to it.
// False when the slot's master could not be reached.
bool ClusterBackend::cancel_wait(const redis::WaitQueue::Wait& w) {
  Error ec;
  const NameKeys k = rediscluster::keys_of(prefix_, w.name);
  const std::string events = events_channel(prefix_, k.slot);
  Reply r;
  const redisReply* d = route(
      k.slot, "give up a wait",
      [&](Connection& c, bool, Error& e) {
        r = redis::cluster_queue_cancel_script().run(c, {k.lock, k.queue, k.expiries, k.fence, k.delay},
                                                     {w.owner, w.entry, k.channel, events}, e);
        return r.get();
      },
      ec);
  return d != nullptr && !ec && !redis::is_error(d);
}

// The wait queue's refresh: one script call per entry, routed to its slot's master (a
// call's keys must share a slot). An entry whose call failed is left as it was (failed):
// it is refreshed at the next pass, or expires on the server after its entry life.
std::vector<redis::WaitQueue::Answer> ClusterBackend::refresh_waits(
    const std::vector<redis::WaitQueue::Wait>& waits) {
  using A = redis::WaitQueue::Answer;
  std::vector<A> out(waits.size());
  // One script call per entry, in turn; a master that hangs costs each of its entries the
  // command timeout. So a master that failed a refresh is tried once per round (its other
  // entries wait for the next round, "failed": they are kept), and in the next round after
  // every other master: a hung master no longer holds up the refreshes of the others, whose
  // lapsed grants they take over within the claim window.
  std::vector<Node*> node_of(waits.size(), nullptr);
  std::vector<std::size_t> order(waits.size());
  for (std::size_t i = 0; i < waits.size(); ++i) {
    Error ignored;
    node_of[i] = node_for(rediscluster::keys_of(prefix_, waits[i].name).slot, ignored);
    order[i] = i;
  }
  std::set<const Node*> failed_before;
  {
    LockGuard lk(wait_refresh_mu_);
    failed_before = refresh_failed_;
  }
  std::stable_partition(order.begin(), order.end(),
                        [&](std::size_t i) { return !failed_before.contains(node_of[i]); });
  std::set<const Node*> failed_now;
  for (const std::size_t i : order) {
    if (node_of[i] != nullptr && failed_now.contains(node_of[i])) continue;
    const auto& w = waits[i];
    const NameKeys k = rediscluster::keys_of(prefix_, w.name);
    const std::string events = events_channel(prefix_, k.slot);
    const std::string ttl = std::to_string(w.ttl.count());
    Error ec;
    Reply r;
    const redisReply* d = route(
        k.slot, "refresh of a queued wait",
        [&](Connection& c, bool, Error& e) {
          r = redis::cluster_queue_refresh_script().run(c, {k.lock, k.queue, k.expiries, k.fence, k.delay},
                                                        {events, w.owner, w.entry, ttl}, e);
          return r.get();
        },
        ec);
    if (d == nullptr || ec) {
      if (node_of[i] != nullptr) failed_now.insert(node_of[i]);
      continue;
    }
    if (d->type != REDIS_REPLY_ARRAY || d->elements != 1) continue;
    const redisReply* e = d->element[0];
    if (e->type == REDIS_REPLY_INTEGER) {
      out[i].kind = e->integer == 0 ? A::queued : e->integer == 2 ? A::gone : A::failed;
    } else if (to_u64(e, out[i].token)) {
      out[i].kind = A::granted;
    }
  }
  {
    LockGuard lk(wait_refresh_mu_);
    refresh_failed_ = std::move(failed_now);
  }
  return out;
}

// A name's release channel carries "released" (a release left the lock free: every waiter
// re-checks) and grants "<entry> <token> <n> <lock key of n bytes><owner>" (one waiter:
// only the client of `owner` acts on it, and only for the entry it waits with).
void ClusterBackend::on_name_message(std::string_view channel, std::string_view payload) {
  if (payload != "released") {
    std::string_view rest = payload;
    std::size_t length = 0;
    bool parsed = false;
    for (int word = 0; word < 3; ++word) {
      const std::size_t sp = rest.find(' ');
      if (sp == std::string_view::npos) break;
      if (word == 2) {
        auto [p, e] = std::from_chars(rest.data(), rest.data() + sp, length);
        parsed = e == std::errc{} && p == rest.data() + sp && length <= rest.size() - sp - 1;
      }
      rest.remove_prefix(sp + 1);
    }
    if (parsed) {
      const std::string_view owner = rest.substr(length);
      const std::string_view client = owner.substr(0, owner.find(':'));
      bool mine = false;
      {
        LockGuard lk(client_mu_);
        mine = !client_id_.empty() && client == client_id_;
      }
      // Another client's grant wakes nobody here. A grant of this client's to an entry it
      // no longer waits with lapses after its claim window (then the next refresh hands the
      // lock on), unless it is a wait given up meanwhile (the queue retries its cancel now).
      if (mine) waits_->on_grant(payload);
      return;
    }
  }
  on_channel(channel);
}

}  // namespace distlock::detail::rediscluster
