// The queue recipe on etcd: one key per acquisition under the session lease; the
// lowest create_revision holds; a waiter watches only its predecessor.
#include "etcd/etcd_backend_impl.hpp"

namespace distlock::detail::etcd {

AcquireResult EtcdBackend::try_acquire(const AcquireRequest& req, Error& ec) {
  ec.clear();
  const std::int64_t ttl_s = ttl_seconds(req.ttl);
  if (ttl_s == 0) {
    // Refused before anything is sent: no lease, no key.
    ec = make_error_code(errc::invalid_argument);
    ec.set_detail("ttl " + std::to_string(req.ttl.count()) +
                  "ms is beyond etcd's maximum lease TTL of 9000000000s");
    return {};
  }
  const std::string ekey = entry_key(req.name, req.owner);

  for (int attempt = 0; attempt < 4; ++attempt) {
    // My queue entry: reuse it while its session lives, else start a new one.
    std::shared_ptr<Entry> entry;
    std::int64_t known_rev = 0;
    bool keep_watch = false;
    {
      std::lock_guard lk(mu_);
      auto it = entries_.find(ekey);
      // A held entry here means the engine declared that hold lost (its local
      // deadline passed): its key must not be reused, or the old token would be
      // handed out again. It is deleted and this owner queues anew.
      if (it != entries_.end() && it->second->session->alive && it->second->session->requested_s == ttl_s &&
          !it->second->held) {
        entry = it->second;
        known_rev = entry->create_rev;
        keep_watch = entry->watch_id != 0 && !entry->watch_fired;
      } else if (it != entries_.end()) {
        const auto old = it->second;
        entries_.erase(it);
        if (old->session->alive && old->create_rev != 0) orphans_.emplace_back(old->key, old->create_rev);
        if (old->watch_id != 0) cancel_watch(old->watch_id);
      }
    }
    if (!entry) {
      auto session = live_session(ttl_s, ec);
      if (!session) return {};
      entry = std::make_shared<Entry>();
      entry->name = std::string(req.name);
      entry->owner = std::string(req.owner);
      entry->lock_prefix = lock_prefix(req.name);
      entry->session = session;
      std::vector<std::pair<std::string, std::int64_t>> stale;
      {
        std::lock_guard lk(mu_);
        // A key of its own per acquisition attempt, never used before by this
        // client (and the lease names the client): an existing key is never
        // adopted, so a token is never handed out twice.
        entry->key =
            entry->lock_prefix + hex(session->lease) + "-" + hex(static_cast<std::int64_t>(next_key_seq_++));
        // Our keys of this lock whose delete failed would queue ahead of the new
        // key: try them now rather than wait for the keeper.
        for (auto o = orphans_.begin(); o != orphans_.end();) {
          if (o->first.starts_with(entry->lock_prefix)) {
            stale.push_back(std::move(*o));
            o = orphans_.erase(o);
          } else {
            ++o;
          }
        }
      }
      for (auto& [key, rev] : stale) {
        Error dec;
        delete_key(key, rev, dec);
        if (dec) {
          std::lock_guard lk(mu_);
          orphans_.emplace_back(key, rev);
        }
      }
      std::lock_guard lk(mu_);
      entries_[ekey] = entry;
    }
    const auto& session = entry->session;

    // The validity we report must not outlast the lease: it counts from the last
    // keepalive, so refresh a session that is half-way through its TTL first.
    Millis remaining{};
    {
      std::unique_lock lk(mu_);
      remaining = std::chrono::duration_cast<Millis>(session->last_sent + session->ttl - clock_->now());
    }
    if (remaining < session->ttl / 2) {
      if (auto kec = keepalive({session}); kec) {
        ec = kec;
        return {};
      }
      std::lock_guard lk(mu_);
      if (!session->alive) continue;
      remaining = std::chrono::duration_cast<Millis>(session->last_sent + session->ttl - clock_->now());
    }

    // One Txn: create my key if it is not there, and read the lowest key.
    etcdserverpb::TxnRequest txn;
    Compare* cmp = txn.add_compare();
    cmp->set_result(Compare::EQUAL);
    cmp->set_target(Compare::CREATE);
    cmp->set_key(entry->key);
    cmp->set_create_revision(0);
    auto lowest = [&](etcdserverpb::RequestOp* op) {
      RangeRequest* r = op->mutable_request_range();
      r->set_key(entry->lock_prefix);
      r->set_range_end(prefix_end(entry->lock_prefix));
      r->set_limit(1);
      r->set_sort_target(RangeRequest::CREATE);
      r->set_sort_order(RangeRequest::ASCEND);
    };
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(entry->key);
    put->set_value(entry->owner);
    put->set_lease(session->lease);
    lowest(txn.add_success());
    txn.add_failure()->mutable_request_range()->set_key(entry->key);
    lowest(txn.add_failure());

    etcdserverpb::TxnResponse resp;
    const grpc::Status st = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
    if (etcd::Transport::lease_not_found(st)) {
      // The lease ended before our keeper noticed (expired or revoked from outside).
      lose_session(session, "etcd refused a put: lease not found");
      continue;
    }
    if (!st.ok() || resp.responses_size() != 2) {
      if (!st.ok()) {
        set_error(st, ec, "acquire Txn");
      } else {
        ec = make_error_code(errc::protocol_error);
      }
      if (known_rev == 0) {
        // The Txn may have created our key (applied, its answer lost or late): a
        // key that would queue ahead of everybody for as long as this client keeps
        // the session alive. This acquisition is over: the key goes.
        forget_entry(entry);
        std::lock_guard lk(mu_);
        orphans_.emplace_back(entry->key, 0);  // the keeper deletes it within a second
      }
      return {};
    }
    std::int64_t my_rev = 0;
    if (resp.succeeded()) {
      my_rev = resp.header().revision();
      if (known_rev != 0) {
        // Our queued key vanished while its lease lived (deleted from outside):
        // we are back at the end of the queue.
        log_.log(LogLevel::warning, "etcd: queued key of lock \"{}\" was deleted from outside; queued again",
                 entry->name);
      }
    } else {
      // The key exists: only this entry can have created it (an earlier call of
      // the same acquisition, or a retried Txn that was applied), under our lease.
      const auto& mine = resp.responses(0).response_range();
      if (mine.kvs_size() != 1 || mine.kvs(0).lease() != session->lease) {
        ec = make_error_code(errc::protocol_error);
        log_.log(LogLevel::warning, "etcd: queue key of lock \"{}\" exists but is not ours", entry->name);
        return {};
      }
      my_rev = mine.kvs(0).create_revision();
    }
    const auto& low = resp.responses(1).response_range();
    if (low.kvs_size() != 1) {
      ec = make_error_code(errc::protocol_error);
      return {};
    }
    const std::int64_t low_rev = low.kvs(0).create_revision();
    std::int64_t old_watch = 0;
    {
      std::lock_guard lk(mu_);
      if (entry->create_rev != my_rev) keep_watch = false;
      entry->create_rev = my_rev;
      if (low_rev == my_rev) {
        entry->held = true;
        entry->renewed_at = clock_->now();
        old_watch = std::exchange(entry->watch_id, 0);
      }
    }
    if (low_rev == my_rev) {
      if (old_watch != 0) cancel_watch(old_watch);
      return AcquireResult{true, static_cast<std::uint64_t>(my_rev), std::max(remaining, Millis(1)),
                           std::nullopt};
    }

    AcquireResult busy;
    busy.holder_ttl = session->ttl;  // the holder's lease is at most a TTL away
    if (!req.keep_queued) {
      Error dec;
      delete_key(entry->key, my_rev, dec);
      forget_entry(entry);
      if (dec) {
        std::lock_guard lk(mu_);
        orphans_.emplace_back(entry->key, my_rev);
      }
      return busy;
    }
    // Still waiting on the same predecessor whose delete event has not come: no
    // need to look for it again.
    if (keep_watch) return busy;

    // Watch only the key just before mine, from the revision of this read.
    RangeRequest pred;
    pred.set_key(entry->lock_prefix);
    pred.set_range_end(prefix_end(entry->lock_prefix));
    pred.set_max_create_revision(my_rev - 1);
    pred.set_sort_target(RangeRequest::CREATE);
    pred.set_sort_order(RangeRequest::DESCEND);
    pred.set_limit(1);
    pred.set_keys_only(true);
    etcdserverpb::RangeResponse presp;
    const grpc::Status pst = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Range(&ctx, pred, &presp); });
    if (!pst.ok()) {
      set_error(pst, ec, "predecessor Range");
      return {};
    }
    if (presp.kvs_size() == 0) continue;  // it went away meanwhile: look again
    add_watch(entry, presp.kvs(0).key(), presp.header().revision() + 1);
    return busy;
  }
  return AcquireResult{};  // busy; the engine re-checks
}

