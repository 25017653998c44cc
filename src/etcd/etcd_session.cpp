// etcd session leases: one per lock TTL, kept alive by the keeper; their loss.
#include <set>

#include "etcd/etcd_backend_impl.hpp"

namespace distlock::detail::etcd {

std::shared_ptr<Session> EtcdBackend::live_session(std::int64_t ttl_s, Error& ec) {
  std::lock_guard grant(grant_mu_);
  {
    LockGuard lk(recipe_.mutex());
    auto it = sessions_.find(ttl_s);
    if (it != sessions_.end() && it->second->alive) return it->second;
  }
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  const auto sent = clock_->now();
  const grpc::Status st = transport_.call(
      [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.lease->LeaseGrant(&ctx, req, &resp); });
  if (!st.ok()) {
    set_error(st, ec, "LeaseGrant");
    return nullptr;
  }
  if (!resp.error().empty() || resp.ttl() <= 0) {
    ec = make_error_code(errc::protocol_error);
    log_.log(LogLevel::warning, "etcd LeaseGrant({}) answered TTL {} error \"{}\"", ttl_s, resp.ttl(),
             resp.error());
    return nullptr;
  }
  auto s = std::make_shared<Session>();
  s->lease = resp.id();
  s->requested_s = ttl_s;
  s->ttl = std::chrono::seconds(resp.ttl());
  s->last_sent = sent;
  s->next_keepalive = sent + s->ttl / 3;
  log_.log(LogLevel::debug, "etcd session lease {:x} granted with TTL {}s", s->lease, resp.ttl());
  {
    LockGuard lk(recipe_.mutex());
    sessions_[ttl_s] = s;
    ++keeper_generation_;
  }
  keeper_cv_.notify_all();
  return s;
}

// One LeaseKeepAlive stream, one request per session: one round trip for all.
Error EtcdBackend::keepalive(const std::vector<std::shared_ptr<Session>>& sessions) {
  if (sessions.empty()) return {};
  std::map<std::int64_t, std::int64_t> ttl_by_lease;
  const auto sent = clock_->now();
  const grpc::Status st = transport_.call([&](etcd::Stubs& s, grpc::ClientContext& ctx) {
    ttl_by_lease.clear();
    auto stream = s.lease->LeaseKeepAlive(&ctx);
    for (const auto& session : sessions) {
      etcdserverpb::LeaseKeepAliveRequest req;
      req.set_id(session->lease);
      if (!stream->Write(req)) break;
    }
    etcdserverpb::LeaseKeepAliveResponse resp;
    while (ttl_by_lease.size() < sessions.size() && stream->Read(&resp)) ttl_by_lease[resp.id()] = resp.ttl();
    stream->WritesDone();
    grpc::Status fin = stream->Finish();
    if (fin.ok() && ttl_by_lease.size() < sessions.size()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "keepalive stream ended early");
    }
    return fin;
  });
  if (!st.ok() && ttl_by_lease.size() < sessions.size()) {
    Error ec;
    set_error(st, ec, "LeaseKeepAlive");
    std::vector<std::shared_ptr<Session>> expired;
    {
      LockGuard lk(recipe_.mutex());
      for (const auto& session : sessions) {
        session->next_keepalive = clock_->now() + std::min<Millis>(session->ttl / 6, Millis(500));
        if (clock_->now() >= session->last_sent + session->ttl) expired.push_back(session);
      }
    }
    for (auto& s : expired) lose_session(s, "keepalives failed for a whole TTL");
    return ec;
  }
  std::vector<std::shared_ptr<Session>> gone;
  {
    LockGuard lk(recipe_.mutex());
    for (const auto& session : sessions) {
      const auto it = ttl_by_lease.find(session->lease);
      if (it == ttl_by_lease.end() || it->second <= 0) {
        gone.push_back(session);
        continue;
      }
      session->last_sent = std::max(session->last_sent, sent);
      session->next_keepalive = session->last_sent + session->ttl / 3;
    }
  }
  for (auto& s : gone) lose_session(s, "etcd says the session lease is gone (expired or revoked)");
  return {};
}

void EtcdBackend::lose_session(const std::shared_ptr<Session>& session, const char* why) noexcept {
  std::vector<QueueEntryPtr> gone;
  {
    LockGuard lk(recipe_.mutex());
    if (!session->alive) return;
    session->alive = false;
    auto it = sessions_.find(session->requested_s);
    if (it != sessions_.end() && it->second == session) sessions_.erase(it);
    auto of_session = [&](const QueueEntry& e) { return static_cast<const Entry&>(e).session == session; };
    gone = recipe_.take_locked(of_session);
    recipe_.drop_orphans_locked(of_session);  // the lease took their keys with it
  }
  const auto held = std::count_if(gone.begin(), gone.end(), [](const QueueEntryPtr& e) { return e->held; });
  log_.log(LogLevel::warning, "etcd session lease {:x} lost ({}): {} held lock(s) lost", session->lease, why,
           held);
  recipe_.end_session(gone);
}

// ---- keeper ----------------------------------------------------------------

// Keeps sessions alive while nothing is held (waiters' keys hang on them too) and
// retries deletes that failed.
void EtcdBackend::keeper_main(std::stop_token st) {
  while (!st.stop_requested()) {
    std::vector<std::shared_ptr<Session>> due;
    std::vector<QueueEntryPtr> stale, orphans;
    {
      UniqueLock lk(recipe_.mutex());
      auto wake = clock_->now() + std::chrono::seconds(1);
      for (auto& [ttl, s] : sessions_) {
        if (s->alive) wake = std::min(wake, s->next_keepalive);
      }
      const std::uint64_t seen = keeper_generation_;
      // The destructor requests the stop, then notifies under mu_: checked here under
      // mu_ before each wait, so the wake-up is not missed.
      while (!st.stop_requested() && keeper_generation_ == seen && clock_->now() < wake) {
        clock_->wait_until(keeper_cv_, lk.native(), wake);
      }
      if (st.stop_requested()) return;
      const auto now = clock_->now();
      for (auto& [ttl, s] : sessions_) {
        if (s->alive && s->next_keepalive <= now) due.push_back(s);
      }
      // A hold the engine stopped renewing for a whole session TTL was declared lost
      // by the engine (its local deadline is shorter): its key would block the lock
      // for as long as this client keeps the session alive.
      stale = recipe_.take_locked([&](const QueueEntry& e) {
        const auto& session = static_cast<const Entry&>(e).session;
        return e.held && session->alive && now - e.confirmed > session->ttl;
      });
      orphans = recipe_.take_orphans_locked();
    }
    keepalive(due);
    recipe_.drop_stale(stale);
    // Deletes whose outcome was unknown; those still unknown wait for the next round.
    if (!orphans.empty()) recipe_.retry_orphans(std::move(orphans));
  }
}

}  // namespace distlock::detail::etcd
