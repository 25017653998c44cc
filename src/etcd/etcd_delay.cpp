// Lock-delay on etcd (docs/etcd.md "Lock-delay"). A holder with lock_delay D keeps the
// marker P/%delay/<name> = "armed\n<its key's create_revision>\n<D ms>", written with no
// lease before the grant is reported (a holder that dies before that never held the lock
// for its user), deleted by its release only (in the release's own Txn). A lost holder
// (lease expired, key revoked, declared lost) leaves it. Whoever is next first in the
// queue finds an armed marker naming another key: that key is gone without a release, so
// it was lost no later than this read. It then
//   - turns the marker into "lost\n<D ms>" on a lease of ceil(D) seconds (compared on the
//     marker's mod_revision), so the marker ends by itself at least D after a moment after
//     the loss even if nobody waits on (a try without a wait gives its place up);
//   - waits D on its own steady clock from after the answer of the read that showed the
//     loss (or the lost marker), keeping its place, then takes the marker over (compared on
//     the same mod_revision: still the delay it timed) and is granted.
// A marker that is gone (its lease ran out) holds nothing back. Nobody is granted before
// the loss plus D: each grant follows a read, after the loss, of a marker whose delay was
// measured from after that read, or the lost marker's lease of at least D granted after it.
// A revoke (etcd_revoke.cpp) writes a lost marker of its own in its Txn and puts the one it
// replaced back once the revoke is confirmed; the next holder times it like any lost marker.

#include "engine/delay_marker.hpp"
#include "etcd/etcd_backend_impl.hpp"