bool EtcdBackend::delete_key(const std::string& key, std::int64_t create_rev, Error& ec) {
  etcdserverpb::TxnRequest txn;
  // create_rev 0: the key's revision is unknown (its creating Txn had no answer).
  // The key is ours alone (session lease + a sequence never reused), so it is
  // deleted as it is.
  if (create_rev != 0) {
    Compare* cmp = txn.add_compare();
    cmp->set_result(Compare::EQUAL);
    cmp->set_target(Compare::CREATE);
    cmp->set_key(key);
    cmp->set_create_revision(create_rev);
  }
  txn.add_success()->mutable_request_delete_range()->set_key(key);
  etcdserverpb::TxnResponse resp;
  etcd::CallInfo info;
  const grpc::Status st = transport_.call(
      [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); }, &info);
  if (!st.ok()) {
    set_error(st, ec, "guarded delete Txn");
    return false;
  }
  // A retry after an attempt that may have been applied finds the key gone: that
  // was our own delete.
  return resp.succeeded() || info.maybe_applied;
}

void EtcdBackend::forget_entry(const std::shared_ptr<Entry>& entry) {
  std::int64_t watch_id = 0;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(entry_key(entry->name, entry->owner));
    if (it != entries_.end() && it->second == entry) entries_.erase(it);
    watch_id = std::exchange(entry->watch_id, 0);
  }
  if (watch_id != 0) cancel_watch(watch_id);
}

