// The queue store on etcd (the recipe is engine/queue_recipe.cpp): one key per
// acquisition under the session lease; the lowest create_revision holds; a waiter
// watches only its predecessor.
#include "etcd/etcd_backend_impl.hpp"

namespace distlock::detail::etcd {

bool EtcdBackend::admit(const AcquireRequest& req, Clock::time_point /*started*/, Error& ec) {
  if (ttl_seconds(req.ttl) != 0) return true;
  // Refused before anything is sent: no lease, no key.
  ec = make_error_code(errc::invalid_argument);
  ec.set_detail("ttl " + std::to_string(req.ttl.count()) +
                "ms is beyond etcd's maximum lease TTL of 9000000000s");
  return false;
}

QueueEntryPtr EtcdBackend::new_entry(const AcquireRequest& req, Error& ec) {
  auto session = live_session(ttl_seconds(req.ttl), ec);
  if (!session) return nullptr;
  auto entry = std::make_shared<Entry>(req.name, req.owner);
  entry->lock_prefix = lock_prefix(req.name);
  entry->session = session;
  entry->made = clock_->now();
  LockGuard lk(recipe_.mutex());
  // A key of its own per acquisition attempt, never used before by this client (and
  // the lease names the client): an existing key is never adopted, so a token is
  // never handed out twice.
  entry->key =
      entry->lock_prefix + hex(session->lease) + "-" + hex(static_cast<std::int64_t>(next_key_seq_++));
  return entry;
}

bool EtcdBackend::live(const QueueEntry& e) const {
  return entry_of<Entry>(e).session->alive;
}

bool EtcdBackend::reusable(const QueueEntry& e, const AcquireRequest& req) const {
  const Entry& entry = entry_of<Entry>(e);
  return entry.session->alive && entry.session->requested_s == ttl_seconds(req.ttl);
}

QueuePosition EtcdBackend::enqueue(QueueEntry& e, const AcquireRequest& req, Clock::time_point /*started*/,
                                   Error& ec) {
  Entry& entry = entry_of<Entry>(e);
  const auto& session = entry.session;
  QueuePosition pos;
  pos.holder_ttl = session->ttl;  // the holder's lease is at most a TTL away
  std::int64_t known_rev = 0;

  // The validity we report must not outlast the lease: it counts from the last
  // keepalive, so refresh a session that is half-way through its TTL first.
  Millis remaining{};
  {
    LockGuard lk(recipe_.mutex());
    // A session lost meanwhile: its lease may still live on the server for a while,
    // and a key put on it now would be nobody's. The recipe makes a new entry.
    if (!session->alive) return {QueuePosition::Kind::again};
    known_rev = static_cast<std::int64_t>(entry.token);
    remaining = std::chrono::duration_cast<Millis>(session->last_sent + session->ttl - clock_->now());
  }
  if (remaining < session->ttl / 2) {
    if (auto kec = keepalive({session}); kec) {
      ec = kec;
      return pos;  // failed
    }
    LockGuard lk(recipe_.mutex());
    if (!session->alive) return {QueuePosition::Kind::again};
    remaining = std::chrono::duration_cast<Millis>(session->last_sent + session->ttl - clock_->now());
  }

  // One Txn: create my key if it is not there, and read the lowest key.
  etcdserverpb::TxnRequest txn;
  Compare* cmp = txn.add_compare();
  cmp->set_result(Compare::EQUAL);
  cmp->set_target(Compare::CREATE);
  cmp->set_key(entry.key);
  cmp->set_create_revision(0);
  auto lowest = [&](etcdserverpb::RequestOp* op) {
    RangeRequest* r = op->mutable_request_range();
    r->set_key(entry.lock_prefix);
    r->set_range_end(prefix_end(entry.lock_prefix));
    r->set_limit(1);
    r->set_sort_target(RangeRequest::CREATE);
    r->set_sort_order(RangeRequest::ASCEND);
  };
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(entry.key);
  put->set_value(entry.owner);
  put->set_lease(session->lease);
  lowest(txn.add_success());
  txn.add_failure()->mutable_request_range()->set_key(entry.key);
  lowest(txn.add_failure());
  // The lock-delay marker, read at the same revision (etcd_delay.cpp).
  const std::string marker_key = delay_key(entry.name);
  txn.add_success()->mutable_request_range()->set_key(marker_key);
  txn.add_failure()->mutable_request_range()->set_key(marker_key);

  const Clock::time_point sent = clock_->now();
  etcdserverpb::TxnResponse resp;
  const grpc::Status st =
      transport_.call([&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
  if (etcd::Transport::lease_not_found(st)) {
    // The lease ended before our keeper noticed (expired or revoked from outside).
    lose_session(session, "etcd refused a put: lease not found");
    return {QueuePosition::Kind::again};
  }
  if (!st.ok() || resp.responses_size() != 3) {
    // The Txn may have created our key (applied, its answer lost or late): the recipe
    // gives the key up (an orphan the keeper deletes within a second).
    if (!st.ok()) {
      set_error(st, ec, "acquire Txn");
    } else {
      ec = make_error_code(errc::protocol_error);
    }
    return pos;
  }
  std::int64_t my_rev = 0;
  if (resp.succeeded()) {
    my_rev = resp.header().revision();
    if (known_rev != 0) {
      // Our queued key vanished while its lease lived (deleted from outside): we are
      // back at the end of the queue.
      log_.log(LogLevel::warning, "etcd: queued key of lock \"{}\" was deleted from outside; queued again",
               entry.name);
    }
  } else {
    // The key exists: only this entry can have created it (an earlier call of the same
    // acquisition, or a retried Txn that was applied), under our lease.
    const auto& mine = resp.responses(0).response_range();
    if (mine.kvs_size() != 1 || mine.kvs(0).lease() != session->lease) {
      ec = make_error_code(errc::protocol_error);
      ec.set_detail("queue key of lock \"" + entry.name + "\" exists but is not ours");
      log_.log(LogLevel::warning, "etcd: queue key of lock \"{}\" exists but is not ours", entry.name);
      return pos;
    }
    my_rev = mine.kvs(0).create_revision();
  }
  const auto& low = resp.responses(1).response_range();
  if (low.kvs_size() != 1) {
    ec = make_error_code(errc::protocol_error);
    ec.set_detail("etcd read no lowest key under a prefix it had just written");
    return pos;
  }
  const bool first = low.kvs(0).create_revision() == my_rev;
  std::int64_t stale_watch = 0;
  {
    LockGuard lk(recipe_.mutex());
    // A new key (or, when first, no predecessor at all): the watch on the old
    // predecessor says nothing about it.
    if (static_cast<std::int64_t>(entry.token) != my_rev || first) {
      stale_watch = std::exchange(entry.watch_id, 0);
      entry.watch_fired = false;
    }
    entry.token = static_cast<std::uint64_t>(my_rev);
  }
  if (stale_watch != 0) cancel_watch(stale_watch);
  if (!first) {
    pos.kind = QueuePosition::Kind::behind;
    return pos;
  }
  const auto& markers = resp.responses(2).response_range();
  pos.kind = settle_delay(entry, req, my_rev, markers.kvs_size() == 1 ? &markers.kvs(0) : nullptr, pos, ec);
  if (pos.kind != QueuePosition::Kind::first) return pos;
  pos.sent = sent;
  pos.validity = remaining;
  return pos;
}

std::optional<Millis> EtcdBackend::grant(QueueEntry& e, const QueuePosition& pos) {
  Entry& entry = entry_of<Entry>(e);
  if (!entry.session->alive) return std::nullopt;  // the key went with the lease
  entry.confirmed = clock_->now();
  return pos.validity;
}

QueueStore::Watch EtcdBackend::watch_predecessor(QueueEntry& e, Clock::time_point /*started*/, Error& ec) {
  Entry& entry = entry_of<Entry>(e);
  std::int64_t my_rev = 0;
  {
    LockGuard lk(recipe_.mutex());
    // Still waiting on the same predecessor whose delete event has not come: no need
    // to look for it again.
    if (entry.watch_id != 0 && !entry.watch_fired) return Watch::watching;
    my_rev = static_cast<std::int64_t>(entry.token);
  }
  // Watch only the key just before mine, from the revision of this read.
  RangeRequest pred;
  pred.set_key(entry.lock_prefix);
  pred.set_range_end(prefix_end(entry.lock_prefix));
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
    return Watch::failed;
  }
  if (presp.kvs_size() == 0) return Watch::gone;  // it went away meanwhile: look again
  predecessor_watch_step(presp.header().revision());
  add_watch(entry, presp.kvs(0).key(), presp.header().revision() + 1);
  return Watch::watching;
}

QueueStore::Deleted EtcdBackend::delete_place(QueueEntry& e, Error& ec) {
  const Entry& entry = entry_of<Entry>(e);
  std::int64_t create_rev = 0;
  {
    LockGuard lk(recipe_.mutex());
    if (!entry.session->alive) return Deleted::gone;  // the lease took the key with it
    create_rev = static_cast<std::int64_t>(entry.token);
  }
  etcdserverpb::TxnRequest txn;
  // create_rev 0: the key's revision is unknown (its creating Txn had no answer). The
  // key is ours alone (session lease + a sequence never reused), so it is deleted as
  // it is.
  if (create_rev != 0) {
    Compare* cmp = txn.add_compare();
    cmp->set_result(Compare::EQUAL);
    cmp->set_target(Compare::CREATE);
    cmp->set_key(entry.key);
    cmp->set_create_revision(create_rev);
    // Still on our session's lease: a revoke moved the key onto a lease of its own, and it
    // must wait that out (Backend::revoke) rather than be handed on by our delete.
    cmp = txn.add_compare();
    cmp->set_result(Compare::EQUAL);
    cmp->set_target(Compare::LEASE);
    cmp->set_key(entry.key);
    cmp->set_lease(entry.session->lease);
  }
  txn.add_success()->mutable_request_delete_range()->set_key(entry.key);
  if (create_rev != 0 && entry.releasing && !entry.delay_marker.empty()) {
    // A release (not a lost lease's delete) takes our lock-delay marker with it, if it is
    // still ours: the name is handed on at once.
    etcdserverpb::TxnRequest* mine = txn.add_success()->mutable_request_txn();
    Compare* mc = mine->add_compare();
    mc->set_result(Compare::EQUAL);
    mc->set_target(Compare::VALUE);
    mc->set_key(delay_key(entry.name));
    mc->set_value(entry.delay_marker);
    mine->add_success()->mutable_request_delete_range()->set_key(delay_key(entry.name));
  }
  if (create_rev != 0 && entry.releasing) {
    // The release mark (etcd_keys.hpp): in the delete's own revision, so a prefix watch
    // tells this release from a lost lease's delete (forget, expiry, etcdctl del). On the
    // session lease (the compare above proves it lives): one key per session, overwritten.
    auto* mark = txn.add_success()->mutable_request_put();
    mark->set_key(release_mark_key(entry.session->lease));
    mark->set_value(entry.key);
    mark->set_lease(entry.session->lease);
  }
  etcdserverpb::TxnResponse resp;
  etcd::CallInfo info;
  const grpc::Status st = transport_.call(
      [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); }, &info);
  if (!st.ok()) {
    set_error(st, ec, "guarded delete Txn");
    return Deleted::retry;
  }
  if (create_rev == 0) {
    if (resp.responses_size() == 1 && resp.responses(0).response_delete_range().deleted() > 0) {
      return Deleted::deleted;
    }
    // Nothing there yet. The acquire Txn had no answer, and etcd may still apply it (a
    // proposal committed after its request timed out, e.g. across a leader change): the
    // key would then appear under our live lease, first in the queue with nobody to
    // renew or release it. So look again, each keeper round, for kLateApplyWindow.
    return clock_->now() - entry.made < kLateApplyWindow ? Deleted::retry : Deleted::gone;
  }
  // A retry after an attempt that may have been applied finds the key gone: that was
  // our own delete.
  return resp.succeeded() || info.maybe_applied ? Deleted::deleted : Deleted::gone;
}

void EtcdBackend::forgotten(QueueEntry& e) noexcept {
  std::int64_t watch_id = 0;
  {
    LockGuard lk(recipe_.mutex());
    watch_id = std::exchange(entry_of<Entry>(e).watch_id, 0);
  }
  if (watch_id != 0) cancel_watch(watch_id);
}

void EtcdBackend::confirm(std::span<QueueEntry* const> entries, std::span<RenewStatus> out,
                          Clock::time_point /*sent*/, Error& ec) {
  std::vector<std::shared_ptr<Session>> sessions;
  for (QueueEntry* e : entries) {
    const auto& s = entry_of<Entry>(*e).session;
    if (std::find(sessions.begin(), sessions.end(), s) == sessions.end()) sessions.push_back(s);
  }
  if ((ec = keepalive(sessions))) return;

  // The lease alone does not prove the hold: the key may have been deleted from
  // outside (etcdctl del) while the lease lives. Read every held key, up to kMaxTxnOps
  // per Txn (one round trip for a usual batch), and compare its create_revision with
  // the token: a missing or re-created key is a loss.
  std::vector<std::uint64_t> tokens(entries.size());
  {
    LockGuard lk(recipe_.mutex());
    for (std::size_t i = 0; i < entries.size(); ++i) tokens[i] = entries[i]->token;
  }
  for (std::size_t from = 0; from < entries.size(); from += kMaxTxnOps) {
    const std::size_t to = std::min(entries.size(), from + kMaxTxnOps);
    etcdserverpb::TxnRequest txn;
    for (std::size_t j = from; j < to; ++j) {
      RangeRequest* r = txn.add_success()->mutable_request_range();
      r->set_key(entry_of<Entry>(*entries[j]).key);
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
      ec.set_detail("etcd answered a renewal key check with the wrong number of responses");
      return;
    }
    for (std::size_t j = from; j < to; ++j) {
      const auto& r = resp.responses(static_cast<int>(j - from)).response_range();
      const bool ours = r.kvs_size() == 1 &&
                        r.kvs(0).create_revision() == static_cast<std::int64_t>(tokens[j]) &&
                        r.kvs(0).lease() == entry_of<Entry>(*entries[j]).session->lease;
      out[j] = ours ? RenewStatus::renewed : RenewStatus::not_owner;
      if (!ours) {
        log_.log(LogLevel::warning,
                 "etcd: the key of held lock \"{}\" was deleted or revoked from outside: lost",
                 entries[j]->name);
      }
    }
  }
  // A session lost meanwhile (its lease gone) took its keys with it.
  LockGuard lk(recipe_.mutex());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (out[i] == RenewStatus::renewed && !entry_of<Entry>(*entries[i]).session->alive)
      out[i] = RenewStatus::not_owner;
  }
}

void EtcdBackend::confirmed(QueueEntry& e, Clock::time_point sent) {
  e.confirmed = std::max(e.confirmed, sent);
}

}  // namespace distlock::detail::etcd