namespace distlock::detail::etcd {

using Marker = DelayMarker<std::int64_t>;

std::string EtcdBackend::delay_key(std::string_view name) const {
  return (prefix_.empty() ? std::string() : prefix_ + "/") + std::string(kDelayDir) + encode_name(name);
}

bool EtcdBackend::first_holds(const mvccpb::KeyValue& first, const mvccpb::KeyValue* marker) {
  if (marker == nullptr) return true;
  // A holder writes its armed marker before its grant returns and takes a lost one over
  // (or deletes it) before that: any other marker means the first key waits a delay out.
  return marker_lets_first_hold(marker->value(), first.create_revision());
}

grpc::Status EtcdBackend::read_first(std::string_view name, const std::string& lock_prefix, bool whole_queue,
                                     etcdserverpb::RangeResponse& queue,
                                     etcdserverpb::RangeResponse& marker) {
  etcdserverpb::TxnRequest txn;  // no compare: both reads at one revision
  RangeRequest* low = txn.add_success()->mutable_request_range();
  low->set_key(lock_prefix);
  low->set_range_end(prefix_end(lock_prefix));
  if (!whole_queue) low->set_limit(1);
  low->set_sort_target(RangeRequest::CREATE);
  low->set_sort_order(RangeRequest::ASCEND);
  txn.add_success()->mutable_request_range()->set_key(delay_key(name));
  etcdserverpb::TxnResponse resp;
  const grpc::Status st =
      transport_.call([&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
  if (!st.ok()) return st;
  if (resp.responses_size() != 2) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "etcd answered a Txn of two reads with " +
                                                        std::to_string(resp.responses_size()) + " results");
  }
  queue = resp.responses(0).response_range();
  marker = resp.responses(1).response_range();
  return st;
}

ReleaseStatus EtcdBackend::release(std::string_view name, std::string_view owner, std::uint64_t token,
                                   Error& ec) {
  {
    LockGuard lk(recipe_.mutex());
    QueueEntry* e = recipe_.find_locked(name, owner);
    if (e != nullptr && e->token == token && e->held) entry_of<Entry>(*e).releasing = true;
  }
  return recipe_.release(name, owner, token, ec);
}

void EtcdBackend::forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept {
  try {
    Error ignored;
    (void)recipe_.release(name, owner, token, ignored);  // the key only: the marker stays
  } catch (...) {                                        // the server's own expiry is the bound
  }
}

QueuePosition::Kind EtcdBackend::settle_delay(Entry& entry, const AcquireRequest& req, std::int64_t my_rev,
                                              const mvccpb::KeyValue* marker, QueuePosition& pos, Error& ec) {
  const std::string mkey = delay_key(entry.name);
  const std::string mine =
      req.lock_delay > Millis(0) ? armed_delay_marker(my_rev, req.lock_delay) : std::string();
  // A Txn compared on the marker's mod_revision (0: absent) and on our key being ours:
  // puts our marker (or deletes the one there when we set no delay).
  auto take_marker = [&](std::int64_t marker_mod) -> QueuePosition::Kind {
    if (mine.empty() && marker_mod == 0) return QueuePosition::Kind::first;
    etcdserverpb::TxnRequest txn;
    Compare* c = txn.add_compare();
    c->set_result(Compare::EQUAL);
    c->set_target(Compare::MOD);
    c->set_key(mkey);
    c->set_mod_revision(marker_mod);
    c = txn.add_compare();
    c->set_result(Compare::EQUAL);
    c->set_target(Compare::CREATE);
    c->set_key(entry.key);
    c->set_create_revision(my_rev);
    c = txn.add_compare();
    c->set_result(Compare::EQUAL);
    c->set_target(Compare::LEASE);
    c->set_key(entry.key);
    c->set_lease(entry.session->lease);
    if (mine.empty()) {
      txn.add_success()->mutable_request_delete_range()->set_key(mkey);
    } else {
      auto* put = txn.add_success()->mutable_request_put();
      put->set_key(mkey);
      put->set_value(mine);
    }
    etcdserverpb::TxnResponse resp;
    const grpc::Status st = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
    if (!st.ok()) {
      set_error(st, ec, "lock-delay marker Txn");
      return QueuePosition::Kind::failed;
    }
    if (!resp.succeeded()) return QueuePosition::Kind::again;
    entry.delay_marker = mine;
    entry.held_back_rev = 0;
    return QueuePosition::Kind::first;
  };

  if (marker == nullptr) return take_marker(0);
  const std::optional<Marker> m = parse_delay_marker<std::int64_t>(marker->value());
  if (!m) {
    ec.fail(errc::protocol_error,
            "the lock-delay marker of lock \"" + entry.name + "\" is not one distlock wrote");
    return QueuePosition::Kind::failed;
  }
  // Our own (an earlier round of this acquisition wrote it).
  if (m->armed && m->holder == my_rev) {
    entry.delay_marker = std::string(marker->value());
    return QueuePosition::Kind::first;
  }
  // Read after the loss: the answer is in, so the clock is past it.
  const SteadyTime now = clock_->now();
  if (entry.held_back_rev == marker->mod_revision()) {
    if (now >= entry.held_back_until) return take_marker(marker->mod_revision());
    pos.holder_ttl = std::chrono::ceil<Millis>(entry.held_back_until - now);
    return QueuePosition::Kind::held_back;
  }
  std::int64_t timed_rev = marker->mod_revision();
  if (m->armed) {
    // The holder it names is gone (we are first): lost. Start its delay on the server.
    if (m->delay == Millis(0)) return take_marker(marker->mod_revision());
    const std::int64_t lease =
        grant_free_lease(std::max<std::int64_t>(1, (m->delay.count() + 999) / 1000), ec);
    if (ec) return QueuePosition::Kind::failed;
    etcdserverpb::TxnRequest txn;
    Compare* c = txn.add_compare();
    c->set_result(Compare::EQUAL);
    c->set_target(Compare::MOD);
    c->set_key(mkey);
    c->set_mod_revision(marker->mod_revision());
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(mkey);
    put->set_value(lost_delay_marker(m->delay));
    put->set_lease(lease);
    etcdserverpb::TxnResponse resp;
    const grpc::Status st = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
    if (!st.ok()) {
      set_error(st, ec, "lock-delay marker Txn");
      return QueuePosition::Kind::failed;
    }
    if (!resp.succeeded()) {
      revoke_lease(lease);
      return QueuePosition::Kind::again;
    }
    timed_rev = resp.header().revision();
    log_.log(LogLevel::info,
             "etcd: lock \"{}\" was lost by its holder: held back for its lock-delay of {} ms", entry.name,
             m->delay.count());
  }
  entry.held_back_rev = timed_rev;
  entry.held_back_until = now + m->delay;
  pos.holder_ttl = m->delay;
  return m->delay == Millis(0) ? take_marker(timed_rev) : QueuePosition::Kind::held_back;
}

}  // namespace distlock::detail::etcd