void EtcdBackend::cancel_acquire(std::string_view name, std::string_view owner) noexcept {
  try {
    std::shared_ptr<Entry> entry;
    std::int64_t rev = 0;
    {
      std::lock_guard lk(mu_);
      auto it = entries_.find(entry_key(name, owner));
      if (it == entries_.end() || it->second->held) return;
      entry = it->second;
      rev = entry->create_rev;
    }
    forget_entry(entry);
    if (rev == 0) return;
    Error ec;
    delete_key(entry->key, rev, ec);
    if (ec) {
      std::lock_guard lk(mu_);
      orphans_.emplace_back(entry->key, rev);
    }
  } catch (...) {
  }
}

ReleaseStatus EtcdBackend::release(std::string_view name, std::string_view owner, std::uint64_t token,
                                   Error& ec) {
  ec.clear();
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(entry_key(name, owner));
    // A token that is not the entry's belongs to an earlier hold of the same owner
    // id: the entry (a later hold) is not touched.
    if (it == entries_.end() || !it->second->held || !it->second->session->alive ||
        it->second->create_rev != static_cast<std::int64_t>(token))
      return ReleaseStatus::not_owner;
    entry = it->second;
  }
  const bool deleted = delete_key(entry->key, static_cast<std::int64_t>(token), ec);
  if (ec) {
    // The key stays until its session ends, and the session lives as long as this
    // client: the keeper retries the delete.
    std::lock_guard lk(mu_);
    orphans_.emplace_back(entry->key, static_cast<std::int64_t>(token));
  }
  forget_entry(entry);
  if (ec) return ReleaseStatus::released;
  return deleted ? ReleaseStatus::released : ReleaseStatus::not_owner;
}

