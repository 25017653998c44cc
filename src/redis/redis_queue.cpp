// The redis:// backend's acquire: a plain try, and a wait that keeps its place in the
// name's server-side queue (grants handed off on the client's channel, refresh, give-up).
#include "redis/redis_backend_impl.hpp"

namespace distlock::detail::redis {

AcquireResult RedisBackend::try_acquire(const AcquireRequest& req, Error& ec) {
  ec.clear();
  if (req.keep_queued) return acquire_queued(req, ec);
  auto conn = lock_link(ec);
  if (ec) return {};
  const Keys& k = keys_for_call(req.name);
  const std::string ttl = std::to_string(req.ttl.count());
  const std::string delay = std::to_string(req.lock_delay.count());
  Reply r = redis::queue_acquire_script().run(*conn, {k.lock, k.queue, k.expiries, k.fence},
                                              {req.owner, ttl, "0", "0", grant_prefix_, delay}, ec);
  return acquire_answer(*conn, req, r, ec).result;
}

// A wait that keeps its place in the name's queue. A grant that arrived on this
// client's channel (or that a refresh found) is claimed from the server: the grant
// holds the lock only for the claim window (lock_scripts.hpp), and the claim
// restarts its ttl after this call was sent, which is where the lease counts from.
AcquireResult RedisBackend::acquire_queued(const AcquireRequest& req, Error& ec) {
  subscribe_grants(req.owner);
  waits_.flush_abandoned();  // entries left behind by an outage go first
  const std::string ttl = std::to_string(req.ttl.count());
  const std::string delay = std::to_string(req.lock_delay.count());
  for (int attempt = 0; attempt < 2; ++attempt) {
    const redis::WaitQueue::Begun w = waits_.begin(req.name, req.owner, req.ttl);
    auto conn = lock_link(ec);
    if (ec) return {};
    const Keys& k = keys_for_call(req.name);
    Reply r = redis::queue_acquire_script().run(
        *conn, {k.lock, k.queue, k.expiries, k.fence},
        {req.owner, ttl, w.entry, w.queued ? "2" : "1", grant_prefix_, delay}, ec);
    const Answer a = acquire_answer(*conn, req, r, ec);
    if (ec) return {};
    if (a.gone) {
      waits_.forget(req.name, req.owner, w.entry);  // the next attempt queues a new entry
      continue;
    }
    if (a.result.acquired) {
      hold_entry(req.name, req.owner, w.entry);
      waits_.forget(req.name, req.owner, w.entry);
    } else {
      waits_.queued(req.name, req.owner, w.entry);
    }
    return a.result;
  }
  return {};
}

void RedisBackend::cancel_acquire(std::string_view name, std::string_view owner) noexcept {
  try {
    const auto w = waits_.find(name, owner);
    if (!w) return;
    waits_.forget(name, owner, w->entry);
    if (!cancel_wait(*w)) waits_.abandon(*w);
  } catch (...) {  // out of memory: the entry expires after its ttl
  }
}

// The acquire script's reply (redis::read_acquire_reply), with the replica wait of `wait=N`.
RedisBackend::Answer RedisBackend::acquire_answer(redis::Link& conn, const AcquireRequest& req,
                                                  const Reply& r, Error& ec) {
  Answer a;
  if (ec) {
    failed("acquire", ec);
    return a;
  }
  const redis::AcquireReply reply = redis::read_acquire_reply(r.get(), ec);
  if (ec) {
    log_.log(LogLevel::warning, "{}: {}", conn_opts_.describe(), ec.detail());
    ec.set_detail(conn_opts_.describe() + ": " + ec.detail());
    return a;
  }
  ok();
  a = redis::answer_of(reply, req.ttl);
  if (a.result.acquired && wait_replicas_ > 0 && !replicated_acquire(conn, req, ec)) a.result = {};
  return a;
}

// The grant channel of this client, subscribed once before its first queued wait
// (so no grant to it can be missed). A failure leaves waits degraded, not
// broken: the engine's re-checks find a grant (the script answers "acquired").
void RedisBackend::subscribe_grants(std::string_view owner) {
  LockGuard lk(grants_mu_);
  if (grants_subscribed_) return;
  const std::string channel = grant_prefix_ + std::string(owner.substr(0, owner.find(':')));
  subscriber_.set_payload_handler(
      channel, [this](std::string_view, std::string_view payload) { on_grant_message(payload); });
  Error ec;
  subscriber_.watch(channel, ec);
  if (ec) {
    log_.log(LogLevel::warning, "cannot listen for hand-offs ({}); waits find them by re-checks",
             ec.detail());
    return;
  }
  grant_channel_ = channel;
  grants_subscribed_ = true;
}

// The wait queue's batched refresh: KEYS 4 and ARGV 3 per entry (after the grant
// prefix), kRenewChunk / 4 entries per call, all calls in one pipeline.
std::vector<redis::WaitQueue::Answer> RedisBackend::refresh_waits(
    const std::vector<redis::WaitQueue::Wait>& waits) {
  using A = redis::WaitQueue::Answer;
  std::vector<A> out(waits.size());
  Error ec;
  auto conn = lock_link(ec);
  if (ec) return out;
  std::vector<std::string> keys, ttls;
  keys.reserve(4 * waits.size());
  ttls.reserve(waits.size());
  for (const auto& w : waits) {
    const Keys k = keys_of(w.name);
    keys.emplace_back(k.lock);
    keys.emplace_back(k.queue);
    keys.emplace_back(k.expiries);
    keys.emplace_back(k.fence);
    ttls.push_back(std::to_string(w.ttl.count()));
  }
  std::vector<std::string_view> key_views(keys.begin(), keys.end());
  constexpr std::size_t kChunk = kRenewChunk / 4;
  // Per call: the grant prefix, then owner, entry, ttl of each of its entries.
  std::vector<std::vector<std::string_view>> arg_views;
  std::vector<redis::Script::Call> calls;
  for (std::size_t at = 0; at < waits.size(); at += kChunk) {
    const std::size_t n = std::min(kChunk, waits.size() - at);
    std::vector<std::string_view> args;
    args.reserve(1 + 3 * n);
    args.push_back(grant_prefix_);
    for (std::size_t i = at; i < at + n; ++i) {
      args.push_back(waits[i].owner);
      args.push_back(waits[i].entry);
      args.push_back(ttls[i]);
    }
    arg_views.push_back(std::move(args));
  }
  for (std::size_t c = 0, at = 0; c < arg_views.size(); ++c, at += kChunk) {
    const std::size_t n = std::min(kChunk, waits.size() - at);
    calls.push_back({std::span(key_views).subspan(4 * at, 4 * n), std::span(arg_views[c])});
  }
  std::vector<Reply> replies = redis::queue_refresh_script().run_pipelined(*conn, calls, ec);
  if (ec) {
    failed("refresh of queued waits", ec);
    return out;
  }
  for (std::size_t c = 0; c < calls.size(); ++c) {
    const redisReply* r = replies[c].get();
    const std::size_t at = c * kChunk;
    if (r == nullptr || r->type != REDIS_REPLY_ARRAY || 4 * r->elements != calls[c].keys.size()) continue;
    for (std::size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      if (e->type == REDIS_REPLY_INTEGER) {
        out[at + i].kind = e->integer == 0 ? A::queued : e->integer == 2 ? A::gone : A::failed;
      } else if (to_u64(e, out[at + i].token)) {
        out[at + i].kind = A::granted;
      }
    }
  }
  return out;
}

// Removes a wait's entry from the server's queue, or hands the lock on if it was
// granted to it. False when the server could not be reached.
bool RedisBackend::cancel_wait(const redis::WaitQueue::Wait& w) {
  Error ec;
  auto conn = lock_link(ec);
  if (ec) return false;
  const Keys k = keys_of(w.name);
  Reply r = redis::queue_cancel_script().run(*conn, {k.lock, k.queue, k.expiries, k.fence},
                                             {w.owner, w.entry, k.released, grant_prefix_}, ec);
  if (ec) {
    failed("give up a wait", ec);
    return false;
  }
  return !redis::is_error(r.get());
}

// A grant to an entry this client neither waits with nor holds under: a wait given
// up while the server was out of reach, or queued through a backend that a
// Sentinel failover replaced (the new master still had the entry). Nobody here
// will take it, so it is handed on at once rather than left to its ttl. The
// cancel script acts only while the lock is held under exactly that entry (ids
// are unique in the process), and an entry this client took is in held_entries_
// from before it leaves the wait queue until its release.
void RedisBackend::on_grant_message(std::string_view payload) {
  auto unknown = waits_.on_grant(payload);
  if (!unknown) return;
  const std::string head = prefix_ + ":{";
  const std::string& lock = unknown->lock;
  if (lock.size() < head.size() + 1 || lock.compare(0, head.size(), head) != 0 || lock.back() != '}') return;
  {
    LockGuard lk(held_mu_);
    for (const auto& [key, entry] : held_entries_) {
      if (entry == unknown->entry) return;
    }
  }
  redis::WaitQueue::Wait w;
  w.name = lock.substr(head.size(), lock.size() - head.size() - 1);
  w.owner = std::move(unknown->owner);
  w.entry = std::move(unknown->entry);
  w.ttl = Millis(3000);  // the retry period's basis (1 s); the grant's own ttl is not known here
  waits_.hand_on(std::move(w), Millis(60000));
}

// An acquisition fewer than wait_replicas_ replicas acknowledged is not reported:
// it is released again (on this connection if it still works, else on another)
// and the call fails with quorum_unavailable (backend_unavailable when WAIT itself
// failed), so a failover right after it cannot leave a holder whose lock the new
// master never saw.
bool RedisBackend::replicated_acquire(redis::Link& conn, const AcquireRequest& req, Error& ec) {
  long long acked = -1;
  if (replicated(conn, "acquisition", &acked)) return true;
  const Keys k = keys_of(req.name);
  auto release_on = [&](redis::Link& c, Error& e) {
    redis::queue_release_script().run(c, {k.lock, k.queue, k.expiries, k.fence},
                                      {req.owner, k.released, grant_prefix_}, e);
  };
  Error rec;
  if (conn.connected()) {
    release_on(conn, rec);
  } else {
    auto other = pool_.checkout(rec);
    if (!rec) release_on(*other, rec);
  }
  const std::string released =
      rec ? "could not be released (" + std::string(rec.message()) + "); it expires after its TTL"
          : "was released again";
  if (acked < 0) {
    ec = make_error_code(errc::backend_unavailable);
    ec.set_detail(conn_opts_.describe() + ": WAIT after acquiring \"" + std::string(req.name) +
                  "\" failed; the lock " + released);
  } else {
    ec = make_error_code(errc::quorum_unavailable);
    ec.set_detail(conn_opts_.describe() + ": only " + std::to_string(acked) + " of " +
                  std::to_string(wait_replicas_) + " replicas acknowledged acquiring \"" +
                  std::string(req.name) + "\" within " + std::to_string(wait_timeout_.count()) +
                  " ms (wait=" + std::to_string(wait_replicas_) + "); the lock " + released);
  }
  return false;
}

}  // namespace distlock::detail::redis