void EtcdBackend::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) {
  ec.clear();
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::shared_ptr<Session>> item_session(items.size());
  {
    std::lock_guard lk(mu_);
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto it = entries_.find(entry_key(items[i].name, items[i].owner));
      if (it == entries_.end() || !it->second->held || !it->second->session->alive) {
        out[i] = RenewStatus::not_owner;
        continue;
      }
      item_session[i] = it->second->session;
      if (std::find(sessions.begin(), sessions.end(), item_session[i]) == sessions.end()) {
        sessions.push_back(item_session[i]);
      }
    }
  }
  if (sessions.empty()) return;
  const auto sent = clock_->now();
  if ((ec = keepalive(sessions))) return;

  // The lease alone does not prove the hold: the key may have been deleted from
  // outside (etcdctl del) while the lease lives. Read every held key, up to
  // kMaxTxnOps per Txn (one round trip for a usual batch), and compare its
  // create_revision with the token: a missing or re-created key is a loss.
  std::vector<std::size_t> check;
  std::vector<std::shared_ptr<Entry>> entry_of(items.size());
  {
    std::lock_guard lk(mu_);
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!item_session[i]) continue;
      auto it = entries_.find(entry_key(items[i].name, items[i].owner));
      // A token that is not the entry's is an earlier hold of the same owner id:
      // not ours any more, and the entry (a later hold) is left alone.
      if (!item_session[i]->alive || it == entries_.end() || !it->second->held ||
          it->second->create_rev != static_cast<std::int64_t>(items[i].token)) {
        out[i] = RenewStatus::not_owner;
        item_session[i].reset();
        continue;
      }
      entry_of[i] = it->second;
      check.push_back(i);
    }
  }
  std::vector<std::size_t> gone;
  for (std::size_t from = 0; from < check.size(); from += kMaxTxnOps) {
    const std::size_t to = std::min(check.size(), from + kMaxTxnOps);
    etcdserverpb::TxnRequest txn;
    for (std::size_t j = from; j < to; ++j) {
      RangeRequest* r = txn.add_success()->mutable_request_range();
      r->set_key(entry_of[check[j]]->key);
      r->set_keys_only(true);
    }
    etcdserverpb::TxnResponse resp;
    const grpc::Status st = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
    if (!st.ok()) {
      set_error(st, ec, "renewal key check Txn");
      return;
    }
    if (resp.responses_size() != static_cast<int>(to - from)) {
      ec = make_error_code(errc::protocol_error);
      return;
    }
    for (std::size_t j = from; j < to; ++j) {
      const std::size_t i = check[j];
      const auto& r = resp.responses(static_cast<int>(j - from)).response_range();
      const bool ours = r.kvs_size() == 1 &&
                        r.kvs(0).create_revision() == static_cast<std::int64_t>(items[i].token) &&
                        r.kvs(0).lease() == entry_of[i]->session->lease;
      if (!ours) gone.push_back(i);
    }
  }
  std::lock_guard lk(mu_);
  for (const std::size_t i : gone) {
    out[i] = RenewStatus::not_owner;
    item_session[i].reset();
    // Nothing to delete: the key that backed this hold is gone (a key found there
    // now belongs to someone else).
    auto it = entries_.find(entry_key(items[i].name, items[i].owner));
    if (it != entries_.end() && it->second == entry_of[i]) entries_.erase(it);
    log_.log(LogLevel::warning, "etcd: the key of held lock \"{}\" was deleted from outside: lost",
             items[i].name);
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!item_session[i]) continue;
    out[i] = item_session[i]->alive ? RenewStatus::renewed : RenewStatus::not_owner;
    if (out[i] != RenewStatus::renewed) continue;
    entry_of[i]->renewed_at = sent;
  }
}

}  // namespace distlock::detail::etcd
